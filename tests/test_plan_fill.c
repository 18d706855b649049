/*
 * test_plan_fill.c - a device budget is used: the real layouts of data/layouts (full size,
 * planning only) under a ladder of budgets. Whenever the model does not fit, the device
 * weights' peak is within one unit of the budget and never above it; when it fits, nothing
 * streams and the plan says so; the predicted step never rises as the budget grows.
 * ctest-labels: unit
 */
#include "base/common.h"
#include "plan_fx.h"
#include "t.h"

#include <jansson.h>

static const char *const layouts[] = { "flux1-dev", "wan2.1-t2v-14b", "sd3.5-large",
                                       "ltx-video-13b", "qwen-image" };
static const double ladder_gb[] = { 1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 28, 32, 48 };

/* The layout's tensors into tb (data NULL); false when the file cannot be read. */
static bool load_layout(const char *name, fx_table *tb)
{
    char path[512];
    const char *src = getenv("DDO_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/data/layouts/%s.json", src != NULL ? src : ".", name);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (root == NULL)
        return false;
    json_t *tensors = json_object_get(root, "tensors");
    size_t i;
    json_t *t;
    json_array_foreach(tensors, i, t)
    {
        ddo_dtype dt = DDO_DTYPE_BF16;
        json_t *shape = json_object_get(t, "shape");
        uint64_t d[5] = { 1, 1, 1, 1, 1 };
        size_t nd = json_array_size(shape);
        for (size_t k = 0; k < nd && k < 5; k++)
            d[k] = (uint64_t)json_integer_value(json_array_get(shape, k));
        if (ddo_dtype_from_name(json_string_value(json_object_get(t, "dtype")), &dt) != 0)
            dt = DDO_DTYPE_BF16;
        fx_add(tb, dt, json_string_value(json_object_get(t, "name")), (uint32_t)nd, d[0], d[1],
               d[2], d[3], d[4]);
    }
    json_decref(root);
    return tb->n > 0;
}

/* The page-rounded span of the largest unit that streams at any budget: one unit's slack. */
static uint64_t largest_span(const ddo_plan *p)
{
    uint64_t largest = 0;
    for (size_t u = 0; u < ddo_plan_unit_count(p); u++) {
        ddo_unit_info ui;
        if (ddo_plan_unit(p, u, &ui) == 0 && ui.bytes > largest)
            largest = ui.bytes;
    }
    return largest;
}

