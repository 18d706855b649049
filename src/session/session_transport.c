/*
 * session_transport.c - how a unit's bytes get from their source to device memory
 * (session_transport.h): the table of transports, the staging windows (the plan's pinned
 * ring, or the bounce buffer when it has none), and the uploads of a unit and of the
 * residents built on them.
 *
 *   registered           retained memory registered for the copy engine, or a caller's host
 *                        tensor registered in place (host_pins.c): direct DMA, in pieces
 *                        that never cross a registration segment
 *   pageable             retained pageable memory: memcpy into a window, then copy
 *   file                 re-read from the file into a window; the identity is checked
 *                        before and after every read (source.c)
 *   checkpoint           resident tensors at setup and reload: ddo_checkpoint_read into a
 *                        window (a file or a caller's memory)
 *   resident_registered  a caller's resident tensor registered in place: direct DMA
 *   coded                coded retained bytes (weight_codec): into the decode area, then
 *                        decoded into place on the device (session_codec.c)
 *   coded_file           a file tensor's coded stream from its sidecar (weight_codec_cache_dir)
 *                        into a window, then as coded (session_codec.c); raw file on a bad one
 *   store                donor mode: device->device copies from the unit's buffer on the store
 *                        device (session_store.c)
 */
#include "session/session_transport.h"

#include "device/device.h"
#include "session/session_codec.h"

#include <stdlib.h>
#include <string.h>

/* ---- windows ---- */

int ddo__window_get(ddo_session *s, ddo__window *w, ddo__errbuf *eb)
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

int ddo__window_put(ddo_session *s, ddo__window *w, ddo__errbuf *eb)
{
    if (w->ring)
        return ddo__staging_submit(s->staging, w->index, s->copy_stream, eb);
    int rc = ddo__dev_stream_synchronize(s->dev, s->copy_stream);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "copy stream");
    return 0;
}

int ddo__session_create_buffers(ddo_session *s)
{
    s->use_staging = s->b.staging_windows > 0 && s->b.staging_window_bytes > 0;
    if (s->use_staging) {
        int rc =
            ddo__staging_create(s->dev, s->b.staging_windows, (size_t)s->b.staging_window_bytes,
                                &s->acc_staging, &s->staging, &s->err);
        if (rc != 0) {
            s->staging = NULL;
            return rc;
        }
    } else {
        s->bounce = malloc(DDO__BOUNCE_BYTES);
        if (s->bounce == NULL)
            return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: out of memory");
    }
    return 0;
}

/* ---- the upload loops ---- */

/* The bytes of one piece and the running totals, after the piece's copy was queued. */
static void count_piece(ddo_session *s, const ddo__transport *t, size_t len)
{
    ddo__metrics_add(&s->metrics, t->metric, (double)len);
    ddo__metrics_add(&s->metrics, DDO_M_copy_bytes, (double)len);
    ddo__metrics_add(&s->metrics, DDO_M_copies, 1);
}

int ddo__transport_direct(ddo_session *s, const ddo__transport *t, const ddo__upload *up,
                          ddo__errbuf *eb)
{
    uint64_t pos = 0;
    while (pos < up->nbytes) {
        uint64_t left = up->nbytes - pos;
        size_t len = (size_t)(left < DDO__COPY_PIECE_BYTES ? left : DDO__COPY_PIECE_BYTES);
        /* Never across a registration segment: see ddo__source_segment_left. */
        uint64_t seg = ddo__source_segment_left(s->source, up->tensor, pos);
        if (seg < len)
            len = (size_t)seg;
        int rc = ddo__dev_copy_h2d(s->dev, up->dst + pos, up->host + pos, len, s->copy_stream);
        if (rc != 0)
            return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": upload",
                                         ddo__session_tensor_name(s, up->tensor));
        count_piece(s, t, len);
        pos += len;
    }
    return 0;
}

int ddo__transport_staged(ddo_session *s, const ddo__transport *t, const ddo__upload *up,
                          ddo__errbuf *eb)
{
    uint64_t pos = 0;
    while (pos < up->nbytes) {
        ddo__window w;
        int rc = ddo__window_get(s, &w, eb);
        if (rc != 0)
            return rc;
        size_t cap = t->piece != NULL ? t->piece(w.cap) : w.cap;
        if (cap == 0)
            return ddo__fail(eb, DDO_E_INTERNAL, "staging window of %zu bytes is too small", w.cap);
        uint64_t left = up->nbytes - pos;
        size_t len = (size_t)(left < cap ? left : cap);
        const void *data = w.p;
        rc = t->fill(s, up, pos, len, &w, &data, eb);
        if (rc != 0)
            return rc;
        rc = ddo__dev_copy_h2d(s->dev, up->dst + pos, data, len, s->copy_stream);
        if (rc != 0)
            return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": upload",
                                         ddo__session_tensor_name(s, up->tensor));
        rc = ddo__window_put(s, &w, eb);
        if (rc != 0)
            return rc;
        count_piece(s, t, len);
        pos += len;
    }
    return 0;
}

