/*
 * plan.h - the planner's internal data: the plan object behind ddo_plan, the
 * selection functions, the balanced auto budget policy, pin budget
 * resolution (docs/plan.md, "How every number is computed"), the ordered
 * list of planner decisions and the geometry a session executes (slots,
 * staging, and the per-weight layout of vmm_runtime). Internal; never installed.
 *
 * The planner's files: plan.c (the build's steps, destroy, accessors),
 * plan_modules.c, plan_place.c, plan_host.c, plan_device.c (plan_build.h),
 * plan_budget.c, plan_select.c, plan_json.c.
 */
#ifndef DDO_PLAN_H
#define DDO_PLAN_H

#include "base/common.h"
#include "config/route.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Staging windows: the total staging is a whole number of these. */
#define DDO_STAGING_WINDOW_BYTES (32 * DDO_MIB)
/* Tokens the cost model assumes when the inputs give none. */
#define DDO_PLAN_DEFAULT_TOKENS 4096
/* weight_codec estimates (docs/codec.md, "Estimates"): coded / raw per coded dtype when the
 * inputs give no codec_ratio (measured on `ddo synth --values normal`), and the decoder's
 * output rate when they give no decode_bytes_per_s (cuda: the H200's, docs/codec.md; the cpu
 * device: its C decoder on one thread, `ddo inspect --codec --verify` on the build machine). */
/* weight_codec=auto codes only when the coded step is predicted this much shorter. */
#define DDO_PLAN_CODEC_MIN_GAIN         0.02
#define DDO_PLAN_CODEC_RATIO_BF16       0.67
#define DDO_PLAN_CODEC_RATIO_F16        0.85
#define DDO_PLAN_CODEC_RATIO_F32        0.83
#define DDO_PLAN_CODEC_RATIO_F8         0.83
#define DDO_PLAN_DECODE_BYTES_PER_S     400e9
#define DDO_PLAN_CPU_DECODE_BYTES_PER_S 0.25e9
/* weight_codec=auto codes only when the coded step is predicted this much shorter. */
#define DDO_PLAN_CODEC_MIN_GAIN 0.02
/* The pin snap: a pin budget of at least 95 % of the candidates pins them all. */
#define DDO_PIN_SNAP_FRACTION 0.95
/* weight_codec: the coded-bytes areas a session decodes from, in turn (plan_codec.c): the copy
 * stream uploads a tensor into one while the decode stream decodes the one before. */
#define DDO_CODEC_DECODE_AREAS 2

/* ---- decisions: an ordered key -> value list (re-recording a key replaces its value) ---- */

typedef struct ddo__decision {
    char *key;
    char *value;    /* text; numbers in their JSON spelling */
    bool is_number; /* emitted as a JSON number */
} ddo__decision;

typedef struct ddo__decisions {
    ddo__decision *items;
    size_t count;
    size_t cap;
    bool failed; /* an allocation failed; the list is incomplete */
} ddo__decisions;

void ddo__decisions_free(ddo__decisions *d);
void ddo__decisions_set_str(ddo__decisions *d, const char *key, const char *value);
/* A GiB value (bytes / 2^30) rounded to 4 decimals, as upstream records it. */
void ddo__decisions_set_gb(ddo__decisions *d, const char *key, uint64_t bytes);
/* A plain number rounded to 4 decimals. */
void ddo__decisions_set_num(ddo__decisions *d, const char *key, double value);
void ddo__decisions_set_bool(ddo__decisions *d, const char *key, bool value);
/* The value recorded for key, or NULL. */
const char *ddo__decisions_get(const ddo__decisions *d, const char *key);
/* A tensor's placement (and why) and its unit, SIZE_MAX unless streamed (out of range: skipped,
 * SIZE_MAX), and the value of a decision key (NULL when absent): what ddo_plan_tensor_location
 * and ddo_plan_decision give hosts, one field at a time (the tests read them). */
ddo_placement ddo__plan_tensor_placement(const ddo_plan *p, size_t tensor, ddo_reason *reason);
size_t ddo__plan_tensor_unit(const ddo_plan *p, size_t tensor);
const char *ddo__plan_decision_get(const ddo_plan *p, const char *key);
/* Formats v rounded to 4 decimals the way Python prints round(v, 4): "6.0", "18.5181". */
void ddo__format_num4(double v, char *buf, size_t len);

/* ---- selection (plan_select.c) ---- */

