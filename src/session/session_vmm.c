/*
 * session_vmm.c - the VMM side of a session: the geometry it executes on a VMM route (the
 * plan's slots; on vmm_runtime the plan's per-weight layout), the session-long virtual
 * ranges (one per streamed unit, or per streamed weight on vmm_runtime), and mapping a
 * slot's handle (or every weight's own handle) into them and out again. The driver-API
 * order of cuda-samples: reserve -> create -> map -> set access; unmap -> release -> free.
 */
#include "session/session.h"

#include "device/device.h"

#include <stdio.h>
#include <string.h>

static int fail_dev(ddo__errbuf *eb, int rc, const char *what)
{
    return ddo__session_fail_ctx(eb, rc, "session: %s", what);
}

/* ------------------------------------------------------------------------ */
/* The geometry                                                              */
/* ------------------------------------------------------------------------ */

/*
 * vmm_runtime: the per-weight layout the session executes: the plan's, or (a device that
 * maps in another granule than the plan was made for) the plan's at the device's granularity,
 * by the planner's own function. The mapped budget bounds every handle alive; it must hold the
 * resident arena and the largest unit's weights, else the session is refused before any
 * device call (the planner's check, which refused the same plans).
 */
static int adopt_weight_layout(ddo_session *s)
{
    const ddo__weight_layout *pl = ddo__plan_weight_layout(s->plan);
    if (pl != NULL && pl->granularity == s->gran) {
        s->wl = pl;
    } else {
        int rc = ddo__weight_layout_build(s->plan, s->gran, &s->own_wl);
        if (rc != 0)
            return ddo__fail_from_last(&s->err, rc);
        s->wl = &s->own_wl;
    }
    s->slot_bytes = s->wl->slot_bytes > s->gran ? s->wl->slot_bytes : s->gran;
    uint64_t limit = s->b.device_weights_limit;
    int rc = ddo__weight_layout_check(s->plan, s->wl, s->b.resident_bytes, limit, NULL, &s->err);
    if (rc != 0)
        return rc;
    uint64_t all = 0;
    if (!ddo__mul_u64(s->slot_count, s->slot_bytes, &all) ||
        !ddo__add_u64(all, s->b.resident_bytes, &all))
        all = UINT64_MAX;
    /* The account: the mapped budget, or all slots' weights when that is less. */
    s->acc_device.limit = limit > 0 && limit < all ? limit : all;
    return 0;
}

