/*
 * session_pool.c - vmm_runtime's per-weight handles. cuMemMap maps a handle only at offset
 * 0, so every weight has its own handle of its rounded size (the plan's layout), mapped into
 * the weight's own range. The loader binds them when the unit loads: a pooled handle of the
 * same size, else a new one within the mapped budget, else it makes room by releasing pooled
 * handles of other sizes and then by evicting the least recently used idle unit (ready, its
 * release event complete; never a leased, loading or prefetched one - only a demand load
 * may, as a last resort, displace a prefetched unit that was never acquired, as pick_slot
 * already lets it take that unit's slot). Evicted handles go back to the pool.
 */
#include "session/session.h"

#include "device/device.h"

#include <stdlib.h>

int ddo__session_pool_init(ddo_session *s)
{
    size_t cap = s->wl->handle_count;
    s->pool.handle = ddo__calloc(cap > 0 ? cap : 1, sizeof(*s->pool.handle));
    s->pool.size = ddo__calloc(cap > 0 ? cap : 1, sizeof(*s->pool.size));
    if (s->pool.handle == NULL || s->pool.size == NULL)
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: out of memory");
    s->pool.cap = cap;
    return 0;
}

/* Takes a pooled handle of exactly size bytes (mu held). */
static bool pool_take(ddo_session *s, uint64_t size, uint64_t *handle)
{
    for (size_t i = s->pool.count; i-- > 0;) {
        if (s->pool.size[i] != size)
            continue;
        *handle = s->pool.handle[i];
        s->pool.count--;
        s->pool.handle[i] = s->pool.handle[s->pool.count];
        s->pool.size[i] = s->pool.size[s->pool.count];
        return true;
    }
    return false;
}

/*
 * Releases one handle of size bytes and gives its bytes back. A failed release
 * drops the handle (never released twice) and keeps its bytes accounted, so
 * the account keeps matching what the device holds.
 */
static int handle_release(ddo_session *s, uint64_t handle, uint64_t size, ddo__errbuf *eb)
{
    int rc = ddo__dev_phys_release(s->dev, handle);
    if (rc != 0) {
        ddo__metrics_add(&s->metrics, DDO_M_reclaim_failures, 1);
        char b[32];
        return ddo__session_fail_ctx(eb, rc,
                                     "releasing a weight handle of %s (its bytes stay accounted)",
                                     ddo__format_bytes(size, b, sizeof(b)));
    }
    ddo__account_give(&s->acc_device, size);
    return 0;
}

/* Puts an unmapped handle into the pool (mu held). */
static void pool_put(ddo_session *s, uint64_t handle, uint64_t size)
{
    /* Handles alive of one size never outnumber the weights of that size (a handle is only
     * created when none of its size is pooled), so the pool has room for every one. */
    DDO_ASSERT(s->pool.count < s->pool.cap);
    if (s->pool.count == s->pool.cap) {
        (void)handle_release(s, handle, size, NULL);
        return;
    }
    s->pool.handle[s->pool.count] = handle;
    s->pool.size[s->pool.count] = size;
    s->pool.count++;
}

int ddo__session_pool_release(ddo_session *s, uint64_t *bytes)
{
    int first = 0;
    *bytes = 0;
    while (s->pool.count > 0) {
        size_t i = --s->pool.count;
        int rc = handle_release(s, s->pool.handle[i], s->pool.size[i], &s->err);
        if (rc == 0)
            *bytes += s->pool.size[i];
        else if (first == 0)
            first = rc;
    }
    return first;
}

/* Moves unit's bound handles into the pool: its ranges are unmapped (mu held). */
void ddo__session_unbind_unit(ddo_session *s, size_t unit)
{
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(s->plan, unit, &n);
    for (size_t k = 0; ts != NULL && k < n; k++) {
        size_t t = ts[k];
        if (s->w_handle[t] == 0)
            continue;
        pool_put(s, s->w_handle[t], s->wl->handle_bytes[t]);
        s->w_handle[t] = 0;
    }
}

