/*
 * test_profile.c - capacity profiles: keys, round trips, the 20-observation
 * cap, capacity merging, atomic replacement under a simulated crash, corrupt
 * and foreign files, DDO_PROFILE_DIR resolution, and upstream's worked
 * numbers (docs/profiles.md); FIFOs, size limits,
 * concurrent writers and out-of-range recommendations (issue 14).
 * ctest-labels: unit
 */
#include "ddo.h"
#include "ddo_host.h"
#include "os/thread.h"
#include "t.h"

#include <dirent.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>
#if !defined(_WIN32)
#    include <sys/wait.h>
#endif

extern bool ddo__profile_crash_before_rename;

static const char *CTX = "{\"model\":{\"identifier\":\"example/model\",\"revision\":\"abc\"},"
                         "\"runtime\":{\"dtype\":\"bfloat16\",\"preset\":\"auto\"},"
                         "\"hardware\":{\"vram_gb\":8.0}}";
static const char *CTX_REORDERED =
    "{\"hardware\":{\"vram_gb\":8.0},\"runtime\":{\"preset\":\"auto\",\"dtype\":\"bfloat16\"},"
    "\"model\":{\"revision\":\"abc\",\"identifier\":\"example/model\"}}";

static char *tmpdir_new(void)
{
    char tmpl[] = "/tmp/ddo-profile-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

static size_t dir_entries(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name), sl = strlen(suffix);
        if (e->d_name[0] != '.' && l >= sl && strcmp(e->d_name + l - sl, suffix) == 0)
            n++;
    }
    closedir(d);
    return n;
}

static void rm_rf(const char *dir)
{
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *e;
        char p[4096];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* 8.3: key stable across mapping order. */
static void test_key_stable_across_order(void)
{
    char a[DDO_PROFILE_KEY_BYTES], b[DDO_PROFILE_KEY_BYTES];
    T_EQ_INT(ddo_profile_key(CTX, a), 0);
    T_EQ_INT(ddo_profile_key(CTX_REORDERED, b), 0);
    T_EQ_STR(a, b);
    T_CHECK(strncmp(a, "ddo-capacity-v1-", 16) == 0);
    T_EQ_U64(strlen(a), 40);
    char c[DDO_PROFILE_KEY_BYTES];
    T_EQ_INT(ddo_profile_key("{\"model\":\"other\"}", c), 0);
    T_CHECK(strcmp(a, c) != 0);
    T_EQ_INT(ddo_profile_key("{}", c), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_profile_key("[1]", c), DDO_E_INVALID_ARGUMENT);
}

/* 8.3: record merges capacity limits. */
static void test_record_merges_capacity(void)
{
    char *dir = tmpdir_new();
    T_REQUIRE(dir != NULL);
    char *path = NULL;
    T_EQ_INT(ddo_profile_record(dir, CTX,
                                "{\"status\":\"success\",\"capacity\":{\"metric\":\"tokens\","
                                "\"value\":22000}}",
                                NULL, &path),
             0);
    T_EQ_INT(ddo_profile_record(dir, CTX,
                                "{\"status\":\"success\",\"capacity\":{\"metric\":\"tokens\","
                                "\"value\":20000}}",
                                NULL, NULL),
             0);
    T_EQ_INT(ddo_profile_record(dir, CTX,
                                "{\"status\":\"failure\",\"capacity\":{\"metric\":\"tokens\","
                                "\"value\":24640}}",
                                NULL, NULL),
             0);
    T_REQUIRE(path != NULL);
    T_CHECK(strncmp(path, dir, strlen(dir)) == 0 && path[strlen(dir)] == '/');
    ddo_profile *p = NULL;
    T_EQ_INT(ddo_profile_load(dir, CTX_REORDERED, &p), 0);
    T_REQUIRE(p != NULL);
    double ms = 0, mf = 0;
    bool hm = false, hf = false;
    T_EQ_INT(ddo_profile_capacity(p, "tokens", &ms, &hm, &mf, &hf), 0);
    T_CHECK(hm && hf);
    T_NEAR(ms, 22000.0, 0);
    T_NEAR(mf, 24640.0, 0);
    T_EQ_U64(ddo_profile_observation_count(p), 3);
    T_EQ_INT(ddo_profile_capacity(p, "frames", NULL, NULL, NULL, NULL), DDO_E_NOT_FOUND);
    ddo_profile_destroy(p);
    ddo_free(path);
    rm_rf(dir);
    free(dir);
}

/* 8.3: invalid or wrong context ignored; corrupt files reported, never fatal. */
static void test_invalid_or_foreign_ignored(void)
{
    char *dir = tmpdir_new();
    T_REQUIRE(dir != NULL);
    char *path = NULL;
    T_EQ_INT(ddo_profile_path(dir, CTX, &path), 0);
    T_REQUIRE(path != NULL);
    FILE *f = fopen(path, "w");
    T_REQUIRE(f != NULL);
    fputs("{\"schema_version\": 999}", f);
    fclose(f);
    ddo_profile *p = (ddo_profile *)1;
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), DDO_E_FORMAT);
    T_CHECK(p == NULL);
    T_CONTAINS(ddo_last_error(), "schema_version");

    f = fopen(path, "w");
    T_REQUIRE(f != NULL);
    fputs("{ not json", f);
    fclose(f);
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "corrupt profile");
    /* Recording over a corrupt file starts a fresh profile. */
    T_EQ_INT(ddo_profile_record(dir, CTX, "{\"status\":\"success\"}", NULL, NULL), 0);
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), 0);
    T_EQ_U64(ddo_profile_observation_count(p), 1);
    ddo_profile_destroy(p);

    /* A file with the right key but another context is foreign. */
    char *text = NULL;
    ddo_profile *q = NULL;
    T_EQ_INT(ddo_profile_load_file(path, &q), 0);
    T_EQ_INT(ddo_profile_to_json(q, &text), 0);
    ddo_profile_destroy(q);
    T_REQUIRE(text != NULL);
    char *hw = strstr(text, "8.0");
    T_REQUIRE(hw != NULL);
    hw[0] = '9';
    f = fopen(path, "w");
    T_REQUIRE(f != NULL);
    fputs(text, f);
    fclose(f);
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "stored context differs");
    ddo_free(text);

    T_EQ_INT(ddo_profile_load(dir, "{\"never\":\"recorded\"}", &p), DDO_E_NOT_FOUND);
    ddo_free(path);
    rm_rf(dir);
    free(dir);
}

