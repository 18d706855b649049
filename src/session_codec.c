/*
 * session_codec.c - the coded transport (weight_codec, docs/codec.md): a tensor whose retained
 * bytes are coded (source_codec.c) reaches its place in the slot in two steps on two streams:
 * the copy stream uploads its coded bytes into one of the session's decode areas (directly
 * from registered memory, or through a staging window), then the decode stream expands them
 * into the tensor's place, writing only there. The areas are used in turn
 * (DDO_CODEC_DECODE_AREAS), so the copy engine uploads the next tensor while the decoder
 * decodes this one; events order them:
 *
 *   filled[a]  recorded on the copy stream after an upload into area a; the decode of that
 *              tensor waits for it (and so, transitively, for the slot's previous consumer,
 *              which the copy stream waited for first)
 *   read[a]    recorded on the decode stream after the decode that read area a; the next
 *              upload into a waits for it
 *   join       recorded on the copy stream after a unit's last copy; the decode stream waits
 *              for it, and the unit's upload event is recorded on the decode stream after it
 *              (session_loader.c): the event acquire waits on covers copies and decodes
 *
 * Integrity without a host wait per unit: each decode writes its status words into its
 * slot's status part; the loader only notes which tensors a slot's load decoded. The first
 * acquire of that load (session_lease.c, mu released) waits for the slot's upload event,
 * reads the status part back and checks every decode against its plan
 * (ddo__codec_status_check): a corrupted stream, a decode that did not run and a decoding
 * error fail the acquire naming the tensor and block, and the slot is freed; weights whose
 * decodes were not verified are never leased.
 *
 * The memory: DDO_CODEC_DECODE_AREAS areas of the largest coded stream of any streamed unit,
 * then one status part per slot (the status words of the unit with the most coded blocks),
 * one allocation through the device weights account (the plan's decode area, plan_codec.c,
 * bounds it).
 */
#include "session_codec.h"

#include "codec.h"
#include "device/device.h"
#include "session_transport.h"

#include <stdlib.h>
#include <string.h>

#define AREA_ALIGN 256u
#define AREAS      DDO_CODEC_DECODE_AREAS

typedef struct pending {
    size_t tensor;
    uint64_t status_off; /* bytes into the slot's status part */
} pending;

/* One slot's decodes of its last load (written by the loader while it runs the slot's job,
 * read and cleared by the host once the job is issued). */
typedef struct codec_slot {
    pending *pending;
    size_t count;
    uint64_t status_used;
    bool due; /* decoded, not verified yet */
} codec_slot;

typedef struct ddo__session_codec {
    uint64_t area_bytes;   /* one coded-bytes area */
    uint64_t status_bytes; /* one slot's status part */
    uint64_t mem;          /* device: the areas, then the status parts (0: not backed) */
    bool mem_unsafe;       /* a free failed: never freed again */
    void *decode_stream;
    void *join;
    void *filled[AREAS], *read[AREAS];
    bool read_recorded[AREAS];
    size_t next_area; /* the loader's */
    size_t cur_slot;  /* the slot of the job the loader runs */
    codec_slot *slots;
    size_t slot_count, pending_cap;
    uint64_t *status_host; /* status_bytes, read back by verify */
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

/* The sizes from the coded store: per unit, its coded tensors and their status. */
static void size_memory(ddo_session *s, ddo__session_codec *c)
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
            c->area_bytes = cp->coded_bytes > c->area_bytes ? cp->coded_bytes : c->area_bytes;
        }
        c->status_bytes = status > c->status_bytes ? status : c->status_bytes;
        c->pending_cap = coded > c->pending_cap ? coded : c->pending_cap;
    }
    c->area_bytes = ddo__round_up(c->area_bytes, AREA_ALIGN);
    c->status_bytes = ddo__round_up(c->status_bytes, AREA_ALIGN);
}

/* The decode stream and its events; the slots' tables. */
static int create_streams(ddo_session *s, ddo__session_codec *c)
{
    int rc = ddo__dev_stream_create(s->dev, 1, &c->decode_stream);
    if (rc != 0) {
        c->decode_stream = NULL;
        return ddo__session_fail_ctx(&s->err, rc, "session: creating the decode stream");
    }
    void **ev[1 + 2 * AREAS] = { &c->join };
    for (size_t a = 0; a < AREAS; a++) {
        ev[1 + 2 * a] = &c->filled[a];
        ev[2 + 2 * a] = &c->read[a];
    }
    for (size_t k = 0; k < DDO_ARRAY_LEN(ev); k++) {
        rc = ddo__dev_event_create(s->dev, ev[k]);
        if (rc != 0) {
            *ev[k] = NULL;
            return ddo__session_fail_ctx(&s->err, rc, "session: creating a decode event");
        }
    }
    c->slot_count = s->slot_count;
    c->slots = ddo__calloc(c->slot_count, sizeof(*c->slots));
    c->status_host = malloc((size_t)c->status_bytes);
    if (c->slots == NULL || c->status_host == NULL)
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: codec: out of memory");
    for (size_t i = 0; i < c->slot_count; i++) {
        c->slots[i].pending = ddo__calloc(c->pending_cap, sizeof(pending));
        if (c->slots[i].pending == NULL)
            return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: codec: out of memory");
    }
    return 0;
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
    size_memory(s, c);
    if (c->pending_cap == 0 || s->slot_count == 0)
        return 0; /* nothing was coded: every tensor moves raw */
    return create_streams(s, c);
}

