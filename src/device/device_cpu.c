/*
 * device_cpu.c - the cpu device: host memory posing as device memory, the
 * reference implementation of the device table that every test runs on.
 *
 * Model:
 *   - A virtual range is reserved address space (PROT_NONE), aligned to the
 *     granularity. A physical handle is a memfd of whole granules, mapped
 *     once into a private "master" view; the fd is closed at once (so handles
 *     cost no file descriptors). map places the handle's pages at a reserved
 *     address (mremap of the shared view with old size 0 creates a second
 *     view of the same pages), so a handle mapped at two addresses shows the
 *     same bytes; unmap puts PROT_NONE back.
 *   - Like CUDA, a handle's memory lives while the handle or any mapping of
 *     it does: releasing a mapped handle frees nothing until the last unmap.
 *     Handles and plain allocations count against the device size.
 *   - Each stream is a FIFO run in order by its own worker thread. Copies can
 *     be throttled to a bandwidth and a per-copy latency, timed from a
 *     per-stream clock so that back-to-back copies take exactly
 *     sum(size / bandwidth + latency). Events complete when the marker queued
 *     by their latest record runs.
 *
 * Thread-safety: every operation may be called from any thread; one mutex per
 * device guards the tables and queues (copies and host functions run outside
 * it).
 *
 * This file: open, close, caps and the operation table. The memory operations
 * are in device_cpu_vmm.c, the streams in device_cpu_stream.c; what they
 * share is device_cpu.h.
 */
#include "device/device_cpu.h"

#include "os/sys.h"
#include "os/sysinfo.h"

#include "os/thread.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- open, close, caps ---- */

/* The cpu device's default size: the memory this machine has available when it opens
 * (MemAvailable, within this process's cgroup limit), CPU_DEFAULT_SIZE when the system cannot
 * tell. Fixed from then on, so that free memory is what the device has not allocated. */
static uint64_t machine_memory(void)
{
    uint64_t avail = ddo__os_available_ram_bytes(), cg = ddo__os_cgroup_memory_limit();
    if (cg > 0 && (avail == 0 || cg < avail))
        avail = cg;
    return avail > 0 ? avail : CPU_DEFAULT_SIZE;
}

static int cpu_open(const char *spec, const ddo_device_options *opts, void **st, ddo__errbuf *eb)
{
    (void)spec;
    const ddo_cpu_options *o = opts->cpu; /* never NULL (device.h) */
    uint64_t size = o->memory_bytes ? o->memory_bytes : machine_memory();
    uint64_t gran = o->granularity ? o->granularity : CPU_DEFAULT_GRANULARITY;
    if (gran % ddo__cpu_page_size() != 0)
        return ddo__fail(eb, DDO_E_CONFIG,
                         "cpu device: granularity %" PRIu64
                         " bytes is not a multiple of the page size %" PRIu64,
                         gran, ddo__cpu_page_size());
    if (!(o->bytes_per_s >= 0.0 && o->bytes_per_s < 1e300) ||
        !(o->peer_bytes_per_s >= 0.0 && o->peer_bytes_per_s < 1e300))
        return ddo__fail(eb, DDO_E_CONFIG,
                         "cpu device: copy bandwidth %g (peer %g) bytes/s is not a finite value "
                         ">= 0",
                         o->bytes_per_s, o->peer_bytes_per_s);
    cpu_dev *d = ddo__calloc(1, sizeof(*d));
    if (d == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu device: out of host memory");
    d->size = size;
    d->gran = gran;
    d->flops_per_s = o->flops_per_s > 0 ? o->flops_per_s : 0;
    d->bytes_per_s = o->bytes_per_s;
    d->peer_bytes_per_s = o->peer_bytes_per_s;
    d->latency_ns = o->copy_latency_ns;
    d->next_handle = 1;
    ddo__mutex_init(&d->lock);
    ddo__cond_init(&d->progress);
    *st = d;
    return 0;
}

static void cpu_close(void *st)
{
    cpu_dev *d = st;
    if (d == NULL)
        return;
    /* Streams drain before their workers exit. */
    ddo__mutex_lock(&d->lock);
    while (d->streams.len > 0) {
        cpu_stream *s = d->streams.v[d->streams.len - 1].obj;
        ddo__devtab_remove_at(&d->streams, d->streams.len - 1);
        s->stop = true;
        ddo__cond_signal(&s->work);
        ddo__mutex_unlock(&d->lock);
        ddo__thread_join(s->thread);
        ddo__mutex_lock(&d->lock);
        ddo__cond_destroy(&s->work);
        free(s);
    }
    for (size_t i = 0; i < d->events.len; i++)
        ddo__cpu_event_unref(d->events.v[i].obj);
    for (size_t i = 0; i < d->ranges.len; i++) {
        cpu_range *r = d->ranges.v[i].obj;
        for (size_t j = 0; j < r->pieces.len; j++)
            ddo__cpu_handle_unref(d, r->pieces.v[j].obj);
        ddo__devtab_free(&r->pieces);
        ddo__os_vm_release((void *)(uintptr_t)r->va, r->size, d->gran);
        free(r);
    }
    for (size_t i = 0; i < d->handles.len; i++)
        ddo__cpu_handle_unref(d, d->handles.v[i].obj);
    for (size_t i = 0; i < d->mems.len; i++)
        ddo__os_vm_free((void *)(uintptr_t)d->mems.v[i].key,
                        ddo__cpu_map_rounded(d->mems.v[i].size));
    for (size_t i = 0; i < d->pinned.len; i++)
        ddo__os_aligned_free((void *)(uintptr_t)d->pinned.v[i].key);
    ddo__mutex_unlock(&d->lock);
    ddo__devtab_free(&d->streams);
    ddo__devtab_free(&d->events);
    ddo__devtab_free(&d->ranges);
    ddo__devtab_free(&d->handles);
    ddo__devtab_free(&d->mems);
    ddo__devtab_free(&d->regs);
    ddo__devtab_free(&d->pinned);
    ddo__cond_destroy(&d->progress);
    ddo__mutex_destroy(&d->lock);
    free(d);
}

static int cpu_caps(void *st, ddo_device_caps *out, ddo__errbuf *eb)
{
    (void)eb;
    cpu_dev *d = st;
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "cpu (host memory posing as device memory)");
    ddo__mutex_lock(&d->lock);
    out->total_bytes = d->size;
    out->free_bytes = d->size - d->allocated;
    out->bus_bytes_per_s = d->bytes_per_s;
    ddo__mutex_unlock(&d->lock);
    out->granularity = (size_t)d->gran;
    out->vmm_supported = true;
    out->is_cpu = true;
    out->flops_per_s = d->flops_per_s;
    return 0;
}

