/*
 * cmd_doctor.c - `ddo doctor [PATH] [--json]`: what this machine can do
 * (driver, GPUs, measured bus and registration figures, host RAM, cgroup
 * limit, WSL, file read speed) and what `auto` would plan, with a one-line
 * recommendation. Without a GPU it says so and still reports the host side.
 */
#include "compat.h"
#include "tool.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GPUS 16

static void usage(FILE *out)
{
    fprintf(out, "usage: ddo doctor [PATH] [--json] [--measure-mb N] [--devices A,B[,...]]\n"
                 "  PATH          a checkpoint (file, index or directory): its read speed and the\n"
                 "                plan `auto` would make for it\n"
                 "  --json        machine-readable output\n"
                 "  --measure-mb  bytes moved per bandwidth measurement (default 1024)\n"
                 "  --devices     a device set whose links to measure (host->device per device,\n"
                 "                device->device per ordered pair; cpu:0,cpu:1 emulates one);\n"
                 "                default: every GPU found, when there are two or more\n");
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

/* Everything doctor gathers, then prints. */
typedef struct doctor {
    const char *path;
    struct gpu gpus[MAX_GPUS];
    int ngpu;
    char driver_error[512];
    ddo_host_info host;
    ddo_checkpoint *ck;
    ddo_file_speed speed;
    const char *measured_file;
    char ck_error[1024], plan_error[1024], speed_error[512], cfg_error[1024];
    ddo_config *cfg;
    ddo_settings st;
    ddo_plan *plan;
    uint64_t model;
    char rec[512];
    /* The device set's links (--devices, or every GPU when there are several). */
    char set[MAX_GPUS][32];
    int nset;
    double h2d[MAX_GPUS];            /* pinned host->device per device; 0 = not measured */
    double link[MAX_GPUS][MAX_GPUS]; /* [to][from] device->device; 0 = not measured */
    double split;                    /* split mode's intake per device; 0 = not measured */
    char split_error[512];
    char link_error[512];
} doctor;

/* GPUs: cuda:0, cuda:1, ... until one does not open; each measured with measure_bytes. */
static void probe_gpus(doctor *D, uint64_t measure_bytes, bool quiet)
{
    for (int i = 0; i < MAX_GPUS; i++) {
        char spec[16];
        snprintf(spec, sizeof(spec), "cuda:%d", i);
        ddo_device *dev = NULL;
        if (ddo_device_create(spec, NULL, &dev) != 0) {
            if (i == 0)
                snprintf(D->driver_error, sizeof(D->driver_error), "%s", ddo_last_error());
            break;
        }
        struct gpu *g = &D->gpus[D->ngpu++];
        memset(g, 0, sizeof(*g));
        ddo_device_caps_get(dev, &g->caps);
        if (!quiet)
            fprintf(stderr, "measuring %s (%s)...\n", spec, g->caps.name);
        if (ddo_device_measure(dev, measure_bytes, &g->bw) == 0)
            g->measured = 1;
        else
            snprintf(g->measure_error, sizeof(g->measure_error), "%s", ddo_last_error());
        ddo_device_destroy(dev);
    }
}

/* Splits "A,B,..." into D->set; -1 (with a message) for an empty name, a name that is not a
 * device spec, or too many. */
static int parse_set(doctor *D, const char *list)
{
    const char *p = list;
    D->nset = 0;
    while (*p != '\0') {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof(D->set[0]) || D->nset == MAX_GPUS) {
            fprintf(stderr, "ddo doctor: --devices: expected a list like cuda:0,cuda:1\n");
            return -1;
        }
        memcpy(D->set[D->nset], p, n);
        D->set[D->nset][n] = '\0';
        if (!ddo__device_spec_parse(D->set[D->nset], NULL)) {
            char q[64];
            ddo__quote(D->set[D->nset], true, q, sizeof(q));
            fprintf(stderr, "ddo doctor: --devices: \"%s\": " DDO__DEVICE_SPEC_UNKNOWN "\n", q);
            return -1;
        }
        D->nset++;
        p += n + (p[n] == ',');
    }
    return D->nset >= 2 ? 0 : (fprintf(stderr, "ddo doctor: --devices: two or more\n"), -1);
}

/* The set's links: host->device per device (a GPU's from probe_gpus), device->device per
 * ordered pair. */
