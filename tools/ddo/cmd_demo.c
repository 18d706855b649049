/*
 * cmd_demo.c - `ddo demo`: the README's main job in one command. Synthesises
 * a small model with the exact tensor layout of Flux.1-dev (the layout file
 * kept in data/layouts/) in a temporary directory, streams it through a
 * device budget of a quarter of the model on the best device available
 * (cuda:0 when a GPU answers, else cpu), verifies every step's output
 * bit-identical against a reference, prints the profile, and always removes
 * the temporary directory (also when SIGINT, SIGTERM or SIGHUP ends it).
 */
#include "cleanup.h"
#include "compat.h"
#include "host.h"
#include "synth.h"
#include "tool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)

static void usage(FILE *out)
{
    fprintf(out, "usage: ddo demo [--scale S] [--steps N] [--tokens T] [--device SPEC]\n"
                 "                [--layout FILE] [--keep]\n\n"
                 "Synthesises a small model with Flux.1-dev's exact tensor layout (scale 0.15,\n"
                 "a few hundred MiB) in a temporary directory, streams it on cuda:0 (or the cpu\n"
                 "device when no GPU answers) inside a device budget of a quarter of the model,\n"
                 "verifies every step bit-identical against a reference, prints the profile and\n"
                 "removes the directory. Exit 0 only when verified.\n");
}

/* The --ddo-* flags of the demo's run, with the budget in GiB as text: the model is retained
 * in host RAM and registered (what a user with the RAM does), streamed through the budget. */
#define DEMO_FLAGS(device, budget)                                                       \
    "--ddo-execution-device", (device), "--ddo-backend", "vmm", "--ddo-preset", "auto",  \
        "--ddo-small-tensor-threshold-kb", "16", "--ddo-vmm-staging-buffer-gb", "0.125", \
        "--ddo-vmm-source-cache-gb", "1", "--ddo-pin-cpu-memory", "1",                   \
        "--ddo-vmm-resident-weight-budget-gb", (budget)

/* Builds the plan `ddo run` will build (environment, then the demo's flags) for budget_gb on
 * the setup's device; returns the plan's code. */
static int try_plan(ddo_setup *setup, const ddo_checkpoint *ck, char *device, double budget_gb,
                    uint64_t tokens, ddo_plan_budgets *out)
{
    ddo_config *cfg = NULL;
    ddo_plan *plan = NULL;
    char v[64];
    snprintf(v, sizeof v, "%.6f", budget_gb);
    char *args[] = { "demo", DEMO_FLAGS(device, v), NULL };
    int nargs = (int)(sizeof args / sizeof args[0]) - 1;
    int rc = ddo_config_create(&cfg);
    if (rc == 0)
        rc = ddo_config_apply_env(cfg, TOOL_ENVIRON);
    if (rc == 0)
        rc = ddo_config_parse_args(cfg, &nargs, args);
    if (rc == 0)
        rc = ddo_config_validate(cfg);
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    if (rc == 0)
        rc = ddo_setup_plan_inputs(setup, &in);
    if (rc == 0) {
        in.tokens = tokens;
        rc = ddo_setup_plan(setup, ck, cfg, &in, &plan);
    }
    if (rc == 0)
        rc = ddo_plan_budgets_get(plan, out);
    ddo_plan_destroy(plan);
    ddo_config_destroy(cfg);
    return rc;
}

/* A quarter of the model, or the nearest budget at which every unit still fits two execution
 * slots beside the resident tensors; -1 after a message when no budget plans. */
static int choose_budget(ddo_setup *setup, const ddo_checkpoint *ck, char *device,
                         const ddo_device_caps *caps, uint64_t tokens, double *budget_gb,
                         ddo_plan_budgets *b)
{
    uint64_t total = ddo_checkpoint_total_bytes(ck);
    double quarter_gb = (double)total / 4.0 / GIB;
    *budget_gb = quarter_gb;
    memset(b, 0, sizeof *b);
    int rc = try_plan(setup, ck, device, *budget_gb, tokens, b);
    if (rc == 0 && b->slot_count >= 2)
        return 0;
    ddo_plan_budgets big;
    memset(&big, 0, sizeof big);
    if (try_plan(setup, ck, device, (double)total / GIB * 2.0 + 1.0, tokens, &big) != 0) {
        fprintf(stderr, "ddo demo: no plan: %s\n", ddo_last_error());
        return -1;
    }
    double need = (double)(big.resident_bytes + 2 * big.slot_bytes);
    need += (double)(caps->granularity ? caps->granularity : 2u << 20);
    *budget_gb = need / GIB;
    if (try_plan(setup, ck, device, *budget_gb, tokens, b) != 0) {
        fprintf(stderr, "ddo demo: no plan at %.3f GiB: %s\n", *budget_gb, ddo_last_error());
        return -1;
    }
    printf("   a quarter of the model (%.1f MiB) cannot hold two slots of the largest unit "
           "beside the resident tensors; using the nearest budget that does: %.1f MiB\n",
           quarter_gb * GIB / MIB, *budget_gb * GIB / MIB);
    return 0;
}

