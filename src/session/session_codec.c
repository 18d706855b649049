/*
 * session_codec.c - the coded transport (weight_codec, docs/codec.md): a tensor whose retained
 * bytes are coded (source_codec.c) reaches its place in the slot in two steps on two streams:
 * the copy stream uploads its coded bytes into one of the session's decode areas (directly
 * from registered memory, or through a staging window), then the decode stream expands them
 * into the tensor's place, writing only there.
 *
 * Batches: the decoder is latency-bound on small launches (docs/codec.md, "Throughput"), so
 * the coded tensors of a unit are uploaded one after another into the same area, packed at
 * DDO_CODEC_AREA_ALIGN offsets, until the next would not fit it (or the batch holds
 * DDO_CODEC_BATCH_MAX tensors); then ONE codec_decode op decodes the whole batch (every
 * thread block of every tensor in one grid, each tensor written only into its own place) and
 * the next batch goes to the other area. A unit's last batch is launched when the unit's
 * last tensor was queued (ddo__session_codec_finish); batches never span units. Raw tensors
 * of the unit (kept raw by the store) go by their own transport on the copy stream between
 * them. The areas are used in turn (DDO_CODEC_DECODE_AREAS), so the copy engine fills one
 * while the decoder reads the other; events order them:
 *
 *   filled[a]  recorded on the copy stream after each upload into area a; the batch's decode
 *              waits for the latest (and so, transitively, for the slot's previous consumer,
 *              which the copy stream waited for first)
 *   read[a]    recorded on the decode stream after the batch decode that read area a; the
 *              copy stream waits for it before the first upload of the next batch in a
 *   join       recorded on the copy stream after a unit's last copy; the decode stream waits
 *              for it, and the unit's upload event is recorded on the decode stream after it
 *              (session_loader.c): the event acquire waits on covers copies and decodes
 *
 * Integrity without a host wait per unit: each decode writes its status words into its
 * slot's status part (device memory). After the unit's last batch and the join, the decode
 * stream copies the slot's status part into the slot's pinned host copy (copy_d2h_async),
 * still before the unit's upload event is recorded. The loader only notes which tensors a
 * slot's load decoded. The first acquire of that load (session_lease.c, mu released) waits
 * for the slot's upload event alone and checks every decode in the pinned copy against its
 * plan (ddo__codec_status_check): a corrupted stream, a decode that did not run and a
 * decoding error fail the acquire naming the tensor and block, and the slot is freed; weights
 * whose decodes were not verified are never leased.
 *
 * The memory: DDO_CODEC_DECODE_AREAS areas of ddo__codec_area_bytes (the largest coded
 * stream bound, or the most stream bounds one streamed unit adds up to, capped at
 * DDO_CODEC_AREA_CAP: whichever is larger), then one status part per slot (the status words of
 * the unit with the most coded blocks), one allocation through the device weights account;
 * plan_codec.c computes the same figures from the plan's candidates (the session's, from the
 * tensors the store did code, are at most those). The pinned host copies of the status parts
 * (slot_count x status part, host_alloc) live as long as the session.
 */
#include "session/session_codec.h"

#include "codec/codec.h"
#include "device/device.h"
#include "session/session_transport.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AREA_ALIGN DDO_CODEC_AREA_ALIGN
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
    /* The load's launches, each between two timed events (timed[2k], timed[2k + 1]; NULL
     * when they could not be created: the decodes go untimed), and the bytes each wrote: the
     * acquire that checks the load adds their device time to codec_decode_ns. A load launches
     * at most once per coded tensor (pending_cap). */
    void **timed;
    uint64_t *timed_bytes;
    size_t launches;
} codec_slot;

