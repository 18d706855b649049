/*
 * test_multi.c - device sets on the cpu device (docs/multi-gpu.md): cpu:N instances with
 * their own memory, the device->device copy (peer throttle, checks), the plan's device set
 * (facts, JSON round trip, the store budget, refused sets) and donor mode: a session whose
 * streamed units live on a second cpu device and arrive by device->device copies, with the
 * bytes, stable addresses and device budgets of a single-device session, and its failures;
 * split mode: one session over three cpu devices, every device's bytes equal to the host's
 * after each acquire, the same copies on every rank, budgets per device, unload/reload and a
 * failing all-gather or upload on one rank; share mode: two sessions of one plan, one per
 * device (as one process per GPU runs them), each uploading its share of a unit, completed by
 * the host's all-gather (emulated here by copies between the devices).
 *
 * ctest-labels: unit backend threads
 */
#include "session_fx.h"

#include <time.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static ddo_device *cpu_dev(const char *spec, uint64_t bytes, double peer_bps)
{
    ddo_cpu_options c = DDO_CPU_OPTIONS_INIT;
    c.memory_bytes = bytes;
    c.granularity = FX_GRAN;
    c.peer_bytes_per_s = peer_bps;
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cpu = &c;
    ddo_device *d = NULL;
    if (ddo_device_create(spec, &o, &d) != 0)
        fprintf(stderr, "  device %s: %s\n", spec, ddo_last_error());
    return d;
}

/* cpu:0 and cpu:1 are separate instances: memory taken on one is not taken on the other. */
static void test_cpu_instances(void)
{
    ddo_device *a = cpu_dev("cpu:0", 64 * DDO_MIB, 0), *b = cpu_dev("cpu:1", 64 * DDO_MIB, 0);
    T_REQUIRE(a != NULL && b != NULL);
    ddo_device *bad = NULL;
    T_EQ_INT(ddo_device_create("cpu:x", NULL, &bad), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_device_create("cpu:", NULL, &bad), DDO_E_INVALID_ARGUMENT);
    uint64_t p = 0;
    T_REQUIRE(ddo__dev_mem_alloc(a, 48 * DDO_MIB, &p) == 0);
    uint64_t fa = 0, fb = 0, t = 0;
    T_REQUIRE(ddo__dev_mem_info(a, &fa, &t) == 0);
    T_REQUIRE(ddo__dev_mem_info(b, &fb, &t) == 0);
    T_EQ_U64(fa, 16 * DDO_MIB);
    T_EQ_U64(fb, 64 * DDO_MIB);
    uint64_t q = 0; /* b has room for what a has not */
    T_EQ_INT(ddo__dev_mem_alloc(a, 32 * DDO_MIB, &q), DDO_E_DEVICE_MEMORY);
    T_REQUIRE(ddo__dev_mem_alloc(b, 32 * DDO_MIB, &q) == 0);
    T_REQUIRE(ddo__dev_mem_free(a, p) == 0);
    T_REQUIRE(ddo__dev_mem_free(b, q) == 0);
    ddo_device_destroy(a);
    ddo_device_destroy(b);
}

/* copy_peer: bytes from one device's memory to the other's, at the destination's peer
 * throttle, checked on both sides. */
