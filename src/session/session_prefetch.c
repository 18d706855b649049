/*
 * session_prefetch.c - the execution order and prefetch. The order is declared by the host
 * (ddo_session_declare_order), else learned from the first pass of acquires (a unit seen
 * twice closes the cycle), else the plan's unit order. After every acquire the next
 * `slots - 1` units of that order are kept loading; on vmm_runtime only when they fit the
 * mapped budget without displacing a leased, loading or prefetched unit; where the host marks
 * its passes (ddo_session_begin_pass), only after a unit's first acquire of the pass. When an
 * order is declared, and again after a reload, the first `slots` units of it start loading at once,
 * so the first pass does not begin by waiting for its first unit. On vmm_fast_runtime each unit of
 * the order has a home slot (place_homes), so that settled uploads map nothing.
 */
#include "session/session.h"

#include <string.h>

static uint64_t rank_bytes(const void *ctx, size_t r)
{
    const ddo_session *s = ctx;
    return s->units[s->order.learn[s->unit_count + r]].bytes;
}

/* vmm_fast_runtime: the home slot of each streamed unit of the order (mu held), round the ring
 * from its seam (ddo__ring_seam), so that the unit loading into a slot is the one the window
 * reaches as that slot's unit is released, and once every unit has settled no upload maps
 * anything. */
static void place_homes(ddo_session *s)
{
    size_t k = s->slot_count, m = 0;
    size_t *by_rank = s->order.learn + s->unit_count; /* scratch after the learn list */
    for (size_t u = 0; u < s->unit_count; u++)
        s->order.home[u] = DDO__NONE;
    if (!ddo__route_maps(s->route) || ddo__route_per_weight(s->route) || k == 0)
        return;
    for (size_t i = 0; i < s->order.count; i++) {
        size_t u = s->order.units[i];
        if (!s->units[u].resident)
            by_rank[m++] = u;
    }
    size_t seam = ddo__ring_seam(m, k, rank_bytes, s);
    for (size_t r = 0; r < m; r++)
        s->order.home[by_rank[r]] = ddo__ring_home(r, m, seam, k);
}

static void set_order(ddo_session *s, const size_t *units, size_t count)
{
    /* The same order again keeps its epoch (and the slots its units settled into). */
    bool same = s->order.known && s->order.count == count &&
                memcmp(s->order.units, units, count * sizeof(*units)) == 0;
    if (!same)
        s->order.epoch++;
    memcpy(s->order.units, units, count * sizeof(*units));
    s->order.count = count;
    for (size_t u = 0; u < s->unit_count; u++)
        s->order.pos[u] = DDO__NONE;
    for (size_t i = 0; i < count; i++)
        if (s->order.pos[units[i]] == DDO__NONE)
            s->order.pos[units[i]] = i;
    s->order.known = true;
    place_homes(s);
}

void ddo__session_learn(ddo_session *s, size_t unit)
{
    if (s->order.known)
        return;
    if (s->order.learn_seen[unit]) {
        set_order(s, s->order.learn, s->order.learn_count);
        return;
    }
    s->order.learn_seen[unit] = true;
    s->order.learn[s->order.learn_count++] = unit;
}

/* The next units after `unit` (wrapping), skipping resident ones, at most max. */
static size_t window_after(ddo_session *s, size_t unit, size_t *out, size_t max)
{
    size_t n = 0;
    if (max == 0)
        return 0;
    bool use_order = s->order.known && s->order.pos[unit] != DDO__NONE;
    size_t len = use_order ? s->order.count : s->unit_count;
    size_t pos = use_order ? s->order.pos[unit] : unit;
    for (size_t k = 1; k < len && n < max; k++) {
        size_t w = use_order ? s->order.units[(pos + k) % len] : (pos + k) % len;
        if (w == unit || s->units[w].resident || ddo__session_in_list(out, n, w))
            continue;
        out[n++] = w;
    }
    return n;
}

/*
 * vmm_runtime: whether unit could load into slot i without displacing a
 * leased, loading or prefetched unit (mu held). The loader decides for real;
 * this only spares queueing a prefetch that would find no room.
 */
