/*
 * test_gpu_device.c - the cuda device on a real GPU: the VMM life cycle
 * through the wrappers (reserve -> create -> map -> set access; unmap ->
 * release -> free), a handle offset refused as the driver refuses it, plain buffers, host
 * registration from several threads, pinned allocation, events, stream
 * ordering and host callbacks, a host's driver entry points
 * (ddo__cuda_driver_proc), the error mapping, and a session on the
 * device: stable addresses across leases, random acquire orders checked
 * byte for byte against the source, reclaim under memory pressure, and
 * faults injected through the wrappers. Every test ends with the device's
 * usage gauges back to zero.
 *
 * Skips (77) when ddo_device_create("cuda:0") fails with DDO_E_NO_DEVICE.
 *
 * ctest-labels: gpu
 */
#include "ddo.h"
#include "device/device.h"
#include "os/sys.h"
#include "os/thread.h"
#include "t.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)

static ddo_device *g_dev;
static ddo_device_caps g_caps;
/* Session fixture overrides: the plan's granularity (0: the device's) and the mapped budget. */
static uint64_t g_plan_granularity;
static const char *g_budget_gb = "0.0625";

/* Deterministic bytes: byte j of buffer `salt`. */
static unsigned char pat(uint64_t salt, uint64_t j)
{
    uint64_t z = (salt + 1) * 0x9e3779b97f4a7c15ull + (j >> 3) * 0xbf58476d1ce4e5b9ull;
    z ^= z >> 31;
    return (unsigned char)(z >> (8 * (j & 7)));
}

static void fill(unsigned char *p, uint64_t n, uint64_t salt)
{
    for (uint64_t j = 0; j < n; j++)
        p[j] = pat(salt, j);
}

static void check_usage_zero(void)
{
    ddo__device_usage_t u;
    ddo__device_usage(g_dev, &u);
    T_EQ_U64(u.device_bytes, 0);
    T_EQ_U64(u.pinned_bytes, 0);
    T_EQ_U64(u.registered_bytes, 0);
    T_EQ_U64(u.va_bytes, 0);
    T_EQ_U64(u.mapped_bytes, 0);
}

/* Copies n bytes at device address src back and compares them with want. */
static int device_equals(uint64_t src, const unsigned char *want, size_t n)
{
    unsigned char *got = malloc(n);
    if (got == NULL)
        return 0;
    int ok = ddo__dev_copy_d2h(g_dev, got, src, n) == 0 && memcmp(got, want, n) == 0;
    free(got);
    return ok;
}

static void test_caps(void)
{
    T_CHECK(!g_caps.is_cpu);
    T_CHECK(g_caps.name[0] != '\0');
    T_CHECK(g_caps.total_bytes > 0);
    T_CHECK(g_caps.free_bytes > 0 && g_caps.free_bytes <= g_caps.total_bytes);
    T_CHECK(g_caps.granularity > 0 && (g_caps.granularity & (g_caps.granularity - 1)) == 0);
    T_CHECK(g_caps.vmm_supported);
    uint64_t f = 0, t = 0;
    T_EQ_INT(ddo__dev_mem_info(g_dev, &f, &t), 0);
    T_EQ_U64(t, g_caps.total_bytes);
    T_CHECK(f > 0 && f <= t);
    fprintf(stderr, "  %s: %.2f GiB, granularity %zu\n", g_caps.name,
            (double)g_caps.total_bytes / (1 << 30), g_caps.granularity);
}

