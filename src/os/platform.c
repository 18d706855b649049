/*
 * platform.c - the Windows facts of the plan and the session (platform.h).
 */
#include "os/platform.h"

#include "os/sysinfo.h"

#include <string.h>

void ddo__platform_read(bool device_is_cpu, ddo__platform *out)
{
    memset(out, 0, sizeof(*out));
    out->dxgi_why = "cpu_device";
#if defined(_WIN32)
    out->windows = !device_is_cpu;
    out->ram_total_bytes = ddo__os_total_ram_bytes();
#endif
    if (!device_is_cpu)
        out->dxgi_why = ddo__os_dxgi_query(&out->dxgi);
}

static uint64_t sat_sub(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

uint64_t ddo__dxgi_local_free(const ddo__dxgi_memory *m, uint64_t local_headroom)
{
    return sat_sub(sat_sub(m->local_budget, m->local_usage), local_headroom);
}

bool ddo__dxgi_pressure(const ddo__dxgi_memory *m, uint64_t need, uint64_t local_headroom,
                        uint64_t shared_headroom)
{
    bool local = m->local_budget > 0 && ddo__dxgi_local_free(m, local_headroom) < need;
    bool shared =
        m->nonlocal_budget > 0 && sat_sub(m->nonlocal_budget, m->nonlocal_usage) < shared_headroom;
    return local || shared;
}
