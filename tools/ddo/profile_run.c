/*
 * profile_run.c - capacity profiles inside `ddo run` (see profile_run.h).
 */
#include "profile_run.h"

#include "cleanup.h"
#include "tool.h"

#include <stdio.h>
#include <string.h>

int tool_profile_prepare(tool_profile *tp, ddo_setup *setup, ddo_config *cfg,
                         const ddo_checkpoint *ck)
{
    memset(tp, 0, sizeof(*tp));
    const char *name = NULL;
    bool build = false;
    ddo_config_get(cfg, "profile_name", &name);
    ddo_config_get_bool(cfg, "build_profile", &build);
    tp->active = name != NULL && name[0] != '\0';
    tp->calibrating = tp->active && build;
    if (tp->active)
        tool_quote(name, tp->name, sizeof(tp->name)); /* for messages: one line, escaped */
    int rc = ddo_setup_profile_apply(setup, cfg, ck, &tp->status, &tp->budget_gb, &tp->measured);
    if (rc != 0) {
        if (tp->active)
            fprintf(stderr, "ddo run: profile '%s': %s\n", tp->name, ddo_last_error());
        else
            fprintf(stderr, "ddo run: %s\n", ddo_last_error());
        return rc;
    }
    const char *dir = ddo_setup_profile_dir(setup);
    switch (tp->status) {
    case DDO_PROFILE_CALIBRATING:
        printf("profile '%s': calibrating: zero resident weights, the peak is measured and the "
               "next run's budget saved in %s\n",
               tp->name, dir);
        break;
    case DDO_PROFILE_MANUAL:
        printf("profile '%s': a manual resident_module_budget_gb of %.4f GiB wins over the "
               "profile\n",
               tp->name, tp->budget_gb);
        break;
    case DDO_PROFILE_MISSING:
        printf("profile '%s': no usable recommendation in %s (%s); calibrate with "
               "`ddo profile build %s PATH`\n",
               tp->name, dir, ddo_last_error(), tp->name);
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

int tool_profile_finish(const tool_profile *tp, ddo_setup *setup, const ddo_config *cfg,
                        ddo_profile_calibration *cal)
{
    if (!tp->active || !tp->calibrating)
        return 0;
    char *path = NULL;
    /* SIGINT/SIGTERM/SIGHUP wait until the profile is replaced (and its lock released). */
    tool_sigmask mask;
    tool_signals_defer(&mask);
    int rc = ddo_setup_profile_record(setup, cfg, cal, &path);
    tool_signals_resume(&mask);
    if (rc != 0) {
        fprintf(stderr, "ddo run: profile '%s': %s\n", tp->name, ddo_last_error());
        return rc;
    }
    printf("profile '%s': saved: peak %.4f GiB of %.4f GiB, headroom %.4f GiB -> next run's "
           "resident budget %.4f GiB (%s)\n",
           tp->name, cal->peak_gb, cal->total_gb, cal->headroom_gb, cal->budget_gb, path);
    ddo_free(path);
    return 0;
}
