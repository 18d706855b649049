/*
 * route.c - the table of execution routes (route.h): one row per route, its name (the
 * execution_mode value, the plan's label on the VMM routes, the word in messages) and how its
 * slots hold a unit. A new route is one row here and one enum value.
 */
#include "config/route.h"

#include "base/common.h"

#include <string.h>

typedef struct route_row {
    const char *name;
    const char *slot_kind; /* metrics label */
    bool maps;             /* session-long virtual ranges, handles mapped into them */
    bool per_weight;       /* one handle per weight (cuMemMap maps a handle at offset 0 only) */
} route_row;

static const route_row routes[DDO__ROUTE_COUNT] = {
    [DDO__ROUTE_LINEAR] = { "linear_runtime", "device_buffer", false, false },
    [DDO__ROUTE_VMM_FAST] = { "vmm_fast_runtime", "vmm_handle", true, false },
    [DDO__ROUTE_VMM_RUNTIME] = { "vmm_runtime", "vmm_handle", true, true },
};

static const route_row *row(ddo__route route)
{
    DDO_ASSERT((unsigned)route < DDO__ROUTE_COUNT);
    return &routes[(unsigned)route < DDO__ROUTE_COUNT ? route : DDO__ROUTE_LINEAR];
}

const char *ddo__route_name(ddo__route route)
{
    return row(route)->name;
}

bool ddo__route_lookup(const char *name, ddo__route *out)
{
    for (size_t i = 0; name != NULL && i < DDO_ARRAY_LEN(routes); i++) {
        if (strcmp(routes[i].name, name) == 0) {
            *out = (ddo__route)i;
            return true;
        }
    }
    return false;
}

ddo__route ddo__route_of(const char *name)
{
    ddo__route r = DDO__ROUTE_LINEAR;
    return ddo__route_lookup(name, &r) ? r : DDO__ROUTE_LINEAR;
}

bool ddo__route_maps(ddo__route route)
{
    return row(route)->maps;
}

bool ddo__route_per_weight(ddo__route route)
{
    return row(route)->per_weight;
}

_Static_assert((int)DDO__ROUTE_LINEAR == (int)DDO_ROUTE_LINEAR &&
                   (int)DDO__ROUTE_VMM_FAST == (int)DDO_ROUTE_VMM_FAST &&
                   (int)DDO__ROUTE_VMM_RUNTIME == (int)DDO_ROUTE_VMM_RUNTIME,
               "the public route enum names the internal one");

ddo_route ddo__route_public(ddo__route route)
{
    return (ddo_route)(row(route) - routes);
}

const char *ddo__route_slot_kind(ddo__route route)
{
    return row(route)->slot_kind;
}
