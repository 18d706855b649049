/*
 * plan_cost.c - what the cost model learns from measurements, and the resident selection it
 * drives (docs/plan.md "Cost model"). Part of the build (plan_build.h).
 *
 * Measured compute: the FLOP estimate (2 * out * in per token of each 2-D weight at the
 * inputs' FLOP rate) is wrong wherever a unit's weights do not all see every token: a Flux
 * double block applies half its weights to the 512 text tokens only, so it computes about as
 * long as a single block while holding 2.4 times its bytes. A profile's calibration measures
 * each unit's compute (the binding times every unit's forward) and the next plan takes them
 * as inputs.unit_compute_json; a unit it does not name is estimated from its FLOPs at the
 * rate the measured units showed (or at the inputs' FLOP rate when there is one).
 *
 * Selection "cost": a search on the simulated step (ddo__plan_simulate). The starting sets are
 * those of first, spread and largest and a greedy pass (from nothing resident, each round
 * makes resident the scope that fits the remaining budget and gives the shortest predicted
 * step; ties, a step the slots already hide, go to the scope with the larger deficit, its
 * units' transfer not hidden behind the previous unit's compute, then the larger scope); the
 * best of them (ties: less deficit left streamed, then more resident bytes) is improved by swapping
 * a resident scope for a streamed one while that shortens the step (bounded passes; skipped for
 * very large models). A set's score ("step" above) is the mean of its step simulated with
 * transfers 0.9, 1.0 and 1.1 times as long as the inputs say (transfer_scales); the result
 * never scores worse than first, spread or largest. The simulation models what the budget cannot
 * see from bytes alone: a streamed unit's upload must fit behind the compute of the units before it
 * within the slots' prefetch depth, so which units stream matters, not only how many bytes.
 */
#include "plan/plan_build.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The selection scores a set by its step simulated at the inputs' bus and at 10 % either side
 * (the mean of the three): a measured copy rate drifts between processes (2-6 % on the H200),
 * and a set that only the exact figure hides, or a clumped set that a bus-bound simulation
 * cannot tell from a spread one, loses in practice. */
static const double transfer_scales[] = { 0.9, 1.0, 1.1 };

/* A measured figure above this (seconds per unit) is refused as nonsense. */
#define MAX_UNIT_COMPUTE_S 1e6

/* A packed unit's name ("prefix.A-B", unit_pack_blocks, A < B): the prefix's length and the
 * range; false for any other name. */
static bool packed_range(const char *name, size_t *plen, unsigned long *first, unsigned long *last)
{
    const char *dot = strrchr(name, '.');
    int used = 0;
    if (dot == NULL || sscanf(dot + 1, "%lu-%lu%n", first, last, &used) != 2 ||
        dot[1 + used] != '\0' || *last <= *first || *last - *first > 4096)
        return false;
    *plen = (size_t)(dot - name);
    return true;
}

/* The name of block k of prefix (the first plen bytes of name) into key. */
static void block_key(char *key, size_t len, const char *name, size_t plen, unsigned long k)
{
    snprintf(key, len, "%.*s.%lu", (int)plen, name, k);
}

/* A packed unit a profile measured block by block: the sum of its blocks' figures in *s; false
 * where one is missing (or not a number) or the name is no packed range. */
static bool packed_sum(json_t *root, const char *name, double *s)
{
    size_t plen = 0;
    unsigned long first = 0, last = 0;
    if (!packed_range(name, &plen, &first, &last))
        return false;
    char key[512];
    *s = 0.0;
    for (unsigned long k = first; k <= last; k++) {
        block_key(key, sizeof(key), name, plen, k);
        json_t *v = json_object_get(root, key);
        if (v == NULL || !json_is_number(v))
            return false;
        *s += json_number_value(v);
    }
    return true;
}

/* The FLOPs of the plan's units prefix.first .. prefix.last, and how many of them it has. */
static double range_flops(const ddo_plan *p, const char *name, size_t plen, unsigned long first,
                          unsigned long last, size_t *found)
{
    double f = 0.0;
    *found = 0;
    char key[512];
    for (unsigned long k = first; k <= last; k++) {
        block_key(key, sizeof(key), name, plen, k);
        for (size_t u = 0; u < p->unit_count; u++)
            if (strcmp(p->units[u].name, key) == 0) {
                f += (double)p->units[u].flops_per_token;
                (*found)++;
                break;
            }
    }
    return f;
}

