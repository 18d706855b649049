/*
 * test_session_views.c - what a framework host uses to see ddo's memory: borrowed streams
 * (the calling thread on cpu), session-long addresses, a unit's addresses, DLPack views (of a
 * tensor, of a whole unit) that keep the session alive, plan inputs from the device, struct sizes.
 * ctest-labels: unit threads
 */
#include "session_fx.h"

#include "host/setup.h"
#include "session/session.h"
#include "t.h"

/* DLPack v0's DLManagedTensor, as a host (torch) reads it. */
typedef struct {
    void *data;
    int32_t device_type, device_id;
    int32_t ndim;
    uint8_t code, bits;
    uint16_t lanes;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
    void *manager_ctx;
    void (*deleter)(void *self);
} dl_managed;

static const fx_opts vmm = { .blocks = 4, .latency_ns = 2000000 };
static const fx_opts linear = { .blocks = 4, .mode = "linear_runtime", .latency_ns = 2000000 };

static void test_calling_thread_stream_waits_for_the_upload(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &vmm) == 0 && f.rc == 0);
    ddo_stream *me = NULL;
    T_EQ_INT(ddo_stream_wrap(f.dev, NULL, &me), 0);
    void *native = (void *)&f;
    ddo_stream *bad = (ddo_stream *)&f;
    T_EQ_INT(ddo_stream_wrap(f.dev, native, &bad), DDO_E_INVALID_ARGUMENT);
    T_CHECK(bad == NULL);
    T_CONTAINS(ddo_last_error(), "pass NULL for the calling thread");
    for (int step = 0; step < 2; step++) {
        for (int b = 0; b < 4; b++) {
            size_t u = fx_unit(&f, b);
            /* no stream synchronize: returning from acquire means the bytes are there */
            T_REQUIRE(ddo_session_acquire(f.s, u, me) == 0);
            T_CHECK(fx_check_unit(&f, u, 0) == 0);
            T_REQUIRE(ddo_session_release(f.s, u, me) == 0);
        }
    }
    ddo_stream_destroy(me);
    fx_destroy(&f);
}

static void test_stable_and_unit_addresses(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &vmm) == 0 && f.rc == 0);
    size_t u = fx_unit(&f, 2), n = 0;
    const size_t *ts = ddo_plan_unit_tensors(f.plan, u, &n);
    T_REQUIRE(n == 2);
    void *stable[2] = { 0 };
    for (size_t k = 0; k < n; k++)
        T_EQ_INT(ddo_session_tensor_stable_address(f.s, ts[k], &stable[k]), 0);
    void *ptrs[2] = { 0 };
    size_t got = 0;
    T_EQ_INT(ddo_session_unit_addresses(f.s, u, ptrs, 1, &got), DDO_E_INVALID_ARGUMENT);
    T_EQ_U64(got, 2); /* the count, even when there is no room */
    for (int step = 0; step < 3; step++) {
        T_REQUIRE(ddo_session_acquire(f.s, u, f.stream) == 0);
        T_EQ_INT(ddo_session_unit_addresses(f.s, u, ptrs, 2, &got), 0);
        for (size_t k = 0; k < n; k++) {
            void *leased = NULL;
            T_EQ_INT(ddo_session_tensor_address(f.s, ts[k], &leased), 0);
            T_CHECK(leased == stable[k] && ptrs[k] == stable[k]);
        }
        T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);
        T_REQUIRE(ddo_session_release(f.s, u, f.stream) == 0);
        for (int b = 0; b < 4; b++) /* the others take the slots in between */
            if (b != 2)
                T_CHECK(fx_use(&f, fx_unit(&f, b)) == 0);
    }
    fx_destroy(&f);

    T_REQUIRE(fx_create(&f, &linear) == 0 && f.rc == 0);
    u = fx_unit(&f, 1);
    ts = ddo_plan_unit_tensors(f.plan, u, &n);
    void *p = NULL;
    T_EQ_INT(ddo_session_tensor_stable_address(f.s, ts[0], &p), DDO_E_UNSUPPORTED);
    T_CONTAINS(ddo_session_error(f.s), "valid only while its unit is leased");
    T_EQ_INT(ddo_session_unit_addresses(f.s, u, ptrs, 2, &got), DDO_E_STATE);
    T_REQUIRE(ddo_session_acquire(f.s, u, f.stream) == 0);
    T_EQ_INT(ddo_session_unit_addresses(f.s, u, ptrs, 2, &got), 0);
    T_EQ_INT(ddo_session_tensor_address(f.s, ts[1], &p), 0);
    T_CHECK(p == ptrs[1]);
    T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);
    T_REQUIRE(ddo_session_release(f.s, u, f.stream) == 0);
    fx_destroy(&f);
}

