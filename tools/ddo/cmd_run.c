/*
 * cmd_run.c - `ddo run`: the reference host. Opens a checkpoint, plans it
 * for the chosen device, prints the plan before allocating anything, creates
 * a session and runs steps: for every unit in order acquire, run the unit's
 * matrix products (host.h), release. Prints per-step time, stall, bytes per
 * source tier and bandwidth beside the plan's prediction; --verify compares
 * every step's checksum with an independent reference.
 *
 * A directory with model_index.json (the Diffusers layout) is a phase-staged
 * pipeline: its components run one after another in pipeline order (text
 * encoders, then the denoiser, then the VAE), each with its component route,
 * and each component's session is destroyed before the next one loads, so
 * the device peak is the largest component's, not the sum.
 */
#include "devset.h"
#include "host.h"
#include "order.h"
#include "profile_run.h"
#include "tool.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)

typedef struct run_args {
    const char *path;
    uint64_t steps;
    uint64_t tokens;
    bool verify;
    const char *metrics_path;
    bool show_profile;
    ddo_cpu_options cpu;   /* --cpu-gbps, --cpu-gflops, --cpu-memory-gb */
    double file_gbps;      /* --file-read-gbps: the file's read rate for the plan; 0 = unknown */
    uint64_t corrupt_step; /* DDO_TEST_CORRUPT: tests only; 0 = off */
} run_args;

/* One group of tensors run together: the resident tensors, or one unit's. */

/* What one checkpoint (or pipeline component) measured. */
typedef struct run_result {
    uint64_t device_used_peak; /* device bytes in use above the baseline, sampled */
    uint64_t weights_peak;     /* the session's device_weights_peak_bytes */
    uint64_t total_bytes;
    uint64_t device_used_after;  /* above the baseline after the session was destroyed */
    double file_use_bytes_per_s; /* the steps' reads from the file: bytes / loader time; 0 = none */
} run_result;

/* "1.50 GiB", "12.0 MiB", "512 B" */
static const char *fmt_bytes(double b, char *buf, size_t len)
{
    if (b >= GIB)
        snprintf(buf, len, "%.2f GiB", b / GIB);
    else if (b >= MIB)
        snprintf(buf, len, "%.1f MiB", b / MIB);
    else if (b >= 1024.0)
        snprintf(buf, len, "%.1f KiB", b / 1024.0);
    else
        snprintf(buf, len, "%.0f B", b);
    return buf;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: ddo run PATH [--ddo-* flags] [--steps N] [--tokens T] [--verify]\n"
            "               [--metrics FILE] [--show-profile]\n"
            "               [--cpu-gbps B] [--cpu-gflops C] [--cpu-memory-gb M]\n"
            "               [--file-read-gbps F]\n\n"
            "The reference host: streams PATH (a .safetensors or .gguf file, a sharded index,\n"
            "a model directory, or a Diffusers pipeline directory with model_index.json)\n"
            "through a ddo session and runs every 2-D weight's product Y = X W^T on the\n"
            "device (other dtypes, such as GGUF's blocks, are moved and checksummed).\n\n"
            "  --steps N        steps to run (default 3)\n"
            "  --tokens T       activation rows per product (default 16)\n"
            "  --verify         compare every step's checksum with an independent reference\n"
            "                   (cpu: tensors read straight from the file, no session; cuda: a\n"
            "                   session with everything resident); exit 1 on any difference\n"
            "  --metrics FILE   append the metrics JSON line of each run to FILE\n"
            "  --show-profile   print the profile table\n"
            "  --cpu-gbps B     cpu device: throttle copies to B GB/s (10^9 bytes/s)\n"
            "  --cpu-gflops C   cpu device: a unit's compute takes at least flops / C GFLOP/s\n"
            "  --cpu-memory-gb M  cpu device: its memory size in GiB\n"
            "  --file-read-gbps F  the checkpoint file's read rate for the plan, GB/s (default:\n"
            "                   the last calibration's): prices re-reads from the file\n\n"
            "A device set (--ddo-devices A,B[,...]): donor mode opens the second device as the\n"
            "store; split mode (--ddo-device-mode split) opens every device after the first\n"
            "and (on the cpu device, or with --verify) compares every other device's bytes\n"
            "with the first's after each acquire (exit 1 on a difference).\n\n"
            "The environment (DDO_*) applies first, then the --ddo-* flags; `ddo config --list`\n"
            "lists them. Pipeline components take their route from DDO_<COMPONENT>_ROUTE.\n");
}

/* ---- progress bar ------------------------------------------------------------------ */

typedef struct progress_state {
    char phase[32];
    int last_percent;
} progress_state;

static void progress(void *user, const char *phase, uint64_t done, uint64_t total)
{
    progress_state *p = user;
    int percent = total > 0 ? (int)(done * 100 / total) : 100;
    if (strcmp(p->phase, phase) == 0 && percent == p->last_percent)
        return;
    if (strcmp(p->phase, phase) != 0 && p->phase[0] != '\0' && p->last_percent < 100)
        fputc('\n', stderr);
    snprintf(p->phase, sizeof p->phase, "%s", phase);
    p->last_percent = percent;
    char bar[31];
    int filled = percent * 30 / 100;
    for (int i = 0; i < 30; i++)
        bar[i] = i < filled ? '#' : ' ';
    bar[30] = '\0';
    char a[32], b[32];
    fprintf(stderr, "\r  %-9s [%s] %3d%%  %s / %s", phase, bar, percent,
            fmt_bytes((double)done, a, sizeof a), fmt_bytes((double)total, b, sizeof b));
    if (percent >= 100)
        fputc('\n', stderr);
    fflush(stderr);
}

/* ---- machine facts ----------------------------------------------------------------- */

static uint64_t device_used(ddo_device *dev)
{
    ddo_device_caps caps;
    if (ddo_device_caps_get(dev, &caps) != 0 || caps.total_bytes < caps.free_bytes)
        return 0;
    return caps.total_bytes - caps.free_bytes;
}

/* Bytes per second of a 32 MiB memcpy, best of three. */
static double measure_memcpy(void)
{
    size_t n = 32u << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = 0;
    if (a != NULL && b != NULL) {
        memset(a, 1, n);
        memset(b, 2, n);
        for (int i = 0; i < 3; i++) {
            uint64_t t0 = tool_now_ns();
            memcpy(b, a, n);
            double dt = (double)(tool_now_ns() - t0) / 1e9;
            a[i] = b[n - 1 - (size_t)i]; /* keep the copy */
            if (dt > 0 && (double)n / dt > best)
                best = (double)n / dt;
        }
    }
    free(a);
    free(b);
    return best;
}

