/*
 * session.c - executing a plan: session setup and teardown, the lifecycle
 * (unload, reload, the error boundary, the pinned host-cache trim),
 * synchronisation and metrics. The parts of the runtime are in their own
 * files (session.h lists them): slots, leases, prefetch, the loader, the
 * transports, VMM mappings and vmm_runtime's handle pool.
 *
 * Setup allocates exactly what the plan predicted: every byte goes through a
 * budget account limited by the plan's figure, and a failure at any step
 * unwinds everything taken before it.
 *
 * Thread-safety: one host thread at a time per session. Internally a loader
 * thread issues uploads; see session.h.
 */
#include "session/session.h"
#include "session/session_codec.h"

#include "config/config.h"
#include "device/device.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail_dev(ddo__errbuf *eb, int rc, const char *what)
{
    char last[DDO_ERRBUF_BYTES];
    snprintf(last, sizeof(last), "%s", ddo_last_error());
    return ddo__fail(eb, rc, "session: %s: %s", what, last[0] ? last : ddo_strerror(rc));
}

static void settings_from(const ddo_session_options *opts, ddo__route route,
                          ddo__session_settings *out)
{
    out->workers = 1;
    out->engine = DDO__READ_ENGINE_AUTO;
    out->allow_register_fallback = true;
    out->pressure_reclaim = false;
    out->dxgi_local_headroom = 0;
    out->dxgi_shared_headroom = 0;
    out->codec_cache_dir = NULL;
    if (opts == NULL || opts->config == NULL)
        return;
    const ddo__options *o = ddo__config_options(opts->config);
    if (o == NULL)
        return;
    out->workers = o->pin_cpu_workers >= 1 ? (size_t)o->pin_cpu_workers : 1;
    if (o->read_engine != NULL && strcmp(o->read_engine, "io_uring") == 0)
        out->engine = DDO__READ_ENGINE_IO_URING;
    else if (o->read_engine != NULL && strcmp(o->read_engine, "pread") == 0)
        out->engine = DDO__READ_ENGINE_PREAD;
    out->allow_register_fallback = o->allow_pin_memory_fallback;
    /* The automatic pressure policy exists on the native fast route only. */
    out->pressure_reclaim = o->vmm_execution_backing_reclaim && route == DDO__ROUTE_VMM_FAST;
    out->dxgi_local_headroom = ddo__gb_to_bytes(o->vmm_dxgi_local_headroom_gb);
    out->dxgi_shared_headroom = ddo__gb_to_bytes(o->vmm_dxgi_shared_headroom_gb);
    out->codec_cache_dir = o->weight_codec_cache_dir;
}

/* ------------------------------------------------------------------------ */
/* Device state: slot backing and the resident arena                         */
/* ------------------------------------------------------------------------ */

/* Releases slot backing and the arena (loader idle). Returns the first error. */
static int drop_device_state(ddo_session *s)
{
    int first = 0;
    for (size_t i = 0; i < s->slot_count; i++) {
        ddo__slot *sl = &s->slots[i];
        sl->prefetched = false;
        if (sl->unsafe)
            continue;
        int rc = ddo__session_slot_unback(s, sl);
        if (rc != 0 && first == 0)
            first = rc;
        if (!sl->unsafe)
            ddo__slot_enter(s, sl, DDO__SLOT_FREE);
        sl->release_recorded = false;
    }
    if (ddo__route_per_weight(s->route)) {
        uint64_t bytes = 0;
        int rc = ddo__session_pool_release(s, &bytes);
        if (rc != 0 && first == 0)
            first = rc;
    }
    for (size_t u = 0; s->units != NULL && u < s->unit_count; u++) {
        s->units[u].leased = false;
        s->units[u].slot = DDO__NONE;
    }
    int crc = ddo__session_codec_unback(s);
    if (crc != 0 && first == 0)
        first = crc;
    crc = ddo__session_split_unback(s);
    if (crc != 0 && first == 0)
        first = crc;
    if (s->arena != 0 && !s->arena_unsafe) {
        int rc = ddo__dev_mem_free(s->dev, s->arena);
        if (rc != 0) {
            /* Never freed twice; its bytes stay accounted and are reported. */
            s->arena_unsafe = true;
            if (first == 0)
                first = fail_dev(&s->err, rc, "releasing the resident arena");
        } else {
            ddo__account_give(&s->acc_device, s->b.resident_bytes);
            s->arena = 0;
        }
    }
    return first;
}

