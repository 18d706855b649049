/*
 * plan.c - the planner: turns a tensor table, the resolved configuration and
 * what is known about the machine into a plan (docs/plan.md):
 * the placement of every tensor, units in execution order, the resident
 * selection, the retained and registered selections, slot and staging
 * geometry, the cost model and the predicted peak of every budget. Pure: no
 * I/O, no device, deterministic.
 *
 * This file holds the order of the build's steps and the budgets they share,
 * and the plan's lifecycle and accessors; the steps are in plan_modules.c,
 * plan_place.c, plan_host.c and plan_device.c (plan_build.h).
 */
#include "plan/plan_build.h"

#include "os/platform.h"

#include <stdlib.h>
#include <string.h>

/* ---- the build ---- */

/* Names, totals, modules, patterns and scopes: everything placement needs. */
static int build_tables(builder *b)
{
    const ddo__options *o = b->o;
    ddo_plan *p = b->p;
    b->leaf = o->unit_granularity != NULL && strcmp(o->unit_granularity, "leaf") == 0;
    b->pack = !b->leaf && o->unit_pack_blocks && !b->no_pack;
    b->threshold =
        o->small_tensor_threshold_bytes > 0 ? (uint64_t)o->small_tensor_threshold_bytes : 0;
    p->unit_granularity = ddo__strdup(b->leaf ? "leaf" : "block");
    p->granularity = b->leaf ? DDO_UNIT_LEAF : DDO_UNIT_BLOCK;
    /* The route, decided here once; the label is what the settings call it (a preset on the
     * linear route). */
    p->route = ddo__route_of(o->execution_mode);
    p->route_label = ddo__strdup(b->settings.route != NULL   ? b->settings.route
                                 : o->execution_mode != NULL ? o->execution_mode
                                                             : "");
    p->tensors = ddo__calloc(b->n ? b->n : 1, sizeof(*p->tensors));
    if (p->unit_granularity == NULL || p->route_label == NULL || p->tensors == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: %zu tensors", b->n);
    p->tensor_count = b->n;
    for (size_t i = 0; i < b->n; i++) {
        p->tensors[i].name = ddo__strdup(b->ti[i]->name);
        if (p->tensors[i].name == NULL)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: tensor names");
        p->total_bytes = ddo__sat_add_u64(p->total_bytes, b->ti[i]->nbytes);
    }
    int rc;
    if ((rc = ddo__plan_build_modules(b)) != 0 || (rc = ddo__plan_compile_patterns(b)) != 0 ||
        (rc = ddo__plan_resolve_resident_patterns(b)) != 0 || (rc = ddo__plan_build_scopes(b)) != 0)
        return rc;
    ddo__decisions_set_str(&p->decisions, "route", p->route_label);
    ddo__decisions_set_str(&p->decisions, "unit_granularity", p->unit_granularity);
    return 0;
}

/* The explicit budgets, then the balanced policy over them (docs/plan.md) when it is on. */
static void budget_policy(builder *b, budgets_in *bi)
{
    const ddo__options *o = b->o;
    ddo__decisions *d = &b->p->decisions;
    uint64_t W = 0, M = 0; /* the balanced policy's inputs */
    for (size_t i = 0; i < b->n; i++) {
        const pmod *m = &b->mods[b->tmod[i]];
        if (ddo__plan_is_eligible(b, i) && !m->always && b->ti[i]->nbytes > b->threshold)
            W = ddo__sat_add_u64(W, b->ti[i]->nbytes);
    }
    for (size_t s = 0; s < b->scope_count; s++)
        M = ddo__sat_add_u64(M, b->scopes[s].full_bytes);
    memset(bi, 0, sizeof(*bi));
    bi->M = M;
    bi->A = o->available_system_ram_gb > 0.0 ? ddo__gb_to_bytes(o->available_system_ram_gb)
                                             : b->in.host_available_bytes;
    bi->V = b->in.device_total_bytes;
    bi->balanced = o->auto_budget_policy != NULL && strcmp(o->auto_budget_policy, "balanced") == 0;
    bi->resident_budget = ddo__gb_to_bytes(o->resident_module_budget_gb);
    bi->pin_budget = ddo__gb_to_bytes(o->pin_weight_budget_gb);
    bi->pin_ratio = o->pin_weight_budget_ratio > 1.0   ? 1.0
                    : o->pin_weight_budget_ratio > 0.0 ? o->pin_weight_budget_ratio
                                                       : 0.0;
    if (!bi->balanced) {
        ddo__decisions_set_str(d, "auto_budget_policy", "off");
        return;
    }
    ddo__balanced_in in = {
        .resident_budget = bi->resident_budget,
        .pin_budget = bi->pin_budget,
        .pin_ratio = bi->pin_ratio,
        .max_resident = ddo__gb_to_bytes(o->max_resident_module_budget_gb),
        .max_pin = ddo__gb_to_bytes(o->max_pin_weight_budget_gb),
        .available_ram = bi->A,
        .ram_headroom = ddo__gb_to_bytes(o->system_ram_headroom_gb),
        .total_vram = bi->V,
        .vram_headroom_option = ddo__gb_to_bytes(o->auto_vram_headroom_gb),
        .full_pin_min_ratio = o->auto_full_pin_min_model_to_vram_ratio,
        .profile_resident = ddo__gb_to_bytes(o->profile_resident_module_budget_gb),
        .profile_applied = o->profile_resident_module_budget_gb > 0.0,
        .pin_requested = o->pin_cpu_memory,
        .candidate_weight = W,
        .candidate_resident = M,
    };
    ddo__balanced_out bo;
    ddo__balanced_policy(&in, &bo, d);
    bi->auto_resident = bi->resident_budget == 0 && bo.resident_budget > 0;
    bi->resident_budget = bo.resident_budget;
    if (bo.pin_decided) {
        bi->pin_budget = bo.pin_budget;
        bi->pin_ratio = bo.pin_ratio;
    }
    bi->force_full = bo.force_full_pin;
    bi->skip_pin = bo.skip_pin;
}

/* Calibration and full pinning clear the always-resident set. */
static void calibration_and_full_pin(builder *b, budgets_in *bi)
{
    ddo__decisions *d = &b->p->decisions;
    bool any_always = false;
    for (size_t m = 0; m < b->mod_count; m++)
        any_always = any_always || (b->mods[m].always && !b->mods[m].skipped);
    if (b->o->build_profile) {
        bi->resident_budget = 0;
        bi->auto_resident = false;
        b->clear_always = true;
        ddo__decisions_set_gb(d, "auto_resident_module_budget_gb", 0);
        ddo__decisions_set_str(d, "auto_resident_module_decision", "profile_calibration");
    }
    if (bi->force_full && !b->fill) {
        b->clear_always = true;
        if (any_always)
            ddo__decisions_set_str(d, "auto_always_resident_decision", "offload_for_zero_resident");
    }
}

static int place_and_select(builder *b, budgets_in *bi, uint64_t *limit, char *source, size_t len)
{
    ddo_plan *p = b->p;
    int rc;
    if ((rc = ddo__plan_device_limit(b, bi, limit, source, len)) != 0)
        return rc;
    b->device_limit = *limit;
    b->fill = b->fill && *limit > 0;
    if (b->fill)
        ddo__plan_fill_fixed_rules(b, *limit);
    if ((rc = ddo__plan_place_units(b)) != 0)
        return rc;
    ddo__plan_layout_units(b);
    if ((rc = ddo__plan_cost_model(b)) != 0)
        return rc;
    p->cost_reason = ddo__strdup(p->cost_enabled ? ""
                                 : !(b->in.bus_bytes_per_s > 0.0)
                                     ? "no bus bandwidth (inputs.bus_bytes_per_s is 0)"
                                     : "no compute rate (inputs.flops_per_s is 0, no "
                                       "unit_compute_json)");
    if (b->fill) {
        rc = ddo__plan_fill_resident(b, *limit);
    } else {
        ddo__plan_cap_auto_resident(b, bi, *limit);
        ddo__decisions_set_gb(&p->decisions, "resident_module_budget_gb", bi->resident_budget);
        ddo__decisions_set_str(&p->decisions, "resident_set_rule",
                               b->o->build_profile ? "profile_calibration"
                               : bi->auto_resident ? "auto_budget_policy"
                                                   : "resident_module_budget_gb");
        rc = ddo__plan_resident_selection(b, bi->resident_budget);
    }
    if (rc != 0)
        return rc;
    for (size_t u = 0; u < p->unit_count; u++) {
        ddo__plan_unit *un = &p->units[u];
        size_t prev = u > 0 ? u - 1 : p->unit_count - 1;
        if (un->resident)
            un->transfer_s = 0.0;
        un->hidden = un->resident || un->transfer_s <= p->units[prev].compute_s;
    }
    return 0;
}

/* ddo: a plan that fills the device budget registers every streamed byte it retains. The
 * balanced policy's pin ladder (1.0/0.85/0.75 of W) and its skip_insufficient_ram leave the
 * rest pageable, copied through the staging windows at the CPU's copy rate (on the H200 an 8 GiB
 * card's Flux step took 2.25 x the bus bound so); the retained store is already inside the host
 * budget (MemAvailable and the cgroup limit less system_ram_headroom_gb), so registering it takes
 * no more RAM. Where RAM is short (skip_insufficient_ram) nothing is pinned, so the OS can still
 * page the store; a pin budget or ratio of the user's, pin_cpu_memory off and WSL keep theirs. */
static void fill_pins(builder *b, budgets_in *bi)
{
    const ddo__options *o = b->o;
    if (!b->fill || !bi->balanced || bi->skip_pin || !o->pin_cpu_memory ||
        o->pin_weight_budget_gb > 0.0 || o->pin_weight_budget_ratio > 0.0 ||
        ddo__route_maps(b->p->route))
        return;
    bi->pin_budget = 0;
    bi->pin_ratio = 0.0;
    ddo__decisions_set_str(&b->p->decisions, "pin_weight_rule", "fill_registers_retained");
}

static int build(builder *b)
{
    const ddo__options *o = b->o;
    ddo_plan *p = b->p;
    ddo__decisions *d = &p->decisions;
    int rc;
    if ((rc = build_tables(b)) != 0)
        return rc;
    budgets_in bi;
    budget_policy(b, &bi);
    calibration_and_full_pin(b, &bi);
    uint64_t limit = 0;
    char source[256];
    if ((rc = place_and_select(b, &bi, &limit, source, sizeof(source))) != 0)
        return rc;

    fill_pins(b, &bi);
    /* Pin resolution on the linear routes (docs/plan.md, "Pin resolution"). */
    ddo__pin_resolution pin = { DDO_PIN_MODE_UNLIMITED_FULL_PIN, 0, false };
    if (!ddo__route_maps(p->route)) {
        uint64_t C = 0;
        for (size_t i = 0; i < b->n; i++)
            if (p->tensors[i].eligible && p->tensors[i].loc.placement == DDO_PLACEMENT_STREAMED)
                C = ddo__sat_add_u64(C, p->tensors[i].loc.nbytes);
        ddo__pin_resolve(C, bi.pin_budget, bi.pin_ratio,
                         ddo__gb_to_bytes(o->max_pin_weight_budget_gb), bi.force_full, &pin, d);
    }
    (void)ddo__plan_resident_arena(b);
    if ((rc = ddo__plan_host_side(b, bi.A, &pin, bi.skip_pin)) != 0)
        return rc;
    if ((rc = ddo__plan_device_side(b, limit, source)) != 0)
        return rc;
    if ((rc = ddo__plan_codec(b)) != 0)
        return rc;
    if ((rc = ddo__plan_devset(p, o)) != 0)
        return rc;
    p->budgets.predicted_step_s = ddo__plan_simulate(p, p->budgets.slot_count);
    for (size_t i = 0; i < b->n; i++) {
        const ddo_tensor_location *loc = &p->tensors[i].loc;
        p->bytes_by_placement[loc->placement] =
            ddo__sat_add_u64(p->bytes_by_placement[loc->placement], loc->nbytes);
        p->bytes_by_reason[loc->reason] =
            ddo__sat_add_u64(p->bytes_by_reason[loc->reason], loc->nbytes);
    }
    if (d->failed || p->cost_reason == NULL || p->device_limit_source == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: decisions");
    return 0;
}

/* Whether the user chose option key: neither the catalog's default nor the value of a preset
 * the user did not name (the preset auto stands for one). */
static bool user_set(const ddo_config *cfg, const builder *b, const char *key)
{
    const char *src = NULL;
    if (ddo_config_source(cfg, key, &src) != 0 || src == NULL || strcmp(src, "default") == 0)
        return false;
    if (strncmp(src, "preset:", 7) != 0)
        return true;
    const char *req = b->settings.requested_preset;
    return req == NULL || strcmp(req, "auto") != 0;
}

/* The device memory planned with: device_memory_limit_gb caps what the device reports (and
 * its free memory by as much), as if the card had that much. */
static int device_memory_limit(builder *b)
{
    uint64_t lim = ddo__gb_to_bytes(b->o->device_memory_limit_gb);
    ddo_plan_inputs *in = &b->in;
    if (lim == 0)
        return 0;
    if (in->device_total_bytes > 0 && lim > in->device_total_bytes) {
        char q[64], v[32];
        ddo__format_real(b->o->device_memory_limit_gb, q, sizeof(q));
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "device_memory_limit_gb=%s is above the device's memory (%s); give at "
                         "most that, or 0 for the whole device",
                         q, ddo__format_bytes(in->device_total_bytes, v, sizeof(v)));
    }
    if (in->device_total_bytes > 0 && in->device_free_bytes > 0) {
        uint64_t used = in->device_total_bytes > in->device_free_bytes
                            ? in->device_total_bytes - in->device_free_bytes
                            : 0;
        in->device_free_bytes = lim > used ? lim - used : 0;
    }
    in->device_total_bytes = lim;
    return 0;
}

/* The device budget under its two names, the device memory limit, and whether the resident
 * set fills the budget (b->fill). DDO_E_CONFIG for a budget of 0 given explicitly or two
 * different budgets. */
static int budget_rules(builder *b, const ddo_config *cfg)
{
    const ddo__options *o = b->o;
    uint64_t a = ddo__gb_to_bytes(o->device_budget_gb);
    uint64_t v = ddo__gb_to_bytes(o->vmm_resident_weight_budget_gb);
    char qa[64], qv[64];
    ddo__format_real(o->device_budget_gb, qa, sizeof(qa));
    ddo__format_real(o->vmm_resident_weight_budget_gb, qv, sizeof(qv));
    if (a == 0 && user_set(cfg, b, "device_budget_gb"))
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "device_budget_gb=%s: a device budget must be positive (leave it unset "
                         "to size the plan from the device)",
                         qa);
    /* A preset's value of the older name gives way to a device_budget_gb of the user's. */
    const char *vsrc = NULL;
    bool v_direct = ddo_config_source(cfg, "vmm_resident_weight_budget_gb", &vsrc) == 0 &&
                    vsrc != NULL && strcmp(vsrc, "default") != 0 &&
                    strncmp(vsrc, "preset:", 7) != 0;
    if (a > 0 && v > 0 && a != v && v_direct)
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "device_budget_gb=%s and vmm_resident_weight_budget_gb=%s (its older "
                         "name) give two different device budgets; give one",
                         qa, qv);
    b->budget = a > 0 ? a : v;
    b->budget_name = a > 0 ? "device_budget_gb" : "vmm_resident_weight_budget_gb";
    int rc = device_memory_limit(b);
    if (rc != 0)
        return rc;
    bool user_resident = user_set(cfg, b, "resident_module_budget_gb") ||
                         user_set(cfg, b, "resident_module_patterns") ||
                         user_set(cfg, b, "resident_module_selection") || o->build_profile ||
                         o->profile_resident_module_budget_gb > 0.0;
    bool balanced = o->auto_budget_policy != NULL && strcmp(o->auto_budget_policy, "balanced") == 0;
    b->fill = !user_resident && (b->budget > 0 || (balanced && b->in.device_total_bytes > 0));
    return 0;
}