/* The batch being filled (the loader's): tensors uploaded into one area, not decoded yet. */
typedef struct codec_batch {
    bool open;
    size_t area;
    uint64_t used; /* bytes of the area taken */
    size_t count;
    size_t first_tensor; /* for messages */
    ddo__codec_desc d[DDO_CODEC_BATCH_MAX];
} codec_batch;

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
    codec_batch batch;
    codec_slot *slots;
    size_t slot_count, pending_cap;
    uint64_t *status_pinned; /* slot_count x status_bytes of pinned host memory (host_alloc) */
    /* coded_file: per checkpoint tensor, the plan of its sidecar stream (built by the loader at
     * its first load, kept for the status checks) and whether its stream failed (read raw) */
    ddo__codec_plan **file_plans;
    bool *file_bad;
    size_t tensor_count;
    atomic_bool noted; /* stream_note is written (once, by the loader) */
    char stream_note[DDO_ERRBUF_BYTES + 32];
} ddo__session_codec;

static _Atomic uint64_t area_cap_test; /* 0: DDO_CODEC_AREA_CAP */

void ddo__session_codec_test_area_cap(uint64_t bytes)
{
    atomic_store(&area_cap_test, bytes);
}

static _Atomic uint64_t piece_cap_test; /* 0: the staging window */

void ddo__session_codec_test_piece_cap(uint64_t bytes)
{
    atomic_store(&piece_cap_test, bytes);
}

/* The most bytes of a sidecar stream one window takes (coded_file). */
static size_t piece_cap(size_t window)
{
    uint64_t test = atomic_load(&piece_cap_test);
    return test > 0 && test < window ? (size_t)test : window;
}

bool ddo__session_codec_wanted(const ddo_session *s)
{
    return s->plan->weight_codec == DDO_WEIGHT_CODEC_DDOC1;
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

/* The status bytes of a stream of the default block size decoding to nbytes of dtype. */
static uint64_t default_status_bytes(ddo_dtype dtype, uint64_t nbytes)
{
    uint64_t esize = ddo_dtype_size(dtype) ? ddo_dtype_size(dtype) : 1; /* FP8: 1 */
    uint64_t blocks = (nbytes / esize + DDO_CODEC_DEFAULT_BLOCK - 1) / DDO_CODEC_DEFAULT_BLOCK;
    return 16 * blocks;
}

/* Whether tensor t moves coded (a coded retained tensor, or a file tensor with a sidecar
 * stream, coded_file): its area bound (rounded) and its status bytes. */
static bool coded_size(const ddo_session *s, size_t t, uint64_t *bound, uint64_t *status)
{
    const ddo__codec_plan *cp = ddo__source_coded(s->source, t);
    uint64_t cb = 0;
    if (cp != NULL) {
        *status = cp->launch.status_bytes;
        *bound = ddo__round_up(
            ddo__codec_bound(cp->dtype, cp->decoded_bytes, cp->launch.block_elems), AREA_ALIGN);
        cb = cp->coded_bytes;
    } else if (!ddo__route_per_weight(s->route) && ddo__source_has_stream(s->source, t, &cb)) {
        /* coded_file (vmm_runtime streams raw: its plan has no decode memory for it) */
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(s->ck, t);
        *status = default_status_bytes(ti->dtype, ti->nbytes);
        *bound = ddo__round_up(ddo__codec_bound(ti->dtype, ti->nbytes, 0), AREA_ALIGN);
    } else {
        return false;
    }
    uint64_t own = ddo__round_up(cb, AREA_ALIGN);
    *bound = *bound > own ? *bound : own;
    return true;
}

/* The sizes from the coded store (the rule of plan_codec.c): per unit, its coded tensors'
 * stream bounds and status. */
static void size_memory(ddo_session *s, ddo__session_codec *c)
{
    uint64_t largest = 0, largest_unit = 0;
    for (size_t u = 0; u < s->unit_count; u++) {
        if (s->units[u].resident)
            continue;
        size_t n = 0, coded = 0;
        const size_t *t = ddo_plan_unit_tensors(s->plan, u, &n);
        uint64_t status = 0, unit = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t bound = 0, st = 0;
            if (!coded_size(s, t[i], &bound, &st))
                continue;
            coded++;
            status += st;
            largest = bound > largest ? bound : largest;
            unit += bound;
        }
        largest_unit = unit > largest_unit ? unit : largest_unit;
        c->status_bytes = status > c->status_bytes ? status : c->status_bytes;
        c->pending_cap = coded > c->pending_cap ? coded : c->pending_cap;
    }
    uint64_t cap = atomic_load(&area_cap_test);
    c->area_bytes =
        ddo__codec_area_bytes(largest, largest_unit, cap > 0 ? cap : DDO_CODEC_AREA_CAP);
    c->status_bytes = ddo__round_up(c->status_bytes, AREA_ALIGN);
}

