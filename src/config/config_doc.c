/*
 * config_doc.c - the configuration as JSON (`ddo config --json`), and the
 * catalog, presets, routes and resolution rules as text (`ddo config --list`)
 * and Markdown (docs/options.md is this file's output).
 */
#include "config/config_priv.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Components always shown in JSON (plus any named by an API policy). */
static const char *const shown_components[] = { "text_encoder", "transformer", "vae" };

static json_t *option_value(const ddo_config *cfg, int id)
{
    const ddo__options *o = ddo__config_options(cfg);
    const void *f = (const char *)o + ddo__optdescs[id].offset;
    switch (ddo__optdescs[id].type) {
    case DDO__OT_BOOL:
        return json_boolean(*(const bool *)f);
    case DDO__OT_INT:
    case DDO__OT_KB:
        return json_integer((json_int_t) * (const int64_t *)f);
    case DDO__OT_GB:
    case DDO__OT_MB:
    case DDO__OT_FLOAT:
        return json_real(*(const double *)f);
    case DDO__OT_STRING:
    case DDO__OT_ENUM:
        return json_string(*(char *const *)f);
    case DDO__OT_LIST: {
        const ddo__strlist *l = f;
        json_t *a = json_array();
        for (size_t i = 0; a != NULL && i < l->count; i++)
            json_array_append_new(a, json_string(l->items[i]));
        return a;
    }
    }
    return json_null();
}

static json_t *component_json(const ddo_config *cfg, const char *name)
{
    ddo_component_policy p;
    json_t *o = json_object();
    if (ddo_config_component_policy(cfg, name, NULL, false, &p) != 0) {
        json_object_set_new(o, "error", json_string(ddo_last_error()));
        return o;
    }
    json_object_set_new(o, "route", json_string(p.route));
    json_object_set_new(o, "route_source", json_string(p.route_source));
    json_object_set_new(o, "unit_granularity", json_string(p.unit_granularity));
    if (strcmp(p.route, "diffusers_group_offload") == 0) {
        json_object_set_new(o, "offload_type", json_string(p.offload_type));
        json_object_set_new(o, "use_stream", json_boolean(p.use_stream));
        json_object_set_new(o, "record_stream", json_boolean(p.record_stream));
        json_object_set_new(o, "low_cpu_mem_usage", json_boolean(p.low_cpu_mem_usage));
        if (strcmp(p.offload_type, "block_level") == 0)
            json_object_set_new(o, "num_blocks_per_group",
                                json_integer((json_int_t)p.num_blocks_per_group));
    }
    return o;
}