static void test_dlpack_views_keep_the_session(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &vmm) == 0 && f.rc == 0);
    size_t u = fx_unit(&f, 1), n = 0;
    const size_t *ts = ddo_plan_unit_tensors(f.plan, u, &n);
    dl_managed *v = NULL;
    T_EQ_INT(ddo_session_tensor_dlpack(f.s, ts[0], 0, (void **)&v), 0);
    T_REQUIRE(v != NULL);
    void *stable = NULL;
    ddo_session_tensor_stable_address(f.s, ts[0], &stable);
    T_CHECK(v->data == stable && v->device_type == 1 && v->device_id == 0);
    T_CHECK(v->code == 2 && v->bits == 32 && v->lanes == 1 && v->ndim == 2); /* F32 [rows, cols] */
    T_CHECK(v->shape[0] == FX_ROWS && v->shape[1] == FX_COLS && v->strides == NULL);
    dl_managed *b = NULL;
    T_EQ_INT(ddo_session_tensor_dlpack(f.s, ts[1], DDO_VIEW_BYTES, (void **)&b), 0);
    T_CHECK(b->code == 1 && b->bits == 8 && b->ndim == 1 &&
            b->shape[0] == (int64_t)((FX_ROWS + 1) * FX_COLS * 4));
    T_EQ_U64(ddo_session_view_count(f.s), 2);
    T_EQ_U64(ddo_session_tensor_view_count(f.s, ts[0]), 1);
    T_EQ_U64(ddo_session_tensor_view_count(f.s, ts[1]), 1);
    T_EQ_U64(ddo_session_tensor_view_count(f.s, (size_t)-1), 0);
    /* The host destroys the session while views live: it stays until the last one goes. */
    ddo_session *s = f.s;
    ddo_session_destroy(s);
    f.s = NULL;
    T_EQ_U64(ddo_session_view_count(s), 1); /* the handle is gone, two views hold it */
    T_CHECK(fx_device_held(&f) > 0);
    b->deleter(b);
    T_EQ_U64(ddo_session_tensor_view_count(s, ts[1]), 0);
    T_EQ_U64(ddo_session_tensor_view_count(s, ts[0]), 1);
    T_CHECK(fx_device_held(&f) > 0);
    v->deleter(v); /* the last reference: the session is freed here */
    T_EQ_U64(fx_device_held(&f), 0);
    fx_destroy(&f);
}

/* Checks unit u's unit-wide view against its tensors' addresses (leased) and counts. */
static void check_unit_view(fx *f, size_t u)
{
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(f->plan, u, &n);
    dl_managed *w = NULL;
    T_EQ_INT(ddo_session_unit_dlpack(f->s, u, (void **)&w), 0);
    T_REQUIRE(w != NULL);
    T_CHECK(w->code == 1 && w->bits == 8 && w->lanes == 1 && w->ndim == 1 && w->strides == NULL);
    T_CHECK(w->device_type == 1 && w->device_id == 0 && w->byte_offset == 0);
    uint64_t end = 0;
    for (size_t k = 0; k < n; k++) {
        ddo_tensor_location loc;
        T_REQUIRE(ddo_plan_tensor_location(f->plan, ts[k], &loc) == 0);
        void *p = NULL;
        T_EQ_INT(ddo_session_tensor_address(f->s, ts[k], &p), 0);
        T_CHECK((char *)p == (char *)w->data + loc.offset); /* a tensor at its unit offset */
        end = loc.offset + loc.nbytes > end ? loc.offset + loc.nbytes : end;
    }
    T_CHECK(w->shape[0] == (int64_t)end); /* to the end of its last tensor */
    T_EQ_U64(ddo_session_unit_view_count(f->s, u), 1);
    dl_managed *v = NULL; /* a tensor's own view counts for its unit too */
    T_EQ_INT(ddo_session_tensor_dlpack(f->s, ts[0], 0, (void **)&v), 0);
    T_EQ_U64(ddo_session_unit_view_count(f->s, u), 2);
    T_EQ_U64(ddo_session_view_count(f->s), 2);
    T_EQ_U64(ddo_session_unit_view_count(f->s, u == 0 ? 1 : 0), 0); /* another unit: none */
    v->deleter(v);
    T_EQ_U64(ddo_session_unit_view_count(f->s, u), 1);
    w->deleter(w);
    T_EQ_U64(ddo_session_unit_view_count(f->s, u), 0);
    T_EQ_U64(ddo_session_view_count(f->s), 0);
}

