/*
 * plan_codec.c - the planner's share of the weight codec (weight_codec, docs/codec.md):
 * whether the plan codes the retained store, and what coding costs in the budgets.
 *
 *   weight_codec=none   nothing changes
 *   weight_codec=auto   ddoc1 where the device has a decoder and, with a cost model, where the
 *                       coded step is predicted at least 2 % shorter than the raw one (the
 *                       decodes counted as device time beside the compute); else none, with
 *                       a note
 *   weight_codec=ddoc1  the codec; a device without a decoder refuses the plan (one line)
 *
 * What is coded: the retained file tensors of streamed units whose dtype the codec codes
 * (BF16, F16, F32, FP8), and with weight_codec_cache_dir set the non-retained ones too (streamed
 * from their sidecar's coded streams, session_codec.c coded_file; their staging windows stay
 * sized by raw bytes, a stream being shorter than its tensor); the session's store (source_codec.c)
 * keeps a tensor raw when its coded stream would not be smaller. Coded sizes are known only once
 * the store is encoded, so the plan's retained and registered figures stay those of the raw bytes
 * (setup reads them raw before coding; the store then gives back what coding saved) and the plan
 * adds:
 *
 *   device     the session's decode memory: DDO_CODEC_DECODE_AREAS areas, used in turn (the
 *              copy stream uploads a batch of a unit's coded tensors into one while the decode
 *              stream decodes the previous batch, in one launch, into their places in the
 *              slot), each of ddo__codec_area_bytes: the largest candidate's stream bound, or
 *              the most stream bounds (each rounded to DDO_CODEC_AREA_ALIGN) one streamed unit
 *              adds up to, capped at DDO_CODEC_AREA_CAP (256 MiB), whichever is larger; plus
 *              one status part per execution slot of the status words of the unit with the
 *              most coded blocks (a load's status is checked when it is first leased). The
 *              session (session_codec.c) sizes its allocation by the same rule from the
 *              tensors the store did code: this figure exactly when every candidate was coded,
 *              never less
 *   retained   the encoder's output buffer at setup: the bound of the largest coded tensor
 *
 * Estimates (docs/codec.md, "Estimates"): each candidate of a streamed unit is expected to code
 * to codec_ratio (the plan inputs; 0: DDO_PLAN_CODEC_RATIO_<dtype>) of its bytes, raw when that
 * is not smaller; a unit's coded_bytes are what it then moves over the bus and its
 * decoded_bytes what the decoder writes, and its transfer in the cost model is the longer of
 * coded_bytes / bus and decoded_bytes / decode_bytes_per_s (0: DDO_PLAN_DECODE_BYTES_PER_S, on
 * the cpu device DDO_PLAN_CPU_DECODE_BYTES_PER_S). The budgets stay as above.
 *
 * Decisions: weight_codec (none|ddoc1), weight_codec_note (why auto chose none),
 * codec_candidate_gb (raw bytes that may be coded), codec_decode_area_gb (the decode memory:
 * areas and status parts), codec_decode_areas, codec_encode_buffer_gb; codec_ratio_estimate
 * and codec_ratio_source (inputs | default), codec_raw_streamed_gb and codec_coded_streamed_gb
 * (the streamed units' bytes raw and estimated coded), codec_decode_gbps and, with the cost
 * model on, codec_raw_predicted_step_s (the step were nothing coded).
 */
#include "plan/plan_build.h"

#include "codec/codec.h"
#include "os/read.h"

#include <stdio.h>
#include <string.h>

/* Rounding of the decode memory's parts (the cuda decoder wants 16-byte alignment). */
#define AREA_ALIGN DDO_CODEC_AREA_ALIGN

/* The sizes coding adds, from the plan's placement. */
typedef struct codec_need {
    uint64_t candidate;   /* raw bytes of the tensors that may be coded */
    uint64_t max_bound;   /* the largest coded stream any of them can have */
    uint64_t max_unit;    /* the most (rounded) stream bounds one unit's candidates add up to */
    uint64_t max_status;  /* the most status bytes one unit's coded tensors need */
    size_t candidates;    /* how many tensors */
    uint64_t host;        /* raw bytes of the candidates in a caller's host memory */
    uint64_t host_reg;    /* of those, in registered units */
    uint64_t build_raw;   /* the read window and the encoder buffer that code the
                           * file-streamed candidates for their sidecar, one at a time */
    uint64_t build_bound; /* (source_sidecar_use.c): the largest of each */
} codec_need;