static void test_copy_peer(void)
{
    const size_t n = 4 * DDO_MIB;
    ddo_device *a = cpu_dev("cpu:0", 64 * DDO_MIB, 100e6), *b = cpu_dev("cpu:1", 64 * DDO_MIB, 0);
    T_REQUIRE(a != NULL && b != NULL);
    uint64_t dst = 0, src = 0;
    T_REQUIRE(ddo__dev_mem_alloc(a, n, &dst) == 0);
    T_REQUIRE(ddo__dev_mem_alloc(b, n, &src) == 0);
    for (size_t i = 0; i < n; i++)
        ((unsigned char *)(uintptr_t)src)[i] = (unsigned char)(i * 7 + 3);
    memset((void *)(uintptr_t)dst, 0, n);
    void *st = NULL;
    T_REQUIRE(ddo__dev_stream_create(a, 1, &st) == 0);
    uint64_t t0 = now_ns();
    T_REQUIRE(ddo__dev_copy_peer(a, dst, b, src, n, st) == 0);
    T_REQUIRE(ddo__dev_stream_synchronize(a, st) == 0);
    double s = (double)(now_ns() - t0) / 1e9;
    T_CHECK(s >= 0.9 * (double)n / 100e6); /* 4 MiB at 100 MB/s: >= 38 ms */
    T_CHECK(memcmp((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n) == 0);
    /* the source must be the source device's memory, the destination this one's */
    T_EQ_INT(ddo__dev_copy_peer(a, dst, b, dst, 4096, st), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_device_error(a), "source device");
    T_EQ_INT(ddo__dev_copy_peer(a, src, b, src, 4096, st), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_copy_peer(a, dst, NULL, src, 4096, st), DDO_E_INVALID_ARGUMENT);
    ddo__devop_stats stats[DDO__OP_COUNT];
    ddo__device_stats(a, stats);
    T_EQ_U64(stats[DDO__OP_COPY_PEER].bytes, n);
    T_REQUIRE(ddo__dev_stream_destroy(a, st) == 0);
    T_REQUIRE(ddo__dev_mem_free(a, dst) == 0);
    T_REQUIRE(ddo__dev_mem_free(b, src) == 0);
    ddo_device_destroy(a);
    ddo_device_destroy(b);
}

static const fx_opts base = { .blocks = 4, .slots = 2, .no_session = true };

/* Rebuilds f's plan with a device set; returns ddo_plan_build's code. */
static int replan(fx *f, const char *devices, const char *budget_gb, uint64_t store_free)
{
    fx_set(f, "devices", devices);
    if (budget_gb != NULL)
        fx_set(f, "store_device_budget_gb", budget_gb);
    ddo_plan_destroy(f->plan);
    f->plan = NULL;
    ddo_plan_inputs in = fx_cpu_inputs(f->o.device_bytes, 8 * DDO_GIB);
    in.store_free_bytes = store_free;
    in.peer_bytes_per_s = 123e9;
    in.bus_bytes_per_s = 1e9; /* the cost model on */
    in.flops_per_s = 1e12;
    return ddo_plan_build(f->ck, f->cfg, &in, &f->plan);
}

/* A streamed unit's predicted transfer time in f's plan. */
static double unit_transfer_s(fx *f)
{
    ddo_unit_info ui;
    memset(&ui, 0, sizeof(ui));
    T_CHECK(ddo_plan_unit(f->plan, fx_unit(f, 1), &ui) == 0);
    T_CHECK(!ui.resident && ui.bytes > 0);
    return ui.transfer_s;
}

static void test_plan_device_set(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &base) == 0);
    ddo_plan_info single = DDO_PLAN_INFO_INIT;
    T_REQUIRE(ddo_plan_info_get(f.plan, &single) == 0);
    T_EQ_INT(single.device_mode, DDO_DEVICE_MODE_SINGLE);
    T_EQ_U64(single.device_count, 1);
    char *json = NULL;
    T_REQUIRE(ddo_plan_to_json(f.plan, &json) == 0);
    T_CHECK(strstr(json, "device_set") == NULL); /* a single-device plan reads as before */
    ddo_free(json);

    T_REQUIRE(replan(&f, "", NULL, 0) == 0); /* one device: a unit moves at the bus rate */
    double over_bus = unit_transfer_s(&f);
    T_REQUIRE(replan(&f, "cpu:0,cpu:1", NULL, 0) == 0);
    ddo_plan_info info = DDO_PLAN_INFO_INIT;
    T_REQUIRE(ddo_plan_info_get(f.plan, &info) == 0);
    T_EQ_INT(info.device_mode, DDO_DEVICE_MODE_DONOR);
    /* donor: at the device->device rate (123 GB/s against the bus's 1 GB/s) */
    T_NEAR(unit_transfer_s(&f) * 123.0, over_bus, over_bus * 1e-9);
    T_EQ_U64(info.device_count, 2);
    T_CHECK(strcmp(info.devices, "cpu:0,cpu:1") == 0);
    T_NEAR(info.peer_bytes_per_s, 123e9, 1);
    uint64_t want = 0; /* every streamed unit at its slot layout */
    for (size_t u = 0; u < ddo_plan_unit_count(f.plan); u++) {
        ddo_unit_info ui;
        T_REQUIRE(ddo_plan_unit(f.plan, u, &ui) == 0);
        if (!ui.resident && ui.bytes > 0)
            want += ui.bytes;
    }
    T_CHECK(info.store_bytes >= want && want > 0);
    T_EQ_U64(info.store_limit, 0);

    /* the JSON keeps the set and reads back exactly */
    T_REQUIRE(ddo_plan_to_json(f.plan, &json) == 0);
    T_CONTAINS(json, "\"device_set\"");
    ddo_plan *back = NULL;
    T_REQUIRE(ddo_plan_from_json(json, &back) == 0);
    char *json2 = NULL;
    T_REQUIRE(ddo_plan_to_json(back, &json2) == 0);
    T_CHECK(strcmp(json, json2) == 0);
    ddo_plan_info binfo = DDO_PLAN_INFO_INIT;
    T_REQUIRE(ddo_plan_info_get(back, &binfo) == 0);
    T_EQ_INT(binfo.device_mode, DDO_DEVICE_MODE_DONOR);
    T_EQ_U64(binfo.store_bytes, info.store_bytes);
    ddo_free(json2);
    ddo_plan_destroy(back);
    ddo_free(json);

    /* the store budget: the option, else the store device's free memory */
    T_EQ_INT(replan(&f, "cpu:0,cpu:1", "0.0001", 0), DDO_E_BUDGET);
    T_CONTAINS(ddo_last_error(), "store_device_budget_gb");
    T_EQ_INT(replan(&f, "cpu:0,cpu:1", "0", info.store_bytes - 1), DDO_E_BUDGET);
    T_CONTAINS(ddo_last_error(), "free memory");
    T_EQ_INT(replan(&f, "cpu:0,cpu:1", "0", info.store_bytes), 0);
    /* sets it cannot use */
    T_EQ_INT(replan(&f, "cpu:0", NULL, 0), DDO_E_CONFIG);
    T_EQ_INT(replan(&f, "cpu:0,cpu:0", NULL, 0), DDO_E_CONFIG);
    T_EQ_INT(replan(&f, "cpu:0,cpu:1,cpu:2", NULL, 0), DDO_E_CONFIG);
    T_CONTAINS(ddo_last_error(), "two devices");
    fx_set(&f, "device_mode", "split");
    T_EQ_INT(replan(&f, "cpu:0,cpu:1,cpu:2", NULL, 0), 0);
    T_REQUIRE(ddo_plan_info_get(f.plan, &info) == 0);
    T_EQ_INT(info.device_mode, DDO_DEVICE_MODE_SPLIT);
    T_EQ_U64(info.device_count, 3);
    fx_destroy(&f);
}

