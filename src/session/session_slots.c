/*
 * session_slots.c - the execution slots: the choice of a slot for a load, and slot backing
 * and reclaim (their state machine is session_slot_state.c, below the handle pool, the VMM
 * mappings and the loader that this file drives).
 *
 * Slot states: free -> loading -> ready -> leased -> retiring -> ready/free.
 * The host thread decides which slot holds which unit (under mu) and queues
 * a job for the loader (session_loader.c); acquire and release (session_lease.c)
 * lease the unit and hand it back; the loader's results become READY here
 * (ddo__session_reap). Every change of a slot's state, and of the unit it
 * holds, goes through transition() below; debug builds assert that it is one
 * of the machine's transitions and the slot's invariants after it.
 */
#include "session/session.h"

#include "device/device.h"
#include "os/platform.h"

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Slot selection                                                            */
/* ------------------------------------------------------------------------ */

/*
 * Chooses the slot for a new load (mu held). Demand loads take, in order: a
 * free slot, the least recently used ready slot, the oldest retiring slot
 * (the loader waits for its release event), a prefetched ready slot, a
 * prefetched loading slot whose copies are issued; DDO__PICK_WAIT when only
 * unissued loads remain; DDO__PICK_NONE when every slot is leased or unsafe.
 * Prefetch takes only the first three and never a slot holding a unit in
 * `keep` (the current unit and the prefetch window). On vmm_fast_runtime a unit whose range
 * still maps a slot's handle (an alias) takes that slot when it is free, ready or retiring;
 * a prefetch waits for it otherwise (DDO__PICK_SKIP), so in a repeated order every unit keeps
 * its slot and no upload remaps (a demand load takes any slot).
 */
enum ddo__pick ddo__session_pick_slot(ddo_session *s, size_t unit, bool prefetch,
                                      const size_t *keep, size_t keep_count, size_t *out)
{
    size_t best[5] = { DDO__NONE, DDO__NONE, DDO__NONE, DDO__NONE, DDO__NONE };
    /* The unit's home under the order in force (vmm_fast_runtime, session_prefetch.c), else
     * the slot its range still maps if that alias was made under this order. */
    size_t own = DDO__NONE;
    if (unit != DDO__NONE && s->order.known) {
        own = s->order.home[unit];
        if (own == DDO__NONE && s->units[unit].alias_epoch == s->order.epoch)
            own = s->units[unit].alias_slot;
    }
    bool own_ok = false;
    bool unissued = false;
    for (size_t i = 0; i < s->slot_count; i++) {
        ddo__slot *sl = &s->slots[i];
        if (sl->unsafe || sl->state == DDO__SLOT_LEASED)
            continue;
        if (prefetch && sl->unit != DDO__NONE && ddo__session_in_list(keep, keep_count, sl->unit))
            continue;
        int cls;
        uint64_t key;
        switch (sl->state) {
        case DDO__SLOT_FREE:
            cls = 0;
            key = sl->backed ? 0 : 1; /* backed first */
            break;
        case DDO__SLOT_READY:
            cls = sl->prefetched ? 3 : 1;
            key = sl->last_use;
            break;
        case DDO__SLOT_RETIRING:
            cls = 2;
            key = sl->release_tick;
            break;
        case DDO__SLOT_LOADING:
            if (!sl->issued) {
                unissued = true;
                continue;
            }
            cls = 4;
            key = sl->ticket;
            break;
        default:
            continue;
        }
        if (prefetch && cls > 2)
            continue;
        own_ok = own_ok || (i == own && cls <= 2);
        size_t b = best[cls];
        if (b == DDO__NONE) {
            best[cls] = i;
            continue;
        }
        const ddo__slot *bs = &s->slots[b];
        uint64_t bkey = cls == 0   ? (bs->backed ? 0u : 1u)
                        : cls == 2 ? bs->release_tick
                        : cls == 4 ? bs->ticket
                                   : bs->last_use;
        if (key < bkey)
            best[cls] = i;
    }
    if (own_ok) { /* the slot whose handle the unit's range still maps: no remap */
        *out = own;
        return DDO__PICK_FOUND;
    }
    if (own != DDO__NONE && prefetch)
        return DDO__PICK_SKIP; /* its own slot is busy: load it when that slot frees */
    for (int c = 0; c < 5; c++) {
        if (best[c] != DDO__NONE) {
            *out = best[c];
            return DDO__PICK_FOUND;
        }
    }
    return unissued && !prefetch ? DDO__PICK_WAIT : DDO__PICK_NONE;
}

/* Frees unit's range from every idle slot other than keep that still maps it (mu held): the
 * range is unmapped and, per weight, the unit's handles go back to the pool. */