/* One view of a unit's bytes (what the binding cuts every tensor of the unit from): its
 * tensors at their offsets, counted per unit with the tensors' own views; refused where a
 * unit is not one range (vmm_runtime), not leased on linear, unloaded, or out of range. */
static void test_unit_dlpack_views(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &vmm) == 0 && f.rc == 0);
    size_t u = fx_unit(&f, 2);
    dl_managed *w = NULL;
    T_EQ_INT(ddo_session_unit_dlpack(f.s, ddo_plan_unit_count(f.plan), (void **)&w),
             DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_session_error(f.s), "out of range");
    T_EQ_INT(ddo_session_unit_dlpack(f.s, u, NULL), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_session_unit_dlpack(NULL, u, (void **)&w), DDO_E_INVALID_ARGUMENT);
    T_EQ_U64(ddo_session_unit_view_count(f.s, (size_t)-1), 0);
    T_EQ_U64(ddo_session_unit_view_count(NULL, u), 0);
    T_REQUIRE(ddo_session_acquire(f.s, u, f.stream) == 0);
    check_unit_view(&f, u);
    /* A live unit view keeps the session after its handle is destroyed. */
    T_EQ_INT(ddo_session_unit_dlpack(f.s, u, (void **)&w), 0);
    T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);
    T_REQUIRE(ddo_session_release(f.s, u, f.stream) == 0);
    ddo_session *s = f.s;
    ddo_session_destroy(s);
    f.s = NULL;
    T_EQ_U64(ddo_session_unit_view_count(s, u), 1);
    T_CHECK(fx_device_held(&f) > 0);
    w->deleter(w); /* the last reference: the session is freed here */
    T_EQ_U64(fx_device_held(&f), 0);
    fx_destroy(&f);

    T_REQUIRE(fx_create(&f, &linear) == 0 && f.rc == 0);
    u = fx_unit(&f, 1);
    T_EQ_INT(ddo_session_unit_dlpack(f.s, u, (void **)&w), DDO_E_STATE);
    T_CONTAINS(ddo_session_error(f.s), "not leased");
    T_REQUIRE(ddo_session_acquire(f.s, u, f.stream) == 0);
    check_unit_view(&f, u);
    T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);
    T_REQUIRE(ddo_session_release(f.s, u, f.stream) == 0);
    T_REQUIRE(ddo_session_unload(f.s) == 0);
    T_EQ_INT(ddo_session_unit_dlpack(f.s, u, (void **)&w), DDO_E_STATE);
    T_CONTAINS(ddo_session_error(f.s), "unloaded");
    fx_destroy(&f);

    fx_opts pw = { .blocks = 4, .mode = "vmm_runtime", .file = true };
    T_REQUIRE(fx_create(&f, &pw) == 0 && f.rc == 0);
    u = fx_unit(&f, 0);
    T_REQUIRE(ddo_session_acquire(f.s, u, f.stream) == 0);
    T_EQ_INT(ddo_session_unit_dlpack(f.s, u, (void **)&w), DDO_E_UNSUPPORTED);
    T_CONTAINS(ddo_session_error(f.s), "one by one");
    T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);
    T_REQUIRE(ddo_session_release(f.s, u, f.stream) == 0);
    fx_destroy(&f);
}

/* A host that edits device copies in place (a fused LoRA) learns from the load count whether a
 * copy is fresh from the host: a unit kept in its slot has the count it had, a reloaded one
 * a larger one; resident tensors count the resident uploads (create, every reload). */
