/*
 * order.c - the reference host's execution order (see order.h).
 */
#include "order.h"
#include "tool.h"

#include <stdlib.h>
#include <string.h>

void exec_order_free(exec_order *o)
{
    free(o->resident);
    free(o->groups);
    memset(o, 0, sizeof(*o));
}

int exec_order_build(const ddo_plan *plan, const ddo_checkpoint *ck, exec_order *o)
{
    memset(o, 0, sizeof(*o));
    size_t n = ddo_checkpoint_tensor_count(ck), units = ddo_plan_unit_count(plan);
    o->resident = malloc((n > 0 ? n : 1) * sizeof(*o->resident));
    o->groups = malloc((units + 1) * sizeof(*o->groups));
    unsigned char *in_unit = calloc(n > 0 ? n : 1, 1);
    if (o->resident == NULL || o->groups == NULL || in_unit == NULL) {
        free(in_unit);
        exec_order_free(o);
        return DDO_E_NO_MEMORY;
    }
    /* Tensors of a unit (budget-resident units list theirs too) run with their unit, in
     * execution order: computing a resident unit's tensors up front as well would run them
     * twice and take away the compute that hides the next streamed units' transfers. */
    for (size_t u = 0; u < units; u++) {
        size_t count = 0;
        const size_t *t = ddo_plan_unit_tensors(plan, u, &count);
        for (size_t k = 0; t != NULL && k < count; k++)
            if (t[k] < n)
                in_unit[t[k]] = 1;
    }
    size_t r = 0;
    for (size_t i = 0; i < n; i++)
        if (!in_unit[i] && tool_placement(plan, i) == DDO_PLACEMENT_RESIDENT)
            o->resident[r++] = i;
    free(in_unit);
    o->groups[0] = (exec_group){ SIZE_MAX, o->resident, r, "resident" };
    for (size_t u = 0; u < units; u++) {
        size_t count = 0;
        const size_t *t = ddo_plan_unit_tensors(plan, u, &count);
        ddo_unit_info ui;
        const char *name = ddo_plan_unit(plan, u, &ui) == 0 ? ui.name : "unit";
        o->groups[u + 1] = (exec_group){ u, t, t != NULL ? count : 0, name };
    }
    o->count = units + 1;
    return 0;
}
