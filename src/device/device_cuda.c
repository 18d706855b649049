/*
 * device_cuda.c - the cuda device: the operation table of device.h on the
 * CUDA driver API, loaded at run time.
 *
 * Bootstrap (docs/cuda.md): the driver library is the explicit path
 * (ddo_cuda_options.library_path), else the value of
 * DDO_VMM_LIBRARY_PATH the host passed (library_env; the library never
 * reads the environment), else dlopen("libcuda.so.1"). A missing or invalid
 * library fails with DDO_E_NO_DEVICE and nothing else is tried. Only
 * cuGetProcAddress is taken with dlsym; every other entry point comes through
 * it at one pinned ABI version (DDO_CU_ABI), typed with the PFN_ typedefs of
 * cudaTypedefs.h, so the build needs only the CUDA headers.
 *
 * The device works in the device's primary context (shared with a PyTorch
 * host in the same process) and makes it current on every thread that calls
 * in. Every CUresult becomes a ddo error code in ddo__cu_code()/ddo__cu_fail() only.
 *
 * ddo__cuda_driver_proc hands a host the driver's entry points the same way
 * (same library, cuGetProcAddress at the version the host asks for), so a
 * host that calls the driver itself loads no second copy by its own rules.
 *
 * Thread-safety: after open the state is read-only; every operation may be
 * called from any thread.
 *
 * This file: open, close and the operation table. Loading the driver, the
 * CUresult mapping and ddo__cuda_driver_proc: device_cuda_driver.c; what the two
 * share: device_cuda.h.
 */
#include "device/device_cuda.h"

#include "codec/codec.h"

#if DDO_HAVE_CUDA_H

#    include "os/thread.h"
#    include <stdio.h>
#    include <stdlib.h>
#    include <string.h>

static double mib(uint64_t bytes)
{
    return (double)bytes / (double)DDO_MIB;
}

static void cuda_close(void *st)
{
    cuda_dev *d = st;
    if (d == NULL)
        return;
    if (d->codec_mod != NULL && d->api.CtxSetCurrent(d->ctx) == CUDA_SUCCESS)
        d->api.ModuleUnload(d->codec_mod);
    ddo__mutex_destroy(&d->codec_lock);
    ddo__mutex_destroy(&d->peer_lock);
    if (d->ctx_retained)
        d->api.DevicePrimaryCtxRelease(d->device);
    /* libcuda stays loaded for the life of the process (as the CUDA runtime does): its
     * threads and exit handlers must not lose their code under them. */
    free(d);
}

/* cuInit, then finds device d->ordinal: its handle, name and VMM support. */
/*
 * The dense bf16 (fp16 before sm_80) tensor rate a transformer's matmuls reach, estimated from
 * the SM count, the clock and the FLOP per clock per SM of the architecture (sm_70/75: 1024,
 * sm_80: 2048, sm_86/89/120: 512, sm_90: 4096, sm_100: 8192), at 60 % of that peak; 0 when an
 * attribute does not answer. The planner's cost model takes it where no profile measured one.
 * (Attributes by number: 16 MULTIPROCESSOR_COUNT, 13 CLOCK_RATE in kHz, 75/76 COMPUTE_CAPABILITY
 * MAJOR/MINOR.)
 */
static double flops_estimate(const cu_api *a, CUdevice dev)
{
    int sms = 0, khz = 0, major = 0, minor = 0;
    if (a->DeviceGetAttribute(&sms, (CUdevice_attribute)16, dev) != CUDA_SUCCESS ||
        a->DeviceGetAttribute(&khz, (CUdevice_attribute)13, dev) != CUDA_SUCCESS ||
        a->DeviceGetAttribute(&major, (CUdevice_attribute)75, dev) != CUDA_SUCCESS ||
        a->DeviceGetAttribute(&minor, (CUdevice_attribute)76, dev) != CUDA_SUCCESS)
        return 0.0;
    double per_clock = major >= 10 && major < 12  ? 8192.0
                       : major == 9               ? 4096.0
                       : major == 8 && minor == 0 ? 2048.0
                       : major == 7               ? 1024.0
                                                  : 512.0;
    return 0.6 * (double)sms * (double)khz * 1e3 * per_clock;
}