bool ddo__plan_codec_candidate(const ddo_tensor_info *ti, bool retained)
{
    bool has_bytes = ti->file_index != UINT32_MAX || ti->host_data != NULL;
    return retained && has_bytes && ddo__codec_codes_tensor(ti->dtype, ti->nbytes);
}

uint64_t ddo__plan_codec_status_bytes(const ddo_tensor_info *ti)
{
    uint64_t esize = ddo_dtype_size(ti->dtype) ? ddo_dtype_size(ti->dtype) : 1; /* FP8: 1 */
    uint64_t elems = ti->nbytes / esize;
    uint64_t blocks = (elems + DDO_CODEC_DEFAULT_BLOCK - 1) / DDO_CODEC_DEFAULT_BLOCK;
    return 16 * blocks;
}

/* The unit's k-th tensor when the codec may code it (streamed, a coded dtype, and retained or,
 * with weight_codec_cache_dir set, a file tensor streamed from its sidecar's coded stream;
 * vmm_runtime streams raw, a caller's host tensors too: it keeps no store of its own). */
static const ddo_tensor_info *unit_candidate(const builder *b, const ddo__plan_unit *un, size_t k)
{
    size_t t = b->p->unit_tensors[un->first_tensor + k];
    const ddo_tensor_info *ti = b->ti[t];
    const char *dir = b->o->weight_codec_cache_dir;
    bool runtime = b->p->route == DDO__ROUTE_VMM_RUNTIME;
    bool sidecar = dir != NULL && dir[0] != '\0' && !runtime && !b->codec_no_sidecar;
    bool ok = b->p->tensors[t].loc.placement == DDO_PLACEMENT_STREAMED &&
              !(runtime && ti->file_index == UINT32_MAX) &&
              ddo__plan_codec_candidate(ti, un->retained || sidecar);
    return ok ? ti : NULL;
}

static void measure(const builder *b, codec_need *n)
{
    const ddo_plan *p = b->p;
    memset(n, 0, sizeof(*n));
    for (size_t u = 0; u < p->unit_count; u++) {
        const ddo__plan_unit *un = &p->units[u];
        if (un->resident)
            continue;
        uint64_t status = 0, unit = 0;
        for (size_t k = 0; k < un->tensor_count; k++) {
            const ddo_tensor_info *ti = unit_candidate(b, un, k);
            if (ti == NULL)
                continue;
            uint64_t bound = ddo__codec_bound(ti->dtype, ti->nbytes, 0);
            n->max_bound = bound > n->max_bound ? bound : n->max_bound;
            unit = ddo__sat_add_u64(unit, ddo__round_up(bound, AREA_ALIGN));
            n->candidate = ddo__sat_add_u64(n->candidate, ti->nbytes);
            if (ti->file_index == UINT32_MAX) {
                n->host = ddo__sat_add_u64(n->host, ti->nbytes);
                n->host_reg = ddo__sat_add_u64(n->host_reg, un->registered ? ti->nbytes : 0);
            } else if (!un->retained) {
                uint64_t w = ddo__os_direct_window((size_t)ti->nbytes);
                uint64_t c = ddo__round_up(bound, AREA_ALIGN);
                n->build_raw = w > n->build_raw ? w : n->build_raw;
                n->build_bound = c > n->build_bound ? c : n->build_bound;
            }
            status = ddo__sat_add_u64(status, ddo__plan_codec_status_bytes(ti));
            n->candidates++;
        }
        n->max_status = status > n->max_status ? status : n->max_status;
        n->max_unit = unit > n->max_unit ? unit : n->max_unit;
    }
}

