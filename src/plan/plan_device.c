/*
 * plan_device.c - the device side of a plan (docs/plan.md): the device-weights
 * limit and where it comes from, the resident arena, the execution slots (their size and
 * count) and the device-weights check, and the geometry of the vmm_runtime route (every
 * weight its own range and handle). The session executes this geometry as planned; a plan
 * read back derives it with the same functions (ddo__plan_restore). Part of the build
 * (plan_build.h).
 */
#include "plan/plan_build.h"

#include "base/budget.h" /* ddo__format_bytes */

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- vmm_runtime: one range and one handle per weight ---- */

/* A weight's handle: its bytes rounded up to the granularity (0 for an empty tensor). */
static uint64_t handle_bytes(uint64_t nbytes, uint64_t gran)
{
    return ddo__round_up(nbytes, gran);
}

/* A weight's reserved range: at least one granule, so that every weight has an address. */
static uint64_t range_bytes(uint64_t nbytes, uint64_t gran)
{
    return ddo__round_up(nbytes > 0 ? nbytes : 1, gran);
}

/*
 * The device bytes unit u takes when every streamed weight has its own physical handle of
 * its size rounded up to the granularity (cuMemMap maps a handle only at offset 0, so weights
 * cannot share one).
 */
static uint64_t per_weight_bytes(const ddo_plan *p, size_t u, uint64_t gran)
{
    const ddo__plan_unit *un = &p->units[u];
    uint64_t sum = 0;
    for (size_t k = 0; k < un->tensor_count; k++) {
        const ddo_tensor_location *loc = &p->tensors[p->unit_tensors[un->first_tensor + k]].loc;
        if (loc->placement == DDO_PLACEMENT_STREAMED)
            sum = ddo__sat_add_u64(sum, handle_bytes(loc->nbytes, gran));
    }
    return sum;
}

uint64_t ddo__plan_granularity(const ddo_plan *p)
{
    return p->inputs.device_granularity > 0 ? p->inputs.device_granularity : 2 * DDO_MIB;
}

void ddo__weight_layout_free(ddo__weight_layout *wl)
{
    if (wl == NULL)
        return;
    free(wl->range_bytes);
    free(wl->handle_bytes);
    free(wl->unit_bytes);
    memset(wl, 0, sizeof(*wl));
}

/* Unit u's weights into wl (a streamed unit); records the first weight too large to map. */
static void layout_unit(const ddo_plan *p, size_t u, ddo__weight_layout *wl)
{
    const ddo__plan_unit *un = &p->units[u];
    uint64_t g = wl->granularity, sum = 0;
    for (size_t k = 0; k < un->tensor_count; k++) {
        size_t t = p->unit_tensors[un->first_tensor + k];
        const ddo_tensor_location *loc = &p->tensors[t].loc;
        if (loc->placement != DDO_PLACEMENT_STREAMED)
            continue;
        wl->range_bytes[t] = range_bytes(loc->nbytes, g);
        wl->handle_bytes[t] = handle_bytes(loc->nbytes, g);
        if (wl->handle_bytes[t] > 0)
            wl->handle_count++;
        if ((wl->range_bytes[t] == UINT64_MAX || !ddo__add_u64(sum, wl->handle_bytes[t], &sum)) &&
            wl->too_large == SIZE_MAX)
            wl->too_large = t;
    }
    wl->unit_bytes[u] = per_weight_bytes(p, u, g);
}

