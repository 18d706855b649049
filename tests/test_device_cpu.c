/*
 * test_device_cpu.c - the cpu device through the device wrappers: the VMM
 * lifecycle, shared physical bytes, the device-size budget, streams, events,
 * host functions, the copy throttle, host registration and d2h copies.
 *
 * ctest-labels: unit backend threads
 */
#include "device/device.h"
#include "os/sysinfo.h"
#include "os/thread.h"
#include "t.h"

#include <stdint.h>
#include <string.h>

#define MIB  ((uint64_t)1 << 20)
#define GRAN (2 * MIB)

static ddo_device *open_cpu(uint64_t size)
{
    ddo_cpu_options o_cpu = DDO_CPU_OPTIONS_INIT;
    o_cpu.memory_bytes = size;
    o_cpu.granularity = GRAN;
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cpu = &o_cpu;
    ddo_device *dev = NULL;
    int rc = ddo_device_create("cpu", &o, &dev);
    if (rc != 0)
        fprintf(stderr, "  ddo_device_create: %s\n", ddo_last_error());
    return dev;
}

static void check_usage_zero(ddo_device *dev)
{
    ddo__device_usage_t u;
    ddo__device_usage(dev, &u);
    T_EQ_U64(u.device_bytes, 0);
    T_EQ_U64(u.pinned_bytes, 0);
    T_EQ_U64(u.registered_bytes, 0);
    T_EQ_U64(u.va_bytes, 0);
    T_EQ_U64(u.mapped_bytes, 0);
    uint64_t f = 0, t = 0;
    T_EQ_INT(ddo__dev_mem_info(dev, &f, &t), 0);
    T_EQ_U64(f, t);
}

static void test_spec(void)
{
    ddo_device *dev = (ddo_device *)1;
    T_EQ_INT(ddo_device_create("gpu", NULL, &dev), DDO_E_INVALID_ARGUMENT);
    T_CHECK(dev == NULL);
    T_CONTAINS(ddo_last_error(), "\"gpu\"");
    T_EQ_INT(ddo_device_create("cuda:x", NULL, &dev), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "\"cuda:x\"");
    T_EQ_INT(ddo_device_create("cuda:", NULL, &dev), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_device_create("CPU", NULL, &dev), DDO_E_INVALID_ARGUMENT);
    if (ddo__device_cuda_ops == NULL) {
        T_EQ_INT(ddo_device_create("cuda:0", NULL, &dev), DDO_E_NO_DEVICE);
        T_EQ_STR(ddo_last_error(), "device \"cuda:0\": ddo was built without CUDA support");
        T_CHECK(dev == NULL);
    }

    T_EQ_INT(ddo_device_create("cpu", NULL, &dev), 0);
    T_REQUIRE(dev != NULL);
    ddo_device_caps caps;
    T_EQ_INT(ddo_device_caps_get(dev, &caps), 0);
    T_CHECK(caps.is_cpu);
    T_CHECK(caps.vmm_supported);
    /* The memory the machine has available (within the cgroup limit) when it opens, all
     * free. */
    uint64_t avail = ddo__os_available_ram_bytes(), cg = ddo__os_cgroup_memory_limit();
    if (cg > 0 && (avail == 0 || cg < avail))
        avail = cg;
    T_CHECK(avail == 0 ||
            (caps.total_bytes > avail - avail / 4 && caps.total_bytes < avail + avail / 4));
    T_CHECK(avail > 0 || caps.total_bytes == 64 * DDO_GIB);
    T_EQ_U64(caps.free_bytes, caps.total_bytes);
    T_EQ_U64(caps.granularity, 2 * MIB);
    T_CHECK(ddo__device_is_cpu(dev));
    T_CHECK(ddo__device_ops_of(dev) == &ddo__device_cpu_ops);
    ddo_device_destroy(dev);
    ddo_device_destroy(NULL);

    ddo_cpu_options o_cpu = DDO_CPU_OPTIONS_INIT;
    o_cpu.granularity = 1000;
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cpu = &o_cpu;
    T_EQ_INT(ddo_device_create("cpu", &o, &dev), DDO_E_CONFIG);
    T_CONTAINS(ddo_last_error(), "granularity 1000");
}

