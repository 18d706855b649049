/*
 * config_access.c - a config through the public API: typed set and get by key (unknown keys
 * answered with the nearest one; writes to the route-selecting options re-resolve the preset
 * on a copy, committed only when it succeeds), iteration over the catalog, the warnings, and
 * the settings object with the route the settings select.
 */
#include "config/config_priv.h"
#include "config/route.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Set and get                                                               */
/* ------------------------------------------------------------------------ */

int ddo__config_store_top(ddo_config *cfg, const char *key, const char *text, const char *source)
{
    int id = ddo__config_find(key);
    if (id < 0)
        return ddo__fail(NULL, DDO_E_INTERNAL, "%s: unknown option %s", source, key);
    return ddo__config_store(cfg, id, text, DDO__RANK_FLAG, source, key, false, false);
}

bool ddo__config_range(const char *key, double *lo, double *hi)
{
    int id = ddo__config_find(key);
    if (id < 0)
        return false;
    *lo = ddo__optdescs[id].lo;
    *hi = ddo__optdescs[id].hi;
    return true;
}

static int lookup(const ddo_config *cfg, const char *key, const char *fn, int *id)
{
    *id = -1;
    if (cfg == NULL || key == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "%s: NULL argument", fn);
    int i = ddo__config_find(key);
    if (i < 0) {
        /* Suggest the nearest key. */
        size_t best = SIZE_MAX;
        int bi = 0;
        for (int j = 0; j < DDO_OPT_COUNT; j++) {
            size_t dist = ddo__edit_distance(key, ddo__optdescs[j].key);
            if (dist < best) {
                best = dist;
                bi = j;
            }
        }
        return ddo__fail((ddo__errbuf *)&cfg->err, DDO_E_NOT_FOUND,
                         "%s: unknown option \"%s\" (nearest: %s)", fn, key, ddo__optdescs[bi].key);
    }
    *id = i;
    return 0;
}

/* A write through the API: preset/backend changes re-resolve the preset atomically. */
/* Stores a value set through the API at rank (the route-selecting options re-resolve). */
static int ranked_store(ddo_config *cfg, int id, const char *text, ddo__rank rank,
                        const char *source)
{
    if (id != DDO_OPT_ID_preset && id != DDO_OPT_ID_backend &&
        id != DDO_OPT_ID_vmm_total_staging_gb && id != DDO_OPT_ID_execution_mode)
        return ddo__config_store(cfg, id, text, rank, source, ddo__optdescs[id].key, false, false);
    ddo_config *c;
    int rc = ddo_config_clone(cfg, &c);
    if (rc != 0)
        return ddo__fail_from_last(&cfg->err, rc);
    rc = ddo__config_store(c, id, text, rank, source, ddo__optdescs[id].key, false, false);
    if (rc == 0)
        rc = ddo__config_resolve(c);
    return ddo__config_commit(cfg, c, rc);
}

static int api_store(ddo_config *cfg, int id, const char *text)
{
    return ranked_store(cfg, id, text, DDO__RANK_API, "api");
}