int ddo__weight_layout_build(const ddo_plan *p, uint64_t gran, ddo__weight_layout *out)
{
    ddo__weight_layout wl;
    memset(&wl, 0, sizeof(wl));
    wl.granularity = gran;
    wl.largest_unit = SIZE_MAX;
    wl.too_large = SIZE_MAX;
    size_t tn = p->tensor_count > 0 ? p->tensor_count : 1;
    wl.range_bytes = ddo__calloc(tn, sizeof(*wl.range_bytes));
    wl.handle_bytes = ddo__calloc(tn, sizeof(*wl.handle_bytes));
    wl.unit_bytes = ddo__calloc(p->unit_count > 0 ? p->unit_count : 1, sizeof(*wl.unit_bytes));
    if (wl.range_bytes == NULL || wl.handle_bytes == NULL || wl.unit_bytes == NULL) {
        ddo__weight_layout_free(&wl);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "plan: the per-weight layout of %zu tensors",
                         p->tensor_count);
    }
    uint64_t largest = 0;
    for (size_t u = 0; u < p->unit_count; u++) {
        if (p->units[u].resident)
            continue;
        layout_unit(p, u, &wl);
        if (wl.largest_unit == SIZE_MAX || wl.unit_bytes[u] > largest) {
            largest = wl.unit_bytes[u];
            wl.largest_unit = u;
        }
    }
    if (wl.largest_unit != SIZE_MAX)
        wl.slot_bytes = largest > gran ? largest : gran;
    *out = wl;
    return 0;
}

int ddo__weight_layout_check(const ddo_plan *p, const ddo__weight_layout *wl,
                             uint64_t resident_bytes, uint64_t limit, const char *limit_source,
                             ddo__errbuf *eb)
{
    if (wl->too_large != SIZE_MAX)
        return ddo__fail(eb, DDO_E_BUDGET, "tensor \"%s\": too large to map",
                         p->tensors[wl->too_large].name);
    uint64_t one = ddo__sat_add_u64(resident_bytes, wl->slot_bytes);
    if (limit == 0 || wl->largest_unit == SIZE_MAX || one <= limit)
        return 0;
    /* Not even the largest unit's weights fit; the mapped budget bounds every handle alive. */
    char g1[32], s1[32], r1[32], n1[32], l1[32];
    return ddo__fail(
        eb, DDO_E_BUDGET,
        "device weights: %s maps every weight into its own %s-aligned "
        "range, so unit \"%s\" needs %s (+ resident %s = %s) but the mapped "
        "budget is %s (%s); raise it or set unit_granularity=leaf",
        ddo__route_name(DDO__ROUTE_VMM_RUNTIME), ddo__format_bytes(wl->granularity, g1, sizeof(g1)),
        p->units[wl->largest_unit].name, ddo__format_bytes(wl->slot_bytes, s1, sizeof(s1)),
        ddo__format_bytes(resident_bytes, r1, sizeof(r1)), ddo__format_bytes(one, n1, sizeof(n1)),
        ddo__format_bytes(limit, l1, sizeof(l1)),
        limit_source != NULL ? limit_source : "vmm_resident_weight_budget_gb");
}

const ddo__weight_layout *ddo__plan_weight_layout(const ddo_plan *p)
{
    return p != NULL && ddo__route_per_weight(p->route) && p->weights.unit_bytes != NULL
               ? &p->weights
               : NULL;
}

ddo__route ddo__plan_route_of(const ddo_plan *p)
{
    return p != NULL ? p->route : DDO__ROUTE_LINEAR;
}

int ddo__plan_restore(ddo_plan *p)
{
    p->route = ddo__route_of(p->route_label);
    if (!ddo__route_per_weight(p->route))
        return 0;
    return ddo__weight_layout_build(p, ddo__plan_granularity(p), &p->weights);
}

/* ---- the resident arena and the execution slots ---- */

/* The execution-slot page: vmm_page_mb in bytes (0 = the granularity gran), a whole multiple
 * of gran. Range-checked before the cast, beside the catalog's own check. */
static int slot_page(double mb, uint64_t gran, uint64_t *page)
{
    if (!(mb > 0.0))
        return 0;
    *page = isfinite(mb) && mb <= 1048576.0 ? (uint64_t)(mb * (double)DDO_MIB) : 0;
    if (*page != 0 && *page % gran == 0)
        return 0;
    char q[64], g[64];
    ddo__format_bytes(gran, g, sizeof(g));
    if (isfinite(mb))
        ddo__format_real(mb, q, sizeof(q));
    else
        snprintf(q, sizeof(q), "%s", isnan(mb) ? "nan" : "inf");
    return ddo__fail(NULL, DDO_E_CONFIG,
                     "vmm_page_mb=%s: the execution-slot page must be a whole multiple of the "
                     "device granularity (%s) and at most 1048576 MiB",
                     q, g);
}