/* ---- plan summary ------------------------------------------------------------------ */

static void print_plan(const ddo_plan *plan, const ddo_checkpoint *ck, const char *device_name)
{
    ddo_plan_budgets b;
    memset(&b, 0, sizeof b);
    ddo_plan_budgets_get(plan, &b);
    size_t units = ddo_plan_unit_count(plan);
    size_t n = ddo_checkpoint_tensor_count(ck), resident = 0, streamed = 0, skipped = 0;
    for (size_t i = 0; i < n; i++) {
        switch (tool_placement(plan, i)) {
        case DDO_PLACEMENT_RESIDENT:
            resident++;
            break;
        case DDO_PLACEMENT_STREAMED:
            streamed++;
            break;
        default:
            skipped++;
            break;
        }
    }
    uint64_t streamed_bytes = 0;
    for (size_t u = 0; u < units; u++) {
        ddo_unit_info ui;
        if (ddo_plan_unit(plan, u, &ui) == 0 && !ui.resident)
            streamed_bytes += ui.bytes;
    }
    char s1[32], s2[32], s3[32];
    printf("plan: route %s on %s\n", ddo_plan_route(plan), device_name);
    printf("  tensors   %zu resident, %zu streamed, %zu skipped; %zu units, %s streamed per "
           "step\n",
           resident, streamed, skipped, units, fmt_bytes((double)streamed_bytes, s1, sizeof s1));
    printf("  device    %s weights peak (resident %s + %zu slots x %s)",
           fmt_bytes((double)b.device_weights_peak, s1, sizeof s1),
           fmt_bytes((double)b.resident_bytes, s2, sizeof s2), b.slot_count,
           fmt_bytes((double)b.slot_bytes, s3, sizeof s3));
    if (b.device_weights_limit > 0)
        printf(", limit %s", fmt_bytes((double)b.device_weights_limit, s1, sizeof s1));
    printf("\n");
    printf("  host      retained %s", fmt_bytes((double)b.retained_peak, s1, sizeof s1));
    if (b.retained_limit > 0)
        printf(" (limit %s)", fmt_bytes((double)b.retained_limit, s1, sizeof s1));
    printf(", registered %s", fmt_bytes((double)b.registered_peak, s1, sizeof s1));
    if (b.registered_limit > 0)
        printf(" (limit %s)", fmt_bytes((double)b.registered_limit, s1, sizeof s1));
    printf(", staging %s (%zu x %s)\n", fmt_bytes((double)b.staging_peak, s1, sizeof s1),
           b.staging_windows, fmt_bytes((double)b.staging_window_bytes, s2, sizeof s2));
    if (b.predicted_step_s > 0)
        printf("  predicted %.3f s per step\n", b.predicted_step_s);
    fflush(stdout);
}

/* ---- execution order --------------------------------------------------------------- */

/* ---- a session run ----------------------------------------------------------------- */

typedef struct run_ctx {
    const run_args *args;
    ddo_config *cfg;
    ddo_setup *setup; /* the device, the plan inputs, the workload profile */
    ddo_device *dev;  /* the setup's */
    ddo_device_caps caps;
    uint64_t baseline_used;
    /* The set's devices after the first (donor: the store; split: the others), opened for a
     * session; in split mode the tally of the per-device checks (every other device's bytes
     * against the first's; through `tally`, which run_step's const context may write) */
    tool_devset set;
    const ddo_checkpoint *ck;
    struct split_tally {
        uint64_t checked, differ;
    } split_tally, *tally;
} run_ctx;

static void fail_msg(const char *what, int rc, const char *detail)
{
    fprintf(stderr, "ddo run: %s: %s%s%s\n", what, ddo_strerror(rc),
            detail != NULL && *detail ? ": " : "", detail != NULL ? detail : "");
}

/* Flips one bit of the first streamed tensor of the last unit in step `step` (tests only, cpu
 * device: the session's addresses are host memory). */
static void corrupt(ddo_session *s, const exec_group *g)
{
    for (size_t j = 0; j < g->count; j++) {
        void *p = NULL;
        if (ddo_session_tensor_address(s, g->tensors[j], &p) == 0 && p != NULL) {
            *(unsigned char *)p ^= 0x01u;
            fprintf(stderr, "ddo run: DDO_TEST_CORRUPT: flipped a bit of tensor %zu\n",
                    g->tensors[j]);
            return;
        }
    }
}

/*
 * The reference of --verify for a cuda device: a session of a plan with every tensor
 * resident, run in the streamed plan's order (units of the reference plan, if any, are
 * acquired around the groups that need them).
 */
static int reference_session(run_ctx *ctx, const ddo_checkpoint *ck, const exec_order *o,
                             uint64_t steps, uint64_t *sums)
{
    ddo_config *rcfg = NULL;
    ddo_plan *rplan = NULL;
    ddo_session *rs = NULL;
    ddo_stream *stream = NULL;
    ref_host *host = NULL;
    size_t *need = NULL;
    /* A fresh configuration, not a copy of the run's: the run's flags and environment outrank
     * values set through the API, and the reference must not inherit its budgets. */
    int rc = ddo_config_create(&rcfg);
    if (rc == 0)
        rc = ddo_config_apply_preset(rcfg, "linear", "one_shot_fast");
    if (rc == 0)
        rc = ddo_config_set(rcfg, "execution_device", ddo_setup_device_spec(ctx->setup));
    if (rc == 0)
        rc = ddo_config_set(rcfg, "auto_budget_policy", "off");
    if (rc == 0)
        rc = ddo_config_set(rcfg, "always_resident_modules_pattern", ".*");
    if (rc != 0) {
        fail_msg("reference configuration", rc, ddo_config_error(rcfg));
        goto out;
    }
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    rc = ddo_setup_plan_inputs(ctx->setup, &in);
    in.bus_bytes_per_s = 0; /* the reference needs no cost model */
    in.flops_per_s = 0;
    in.tokens = ctx->args->tokens;
    if (rc == 0)
        rc = ddo_setup_plan(ctx->setup, ck, rcfg, &in, &rplan);
    if (rc != 0) {
        fail_msg("reference plan (everything resident)", rc, ddo_last_error());
        goto out;
    }
    rc = ddo_stream_create(ctx->dev, &stream);
    if (rc == 0)
        rc = ddo_session_create(rplan, ck, ctx->dev, NULL, &rs);
    if (rc != 0) {
        fail_msg("reference session (everything resident)", rc, ddo_last_error());
        goto out;
    }
    ref_host_config hc = { 0 };
    hc.tokens = ctx->args->tokens;
    hc.checksum = true;
    rc = ref_host_create_ex(ctx->dev, ck, &hc, &host);
    if (rc != 0)
        goto out;
    size_t runits = ddo_plan_unit_count(rplan);
    need = calloc(runits + 1, sizeof *need);
    if (need == NULL) {
        rc = DDO_E_NO_MEMORY;
        goto out;
    }
    for (uint64_t step = 0; step < steps && rc == 0; step++) {
        for (size_t gi = 0; gi < o->count && rc == 0; gi++) {
            const exec_group *g = &o->groups[gi];
            size_t nneed = 0;
            for (size_t j = 0; j < g->count; j++) {
                size_t u = tool_unit(rplan, g->tensors[j]);
                bool seen = u == SIZE_MAX;
                for (size_t k = 0; k < nneed && !seen; k++)
                    seen = need[k] == u;
                if (!seen && nneed < runits)
                    need[nneed++] = u;
            }
            size_t held = 0;
            for (; held < nneed && rc == 0; held++)
                rc = ddo_session_acquire(rs, need[held], stream);
            if (rc != 0) {
                held--;
                fail_msg("reference acquire", rc, ddo_session_error(rs));
            } else {
                rc = ref_host_run_tensors(host, rs, g->tensors, g->count, stream);
                if (rc != 0)
                    fail_msg("reference compute", rc, ref_host_error(host));
            }
            for (size_t k = 0; k < held; k++) {
                int rc2 = ddo_session_release(rs, need[k], stream);
                if (rc == 0 && rc2 != 0) {
                    rc = rc2;
                    fail_msg("reference release", rc, ddo_session_error(rs));
                }
            }
        }
        if (rc == 0) {
            rc = ref_host_step_checksum(host, stream, &sums[step]);
            if (rc != 0)
                fail_msg("reference checksum", rc, ref_host_error(host));
        }
    }
out:
    free(need);
    ref_host_destroy(host);
    ddo_session_destroy(rs);
    ddo_stream_destroy(stream);
    ddo_plan_destroy(rplan);
    ddo_config_destroy(rcfg);
    return rc;
}

