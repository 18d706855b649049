/*
 * session_loader.c - the loader thread. The host thread queues one job per load (under mu,
 * session_slots.c); the loader performs them in ticket order without holding mu: it waits
 * for the slot's previous consumer (the release event: stream-ordered, except on vmm_runtime,
 * where the handles must move and this thread waits), makes the slot's handle appear at the
 * unit's own virtual range (vmm_fast_runtime: mapped once and kept, see place_handle) or binds
 * every weight's own handle (vmm_runtime, session_pool.c), issues the copies on the copy stream
 * (session_upload.c) and records the upload event. acquire makes the host stream wait on that
 * event.
 */
#include "session/session.h"

#include "device/device.h"
#include "session/session_codec.h"

/* Runs on the device's callback thread when an upload's copies completed. */
static void upload_done(void *user)
{
    ddo__upload_note *note = user;
    ddo_session *s = note->owner;
    uint64_t now = ddo__now_ns();
    ddo__mutex_lock(&s->busy_mu);
    uint64_t start = note->issue_ns > s->busy_last_done ? note->issue_ns : s->busy_last_done;
    if (now > start)
        ddo__metrics_add(&s->metrics, DDO_M_copy_busy_ns, (double)(now - start));
    s->busy_last_done = now;
    size_t unit = note->unit;
    uint64_t bytes = note->bytes;
    ddo__mutex_unlock(&s->busy_mu);
    ddo__session_trace(s, "upload", unit, start, now, bytes);
}

/* Notes the upload just issued (its event recorded) for upload_done: on the notify stream
 * after the event (on the copy stream only if that stream could not be created). A failure
 * costs a metric, not the upload. */
static void note_upload(ddo_session *s, ddo__slot *slot, size_t unit, uint64_t issue_ns,
                        uint64_t bytes)
{
    ddo__mutex_lock(&s->busy_mu);
    ddo__upload_note *note = &s->notes[s->note_seq++ % DDO__UPLOAD_NOTES];
    *note = (ddo__upload_note){ s, issue_ns, unit, bytes };
    ddo__mutex_unlock(&s->busy_mu);
    void *stream = s->copy_stream;
    if (s->notify_stream != NULL &&
        ddo__dev_stream_wait_event(s->dev, s->notify_stream, slot->upload_event) == 0)
        stream = s->notify_stream;
    (void)ddo__dev_host_fn(s->dev, stream, upload_done, note);
}

/* Makes the copy stream (or, on vmm_runtime, whose handles move, this thread) wait for the
 * slot's previous consumer. */
static int wait_previous(ddo_session *s, const ddo__job *job, const ddo__unit_rt *u,
                         ddo__errbuf *eb)
{
    if (job->wait_release == NULL)
        return 0;
    int rc;
    if (ddo__route_per_weight(s->route))
        rc = ddo__dev_event_synchronize(s->dev, job->wait_release);
    else
        rc = ddo__dev_stream_wait_event(s->dev, s->copy_stream, job->wait_release);
    if (rc != 0)
        return ddo__session_fail_ctx(
            eb, rc, "unit \"%s\": waiting for the slot's previous consumer", u->name);
    return 0;
}

/* vmm_runtime: moves the slot from the unit it maps now (if any) to job->unit: the previous
 * unit's weights are unmapped and their handles pooled, job->unit's weights bound and mapped. */
static int remap_slot(ddo_session *s, ddo__job *job, ddo__slot *slot, const ddo__unit_rt *u,
                      ddo__errbuf *eb)
{
    int rc;
    if (job->prev_mapped != DDO__NONE) {
        /* The handle's previous upload must be complete before it moves. */
        if (slot->upload_recorded) {
            rc = ddo__dev_event_synchronize(s->dev, slot->upload_event);
            if (rc != 0)
                return ddo__session_fail_ctx(eb, rc, "unit \"%s\": previous upload", u->name);
        }
        uint64_t t_unmap = ddo__now_ns();
        rc = ddo__session_unmap_unit(s, job->prev_mapped);
        ddo__session_trace(s, "unmap", job->prev_mapped, t_unmap, ddo__now_ns(), 0);
        if (rc != 0) {
            job->unsafe_after = true;
            return ddo__session_fail_ctx(eb, rc, "unit \"%s\": unmapping slot %zu", u->name,
                                         job->slot);
        }
        job->mapped_after = DDO__NONE;
        ddo__mutex_lock(&s->mu);
        ddo__session_unbind_unit(s, job->prev_mapped);
        ddo__mutex_unlock(&s->mu);
    }
    rc = ddo__session_bind_unit(s, job, eb);
    if (rc != 0)
        return rc;
    bool unsafe = false;
    uint64_t t_map = ddo__now_ns();
    rc = ddo__session_map_unit(s, slot->handle, job->unit, job->slot, &unsafe, eb);
    ddo__session_trace(s, "map", job->unit, t_map, ddo__now_ns(), s->wl->unit_bytes[job->unit]);
    if (rc != 0) {
        /* A mapping that could not be undone keeps its ranges reserved. */
        if (unsafe) {
            job->unsafe_after = true;
            job->mapped_after = job->unit;
        }
        return rc;
    }
    job->mapped_after = job->unit;
    return 0;
}

