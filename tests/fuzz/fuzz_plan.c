/*
 * fuzz_plan.c - turns bytes into a tensor table plus a configuration and
 * budgets, builds a plan and checks its invariants: every tensor placed
 * exactly once, no predicted peak over its budget in an accepted plan, the
 * same input gives the same plan, and the JSON round-trips. Also included by
 * tests/test_plan_props.c, which feeds it random bytes.
 */
#include "ddo.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP_MAX_TENSORS 400

typedef struct fp_reader {
    const uint8_t *p;
    size_t n, at;
} fp_reader;

static unsigned fp_byte(fp_reader *r)
{
    return r->at < r->n ? r->p[r->at++] : 0u;
}

static int fp_fail(char *why, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return 1;
}

static int fp_set(ddo_config *cfg, const char *key, const char *fmt, ...)
{
    char v[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof(v), fmt, ap);
    va_end(ap);
    return ddo_config_set(cfg, key, v);
}

static ddo_config *fp_config(fp_reader *r, ddo_plan_inputs *in)
{
    ddo_config *cfg = NULL;
    if (ddo_config_create(&cfg) != 0)
        return NULL;
    unsigned route = fp_byte(r) % 6, bits = fp_byte(r);
    int rc = 0;
    if (route == 3)
        rc = ddo_config_apply_preset(cfg, "linear", "one_shot_fast");
    else if (route == 4)
        rc = ddo_config_apply_preset(cfg, "vmm", "auto");
    else if (route == 5)
        rc = ddo_config_apply_preset(cfg, "vmm", "nvme_baseline");
    static const char *const sel[] = { "first", "spread", "largest", "cost" };
    static const char *const pats[] = { "auto", "", "attn", "blocks\\.1" };
    rc |= ddo_config_set(cfg, "unit_granularity", (bits & 1) ? "leaf" : "block");
    rc |= ddo_config_set(cfg, "resident_module_selection", sel[(bits >> 1) & 3]);
    rc |= ddo_config_set(cfg, "resident_module_patterns", pats[(bits >> 3) & 3]);
    rc |= ddo_config_set(cfg, "pin_cpu_memory", (bits & 32) ? "true" : "false");
    rc |= ddo_config_set(cfg, "auto_budget_policy", (bits & 64) ? "balanced" : "off");
    if (bits & 128)
        rc |= ddo_config_set(cfg, "always_resident_modules_pattern", "(^|\\.)(proj_out|norm)");
    rc |= fp_set(cfg, "resident_module_budget_gb", "%g", fp_byte(r) / 64.0);
    unsigned wb = fp_byte(r);
    if (wb != 0 || route != 4)
        rc |= fp_set(cfg, "vmm_resident_weight_budget_gb", "%g", wb / 64.0);
    rc |= fp_set(cfg, "small_tensor_threshold_bytes", "%u", fp_byte(r) * 4096);
    rc |= fp_set(cfg, "execution_slots", "%u", fp_byte(r) % 5);
    rc |= fp_set(cfg, "pin_weight_budget_ratio", "%g", (fp_byte(r) % 5) / 4.0);
    rc |= fp_set(cfg, "vmm_source_cache_gb", "%g", fp_byte(r) / 64.0);
    rc |= fp_set(cfg, "vmm_source_registered_gb", "%g", fp_byte(r) / 128.0);
    rc |= fp_set(cfg, "vmm_staging_buffer_gb", "%g", fp_byte(r) / 256.0);
    rc |= ddo_config_set(cfg, "unit_pack_blocks", (fp_byte(r) & 1) ? "true" : "false");
    if (rc != 0) {
        ddo_config_destroy(cfg);
        return NULL;
    }
    *in = (ddo_plan_inputs)DDO_PLAN_INPUTS_INIT;
    in->device_total_bytes = (uint64_t)fp_byte(r) << 25;
    in->host_available_bytes = (uint64_t)fp_byte(r) << 26;
    unsigned cost = fp_byte(r);
    if (cost & 1) {
        in->bus_bytes_per_s = 1e9 * (1 + (cost >> 1));
        in->flops_per_s = 1e12 * (1 + fp_byte(r));
        in->tokens = fp_byte(r) * 64u;
    }
    return cfg;
}

