/*
 * plan_budget.c - the planner's budget arithmetic: the balanced auto budget
 * policy, pin budget resolution with the 0.95 snap (docs/plan.md), and the
 * ordered list of planner decisions that records every step under the keys of
 * the compatible Python API.
 */
#include "plan/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- decisions ---- */

void ddo__decisions_free(ddo__decisions *d)
{
    for (size_t i = 0; i < d->count; i++) {
        free(d->items[i].key);
        free(d->items[i].value);
    }
    free(d->items);
    memset(d, 0, sizeof(*d));
}

static void set_value(ddo__decisions *d, const char *key, const char *value, bool is_number)
{
    for (size_t i = 0; i < d->count; i++)
        if (strcmp(d->items[i].key, key) == 0) {
            char *v = ddo__strdup(value);
            if (v == NULL) {
                d->failed = true;
                return;
            }
            free(d->items[i].value);
            d->items[i].value = v;
            d->items[i].is_number = is_number;
            return;
        }
    if (d->count == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 32;
        ddo__decision *items = ddo__reallocarray(d->items, cap, sizeof(*items));
        if (items == NULL) {
            d->failed = true;
            return;
        }
        d->items = items;
        d->cap = cap;
    }
    char *k = ddo__strdup(key), *v = ddo__strdup(value);
    if (k == NULL || v == NULL) {
        free(k);
        free(v);
        d->failed = true;
        return;
    }
    d->items[d->count].key = k;
    d->items[d->count].value = v;
    d->items[d->count].is_number = is_number;
    d->count++;
}

void ddo__decisions_set_str(ddo__decisions *d, const char *key, const char *value)
{
    set_value(d, key, value, false);
}

void ddo__format_num4(double v, char *buf, size_t len)
{
    if (!isfinite(v))
        v = 0.0;
    double r = nearbyint(v * 10000.0) / 10000.0;
    if (r == 0.0)
        r = 0.0; /* no "-0.0" */
    snprintf(buf, len, "%.4f", r);
    char *dot = strchr(buf, '.');
    if (dot == NULL)
        return;
    char *end = buf + strlen(buf) - 1;
    while (end > dot + 1 && *end == '0')
        *end-- = '\0';
}

void ddo__decisions_set_num(ddo__decisions *d, const char *key, double value)
{
    char buf[64];
    ddo__format_num4(value, buf, sizeof(buf));
    set_value(d, key, buf, true);
}

void ddo__decisions_set_gb(ddo__decisions *d, const char *key, uint64_t bytes)
{
    ddo__decisions_set_num(d, key, ddo__bytes_to_gb(bytes));
}

void ddo__decisions_set_bool(ddo__decisions *d, const char *key, bool value)
{
    set_value(d, key, value ? "true" : "false", true);
}

const char *ddo__decisions_get(const ddo__decisions *d, const char *key)
{
    for (size_t i = 0; i < d->count; i++)
        if (strcmp(d->items[i].key, key) == 0)
            return d->items[i].value;
    return NULL;
}

/* ---- the balanced policy ---- */

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

static uint64_t floor_mul(uint64_t v, double f)
{
    double x = floor((double)v * f);
    if (!(x > 0.0))
        return 0;
    if (x >= 18446744073709551615.0)
        return UINT64_MAX;
    return (uint64_t)x;
}

uint64_t ddo__vram_headroom_default(uint64_t total_vram, double model_to_vram_ratio)
{
    double v_gb = ddo__bytes_to_gb(total_vram);
    if (v_gb <= 8.5)
        return ddo__gb_to_bytes(model_to_vram_ratio <= 2.5 ? 3.0 : 2.0);
    if (v_gb <= 12.5)
        return ddo__gb_to_bytes(2.5);
    return ddo__gb_to_bytes(fmax(3.0, 0.15 * v_gb));
}

/* What steps 8 and 9 of the balanced policy share (derived in steps 1-7). */
typedef struct balanced_ctx {
    uint64_t W, M, A, V, usable, prb;
    double ratio;
    bool fp, fp_profile;
} balanced_ctx;