/* reserve -> create -> map -> set access -> copy -> read back; unmap -> release -> free. */
static void test_vmm_life_cycle(void)
{
    if (!g_caps.vmm_supported)
        T_SKIP("no VMM support");
    uint64_t g = g_caps.granularity, size = 32 * g;
    unsigned char *src = NULL;
    void *stream = NULL;
    uint64_t va = 0, h = 0;
    T_REQUIRE(ddo__dev_host_alloc(g_dev, (size_t)size, (void **)&src) == 0);
    fill(src, size, 1);
    T_REQUIRE(ddo__dev_stream_create(g_dev, 1, &stream) == 0);
    T_EQ_INT(ddo__dev_va_reserve(g_dev, size, &va), 0);
    T_CHECK(va != 0 && va % g == 0);
    T_EQ_INT(ddo__dev_phys_create(g_dev, size, &h), 0);
    T_EQ_INT(ddo__dev_map(g_dev, va, size, h, 0), 0);
    T_EQ_INT(ddo__dev_set_access(g_dev, va, size), 0);
    /* the handle can be released right after mapping: the mapping keeps the memory */
    T_EQ_INT(ddo__dev_phys_release(g_dev, h), 0);
    for (uint64_t off = 0; off < size; off += 8 * MIB)
        T_EQ_INT(ddo__dev_copy_h2d(g_dev, va + off, src + off,
                                   (size_t)(size - off < 8 * MIB ? size - off : 8 * MIB), stream),
                 0);
    T_EQ_INT(ddo__dev_stream_synchronize(g_dev, stream), 0);
    T_CHECK(device_equals(va, src, (size_t)size));
    T_EQ_INT(ddo__dev_unmap(g_dev, va, size), 0);
    T_EQ_INT(ddo__dev_va_release(g_dev, va, size), 0);
    T_EQ_INT(ddo__dev_stream_destroy(g_dev, stream), 0);
    T_EQ_INT(ddo__dev_host_free(g_dev, src), 0);
    check_usage_zero();
}

/* A non-zero handle offset is refused by the driver (cuMemMap: "offset ... currently must be
 * zero"): DDO_E_UNSUPPORTED, as on the cpu device, and nothing is mapped. */
static void test_map_at_handle_offset(void)
{
    if (!g_caps.vmm_supported)
        T_SKIP("no VMM support");
    uint64_t g = g_caps.granularity, size = 4 * g, half = size / 2;
    uint64_t a = 0, b = 0, h = 0;
    T_REQUIRE(ddo__dev_va_reserve(g_dev, size, &a) == 0);
    T_REQUIRE(ddo__dev_va_reserve(g_dev, half, &b) == 0);
    T_REQUIRE(ddo__dev_phys_create(g_dev, size, &h) == 0);
    T_EQ_INT(ddo__dev_map(g_dev, a, size, h, 0), 0);
    T_EQ_INT(ddo__dev_set_access(g_dev, a, size), 0);
    T_EQ_INT(ddo__dev_map(g_dev, b, half, h, half), DDO_E_UNSUPPORTED);
    T_CONTAINS(ddo_device_error(g_dev), "cuMemMap");
    T_CONTAINS(ddo_device_error(g_dev), "CUDA_ERROR_NOT_SUPPORTED");
    ddo__device_usage_t u;
    ddo__device_usage(g_dev, &u);
    T_EQ_U64(u.mapped_bytes, size);
    T_EQ_INT(ddo__dev_unmap(g_dev, a, size), 0);
    T_EQ_INT(ddo__dev_phys_release(g_dev, h), 0);
    T_EQ_INT(ddo__dev_va_release(g_dev, b, half), 0);
    T_EQ_INT(ddo__dev_va_release(g_dev, a, size), 0);
    check_usage_zero();
}

