/*
 * test_presets.c - presets, auto, the settings object and component routes:
 * the C port of upstream tests/test_dynamic_offload_presets.py
 * (the documented preset and routing rules) with the same inputs and expectations, plus
 * the native VMM host selection table.
 * ctest-labels: unit
 */
#include "config/config_priv.h"
#include "config_fx.h"
#include "ddo.h"
#include "t.h"

static ddo_config *new_cfg(void)
{
    ddo_config *c = NULL;
    if (ddo_config_create(&c) != 0)
        return NULL;
    return c;
}

/* Builds settings from an environment block, as DynamicOffloadSettings.from_env. */
static ddo_config *from_env(const char *const *env, bool wsl)
{
    ddo_config *c = new_cfg();
    if (c == NULL)
        return NULL;
    ddo_config_set_running_on_wsl(c, wsl);
    if (ddo_config_apply_env(c, env) != 0) {
        ddo_config_destroy(c);
        return NULL;
    }
    return c;
}

static const char *route(const ddo_config *c, const char *component)
{
    const char *r = NULL;
    return ddo__config_component_route(c, component, &r) == 0 ? r : "(error)";
}

/* 1: auto resolves to one_shot_fast, WSL or not. */
static void test_auto_resolves_to_one_shot_fast(void)
{
    for (int wsl = 0; wsl < 2; wsl++) {
        ddo_config *c = new_cfg();
        T_REQUIRE(c != NULL);
        ddo_config_set_running_on_wsl(c, wsl != 0);
        T_EQ_INT(ddo_config_apply_preset(c, "linear", "auto"), 0);
        ddo_settings s;
        T_EQ_INT(ddo_config_settings(c, &s), 0);
        T_EQ_STR(s.requested_preset, "auto");
        T_EQ_STR(s.effective_preset, "one_shot_fast");
        T_EQ_STR(s.route, "one_shot_fast");
        T_EQ_STR(src(c, "execution_mode"), "preset:one_shot_fast");
        ddo_config_destroy(c);
    }
    /* NULL backend is linear; names are stripped and lowercased. */
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_preset(c, NULL, "  AUTO "), 0);
    T_EQ_STR(val(c, "execution_mode"), "linear_runtime");
    ddo_config_destroy(c);
}

/* 2: an invalid preset names DDO_PRESET and the valid names. */
static void test_invalid_preset_reports_env_name(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "windows_fast"), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c),
             "Invalid DDO_PRESET='windows_fast'. Valid presets: auto, "
             "diffusers_leaf_offload_compat, diffusers_offload_compat, low_ram_safe, off, "
             "one_shot_fast, warm_process, wsl_compat (backend linear); auto, nvme_baseline "
             "(backend vmm)");
    /* The failed call changed nothing. */
    T_EQ_STR(val(c, "preset"), "");
    T_EQ_STR(val(c, "execution_mode"), "plan");
    ddo_config_destroy(c);

    const char *env[] = { "DDO_PRESET=windows_fast", NULL };
    c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_env(c, env), DDO_E_CONFIG);
    T_CONTAINS(ddo_config_error(c), "Invalid DDO_PRESET='windows_fast'");
    ddo_config_destroy(c);
}

/* 3: the removed legacy names are not presets on either backend. */
static void test_removed_legacy_names_absent(void)
{
    static const char *const forbidden[] = {
        "compat",
        "windows_fast",
        "linux_native_fast",
        "linux_safe",
        "planner_balanced",
        "planner_slim_resident",
        "warm_server",
        "low_ram",
        "diffusers_group_offload",
        "group_offload_compat",
        "diffusers_leaf_group_offload",
        "leaf_offload_compat",
    };
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    for (size_t i = 0; i < sizeof(forbidden) / sizeof(forbidden[0]); i++) {
        T_EQ_INT(ddo_config_apply_preset(c, "linear", forbidden[i]), DDO_E_CONFIG);
        T_CONTAINS(ddo_config_error(c), "Invalid DDO_PRESET=");
        T_EQ_INT(ddo_config_apply_preset(c, "vmm", forbidden[i]), DDO_E_CONFIG);
        for (size_t p = 0; p < ddo__preset_name_count(); p++) {
            const char *name, *backend, *intent;
            ddo__preset_name_at(p, &name, &backend, &intent);
            T_CHECK(strcmp(name, forbidden[i]) != 0);
        }
    }
    ddo_config_destroy(c);
}