typedef struct demo_args {
    double scale;
    uint64_t steps, tokens;
    const char *device, *layout;
    bool keep;
} demo_args;

/* 1 to continue, else the exit status (help, or a usage error already printed). */
static int parse_demo_args(int argc, char **argv, demo_args *a)
{
    *a = (demo_args){ 0.15, 2, 8, NULL, NULL, false };
    for (int i = 1; i < argc; i++) {
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return DDO_EXIT_OK;
        } else if (strcmp(argv[i], "--keep") == 0) {
            a->keep = true;
        } else if (strcmp(argv[i], "--scale") == 0) {
            if (tool_flag_real("demo", argv[i], val, 1e-6, 1.0, &a->scale) != 0)
                return DDO_EXIT_USAGE;
            i++;
        } else if (strcmp(argv[i], "--steps") == 0 || strcmp(argv[i], "--tokens") == 0) {
            if (tool_flag_count("demo", argv[i], val, 1, 65536,
                                strcmp(argv[i], "--steps") == 0 ? &a->steps : &a->tokens) != 0)
                return DDO_EXIT_USAGE;
            i++;
        } else if (strcmp(argv[i], "--device") == 0 && val != NULL) {
            a->device = val;
            i++;
        } else if (strcmp(argv[i], "--layout") == 0 && val != NULL) {
            a->layout = val;
            i++;
        } else {
            char q[160];
            fprintf(stderr, "ddo demo: unknown or incomplete option \"%s\" (see ddo demo --help)\n",
                    tool_quote(argv[i], q, sizeof q));
            return DDO_EXIT_USAGE;
        }
    }
    return 1;
}

/* A setup on the device spec exactly (the demo's choice, not the environment's). */
static int setup_on(const char *spec, ddo_setup **setup)
{
    ddo_config *cfg = NULL;
    ddo_setup_options so = DDO_SETUP_OPTIONS_INIT;
    so.device = DDO_DEVICE_CHOICE_EXACT;
    int rc = ddo_config_create(&cfg);
    if (rc == 0)
        rc = ddo_config_set(cfg, "execution_device", spec);
    if (rc == 0)
        rc = ddo_setup_create(cfg, &so, setup);
    ddo_config_destroy(cfg);
    return rc;
}

/* The best device: --device, else cuda:0 when it answers, else cpu. Opens a setup on it into
 * *setup and writes its spec and why it was chosen; -1 after a message when it does not open. */
static int pick_device(const char *device_arg, char device[64], const char **why, ddo_setup **setup)
{
    *setup = NULL;
    if (device_arg != NULL) {
        snprintf(device, 64, "%s", device_arg);
        *why = "chosen with --device";
    } else if (setup_on("cuda:0", setup) == 0) {
        if (ref_host_cuda_available() == 0) {
            snprintf(device, 64, "cuda:0");
            *why = "a GPU answered";
        } else {
            ddo_setup_destroy(*setup);
            *setup = NULL;
            snprintf(device, 64, "cpu");
            *why = "a GPU answered but cuBLASLt (the reference host's products on cuda) was "
                   "not found; using host memory as device memory";
        }
    } else {
        snprintf(device, 64, "cpu");
        *why = "no GPU answered; host memory poses as device memory";
    }
    if (*setup == NULL && setup_on(device, setup) != 0) {
        fprintf(stderr, "ddo demo: device %s: %s\n", device, ddo_last_error());
        return -1;
    }
    return 0;
}

