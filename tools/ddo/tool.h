/*
 * tool.h - the ddo command-line tool: one file per command (cmd_<name>.c),
 * each an `int ddo_cmd_<name>(int argc, char **argv)` returning the exit
 * status (0 success, 1 failure, 2 usage error). The tool uses only ddo.h.
 */
#ifndef DDO_TOOL_H
#define DDO_TOOL_H

#include "ddo.h"

#define DDO_EXIT_OK      0
#define DDO_EXIT_FAILURE 1
#define DDO_EXIT_USAGE   2

#define DDO_TOOL_COMMANDS(X)                                                                     \
    X(inspect, "inspect PATH [--json]: the tensors, dtypes and block groups of a checkpoint")    \
    X(config, "config [--ddo-* flags] [--json] [--list]: resolved settings and their sources")   \
    X(plan, "plan PATH [--ddo-* flags] [...]: what will be resident, streamed, pinned, and why") \
    X(synth,                                                                                     \
      "synth --layout FILE --out PATH [--scale S] [--seed N]: write a synthetic checkpoint")     \
    X(run, "run PATH [--ddo-* flags] [--steps N] [--tokens T] [--verify]: the reference host")   \
    X(demo, "demo: synthesise a small real-layout model and stream it, verified")                \
    X(bench, "bench PATH | --layout FILE [...]: bus limit, resident and streamed step times")    \
    X(doctor, "doctor [PATH] [--json]: what this machine can do, and what auto would plan")      \
    X(profile, "profile list | show NAME | build NAME PATH | rm NAME: capacity profiles")

#define DDO_TOOL_DECLARE_(name, help) int ddo_cmd_##name(int argc, char **argv);
DDO_TOOL_COMMANDS(DDO_TOOL_DECLARE_)
#undef DDO_TOOL_DECLARE_

/* The kernel release says WSL ("microsoft" or "wsl", any case). */
int ddo_tool_running_on_wsl(void);

/* Small helpers shared by the commands (util.c). */
#include <stddef.h>
#include <stdint.h>
/* Monotonic clock, ns. */
uint64_t tool_now_ns(void);
/* A whole non-negative decimal number; -1 when s is not one. */
int tool_parse_u64(const char *s, uint64_t *out);
/* A finite number >= 0; -1 when s is not one. */
int tool_parse_double(const char *s, double *out);
/* A numeric metric of a snapshot, 0 when absent. */
double tool_metric(const ddo_metrics *m, const char *name);
/* Available host RAM (MemAvailable), bytes; 0 when unknown. */
uint64_t tool_host_available_bytes(void);
/* Plan inputs from a device's capabilities (device fields) and the host's available RAM;
 * the cost-model fields and tokens are left 0. */
void tool_plan_inputs(ddo_plan_inputs *in, const ddo_device_caps *caps);
/* Formats fmt into err (when given) and returns code. */
int tool_fail(char *err, size_t err_len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* DDO_TOOL_H */
