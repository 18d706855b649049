/*
 * tool.h - the ddo command-line tool: one file per command (cmd_<name>.c),
 * each an `int ddo_cmd_<name>(int argc, char **argv)` returning the exit
 * status (0 success, 1 failure, 2 usage error). The tool uses the public headers (ddo.h,
 * ddo_host.h, ddo_compat.h) and the private support library's support.h (text helpers, the
 * CUDA driver's entry points); inspect_codec.c also src/codec/codec.h (the encoder and the C
 * decoder).
 */
#ifndef DDO_TOOL_H
#define DDO_TOOL_H

#include "ddo.h"
#include "ddo_compat.h"
#include "ddo_host.h"
#include "support.h"

#define DDO_EXIT_OK      0
#define DDO_EXIT_FAILURE 1
#define DDO_EXIT_USAGE   2

#define DDO_TOOL_COMMANDS(X)                                                                     \
    X(inspect, "inspect PATH [--json] [--codec]: tensors, dtypes, block groups (coded ratio)")   \
    X(config, "config [--ddo-* flags] [--json] [--list]: resolved settings and their sources")   \
    X(plan, "plan PATH [--ddo-* flags] [...]: what will be resident, streamed, pinned, and why") \
    X(synth,                                                                                     \
      "synth --layout FILE --out PATH [--scale S] [--values V] [--threads N]: synthetic file")   \
    X(run, "run PATH [--ddo-* flags] [--steps N] [--tokens T] [--verify]: the reference host")   \
    X(demo, "demo: synthesise a small real-layout model and stream it, verified")                \
    X(bench, "bench PATH | --layout FILE [...]: bus limit, resident and streamed step times")    \
    X(doctor, "doctor [PATH] [--json]: what this machine can do, and what auto would plan")      \
    X(profile, "profile list | show NAME | build NAME PATH | rm NAME: capacity profiles")

#define DDO_TOOL_DECLARE_(name, help) int ddo_cmd_##name(int argc, char **argv);
DDO_TOOL_COMMANDS(DDO_TOOL_DECLARE_)
#undef DDO_TOOL_DECLARE_

/* Small helpers shared by the commands (util.c). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
/* Monotonic clock, ns. */
uint64_t tool_now_ns(void);
/* Reads a regular file of at most max_bytes into a NUL-terminated buffer (free it); opens
 * without blocking, so a FIFO or device is refused instead of waited on. NULL with errno set
 * (EFBIG when too large, EINVAL when not a regular file). */
char *tool_read_file(const char *path, size_t max_bytes);
/* A whole non-negative decimal number (digits only); -1 when s is not one. */
int tool_parse_u64(const char *s, uint64_t *out);
/* A finite decimal number >= 0 (no spaces, hex, inf or nan); -1 when s is not one. */
int tool_parse_double(const char *s, double *out);
/*
 * The one check of the tool's numeric flags, before any cast: text must be a decimal number
 * (tool_flag_real: finite, sign/point/exponent allowed; tool_flag_count: digits only) within
 * [lo, hi]. Otherwise prints `ddo CMD: FLAG "TEXT": expected ... from LO to HI` (one line, the
 * value escaped) and returns -1 (a usage error).
 */
int tool_flag_real(const char *cmd, const char *flag, const char *text, double lo, double hi,
                   double *out);
int tool_flag_count(const char *cmd, const char *flag, const char *text, uint64_t lo, uint64_t hi,
                    uint64_t *out);
/* The largest values the tool's flags take: 1 PiB of memory, 1 PB/s, 1 EFLOP/s. */
#define TOOL_MAX_MEMORY_GB 1048576.0
#define TOOL_MAX_GBPS      1e6
#define TOOL_MAX_GFLOPS    1e9
/* A throttle rate: 0 (off) or a number from 0.001 to hi (a smaller rate would stall forever). */
int tool_flag_rate(const char *cmd, const char *flag, const char *text, double hi, double *out);
/* The cpu device's flags --cpu-gbps, --cpu-gflops and --cpu-memory-gb into o: 0, -1 after
 * printing the error, 1 when flag is none of them. */
int tool_device_flag(const char *cmd, const char *flag, const char *text, ddo_cpu_options *o);
/* A configuration told the facts of this machine it resolves settings from (WSL, from
 * ddo_host_info_get): what every command starts from. */
int tool_config_create(ddo_config **cfg);
/* Opens path for appending (created when missing) and closes it again, so an output file
 * that cannot be written is reported before a run instead of after it. 0, or -1 after
 * printing `ddo CMD: FLAG "PATH": cannot write: REASON`. */
int tool_check_output_file(const char *cmd, const char *flag, const char *path);
/* s escaped for a one-line message (\n, \x1b, \", cut with "..." to fit len); returns buf. */
const char *tool_quote(const char *s, char *buf, size_t len);
/* A numeric metric of a snapshot, 0 when absent. */
double tool_metric(const ddo_metrics *m, const char *name);
/* A tensor's placement and unit in plan (ddo_plan_tensor_location): DDO_PLACEMENT_SKIPPED and
 * SIZE_MAX for a tensor out of range; the unit is SIZE_MAX unless the tensor is streamed. */
ddo_placement tool_placement(const ddo_plan *plan, size_t tensor);
size_t tool_unit(const ddo_plan *plan, size_t tensor);
/* The value of a planner decision, for display only (the plan's facts are in ddo_plan_info),
 * or NULL when the plan did not record it. */
const char *tool_decision(const ddo_plan *plan, const char *key);
/* Formats fmt into err (when given) and returns code. */
#if defined(__MINGW32__)
int tool_fail(char *err, size_t err_len, int code, const char *fmt, ...)
    __attribute__((format(gnu_printf, 4, 5)));
#else
int tool_fail(char *err, size_t err_len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#endif

#endif /* DDO_TOOL_H */
