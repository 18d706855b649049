/*
 * device_cuda.h - what the two files of the cuda device share: the driver's
 * entry points (cu_api), the device's state, the context binding and the one
 * CUresult mapping. Private to device_cuda.c (open, close, the operation
 * table) and device_cuda_driver.c (loading the driver library, errors,
 * ddo__cuda_driver_proc).
 */
#ifndef DDO_DEVICE_CUDA_H
#define DDO_DEVICE_CUDA_H

#include "device/device.h"

#if DDO_HAVE_CUDA_H

#    include "os/thread.h"
#    include <cuda.h>
#    include <cudaTypedefs.h>
#    include <stdbool.h>
#    include <stddef.h>

/* Every entry point is requested as the ABI of CUDA 12.0 (the PFN_ types below match it). */
#    define DDO_CU_ABI 12000

/* The default driver library name (discovery). */
#    if defined(_WIN32)
#        define DDO_CU_LIBRARY "nvcuda.dll"
#    else
#        define DDO_CU_LIBRARY "libcuda.so.1"
#    endif

typedef struct cu_api {
    PFN_cuGetErrorName_v6000 GetErrorName;
    PFN_cuInit_v2000 Init;
    PFN_cuDriverGetVersion_v2020 DriverGetVersion;
    PFN_cuDeviceGetCount_v2000 DeviceGetCount;
    PFN_cuDeviceGet_v2000 DeviceGet;
    PFN_cuDeviceGetName_v2000 DeviceGetName;
    PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute;
    PFN_cuDeviceTotalMem_v3020 DeviceTotalMem;
    PFN_cuDevicePrimaryCtxRetain_v7000 DevicePrimaryCtxRetain;
    PFN_cuDevicePrimaryCtxRelease_v11000 DevicePrimaryCtxRelease;
    PFN_cuCtxGetCurrent_v4000 CtxGetCurrent;
    PFN_cuCtxSetCurrent_v4000 CtxSetCurrent;
    PFN_cuCtxGetStreamPriorityRange_v5050 CtxGetStreamPriorityRange;
    PFN_cuMemGetInfo_v3020 MemGetInfo;
    PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity;
    PFN_cuMemAddressReserve_v10020 MemAddressReserve;
    PFN_cuMemAddressFree_v10020 MemAddressFree;
    PFN_cuMemCreate_v10020 MemCreate;
    PFN_cuMemRelease_v10020 MemRelease;
    PFN_cuMemMap_v10020 MemMap;
    PFN_cuMemUnmap_v10020 MemUnmap;
    PFN_cuMemSetAccess_v10020 MemSetAccess;
    PFN_cuMemAlloc_v3020 MemAlloc;
    PFN_cuMemFree_v3020 MemFree;
    PFN_cuMemHostRegister_v6050 MemHostRegister;
    PFN_cuMemHostUnregister_v4000 MemHostUnregister;
    PFN_cuMemHostAlloc_v2020 MemHostAlloc;
    PFN_cuMemFreeHost_v2000 MemFreeHost;
    PFN_cuStreamCreateWithPriority_v5050 StreamCreateWithPriority;
    PFN_cuStreamDestroy_v4000 StreamDestroy;
    PFN_cuStreamSynchronize_v2000 StreamSynchronize;
    PFN_cuMemcpyHtoDAsync_v3020 MemcpyHtoDAsync;
    PFN_cuMemcpyDtoH_v3020 MemcpyDtoH;
    PFN_cuMemcpyDtoHAsync_v3020 MemcpyDtoHAsync;
    PFN_cuEventCreate_v2000 EventCreate;
    PFN_cuEventDestroy_v4000 EventDestroy;
    PFN_cuEventRecord_v2000 EventRecord;
    PFN_cuEventQuery_v2000 EventQuery;
    PFN_cuEventSynchronize_v2000 EventSynchronize;
    PFN_cuEventElapsedTime_v2000 EventElapsedTime;
    PFN_cuStreamWaitEvent_v3020 StreamWaitEvent;
    PFN_cuLaunchHostFunc_v10000 LaunchHostFunc;
    PFN_cuModuleLoadData_v2000 ModuleLoadData;
    PFN_cuModuleUnload_v2000 ModuleUnload;
    PFN_cuModuleGetFunction_v2000 ModuleGetFunction;
    PFN_cuLaunchKernel_v4000 LaunchKernel;
    PFN_cuMemsetD32Async_v3020 MemsetD32Async;
    /* device sets (docs/multi-gpu.md): copies from another GPU's memory */
    PFN_cuMemcpyPeerAsync_v4000 MemcpyPeerAsync;
    PFN_cuDeviceCanAccessPeer_v4000 DeviceCanAccessPeer;
    PFN_cuCtxEnablePeerAccess_v4000 CtxEnablePeerAccess;
} cu_api;

typedef struct cuda_dev {
    cu_api api;
    void *lib;
    char lib_path[512];
    int ordinal;
    CUdevice device;
    CUcontext ctx;
    bool ctx_retained;
    bool vmm;
    size_t granularity;
    int prio_least;    /* numerically largest: the lowest priority */
    int prio_greatest; /* numerically smallest: the highest priority */
    int driver_version;
    double flops_estimate; /* flops_estimate(): the caps' compute rate, 0 = unknown */
    char name[128];
    /* The codec decoder's module, loaded on first use (codec_lock guards these). */
    ddo__mutex codec_lock;
    CUmodule codec_mod;
    CUfunction codec_fn;
    int codec_rc; /* 0: not loaded yet; 1: loaded; < 0: loading failed with this code */
    char codec_err[256];
    /* Peer ordinals (below 64) whose access from this context was asked for (copy_peer). */
    ddo__mutex peer_lock;
    uint64_t peer_tried;
} cuda_dev;

#    define BIND(d, eb)                                   \
        do {                                              \
            int bind_rc_ = ddo__cuda_bind_ctx((d), (eb)); \
            if (bind_rc_ != 0)                            \
                return bind_rc_;                          \
        } while (0)

/* The ddo error code of r (0 for CUDA_SUCCESS). */
int ddo__cu_code(CUresult r);
/* Records a failed driver call (see device_cuda_driver.c); returns the ddo code of r. */
int ddo__cu_fail(const cuda_dev *d, ddo__errbuf *eb, CUresult r, const char *call, const char *fmt,
                 ...) DDO_PRINTF(5, 6);
/* Makes the device's primary context current on the calling thread. */
int ddo__cuda_bind_ctx(const cuda_dev *d, ddo__errbuf *eb);
/* The driver library to load: the option, else the environment's value, else the default. */
const char *ddo__cuda_driver_path(const ddo_device_options *opts);
/* dlopen + cuGetProcAddress: fills d->api or fails with DDO_E_NO_DEVICE (no fallback). */
int ddo__cuda_load_driver(cuda_dev *d, const char *path, ddo__errbuf *eb);

#endif /* DDO_HAVE_CUDA_H */

#endif
