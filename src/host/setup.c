/*
 * setup.c - the host layer (ddo_host.h "Host layer", docs/host.md): the one place that turns a
 * validated configuration into a running setup, so that no host repeats the policy. Which
 * device execution_device names and what stands in for the default one; the read backend
 * load_safetensors_backend names; plan inputs from a device's capabilities and this machine;
 * the workload profile applied before planning (its measured rates feed the plan inputs) and
 * recorded after a calibration; the bus and compute figures measured once per process where
 * the device reports none. Written on the public API (and os/ for the machine's RAM, the
 * device layer for the short bus measurement), as a host would write it.
 */
#include "host/setup.h"
#include "base/common.h"
#include "config/config.h"
#include "device/device.h"
#include "os/platform.h"
#include "os/sysinfo.h"
#include "plan/plan.h"

#include "os/thread.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ddo_setup {
    ddo_device *dev; /* owned; NULL with DDO_DEVICE_CHOICE_NONE */
    char spec[64];
    char note[256];
    char *profile_env; /* DDO_PROFILE_DIR of the host's environment, or NULL */
    char *home;        /* HOME of the host's environment, or NULL */
    /* The last ddo_setup_profile_apply with a profile_name. */
    char *profile_dir;
    char *profile_context;
    bool calibrating;
    ddo_profile_measured measured;
    ddo__errbuf err;
};

/* ---- the pieces: device, checkpoint, plan inputs ------------------------------------- */

/* The computing device: the first of a device set (devices), else execution_device, else
 * cuda:0. */
static const char *exec_spec(const ddo_config *cfg)
{
    const ddo__options *o = ddo__config_options(cfg);
    if (o != NULL && o->devices.count > 0)
        return o->devices.items[0];
    const char *spec = NULL;
    if (ddo_config_get(cfg, "execution_device", &spec) != 0 || spec == NULL || spec[0] == '\0')
        spec = "cuda:0";
    return spec;
}