static int find_device(cuda_dev *d, const char *spec, const char *path, ddo__errbuf *eb)
{
    const cu_api *a = &d->api;
    CUresult r = a->Init(0);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuInit", "(driver %s)", path);
    a->DriverGetVersion(&d->driver_version);
    int count = 0;
    r = a->DeviceGetCount(&count);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuDeviceGetCount", "(driver %s)", path);
    if (d->ordinal >= count)
        return ddo__fail(eb, DDO_E_NO_DEVICE, "%s: no such device (%d CUDA device%s visible)", spec,
                         count, count == 1 ? "" : "s");
    r = a->DeviceGet(&d->device, d->ordinal);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuDeviceGet", "for %s", spec);
    r = a->DeviceGetName(d->name, (int)sizeof(d->name), d->device);
    if (r != CUDA_SUCCESS)
        snprintf(d->name, sizeof(d->name), "cuda:%d", d->ordinal);
    int vmm = 0;
    r = a->DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                              d->device);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuDeviceGetAttribute",
                            "(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
    d->vmm = vmm != 0;
    d->flops_estimate = flops_estimate(a, d->device);
    return 0;
}

/* With the context bound: the allocation granularity and the stream priority range. */
static int query_limits(cuda_dev *d, const char *spec, ddo__errbuf *eb)
{
    const cu_api *a = &d->api;
    CUresult r;
    d->granularity = 2 * DDO_MIB; /* nominal when VMM is unsupported (the planner's unit) */
    if (d->vmm) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof(prop));
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = d->ordinal;
        size_t g = 0;
        r = a->MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (r != CUDA_SUCCESS)
            return ddo__cu_fail(d, eb, r, "cuMemGetAllocationGranularity", "for %s", spec);
        if (g != 0)
            d->granularity = g;
    }
    r = a->CtxGetStreamPriorityRange(&d->prio_least, &d->prio_greatest);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuCtxGetStreamPriorityRange", "for %s", spec);
    return 0;
}

static int cuda_open(const char *spec, const ddo_device_options *opts, void **st, ddo__errbuf *eb)
{
    ddo__device_spec ds;
    if (!ddo__device_spec_parse(spec, &ds) || !ds.cuda)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "device \"%s\": " DDO__DEVICE_SPEC_UNKNOWN,
                         spec ? spec : "");
    int ordinal = ds.ordinal;
    const char *path = ddo__cuda_driver_path(opts);

    cuda_dev *d = ddo__calloc(1, sizeof(*d));
    if (d == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cuda:%d: out of host memory", ordinal);
    d->ordinal = ordinal;
    ddo__mutex_init(&d->codec_lock);
    ddo__mutex_init(&d->peer_lock);
    int rc = ddo__cuda_load_driver(d, path, eb);
    if (rc != 0) {
        ddo__mutex_destroy(&d->codec_lock);
        ddo__mutex_destroy(&d->peer_lock);
        free(d);
        return rc;
    }
    rc = find_device(d, spec, path, eb);
    if (rc != 0)
        goto fail;
    CUresult r = d->api.DevicePrimaryCtxRetain(&d->ctx, d->device);
    if (r != CUDA_SUCCESS) {
        rc = ddo__cu_fail(d, eb, r, "cuDevicePrimaryCtxRetain", "for %s", spec);
        goto fail;
    }
    d->ctx_retained = true;
    rc = ddo__cuda_bind_ctx(d, eb);
    if (rc != 0)
        goto fail;
    rc = query_limits(d, spec, eb);
    if (rc != 0)
        goto fail;
    *st = d;
    return 0;
fail:
    /* cuInit ran: the driver stays loaded (see cuda_close). */
    cuda_close(d);
    return rc;
}