/* The decode stream and its events; the slots' tables. */
static void destroy_timing(ddo_session *s, codec_slot *cs, size_t cap)
{
    for (size_t k = 0; cs->timed != NULL && k < 2 * cap; k++)
        if (cs->timed[k] != NULL)
            (void)ddo__dev_event_destroy(s->dev, cs->timed[k]);
    free(cs->timed);
    free(cs->timed_bytes);
    cs->timed = NULL;
    cs->timed_bytes = NULL;
}

/* A slot's timed events (cap launches); without them its decodes go untimed, not wrong. */
static void create_timing(ddo_session *s, codec_slot *cs, size_t cap)
{
    cs->timed = ddo__calloc(2 * cap, sizeof(void *));
    cs->timed_bytes = ddo__calloc(cap, sizeof(uint64_t));
    bool ok = cs->timed != NULL && cs->timed_bytes != NULL;
    for (size_t k = 0; ok && k < 2 * cap; k++)
        ok = ddo__dev_event_create_timed(s->dev, &cs->timed[k]) == 0;
    if (!ok)
        destroy_timing(s, cs, cap);
}

/* The decode stream gets the high priority (0): a batch's decode stands between the copy
 * engine and the next upload into its area (event read), and at the low priority its thread
 * blocks wait until the host's compute kernels have drained the SMs, stalling the copies
 * behind them. At the high priority they are dispatched first as SMs free up; running blocks
 * are not preempted, so the host's compute loses only the decode's own device time. */