/* The reference of --verify on the cpu: every tensor read straight from the file. The
 * reference does not depend on the step, so one pass gives every step's checksum. */
static int reference_checkpoint(const run_ctx *ctx, const ddo_checkpoint *ck, const exec_order *o,
                                uint64_t steps, uint64_t *sums)
{
    ref_host *host = NULL;
    ref_host_config hc = { 0 };
    hc.tokens = ctx->args->tokens;
    hc.checksum = true;
    int rc = ref_host_create_ex(NULL, ck, &hc, &host);
    if (rc != 0)
        return rc;
    for (size_t gi = 0; gi < o->count && rc == 0; gi++)
        rc = ref_host_run_checkpoint(host, o->groups[gi].tensors, o->groups[gi].count);
    if (rc == 0)
        rc = ref_host_step_checksum(host, NULL, &sums[0]);
    if (rc != 0)
        fail_msg("reference (direct file reads)", rc, ref_host_error(host));
    for (uint64_t s = 1; s < steps && rc == 0; s++)
        sums[s] = sums[0];
    ref_host_destroy(host);
    return rc;
}

/*
 * The plan inputs on ctx's device: the setup's (the device's figures, the cpu device's
 * throttles, the last calibration's measured rates where the device has none); an unthrottled
 * cpu device's rates measured here win over the calibration's.
 */
static int plan_inputs(const run_ctx *ctx, ddo_plan_inputs *in)
{
    const run_args *a = ctx->args;
    int rc = ddo_setup_plan_inputs(ctx->setup, in);
    if (rc != 0)
        return rc;
    if (ctx->caps.is_cpu && !(ctx->caps.flops_per_s > 0)) {
        double flops = ref_host_cpu_measure_flops(a->tokens);
        printf("  cost model: reference loop measured at %.2f GFLOP/s\n", flops / 1e9);
        if (flops > 0)
            in->flops_per_s = flops;
    }
    if (ctx->caps.is_cpu && !(ctx->caps.bus_bytes_per_s > 0)) {
        double bus = measure_memcpy();
        printf("  cost model: host memcpy measured at %.2f GB/s (the cpu device's bus)\n",
               bus / 1e9);
        if (bus > 0)
            in->bus_bytes_per_s = bus;
    }
    in->tokens = a->tokens;
    if (a->file_gbps > 0.0)
        in->file_read_bytes_per_s = a->file_gbps * 1e9;
    return 0;
}

/* Raises res->device_used_peak to the device bytes in use now above the baseline. */
static void sample_used(const run_ctx *ctx, run_result *res)
{
    uint64_t used = device_used(ctx->dev);
    if (used > ctx->baseline_used && used - ctx->baseline_used > res->device_used_peak)
        res->device_used_peak = used - ctx->baseline_used;
}

/* Donor mode (docs/multi-gpu.md): the set's second device as the store; split mode: every
 * device after the first. 0 for one device. */
static int open_set(run_ctx *ctx, const ddo_plan *plan)
{
    bool had = ctx->set.count > 0; /* one set per checkpoint: closed after its session */
    int rc = tool_devset_open(&ctx->set, plan);
    if (rc != 0) {
        ddo_plan_info info = DDO_PLAN_INFO_INIT;
        bool donor =
            ddo_plan_info_get(plan, &info) == 0 && info.device_mode == DDO_DEVICE_MODE_DONOR;
        fail_msg(donor ? "store device" : "split device", rc, ddo_last_error());
        return rc;
    }
    if (had || ctx->set.count == 0)
        return 0;
    if (ctx->set.mode == DDO_DEVICE_MODE_DONOR) {
        printf("store device: %s (donor mode)\n", ctx->set.names);
        return 0;
    }
    printf("split devices: %s (split mode: every device holds every unit)\n", ctx->set.names);
    memset(&ctx->split_tally, 0, sizeof ctx->split_tally);
    ctx->tally = &ctx->split_tally;
    return 0;
}

static void close_set(run_ctx *ctx)
{
    tool_devset_close(&ctx->set);
    ctx->tally = NULL;
}

/* The split check's line (none without one); 0, or 1 when a device differed or nothing was
 * compared. */
static int split_report(const run_ctx *ctx)
{
    if (ctx->tally == NULL)
        return 0;
    if (!ctx->caps.is_cpu && !ctx->args->verify) {
        printf("split: the other devices' bytes are compared with --verify\n");
        return 0;
    }
    const struct split_tally *t = &ctx->split_tally;
    bool ok = t->differ == 0 && t->checked > 0;
    printf("split: %s: %" PRIu64 " of %" PRIu64 " tensor copies on %zu other devices differ "
           "from the first device's\n",
           ok ? "OK" : "FAILED", t->differ, t->checked, ctx->set.count);
    return ok ? 0 : 1;
}

