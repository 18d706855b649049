/*
 * host.c - what the host machine offers (RAM, cgroup limit, WSL) and the
 * phase helpers of the seeds (Windows standby purge per named phase).
 */
#include "common.h"
#include "config_priv.h"
#include "os/sysinfo.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

int ddo_host_info_get(ddo_host_info *out)
{
    if (out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_host_info_get: out is NULL");
    memset(out, 0, sizeof(*out));
    out->ram_total_bytes = ddo__os_total_ram_bytes();
    out->ram_available_bytes = ddo__os_available_ram_bytes();
    out->cgroup_limit_bytes = ddo__os_cgroup_memory_limit();
    out->running_on_wsl = ddo__os_running_on_wsl();
    ddo__os_kernel_release(out->kernel_release, sizeof(out->kernel_release));
    return 0;
}

/* Upstream's boolean vocabulary: 1, true, yes, on (any case, trimmed). */
static bool truthy(const char *v)
{
    while (isspace((unsigned char)*v))
        v++;
    char w[8];
    size_t n = 0;
    while (v[n] != '\0' && !isspace((unsigned char)v[n]) && n + 1 < sizeof(w)) {
        w[n] = (char)tolower((unsigned char)v[n]);
        n++;
    }
    w[n] = '\0';
    for (const char *p = v + n; *p != '\0'; p++)
        if (!isspace((unsigned char)*p))
            return false;
    return strcmp(w, "1") == 0 || strcmp(w, "true") == 0 || strcmp(w, "yes") == 0 ||
           strcmp(w, "on") == 0;
}

int ddo_purge_standby(const ddo_config *cfg, const char *phase, int enabled,
                      const char *const *envp, ddo_purge_result *out)
{
    if (phase == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_purge_standby: NULL argument");
    ddo_purge_result r;
    memset(&r, 0, sizeof(r));
    while (isspace((unsigned char)*phase))
        phase++;
    size_t len = strlen(phase);
    while (len > 0 && isspace((unsigned char)phase[len - 1]))
        len--;
    if (len == 0 || len >= sizeof(r.phase))
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_purge_standby: a phase name is required (got \"%.*s\")", (int)len,
                         phase);
    memcpy(r.phase, phase, len);
    int n = snprintf(r.variable, sizeof(r.variable), "DDO_PURGE_WINDOWS_STANDBY_");
    for (size_t i = 0; i < len && (size_t)n + 1 < sizeof(r.variable); i++)
        r.variable[n++] = (char)toupper((unsigned char)phase[i]);
    r.variable[n] = '\0';

    bool on = false;
    if (enabled >= 0) {
        on = enabled != 0;
    } else {
        const char *value = NULL;
        size_t vlen = strlen(r.variable);
        for (const char *const *e = envp; e != NULL && *e != NULL; e++)
            if (strncmp(*e, r.variable, vlen) == 0 && (*e)[vlen] == '=')
                value = *e + vlen + 1;
        if (value == NULL && cfg != NULL) {
            ddo_settings st;
            if (ddo_config_settings(cfg, &st) == 0 && st.effective_preset != NULL)
                value = ddo__preset_value(st.effective_preset, r.variable);
        }
        on = value != NULL && truthy(value);
    }
    r.purged = false;
    if (!on)
        r.reason = "disabled";
    else
        r.reason = ddo__os_purge_standby_list();
    if (strcmp(r.reason, "purged") == 0)
        r.purged = true;
    *out = r;
    return 0;
}