uint64_t ddo__plan_codec_area_estimate(const builder *b)
{
    const char *mode = b->o->weight_codec != NULL ? b->o->weight_codec : "none";
    const ddo_plan *p = b->p;
    if (strcmp(mode, "none") == 0)
        return 0;
    /* Every unit may stream and every file or host tensor be retained: an upper bound of the
     * decode memory the plan's streamed units need once the selection is made. */
    uint64_t max_bound = 0, max_unit = 0, max_status = 0;
    for (size_t u = 0; u < p->unit_count; u++) {
        const ddo__plan_unit *un = &p->units[u];
        uint64_t status = 0, unit = 0;
        for (size_t k = 0; k < un->tensor_count; k++) {
            const ddo_tensor_info *ti = b->ti[p->unit_tensors[un->first_tensor + k]];
            if (!ddo__plan_codec_candidate(ti, true))
                continue;
            uint64_t bound = ddo__codec_bound(ti->dtype, ti->nbytes, 0);
            max_bound = bound > max_bound ? bound : max_bound;
            unit = ddo__sat_add_u64(unit, ddo__round_up(bound, AREA_ALIGN));
            status = ddo__sat_add_u64(status, ddo__plan_codec_status_bytes(ti));
        }
        max_status = status > max_status ? status : max_status;
        max_unit = unit > max_unit ? unit : max_unit;
    }
    if (max_unit == 0)
        return 0;
    int64_t want = b->o->execution_slots;
    uint64_t slots = want > 0 ? (uint64_t)want : 6; /* the most the cost selection tries */
    return ddo__sat_add_u64(
        ddo__sat_mul_u64(DDO_CODEC_DECODE_AREAS,
                         ddo__codec_area_bytes(ddo__round_up(max_bound, AREA_ALIGN), max_unit,
                                               DDO_CODEC_AREA_CAP)),
        ddo__sat_mul_u64(slots, ddo__round_up(max_status, AREA_ALIGN)));
}

/* True when the plan is for the cpu device: its inputs say so, or execution_device names it. */
static bool plan_on_cpu(const builder *b)
{
    ddo__device_spec ds;
    return b->in.device_is_cpu || (ddo__device_spec_parse(b->o->execution_device, &ds) && !ds.cuda);
}

/* True when the device the plan is for has a codec decoder. */
static bool device_decodes(const builder *b, const char **why)
{
    if (plan_on_cpu(b))
        return true; /* the cpu device runs the C reference decoder */
#if DDO_HAVE_CODEC_PTX
    *why = "";
    return true;
#else
    *why = "libddo was built without nvcc, so the cuda device has no codec decoder";
    return false;
#endif
}

/* auto without a way to code: none, and why. */
static int fall_back(builder *b, const char *why)
{
    ddo__decisions *d = &b->p->decisions;
    if (b->codec_sidecar_decided)
        ddo__decisions_set_str(d, "codec_sidecar", "off"); /* no codec, no sidecar */
    b->p->weight_codec = DDO_WEIGHT_CODEC_NONE;
    ddo__decisions_set_str(d, "weight_codec", "none");
    ddo__decisions_set_str(d, "weight_codec_note", why);
    return 0;
}

/* The estimated coded size of candidate ti. */
static uint64_t coded_estimate(const builder *b, const ddo_tensor_info *ti)
{
    double r = b->in.codec_ratio > 0.0       ? b->in.codec_ratio
               : ti->dtype == DDO_DTYPE_BF16 ? DDO_PLAN_CODEC_RATIO_BF16
               : ti->dtype == DDO_DTYPE_F16  ? DDO_PLAN_CODEC_RATIO_F16
               : ti->dtype == DDO_DTYPE_F32  ? DDO_PLAN_CODEC_RATIO_F32
                                             : DDO_PLAN_CODEC_RATIO_F8;
    double est = (double)ti->nbytes * r;
    return est < (double)ti->nbytes ? (uint64_t)est + 1 : ti->nbytes;
}

/* Each streamed unit's estimated coded and decoded bytes, its transfer in the cost model, and
 * the estimate's decisions. */
/* The decoder's output rate the cost model assumes: the inputs', else the default. */
static double decode_rate(const builder *b)
{
    double rate = b->in.decode_bytes_per_s;
    if (rate > 0.0)
        return rate;
    return plan_on_cpu(b) ? DDO_PLAN_CPU_DECODE_BYTES_PER_S : DDO_PLAN_DECODE_BYTES_PER_S;
}

/* A streamed unit's estimated coded bytes (0: nothing in it codes) and decoded bytes. */
static void unit_coded(const builder *b, const ddo__plan_unit *un, uint64_t *coded,
                       uint64_t *decoded)
{
    uint64_t saved = 0;
    *decoded = 0;
    for (size_t k = 0; k < un->tensor_count; k++) {
        const ddo_tensor_info *ti = unit_candidate(b, un, k);
        if (ti == NULL)
            continue;
        uint64_t c = coded_estimate(b, ti);
        if (c < ti->nbytes) {
            saved += ti->nbytes - c;
            *decoded += ti->nbytes;
        }
    }
    *coded = *decoded > 0 ? un->bytes - saved : 0;
}

