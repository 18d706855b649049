/*
 * plan_select.c - choosing items under a byte budget: the first / largest /
 * spread orderings (docs/plan.md) with greedy
 * skip-on-overflow, and ddo's cost selection (units whose transfer cannot be
 * hidden behind the previous unit's compute, largest deficit first).
 */
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

/* round(num / den) with Python's round-half-to-even; den > 0. */
static uint64_t round_half_even(uint64_t num, uint64_t den)
{
    uint64_t q = num / den, r = num % den;
    if (r > den - r)
        return q + 1;
    if (r == den - r && (q & 1u) != 0)
        return q + 1;
    return q;
}

/* Stable insertion-merge sort of idx by key descending (n small enough; O(n log n) merge). */
static void stable_sort_desc(size_t *idx, size_t *tmp, size_t n, const uint64_t *ukey,
                             const double *dkey)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    stable_sort_desc(idx, tmp, h, ukey, dkey);
    stable_sort_desc(idx + h, tmp, n - h, ukey, dkey);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        bool take_right = ukey != NULL ? ukey[idx[j]] > ukey[idx[i]] : dkey[idx[j]] > dkey[idx[i]];
        tmp[k++] = take_right ? idx[j++] : idx[i++];
    }
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < n)
        tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof(*idx));
}

static void order_spread(const uint64_t *sizes, size_t n, uint64_t budget, size_t *order)
{
    if (n <= 2) {
        for (size_t i = 0; i < n; i++)
            order[i] = i;
        return;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total = ddo__sat_add_u64(total, sizes[i]);
    uint64_t avg = total / n;
    if (avg < 1)
        avg = 1;
    uint64_t k = budget / avg;
    if (k > n)
        k = n;
    if (k < 1)
        k = 1;
    /* seen[] marks indices already placed; order[0..m) are the spread positions. */
    bool *seen = calloc(n, sizeof(*seen));
    size_t m = 0;
    if (k == 1) {
        order[m++] = n / 2;
        if (seen != NULL)
            seen[n / 2] = true;
    } else {
        for (uint64_t p = 0; p < k; p++) {
            size_t at = (size_t)round_half_even(p * (uint64_t)(n - 1), k - 1);
            bool dup = false;
            if (seen != NULL)
                dup = seen[at];
            else
                for (size_t j = 0; j < m && !dup; j++)
                    dup = order[j] == at;
            if (!dup) {
                order[m++] = at;
                if (seen != NULL)
                    seen[at] = true;
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        bool dup = false;
        if (seen != NULL)
            dup = seen[i];
        else
            for (size_t j = 0; j < m && !dup; j++)
                dup = order[j] == i;
        if (!dup)
            order[m++] = i;
    }
    free(seen);
}

void ddo__select_order(const uint64_t *sizes, size_t count, uint64_t budget, ddo_selection how,
                       size_t *order)
{
    if (how == DDO_SELECTION_SPREAD) {
        order_spread(sizes, count, budget, order);
        return;
    }
    for (size_t i = 0; i < count; i++)
        order[i] = i;
    if (how == DDO_SELECTION_LARGEST && count > 1) {
        size_t *tmp = malloc(count * sizeof(*tmp));
        if (tmp != NULL) {
            stable_sort_desc(order, tmp, count, sizes, NULL);
            free(tmp);
        } else {
            /* Out of memory: a stable insertion sort needs no scratch space. */
            for (size_t i = 1; i < count; i++) {
                size_t v = order[i], j = i;
                for (; j > 0 && sizes[order[j - 1]] < sizes[v]; j--)
                    order[j] = order[j - 1];
                order[j] = v;
            }
        }
    }
}

size_t ddo__select_greedy(const uint64_t *sizes, const size_t *order, size_t count, uint64_t budget,
                          size_t *chosen_idx, uint64_t *taken)
{
    uint64_t used = 0;
    size_t n = 0;
    for (size_t i = 0; i < count; i++) {
        uint64_t s = sizes[order[i]];
        if (s <= budget && used <= budget - s) {
            used += s;
            chosen_idx[n++] = order[i];
        }
    }
    if (taken != NULL)
        *taken = used;
    return n;
}

size_t ddo__select_by_cost(const uint64_t *sizes, const double *deficits, size_t count,
                           uint64_t budget, size_t *chosen_idx, uint64_t *taken)
{
    size_t *order = malloc((count ? count : 1) * sizeof(*order));
    size_t *tmp = malloc((count ? count : 1) * sizeof(*tmp));
    size_t m = 0, n = 0;
    uint64_t used = 0;
    if (order == NULL || tmp == NULL)
        goto out;
    for (size_t i = 0; i < count; i++)
        if (deficits[i] > 0.0)
            order[m++] = i;
    stable_sort_desc(order, tmp, m, NULL, deficits);
    n = ddo__select_greedy(sizes, order, m, budget, chosen_idx, &used);
out:
    free(order);
    free(tmp);
    if (taken != NULL)
        *taken = used;
    return n;
}

bool ddo__selection_from_name(const char *name, ddo_selection *out)
{
    static const char *const names[] = { "first", "spread", "largest", "cost" };
    for (size_t i = 0; i < DDO_ARRAY_LEN(names); i++)
        if (name != NULL && strcmp(name, names[i]) == 0) {
            *out = (ddo_selection)i;
            return true;
        }
    return false;
}

const char *ddo__selection_name(ddo_selection how)
{
    switch (how) {
    case DDO_SELECTION_FIRST:
        return "first";
    case DDO_SELECTION_SPREAD:
        return "spread";
    case DDO_SELECTION_LARGEST:
        return "largest";
    case DDO_SELECTION_COST:
        return "cost";
    }
    return "?";
}

int ddo_select_under_budget(const uint64_t *sizes, size_t count, uint64_t budget, ddo_selection how,
                            size_t *chosen_idx, size_t *chosen)
{
    if ((count > 0 && (sizes == NULL || chosen_idx == NULL)) || chosen == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_select_under_budget: sizes, chosen_idx and chosen are required");
    if (how != DDO_SELECTION_FIRST && how != DDO_SELECTION_SPREAD && how != DDO_SELECTION_LARGEST)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_select_under_budget: selection %d needs per-item deficits "
                         "(cost selection is done by ddo_plan_build)",
                         (int)how);
    if (count == 0) {
        *chosen = 0;
        return 0;
    }
    size_t *order = ddo__reallocarray(NULL, count, sizeof(*order));
    if (order == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_select_under_budget: %zu items", count);
    ddo__select_order(sizes, count, budget, how, order);
    *chosen = ddo__select_greedy(sizes, order, count, budget, chosen_idx, NULL);
    free(order);
    return 0;
}
