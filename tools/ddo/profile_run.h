/*
 * profile_run.h - capacity profiles inside `ddo run` (and `ddo profile build`): what the
 * library's host layer did with the named workload's profile (ddo_setup_profile_apply before
 * planning, ddo_setup_profile_record after a calibration's steps), said in one line each.
 */
#ifndef DDO_TOOL_PROFILE_RUN_H
#define DDO_TOOL_PROFILE_RUN_H

#include "ddo_host.h"

#include <stdbool.h>

typedef struct tool_profile {
    bool active;      /* profile_name is set */
    bool calibrating; /* build_profile */
    char name[128];   /* escaped for messages */
    ddo_profile_status status;
    double budget_gb;
    ddo_profile_measured measured;
} tool_profile;

/* Applies the workload profile of cfg (profile_name / build_profile) for checkpoint ck through
 * setup and prints one line saying what it did. 0, or a ddo error (bad profile options). */
int tool_profile_prepare(tool_profile *tp, ddo_setup *setup, ddo_config *cfg,
                         const ddo_checkpoint *ck);
/* After a calibration's steps: records what cal measured and the next run's recommendation. */
int tool_profile_finish(const tool_profile *tp, ddo_setup *setup, const ddo_config *cfg,
                        ddo_profile_calibration *cal);

#endif /* DDO_TOOL_PROFILE_RUN_H */