ddo_plan *ddo__plan_alloc(void)
{
    return ddo__calloc(1, sizeof(ddo_plan));
}

/* Windows: the DXGI local budget (less vmm_dxgi_local_headroom_gb) bounds the free device
 * memory the plan sizes from, and vmm_dxgi_system_headroom_gb comes off the host's available
 * RAM; what was read, or why nothing was, is recorded (dxgi_budget). */
static void dxgi_budget(builder *b)
{
    const ddo__platform *pf = b->pf;
    if (pf == NULL || !pf->windows || b->in.device_is_cpu)
        return;
    ddo__decisions *d = &b->p->decisions;
    ddo_plan_inputs *in = &b->in;
    uint64_t sys = ddo__gb_to_bytes(b->o->vmm_dxgi_system_headroom_gb);
    if (sys > 0 && in->host_available_bytes > 0) {
        in->host_available_bytes = in->host_available_bytes > sys ? in->host_available_bytes - sys
                                                                  : 1; /* 0 would be unknown */
        ddo__decisions_set_gb(d, "dxgi_system_headroom_gb", sys);
    }
    if (pf->dxgi_why != NULL) {
        char why[96];
        snprintf(why, sizeof(why), "none: %s", pf->dxgi_why);
        ddo__decisions_set_str(d, "dxgi_budget", why);
        return;
    }
    uint64_t h = ddo__gb_to_bytes(b->o->vmm_dxgi_local_headroom_gb);
    uint64_t free_bytes = ddo__dxgi_local_free(&pf->dxgi, h);
    char note[256], v1[32], v2[32], v3[32];
    snprintf(note, sizeof(note), "%s: local budget %s, used %s, headroom %s", pf->dxgi.adapter,
             ddo__format_bytes(pf->dxgi.local_budget, v1, sizeof(v1)),
             ddo__format_bytes(pf->dxgi.local_usage, v2, sizeof(v2)),
             ddo__format_bytes(h, v3, sizeof(v3)));
    ddo__decisions_set_str(d, "dxgi_budget", note);
    ddo__decisions_set_gb(d, "dxgi_local_free_gb", free_bytes);
    if (in->device_free_bytes == 0 || free_bytes < in->device_free_bytes)
        in->device_free_bytes = free_bytes > 0 ? free_bytes : 1; /* 0 would be unknown */
}