static void estimate(builder *b)
{
    ddo_plan *p = b->p;
    double rate = decode_rate(b);
    uint64_t raw = 0, coded = 0;
    double raw_step = ddo__plan_simulate(p, p->budgets.slot_count);
    for (size_t u = 0; u < p->unit_count; u++) {
        ddo__plan_unit *un = &p->units[u];
        if (un->resident)
            continue;
        unit_coded(b, un, &un->coded_bytes, &un->decoded_bytes);
        raw = ddo__sat_add_u64(raw, un->bytes);
        coded = ddo__sat_add_u64(coded, un->coded_bytes > 0 ? un->coded_bytes : un->bytes);
        if (p->cost_enabled && un->coded_bytes > 0)
            un->transfer_s = ddo__plan_unit_transfer_s(b, un, rate);
    }
    for (size_t u = 0; u < p->unit_count; u++) {
        size_t prev = u > 0 ? u - 1 : p->unit_count - 1;
        p->units[u].hidden =
            p->units[u].resident || p->units[u].transfer_s <= p->units[prev].compute_s;
    }
    ddo__decisions *d = &p->decisions;
    char text[32];
    snprintf(text, sizeof(text), "%.4f", b->in.codec_ratio > 0.0 ? b->in.codec_ratio : -1.0);
    ddo__decisions_set_str(
        d, "codec_ratio_estimate",
        b->in.codec_ratio > 0.0 ? text : "per dtype: BF16 0.67, F16 0.85, F32 0.83, FP8 0.83");
    ddo__decisions_set_str(d, "codec_ratio_source", b->in.codec_ratio > 0.0 ? "inputs" : "default");
    ddo__decisions_set_gb(d, "codec_raw_streamed_gb", raw);
    ddo__decisions_set_gb(d, "codec_coded_streamed_gb", coded);
    snprintf(text, sizeof(text), "%.3g", rate / 1e9);
    ddo__decisions_set_str(d, "codec_decode_gbps", text);
    if (p->cost_enabled) {
        snprintf(text, sizeof(text), "%.6f", raw_step);
        ddo__decisions_set_str(d, "codec_raw_predicted_step_s", text);
    }
}

/* auto with a cost model: whether the coded step is predicted clearly shorter than the raw
 * one. The coded step is the simulation with each coded unit's transfer (the longer of its
 * coded bytes over the bus and its decode), and at least the compute plus every decode: the
 * decodes run on the device beside the compute (on the H200 a compute-bound 16 GiB plan ran
 * 0.184 s coded against 0.166 s raw). *raw_s and *coded_s get the two predictions. */
static bool coding_pays(builder *b, double *raw_s, double *coded_s)
{
    ddo_plan *p = b->p;
    *raw_s = *coded_s = 0.0;
    if (!p->cost_enabled || p->unit_count == 0)
        return true; /* no model: code wherever a decoder is */
    double *saved = ddo__calloc(p->unit_count, sizeof(double));
    if (saved == NULL)
        return true;
    size_t slots = p->budgets.slot_count;
    *raw_s = ddo__plan_simulate(p, slots);
    double rate = decode_rate(b), busy = 0.0;
    for (size_t u = 0; u < p->unit_count; u++) {
        ddo__plan_unit *un = &p->units[u];
        saved[u] = un->transfer_s;
        busy += un->compute_s;
        if (un->resident)
            continue;
        ddo__plan_unit trial = *un;
        unit_coded(b, un, &trial.coded_bytes, &trial.decoded_bytes);
        if (trial.coded_bytes == 0)
            continue;
        un->transfer_s = ddo__plan_unit_transfer_s(b, &trial, rate);
        busy += (double)trial.decoded_bytes / rate;
    }
    double sim = ddo__plan_simulate(p, slots);
    *coded_s = sim > busy ? sim : busy;
    for (size_t u = 0; u < p->unit_count; u++)
        p->units[u].transfer_s = saved[u];
    free(saved);
    return *coded_s < *raw_s * (1.0 - DDO_PLAN_CODEC_MIN_GAIN);
}

/* A caller's host-memory tensors (the binding's): each candidate gets a raw-sized place in a
 * store of ddo's own and is coded into it from the caller's memory (source_codec.c; one that
 * coding does not shrink is copied there raw), so the caller's copies are never read again;
 * the store is registered where its units are. The retained and registered peaks take the
 * store at its raw size (the coded size is known only after coding; the pages past it are
 * never touched); the registered peak keeps the in-place registration of the other host
 * tensors only. Returns 1 when the store does not fit a limit and auto falls back. */
