/*
 * test_device_fault.c - fault injection in the device wrappers: every
 * operation can be made to fail on its nth call, once or from then on; the
 * failing call has no side effect; counters count calls and failures.
 *
 * ctest-labels: unit fault
 */
#include "t.h"
#include "codec/codec.h"
#include "device/device.h"
#include "os/thread.h"

#include <stdint.h>
#include <string.h>

#define MIB  ((uint64_t)1 << 20)
#define GRAN (2 * MIB)

typedef struct fixture {
    ddo_device *dev;
    void *stream;
    void *event;
    uint64_t va; /* 2 granules reserved; the first mapped to h */
    uint64_t h;
    uint64_t buf; /* a 1 MiB plain buffer */
    unsigned char *host;
} fixture;

static bool fx_open(fixture *fx)
{
    memset(fx, 0, sizeof(*fx));
    ddo_cpu_options o_cpu = DDO_CPU_OPTIONS_INIT;
    o_cpu.memory_bytes = 64 * MIB;
    o_cpu.granularity = GRAN;
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cpu = &o_cpu;
    if (ddo_device_create("cpu", &o, &fx->dev) != 0)
        return false;
    fx->host = calloc(1, MIB);
    return fx->host != NULL && ddo__dev_stream_create(fx->dev, 1, &fx->stream) == 0 &&
           ddo__dev_event_create(fx->dev, &fx->event) == 0 &&
           ddo__dev_va_reserve(fx->dev, 2 * GRAN, &fx->va) == 0 &&
           ddo__dev_phys_create(fx->dev, GRAN, &fx->h) == 0 &&
           ddo__dev_map(fx->dev, fx->va, GRAN, fx->h, 0) == 0 &&
           ddo__dev_mem_alloc(fx->dev, MIB, &fx->buf) == 0;
}

static void fx_close(fixture *fx)
{
    ddo_device *dev = fx->dev;
    T_EQ_INT(ddo__dev_mem_free(dev, fx->buf), 0);
    T_EQ_INT(ddo__dev_unmap(dev, fx->va, GRAN), 0);
    T_EQ_INT(ddo__dev_phys_release(dev, fx->h), 0);
    T_EQ_INT(ddo__dev_va_release(dev, fx->va, 2 * GRAN), 0);
    T_EQ_INT(ddo__dev_event_destroy(dev, fx->event), 0);
    T_EQ_INT(ddo__dev_stream_destroy(dev, fx->stream), 0);
    ddo__device_usage_t u;
    ddo__device_usage(dev, &u);
    T_EQ_U64(u.device_bytes, 0);
    T_EQ_U64(u.pinned_bytes, 0);
    T_EQ_U64(u.registered_bytes, 0);
    T_EQ_U64(u.va_bytes, 0);
    T_EQ_U64(u.mapped_bytes, 0);
    ddo_device_destroy(dev);
    free(fx->host);
}

static void bump(void *user)
{
    (*(int *)user)++;
}

/* Free device memory, read past the wrappers (their counters and faults stay untouched). */
static uint64_t free_bytes(ddo_device *dev)
{
    ddo_device_caps caps;
    T_EQ_INT(ddo_device_caps_get(dev, &caps), 0);
    return caps.free_bytes;
}

/* What one exercise of an operation holds between its phases. */
typedef struct ctx {
    uint64_t v, h, p, f0;
    void *q;
    int n;
    double s;
} ctx;