/* Split mode, on the cpu device or with --verify: every tensor of g as every other device holds
 * it against the first device's bytes (read back; the upload complete first). */
static int check_split(const run_ctx *ctx, ddo_session *s, const exec_group *g, ddo_stream *stream)
{
    if (ctx->tally == NULL || (!ctx->caps.is_cpu && !ctx->args->verify))
        return 0;
    int rc = ctx->caps.is_cpu ? 0 : ddo_stream_synchronize(stream);
    for (size_t j = 0; j < g->count && rc == 0; j++)
        rc = tool_devset_compare(s, ctx->ck, g->tensors[j], ctx->set.count, &ctx->tally->checked,
                                 &ctx->tally->differ);
    if (rc != 0)
        fail_msg("split: reading a device's bytes back", rc, ddo_session_error(s));
    return rc;
}

/* Creates the session of plan (progress on a terminal through ps) and prints its setup time. */
static int create_session(run_ctx *ctx, const ddo_plan *plan, const ddo_checkpoint *ck,
                          ddo_config *cfg, progress_state *ps, ddo_session **s)
{
    memset(ps, 0, sizeof *ps);
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    if (isatty(STDERR_FILENO)) {
        so.progress = progress;
        so.progress_user = ps;
    }
    so.config = cfg; /* workers, read engine, registration fallback, reclaim */
    ctx->ck = ck;
    int src = open_set(ctx, plan);
    if (src != 0)
        return src;
    tool_devset_session(&ctx->set, plan, &so);
    uint64_t t_setup = tool_now_ns();
    int rc = ddo_session_create(plan, ck, ctx->dev, &so, s);
    if (ps->phase[0] != '\0' && ps->last_percent < 100)
        fputc('\n', stderr);
    if (rc != 0) {
        fail_msg("session", rc, ddo_last_error());
        return rc;
    }
    printf("session: set up in %.3f s\n", (double)(tool_now_ns() - t_setup) / 1e9);
    return 0;
}

/*
 * Runs step `step` (0-based): every group of o in order, acquiring and releasing the
 * streamed units around it; *wait_ns gets the acquire waits, *sum the step's checksum.
 */
static int run_step(const run_ctx *ctx, ddo_session *s, ref_host *host, ddo_stream *stream,
                    const exec_order *o, uint64_t step, uint64_t *wait_ns, uint64_t *sum)
{
    const run_args *a = ctx->args;
    int rc;
    for (size_t gi = 0; gi < o->count; gi++) {
        const exec_group *g = &o->groups[gi];
        if (g->unit != SIZE_MAX) {
            uint64_t ta = tool_now_ns();
            rc = ddo_session_acquire(s, g->unit, stream);
            if (rc != 0) {
                fail_msg("acquire", rc, ddo_session_error(s));
                return rc;
            }
            /* On the cpu device the host itself waits for the upload here (the loop reads
             * the slot next); on cuda the wait is queued on the stream. */
            if (ctx->caps.is_cpu) {
                rc = ddo_stream_synchronize(stream);
                if (rc != 0) {
                    fail_msg("waiting for the upload", rc, ddo_last_error());
                    return rc;
                }
            }
            *wait_ns += tool_now_ns() - ta;
            if (a->corrupt_step == step + 1 && gi + 1 == o->count)
                corrupt(s, g);
        }
        rc = check_split(ctx, s, g, stream);
        if (rc != 0)
            return rc;
        rc = ref_host_run_tensors(host, s, g->tensors, g->count, stream);
        if (rc != 0) {
            fail_msg("compute", rc, ref_host_error(host));
            return rc;
        }
        if (g->unit != SIZE_MAX) {
            rc = ddo_session_release(s, g->unit, stream);
            if (rc != 0) {
                fail_msg("release", rc, ddo_session_error(s));
                return rc;
            }
        }
    }
    rc = ref_host_step_checksum(host, stream, sum);
    if (rc != 0) {
        fail_msg("checksum", rc, ref_host_error(host));
        return rc;
    }
    return 0;
}

/* Runs the steps, printing one line each (time, stall, bytes per tier, bandwidth, checksum). */
static int run_steps(const run_ctx *ctx, ddo_session *s, ref_host *host, ddo_stream *stream,
                     const exec_order *o, const ddo_plan_budgets *budgets, uint64_t *sums,
                     run_result *res)
{
    const run_args *a = ctx->args;
    char b1[32], b2[32], b3[32];
    printf("  %4s %9s %9s %9s %9s %11s %11s %11s %7s %5s  %s\n", "step", "time", "plan", "compute",
           "stall", "registered", "staged-ret", "staged-file", "GB/s", "hits", "checksum");
    uint64_t compute_prev = 0;
    double prev[6] = { 0 };
    for (uint64_t step = 0; step < a->steps; step++) {
        uint64_t t0 = tool_now_ns(), wait_ns = 0;
        int rc = run_step(ctx, s, host, stream, o, step, &wait_ns, &sums[step]);
        if (rc != 0)
            return rc;
        double dt = (double)(tool_now_ns() - t0) / 1e9;
        sample_used(ctx, res);
        ddo_metrics *m = NULL;
        rc = ddo_session_metrics(s, false, &m);
        if (rc != 0) {
            fail_msg("metrics", rc, ddo_session_error(s));
            return rc;
        }
        double cur[6] = { 0,
                          tool_metric(m, "bytes_from_registered"),
                          tool_metric(m, "bytes_staged_from_retained"),
                          tool_metric(m, "bytes_staged_from_file"),
                          tool_metric(m, "copy_bytes"),
                          tool_metric(m, "hits") };
        ddo_metrics_destroy(m);
        char plan_s[16] = "-";
        if (budgets->predicted_step_s > 0)
            snprintf(plan_s, sizeof plan_s, "%.3fs", budgets->predicted_step_s);
        uint64_t compute_now = ref_host_compute_ns(host);
        printf(
            "  %4" PRIu64 " %8.3fs %9s %8.3fs %8.3fs %11s %11s %11s %7.2f %5.0f  %016" PRIx64 "\n",
            step + 1, dt, plan_s, (double)(compute_now - compute_prev) / 1e9, (double)wait_ns / 1e9,
            fmt_bytes(cur[1] - prev[1], b1, sizeof b1), fmt_bytes(cur[2] - prev[2], b2, sizeof b2),
            fmt_bytes(cur[3] - prev[3], b3, sizeof b3), (cur[4] - prev[4]) / dt / 1e9,
            cur[5] - prev[5], sums[step]);
        fflush(stdout);
        memcpy(prev, cur, sizeof prev);
        compute_prev = compute_now;
    }
    return 0;
}

