/*
 * test_plan_budget.c - the balanced auto budget policy (docs/plan.md)
 * and pin budget resolution (3.8) on the numbers of the worked examples:
 * decision labels and values exactly as upstream records them.
 * ctest-labels: unit
 */
#include "t.h"
#include "plan/plan.h"

static uint64_t gb(double g)
{
    return ddo__gb_to_bytes(g);
}

/* The inputs of the LTX worked example (one_shot_fast on an 8 GiB card). */
static ddo__balanced_in ltx_inputs(double available_gb)
{
    /* W = 48 blocks x 0.500488 GiB of weights, M = 48 x 0.500702 GiB blocks. */
    ddo__balanced_in in = {
        .available_ram = gb(available_gb),
        .ram_headroom = gb(8.0),
        .total_vram = gb(8.0),
        .full_pin_min_ratio = 4.0,
        .pin_requested = true,
        .candidate_weight = 48 * (uint64_t)537395200,
        .candidate_resident = 48 * (uint64_t)537624576,
    };
    return in;
}

static const char *get(const ddo__decisions *d, const char *key)
{
    const char *v = ddo__decisions_get(d, key);
    return v != NULL ? v : "(absent)";
}

static void test_worked_example_budgeted_then_snap(void)
{
    ddo__decisions d = { 0 };
    ddo__balanced_in in = ltx_inputs(43.53);
    ddo__balanced_out out;
    ddo__balanced_policy(&in, &out, &d);
    T_CHECK(!out.full_pin && !out.skip_pin && !out.force_full_pin);
    T_EQ_STR(get(&d, "auto_budget_policy"), "balanced");
    T_EQ_STR(get(&d, "candidate_weight_gb"), "24.0234");
    T_EQ_STR(get(&d, "candidate_resident_module_gb"), "24.0337");
    T_EQ_STR(get(&d, "available_system_ram_gb"), "43.53");
    T_EQ_STR(get(&d, "system_ram_headroom_gb"), "8.0");
    T_EQ_STR(get(&d, "cuda_total_vram_gb"), "8.0");
    T_EQ_STR(get(&d, "auto_model_to_vram_ratio"), "3.0042");
    T_EQ_STR(get(&d, "auto_usable_system_ram_gb"), "35.53");
    T_EQ_STR(get(&d, "auto_vram_headroom_gb"), "2.0");
    T_EQ_STR(get(&d, "auto_resident_module_budget_vram_target_gb"), "6.0");
    T_EQ_STR(get(&d, "auto_resident_module_budget_vram_cap_gb"), "6.0");
    T_EQ_STR(get(&d, "auto_resident_module_budget_vram_cap_reason"), "cuda_vram_headroom");
    T_EQ_STR(get(&d, "auto_resident_module_budget_gb"), "6.0");
    T_EQ_U64(out.resident_budget, 6 * DDO_GIB);
    T_EQ_STR(get(&d, "auto_required_system_ram_gb"), "30.0234");
    T_EQ_STR(get(&d, "auto_pin_weight_decision"), "budgeted");
    T_EQ_STR(get(&d, "auto_pin_weight_budget_gb"), "18.0176");
    T_EQ_STR(get(&d, "auto_pin_weight_budget_ratio"), "0.75");
    T_CHECK(out.pin_decided);

    /* 37 blocks stay streamed after 11 become resident: C = 18.5181 GiB, 18.0176 >= 95 %. */
    ddo__pin_resolution pin;
    ddo__pin_resolve(37 * (uint64_t)537395200, out.pin_budget, out.pin_ratio, 0, out.force_full_pin,
                     &pin, &d);
    T_EQ_INT(pin.mode, DDO_PIN_MODE_SNAP_TO_FULL_PIN);
    T_CHECK(pin.snapped);
    T_EQ_STR(get(&d, "resolved_pin_weight_budget_mode"), "snap_to_full_pin");
    T_EQ_STR(get(&d, "resolved_pin_weight_budget_gb"), "18.5181");
    T_EQ_STR(get(&d, "pin_weight_budget_snap_to_full"), "true");
    T_CHECK(!d.failed);
    ddo__decisions_free(&d);
}