static void test_vmm_lifecycle(void)
{
    ddo_device *dev = open_cpu(256 * MIB);
    T_REQUIRE(dev != NULL);
    uint64_t va = 0, h = 0;
    T_EQ_INT(ddo__dev_va_reserve(dev, 4 * GRAN, &va), 0);
    T_CHECK(va != 0 && va % GRAN == 0);
    T_EQ_INT(ddo__dev_phys_create(dev, 2 * GRAN, &h), 0);
    uint64_t f = 0, t = 0;
    T_EQ_INT(ddo__dev_mem_info(dev, &f, &t), 0);
    T_EQ_U64(t, 256 * MIB);
    T_EQ_U64(f, 256 * MIB - 2 * GRAN);

    /* set_access before map fails; misaligned sizes are refused by the wrapper. */
    T_EQ_INT(ddo__dev_set_access(dev, va, 2 * GRAN), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_device_error(dev), "is not mapped");
    T_EQ_INT(ddo__dev_map(dev, va, GRAN + 4096, h, 0), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_device_error(dev), "granularity");

    T_EQ_INT(ddo__dev_map(dev, va, 2 * GRAN, h, 0), 0);
    T_EQ_INT(ddo__dev_set_access(dev, va, 2 * GRAN), 0);
    T_EQ_INT(ddo__dev_set_access(dev, va, 3 * GRAN), DDO_E_INVALID_ARGUMENT);
    /* Mapping over a mapped piece is refused. */
    T_EQ_INT(ddo__dev_map(dev, va + GRAN, 2 * GRAN, h, 0), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_device_error(dev), "overlaps");

    unsigned char *p = (unsigned char *)(uintptr_t)va;
    for (size_t i = 0; i < 2 * GRAN; i++)
        p[i] = (unsigned char)(i * 7 + 3);
    unsigned char *back = malloc(2 * GRAN);
    T_REQUIRE(back != NULL);
    T_EQ_INT(ddo__dev_copy_d2h(dev, back, va, 2 * GRAN), 0);
    T_CHECK(memcmp(back, p, 2 * GRAN) == 0);
    free(back);

    ddo__device_usage_t u;
    ddo__device_usage(dev, &u);
    T_EQ_U64(u.device_bytes, 2 * GRAN);
    T_EQ_U64(u.va_bytes, 4 * GRAN);
    T_EQ_U64(u.mapped_bytes, 2 * GRAN);

    /* va_release of a mapped range is refused (the range must be unmapped first). */
    T_EQ_INT(ddo__dev_va_release(dev, va, 4 * GRAN), DDO_E_STATE);
    T_EQ_INT(ddo__dev_unmap(dev, va, 2 * GRAN), 0);
    T_EQ_INT(ddo__dev_set_access(dev, va, 2 * GRAN), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_phys_release(dev, h), 0);
    T_EQ_INT(ddo__dev_phys_release(dev, h), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_va_release(dev, va, 2 * GRAN), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_va_release(dev, va, 4 * GRAN), 0);
    check_usage_zero(dev);
    ddo__device_usage(dev, &u);
    T_EQ_U64(u.device_peak_bytes, 2 * GRAN);
    T_EQ_U64(u.va_peak_bytes, 4 * GRAN);
    ddo_device_destroy(dev);
}

static void test_shared_bytes(void)
{
    ddo_device *dev = open_cpu(256 * MIB);
    T_REQUIRE(dev != NULL);
    uint64_t a = 0, b = 0, c = 0, h = 0;
    T_EQ_INT(ddo__dev_va_reserve(dev, 2 * GRAN, &a), 0);
    T_EQ_INT(ddo__dev_va_reserve(dev, 2 * GRAN, &b), 0);
    T_EQ_INT(ddo__dev_va_reserve(dev, GRAN, &c), 0);
    T_EQ_INT(ddo__dev_phys_create(dev, 2 * GRAN, &h), 0);
    T_EQ_INT(ddo__dev_map(dev, a, 2 * GRAN, h, 0), 0);
    T_EQ_INT(ddo__dev_map(dev, b, 2 * GRAN, h, 0), 0);
    /* A non-zero handle offset is refused as cuMemMap refuses it; nothing is mapped. */
    T_EQ_INT(ddo__dev_map(dev, c, GRAN, h, GRAN), DDO_E_UNSUPPORTED);
    T_CONTAINS(ddo_device_error(dev),
               "cpu: map: handle offset 2097152: not supported (as cuMemMap: "
               "CUDA_ERROR_NOT_SUPPORTED; the offset must be zero)");
    ddo__device_usage_t u;
    ddo__device_usage(dev, &u);
    T_EQ_U64(u.mapped_bytes, 4 * GRAN);
    T_EQ_INT(ddo__dev_unmap(dev, c, GRAN), DDO_E_INVALID_ARGUMENT); /* nothing there */
    /* A mapping larger than the handle is refused. */
    uint64_t d = 0;
    T_EQ_INT(ddo__dev_va_reserve(dev, 4 * GRAN, &d), 0);
    T_EQ_INT(ddo__dev_map(dev, d, 4 * GRAN, h, 0), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_device_error(dev), "exceed the handle");
    T_EQ_INT(ddo__dev_va_release(dev, d, 4 * GRAN), 0);

    char *pa = (char *)(uintptr_t)a, *pb = (char *)(uintptr_t)b, *pc = (char *)(uintptr_t)c;
    strcpy(pa, "written through a");
    strcpy(pa + GRAN, "second granule");
    T_EQ_STR(pb, "written through a");
    T_EQ_STR(pb + GRAN, "second granule");
    strcpy(pb + 100, "and back through b");
    T_EQ_STR(pa + 100, "and back through b");

    /* Releasing a mapped handle keeps its memory until the last unmap (CUDA semantics). */
    T_EQ_INT(ddo__dev_phys_release(dev, h), 0);
    uint64_t f = 0, t = 0;
    T_EQ_INT(ddo__dev_mem_info(dev, &f, &t), 0);
    T_EQ_U64(t - f, 2 * GRAN);
    T_EQ_STR(pb, "written through a");
    T_EQ_INT(ddo__dev_unmap(dev, a, 2 * GRAN), 0);
    T_EQ_STR(pb + GRAN, "second granule");
    T_EQ_INT(ddo__dev_mem_info(dev, &f, &t), 0);
    T_EQ_U64(t - f, 2 * GRAN);
    T_EQ_INT(ddo__dev_unmap(dev, b, 2 * GRAN), 0);
    T_EQ_INT(ddo__dev_mem_info(dev, &f, &t), 0);
    T_EQ_U64(f, t);

    /* Unmapping keeps a live handle's bytes: map, write, unmap, map again elsewhere. */
    T_EQ_INT(ddo__dev_phys_create(dev, GRAN, &h), 0);
    T_EQ_INT(ddo__dev_map(dev, a, GRAN, h, 0), 0);
    strcpy(pa, "survives unmap");
    T_EQ_INT(ddo__dev_unmap(dev, a, GRAN), 0);
    T_EQ_INT(ddo__dev_map(dev, c, GRAN, h, 0), 0);
    T_EQ_STR(pc, "survives unmap");
    T_EQ_INT(ddo__dev_unmap(dev, c, GRAN), 0);
    T_EQ_INT(ddo__dev_phys_release(dev, h), 0);

    T_EQ_INT(ddo__dev_va_release(dev, a, 2 * GRAN), 0);
    T_EQ_INT(ddo__dev_va_release(dev, b, 2 * GRAN), 0);
    T_EQ_INT(ddo__dev_va_release(dev, c, GRAN), 0);
    check_usage_zero(dev);
    ddo_device_destroy(dev);
}