int ddo__device_create_from_config(const ddo_config *cfg, const ddo_device_options *opts,
                                   ddo_device **out, char *note, size_t note_len)
{
    if (out != NULL)
        *out = NULL;
    if (note != NULL && note_len > 0)
        note[0] = '\0';
    if (cfg == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo__device_create_from_config: config and out are required");
    const char *spec = exec_spec(cfg), *src = NULL;
    char buf[64];
    snprintf(buf, sizeof(buf), "%s", spec);
    int rc = ddo_device_create(buf, opts, out);
    if (rc == DDO_E_NO_DEVICE && ddo_config_source(cfg, "execution_device", &src) == 0 &&
        src != NULL && strcmp(src, "default") == 0 &&
        ddo__config_options(cfg)->devices.count == 0) {
        if (note != NULL && note_len > 0)
            snprintf(note, note_len, "no CUDA device (%s); using the cpu device", ddo_last_error());
        rc = ddo_device_create("cpu", opts, out);
    }
    return rc;
}

int ddo_checkpoint_create_from_config(const char *path, const ddo_config *cfg, ddo_checkpoint **out)
{
    if (out != NULL)
        *out = NULL;
    if (cfg == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_checkpoint_create_from_config: config is NULL");
    ddo_read_backend backend = DDO_READ_DEFAULT;
    const char *v = NULL;
    if (ddo_config_get(cfg, "load_safetensors_backend", &v) == 0 && v != NULL) {
        if (strcmp(v, "pread") == 0)
            backend = DDO_READ_PREAD;
        else if (strcmp(v, "mmap") == 0)
            backend = DDO_READ_MMAP;
    }
    return ddo_checkpoint_create(path, backend, out);
}

int ddo_plan_inputs_from_caps(const ddo_device_caps *caps, ddo_plan_inputs *out)
{
    ddo_plan_inputs in;
    memset(&in, 0, sizeof(in));
    if (caps != NULL) {
        in.device_total_bytes = caps->total_bytes;
        in.device_free_bytes = caps->free_bytes;
        in.device_granularity = caps->granularity;
        in.device_is_cpu = caps->is_cpu;
        in.device_vmm_supported = caps->vmm_supported;
        in.bus_bytes_per_s = caps->bus_bytes_per_s;
        in.flops_per_s = caps->flops_per_s;
    }
    in.host_available_bytes = ddo__os_usable_ram_bytes(); /* within the cgroup's room */
    return DDO__ABI_OUT(ddo_plan_inputs, &in, out);
}

int ddo__plan_inputs_get(ddo_device *dev, ddo_plan_inputs *out)
{
    if (dev == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo__plan_inputs_get: device and out are required");
    ddo_device_caps caps;
    int rc = ddo_device_caps_get(dev, &caps);
    if (rc != 0)
        return rc;
    return ddo_plan_inputs_from_caps(&caps, out);
}

/* ---- the setup ----------------------------------------------------------------------- */

/* The value of NAME in a NULL-terminated "NAME=VALUE" block (the last one wins), or NULL. */
static const char *env_value(const char *const *envp, const char *name)
{
    const char *v = NULL;
    size_t n = strlen(name);
    for (const char *const *e = envp; e != NULL && *e != NULL; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            v = *e + n + 1;
    return v;
}

/* A copy of s, or NULL for NULL; false when a copy was needed and failed. */
static bool copy_or_null(const char *s, char **out)
{
    *out = s != NULL ? ddo__strdup(s) : NULL;
    return s == NULL || *out != NULL;
}

/* Opens the device opts asks for into s. */
static int open_device(ddo_setup *s, const ddo_config *cfg, const ddo_setup_options *o)
{
    if (o->device == DDO_DEVICE_CHOICE_NONE)
        return 0;
    if (cfg == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_setup_create: a configuration is required to open a device");
    const char *spec = exec_spec(cfg);
    snprintf(s->spec, sizeof(s->spec), "%s", spec);
    if (o->device == DDO_DEVICE_CHOICE_EXACT)
        return ddo_device_create(s->spec, o->device_options, &s->dev);
    int rc =
        ddo__device_create_from_config(cfg, o->device_options, &s->dev, s->note, sizeof(s->note));
    if (rc == 0 && s->note[0] != '\0')
        snprintf(s->spec, sizeof(s->spec), "cpu");
    return rc;
}

/* The home directory for profiles: HOME, else USERPROFILE (Windows sets that one, and HOME
 * only where a user or a POSIX shell did). */
static const char *home_value(const char *const *envp)
{
    const char *h = env_value(envp, "HOME");
    return h != NULL && h[0] != '\0' ? h : env_value(envp, "USERPROFILE");
}

int ddo_setup_create(const ddo_config *cfg, const ddo_setup_options *opts, ddo_setup **out)
{
    if (out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_setup_create: out is NULL");
    *out = NULL;
    ddo_setup_options o = DDO_SETUP_OPTIONS_INIT;
    if (opts != NULL) {
        int rc = DDO__ABI_IN(ddo_setup_options, opts, &o);
        if (rc != 0)
            return rc;
    }
    if (o.device != DDO_DEVICE_CHOICE_AUTO && o.device != DDO_DEVICE_CHOICE_EXACT &&
        o.device != DDO_DEVICE_CHOICE_NONE)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_setup_create: unknown device choice %d",
                         (int)o.device);
    ddo_setup *s = ddo__calloc(1, sizeof(*s));
    if (s == NULL || !copy_or_null(env_value(o.envp, "DDO_PROFILE_DIR"), &s->profile_env) ||
        !copy_or_null(home_value(o.envp), &s->home)) {
        ddo_setup_destroy(s);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_setup_create: out of memory");
    }
    int rc = open_device(s, cfg, &o);
    if (rc != 0) {
        ddo_setup_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

void ddo_setup_destroy(ddo_setup *setup)
{
    if (setup == NULL)
        return;
    ddo_device_destroy(setup->dev);
    free(setup->profile_env);
    free(setup->home);
    free(setup->profile_dir);
    free(setup->profile_context);
    free(setup);
}

ddo_device *ddo_setup_device(const ddo_setup *setup)
{
    return setup != NULL ? setup->dev : NULL;
}

const char *ddo_setup_device_spec(const ddo_setup *setup)
{
    return setup != NULL ? setup->spec : "";
}

const char *ddo_setup_note(const ddo_setup *setup)
{
    return setup != NULL ? setup->note : "";
}

const char *ddo_setup_error(const ddo_setup *setup)
{
    return setup != NULL ? setup->err.msg : "";
}

const char *ddo_setup_profile_dir(const ddo_setup *setup)
{
    return setup != NULL && setup->profile_dir != NULL ? setup->profile_dir : "";
}

/* ---- measured figures, once per process ------------------------------------------------ */

/* The rates measured so far: [0] the cpu device, [1 + N] cuda:N (guarded by g_rates_lock). */
#define RATE_SLOTS 65
static ddo__mutex g_rates_lock = DDO__MUTEX_INITIALIZER;
static double g_bus[RATE_SLOTS];
static double g_cpu_flops;

/* An fp32 matmul's rate on one core of this machine (64 x 64 x 64, repeated for >= 2 ms),
 * times the online cores: the reference device's compute estimate. */
static double cpu_flops_estimate(void)
{
    enum { N = 64 };
    static float a[N][N], b[N][N], c[N][N];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            a[i][j] = (float)((i + j) % 7) * 0.25f;
            b[i][j] = (float)((i * j) % 5) * 0.5f;
        }
    uint64_t t0 = ddo__now_ns(), reps = 0, dt = 0;
    do {
        for (int i = 0; i < N; i++)
            for (int k = 0; k < N; k++)
                for (int j = 0; j < N; j++)
                    c[i][j] += a[i][k] * b[k][j];
        reps++;
        dt = ddo__now_ns() - t0;
    } while (dt < 2000000 && reps < 100000);
    double per_core =
        c[N - 1][N - 1] >= 0.0f && dt > 0 ? 2.0 * N * N * N * (double)reps * 1e9 / (double)dt : 0.0;
    return per_core * (double)ddo__os_cpu_count();
}

/* The bus (dev's pinned host->device copies) and, on the cpu device, compute figures for the
 * rates in *in the device did not report, measured on the first call per device (cached). */
static void measured_rates(ddo_device *dev, ddo_plan_inputs *in)
{
    ddo_device_caps caps;
    if (dev == NULL || ddo_device_caps_get(dev, &caps) != 0)
        return;
    int slot = caps.is_cpu ? 0 : 1 + caps.ordinal;
    if (slot < 0 || slot >= RATE_SLOTS)
        return;
    ddo__mutex_lock(&g_rates_lock);
    if (!(in->bus_bytes_per_s > 0)) {
        if (!(g_bus[slot] > 0) && ddo__measure_bus_quick(dev, &g_bus[slot]) != 0)
            g_bus[slot] = 0.0; /* not now (no memory for it): measured on a later call */
        in->bus_bytes_per_s = g_bus[slot];
    }
    if (!(in->flops_per_s > 0) && caps.is_cpu) {
        if (!(g_cpu_flops > 0))
            g_cpu_flops = cpu_flops_estimate();
        in->flops_per_s = g_cpu_flops;
    }
    ddo__mutex_unlock(&g_rates_lock);
}

int ddo_setup_plan_inputs(ddo_setup *setup, ddo_plan_inputs *out)
{
    if (setup == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_setup_plan_inputs: setup and out are required");
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    int rc = setup->dev != NULL ? ddo__plan_inputs_get(setup->dev, &in)
                                : ddo_plan_inputs_from_caps(NULL, &in);
    if (rc != 0)
        return ddo__fail_from_last(&setup->err, rc);
    /* What the last calibration measured stands in for what the device cannot tell. */
    if (!(in.bus_bytes_per_s > 0) && setup->measured.bus_bytes_per_s > 0)
        in.bus_bytes_per_s = setup->measured.bus_bytes_per_s;
    if (!(in.flops_per_s > 0) && setup->measured.flops_per_s > 0)
        in.flops_per_s = setup->measured.flops_per_s;
    if (!(in.file_read_bytes_per_s > 0) && setup->measured.file_read_bytes_per_s > 0)
        in.file_read_bytes_per_s = setup->measured.file_read_bytes_per_s;
    /* Else what this process measured (the bus) or estimated (the cpu device's compute). */
    measured_rates(setup->dev, &in);
    return DDO__ABI_OUT(ddo_plan_inputs, &in, out);
}

int ddo_setup_plan(ddo_setup *setup, const ddo_checkpoint *ck, const ddo_config *cfg,
                   const ddo_plan_inputs *inputs, ddo_plan **out)
{
    if (out != NULL)
        *out = NULL;
    if (setup == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_setup_plan: setup is NULL");
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    int rc = inputs != NULL ? DDO__ABI_IN(ddo_plan_inputs, inputs, &in)
                            : ddo_setup_plan_inputs(setup, &in);
    if (rc == 0) {
        /* The setup's device is the machine's: its platform facts (DXGI, WDDM) apply. */
        ddo__platform pf;
        ddo__platform_read(setup->dev == NULL || ddo__device_is_cpu(setup->dev), &pf);
        rc = ddo__plan_build_on(ck, cfg, &in, &pf, out);
    }
    if (rc != 0)
        return ddo__fail_from_last(&setup->err, rc);
    return 0;
}

/* ---- the workload profile ------------------------------------------------------------ */

/* Forgets the profile of an earlier apply. */
static void profile_clear(ddo_setup *s)
{
    ddo_free(s->profile_dir);
    ddo_free(s->profile_context);
    s->profile_dir = NULL;
    s->profile_context = NULL;
    s->calibrating = false;
    memset(&s->measured, 0, sizeof(s->measured));
}

int ddo_setup_profile_apply(ddo_setup *setup, ddo_config *cfg, const ddo_checkpoint *ck,
                            ddo_profile_status *status, double *budget_gb,
                            ddo_profile_measured *measured)
{
    if (setup == NULL || cfg == NULL || ck == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_setup_profile_apply: setup, config and checkpoint are required");
    profile_clear(setup);
    const char *name = NULL, *explicit_dir = NULL;
    bool build = false;
    ddo_config_get(cfg, "profile_name", &name);
    ddo_config_get_bool(cfg, "build_profile", &build);
    ddo_profile_status st = DDO_PROFILE_DISABLED;
    double budget = 0.0;
    ddo_profile_measured m;
    memset(&m, 0, sizeof(m));
    int rc = 0;
    if (name == NULL || name[0] == '\0') {
        if (build)
            rc = ddo__fail(NULL, DDO_E_CONFIG,
                           "build_profile needs profile_name: a calibration is saved under a "
                           "name");
    } else {
        ddo_config_get(cfg, "profile_dir", &explicit_dir);
        rc = ddo_profile_dir(explicit_dir, setup->profile_env, setup->home, &setup->profile_dir);
        if (rc == 0)
            rc = ddo_profile_workload_context(name, ck, &setup->profile_context);
        /* A calibration saves at its end: an unwritable directory is refused before the run. */
        if (rc == 0 && build)
            rc = ddo_profile_check_writable(setup->profile_dir);
        if (rc == 0)
            rc = ddo_profile_apply(cfg, setup->profile_dir, setup->profile_context, &st, &budget,
                                   &m);
    }
    if (rc != 0) {
        ddo__fail_from_last(&setup->err, rc);
        profile_clear(setup);
        return rc;
    }
    setup->calibrating = st == DDO_PROFILE_CALIBRATING;
    setup->measured = m;
    if (status != NULL)
        *status = st;
    if (budget_gb != NULL)
        *budget_gb = budget;
    if (measured != NULL)
        *measured = m;
    return 0;
}

/* Sets key to a real in o (false when out of memory). */
static bool put_real(json_t *o, const char *key, double v)
{
    json_t *j = json_real(v);
    return j != NULL && json_object_set_new(o, key, j) == 0;
}

/* The observation and the recommendation of a calibration (c: its figures and results; uc:
 * the units' measured compute or NULL, set into both). false when out of memory. */
static bool calibration_json(const ddo_profile_calibration *c, json_t *uc, json_t *obs, json_t *rec)
{
    bool ok = json_object_set_new(obs, "status", json_string("success")) == 0 &&
              put_real(obs, "peak_vram_gb", c->peak_gb) &&
              put_real(obs, "total_vram_gb", c->total_gb) &&
              put_real(obs, "headroom_gb", c->headroom_gb) &&
              json_object_set_new(obs, "profile_measurement_kind", json_string("baseline")) == 0 &&
              json_object_set_new(obs, "measurement",
                                  json_string("driver_free_sampled_plus_session_weights")) == 0 &&
              put_real(obs, "achieved_bytes_per_s", c->achieved_bytes_per_s) &&
              put_real(rec, "profile_resident_module_budget_gb", c->budget_gb);
    if (ok && c->achieved_bytes_per_s > 0)
        ok = put_real(rec, "bus_bytes_per_s", c->achieved_bytes_per_s);
    if (ok && c->file_read_bytes_per_s > 0)
        ok = put_real(rec, "file_read_bytes_per_s", c->file_read_bytes_per_s);
    if (ok && c->flops_per_s > 0)
        ok = put_real(rec, "flops_per_s", c->flops_per_s);
    if (ok && c->decode_bytes_per_s > 0)
        ok = put_real(obs, "decode_bytes_per_s", c->decode_bytes_per_s) &&
             put_real(rec, "decode_bytes_per_s", c->decode_bytes_per_s);
    if (ok && uc != NULL && json_object_size(uc) > 0)
        ok = json_object_set(obs, "unit_compute_s", uc) == 0 &&
             json_object_set(rec, "unit_compute_s", uc) == 0;
    return ok;
}

/* Writes c's observation and recommendation into the setup's profile (*path: its file). */
static int record_json(ddo_setup *setup, const ddo_profile_calibration *c, char **path)
{
    json_t *uc = NULL;
    if (c->unit_compute_json != NULL) {
        uc = json_loads(c->unit_compute_json, 0, NULL);
        if (!json_is_object(uc)) {
            json_decref(uc);
            return ddo__fail(&setup->err, DDO_E_INVALID_ARGUMENT,
                             "ddo_setup_profile_record: unit_compute_json is not a JSON object");
        }
    }
    json_t *obs = json_object(), *rec = json_object();
    char *o = NULL, *r = NULL;
    int rc = DDO_E_NO_MEMORY;
    if (obs != NULL && rec != NULL && calibration_json(c, uc, obs, rec) &&
        (o = json_dumps(obs, JSON_COMPACT | JSON_PRESERVE_ORDER)) != NULL &&
        (r = json_dumps(rec, JSON_COMPACT | JSON_PRESERVE_ORDER)) != NULL)
        rc = ddo_profile_record(setup->profile_dir, setup->profile_context, o, r, path);
    else
        ddo__fail(NULL, rc, "ddo_setup_profile_record: out of memory");
    free(o);
    free(r);
    json_decref(obs);
    json_decref(rec);
    json_decref(uc);
    return rc != 0 ? ddo__fail_from_last(&setup->err, rc) : 0;
}

int ddo_setup_profile_record(ddo_setup *setup, const ddo_config *cfg, ddo_profile_calibration *cal,
                             char **path)
{
    if (path != NULL)
        *path = NULL;
    if (setup == NULL || cfg == NULL || cal == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_setup_profile_record: setup, config and calibration are required");
    ddo_profile_calibration c;
    int rc = DDO__ABI_IN(ddo_profile_calibration, cal, &c);
    if (rc != 0)
        return rc;
    if (!setup->calibrating)
        return ddo__fail(&setup->err, DDO_E_STATE,
                         "ddo_setup_profile_record: the profile applied last is not a "
                         "calibration (build_profile)");
    c.headroom_gb = 1.0;
    ddo_config_get_double(cfg, "profile_vram_headroom_gb", &c.headroom_gb);
    ddo_profile_sample smp;
    memset(&smp, 0, sizeof(smp));
    smp.total_bytes = c.total_bytes;
    smp.free_start_bytes =
        c.total_bytes > c.baseline_used_bytes ? c.total_bytes - c.baseline_used_bytes : 0;
    uint64_t end_used = c.baseline_used_bytes + c.used_end_bytes;
    smp.free_end_bytes = c.total_bytes > end_used ? c.total_bytes - end_used : 0;
    smp.held_peak_bytes = c.weights_peak_bytes;
    smp.sampled_used_peak_bytes = c.baseline_used_bytes + c.used_peak_bytes;
    c.peak_gb = ddo_profile_peak_gb(&smp);
    c.total_gb = (double)c.total_bytes / (double)DDO_GIB;
    c.budget_gb = ddo_profile_recommend_resident_budget(c.total_gb, c.peak_gb, c.headroom_gb);
    rc = record_json(setup, &c, path);
    if (rc != 0)
        return rc;
    return DDO__ABI_OUT(ddo_profile_calibration, &c, cal);
}
