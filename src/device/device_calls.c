/*
 * device_calls.c - the ddo__dev_* wrappers around the device operation table
 * (see device.c for the thread-safety rule): each checks its arguments, counts
 * the call, its bytes and time, fails it when an injected fault is due,
 * accounts what it allocates, registers or maps, and records a failure's
 * detail on the device.
 */
#include "device/device_internal.h"

#include "codec/codec.h"

#include "os/thread.h"
#include <inttypes.h>
#include <stdatomic.h>
#include <string.h>

static const char *const op_names[DDO__OP_COUNT] = {
#define DDO_DEVOP_NAME_(NAME, name) #name,
    DDO_DEVICE_OPS(DDO_DEVOP_NAME_)
#undef DDO_DEVOP_NAME_
};

const char *ddo__devop_name(ddo__devop op)
{
    if ((int)op < 0 || op >= DDO__OP_COUNT)
        return "unknown";
    return op_names[op];
}

/* ---- call bookkeeping ---- */

typedef struct call {
    ddo__devop op;
    uint64_t t0;
    ddo__errbuf eb;
} call;

static void enter(ddo_device *dev, ddo__devop op, call *c)
{
    c->op = op;
    c->eb.code = 0;
    c->eb.msg[0] = '\0';
    atomic_fetch_add_explicit(&dev->stats[op][STAT_CALLS], 1, memory_order_relaxed);
    c->t0 = ddo__now_ns();
}

/* Fails the call when a fault is armed for its operation and due now. */
static int injected(ddo_device *dev, call *c)
{
    if (!atomic_load_explicit(&dev->fault_armed[c->op], memory_order_acquire))
        return 0;
    int code = 0;
    uint64_t n = 0;
    ddo__mutex_lock(&dev->fault_lock);
    fault *f = &dev->faults[c->op];
    if (f->active) {
        f->seen++;
        if (f->seen >= f->nth) {
            code = f->code;
            n = f->seen;
            if (!f->persistent) {
                f->active = false;
                atomic_store_explicit(&dev->fault_armed[c->op], 0, memory_order_release);
            }
        }
    }
    ddo__mutex_unlock(&dev->fault_lock);
    if (code == 0)
        return 0;
    return ddo__fail(&c->eb, code, "injected fault: %s call %" PRIu64, op_names[c->op], n);
}

/* Ends a call: time, bytes on success; on failure the failure count and the detail. */
static int leave(ddo_device *dev, call *c, int rc, uint64_t bytes)
{
    uint64_t dt = ddo__now_ns() - c->t0;
    atomic_fetch_add_explicit(&dev->stats[c->op][STAT_NS], dt, memory_order_relaxed);
    if (rc == 0 ||
        (rc == DDO_E_BUSY && (c->op == DDO__OP_EVENT_QUERY || c->op == DDO__OP_EVENT_ELAPSED))) {
        if (bytes)
            atomic_fetch_add_explicit(&dev->stats[c->op][STAT_BYTES], bytes, memory_order_relaxed);
        return rc;
    }
    atomic_fetch_add_explicit(&dev->stats[c->op][STAT_FAILURES], 1, memory_order_relaxed);
    if (c->eb.msg[0] == '\0')
        ddo__fail(&c->eb, rc, "%s: failed (%s)", op_names[c->op], ddo_errname(rc));
    ddo__mutex_lock(&dev->err_lock);
    dev->err.code = rc;
    memcpy(dev->err.msg, c->eb.msg, sizeof(dev->err.msg));
    ddo__mutex_unlock(&dev->err_lock);
    /* The thread's detail is the call's, whatever ran in between. */
    return ddo__fail(NULL, rc, "%s", c->eb.msg);
}

static int bad_arg(call *c, const char *what)
{
    return ddo__fail(&c->eb, DDO_E_INVALID_ARGUMENT, "%s: %s", op_names[c->op], what);
}

static int no_device(ddo__devop op)
{
    return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "%s: device is NULL", ddo__devop_name(op));
}

static bool aligned(const ddo_device *dev, uint64_t v)
{
    return v % dev->granularity == 0;
}

static void gauge_add(gauge *g, uint64_t n)
{
    g->cur += n;
    if (g->cur > g->peak)
        g->peak = g->cur;
}

static void gauge_sub(gauge *g, uint64_t n)
{
    g->cur = n > g->cur ? 0 : g->cur - n;
}