/* The other way round: a block ("prefix.K") a profile measured packed with others
 * ("prefix.A-B", A <= K <= B) takes its share of that figure, by FLOPs among the plan's units
 * of the range (equal shares where the plan lacks one of them or they compute nothing). False
 * where no packed figure names it. */
static bool packed_share(json_t *root, const ddo_plan *p, size_t u, double *s)
{
    const char *name = p->units[u].name, *dot = strrchr(name, '.');
    unsigned long k = 0, first = 0, last = 0;
    int used = 0;
    if (dot == NULL || sscanf(dot + 1, "%lu%n", &k, &used) != 1 || dot[1 + used] != '\0')
        return false;
    size_t plen = (size_t)(dot - name), klen = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (!packed_range(key, &klen, &first, &last) || klen != plen ||
            strncmp(key, name, plen) != 0 || k < first || k > last || !json_is_number(v))
            continue;
        size_t found = 0;
        double f = range_flops(p, name, plen, first, last, &found);
        bool by_flops = found == last - first + 1 && f > 0.0;
        *s = json_number_value(v) * (by_flops ? (double)p->units[u].flops_per_token / f
                                              : 1.0 / (double)(last - first + 1));
        return true;
    }
    return false;
}

int ddo__plan_measured_compute(builder *b, size_t *measured)
{
    ddo_plan *p = b->p;
    *measured = 0;
    const char *text = b->in.unit_compute_json;
    if (text == NULL || text[0] == '\0')
        return 0;
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL || !json_is_object(root)) {
        json_decref(root);
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "plan inputs: unit_compute_json is not a JSON object of seconds");
    }
    int rc = 0;
    for (size_t u = 0; u < p->unit_count && rc == 0; u++) {
        json_t *v = json_object_get(root, p->units[u].name);
        double s = 0.0;
        if (v != NULL)
            s = json_is_number(v) ? json_number_value(v) : -1.0;
        else if (!packed_sum(root, p->units[u].name, &s))
            continue;
        if (!(s >= 0.0 && s <= MAX_UNIT_COMPUTE_S)) {
            rc = ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                           "plan inputs: unit_compute_json: unit \"%s\": not a number of "
                           "seconds in [0, %g]",
                           p->units[u].name, MAX_UNIT_COMPUTE_S);
            break;
        }
        p->units[u].compute_s = s;
        p->units[u].compute_measured = true;
        (*measured)++;
    }
    for (size_t u = 0; u < p->unit_count && rc == 0; u++) {
        double s = 0.0;
        if (p->units[u].compute_measured || !packed_share(root, p, u, &s))
            continue;
        if (!(s >= 0.0 && s <= MAX_UNIT_COMPUTE_S))
            continue; /* (a packed figure out of range: refused above where a unit is named so) */
        p->units[u].compute_s = s;
        p->units[u].compute_measured = true;
        (*measured)++;
    }
    json_decref(root);
    return rc;
}

/* Seconds per FLOP-per-token of the measured units (0 when they compute nothing). */
double ddo__plan_measured_rate(const ddo_plan *p)
{
    double s = 0.0, f = 0.0;
    for (size_t u = 0; u < p->unit_count; u++)
        if (p->units[u].compute_measured) {
            s += p->units[u].compute_s;
            f += (double)p->units[u].flops_per_token;
        }
    return f > 0.0 ? s / f : 0.0;
}

/* The scope whose residency a unit follows (NONE: none). */
static size_t unit_scope(const builder *b, size_t u)
{
    const ddo_plan *p = b->p;
    size_t first = p->unit_tensors[p->units[u].first_tensor];
    const pmod *m = &b->mods[b->tmod[first]];
    return m->block != NONE && b->blocks[m->block].matches ? b->blocks[m->block].scope : m->scope;
}

/* The selection state: which scopes are in, and each unit's scope. */
typedef struct sim_sel {
    builder *b;
    const uint64_t *sizes;
    uint64_t budget;
    size_t *scope_of; /* per unit */
    bool *in;         /* per scope */
    double *deficit;  /* per scope */
    size_t slots;
    uint64_t taken;
    /* The device fit (limit 0: not checked): the arena of the fixed residents and of each
     * scope's streamed tensors (each rounded up to DDO_TENSOR_ALIGN, never less than the
     * arena), plus the slots at the largest streamed unit's span rounded to the page. */
    uint64_t limit, page, fixed;
    uint64_t *arena; /* per scope */
} sim_sel;

/* Marks the units of the scopes in resident. */
static void mark(sim_sel *x)
{
    ddo_plan *p = x->b->p;
    for (size_t u = 0; u < p->unit_count; u++)
        p->units[u].resident = x->scope_of[u] != NONE && x->in[x->scope_of[u]];
}

