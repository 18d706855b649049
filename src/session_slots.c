/*
 * session_slots.c - execution slots, leases, the loader thread, prefetch and
 * reclaim of the session runtime.
 *
 * Slot states: free -> loading -> ready -> leased -> retiring -> ready/free.
 * The host thread decides which slot holds which unit (under mu) and queues
 * a job; the loader thread performs it in ticket order without holding mu:
 * it waits for the slot's previous consumer (the release event: stream-
 * ordered on the linear route, a host wait on the VMM route where the handle
 * must be remapped), remaps the handle into the unit's own virtual range
 * (vmm_fast_runtime), issues the copies on the copy stream (registered
 * memory directly, pageable retained memory and file reads through staging
 * windows), and records the upload event. acquire makes the host stream wait
 * on that event.
 *
 * vmm_runtime has no slot handle: cuMemMap maps a handle only at offset 0, so
 * every weight has its own handle of its rounded size, mapped into the
 * weight's own range. The loader binds them when the unit loads: a pooled
 * handle of the same size, else a new one within the mapped budget, else it
 * makes room by releasing pooled handles of other sizes and then by evicting
 * the least recently used idle unit (ready, its release event complete; never
 * a leased, loading or prefetched one - only a demand load may, as a last
 * resort, displace a prefetched unit that was never acquired, as pick_slot
 * already lets it take that unit's slot). Evicted handles go back to the pool.
 */
#define _POSIX_C_SOURCE 200809L
#include "session.h"

#include "device/device.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

/* Records "<context>: <the thread's last detail>" with code rc. */
static int DDO_PRINTF(3, 4) fail_ctx(ddo__errbuf *eb, int rc, const char *fmt, ...)
{
    char last[DDO_ERRBUF_BYTES];
    char ctx[512];
    snprintf(last, sizeof(last), "%s", ddo_last_error());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof(ctx), fmt, ap);
    va_end(ap);
    if (last[0] == '\0')
        return ddo__fail(eb, rc, "%s: %s", ctx, ddo_strerror(rc));
    return ddo__fail(eb, rc, "%s: %s", ctx, last);
}

static const char *tensor_name(const ddo_session *s, size_t tensor)
{
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(s->ck, tensor);
    return ti != NULL && ti->name != NULL ? ti->name : "?";
}

/* ------------------------------------------------------------------------ */
/* VMM mappings                                                              */
/* ------------------------------------------------------------------------ */

/*
 * Unmaps a slot's handle from unit: its one range (vmm_fast_runtime) or each
 * of its weights' ranges (vmm_runtime). Stops at the first failure and
 * returns the device's code (the slot is then unsafe: part may stay mapped).
 */