static void test_worked_example_skip_insufficient_ram(void)
{
    ddo__decisions d = { 0 };
    ddo__balanced_in in = ltx_inputs(32.0);
    ddo__balanced_out out;
    ddo__balanced_policy(&in, &out, &d);
    T_CHECK(out.skip_pin);
    T_EQ_STR(get(&d, "auto_usable_system_ram_gb"), "24.0");
    T_EQ_STR(get(&d, "auto_required_system_ram_gb"), "30.0234");
    T_EQ_STR(get(&d, "auto_pin_weight_decision"), "skip_insufficient_ram");
    T_EQ_STR(get(&d, "auto_pin_weight_budget_gb"), "0.0");
    T_EQ_STR(get(&d, "auto_pin_weight_budget_ratio"), "0.0");
    T_EQ_U64(out.pin_budget, 0);
    T_EQ_U64(out.resident_budget, 6 * DDO_GIB); /* the resident side is unchanged */
    ddo__decisions_free(&d);
}

static void test_full_pin_zero_resident(void)
{
    ddo__decisions d = { 0 };
    ddo__balanced_in in = ltx_inputs(64.0);
    in.total_vram = gb(4.0); /* M / V = 6.0 >= 4 */
    ddo__balanced_out out;
    ddo__balanced_policy(&in, &out, &d);
    T_CHECK(out.full_pin && out.force_full_pin && !out.skip_pin);
    T_EQ_STR(get(&d, "auto_resident_module_decision"), "zero_for_full_pin");
    T_EQ_STR(get(&d, "auto_pin_weight_decision"), "full_pin_zero_resident");
    T_EQ_STR(get(&d, "auto_pin_weight_budget_ratio"), "1.0");
    T_EQ_STR(get(&d, "auto_pin_weight_budget_gb"), "24.0234");
    T_EQ_STR(get(&d, "profile_resident_module_skip_reason"), "(absent)");
    T_EQ_U64(out.resident_budget, 0);
    ddo__pin_resolution pin;
    ddo__pin_resolve(in.candidate_weight, out.pin_budget, out.pin_ratio, 0, out.force_full_pin,
                     &pin, &d);
    T_EQ_INT(pin.mode, DDO_PIN_MODE_SNAP_TO_FULL_PIN);
    T_CHECK(!pin.snapped); /* forced, not snapped */
    ddo__decisions_free(&d);

    /* A profile's resident budget that does not fit next to W is skipped with a reason. */
    in.available_ram = gb(40.0); /* usable 32: W fits, W + min(PR, M) does not */
    in.profile_resident = gb(40.0);
    in.profile_applied = true;
    ddo__balanced_policy(&in, &out, &d);
    T_EQ_STR(get(&d, "auto_resident_module_decision"), "zero_for_full_pin");
    T_EQ_STR(get(&d, "profile_resident_module_skip_reason"), "insufficient_ram");
    ddo__decisions_free(&d);

    /* One that fits keeps its blocks resident and still pins everything. */
    in.profile_resident = gb(2.0);
    ddo__balanced_policy(&in, &out, &d);
    T_EQ_STR(get(&d, "auto_resident_module_decision"), "full_pin_profile_resident");
    T_EQ_STR(get(&d, "auto_pin_weight_decision"), "full_pin_profile_resident");
    T_EQ_U64(out.resident_budget, gb(2.0));
    T_CHECK(!out.force_full_pin);
    ddo__decisions_free(&d);
}

