/*
 * presets.c - the preset table (presets.def) and how a requested preset
 * resolves for a route family: "auto" is one_shot_fast on linear (every
 * platform) and vmm_fast_runtime on vmm; native VMM presets exist only on
 * the vmm backend and linear presets only on linear.
 */
#include "config/config_priv.h"
#include "config/route.h"

#include <stdlib.h>
#include <string.h>

typedef struct preset_name {
    const char *name;
    const char *backend;
    const char *intent;
} preset_name;

static const preset_name preset_names[] = {
#define DDO_PRESET(name, backend, intent) { #name, #backend, intent },
#define DDO_PRESET_VALUE(name, var, value)
#include "config/presets.def"
#undef DDO_PRESET
#undef DDO_PRESET_VALUE
};

static const ddo__preset_row preset_rows[] = {
#define DDO_PRESET(name, backend, intent)
#define DDO_PRESET_VALUE(name, var, value) { #name, var, value },
#include "config/presets.def"
#undef DDO_PRESET
#undef DDO_PRESET_VALUE
};

size_t ddo__preset_row_count(void)
{
    return DDO_ARRAY_LEN(preset_rows);
}

const ddo__preset_row *ddo__preset_row_at(size_t i)
{
    return i < DDO_ARRAY_LEN(preset_rows) ? &preset_rows[i] : NULL;
}

size_t ddo__preset_name_count(void)
{
    return DDO_ARRAY_LEN(preset_names);
}

void ddo__preset_name_at(size_t i, const char **name, const char **backend, const char **intent)
{
    *name = preset_names[i].name;
    *backend = preset_names[i].backend;
    *intent = preset_names[i].intent;
}

const char *ddo__preset_value(const char *preset, const char *var)
{
    if (preset == NULL || preset[0] == '\0')
        return NULL;
    for (size_t i = 0; i < DDO_ARRAY_LEN(preset_rows); i++)
        if (strcmp(preset_rows[i].preset, preset) == 0 && strcmp(preset_rows[i].var, var) == 0)
            return preset_rows[i].value;
    return NULL;
}