void ddo__session_codec_destroy(ddo_session *s)
{
    ddo__session_codec *c = s->codec;
    if (c == NULL)
        return;
    void *ev[1 + 2 * AREAS] = { c->join };
    for (size_t a = 0; a < AREAS; a++) {
        ev[1 + 2 * a] = c->filled[a];
        ev[2 + 2 * a] = c->read[a];
    }
    for (size_t k = 0; k < DDO_ARRAY_LEN(ev); k++)
        if (ev[k] != NULL)
            (void)ddo__dev_event_destroy(s->dev, ev[k]);
    if (c->decode_stream != NULL)
        (void)ddo__dev_stream_destroy(s->dev, c->decode_stream);
    for (size_t i = 0; c->slots != NULL && i < c->slot_count; i++)
        free(c->slots[i].pending);
    free(c->slots);
    free(c->status_host);
    free(c);
    s->codec = NULL;
}

static uint64_t mem_bytes(const ddo__session_codec *c)
{
    return AREAS * c->area_bytes + (uint64_t)c->slot_count * c->status_bytes;
}

int ddo__session_codec_back(ddo_session *s)
{
    ddo__session_codec *c = s->codec;
    if (c == NULL || c->slots == NULL || c->mem != 0 || c->mem_unsafe)
        return 0;
    int rc = ddo__account_take(&s->acc_device, mem_bytes(c), &s->err);
    if (rc != 0)
        return rc;
    rc = ddo__dev_mem_alloc(s->dev, mem_bytes(c), &c->mem);
    if (rc != 0) {
        ddo__account_give(&s->acc_device, mem_bytes(c));
        c->mem = 0;
        return ddo__session_fail_ctx(&s->err, rc, "session: allocating the decode areas");
    }
    return 0;
}

int ddo__session_codec_unback(ddo_session *s)
{
    ddo__session_codec *c = s->codec;
    if (c == NULL || c->mem == 0 || c->mem_unsafe)
        return 0;
    int rc = ddo__session_codec_sync(s);
    if (rc == 0)
        rc = ddo__dev_mem_free(s->dev, c->mem);
    if (rc != 0) {
        c->mem_unsafe = true; /* its bytes stay accounted */
        return ddo__session_fail_ctx(&s->err, rc, "session: releasing the decode areas");
    }
    ddo__account_give(&s->acc_device, mem_bytes(c));
    c->mem = 0;
    for (size_t i = 0; i < c->slot_count; i++)
        c->slots[i].due = false;
    return 0;
}

void *ddo__session_codec_stream(const ddo_session *s)
{
    return s->codec != NULL ? s->codec->decode_stream : NULL;
}

int ddo__session_codec_sync(ddo_session *s)
{
    void *st = ddo__session_codec_stream(s);
    return st != NULL ? ddo__dev_stream_synchronize(s->dev, st) : 0;
}

void ddo__session_codec_begin(ddo_session *s, size_t slot)
{
    ddo__session_codec *c = s->codec;
    if (c == NULL || c->slots == NULL)
        return;
    DDO_ASSERT(slot < c->slot_count);
    c->cur_slot = slot;
    c->slots[slot].count = 0;
    c->slots[slot].status_used = 0;
    c->slots[slot].due = false;
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

/* Copy stream: the coded bytes of up into area a, after the decode that last read it. */
static int upload_into(ddo_session *s, const ddo__transport *t, const ddo__upload *up,
                       const ddo__codec_plan *cp, size_t a, ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    const char *name = ddo__session_tensor_name(s, up->tensor);
    int rc = 0;
    if (c->read_recorded[a])
        rc = ddo__dev_stream_wait_event(s->dev, s->copy_stream, c->read[a]);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": waiting for decode area %zu", name, a);
    bool registered = false;
    (void)ddo__source_host_ptr(s->source, up->tensor, &registered);
    ddo__upload in = { up->tensor, c->mem + a * c->area_bytes, cp->coded_bytes, up->host };
    rc = registered ? ddo__transport_direct(s, t, &in, eb)
                    : ddo__transport_staged(s, &coded_staged, &in, eb);
    if (rc != 0)
        return rc;
    rc = ddo__dev_event_record(s->dev, c->filled[a], s->copy_stream);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": recording its upload", name);
    return 0;
}