int ddo_plan_build(const ddo_checkpoint *ck, const ddo_config *cfg, const ddo_plan_inputs *inputs,
                   ddo_plan **out)
{
    return ddo__plan_build_on(ck, cfg, inputs, NULL, out);
}

/* Device memory other parts of the process give back before this plan's session (a staged
 * pipeline's other components) counts as free, after the limit's and DXGI's caps. */
static void device_reclaimable(builder *b)
{
    uint64_t r = b->in.device_reclaimable_bytes, f = b->in.device_free_bytes;
    if (r == 0 || f == 0)
        return; /* (0 free is "unknown": nothing to add to) */
    uint64_t t = b->in.device_total_bytes;
    f = f > UINT64_MAX - r ? UINT64_MAX : f + r;
    b->in.device_free_bytes = t > 0 && f > t ? t : f;
    ddo__decisions_set_gb(&b->p->decisions, "device_reclaimable_gb", r);
}

/* One build of the plan; no_pack leaves consecutive small blocks in units of their own. */
static int plan_once(const ddo_checkpoint *ck, const ddo_config *cfg, const ddo__options *o,
                     const ddo_plan_inputs *inputs, const ddo__platform *pf, bool no_pack,
                     ddo_plan **out)
{
    int rc = 0;
    builder b;
    memset(&b, 0, sizeof(b));
    b.ck = ck;
    b.o = o;
    b.pf = pf;
    b.no_pack = no_pack;
    if (inputs != NULL && (rc = DDO__ABI_IN(ddo_plan_inputs, inputs, &b.in)) != 0)
        return rc;
    if (ddo_config_settings(cfg, &b.settings) != 0) {
        memset(&b.settings, 0, sizeof(b.settings));
        b.settings.requested_pin_cpu_memory = o->pin_cpu_memory;
        b.settings.effective_pin_cpu_memory = o->pin_cpu_memory;
        b.settings.disable_pin_on_wsl = o->disable_pin_on_wsl;
    }
    if ((rc = budget_rules(&b, cfg)) != 0)
        return rc;
    b.n = ddo_checkpoint_tensor_count(ck);
    b.p = ddo__plan_alloc();
    b.ti = ddo__calloc(b.n ? b.n : 1, sizeof(*b.ti));
    if (b.p == NULL || b.ti == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: %zu tensors", b.n);
        goto out;
    }
    dxgi_budget(&b);
    device_reclaimable(&b);
    b.p->inputs = b.in;
    b.p->inputs.unit_compute_json = NULL;     /* borrowed: the units keep what it said */
    b.p->inputs.device_reclaimable_bytes = 0; /* counted in device_free_bytes (decisions) */
    for (size_t i = 0; i < b.n; i++) {
        b.ti[i] = ddo_checkpoint_tensor(ck, i);
        if (b.ti[i] == NULL || b.ti[i]->name == NULL) {
            rc = ddo__fail(NULL, DDO_E_INTERNAL, "plan: tensor %zu missing", i);
            goto out;
        }
    }
    rc = build(&b);
out:
    ddo__rxset_free(&b.skip);
    ddo__rxset_free(&b.always);
    ddo__rxset_free(&b.vmm);
    ddo__rxset_free(&b.resident);
    free(b.ti);
    free(b.tmod);
    free(b.mods);
    for (size_t k = 0; b.blocks != NULL && k < b.block_count; k++)
        free(b.blocks[k].owned);
    free(b.blocks);
    free(b.scopes);
    if (rc != 0) {
        ddo_plan_destroy(b.p);
        return rc;
    }
    *out = b.p;
    return 0;
}