static void test_unmap_rules(void)
{
    ddo_device *dev = open_cpu(256 * MIB);
    T_REQUIRE(dev != NULL);
    uint64_t va = 0, h1 = 0, h2 = 0;
    T_EQ_INT(ddo__dev_va_reserve(dev, 4 * GRAN, &va), 0);
    T_EQ_INT(ddo__dev_phys_create(dev, 2 * GRAN, &h1), 0);
    T_EQ_INT(ddo__dev_phys_create(dev, 2 * GRAN, &h2), 0);
    T_EQ_INT(ddo__dev_map(dev, va, 2 * GRAN, h1, 0), 0);
    T_EQ_INT(ddo__dev_map(dev, va + 2 * GRAN, 2 * GRAN, h2, 0), 0);
    T_EQ_INT(ddo__dev_phys_release(dev, h1), 0);
    T_EQ_INT(ddo__dev_phys_release(dev, h2), 0);
    T_EQ_INT(ddo__dev_set_access(dev, va, 4 * GRAN), 0);
    /* Half of a mapping cannot be unmapped. */
    T_EQ_INT(ddo__dev_unmap(dev, va, GRAN), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_device_error(dev), "is not exactly a set of mappings");
    T_EQ_INT(ddo__dev_unmap(dev, va + GRAN, 2 * GRAN), DDO_E_INVALID_ARGUMENT);
    /* Both mappings at once can. */
    T_EQ_INT(ddo__dev_unmap(dev, va, 4 * GRAN), 0);
    T_EQ_INT(ddo__dev_unmap(dev, va, 4 * GRAN), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_va_release(dev, va, 4 * GRAN), 0);
    check_usage_zero(dev);
    ddo_device_destroy(dev);
}

static void test_budget(void)
{
    ddo_device *dev = open_cpu(64 * MIB);
    T_REQUIRE(dev != NULL);
    uint64_t h1 = 0, h2 = 0, h3 = 0, p = 0;
    T_EQ_INT(ddo__dev_phys_create(dev, 32 * MIB, &h1), 0);
    T_EQ_INT(ddo__dev_phys_create(dev, 32 * MIB, &h2), 0);
    T_EQ_INT(ddo__dev_phys_create(dev, GRAN, &h3), DDO_E_DEVICE_MEMORY);
    T_EQ_STR(ddo_device_error(dev), "cpu: phys_create: out of device memory (like "
                                    "CUDA_ERROR_OUT_OF_MEMORY): 2097152 bytes requested, 0 "
                                    "free of 67108864");
    T_EQ_STR(ddo_last_error(), ddo_device_error(dev));
    T_EQ_INT(ddo__dev_mem_alloc(dev, 1, &p), DDO_E_DEVICE_MEMORY);
    T_EQ_INT(ddo__dev_phys_release(dev, h2), 0);
    /* Plain buffers count in 256-byte units against the same size. */
    T_EQ_INT(ddo__dev_mem_alloc(dev, 1000, &p), 0);
    T_CHECK(p % 256 == 0);
    uint64_t f = 0, t = 0;
    T_EQ_INT(ddo__dev_mem_info(dev, &f, &t), 0);
    T_EQ_U64(f, 32 * MIB - 1024);
    T_EQ_INT(ddo__dev_phys_create(dev, 32 * MIB, &h3), DDO_E_DEVICE_MEMORY);
    T_EQ_INT(ddo__dev_phys_create(dev, 30 * MIB, &h3), 0);
    ddo__device_usage_t u;
    ddo__device_usage(dev, &u);
    T_EQ_U64(u.device_bytes, 62 * MIB + 1000);
    T_EQ_U64(u.device_peak_bytes, 64 * MIB);
    T_EQ_INT(ddo__dev_mem_free(dev, p), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, p), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_phys_release(dev, h1), 0);
    T_EQ_INT(ddo__dev_phys_release(dev, h3), 0);
    check_usage_zero(dev);
    ddo_device_destroy(dev);
}