static void test_tensor_loads_count_the_copies_from_the_host(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &linear) == 0 && f.rc == 0);
    size_t u = fx_unit(&f, 1), n = 0, head = fx_tensor(&f, "head.weight");
    const size_t *ts = ddo_plan_unit_tensors(f.plan, u, &n);
    T_REQUIRE(n == 2 && head != SIZE_MAX);
    ddo_tensor_location loc;
    T_REQUIRE(ddo_plan_tensor_location(f.plan, head, &loc) == 0);
    T_REQUIRE(loc.placement == DDO_PLACEMENT_RESIDENT);
    uint64_t r0 = 0, r1 = 0, a = 0, b = 0, c = 0;
    T_EQ_INT(ddo_session_tensor_loads(f.s, head, &r0), 0);
    T_EQ_U64(r0, 1); /* uploaded once, at create */
    T_CHECK(fx_use(&f, u) == 0);
    T_EQ_INT(ddo_session_tensor_loads(f.s, ts[0], &a), 0);
    T_CHECK(a >= 1);
    T_CHECK(fx_use(&f, u) == 0); /* still in its slot: no load */
    T_EQ_INT(ddo_session_tensor_loads(f.s, ts[1], &b), 0);
    T_EQ_U64(b, a);                      /* one count per unit: every tensor of it */
    for (int step = 0; step < 2; step++) /* the others take every slot */
        for (int k = 0; k < 4; k++)
            if (k != 1)
                T_CHECK(fx_use(&f, fx_unit(&f, k)) == 0);
    T_CHECK(fx_use(&f, u) == 0);
    T_EQ_INT(ddo_session_tensor_loads(f.s, ts[0], &c), 0);
    T_CHECK(c > b);
    T_REQUIRE(ddo_session_unload(f.s) == 0 && ddo_session_reload(f.s) == 0);
    T_EQ_INT(ddo_session_tensor_loads(f.s, head, &r1), 0);
    T_EQ_U64(r1, r0 + 1);
    T_EQ_INT(ddo_session_tensor_loads(f.s, head, NULL), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_session_tensor_loads(f.s, (size_t)-1, &a), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_session_error(f.s), "out of range");
    T_EQ_INT(ddo_session_tensor_loads(NULL, head, &a), DDO_E_INVALID_ARGUMENT);
    fx_destroy(&f);
}

static void test_plan_inputs_and_struct_sizes(void)
{
    ddo_cpu_options o_cpu = DDO_CPU_OPTIONS_INIT;
    o_cpu.memory_bytes = 3 * DDO_GIB;
    o_cpu.bytes_per_s = 5e9;
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cpu = &o_cpu;
    ddo_device *dev = NULL;
    T_REQUIRE(ddo_device_create("cpu", &o, &dev) == 0);
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    T_EQ_INT(ddo__plan_inputs_get(dev, &in), 0);
    T_EQ_U64(in.device_total_bytes, 3 * DDO_GIB);
    T_CHECK(in.device_is_cpu && in.device_vmm_supported && in.device_granularity > 0);
    T_CHECK(in.bus_bytes_per_s == 5e9 && in.host_available_bytes > 0);
    T_EQ_INT(ddo__plan_inputs_get(NULL, &in), DDO_E_INVALID_ARGUMENT);
    ddo_device_destroy(dev);
    T_EQ_U64(ddo_struct_size("ddo_tensor_desc"), sizeof(ddo_tensor_desc));
    T_EQ_U64(ddo_struct_size("ddo_session_options"), sizeof(ddo_session_options));
    T_EQ_U64(ddo_struct_size("ddo_plan_budgets"), sizeof(ddo_plan_budgets));
    T_EQ_U64(ddo_struct_size("no_such_struct"), 0);
    T_EQ_U64(ddo_struct_size(NULL), 0);
}