/* The last "store" progress call: done and total bytes. */
static uint64_t store_progress[2];

static void on_progress(void *user, const char *phase, uint64_t done, uint64_t total)
{
    (void)user;
    if (strcmp(phase, "store") == 0) {
        store_progress[0] = done;
        store_progress[1] = total;
    }
}

/* A donor session on store; f's plan must be a donor plan. */
static int donor_session(fx *f, ddo_device *store)
{
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f->cfg;
    so.store_device = store;
    so.progress = on_progress;
    store_progress[0] = store_progress[1] = 0;
    f->rc = ddo_session_create(f->plan, f->ck, f->dev, &so, &f->s);
    return f->rc;
}

/* Every unit twice: the bytes, a stable address per tensor. */
static void run_steps(fx *f, void **first)
{
    for (int step = 0; step < 2; step++)
        for (int b = 0; b < f->o.blocks; b++) {
            size_t u = fx_unit(f, b);
            T_REQUIRE(ddo_session_acquire(f->s, u, f->stream) == 0);
            T_REQUIRE(ddo_stream_synchronize(f->stream) == 0);
            T_CHECK(fx_check_unit(f, u, 0) == 0);
            size_t n = 0;
            const size_t *ts = ddo_plan_unit_tensors(f->plan, u, &n);
            void *p = NULL;
            T_REQUIRE(ddo_session_tensor_address(f->s, ts[0], &p) == 0);
            if (first[b] == NULL)
                first[b] = p;
            T_CHECK(p == first[b]);
            T_REQUIRE(ddo_session_release(f->s, u, f->stream) == 0);
        }
}

static void donor_on(const char *mode, bool file)
{
    fx_opts o = base;
    o.mode = mode;
    o.file = file;
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    /* the single-device session's figures, for comparison */
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f.cfg;
    T_REQUIRE(ddo_session_create(f.plan, f.ck, f.dev, &so, &f.s) == 0);
    ddo__device_usage_t one;
    ddo__device_usage(f.dev, &one);
    ddo_session_destroy(f.s);
    f.s = NULL;

    T_REQUIRE(replan(&f, "cpu:0,cpu:1", NULL, 0) == 0);
    ddo_device *store = cpu_dev("cpu:1", 256 * DDO_MIB, 0);
    T_REQUIRE(store != NULL);
    T_REQUIRE(donor_session(&f, store) == 0);
    ddo_plan_info info = DDO_PLAN_INFO_INIT;
    T_REQUIRE(ddo_plan_info_get(f.plan, &info) == 0);
    ddo__device_usage_t su, cu;
    ddo__device_usage(store, &su);
    T_EQ_U64(su.device_bytes, info.store_bytes);   /* the store holds every streamed unit */
    T_EQ_U64(store_progress[0], info.store_bytes); /* the fill reported to its end */
    T_EQ_U64(store_progress[1], info.store_bytes);
    T_EQ_U64(su.pinned_bytes, 0); /* the fill window is given back */
    ddo__device_usage(f.dev, &cu);
    T_EQ_U64(cu.device_bytes, one.device_bytes); /* the computing device: as one device */
    if (file) {
        /* Read from a file, the streamed units live on the store only: no host copy retained,
         * registered or staged (one device retains and registers them). */
        T_CHECK(strcmp(ddo__plan_decision_get(f.plan, "retained_store"), "none_donor") == 0);
        ddo_plan_budgets bg;
        T_REQUIRE(ddo_plan_budgets_get(f.plan, &bg) == 0);
        T_EQ_U64(bg.retained_peak, 0);
        T_EQ_U64(bg.registered_peak, 0);
        T_EQ_U64(bg.staging_peak, 0);
        T_NEAR(fx_metric(&f, "retained_peak_bytes"), 0, 0);
        T_EQ_U64(cu.pinned_bytes, 0);
        T_CHECK(one.pinned_bytes > 0);
    }

    void *first[8] = { 0 };
    run_steps(&f, first);
    T_CHECK(fx_metric(&f, "bytes_from_store") > 0);
    /* every streamed byte came from the store (the residents from the checkpoint, at create) */
    T_NEAR(fx_metric(&f, "bytes_from_store"),
           fx_metric(&f, "copy_bytes") - fx_metric(&f, "bytes_resident_uploaded"), 0);
    T_NEAR(fx_metric(&f, "bytes_from_registered"), 0, 0);
    T_NEAR(fx_metric(&f, "bytes_staged_from_retained"), 0, 0);
    T_NEAR(fx_metric(&f, "bytes_staged_from_file"), 0, 0);
    T_NEAR(fx_metric(&f, "store_device_bytes"), (double)info.store_bytes, 0);
    T_NEAR(fx_metric(&f, "planned_store_bytes"), (double)info.store_bytes, 0);
    T_CHECK(fx_metric(&f, "device_weights_peak_bytes") <=
            fx_metric(&f, "planned_device_weights_bytes"));

    /* unload keeps the store; reload brings the same bytes back */
    T_REQUIRE(ddo_session_unload(f.s) == 0);
    ddo__device_usage(store, &su);
    T_EQ_U64(su.device_bytes, info.store_bytes);
    T_REQUIRE(ddo_session_reload(f.s) == 0);
    run_steps(&f, first);

    ddo_session_destroy(f.s);
    f.s = NULL;
    ddo__device_usage(store, &su);
    T_EQ_U64(su.device_bytes, 0);
    T_EQ_U64(su.pinned_bytes, 0);
    ddo_device_destroy(store);
    fx_destroy(&f);
}