static void ladder(const char *name)
{
    fx_table tb = { 0 };
    T_REQUIRE(load_layout(name, &tb));
    ddo_checkpoint *ck = fx_checkpoint(&tb);
    T_REQUIRE(ck != NULL);
    /* An H200-like device: the budget, not the card, is the limit. */
    ddo_plan_inputs in = { .size = sizeof(ddo_plan_inputs),
                           .device_total_bytes = 140 * fx_gib(1),
                           .bus_bytes_per_s = 55e9,
                           .flops_per_s = 400e12,
                           .tokens = 4096 };
    double prev_step = 0.0;
    uint64_t unit = 0;
    for (size_t k = 0; k < sizeof(ladder_gb) / sizeof(ladder_gb[0]); k++) {
        ddo_config *cfg = NULL;
        T_REQUIRE(ddo_config_create(&cfg) == 0);
        char v[32];
        snprintf(v, sizeof(v), "%g", ladder_gb[k]);
        T_REQUIRE(ddo_config_set(cfg, "device_budget_gb", v) == 0);
        ddo_plan *p = NULL;
        int rc = ddo_plan_build(ck, cfg, &in, &p);
        ddo_config_destroy(cfg);
        if (rc != 0) {
            /* Refused only where no plan fits: two slots of the largest unit do not. */
            T_EQ_INT(rc, DDO_E_BUDGET);
            T_CONTAINS(ddo_last_error(), "is too small for any plan: unit");
            T_CHECK_MSG(prev_step == 0.0, "%s: refused at %s GiB after a smaller budget planned",
                        name, v);
            printf("  %s %5s GiB: refused: %s\n", name, v, ddo_last_error());
            continue;
        }
        ddo_plan_budgets bg;
        T_REQUIRE(ddo_plan_budgets_get(p, &bg) == 0);
        if (unit == 0)
            unit = largest_span(p);
        uint64_t limit = ddo__gb_to_bytes(ladder_gb[k]);
        T_EQ_U64(bg.device_weights_limit, limit);
        T_CHECK_MSG(bg.device_weights_peak <= limit, "%s at %s GiB: peak %llu", name, v,
                    (unsigned long long)bg.device_weights_peak);
        const char *rule = ddo__plan_decision_get(p, "resident_set_rule");
        T_CHECK_MSG(rule != NULL && strncmp(rule, "fill", 4) == 0, "%s: rule %s", name,
                    rule != NULL ? rule : "(none)");
        if (bg.slot_count > 0) {
            /* Streams: the budget is used to within one unit (2 MiB pages of slack). */
            T_CHECK_MSG(bg.device_weights_peak + unit + 2 * DDO_MIB >= limit,
                        "%s at %s GiB: peak %.3f GiB leaves more than one unit (%.3f GiB)", name, v,
                        (double)bg.device_weights_peak / (double)DDO_GIB,
                        (double)unit / (double)DDO_GIB);
        } else {
            T_EQ_STR(fx_decision(p, "resident_set_rule"), "fill_all_fits");
            T_CONTAINS(fx_decision(p, "plan_note"), "nothing streams");
        }
        double step = bg.predicted_step_s;
        T_CHECK(step > 0.0);
        T_CHECK_MSG(prev_step == 0.0 || step <= prev_step * (1.0 + 1e-9),
                    "%s: the step rose from %.6f s to %.6f s at %s GiB", name, prev_step, step, v);
        printf("  %s %5s GiB: peak %6.2f GiB, %zu slots, step %.4f s (%s)\n", name, v,
               (double)bg.device_weights_peak / (double)DDO_GIB, bg.slot_count, step, rule);
        prev_step = step;
        ddo_plan_destroy(p);
    }
    ddo_checkpoint_destroy(ck);
    fx_free(&tb);
}

static void test_layouts_fill_the_budget(void)
{
    for (size_t i = 0; i < sizeof(layouts) / sizeof(layouts[0]); i++)
        ladder(layouts[i]);
}

/* Two budgets under both names are refused naming both; the same value twice is one budget;
 * an explicit 0 is refused; a budget above the device is capped with a note; a device limit
 * above the device is refused with the device's size, and below it caps the plan. */