/*
 * vmm_fast_runtime: makes job->slot's handle appear at the unit's range. A slot's handle stays
 * mapped into the ranges of the units it held before (aliases, a mapping cache): when the unit's
 * range still maps this slot's handle, nothing is mapped (once every unit has settled into its
 * slot, uploads cost no driver call and no host wait); otherwise the unit's range is unmapped
 * from the slot it aliases, if any, and mapped to this slot's handle. The range the slot mapped
 * until now stays mapped as an alias. Nothing the GPU may still read is unmapped: the copies
 * into the slot wait for its previous consumer on the copy stream.
 */
static int place_handle(ddo_session *s, ddo__job *job, ddo__slot *slot, ddo__errbuf *eb)
{
    ddo__mutex_lock(&s->mu);
    bool cached = s->units[job->unit].alias_slot == job->slot;
    int rc = cached ? 0 : ddo__session_drop_alias(s, job->unit, eb);
    if (cached)
        s->units[job->unit].alias_slot = DDO__NONE;
    ddo__mutex_unlock(&s->mu);
    if (rc != 0)
        return rc;
    if (!cached) {
        bool unsafe = false;
        uint64_t t_map = ddo__now_ns();
        rc = ddo__session_map_unit(s, slot->handle, job->unit, job->slot, &unsafe, eb);
        ddo__session_trace(s, "map", job->unit, t_map, ddo__now_ns(), s->slot_bytes);
        if (rc != 0) {
            if (unsafe) {
                job->unsafe_after = true;
                job->mapped_after = job->unit;
            }
            return rc;
        }
        ddo__metrics_add(&s->metrics, DDO_M_vmm_maps, 1);
    }
    ddo__mutex_lock(&s->mu);
    if (job->prev_mapped != DDO__NONE && job->prev_mapped != job->unit) {
        s->units[job->prev_mapped].alias_slot = job->slot;
        s->units[job->prev_mapped].alias_epoch = s->order.known ? s->order.epoch : 0;
    }
    ddo__mutex_unlock(&s->mu);
    job->mapped_after = job->unit;
    return 0;
}

/* Performs one job (no lock held). */
static int run_job(ddo_session *s, ddo__job *job, ddo__errbuf *eb)
{
    ddo__slot *slot = &s->slots[job->slot];
    ddo__unit_rt *u = &s->units[job->unit];
    int rc;
    job->mapped_after = job->prev_mapped;
    job->unsafe_after = false;

    rc = wait_previous(s, job, u, eb);
    if (rc != 0)
        return rc;
    uint64_t dst = slot->ptr;
    if (ddo__route_maps(s->route)) {
        dst = u->va;
        if (job->prev_mapped != job->unit) {
            rc = ddo__route_per_weight(s->route) ? remap_slot(s, job, slot, u, eb)
                                                 : place_handle(s, job, slot, eb);
            if (rc != 0)
                return rc;
        }
    }

    uint64_t issue_ns = ddo__now_ns();
    uint64_t ubytes = 0;
    bool reread = false;
    /* every device of a split set, or this rank's share (session_split.c) */
    rc = ddo__session_split_used(s)
             ? ddo__session_split_upload_unit(s, job, dst, &ubytes, &reread, eb)
         : ddo__session_share_used(s)
             ? ddo__session_share_upload_unit(s, job, dst, &ubytes, &reread, eb)
             : ddo__session_upload_unit(s, job, dst, &ubytes, &reread, eb);
    if (rc != 0)
        return rc;
    job->read_file = reread;
    job->load_ns = ddo__now_ns() - issue_ns;
    if (reread)
        ddo__metrics_add(&s->metrics, DDO_M_file_rereads, 1);
    /* With the codec, after the unit's decodes too (the decode stream joined the copies). */
    void *tail = ddo__session_codec_stream(s);
    rc = ddo__dev_event_record(s->dev, slot->upload_event, tail != NULL ? tail : s->copy_stream);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "unit \"%s\": upload event", u->name);
    slot->upload_recorded = true;
    ddo__metrics_add(&s->metrics, DDO_M_uploads, 1);
    note_upload(s, slot, job->unit, issue_ns, ubytes);
    return 0;
}