/*
 * Orders items for a selection: first (as given), largest (stable, by size
 * descending) or spread (using budget for k). order receives a
 * permutation of 0..count-1. DDO_SELECTION_COST is not handled here.
 */
void ddo__select_order(const uint64_t *sizes, size_t count, uint64_t budget, ddo_selection how,
                       size_t *order);
/*
 * Greedy skip-on-overflow over order: an item is taken when selected + size <=
 * budget. Chosen indices go to chosen_idx in order; returns their number and
 * the bytes taken in *taken (may be NULL).
 */
size_t ddo__select_greedy(const uint64_t *sizes, const size_t *order, size_t count, uint64_t budget,
                          size_t *chosen_idx, uint64_t *taken);
/*
 * The cost selection: items with deficit > 0 (transfer not hidden behind the
 * previous unit's compute), largest deficit first (stable), greedy within
 * budget. Returns the number chosen.
 */
size_t ddo__select_by_cost(const uint64_t *sizes, const double *deficits, size_t count,
                           uint64_t budget, size_t *chosen_idx, uint64_t *taken);
/* Parses "first" | "spread" | "largest" | "cost"; false when unknown. */
bool ddo__selection_from_name(const char *name, ddo_selection *out);
const char *ddo__selection_name(ddo_selection how);

/* ---- balanced auto budget policy and pin resolution (plan_budget.c) ---- */

typedef struct ddo__balanced_in {
    uint64_t resident_budget;      /* R0: resident_module_budget_gb */
    uint64_t pin_budget;           /* P0: pin_weight_budget_gb */
    double pin_ratio;              /* rho: pin_weight_budget_ratio */
    uint64_t max_resident;         /* MAXR */
    uint64_t max_pin;              /* MAXP */
    uint64_t available_ram;        /* A; 0 = unknown */
    uint64_t ram_headroom;         /* H */
    uint64_t total_vram;           /* V; 0 = unknown */
    uint64_t vram_headroom_option; /* auto_vram_headroom_gb; 0 = the table */
    double full_pin_min_ratio;     /* T */
    uint64_t profile_resident;     /* PR */
    bool profile_applied;
    bool pin_requested;
    uint64_t candidate_weight;   /* W */
    uint64_t candidate_resident; /* M */
} ddo__balanced_in;

typedef struct ddo__balanced_out {
    uint64_t resident_budget; /* the resident budget after the policy */
    bool pin_decided;         /* step 9 ran: pin_budget / pin_ratio are the policy's */
    uint64_t pin_budget;
    double pin_ratio;
    bool full_pin;       /* FP */
    bool skip_pin;       /* skip_insufficient_ram */
    bool force_full_pin; /* full_pin_zero_resident: clear always-resident, pin all */
} ddo__balanced_out;

/* The default VRAM headroom of the balanced policy's table (docs/plan.md), bytes (ratio = M / V).
 */
uint64_t ddo__vram_headroom_default(uint64_t total_vram, double model_to_vram_ratio);
/* Runs the balanced policy (docs/plan.md, steps 1-9), recording its decisions. */
void ddo__balanced_policy(const ddo__balanced_in *in, ddo__balanced_out *out, ddo__decisions *d);

typedef enum ddo__pin_mode {
    DDO_PIN_MODE_UNLIMITED_FULL_PIN,
    DDO_PIN_MODE_SNAP_TO_FULL_PIN,
    DDO_PIN_MODE_LIMITED
} ddo__pin_mode;

typedef struct ddo__pin_resolution {
    ddo__pin_mode mode;
    uint64_t budget; /* limited: the byte budget; full modes: the candidates' total */
    bool snapped;    /* the 0.95 snap fired */
} ddo__pin_resolution;

/*
 * Pin budget resolution (docs/plan.md, steps 1-6) for candidates totalling
 * candidates bytes, recording resolved_pin_weight_budget_mode / _gb and
 * pin_weight_budget_snap_to_full.
 */
void ddo__pin_resolve(uint64_t candidates, uint64_t pin_budget, double pin_ratio, uint64_t max_pin,
                      bool force_full_pin, ddo__pin_resolution *out, ddo__decisions *d);
const char *ddo__pin_mode_name(ddo__pin_mode mode);
/* WDDM's pool of pinned host memory (plan_budget.c): half of physical RAM, in whole 64 MiB
 * segments (0 when RAM is unknown: no cap). */
uint64_t ddo__wddm_pin_cap(uint64_t ram_total_bytes);

