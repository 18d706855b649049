/*
 * test_config.c - the option catalog: dataclass defaults, typed set/get,
 * sources, every precedence rule, environment parsing (boolean vocabulary,
 * lists, decimals, malformed numbers, the alias, unknown names), --ddo-*
 * flags, the staging translation, validation messages, component routes and
 * use_environment = false.
 * ctest-labels: unit
 */
#include "config/config_priv.h"
#include "config_fx.h"
#include "ddo.h"
#include "plan/plan.h"
#include "t.h"

#include <jansson.h>

static ddo_config *new_cfg(void)
{
    ddo_config *c = NULL;
    if (ddo_config_create(&c) != 0)
        return NULL;
    return c;
}

static ddo_config *env_cfg(const char *const *env)
{
    ddo_config *c = new_cfg();
    if (c != NULL && ddo_config_apply_env(c, env) != 0) {
        ddo_config_destroy(c);
        return NULL;
    }
    return c;
}

/* apply_env on a fresh config must fail with exactly msg. */
static void env_fails(const char *const *env, const char *msg)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_env(c, env), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c), msg);
    T_EQ_STR(ddo_last_error(), msg);
    ddo_config_destroy(c);
}

static void test_dataclass_defaults(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    static const struct {
        const char *key, *value;
    } d[] = {
        { "execution_device", "cuda:0" },
        { "offload_device", "cpu" },
        { "skip_modules_pattern", "" },
        { "always_resident_modules_pattern", "" },
        { "small_tensor_threshold_bytes", "16384" },
        { "execution_mode", "plan" },
        { "linear_runtime_strategy", "functional" },
        { "pin_cpu_memory", "false" },
        { "allow_pin_memory_fallback", "true" },
        { "pin_cpu_workers", "1" },
        { "cache_plan", "true" },
        { "cache_pinned_weights", "false" },
        { "pinned_weight_cache_namespace", "" },
        { "auto_budget_policy", "off" },
        { "max_resident_module_budget_gb", "6" },
        { "auto_vram_headroom_gb", "0" },
        { "profile_vram_headroom_gb", "1" },
        { "profile_name", "" },
        { "build_profile", "false" },
        { "auto_full_pin_min_model_to_vram_ratio", "4" },
        { "max_pin_weight_budget_gb", "0" },
        { "available_system_ram_gb", "0" },
        { "system_ram_headroom_gb", "6" },
        { "pin_weight_budget_gb", "0" },
        { "pin_weight_budget_ratio", "0" },
        { "pin_weight_selection", "spread" },
        { "resident_module_budget_gb", "0" },
        { "resident_module_patterns", "" },
        { "resident_module_selection", "spread" },
        { "load_safetensors_backend", "" },
        { "verbose", "false" },
        { "show_profile", "true" },
        { "vmm_native_transport", "false" },
        { "vmm_resident_weight_budget_gb", "0" },
        { "vmm_staging_buffer_gb", "0.625" },
        { "vmm_source_cache_gb", "0" },
        { "vmm_source_registered_gb", "0" },
        { "vmm_module_pattern", ".*" },
        { "vmm_page_mb", "0" },
        { "vmm_dxgi_local_headroom_gb", "0" },
        { "vmm_dxgi_shared_headroom_gb", "0" },
        { "vmm_dxgi_system_headroom_gb", "0" },
        { "vmm_component_tensor_ownership", "false" },
        { "vmm_component_buffer_limit_mb", "1" },
        { "vmm_native_source_cache_slot_mb", "0" },
        { "vmm_native_source_cache_slots", "0" },
        { "vmm_host_cache_gb", "0" },
        { "vmm_pin_source_weights", "false" },
        { "vmm_execution_backing_reclaim", "false" },
        { "backend", "linear" },
        { "preset", "" },
        { "use_environment", "true" },
    };
    for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++) {
        T_CHECK_MSG(strcmp(val(c, d[i].key), d[i].value) == 0, "%s = \"%s\", want \"%s\"", d[i].key,
                    val(c, d[i].key), d[i].value);
        T_EQ_STR(src(c, d[i].key), "default");
    }
    const ddo__options *o = ddo__config_options(c);
    T_EQ_INT(o->small_tensor_threshold_bytes, 16384);
    T_NEAR(o->vmm_staging_buffer_gb, 0.625, 0);
    T_EQ_INT(o->target_module_classes.count, 2);
    T_EQ_STR(o->target_module_classes.items[1], "Embedding");
    ddo_settings s;
    T_EQ_INT(ddo_config_settings(c, &s), 0);
    T_CHECK(!s.enabled);
    T_EQ_STR(s.effective_preset, "");
    T_EQ_STR(s.route, "off");
    ddo_config_destroy(c);
    ddo_config_destroy(NULL);
}

static void test_iteration(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_count(), DDO_OPT_COUNT);
    ddo_config_item it;
    T_EQ_INT(ddo_config_entry(c, 0, &it), 0);
    T_EQ_STR(it.key, "backend");
    T_EQ_STR(it.env, "DDO_BACKEND");
    T_EQ_STR(it.flag, "--ddo-backend");
    T_EQ_INT(it.type, DDO_OPTION_ENUM);
    T_EQ_STR(it.source, "default");
    size_t i = (size_t)ddo__config_find("vmm_source_cache_gb");
    T_EQ_INT(ddo_config_entry(c, i, &it), 0);
    T_EQ_STR(it.env, "DDO_VMM_SOURCE_CACHE_GB");
    T_EQ_STR(it.flag, "--ddo-vmm-source-cache-gb");
    T_EQ_INT(it.type, DDO_OPTION_SIZE_GB);
    T_EQ_INT(ddo_config_entry(c, ddo_config_count(), &it), DDO_E_INVALID_ARGUMENT);
    /* The uniform naming rule holds for every row that has an env and a flag. */
    for (size_t k = 0; k < ddo_config_count(); k++) {
        ddo_config_entry(c, k, &it);
        if (it.flag[0] == '\0' || strcmp(it.key, "small_tensor_threshold_bytes") == 0 ||
            strcmp(it.key, "always_resident_modules_pattern") == 0)
            continue;
        char env[128], flag[128];
        snprintf(env, sizeof(env), "DDO_%s", it.key);
        snprintf(flag, sizeof(flag), "--ddo-%s", it.key);
        for (char *p = env; *p; p++)
            *p = (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
        for (char *p = flag; *p; p++)
            *p = *p == '_' ? '-' : *p;
        T_EQ_STR(it.env, env);
        T_EQ_STR(it.flag, flag);
    }
    ddo_config_destroy(c);
}

static void test_set_get_typed(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_set(c, "vmm_source_cache_gb", "12.5"), 0);
    double d = 0;
    T_EQ_INT(ddo_config_get_double(c, "vmm_source_cache_gb", &d), 0);
    T_NEAR(d, 12.5, 0);
    T_EQ_STR(src(c, "vmm_source_cache_gb"), "api");
    T_EQ_INT(ddo_config_set_int(c, "pin_cpu_workers", 7), 0);
    int64_t i = 0;
    T_EQ_INT(ddo_config_get_int(c, "pin_cpu_workers", &i), 0);
    T_EQ_INT(i, 7);
    T_EQ_INT(ddo_config_set_double(c, "vmm_staging_buffer_gb", 0.25), 0);
    T_EQ_STR(val(c, "vmm_staging_buffer_gb"), "0.25");
    T_EQ_INT(ddo_config_set_bool(c, "verbose", true), 0);
    bool b = false;
    T_EQ_INT(ddo_config_get_bool(c, "verbose", &b), 0);
    T_CHECK(b);
    T_EQ_INT(ddo_config_set(c, "small_tensor_threshold_bytes", "4096"), 0);
    T_EQ_INT(ddo__config_options(c)->small_tensor_threshold_bytes, 4096);
    T_EQ_INT(ddo_config_set(c, "skip_modules_pattern", "a.b, c;d"), 0);
    T_EQ_STR(val(c, "skip_modules_pattern"), "a.b,c,d");

    /* Errors: unknown key (nearest suggested), wrong type, bad value; nothing changes. */
    T_EQ_INT(ddo_config_set(c, "pin_cpu_worker", "3"), DDO_E_NOT_FOUND);
    T_EQ_STR(ddo_config_error(c),
             "ddo_config_set: unknown option \"pin_cpu_worker\" (nearest: pin_cpu_workers)");
    T_EQ_INT(ddo_config_set_bool(c, "pin_cpu_workers", true), DDO_E_CONFIG);
    T_EQ_INT(ddo_config_get_bool(c, "pin_cpu_workers", &b), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_config_set(c, "pin_cpu_workers", "abc"), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c), "pin_cpu_workers=\"abc\": expected an integer");
    T_EQ_INT(ddo_config_set_double(c, "pin_cpu_workers", 2.5), DDO_E_CONFIG);
    T_EQ_INT(ddo_config_get_int(c, "pin_cpu_workers", &i), 0);
    T_EQ_INT(i, 7);
    T_EQ_INT(ddo_config_set(c, "verbose", "maybe"), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c),
             "verbose=\"maybe\": expected a boolean (1, true, yes, on or 0, false, no, off)");
    T_EQ_INT(ddo_config_set(c, "pin_weight_selection", "biggest"), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c),
             "pin_weight_selection=\"biggest\": expected one of first, spread, largest");
    T_EQ_INT(ddo_config_set(c, "preset", "windows_fast"), DDO_E_CONFIG);
    T_EQ_STR(val(c, "preset"), "");
    ddo_config_destroy(c);
}

