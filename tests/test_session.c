/*
 * test_session.c - the session runtime on the cpu device: slot states,
 * leases, hits, prefetch order and wrap-around, protection rules, reclaim
 * (explicit and pressure), unload/reload, the error boundary, a file changed
 * mid-session, stable VMM addresses, bytes read back, budgets back to zero.
 *
 * ctest-labels: unit backend threads
 */
#include "session_fx.h"

#include <time.h>

static const fx_opts vmm_mem = { .blocks = 4, .slots = 3 };

/* Waits until the copy stream finished everything and reaps. */
static void settle(fx *f)
{
    T_EQ_INT(ddo_session_synchronize(f->s), 0);
    T_EQ_INT(ddo_stream_synchronize(f->stream), 0);
}

static void test_create_destroy_budgets(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &vmm_mem) == 0);
    T_REQUIRE(f.rc == 0);
    ddo_plan_budgets b;
    T_REQUIRE(ddo_plan_budgets_get(f.plan, &b) == 0);
    uint64_t used[4];
    ddo__session_accounts(f.s, used);
    /* exactly what the plan predicted on the device: resident arena + every slot */
    T_EQ_U64(used[0], b.resident_bytes + b.slot_count * b.slot_bytes);
    ddo__device_usage_t u;
    ddo__device_usage(f.dev, &u);
    T_EQ_U64(u.device_bytes, used[0]);
    T_CHECK(used[3] <= b.staging_peak);
    for (size_t i = 0; i < (size_t)f.o.slots; i++) {
        bool backed = false, unsafe = true;
        T_EQ_INT(ddo__session_slot_state(f.s, i, NULL, &backed, &unsafe, NULL), DDO__SLOT_FREE);
        T_CHECK(backed);
        T_CHECK(!unsafe);
    }
    /* residents are readable right away and hold the checkpoint's bytes */
    size_t t = fx_tensor(&f, "norm.bias");
    void *p = NULL;
    T_REQUIRE(ddo_session_tensor_address(f.s, t, &p) == 0);
    unsigned char buf[64];
    T_REQUIRE(ddo__dev_copy_d2h(f.dev, buf, (uint64_t)(uintptr_t)p, sizeof(buf)) == 0);
    size_t lt = fx_local(&f, t);
    T_CHECK(memcmp(buf, f.bytes[lt], sizeof(buf)) == 0);
    T_EQ_U64(ddo__session_release_all(f.s), 0);
    fx_destroy(&f);
}

static void test_states_and_hits(void)
{
    fx_opts o = vmm_mem;
    o.bytes_per_s = 50e6; /* ~1.3 ms per unit: loading is observable */
    o.latency_ns = 20 * 1000 * 1000;
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    size_t u0 = fx_unit(&f, 0), u1 = fx_unit(&f, 1), u2 = fx_unit(&f, 2), u3 = fx_unit(&f, 3);
    T_REQUIRE(u3 != SIZE_MAX);

    T_REQUIRE(ddo_session_acquire(f.s, u0, f.stream) == 0);
    size_t slot0;
    T_EQ_INT(ddo__session_unit_state(f.s, u0, &slot0), DDO__SLOT_LEASED);
    /* prefetch keeps slots - 1 = 2 units loading: blocks 1 and 2 */
    bool pf = false;
    size_t s1;
    int st1 = ddo__session_unit_state(f.s, u1, &s1);
    T_CHECK(st1 == DDO__SLOT_LOADING); /* 20 ms latency per copy */
    T_REQUIRE(ddo__session_slot_state(f.s, s1, NULL, NULL, NULL, &pf) >= 0);
    T_CHECK(pf);
    T_CHECK(ddo__session_unit_state(f.s, u2, NULL) >= DDO__SLOT_LOADING);
    T_EQ_INT(ddo__session_unit_state(f.s, u3, NULL), -1);

    T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);
    T_CHECK(fx_check_unit(&f, u0, 0) == 0);
    T_REQUIRE(ddo_session_release(f.s, u0, f.stream) == 0);
    int st0 = ddo__session_unit_state(f.s, u0, NULL);
    T_CHECK(st0 == DDO__SLOT_RETIRING || st0 == DDO__SLOT_READY);
    settle(&f);
    T_EQ_INT(ddo__session_unit_state(f.s, u0, NULL), DDO__SLOT_READY);
    T_EQ_INT(ddo__session_unit_state(f.s, u1, NULL), DDO__SLOT_READY);

    /* a ready slot still holding the unit: a hit, no upload */
    double uploads = fx_metric(&f, "uploads");
    double hits = fx_metric(&f, "hits");
    T_REQUIRE(ddo_session_acquire(f.s, u0, f.stream) == 0);
    T_EQ_INT(ddo__session_unit_state(f.s, u0, NULL), DDO__SLOT_LEASED);
    T_NEAR(fx_metric(&f, "hits"), hits + 1, 0);
    T_NEAR(fx_metric(&f, "uploads"), uploads, 0);
    T_REQUIRE(ddo_session_release(f.s, u0, f.stream) == 0);

    /* the prefetched unit: a prefetch hit */
    double ph = fx_metric(&f, "prefetch_hits");
    T_REQUIRE(fx_use(&f, u1) == 0);
    T_NEAR(fx_metric(&f, "prefetch_hits"), ph + 1, 0);
    settle(&f);
    T_CHECK(fx_metric(&f, "misses") >= 1);
    T_CHECK(fx_metric(&f, "stall_ns") > 0);
    T_CHECK(fx_metric(&f, "copy_busy_ns") > 0);
    fx_destroy(&f);
}

static void test_bytes_and_stable_addresses_vmm(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &vmm_mem) == 0);
    T_REQUIRE(f.rc == 0);
    size_t t = fx_tensor(&f, "blocks.2.ff.weight");
    size_t u2 = fx_unit(&f, 2);
    void *first = NULL;
    for (int step = 0; step < 4; step++) {
        for (int b = 0; b < 4; b++) {
            size_t u = fx_unit(&f, b);
            T_REQUIRE(ddo_session_acquire(f.s, u, f.stream) == 0);
            T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);
            T_CHECK(fx_check_unit(&f, u, 0) == 0);
            if (u == u2) {
                void *p = NULL;
                T_REQUIRE(ddo_session_tensor_address(f.s, t, &p) == 0);
                if (first == NULL)
                    first = p;
                T_CHECK(p == first); /* one stable address for the whole session */
            }
            T_REQUIRE(ddo_session_release(f.s, u, f.stream) == 0);
        }
    }
    /* streamed tensors have no address while their unit is not leased */
    void *p = NULL;
    T_EQ_INT(ddo_session_tensor_address(f.s, t, &p), DDO_E_STATE);
    T_CONTAINS(ddo_session_error(f.s), "\"blocks.2.ff.weight\"");
    T_CONTAINS(ddo_session_error(f.s), "not leased");
    /* 4 units, 3 slots, 4 steps: every unit was uploaded more than once */
    T_CHECK(fx_metric(&f, "uploads") >= 8);
    T_NEAR(fx_metric(&f, "acquires"), 16, 0);
    T_NEAR(fx_metric(&f, "releases"), 16, 0);
    fx_destroy(&f);
}

static void test_linear_route(void)
{
    fx_opts o = vmm_mem;
    o.mode = "linear_runtime";
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    T_CHECK(strcmp(ddo_plan_route(f.plan), "vmm_fast_runtime") != 0);
    for (int step = 0; step < 3; step++)
        for (int b = 0; b < 4; b++)
            T_CHECK(fx_use(&f, fx_unit(&f, b)) == 0);
    /* addresses are slot buffers: a unit sits in the slot that holds it */
    size_t u1 = fx_unit(&f, 1);
    T_REQUIRE(ddo_session_acquire(f.s, u1, f.stream) == 0);
    size_t slot = SIZE_MAX;
    T_EQ_INT(ddo__session_unit_state(f.s, u1, &slot), DDO__SLOT_LEASED);
    T_CHECK(slot < 3);
    T_REQUIRE(ddo_session_release(f.s, u1, f.stream) == 0);
    fx_destroy(&f);
}

