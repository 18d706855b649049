/*
 * config_validate.c - ddo_config_validate: the upstream normalisation (clamped values), every
 * numeric option within its catalog range (also the planner's defence in depth,
 * ddo__config_check_ranges), then the cross-option rules: the devices and the route family,
 * the options that need the native fast route, registration within the retained storage,
 * the legacy micro-cache's pair and a profile's name.
 */
#include "config/config_priv.h"
#include "config/route.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define V(id) cfg->text[DDO_OPT_ID_##id], cfg->source[DDO_OPT_ID_##id]
/* A text value quoted for a one-line message (into the caller's q), and its source. */
#define QV(id) \
    (ddo__config_quote(cfg->text[DDO_OPT_ID_##id], q, sizeof(q)), q), cfg->source[DDO_OPT_ID_##id]

static double num_value(const ddo_config *cfg, int id)
{
    switch (ddo__optdescs[id].type) {
    case DDO__OT_INT:
    case DDO__OT_KB:
        return (double)*(const int64_t *)ddo__config_cfield(cfg, id);
    default:
        return *(const double *)ddo__config_cfield(cfg, id);
    }
}

static bool is_numeric(ddo__otype t)
{
    return t == DDO__OT_INT || t == DDO__OT_KB || t == DDO__OT_GB || t == DDO__OT_MB ||
           t == DDO__OT_FLOAT;
}

/* Rewrites a clamped number's text (the source stays). */
static int clamp_to(ddo_config *cfg, int id, double v)
{
    char buf[64];
    if (ddo__optdescs[id].type == DDO__OT_INT || ddo__optdescs[id].type == DDO__OT_KB) {
        *(int64_t *)ddo__config_field(cfg, id) = (int64_t)v;
        snprintf(buf, sizeof(buf), "%" PRId64, (int64_t)v);
    } else {
        *(double *)ddo__config_field(cfg, id) = v;
        ddo__config_fmt_double(v, buf, sizeof(buf));
    }
    char *t = ddo__strdup(buf);
    if (t == NULL)
        return ddo__fail(&cfg->err, DDO_E_NO_MEMORY, "ddo_config_validate: out of memory");
    free(cfg->text[id]);
    cfg->text[id] = t;
    return 0;
}

int ddo__config_check_ranges(const ddo_config *cfg)
{
    for (int i = 0; i < DDO_OPT_COUNT; i++) {
        const ddo__optdesc *d = &ddo__optdescs[i];
        if (!is_numeric(d->type))
            continue;
        double v = num_value(cfg, i);
        if (i == DDO_OPT_ID_pin_weight_budget_ratio
                ? isfinite(v)
                : (v >= d->lo || ddo__config_clamped_below(i)) && v <= d->hi)
            continue;
        char a[64], b[64], t[64];
        ddo__config_fmt_double(d->lo, a, sizeof(a));
        ddo__config_fmt_double(d->hi, b, sizeof(b));
        if (isfinite(v))
            ddo__config_fmt_double(v, t, sizeof(t));
        else
            snprintf(t, sizeof(t), "%s", isnan(v) ? "nan" : "inf");
        return ddo__fail(NULL, DDO_E_CONFIG, "%s=%s (%s): expected a value in %s..%s", d->key, t,
                         cfg->source[i], a, b);
    }
    return 0;
}

static int check_rules(ddo_config *cfg);

int ddo_config_validate(ddo_config *cfg)
{
    if (cfg == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_validate: cfg is NULL");
    const ddo__options *o = &cfg->opt;
    int rc;

    /* Normalisation first: the ratio is clamped to 0..1, worker counts to >= 1. */
    if (o->pin_weight_budget_ratio < 0.0 || o->pin_weight_budget_ratio > 1.0) {
        rc = clamp_to(cfg, DDO_OPT_ID_pin_weight_budget_ratio,
                      o->pin_weight_budget_ratio < 0.0 ? 0.0 : 1.0);
        if (rc != 0)
            return rc;
    }
    if (o->pin_cpu_workers < 1 && (rc = clamp_to(cfg, DDO_OPT_ID_pin_cpu_workers, 1)) != 0)
        return rc;

    if ((rc = ddo__config_check_ranges(cfg)) != 0)
        return ddo__fail_from_last(&cfg->err, rc);
    return check_rules(cfg);
}

/* The devices and the route family. */
static int check_route(ddo_config *cfg)
{
    const ddo__options *o = &cfg->opt;
    char q[160];
    if (!ddo__device_spec_parse(o->execution_device, NULL))
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "execution_device=\"%s\" (%s): " DDO__DEVICE_SPEC_UNKNOWN,
                         QV(execution_device));
    for (size_t i = 0; i < o->devices.count; i++)
        if (!ddo__device_spec_parse(o->devices.items[i], NULL))
            return ddo__fail(&cfg->err, DDO_E_CONFIG,
                             "devices=%s (%s): \"%s\": " DDO__DEVICE_SPEC_UNKNOWN, V(devices),
                             (ddo__config_quote(o->devices.items[i], q, sizeof(q)), q));
    if (o->devices.count > 0 && strcmp(cfg->source[DDO_OPT_ID_execution_device], "default") != 0 &&
        strcmp(o->execution_device, o->devices.items[0]) != 0)
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "devices=%s (%s) computes on its first device, but execution_device=%s "
                         "(%s): name the computing device first, or leave execution_device out",
                         V(devices), V(execution_device));
    if (strcmp(o->offload_device, "cpu") != 0)
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "offload_device=\"%s\" (%s): expected cpu (inactive weights are kept in "
                         "host memory)",
                         QV(offload_device));

    bool is_vmm_backend = strcmp(o->backend, "vmm") == 0;
    ddo__route route = DDO__ROUTE_LINEAR;
    bool runtime = ddo__route_lookup(o->execution_mode, &route);
    if (runtime && ddo__route_maps(route) && !is_vmm_backend)
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "execution_mode=%s (%s) needs backend=vmm, but backend=%s (%s): native "
                         "VMM is never chosen silently; pass --ddo-backend vmm",
                         V(execution_mode), V(backend));
    if (is_vmm_backend && runtime && !ddo__route_maps(route))
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "execution_mode=%s (%s) conflicts with backend=vmm (%s): the vmm backend "
                         "runs vmm_fast_runtime, vmm_runtime or plan",
                         V(execution_mode), cfg->source[DDO_OPT_ID_backend]);
    if (runtime && ddo__route_per_weight(route) && !(o->vmm_resident_weight_budget_gb > 0.0) &&
        !(o->device_budget_gb > 0.0))
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "vmm_resident_weight_budget_gb=%s (%s): execution_mode=vmm_runtime (%s) "
                         "needs a positive mapped weight budget in GiB",
                         V(vmm_resident_weight_budget_gb), cfg->source[DDO_OPT_ID_execution_mode]);
    return 0;
}

