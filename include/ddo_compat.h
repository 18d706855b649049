/*
 * ddo_compat.h - the compatibility tier of libddo: names kept for hosts written against the
 * compatible settings surface (the Python binding's seed-parity helpers), and controls that act
 * only on Windows or do nothing unless a host enables them. Nothing here is needed to stream a
 * checkpoint; none of it carries the promise of ddo.h that it stays: a function may leave this
 * header in a minor version. The conventions of ddo.h hold here.
 */
#ifndef DDO_COMPAT_H
#define DDO_COMPAT_H

#include "ddo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tells the config it runs on WSL (the tool detects it from the kernel release). */
DDO_API void ddo_config_set_running_on_wsl(ddo_config *cfg, bool running_on_wsl);
/* As ddo_config_component_policy, for a host that knows whether its caller gave an explicit
 * configuration or runtime overrides (the Python enable_offload's config= fields and keyword
 * overrides) and no policy arguments: then overrides_given is true, and the VAE rule
 * applies: a VAE whose route comes from the preset (route_source names "preset:", directly or
 * under auto) is not given the preset's VAE route; it routes "dynamic_offload" when the settings
 * are enabled, else "none", with route_source "explicit config/overrides bypass the preset's VAE
 * route". An explicit route, an API policy and the environment are never bypassed. Errors as
 * ddo_config_component_policy (those of the preset's route come first). */
DDO_API int ddo_config_component_policy_with_overrides(const ddo_config *cfg, const char *component,
                                                       const char *explicit_route,
                                                       bool quantized_backend, bool overrides_given,
                                                       ddo_component_policy *out);
/*
 * Pinned host-cache helper, for a completed phase: with enabled, waits for pending uploads and
 * releases the session's idle staging windows and bounce buffer (given back to the staging
 * account; re-created on the next upload that needs them). *released_bytes = bytes released.
 * Disabled (enabled=false, the default a host should use) does nothing and reports 0. Never
 * touches the retained source store, registration or admission.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_DEVICE (a pending copy failed).
 */
DDO_API int ddo_session_trim_host_cache(ddo_session *s, bool enabled, uint64_t *released_bytes);
/* What a standby purge did for a phase (maybe_purge_windows_standby_cache of the Python binding).
 */
typedef struct ddo_purge_result {
    bool purged;
    const char *reason; /* "purged", "disabled", "non_windows", or the failure's class */
    char phase[64];     /* the phase as given, stripped */
    char variable[96];  /* DDO_PURGE_WINDOWS_STANDBY_<PHASE> */
} ddo_purge_result;
/*
 * Windows standby-list purge for a named phase ("before_transformer"). enabled: -1 inherits
 * the environment block (a set DDO_PURGE_WINDOWS_STANDBY_<PHASE>, even "", wins) and then the
 * config's effective preset (one_shot_fast enables BEFORE_RUN, AFTER_TEXT_ENCODER and
 * BEFORE_TRANSFORMER); 0 / 1 are explicit and leave the environment alone. The enable check
 * comes first; on other platforms an enabled purge returns purged=false, reason "non_windows"
 * and does nothing. cfg and envp may be NULL. Errors: DDO_E_INVALID_ARGUMENT (phase or out
 * NULL, an empty or too long phase).
 */
DDO_API int ddo_purge_standby(const ddo_config *cfg, const char *phase, int enabled,
                              const char *const *envp, ddo_purge_result *out);
/*
 * A DDO_* variable of the preset tables as a host phase reads it (the settings' preset_value
 * and preset_bool): the environment block's value when it sets name (even to ""),
 * else the config's effective preset's value, else none (*value NULL; preset_bool: fallback,
 * "0" when NULL, read with the boolean vocabulary 1/true/yes/on). cfg and envp may be NULL.
 * Errors: DDO_E_INVALID_ARGUMENT (name or value NULL).
 */
DDO_API int ddo_config_preset_value(const ddo_config *cfg, const char *name,
                                    const char *const *envp, const char **value);
DDO_API int ddo_config_preset_bool(const ddo_config *cfg, const char *name, const char *const *envp,
                                   const char *fallback, bool *value);

#ifdef __cplusplus
}
#endif

#endif /* DDO_COMPAT_H */