static void *loader_main(void *arg)
{
    ddo_session *s = arg;
    ddo__mutex_lock(&s->mu);
    for (;;) {
        while (!s->quit && s->job_count == 0)
            ddo__cond_wait(&s->cv, &s->mu);
        if (s->job_count == 0)
            break;
        ddo__job job = s->jobs[s->job_head];
        s->loader_busy = true;
        ddo__mutex_unlock(&s->mu);

        ddo__errbuf eb;
        ddo__errbuf_clear(&eb);
        int rc = run_job(s, &job, &eb);
        bool unsafe = job.unsafe_after;
        if (rc != 0) {
            /* Copies and decodes of a failed job may still be in flight into the slot. */
            if (ddo__dev_stream_synchronize(s->dev, s->copy_stream) != 0)
                unsafe = true;
            if (ddo__session_codec_sync(s) != 0)
                unsafe = true;
            /* A failed load leaves no mapping behind: the unit may load elsewhere. */
            if (!unsafe && ddo__route_maps(s->route) && job.mapped_after != DDO__NONE) {
                if (ddo__session_unmap_unit(s, job.mapped_after) == 0)
                    job.mapped_after = DDO__NONE;
                else
                    unsafe = true;
            }
        }

        ddo__mutex_lock(&s->mu);
        s->job_head = (s->job_head + 1) % s->slot_count;
        s->job_count--;
        ddo__slot *slot = &s->slots[job.slot];
        slot->mapped_unit = job.mapped_after;
        if (ddo__route_per_weight(s->route)) {
            /* A unit left unmapped gives its handles back to the pool. */
            if (job.mapped_after == DDO__NONE)
                ddo__session_unbind_unit(s, job.unit);
            slot->backed = job.mapped_after != DDO__NONE;
        }
        slot->issued = true;
        slot->load_rc = rc;
        slot->load_file = rc == 0 && job.read_file;
        if (rc == 0 && job.read_file) {
            s->units[job.unit].waits.file_loads++;
            s->units[job.unit].waits.file_load_ns += job.load_ns;
        }
        if (rc != 0)
            slot->load_err = eb;
        if (unsafe)
            ddo__slot_mark_unsafe(s, slot);
        s->loader_busy = false;
        ddo__cond_broadcast(&s->cv);
    }
    ddo__mutex_unlock(&s->mu);
    return NULL;
}

int ddo__session_loader_start(ddo_session *s)
{
    int e = ddo__thread_create(&s->loader, loader_main, s);
    if (e != 0)
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: starting the loader thread failed");
    s->loader_started = true;
    return 0;
}

void ddo__session_loader_stop(ddo_session *s)
{
    if (!s->loader_started)
        return;
    ddo__mutex_lock(&s->mu);
    s->quit = true;
    ddo__cond_broadcast(&s->cv);
    ddo__mutex_unlock(&s->mu);
    ddo__thread_join(s->loader);
    s->loader_started = false;
}

void ddo__session_wait_idle(ddo_session *s)
{
    ddo__mutex_lock(&s->mu);
    while (s->job_count > 0 || s->loader_busy)
        ddo__cond_wait(&s->cv, &s->mu);
    ddo__mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------------ */

void ddo__session_queue_job(ddo_session *s, const ddo__job *job)
{
    DDO_ASSERT(s->job_count < s->slot_count);
    s->jobs[(s->job_head + s->job_count) % s->slot_count] = *job;
    s->job_count++;
    ddo__cond_broadcast(&s->cv);
}
