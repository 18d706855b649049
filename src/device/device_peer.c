/*
 * device_peer.c - the measured device->device link of a device set (docs/multi-gpu.md):
 * ddo_device_measure_peer, what `ddo doctor --devices` reports and what a host gives the plan
 * as ddo_plan_inputs.peer_bytes_per_s. On the cpu device the link is the emulated one (a
 * memcpy at the destination's peer throttle).
 */
#define _POSIX_C_SOURCE 200809L
#include "device.h"

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
