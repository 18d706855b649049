/*
 * test_session_fault.c - fault injection through the session: every device
 * operation fails in turn (the nth call, once and from then on) during
 * setup, a few steps of leases, unload/reload and teardown. Every case must
 * end in a clean error code with a detail, a session that is either still
 * usable or cleanly refused, and nothing held afterwards except the bytes of
 * slots a failed release left unsafe (which the session reports). Then every
 * read of the checkpoint fails in turn (the source's read hook): DDO_E_IO
 * with a detail, accounts back at zero, nothing held, the session usable.
 *
 * ctest-labels: unit fault threads
 */
#include "session_fx.h"

static const int known_codes[] = { 0,
                                   DDO_E_DEVICE,
                                   DDO_E_DEVICE_MEMORY,
                                   DDO_E_STATE,
                                   DDO_E_BUSY,
                                   DDO_E_UNSAFE,
                                   DDO_E_BUDGET,
                                   DDO_E_IO,
                                   DDO_E_NO_MEMORY,
                                   FX_HOST_FAILED };

static bool clean_code(int rc)
{
    for (size_t i = 0; i < sizeof(known_codes) / sizeof(known_codes[0]); i++)
        if (rc == known_codes[i])
            return true;
    return false;
}

/* One scenario: create, two steps, unload, reload, one step. First error or 0. */
static int scenario(fx *f, ddo_session_options *so, int *stage)
{
    *stage = 0;
    int rc = ddo_session_create(f->plan, f->ck, f->dev, so, &f->s);
    if (rc != 0)
        return rc;
    *stage = 1;
    for (int step = 0; step < 2; step++) {
        for (int b = 0; b < f->o.blocks; b++) {
            size_t u = fx_unit(f, b);
            rc = ddo_session_acquire(f->s, u, f->stream);
            if (rc != 0)
                return rc;
            rc = ddo_stream_synchronize(f->stream);
            if (rc != 0) {
                rc = FX_HOST_FAILED;
            } else {
                int c = fx_check_unit(f, u, 0);
                rc = c == 0 ? 0 : c == -2 ? FX_HOST_FAILED : -1000; /* wrong bytes: never ok */
            }
            int rc2 = ddo_session_release(f->s, u, f->stream);
            if (rc != 0)
                return rc;
            if (rc2 != 0)
                return rc2;
        }
    }
    *stage = 2;
    uint64_t released = 0;
    rc = ddo_session_reclaim(f->s, &released);
    if (rc != 0)
        return rc;
    rc = ddo_session_unload(f->s);
    if (rc != 0)
        return rc;
    *stage = 3;
    rc = ddo_session_reload(f->s);
    if (rc != 0)
        return rc;
    *stage = 4;
    for (int b = 0; b < f->o.blocks; b++) {
        rc = fx_use(f, fx_unit(f, b));
        if (rc != 0)
            return rc == -100 ? -1000 : rc;
    }
    return 0;
}

/* After the fault is cleared: the session works or refuses cleanly. */
static void after_fault(fx *f)
{
    if (f->s == NULL)
        return;
    int rc = ddo_session_reload(f->s);
    if (rc != 0) {
        T_CHECK_MSG(clean_code(rc), "reload after fault: %d", rc);
        return;
    }
    for (int b = 0; b < f->o.blocks; b++) {
        size_t u = fx_unit(f, b);
        rc = ddo_session_acquire(f->s, u, f->stream);
        if (rc != 0) {
            /* refused cleanly: busy (unsafe or still-leased slots) or a state error */
            T_CHECK_MSG(rc == DDO_E_BUSY || rc == DDO_E_STATE || rc == DDO_E_UNSAFE,
                        "acquire after fault: %s (%s)", ddo_errname(rc), ddo_session_error(f->s));
            continue;
        }
        T_REQUIRE(ddo_stream_synchronize(f->stream) == 0);
        T_CHECK_MSG(fx_check_unit(f, u, 0) == 0, "bytes after fault, block %d", b);
        (void)ddo_session_release(f->s, u, f->stream);
    }
}