/* weight_codec_cache_dir: what the sidecars did at setup when it was not the plain case (one
 * line: a directory that could not be written, a sidecar ignored; docs/codec.md). */
static void print_sidecar_note(ddo_session *s)
{
    ddo_metrics *m = NULL;
    if (ddo_session_metrics(s, false, &m) != 0)
        return;
    const char *note = ddo_metrics_label(m, "codec_sidecar_note");
    if (note != NULL && note[0] != '\0')
        printf("  sidecar: %s\n", note);
    ddo_metrics_destroy(m);
}

/* The steps' rate of reading from the file: the bytes staged from it over the loader's time in
 * the loads that read it (reading and issuing their copies: a lower bound); 0 when none did. */
static double file_use_rate(ddo_session *s, const ddo_plan *plan, const ddo_metrics *m)
{
    double ns = 0.0;
    for (size_t u = 0; u < ddo_plan_unit_count(plan); u++) {
        ddo_unit_waits w;
        if (ddo_session_unit_waits(s, u, &w) == 0)
            ns += (double)w.file_load_ns;
    }
    double bytes =
        tool_metric(m, "bytes_staged_from_file") + tool_metric(m, "bytes_staged_from_sidecar");
    return ns > 0.0 && bytes > 0.0 ? bytes / ns * 1e9 : 0.0;
}

/* The units whose acquires waited on a load that read the file, longest wait first (at most
 * 8 lines): which units a disk slower than planned stalls, and for how long. */
static void print_file_waits(ddo_session *s, const ddo_plan *plan)
{
    enum { SHOWN = 8 };
    size_t top[SHOWN], shown = 0, units = 0;
    uint64_t total = 0, ns[SHOWN];
    for (size_t u = 0; u < ddo_plan_unit_count(plan); u++) {
        ddo_unit_waits w;
        if (ddo_session_unit_waits(s, u, &w) != 0 || w.file_waits == 0)
            continue;
        units++;
        total += w.file_wait_ns;
        /* Insert into the top list, longest first. */
        size_t k = shown;
        while (k > 0 && ns[k - 1] < w.file_wait_ns)
            k--;
        if (k == SHOWN)
            continue;
        size_t last = shown < SHOWN ? shown++ : SHOWN - 1;
        memmove(&top[k + 1], &top[k], (last - k) * sizeof(top[0]));
        memmove(&ns[k + 1], &ns[k], (last - k) * sizeof(ns[0]));
        top[k] = u;
        ns[k] = w.file_wait_ns;
    }
    if (units == 0)
        return;
    printf("  waited on the file: %zu unit%s, %.3f s in all\n", units, units == 1 ? "" : "s",
           (double)total / 1e9);
    for (size_t k = 0; k < shown; k++) {
        ddo_unit_waits w;
        ddo_unit_info ui;
        if (ddo_session_unit_waits(s, top[k], &w) != 0 || ddo_plan_unit(plan, top[k], &ui) != 0)
            continue;
        printf("    %-40s %4" PRIu64 " waits %9.3f ms; %4" PRIu64 " loads from the file %9.3f ms\n",
               ui.name, w.file_waits, (double)w.file_wait_ns / 1e6, w.file_loads,
               (double)w.file_load_ns / 1e6);
    }
}

/* A calibrating run: records what it measured (m, hs, res) in the workload's profile. */
static int finish_profile(const run_ctx *ctx, const tool_profile *tp, ddo_config *cfg,
                          const ddo_metrics *m, const ref_host *host, const ref_host_stats *hs,
                          const run_result *res)
{
    ddo_profile_calibration cal = DDO_PROFILE_CALIBRATION_INIT;
    cal.total_bytes = ctx->caps.total_bytes;
    cal.baseline_used_bytes = ctx->baseline_used;
    cal.used_peak_bytes = res->device_used_peak;
    uint64_t used = device_used(ctx->dev);
    cal.used_end_bytes = used > ctx->baseline_used ? used - ctx->baseline_used : 0;
    cal.weights_peak_bytes = res->weights_peak;
    cal.achieved_bytes_per_s = tool_metric(m, "achieved_bytes_per_s");
    double read_ns = tool_metric(m, "setup_read_ns");
    if (read_ns > 0)
        cal.file_read_bytes_per_s = tool_metric(m, "setup_read_bytes") / read_ns * 1e9;
    /* What re-reads from the file achieved during the steps wins: it is what the next plan
     * prices them at (the setup's parallel reads of the store can be much faster). */
    if (res->file_use_bytes_per_s > 0)
        cal.file_read_bytes_per_s = res->file_use_bytes_per_s;
    uint64_t cns = ref_host_compute_ns(host);
    if (cns > 0 && hs->flops > 0)
        cal.flops_per_s = (double)hs->flops / ((double)cns / 1e9);
    return tool_profile_finish(tp, ctx->setup, cfg, &cal);
}

/* --show-profile prints the session's profile; --metrics appends m to the metrics file. */
static int report_metrics(const run_args *a, const ddo_metrics *m, const char *component)
{
    if (a->show_profile) {
        char *text = NULL;
        if (ddo_metrics_format_profile(m, &text) == 0) {
            printf("%s", text);
            if (text[0] != '\0' && text[strlen(text) - 1] != '\n')
                printf("\n");
            ddo_free(text);
        }
    }
    if (a->metrics_path != NULL) {
        int rc = ddo_metrics_record(m, component, a->metrics_path);
        if (rc != 0) {
            fail_msg(a->metrics_path, rc, ddo_last_error());
            return rc;
        }
    }
    return 0;
}

/* --verify: runs the reference (into refs) and compares every step's checksum in sums. */
static int verify_steps(run_ctx *ctx, const ddo_checkpoint *ck, const exec_order *o,
                        const uint64_t *sums, uint64_t *refs)
{
    const run_args *a = ctx->args;
    bool direct = ctx->caps.is_cpu;
    printf("verify: reference = %s\n",
           direct ? "every tensor read straight from the file into host memory (no "
                    "session, no device), the same loop"
                  : "a session with every tensor resident on the same device");
    fflush(stdout);
    int rc = direct ? reference_checkpoint(ctx, ck, o, a->steps, refs)
                    : reference_session(ctx, ck, o, a->steps, refs);
    if (rc != 0)
        return rc;
    uint64_t bad = 0;
    for (uint64_t step = 0; step < a->steps; step++) {
        if (sums[step] != refs[step]) {
            bad++;
            printf("  step %" PRIu64 ": MISMATCH streamed %016" PRIx64 " reference %016" PRIx64
                   "\n",
                   step + 1, sums[step], refs[step]);
        }
    }
    if (bad > 0) {
        printf("verify: FAILED: %" PRIu64 " of %" PRIu64 " steps differ from the reference\n", bad,
               a->steps);
        return -1;
    }
    printf("verify: OK: %" PRIu64 " steps bit-identical to the reference (%016" PRIx64 ")\n",
           a->steps, refs[0]);
    return 0;
}

