/*
 * source_internal.h - what source.c (the store's layout, create and destroy,
 * serving bytes) and source_read.c (the parallel jobs that fill and register
 * it) share: the store's layout and the steps of its creation. Private to those
 * two files; every other module goes through source.h.
 */
#ifndef DDO_SOURCE_INTERNAL_H
#define DDO_SOURCE_INTERNAL_H

#include "store/source.h"

#include "store/host_pins.h"
#include "store/source_codec.h"
#include "store/source_sidecar.h"

#include "checkpoint/checkpoint.h"
#include "os/read.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IO_ALIGN       DDO__OS_DIRECT_ALIGN
#define IO_CHUNK       DDO__OS_READ_CHUNK      /* one read request */
#define IO_QUEUE_DEPTH DDO__OS_READ_DEPTH      /* requests in flight per ring */
#define DIRECT_MIN     ((uint64_t)1 * DDO_MIB) /* smaller file reads use pread */
/* Allocation alignment of the runs: huge-page friendly, a multiple of IO_ALIGN. */
#define RUN_ALIGN ((size_t)2 * DDO_MIB)

enum { RUN_NONE, RUN_STORE, RUN_HOST };

/* Where a stored tensor's bytes come from (weight_codec_cache_dir, source_sidecar_use.c). */
enum {
    SIDE_NONE,  /* read raw from the checkpoint, then coded */
    SIDE_CODED, /* its coded stream read from its file's sidecar */
    SIDE_RAW    /* read raw and kept raw: the sidecar says coding does not shrink it */
};

typedef struct entry {
    uint8_t run;
    uint8_t side;  /* SIDE_* */
    bool host;     /* RUN_STORE for a caller's host-memory tensor, to be coded from its memory */
    bool streamed; /* requested and not retained: read from its file (or sidecar) per load */
    uint64_t pos;  /* offset inside its run */
    const uint8_t *ptr;
    const ddo__sidecar_entry *se; /* its sidecar entry (SIDE_CODED, SIDE_RAW) */
    /* not retained: its coded stream in its file's sidecar (kept open after create), or NULL */
    const ddo__sidecar_entry *stream;
} entry;

struct ddo__source {
    const ddo_checkpoint *ck;
    ddo_device *dev;
    ddo__account *retained;
    ddo__account *registered;
    uint64_t retained_taken;
    uint64_t registered_taken;
    uint8_t *base;           /* the store: whole segments */
    uint64_t bytes;          /* allocated */
    size_t seg_count;        /* segments to register (the first ones) */
    uint8_t *seg_registered; /* per segment to register: did it succeed */
    entry *entries;          /* per checkpoint tensor */
    size_t tensor_count;
    size_t file_count;
    unsigned workers; /* pin_cpu_workers: also the threads of ddo__source_copy_out's decode */
    int *direct_fd;   /* per file; -1 when direct I/O is unavailable */
    atomic_bool *direct_broken; /* a direct read failed with EINVAL: use pread from now on */
    ddo__read_engine engine;
    bool use_uring;
    ddo__host_pins *host_pins; /* host-memory tensors registered in place */
    ddo__source_codec *codec;  /* weight_codec: the coded tensors' plans (source_codec.c) */
    /* weight_codec_cache_dir (source_sidecar_use.c); after create only the sidecars that hold
     * a non-retained tensor's stream stay open (ddo__source_read_coded) */
    ddo__sidecar **sidecars;         /* per file; NULL: none */
    atomic_uint_fast64_t *side_sums; /* per tensor: hash of its coded bytes as read */
    atomic_bool *side_failed;        /* per file: a read of its sidecar failed */
    atomic_bool *stream_ok;          /* per tensor: its stream's hash checked (its first read) */
    size_t side_hits;                /* tensors stored from a sidecar */
    size_t encoded;                  /* tensors coded at setup */
    char codec_note[512];            /* what happened to the sidecars ("" when nothing) */
    double test_read_rate;           /* tests only: per-use file reads emulate this rate (0: off) */
};

/* Helpers of the store's files */
static inline uint64_t ddo__source_align_down(uint64_t v, uint64_t a)
{
    return v - v % a;
}
static inline const char *ddo__source_file_name(const ddo__source *src, uint32_t file)
{
    const char *n = ddo__checkpoint_file_name(src->ck, file);
    return n ? n : "(file)";
}

/* Whether an O_DIRECT read of bytes [off, off + len) of fd into dst can be made: fd is open,
 * no direct read of it was refused (*broken), len is at least min, dst is aligned and the
 * aligned range around the bytes fits dst_cap. */
static inline bool ddo__source_direct_takes(int fd, atomic_bool *broken, uint64_t off, size_t len,
                                            uint64_t min, const void *dst, size_t dst_cap)
{
    uint64_t a0 = ddo__source_align_down(off, IO_ALIGN), a1 = ddo__round_up(off + len, IO_ALIGN);
    return fd >= 0 && !atomic_load(broken) && len >= min && (uintptr_t)dst % IO_ALIGN == 0 &&
           a1 - a0 <= dst_cap;
}
/* source_read.c: that read (ddo__source_direct_takes said it can be made), of the aligned range
 * around the bytes, through io_uring where the source uses it: 1 and *at where the bytes landed
 * in dst; 0 when it came back short or was refused (EINVAL, EOPNOTSUPP: *broken is set, buffered
 * reads from then on), for the caller to read them buffered; a negative errno for another
 * failed read. The checkpoint's reads and the sidecars' stream reads both go through it. */
int ddo__source_read_direct(const ddo__source *src, int fd, atomic_bool *broken, uint64_t off,
                            size_t len, void *dst, const void **at);

/* source_read.c: the steps of ddo__source_create that read, register and pin */
int ddo__source_read_all(ddo__source *src, const ddo__source_params *p,
                         const ddo__source_request *req, size_t count, ddo__errbuf *eb);
int ddo__source_register_all(ddo__source *src, const ddo__source_params *p, ddo__errbuf *eb);
/* Registers in place the host-memory tensors the plan registers (no copy: the copy engine
 * reads the caller's pages). */
int ddo__source_pin_host_tensors(ddo__source *src, const ddo__source_params *p,
                                 const ddo__source_request *req, size_t count, ddo__errbuf *eb);

/* source_sidecar_use.c: the coded sidecars of a setup with weight_codec_cache_dir */
/* Opens the sidecars of the checkpoint's files and marks the stored tensors they hold. */
void ddo__source_sidecar_prepare(ddo__source *src, const ddo__source_params *p);
/* After the read: checks every stream read from a sidecar; a sidecar with any bad stream is
 * ignored (a note) and its tensors go back to their raw sizes. *rejected: how many were
 * ignored (then the caller lays the store out and reads it again). */
int ddo__source_sidecar_verify(ddo__source *src, const ddo__source_params *p, size_t *rejected);
/* After coding: writes the sidecar of each file whose tensors were coded now (a note when it
 * cannot). items: the packed store. */
void ddo__source_sidecar_save(ddo__source *src, const ddo__source_params *p,
                              const ddo__codec_item *items, size_t n);
/* At the end of create: records each non-retained tensor's stream (entry.stream), keeps the
 * sidecars that hold one open and closes the others. */
void ddo__source_sidecar_keep(ddo__source *src);
/* Closes the sidecars and frees what prepare allocated. */
void ddo__source_sidecar_release(ddo__source *src);
/* Appends one line to the store's codec note. */
void ddo__source_note(ddo__source *src, const char *fmt, ...) DDO_PRINTF(2, 3);

#endif