static int cuda_mem_info(void *st, uint64_t *free_bytes, uint64_t *total_bytes, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    size_t f = 0, t = 0;
    CUresult r = d->api.MemGetInfo(&f, &t);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemGetInfo", "on cuda:%d", d->ordinal);
    *free_bytes = f;
    *total_bytes = t;
    return 0;
}

static int cuda_caps(void *st, ddo_device_caps *out, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    uint64_t f = 0, t = 0;
    int rc = cuda_mem_info(st, &f, &t, eb);
    if (rc != 0)
        return rc;
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "%s", d->name);
    out->total_bytes = t;
    out->free_bytes = f;
    out->granularity = d->granularity;
    out->vmm_supported = d->vmm;
    out->is_cpu = false;
    out->flops_per_s = d->flops_estimate;
    out->driver_version = d->driver_version;
    out->ordinal = d->ordinal;
    return 0;
}

static int need_vmm(const cuda_dev *d, ddo__errbuf *eb, const char *call)
{
    if (d->vmm)
        return 0;
    return ddo__fail(eb, DDO_E_UNSUPPORTED,
                     "%s: cuda:%d (%s) does not support virtual memory management; use "
                     "--ddo-backend linear",
                     call, d->ordinal, d->name);
}

static int cuda_va_reserve(void *st, uint64_t size, uint64_t *va, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    int rc = need_vmm(d, eb, "cuMemAddressReserve");
    if (rc != 0)
        return rc;
    BIND(d, eb);
    CUdeviceptr p = 0;
    CUresult r = d->api.MemAddressReserve(&p, (size_t)size, 0, 0, 0);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemAddressReserve", "reserving %.2f MiB", mib(size));
    *va = (uint64_t)p;
    return 0;
}

static int cuda_va_release(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.MemAddressFree((CUdeviceptr)va, (size_t)size);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemAddressFree", "freeing %.2f MiB at 0x%llx", mib(size),
                            (unsigned long long)va);
    return 0;
}

static int cuda_phys_create(void *st, uint64_t size, uint64_t *handle, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    int rc = need_vmm(d, eb, "cuMemCreate");
    if (rc != 0)
        return rc;
    if (size == 0 || size % d->granularity != 0)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cuMemCreate: %llu bytes is not a positive multiple of the granularity "
                         "(%zu bytes) of cuda:%d",
                         (unsigned long long)size, d->granularity, d->ordinal);
    BIND(d, eb);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = d->ordinal;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = d->api.MemCreate(&h, (size_t)size, &prop, 0);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemCreate", "creating %.2f MiB", mib(size));
    *handle = (uint64_t)h;
    return 0;
}

static int cuda_phys_release(void *st, uint64_t handle, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.MemRelease((CUmemGenericAllocationHandle)handle);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemRelease", "releasing handle 0x%llx",
                            (unsigned long long)handle);
    return 0;
}

static int cuda_map(void *st, uint64_t va, uint64_t size, uint64_t handle, uint64_t handle_offset,
                    ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.MemMap((CUdeviceptr)va, (size_t)size, (size_t)handle_offset,
                               (CUmemGenericAllocationHandle)handle, 0);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemMap", "mapping %.2f MiB at 0x%llx (handle offset %llu)",
                            mib(size), (unsigned long long)va, (unsigned long long)handle_offset);
    return 0;
}

static int cuda_unmap(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.MemUnmap((CUdeviceptr)va, (size_t)size);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemUnmap", "unmapping %.2f MiB at 0x%llx", mib(size),
                            (unsigned long long)va);
    return 0;
}

static int cuda_set_access(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = d->ordinal;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUresult r = d->api.MemSetAccess((CUdeviceptr)va, (size_t)size, &acc, 1);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemSetAccess", "granting read-write on %.2f MiB at 0x%llx",
                            mib(size), (unsigned long long)va);
    return 0;
}

