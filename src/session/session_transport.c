/*
 * session_transport.c - how a unit's bytes get from their source to device memory
 * (session_transport.h): the staging windows (the plan's pinned ring, or the bounce buffer
 * when it has none), the two upload loops and the plain rows of the table of transports. The
 * table itself, naming the coded and store rows too, and the uploads of a unit and of the
 * residents are session_upload.c's, above this file and session_codec.c.
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

/* ---- the plain rows ---- */

const ddo__transport ddo__transport_registered = { "registered", DDO_M_bytes_from_registered,
                                                   ddo__transport_direct, NULL, NULL };
const ddo__transport ddo__transport_pageable = { "pageable", DDO_M_bytes_staged_from_retained,
                                                 ddo__transport_staged, NULL, fill_pageable };
const ddo__transport ddo__transport_file = { "file", DDO_M_bytes_staged_from_file,
                                             ddo__transport_staged, file_piece, fill_file };
const ddo__transport ddo__transport_checkpoint = { "checkpoint", DDO_M_bytes_resident_uploaded,
                                                   ddo__transport_staged, NULL, fill_checkpoint };
const ddo__transport ddo__transport_resident_registered = { "resident_registered",
                                                            DDO_M_bytes_resident_uploaded,
                                                            ddo__transport_direct, NULL, NULL };