static void probe_links(doctor *D, uint64_t measure_bytes, bool quiet)
{
    if (D->nset == 0 && D->ngpu >= 2)
        for (int i = 0; i < D->ngpu; i++)
            snprintf(D->set[D->nset++], sizeof(D->set[0]), "cuda:%d", i);
    ddo_device *dev[MAX_GPUS] = { 0 };
    for (int i = 0; i < D->nset; i++) {
        if (ddo_device_create(D->set[i], NULL, &dev[i]) != 0) {
            snprintf(D->link_error, sizeof(D->link_error), "%s", ddo_last_error());
            goto out;
        }
        ddo_device_caps c;
        ddo_device_bandwidth bw;
        if (ddo_device_caps_get(dev[i], &c) == 0 && !c.is_cpu && c.ordinal < D->ngpu &&
            D->gpus[c.ordinal].measured)
            D->h2d[i] = D->gpus[c.ordinal].bw.pinned_bytes_per_s;
        else if (ddo_device_measure(dev[i], measure_bytes, &bw) == 0)
            D->h2d[i] = bw.pinned_bytes_per_s;
    }
    for (int to = 0; to < D->nset; to++)
        for (int from = 0; from < D->nset; from++) {
            if (to == from)
                continue;
            if (!quiet)
                fprintf(stderr, "measuring %s -> %s...\n", D->set[from], D->set[to]);
            if (ddo_device_measure_peer(dev[to], dev[from], measure_bytes, &D->link[to][from]) !=
                    0 &&
                D->link_error[0] == '\0')
                snprintf(D->link_error, sizeof(D->link_error), "%s", ddo_last_error());
        }
    if (D->nset >= 2 && !quiet)
        fprintf(stderr, "measuring the split intake over %d devices...\n", D->nset);
    if (D->nset >= 2 &&
        ddo_device_measure_split(dev, (size_t)D->nset, measure_bytes, NULL, &D->split) != 0)
        snprintf(D->split_error, sizeof(D->split_error), "%s", ddo_last_error());
out:
    for (int i = 0; i < D->nset; i++)
        ddo_device_destroy(dev[i]);
}

static void links_json(const doctor *D, json_t *j)
{
    if (D->nset == 0)
        return;
    json_t *o = json_object(), *hd = json_array(), *dd = json_array();
    for (int i = 0; i < D->nset; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "device", json_string(D->set[i]));
        json_object_set_new(e, "pinned_h2d_bytes_per_s", json_real(D->h2d[i]));
        json_array_append_new(hd, e);
        for (int k = 0; k < D->nset; k++) {
            if (k == i)
                continue;
            json_t *l = json_object();
            json_object_set_new(l, "from", json_string(D->set[k]));
            json_object_set_new(l, "to", json_string(D->set[i]));
            json_object_set_new(l, "bytes_per_s", json_real(D->link[i][k]));
            json_array_append_new(dd, l);
        }
    }
    json_object_set_new(o, "host_to_device", hd);
    json_object_set_new(o, "device_to_device", dd);
    json_object_set_new(o, "split_intake_bytes_per_s", json_real(D->split));
    if (D->split_error[0] != '\0')
        json_object_set_new(o, "split_error", json_string(D->split_error));
    if (D->link_error[0] != '\0')
        json_object_set_new(o, "error", json_string(D->link_error));
    json_object_set_new(j, "links", o);
}

static void links_text(const doctor *D)
{
    if (D->nset == 0)
        return;
    for (int i = 0; i < D->nset; i++) {
        printf("links     %s: host->device %.1f GB/s", D->set[i], gbps(D->h2d[i]));
        for (int k = 0; k < D->nset; k++)
            if (k != i)
                printf("; from %s %.1f GB/s", D->set[k], gbps(D->link[i][k]));
        printf("\n");
    }
    if (D->link_error[0] != '\0')
        printf("          %s\n", D->link_error);
    if (D->split > 0)
        printf("          split intake %.1f GB/s per device (each reads 1/%d from host, then "
               "an all-gather)\n",
               gbps(D->split), D->nset);
    else if (D->split_error[0] != '\0')
        printf("          split intake not measured: %s\n", D->split_error);
}

/* The checkpoint and the read speed of its largest file. */
static void probe_file(doctor *D)
{
    if (D->path == NULL)
        return;
    if (ddo_checkpoint_create(D->path, DDO_READ_DEFAULT, &D->ck) != 0) {
        snprintf(D->ck_error, sizeof(D->ck_error), "%s", ddo_last_error());
        return;
    }
    D->model = ddo_checkpoint_total_bytes(D->ck);
    D->measured_file = largest_file(D->ck);
    if (D->measured_file != NULL &&
        ddo_measure_file_read(D->measured_file, (uint64_t)4 << 30,
                              DDO_MEASURE_PAGE_CACHE | DDO_MEASURE_DIRECT, &D->speed) != 0)
        snprintf(D->speed_error, sizeof(D->speed_error), "%s", ddo_last_error());
}

