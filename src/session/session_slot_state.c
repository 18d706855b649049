/*
 * session_slot_state.c - the execution slots' state machine, at the bottom of the session's
 * layers (docs/map.md): the pool, the VMM mappings and the loader change a slot's state only
 * through these functions, and session_slots.c chooses and backs slots above them.
 *
 * Slot states: free -> loading -> ready -> leased -> retiring -> ready/free.
 * The loader's results become READY here (ddo__session_reap). Every change of a slot's state,
 * and of the unit it holds, goes through transition() below; debug builds assert that it is one
 * of the machine's transitions and the slot's invariants after it.
 */
#include "session/session.h"

#include "device/device.h"

/* ------------------------------------------------------------------------ */
/* The state machine                                                         */
/* ------------------------------------------------------------------------ */

#define TO(state) (1u << (state))

/* The transitions of a safe slot: for each state, the states it may enter. An unsafe slot
 * only goes FREE (ddo__slot_set_unsafe) or keeps its state and lets its unit go. */
static const unsigned legal[] = {
    [DDO__SLOT_FREE] = TO(DDO__SLOT_FREE) | TO(DDO__SLOT_LOADING),
    /* a demand load may take the slot of a prefetch whose copies are issued */
    [DDO__SLOT_LOADING] =
        TO(DDO__SLOT_FREE) | TO(DDO__SLOT_LOADING) | TO(DDO__SLOT_READY) | TO(DDO__SLOT_LEASED),
    [DDO__SLOT_READY] = TO(DDO__SLOT_FREE) | TO(DDO__SLOT_LOADING) | TO(DDO__SLOT_LEASED),
    [DDO__SLOT_LEASED] = TO(DDO__SLOT_FREE) | TO(DDO__SLOT_RETIRING),
    /* a retiring slot is reused once its release event passed, or leased again at once */
    [DDO__SLOT_RETIRING] =
        TO(DDO__SLOT_FREE) | TO(DDO__SLOT_LOADING) | TO(DDO__SLOT_READY) | TO(DDO__SLOT_LEASED),
};

static bool is_legal(const ddo__slot *sl, ddo__slot_state to)
{
    if (sl->unsafe)
        return to == DDO__SLOT_FREE || to == sl->state;
    return (unsigned)sl->state < DDO_ARRAY_LEN(legal) && (legal[sl->state] & TO(to)) != 0;
}

/* The invariants of slot i after a transition (debug builds). */
static void check_slot(const ddo_session *s, const ddo__slot *sl)
{
    (void)s;
    (void)sl;
    /* A free slot holds no unit; a safe slot in any other state holds one. */
    DDO_ASSERT(sl->state != DDO__SLOT_FREE || sl->unit == DDO__NONE);
    DDO_ASSERT(sl->unsafe || sl->state == DDO__SLOT_FREE || sl->unit != DDO__NONE);
    /* The unit a safe slot holds points back at it. */
    DDO_ASSERT(sl->unsafe || sl->unit == DDO__NONE ||
               s->units[sl->unit].slot == (size_t)(sl - s->slots));
    /* Only a load not acquired yet is prefetched. */
    DDO_ASSERT(sl->unsafe || !sl->prefetched || sl->state == DDO__SLOT_LOADING ||
               sl->state == DDO__SLOT_READY);
}

/*
 * The one transition: slot sl enters state `to` holding `unit` (DDO__NONE: none) afterwards,
 * the unit's back pointer kept in step. Entering LOADING starts a load (a new ticket,
 * prefetch as given); LEASED and RETIRING stamp the LRU and release ticks; READY from
 * RETIRING forgets the passed release event. mu held, or the loader idle.
 */
static void transition(ddo_session *s, ddo__slot *sl, ddo__slot_state to, size_t unit,
                       bool prefetch)
{
    size_t i = (size_t)(sl - s->slots);
    bool legal_move = is_legal(sl, to);
    DDO_ASSERT(legal_move);
    (void)legal_move;
    if (unit != sl->unit || to == DDO__SLOT_LOADING) {
        if (sl->unit != DDO__NONE && s->units[sl->unit].slot == i)
            s->units[sl->unit].slot = DDO__NONE;
        sl->unit = unit;
        if (unit != DDO__NONE)
            s->units[unit].slot = i;
    }
    if (to == DDO__SLOT_FREE || unit == DDO__NONE) {
        sl->prefetched = false;
        sl->load_rc = 0;
    } else if (to == DDO__SLOT_LOADING) {
        sl->prefetched = prefetch;
        sl->issued = false;
        sl->load_rc = 0;
        sl->release_recorded = false;
        sl->ticket = s->next_ticket++;
        sl->last_use = s->tick++;
    } else if (to == DDO__SLOT_READY) {
        if (sl->state == DDO__SLOT_RETIRING)
            sl->release_recorded = false;
    } else if (to == DDO__SLOT_LEASED) {
        sl->prefetched = false;
        sl->release_recorded = false;
        sl->last_use = s->tick++;
    } else if (to == DDO__SLOT_RETIRING) {
        sl->release_recorded = true;
        sl->release_tick = s->tick++;
    }
    sl->state = to;
    check_slot(s, sl);
}

void ddo__slot_enter(ddo_session *s, ddo__slot *slot, ddo__slot_state to)
{
    DDO_ASSERT(to != DDO__SLOT_LOADING);
    transition(s, slot, to, to == DDO__SLOT_FREE ? DDO__NONE : slot->unit, false);
}

void ddo__slot_load(ddo_session *s, ddo__slot *slot, size_t unit, bool prefetch)
{
    DDO_ASSERT(unit != DDO__NONE);
    transition(s, slot, DDO__SLOT_LOADING, unit, prefetch);
}

void ddo__slot_forget(ddo_session *s, ddo__slot *slot)
{
    DDO_ASSERT(slot->unsafe);
    transition(s, slot, slot->state, DDO__NONE, false);
}

void ddo__slot_mark_unsafe(ddo_session *s, ddo__slot *slot)
{
    if (slot->unsafe)
        return;
    slot->unsafe = true;
    ddo__metrics_add(&s->metrics, DDO_M_reclaim_failures, 1);
    s->unsafe_count++;
    ddo__metrics_set(&s->metrics, DDO_M_unsafe_slots, (double)s->unsafe_count);
}

void ddo__slot_set_unsafe(ddo_session *s, ddo__slot *slot)
{
    ddo__slot_mark_unsafe(s, slot);
    ddo__slot_enter(s, slot, DDO__SLOT_FREE);
}

size_t ddo__session_reap(ddo_session *s)
{
    size_t retired = 0;
    for (size_t i = 0; i < s->slot_count; i++) {
        ddo__slot *sl = &s->slots[i];
        if (sl->unsafe)
            continue;
        if (sl->state == DDO__SLOT_LOADING && sl->issued) {
            if (sl->load_rc != 0) {
                /* A failed prefetch: the unit is loaded again on demand. */
                ddo__slot_enter(s, sl, DDO__SLOT_FREE);
                continue;
            }
            if (ddo__dev_event_query(s->dev, sl->upload_event) == 0) {
                ddo__slot_enter(s, sl, DDO__SLOT_READY);
                retired++;
                s->retired_total++;
            }
        } else if (sl->state == DDO__SLOT_RETIRING) {
            if (!sl->release_recorded || ddo__dev_event_query(s->dev, sl->release_event) == 0)
                ddo__slot_enter(s, sl, DDO__SLOT_READY);
        }
    }
    return retired;
}
