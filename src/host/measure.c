/*
 * measure.c - measured host->device and file read figures: the bus limit a
 * benchmark compares against, and what `ddo doctor` reports. File reads go
 * through the engines of os/ (the retained store's direct reader).
 */
#include "base/common.h"
#include "device/device.h"
#include "os/file.h"
#include "os/read.h"
#include "os/sys.h"

#include "os/thread.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PIECE_BYTES ((size_t)16 << 20)
#define SMALL_PIECE ((size_t)2 << 20)
#define PASSES      3

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median3(double v[PASSES])
{
    qsort(v, PASSES, sizeof(double), cmp_double);
    return v[PASSES / 2];
}

/* Times copies of `bytes` from src to dst in pieces of `piece`, on stream; bytes/s. */
static int time_copies(ddo_device *dev, void *stream, uint64_t dst, const unsigned char *src,
                       uint64_t bytes, size_t piece, double *rate)
{
    uint64_t t0 = ddo__now_ns();
    for (uint64_t off = 0; off < bytes; off += piece) {
        size_t n = (size_t)(bytes - off < piece ? bytes - off : piece);
        int rc = ddo__dev_copy_h2d(dev, dst + off, src + off, n, stream);
        if (rc != 0)
            return rc;
    }
    int rc = ddo__dev_stream_synchronize(dev, stream);
    if (rc != 0)
        return rc;
    uint64_t dt = ddo__now_ns() - t0;
    *rate = dt ? (double)bytes * 1e9 / (double)dt : 0.0;
    return 0;
}

/* Frees what a bus test set up; NULL / 0 for what it did not get. */
static void release(ddo_device *dev, void *stream, uint64_t dptr, void *pinned)
{
    if (pinned != NULL)
        ddo__dev_host_free(dev, pinned);
    if (dptr != 0)
        ddo__dev_mem_free(dev, dptr);
    if (stream != NULL)
        ddo__dev_stream_destroy(dev, stream);
}