/* Records a taken object for its release; false when the table could not grow. */
static bool track(ddo_device *dev, ddo__devtab *t, gauge *g, uint64_t key, uint64_t size)
{
    ddo__mutex_lock(&dev->usage_lock);
    int rc = ddo__devtab_insert(t, key, size, NULL);
    if (rc == 0 || rc == DDO_E_INVALID_ARGUMENT)
        gauge_add(g, size);
    ddo__mutex_unlock(&dev->usage_lock);
    return rc != DDO_E_NO_MEMORY;
}

static void untrack(ddo_device *dev, ddo__devtab *t, gauge *g, uint64_t key)
{
    ddo__mutex_lock(&dev->usage_lock);
    size_t i = ddo__devtab_find(t, key);
    if (i != SIZE_MAX) {
        gauge_sub(g, t->v[i].size);
        ddo__devtab_remove_at(t, i);
    }
    ddo__mutex_unlock(&dev->usage_lock);
}

static void gauge_move(ddo_device *dev, gauge *g, uint64_t n, bool add)
{
    ddo__mutex_lock(&dev->usage_lock);
    if (add)
        gauge_add(g, n);
    else
        gauge_sub(g, n);
    ddo__mutex_unlock(&dev->usage_lock);
}

/* ---- wrappers ---- */

#define BEGIN(OP)             \
    if (dev == NULL)          \
        return no_device(OP); \
    call c;                   \
    enter(dev, OP, &c);       \
    int rc = 0

/* Runs the implementation unless an argument check failed or a fault fires. */
#define INVOKE(expr)                \
    do {                            \
        if (rc == 0)                \
            rc = injected(dev, &c); \
        if (rc == 0)                \
            rc = (expr);            \
    } while (0)

int ddo__dev_mem_info(ddo_device *dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
    BEGIN(DDO__OP_MEM_INFO);
    uint64_t f = 0, t = 0;
    INVOKE(dev->ops->mem_info(dev->st, &f, &t, &c.eb));
    if (rc == 0) {
        if (free_bytes)
            *free_bytes = f;
        if (total_bytes)
            *total_bytes = t;
    }
    return leave(dev, &c, rc, 0);
}

int ddo__dev_va_reserve(ddo_device *dev, uint64_t size, uint64_t *va)
{
    BEGIN(DDO__OP_VA_RESERVE);
    uint64_t v = 0;
    if (va == NULL)
        rc = bad_arg(&c, "va is NULL");
    else if (size == 0 || !aligned(dev, size))
        rc = ddo__fail(&c.eb, DDO_E_INVALID_ARGUMENT,
                       "va_reserve: size %" PRIu64 " is not a positive multiple of the "
                       "granularity %" PRIu64,
                       size, dev->granularity);
    INVOKE(dev->ops->va_reserve(dev->st, size, &v, &c.eb));
    if (rc == 0) {
        gauge_move(dev, &dev->va_bytes, size, true);
        *va = v;
    }
    return leave(dev, &c, rc, size);
}

int ddo__dev_va_release(ddo_device *dev, uint64_t va, uint64_t size)
{
    BEGIN(DDO__OP_VA_RELEASE);
    if (va == 0 || size == 0 || !aligned(dev, va) || !aligned(dev, size))
        rc = ddo__fail(&c.eb, DDO_E_INVALID_ARGUMENT,
                       "va_release: range 0x%" PRIx64 " + %" PRIu64 " is not a reserved range", va,
                       size);
    INVOKE(dev->ops->va_release(dev->st, va, size, &c.eb));
    if (rc == 0)
        gauge_move(dev, &dev->va_bytes, size, false);
    return leave(dev, &c, rc, size);
}

int ddo__dev_phys_create(ddo_device *dev, uint64_t size, uint64_t *handle)
{
    BEGIN(DDO__OP_PHYS_CREATE);
    uint64_t h = 0;
    if (handle == NULL)
        rc = bad_arg(&c, "handle is NULL");
    else if (size == 0 || !aligned(dev, size))
        rc = ddo__fail(&c.eb, DDO_E_INVALID_ARGUMENT,
                       "phys_create: size %" PRIu64 " is not a positive multiple of the "
                       "granularity %" PRIu64,
                       size, dev->granularity);
    INVOKE(dev->ops->phys_create(dev->st, size, &h, &c.eb));
    if (rc == 0) {
        if (track(dev, &dev->phys, &dev->device_bytes, h, size)) {
            *handle = h;
        } else {
            ddo__errbuf ignored;
            dev->ops->phys_release(dev->st, h, &ignored);
            rc = ddo__fail(&c.eb, DDO_E_NO_MEMORY, "phys_create: out of host memory");
        }
    }
    return leave(dev, &c, rc, size);
}