/* Whether the set in fits the device limit together with the slots its streamed units need:
 * streaming only small units makes the slots smaller and leaves room for more residents. */
static bool fits(sim_sel *x)
{
    if (x->limit == 0)
        return true;
    ddo_plan *p = x->b->p;
    mark(x);
    uint64_t need = x->fixed, largest = 0;
    for (size_t s = 0; s < x->b->scope_count; s++)
        need = x->in[s] ? ddo__sat_add_u64(need, x->arena[s]) : need;
    for (size_t u = 0; u < p->unit_count; u++)
        if (!p->units[u].resident && p->units[u].span_bytes > largest)
            largest = p->units[u].span_bytes;
    if (largest > 0)
        need = ddo__sat_add_u64(need, ddo__sat_mul_u64(x->slots, ddo__round_up(largest, x->page)));
    return need <= x->limit;
}

/* The fixed residents' and every scope's arena bytes (x->limit > 0). */
static void arena_sizes(sim_sel *x)
{
    ddo_plan *p = x->b->p;
    for (size_t i = 0; i < x->b->n; i++) {
        const ddo_tensor_location *loc = &p->tensors[i].loc;
        uint64_t a = ddo__round_up(loc->nbytes, DDO_TENSOR_ALIGN);
        if (loc->placement == DDO_PLACEMENT_RESIDENT)
            x->fixed = ddo__sat_add_u64(x->fixed, a);
        else if (loc->placement == DDO_PLACEMENT_STREAMED && loc->unit != NONE &&
                 x->scope_of[loc->unit] != NONE)
            x->arena[x->scope_of[loc->unit]] =
                ddo__sat_add_u64(x->arena[x->scope_of[loc->unit]], a);
    }
}

/* The predicted step of the set in (units of scopes in are resident). */
static double step_of(sim_sel *x)
{
    ddo_plan *p = x->b->p;
    mark(x);
    double t = 0.0;
    for (size_t k = 0; k < DDO_ARRAY_LEN(transfer_scales); k++)
        t += ddo__plan_simulate_scaled(p, x->slots, transfer_scales[k]);
    return t / (double)DDO_ARRAY_LEN(transfer_scales);
}

static void set_in(sim_sel *x, size_t s, bool on)
{
    if (x->in[s] != on)
        x->taken = on ? x->taken + x->sizes[s] : x->taken - x->sizes[s];
    x->in[s] = on;
}

static void clear_in(sim_sel *x)
{
    for (size_t s = 0; s < x->b->scope_count; s++)
        set_in(x, s, false);
}

/* Per scope: the sum of its units' transfer beyond the previous unit's compute. */
static void scope_deficits(const ddo_plan *p, const size_t *scope_of, double *deficit)
{
    for (size_t u = 0; u < p->unit_count; u++) {
        size_t prev = u > 0 ? u - 1 : p->unit_count - 1;
        double d = p->units[u].transfer_s - p->units[prev].compute_s;
        if (scope_of[u] != NONE && d > 0.0)
            deficit[scope_of[u]] += d;
    }
}

static bool same_step(double a, double b)
{
    return fabs(a - b) <= 1e-12 * (b > 1.0 ? b : 1.0);
}

/* True when scope s (step t) beats the best so far (step best_t): a shorter step; on a tie
 * the larger deficit, then the larger scope. */
static bool better(const sim_sel *x, size_t s, double t, size_t best, double best_t)
{
    if (best == NONE)
        return true;
    if (!same_step(t, best_t))
        return t < best_t;
    if (x->deficit[s] != x->deficit[best])
        return x->deficit[s] > x->deficit[best];
    return x->sizes[s] > x->sizes[best];
}

/* Greedy from the current set: adds the best scope that fits until none does. */
static void greedy(sim_sel *x)
{
    for (;;) {
        size_t best = NONE;
        double best_t = 0.0;
        for (size_t s = 0; s < x->b->scope_count; s++) {
            if (x->in[s] || x->sizes[s] == 0 || x->sizes[s] > x->budget - x->taken)
                continue;
            set_in(x, s, true);
            if (!fits(x)) {
                set_in(x, s, false);
                continue;
            }
            double t = step_of(x);
            set_in(x, s, false);
            if (better(x, s, t, best, best_t)) {
                best = s;
                best_t = t;
            }
        }
        if (best == NONE)
            return;
        set_in(x, best, true);
    }
}

/* One pass of swaps (a chosen scope out, an unchosen one in, within the budget), keeping the
 * first that shortens the step; true when one did. */
