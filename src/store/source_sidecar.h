/*
 * source_sidecar.h - coded sidecars of checkpoint files (weight_codec_cache_dir,
 * docs/codec.md "Sidecar"): one file per checkpoint file, named from that file's identity,
 * holding the DDOC v1 streams a setup coded, so the next setup with the same file reads
 * coded bytes instead of reading raw bytes and coding them. Internal; never installed.
 *
 * Format (all integers little-endian):
 *   header, 128 bytes: "DDOSIDE1", version u32 = 1, codec version u32 = 1, block_elems u32,
 *     entry count u32, the checkpoint file's identity (device, inode, size, mtime ns,
 *     ctime ns: u64 each), the sidecar's own length u64, the offset of the streams u64
 *     (a multiple of 4096), 32 zero bytes, the table's hash u64, the header's hash u64 (of
 *     bytes 0..119);
 *   table, 48 bytes per entry, by increasing tensor offset: the tensor's absolute offset in
 *     the checkpoint file u64, its raw length u64, its stream's offset in the sidecar u64
 *     (a multiple of 4096; 0 when kept raw), the stream's length u64 (0: coding did not
 *     shrink it, read it raw from the checkpoint), the stream's hash u64, dtype u32, 0 u32;
 *   the streams, in table order, each at its offset (zero bytes between them).
 * The hashes are ddo__sidecar_hash: a sum over the 64-bit words, so parallel reads can each
 * add their part. A sidecar is a hostile file: every size is checked before use.
 */
#ifndef DDO_SOURCE_SIDECAR_H
#define DDO_SOURCE_SIDECAR_H

#include "base/common.h"
#include "os/file.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DDO__SIDECAR_HEADER 128
#define DDO__SIDECAR_ENTRY  48
#define DDO__SIDECAR_ALIGN  4096
/* At most this many entries in one sidecar (and never more than the checkpoint's tensors). */
#define DDO__SIDECAR_MAX_ENTRIES ((uint64_t)1 << 22)

typedef struct ddo__sidecar_entry {
    uint64_t offset;      /* the tensor's absolute offset in the checkpoint file */
    uint64_t raw_bytes;   /* its length there */
    uint64_t coded_off;   /* its stream in the sidecar (0 when kept raw) */
    uint64_t coded_bytes; /* 0: kept raw */
    uint64_t hash;        /* ddo__sidecar_hash of the stream */
    uint32_t dtype;
} ddo__sidecar_entry;

typedef struct ddo__sidecar {
    int fd;
    int direct_fd;             /* the same file for O_DIRECT reads (ddo__sidecar_open_direct) */
    atomic_bool direct_broken; /* a direct read was refused: buffered reads from then on */
    char *path;
    uint64_t bytes;
    ddo__file_id id; /* the file as opened: a stream read after its first checks it is unchanged */
    size_t count;
    ddo__sidecar_entry *entries; /* by increasing offset */
} ddo__sidecar;

/* One tensor to keep in a sidecar being written. */
typedef struct ddo__sidecar_item {
    uint64_t offset, raw_bytes;
    ddo_dtype dtype;
    const void *coded; /* its stream; NULL: kept raw */
    uint64_t coded_bytes;
    bool produce; /* its stream comes from the writer's producer instead (coded unused) */
    size_t tag;   /* the producer's own reference to the tensor */
} ddo__sidecar_item;

/* Gives item's stream while the sidecar is written: *coded (valid until the next call) and
 * *coded_bytes, or *coded NULL to keep it raw. 0, or an errno value with *why (one line):
 * the sidecar is then not written. */
typedef int (*ddo__sidecar_produce_fn)(void *user, const ddo__sidecar_item *item,
                                       const void **coded, uint64_t *coded_bytes, char *why,
                                       size_t why_len);

/*
 * Hash of n bytes at p that start at 64-bit word first_word of a stream: the sum, modulo
 * 2^64, of fmix64(w_i + (first_word + i) * golden) over the words w_i (the last zero-padded).
 * Parts of a stream starting at multiples of 8 bytes add up to the stream's hash.
 */
uint64_t ddo__sidecar_hash(const void *p, uint64_t n, uint64_t first_word);

/* "<dir>/<32 hex>.ddoc", the hex a hash of the identity and the codec's version and block
 * size (free with free()); NULL when out of memory. */
char *ddo__sidecar_path(const char *dir, const ddo__file_id *id);

/*
 * Opens and validates the sidecar at path for a checkpoint file of identity id: header,
 * hashes, identity, its own length, and the table (counts within max_entries, offsets sorted
 * and inside both files, streams aligned, disjoint, shorter than their raw bytes). 0 and *out;
 * ENOENT when there is none; any other value: it is unusable, *why says why (one line).
 */
int ddo__sidecar_open(const char *path, const ddo__file_id *id, uint64_t max_entries,
                      ddo__sidecar **out, char *why, size_t why_len);
/* The entry of the tensor at offset with raw_bytes of dtype, or NULL. */
const ddo__sidecar_entry *ddo__sidecar_find(const ddo__sidecar *s, uint64_t offset,
                                            uint64_t raw_bytes, ddo_dtype dtype);
/* Opens s's file a second time for O_DIRECT reads (s->direct_fd) where the file system takes
 * them and it is still the same file; -1 otherwise (reads are then buffered). */
void ddo__sidecar_open_direct(ddo__sidecar *s);
void ddo__sidecar_close(ddo__sidecar *s);

/*
 * Writes the sidecar of items (sorted here by offset) atomically at path (os/fs.h: a file
 * without a name until complete, then renamed). 0 and *written (its length), or an errno
 * value with *why (one line).
 */
int ddo__sidecar_write(const char *path, const ddo__file_id *id, ddo__sidecar_item *items, size_t n,
                       uint64_t *written, char *why, size_t why_len);
/* The same, with the items marked produce coded one at a time by produce(user, ...) as the
 * file is written (one stream in memory at a time, not all of them). */
int ddo__sidecar_write_produced(const char *path, const ddo__file_id *id, ddo__sidecar_item *items,
                                size_t n, ddo__sidecar_produce_fn produce, void *user,
                                uint64_t *written, char *why, size_t why_len);

#endif /* DDO_SOURCE_SIDECAR_H */
