/*
 * dxgi.c - no DXGI off Windows (dxgi_win.c is the Windows side).
 */
#include "os/dxgi.h"

#include <string.h>

const char *ddo__os_dxgi_query(ddo__dxgi_memory *out)
{
    memset(out, 0, sizeof(*out));
    return "non_windows";
}
