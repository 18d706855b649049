/*
 * cmd_plan.c - `ddo plan PATH [--ddo-* flags] [--device-memory-gb N]
 * [--host-memory-gb N] [--bandwidth-gbps B] [--tflops T] [--tokens N] [--codec-ratio R]
 * [--decode-gbps D] [--file-read-gbps F] [--json]`:
 * what will be resident, streamed, retained and registered, the predicted
 * peak of every budget and the planner's decisions, before anything is
 * allocated. `--from-json FILE` prints a saved plan again.
 */
#include "compat.h"
#include "tool.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A --unit-compute file larger than this is refused unread. */
#define MAX_UNIT_COMPUTE_BYTES (16u << 20)

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: ddo plan PATH [--ddo-* flags] [--device-memory-gb N] [--host-memory-gb N]\n"
        "                [--bandwidth-gbps B] [--tflops T] [--tokens N] [--codec-ratio R]\n"
        "                [--decode-gbps D] [--file-read-gbps F] [--unit-compute FILE.json]\n"
        "                [--json]\n"
        "       ddo plan --from-json FILE [--json]\n\n"
        "Prints the plan for a checkpoint: units in execution order with their bytes,\n"
        "placement, retention and predicted transfer/compute time; the predicted peak of\n"
        "every budget; the planner's decisions. Nothing is allocated.\n"
        "  --device-memory-gb N  device memory in GiB (default: the device `ddo run` opens)\n"
        "  --host-memory-gb N    available host RAM in GiB (default: MemAvailable)\n"
        "  --bandwidth-gbps B    host->device bus bandwidth, GB/s (1e9 bytes/s)\n"
        "  --tflops T            compute rate, TFLOP/s\n"
        "  --tokens N            activation rows per unit for the cost model (default 4096)\n"
        "  --codec-ratio R       weight_codec: coded/raw of the BF16/F16/F32/FP8 tensors, as\n"
        "                        ddo inspect --codec prints it (default per dtype, docs/codec.md)\n"
        "  --decode-gbps D       weight_codec: the decoder's output, GB/s (default: cuda 400,\n"
        "                        the cpu device 0.25)\n"
        "  --file-read-gbps F    the checkpoint file's read rate, GB/s: prices re-reading\n"
        "                        each unit, and the retained store keeps what would stall most\n"
        "  --unit-compute FILE   measured compute per unit, {\"unit\": seconds, ...} (a\n"
        "                        profile's recommendation unit_compute_s; docs/plan.md)\n"
        "  --json                the plan as JSON (docs/plan.md)\n"
        "  --from-json FILE      print a plan saved with --json\n\n%s",
        ddo_config_flags_help());
}

/* bytes in adaptive units (never "0.00 GiB" for a small model). */
static const char *gib(uint64_t bytes, char *buf, size_t len)
{
    if (bytes >= 1073741824u || bytes == 0)
        snprintf(buf, len, "%.2f GiB", (double)bytes / 1073741824.0);
    else if (bytes >= 1048576u)
        snprintf(buf, len, "%.2f MiB", (double)bytes / 1048576.0);
    else if (bytes >= 1024u)
        snprintf(buf, len, "%.2f KiB", (double)bytes / 1024.0);
    else
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    return buf;
}

/* weight_codec: the streamed units' bytes raw and (estimated) coded, and what the estimate
 * assumed. */
/* The device set (docs/multi-gpu.md): which device computes, which stores, the link. */
static void print_device_set(const ddo_plan_info *info, const ddo_plan_budgets *bg, char *a,
                             char *b, size_t len)
{
    if (info->device_mode == DDO_DEVICE_MODE_SINGLE)
        return;
    bool donor = info->device_mode == DDO_DEVICE_MODE_DONOR;
    printf("  device set       %s: %s (%zu devices; %s)\n", donor ? "donor" : "split",
           info->devices, info->device_count,
           donor ? "the first computes, the second stores every streamed unit"
                 : "every device computes, each reads 1/N of a unit from host memory");
    if (donor)
        printf("  store device     %s / %s\n", gib(info->store_bytes, a, len),
               info->store_limit ? gib(info->store_limit, b, len) : "no limit known");
    else /* split: the first device's residents and slots, on every device */
        printf("  every device     %s  (resident %s + %zu slots; each device holds the same, "
               "within its own budget)\n",
               gib(bg->resident_bytes + (uint64_t)bg->slot_count * bg->slot_bytes, a, len),
               gib(bg->resident_bytes, b, len), bg->slot_count);
    if (info->peer_bytes_per_s > 0)
        printf("  device link      %.1f GB/s device->device\n", info->peer_bytes_per_s / 1e9);
    else
        printf(
            "  device link      not measured (ddo doctor --ddo-devices ...; or peer_link_gbps)\n");
}

