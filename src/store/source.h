/*
 * source.h - where a tensor's bytes come from: the retained source store
 * (host RAM capped by vmm_source_cache_gb, its registered part in whole
 * 64 MiB segments capped by vmm_source_registered_gb) or the checkpoint file,
 * re-read on every use and identity-checked.
 *
 * The session decides WHAT is retained and registered (from the plan); this
 * module reads it (pin_cpu_workers threads; io_uring + O_DIRECT where
 * available, pread otherwise), lays it out in segments, registers segments
 * with the device, and serves byte ranges to the session's uploader.
 */
#ifndef DDO_SOURCE_H
#define DDO_SOURCE_H

#include "base/budget.h"
#include "base/common.h"
#include "metrics/metrics.h"
#include "store/host_pins.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ddo__source ddo__source;

typedef enum ddo__read_engine {
    DDO__READ_ENGINE_AUTO, /* io_uring + O_DIRECT when available, else pread */
    DDO__READ_ENGINE_IO_URING,
    DDO__READ_ENGINE_PREAD
} ddo__read_engine;

/* What to keep for one tensor. */
typedef struct ddo__source_request {
    size_t tensor;  /* checkpoint tensor index */
    bool retain;    /* keep its bytes in host RAM */
    bool register_; /* and register them (only with retain) */
    size_t group;   /* a host tensor registered in place: its unit (host_pins.h groups) */
    uint64_t dst;   /* and its offset in that unit's device layout */
    bool code_host; /* weight_codec: a caller's host tensor the store codes into its own memory
                     * (a streamed one; source_codec.h) */
} ddo__source_request;

typedef struct ddo__source_params {
    const ddo_checkpoint *ck;
    ddo_device *dev;
    size_t workers; /* pin_cpu_workers, >= 1 */
    ddo__read_engine engine;
    bool allow_register_fallback; /* allow_pin_memory_fallback */
    ddo__account *retained;       /* "retained host" account */
    ddo__account *registered;     /* "registered host" account */
    ddo__metrics_acc *metrics;    /* setup_read_*, setup_register_ns, registration_fallback_bytes */
    ddo_progress_fn progress;     /* phases "read", "register" and "sidecar" */
    void *progress_user;
    bool codec; /* weight_codec: code the store's BF16/F16/F32 tensors (source_codec.h) */
    /* weight_codec_cache_dir: where the coded sidecars are read and written (NULL or "": none;
     * docs/codec.md "Sidecar"). Metrics codec_sidecar_*. */
    const char *codec_cache_dir;
} ddo__source_params;

/*
 * Creates the store and fills it: every retained file tensor's bytes are
 * read (in parallel) into one allocation of whole 64 MiB segments, the
 * tensors to register first; the segments covering them are registered with
 * the device (pageable tensors sharing the last such segment become
 * registered too, which ddo__source_host_ptr reports). Takes exactly
 * round_up(retained bytes, 64 MiB) from p->retained and round_up(registered
 * bytes, 64 MiB) from p->registered, before allocating. A failed
 * registration: with allow_register_fallback the segment stays pageable
 * (registration_fallback_bytes, and its bytes go back to p->registered),
 * else the create fails with the device's code. Progress ("read", then
 * "register") is reported on the calling thread. On failure nothing is left
 * allocated or registered and *out is not written. Errors: DDO_E_BUDGET,
 * DDO_E_FILE_CHANGED, DDO_E_IO, DDO_E_DEVICE..., DDO_E_NO_MEMORY,
 * DDO_E_INVALID_ARGUMENT.
 */
int ddo__source_create(const ddo__source_params *p, const ddo__source_request *req, size_t count,
                       ddo__source **out, ddo__errbuf *eb);
/* Unregisters and frees everything; accounts back to what they were. */
void ddo__source_destroy(ddo__source *src);

/*
 * A registered host-memory tensor (registered in place, host_pins.h): the pieces the copy
 * engine reads it from, in order (its inner pages where they lie, its end fragments from the
 * pinned arena). 0 for any other tensor, or one whose registration fell back.
 */
