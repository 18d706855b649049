/*
 * device.c - the public device and stream handles, and the thin wrappers
 * around the device operation table that every other module calls: argument
 * checks, per-operation counters, usage accounting and fault injection.
 *
 * Thread-safety: every ddo__dev_* wrapper may be called from any thread at
 * any time on one device (counters are atomics, usage tables and the detail
 * buffer sit behind mutexes). The public ddo_device_* / ddo_stream_* calls
 * follow the header's rule (one thread at a time per handle).
 */
#define _POSIX_C_SOURCE 200809L
#include "device.h"

#include "../codec.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { STAT_CALLS, STAT_FAILURES, STAT_BYTES, STAT_NS, STAT_COUNT };

typedef struct fault {
    uint64_t nth;  /* the call (counted from injection) that fails first */
    uint64_t seen; /* calls since injection */
    int code;
    bool persistent;
    bool active;
} fault;

typedef struct gauge {
    uint64_t cur, peak;
} gauge;

struct ddo_device {
    const ddo__device_ops *ops;
    void *st;
    char spec[32];
    ddo_device_caps caps; /* as read at creation (granularity, name) */
    uint64_t granularity;

    pthread_mutex_t err_lock;
    ddo__errbuf err;

    _Atomic uint64_t stats[DDO__OP_COUNT][STAT_COUNT];

    pthread_mutex_t fault_lock;
    _Atomic int fault_armed[DDO__OP_COUNT];
    fault faults[DDO__OP_COUNT];

    pthread_mutex_t usage_lock;
    ddo__devtab phys, mem, pinned, registered; /* key -> size, for releases */
    gauge device_bytes, pinned_bytes, registered_bytes, va_bytes, mapped_bytes;
};

struct ddo_stream {
    ddo_device *dev;
    void *native;
    bool borrowed; /* ddo_stream_wrap: the host's stream, unwrapped at destroy */
};

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

/* ---- sorted tables ---- */

static size_t lower_bound(const ddo__devtab *t, uint64_t key)
{
    size_t lo = 0, hi = t->len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid].key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

size_t ddo__devtab_find(const ddo__devtab *t, uint64_t key)
{
    size_t i = lower_bound(t, key);
    return i < t->len && t->v[i].key == key ? i : SIZE_MAX;
}

size_t ddo__devtab_floor(const ddo__devtab *t, uint64_t key)
{
    size_t i = lower_bound(t, key);
    if (i < t->len && t->v[i].key == key)
        return i;
    return i == 0 ? SIZE_MAX : i - 1;
}

int ddo__devtab_insert(ddo__devtab *t, uint64_t key, uint64_t size, void *obj)
{
    size_t i = lower_bound(t, key);
    if (i < t->len && t->v[i].key == key)
        return DDO_E_INVALID_ARGUMENT;
    if (t->len == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        ddo__devtab_entry *v = ddo__reallocarray(t->v, cap, sizeof(*v));
        if (v == NULL)
            return DDO_E_NO_MEMORY;
        t->v = v;
        t->cap = cap;
    }
    memmove(&t->v[i + 1], &t->v[i], (t->len - i) * sizeof(*t->v));
    t->v[i].key = key;
    t->v[i].size = size;
    t->v[i].obj = obj;
    t->len++;
    return 0;
}

void ddo__devtab_remove_at(ddo__devtab *t, size_t i)
{
    if (i >= t->len)
        return;
    memmove(&t->v[i], &t->v[i + 1], (t->len - i - 1) * sizeof(*t->v));
    t->len--;
}

void ddo__devtab_free(ddo__devtab *t)
{
    free(t->v);
    t->v = NULL;
    t->len = t->cap = 0;
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
    pthread_mutex_lock(&dev->fault_lock);
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
    pthread_mutex_unlock(&dev->fault_lock);
    if (code == 0)
        return 0;
    return ddo__fail(&c->eb, code, "injected fault: %s call %" PRIu64, op_names[c->op], n);
}

/* Ends a call: time, bytes on success; on failure the failure count and the detail. */
static int leave(ddo_device *dev, call *c, int rc, uint64_t bytes)
{
    uint64_t dt = ddo__now_ns() - c->t0;
    atomic_fetch_add_explicit(&dev->stats[c->op][STAT_NS], dt, memory_order_relaxed);
    if (rc == 0 || (rc == DDO_E_BUSY && c->op == DDO__OP_EVENT_QUERY)) {
        if (bytes)
            atomic_fetch_add_explicit(&dev->stats[c->op][STAT_BYTES], bytes, memory_order_relaxed);
        return rc;
    }
    atomic_fetch_add_explicit(&dev->stats[c->op][STAT_FAILURES], 1, memory_order_relaxed);
    if (c->eb.msg[0] == '\0')
        ddo__fail(&c->eb, rc, "%s: failed (%s)", op_names[c->op], ddo_errname(rc));
    pthread_mutex_lock(&dev->err_lock);
    dev->err.code = rc;
    memcpy(dev->err.msg, c->eb.msg, sizeof(dev->err.msg));
    pthread_mutex_unlock(&dev->err_lock);
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
    pthread_mutex_lock(&dev->usage_lock);
    int rc = ddo__devtab_insert(t, key, size, NULL);
    if (rc == 0 || rc == DDO_E_INVALID_ARGUMENT)
        gauge_add(g, size);
    pthread_mutex_unlock(&dev->usage_lock);
    return rc != DDO_E_NO_MEMORY;
}