int ddo__session_check_granularity(ddo_session *s)
{
    ddo_device_caps caps;
    int rc = ddo_device_caps_get(s->dev, &caps);
    if (rc != 0)
        return fail_dev(&s->err, rc, "device capabilities");
    s->gran = caps.granularity > 0 ? caps.granularity : 2 * DDO_MIB;
    if (ddo__route_per_weight(s->route))
        return adopt_weight_layout(s);
    if (caps.granularity > 0 && s->slot_bytes % caps.granularity != 0) {
        char b1[32], b2[32];
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "session: the plan's slot size %s is not a multiple of the device "
                         "granularity %s: build the plan with the device's granularity",
                         ddo__format_bytes(s->slot_bytes, b1, sizeof(b1)),
                         ddo__format_bytes(caps.granularity, b2, sizeof(b2)));
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Ranges                                                                    */
/* ------------------------------------------------------------------------ */

/* vmm_runtime: releases the reserved ranges of unit's weights; true when none is left. */
static bool release_weight_ranges(ddo_session *s, size_t u)
{
    bool all = true;
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(s->plan, u, &n);
    for (size_t k = 0; ts != NULL && k < n; k++) {
        size_t t = ts[k];
        if (s->w_va[t] == 0)
            continue;
        if (ddo__dev_va_release(s->dev, s->w_va[t], s->wl->range_bytes[t]) == 0)
            s->w_va[t] = 0;
        else
            all = false;
    }
    return all;
}

/* vmm_runtime: reserves one granularity-aligned range per streamed weight of every unit. */
static int reserve_weight_ranges(ddo_session *s)
{
    for (size_t u = 0; u < s->unit_count; u++) {
        if (s->units[u].resident)
            continue;
        size_t n = 0;
        const size_t *ts = ddo_plan_unit_tensors(s->plan, u, &n);
        for (size_t k = 0; ts != NULL && k < n; k++) {
            size_t t = ts[k];
            if (s->wl->range_bytes[t] == 0)
                continue;
            int rc = ddo__dev_va_reserve(s->dev, s->wl->range_bytes[t], &s->w_va[t]);
            if (rc != 0) {
                s->w_va[t] = 0;
                char b[256];
                snprintf(b, sizeof(b), "tensor \"%.100s\": reserving its range of unit \"%.60s\"",
                         ddo__session_tensor_name(s, t), s->units[u].name);
                return fail_dev(&s->err, rc, b);
            }
            s->units[u].has_va = true;
        }
    }
    return 0;
}

int ddo__session_reserve_ranges(ddo_session *s)
{
    if (ddo__route_per_weight(s->route) && s->slot_count > 0) {
        /* Every streamed weight's own range: one stable address for the whole session. */
        return reserve_weight_ranges(s);
    }
    if (ddo__route_maps(s->route) && s->slot_count > 0) {
        /* Every streamed unit's own range: one stable address for the whole session. */
        for (size_t u = 0; u < s->unit_count; u++) {
            if (s->units[u].resident)
                continue;
            int rc = ddo__dev_va_reserve(s->dev, s->slot_bytes, &s->units[u].va);
            if (rc != 0) {
                char b[160];
                snprintf(b, sizeof(b), "reserving the range of unit \"%.100s\"", s->units[u].name);
                return fail_dev(&s->err, rc, b);
            }
            s->units[u].has_va = true;
        }
    }
    return 0;
}

void ddo__session_release_ranges(ddo_session *s)
{
    if (s->units == NULL || !ddo__route_maps(s->route))
        return;
    for (size_t u = 0; u < s->unit_count; u++) {
        if (!s->units[u].has_va)
            continue;
        /* A range still mapped by an unsafe slot stays reserved. */
        bool mapped = false;
        for (size_t i = 0; i < s->slot_count; i++)
            mapped = mapped || (s->slots[i].unsafe && s->slots[i].mapped_unit == u);
        size_t a = s->units[u].alias_slot;
        mapped = mapped || (a != DDO__NONE && s->slots[a].unsafe);
        if (mapped)
            continue;
        if (ddo__route_per_weight(s->route))
            s->units[u].has_va = !release_weight_ranges(s, u);
        else if (ddo__dev_va_release(s->dev, s->units[u].va, s->slot_bytes) == 0)
            s->units[u].has_va = false;
    }
}

/* ------------------------------------------------------------------------ */
/* Mappings                                                                  */
/* ------------------------------------------------------------------------ */

/*
 * Unmaps a slot's handle from unit: its one range (vmm_fast_runtime) or each
 * of its weights' ranges (vmm_runtime). Stops at the first failure and
 * returns the device's code (the slot is then unsafe: part may stay mapped).
 */
int ddo__session_unmap_unit(ddo_session *s, size_t unit)
{
    if (!ddo__route_per_weight(s->route))
        return ddo__dev_unmap(s->dev, s->units[unit].va, s->slot_bytes);
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(s->plan, unit, &n);
    for (size_t k = 0; ts != NULL && k < n; k++) {
        size_t t = ts[k];
        if (s->wl->handle_bytes[t] == 0)
            continue;
        int rc = ddo__dev_unmap(s->dev, s->w_va[t], s->wl->handle_bytes[t]);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Maps and gives access to one range; *mapped tells whether the map itself succeeded. */
static int map_range(ddo_session *s, uint64_t va, uint64_t size, uint64_t handle, uint64_t off,
                     bool *mapped)
{
    *mapped = false;
    int rc = ddo__dev_map(s->dev, va, size, handle, off);
    if (rc != 0)
        return rc;
    *mapped = true;
    return ddo__dev_set_access(s->dev, va, size);
}

/* vmm_runtime: maps each weight's own bound handle into the weight's range (see
 * ddo__session_map_unit). */
static int map_weights(ddo_session *s, size_t unit, size_t slot, bool *unsafe, ddo__errbuf *eb)
{
    const char *name = s->units[unit].name;
    const uint64_t *map = s->wl->handle_bytes;
    bool mapped = false;
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(s->plan, unit, &n);
    for (size_t k = 0; ts != NULL && k < n; k++) {
        size_t t = ts[k];
        if (map[t] == 0)
            continue;
        DDO_ASSERT(s->w_handle[t] != 0);
        int rc = map_range(s, s->w_va[t], map[t], s->w_handle[t], 0, &mapped);
        if (rc == 0)
            continue;
        rc = ddo__session_fail_ctx(eb, rc, "unit \"%s\": tensor \"%s\": %s slot %zu", name,
                                   ddo__session_tensor_name(s, t),
                                   mapped ? "set access of" : "mapping", slot);
        /* Undo this unit's mappings: the earlier weights and, if mapped, this one. */
        for (size_t j = 0; j <= k; j++) {
            size_t w = ts[j];
            if (map[w] == 0 || (j == k && !mapped))
                continue;
            if (ddo__dev_unmap(s->dev, s->w_va[w], map[w]) != 0)
                *unsafe = true;
        }
        return rc;
    }
    return 0;
}

/*
 * Maps handle into unit's range (vmm_fast_runtime) or each weight's own bound
 * handle into the weight's range (vmm_runtime), at offset 0, with access. On
 * failure everything this call mapped is unmapped again; *unsafe when that
 * also failed. The error names the unit, the slot and the tensor.
 */
int ddo__session_map_unit(ddo_session *s, uint64_t handle, size_t unit, size_t slot, bool *unsafe,
                          ddo__errbuf *eb)
{
    const char *name = s->units[unit].name;
    bool mapped = false;
    *unsafe = false;
    if (ddo__route_per_weight(s->route))
        return map_weights(s, unit, slot, unsafe, eb);
    int rc = map_range(s, s->units[unit].va, s->slot_bytes, handle, 0, &mapped);
    if (rc == 0)
        return 0;
    rc = ddo__session_fail_ctx(eb, rc, "unit \"%s\": %s slot %zu", name,
                               mapped ? "set access of" : "mapping", slot);
    if (mapped && ddo__dev_unmap(s->dev, s->units[unit].va, s->slot_bytes) != 0)
        *unsafe = true;
    return rc;
}

/* Waits (host) until the GPU is done with everything slot i's handle was used for so far:
 * its last upload and its last release. */
static int slot_quiet(ddo_session *s, const ddo__slot *sl)
{
    int rc = 0;
    if (sl->upload_recorded)
        rc = ddo__dev_event_synchronize(s->dev, sl->upload_event);
    if (rc == 0 && sl->release_recorded)
        rc = ddo__dev_event_synchronize(s->dev, sl->release_event);
    return rc;
}

int ddo__session_drop_alias(ddo_session *s, size_t unit, ddo__errbuf *eb)
{
    ddo__unit_rt *u = &s->units[unit];
    size_t b = u->alias_slot;
    if (b == DDO__NONE)
        return 0;
    /* The unit's last upload into slot b and its last use from there are behind these. */
    int rc = slot_quiet(s, &s->slots[b]);
    if (rc == 0)
        rc = ddo__dev_unmap(s->dev, u->va, s->slot_bytes);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "unit \"%s\": unmapping its range from slot %zu",
                                     u->name, b);
    u->alias_slot = DDO__NONE;
    return 0;
}

int ddo__session_drop_aliases(ddo_session *s, size_t slot)
{
    if (!ddo__route_maps(s->route) || ddo__route_per_weight(s->route))
        return 0;
    for (size_t u = 0; u < s->unit_count; u++) {
        if (s->units[u].alias_slot != slot)
            continue;
        int rc = ddo__session_drop_alias(s, u, &s->err);
        if (rc != 0)
            return rc;
    }
    return 0;
}