static void test_donor_vmm_fast(void)
{
    donor_on("vmm_fast_runtime", false);
}

static void test_donor_linear_file(void)
{
    donor_on("linear_runtime", true);
}

static void test_donor_vmm_runtime(void)
{
    donor_on("vmm_runtime", true);
}

/* What a donor session refuses, and a failed device->device copy. */
static void test_donor_failures(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &base) == 0);
    ddo_device *store = cpu_dev("cpu:1", 256 * DDO_MIB, 0);
    T_REQUIRE(store != NULL);
    /* a store device without a donor plan */
    T_EQ_INT(donor_session(&f, store), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "donor plan");
    T_REQUIRE(replan(&f, "cpu:0,cpu:1", NULL, 0) == 0);
    /* a donor plan without its store device; the session's own device as its store */
    T_EQ_INT(donor_session(&f, NULL), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "store_device");
    T_EQ_INT(donor_session(&f, f.dev), DDO_E_INVALID_ARGUMENT);
    /* a store device too small: the error names it, nothing is left taken */
    ddo_device *tiny = cpu_dev("cpu:2", 128 * 1024, 0);
    T_REQUIRE(tiny != NULL);
    T_CHECK(donor_session(&f, tiny) != 0);
    T_CONTAINS(ddo_last_error(), "store device");
    ddo__device_usage_t su;
    ddo__device_usage(tiny, &su);
    T_EQ_U64(su.device_bytes, 0);
    T_EQ_U64(su.pinned_bytes, 0);
    ddo_device_destroy(tiny);

    /* a device->device copy that fails: the acquire fails naming the store, the next works */
    T_REQUIRE(donor_session(&f, store) == 0);
    size_t u = fx_unit(&f, 0);
    ddo__device_inject_fault(f.dev, DDO__OP_COPY_PEER, 1, false, DDO_E_DEVICE);
    T_EQ_INT(ddo_session_acquire(f.s, u, f.stream), DDO_E_DEVICE);
    T_CONTAINS(ddo_session_error(f.s), "store device");
    ddo__device_clear_faults(f.dev);
    T_EQ_INT(fx_use(&f, u), 0);
    ddo_session_destroy(f.s); /* before its store device */
    f.s = NULL;
    ddo_device_destroy(store);
    fx_destroy(&f);
}

/* ---- split mode: one session over N devices ---- */

#define SPLIT_N 3

/* A split session over f->dev and others[0..n); f's plan must be a split plan. */
static int split_session(fx *f, ddo_device *const *others, size_t n)
{
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f->cfg;
    so.split_devices = others;
    so.split_device_count = n;
    f->rc = ddo_session_create(f->plan, f->ck, f->dev, &so, &f->s);
    return f->rc;
}

/* Every tensor of unit (leased, or every resident one with unit SIZE_MAX) on device k against
 * the host's bytes; 0 or -1. */
static int split_check(fx *f, size_t k, size_t unit)
{
    int bad = 0;
    for (size_t i = 0; i < f->nt && bad == 0; i++) {
        size_t t = fx_tensor(f, f->names[i]);
        ddo_tensor_location loc;
        if (ddo_plan_tensor_location(f->plan, t, &loc) != 0)
            return -1;
        bool want = unit == SIZE_MAX ? loc.placement == DDO_PLACEMENT_RESIDENT
                                     : loc.placement == DDO_PLACEMENT_STREAMED && loc.unit == unit;
        if (!want)
            continue;
        void *p = NULL;
        if (ddo_session_device_tensor_address(f->s, k, t, &p) != 0 || p == NULL)
            return -1;
        /* read back by the device itself (its memory is not the host's on cuda) */
        unsigned char *buf = malloc(f->sizes[i]);
        if (buf == NULL || ddo_session_device_tensor_read(f->s, k, t, buf, f->sizes[i]) != 0 ||
            memcmp(buf, f->bytes[i], f->sizes[i]) != 0 ||
            memcmp((const void *)p, f->bytes[i], f->sizes[i]) != 0 /* cpu: host memory */) {
            fprintf(stderr, "  device %zu: tensor %s differs\n", k, f->names[i]);
            bad = -1;
        }
        free(buf);
    }
    return bad;
}

