/*
 * test_setup.c - the host layer (ddo.h "Host layer", docs/host.md): the device a configuration
 * names and the cpu device standing in for the default cuda:0 only; the read backend of
 * load_safetensors_backend; plan inputs from the device, this machine and the last
 * calibration; planning through the setup; a workload profile applied, calibrated, recorded
 * and applied again. No GPU is needed: the cuda device is pointed at a missing driver.
 *
 * ctest-labels: unit
 */
#include "checkpoint/checkpoint_internal.h"
#include "ddo.h"
#include "t.h"

#include <dirent.h>
#include <stddef.h>
#include <unistd.h>

/* Options whose cuda device never opens (a missing driver), on any machine. */
static ddo_cuda_options g_cuda = { .size = sizeof(ddo_cuda_options),
                                   .library_path = "/nonexistent/libcuda.so.1" };
static ddo_cpu_options g_cpu = DDO_CPU_OPTIONS_INIT;
static ddo_device_options g_dopt = { .size = sizeof(ddo_device_options),
                                     .cpu = &g_cpu,
                                     .cuda = &g_cuda };

static ddo_setup *setup_with(const ddo_config *cfg, ddo_device_choice choice, int want_rc)
{
    ddo_setup_options so = DDO_SETUP_OPTIONS_INIT;
    so.device = choice;
    so.device_options = &g_dopt;
    ddo_setup *s = (ddo_setup *)&so;
    int rc = ddo_setup_create(cfg, &so, &s);
    T_EQ_INT(rc, want_rc);
    if (rc != 0)
        T_CHECK(s == NULL);
    return rc == 0 ? s : NULL;
}

/* Why cuda:0 does not answer here: no driver, or a build without the CUDA headers. */
#if DDO_HAVE_CUDA_H
#    define NO_CUDA "no CUDA driver"
#else
#    define NO_CUDA "ddo was built without CUDA support"
#endif

static void test_default_device_stands_down_to_cpu(void)
{
    ddo_config *cfg = NULL;
    T_REQUIRE(ddo_config_create(&cfg) == 0);
    /* The default cuda:0 does not answer: the cpu device stands in, and the setup says why. */
    ddo_setup *s = setup_with(cfg, DDO_DEVICE_CHOICE_AUTO, 0);
    T_REQUIRE(s != NULL);
    T_EQ_STR(ddo_setup_device_spec(s), "cpu");
    T_CONTAINS(ddo_setup_note(s), "no CUDA device (");
    T_CONTAINS(ddo_setup_note(s), "); using the cpu device");
    ddo_device_caps caps;
    T_REQUIRE(ddo_device_caps_get(ddo_setup_device(s), &caps) == 0);
    T_CHECK(caps.is_cpu);
    ddo_setup_destroy(s);
    /* EXACT: the default is not replaced either. */
    setup_with(cfg, DDO_DEVICE_CHOICE_EXACT, DDO_E_NO_DEVICE);
    T_CONTAINS(ddo_last_error(), NO_CUDA);
    /* A cuda device asked for explicitly is never replaced. */
    T_REQUIRE(ddo_config_set(cfg, "execution_device", "cuda:0") == 0);
    setup_with(cfg, DDO_DEVICE_CHOICE_AUTO, DDO_E_NO_DEVICE);
    T_CONTAINS(ddo_last_error(), NO_CUDA);
    /* The cpu device asked for: no note. */
    T_REQUIRE(ddo_config_set(cfg, "execution_device", "cpu") == 0);
    s = setup_with(cfg, DDO_DEVICE_CHOICE_AUTO, 0);
    T_REQUIRE(s != NULL);
    T_EQ_STR(ddo_setup_device_spec(s), "cpu");
    T_EQ_STR(ddo_setup_note(s), "");
    ddo_setup_destroy(s);
    ddo_setup_destroy(NULL);
    ddo_config_destroy(cfg);
}

static void test_bad_arguments(void)
{
    ddo_setup_options so = DDO_SETUP_OPTIONS_INIT;
    ddo_setup *s = NULL;
    T_EQ_INT(ddo_setup_create(NULL, &so, NULL), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_setup_create(NULL, &so, &s), DDO_E_INVALID_ARGUMENT); /* a device needs cfg */
    T_CONTAINS(ddo_last_error(), "a configuration is required");
    so.device = (ddo_device_choice)7;
    T_EQ_INT(ddo_setup_create(NULL, &so, &s), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "unknown device choice 7");
    T_CHECK(s == NULL);
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    T_EQ_INT(ddo_setup_plan_inputs(NULL, &in), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_plan_inputs_from_caps(NULL, NULL), DDO_E_INVALID_ARGUMENT);
    T_EQ_STR(ddo_setup_device_spec(NULL), "");
    T_EQ_STR(ddo_setup_note(NULL), "");
    T_EQ_STR(ddo_setup_error(NULL), "");
    T_EQ_STR(ddo_setup_profile_dir(NULL), "");
    T_CHECK(ddo_setup_device(NULL) == NULL);
}