/* The cross-option rules (after the numbers are known to be in range). */
static int check_rules(ddo_config *cfg)
{
    int rc = check_route(cfg);
    if (rc != 0)
        return rc;
    const ddo__options *o = &cfg->opt;
    ddo__route route = DDO__ROUTE_LINEAR;
    bool mode_vmm_fast =
        ddo__route_lookup(o->execution_mode, &route) && route == DDO__ROUTE_VMM_FAST;
    if (o->vmm_execution_backing_reclaim && !mode_vmm_fast)
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "vmm_execution_backing_reclaim=true (%s) needs the native fast route "
                         "(execution_mode=vmm_fast_runtime), but execution_mode=%s (%s)",
                         cfg->source[DDO_OPT_ID_vmm_execution_backing_reclaim], V(execution_mode));
    if (o->vmm_component_tensor_ownership && !mode_vmm_fast)
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "vmm_component_tensor_ownership=true (%s) needs the native fast route "
                         "(execution_mode=vmm_fast_runtime), but execution_mode=%s (%s)",
                         cfg->source[DDO_OPT_ID_vmm_component_tensor_ownership], V(execution_mode));
    if (o->vmm_source_registered_gb > 0.0) {
        if (o->vmm_source_registered_gb > o->vmm_source_cache_gb)
            return ddo__fail(&cfg->err, DDO_E_CONFIG,
                             "vmm_source_registered_gb=%s (%s) exceeds vmm_source_cache_gb=%s "
                             "(%s): registration must fit within the retained storage",
                             V(vmm_source_registered_gb), V(vmm_source_cache_gb));
        double segments = o->vmm_source_registered_gb * 16.0; /* 64 MiB = 1/16 GiB */
        if (fabs(segments - round(segments)) > 1e-9)
            return ddo__fail(&cfg->err, DDO_E_CONFIG,
                             "vmm_source_registered_gb=%s (%s): explicit registration must be "
                             "whole 64 MiB segments (a multiple of 0.0625 GiB)",
                             V(vmm_source_registered_gb));
    }
    if ((o->vmm_native_source_cache_slots > 0) != (o->vmm_native_source_cache_slot_mb > 0.0))
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "vmm_native_source_cache_slots=%s (%s) and "
                         "vmm_native_source_cache_slot_mb=%s (%s): the legacy micro-cache takes a "
                         "slot count and a slot size together (both 0 keeps it off)",
                         V(vmm_native_source_cache_slots), V(vmm_native_source_cache_slot_mb));
    if (o->build_profile && o->profile_name[0] == '\0')
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "build_profile=true (%s) needs profile_name: a calibration is saved "
                         "under a workload name",
                         cfg->source[DDO_OPT_ID_build_profile]);
    return 0;
}