static void test_budget_names_and_limits(void)
{
    fx_table tb = { 0 };
    T_REQUIRE(load_layout("flux1-dev", &tb));
    ddo_checkpoint *ck = fx_checkpoint(&tb);
    T_REQUIRE(ck != NULL);
    ddo_plan_inputs in = { .size = sizeof(ddo_plan_inputs),
                           .device_total_bytes = 24 * fx_gib(1),
                           .device_free_bytes = 23 * fx_gib(1),
                           .bus_bytes_per_s = 25e9,
                           .flops_per_s = 150e12 };
    ddo_config *cfg = NULL;
    ddo_plan *p = NULL;
    T_REQUIRE(ddo_config_create(&cfg) == 0);
    T_REQUIRE(ddo_config_set(cfg, "device_budget_gb", "8") == 0);
    T_REQUIRE(ddo_config_set(cfg, "vmm_resident_weight_budget_gb", "6") == 0);
    T_EQ_INT(ddo_plan_build(ck, cfg, &in, &p), DDO_E_CONFIG);
    T_EQ_STR(ddo_last_error(), "device_budget_gb=8 and vmm_resident_weight_budget_gb=6 (its older "
                               "name) give two different device budgets; give one");
    T_REQUIRE(ddo_config_set(cfg, "vmm_resident_weight_budget_gb", "8") == 0);
    T_EQ_INT(ddo_plan_build(ck, cfg, &in, &p), 0);
    T_EQ_STR(fx_decision(p, "device_weights_limit_source"), "device_budget_gb");
    ddo_plan_destroy(p);
    ddo_config_destroy(cfg);

    T_REQUIRE(ddo_config_create(&cfg) == 0);
    T_REQUIRE(ddo_config_set(cfg, "device_budget_gb", "0") == 0);
    T_EQ_INT(ddo_plan_build(ck, cfg, &in, &p), DDO_E_CONFIG);
    T_CONTAINS(ddo_last_error(), "device_budget_gb=0: a device budget must be positive");
    T_CHECK(ddo_config_set(cfg, "device_budget_gb", "-1") != 0);
    T_REQUIRE(ddo_config_set(cfg, "device_budget_gb", "100") == 0);
    T_EQ_INT(ddo_plan_build(ck, cfg, &in, &p), 0);
    ddo_plan_budgets bg;
    T_REQUIRE(ddo_plan_budgets_get(p, &bg) == 0);
    T_EQ_U64(bg.device_weights_limit, 24 * fx_gib(1));
    T_EQ_STR(fx_decision(p, "device_budget_note"),
             "device_budget_gb 100.00 GiB is above the device memory 24.00 GiB: capped to it");
    ddo_plan_destroy(p);
    ddo_config_destroy(cfg);

    T_REQUIRE(ddo_config_create(&cfg) == 0);
    T_REQUIRE(ddo_config_set(cfg, "device_memory_limit_gb", "32") == 0);
    T_EQ_INT(ddo_plan_build(ck, cfg, &in, &p), DDO_E_CONFIG);
    T_EQ_STR(ddo_last_error(), "device_memory_limit_gb=32 is above the device's memory (24.00 "
                               "GiB); give at most that, or 0 for the whole device");
    /* An 8 GiB card emulated on the 24 GiB one (1 GiB of it in use): the preset auto sizes
     * the plan from it, and the plan reports that card. */
    T_REQUIRE(ddo_config_set(cfg, "device_memory_limit_gb", "8") == 0);
    T_REQUIRE(ddo_config_apply_preset(cfg, "linear", "auto") == 0);
    T_REQUIRE(ddo_config_set(cfg, "preset", "auto") == 0);
    T_EQ_INT(ddo_plan_build(ck, cfg, &in, &p), 0);
    T_REQUIRE(ddo_plan_budgets_get(p, &bg) == 0);
    T_CHECK(bg.device_weights_peak <= 7 * fx_gib(1));
    T_CHECK(bg.device_weights_peak > 5 * fx_gib(1));
    T_CONTAINS(fx_decision(p, "device_weights_limit_source"),
               "device memory 8.00 GiB (free 7.00 GiB) minus");
    T_CONTAINS(fx_decision(p, "device_weights_limit_source"), "activation reserve");
    T_EQ_STR(fx_decision(p, "resident_set_rule"), "fill_cost");
    ddo_plan_destroy(p);
    ddo_config_destroy(cfg);
    ddo_checkpoint_destroy(ck);
    fx_free(&tb);
}

/* The user's resident rule wins over filling: an explicit resident budget of 0 streams all. */
static void test_user_resident_rule_wins(void)
{
    fx_table tb = { 0 };
    T_REQUIRE(load_layout("wan2.1-t2v-14b", &tb));
    ddo_checkpoint *ck = fx_checkpoint(&tb);
    T_REQUIRE(ck != NULL);
    ddo_plan_inputs in = { .size = sizeof(ddo_plan_inputs),
                           .device_total_bytes = 140 * fx_gib(1),
                           .bus_bytes_per_s = 55e9,
                           .flops_per_s = 400e12 };
    ddo_config *cfg = NULL;
    ddo_plan *p = NULL;
    T_REQUIRE(ddo_config_create(&cfg) == 0);
    T_REQUIRE(ddo_config_set(cfg, "vmm_resident_weight_budget_gb", "16") == 0);
    T_REQUIRE(ddo_config_set(cfg, "resident_module_budget_gb", "0") == 0);
    T_EQ_INT(ddo_plan_build(ck, cfg, &in, &p), 0);
    T_EQ_STR(fx_decision(p, "resident_set_rule"), "resident_module_budget_gb");
    ddo_plan_budgets bg;
    T_REQUIRE(ddo_plan_budgets_get(p, &bg) == 0);
    T_CHECK(bg.resident_bytes < ((uint64_t)64 << 20)); /* small tensors only: no block */
    T_CHECK(bg.device_weights_peak <= 16 * fx_gib(1));
    /* The deepest automatic ring: the embedders between the last block and the next step's
     * first fill a shallower window at the seam (docs/plan.md, "Device geometry"). */
    T_EQ_INT((int)bg.slot_count, 8);
    T_EQ_STR(fx_decision(p, "slot_count_decision"), "simulated");
    ddo_plan_destroy(p);
    /* The same budget alone: ~14 GiB of blocks resident (the Wan 2.1 case). */
    ddo_config_destroy(cfg);
    T_REQUIRE(ddo_config_create(&cfg) == 0);
    T_REQUIRE(ddo_config_set(cfg, "vmm_resident_weight_budget_gb", "16") == 0);
    T_EQ_INT(ddo_plan_build(ck, cfg, &in, &p), 0);
    T_EQ_STR(fx_decision(p, "resident_set_rule"), "fill_cost");
    T_REQUIRE(ddo_plan_budgets_get(p, &bg) == 0);
    T_CHECK(bg.resident_bytes > 13 * fx_gib(1));
    ddo_plan_destroy(p);
    ddo_config_destroy(cfg);
    ddo_checkpoint_destroy(ck);
    fx_free(&tb);
}