static int create_streams(ddo_session *s, ddo__session_codec *c)
{
    int rc = ddo__dev_stream_create(s->dev, 0, &c->decode_stream);
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
    if (c->slots == NULL)
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: codec: out of memory");
    void *pinned = NULL;
    rc = ddo__dev_host_alloc(s->dev, (size_t)(c->slot_count * c->status_bytes), &pinned);
    if (rc != 0)
        return ddo__session_fail_ctx(&s->err, rc, "session: pinning the decoder's status copies");
    c->status_pinned = pinned;
    for (size_t i = 0; i < c->slot_count; i++) {
        c->slots[i].pending = ddo__calloc(c->pending_cap, sizeof(pending));
        if (c->slots[i].pending == NULL)
            return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: codec: out of memory");
        create_timing(s, &c->slots[i], c->pending_cap);
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
    c->tensor_count = ddo_checkpoint_tensor_count(s->ck);
    c->file_plans = ddo__calloc(c->tensor_count + 1, sizeof(*c->file_plans));
    c->file_bad = ddo__calloc(c->tensor_count + 1, sizeof(*c->file_bad));
    atomic_init(&c->noted, false);
    if (c->file_plans == NULL || c->file_bad == NULL)
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: codec: out of memory");
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
    for (size_t i = 0; c->slots != NULL && i < c->slot_count; i++) {
        free(c->slots[i].pending);
        destroy_timing(s, &c->slots[i], c->pending_cap);
    }
    free(c->slots);
    for (size_t t = 0; c->file_plans != NULL && t < c->tensor_count; t++)
        ddo__codec_plan_destroy(c->file_plans[t]);
    free(c->file_plans);
    free(c->file_bad);
    if (c->status_pinned != NULL)
        (void)ddo__dev_host_free(s->dev, c->status_pinned);
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
    c->slots[slot].launches = 0;
    c->batch.open = false;
    c->batch.count = 0;
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

/* The loader, before a batch's first upload: the next area, once the decode that last read
 * it is done (the copy stream waits). */
static int open_batch(ddo_session *s, size_t tensor, ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    size_t a = c->next_area;
    c->next_area = (a + 1) % AREAS;
    if (c->read_recorded[a]) {
        int rc = ddo__dev_stream_wait_event(s->dev, s->copy_stream, c->read[a]);
        if (rc != 0)
            return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": waiting for decode area %zu",
                                         ddo__session_tensor_name(s, tensor), a);
    }
    c->batch.open = true;
    c->batch.area = a;
    c->batch.used = 0;
    c->batch.count = 0;
    c->batch.first_tensor = tensor;
    return 0;
}

/* The decode stream: the open batch's one decode, after its uploads; the batch is closed
 * whatever happens. */
static int launch_batch(ddo_session *s, ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    codec_batch *b = &c->batch;
    size_t a = b->area, n = b->count;
    b->open = false;
    b->count = 0;
    if (n == 0)
        return 0;
    codec_slot *cs = &c->slots[c->cur_slot];
    void **t =
        cs->timed != NULL && cs->launches < c->pending_cap ? &cs->timed[2 * cs->launches] : NULL;
    int rc = ddo__dev_stream_wait_event(s->dev, c->decode_stream, c->filled[a]);
    if (rc == 0 && t != NULL) /* completes when the uploads have: the decode alone is timed */
        rc = ddo__dev_event_record(s->dev, t[0], c->decode_stream);
    if (rc == 0)
        rc = ddo__dev_codec_decode(s->dev, c->decode_stream, b->d, n);
    if (rc == 0 && t != NULL)
        rc = ddo__dev_event_record(s->dev, t[1], c->decode_stream);
    if (rc == 0) {
        c->read_recorded[a] = false;
        rc = ddo__dev_event_record(s->dev, c->read[a], c->decode_stream);
        c->read_recorded[a] = rc == 0;
    }
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "decode of %zu tensors (the first \"%s\")", n,
                                     ddo__session_tensor_name(s, b->first_tensor));
    double decoded = 0;
    for (size_t i = 0; i < n; i++)
        decoded += (double)b->d[i].l.decoded_bytes;
    if (t != NULL)
        cs->timed_bytes[cs->launches++] = (uint64_t)decoded;
    ddo__metrics_add(&s->metrics, DDO_M_bytes_decoded, decoded);
    ddo__metrics_add(&s->metrics, DDO_M_codec_decodes, (double)n);
    ddo__metrics_add(&s->metrics, DDO_M_codec_launches, 1);
    return 0;
}

/* Copy stream: the coded bytes of up into the open batch's area at offset at. */
static int upload_into(ddo_session *s, const ddo__transport *t, const ddo__upload *up,
                       const ddo__codec_plan *cp, uint64_t at, ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    bool registered = false;
    (void)ddo__source_host_ptr(s->source, up->tensor, &registered);
    ddo__upload in = { up->tensor, at, cp->coded_bytes, up->host };
    int rc = registered ? ddo__transport_direct(s, t, &in, eb)
                        : ddo__transport_staged(s, &coded_staged, &in, eb);
    if (rc != 0)
        return rc;
    rc = ddo__dev_event_record(s->dev, c->filled[c->batch.area], s->copy_stream);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": recording its upload",
                                     ddo__session_tensor_name(s, up->tensor));
    return 0;
}

/* Whether the open batch (or a new one) and the slot's tables have room for a tensor of
 * coded_bytes and status_bytes. */
static bool has_room(const ddo__session_codec *c, uint64_t coded_bytes, uint64_t status_bytes)
{
    const codec_slot *cs = c != NULL && c->slots != NULL ? &c->slots[c->cur_slot] : NULL;
    return cs != NULL && c->mem != 0 && coded_bytes <= c->area_bytes &&
           cs->count < c->pending_cap && cs->status_used + status_bytes <= c->status_bytes;
}

/* The place of the next tensor's need bytes in the open batch's area (the batch decoded
 * first when full, the next one opened). */