static void test_lease_errors(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &vmm_mem) == 0);
    T_REQUIRE(f.rc == 0);
    size_t u0 = fx_unit(&f, 0), u1 = fx_unit(&f, 1), u2 = fx_unit(&f, 2), u3 = fx_unit(&f, 3);
    T_EQ_INT(ddo_session_release(f.s, u0, f.stream), DDO_E_STATE);
    T_CONTAINS(ddo_session_error(f.s), "release \"blocks.0\": unit is not leased");
    T_REQUIRE(ddo_session_acquire(f.s, u0, f.stream) == 0);
    T_EQ_INT(ddo_session_acquire(f.s, u0, f.stream), DDO_E_STATE);
    T_CONTAINS(ddo_session_error(f.s), "already leased");
    T_REQUIRE(ddo_session_acquire(f.s, u1, f.stream) == 0);
    T_REQUIRE(ddo_session_acquire(f.s, u2, f.stream) == 0);
    /* every slot leased: busy, naming the slot count */
    T_EQ_INT(ddo_session_acquire(f.s, u3, f.stream), DDO_E_BUSY);
    T_CONTAINS(ddo_session_error(f.s), "all 3 execution slots are leased");
    /* leased slots are never reclaimed */
    uint64_t released = 1;
    T_EQ_INT(ddo_session_reclaim(f.s, &released), 0);
    T_EQ_U64(released, 0);
    T_EQ_INT(ddo_session_acquire(f.s, 999, f.stream), DDO_E_INVALID_ARGUMENT);
    void *p;
    T_EQ_INT(ddo_session_tensor_address(f.s, 100000, &p), DDO_E_INVALID_ARGUMENT);
    T_REQUIRE(ddo_session_release(f.s, u1, f.stream) == 0);
    T_REQUIRE(ddo_session_acquire(f.s, u3, f.stream) == 0);
    T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);
    T_CHECK(fx_check_unit(&f, u3, 0) == 0);
    T_CHECK(fx_check_unit(&f, u0, 0) == 0);
    T_REQUIRE(ddo_session_release(f.s, u0, f.stream) == 0);
    T_REQUIRE(ddo_session_release(f.s, u2, f.stream) == 0);
    T_REQUIRE(ddo_session_release(f.s, u3, f.stream) == 0);
    fx_destroy(&f);
}

/* The units held (loading, ready) right after acquiring `unit`, as a bit set of blocks. */
static unsigned held_blocks(fx *f, int blocks)
{
    unsigned m = 0;
    for (int b = 0; b < blocks; b++) {
        int st = ddo__session_unit_state(f->s, fx_unit(f, b), NULL);
        if (st == DDO__SLOT_LOADING || st == DDO__SLOT_READY || st == DDO__SLOT_LEASED)
            m |= 1u << b;
    }
    return m;
}

/* vmm_mem over 6 blocks with the order ob declared (order[i]: block ob[i]'s unit); 0 when
 * created and declared. */
static int create_declared(fx *f, const int ob[6], size_t order[6])
{
    fx_opts o = vmm_mem;
    o.blocks = 6;
    if (fx_create(f, &o) != 0 || f->rc != 0)
        return -1;
    for (int i = 0; i < 6; i++)
        order[i] = fx_unit(f, ob[i]);
    return ddo_session_declare_order(f->s, order, 6);
}

static void test_prefetch_declared_order_wraps(void)
{
    fx f;
    size_t order[6];
    int ob[6] = { 5, 3, 1, 0, 2, 4 };
    T_REQUIRE(create_declared(&f, ob, order) == 0);
    /* declaring the order starts the first three of it loading: 5, 3 and 1 */
    T_EQ_INT(held_blocks(&f, 6), (1u << 5) | (1u << 3) | (1u << 1));
    /* acquiring block 5 keeps the next two of the declared order loading: 3 and 1 */
    T_REQUIRE(ddo_session_acquire(f.s, order[0], f.stream) == 0);
    T_EQ_INT(held_blocks(&f, 6), (1u << 5) | (1u << 3) | (1u << 1));
    T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);
    T_CHECK(fx_check_unit(&f, order[0], 0) == 0);
    T_REQUIRE(ddo_session_release(f.s, order[0], f.stream) == 0);
    for (int i = 1; i < 5; i++)
        T_CHECK(fx_use(&f, order[i]) == 0);
    /* the last unit of the step prefetches the first two of the next step: 5 and 3 */
    T_REQUIRE(ddo_session_acquire(f.s, order[5], f.stream) == 0); /* block 4 */
    T_EQ_INT(held_blocks(&f, 6), (1u << 4) | (1u << 5) | (1u << 3));
    T_REQUIRE(ddo_session_release(f.s, order[5], f.stream) == 0);
    /* following the declared order, no acquire loads on demand (the first was loading since
     * the declaration) */
    T_NEAR(fx_metric(&f, "misses"), 0, 0);
    for (int step = 0; step < 3; step++)
        for (int i = 0; i < 6; i++)
            T_CHECK(fx_use(&f, order[i]) == 0);
    T_NEAR(fx_metric(&f, "misses"), 0, 0);
    T_CHECK(fx_metric(&f, "prefetch_depth_max") >= 2);
    T_CHECK(fx_metric(&f, "prefetch_hits") >= 20);
    /* bad declarations */
    size_t dup[2] = { order[0], order[0] };
    T_EQ_INT(ddo_session_declare_order(f.s, dup, 2), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_session_error(f.s), "listed twice");
    size_t bad[1] = { 77 };
    T_EQ_INT(ddo_session_declare_order(f.s, bad, 1), DDO_E_INVALID_ARGUMENT);
    fx_destroy(&f);
}

/* A unit read at a pass's start and again at its end (the gathered unit of the modules outside
 * the blocks): with the host's passes marked, the second acquire moves no window, so the slot
 * the pass's last block just released is not loaded before the next pass; unmarked, it is. */
static void reacquire_at_pass_end(bool marked)
{
    fx f;
    size_t order[6];
    int ob[6] = { 0, 1, 2, 3, 4, 5 };
    T_REQUIRE(create_declared(&f, ob, order) == 0);
    for (int pass = 0; pass < 3; pass++) {
        if (marked)
            T_REQUIRE(ddo_session_begin_pass(f.s) == 0);
        for (int i = 0; i < 6; i++)
            T_CHECK(fx_use(&f, order[i]) == 0);
        T_REQUIRE(ddo_session_acquire(f.s, order[0], f.stream) == 0); /* the pass's end */
        /* (block 5's slot, released, may read idle-ready or still retiring: not compared) */
        unsigned want = (1u << 0) | (1u << 1) | (marked ? 0u : 1u << 2);
        T_EQ_INT(held_blocks(&f, 6) & ~(1u << 5), want);
        T_REQUIRE(ddo_session_release(f.s, order[0], f.stream) == 0);
    }
    if (marked) { /* the next pass's first acquire moves the window: block 2 starts loading */
        T_REQUIRE(ddo_session_begin_pass(f.s) == 0);
        T_REQUIRE(ddo_session_acquire(f.s, order[0], f.stream) == 0);
        T_EQ_INT(held_blocks(&f, 6), (1u << 0) | (1u << 1) | (1u << 2));
        T_REQUIRE(ddo_session_release(f.s, order[0], f.stream) == 0);
    }
    T_NEAR(fx_metric(&f, "misses"), 0, 0);
    T_EQ_INT(ddo_session_begin_pass(NULL), DDO_E_INVALID_ARGUMENT);
    fx_destroy(&f);
}

static void test_pass_reacquire_moves_no_window(void)
{
    reacquire_at_pass_end(true);
    reacquire_at_pass_end(false);
}

