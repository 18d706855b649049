/*
 * test_plan_select.c - resident selection under a budget (docs/plan.md):
 * the worked examples, round-half-to-even positions, greedy
 * skip-on-overflow, the orderings, and ddo's cost selection.
 * ctest-labels: unit
 */
#include "t.h"
#include "plan/plan.h"

#include <stdlib.h>

static size_t pick(const uint64_t *sizes, size_t n, uint64_t budget, ddo_selection how,
                   size_t *chosen)
{
    size_t k = SIZE_MAX;
    int rc = ddo_select_under_budget(sizes, n, budget, how, chosen, &k);
    T_EQ_INT(rc, 0);
    return k;
}

static void test_worked_example_6_gib(void)
{
    uint64_t sizes[48];
    size_t chosen[48];
    uint64_t block = (uint64_t)(0.5007 * 1073741824.0);
    for (int i = 0; i < 48; i++)
        sizes[i] = block;
    size_t k = pick(sizes, 48, 6 * DDO_GIB, DDO_SELECTION_SPREAD, chosen);
    static const size_t want[] = { 0, 5, 9, 14, 19, 24, 28, 33, 38, 42, 47 };
    T_REQUIRE(k == DDO_ARRAY_LEN(want));
    for (size_t i = 0; i < k; i++)
        T_EQ_U64(chosen[i], want[i]);
    char buf[32];
    ddo__format_num4(ddo__bytes_to_gb(11 * block), buf, sizeof(buf));
    T_EQ_STR(buf, "5.5077");
}

static void test_worked_example_3_gib(void)
{
    uint64_t sizes[48];
    size_t chosen[48];
    for (int i = 0; i < 48; i++)
        sizes[i] = (uint64_t)(0.5007 * 1073741824.0);
    size_t k = pick(sizes, 48, 3 * DDO_GIB, DDO_SELECTION_SPREAD, chosen);
    static const size_t want[] = { 0, 12, 24, 35, 47 };
    T_REQUIRE(k == DDO_ARRAY_LEN(want));
    for (size_t i = 0; i < k; i++)
        T_EQ_U64(chosen[i], want[i]);
}

static void test_spread_round_half_even(void)
{
    /* n = 6, k = 3: positions 0, 2.5, 5 -> 0, 2, 5 (2.5 rounds to the even 2, not 3). */
    uint64_t sizes[6] = { 1, 1, 1, 1, 1, 1 };
    size_t order[6], chosen[6];
    ddo__select_order(sizes, 6, 3, DDO_SELECTION_SPREAD, order);
    static const size_t want_order[] = { 0, 2, 5, 1, 3, 4 };
    for (size_t i = 0; i < 6; i++)
        T_EQ_U64(order[i], want_order[i]);
    size_t k = pick(sizes, 6, 3, DDO_SELECTION_SPREAD, chosen);
    T_EQ_U64(k, 3);
    T_EQ_U64(chosen[1], 2);
    /* n = 4, k = 3: 0, 1.5, 3 -> 0, 2, 3 (1.5 rounds to the even 2). */
    ddo__select_order(sizes, 4, 3, DDO_SELECTION_SPREAD, order);
    T_EQ_U64(order[0], 0);
    T_EQ_U64(order[1], 2);
    T_EQ_U64(order[2], 3);
    T_EQ_U64(order[3], 1);
}

static void test_spread_k_one_and_small_n(void)
{
    uint64_t sizes[5] = { 10, 10, 10, 10, 10 };
    size_t chosen[5];
    /* budget // avg = 1: the one position is [n // 2]. */
    size_t k = pick(sizes, 5, 15, DDO_SELECTION_SPREAD, chosen);
    T_EQ_U64(k, 1);
    T_EQ_U64(chosen[0], 2);
    /* Two items or fewer keep their order. */
    uint64_t two[2] = { 7, 3 };
    k = pick(two, 2, 3, DDO_SELECTION_SPREAD, chosen);
    T_EQ_U64(k, 1);
    T_EQ_U64(chosen[0], 1);
    /* A budget smaller than avg still gives k = 1. */
    k = pick(sizes, 5, 5, DDO_SELECTION_SPREAD, chosen);
    T_EQ_U64(k, 0);
}

static void test_first_skips_on_overflow(void)
{
    uint64_t sizes[4] = { 5, 3, 4, 1 };
    size_t chosen[4];
    size_t k = pick(sizes, 4, 6, DDO_SELECTION_FIRST, chosen);
    T_EQ_U64(k, 2);
    T_EQ_U64(chosen[0], 0);
    T_EQ_U64(chosen[1], 3);
}

