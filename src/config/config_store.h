/*
 * config_store.h - what the host layer (src/host/) may do with a configuration besides reading
 * its values (config.h): store a decision that outranks every other source (a profile's),
 * read an option's catalog range, a preset's value of a DDO_* variable and the environment's
 * boolean vocabulary. The store's own state and helpers stay in config_priv.h, which only the
 * files of config/ include. Internal; never installed.
 */
#ifndef DDO_CONFIG_STORE_H
#define DDO_CONFIG_STORE_H

#include "config/config.h"

#include <stdbool.h>

/* Stores text for option key at the highest rank (a flag's): no later write of a lower rank
 * replaces it. source names who decided ("profile:NAME"). Errors: DDO_E_INTERNAL for a key
 * the catalog does not have, those of the value (DDO_E_CONFIG naming key). */
int ddo__config_store_top(ddo_config *cfg, const char *key, const char *text, const char *source);
/* The catalog range of option key into *lo and *hi; false (nothing written) when the catalog
 * has no such key. */
bool ddo__config_range(const char *key, double *lo, double *hi);
/* The value a preset gives a DDO_* variable, or NULL (presets.c). */
const char *ddo__preset_value(const char *preset, const char *var);
/* The environment's booleans: 1/true/yes/on, any case, trimmed (config_text.c). */
bool ddo__config_env_bool(const char *s);

#endif /* DDO_CONFIG_STORE_H */