/* The bytes of the largest module's tensors (what a leaf unit takes at most), rounded to page. */
static uint64_t largest_leaf(const builder *b, uint64_t page)
{
    uint64_t largest = 0;
    for (size_t m = 0; m < b->mod_count; m++)
        if (!b->mods[m].skipped && b->mods[m].full_bytes > largest)
            largest = b->mods[m].full_bytes;
    return ddo__round_up(largest, page);
}

/* bytes in adaptive units rounded up at the last printed digit: a smallest budget that
 * works never prints below what is needed. */
static const char *format_up(uint64_t bytes, char *buf, size_t len)
{
    if (bytes >= DDO_GIB)
        snprintf(buf, len, "%.2f GiB", ceil((double)bytes / (double)DDO_GIB * 100.0) / 100.0);
    else if (bytes >= DDO_MIB)
        snprintf(buf, len, "%.2f MiB", ceil((double)bytes / (double)DDO_MIB * 100.0) / 100.0);
    else
        ddo__format_bytes(bytes, buf, len);
    return buf;
}

/* The streamed unit whose span sets the slot size (SIZE_MAX: none). */
static size_t largest_unit(const ddo_plan *p)
{
    size_t at = SIZE_MAX;
    for (size_t u = 0; u < p->unit_count; u++)
        if (!p->units[u].resident &&
            (at == SIZE_MAX || p->units[u].span_bytes > p->units[at].span_bytes))
            at = u;
    return at;
}

/* DDO_E_BUDGET: no plan fits; names the unit, its size, the budget and the smallest budget
 * that works (two slots of the largest unit beside the fixed residents), and
 * unit_granularity=leaf only where it would fit. */
static int refuse_smallest(const builder *b, int64_t want, uint64_t page, uint64_t limit,
                           const char *limit_source)
{
    const ddo_plan *p = b->p;
    const ddo_plan_budgets *bg = &p->budgets;
    size_t u = largest_unit(p);
    uint64_t need = ddo__sat_add_u64(bg->resident_bytes, ddo__sat_mul_u64(2, bg->slot_bytes));
    uint64_t leaf =
        ddo__sat_add_u64(bg->resident_bytes, ddo__sat_mul_u64(2, largest_leaf(b, page)));
    char s1[32], n1[32], l1[32], r1[32], f1[32], tail[160] = "";
    if (!b->leaf && leaf < need && leaf <= limit)
        snprintf(tail, sizeof(tail),
                 "; unit_granularity=leaf streams single modules and would fit "
                 "(it needs %s)",
                 ddo__format_bytes(leaf, f1, sizeof(f1)));
    else if (want > 2)
        snprintf(tail, sizeof(tail), "; execution_slots=%lld needs more", (long long)want);
    if (bg->resident_bytes > 0)
        snprintf(r1, sizeof(r1), " + resident %s",
                 ddo__format_bytes(bg->resident_bytes, f1, sizeof(f1)));
    else
        r1[0] = '\0';
    return ddo__fail(NULL, DDO_E_BUDGET,
                     "device budget %s (%s) is too small for any plan: unit \"%s\" takes %s "
                     "and streaming needs two execution slots%s, so the smallest budget that "
                     "works is %s%s",
                     ddo__format_bytes(limit, l1, sizeof(l1)), limit_source,
                     u != SIZE_MAX ? p->units[u].name : "?",
                     ddo__format_bytes(bg->slot_bytes, s1, sizeof(s1)), r1,
                     format_up(need, n1, sizeof(n1)), tail);
}