/* A packed unit is as large as the largest block (unit_pack_blocks, plan_modules.c), so where
 * the plan streams only small blocks its slots grow, and with them the device memory the
 * residents cannot have. Where blocks were packed the plan is built again without packing, and
 * the unpacked one is kept where it is predicted at least PACK_MARGIN shorter (the cost model
 * on) or, with the cost model off, where it keeps more bytes resident; or where the packed plan
 * was refused. Ties go to the packed plan: the simulation reads a ring of many small units as
 * faster than it runs (docs/plan.md, "Units"). */
#define PACK_MARGIN 0.005

static bool unpacked_wins(const ddo_plan *packed, const ddo_plan *plain, char *why, size_t len)
{
    const ddo_plan_budgets *a = &packed->budgets, *c = &plain->budgets;
    if (packed->cost_enabled && plain->cost_enabled && a->predicted_step_s > 0.0) {
        snprintf(why, len, "none: unpacked predicted %.4f s against %.4f s packed",
                 c->predicted_step_s, a->predicted_step_s);
        return c->predicted_step_s < a->predicted_step_s * (1.0 - PACK_MARGIN);
    }
    char v1[32], v2[32];
    snprintf(why, len, "none: unpacked keeps %s resident against %s packed",
             ddo__format_bytes(c->resident_bytes, v1, sizeof(v1)),
             ddo__format_bytes(a->resident_bytes, v2, sizeof(v2)));
    return c->resident_bytes > a->resident_bytes;
}

