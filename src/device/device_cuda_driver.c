/*
 * device_cuda_driver.c - the CUDA driver library and its entry points
 * (bootstrap: device_cuda.c): dlopen and cuGetProcAddress, the table of entry
 * points the device takes at DDO_CU_ABI, the one mapping from CUresult to a ddo
 * error code and its messages, binding the primary context, and
 * ddo__cuda_driver_proc, which hands a host an entry point by the same rules.
 */
#include "device/device_cuda.h"

#include "os/dl.h"

#if DDO_HAVE_CUDA_H

#    include <stdarg.h>
#    include <stdio.h>
#    include <string.h>

/* The symbol table: driver name and the field it fills (all at DDO_CU_ABI). */
static const struct {
    const char *symbol;
    size_t offset;
} cu_symbols[] = {
#    define CU_SYM_(field)                       \
        {                                        \
            "cu" #field, offsetof(cu_api, field) \
        }
    CU_SYM_(GetErrorName),
    CU_SYM_(Init),
    CU_SYM_(DriverGetVersion),
    CU_SYM_(DeviceGetCount),
    CU_SYM_(DeviceGet),
    CU_SYM_(DeviceGetName),
    CU_SYM_(DeviceGetAttribute),
    CU_SYM_(DeviceTotalMem),
    CU_SYM_(DevicePrimaryCtxRetain),
    CU_SYM_(DevicePrimaryCtxRelease),
    CU_SYM_(CtxGetCurrent),
    CU_SYM_(CtxSetCurrent),
    CU_SYM_(CtxGetStreamPriorityRange),
    CU_SYM_(MemGetInfo),
    CU_SYM_(MemGetAllocationGranularity),
    CU_SYM_(MemAddressReserve),
    CU_SYM_(MemAddressFree),
    CU_SYM_(MemCreate),
    CU_SYM_(MemRelease),
    CU_SYM_(MemMap),
    CU_SYM_(MemUnmap),
    CU_SYM_(MemSetAccess),
    CU_SYM_(MemAlloc),
    CU_SYM_(MemFree),
    CU_SYM_(MemHostRegister),
    CU_SYM_(MemHostUnregister),
    CU_SYM_(MemHostAlloc),
    CU_SYM_(MemFreeHost),
    CU_SYM_(StreamCreateWithPriority),
    CU_SYM_(StreamDestroy),
    CU_SYM_(StreamSynchronize),
    CU_SYM_(MemcpyHtoDAsync),
    CU_SYM_(MemcpyDtoH),
    CU_SYM_(MemcpyDtoHAsync),
    CU_SYM_(MemcpyPeerAsync),
    CU_SYM_(DeviceCanAccessPeer),
    CU_SYM_(CtxEnablePeerAccess),
    CU_SYM_(EventCreate),
    CU_SYM_(EventDestroy),
    CU_SYM_(EventRecord),
    CU_SYM_(EventQuery),
    CU_SYM_(EventSynchronize),
    CU_SYM_(EventElapsedTime),
    CU_SYM_(StreamWaitEvent),
    CU_SYM_(LaunchHostFunc),
    CU_SYM_(ModuleLoadData),
    CU_SYM_(ModuleUnload),
    CU_SYM_(ModuleGetFunction),
    CU_SYM_(LaunchKernel),
    CU_SYM_(MemsetD32Async),
#    undef CU_SYM_
};

/* The one mapping from CUresult to a ddo error code. */
int ddo__cu_code(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS:
        return 0;
    case CUDA_ERROR_OUT_OF_MEMORY:
        return DDO_E_DEVICE_MEMORY;
    case CUDA_ERROR_NOT_READY:
        return DDO_E_BUSY;
    case CUDA_ERROR_NOT_SUPPORTED: /* e.g. cuMemMap at a non-zero handle offset */
        return DDO_E_UNSUPPORTED;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
        return DDO_E_NO_DEVICE;
    default:
        return DDO_E_DEVICE;
    }
}

/* The driver's name of r ("CUDA_ERROR_OUT_OF_MEMORY"), or "CUresult N" when it has none. */
static const char *cu_name(const cuda_dev *d, CUresult r, char *buf, size_t len)
{
    const char *s = NULL;
    if (d != NULL && d->api.GetErrorName != NULL && d->api.GetErrorName(r, &s) == CUDA_SUCCESS &&
        s != NULL)
        return s;
    snprintf(buf, len, "CUresult %d", (int)r);
    return buf;
}