/* 4: an environment value wins over the preset. */
static void test_env_override_wins_over_preset(void)
{
    const char *env[] = { "DDO_PRESET=one_shot_fast", "DDO_PIN_CPU_WORKERS=9",
                          "DDO_AVAILABLE_SYSTEM_RAM_GB=64", NULL };
    ddo_config *c = from_env(env, false);
    T_REQUIRE(c != NULL);
    ddo_settings s;
    ddo_config_settings(c, &s);
    T_EQ_STR(s.effective_preset, "one_shot_fast");
    int64_t w = 0;
    double ram = 0;
    T_EQ_INT(ddo_config_get_int(c, "pin_cpu_workers", &w), 0);
    T_EQ_INT(w, 9);
    T_EQ_STR(src(c, "pin_cpu_workers"), "env:DDO_PIN_CPU_WORKERS");
    T_EQ_INT(ddo_config_get_double(c, "available_system_ram_gb", &ram), 0);
    T_NEAR(ram, 64.0, 0);
    T_EQ_INT(ddo__config_options(c)->pin_cpu_workers, 9);
    ddo_config_destroy(c);
}

/* 5: the profile headroom is a regular setting; the removed full-pin budget is gone. */
static void test_profile_headroom_is_regular_setting(void)
{
    const char *env[] = { "DDO_PROFILE_VRAM_HEADROOM_GB=1.25", NULL };
    ddo_config *c = from_env(env, false);
    T_REQUIRE(c != NULL);
    double v = 0;
    T_EQ_INT(ddo_config_get_double(c, "profile_vram_headroom_gb", &v), 0);
    T_NEAR(v, 1.25, 0);
    char *json = NULL;
    T_EQ_INT(ddo_config_to_json(c, &json), 0);
    T_CONTAINS(json, "\"profile_vram_headroom_gb\": {\n      \"value\": 1.25,");
    ddo_free(json);
    const char *x;
    T_EQ_INT(ddo_config_get(c, "auto_full_pin_resident_budget_gb", &x), DDO_E_NOT_FOUND);
    T_EQ_INT(ddo_config_warning_count(c), 0);
    ddo_config_destroy(c);
}

/* 6: WSL disables pinned memory by default. */
static void test_wsl_disables_pinned_memory(void)
{
    const char *env[] = { "DDO_PRESET=one_shot_fast", "DDO_AVAILABLE_SYSTEM_RAM_GB=64", NULL };
    ddo_config *c = from_env(env, true);
    T_REQUIRE(c != NULL);
    ddo_settings s;
    ddo_config_settings(c, &s);
    T_CHECK(s.requested_pin_cpu_memory);
    T_CHECK(!s.effective_pin_cpu_memory);
    T_CHECK(s.disable_pin_on_wsl);
    T_CHECK(s.running_on_wsl);
    ddo_config_destroy(c);
    /* DDO_DISABLE_PIN_ON_WSL=0 forces pinning experiments. */
    const char *env2[] = { "DDO_PRESET=one_shot_fast", "DDO_DISABLE_PIN_ON_WSL=0", NULL };
    c = from_env(env2, true);
    T_REQUIRE(c != NULL);
    ddo_config_settings(c, &s);
    T_CHECK(s.effective_pin_cpu_memory);
    ddo_config_destroy(c);
}

/* 7: preset values are data: changing one config's value leaves the table alone. */
static void test_preset_listing_is_a_copy(void)
{
    ddo_config *a = new_cfg(), *b = new_cfg();
    T_REQUIRE(a != NULL && b != NULL);
    T_EQ_INT(ddo_config_apply_preset(a, "linear", "one_shot_fast"), 0);
    T_EQ_INT(ddo_config_set(a, "pin_cpu_workers", "99"), 0);
    T_EQ_INT(ddo_config_apply_preset(b, "linear", "one_shot_fast"), 0);
    T_EQ_STR(val(b, "pin_cpu_workers"), "4");
    T_EQ_STR(ddo__preset_value("one_shot_fast", "DDO_PIN_CPU_WORKERS"), "4");
    ddo_config_destroy(a);
    ddo_config_destroy(b);
}