/* Releases unit's bound handles: its ranges are unmapped (mu held). First error. */
int ddo__session_release_unit_handles(ddo_session *s, size_t unit)
{
    int first = 0;
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(s->plan, unit, &n);
    for (size_t k = 0; ts != NULL && k < n; k++) {
        size_t t = ts[k];
        if (s->w_handle[t] == 0)
            continue;
        int rc = handle_release(s, s->w_handle[t], s->wl->handle_bytes[t], &s->err);
        s->w_handle[t] = 0;
        if (rc != 0 && first == 0)
            first = rc;
    }
    return first;
}

/*
 * The slot whose unit may be evicted to make room (mu held), or DDO__NONE: a
 * free slot still mapping one, then the least recently used ready slot that is
 * not prefetched (ready: its upload and its release event completed); a demand
 * load may last take the latest prefetched ready one (never acquired).
 */
static size_t evictable(ddo_session *s, size_t except, bool demand)
{
    size_t best = DDO__NONE;
    int best_cls = 3;
    uint64_t best_key = UINT64_MAX;
    for (size_t k = 0; k < s->slot_count; k++) {
        const ddo__slot *sl = &s->slots[k];
        if (k == except || sl->unsafe || sl->mapped_unit == DDO__NONE)
            continue;
        int cls;
        uint64_t key;
        if (sl->state == DDO__SLOT_FREE) {
            cls = 0;
            key = 0;
        } else if (sl->state == DDO__SLOT_READY && !sl->prefetched) {
            cls = 1;
            key = sl->last_use;
        } else if (sl->state == DDO__SLOT_READY && demand) {
            cls = 2;
            key = UINT64_MAX - sl->ticket;
        } else {
            continue;
        }
        if (cls < best_cls || (cls == best_cls && key < best_key)) {
            best = k;
            best_cls = cls;
            best_key = key;
        }
    }
    return best;
}

/* Unmaps the idle unit of slot k and pools its handles (mu held). A failed unmap leaves
 * the slot unsafe, its unit's handles bound and accounted. */
static int evict(ddo_session *s, size_t k, ddo__errbuf *eb)
{
    ddo__slot *sl = &s->slots[k];
    size_t d = sl->mapped_unit;
    int rc = ddo__session_unmap_unit(s, d);
    if (rc != 0) {
        ddo__slot_set_unsafe(s, sl);
        return ddo__session_fail_ctx(eb, rc, "unit \"%s\": unmapping it from slot %zu to make room",
                                     s->units[d].name, k);
    }
    ddo__session_unbind_unit(s, d);
    sl->mapped_unit = DDO__NONE;
    sl->backed = false;
    ddo__slot_enter(s, sl, DDO__SLOT_FREE);
    return 0;
}

/*
 * An event worth waiting for when nothing can be evicted yet (mu held): the
 * oldest recorded release of a retiring slot that maps a unit, else (demand
 * loads) the upload of a prefetched slot still loading. NULL when none.
 */
static void *room_event(ddo_session *s, size_t except, bool demand)
{
    void *ev = NULL;
    uint64_t best = UINT64_MAX;
    for (size_t k = 0; k < s->slot_count; k++) {
        const ddo__slot *sl = &s->slots[k];
        if (k == except || sl->unsafe || sl->mapped_unit == DDO__NONE)
            continue;
        if (sl->state == DDO__SLOT_RETIRING && sl->release_recorded && sl->release_tick < best) {
            ev = sl->release_event;
            best = sl->release_tick;
        }
    }
    for (size_t k = 0; ev == NULL && demand && k < s->slot_count; k++) {
        const ddo__slot *sl = &s->slots[k];
        if (k != except && !sl->unsafe && sl->state == DDO__SLOT_LOADING && sl->issued &&
            sl->load_rc == 0 && sl->prefetched && sl->upload_recorded &&
            sl->mapped_unit == sl->unit)
            ev = sl->upload_event;
    }
    return ev;
}