int ddo__plan_build_on(const ddo_checkpoint *ck, const ddo_config *cfg,
                       const ddo_plan_inputs *inputs, const ddo__platform *pf, ddo_plan **out)
{
    if (ck == NULL || cfg == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_plan_build: checkpoint, config and out are required");
    const ddo__options *o = ddo__config_options(cfg);
    if (o == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_plan_build: config has no options");
    int rc = ddo__config_check_ranges(cfg);
    if (rc != 0)
        return rc;
    ddo_plan *packed = NULL, *plain = NULL;
    rc = plan_once(ck, cfg, o, inputs, pf, false, &packed);
    if (rc == 0 && ddo__decisions_get(&packed->decisions, "packed_blocks") == NULL) {
        *out = packed; /* nothing packed (or unit_pack_blocks off) */
        return 0;
    }
    if (rc != 0 && !o->unit_pack_blocks)
        return rc;
    int rc2 = plan_once(ck, cfg, o, inputs, pf, true, &plain);
    if (rc2 != 0) { /* the unpacked plan's refusal names the smallest units */
        *out = packed;
        return rc != 0 ? rc2 : 0;
    }
    char why[160];
    if (rc != 0)
        snprintf(why, sizeof(why), "none: the packed plan was refused");
    if (rc != 0 || unpacked_wins(packed, plain, why, sizeof(why))) {
        ddo_plan_destroy(packed);
        ddo__decisions_set_str(&plain->decisions, "packed_blocks", why);
        if (plain->decisions.failed) {
            ddo_plan_destroy(plain);
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: decisions");
        }
        *out = plain;
        return 0;
    }
    ddo_plan_destroy(plain);
    *out = packed;
    return 0;
}

void ddo_plan_destroy(ddo_plan *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->tensor_count && p->tensors != NULL; i++)
        free(p->tensors[i].name);
    free(p->tensors);
    for (size_t u = 0; u < p->unit_count && p->units != NULL; u++)
        free(p->units[u].name);
    free(p->units);
    free(p->unit_tensors);
    for (size_t i = 0; i < p->resident_pattern_count; i++)
        free(p->resident_patterns[i]);
    free(p->resident_patterns);
    for (size_t i = 0; i < p->selected_resident_count; i++)
        free(p->selected_resident[i]);
    free(p->selected_resident);
    free(p->route_label);
    free(p->devices);
    ddo__weight_layout_free(&p->weights);
    free(p->unit_granularity);
    free(p->device_limit_source);
    free(p->cost_reason);
    ddo__decisions_free(&p->decisions);
    free(p);
}

/* ---- accessors ---- */

size_t ddo_plan_unit_count(const ddo_plan *p)
{
    return p != NULL ? p->unit_count : 0;
}

int ddo_plan_unit_coded(const ddo_plan *p, size_t unit, uint64_t *coded_bytes,
                        uint64_t *decoded_bytes)
{
    if (p == NULL || unit >= p->unit_count)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_plan_unit_coded: unit %zu out of range",
                         unit);
    const ddo__plan_unit *u = &p->units[unit];
    if (coded_bytes != NULL)
        *coded_bytes = u->coded_bytes > 0 ? u->coded_bytes : u->bytes;
    if (decoded_bytes != NULL)
        *decoded_bytes = u->decoded_bytes;
    return 0;
}