static void print_codec(const ddo_plan *plan)
{
    const char *raw = tool_decision(plan, "codec_raw_streamed_gb");
    const char *coded = tool_decision(plan, "codec_coded_streamed_gb");
    const char *ratio = tool_decision(plan, "codec_ratio_estimate");
    const char *dec = tool_decision(plan, "codec_decode_gbps");
    double r = raw != NULL ? strtod(raw, NULL) : 0.0, c = coded != NULL ? strtod(coded, NULL) : 0.0;
    printf("  streamed, coded  %.2f GiB raw -> %.2f GiB coded over the bus (%.4f; estimate: ratio "
           "%s, decoder %s GB/s)\n",
           r, c, r > 0.0 ? c / r : 1.0, ratio != NULL ? ratio : "?", dec != NULL ? dec : "?");
}

static void print_table(const ddo_plan *plan, const char *path)
{
    char a[32], b[32], c[32], d[32];
    ddo_plan_budgets bg;
    ddo_plan_budgets_get(plan, &bg);
    size_t nt = ddo_plan_tensor_count(plan);
    uint64_t by_reason[5] = { 0 }, streamed = 0, skipped = 0, total = 0;
    size_t cnt_reason[5] = { 0 }, cnt_streamed = 0, cnt_skipped = 0;
    for (size_t i = 0; i < nt; i++) {
        ddo_tensor_location loc;
        if (ddo_plan_tensor_location(plan, i, &loc) != 0)
            continue;
        total += loc.nbytes;
        if (loc.placement == DDO_PLACEMENT_STREAMED) {
            streamed += loc.nbytes;
            cnt_streamed++;
        } else if (loc.placement == DDO_PLACEMENT_SKIPPED) {
            skipped += loc.nbytes;
            cnt_skipped++;
        } else if ((int)loc.reason >= 0 && loc.reason < 5) {
            by_reason[loc.reason] += loc.nbytes;
            cnt_reason[loc.reason]++;
        }
    }
    printf("plan: %s\n", path);
    printf("route: %s, unit granularity: %s\n", ddo_plan_route(plan),
           tool_decision(plan, "unit_granularity") ? tool_decision(plan, "unit_granularity") : "?");
    const char *note = tool_decision(plan, "plan_note");
    if (note != NULL)
        printf("%s\n", note);
    printf("tensors: %zu (%s)\n", nt, gib(total, a, sizeof(a)));
    printf("  resident  always %zu (%s), small %zu (%s), budget %zu (%s)\n",
           cnt_reason[DDO_REASON_ALWAYS_RESIDENT],
           gib(by_reason[DDO_REASON_ALWAYS_RESIDENT], a, sizeof(a)), cnt_reason[DDO_REASON_SMALL],
           gib(by_reason[DDO_REASON_SMALL], b, sizeof(b)), cnt_reason[DDO_REASON_BUDGET],
           gib(by_reason[DDO_REASON_BUDGET], c, sizeof(c)));
    printf("  streamed  %zu (%s)\n", cnt_streamed, gib(streamed, a, sizeof(a)));
    printf("  skipped   %zu (%s)\n", cnt_skipped, gib(skipped, a, sizeof(a)));

    size_t nu = ddo_plan_unit_count(plan);
    bool cost_on = bg.predicted_step_s > 0.0;
    for (size_t u = 0; u < nu && !cost_on; u++) {
        ddo_unit_info ui;
        if (ddo_plan_unit(plan, u, &ui) == 0 && (ui.transfer_s > 0.0 || ui.compute_s > 0.0))
            cost_on = true;
    }
    ddo_plan_info info = DDO_PLAN_INFO_INIT;
    bool codec = ddo_plan_info_get(plan, &info) == 0 &&
                 info.weight_codec == DDO_WEIGHT_CODEC_DDOC1 &&
                 tool_decision(plan, "codec_coded_streamed_gb") != NULL;
    bool reread = false; /* the plan priced re-reads from the file */
    for (size_t u = 0; u < nu && !reread; u++) {
        double rs = 0.0;
        reread = ddo_plan_unit_reread(plan, u, &rs, NULL) == 0 && rs > 0.0;
    }
    printf("\nunits: %zu (execution order)\n", nu);
    printf("  %4s  %-44s %10s  %-9s %-9s", "#", "unit", "MiB", "placement", "host");
    if (codec)
        printf(" %10s", "coded MiB");
    if (cost_on)
        printf(" %11s %11s  %-*s", "transfer ms", "compute ms", reread ? 6 : 0, "hidden");
    if (reread)
        printf(" %8s %9s", "read ms", "stall ms");
    printf("\n");
    for (size_t u = 0; u < nu; u++) {
        ddo_unit_info ui;
        if (ddo_plan_unit(plan, u, &ui) != 0)
            continue;
        const char *host = ui.resident     ? "-"
                           : ui.registered ? "registered"
                           : ui.retained   ? "retained"
                                           : "file";
        printf("  %4zu  %-44s %10.2f  %-9s %-9s", u, ui.name[0] ? ui.name : "(root)",
               (double)ui.bytes / 1048576.0, ui.resident ? "resident" : "streamed", host);
        uint64_t coded = ui.bytes;
        if (codec && ddo_plan_unit_coded(plan, u, &coded, NULL) == 0)
            printf(" %10.2f", ui.resident ? 0.0 : (double)coded / 1048576.0);
        if (cost_on)
            printf(" %11.3f %11.3f  %-*s", ui.transfer_s * 1e3, ui.compute_s * 1e3, reread ? 6 : 0,
                   ui.hidden ? "yes" : "no");
        double rs = 0.0, st = 0.0;
        if (reread && ddo_plan_unit_reread(plan, u, &rs, &st) == 0)
            printf(" %8.3f %9.3f", rs * 1e3, st * 1e3);
        printf("\n");
    }

    printf("\nbudgets (predicted peak / limit):\n");
    const char *src = tool_decision(plan, "device_weights_limit_source");
    printf("  device weights   %s / %s  (resident %s + %zu slots x %s)%s%s\n",
           gib(bg.device_weights_peak, a, sizeof(a)),
           bg.device_weights_limit ? gib(bg.device_weights_limit, b, sizeof(b)) : "no limit",
           gib(bg.resident_bytes, c, sizeof(c)), bg.slot_count, gib(bg.slot_bytes, d, sizeof(d)),
           bg.device_weights_limit ? "; limit: " : "; no device limit known",
           bg.device_weights_limit && src ? src : "");
    printf("  retained host    %s / %s%s\n", gib(bg.retained_peak, a, sizeof(a)),
           bg.retained_limit ? gib(bg.retained_limit, b, sizeof(b)) : "no limit",
           info.retained_by_stall ? "  (the units whose re-read would stall most)" : "");
    printf("  registered host  %s / %s\n", gib(bg.registered_peak, a, sizeof(a)),
           bg.registered_limit ? gib(bg.registered_limit, b, sizeof(b)) : "no limit");
    printf("  staging          %s  (%zu windows x %.0f MiB)\n", gib(bg.staging_peak, a, sizeof(a)),
           bg.staging_windows, (double)bg.staging_window_bytes / 1048576.0);
    if (codec)
        print_codec(plan);
    print_device_set(&info, &bg, a, b, sizeof(a));
    const char *raw_step = codec ? tool_decision(plan, "codec_raw_predicted_step_s") : NULL;
    if (cost_on && raw_step != NULL)
        printf("  predicted step   %.3f s coded (%.3f s raw)\n", bg.predicted_step_s,
               strtod(raw_step, NULL));
    else if (cost_on)
        printf("  predicted step   %.3f s\n", bg.predicted_step_s);
    else
        printf("  predicted step   (cost model off: give --bandwidth-gbps and --tflops)\n");

    printf("\ndecisions:\n");
    for (size_t i = 0; i < ddo_plan_decision_count(plan); i++) {
        const char *k, *v;
        if (ddo_plan_decision(plan, i, &k, &v) == 0)
            printf("  %-46s %s\n", k, v);
    }
}