/* ---- the staged transports: filling a window ---- */

static int fill_pageable(ddo_session *s, const ddo__upload *up, uint64_t pos, size_t len,
                         const ddo__window *w, const void **data, ddo__errbuf *eb)
{
    (void)s;
    (void)data;
    (void)eb;
    memcpy(w->p, up->host + pos, len);
    return 0;
}

/* The largest piece a file read may use in a window of cap bytes. */
static size_t file_piece(size_t cap)
{
    size_t need = ddo__source_window_need(cap);
    size_t slack = need > cap ? need - cap : 0;
    return cap > slack ? cap - slack : 0;
}

static int fill_file(ddo_session *s, const ddo__upload *up, uint64_t pos, size_t len,
                     const ddo__window *w, const void **data, ddo__errbuf *eb)
{
    return ddo__source_read_file(s->source, up->tensor, pos, len, w->p, w->cap, data, eb);
}

static int fill_checkpoint(ddo_session *s, const ddo__upload *up, uint64_t pos, size_t len,
                           const ddo__window *w, const void **data, ddo__errbuf *eb)
{
    (void)data;
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(s->ck, up->tensor);
    if (ti != NULL && ti->file_index != UINT32_MAX && ddo__source_fault_hit() != 0)
        return ddo__fail(eb, DDO_E_IO, "tensor \"%s\": resident read of %zu bytes: injected fault",
                         ti->name, len);
    int rc = ddo_checkpoint_read(s->ck, up->tensor, pos, w->p, len);
    if (rc != 0)
        return ddo__fail_from_last(eb, rc);
    return 0;
}

/* ---- the table ---- */

static const ddo__transport transports[DDO__TRANSPORT_COUNT] = {
    [DDO__TRANSPORT_REGISTERED] = { "registered", DDO_M_bytes_from_registered,
                                    ddo__transport_direct, NULL, NULL },
    [DDO__TRANSPORT_PAGEABLE] = { "pageable", DDO_M_bytes_staged_from_retained,
                                  ddo__transport_staged, NULL, fill_pageable },
    [DDO__TRANSPORT_FILE] = { "file", DDO_M_bytes_staged_from_file, ddo__transport_staged,
                              file_piece, fill_file },
    [DDO__TRANSPORT_CHECKPOINT] = { "checkpoint", DDO_M_bytes_resident_uploaded,
                                    ddo__transport_staged, NULL, fill_checkpoint },
    [DDO__TRANSPORT_RESIDENT_REGISTERED] = { "resident_registered", DDO_M_bytes_resident_uploaded,
                                             ddo__transport_direct, NULL, NULL },
    [DDO__TRANSPORT_CODED] = { "coded", DDO_M_bytes_coded_uploaded, ddo__transport_coded, NULL,
                               NULL },
    [DDO__TRANSPORT_CODED_FILE] = { "coded_file", DDO_M_bytes_staged_from_sidecar,
                                    ddo__transport_coded_file, NULL, NULL },
    [DDO__TRANSPORT_STORE] = { "store", DDO_M_bytes_from_store, ddo__transport_store, NULL, NULL },
};

const ddo__transport *ddo__transport_get(ddo__transport_id id)
{
    DDO_ASSERT((unsigned)id < DDO__TRANSPORT_COUNT);
    return &transports[id];
}

ddo__transport_id ddo__transport_for(const ddo_session *s, size_t tensor,
                                     const unsigned char **host)
{
    if (ddo__session_store_used(s)) { /* donor mode: every streamed tensor is on the store */
        *host = NULL;
        return DDO__TRANSPORT_STORE;
    }
    bool registered = false;
    *host = ddo__source_host_ptr(s->source, tensor, &registered);
    return *host == NULL && ddo__session_codec_streams(s, tensor) ? DDO__TRANSPORT_CODED_FILE
           : *host == NULL                                        ? DDO__TRANSPORT_FILE
           : ddo__source_coded(s->source, tensor)                 ? DDO__TRANSPORT_CODED
           : registered                                           ? DDO__TRANSPORT_REGISTERED
                                                                  : DDO__TRANSPORT_PAGEABLE;
}

/* ---- uploads ---- */