int ddo_config_override(ddo_config *cfg, const char *key, const char *value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_override", &id);
    if (rc != 0)
        return rc;
    if (value == NULL)
        return ddo__fail(&cfg->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_config_override: %s: value is NULL", key);
    return ranked_store(cfg, id, value, DDO__RANK_FLAG, "argument");
}

static int list_store(ddo_config *cfg, const char *key, const char *const *items, size_t count,
                      const char *fn, ddo__rank rank, const char *source)
{
    int id;
    int rc = lookup(cfg, key, fn, &id);
    if (rc != 0)
        return rc;
    if (items == NULL && count > 0)
        return ddo__fail(&cfg->err, DDO_E_INVALID_ARGUMENT, "%s: %s: items is NULL", fn, key);
    for (size_t i = 0; i < count; i++)
        if (items[i] == NULL)
            return ddo__fail(&cfg->err, DDO_E_INVALID_ARGUMENT, "%s: %s: item %zu is NULL", fn, key,
                             i);
    return ddo__config_store_list(cfg, id, items, count, rank, source);
}

int ddo_config_override_list(ddo_config *cfg, const char *key, const char *const *items,
                             size_t count)
{
    return list_store(cfg, key, items, count, "ddo_config_override_list", DDO__RANK_FLAG,
                      "argument");
}

int ddo_config_set_list(ddo_config *cfg, const char *key, const char *const *items, size_t count)
{
    return list_store(cfg, key, items, count, "ddo_config_set_list", DDO__RANK_API, "api");
}

int ddo_config_set(ddo_config *cfg, const char *key, const char *value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_set", &id);
    if (rc != 0)
        return rc;
    if (value == NULL)
        return ddo__fail(&cfg->err, DDO_E_INVALID_ARGUMENT, "ddo_config_set: %s: value is NULL",
                         key);
    return api_store(cfg, id, value);
}

int ddo_config_set_bool(ddo_config *cfg, const char *key, bool value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_set_bool", &id);
    if (rc != 0)
        return rc;
    if (ddo__optdescs[id].type != DDO__OT_BOOL)
        return ddo__fail(&cfg->err, DDO_E_CONFIG, "ddo_config_set_bool: %s is not a boolean", key);
    return api_store(cfg, id, value ? "true" : "false");
}

int ddo_config_set_int(ddo_config *cfg, const char *key, int64_t value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_set_int", &id);
    if (rc != 0)
        return rc;
    char buf[32];
    snprintf(buf, sizeof(buf), "%" PRId64, value);
    switch (ddo__optdescs[id].type) {
    case DDO__OT_INT:
    case DDO__OT_KB:
    case DDO__OT_GB:
    case DDO__OT_MB:
    case DDO__OT_FLOAT:
        return api_store(cfg, id, buf);
    default:
        return ddo__fail(&cfg->err, DDO_E_CONFIG, "ddo_config_set_int: %s is not numeric", key);
    }
}

int ddo_config_set_double(ddo_config *cfg, const char *key, double value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_set_double", &id);
    if (rc != 0)
        return rc;
    char buf[64];
    switch (ddo__optdescs[id].type) {
    case DDO__OT_GB:
    case DDO__OT_MB:
    case DDO__OT_FLOAT:
        if (!isfinite(value))
            return ddo__fail(&cfg->err, DDO_E_CONFIG, "%s: expected a finite number", key);
        ddo__config_fmt_double(value, buf, sizeof(buf));
        return api_store(cfg, id, buf);
    case DDO__OT_INT:
    case DDO__OT_KB:
        if (!(value == floor(value)) || fabs(value) > 9.0e18) {
            if (isfinite(value))
                ddo__config_fmt_double(value, buf, sizeof(buf));
            else
                snprintf(buf, sizeof(buf), "%s", isnan(value) ? "nan" : "inf");
            return ddo__fail(&cfg->err, DDO_E_CONFIG,
                             "%s=%s: expected a whole number within the range of the option", key,
                             buf);
        }
        snprintf(buf, sizeof(buf), "%" PRId64, (int64_t)value);
        return api_store(cfg, id, buf);
    default:
        return ddo__fail(&cfg->err, DDO_E_CONFIG, "ddo_config_set_double: %s is not numeric", key);
    }
}

int ddo_config_get(const ddo_config *cfg, const char *key, const char **value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_get", &id);
    if (rc != 0)
        return rc;
    if (value == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_get: value is NULL");
    *value = cfg->text[id];
    return 0;
}

int ddo_config_get_bool(const ddo_config *cfg, const char *key, bool *value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_get_bool", &id);
    if (rc != 0)
        return rc;
    if (ddo__optdescs[id].type != DDO__OT_BOOL || value == NULL)
        return ddo__fail((ddo__errbuf *)&cfg->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_config_get_bool: %s is not a boolean", key);
    *value = *(const bool *)ddo__config_cfield(cfg, id);
    return 0;
}

int ddo_config_get_int(const ddo_config *cfg, const char *key, int64_t *value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_get_int", &id);
    if (rc != 0)
        return rc;
    if (value == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_get_int: value is NULL");
    switch (ddo__optdescs[id].type) {
    case DDO__OT_INT:
    case DDO__OT_KB:
        *value = *(const int64_t *)ddo__config_cfield(cfg, id);
        return 0;
    case DDO__OT_BOOL:
        *value = *(const bool *)ddo__config_cfield(cfg, id) ? 1 : 0;
        return 0;
    default:
        return ddo__fail((ddo__errbuf *)&cfg->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_config_get_int: %s is not an integer", key);
    }
}

int ddo_config_get_double(const ddo_config *cfg, const char *key, double *value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_get_double", &id);
    if (rc != 0)
        return rc;
    if (value == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_get_double: value is NULL");
    switch (ddo__optdescs[id].type) {
    case DDO__OT_INT:
    case DDO__OT_KB:
        *value = (double)*(const int64_t *)ddo__config_cfield(cfg, id);
        return 0;
    case DDO__OT_GB:
    case DDO__OT_MB:
    case DDO__OT_FLOAT:
        *value = *(const double *)ddo__config_cfield(cfg, id);
        return 0;
    default:
        return ddo__fail((ddo__errbuf *)&cfg->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_config_get_double: %s is not numeric", key);
    }
}

int ddo_config_source(const ddo_config *cfg, const char *key, const char **source)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_source", &id);
    if (rc != 0)
        return rc;
    if (source == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_source: source is NULL");
    *source = cfg->source[id];
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Iteration, warnings, settings                                             */
/* ------------------------------------------------------------------------ */

size_t ddo_config_count(void)
{
    return DDO_OPT_COUNT;
}

static ddo_option_type public_type(ddo__otype t)
{
    switch (t) {
    case DDO__OT_BOOL:
        return DDO_OPTION_BOOL;
    case DDO__OT_INT:
    case DDO__OT_KB:
        return DDO_OPTION_INT;
    case DDO__OT_GB:
        return DDO_OPTION_SIZE_GB;
    case DDO__OT_MB:
        return DDO_OPTION_SIZE_MB;
    case DDO__OT_FLOAT:
        return DDO_OPTION_FLOAT;
    case DDO__OT_STRING:
        return DDO_OPTION_STRING;
    case DDO__OT_ENUM:
        return DDO_OPTION_ENUM;
    case DDO__OT_LIST:
        return DDO_OPTION_LIST;
    }
    return DDO_OPTION_STRING;
}

int ddo_config_entry(const ddo_config *cfg, size_t i, ddo_config_item *out)
{
    if (cfg == NULL || out == NULL || i >= DDO_OPT_COUNT)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_entry: index %zu of %d", i,
                         (int)DDO_OPT_COUNT);
    const ddo__optdesc *d = &ddo__optdescs[i];
    out->key = d->key;
    out->env = d->env;
    out->flag = d->flag;
    out->type = public_type(d->type);
    out->value = cfg->text[i];
    out->source = cfg->source[i];
    out->help = d->help;
    return 0;
}

size_t ddo_config_warning_count(const ddo_config *cfg)
{
    return cfg != NULL ? cfg->warnings.count : 0;
}

const char *ddo_config_warning(const ddo_config *cfg, size_t i)
{
    if (cfg == NULL || i >= cfg->warnings.count)
        return NULL;
    return cfg->warnings.items[i];
}

void ddo_config_set_running_on_wsl(ddo_config *cfg, bool running_on_wsl)
{
    if (cfg != NULL)
        cfg->running_on_wsl = running_on_wsl;
}

/* The route the settings select (docs/options.md, "Routes"). */
static const char *route_of(const ddo_config *cfg)
{
    ddo__route r = DDO__ROUTE_LINEAR;
    bool runtime = ddo__route_lookup(cfg->opt.execution_mode, &r);
    if (runtime && ddo__route_maps(r))
        return ddo__route_name(r);
    if (cfg->effective_preset[0] != '\0')
        return cfg->effective_preset;
    if (runtime)
        return ddo__route_name(r);
    return cfg->opt.plan ? "plan" : "off";
}

int ddo_config_settings(const ddo_config *cfg, ddo_settings *out)
{
    if (cfg == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_settings: NULL argument");
    ddo_settings s;
    s.requested_preset = cfg->opt.preset;
    s.effective_preset = cfg->effective_preset;
    s.backend = cfg->opt.backend;
    s.route = route_of(cfg);
    s.plan = cfg->opt.plan;
    s.enabled = cfg->opt.plan || strcmp(cfg->opt.execution_mode, "plan") != 0;
    s.requested_pin_cpu_memory = cfg->opt.pin_cpu_memory;
    s.disable_pin_on_wsl = cfg->opt.disable_pin_on_wsl;
    s.running_on_wsl = cfg->running_on_wsl;
    s.effective_pin_cpu_memory =
        cfg->opt.pin_cpu_memory && !(cfg->running_on_wsl && cfg->opt.disable_pin_on_wsl);
    *out = s;
    return 0;
}