/* Every unit twice: after each acquire every device holds the host's bytes. */
static void split_steps(fx *f)
{
    for (size_t k = 0; k < SPLIT_N; k++)
        T_CHECK(split_check(f, k, SIZE_MAX) == 0);
    for (int step = 0; step < 2; step++)
        for (int b = 0; b < f->o.blocks; b++) {
            size_t u = fx_unit(f, b);
            T_REQUIRE(ddo_session_acquire(f->s, u, f->stream) == 0);
            T_REQUIRE(ddo_stream_synchronize(f->stream) == 0);
            for (size_t k = 0; k < SPLIT_N; k++)
                T_CHECK(split_check(f, k, u) == 0);
            T_REQUIRE(ddo_session_release(f->s, u, f->stream) == 0);
        }
}

/* A device's host->device bytes; *ops its copies and *gathers its host functions (on the
 * cpu device the other ranks' streams run one per all-gather and nothing else). */
static uint64_t h2d_bytes(ddo_device *d, uint64_t *ops, uint64_t *gathers)
{
    ddo__devop_stats st[DDO__OP_COUNT];
    ddo__device_stats(d, st);
    *ops = st[DDO__OP_COPY_H2D].calls;
    *gathers = st[DDO__OP_HOST_FN].calls;
    return st[DDO__OP_COPY_H2D].bytes;
}

/* A split session over three cpu devices on mode (from the file, or retained memory), with
 * blocks units in slots slots and the first device's copies throttled to bps (0: none). */
static void split_on(const char *mode, bool file, int blocks, int slots, double bps)
{
    fx_opts o = base;
    o.mode = mode;
    o.file = file;
    o.blocks = blocks;
    o.slots = slots;
    o.bytes_per_s = bps;
    o.cols = 2048; /* 512 KiB per weight: split in thirds, with a tail */
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f.cfg;
    T_REQUIRE(ddo_session_create(f.plan, f.ck, f.dev, &so, &f.s) == 0);
    ddo__device_usage_t one, u;
    ddo__device_usage(f.dev, &one);
    ddo_session_destroy(f.s);
    f.s = NULL;

    fx_set(&f, "device_mode", "split");
    T_REQUIRE(replan(&f, "cpu:0,cpu:1,cpu:2", NULL, 0) == 0);
    ddo_device *devs[SPLIT_N] = { f.dev, cpu_dev("cpu:1", DDO_GIB, 0),
                                  cpu_dev("cpu:2", DDO_GIB, 0) };
    T_REQUIRE(devs[1] != NULL && devs[2] != NULL);
    T_REQUIRE(split_session(&f, devs + 1, SPLIT_N - 1) == 0);
    ddo_plan_budgets b;
    T_REQUIRE(ddo_plan_budgets_get(f.plan, &b) == 0);
    uint64_t each = b.resident_bytes + (uint64_t)b.slot_count * b.slot_bytes;
    ddo__device_usage(f.dev, &u);
    T_EQ_U64(u.device_bytes, one.device_bytes); /* the first device: as one device */
    for (size_t k = 1; k < SPLIT_N; k++) {
        ddo__device_usage(devs[k], &u);
        T_EQ_U64(u.device_bytes, each); /* the same residents and slots on every device */
        T_CHECK(u.device_bytes <= b.device_weights_peak);
    }
    T_REQUIRE(ddo_session_synchronize(f.s) == 0);
    uint64_t ops1 = 0, ops2 = 0, g1 = 0, g2 = 0;
    uint64_t h1 = h2d_bytes(devs[1], &ops1, &g1), h2 = h2d_bytes(devs[2], &ops2, &g2);
    split_steps(&f);
    T_REQUIRE(ddo_session_synchronize(f.s) == 0); /* the prefetches issued: counted below */
    T_NEAR(fx_metric(&f, "split_devices"), SPLIT_N, 0);
    if (slots > 2) /* loads ahead of their acquires (the learned order's second pass) */
        T_CHECK(fx_metric(&f, "prefetch_issued") > 0);
    T_NEAR(fx_metric(&f, "split_device_bytes"), (double)each, 0);
    double streamed = fx_metric(&f, file ? "bytes_split_copied" : "bytes_split_uploaded");
    T_CHECK(streamed > 0);
    uint64_t n1 = 0, n2 = 0, m1 = 0, m2 = 0;
    h1 = h2d_bytes(devs[1], &n1, &m1) - h1;
    h2 = h2d_bytes(devs[2], &n2, &m2) - h2;
    if (!file) { /* each of the other devices read about 1/N of the streamed bytes from host */
        T_EQ_U64(m1 - g1, m2 - g2); /* the same all-gathers, in the same order, on each rank */
        T_CHECK(m1 > g1);
        T_CHECK(n1 > ops1 && n2 > ops2);
        T_CHECK((double)h1 < streamed / SPLIT_N + 4096.0 * (double)f.nt && h1 > 0);
        T_CHECK((double)h2 < streamed / SPLIT_N + 4096.0 * (double)f.nt && h2 > 0);
    } else { /* from the file: the first device reads, the others copy from it */
        T_EQ_U64(h1, 0);
        T_EQ_U64(h2, 0);
    }

    /* unload gives back every device's memory; reload brings the same bytes back */
    T_REQUIRE(ddo_session_unload(f.s) == 0);
    for (size_t k = 1; k < SPLIT_N; k++) {
        ddo__device_usage(devs[k], &u);
        T_EQ_U64(u.device_bytes, 0);
    }
    void *p = NULL;
    T_EQ_INT(ddo_session_device_tensor_address(f.s, 1, fx_tensor(&f, f.names[0]), &p), DDO_E_STATE);
    T_REQUIRE(ddo_session_reload(f.s) == 0);
    split_steps(&f);
    T_NEAR(fx_metric(&f, "split_device_peak_bytes"), (double)each, 0);
    T_EQ_INT(ddo_session_device_tensor_address(f.s, SPLIT_N, fx_tensor(&f, f.names[0]), &p),
             DDO_E_INVALID_ARGUMENT);
    unsigned char one_byte = 0;
    T_EQ_INT(ddo_session_device_tensor_read(f.s, 1, fx_tensor(&f, f.names[0]), &one_byte, 1),
             DDO_E_INVALID_ARGUMENT);

    ddo_session_destroy(f.s);
    f.s = NULL;
    for (size_t k = 1; k < SPLIT_N; k++) {
        ddo__device_usage(devs[k], &u);
        T_EQ_U64(u.device_bytes, 0);
        T_EQ_U64(u.pinned_bytes, 0);
        ddo_device_destroy(devs[k]);
    }
    fx_destroy(&f);
}

