/*
 * test_host.c - host information and the phase helpers of the seeds
 * (Windows standby purge per named phase: a safe no-op on Linux).
 * ctest-labels: unit
 */
#include "t.h"
#include "ddo.h"

static void test_host_info(void)
{
    ddo_host_info h;
    T_EQ_INT(ddo_host_info_get(&h), 0);
    T_CHECK(h.ram_total_bytes > 0);
    T_CHECK(h.ram_available_bytes > 0 && h.ram_available_bytes <= h.ram_total_bytes);
    T_CHECK(h.kernel_release[0] != '\0');
    T_EQ_INT(ddo_host_info_get(NULL), DDO_E_INVALID_ARGUMENT);
}

static ddo_config *preset(const char *name)
{
    ddo_config *cfg = NULL;
    if (ddo_config_create(&cfg) != 0)
        return NULL;
    if (ddo_config_apply_preset(cfg, "linear", name) != 0) {
        ddo_config_destroy(cfg);
        return NULL;
    }
    return cfg;
}

/* Upstream tests 26/27: the off preset leaves purging disabled. */
static void test_purge_disabled_for_off(void)
{
    ddo_config *cfg = preset("off");
    T_REQUIRE(cfg != NULL);
    ddo_purge_result r;
    T_EQ_INT(ddo_purge_standby(cfg, "before_run", -1, NULL, &r), 0);
    T_CHECK(!r.purged);
    T_EQ_STR(r.reason, "disabled");
    T_EQ_STR(r.phase, "before_run");
    T_EQ_STR(r.variable, "DDO_PURGE_WINDOWS_STANDBY_BEFORE_RUN");
    ddo_config_destroy(cfg);
    T_EQ_INT(ddo_purge_standby(NULL, "before_run", -1, NULL, &r), 0);
    T_EQ_STR(r.reason, "disabled");
}

/* one_shot_fast enables three phases; on Linux the enabled purge is a reported no-op. */
static void test_purge_preset_and_env(void)
{
    ddo_config *cfg = preset("one_shot_fast");
    T_REQUIRE(cfg != NULL);
    ddo_purge_result r;
    T_EQ_INT(ddo_purge_standby(cfg, " before_transformer ", -1, NULL, &r), 0);
    T_CHECK(!r.purged);
    T_EQ_STR(r.reason, "non_windows");
    T_EQ_STR(r.phase, "before_transformer");
    T_EQ_INT(ddo_purge_standby(cfg, "after_vae", -1, NULL, &r), 0);
    T_EQ_STR(r.reason, "disabled");
    /* A set variable wins over the preset, even when empty. */
    const char *env_empty[] = { "DDO_PURGE_WINDOWS_STANDBY_BEFORE_RUN=", NULL };
    T_EQ_INT(ddo_purge_standby(cfg, "before_run", -1, env_empty, &r), 0);
    T_EQ_STR(r.reason, "disabled");
    const char *env_on[] = { "OTHER=1", "DDO_PURGE_WINDOWS_STANDBY_AFTER_VAE= Yes ", NULL };
    T_EQ_INT(ddo_purge_standby(cfg, "after_vae", -1, env_on, &r), 0);
    T_EQ_STR(r.reason, "non_windows");
    /* Explicit true/false wins and ignores the environment. */
    T_EQ_INT(ddo_purge_standby(cfg, "before_run", 0, NULL, &r), 0);
    T_EQ_STR(r.reason, "disabled");
    T_EQ_INT(ddo_purge_standby(NULL, "anything", 1, env_empty, &r), 0);
    T_EQ_STR(r.reason, "non_windows");
    T_EQ_INT(ddo_purge_standby(cfg, "  ", -1, NULL, &r), DDO_E_INVALID_ARGUMENT);
    ddo_config_destroy(cfg);
}

int main(void)
{
    T_RUN(test_host_info);
    T_RUN(test_purge_disabled_for_off);
    T_RUN(test_purge_preset_and_env);
    return t_done();
}