static void test_clone_is_deep(void)
{
    ddo_config *a = new_cfg(), *b = NULL;
    T_REQUIRE(a != NULL);
    T_EQ_INT(ddo_config_set(a, "resident_module_patterns", "x,y"), 0);
    T_EQ_INT(ddo_config_set_component_policy(a, "vae", "route", "none"), 0);
    T_EQ_INT(ddo_config_clone(a, &b), 0);
    T_REQUIRE(b != NULL);
    T_EQ_INT(ddo_config_set(a, "resident_module_patterns", "z"), 0);
    ddo_config_destroy(a);
    T_EQ_STR(val(b, "resident_module_patterns"), "x,y");
    T_EQ_STR(src(b, "resident_module_patterns"), "api");
    const char *r;
    T_EQ_INT(ddo__config_component_route(b, "vae", &r), 0);
    T_EQ_STR(r, "none");
    ddo_config_destroy(b);
}

/* A list from its elements keeps a ',' or ';' inside a pattern (a regex quantifier). */
static void test_override_list(void)
{
    ddo_config *c = new_cfg(), *d = NULL;
    T_REQUIRE(c != NULL);
    const char *items[] = { "blocks\\.\\d{1,2}\\.attn", "a;b", "" };
    T_EQ_INT(ddo_config_override_list(c, "always_resident_modules_pattern", items, 3), 0);
    const ddo__strlist *l = &ddo__config_options(c)->always_resident_modules_pattern;
    T_EQ_INT((long long)l->count, 2); /* the empty element dropped */
    T_EQ_STR(l->items[0], items[0]);
    T_EQ_STR(l->items[1], "a;b");
    T_EQ_STR(src(c, "always_resident_modules_pattern"), "argument");
    const char *env[] = { "DDO_ALWAYS_RESIDENT_MODULES_PATTERN=x", NULL };
    T_EQ_INT(ddo_config_apply_env(c, env), 0); /* an argument wins over DDO_* */
    T_EQ_INT(ddo_config_clone(c, &d), 0);
    T_EQ_INT((long long)ddo__config_options(d)->always_resident_modules_pattern.count, 2);
    T_EQ_STR(ddo__config_options(d)->always_resident_modules_pattern.items[0], items[0]);
    ddo_config_destroy(d);
    T_EQ_INT(ddo_config_override_list(c, "always_resident_modules_pattern", NULL, 0), 0);
    T_EQ_INT((long long)ddo__config_options(c)->always_resident_modules_pattern.count, 0);
    T_EQ_INT(ddo_config_override_list(c, "pin_cpu_workers", items, 1), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c), "pin_cpu_workers: not a list option");
    T_EQ_INT(ddo_config_override_list(c, "always_resident_module_pattern", items, 1),
             DDO_E_NOT_FOUND);
    const char *holes[] = { "x", NULL };
    T_EQ_INT(ddo_config_override_list(c, "skip_modules_pattern", holes, 2), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_config_override_list(c, "skip_modules_pattern", NULL, 1), DDO_E_INVALID_ARGUMENT);
    const char *many[DDO__CONFIG_MAX_LIST_ITEMS + 1];
    for (size_t i = 0; i < DDO_ARRAY_LEN(many); i++)
        many[i] = "p";
    T_EQ_INT(ddo_config_override_list(c, "skip_modules_pattern", many, DDO_ARRAY_LEN(many)),
             DDO_E_CONFIG);
    T_CONTAINS(ddo_config_error(c), "patterns, more than the");
    T_EQ_INT(ddo_config_override_list(c, "skip_modules_pattern", many, DDO_ARRAY_LEN(many) - 1), 0);
    ddo_config_destroy(c);
    /* At the API rank the environment wins, as over ddo_config_set. */
    T_REQUIRE((c = new_cfg()) != NULL);
    T_EQ_INT(ddo_config_set_list(c, "skip_modules_pattern", items, 2), 0);
    T_EQ_STR(src(c, "skip_modules_pattern"), "api");
    T_EQ_STR(ddo__config_options(c)->skip_modules_pattern.items[1], "a;b");
    const char *env2[] = { "DDO_SKIP_MODULES_PATTERN=x;y", NULL };
    T_EQ_INT(ddo_config_apply_env(c, env2), 0);
    T_EQ_INT((long long)ddo__config_options(c)->skip_modules_pattern.count, 2);
    T_EQ_STR(ddo__config_options(c)->skip_modules_pattern.items[1], "y");
    ddo_config_destroy(c);
}

static void test_boolean_vocabulary(void)
{
    static const char *const truthy[] = { "1", "true", "TRUE", "Yes", " on ", "On\t" };
    static const char *const falsy[] = { "0", "false", "no", "off", "", "2", "y", "enabled", "-1" };
    char buf[64];
    for (size_t i = 0; i < sizeof(truthy) / sizeof(truthy[0]); i++) {
        snprintf(buf, sizeof(buf), "DDO_VERBOSE=%s", truthy[i]);
        const char *env[] = { buf, NULL };
        ddo_config *c = env_cfg(env);
        T_REQUIRE(c != NULL);
        T_CHECK_MSG(strcmp(val(c, "verbose"), "true") == 0, "\"%s\"", truthy[i]);
        T_EQ_STR(src(c, "verbose"), "env:DDO_VERBOSE");
        ddo_config_destroy(c);
    }
    for (size_t i = 0; i < sizeof(falsy) / sizeof(falsy[0]); i++) {
        /* cache_plan defaults to true, so false must come from the variable. */
        snprintf(buf, sizeof(buf), "DDO_CACHE_PLAN=%s", falsy[i]);
        const char *env[] = { buf, NULL };
        ddo_config *c = env_cfg(env);
        T_REQUIRE(c != NULL);
        T_CHECK_MSG(strcmp(val(c, "cache_plan"), "false") == 0, "\"%s\"", falsy[i]);
        ddo_config_destroy(c);
    }
    /* Flags and the API are strict. */
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_set(c, "cache_plan", " OFF "), 0);
    T_EQ_STR(val(c, "cache_plan"), "false");
    T_EQ_INT(ddo_config_set(c, "cache_plan", "2"), DDO_E_CONFIG);
    ddo_config_destroy(c);
}

