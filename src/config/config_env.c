/*
 * config_env.c - applying an environment block: the from_env operational
 * defaults, DDO_BACKEND/DDO_PRESET, every recognised DDO_* variable (set,
 * even to "", wins over the preset), the DDO_SAFETENSORS_BACKEND alias and
 * warnings for unknown DDO_* names. The block is passed in by the host; the
 * library never reads the process environment itself.
 */
#include "config/config_priv.h"
#include "os/sysinfo.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALIAS_SAFETENSORS "DDO_SAFETENSORS_BACKEND"

/* Variables that are DDO_* but not options: host, bootstrap and test-harness controls. */
static const char *const ignored_names[] = {
    "DDO_VMM_LIBRARY_PATH", "DDO_VMM_ALLOCATOR_ROOT", "DDO_VMM_TORCH_CACHE_MIB",
    "DDO_PROFILE_DIR",      "DDO_TEST_DATA",          "DDO_BIN",
    "DDO_SOURCE_DIR",       "DDO_BUILD_DIR",          NULL
};
static const char *const ignored_prefixes[] = { "DDO_RUNNER_", "DDO_PURGE_WINDOWS_STANDBY_", NULL };
/* DDO_<COMPONENT>_<suffix> component variables. */
static const char *const component_suffixes[] = { "_ROUTE",
                                                  "_GROUP_OFFLOAD",
                                                  "_DYNAMIC_OFFLOAD",
                                                  "_OFFLOAD_STREAM",
                                                  "_OFFLOAD_RECORD_STREAM",
                                                  "_OFFLOAD_TYPE",
                                                  "_OFFLOAD_LOW_CPU_MEM_USAGE",
                                                  "_NUM_BLOCKS_PER_GROUP",
                                                  NULL };

static bool is_known(const char *name)
{
    if (ddo__config_find_env(name) >= 0 || strcmp(name, ALIAS_SAFETENSORS) == 0)
        return true;
    for (size_t i = 0; ignored_names[i] != NULL; i++)
        if (strcmp(name, ignored_names[i]) == 0)
            return true;
    for (size_t i = 0; ignored_prefixes[i] != NULL; i++)
        if (strncmp(name, ignored_prefixes[i], strlen(ignored_prefixes[i])) == 0)
            return true;
    size_t n = strlen(name);
    for (size_t i = 0; component_suffixes[i] != NULL; i++) {
        size_t m = strlen(component_suffixes[i]);
        /* "DDO_" + at least one component character + suffix */
        if (n > 4 + m && strcmp(name + n - m, component_suffixes[i]) == 0)
            return true;
    }
    return false;
}

static void warn_unknown(ddo_config *cfg, const char *name)
{
    size_t best = SIZE_MAX;
    const char *near = NULL;
    for (int i = 0; i < DDO_OPT_COUNT; i++) {
        if (ddo__optdescs[i].env[0] == '\0')
            continue;
        size_t d = ddo__edit_distance(name, ddo__optdescs[i].env);
        if (d < best) {
            best = d;
            near = ddo__optdescs[i].env;
        }
    }
    char q[160];
    ddo__config_quote(name, q, sizeof(q));
    if (near != NULL && best * 4 <= strlen(name))
        ddo__config_warn(cfg, "unknown environment variable %s ignored (did you mean %s?)", q,
                         near);
    else
        ddo__config_warn(cfg, "unknown environment variable %s ignored", q);
}

/* Captures the DDO_* entries of envp into cfg->env. */
static int capture(ddo_config *cfg, const char *const *envp)
{
    ddo__kv_free(&cfg->env);
    for (size_t i = 0; envp != NULL && envp[i] != NULL; i++) {
        const char *e = envp[i];
        const char *eq = strchr(e, '=');
        if (eq == NULL || strncmp(e, "DDO_", 4) != 0)
            continue;
        char *name = ddo__strndup(e, (size_t)(eq - e));
        int rc = name == NULL ? DDO_E_NO_MEMORY : ddo__kv_set(&cfg->env, name, eq + 1);
        free(name);
        if (rc != 0)
            return ddo__fail(&cfg->err, DDO_E_NO_MEMORY, "ddo_config_apply_env: out of memory");
    }
    return 0;
}