int ddo__dev_phys_release(ddo_device *dev, uint64_t handle)
{
    BEGIN(DDO__OP_PHYS_RELEASE);
    INVOKE(dev->ops->phys_release(dev->st, handle, &c.eb));
    if (rc == 0)
        untrack(dev, &dev->phys, &dev->device_bytes, handle);
    return leave(dev, &c, rc, 0);
}

int ddo__dev_map(ddo_device *dev, uint64_t va, uint64_t size, uint64_t handle,
                 uint64_t handle_offset)
{
    BEGIN(DDO__OP_MAP);
    if (va == 0 || size == 0 || !aligned(dev, va) || !aligned(dev, size) ||
        !aligned(dev, handle_offset))
        rc = ddo__fail(&c.eb, DDO_E_INVALID_ARGUMENT,
                       "map: 0x%" PRIx64 " + %" PRIu64 " at handle offset %" PRIu64
                       " is not aligned to the granularity %" PRIu64,
                       va, size, handle_offset, dev->granularity);
    INVOKE(dev->ops->map(dev->st, va, size, handle, handle_offset, &c.eb));
    if (rc == 0)
        gauge_move(dev, &dev->mapped_bytes, size, true);
    return leave(dev, &c, rc, size);
}

int ddo__dev_unmap(ddo_device *dev, uint64_t va, uint64_t size)
{
    BEGIN(DDO__OP_UNMAP);
    if (va == 0 || size == 0 || !aligned(dev, va) || !aligned(dev, size))
        rc = ddo__fail(&c.eb, DDO_E_INVALID_ARGUMENT,
                       "unmap: 0x%" PRIx64 " + %" PRIu64
                       " is not aligned to the granularity %" PRIu64,
                       va, size, dev->granularity);
    INVOKE(dev->ops->unmap(dev->st, va, size, &c.eb));
    if (rc == 0)
        gauge_move(dev, &dev->mapped_bytes, size, false);
    return leave(dev, &c, rc, size);
}

int ddo__dev_set_access(ddo_device *dev, uint64_t va, uint64_t size)
{
    BEGIN(DDO__OP_SET_ACCESS);
    if (va == 0 || size == 0 || !aligned(dev, va) || !aligned(dev, size))
        rc = ddo__fail(&c.eb, DDO_E_INVALID_ARGUMENT,
                       "set_access: 0x%" PRIx64 " + %" PRIu64
                       " is not aligned to the granularity %" PRIu64,
                       va, size, dev->granularity);
    INVOKE(dev->ops->set_access(dev->st, va, size, &c.eb));
    return leave(dev, &c, rc, 0);
}

int ddo__dev_mem_alloc(ddo_device *dev, uint64_t size, uint64_t *ptr)
{
    BEGIN(DDO__OP_MEM_ALLOC);
    uint64_t p = 0;
    if (ptr == NULL)
        rc = bad_arg(&c, "ptr is NULL");
    else if (size == 0)
        rc = bad_arg(&c, "size is 0");
    INVOKE(dev->ops->mem_alloc(dev->st, size, &p, &c.eb));
    if (rc == 0) {
        if (track(dev, &dev->mem, &dev->device_bytes, p, size)) {
            *ptr = p;
        } else {
            ddo__errbuf ignored;
            dev->ops->mem_free(dev->st, p, &ignored);
            rc = ddo__fail(&c.eb, DDO_E_NO_MEMORY, "mem_alloc: out of host memory");
        }
    }
    return leave(dev, &c, rc, size);
}

int ddo__dev_mem_free(ddo_device *dev, uint64_t ptr)
{
    BEGIN(DDO__OP_MEM_FREE);
    if (ptr == 0)
        return leave(dev, &c, 0, 0);
    INVOKE(dev->ops->mem_free(dev->st, ptr, &c.eb));
    if (rc == 0)
        untrack(dev, &dev->mem, &dev->device_bytes, ptr);
    return leave(dev, &c, rc, 0);
}

int ddo__dev_host_register(ddo_device *dev, void *p, size_t size)
{
    BEGIN(DDO__OP_HOST_REGISTER);
    if (p == NULL)
        rc = bad_arg(&c, "pointer is NULL");
    else if (size == 0)
        rc = bad_arg(&c, "size is 0");
    INVOKE(dev->ops->host_register(dev->st, p, size, &c.eb));
    if (rc == 0 && !track(dev, &dev->registered, &dev->registered_bytes, (uintptr_t)p, size)) {
        ddo__errbuf ignored;
        dev->ops->host_unregister(dev->st, p, &ignored);
        rc = ddo__fail(&c.eb, DDO_E_NO_MEMORY, "host_register: out of host memory");
    }
    return leave(dev, &c, rc, size);
}