static int batch_place(ddo_session *s, size_t tensor, uint64_t need, uint64_t *at, ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    codec_batch *b = &c->batch;
    int rc = 0;
    if (b->open && (b->used + need > c->area_bytes || b->count == DDO_CODEC_BATCH_MAX))
        rc = launch_batch(s, eb); /* full: decode it, the next batch takes the other area */
    if (rc == 0 && !b->open)
        rc = open_batch(s, tensor, eb);
    *at = c->mem + b->area * c->area_bytes + b->used;
    return rc;
}

/* The uploaded tensor joins the batch: its decode of cp from at into up->dst. */
static void batch_add(ddo_session *s, const ddo__upload *up, const ddo__codec_plan *cp, uint64_t at)
{
    ddo__session_codec *c = s->codec;
    codec_batch *b = &c->batch;
    codec_slot *cs = &c->slots[c->cur_slot];
    ddo__codec_desc *d = &b->d[b->count++];
    *d = (ddo__codec_desc){ at, cp->coded_bytes, up->dst, up->nbytes, cp->launch };
    d->l.status_dev =
        c->mem + AREAS * c->area_bytes + c->cur_slot * c->status_bytes + cs->status_used;
    b->used += ddo__round_up(cp->coded_bytes, AREA_ALIGN);
    cs->pending[cs->count++] = (pending){ up->tensor, cs->status_used };
    cs->status_used += cp->launch.status_bytes;
}

int ddo__transport_coded(ddo_session *s, const ddo__transport *t, const ddo__upload *up,
                         ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    const ddo__codec_plan *cp = ddo__source_coded(s->source, up->tensor);
    if (cp == NULL || !has_room(c, cp->coded_bytes, cp->launch.status_bytes))
        return ddo__fail(eb, DDO_E_INTERNAL, "session: tensor \"%s\": no room in the decode area",
                         ddo__session_tensor_name(s, up->tensor));
    uint64_t at = 0;
    int rc = batch_place(s, up->tensor, ddo__round_up(cp->coded_bytes, AREA_ALIGN), &at, eb);
    if (rc == 0)
        rc = upload_into(s, t, up, cp, at, eb);
    if (rc != 0)
        return rc;
    batch_add(s, up, cp, at);
    return 0;
}

/* ---- coded_file: a file tensor's coded stream from its sidecar ---- */

bool ddo__session_codec_streams(const ddo_session *s, size_t tensor)
{
    const ddo__session_codec *c = s->codec;
    return c != NULL && c->slots != NULL && tensor < c->tensor_count && !c->file_bad[tensor] &&
           !ddo__route_per_weight(s->route) && ddo__source_has_stream(s->source, tensor, NULL);
}

const char *ddo__session_codec_stream_note(const ddo_session *s)
{
    const ddo__session_codec *c = s->codec;
    return c != NULL && atomic_load(&c->noted) ? c->stream_note : "";
}

/* The stream of tensor is unusable (why): it is read raw from now on, with a note (the
 * first) and a count. */
static void stream_failed(ddo_session *s, size_t tensor, const char *why)
{
    ddo__session_codec *c = s->codec;
    c->file_bad[tensor] = true;
    ddo__metrics_add(&s->metrics, DDO_M_codec_stream_fallbacks, 1);
    if (!atomic_load(&c->noted)) {
        snprintf(c->stream_note, sizeof(c->stream_note), "read raw instead: %s", why);
        atomic_store(&c->noted, true);
    }
}

/* The tensor's plan for this load's stream: the first load's is kept (the stream never
 * changes: its hash is checked at every load) for the status checks. */
static const ddo__codec_plan *keep_plan(ddo__session_codec *c, size_t tensor, ddo__codec_plan *plan)
{
    if (c->file_plans[tensor] == NULL)
        c->file_plans[tensor] = plan;
    else
        ddo__codec_plan_destroy(plan);
    return c->file_plans[tensor];
}