/* What holds the mapped budget, for the message when a unit finds no room (mu held). */
static int no_room(ddo_session *s, size_t unit, uint64_t need, ddo__errbuf *eb)
{
    size_t leased = 0, busy = 0;
    for (size_t k = 0; k < s->slot_count; k++) {
        const ddo__slot *sl = &s->slots[k];
        if (sl->mapped_unit == DDO__NONE || sl->mapped_unit == unit)
            continue;
        if (sl->state == DDO__SLOT_LEASED)
            leased++;
        else
            busy++;
    }
    char b1[32], b2[32], b3[32];
    return ddo__fail(eb, DDO_E_BUSY,
                     "unit \"%s\": no room for %s of weights in the mapped budget: %s of %s "
                     "(vmm_resident_weight_budget_gb) held by %zu leased and %zu loading or "
                     "prefetched units; release a unit first",
                     s->units[unit].name, ddo__format_bytes(need, b1, sizeof(b1)),
                     ddo__format_bytes(ddo__account_used(&s->acc_device), b2, sizeof(b2)),
                     ddo__format_bytes(s->acc_device.limit, b3, sizeof(b3)), leased, busy);
}

/*
 * Loader: binds a handle to every weight of the job's unit (takes mu; waits
 * on device events without it). On failure the handles bound so far go back
 * to the pool.
 */
int ddo__session_bind_unit(ddo_session *s, const ddo__job *job, ddo__errbuf *eb)
{
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(s->plan, job->unit, &n);
    const char *name = s->units[job->unit].name;
    bool demand = !job->prefetch;
    size_t waits = 0;
    int rc = 0;
    ddo__mutex_lock(&s->mu);
    for (size_t k = 0; ts != NULL && k < n && rc == 0; k++) {
        size_t t = ts[k];
        uint64_t size = s->wl->handle_bytes[t];
        if (size == 0 || s->w_handle[t] != 0)
            continue;
        for (;;) {
            uint64_t h = 0;
            if (pool_take(s, size, &h)) {
                s->w_handle[t] = h;
                break;
            }
            uint64_t used = ddo__account_used(&s->acc_device);
            if (used <= s->acc_device.limit && size <= s->acc_device.limit - used) {
                rc = ddo__account_take(&s->acc_device, size, eb);
                if (rc != 0)
                    break;
                rc = ddo__dev_phys_create(s->dev, size, &h);
                if (rc != 0) {
                    ddo__account_give(&s->acc_device, size);
                    char b[32];
                    rc = ddo__session_fail_ctx(
                        eb, rc, "unit \"%s\": tensor \"%s\": creating its %s handle", name,
                        ddo__session_tensor_name(s, t), ddo__format_bytes(size, b, sizeof(b)));
                    break;
                }
                s->w_handle[t] = h;
                break;
            }
            /* Make room: pooled handles of other sizes first, then an idle unit's. */
            if (s->pool.count > 0) {
                size_t i = --s->pool.count;
                (void)handle_release(s, s->pool.handle[i], s->pool.size[i], NULL);
                continue;
            }
            ddo__session_reap(s);
            size_t v = evictable(s, job->slot, demand);
            if (v != DDO__NONE) {
                rc = evict(s, v, eb);
                if (rc != 0)
                    break;
                continue;
            }
            void *ev = waits <= 2 * s->slot_count ? room_event(s, job->slot, demand) : NULL;
            if (ev == NULL) {
                rc = no_room(s, job->unit, s->wl->unit_bytes[job->unit], eb);
                break;
            }
            waits++;
            ddo__mutex_unlock(&s->mu);
            int wrc = ddo__dev_event_synchronize(s->dev, ev);
            ddo__mutex_lock(&s->mu);
            if (wrc != 0) {
                rc = ddo__session_fail_ctx(
                    eb, wrc, "unit \"%s\": waiting for room in the mapped budget", name);
                break;
            }
        }
    }
    if (rc != 0)
        ddo__session_unbind_unit(s, job->unit);
    ddo__mutex_unlock(&s->mu);
    return rc;
}