static void test_plain_buffers_and_events(void)
{
    uint64_t size = 64 * MIB, p = 0;
    unsigned char *src = NULL;
    void *copy = NULL, *host = NULL, *ev = NULL;
    T_REQUIRE(ddo__dev_host_alloc(g_dev, (size_t)size, (void **)&src) == 0);
    fill(src, size, 3);
    T_REQUIRE(ddo__dev_stream_create(g_dev, 1, &copy) == 0);
    T_REQUIRE(ddo__dev_stream_create(g_dev, 0, &host) == 0);
    T_REQUIRE(ddo__dev_event_create(g_dev, &ev) == 0);
    void *t0 = NULL, *t1 = NULL; /* timed: the copies' device time */
    T_REQUIRE(ddo__dev_event_create_timed(g_dev, &t0) == 0);
    T_REQUIRE(ddo__dev_event_create_timed(g_dev, &t1) == 0);
    T_EQ_INT(ddo__dev_mem_alloc(g_dev, size, &p), 0);
    T_EQ_INT(ddo__dev_event_record(g_dev, t0, copy), 0);
    for (uint64_t off = 0; off < size; off += 16 * MIB)
        T_EQ_INT(ddo__dev_copy_h2d(g_dev, p + off, src + off, 16 * MIB, copy), 0);
    T_EQ_INT(ddo__dev_event_record(g_dev, ev, copy), 0);
    T_EQ_INT(ddo__dev_event_record(g_dev, t1, copy), 0);
    int q = ddo__dev_event_query(g_dev, ev);
    T_CHECK(q == 0 || q == DDO_E_BUSY);
    T_EQ_INT(ddo__dev_stream_wait_event(g_dev, host, ev), 0);
    T_EQ_INT(ddo__dev_stream_synchronize(g_dev, host), 0);
    /* the host stream waited for the copies: the event is complete */
    T_EQ_INT(ddo__dev_event_query(g_dev, ev), 0);
    T_EQ_INT(ddo__dev_event_synchronize(g_dev, ev), 0);
    T_EQ_INT(ddo__dev_event_synchronize(g_dev, t1), 0);
    double sec = 0.0;
    T_EQ_INT(ddo__dev_event_elapsed(g_dev, t0, t1, &sec), 0);
    /* 64 MiB over a bus of 1-100 GB/s */
    T_CHECK_MSG(sec > 0.0006 && sec < 0.07, "64 MiB copied in %.6f s", sec);
    T_EQ_INT(ddo__dev_event_destroy(g_dev, t0), 0);
    T_EQ_INT(ddo__dev_event_destroy(g_dev, t1), 0);
    T_CHECK(device_equals(p, src, (size_t)size));
    T_EQ_INT(ddo__dev_mem_free(g_dev, p), 0);
    T_EQ_INT(ddo__dev_event_destroy(g_dev, ev), 0);
    T_EQ_INT(ddo__dev_stream_destroy(g_dev, host), 0);
    T_EQ_INT(ddo__dev_stream_destroy(g_dev, copy), 0);
    T_EQ_INT(ddo__dev_host_free(g_dev, src), 0);
    check_usage_zero();
}

typedef struct reg_job {
    unsigned char *p;
    size_t n;
    int rc_register, rc_unregister;
    ddo_device *dev;
    int phase;
} reg_job;

static void *reg_thread(void *arg)
{
    reg_job *j = arg;
    if (j->phase == 0)
        j->rc_register = ddo__dev_host_register(j->dev, j->p, j->n);
    else
        j->rc_unregister = ddo__dev_host_unregister(j->dev, j->p);
    return NULL;
}

/* 64 MiB segments registered from four threads at once, copied from directly. */
static void test_host_register_threads(void)
{
    enum { N = 4 };
    size_t seg = (size_t)(64 * MIB);
    unsigned char *mem = NULL;
    T_REQUIRE((mem = ddo__os_aligned_alloc(1 << 21, N * seg)) != NULL);
    fill(mem, N * seg, 4);
    reg_job jobs[N];
    ddo__thread th[N];
    for (int phase = 0; phase < 2; phase++) {
        for (int i = 0; i < N; i++) {
            if (phase == 0)
                jobs[i] = (reg_job){ mem + (size_t)i * seg, seg, -1, -1, g_dev, 0 };
            jobs[i].phase = phase;
            ddo__thread_create(&th[i], reg_thread, &jobs[i]);
        }
        for (int i = 0; i < N; i++)
            ddo__thread_join(th[i]);
        if (phase == 0) {
            for (int i = 0; i < N; i++)
                T_EQ_INT(jobs[i].rc_register, 0);
            ddo__device_usage_t u;
            ddo__device_usage(g_dev, &u);
            T_EQ_U64(u.registered_bytes, N * seg);
            void *stream = NULL;
            uint64_t p = 0;
            T_REQUIRE(ddo__dev_stream_create(g_dev, 1, &stream) == 0);
            T_REQUIRE(ddo__dev_mem_alloc(g_dev, N * seg, &p) == 0);
            for (size_t off = 0; off < N * seg; off += 16 * MIB)
                T_EQ_INT(ddo__dev_copy_h2d(g_dev, p + off, mem + off, 16 * MIB, stream), 0);
            T_EQ_INT(ddo__dev_stream_synchronize(g_dev, stream), 0);
            T_CHECK(device_equals(p, mem, N * seg));
            T_EQ_INT(ddo__dev_mem_free(g_dev, p), 0);
            T_EQ_INT(ddo__dev_stream_destroy(g_dev, stream), 0);
        }
    }
    for (int i = 0; i < N; i++)
        T_EQ_INT(jobs[i].rc_unregister, 0);
    ddo__os_aligned_free(mem);
    check_usage_zero();
}

