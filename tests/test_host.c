/*
 * test_host.c - host information, the phase helpers of the compatible API
 * (Windows standby purge per named phase: a safe no-op on Linux) and the
 * file read measurement of `ddo doctor`.
 * ctest-labels: unit
 */
#include "t.h"
#include "ddo.h"
#include "ddo_compat.h"
#include "ddo_host.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* What an enabled purge reports: on Linux a no-op ("non_windows"); on Windows purged, or why
 * not (the privilege is missing without administrator rights; Wine grants it and reports
 * success without purging anything). */
static void check_enabled_purge(const ddo_purge_result *r)
{
#if defined(_WIN32)
    T_CHECK(r->purged == (strcmp(r->reason, "purged") == 0));
    T_CHECK(strcmp(r->reason, "purged") == 0 || strcmp(r->reason, "privilege_missing") == 0 ||
            strcmp(r->reason, "failed") == 0);
#else
    T_CHECK(!r->purged);
    T_EQ_STR(r->reason, "non_windows");
#endif
}

/* one_shot_fast enables three phases; on Linux the enabled purge is a reported no-op. */
static void test_purge_preset_and_env(void)
{
    ddo_config *cfg = preset("one_shot_fast");
    T_REQUIRE(cfg != NULL);
    ddo_purge_result r;
    T_EQ_INT(ddo_purge_standby(cfg, " before_transformer ", -1, NULL, &r), 0);
    check_enabled_purge(&r);
    T_EQ_STR(r.phase, "before_transformer");
    T_EQ_INT(ddo_purge_standby(cfg, "after_vae", -1, NULL, &r), 0);
    T_EQ_STR(r.reason, "disabled");
    /* A set variable wins over the preset, even when empty. */
    const char *env_empty[] = { "DDO_PURGE_WINDOWS_STANDBY_BEFORE_RUN=", NULL };
    T_EQ_INT(ddo_purge_standby(cfg, "before_run", -1, env_empty, &r), 0);
    T_EQ_STR(r.reason, "disabled");
    const char *env_on[] = { "OTHER=1", "DDO_PURGE_WINDOWS_STANDBY_AFTER_VAE= Yes ", NULL };
    T_EQ_INT(ddo_purge_standby(cfg, "after_vae", -1, env_on, &r), 0);
    check_enabled_purge(&r);
    /* Explicit true/false wins and ignores the environment. */
    T_EQ_INT(ddo_purge_standby(cfg, "before_run", 0, NULL, &r), 0);
    T_EQ_STR(r.reason, "disabled");
    T_EQ_INT(ddo_purge_standby(NULL, "anything", 1, env_empty, &r), 0);
    check_enabled_purge(&r);
    T_EQ_INT(ddo_purge_standby(cfg, "  ", -1, NULL, &r), DDO_E_INVALID_ARGUMENT);
    ddo_config_destroy(cfg);
}

/* The settings' preset_value / preset_bool: the environment (set, even empty, wins), then the
 * effective preset, then none / the fallback. */
static void test_preset_value(void)
{
    ddo_config *cfg = preset("one_shot_fast");
    T_REQUIRE(cfg != NULL);
    const char *v = "x";
    bool b = false;
    T_EQ_INT(ddo_config_preset_value(cfg, "DDO_PURGE_WINDOWS_STANDBY_BEFORE_RUN", NULL, &v), 0);
    T_EQ_STR(v, "1");
    T_EQ_INT(ddo_config_preset_bool(cfg, "DDO_PURGE_WINDOWS_STANDBY_BEFORE_RUN", NULL, "0", &b), 0);
    T_CHECK(b);
    const char *env[] = { "DDO_PURGE_WINDOWS_STANDBY_BEFORE_RUN=", "DDO_X=off", NULL };
    T_EQ_INT(ddo_config_preset_value(cfg, "DDO_PURGE_WINDOWS_STANDBY_BEFORE_RUN", env, &v), 0);
    T_EQ_STR(v, "");
    T_EQ_INT(ddo_config_preset_bool(cfg, "DDO_PURGE_WINDOWS_STANDBY_BEFORE_RUN", env, "1", &b), 0);
    T_CHECK(!b); /* set empty: not the fallback */
    T_EQ_INT(ddo_config_preset_value(cfg, "DDO_NOT_A_PRESET_VARIABLE", env, &v), 0);
    T_CHECK(v == NULL);
    T_EQ_INT(ddo_config_preset_bool(NULL, "DDO_NOT_A_PRESET_VARIABLE", NULL, " Yes ", &b), 0);
    T_CHECK(b);
    T_EQ_INT(ddo_config_preset_bool(NULL, "DDO_X", env, "1", &b), 0);
    T_CHECK(!b);
    T_EQ_INT(ddo_config_preset_value(cfg, NULL, NULL, &v), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_config_preset_bool(cfg, "DDO_X", NULL, NULL, NULL), DDO_E_INVALID_ARGUMENT);
    ddo_config_destroy(cfg);
}

