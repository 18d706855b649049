/*
 * host_pins.c - a caller's host memory made readable by the copy engine in place (see
 * host_pins.h): inner pages registered, end fragments copied into a pinned arena.
 */
#include "store/host_pins.h"

#include "device/device.h"
#include "os/sysinfo.h"
#include "plan/pin_layout.h"

#include <stdlib.h>
#include <string.h>

/* The layout's pieces (plan/pin_layout.h: the planner sizes what this file registers). */
typedef ddo__pin_span pin_span;
typedef ddo__pin_frag frag;
typedef ddo__pin_cut cut;

struct ddo__host_pins {
    ddo_device *dev;
    ddo__account *acc;
    pin_span *spans; /* sorted by start, disjoint */
    size_t span_count;
    frag *frags; /* sorted by (orig, len) */
    size_t frag_count;
    uint8_t *arena; /* pinned (host_alloc) */
    uint64_t arena_bytes;
};

/* Registers one span through the account; with fallback a refused registration stays
 * pageable. */
static int pin_span_one(ddo__host_pins *hp, pin_span *sp, bool fallback, ddo__metrics_acc *m,
                        ddo__errbuf *eb)
{
    uint64_t len = (uint64_t)(sp->end - sp->start);
    int rc = ddo__account_take(hp->acc, len, eb);
    if (rc != 0)
        return rc;
    rc = ddo__dev_host_register(hp->dev, (void *)sp->start, (size_t)len);
    if (rc == 0) {
        sp->registered = true;
        return 0;
    }
    ddo__account_give(hp->acc, len);
    if (!fallback) {
        char sz[32];
        return ddo__fail(eb, rc,
                         "registering %s of host tensors in place: %s (allow_pin_memory_fallback "
                         "keeps such bytes pageable)",
                         ddo__format_bytes(len, sz, sizeof(sz)), ddo_last_error());
    }
    ddo__metrics_add(m, DDO_M_registration_fallback_bytes, (double)len);
    return 0;
}

/* The fragment arena: pinned, through the account, filled once. */
static int fill_arena(ddo__host_pins *hp, uint64_t frag_bytes, ddo__errbuf *eb)
{
    if (frag_bytes == 0)
        return 0;
    uint64_t bytes = ddo__round_up(frag_bytes, ddo__os_page_size());
    int rc = ddo__account_take(hp->acc, bytes, eb);
    if (rc != 0)
        return rc;
    void *p = NULL;
    rc = ddo__dev_host_alloc(hp->dev, (size_t)bytes, &p);
    if (rc != 0) {
        ddo__account_give(hp->acc, bytes);
        return ddo__fail(eb, rc, "host tensors: pinning their %llu end-fragment bytes: %s",
                         (unsigned long long)frag_bytes, ddo_last_error());
    }
    hp->arena = p;
    hp->arena_bytes = bytes;
    memset(hp->arena, 0, (size_t)bytes); /* the gaps between neighbours reach device padding */
    for (size_t i = 0; i < hp->frag_count; i++)
        memcpy(hp->arena + hp->frags[i].at, (const void *)hp->frags[i].orig,
               (size_t)hp->frags[i].len);
    return 0;
}

int ddo__host_pins_create(ddo_device *dev, const ddo__host_range *ranges, size_t count,
                          ddo__account *acc, bool fallback, ddo__metrics_acc *metrics,
                          ddo__host_pins **out, ddo__errbuf *eb)
{
    ddo__host_pins *hp = ddo__calloc(1, sizeof(*hp));
    pin_span *spans = ddo__calloc(count > 0 ? count : 1, sizeof(*spans));
    frag *frags = ddo__calloc(count > 0 ? 2 * count : 1, sizeof(*frags));
    if (hp == NULL || spans == NULL || frags == NULL) {
        free(hp);
        free(spans);
        free(frags);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "host tensors: out of host memory");
    }
    hp->dev = dev;
    hp->acc = acc;
    hp->spans = spans;
    hp->frags = frags;
    uint64_t frag_bytes = 0;
    ddo__pin_split(ranges, count, spans, &hp->span_count, frags, &hp->frag_count, &frag_bytes);
    uint64_t t0 = ddo__now_ns();
    int rc = fill_arena(hp, frag_bytes, eb);
    for (size_t i = 0; rc == 0 && i < hp->span_count; i++)
        rc = pin_span_one(hp, &hp->spans[i], fallback, metrics, eb);
    if (rc != 0) {
        ddo__host_pins_destroy(hp);
        return rc;
    }
    ddo__metrics_add(metrics, DDO_M_setup_register_ns, (double)(ddo__now_ns() - t0));
    *out = hp;
    return 0;
}

