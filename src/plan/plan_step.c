/*
 * plan_step.c - the cost model's simulated step (docs/plan.md): a unit's transfer time and the
 * predicted time of a step from the units' transfer and compute times and the slots. Pure
 * arithmetic on the plan, below the steps of the build that use it (placement, the cost
 * selection, the codec decision). Part of the build (plan_build.h).
 */
#include "plan/plan_build.h"

#include <stdlib.h>

/* A unit's transfer time: its bytes over the bus; a coded unit (weight_codec) moves its coded
 * bytes while the decoder writes its decoded bytes, overlapped: the longer of the two. */
double ddo__plan_unit_transfer_s(const builder *b, const ddo__plan_unit *un, double decode_rate)
{
    uint64_t bus_bytes = un->coded_bytes > 0 ? un->coded_bytes : un->bytes;
    double t = (double)bus_bytes / b->in.bus_bytes_per_s;
    if (un->coded_bytes > 0 && decode_rate > 0.0) {
        double dec = (double)un->decoded_bytes / decode_rate;
        t = dec > t ? dec : t;
    }
    return t;
}

size_t ddo__ring_seam(size_t m, size_t k, uint64_t (*bytes_at)(const void *ctx, size_t r),
                      const void *ctx)
{
    size_t seam = 0;
    if (k == 0 || m <= k || m % k == 0)
        return 0;
    bool inside = m > 2 * k;
    size_t lo = inside ? k : 0, hi = inside ? m - k : m - 1;
    uint64_t best_bytes = UINT64_MAX;
    size_t best_dist = SIZE_MAX;
    for (size_t c = lo; c <= hi; c++) {
        uint64_t bytes = 0;
        for (size_t j = 0; j < 2 * k; j++)
            bytes += bytes_at(ctx, (c + m - k + j) % m);
        size_t dist = 2 * c > m ? 2 * c - m : m - 2 * c;
        if (bytes < best_bytes || (bytes == best_bytes && dist < best_dist)) {
            best_bytes = bytes;
            best_dist = dist;
            seam = c;
        }
    }
    return seam;
}

/* Predicted step time: copies serial on one engine, compute serial, a slot reused only after
 * the unit that held it has computed (prefetch depth slots - 1); the second of two simulated
 * steps is the steady state. Streamed unit j of a step uses the same slot in every step,
 * (j + m - seam) mod m mod slots of m streamed units (the seam is 0 but on vmm_fast_runtime).
 * Copies are issued as the session issues them: at each streamed unit's acquire, the window of
 * the next slots - 1 streamed units, wrapping into the next step; a unit whose slot still holds
 * a unit of the window (the current one or a later one: where slots does not divide m, in the
 * short round at the seam) is skipped and tried at the next acquire, and the window goes on, so
 * the copy engine keeps working on the units behind it. A step ends when both its compute and
 * its copies have (the host synchronizes between steps, as every benchmark here does), the
 * next step's first units that this step's window issued among them; the one whose slot the
 * last streamed unit holds loads in the next step. On vmm_fast_runtime a unit's slot is its
 * home, round the ring from the session's seam (ddo__ring_seam): the short round then sits
 * mid-order, not at the step boundary. */
double ddo__plan_simulate(const ddo_plan *p, size_t slots)
{
    return ddo__plan_simulate_scaled(p, slots, 1.0);
}

/* Every streamed unit's index (rank[]) and transfer time, in order (both unit_count long);
 * returns how many there are. */
static size_t streamed_units(const ddo_plan *p, double *transfer, double scale, size_t *rank)
{
    size_t n = 0;
    for (size_t u = 0; u < p->unit_count; u++) {
        if (p->units[u].resident)
            continue;
        transfer[n] = p->units[u].transfer_s * scale;
        rank[n++] = u;
    }
    return n;
}

typedef struct ring_ctx {
    const ddo_plan *p;
    const size_t *rank;
} ring_ctx;

static uint64_t ring_bytes(const void *ctx, size_t r)
{
    const ring_ctx *c = ctx;
    return c->p->units[c->rank[r]].bytes;
}

size_t ddo__ring_home(size_t r, size_t m, size_t seam, size_t k)
{
    return ((r + m - seam) % m) % k;
}

/* The ring as the simulation runs it: each streamed unit's transfer and home slot, the slots'
 * occupants (global positions: step * streamed + rank) and when they free, the engines. */
