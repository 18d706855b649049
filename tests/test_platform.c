/*
 * test_platform.c - what Windows adds to the plan (platform.h), checked on every system with
 * facts of the test's own: the DXGI budget arithmetic and its headroom options, the plan's
 * free device memory from the DXGI local budget, the system headroom off the host's RAM, the
 * WDDM pinning cap with its note; that these options change nothing off Windows; and the
 * DXGI query itself (none on Linux; under Wine, which has no GPU, "no DXGI adapter").
 * ctest-labels: unit
 */
#include "os/platform.h"
#include "plan/plan.h"
#include "plan_fx.h"
#include "t.h"

#if defined(_WIN32)
#    include <windows.h>
#endif

#define GIB ((uint64_t)1 << 30)

static void test_dxgi_arithmetic(void)
{
    ddo__dxgi_memory m = { .local_budget = 8 * GIB,
                           .local_usage = 3 * GIB,
                           .nonlocal_budget = 16 * GIB,
                           .nonlocal_usage = 10 * GIB };
    T_EQ_U64(ddo__dxgi_local_free(&m, 0), 5 * GIB);
    T_EQ_U64(ddo__dxgi_local_free(&m, 1 * GIB), 4 * GIB);
    T_EQ_U64(ddo__dxgi_local_free(&m, 6 * GIB), 0); /* headroom past the room: none, no wrap */
    m.local_usage = 9 * GIB;                        /* usage over budget (WDDM allows it) */
    T_EQ_U64(ddo__dxgi_local_free(&m, 0), 0);
    m.local_usage = 3 * GIB;
    /* Local pressure: need more than the budget leaves after the headroom. */
    T_CHECK(!ddo__dxgi_pressure(&m, 4 * GIB, 1 * GIB, 0));
    T_CHECK(ddo__dxgi_pressure(&m, 4 * GIB + 1, 1 * GIB, 0));
    T_CHECK(!ddo__dxgi_pressure(&m, 5 * GIB, 0, 0));
    /* Shared pressure: the non-local room (6 GiB) below its headroom. */
    T_CHECK(!ddo__dxgi_pressure(&m, 0, 0, 6 * GIB));
    T_CHECK(ddo__dxgi_pressure(&m, 0, 0, 6 * GIB + 1));
    /* A budget of 0 is unknown: never pressure. */
    ddo__dxgi_memory z = { 0 };
    T_CHECK(!ddo__dxgi_pressure(&z, 100 * GIB, 1 * GIB, 1 * GIB));
    /* The WDDM pin cap: half of RAM in whole 64 MiB segments; unknown RAM: no cap. */
    T_EQ_U64(ddo__wddm_pin_cap(32 * GIB), 16 * GIB);
    T_EQ_U64(ddo__wddm_pin_cap(16 * GIB + 100 * ((uint64_t)1 << 20)), 8 * GIB);
    T_EQ_U64(ddo__wddm_pin_cap(0), 0);
}

static ddo_plan *plan_on(ddo_config *cfg, const ddo_plan_inputs *in, const ddo__platform *pf)
{
    fx_table tb = { 0 };
    fx_ltx(&tb);
    ddo_checkpoint *ck = fx_checkpoint(&tb);
    ddo_plan *p = NULL;
    int rc = ck != NULL ? ddo__plan_build_on(ck, cfg, in, pf, &p) : -1;
    if (rc != 0)
        fprintf(stderr, "  ddo__plan_build_on: %d (%s)\n", rc, ddo_last_error());
    T_EQ_INT(rc, 0);
    ddo_checkpoint_destroy(ck);
    fx_free(&tb);
    return p;
}

static ddo_plan_inputs card(void)
{
    ddo_plan_inputs in = { .size = sizeof(ddo_plan_inputs),
                           .device_total_bytes = 12 * GIB,
                           .device_free_bytes = 11 * GIB,
                           .host_available_bytes = 40 * GIB };
    return in;
}

static ddo_plan_budgets budgets(const ddo_plan *p)
{
    ddo_plan_budgets bg;
    memset(&bg, 0, sizeof(bg));
    T_EQ_INT(ddo_plan_budgets_get(p, &bg), 0);
    return bg;
}

