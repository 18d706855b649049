/*
 * plan_build.h - the planner's working state while one plan is built, shared by the files of
 * the build: plan.c (the order of the steps, the budgets), plan_modules.c (modules, blocks,
 * patterns and resident candidates from the tensor names), plan_place.c (placement, units,
 * the cost model and the resident selection), plan_step.c (the simulated step), plan_host.c (the
 * retained store, registration and staging) and plan_device.c (the resident arena, slots and the
 * device-weights limit). Internal to the planner; the plan itself is in plan.h.
 */
#ifndef DDO_PLAN_BUILD_H
#define DDO_PLAN_BUILD_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "plan/plan.h"

#include "config/config.h"

#include <pcre2.h>
#include <stdio.h>

#define NONE SIZE_MAX

/* A set of compiled patterns with Python re search semantics (plan_modules.c). */
typedef struct rxset {
    pcre2_code **codes;
    const char **pats; /* borrowed from the options, valid while the plan is built */
    size_t count;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    const char *option;
} rxset;

typedef struct pmod {
    const char *name; /* borrowed from a tensor name */
    size_t len;
    size_t block; /* NONE when outside every block */
    bool skipped, always, vmm, matches, selected;
    size_t unit;
    size_t scope; /* its resident candidate, NONE if not one */
    uint64_t full_bytes;
} pmod;

typedef struct pblock {
    const char *name;
    size_t len;
    bool matches, selected;
    size_t unit;
    size_t scope;
    uint64_t full_bytes;
    char *owned; /* a packed unit's name ("prefix.A-B"), which name points to; else NULL */
} pblock;

typedef struct pscope {
    bool is_block;
    size_t index; /* into blocks or mods */
    uint64_t full_bytes;
} pscope;

typedef struct builder {
    const ddo_checkpoint *ck;
    const ddo__options *o;
    ddo_settings settings;
    ddo_plan_inputs in;
    ddo_plan *p;
    size_t n; /* tensors */
    const ddo_tensor_info **ti;
    size_t *tmod; /* tensor -> module */
    pmod *mods;
    size_t mod_count;
    pblock *blocks;
    size_t block_count;
    pscope *scopes;
    size_t scope_count;
    rxset skip, always, vmm, resident;
    bool leaf;
    bool pack;    /* unit_pack_blocks: consecutive small blocks share a unit (plan_modules.c) */
    bool no_pack; /* this build leaves them apart (plan.c: a plan built twice) */
    bool clear_always;
    uint64_t threshold;
    uint64_t device_limit; /* the device-weights limit (0: none), once ddo__plan_device_limit ran */
    size_t chosen_slots;   /* the "cost" selection's slot count (0: none chosen) */
    /* The device budget (plan.c): device_budget_gb, or its older name
     * vmm_resident_weight_budget_gb (0: none given), and which of the two gave it. */
    uint64_t budget;
    const char *budget_name;
    /* The resident set fills the device-weights limit (no resident_module_budget_gb,
     * patterns or selection of the user's, a limit known): every block and module outside a
     * block is a candidate, chosen by the cost model's simulated step (plan_place.c). */
    bool fill;
    uint64_t codec_reserve; /* fill: decode memory held back from the limit (plan_place.c) */
    /* weight_codec=auto with weight_codec_cache_dir: the plan is not disk-bound, so the
     * file-streamed tensors are read raw, not from their sidecar (plan_codec.c) */
    bool codec_no_sidecar;
    bool codec_sidecar_decided;     /* ... and the decision codec_sidecar is recorded */
    const struct ddo__platform *pf; /* Windows facts (platform.h), or NULL */
} builder;

/* The budgets build() carries from the policy to placement, pinning and the device side. */
typedef struct budgets_in {
    uint64_t A, V, M; /* available RAM, device memory, candidate resident bytes */
    bool balanced;
    uint64_t resident_budget, pin_budget;
    double pin_ratio;
    bool force_full, skip_pin, auto_resident;
} budgets_in;

static inline uint64_t floor_to(uint64_t v, uint64_t unit)
{
    return v - v % unit;
}

/* ---- plan_modules.c ---- */

void ddo__rxset_free(rxset *s);
/* Modules and blocks from the tensor names, in checkpoint order. */
int ddo__plan_build_modules(builder *b);
/* The skip, always-resident and vmm patterns, matched against every module. */
int ddo__plan_compile_patterns(builder *b);
/* resident_module_patterns with `auto` expanded to one anchored pattern per block group. */
int ddo__plan_resolve_resident_patterns(builder *b);
/* The resident candidates ("scopes") in traversal order and their full sizes. */
int ddo__plan_build_scopes(builder *b);
/* A 2-D *.weight of a module matching vmm_module_pattern, not skipped. */
bool ddo__plan_is_eligible(const builder *b, size_t i);
/* True when s ends with suffix. */
bool ddo__plan_ends_with(const char *s, const char *suffix);