static void test_not_full_pin_when_anything_explicit(void)
{
    ddo__decisions d = { 0 };
    ddo__balanced_in in = ltx_inputs(64.0);
    in.total_vram = gb(4.0);
    in.resident_budget = gb(1.0); /* explicit R0 > 0: resident untouched, no full pin */
    ddo__balanced_out out;
    ddo__balanced_policy(&in, &out, &d);
    T_CHECK(!out.full_pin);
    T_EQ_U64(out.resident_budget, gb(1.0));
    T_EQ_STR(get(&d, "auto_resident_module_budget_gb"), "(absent)");
    T_EQ_STR(get(&d, "auto_pin_weight_decision"), "budgeted");
    ddo__decisions_free(&d);

    in.resident_budget = 0;
    in.pin_requested = false; /* no pinning requested: never full pin */
    ddo__balanced_policy(&in, &out, &d);
    T_CHECK(!out.full_pin);
    ddo__decisions_free(&d);
}

static void test_headroom_table(void)
{
    T_EQ_U64(ddo__vram_headroom_default(gb(8.0), 2.5), gb(3.0));
    T_EQ_U64(ddo__vram_headroom_default(gb(8.0), 2.6), gb(2.0));
    T_EQ_U64(ddo__vram_headroom_default(gb(8.5), 1.0), gb(3.0));
    T_EQ_U64(ddo__vram_headroom_default(gb(12.0), 9.0), gb(2.5));
    T_EQ_U64(ddo__vram_headroom_default(gb(16.0), 1.0), gb(3.0));
    T_EQ_U64(ddo__vram_headroom_default(gb(24.0), 1.0), gb(0.15 * 24.0));
    T_EQ_U64(ddo__vram_headroom_default(gb(139.8), 0.2), gb(0.15 * 139.8));
}

static void test_quarter_of_m_and_caps(void)
{
    ddo__decisions d = { 0 };
    ddo__balanced_in in = {
        .ram_headroom = gb(6.0),
        .full_pin_min_ratio = 4.0,
        .candidate_weight = gb(12.0),
        .candidate_resident = gb(10.0),
    };
    ddo__balanced_out out;
    ddo__balanced_policy(&in, &out, &d); /* V and A unknown */
    T_EQ_U64(out.resident_budget, gb(10.0) / 4);
    T_EQ_STR(get(&d, "auto_resident_module_budget_gb"), "2.5");
    T_EQ_STR(get(&d, "cuda_total_vram_gb"), "(absent)");
    T_EQ_STR(get(&d, "auto_pin_weight_decision"), "budgeted"); /* RAM unknown: no check */
    T_EQ_STR(get(&d, "auto_required_system_ram_gb"), "(absent)");
    T_EQ_STR(get(&d, "auto_pin_weight_budget_ratio"), "0.85");
    ddo__decisions_free(&d);

    in.max_resident = gb(2.0);
    in.candidate_weight = gb(8.0);
    ddo__balanced_policy(&in, &out, &d);
    T_EQ_U64(out.resident_budget, gb(2.0));
    T_EQ_STR(get(&d, "auto_pin_weight_budget_ratio"), "1.0");
    ddo__decisions_free(&d);

    /* M <= V: the quarter stays under the VRAM target; a tiny card caps at 1 GiB. */
    in.max_resident = 0;
    in.total_vram = gb(2.0);
    in.candidate_resident = gb(1.9);
    ddo__balanced_policy(&in, &out, &d);
    T_EQ_U64(out.resident_budget, gb(1.9) / 4);
    ddo__decisions_free(&d);

    /* Nothing matches a resident pattern: the resident budget is left alone. */
    in.candidate_resident = 0;
    ddo__balanced_policy(&in, &out, &d);
    T_EQ_U64(out.resident_budget, 0);
    T_EQ_STR(get(&d, "auto_resident_module_budget_gb"), "(absent)");
    ddo__decisions_free(&d);

    /* Explicit pin budget: step 9 does not run. */
    in.pin_budget = gb(1.0);
    ddo__balanced_policy(&in, &out, &d);
    T_CHECK(!out.pin_decided);
    T_EQ_STR(get(&d, "auto_pin_weight_decision"), "(absent)");
    ddo__decisions_free(&d);
}