static int host_store(builder *b, const codec_need *n, bool explicit_codec)
{
    ddo_plan_budgets *bg = &b->p->budgets;
    if (n->host == 0)
        return 0;
    uint64_t ret = ddo__sat_add_u64(bg->retained_peak, ddo__round_up(n->host, DDO_SEGMENT_BYTES));
    uint64_t reg = ddo__sat_add_u64(ddo__plan_host_pins_uncoded(b),
                                    ddo__round_up(n->host_reg, DDO_SEGMENT_BYTES));
    bool r = bg->retained_limit > 0 && ret > bg->retained_limit; /* else: registered */
    if (r || (bg->registered_limit > 0 && reg > bg->registered_limit)) {
        const char *over = r ? "retained" : "registered";
        char a[32], l[32];
        if (!explicit_codec) {
            fall_back(b, "auto: weights move raw: the coded copy of the host tensors does not "
                         "fit the host limits");
            return 1;
        }
        return ddo__fail(
            NULL, DDO_E_BUDGET,
            "plan: weight_codec=ddoc1: the coded copy of the host tensors needs %s "
            "of %s host memory (at their raw size until coded) but the limit is %s; "
            "raise %s (0: no limit) or use weight_codec=none",
            ddo__format_gib(r ? ret : reg, a, sizeof(a)), over,
            ddo__format_gib(r ? bg->retained_limit : bg->registered_limit, l, sizeof(l)),
            r ? "vmm_source_cache_gb" : "vmm_source_registered_gb");
    }
    bg->retained_peak = ret;
    bg->registered_peak = reg;
    ddo__decisions_set_str(&b->p->decisions, "retained_store", "host_memory_coded");
    ddo__decisions_set_gb(&b->p->decisions, "codec_host_store_gb", n->host);
    return 0;
}

/* weight_codec=auto with weight_codec_cache_dir and a file rate known: whether the plan is
 * disk-bound, its file reads (the streamed bytes the retained store does not hold, at the file
 * rate) longer than its bus-bound step (every streamed byte at the bus rate). Disk-bound, the
 * sidecar is read (fewer bytes from the disk) and the codec is on whatever the bus gains;
 * otherwise file-streamed tensors are read raw (b->codec_no_sidecar) and the codec is what
 * coding the retained store gains. Says which (codec_sidecar, codec_sidecar_reason). Returns
 * true when disk-bound. */
static bool sidecar_decision(builder *b)
{
    ddo_plan *p = b->p;
    const char *dir = b->o->weight_codec_cache_dir;
    double disk = b->in.file_read_bytes_per_s, bus = b->in.bus_bytes_per_s;
    if (dir == NULL || dir[0] == '\0' || p->route == DDO__ROUTE_VMM_RUNTIME || !(disk > 0.0) ||
        !(bus > 0.0))
        return false;
    uint64_t file = 0, streamed = 0;
    for (size_t u = 0; u < p->unit_count; u++) {
        const ddo__plan_unit *un = &p->units[u];
        if (un->resident)
            continue;
        streamed = ddo__sat_add_u64(streamed, un->bytes);
        file = un->retained ? file : ddo__sat_add_u64(file, un->bytes);
    }
    double file_s = (double)file / disk, bus_s = (double)streamed / bus;
    bool bound = file > 0 && file_s > bus_s;
    b->codec_no_sidecar = !bound;
    b->codec_sidecar_decided = true;
    char note[256];
    snprintf(note, sizeof(note),
             "auto: %s: file reads %.4f s per step (%.3f GB at %.3g GB/s) %s the bus-bound step "
             "%.4f s (%.3f GB at %.3g GB/s)%s",
             bound ? "disk-bound" : "not disk-bound", file_s, (double)file / 1e9, disk / 1e9,
             bound ? "exceed" : "do not exceed", bus_s, (double)streamed / 1e9, bus / 1e9,
             bound ? ": file-streamed tensors are read from their sidecar"
                   : ": file-streamed tensors are read raw");
    ddo__decisions_set_str(&p->decisions, "codec_sidecar", bound ? "on" : "off");
    ddo__decisions_set_str(&p->decisions, "codec_sidecar_reason", note);
    return bound;
}

/* The decisions of a plan that codes (weight_codec ddoc1), and the estimates. */
static void record_ddoc1(builder *b, const codec_need *n, uint64_t area, uint64_t encode)
{
    ddo__decisions *d = &b->p->decisions;
    ddo__decisions_set_str(d, "weight_codec", "ddoc1");
    ddo__decisions_set_gb(d, "codec_candidate_gb", n->candidate);
    ddo__decisions_set_gb(d, "codec_decode_area_gb", area);
    char areas[16];
    snprintf(areas, sizeof(areas), "%d", n->candidates > 0 ? DDO_CODEC_DECODE_AREAS : 0);
    ddo__decisions_set_str(d, "codec_decode_areas", areas);
    ddo__decisions_set_gb(d, "codec_encode_buffer_gb", encode);
    if (n->candidates > 0)
        estimate(b);
}