size_t ddo__source_host_pieces(const ddo__source *src, size_t tensor, ddo__host_piece out[3]);
/* True when [p, p + len) (host-tensor pieces) lies in one registration or the pinned arena,
 * so one copy may read it. */
bool ddo__source_one_region(const ddo__source *src, const void *p, uint64_t len);

/* The plan of tensor's coded bytes in the store (weight_codec), or NULL when its retained bytes
 * are raw or it is not retained; ddo__source_host_ptr then points at the coded stream. */
const struct ddo__codec_plan *ddo__source_coded(const ddo__source *src, size_t tensor);

/* Where tensor's retained bytes are (NULL when not retained) and whether they are registered
 * (a registered host-memory tensor is read through ddo__source_host_pieces). */
const void *ddo__source_host_ptr(const ddo__source *src, size_t tensor, bool *registered);

/* True when the store holds its own copy (coded, or raw where coding does not shrink it) of a
 * caller's host-memory tensor, so the caller's bytes are never read again (weight_codec;
 * source_codec.h). */
bool ddo__source_owns_host_tensor(const ddo__source *src, size_t tensor);

/*
 * Copies tensor's bytes as the checkpoint holds them into dst (dst_bytes, at least the
 * tensor's): decoded from the store when it is stored coded, else from the store, or from the
 * caller's memory for a host tensor the store does not hold. Errors: DDO_E_NOT_FOUND (a file
 * tensor the store does not hold), DDO_E_INVALID_ARGUMENT (dst too small),
 * DDO_E_FORMAT (a coded stream that does not decode), DDO_E_NO_MEMORY.
 */
int ddo__source_copy_out(const ddo__source *src, size_t tensor, void *dst, uint64_t dst_bytes,
                         ddo__errbuf *eb);

/* Where the store's coded bytes came from: "none" (no codec), "encoded" (coded at setup),
 * "sidecar" (read from coded sidecars) or "sidecar+encoded"; and the note of what happened
 * to the sidecars ("" when nothing worth saying): ignored ones with why, failed writes. */
const char *ddo__source_codec_origin(const ddo__source *src);
const char *ddo__source_codec_note(const ddo__source *src);

/*
 * Bytes from byte `offset` of a retained tensor to the end of its 64 MiB registration segment
 * (UINT64_MAX when the tensor is not in the store). A copy from registered memory must not
 * cross a segment boundary: each segment is its own registration, and the CUDA driver rejects
 * a copy whose host range spans two registrations (CUDA_ERROR_INVALID_VALUE).
 */
uint64_t ddo__source_segment_left(const ddo__source *src, size_t tensor, uint64_t offset);

/*
 * Reads len bytes of tensor (from byte offset `offset` inside the tensor)
 * from its file into dst (a staging window, page aligned, dst_cap bytes). The
 * file's identity is checked first (DDO_E_FILE_CHANGED). May use O_DIRECT, in
 * which case the bytes start at *data inside dst (alignment shift); otherwise
 * *data == dst. Thread-safe.
 */
int ddo__source_read_file(ddo__source *src, size_t tensor, uint64_t offset, size_t len, void *dst,
                          size_t dst_cap, const void **data, ddo__errbuf *eb);

/*
 * Streaming from the coded sidecar (weight_codec_cache_dir, docs/codec.md "Sidecar"): whether
 * tensor, not retained, has a coded stream in its file's sidecar (and its length: what a
 * load then moves instead of the tensor's bytes, always fewer).
 */
bool ddo__source_has_stream(const ddo__source *src, size_t tensor, uint64_t *coded_bytes);
/*
 * Reads that stream into dst (dst_cap bytes, at least its length) with the checkpoint's
 * identity checked before and after (DDO_E_FILE_CHANGED), checks its hash (DDO_E_FORMAT) and
 * builds its plan: 0, *data (where the stream starts in dst: ddo__source_read_stream) and
 * *plan (the caller destroys it). The plan is built per load: building them at setup would
 * read every streamed tensor's stream once more, which is the read streaming exists to avoid.
 * DDO_E_NOT_FOUND: no stream; any failure but DDO_E_FILE_CHANGED means "read this tensor raw
 * instead". Thread-safe.
 */
