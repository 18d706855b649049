/*
 * source_codec.h - the retained store's coded bytes (weight_codec, docs/codec.md): coding the
 * store in place at setup, and the validated plan of each coded tensor the session's coded
 * transport decodes with. Internal; never installed.
 */
#ifndef DDO_SOURCE_CODEC_H
#define DDO_SOURCE_CODEC_H

#include "base/budget.h"
#include "base/common.h"
#include "codec/codec.h"
#include "metrics/metrics.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ddo__source_codec ddo__source_codec;

/* One stored tensor, in store order (increasing pos). */
enum {
    DDO__CODEC_FROM_RAW_READ, /* raw bytes read from the checkpoint: code them */
    DDO__CODEC_FROM_CODED,    /* a coded stream already (a sidecar's): validate and keep */
    DDO__CODEC_FROM_KEEP_RAW, /* raw bytes known not to shrink (a sidecar says so): keep */
    DDO__CODEC_FROM_HOST      /* a caller's host-memory tensor (its bytes at host_data, not in
                               * the store): code it into the store (or copy it there raw) */
};

typedef struct ddo__codec_item {
    size_t tensor;
    uint8_t from;    /* DDO__CODEC_FROM_* */
    uint64_t pos;    /* in: where its raw bytes lie (FROM_HOST: its place, raw-sized) in the
                      * store; out: where its bytes lie now */
    uint64_t nbytes; /* in: raw bytes; out: bytes stored (coded, or raw when coding did not pay) */
} ddo__codec_item;

/*
 * Codes the store at base in place: each item whose dtype the codec codes (FROM_HOST: from the
 * caller's memory, ddo_tensor_info.host_data) is encoded on
 * `threads` workers into a buffer of its bound (taken from `retained` for the time of the
 * coding: the plan counts it) and kept coded when that is smaller; every item is then moved
 * down to the end of the one before it, so the store ends at the returned *end (the position
 * after the last item) and the items before `split` (the registered part) at *split_end.
 * Every coded stream is validated (ddo__codec_plan_create) into *out. Metrics: setup_encode_*,
 * setup_coded_bytes, setup_codec_raw_tensors. On failure the store's bytes are undefined (the
 * caller frees it) and *out is not written. Errors: DDO_E_BUDGET, DDO_E_NO_MEMORY,
 * DDO_E_FORMAT (a stream that does not validate), DDO_E_IO (an injected fault).
 */
int ddo__source_codec_pack(const ddo_checkpoint *ck, uint8_t *base, ddo__codec_item *items,
                           size_t n, size_t split, unsigned threads, ddo__account *retained,
                           ddo__metrics_acc *metrics, ddo__source_codec **out, uint64_t *split_end,
                           uint64_t *end, ddo__errbuf *eb);
void ddo__source_codec_destroy(ddo__source_codec *c);

/* The plan of tensor's coded bytes, or NULL when it is stored raw (or c is NULL). */
const ddo__codec_plan *ddo__source_codec_plan(const ddo__source_codec *c, size_t tensor);

/* Gives the pages of [p, p + len) back to the system (the store's tail after coding). */
void ddo__source_codec_release_pages(void *p, size_t len);

/*
 * Test hook, fault injection for the encoder: the nth tensor encoded from now (1-based,
 * process-wide) fails with DDO_E_IO. 0 clears.
 */
void ddo__source_codec_fault_nth(uint64_t nth);
/* Counts one encoding; true when the injected fault hits it (every encoder calls it). */
bool ddo__source_codec_fault_hit(void);

#endif /* DDO_SOURCE_CODEC_H */
