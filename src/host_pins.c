/*
 * host_pins.c - registers a caller's host memory in place (see host_pins.h).
 */
#include "host_pins.h"

#include "device/device.h"
#include "os/sysinfo.h"

#include <stdlib.h>
#include <string.h>

typedef struct pin_span {
    uintptr_t start, end; /* whole pages */
    bool registered;
} pin_span;

struct ddo__host_pins {
    ddo_device *dev;
    ddo__account *acc;
    pin_span *spans; /* sorted by start, disjoint */
    size_t count;
};

static int by_start(const void *a, const void *b)
{
    uintptr_t x = ((const pin_span *)a)->start, y = ((const pin_span *)b)->start;
    return x < y ? -1 : x > y ? 1 : 0;
}

/* Page spans of the non-empty ranges, sorted and merged; returns their number. */
static size_t merged_spans(const ddo__host_range *ranges, size_t count, pin_span *spans)
{
    uintptr_t page = (uintptr_t)ddo__os_page_size();
    size_t n = 0;
    for (size_t i = 0; i < count; i++) {
        if (ranges[i].p == NULL || ranges[i].len == 0)
            continue;
        uintptr_t a = (uintptr_t)ranges[i].p;
        uintptr_t b = a + (uintptr_t)ranges[i].len;
        spans[n].start = a - a % page;
        spans[n].end = b % page ? b + (page - b % page) : b;
        spans[n].registered = false;
        n++;
    }
    qsort(spans, n, sizeof(*spans), by_start);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m > 0 && spans[i].start <= spans[m - 1].end) {
            if (spans[i].end > spans[m - 1].end)
                spans[m - 1].end = spans[i].end;
        } else {
            spans[m++] = spans[i];
        }
    }
    return m;
}

/* Registers one span through the account; with fallback a refused registration is kept
 * pageable. */
static int pin_one(ddo__host_pins *hp, pin_span *sp, bool fallback, ddo__metrics_acc *metrics,
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
    ddo__metrics_add(metrics, DDO_M_registration_fallback_bytes, (double)len);
    return 0;
}

int ddo__host_pins_create(ddo_device *dev, const ddo__host_range *ranges, size_t count,
                          ddo__account *acc, bool fallback, ddo__metrics_acc *metrics,
                          ddo__host_pins **out, ddo__errbuf *eb)
{
    ddo__host_pins *hp = ddo__calloc(1, sizeof(*hp));
    pin_span *spans = ddo__calloc(count > 0 ? count : 1, sizeof(*spans));
    if (hp == NULL || spans == NULL) {
        free(hp);
        free(spans);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "host tensors: out of host memory");
    }
    hp->dev = dev;
    hp->acc = acc;
    hp->spans = spans;
    hp->count = merged_spans(ranges, count, spans);
    uint64_t t0 = ddo__now_ns();
    for (size_t i = 0; i < hp->count; i++) {
        int rc = pin_one(hp, &hp->spans[i], fallback, metrics, eb);
        if (rc != 0) {
            ddo__host_pins_destroy(hp);
            return rc;
        }
    }
    ddo__metrics_add(metrics, DDO_M_setup_register_ns, (double)(ddo__now_ns() - t0));
    *out = hp;
    return 0;
}

bool ddo__host_pins_covers(const ddo__host_pins *hp, const void *p, uint64_t len)
{
    if (hp == NULL || hp->count == 0)
        return false;
    uintptr_t a = (uintptr_t)p;
    size_t lo = 0, hi = hp->count;
    while (hi - lo > 1) { /* the last span starting at or before a */
        size_t mid = lo + (hi - lo) / 2;
        if (hp->spans[mid].start <= a)
            lo = mid;
        else
            hi = mid;
    }
    const pin_span *sp = &hp->spans[lo];
    return sp->registered && sp->start <= a && a + (uintptr_t)len <= sp->end;
}

void ddo__host_pins_destroy(ddo__host_pins *hp)
{
    if (hp == NULL)
        return;
    for (size_t i = 0; i < hp->count; i++) {
        pin_span *sp = &hp->spans[i];
        /* A failed unregistration leaves the caller's pages pinned: nothing of ours to free,
         * and the bytes stay accounted. */
        if (sp->registered && ddo__dev_host_unregister(hp->dev, (void *)sp->start) == 0)
            ddo__account_give(hp->acc, (uint64_t)(sp->end - sp->start));
    }
    free(hp->spans);
    free(hp);
}