static void host_cb(void *user)
{
    *(volatile int *)user = 42;
}

static void test_host_fn(void)
{
    void *stream = NULL;
    volatile int flag = 0;
    T_REQUIRE(ddo__dev_stream_create(g_dev, 0, &stream) == 0);
    T_EQ_INT(ddo__dev_host_fn(g_dev, stream, host_cb, (void *)&flag), 0);
    T_EQ_INT(ddo__dev_stream_synchronize(g_dev, stream), 0);
    T_EQ_INT(flag, 42);
    T_EQ_INT(ddo__dev_stream_destroy(g_dev, stream), 0);
}

/* A host's driver entry point comes from the device's driver: the version it reports is the
 * device's, and an unknown entry point is refused. */
static void test_driver_proc(void)
{
    void *fn = NULL;
    const char *lib = NULL; /* the device's: libcuda.so.1 */
    T_REQUIRE(ddo__cuda_driver_proc(lib, "cuDriverGetVersion", 12000, &fn) == 0);
    T_REQUIRE(fn != NULL);
    unsigned (*get_version)(int *) = NULL; /* CUresult cuDriverGetVersion(int *) */
    memcpy(&get_version, &fn, sizeof(fn));
    int version = 0;
    T_EQ_INT((int)get_version(&version), 0);
    T_EQ_INT(version, g_caps.driver_version);
    void *none = &none;
    T_EQ_INT(ddo__cuda_driver_proc(lib, "cuNoSuchEntryPoint", 12000, &none), DDO_E_NO_DEVICE);
    T_CHECK(none == &none);
}

/* Driver failures come back as ddo codes with the call and the driver's error name. */
static void test_error_mapping(void)
{
    uint64_t g = g_caps.granularity;
    /* far more than the device has: the driver refuses */
    uint64_t huge = (g_caps.total_bytes * 4 + g - 1) / g * g, h = 0;
    int rc = ddo__dev_phys_create(g_dev, huge, &h);
    T_CHECK_MSG(rc == DDO_E_DEVICE_MEMORY || rc == DDO_E_DEVICE, "rc %d", rc);
    const char *msg = ddo__device_errbuf(g_dev)->msg;
    T_CHECK_MSG(strncmp(msg, "cuMemCreate: CUDA_ERROR_", 24) == 0, "got \"%s\"", msg);
    uint64_t p = 0;
    rc = ddo__dev_mem_alloc(g_dev, huge, &p);
    T_EQ_INT(rc, DDO_E_DEVICE_MEMORY);
    T_CONTAINS(ddo__device_errbuf(g_dev)->msg, "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY allocating ");
    /* not a multiple of the granularity: refused before the driver */
    T_EQ_INT(ddo__dev_phys_create(g_dev, g + 1, &h), DDO_E_INVALID_ARGUMENT);
    check_usage_zero();
}

/* ---- a session on the device ------------------------------------------------------ */

#define BLOCKS 6
#define NT     (2 * BLOCKS + 1)

typedef struct gfx {
    ddo_checkpoint *ck;
    ddo_config *cfg;
    ddo_plan *plan;
    ddo_session *s;
    ddo_stream *stream;
    char names[NT][48];
    uint64_t shapes[NT][2];
    unsigned char *bytes[NT];
    uint64_t sizes[NT];
} gfx;

static void gfx_free(gfx *f)
{
    ddo_session_destroy(f->s);
    ddo_stream_destroy(f->stream);
    ddo_plan_destroy(f->plan);
    ddo_config_destroy(f->cfg);
    ddo_checkpoint_destroy(f->ck);
    for (int t = 0; t < NT; t++)
        free(f->bytes[t]);
    memset(f, 0, sizeof(*f));
    check_usage_zero();
}

