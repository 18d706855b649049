/*
 * staging.h - the staging ring: a bounded set of pinned host windows
 * (vmm_staging_buffer_gb in total, whole windows) through which bytes that are
 * not registered travel to the device. A window is reusable once the copy
 * that read it has completed (an event per window).
 */
#ifndef DDO_STAGING_H
#define DDO_STAGING_H

#include "base/budget.h"
#include "base/common.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ddo__staging ddo__staging;

/* Allocates `windows` pinned windows of window_bytes through the "staging" account. */
int ddo__staging_create(ddo_device *dev, size_t windows, size_t window_bytes, ddo__account *account,
                        ddo__staging **out, ddo__errbuf *eb);
void ddo__staging_destroy(ddo__staging *st);

size_t ddo__staging_window_bytes(const ddo__staging *st);
size_t ddo__staging_window_count(const ddo__staging *st);

/*
 * Takes the next window in ring order, first waiting (event_synchronize) for
 * the copy that last used it. *index identifies it for ddo__staging_submit.
 * *waited_ns reports how long it waited (may be NULL). One thread at a time.
 */
int ddo__staging_acquire(ddo__staging *st, size_t *index, void **window, uint64_t *waited_ns,
                         ddo__errbuf *eb);
/* After queueing the copy that reads the window on stream: records its event. */
int ddo__staging_submit(ddo__staging *st, size_t index, void *stream, ddo__errbuf *eb);
/* Waits for every window's last copy. */
int ddo__staging_drain(ddo__staging *st, ddo__errbuf *eb);

#endif /* DDO_STAGING_H */