int ddo__dev_host_unregister(ddo_device *dev, void *p)
{
    BEGIN(DDO__OP_HOST_UNREGISTER);
    if (p == NULL)
        rc = bad_arg(&c, "pointer is NULL");
    INVOKE(dev->ops->host_unregister(dev->st, p, &c.eb));
    if (rc == 0)
        untrack(dev, &dev->registered, &dev->registered_bytes, (uintptr_t)p);
    return leave(dev, &c, rc, 0);
}

int ddo__dev_host_alloc(ddo_device *dev, size_t size, void **p)
{
    BEGIN(DDO__OP_HOST_ALLOC);
    void *q = NULL;
    if (p == NULL)
        rc = bad_arg(&c, "out pointer is NULL");
    else if (size == 0)
        rc = bad_arg(&c, "size is 0");
    INVOKE(dev->ops->host_alloc(dev->st, size, &q, &c.eb));
    if (rc == 0) {
        if (track(dev, &dev->pinned, &dev->pinned_bytes, (uintptr_t)q, size)) {
            *p = q;
        } else {
            ddo__errbuf ignored;
            dev->ops->host_free(dev->st, q, &ignored);
            rc = ddo__fail(&c.eb, DDO_E_NO_MEMORY, "host_alloc: out of host memory");
        }
    }
    return leave(dev, &c, rc, size);
}

int ddo__dev_host_free(ddo_device *dev, void *p)
{
    BEGIN(DDO__OP_HOST_FREE);
    if (p == NULL)
        return leave(dev, &c, 0, 0);
    INVOKE(dev->ops->host_free(dev->st, p, &c.eb));
    if (rc == 0)
        untrack(dev, &dev->pinned, &dev->pinned_bytes, (uintptr_t)p);
    return leave(dev, &c, rc, 0);
}

int ddo__dev_stream_create(ddo_device *dev, int priority, void **stream)
{
    BEGIN(DDO__OP_STREAM_CREATE);
    void *s = NULL;
    if (stream == NULL)
        rc = bad_arg(&c, "stream is NULL");
    else if (priority != 0 && priority != 1)
        rc = ddo__fail(&c.eb, DDO_E_INVALID_ARGUMENT,
                       "stream_create: priority %d (expected 0 or 1)", priority);
    INVOKE(dev->ops->stream_create(dev->st, priority, &s, &c.eb));
    if (rc == 0)
        *stream = s;
    return leave(dev, &c, rc, 0);
}

int ddo__dev_stream_destroy(ddo_device *dev, void *stream)
{
    BEGIN(DDO__OP_STREAM_DESTROY);
    if (stream == NULL)
        return leave(dev, &c, 0, 0);
    INVOKE(dev->ops->stream_destroy(dev->st, stream, &c.eb));
    return leave(dev, &c, rc, 0);
}

int ddo__dev_stream_synchronize(ddo_device *dev, void *stream)
{
    BEGIN(DDO__OP_STREAM_SYNCHRONIZE);
    if (stream == NULL)
        rc = bad_arg(&c, "stream is NULL");
    INVOKE(dev->ops->stream_synchronize(dev->st, stream, &c.eb));
    return leave(dev, &c, rc, 0);
}

int ddo__dev_copy_h2d(ddo_device *dev, uint64_t dst, const void *src, size_t size, void *stream)
{
    BEGIN(DDO__OP_COPY_H2D);
    if (stream == NULL)
        rc = bad_arg(&c, "stream is NULL");
    else if (size != 0 && (dst == 0 || src == NULL))
        rc = bad_arg(&c, dst == 0 ? "destination is NULL" : "source is NULL");
    else if (size == 0)
        return leave(dev, &c, 0, 0);
    INVOKE(dev->ops->copy_h2d(dev->st, dst, src, size, stream, &c.eb));
    return leave(dev, &c, rc, size);
}