static void test_copies_ordered(void)
{
    ddo_device *dev = open_cpu(256 * MIB);
    T_REQUIRE(dev != NULL);
    void *s = NULL;
    uint64_t buf = 0;
    T_EQ_INT(ddo__dev_stream_create(dev, 1, &s), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, 64 * 1024, &buf), 0);
    /* Slow copies so the queue really builds up behind the worker. */
    T_EQ_INT(ddo__device_cpu_throttle(dev, 100e6, 0), 0);
    enum { N = 16 };
    static unsigned char src[N][64 * 1024];
    for (int i = 0; i < N; i++) {
        memset(src[i], i + 1, sizeof(src[i]));
        /* Each copy overwrites the whole buffer, then a later one its first half only. */
        size_t n = i % 2 ? sizeof(src[i]) / 2 : sizeof(src[i]);
        T_EQ_INT(ddo__dev_copy_h2d(dev, buf, src[i], n, s), 0);
    }
    T_EQ_INT(ddo__dev_stream_synchronize(dev, s), 0);
    const unsigned char *d = (const unsigned char *)(uintptr_t)buf;
    T_EQ_INT(d[0], N);
    T_EQ_INT(d[32 * 1024 - 1], N);
    T_EQ_INT(d[32 * 1024], N - 1);
    T_EQ_INT(d[64 * 1024 - 1], N - 1);
    /* A copy into memory that is not the device's is refused at once. */
    T_EQ_INT(ddo__dev_copy_h2d(dev, buf + 60 * 1024, src[0], 8192, s), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_device_error(dev), "is not mapped device memory");
    T_EQ_INT(ddo__dev_stream_destroy(dev, s), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, buf), 0);
    check_usage_zero(dev);
    ddo_device_destroy(dev);
}

/* Timed events: the time between two completions, busy until both completed. */
static void test_event_elapsed(void)
{
    ddo_device *dev = open_cpu(256 * MIB);
    T_REQUIRE(dev != NULL);
    void *s = NULL, *a = NULL, *b = NULL;
    uint64_t buf = 0;
    T_EQ_INT(ddo__dev_stream_create(dev, 1, &s), 0);
    T_EQ_INT(ddo__dev_event_create_timed(dev, &a), 0);
    T_EQ_INT(ddo__dev_event_create_timed(dev, &b), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, 4 * MIB, &buf), 0);
    unsigned char *src = calloc(1, 4 * MIB);
    T_REQUIRE(src != NULL);
    double sec = -1.0;
    T_EQ_INT(ddo__dev_event_elapsed(dev, a, b, &sec), DDO_E_INVALID_ARGUMENT); /* never recorded */
    T_EQ_INT(ddo__device_cpu_throttle(dev, 100e6, 0), 0); /* 4 MiB take ~42 ms */
    T_EQ_INT(ddo__dev_event_record(dev, a, s), 0);
    T_EQ_INT(ddo__dev_copy_h2d(dev, buf, src, 4 * MIB, s), 0);
    T_EQ_INT(ddo__dev_event_record(dev, b, s), 0);
    T_EQ_INT(ddo__dev_event_elapsed(dev, a, b, &sec), DDO_E_BUSY);
    T_EQ_INT(ddo__dev_event_synchronize(dev, b), 0);
    T_EQ_INT(ddo__dev_event_elapsed(dev, a, b, &sec), 0);
    T_CHECK_MSG(sec > 0.030 && sec < 2.0, "%.4f s for a ~42 ms copy", sec);
    T_EQ_INT(ddo__dev_event_elapsed(dev, a, NULL, &sec), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_event_destroy(dev, a), 0);
    T_EQ_INT(ddo__dev_event_destroy(dev, b), 0);
    T_EQ_INT(ddo__dev_stream_destroy(dev, s), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, buf), 0);
    free(src);
    check_usage_zero(dev);
    ddo_device_destroy(dev);
}

static void test_events(void)
{
    ddo_device *dev = open_cpu(256 * MIB);
    T_REQUIRE(dev != NULL);
    void *s = NULL, *e = NULL;
    uint64_t buf = 0;
    T_EQ_INT(ddo__dev_stream_create(dev, 1, &s), 0);
    T_EQ_INT(ddo__dev_event_create(dev, &e), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, 4 * MIB, &buf), 0);
    unsigned char *src = malloc(4 * MIB);
    T_REQUIRE(src != NULL);
    memset(src, 0xA5, 4 * MIB);
    /* An event never recorded is complete. */
    T_EQ_INT(ddo__dev_event_query(dev, e), 0);

    T_EQ_INT(ddo__device_cpu_throttle(dev, 100e6, 0), 0); /* 4 MiB take ~42 ms */
    T_EQ_INT(ddo__dev_copy_h2d(dev, buf, src, 4 * MIB, s), 0);
    T_EQ_INT(ddo__dev_event_record(dev, e, s), 0);
    T_EQ_INT(ddo__dev_event_query(dev, e), DDO_E_BUSY);
    T_EQ_INT(ddo__dev_event_synchronize(dev, e), 0);
    T_EQ_INT(ddo__dev_event_query(dev, e), 0);
    const unsigned char *d = (const unsigned char *)(uintptr_t)buf;
    T_EQ_INT(d[0], 0xA5);
    T_EQ_INT(d[4 * MIB - 1], 0xA5);

    /* Re-recording refers to the latest record. */
    memset(src, 0x3C, 4 * MIB);
    T_EQ_INT(ddo__dev_copy_h2d(dev, buf, src, 4 * MIB, s), 0);
    T_EQ_INT(ddo__dev_event_record(dev, e, s), 0);
    T_EQ_INT(ddo__dev_event_query(dev, e), DDO_E_BUSY);
    T_EQ_INT(ddo__dev_event_synchronize(dev, e), 0);
    T_EQ_INT(d[4 * MIB - 1], 0x3C);

    /* Destroying an event with a pending record is allowed; the marker still runs. */
    T_EQ_INT(ddo__dev_copy_h2d(dev, buf, src, 4 * MIB, s), 0);
    T_EQ_INT(ddo__dev_event_record(dev, e, s), 0);
    T_EQ_INT(ddo__dev_event_destroy(dev, e), 0);
    T_EQ_INT(ddo__dev_event_query(dev, e), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_stream_synchronize(dev, s), 0);

    T_EQ_INT(ddo__dev_stream_destroy(dev, s), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, buf), 0);
    free(src);
    check_usage_zero(dev);
    ddo_device_destroy(dev);
}

