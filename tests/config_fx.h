/*
 * config_fx.h - small accessors shared by the configuration tests: a value or
 * its source as text, "(error)" when the call fails.
 */
#ifndef DDO_CONFIG_FX_H
#define DDO_CONFIG_FX_H

#include "ddo.h"

static inline const char *val(const ddo_config *c, const char *key)
{
    const char *v = NULL;
    return ddo_config_get(c, key, &v) == 0 ? v : "(error)";
}

static inline const char *src(const ddo_config *c, const char *key)
{
    const char *s = NULL;
    return ddo_config_source(c, key, &s) == 0 ? s : "(error)";
}

#endif /* DDO_CONFIG_FX_H */