/* Without a device: this machine's facts only; the caller adds the device's figures. */
static void test_no_device(void)
{
    ddo_setup *s = setup_with(NULL, DDO_DEVICE_CHOICE_NONE, 0);
    T_REQUIRE(s != NULL);
    T_CHECK(ddo_setup_device(s) == NULL);
    T_EQ_STR(ddo_setup_device_spec(s), "");
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    T_EQ_INT(ddo_setup_plan_inputs(s, &in), 0);
    T_EQ_U64(in.device_total_bytes, 0);
    T_CHECK(!in.device_is_cpu && in.bus_bytes_per_s == 0 && in.flops_per_s == 0);
    T_CHECK(in.host_available_bytes > 0);
    ddo_setup_destroy(s);
}

/* The plan inputs follow the cpu device's options; planning with NULL inputs takes them. */
static void test_plan_inputs_and_plan(void)
{
    ddo_config *cfg = NULL;
    T_REQUIRE(ddo_config_create(&cfg) == 0);
    T_REQUIRE(ddo_config_set(cfg, "execution_device", "cpu") == 0);
    /* Everything streamed, so that the cost model has units to cost. */
    T_REQUIRE(ddo_config_set(cfg, "always_resident_modules_pattern", "^$") == 0);
    T_REQUIRE(ddo_config_set(cfg, "small_tensor_threshold_bytes", "0") == 0);
    T_REQUIRE(ddo_config_set(cfg, "resident_module_budget_gb", "0") == 0);
    g_cpu.memory_bytes = 512u << 20;
    g_cpu.bytes_per_s = 4e9;
    g_cpu.flops_per_s = 2e12;
    ddo_setup *s = setup_with(cfg, DDO_DEVICE_CHOICE_EXACT, 0);
    g_cpu = (ddo_cpu_options)DDO_CPU_OPTIONS_INIT;
    T_REQUIRE(s != NULL);
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    T_EQ_INT(ddo_setup_plan_inputs(s, &in), 0);
    T_EQ_U64(in.device_total_bytes, 512u << 20);
    T_CHECK(in.device_is_cpu && in.device_vmm_supported);
    T_CHECK(in.bus_bytes_per_s == 4e9 && in.flops_per_s == 2e12 && in.tokens == 0);
    ddo_device_caps caps;
    T_REQUIRE(ddo_device_caps_get(ddo_setup_device(s), &caps) == 0);
    ddo_plan_inputs fc = DDO_PLAN_INPUTS_INIT;
    T_EQ_INT(ddo_plan_inputs_from_caps(&caps, &fc), 0);
    T_EQ_U64(fc.device_granularity, caps.granularity);
    T_CHECK(fc.bus_bytes_per_s == 4e9);

    char path[512];
    ddo_checkpoint *ck = NULL;
    T_REQUIRE(ddo_checkpoint_create_from_config(t_data(path, sizeof path, "safetensors/tiny_flux"),
                                                cfg, &ck) == 0);
    ddo_plan *plan = NULL;
    T_REQUIRE(ddo_setup_plan(s, ck, cfg, NULL, &plan) == 0);
    ddo_plan_budgets b;
    T_REQUIRE(ddo_plan_budgets_get(plan, &b) == 0);
    T_CHECK(b.predicted_step_s > 0); /* the device's rates reached the cost model */
    ddo_plan_destroy(plan);
    /* Explicit inputs are taken as they are: without rates, no cost model. */
    in.bus_bytes_per_s = 0;
    T_REQUIRE(ddo_setup_plan(s, ck, cfg, &in, &plan) == 0);
    T_REQUIRE(ddo_plan_budgets_get(plan, &b) == 0);
    T_CHECK(b.predicted_step_s == 0);
    ddo_plan_destroy(plan);
    /* A failed plan: the detail is on the setup too. */
    plan = (ddo_plan *)&in;
    T_EQ_INT(ddo_setup_plan(s, NULL, cfg, NULL, &plan), DDO_E_INVALID_ARGUMENT);
    T_CHECK(plan == NULL);
    T_CONTAINS(ddo_setup_error(s), "ddo_plan_build: checkpoint, config and out are required");
    T_EQ_STR(ddo_setup_error(s), ddo_last_error());
    in.size = 3;
    T_EQ_INT(ddo_setup_plan(s, ck, cfg, &in, &plan), DDO_E_INVALID_ARGUMENT);
    T_CHECK(plan == NULL);
    ddo_checkpoint_destroy(ck);
    ddo_setup_destroy(s);
    ddo_config_destroy(cfg);
}