/* DDO_E_BUDGET: the device weights of plan p exceed limit; the advice names what to change. */
static int refuse_device_weights(const builder *b, int64_t want, uint64_t page, uint64_t limit,
                                 const char *limit_source)
{
    const ddo_plan *p = b->p;
    const ddo_plan_budgets *bg = &p->budgets;
    char a[32], r[32], s[32], l[32];
    bool chosen = false;
    for (size_t u = 0; u < p->unit_count; u++)
        chosen = chosen || p->units[u].resident;
    if (!chosen)
        return refuse_smallest(b, want, page, limit, limit_source);
    const char *advice = want > 2 ? ", lower resident_module_budget_gb or lower execution_slots"
                                  : " or lower resident_module_budget_gb";
    return ddo__fail(NULL, DDO_E_BUDGET,
                     "device weights need %s (resident %s + %zu slots x %s) but the limit "
                     "is %s (%s); raise %s%s",
                     ddo__format_bytes(bg->device_weights_peak, a, sizeof(a)),
                     ddo__format_bytes(bg->resident_bytes, r, sizeof(r)), bg->slot_count,
                     ddo__format_bytes(bg->slot_bytes, s, sizeof(s)),
                     ddo__format_bytes(limit, l, sizeof(l)), limit_source,
                     b->budget_name != NULL ? b->budget_name : "device_budget_gb", advice);
}

/* Lays the resident tensors out in the arena; returns its bytes. (Before the host side too:
 * host_registered lays out a caller's resident tensors by their arena offsets.) */
uint64_t ddo__plan_resident_arena(builder *b)
{
    ddo_plan *p = b->p;
    uint64_t arena = 0;
    for (size_t i = 0; i < b->n; i++) {
        ddo_tensor_location *loc = &p->tensors[i].loc;
        if (loc->placement != DDO_PLACEMENT_RESIDENT)
            continue;
        arena = ddo__round_up(arena, DDO_TENSOR_ALIGN);
        loc->offset = arena;
        arena = ddo__sat_add_u64(arena, loc->nbytes);
    }
    return arena;
}

/* The slot size: the largest streamed unit's span rounded to the page, or (vmm_runtime) its
 * weights' handles. *streaming: some unit streams. */
static int slot_size(builder *b, uint64_t page, bool *streaming)
{
    ddo_plan *p = b->p;
    ddo_plan_budgets *bg = &p->budgets;
    uint64_t largest = 0;
    *streaming = false;
    if (ddo__route_per_weight(p->route)) {
        /* vmm_runtime: a slot holds the largest unit's weights, each in its own handle. */
        int rc = ddo__weight_layout_build(p, ddo__plan_granularity(p), &p->weights);
        if (rc != 0)
            return rc;
        *streaming = p->weights.largest_unit != SIZE_MAX;
        bg->slot_bytes = p->weights.slot_bytes;
        return 0;
    }
    for (size_t u = 0; u < p->unit_count; u++)
        if (!p->units[u].resident) {
            uint64_t bytes = p->units[u].span_bytes;
            if (!*streaming || bytes > largest)
                largest = bytes;
            *streaming = true;
        }
    bg->slot_bytes = *streaming ? ddo__round_up(largest, page) : 0;
    return 0;
}

int ddo__plan_slot_page(const builder *b, uint64_t *page)
{
    uint64_t gran = ddo__plan_granularity(b->p);
    *page = gran;
    return slot_page(b->o->vmm_page_mb, gran, page);
}

/* With room for more than 3 slots and the cost model on: the count of 4..DDO__AUTO_SLOTS_MAX
 * that fits the room and whose simulated step is shorter than the count before's by at least
 * DEEPER_GAIN (deeper prefetch evens out runs of units whose transfer and compute differ; a
 * slot more costs device memory for no gain otherwise), while the streamed units outnumber
 * twice the slots (a ring holding most of them keeps units loaded from step to step, which the
 * simulation does not model). True when one is, *slots taking it; search gets each count tried
 * with its simulated step (decision slot_search, e.g. "3 0.2576 s, 4 0.2551 s, ..."). */