int ddo__dev_copy_peer(ddo_device *dev, uint64_t dst, ddo_device *src_dev, uint64_t src,
                       size_t size, void *stream)
{
    BEGIN(DDO__OP_COPY_PEER);
    if (stream == NULL || src_dev == NULL)
        rc = bad_arg(&c, stream == NULL ? "stream is NULL" : "source device is NULL");
    else if (src_dev->ops != dev->ops)
        rc = bad_arg(&c, "source and destination are devices of different kinds");
    else if (size != 0 && (dst == 0 || src == 0))
        rc = bad_arg(&c, dst == 0 ? "destination is NULL" : "source is NULL");
    else if (size == 0)
        return leave(dev, &c, 0, 0);
    INVOKE(dev->ops->copy_peer(dev->st, dst, src_dev->st, src, size, stream, &c.eb));
    return leave(dev, &c, rc, size);
}

int ddo__dev_copy_d2h(ddo_device *dev, void *dst, uint64_t src, size_t size)
{
    BEGIN(DDO__OP_COPY_D2H);
    if (size != 0 && (dst == NULL || src == 0))
        rc = bad_arg(&c, dst == NULL ? "destination is NULL" : "source is NULL");
    else if (size == 0)
        return leave(dev, &c, 0, 0);
    INVOKE(dev->ops->copy_d2h(dev->st, dst, src, size, &c.eb));
    return leave(dev, &c, rc, size);
}

int ddo__dev_copy_d2h_async(ddo_device *dev, void *dst, uint64_t src, size_t size, void *stream)
{
    BEGIN(DDO__OP_COPY_D2H_ASYNC);
    if (stream == NULL)
        rc = bad_arg(&c, "stream is NULL");
    else if (size != 0 && (dst == NULL || src == 0))
        rc = bad_arg(&c, dst == NULL ? "destination is NULL" : "source is NULL");
    else if (size == 0)
        return leave(dev, &c, 0, 0);
    INVOKE(dev->ops->copy_d2h_async(dev->st, dst, src, size, stream, &c.eb));
    return leave(dev, &c, rc, size);
}

int ddo__dev_event_create(ddo_device *dev, void **event)
{
    BEGIN(DDO__OP_EVENT_CREATE);
    void *e = NULL;
    if (event == NULL)
        rc = bad_arg(&c, "event is NULL");
    INVOKE(dev->ops->event_create(dev->st, &e, &c.eb));
    if (rc == 0)
        *event = e;
    return leave(dev, &c, rc, 0);
}

int ddo__dev_event_destroy(ddo_device *dev, void *event)
{
    BEGIN(DDO__OP_EVENT_DESTROY);
    if (event == NULL)
        return leave(dev, &c, 0, 0);
    INVOKE(dev->ops->event_destroy(dev->st, event, &c.eb));
    return leave(dev, &c, rc, 0);
}

int ddo__dev_event_record(ddo_device *dev, void *event, void *stream)
{
    BEGIN(DDO__OP_EVENT_RECORD);
    if (event == NULL || stream == NULL)
        rc = bad_arg(&c, event == NULL ? "event is NULL" : "stream is NULL");
    INVOKE(dev->ops->event_record(dev->st, event, stream, &c.eb));
    return leave(dev, &c, rc, 0);
}

int ddo__dev_event_query(ddo_device *dev, void *event)
{
    BEGIN(DDO__OP_EVENT_QUERY);
    if (event == NULL)
        rc = bad_arg(&c, "event is NULL");
    INVOKE(dev->ops->event_query(dev->st, event, &c.eb));
    return leave(dev, &c, rc, 0);
}

int ddo__dev_event_create_timed(ddo_device *dev, void **event)
{
    BEGIN(DDO__OP_EVENT_CREATE_TIMED);
    void *e = NULL;
    if (event == NULL)
        rc = bad_arg(&c, "event is NULL");
    INVOKE(dev->ops->event_create_timed(dev->st, &e, &c.eb));
    if (rc == 0)
        *event = e;
    return leave(dev, &c, rc, 0);
}

int ddo__dev_event_elapsed(ddo_device *dev, void *start, void *end, double *seconds)
{
    BEGIN(DDO__OP_EVENT_ELAPSED);
    if (start == NULL || end == NULL || seconds == NULL)
        rc = bad_arg(&c, seconds == NULL ? "seconds is NULL" : "event is NULL");
    INVOKE(dev->ops->event_elapsed(dev->st, start, end, seconds, &c.eb));
    return leave(dev, &c, rc, 0);
}

int ddo__dev_event_synchronize(ddo_device *dev, void *event)
{
    BEGIN(DDO__OP_EVENT_SYNCHRONIZE);
    if (event == NULL)
        rc = bad_arg(&c, "event is NULL");
    INVOKE(dev->ops->event_synchronize(dev->st, event, &c.eb));
    return leave(dev, &c, rc, 0);
}

