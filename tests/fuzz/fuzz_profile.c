/*
 * fuzz_profile.c - libFuzzer target for the capacity profile reader (docs/profiles.md): the
 * input is the text of a profile file, written where the profile of a fixed workload context
 * lives. A profile comes from a cache directory anyone may edit, so every reader must take any
 * bytes: loading (by path and by context) never crashes, hangs or leaks, a refusal leaves *out
 * NULL and says why in one line; applying it to a configuration always succeeds with a budget
 * inside the option's range and finite measured rates (a corrupt profile counts as missing);
 * recording an observation over it always succeeds and leaves a profile that loads, with at
 * most DDO_PROFILE_MAX_OBSERVATIONS observations, the new one among them. The corpus
 * (tests/fuzz/corpus/profile/) is replayed by every build.
 */
#include "ddo.h"
#include "ddo_host.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char CONTEXT[] = "{\"identity_version\":2,\"name\":\"fuzz\"}";
static char g_dir[64];
static char *g_path;

static void setup(void)
{
    if (g_path != NULL)
        return;
    snprintf(g_dir, sizeof(g_dir), "/tmp/ddo_fuzz_profile_XXXXXX");
    if (mkdtemp(g_dir) == NULL || ddo_profile_path(g_dir, CONTEXT, &g_path) != 0)
        abort();
}

static void put(const uint8_t *data, size_t size)
{
    FILE *f = fopen(g_path, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
}

/* A refusal says why in one line and leaves *out NULL. */
static void check_refusal(const ddo_profile *p)
{
    const char *m = ddo_last_error();
    if (p != NULL || m[0] == '\0' || strchr(m, '\n') != NULL)
        abort();
}

/* Every accessor of a loaded profile, on keys it may or may not hold. */
static void read_all(const ddo_profile *p)
{
    char *json = NULL, *ctx = NULL;
    if (ddo_profile_to_json(p, &json) != 0 || ddo_profile_context(p, &ctx) != 0)
        abort();
    ddo_free(json);
    ddo_free(ctx);
    if (ddo_profile_observation_count(p) > DDO_PROFILE_MAX_OBSERVATIONS)
        abort();
    static const char *const keys[] = { "profile_resident_module_budget_gb", "bus_bytes_per_s",
                                        "flops_per_s", "file_read_bytes_per_s", "" };
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
        double v = 0.0, hi = 0.0, lo = 0.0;
        bool has_hi = false, has_lo = false;
        if (ddo_profile_recommendation(p, keys[k], &v) == 0 && !isfinite(v))
            abort(); /* "absent or not a finite number" is NOT_FOUND */
        if (ddo_profile_capacity(p, keys[k], &hi, &has_hi, &lo, &has_lo) == 0 && !has_hi && !has_lo)
            abort();
    }
}

static void apply(void)
{
    ddo_config *cfg = NULL;
    if (ddo_config_create(&cfg) != 0 || ddo_config_set(cfg, "profile_name", "fuzz") != 0)
        abort();
    ddo_profile_status st = DDO_PROFILE_DISABLED;
    double budget = -1.0;
    ddo_profile_measured m;
    if (ddo_profile_apply(cfg, g_dir, CONTEXT, &st, &budget, &m) != 0)
        abort(); /* a corrupt profile is missing, never an error */
    if (!(budget >= 0.0 && budget <= 1e9) ||
        (st != DDO_PROFILE_APPLIED && st != DDO_PROFILE_MISSING))
        abort();
    double rates[] = { m.bus_bytes_per_s, m.flops_per_s, m.file_read_bytes_per_s };
    for (size_t i = 0; i < 3; i++)
        if (!(rates[i] >= 0.0 && rates[i] < 1e18))
            abort();
    ddo_config_destroy(cfg);
}

static void record(void)
{
    static const char obs[] =
        "{\"capacity\":{\"metric\":\"fuzz_gb\",\"value\":1.5},\"status\":\"success\"}";
    if (ddo_profile_record(g_dir, CONTEXT, obs, NULL, NULL) != 0)
        abort(); /* a corrupt previous file starts a fresh profile */
    ddo_profile *p = NULL;
    double hi = 0.0, lo = 0.0;
    bool has_hi = false, has_lo = false;
    if (ddo_profile_load(g_dir, CONTEXT, &p) != 0)
        abort();
    size_t n = ddo_profile_observation_count(p);
    if (n == 0 || n > DDO_PROFILE_MAX_OBSERVATIONS ||
        ddo_profile_capacity(p, "fuzz_gb", &hi, &has_hi, &lo, &has_lo) != 0 || !has_hi ||
        !(hi >= 1.5))
        abort();
    read_all(p);
    ddo_profile_destroy(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    put(data, size);
    ddo_profile *p = NULL;
    if (ddo_profile_load_file(g_path, &p) == 0) {
        read_all(p);
        ddo_profile_destroy(p);
    } else {
        check_refusal(p);
    }
    p = NULL;
    if (ddo_profile_load(g_dir, CONTEXT, &p) == 0) {
        read_all(p);
        ddo_profile_destroy(p);
    } else {
        check_refusal(p);
    }
    apply();
    record();
    return 0;
}