static void test_env_parsing(void)
{
    const char *env[] = { "DDO_RESIDENT_MODULE_PATTERNS= a.b , ;c\\d+;; ",
                          "DDO_VMM_SOURCE_CACHE_GB=1.5",
                          "DDO_VMM_PAGE_MB=2.5",
                          "DDO_SMALL_TENSOR_THRESHOLD_KB=2048",
                          "DDO_EXECUTION_MODE= Linear_Runtime ",
                          "DDO_PINNED_WEIGHT_CACHE_NAMESPACE= ns ",
                          "PATH=/usr/bin",
                          "NOT_DDO_X=1",
                          NULL };
    ddo_config *c = env_cfg(env);
    T_REQUIRE(c != NULL);
    const ddo__options *o = ddo__config_options(c);
    T_EQ_INT(o->resident_module_patterns.count, 2);
    T_EQ_STR(o->resident_module_patterns.items[0], "a.b");
    T_EQ_STR(o->resident_module_patterns.items[1], "c\\d+");
    T_NEAR(o->vmm_source_cache_gb, 1.5, 0);
    T_NEAR(o->vmm_page_mb, 2.5, 0);
    T_EQ_INT(o->small_tensor_threshold_bytes, 2097152);
    T_EQ_STR(src(c, "small_tensor_threshold_bytes"), "env:DDO_SMALL_TENSOR_THRESHOLD_KB");
    T_EQ_STR(o->execution_mode, "linear_runtime");
    T_EQ_STR(o->pinned_weight_cache_namespace, " ns ");
    T_EQ_INT(ddo_config_warning_count(c), 0);
    ddo_config_destroy(c);

    const char *e1[] = { "DDO_PIN_CPU_WORKERS=abc", NULL };
    env_fails(e1, "DDO_PIN_CPU_WORKERS=\"abc\": expected an integer");
    const char *e2[] = { "DDO_PIN_CPU_WORKERS=2.5", NULL };
    env_fails(e2, "DDO_PIN_CPU_WORKERS=\"2.5\": expected an integer");
    const char *e3[] = { "DDO_RESIDENT_MODULE_BUDGET_GB=", NULL };
    env_fails(e3, "DDO_RESIDENT_MODULE_BUDGET_GB=\"\": expected a number");
    const char *e4[] = { "DDO_VMM_SOURCE_CACHE_GB=4GB", NULL };
    env_fails(e4, "DDO_VMM_SOURCE_CACHE_GB=\"4GB\": expected a number");
    const char *e5[] = { "DDO_EXECUTION_MODE=fast", NULL };
    env_fails(e5, "DDO_EXECUTION_MODE=\"fast\": expected one of plan, linear_runtime, "
                  "vmm_runtime, vmm_fast_runtime");
    const char *e6[] = { "DDO_SMALL_TENSOR_THRESHOLD_KB=1.5", NULL };
    env_fails(e6, "DDO_SMALL_TENSOR_THRESHOLD_KB=\"1.5\": expected an integer");
    const char *e7[] = { "DDO_VMM_STAGING_BUFFER_GB=nan", NULL };
    env_fails(e7, "DDO_VMM_STAGING_BUFFER_GB=\"nan\": expected a number");

    /* A failing block leaves the config as it was. */
    c = new_cfg();
    T_REQUIRE(c != NULL);
    const char *e8[] = { "DDO_PRESET=one_shot_fast", "DDO_VERBOSE=1", "DDO_PIN_CPU_WORKERS=x",
                         NULL };
    T_EQ_INT(ddo_config_apply_env(c, e8), DDO_E_CONFIG);
    T_EQ_STR(val(c, "verbose"), "false");
    T_EQ_STR(val(c, "execution_mode"), "plan");
    T_EQ_STR(val(c, "small_tensor_threshold_bytes"), "16384");
    ddo_config_destroy(c);
}

static void test_set_even_empty_wins_over_preset(void)
{
    const char *env[] = { "DDO_PRESET=one_shot_fast", "DDO_RESIDENT_MODULE_PATTERNS=",
                          "DDO_PIN_CPU_MEMORY=", "DDO_AVAILABLE_SYSTEM_RAM_GB= ", NULL };
    ddo_config *c = env_cfg(env);
    T_REQUIRE(c != NULL);
    T_EQ_STR(val(c, "resident_module_patterns"), "");
    T_EQ_STR(src(c, "resident_module_patterns"), "env:DDO_RESIDENT_MODULE_PATTERNS");
    T_EQ_STR(val(c, "pin_cpu_memory"), "false");
    T_EQ_STR(src(c, "pin_cpu_memory"), "env:DDO_PIN_CPU_MEMORY");
    /* An empty RAM variable means "detect". */
    T_EQ_STR(src(c, "available_system_ram_gb"), "default");
    T_EQ_STR(val(c, "auto_budget_policy"), "balanced");
    T_EQ_STR(src(c, "auto_budget_policy"), "preset:one_shot_fast");
    ddo_config_destroy(c);
    /* DDO_PRESET="" means no preset. */
    const char *e2[] = { "DDO_PRESET=", NULL };
    c = env_cfg(e2);
    T_REQUIRE(c != NULL);
    ddo_settings s;
    ddo_config_settings(c, &s);
    T_EQ_STR(s.effective_preset, "");
    T_EQ_STR(val(c, "execution_mode"), "plan");
    ddo_config_destroy(c);
}

static void test_from_env_defaults(void)
{
    const char *env[] = { NULL };
    ddo_config *c = env_cfg(env);
    T_REQUIRE(c != NULL);
    T_EQ_STR(val(c, "small_tensor_threshold_bytes"), "16384");
    T_EQ_STR(val(c, "pin_cpu_workers"), "4");
    T_EQ_STR(val(c, "always_resident_modules_pattern"), DDO_DEFAULT_ALWAYS_RESIDENT_PATTERN);
    T_EQ_STR(val(c, "show_profile"), "false");
    T_EQ_STR(src(c, "pin_cpu_workers"), "default");
    double ram = -1;
    T_EQ_INT(ddo_config_get_double(c, "available_system_ram_gb", &ram), 0);
    T_CHECK(ram > 0.0);
    T_NEAR(ram * 10000.0, round(ram * 10000.0), 1e-6);
    T_EQ_STR(val(c, "execution_mode"), "plan");
    ddo_config_destroy(c);
    /* A preset overrides them (low_ram_safe: 1 worker); explicit API values survive. */
    const char *e2[] = { "DDO_PRESET=low_ram_safe", NULL };
    c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_set(c, "show_profile", "true"), 0);
    T_EQ_INT(ddo_config_apply_env(c, e2), 0);
    T_EQ_STR(val(c, "pin_cpu_workers"), "1");
    T_EQ_STR(src(c, "pin_cpu_workers"), "preset:low_ram_safe");
    T_EQ_STR(val(c, "show_profile"), "true");
    T_EQ_STR(src(c, "show_profile"), "api");
    ddo_config_destroy(c);
}

static void test_precedence(void)
{
    /* preset < api, in either call order */
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_set(c, "resident_module_budget_gb", "2"), 0);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "low_ram_safe"), 0);
    T_EQ_STR(val(c, "resident_module_budget_gb"), "2");
    T_EQ_STR(src(c, "resident_module_budget_gb"), "api");
    T_EQ_INT(ddo_config_set(c, "pin_cpu_workers", "3"), 0);
    T_EQ_STR(val(c, "pin_cpu_workers"), "3");
    T_EQ_STR(src(c, "pin_cpu_workers"), "api");

    /* api < env, in either call order */
    const char *env[] = { "DDO_RESIDENT_MODULE_BUDGET_GB=5", NULL };
    T_EQ_INT(ddo_config_apply_env(c, env), 0);
    T_EQ_STR(val(c, "resident_module_budget_gb"), "5");
    T_EQ_STR(src(c, "resident_module_budget_gb"), "env:DDO_RESIDENT_MODULE_BUDGET_GB");
    T_EQ_INT(ddo_config_set(c, "resident_module_budget_gb", "1"), 0);
    T_EQ_STR(val(c, "resident_module_budget_gb"), "5");
    /* the preset chosen through the API survives an environment without DDO_PRESET */
    T_EQ_STR(val(c, "preset"), "low_ram_safe");
    T_EQ_STR(val(c, "pin_cpu_workers"), "3");

    /* env < flag */
    char a0[] = "host", a1[] = "--ddo-resident-module-budget-gb=7";
    char *argv[] = { a0, a1, NULL };
    int argc = 2;
    T_EQ_INT(ddo_config_parse_args(c, &argc, argv), 0);
    T_EQ_STR(val(c, "resident_module_budget_gb"), "7");
    T_EQ_STR(src(c, "resident_module_budget_gb"), "flag");
    /* a later environment does not undo a flag */
    T_EQ_INT(ddo_config_apply_env(c, env), 0);
    T_EQ_STR(val(c, "resident_module_budget_gb"), "7");
    ddo_config_destroy(c);

    /* env DDO_PRESET beats an API preset; a flag preset beats both */
    c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "warm_process"), 0);
    const char *e2[] = { "DDO_PRESET=wsl_compat", NULL };
    T_EQ_INT(ddo_config_apply_env(c, e2), 0);
    T_EQ_STR(c->effective_preset, "wsl_compat");
    T_EQ_STR(val(c, "cache_pinned_weights"), "false");
    char b1[] = "--ddo-preset", b2[] = "off";
    char *argv2[] = { a0, b1, b2, NULL };
    argc = 3;
    T_EQ_INT(ddo_config_parse_args(c, &argc, argv2), 0);
    T_EQ_STR(c->effective_preset, "off");
    T_EQ_STR(val(c, "execution_mode"), "plan");
    T_EQ_STR(src(c, "execution_mode"), "preset:off");
    ddo_config_destroy(c);
}

