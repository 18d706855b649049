/*
 * read.c - the read engines on POSIX systems: io_uring through liburing (Linux, when the build
 * found it) and chunked pread for descriptors opened with O_DIRECT.
 */
#include "os/read.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#if DDO_HAVE_LIBURING
#    include <liburing.h>
#endif

/* ---- io_uring ---- */

#if DDO_HAVE_LIBURING

struct ddo__os_ring {
    struct io_uring ring;
};

bool ddo__os_ring_available(void)
{
    struct io_uring probe;
    if (io_uring_queue_init(2, &probe, 0) != 0)
        return false;
    io_uring_queue_exit(&probe);
    return true;
}

int ddo__os_ring_create(unsigned entries, ddo__os_ring **out)
{
    ddo__os_ring *r = malloc(sizeof(*r));
    if (r == NULL)
        return ENOMEM;
    int rc = io_uring_queue_init(entries, &r->ring, 0);
    if (rc < 0) {
        free(r);
        return -rc;
    }
    *out = r;
    return 0;
}

void ddo__os_ring_destroy(ddo__os_ring *r)
{
    if (r == NULL)
        return;
    io_uring_queue_exit(&r->ring);
    free(r);
}

bool ddo__os_ring_queue_read(ddo__os_ring *r, int fd, void *dst, uint64_t len, uint64_t off,
                             uint64_t tag)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (sqe == NULL)
        return false;
    io_uring_prep_read(sqe, fd, dst, (unsigned)len, off);
    io_uring_sqe_set_data64(sqe, tag);
    return true;
}

int ddo__os_ring_submit_wait(ddo__os_ring *r)
{
    return io_uring_submit_and_wait(&r->ring, 1);
}

bool ddo__os_ring_take(ddo__os_ring *r, uint64_t *tag, int *res)
{
    struct io_uring_cqe *cqe;
    if (io_uring_peek_cqe(&r->ring, &cqe) != 0)
        return false;
    *tag = io_uring_cqe_get_data64(cqe);
    *res = cqe->res;
    io_uring_cqe_seen(&r->ring, cqe);
    return true;
}

void ddo__os_ring_drain(ddo__os_ring *r, size_t *busy)
{
    while (*busy > 0) {
        struct io_uring_cqe *cqe;
        struct __kernel_timespec ts = { .tv_sec = 1, .tv_nsec = 0 };
        int rc = io_uring_wait_cqe_timeout(&r->ring, &cqe, &ts);
        if (rc == -EINTR)
            continue;
        if (rc != 0)
            return;
        io_uring_cqe_seen(&r->ring, cqe);
        (*busy)--;
    }
}

#else /* !DDO_HAVE_LIBURING */

bool ddo__os_ring_available(void)
{
    return false;
}

int ddo__os_ring_create(unsigned entries, ddo__os_ring **out)
{
    (void)entries;
    (void)out;
    return ENOTSUP;
}

void ddo__os_ring_destroy(ddo__os_ring *r)
{
    (void)r;
}

bool ddo__os_ring_queue_read(ddo__os_ring *r, int fd, void *dst, uint64_t len, uint64_t off,
                             uint64_t tag)
{
    (void)r, (void)fd, (void)dst, (void)len, (void)off, (void)tag;
    return false;
}

int ddo__os_ring_submit_wait(ddo__os_ring *r)
{
    (void)r;
    return -ENOTSUP;
}

bool ddo__os_ring_take(ddo__os_ring *r, uint64_t *tag, int *res)
{
    (void)r, (void)tag, (void)res;
    return false;
}

void ddo__os_ring_drain(ddo__os_ring *r, size_t *busy)
{
    (void)r;
    (void)busy;
}

#endif /* DDO_HAVE_LIBURING */

/* ---- direct reads ---- */

/*
 * [a0, a1) in chunks, depth requests in flight on ring; the bytes read, or -errno. -EINVAL
 * also for a short read in the middle, which the pread path then finishes.
 */
static int64_t ring_read(ddo__os_ring *ring, unsigned depth, int fd, uint64_t a0, uint64_t a1,
                         unsigned char *dst)
{
    size_t n = (size_t)((a1 - a0 + DDO__OS_READ_CHUNK - 1) / DDO__OS_READ_CHUNK);
    size_t next = 0, busy = 0;
    int64_t total = 0;
    int err = 0;
    while (next < n || busy > 0) {
        while (err == 0 && next < n && busy < depth) {
            uint64_t off = a0 + next * DDO__OS_READ_CHUNK;
            uint64_t len = a1 - off < DDO__OS_READ_CHUNK ? a1 - off : DDO__OS_READ_CHUNK;
            if (!ddo__os_ring_queue_read(ring, fd, dst + (off - a0), len, off, len))
                break;
            next++;
            busy++;
        }
        if (busy == 0)
            break;
        int rc = ddo__os_ring_submit_wait(ring);
        if (rc < 0 && rc != -EINTR) {
            err = rc;
            next = n; /* queue nothing more; the drain below waits for the rest */
        }
        uint64_t want;
        int res;
        while (ddo__os_ring_take(ring, &want, &res)) {
            if (res < 0 && err == 0)
                err = res;
            else if (res >= 0 && (uint64_t)res != want && err == 0)
                err = -EINVAL; /* short read in the middle: let pread finish it */
            else if (res >= 0)
                total += res;
            busy--;
        }
        if (rc < 0 && rc != -EINTR) {
            ddo__os_ring_drain(ring, &busy);
            break;
        }
    }
    return err == 0 ? total : err;
}

int64_t ddo__os_read_direct(int fd, uint64_t off, uint64_t len, void *dst, bool use_ring)
{
    unsigned char *d = dst;
    if (use_ring && len > DDO__OS_READ_CHUNK) {
        size_t n = (size_t)((len + DDO__OS_READ_CHUNK - 1) / DDO__OS_READ_CHUNK);
        unsigned depth = n < DDO__OS_READ_DEPTH ? (unsigned)n : DDO__OS_READ_DEPTH;
        ddo__os_ring *ring = NULL;
        if (ddo__os_ring_create(depth, &ring) == 0) {
            int64_t got = ring_read(ring, depth, fd, off, off + len, d);
            ddo__os_ring_destroy(ring);
            if (got != -EINVAL)
                return got;
            /* fall through: the whole range again with pread, which handles short reads */
        }
    }
    uint64_t done = 0;
    while (done < len) {
        uint64_t n = len - done < DDO__OS_READ_CHUNK ? len - done : DDO__OS_READ_CHUNK;
        ssize_t r = pread(fd, d + done, (size_t)n, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -(int64_t)errno;
        if (r == 0)
            break; /* end of file: the caller checks it got enough */
        done += (uint64_t)r;
        if ((uint64_t)r % DDO__OS_DIRECT_ALIGN != 0)
            break; /* a short read ends the file or the direct path */
    }
    return (int64_t)done;
}