int ddo_plan_unit_reread(const ddo_plan *p, size_t unit, double *read_s, double *stall_s)
{
    if (p == NULL || unit >= p->unit_count)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_plan_unit_reread: unit %zu out of range", unit);
    const ddo__plan_unit *u = &p->units[unit];
    if (read_s != NULL)
        *read_s = u->resident ? 0.0 : u->reread_s;
    if (stall_s != NULL)
        *stall_s = u->resident ? 0.0 : u->reread_stall_s;
    return 0;
}

int ddo_plan_unit(const ddo_plan *p, size_t unit, ddo_unit_info *out)
{
    if (p == NULL || out == NULL || unit >= p->unit_count)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_plan_unit: unit %zu out of range",
                         unit);
    const ddo__plan_unit *u = &p->units[unit];
    ddo_unit_info info = {
        .name = u->name,
        .first_tensor = u->first_tensor,
        .tensor_count = u->tensor_count,
        .bytes = u->bytes,
        .flops_per_token = u->flops_per_token,
        .resident = u->resident,
        .retained = u->retained,
        .registered = u->registered,
        .transfer_s = u->transfer_s,
        .compute_s = u->compute_s,
        .hidden = u->hidden,
    };
    *out = info;
    return 0;
}

const size_t *ddo_plan_unit_tensors(const ddo_plan *p, size_t unit, size_t *count)
{
    if (p == NULL || unit >= p->unit_count) {
        if (count != NULL)
            *count = 0;
        return NULL;
    }
    if (count != NULL)
        *count = p->units[unit].tensor_count;
    return p->unit_tensors + p->units[unit].first_tensor;
}