static void test_prefetch_learned_order(void)
{
    fx_opts o = vmm_mem;
    o.blocks = 5;
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    int ob[5] = { 4, 2, 0, 3, 1 };
    /* first pass: the order is learned; before it is known, prefetch follows plan order */
    T_REQUIRE(ddo_session_acquire(f.s, fx_unit(&f, 4), f.stream) == 0);
    unsigned m = held_blocks(&f, 5);
    T_CHECK((m & 1u) && (m & 2u)); /* plan order wraps from block 4 to 0 and 1 */
    T_REQUIRE(ddo_session_release(f.s, fx_unit(&f, 4), f.stream) == 0);
    for (int i = 1; i < 5; i++)
        T_CHECK(fx_use(&f, fx_unit(&f, ob[i])) == 0);
    /* the repeat of block 4 closes the first pass: from now on prefetch follows 4 2 0 3 1
     * (plan order would have been 0 and 1) */
    settle(&f);
    T_REQUIRE(ddo_session_acquire(f.s, fx_unit(&f, 4), f.stream) == 0);
    T_EQ_INT(held_blocks(&f, 5), (1u << 4) | (1u << 2) | (1u << 0));
    T_REQUIRE(ddo_session_release(f.s, fx_unit(&f, 4), f.stream) == 0);
    T_REQUIRE(ddo_session_acquire(f.s, fx_unit(&f, 2), f.stream) == 0);
    m = held_blocks(&f, 5);
    T_CHECK((m & (1u << 0)) && (m & (1u << 3)) && !(m & (1u << 1)));
    T_REQUIRE(ddo_session_release(f.s, fx_unit(&f, 2), f.stream) == 0);
    fx_destroy(&f);
}

static void test_reclaim_explicit(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &vmm_mem) == 0);
    T_REQUIRE(f.rc == 0);
    ddo_plan_budgets b;
    T_REQUIRE(ddo_plan_budgets_get(f.plan, &b) == 0);
    size_t u0 = fx_unit(&f, 0), u1 = fx_unit(&f, 1), u2 = fx_unit(&f, 2);
    T_REQUIRE(fx_use(&f, u0) == 0);
    settle(&f);
    /* u0's slot is ready (idle); u1 and u2 were prefetched and are protected;
     * reclaim takes the one idle slot, and only one */
    uint64_t used[4];
    ddo__session_accounts(f.s, used);
    uint64_t before = used[0];
    uint64_t released = 0;
    T_REQUIRE(ddo_session_reclaim(f.s, &released) == 0);
    T_EQ_U64(released, b.slot_bytes);
    ddo__session_accounts(f.s, used);
    T_EQ_U64(used[0], before - b.slot_bytes);
    T_EQ_INT(ddo__session_unit_state(f.s, u0, NULL), -1);
    T_CHECK(ddo__session_unit_state(f.s, u1, NULL) == DDO__SLOT_READY);
    T_CHECK(ddo__session_unit_state(f.s, u2, NULL) == DDO__SLOT_READY);
    T_REQUIRE(ddo_session_reclaim(f.s, &released) == 0);
    T_EQ_U64(released, 0); /* the rest are prefetched, not acquired yet */
    T_NEAR(fx_metric(&f, "reclaim_events"), 1, 0);
    T_NEAR(fx_metric(&f, "reclaim_bytes"), (double)b.slot_bytes, 0);
    /* the next acquire recreates the backing and uploads again */
    T_CHECK(fx_use(&f, u0) == 0);
    ddo__session_accounts(f.s, used);
    T_EQ_U64(used[0], before);
    for (int b2 = 0; b2 < 4; b2++)
        T_CHECK(fx_use(&f, fx_unit(&f, b2)) == 0);
    fx_destroy(&f);
}

static void test_reclaim_pressure(void)
{
    /* A "device" of 256 MiB + 1 MiB: free memory is always below slot + 256 MiB. */
    fx_opts o = vmm_mem;
    o.blocks = 2;                                /* 3 slots, one unit ahead: idle slots exist */
    o.device_bytes = 256 * DDO_MIB + 256 * 1024; /* free < slot + 256 MiB once 2 slots exist */
    o.reclaim = true;
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    size_t u0 = fx_unit(&f, 0), u1 = fx_unit(&f, 1);
    T_REQUIRE(fx_use(&f, u0) == 0);
    settle(&f);
    uint64_t released = 0;
    T_REQUIRE(ddo_session_reclaim(f.s, &released) == 0); /* the free slot */
    T_CHECK(released > 0);
    T_REQUIRE(fx_use(&f, u1) == 0);
    settle(&f);
    T_REQUIRE(ddo_session_reclaim(f.s, &released) == 0); /* block 0's slot (LRU) */
    T_CHECK(released > 0);
    T_EQ_INT(ddo__session_unit_state(f.s, u0, NULL), -1);
    T_NEAR(fx_metric(&f, "reclaim_pressure_events"), 0, 0);
    /* block 0 needs new backing; free device memory is below slot + 256 MiB, so the one
     * idle slot (block 1's, ready and released) gives its backing first */
    T_REQUIRE(fx_use(&f, u0) == 0);
    T_NEAR(fx_metric(&f, "reclaim_pressure_events"), 1, 0);
    T_EQ_INT(ddo__session_unit_state(f.s, u1, NULL) == -1 ||
                 ddo__session_unit_state(f.s, u1, NULL) == DDO__SLOT_LOADING ||
                 ddo__session_unit_state(f.s, u1, NULL) == DDO__SLOT_READY,
             1);
    for (int step = 0; step < 3; step++)
        for (int b = 0; b < 2; b++)
            T_CHECK(fx_use(&f, fx_unit(&f, b)) == 0);
    fx_destroy(&f);

    /* the same without the option: never a pressure reclaim */
    o.reclaim = false;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    T_REQUIRE(fx_use(&f, u0) == 0);
    settle(&f);
    T_REQUIRE(ddo_session_reclaim(f.s, &released) == 0);
    for (int step = 0; step < 3; step++)
        for (int b = 0; b < 2; b++)
            T_CHECK(fx_use(&f, fx_unit(&f, b)) == 0);
    T_NEAR(fx_metric(&f, "reclaim_pressure_events"), 0, 0);
    T_NEAR(fx_metric(&f, "reclaim_events"), 1, 0);
    fx_destroy(&f);
}

static void test_unload_reload(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &vmm_mem) == 0);
    T_REQUIRE(f.rc == 0);
    size_t u0 = fx_unit(&f, 0);
    T_REQUIRE(fx_use(&f, u0) == 0);
    T_REQUIRE(ddo_session_unload(f.s) == 0);
    ddo__device_usage_t u;
    ddo__device_usage(f.dev, &u);
    T_EQ_U64(u.device_bytes, 0); /* device weights invalidated */
    T_EQ_INT(ddo_session_acquire(f.s, u0, f.stream), DDO_E_STATE);
    T_CONTAINS(ddo_session_error(f.s), "session unloaded: call ddo_session_reload");
    void *p;
    T_EQ_INT(ddo_session_tensor_address(f.s, fx_tensor(&f, "norm.bias"), &p), DDO_E_STATE);
    T_EQ_INT(ddo_session_unload(f.s), 0); /* idempotent */
    T_REQUIRE(ddo_session_reload(f.s) == 0);
    for (int b = 0; b < 4; b++)
        T_CHECK(fx_use(&f, fx_unit(&f, b)) == 0);
    T_REQUIRE(ddo_session_tensor_address(f.s, fx_tensor(&f, "head.weight"), &p) == 0);
    unsigned char buf[512];
    T_REQUIRE(ddo__dev_copy_d2h(f.dev, buf, (uint64_t)(uintptr_t)p, sizeof(buf)) == 0);
    T_CHECK(memcmp(buf, f.bytes[fx_local(&f, fx_tensor(&f, "head.weight"))], sizeof(buf)) == 0);
    T_NEAR(fx_metric(&f, "unloads"), 1, 0);
    T_NEAR(fx_metric(&f, "reloads"), 1, 0);
    fx_destroy(&f);
}