/*
 * Records a failed driver call: "cuMemMap: CUDA_ERROR_OUT_OF_MEMORY mapping 512.00 MiB".
 * Returns the ddo code of r.
 */

int ddo__cu_fail(const cuda_dev *d, ddo__errbuf *eb, CUresult r, const char *call, const char *fmt,
                 ...)
{
    char what[384] = "";
    if (fmt != NULL && fmt[0] != '\0') {
        va_list ap;
        va_start(ap, fmt);
        what[0] = ' ';
        vsnprintf(what + 1, sizeof(what) - 1, fmt, ap);
        va_end(ap);
        if (what[1] == '\0')
            what[0] = '\0';
    }
    char nbuf[32];
    int code = ddo__cu_code(r);
    if (code == 0)
        code = DDO_E_INTERNAL;
    return ddo__fail(eb, code, "%s: %s%s", call, cu_name(d, r, nbuf, sizeof(nbuf)), what);
}

/* Makes the device's primary context current on the calling thread. */
int ddo__cuda_bind_ctx(const cuda_dev *d, ddo__errbuf *eb)
{
    CUcontext cur = NULL;
    if (d->api.CtxGetCurrent(&cur) == CUDA_SUCCESS && cur == d->ctx)
        return 0;
    CUresult r = d->api.CtxSetCurrent(d->ctx);
    if (r != CUDA_SUCCESS)
        return ddo__cu_fail(d, eb, r, "cuCtxSetCurrent", "(primary context of cuda:%d)",
                            d->ordinal);
    return 0;
}

/* A loaded driver library and its cuGetProcAddress (the _v2 form when the driver has it). */
typedef struct cu_loader {
    void *lib;
    PFN_cuGetProcAddress_v12000 gpa2;
    PFN_cuGetProcAddress_v11030 gpa1;
} cu_loader;

/* dlopen(path) and its cuGetProcAddress, or DDO_E_NO_DEVICE with nothing left open. */
static int open_driver(const char *path, cu_loader *l, ddo__errbuf *eb)
{
    memset(l, 0, sizeof(*l));
    char why[300] = "";
    l->lib = ddo__os_lib_open(path, why, sizeof(why));
    if (l->lib == NULL)
        return ddo__fail(eb, DDO_E_NO_DEVICE, "no CUDA driver: dlopen(%s): %s", path, why);
    void *sym = ddo__os_lib_sym(l->lib, "cuGetProcAddress_v2");
    if (sym != NULL) {
        memcpy(&l->gpa2, &sym, sizeof(sym));
        return 0;
    }
    sym = ddo__os_lib_sym(l->lib, "cuGetProcAddress");
    if (sym == NULL) {
        ddo__os_lib_close(l->lib);
        l->lib = NULL;
        return ddo__fail(eb, DDO_E_NO_DEVICE,
                         "no CUDA driver: %s: no cuGetProcAddress_v2 or cuGetProcAddress "
                         "(not a CUDA driver library, or a driver older than CUDA 11.3)",
                         path);
    }
    memcpy(&l->gpa1, &sym, sizeof(sym));
    return 0;
}

/* cuGetProcAddress(symbol, version) on the legacy default stream; *status says whether the
 * driver has it (always SUCCESS from the v1 form, whose result alone says). */