/* Sets up what op needs (with other operations). */
static void prepare(fixture *fx, ddo__devop op, ctx *c)
{
    ddo_device *dev = fx->dev;
    memset(c, 0, sizeof(*c));
    c->f0 = free_bytes(dev);
    switch (op) {
    case DDO__OP_VA_RELEASE:
        T_EQ_INT(ddo__dev_va_reserve(dev, GRAN, &c->v), 0);
        break;
    case DDO__OP_PHYS_RELEASE:
        T_EQ_INT(ddo__dev_phys_create(dev, GRAN, &c->h), 0);
        break;
    case DDO__OP_UNMAP:
        T_EQ_INT(ddo__dev_map(dev, fx->va + GRAN, GRAN, fx->h, 0), 0);
        break;
    case DDO__OP_MEM_FREE:
        T_EQ_INT(ddo__dev_mem_alloc(dev, 4096, &c->p), 0);
        break;
    case DDO__OP_HOST_UNREGISTER:
        T_EQ_INT(ddo__dev_host_register(dev, fx->host, 4096), 0);
        break;
    case DDO__OP_HOST_FREE:
        T_EQ_INT(ddo__dev_host_alloc(dev, 4096, &c->q), 0);
        break;
    case DDO__OP_STREAM_DESTROY:
        T_EQ_INT(ddo__dev_stream_create(dev, 0, &c->q), 0);
        break;
    case DDO__OP_EVENT_DESTROY:
        T_EQ_INT(ddo__dev_event_create(dev, &c->q), 0);
        break;
    case DDO__OP_EVENT_ELAPSED: /* a timed event, recorded and complete */
        T_EQ_INT(ddo__dev_event_create_timed(dev, &c->q), 0);
        T_EQ_INT(ddo__dev_event_record(dev, c->q, fx->stream), 0);
        T_EQ_INT(ddo__dev_stream_synchronize(dev, fx->stream), 0);
        break;
    case DDO__OP_COPY_H2D:
        memset((void *)(uintptr_t)fx->buf, 0, 4096);
        memset(fx->host, 0x5A, 4096);
        break;
    case DDO__OP_COPY_D2H:
        memset((void *)(uintptr_t)fx->buf, 0x6B, 4096);
        memset(fx->host, 0, 4096);
        break;
    case DDO__OP_COPY_PEER: /* from another place of the device's own memory */
        memset((void *)(uintptr_t)fx->buf, 0, 4096);
        memset((void *)(uintptr_t)(fx->buf + 8192), 0x3C, 4096);
        break;
    case DDO__OP_COPY_D2H_ASYNC: /* into pinned memory of its own */
        T_EQ_INT(ddo__dev_host_alloc(dev, 4096, &c->q), 0);
        memset((void *)(uintptr_t)fx->buf, 0x6B, 4096);
        memset(c->q, 0, 4096);
        break;
    case DDO__OP_EVENT_RECORD:
        /* Behind a slow copy a recorded event is busy; one not recorded stays complete. */
        T_EQ_INT(ddo__device_cpu_throttle(dev, 50e6, 0), 0);
        T_EQ_INT(ddo__dev_copy_h2d(dev, fx->buf, fx->host, MIB, fx->stream), 0);
        break;
    default:
        break;
    }
}

