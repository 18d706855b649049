/*
 * test_collective.c - the all-gather of a device set and the split upload on the cpu device
 * (collective.h): bytes complete on every rank (in place and not), each rank takes in only
 * its 1/n share over its host link, a rank whose host function cannot be queued fails the
 * call without hanging the others, and NCCL's loader fails with its one line where the
 * library is absent.
 *
 * ctest-labels: unit threads
 */
#include "device/collective.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 3

static ddo_device *open_cpu(const char *spec)
{
    ddo_cpu_options c = DDO_CPU_OPTIONS_INIT;
    c.memory_bytes = 256ull << 20;
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cpu = &c;
    ddo_device *d = NULL;
    return ddo_device_create(spec, &o, &d) == 0 ? d : NULL;
}

typedef struct ranks {
    ddo_device *dev[N];
    void *stream[N];
    uint64_t buf[N];
    ddo__comm *comm;
} ranks;

static void ranks_open(ranks *r, uint64_t buf_bytes)
{
    memset(r, 0, sizeof(*r));
    for (int i = 0; i < N; i++) {
        char spec[16];
        snprintf(spec, sizeof(spec), "cpu:%d", i);
        r->dev[i] = open_cpu(spec);
        T_REQUIRE(r->dev[i] != NULL);
        T_REQUIRE(ddo__dev_stream_create(r->dev[i], 1, &r->stream[i]) == 0);
        T_REQUIRE(ddo__dev_mem_alloc(r->dev[i], buf_bytes, &r->buf[i]) == 0);
        memset((void *)(uintptr_t)r->buf[i], 0xEE, buf_bytes);
    }
    ddo__errbuf eb = { 0, "" };
    T_REQUIRE(ddo__comm_create(r->dev, N, NULL, &r->comm, &eb) == 0);
    T_EQ_U64(ddo__comm_size(r->comm), N);
    T_EQ_STR(ddo__comm_engine(r->comm), "emulated (cpu)");
}

static void ranks_sync(ranks *r)
{
    for (int i = 0; i < N; i++)
        T_REQUIRE(ddo__dev_stream_synchronize(r->dev[i], r->stream[i]) == 0);
}

static void ranks_close(ranks *r)
{
    ddo__comm_destroy(r->comm);
    for (int i = 0; i < N; i++) {
        T_REQUIRE(ddo__dev_mem_free(r->dev[i], r->buf[i]) == 0);
        T_REQUIRE(ddo__dev_stream_destroy(r->dev[i], r->stream[i]) == 0);
        ddo_device_destroy(r->dev[i]);
    }
}

static void test_split_upload(void)
{
    const uint64_t bytes = (5ull << 20) + 12345; /* not a multiple of N */
    uint64_t shard = ddo__split_shard(bytes, N);
    T_CHECK(shard * N >= bytes && shard * (N - 1) < bytes);
    ranks r;
    ranks_open(&r, shard * N);
    unsigned char *host = malloc(bytes);
    for (uint64_t j = 0; j < bytes; j++)
        host[j] = (unsigned char)(j * 2654435761u >> 13);
    ddo__errbuf eb = { 0, "" };
    for (int round = 0; round < 3; round++) { /* the streams go on after each gather */
        T_REQUIRE(ddo__split_upload(r.comm, host, bytes, r.buf, r.stream, &eb) == 0);
        ranks_sync(&r);
        for (int i = 0; i < N; i++)
            T_CHECK(memcmp((void *)(uintptr_t)r.buf[i], host, bytes) == 0);
        host[round * 1000] ^= 0x5A;
    }
    /* each rank took in its share from the host, not the whole */
    for (int i = 0; i < N; i++) {
        ddo__devop_stats st[DDO__OP_COUNT];
        ddo__device_stats(r.dev[i], st);
        uint64_t want = i < N - 1 ? shard : bytes - (N - 1) * shard;
        T_EQ_U64(st[DDO__OP_COPY_H2D].bytes, 3 * want);
    }
    free(host);
    ranks_close(&r);
}

/* Not in place: rank k's send buffer is its own, the gather fills recv. */
static void test_all_gather_out_of_place(void)
{
    const uint64_t part = 1 << 16;
    ranks r;
    ranks_open(&r, part * (N + 1));
    uint64_t send[N], recv[N];
    for (int i = 0; i < N; i++) {
        send[i] = r.buf[i] + part * N; /* after the gathered area */
        recv[i] = r.buf[i];
        memset((void *)(uintptr_t)send[i], 0x10 + i, part);
    }
    ddo__errbuf eb = { 0, "" };
    T_REQUIRE(ddo__comm_all_gather(r.comm, send, recv, part, r.stream, &eb) == 0);
    ranks_sync(&r);
    for (int i = 0; i < N; i++)
        for (int k = 0; k < N; k++) {
            const unsigned char *p =
                (const unsigned char *)(uintptr_t)(recv[i] + (uint64_t)k * part);
            T_EQ_INT(p[0], 0x10 + k);
            T_EQ_INT(p[part - 1], 0x10 + k);
        }
    ranks_close(&r);
}