/* What auto would choose (validated like every command) and plan for the checkpoint. */
static void auto_plan(doctor *D)
{
    ddo_config_set_running_on_wsl(D->cfg, D->host.running_on_wsl);
    /* Like the other commands, the tool's default preset is auto (DDO_PRESET overrides). */
    int rc = ddo_config_apply_preset(D->cfg, NULL, "auto");
    if (rc == 0)
        rc = ddo_config_apply_env(D->cfg, TOOL_ENVIRON);
    if (rc == 0 && D->ngpu == 0)
        rc = ddo_config_set(D->cfg, "execution_device", "cpu");
    if (rc == 0)
        rc = ddo_config_validate(D->cfg);
    if (rc == 0)
        rc = ddo_config_settings(D->cfg, &D->st);
    if (rc != 0) {
        snprintf(D->cfg_error, sizeof(D->cfg_error), "%s", ddo_last_error());
        return;
    }
    if (D->ck == NULL)
        return;
    /* The plan `ddo run` would make: for the first GPU as probed (its measured bus; no device
     * is kept), or without one for the cpu device (its memory, the setup's rates). */
    ddo_setup_options so = DDO_SETUP_OPTIONS_INIT;
    so.device = D->ngpu > 0 ? DDO_DEVICE_CHOICE_NONE : DDO_DEVICE_CHOICE_EXACT;
    ddo_setup *setup = NULL;
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    rc = ddo_setup_create(D->cfg, &so, &setup);
    if (rc == 0 && D->ngpu > 0) {
        rc = ddo_plan_inputs_from_caps(&D->gpus[0].caps, &in);
        in.bus_bytes_per_s = D->gpus[0].bw.pinned_bytes_per_s;
    } else if (rc == 0) {
        rc = ddo_setup_plan_inputs(setup, &in);
    }
    if (rc == 0) {
        in.host_available_bytes = D->host.ram_available_bytes;
        rc = ddo_setup_plan(setup, D->ck, D->cfg, &in, &D->plan);
    }
    if (rc != 0)
        snprintf(D->plan_error, sizeof(D->plan_error), "%s", ddo_last_error());
    ddo_setup_destroy(setup);
}

/* The one-line recommendation. */
static void recommend(doctor *D)
{
    if (D->ngpu == 0) {
        snprintf(D->rec, sizeof(D->rec),
                 "No GPU answered: ddo runs on the cpu reference device only "
                 "(--ddo-execution-device cpu); install the NVIDIA driver for cuda.");
    } else if (D->host.running_on_wsl) {
        snprintf(D->rec, sizeof(D->rec),
                 "WSL detected: registered (pinned) memory is off by default; start with "
                 "--ddo-preset wsl_compat, or set DDO_DISABLE_PIN_ON_WSL=0 to experiment.");
    } else if (D->model > 0 && D->model + ((uint64_t)2 << 30) < D->gpus[0].caps.free_bytes) {
        snprintf(D->rec, sizeof(D->rec),
                 "The model (%.2f GiB) fits in device memory with room to spare: no offload "
                 "needed (--ddo-preset off).",
                 gib(D->model));
    } else if (D->model > 0 && D->host.ram_available_bytes > D->model + ((uint64_t)8 << 30)) {
        snprintf(D->rec, sizeof(D->rec),
                 "Stream at the bus limit: --ddo-backend vmm --ddo-preset auto "
                 "--ddo-vmm-source-cache-gb %.0f (the whole model retained and registered).",
                 gib(D->model) + 1.0);
    } else if (D->model > 0) {
        double keep = D->host.ram_available_bytes > ((uint64_t)8 << 30)
                          ? gib(D->host.ram_available_bytes) - 8.0
                          : 0.0;
        snprintf(D->rec, sizeof(D->rec),
                 "Host RAM cannot hold the model (%.2f GiB): retain %.0f GiB and stream the rest "
                 "from the file (--ddo-backend vmm --ddo-vmm-source-cache-gb %.0f); expect the "
                 "disk's speed for that part.",
                 gib(D->model), keep, keep);
    } else {
        snprintf(D->rec, sizeof(D->rec),
                 "GPU ready; give a checkpoint PATH to see what ddo would plan for it.");
    }
}

