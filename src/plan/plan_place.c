/*
 * plan_place.c - where every tensor goes (docs/plan.md): placement (resident,
 * streamed in a unit, skipped), the units in execution order and their slot layout, the cost
 * model's per-unit times, and the resident selection under the budget. The simulated step is
 * plan_step.c.
 * Part of the build (plan_build.h).
 */
#include "plan/plan_build.h"

#include <stdlib.h>
#include <string.h>

/* Placement before the budget selection; streamed tensors get their unit. */
int ddo__plan_place_units(builder *b)
{
    ddo_plan *p = b->p;
    p->units = ddo__calloc(b->n ? b->n : 1, sizeof(*p->units));
    p->unit_tensors = ddo__calloc(b->n ? b->n : 1, sizeof(*p->unit_tensors));
    size_t *unit_of = ddo__calloc(b->n ? b->n : 1, sizeof(*unit_of));
    if (p->units == NULL || p->unit_tensors == NULL || unit_of == NULL) {
        free(unit_of);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: %zu tensors", b->n);
    }
    for (size_t i = 0; i < b->n; i++) {
        const ddo_tensor_info *t = b->ti[i];
        pmod *m = &b->mods[b->tmod[i]];
        ddo_tensor_location *loc = &p->tensors[i].loc;
        loc->unit = NONE;
        loc->nbytes = t->nbytes;
        p->tensors[i].eligible = ddo__plan_is_eligible(b, i);
        unit_of[i] = NONE;
        if (m->skipped) {
            loc->placement = DDO_PLACEMENT_SKIPPED;
            loc->reason = DDO_REASON_SKIP_PATTERN;
            continue;
        }
        if (m->always && !b->clear_always) {
            loc->placement = DDO_PLACEMENT_RESIDENT;
            loc->reason = DDO_REASON_ALWAYS_RESIDENT;
            continue;
        }
        if (t->nbytes <= b->threshold) {
            loc->placement = DDO_PLACEMENT_RESIDENT;
            loc->reason = DDO_REASON_SMALL;
            continue;
        }
        loc->placement = DDO_PLACEMENT_STREAMED;
        loc->reason = DDO_REASON_NONE;
        bool by_block = !b->leaf && m->block != NONE;
        size_t *slot = by_block ? &b->blocks[m->block].unit : &m->unit;
        if (*slot == NONE) {
            ddo__plan_unit *u = &p->units[p->unit_count];
            const char *nm = by_block ? b->blocks[m->block].name : m->name;
            size_t nl = by_block ? b->blocks[m->block].len : m->len;
            u->name = ddo__strndup(nm, nl);
            if (u->name == NULL) {
                free(unit_of);
                return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: unit names");
            }
            u->full_bytes = by_block ? b->blocks[m->block].full_bytes : m->full_bytes;
            *slot = p->unit_count++;
        }
        unit_of[i] = *slot;
        ddo__plan_unit *u = &p->units[*slot];
        u->tensor_count++;
        u->bytes = ddo__sat_add_u64(u->bytes, t->nbytes);
        if (t->ndim == 2 && ddo__plan_ends_with(t->name, ".weight"))
            u->flops_per_token =
                ddo__sat_add_u64(u->flops_per_token,
                                 ddo__sat_mul_u64(2, ddo__sat_mul_u64(t->shape[0], t->shape[1])));
    }
    /* Tensor ranges per unit, in checkpoint order. */
    size_t at = 0;
    for (size_t u = 0; u < p->unit_count; u++) {
        p->units[u].first_tensor = at;
        at += p->units[u].tensor_count;
        p->units[u].tensor_count = 0;
    }
    for (size_t i = 0; i < b->n; i++) {
        if (unit_of[i] == NONE)
            continue;
        ddo__plan_unit *u = &p->units[unit_of[i]];
        p->unit_tensors[u->first_tensor + u->tensor_count++] = i;
        p->tensors[i].loc.unit = unit_of[i];
    }
    free(unit_of);
    return 0;
}

/* Slot layout of every unit: tensors at DDO_TENSOR_ALIGN-aligned offsets. */
void ddo__plan_layout_units(builder *b)
{
    ddo_plan *p = b->p;
    for (size_t u = 0; u < p->unit_count; u++) {
        ddo__plan_unit *un = &p->units[u];
        uint64_t off = 0;
        for (size_t k = 0; k < un->tensor_count; k++) {
            size_t i = p->unit_tensors[un->first_tensor + k];
            off = ddo__round_up(off, DDO_TENSOR_ALIGN);
            p->tensors[i].loc.offset = off;
            off = ddo__sat_add_u64(off, p->tensors[i].loc.nbytes);
        }
        un->span_bytes = off;
    }
}

/* Per-unit transfer and compute time: measured compute where the inputs give it
 * (plan_cost.c), else the FLOP estimate at the inputs' rate or, without one, at the rate the
 * measured units showed. */