/* Release the host store of a file-backed session (retained and registered): the bytes go (metric
 * retained_bytes 0), a second release is harmless, acquire refuses until reload, which reads the
 * store again; every unit's bytes are the file's afterwards. */
static void test_release_host(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &vmm_mem) == 0); /* a caller's host tensors: nothing to release */
    T_REQUIRE(f.rc == 0);
    T_EQ_INT(ddo_session_release_host(f.s), DDO_E_UNSUPPORTED);
    T_CONTAINS(ddo_session_error(f.s), "the caller's host tensors");
    fx_destroy(&f);
    fx_opts o = vmm_mem;
    o.file = true;
    o.cache_gb = 1;
    o.pin = true;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    for (int b = 0; b < 4; b++)
        T_CHECK(fx_use(&f, fx_unit(&f, b)) == 0);
    T_CHECK(fx_metric(&f, "retained_bytes") > 0);
    T_REQUIRE(ddo_session_release_host(f.s) == 0);
    T_NEAR(fx_metric(&f, "retained_bytes"), 0, 0);
    T_EQ_INT(ddo_session_release_host(f.s), 0);
    T_EQ_INT(ddo_session_acquire(f.s, fx_unit(&f, 0), f.stream), DDO_E_STATE);
    T_REQUIRE(ddo_session_reload(f.s) == 0);
    T_CHECK(fx_metric(&f, "retained_bytes") > 0);
    for (int step = 0; step < 2; step++)
        for (int b = 0; b < 4; b++)
            T_CHECK(fx_use(&f, fx_unit(&f, b)) == 0);
    T_NEAR(fx_metric(&f, "unloads"), 1, 0);
    T_NEAR(fx_metric(&f, "reloads"), 1, 0);
    fx_destroy(&f);
}

static int phase_calls;
static int phase_ok(void *user)
{
    (void)user;
    phase_calls++;
    return 0;
}
static int phase_fail(void *user)
{
    phase_calls++;
    fx *f = user;
    (void)ddo_session_acquire(f->s, fx_unit(f, 0), f->stream);
    ddo_last_error(); /* the host's own error below is the one reported */
    return ddo__fail(NULL, DDO_E_IO, "host: forward of blocks.0 failed");
}

static void test_error_boundary(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &vmm_mem) == 0);
    T_REQUIRE(f.rc == 0);
    phase_calls = 0;
    T_EQ_INT(ddo_session_run_phase(f.s, phase_ok, &f), 0);
    T_EQ_INT(phase_calls, 1);
    T_EQ_INT(fx_use(&f, fx_unit(&f, 1)), 0); /* success: no implicit unload */

    T_EQ_INT(ddo_session_run_phase(f.s, phase_fail, &f), DDO_E_IO);
    T_EQ_INT(phase_calls, 2);
    T_EQ_STR(ddo_session_error(f.s), "host: forward of blocks.0 failed");
    T_EQ_INT(ddo_session_acquire(f.s, fx_unit(&f, 1), f.stream), DDO_E_STATE); /* unloaded */
    T_REQUIRE(ddo_session_reload(f.s) == 0);
    T_EQ_INT(fx_use(&f, fx_unit(&f, 1)), 0);

    /* cleanup failing too: the original error stays, the cleanup failure is attached */
    T_EQ_INT(fx_use(&f, fx_unit(&f, 2)), 0);
    ddo__device_inject_fault(f.dev, DDO__OP_PHYS_RELEASE, 1, false, DDO_E_DEVICE);
    T_EQ_INT(ddo_session_run_phase(f.s, phase_fail, &f), DDO_E_IO);
    T_CONTAINS(ddo_session_error(f.s), "host: forward of blocks.0 failed; cleanup also failed: ");
    T_CONTAINS(ddo_session_error(f.s), "unsafe");
    ddo__device_clear_faults(f.dev);
    T_NEAR(fx_metric(&f, "unsafe_slots"), 1, 0);
    T_NEAR(fx_metric(&f, "reclaim_failures"), 1, 0);
    /* the unsafe slot's bytes stay accounted and are never freed twice */
    uint64_t used[4];
    ddo__session_accounts(f.s, used);
    ddo_plan_budgets b;
    T_REQUIRE(ddo_plan_budgets_get(f.plan, &b) == 0);
    T_EQ_U64(used[0], b.slot_bytes);
    /* still usable with the remaining slots */
    T_REQUIRE(ddo_session_reload(f.s) == 0);
    for (int step = 0; step < 2; step++)
        for (int b2 = 0; b2 < 4; b2++)
            T_CHECK(fx_use(&f, fx_unit(&f, b2)) == 0);
    T_EQ_U64(ddo__session_release_all(f.s), b.slot_bytes);
    ddo_session_destroy(f.s);
    f.s = NULL;
    ddo__device_usage_t u;
    ddo__device_usage(f.dev, &u);
    T_EQ_U64(u.device_bytes, b.slot_bytes); /* leaked deliberately, reported */
    /* the fixture's zero checks would fail on purpose here: tidy by hand */
    ddo_plan_destroy(f.plan);
    f.plan = NULL;
    ddo_config_destroy(f.cfg);
    f.cfg = NULL;
    ddo_stream_destroy(f.stream);
    f.stream = NULL;
    ddo_device_destroy(f.dev);
    f.dev = NULL;
    fx_destroy(&f);
}

static void test_file_tiers_and_change(void)
{
    fx_opts o = vmm_mem;
    o.file = true; /* nothing retained: every upload re-reads the file through staging */
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    for (int step = 0; step < 2; step++)
        for (int b = 0; b < 4; b++)
            T_CHECK(fx_use(&f, fx_unit(&f, b)) == 0);
    T_CHECK(fx_metric(&f, "bytes_staged_from_file") > 0);
    T_CHECK(fx_metric(&f, "file_rereads") >= 4);
    T_NEAR(fx_metric(&f, "bytes_from_registered"), 0, 0);
    settle(&f);
    /* the file changes under the session: the next upload from it is refused */
    fx_fill(&f, 1);
    struct timespec ts = { 0, 50 * 1000 * 1000 };
    nanosleep(&ts, NULL);
    T_REQUIRE(fx_write_file(&f) == 0);
    int rc = 0;
    for (int b = 0; b < 4 && rc == 0; b++) {
        size_t u = fx_unit(&f, b);
        int st = ddo__session_unit_state(f.s, u, NULL);
        if (st != -1)
            continue; /* still held from before the change: no upload */
        rc = ddo_session_acquire(f.s, u, f.stream);
        if (rc == 0)
            (void)ddo_session_release(f.s, u, f.stream);
    }
    T_EQ_INT(rc, DDO_E_FILE_CHANGED);
    T_CONTAINS(ddo_session_error(f.s), "model.safetensors");
    fx_destroy(&f);
}

static void test_retained_tiers(void)
{
    fx_opts o = vmm_mem;
    o.file = true;
    o.cache_gb = 1;
    o.pin = true;
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    for (int step = 0; step < 2; step++)
        for (int b = 0; b < 4; b++)
            T_CHECK(fx_use(&f, fx_unit(&f, b)) == 0);
    double reg = fx_metric(&f, "bytes_from_registered");
    double ret = fx_metric(&f, "bytes_staged_from_retained");
    T_CHECK(reg + ret > 0);
    T_NEAR(fx_metric(&f, "bytes_staged_from_file"), 0, 0);
    T_NEAR(fx_metric(&f, "file_rereads"), 0, 0);
    /* a retained session does not read the file again: changing it is harmless */
    fx_fill(&f, 1);
    T_REQUIRE(fx_write_file(&f) == 0);
    fx_fill(&f, 0);
    for (int b = 0; b < 4; b++)
        T_CHECK(fx_use(&f, fx_unit(&f, b)) == 0);
    fx_destroy(&f);
}