typedef struct probe {
    const unsigned char *dst;
    int seen;
    uint64_t at_ns;
    int order[8];
    int n;
} probe;

static void look(void *user)
{
    probe *p = user;
    p->seen = p->dst[0];
    p->at_ns = ddo__now_ns();
}

static void test_stream_wait_event(void)
{
    ddo_device *dev = open_cpu(256 * MIB);
    T_REQUIRE(dev != NULL);
    void *a = NULL, *b = NULL, *e = NULL;
    uint64_t buf = 0;
    T_EQ_INT(ddo__dev_stream_create(dev, 1, &a), 0);
    T_EQ_INT(ddo__dev_stream_create(dev, 0, &b), 0);
    T_EQ_INT(ddo__dev_event_create(dev, &e), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, 8 * MIB, &buf), 0);
    unsigned char *src = malloc(8 * MIB);
    T_REQUIRE(src != NULL);
    memset(src, 0x77, 8 * MIB);
    T_EQ_INT(ddo__device_cpu_throttle(dev, 200e6, 0), 0); /* 8 MiB take ~42 ms */

    probe p = { (const unsigned char *)(uintptr_t)buf, -1, 0, { 0 }, 0 };
    uint64_t t0 = ddo__now_ns();
    T_EQ_INT(ddo__dev_copy_h2d(dev, buf, src, 8 * MIB, a), 0);
    T_EQ_INT(ddo__dev_event_record(dev, e, a), 0);
    T_EQ_INT(ddo__dev_stream_wait_event(dev, b, e), 0);
    T_EQ_INT(ddo__dev_host_fn(dev, b, look, &p), 0);
    T_EQ_INT(ddo__dev_stream_synchronize(dev, b), 0);
    T_EQ_INT(p.seen, 0x77);
    T_CHECK_MSG(p.at_ns - t0 >= 35000000u, "b ran after %.1f ms", (double)(p.at_ns - t0) / 1e6);

    /* A copy queued behind a wait starts when the wait ends: two 8 MiB copies, ~84 ms. */
    T_EQ_INT(ddo__dev_stream_synchronize(dev, a), 0);
    t0 = ddo__now_ns();
    T_EQ_INT(ddo__dev_copy_h2d(dev, buf, src, 8 * MIB, a), 0);
    T_EQ_INT(ddo__dev_event_record(dev, e, a), 0);
    T_EQ_INT(ddo__dev_stream_wait_event(dev, b, e), 0);
    T_EQ_INT(ddo__dev_copy_h2d(dev, buf, src, 8 * MIB, b), 0);
    T_EQ_INT(ddo__dev_stream_synchronize(dev, b), 0);
    double ms = (double)(ddo__now_ns() - t0) / 1e6;
    T_CHECK_MSG(ms >= 75.0, "copy after wait done after %.1f ms", ms);

    T_EQ_INT(ddo__dev_event_destroy(dev, e), 0);
    T_EQ_INT(ddo__dev_stream_destroy(dev, a), 0);
    T_EQ_INT(ddo__dev_stream_destroy(dev, b), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, buf), 0);
    free(src);
    check_usage_zero(dev);
    ddo_device_destroy(dev);
}

typedef struct step {
    probe *p;
    int id;
} step;

static void note(void *user)
{
    step *s = user;
    s->p->order[s->p->n++] = s->id;
    if (s->id == 2)
        s->p->seen = s->p->dst[0];
}

static void test_host_fn_order(void)
{
    ddo_device *dev = open_cpu(256 * MIB);
    T_REQUIRE(dev != NULL);
    void *s = NULL;
    uint64_t buf = 0;
    T_EQ_INT(ddo__dev_stream_create(dev, 0, &s), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, MIB, &buf), 0);
    static unsigned char src[MIB];
    memset(src, 9, sizeof(src));
    T_EQ_INT(ddo__device_cpu_throttle(dev, 100e6, 0), 0);
    probe p = { (const unsigned char *)(uintptr_t)buf, -1, 0, { 0 }, 0 };
    step st[4] = { { &p, 1 }, { &p, 2 }, { &p, 3 }, { &p, 4 } };
    T_EQ_INT(ddo__dev_host_fn(dev, s, note, &st[0]), 0);
    T_EQ_INT(ddo__dev_copy_h2d(dev, buf, src, MIB, s), 0);
    T_EQ_INT(ddo__dev_host_fn(dev, s, note, &st[1]), 0);
    T_EQ_INT(ddo__dev_host_fn(dev, s, note, &st[2]), 0);
    T_EQ_INT(ddo__dev_host_fn(dev, s, note, &st[3]), 0);
    T_EQ_INT(ddo__dev_stream_synchronize(dev, s), 0);
    T_EQ_INT(p.n, 4);
    for (int i = 0; i < 4; i++)
        T_EQ_INT(p.order[i], i + 1);
    T_EQ_INT(p.seen, 9); /* the function after the copy saw its bytes */
    T_EQ_INT(ddo__dev_stream_destroy(dev, s), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, buf), 0);
    ddo_device_destroy(dev);
}