/* 8: routes by component preset. */
static void test_routes_by_component_preset(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "one_shot_fast"), 0);
    T_EQ_STR(route(c, "transformer"), "dynamic_offload");
    T_EQ_STR(route(c, "text_encoder"), "diffusers_group_offload");
    ddo_config_destroy(c);
}

/* 9: component policies override the preset. */
static void test_component_policy_overrides(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "one_shot_fast"), 0);
    T_EQ_INT(ddo_config_set_component_policy(c, "transformer", "route", "diffusers_group_offload"),
             0);
    T_EQ_INT(ddo_config_set_component_policy(c, "transformer", "offload_type", "block_level"), 0);
    T_EQ_INT(ddo_config_set_component_policy(c, "transformer", "num_blocks_per_group", "2"), 0);
    T_EQ_INT(ddo_config_set_component_policy(c, "transformer", "offload_stream", "False"), 0);
    T_EQ_INT(ddo_config_set_component_policy(c, "transformer", "offload-record-stream", "True"), 0);
    ddo_component_policy p;
    T_EQ_INT(ddo_config_component_policy(c, "transformer", NULL, false, &p), 0);
    T_EQ_STR(p.route, "diffusers_group_offload");
    T_EQ_STR(p.route_source, "api");
    T_EQ_STR(p.offload_type, "block_level");
    T_EQ_STR(p.unit_granularity, "block");
    T_EQ_INT(p.num_blocks_per_group, 2);
    T_CHECK(!p.use_stream);
    T_CHECK(p.record_stream);
    ddo_config_destroy(c);
}

/* 10: an explicit route overrides the policy. */
static void test_explicit_route_overrides_policy(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "one_shot_fast"), 0);
    T_EQ_INT(ddo_config_set_component_policy(c, "transformer", "route", "group"), 0);
    ddo_component_policy p;
    T_EQ_INT(ddo_config_component_policy(c, "transformer", "none", false, &p), 0);
    T_EQ_STR(p.route, "none");
    T_EQ_STR(p.route_source, "argument");
    T_EQ_STR(p.unit_granularity, "");
    ddo_config_destroy(c);
}

/* 11/24: a quantized component auto-routes to group offload. */
static void test_quantized_component_routes_to_group(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "one_shot_fast"), 0);
    ddo_component_policy p;
    T_EQ_INT(ddo_config_component_policy(c, "transformer", NULL, true, &p), 0);
    T_EQ_STR(p.route, "diffusers_group_offload");
    T_EQ_STR(p.route_source, "auto: quantized backend");
    T_EQ_INT(ddo_config_component_policy(c, "transformer", NULL, false, &p), 0);
    T_EQ_STR(p.route, "dynamic_offload");
    ddo_config_destroy(c);
}

/* 12: a quantized component respects the off preset. */
static void test_quantized_respects_off(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "off"), 0);
    ddo_component_policy p;
    T_EQ_INT(ddo_config_component_policy(c, "transformer", NULL, true, &p), 0);
    T_EQ_STR(p.route, "none");
    ddo_settings s;
    ddo_config_settings(c, &s);
    T_CHECK(!s.enabled);
    T_EQ_STR(s.route, "off");
    ddo_config_destroy(c);
}

/* 13: one settings object routes every component of a pipeline. */
static void test_pipeline_shares_one_config(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "auto"), 0);
    T_EQ_STR(route(c, "text_encoder"), "diffusers_group_offload");
    T_EQ_STR(route(c, "transformer"), "dynamic_offload");
    /* The same config answers again, unchanged. */
    T_EQ_STR(route(c, "text_encoder"), "diffusers_group_offload");
    ddo_config_destroy(c);
}