/* ---- the plan object ---- */

/*
 * vmm_runtime's geometry at one mapping granularity (plan_device.c): cuMemMap maps a handle
 * only at offset 0, so every streamed weight has its own reserved range and, while its unit
 * is mapped, its own physical handle of its size rounded up to the granularity. Arrays are
 * indexed by tensor (range/handle) and by unit; resident units and tensors not streamed have 0.
 */
typedef struct ddo__weight_layout {
    uint64_t granularity;
    uint64_t *range_bytes;  /* the weight's reserved range: at least one granule */
    uint64_t *handle_bytes; /* the weight's handle (0 for an empty tensor) */
    uint64_t *unit_bytes;   /* the unit's handles together */
    uint64_t slot_bytes;    /* the largest unit's, at least one granule (0: nothing streams) */
    size_t largest_unit;    /* that unit (SIZE_MAX when nothing streams) */
    size_t handle_count;    /* weights with a handle: what the handle pool can ever hold */
    size_t too_large;       /* the first weight whose sizes overflow (SIZE_MAX: none) */
} ddo__weight_layout;

typedef struct ddo__plan_unit {
    char *name;
    size_t first_tensor; /* index into unit_tensors */
    size_t tensor_count;
    uint64_t bytes;      /* streamed bytes (sum of tensor nbytes) */
    uint64_t span_bytes; /* bytes of the unit's slot layout (tensors aligned) */
    uint64_t full_bytes; /* every non-skipped byte of the unit's scope */
    uint64_t flops_per_token;
    bool resident;
    bool retained;
    bool registered;
    double transfer_s;
    double compute_s;
    bool compute_measured; /* compute_s from the inputs' unit_compute_json */
    bool hidden;
    uint64_t coded_bytes;   /* weight_codec: estimated bytes over the bus; 0 = not coded */
    uint64_t decoded_bytes; /* weight_codec: raw bytes of its coded tensors (decoder output) */
    double reread_s;        /* its bytes at the file rate (0: no file rate or cost model) */
    double reread_stall_s;  /* what of reread_s the compute before it cannot hide */
} ddo__plan_unit;

typedef struct ddo__plan_tensor {
    char *name;
    ddo_tensor_location loc;
    bool eligible; /* a 2-D *.weight of a module matching vmm_module_pattern */
} ddo__plan_tensor;

struct ddo_plan {
    ddo__errbuf err;
    ddo__route route;  /* decided once by the planner (from execution_mode; on load, the label) */
    char *route_label; /* ddo_plan_route and the JSON "route": the route's or the preset's name */
    char *unit_granularity; /* the JSON's word for granularity */
    /* The facts the session acts on (ddo_plan_info), set by the planner beside the decisions
     * that explain them; the decisions are never read back for behaviour. */
    ddo_unit_granularity granularity;
    ddo_host_residents host_residents;
    ddo_weight_codec weight_codec;
    bool retained_by_stall; /* the retained units were chosen by their re-read stall */
    /* weight_codec=ddoc1: with weight_codec_cache_dir set, file-streamed tensors are read from
     * their sidecar's coded streams (false: auto found the plan not disk-bound; raw) */
    bool codec_sidecar;
    uint64_t activation_reserve;       /* sized from the device: the reserve kept (else 0) */
    bool activation_reserve_estimated; /* ... the planner's estimate (ddo_plan_info) */
    size_t tensor_count;
    ddo__plan_tensor *tensors;
    size_t unit_count;
    ddo__plan_unit *units;
    size_t *unit_tensors; /* unit_count ranges of tensor indices */
    ddo_plan_budgets budgets;
    ddo_plan_inputs inputs;
    char *device_limit_source; /* what set device_weights_limit ("none" when unknown) */
    bool cost_enabled;
    char *cost_reason; /* why the cost model is off ("" when on) */
    uint64_t tokens;
    uint64_t total_bytes;
    uint64_t bytes_by_placement[3]; /* resident, streamed, skipped */
    uint64_t bytes_by_reason[5];    /* indexed by ddo_reason */
    char **resident_patterns;       /* resolved resident_module_patterns */
    size_t resident_pattern_count;
    char **selected_resident; /* names of the budget-resident scopes, in selection order */
    size_t selected_resident_count;
    ddo__decisions decisions;
    ddo__weight_layout weights; /* vmm_runtime, at the plan's granularity (all zero otherwise) */
    /* The device set (plan_devset.c; the JSON's "device_set", written for a set only). */
    ddo_device_mode device_mode;
    size_t device_count;
    char *devices; /* NULL without a set */
    uint64_t store_bytes, store_limit;
    double peer_bytes_per_s;
};