/* A saved plan is at most this large (a plan of 10^5 tensors is a few tens of MiB). */
#define MAX_PLAN_JSON_BYTES ((size_t)256 << 20)

static int emit(const ddo_plan *plan, bool json, const char *path)
{
    if (!json) {
        print_table(plan, path);
        return DDO_EXIT_OK;
    }
    char *text = NULL;
    if (ddo_plan_to_json(plan, &text) != 0) {
        fprintf(stderr, "ddo plan: %s\n", ddo_last_error());
        return DDO_EXIT_FAILURE;
    }
    printf("%s\n", text);
    ddo_free(text);
    return DDO_EXIT_OK;
}

typedef struct plan_flags {
    const char *path, *from_json, *unit_compute;
    bool json;
    double device_gb, host_gb, gbps, tflops, codec_ratio, decode_gbps, file_gbps;
    uint64_t tokens;
} plan_flags;

/* The tool's own flags (after the --ddo-* ones were taken): 0, or -1 after a usage message. */
static int parse_flags(int argc, char **argv, plan_flags *f)
{
    memset(f, 0, sizeof(*f));
    f->device_gb = -1.0;
    f->host_gb = -1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (strcmp(a, "--json") == 0)
            f->json = true;
        else if (strcmp(a, "--device-memory-gb") == 0)
            bad = tool_flag_real("plan", a, v, 0.0, TOOL_MAX_MEMORY_GB, &f->device_gb), i++;
        else if (strcmp(a, "--host-memory-gb") == 0)
            bad = tool_flag_real("plan", a, v, 0.0, TOOL_MAX_MEMORY_GB, &f->host_gb), i++;
        else if (strcmp(a, "--bandwidth-gbps") == 0)
            bad = tool_flag_real("plan", a, v, 0.0, TOOL_MAX_GBPS, &f->gbps), i++;
        else if (strcmp(a, "--tflops") == 0)
            bad = tool_flag_real("plan", a, v, 0.0, TOOL_MAX_GFLOPS / 1e3, &f->tflops), i++;
        else if (strcmp(a, "--tokens") == 0)
            bad = tool_flag_count("plan", a, v, 1, 65536, &f->tokens), i++;
        else if (strcmp(a, "--codec-ratio") == 0)
            bad = tool_flag_real("plan", a, v, 0.001, 1.0, &f->codec_ratio), i++;
        else if (strcmp(a, "--decode-gbps") == 0)
            bad = tool_flag_real("plan", a, v, 0.001, TOOL_MAX_GBPS, &f->decode_gbps), i++;
        else if (strcmp(a, "--file-read-gbps") == 0)
            bad = tool_flag_real("plan", a, v, 0.001, TOOL_MAX_GBPS, &f->file_gbps), i++;
        else if (strcmp(a, "--from-json") == 0 && v != NULL)
            f->from_json = v, i++;
        else if (strcmp(a, "--unit-compute") == 0 && v != NULL)
            f->unit_compute = v, i++;
        else if (a[0] != '-' && f->path == NULL)
            f->path = a;
        else {
            char q[160];
            fprintf(stderr, "ddo plan: unknown or incomplete argument \"%s\"\n",
                    tool_quote(a, q, sizeof q));
            bad = -1;
        }
        if (bad != 0)
            return -1;
    }
    return 0;
}