static bool improve_once(sim_sel *x, double *cur)
{
    size_t n = x->b->scope_count;
    for (size_t a = 0; a < n; a++) {
        if (!x->in[a])
            continue;
        for (size_t c = 0; c < n; c++) {
            if (x->in[c] || x->sizes[c] == 0 || x->sizes[c] > x->budget - x->taken + x->sizes[a])
                continue;
            set_in(x, a, false);
            set_in(x, c, true);
            double t = fits(x) ? step_of(x) : INFINITY;
            if (t < *cur && !same_step(t, *cur)) {
                *cur = t;
                greedy(x); /* the swap may have freed room */
                *cur = step_of(x);
                return true;
            }
            set_in(x, c, false);
            set_in(x, a, true);
        }
    }
    return false;
}

/* Searches are quadratic in the scopes and linear in the units: above this many simulated
 * units the selection keeps the best of the heuristics and the greedy pass only. */
#define SEARCH_WORK_LIMIT 4e8
#define SWAP_PASSES       16

/* The heuristics' sets (first, spread, largest) as starting points. */
static void heuristic(sim_sel *x, ddo_selection how, size_t *order, size_t *chosen)
{
    size_t n = x->b->scope_count;
    uint64_t taken = 0;
    ddo__select_order(x->sizes, n, x->budget, how, order);
    size_t k = ddo__select_greedy(x->sizes, order, n, x->budget, chosen, &taken);
    clear_in(x);
    for (size_t i = 0; i < k; i++)
        set_in(x, chosen[i], true);
}

/* The deficit left streamed: what jitter would expose first. */
static double exposed_deficit(const sim_sel *x)
{
    double d = 0.0;
    for (size_t s = 0; s < x->b->scope_count; s++)
        d += x->in[s] ? 0.0 : x->deficit[s];
    return d;
}

/* How many size-class starts the search tries at most (the distinct unit spans, largest
 * first; a transformer has a few). */
#define SIZE_CLASS_STARTS 8

/* A size-class start: every scope with a unit of span >= span is in (so the slots shrink to
 * the next smaller span), then greedy; false when that set exceeds the budget or the device.
 * Swapping one scope at a time cannot find it: the slots shrink only once every large unit is
 * resident (a Flux transformer's 19 double blocks). */
static bool size_class(sim_sel *x, uint64_t span)
{
    const ddo_plan *p = x->b->p;
    clear_in(x);
    for (size_t u = 0; u < p->unit_count; u++)
        if (p->units[u].span_bytes >= span && x->scope_of[u] != NONE)
            set_in(x, x->scope_of[u], true);
    if (x->taken > x->budget || !fits(x))
        return false;
    greedy(x);
    return true;
}

/* The k-th largest distinct unit span (0 when there are fewer). */
static uint64_t span_class(const ddo_plan *p, size_t k)
{
    uint64_t above = UINT64_MAX, v = 0;
    for (size_t i = 0; i <= k; i++, above = v) {
        v = 0;
        for (size_t u = 0; u < p->unit_count; u++)
            if (p->units[u].span_bytes < above && p->units[u].span_bytes > v)
                v = p->units[u].span_bytes;
        if (v == 0)
            return 0;
    }
    return v;
}

static void search(sim_sel *x, size_t *order, size_t *chosen, bool *best_in)
{
    size_t n = x->b->scope_count;
    static const ddo_selection starts[] = { DDO_SELECTION_FIRST, DDO_SELECTION_SPREAD,
                                            DDO_SELECTION_LARGEST };
    double best = INFINITY, best_exposed = 0.0;
    uint64_t best_taken = 0;
    size_t classes = x->limit > 0 ? SIZE_CLASS_STARTS : 0;
    for (size_t k = 0; k <= DDO_ARRAY_LEN(starts) + classes; k++) {
        if (k < DDO_ARRAY_LEN(starts)) {
            heuristic(x, starts[k], order, chosen);
            if (!fits(x))
                continue; /* a heuristic's set without room for its slots */
        } else if (k == DDO_ARRAY_LEN(starts)) {
            clear_in(x);
            greedy(x);
        } else {
            uint64_t span = span_class(x->b->p, k - DDO_ARRAY_LEN(starts) - 1);
            if (span == 0)
                break;
            if (!size_class(x, span))
                continue;
        }
        double t = step_of(x), exposed = exposed_deficit(x);
        bool win = best == INFINITY          ? true
                   : !same_step(t, best)     ? t < best
                   : exposed != best_exposed ? exposed < best_exposed
                                             : x->taken > best_taken;
        if (win) {
            best = t;
            best_exposed = exposed;
            best_taken = x->taken;
            memcpy(best_in, x->in, n * sizeof(bool));
        }
    }
    for (size_t s = 0; s < n; s++)
        set_in(x, s, best_in[s]);
    double w = (double)n * (double)n * 2.0 * (double)x->b->p->unit_count;
    for (int pass = 0; pass < SWAP_PASSES && w <= SEARCH_WORK_LIMIT; pass++)
        if (!improve_once(x, &best))
            break;
}