static void test_device_from_config(void)
{
    ddo_config *cfg = NULL;
    T_REQUIRE(ddo_config_create(&cfg) == 0);
    ddo_device *dev = NULL;
    char note[256];
    /* The default cuda:0 with no driver here falls back to cpu and says why. */
    ddo_cuda_options o_cuda = DDO_CUDA_OPTIONS_INIT;
    o_cuda.library_path = "/nonexistent/libcuda.so.1";
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cuda = &o_cuda;
    T_EQ_INT(ddo__device_create_from_config(cfg, &o, &dev, note, sizeof(note)), 0);
    ddo_device_caps caps;
    T_REQUIRE(dev != NULL && ddo_device_caps_get(dev, &caps) == 0);
    T_CHECK(caps.is_cpu);
    T_CONTAINS(note, "using the cpu device");
    ddo_device_destroy(dev);
    /* An explicit cuda is never replaced. */
    T_EQ_INT(ddo_config_set(cfg, "execution_device", "cuda:0"), 0);
    dev = (ddo_device *)cfg;
    T_EQ_INT(ddo__device_create_from_config(cfg, &o, &dev, note, sizeof(note)), DDO_E_NO_DEVICE);
    T_CHECK(dev == NULL && note[0] == '\0');
    /* An override wins over the environment; an API set does not. */
    const char *env[] = { "DDO_PIN_CPU_WORKERS=3", NULL };
    T_EQ_INT(ddo_config_apply_env(cfg, env), 0);
    T_EQ_INT(ddo_config_set(cfg, "pin_cpu_workers", "5"), 0);
    int64_t w = 0;
    T_EQ_INT(ddo_config_get_int(cfg, "pin_cpu_workers", &w), 0);
    T_EQ_INT((int)w, 3);
    T_EQ_INT(ddo_config_override(cfg, "pin_cpu_workers", "5"), 0);
    T_EQ_INT(ddo_config_get_int(cfg, "pin_cpu_workers", &w), 0);
    T_EQ_INT((int)w, 5);
    const char *src = NULL;
    T_EQ_INT(ddo_config_source(cfg, "pin_cpu_workers", &src), 0);
    T_EQ_STR(src, "argument");
    T_EQ_INT(ddo_config_override(cfg, "pin_cpu_workerz", "5"), DDO_E_NOT_FOUND);
    T_CONTAINS(ddo_config_error(cfg), "nearest: pin_cpu_workers");
    ddo_config_destroy(cfg);
}

/* Uses every unit once (the first acquire of each uploads it); returns the copies and the
 * uploads that took. The counts are read with no upload in flight: a prefetch counted as an
 * upload may not have issued its copies yet (seen under ThreadSanitizer's timing). */
static void use_all(fx *f, double *copies, double *uploads)
{
    T_CHECK(ddo_session_synchronize(f->s) == 0);
    double c0 = fx_metric(f, "copies"), u0 = fx_metric(f, "uploads");
    for (int b = 0; b < f->o.blocks; b++)
        T_CHECK(fx_use(f, fx_unit(f, b)) == 0); /* the bytes are checked in there */
    T_CHECK(ddo_session_synchronize(f->s) == 0);
    *copies = fx_metric(f, "copies") - c0;
    *uploads = fx_metric(f, "uploads") - u0;
}

/* A caller's host tensors registered in place: a unit's small tensors (here every one, 32 KiB)
 * sit in the pinned arena in device order and move in one copy per unit; large ones (256 KiB)
 * cost their inner pages plus one copy per gap between them (at most 5 for two weights, 6
 * before merging); vmm_runtime's per-weight ranges are not contiguous (and it stages its
 * retained bytes), so nothing merges there. */
static void test_host_tensors_move_in_merged_copies(void)
{
    static const char *modes[] = { "vmm_fast_runtime", "linear_runtime", "vmm_runtime" };
    for (int m = 0; m < 3; m++) {
        for (int large = 0; large < 2; large++) {
            fx_opts o = {
                .blocks = 4, .pin = true, .cache_gb = 1, .mode = modes[m], .cols = large ? 1024 : 0
            };
            fx f;
            T_REQUIRE(fx_create(&f, &o) == 0 && f.rc == 0);
            double copies = 0, uploads = 0;
            use_all(&f, &copies, &uploads);
            T_CHECK(uploads >= 4);
            if (m == 2)
                T_CHECK(copies >= 2 * uploads);
            else if (!large)
                T_EQ_U64((uint64_t)copies, (uint64_t)uploads);
            else
                T_CHECK(copies <= 5 * uploads && copies >= 2 * uploads);
            if (m < 2) /* vmm_runtime stages the retained bytes (pageable) */
                T_CHECK(fx_metric(&f, "bytes_from_registered") > 0);
            fx_destroy(&f);
        }
    }
}