/* 14: diffusers_offload_compat routes the transformer to block-level group offload. */
static void test_diffusers_offload_compat_transformer_group(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "diffusers_offload_compat"), 0);
    ddo_component_policy p;
    T_EQ_INT(ddo_config_component_policy(c, "transformer", NULL, false, &p), 0);
    T_EQ_STR(p.route, "diffusers_group_offload");
    T_EQ_STR(p.offload_type, "block_level");
    T_EQ_INT(p.num_blocks_per_group, 1);
    T_CHECK(p.use_stream);
    T_CHECK(p.record_stream);
    T_CHECK(p.low_cpu_mem_usage);
    T_EQ_STR(p.route_source, "auto: preset:diffusers_offload_compat");
    ddo_config_destroy(c);
    c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "diffusers_leaf_offload_compat"), 0);
    T_EQ_INT(ddo_config_component_policy(c, "transformer", NULL, false, &p), 0);
    T_EQ_STR(p.offload_type, "leaf_level");
    T_EQ_STR(p.unit_granularity, "leaf");
    ddo_config_destroy(c);
}

/* 15: warm_process streams the text encoder. */
static void test_warm_process_text_encoder_group(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "warm_process"), 0);
    ddo_component_policy p;
    T_EQ_INT(ddo_config_component_policy(c, "text_encoder", NULL, false, &p), 0);
    T_EQ_STR(p.route, "diffusers_group_offload");
    T_CHECK(p.use_stream);
    ddo_config_destroy(c);
}

/* 16: low_ram_safe keeps the text encoder non-streaming (on WSL). */
static void test_low_ram_safe_text_encoder_non_streaming(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    ddo_config_set_running_on_wsl(c, true);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "low_ram_safe"), 0);
    ddo_component_policy p;
    T_EQ_INT(ddo_config_component_policy(c, "text_encoder", NULL, false, &p), 0);
    T_EQ_STR(p.route, "diffusers_group_offload");
    T_CHECK(!p.use_stream);
    T_CHECK(!p.record_stream);
    ddo_config_destroy(c);
}

/* 17: group streams are disabled on WSL. */
static void test_group_stream_disabled_on_wsl(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    ddo_config_set_running_on_wsl(c, true);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "one_shot_fast"), 0);
    ddo_component_policy p;
    T_EQ_INT(ddo_config_component_policy(c, "text_encoder", NULL, false, &p), 0);
    T_EQ_STR(p.route, "diffusers_group_offload");
    T_CHECK(!p.use_stream);
    T_CHECK(!p.record_stream);
    /* Off WSL the preset's stream stays on. */
    ddo_config_set_running_on_wsl(c, false);
    T_EQ_INT(ddo_config_component_policy(c, "text_encoder", NULL, false, &p), 0);
    T_CHECK(p.use_stream);
    ddo_config_destroy(c);
}

/* 18: group offload options without a preset (block_level, stream off, record on, 2 blocks). */
static void test_group_offload_options(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_set_component_policy(c, "model", "offload_type", "block_level"), 0);
    T_EQ_INT(ddo_config_set_component_policy(c, "model", "offload_stream", "0"), 0);
    T_EQ_INT(ddo_config_set_component_policy(c, "model", "offload_record_stream", "1"), 0);
    T_EQ_INT(ddo_config_set_component_policy(c, "model", "num_blocks_per_group", "2"), 0);
    ddo_component_policy p;
    T_EQ_INT(ddo_config_component_policy(c, "", "diffusers_group_offload", false, &p), 0);
    T_EQ_STR(p.route, "diffusers_group_offload");
    T_EQ_STR(p.offload_type, "block_level");
    T_EQ_INT(p.num_blocks_per_group, 2);
    T_CHECK(!p.use_stream);
    T_CHECK(p.record_stream);
    ddo_config_destroy(c);
}