static void untrack(ddo_device *dev, ddo__devtab *t, gauge *g, uint64_t key)
{
    pthread_mutex_lock(&dev->usage_lock);
    size_t i = ddo__devtab_find(t, key);
    if (i != SIZE_MAX) {
        gauge_sub(g, t->v[i].size);
        ddo__devtab_remove_at(t, i);
    }
    pthread_mutex_unlock(&dev->usage_lock);
}

static void gauge_move(ddo_device *dev, gauge *g, uint64_t n, bool add)
{
    pthread_mutex_lock(&dev->usage_lock);
    if (add)
        gauge_add(g, n);
    else
        gauge_sub(g, n);
    pthread_mutex_unlock(&dev->usage_lock);
}

/* ---- public device and stream ---- */

static bool is_cuda_spec(const char *spec)
{
    if (strcmp(spec, "cuda") == 0)
        return true;
    if (strncmp(spec, "cuda:", 5) != 0)
        return false;
    const char *d = spec + 5;
    size_t n = strlen(d);
    if (n == 0 || n > 6)
        return false;
    for (size_t i = 0; i < n; i++)
        if (d[i] < '0' || d[i] > '9')
            return false;
    return true;
}

/* The caller's options (NULL, or a struct of any released size) as the devices read them: every
 * block present and whole. */
typedef struct device_options {
    ddo_device_options o;
    ddo_cpu_options cpu;
    ddo_cuda_options cuda;
} device_options;

static int take_options(const ddo_device_options *opts, device_options *t)
{
    memset(t, 0, sizeof(*t));
    t->cpu.size = sizeof(t->cpu);
    t->cuda.size = sizeof(t->cuda);
    int rc = 0;
    if (opts != NULL)
        rc = DDO__ABI_IN(ddo_device_options, opts, &t->o);
    if (rc == 0 && t->o.cpu != NULL)
        rc = DDO__ABI_IN(ddo_cpu_options, t->o.cpu, &t->cpu);
    if (rc == 0 && t->o.cuda != NULL)
        rc = DDO__ABI_IN(ddo_cuda_options, t->o.cuda, &t->cuda);
    t->o.size = sizeof(t->o);
    t->o.cpu = &t->cpu;
    t->o.cuda = &t->cuda;
    return rc;
}

