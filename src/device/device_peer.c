/*
 * device_peer.c - the measured device->device link of a device set (docs/multi-gpu.md):
 * ddo_device_measure_peer, what `ddo doctor --devices` reports and what a host gives the plan
 * as ddo_plan_inputs.peer_bytes_per_s. On the cpu device the link is the emulated one (a
 * memcpy at the destination's peer throttle). And ddo_device_measure_split: the intake of
 * each device of a set when each copies 1/n of a buffer from host memory and an all-gather
 * completes it (split mode's mechanism, collective.h).
 */
#include "device/collective.h"
#include "device/device.h"

#include <stdlib.h>
#include <string.h>

#define PEER_PIECE  ((uint64_t)64 << 20)
#define PEER_PASSES 3

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One pass: bytes from src_p on src to dst_p on dst in pieces, on dst's stream; bytes/s. */
static int pass(ddo_device *dst, uint64_t dst_p, ddo_device *src, uint64_t src_p, uint64_t bytes,
                void *stream, double *rate)
{
    uint64_t t0 = ddo__now_ns();
    for (uint64_t off = 0; off < bytes; off += PEER_PIECE) {
        size_t n = (size_t)(bytes - off < PEER_PIECE ? bytes - off : PEER_PIECE);
        int rc = ddo__dev_copy_peer(dst, dst_p + off, src, src_p + off, n, stream);
        if (rc != 0)
            return rc;
    }
    int rc = ddo__dev_stream_synchronize(dst, stream);
    if (rc != 0)
        return rc;
    uint64_t dt = ddo__now_ns() - t0;
    *rate = dt ? (double)bytes * 1e9 / (double)dt : 0.0;
    return 0;
}

/* The detail of a failed step on dev, as ddo_last_error. */
static int failed(ddo_device *dev, int rc, const char *what)
{
    return ddo__fail(NULL, rc, "ddo_device_measure_peer: %s: %s", what, ddo_device_error(dev));
}

