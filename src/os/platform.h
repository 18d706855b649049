/*
 * platform.h - what Windows adds to the plan and the session: the DXGI video-memory budget
 * and the WDDM pinning limit. The facts come from the OS layer (src/os); the arithmetic here
 * is pure, so the tests check it on any system with facts of their own.
 */
#ifndef DDO_PLATFORM_H
#define DDO_PLATFORM_H

#include "os/dxgi.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct ddo__platform {
    bool windows;             /* WDDM rules apply to the device (a GPU under Windows) */
    uint64_t ram_total_bytes; /* physical RAM; 0 = unknown */
    const char *dxgi_why;     /* NULL: dxgi holds a reading; else why there is none */
    ddo__dxgi_memory dxgi;
} ddo__platform;

/* This machine's facts for a plan or session on a device (the cpu device: windows false, no
 * DXGI reading, as it has no WDDM memory). */
void ddo__platform_read(bool device_is_cpu, ddo__platform *out);

/* The local segment's Budget - CurrentUsage less headroom: the device memory this process may
 * still take (0 when usage and headroom reach the budget). */
uint64_t ddo__dxgi_local_free(const ddo__dxgi_memory *m, uint64_t local_headroom);
/* True when need more bytes would pass the local budget less local_headroom, or when the
 * shared (non-local) usage is within shared_headroom of its budget (a budget of 0: unknown,
 * never pressure). */
bool ddo__dxgi_pressure(const ddo__dxgi_memory *m, uint64_t need, uint64_t local_headroom,
                        uint64_t shared_headroom);

#endif /* DDO_PLATFORM_H */