static int cpu_mem_info(void *st, uint64_t *free_bytes, uint64_t *total_bytes, ddo__errbuf *eb)
{
    (void)eb;
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
    *free_bytes = d->size - d->allocated;
    *total_bytes = d->size;
    ddo__mutex_unlock(&d->lock);
    return 0;
}

int ddo__cpu_set_throttle(void *st, double bytes_per_s, uint64_t latency_ns, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    if (!(bytes_per_s >= 0.0 && bytes_per_s < 1e300))
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu device: copy bandwidth %g bytes/s is not a finite value >= 0",
                         bytes_per_s);
    ddo__mutex_lock(&d->lock);
    d->bytes_per_s = bytes_per_s;
    d->latency_ns = latency_ns;
    ddo__mutex_unlock(&d->lock);
    return 0;
}

const ddo__device_ops ddo__device_cpu_ops = {
    .name = "cpu",
    .open = cpu_open,
    .close = cpu_close,
    .caps = cpu_caps,
    .mem_info = cpu_mem_info,
    .va_reserve = ddo__cpu_va_reserve,
    .va_release = ddo__cpu_va_release,
    .phys_create = ddo__cpu_phys_create,
    .phys_release = ddo__cpu_phys_release,
    .map = ddo__cpu_map,
    .unmap = ddo__cpu_unmap,
    .set_access = ddo__cpu_set_access,
    .mem_alloc = ddo__cpu_mem_alloc,
    .mem_free = ddo__cpu_mem_free,
    .host_register = ddo__cpu_host_register,
    .host_unregister = ddo__cpu_host_unregister,
    .host_alloc = ddo__cpu_host_alloc,
    .host_free = ddo__cpu_host_free,
    .stream_create = ddo__cpu_stream_create,
    .stream_destroy = ddo__cpu_stream_destroy,
    .stream_synchronize = ddo__cpu_stream_synchronize,
    .copy_h2d = ddo__cpu_copy_h2d,
    .copy_d2h = ddo__cpu_copy_d2h,
    .copy_d2h_async = ddo__cpu_copy_d2h_async,
    .copy_peer = ddo__cpu_copy_peer,
    .event_create = ddo__cpu_event_create,
    .event_destroy = ddo__cpu_event_destroy,
    .event_record = ddo__cpu_event_record,
    .event_query = ddo__cpu_event_query,
    .event_synchronize = ddo__cpu_event_synchronize,
    .stream_wait_event = ddo__cpu_stream_wait_event,
    .stream_wrap = ddo__cpu_stream_wrap,
    .stream_unwrap = ddo__cpu_stream_unwrap,
    .host_fn = ddo__cpu_host_fn,
    .codec_decode = ddo__cpu_codec_decode,
    .event_create_timed = ddo__cpu_event_create, /* every cpu event takes its time */
    .event_elapsed = ddo__cpu_event_elapsed,
};