/* The one call of op under test. */
static int invoke(fixture *fx, ddo__devop op, ctx *c)
{
    ddo_device *dev = fx->dev;
    uint64_t f = 0, t = 0;
    switch (op) {
    case DDO__OP_MEM_INFO:
        return ddo__dev_mem_info(dev, &f, &t);
    case DDO__OP_VA_RESERVE:
        return ddo__dev_va_reserve(dev, GRAN, &c->v);
    case DDO__OP_VA_RELEASE:
        return ddo__dev_va_release(dev, c->v, GRAN);
    case DDO__OP_PHYS_CREATE:
        return ddo__dev_phys_create(dev, GRAN, &c->h);
    case DDO__OP_PHYS_RELEASE:
        return ddo__dev_phys_release(dev, c->h);
    case DDO__OP_MAP:
        return ddo__dev_map(dev, fx->va + GRAN, GRAN, fx->h, 0);
    case DDO__OP_UNMAP:
        return ddo__dev_unmap(dev, fx->va + GRAN, GRAN);
    case DDO__OP_SET_ACCESS:
        return ddo__dev_set_access(dev, fx->va, GRAN);
    case DDO__OP_MEM_ALLOC:
        return ddo__dev_mem_alloc(dev, 4096, &c->p);
    case DDO__OP_MEM_FREE:
        return ddo__dev_mem_free(dev, c->p);
    case DDO__OP_HOST_REGISTER:
        return ddo__dev_host_register(dev, fx->host, 4096);
    case DDO__OP_HOST_UNREGISTER:
        return ddo__dev_host_unregister(dev, fx->host);
    case DDO__OP_HOST_ALLOC:
        return ddo__dev_host_alloc(dev, 4096, &c->q);
    case DDO__OP_HOST_FREE:
        return ddo__dev_host_free(dev, c->q);
    case DDO__OP_STREAM_CREATE:
        return ddo__dev_stream_create(dev, 0, &c->q);
    case DDO__OP_STREAM_DESTROY:
        return ddo__dev_stream_destroy(dev, c->q);
    case DDO__OP_STREAM_SYNCHRONIZE:
        return ddo__dev_stream_synchronize(dev, fx->stream);
    case DDO__OP_COPY_H2D:
        return ddo__dev_copy_h2d(dev, fx->buf, fx->host, 4096, fx->stream);
    case DDO__OP_COPY_D2H:
        return ddo__dev_copy_d2h(dev, fx->host, fx->buf, 4096);
    case DDO__OP_COPY_D2H_ASYNC:
        return ddo__dev_copy_d2h_async(dev, c->q, fx->buf, 4096, fx->stream);
    case DDO__OP_EVENT_CREATE:
        return ddo__dev_event_create(dev, &c->q);
    case DDO__OP_EVENT_DESTROY:
        return ddo__dev_event_destroy(dev, c->q);
    case DDO__OP_EVENT_RECORD:
        return ddo__dev_event_record(dev, fx->event, fx->stream);
    case DDO__OP_EVENT_QUERY:
        return ddo__dev_event_query(dev, fx->event);
    case DDO__OP_EVENT_SYNCHRONIZE:
        return ddo__dev_event_synchronize(dev, fx->event);
    case DDO__OP_STREAM_WAIT_EVENT:
        return ddo__dev_stream_wait_event(dev, fx->stream, fx->event);
    case DDO__OP_HOST_FN:
        return ddo__dev_host_fn(dev, fx->stream, bump, &c->n);
    case DDO__OP_CODEC_DECODE: {
        /* a one-block stream (not a valid one: the decoder flags it in the status words) */
        ddo__codec_desc d = { fx->buf,
                              1024,
                              fx->buf + 4096,
                              16,
                              { 64, 16, 16, 1, DDO_CODEC_GROUP_ELEMS, 1, 8, 4, 16,
                                fx->buf + 8192 } };
        return ddo__dev_codec_decode(dev, fx->stream, &d, 1);
    }
    case DDO__OP_EVENT_CREATE_TIMED:
        return ddo__dev_event_create_timed(dev, &c->q);
    case DDO__OP_EVENT_ELAPSED:
        c->s = -1.0;
        return ddo__dev_event_elapsed(dev, c->q, c->q, &c->s);
    case DDO__OP_COPY_PEER:
        return ddo__dev_copy_peer(dev, fx->buf, dev, fx->buf + 8192, 4096, fx->stream);
    case DDO__OP_COUNT:
        break;
    }
    return DDO_E_INTERNAL;
}

/*
 * Checks the effect of the call (rc == 0) or its absence (rc != 0: a create
 * took nothing, a release that failed can be done again, a copy wrote
 * nothing), then puts the fixture back as it was. Faults must be off. The operations
 * queued on a stream: finish_queued.
 */