/* 8.3: recommendation preserved across later observations. */
static void test_recommendation_preserved(void)
{
    char *dir = tmpdir_new();
    T_REQUIRE(dir != NULL);
    T_EQ_INT(ddo_profile_record(dir, CTX, "{\"status\":\"success\"}",
                                "{\"resident_budget_gb\":1.0}", NULL),
             0);
    T_EQ_INT(ddo_profile_record(dir, CTX, "{\"status\":\"success\"}", NULL, NULL), 0);
    ddo_profile *p = NULL;
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), 0);
    double v = 0;
    T_EQ_INT(ddo_profile_recommendation(p, "resident_budget_gb", &v), 0);
    T_NEAR(v, 1.0, 0);
    ddo_profile_destroy(p);
    /* A new recommendation replaces the old one. */
    T_EQ_INT(ddo_profile_record(dir, CTX, "{\"status\":\"success\"}",
                                "{\"resident_budget_gb\":2.5}", NULL),
             0);
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), 0);
    T_EQ_INT(ddo_profile_recommendation(p, "resident_budget_gb", &v), 0);
    T_NEAR(v, 2.5, 0);
    ddo_profile_destroy(p);
    rm_rf(dir);
    free(dir);
}

static void test_observation_cap(void)
{
    char *dir = tmpdir_new();
    T_REQUIRE(dir != NULL);
    for (int i = 0; i < 27; i++) {
        char obs[96];
        snprintf(obs, sizeof(obs), "{\"status\":\"success\",\"run\":%d}", i);
        T_EQ_INT(ddo_profile_record(dir, CTX, obs, NULL, NULL), 0);
    }
    ddo_profile *p = NULL;
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), 0);
    T_EQ_U64(ddo_profile_observation_count(p), DDO_PROFILE_MAX_OBSERVATIONS);
    char *text = NULL;
    T_EQ_INT(ddo_profile_to_json(p, &text), 0);
    /* The oldest seven were dropped: runs 7..26 remain, oldest first. */
    T_CHECK(strstr(text, "\"run\": 6") == NULL);
    T_CONTAINS(text, "\"run\": 7");
    T_CONTAINS(text, "\"run\": 26");
    T_CHECK(strstr(text, "\"run\": 7") < strstr(text, "\"run\": 26"));
    ddo_free(text);
    ddo_profile_destroy(p);
    rm_rf(dir);
    free(dir);
}