/* Six blocks of two F16 weights (2 MiB and 3 MiB) and one small resident tensor. */
static int gfx_create(gfx *f, const char *mode, bool create_session)
{
    memset(f, 0, sizeof(*f));
    ddo_tensor_desc d[NT];
    for (int t = 0; t < NT; t++) {
        if (t == 2 * BLOCKS) {
            snprintf(f->names[t], sizeof(f->names[t]), "norm_out.bias");
            f->shapes[t][0] = 1;
            f->shapes[t][1] = 64;
        } else {
            snprintf(f->names[t], sizeof(f->names[t]), "blocks.%d.%s.weight", t / 2,
                     t % 2 ? "ff" : "attn");
            f->shapes[t][0] = t % 2 ? 1536 : 1024;
            f->shapes[t][1] = 1024;
        }
        f->sizes[t] = f->shapes[t][0] * f->shapes[t][1] * 2;
        f->bytes[t] = malloc(f->sizes[t]);
        if (f->bytes[t] == NULL)
            return -1;
        fill(f->bytes[t], f->sizes[t], 100 + (uint64_t)t);
        d[t] = (ddo_tensor_desc){ f->names[t], DDO_DTYPE_F16, 2, f->shapes[t], f->bytes[t] };
    }
    if (ddo_checkpoint_create_from_memory(d, NT, &f->ck) != 0 || ddo_config_create(&f->cfg) != 0)
        return -1;
    const char *const kv[][2] = {
        { "execution_device", "cuda:0" },
        { "execution_slots", "3" },
        { "vmm_resident_weight_budget_gb", g_budget_gb },
        { "resident_module_budget_gb", "0" }, /* every unit streams: a budget alone fills */
        { "vmm_staging_buffer_gb", "0.0625" },
        { "vmm_source_cache_gb", "1" },
        { "pin_cpu_memory", "true" },
    };
    int rc = strcmp(mode, "linear_runtime") != 0 ? ddo_config_set(f->cfg, "backend", "vmm") : 0;
    if (rc == 0)
        rc = ddo_config_set(f->cfg, "execution_mode", mode);
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]) && rc == 0; i++)
        rc = ddo_config_set(f->cfg, kv[i][0], kv[i][1]);
    if (rc == 0)
        rc = ddo_config_validate(f->cfg);
    if (rc != 0) {
        fprintf(stderr, "  config: %s\n", ddo_last_error());
        return -1;
    }
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    in.device_total_bytes = g_caps.total_bytes;
    in.device_free_bytes = g_caps.free_bytes;
    in.device_granularity = g_plan_granularity > 0 ? g_plan_granularity : g_caps.granularity;
    in.device_vmm_supported = g_caps.vmm_supported;
    in.host_available_bytes = 8ull << 30;
    if (ddo_plan_build(f->ck, f->cfg, &in, &f->plan) != 0) {
        fprintf(stderr, "  plan: %s\n", ddo_last_error());
        return -1;
    }
    if (ddo_stream_create(g_dev, &f->stream) != 0)
        return -1;
    if (!create_session)
        return 0;
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f->cfg;
    if (ddo_session_create(f->plan, f->ck, g_dev, &so, &f->s) != 0) {
        fprintf(stderr, "  session: %s\n", ddo_last_error());
        return -1;
    }
    return 0;
}

/* Checks every tensor of unit u on the device against the source; records addresses. */
static int check_unit(gfx *f, size_t u, uint64_t *addr)
{
    size_t count = 0;
    const size_t *ts = ddo_plan_unit_tensors(f->plan, u, &count);
    if (ts == NULL || count == 0 || ddo_stream_synchronize(f->stream) != 0)
        return 0;
    for (size_t k = 0; k < count; k++) {
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(f->ck, ts[k]);
        void *p = NULL;
        if (ti == NULL || ddo_session_tensor_address(f->s, ts[k], &p) != 0 || p == NULL)
            return 0;
        int local = -1;
        for (int t = 0; t < NT; t++)
            if (strcmp(f->names[t], ti->name) == 0)
                local = t;
        if (local < 0 ||
            !device_equals((uint64_t)(uintptr_t)p, f->bytes[local], (size_t)f->sizes[local]))
            return 0;
        if (addr != NULL)
            addr[ts[k]] = (uint64_t)(uintptr_t)p;
    }
    return 1;
}

