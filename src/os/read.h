/*
 * read.h - the read engines under the retained store and the file measurement: io_uring
 * (several requests in flight on one ring) and direct (O_DIRECT, uncached) reads of aligned
 * ranges into aligned buffers, with pread where io_uring is missing or refuses. They take
 * descriptors, offsets and buffers and know nothing of checkpoints: the caller checks a
 * file's identity before and after (checkpoint_io.c). Buffered pread and mappings are in
 * file.h. The only place that knows how a platform spells these.
 */
#ifndef DDO_OS_READ_H
#define DDO_OS_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Direct I/O works on whole blocks: offsets, lengths and buffers aligned to this. */
#define DDO__OS_DIRECT_ALIGN ((uint64_t)4096)
/* The largest single read request of the engines. */
#define DDO__OS_READ_CHUNK ((uint64_t)16 << 20)
/* Bytes a buffer needs to read len bytes at any offset with O_DIRECT alignment: len and one
 * aligned block on each side (the store's staging windows; the planner sizes them). */
static inline size_t ddo__os_direct_window(size_t len)
{
    return len + 2 * (size_t)DDO__OS_DIRECT_ALIGN;
}
/* Requests in flight on one ring: a single O_DIRECT stream reaches a fraction of a disk. */
#define DDO__OS_READ_DEPTH 4

/* ---- io_uring: one ring, owned by one thread ---- */

typedef struct ddo__os_ring ddo__os_ring;

/* Whether io_uring works here (built with liburing and the kernel sets up a ring). */
bool ddo__os_ring_available(void);
/* A ring of `entries` submission slots. 0, or an errno value (ENOTSUP without io_uring). */
int ddo__os_ring_create(unsigned entries, ddo__os_ring **out);
/* Tears the ring down; the caller has collected (or drained) every request it queued.
 * NULL is a no-op. */
void ddo__os_ring_destroy(ddo__os_ring *r);
/* Queues a read of len bytes (at most 4 GiB - 1) at off of fd into dst, tagged tag; false
 * when the submission queue is full. Nothing reaches the kernel before the next submit. */
bool ddo__os_ring_queue_read(ddo__os_ring *r, int fd, void *dst, uint64_t len, uint64_t off,
                             uint64_t tag);
/* Submits what is queued and waits for one completion: liburing's result (requests
 * submitted, or -errno; -EINTR, -EAGAIN and -EBUSY leave the requests queued). */
int ddo__os_ring_submit_wait(ddo__os_ring *r);
/* Takes one completion that is ready, without waiting: true with its tag and result (bytes
 * read, or -errno); false when none is ready. */
bool ddo__os_ring_take(ddo__os_ring *r, uint64_t *tag, int *res);
/*
 * After a failed submit: waits for the completions the kernel still owes (memory the
 * caller owns is their target), counting *busy down, until none is left or none comes for
 * a second (requests that were never submitted never complete).
 */
void ddo__os_ring_drain(ddo__os_ring *r, size_t *busy);

/* ---- direct reads ---- */

/*
 * Reads the aligned range [off, off + len) of fd (opened for direct I/O, file.h) into dst
 * (aligned to DDO__OS_DIRECT_ALIGN): with use_ring and more than one DDO__OS_READ_CHUNK,
 * DDO__OS_READ_DEPTH requests in flight on a ring of its own; otherwise, or when the ring
 * refuses a request (EINVAL, a short read in the middle), pread in chunks. Returns the bytes
 * read (fewer than len at the end of the file, or where a read returned a partial block), or
 * -errno (-EINVAL or -EOPNOTSUPP: the file system refuses direct reads of this range).
 * Thread-safe (no shared file offset).
 */
int64_t ddo__os_read_direct(int fd, uint64_t off, uint64_t len, void *dst, bool use_ring);

#endif /* DDO_OS_READ_H */