static void test_atomic_replacement_under_crash(void)
{
    char *dir = tmpdir_new();
    T_REQUIRE(dir != NULL);
    T_EQ_INT(ddo_profile_record(dir, CTX, "{\"status\":\"success\"}",
                                "{\"profile_resident_module_budget_gb\":1.0}", NULL),
             0);
    ddo__profile_crash_before_rename = true;
    T_EQ_INT(ddo_profile_record(dir, CTX, "{\"status\":\"success\"}",
                                "{\"profile_resident_module_budget_gb\":3.0}", NULL),
             DDO_E_IO);
    ddo__profile_crash_before_rename = false;
    /* The temporary file had no name (O_TMPFILE): the crash left nothing behind, and the
     * profile itself is the old, whole one. Windows has no O_TMPFILE: the named temporary
     * file stays after a crash (fs.h), never taking the profile's name. */
#if defined(_WIN32)
    T_EQ_U64(dir_entries(dir, ".tmp"), 1);
#else
    T_EQ_U64(dir_entries(dir, ".tmp"), 0);
#endif
    T_EQ_U64(dir_entries(dir, ".json"), 1);
    ddo_profile *p = NULL;
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), 0);
    double v = 0;
    T_EQ_INT(ddo_profile_recommendation(p, "profile_resident_module_budget_gb", &v), 0);
    T_NEAR(v, 1.0, 0);
    T_EQ_U64(ddo_profile_observation_count(p), 1);
    ddo_profile_destroy(p);
    /* The next write succeeds over the leftover. */
    T_EQ_INT(ddo_profile_record(dir, CTX, "{\"status\":\"success\"}", NULL, NULL), 0);
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), 0);
    T_EQ_U64(ddo_profile_observation_count(p), 2);
    ddo_profile_destroy(p);
    rm_rf(dir);
    free(dir);
}

static void test_profile_dir_resolution(void)
{
    char *d = NULL;
    T_EQ_INT(ddo_profile_dir(NULL, NULL, "/home/u", &d), 0);
    T_EQ_STR(d, "/home/u/.ddo/profiles");
    ddo_free(d);
    T_EQ_INT(ddo_profile_dir("", "/srv/profiles", "/home/u", &d), 0);
    T_EQ_STR(d, "/srv/profiles");
    ddo_free(d);
    T_EQ_INT(ddo_profile_dir(NULL, "~/p", "/home/u", &d), 0);
    T_EQ_STR(d, "/home/u/p");
    ddo_free(d);
    T_EQ_INT(ddo_profile_dir("/explicit", "/srv/profiles", "/home/u", &d), 0);
    T_EQ_STR(d, "/explicit");
    ddo_free(d);
    T_EQ_INT(ddo_profile_dir(NULL, "", "", &d), DDO_E_INVALID_ARGUMENT);
}

/* 8.2 worked numbers: 8 GiB card, headroom 1, allocator peak 5.5 + 0.5 external -> 1.0 GiB. */
static void test_calibration_numbers(void)
{
    const uint64_t G = (uint64_t)1 << 30;
    ddo_profile_sample s = { 0 };
    s.total_bytes = 8 * G;
    s.free_start_bytes = 7 * G;
    s.free_end_bytes = 7 * G;
    s.held_start_bytes = G / 2;            /* memory_reserved 0.5 GiB */
    s.held_peak_bytes = 11 * G / 2;        /* max_memory_reserved 5.5 GiB */
    double peak = ddo_profile_peak_gb(&s); /* max(1, 1, 0.5 + 5.5) */
    T_NEAR(peak, 6.0, 1e-12);
    T_NEAR(ddo_profile_recommend_resident_budget(8.0, peak, 1.0), 1.0, 1e-12);
    T_NEAR(ddo_profile_recommend_resident_budget(8.0, 9.5, 1.0), 0.0, 0);
    T_NEAR(ddo_profile_recommend_resident_budget(8.0, 4.12345, 1.0), 2.8766, 1e-12);
    s.sampled_used_peak_bytes = 7 * G;
    T_NEAR(ddo_profile_peak_gb(&s), 7.0, 1e-12);
}