static void test_metrics_snapshot(void)
{
    fx f;
    T_REQUIRE(fx_create(&f, &vmm_mem) == 0);
    T_REQUIRE(f.rc == 0);
    for (int b = 0; b < 4; b++)
        T_CHECK(fx_use(&f, fx_unit(&f, b)) == 0);
    T_CHECK(fx_use(&f, fx_unit(&f, 0)) == 0); /* the repeat: order learned */
    ddo_metrics *m = NULL;
    T_REQUIRE(ddo_session_metrics(f.s, true, &m) == 0);
    double v = 0;
    T_REQUIRE(ddo_metrics_get(m, "planned_slot_count", &v) == 0);
    T_NEAR(v, 3, 0);
    T_REQUIRE(ddo_metrics_get(m, "acquires", &v) == 0);
    T_NEAR(v, 5, 0);
    char *json = NULL;
    T_REQUIRE(ddo_metrics_to_json(m, "transformer", &json) == 0);
    T_CONTAINS(json, "\"schema_version\"");
    T_CONTAINS(json, "learned");
    ddo_free(json);
    ddo_metrics_destroy(m);
    /* collect_completed retires finished tickets without unloading */
    T_EQ_INT(ddo_session_synchronize(f.s), 0);
    T_REQUIRE(ddo_session_metrics(f.s, true, &m) == 0);
    ddo_metrics_destroy(m);
    T_CHECK(fx_metric(&f, "completed_tickets") >= 1);
    T_EQ_INT(fx_use(&f, fx_unit(&f, 0)), 0);
    fx_destroy(&f);
}

static void test_nvme_baseline_route(void)
{
    fx_opts o = vmm_mem;
    o.mode = "vmm_runtime"; /* the protected route: nothing retained, fed from the file */
    o.file = true;
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    T_EQ_STR(ddo_plan_route(f.plan), "vmm_runtime");
    uint64_t used[4];
    ddo__session_accounts(f.s, used);
    T_EQ_U64(used[1], 0); /* nothing retained */
    T_EQ_U64(used[2], 0);
    for (int step = 0; step < 3; step++)
        for (int b = 0; b < 4; b++)
            T_CHECK(fx_use(&f, fx_unit(&f, b)) == 0);
    T_NEAR(fx_metric(&f, "bytes_staged_from_retained"), 0, 0);
    T_CHECK(fx_metric(&f, "bytes_staged_from_file") > 0);
    fx_destroy(&f);
}

/* vmm_runtime: acquires unit, checks its bytes and that every weight keeps the address of
 * its first lease (addr[], 0 = not seen yet), releases, and checks that the device holds no
 * more device or mapped bytes than the mapped budget. 0 or -1. */
static int nvme_use(fx *f, size_t u, uint64_t *addr, uint64_t budget)
{
    int bad = 0;
    int rc = ddo_session_acquire(f->s, u, f->stream);
    if (rc != 0) {
        fprintf(stderr, "  acquire %zu: %s\n", u, ddo_last_error());
        return -1;
    }
    if (ddo_stream_synchronize(f->stream) != 0 || fx_check_unit(f, u, 0) != 0)
        bad = -1;
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(f->plan, u, &n);
    for (size_t k = 0; k < n; k++) {
        void *p = NULL;
        if (ddo_session_tensor_address(f->s, ts[k], &p) != 0)
            bad = -1;
        uint64_t a = (uint64_t)(uintptr_t)p;
        if (a % FX_GRAN != 0) /* each weight starts its own aligned range */
            bad = -1;
        if (addr[ts[k]] == 0)
            addr[ts[k]] = a;
        if (a != addr[ts[k]]) /* stable across leases, slots and evictions */
            bad = -1;
    }
    if (ddo_session_release(f->s, u, f->stream) != 0)
        bad = -1;
    ddo__device_usage_t du;
    ddo__device_usage(f->dev, &du);
    if (du.device_bytes > budget || du.mapped_bytes > budget) {
        fprintf(stderr, "  device %llu mapped %llu over the budget %llu\n",
                (unsigned long long)du.device_bytes, (unsigned long long)du.mapped_bytes,
                (unsigned long long)budget);
        bad = -1;
    }
    return bad;
}

/* vmm_runtime: one granularity-aligned range per weight, stable across leases, disjoint;
 * each weight its own handle mapped at offset 0; the mapped bytes stay under the mapped
 * budget although the model's weights do not fit. */
static void test_nvme_per_weight_ranges(void)
{
    fx_opts o = { .blocks = 6, .slots = 3, .mode = "vmm_runtime", .file = true };
    o.cols = 80; /* 20 KiB weights: the plan packs a unit into 64 KiB, per weight 128 KiB */
    o.budget_gb = 0.0004; /* 409.6 KiB: three 128 KiB slots fit, the six units (768 KiB) do not */
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    const uint64_t budget = (uint64_t)(0.0004 * (double)DDO_GIB);
    uint64_t used[4];
    ddo__session_accounts(f.s, used);
    /* the resident arena (norm.bias at 0, head.weight at 256); handles come when units load */
    T_EQ_U64(used[0], 768);
    ddo_plan_budgets b;
    T_REQUIRE(ddo_plan_budgets_get(f.plan, &b) == 0);
    /* the planner predicts the route: a slot is the largest unit's per-weight handles */
    T_EQ_U64(b.slot_bytes, 2 * FX_GRAN);
    T_EQ_U64(b.device_weights_peak, 768 + 3 * 2 * FX_GRAN);
    T_NEAR(fx_metric(&f, "planned_slot_bytes"), 2.0 * FX_GRAN, 0);
    T_NEAR(fx_metric(&f, "planned_device_weights_bytes"), 768.0 + 6 * FX_GRAN, 0);
    T_EQ_U64(used[1], 0);
    T_EQ_U64(used[2], 0);
    T_EQ_U64(used[3], b.staging_peak); /* two staging slots, fed from the file */
    T_CHECK(b.staging_windows >= 2);
    ddo__device_stats_reset(f.dev);

    size_t nt = ddo_checkpoint_tensor_count(f.ck);
    uint64_t addr[FX_MAX_TENSORS] = { 0 };
    for (int step = 0; step < 3; step++)
        for (int blk = 0; blk < o.blocks; blk++)
            T_CHECK_MSG(nvme_use(&f, fx_unit(&f, blk), addr, budget) == 0, "step %d block %d", step,
                        blk);
    /* per-weight ranges: disjoint, each at least the weight rounded up to the granularity */
    for (size_t i = 0; i < nt; i++) {
        if (addr[i] == 0)
            continue;
        uint64_t si = (f.sizes[fx_local(&f, i)] + FX_GRAN - 1) / FX_GRAN * FX_GRAN;
        for (size_t j = 0; j < nt; j++) {
            if (j == i || addr[j] == 0)
                continue;
            T_CHECK_MSG(addr[j] >= addr[i] + si || addr[j] < addr[i], "ranges %zu and %zu overlap",
                        i, j);
        }
    }
    ddo__device_usage_t du;
    ddo__device_usage(f.dev, &du);
    /* the mapped peak: three slots' two weights each, never the six units' twelve */
    T_EQ_U64(du.mapped_peak_bytes, 3 * 2 * FX_GRAN);
    T_CHECK(du.device_peak_bytes <= budget);
    T_EQ_U64(du.va_bytes, 12 * FX_GRAN); /* one 64 KiB range per streamed weight */
    /* every map was a whole handle at offset 0, one per weight and load */
    T_EQ_INT(ddo_session_synchronize(f.s), 0); /* the last prefetches are issued */
    ddo__devop_stats st[DDO__OP_COUNT];
    ddo__device_stats(f.dev, st);
    T_EQ_U64(st[DDO__OP_MAP].failures, 0);
    double uploads = fx_metric(&f, "uploads");
    T_CHECK(uploads >= 3 * 6);
    T_NEAR((double)st[DDO__OP_MAP].calls, 2 * uploads, 0);
    T_EQ_U64(st[DDO__OP_PHYS_CREATE].calls, 3 * 2); /* three units' handles, then reused */
    ddo__session_accounts(f.s, used);
    T_EQ_U64(used[0], 768 + 3 * 2 * FX_GRAN);
    T_CHECK(fx_metric(&f, "bytes_staged_from_file") >= 3.0 * 12 * 20480);
    T_NEAR(fx_metric(&f, "bytes_staged_from_retained"), 0, 0);
    T_NEAR(fx_metric(&f, "bytes_from_registered"), 0, 0);
    /* unload releases everything; the addresses survive unload/reload */
    T_EQ_INT(ddo_session_unload(f.s), 0);
    ddo__session_accounts(f.s, used);
    T_EQ_U64(used[0], 0);
    ddo__device_usage(f.dev, &du);
    T_EQ_U64(du.device_bytes, 0);
    T_EQ_U64(du.mapped_bytes, 0);
    T_EQ_INT(ddo_session_reload(f.s), 0);
    T_EQ_INT(nvme_use(&f, fx_unit(&f, 0), addr, budget), 0);
    fx_destroy(&f);
}