static void test_safetensors_alias(void)
{
    const char *e1[] = { "DDO_SAFETENSORS_BACKEND=MMAP", NULL };
    ddo_config *c = env_cfg(e1);
    T_REQUIRE(c != NULL);
    T_EQ_STR(val(c, "load_safetensors_backend"), "mmap");
    T_EQ_STR(src(c, "load_safetensors_backend"), "env:DDO_SAFETENSORS_BACKEND");
    T_EQ_INT(ddo_config_warning_count(c), 0);
    ddo_config_destroy(c);
    const char *e2[] = { "DDO_SAFETENSORS_BACKEND=mmap", "DDO_LOAD_SAFETENSORS_BACKEND=pread",
                         NULL };
    c = env_cfg(e2);
    T_REQUIRE(c != NULL);
    T_EQ_STR(val(c, "load_safetensors_backend"), "pread");
    ddo_config_destroy(c);
    /* The canonical variable set to "" resolves empty, so the alias applies. */
    const char *e3[] = { "DDO_LOAD_SAFETENSORS_BACKEND=", "DDO_SAFETENSORS_BACKEND=mmap", NULL };
    c = env_cfg(e3);
    T_REQUIRE(c != NULL);
    T_EQ_STR(val(c, "load_safetensors_backend"), "mmap");
    ddo_config_destroy(c);
    const char *e4[] = { "DDO_SAFETENSORS_BACKEND=fast", NULL };
    env_fails(e4, "DDO_SAFETENSORS_BACKEND=\"fast\": expected one of \"\", pread, mmap");
}

static void test_unknown_variable_warnings(void)
{
    const char *env[] = { "DDO_PIN_CPU_WORKER=3",
                          "DDO_FOO=1",
                          "DDO_TRANSFORMER_ROUTE=dynamic",
                          "DDO_TEXT_ENCODER_OFFLOAD_TYPE=leaf_level",
                          "DDO_RUNNER_WIDTH=1024",
                          "DDO_PURGE_WINDOWS_STANDBY_BEFORE_RUN=1",
                          "DDO_VMM_LIBRARY_PATH=/x",
                          "DDO_VMM_ALLOCATOR_ROOT=/y",
                          "DDO_PROFILE_DIR=/tmp",
                          "DDO_TEST_DATA=/d",
                          "DDO_BIN=/b",
                          "DDO_SOURCE_DIR=/s",
                          "DDO_BUILD_DIR=/o",
                          "DDO_VMM_SOURCE_CACHE=4",
                          NULL };
    ddo_config *c = env_cfg(env);
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_warning_count(c), 3);
    T_EQ_STR(ddo_config_warning(c, 0),
             "unknown environment variable DDO_PIN_CPU_WORKER ignored (did you mean "
             "DDO_PIN_CPU_WORKERS?)");
    T_EQ_STR(ddo_config_warning(c, 1), "unknown environment variable DDO_FOO ignored");
    T_EQ_STR(ddo_config_warning(c, 2),
             "unknown environment variable DDO_VMM_SOURCE_CACHE ignored (did you mean "
             "DDO_VMM_SOURCE_CACHE_GB?)");
    T_CHECK(ddo_config_warning(c, 3) == NULL);
    /* Warnings describe the latest block. */
    const char *e2[] = { NULL };
    T_EQ_INT(ddo_config_apply_env(c, e2), 0);
    T_EQ_INT(ddo_config_warning_count(c), 0);
    ddo_config_destroy(c);
}

static void test_parse_args(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    char a0[] = "host", a1[] = "input.safetensors", a2[] = "--ddo-pin-cpu-workers", a3[] = "6",
         a4[] = "--steps", a5[] = "3", a6[] = "--ddo-verbose", a7[] = "--ddo-plan", a8[] = "no",
         a9[] = "--ddo-small-tensor-threshold-kb=64", a10[] = "--", a11[] = "--ddo-verbose=0";
    char *argv[] = { a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, NULL };
    int argc = 12;
    T_EQ_INT(ddo_config_parse_args(c, &argc, argv), 0);
    T_EQ_INT(argc, 6);
    T_EQ_STR(argv[0], "host");
    T_EQ_STR(argv[1], "input.safetensors");
    T_EQ_STR(argv[2], "--steps");
    T_EQ_STR(argv[3], "3");
    T_EQ_STR(argv[4], "--");
    T_EQ_STR(argv[5], "--ddo-verbose=0");
    T_CHECK(argv[6] == NULL);
    T_EQ_STR(val(c, "pin_cpu_workers"), "6");
    T_EQ_STR(src(c, "pin_cpu_workers"), "flag");
    T_EQ_STR(val(c, "verbose"), "true");
    T_EQ_STR(val(c, "plan"), "false");
    T_EQ_STR(val(c, "small_tensor_threshold_bytes"), "65536");
    /* The helper's default preset is auto -> one_shot_fast; no environment defaults. */
    ddo_settings s;
    ddo_config_settings(c, &s);
    T_EQ_STR(s.requested_preset, "auto");
    T_EQ_STR(s.effective_preset, "one_shot_fast");
    T_EQ_STR(val(c, "show_profile"), "true");
    T_EQ_STR(val(c, "available_system_ram_gb"), "0");
    ddo_config_destroy(c);

    /* Errors leave argv and the config untouched. */
    c = new_cfg();
    T_REQUIRE(c != NULL);
    char b1[] = "--ddo-pin-cpu-worker=2", b2[] = "--ddo-pin-cpu-workers", b3[] = "--ddo-wat";
    char *argv2[] = { a0, a1, b1, NULL };
    argc = 3;
    T_EQ_INT(ddo_config_parse_args(c, &argc, argv2), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c),
             "unknown flag --ddo-pin-cpu-worker (did you mean --ddo-pin-cpu-workers?)");
    T_EQ_INT(argc, 3);
    T_EQ_STR(argv2[1], "input.safetensors");
    char *argv3[] = { a0, b2, NULL };
    argc = 2;
    T_EQ_INT(ddo_config_parse_args(c, &argc, argv3), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c), "--ddo-pin-cpu-workers: expects a value");
    char *argv4[] = { a0, b3, NULL };
    argc = 2;
    T_EQ_INT(ddo_config_parse_args(c, &argc, argv4), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c),
             "unknown flag --ddo-wat (`ddo config --list` lists every --ddo-* flag)");
    char b4[] = "--ddo-pin-cpu-workers=x";
    char *argv5[] = { a0, b4, NULL };
    argc = 2;
    T_EQ_INT(ddo_config_parse_args(c, &argc, argv5), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c), "--ddo-pin-cpu-workers=\"x\": expected an integer");
    T_EQ_STR(val(c, "preset"), "");
    ddo_config_destroy(c);

    const char *help = ddo_config_flags_help();
    T_CONTAINS(help, "  --ddo-vmm-total-staging-gb GIB\n");
    T_CONTAINS(help, "  --ddo-backend WORD\n");
    T_CONTAINS(help, "(default 16 KiB; DDO_SMALL_TENSOR_THRESHOLD_KB)");
    T_CHECK(strstr(help, "use_environment") == NULL);
    T_CHECK(help == ddo_config_flags_help());
}

/* Parses flags into a fresh config; returns it or NULL. */
static ddo_config *flags(const char *const *args)
{
    char *argv[16];
    int argc = 0;
    static char host[] = "host";
    argv[argc++] = host;
    for (; *args != NULL && argc < 15; args++)
        argv[argc++] = (char *)*args;
    argv[argc] = NULL;
    ddo_config *c = new_cfg();
    if (c != NULL && ddo_config_parse_args(c, &argc, argv) != 0) {
        ddo_config_destroy(c);
        return NULL;
    }
    return c;
}