/* A host function that cannot be queued on rank 1: the call fails naming the rank, rank 0's
 * queued function gives up instead of waiting forever, and the next gather works. */
static void test_gather_queue_failure(void)
{
    const uint64_t part = 4096;
    ranks r;
    ranks_open(&r, part * N);
    uint64_t send[N];
    for (int i = 0; i < N; i++)
        send[i] = r.buf[i] + (uint64_t)i * part;
    ddo__device_inject_fault(r.dev[1], DDO__OP_HOST_FN, 1, false, DDO_E_DEVICE);
    ddo__errbuf eb = { 0, "" };
    T_EQ_INT(ddo__comm_all_gather(r.comm, send, r.buf, part, r.stream, &eb), DDO_E_DEVICE);
    T_CONTAINS(eb.msg, "rank 1");
    ranks_sync(&r); /* returns: rank 0 did not hang */
    T_REQUIRE(ddo__comm_all_gather(r.comm, send, r.buf, part, r.stream, &eb) == 0);
    ranks_sync(&r);
    ranks_close(&r);
}

static void test_refused_and_nccl_absent(void)
{
    ddo_device *a = open_cpu("cpu:0");
    T_REQUIRE(a != NULL);
    ddo_device *two[2] = { a, a };
    ddo__comm *c = NULL;
    ddo__errbuf eb = { 0, "" };
    T_EQ_INT(ddo__comm_create(two, 2, NULL, &c, &eb), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__comm_create(two, 1, NULL, &c, &eb), DDO_E_INVALID_ARGUMENT);
    T_CHECK(c == NULL);
    ddo_device_destroy(a);
    /* NCCL's loader: the one line when the library is not there (a cuda set needs a GPU;
     * test_gpu_* cover that machine) */
    ddo_device *g[2] = { NULL, NULL };
    if (ddo_device_create("cuda:0", NULL, &g[0]) == 0 &&
        ddo_device_create("cuda:1", NULL, &g[1]) == 0) {
        T_EQ_INT(ddo__comm_create(g, 2, "/nonexistent/libnccl.so.2", &c, &eb), DDO_E_NO_DEVICE);
        T_CONTAINS(eb.msg, "NCCL not available: dlopen(/nonexistent/libnccl.so.2)");
    }
    ddo_device_destroy(g[0]);
    ddo_device_destroy(g[1]);
}

/* The public measurement of split mode's intake: the bytes are read back on every device. */
static void test_measure_split(void)
{
    ddo_device *d[N];
    for (int i = 0; i < N; i++) {
        char spec[16];
        snprintf(spec, sizeof(spec), "cpu:%d", i);
        d[i] = open_cpu(spec);
        T_REQUIRE(d[i] != NULL);
    }
    double rate = 0;
    T_EQ_INT(ddo_device_measure_split(d, N, (3u << 20) + 7, NULL, &rate), 0);
    T_CHECK(rate > 0);
    T_EQ_INT(ddo_device_measure_split(d, 1, 1 << 20, NULL, &rate), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_device_measure_split(NULL, N, 1 << 20, NULL, &rate), DDO_E_INVALID_ARGUMENT);
    double peer = 0;
    T_EQ_INT(ddo_device_measure_peer(d[0], d[1], 4u << 20, &peer), 0);
    T_CHECK(peer > 0);
    T_EQ_INT(ddo_device_measure_peer(d[0], d[0], 4u << 20, &peer), DDO_E_INVALID_ARGUMENT);
    for (int i = 0; i < N; i++) {
        ddo__device_usage_t u;
        ddo__device_usage(d[i], &u);
        T_EQ_U64(u.device_bytes, 0); /* everything given back */
        T_EQ_U64(u.pinned_bytes, 0);
        ddo_device_destroy(d[i]);
    }
}

int main(void)
{
    T_RUN(test_split_upload);
    T_RUN(test_all_gather_out_of_place);
    T_RUN(test_gather_queue_failure);
    T_RUN(test_refused_and_nccl_absent);
    T_RUN(test_measure_split);
    return t_done();
}
