/*
 * components.c - per-component routes (text_encoder, transformer, vae, ...):
 * API policies, DDO_<COMPONENT>_* and the DDO_RUNNER_<COMPONENT>_* alias,
 * preset component data, the routing decision of enable_offload
 * (docs/options.md, "Component routes") and the VAE rule (explicit host
 * overrides bypass a preset's VAE route).
 */
#include "config/config_priv.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const component_options[] = { "route",
                                                 "group_offload",
                                                 "dynamic_offload",
                                                 "offload_stream",
                                                 "offload_record_stream",
                                                 "offload_type",
                                                 "offload_low_cpu_mem_usage",
                                                 "num_blocks_per_group",
                                                 NULL };

/* Uppercase; runs of characters outside [A-Z0-9] become one '_'; trimmed; "" -> MODEL. */
static void normalize_component(const char *component, char *buf, size_t len)
{
    size_t o = 0;
    bool pending = false;
    for (const char *p = component != NULL ? component : ""; *p != '\0'; p++) {
        char c = (char)toupper((unsigned char)*p);
        bool ok = (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!ok) {
            pending = o > 0;
            continue;
        }
        if (pending && o + 1 < len)
            buf[o++] = '_';
        pending = false;
        if (o + 1 < len)
            buf[o++] = c;
    }
    buf[o] = '\0';
    if (o == 0)
        snprintf(buf, len, "MODEL");
}

/* Lowercase with '-' as '_'; -1 unless it names a component option. */
static int normalize_option(const char *option, char *buf, size_t len)
{
    size_t o = 0;
    for (const char *p = option; *p != '\0' && o + 1 < len; p++)
        buf[o++] = *p == '-' ? '_' : (char)tolower((unsigned char)*p);
    buf[o] = '\0';
    for (size_t i = 0; component_options[i] != NULL; i++)
        if (strcmp(buf, component_options[i]) == 0)
            return 0;
    return -1;
}

static void upper(char *s)
{
    for (; *s != '\0'; s++)
        *s = (char)toupper((unsigned char)*s);
}