static void test_largest_is_stable(void)
{
    uint64_t sizes[4] = { 1, 5, 3, 5 };
    size_t chosen[4];
    size_t k = pick(sizes, 4, 9, DDO_SELECTION_LARGEST, chosen);
    T_EQ_U64(k, 3);
    T_EQ_U64(chosen[0], 1); /* the first of the two 5s */
    T_EQ_U64(chosen[1], 2); /* the second 5 overflowed; 3 fits */
    T_EQ_U64(chosen[2], 0);
}

static void test_edges(void)
{
    uint64_t sizes[3] = { 4, 4, 4 };
    size_t chosen[3];
    for (int how = 0; how < 3; how++) {
        T_EQ_U64(pick(sizes, 3, 0, (ddo_selection)how, chosen), 0); /* empty budget */
        T_EQ_U64(pick(sizes, 3, 3, (ddo_selection)how, chosen), 0); /* smaller than any */
        T_EQ_U64(pick(sizes, 1, 4, (ddo_selection)how, chosen), 1); /* a single item */
        T_EQ_U64(pick(NULL, 0, 100, (ddo_selection)how, NULL), 0);  /* nothing at all */
        T_EQ_U64(pick(sizes, 3, UINT64_MAX, (ddo_selection)how, chosen), 3);
    }
    size_t k = 99;
    T_EQ_INT(ddo_select_under_budget(sizes, 3, 10, DDO_SELECTION_COST, chosen, &k),
             DDO_E_INVALID_ARGUMENT);
    T_EQ_U64(k, 99); /* out-parameters untouched on failure */
    T_CONTAINS(ddo_last_error(), "deficits");
}

static void test_huge_count(void)
{
    size_t n = 1000000;
    uint64_t *sizes = malloc(n * sizeof(*sizes));
    size_t *chosen = malloc(n * sizeof(*chosen));
    T_REQUIRE(sizes != NULL && chosen != NULL);
    for (size_t i = 0; i < n; i++)
        sizes[i] = 1;
    size_t k = pick(sizes, n, 10, DDO_SELECTION_SPREAD, chosen);
    T_EQ_U64(k, 10);
    T_EQ_U64(chosen[0], 0);
    T_EQ_U64(chosen[1], 111111); /* round(999999 / 9) */
    T_EQ_U64(chosen[9], n - 1);
    k = pick(sizes, n, n / 2, DDO_SELECTION_LARGEST, chosen);
    T_EQ_U64(k, n / 2);
    T_EQ_U64(chosen[k - 1], n / 2 - 1);
    free(sizes);
    free(chosen);
}

static void test_cost_selection(void)
{
    uint64_t sizes[5] = { 1, 1, 1, 2, 1 };
    double deficits[5] = { 0.0, 0.5, 0.2, 0.9, -0.1 };
    size_t chosen[5];
    uint64_t taken = 0;
    /* Largest deficit first (3, size 2), then 1; 2 would overflow the budget of 3. */
    size_t k = ddo__select_by_cost(sizes, deficits, 5, 3, chosen, &taken);
    T_EQ_U64(k, 2);
    T_EQ_U64(chosen[0], 3);
    T_EQ_U64(chosen[1], 1);
    T_EQ_U64(taken, 3);
    /* Units that are already hidden are never chosen, however large the budget. */
    k = ddo__select_by_cost(sizes, deficits, 5, 100, chosen, &taken);
    T_EQ_U64(k, 3);
    T_EQ_U64(chosen[2], 2);
}

static void test_selection_names(void)
{
    ddo_selection s;
    T_CHECK(ddo__selection_from_name("cost", &s) && s == DDO_SELECTION_COST);
    T_CHECK(ddo__selection_from_name("spread", &s) && s == DDO_SELECTION_SPREAD);
    T_CHECK(!ddo__selection_from_name("Spread", &s));
    T_EQ_STR(ddo__selection_name(DDO_SELECTION_LARGEST), "largest");
}

int main(void)
{
    T_RUN(test_worked_example_6_gib);
    T_RUN(test_worked_example_3_gib);
    T_RUN(test_spread_round_half_even);
    T_RUN(test_spread_k_one_and_small_n);
    T_RUN(test_first_skips_on_overflow);
    T_RUN(test_largest_is_stable);
    T_RUN(test_edges);
    T_RUN(test_huge_count);
    T_RUN(test_cost_selection);
    T_RUN(test_selection_names);
    return t_done();
}