static void run_session_checks(const char *mode, bool stable)
{
    gfx f;
    if (gfx_create(&f, mode, true) != 0) {
        T_CHECK_MSG(0, "fixture for %s", mode);
        gfx_free(&f);
        return;
    }
    size_t units = ddo_plan_unit_count(f.plan);
    T_EQ_INT(units, BLOCKS);
    uint64_t first[NT], now[NT];
    memset(first, 0, sizeof(first));
    /* passes in order: bytes right, addresses stable on the VMM route */
    for (int pass = 0; pass < 3; pass++) {
        memset(now, 0, sizeof(now));
        for (size_t u = 0; u < units; u++) {
            T_REQUIRE(ddo_session_acquire(f.s, u, f.stream) == 0);
            T_CHECK_MSG(check_unit(&f, u, now), "%s pass %d unit %zu", mode, pass, u);
            T_REQUIRE(ddo_session_release(f.s, u, f.stream) == 0);
        }
        if (pass == 0)
            memcpy(first, now, sizeof(first));
        else if (stable)
            T_CHECK_MSG(memcmp(first, now, sizeof(now)) == 0, "%s: addresses moved", mode);
    }
    /* random orders, against the source bytes */
    uint64_t x = 12345;
    for (int i = 0; i < 120; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        size_t u = (size_t)(x >> 33) % units;
        T_REQUIRE(ddo_session_acquire(f.s, u, f.stream) == 0);
        T_CHECK_MSG(check_unit(&f, u, now), "%s random acquire %d unit %zu", mode, i, u);
        T_REQUIRE(ddo_session_release(f.s, u, f.stream) == 0);
    }
    if (stable)
        T_CHECK_MSG(memcmp(first, now, sizeof(now)) == 0, "%s: addresses moved", mode);
    /* two units leased at once */
    T_EQ_INT(ddo_session_acquire(f.s, 0, f.stream), 0);
    T_EQ_INT(ddo_session_acquire(f.s, units - 1, f.stream), 0);
    T_CHECK(check_unit(&f, 0, NULL) && check_unit(&f, units - 1, NULL));
    T_EQ_INT(ddo_session_release(f.s, units - 1, f.stream), 0);
    T_EQ_INT(ddo_session_release(f.s, 0, f.stream), 0);
    T_EQ_INT(ddo_session_synchronize(f.s), 0);
    /* every device byte taken for weights stayed inside the budget */
    ddo_metrics *m = NULL;
    double peak = -1;
    if (ddo_session_metrics(f.s, false, &m) == 0) {
        (void)ddo_metrics_get(m, "device_weights_peak_bytes", &peak);
        ddo_metrics_destroy(m);
    }
    ddo_plan_budgets b;
    T_REQUIRE(ddo_plan_budgets_get(f.plan, &b) == 0);
    T_CHECK_MSG(peak > 0 && peak <= (double)b.device_weights_limit, "%s: peak %.0f, limit %llu",
                mode, peak, (unsigned long long)b.device_weights_limit);
    gfx_free(&f);
}

static void test_session_vmm(void)
{
    run_session_checks("vmm_fast_runtime", true);
}

/* The protected route: every weight its own handle, mapped at offset 0 into its own range. */
static void test_session_vmm_runtime(void)
{
    run_session_checks("vmm_runtime", true);
}

/* vmm_runtime keeping to a budget of two units with three slots: a plan made for a 64 KiB
 * granularity (units of 5 MiB) on a device that maps in 2 MiB (units of 6 MiB), so loads
 * evict idle units and reuse their handles; bytes and addresses as before. */
static void test_session_vmm_runtime_evicting(void)
{
    if (g_caps.granularity != 2 * MIB)
        T_SKIP("needs a 2 MiB granularity");
    g_plan_granularity = 64 * 1024;
    g_budget_gb = "0.015625"; /* 16 MiB: three planned 5 MiB slots, two 6 MiB units */
    run_session_checks("vmm_runtime", true);
    g_plan_granularity = 0;
    g_budget_gb = "0.0625";
}

static void test_session_linear(void)
{
    run_session_checks("linear_runtime", false);
}

/* Reclaim while the device is nearly full: backing released, memory really returned to the
 * driver, the unit reloaded at the same address with the same bytes. */
