/*
 * cmd_doctor.c - `ddo doctor [PATH] [--json]`: what this machine can do
 * (driver, GPUs, measured bus and registration figures, host RAM, cgroup
 * limit, WSL, file read speed) and what `auto` would plan, with a one-line
 * recommendation. Without a GPU it says so and still reports the host side.
 */
#include "tool.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

#define MAX_GPUS 16

static void usage(FILE *out)
{
    fprintf(out, "usage: ddo doctor [PATH] [--json] [--measure-mb N]\n"
                 "  PATH          a checkpoint (file, index or directory): its read speed and the\n"
                 "                plan `auto` would make for it\n"
                 "  --json        machine-readable output\n"
                 "  --measure-mb  bytes moved per bandwidth measurement (default 1024)\n");
}

static double gib(uint64_t b)
{
    return (double)b / (double)(1u << 30);
}

static double gbps(double bytes_per_s)
{
    return bytes_per_s / 1e9;
}

/* The largest file of a checkpoint (the one whose read speed is measured). */
static const char *largest_file(const ddo_checkpoint *ck)
{
    const char *best = NULL;
    uint64_t size = 0;
    for (size_t i = 0; i < ddo_checkpoint_file_count(ck); i++) {
        const ddo_file_info *f = ddo_checkpoint_file(ck, i);
        if (best == NULL || f->size > size) {
            best = f->path;
            size = f->size;
        }
    }
    return best;
}

struct gpu {
    ddo_device_caps caps;
    ddo_device_bandwidth bw;
    int measured;
    char measure_error[256];
};