/* Reads the stream into window w (*cp its plan; *raw when it must be read raw instead). */
static int read_stream(ddo_session *s, const ddo__upload *up, ddo__window *w, const void **data,
                       const ddo__codec_plan **cp, bool *raw, ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    ddo__codec_plan *plan = NULL;
    ddo__errbuf why = { 0 };
    uint64_t cb = 0;
    (void)ddo__source_has_stream(s->source, up->tensor, &cb);
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(s->ck, up->tensor);
    *raw = true;
    if (cb > w->cap || !has_room(c, cb, default_status_bytes(ti->dtype, ti->nbytes)))
        return 0; /* does not fit one window or the decode area: raw, no note */
    int rc = ddo__source_read_coded(s->source, up->tensor, w->p, w->cap, data, &plan, &why);
    if (rc == DDO_E_FILE_CHANGED)
        return ddo__fail(eb, rc, "%s", why.msg);
    if (rc == 0 && has_room(c, plan->coded_bytes, plan->launch.status_bytes) &&
        plan->decoded_bytes == up->nbytes) {
        *cp = keep_plan(c, up->tensor, plan);
        *raw = false;
        return 0;
    }
    ddo__codec_plan_destroy(plan);
    stream_failed(s, up->tensor, rc != 0 ? why.msg : "its stream does not fit the decode area");
    return 0;
}

/* The batch's area is filled up to here: its event, recorded on the copy stream after the
 * stream's upload (the decoder waits on it). */
static int mark_filled(ddo_session *s, const ddo__upload *up, ddo__errbuf *eb)
{
    int rc = ddo__dev_event_record(s->dev, s->codec->filled[s->codec->batch.area], s->copy_stream);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": upload of its coded stream",
                                     ddo__session_tensor_name(s, up->tensor));
    return 0;
}

/* A coded stream uploaded at `at` of the decode area: counted, and one more of the batch. */
static void coded_placed(ddo_session *s, const ddo__transport *t, const ddo__upload *up,
                         const ddo__codec_plan *cp, uint64_t at)
{
    ddo__metrics_add(&s->metrics, t->metric, (double)cp->coded_bytes);
    ddo__metrics_add(&s->metrics, DDO_M_copy_bytes, (double)cp->coded_bytes);
    ddo__metrics_add(&s->metrics, DDO_M_copies, 1);
    batch_add(s, up, cp, at);
}

/* One piece of a stream longer than a window (coded_pieces): read at *pos into a window,
 * checked by r and copied to at + *pos in the decode area; *bad (why) when it must go raw. */
static int stream_piece(ddo_session *s, const ddo__upload *up, ddo__codec_reader *r, uint64_t at,
                        uint64_t *pos, uint64_t *sum, bool *bad, ddo__errbuf *why, ddo__errbuf *eb)
{
    ddo__window w;
    int rc = ddo__window_get(s, &w, eb);
    if (rc != 0)
        return rc;
    uint64_t left = ddo__codec_reader_total(r) - *pos;
    size_t cap = piece_cap(w.cap);
    size_t len = (size_t)(left < cap ? left : cap);
    len -= left > len ? len % 8 : 0; /* every piece but the last a multiple of 8 (the hash) */
    uint64_t part = 0;
    const void *piece = NULL;
    int rrc =
        ddo__source_read_stream(s->source, up->tensor, *pos, len, w.p, w.cap, &piece, &part, why);
    if (rrc == DDO_E_FILE_CHANGED)
        rc = ddo__fail(eb, rrc, "%s", why->msg);
    else if (rrc != 0 || ddo__codec_reader_feed(r, piece, len, why) != 0)
        *bad = true;
    else if ((rc = ddo__dev_copy_h2d(s->dev, at + *pos, piece, len, s->copy_stream)) != 0)
        rc = ddo__session_fail_ctx(eb, rc, "tensor \"%s\": upload of its coded stream",
                                   ddo__session_tensor_name(s, up->tensor));
    int prc = ddo__window_put(s, &w, eb); /* released after its copy (the ring's event) */
    *sum += part;
    *pos += len;
    return rc != 0 ? rc : prc;
}

