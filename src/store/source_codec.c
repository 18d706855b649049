/*
 * source_codec.c - coding the retained store in place (source_codec.h). Setup reads the raw
 * bytes (source.c); with weight_codec on, this pass codes each BF16/F16/F32 tensor into one
 * buffer and moves every tensor, coded or raw, down to the end of the one before it. A
 * caller's host-memory tensor has a raw-sized place in the store but is coded from its own
 * memory (copied there raw when coding does not shrink it). A stored
 * item is never larger than its raw bytes, so the write position never passes the read
 * position of a tensor not yet coded, and the store shrinks to its coded size; source.c then
 * gives the pages and the account bytes that coding saved back and registers the coded
 * store.
 */
#include "store/source_codec.h"

#include "os/sys.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct ddo__source_codec {
    size_t tensor_count;
    ddo__codec_plan **plans; /* per checkpoint tensor; NULL: stored raw */
};

static atomic_uint_fast64_t fault_nth, fault_count;

void ddo__source_codec_fault_nth(uint64_t nth)
{
    atomic_store(&fault_nth, 0);
    atomic_store(&fault_count, 0);
    atomic_store(&fault_nth, nth);
}

bool ddo__source_codec_fault_hit(void)
{
    uint64_t n = atomic_fetch_add(&fault_count, 1) + 1;
    uint64_t nth = atomic_load(&fault_nth);
    return nth != 0 && n == nth;
}

void ddo__source_codec_release_pages(void *p, size_t len)
{
    ddo__os_discard_pages(p, len);
}

void ddo__source_codec_destroy(ddo__source_codec *c)
{
    if (c == NULL)
        return;
    for (size_t t = 0; c->plans != NULL && t < c->tensor_count; t++)
        ddo__codec_plan_destroy(c->plans[t]);
    free(c->plans);
    free(c);
}

const ddo__codec_plan *ddo__source_codec_plan(const ddo__source_codec *c, size_t tensor)
{
    if (c == NULL || tensor >= c->tensor_count)
        return NULL;
    return c->plans[tensor];
}

/* The encoder's buffer: the bound of the largest item it codes (0: nothing to code). */
static uint64_t buffer_bytes(const ddo_checkpoint *ck, const ddo__codec_item *items, size_t n)
{
    uint64_t most = 0;
    for (size_t i = 0; i < n; i++) {
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(ck, items[i].tensor);
        if (!ddo__codec_codes_tensor(ti->dtype, items[i].nbytes) ||
            (items[i].from != DDO__CODEC_FROM_RAW_READ && items[i].from != DDO__CODEC_FROM_HOST))
            continue;
        uint64_t b = ddo__codec_bound(ti->dtype, items[i].nbytes, 0);
        most = b > most ? b : most;
    }
    return ddo__round_up(most, 256);
}

typedef struct packer {
    const ddo_checkpoint *ck;
    uint8_t *base;
    uint8_t *buf;
    uint64_t buf_bytes;
    unsigned threads;
    ddo__source_codec *c;
    ddo__metrics_acc *metrics;
    uint64_t cursor;
} packer;

/* The store's 4 KiB congruence pads (source.c): an item that is kept as it was read and that
 * only such a pad separates from the one before stays where it is. With every tensor from a
 * sidecar, laid out at its coded size, nothing then moves. */
#define KEEP_GAP ((uint64_t)4096)

static void skip_pad(packer *pk, const ddo__codec_item *it)
{
    if (it->pos > pk->cursor && it->pos - pk->cursor < KEEP_GAP)
        pk->cursor = it->pos;
}

/* A coded stream read from a sidecar (validated there): moved to the cursor and planned. */
static int keep_coded(packer *pk, ddo__codec_item *it, ddo__errbuf *eb)
{
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(pk->ck, it->tensor);
    skip_pad(pk, it);
    uint8_t *at = pk->base + pk->cursor;
    if (at != pk->base + it->pos) {
        memmove(at, pk->base + it->pos, (size_t)it->nbytes);
        ddo__metrics_add(pk->metrics, DDO_M_setup_moved_bytes, (double)it->nbytes);
    }
    int rc = ddo__codec_plan_create(at, it->nbytes, ti->name, &pk->c->plans[it->tensor], eb);
    if (rc != 0)
        return rc;
    it->pos = pk->cursor;
    pk->cursor += it->nbytes;
    return 0;
}