int ddo_device_measure_peer(ddo_device *dst, ddo_device *src, uint64_t bytes, double *bytes_per_s)
{
    if (dst == NULL || src == NULL || bytes_per_s == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_device_measure_peer: NULL argument");
    if (dst == src || ddo__device_ops_of(dst) != ddo__device_ops_of(src))
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_device_measure_peer: two devices of one kind are needed");
    if (bytes == 0)
        bytes = (uint64_t)256 << 20;
    uint64_t dp = 0, sp = 0;
    void *stream = NULL;
    double v[PEER_PASSES + 1];
    int rc = ddo__dev_mem_alloc(dst, bytes, &dp);
    if (rc != 0) {
        dp = 0;
        rc = failed(dst, rc, "destination buffer");
    }
    if (rc == 0 && (rc = ddo__dev_mem_alloc(src, bytes, &sp)) != 0) {
        sp = 0;
        rc = failed(src, rc, "source buffer");
    }
    if (rc == 0 && (rc = ddo__dev_stream_create(dst, 1, &stream)) != 0) {
        stream = NULL;
        rc = failed(dst, rc, "stream");
    }
    /* A warm-up pass (peer access, first touch), then the median of three. */
    for (int i = 0; i <= PEER_PASSES && rc == 0; i++)
        if ((rc = pass(dst, dp, src, sp, bytes, stream, &v[i])) != 0)
            rc = failed(dst, rc, "copy");
    if (rc == 0) {
        qsort(v + 1, PEER_PASSES, sizeof(double), cmp_double);
        *bytes_per_s = v[1 + PEER_PASSES / 2];
    }
    if (stream != NULL)
        (void)ddo__dev_stream_destroy(dst, stream);
    if (sp != 0)
        (void)ddo__dev_mem_free(src, sp);
    if (dp != 0)
        (void)ddo__dev_mem_free(dst, dp);
    return rc;
}

/* ---- the split intake (ddo_device_measure_split) ---- */

typedef struct split_fx {
    size_t n;
    ddo_device *const *devs;
    void *host;
    uint64_t buf[DDO__COMM_MAX];
    void *stream[DDO__COMM_MAX];
    ddo__comm *comm;
} split_fx;

static void split_release(split_fx *f)
{
    ddo__comm_destroy(f->comm);
    for (size_t r = 0; r < f->n; r++) {
        if (f->stream[r] != NULL)
            (void)ddo__dev_stream_destroy(f->devs[r], f->stream[r]);
        if (f->buf[r] != 0)
            (void)ddo__dev_mem_free(f->devs[r], f->buf[r]);
    }
    if (f->host != NULL)
        (void)ddo__dev_host_free(f->devs[0], f->host);
}

static int split_setup(split_fx *f, uint64_t bytes, const char *nccl_path)
{
    ddo__errbuf eb = { 0, "" };
    int rc = ddo__comm_create(f->devs, f->n, nccl_path, &f->comm, &eb);
    if (rc != 0)
        return ddo__fail(NULL, rc, "ddo_device_measure_split: %s", eb.msg);
    uint64_t room = ddo__split_shard(bytes, f->n) * f->n;
    if ((rc = ddo__dev_host_alloc(f->devs[0], (size_t)bytes, &f->host)) != 0) {
        f->host = NULL;
        return failed(f->devs[0], rc, "pinned host buffer");
    }
    unsigned char *h = f->host;
    for (uint64_t j = 0; j < bytes; j++)
        h[j] = (unsigned char)(j * 131u + (j >> 12));
    for (size_t r = 0; r < f->n; r++) {
        if ((rc = ddo__dev_mem_alloc(f->devs[r], room, &f->buf[r])) != 0) {
            f->buf[r] = 0;
            return failed(f->devs[r], rc, "device buffer");
        }
        if ((rc = ddo__dev_stream_create(f->devs[r], 1, &f->stream[r])) != 0) {
            f->stream[r] = NULL;
            return failed(f->devs[r], rc, "stream");
        }
    }
    return 0;
}

/* One split upload to every rank, timed to its completion on all; bytes/s per rank. */
static int split_pass(split_fx *f, uint64_t bytes, double *rate)
{
    ddo__errbuf eb = { 0, "" };
    uint64_t t0 = ddo__now_ns();
    int rc = ddo__split_upload(f->comm, f->host, bytes, f->buf, f->stream, &eb);
    if (rc != 0)
        return ddo__fail(NULL, rc, "ddo_device_measure_split: %s", eb.msg);
    for (size_t r = 0; r < f->n; r++)
        if ((rc = ddo__dev_stream_synchronize(f->devs[r], f->stream[r])) != 0)
            return failed(f->devs[r], rc, "synchronize");
    uint64_t dt = ddo__now_ns() - t0;
    *rate = dt ? (double)bytes * 1e9 / (double)dt : 0.0;
    return 0;
}

/* Every rank holds the host's bytes after the last pass. */
static int split_verify(split_fx *f, uint64_t bytes)
{
    unsigned char *back = malloc((size_t)bytes);
    if (back == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_device_measure_split: read-back buffer");
    int rc = 0;
    for (size_t r = 0; r < f->n && rc == 0; r++) {
        rc = ddo__dev_copy_d2h(f->devs[r], back, f->buf[r], (size_t)bytes);
        if (rc != 0)
            rc = failed(f->devs[r], rc, "read back");
        else if (memcmp(back, f->host, (size_t)bytes) != 0)
            rc = ddo__fail(NULL, DDO_E_INTERNAL,
                           "ddo_device_measure_split: rank %zu's bytes differ from the host's "
                           "after the all-gather",
                           r);
    }
    free(back);
    return rc;
}

int ddo_device_measure_split(ddo_device *const *devs, size_t n, uint64_t bytes,
                             const char *nccl_path, double *bytes_per_s)
{
    if (devs == NULL || bytes_per_s == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_device_measure_split: NULL argument");
    if (bytes == 0)
        bytes = DDO_GIB;
    split_fx f;
    memset(&f, 0, sizeof(f));
    f.n = n;
    f.devs = devs;
    int rc = split_setup(&f, bytes, nccl_path);
    double v[PEER_PASSES + 1];
    for (int i = 0; i <= PEER_PASSES && rc == 0; i++) /* a warm-up, then the median of three */
        rc = split_pass(&f, bytes, &v[i]);
    if (rc == 0)
        rc = split_verify(&f, bytes);
    if (rc == 0) {
        qsort(v + 1, PEER_PASSES, sizeof(double), cmp_double);
        *bytes_per_s = v[1 + PEER_PASSES / 2];
    }
    split_release(&f);
    return rc;
}