/* The stream of up, read in pieces and placed at `at`: its plan (*plan), or *bad and why. */
static int stream_pieces(ddo_session *s, const ddo__upload *up, uint64_t cb, uint64_t at,
                         ddo__codec_plan **plan, bool *bad, ddo__errbuf *why, ddo__errbuf *eb)
{
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(s->ck, up->tensor);
    ddo__codec_reader *r = NULL;
    int rc = ddo__codec_reader_create(cb, ti->name, &r, eb);
    uint64_t sum = 0;
    for (uint64_t pos = 0; rc == 0 && !*bad && pos < cb;)
        rc = stream_piece(s, up, r, at, &pos, &sum, bad, why, eb);
    if (rc == 0 && !*bad && !ddo__source_stream_hash_ok(s->source, up->tensor, sum)) {
        *bad = true;
        snprintf(why->msg, sizeof(why->msg), "sidecar: tensor `%s`: stream hash differs", ti->name);
    }
    if (rc == 0 && !*bad)
        *bad = ddo__codec_reader_finish(r, plan, why) != 0;
    if (rc == 0 && !*bad &&
        (!has_room(s->codec, (*plan)->coded_bytes, (*plan)->launch.status_bytes) ||
         (*plan)->decoded_bytes != up->nbytes)) {
        *bad = true;
        snprintf(why->msg, sizeof(why->msg), "its stream does not fit the decode area");
    }
    ddo__codec_reader_destroy(r);
    return rc;
}

/* coded_file for a stream longer than one window: read, checked and uploaded in window-sized
 * pieces straight into its place in the decode area (no buffer of its size on the host); its
 * plan from the pieces (ddo__codec_reader), its hash from their shares. Raw on a bad stream. */
static int coded_pieces(ddo_session *s, const ddo__transport *t, const ddo__upload *up, uint64_t cb,
                        ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(s->ck, up->tensor);
    if (!has_room(c, cb, default_status_bytes(ti->dtype, ti->nbytes)))
        return ddo__transport_staged(s, &ddo__transport_file, up, eb); /* as read_stream */
    uint64_t at = 0;
    ddo__codec_plan *plan = NULL;
    ddo__errbuf why = { 0 };
    bool bad = false;
    int rc = batch_place(s, up->tensor, ddo__round_up(cb, AREA_ALIGN), &at, eb);
    if (rc == 0)
        rc = stream_pieces(s, up, cb, at, &plan, &bad, &why, eb);
    if (rc != 0 || bad) {
        ddo__codec_plan_destroy(plan);
        if (rc != 0)
            return rc;
        stream_failed(s, up->tensor, why.msg);
        return ddo__transport_staged(s, &ddo__transport_file, up, eb);
    }
    const ddo__codec_plan *cp = keep_plan(c, up->tensor, plan);
    rc = mark_filled(s, up, eb);
    if (rc == 0)
        coded_placed(s, t, up, cp, at);
    return rc;
}

int ddo__transport_coded_file(ddo_session *s, const ddo__transport *t, const ddo__upload *up,
                              ddo__errbuf *eb)
{
    uint64_t cb = 0;
    (void)ddo__source_has_stream(s->source, up->tensor, &cb);
    size_t cap =
        piece_cap(s->use_staging ? (size_t)s->b.staging_window_bytes : (size_t)DDO__BOUNCE_BYTES);
    if (cb > cap) /* longer than one window: in pieces */
        return coded_pieces(s, t, up, cb, eb);
    ddo__window w;
    int rc = ddo__window_get(s, &w, eb);
    if (rc != 0)
        return rc;
    const void *data = NULL;
    const ddo__codec_plan *cp = NULL;
    bool raw = true;
    uint64_t at = 0;
    rc = read_stream(s, up, &w, &data, &cp, &raw, eb);
    if (rc == 0 && !raw)
        rc = batch_place(s, up->tensor, ddo__round_up(cp->coded_bytes, AREA_ALIGN), &at, eb);
    if (rc == 0 && !raw) {
        rc = ddo__dev_copy_h2d(s->dev, at, data, (size_t)cp->coded_bytes, s->copy_stream);
        rc = rc == 0 ? mark_filled(s, up, eb)
                     : ddo__session_fail_ctx(eb, rc, "tensor \"%s\": upload of its coded stream",
                                             ddo__session_tensor_name(s, up->tensor));
    }
    int prc = ddo__window_put(s, &w, eb); /* released after its copy (the ring's event) */
    rc = rc != 0 ? rc : prc;
    if (rc != 0)
        return rc;
    if (raw) /* the checkpoint's raw bytes instead: never wrong weights */
        return ddo__transport_staged(s, &ddo__transport_file, up, eb);
    coded_placed(s, t, up, cp, at);
    return 0;
}