/*
 * The setup the plan is made for and its inputs: the device `ddo run` would use (the configured
 * one; the default cuda:0 stands down to the cpu device, said on stderr) unless
 * --device-memory-gb replaces it, else none (an explicit device that does not open: the plan
 * is made without the device's figures); the flags' figures over them. -1 after a message.
 */
static int plan_setup(ddo_config *cfg, const plan_flags *f, ddo_setup **setup, ddo_plan_inputs *in)
{
    const char *spec = "cpu";
    if (ddo_config_get(cfg, "execution_device", &spec) != 0 || spec == NULL)
        spec = "cpu";
    ddo__device_spec ds;
    bool is_cpu = !ddo__device_spec_parse(spec, &ds) || !ds.cuda;
    ddo_setup_options so = DDO_SETUP_OPTIONS_INIT;
    so.device = DDO_DEVICE_CHOICE_AUTO;
    if (f->device_gb < 0.0 && ddo_setup_create(cfg, &so, setup) == 0) {
        if (ddo_setup_plan_inputs(*setup, in) != 0) {
            ddo_setup_destroy(*setup); /* the device did not answer: plan without its figures */
            *setup = NULL;
        } else if (ddo_setup_note(*setup)[0] != '\0') {
            fprintf(stderr, "ddo plan: %s\n", ddo_setup_note(*setup));
        }
    }
    so.device = DDO_DEVICE_CHOICE_NONE;
    if (*setup == NULL &&
        (ddo_setup_create(cfg, &so, setup) != 0 || ddo_setup_plan_inputs(*setup, in) != 0)) {
        fprintf(stderr, "ddo plan: %s\n", ddo_last_error());
        return -1;
    }
    in->device_is_cpu = in->device_is_cpu || is_cpu;
    if (f->device_gb >= 0.0) {
        in->device_total_bytes = (uint64_t)(f->device_gb * 1073741824.0); /* <= 1 PiB */
        in->device_free_bytes = in->device_total_bytes;
    }
    if (f->host_gb >= 0.0) {
        in->host_available_bytes = (uint64_t)(f->host_gb * 1073741824.0);
        if (ddo_config_set_double(cfg, "available_system_ram_gb", f->host_gb) != 0) {
            fprintf(stderr, "ddo plan: %s\n", ddo_config_error(cfg));
            return -1;
        }
    }
    if (f->gbps > 0.0)
        in->bus_bytes_per_s = f->gbps * 1e9;
    if (f->tflops > 0.0)
        in->flops_per_s = f->tflops * 1e12;
    in->tokens = f->tokens;
    in->codec_ratio = f->codec_ratio;
    if (f->decode_gbps > 0.0)
        in->decode_bytes_per_s = f->decode_gbps * 1e9;
    if (f->file_gbps > 0.0)
        in->file_read_bytes_per_s = f->file_gbps * 1e9;
    return 0;
}