/* The reference host of the run: checksums on, ctx's tokens and cpu throttle. */
static int create_host(const run_ctx *ctx, const ddo_checkpoint *ck, ref_host **host)
{
    const run_args *a = ctx->args;
    ref_host_config hc = { 0 };
    hc.tokens = a->tokens;
    hc.checksum = true;
    hc.cpu_flops_per_s = a->cpu.flops_per_s;
    return ref_host_create_ex(ctx->dev, ck, &hc, host);
}

/* Prints what the reference host computed over the run; its statistics into *hs. */
static void print_compute(const ref_host *host, ref_host_stats *hs)
{
    ref_host_stats_get(host, hs);
    printf("  compute: %" PRIu64 " products (%.2f GFLOP), %" PRIu64
           " tensors moved only; host compute %.3f s\n",
           hs->weights_computed, (double)hs->flops / 1e9, hs->weights_skipped,
           (double)ref_host_compute_ns(host) / 1e9);
}

/* Runs one checkpoint (or pipeline component) with cfg. Returns 0, or an exit status. */
static int run_checkpoint(run_ctx *ctx, const char *path, const char *component, ddo_config *cfg,
                          run_result *res)
{
    const run_args *a = ctx->args;
    ddo_checkpoint *ck = NULL;
    ddo_plan *plan = NULL;
    ddo_session *s = NULL;
    ddo_stream *stream = NULL;
    ref_host *host = NULL;
    ddo_metrics *m = NULL;
    uint64_t *sums = NULL, *refs = NULL;
    exec_order o;
    memset(&o, 0, sizeof o);
    memset(res, 0, sizeof *res);
    tool_profile tp;
    memset(&tp, 0, sizeof tp);
    int status = DDO_EXIT_FAILURE;
    uint64_t used = 0;
    char b1[32], b4[32];

    int rc = ddo_checkpoint_create_from_config(path, cfg, &ck);
    if (rc != 0) {
        fail_msg(path, rc, ddo_last_error());
        goto out;
    }
    res->total_bytes = ddo_checkpoint_total_bytes(ck);
    printf("checkpoint: %s: %zu tensors, %s\n", path, ddo_checkpoint_tensor_count(ck),
           fmt_bytes((double)res->total_bytes, b1, sizeof b1));

    rc = ddo_device_caps_get(ctx->dev, &ctx->caps);
    if (rc != 0) {
        fail_msg("device", rc, ddo_device_error(ctx->dev));
        goto out;
    }
    /* A named workload's profile is applied before planning (pipelines: per run, not per
     * component). */
    if (component == NULL && tool_profile_prepare(&tp, ctx->setup, cfg, ck) != 0)
        goto out;
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    rc = plan_inputs(ctx, &in);
    if (rc == 0)
        rc = ddo_setup_plan(ctx->setup, ck, cfg, &in, &plan);
    if (rc != 0) {
        fail_msg("plan", rc, ddo_last_error());
        goto out;
    }
    print_plan(plan, ck, ctx->caps.name[0] ? ctx->caps.name : ddo_setup_device_spec(ctx->setup));
    ddo_plan_budgets budgets;
    memset(&budgets, 0, sizeof budgets);
    ddo_plan_budgets_get(plan, &budgets);

    rc = exec_order_build(plan, ck, &o);
    if (rc != 0) {
        fail_msg("execution order", rc, NULL);
        goto out;
    }
    sums = calloc(a->steps, sizeof *sums);
    refs = calloc(a->steps, sizeof *refs);
    if (sums == NULL || refs == NULL) {
        fail_msg("steps", DDO_E_NO_MEMORY, NULL);
        goto out;
    }

    rc = ddo_stream_create(ctx->dev, &stream);
    if (rc != 0) {
        fail_msg("stream", rc, ddo_device_error(ctx->dev));
        goto out;
    }
    progress_state ps;
    if (create_session(ctx, plan, ck, cfg, &ps, &s) != 0)
        goto out;
    print_sidecar_note(s);
    sample_used(ctx, res);

    if (create_host(ctx, ck, &host) != 0)
        goto out;

    if (run_steps(ctx, s, host, stream, &o, &budgets, sums, res) != 0)
        goto out;
    print_file_waits(s, plan);

    ref_host_stats hs;
    print_compute(host, &hs);

    rc = ddo_session_metrics(s, true, &m);
    if (rc != 0) {
        fail_msg("metrics", rc, ddo_session_error(s));
        goto out;
    }
    res->weights_peak = (uint64_t)tool_metric(m, "device_weights_peak_bytes");
    res->file_use_bytes_per_s = file_use_rate(s, plan, m);
    if (tp.calibrating && finish_profile(ctx, &tp, cfg, m, host, &hs, res) != 0)
        goto out;
    printf("  device weights peak %s (planned %s)\n",
           fmt_bytes((double)res->weights_peak, b1, sizeof b1),
           fmt_bytes((double)budgets.device_weights_peak, b4, sizeof b4));
    if (report_metrics(a, m, component) != 0)
        goto out;
    if ((a->verify && verify_steps(ctx, ck, &o, sums, refs) != 0) || split_report(ctx) != 0)
        goto out;
    status = 0;
out:
    fflush(stdout);
    ddo_metrics_destroy(m);
    ref_host_destroy(host);
    ddo_session_destroy(s);
    close_set(ctx); /* after the session that used its devices */
    ddo_stream_destroy(stream);
    if (ctx->dev != NULL) {
        used = device_used(ctx->dev);
        res->device_used_after = used > ctx->baseline_used ? used - ctx->baseline_used : 0;
    }
    exec_order_free(&o);
    free(sums);
    free(refs);
    ddo_plan_destroy(plan);
    ddo_checkpoint_destroy(ck);
    return status;
}

/* ---- phase-staged pipelines -------------------------------------------------------- */

typedef struct pipe_component {
    char name[256];
    int rank;   /* 0 encoders, 1 denoiser and the rest, 2 VAE */
    size_t pos; /* position in model_index.json */
} pipe_component;