static void print_json(const doctor *D)
{
    json_t *j = json_object();
    json_t *drv = json_object();
    json_object_set_new(drv, "available", json_boolean(D->ngpu > 0));
    if (D->ngpu > 0)
        json_object_set_new(drv, "version", json_integer(D->gpus[0].caps.driver_version));
    else
        json_object_set_new(drv, "error", json_string(D->driver_error));
    json_object_set_new(j, "driver", drv);
    json_t *ga = json_array();
    for (int i = 0; i < D->ngpu; i++) {
        const struct gpu *g = &D->gpus[i];
        json_t *o = json_object();
        json_object_set_new(o, "index", json_integer(i));
        json_object_set_new(o, "name", json_string(g->caps.name));
        json_object_set_new(o, "total_bytes", json_integer((json_int_t)g->caps.total_bytes));
        json_object_set_new(o, "free_bytes", json_integer((json_int_t)g->caps.free_bytes));
        json_object_set_new(o, "vmm_supported", json_boolean(g->caps.vmm_supported));
        json_object_set_new(o, "granularity_bytes", json_integer((json_int_t)g->caps.granularity));
        if (g->measured) {
            json_object_set_new(o, "pinned_h2d_bytes_per_s", json_real(g->bw.pinned_bytes_per_s));
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
    json_object_set_new(h, "ram_total_bytes", json_integer((json_int_t)D->host.ram_total_bytes));
    json_object_set_new(h, "ram_available_bytes",
                        json_integer((json_int_t)D->host.ram_available_bytes));
    json_object_set_new(h, "cgroup_limit_bytes",
                        json_integer((json_int_t)D->host.cgroup_limit_bytes));
    json_object_set_new(h, "running_on_wsl", json_boolean(D->host.running_on_wsl));
    json_object_set_new(h, "kernel_release", json_string(D->host.kernel_release));
    json_object_set_new(j, "host", h);
    links_json(D, j);
    if (D->path != NULL) {
        json_t *f = json_object();
        json_object_set_new(f, "path", json_string(D->path));
        if (D->ck_error[0] != '\0') {
            json_object_set_new(f, "error", json_string(D->ck_error));
        } else {
            json_object_set_new(f, "measured_file", json_string(D->measured_file));
            json_object_set_new(f, "model_bytes", json_integer((json_int_t)D->model));
            json_object_set_new(f, "read_bytes", json_integer((json_int_t)D->speed.bytes));
            json_object_set_new(f, "page_cache_bytes_per_s",
                                json_real(D->speed.page_cache_bytes_per_s));
            json_object_set_new(f, "direct_bytes_per_s", json_real(D->speed.direct_bytes_per_s));
            if (D->speed_error[0] != '\0')
                json_object_set_new(f, "read_error", json_string(D->speed_error));
        }
        json_object_set_new(j, "file", f);
    }
    json_t *a = json_object();
    if (D->cfg_error[0] != '\0') {
        json_object_set_new(a, "error", json_string(D->cfg_error));
    } else {
        json_object_set_new(a, "requested_preset",
                            json_string(D->st.requested_preset ? D->st.requested_preset : ""));
        json_object_set_new(a, "effective_preset",
                            json_string(D->st.effective_preset ? D->st.effective_preset : ""));
        json_object_set_new(a, "route", json_string(D->st.route ? D->st.route : ""));
        json_object_set_new(a, "effective_pin_cpu_memory",
                            json_boolean(D->st.effective_pin_cpu_memory));
    }
    if (D->plan != NULL) {
        char *pj = NULL;
        if (ddo_plan_to_json(D->plan, &pj) == 0) {
            json_t *pv = json_loads(pj, 0, NULL);
            if (pv != NULL)
                json_object_set_new(a, "plan", pv);
            ddo_free(pj);
        }
    } else if (D->plan_error[0] != '\0') {
        json_object_set_new(a, "plan_error", json_string(D->plan_error));
    }
    json_object_set_new(j, "auto", a);
    json_object_set_new(j, "recommendation", json_string(D->rec));
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (text != NULL)
        printf("%s\n", text);
    free(text);
    json_decref(j);
}

static void print_text(const doctor *D)
{
    if (D->ngpu == 0) {
        printf("driver    no GPU: %s\n", D->driver_error[0] ? D->driver_error : "none found");
    } else {
        printf("driver    CUDA driver %d.%d\n", D->gpus[0].caps.driver_version / 1000,
               (D->gpus[0].caps.driver_version % 1000) / 10);
        for (int i = 0; i < D->ngpu; i++) {
            const struct gpu *g = &D->gpus[i];
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
           gib(D->host.ram_total_bytes), gib(D->host.ram_available_bytes));
    if (D->host.cgroup_limit_bytes)
        printf("%.2f GiB", gib(D->host.cgroup_limit_bytes));
    else
        printf("none");
    printf("; WSL %s; kernel %s\n", D->host.running_on_wsl ? "yes" : "no", D->host.kernel_release);
    links_text(D);
    if (D->path != NULL) {
        if (D->ck_error[0] != '\0')
            printf("file      %s\n", D->ck_error);
        else if (D->speed_error[0] != '\0')
            printf("file      %s\n", D->speed_error);
        else if (D->speed.direct_bytes_per_s > 0)
            printf("file      %s: %.2f GiB model; read %.2f GiB: page cache %.2f GB/s, "
                   "O_DIRECT %.2f GB/s (%u reads in flight)\n",
                   D->measured_file, gib(D->model), gib(D->speed.bytes),
                   gbps(D->speed.page_cache_bytes_per_s), gbps(D->speed.direct_bytes_per_s),
                   D->speed.direct_streams);
        else
            printf("file      %s: %.2f GiB model; read %.2f GiB: page cache %.2f GB/s, "
                   "O_DIRECT not supported on this filesystem\n",
                   D->measured_file, gib(D->model), gib(D->speed.bytes),
                   gbps(D->speed.page_cache_bytes_per_s));
    }
    if (D->cfg_error[0] != '\0') {
        printf("auto      %s\n", D->cfg_error);
    } else {
        printf("auto      backend %s, preset %s -> route %s; pinning %s\n", D->st.backend,
               D->st.requested_preset && D->st.requested_preset[0] ? D->st.requested_preset
                                                                   : "auto",
               D->st.route, D->st.effective_pin_cpu_memory ? "on" : "off");
    }
    if (D->plan != NULL) {
        ddo_plan_budgets b;
        if (ddo_plan_budgets_get(D->plan, &b) == 0)
            printf("          plan: %zu units, resident %.2f GiB, %zu slots x %.2f GiB, "
                   "retained %.2f GiB (registered %.2f GiB), staging %.2f GiB\n",
                   ddo_plan_unit_count(D->plan), gib(b.resident_bytes), b.slot_count,
                   gib(b.slot_bytes), gib(b.retained_peak), gib(b.registered_peak),
                   gib(b.staging_peak));
        for (size_t i = 0; i < ddo_plan_decision_count(D->plan); i++) {
            const char *k, *v;
            if (ddo_plan_decision(D->plan, i, &k, &v) == 0)
                printf("          %s = %s\n", k, v);
        }
    } else if (D->plan_error[0] != '\0') {
        printf("          plan refused: %s\n", D->plan_error);
    }
    printf("\nrecommendation: %s\n", D->rec);
}

int ddo_cmd_doctor(int argc, char **argv)
{
    static doctor D;
    memset(&D, 0, sizeof(D));
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
        } else if (strcmp(argv[i], "--devices") == 0) {
            if (i + 1 >= argc || parse_set(&D, argv[i + 1]) != 0)
                return DDO_EXIT_USAGE;
            i++;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return DDO_EXIT_OK;
        } else if (argv[i][0] == '-' || D.path != NULL) {
            char q[160];
            fprintf(stderr, "ddo doctor: unexpected argument \"%s\"\n",
                    tool_quote(argv[i], q, sizeof q));
            usage(stderr);
            return DDO_EXIT_USAGE;
        } else {
            D.path = argv[i];
        }
    }
    probe_gpus(&D, measure_bytes, as_json != 0);
    probe_links(&D, measure_bytes, as_json != 0);
    ddo_host_info_get(&D.host);
    probe_file(&D);
    if (ddo_config_create(&D.cfg) != 0) {
        fprintf(stderr, "ddo doctor: %s\n", ddo_last_error());
        ddo_checkpoint_destroy(D.ck);
        return DDO_EXIT_FAILURE;
    }
    auto_plan(&D);
    recommend(&D);
    if (as_json)
        print_json(&D);
    else
        print_text(&D);
    ddo_plan_destroy(D.plan);
    ddo_config_destroy(D.cfg);
    ddo_checkpoint_destroy(D.ck);
    return DDO_EXIT_OK;
}