/* A file of 20 MiB + 123 bytes (more than one 16 MiB read request, not a whole block) in dir;
 * 0 or -1. Not in /tmp: O_DIRECT needs a real file system (tmpfs may refuse it). */
static int write_file(const char *path, size_t bytes)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    for (size_t i = 0; i < bytes; i++)
        fputc((int)(i * 131u % 251u), f);
    return fclose(f) == 0 ? 0 : -1;
}

static void test_measure_file_read(void)
{
    const char *base = getenv("DDO_BUILD_DIR");
    char dir[512], path[600], fifo[600];
    snprintf(dir, sizeof(dir), "%s/ddo-test-host-XXXXXX", base ? base : "/var/tmp");
    T_REQUIRE(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/data.bin", dir);
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    const size_t bytes = ((size_t)20 << 20) + 123;
    T_REQUIRE(write_file(path, bytes) == 0);

    ddo_file_speed s;
    T_EQ_INT(ddo_measure_file_read(path, 0, DDO_MEASURE_PAGE_CACHE, &s), 0);
    T_EQ_U64(s.bytes, bytes);
    T_CHECK(s.page_cache_bytes_per_s > 0);
    T_CHECK(s.direct_bytes_per_s == 0 && s.direct_streams == 0);

    /* The direct pass reads whole blocks with 4 requests in flight, or is refused (0). */
    T_EQ_INT(ddo_measure_file_read(path, (uint64_t)17 << 20, DDO_MEASURE_DIRECT, &s), 0);
    T_EQ_U64(s.bytes, (uint64_t)17 << 20);
    T_CHECK(s.page_cache_bytes_per_s == 0);
    T_CHECK((s.direct_bytes_per_s > 0 && s.direct_streams == 4) ||
            (s.direct_bytes_per_s == 0 && s.direct_streams == 0));

    s.bytes = 7;
    T_EQ_INT(ddo_measure_file_read(dir, 0, DDO_MEASURE_PAGE_CACHE, &s), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "not a regular file");
    T_EQ_U64(s.bytes, 7); /* not written on failure */
    T_EQ_INT(ddo_measure_file_read("/nonexistent/ddo.bin", 0, DDO_MEASURE_PAGE_CACHE, &s),
             DDO_E_NOT_FOUND);
    T_EQ_INT(ddo_measure_file_read(NULL, 0, 0, &s), DDO_E_INVALID_ARGUMENT);
    /* A FIFO without a writer is refused at once, not waited on. */
    if (mkfifo(fifo, 0600) == 0) {
        T_EQ_INT(ddo_measure_file_read(fifo, 0, DDO_MEASURE_PAGE_CACHE, &s),
                 DDO_E_INVALID_ARGUMENT);
        T_CONTAINS(ddo_last_error(), "not a regular file");
        unlink(fifo);
    }
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    T_RUN(test_host_info);
    T_RUN(test_purge_disabled_for_off);
    T_RUN(test_purge_preset_and_env);
    T_RUN(test_preset_value);
    T_RUN(test_measure_file_read);
    return t_done();
}