static int component_rank(const char *name)
{
    if (strncmp(name, "text_encoder", 12) == 0 || strncmp(name, "image_encoder", 13) == 0)
        return 0;
    if (strcmp(name, "vae") == 0 || strstr(name, "vae") != NULL || strcmp(name, "movq") == 0)
        return 2;
    return 1;
}

static int cmp_component(const void *pa, const void *pb)
{
    const pipe_component *a = pa, *b = pb;
    if (a->rank != b->rank)
        return a->rank < b->rank ? -1 : 1;
    return a->pos < b->pos ? -1 : a->pos > b->pos ? 1 : 0;
}

/* The components of a Diffusers pipeline directory that hold safetensors weights, in pipeline
 * order (model_index.json is read by the library: ddo_pipeline_create). Prints the reason on
 * failure. */
static int pipeline_components(const char *dir, pipe_component **out, size_t *count)
{
    ddo_pipeline *pipe = NULL;
    int rc = ddo_pipeline_create(dir, &pipe);
    if (rc != 0) {
        fprintf(stderr, "ddo run: %s\n", ddo_last_error());
        return rc;
    }
    size_t n = ddo_pipeline_component_count(pipe), k = 0;
    pipe_component *c = calloc(n > 0 ? n : 1, sizeof *c);
    if (c == NULL) {
        ddo_pipeline_destroy(pipe);
        return DDO_E_NO_MEMORY;
    }
    for (size_t i = 0; i < n; i++) {
        ddo_pipeline_component_info pc;
        if (ddo_pipeline_component(pipe, i, &pc) != 0 || !pc.has_weights)
            continue;
        snprintf(c[k].name, sizeof c[k].name, "%s", pc.name); /* at most 255 bytes */
        c[k].rank = component_rank(pc.name);
        c[k].pos = i;
        k++;
    }
    ddo_pipeline_destroy(pipe);
    if (k == 0) {
        fprintf(stderr, "ddo run: %s/model_index.json: no component folder holds safetensors\n",
                dir);
        free(c);
        return DDO_E_NOT_FOUND;
    }
    qsort(c, k, sizeof *c, cmp_component);
    *out = c;
    *count = k;
    return 0;
}

/* A component's configuration for its policy (route and unit granularity); *what describes
 * it. */
static int component_config(const ddo_config *cfg, const ddo_component_policy *pol,
                            ddo_config **out, const char **what)
{
    ddo_config *c = NULL;
    int rc = ddo_config_clone(cfg, &c);
    if (rc != 0)
        return rc;
    if (strcmp(pol->route, "none") == 0) {
        *what = "unmanaged: everything resident";
        rc = ddo_config_set(c, "always_resident_modules_pattern", ".*");
    } else {
        bool leaf = pol->unit_granularity != NULL && strcmp(pol->unit_granularity, "leaf") == 0;
        if (strcmp(pol->route, "diffusers_group_offload") == 0)
            *what = leaf ? "group-offload compatibility: streamed per leaf module"
                         : "group-offload compatibility: streamed per block";
        else
            *what = leaf ? "streamed by ddo per leaf module" : "streamed by ddo per block";
        if (pol->unit_granularity != NULL && pol->unit_granularity[0] != '\0')
            rc = ddo_config_set(c, "unit_granularity", pol->unit_granularity);
    }
    if (rc != 0) {
        ddo_config_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

static int run_pipeline(run_ctx *ctx, const char *dir)
{
    pipe_component *comps = NULL;
    size_t n = 0;
    if (pipeline_components(dir, &comps, &n) != 0)
        return DDO_EXIT_FAILURE;
    run_result *res = calloc(n, sizeof *res);
    const char **routes = calloc(n, sizeof *routes);
    if (res == NULL || routes == NULL) {
        free(res);
        free(routes);
        free(comps);
        fprintf(stderr, "ddo run: out of memory\n");
        return DDO_EXIT_FAILURE;
    }
    printf("pipeline: %s: %zu components in order:", dir, n);
    for (size_t i = 0; i < n; i++)
        printf(" %s", comps[i].name);
    printf("\n");
    int status = 0;
    for (size_t i = 0; i < n && status == 0; i++) {
        ddo_component_policy pol;
        int rc = ddo_config_component_policy(ctx->cfg, comps[i].name, NULL, false, &pol);
        if (rc != 0) {
            fail_msg(comps[i].name, rc, ddo_config_error(ctx->cfg));
            status = DDO_EXIT_FAILURE;
            break;
        }
        const char *route = pol.route;
        routes[i] = route;
        const char *what = "";
        ddo_config *ccfg = NULL;
        rc = component_config(ctx->cfg, &pol, &ccfg, &what);
        if (rc != 0) {
            fail_msg(comps[i].name, rc, ddo_last_error());
            status = DDO_EXIT_FAILURE;
            break;
        }
        printf("\n== component %zu/%zu: %s (route %s from %s: %s) ==\n", i + 1, n, comps[i].name,
               route, pol.route_source, what);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, comps[i].name);
        ctx->baseline_used = device_used(ctx->dev);
        status = run_checkpoint(ctx, path, comps[i].name, ccfg, &res[i]);
        ddo_config_destroy(ccfg);
        if (status == 0 && res[i].device_used_after != 0) {
            char b[32];
            fprintf(stderr,
                    "ddo run: component %s left %s on the device after its session was "
                    "destroyed\n",
                    comps[i].name, fmt_bytes((double)res[i].device_used_after, b, sizeof b));
            status = DDO_EXIT_FAILURE;
        }
    }
    if (status == 0) {
        char b1[32], b2[32], b3[32];
        uint64_t peak = 0, sum = 0, wpeak = 0, wsum = 0;
        size_t largest = 0;
        printf("\npipeline peaks (each component unloaded before the next loads):\n");
        printf("  %-20s %-24s %12s %14s %14s\n", "component", "route", "weights", "weights peak",
               "device peak");
        for (size_t i = 0; i < n; i++) {
            printf("  %-20s %-24s %12s %14s %14s\n", comps[i].name, routes[i],
                   fmt_bytes((double)res[i].total_bytes, b1, sizeof b1),
                   fmt_bytes((double)res[i].weights_peak, b2, sizeof b2),
                   fmt_bytes((double)res[i].device_used_peak, b3, sizeof b3));
            if (res[i].weights_peak > wpeak) {
                wpeak = res[i].weights_peak;
                largest = i;
            }
            wsum += res[i].weights_peak;
            if (res[i].device_used_peak > peak)
                peak = res[i].device_used_peak;
            sum += res[i].device_used_peak;
        }
        /* The sessions never overlap (checked above: each one returned the device to its
         * baseline), so the pipeline's peak is the largest component's. */
        printf("  pipeline weights peak %s (%" PRIu64 " bytes) = largest component (%s); all at "
               "once would be %s (%" PRIu64 " bytes)\n",
               fmt_bytes((double)wpeak, b1, sizeof b1), wpeak, comps[largest].name,
               fmt_bytes((double)wsum, b2, sizeof b2), wsum);
        if (sum > 0)
            printf("  pipeline device peak %s (%" PRIu64 " bytes; sum of components %s)\n",
                   fmt_bytes((double)peak, b1, sizeof b1), peak,
                   fmt_bytes((double)sum, b2, sizeof b2));
        printf("peak check: OK: every component released its device memory before the next "
               "loaded\n");
    }
    free(routes);
    free(res);
    free(comps);
    return status;
}

/* ---- the command ------------------------------------------------------------------- */

static bool is_pipeline_dir(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return false;
    char p[4096];
    snprintf(p, sizeof p, "%s/model_index.json", path);
    return access(p, R_OK) == 0;
}

/* The flags of `ddo run` left after the configuration's (PATH, --steps, ...) into a. */
static int parse_flags(int argc, char **argv, run_args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--verify") == 0) {
            a->verify = true;
        } else if (strcmp(arg, "--show-profile") == 0) {
            a->show_profile = true;
        } else if (strcmp(arg, "--steps") == 0) {
            if (tool_flag_count("run", arg, val, 1, 1000000, &a->steps) != 0)
                return -1;
            i++;
        } else if (strcmp(arg, "--tokens") == 0) {
            if (tool_flag_count("run", arg, val, 1, 65536, &a->tokens) != 0)
                return -1;
            i++;
        } else if (strcmp(arg, "--metrics") == 0) {
            if (val == NULL) {
                fprintf(stderr, "ddo run: --metrics needs a file\n");
                return -1;
            }
            a->metrics_path = val;
            i++;
        } else if (strcmp(arg, "--cpu-gbps") == 0 || strcmp(arg, "--cpu-gflops") == 0 ||
                   strcmp(arg, "--cpu-memory-gb") == 0) {
            if (tool_device_flag("run", arg, val, &a->cpu) != 0)
                return -1;
            i++;
        } else if (strcmp(arg, "--file-read-gbps") == 0) {
            if (tool_flag_real("run", arg, val, 0.001, TOOL_MAX_GBPS, &a->file_gbps) != 0)
                return -1;
            i++;
        } else if (arg[0] == '-') {
            fprintf(stderr, "ddo run: unknown option '%s' (see ddo run --help)\n", arg);
            return -1;
        } else if (a->path == NULL) {
            a->path = arg;
        } else {
            fprintf(stderr, "ddo run: one PATH only ('%s' is extra)\n", arg);
            return -1;
        }
    }
    if (a->path == NULL) {
        usage(stderr);
        return -1;
    }
    return 0;
}

