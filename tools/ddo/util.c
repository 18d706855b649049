/*
 * util.c - small helpers shared by the tool's commands.
 */
#define _POSIX_C_SOURCE 200809L
#include "tool.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

int ddo_tool_running_on_wsl(void)
{
    struct utsname u;
    if (uname(&u) != 0)
        return 0;
    char rel[sizeof(u.release)];
    size_t i = 0;
    for (; u.release[i] != '\0' && i + 1 < sizeof(rel); i++)
        rel[i] = (char)tolower((unsigned char)u.release[i]);
    rel[i] = '\0';
    return strstr(rel, "microsoft") != NULL || strstr(rel, "wsl") != NULL;
}

uint64_t tool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int tool_parse_u64(const char *s, uint64_t *out)
{
    if (s == NULL || *s == '\0' || s[0] == '-')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = (uint64_t)v;
    return 0;
}

int tool_parse_double(const char *s, double *out)
{
    if (s == NULL || *s == '\0')
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !(v >= 0))
        return -1;
    *out = v;
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

uint64_t tool_host_available_bytes(void)
{
    ddo_host_info h;
    return ddo_host_info_get(&h) == 0 ? h.ram_available_bytes : 0;
}

void tool_plan_inputs(ddo_plan_inputs *in, const ddo_device_caps *caps)
{
    memset(in, 0, sizeof(*in));
    if (caps != NULL) {
        in->device_total_bytes = caps->total_bytes;
        in->device_free_bytes = caps->free_bytes;
        in->device_granularity = caps->granularity;
        in->device_is_cpu = caps->is_cpu;
        in->device_vmm_supported = caps->vmm_supported;
    }
    in->host_available_bytes = tool_host_available_bytes();
}