/* Step 8: the resident budget. */
static void balanced_resident(const ddo__balanced_in *in, const balanced_ctx *c,
                              ddo__balanced_out *out, ddo__decisions *d)
{
    const uint64_t M = c->M, V = c->V, prb = c->prb;
    const double ratio = c->ratio;
    const bool fp = c->fp, fp_profile = c->fp_profile;
    if (in->resident_budget == 0 && M > 0 && !fp) {
        uint64_t budget = M / 4; /* floor(0.25 * M) */
        if (V > 0) {
            uint64_t h = in->vram_headroom_option > 0 ? in->vram_headroom_option
                                                      : ddo__vram_headroom_default(V, ratio);
            uint64_t target = max_u64(DDO_GIB, V > h ? V - h : 0);
            if (M > V) {
                budget = min_u64(max_u64(budget, target), M);
                ddo__decisions_set_gb(d, "auto_resident_module_budget_vram_target_gb", target);
                ddo__decisions_set_gb(d, "auto_vram_headroom_gb", h);
            }
            if (budget > target) {
                budget = target;
                ddo__decisions_set_gb(d, "auto_resident_module_budget_vram_cap_gb", target);
                ddo__decisions_set_gb(d, "auto_vram_headroom_gb", h);
                ddo__decisions_set_str(d, "auto_resident_module_budget_vram_cap_reason",
                                       "cuda_vram_headroom");
            }
        }
        if (in->profile_applied)
            budget = min_u64(in->profile_resident, M);
        if (in->max_resident > 0)
            budget = min_u64(budget, in->max_resident);
        out->resident_budget = budget;
        ddo__decisions_set_gb(d, "auto_resident_module_budget_gb", budget);
    } else if (fp) {
        if (fp_profile) {
            out->resident_budget = prb;
            ddo__decisions_set_str(d, "auto_resident_module_decision", "full_pin_profile_resident");
        } else {
            out->resident_budget = 0;
            ddo__decisions_set_str(d, "auto_resident_module_decision", "zero_for_full_pin");
            if (in->profile_resident > 0)
                ddo__decisions_set_str(d, "profile_resident_module_skip_reason",
                                       "insufficient_ram");
        }
        ddo__decisions_set_gb(d, "auto_resident_module_budget_gb", out->resident_budget);
    }
}

/* Step 9: the pin budget. */
static void balanced_pin(const ddo__balanced_in *in, const balanced_ctx *c, ddo__balanced_out *out,
                         ddo__decisions *d)
{
    const uint64_t W = c->W, A = c->A, usable = c->usable;
    const bool fp = c->fp, fp_profile = c->fp_profile;
    if (in->pin_budget == 0 && !(in->pin_ratio > 0.0) && W > 0) {
        uint64_t budget;
        double pin_ratio;
        const char *decision = NULL;
        if (fp) {
            pin_ratio = 1.0;
            budget = W;
            decision = fp_profile ? "full_pin_profile_resident" : "full_pin_zero_resident";
            out->force_full_pin = !fp_profile;
        } else {
            pin_ratio = W <= 8 * DDO_GIB ? 1.0 : W <= 16 * DDO_GIB ? 0.85 : 0.75;
            budget = floor_mul(W, pin_ratio);
        }
        if (in->max_pin > 0)
            budget = min_u64(budget, in->max_pin);
        if (A > 0) {
            uint64_t required = ddo__sat_add_u64(W, out->resident_budget);
            ddo__decisions_set_gb(d, "auto_required_system_ram_gb", required);
            if (usable < required) {
                budget = 0;
                pin_ratio = 0.0;
                out->skip_pin = true;
                out->force_full_pin = false;
                decision = "skip_insufficient_ram";
            } else if (!fp) {
                decision = "budgeted";
            }
        } else if (!fp) {
            decision = "budgeted";
        }
        ddo__decisions_set_str(d, "auto_pin_weight_decision", decision);
        out->pin_decided = true;
        out->pin_budget = budget;
        out->pin_ratio = pin_ratio;
        ddo__decisions_set_gb(d, "auto_pin_weight_budget_gb", budget);
        ddo__decisions_set_num(d, "auto_pin_weight_budget_ratio", pin_ratio);
    }
}