/*
 * The setup on the device execution_device names: the default cuda:0 stands down to the cpu
 * device when there is no CUDA device (said on stderr), an explicit one does not.
 */
static int open_setup(const ddo_config *cfg, run_args *a, ddo_setup **setup)
{
    ddo_device_options dopt = DDO_DEVICE_OPTIONS_INIT;
    dopt.cpu = &a->cpu;
    ddo_setup_options so = DDO_SETUP_OPTIONS_INIT;
    so.device_options = &dopt;
    so.envp = (const char *const *)environ; /* DDO_PROFILE_DIR, HOME */
    int rc = ddo_setup_create(cfg, &so, setup);
    if (rc != 0) {
        const char *spec = NULL;
        ddo_config_get(cfg, "execution_device", &spec);
        fail_msg(spec != NULL && spec[0] != '\0' ? spec : "cuda:0", rc, ddo_last_error());
        return rc;
    }
    if (ddo_setup_note(*setup)[0] != '\0')
        fprintf(stderr, "ddo run: %s\n", ddo_setup_note(*setup));
    return 0;
}

int ddo_cmd_run(int argc, char **argv)
{
    run_args a;
    memset(&a, 0, sizeof a);
    a.cpu = (ddo_cpu_options)DDO_CPU_OPTIONS_INIT;
    a.steps = 3;
    a.tokens = 16;
    ddo_config *cfg = NULL;
    ddo_setup *setup = NULL;
    int status = DDO_EXIT_USAGE;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return DDO_EXIT_OK;
        }
    }
    int rc = tool_config_create(&cfg);
    if (rc != 0) {
        fail_msg("configuration", rc, ddo_last_error());
        return DDO_EXIT_FAILURE;
    }
    rc = ddo_config_apply_env(cfg, (const char *const *)environ);
    if (rc == 0)
        rc = ddo_config_parse_args(cfg, &argc, argv);
    if (rc != 0) {
        fprintf(stderr, "ddo run: %s\n", ddo_config_error(cfg));
        goto out;
    }
    for (size_t i = 0; i < ddo_config_warning_count(cfg); i++)
        fprintf(stderr, "ddo run: warning: %s\n", ddo_config_warning(cfg, i));

    if (parse_flags(argc, argv, &a) != 0)
        goto out;
    status = DDO_EXIT_FAILURE;
    rc = ddo_config_validate(cfg);
    if (rc != 0) {
        fprintf(stderr, "ddo run: %s\n", ddo_config_error(cfg));
        goto out;
    }
    if (a.metrics_path != NULL && tool_check_output_file("run", "--metrics", a.metrics_path) != 0)
        goto out;
    bool show = false;
    const char *src = NULL;
    if (ddo_config_get_bool(cfg, "show_profile", &show) == 0 &&
        ddo_config_source(cfg, "show_profile", &src) == 0 && src != NULL &&
        strcmp(src, "default") != 0 && show)
        a.show_profile = true;
    const char *corrupt_env = getenv("DDO_TEST_CORRUPT");
    if (corrupt_env != NULL && tool_parse_u64(corrupt_env, &a.corrupt_step) != 0)
        a.corrupt_step = 0;

    if (open_setup(cfg, &a, &setup) != 0)
        goto out;
    run_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.args = &a;
    ctx.cfg = cfg;
    ctx.setup = setup;
    ctx.dev = ddo_setup_device(setup);
    if (ddo_device_caps_get(ctx.dev, &ctx.caps) != 0)
        memset(&ctx.caps, 0, sizeof ctx.caps);
    ctx.baseline_used = device_used(ctx.dev);
    if (is_pipeline_dir(a.path)) {
        status = run_pipeline(&ctx, a.path);
    } else {
        run_result res;
        status = run_checkpoint(&ctx, a.path, NULL, cfg, &res);
    }
out:
    ddo_setup_destroy(setup);
    ddo_config_destroy(cfg);
    return status;
}