static void test_total_staging_translation(void)
{
    const char *a1[] = { "--ddo-backend",
                         "vmm",
                         "--ddo-preset",
                         "nvme_baseline",
                         "--ddo-vmm-total-staging-gb",
                         "2",
                         NULL };
    ddo_config *c = flags(a1);
    T_REQUIRE(c != NULL);
    T_EQ_STR(val(c, "vmm_staging_buffer_gb"), "1");
    T_EQ_STR(src(c, "vmm_staging_buffer_gb"), "flag");
    T_EQ_STR(val(c, "vmm_resident_weight_budget_gb"), "4");
    T_EQ_STR(src(c, "vmm_resident_weight_budget_gb"), "preset:nvme_baseline");
    ddo_config_destroy(c);
    const char *a2[] = { "--ddo-backend=vmm", "--ddo-vmm-total-staging-gb=2", NULL };
    c = flags(a2);
    T_REQUIRE(c != NULL);
    T_EQ_STR(val(c, "execution_mode"), "vmm_fast_runtime");
    T_EQ_STR(val(c, "vmm_staging_buffer_gb"), "2");
    ddo_config_destroy(c);
    const char *a3[] = { "--ddo-backend", "vmm", "--ddo-vmm-resident-weight-budget-gb", "8", NULL };
    c = flags(a3);
    T_REQUIRE(c != NULL);
    T_EQ_STR(val(c, "vmm_staging_buffer_gb"), "0.625");
    T_EQ_STR(src(c, "vmm_staging_buffer_gb"), "default");
    T_EQ_STR(val(c, "vmm_resident_weight_budget_gb"), "8");
    ddo_config_destroy(c);
    /* An explicit staging buffer flag wins over the total. */
    const char *a4[] = { "--ddo-backend",
                         "vmm",
                         "--ddo-vmm-staging-buffer-gb",
                         "0.5",
                         "--ddo-vmm-total-staging-gb",
                         "3",
                         NULL };
    c = flags(a4);
    T_REQUIRE(c != NULL);
    T_EQ_STR(val(c, "vmm_staging_buffer_gb"), "0.5");
    ddo_config_destroy(c);
    /* Linear routes ignore it. */
    const char *a5[] = { "--ddo-vmm-total-staging-gb", "3", NULL };
    c = flags(a5);
    T_REQUIRE(c != NULL);
    T_EQ_STR(val(c, "vmm_staging_buffer_gb"), "0.625");
    ddo_config_destroy(c);
    /* Through the environment too (the tool's path). */
    const char *env[] = { "DDO_BACKEND=vmm", "DDO_PRESET=nvme_baseline",
                          "DDO_VMM_TOTAL_STAGING_GB=1.5", NULL };
    c = env_cfg(env);
    T_REQUIRE(c != NULL);
    T_EQ_STR(val(c, "vmm_staging_buffer_gb"), "0.75");
    T_EQ_STR(src(c, "vmm_staging_buffer_gb"), "env:DDO_VMM_TOTAL_STAGING_GB");
    ddo_config_destroy(c);
}

/* Sets key=value pairs through the API, validates, and checks the exact message. */
static void invalid(const char *const *kv, const char *msg)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    for (; kv[0] != NULL; kv += 2)
        T_EQ_INT(ddo_config_set(c, kv[0], kv[1]), 0);
    T_EQ_INT(ddo_config_validate(c), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c), msg);
    ddo_config_destroy(c);
}

static void test_validation_errors(void)
{
    const char *v1[] = { "vmm_source_cache_gb", "4", "vmm_source_registered_gb", "8", NULL };
    invalid(v1, "vmm_source_registered_gb=8 (api) exceeds vmm_source_cache_gb=4 (api): "
                "registration must fit within the retained storage");
    const char *v2[] = { "vmm_source_cache_gb", "8", "vmm_source_registered_gb", "1.01", NULL };
    invalid(v2, "vmm_source_registered_gb=1.01 (api): explicit registration must be whole 64 "
                "MiB segments (a multiple of 0.0625 GiB)");
    const char *v3[] = { "backend", "vmm", "execution_mode", "vmm_runtime", NULL };
    invalid(v3, "vmm_resident_weight_budget_gb=0 (default): execution_mode=vmm_runtime (api) "
                "needs a positive mapped weight budget in GiB");
    const char *v4[] = { "vmm_execution_backing_reclaim", "1", NULL };
    invalid(v4, "vmm_execution_backing_reclaim=true (api) needs the native fast route "
                "(execution_mode=vmm_fast_runtime), but execution_mode=plan (default)");
    const char *v5[] = { "execution_mode", "vmm_fast_runtime", NULL };
    invalid(v5, "execution_mode=vmm_fast_runtime (api) needs backend=vmm, but backend=linear "
                "(default): native VMM is never chosen silently; pass --ddo-backend vmm");
    const char *v6[] = { "execution_device", "gpu", NULL };
    invalid(v6, "execution_device=\"gpu\" (api): unknown device (expected cpu, cpu:N, cuda or "
                "cuda:N)");
    const char *v6b[] = { "execution_device", "cuda:", NULL };
    invalid(v6b, "execution_device=\"cuda:\" (api): unknown device (expected cpu, cpu:N, cuda or "
                 "cuda:N)");
    const char *v7[] = { "build_profile", "true", NULL };
    invalid(v7, "build_profile=true (api) needs profile_name: a calibration is saved under a "
                "workload name");
    const char *v9[] = { "vmm_native_source_cache_slots", "4", NULL };
    invalid(v9, "vmm_native_source_cache_slots=4 (api) and vmm_native_source_cache_slot_mb=0 "
                "(default): the legacy micro-cache takes a slot count and a slot size together "
                "(both 0 keeps it off)");
    const char *v10[] = { "backend", "vmm", "execution_mode", "linear_runtime", NULL };
    invalid(v10, "execution_mode=linear_runtime (api) conflicts with backend=vmm (api): the vmm "
                 "backend runs vmm_fast_runtime, vmm_runtime or plan");
    const char *v11[] = { "vmm_component_tensor_ownership", "yes", NULL };
    invalid(v11, "vmm_component_tensor_ownership=true (api) needs the native fast route "
                 "(execution_mode=vmm_fast_runtime), but execution_mode=plan (default)");
    const char *v12[] = { "offload_device", "cuda", NULL };
    invalid(v12, "offload_device=\"cuda\" (api): expected cpu (inactive weights are kept in host "
                 "memory)");
    /* The source in a message is where the value came from. */
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    const char *env[] = { "DDO_EXECUTION_MODE=vmm_fast_runtime", NULL };
    T_EQ_INT(ddo_config_apply_env(c, env), 0);
    T_EQ_INT(ddo_config_validate(c), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c),
             "execution_mode=vmm_fast_runtime (env:DDO_EXECUTION_MODE) needs backend=vmm, but "
             "backend=linear (default): native VMM is never chosen silently; pass --ddo-backend "
             "vmm");
    ddo_config_destroy(c);
}

/* Issue 14 class 1: every numeric value is range-checked when it is stored, before any cast,
 * with the value quoted as given (escaped) and the catalog range in the unit of the input. */