int ddo_cmd_doctor(int argc, char **argv)
{
    const char *path = NULL;
    int as_json = 0;
    uint64_t measure_bytes = (uint64_t)1 << 30;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            as_json = 1;
        } else if (strcmp(argv[i], "--measure-mb") == 0) {
            double mb = 0;
            if (tool_flag_real("doctor", argv[i], i + 1 < argc ? argv[i + 1] : NULL, 16.0,
                               1048576.0, &mb) != 0)
                return DDO_EXIT_USAGE;
            i++;
            measure_bytes = (uint64_t)(mb * 1048576.0);
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return DDO_EXIT_OK;
        } else if (argv[i][0] == '-' || path != NULL) {
            fprintf(stderr, "ddo doctor: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return DDO_EXIT_USAGE;
        } else {
            path = argv[i];
        }
    }

    /* GPUs: cuda:0, cuda:1, ... until one does not open. */
    static struct gpu gpus[MAX_GPUS];
    int ngpu = 0;
    char driver_error[512] = "";
    for (int i = 0; i < MAX_GPUS; i++) {
        char spec[16];
        snprintf(spec, sizeof(spec), "cuda:%d", i);
        ddo_device *dev = NULL;
        ddo_device_options dopt;
        memset(&dopt, 0, sizeof(dopt));
        dopt.cuda_library_env = getenv("DDO_VMM_LIBRARY_PATH");
        int rc = ddo_device_create(spec, &dopt, &dev);
        if (rc != 0) {
            if (i == 0)
                snprintf(driver_error, sizeof(driver_error), "%s", ddo_last_error());
            break;
        }
        struct gpu *g = &gpus[ngpu++];
        memset(g, 0, sizeof(*g));
        ddo_device_caps_get(dev, &g->caps);
        if (!as_json)
            fprintf(stderr, "measuring %s (%s)...\n", spec, g->caps.name);
        if (ddo_device_measure(dev, measure_bytes, &g->bw) == 0)
            g->measured = 1;
        else
            snprintf(g->measure_error, sizeof(g->measure_error), "%s", ddo_last_error());
        ddo_device_destroy(dev);
    }

    ddo_host_info host;
    ddo_host_info_get(&host);

    /* The file side and what auto would plan. */
    ddo_checkpoint *ck = NULL;
    ddo_file_speed speed;
    memset(&speed, 0, sizeof(speed));
    char ck_error[1024] = "", plan_error[1024] = "", speed_error[512] = "";
    const char *measured_file = NULL;
    if (path != NULL) {
        if (ddo_checkpoint_create(path, DDO_READ_DEFAULT, &ck) != 0) {
            snprintf(ck_error, sizeof(ck_error), "%s", ddo_last_error());
        } else {
            measured_file = largest_file(ck);
            if (measured_file != NULL &&
                ddo_measure_file_read(measured_file, (uint64_t)4 << 30,
                                      DDO_MEASURE_PAGE_CACHE | DDO_MEASURE_DIRECT, &speed) != 0)
                snprintf(speed_error, sizeof(speed_error), "%s", ddo_last_error());
        }
    }
    ddo_config *cfg = NULL;
    if (ddo_config_create(&cfg) != 0) {
        fprintf(stderr, "ddo doctor: %s\n", ddo_last_error());
        ddo_checkpoint_destroy(ck);
        return DDO_EXIT_FAILURE;
    }
    ddo_config_set_running_on_wsl(cfg, host.running_on_wsl);
    /* Like the other commands, the tool's default preset is auto (DDO_PRESET overrides). */
    int cfg_rc = ddo_config_apply_preset(cfg, NULL, "auto");
    if (cfg_rc == 0)
        cfg_rc = ddo_config_apply_env(cfg, (const char *const *)environ);
    if (cfg_rc == 0 && ngpu == 0)
        cfg_rc = ddo_config_set(cfg, "execution_device", "cpu");
    if (cfg_rc == 0)
        cfg_rc = ddo_config_validate(cfg);
    ddo_settings st;
    memset(&st, 0, sizeof(st));
    if (cfg_rc == 0)
        cfg_rc = ddo_config_settings(cfg, &st);
    char cfg_error[1024] = "";
    if (cfg_rc != 0)
        snprintf(cfg_error, sizeof(cfg_error), "%s", ddo_last_error());
    ddo_plan *plan = NULL;
    if (ck != NULL && cfg_rc == 0) {
        ddo_plan_inputs in;
        memset(&in, 0, sizeof(in));
        if (ngpu > 0) {
            in.device_total_bytes = gpus[0].caps.total_bytes;
            in.device_free_bytes = gpus[0].caps.free_bytes;
            in.device_granularity = gpus[0].caps.granularity;
            in.device_vmm_supported = gpus[0].caps.vmm_supported;
            in.bus_bytes_per_s = gpus[0].bw.pinned_bytes_per_s;
        } else {
            in.device_is_cpu = true;
        }
        in.host_available_bytes = host.ram_available_bytes;
        if (ddo_plan_build(ck, cfg, &in, &plan) != 0)
            snprintf(plan_error, sizeof(plan_error), "%s", ddo_last_error());
    }

    /* The one-line recommendation. */
    char rec[512];
    uint64_t model = ck ? ddo_checkpoint_total_bytes(ck) : 0;
    if (ngpu == 0) {
        snprintf(rec, sizeof(rec),
                 "No GPU answered: ddo runs on the cpu reference device only "
                 "(--ddo-execution-device cpu); install the NVIDIA driver for cuda.");
    } else if (host.running_on_wsl) {
        snprintf(rec, sizeof(rec),
                 "WSL detected: registered (pinned) memory is off by default; start with "
                 "--ddo-preset wsl_compat, or set DDO_DISABLE_PIN_ON_WSL=0 to experiment.");
    } else if (model > 0 && model + ((uint64_t)2 << 30) < gpus[0].caps.free_bytes) {
        snprintf(rec, sizeof(rec),
                 "The model (%.2f GiB) fits in device memory with room to spare: no offload "
                 "needed (--ddo-preset off).",
                 gib(model));
    } else if (model > 0 && host.ram_available_bytes > model + ((uint64_t)8 << 30)) {
        snprintf(rec, sizeof(rec),
                 "Stream at the bus limit: --ddo-backend vmm --ddo-preset auto "
                 "--ddo-vmm-source-cache-gb %.0f (the whole model retained and registered).",
                 gib(model) + 1.0);
    } else if (model > 0) {
        double keep = host.ram_available_bytes > ((uint64_t)8 << 30)
                          ? gib(host.ram_available_bytes) - 8.0
                          : 0.0;
        snprintf(rec, sizeof(rec),
                 "Host RAM cannot hold the model (%.2f GiB): retain %.0f GiB and stream the rest "
                 "from the file (--ddo-backend vmm --ddo-vmm-source-cache-gb %.0f); expect the "
                 "disk's speed for that part.",
                 gib(model), keep, keep);
    } else {
        snprintf(rec, sizeof(rec),
                 "GPU ready; give a checkpoint PATH to see what ddo would plan for it.");
    }

    if (as_json) {
        json_t *j = json_object();
        json_t *drv = json_object();
        json_object_set_new(drv, "available", json_boolean(ngpu > 0));
        if (ngpu > 0)
            json_object_set_new(drv, "version", json_integer(gpus[0].caps.driver_version));
        else
            json_object_set_new(drv, "error", json_string(driver_error));
        json_object_set_new(j, "driver", drv);
        json_t *ga = json_array();
        for (int i = 0; i < ngpu; i++) {
            struct gpu *g = &gpus[i];
            json_t *o = json_object();
            json_object_set_new(o, "index", json_integer(i));
            json_object_set_new(o, "name", json_string(g->caps.name));
            json_object_set_new(o, "total_bytes", json_integer((json_int_t)g->caps.total_bytes));
            json_object_set_new(o, "free_bytes", json_integer((json_int_t)g->caps.free_bytes));
            json_object_set_new(o, "vmm_supported", json_boolean(g->caps.vmm_supported));
            json_object_set_new(o, "granularity_bytes",
                                json_integer((json_int_t)g->caps.granularity));
            if (g->measured) {
                json_object_set_new(o, "pinned_h2d_bytes_per_s",
                                    json_real(g->bw.pinned_bytes_per_s));
                json_object_set_new(o, "pinned_h2d_2mib_bytes_per_s",
                                    json_real(g->bw.pinned_2mib_bytes_per_s));
                json_object_set_new(o, "pageable_h2d_bytes_per_s",
                                    json_real(g->bw.pageable_bytes_per_s));
                json_object_set_new(o, "register_s_per_gib", json_real(g->bw.register_s_per_gib));
                json_object_set_new(o, "pinned_alloc_s_per_gib",
                                    json_real(g->bw.pinned_alloc_s_per_gib));
                json_object_set_new(o, "measure_bytes", json_integer((json_int_t)g->bw.bytes));
            } else {
                json_object_set_new(o, "measure_error", json_string(g->measure_error));
            }
            json_array_append_new(ga, o);
        }
        json_object_set_new(j, "gpus", ga);
        json_t *h = json_object();
        json_object_set_new(h, "ram_total_bytes", json_integer((json_int_t)host.ram_total_bytes));
        json_object_set_new(h, "ram_available_bytes",
                            json_integer((json_int_t)host.ram_available_bytes));
        json_object_set_new(h, "cgroup_limit_bytes",
                            json_integer((json_int_t)host.cgroup_limit_bytes));
        json_object_set_new(h, "running_on_wsl", json_boolean(host.running_on_wsl));
        json_object_set_new(h, "kernel_release", json_string(host.kernel_release));
        json_object_set_new(j, "host", h);
        if (path != NULL) {
            json_t *f = json_object();
            json_object_set_new(f, "path", json_string(path));
            if (ck_error[0] != '\0') {
                json_object_set_new(f, "error", json_string(ck_error));
            } else {
                json_object_set_new(f, "measured_file", json_string(measured_file));
                json_object_set_new(f, "model_bytes", json_integer((json_int_t)model));
                json_object_set_new(f, "read_bytes", json_integer((json_int_t)speed.bytes));
                json_object_set_new(f, "page_cache_bytes_per_s",
                                    json_real(speed.page_cache_bytes_per_s));
                json_object_set_new(f, "direct_bytes_per_s", json_real(speed.direct_bytes_per_s));
                if (speed_error[0] != '\0')
                    json_object_set_new(f, "read_error", json_string(speed_error));
            }
            json_object_set_new(j, "file", f);
        }
        json_t *a = json_object();
        if (cfg_error[0] != '\0') {
            json_object_set_new(a, "error", json_string(cfg_error));
        } else {
            json_object_set_new(a, "requested_preset",
                                json_string(st.requested_preset ? st.requested_preset : ""));
            json_object_set_new(a, "effective_preset",
                                json_string(st.effective_preset ? st.effective_preset : ""));
            json_object_set_new(a, "route", json_string(st.route ? st.route : ""));
            json_object_set_new(a, "effective_pin_cpu_memory",
                                json_boolean(st.effective_pin_cpu_memory));
        }
        if (plan != NULL) {
            char *pj = NULL;
            if (ddo_plan_to_json(plan, &pj) == 0) {
                json_t *pv = json_loads(pj, 0, NULL);
                if (pv != NULL)
                    json_object_set_new(a, "plan", pv);
                ddo_free(pj);
            }
        } else if (plan_error[0] != '\0') {
            json_object_set_new(a, "plan_error", json_string(plan_error));
        }
        json_object_set_new(j, "auto", a);
        json_object_set_new(j, "recommendation", json_string(rec));
        char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (text != NULL)
            printf("%s\n", text);
        free(text);
        json_decref(j);
    } else {
        if (ngpu == 0) {
            printf("driver    no GPU: %s\n", driver_error[0] ? driver_error : "none found");
        } else {
            printf("driver    CUDA driver %d.%d\n", gpus[0].caps.driver_version / 1000,
                   (gpus[0].caps.driver_version % 1000) / 10);
            for (int i = 0; i < ngpu; i++) {
                struct gpu *g = &gpus[i];
                printf("gpu %d     %s: %.2f GiB total, %.2f GiB free, VMM %s, granularity %zu "
                       "MiB\n",
                       i, g->caps.name, gib(g->caps.total_bytes), gib(g->caps.free_bytes),
                       g->caps.vmm_supported ? "yes" : "no", g->caps.granularity >> 20);
                if (g->measured)
                    printf("          host->device: pinned %.1f GB/s (16 MiB pieces), %.1f GB/s "
                           "(2 MiB), pageable %.1f GB/s; register %.3f s/GiB, pinned alloc "
                           "%.3f s/GiB\n",
                           gbps(g->bw.pinned_bytes_per_s), gbps(g->bw.pinned_2mib_bytes_per_s),
                           gbps(g->bw.pageable_bytes_per_s), g->bw.register_s_per_gib,
                           g->bw.pinned_alloc_s_per_gib);
                else
                    printf("          measurement failed: %s\n", g->measure_error);
            }
        }
        printf("host      RAM %.2f GiB total, %.2f GiB available; cgroup limit ",
               gib(host.ram_total_bytes), gib(host.ram_available_bytes));
        if (host.cgroup_limit_bytes)
            printf("%.2f GiB", gib(host.cgroup_limit_bytes));
        else
            printf("none");
        printf("; WSL %s; kernel %s\n", host.running_on_wsl ? "yes" : "no", host.kernel_release);
        if (path != NULL) {
            if (ck_error[0] != '\0')
                printf("file      %s\n", ck_error);
            else if (speed_error[0] != '\0')
                printf("file      %s\n", speed_error);
            else if (speed.direct_bytes_per_s > 0)
                printf("file      %s: %.2f GiB model; read %.2f GiB: page cache %.2f GB/s, "
                       "O_DIRECT %.2f GB/s (%u reads in flight)\n",
                       measured_file, gib(model), gib(speed.bytes),
                       gbps(speed.page_cache_bytes_per_s), gbps(speed.direct_bytes_per_s),
                       speed.direct_streams);
            else
                printf("file      %s: %.2f GiB model; read %.2f GiB: page cache %.2f GB/s, "
                       "O_DIRECT not supported on this filesystem\n",
                       measured_file, gib(model), gib(speed.bytes),
                       gbps(speed.page_cache_bytes_per_s));
        }
        if (cfg_error[0] != '\0') {
            printf("auto      %s\n", cfg_error);
        } else {
            printf("auto      backend %s, preset %s -> route %s; pinning %s\n", st.backend,
                   st.requested_preset && st.requested_preset[0] ? st.requested_preset : "auto",
                   st.route, st.effective_pin_cpu_memory ? "on" : "off");
        }
        if (plan != NULL) {
            ddo_plan_budgets b;
            if (ddo_plan_budgets_get(plan, &b) == 0)
                printf("          plan: %zu units, resident %.2f GiB, %zu slots x %.2f GiB, "
                       "retained %.2f GiB (registered %.2f GiB), staging %.2f GiB\n",
                       ddo_plan_unit_count(plan), gib(b.resident_bytes), b.slot_count,
                       gib(b.slot_bytes), gib(b.retained_peak), gib(b.registered_peak),
                       gib(b.staging_peak));
            for (size_t i = 0; i < ddo_plan_decision_count(plan); i++) {
                const char *k, *v;
                if (ddo_plan_decision(plan, i, &k, &v) == 0)
                    printf("          %s = %s\n", k, v);
            }
        } else if (plan_error[0] != '\0') {
            printf("          plan refused: %s\n", plan_error);
        }
        printf("\nrecommendation: %s\n", rec);
    }
    ddo_plan_destroy(plan);
    ddo_config_destroy(cfg);
    ddo_checkpoint_destroy(ck);
    return DDO_EXIT_OK;
}