static CUresult get_proc(const cu_loader *l, const char *symbol, int version, void **fn,
                         CUdriverProcAddressQueryResult *status)
{
    *status = CU_GET_PROC_ADDRESS_SUCCESS;
    if (l->gpa2 != NULL)
        return l->gpa2(symbol, fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, status);
    return l->gpa1(symbol, fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
}

/* dlopen + cuGetProcAddress: fills d->api or fails with DDO_E_NO_DEVICE (no fallback). */
int ddo__cuda_load_driver(cuda_dev *d, const char *path, ddo__errbuf *eb)
{
    snprintf(d->lib_path, sizeof(d->lib_path), "%s", path);
    cu_loader l;
    int rc = open_driver(path, &l, eb);
    if (rc != 0)
        return rc;
    d->lib = l.lib;
    for (size_t i = 0; i < DDO_ARRAY_LEN(cu_symbols); i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult status;
        CUresult r = get_proc(&l, cu_symbols[i].symbol, DDO_CU_ABI, &fn, &status);
        if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || fn == NULL) {
            char nbuf[32];
            ddo__os_lib_close(d->lib);
            d->lib = NULL;
            memset(&d->api, 0, sizeof(d->api));
            return ddo__fail(eb, DDO_E_NO_DEVICE,
                             "no CUDA driver: %s: cuGetProcAddress(%s, %d): %s (status %d); "
                             "the driver is older than CUDA %d.%d",
                             path, cu_symbols[i].symbol, DDO_CU_ABI,
                             r != CUDA_SUCCESS ? cu_name(NULL, r, nbuf, sizeof(nbuf)) : "not found",
                             (int)status, DDO_CU_ABI / 1000, DDO_CU_ABI % 1000 / 10);
        }
        memcpy((char *)&d->api + cu_symbols[i].offset, &fn, sizeof(fn));
    }
    return 0;
}

/* The driver library to load: the option, else the environment's value, else the default. */
const char *ddo__cuda_driver_path(const ddo_device_options *opts)
{
    const ddo_cuda_options *o = opts != NULL ? opts->cuda : NULL;
    const char *path = DDO_CU_LIBRARY;
    if (o != NULL && o->library_path != NULL && o->library_path[0] != '\0')
        path = o->library_path;
    else if (o != NULL && o->library_env != NULL && o->library_env[0] != '\0')
        path = o->library_env;
    return path;
}

/* ---- driver entry points for a host (ddo__cuda_driver_proc) ---- */

static const char *proc_status_text(CUdriverProcAddressQueryResult status)
{
    switch (status) {
    case CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND:
        return "the driver has no such entry point";
    case CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT:
        return "the driver is older than the version asked for";
    default:
        return "not found";
    }
}

static int driver_proc(const char *library_path, const char *symbol, int cuda_version, void **fn)
{
    /* The device's rule: the path given, else discovery (the host passes the value of
     * DDO_VMM_LIBRARY_PATH if it honours it; the library never reads the environment). */
    ddo_cuda_options c = DDO_CUDA_OPTIONS_INIT;
    c.library_path = library_path;
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cuda = &c;
    const char *path = ddo__cuda_driver_path(&o);
    cu_loader l;
    int rc = open_driver(path, &l, NULL);
    if (rc != 0)
        return rc;
    void *p = NULL;
    CUdriverProcAddressQueryResult status;
    CUresult r = get_proc(&l, symbol, cuda_version, &p, &status);
    if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || p == NULL) {
        char nbuf[32];
        ddo__os_lib_close(l.lib);
        return ddo__fail(NULL, DDO_E_NO_DEVICE, "no CUDA driver: %s: cuGetProcAddress(%s, %d): %s",
                         path, symbol, cuda_version,
                         r != CUDA_SUCCESS ? cu_name(NULL, r, nbuf, sizeof(nbuf))
                                           : proc_status_text(status));
    }
    /* The library stays loaded for the life of the process: the entry point lives in it. */
    *fn = p;
    return 0;
}

#else /* !DDO_HAVE_CUDA_H */

/* ddo__device_cuda_ops is NULL in device_cuda.c. */
static int driver_proc(const char *library_path, const char *symbol, int cuda_version, void **fn)
{
    (void)library_path, (void)cuda_version, (void)fn;
    return ddo__fail(NULL, DDO_E_NO_DEVICE, "%s: ddo was built without CUDA support", symbol);
}

#endif

int ddo__cuda_driver_proc(const char *library_path, const char *symbol, int cuda_version, void **fn)
{
    if (symbol == NULL || symbol[0] == '\0' || fn == NULL || cuda_version <= 0)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo__cuda_driver_proc: %s",
                         symbol == NULL || symbol[0] == '\0' ? "no symbol"
                         : fn == NULL                        ? "fn is NULL"
                                                             : "cuda_version <= 0");
    return driver_proc(library_path, symbol, cuda_version, fn);
}