static ddo_config *config_with(const char *name, bool build)
{
    ddo_config *cfg = NULL;
    if (ddo_config_create(&cfg) != 0)
        return NULL;
    ddo_config_apply_preset(cfg, "linear", "auto");
    if (name != NULL)
        ddo_config_set(cfg, "profile_name", name);
    ddo_config_set_bool(cfg, "build_profile", build);
    return cfg;
}

/* 8.2: calibration saves; the next setup applies; a manual budget wins; names independent. */
static void test_named_profile_cycle(void)
{
    char *dir = tmpdir_new();
    T_REQUIRE(dir != NULL);
    static const uint64_t shape[2] = { 2, 2 };
    ddo_tensor_desc td = { "linear.weight", DDO_DTYPE_F32, 2, shape, NULL };
    ddo_checkpoint *ck = NULL;
    T_REQUIRE(ddo_checkpoint_create_from_memory(&td, 1, &ck) == 0);
    char *ctx = NULL, *ctx_other = NULL;
    T_EQ_INT(ddo_profile_workload_context("example", ck, &ctx), 0);
    T_EQ_INT(ddo_profile_workload_context("other", ck, &ctx_other), 0);
    T_CONTAINS(ctx, "\"identity_version\":2");
    T_CONTAINS(ctx, "\"name\":\"example\"");

    /* Calibration with a manual budget of 4: the run is forced to zero resident. */
    ddo_config *cfg = config_with("example", true);
    T_REQUIRE(cfg != NULL);
    T_EQ_INT(ddo_config_set_double(cfg, "resident_module_budget_gb", 4.0), 0);
    ddo_profile_status st;
    double budget = -1;
    T_EQ_INT(ddo_profile_apply(cfg, dir, ctx, &st, &budget, NULL), 0);
    T_EQ_INT(st, DDO_PROFILE_CALIBRATING);
    double v = -1;
    T_EQ_INT(ddo_config_get_double(cfg, "resident_module_budget_gb", &v), 0);
    T_NEAR(v, 0.0, 0);
    ddo_config_destroy(cfg);
    /* The same with the budget from the environment: calibration still wins, and says so. */
    cfg = config_with("example", true);
    T_REQUIRE(cfg != NULL);
    const char *env[] = { "DDO_RESIDENT_MODULE_BUDGET_GB=4", NULL };
    T_EQ_INT(ddo_config_apply_env(cfg, env), 0);
    T_EQ_INT(ddo_config_set(cfg, "profile_name", "example"), 0);
    T_EQ_INT(ddo_config_set_bool(cfg, "build_profile", true), 0);
    T_EQ_INT(ddo_profile_apply(cfg, dir, ctx, &st, &budget, NULL), 0);
    T_EQ_INT(ddo_config_get_double(cfg, "resident_module_budget_gb", &v), 0);
    T_NEAR(v, 0.0, 0);
    const char *src = NULL;
    T_EQ_INT(ddo_config_source(cfg, "resident_module_budget_gb", &src), 0);
    T_EQ_STR(src, "profile:example");
    ddo_config_destroy(cfg);
    /* The calibration's measurement: 8 GiB total, peak 6 -> recommendation 1.0. */
    double rec = ddo_profile_recommend_resident_budget(8.0, 6.0, 1.0);
    char recj[96];
    snprintf(recj, sizeof(recj), "{\"profile_resident_module_budget_gb\":%.4f}", rec);
    T_EQ_INT(ddo_profile_record(dir, ctx,
                                "{\"status\":\"success\",\"peak_vram_gb\":6.0,"
                                "\"total_vram_gb\":8.0,\"headroom_gb\":1.0}",
                                recj, NULL),
             0);

    /* Next plain run (one_shot_fast = balanced): profile budget 1.0. */
    cfg = config_with("example", false);
    T_EQ_INT(ddo_profile_apply(cfg, dir, ctx, &st, &budget, NULL), 0);
    T_EQ_INT(st, DDO_PROFILE_APPLIED);
    T_NEAR(budget, 1.0, 0);
    T_EQ_INT(ddo_config_get_double(cfg, "profile_resident_module_budget_gb", &v), 0);
    T_NEAR(v, 1.0, 0);
    ddo_config_destroy(cfg);

    /* Manual budget 2 stays 2. */
    cfg = config_with("example", false);
    T_EQ_INT(ddo_config_set_double(cfg, "resident_module_budget_gb", 2.0), 0);
    T_EQ_INT(ddo_profile_apply(cfg, dir, ctx, &st, &budget, NULL), 0);
    T_EQ_INT(st, DDO_PROFILE_MANUAL);
    T_EQ_INT(ddo_config_get_double(cfg, "resident_module_budget_gb", &v), 0);
    T_NEAR(v, 2.0, 0);
    T_EQ_INT(ddo_config_get_double(cfg, "profile_resident_module_budget_gb", &v), 0);
    T_NEAR(v, 0.0, 0);
    ddo_config_destroy(cfg);

    /* Another name is independent. */
    cfg = config_with("other", false);
    T_EQ_INT(ddo_profile_apply(cfg, dir, ctx_other, &st, &budget, NULL), 0);
    T_EQ_INT(st, DDO_PROFILE_MISSING);
    ddo_config_destroy(cfg);

    /* With the auto policy off the recommendation becomes the resident budget itself. */
    cfg = config_with("example", false);
    T_EQ_INT(ddo_config_set(cfg, "auto_budget_policy", "off"), 0);
    T_EQ_INT(ddo_profile_apply(cfg, dir, ctx, &st, &budget, NULL), 0);
    T_EQ_INT(ddo_config_get_double(cfg, "resident_module_budget_gb", &v), 0);
    T_NEAR(v, 1.0, 0);
    ddo_config_destroy(cfg);

    /* Calibration without a name is refused. */
    cfg = config_with(NULL, true);
    T_EQ_INT(ddo_profile_apply(cfg, dir, ctx, &st, &budget, NULL), DDO_E_CONFIG);
    ddo_config_destroy(cfg);

    ddo_free(ctx);
    ddo_free(ctx_other);
    ddo_checkpoint_destroy(ck);
    rm_rf(dir);
    free(dir);
}