#define DEEPER_GAIN 0.01

static bool deeper_slots(const ddo_plan *p, uint64_t arena, uint64_t room, size_t *slots,
                         char *search, size_t len)
{
    size_t streamed = 0, pick = 3;
    for (size_t u = 0; u < p->unit_count; u++)
        streamed += !p->units[u].resident;
    double best = ddo__plan_simulate(p, 3);
    size_t at = (size_t)snprintf(search, len, "3 %.4f s", best);
    for (size_t n = 4; n <= DDO__AUTO_SLOTS_MAX && streamed > 2 * n; n++) {
        if (ddo__sat_add_u64(arena, ddo__sat_mul_u64(n, p->budgets.slot_bytes)) > room)
            break;
        double t = ddo__plan_simulate(p, n);
        if (at < len)
            at += (size_t)snprintf(search + at, len - at, ", %zu %.4f s", n, t);
        if (t > 0.0 && t < best * (1.0 - DEEPER_GAIN)) {
            best = t;
            pick = n;
        }
    }
    *slots = pick;
    return pick != 3;
}

int ddo__plan_device_side(builder *b, uint64_t limit, const char *limit_source)
{
    ddo_plan *p = b->p;
    ddo_plan_budgets *bg = &p->budgets;
    ddo__decisions *d = &p->decisions;
    uint64_t page = 0;
    int rc = ddo__plan_slot_page(b, &page);
    if (rc != 0)
        return rc;
    uint64_t arena = ddo__plan_resident_arena(b);
    bg->resident_bytes = arena;
    bool streaming = false;
    if ((rc = slot_size(b, page, &streaming)) != 0)
        return rc;
    int64_t want = b->o->execution_slots;
    size_t slots = 0;
    const char *how = "none_streamed";
    if (streaming && want > 0) {
        slots = want < 2 ? 2 : (size_t)want;
        how = want < 2 ? "raised_to_two" : "explicit";
    } else if (streaming && b->chosen_slots > 0) {
        slots = b->chosen_slots; /* resident_module_selection=cost chose it (plan_cost.c) */
        how = "cost";
    } else if (streaming) {
        slots = 3;
        how = "auto_three";
        uint64_t room = limit > b->codec_reserve ? limit - b->codec_reserve : 0;
        if (limit > 0 && ddo__sat_add_u64(arena, ddo__sat_mul_u64(3, bg->slot_bytes)) > room) {
            slots = 2;
            how = "auto_two";
        } else if (limit > 0 && p->cost_enabled) {
            char search[256];
            if (deeper_slots(p, arena, room, &slots, search, sizeof(search)))
                how = "simulated";
            ddo__decisions_set_str(d, "slot_search", search);
        }
    }
    /* vmm_runtime: not even the largest unit's weights fit; a session refuses the same. */
    if (ddo__route_per_weight(p->route) && streaming &&
        (rc = ddo__weight_layout_check(p, &p->weights, arena, limit, limit_source, NULL)) != 0)
        return rc;
    bg->slot_count = slots;
    ddo__decisions_set_str(d, "slot_count_decision", how);
    bg->device_weights_peak = ddo__sat_add_u64(arena, ddo__sat_mul_u64(slots, bg->slot_bytes));
    bg->device_weights_limit = limit;
    if (limit > 0 && bg->device_weights_peak > limit)
        return refuse_device_weights(b, want, page, limit, limit_source);
    return 0;
}

/* ---- the device-weights limit ---- */

/* The activation reserve of a plan sized from the device: 512 MiB (the allocator's cache,
 * kernels' workspaces) plus four rows of the widest weight's output per token. */