/* 19: resolving a preset without the environment keeps explicit values. */
static void test_dynamic_offload_resolves_preset_without_env(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_set_bool(c, "use_environment", false), 0);
    T_EQ_INT(ddo_config_set_double(c, "available_system_ram_gb", 64.0), 0);
    T_EQ_INT(ddo_config_set_bool(c, "show_profile", true), 0);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "one_shot_fast"), 0);
    const char *env[] = { "DDO_SHOW_PROFILE=0", "DDO_AVAILABLE_SYSTEM_RAM_GB=8", "DDO_PRESET=off",
                          NULL };
    T_EQ_INT(ddo_config_apply_env(c, env), 0);
    ddo_settings s;
    ddo_config_settings(c, &s);
    T_EQ_STR(s.effective_preset, "one_shot_fast");
    bool sp = false;
    T_EQ_INT(ddo_config_get_bool(c, "show_profile", &sp), 0);
    T_CHECK(sp);
    T_EQ_STR(val(c, "available_system_ram_gb"), "64");
    /* from_env defaults still apply without the environment. */
    T_EQ_STR(val(c, "small_tensor_threshold_bytes"), "16384");
    ddo_config_destroy(c);
}

/* 26/27: Windows standby purge is host data; the off preset enables no phase. */
static void test_purge_phases_are_preset_data(void)
{
    T_EQ_STR(ddo__preset_value("one_shot_fast", "DDO_PURGE_WINDOWS_STANDBY_BEFORE_RUN"), "1");
    T_EQ_STR(ddo__preset_value("one_shot_fast", "DDO_PURGE_WINDOWS_STANDBY_AFTER_TEXT_ENCODER"),
             "1");
    T_EQ_STR(ddo__preset_value("one_shot_fast", "DDO_PURGE_WINDOWS_STANDBY_BEFORE_TRANSFORMER"),
             "1");
    T_CHECK(ddo__preset_value("off", "DDO_PURGE_WINDOWS_STANDBY_BEFORE_RUN") == NULL);
    /* And they are not warned about as unknown variables. */
    const char *env[] = { "DDO_PRESET=off", "DDO_PURGE_WINDOWS_STANDBY_BEFORE_RUN=1", NULL };
    ddo_config *c = from_env(env, false);
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_warning_count(c), 0);
    ddo_config_destroy(c);
}

/* 28: the listing shows the default mapping and the presets. */
static void test_format_lists_default_mapping(void)
{
    char *text = NULL;
    T_EQ_INT(ddo_config_describe(DDO_CONFIG_DOC_LIST, &text), 0);
    T_CONTAINS(text, "auto -> one_shot_fast");
    T_CONTAINS(text, "one_shot_fast");
    T_CONTAINS(text, "diffusers_offload_compat");
    T_CONTAINS(text, "  nvme_baseline ");
    ddo_free(text);
}

/* The upstream preset table, value by value (docs/options.md, "Presets"). */
static void test_preset_values(void)
{
    static const struct {
        const char *preset, *key, *value;
    } rows[] = {
        { "off", "execution_mode", "plan" },
        { "off", "plan", "false" },
        { "one_shot_fast", "execution_mode", "linear_runtime" },
        { "one_shot_fast", "pin_cpu_memory", "true" },
        { "one_shot_fast", "allow_pin_memory_fallback", "true" },
        { "one_shot_fast", "pin_cpu_workers", "4" },
        { "one_shot_fast", "auto_budget_policy", "balanced" },
        { "one_shot_fast", "max_resident_module_budget_gb", "0" },
        { "one_shot_fast", "system_ram_headroom_gb", "8" },
        { "one_shot_fast", "resident_module_budget_gb", "0" },
        { "one_shot_fast", "resident_module_patterns", "auto" },
        { "one_shot_fast", "resident_module_selection", "spread" },
        { "one_shot_fast", "small_tensor_threshold_bytes", "16384" },
        { "wsl_compat", "pin_cpu_memory", "false" },
        { "wsl_compat", "disable_pin_on_wsl", "true" },
        { "wsl_compat", "pin_cpu_workers", "1" },
        { "wsl_compat", "resident_module_budget_gb", "6" },
        { "warm_process", "cache_pinned_weights", "true" },
        { "warm_process", "resident_module_budget_gb", "6" },
        { "low_ram_safe", "pin_cpu_memory", "false" },
        { "low_ram_safe", "resident_module_budget_gb", "3" },
        { "diffusers_offload_compat", "execution_mode", "plan" },
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        ddo_config *c = new_cfg();
        T_REQUIRE(c != NULL);
        T_EQ_INT(ddo_config_apply_preset(c, "linear", rows[i].preset), 0);
        T_CHECK_MSG(strcmp(val(c, rows[i].key), rows[i].value) == 0, "%s.%s = %s, want %s",
                    rows[i].preset, rows[i].key, val(c, rows[i].key), rows[i].value);
        ddo_config_destroy(c);
    }
    /* A preset leaves what it does not name at the default. */
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "low_ram_safe"), 0);
    T_EQ_STR(val(c, "max_resident_module_budget_gb"), "6");
    T_EQ_STR(src(c, "max_resident_module_budget_gb"), "default");
    /* Switching presets drops the old preset's values. */
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "warm_process"), 0);
    T_EQ_STR(val(c, "cache_pinned_weights"), "true");
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "low_ram_safe"), 0);
    T_EQ_STR(val(c, "cache_pinned_weights"), "false");
    T_EQ_STR(src(c, "cache_pinned_weights"), "default");
    ddo_config_destroy(c);
}