/* vmm_fast_runtime keeps a slot's handle mapped into the ranges of the units it held before:
 * with a declared order, every unit settles into one slot and later uploads map nothing, the
 * bytes stay right (fx_use checks them), and reclaim, unload and reload drop the mappings and
 * settle again. */
static void test_settled_slots_keep_their_mappings(void)
{
    fx_opts o = { .blocks = 6, .slots = 3 };
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0 && f.rc == 0);
    size_t order[6];
    for (int b = 0; b < 6; b++)
        order[b] = fx_unit(&f, b);
    T_REQUIRE(ddo_session_declare_order(f.s, order, 6) == 0);
    double copies = 0, uploads = 0, maps[4] = { 0 };
    for (int round = 0; round < 2; round++) {
        for (int pass = 0; pass < 4; pass++) {
            use_all(&f, &copies, &uploads);
            maps[pass] = fx_metric(&f, "vmm_maps");
        }
        T_CHECK(maps[0] > 0);
        T_NEAR(maps[3], maps[1], 0); /* settled after the second pass */
        T_CHECK(fx_metric(&f, "uploads") > 0);
        if (round == 0) {
            uint64_t released = 0;
            T_EQ_INT(ddo_session_reclaim(f.s, &released), 0);
            T_REQUIRE(ddo_session_unload(f.s) == 0);
            T_REQUIRE(ddo_session_reload(f.s) == 0);
        }
    }
    fx_destroy(&f);
}

/* vmm_fast_runtime with 7 units in 3 slots (no multiple): the units take home slots round the
 * ring, so settled passes map nothing, and the short round's seam, where a unit's home is still
 * held by one needed before it, sits mid-order: the window is full across the pass boundary
 * (the last units' acquires keep the next pass's first units loading), shallower mid-pass. */
static void test_the_ring_seam_sits_mid_order(void)
{
    enum { N = 7, K = 3 };
    fx_opts o = { .blocks = N, .slots = K };
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0 && f.rc == 0);
    size_t order[N];
    for (int b = 0; b < N; b++)
        order[b] = fx_unit(&f, b);
    T_REQUIRE(ddo_session_declare_order(f.s, order, N) == 0);
    double maps_before = 0, depth[N] = { 0 };
    for (int pass = 0; pass < 4; pass++) {
        if (pass == 3)
            maps_before = fx_metric(&f, "vmm_maps");
        for (int b = 0; b < N; b++) {
            double d0 = fx_metric(&f, "prefetch_depth_sum");
            T_CHECK_MSG(fx_use(&f, fx_unit(&f, b)) == 0, "pass %d block %d", pass, b);
            depth[b] = fx_metric(&f, "prefetch_depth_sum") - d0;
        }
    }
    T_NEAR(fx_metric(&f, "vmm_maps"), maps_before, 0); /* settled: no upload maps */
    for (int b = N - K; b < N; b++)
        T_NEAR(depth[b], K - 1, 0); /* the pass end */
    T_NEAR(depth[0], K - 1, 0);
    double shallow = 0;
    for (int b = 1; b < N - K; b++)
        shallow += (K - 1) - depth[b];
    T_CHECK(shallow > 0); /* the seam is somewhere: mid-pass */
    fx_destroy(&f);
}

int main(void)
{
    T_RUN(test_calling_thread_stream_waits_for_the_upload);
    T_RUN(test_stable_and_unit_addresses);
    T_RUN(test_dlpack_views_keep_the_session);
    T_RUN(test_unit_dlpack_views);
    T_RUN(test_tensor_loads_count_the_copies_from_the_host);
    T_RUN(test_plan_inputs_and_struct_sizes);
    T_RUN(test_device_from_config);
    T_RUN(test_host_tensors_move_in_merged_copies);
    T_RUN(test_settled_slots_keep_their_mappings);
    T_RUN(test_the_ring_seam_sits_mid_order);
    return t_done();
}