static void finish_queued(fixture *fx, ddo__devop op, ctx *c, int rc)
{
    ddo_device *dev = fx->dev;
    const unsigned char *dst = (const unsigned char *)(uintptr_t)fx->buf;
    if (op != DDO__OP_COPY_D2H && op != DDO__OP_EVENT_RECORD)
        T_EQ_INT(ddo__dev_stream_synchronize(dev, fx->stream), 0);
    if (op == DDO__OP_COPY_H2D) {
        T_EQ_INT(dst[4095], rc == 0 ? 0x5A : 0);
    } else if (op == DDO__OP_COPY_PEER) {
        T_EQ_INT(dst[4095], rc == 0 ? 0x3C : 0);
    } else if (op == DDO__OP_COPY_D2H) {
        T_EQ_INT(fx->host[4095], rc == 0 ? 0x6B : 0);
    } else if (op == DDO__OP_COPY_D2H_ASYNC) {
        T_EQ_INT(((const unsigned char *)c->q)[4095], rc == 0 ? 0x6B : 0);
        T_EQ_INT(ddo__dev_host_free(dev, c->q), 0);
    } else if (op == DDO__OP_EVENT_RECORD) {
        T_EQ_INT(ddo__dev_event_query(dev, fx->event), rc == 0 ? DDO_E_BUSY : 0);
        T_EQ_INT(ddo__dev_stream_synchronize(dev, fx->stream), 0);
        T_EQ_INT(ddo__device_cpu_throttle(dev, 0, 0), 0);
        T_EQ_INT(ddo__dev_event_query(dev, fx->event), 0);
    } else if (op == DDO__OP_HOST_FN) {
        T_EQ_INT(c->n, rc == 0 ? 1 : 0);
    }
}

static void finish(fixture *fx, ddo__devop op, ctx *c, int rc)
{
    ddo_device *dev = fx->dev;
    switch (op) {
    case DDO__OP_VA_RESERVE:
        if (rc == 0)
            T_EQ_INT(ddo__dev_va_release(dev, c->v, GRAN), 0);
        break;
    case DDO__OP_VA_RELEASE:
    case DDO__OP_PHYS_RELEASE:
    case DDO__OP_UNMAP:
    case DDO__OP_MEM_FREE:
    case DDO__OP_HOST_UNREGISTER:
    case DDO__OP_HOST_FREE:
    case DDO__OP_EVENT_DESTROY:
        if (op == DDO__OP_UNMAP && rc != 0) /* still mapped */
            T_EQ_INT(ddo__dev_set_access(dev, fx->va + GRAN, GRAN), 0);
        if (op == DDO__OP_EVENT_DESTROY && rc != 0) /* still an event */
            T_EQ_INT(ddo__dev_event_query(dev, c->q), 0);
        if (rc != 0) /* the release did not happen: doing it now works */
            T_EQ_INT(invoke(fx, op, c), 0);
        break;
    case DDO__OP_PHYS_CREATE:
        if (rc == 0)
            T_EQ_INT(ddo__dev_phys_release(dev, c->h), 0);
        break;
    case DDO__OP_MAP:
        if (rc == 0)
            T_EQ_INT(ddo__dev_unmap(dev, fx->va + GRAN, GRAN), 0);
        else /* nothing was mapped */
            T_EQ_INT(ddo__dev_set_access(dev, fx->va + GRAN, GRAN), DDO_E_INVALID_ARGUMENT);
        break;
    case DDO__OP_MEM_ALLOC:
        if (rc == 0)
            T_EQ_INT(ddo__dev_mem_free(dev, c->p), 0);
        break;
    case DDO__OP_HOST_REGISTER:
        if (rc != 0) /* not registered: registering now works */
            T_EQ_INT(invoke(fx, op, c), 0);
        T_EQ_INT(ddo__dev_host_unregister(dev, fx->host), 0);
        break;
    case DDO__OP_HOST_ALLOC:
        if (rc == 0)
            T_EQ_INT(ddo__dev_host_free(dev, c->q), 0);
        break;
    case DDO__OP_STREAM_CREATE:
        if (rc == 0)
            T_EQ_INT(ddo__dev_stream_destroy(dev, c->q), 0);
        break;
    case DDO__OP_STREAM_DESTROY:
        if (rc != 0) { /* still a working stream */
            T_EQ_INT(ddo__dev_host_fn(dev, c->q, bump, &c->n), 0);
            T_EQ_INT(ddo__dev_stream_synchronize(dev, c->q), 0);
            T_EQ_INT(c->n, 1);
            T_EQ_INT(invoke(fx, op, c), 0);
        }
        break;
    case DDO__OP_COPY_H2D:
    case DDO__OP_COPY_D2H:
    case DDO__OP_COPY_D2H_ASYNC:
    case DDO__OP_COPY_PEER:
    case DDO__OP_EVENT_RECORD:
    case DDO__OP_HOST_FN:
    case DDO__OP_CODEC_DECODE:
        finish_queued(fx, op, c, rc);
        break;
    case DDO__OP_EVENT_CREATE:
    case DDO__OP_EVENT_CREATE_TIMED:
        if (rc == 0)
            T_EQ_INT(ddo__dev_event_destroy(dev, c->q), 0);
        break;
    case DDO__OP_EVENT_ELAPSED: /* one event against itself: no time; untouched on a fault */
        T_CHECK(rc == 0 ? c->s == 0.0 : c->s == -1.0);
        T_EQ_INT(ddo__dev_event_destroy(dev, c->q), 0);
        break;
    default:
        break;
    }
    /* Device memory is back where it was. */
    T_EQ_U64(free_bytes(dev), c->f0);
}