static void test_pin_resolution(void)
{
    ddo__decisions d = { 0 };
    ddo__pin_resolution r;
    ddo__pin_resolve(gb(10.0), gb(5.0), 0.0, 0, false, &r, &d);
    T_EQ_INT(r.mode, DDO_PIN_MODE_LIMITED);
    T_EQ_U64(r.budget, gb(5.0));
    T_EQ_STR(get(&d, "resolved_pin_weight_budget_gb"), "5.0");
    T_EQ_STR(get(&d, "pin_weight_budget_snap_to_full"), "false");
    ddo__pin_resolve(gb(10.0), 0, 0.5, 0, false, &r, &d);
    T_EQ_INT(r.mode, DDO_PIN_MODE_LIMITED);
    T_EQ_U64(r.budget, gb(10.0) / 2);
    ddo__pin_resolve(gb(10.0), 0, 0.96, 0, false, &r, &d);
    T_EQ_INT(r.mode, DDO_PIN_MODE_SNAP_TO_FULL_PIN);
    T_CHECK(r.snapped);
    ddo__pin_resolve(gb(10.0), 0, 0.0, 0, false, &r, &d);
    T_EQ_INT(r.mode, DDO_PIN_MODE_UNLIMITED_FULL_PIN);
    T_EQ_STR(get(&d, "resolved_pin_weight_budget_mode"), "unlimited_full_pin");
    T_EQ_STR(get(&d, "resolved_pin_weight_budget_gb"), "10.0");
    ddo__pin_resolve(gb(10.0), gb(5.0), 0.0, gb(3.0), false, &r, &d);
    T_EQ_INT(r.mode, DDO_PIN_MODE_LIMITED);
    T_EQ_U64(r.budget, gb(3.0));
    /* Exactly 95 % snaps (budget >= floor(0.95 C)); a byte less does not. */
    uint64_t c = 1000000;
    ddo__pin_resolve(c, 950000, 0.0, 0, false, &r, &d);
    T_EQ_INT(r.mode, DDO_PIN_MODE_SNAP_TO_FULL_PIN);
    ddo__pin_resolve(c, 949999, 0.0, 0, false, &r, &d);
    T_EQ_INT(r.mode, DDO_PIN_MODE_LIMITED);
    /* No candidates: nothing to snap; an explicit budget stays limited. */
    ddo__pin_resolve(0, gb(1.0), 0.0, 0, false, &r, &d);
    T_EQ_INT(r.mode, DDO_PIN_MODE_LIMITED);
    ddo__decisions_free(&d);
}

static void test_decisions_and_numbers(void)
{
    char buf[64];
    ddo__format_num4(6.0, buf, sizeof(buf));
    T_EQ_STR(buf, "6.0");
    ddo__format_num4(18.51812, buf, sizeof(buf));
    T_EQ_STR(buf, "18.5181");
    ddo__format_num4(0.75, buf, sizeof(buf));
    T_EQ_STR(buf, "0.75");
    ddo__format_num4(-0.00001, buf, sizeof(buf));
    T_EQ_STR(buf, "0.0");
    ddo__decisions d = { 0 };
    ddo__decisions_set_str(&d, "a", "x");
    ddo__decisions_set_str(&d, "b", "y");
    ddo__decisions_set_gb(&d, "a", 3 * DDO_GIB / 2); /* replaced in place, keeps position */
    T_EQ_U64(d.count, 2);
    T_EQ_STR(d.items[0].key, "a");
    T_EQ_STR(d.items[0].value, "1.5");
    T_CHECK(d.items[0].is_number);
    ddo__decisions_free(&d);
    T_EQ_U64(d.count, 0);
}

int main(void)
{
    T_RUN(test_worked_example_budgeted_then_snap);
    T_RUN(test_worked_example_skip_insufficient_ram);
    T_RUN(test_full_pin_zero_resident);
    T_RUN(test_not_full_pin_when_anything_explicit);
    T_RUN(test_headroom_table);
    T_RUN(test_quarter_of_m_and_caps);
    T_RUN(test_pin_resolution);
    T_RUN(test_decisions_and_numbers);
    return t_done();
}