static int cuda_mem_alloc(void *st, uint64_t size, uint64_t *ptr, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUdeviceptr p = 0;
    CUresult r = d->api.MemAlloc(&p, (size_t)size);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemAlloc", "allocating %.2f MiB", mib(size));
    *ptr = (uint64_t)p;
    return 0;
}

static int cuda_mem_free(void *st, uint64_t ptr, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.MemFree((CUdeviceptr)ptr);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemFree", "freeing 0x%llx", (unsigned long long)ptr);
    return 0;
}

static int cuda_host_register(void *st, void *p, size_t size, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.MemHostRegister(p, size, CU_MEMHOSTREGISTER_PORTABLE);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemHostRegister", "registering %.2f MiB at %p", mib(size),
                            p);
    return 0;
}

static int cuda_host_unregister(void *st, void *p, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.MemHostUnregister(p);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemHostUnregister", "unregistering %p", p);
    return 0;
}

static int cuda_host_alloc(void *st, size_t size, void **p, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    void *q = NULL;
    CUresult r = d->api.MemHostAlloc(&q, size, CU_MEMHOSTALLOC_PORTABLE);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemHostAlloc", "allocating %.2f MiB of pinned host memory",
                            mib(size));
    *p = q;
    return 0;
}

static int cuda_host_free(void *st, void *p, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.MemFreeHost(p);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemFreeHost", "freeing %p", p);
    return 0;
}

/* Priority 0 (the reference host's compute, ddo's decode stream) gets the context's highest
 * priority, 1 (ddo's copy stream) the lowest: CUDA's default priority 0 is already the
 * lowest, so a copy stream cannot go below a host stream created at the default (torch's). */
static int cuda_stream_create(void *st, int priority, void **stream, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    int prio = priority <= 0 ? d->prio_greatest : d->prio_least;
    CUstream s = NULL;
    CUresult r = d->api.StreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, prio);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuStreamCreateWithPriority", "(priority %d)", prio);
    *stream = s;
    return 0;
}

static int cuda_stream_destroy(void *st, void *stream, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.StreamDestroy((CUstream)stream);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuStreamDestroy", "on cuda:%d", d->ordinal);
    return 0;
}

/* A host's CUstream is used as it is (NULL, torch's default stream, becomes the explicit
 * CU_STREAM_LEGACY handle, since the device wrappers take NULL for "no stream"); it is the
 * host's to destroy. */
static int cuda_stream_wrap(void *st, void *native, void **stream, ddo__errbuf *eb)
{
    (void)st;
    (void)eb;
    *stream = native != NULL ? native : (void *)CU_STREAM_LEGACY;
    return 0;
}

static int cuda_stream_unwrap(void *st, void *stream, ddo__errbuf *eb)
{
    (void)st;
    (void)stream;
    (void)eb;
    return 0;
}

static int cuda_stream_synchronize(void *st, void *stream, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.StreamSynchronize((CUstream)stream);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuStreamSynchronize", "on cuda:%d", d->ordinal);
    return 0;
}

static int cuda_copy_h2d(void *st, uint64_t dst, const void *src, size_t size, void *stream,
                         ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.MemcpyHtoDAsync((CUdeviceptr)dst, src, size, (CUstream)stream);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemcpyHtoDAsync", "copying %.2f MiB to 0x%llx", mib(size),
                            (unsigned long long)dst);
    return 0;
}

/* Enables this context's access to peer's memory once per pair where the GPUs allow it; where
 * they do not, cuMemcpyPeerAsync still copies (through host memory, slower). */
static void enable_peer(cuda_dev *d, const cuda_dev *peer)
{
    if (peer == d || peer->ordinal < 0 || peer->ordinal >= 64)
        return;
    uint64_t bit = UINT64_C(1) << peer->ordinal;
    ddo__mutex_lock(&d->peer_lock);
    if ((d->peer_tried & bit) == 0) {
        d->peer_tried |= bit;
        int can = 0;
        if (d->api.DeviceCanAccessPeer(&can, d->device, peer->device) == CUDA_SUCCESS && can)
            (void)d->api.CtxEnablePeerAccess(peer->ctx, 0); /* ALREADY_ENABLED is fine too */
    }
    ddo__mutex_unlock(&d->peer_lock);
}