/* The device's detail and code right after the call under test. */
static char seen_msg[DDO_ERRBUF_BYTES];
static int seen_code;

static int exercise(fixture *fx, ddo__devop op)
{
    ctx c;
    prepare(fx, op, &c);
    int rc = invoke(fx, op, &c);
    snprintf(seen_msg, sizeof(seen_msg), "%s", ddo_device_error(fx->dev));
    seen_code = ddo__device_errbuf(fx->dev)->code;
    ddo__device_clear_faults(fx->dev);
    finish(fx, op, &c, rc);
    return rc;
}

/* Every operation fails once on its first call, then works; the detail names it. */
static void test_each_op_once(void)
{
    fixture fx;
    T_REQUIRE(fx_open(&fx));
    for (int i = 0; i < DDO__OP_COUNT; i++) {
        ddo__devop op = (ddo__devop)i;
        char want[128];
        snprintf(want, sizeof(want), "injected fault: %s call 1", ddo__devop_name(op));
        ddo__device_stats_reset(fx.dev);
        ddo__device_inject_fault(fx.dev, op, 1, false, DDO_E_DEVICE);
        int rc = exercise(&fx, op);
        T_CHECK_MSG(rc == DDO_E_DEVICE, "%s returned %d", ddo__devop_name(op), rc);
        T_EQ_STR(seen_msg, want);
        T_EQ_INT(seen_code, DDO_E_DEVICE);
        rc = exercise(&fx, op);
        T_CHECK_MSG(rc == 0, "%s returned %d after the fault: %s", ddo__devop_name(op), rc,
                    ddo_last_error());
        ddo__devop_stats st[DDO__OP_COUNT];
        ddo__device_stats(fx.dev, st);
        T_CHECK_MSG(st[op].failures == 1, "%s: %llu failures", ddo__devop_name(op),
                    (unsigned long long)st[op].failures);
        T_CHECK(st[op].calls >= 2);
    }
    fx_close(&fx);
}

