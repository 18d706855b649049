/*
 * session_store.c - donor mode (docs/multi-gpu.md): a second device of the same kind holds
 * every streamed unit (the store), each in a buffer of its own laid out as the unit's slot,
 * and a unit reaches the session's device by device->device copies (the "store" transport)
 * instead of from host memory. The store is filled once at create, from the checkpoint
 * through a pinned window of the store device, within its own budget account (the plan's
 * store_limit); the session's device keeps exactly the budgets and addresses of one device.
 * Unload keeps the store (it is the session's source of bytes, as host memory is otherwise);
 * destroy frees it.
 */
#include "session/session_transport.h"

#include "device/device.h"

#include <stdlib.h>
#include <string.h>

#define STORE_WINDOW_BYTES (16 * DDO_MIB)

bool ddo__session_store_used(const ddo_session *s)
{
    return s->store_dev != NULL;
}

/* The bytes of unit u's slot layout that hold its streamed tensors (0: none). */
static uint64_t unit_span(const ddo_session *s, size_t u)
{
    size_t count = 0;
    const size_t *tensors = ddo_plan_unit_tensors(s->plan, u, &count);
    uint64_t span = 0;
    for (size_t i = 0; i < count; i++) {
        ddo_tensor_location loc;
        if (ddo_plan_tensor_location(s->plan, tensors[i], &loc) != 0 ||
            loc.placement != DDO_PLACEMENT_STREAMED || loc.nbytes == 0)
            continue;
        if (loc.offset + loc.nbytes > span)
            span = loc.offset + loc.nbytes;
    }
    return span;
}

/* Copies tensor t's bytes into the store at dst through the pinned window (synchronously). */
static int fill_tensor(ddo_session *s, size_t t, uint64_t dst, uint64_t nbytes, void *win,
                       void *stream)
{
    for (uint64_t pos = 0; pos < nbytes;) {
        size_t len =
            (size_t)(nbytes - pos < STORE_WINDOW_BYTES ? nbytes - pos : STORE_WINDOW_BYTES);
        int rc = ddo_checkpoint_read(s->ck, t, pos, win, len);
        if (rc != 0)
            return ddo__fail_from_last(&s->err, rc);
        rc = ddo__dev_copy_h2d(s->store_dev, dst + pos, win, len, stream);
        if (rc == 0)
            rc = ddo__dev_stream_synchronize(s->store_dev, stream);
        if (rc != 0)
            return ddo__session_fail_ctx(&s->err, rc, "store device: tensor \"%s\"",
                                         ddo__session_tensor_name(s, t));
        pos += len;
    }
    return 0;
}

/* Allocates unit u's store buffer (through the store account) and fills it. */
static int fill_unit(ddo_session *s, size_t u, void *win, void *stream)
{
    uint64_t span = unit_span(s, u);
    if (span == 0)
        return 0;
    int rc = ddo__account_take(&s->acc_store, span, &s->err);
    if (rc != 0)
        return rc;
    rc = ddo__dev_mem_alloc(s->store_dev, span, &s->store_ptr[u]);
    if (rc != 0) {
        s->store_ptr[u] = 0;
        ddo__account_give(&s->acc_store, span);
        return ddo__session_fail_ctx(&s->err, rc, "store device: unit \"%s\" (%llu bytes)",
                                     s->units[u].name, (unsigned long long)span);
    }
    s->store_span[u] = span;
    size_t count = 0;
    const size_t *tensors = ddo_plan_unit_tensors(s->plan, u, &count);
    for (size_t i = 0; i < count && rc == 0; i++) {
        ddo_tensor_location loc;
        if (ddo_plan_tensor_location(s->plan, tensors[i], &loc) != 0)
            return ddo__fail_from_last(&s->err, DDO_E_INTERNAL);
        if (loc.placement == DDO_PLACEMENT_STREAMED && loc.nbytes > 0)
            rc = fill_tensor(s, tensors[i], s->store_ptr[u] + loc.offset, loc.nbytes, win, stream);
    }
    return rc;
}

/* The store device against the plan: a donor plan that streams needs one (one with nothing
 * streamed, such as a reference with everything resident, may go without), any other plan
 * refuses one. */
static int check_plan(ddo_session *s, ddo_device *store, ddo_plan_info *info)
{
    if (ddo_plan_info_get(s->plan, info) != 0)
        return ddo__fail_from_last(&s->err, DDO_E_INTERNAL);
    if (info->device_mode == DDO_DEVICE_MODE_DONOR && info->store_bytes > 0 && store == NULL)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_create: the plan stores its units on a second device "
                         "(devices=%s): pass that device as store_device",
                         info->devices);
    if (info->device_mode != DDO_DEVICE_MODE_DONOR && store != NULL)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_create: a store_device needs a donor plan (devices "
                         "with device_mode=donor)");
    if (store == s->dev)
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_create: the store device is the session's own device");
    if (store != NULL && ddo__device_ops_of(store) != ddo__device_ops_of(s->dev))
        return ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_create: the store device is not of the session device's "
                         "kind (%s)",
                         ddo__device_ops_of(s->dev)->name);
    return 0;
}