/* vmm_runtime: a plan built for a 4 KiB granularity (units of 64 KiB + 68..72 KiB) under
 * budget_gb, and a session on the fixture's 64 KiB device, where every unit but blocks.0
 * takes 192 KiB. The fixture's own plan is built with 0.001 first. 0 or -1. */
static int nvme_fine_plan(fx *f, int slots, const char *budget_gb, double bytes_per_s)
{
    fx_opts o = { .blocks = 6, .slots = slots, .mode = "vmm_runtime", .file = true };
    o.cols = 256;
    o.budget_gb = 0.001;
    o.bytes_per_s = bytes_per_s;
    o.no_session = true;
    if (fx_create(f, &o) != 0)
        return -1;
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    in.device_total_bytes = DDO_GIB;
    in.device_free_bytes = DDO_GIB;
    in.device_granularity = 4096;
    in.device_is_cpu = true;
    in.device_vmm_supported = true;
    in.host_available_bytes = 8 * DDO_GIB;
    ddo_plan_destroy(f->plan);
    f->plan = NULL;
    ddo_plan_budgets b;
    if (ddo_config_set(f->cfg, "vmm_resident_weight_budget_gb", budget_gb) != 0 ||
        ddo_plan_build(f->ck, f->cfg, &in, &f->plan) != 0 ||
        ddo_plan_budgets_get(f->plan, &b) != 0 || b.slot_count != (size_t)slots) {
        fprintf(stderr, "  plan: %s\n", ddo_last_error());
        return -1;
    }
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f->cfg;
    if (ddo_session_create(f->plan, f->ck, f->dev, &so, &f->s) != 0) {
        fprintf(stderr, "  session: %s\n", ddo_last_error());
        return -1;
    }
    return 0;
}

/* vmm_runtime when the device's granularity makes the weights larger than the plan assumed:
 * the session keeps to the budget with the plan's two slots by evicting the idle unit (its
 * handles pooled; pooled handles of another size released), and a lease that finds the
 * budget held by another lease is refused, not deadlocked. */
static void test_nvme_evicts_in_budget(void)
{
    fx f;
    T_REQUIRE(nvme_fine_plan(&f, 2, "0.0003", 0) == 0); /* 314.6 KiB: one unit at a time */
    const uint64_t budget = (uint64_t)(0.0003 * (double)DDO_GIB);
    const int blocks = 6;

    uint64_t addr[FX_MAX_TENSORS] = { 0 };
    for (int step = 0; step < 3; step++)
        for (int blk = 0; blk < blocks; blk++)
            T_CHECK_MSG(nvme_use(&f, fx_unit(&f, blk), addr, budget) == 0, "step %d block %d", step,
                        blk);
    uint64_t x = 11;
    for (int i = 0; i < 60; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int blk = (int)((x >> 33) % (uint64_t)blocks);
        T_CHECK_MSG(nvme_use(&f, fx_unit(&f, blk), addr, budget) == 0, "random %d block %d", i,
                    blk);
    }
    ddo__device_usage_t du;
    ddo__device_usage(f.dev, &du);
    T_EQ_U64(du.mapped_peak_bytes, 3 * FX_GRAN); /* two slots, but one unit mapped at a time */
    T_CHECK(du.device_peak_bytes <= budget);
    T_NEAR(fx_metric(&f, "prefetch_issued"), 0, 0); /* no room to load ahead */

    /* a second lease finds the budget held by the first: refused with the holders named */
    size_t u1 = fx_unit(&f, 1), u2 = fx_unit(&f, 2);
    T_REQUIRE(ddo_session_acquire(f.s, u1, f.stream) == 0);
    T_EQ_INT(ddo_session_acquire(f.s, u2, f.stream), DDO_E_BUSY);
    T_CONTAINS(ddo_session_error(f.s),
               "acquire \"blocks.2\": unit \"blocks.2\": no room for 192.00 KiB of weights in the "
               "mapped budget: ");
    T_CONTAINS(ddo_session_error(f.s), " of 314.57 KiB (vmm_resident_weight_budget_gb) held by 1 "
                                       "leased and 0 loading or prefetched units; release a "
                                       "unit first");
    T_EQ_INT(ddo_stream_synchronize(f.stream), 0);
    T_EQ_INT(fx_check_unit(&f, u1, 0), 0); /* the leased unit is untouched */
    T_EQ_INT(ddo_session_release(f.s, u1, f.stream), 0);
    T_EQ_INT(nvme_use(&f, u1, addr, budget), 0);
    T_EQ_INT(nvme_use(&f, u2, addr, budget), 0);
    ddo__device_usage(f.dev, &du);
    T_CHECK(du.device_peak_bytes <= budget);
    uint64_t used[4];
    ddo__session_accounts(f.s, used);
    T_CHECK(used[0] <= budget);
    T_NEAR(fx_metric(&f, "device_weights_peak_bytes"), (double)du.device_peak_bytes, 0);

    /* explicit reclaim gives back the pool and the idle unit's handles */
    T_EQ_INT(ddo_session_synchronize(f.s), 0);
    /* the release event completes on the device's own thread: wait for the slot to be idle */
    for (int i = 0; i < 2000 && ddo__session_unit_state(f.s, u2, NULL) != DDO__SLOT_READY; i++)
        nanosleep(&(struct timespec){ 0, 1000 * 1000 }, NULL);
    T_EQ_INT(ddo__session_unit_state(f.s, u2, NULL), DDO__SLOT_READY);
    uint64_t released = 0;
    T_EQ_INT(ddo_session_reclaim(f.s, &released), 0);
    ddo__session_accounts(f.s, used);
    T_CHECK(released >= 3 * FX_GRAN);
    T_EQ_U64(used[0], 768);
    ddo__device_usage(f.dev, &du);
    T_EQ_U64(du.device_bytes, 768);
    T_EQ_U64(du.mapped_bytes, 0);
    T_EQ_INT(ddo__session_unit_state(f.s, u2, NULL), -1);
    T_NEAR(fx_metric(&f, "reclaim_events"), 1, 0);
    T_NEAR(fx_metric(&f, "reclaim_bytes"), (double)released, 0);
    T_EQ_INT(nvme_use(&f, u2, addr, budget), 0);
    fx_destroy(&f);
}

/* vmm_runtime with three slots and a budget for two units (the plan assumed three fit):
 * the next unit is prefetched while one is leased, by evicting the idle unit; a demand load
 * out of order may displace a prefetched unit, never the leased one. */