/* 8.3: a session applies a recommendation of 0.75 but never overrides a manual budget. */
static void test_measured_figures_flow(void)
{
    char *dir = tmpdir_new();
    T_REQUIRE(dir != NULL);
    const char *ctx = "{\"identity_version\":2,\"model_class\":\"m\",\"name\":\"w\"}";
    T_EQ_INT(ddo_profile_record(dir, ctx, "{\"status\":\"success\"}",
                                "{\"profile_resident_module_budget_gb\":0.75,"
                                "\"bus_bytes_per_s\":5.5e10,\"flops_per_s\":7.9e14,"
                                "\"file_read_bytes_per_s\":1.3e9}",
                                NULL),
             0);
    ddo_config *cfg = config_with("w", false);
    T_REQUIRE(cfg != NULL);
    ddo_profile_status st;
    double budget = 0;
    ddo_profile_measured m;
    T_EQ_INT(ddo_profile_apply(cfg, dir, ctx, &st, &budget, &m), 0);
    T_EQ_INT(st, DDO_PROFILE_APPLIED);
    T_NEAR(budget, 0.75, 0);
    T_NEAR(m.bus_bytes_per_s, 5.5e10, 0);
    T_NEAR(m.flops_per_s, 7.9e14, 0);
    T_NEAR(m.file_read_bytes_per_s, 1.3e9, 0);
    ddo_config_destroy(cfg);

    cfg = config_with("w", false);
    T_EQ_INT(ddo_config_set_double(cfg, "resident_module_budget_gb", 1.0), 0);
    T_EQ_INT(ddo_profile_apply(cfg, dir, ctx, &st, &budget, &m), 0);
    T_EQ_INT(st, DDO_PROFILE_MANUAL);
    double v = -1;
    T_EQ_INT(ddo_config_get_double(cfg, "profile_resident_module_budget_gb", &v), 0);
    T_NEAR(v, 0.0, 0);
    ddo_config_destroy(cfg);
    rm_rf(dir);
    free(dir);
}

/* Writes text to path (test helper). */
static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    T_REQUIRE(f != NULL);
    fputs(text, f);
    fclose(f);
}

/* Issue 14 classes 2/3: a FIFO is refused without blocking, a file over the size limit unread,
 * and a hand-made file with more observations than a profile keeps is trimmed to the newest. */
