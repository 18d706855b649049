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
 * (j + m - seam) mod m mod slots of m streamed units (a count that slots does not divide costs
 * depth at the seam; the seam is 0 but on vmm_fast_runtime). A step ends
 * when both its compute and its copies have (the host synchronizes between steps, as every
 * benchmark here does). The prefetch window of a step's last units reaches into the next
 * step, as the session's does: the next step's first slots - 1 streamed units load in this one
 * (after the unit that held their slot has computed), and this step's end waits for them,
 * except the one whose slot the last streamed unit holds (leased when its window is issued,
 * so it loads at its own acquire, in the next step); the next step starts with the others
 * loaded. On vmm_fast_runtime a unit's slot is its home, round the ring from the session's
 * seam (ddo__ring_seam): the short round then sits mid-order, not at the step boundary. */
double ddo__plan_simulate(const ddo_plan *p, size_t slots)
{
    return ddo__plan_simulate_scaled(p, slots, 1.0);
}

/* The transfer times of the first `max` streamed units, in order, and every streamed unit's
 * index (rank[], unit_count long); returns how many there are. */
static size_t first_streamed(const ddo_plan *p, double *transfer, size_t max, double scale,
                             size_t *rank)
{
    size_t n = 0;
    for (size_t u = 0; u < p->unit_count; u++) {
        if (p->units[u].resident)
            continue;
        if (n < max)
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

/* One copy of transfer seconds into a slot free at slot_free: it starts when both the copy
 * engine (*copy_free) and the slot are free; returns its end, which frees the engine. */
static double copy_into(double *copy_free, double slot_free, double transfer)
{
    double cs = *copy_free > slot_free ? *copy_free : slot_free;
    *copy_free = cs + transfer;
    return *copy_free;
}

double ddo__plan_simulate_scaled(const ddo_plan *p, size_t slots, double transfer_scale)
{
    if (!p->cost_enabled || p->unit_count == 0)
        return 0.0;
    size_t ring_n = slots ? slots : 1;
    double *ring = calloc(ring_n, sizeof(double));
    double *head = calloc(ring_n, sizeof(double)); /* the first streamed units' transfers */
    bool *loaded = calloc(ring_n, sizeof(bool));   /* ... loaded by the step before */
    size_t *rank = calloc(p->unit_count, sizeof(size_t));
    if (ring == NULL || head == NULL || loaded == NULL || rank == NULL) {
        free(ring);
        free(head);
        free(loaded);
        free(rank);
        return 0.0;
    }
    size_t streamed = first_streamed(p, head, ring_n, transfer_scale, rank);
    ring_ctx rc = { p, rank };
    size_t seam = ddo__route_maps(p->route) && !ddo__route_per_weight(p->route)
                      ? ddo__ring_seam(streamed, slots, ring_bytes, &rc)
                      : 0;
    free(rank);
    /* With no more streamed units than slots, each keeps a slot of its own (no window wraps
     * onto a busy slot): the model below still copies each unit every step. */
    size_t wrap = slots > 1 && streamed > slots ? slots - 1 : 0;
    double copy_free = 0.0, compute_free = 0.0, step_end[2] = { 0.0, 0.0 };
    for (int step = 0; step < 2; step++) {
        size_t j = 0; /* a streamed unit keeps its slot from step to step (its position mod
                       * slots), as vmm_fast_runtime's mapped slots do */
        for (size_t u = 0; u < p->unit_count; u++) {
            const ddo__plan_unit *un = &p->units[u];
            if (un->resident || slots == 0) {
                compute_free += un->compute_s;
                continue;
            }
            double ce = 0.0; /* loaded by the step before: its copy ended by this step's start */
            size_t at = ddo__ring_home(j, streamed, seam, slots);
            if (!(j < wrap && loaded[j]))
                ce = copy_into(&copy_free, ring[at], un->transfer_s * transfer_scale);
            double start = compute_free > ce ? compute_free : ce;
            compute_free = start + un->compute_s;
            ring[at] = compute_free;
            j++;
        }
        /* The last units' window: the next step's first units (not the one whose slot the
         * last streamed unit, j - 1, holds). */
        for (size_t k = 0; k < wrap; k++) {
            size_t at = ddo__ring_home(k, streamed, seam, slots);
            loaded[k] = ddo__ring_home(j - 1, streamed, seam, slots) != at;
            if (loaded[k])
                copy_into(&copy_free, ring[at], head[k]);
        }
        compute_free = copy_free = compute_free > copy_free ? compute_free : copy_free;
        step_end[step] = compute_free;
    }
    free(ring);
    free(head);
    free(loaded);
    return step_end[1] - step_end[0];
}
