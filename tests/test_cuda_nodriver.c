/*
 * test_cuda_nodriver.c - the cuda device without a usable driver: a missing
 * or invalid library fails with DDO_E_NO_DEVICE and a clear one-line detail,
 * the bootstrap order (explicit path, then DDO_VMM_LIBRARY_PATH as passed by
 * the host, then discovery) is followed with no fallback, the driver entry
 * points a host asks for (ddo__cuda_driver_proc) fail the same way, and
 * everything else keeps working. Runs on any machine.
 *
 * ctest-labels: unit
 */
#include "ddo.h"
#include "device/device.h"
#include "t.h"

/* A library that loads but is not a CUDA driver, and the driver's default name. */
#if defined(_WIN32)
#    define NOT_A_DRIVER   "kernel32.dll"
#    define DEFAULT_DLOPEN "no CUDA driver: dlopen(nvcuda.dll): "
#else
#    define NOT_A_DRIVER   "libm.so.6"
#    define DEFAULT_DLOPEN "no CUDA driver: dlopen(libcuda.so.1): "
#endif

/* Options naming the driver library; the cuda block is shared, so each call replaces the
 * paths of the options before it. */
static ddo_device_options with_paths(const char *path, const char *env)
{
    static ddo_cuda_options cuda;
    cuda = (ddo_cuda_options)DDO_CUDA_OPTIONS_INIT;
    cuda.library_path = path;
    cuda.library_env = env;
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cuda = &cuda;
    return o;
}

static void test_missing_explicit_library(void)
{
    ddo_device_options o = with_paths("/nonexistent/libcuda.so.1", NULL);
    ddo_device *dev = (ddo_device *)&o; /* must be set to NULL on failure */
    int rc = ddo_device_create("cuda:0", &o, &dev);
    T_EQ_INT(rc, DDO_E_NO_DEVICE);
    T_CHECK(dev == NULL);
#if DDO_HAVE_CUDA_H
    const char *want = "no CUDA driver: dlopen(/nonexistent/libcuda.so.1): ";
    T_CHECK_MSG(strncmp(ddo_last_error(), want, strlen(want)) == 0, "got \"%s\"", ddo_last_error());
#    if defined(_WIN32)
    T_CONTAINS(ddo_last_error(), "error 126"); /* ERROR_MOD_NOT_FOUND */
#    else
    T_CONTAINS(ddo_last_error(), "No such file or directory");
#    endif
#else
    T_CONTAINS(ddo_last_error(), "without CUDA support");
#endif
}

/* The explicit path wins over the host-passed DDO_VMM_LIBRARY_PATH value; neither falls
 * back to discovery when it is missing. */
static void test_bootstrap_order_without_fallback(void)
{
#if !DDO_HAVE_CUDA_H
    T_SKIP("built without CUDA headers");
#else
    ddo_device_options o = with_paths("/nonexistent/explicit.so", "/nonexistent/env.so");
    ddo_device *dev = NULL;
    T_EQ_INT(ddo_device_create("cuda", &o, &dev), DDO_E_NO_DEVICE);
    T_CONTAINS(ddo_last_error(), "dlopen(/nonexistent/explicit.so)");
    T_CHECK(strstr(ddo_last_error(), "env.so") == NULL);

    o = with_paths(NULL, "/nonexistent/env.so");
    T_EQ_INT(ddo_device_create("cuda:0", &o, &dev), DDO_E_NO_DEVICE);
    T_CONTAINS(ddo_last_error(), "no CUDA driver: dlopen(/nonexistent/env.so): ");
    T_CHECK(dev == NULL);

    /* An empty explicit path means "not given": the env value is used. */
    o = with_paths("", "/nonexistent/env2.so");
    T_EQ_INT(ddo_device_create("cuda:0", &o, &dev), DDO_E_NO_DEVICE);
    T_CONTAINS(ddo_last_error(), "dlopen(/nonexistent/env2.so)");
#endif
}

/* A library that loads but is not a CUDA driver is refused, not half-used. */
static void test_invalid_library(void)
{
#if !DDO_HAVE_CUDA_H
    T_SKIP("built without CUDA headers");
#else
    ddo_device_options o = with_paths(NOT_A_DRIVER, NULL);
    ddo_device *dev = NULL;
    T_EQ_INT(ddo_device_create("cuda:0", &o, &dev), DDO_E_NO_DEVICE);
    T_CHECK(dev == NULL);
    T_EQ_STR(ddo_last_error(), "no CUDA driver: " NOT_A_DRIVER ": no cuGetProcAddress_v2 or "
                               "cuGetProcAddress (not a CUDA driver library, or a driver "
                               "older than CUDA 11.3)");
#endif
}

/* The operation table rejects a malformed spec itself (the wrapper does too). */
static void test_ops_open_direct(void)
{
#if !DDO_HAVE_CUDA_H
    T_CHECK(ddo__device_cuda_ops == NULL);
    T_SKIP("built without CUDA headers");
#else
    T_REQUIRE(ddo__device_cuda_ops != NULL);
    T_EQ_STR(ddo__device_cuda_ops->name, "cuda");
    ddo__errbuf eb;
    memset(&eb, 0, sizeof(eb));
    void *st = NULL;
    ddo_device_options o = with_paths("/nonexistent/libcuda.so.1", NULL);
    T_EQ_INT(ddo__device_cuda_ops->open("cuda:x", &o, &st, &eb), DDO_E_INVALID_ARGUMENT);
    T_EQ_STR(eb.msg, "device \"cuda:x\": unknown device (expected cpu, cpu:N, cuda or cuda:N)");
    T_EQ_INT(ddo__device_cuda_ops->open("cuda:1", &o, &st, &eb), DDO_E_NO_DEVICE);
    T_EQ_INT(eb.code, DDO_E_NO_DEVICE);
    T_CONTAINS(eb.msg, "no CUDA driver: dlopen(/nonexistent/libcuda.so.1)");
    T_CHECK(st == NULL);
    /* NULL options: discovery. Here it fails (no driver) or, on a GPU machine, opens. */
    int rc = ddo__device_cuda_ops->open("cuda:0", NULL, &st, &eb);
    if (rc == 0) {
        ddo__device_cuda_ops->close(st);
    } else {
        T_EQ_INT(rc, DDO_E_NO_DEVICE);
        T_CHECK_MSG(strncmp(eb.msg, DEFAULT_DLOPEN, strlen(DEFAULT_DLOPEN)) == 0 ||
                        strncmp(eb.msg, "cuInit: ", 8) == 0 ||
                        strstr(eb.msg, "no such device") != NULL,
                    "got \"%s\"", eb.msg);
    }
#endif
}