static bool prefetch_fits(ddo_session *s, size_t i, size_t unit)
{
    uint64_t held = s->arena != 0 ? s->b.resident_bytes : 0;
    for (size_t k = 0; k < s->slot_count; k++) {
        const ddo__slot *sl = &s->slots[k];
        if (k == i)
            continue;
        size_t m = sl->state == DDO__SLOT_LOADING ? sl->unit : sl->mapped_unit;
        bool kept = sl->unsafe || sl->state == DDO__SLOT_LEASED || sl->state == DDO__SLOT_LOADING ||
                    (sl->state == DDO__SLOT_READY && sl->prefetched);
        if (kept && m != DDO__NONE)
            held += s->wl->unit_bytes[m];
    }
    return held <= s->acc_device.limit && s->wl->unit_bytes[unit] <= s->acc_device.limit - held;
}

void ddo__session_prefetch(ddo_session *s, size_t unit)
{
    if (s->slot_count < 2)
        return;
    size_t max = s->slot_count - 1;
    size_t *keep = s->order.learn + s->unit_count; /* scratch after the learn list */
    keep[0] = unit;
    size_t n = window_after(s, unit, keep + 1, max);
    size_t depth = 0;
    for (size_t k = 0; k < n; k++) {
        size_t w = keep[1 + k];
        if (s->units[w].slot == DDO__NONE) {
            size_t i;
            enum ddo__pick pk = ddo__session_pick_slot(s, w, true, keep, n + 1, &i);
            if (pk == DDO__PICK_SKIP)
                continue;
            if (pk != DDO__PICK_FOUND)
                break;
            if (ddo__route_per_weight(s->route) && !prefetch_fits(s, i, w))
                break;
            /* A prefetch failure is not the acquire's: the unit loads on demand. */
            ddo__errbuf saved = s->err;
            int rc = ddo__session_start_load(s, i, w, true);
            if (rc != 0) {
                s->err = saved;
                ddo__fail(NULL, saved.code, "%s", saved.msg);
                break;
            }
        }
        size_t i = s->units[w].slot;
        if (s->slots[i].state == DDO__SLOT_LOADING || s->slots[i].state == DDO__SLOT_READY ||
            s->slots[i].state == DDO__SLOT_RETIRING)
            depth++;
    }
    ddo__metrics_add(&s->metrics, DDO_M_prefetch_depth_sum, (double)depth);
    ddo__metrics_max(&s->metrics, DDO_M_prefetch_depth_max, (double)depth);
}

void ddo__session_prefetch_head(ddo_session *s)
{
    if (!s->order.known || s->slot_count == 0 || s->unloaded)
        return;
    size_t first = DDO__NONE;
    for (size_t u = 0; u < s->unit_count; u++)
        if (s->units[u].leased)
            return; /* a pass is under way: its acquires prefetch */
    for (size_t k = 0; k < s->order.count && first == DDO__NONE; k++)
        if (!s->units[s->order.units[k]].resident)
            first = s->order.units[k];
    if (first == DDO__NONE)
        return;
    if (s->units[first].slot == DDO__NONE) {
        size_t keep[1] = { first }, i;
        if (ddo__session_pick_slot(s, first, true, keep, 1, &i) != DDO__PICK_FOUND ||
            (ddo__route_per_weight(s->route) && !prefetch_fits(s, i, first)))
            return;
        ddo__errbuf saved = s->err; /* a failure here is not the caller's: it loads on demand */
        if (ddo__session_start_load(s, i, first, true) != 0) {
            s->err = saved;
            return;
        }
    }
    ddo__session_prefetch(s, first);
}

int ddo_session_declare_order(ddo_session *s, const size_t *units, size_t count)
{
    if (s == NULL || units == NULL || count == 0)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_declare_order: a non-empty list of units is required");
    if (count > s->unit_count)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_declare_order: %zu units declared but the plan has %zu",
                         count, s->unit_count);
    for (size_t i = 0; i < count; i++) {
        if (units[i] >= s->unit_count)
            return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                             "ddo_session_declare_order: unit %zu out of range (the plan has "
                             "%zu units)",
                             units[i], s->unit_count);
        if (ddo__session_in_list(units, i, units[i]))
            return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                             "ddo_session_declare_order: unit %zu (\"%s\") listed twice", units[i],
                             s->units[units[i]].name);
    }
    ddo__mutex_lock(&s->mu);
    set_order(s, units, count);
    s->order.declared = true;
    ddo__session_prefetch_head(s);
    ddo__mutex_unlock(&s->mu);
    return 0;
}

int ddo_session_begin_pass(ddo_session *s)
{
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_begin_pass: a session is required");
    ddo__mutex_lock(&s->mu);
    s->order.pass++;
    ddo__mutex_unlock(&s->mu);
    return 0;
}