static void test_special_and_large_files(void)
{
    char *dir = tmpdir_new();
    T_REQUIRE(dir != NULL);
    char *path = NULL;
    T_EQ_INT(ddo_profile_path(dir, CTX, &path), 0);
    T_REQUIRE(path != NULL);
#if defined(_WIN32)
    free(path);
    free(dir);
    T_SKIP("Windows has no FIFOs (mkfifo): this case's setup is POSIX-only");
#endif
    /* A FIFO at the profile's key: open() would wait for a writer forever. */
    T_REQUIRE(mkfifo(path, 0644) == 0);
    ddo_profile *p = NULL;
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "cannot read profile: not a regular file; ignored");
    T_EQ_INT(ddo_profile_load_file(path, &p), DDO_E_FORMAT);
    T_CHECK(p == NULL);
    /* A record replaces it with a real profile. */
    T_EQ_INT(ddo_profile_record(dir, CTX, "{\"status\":\"success\"}", NULL, NULL), 0);
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), 0);
    ddo_profile_destroy(p);
    p = NULL;
    unlink(path);

    /* Over the limit by one byte: refused before it is parsed. */
    size_t big = DDO_PROFILE_MAX_FILE_BYTES + 1;
    char *text = malloc(big + 1);
    T_REQUIRE(text != NULL);
    memset(text, ' ', big);
    text[0] = '{';
    text[big - 1] = '}';
    text[big] = '\0';
    write_text(path, text);
    free(text);
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "profile larger than 1048576 bytes (the profile file limit)");

    /* 200 observations in a valid file: the newest 20 are kept when it is read. */
    char key[DDO_PROFILE_KEY_BYTES];
    T_EQ_INT(ddo_profile_key(CTX, key), 0);
    size_t cap = 64 * 1024, n = 0;
    text = malloc(cap);
    T_REQUIRE(text != NULL);
    n += (size_t)snprintf(text + n, cap - n,
                          "{\"schema_version\":1,\"profile_key\":\"%s\",\"context\":%s,"
                          "\"observations\":[",
                          key, CTX);
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(text + n, cap - n, "%s{\"status\":\"success\",\"i\":%d}",
                              i ? "," : "", i);
    snprintf(text + n, cap - n, "]}");
    write_text(path, text);
    free(text);
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), 0);
    T_EQ_U64(ddo_profile_observation_count(p), DDO_PROFILE_MAX_OBSERVATIONS);
    char *json = NULL;
    T_EQ_INT(ddo_profile_to_json(p, &json), 0);
    T_CONTAINS(json, "\"i\": 199");
    T_CHECK(strstr(json, "\"i\": 179") == NULL);
    T_CONTAINS(json, "\"i\": 180");
    ddo_free(json);
    ddo_profile_destroy(p);
    ddo_free(path);
    rm_rf(dir);
    free(dir);
}

/* Issue 14 class 8: processes recording into one profile at once keep every observation (the
 * record reads, merges and writes under the profile's lock). */
typedef struct writer_arg {
    const char *dir;
    int w, each, bad;
} writer_arg;

/* One writer's records (a process on POSIX systems, a thread on Windows). */
static int write_records(const char *dir, int w, int each)
{
    int bad = 0;
    for (int k = 0; k < each; k++) {
        char obs[96];
        snprintf(obs, sizeof(obs), "{\"status\":\"success\",\"writer\":%d,\"k\":%d}", w, k);
        bad += ddo_profile_record(dir, CTX, obs, NULL, NULL) != 0;
    }
    return bad;
}

static void *writer_thread(void *arg)
{
    writer_arg *a = arg;
    a->bad = write_records(a->dir, a->w, a->each);
    return NULL;
}