/* Uploads nbytes of tensor to dst on the copy stream by the given transport. */
static int upload_tensor(ddo_session *s, size_t tensor, uint64_t dst, uint64_t nbytes,
                         ddo__transport_id kind, const unsigned char *host, ddo__errbuf *eb)
{
    const ddo__transport *t = ddo__transport_get(kind);
    ddo__upload up = { tensor, dst, nbytes, host };
    return t->upload(s, t, &up, eb);
}

/* Copies of a unit's registered host-tensor pieces, merged where the device and the host
 * layout agree (the pinned arena keeps a unit's neighbouring pieces at their device gaps,
 * host_pins.h). */
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
            return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": upload",
                                         ddo__session_tensor_name(s, r->tensor));
        ddo__metrics_add(&s->metrics, DDO_M_copies, 1);
        pos += len;
    }
    ddo__metrics_add(&s->metrics, ddo__transport_get(DDO__TRANSPORT_REGISTERED)->metric,
                     (double)r->payload);
    ddo__metrics_add(&s->metrics, DDO_M_copy_bytes, (double)r->payload);
    r->len = 0;
    r->payload = 0;
    return 0;
}

/* Adds one piece to the run, flushing first when it cannot join. */
static int run_add(ddo_session *s, copy_run *r, size_t tensor, const ddo__host_piece *pc,
                   uint64_t dst, ddo__errbuf *eb)
{
    const unsigned char *src = pc->src;
    if (r->len > 0) {
        uint64_t end = r->dst + r->len;
        bool joins = dst >= end && dst - end < DDO_TENSOR_ALIGN && src > r->src &&
                     (uint64_t)(src - r->src) == dst - r->dst &&
                     ddo__source_one_region(s->source, r->src, dst + pc->len - r->dst);
        if (joins) {
            r->len = dst + pc->len - r->dst;
            r->payload += pc->len;
            return 0;
        }
        int rc = run_flush(s, r, eb);
        if (rc != 0)
            return rc;
    }
    *r = (copy_run){ dst, src, pc->len, pc->len, tensor };
    return 0;
}

/*
 * Issues the copies of every streamed tensor of job->unit to its place at dst (or its own
 * range, per weight); adds the bytes to *ubytes and sets *reread when one came from the file.
 * The pieces of host tensors registered in place go through one copy_run (merged copies).
 */
int ddo__session_upload_unit(ddo_session *s, const ddo__job *job, uint64_t dst, uint64_t *ubytes,
                             bool *reread, ddo__errbuf *eb)
{
    size_t count = 0;
    const size_t *tensors = ddo_plan_unit_tensors(s->plan, job->unit, &count);
    copy_run run = { 0 };
    int rc = 0;
    ddo__session_codec_begin(s, job->slot);
    for (size_t i = 0; i < count && rc == 0; i++) {
        size_t t = tensors[i];
        ddo_tensor_location loc;
        if (ddo_plan_tensor_location(s->plan, t, &loc) != 0)
            return ddo__fail_from_last(eb, DDO_E_INTERNAL);
        if (loc.placement != DDO_PLACEMENT_STREAMED || loc.nbytes == 0)
            continue;
        uint64_t to = ddo__route_per_weight(s->route) ? s->w_va[t] : dst + loc.offset;
        const unsigned char *host = NULL;
        ddo__transport_id kind = ddo__transport_for(s, t, &host);
        *reread = *reread || kind == DDO__TRANSPORT_FILE || kind == DDO__TRANSPORT_CODED_FILE;
        ddo__host_piece pieces[3];
        size_t np =
            kind == DDO__TRANSPORT_REGISTERED ? ddo__source_host_pieces(s->source, t, pieces) : 0;
        for (size_t k = 0; k < np && rc == 0; k++) /* a host tensor registered in place */
            rc = run_add(s, &run, t, &pieces[k], to + pieces[k].offset, eb);
        if (np == 0 && run.len > 0)
            rc = run_flush(s, &run, eb);
        if (np == 0 && rc == 0)
            rc = upload_tensor(s, t, to, loc.nbytes, kind, host, eb);
        *ubytes += loc.nbytes;
    }
    if (rc == 0 && run.len > 0)
        rc = run_flush(s, &run, eb);
    int crc = ddo__session_codec_finish(s, rc == 0, eb); /* the decode stream joins */
    return rc != 0 ? rc : crc;
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
                               DDO__TRANSPORT_RESIDENT_REGISTERED, pieces[k].src, &s->err);
        if (np == 0)
            rc = upload_tensor(s, t, s->arena + loc.offset, loc.nbytes, DDO__TRANSPORT_CHECKPOINT,
                               NULL, &s->err);
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
        return ddo__session_fail_ctx(&s->err, rc, "resident upload");
    s->resident_loads++;
    return 0;
}