static double ms_since(uint64_t t0)
{
    return (double)(ddo__now_ns() - t0) / 1e6;
}

static void test_throttle_timing(void)
{
    ddo_cpu_options o_cpu = DDO_CPU_OPTIONS_INIT;
    o_cpu.bytes_per_s = 1e9;
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cpu = &o_cpu;
    ddo_device *dev = NULL;
    T_EQ_INT(ddo_device_create("cpu", &o, &dev), 0);
    T_REQUIRE(dev != NULL);
    ddo_device_caps caps;
    T_EQ_INT(ddo_device_caps_get(dev, &caps), 0);
    T_NEAR(caps.bus_bytes_per_s, 1e9, 0.5);
    void *s = NULL;
    uint64_t buf = 0;
    T_EQ_INT(ddo__dev_stream_create(dev, 1, &s), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, 64 * MIB, &buf), 0);
    unsigned char *src = calloc(1, 64 * MIB);
    T_REQUIRE(src != NULL);

    /* 64 MiB at 1 GB/s: at least ~60 ms (lower bound only). */
    uint64_t t0 = ddo__now_ns();
    T_EQ_INT(ddo__dev_copy_h2d(dev, buf, src, 64 * MIB, s), 0);
    T_EQ_INT(ddo__dev_stream_synchronize(dev, s), 0);
    double ms = ms_since(t0);
    T_CHECK_MSG(ms >= 60.0, "64 MiB at 1 GB/s took %.1f ms", ms);

    /* Four 16 MiB copies back to back take as long as one 64 MiB copy. */
    t0 = ddo__now_ns();
    for (int i = 0; i < 4; i++)
        T_EQ_INT(ddo__dev_copy_h2d(dev, buf + (uint64_t)i * 16 * MIB, src, 16 * MIB, s), 0);
    T_EQ_INT(ddo__dev_stream_synchronize(dev, s), 0);
    ms = ms_since(t0);
    T_CHECK_MSG(ms >= 60.0, "4 x 16 MiB at 1 GB/s took %.1f ms", ms);

    /* Latency alone: ten small copies at 5 ms each. */
    T_EQ_INT(ddo__device_cpu_throttle(dev, 0, 5000000), 0);
    t0 = ddo__now_ns();
    for (int i = 0; i < 10; i++)
        T_EQ_INT(ddo__dev_copy_h2d(dev, buf, src, 4096, s), 0);
    T_EQ_INT(ddo__dev_stream_synchronize(dev, s), 0);
    ms = ms_since(t0);
    T_CHECK_MSG(ms >= 48.0, "ten copies at 5 ms latency took %.1f ms", ms);

    /* Throttle off: the copy runs at memcpy speed (no bound asserted). */
    T_EQ_INT(ddo__device_cpu_throttle(dev, 0, 0), 0);
    T_EQ_INT(ddo__dev_copy_h2d(dev, buf, src, 64 * MIB, s), 0);
    T_EQ_INT(ddo__dev_stream_synchronize(dev, s), 0);
    T_EQ_INT(ddo__device_cpu_throttle(dev, -1, 0), DDO_E_INVALID_ARGUMENT);

    ddo__devop_stats st[DDO__OP_COUNT];
    ddo__device_stats(dev, st);
    T_EQ_U64(st[DDO__OP_COPY_H2D].calls, 16);
    T_EQ_U64(st[DDO__OP_COPY_H2D].bytes, 3 * 64 * MIB + 10 * 4096);
    T_EQ_U64(st[DDO__OP_COPY_H2D].failures, 0);

    T_EQ_INT(ddo__dev_stream_destroy(dev, s), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, buf), 0);
    free(src);
    ddo_device_destroy(dev);
}