static void test_numbers_checked_before_use(void)
{
    static const struct {
        const char *env, *msg;
    } bad[] = {
        { "DDO_VMM_PAGE_MB=1e308",
          "DDO_VMM_PAGE_MB=\"1e308\": above the range 0..1048576 MiB of vmm_page_mb" },
        { "DDO_PIN_CPU_WORKERS=9223372036854775807",
          "DDO_PIN_CPU_WORKERS=\"9223372036854775807\": above the range 1..1024 of "
          "pin_cpu_workers" },
        { "DDO_PIN_CPU_WORKERS=99999999999999999999", /* past int64: ERANGE */
          "DDO_PIN_CPU_WORKERS=\"99999999999999999999\": expected an integer" },
        { "DDO_RESIDENT_MODULE_BUDGET_GB=-1",
          "DDO_RESIDENT_MODULE_BUDGET_GB=\"-1\": below the range 0..1000000000 GiB of "
          "resident_module_budget_gb" },
        { "DDO_VMM_SOURCE_CACHE_GB=-0.5e-3",
          "DDO_VMM_SOURCE_CACHE_GB=\"-0.5e-3\": below the range 0..1000000000 GiB of "
          "vmm_source_cache_gb" },
        { "DDO_EXECUTION_SLOTS=1e3", "DDO_EXECUTION_SLOTS=\"1e3\": expected an integer" },
        { "DDO_EXECUTION_SLOTS=5000",
          "DDO_EXECUTION_SLOTS=\"5000\": above the range 0..4096 of execution_slots" },
        { "DDO_SMALL_TENSOR_THRESHOLD_KB=2147483648",
          "DDO_SMALL_TENSOR_THRESHOLD_KB=\"2147483648\": above the range 0..1073741824 KiB of "
          "small_tensor_threshold_bytes" },
        { "DDO_VMM_STAGING_BUFFER_GB=0x10",
          "DDO_VMM_STAGING_BUFFER_GB=\"0x10\": expected a number" },
        { "DDO_VMM_STAGING_BUFFER_GB=inf", "DDO_VMM_STAGING_BUFFER_GB=\"inf\": expected a number" },
        { "DDO_VMM_STAGING_BUFFER_GB=-nan",
          "DDO_VMM_STAGING_BUFFER_GB=\"-nan\": expected a number" },
        { "DDO_VMM_STAGING_BUFFER_GB=1e999",
          "DDO_VMM_STAGING_BUFFER_GB=\"1e999\": expected a number" },
        { "DDO_VMM_STAGING_BUFFER_GB= 1", "DDO_VMM_STAGING_BUFFER_GB=\" 1\": expected a number" },
        { "DDO_VMM_STAGING_BUFFER_GB=1 ", "DDO_VMM_STAGING_BUFFER_GB=\"1 \": expected a number" },
        { "DDO_VMM_STAGING_BUFFER_GB=1e", "DDO_VMM_STAGING_BUFFER_GB=\"1e\": expected a number" },
        { "DDO_VMM_STAGING_BUFFER_GB=1\n2",
          "DDO_VMM_STAGING_BUFFER_GB=\"1\\n2\": expected a number" },
        { "DDO_PIN_CPU_WORKERS=0x10", "DDO_PIN_CPU_WORKERS=\"0x10\": expected an integer" },
        { "DDO_PIN_CPU_WORKERS=+", "DDO_PIN_CPU_WORKERS=\"+\": expected an integer" },
        { "DDO_EXECUTION_MODE=\x1b[31mplan",
          "DDO_EXECUTION_MODE=\"\\x1b[31mplan\": expected one of plan, linear_runtime, "
          "vmm_runtime, vmm_fast_runtime" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *env[] = { bad[i].env, NULL };
        env_fails(env, bad[i].msg);
    }
    /* Decimal forms that are numbers: signs, exponents, a leading point. */
    const char *good[] = { "DDO_VMM_STAGING_BUFFER_GB=+.5", "DDO_VMM_SOURCE_CACHE_GB=1E+1",
                           "DDO_PIN_CPU_WORKERS=+8", "DDO_VMM_PAGE_MB=1048576", NULL };
    ddo_config *c = env_cfg(good);
    T_REQUIRE(c != NULL);
    T_EQ_STR(val(c, "vmm_staging_buffer_gb"), "0.5");
    T_EQ_STR(val(c, "vmm_source_cache_gb"), "10");
    T_EQ_STR(val(c, "pin_cpu_workers"), "8");
    T_EQ_STR(val(c, "vmm_page_mb"), "1048576");
    ddo_config_destroy(c);

    /* Flags: the same rule, the flag named; a failing flag leaves nothing half-set. */
    c = new_cfg();
    T_REQUIRE(c != NULL);
    char a0[] = "host", a1[] = "--ddo-vmm-page-mb", a2[] = "1e308";
    char *argv[] = { a0, a1, a2, NULL };
    int argc = 3;
    T_EQ_INT(ddo_config_parse_args(c, &argc, argv), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c),
             "--ddo-vmm-page-mb=\"1e308\": above the range 0..1048576 MiB of vmm_page_mb");
    T_EQ_STR(val(c, "vmm_page_mb"), "0");

    /* The API: doubles and integers alike. */
    T_EQ_INT(ddo_config_set_double(c, "max_pin_weight_budget_gb", -2.5), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c), "max_pin_weight_budget_gb=\"-2.5\": below the range "
                                  "0..1000000000 GiB of max_pin_weight_budget_gb");
    T_EQ_INT(ddo_config_set_int(c, "pin_cpu_workers", INT64_MAX), DDO_E_CONFIG);
    T_EQ_INT(ddo_config_set_double(c, "execution_slots", 1e300), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c),
             "execution_slots=1e+300: expected a whole number within the range of the option");
    T_EQ_INT(ddo_config_set(c, "small_tensor_threshold_bytes", "1099511627777"), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c), "small_tensor_threshold_bytes=\"1099511627777\": above the "
                                  "range 0..1099511627776 bytes of small_tensor_threshold_bytes");
    /* Text and list bounds: a value is at most 64 KiB, a list at most 256 patterns. */
    char *big = malloc(70000);
    T_REQUIRE(big != NULL);
    memset(big, 'a', 69999);
    big[69999] = '\0';
    T_EQ_INT(ddo_config_set(c, "profile_dir", big), DDO_E_CONFIG);
    T_CONTAINS(ddo_config_error(c), ": 69999 bytes, more than the 65536 a value may hold");
    for (size_t i = 0; i < 69999; i++)
        big[i] = i % 2 ? ',' : 'x';
    big[2 * 257 - 1] = '\0'; /* 257 patterns */
    T_EQ_INT(ddo_config_set(c, "skip_modules_pattern", big), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c),
             "skip_modules_pattern: 257 patterns, more than the 256 a list may hold");
    big[2 * 256 - 1] = '\0';
    T_EQ_INT(ddo_config_set(c, "skip_modules_pattern", big), 0);
    free(big);
    /* What validate clamps (upstream) stays accepted when stored. */
    T_EQ_INT(ddo_config_set(c, "pin_weight_budget_ratio", "-3"), 0);
    T_EQ_INT(ddo_config_set(c, "pin_cpu_workers", "-3"), 0);
    T_EQ_INT(ddo__config_check_ranges(c), 0);
    T_EQ_INT(ddo_config_validate(c), 0);
    T_EQ_STR(val(c, "pin_weight_budget_ratio"), "0");
    T_EQ_STR(val(c, "pin_cpu_workers"), "1");
    ddo_config_destroy(c);
}

/* The quoting of values in messages: escapes, and a cut that stays inside the buffer; every
 * message that quotes a value the user gave stays one line. */
static void test_quote(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_set(c, "execution_device", "cu\nda"), 0);
    T_EQ_INT(ddo_config_validate(c), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c),
             "execution_device=\"cu\\nda\" (api): unknown device (expected cpu, cpu:N, cuda or "
             "cuda:N)");
    ddo_config_destroy(c);
    const char *e1[] = { "DDO_PRESET=fast\x1b[0m", NULL };
    env_fails(e1, "Invalid DDO_PRESET='fast\\x1b[0m'. Valid presets: auto, "
                  "diffusers_leaf_offload_compat, diffusers_offload_compat, low_ram_safe, off, "
                  "one_shot_fast, warm_process, wsl_compat (backend linear); auto, nvme_baseline "
                  "(backend vmm)");
    c = new_cfg();
    T_REQUIRE(c != NULL);
    char a0[] = "host", a1[] = "--ddo-\tbogus";
    char *argv[] = { a0, a1, NULL };
    int argc = 2;
    T_EQ_INT(ddo_config_parse_args(c, &argc, argv), DDO_E_CONFIG);
    T_CONTAINS(ddo_config_error(c), "unknown flag --ddo-\\tbogus");
    const char *e2[] = { "DDO_VMM_PAGE\nMB=1", NULL };
    T_EQ_INT(ddo_config_apply_env(c, e2), 0);
    T_EQ_U64(ddo_config_warning_count(c), 1);
    T_CONTAINS(ddo_config_warning(c, 0), "unknown environment variable DDO_VMM_PAGE\\nMB ignored");
    ddo_config_destroy(c);

    char b[16];
    ddo__config_quote("a\"b\\c\t\x7f", b, sizeof(b));
    T_EQ_STR(b, "a\\\"b\\\\c\\t\\x7f");
    ddo__config_quote("0123456789abcdefghij", b, sizeof(b));
    T_EQ_STR(b, "0123456789ab...");
    ddo__config_quote("0123456789abcde", b, sizeof(b)); /* fits exactly: no cut */
    T_EQ_STR(b, "0123456789abcde");
    ddo__config_quote("0123456789abc\n", b, sizeof(b)); /* the escape just fits */
    T_EQ_STR(b, "0123456789abc\\n");
    ddo__config_quote("0123456789abcd\n", b, sizeof(b)); /* the escape does not fit */
    T_EQ_STR(b, "0123456789ab...");
    ddo__config_quote(NULL, b, sizeof(b));
    T_EQ_STR(b, "");
}

static void test_validation_accepts_and_clamps(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_validate(c), 0);
    T_EQ_INT(ddo_config_set(c, "pin_weight_budget_ratio", "1.5"), 0);
    T_EQ_INT(ddo_config_set(c, "pin_cpu_workers", "0"), 0);
    T_EQ_INT(ddo_config_set(c, "execution_device", "cuda:1"), 0);
    T_EQ_INT(ddo_config_set(c, "vmm_source_cache_gb", "8"), 0);
    T_EQ_INT(ddo_config_set(c, "vmm_source_registered_gb", "1.0625"), 0);
    T_EQ_INT(ddo_config_validate(c), 0);
    T_EQ_STR(val(c, "pin_weight_budget_ratio"), "1");
    T_EQ_STR(src(c, "pin_weight_budget_ratio"), "api");
    T_NEAR(ddo__config_options(c)->pin_weight_budget_ratio, 1.0, 0);
    T_EQ_STR(val(c, "pin_cpu_workers"), "1");
    T_EQ_INT(ddo_config_set(c, "pin_weight_budget_ratio", "-0.25"), 0);
    T_EQ_INT(ddo_config_validate(c), 0);
    T_EQ_STR(val(c, "pin_weight_budget_ratio"), "0");
    T_EQ_INT(ddo_config_set(c, "execution_device", "cpu"), 0);
    T_EQ_INT(ddo_config_set(c, "build_profile", "1"), 0);
    T_EQ_INT(ddo_config_set(c, "profile_name", "flux"), 0);
    T_EQ_INT(ddo_config_validate(c), 0);
    ddo_config_destroy(c);
    /* The vmm fast route with reclaim and registration is valid. */
    const char *a[] = { "--ddo-backend",
                        "vmm",
                        "--ddo-vmm-execution-backing-reclaim",
                        "--ddo-vmm-source-cache-gb",
                        "24",
                        "--ddo-vmm-source-registered-gb",
                        "20",
                        NULL };
    char *argv[16];
    int argc = 0;
    char host[] = "host";
    argv[argc++] = host;
    for (const char *const *p = a; *p != NULL; p++)
        argv[argc++] = (char *)*p;
    argv[argc] = NULL;
    c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_parse_args(c, &argc, argv), 0);
    T_EQ_INT(argc, 1);
    T_EQ_INT(ddo_config_validate(c), 0);
    ddo_config_destroy(c);
}