int ddo_device_measure(ddo_device *dev, uint64_t bytes, ddo_device_bandwidth *out)
{
    if (dev == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_device_measure: NULL argument");
    if (bytes == 0)
        bytes = DDO_GIB;
    bytes = ddo__round_up(bytes, PIECE_BYTES);
    ddo_device_bandwidth r;
    memset(&r, 0, sizeof(r));
    r.bytes = bytes;
    void *stream = NULL, *pinned = NULL;
    unsigned char *pageable = NULL;
    uint64_t dptr = 0;
    int rc;
    if ((rc = ddo__dev_stream_create(dev, 1, &stream)) != 0)
        goto out;
    if ((rc = ddo__dev_mem_alloc(dev, bytes, &dptr)) != 0)
        goto out;
    uint64_t t0 = ddo__now_ns();
    if ((rc = ddo__dev_host_alloc(dev, (size_t)bytes, &pinned)) != 0)
        goto out;
    r.pinned_alloc_s_per_gib =
        (double)(ddo__now_ns() - t0) / 1e9 / ((double)bytes / (double)DDO_GIB);
    memset(pinned, 0x5a, (size_t)bytes);
    double v[PASSES];
    /* One warm-up pass, then the median of three. */
    if ((rc = time_copies(dev, stream, dptr, pinned, bytes, PIECE_BYTES, &v[0])) != 0)
        goto out;
    for (int i = 0; i < PASSES; i++)
        if ((rc = time_copies(dev, stream, dptr, pinned, bytes, PIECE_BYTES, &v[i])) != 0)
            goto out;
    r.pinned_bytes_per_s = median3(v);
    for (int i = 0; i < PASSES; i++)
        if ((rc = time_copies(dev, stream, dptr, pinned, bytes, SMALL_PIECE, &v[i])) != 0)
            goto out;
    r.pinned_2mib_bytes_per_s = median3(v);
    ddo__dev_host_free(dev, pinned);
    pinned = NULL;

    pageable = ddo__os_aligned_alloc(4096, (size_t)bytes);
    if (pageable == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_device_measure: out of host memory");
        goto out;
    }
    memset(pageable, 0xa5, (size_t)bytes);
    for (int i = 0; i < PASSES; i++)
        if ((rc = time_copies(dev, stream, dptr, pageable, bytes, PIECE_BYTES, &v[i])) != 0)
            goto out;
    r.pageable_bytes_per_s = median3(v);
    /* Registration of existing pages, in the 64 MiB segments the retained store uses. */
    t0 = ddo__now_ns();
    uint64_t done = 0;
    for (; done < bytes; done += DDO_SEGMENT_BYTES) {
        size_t n = (size_t)(bytes - done < DDO_SEGMENT_BYTES ? bytes - done : DDO_SEGMENT_BYTES);
        if ((rc = ddo__dev_host_register(dev, pageable + done, n)) != 0)
            break;
    }
    uint64_t dt = ddo__now_ns() - t0;
    for (uint64_t off = 0; off < done; off += DDO_SEGMENT_BYTES)
        ddo__dev_host_unregister(dev, pageable + off);
    if (rc != 0)
        goto out;
    r.register_s_per_gib = (double)dt / 1e9 / ((double)bytes / (double)DDO_GIB);
    *out = r;
out:
    ddo__os_aligned_free(pageable);
    release(dev, stream, dptr, pinned);
    return rc;
}

int ddo__measure_bus_quick(ddo_device *dev, double *rate)
{
    *rate = 0.0;
    const uint64_t bytes = 2 * PIECE_BYTES;
    void *stream = NULL, *pinned = NULL;
    uint64_t dptr = 0;
    int rc = ddo__dev_stream_create(dev, 1, &stream);
    if (rc == 0)
        rc = ddo__dev_mem_alloc(dev, bytes, &dptr);
    if (rc == 0)
        rc = ddo__dev_host_alloc(dev, (size_t)bytes, &pinned);
    if (rc == 0) {
        memset(pinned, 0x5a, (size_t)bytes);
        double v[PASSES];
        /* One warm-up pass, then the median of three. */
        rc = time_copies(dev, stream, dptr, pinned, bytes, PIECE_BYTES, &v[0]);
        for (int i = 0; rc == 0 && i < PASSES; i++)
            rc = time_copies(dev, stream, dptr, pinned, bytes, PIECE_BYTES, &v[i]);
        if (rc == 0)
            *rate = median3(v);
    }
    release(dev, stream, dptr, pinned);
    return rc;
}

/* Reads [0, len) of fd into buf in pieces through the page cache; bytes/s, or an error. */
static int time_reads(int fd, unsigned char *buf, size_t piece, uint64_t len, const char *path,
                      double *rate)
{
    uint64_t t0 = ddo__now_ns();
    uint64_t off = 0;
    while (off < len) {
        size_t want = (size_t)(len - off < piece ? len - off : piece);
        int e = ddo__os_pread_full(fd, buf, want, off);
        if (e == DDO__OS_EOF)
            break; /* the file shrank: time what was there */
        if (e != 0)
            return ddo__fail(NULL, DDO_E_IO, "%s: read: %s", path, ddo__os_file_strerror(e));
        off += want;
    }
    uint64_t dt = ddo__now_ns() - t0;
    *rate = dt ? (double)off * 1e9 / (double)dt : 0.0;
    return 0;
}

/* One direct reader of a parallel pass: pieces tid, tid + n, tid + 2n, ... */
typedef struct direct_reader {
    int fd;
    uint64_t len;
    unsigned tid, n;
    uint64_t bytes;
    int err;
} direct_reader;

static void *direct_thread(void *arg)
{
    direct_reader *r = arg;
    void *buf = ddo__os_aligned_alloc((size_t)DDO__OS_DIRECT_ALIGN, (size_t)DDO__OS_READ_CHUNK);
    if (buf == NULL) {
        r->err = ENOMEM;
        return NULL;
    }
    for (uint64_t off = (uint64_t)r->tid * DDO__OS_READ_CHUNK; off < r->len;
         off += (uint64_t)r->n * DDO__OS_READ_CHUNK) {
        uint64_t want = r->len - off < DDO__OS_READ_CHUNK ? r->len - off : DDO__OS_READ_CHUNK;
        /* The retained store's direct reader; each thread is one request in flight. */
        int64_t got = ddo__os_read_direct(r->fd, off, want, buf, false);
        if (got <= 0) {
            r->err = got < 0 ? (int)-got : EIO;
            break;
        }
        r->bytes += (uint64_t)got;
    }
    ddo__os_aligned_free(buf);
    return NULL;
}

/* The retained store's depth: requests in flight per ring. */
#define DIRECT_STREAMS DDO__OS_READ_DEPTH

/* One pass of direct reads with DIRECT_STREAMS in flight; bytes/s, 0 when refused. */
static double direct_pass(const char *path, uint64_t len)
{
    int fd = -1;
    if (ddo__os_file_open_direct(path, &fd) != 0)
        return 0;
    len = len / DDO__OS_DIRECT_ALIGN * DDO__OS_DIRECT_ALIGN;
    direct_reader r[DIRECT_STREAMS];
    ddo__thread tid[DIRECT_STREAMS];
    unsigned started = 0;
    uint64_t t0 = ddo__now_ns();
    for (unsigned i = 0; i < DIRECT_STREAMS; i++) {
        r[i] = (direct_reader){ fd, len, i, DIRECT_STREAMS, 0, 0 };
        if (ddo__thread_create(&tid[i], direct_thread, &r[i]) != 0)
            break;
        started++;
    }
    uint64_t bytes = 0;
    int err = started == DIRECT_STREAMS ? 0 : EAGAIN;
    for (unsigned i = 0; i < started; i++) {
        ddo__thread_join(tid[i]);
        bytes += r[i].bytes;
        if (r[i].err != 0)
            err = r[i].err;
    }
    uint64_t dt = ddo__now_ns() - t0;
    ddo__os_file_close(fd);
    return err == 0 && dt > 0 && bytes > 0 ? (double)bytes * 1e9 / (double)dt : 0;
}

int ddo_measure_file_read(const char *path, uint64_t max_bytes, unsigned what, ddo_file_speed *out)
{
    if (path == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_measure_file_read: NULL argument");
    int fd = -1;
    int e = ddo__os_file_open(path, &fd); /* never blocks: a FIFO or device is refused */
    if (e == DDO__OS_NOT_REGULAR || e == EISDIR)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "%s: not a regular file", path);
    if (e != 0)
        return ddo__fail(NULL, e == ENOENT ? DDO_E_NOT_FOUND : DDO_E_IO, "%s: open: %s", path,
                         ddo__os_file_strerror(e));
    ddo__file_id id;
    if (ddo__os_file_identity(fd, &id) != 0 || !id.regular) {
        ddo__os_file_close(fd);
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "%s: not a regular file", path);
    }
    uint64_t len = id.size;
    if (max_bytes != 0 && len > max_bytes)
        len = max_bytes;
    ddo_file_speed r;
    memset(&r, 0, sizeof(r));
    r.bytes = len;
    int rc = 0;
    if (what & DDO_MEASURE_PAGE_CACHE) {
        unsigned char *buf = ddo__os_aligned_alloc(4096, PIECE_BYTES);
        if (buf == NULL) {
            ddo__os_file_close(fd);
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_measure_file_read: out of memory");
        }
        double warm, v[PASSES];
        /* The first pass warms the page cache; then the median of three cached passes. */
        rc = time_reads(fd, buf, PIECE_BYTES, len, path, &warm);
        for (int i = 0; rc == 0 && i < PASSES; i++)
            rc = time_reads(fd, buf, PIECE_BYTES, len, path, &v[i]);
        if (rc == 0)
            r.page_cache_bytes_per_s = median3(v);
        ddo__os_aligned_free(buf);
    }
    ddo__os_file_close(fd);
    if (rc != 0)
        return rc;
    if (what & DDO_MEASURE_DIRECT) {
        /* O_DIRECT bypasses the cache: one pass measures the device. */
        r.direct_bytes_per_s = direct_pass(path, len);
        r.direct_streams = r.direct_bytes_per_s > 0 ? DIRECT_STREAMS : 0;
    }
    *out = r;
    return 0;
}
