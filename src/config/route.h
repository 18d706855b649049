/*
 * route.h - the execution routes: the one enum the planner decides and the plan carries, and
 * (in route.c) the one table of what each route is called and how its slots hold a unit.
 * The configuration's execution_mode, a plan's label, the session and the messages all name a
 * route through this table. Internal; never installed.
 *
 * A plan's label (ddo_plan_route, the JSON "route") is the route's name on the VMM routes and,
 * on the linear route, the effective preset ("one_shot_fast", ...) or "linear_runtime", "plan"
 * or "off": every label that is not a VMM route's name is the linear route.
 */
#ifndef DDO_ROUTE_H
#define DDO_ROUTE_H

#include "ddo.h"

#include <stdbool.h>

typedef enum ddo__route {
    DDO__ROUTE_LINEAR,      /* slots are device buffers: a unit's addresses change per slot */
    DDO__ROUTE_VMM_FAST,    /* a slot is one physical handle, mapped into each unit's range */
    DDO__ROUTE_VMM_RUNTIME, /* every weight has its own handle, mapped into its own range */
    DDO__ROUTE_COUNT
} ddo__route;

/* The route's name: "linear_runtime", "vmm_fast_runtime", "vmm_runtime". */
const char *ddo__route_name(ddo__route route);
/* The route named exactly name (an execution_mode value); false when name is none. */
bool ddo__route_lookup(const char *name, ddo__route *out);
/* The route that an execution_mode or a plan's label (NULL: "") selects: a route's own name,
 * else (a preset, "plan", "off") the linear route. */
ddo__route ddo__route_of(const char *name);
/* True on the VMM routes: every streamed unit (or weight) has a session-long virtual range
 * that physical handles are mapped into. */
bool ddo__route_maps(ddo__route route);
/* True on vmm_runtime: one handle per weight, bound when its unit loads. */
bool ddo__route_per_weight(ddo__route route);
/* The public name of the route (ddo_plan_info). */
ddo_route ddo__route_public(ddo__route route);
/* What a slot holds, for the metrics label slot_kind: "device_buffer" or "vmm_handle". */
const char *ddo__route_slot_kind(ddo__route route);

#endif /* DDO_ROUTE_H */