int ddo_config_to_json(const ddo_config *cfg, char **json)
{
    if (cfg == NULL || json == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_to_json: NULL argument");
    json_t *root = json_object();
    json_t *opts = json_object();
    for (int i = 0; i < DDO_OPT_COUNT; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "value", option_value(cfg, i));
        json_object_set_new(e, "source", json_string(cfg->source[i]));
        json_object_set_new(opts, ddo__optdescs[i].key, e);
    }
    json_object_set_new(root, "options", opts);

    ddo_settings s;
    ddo_config_settings(cfg, &s);
    json_t *st = json_object();
    json_object_set_new(st, "requested_preset", json_string(s.requested_preset));
    json_object_set_new(st, "effective_preset", json_string(s.effective_preset));
    json_object_set_new(st, "backend", json_string(s.backend));
    json_object_set_new(st, "route", json_string(s.route));
    json_object_set_new(st, "enabled", json_boolean(s.enabled));
    json_object_set_new(st, "plan", json_boolean(s.plan));
    json_object_set_new(st, "requested_pin_cpu_memory", json_boolean(s.requested_pin_cpu_memory));
    json_object_set_new(st, "effective_pin_cpu_memory", json_boolean(s.effective_pin_cpu_memory));
    json_object_set_new(st, "disable_pin_on_wsl", json_boolean(s.disable_pin_on_wsl));
    json_object_set_new(st, "running_on_wsl", json_boolean(s.running_on_wsl));
    json_t *pol = json_object();
    for (size_t i = 0; i < cfg->policies.count; i++) {
        const char *k = cfg->policies.items[i].name;
        const char *slash = strchr(k, '/');
        char comp[96];
        snprintf(comp, sizeof(comp), "%.*s", (int)(slash - k), k);
        json_t *c = json_object_get(pol, comp);
        if (c == NULL) {
            c = json_object();
            json_object_set_new(pol, comp, c);
        }
        json_object_set_new(c, slash + 1, json_string(cfg->policies.items[i].value));
    }
    json_object_set_new(st, "component_policies", pol);
    json_object_set_new(root, "settings", st);

    json_t *comps = json_object();
    for (size_t i = 0; i < DDO_ARRAY_LEN(shown_components); i++)
        json_object_set_new(comps, shown_components[i], component_json(cfg, shown_components[i]));
    const char *name;
    json_t *v;
    json_object_foreach(pol, name, v)
    {
        char lower[96];
        size_t n = 0;
        for (; name[n] != '\0' && n + 1 < sizeof(lower); n++)
            lower[n] = (char)(name[n] >= 'A' && name[n] <= 'Z' ? name[n] - 'A' + 'a' : name[n]);
        lower[n] = '\0';
        if (json_object_get(comps, lower) == NULL)
            json_object_set_new(comps, lower, component_json(cfg, name));
    }
    json_object_set_new(root, "components", comps);

    json_t *w = json_array();
    for (size_t i = 0; i < cfg->warnings.count; i++)
        json_array_append_new(w, json_string(cfg->warnings.items[i]));
    json_object_set_new(root, "warnings", w);

    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (text == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_config_to_json: out of memory");
    /* jansson allocates with malloc; hand out a copy so ddo_free always pairs. */
    char *out = ddo__strdup(text);
    free(text);
    if (out == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_config_to_json: out of memory");
    *json = out;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The catalog as text and Markdown                                          */
/* ------------------------------------------------------------------------ */

/* Where the compatible Python API (DynamicOffloadConfig) takes an option from, where ddo differs
 * (data for the doc). */
static const struct {
    const char *key;
    const char *note;
} seed_notes[] = {
    { "backend", "compatible API: host selection flag; DDO_BACKEND is a ddo addition" },
    { "preset", "" },
    { "profile_dir", "read by the profiles module" },
    { "execution_device", "compatible API: Python only; ddo also accepts env and flag" },
    { "offload_device", "compatible API: Python only; ddo also accepts env and flag" },
    { "target_module_classes", "compatible API: Python only; ddo also accepts env and flag" },
    { "skip_modules_pattern", "compatible API: Python only; ddo also accepts env and flag" },
    { "profile_name", "compatible API: Python only; ddo also accepts env and flag" },
    { "build_profile", "compatible API: Python only; ddo also accepts env and flag" },
    { "profile_resident_module_budget_gb", "internal: set by capacity profiles; API only" },
    { "vmm_module_pattern", "compatible API: no generic CLI flag; ddo also accepts the flag" },
    { "vmm_page_mb", "compatible API: no generic CLI flag; ddo also accepts the flag" },
    { "vmm_dxgi_local_headroom_gb",
      "compatible API: no generic CLI flag; ddo also accepts the flag" },
    { "vmm_dxgi_shared_headroom_gb",
      "compatible API: no generic CLI flag; ddo also accepts the flag" },
    { "vmm_dxgi_system_headroom_gb",
      "compatible API: no generic CLI flag; ddo also accepts the flag" },
    { "vmm_component_tensor_ownership",
      "compatible API: not currently parsed from ENV; ddo also accepts the variable" },
    { "vmm_component_buffer_limit_mb",
      "compatible API: not currently parsed from ENV; ddo also accepts the variable" },
    { "vmm_total_staging_gb", "compatible API: CLI only; ddo also accepts the variable" },
    { "execution_slots", "ddo addition" },
    { "unit_granularity", "ddo addition" },
    { "read_engine", "ddo addition" },
    { "weight_codec", "ddo addition" },
    { "weight_codec_cache_dir", "ddo addition" },
    { "use_environment", "ddo addition; API only" },
};

static const char *note_of(const char *key)
{
    for (size_t i = 0; i < DDO_ARRAY_LEN(seed_notes); i++)
        if (strcmp(seed_notes[i].key, key) == 0)
            return seed_notes[i].note;
    return "";
}

static const char *type_name(ddo__otype t)
{
    static const char *const names[] = { "bool",  "int",    "KiB",  "GiB", "MiB",
                                         "float", "string", "enum", "list" };
    return names[t];
}

static void default_text(const ddo__optdesc *d, char *buf, size_t len)
{
    if (d->type == DDO__OT_KB)
        snprintf(buf, len, "%s (%lld KiB)", d->def, atoll(d->def) / 1024);
    else if (d->def[0] == '\0')
        snprintf(buf, len, "\"\"");
    else
        snprintf(buf, len, "%s", d->def);
}

/* Choices "a|b" as "a, b" ("" shown as ""). */
static void choices_list(const char *choices, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (const char *p = choices;;) {
        size_t m = strcspn(p, "|");
        int w = snprintf(buf + o, len - o, "%s%.*s", o == 0 ? "" : ", ", m == 0 ? 2 : (int)m,
                         m == 0 ? "\"\"" : p);
        if (w < 0 || (size_t)w >= len - o)
            return;
        o += (size_t)w;
        if (p[m] == '\0')
            return;
        p += m + 1;
    }
}

const char *ddo__config_effect_text(ddo__oeffect effect)
{
    switch (effect) {
    case DDO__EFFECT_LIVE:
        return "live";
    case DDO__EFFECT_HOST:
        return "live in the hosts (tool, Python binding), not read by libddo";
    case DDO__EFFECT_COMPAT:
        return "accepted for compatibility, no effect";
    case DDO__EFFECT_WINDOWS:
        return "windows only";
    }
    return "?";
}

static void list_text(ddo__sbuf *b)
{
    ddo__sbuf_printf(b,
                     "ddo options (%d): key, type, default, environment variable, flag, effect\n\n",
                     (int)DDO_OPT_COUNT);
    for (int i = 0; i < DDO_OPT_COUNT; i++) {
        const ddo__optdesc *d = &ddo__optdescs[i];
        char def[96], ch[256];
        default_text(d, def, sizeof(def));
        ddo__sbuf_printf(b, "%s (%s, default %s)\n", d->key, type_name(d->type), def);
        ddo__sbuf_printf(b, "    env %s, flag %s\n", d->env[0] ? d->env : "-",
                         d->flag[0] ? d->flag : "-");
        ddo__sbuf_printf(b, "    effect: %s\n", ddo__config_effect_text(d->effect));
        if (d->type == DDO__OT_ENUM) {
            choices_list(d->choices, ch, sizeof(ch));
            ddo__sbuf_printf(b, "    one of: %s\n", ch);
        }
        ddo__sbuf_printf(b, "    %s\n", d->help);
        if (note_of(d->key)[0] != '\0')
            ddo__sbuf_printf(b, "    (%s)\n", note_of(d->key));
    }
    ddo__sbuf_printf(b, "\npresets (DDO_PRESET / --ddo-preset; auto -> one_shot_fast on linear, "
                        "vmm_fast_runtime on vmm):\n");
    for (size_t i = 0; i < ddo__preset_name_count(); i++) {
        const char *name, *backend, *intent;
        ddo__preset_name_at(i, &name, &backend, &intent);
        ddo__sbuf_printf(b, "  %-30s %-6s %s\n", name, backend, intent);
        for (size_t r = 0; r < ddo__preset_row_count(); r++) {
            const ddo__preset_row *row = ddo__preset_row_at(r);
            if (strcmp(row->preset, name) == 0)
                ddo__sbuf_printf(b, "      %s=%s\n", row->var, row->value);
        }
    }
}

static void md_options(ddo__sbuf *b)
{
    ddo__sbuf_printf(b, "## Options\n\n"
                        "Each key is also an environment variable and a flag by the uniform rule "
                        "`key` <-> `DDO_KEY` <-> `--ddo-key`, except where the table says "
                        "otherwise. Sizes: `_gb` is GiB and `_mb` MiB (decimals accepted); "
                        "`small_tensor_threshold_bytes` is bytes through the API and KiB through "
                        "`DDO_SMALL_TENSOR_THRESHOLD_KB` / `--ddo-small-tensor-threshold-kb`. "
                        "Rows marked \"compatible API: Python only\", \"compatible API: not "
                        "currently parsed from ENV\" or \"compatible API: no generic CLI flag\" "
                        "are inputs the compatible Python API does not offer; ddo accepts them "
                        "by the uniform rule. The effect column "
                        "says what an option does: `live` (read by libddo), `live in the hosts` "
                        "(read by the `ddo` tool or the Python binding, not by libddo), "
                        "`accepted for compatibility, no effect` or `windows only` (no effect on "
                        "Linux).\n\n");
    ddo__sbuf_printf(b, "| key | type | effect | default | environment | flag | description |\n"
                        "| --- | --- | --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < DDO_OPT_COUNT; i++) {
        const ddo__optdesc *d = &ddo__optdescs[i];
        char def[96], ch[256];
        default_text(d, def, sizeof(def));
        ddo__sbuf_printf(b, "| `%s` | %s | %s | `%s` | %s%s%s | %s%s%s | ", d->key,
                         type_name(d->type),
                         d->effect == DDO__EFFECT_HOST ? "live in the hosts"
                                                       : ddo__config_effect_text(d->effect),
                         def, d->env[0] ? "`" : "", d->env[0] ? d->env : "-", d->env[0] ? "`" : "",
                         d->flag[0] ? "`" : "", d->flag[0] ? d->flag : "-", d->flag[0] ? "`" : "");
        /* Markdown: '*' and '|' in help text are literal. */
        for (const char *p = d->help; *p != '\0'; p++) {
            if (*p == '*' || *p == '|')
                ddo__sbuf_append(b, "\\", 1);
            ddo__sbuf_append(b, p, 1);
        }
        if (d->type == DDO__OT_ENUM) {
            choices_list(d->choices, ch, sizeof(ch));
            ddo__sbuf_printf(b, ". One of: %s", ch);
        }
        if (note_of(d->key)[0] != '\0')
            ddo__sbuf_printf(b, ". *(%s)*", note_of(d->key));
        ddo__sbuf_printf(b, " |\n");
    }
    ddo__sbuf_printf(b, "\n");
}

static void md_presets(ddo__sbuf *b)
{
    size_t np = ddo__preset_name_count();
    ddo__sbuf_printf(
        b, "## Presets\n\n"
           "Presets are data (`src/config/presets.def`). `auto` resolves to `one_shot_fast` "
           "with `--ddo-backend linear` on every platform (WSL included; platform "
           "safety is applied afterwards through `disable_pin_on_wsl`) and to "
           "`vmm_fast_runtime` with `--ddo-backend vmm`. Native VMM presets exist "
           "only on the vmm backend and linear presets only on linear: "
           "`--ddo-backend linear --ddo-preset nvme_baseline` is an error. An unknown "
           "name fails with `Invalid DDO_PRESET='NAME'` and the valid names. The "
           "names `compat`, `windows_fast`, `linux_native_fast`, `linux_safe`, "
           "`planner_balanced`, `planner_slim_resident`, `warm_server`, `low_ram`, "
           "`diffusers_group_offload`, `group_offload_compat`, "
           "`diffusers_leaf_group_offload` and `leaf_offload_compat` are not "
           "presets.\n\n");
    ddo__sbuf_printf(b, "| preset | backend | intent |\n| --- | --- | --- |\n");
    for (size_t i = 0; i < np; i++) {
        const char *name, *backend, *intent;
        ddo__preset_name_at(i, &name, &backend, &intent);
        ddo__sbuf_printf(b, "| `%s` | %s | %s |\n", name, backend, intent);
    }
    ddo__sbuf_printf(b, "\nValues per preset (a dash: not set, the option keeps its default; "
                        "`DDO_RUNNER_<COMPONENT>_*` rows are component policy data; "
                        "`DDO_RUNNER_*` host rows and `DDO_PURGE_WINDOWS_STANDBY_*` are kept for "
                        "hosts):\n\n| variable |");
    for (size_t i = 0; i < np; i++) {
        const char *name, *backend, *intent;
        ddo__preset_name_at(i, &name, &backend, &intent);
        ddo__sbuf_printf(b, " %s |", name);
    }
    ddo__sbuf_printf(b, "\n| --- |");
    for (size_t i = 0; i < np; i++)
        ddo__sbuf_printf(b, " --- |");
    ddo__sbuf_printf(b, "\n");
    /* One row per distinct variable, in first-appearance order. */
    size_t nr = ddo__preset_row_count();
    for (size_t r = 0; r < nr; r++) {
        const char *var = ddo__preset_row_at(r)->var;
        bool seen = false;
        for (size_t q = 0; q < r && !seen; q++)
            seen = strcmp(ddo__preset_row_at(q)->var, var) == 0;
        if (seen)
            continue;
        ddo__sbuf_printf(b, "| `%s` |", var);
        for (size_t i = 0; i < np; i++) {
            const char *name, *backend, *intent;
            ddo__preset_name_at(i, &name, &backend, &intent);
            const char *v = ddo__preset_value(name, var);
            ddo__sbuf_printf(b, " %s |", v != NULL ? v : "-");
        }
        ddo__sbuf_printf(b, "\n");
    }
    ddo__sbuf_printf(b, "\n");
}

static const char *const md_head[] = {
    "# ddo options\n\n"
    "<!-- Generated by `ddo config --list --markdown` from src/config/options.def and "
    "src/config/presets.def. Do not edit; tests/cli_config.sh checks it. -->\n\n",
    "## Resolution order\n\n"
    "Lowest to highest:\n\n"
    "1. the `DynamicOffloadConfig` dataclass defaults (the `default` column below);\n"
    "2. preset values (source `preset:NAME`);\n"
    "3. explicit values given through the API, `ddo_config_set*` (source `api`);\n"
    "4. recognised `DDO_*` variables, only when the host opts into the environment with "
    "`ddo_config_apply_env` (source `env:DDO_X`);\n"
    "5. `--ddo-*` flags parsed by `ddo_config_parse_args` (source `flag`);\n"
    "6. component-specific policies (per component route, see below).\n\n"
    "A write never replaces a value of a higher rank, whatever the call order. "
    "`ddo_config_parse_args` builds a config from flags and does not merge the environment; "
    "its default preset is `auto`. The `ddo` tool always applies the environment and then "
    "the flags. With `use_environment = false` (API only), `ddo_config_apply_env` ignores the "
    "environment block: no option and no component route is read from it.\n\n"
    "`ddo_config_apply_env` first installs the `from_env` operational defaults (source "
    "`default`): `small_tensor_threshold_bytes` 16 KiB (the catalog's), `pin_cpu_workers` 4, "
    "the built-in "
    "`always_resident_modules_pattern` "
    "`(^|\\.)(proj_in|time_embed|prompt_adaln|norm_out|proj_out)(\\.|$)`, `show_profile` "
    "false and `available_system_ram_gb` detected (GiB, 4 decimals); a preset can override "
    "them. Then `DDO_BACKEND` and `DDO_PRESET` select the preset, and every recognised "
    "variable overrides it.\n\n",
    "## Environment parsing\n\n"
    "- A variable that is set, even to an empty string, wins over the preset "
    "(`DDO_AVAILABLE_SYSTEM_RAM_GB=\"\"` means \"detect\").\n"
    "- Booleans are true for `1`, `true`, `yes`, `on` (any case, trimmed) and false for "
    "anything else, the empty string included. Flags and the API are strict: they take those "
    "words or `0`, `false`, `no`, `off`, and reject others. A boolean flag may omit its "
    "value.\n"
    "- Lists split on `,` or `;`; items are stripped and empty items dropped.\n"
    "- `_gb` and `_mb` sizes and floats accept decimals; integers do not. A malformed number "
    "is an error naming the variable: `DDO_PIN_CPU_WORKERS=\"abc\": expected an integer`.\n"
    "- Enumerations are trimmed and lowercased; an unknown word is an error listing the "
    "accepted ones.\n"
    "- `DDO_SAFETENSORS_BACKEND` is an alias used only when `DDO_LOAD_SAFETENSORS_BACKEND` "
    "resolves empty.\n"
    "- An unknown `DDO_*` variable is a warning (`ddo_config_warning`) that suggests the "
    "nearest variable. Not warned about: `DDO_<COMPONENT>_*` component variables, "
    "`DDO_RUNNER_*`, `DDO_PURGE_WINDOWS_STANDBY_*`, `DDO_VMM_LIBRARY_PATH`, "
    "`DDO_VMM_ALLOCATOR_ROOT`, `DDO_VMM_TORCH_CACHE_MIB`, `DDO_PROFILE_DIR`, and the test "
    "harness's `DDO_TEST_DATA`, `DDO_BIN`, `DDO_SOURCE_DIR`, `DDO_BUILD_DIR`.\n\n",
    NULL,
};

static const char *const md_tail[] = {
    "## Routes\n\n"
    "Native VMM is never chosen silently: it needs `--ddo-backend vmm` (or `DDO_BACKEND=vmm`).\n\n"
    "| host selection | effective preset | route | execution_mode |\n"
    "| --- | --- | --- | --- |\n"
    "| `--ddo-backend linear --ddo-preset auto` (default) | `one_shot_fast` | `one_shot_fast` | "
    "`linear_runtime` |\n"
    "| `--ddo-backend vmm --ddo-preset auto` | `vmm_fast_runtime` | `vmm_fast_runtime` | "
    "`vmm_fast_runtime` (native transport on, `vmm_resident_weight_budget_gb` 4 unless "
    "given) |\n"
    "| `--ddo-backend vmm --ddo-preset nvme_baseline` | `nvme_baseline` | `vmm_runtime` | "
    "`vmm_runtime` (positive mapped budget required, 4 GiB unless given) |\n\n"
    "The settings' `route` is `vmm_fast_runtime` or `vmm_runtime` for those modes, otherwise the "
    "effective preset, otherwise `linear_runtime`, `plan` (DDO_PLAN set) or `off`.\n\n"
    "`--ddo-vmm-total-staging-gb T` (`vmm_total_staging_gb`) gives the total staging capacity: "
    "on `vmm_runtime` it becomes two NVMe staging slots (`vmm_staging_buffer_gb` = T/2 per "
    "slot), on `vmm_fast_runtime` the native total (`vmm_staging_buffer_gb` = T). Omitted (0), "
    "the route's default `vmm_staging_buffer_gb` stays. An explicit `vmm_staging_buffer_gb` of a "
    "higher rank wins. It has no effect on the linear routes.\n\n",
    "## Settings object\n\n"
    "`ddo_config_settings()` (and `settings` in `ddo config --json`): `requested_preset`, "
    "`effective_preset`, `backend`, `route`, `enabled` (= `plan` or `execution_mode` != plan), "
    "`plan`, `requested_pin_cpu_memory` (`pin_cpu_memory`), `effective_pin_cpu_memory` "
    "(requested and not (`running_on_wsl` and `disable_pin_on_wsl`)), `disable_pin_on_wsl`, "
    "`running_on_wsl` (the tool detects it from the kernel release; hosts call "
    "`ddo_config_set_running_on_wsl`), and `component_policies` (the API policies).\n\n",
    "## Component routes\n\n"
    "A component route decides how a pipeline component (`text_encoder`, `transformer`, `vae`, "
    "...) is run:\n\n"
    "- `dynamic_offload`: streamed by ddo (units per `unit_granularity`);\n"
    "- `diffusers_group_offload`: leaf/group offload compatibility; in ddo a streamed plan of "
    "leaf units (`offload_type` `leaf_level`, the default) or block units (`block_level`);\n"
    "- `none`: unmanaged, resident on the execution device;\n"
    "- `auto`: group offload when `GROUP_OFFLOAD` is true (or the host reports a quantized "
    "backend and dynamic offload is enabled), else dynamic offload when `DYNAMIC_OFFLOAD` is "
    "true (when unset: when the settings are enabled), else none.\n\n"
    "Aliases: `dynamic`, `ddo` -> `dynamic_offload`; `diffusers`, `diffusers_group`, `group`, "
    "`group_offload` -> `diffusers_group_offload`; `cuda`, `standard`, `none`, `off` -> "
    "`none`. Any other word is an error.\n\n"
    "Component names are normalised: uppercased, every run of characters outside `[A-Z0-9]` "
    "becomes `_`, leading and trailing `_` are stripped, empty is `MODEL`. For a component "
    "named `transformer`:\n\n"
    "| variable | meaning |\n| --- | --- |\n"
    "| `DDO_TRANSFORMER_ROUTE` | `auto`, `dynamic_offload`, `diffusers_group_offload` or "
    "`none` (aliases above) |\n"
    "| `DDO_TRANSFORMER_GROUP_OFFLOAD` | boolean: group offload route under `auto` (default 0) "
    "|\n"
    "| `DDO_TRANSFORMER_DYNAMIC_OFFLOAD` | boolean: dynamic route under `auto` (default: "
    "settings enabled) |\n"
    "| `DDO_TRANSFORMER_OFFLOAD_STREAM` | boolean (default 1); forced off with "
    "`OFFLOAD_RECORD_STREAM` on WSL when `disable_pin_on_wsl` |\n"
    "| `DDO_TRANSFORMER_OFFLOAD_RECORD_STREAM` | boolean (default 0) |\n"
    "| `DDO_TRANSFORMER_OFFLOAD_TYPE` | `leaf_level` (default) or `block_level` |\n"
    "| `DDO_TRANSFORMER_OFFLOAD_LOW_CPU_MEM_USAGE` | boolean (default 1) |\n"
    "| `DDO_TRANSFORMER_NUM_BLOCKS_PER_GROUP` | integer >= 1 (default 1), block_level only |\n\n"
    "Lookup per option: an explicit route argument (`ddo_config_component_policy`) wins; then "
    "an API policy (`ddo_config_set_component_policy`); then `DDO_<COMPONENT>_<OPTION>` "
    "(environment if set, else the preset); then the compatibility alias "
    "`DDO_RUNNER_<COMPONENT>_<OPTION>` (environment, else preset); the first non-empty value "
    "wins; otherwise the default.\n\n"
    "VAE policy: under `auto`, `one_shot_fast`, `low_ram_safe` and `vmm_fast_runtime` route the "
    "VAE to leaf offload without a stream; `warm_process`, `wsl_compat` and `nvme_baseline` "
    "keep the VAE resident (`none`); `off` leaves it unmanaged.\n\n",
    "A host's explicit configuration or runtime overrides (the Python `enable_offload`'s "
    "`config=` fields and keyword overrides, given without policy arguments; "
    "`ddo_config_component_policy_with_overrides`) bypass a preset's VAE route: the VAE then "
    "routes `dynamic_offload` when the settings are enabled, else `none`. A VAE route from an "
    "explicit route argument, an API policy or the environment is kept.\n\n",
    "## Numbers\n\n"
    "A number is decimal: an optional sign, digits with an optional point, an optional "
    "exponent (`0.5`, `+.5`, `1e3`, `1E+1`); integer options take digits only. Leading or "
    "trailing spaces, hexadecimal (`0x10`), `inf`, `nan`, a value past the range of a double "
    "and anything else `strtod` would stretch to are refused with the text quoted as given. "
    "Every value is checked against the bounds of its row when it is stored, from the "
    "environment, a flag or the API, before it is converted (`DDO_VMM_PAGE_MB=\"1e308\": "
    "above the range 0..1048576 MiB of vmm_page_mb`); a value of a KB row given in KiB is "
    "checked in KiB. Only the two values validation clamps are stored as given: "
    "`pin_weight_budget_ratio` (any finite number) and `pin_cpu_workers` below 1. The planner "
    "checks the bounds again before it converts a value. Every command of the `ddo` tool "
    "validates the whole configuration before it uses it. Quoted values in messages escape "
    "control characters (`\\n`, `\\x1b`), so an error is always one line. A value's text is at "
    "most 64 KiB and a pattern list holds at most 256 patterns (the planner matches every "
    "pattern against every module name, each match bounded by PCRE2's match and depth limits; "
    "a pattern that reaches them, such as `(a+)+$` against a long name, is an error naming the "
    "option, the pattern and the module).\n\n"
    "## Validation\n\n"
    "`ddo_config_validate` clamps `pin_weight_budget_ratio` to 0..1 and `pin_cpu_workers` to "
    ">= 1, then rejects, with one line naming the key, its source and what is accepted: "
    "numbers outside the bounds above; `execution_device` other than `cpu`, `cuda`, `cuda:N`; "
    "`offload_device` other than `cpu`; `vmm_runtime`/`vmm_fast_runtime` with backend linear; "
    "`linear_runtime` with backend vmm; `vmm_runtime` without a positive "
    "`vmm_resident_weight_budget_gb`; `vmm_execution_backing_reclaim` or "
    "`vmm_component_tensor_ownership` off the native fast route; `vmm_source_registered_gb` "
    "above `vmm_source_cache_gb` or not whole 64 MiB segments; a micro-cache slot count "
    "without a slot size (or the reverse); `build_profile` without `profile_name`. Unknown "
    "enumeration words are rejected when set.\n",
    NULL,
};

static void append_all(ddo__sbuf *b, const char *const *parts)
{
    for (; *parts != NULL; parts++)
        ddo__sbuf_append(b, *parts, strlen(*parts));
}

int ddo_config_describe(ddo_config_doc format, char **text)
{
    if (text == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_describe: text is NULL");
    ddo__sbuf b;
    ddo__sbuf_init(&b);
    if (format == DDO_CONFIG_DOC_MARKDOWN) {
        append_all(&b, md_head);
        md_options(&b);
        md_presets(&b);
        append_all(&b, md_tail);
    } else if (format == DDO_CONFIG_DOC_LIST) {
        list_text(&b);
    } else {
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_describe: unknown format %d",
                         (int)format);
    }
    char *s = ddo__sbuf_take(&b);
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_config_describe: out of memory");
    *text = s;
    return 0;
}