static void test_split_linear(void)
{
    split_on("linear_runtime", false, 4, 2, 0);
}

static void test_split_vmm_fast(void)
{
    split_on("vmm_fast_runtime", false, 4, 2, 0);
}

static void test_split_vmm_fast_file(void)
{
    split_on("vmm_fast_runtime", true, 4, 2, 0);
}

/* More units than slots with prefetch ahead, the first device slower than the others: the
 * ranks' timing differs, their uploads and all-gathers do not. */
static void test_split_prefetch_throttled(void)
{
    split_on("linear_runtime", false, 8, 3, 200e6);
}

/* f on mode (from the file, or host memory) with base's blocks and slots, 512 KiB per weight:
 * a split or a share crosses the tensors, with a tail. */
static int fx_wide(fx *f, const char *mode, bool file)
{
    fx_opts o = base;
    o.mode = mode;
    o.file = file;
    o.cols = 2048;
    return fx_create(f, &o);
}

/* What a split session refuses; a failed all-gather on one rank and a failed upload. */
static void test_split_failures(void)
{
    fx f;
    T_REQUIRE(fx_wide(&f, "linear_runtime", false) == 0);
    ddo_device *devs[SPLIT_N] = { f.dev, cpu_dev("cpu:1", DDO_GIB, 0),
                                  cpu_dev("cpu:2", DDO_GIB, 0) };
    T_REQUIRE(devs[1] != NULL && devs[2] != NULL);
    /* split devices without a split plan */
    T_EQ_INT(split_session(&f, devs + 1, 2), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "split plan");
    fx_set(&f, "device_mode", "split");
    T_REQUIRE(replan(&f, "cpu:0,cpu:1,cpu:2", NULL, 0) == 0);
    /* a split plan without (all of) its devices, or one named twice */
    T_EQ_INT(split_session(&f, NULL, 0), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "split_devices");
    T_EQ_INT(split_session(&f, devs + 1, 1), DDO_E_INVALID_ARGUMENT);
    ddo_device *twice[2] = { devs[1], devs[1] };
    T_EQ_INT(split_session(&f, twice, 2), DDO_E_INVALID_ARGUMENT);
    /* another device too small for the residents and slots: nothing is left taken */
    ddo_device *tiny = cpu_dev("cpu:3", 256 * 1024, 0);
    T_REQUIRE(tiny != NULL);
    ddo_device *small[2] = { devs[1], tiny };
    T_CHECK(split_session(&f, small, 2) != 0);
    T_CONTAINS(ddo_last_error(), "split device 2");
    ddo__device_usage_t u;
    ddo__device_usage(tiny, &u);
    T_EQ_U64(u.device_bytes, 0);
    ddo__device_usage(devs[1], &u);
    T_EQ_U64(u.device_bytes, 0);
    ddo_device_destroy(tiny);

    T_REQUIRE(split_session(&f, devs + 1, 2) == 0);
    /* the all-gather cannot be queued on rank 2: the acquire fails on every rank (no hang)
     * naming the split upload, and the next acquire completes the unit everywhere */
    size_t unit = fx_unit(&f, 0);
    ddo__device_inject_fault(devs[2], DDO__OP_HOST_FN, 1, false, DDO_E_DEVICE);
    T_EQ_INT(ddo_session_acquire(f.s, unit, f.stream), DDO_E_DEVICE);
    T_CONTAINS(ddo_session_error(f.s), "split upload");
    T_CONTAINS(ddo_session_error(f.s), "rank 2");
    ddo__device_clear_faults(devs[2]);
    T_REQUIRE(ddo_session_acquire(f.s, unit, f.stream) == 0);
    T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);
    for (size_t k = 0; k < SPLIT_N; k++)
        T_CHECK(split_check(&f, k, unit) == 0);
    T_REQUIRE(ddo_session_release(f.s, unit, f.stream) == 0);
    /* a host->device copy that fails on rank 1 */
    unit = fx_unit(&f, 1);
    ddo__device_inject_fault(devs[1], DDO__OP_COPY_H2D, 1, false, DDO_E_DEVICE);
    T_EQ_INT(ddo_session_acquire(f.s, unit, f.stream), DDO_E_DEVICE);
    T_CONTAINS(ddo_session_error(f.s), "split device 1");
    ddo__device_clear_faults(devs[1]);
    T_EQ_INT(ddo_session_acquire(f.s, unit, f.stream), 0);
    T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);
    for (size_t k = 0; k < SPLIT_N; k++)
        T_CHECK(split_check(&f, k, unit) == 0);
    T_REQUIRE(ddo_session_release(f.s, unit, f.stream) == 0);
    ddo_session_destroy(f.s);
    f.s = NULL;
    ddo_device_destroy(devs[1]);
    ddo_device_destroy(devs[2]);
    fx_destroy(&f);
}

