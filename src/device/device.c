/*
 * device.c - the public device and stream handles, and the thin wrappers
 * around the device operation table that every other module calls: argument
 * checks, per-operation counters, usage accounting and fault injection.
 *
 * Thread-safety: every ddo__dev_* wrapper may be called from any thread at
 * any time on one device (counters are atomics, usage tables and the detail
 * buffer sit behind mutexes). The public ddo_device_* / ddo_stream_* calls
 * follow the header's rule (one thread at a time per handle).
 *
 * This file: the public device and stream and the counter, usage and fault
 * accessors; the sorted tables are devtab.c. The wrappers and their bookkeeping (counting,
 * usage accounting, injected faults): device_calls.c.
 */
#include "device/device_internal.h"

#include "os/thread.h"
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- public device and stream ---- */

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
    ddo__device_spec ds;
    if (!ddo__device_spec_parse(spec, &ds))
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "device \"%s\": " DDO__DEVICE_SPEC_UNKNOWN,
                         spec);
    const ddo__device_ops *ops = ds.cuda ? ddo__device_cuda_ops : &ddo__device_cpu_ops;
    if (ops == NULL)
        return ddo__fail(NULL, DDO_E_NO_DEVICE, "device \"%s\": ddo was built without CUDA support",
                         spec);

    ddo_device *dev = ddo__calloc(1, sizeof(*dev));
    if (dev == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "device \"%s\": out of host memory", spec);
    dev->ops = ops;
    snprintf(dev->spec, sizeof(dev->spec), "%s", spec);
    ddo__mutex_init(&dev->err_lock);
    ddo__mutex_init(&dev->fault_lock);
    ddo__mutex_init(&dev->usage_lock);

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
    ddo__mutex_destroy(&dev->usage_lock);
    ddo__mutex_destroy(&dev->fault_lock);
    ddo__mutex_destroy(&dev->err_lock);
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
    ddo__mutex_destroy(&dev->usage_lock);
    ddo__mutex_destroy(&dev->fault_lock);
    ddo__mutex_destroy(&dev->err_lock);
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
        ddo__mutex_lock(&dev->err_lock);
        dev->err = eb;
        ddo__mutex_unlock(&dev->err_lock);
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
        ddo__mutex_lock(&dev->err_lock);
        dev->err = eb;
        ddo__mutex_unlock(&dev->err_lock);
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
    ddo__mutex_lock(&d->usage_lock);
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
    ddo__mutex_unlock(&d->usage_lock);
}

void ddo__device_inject_fault(ddo_device *dev, ddo__devop op, uint64_t nth, bool persistent,
                              int code)
{
    if (dev == NULL || (int)op < 0 || op >= DDO__OP_COUNT)
        return;
    ddo__mutex_lock(&dev->fault_lock);
    fault *f = &dev->faults[op];
    f->nth = nth;
    f->seen = 0;
    f->code = code < 0 ? code : DDO_E_DEVICE;
    f->persistent = persistent;
    f->active = nth != 0;
    atomic_store_explicit(&dev->fault_armed[op], f->active ? 1 : 0, memory_order_release);
    ddo__mutex_unlock(&dev->fault_lock);
}

void ddo__device_clear_faults(ddo_device *dev)
{
    if (dev == NULL)
        return;
    ddo__mutex_lock(&dev->fault_lock);
    for (int i = 0; i < DDO__OP_COUNT; i++) {
        dev->faults[i].active = false;
        atomic_store_explicit(&dev->fault_armed[i], 0, memory_order_release);
    }
    ddo__mutex_unlock(&dev->fault_lock);
}