int ddo_config_set_component_policy(ddo_config *cfg, const char *component, const char *option,
                                    const char *value)
{
    if (cfg == NULL || option == NULL || value == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_config_set_component_policy: NULL argument");
    char comp[96], opt[64], key[170], q[128];
    normalize_component(component, comp, sizeof(comp));
    if (normalize_option(option, opt, sizeof(opt)) != 0)
        return ddo__fail(&cfg->err, DDO_E_NOT_FOUND,
                         "component %s: unknown policy option \"%s\" (route, group_offload, "
                         "dynamic_offload, offload_stream, offload_record_stream, offload_type, "
                         "offload_low_cpu_mem_usage, num_blocks_per_group)",
                         comp, (ddo__quote(option, true, q, sizeof(q)), q));
    snprintf(key, sizeof(key), "%s/%s", comp, opt);
    if (ddo__kv_set(&cfg->policies, key, value) != 0)
        return ddo__fail(&cfg->err, DDO_E_NO_MEMORY, "component %s: out of memory", comp);
    return 0;
}

/* env-then-preset for one variable name; NULL when neither has it. */
static const char *env_or_preset(const ddo_config *cfg, const char *var, char *source, size_t len)
{
    if (cfg->env_captured && cfg->opt.use_environment) {
        const ddo__kv *kv = ddo__kv_find(&cfg->env, var);
        if (kv != NULL) {
            if (source != NULL)
                snprintf(source, len, "env:%s", var);
            return kv->value;
        }
    }
    const char *v = ddo__preset_value(cfg->effective_preset, var);
    if (v != NULL && source != NULL)
        snprintf(source, len, "preset:%s", cfg->effective_preset);
    return v;
}

static const char *lookup(const ddo_config *cfg, const char *comp, const char *opt, char *source,
                          size_t len)
{
    char key[170], var[200], uopt[64];
    snprintf(key, sizeof(key), "%s/%s", comp, opt);
    const ddo__kv *kv = ddo__kv_find(&cfg->policies, key);
    if (kv != NULL) {
        if (source != NULL)
            snprintf(source, len, "api");
        return kv->value;
    }
    snprintf(uopt, sizeof(uopt), "%s", opt);
    upper(uopt);
    snprintf(var, sizeof(var), "DDO_%s_%s", comp, uopt);
    const char *v = env_or_preset(cfg, var, source, len);
    if (v != NULL && v[0] != '\0')
        return v;
    snprintf(var, sizeof(var), "DDO_RUNNER_%s_%s", comp, uopt);
    v = env_or_preset(cfg, var, source, len);
    if (v != NULL && v[0] != '\0')
        return v;
    return NULL;
}

int ddo_config_component_value(const ddo_config *cfg, const char *component, const char *option,
                               const char **value, char *source, size_t source_len)
{
    if (cfg == NULL || option == NULL || value == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_component_value: NULL argument");
    char comp[96], opt[64], src[208]; /* "env:" and a variable of up to 199 */
    normalize_component(component, comp, sizeof(comp));
    if (normalize_option(option, opt, sizeof(opt)) != 0)
        return ddo__fail(NULL, DDO_E_NOT_FOUND, "component %s: unknown policy option \"%s\"", comp,
                         option);
    const char *v = lookup(cfg, comp, opt, src, sizeof(src));
    if (v == NULL)
        return ddo__fail(NULL, DDO_E_NOT_FOUND, "component %s: %s is not set", comp, opt);
    if (source != NULL && source_len > 0)
        snprintf(source, source_len, "%s", src);
    *value = v;
    return 0;
}

/* Canonical route for a word (aliases included), or NULL. */
static const char *canonical_route(const char *word)
{
    static const struct {
        const char *word, *route;
    } routes[] = {
        { "auto", "auto" },
        { "dynamic_offload", "dynamic_offload" },
        { "dynamic", "dynamic_offload" },
        { "ddo", "dynamic_offload" },
        { "diffusers_group_offload", "diffusers_group_offload" },
        { "diffusers", "diffusers_group_offload" },
        { "diffusers_group", "diffusers_group_offload" },
        { "group", "diffusers_group_offload" },
        { "group_offload", "diffusers_group_offload" },
        { "none", "none" },
        { "cuda", "none" },
        { "standard", "none" },
        { "off", "none" },
    };
    char *w = ddo__config_trim_lower(word);
    const char *r = NULL;
    for (size_t i = 0; w != NULL && i < DDO_ARRAY_LEN(routes); i++)
        if (strcmp(w, routes[i].word) == 0)
            r = routes[i].route;
    free(w);
    return r;
}

static bool value_bool(const ddo_config *cfg, const char *comp, const char *opt, const char *def)
{
    const char *v = lookup(cfg, comp, opt, NULL, 0);
    return ddo__config_env_bool(v != NULL ? v : def);
}

/* The route word for comp (argument > settings > "auto"); records its source in p. */
static const char *route_word(const ddo_config *cfg, const char *comp, const char *explicit_route,
                              ddo_component_policy *p)
{
    if (explicit_route != NULL) {
        snprintf(p->route_source, sizeof(p->route_source), "argument");
        return explicit_route;
    }
    const char *word = lookup(cfg, comp, "route", p->route_source, sizeof(p->route_source));
    if (word == NULL) {
        word = "auto";
        snprintf(p->route_source, sizeof(p->route_source), "default");
    }
    return word;
}

/* The settings are enabled (ddo_config_settings): a plan, or an execution mode other than plan. */
static bool settings_enabled(const ddo_config *cfg)
{
    return cfg->opt.plan || strcmp(cfg->opt.execution_mode, "plan") != 0;
}

/* Resolves the "auto" route of comp from its settings; records the reason in p. */
static const char *auto_route(const ddo_config *cfg, const char *comp, bool quantized_backend,
                              ddo_component_policy *p)
{
    char gsrc[96] = "", dsrc[96] = "";
    const char *gv = lookup(cfg, comp, "group_offload", gsrc, sizeof(gsrc));
    const char *dv = lookup(cfg, comp, "dynamic_offload", dsrc, sizeof(dsrc));
    bool group = ddo__config_env_bool(gv != NULL ? gv : "0");
    bool dynamic = dv != NULL ? ddo__config_env_bool(dv) : settings_enabled(cfg);
    if (group || (quantized_backend && dynamic)) {
        snprintf(p->route_source, sizeof(p->route_source), "auto: %s",
                 group ? gsrc : "quantized backend");
        return "diffusers_group_offload";
    }
    if (dynamic) {
        snprintf(p->route_source, sizeof(p->route_source), "auto: %s",
                 dv != NULL ? dsrc : "settings enabled");
        return "dynamic_offload";
    }
    snprintf(p->route_source, sizeof(p->route_source), "auto: %s",
             dv != NULL ? dsrc : "settings disabled");
    return "none";
}

/* The diffusers group-offload settings of comp (offload_type, num_blocks_per_group) into p. */
static int group_policy(const ddo_config *cfg, ddo__errbuf *eb, const char *comp,
                        ddo_component_policy *p)
{
    char q[128];
    const char *t = lookup(cfg, comp, "offload_type", NULL, 0);
    if (t != NULL) {
        if (strcmp(t, "block_level") == 0)
            p->offload_type = "block_level";
        else if (strcmp(t, "leaf_level") != 0)
            return ddo__fail(eb, DDO_E_CONFIG,
                             "component %s: offload_type \"%s\": expected leaf_level or "
                             "block_level",
                             comp, (ddo__quote(t, true, q, sizeof(q)), q));
    }
    const char *nb = lookup(cfg, comp, "num_blocks_per_group", NULL, 0);
    if (nb != NULL) {
        /* Upstream's int(): surrounding spaces allowed, then decimal digits and nothing else. */
        char digits[32];
        size_t a = strspn(nb, " \t"), n = strlen(nb + a);
        while (n > 0 && (nb[a + n - 1] == ' ' || nb[a + n - 1] == '\t'))
            n--;
        long long v = 0;
        bool ok = n > 0 && n < sizeof(digits);
        if (ok) {
            memcpy(digits, nb + a, n);
            digits[n] = '\0';
            errno = 0;
            ok = ddo__decimal_syntax(digits, true) && (v = strtoll(digits, NULL, 10)) >= 1 &&
                 errno == 0;
        }
        if (!ok)
            return ddo__fail(eb, DDO_E_CONFIG,
                             "component %s: num_blocks_per_group \"%s\": expected an integer "
                             ">= 1",
                             comp, (ddo__quote(nb, true, q, sizeof(q)), q));
        p->num_blocks_per_group = (int64_t)v;
    }
    p->unit_granularity = strcmp(p->offload_type, "block_level") == 0 ? "block" : "leaf";
    return 0;
}

/* The policy of the normalised component comp (ddo_config_component_policy). */
static int resolve_policy(const ddo_config *cfg, const char *comp, const char *explicit_route,
                          bool quantized_backend, ddo_component_policy *out)
{
    ddo__errbuf *eb = (ddo__errbuf *)&cfg->err;
    char q[128];
    ddo_component_policy p;
    memset(&p, 0, sizeof(p));
    const char *word = route_word(cfg, comp, explicit_route, &p);
    const char *route = canonical_route(word);
    if (route == NULL)
        return ddo__fail(eb, DDO_E_CONFIG,
                         "component %s: route \"%s\" (%s): expected auto, dynamic_offload, "
                         "diffusers_group_offload or none (aliases: dynamic, ddo; diffusers, "
                         "diffusers_group, group, group_offload; cuda, standard, off)",
                         comp, (ddo__quote(word, true, q, sizeof(q)), q), p.route_source);
    if (strcmp(route, "auto") == 0)
        route = auto_route(cfg, comp, quantized_backend, &p);
    if (strcmp(route, "dynamic_offload") != 0 && cfg->opt.build_profile)
        return ddo__fail(eb, DDO_E_CONFIG,
                         "component %s: Profile calibration requires the dynamic_offload route "
                         "(build_profile=true, route %s)",
                         comp, route);
    p.route = route;
    p.offload_type = "leaf_level";
    p.use_stream = value_bool(cfg, comp, "offload_stream", "1");
    p.record_stream = value_bool(cfg, comp, "offload_record_stream", "0");
    if (cfg->running_on_wsl && cfg->opt.disable_pin_on_wsl && p.use_stream) {
        p.use_stream = false;
        p.record_stream = false;
    }
    p.low_cpu_mem_usage = value_bool(cfg, comp, "offload_low_cpu_mem_usage", "1");
    p.num_blocks_per_group = 1;
    if (strcmp(route, "diffusers_group_offload") == 0) {
        int rc = group_policy(cfg, eb, comp, &p);
        if (rc != 0)
            return rc;
    } else if (strcmp(route, "dynamic_offload") == 0) {
        p.unit_granularity = cfg->opt.unit_granularity;
    } else {
        p.unit_granularity = "";
    }
    *out = p;
    return 0;
}

int ddo_config_component_policy(const ddo_config *cfg, const char *component,
                                const char *explicit_route, bool quantized_backend,
                                ddo_component_policy *out)
{
    if (cfg == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_config_component_policy: NULL argument");
    char comp[96];
    normalize_component(component, comp, sizeof(comp));
    return resolve_policy(cfg, comp, explicit_route, quantized_backend, out);
}

int ddo_config_component_policy_with_overrides(const ddo_config *cfg, const char *component,
                                               const char *explicit_route, bool quantized_backend,
                                               bool overrides_given, ddo_component_policy *out)
{
    if (cfg == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_config_component_policy_with_overrides: NULL argument");
    char comp[96];
    normalize_component(component, comp, sizeof(comp));
    ddo_component_policy p;
    int rc = resolve_policy(cfg, comp, explicit_route, quantized_backend, &p);
    if (rc != 0)
        return rc;
    /* The VAE policy: a host's explicit config or overrides bypass the preset's VAE
     * route (it is not silently replaced with leaf offload); the VAE then routes as it would
     * without that preset entry. A route from the environment or an API policy stays. */
    if (overrides_given && explicit_route == NULL && strcmp(comp, "VAE") == 0 &&
        strstr(p.route_source, "preset:") != NULL) {
        const char *fallback = settings_enabled(cfg) ? "dynamic_offload" : "none";
        rc = resolve_policy(cfg, comp, fallback, quantized_backend, &p);
        if (rc != 0)
            return rc;
        snprintf(p.route_source, sizeof(p.route_source),
                 "explicit config/overrides bypass the preset's VAE route");
    }
    *out = p;
    return 0;
}

int ddo__config_component_route(const ddo_config *cfg, const char *component, const char **route)
{
    ddo_component_policy p;
    int rc = ddo_config_component_policy(cfg, component, NULL, false, &p);
    if (rc != 0)
        return rc;
    if (route == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo__config_component_route: NULL route");
    *route = p.route;
    return 0;
}