static void test_component_names_and_aliases(void)
{
    static const struct {
        const char *word, *route;
    } aliases[] = {
        { "auto", "dynamic_offload" }, /* settings enabled by the preset */
        { "dynamic_offload", "dynamic_offload" },
        { "dynamic", "dynamic_offload" },
        { "DDO", "dynamic_offload" },
        { "diffusers_group_offload", "diffusers_group_offload" },
        { "diffusers", "diffusers_group_offload" },
        { "diffusers_group", "diffusers_group_offload" },
        { "group", "diffusers_group_offload" },
        { " Group_Offload ", "diffusers_group_offload" },
        { "none", "none" },
        { "cuda", "none" },
        { "standard", "none" },
        { "off", "none" },
    };
    char buf[96];
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++) {
        snprintf(buf, sizeof(buf), "DDO_TEXT_ENCODER_2_ROUTE=%s", aliases[i].word);
        const char *env[] = { "DDO_PRESET=warm_process", buf, NULL };
        ddo_config *c = env_cfg(env);
        T_REQUIRE(c != NULL);
        ddo_component_policy p;
        T_EQ_INT(ddo_config_component_policy(c, "Text-Encoder  2", NULL, false, &p), 0);
        T_CHECK_MSG(strcmp(p.route, aliases[i].route) == 0, "%s -> %s", aliases[i].word, p.route);
        ddo_config_destroy(c);
    }
    const char *env[] = { "DDO_MODEL_ROUTE=none", "DDO_VAE_ROUTE=sideways", NULL };
    ddo_config *c = env_cfg(env);
    T_REQUIRE(c != NULL);
    const char *r = NULL;
    T_EQ_INT(ddo__config_component_route(c, "", &r), 0);
    T_EQ_STR(r, "none");
    T_EQ_INT(ddo__config_component_route(c, "!!", &r), 0);
    T_EQ_STR(r, "none");
    T_EQ_INT(ddo__config_component_route(c, "__vae__", &r), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c),
             "component VAE: route \"sideways\" (env:DDO_VAE_ROUTE): expected auto, "
             "dynamic_offload, diffusers_group_offload or none (aliases: dynamic, ddo; diffusers, "
             "diffusers_group, group, group_offload; cuda, standard, off)");
    T_EQ_INT(ddo_config_set_component_policy(c, "vae", "colour", "red"), DDO_E_NOT_FOUND);
    const char *v = NULL;
    char source[64];
    T_EQ_INT(ddo_config_component_value(c, "model", "ROUTE", &v, source, sizeof(source)), 0);
    T_EQ_STR(v, "none");
    T_EQ_STR(source, "env:DDO_MODEL_ROUTE");
    T_EQ_INT(ddo_config_component_value(c, "model", "offload_type", &v, NULL, 0), DDO_E_NOT_FOUND);
    ddo_config_destroy(c);
}

static void test_component_lookup_order(void)
{
    /* DDO_<C>_* wins over DDO_RUNNER_<C>_*, which wins over the preset's runner value. */
    const char *e1[] = { "DDO_PRESET=one_shot_fast", "DDO_TEXT_ENCODER_GROUP_OFFLOAD=0",
                         "DDO_RUNNER_TEXT_ENCODER_GROUP_OFFLOAD=1", NULL };
    ddo_config *c = env_cfg(e1);
    T_REQUIRE(c != NULL);
    ddo_component_policy p;
    T_EQ_INT(ddo_config_component_policy(c, "text_encoder", NULL, false, &p), 0);
    /* group off (DDO_ wins over DDO_RUNNER_), dynamic off (the preset's runner value) */
    T_EQ_STR(p.route, "none");
    T_EQ_STR(p.route_source, "auto: preset:one_shot_fast");
    ddo_config_destroy(c);
    /* An empty DDO_<C>_* falls through to the runner alias. */
    const char *e2[] = { "DDO_TRANSFORMER_ROUTE=", "DDO_RUNNER_TRANSFORMER_ROUTE=none", NULL };
    c = env_cfg(e2);
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_component_policy(c, "transformer", NULL, false, &p), 0);
    T_EQ_STR(p.route, "none");
    T_EQ_STR(p.route_source, "env:DDO_RUNNER_TRANSFORMER_ROUTE");
    /* An explicit API policy wins over the environment. */
    T_EQ_INT(ddo_config_set_component_policy(c, "transformer", "route", "ddo"), 0);
    T_EQ_INT(ddo_config_component_policy(c, "transformer", NULL, false, &p), 0);
    T_EQ_STR(p.route, "dynamic_offload");
    T_EQ_STR(p.route_source, "api");
    ddo_config_destroy(c);
    /* The runner variable of the environment beats the preset's. */
    const char *e3[] = { "DDO_PRESET=one_shot_fast", "DDO_RUNNER_TEXT_ENCODER_OFFLOAD_STREAM=0",
                         NULL };
    c = env_cfg(e3);
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_component_policy(c, "text_encoder", NULL, false, &p), 0);
    T_EQ_STR(p.route, "diffusers_group_offload");
    T_CHECK(!p.use_stream);
    /* Calibration needs the dynamic route. */
    T_EQ_INT(ddo_config_set(c, "build_profile", "1"), 0);
    T_EQ_INT(ddo_config_component_policy(c, "text_encoder", NULL, false, &p), DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c), "component TEXT_ENCODER: Profile calibration requires the "
                                  "dynamic_offload route (build_profile=true, route "
                                  "diffusers_group_offload)");
    ddo_config_destroy(c);
}

