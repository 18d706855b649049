/*
 * pin_layout.c - the geometry of pinning a host's tensors in place (pin_layout.h): the
 * planner's figure of the registered bytes and the layout the store executes.
 */
#include "plan/pin_layout.h"

#include "base/common.h"
#include "os/sysinfo.h"

#include <stdlib.h>

ddo__pin_cut ddo__pin_cut_range(const ddo__host_range *r, uintptr_t page)
{
    ddo__pin_cut c;
    c.a = (uintptr_t)r->p;
    c.b = c.a + (uintptr_t)r->len;
    uintptr_t ia = c.a % page ? c.a + (page - c.a % page) : c.a;
    uintptr_t ib = c.b - c.b % page;
    if (ia >= ib || ia > c.b) {
        c.ia = c.ib = c.b;
    } else {
        c.ia = ia;
        c.ib = ib;
    }
    return c;
}

static int span_cmp(const void *x, const void *y)
{
    uintptr_t a = ((const ddo__pin_span *)x)->start, b = ((const ddo__pin_span *)y)->start;
    return a < b ? -1 : a > b ? 1 : 0;
}

int ddo__pin_frag_cmp(const void *x, const void *y)
{
    const ddo__pin_frag *a = x, *b = y;
    if (a->orig != b->orig)
        return a->orig < b->orig ? -1 : 1;
    return a->len < b->len ? -1 : a->len > b->len ? 1 : 0;
}

/* Device order: by group, then destination; ranges of no group after, by address. */
static int frag_dst_cmp(const void *x, const void *y)
{
    const ddo__pin_frag *a = x, *b = y;
    if (a->group != b->group)
        return a->group < b->group ? -1 : 1;
    if (a->group != DDO__PIN_GROUP_NONE && a->dst != b->dst)
        return a->dst < b->dst ? -1 : 1;
    return ddo__pin_frag_cmp(x, y);
}

/* Arena offsets in device order: a piece right after its group neighbour on the device (at
 * most DDO_TENSOR_ALIGN bytes of gap) keeps that gap in the arena, so one copy moves both.
 * Returns the arena's bytes. */
static uint64_t place_frags(ddo__pin_frag *frags, size_t nf)
{
    qsort(frags, nf, sizeof(*frags), frag_dst_cmp);
    uint64_t fb = 0;
    for (size_t i = 0; i < nf; i++) {
        const ddo__pin_frag *pv = i > 0 ? &frags[i - 1] : NULL;
        if (pv != NULL && pv->group == frags[i].group && pv->group != DDO__PIN_GROUP_NONE &&
            frags[i].dst >= pv->dst + pv->len &&
            frags[i].dst - (pv->dst + pv->len) < DDO_TENSOR_ALIGN)
            fb += frags[i].dst - (pv->dst + pv->len);
        frags[i].at = fb;
        fb += frags[i].len;
    }
    qsort(frags, nf, sizeof(*frags), ddo__pin_frag_cmp);
    return fb;
}

static ddo__pin_frag make_frag(const ddo__host_range *r, uintptr_t from, uintptr_t to)
{
    return (ddo__pin_frag){ from, (uint64_t)(to - from), 0, r->group,
                            r->dst + (uint64_t)(from - (uintptr_t)r->p) };
}

void ddo__pin_split(const ddo__host_range *ranges, size_t count, ddo__pin_span *spans,
                    size_t *span_count, ddo__pin_frag *frags, size_t *frag_count,
                    uint64_t *frag_bytes)
{
    uintptr_t page = (uintptr_t)ddo__os_page_size();
    size_t ns = 0, nf = 0;
    for (size_t i = 0; i < count; i++) {
        const ddo__host_range *r = &ranges[i];
        if (r->p == NULL || r->len == 0)
            continue;
        ddo__pin_cut c = ddo__pin_cut_range(r, page);
        if (r->len <= DDO__PIN_SMALL_BYTES) {
            frags[nf++] = make_frag(r, c.a, c.b);
            continue;
        }
        if (c.ia > c.a)
            frags[nf++] = make_frag(r, c.a, c.ia);
        if (c.ib > c.ia)
            spans[ns++] = (ddo__pin_span){ c.ia, c.ib, false };
        if (c.b > c.ib)
            frags[nf++] = make_frag(r, c.ib, c.b);
    }
    qsort(spans, ns, sizeof(*spans), span_cmp);
    size_t m = 0;
    for (size_t i = 0; i < ns; i++) {
        if (m > 0 && spans[i].start <= spans[m - 1].end) {
            if (spans[i].end > spans[m - 1].end)
                spans[m - 1].end = spans[i].end;
        } else {
            spans[m++] = spans[i];
        }
    }
    *span_count = m;
    *frag_count = nf;
    *frag_bytes = place_frags(frags, nf);
}

uint64_t ddo__host_pins_bytes(const ddo__host_range *ranges, size_t count)
{
    ddo__pin_span *spans = ddo__calloc(count > 0 ? count : 1, sizeof(*spans));
    ddo__pin_frag *frags = ddo__calloc(count > 0 ? 2 * count : 1, sizeof(*frags));
    uint64_t total = 0;
    if (spans != NULL && frags != NULL) {
        size_t ns = 0, nf = 0;
        uint64_t fb = 0;
        ddo__pin_split(ranges, count, spans, &ns, frags, &nf, &fb);
        for (size_t i = 0; i < ns; i++)
            total += (uint64_t)(spans[i].end - spans[i].start);
        total += ddo__round_up(fb, ddo__os_page_size());
    } else {
        for (size_t i = 0; i < count; i++) /* an upper bound without the tables */
            total += ranges[i].len + ddo__os_page_size();
    }
    free(spans);
    free(frags);
    return total;
}