static void test_register_rules(void)
{
    ddo_device *dev = open_cpu(256 * MIB);
    T_REQUIRE(dev != NULL);
    char *buf = malloc(MIB);
    T_REQUIRE(buf != NULL);
    T_EQ_INT(ddo__dev_host_register(dev, buf, MIB / 2), 0);
    T_EQ_INT(ddo__dev_host_register(dev, buf + MIB / 4, MIB / 2), DDO_E_DEVICE);
    T_CONTAINS(ddo_device_error(dev), "overlaps the registered range");
    T_EQ_INT(ddo__dev_host_register(dev, buf, 16), DDO_E_DEVICE);
    T_EQ_INT(ddo__dev_host_register(dev, buf + MIB / 2, MIB / 2), 0); /* adjacent is fine */
    ddo__device_usage_t u;
    ddo__device_usage(dev, &u);
    T_EQ_U64(u.registered_bytes, MIB);
    T_EQ_INT(ddo__dev_host_unregister(dev, buf + 4096), DDO_E_DEVICE);
    T_CONTAINS(ddo_device_error(dev), "is not the start of a registered range");
    T_EQ_INT(ddo__dev_host_unregister(dev, buf), 0);
    T_EQ_INT(ddo__dev_host_unregister(dev, buf), DDO_E_DEVICE);
    T_EQ_INT(ddo__dev_host_unregister(dev, buf + MIB / 2), 0);
    T_EQ_INT(ddo__dev_host_register(dev, NULL, 16), DDO_E_INVALID_ARGUMENT);

    /* Pinned allocations: page aligned, tracked, freed once. */
    void *pin = NULL;
    T_EQ_INT(ddo__dev_host_alloc(dev, 3 * 4096 + 1, &pin), 0);
    T_CHECK(pin != NULL && (uintptr_t)pin % 4096 == 0);
    memset(pin, 1, 3 * 4096 + 1);
    ddo__device_usage(dev, &u);
    T_EQ_U64(u.pinned_bytes, 3 * 4096 + 1);
    T_EQ_INT(ddo__dev_host_free(dev, pin), 0);
    T_EQ_INT(ddo__dev_host_free(dev, buf), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_host_free(dev, NULL), 0);
    free(buf);
    check_usage_zero(dev);
    ddo__device_usage(dev, &u);
    T_EQ_U64(u.registered_peak_bytes, MIB);
    ddo_device_destroy(dev);
}

static void test_d2h(void)
{
    ddo_device *dev = open_cpu(256 * MIB);
    T_REQUIRE(dev != NULL);
    void *s = NULL;
    uint64_t va = 0, h = 0;
    T_EQ_INT(ddo__dev_stream_create(dev, 1, &s), 0);
    T_EQ_INT(ddo__dev_va_reserve(dev, GRAN, &va), 0);
    T_EQ_INT(ddo__dev_phys_create(dev, GRAN, &h), 0);
    T_EQ_INT(ddo__dev_map(dev, va, GRAN, h, 0), 0);
    T_EQ_INT(ddo__dev_phys_release(dev, h), 0); /* released right after mapping */
    T_EQ_INT(ddo__dev_set_access(dev, va, GRAN), 0);
    const char msg[] = "through the copy stream";
    T_EQ_INT(ddo__dev_copy_h2d(dev, va + 1000, msg, sizeof(msg), s), 0);
    T_EQ_INT(ddo__dev_stream_synchronize(dev, s), 0);
    char back[sizeof(msg)];
    T_EQ_INT(ddo__dev_copy_d2h(dev, back, va + 1000, sizeof(back)), 0);
    T_EQ_STR(back, msg);
    /* Past the mapped range, or host memory: not device memory. */
    T_EQ_INT(ddo__dev_copy_d2h(dev, back, va + GRAN - 4, 8), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_copy_d2h(dev, back, (uintptr_t)msg, 8), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_device_error(dev), "is not mapped device memory");
    T_EQ_INT(ddo__dev_unmap(dev, va, GRAN), 0);
    T_EQ_INT(ddo__dev_copy_d2h(dev, back, va + 1000, 8), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_va_release(dev, va, GRAN), 0);
    T_EQ_INT(ddo__dev_stream_destroy(dev, s), 0);
    check_usage_zero(dev);
    ddo_device_destroy(dev);
}

static void test_destroy_waits(void)
{
    ddo_device *dev = open_cpu(256 * MIB);
    T_REQUIRE(dev != NULL);
    void *s = NULL;
    uint64_t buf = 0;
    T_EQ_INT(ddo__dev_stream_create(dev, 1, &s), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, 4 * MIB, &buf), 0);
    unsigned char *src = malloc(4 * MIB);
    T_REQUIRE(src != NULL);
    memset(src, 0x42, 4 * MIB);
    T_EQ_INT(ddo__device_cpu_throttle(dev, 200e6, 0), 0);
    for (int i = 0; i < 4; i++)
        T_EQ_INT(ddo__dev_copy_h2d(dev, buf + (uint64_t)i * MIB, src, MIB, s), 0);
    T_EQ_INT(ddo__dev_stream_destroy(dev, s), 0); /* waits for the four copies */
    const unsigned char *d = (const unsigned char *)(uintptr_t)buf;
    T_EQ_INT(d[4 * MIB - 1], 0x42);

    /* mem_free waits for a copy still writing the buffer. */
    T_EQ_INT(ddo__dev_stream_create(dev, 1, &s), 0);
    T_EQ_INT(ddo__dev_copy_h2d(dev, buf, src, 4 * MIB, s), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, buf), 0);
    free(src);

    /* Leaks at close are tolerated: ranges, handles, buffers, events, streams with work. */
    uint64_t va = 0, h = 0, h2 = 0, p = 0;
    void *e = NULL, *pin = NULL;
    T_EQ_INT(ddo__dev_va_reserve(dev, 2 * GRAN, &va), 0);
    T_EQ_INT(ddo__dev_phys_create(dev, GRAN, &h), 0);
    T_EQ_INT(ddo__dev_phys_create(dev, GRAN, &h2), 0);
    T_EQ_INT(ddo__dev_map(dev, va, GRAN, h, 0), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, MIB, &p), 0);
    T_EQ_INT(ddo__dev_event_create(dev, &e), 0);
    T_EQ_INT(ddo__dev_host_alloc(dev, 4096, &pin), 0);
    static char small[4096];
    T_EQ_INT(ddo__dev_host_register(dev, small, sizeof(small)), 0);
    T_EQ_INT(ddo__dev_copy_h2d(dev, va, small, sizeof(small), s), 0);
    T_EQ_INT(ddo__dev_event_record(dev, e, s), 0);
    ddo_device_destroy(dev);
}

