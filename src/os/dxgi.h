/*
 * dxgi.h - the device-memory budget Windows gives a process (DXGI's QueryVideoMemoryInfo).
 * dxgi_win.c reads it; elsewhere there is none (dxgi.c says why).
 */
#ifndef DDO_OS_DXGI_H
#define DDO_OS_DXGI_H

#include <stdint.h>

/* One reading of IDXGIAdapter3::QueryVideoMemoryInfo, bytes. */
typedef struct ddo__dxgi_memory {
    uint64_t local_budget;    /* DXGI_MEMORY_SEGMENT_GROUP_LOCAL: the card's memory */
    uint64_t local_usage;     /* what this process uses of it */
    uint64_t nonlocal_budget; /* DXGI_MEMORY_SEGMENT_GROUP_NON_LOCAL: shared system memory */
    uint64_t nonlocal_usage;
    char adapter[128]; /* the adapter's description (UTF-8) */
} ddo__dxgi_memory;

/* Reads the budget of the first hardware adapter (dxgi.dll and CreateDXGIFactory1 loaded at
 * run time; the adapter is found once and kept). NULL with *out filled, or why not: "non_windows",
 * "dxgi.dll absent", "no DXGI adapter", "IDXGIAdapter3 unsupported" (before Windows 10),
 * "QueryVideoMemoryInfo failed". */
const char *ddo__os_dxgi_query(ddo__dxgi_memory *out);

#endif /* DDO_OS_DXGI_H */