static int fp_check_plan(const ddo_plan *p, const ddo_checkpoint *ck, char *why, size_t len)
{
    size_t nt = ddo_plan_tensor_count(p), nu = ddo_plan_unit_count(p);
    if (nt != ddo_checkpoint_tensor_count(ck))
        return fp_fail(why, len, "tensor count %zu", nt);
    ddo_plan_budgets bg;
    if (ddo_plan_budgets_get(p, &bg) != 0)
        return fp_fail(why, len, "budgets");
    unsigned char *seen = calloc(nt ? nt : 1, 1);
    if (seen == NULL)
        return 0;
    int bad = 0;
    bool streaming = false;
    for (size_t u = 0; u < nu && !bad; u++) {
        ddo_unit_info ui;
        size_t n = 0;
        const size_t *ts = ddo_plan_unit_tensors(p, u, &n);
        if (ddo_plan_unit(p, u, &ui) != 0 || (n > 0 && ts == NULL)) {
            bad = fp_fail(why, len, "unit %zu", u);
            break;
        }
        streaming = streaming || !ui.resident;
        if (ui.registered && !ui.retained)
            bad = fp_fail(why, len, "unit %zu registered but not retained", u);
        for (size_t k = 0; k < n && !bad; k++) {
            size_t i = ts[k];
            ddo_tensor_location loc;
            if (i >= nt || seen[i]++ || ddo_plan_tensor_location(p, i, &loc) != 0) {
                bad = fp_fail(why, len, "tensor %zu listed twice or out of range", i);
                break;
            }
            if (ui.resident ? (loc.placement != DDO_PLACEMENT_RESIDENT ||
                               loc.reason != DDO_REASON_BUDGET || loc.unit != SIZE_MAX)
                            : (loc.placement != DDO_PLACEMENT_STREAMED || loc.unit != u))
                bad = fp_fail(why, len, "tensor %zu placement disagrees with unit %zu", i, u);
            else if (!ui.resident && (loc.offset % DDO_TENSOR_ALIGN != 0 ||
                                      loc.offset + loc.nbytes > bg.slot_bytes))
                bad = fp_fail(why, len, "tensor %zu outside its slot", i);
        }
    }
    for (size_t i = 0; i < nt && !bad; i++) {
        ddo_tensor_location loc;
        ddo_plan_tensor_location(p, i, &loc);
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(ck, i);
        if (ti == NULL || loc.nbytes != ti->nbytes)
            bad = fp_fail(why, len, "tensor %zu bytes", i);
        else if (!seen[i] &&
                 (loc.placement == DDO_PLACEMENT_STREAMED || loc.reason == DDO_REASON_BUDGET))
            bad = fp_fail(why, len, "tensor %zu streamed/budget but in no unit", i);
        else if (loc.placement == DDO_PLACEMENT_RESIDENT &&
                 (loc.offset % DDO_TENSOR_ALIGN != 0 ||
                  loc.offset + loc.nbytes > bg.resident_bytes))
            bad = fp_fail(why, len, "tensor %zu outside the resident arena", i);
        else if ((loc.placement == DDO_PLACEMENT_SKIPPED) !=
                 (loc.reason == DDO_REASON_SKIP_PATTERN))
            bad = fp_fail(why, len, "tensor %zu skip reason", i);
    }
    free(seen);
    if (bad)
        return 1;
    if (bg.device_weights_limit > 0 && bg.device_weights_peak > bg.device_weights_limit)
        return fp_fail(why, len, "device weights %llu over %llu",
                       (unsigned long long)bg.device_weights_peak,
                       (unsigned long long)bg.device_weights_limit);
    if (bg.device_weights_peak != bg.resident_bytes + bg.slot_count * bg.slot_bytes)
        return fp_fail(why, len, "device weights peak is not resident + slots");
    if (bg.retained_limit > 0 && bg.retained_peak > bg.retained_limit)
        return fp_fail(why, len, "retained over its limit");
    if (bg.registered_peak > bg.retained_peak)
        return fp_fail(why, len, "registered over retained");
    if (bg.registered_limit > 0 && bg.registered_peak > bg.registered_limit)
        return fp_fail(why, len, "registered over its limit");
    if (streaming ? bg.slot_count < 2 : bg.slot_count != 0)
        return fp_fail(why, len, "%zu slots", bg.slot_count);
    if (bg.staging_peak != (uint64_t)bg.staging_windows * bg.staging_window_bytes)
        return fp_fail(why, len, "staging not whole windows");
    return 0;
}

/* Builds and checks one input. 0: fine (including refused plans); 1: an invariant broke.
 * *accepted (may be NULL) says whether a plan was built and checked. */
