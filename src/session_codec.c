/*
 * session_codec.c - the coded transport (weight_codec, docs/codec.md): a tensor whose retained
 * bytes are coded (source_codec.c) reaches its place in the slot in two steps on the copy
 * stream: its coded bytes are uploaded into the session's decode area (directly from
 * registered memory, or through a staging window), then the device's decoder expands them
 * into the tensor's place, writing only there. One decode area serves the session: the copy
 * stream runs the uploads and decodes in order, so the next tensor's upload into the area
 * starts only after the decode that reads it. Each decode writes its status words into the
 * area's status part; once a unit's last tensor is queued the loader waits for the copy
 * stream, reads the status back and checks every coded tensor of the unit against its plan
 * (ddo__codec_status_check), before the unit's upload event is recorded: a corrupted stream,
 * a decode that did not run and a decoding error fail the load, naming the tensor and block.
 *
 * The area: the largest coded stream of any streamed unit plus the status words of the unit
 * with the most coded blocks, allocated with the slots through the device weights account
 * (the plan's decode area, plan_codec.c, bounds it).
 */
#include "session_codec.h"

#include "codec.h"
#include "device/device.h"
#include "session_transport.h"

#include <stdlib.h>
#include <string.h>

#define AREA_ALIGN 256u

typedef struct pending {
    size_t tensor;
    uint64_t status_off; /* bytes into the status part */
} pending;

typedef struct ddo__session_codec {
    uint64_t scratch_bytes; /* the coded-bytes part, first */
    uint64_t status_bytes;  /* the status part, after it */
    uint64_t area;          /* device address (0: not backed) */
    bool area_unsafe;       /* a free failed: never freed again */
    uint64_t *status_host;  /* status_bytes, read back per unit */
    pending *pending;       /* the unit being uploaded: its coded tensors */
    size_t pending_count, pending_cap;
    uint64_t status_used;
} ddo__session_codec;

bool ddo__session_codec_wanted(const ddo_session *s)
{
    const char *v = ddo_plan_decision_get(s->plan, "weight_codec");
    return v != NULL && strcmp(v, "ddoc1") == 0;
}

/* True when the session's device has a decoder; *why says why not. */
static bool device_decodes(const ddo_session *s, const char **why)
{
    *why = "";
    if (ddo__device_is_cpu(s->dev))
        return true;
#if DDO_HAVE_CODEC_PTX
    return true;
#else
    *why = "libddo was built without nvcc, so the cuda device has no codec decoder";
    return false;
#endif
}

/* The area's sizes from the coded store: per unit, its coded tensors and their status. */
static void size_area(ddo_session *s, ddo__session_codec *c)
{
    for (size_t u = 0; u < s->unit_count; u++) {
        if (s->units[u].resident)
            continue;
        size_t n = 0, coded = 0;
        const size_t *t = ddo_plan_unit_tensors(s->plan, u, &n);
        uint64_t status = 0;
        for (size_t i = 0; i < n; i++) {
            const ddo__codec_plan *cp = ddo__source_coded(s->source, t[i]);
            if (cp == NULL)
                continue;
            coded++;
            status += cp->launch.status_bytes;
            c->scratch_bytes =
                cp->coded_bytes > c->scratch_bytes ? cp->coded_bytes : c->scratch_bytes;
        }
        c->status_bytes = status > c->status_bytes ? status : c->status_bytes;
        c->pending_cap = coded > c->pending_cap ? coded : c->pending_cap;
    }
    c->scratch_bytes = ddo__round_up(c->scratch_bytes, AREA_ALIGN);
    c->status_bytes = ddo__round_up(c->status_bytes, AREA_ALIGN);
}

int ddo__session_codec_create(ddo_session *s)
{
    if (!ddo__session_codec_wanted(s))
        return 0;
    const char *why = "";
    if (!device_decodes(s, &why))
        return ddo__fail(&s->err, DDO_E_UNSUPPORTED,
                         "session: the plan codes weights (weight_codec=ddoc1) but %s", why);
    ddo__session_codec *c = ddo__calloc(1, sizeof(*c));
    if (c == NULL)
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: codec: out of memory");
    s->codec = c;
    size_area(s, c);
    if (c->pending_cap == 0)
        return 0; /* nothing was coded: every tensor moves raw */
    c->status_host = malloc((size_t)c->status_bytes);
    c->pending = ddo__calloc(c->pending_cap, sizeof(*c->pending));
    if (c->status_host == NULL || c->pending == NULL)
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: codec: out of memory");
    return 0;
}

void ddo__session_codec_destroy(ddo_session *s)
{
    ddo__session_codec *c = s->codec;
    if (c == NULL)
        return;
    free(c->status_host);
    free(c->pending);
    free(c);
    s->codec = NULL;
}

