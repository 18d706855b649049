/*
 * pin_layout.h - how a host's tensors are pinned in place, as geometry: each range cut at page
 * boundaries, its whole inner pages a span to register (adjacent spans merged), its ends (or
 * the whole of a small range) pieces of a pinned arena laid out in device order. The planner
 * sizes the registered bytes with it (ddo__host_pins_bytes); the store (store/host_pins.c)
 * registers and copies exactly this layout. Pure: no allocation of device or pinned memory.
 */
#ifndef DDO_PIN_LAYOUT_H
#define DDO_PIN_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Ranges of at most this many bytes are copied whole into the arena (no registration of
 * their own): a small tensor then costs no copy of its own, merged with its neighbours'. */
#define DDO__PIN_SMALL_BYTES (64u * 1024u)
/* No group: the range's arena bytes are placed alone, never merged with another range's. */
#define DDO__PIN_GROUP_NONE SIZE_MAX

/*
 * One range of caller memory (immutable while the pins live) and where its bytes go on the
 * device: dst is its offset in the device layout of its group (a unit's slot, the resident
 * arena). Arena pieces of one group whose destinations are at most DDO_TENSOR_ALIGN bytes
 * apart are laid out in the arena with the same gap, so one copy moves them all.
 */
typedef struct ddo__host_range {
    const void *p;
    uint64_t len;
    size_t group; /* DDO__PIN_GROUP_NONE: alone */
    uint64_t dst;
} ddo__host_range;

/* A span of whole pages to register. */
typedef struct ddo__pin_span {
    uintptr_t start, end; /* whole pages */
    bool registered;
} ddo__pin_span;

/* A piece copied into the arena. */
typedef struct ddo__pin_frag {
    uintptr_t orig; /* the caller's bytes */
    uint64_t len;
    uint64_t at;  /* offset in the arena */
    size_t group; /* of its range */
    uint64_t dst; /* its device offset in the group */
} ddo__pin_frag;

/* A range cut at page boundaries: [a, ia) head, [ia, ib) inner pages, [ib, b) tail; with no
 * whole page inside, the whole range is the head (ia = ib = b). */
typedef struct ddo__pin_cut {
    uintptr_t a, ia, ib, b;
} ddo__pin_cut;

ddo__pin_cut ddo__pin_cut_range(const ddo__host_range *r, uintptr_t page);
/* Orders pieces by (orig, len): the arena's lookup order. */
int ddo__pin_frag_cmp(const void *x, const void *y);
/* Inner-page spans (sorted, merged) and arena pieces (sorted by address, placed in device
 * order: *frag_bytes the arena's size) of the non-empty ranges: the end fragments of each
 * range, or the whole of a small one. spans holds count, frags 2 * count entries. */
void ddo__pin_split(const ddo__host_range *ranges, size_t count, ddo__pin_span *spans,
                    size_t *span_count, ddo__pin_frag *frags, size_t *frag_count,
                    uint64_t *frag_bytes);

/* What ddo__host_pins_create takes from the registered account for ranges (the plan's
 * figure): their whole inner pages plus the fragment arena rounded to pages. */
uint64_t ddo__host_pins_bytes(const ddo__host_range *ranges, size_t count);

#endif /* DDO_PIN_LAYOUT_H */