/* Allocates an empty plan (all zero). NULL on allocation failure. */
ddo_plan *ddo__plan_alloc(void);

/* ---- the geometry a session executes (plan_device.c) ---- */

/* The mapping granularity the plan was made for: its inputs', else 2 MiB. */
uint64_t ddo__plan_granularity(const ddo_plan *p);
/* vmm_runtime's per-weight layout of p at granularity gran into *out (freed with
 * ddo__weight_layout_free). The build and a plan read back use it, and a session on a device
 * that maps in another granule. 0 or DDO_E_NO_MEMORY. */
int ddo__weight_layout_build(const ddo_plan *p, uint64_t gran, ddo__weight_layout *out);
void ddo__weight_layout_free(ddo__weight_layout *wl);
/* Whether the mapped budget limit (from limit_source) holds resident_bytes and the largest
 * unit's weights of wl: 0, or DDO_E_BUDGET naming the unit (or the weight too large to map)
 * into eb (may be NULL). */
int ddo__weight_layout_check(const ddo_plan *p, const ddo__weight_layout *wl,
                             uint64_t resident_bytes, uint64_t limit, const char *limit_source,
                             ddo__errbuf *eb);
/* The plan's vmm_runtime layout, or NULL on the other routes. */
const ddo__weight_layout *ddo__plan_weight_layout(const ddo_plan *p);
/* The route the plan executes. */
ddo__route ddo__plan_route_of(const ddo_plan *p);
/* What a plan read back (plan_json.c) derives from its stored fields, by the functions the
 * build uses: the route of its label and the vmm_runtime layout. 0 or DDO_E_NO_MEMORY. (The
 * other facts, granularity, host residents and codec, plan_json.c reads from its fields.) */
int ddo__plan_restore(ddo_plan *p);

/* ---- the device set (plan_devset.c) ---- */

struct ddo__options;
struct json_t;
/* The set of the devices option into p (after placement): DDO_E_CONFIG for a set it cannot
 * use, DDO_E_BUDGET when the donor store exceeds its limit. */
int ddo__plan_devset(ddo_plan *p, const struct ddo__options *o);
/* Whether the devices option names a donor set (two or more devices, device_mode not split):
 * the host side then retains no streamed unit, since they come from the store device. */
bool ddo__plan_devset_donor(const struct ddo__options *o);
/* Adds "device_set" to the plan's JSON object (nothing for one device); 0 or DDO_E_NO_MEMORY. */
int ddo__plan_devset_json(const ddo_plan *p, struct json_t *root);
/* Reads "device_set" back (absent: one device); NULL, or the field at fault. */
const char *ddo__plan_devset_read(ddo_plan *p, struct json_t *root);
/* "single", "donor", "split". */
const char *ddo__device_mode_name(ddo_device_mode m);

struct ddo__platform;
/* ddo_plan_build with the facts of the platform (platform.h; NULL: none, as ddo_plan_build):
 * on Windows the DXGI budget bounds the free device memory and WDDM caps registration. */
int ddo__plan_build_on(const ddo_checkpoint *ck, const ddo_config *cfg,
                       const ddo_plan_inputs *inputs, const struct ddo__platform *pf,
                       ddo_plan **out);

/* The seam of the ring of home slots (vmm_fast_runtime; docs/map.md, step 4): where the r-th of
 * m streamed units of the order takes slot ((r + m - seam) mod m) mod k. Where k does not
 * divide m the last round is short, and where it meets the first a unit's home is still held by
 * a unit needed before it: the seam goes where the 2k units around it hold the fewest bytes
 * (bytes_at(ctx, r): the r-th unit's), nearest the middle of the order on ties, and never within
 * k units of the pass boundary (the next pass's first units load at this one's end). 0 where k
 * divides m or m <= k. The session places its units so (session_prefetch.c) and the plan's
 * simulated step models the same ring (plan_step.c). */
size_t ddo__ring_seam(size_t m, size_t k, uint64_t (*bytes_at)(const void *ctx, size_t r),
                      const void *ctx);
/* The home slot of the r-th of m streamed units over k slots, round the ring from seam. */
size_t ddo__ring_home(size_t r, size_t m, size_t seam, size_t k);

#endif /* DDO_PLAN_H */