/* The span holding [a, b) registered, or NULL. */
static const pin_span *span_of(const ddo__host_pins *hp, uintptr_t a, uintptr_t b)
{
    size_t lo = 0, hi = hp->span_count;
    while (lo < hi) { /* the first span ending after a */
        size_t mid = lo + (hi - lo) / 2;
        if (hp->spans[mid].end <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == hp->span_count)
        return NULL;
    const pin_span *sp = &hp->spans[lo];
    return sp->registered && sp->start <= a && b <= sp->end ? sp : NULL;
}

static const frag *frag_of(const ddo__host_pins *hp, uintptr_t orig, uint64_t len)
{
    frag key = { orig, len, 0, DDO__PIN_GROUP_NONE, 0 };
    return bsearch(&key, hp->frags, hp->frag_count, sizeof(*hp->frags), ddo__pin_frag_cmp);
}

size_t ddo__host_pins_pieces(const ddo__host_pins *hp, const void *p, uint64_t len,
                             ddo__host_piece out[3])
{
    if (hp == NULL || p == NULL || len == 0)
        return 0;
    ddo__host_range r = { p, len, DDO__PIN_GROUP_NONE, 0 };
    cut c = ddo__pin_cut_range(&r, (uintptr_t)ddo__os_page_size());
    if (len <= DDO__PIN_SMALL_BYTES) {
        const frag *f = frag_of(hp, c.a, len);
        if (f == NULL || hp->arena == NULL)
            return 0;
        out[0] = (ddo__host_piece){ 0, len, hp->arena + f->at };
        return 1;
    }
    size_t n = 0;
    if (c.ia > c.a) {
        const frag *f = frag_of(hp, c.a, (uint64_t)(c.ia - c.a));
        if (f == NULL || hp->arena == NULL)
            return 0;
        out[n++] = (ddo__host_piece){ 0, f->len, hp->arena + f->at };
    }
    if (c.ib > c.ia) {
        if (span_of(hp, c.ia, c.ib) == NULL)
            return 0;
        out[n++] = (ddo__host_piece){ (uint64_t)(c.ia - c.a), (uint64_t)(c.ib - c.ia),
                                      (const void *)c.ia };
    }
    if (c.b > c.ib) {
        const frag *f = frag_of(hp, c.ib, (uint64_t)(c.b - c.ib));
        if (f == NULL || hp->arena == NULL)
            return 0;
        out[n++] = (ddo__host_piece){ (uint64_t)(c.ib - c.a), f->len, hp->arena + f->at };
    }
    return n;
}

bool ddo__host_pins_one_region(const ddo__host_pins *hp, const void *p, uint64_t len)
{
    if (hp == NULL || p == NULL)
        return false;
    uintptr_t a = (uintptr_t)p;
    uintptr_t arena = (uintptr_t)hp->arena;
    if (hp->arena != NULL && a >= arena && len <= hp->arena_bytes &&
        a - arena <= hp->arena_bytes - len)
        return true;
    return len <= UINTPTR_MAX - a && span_of(hp, a, a + (uintptr_t)len) != NULL;
}

void ddo__host_pins_destroy(ddo__host_pins *hp)
{
    if (hp == NULL)
        return;
    for (size_t i = 0; i < hp->span_count; i++) {
        pin_span *sp = &hp->spans[i];
        /* A failed unregistration leaves the caller's pages pinned: nothing of ours to free,
         * and the bytes stay accounted. */
        if (sp->registered && ddo__dev_host_unregister(hp->dev, (void *)sp->start) == 0)
            ddo__account_give(hp->acc, (uint64_t)(sp->end - sp->start));
    }
    if (hp->arena != NULL && ddo__dev_host_free(hp->dev, hp->arena) == 0)
        ddo__account_give(hp->acc, hp->arena_bytes);
    free(hp->spans);
    free(hp->frags);
    free(hp);
}