typedef struct sim_ring {
    size_t m, k;
    const double *transfer; /* m */
    const size_t *home;     /* m */
    int64_t *issued;        /* m: the global position a unit's last copy was issued for */
    double *ready;          /* m: that copy's end */
    int64_t *occupant;      /* k */
    double *slot_free;      /* k: its occupant's compute end */
    double copy_free;
} sim_ring;

/* Issues the copy of global position g: it starts when the copy engine and its home slot are
 * free (the occupant computed) and frees the engine at its end. */
static void issue(sim_ring *r, int64_t g)
{
    size_t j = (size_t)(g % (int64_t)r->m), h = r->home[j];
    double cs = r->copy_free > r->slot_free[h] ? r->copy_free : r->slot_free[h];
    r->copy_free = cs + r->transfer[j];
    r->ready[j] = r->copy_free;
    r->issued[j] = g;
    r->occupant[h] = g;
}

/* At the acquire of global position g: the window g + 1 .. g + k - 1 (within the step where
 * the ring holds every streamed unit), a unit issued unless its home slot's occupant is
 * still in the window (g or later: leased or loading), as the session skips it
 * (session_slots.c DDO__PICK_SKIP) and goes on; a skipped unit is tried at the next acquire. */
static void window(sim_ring *r, int64_t g)
{
    int64_t m = (int64_t)r->m;
    for (size_t d = 1; d < r->k; d++) {
        int64_t w = g + (int64_t)d;
        if (r->m <= r->k && w / m != g / m)
            break;
        size_t j = (size_t)(w % m);
        if (r->issued[j] != w && r->occupant[r->home[j]] < g)
            issue(r, w);
    }
}

double ddo__plan_simulate_scaled(const ddo_plan *p, size_t slots, double transfer_scale)
{
    if (!p->cost_enabled || p->unit_count == 0)
        return 0.0;
    size_t n = p->unit_count, k = slots ? slots : 1;
    size_t *rank = calloc(n, sizeof(size_t)), *home = calloc(n, sizeof(size_t));
    double *transfer = calloc(n, sizeof(double)), *ready = calloc(n, sizeof(double));
    int64_t *issued = calloc(n, sizeof(int64_t)), *occupant = calloc(k, sizeof(int64_t));
    double *slot_free = calloc(k, sizeof(double));
    double result = 0.0;
    if (rank == NULL || home == NULL || transfer == NULL || ready == NULL || issued == NULL ||
        occupant == NULL || slot_free == NULL)
        goto done;
    size_t m = streamed_units(p, transfer, transfer_scale, rank);
    ring_ctx rc = { p, rank };
    size_t seam = ddo__route_maps(p->route) && !ddo__route_per_weight(p->route)
                      ? ddo__ring_seam(m, slots, ring_bytes, &rc)
                      : 0;
    for (size_t j = 0; j < m; j++) {
        home[j] = ddo__ring_home(j, m, seam, k);
        issued[j] = -1;
    }
    for (size_t i = 0; i < k; i++)
        occupant[i] = -1;
    sim_ring r = { m, k, transfer, home, issued, ready, occupant, slot_free, 0.0 };
    double compute_free = 0.0, step_end[2] = { 0.0, 0.0 };
    for (int step = 0; step < 2; step++) {
        size_t j = 0;
        for (size_t u = 0; u < n; u++) {
            const ddo__plan_unit *un = &p->units[u];
            if (un->resident || slots == 0) {
                compute_free += un->compute_s;
                continue;
            }
            int64_t g = (int64_t)step * (int64_t)m + (int64_t)j;
            if (issued[j] != g)
                issue(&r, g); /* on demand */
            window(&r, g);
            double start = compute_free > ready[j] ? compute_free : ready[j];
            compute_free = start + un->compute_s;
            slot_free[home[j]] = compute_free;
            j++;
        }
        /* The host synchronizes between steps: the step ends when its compute and every copy
         * issued in it (the next step's first units among them) have. */
        compute_free = r.copy_free = compute_free > r.copy_free ? compute_free : r.copy_free;
        step_end[step] = compute_free;
    }
    result = step_end[1] - step_end[0];
done:
    free(rank);
    free(home);
    free(transfer);
    free(ready);
    free(issued);
    free(occupant);
    free(slot_free);
    return result;
}
