/*
 * test_plan_props.c - property tests of the planner over random tensor
 * tables, configurations and budgets (the fuzz target's generator fed with
 * seeded random bytes): every tensor placed exactly once, no predicted peak
 * over its budget in an accepted plan, the same input gives the same plan,
 * and the JSON round-trips.
 * ctest-labels: unit
 */
#define FUZZ_PLAN_NO_ENTRY
#include "fuzz/fuzz_plan.c"
#include "t.h"

static uint64_t rng_state = 0x243F6A8885A308D3ull;

static uint64_t rng(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static void test_random_tables(void)
{
    uint8_t buf[2048];
    int accepted = 0, refused = 0;
    for (int trial = 0; trial < 400; trial++) {
        size_t len = 16 + (size_t)(rng() % (sizeof(buf) - 16));
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)rng();
        char why[512] = "";
        bool ok = false;
        int bad = fp_run(buf, len, why, sizeof(why), &ok);
        T_CHECK_MSG(bad == 0, "trial %d: %s", trial, why);
        if (bad)
            break;
        /* Count accepted plans, so the test cannot pass vacuously. */
        if (ok)
            accepted++;
        else
            refused++;
    }
    fprintf(stderr, "  %d plans accepted and checked, %d refused\n", accepted, refused);
    T_CHECK(accepted > 100);
}

static void test_checker_catches_a_broken_plan(void)
{
    /* The checker must notice a tampered plan: shrink the slot in the JSON and reload. */
    uint8_t seedbytes[64] = { 0, 0, 0, 0, 4, 3, 0, 0, 0, 0, 0, 0, 0, 0 };
    for (size_t i = 14; i < sizeof(seedbytes); i++)
        seedbytes[i] = (uint8_t)(i * 37);
    fp_reader r = { seedbytes, sizeof(seedbytes), 0 };
    ddo_plan_inputs in;
    ddo_config *cfg = fp_config(&r, &in);
    T_REQUIRE(cfg != NULL);
    uint64_t shape[2] = { 1024, 1024 };
    ddo_tensor_desc t[2] = { { "layers.0.w.weight", DDO_DTYPE_F32, 2, shape, NULL },
                             { "layers.1.w.weight", DDO_DTYPE_F32, 2, shape, NULL } };
    ddo_checkpoint *ck = NULL;
    T_REQUIRE(ddo_checkpoint_create_from_memory(t, 2, &ck) == 0);
    ddo_plan *p = NULL;
    T_REQUIRE(ddo_plan_build(ck, cfg, &in, &p) == 0);
    char why[256];
    T_EQ_INT(fp_check_plan(p, ck, why, sizeof(why)), 0);
    char *json = NULL;
    T_REQUIRE(ddo_plan_to_json(p, &json) == 0);
    char *at = strstr(json, "\"slot_bytes\": 4194304");
    T_REQUIRE(at != NULL);
    memcpy(at, "\"slot_bytes\": 1194304", strlen("\"slot_bytes\": 1194304"));
    ddo_plan *q = NULL;
    T_REQUIRE(ddo_plan_from_json(json, &q) == 0);
    T_EQ_INT(fp_check_plan(q, ck, why, sizeof(why)), 1);
    T_CONTAINS(why, "outside its slot");
    ddo_free(json);
    ddo_plan_destroy(p);
    ddo_plan_destroy(q);
    ddo_checkpoint_destroy(ck);
    ddo_config_destroy(cfg);
}

int main(void)
{
    T_RUN(test_random_tables);
    T_RUN(test_checker_catches_a_broken_plan);
    return t_done();
}