static void test_reclaim_under_pressure(void)
{
    gfx f;
    if (gfx_create(&f, "vmm_fast_runtime", true) != 0) {
        T_CHECK_MSG(0, "fixture");
        gfx_free(&f);
        return;
    }
    size_t units = ddo_plan_unit_count(f.plan);
    uint64_t addr[NT], again[NT];
    memset(addr, 0, sizeof(addr));
    memset(again, 0, sizeof(again));
    for (size_t u = 0; u < units; u++) {
        T_REQUIRE(ddo_session_acquire(f.s, u, f.stream) == 0);
        T_CHECK(check_unit(&f, u, addr));
        T_REQUIRE(ddo_session_release(f.s, u, f.stream) == 0);
    }
    T_REQUIRE(ddo_session_synchronize(f.s) == 0);
    T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);

    /* pressure: leave about 512 MiB free (DDO_GPU_TEST_HEADROOM_MIB: more under a sanitizer) */
    uint64_t headroom = 512 * MIB;
    const char *hr = getenv("DDO_GPU_TEST_HEADROOM_MIB");
    if (hr != NULL && atoi(hr) > 0)
        headroom = (uint64_t)atoi(hr) * MIB;
    uint64_t hog[64];
    size_t nhog = 0;
    uint64_t free0 = 0, total = 0;
    T_REQUIRE(ddo__dev_mem_info(g_dev, &free0, &total) == 0);
    while (nhog < 64) {
        uint64_t fr = 0;
        if (ddo__dev_mem_info(g_dev, &fr, &total) != 0 || fr <= headroom + 256 * MIB)
            break;
        uint64_t take = fr - headroom;
        if (take > 16ull << 30)
            take = 16ull << 30;
        if (ddo__dev_mem_alloc(g_dev, take, &hog[nhog]) != 0)
            break;
        nhog++;
    }
    uint64_t before = 0, after = 0, released = 0;
    T_REQUIRE(ddo__dev_mem_info(g_dev, &before, &total) == 0);
    fprintf(stderr, "  pressure: %.0f MiB free\n", (double)before / (double)MIB);
    T_EQ_INT(ddo_session_reclaim(f.s, &released), 0);
    T_CHECK(released > 0 && released % g_caps.granularity == 0);
    T_REQUIRE(ddo__dev_mem_info(g_dev, &after, &total) == 0);
    T_CHECK_MSG(after + 4 * MIB >= before + released, "free %llu -> %llu, released %llu",
                (unsigned long long)before, (unsigned long long)after,
                (unsigned long long)released);
    /* every unit again (the reclaimed one re-created and re-uploaded) */
    for (size_t u = 0; u < units; u++) {
        T_REQUIRE(ddo_session_acquire(f.s, u, f.stream) == 0);
        T_CHECK(check_unit(&f, u, again));
        T_REQUIRE(ddo_session_release(f.s, u, f.stream) == 0);
    }
    T_CHECK(memcmp(addr, again, sizeof(addr)) == 0);
    for (size_t i = 0; i < nhog; i++)
        T_EQ_INT(ddo__dev_mem_free(g_dev, hog[i]), 0);
    T_EQ_INT(ddo_session_synchronize(f.s), 0);
    gfx_free(&f);
}

/* A fault injected into the wrappers surfaces as its code from acquire, and the session
 * recovers: the next acquire succeeds with the right bytes; destroy returns everything. */