/* ---- share mode: one session per device, the host's all-gather ---- */

#define SHARE_N 2

/* The device address of unit's view in session s (leased; cpu device: host memory). */
static unsigned char *share_view(fx *f, ddo_session *s, size_t unit)
{
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(f->plan, unit, &n);
    for (size_t k = 0; k < n; k++) {
        ddo_tensor_location loc;
        void *p = NULL;
        if (ddo_plan_tensor_location(f->plan, ts[k], &loc) == 0 &&
            loc.placement == DDO_PLACEMENT_STREAMED && loc.nbytes > 0 &&
            ddo_session_tensor_address(s, ts[k], &p) == 0)
            return (unsigned char *)p - loc.offset;
    }
    return NULL;
}

/* Every streamed tensor of unit in s against the host's bytes: the count that differ. */
static int share_differs(fx *f, ddo_session *s, size_t unit)
{
    int bad = 0;
    for (size_t i = 0; i < f->nt; i++) {
        size_t t = fx_tensor(f, f->names[i]);
        ddo_tensor_location loc;
        void *p = NULL;
        if (ddo_plan_tensor_location(f->plan, t, &loc) != 0 ||
            loc.placement != DDO_PLACEMENT_STREAMED || loc.unit != unit)
            continue;
        bad +=
            ddo_session_tensor_address(s, t, &p) != 0 || memcmp(p, f->bytes[i], f->sizes[i]) != 0;
    }
    return bad;
}

/* Two sessions of f's plan on two cpu devices, ranks 0 and 1 of share mode (mode, from the
 * file or retained memory): after each acquire the host's all-gather (here: each rank's share
 * copied into the other's view) completes every unit on both; each rank took in about half of
 * the streamed bytes from host memory (all of them from the file). */