/* The host selection table; native VMM never chosen silently. */
static void test_host_selection_table(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    ddo_settings s;
    T_EQ_INT(ddo_config_apply_preset(c, "vmm", "auto"), 0);
    ddo_config_settings(c, &s);
    T_EQ_STR(s.effective_preset, "vmm_fast_runtime");
    T_EQ_STR(s.route, "vmm_fast_runtime");
    T_EQ_STR(s.backend, "vmm");
    T_EQ_STR(val(c, "execution_mode"), "vmm_fast_runtime");
    T_EQ_STR(val(c, "vmm_native_transport"), "true");
    T_EQ_STR(val(c, "vmm_resident_weight_budget_gb"), "4");
    T_EQ_INT(ddo_config_validate(c), 0);

    T_EQ_INT(ddo_config_apply_preset(c, "vmm", "nvme_baseline"), 0);
    ddo_config_settings(c, &s);
    T_EQ_STR(s.effective_preset, "nvme_baseline");
    T_EQ_STR(s.route, "vmm_runtime");
    T_EQ_STR(val(c, "execution_mode"), "vmm_runtime");
    T_EQ_STR(val(c, "vmm_native_transport"), "false");
    T_EQ_INT(ddo_config_validate(c), 0);

    T_EQ_INT(ddo_config_apply_preset(c, "linear", "nvme_baseline"), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c),
             "DDO_PRESET='nvme_baseline' is a native VMM preset and needs DDO_BACKEND=vmm "
             "(--ddo-backend vmm); native VMM is never chosen silently. Backend linear presets: "
             "auto, diffusers_leaf_offload_compat, diffusers_offload_compat, low_ram_safe, off, "
             "one_shot_fast, warm_process, wsl_compat");
    T_EQ_INT(ddo_config_apply_preset(c, "vmm", "one_shot_fast"), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c), "DDO_PRESET='one_shot_fast' is a linear preset but "
                                  "DDO_BACKEND=vmm. Backend vmm presets: auto, nvme_baseline");
    /* Still the protected route after the failures. */
    T_EQ_STR(val(c, "execution_mode"), "vmm_runtime");
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "auto"), 0);
    ddo_config_settings(c, &s);
    T_EQ_STR(s.route, "one_shot_fast");
    T_EQ_STR(val(c, "vmm_resident_weight_budget_gb"), "0");
    ddo_config_destroy(c);
}

/* Configuration reference: VAE component policy per preset. */
static void test_vae_policy(void)
{
    static const struct {
        const char *backend, *preset, *route;
        bool stream;
    } rows[] = {
        { "linear", "auto", "diffusers_group_offload", false },
        { "linear", "one_shot_fast", "diffusers_group_offload", false },
        { "linear", "low_ram_safe", "diffusers_group_offload", false },
        { "vmm", "auto", "diffusers_group_offload", false },
        { "linear", "warm_process", "none", false },
        { "linear", "wsl_compat", "none", false },
        { "vmm", "nvme_baseline", "none", false },
        { "linear", "off", "none", false },
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        ddo_config *c = new_cfg();
        T_REQUIRE(c != NULL);
        T_EQ_INT(ddo_config_apply_preset(c, rows[i].backend, rows[i].preset), 0);
        ddo_component_policy p;
        T_EQ_INT(ddo_config_component_policy(c, "vae", NULL, false, &p), 0);
        T_CHECK_MSG(strcmp(p.route, rows[i].route) == 0, "%s/%s: vae route %s", rows[i].backend,
                    rows[i].preset, p.route);
        if (strcmp(p.route, "diffusers_group_offload") == 0) {
            T_EQ_STR(p.offload_type, "leaf_level");
            T_CHECK(p.use_stream == rows[i].stream);
        }
        ddo_config_destroy(c);
    }
}