/* Codes one item (when its dtype is coded and coding shrinks it) and moves it to the cursor. */
static int pack_item(packer *pk, ddo__codec_item *it, ddo__errbuf *eb)
{
    if (it->from == DDO__CODEC_FROM_CODED)
        return keep_coded(pk, it, eb);
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(pk->ck, it->tensor);
    bool host = it->from == DDO__CODEC_FROM_HOST;
    const uint8_t *raw = host ? (const uint8_t *)ti->host_data : pk->base + it->pos;
    uint8_t *at = pk->base + pk->cursor;
    uint64_t coded = 0;
    bool candidate = ddo__codec_codes_tensor(ti->dtype, it->nbytes) &&
                     (it->from == DDO__CODEC_FROM_RAW_READ || host);
    if (candidate) {
        if (ddo__source_codec_fault_hit())
            return ddo__fail(eb, DDO_E_IO, "codec: tensor `%s`: encoding: injected fault",
                             ti->name);
        ddo__codec_params cp = { 0, pk->threads };
        int rc = ddo__codec_encode(raw, it->nbytes, ti->dtype, &cp, pk->buf, pk->buf_bytes, &coded,
                                   ti->name, eb);
        if (rc != 0)
            return rc;
    }
    if (candidate && coded < it->nbytes) {
        memcpy(at, pk->buf, (size_t)coded);
        int rc = ddo__codec_plan_create(at, coded, ti->name, &pk->c->plans[it->tensor], eb);
        if (rc != 0)
            return rc;
        ddo__metrics_add(pk->metrics, DDO_M_setup_encode_bytes, (double)it->nbytes);
        ddo__metrics_add(pk->metrics, DDO_M_setup_coded_bytes, (double)coded);
        it->nbytes = coded;
    } else if (host) { /* kept raw, in the store too: the caller's bytes are never read again */
        if (candidate)
            ddo__metrics_add(pk->metrics, DDO_M_setup_codec_raw_tensors, 1);
        memcpy(at, raw, (size_t)it->nbytes);
    } else {
        if (candidate)
            ddo__metrics_add(pk->metrics, DDO_M_setup_codec_raw_tensors, 1);
        skip_pad(pk, it);
        at = pk->base + pk->cursor;
        if (at != pk->base + it->pos) {
            memmove(at, pk->base + it->pos, (size_t)it->nbytes);
            ddo__metrics_add(pk->metrics, DDO_M_setup_moved_bytes, (double)it->nbytes);
        }
    }
    it->pos = pk->cursor;
    pk->cursor += it->nbytes;
    return 0;
}

int ddo__source_codec_pack(const ddo_checkpoint *ck, uint8_t *base, ddo__codec_item *items,
                           size_t n, size_t split, unsigned threads, ddo__account *retained,
                           ddo__metrics_acc *metrics, ddo__source_codec **out, uint64_t *split_end,
                           uint64_t *end, ddo__errbuf *eb)
{
    uint64_t t0 = ddo__now_ns();
    ddo__source_codec *c = ddo__calloc(1, sizeof(*c));
    size_t tc = ddo_checkpoint_tensor_count(ck);
    if (c != NULL) {
        c->tensor_count = tc;
        c->plans = ddo__calloc(tc > 0 ? tc : 1, sizeof(*c->plans));
    }
    if (c == NULL || c->plans == NULL) {
        ddo__source_codec_destroy(c);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "codec: retained store: out of host memory");
    }
    packer pk = { ck, base, NULL, buffer_bytes(ck, items, n), threads, c, metrics, 0 };
    int rc = pk.buf_bytes > 0 ? ddo__account_take(retained, pk.buf_bytes, eb) : 0;
    if (rc == 0 && pk.buf_bytes > 0 && (pk.buf = malloc((size_t)pk.buf_bytes)) == NULL) {
        ddo__account_give(retained, pk.buf_bytes);
        rc = ddo__fail(eb, DDO_E_NO_MEMORY, "codec: retained store: the encoder's buffer");
    }
    if (rc != 0) {
        ddo__source_codec_destroy(c);
        return rc;
    }
    *split_end = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = pack_item(&pk, &items[i], eb);
        if (i + 1 == split)
            *split_end = pk.cursor;
    }
    free(pk.buf);
    if (pk.buf_bytes > 0)
        ddo__account_give(retained, pk.buf_bytes);
    if (rc != 0) {
        ddo__source_codec_destroy(c);
        return rc;
    }
    *end = pk.cursor;
    *out = c;
    ddo__metrics_add(metrics, DDO_M_setup_encode_ns, (double)(ddo__now_ns() - t0));
    return 0;
}