static void share_on(const char *mode, bool file)
{
    fx f;
    T_REQUIRE(fx_wide(&f, mode, file) == 0);
    ddo_device *devs[SHARE_N] = { f.dev, cpu_dev("cpu:1", DDO_GIB, 0) };
    ddo_stream *streams[SHARE_N] = { f.stream, NULL };
    ddo_session *ss[SHARE_N] = { NULL, NULL };
    T_REQUIRE(devs[1] != NULL && ddo_stream_create(devs[1], &streams[1]) == 0);
    uint64_t before[SHARE_N], ops = 0, gathers = 0;
    for (size_t r = 0; r < SHARE_N; r++) {
        ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
        so.config = f.cfg;
        so.share_rank = r;
        so.share_count = SHARE_N;
        T_REQUIRE(ddo_session_create(f.plan, f.ck, devs[r], &so, &ss[r]) == 0);
        T_REQUIRE(ddo_session_synchronize(ss[r]) == 0);
        before[r] = h2d_bytes(devs[r], &ops, &gathers);
    }
    for (int step = 0; step < 2; step++)
        for (int b = 0; b < f.o.blocks; b++) {
            size_t u = fx_unit(&f, b);
            uint64_t share[SHARE_N] = { 0, 0 };
            unsigned char *view[SHARE_N];
            for (size_t r = 0; r < SHARE_N; r++) {
                int arc = ddo_session_acquire(ss[r], u, streams[r]);
                if (arc != 0)
                    fprintf(stderr, "  rank %zu: %s\n", r, ddo_session_error(ss[r]));
                T_REQUIRE(arc == 0);
                T_REQUIRE(ddo_stream_synchronize(streams[r]) == 0);
                T_REQUIRE(ddo_session_unit_share(ss[r], u, &share[r]) == 0);
                view[r] = share_view(&f, ss[r], u);
                T_REQUIRE(view[r] != NULL);
            }
            T_EQ_U64(share[0], share[1]); /* one plan: one share on every rank */
            T_CHECK(share[0] >= 64 * 1024 && share[0] % 4096 == 0);
            for (size_t r = 0; r < SHARE_N; r++) /* the all-gather */
                memcpy(view[1 - r] + r * share[0], view[r] + r * share[0], share[0]);
            for (size_t r = 0; r < SHARE_N; r++) {
                T_EQ_INT(share_differs(&f, ss[r], u), 0);
                T_REQUIRE(ddo_session_release(ss[r], u, streams[r]) == 0);
            }
        }
    double streamed = 0;
    for (size_t r = 0; r < SHARE_N; r++) {
        T_REQUIRE(ddo_session_synchronize(ss[r]) == 0);
        ddo_metrics *m = NULL;
        T_REQUIRE(ddo_session_metrics(ss[r], true, &m) == 0);
        double up = 0, left = 0, count = 0;
        T_REQUIRE(ddo_metrics_get(m, "bytes_share_uploaded", &up) == 0);
        T_REQUIRE(ddo_metrics_get(m, "bytes_share_left", &left) == 0);
        T_REQUIRE(ddo_metrics_get(m, "share_count", &count) == 0);
        ddo_metrics_destroy(m);
        T_NEAR(count, SHARE_N, 0);
        uint64_t h2d = h2d_bytes(devs[r], &ops, &gathers) - before[r];
        if (file) { /* nothing of the file's bytes is shared: whole on each rank */
            T_NEAR(up + left, 0, 0);
            T_CHECK(h2d > 0);
        } else { /* about half of what streamed, from host memory */
            streamed = up + left;
            T_CHECK(up > 0 && left > 0);
            T_NEAR((double)h2d, up, 0);
            T_CHECK(up < streamed / SHARE_N + 4096.0 * SHARE_N * 2 * f.o.blocks);
        }
    }
    for (size_t r = 0; r < SHARE_N; r++)
        ddo_session_destroy(ss[r]);
    ddo_stream_destroy(streams[1]);
    ddo_device_destroy(devs[1]);
    fx_destroy(&f);
}

static void test_share_linear(void)
{
    share_on("linear_runtime", false);
}

static void test_share_vmm_fast(void)
{
    share_on("vmm_fast_runtime", false);
}

static void test_share_vmm_fast_file(void)
{
    share_on("vmm_fast_runtime", true);
}

/* What share mode refuses; a session outside it has no shares. */
static void test_share_failures(void)
{
    fx f;
    T_REQUIRE(fx_wide(&f, "vmm_runtime", false) == 0);
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f.cfg;
    so.share_count = SHARE_N;
    so.share_rank = SHARE_N;
    T_EQ_INT(ddo_session_create(f.plan, f.ck, f.dev, &so, &f.s), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "share_rank 2 out of range");
    so.share_rank = 1;
    T_EQ_INT(ddo_session_create(f.plan, f.ck, f.dev, &so, &f.s), DDO_E_UNSUPPORTED);
    T_CONTAINS(ddo_last_error(), "share mode runs on linear_runtime and vmm_fast_runtime");
    fx_set(&f, "execution_mode", "linear_runtime");
    fx_set(&f, "device_mode", "split");
    T_REQUIRE(replan(&f, "cpu:0,cpu:1", NULL, 0) == 0);
    T_EQ_INT(ddo_session_create(f.plan, f.ck, f.dev, &so, &f.s), DDO_E_INVALID_ARGUMENT);
    T_CHECK(f.s == NULL);
    fx_set(&f, "devices", "");
    T_REQUIRE(replan(&f, "", NULL, 0) == 0);
    T_REQUIRE(ddo_session_create(f.plan, f.ck, f.dev, NULL, &f.s) == 0);
    uint64_t share = 1;
    size_t u = fx_unit(&f, 0);
    T_REQUIRE(ddo_session_unit_share(f.s, u, &share) == 0);
    T_EQ_U64(share, 0); /* not in share mode */
    T_EQ_INT(ddo_session_unit_share(f.s, ddo_plan_unit_count(f.plan), &share),
             DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_session_unit_share(f.s, u, NULL), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_session_unit_share(NULL, u, &share), DDO_E_INVALID_ARGUMENT);
    fx_destroy(&f);
}

int main(void)
{
    T_RUN(test_cpu_instances);
    T_RUN(test_copy_peer);
    T_RUN(test_plan_device_set);
    T_RUN(test_donor_vmm_fast);
    T_RUN(test_donor_linear_file);
    T_RUN(test_donor_vmm_runtime);
    T_RUN(test_donor_failures);
    T_RUN(test_split_linear);
    T_RUN(test_split_vmm_fast);
    T_RUN(test_split_vmm_fast_file);
    T_RUN(test_split_prefetch_throttled);
    T_RUN(test_split_failures);
    T_RUN(test_share_linear);
    T_RUN(test_share_vmm_fast);
    T_RUN(test_share_vmm_fast_file);
    T_RUN(test_share_failures);
    return t_done();
}