static void fault_case(ddo__devop op, int code, bool reclaim_first)
{
    gfx f;
    if (gfx_create(&f, "vmm_fast_runtime", true) != 0) {
        T_CHECK_MSG(0, "fixture");
        gfx_free(&f);
        return;
    }
    size_t units = ddo_plan_unit_count(f.plan);
    /* the first pass loads every unit once; then the fault hits a reload */
    for (size_t u = 0; u < units; u++) {
        T_REQUIRE(ddo_session_acquire(f.s, u, f.stream) == 0);
        T_REQUIRE(ddo_session_release(f.s, u, f.stream) == 0);
    }
    T_REQUIRE(ddo_session_synchronize(f.s) == 0);
    if (reclaim_first) { /* handles are pooled: only a reclaimed slot creates one again */
        uint64_t released = 0;
        T_EQ_INT(ddo_session_reclaim(f.s, &released), 0);
        T_CHECK(released > 0);
    }
    ddo__device_inject_fault(g_dev, op, 1, true, code);
    int first_error = 0;
    for (size_t u = 0; u < units && first_error == 0; u++) {
        int rc = ddo_session_acquire(f.s, u, f.stream);
        if (rc == 0)
            T_EQ_INT(ddo_session_release(f.s, u, f.stream), 0);
        else
            first_error = rc;
    }
    ddo__device_clear_faults(g_dev);
    T_CHECK_MSG(first_error == code || first_error == DDO_E_UNSAFE, "%s: got %d (%s)",
                ddo__devop_name(op), first_error, ddo_session_error(f.s));
    /* the session keeps serving correct bytes for every unit it can still hold */
    int served = 0;
    for (size_t u = 0; u < units; u++) {
        int rc = ddo_session_acquire(f.s, u, f.stream);
        if (rc != 0)
            continue;
        served++;
        T_CHECK_MSG(check_unit(&f, u, NULL), "%s: unit %zu after the fault", ddo__devop_name(op),
                    u);
        T_EQ_INT(ddo_session_release(f.s, u, f.stream), 0);
    }
    T_CHECK(served > 0);
    ddo_session_synchronize(f.s);
    gfx_free(&f);
}

static void test_fault_copy(void)
{
    fault_case(DDO__OP_COPY_H2D, DDO_E_DEVICE, false);
}

static void test_fault_map(void)
{
    /* A slot keeps its handle mapped into the ranges of the units it held (aliases), so a
     * second pass may map nothing; a reclaimed slot's handle is new and must be mapped. */
    fault_case(DDO__OP_MAP, DDO_E_DEVICE_MEMORY, true);
}

static void test_fault_phys_create(void)
{
    fault_case(DDO__OP_PHYS_CREATE, DDO_E_DEVICE_MEMORY, true);
}

/* A failure while creating the session leaves nothing behind. */
static void test_fault_at_create(void)
{
    gfx f;
    if (gfx_create(&f, "vmm_fast_runtime", false) != 0) {
        T_CHECK_MSG(0, "fixture");
        gfx_free(&f);
        return;
    }
    static const ddo__devop ops[] = { DDO__OP_HOST_REGISTER, DDO__OP_VA_RESERVE, DDO__OP_MEM_ALLOC,
                                      DDO__OP_HOST_ALLOC };
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        ddo__device_inject_fault(g_dev, ops[i], 1, false, DDO_E_DEVICE);
        ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
        so.config = f.cfg;
        ddo_session *s = NULL;
        int rc = ddo_session_create(f.plan, f.ck, g_dev, &so, &s);
        ddo__device_clear_faults(g_dev);
        if (rc == 0) { /* the route did not use that operation at create */
            ddo_session_destroy(s);
        } else {
            T_CHECK(s == NULL);
        }
        check_usage_zero();
    }
    gfx_free(&f);
}

int main(void)
{
    int rc = ddo_device_create("cuda:0", NULL, &g_dev);
    if (rc == DDO_E_NO_DEVICE) {
        fprintf(stderr, "skipped: %s\n", ddo_last_error());
        return 77;
    }
    if (rc != 0 || ddo_device_caps_get(g_dev, &g_caps) != 0) {
        fprintf(stderr, "cuda:0: %s\n", ddo_last_error());
        return 1;
    }
    T_RUN(test_caps);
    T_RUN(test_vmm_life_cycle);
    T_RUN(test_map_at_handle_offset);
    T_RUN(test_plain_buffers_and_events);
    T_RUN(test_host_register_threads);
    T_RUN(test_host_fn);
    T_RUN(test_driver_proc);
    T_RUN(test_error_mapping);
    T_RUN(test_session_vmm);
    T_RUN(test_session_vmm_runtime);
    T_RUN(test_session_vmm_runtime_evicting);
    T_RUN(test_session_linear);
    T_RUN(test_reclaim_under_pressure);
    T_RUN(test_fault_copy);
    T_RUN(test_fault_map);
    T_RUN(test_fault_phys_create);
    T_RUN(test_fault_at_create);
    ddo_device_destroy(g_dev);
    return t_done();
}
