/*
 * staging.c - the staging ring: pinned host windows taken through the
 * "staging" budget account, handed out in ring order, each reusable once the
 * copy that last read it has completed (one event per window).
 */
#include "store/staging.h"

#include "device/device.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

struct ddo__staging {
    ddo_device *dev;
    ddo__account *account;
    uint64_t taken; /* bytes taken from the account */
    size_t window_bytes;
    size_t count;
    size_t next;     /* ring position of the next acquire */
    void **windows;  /* pinned host windows */
    void **events;   /* one per window */
    bool *submitted; /* a copy reading the window was recorded and not yet waited for */
};

/* Copies the calling thread's last detail (a device wrapper's message) into buf. */
static const char *dev_detail(char *buf, size_t len)
{
    snprintf(buf, len, "%s", ddo_last_error());
    return buf;
}

/* Frees windows and events (after waiting for their copies); gives the account back. */
static void release_all(ddo__staging *st)
{
    for (size_t i = 0; i < st->count; i++) {
        /* A window whose copy could not be waited for is freed anyway: the device's own
         * free synchronizes (cuMemFreeHost), and the budget must return to zero. */
        if (st->submitted != NULL && st->submitted[i] && st->events[i] != NULL)
            (void)ddo__dev_event_synchronize(st->dev, st->events[i]);
        if (st->events != NULL && st->events[i] != NULL)
            (void)ddo__dev_event_destroy(st->dev, st->events[i]);
        if (st->windows != NULL && st->windows[i] != NULL)
            (void)ddo__dev_host_free(st->dev, st->windows[i]);
    }
    if (st->taken > 0)
        ddo__account_give(st->account, st->taken);
    free(st->windows);
    free(st->events);
    free(st->submitted);
    free(st);
}

int ddo__staging_create(ddo_device *dev, size_t windows, size_t window_bytes, ddo__account *account,
                        ddo__staging **out, ddo__errbuf *eb)
{
    if (dev == NULL || account == NULL || out == NULL || windows == 0 || window_bytes == 0)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "staging: %zu windows of %zu bytes: need at least one non-empty window",
                         windows, window_bytes);
    uint64_t total;
    if (!ddo__mul_u64(windows, window_bytes, &total))
        return ddo__fail(eb, DDO_E_OVERFLOW, "staging: %zu windows of %zu bytes overflow", windows,
                         window_bytes);
    ddo__staging *st = ddo__calloc(1, sizeof(*st));
    if (st == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "staging: out of host memory");
    st->dev = dev;
    st->account = account;
    st->window_bytes = window_bytes;
    st->windows = ddo__calloc(windows, sizeof(*st->windows));
    st->events = ddo__calloc(windows, sizeof(*st->events));
    st->submitted = ddo__calloc(windows, sizeof(*st->submitted));
    if (st->windows == NULL || st->events == NULL || st->submitted == NULL) {
        release_all(st);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "staging: out of host memory");
    }
    st->count = windows;
    /* The account refuses before any pinned byte is allocated. */
    int rc = ddo__account_take(account, total, eb);
    if (rc != 0) {
        release_all(st);
        return rc;
    }
    st->taken = total;
    for (size_t i = 0; i < windows; i++) {
        rc = ddo__dev_host_alloc(dev, window_bytes, &st->windows[i]);
        if (rc != 0) {
            st->windows[i] = NULL;
            char sz[32], why[DDO_ERRBUF_BYTES];
            ddo__fail(eb, rc, "staging: allocating pinned window %zu of %zu (%s): %s", i + 1,
                      windows, ddo__format_bytes(window_bytes, sz, sizeof(sz)),
                      dev_detail(why, sizeof(why)));
            release_all(st);
            return rc;
        }
        rc = ddo__dev_event_create(dev, &st->events[i]);
        if (rc != 0) {
            st->events[i] = NULL;
            char why[DDO_ERRBUF_BYTES];
            ddo__fail(eb, rc, "staging: creating the event of window %zu: %s", i + 1,
                      dev_detail(why, sizeof(why)));
            release_all(st);
            return rc;
        }
    }
    *out = st;
    return 0;
}

void ddo__staging_destroy(ddo__staging *st)
{
    if (st == NULL)
        return;
    release_all(st);
}

size_t ddo__staging_window_bytes(const ddo__staging *st)
{
    return st->window_bytes;
}

size_t ddo__staging_window_count(const ddo__staging *st)
{
    return st->count;
}

int ddo__staging_acquire(ddo__staging *st, size_t *index, void **window, uint64_t *waited_ns,
                         ddo__errbuf *eb)
{
    if (st == NULL || index == NULL || window == NULL)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "staging acquire: invalid argument");
    size_t i = st->next;
    uint64_t waited = 0;
    if (st->submitted[i]) {
        uint64_t t0 = ddo__now_ns();
        int rc = ddo__dev_event_synchronize(st->dev, st->events[i]);
        char why[DDO_ERRBUF_BYTES];
        if (rc != 0)
            return ddo__fail(eb, rc, "staging: waiting for the copy from window %zu: %s", i + 1,
                             dev_detail(why, sizeof(why)));
        waited = ddo__now_ns() - t0;
        st->submitted[i] = false;
    }
    st->next = (i + 1) % st->count;
    *index = i;
    *window = st->windows[i];
    if (waited_ns != NULL)
        *waited_ns = waited;
    return 0;
}

int ddo__staging_submit(ddo__staging *st, size_t index, void *stream, ddo__errbuf *eb)
{
    if (st == NULL || index >= st->count)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "staging submit: window %zu out of range",
                         index);
    int rc = ddo__dev_event_record(st->dev, st->events[index], stream);
    if (rc != 0) {
        /* The copy may already be queued: wait for the whole stream rather than hand the
         * window out again while it may still be read. */
        char why[DDO_ERRBUF_BYTES];
        dev_detail(why, sizeof(why));
        (void)ddo__dev_stream_synchronize(st->dev, stream);
        return ddo__fail(eb, rc, "staging: recording the event of window %zu: %s", index + 1, why);
    }
    st->submitted[index] = true;
    return 0;
}

int ddo__staging_drain(ddo__staging *st, ddo__errbuf *eb)
{
    if (st == NULL)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "staging drain: invalid argument");
    int first = 0;
    for (size_t i = 0; i < st->count; i++) {
        if (!st->submitted[i])
            continue;
        int rc = ddo__dev_event_synchronize(st->dev, st->events[i]);
        if (rc != 0) {
            char why[DDO_ERRBUF_BYTES];
            if (first == 0)
                first = ddo__fail(eb, rc, "staging: waiting for the copy from window %zu: %s",
                                  i + 1, dev_detail(why, sizeof(why)));
            continue;
        }
        st->submitted[i] = false;
    }
    return first;
}