/* Component option values: upstream's int() for num_blocks_per_group (surrounding spaces,
 * then digits only), and every quoted value escaped so the error stays one line. */
static void test_component_values_strict_and_escaped(void)
{
    ddo_config *c = NULL;
    T_REQUIRE(ddo_config_create(&c) == 0);
    ddo_component_policy p;
    T_EQ_INT(ddo_config_set_component_policy(c, "vae", "route", "group"), 0);
    T_EQ_INT(ddo_config_set_component_policy(c, "vae", "num_blocks_per_group", " 3 "), 0);
    T_EQ_INT(ddo_config_component_policy(c, "vae", NULL, false, &p), 0);
    T_EQ_INT(p.num_blocks_per_group, 3);
    const char *bad[] = { "0x10", "3.0", "+", "0", "-2", "1e3", "3 4" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        T_EQ_INT(ddo_config_set_component_policy(c, "vae", "num_blocks_per_group", bad[i]), 0);
        T_EQ_INT(ddo_config_component_policy(c, "vae", NULL, false, &p), DDO_E_CONFIG);
        T_CONTAINS(ddo_config_error(c), "expected an integer >= 1");
    }
    T_EQ_INT(ddo_config_set_component_policy(c, "vae", "num_blocks_per_group", "1"), 0);
    T_EQ_INT(ddo_config_set_component_policy(c, "vae", "route", "bad\n\x1b[2J"), 0);
    T_EQ_INT(ddo_config_component_policy(c, "vae", NULL, false, &p), DDO_E_CONFIG);
    T_CONTAINS(ddo_config_error(c), "route \"bad\\n\\x1b[2J\"");
    T_CHECK(strchr(ddo_config_error(c), '\n') == NULL);
    T_EQ_INT(ddo_config_set_component_policy(c, "vae", "no\nsuch", "1"), DDO_E_NOT_FOUND);
    T_CHECK(strchr(ddo_config_error(c), '\n') == NULL);
    ddo_config_destroy(c);
}

int main(void)
{
    T_RUN(test_auto_resolves_to_one_shot_fast);
    T_RUN(test_component_values_strict_and_escaped);
    T_RUN(test_invalid_preset_reports_env_name);
    T_RUN(test_removed_legacy_names_absent);
    T_RUN(test_env_override_wins_over_preset);
    T_RUN(test_profile_headroom_is_regular_setting);
    T_RUN(test_wsl_disables_pinned_memory);
    T_RUN(test_preset_listing_is_a_copy);
    T_RUN(test_routes_by_component_preset);
    T_RUN(test_component_policy_overrides);
    T_RUN(test_explicit_route_overrides_policy);
    T_RUN(test_quantized_component_routes_to_group);
    T_RUN(test_quantized_respects_off);
    T_RUN(test_pipeline_shares_one_config);
    T_RUN(test_diffusers_offload_compat_transformer_group);
    T_RUN(test_warm_process_text_encoder_group);
    T_RUN(test_low_ram_safe_text_encoder_non_streaming);
    T_RUN(test_group_stream_disabled_on_wsl);
    T_RUN(test_group_offload_options);
    T_RUN(test_dynamic_offload_resolves_preset_without_env);
    T_RUN(test_purge_phases_are_preset_data);
    T_RUN(test_format_lists_default_mapping);
    T_RUN(test_preset_values);
    T_RUN(test_host_selection_table);
    T_RUN(test_vae_policy);
    return t_done();
}
