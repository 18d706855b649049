/*
 * util.c - small helpers shared by the tool's commands.
 */
#include "compat.h"
#include "tool.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int tool_config_create(ddo_config **cfg)
{
    int rc = ddo_config_create(cfg);
    ddo_host_info host;
    if (rc == 0 && ddo_host_info_get(&host) == 0)
        ddo_config_set_running_on_wsl(*cfg, host.running_on_wsl);
    return rc;
}

uint64_t tool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int tool_parse_u64(const char *s, uint64_t *out)
{
    /* digits only (ddo__decimal_syntax takes a sign, which strtoull would wrap) */
    if (s == NULL || s[0] == '+' || s[0] == '-' || !ddo__decimal_syntax(s, true))
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno != 0)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

int tool_parse_double(const char *s, double *out)
{
    if (s == NULL || !ddo__decimal_syntax(s, false))
        return -1;
    errno = 0;
    double v = strtod(s, NULL);
    if (errno != 0 || !isfinite(v) || !(v >= 0))
        return -1;
    *out = v;
    return 0;
}

const char *tool_quote(const char *s, char *buf, size_t len)
{
    ddo__quote(s, true, buf, len);
    return buf;
}

int tool_flag_real(const char *cmd, const char *flag, const char *text, double lo, double hi,
                   double *out)
{
    char q[160], a[40], b[40];
    ddo__format_real(lo, a, sizeof a);
    ddo__format_real(hi, b, sizeof b);
    double v = 0;
    if (text == NULL) {
        fprintf(stderr, "ddo %s: %s needs a value (a number from %s to %s)\n", cmd, flag, a, b);
        return -1;
    }
    bool number = ddo__decimal_syntax(text, false);
    if (number) {
        errno = 0;
        v = strtod(text, NULL);
        number = errno == 0 && isfinite(v);
    }
    if (!number || !(v >= lo && v <= hi)) {
        fprintf(stderr, "ddo %s: %s \"%s\": expected a %snumber from %s to %s\n", cmd, flag,
                tool_quote(text, q, sizeof q), number ? "" : "decimal ", a, b);
        return -1;
    }
    *out = v;
    return 0;
}

int tool_flag_count(const char *cmd, const char *flag, const char *text, uint64_t lo, uint64_t hi,
                    uint64_t *out)
{
    char q[160];
    uint64_t v = 0;
    if (text == NULL || tool_parse_u64(text, &v) != 0 || v < lo || v > hi) {
        fprintf(stderr, "ddo %s: %s \"%s\": expected a whole number from %llu to %llu\n", cmd, flag,
                tool_quote(text, q, sizeof q), (unsigned long long)lo, (unsigned long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

int tool_flag_rate(const char *cmd, const char *flag, const char *text, double hi, double *out)
{
    double v = 0;
    if (tool_flag_real(cmd, flag, text, 0.0, hi, &v) != 0)
        return -1;
    if (v > 0.0 && v < 1e-3) {
        char q[160], b[40];
        ddo__format_real(hi, b, sizeof b);
        fprintf(stderr,
                "ddo %s: %s \"%s\": expected 0 (unthrottled) or a number from 0.001 to %s\n", cmd,
                flag, tool_quote(text, q, sizeof q), b);
        return -1;
    }
    *out = v;
    return 0;
}

int tool_device_flag(const char *cmd, const char *flag, const char *text, ddo_cpu_options *o)
{
    double v = 0;
    if (strcmp(flag, "--cpu-gbps") == 0) {
        if (tool_flag_rate(cmd, flag, text, TOOL_MAX_GBPS, &v) != 0)
            return -1;
        o->bytes_per_s = v * 1e9;
    } else if (strcmp(flag, "--cpu-gflops") == 0) {
        if (tool_flag_rate(cmd, flag, text, TOOL_MAX_GFLOPS, &v) != 0)
            return -1;
        o->flops_per_s = v * 1e9;
    } else if (strcmp(flag, "--cpu-memory-gb") == 0) {
        if (tool_flag_real(cmd, flag, text, 0.0, TOOL_MAX_MEMORY_GB, &v) != 0)
            return -1;
        o->memory_bytes = (uint64_t)(v * 1073741824.0);
    } else {
        return 1;
    }
    return 0;
}

int tool_check_output_file(const char *cmd, const char *flag, const char *path)
{
    char q[512];
    /* O_NONBLOCK: a FIFO without a reader is an error here, not a hang. */
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd < 0) {
        fprintf(stderr, "ddo %s: %s \"%s\": cannot write: %s (checked before the run)\n", cmd, flag,
                tool_quote(path, q, sizeof q), strerror(errno));
        return -1;
    }
    close(fd);
    return 0;
}

double tool_metric(const ddo_metrics *m, const char *name)
{
    double v = 0;
    if (m == NULL || ddo_metrics_get(m, name, &v) != 0)
        return 0;
    return v;
}

int tool_fail(char *err, size_t err_len, int code, const char *fmt, ...)
{
    if (err != NULL && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return code;
}

char *tool_read_file(const char *path, size_t max_bytes)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 ||
        (uint64_t)st.st_size > max_bytes) {
        int e = errno;
        bool regular = S_ISREG(st.st_mode);
        close(fd);
        errno = regular ? (st.st_size < 0 ? e : EFBIG) : EINVAL;
        return NULL;
    }
    size_t len = (size_t)st.st_size, done = 0;
    char *buf = malloc(len + 1);
    while (buf != NULL && done < len) {
        ssize_t n = read(fd, buf + done, TOOL_IO_COUNT(len - done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        done += (size_t)n;
    }
    close(fd);
    if (buf != NULL)
        buf[done] = '\0';
    return buf;
}

ddo_placement tool_placement(const ddo_plan *plan, size_t tensor)
{
    ddo_tensor_location loc;
    return ddo_plan_tensor_location(plan, tensor, &loc) == 0 ? loc.placement
                                                             : DDO_PLACEMENT_SKIPPED;
}

size_t tool_unit(const ddo_plan *plan, size_t tensor)
{
    ddo_tensor_location loc;
    return ddo_plan_tensor_location(plan, tensor, &loc) == 0 ? loc.unit : SIZE_MAX;
}

const char *tool_decision(const ddo_plan *plan, const char *key)
{
    size_t n = ddo_plan_decision_count(plan);
    for (size_t i = 0; i < n; i++) {
        const char *k = NULL, *v = NULL;
        if (ddo_plan_decision(plan, i, &k, &v) == 0 && k != NULL && strcmp(k, key) == 0)
            return v;
    }
    return NULL;
}