static const preset_name *find_name(const char *name)
{
    for (size_t i = 0; i < DDO_ARRAY_LEN(preset_names); i++)
        if (strcmp(preset_names[i].name, name) == 0)
            return &preset_names[i];
    return NULL;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "auto, a, b, ..." : auto, then the backend's requestable presets sorted. */
static void valid_list(const char *backend, char *buf, size_t len)
{
    const char *names[DDO_ARRAY_LEN(preset_names)];
    size_t n = 0;
    for (size_t i = 0; i < DDO_ARRAY_LEN(preset_names); i++)
        if (strcmp(preset_names[i].backend, backend) == 0 &&
            strcmp(preset_names[i].name, "vmm_fast_runtime") != 0)
            names[n++] = preset_names[i].name;
    qsort(names, n, sizeof(names[0]), cmp_str);
    size_t o = (size_t)snprintf(buf, len, "auto");
    for (size_t i = 0; i < n && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, ", %s", names[i]);
}

int ddo__preset_resolve(ddo__errbuf *eb, const char *backend, const char *requested,
                        const char **effective)
{
    char lin[256], vmm[128];
    bool is_vmm = backend != NULL && strcmp(backend, "vmm") == 0;
    char *req = ddo__config_trim_lower(requested != NULL ? requested : "");
    if (req == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "DDO_PRESET: out of memory");
    int rc = 0;
    const char *eff = NULL;
    if (req[0] == '\0') {
        eff = "";
    } else if (strcmp(req, "auto") == 0) {
        eff = is_vmm ? "vmm_fast_runtime" : "one_shot_fast";
    } else {
        const preset_name *p = find_name(req);
        char q[160];
        ddo__config_quote(req, q, sizeof(q));
        valid_list("linear", lin, sizeof(lin));
        valid_list("vmm", vmm, sizeof(vmm));
        if (p == NULL) {
            rc = ddo__fail(eb, DDO_E_CONFIG,
                           "Invalid DDO_PRESET='%s'. Valid presets: %s (backend linear); %s "
                           "(backend vmm)",
                           q, lin, vmm);
        } else if (strcmp(p->backend, "vmm") == 0 && !is_vmm) {
            rc = ddo__fail(eb, DDO_E_CONFIG,
                           "DDO_PRESET='%s' is a native VMM preset and needs DDO_BACKEND=vmm "
                           "(--ddo-backend vmm); native VMM is never chosen silently. Backend "
                           "linear presets: %s",
                           q, lin);
        } else if (strcmp(p->backend, "linear") == 0 && is_vmm) {
            rc = ddo__fail(eb, DDO_E_CONFIG,
                           "DDO_PRESET='%s' is a linear preset but DDO_BACKEND=vmm. Backend vmm "
                           "presets: %s",
                           q, vmm);
        } else {
            eff = p->name;
        }
    }
    free(req);
    if (rc != 0)
        return rc;
    *effective = eff;
    return 0;
}

/* --ddo-vmm-total-staging-gb: two NVMe slots on vmm_runtime, native total on vmm_fast_runtime. */
static int translate_staging(ddo_config *cfg)
{
    double total = cfg->opt.vmm_total_staging_gb;
    int t = DDO_OPT_ID_vmm_total_staging_gb, s = DDO_OPT_ID_vmm_staging_buffer_gb;
    /* An explicit staging buffer of the same or a higher rank wins. */
    if (!(total > 0.0) || cfg->rank[s] > cfg->rank[t] ||
        (cfg->rank[s] == cfg->rank[t] && cfg->rank[s] != DDO__RANK_DEFAULT &&
         !cfg->staging_translated))
        return 0;
    double v;
    ddo__route route = DDO__ROUTE_LINEAR;
    if (!ddo__route_lookup(cfg->opt.execution_mode, &route) || !ddo__route_maps(route))
        return 0;
    v = ddo__route_per_weight(route) ? total / 2.0 : total;
    char buf[64];
    ddo__config_fmt_double(v, buf, sizeof(buf));
    char *src = ddo__strdup(cfg->source[t]);
    if (src == NULL)
        return ddo__fail(&cfg->err, DDO_E_NO_MEMORY, "vmm_total_staging_gb: out of memory");
    int rc = ddo__config_store(cfg, s, buf, (ddo__rank)cfg->rank[t], src, "vmm_total_staging_gb",
                               false, false);
    free(src);
    if (rc == 0)
        cfg->staging_translated = true;
    return rc;
}

int ddo__config_resolve(ddo_config *cfg)
{
    const char *eff;
    int rc = ddo__preset_resolve(&cfg->err, cfg->opt.backend, cfg->opt.preset, &eff);
    if (rc != 0)
        return rc;
    for (int i = 0; i < DDO_OPT_COUNT; i++)
        if (cfg->rank[i] == DDO__RANK_PRESET && (rc = ddo__config_reset(cfg, i)) != 0)
            return rc;
    char source[96];
    snprintf(source, sizeof(source), "preset:%s", eff);
    for (size_t i = 0; i < DDO_ARRAY_LEN(preset_rows) && eff[0] != '\0'; i++) {
        if (strcmp(preset_rows[i].preset, eff) != 0)
            continue;
        int id = ddo__config_find_env(preset_rows[i].var);
        if (id < 0)
            continue;
        rc = ddo__config_store(cfg, id, preset_rows[i].value, DDO__RANK_PRESET, source,
                               preset_rows[i].var, true, true);
        if (rc != 0)
            return rc;
    }
    char *e = ddo__strdup(eff);
    if (e == NULL)
        return ddo__fail(&cfg->err, DDO_E_NO_MEMORY, "DDO_PRESET: out of memory");
    free(cfg->effective_preset);
    cfg->effective_preset = e;
    return translate_staging(cfg);
}

int ddo_config_apply_preset(ddo_config *cfg, const char *backend, const char *preset)
{
    if (cfg == NULL || preset == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_apply_preset: NULL argument");
    ddo_config *c;
    int rc = ddo_config_clone(cfg, &c);
    if (rc != 0)
        return ddo__fail_from_last(&cfg->err, rc);
    rc = ddo__config_store(c, DDO_OPT_ID_backend, backend != NULL ? backend : "linear",
                           DDO__RANK_API, "api", "backend", false, false);
    if (rc == 0)
        rc = ddo__config_store(c, DDO_OPT_ID_preset, preset, DDO__RANK_API, "api", "preset", false,
                               false);
    if (rc == 0)
        rc = ddo__config_resolve(c);
    return ddo__config_commit(cfg, c, rc);
}