int ddo__session_store_create(ddo_session *s, ddo_device *store)
{
    ddo_plan_info info = DDO_PLAN_INFO_INIT;
    int rc = check_plan(s, store, &info);
    if (rc != 0 || store == NULL || info.store_bytes == 0) /* nothing streamed: nothing stored */
        return rc;
    s->store_ptr = ddo__calloc(s->unit_count ? s->unit_count : 1, sizeof(*s->store_ptr));
    s->store_span = ddo__calloc(s->unit_count ? s->unit_count : 1, sizeof(*s->store_span));
    if (s->store_ptr == NULL || s->store_span == NULL)
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: store tables");
    uint64_t limit = info.store_limit > 0 ? info.store_limit : info.store_bytes;
    ddo__account_init(&s->acc_store, "store device", "store_device_budget_gb", limit);
    s->store_dev = store; /* from here destroy gives everything back */
    ddo__metrics_set(&s->metrics, DDO_M_planned_store_bytes, (double)info.store_bytes);
    uint64_t t0 = ddo__now_ns();
    void *win = NULL, *stream = NULL;
    rc = ddo__dev_host_alloc(store, STORE_WINDOW_BYTES, &win);
    if (rc != 0)
        return ddo__session_fail_ctx(&s->err, rc, "store device: pinned window");
    rc = ddo__dev_stream_create(store, 1, &stream);
    if (rc != 0)
        rc = ddo__session_fail_ctx(&s->err, rc, "store device: stream");
    uint64_t done = 0;
    for (size_t u = 0; u < s->unit_count && rc == 0; u++) {
        if (s->units[u].resident)
            continue;
        rc = fill_unit(s, u, win, stream);
        done += s->store_span[u];
        if (rc == 0 && s->opts.progress != NULL)
            s->opts.progress(s->opts.progress_user, "store", done, info.store_bytes);
    }
    if (stream != NULL)
        (void)ddo__dev_stream_destroy(store, stream);
    (void)ddo__dev_host_free(store, win);
    /* The calling thread's current device is the session's again (cuda binds the device of
     * each call: a host's runtime would otherwise find the store's context current). */
    uint64_t f = 0, t = 0;
    (void)ddo__dev_mem_info(s->dev, &f, &t);
    ddo__metrics_add(&s->metrics, DDO_M_store_fill_ns, (double)(ddo__now_ns() - t0));
    return rc;
}

void ddo__session_store_destroy(ddo_session *s)
{
    if (s->store_dev == NULL)
        return;
    for (size_t u = 0; u < s->unit_count; u++) {
        if (s->store_ptr[u] == 0)
            continue;
        if (ddo__dev_mem_free(s->store_dev, s->store_ptr[u]) == 0)
            ddo__account_give(&s->acc_store, s->store_span[u]);
        s->store_ptr[u] = 0;
    }
    ddo__account_fini(&s->acc_store);
    s->store_dev = NULL;
}

void ddo__session_store_metrics(ddo_session *s, ddo__metrics_acc *m)
{
    if (s->store_dev == NULL)
        return;
    ddo__metrics_set(m, DDO_M_store_device_bytes, (double)ddo__account_used(&s->acc_store));
    ddo__metrics_max(m, DDO_M_store_device_peak_bytes, (double)ddo__account_peak(&s->acc_store));
}

/* The store transport: up's bytes by device->device copies from its place in its unit's
 * buffer on the store device, in pieces, on the session's copy stream. */
int ddo__transport_store(ddo_session *s, const ddo__transport *t, const ddo__upload *up,
                         ddo__errbuf *eb)
{
    ddo_tensor_location loc;
    if (ddo_plan_tensor_location(s->plan, up->tensor, &loc) != 0 || loc.unit >= s->unit_count ||
        s->store_ptr[loc.unit] == 0)
        return ddo__fail(eb, DDO_E_INTERNAL, "tensor \"%s\": not on the store device",
                         ddo__session_tensor_name(s, up->tensor));
    uint64_t src = s->store_ptr[loc.unit] + loc.offset;
    for (uint64_t pos = 0; pos < up->nbytes;) {
        uint64_t left = up->nbytes - pos;
        size_t len = (size_t)(left < DDO__COPY_PIECE_BYTES ? left : DDO__COPY_PIECE_BYTES);
        int rc =
            ddo__dev_copy_peer(s->dev, up->dst + pos, s->store_dev, src + pos, len, s->copy_stream);
        if (rc != 0)
            return ddo__session_fail_ctx(eb, rc, "tensor \"%s\": copy from the store device",
                                         ddo__session_tensor_name(s, up->tensor));
        ddo__metrics_add(&s->metrics, t->metric, (double)len);
        ddo__metrics_add(&s->metrics, DDO_M_copy_bytes, (double)len);
        ddo__metrics_add(&s->metrics, DDO_M_copies, 1);
        pos += len;
    }
    return 0;
}