/* The decode stream, after the unit's last batch: it joins the copy stream, then copies the
 * slot's status part into its pinned copy (before the upload event, which the loader records
 * on this stream next). */
static int close_unit(ddo_session *s, codec_slot *cs, ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    int rc = ddo__dev_event_record(s->dev, c->join, s->copy_stream);
    if (rc == 0)
        rc = ddo__dev_stream_wait_event(s->dev, c->decode_stream, c->join);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "decode stream (joining the copy stream)");
    if (cs->count == 0)
        return 0;
    uint64_t part = c->mem + AREAS * c->area_bytes + c->cur_slot * c->status_bytes;
    rc = ddo__dev_copy_d2h_async(s->dev, c->status_pinned + c->cur_slot * (c->status_bytes / 8),
                                 part, (size_t)cs->status_used, c->decode_stream);
    if (rc != 0)
        return ddo__session_fail_ctx(eb, rc, "copying the decoder's status to the host");
    return 0;
}

int ddo__session_codec_finish(ddo_session *s, bool ok, ddo__errbuf *eb)
{
    ddo__session_codec *c = s->codec;
    if (c == NULL || c->slots == NULL)
        return 0;
    codec_slot *cs = &c->slots[c->cur_slot];
    if (!ok) {
        /* a failed upload: the loader waits for both streams itself; nothing is decoded */
        cs->count = 0;
        c->batch.open = false;
        c->batch.count = 0;
        return 0;
    }
    int rc = c->batch.open ? launch_batch(s, eb) : 0;
    if (rc == 0)
        rc = close_unit(s, cs, eb);
    if (rc != 0) {
        cs->count = 0;
        return rc;
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

/* The device time of the checked load's launches (their events are complete: the upload
 * event follows them on the decode stream). */
static void add_decode_time(ddo_session *s, codec_slot *cs)
{
    double ns = 0.0, bytes = 0.0;
    for (size_t k = 0; k < cs->launches; k++) {
        double sec = 0.0;
        if (ddo__dev_event_elapsed(s->dev, cs->timed[2 * k], cs->timed[2 * k + 1], &sec) != 0)
            continue;
        ns += sec * 1e9;
        bytes += (double)cs->timed_bytes[k];
    }
    cs->launches = 0;
    ddo__metrics_add(&s->metrics, DDO_M_codec_decode_ns, ns);
    ddo__metrics_add(&s->metrics, DDO_M_codec_decode_timed_bytes, bytes);
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
    ddo__metrics_add(&s->metrics, DDO_M_codec_wait_ns, (double)(ddo__now_ns() - t0));
    add_decode_time(s, cs);
    /* the upload event follows the status copy on the decode stream: the copy is complete */
    const uint64_t *status = c->status_pinned + slot * (c->status_bytes / 8);
    for (size_t i = 0; i < cs->count; i++) {
        size_t t = cs->pending[i].tensor;
        const ddo__codec_plan *cp = ddo__source_coded(s->source, t);
        cp = cp != NULL ? cp : c->file_plans[t]; /* coded_file */
        rc = ddo__codec_status_check(cp, status + cs->pending[i].status_off / 8, eb);
        if (rc != 0)
            return rc;
    }
    return 0;
}