static uint64_t activation_reserve(const builder *b)
{
    uint64_t tokens = b->in.tokens > 0 ? b->in.tokens : DDO_PLAN_DEFAULT_TOKENS, row = 0;
    for (size_t i = 0; i < b->n; i++) {
        const ddo_tensor_info *t = b->ti[i];
        if (t->ndim == 2 && t->shape[1] > 0 && t->nbytes / t->shape[1] > row)
            row = t->nbytes / t->shape[1];
    }
    return ddo__sat_add_u64(DDO_GIB / 2, ddo__sat_mul_u64(4, ddo__sat_mul_u64(tokens, row)));
}

/* The balanced policy's limit: the device's free memory (else its size) minus the activation
 * reserve (auto_vram_headroom_gb when given; else activation_reserve_gb, the reserve the
 * Python binding measured on the first forward; else the estimate), at least 1 GiB (nor above
 * the card). */
static uint64_t sized_from_device(builder *b, uint64_t V, char *source, size_t len)
{
    uint64_t F = b->in.device_free_bytes, avail = F > 0 && F < V ? F : V;
    bool option = b->o->auto_vram_headroom_gb > 0.0;
    bool measured = !option && b->o->activation_reserve_gb > 0.0;
    uint64_t h = option     ? ddo__gb_to_bytes(b->o->auto_vram_headroom_gb)
                 : measured ? ddo__gb_to_bytes(b->o->activation_reserve_gb)
                            : activation_reserve(b);
    uint64_t limit =
        avail > h && avail - h > DDO_GIB ? avail - h : (avail < DDO_GIB ? avail : DDO_GIB);
    char v1[32], v2[32], v3[32];
    snprintf(source, len, "device memory %s%s%s%s minus %s %s%s",
             ddo__format_gib(V, v1, sizeof(v1)), avail < V ? " (free " : "",
             avail < V ? ddo__format_gib(avail, v3, sizeof(v3)) : "", avail < V ? ")" : "",
             ddo__format_bytes(h, v2, sizeof(v2)),
             option     ? "auto VRAM headroom"
             : measured ? "activation reserve measured on the first forward"
                        : "activation reserve",
             limit == avail - h ? "" : ", at least 1 GiB");
    ddo__decisions_set_gb(&b->p->decisions, "device_activation_reserve_gb", h);
    b->p->activation_reserve = h;
    b->p->activation_reserve_estimated = !option && !measured;
    ddo__decisions_set_str(&b->p->decisions, "device_activation_reserve_source",
                           option     ? "auto_vram_headroom_gb"
                           : measured ? "measured on the first forward (activation_reserve_gb)"
                                      : "estimated from the plan's units");
    return limit;
}

/* The host's dequantization scratch (dequant_scratch_bytes: the largest quantized layer at
 * its compute dtype, allocated beside the weights while that layer computes) comes off the
 * weights limit; its text is appended to source. */
static int reserve_scratch(builder *b, uint64_t *limit, char *source, size_t len)
{
    uint64_t s = b->o->dequant_scratch_bytes > 0 ? (uint64_t)b->o->dequant_scratch_bytes : 0;
    if (s == 0)
        return 0;
    ddo__decisions_set_num(&b->p->decisions, "dequant_scratch_bytes", (double)s);
    if (*limit == 0)
        return 0;
    char v1[32], v2[32];
    ddo__format_bytes(s, v1, sizeof(v1));
    if (s >= *limit)
        return ddo__fail(NULL, DDO_E_BUDGET,
                         "the device weights limit %s (%s) leaves no room for the "
                         "dequantization scratch %s (dequant_scratch_bytes: the largest "
                         "quantized layer at its compute dtype): raise the budget",
                         ddo__format_bytes(*limit, v2, sizeof(v2)), source, v1);
    *limit -= s;
    size_t n = strlen(source);
    if (n + 1 < len)
        snprintf(source + n, len - n, " minus %s dequantization scratch", v1);
    return 0;
}

