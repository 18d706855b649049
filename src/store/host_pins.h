/*
 * host_pins.h - a caller's host memory made readable by the copy engine in place (a PyTorch
 * host's CPU tensors, given by ddo_checkpoint_create_from_memory), without a second copy of
 * the bulk: the whole pages inside each range are registered where they lie (adjacent ones
 * merged), and the bytes at either end that share a page with something else (less than a
 * page each) are copied once into a small pinned fragment arena, as are ranges of at most
 * 64 KiB whole. The arena is laid out in device order (per group, with the destinations'
 * gaps), so a unit's fragments and small tensors that lie next to each other on the device
 * move in one copy: a streamed unit costs about one copy per large tensor plus one per gap
 * between them, not three per tensor. No byte outside the ranges is ever registered, so no other
 * allocation shares a page with a registration (a copy from memory that starts inside a
 * registration and runs past its end is refused by the driver). Internal.
 */
#ifndef DDO_HOST_PINS_H
#define DDO_HOST_PINS_H

#include "base/budget.h"
#include "base/common.h"
#include "metrics/metrics.h"
#include "plan/pin_layout.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ddo_device ddo_device;
typedef struct ddo__host_pins ddo__host_pins;

/* A piece of a range and where the copy engine reads it from. */
typedef struct ddo__host_piece {
    uint64_t offset; /* within the range */
    uint64_t len;
    const void *src; /* registered or pinned memory */
} ddo__host_piece;

/*
 * Registers the inner pages of ranges[0..count) and copies their end fragments (and the
 * small ranges whole) into a pinned arena, taking the bytes from acc before each registration or
 * allocation. A failed registration: with fallback its range stays pageable
 * (registration_fallback_bytes) and its bytes go back to acc; else the create fails with the
 * device's code. On failure nothing is left registered or allocated and *out is not written.
 * Errors: DDO_E_BUDGET, DDO_E_NO_MEMORY, DDO_E_DEVICE...
 */
int ddo__host_pins_create(ddo_device *dev, const ddo__host_range *ranges, size_t count,
                          ddo__account *acc, bool fallback, ddo__metrics_acc *metrics,
                          ddo__host_pins **out, ddo__errbuf *eb);
/* True when [p, p + len) lies inside one registration or inside the arena, so one copy may
 * read it (a copy must not cross from one registration into another). */
bool ddo__host_pins_one_region(const ddo__host_pins *hp, const void *p, uint64_t len);
/*
 * The pieces through which the range starting at p (len bytes, one of the ranges given to
 * create) is read directly: at most 3 (head fragment, inner pages, tail fragment; one arena
 * piece for a range of at most DDO__PIN_SMALL_BYTES), in order, covering [0, len). Returns their
 * number, 0 when the range is not pinned (its registration fell back: read it as pageable memory).
 */
size_t ddo__host_pins_pieces(const ddo__host_pins *hp, const void *p, uint64_t len,
                             ddo__host_piece out[3]);
/* Unregisters and frees everything and gives the bytes back; NULL is a no-op. */
void ddo__host_pins_destroy(ddo__host_pins *hp);

#endif /* DDO_HOST_PINS_H */