/* Backs every slot, allocates the arena and uploads the residents. Unwinds on failure. */
static int make_device_state(ddo_session *s)
{
    int rc;
    /* vmm_runtime takes its weights' handles when a unit loads, within the mapped budget. */
    size_t backed_slots = ddo__route_per_weight(s->route) ? 0 : s->slot_count;
    uint64_t total = s->b.resident_bytes + (uint64_t)backed_slots * s->slot_bytes;
    uint64_t done = 0;
    for (size_t i = 0; i < backed_slots; i++) {
        if (s->slots[i].unsafe)
            continue;
        rc = ddo__session_slot_back(s, &s->slots[i], false);
        if (rc != 0)
            goto fail;
        done += s->slot_bytes;
        if (s->opts.progress != NULL)
            s->opts.progress(s->opts.progress_user, "allocate", done, total);
    }
    rc = ddo__session_codec_back(s);
    if (rc != 0)
        goto fail;
    if (s->b.resident_bytes > 0 && s->arena == 0 && !s->arena_unsafe) {
        rc = ddo__account_take(&s->acc_device, s->b.resident_bytes, &s->err);
        if (rc != 0)
            goto fail;
        rc = ddo__dev_mem_alloc(s->dev, s->b.resident_bytes, &s->arena);
        if (rc != 0) {
            ddo__account_give(&s->acc_device, s->b.resident_bytes);
            s->arena = 0;
            rc = fail_dev(&s->err, rc, "allocating the resident arena");
            goto fail;
        }
        if (s->opts.progress != NULL)
            s->opts.progress(s->opts.progress_user, "allocate", total, total);
        rc = ddo__session_upload_residents(s);
        if (rc != 0)
            goto fail;
    }
    rc = ddo__session_split_back(s); /* the other devices of a split set */
    if (rc != 0)
        goto fail;
    return 0;
fail:;
    ddo__errbuf keep = s->err;
    (void)drop_device_state(s);
    s->err = keep;
    ddo__fail(NULL, keep.code, "%s", keep.msg);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Create / destroy                                                          */
/* ------------------------------------------------------------------------ */

/* Waits for every outstanding upload and release (destroy/unload). First error or 0. */
static int quiesce(ddo_session *s)
{
    int first = 0;
    ddo__session_wait_idle(s);
    if (s->copy_stream != NULL) {
        int rc = ddo__dev_stream_synchronize(s->dev, s->copy_stream);
        if (rc != 0)
            first = fail_dev(&s->err, rc, "waiting for the copy stream");
    }
    if (s->notify_stream != NULL) {
        int rc = ddo__dev_stream_synchronize(s->dev, s->notify_stream);
        if (rc != 0 && first == 0)
            first = fail_dev(&s->err, rc, "waiting for the upload notes");
    }
    int crc = ddo__session_codec_sync(s);
    if (crc != 0 && first == 0)
        first = fail_dev(&s->err, crc, "waiting for the decode stream");
    if (s->staging != NULL) {
        ddo__errbuf eb;
        int rc = ddo__staging_drain(s->staging, &eb);
        if (rc != 0 && first == 0)
            first = ddo__fail(&s->err, rc, "%s", eb.msg);
    }
    for (size_t i = 0; s->slots != NULL && i < s->slot_count; i++) {
        ddo__slot *sl = &s->slots[i];
        if (sl->unsafe || !sl->release_recorded || sl->release_event == NULL)
            continue;
        /* A consumer still holds the slot's bytes: wait for that one event. */
        int rc = ddo__dev_event_synchronize(s->dev, sl->release_event);
        if (rc != 0) {
            ddo__slot_mark_unsafe(s, sl);
            if (first == 0)
                first = fail_dev(&s->err, rc, "waiting for a release event (slot kept as unsafe)");
        }
        sl->release_recorded = false;
    }
    return first;
}

uint64_t ddo__session_release_all(ddo_session *s)
{
    if (s == NULL)
        return 0;
    ddo__session_loader_stop(s);
    (void)quiesce(s);
    if (s->slots != NULL)
        (void)drop_device_state(s);
    ddo__session_release_ranges(s);
    if (s->slots != NULL) {
        for (size_t i = 0; i < s->slot_count; i++) {
            ddo__slot *sl = &s->slots[i];
            if (sl->upload_event != NULL)
                (void)ddo__dev_event_destroy(s->dev, sl->upload_event);
            if (sl->release_event != NULL)
                (void)ddo__dev_event_destroy(s->dev, sl->release_event);
            sl->upload_event = sl->release_event = NULL;
        }
    }
    ddo__staging_destroy(s->staging);
    s->staging = NULL;
    ddo__source_destroy(s->source);
    s->source = NULL;
    if (s->copy_stream != NULL) {
        (void)ddo__dev_stream_destroy(s->dev, s->copy_stream);
        s->copy_stream = NULL;
    }
    if (s->notify_stream != NULL) {
        (void)ddo__dev_stream_destroy(s->dev, s->notify_stream);
        s->notify_stream = NULL;
    }
    uint64_t left = 0;
    if (s->accounts_ready) {
        left = ddo__account_used(&s->acc_device) + ddo__account_used(&s->acc_retained) +
               ddo__account_used(&s->acc_registered) + ddo__account_used(&s->acc_staging);
    }
    s->unloaded = true;
    return left;
}

void ddo__session_destroy_now(ddo_session *s)
{
    (void)ddo__session_release_all(s);
    ddo__session_store_destroy(s);
    ddo__session_split_destroy(s);
    free(s->store_ptr);
    free(s->store_span);
    if (s->accounts_ready) {
        ddo__account_fini(&s->acc_device);
        ddo__account_fini(&s->acc_retained);
        ddo__account_fini(&s->acc_registered);
        ddo__account_fini(&s->acc_staging);
    }
    if (s->metrics_ready)
        ddo__metrics_fini(&s->metrics);
    if (s->sync_ready) {
        ddo__cond_destroy(&s->cv);
        ddo__mutex_destroy(&s->mu);
        ddo__mutex_destroy(&s->busy_mu);
    }
    free(s->bounce);
    free((void *)s->tensor_views);
    free((void *)s->unit_views);
    free(s->units);
    free(s->slots);
    free(s->jobs);
    free(s->resident);
    free(s->order.units);
    free(s->order.pos);
    free(s->order.home);
    free(s->order.learn);
    free(s->order.learn_seen);
    free(s->w_va);
    free(s->w_handle);
    free(s->pool.handle);
    free(s->pool.size);
    ddo__weight_layout_free(&s->own_wl);
    ddo__session_codec_destroy(s);
    free(s);
}

void ddo_session_destroy(ddo_session *s)
{
    if (s != NULL && atomic_fetch_sub(&s->refs, 1) == 1)
        ddo__session_destroy_now(s);
}

static int build_source(ddo_session *s)
{
    /* vmm_runtime keeps no store of its own (plan_codec.c): a caller's tensors move raw. */
    bool codec = ddo__session_codec_wanted(s);
    bool code_host = codec && !ddo__route_per_weight(s->route);
    size_t count = 0;
    for (size_t u = 0; u < s->unit_count; u++) {
        size_t n = 0;
        if (!s->units[u].resident)
            (void)ddo_plan_unit_tensors(s->plan, u, &n);
        count += n;
    }
    /* The plan may register a caller's resident tensors in place too (host_residents). */
    bool residents = s->plan->host_residents == DDO_HOST_RESIDENTS_REGISTERED;
    if (residents)
        count += s->resident_count;
    ddo__source_request *req = ddo__calloc(count > 0 ? count : 1, sizeof(*req));
    if (req == NULL)
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: out of memory");
    size_t k = 0;
    for (size_t i = 0; residents && i < s->resident_count; i++) {
        ddo_tensor_location loc;
        req[k].tensor = s->resident[i];
        req[k].retain = true;
        req[k].register_ = true;
        req[k].group = s->unit_count; /* the resident arena, as the planner groups it */
        req[k].dst = ddo_plan_tensor_location(s->plan, s->resident[i], &loc) == 0 ? loc.offset : 0;
        k++;
    }
    for (size_t u = 0; u < s->unit_count; u++) {
        if (s->units[u].resident)
            continue;
        ddo_unit_info info;
        if (ddo_plan_unit(s->plan, u, &info) != 0)
            continue;
        size_t n = 0;
        const size_t *t = ddo_plan_unit_tensors(s->plan, u, &n);
        for (size_t i = 0; i < n; i++) {
            ddo_tensor_location loc;
            if (ddo_plan_tensor_location(s->plan, t[i], &loc) != 0 ||
                loc.placement != DDO_PLACEMENT_STREAMED)
                continue;
            req[k].tensor = t[i];
            req[k].retain = info.retained;
            req[k].register_ = info.retained && info.registered;
            req[k].group = u;
            req[k].dst = loc.offset;
            req[k].code_host = code_host;
            k++;
        }
    }
    ddo__source_params p;
    memset(&p, 0, sizeof(p));
    p.ck = s->ck;
    p.dev = s->dev;
    p.workers = s->set.workers;
    p.engine = s->set.engine;
    p.allow_register_fallback = s->set.allow_register_fallback;
    p.retained = &s->acc_retained;
    p.registered = &s->acc_registered;
    p.metrics = &s->metrics;
    p.progress = s->opts.progress;
    p.progress_user = s->opts.progress_user;
    p.codec = codec;
    p.codec_cache_dir = s->set.codec_cache_dir;
    int rc = ddo__source_create(&p, req, k, &s->source, &s->err);
    free(req);
    return rc;
}

static int alloc_tables(ddo_session *s)
{
    size_t n = s->unit_count, m = s->slot_count;
    s->units = ddo__calloc(n, sizeof(*s->units));
    s->slots = ddo__calloc(m, sizeof(*s->slots));
    s->jobs = ddo__calloc(m, sizeof(*s->jobs));
    s->order.units = ddo__calloc(n, sizeof(*s->order.units));
    s->order.pos = ddo__calloc(n, sizeof(*s->order.pos));
    s->order.home = ddo__calloc(n, sizeof(*s->order.home));
    s->order.learn = ddo__calloc(2 * n + 2, sizeof(*s->order.learn));
    s->order.learn_seen = ddo__calloc(n, sizeof(*s->order.learn_seen));
    size_t tc = ddo_checkpoint_tensor_count(s->ck);
    s->resident = ddo__calloc(tc, sizeof(*s->resident));
    if (ddo__route_per_weight(s->route)) {
        /* The ranges and handles of the plan's layout (session_vmm.c, session_pool.c). */
        s->w_va = ddo__calloc(tc, sizeof(*s->w_va));
        s->w_handle = ddo__calloc(tc, sizeof(*s->w_handle));
        if (s->w_va == NULL || s->w_handle == NULL)
            return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: out of memory");
    }
    if (s->units == NULL || s->slots == NULL || s->jobs == NULL || s->order.units == NULL ||
        s->order.pos == NULL || s->order.home == NULL || s->order.learn == NULL ||
        s->order.learn_seen == NULL || s->resident == NULL)
        return ddo__fail(&s->err, DDO_E_NO_MEMORY, "session: out of memory");
    for (size_t u = 0; u < n; u++) {
        ddo_unit_info info;
        if (ddo_plan_unit(s->plan, u, &info) != 0)
            return ddo__fail_from_last(&s->err, DDO_E_INTERNAL);
        s->units[u].slot = DDO__NONE;
        s->units[u].alias_slot = DDO__NONE;
        s->units[u].resident = info.resident;
        s->units[u].bytes = info.bytes;
        s->units[u].name = info.name != NULL ? info.name : "?";
        s->order.pos[u] = DDO__NONE;
        s->order.home[u] = DDO__NONE;
    }
    for (size_t i = 0; i < m; i++) {
        s->slots[i].unit = DDO__NONE;
        s->slots[i].mapped_unit = DDO__NONE;
        s->slots[i].owner = s;
    }
    for (size_t t = 0; t < tc; t++) {
        ddo_tensor_location loc;
        if (ddo_plan_tensor_location(s->plan, t, &loc) == 0 &&
            loc.placement == DDO_PLACEMENT_RESIDENT && loc.nbytes > 0)
            s->resident[s->resident_count++] = t;
    }
    return 0;
}

/* The four budget accounts, each limited by the plan's peaks (the device one by its limit). */
static void init_accounts(ddo_session *s)
{
    uint64_t dev_limit =
        s->b.device_weights_limit > 0 ? s->b.device_weights_limit : s->b.device_weights_peak;
    ddo__account_init(&s->acc_device, "device weights", "vmm_resident_weight_budget_gb", dev_limit);
    ddo__account_init(&s->acc_retained, "retained host", "vmm_source_cache_gb", s->b.retained_peak);
    ddo__account_init(&s->acc_registered, "registered host", "vmm_source_registered_gb",
                      s->b.registered_peak);
    ddo__account_init(&s->acc_staging, "staging", "vmm_staging_buffer_gb", s->b.staging_peak);
    s->accounts_ready = true;
}

/* Every slot's upload and release events. */
static int create_slot_events(ddo_session *s)
{
    for (size_t i = 0; i < s->slot_count; i++) {
        int rc = ddo__dev_event_create(s->dev, &s->slots[i].upload_event);
        if (rc != 0) {
            s->slots[i].upload_event = NULL;
            return fail_dev(&s->err, rc, "creating an upload event");
        }
        rc = ddo__dev_event_create(s->dev, &s->slots[i].release_event);
        if (rc != 0) {
            s->slots[i].release_event = NULL;
            return fail_dev(&s->err, rc, "creating a release event");
        }
    }
    return 0;
}

static int setup(ddo_session *s)
{
    int rc;
    uint64_t t0 = ddo__now_ns();
    rc = alloc_tables(s);
    if (rc != 0)
        return rc;

    init_accounts(s);

    if (s->slot_count > 0 && ddo__route_maps(s->route)) {
        rc = ddo__session_check_granularity(s);
        if (rc == 0 && ddo__route_per_weight(s->route))
            rc = ddo__session_pool_init(s);
        if (rc != 0)
            return rc;
    }

    rc = ddo__dev_stream_create(s->dev, 1, &s->copy_stream);
    if (rc != 0) {
        s->copy_stream = NULL;
        return fail_dev(&s->err, rc, "creating the copy stream");
    }
    /* Without it the notes go on the copy stream (session_loader.c): slower, not wrong. */
    if (ddo__dev_stream_create(s->dev, 1, &s->notify_stream) != 0)
        s->notify_stream = NULL;

    rc = build_source(s);
    if (rc != 0) {
        s->source = NULL;
        return rc;
    }
    rc = ddo__session_store_create(s, s->opts.store_device);
    if (rc == 0)
        rc = ddo__session_split_create(s);
    if (rc == 0)
        rc = ddo__session_share_create(s);
    if (rc != 0)
        return rc;
    uint64_t t_codec = ddo__now_ns();
    rc = ddo__session_codec_create(s);
    if (rc != 0)
        return rc;
    uint64_t t_alloc = ddo__now_ns();
    if (s->codec != NULL)
        ddo__metrics_add(&s->metrics, DDO_M_setup_codec_ns, (double)(t_alloc - t_codec));

    rc = ddo__session_create_buffers(s);
    if (rc != 0)
        return rc;
    rc = create_slot_events(s);
    if (rc != 0)
        return rc;
    rc = ddo__session_reserve_ranges(s);
    if (rc != 0)
        return rc;

    rc = make_device_state(s);
    if (rc != 0)
        return rc;
    rc = ddo__session_loader_start(s);
    if (rc != 0)
        return rc;

    uint64_t t1 = ddo__now_ns();
    ddo__metrics_add(&s->metrics, DDO_M_setup_ns, (double)(t1 - t0));
    ddo__metrics_add(&s->metrics, DDO_M_setup_allocate_ns, (double)(t1 - t_alloc));
    return 0;
}

static void set_planned(ddo_session *s)
{
    ddo__metrics_acc *m = &s->metrics;
    ddo__metrics_set(m, DDO_M_planned_device_weights_bytes, (double)s->b.device_weights_peak);
    ddo__metrics_set(m, DDO_M_planned_resident_bytes, (double)s->b.resident_bytes);
    ddo__metrics_set(m, DDO_M_planned_slot_count, (double)s->b.slot_count);
    ddo__metrics_set(m, DDO_M_planned_slot_bytes, (double)s->b.slot_bytes);
    ddo__metrics_set(m, DDO_M_planned_retained_bytes, (double)s->b.retained_peak);
    ddo__metrics_set(m, DDO_M_planned_registered_bytes, (double)s->b.registered_peak);
    ddo__metrics_set(m, DDO_M_planned_staging_bytes, (double)s->b.staging_peak);
}

int ddo_session_create(const ddo_plan *plan, const ddo_checkpoint *ck, ddo_device *dev,
                       const ddo_session_options *opts, ddo_session **out)
{
    if (out != NULL)
        *out = NULL;
    if (plan == NULL || ck == NULL || dev == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_create: plan, checkpoint, device and out are required");
    ddo_session_options taken;
    if (opts != NULL) {
        int rc = DDO__ABI_IN(ddo_session_options, opts, &taken);
        if (rc != 0)
            return rc;
        opts = &taken;
    }
    ddo_plan_budgets b;
    if (ddo_plan_budgets_get(plan, &b) != 0)
        return ddo__fail_from_last(NULL, DDO_E_INVALID_ARGUMENT);
    if (b.slot_count > 0 && b.slot_bytes == 0)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_create: the plan has %zu slots of 0 bytes", b.slot_count);

    ddo_session *s = ddo__calloc(1, sizeof(*s));
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_session_create: out of memory");
    s->plan = plan;
    s->ck = ck;
    s->dev = dev;
    s->b = b;
    atomic_init(&s->refs, 1);
    s->view_device_id = -1;
    if (opts != NULL)
        s->opts = *opts;
    s->opts.config = NULL; /* borrowed during create only */
    /* The plan decided the route; the session executes it. */
    s->route = ddo__plan_route_of(plan);
    s->route_name = ddo_plan_route(plan) != NULL ? ddo_plan_route(plan) : "none";
    settings_from(opts, s->route, &s->set);
    ddo_plan_info pi = DDO_PLAN_INFO_INIT;
    if (ddo_plan_info_get(plan, &pi) == 0 && !pi.codec_sidecar)
        s->set.codec_cache_dir = NULL; /* raw from the file (or no codec at all) */
    s->unit_count = ddo_plan_unit_count(plan);
    s->slot_count = b.slot_count;
    s->slot_bytes = b.slot_bytes;
    ddo__mutex_init(&s->mu);
    ddo__mutex_init(&s->busy_mu);
    ddo__cond_init(&s->cv);
    s->sync_ready = true;
    ddo__metrics_init(&s->metrics);
    s->metrics_ready = true;
    set_planned(s);

    bool any_streamed = false;
    for (size_t u = 0; u < s->unit_count; u++) {
        ddo_unit_info info;
        if (ddo_plan_unit(plan, u, &info) == 0 && !info.resident && info.bytes > 0)
            any_streamed = true;
    }
    int rc = 0;
    if (any_streamed && s->slot_count == 0)
        rc = ddo__fail(&s->err, DDO_E_INVALID_ARGUMENT,
                       "ddo_session_create: the plan streams units but has no execution slots");
    if (rc == 0)
        rc = setup(s);
    s->set.codec_cache_dir = NULL; /* the config's string: borrowed during create only */
    if (rc != 0) {
        ddo__errbuf keep = s->err;
        ddo_session_destroy(s);
        return ddo__fail(NULL, rc, "%s", keep.msg);
    }
    *out = s;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Lifecycle                                                                 */
/* ------------------------------------------------------------------------ */

int ddo_session_unload(ddo_session *s)
{
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_session_unload: session is NULL");
    if (s->unloaded)
        return 0;
    ddo__metrics_add(&s->metrics, DDO_M_unloads, 1);
    int first = quiesce(s);
    ddo__mutex_lock(&s->mu);
    int rc = drop_device_state(s);
    s->unloaded = true;
    ddo__mutex_unlock(&s->mu);
    if (first == 0)
        first = rc;
    return first;
}

int ddo_session_release_host(ddo_session *s)
{
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_session_release_host: session is NULL");
    bool codec = s->codec != NULL || ddo__session_codec_wanted(s);
    if (codec || s->plan->host_residents != DDO_HOST_RESIDENTS_NONE)
        return ddo__fail(&s->err, DDO_E_UNSUPPORTED,
                         "ddo_session_release_host: %s; unload() keeps the host store",
                         codec ? "weight_codec's stores stay with the session"
                               : "the weights are the caller's host tensors");
    int rc = ddo_session_unload(s);
    if (rc != 0 || s->source == NULL)
        return rc;
    /* Unloaded and quiesced: no load reads the store any more. */
    ddo__source_destroy(s->source);
    s->source = NULL;
    return 0;
}

int ddo_session_reload(ddo_session *s)
{
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_session_reload: session is NULL");
    if (!s->unloaded)
        return 0;
    if (!s->loader_started)
        return ddo__fail(&s->err, DDO_E_STATE, "ddo_session_reload: the session was released");
    ddo__mutex_lock(&s->mu);
    int rc = s->source == NULL ? build_source(s) : 0; /* after ddo_session_release_host */
    if (rc != 0)
        s->source = NULL;
    else
        rc = make_device_state(s);
    if (rc == 0) {
        s->unloaded = false;
        ddo__metrics_add(&s->metrics, DDO_M_reloads, 1);
        ddo__session_prefetch_head(s); /* the next pass's first units, loading already */
    }
    ddo__mutex_unlock(&s->mu);
    return rc;
}

int ddo_session_run_phase(ddo_session *s, int (*phase)(void *user), void *user)
{
    if (s == NULL || phase == NULL)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_run_phase: session and phase are required");
    int rc = phase(user);
    if (rc == 0)
        return 0;
    char original[DDO_ERRBUF_BYTES];
    snprintf(original, sizeof(original), "%s", ddo_last_error());
    if (original[0] == '\0')
        snprintf(original, sizeof(original), "phase failed: %s", ddo_strerror(rc));
    int rc2 = ddo_session_unload(s);
    if (rc2 != 0) {
        char cleanup[DDO_ERRBUF_BYTES];
        snprintf(cleanup, sizeof(cleanup), "%s", ddo_last_error());
        return ddo__fail(&s->err, rc, "%.600s; cleanup also failed: %.400s", original, cleanup);
    }
    return ddo__fail(&s->err, rc, "%s", original);
}

int ddo_session_synchronize(ddo_session *s)
{
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_session_synchronize: session is NULL");
    ddo__session_wait_idle(s);
    int rc = ddo__dev_stream_synchronize(s->dev, s->copy_stream);
    if (rc != 0)
        return fail_dev(&s->err, rc, "waiting for the copy stream");
    if (s->notify_stream != NULL &&
        (rc = ddo__dev_stream_synchronize(s->dev, s->notify_stream)) != 0)
        return fail_dev(&s->err, rc, "waiting for the upload notes");
    if (s->staging != NULL) {
        rc = ddo__staging_drain(s->staging, &s->err);
        if (rc != 0)
            return rc;
    }
    ddo__mutex_lock(&s->mu);
    ddo__session_reap(s);
    ddo__mutex_unlock(&s->mu);
    return 0;
}

int ddo_session_trim_host_cache(ddo_session *s, bool enabled, uint64_t *released_bytes)
{
    if (s == NULL || released_bytes == NULL)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_trim_host_cache: session and released_bytes are required");
    if (!enabled) {
        *released_bytes = 0;
        return 0;
    }
    /* Nothing may still be pending: the loader idle, then every window's last copy done. The
     * host thread is the only one queueing uploads, so the loader stays idle afterwards. */
    ddo__session_wait_idle(s);
    uint64_t bytes = 0;
    if (s->staging != NULL) {
        int rc = ddo__staging_drain(s->staging, &s->err);
        if (rc != 0)
            return rc;
        bytes +=
            (uint64_t)ddo__staging_window_count(s->staging) * ddo__staging_window_bytes(s->staging);
        ddo__staging_destroy(s->staging); /* gives the staging account back */
        s->staging = NULL;
    }
    if (s->bounce != NULL) {
        /* Every copy from the bounce buffer was waited for when it was handed back. */
        free(s->bounce);
        s->bounce = NULL;
        bytes += DDO__BOUNCE_BYTES;
    }
    if (bytes > 0) {
        ddo__metrics_add(&s->metrics, DDO_M_host_cache_trims, 1);
        ddo__metrics_add(&s->metrics, DDO_M_host_cache_trimmed_bytes, (double)bytes);
    }
    *released_bytes = bytes;
    return 0;
}

/* A metrics snapshot with the plan's facts handed down (the metrics never read a plan): the
 * route, the planned budgets, the decisions as key/value pairs. */
static int snapshot_with_plan(ddo__metrics_acc *m, const ddo_plan *plan, const char *const *labels,
                              size_t label_count, ddo_metrics **out)
{
    if (plan == NULL)
        return ddo__metrics_snapshot(m, NULL, labels, label_count, out);
    ddo_plan_budgets b;
    ddo__metrics_plan_facts f = { ddo_plan_route(plan), NULL, NULL, 0 };
    if (ddo_plan_budgets_get(plan, &b) == 0)
        f.budgets = &b;
    size_t n = ddo_plan_decision_count(plan);
    const char **d = ddo__calloc(2 * n + 1, sizeof(*d));
    if (d == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "metrics snapshot: out of host memory");
    for (size_t i = 0; i < n; i++) {
        const char *k = NULL, *v = NULL;
        if (ddo_plan_decision(plan, i, &k, &v) == 0) {
            d[2 * f.decision_count] = k;
            d[2 * f.decision_count + 1] = v;
            f.decision_count++;
        }
    }
    f.decisions = d;
    int rc = ddo__metrics_snapshot(m, &f, labels, label_count, out);
    free(d);
    return rc;
}

int ddo_session_metrics(ddo_session *s, bool collect_completed, ddo_metrics **out)
{
    if (s == NULL || out == NULL)
        return ddo__fail(s != NULL ? &s->err : NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_session_metrics: session and out are required");
    ddo__metrics_acc *m = &s->metrics;
    if (collect_completed && !s->unloaded) {
        ddo__mutex_lock(&s->mu);
        (void)ddo__session_reap(s);
        uint64_t n = s->retired_total - s->retired_reported;
        s->retired_reported = s->retired_total;
        ddo__mutex_unlock(&s->mu);
        ddo__metrics_add(m, DDO_M_completed_tickets, (double)n);
    }
    ddo__metrics_set(m, DDO_M_device_weights_bytes, (double)ddo__account_used(&s->acc_device));
    ddo__metrics_max(m, DDO_M_device_weights_peak_bytes, (double)ddo__account_peak(&s->acc_device));
    ddo__session_store_metrics(s, m);
    ddo__session_split_metrics(s, m);
    ddo__metrics_set(m, DDO_M_retained_bytes, (double)ddo__account_used(&s->acc_retained));
    ddo__metrics_max(m, DDO_M_retained_peak_bytes, (double)ddo__account_peak(&s->acc_retained));
    ddo__metrics_set(m, DDO_M_registered_bytes, (double)ddo__account_used(&s->acc_registered));
    ddo__metrics_max(m, DDO_M_registered_peak_bytes, (double)ddo__account_peak(&s->acc_registered));
    ddo__metrics_set(m, DDO_M_staging_bytes, (double)ddo__account_used(&s->acc_staging));
    ddo__metrics_max(m, DDO_M_staging_peak_bytes, (double)ddo__account_peak(&s->acc_staging));
    const char *labels[] = {
        "session_state",
        s->unloaded ? "unloaded" : "loaded",
        "execution_order",
        s->order.declared ? "declared"
        : s->order.known  ? "learned"
                          : "plan",
        "slot_kind",
        ddo__route_slot_kind(s->route),
        /* what file reads actually use (auto picks pread for a checkpoint in the page cache) */
        "read_engine",
        s->source == NULL                                         ? "none"
        : ddo__source_engine(s->source) == DDO__READ_ENGINE_PREAD ? "pread"
                                                                  : "io_uring",
        /* weight_codec: where the store's coded bytes came from, and what the sidecars did */
        "codec_store",
        ddo__source_codec_origin(s->source),
        "codec_sidecar_note",
        ddo__source_codec_note(s->source),
        /* coded_file: the first sidecar stream read raw instead, and why */
        "codec_stream_note",
        ddo__session_codec_stream_note(s),
    };
    int rc = snapshot_with_plan(m, s->plan, labels, DDO_ARRAY_LEN(labels) / 2, out);
    if (rc != 0)
        return ddo__fail_from_last(&s->err, rc);
    return 0;
}

const char *ddo_session_error(const ddo_session *s)
{
    return s != NULL ? s->err.msg : "";
}

/* ------------------------------------------------------------------------ */
/* Test hooks                                                                */
/* ------------------------------------------------------------------------ */

void ddo__session_accounts(ddo_session *s, uint64_t used[4])
{
    used[0] = ddo__account_used(&s->acc_device);
    used[1] = ddo__account_used(&s->acc_retained);
    used[2] = ddo__account_used(&s->acc_registered);
    used[3] = ddo__account_used(&s->acc_staging);
}

int ddo__session_unit_state(ddo_session *s, size_t unit, size_t *slot)
{
    if (unit >= s->unit_count)
        return -1;
    ddo__mutex_lock(&s->mu);
    ddo__session_reap(s);
    size_t i = s->units[unit].slot;
    int st = i == DDO__NONE ? -1 : (int)s->slots[i].state;
    ddo__mutex_unlock(&s->mu);
    if (slot != NULL)
        *slot = i;
    return st;
}

int ddo__session_slot_state(ddo_session *s, size_t slot, size_t *unit, bool *backed, bool *unsafe,
                            bool *prefetched)
{
    if (slot >= s->slot_count)
        return -1;
    ddo__mutex_lock(&s->mu);
    ddo__session_reap(s);
    ddo__slot *sl = &s->slots[slot];
    int st = (int)sl->state;
    if (unit != NULL)
        *unit = sl->unit;
    if (backed != NULL)
        *backed = sl->backed;
    if (unsafe != NULL)
        *unsafe = sl->unsafe;
    if (prefetched != NULL)
        *prefetched = sl->prefetched;
    ddo__mutex_unlock(&s->mu);
    return st;
}