static int cuda_copy_peer(void *st, uint64_t dst, void *src_st, uint64_t src, size_t size,
                          void *stream, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    const cuda_dev *from = src_st;
    BIND(d, eb);
    enable_peer(d, from);
    CUresult r = d->api.MemcpyPeerAsync((CUdeviceptr)dst, d->ctx, (CUdeviceptr)src, from->ctx, size,
                                        (CUstream)stream);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(
            d, eb, r, "cuMemcpyPeerAsync", "copying %.2f MiB from cuda:%d 0x%llx to cuda:%d 0x%llx",
            mib(size), from->ordinal, (unsigned long long)src, d->ordinal, (unsigned long long)dst);
    return 0;
}

/* Synchronous on the legacy stream; ddo's streams are non-blocking, so the caller waits for
 * the work that produced src (stream or event synchronize) before calling. */
static int cuda_copy_d2h(void *st, void *dst, uint64_t src, size_t size, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.MemcpyDtoH(dst, (CUdeviceptr)src, size);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemcpyDtoH", "copying %.2f MiB from 0x%llx", mib(size),
                            (unsigned long long)src);
    return 0;
}

/* Ordered on stream; dst is pinned host memory (the caller's rule), so the copy is
 * asynchronous and never touches the legacy stream. */
static int cuda_copy_d2h_async(void *st, void *dst, uint64_t src, size_t size, void *stream,
                               ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.MemcpyDtoHAsync(dst, (CUdeviceptr)src, size, (CUstream)stream);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuMemcpyDtoHAsync", "copying %zu bytes from 0x%llx", size,
                            (unsigned long long)src);
    return 0;
}

static int event_create(cuda_dev *d, unsigned flags, void **event, ddo__errbuf *eb)
{
    BIND(d, eb);
    CUevent e = NULL;
    CUresult r = d->api.EventCreate(&e, flags);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuEventCreate", "on cuda:%d", d->ordinal);
    *event = e;
    return 0;
}

static int cuda_event_create(void *st, void **event, ddo__errbuf *eb)
{
    return event_create(st, CU_EVENT_DISABLE_TIMING, event, eb);
}

static int cuda_event_create_timed(void *st, void **event, ddo__errbuf *eb)
{
    return event_create(st, CU_EVENT_DEFAULT, event, eb);
}

static int cuda_event_elapsed(void *st, void *start, void *end, double *seconds, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    float ms = 0.0f;
    CUresult r = d->api.EventElapsedTime(&ms, (CUevent)start, (CUevent)end);
    if (r == CUDA_ERROR_NOT_READY)
        return ddo__cu_code(r); /* not a failure: no detail recorded */
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuEventElapsedTime", "on cuda:%d", d->ordinal);
    *seconds = ms > 0.0f ? (double)ms / 1e3 : 0.0;
    return 0;
}

static int cuda_event_destroy(void *st, void *event, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.EventDestroy((CUevent)event);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuEventDestroy", "on cuda:%d", d->ordinal);
    return 0;
}

static int cuda_event_record(void *st, void *event, void *stream, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.EventRecord((CUevent)event, (CUstream)stream);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuEventRecord", "on cuda:%d", d->ordinal);
    return 0;
}

static int cuda_event_query(void *st, void *event, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.EventQuery((CUevent)event);
    if (r == CUDA_SUCCESS)
        return 0;
    if (r == CUDA_ERROR_NOT_READY)
        return ddo__cu_code(r); /* not a failure: no detail recorded */
    return ddo__cu_fail(d, eb, r, "cuEventQuery", "on cuda:%d", d->ordinal);
}

static int cuda_event_synchronize(void *st, void *event, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.EventSynchronize((CUevent)event);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuEventSynchronize", "on cuda:%d", d->ordinal);
    return 0;
}