int ddo__plan_codec(builder *b)
{
    const char *mode = b->o->weight_codec != NULL ? b->o->weight_codec : "none";
    ddo_plan *p = b->p;
    ddo__decisions *d = &p->decisions;
    if (strcmp(mode, "none") == 0) {
        p->weight_codec = DDO_WEIGHT_CODEC_NONE;
        ddo__decisions_set_str(d, "weight_codec", "none");
        return 0;
    }
    bool explicit_codec = strcmp(mode, "ddoc1") == 0;
    const char *why = "";
    if (!device_decodes(b, &why)) {
        if (explicit_codec)
            return ddo__fail(NULL, DDO_E_UNSUPPORTED, "plan: weight_codec=ddoc1: %s", why);
        return fall_back(b, "auto: weights move raw: libddo was built without nvcc, so the cuda "
                            "device has no codec decoder");
    }
    bool disk_bound = !explicit_codec && sidecar_decision(b);
    codec_need n;
    measure(b, &n);
    if (n.candidates == 0 && !explicit_codec)
        return fall_back(b, "auto: no retained tensor streams of a coded dtype (all resident or "
                            "not retained; vmm_runtime keeps none): nothing to code");
    if (n.candidates == 0)
        ddo__decisions_set_str(d, "weight_codec_note",
                               "ddoc1: no retained tensor streams of a coded dtype (all resident "
                               "or not retained; vmm_runtime keeps none): nothing to code, "
                               "weights move raw");
    ddo_plan_budgets *bg = &p->budgets;
    uint64_t area = 0;
    if (n.candidates > 0)
        area = ddo__sat_add_u64(
            ddo__sat_mul_u64(DDO_CODEC_DECODE_AREAS,
                             ddo__codec_area_bytes(ddo__round_up(n.max_bound, AREA_ALIGN),
                                                   n.max_unit, DDO_CODEC_AREA_CAP)),
            ddo__sat_mul_u64(bg->slot_count, ddo__round_up(n.max_status, AREA_ALIGN)));
    uint64_t peak = ddo__sat_add_u64(bg->device_weights_peak, area);
    if (bg->device_weights_limit > 0 && peak > bg->device_weights_limit) {
        char a[32], l[32];
        if (!explicit_codec)
            return fall_back(b, "auto: weights move raw: the decode areas do not fit the "
                                "device weights limit");
        return ddo__fail(NULL, DDO_E_BUDGET,
                         "plan: weight_codec=ddoc1: the decode areas (%s) do not fit the device "
                         "weights limit (%s, %s) beside the residents and slots; lower "
                         "resident_module_budget_gb by that much or raise the limit",
                         ddo__format_gib(area, a, sizeof(a)),
                         ddo__format_gib(bg->device_weights_limit, l, sizeof(l)),
                         p->device_limit_source != NULL ? p->device_limit_source : "?");
    }
    double raw_s = 0.0, coded_s = 0.0;
    if (!explicit_codec && !disk_bound && n.candidates > 0 && !coding_pays(b, &raw_s, &coded_s)) {
        char note[200];
        snprintf(note, sizeof(note),
                 "auto: weights move raw: coding would not pay here (predicted step %.4f s coded, "
                 "%.4f s raw: the decodes share the device with the compute)",
                 coded_s, raw_s);
        return fall_back(b, note);
    }
    int rc = host_store(b, &n, explicit_codec);
    if (rc != 0)
        return rc > 0 ? 0 : rc;
    bg->device_weights_peak = peak;
    /* The store's encoder buffer, or after it (never beside it) the buffers that code the
     * file-streamed tensors for their sidecar, whichever is larger. */
    uint64_t encode = n.candidates > 0 ? ddo__round_up(n.max_bound, AREA_ALIGN) : 0;
    uint64_t build = n.build_raw > 0 ? ddo__sat_add_u64(n.build_raw, n.build_bound) : 0;
    encode = build > encode ? build : encode;
    bg->retained_peak = ddo__sat_add_u64(bg->retained_peak, encode);
    p->weight_codec = DDO_WEIGHT_CODEC_DDOC1;
    p->codec_sidecar = !b->codec_no_sidecar;
    record_ddoc1(b, &n, area, encode);
    return 0;
}