static int free_range(ddo_session *s, size_t unit, size_t keep)
{
    for (size_t k = 0; k < s->slot_count; k++) {
        ddo__slot *o = &s->slots[k];
        if (k == keep || o->mapped_unit != unit)
            continue;
        if (o->unsafe)
            return ddo__fail(&s->err, DDO_E_UNSAFE,
                             "unit \"%s\": its range is still mapped by slot %zu, left unsafe "
                             "by a failed release",
                             s->units[unit].name, k);
        if (o->state == DDO__SLOT_LOADING && !o->issued)
            continue; /* its queued job unmaps the range before this one maps it */
        int rc = ddo__session_unmap_unit(s, unit);
        if (rc != 0) {
            ddo__slot_set_unsafe(s, o);
            return ddo__session_fail_ctx(&s->err, rc, "unit \"%s\": unmapping slot %zu",
                                         s->units[unit].name, k);
        }
        o->mapped_unit = DDO__NONE;
        if (ddo__route_per_weight(s->route)) {
            ddo__session_unbind_unit(s, unit);
            o->backed = false;
        }
    }
    return 0;
}

int ddo__session_start_load(ddo_session *s, size_t i, size_t unit, bool prefetch)
{
    ddo__slot *sl = &s->slots[i];
    if (ddo__route_maps(s->route)) {
        int rc = free_range(s, unit, i);
        if (rc != 0)
            return rc;
    }
    if (!sl->backed) {
        int rc = ddo__session_slot_back(s, sl, true);
        if (rc != 0)
            return rc;
    }
    void *wait_release = NULL;
    if (sl->state == DDO__SLOT_RETIRING && sl->release_recorded)
        wait_release = sl->release_event;
    ddo__slot_load(s, sl, unit, prefetch);
    s->units[unit].loads++;

    ddo__job job;
    memset(&job, 0, sizeof(job));
    job.slot = i;
    job.unit = unit;
    job.ticket = sl->ticket;
    job.wait_release = wait_release;
    job.prev_mapped = sl->mapped_unit;
    job.prefetch = prefetch;
    ddo__session_queue_job(s, &job);
    if (prefetch)
        ddo__metrics_add(&s->metrics, DDO_M_prefetch_issued, 1);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Slot backing and reclaim                                                  */
/* ------------------------------------------------------------------------ */

int ddo__session_slot_unback(ddo_session *s, ddo__slot *slot)
{
    if (!slot->backed || slot->unsafe)
        return 0;
    int rc = 0;
    bool per_weight = ddo__route_per_weight(s->route);
    if (ddo__route_maps(s->route)) {
        rc = ddo__session_drop_aliases(s, (size_t)(slot - s->slots));
        if (rc != 0) {
            ddo__slot_set_unsafe(s, slot);
            return rc;
        }
        if (slot->mapped_unit != DDO__NONE) {
            rc = ddo__session_unmap_unit(s, slot->mapped_unit);
            if (rc != 0) {
                ddo__slot_set_unsafe(s, slot);
                return ddo__session_fail_ctx(&s->err, rc, "slot %zu: unmapping unit \"%s\"",
                                             (size_t)(slot - s->slots),
                                             s->units[slot->mapped_unit].name);
            }
            if (per_weight)
                rc = ddo__session_release_unit_handles(s, slot->mapped_unit);
            slot->mapped_unit = DDO__NONE;
        }
        if (!per_weight)
            rc = ddo__dev_phys_release(s->dev, slot->handle);
    } else {
        rc = ddo__dev_mem_free(s->dev, slot->ptr);
    }
    if (rc != 0 && per_weight) {
        /* The failed handle was dropped (its bytes stay accounted); the slot stays usable. */
        slot->backed = false;
        ddo__slot_enter(s, slot, DDO__SLOT_FREE);
        return rc;
    }
    if (rc != 0) {
        ddo__slot_set_unsafe(s, slot);
        return ddo__session_fail_ctx(&s->err, rc,
                                     "slot %zu: releasing its backing (slot kept as unsafe)",
                                     (size_t)(slot - s->slots));
    }
    if (!per_weight)
        ddo__account_give(&s->acc_device, s->slot_bytes);
    slot->backed = false;
    slot->handle = 0;
    slot->ptr = 0;
    slot->upload_recorded = false;
    ddo__slot_enter(s, slot, DDO__SLOT_FREE);
    return 0;
}

/* An idle slot whose backing may go: ready (not prefetched, release complete) or free. */
static size_t idle_slot(ddo_session *s, const ddo__slot *except)
{
    size_t best = DDO__NONE;
    for (size_t i = 0; i < s->slot_count; i++) {
        ddo__slot *sl = &s->slots[i];
        if (sl == except || !sl->backed || sl->unsafe)
            continue;
        bool idle =
            sl->state == DDO__SLOT_FREE || (sl->state == DDO__SLOT_READY && !sl->prefetched);
        if (!idle)
            continue;
        /* Prefer a free slot (nothing to re-upload), then the least recently used. */
        if (best == DDO__NONE ||
            (sl->state == DDO__SLOT_FREE && s->slots[best].state != DDO__SLOT_FREE) ||
            (sl->state == s->slots[best].state && sl->last_use < s->slots[best].last_use))
            best = i;
    }
    return best;
}

/* Releases one idle slot's backing (mu held). *released = bytes (0 if none idle). */
static int reclaim_one(ddo_session *s, const ddo__slot *except, uint64_t *released)
{
    *released = 0;
    ddo__session_reap(s);
    if (ddo__route_per_weight(s->route)) {
        /* Pooled handles are idle backing too; then one idle unit's handles. */
        uint64_t before = ddo__account_used(&s->acc_device), pooled = 0;
        uint64_t t0 = ddo__now_ns();
        int rc = ddo__session_pool_release(s, &pooled);
        size_t i = rc == 0 ? idle_slot(s, except) : DDO__NONE;
        size_t unit = i != DDO__NONE ? s->slots[i].unit : DDO__NONE;
        if (i != DDO__NONE)
            rc = ddo__session_slot_unback(s, &s->slots[i]);
        uint64_t bytes = before - ddo__account_used(&s->acc_device);
        if (bytes > 0)
            ddo__session_trace(s, "reclaim", unit, t0, ddo__now_ns(), bytes);
        if (bytes > 0) {
            ddo__metrics_add(&s->metrics, DDO_M_reclaim_events, 1);
            ddo__metrics_add(&s->metrics, DDO_M_reclaim_bytes, (double)bytes);
        }
        if (rc != 0)
            return rc;
        *released = bytes;
        return 0;
    }
    size_t i = idle_slot(s, except);
    if (i == DDO__NONE)
        return 0;
    size_t unit = s->slots[i].unit;
    uint64_t t0 = ddo__now_ns();
    int rc = ddo__session_slot_unback(s, &s->slots[i]);
    if (rc != 0)
        return rc;
    ddo__session_trace(s, "reclaim", unit, t0, ddo__now_ns(), s->slot_bytes);
    ddo__metrics_add(&s->metrics, DDO_M_reclaim_events, 1);
    ddo__metrics_add(&s->metrics, DDO_M_reclaim_bytes, (double)s->slot_bytes);
    *released = s->slot_bytes;
    return 0;
}

/* Windows: the DXGI budget (less the headroom options) is tighter than need; false where
 * there is no reading (other systems, the cpu device, no adapter). */
static bool dxgi_tight(const ddo_session *s, uint64_t need)
{
    ddo__dxgi_memory m;
    if (ddo__device_is_cpu(s->dev) || ddo__os_dxgi_query(&m) != NULL)
        return false;
    return ddo__dxgi_pressure(&m, need, s->set.dxgi_local_headroom, s->set.dxgi_shared_headroom);
}

int ddo__session_slot_back(ddo_session *s, ddo__slot *slot, bool allow_pressure)
{
    /* vmm_runtime: the loader binds each weight's handle when a unit loads. */
    if (slot->backed || ddo__route_per_weight(s->route))
        return 0;
    int rc;
    if (allow_pressure && s->set.pressure_reclaim) {
        uint64_t free_bytes = 0, total = 0;
        rc = ddo__dev_mem_info(s->dev, &free_bytes, &total);
        if (rc != 0)
            return ddo__session_fail_ctx(&s->err, rc, "slot %zu: device memory query",
                                         (size_t)(slot - s->slots));
        uint64_t need = s->slot_bytes + DDO__RECLAIM_MARGIN_BYTES;
        if (free_bytes < need || dxgi_tight(s, need)) {
            uint64_t released = 0;
            rc = reclaim_one(s, slot, &released);
            if (rc != 0)
                return rc;
            if (released > 0)
                ddo__metrics_add(&s->metrics, DDO_M_reclaim_pressure_events, 1);
        }
    }
    rc = ddo__account_take(&s->acc_device, s->slot_bytes, &s->err);
    if (rc != 0)
        return rc;
    if (ddo__route_maps(s->route))
        rc = ddo__dev_phys_create(s->dev, s->slot_bytes, &slot->handle);
    else
        rc = ddo__dev_mem_alloc(s->dev, s->slot_bytes, &slot->ptr);
    if (rc != 0) {
        ddo__account_give(&s->acc_device, s->slot_bytes);
        char b[32];
        return ddo__session_fail_ctx(&s->err, rc, "slot %zu: creating %s of backing",
                                     (size_t)(slot - s->slots),
                                     ddo__format_bytes(s->slot_bytes, b, sizeof(b)));
    }
    slot->backed = true;
    slot->mapped_unit = DDO__NONE;
    slot->upload_recorded = false;
    ddo__slot_enter(s, slot, DDO__SLOT_FREE);
    return 0;
}

int ddo_session_reclaim(ddo_session *s, uint64_t *released)
{
    if (s == NULL || released == NULL)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_reclaim: session and released are required");
    if (s->unloaded) {
        *released = 0;
        return 0;
    }
    ddo__mutex_lock(&s->mu);
    uint64_t bytes = 0;
    int rc = reclaim_one(s, NULL, &bytes);
    ddo__mutex_unlock(&s->mu);
    if (rc != 0)
        return rc;
    *released = bytes;
    return 0;
}
