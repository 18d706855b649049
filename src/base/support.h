/*
 * support.h - the library's helpers that the ddo tool shares, outside the ABI: libddo.so does
 * not export them (src/ddo.map). The text helpers (text.c) form the private static library
 * ddo_support, linked into libddo and the tool; the CUDA driver's entry points come from the
 * cuda device's loader (device/device_cuda_driver.c), reached by the tool through the static
 * library it links.
 */
#ifndef DDO_SUPPORT_H
#define DDO_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* s for a one-line message: newline, return and tab as \n \r \t, other control bytes as \xNN,
 * C1 controls (and terminal escapes) as \uNNNN, with quotes also " and \ escaped; cut with "..."
 * to fit len bytes. */
void ddo__quote(const char *s, bool quotes, char *buf, size_t len);
/* s is decimal digits with an optional sign, point and exponent (integer: digits and a sign
 * only) and nothing else (no spaces, 0x10, inf or nan). */
bool ddo__decimal_syntax(const char *s, bool integer);
/* The shortest text that reads back as v (whole numbers without a point). */
void ddo__format_real(double v, char *buf, size_t len);
/* Formats bytes for a message: "512.00 MiB", "22.17 GiB", "3.00 KiB", "12 B" (the largest
 * unit up to GiB that keeps the number at least 1, two decimals). Returns buf. */
const char *ddo__format_bytes(uint64_t bytes, char *buf, size_t len);
/* The same in GiB whatever the size ("0.50 GiB"), for figures compared with a GiB option. */
const char *ddo__format_gib(uint64_t bytes, char *buf, size_t len);

/* A device spec as ddo_device_create, the execution_device and devices options and the tool take
 * it: "cpu", "cpu:N" (a cpu device as well: cpu:N instances emulate the GPUs of a set), "cuda"
 * (cuda:0) or "cuda:N", N of 1 to 6 decimal digits. */
typedef struct ddo__device_spec {
    bool cuda;     /* cuda or cuda:N; else cpu or cpu:N */
    bool numbered; /* written with :N */
    int ordinal;   /* N; 0 for a bare "cpu" or "cuda" */
} ddo__device_spec;
/* What every message refusing a spec says after naming it. */
#define DDO__DEVICE_SPEC_UNKNOWN "unknown device (expected cpu, cpu:N, cuda or cuda:N)"
/* Parses spec into *out (NULL: only checks); false for NULL or anything that is not a device
 * spec, *out then untouched. The one parser of device specs (text.c). */
bool ddo__device_spec_parse(const char *spec, ddo__device_spec *out);

/*
 * A CUDA driver entry point for a host that calls the driver itself next to ddo (the ddo
 * tool's cuBLASLt host): *fn receives what cuGetProcAddress(symbol, cuda_version) returns for
 * the legacy default stream, symbol being the driver's base name ("cuMemAlloc", not
 * "cuMemAlloc_v2") and cuda_version the ABI asked for (12000 = CUDA 12.0), to be called through
 * the matching PFN_ type of cudaTypedefs.h. The driver library is found as the cuda device
 * finds it (docs/cuda.md): library_path when it is neither NULL nor empty, else
 * "libcuda.so.1"; nothing else is tried. The library stays loaded for the life of the process.
 * Needs no device and no cuInit. *fn is written only on success. Thread-safe.
 * Errors: DDO_E_INVALID_ARGUMENT (symbol NULL or empty, fn NULL, cuda_version <= 0);
 * DDO_E_NO_DEVICE when there is no usable driver ("no CUDA driver: dlopen(PATH): ...", a
 * library without cuGetProcAddress, a build without CUDA support) or the driver has no such
 * entry point at that version ("no CUDA driver: PATH: cuGetProcAddress(SYMBOL, VERSION):
 * ..."); the detail is in ddo_last_error().
 */
int ddo__cuda_driver_proc(const char *library_path, const char *symbol, int cuda_version,
                          void **fn);

#endif /* DDO_SUPPORT_H */
