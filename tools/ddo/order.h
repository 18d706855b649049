/*
 * order.h - the order in which the tool's reference host runs a plan: the
 * resident tensors that belong to no unit first, then every unit (streamed or
 * budget-resident) in execution order, each with its own tensors.
 */
#ifndef DDO_TOOL_ORDER_H
#define DDO_TOOL_ORDER_H

#include "ddo.h"

#include <stddef.h>

typedef struct exec_group {
    size_t unit; /* SIZE_MAX: the leading group of resident tensors outside every unit */
    const size_t *tensors;
    size_t count;
    const char *name;
} exec_group;

typedef struct exec_order {
    size_t *resident;   /* the leading group's tensors, checkpoint order */
    exec_group *groups; /* groups[0] = the leading group, then one per unit */
    size_t count;
} exec_order;

/* Builds the order of plan (borrowed: the groups point into it). DDO_E_NO_MEMORY. */
int exec_order_build(const ddo_plan *plan, const ddo_checkpoint *ck, exec_order *o);
void exec_order_free(exec_order *o);

#endif /* DDO_TOOL_ORDER_H */