int ddo__dev_stream_wait_event(ddo_device *dev, void *stream, void *event)
{
    BEGIN(DDO__OP_STREAM_WAIT_EVENT);
    if (event == NULL || stream == NULL)
        rc = bad_arg(&c, event == NULL ? "event is NULL" : "stream is NULL");
    INVOKE(dev->ops->stream_wait_event(dev->st, stream, event, &c.eb));
    return leave(dev, &c, rc, 0);
}

int ddo__dev_host_fn(ddo_device *dev, void *stream, ddo__host_fn fn, void *user)
{
    BEGIN(DDO__OP_HOST_FN);
    if (stream == NULL || fn == NULL)
        rc = bad_arg(&c, stream == NULL ? "stream is NULL" : "function is NULL");
    INVOKE(dev->ops->host_fn(dev->st, stream, fn, user, &c.eb));
    return leave(dev, &c, rc, 0);
}

/* True when [a, a + an) and [b, b + bn) overlap. */
static bool overlap(uint64_t a, uint64_t an, uint64_t b, uint64_t bn)
{
    return an > 0 && bn > 0 && a < b + bn && b < a + an;
}

/* Checks one descriptor of a batch and that its output overlaps no earlier descriptor's
 * output and no source of the batch. */
static int check_desc(call *c, const ddo__codec_desc *d, size_t n, size_t i)
{
    const ddo__codec_desc *x = &d[i];
    const ddo__codec_launch *l = &x->l;
    if (l->decoded_bytes > x->dst_bytes || l->coded_bytes > x->src_bytes)
        return ddo__fail(&c->eb, DDO_E_INVALID_ARGUMENT,
                         "codec_decode: tensor %zu: %" PRIu64 " coded bytes into %" PRIu64
                         " decoded bytes do not fit source %" PRIu64 " / destination %" PRIu64,
                         i, l->coded_bytes, l->decoded_bytes, x->src_bytes, x->dst_bytes);
    if (l->n_blocks > 0 && (x->src == 0 || x->dst == 0 || l->status_dev == 0 ||
                            l->status_bytes < 16 * (uint64_t)l->n_blocks))
        return ddo__fail(&c->eb, DDO_E_INVALID_ARGUMENT,
                         "codec_decode: tensor %zu: source, destination or status area missing", i);
    if (l->cta_warps != d[0].l.cta_warps)
        return ddo__fail(&c->eb, DDO_E_INVALID_ARGUMENT,
                         "codec_decode: tensor %zu: %u warps per thread block, tensor 0 %u (one "
                         "launch has one)",
                         i, l->cta_warps, d[0].l.cta_warps);
    for (size_t k = 0; k < n; k++)
        if ((k < i && overlap(x->dst, l->decoded_bytes, d[k].dst, d[k].l.decoded_bytes)) ||
            overlap(x->dst, l->decoded_bytes, d[k].src, d[k].l.coded_bytes))
            return ddo__fail(
                &c->eb, DDO_E_INVALID_ARGUMENT,
                "codec_decode: tensor %zu: its destination overlaps tensor %zu's %s", i, k,
                k < i && overlap(x->dst, l->decoded_bytes, d[k].dst, d[k].l.decoded_bytes)
                    ? "destination"
                    : "source");
    return 0;
}

int ddo__dev_codec_decode(ddo_device *dev, void *stream, const ddo__codec_desc *d, size_t n)
{
    BEGIN(DDO__OP_CODEC_DECODE);
    uint64_t bytes = 0;
    if (n == 0)
        return leave(dev, &c, 0, 0);
    if (stream == NULL || d == NULL)
        rc = bad_arg(&c, stream == NULL ? "stream is NULL" : "descriptors are NULL");
    else if (n > DDO_CODEC_BATCH_MAX)
        rc = ddo__fail(&c.eb, DDO_E_INVALID_ARGUMENT,
                       "codec_decode: %zu tensors in one batch (at most %d)", n,
                       DDO_CODEC_BATCH_MAX);
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = check_desc(&c, d, n, i);
        bytes += d[i].l.decoded_bytes;
    }
    if (rc == 0 && dev->ops->codec_decode == NULL)
        rc = ddo__fail(&c.eb, DDO_E_UNSUPPORTED, "codec_decode: device \"%s\" has no decoder",
                       dev->spec);
    INVOKE(dev->ops->codec_decode(dev->st, stream, d, n, &c.eb));
    return leave(dev, &c, rc, rc == 0 ? bytes : 0);
}