static int unmap_unit(ddo_session *s, size_t unit)
{
    if (!s->per_weight)
        return ddo__dev_unmap(s->dev, s->units[unit].va, s->slot_bytes);
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(s->plan, unit, &n);
    for (size_t k = 0; ts != NULL && k < n; k++) {
        size_t t = ts[k];
        if (s->w_map[t] == 0)
            continue;
        int rc = ddo__dev_unmap(s->dev, s->w_va[t], s->w_map[t]);
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

/*
 * Maps handle into unit's range (vmm_fast_runtime) or each weight's own bound
 * handle into the weight's range (vmm_runtime), at offset 0, with access. On
 * failure everything this call mapped is unmapped again; *unsafe when that
 * also failed. The error names the unit, the slot and the tensor.
 */
static int map_unit(ddo_session *s, uint64_t handle, size_t unit, size_t slot, bool *unsafe,
                    ddo__errbuf *eb)
{
    const char *name = s->units[unit].name;
    bool mapped = false;
    *unsafe = false;
    if (!s->per_weight) {
        int rc = map_range(s, s->units[unit].va, s->slot_bytes, handle, 0, &mapped);
        if (rc == 0)
            return 0;
        rc = fail_ctx(eb, rc, "unit \"%s\": %s slot %zu", name,
                      mapped ? "set access of" : "mapping", slot);
        if (mapped && ddo__dev_unmap(s->dev, s->units[unit].va, s->slot_bytes) != 0)
            *unsafe = true;
        return rc;
    }
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(s->plan, unit, &n);
    for (size_t k = 0; ts != NULL && k < n; k++) {
        size_t t = ts[k];
        if (s->w_map[t] == 0)
            continue;
        DDO_ASSERT(s->w_handle[t] != 0);
        int rc = map_range(s, s->w_va[t], s->w_map[t], s->w_handle[t], 0, &mapped);
        if (rc == 0)
            continue;
        rc = fail_ctx(eb, rc, "unit \"%s\": tensor \"%s\": %s slot %zu", name, tensor_name(s, t),
                      mapped ? "set access of" : "mapping", slot);
        /* Undo this unit's mappings: the earlier weights and, if mapped, this one. */
        for (size_t j = 0; j <= k; j++) {
            size_t w = ts[j];
            if (s->w_map[w] == 0 || (j == k && !mapped))
                continue;
            if (ddo__dev_unmap(s->dev, s->w_va[w], s->w_map[w]) != 0)
                *unsafe = true;
        }
        return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Uploading bytes                                                           */
/* ------------------------------------------------------------------------ */

typedef enum upload_kind {
    UPLOAD_REGISTERED,         /* copy engine reads retained memory directly */
    UPLOAD_PAGEABLE,           /* memcpy retained bytes into a window, then copy */
    UPLOAD_FILE,               /* ddo__source_read_file into a window (re-read) */
    UPLOAD_CHECKPOINT,         /* ddo_checkpoint_read into a window (resident tensors) */
    UPLOAD_RESIDENT_REGISTERED /* a resident host tensor the copy engine reads directly */
} upload_kind;

typedef struct window {
    void *p;
    size_t cap;
    size_t index;
    bool ring; /* a staging ring window (else the bounce buffer) */
} window;

static int window_get(ddo_session *s, window *w, ddo__errbuf *eb)
{
    if (s->use_staging) {
        if (s->staging == NULL) {
            /* Trimmed by ddo_session_trim_host_cache: re-created through the staging account. */
            int rc =
                ddo__staging_create(s->dev, s->b.staging_windows, (size_t)s->b.staging_window_bytes,
                                    &s->acc_staging, &s->staging, eb);
            if (rc != 0) {
                s->staging = NULL;
                return rc;
            }
        }
        uint64_t waited = 0;
        int rc = ddo__staging_acquire(s->staging, &w->index, &w->p, &waited, eb);
        if (rc != 0)
            return rc;
        w->cap = ddo__staging_window_bytes(s->staging);
        w->ring = true;
        return 0;
    }
    if (s->bounce == NULL) {
        s->bounce = malloc(DDO__BOUNCE_BYTES);
        if (s->bounce == NULL)
            return ddo__fail(eb, DDO_E_NO_MEMORY, "session: bounce buffer: out of host memory");
    }
    w->p = s->bounce;
    w->cap = DDO__BOUNCE_BYTES;
    w->index = 0;
    w->ring = false;
    return 0;
}

/* After the copy that reads the window was queued on the copy stream. */
static int window_put(ddo_session *s, window *w, ddo__errbuf *eb)
{
    if (w->ring)
        return ddo__staging_submit(s->staging, w->index, s->copy_stream, eb);
    int rc = ddo__dev_stream_synchronize(s->dev, s->copy_stream);
    if (rc != 0)
        return fail_ctx(eb, rc, "copy stream");
    return 0;
}

/* The largest piece a file read may use in a window of cap bytes. */
static size_t file_piece(size_t cap)
{
    size_t need = ddo__source_window_need(cap);
    size_t slack = need > cap ? need - cap : 0;
    return cap > slack ? cap - slack : 0;
}

/* Uploads nbytes of tensor to dst on the copy stream from the given tier. */
static int upload_tensor(ddo_session *s, size_t tensor, uint64_t dst, uint64_t nbytes,
                         upload_kind kind, const unsigned char *host, ddo__errbuf *eb)
{
    static const ddo__metric_id tier[] = {
        DDO_M_bytes_from_registered, DDO_M_bytes_staged_from_retained, DDO_M_bytes_staged_from_file,
        DDO_M_bytes_resident_uploaded, DDO_M_bytes_resident_uploaded
    };
    uint64_t pos = 0;
    while (pos < nbytes) {
        int rc;
        size_t len;
        if (kind == UPLOAD_REGISTERED || kind == UPLOAD_RESIDENT_REGISTERED) {
            uint64_t left = nbytes - pos;
            len = (size_t)(left < DDO__COPY_PIECE_BYTES ? left : DDO__COPY_PIECE_BYTES);
            /* Never across a registration segment: see ddo__source_segment_left. */
            uint64_t seg = ddo__source_segment_left(s->source, tensor, pos);
            if (seg < len)
                len = (size_t)seg;
            rc = ddo__dev_copy_h2d(s->dev, dst + pos, host + pos, len, s->copy_stream);
            if (rc != 0)
                return fail_ctx(eb, rc, "tensor \"%s\": upload", tensor_name(s, tensor));
            ddo__metrics_add(&s->metrics, DDO_M_copies, 1);
        } else {
            window w;
            rc = window_get(s, &w, eb);
            if (rc != 0)
                return rc;
            size_t cap = kind == UPLOAD_FILE ? file_piece(w.cap) : w.cap;
            if (cap == 0)
                return ddo__fail(eb, DDO_E_INTERNAL, "staging window of %zu bytes is too small",
                                 w.cap);
            uint64_t left = nbytes - pos;
            len = (size_t)(left < cap ? left : cap);
            const void *data = w.p;
            if (kind == UPLOAD_PAGEABLE) {
                memcpy(w.p, host + pos, len);
            } else if (kind == UPLOAD_FILE) {
                rc = ddo__source_read_file(s->source, tensor, pos, len, w.p, w.cap, &data, eb);
                if (rc != 0)
                    return rc;
            } else {
                const ddo_tensor_info *ti = ddo_checkpoint_tensor(s->ck, tensor);
                if (ti != NULL && ti->file_index != UINT32_MAX && ddo__source_fault_hit() != 0)
                    return ddo__fail(eb, DDO_E_IO,
                                     "tensor \"%s\": resident read of %zu bytes: injected fault",
                                     ti->name, len);
                rc = ddo_checkpoint_read(s->ck, tensor, pos, w.p, len);
                if (rc != 0)
                    return ddo__fail_from_last(eb, rc);
            }
            rc = ddo__dev_copy_h2d(s->dev, dst + pos, data, len, s->copy_stream);
            if (rc != 0)
                return fail_ctx(eb, rc, "tensor \"%s\": upload", tensor_name(s, tensor));
            ddo__metrics_add(&s->metrics, DDO_M_copies, 1);
            rc = window_put(s, &w, eb);
            if (rc != 0)
                return rc;
        }
        ddo__metrics_add(&s->metrics, tier[kind], (double)len);
        ddo__metrics_add(&s->metrics, DDO_M_copy_bytes, (double)len);
        pos += len;
    }
    return 0;
}

int ddo__session_upload_residents(ddo_session *s)
{
    uint64_t total = s->b.resident_bytes, done = 0;
    for (size_t i = 0; i < s->resident_count; i++) {
        size_t t = s->resident[i];
        ddo_tensor_location loc;
        if (ddo_plan_tensor_location(s->plan, t, &loc) != 0)
            return ddo__fail_from_last(&s->err, DDO_E_INTERNAL);
        ddo__host_piece pieces[3];
        size_t np = ddo__source_host_pieces(s->source, t, pieces);
        int rc = 0;
        for (size_t k = 0; k < np && rc == 0; k++) /* registered in place (host_residents) */
            rc = upload_tensor(s, t, s->arena + loc.offset + pieces[k].offset, pieces[k].len,
                               UPLOAD_RESIDENT_REGISTERED, pieces[k].src, &s->err);
        if (np == 0)
            rc = upload_tensor(s, t, s->arena + loc.offset, loc.nbytes, UPLOAD_CHECKPOINT, NULL,
                               &s->err);
        if (rc != 0)
            return rc;
        done += loc.nbytes;
        if (s->opts.progress != NULL)
            s->opts.progress(s->opts.progress_user, "resident", done, total);
    }
    if (s->staging != NULL) {
        int rc = ddo__staging_drain(s->staging, &s->err);
        if (rc != 0)
            return rc;
    }
    int rc = ddo__dev_stream_synchronize(s->dev, s->copy_stream);
    if (rc != 0)
        return fail_ctx(&s->err, rc, "resident upload");
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The loader thread                                                         */
/* ------------------------------------------------------------------------ */

static int bind_unit(ddo_session *s, const ddo__job *job, ddo__errbuf *eb);
static void unbind_unit(ddo_session *s, size_t unit);

void ddo__session_trace(const ddo_session *s, const char *kind, size_t unit, uint64_t begin_ns,
                        uint64_t end_ns, uint64_t bytes)
{
    if (s->opts.trace != NULL)
        s->opts.trace(s->opts.trace_user, kind, unit, begin_ns, end_ns, bytes);
}

/* Runs on the copy stream's host thread when an upload's copies completed. */
static void upload_done(void *user)
{
    ddo__slot *slot = user;
    ddo_session *s = slot->owner;
    uint64_t now = ddo__now_ns();
    pthread_mutex_lock(&s->busy_mu);
    uint64_t start = slot->issue_ns > s->busy_last_done ? slot->issue_ns : s->busy_last_done;
    if (now > start)
        ddo__metrics_add(&s->metrics, DDO_M_copy_busy_ns, (double)(now - start));
    s->busy_last_done = now;
    size_t unit = slot->issue_unit;
    uint64_t bytes = slot->issue_bytes;
    pthread_mutex_unlock(&s->busy_mu);
    ddo__session_trace(s, "upload", unit, start, now, bytes);
}

/* Makes the copy stream (or, with VMM, this thread) wait for the slot's previous consumer. */
static int wait_previous(ddo_session *s, const ddo__job *job, const ddo__unit_rt *u,
                         ddo__errbuf *eb)
{
    if (job->wait_release == NULL)
        return 0;
    int rc;
    if (s->vmm)
        rc = ddo__dev_event_synchronize(s->dev, job->wait_release);
    else
        rc = ddo__dev_stream_wait_event(s->dev, s->copy_stream, job->wait_release);
    if (rc != 0)
        return fail_ctx(eb, rc, "unit \"%s\": waiting for the slot's previous consumer", u->name);
    return 0;
}

/* Moves the slot's handle from the unit it maps now (if any) to job->unit's range (VMM). */
static int remap_slot(ddo_session *s, ddo__job *job, ddo__slot *slot, const ddo__unit_rt *u,
                      ddo__errbuf *eb)
{
    int rc;
    if (job->prev_mapped != DDO__NONE) {
        /* The handle's previous upload must be complete before it moves. */
        if (slot->upload_recorded) {
            rc = ddo__dev_event_synchronize(s->dev, slot->upload_event);
            if (rc != 0)
                return fail_ctx(eb, rc, "unit \"%s\": previous upload", u->name);
        }
        uint64_t t_unmap = ddo__now_ns();
        rc = unmap_unit(s, job->prev_mapped);
        ddo__session_trace(s, "unmap", job->prev_mapped, t_unmap, ddo__now_ns(), 0);
        if (rc != 0) {
            job->unsafe_after = true;
            return fail_ctx(eb, rc, "unit \"%s\": unmapping slot %zu", u->name, job->slot);
        }
        job->mapped_after = DDO__NONE;
        if (s->per_weight) {
            pthread_mutex_lock(&s->mu);
            unbind_unit(s, job->prev_mapped);
            pthread_mutex_unlock(&s->mu);
        }
    }
    if (s->per_weight) {
        rc = bind_unit(s, job, eb);
        if (rc != 0)
            return rc;
    }
    bool unsafe = false;
    uint64_t t_map = ddo__now_ns();
    rc = map_unit(s, slot->handle, job->unit, job->slot, &unsafe, eb);
    ddo__session_trace(s, "map", job->unit, t_map, ddo__now_ns(),
                       s->per_weight ? u->weight_bytes : s->slot_bytes);
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

/* Copies of a unit's registered host-tensor pieces, merged where the device and the host
 * layout agree (the arena keeps a unit's neighbouring pieces at their device gaps). */
typedef struct copy_run {
    uint64_t dst;
    const unsigned char *src;
    uint64_t len;     /* bytes copied (the gaps between merged pieces included) */
    uint64_t payload; /* tensor bytes among them */
    size_t tensor;    /* the first piece's, for messages */
} copy_run;

static int run_flush(ddo_session *s, copy_run *r, ddo__errbuf *eb)
{
    for (uint64_t pos = 0; pos < r->len;) {
        uint64_t left = r->len - pos;
        size_t len = (size_t)(left < DDO__COPY_PIECE_BYTES ? left : DDO__COPY_PIECE_BYTES);
        int rc = ddo__dev_copy_h2d(s->dev, r->dst + pos, r->src + pos, len, s->copy_stream);
        if (rc != 0)
            return fail_ctx(eb, rc, "tensor \"%s\": upload", tensor_name(s, r->tensor));
        pos += len;
        ddo__metrics_add(&s->metrics, DDO_M_copies, 1);
    }
    ddo__metrics_add(&s->metrics, DDO_M_bytes_from_registered, (double)r->payload);
    ddo__metrics_add(&s->metrics, DDO_M_copy_bytes, (double)r->payload);
    r->len = 0;
    r->payload = 0;
    return 0;
}

/* Adds one piece to the run, flushing first when it cannot join. */
static int run_add(ddo_session *s, copy_run *r, size_t tensor, uint64_t dst,
                   const unsigned char *src, uint64_t len, ddo__errbuf *eb)
{
    if (r->len > 0) {
        uint64_t end = r->dst + r->len;
        bool joins = dst >= end && dst - end < DDO_TENSOR_ALIGN && src > r->src &&
                     (uint64_t)(src - r->src) == dst - r->dst &&
                     ddo__source_one_region(s->source, r->src, dst + len - r->dst);
        if (joins) {
            r->len = dst + len - r->dst;
            r->payload += len;
            return 0;
        }
        int rc = run_flush(s, r, eb);
        if (rc != 0)
            return rc;
    }
    *r = (copy_run){ dst, src, len, len, tensor };
    return 0;
}

/*
 * Issues the copies of every streamed tensor of job->unit to its place at dst (or its own
 * range, per_weight); adds the bytes to *ubytes and sets *reread when one came from the file.
 * The pieces of host tensors registered in place go through one copy_run (merged copies).
 */
static int upload_unit(ddo_session *s, const ddo__job *job, uint64_t dst, uint64_t *ubytes,
                       bool *reread, ddo__errbuf *eb)
{
    size_t count = 0;
    const size_t *tensors = ddo_plan_unit_tensors(s->plan, job->unit, &count);
    copy_run run = { 0 };
    int rc = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        size_t t = tensors[i];
        ddo_tensor_location loc;
        if (ddo_plan_tensor_location(s->plan, t, &loc) != 0)
            return ddo__fail_from_last(eb, DDO_E_INTERNAL);
        if (loc.placement != DDO_PLACEMENT_STREAMED || loc.nbytes == 0)
            continue;
        uint64_t to = s->per_weight ? s->w_va[t] : dst + loc.offset;
        bool registered = false;
        const unsigned char *host = ddo__source_host_ptr(s->source, t, &registered);
        upload_kind kind = host == NULL ? UPLOAD_FILE
                           : registered ? UPLOAD_REGISTERED
                                        : UPLOAD_PAGEABLE;
        *reread = *reread || kind == UPLOAD_FILE;
        ddo__host_piece pieces[3];
        size_t np = kind == UPLOAD_REGISTERED ? ddo__source_host_pieces(s->source, t, pieces) : 0;
        for (size_t k = 0; k < np && rc == 0; k++) /* a host tensor registered in place */
            rc = run_add(s, &run, t, to + pieces[k].offset, pieces[k].src, pieces[k].len, eb);
        if (np == 0 && run.len > 0)
            rc = run_flush(s, &run, eb);
        if (np == 0 && rc == 0)
            rc = upload_tensor(s, t, to, loc.nbytes, kind, host, eb);
        *ubytes += loc.nbytes;
    }
    if (rc == 0 && run.len > 0)
        rc = run_flush(s, &run, eb);
    return rc;
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
    if (s->vmm) {
        dst = u->va;
        if (job->prev_mapped != job->unit) {
            rc = remap_slot(s, job, slot, u, eb);
            if (rc != 0)
                return rc;
        }
    }

    pthread_mutex_lock(&s->busy_mu);
    slot->issue_ns = ddo__now_ns();
    slot->issue_unit = job->unit;
    pthread_mutex_unlock(&s->busy_mu);
    uint64_t ubytes = 0;
    bool reread = false;
    rc = upload_unit(s, job, dst, &ubytes, &reread, eb);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&s->busy_mu);
    slot->issue_bytes = ubytes;
    pthread_mutex_unlock(&s->busy_mu);
    if (reread)
        ddo__metrics_add(&s->metrics, DDO_M_file_rereads, 1);
    rc = ddo__dev_event_record(s->dev, slot->upload_event, s->copy_stream);
    if (rc != 0)
        return fail_ctx(eb, rc, "unit \"%s\": upload event", u->name);
    slot->upload_recorded = true;
    ddo__metrics_add(&s->metrics, DDO_M_uploads, 1);
    /* Copy-engine busy time only; a failure here costs a metric, not the upload. */
    (void)ddo__dev_host_fn(s->dev, s->copy_stream, upload_done, slot);
    return 0;
}

static void *loader_main(void *arg)
{
    ddo_session *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->quit && s->job_count == 0)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->job_count == 0)
            break;
        ddo__job job = s->jobs[s->job_head];
        s->loader_busy = true;
        pthread_mutex_unlock(&s->mu);

        ddo__errbuf eb;
        ddo__errbuf_clear(&eb);
        int rc = run_job(s, &job, &eb);
        bool unsafe = job.unsafe_after;
        if (rc != 0) {
            /* Copies of a failed job may still be in flight into the slot. */
            if (ddo__dev_stream_synchronize(s->dev, s->copy_stream) != 0)
                unsafe = true;
            /* A failed load leaves no mapping behind: the unit may load elsewhere. */
            if (!unsafe && s->vmm && job.mapped_after != DDO__NONE) {
                if (unmap_unit(s, job.mapped_after) == 0)
                    job.mapped_after = DDO__NONE;
                else
                    unsafe = true;
            }
        }

        pthread_mutex_lock(&s->mu);
        s->job_head = (s->job_head + 1) % s->slot_count;
        s->job_count--;
        ddo__slot *slot = &s->slots[job.slot];
        slot->mapped_unit = job.mapped_after;
        if (s->per_weight) {
            /* A unit left unmapped gives its handles back to the pool. */
            if (job.mapped_after == DDO__NONE)
                unbind_unit(s, job.unit);
            slot->backed = job.mapped_after != DDO__NONE;
        }
        slot->issued = true;
        slot->load_rc = rc;
        if (rc != 0)
            slot->load_err = eb;
        if (unsafe && !slot->unsafe) {
            slot->unsafe = true;
            ddo__metrics_add(&s->metrics, DDO_M_reclaim_failures, 1);
            s->unsafe_count++;
            ddo__metrics_set(&s->metrics, DDO_M_unsafe_slots, (double)s->unsafe_count);
        }
        s->loader_busy = false;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int ddo__session_loader_start(ddo_session *s)
{
    int e = pthread_create(&s->loader, NULL, loader_main, s);
    if (e != 0)
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: starting the loader thread failed");
    s->loader_started = true;
    return 0;
}

void ddo__session_loader_stop(ddo_session *s)
{
    if (!s->loader_started)
        return;
    pthread_mutex_lock(&s->mu);
    s->quit = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->loader, NULL);
    s->loader_started = false;
}

void ddo__session_wait_idle(ddo_session *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->job_count > 0 || s->loader_busy)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------------ */
/* Slot backing and reclaim                                                  */
/* ------------------------------------------------------------------------ */

static void set_unsafe(ddo_session *s, ddo__slot *slot)
{
    if (!slot->unsafe) {
        slot->unsafe = true;
        ddo__metrics_add(&s->metrics, DDO_M_reclaim_failures, 1);
        s->unsafe_count++;
        ddo__metrics_set(&s->metrics, DDO_M_unsafe_slots, (double)s->unsafe_count);
    }
    if (slot->unit != DDO__NONE && s->units[slot->unit].slot == (size_t)(slot - s->slots))
        s->units[slot->unit].slot = DDO__NONE;
    slot->unit = DDO__NONE;
    slot->state = DDO__SLOT_FREE;
}

/* ------------------------------------------------------------------------ */
/* vmm_runtime: one physical handle per weight                               */
/* ------------------------------------------------------------------------ */

/* Takes a pooled handle of exactly size bytes (mu held). */
static bool pool_take(ddo_session *s, uint64_t size, uint64_t *handle)
{
    for (size_t i = s->pool_count; i-- > 0;) {
        if (s->pool_size[i] != size)
            continue;
        *handle = s->pool_handle[i];
        s->pool_count--;
        s->pool_handle[i] = s->pool_handle[s->pool_count];
        s->pool_size[i] = s->pool_size[s->pool_count];
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
        return fail_ctx(eb, rc, "releasing a weight handle of %s (its bytes stay accounted)",
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
    DDO_ASSERT(s->pool_count < s->pool_cap);
    if (s->pool_count == s->pool_cap) {
        (void)handle_release(s, handle, size, NULL);
        return;
    }
    s->pool_handle[s->pool_count] = handle;
    s->pool_size[s->pool_count] = size;
    s->pool_count++;
}

int ddo__session_pool_release(ddo_session *s, uint64_t *bytes)
{
    int first = 0;
    *bytes = 0;
    while (s->pool_count > 0) {
        size_t i = --s->pool_count;
        int rc = handle_release(s, s->pool_handle[i], s->pool_size[i], &s->err);
        if (rc == 0)
            *bytes += s->pool_size[i];
        else if (first == 0)
            first = rc;
    }
    return first;
}

/* Moves unit's bound handles into the pool: its ranges are unmapped (mu held). */
static void unbind_unit(ddo_session *s, size_t unit)
{
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(s->plan, unit, &n);
    for (size_t k = 0; ts != NULL && k < n; k++) {
        size_t t = ts[k];
        if (s->w_handle[t] == 0)
            continue;
        pool_put(s, s->w_handle[t], s->w_map[t]);
        s->w_handle[t] = 0;
    }
}

/* Releases unit's bound handles: its ranges are unmapped (mu held). First error. */
static int release_unit_handles(ddo_session *s, size_t unit)
{
    int first = 0;
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(s->plan, unit, &n);
    for (size_t k = 0; ts != NULL && k < n; k++) {
        size_t t = ts[k];
        if (s->w_handle[t] == 0)
            continue;
        int rc = handle_release(s, s->w_handle[t], s->w_map[t], &s->err);
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
    int rc = unmap_unit(s, d);
    if (rc != 0) {
        set_unsafe(s, sl);
        return fail_ctx(eb, rc, "unit \"%s\": unmapping it from slot %zu to make room",
                        s->units[d].name, k);
    }
    unbind_unit(s, d);
    sl->mapped_unit = DDO__NONE;
    sl->backed = false;
    if (sl->unit != DDO__NONE && s->units[sl->unit].slot == k)
        s->units[sl->unit].slot = DDO__NONE;
    sl->unit = DDO__NONE;
    sl->state = DDO__SLOT_FREE;
    sl->prefetched = false;
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
static int bind_unit(ddo_session *s, const ddo__job *job, ddo__errbuf *eb)
{
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(s->plan, job->unit, &n);
    const char *name = s->units[job->unit].name;
    bool demand = !job->prefetch;
    size_t waits = 0;
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t k = 0; ts != NULL && k < n && rc == 0; k++) {
        size_t t = ts[k];
        uint64_t size = s->w_map[t];
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
                    rc = fail_ctx(eb, rc, "unit \"%s\": tensor \"%s\": creating its %s handle",
                                  name, tensor_name(s, t), ddo__format_bytes(size, b, sizeof(b)));
                    break;
                }
                s->w_handle[t] = h;
                break;
            }
            /* Make room: pooled handles of other sizes first, then an idle unit's. */
            if (s->pool_count > 0) {
                size_t i = --s->pool_count;
                (void)handle_release(s, s->pool_handle[i], s->pool_size[i], NULL);
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
                rc = no_room(s, job->unit, s->units[job->unit].weight_bytes, eb);
                break;
            }
            waits++;
            pthread_mutex_unlock(&s->mu);
            int wrc = ddo__dev_event_synchronize(s->dev, ev);
            pthread_mutex_lock(&s->mu);
            if (wrc != 0) {
                rc = fail_ctx(eb, wrc, "unit \"%s\": waiting for room in the mapped budget", name);
                break;
            }
        }
    }
    if (rc != 0)
        unbind_unit(s, job->unit);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int ddo__session_slot_unback(ddo_session *s, ddo__slot *slot)
{
    if (!slot->backed || slot->unsafe)
        return 0;
    int rc = 0;
    if (s->vmm) {
        if (slot->mapped_unit != DDO__NONE) {
            rc = unmap_unit(s, slot->mapped_unit);
            if (rc != 0) {
                set_unsafe(s, slot);
                return fail_ctx(&s->err, rc, "slot %zu: unmapping unit \"%s\"",
                                (size_t)(slot - s->slots), s->units[slot->mapped_unit].name);
            }
            if (s->per_weight)
                rc = release_unit_handles(s, slot->mapped_unit);
            slot->mapped_unit = DDO__NONE;
        }
        if (!s->per_weight)
            rc = ddo__dev_phys_release(s->dev, slot->handle);
    } else {
        rc = ddo__dev_mem_free(s->dev, slot->ptr);
    }
    if (rc != 0 && s->per_weight) {
        /* The failed handle was dropped (its bytes stay accounted); the slot stays usable. */
        slot->backed = false;
        if (slot->unit != DDO__NONE && s->units[slot->unit].slot == (size_t)(slot - s->slots))
            s->units[slot->unit].slot = DDO__NONE;
        slot->unit = DDO__NONE;
        slot->state = DDO__SLOT_FREE;
        slot->prefetched = false;
        return rc;
    }
    if (rc != 0) {
        set_unsafe(s, slot);
        return fail_ctx(&s->err, rc, "slot %zu: releasing its backing (slot kept as unsafe)",
                        (size_t)(slot - s->slots));
    }
    if (!s->per_weight)
        ddo__account_give(&s->acc_device, s->slot_bytes);
    slot->backed = false;
    slot->handle = 0;
    slot->ptr = 0;
    slot->upload_recorded = false;
    if (slot->unit != DDO__NONE && s->units[slot->unit].slot == (size_t)(slot - s->slots))
        s->units[slot->unit].slot = DDO__NONE;
    slot->unit = DDO__NONE;
    slot->state = DDO__SLOT_FREE;
    slot->prefetched = false;
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
    if (s->per_weight) {
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

int ddo__session_slot_back(ddo_session *s, ddo__slot *slot, bool allow_pressure)
{
    /* vmm_runtime: the loader binds each weight's handle when a unit loads. */
    if (slot->backed || s->per_weight)
        return 0;
    int rc;
    if (allow_pressure && s->set.pressure_reclaim) {
        uint64_t free_bytes = 0, total = 0;
        rc = ddo__dev_mem_info(s->dev, &free_bytes, &total);
        if (rc != 0)
            return fail_ctx(&s->err, rc, "slot %zu: device memory query",
                            (size_t)(slot - s->slots));
        if (free_bytes < s->slot_bytes + DDO__RECLAIM_MARGIN_BYTES) {
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
    if (s->vmm)
        rc = ddo__dev_phys_create(s->dev, s->slot_bytes, &slot->handle);
    else
        rc = ddo__dev_mem_alloc(s->dev, s->slot_bytes, &slot->ptr);
    if (rc != 0) {
        ddo__account_give(&s->acc_device, s->slot_bytes);
        char b[32];
        return fail_ctx(&s->err, rc, "slot %zu: creating %s of backing", (size_t)(slot - s->slots),
                        ddo__format_bytes(s->slot_bytes, b, sizeof(b)));
    }
    slot->backed = true;
    slot->mapped_unit = DDO__NONE;
    slot->upload_recorded = false;
    slot->state = DDO__SLOT_FREE;
    slot->unit = DDO__NONE;
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
    pthread_mutex_lock(&s->mu);
    uint64_t bytes = 0;
    int rc = reclaim_one(s, NULL, &bytes);
    pthread_mutex_unlock(&s->mu);
    if (rc != 0)
        return rc;
    *released = bytes;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Slot selection                                                            */
/* ------------------------------------------------------------------------ */

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
                if (sl->unit != DDO__NONE && s->units[sl->unit].slot == i)
                    s->units[sl->unit].slot = DDO__NONE;
                sl->unit = DDO__NONE;
                sl->state = DDO__SLOT_FREE;
                sl->prefetched = false;
                sl->load_rc = 0;
                continue;
            }
            if (ddo__dev_event_query(s->dev, sl->upload_event) == 0) {
                sl->state = DDO__SLOT_READY;
                retired++;
                s->retired_total++;
            }
        } else if (sl->state == DDO__SLOT_RETIRING) {
            if (!sl->release_recorded || ddo__dev_event_query(s->dev, sl->release_event) == 0) {
                sl->state = DDO__SLOT_READY;
                sl->release_recorded = false;
            }
        }
    }
    return retired;
}

static bool in_list(const size_t *list, size_t n, size_t v)
{
    for (size_t i = 0; i < n; i++)
        if (list[i] == v)
            return true;
    return false;
}

enum pick { PICK_FOUND, PICK_WAIT, PICK_NONE };

/*
 * Chooses the slot for a new load (mu held). Demand loads take, in order: a
 * free slot, the least recently used ready slot, the oldest retiring slot
 * (the loader waits for its release event), a prefetched ready slot, a
 * prefetched loading slot whose copies are issued; PICK_WAIT when only
 * unissued loads remain; PICK_NONE when every slot is leased or unsafe.
 * Prefetch takes only the first three and never a slot holding a unit in
 * `keep` (the current unit and the prefetch window).
 */
static enum pick pick_slot(ddo_session *s, bool prefetch, const size_t *keep, size_t keep_count,
                           size_t *out)
{
    size_t best[5] = { DDO__NONE, DDO__NONE, DDO__NONE, DDO__NONE, DDO__NONE };
    bool unissued = false;
    for (size_t i = 0; i < s->slot_count; i++) {
        ddo__slot *sl = &s->slots[i];
        if (sl->unsafe || sl->state == DDO__SLOT_LEASED)
            continue;
        if (prefetch && sl->unit != DDO__NONE && in_list(keep, keep_count, sl->unit))
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
    for (int c = 0; c < 5; c++) {
        if (best[c] != DDO__NONE) {
            *out = best[c];
            return PICK_FOUND;
        }
    }
    return unissued && !prefetch ? PICK_WAIT : PICK_NONE;
}

/* VMM: frees the unit's range if an idle slot other than `keep` still maps it (mu held). */
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
        int rc = unmap_unit(s, unit);
        if (rc != 0) {
            set_unsafe(s, o);
            return fail_ctx(&s->err, rc, "unit \"%s\": unmapping slot %zu", s->units[unit].name, k);
        }
        o->mapped_unit = DDO__NONE;
        if (s->per_weight) {
            unbind_unit(s, unit);
            o->backed = false;
        }
    }
    return 0;
}

/* Assigns slot i to unit and queues its upload (mu held). */
static int start_load(ddo_session *s, size_t i, size_t unit, bool prefetch)
{
    ddo__slot *sl = &s->slots[i];
    if (s->vmm) {
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
    if (sl->unit != DDO__NONE && s->units[sl->unit].slot == i)
        s->units[sl->unit].slot = DDO__NONE;
    sl->state = DDO__SLOT_LOADING;
    sl->unit = unit;
    sl->prefetched = prefetch;
    sl->issued = false;
    sl->load_rc = 0;
    sl->release_recorded = false;
    sl->ticket = s->next_ticket++;
    sl->last_use = s->tick++;
    s->units[unit].slot = i;

    DDO_ASSERT(s->job_count < s->slot_count);
    ddo__job *job = &s->jobs[(s->job_head + s->job_count) % s->slot_count];
    job->slot = i;
    job->unit = unit;
    job->ticket = sl->ticket;
    job->wait_release = wait_release;
    job->prev_mapped = sl->mapped_unit;
    job->prefetch = prefetch;
    s->job_count++;
    pthread_cond_broadcast(&s->cv);
    if (prefetch)
        ddo__metrics_add(&s->metrics, DDO_M_prefetch_issued, 1);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Execution order and prefetch                                              */
/* ------------------------------------------------------------------------ */

static void set_order(ddo_session *s, const size_t *units, size_t count)
{
    memcpy(s->order, units, count * sizeof(*units));
    s->order_count = count;
    for (size_t u = 0; u < s->unit_count; u++)
        s->order_pos[u] = DDO__NONE;
    for (size_t i = 0; i < count; i++)
        if (s->order_pos[units[i]] == DDO__NONE)
            s->order_pos[units[i]] = i;
    s->order_known = true;
}

static void learn(ddo_session *s, size_t unit)
{
    if (s->order_known)
        return;
    if (s->learn_seen[unit]) {
        set_order(s, s->learn, s->learn_count);
        return;
    }
    s->learn_seen[unit] = true;
    s->learn[s->learn_count++] = unit;
}

/* The next units after `unit` (wrapping), skipping resident ones, at most max. */
static size_t window_after(ddo_session *s, size_t unit, size_t *out, size_t max)
{
    size_t n = 0;
    if (max == 0)
        return 0;
    bool use_order = s->order_known && s->order_pos[unit] != DDO__NONE;
    size_t len = use_order ? s->order_count : s->unit_count;
    size_t pos = use_order ? s->order_pos[unit] : unit;
    for (size_t k = 1; k < len && n < max; k++) {
        size_t w = use_order ? s->order[(pos + k) % len] : (pos + k) % len;
        if (w == unit || s->units[w].resident || in_list(out, n, w))
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
            held += s->units[m].weight_bytes;
    }
    return held <= s->acc_device.limit && s->units[unit].weight_bytes <= s->acc_device.limit - held;
}

static void prefetch(ddo_session *s, size_t unit)
{
    if (s->slot_count < 2)
        return;
    size_t max = s->slot_count - 1;
    size_t *keep = s->learn + s->unit_count; /* scratch after the learn list */
    keep[0] = unit;
    size_t n = window_after(s, unit, keep + 1, max);
    size_t depth = 0;
    for (size_t k = 0; k < n; k++) {
        size_t w = keep[1 + k];
        if (s->units[w].slot == DDO__NONE) {
            size_t i;
            if (pick_slot(s, true, keep, n + 1, &i) != PICK_FOUND)
                break;
            if (s->per_weight && !prefetch_fits(s, i, w))
                break;
            /* A prefetch failure is not the acquire's: the unit loads on demand. */
            ddo__errbuf saved = s->err;
            int rc = start_load(s, i, w, true);
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
        if (in_list(units, i, units[i]))
            return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                             "ddo_session_declare_order: unit %zu (\"%s\") listed twice", units[i],
                             s->units[units[i]].name);
    }
    pthread_mutex_lock(&s->mu);
    set_order(s, units, count);
    s->order_declared = true;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Leases                                                                    */
/* ------------------------------------------------------------------------ */

/* Waits for the slot's job to be issued (mu held); adds the wait to *stall. */
static void wait_issued(ddo_session *s, size_t i, uint64_t *stall)
{
    if (s->slots[i].issued)
        return;
    uint64_t t0 = ddo__now_ns();
    while (!s->slots[i].issued)
        pthread_cond_wait(&s->cv, &s->mu);
    *stall += ddo__now_ns() - t0;
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
        enum pick p = pick_slot(s, false, NULL, 0, &i);
        if (p == PICK_FOUND)
            break;
        if (p == PICK_NONE)
            return no_slot(s, &s->units[unit]);
        uint64_t t0 = ddo__now_ns();
        pthread_cond_wait(&s->cv, &s->mu);
        *stall += ddo__now_ns() - t0;
        ddo__session_reap(s);
    }
    *slot = i;
    return start_load(s, i, unit, false);
}

static int acquire_locked(ddo_session *s, size_t unit, void *stream, uint64_t *stall)
{
    ddo__unit_rt *u = &s->units[unit];
    ddo__metrics_add(&s->metrics, DDO_M_acquires, 1);
    learn(s, unit);
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
        if (sl->load_rc != 0 && sl->prefetched && !retried) {
            /* A failed prefetch is not this acquire's error: load on demand instead. */
            if (!sl->unsafe)
                sl->state = DDO__SLOT_FREE;
            sl->unit = DDO__NONE;
            sl->prefetched = false;
            sl->load_rc = 0;
            u->slot = DDO__NONE;
            retried = true;
            goto again;
        }
        if (sl->load_rc != 0) {
            int rc = sl->load_rc;
            ddo__fail(&s->err, rc, "acquire \"%s\": %s", u->name, sl->load_err.msg);
            if (!sl->unsafe) {
                sl->state = DDO__SLOT_FREE;
                sl->unit = DDO__NONE;
                sl->prefetched = false;
                sl->load_rc = 0;
            }
            u->slot = DDO__NONE;
            return rc;
        }
        int rc = ddo__dev_stream_wait_event(s->dev, stream, sl->upload_event);
        if (rc != 0)
            return fail_ctx(&s->err, rc, "acquire \"%s\": waiting for its upload", u->name);
    }
    sl->state = DDO__SLOT_LEASED;
    sl->prefetched = false;
    sl->release_recorded = false;
    sl->last_use = s->tick++;
    u->leased = true;
    return 0;
}

/* The checks acquire and release share: a session, a stream, a unit of the plan. */
static int check_lease_args(ddo_session *s, size_t unit, const ddo_stream *stream, const char *fn)
{
    if (s == NULL || stream == NULL)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "%s: session and stream are required", fn);
    if (unit >= s->unit_count)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "%s: unit %zu out of range (the plan has %zu units)", fn, unit,
                         s->unit_count);
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
    pthread_mutex_lock(&s->mu);
    int rc = acquire_locked(s, unit, native, &stall);
    if (rc == 0)
        prefetch(s, unit);
    pthread_mutex_unlock(&s->mu);
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
    pthread_mutex_lock(&s->mu);
    ddo__slot *sl = &s->slots[u->slot];
    int rc = ddo__dev_event_record(s->dev, sl->release_event, ddo__stream_handle(stream));
    if (rc != 0) {
        pthread_mutex_unlock(&s->mu);
        /* The lease stays: nothing says when the stream's work on it ends. */
        return fail_ctx(&s->err, rc, "release \"%s\": recording the release event", u->name);
    }
    sl->state = DDO__SLOT_RETIRING;
    sl->release_recorded = true;
    sl->release_tick = s->tick++;
    u->leased = false;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int ddo_session_tensor_address(ddo_session *s, size_t tensor, void **device_ptr)
{
    if (s == NULL || device_ptr == NULL)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_tensor_address: session and device_ptr are required");
    ddo_tensor_location loc;
    if (tensor >= ddo_checkpoint_tensor_count(s->ck) ||
        ddo_plan_tensor_location(s->plan, tensor, &loc) != 0)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_tensor_address: tensor %zu out of range", tensor);
    const char *name = tensor_name(s, tensor);
    if (loc.placement == DDO_PLACEMENT_SKIPPED)
        return ddo__fail(&s->err, DDO_E_NOT_FOUND,
                         "tensor \"%s\" is skipped (skip_modules_pattern): it has no device "
                         "address",
                         name);
    if (s->unloaded)
        return ddo__fail(&s->err, DDO_E_STATE,
                         "tensor \"%s\": session unloaded: call ddo_session_reload", name);
    uint64_t addr;
    if (loc.placement == DDO_PLACEMENT_RESIDENT) {
        addr = s->arena + loc.offset;
    } else {
        if (loc.unit >= s->unit_count)
            return ddo__fail(&s->err, DDO_E_INTERNAL, "tensor \"%s\": no unit", name);
        ddo__unit_rt *u = &s->units[loc.unit];
        if (!u->leased || u->slot == DDO__NONE)
            return ddo__fail(&s->err, DDO_E_STATE,
                             "tensor \"%s\": unit \"%s\" is not leased: acquire it first", name,
                             u->name);
        addr = s->per_weight ? s->w_va[tensor]
               : s->vmm      ? u->va + loc.offset
                             : s->slots[u->slot].ptr + loc.offset;
    }
    *device_ptr = (void *)(uintptr_t)addr;
    return 0;
}
