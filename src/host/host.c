/*
 * host.c - what the host machine offers (RAM, cgroup limit, WSL) and the
 * phase helpers of the compatible API (Windows standby purge per named phase).
 */
#include "base/common.h"
#include "config/config_store.h"
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

int ddo_config_preset_value(const ddo_config *cfg, const char *name, const char *const *envp,
                            const char **value)
{
    if (name == NULL || value == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_preset_value: NULL argument");
    *value = NULL;
    size_t len = strlen(name);
    for (const char *const *e = envp; e != NULL && *e != NULL; e++)
        if (strncmp(*e, name, len) == 0 && (*e)[len] == '=')
            *value = *e + len + 1; /* the last one set, as a process environment */
    if (*value == NULL && cfg != NULL) {
        ddo_settings st;
        if (ddo_config_settings(cfg, &st) == 0 && st.effective_preset != NULL)
            *value = ddo__preset_value(st.effective_preset, name);
    }
    return 0;
}

int ddo_config_preset_bool(const ddo_config *cfg, const char *name, const char *const *envp,
                           const char *fallback, bool *value)
{
    const char *v = NULL;
    if (value == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_preset_bool: NULL argument");
    int rc = ddo_config_preset_value(cfg, name, envp, &v);
    if (rc != 0)
        return rc;
    if (v == NULL)
        v = fallback != NULL ? fallback : "0";
    *value = ddo__config_env_bool(v);
    return 0;
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

    bool on = enabled != 0;
    if (enabled < 0)
        (void)ddo_config_preset_bool(cfg, r.variable, envp, "0", &on);
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