/* The full-pin worked example's registration (18.5 GiB) under a 16 GiB and a 64 GiB machine. */
static void test_wddm_pin_cap(void)
{
    ddo_config *cfg = fx_one_shot_fast();
    T_REQUIRE(cfg != NULL);
    T_EQ_INT(ddo_config_set(cfg, "available_system_ram_gb", "43.53"), 0);
    T_EQ_INT(ddo_config_set(cfg, "vmm_resident_weight_budget_gb", "8"), 0);
    ddo_plan_inputs in = { .size = sizeof(ddo_plan_inputs), .device_total_bytes = 8 * GIB };
    ddo_plan *linux_plan = plan_on(cfg, &in, NULL);
    T_REQUIRE(linux_plan != NULL);
    T_EQ_STR(fx_decision(linux_plan, "registration"), "all_retained");
    T_EQ_U64(budgets(linux_plan).registered_limit, 0);
    T_EQ_STR(fx_decision(linux_plan, "registration_note"), "(absent)");

    ddo__platform pf = { .windows = true,
                         .ram_total_bytes = 16 * GIB,
                         .dxgi_why = "no DXGI adapter" };
    ddo_plan *p = plan_on(cfg, &in, &pf);
    T_REQUIRE(p != NULL);
    ddo_plan_budgets bg = budgets(p);
    T_EQ_STR(fx_decision(p, "registration"), "partial");
    T_EQ_U64(bg.registered_limit, 8 * GIB);
    T_CHECK(bg.registered_peak <= 8 * GIB && bg.registered_peak > 0);
    T_CHECK(strstr(fx_decision(p, "registration_note"),
                   "capped at 8.00 GiB, half of the 16.00 GiB") != NULL);
    T_EQ_STR(fx_decision(p, "wddm_pin_cap_gb"), "8.0");
    T_EQ_STR(fx_decision(p, "dxgi_budget"), "none: no DXGI adapter");
    size_t registered = 0;
    for (size_t u = 0; u < ddo_plan_unit_count(p); u++) {
        ddo_unit_info ui;
        T_EQ_INT(ddo_plan_unit(p, u, &ui), 0);
        registered += ui.registered;
    }
    T_CHECK(registered > 0 && registered < 37); /* of the 37 streamed blocks */
    ddo_plan_destroy(p);

    /* 64 GiB of RAM: the cap (32 GiB) holds everything; it is still the plan's limit. */
    pf.ram_total_bytes = 64 * GIB;
    p = plan_on(cfg, &in, &pf);
    T_REQUIRE(p != NULL);
    T_EQ_STR(fx_decision(p, "registration"), "all_retained");
    T_EQ_U64(budgets(p).registered_limit, 32 * GIB);
    T_EQ_U64(budgets(p).registered_peak, budgets(linux_plan).registered_peak);
    ddo_plan_destroy(p);

    /* The cpu device has no WDDM pool. */
    in.device_is_cpu = true;
    pf.ram_total_bytes = 16 * GIB;
    p = plan_on(cfg, &in, &pf);
    T_REQUIRE(p != NULL);
    T_EQ_U64(budgets(p).registered_limit, 0);
    T_EQ_STR(fx_decision(p, "registration_note"), "(absent)");
    T_EQ_STR(fx_decision(p, "dxgi_budget"), "(absent)");
    ddo_plan_destroy(p);
    ddo_plan_destroy(linux_plan);
    ddo_config_destroy(cfg);
}

/* The plan sized from the device (no budget): DXGI's local budget less the headroom is the
 * free memory it sizes from when it is lower than the device's. */
static void test_dxgi_free_memory(void)
{
    ddo_config *cfg = NULL;
    T_REQUIRE(ddo_config_create(&cfg) == 0);
    T_EQ_INT(ddo_config_set(cfg, "auto_budget_policy", "balanced"), 0); /* sized from the device */
    T_EQ_INT(ddo_config_set(cfg, "vmm_dxgi_local_headroom_gb", "1"), 0);
    T_EQ_INT(ddo_config_set(cfg, "vmm_dxgi_system_headroom_gb", "2"), 0);
    ddo_plan_inputs in = card();
    ddo_plan *base = plan_on(cfg, &in, NULL);
    T_REQUIRE(base != NULL);
    ddo__platform pf = { .windows = true, .ram_total_bytes = 64 * GIB };
    pf.dxgi = (ddo__dxgi_memory){ .local_budget = 10 * GIB,
                                  .local_usage = 4 * GIB,
                                  .adapter = "Test Adapter" };
    ddo_plan *p = plan_on(cfg, &in, &pf);
    T_REQUIRE(p != NULL);
    T_EQ_STR(fx_decision(p, "dxgi_local_free_gb"), "5.0"); /* 10 - 4 - 1 */
    T_CHECK(strncmp(fx_decision(p, "dxgi_budget"), "Test Adapter: local budget 10.00 GiB", 36) ==
            0);
    T_EQ_STR(fx_decision(p, "dxgi_system_headroom_gb"), "2.0");
    T_EQ_U64(p->inputs.device_free_bytes, 5 * GIB);
    T_EQ_U64(p->inputs.host_available_bytes, 38 * GIB);
    T_EQ_U64(base->inputs.device_free_bytes, 11 * GIB);
    T_EQ_U64(base->inputs.host_available_bytes, 40 * GIB);
    T_CHECK(strstr(fx_decision(p, "device_weights_limit_source"), "(free 5.0") != NULL);
    T_CHECK(budgets(p).device_weights_limit < budgets(base).device_weights_limit);
    T_CHECK(budgets(p).device_weights_limit <= 5 * GIB);
    ddo_plan_destroy(p);

    /* A DXGI room above the device's free memory changes nothing. */
    pf.dxgi.local_usage = 0;
    pf.dxgi.local_budget = 20 * GIB;
    p = plan_on(cfg, &in, &pf);
    T_REQUIRE(p != NULL);
    T_EQ_U64(p->inputs.device_free_bytes, 11 * GIB);
    T_EQ_U64(budgets(p).device_weights_limit, budgets(base).device_weights_limit);
    ddo_plan_destroy(p);
    ddo_plan_destroy(base);
    ddo_config_destroy(cfg);
}

