/*
 * host_pins.h - registration in place of memory a caller owns (a PyTorch host's CPU
 * tensors, given by ddo_checkpoint_create_from_memory): the pages under the given ranges,
 * merged where they touch, are registered with the device so that the copy engine reads the
 * caller's bytes directly - no second host copy and no staging. Internal.
 */
#ifndef DDO_HOST_PINS_H
#define DDO_HOST_PINS_H

#include "budget.h"
#include "common.h"
#include "metrics.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ddo_device ddo_device;
typedef struct ddo__host_pins ddo__host_pins;

/* One range of caller memory to register. */
typedef struct ddo__host_range {
    const void *p;
    uint64_t len;
} ddo__host_range;

/*
 * Registers the pages under ranges[0..count) (rounded out to whole pages, overlapping or
 * touching ones merged), taking their bytes from acc before each registration. A failed
 * registration: with fallback the pages stay pageable (registration_fallback_bytes) and the
 * bytes go back to acc; else the create fails with the device's code. On failure nothing is
 * left registered and *out is not written. Errors: DDO_E_BUDGET, DDO_E_NO_MEMORY,
 * DDO_E_DEVICE...
 */
int ddo__host_pins_create(ddo_device *dev, const ddo__host_range *ranges, size_t count,
                          ddo__account *acc, bool fallback, ddo__metrics_acc *metrics,
                          ddo__host_pins **out, ddo__errbuf *eb);
/* True when [p, p + len) lies inside one registered range (a copy may read it directly). */
bool ddo__host_pins_covers(const ddo__host_pins *hp, const void *p, uint64_t len);
/* Unregisters everything and gives the bytes back; NULL is a no-op. */
void ddo__host_pins_destroy(ddo__host_pins *hp);

#endif /* DDO_HOST_PINS_H */