/* The VAE rule: a host's explicit config or overrides bypass a preset's VAE route. */
static void test_component_vae_overrides(void)
{
    static const char bypass[] = "explicit config/overrides bypass the preset's VAE route";
    const char *e1[] = { "DDO_PRESET=one_shot_fast", NULL };
    ddo_config *c = env_cfg(e1);
    T_REQUIRE(c != NULL);
    ddo_component_policy p;
    /* Without overrides the preset's leaf offload without a stream stays. */
    T_EQ_INT(ddo_config_component_policy_with_overrides(c, "vae", NULL, false, false, &p), 0);
    T_EQ_STR(p.route, "diffusers_group_offload");
    T_EQ_STR(p.route_source, "auto: preset:one_shot_fast");
    T_CHECK(!p.use_stream);
    /* With them the VAE routes as without that preset entry: dynamic (settings enabled). */
    T_EQ_INT(ddo_config_component_policy_with_overrides(c, "__Vae__", NULL, false, true, &p), 0);
    T_EQ_STR(p.route, "dynamic_offload");
    T_EQ_STR(p.route_source, bypass);
    T_EQ_STR(p.unit_granularity, "block");
    /* Another component, or an explicit route, is never bypassed. */
    T_EQ_INT(ddo_config_component_policy_with_overrides(c, "text_encoder", NULL, false, true, &p),
             0);
    T_EQ_STR(p.route, "diffusers_group_offload");
    T_EQ_STR(p.route_source, "auto: preset:one_shot_fast");
    T_EQ_INT(ddo_config_component_policy_with_overrides(c, "vae", "group", false, true, &p), 0);
    T_EQ_STR(p.route, "diffusers_group_offload");
    T_EQ_STR(p.route_source, "argument");
    /* The plain call is the same as without overrides. */
    T_EQ_INT(ddo_config_component_policy(c, "vae", NULL, false, &p), 0);
    T_EQ_STR(p.route, "diffusers_group_offload");
    /* An API policy is kept. */
    T_EQ_INT(ddo_config_set_component_policy(c, "vae", "route", "none"), 0);
    T_EQ_INT(ddo_config_component_policy_with_overrides(c, "vae", NULL, false, true, &p), 0);
    T_EQ_STR(p.route, "none");
    T_EQ_STR(p.route_source, "api");
    ddo_config_destroy(c);
    /* A preset's explicit VAE route is bypassed too; one from the environment is kept. */
    const char *e2[] = { "DDO_PRESET=wsl_compat", NULL };
    c = env_cfg(e2);
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_component_policy_with_overrides(c, "vae", NULL, false, false, &p), 0);
    T_EQ_STR(p.route, "none");
    T_EQ_STR(p.route_source, "preset:wsl_compat");
    T_EQ_INT(ddo_config_component_policy_with_overrides(c, "vae", NULL, false, true, &p), 0);
    T_EQ_STR(p.route, "dynamic_offload");
    T_EQ_STR(p.route_source, bypass);
    ddo_config_destroy(c);
    const char *e3[] = { "DDO_PRESET=wsl_compat", "DDO_VAE_ROUTE=group", NULL };
    c = env_cfg(e3);
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_component_policy_with_overrides(c, "vae", NULL, false, true, &p), 0);
    T_EQ_STR(p.route, "diffusers_group_offload");
    T_EQ_STR(p.route_source, "env:DDO_VAE_ROUTE");
    ddo_config_destroy(c);
    /* Settings disabled (plan mode): the bypassed VAE is unmanaged. */
    const char *e4[] = { "DDO_PRESET=one_shot_fast", "DDO_EXECUTION_MODE=plan", NULL };
    c = env_cfg(e4);
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_component_policy_with_overrides(c, "vae", NULL, false, true, &p), 0);
    T_EQ_STR(p.route, "none");
    T_EQ_STR(p.route_source, bypass);
    T_EQ_STR(p.unit_granularity, "");
    /* The preset's route is resolved first: its errors come before the bypass. */
    T_EQ_INT(ddo_config_set(c, "build_profile", "1"), 0);
    T_EQ_INT(ddo_config_component_policy_with_overrides(c, "vae", NULL, false, true, &p),
             DDO_E_CONFIG);
    T_EQ_STR(ddo_config_error(c), "component VAE: Profile calibration requires the "
                                  "dynamic_offload route (build_profile=true, route "
                                  "diffusers_group_offload)");
    T_EQ_INT(ddo_config_component_policy_with_overrides(c, "vae", NULL, false, true, NULL),
             DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_config_component_policy_with_overrides(NULL, "vae", NULL, false, true, &p),
             DDO_E_INVALID_ARGUMENT);
    ddo_config_destroy(c);
}

static void test_use_environment_false(void)
{
    ddo_config *c = new_cfg();
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_set_bool(c, "use_environment", false), 0);
    const char *env[] = { "DDO_PRESET=low_ram_safe",    "DDO_VERBOSE=1",
                          "DDO_TRANSFORMER_ROUTE=none", "DDO_BOGUS=1",
                          "DDO_PIN_CPU_WORKERS=abc",    NULL };
    T_EQ_INT(ddo_config_apply_env(c, env), 0);
    T_EQ_STR(val(c, "verbose"), "false");
    T_EQ_STR(val(c, "preset"), "");
    T_EQ_INT(ddo_config_warning_count(c), 0);
    T_EQ_STR(val(c, "pin_cpu_workers"), "4"); /* from_env default, no environment */
    T_EQ_INT(ddo_config_apply_preset(c, "linear", "auto"), 0);
    const char *r;
    T_EQ_INT(ddo__config_component_route(c, "transformer", &r), 0);
    T_EQ_STR(r, "dynamic_offload");
    ddo_config_destroy(c);
    /* With the environment, the same block routes the transformer to none. */
    const char *e2[] = { "DDO_PRESET=auto", "DDO_TRANSFORMER_ROUTE=none", NULL };
    c = env_cfg(e2);
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo__config_component_route(c, "transformer", &r), 0);
    T_EQ_STR(r, "none");
    /* Turning the environment off afterwards also stops the captured routes. */
    T_EQ_INT(ddo_config_set(c, "use_environment", "false"), 0);
    T_EQ_INT(ddo__config_component_route(c, "transformer", &r), 0);
    T_EQ_STR(r, "dynamic_offload");
    ddo_config_destroy(c);
}

static void test_json(void)
{
    const char *env[] = { "DDO_PRESET=one_shot_fast", "DDO_PIN_CPU_WORKERS=9", "DDO_XYZ=1", NULL };
    ddo_config *c = env_cfg(env);
    T_REQUIRE(c != NULL);
    T_EQ_INT(ddo_config_set_component_policy(c, "vae", "route", "none"), 0);
    char *text = NULL;
    T_EQ_INT(ddo_config_to_json(c, &text), 0);
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    ddo_free(text);
    T_REQUIRE(root != NULL);
    json_t *opts = json_object_get(root, "options");
    T_EQ_INT(json_object_size(opts), ddo_config_count());
    json_t *w = json_object_get(opts, "pin_cpu_workers");
    T_EQ_INT(json_integer_value(json_object_get(w, "value")), 9);
    T_EQ_STR(json_string_value(json_object_get(w, "source")), "env:DDO_PIN_CPU_WORKERS");
    json_t *rp = json_object_get(json_object_get(opts, "resident_module_patterns"), "value");
    T_CHECK(json_is_array(rp));
    T_EQ_STR(json_string_value(json_array_get(rp, 0)), "auto");
    T_CHECK(json_is_true(json_object_get(json_object_get(opts, "cache_plan"), "value")));
    json_t *st = json_object_get(root, "settings");
    T_EQ_STR(json_string_value(json_object_get(st, "effective_preset")), "one_shot_fast");
    T_EQ_STR(json_string_value(json_object_get(st, "route")), "one_shot_fast");
    T_CHECK(json_is_true(json_object_get(st, "enabled")));
    T_EQ_STR(json_string_value(json_object_get(
                 json_object_get(json_object_get(st, "component_policies"), "VAE"), "route")),
             "none");
    json_t *comps = json_object_get(root, "components");
    T_EQ_STR(json_string_value(json_object_get(json_object_get(comps, "vae"), "route")), "none");
    T_EQ_STR(json_string_value(json_object_get(json_object_get(comps, "text_encoder"), "route")),
             "diffusers_group_offload");
    T_EQ_INT(json_array_size(json_object_get(root, "warnings")), 1);
    json_decref(root);
    ddo_config_destroy(c);
}

static void test_describe(void)
{
    char *md = NULL, *list = NULL;
    T_EQ_INT(ddo_config_describe(DDO_CONFIG_DOC_MARKDOWN, &md), 0);
    T_EQ_INT(ddo_config_describe(DDO_CONFIG_DOC_LIST, &list), 0);
    for (size_t i = 0; i < ddo_config_count(); i++) {
        char needle[128];
        snprintf(needle, sizeof(needle), "| `%s` |", ddo__optdescs[i].key);
        T_CONTAINS(md, needle);
        snprintf(needle, sizeof(needle), "\n%s (", ddo__optdescs[i].key);
        T_CONTAINS(list, needle);
    }
    T_CONTAINS(md, "*(compatible API: Python only; ddo also accepts env and flag)*");
    T_CONTAINS(md,
               "*(compatible API: not currently parsed from ENV; ddo also accepts the variable)*");
    T_CONTAINS(md, "| `DDO_RUNNER_VAE_ROUTE` |");
    T_CONTAINS(md, "## Resolution order");
    T_CONTAINS(md, "`--ddo-vmm-total-staging-gb T`");
    ddo_free(md);
    ddo_free(list);
    T_EQ_INT(ddo_config_describe((ddo_config_doc)7, &md), DDO_E_INVALID_ARGUMENT);
}

int main(void)
{
    T_RUN(test_dataclass_defaults);
    T_RUN(test_iteration);
    T_RUN(test_set_get_typed);
    T_RUN(test_clone_is_deep);
    T_RUN(test_override_list);
    T_RUN(test_boolean_vocabulary);
    T_RUN(test_env_parsing);
    T_RUN(test_set_even_empty_wins_over_preset);
    T_RUN(test_from_env_defaults);
    T_RUN(test_precedence);
    T_RUN(test_safetensors_alias);
    T_RUN(test_unknown_variable_warnings);
    T_RUN(test_parse_args);
    T_RUN(test_total_staging_translation);
    T_RUN(test_validation_errors);
    T_RUN(test_validation_accepts_and_clamps);
    T_RUN(test_numbers_checked_before_use);
    T_RUN(test_quote);
    T_RUN(test_component_names_and_aliases);
    T_RUN(test_component_lookup_order);
    T_RUN(test_component_vae_overrides);
    T_RUN(test_use_environment_false);
    T_RUN(test_json);
    T_RUN(test_describe);
    return t_done();
}