static bool releases_op(ddo__devop op)
{
    return op == DDO__OP_PHYS_RELEASE || op == DDO__OP_MEM_FREE || op == DDO__OP_UNMAP ||
           op == DDO__OP_VA_RELEASE || op == DDO__OP_HOST_FREE || op == DDO__OP_HOST_UNREGISTER ||
           op == DDO__OP_STREAM_SYNCHRONIZE || op == DDO__OP_EVENT_SYNCHRONIZE ||
           op == DDO__OP_STREAM_DESTROY || op == DDO__OP_EVENT_DESTROY;
}

static int cases, failures_seen;

static void run_case(const fx_opts *o, ddo__devop op, uint64_t nth, bool persistent)
{
    fx f;
    fx_opts oo = *o;
    oo.no_session = true;
    T_REQUIRE(fx_create(&f, &oo) == 0);
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f.cfg;
    ddo__device_inject_fault(f.dev, op, nth, persistent, DDO_E_DEVICE);
    int stage = 0;
    int rc = scenario(&f, &so, &stage);
    cases++;
    if (rc != 0)
        failures_seen++;
    T_CHECK_MSG(clean_code(rc), "%s nth=%llu%s: stage %d: %d %s", ddo__devop_name(op),
                (unsigned long long)nth, persistent ? " persistent" : "", stage, rc,
                ddo_last_error());
    if (rc != 0 && rc != FX_HOST_FAILED && f.s != NULL)
        T_CHECK_MSG(ddo_session_error(f.s)[0] != '\0', "%s nth=%llu: no detail",
                    ddo__devop_name(op), (unsigned long long)nth);
    if (rc != 0 && f.s == NULL)
        T_CHECK_MSG(ddo_last_error()[0] != '\0', "%s nth=%llu: no detail", ddo__devop_name(op),
                    (unsigned long long)nth);
    ddo__device_clear_faults(f.dev);
    after_fault(&f);

    /* teardown, maybe with the fault still on (persistent faults of the session's own
     * release ops; the source store keeps pages whose unregistration failed, by design) */
    if (persistent && releases_op(op) && op != DDO__OP_HOST_UNREGISTER && op != DDO__OP_HOST_FREE)
        ddo__device_inject_fault(f.dev, op, 1, true, DDO_E_DEVICE);
    uint64_t left = f.s != NULL ? ddo__session_release_all(f.s) : 0;
    ddo_session_destroy(f.s);
    f.s = NULL;
    ddo__device_clear_faults(f.dev);
    ddo__device_usage_t u;
    ddo__device_usage(f.dev, &u);
    /* what the device still holds is exactly what the session reported as unsafe */
    T_CHECK_MSG(u.device_bytes == left, "%s nth=%llu%s: device holds %llu, session reports %llu",
                ddo__devop_name(op), (unsigned long long)nth, persistent ? " persistent" : "",
                (unsigned long long)u.device_bytes, (unsigned long long)left);
    if (!releases_op(op)) {
        T_CHECK_MSG(u.device_bytes == 0 && u.pinned_bytes == 0 && u.registered_bytes == 0 &&
                        u.va_bytes == 0 && u.mapped_bytes == 0,
                    "%s nth=%llu%s: held after destroy: dev %llu pinned %llu reg %llu va %llu "
                    "mapped %llu",
                    ddo__devop_name(op), (unsigned long long)nth, persistent ? " persistent" : "",
                    (unsigned long long)u.device_bytes, (unsigned long long)u.pinned_bytes,
                    (unsigned long long)u.registered_bytes, (unsigned long long)u.va_bytes,
                    (unsigned long long)u.mapped_bytes);
    }
    /* the device itself tidies whatever a failed release left (no leak for LSan) */
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

/* Calls of every op in a clean run of the scenario. */
static void clean_counts(const fx_opts *o, uint64_t calls[DDO__OP_COUNT])
{
    fx f;
    fx_opts oo = *o;
    oo.no_session = true;
    memset(calls, 0, sizeof(uint64_t) * DDO__OP_COUNT);
    if (fx_create(&f, &oo) != 0)
        return;
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f.cfg;
    ddo__device_stats_reset(f.dev);
    int stage = 0;
    int rc = scenario(&f, &so, &stage);
    T_EQ_INT(rc, 0);
    ddo_session_destroy(f.s);
    f.s = NULL;
    ddo__devop_stats st[DDO__OP_COUNT];
    ddo__device_stats(f.dev, st);
    for (int i = 0; i < DDO__OP_COUNT; i++)
        calls[i] = st[i].calls;
    fx_destroy(&f);
}

static void sweep(const fx_opts *o)
{
    uint64_t calls[DDO__OP_COUNT];
    clean_counts(o, calls);
    static const uint64_t picks[] = { 1, 2, 3, 4, 6, 9, 14, 22, 35, 60, 100 };
    for (int op = 0; op < DDO__OP_COUNT; op++) {
        if (calls[op] == 0)
            continue;
        for (size_t k = 0; k < sizeof(picks) / sizeof(picks[0]); k++) {
            if (picks[k] > calls[op])
                break;
            run_case(o, (ddo__devop)op, picks[k], false);
            run_case(o, (ddo__devop)op, picks[k], true);
        }
        if (calls[op] > 1) {
            run_case(o, (ddo__devop)op, calls[op], false); /* the very last call */
            run_case(o, (ddo__devop)op, calls[op], true);
        }
    }
}

static void test_faults_vmm_file(void)
{
    fx_opts o = { .blocks = 3, .slots = 2, .file = true };
    sweep(&o);
}

static void test_faults_vmm_registered(void)
{
    fx_opts o = { .blocks = 3, .slots = 2, .file = true, .cache_gb = 1, .pin = true };
    sweep(&o);
}

static void test_faults_linear(void)
{
    fx_opts o = { .blocks = 3, .slots = 2, .mode = "linear_runtime" };
    sweep(&o);
}

static void test_faults_pressure_reclaim(void)
{
    fx_opts o = {
        .blocks = 2, .slots = 3, .device_bytes = 256 * DDO_MIB + 256 * 1024, .reclaim = true
    };
    sweep(&o);
}

static void test_faults_nvme(void)
{
    fx_opts o = { .blocks = 3, .slots = 2, .file = true, .mode = "vmm_runtime" };
    sweep(&o);
}

/* ---- file reads: every read of the checkpoint fails in turn, once and persistently ---- */

static int read_cases, read_failures;

static void run_read_case(const fx_opts *o, uint64_t nth, bool persistent)
{
    fx f;
    fx_opts oo = *o;
    oo.no_session = true;
    T_REQUIRE(fx_create(&f, &oo) == 0);
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f.cfg;
    ddo__source_fault_nth(nth, persistent);
    int stage = 0;
    int rc = scenario(&f, &so, &stage);
    ddo__source_fault_nth(0, false);
    read_cases++;
    if (rc != 0)
        read_failures++;
    /* a read fault is DDO_E_IO with a detail naming the file or tensor, never anything else */
    T_CHECK_MSG(rc == 0 || rc == DDO_E_IO, "read %llu%s: stage %d: %d %s", (unsigned long long)nth,
                persistent ? " persistent" : "", stage, rc, ddo_last_error());
    if (rc == DDO_E_IO) {
        const char *msg = f.s != NULL ? ddo_session_error(f.s) : ddo_last_error();
        T_CHECK_MSG(strstr(msg, "injected fault") != NULL, "read %llu: detail \"%s\"",
                    (unsigned long long)nth, msg);
    }
    /* the session is still usable (or was cleanly refused at create) */
    after_fault(&f);
    if (f.s != NULL) {
        T_EQ_U64(ddo__session_release_all(f.s), 0); /* every account back at zero */
        uint64_t used[4];
        ddo__session_accounts(f.s, used);
        T_CHECK_MSG(used[0] + used[1] + used[2] + used[3] == 0,
                    "read %llu: accounts %llu %llu %llu %llu", (unsigned long long)nth,
                    (unsigned long long)used[0], (unsigned long long)used[1],
                    (unsigned long long)used[2], (unsigned long long)used[3]);
    }
    fx_destroy(&f); /* checks the device holds nothing */
}

/* Reads of a clean run of the scenario. */
static uint64_t clean_reads(const fx_opts *o)
{
    fx f;
    fx_opts oo = *o;
    oo.no_session = true;
    if (fx_create(&f, &oo) != 0)
        return 0;
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f.cfg;
    ddo__source_fault_nth(0, false);
    int stage = 0;
    T_EQ_INT(scenario(&f, &so, &stage), 0);
    uint64_t n = ddo__source_fault_reads();
    fx_destroy(&f);
    return n;
}

static void read_sweep(const fx_opts *o, uint64_t min_reads)
{
    uint64_t reads = clean_reads(o);
    T_CHECK_MSG(reads >= min_reads, "%llu reads in a clean run", (unsigned long long)reads);
    int before = read_failures;
    for (uint64_t n = 1; n <= reads; n++) {
        run_read_case(o, n, false);
        run_read_case(o, n, true);
    }
    T_CHECK(read_failures > before); /* the faults did hit */
}

static void test_read_faults_file(void)
{
    fx_opts o = { .blocks = 3, .slots = 2, .file = true };
    read_sweep(&o, 2 + 3 * 2 * 2); /* residents once, every unit re-read every step */
}

static void test_read_faults_retained(void)
{
    fx_opts o = { .blocks = 3, .slots = 2, .file = true, .cache_gb = 1, .pin = true };
    read_sweep(&o, 2 + 6); /* residents, then the setup reads of six weights */
}

static void test_read_faults_nvme(void)
{
    fx_opts o = { .blocks = 3, .slots = 2, .file = true, .mode = "vmm_runtime" };
    read_sweep(&o, 2 + 3 * 2 * 2);
}

static void test_read_faults_linear(void)
{
    fx_opts o = { .blocks = 3, .slots = 2, .file = true, .mode = "linear_runtime" };
    read_sweep(&o, 2 + 6);
}

/* A budget too small for the plan's own slots is refused before any system call. */
static void test_budget_refuses_first(void)
{
    fx f;
    fx_opts o = { .blocks = 3, .slots = 2, .no_session = true };
    T_REQUIRE(fx_create(&f, &o) == 0);
    ddo__device_stats_reset(f.dev);
    /* the session takes the plan's figures as limits: a plan whose budgets are
     * exceeded is refused by the planner, so simulate device exhaustion instead */
    ddo__device_inject_fault(f.dev, DDO__OP_PHYS_CREATE, 2, false, DDO_E_DEVICE_MEMORY);
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f.cfg;
    ddo_session *s = NULL;
    T_EQ_INT(ddo_session_create(f.plan, f.ck, f.dev, &so, &s), DDO_E_DEVICE_MEMORY);
    T_CHECK(s == NULL);
    T_CONTAINS(ddo_last_error(), "slot 1: creating");
    ddo__device_usage_t u;
    ddo__device_usage(f.dev, &u);
    T_EQ_U64(u.device_bytes, 0);
    T_EQ_U64(u.va_bytes, 0);
    fx_destroy(&f);
}

int main(void)
{
    T_RUN(test_budget_refuses_first);
    T_RUN(test_faults_vmm_file);
    T_RUN(test_faults_vmm_registered);
    T_RUN(test_faults_linear);
    T_RUN(test_faults_pressure_reclaim);
    T_RUN(test_faults_nvme);
    T_RUN(test_read_faults_file);
    T_RUN(test_read_faults_retained);
    T_RUN(test_read_faults_nvme);
    T_RUN(test_read_faults_linear);
    fprintf(stderr, "%d fault cases, %d ended in an error\n", cases, failures_seen);
    fprintf(stderr, "%d read fault cases, %d ended in an error\n", read_cases, read_failures);
    return t_done();
}