int ddo_cmd_demo(int argc, char **argv)
{
    demo_args da;
    int pr = parse_demo_args(argc, argv, &da);
    if (pr != 1)
        return pr;
    double scale = da.scale;
    uint64_t steps = da.steps, tokens = da.tokens;
    const char *layout = da.layout;
    bool keep = da.keep;
    if (layout == NULL)
        layout = ddo_tool_default_layout();
    if (layout == NULL || access(layout, R_OK) != 0) {
        fprintf(stderr,
                "ddo demo: the layout file %s is missing (data/layouts/flux1-dev.json "
                "of the source tree; pass --layout FILE)\n",
                layout != NULL ? layout : "flux1-dev.json");
        return DDO_EXIT_FAILURE;
    }

    char device[64];
    const char *why = "";
    ddo_setup *setup = NULL; /* kept for planning; `ddo run` opens its own */
    ddo_device_caps caps;
    memset(&caps, 0, sizeof caps);
    if (pick_device(da.device, device, &why, &setup) != 0)
        return DDO_EXIT_FAILURE;
    int rc = ddo_device_caps_get(ddo_setup_device(setup), &caps);
    if (rc != 0) {
        fprintf(stderr, "ddo demo: device %s: %s\n", device, ddo_last_error());
        ddo_setup_destroy(setup);
        return DDO_EXIT_FAILURE;
    }

    char dir[4096], model[4200];
    snprintf(dir, sizeof dir, "%s/ddo-demo-XXXXXX", tool_tmpdir());
    if (tool_mkdtemp(dir) == NULL) {
        fprintf(stderr, "ddo demo: cannot create a temporary directory %s: %s\n", dir,
                strerror(errno));
        ddo_setup_destroy(setup);
        return DDO_EXIT_FAILURE;
    }
    snprintf(model, sizeof model, "%s/flux1-dev-synth.safetensors", dir);
    /* Interrupted (SIGINT, SIGTERM, SIGHUP), the demo still removes its model and directory. */
    int dir_slot = keep ? -1 : tool_cleanup_add(dir, true);
    int model_slot = keep ? -1 : tool_cleanup_add(model, false);

    int status = DDO_EXIT_FAILURE;
    ddo_checkpoint *ck = NULL;
    printf("ddo demo: stream a model through a device budget a quarter of its size, and prove\n"
           "the output does not change.\n\n");
    printf("1. synthesise Flux.1-dev's tensor layout at scale %.2f (%s)\n", scale, layout);
    fflush(stdout);
    uint64_t t0 = tool_now_ns(), written = 0;
    char err[512] = "";
    rc = ddo_tool_synth(layout, model, scale, 1, &written, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "ddo demo: synth: %s\n", err[0] ? err : ddo_strerror(rc));
        goto out;
    }
    rc = ddo_checkpoint_create(model, DDO_READ_DEFAULT, &ck);
    if (rc != 0) {
        fprintf(stderr, "ddo demo: %s\n", ddo_last_error());
        goto out;
    }
    uint64_t total = ddo_checkpoint_total_bytes(ck);
    printf("   %s: %zu tensors, %.1f MiB, in %.1f s\n", model, ddo_checkpoint_tensor_count(ck),
           (double)total / MIB, (double)(tool_now_ns() - t0) / 1e9);

    double budget_gb = 0;
    ddo_plan_budgets b;
    if (choose_budget(setup, ck, device, &caps, tokens, &budget_gb, &b) != 0)
        goto out;
    printf("2. device %s (%s): device weight budget %.1f MiB for a %.1f MiB model (%.0f%%)\n",
           device, why, budget_gb * GIB / MIB, (double)total / MIB,
           budget_gb * GIB * 100.0 / (double)total);
    printf("3. run %llu steps (%llu tokens) on the vmm route, every block streamed through %zu "
           "execution slots,\n   then verify every step bit-identical against a reference\n\n",
           (unsigned long long)steps, (unsigned long long)tokens, b.slot_count);
    fflush(stdout);
    ddo_checkpoint_destroy(ck);
    ck = NULL;
    ddo_setup_destroy(setup);
    setup = NULL;

    char budget_s[64], steps_s[32], tokens_s[32];
    snprintf(budget_s, sizeof budget_s, "%.6f", budget_gb);
    snprintf(steps_s, sizeof steps_s, "%llu", (unsigned long long)steps);
    snprintf(tokens_s, sizeof tokens_s, "%llu", (unsigned long long)tokens);
    char *run_argv[] = { "run",     model,      DEMO_FLAGS(device, budget_s),
                         "--steps", steps_s,    "--tokens",
                         tokens_s,  "--verify", "--show-profile",
                         NULL };
    int run_argc = (int)(sizeof run_argv / sizeof run_argv[0]) - 1;
    status = ddo_cmd_run(run_argc, run_argv);
    printf("\nddo demo: %s in %.1f s\n",
           status == 0 ? "OK: streamed and verified bit-identical" : "FAILED",
           (double)(tool_now_ns() - t0) / 1e9);
out:
    ddo_checkpoint_destroy(ck);
    ddo_setup_destroy(setup);
    if (keep) {
        printf("ddo demo: kept %s\n", dir);
    } else {
        if (unlink(model) != 0 && errno != ENOENT)
            fprintf(stderr, "ddo demo: cannot remove %s: %s\n", model, strerror(errno));
        if (rmdir(dir) != 0)
            fprintf(stderr, "ddo demo: cannot remove %s: %s\n", dir, strerror(errno));
    }
    tool_cleanup_forget(model_slot);
    tool_cleanup_forget(dir_slot);
    return status;
}