/* ---- plan_step.c: the simulated step ---- */

/* A unit's transfer: its bus bytes (coded_bytes when coded) / bus, for a coded unit at least
 * its decoded bytes / decode_rate (the upload and the decode overlap). */
double ddo__plan_unit_transfer_s(const builder *b, const ddo__plan_unit *un, double decode_rate);
/* The deepest ring an automatic slot count takes (the deeper-ring rule of plan_device.c and the
 * cost selection's slot search of plan_cost.c); execution_slots may set more. */
#define DDO__AUTO_SLOTS_MAX 8
/* The predicted step time with slots execution slots (0 when the cost model is off). */
double ddo__plan_simulate(const ddo_plan *p, size_t slots);
/* The same with every transfer taking transfer_scale times as long. */
double ddo__plan_simulate_scaled(const ddo_plan *p, size_t slots, double transfer_scale);

/* ---- plan_place.c ---- */

/* Placement before the budget selection; streamed tensors get their unit. */
int ddo__plan_place_units(builder *b);
/* Slot layout of every unit: tensors at DDO_TENSOR_ALIGN-aligned offsets. */
void ddo__plan_layout_units(builder *b);
/* Per-unit transfer and compute time (measured compute where the inputs give it). */
int ddo__plan_cost_model(builder *b);
/* plan_cost.c: the inputs' unit_compute_json into the units (*measured: how many it named);
 * the seconds per FLOP-per-token the measured units showed; the "cost" selection, greedy on
 * the simulated step (SIZE_MAX: out of memory). */
int ddo__plan_measured_compute(builder *b, size_t *measured);
double ddo__plan_measured_rate(const ddo_plan *p);
size_t ddo__plan_select_by_simulation(builder *b, const uint64_t *sizes, uint64_t budget,
                                      size_t *chosen, uint64_t *taken);
/* The execution-slot page (vmm_page_mb, else the device granularity). */
int ddo__plan_slot_page(const builder *b, uint64_t *page);
/* The budget-resident scopes under budget, by resident_module_selection. */
int ddo__plan_resident_selection(builder *b, uint64_t budget);
/* The same by the selection how. */
int ddo__plan_resident_select(builder *b, uint64_t budget, ddo_selection how);
/* fill: the resident set that fills limit (plan_place.c), recording which rule chose it. */
int ddo__plan_fill_resident(builder *b, uint64_t limit);
/* fill: small-tensor and always-resident rules only while limit holds them beside two slots of
 * the largest unit; else those tensors stream with their units (before placement). */
void ddo__plan_fill_fixed_rules(builder *b, uint64_t limit);

/* ---- plan_host.c ---- */

/* Retained store, registration and staging for the route. */
int ddo__plan_host_side(builder *b, uint64_t available, const ddo__pin_resolution *pin,
                        bool pin_skipped);

/* ---- plan_device.c ---- */

/* The device weights limit and where it comes from (source, len bytes). */
int ddo__plan_device_limit(builder *b, const budgets_in *bi, uint64_t *limit, char *source,
                           size_t len);
/* ddo: an automatic resident budget leaves room for two slots and the fixed residents. */
void ddo__plan_cap_auto_resident(builder *b, budgets_in *bi, uint64_t limit);
/* Resident arena offsets, slot size and count, and the device-weights check. */
/* The resident arena's layout (every resident tensor's offset); returns its bytes. */
uint64_t ddo__plan_resident_arena(builder *b);
int ddo__plan_device_side(builder *b, uint64_t limit, const char *limit_source);

/* ---- plan_codec.c ---- */

/* weight_codec: the decision, the decode area in the device peak, the encoder's buffer in the
 * retained peak. DDO_E_UNSUPPORTED / DDO_E_BUDGET for an explicit codec that cannot run. */
int ddo__plan_codec(builder *b);
/* fill: the decode memory weight_codec may need whichever units stream (0 without a codec),
 * held back from the limit before the resident set is chosen. */
uint64_t ddo__plan_codec_area_estimate(const builder *b);
/* A tensor the store may code (retained, in a file or in host memory, a coded dtype), and the
 * status bytes its decode needs (16 per block). */
bool ddo__plan_codec_candidate(const ddo_tensor_info *ti, bool retained);
uint64_t ddo__plan_codec_status_bytes(const ddo_tensor_info *ti);
/* A caller's host tensors with weight_codec: what registering in place takes for the ones the
 * codec does not code (streamed in registered units, and the residents when they are
 * registered in place: decision host_residents), plan_host.c. */
uint64_t ddo__plan_host_pins_uncoded(const builder *b);

#endif /* DDO_PLAN_BUILD_H */