static int cuda_stream_wait_event(void *st, void *stream, void *event, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.StreamWaitEvent((CUstream)stream, (CUevent)event, 0);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuStreamWaitEvent", "on cuda:%d", d->ordinal);
    return 0;
}

static int cuda_host_fn(void *st, void *stream, ddo__host_fn fn, void *user, ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    CUresult r = d->api.LaunchHostFunc((CUstream)stream, fn, user);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuLaunchHostFunc", "on cuda:%d", d->ordinal);
    return 0;
}

#    if DDO_HAVE_CODEC_PTX
/* The fatbin of src/cuda/codec_decode.cu (generated at build time, CMakeLists.txt). */
extern const unsigned char ddo__codec_image[];
extern const size_t ddo__codec_image_bytes;

/* Loads the decoder's module once (machine code for sm_80/sm_90; on other GPUs the driver
 * compiles the image's PTX). */
static int codec_module(cuda_dev *d, ddo__errbuf *eb)
{
    ddo__mutex_lock(&d->codec_lock);
    if (d->codec_rc == 0) {
        CUresult r = d->api.ModuleLoadData(&d->codec_mod, ddo__codec_image);
        const char *call = "cuModuleLoadData";
        if (r == CUDA_SUCCESS) {
            call = "cuModuleGetFunction";
            r = d->api.ModuleGetFunction(&d->codec_fn, d->codec_mod, "ddo_codec_decode_batch");
        }
        if (r == CUDA_SUCCESS) {
            d->codec_rc = 1;
        } else {
            ddo__errbuf e = { 0, "" };
            d->codec_rc = ddo__cu_fail(d, &e, r, call, "(codec decoder, a %zu-byte image)",
                                       ddo__codec_image_bytes);
            snprintf(d->codec_err, sizeof(d->codec_err), "%s", e.msg);
        }
    }
    int rc = d->codec_rc;
    ddo__mutex_unlock(&d->codec_lock);
    if (rc == 1)
        return 0;
    return ddo__fail(eb, rc, "%s", d->codec_err);
}

/* One tensor of a batch as the kernel takes it (struct kdesc of codec_decode.cu). */
typedef struct codec_kdesc {
    uint64_t src, src_bytes, dst, dst_bytes, status, total_elems;
    uint32_t n_blocks, block_elems, esize, ctas_per_block, first_cta, pad;
} codec_kdesc;

/* The kernel's one parameter (struct kbatch): within the driver's 4 KiB of parameters. */
typedef struct codec_kbatch {
    uint32_t count, pad;
    codec_kdesc d[DDO_CODEC_BATCH_MAX];
} codec_kbatch;

_Static_assert(sizeof(codec_kdesc) == 72, "codec_kdesc must match codec_decode.cu");
_Static_assert(sizeof(codec_kbatch) <= 4096, "a batch must fit the kernel parameters");

/* The kernel's parameters for x[0, n); *grid the thread blocks of all. */
static int fill_batch(const ddo__codec_desc *x, size_t n, codec_kbatch *kb, uint64_t *grid,
                      ddo__errbuf *eb)
{
    memset(kb, 0, sizeof(*kb));
    kb->count = (uint32_t)n;
    uint64_t first = 0;
    for (size_t i = 0; i < n; i++) {
        const ddo__codec_launch *l = &x[i].l;
        if (x[i].src % 16 != 0 || x[i].dst % 16 != 0 || l->status_dev % 16 != 0 ||
            l->cta_warps == 0 || l->cta_warps > 16 || l->ctas_per_block == 0)
            return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                             "codec_decode: tensor %zu: source, destination and status must be "
                             "16-byte aligned, with 1..16 warps and at least one thread block "
                             "per coded block",
                             i);
        kb->d[i] = (codec_kdesc){ x[i].src,      x[i].src_bytes,    x[i].dst,        x[i].dst_bytes,
                                  l->status_dev, l->total_elems,    l->n_blocks,     l->block_elems,
                                  l->esize,      l->ctas_per_block, (uint32_t)first, 0 };
        first += (uint64_t)l->n_blocks * l->ctas_per_block;
        if (first > INT32_MAX)
            return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                             "codec_decode: a batch of more than 2^31 thread blocks");
    }
    *grid = first;
    return 0;
}