/* The device weights limit and where it comes from (source, len bytes). */
int ddo__plan_device_limit(builder *b, const budgets_in *bi, uint64_t *limit, char *source,
                           size_t len)
{
    uint64_t V = bi->V;
    ddo__decisions *d = &b->p->decisions;
    *limit = 0;
    snprintf(source, len, "none");
    uint64_t explicit_limit = b->budget;
    if (ddo__route_per_weight(b->p->route) && explicit_limit == 0)
        return ddo__fail(NULL, DDO_E_CONFIG,
                         "device_budget_gb (vmm_resident_weight_budget_gb): the %s route needs a "
                         "positive mapped budget",
                         ddo__route_name(b->p->route));
    if (explicit_limit > 0) {
        *limit = explicit_limit;
        snprintf(source, len, "%s", b->budget_name);
        if (V > 0 && explicit_limit > V) {
            char v1[32], e1[32], note[160];
            *limit = V;
            snprintf(source, len, "%s capped to the device memory %s", b->budget_name,
                     ddo__format_bytes(V, v1, sizeof(v1)));
            snprintf(note, sizeof(note), "%s %s is above the device memory %s: capped to it",
                     b->budget_name, ddo__format_bytes(explicit_limit, e1, sizeof(e1)), v1);
            ddo__decisions_set_str(d, "device_budget_note", note);
        }
    } else if (V > 0) {
        char v1[32], v2[32];
        if (b->fill) {
            *limit = sized_from_device(b, V, source, len);
        } else if (bi->balanced) {
            /* A preset the user named keeps its headroom table. */
            double ratio = (double)bi->M / (double)V;
            uint64_t h = b->o->auto_vram_headroom_gb > 0.0
                             ? ddo__gb_to_bytes(b->o->auto_vram_headroom_gb)
                             : ddo__vram_headroom_default(V, ratio);
            /* As the resident target: never below 1 GiB (nor above the card). */
            *limit = V > h && V - h > DDO_GIB ? V - h : (V < DDO_GIB ? V : DDO_GIB);
            snprintf(source, len, "device memory %s minus %s auto VRAM headroom%s",
                     ddo__format_gib(V, v1, sizeof(v1)), ddo__format_gib(h, v2, sizeof(v2)),
                     *limit == V - h ? "" : ", at least 1 GiB");
        } else {
            *limit = V;
            snprintf(source, len, "device memory %s", ddo__format_gib(V, v1, sizeof(v1)));
        }
    }
    int rc = reserve_scratch(b, limit, source, len);
    if (rc != 0)
        return rc;
    b->p->device_limit_source = ddo__strdup(source);
    ddo__decisions_set_str(d, "device_weights_limit_source", *limit > 0 ? source : "none");
    return 0;
}

/* ddo: an automatic resident budget leaves room for two slots and the fixed residents. */
void ddo__plan_cap_auto_resident(builder *b, budgets_in *bi, uint64_t limit)
{
    ddo_plan *p = b->p;
    if (!bi->auto_resident || limit == 0)
        return;
    uint64_t largest = 0, fixed = 0;
    uint64_t gran = ddo__plan_granularity(p);
    bool per_weight = ddo__route_per_weight(p->route);
    for (size_t u = 0; u < p->unit_count; u++) {
        uint64_t bytes = per_weight ? per_weight_bytes(p, u, gran) : p->units[u].span_bytes;
        if (bytes > largest)
            largest = bytes;
    }
    for (size_t i = 0; i < b->n; i++)
        if (p->tensors[i].loc.placement == DDO_PLACEMENT_RESIDENT)
            fixed =
                ddo__sat_add_u64(fixed, ddo__round_up(p->tensors[i].loc.nbytes, DDO_TENSOR_ALIGN));
    uint64_t reserve = ddo__sat_add_u64(fixed, ddo__sat_mul_u64(2, ddo__round_up(largest, gran)));
    uint64_t room = limit > reserve ? limit - reserve : 0;
    if (bi->resident_budget > room) {
        bi->resident_budget = room;
        ddo__decisions_set_gb(&p->decisions, "auto_resident_module_budget_slot_cap_gb", room);
    }
}