int ddo__source_read_coded(ddo__source *src, size_t tensor, void *dst, size_t dst_cap,
                           const void **data, struct ddo__codec_plan **plan, ddo__errbuf *eb);

/*
 * Bytes [pos, pos + len) of tensor's stream (pos a multiple of 8) read into dst (dst_cap
 * bytes): *at is where they start, dst itself or, for an O_DIRECT read of the aligned range
 * around them (where the sidecar's file system takes it and it fits dst_cap), a little past
 * it. The checkpoint's identity is checked before and after (DDO_E_FILE_CHANGED), and
 * *hash_part is their share of the stream's hash; a stream longer than one window is read in
 * such pieces: the caller adds the shares and asks ddo__source_stream_hash_ok at the end, and
 * validates the stream itself (ddo__codec_reader). Once a stream's hash has passed
 * (ddo__source_stream_hash_ok, at its first read in this source), later reads hash nothing
 * (*hash_part 0, and the hash check passes): they check instead that the sidecar is still the
 * file opened (device, inode, size, mtime, ctime; DDO_E_FORMAT "changed since it was opened"
 * otherwise). Any failure but DDO_E_FILE_CHANGED means "read it raw". Thread-safe.
 */
int ddo__source_read_stream(ddo__source *src, size_t tensor, uint64_t pos, size_t len, void *dst,
                            size_t dst_cap, const void **at, uint64_t *hash_part, ddo__errbuf *eb);
bool ddo__source_stream_hash_ok(const ddo__source *src, size_t tensor, uint64_t hash);
/* Tests: stream reads of at least bytes go direct where they can (0: 1 MiB, DIRECT_MIN), and
 * how many stream reads went direct in this process. */
void ddo__source_test_stream_direct_min(uint64_t bytes);
uint64_t ddo__source_test_stream_direct_reads(void);
/* Tests: stream bytes hashed in this process (a stream is hashed at its first read only). */
uint64_t ddo__source_test_stream_hashed_bytes(void);

/* Bytes needed in a staging window to read len bytes with O_DIRECT alignment (len + 2 pages). */
size_t ddo__source_window_need(size_t len);

/*
 * What ddo__source_create takes from the accounts for these requests, without
 * reading or allocating anything: *retained = round_up(sum of retained file
 * tensor bytes, 64 MiB), *registered = round_up(sum of registered ones,
 * 64 MiB) - the planner's formula. (Tensors are placed at offsets congruent to
 * their file offsets modulo 4 KiB for in-place O_DIRECT reads only within the
 * slack this rounding leaves, so padding never changes these figures.)
 * Host-memory tensors take nothing here: they are served from the caller's memory and,
 * when registered, registered in place (host_pins.h: whole pages through p->registered). Errors:
 * DDO_E_INVALID_ARGUMENT (bad index, duplicate, register_ without retain), DDO_E_OVERFLOW.
 */
int ddo__source_bytes(const ddo_checkpoint *ck, const ddo__source_request *req, size_t count,
                      uint64_t *retained, uint64_t *registered, ddo__errbuf *eb);

/* The engine the store actually uses (AUTO resolved; IO_URING falls back to PREAD when
 * io_uring or O_DIRECT is unavailable). */
ddo__read_engine ddo__source_engine(const ddo__source *src);

/*
 * Test hook, fault injection for checkpoint file reads (like the device's
 * inject_fault): the nth read from now (1-based; every per-use read, every
 * setup read request and every resident read, process-wide) fails with
 * DDO_E_IO; persistent keeps failing every read from then on. nth == 0
 * clears. ddo__source_fault_reads counts the reads since the last
 * ddo__source_fault_nth. Thread-safe; one atomic increment per read.
 */
void ddo__source_fault_nth(uint64_t nth, bool persistent);
uint64_t ddo__source_fault_reads(void);
/* Counts one read; DDO_E_IO when an injected fault hits it, else 0. */
int ddo__source_fault_hit(void);

#endif /* DDO_SOURCE_H */