int ddo__plan_cost_model(builder *b)
{
    ddo_plan *p = b->p;
    p->tokens = b->in.tokens > 0 ? b->in.tokens : DDO_PLAN_DEFAULT_TOKENS;
    size_t measured = 0;
    int rc = ddo__plan_measured_compute(b, &measured);
    if (rc != 0)
        return rc;
    double flops = b->in.flops_per_s;
    double rate = flops > 0.0 ? 0.0 : ddo__plan_measured_rate(p);
    p->cost_enabled = b->in.bus_bytes_per_s > 0.0 && (flops > 0.0 || measured > 0);
    ddo__decisions_set_str(&p->decisions, "unit_compute_source",
                           measured == 0               ? "flops"
                           : measured == p->unit_count ? "measured"
                                                       : "measured_and_flops");
    for (size_t u = 0; u < p->unit_count; u++) {
        ddo__plan_unit *un = &p->units[u];
        if (!p->cost_enabled) {
            un->compute_s = 0.0;
            continue;
        }
        un->transfer_s = ddo__plan_unit_transfer_s(b, un, b->in.decode_bytes_per_s);
        if (un->compute_measured)
            continue;
        un->compute_s = flops > 0.0 ? (double)p->tokens * (double)un->flops_per_token / flops
                                    : rate * (double)un->flops_per_token;
    }
    return 0;
}

/* Marks scope's modules (and so their units) budget-resident. */
static void select_scope(builder *b, const pscope *s)
{
    if (s->is_block)
        b->blocks[s->index].selected = true;
    else
        b->mods[s->index].selected = true;
}

/* Streamed tensors of selected scopes become budget-resident; their units are resident. */
static void make_budget_resident(builder *b)
{
    ddo_plan *p = b->p;
    for (size_t i = 0; i < b->n; i++) {
        ddo_tensor_location *loc = &p->tensors[i].loc;
        const pmod *m = &b->mods[b->tmod[i]];
        bool sel = m->selected || (m->block != NONE && b->blocks[m->block].selected);
        if (!sel || loc->placement != DDO_PLACEMENT_STREAMED)
            continue;
        p->units[loc->unit].resident = true;
        loc->placement = DDO_PLACEMENT_RESIDENT;
        loc->reason = DDO_REASON_BUDGET;
        loc->unit = NONE;
    }
}

int ddo__plan_resident_selection(builder *b, uint64_t budget)
{
    ddo_selection how = DDO_SELECTION_SPREAD;
    if (!ddo__selection_from_name(b->o->resident_module_selection, &how))
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "resident_module_selection: \"%s\" is not one of first, spread, "
                         "largest, cost",
                         b->o->resident_module_selection ? b->o->resident_module_selection : "");
    return ddo__plan_resident_select(b, budget, how);
}

int ddo__plan_resident_select(builder *b, uint64_t budget, ddo_selection how)
{
    ddo_plan *p = b->p;
    ddo__decisions *d = &p->decisions;
    if (how == DDO_SELECTION_COST && !p->cost_enabled) {
        how = DDO_SELECTION_SPREAD;
        ddo__decisions_set_str(d, "resident_module_selection_fallback", "spread");
    }
    ddo__decisions_set_str(d, "resident_module_selection", ddo__selection_name(how));
    if (budget == 0 || b->scope_count == 0) {
        ddo__decisions_set_gb(d, "selected_resident_module_gb", 0);
        return 0;
    }
    uint64_t *sizes = ddo__calloc(b->scope_count, sizeof(*sizes));
    size_t *order = ddo__calloc(b->scope_count, sizeof(*order));
    size_t *chosen = ddo__calloc(b->scope_count, sizeof(*chosen));
    int rc = 0;
    if (sizes == NULL || order == NULL || chosen == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: resident selection");
        goto out;
    }
    for (size_t s = 0; s < b->scope_count; s++)
        sizes[s] = b->scopes[s].full_bytes;
    size_t n;
    uint64_t taken = 0;
    if (how == DDO_SELECTION_COST) {
        n = ddo__plan_select_by_simulation(b, sizes, budget, chosen, &taken);
        if (n == SIZE_MAX) {
            rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: resident selection");
            goto out;
        }
    } else {
        ddo__select_order(sizes, b->scope_count, budget, how, order);
        n = ddo__select_greedy(sizes, order, b->scope_count, budget, chosen, &taken);
    }
    p->selected_resident = ddo__calloc(n ? n : 1, sizeof(char *));
    if (p->selected_resident == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: resident selection");
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        const pscope *sc = &b->scopes[chosen[k]];
        select_scope(b, sc);
        const char *nm = sc->is_block ? b->blocks[sc->index].name : b->mods[sc->index].name;
        size_t nl = sc->is_block ? b->blocks[sc->index].len : b->mods[sc->index].len;
        char *c = ddo__strndup(nm, nl);
        if (c == NULL) {
            rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: resident selection");
            goto out;
        }
        p->selected_resident[p->selected_resident_count++] = c;
    }
    ddo__decisions_set_gb(d, "selected_resident_module_gb", taken);
    make_budget_resident(b);
out:
    free(sizes);
    free(order);
    free(chosen);
    return rc;
}

