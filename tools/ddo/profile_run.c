/*
 * profile_run.c - capacity profiles inside `ddo run` (see profile_run.h).
 */
#include "profile_run.h"

#include "cleanup.h"
#include "tool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GIB_D 1073741824.0

int tool_profile_prepare(tool_profile *tp, ddo_config *cfg, const ddo_checkpoint *ck)
{
    memset(tp, 0, sizeof(*tp));
    const char *name = NULL;
    bool build = false;
    ddo_config_get(cfg, "profile_name", &name);
    ddo_config_get_bool(cfg, "build_profile", &build);
    if (name == NULL || name[0] == '\0') {
        if (build) {
            fprintf(stderr, "ddo run: --ddo-build-profile needs --ddo-profile-name NAME\n");
            return DDO_E_CONFIG;
        }
        return 0;
    }
    tp->active = true;
    tp->calibrating = build;
    tool_quote(name, tp->name, sizeof(tp->name)); /* for messages: one line, escaped */
    const char *explicit_dir = NULL;
    ddo_config_get(cfg, "profile_dir", &explicit_dir);
    int rc = ddo_profile_dir(explicit_dir, getenv("DDO_PROFILE_DIR"), getenv("HOME"), &tp->dir);
    if (rc == 0)
        rc = ddo_profile_workload_context(name, ck, &tp->context);
    /* A calibration saves at its end: an unwritable directory is refused before the run. */
    if (rc == 0 && build)
        rc = ddo_profile_check_writable(tp->dir);
    if (rc == 0)
        rc = ddo_profile_apply(cfg, tp->dir, tp->context, &tp->status, &tp->budget_gb,
                               &tp->measured);
    if (rc != 0) {
        fprintf(stderr, "ddo run: profile '%s': %s\n", tp->name, ddo_last_error());
        return rc;
    }
    switch (tp->status) {
    case DDO_PROFILE_CALIBRATING:
        printf("profile '%s': calibrating: zero resident weights, the peak is measured and the "
               "next run's budget saved in %s\n",
               tp->name, tp->dir);
        break;
    case DDO_PROFILE_MANUAL:
        printf("profile '%s': a manual resident_module_budget_gb of %.4f GiB wins over the "
               "profile\n",
               tp->name, tp->budget_gb);
        break;
    case DDO_PROFILE_MISSING:
        printf("profile '%s': no usable recommendation in %s (%s); calibrate with "
               "`ddo profile build %s PATH`\n",
               tp->name, tp->dir, ddo_last_error(), tp->name);
        break;
    case DDO_PROFILE_APPLIED:
        printf("profile '%s': resident budget %.4f GiB from the last calibration", tp->name,
               tp->budget_gb);
        if (tp->measured.bus_bytes_per_s > 0)
            printf("; measured bus %.2f GB/s", tp->measured.bus_bytes_per_s / 1e9);
        printf("\n");
        break;
    case DDO_PROFILE_DISABLED:
        break;
    }
    return 0;
}

int tool_profile_finish(tool_profile *tp, const ddo_config *cfg, const tool_profile_run *r)
{
    if (!tp->active || !tp->calibrating)
        return 0;
    double headroom = 1.0;
    ddo_config_get_double(cfg, "profile_vram_headroom_gb", &headroom);
    ddo_profile_sample smp;
    memset(&smp, 0, sizeof(smp));
    smp.total_bytes = r->total_bytes;
    smp.free_start_bytes =
        r->total_bytes > r->baseline_used ? r->total_bytes - r->baseline_used : 0;
    uint64_t end_used = r->baseline_used + r->used_end;
    smp.free_end_bytes = r->total_bytes > end_used ? r->total_bytes - end_used : 0;
    smp.held_start_bytes = 0;
    smp.held_peak_bytes = r->weights_peak;
    smp.sampled_used_peak_bytes = r->baseline_used + r->used_peak;
    double peak = ddo_profile_peak_gb(&smp);
    double total = (double)r->total_bytes / GIB_D;
    double budget = ddo_profile_recommend_resident_budget(total, peak, headroom);
    char obs[512], rec[512];
    snprintf(obs, sizeof(obs),
             "{\"status\":\"success\",\"peak_vram_gb\":%.4f,\"total_vram_gb\":%.4f,"
             "\"headroom_gb\":%.4f,\"profile_measurement_kind\":\"baseline\","
             "\"measurement\":\"driver_free_sampled_plus_session_weights\","
             "\"achieved_bytes_per_s\":%.6g}",
             peak, total, headroom, r->achieved_bytes_per_s);
    int n = snprintf(rec, sizeof(rec), "{\"profile_resident_module_budget_gb\":%.4f", budget);
    if (r->achieved_bytes_per_s > 0)
        n += snprintf(rec + n, sizeof(rec) - (size_t)n, ",\"bus_bytes_per_s\":%.6g",
                      r->achieved_bytes_per_s);
    if (r->file_read_bytes_per_s > 0)
        n += snprintf(rec + n, sizeof(rec) - (size_t)n, ",\"file_read_bytes_per_s\":%.6g",
                      r->file_read_bytes_per_s);
    if (r->flops_per_s > 0)
        n += snprintf(rec + n, sizeof(rec) - (size_t)n, ",\"flops_per_s\":%.6g", r->flops_per_s);
    snprintf(rec + n, sizeof(rec) - (size_t)n, "}");
    char *path = NULL;
    /* SIGINT/SIGTERM/SIGHUP wait until the profile is replaced (and its lock released). */
    tool_sigmask mask;
    tool_signals_defer(&mask);
    int rc = ddo_profile_record(tp->dir, tp->context, obs, rec, &path);
    tool_signals_resume(&mask);
    if (rc != 0) {
        fprintf(stderr, "ddo run: profile '%s': %s\n", tp->name, ddo_last_error());
        return rc;
    }
    printf("profile '%s': saved: peak %.4f GiB of %.4f GiB, headroom %.4f GiB -> next run's "
           "resident budget %.4f GiB (%s)\n",
           tp->name, peak, total, headroom, budget, path);
    ddo_free(path);
    return 0;
}

void tool_profile_free(tool_profile *tp)
{
    ddo_free(tp->dir);
    ddo_free(tp->context);
    memset(tp, 0, sizeof(*tp));
}
