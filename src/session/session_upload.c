/*
 * session_upload.c - the uploads of a unit and of the residents: the one table of transports
 * (session_transport.h), the choice of a tensor's row, and the merged copies of host tensors
 * registered in place. It sits above the transports it names: the plain ones and the staging
 * windows (session_transport.c), the coded ones (session_codec.c), which stage their bytes
 * through the plain ones, and the store's (session_store.c).
 */
#include "session/session_codec.h"
#include "session/session_transport.h"

#include "device/device.h"

/* ---- the table ---- */

/* The coded and the store rows; the plain ones are session_transport.c's. */
static const ddo__transport coded = { "coded", DDO_M_bytes_coded_uploaded, ddo__transport_coded,
                                      NULL, NULL };
static const ddo__transport coded_file = { "coded_file", DDO_M_bytes_staged_from_sidecar,
                                           ddo__transport_coded_file, NULL, NULL };
static const ddo__transport store = { "store", DDO_M_bytes_from_store, ddo__transport_store, NULL,
                                      NULL };

static const ddo__transport *const transports[DDO__TRANSPORT_COUNT] = {
    [DDO__TRANSPORT_REGISTERED] = &ddo__transport_registered,
    [DDO__TRANSPORT_PAGEABLE] = &ddo__transport_pageable,
    [DDO__TRANSPORT_FILE] = &ddo__transport_file,
    [DDO__TRANSPORT_CHECKPOINT] = &ddo__transport_checkpoint,
    [DDO__TRANSPORT_RESIDENT_REGISTERED] = &ddo__transport_resident_registered,
    [DDO__TRANSPORT_CODED] = &coded,
    [DDO__TRANSPORT_CODED_FILE] = &coded_file,
    [DDO__TRANSPORT_STORE] = &store,
};

const ddo__transport *ddo__transport_get(ddo__transport_id id)
{
    DDO_ASSERT((unsigned)id < DDO__TRANSPORT_COUNT);
    return transports[id];
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

bool ddo__session_unit_next(const ddo_session *s, size_t unit, size_t *i, size_t *tensor,
                            ddo_tensor_location *loc)
{
    size_t count = 0;
    const size_t *tensors = ddo_plan_unit_tensors(s->plan, unit, &count);
    while (*i < count) {
        size_t t = tensors[(*i)++];
        if (ddo_plan_tensor_location(s->plan, t, loc) == 0 &&
            loc->placement == DDO_PLACEMENT_STREAMED && loc->nbytes > 0) {
            *tensor = t;
            return true;
        }
    }
    return false;
}

uint64_t ddo__session_unit_end(const ddo_session *s, size_t unit, size_t *first)
{
    uint64_t end = 0;
    size_t t = 0;
    ddo_tensor_location loc;
    for (size_t i = 0; ddo__session_unit_next(s, unit, &i, &t, &loc);) {
        if (end == 0 && first != NULL)
            *first = t;
        end = loc.offset + loc.nbytes > end ? loc.offset + loc.nbytes : end;
    }
    return end;
}

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
    copy_run run = { 0 };
    int rc = 0;
    ddo__session_codec_begin(s, job->slot);
    size_t t = 0;
    ddo_tensor_location loc;
    for (size_t i = 0; rc == 0 && ddo__session_unit_next(s, job->unit, &i, &t, &loc);) {
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