ddo_placement ddo__plan_tensor_placement(const ddo_plan *p, size_t tensor, ddo_reason *reason)
{
    if (p == NULL || tensor >= p->tensor_count) {
        if (reason != NULL)
            *reason = DDO_REASON_NONE;
        return DDO_PLACEMENT_SKIPPED;
    }
    if (reason != NULL)
        *reason = p->tensors[tensor].loc.reason;
    return p->tensors[tensor].loc.placement;
}

size_t ddo__plan_tensor_unit(const ddo_plan *p, size_t tensor)
{
    if (p == NULL || tensor >= p->tensor_count)
        return SIZE_MAX;
    return p->tensors[tensor].loc.unit;
}

int ddo_plan_tensor_location(const ddo_plan *p, size_t tensor, ddo_tensor_location *out)
{
    if (p == NULL || out == NULL || tensor >= p->tensor_count)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_plan_tensor_location: tensor %zu out of range", tensor);
    *out = p->tensors[tensor].loc;
    return 0;
}

int ddo_plan_budgets_get(const ddo_plan *p, ddo_plan_budgets *out)
{
    if (p == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_plan_budgets_get: plan and out");
    *out = p->budgets;
    return 0;
}

size_t ddo_plan_decision_count(const ddo_plan *p)
{
    return p != NULL ? p->decisions.count : 0;
}

int ddo_plan_decision(const ddo_plan *p, size_t i, const char **key, const char **value)
{
    if (p == NULL || i >= p->decisions.count)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_plan_decision: %zu out of range", i);
    if (key != NULL)
        *key = p->decisions.items[i].key;
    if (value != NULL)
        *value = p->decisions.items[i].value;
    return 0;
}

const char *ddo_plan_route(const ddo_plan *p)
{
    return p != NULL && p->route_label != NULL ? p->route_label : "";
}

const char *ddo_plan_error(const ddo_plan *p)
{
    return p != NULL ? p->err.msg : "";
}

size_t ddo_plan_tensor_count(const ddo_plan *p)
{
    return p != NULL ? p->tensor_count : 0;
}

int ddo_plan_info_get(const ddo_plan *p, ddo_plan_info *out)
{
    if (p == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_plan_info_get: plan and out");
    ddo_plan_info info = DDO_PLAN_INFO_INIT;
    info.route = ddo__route_public(p->route);
    info.stable_addresses = ddo__route_maps(p->route);
    info.route_label = ddo_plan_route(p);
    info.host_residents = p->host_residents;
    info.weight_codec = p->weight_codec;
    info.unit_granularity = p->granularity;
    info.device_mode = p->device_mode;
    info.device_count = p->device_count > 0 ? p->device_count : 1;
    info.devices = p->devices != NULL ? p->devices : "";
    info.store_bytes = p->store_bytes;
    info.store_limit = p->store_limit;
    info.peer_bytes_per_s = p->peer_bytes_per_s;
    info.retained_by_stall = p->retained_by_stall;
    info.codec_sidecar = p->weight_codec == DDO_WEIGHT_CODEC_DDOC1 && p->codec_sidecar;
    info.activation_reserve_bytes = p->activation_reserve;
    info.activation_reserve_estimated = p->activation_reserve_estimated;
    return DDO__ABI_OUT(ddo_plan_info, &info, out);
}

const char *ddo__plan_decision_get(const ddo_plan *p, const char *key)
{
    if (p == NULL || key == NULL)
        return NULL;
    return ddo__decisions_get(&p->decisions, key);
}
