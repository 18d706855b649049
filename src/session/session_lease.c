/*
 * session_lease.c - leases: ddo_session_acquire finds or loads the unit's slot (a hit, a
 * prefetch still loading, or a load on demand, waiting while every slot is busy but will
 * free) and makes the host's stream wait for its upload; ddo_session_release records the
 * release event on the host's stream, after which the slot may be reused.
 */
#include "session/session.h"

#include "device/device.h"
#include "session/session_codec.h"

static void wait_issued(ddo_session *s, size_t i, uint64_t *stall)
{
    if (s->slots[i].issued)
        return;
    uint64_t t0 = ddo__now_ns();
    while (!s->slots[i].issued)
        ddo__cond_wait(&s->cv, &s->mu);
    *stall += ddo__now_ns() - t0;
}

/*
 * weight_codec: the decodes of slot i's load are checked before the load is first leased
 * (session_codec.c). mu is released while the host waits for them, so the loader goes on
 * issuing the next units; only the host leases, so the slot still holds u afterwards. A
 * failed check fails the acquire naming the tensor and frees the slot (the unit loads again
 * on the next acquire); a slot whose decodes may still run is kept as unsafe.
 */
static int verify_decodes(ddo_session *s, size_t i, ddo__unit_rt *u)
{
    if (!ddo__session_codec_due(s, i))
        return 0;
    ddo__errbuf eb;
    ddo__errbuf_clear(&eb);
    bool unsafe = false;
    ddo__mutex_unlock(&s->mu);
    int rc = ddo__session_codec_verify(s, i, &unsafe, &eb);
    ddo__mutex_lock(&s->mu);
    if (rc == 0)
        return 0;
    ddo__fail(&s->err, rc, "acquire \"%s\": %s", u->name, eb.msg);
    ddo__slot *sl = &s->slots[i];
    if (unsafe)
        ddo__slot_mark_unsafe(s, sl);
    if (!sl->unsafe)
        ddo__slot_enter(s, sl, DDO__SLOT_FREE);
    else
        u->slot = DDO__NONE; /* the unsafe slot keeps its record; the unit loads again */
    return rc;
}

/* The refusal of an acquire of u when no slot can take it: all leased or unsafe. */
static int no_slot(ddo_session *s, const ddo__unit_rt *u)
{
    size_t leased = 0, unsafe = 0;
    for (size_t k = 0; k < s->slot_count; k++) {
        leased += s->slots[k].state == DDO__SLOT_LEASED ? 1 : 0;
        unsafe += s->slots[k].unsafe ? 1 : 0;
    }
    if (unsafe > 0)
        return ddo__fail(&s->err, DDO_E_BUSY,
                         "acquire \"%s\": no execution slot available (%zu of %zu "
                         "leased, %zu unsafe after a failed release); release a unit "
                         "first",
                         u->name, leased, s->slot_count, unsafe);
    return ddo__fail(&s->err, DDO_E_BUSY,
                     "acquire \"%s\": all %zu execution slots are leased; release a "
                     "unit first or raise execution_slots",
                     u->name, s->slot_count);
}

/*
 * Finds a slot for unit (waiting, s->mu held, while slots are busy but will free) and starts
 * its load; *slot on success, the wait added to *stall.
 */
static int claim_slot(ddo_session *s, size_t unit, size_t *slot, uint64_t *stall)
{
    size_t i;
    for (;;) {
        enum ddo__pick p = ddo__session_pick_slot(s, unit, false, NULL, 0, &i);
        if (p == DDO__PICK_FOUND)
            break;
        if (p == DDO__PICK_NONE)
            return no_slot(s, &s->units[unit]);
        uint64_t t0 = ddo__now_ns();
        ddo__cond_wait(&s->cv, &s->mu);
        *stall += ddo__now_ns() - t0;
        ddo__session_reap(s);
    }
    *slot = i;
    return ddo__session_start_load(s, i, unit, false);
}