static bool blank(const char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    return *s == '\0';
}

static int store_env(ddo_config *cfg, int id, const char *name, const char *value)
{
    char source[96];
    snprintf(source, sizeof(source), "env:%s", name);
    return ddo__config_store(cfg, id, value, DDO__RANK_ENV, source, name, true, true);
}

static int apply(ddo_config *cfg, const char *const *envp)
{
    int rc;
    static const char *const no_env[] = { NULL };
    if (!cfg->opt.use_environment)
        envp = no_env;
    if ((rc = capture(cfg, envp)) != 0)
        return rc;
    cfg->env_captured = cfg->opt.use_environment;

    /* from_env's operational defaults, below any preset. */
    double ram = (double)ddo__os_usable_ram_bytes() / (double)DDO_GIB; /* within the cgroup */
    cfg->detected_ram_gb = round(ram * 10000.0) / 10000.0;
    cfg->env_defaults = true;
    static const int env_default_ids[] = { DDO_OPT_ID_small_tensor_threshold_bytes,
                                           DDO_OPT_ID_pin_cpu_workers,
                                           DDO_OPT_ID_always_resident_modules_pattern,
                                           DDO_OPT_ID_show_profile,
                                           DDO_OPT_ID_available_system_ram_gb };
    for (size_t i = 0; i < DDO_ARRAY_LEN(env_default_ids); i++)
        if (cfg->rank[env_default_ids[i]] == DDO__RANK_DEFAULT &&
            (rc = ddo__config_reset(cfg, env_default_ids[i])) != 0)
            return rc;

    /* The route family and preset first, then everything else over the preset. */
    const ddo__kv *kv;
    if ((kv = ddo__kv_find(&cfg->env, "DDO_BACKEND")) != NULL &&
        (rc = store_env(cfg, DDO_OPT_ID_backend, kv->name, kv->value)) != 0)
        return rc;
    if ((kv = ddo__kv_find(&cfg->env, "DDO_PRESET")) != NULL &&
        (rc = store_env(cfg, DDO_OPT_ID_preset, kv->name, kv->value)) != 0)
        return rc;
    if ((rc = ddo__config_resolve(cfg)) != 0)
        return rc;
    for (int id = 0; id < DDO_OPT_COUNT; id++) {
        const char *env = ddo__optdescs[id].env;
        if (env[0] == '\0' || id == DDO_OPT_ID_backend || id == DDO_OPT_ID_preset)
            continue;
        if ((kv = ddo__kv_find(&cfg->env, env)) == NULL)
            continue;
        /* An empty DDO_AVAILABLE_SYSTEM_RAM_GB means "detect". */
        if (id == DDO_OPT_ID_available_system_ram_gb && blank(kv->value))
            continue;
        if ((rc = store_env(cfg, id, kv->name, kv->value)) != 0)
            return rc;
    }
    /* DDO_SAFETENSORS_BACKEND is used only when the canonical variable resolves empty. */
    if (cfg->opt.load_safetensors_backend[0] == '\0' &&
        (kv = ddo__kv_find(&cfg->env, ALIAS_SAFETENSORS)) != NULL &&
        (rc = store_env(cfg, DDO_OPT_ID_load_safetensors_backend, kv->name, kv->value)) != 0)
        return rc;
    if ((rc = ddo__config_resolve(cfg)) != 0)
        return rc;

    for (size_t i = 0; i < cfg->env.count; i++)
        if (!is_known(cfg->env.items[i].name))
            warn_unknown(cfg, cfg->env.items[i].name);
    return 0;
}

int ddo_config_apply_env(ddo_config *cfg, const char *const *envp)
{
    if (cfg == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_apply_env: cfg is NULL");
    ddo_config *c;
    int rc = ddo_config_clone(cfg, &c);
    if (rc != 0)
        return ddo__fail_from_last(&cfg->err, rc);
    /* Warnings describe the most recent environment block. */
    for (size_t i = 0; i < c->warnings.count; i++)
        free(c->warnings.items[i]);
    c->warnings.count = 0;
    rc = apply(c, envp);
    return ddo__config_commit(cfg, c, rc);
}