/* Many threads using the wrappers at once (ThreadSanitizer runs this). */
typedef struct worker_arg {
    ddo_device *dev;
    int failures;
} worker_arg;

static void *hammer(void *user)
{
    worker_arg *w = user;
    ddo_device *dev = w->dev;
    void *s = NULL, *e = NULL;
    unsigned char src[8192];
    memset(src, 0x11, sizeof(src));
    if (ddo__dev_stream_create(dev, 1, &s) != 0 || ddo__dev_event_create(dev, &e) != 0) {
        w->failures++;
        return NULL;
    }
    for (int i = 0; i < 50; i++) {
        uint64_t va = 0, h = 0;
        unsigned char back[8192];
        int rc = ddo__dev_va_reserve(dev, GRAN, &va);
        rc = rc ? rc : ddo__dev_phys_create(dev, GRAN, &h);
        rc = rc ? rc : ddo__dev_map(dev, va, GRAN, h, 0);
        rc = rc ? rc : ddo__dev_phys_release(dev, h);
        rc = rc ? rc : ddo__dev_set_access(dev, va, GRAN);
        rc = rc ? rc : ddo__dev_copy_h2d(dev, va, src, sizeof(src), s);
        rc = rc ? rc : ddo__dev_event_record(dev, e, s);
        rc = rc ? rc : ddo__dev_event_synchronize(dev, e);
        rc = rc ? rc : ddo__dev_copy_d2h(dev, back, va, sizeof(back));
        if (rc == 0 && memcmp(back, src, sizeof(src)) != 0)
            rc = -1;
        rc = rc ? rc : ddo__dev_unmap(dev, va, GRAN);
        rc = rc ? rc : ddo__dev_va_release(dev, va, GRAN);
        if (rc != 0)
            w->failures++;
    }
    if (ddo__dev_event_destroy(dev, e) != 0 || ddo__dev_stream_destroy(dev, s) != 0)
        w->failures++;
    return NULL;
}

static void test_threads(void)
{
    ddo_device *dev = open_cpu(64 * MIB);
    T_REQUIRE(dev != NULL);
    enum { N = 4 };
    ddo__thread th[N];
    worker_arg w[N];
    for (int i = 0; i < N; i++) {
        w[i].dev = dev;
        w[i].failures = 0;
        T_EQ_INT(ddo__thread_create(&th[i], hammer, &w[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        ddo__thread_join(th[i]);
        T_EQ_INT(w[i].failures, 0);
    }
    ddo__devop_stats st[DDO__OP_COUNT];
    ddo__device_stats(dev, st);
    T_EQ_U64(st[DDO__OP_MAP].calls, N * 50);
    T_EQ_U64(st[DDO__OP_COPY_H2D].bytes, N * 50 * 8192);
    T_EQ_U64(st[DDO__OP_MAP].failures, 0);
    check_usage_zero(dev);
    ddo__device_stats_reset(dev);
    ddo__device_stats(dev, st);
    T_EQ_U64(st[DDO__OP_MAP].calls, 0);
    ddo_device_destroy(dev);
}

static void test_public_streams(void)
{
    ddo_device *dev = open_cpu(0);
    T_REQUIRE(dev != NULL);
    ddo_stream *s = NULL;
    T_EQ_INT(ddo_stream_create(dev, &s), 0);
    T_REQUIRE(s != NULL);
    T_CHECK(ddo_stream_native(s) == NULL);
    T_CHECK(ddo__stream_handle(s) != NULL);
    T_CHECK(ddo__stream_device(s) == dev);
    T_EQ_INT(ddo_stream_synchronize(s), 0);
    T_EQ_INT(ddo_stream_synchronize(NULL), DDO_E_INVALID_ARGUMENT);
    ddo_stream_destroy(s);
    ddo_stream_destroy(NULL);
    T_EQ_STR(ddo__devop_name(DDO__OP_STREAM_WAIT_EVENT), "stream_wait_event");
    T_EQ_STR(ddo__devop_name(DDO__OP_COUNT), "unknown");
    ddo_device_destroy(dev);
}

int main(void)
{
    T_RUN(test_spec);
    T_RUN(test_vmm_lifecycle);
    T_RUN(test_shared_bytes);
    T_RUN(test_unmap_rules);
    T_RUN(test_budget);
    T_RUN(test_copies_ordered);
    T_RUN(test_events);
    T_RUN(test_event_elapsed);
    T_RUN(test_stream_wait_event);
    T_RUN(test_host_fn_order);
    T_RUN(test_throttle_timing);
    T_RUN(test_register_rules);
    T_RUN(test_d2h);
    T_RUN(test_destroy_waits);
    T_RUN(test_threads);
    T_RUN(test_public_streams);
    return t_done();
}