/* With the device fit known and execution_slots automatic, the slot count is part of the
 * choice: fewer slots leave room for more residents, more slots prefetch deeper. Tried in the
 * order 3, 2, 4, 5, ... DDO__AUTO_SLOTS_MAX (slot_choice(k)), a later count only on a shorter
 * step; b->chosen_slots takes the winner. */
#define SLOT_CHOICES (DDO__AUTO_SLOTS_MAX - 1)

static size_t slot_choice(size_t k)
{
    return k < 2 ? 3 - k : k + 2;
}

static void search_slots(sim_sel *x, size_t *order, size_t *chosen, bool *best_in)
{
    size_t n = x->b->scope_count, best_slots = 0;
    double best = INFINITY;
    bool *keep = ddo__calloc(n ? n : 1, sizeof(bool));
    for (size_t k = 0; k < SLOT_CHOICES && keep != NULL; k++) {
        x->slots = slot_choice(k);
        search(x, order, chosen, best_in);
        double t = fits(x) ? step_of(x) : INFINITY;
        /* (A count whose set fits always beats one whose does not: same_step cannot compare
         * with an infinite step.) */
        if (best_slots == 0 || (t < best && (isinf(best) || !same_step(t, best)))) {
            best = t;
            best_slots = x->slots;
            memcpy(keep, x->in, n * sizeof(bool));
        }
    }
    if (keep == NULL) {
        search(x, order, chosen, best_in); /* out of memory: the default count only */
        return;
    }
    x->slots = best_slots;
    for (size_t s = 0; s < n; s++)
        set_in(x, s, keep[s]);
    x->b->chosen_slots = best_slots;
    free(keep);
}

size_t ddo__plan_select_by_simulation(builder *b, const uint64_t *sizes, uint64_t budget,
                                      size_t *chosen, uint64_t *taken)
{
    ddo_plan *p = b->p;
    size_t n = b->scope_count ? b->scope_count : 1, un = p->unit_count ? p->unit_count : 1;
    sim_sel x = { b,
                  sizes,
                  budget,
                  ddo__calloc(un, sizeof(size_t)),
                  ddo__calloc(n, sizeof(bool)),
                  ddo__calloc(n, sizeof(double)),
                  3,
                  0,
                  0,
                  0,
                  0,
                  NULL };
    size_t *order = ddo__calloc(n, sizeof(size_t));
    bool *best_in = ddo__calloc(n, sizeof(bool));
    size_t k = SIZE_MAX;
    if (x.scope_of == NULL || x.in == NULL || x.deficit == NULL || order == NULL || best_in == NULL)
        goto out;
    for (size_t u = 0; u < p->unit_count; u++)
        x.scope_of[u] = unit_scope(b, u);
    scope_deficits(p, x.scope_of, x.deficit);
    int64_t want = b->o->execution_slots;
    x.slots = want > 0 ? (want < 2 ? 2 : (size_t)want) : 3;
    /* vmm_runtime's slots hold per-weight handles (plan_device.c): its fit stays the device
     * side's check. */
    if (b->device_limit > 0 && !ddo__route_per_weight(p->route) &&
        ddo__plan_slot_page(b, &x.page) == 0) {
        x.arena = ddo__calloc(n, sizeof(uint64_t));
        if (x.arena == NULL)
            goto out;
        x.limit = b->device_limit;
        arena_sizes(&x);
    }
    if (x.limit > 0 && want <= 0)
        search_slots(&x, order, chosen, best_in);
    else
        search(&x, order, chosen, best_in);
    k = 0;
    for (size_t s = 0; s < b->scope_count; s++)
        if (x.in[s])
            chosen[k++] = s;
    *taken = x.taken;
out:
    for (size_t u = 0; u < p->unit_count; u++)
        p->units[u].resident = false; /* make_budget_resident sets them from the choice */
    free(x.scope_of);
    free(x.in);
    free(x.deficit);
    free(x.arena);
    free(order);
    free(best_in);
    return k;
}