/* Zeroes the batch's status words: one memset per run of adjacent status areas (a session's
 * batch: one run). */
static int clear_status(cuda_dev *d, const ddo__codec_desc *x, size_t n, CUstream stream,
                        ddo__errbuf *eb)
{
    for (size_t i = 0; i < n;) {
        uint64_t at = x[i].l.status_dev, len = x[i].l.status_bytes;
        size_t k = i + 1;
        for (; k < n && x[k].l.status_dev == at + len; k++)
            len += x[k].l.status_bytes;
        CUresult r = d->api.MemsetD32Async((CUdeviceptr)at, 0, (size_t)(len / 4), stream);
        if (r != CUDA_SUCCESS)
            return ddo__cu_fail(d, eb, r, "cuMemsetD32Async", "clearing %llu status bytes",
                                (unsigned long long)len);
        i = k;
    }
    return 0;
}

static int cuda_codec_decode(void *st, void *stream, const ddo__codec_desc *x, size_t n,
                             ddo__errbuf *eb)
{
    cuda_dev *d = st;
    BIND(d, eb);
    codec_kbatch kb;
    uint64_t grid = 0;
    if (n == 0 || n > DDO_CODEC_BATCH_MAX)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "codec_decode: %zu tensors in a batch", n);
    int rc = fill_batch(x, n, &kb, &grid, eb);
    if (rc == 0)
        rc = codec_module(d, eb);
    if (rc == 0)
        rc = clear_status(d, x, n, (CUstream)stream, eb);
    if (rc != 0 || grid == 0)
        return rc;
    void *args[] = { &kb };
    CUresult r = d->api.LaunchKernel(d->codec_fn, (unsigned)grid, 1, 1, 32 * x[0].l.cta_warps, 1, 1,
                                     0, (CUstream)stream, args, NULL);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuLaunchKernel",
                            "(codec decoder, %zu tensors, %llu thread blocks)", n,
                            (unsigned long long)grid);
    return 0;
}
#    else
static int cuda_codec_decode(void *st, void *stream, const ddo__codec_desc *x, size_t n,
                             ddo__errbuf *eb)
{
    (void)st, (void)stream, (void)x, (void)n;
    return ddo__fail(eb, DDO_E_UNSUPPORTED,
                     "codec_decode: libddo was built without nvcc, so the cuda device has no "
                     "codec decoder");
}
#    endif

static const ddo__device_ops cuda_ops = {
    .name = "cuda",
    .open = cuda_open,
    .close = cuda_close,
    .caps = cuda_caps,
    .mem_info = cuda_mem_info,
    .va_reserve = cuda_va_reserve,
    .va_release = cuda_va_release,
    .phys_create = cuda_phys_create,
    .phys_release = cuda_phys_release,
    .map = cuda_map,
    .unmap = cuda_unmap,
    .set_access = cuda_set_access,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_synchronize = cuda_stream_synchronize,
    .stream_wrap = cuda_stream_wrap,
    .stream_unwrap = cuda_stream_unwrap,
    .copy_h2d = cuda_copy_h2d,
    .copy_d2h = cuda_copy_d2h,
    .copy_d2h_async = cuda_copy_d2h_async,
    .copy_peer = cuda_copy_peer,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .stream_wait_event = cuda_stream_wait_event,
    .host_fn = cuda_host_fn,
    .codec_decode = cuda_codec_decode,
    .event_create_timed = cuda_event_create_timed,
    .event_elapsed = cuda_event_elapsed,
};

const ddo__device_ops *const ddo__device_cuda_ops = &cuda_ops;

#else /* !DDO_HAVE_CUDA_H */

const ddo__device_ops *const ddo__device_cuda_ops = NULL;

#endif