int ddo__transport_coded(ddo_session *s, const ddo__transport *t, const ddo__upload *up,
                         ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    const ddo__codec_plan *cp = ddo__source_coded(s->source, up->tensor);
    const char *name = ddo__session_tensor_name(s, up->tensor);
    codec_slot *cs = c != NULL && c->slots != NULL ? &c->slots[c->cur_slot] : NULL;
    if (cs == NULL || cp == NULL || c->mem == 0 || cp->coded_bytes > c->area_bytes ||
        cs->count >= c->pending_cap || cs->status_used + cp->launch.status_bytes > c->status_bytes)
        return ddo__fail(eb, DDO_E_INTERNAL, "session: tensor \"%s\": no room in the decode area",
                         name);
    size_t a = c->next_area;
    c->next_area = (a + 1) % AREAS;
    int rc = upload_into(s, t, up, cp, a, eb);
    if (rc != 0)
        return rc;
    rc = ddo__dev_stream_wait_event(s->dev, c->decode_stream, c->filled[a]);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": ordering its decode", name);
    ddo__codec_launch l = cp->launch;
    l.status_dev = c->mem + AREAS * c->area_bytes + c->cur_slot * c->status_bytes + cs->status_used;
    uint64_t src = c->mem + a * c->area_bytes;
    rc = ddo__dev_codec_decode(s->dev, c->decode_stream, src, cp->coded_bytes, up->dst, up->nbytes,
                               &l);
    if (rc == 0) {
        c->read_recorded[a] = false;
        rc = ddo__dev_event_record(s->dev, c->read[a], c->decode_stream);
        c->read_recorded[a] = rc == 0;
    }
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": decode", name);
    cs->pending[cs->count++] = (pending){ up->tensor, cs->status_used };
    cs->status_used += l.status_bytes;
    ddo__metrics_add(&s->metrics, DDO_M_bytes_decoded, (double)cp->decoded_bytes);
    ddo__metrics_add(&s->metrics, DDO_M_codec_decodes, 1);
    return 0;
}

int ddo__session_codec_finish(ddo_session *s, bool ok, ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    if (c == NULL || c->slots == NULL)
        return 0;
    codec_slot *cs = &c->slots[c->cur_slot];
    if (!ok) {
        cs->count = 0; /* a failed upload: the loader waits for both streams itself */
        return 0;
    }
    int rc = ddo__dev_event_record(s->dev, c->join, s->copy_stream);
    if (rc == 0)
        rc = ddo__dev_stream_wait_event(s->dev, c->decode_stream, c->join);
    if (rc != 0) {
        cs->count = 0;
        return ddo__session_fail_ctx(eb, rc, "decode stream (joining the copy stream)");
    }
    cs->due = cs->count > 0;
    return 0;
}

bool ddo__session_codec_due(const ddo_session *s, size_t slot)
{
    const ddo__session_codec *c = s->codec;
    return c != NULL && c->slots != NULL && slot < c->slot_count && c->slots[slot].due;
}

/* The slot's load has finished: its upload event, or else the whole decode stream. */
static int wait_load(ddo_session *s, size_t slot, bool *unsafe, ddo__errbuf *eb)
{
    int rc = ddo__dev_event_synchronize(s->dev, s->slots[slot].upload_event);
    if (rc == 0)
        return 0;
    /* The upload event is recorded on the decode stream: once it is idle, so is the slot. */
    int src = ddo__dev_stream_synchronize(s->dev, s->codec->decode_stream);
    *unsafe = src != 0;
    return ddo__session_fail_ctx(eb, rc, "waiting for the slot's decodes");
}

int ddo__session_codec_verify(ddo_session *s, size_t slot, bool *unsafe, ddo__errbuf *eb)
{
    *unsafe = false;
    if (!ddo__session_codec_due(s, slot))
        return 0;
    ddo__session_codec *c = s->codec;
    codec_slot *cs = &c->slots[slot];
    cs->due = false;
    uint64_t t0 = ddo__now_ns();
    int rc = wait_load(s, slot, unsafe, eb);
    if (rc != 0)
        return rc;
    uint64_t part = c->mem + AREAS * c->area_bytes + slot * c->status_bytes;
    rc = ddo__dev_copy_d2h(s->dev, c->status_host, part, (size_t)cs->status_used);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "reading the decoder's status");
    ddo__metrics_add(&s->metrics, DDO_M_codec_wait_ns, (double)(ddo__now_ns() - t0));
    for (size_t i = 0; i < cs->count; i++) {
        const ddo__codec_plan *cp = ddo__source_coded(s->source, cs->pending[i].tensor);
        rc = ddo__codec_status_check(cp, c->status_host + cs->pending[i].status_off / 8, eb);
        if (rc != 0)
            return rc;
    }
    return 0;
}