int ddo_cmd_plan(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return DDO_EXIT_OK;
        }
    ddo_config *cfg = NULL;
    ddo_checkpoint *ck = NULL;
    ddo_plan *plan = NULL;
    ddo_setup *setup = NULL;
    char *saved = NULL;
    int status = DDO_EXIT_FAILURE;
    if (tool_config_create(&cfg) != 0) {
        fprintf(stderr, "ddo plan: %s\n", ddo_last_error());
        return DDO_EXIT_FAILURE;
    }
    if (ddo_config_apply_env(cfg, TOOL_ENVIRON) != 0 ||
        ddo_config_parse_args(cfg, &argc, argv) != 0) {
        fprintf(stderr, "ddo plan: %s\n", ddo_config_error(cfg));
        goto out;
    }
    for (size_t i = 0; i < ddo_config_warning_count(cfg); i++)
        fprintf(stderr, "ddo plan: warning: %s\n", ddo_config_warning(cfg, i));
    plan_flags f;
    if (parse_flags(argc, argv, &f) != 0) {
        status = DDO_EXIT_USAGE;
        goto out;
    }
    if (f.from_json != NULL) {
        char q[512];
        tool_quote(f.from_json, q, sizeof q);
        saved = tool_read_file(f.from_json, MAX_PLAN_JSON_BYTES);
        if (saved == NULL) {
            fprintf(stderr, "ddo plan: %s: %s\n", q,
                    errno == EFBIG    ? "larger than 256 MiB (the saved-plan limit)"
                    : errno == EINVAL ? "not a regular file"
                                      : strerror(errno));
            goto out;
        }
        if (ddo_plan_from_json(saved, &plan) != 0) {
            fprintf(stderr, "ddo plan: %s: %s\n", q, ddo_last_error());
            goto out;
        }
        status = emit(plan, f.json, f.from_json);
        goto out;
    }
    if (f.path == NULL) {
        fprintf(stderr, "ddo plan: a checkpoint PATH is required\n");
        usage(stderr);
        status = DDO_EXIT_USAGE;
        goto out;
    }
    if (ddo_config_validate(cfg) != 0) {
        fprintf(stderr, "ddo plan: %s\n", ddo_config_error(cfg));
        goto out;
    }
    if (ddo_checkpoint_create(f.path, DDO_READ_DEFAULT, &ck) != 0) {
        fprintf(stderr, "ddo plan: %s\n", ddo_last_error());
        goto out;
    }
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    if (plan_setup(cfg, &f, &setup, &in) != 0)
        goto out;
    if (f.unit_compute != NULL) {
        saved = tool_read_file(f.unit_compute, MAX_UNIT_COMPUTE_BYTES);
        if (saved == NULL) {
            char q[512];
            fprintf(stderr, "ddo plan: %s: %s\n", tool_quote(f.unit_compute, q, sizeof q),
                    errno == EFBIG    ? "larger than 16 MiB"
                    : errno == EINVAL ? "not a regular file"
                                      : strerror(errno));
            goto out;
        }
        in.unit_compute_json = saved;
    }
    if (ddo_setup_plan(setup, ck, cfg, &in, &plan) != 0) {
        fprintf(stderr, "ddo plan: %s\n", ddo_last_error());
        goto out;
    }
    status = emit(plan, f.json, f.path);
out:
    free(saved);
    ddo_plan_destroy(plan);
    ddo_setup_destroy(setup);
    ddo_checkpoint_destroy(ck);
    ddo_config_destroy(cfg);
    return status;
}