/* Discovery through the public API: fails clearly here, opens on a GPU machine. */
static void test_discovery(void)
{
    ddo_device *dev = NULL;
    int rc = ddo_device_create("cuda:0", NULL, &dev);
    if (rc == 0) {
        ddo_device_caps caps;
        T_EQ_INT(ddo_device_caps_get(dev, &caps), 0);
        T_CHECK(!caps.is_cpu);
        ddo_device_destroy(dev);
        T_SKIP("a CUDA driver is present: the no-driver path is not reachable");
    }
    T_EQ_INT(rc, DDO_E_NO_DEVICE);
    T_CHECK(dev == NULL);
    T_CHECK(ddo_last_error()[0] != '\0');
}

/* The driver entry points a host asks for: without a driver, DDO_E_NO_DEVICE by the device's
 * path rule, with *fn untouched; on a GPU machine a real entry point. */
static void test_driver_proc_without_driver(void)
{
    void *fn = &fn;
    T_EQ_INT(ddo__cuda_driver_proc("/nonexistent/libcuda.so.1", "cuMemAlloc", 12000, &fn),
             DDO_E_NO_DEVICE);
    T_CHECK(fn == &fn);
#if DDO_HAVE_CUDA_H
    T_CHECK_MSG(
        strncmp(ddo_last_error(), "no CUDA driver: dlopen(/nonexistent/libcuda.so.1): ", 51) == 0,
        "got \"%s\"", ddo_last_error());
    /* A library that is not a driver: refused, as the device refuses it. */
    T_EQ_INT(ddo__cuda_driver_proc(NOT_A_DRIVER, "cuMemAlloc", 12000, &fn), DDO_E_NO_DEVICE);
    T_EQ_STR(ddo_last_error(), "no CUDA driver: " NOT_A_DRIVER ": no cuGetProcAddress_v2 or "
                               "cuGetProcAddress (not a CUDA driver library, or a driver "
                               "older than CUDA 11.3)");
    T_CHECK(fn == &fn);
#else
    T_CONTAINS(ddo_last_error(), "without CUDA support");
#endif
    /* Arguments are checked before any library is looked at. */
    T_EQ_INT(ddo__cuda_driver_proc(NULL, NULL, 12000, &fn), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__cuda_driver_proc(NULL, "", 12000, &fn), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__cuda_driver_proc(NULL, "cuMemAlloc", 12000, NULL), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__cuda_driver_proc(NULL, "cuMemAlloc", 0, &fn), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "ddo__cuda_driver_proc: cuda_version <= 0");
    T_CHECK(fn == &fn);

    /* NULL and "" mean discovery (libcuda.so.1), as for the device. */
    int rc = ddo__cuda_driver_proc("", "cuMemAlloc", 12000, &fn);
    if (rc == 0) {
        T_CHECK(fn != NULL && fn != (void *)&fn);
        void *none = &none;
        T_EQ_INT(ddo__cuda_driver_proc(NULL, "cuNoSuchEntryPoint", 12000, &none), DDO_E_NO_DEVICE);
        T_CONTAINS(ddo_last_error(), "cuGetProcAddress(cuNoSuchEntryPoint, 12000)");
        T_CHECK(none == &none);
        T_SKIP("a CUDA driver is present: the no-driver path of discovery is not reachable");
    }
    T_EQ_INT(rc, DDO_E_NO_DEVICE);
    T_CHECK(fn == &fn);
#if DDO_HAVE_CUDA_H
    T_CHECK_MSG(strncmp(ddo_last_error(), DEFAULT_DLOPEN, strlen(DEFAULT_DLOPEN)) == 0,
                "got \"%s\"", ddo_last_error());
#endif
}

/* A failed cuda device leaves the rest of the library working. */
static void test_cpu_still_works(void)
{
    ddo_device_options o = with_paths("/nonexistent/libcuda.so.1", NULL);
    ddo_device *dev = NULL;
    T_EQ_INT(ddo_device_create("cuda:0", &o, &dev), DDO_E_NO_DEVICE);
    T_EQ_INT(ddo_device_create("cpu", NULL, &dev), 0);
    T_REQUIRE(dev != NULL);
    ddo_device_caps caps;
    T_EQ_INT(ddo_device_caps_get(dev, &caps), 0);
    T_CHECK(caps.is_cpu);
    ddo_device_destroy(dev);
}

int main(void)
{
    T_RUN(test_missing_explicit_library);
    T_RUN(test_bootstrap_order_without_fallback);
    T_RUN(test_invalid_library);
    T_RUN(test_ops_open_direct);
    T_RUN(test_discovery);
    T_RUN(test_driver_proc_without_driver);
    T_RUN(test_cpu_still_works);
    return t_done();
}
