/*
 * profile_run.h - capacity profiles inside `ddo run` (and `ddo profile build`):
 * the named workload's recommendation applied before planning, and a
 * calibration run's measurement saved after the steps.
 */
#ifndef DDO_TOOL_PROFILE_RUN_H
#define DDO_TOOL_PROFILE_RUN_H

#include "ddo.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct tool_profile {
    bool active;      /* profile_name is set */
    bool calibrating; /* build_profile */
    char name[128];
    char *dir;
    char *context;
    ddo_profile_status status;
    double budget_gb;
    ddo_profile_measured measured;
} tool_profile;

/* What a calibration run measured. */
typedef struct tool_profile_run {
    uint64_t total_bytes;   /* device memory */
    uint64_t baseline_used; /* device bytes used before the session (other users) */
    uint64_t used_peak;     /* device bytes used above the baseline, sampled during the run */
    uint64_t used_end;      /* above the baseline at the end of the steps */
    uint64_t weights_peak;  /* the session's device_weights_peak_bytes */
    double achieved_bytes_per_s;
    double file_read_bytes_per_s;
    double flops_per_s;
} tool_profile_run;

/* Applies the workload profile of cfg (profile_name / build_profile) for checkpoint ck and
 * prints one line saying what it did. 0, or a ddo error (bad profile options). */
int tool_profile_prepare(tool_profile *tp, ddo_config *cfg, const ddo_checkpoint *ck);
/* After a calibration's steps: records the observation and the next run's recommendation. */
int tool_profile_finish(tool_profile *tp, const ddo_config *cfg, const tool_profile_run *r);
void tool_profile_free(tool_profile *tp);

#endif /* DDO_TOOL_PROFILE_RUN_H */