static int fp_run(const uint8_t *data, size_t size, char *why, size_t len, bool *accepted)
{
    if (accepted != NULL)
        *accepted = false;
    fp_reader r = { data, size, 0 };
    ddo_plan_inputs in;
    ddo_config *cfg = fp_config(&r, &in);
    if (cfg == NULL)
        return 0;
    static const char *const prefixes[] = { "blocks", "single_blocks", "layers",
                                            "",       "misc",          "blocks.3.inner" };
    static const char *const modules[] = { "attn.to_q", "attn.to_k", "ff.net.0.proj",
                                           "norm",      "proj_out",  "time_embed.linear",
                                           "x",         "lora" };
    static const char *const suffixes[] = { "weight", "bias", "table" };
    static const ddo_dtype dtypes[] = { DDO_DTYPE_BF16, DDO_DTYPE_F32, DDO_DTYPE_F8_E4M3,
                                        DDO_DTYPE_I64 };
    ddo_tensor_desc *t = calloc(FP_MAX_TENSORS, sizeof(*t));
    char(*names)[96] = calloc(FP_MAX_TENSORS, sizeof(*names));
    uint64_t(*shapes)[3] = calloc(FP_MAX_TENSORS, sizeof(*shapes));
    size_t n = 0;
    int bad = 0;
    ddo_checkpoint *ck = NULL;
    ddo_plan *a = NULL, *b = NULL, *c = NULL;
    char *ja = NULL, *jb = NULL, *jc = NULL;
    if (t == NULL || names == NULL || shapes == NULL)
        goto out;
    while (r.at < r.n && n < FP_MAX_TENSORS) {
        unsigned pre = fp_byte(&r) % 6, blk = fp_byte(&r) % 12, mod = fp_byte(&r) % 8;
        unsigned sfx = fp_byte(&r) % 3, nd = 1 + fp_byte(&r) % 3;
        if (prefixes[pre][0] == '\0')
            snprintf(names[n], sizeof(names[n]), "%s.%s", modules[mod], suffixes[sfx]);
        else
            snprintf(names[n], sizeof(names[n]), "%s.%u.%s.%s", prefixes[pre], blk, modules[mod],
                     suffixes[sfx]);
        bool dup = false;
        for (size_t k = 0; k < n && !dup; k++)
            dup = strcmp(names[k], names[n]) == 0;
        /* Up to 4080 x 1020 x 7 elements: tables from empty to a few hundred MiB. */
        shapes[n][0] = (uint64_t)fp_byte(&r) * 16u;
        shapes[n][1] = (uint64_t)fp_byte(&r) * 4u;
        shapes[n][2] = (uint64_t)fp_byte(&r) % 8u;
        if (dup)
            continue;
        t[n] = (ddo_tensor_desc){ names[n], dtypes[fp_byte(&r) % 4], nd, shapes[n], NULL };
        n++;
    }
    if (ddo_checkpoint_create_from_memory(t, n, &ck) != 0)
        goto out;
    int rc = ddo_plan_build(ck, cfg, &in, &a);
    if (rc != 0) {
        if (rc != DDO_E_BUDGET && rc != DDO_E_CONFIG)
            bad = fp_fail(why, len, "build failed: %s (%s)", ddo_errname(rc), ddo_last_error());
        goto out;
    }
    if (accepted != NULL)
        *accepted = true;
    if ((bad = fp_check_plan(a, ck, why, len)) != 0)
        goto out;
    if (ddo_plan_build(ck, cfg, &in, &b) != 0 || ddo_plan_to_json(a, &ja) != 0 ||
        ddo_plan_to_json(b, &jb) != 0 || strcmp(ja, jb) != 0) {
        bad = fp_fail(why, len, "the same input gave a different plan");
        goto out;
    }
    if (ddo_plan_from_json(ja, &c) != 0 || ddo_plan_to_json(c, &jc) != 0 || strcmp(ja, jc) != 0)
        bad = fp_fail(why, len, "JSON did not round-trip: %s", ddo_last_error());
out:
    ddo_free(ja);
    ddo_free(jb);
    ddo_free(jc);
    ddo_plan_destroy(a);
    ddo_plan_destroy(b);
    ddo_plan_destroy(c);
    ddo_checkpoint_destroy(ck);
    ddo_config_destroy(cfg);
    free(t);
    free(names);
    free(shapes);
    return bad;
}

#ifndef FUZZ_PLAN_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[512];
    if (fp_run(data, size, why, sizeof(why), NULL) != 0) {
        fprintf(stderr, "fuzz_plan: invariant broken: %s\n", why);
        abort();
    }
    return 0;
}
#endif