static void test_checkpoint_backend_from_config(void)
{
    char path[512];
    t_data(path, sizeof path, "safetensors/tiny_flux");
    ddo_config *cfg = NULL;
    T_REQUIRE(ddo_config_create(&cfg) == 0);
    static const struct {
        const char *value;
        ddo_read_backend want;
    } cases[] = { { "", DDO_READ_PREAD }, { "pread", DDO_READ_PREAD }, { "mmap", DDO_READ_MMAP } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        T_REQUIRE(ddo_config_set(cfg, "load_safetensors_backend", cases[i].value) == 0);
        ddo_checkpoint *ck = NULL;
        T_REQUIRE(ddo_checkpoint_create_from_config(path, cfg, &ck) == 0);
        T_CHECK_MSG(ck->backend == cases[i].want, "load_safetensors_backend=\"%s\"",
                    cases[i].value);
        T_CHECK(ddo_checkpoint_tensor_count(ck) > 0);
        ddo_checkpoint_destroy(ck);
    }
    ddo_checkpoint *ck = (ddo_checkpoint *)cfg;
    T_EQ_INT(ddo_checkpoint_create_from_config(path, NULL, &ck), DDO_E_INVALID_ARGUMENT);
    T_CHECK(ck == NULL);
    T_EQ_INT(ddo_checkpoint_create_from_config("/nonexistent/model.safetensors", cfg, &ck),
             DDO_E_NOT_FOUND);
    ddo_config_destroy(cfg);
}

static char *tmpdir_new(void)
{
    char tmpl[] = "/tmp/ddo-setup-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        char p[1024];
        if (e->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d != NULL)
        closedir(d);
    rmdir(dir);
}

static ddo_config *profile_config(bool build)
{
    ddo_config *cfg = NULL;
    if (ddo_config_create(&cfg) != 0)
        return NULL;
    if (ddo_config_set(cfg, "execution_device", "cpu") != 0 ||
        ddo_config_set(cfg, "profile_name", "tiny") != 0 ||
        ddo_config_set_bool(cfg, "build_profile", build) != 0) {
        ddo_config_destroy(cfg);
        return NULL;
    }
    return cfg;
}

/* A calibration through the setup, then the next run: the directory comes from the host's
 * DDO_PROFILE_DIR, the recommendation is applied, and the measured bus becomes a plan input. */