static void test_nvme_evicts_with_prefetch(void)
{
    fx f;
    T_REQUIRE(nvme_fine_plan(&f, 3, "0.0004", 200e6) == 0); /* 409.6 KiB: two units */
    const uint64_t budget = (uint64_t)(0.0004 * (double)DDO_GIB);
    const int blocks = 6;
    uint64_t addr[FX_MAX_TENSORS] = { 0 };
    for (int step = 0; step < 3; step++)
        for (int blk = 0; blk < blocks; blk++)
            T_CHECK_MSG(nvme_use(&f, fx_unit(&f, blk), addr, budget) == 0, "step %d block %d", step,
                        blk);
    T_CHECK(fx_metric(&f, "prefetch_hits") >= 8);
    for (int blk = blocks - 1; blk >= 0; blk--)
        T_CHECK_MSG(nvme_use(&f, fx_unit(&f, blk), addr, budget) == 0, "backwards block %d", blk);
    uint64_t x = 5;
    for (int i = 0; i < 40; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int blk = (int)((x >> 33) % (uint64_t)blocks);
        T_CHECK_MSG(nvme_use(&f, fx_unit(&f, blk), addr, budget) == 0, "random %d block %d", i,
                    blk);
    }
    /* two leases at once fit; a third lease finds no room */
    size_t u0 = fx_unit(&f, 0), u3 = fx_unit(&f, 3), u5 = fx_unit(&f, 5);
    T_REQUIRE(ddo_session_acquire(f.s, u3, f.stream) == 0);
    T_REQUIRE(ddo_session_acquire(f.s, u5, f.stream) == 0);
    T_EQ_INT(ddo_session_acquire(f.s, u0, f.stream), DDO_E_BUSY);
    T_CONTAINS(ddo_session_error(f.s), "held by 2 leased and 0 loading or prefetched units");
    T_EQ_INT(ddo_stream_synchronize(f.stream), 0);
    T_EQ_INT(fx_check_unit(&f, u3, 0), 0);
    T_EQ_INT(fx_check_unit(&f, u5, 0), 0);
    T_EQ_INT(ddo_session_release(f.s, u5, f.stream), 0);
    T_EQ_INT(ddo_session_release(f.s, u3, f.stream), 0);
    T_EQ_INT(nvme_use(&f, u0, addr, budget), 0);
    ddo__device_usage_t du;
    ddo__device_usage(f.dev, &du);
    T_CHECK(du.mapped_peak_bytes <= 2 * 3 * FX_GRAN);
    T_CHECK(du.device_peak_bytes <= budget);
    fx_destroy(&f);
}

/* vmm_runtime with room for two units: the next unit is prefetched while one is leased,
 * evicting the idle unit, never the leased or the prefetched one. */
static void test_nvme_prefetch_in_budget(void)
{
    fx_opts o = { .blocks = 6, .slots = 2, .mode = "vmm_runtime", .file = true };
    o.cols = 256;
    o.budget_gb = 0.0004;  /* 409.6 KiB: two units of 192 KiB, not three */
    o.bytes_per_s = 200e6; /* uploads take a while: prefetched units are still loading */
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    const uint64_t budget = (uint64_t)(0.0004 * (double)DDO_GIB);
    uint64_t addr[FX_MAX_TENSORS] = { 0 };
    for (int step = 0; step < 4; step++)
        for (int blk = 0; blk < o.blocks; blk++)
            T_CHECK_MSG(nvme_use(&f, fx_unit(&f, blk), addr, budget) == 0, "step %d block %d", step,
                        blk);
    T_CHECK(fx_metric(&f, "prefetch_hits") >= 12);
    ddo__device_usage_t du;
    ddo__device_usage(f.dev, &du);
    T_EQ_U64(du.mapped_peak_bytes, 2 * 3 * FX_GRAN);
    T_CHECK(du.device_peak_bytes <= budget);
    /* out of order: a demand load may displace a prefetched unit never acquired */
    for (int blk = o.blocks - 1; blk >= 0; blk--)
        T_CHECK_MSG(nvme_use(&f, fx_unit(&f, blk), addr, budget) == 0, "backwards block %d", blk);
    fx_destroy(&f);
}

/* A mapped budget that cannot hold the largest unit's per-weight handles is refused: by the
 * planner, and by the session (before any device call) when the device's granularity makes
 * the weights larger than the plan assumed. */
static void test_nvme_budget_refused(void)
{
    /* 20 KiB weights, 64 KiB handles: 128 KiB per unit; the budget becomes 104.9 KiB */
    fx_opts o = { .blocks = 6, .slots = 2, .mode = "vmm_runtime", .file = true };
    o.cols = 80;
    o.no_session = true;
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    ddo_plan_inputs in = fx_cpu_inputs(DDO_GIB, 8 * DDO_GIB);
    T_REQUIRE(ddo_config_set(f.cfg, "vmm_resident_weight_budget_gb", "0.0001") == 0);
    ddo_plan *p = NULL;
    T_EQ_INT(ddo_plan_build(f.ck, f.cfg, &in, &p), DDO_E_BUDGET);
    T_CHECK(p == NULL);
    T_EQ_STR(ddo_last_error(),
             "device weights: vmm_runtime maps every weight into its own 64.00 KiB-aligned "
             "range, so unit \"blocks.0\" needs 128.00 KiB (+ resident 768 B = 128.75 KiB) but "
             "the mapped budget is 104.86 KiB (vmm_resident_weight_budget_gb); raise it or set "
             "unit_granularity=leaf");

    /* a budget that holds one unit but not the two slots is refused like on every route,
     * with the per-weight slot size */
    T_REQUIRE(ddo_config_set(f.cfg, "vmm_resident_weight_budget_gb", "0.0002") == 0);
    T_EQ_INT(ddo_plan_build(f.ck, f.cfg, &in, &p), DDO_E_BUDGET);
    T_EQ_STR(ddo_last_error(),
             "device budget 209.71 KiB (vmm_resident_weight_budget_gb) is too small for any "
             "plan: unit \"blocks.5\" takes 128.00 KiB and streaming needs two execution slots "
             "+ resident 768 B, so the smallest budget that works is 256.75 KiB; "
             "unit_granularity=leaf streams single modules and would fit (it needs 128.75 KiB)");
    T_REQUIRE(ddo_config_set(f.cfg, "vmm_resident_weight_budget_gb", "0.0001") == 0);

    /* planned for a 4 KiB granularity, the units fit; the device maps in 64 KiB */
    in.device_granularity = 4096;
    T_REQUIRE(ddo_plan_build(f.ck, f.cfg, &in, &p) == 0);
    ddo_plan_destroy(f.plan);
    f.plan = p;
    ddo__device_stats_reset(f.dev);
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f.cfg;
    ddo_session *s = (ddo_session *)&f;
    T_EQ_INT(ddo_session_create(f.plan, f.ck, f.dev, &so, &s), DDO_E_BUDGET);
    T_CHECK(s == NULL);
    T_EQ_STR(ddo_last_error(),
             "device weights: vmm_runtime maps every weight into its own 64.00 KiB-aligned "
             "range, so unit \"blocks.0\" needs 128.00 KiB (+ resident 768 B = 128.75 KiB) but "
             "the mapped budget is 104.86 KiB (vmm_resident_weight_budget_gb); raise it or set "
             "unit_granularity=leaf");
    ddo__devop_stats st[DDO__OP_COUNT];
    ddo__device_stats(f.dev, st);
    T_EQ_U64(st[DDO__OP_VA_RESERVE].calls, 0);
    T_EQ_U64(st[DDO__OP_PHYS_CREATE].calls, 0);
    T_EQ_U64(st[DDO__OP_HOST_ALLOC].calls, 0);
    T_EQ_U64(st[DDO__OP_MEM_ALLOC].calls, 0);
    fx_destroy(&f);
}

/* The pinned host-cache helper: disabled by default; enabled, it releases the idle staging
 * windows (after pending uploads), which come back through the staging account on demand. */