static uint64_t area_bytes(const ddo__session_codec *c)
{
    return c->scratch_bytes + c->status_bytes;
}

int ddo__session_codec_back(ddo_session *s)
{
    ddo__session_codec *c = s->codec;
    if (c == NULL || c->pending_cap == 0 || c->area != 0 || c->area_unsafe)
        return 0;
    int rc = ddo__account_take(&s->acc_device, area_bytes(c), &s->err);
    if (rc != 0)
        return rc;
    rc = ddo__dev_mem_alloc(s->dev, area_bytes(c), &c->area);
    if (rc != 0) {
        ddo__account_give(&s->acc_device, area_bytes(c));
        c->area = 0;
        return ddo__session_fail_ctx(&s->err, rc, "session: allocating the decode area");
    }
    return 0;
}

int ddo__session_codec_unback(ddo_session *s)
{
    ddo__session_codec *c = s->codec;
    if (c == NULL || c->area == 0 || c->area_unsafe)
        return 0;
    int rc = ddo__dev_mem_free(s->dev, c->area);
    if (rc != 0) {
        c->area_unsafe = true; /* its bytes stay accounted */
        return ddo__session_fail_ctx(&s->err, rc, "session: releasing the decode area");
    }
    ddo__account_give(&s->acc_device, area_bytes(c));
    c->area = 0;
    return 0;
}

/* Coded bytes in pageable retained memory: memcpy into a window. */
static int fill_coded(ddo_session *s, const ddo__upload *up, uint64_t pos, size_t len,
                      const ddo__window *w, const void **data, ddo__errbuf *eb)
{
    (void)s, (void)data, (void)eb;
    memcpy(w->p, up->host + pos, len);
    return 0;
}

static const ddo__transport coded_staged = { "coded_staged", DDO_M_bytes_coded_uploaded,
                                             ddo__transport_staged, NULL, fill_coded };

int ddo__transport_coded(ddo_session *s, const ddo__transport *t, const ddo__upload *up,
                         ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    const ddo__codec_plan *cp = ddo__source_coded(s->source, up->tensor);
    const char *name = ddo__session_tensor_name(s, up->tensor);
    if (c == NULL || cp == NULL || c->area == 0 || cp->coded_bytes > c->scratch_bytes ||
        c->pending_count >= c->pending_cap ||
        c->status_used + cp->launch.status_bytes > c->status_bytes)
        return ddo__fail(eb, DDO_E_INTERNAL, "session: tensor \"%s\": no room in the decode area",
                         name);
    bool registered = false;
    (void)ddo__source_host_ptr(s->source, up->tensor, &registered);
    ddo__upload in = { up->tensor, c->area, cp->coded_bytes, up->host };
    int rc = registered ? ddo__transport_direct(s, t, &in, eb)
                        : ddo__transport_staged(s, &coded_staged, &in, eb);
    if (rc != 0)
        return rc;
    ddo__codec_launch l = cp->launch;
    l.status_dev = c->area + c->scratch_bytes + c->status_used;
    rc = ddo__dev_codec_decode(s->dev, s->copy_stream, c->area, cp->coded_bytes, up->dst,
                               up->nbytes, &l);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": decode", name);
    c->pending[c->pending_count++] = (pending){ up->tensor, c->status_used };
    c->status_used += l.status_bytes;
    return 0;
}

int ddo__session_codec_finish(ddo_session *s, bool check, ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    if (c == NULL || c->pending_count == 0)
        return 0;
    size_t n = c->pending_count;
    uint64_t used = c->status_used;
    c->pending_count = 0;
    c->status_used = 0;
    if (!check)
        return 0; /* a failed upload: the loader waits for the stream itself */
    uint64_t t0 = ddo__now_ns();
    int rc = ddo__dev_stream_synchronize(s->dev, s->copy_stream);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "copy stream (decoding)");
    rc = ddo__dev_copy_d2h(s->dev, c->status_host, c->area + c->scratch_bytes, (size_t)used);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "reading the decoder's status");
    ddo__metrics_add(&s->metrics, DDO_M_codec_wait_ns, (double)(ddo__now_ns() - t0));
    for (size_t i = 0; i < n; i++) {
        const ddo__codec_plan *cp = ddo__source_coded(s->source, c->pending[i].tensor);
        rc = ddo__codec_status_check(cp, c->status_host + c->pending[i].status_off / 8, eb);
        if (rc != 0)
            return rc;
        ddo__metrics_add(&s->metrics, DDO_M_bytes_decoded, (double)cp->decoded_bytes);
        ddo__metrics_add(&s->metrics, DDO_M_codec_decodes, 1);
    }
    return 0;
}