static void test_profile_cycle(void)
{
    char *dir = tmpdir_new();
    T_REQUIRE(dir != NULL);
    char env[600], path[512];
    snprintf(env, sizeof env, "DDO_PROFILE_DIR=%s", dir);
    const char *envp[] = { "HOME=/nonexistent", env, NULL };
    ddo_checkpoint *ck = NULL;
    T_REQUIRE(ddo_checkpoint_create(t_data(path, sizeof path, "safetensors/tiny_flux"),
                                    DDO_READ_DEFAULT, &ck) == 0);
    ddo_setup_options so = DDO_SETUP_OPTIONS_INIT;
    so.envp = envp;
    ddo_config *cfg = profile_config(true);
    T_REQUIRE(cfg != NULL);
    ddo_setup *s = NULL;
    T_REQUIRE(ddo_setup_create(cfg, &so, &s) == 0);
    ddo_profile_calibration cal = DDO_PROFILE_CALIBRATION_INIT;
    /* Nothing applied yet: no calibration to record. */
    T_EQ_INT(ddo_setup_profile_record(s, cfg, &cal, NULL), DDO_E_STATE);
    ddo_profile_status st = DDO_PROFILE_APPLIED;
    double budget = -1;
    T_EQ_INT(ddo_setup_profile_apply(s, cfg, ck, &st, &budget, NULL), 0);
    T_EQ_INT(st, DDO_PROFILE_CALIBRATING);
    T_EQ_STR(ddo_setup_profile_dir(s), dir);
    const uint64_t G = (uint64_t)1 << 30;
    cal.total_bytes = 8 * G;
    cal.baseline_used_bytes = G;
    cal.used_peak_bytes = 2 * G;
    cal.weights_peak_bytes = G / 2;
    cal.achieved_bytes_per_s = 12e9;
    char *saved = NULL;
    T_EQ_INT(ddo_setup_profile_record(s, cfg, &cal, &saved), 0);
    T_REQUIRE(saved != NULL);
    T_CHECK(strncmp(saved, dir, strlen(dir)) == 0);
    T_NEAR(cal.peak_gb, 3.0, 1e-12); /* baseline 1 + sampled 2 */
    T_NEAR(cal.total_gb, 8.0, 1e-12);
    T_NEAR(cal.headroom_gb, 1.0, 1e-12);
    T_NEAR(cal.budget_gb, 4.0, 1e-12); /* 8 - 3 - 1 */
    T_CHECK(access(saved, R_OK) == 0);
    ddo_free(saved);
    ddo_config_destroy(cfg);

    /* The next run applies the recommendation; the device reports no bus (unthrottled cpu),
     * so the calibration's measured one is the plan input. */
    cfg = profile_config(false);
    T_REQUIRE(cfg != NULL);
    ddo_profile_measured m;
    T_EQ_INT(ddo_setup_profile_apply(s, cfg, ck, &st, &budget, &m), 0);
    T_EQ_INT(st, DDO_PROFILE_APPLIED);
    T_NEAR(budget, 4.0, 1e-12);
    T_CHECK(m.bus_bytes_per_s == 12e9);
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    T_EQ_INT(ddo_setup_plan_inputs(s, &in), 0);
    T_CHECK(in.bus_bytes_per_s == 12e9);
    T_EQ_INT(ddo_setup_profile_record(s, cfg, &cal, NULL), DDO_E_STATE);
    ddo_config_destroy(cfg);

    /* build_profile without a name is refused. */
    T_REQUIRE(ddo_config_create(&cfg) == 0);
    T_REQUIRE(ddo_config_set_bool(cfg, "build_profile", true) == 0);
    T_EQ_INT(ddo_setup_profile_apply(s, cfg, ck, &st, NULL, NULL), DDO_E_CONFIG);
    T_CONTAINS(ddo_last_error(), "needs profile_name");
    /* Neither: disabled, and nothing the profile measured is kept: the rates are the ones
     * this process measured on the (unthrottled) cpu device, once (the same figures again). */
    T_REQUIRE(ddo_config_set_bool(cfg, "build_profile", false) == 0);
    T_EQ_INT(ddo_setup_profile_apply(s, cfg, ck, &st, NULL, NULL), 0);
    T_EQ_INT(st, DDO_PROFILE_DISABLED);
    T_EQ_INT(ddo_setup_plan_inputs(s, &in), 0);
    T_CHECK(in.bus_bytes_per_s > 0 && in.bus_bytes_per_s != 12e9 && in.flops_per_s > 0);
    ddo_plan_inputs again = DDO_PLAN_INPUTS_INIT;
    T_EQ_INT(ddo_setup_plan_inputs(s, &again), 0);
    T_CHECK(again.bus_bytes_per_s == in.bus_bytes_per_s && again.flops_per_s == in.flops_per_s);
    T_EQ_STR(ddo_setup_profile_dir(s), "");
    ddo_config_destroy(cfg);
    ddo_setup_destroy(s);
    ddo_checkpoint_destroy(ck);
    rm_dir(dir);
    free(dir);
}

/* The home for the default directory: HOME, else USERPROFILE (Windows sets that one). */
static void test_profile_dir_home(void)
{
    char path[512];
    ddo_checkpoint *ck = NULL;
    T_REQUIRE(ddo_checkpoint_create(t_data(path, sizeof path, "safetensors/tiny_flux"),
                                    DDO_READ_DEFAULT, &ck) == 0);
    static const struct {
        const char *envp[3];
        const char *dir; /* NULL: refused, no home */
    } cases[] = {
        { { "USERPROFILE=/u/prof", NULL }, "/u/prof/.ddo/profiles" },
        { { "HOME=/h/me", "USERPROFILE=/u/prof" }, "/h/me/.ddo/profiles" },
        { { "HOME=", "USERPROFILE=/u/prof" }, "/u/prof/.ddo/profiles" },
        { { NULL }, NULL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ddo_setup_options so = DDO_SETUP_OPTIONS_INIT;
        so.envp = cases[i].envp;
        ddo_config *cfg = profile_config(false);
        T_REQUIRE(cfg != NULL);
        ddo_setup *s = NULL;
        T_REQUIRE(ddo_setup_create(cfg, &so, &s) == 0);
        ddo_profile_status st = DDO_PROFILE_APPLIED;
        int rc = ddo_setup_profile_apply(s, cfg, ck, &st, NULL, NULL);
        if (cases[i].dir == NULL) {
            T_EQ_INT(rc, DDO_E_INVALID_ARGUMENT);
            T_CONTAINS(ddo_last_error(), "home directory");
        } else {
            T_EQ_INT(rc, 0); /* the directory does not exist: no profile yet */
            T_EQ_STR(ddo_setup_profile_dir(s), cases[i].dir);
        }
        ddo_setup_destroy(s);
        ddo_config_destroy(cfg);
    }
    ddo_checkpoint_destroy(ck);
}

int main(void)
{
    T_RUN(test_default_device_stands_down_to_cpu);
    T_RUN(test_bad_arguments);
    T_RUN(test_no_device);
    T_RUN(test_plan_inputs_and_plan);
    T_RUN(test_checkpoint_backend_from_config);
    T_RUN(test_profile_cycle);
    T_RUN(test_profile_dir_home);
    return t_done();
}