static void test_concurrent_writers(void)
{
    char *dir = tmpdir_new();
    T_REQUIRE(dir != NULL);
    enum { WRITERS = 4, EACH = 5 };
#if defined(_WIN32)
    /* No fork on Windows: threads, each record opening and locking the profile itself
     * (LockFileEx locks belong to handles, so threads exclude each other as processes do). */
    ddo__thread th[WRITERS];
    writer_arg args[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        args[w] = (writer_arg){ dir, w, EACH, 0 };
        T_REQUIRE(ddo__thread_create(&th[w], writer_thread, &args[w]) == 0);
    }
    for (int w = 0; w < WRITERS; w++) {
        ddo__thread_join(th[w]);
        T_CHECK(args[w].bad == 0);
    }
#else
    (void)writer_thread;
    pid_t pids[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        pids[w] = fork();
        T_REQUIRE(pids[w] >= 0);
        if (pids[w] == 0)
            _exit(write_records(dir, w, EACH));
    }
    for (int w = 0; w < WRITERS; w++) {
        int st = 0;
        T_REQUIRE(waitpid(pids[w], &st, 0) == pids[w]);
        T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
#endif
    ddo_profile *p = NULL;
    T_EQ_INT(ddo_profile_load(dir, CTX, &p), 0);
    T_EQ_U64(ddo_profile_observation_count(p), WRITERS * EACH);
    char *json = NULL;
    T_EQ_INT(ddo_profile_to_json(p, &json), 0);
    for (int w = 0; w < WRITERS; w++)
        for (int k = 0; k < EACH; k++) {
            char want[64];
            snprintf(want, sizeof(want),
                     "\"k\": %d,\n      \"status\": \"success\",\n      "
                     "\"writer\": %d",
                     k, w);
            T_CHECK_MSG(strstr(json, want) != NULL, "writer %d observation %d lost", w, k);
        }
    ddo_free(json);
    ddo_profile_destroy(p);
    T_EQ_U64(dir_entries(dir, ".tmp"), 0);
    rm_rf(dir);
    free(dir);
}

/* Issue 14 classes 1/9: a recommendation outside the budget's range is not applied, and the
 * detail names the file, the key and the value (not another option or a stale error). */
static void test_recommendation_range(void)
{
    char *dir = tmpdir_new();
    T_REQUIRE(dir != NULL);
    static const struct {
        const char *rec, *want;
    } cases[] = {
        { "{\"profile_resident_module_budget_gb\":-3}",
          "recommendation profile_resident_module_budget_gb=-3 is outside 0..1000000000 GiB" },
        { "{\"profile_resident_module_budget_gb\":1e300}",
          "recommendation profile_resident_module_budget_gb=1e+300 is outside" },
        { "{\"profile_resident_module_budget_gb\":\"2\"}",
          "profile_resident_module_budget_gb=(not a number) is outside" },
        { "{\"bus_bytes_per_s\":1e9}",
          "the recommendation has no profile_resident_module_budget_gb" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        T_EQ_INT(ddo_profile_record(dir, CTX, "{\"status\":\"success\"}", cases[i].rec, NULL), 0);
        ddo_config *cfg = config_with("example", false);
        T_REQUIRE(cfg != NULL);
        ddo_profile_status st = DDO_PROFILE_APPLIED;
        double budget = -1;
        T_EQ_INT(ddo_profile_apply(cfg, dir, CTX, &st, &budget, NULL), 0);
        T_EQ_INT(st, DDO_PROFILE_MISSING);
        T_NEAR(budget, 0.0, 0);
        T_CONTAINS(ddo_last_error(), cases[i].want);
        T_CONTAINS(ddo_last_error(), dir);
        double v = -1;
        T_EQ_INT(ddo_config_get_double(cfg, "resident_module_budget_gb", &v), 0);
        T_NEAR(v, 0.0, 0);
        const char *src = NULL;
        T_EQ_INT(ddo_config_source(cfg, "resident_module_budget_gb", &src), 0);
        T_CHECK(strncmp(src, "profile:", 8) != 0);
        ddo_config_destroy(cfg);
    }
    /* The writable check names the directory, before anything runs. */
    char file[4200], sub[4300];
    snprintf(file, sizeof(file), "%s/plain", dir);
    write_text(file, "x");
    snprintf(sub, sizeof(sub), "%s/profiles", file);
    T_EQ_INT(ddo_profile_check_writable(sub), DDO_E_IO);
    T_CONTAINS(ddo_last_error(), "cannot create profile directory");
    T_EQ_INT(ddo_profile_check_writable(dir), 0);
    T_EQ_INT(ddo_profile_check_writable(""), DDO_E_INVALID_ARGUMENT);
    unlink(file);
    rm_rf(dir);
    free(dir);
}

int main(void)
{
    T_RUN(test_key_stable_across_order);
    T_RUN(test_record_merges_capacity);
    T_RUN(test_invalid_or_foreign_ignored);
    T_RUN(test_recommendation_preserved);
    T_RUN(test_observation_cap);
    T_RUN(test_atomic_replacement_under_crash);
    T_RUN(test_profile_dir_resolution);
    T_RUN(test_calibration_numbers);
    T_RUN(test_named_profile_cycle);
    T_RUN(test_measured_figures_flow);
    T_RUN(test_special_and_large_files);
    T_RUN(test_concurrent_writers);
    T_RUN(test_recommendation_range);
    return t_done();
}