static int acquire_locked(ddo_session *s, size_t unit, void *stream, uint64_t *stall)
{
    ddo__unit_rt *u = &s->units[unit];
    ddo__metrics_add(&s->metrics, DDO_M_acquires, 1);
    ddo__session_learn(s, unit);
    if (u->resident) {
        u->leased = true;
        ddo__metrics_add(&s->metrics, DDO_M_hits, 1);
        return 0;
    }
    bool retried = false;
again:
    ddo__session_reap(s);
    size_t i = u->slot;
    if (i != DDO__NONE) {
        ddo__slot *sl = &s->slots[i];
        if (sl->prefetched)
            ddo__metrics_add(&s->metrics, DDO_M_prefetch_hits, 1);
        if (sl->state == DDO__SLOT_READY || sl->state == DDO__SLOT_RETIRING)
            ddo__metrics_add(&s->metrics, DDO_M_hits, 1);
    } else {
        ddo__metrics_add(&s->metrics, DDO_M_misses, 1);
        int rc = claim_slot(s, unit, &i, stall);
        if (rc != 0)
            return rc;
    }
    ddo__slot *sl = &s->slots[i];
    if (sl->state == DDO__SLOT_LOADING) {
        wait_issued(s, i, stall);
        if (sl->unit != unit) {
            /* While mu was released the load failed and its slot let the unit go (a slot
             * that turned unsafe forgets it): load it again, once. */
            if (retried)
                return ddo__fail(&s->err, DDO_E_DEVICE,
                                 "acquire \"%s\": its load was abandoned twice (slot %zu "
                                 "failed)",
                                 u->name, i);
            retried = true;
            goto again;
        }
        if (sl->load_rc != 0 && sl->prefetched && !retried) {
            /* A failed prefetch is not this acquire's error: load on demand instead. */
            if (!sl->unsafe)
                ddo__slot_enter(s, sl, DDO__SLOT_FREE);
            else
                ddo__slot_forget(s, sl);
            retried = true;
            goto again;
        }
        if (sl->load_rc != 0) {
            int rc = sl->load_rc;
            ddo__fail(&s->err, rc, "acquire \"%s\": %s", u->name, sl->load_err.msg);
            if (!sl->unsafe)
                ddo__slot_enter(s, sl, DDO__SLOT_FREE);
            else
                u->slot = DDO__NONE; /* the unsafe slot keeps its record; the unit loads again */
            return rc;
        }
        int rc = verify_decodes(s, i, u);
        if (rc != 0)
            return rc;
        rc = ddo__dev_stream_wait_event(s->dev, stream, sl->upload_event);
        if (rc != 0)
            return ddo__session_fail_ctx(&s->err, rc, "acquire \"%s\": waiting for its upload",
                                         u->name);
    } else {
        int rc = verify_decodes(s, i, u); /* a load that finished before its first lease */
        if (rc != 0)
            return rc;
    }
    ddo__slot_enter(s, sl, DDO__SLOT_LEASED);
    u->leased = true;
    return 0;
}

/* The checks acquire and release share: a session, a stream, a unit of the plan. */
static int check_lease_args(ddo_session *s, size_t unit, const ddo_stream *stream, const char *fn)
{
    return ddo__session_check_unit(s, stream != NULL, unit, fn, "session and stream");
}

/* A unit's acquire in its waits (mu held): whether it waited, and whether on the file. */
static void note_waits(ddo_session *s, size_t unit, uint64_t stall)
{
    ddo__unit_rt *u = &s->units[unit];
    u->waits.acquires++;
    if (stall == 0)
        return;
    u->waits.waits++;
    u->waits.wait_ns += stall;
    if (u->slot != DDO__NONE && s->slots[u->slot].load_file) {
        u->waits.file_waits++;
        u->waits.file_wait_ns += stall;
    }
}

int ddo_session_unit_waits(ddo_session *s, size_t unit, ddo_unit_waits *out)
{
    if (s == NULL || out == NULL || unit >= s->unit_count)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_unit_waits: a session, a unit of its plan and out are "
                         "required");
    ddo__mutex_lock(&s->mu);
    *out = s->units[unit].waits;
    ddo__mutex_unlock(&s->mu);
    return 0;
}

int ddo_session_acquire(ddo_session *s, size_t unit, ddo_stream *stream)
{
    int arc = check_lease_args(s, unit, stream, "ddo_session_acquire");
    if (arc != 0)
        return arc;
    if (s->unloaded)
        return ddo__fail(&s->err, DDO_E_STATE,
                         "acquire \"%s\": session unloaded: call ddo_session_reload",
                         s->units[unit].name);
    if (s->units[unit].leased)
        return ddo__fail(&s->err, DDO_E_STATE, "acquire \"%s\": unit is already leased",
                         s->units[unit].name);
    void *native = ddo__stream_handle(stream);
    uint64_t stall = 0;
    ddo__mutex_lock(&s->mu);
    int rc = acquire_locked(s, unit, native, &stall);
    if (rc == 0) {
        note_waits(s, unit, stall);
        /* Again in one pass (a module read at its start and its end, the next block of a
         * packed unit): the window moved at the pass's first acquire. From here, at a pass's
         * end it would load the unit whose slot the last block holds, and the host's
         * synchronize would wait for that copy with nothing left to compute. */
        bool again = s->order.pass != 0 && s->units[unit].pass == s->order.pass;
        s->units[unit].pass = s->order.pass;
        if (!again)
            ddo__session_prefetch(s, unit);
    }
    ddo__mutex_unlock(&s->mu);
    if (stall > 0)
        ddo__metrics_add(&s->metrics, DDO_M_stall_ns, (double)stall);
    return rc;
}

int ddo_session_release(ddo_session *s, size_t unit, ddo_stream *stream)
{
    int arc = check_lease_args(s, unit, stream, "ddo_session_release");
    if (arc != 0)
        return arc;
    ddo__unit_rt *u = &s->units[unit];
    if (!u->leased)
        return ddo__fail(&s->err, DDO_E_STATE, "release \"%s\": unit is not leased", u->name);
    ddo__metrics_add(&s->metrics, DDO_M_releases, 1);
    if (u->resident) {
        u->leased = false;
        return 0;
    }
    ddo__mutex_lock(&s->mu);
    ddo__slot *sl = &s->slots[u->slot];
    int rc = ddo__dev_event_record(s->dev, sl->release_event, ddo__stream_handle(stream));
    if (rc != 0) {
        ddo__mutex_unlock(&s->mu);
        /* The lease stays: nothing says when the stream's work on it ends. */
        return ddo__session_fail_ctx(&s->err, rc, "release \"%s\": recording the release event",
                                     u->name);
    }
    ddo__slot_enter(s, sl, DDO__SLOT_RETIRING);
    u->leased = false;
    ddo__mutex_unlock(&s->mu);
    return 0;
}