/* A plan that fills the budget registers every streamed byte it retains (the balanced policy's
 * 0.75 ladder would leave 4.5 GB of Flux pageable on an 8 GiB card: on the H200 that step took
 * 2.25 x the bus bound); a pin ratio of the user's keeps its partial registration. */
static void test_fill_registers_what_streams(void)
{
    fx_table tb = { 0 };
    T_REQUIRE(load_layout("flux1-dev", &tb));
    ddo_checkpoint *ck = fx_checkpoint(&tb);
    T_REQUIRE(ck != NULL);
    ddo_plan_inputs in = { .size = sizeof(ddo_plan_inputs),
                           .device_total_bytes = 140 * fx_gib(1),
                           .device_free_bytes = 139 * fx_gib(1),
                           .host_available_bytes = 120 * fx_gib(1),
                           .bus_bytes_per_s = 55e9,
                           .flops_per_s = 400e12,
                           .tokens = 4608 };
    for (int user_ratio = 0; user_ratio < 2; user_ratio++) {
        ddo_config *cfg = NULL;
        ddo_plan *p = NULL;
        T_REQUIRE(ddo_config_create(&cfg) == 0);
        T_REQUIRE(ddo_config_set(cfg, "device_memory_limit_gb", "8") == 0);
        T_REQUIRE(ddo_config_apply_preset(cfg, "linear", "auto") == 0);
        T_REQUIRE(ddo_config_set(cfg, "preset", "auto") == 0);
        T_REQUIRE(ddo_config_set(cfg, "pin_cpu_memory", "true") == 0);
        if (user_ratio)
            T_REQUIRE(ddo_config_set(cfg, "pin_weight_budget_ratio", "0.5") == 0);
        T_EQ_INT(ddo_plan_build(ck, cfg, &in, &p), 0);
        T_EQ_STR(fx_decision(p, "resident_set_rule"), "fill_cost");
        ddo_plan_budgets bg;
        T_REQUIRE(ddo_plan_budgets_get(p, &bg) == 0);
        T_CHECK(bg.retained_peak > 12 * fx_gib(1));
        if (user_ratio) {
            T_EQ_STR(fx_decision(p, "registration"), "partial");
            T_EQ_STR(fx_decision(p, "pin_weight_rule"), "(absent)");
            T_CHECK(bg.registered_peak < bg.retained_peak);
            T_CHECK(bg.staging_peak > 0);
        } else {
            T_EQ_STR(fx_decision(p, "auto_pin_weight_budget_ratio"), "0.75"); /* the record */
            T_EQ_STR(fx_decision(p, "pin_weight_rule"), "fill_registers_retained");
            T_EQ_STR(fx_decision(p, "registration"), "all_retained");
            T_EQ_U64(bg.registered_peak, bg.retained_peak);
            T_EQ_U64(bg.staging_peak, 0);
        }
        ddo_plan_destroy(p);
        ddo_config_destroy(cfg);
    }
    ddo_checkpoint_destroy(ck);
    fx_free(&tb);
}

int main(void)
{
    T_RUN(test_layouts_fill_the_budget);
    T_RUN(test_budget_names_and_limits);
    T_RUN(test_user_resident_rule_wins);
    T_RUN(test_fill_registers_what_streams);
    return t_done();
}