/* Off Windows the platform facts this machine gives leave every plan as ddo_plan_build makes
 * it, whatever the vmm_dxgi_*_headroom_gb options say. */
static void test_no_effect_off_windows(void)
{
#if defined(_WIN32)
    printf("  (Windows build: the Linux no-effect check does not apply)\n");
#else
    ddo__platform pf;
    ddo__platform_read(false, &pf);
    T_CHECK(!pf.windows);
    T_EQ_STR(pf.dxgi_why, "non_windows");
    ddo_config *cfg = NULL, *plain = NULL;
    T_REQUIRE(ddo_config_create(&cfg) == 0 && ddo_config_create(&plain) == 0);
    T_EQ_INT(ddo_config_set(cfg, "auto_budget_policy", "balanced"), 0);
    T_EQ_INT(ddo_config_set(plain, "auto_budget_policy", "balanced"), 0);
    T_EQ_INT(ddo_config_set(cfg, "vmm_dxgi_local_headroom_gb", "3"), 0);
    T_EQ_INT(ddo_config_set(cfg, "vmm_dxgi_shared_headroom_gb", "3"), 0);
    T_EQ_INT(ddo_config_set(cfg, "vmm_dxgi_system_headroom_gb", "3"), 0);
    ddo_plan_inputs in = card();
    ddo_plan *a = plan_on(cfg, &in, &pf), *b = plan_on(plain, &in, NULL);
    T_REQUIRE(a != NULL && b != NULL);
    ddo_plan_budgets x = budgets(a), y = budgets(b);
    T_CHECK(memcmp(&x, &y, sizeof(x)) == 0);
    T_EQ_U64(a->inputs.device_free_bytes, b->inputs.device_free_bytes);
    T_EQ_U64(a->inputs.host_available_bytes, b->inputs.host_available_bytes);
    T_EQ_U64(a->decisions.count, b->decisions.count);
    T_EQ_STR(fx_decision(a, "dxgi_budget"), "(absent)");
    ddo_plan_destroy(a);
    ddo_plan_destroy(b);
    ddo_config_destroy(cfg);
    ddo_config_destroy(plain);
#endif
}

#if defined(_WIN32)
static bool under_wine(void)
{
    HMODULE nt = GetModuleHandleW(L"ntdll.dll");
    return nt != NULL && GetProcAddress(nt, "wine_get_version") != NULL;
}
#endif

static void test_dxgi_query(void)
{
    ddo__dxgi_memory m;
    memset(&m, 0xab, sizeof(m));
    const char *why = ddo__os_dxgi_query(&m);
#if defined(_WIN32)
    if (under_wine()) {
        /* Wine runs headless here, with no GPU: no hardware adapter, reported cleanly. */
        T_REQUIRE(why != NULL);
        T_EQ_STR(why, "no DXGI adapter");
    } else if (why == NULL) {
        printf("  DXGI: %s, local %llu of %llu bytes\n", m.adapter,
               (unsigned long long)m.local_usage, (unsigned long long)m.local_budget);
        T_CHECK(m.local_budget > 0);
    } else {
        printf("  DXGI: %s\n", why);
    }
    /* Asked again: the same answer (the adapter search runs once). */
    const char *again = ddo__os_dxgi_query(&m);
    T_CHECK((why == NULL) == (again == NULL));
#else
    T_REQUIRE(why != NULL);
    T_EQ_STR(why, "non_windows");
#endif
    if (why != NULL)
        T_EQ_U64(m.local_budget + m.local_usage + m.nonlocal_budget + m.nonlocal_usage, 0);
}

int main(void)
{
    T_RUN(test_dxgi_arithmetic);
    T_RUN(test_wddm_pin_cap);
    T_RUN(test_dxgi_free_memory);
    T_RUN(test_no_effect_off_windows);
    T_RUN(test_dxgi_query);
    return t_done();
}