void ddo__balanced_policy(const ddo__balanced_in *in, ddo__balanced_out *out, ddo__decisions *d)
{
    const uint64_t W = in->candidate_weight, M = in->candidate_resident;
    const uint64_t A = in->available_ram, V = in->total_vram;
    memset(out, 0, sizeof(*out));
    out->resident_budget = in->resident_budget;
    out->pin_budget = in->pin_budget;
    out->pin_ratio = in->pin_ratio;

    /* Steps 1-3. */
    ddo__decisions_set_str(d, "auto_budget_policy", "balanced");
    ddo__decisions_set_gb(d, "candidate_weight_gb", W);
    ddo__decisions_set_gb(d, "candidate_resident_module_gb", M);
    ddo__decisions_set_gb(d, "available_system_ram_gb", A);
    ddo__decisions_set_gb(d, "system_ram_headroom_gb", in->ram_headroom);
    double ratio = V > 0 ? (double)M / (double)V : 0.0;
    if (V > 0) {
        ddo__decisions_set_gb(d, "cuda_total_vram_gb", V);
        ddo__decisions_set_num(d, "auto_model_to_vram_ratio", ratio);
    }

    /* Steps 4-7. */
    uint64_t usable = A > in->ram_headroom ? A - in->ram_headroom : 0;
    const double T = in->full_pin_min_ratio;
    bool fp = in->pin_requested && in->pin_budget == 0 && !(in->pin_ratio > 0.0) &&
              in->resident_budget == 0 && in->max_pin == 0 && A > 0 && W > 0 && usable >= W &&
              T > 0.0 && V > 0 && ratio >= T;
    uint64_t prb = min_u64(in->profile_resident, M);
    bool fp_profile = fp && prb > 0 && usable >= W && usable - W >= prb;
    out->full_pin = fp;
    ddo__decisions_set_gb(d, "auto_usable_system_ram_gb", usable);
    ddo__decisions_set_num(d, "auto_full_pin_min_model_to_vram_ratio", T);
    ddo__decisions_set_gb(d, "profile_resident_module_budget_requested_gb", in->profile_resident);

    balanced_ctx c = { W, M, A, V, usable, prb, ratio, fp, fp_profile };
    balanced_resident(in, &c, out, d);
    balanced_pin(in, &c, out, d);
}

/* ---- pin budget resolution ---- */

const char *ddo__pin_mode_name(ddo__pin_mode mode)
{
    switch (mode) {
    case DDO_PIN_MODE_UNLIMITED_FULL_PIN:
        return "unlimited_full_pin";
    case DDO_PIN_MODE_SNAP_TO_FULL_PIN:
        return "snap_to_full_pin";
    case DDO_PIN_MODE_LIMITED:
        return "limited";
    }
    return "?";
}

void ddo__pin_resolve(uint64_t candidates, uint64_t pin_budget, double pin_ratio, uint64_t max_pin,
                      bool force_full_pin, ddo__pin_resolution *out, ddo__decisions *d)
{
    const uint64_t C = candidates;
    memset(out, 0, sizeof(*out));
    if (force_full_pin) {
        out->mode = DDO_PIN_MODE_SNAP_TO_FULL_PIN;
        out->budget = C;
    } else {
        uint64_t budget = pin_budget;
        bool unlimited = budget == 0 && !(pin_ratio > 0.0);
        if (budget == 0 && pin_ratio > 0.0)
            budget = floor_mul(C, pin_ratio);
        if (budget > 0 && max_pin > 0)
            budget = min_u64(budget, max_pin);
        if (C > 0 && budget >= floor_mul(C, DDO_PIN_SNAP_FRACTION)) {
            budget = 0;
            out->snapped = true;
        }
        if (budget == 0) {
            out->mode = unlimited ? DDO_PIN_MODE_UNLIMITED_FULL_PIN : DDO_PIN_MODE_SNAP_TO_FULL_PIN;
            out->budget = C;
        } else {
            out->mode = DDO_PIN_MODE_LIMITED;
            out->budget = budget;
        }
    }
    ddo__decisions_set_bool(d, "pin_weight_budget_snap_to_full", out->snapped);
    ddo__decisions_set_str(d, "resolved_pin_weight_budget_mode", ddo__pin_mode_name(out->mode));
    ddo__decisions_set_gb(d, "resolved_pin_weight_budget_gb", out->budget);
}

uint64_t ddo__wddm_pin_cap(uint64_t ram_total_bytes)
{
    uint64_t half = ram_total_bytes / 2;
    return half - half % DDO_SEGMENT_BYTES;
}