/* Every operation fails from its second call on, every time, until cleared. */
static void test_each_op_persistent(void)
{
    fixture fx;
    T_REQUIRE(fx_open(&fx));
    for (int i = 0; i < DDO__OP_COUNT; i++) {
        ddo__devop op = (ddo__devop)i;
        ddo__device_inject_fault(fx.dev, op, 2, true, DDO_E_DEVICE_MEMORY);
        ctx c;
        prepare(&fx, op, &c);
        T_CHECK_MSG(invoke(&fx, op, &c) == 0, "%s: first call failed", ddo__devop_name(op));
        /* finish() would undo with a call of op that must not fail yet: suspend the fault. */
        ddo__device_inject_fault(fx.dev, op, 0, false, 0);
        finish(&fx, op, &c, 0);
        ddo__device_inject_fault(fx.dev, op, 1, true, DDO_E_DEVICE_MEMORY);
        prepare(&fx, op, &c);
        for (int k = 1; k <= 3; k++) {
            char want[128];
            snprintf(want, sizeof(want), "injected fault: %s call %d", ddo__devop_name(op), k);
            T_EQ_INT(invoke(&fx, op, &c), DDO_E_DEVICE_MEMORY);
            T_EQ_STR(ddo_device_error(fx.dev), want);
        }
        ddo__device_clear_faults(fx.dev);
        finish(&fx, op, &c, DDO_E_DEVICE_MEMORY);
    }
    fx_close(&fx);
}

/* nth counts calls from the injection; persistent keeps failing; clear stops it. */
static void test_nth_and_persistent(void)
{
    fixture fx;
    T_REQUIRE(fx_open(&fx));
    ddo_device *dev = fx.dev;
    ddo__device_stats_reset(dev);
    uint64_t h[4] = { 0 };

    ddo__device_inject_fault(dev, DDO__OP_PHYS_CREATE, 3, false, DDO_E_DEVICE_MEMORY);
    T_EQ_INT(ddo__dev_phys_create(dev, GRAN, &h[0]), 0);
    T_EQ_INT(ddo__dev_phys_create(dev, GRAN, &h[1]), 0);
    uint64_t untouched = 12345;
    T_EQ_INT(ddo__dev_phys_create(dev, GRAN, &untouched), DDO_E_DEVICE_MEMORY);
    T_EQ_U64(untouched, 12345); /* out-parameter written only on success */
    T_EQ_STR(ddo_device_error(dev), "injected fault: phys_create call 3");
    T_EQ_STR(ddo_last_error(), "injected fault: phys_create call 3");
    T_EQ_INT(ddo__dev_phys_create(dev, GRAN, &h[2]), 0);
    ddo__device_usage_t u;
    ddo__device_usage(dev, &u);
    T_EQ_U64(u.device_bytes, 4 * GRAN + MIB); /* fixture: one granule and 1 MiB */

    ddo__device_inject_fault(dev, DDO__OP_PHYS_RELEASE, 2, true, DDO_E_UNSAFE);
    T_EQ_INT(ddo__dev_phys_release(dev, h[0]), 0);
    T_EQ_INT(ddo__dev_phys_release(dev, h[1]), DDO_E_UNSAFE);
    T_EQ_INT(ddo__dev_phys_release(dev, h[2]), DDO_E_UNSAFE);
    T_EQ_STR(ddo_device_error(dev), "injected fault: phys_release call 3");
    ddo__device_usage(dev, &u);
    T_EQ_U64(u.device_bytes, 3 * GRAN + MIB); /* a failed release keeps its bytes */
    ddo__device_clear_faults(dev);
    T_EQ_INT(ddo__dev_phys_release(dev, h[1]), 0);
    T_EQ_INT(ddo__dev_phys_release(dev, h[2]), 0);

    /* nth == 0 disarms. */
    ddo__device_inject_fault(dev, DDO__OP_MEM_INFO, 1, true, DDO_E_DEVICE);
    ddo__device_inject_fault(dev, DDO__OP_MEM_INFO, 0, false, 0);
    T_EQ_INT(ddo__dev_mem_info(dev, NULL, NULL), 0);

    ddo__devop_stats st[DDO__OP_COUNT];
    ddo__device_stats(dev, st);
    T_EQ_U64(st[DDO__OP_PHYS_CREATE].calls, 4);
    T_EQ_U64(st[DDO__OP_PHYS_CREATE].failures, 1);
    T_EQ_U64(st[DDO__OP_PHYS_CREATE].bytes, 3 * GRAN); /* successful calls only */
    T_EQ_U64(st[DDO__OP_PHYS_RELEASE].calls, 5);
    T_EQ_U64(st[DDO__OP_PHYS_RELEASE].failures, 2);
    T_EQ_U64(st[DDO__OP_MEM_INFO].calls, 1);
    T_EQ_U64(st[DDO__OP_MEM_INFO].failures, 0);
    fx_close(&fx);
}