static void test_trim_host_cache(void)
{
    fx_opts o = { .blocks = 4, .slots = 3, .mode = "vmm_runtime", .file = true };
    o.bytes_per_s = 50e6; /* uploads are still pending when the trim is asked for */
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    ddo_plan_budgets b;
    T_REQUIRE(ddo_plan_budgets_get(f.plan, &b) == 0);
    T_REQUIRE(b.staging_peak > 0);
    uint64_t used[4], released = 99;
    ddo__device_usage_t du;

    T_EQ_INT(ddo_session_trim_host_cache(NULL, true, &released), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_session_trim_host_cache(f.s, true, NULL), DDO_E_INVALID_ARGUMENT);
    T_EQ_U64(released, 99);
    /* disabled: nothing happens */
    T_EQ_INT(ddo_session_trim_host_cache(f.s, false, &released), 0);
    T_EQ_U64(released, 0);
    ddo__session_accounts(f.s, used);
    T_EQ_U64(used[3], b.staging_peak);
    T_NEAR(fx_metric(&f, "host_cache_trims"), 0, 0);

    for (int blk = 0; blk < 4; blk++)
        T_EQ_INT(fx_use(&f, fx_unit(&f, blk)), 0);
    /* a lease is held and prefetches are in flight: the trim waits for them first */
    size_t u0 = fx_unit(&f, 0);
    T_REQUIRE(ddo_session_acquire(f.s, u0, f.stream) == 0);
    T_EQ_INT(ddo_session_trim_host_cache(f.s, true, &released), 0);
    T_EQ_U64(released, b.staging_peak);
    ddo__session_accounts(f.s, used);
    T_EQ_U64(used[3], 0);
    ddo__device_usage(f.dev, &du);
    T_EQ_U64(du.pinned_bytes, 0);
    T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);
    T_EQ_INT(fx_check_unit(&f, u0, 0), 0);
    T_REQUIRE(ddo_session_release(f.s, u0, f.stream) == 0);
    T_NEAR(fx_metric(&f, "host_cache_trims"), 1, 0);
    T_NEAR(fx_metric(&f, "host_cache_trimmed_bytes"), (double)b.staging_peak, 0);
    T_NEAR(fx_metric(&f, "staging_bytes"), 0, 0);
    /* nothing left to release: a second trim reports 0 and counts nothing */
    T_EQ_INT(ddo_session_trim_host_cache(f.s, true, &released), 0);
    T_EQ_U64(released, 0);
    T_NEAR(fx_metric(&f, "host_cache_trims"), 1, 0);

    /* re-created on demand through the staging account; a failure there is a clean error */
    ddo__device_inject_fault(f.dev, DDO__OP_HOST_ALLOC, 1, true, DDO_E_DEVICE_MEMORY);
    T_EQ_INT(fx_use(&f, fx_unit(&f, 1)), 0); /* loaded before the trim: no staging needed */
    T_EQ_INT(fx_use(&f, fx_unit(&f, 2)), 0);
    T_EQ_INT(ddo_session_acquire(f.s, fx_unit(&f, 3), f.stream), DDO_E_DEVICE_MEMORY);
    T_CONTAINS(ddo_session_error(f.s), "staging: allocating pinned window 1");
    ddo__session_accounts(f.s, used);
    T_EQ_U64(used[3], 0); /* the failed re-creation gave its bytes back */
    ddo__device_clear_faults(f.dev);
    for (int step = 0; step < 2; step++)
        for (int blk = 0; blk < 4; blk++)
            T_EQ_INT(fx_use(&f, fx_unit(&f, blk)), 0);
    ddo__session_accounts(f.s, used);
    T_EQ_U64(used[3], b.staging_peak);
    ddo__device_usage(f.dev, &du);
    T_EQ_U64(du.pinned_bytes, b.staging_peak);
    T_NEAR(fx_metric(&f, "staging_peak_bytes"), (double)b.staging_peak, 0);
    fx_destroy(&f);
}

/* The trim never touches the retained store or its registration. */
static void test_trim_keeps_retained(void)
{
    fx_opts o = { .blocks = 4, .slots = 3, .file = true, .cache_gb = 1, .pin = true };
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    ddo_plan_budgets b;
    T_REQUIRE(ddo_plan_budgets_get(f.plan, &b) == 0);
    uint64_t before[4], after[4], released = 0;
    ddo__device_usage_t d0, d1;
    for (int blk = 0; blk < 4; blk++)
        T_EQ_INT(fx_use(&f, fx_unit(&f, blk)), 0);
    ddo__session_accounts(f.s, before);
    T_CHECK(before[1] > 0);
    T_CHECK(before[2] > 0);
    ddo__device_usage(f.dev, &d0);
    T_EQ_INT(ddo_session_trim_host_cache(f.s, true, &released), 0);
    /* registered everything: no ring, only the bounce buffer the resident uploads used */
    T_EQ_U64(released, b.staging_windows > 0 ? b.staging_peak : DDO__BOUNCE_BYTES);
    ddo__session_accounts(f.s, after);
    T_EQ_U64(after[0], before[0]);
    T_EQ_U64(after[1], before[1]);
    T_EQ_U64(after[2], before[2]);
    T_EQ_U64(after[3], 0);
    ddo__device_usage(f.dev, &d1);
    T_EQ_U64(d1.registered_bytes, d0.registered_bytes);
    T_EQ_U64(d1.device_bytes, d0.device_bytes);
    for (int blk = 0; blk < 4; blk++)
        T_EQ_INT(fx_use(&f, fx_unit(&f, blk)), 0);
    T_EQ_INT(ddo_session_unload(f.s), 0);
    T_EQ_INT(ddo_session_reload(f.s), 0); /* resident uploads re-create the bounce buffer */
    T_EQ_INT(fx_use(&f, fx_unit(&f, 2)), 0);
    fx_destroy(&f);
}

static int progress_calls[4];
static void progress(void *user, const char *phase, uint64_t done, uint64_t total)
{
    (void)user;
    if (done > total)
        progress_calls[3]++;
    else if (strcmp(phase, "allocate") == 0)
        progress_calls[0]++;
    else if (strcmp(phase, "resident") == 0)
        progress_calls[1]++;
    else
        progress_calls[2]++;
}

static void test_progress_and_options(void)
{
    fx f;
    fx_opts o = vmm_mem;
    o.no_session = true;
    T_REQUIRE(fx_create(&f, &o) == 0);
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.progress = progress;
    so.config = f.cfg;
    memset(progress_calls, 0, sizeof(progress_calls));
    T_REQUIRE(ddo_session_create(f.plan, f.ck, f.dev, &so, &f.s) == 0);
    T_CHECK(progress_calls[0] >= 3); /* one per slot at least */
    T_EQ_INT(progress_calls[1], 2);  /* the two resident tensors */
    T_EQ_INT(progress_calls[3], 0);  /* done never exceeds total */
    ddo_session_destroy(f.s);
    /* NULL options work too; bad arguments are refused and leave *out NULL */
    T_REQUIRE(ddo_session_create(f.plan, f.ck, f.dev, NULL, &f.s) == 0);
    ddo_session_destroy(f.s);
    f.s = (ddo_session *)&f;
    T_EQ_INT(ddo_session_create(NULL, f.ck, f.dev, NULL, &f.s), DDO_E_INVALID_ARGUMENT);
    T_CHECK(f.s == NULL);
    ddo_session_destroy(NULL);
    fx_destroy(&f);
}

int main(void)
{
    T_RUN(test_create_destroy_budgets);
    T_RUN(test_states_and_hits);
    T_RUN(test_bytes_and_stable_addresses_vmm);
    T_RUN(test_linear_route);
    T_RUN(test_lease_errors);
    T_RUN(test_prefetch_declared_order_wraps);
    T_RUN(test_prefetch_learned_order);
    T_RUN(test_pass_reacquire_moves_no_window);
    T_RUN(test_reclaim_explicit);
    T_RUN(test_reclaim_pressure);
    T_RUN(test_unload_reload);
    T_RUN(test_release_host);
    T_RUN(test_error_boundary);
    T_RUN(test_file_tiers_and_change);
    T_RUN(test_retained_tiers);
    T_RUN(test_metrics_snapshot);
    T_RUN(test_nvme_baseline_route);
    T_RUN(test_nvme_per_weight_ranges);
    T_RUN(test_nvme_evicts_in_budget);
    T_RUN(test_nvme_evicts_with_prefetch);
    T_RUN(test_nvme_prefetch_in_budget);
    T_RUN(test_nvme_budget_refused);
    T_RUN(test_trim_host_cache);
    T_RUN(test_trim_keeps_retained);
    T_RUN(test_progress_and_options);
    return t_done();
}