/* The aligned bytes of the tensors placed resident (fixed) and streamed (*streamed). */
static uint64_t placed_bytes(const builder *b, uint64_t *streamed)
{
    uint64_t fixed = 0;
    *streamed = 0;
    for (size_t i = 0; i < b->n; i++) {
        const ddo_tensor_location *loc = &b->p->tensors[i].loc;
        uint64_t a = ddo__round_up(loc->nbytes, DDO_TENSOR_ALIGN);
        if (loc->placement == DDO_PLACEMENT_RESIDENT)
            fixed = ddo__sat_add_u64(fixed, a);
        else if (loc->placement == DDO_PLACEMENT_STREAMED)
            *streamed = ddo__sat_add_u64(*streamed, a);
    }
    return fixed;
}

void ddo__plan_fill_fixed_rules(builder *b, uint64_t limit)
{
    uint64_t fixed = 0, largest = 0, page = 0;
    for (size_t i = 0; i < b->n; i++) {
        const pmod *m = &b->mods[b->tmod[i]];
        if (!m->skipped && (m->always || b->ti[i]->nbytes <= b->threshold))
            fixed = ddo__sat_add_u64(fixed, ddo__round_up(b->ti[i]->nbytes, DDO_TENSOR_ALIGN));
    }
    for (size_t k = 0; k < b->block_count && !b->leaf; k++)
        largest = b->blocks[k].full_bytes > largest ? b->blocks[k].full_bytes : largest;
    for (size_t m = 0; m < b->mod_count; m++)
        if (!b->mods[m].skipped && (b->leaf || b->mods[m].block == NONE))
            largest = b->mods[m].full_bytes > largest ? b->mods[m].full_bytes : largest;
    if (ddo__plan_slot_page(b, &page) != 0 || page == 0)
        page = ddo__plan_granularity(b->p);
    uint64_t need = ddo__sat_add_u64(fixed, ddo__sat_mul_u64(2, ddo__round_up(largest, page)));
    bool keep = need <= limit;
    ddo__decisions_set_str(&b->p->decisions, "small_and_always_resident_rule",
                           keep ? "within_budget" : "streamed_over_budget");
    if (keep)
        return;
    /* Hard limits beat heuristics: those tensors stream with their units. */
    b->threshold = 0;
    b->clear_always = true;
}

/* fill without the cost model, or on vmm_runtime: what the limit leaves beside two slots of
 * the largest unit (per-weight handles on vmm_runtime) and the fixed residents. */
static uint64_t room_beside_slots(builder *b, uint64_t limit)
{
    budgets_in bi;
    memset(&bi, 0, sizeof(bi));
    bi.auto_resident = true;
    bi.resident_budget = UINT64_MAX;
    ddo__plan_cap_auto_resident(b, &bi, limit);
    return bi.resident_budget;
}

int ddo__plan_fill_resident(builder *b, uint64_t limit)
{
    ddo_plan *p = b->p;
    ddo__decisions *d = &p->decisions;
    uint64_t streamed = 0, fixed = placed_bytes(b, &streamed);
    uint64_t codec = ddo__plan_codec_area_estimate(b);
    if (codec > 0) {
        /* weight_codec: the decode areas beside whatever streams. */
        ddo__decisions_set_gb(d, "fill_codec_reserve_gb", codec);
        b->codec_reserve = codec;
        limit = limit > codec ? limit - codec : 0;
    }
    ddo_selection how;
    uint64_t budget;
    const char *rule;
    if (ddo__sat_add_u64(fixed, streamed) <= limit) {
        how = DDO_SELECTION_FIRST;
        budget = UINT64_MAX;
        rule = "fill_all_fits";
        ddo__decisions_set_str(d, "plan_note",
                               "the whole model fits the device budget: nothing "
                               "streams");
    } else if (p->cost_enabled && !ddo__route_per_weight(p->route)) {
        how = DDO_SELECTION_COST;
        budget = limit > fixed ? limit - fixed : 0;
        rule = "fill_cost";
    } else {
        how = p->cost_enabled ? DDO_SELECTION_COST : DDO_SELECTION_SPREAD;
        budget = room_beside_slots(b, limit);
        rule = p->cost_enabled ? "fill_cost" : "fill_spread";
    }
    ddo__decisions_set_str(d, "resident_set_rule", rule);
    ddo__decisions_set_gb(d, "resident_module_budget_gb", budget == UINT64_MAX ? streamed : budget);
    uint64_t device_limit = b->device_limit;
    b->device_limit = limit; /* the cost selection's fit, without the decode areas */
    int rc = ddo__plan_resident_select(b, budget, how);
    b->device_limit = device_limit;
    return rc;
}