/* Argument checks count as failed calls and never reach the device. */
static void test_argument_checks(void)
{
    fixture fx;
    T_REQUIRE(fx_open(&fx));
    ddo_device *dev = fx.dev;
    ddo__device_stats_reset(dev);
    uint64_t v = 0;
    T_EQ_INT(ddo__dev_va_reserve(dev, GRAN + 1, &v), DDO_E_INVALID_ARGUMENT);
    T_EQ_STR(ddo_device_error(dev), "va_reserve: size 2097153 is not a positive multiple of "
                                    "the granularity 2097152");
    T_EQ_INT(ddo__dev_va_reserve(dev, GRAN, NULL), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_stream_create(dev, 7, &fx.event), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_mem_info(NULL, NULL, NULL), DDO_E_INVALID_ARGUMENT);
    T_EQ_STR(ddo_last_error(), "mem_info: device is NULL");
    ddo__devop_stats st[DDO__OP_COUNT];
    ddo__device_stats(dev, st);
    T_EQ_U64(st[DDO__OP_VA_RESERVE].calls, 2);
    T_EQ_U64(st[DDO__OP_VA_RESERVE].failures, 2);
    T_EQ_U64(st[DDO__OP_STREAM_CREATE].failures, 1);
    /* An argument error is reported before an armed fault, which stays armed. */
    ddo__device_inject_fault(dev, DDO__OP_VA_RESERVE, 1, false, DDO_E_DEVICE);
    T_EQ_INT(ddo__dev_va_reserve(dev, 3, &v), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_va_reserve(dev, GRAN, &v), DDO_E_DEVICE);
    T_EQ_INT(ddo__dev_va_reserve(dev, GRAN, &v), 0);
    T_EQ_INT(ddo__dev_va_release(dev, v, GRAN), 0);
    fx_close(&fx);
}

/* Threads racing on one armed fault: exactly one call fails. */
typedef struct racer {
    ddo_device *dev;
    int failures;
} racer;

static void *race(void *user)
{
    racer *r = user;
    for (int i = 0; i < 500; i++)
        if (ddo__dev_mem_info(r->dev, NULL, NULL) != 0)
            r->failures++;
    return NULL;
}

static void test_threads(void)
{
    fixture fx;
    T_REQUIRE(fx_open(&fx));
    ddo__device_stats_reset(fx.dev);
    ddo__device_inject_fault(fx.dev, DDO__OP_MEM_INFO, 1000, false, DDO_E_DEVICE);
    enum { N = 4 };
    ddo__thread th[N];
    racer r[N];
    for (int i = 0; i < N; i++) {
        r[i].dev = fx.dev;
        r[i].failures = 0;
        T_EQ_INT(ddo__thread_create(&th[i], race, &r[i]), 0);
    }
    int total = 0;
    for (int i = 0; i < N; i++) {
        ddo__thread_join(th[i]);
        total += r[i].failures;
    }
    T_EQ_INT(total, 1);
    ddo__devop_stats st[DDO__OP_COUNT];
    ddo__device_stats(fx.dev, st);
    T_EQ_U64(st[DDO__OP_MEM_INFO].calls, N * 500);
    T_EQ_U64(st[DDO__OP_MEM_INFO].failures, 1);
    fx_close(&fx);
}

int main(void)
{
    T_RUN(test_each_op_once);
    T_RUN(test_each_op_persistent);
    T_RUN(test_nth_and_persistent);
    T_RUN(test_argument_checks);
    T_RUN(test_threads);
    return t_done();
}