int ddo_device_create(const char *spec, const ddo_device_options *opts, ddo_device **out)
{
    if (out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_device_create: out is NULL");
    *out = NULL;
    if (spec == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_device_create: spec is NULL");
    device_options taken;
    int rc = take_options(opts, &taken);
    if (rc != 0)
        return rc;
    const ddo__device_ops *ops;
    if (strcmp(spec, "cpu") == 0) {
        ops = &ddo__device_cpu_ops;
    } else if (is_cuda_spec(spec)) {
        ops = ddo__device_cuda_ops;
        if (ops == NULL)
            return ddo__fail(NULL, DDO_E_NO_DEVICE,
                             "device \"%s\": ddo was built without CUDA support", spec);
    } else {
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "device \"%s\": unknown device (expected cpu, cuda or cuda:N)", spec);
    }

    ddo_device *dev = ddo__calloc(1, sizeof(*dev));
    if (dev == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "device \"%s\": out of host memory", spec);
    dev->ops = ops;
    snprintf(dev->spec, sizeof(dev->spec), "%s", spec);
    pthread_mutex_init(&dev->err_lock, NULL);
    pthread_mutex_init(&dev->fault_lock, NULL);
    pthread_mutex_init(&dev->usage_lock, NULL);

    ddo__errbuf eb = { 0, "" };
    rc = ops->open(spec, &taken.o, &dev->st, &eb);
    if (rc != 0)
        goto fail;
    rc = ops->caps(dev->st, &dev->caps, &eb);
    if (rc != 0) {
        ops->close(dev->st);
        goto fail;
    }
    dev->granularity = dev->caps.granularity ? dev->caps.granularity : 1;
    *out = dev;
    return 0;

fail:
    pthread_mutex_destroy(&dev->usage_lock);
    pthread_mutex_destroy(&dev->fault_lock);
    pthread_mutex_destroy(&dev->err_lock);
    free(dev);
    if (eb.msg[0] == '\0')
        return ddo__fail(NULL, rc, "device \"%s\": open failed (%s)", spec, ddo_errname(rc));
    return ddo__fail(NULL, rc, "%s", eb.msg);
}

void ddo_device_destroy(ddo_device *dev)
{
    if (dev == NULL)
        return;
    dev->ops->close(dev->st);
    ddo__devtab_free(&dev->phys);
    ddo__devtab_free(&dev->mem);
    ddo__devtab_free(&dev->pinned);
    ddo__devtab_free(&dev->registered);
    pthread_mutex_destroy(&dev->usage_lock);
    pthread_mutex_destroy(&dev->fault_lock);
    pthread_mutex_destroy(&dev->err_lock);
    free(dev);
}

int ddo_device_caps_get(ddo_device *dev, ddo_device_caps *out)
{
    if (dev == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_device_caps_get: %s is NULL",
                         dev == NULL ? "device" : "out");
    ddo_device_caps caps;
    memset(&caps, 0, sizeof(caps));
    ddo__errbuf eb = { 0, "" };
    int rc = dev->ops->caps(dev->st, &caps, &eb);
    if (rc != 0) {
        pthread_mutex_lock(&dev->err_lock);
        dev->err = eb;
        pthread_mutex_unlock(&dev->err_lock);
        return ddo__fail(NULL, rc, "%s", eb.msg);
    }
    *out = caps;
    return 0;
}

const char *ddo_device_error(const ddo_device *dev)
{
    return dev == NULL ? "" : dev->err.msg;
}

int ddo_stream_create(ddo_device *dev, ddo_stream **out)
{
    if (out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_stream_create: out is NULL");
    *out = NULL;
    if (dev == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_stream_create: device is NULL");
    ddo_stream *s = ddo__calloc(1, sizeof(*s));
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_stream_create: out of host memory");
    int rc = ddo__dev_stream_create(dev, 0, &s->native);
    if (rc != 0) {
        free(s);
        return rc;
    }
    s->dev = dev;
    *out = s;
    return 0;
}

int ddo_stream_wrap(ddo_device *dev, void *native, ddo_stream **out)
{
    if (out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_stream_wrap: out is NULL");
    *out = NULL;
    if (dev == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_stream_wrap: device is NULL");
    ddo_stream *s = ddo__calloc(1, sizeof(*s));
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_stream_wrap: out of host memory");
    ddo__errbuf eb = { 0, { 0 } };
    int rc = dev->ops->stream_wrap(dev->st, native, &s->native, &eb);
    if (rc != 0) {
        free(s);
        return ddo__fail(NULL, rc, "%s", eb.msg);
    }
    s->dev = dev;
    s->borrowed = true;
    *out = s;
    return 0;
}

void ddo_stream_destroy(ddo_stream *s)
{
    if (s == NULL)
        return;
    if (s->borrowed) {
        ddo__errbuf eb = { 0, { 0 } };
        (void)s->dev->ops->stream_unwrap(s->dev->st, s->native, &eb);
    } else {
        ddo__dev_stream_destroy(s->dev, s->native);
    }
    free(s);
}

int ddo_stream_synchronize(ddo_stream *s)
{
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_stream_synchronize: stream is NULL");
    return ddo__dev_stream_synchronize(s->dev, s->native);
}

void *ddo_stream_native(ddo_stream *s)
{
    if (s == NULL || ddo__device_is_cpu(s->dev))
        return NULL;
    return s->native;
}

void *ddo__stream_handle(const ddo_stream *s)
{
    return s == NULL ? NULL : s->native;
}

ddo_device *ddo__stream_device(const ddo_stream *s)
{
    return s == NULL ? NULL : s->dev;
}

ddo__errbuf *ddo__device_errbuf(ddo_device *dev)
{
    return dev == NULL ? NULL : &dev->err;
}

const ddo__device_ops *ddo__device_ops_of(const ddo_device *dev)
{
    return dev == NULL ? NULL : dev->ops;
}

bool ddo__device_is_cpu(const ddo_device *dev)
{
    return dev != NULL && dev->ops == &ddo__device_cpu_ops;
}

int ddo__device_cpu_throttle(ddo_device *dev, double bytes_per_s, uint64_t latency_ns)
{
    if (dev == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "cpu_throttle: device is NULL");
    ddo__errbuf eb = { 0, "" };
    int rc;
    if (!ddo__device_is_cpu(dev))
        rc = ddo__fail(&eb, DDO_E_UNSUPPORTED,
                       "device \"%s\": the copy throttle exists only on the cpu device", dev->spec);
    else
        rc = ddo__cpu_set_throttle(dev->st, bytes_per_s, latency_ns, &eb);
    if (rc != 0) {
        pthread_mutex_lock(&dev->err_lock);
        dev->err = eb;
        pthread_mutex_unlock(&dev->err_lock);
    }
    return rc;
}

/* ---- counters, usage, faults ---- */

void ddo__device_stats(const ddo_device *dev, ddo__devop_stats out[DDO__OP_COUNT])
{
    ddo_device *d = (ddo_device *)dev; /* atomic loads need a non-const object */
    for (int i = 0; i < DDO__OP_COUNT; i++) {
        out[i].calls = atomic_load_explicit(&d->stats[i][STAT_CALLS], memory_order_relaxed);
        out[i].failures = atomic_load_explicit(&d->stats[i][STAT_FAILURES], memory_order_relaxed);
        out[i].bytes = atomic_load_explicit(&d->stats[i][STAT_BYTES], memory_order_relaxed);
        out[i].ns = atomic_load_explicit(&d->stats[i][STAT_NS], memory_order_relaxed);
    }
}

void ddo__device_stats_reset(ddo_device *dev)
{
    for (int i = 0; i < DDO__OP_COUNT; i++)
        for (int j = 0; j < STAT_COUNT; j++)
            atomic_store_explicit(&dev->stats[i][j], 0, memory_order_relaxed);
}

void ddo__device_usage(const ddo_device *dev, ddo__device_usage_t *out)
{
    ddo_device *d = (ddo_device *)dev; /* the lock is not part of the device's value */
    pthread_mutex_lock(&d->usage_lock);
    out->device_bytes = d->device_bytes.cur;
    out->device_peak_bytes = d->device_bytes.peak;
    out->pinned_bytes = d->pinned_bytes.cur;
    out->pinned_peak_bytes = d->pinned_bytes.peak;
    out->registered_bytes = d->registered_bytes.cur;
    out->registered_peak_bytes = d->registered_bytes.peak;
    out->va_bytes = d->va_bytes.cur;
    out->va_peak_bytes = d->va_bytes.peak;
    out->mapped_bytes = d->mapped_bytes.cur;
    out->mapped_peak_bytes = d->mapped_bytes.peak;
    pthread_mutex_unlock(&d->usage_lock);
}

void ddo__device_inject_fault(ddo_device *dev, ddo__devop op, uint64_t nth, bool persistent,
                              int code)
{
    if (dev == NULL || (int)op < 0 || op >= DDO__OP_COUNT)
        return;
    pthread_mutex_lock(&dev->fault_lock);
    fault *f = &dev->faults[op];
    f->nth = nth;
    f->seen = 0;
    f->code = code < 0 ? code : DDO_E_DEVICE;
    f->persistent = persistent;
    f->active = nth != 0;
    atomic_store_explicit(&dev->fault_armed[op], f->active ? 1 : 0, memory_order_release);
    pthread_mutex_unlock(&dev->fault_lock);
}

void ddo__device_clear_faults(ddo_device *dev)
{
    if (dev == NULL)
        return;
    pthread_mutex_lock(&dev->fault_lock);
    for (int i = 0; i < DDO__OP_COUNT; i++) {
        dev->faults[i].active = false;
        atomic_store_explicit(&dev->fault_armed[i], 0, memory_order_release);
    }
    pthread_mutex_unlock(&dev->fault_lock);
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

int ddo__dev_codec_decode(ddo_device *dev, void *stream, uint64_t src, uint64_t src_bytes,
                          uint64_t dst, uint64_t dst_bytes, const ddo__codec_launch *desc)
{
    BEGIN(DDO__OP_CODEC_DECODE);
    if (stream == NULL || desc == NULL)
        rc = bad_arg(&c, stream == NULL ? "stream is NULL" : "launch description is NULL");
    else if (desc->decoded_bytes > dst_bytes || desc->coded_bytes > src_bytes)
        rc = ddo__fail(&c.eb, DDO_E_INVALID_ARGUMENT,
                       "codec_decode: %" PRIu64 " coded bytes into %" PRIu64
                       " decoded bytes do not fit source %" PRIu64 " / destination %" PRIu64,
                       desc->coded_bytes, desc->decoded_bytes, src_bytes, dst_bytes);
    else if (desc->n_blocks > 0 && (src == 0 || dst == 0 || desc->status_dev == 0 ||
                                    desc->status_bytes < 16 * (uint64_t)desc->n_blocks))
        rc = bad_arg(&c, "source, destination or status area missing");
    else if (desc->n_blocks == 0)
        return leave(dev, &c, 0, 0);
    else if (dev->ops->codec_decode == NULL)
        rc = ddo__fail(&c.eb, DDO_E_UNSUPPORTED, "codec_decode: device \"%s\" has no decoder",
                       dev->spec);
    INVOKE(dev->ops->codec_decode(dev->st, stream, src, src_bytes, dst, dst_bytes, desc, &c.eb));
    return leave(dev, &c, rc, rc == 0 ? desc->decoded_bytes : 0);
}
