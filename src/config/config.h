/*
 * config.h - the resolved option values as a C struct generated from
 * options.def, for the modules that read them (planner, session, profiles).
 */
#ifndef DDO_CONFIG_H
#define DDO_CONFIG_H

#include "ddo.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ddo__strlist {
    char **items;
    size_t count;
} ddo__strlist;

#define DDO_OPT_CTYPE_BOOL   bool
#define DDO_OPT_CTYPE_INT    int64_t
#define DDO_OPT_CTYPE_KB     int64_t /* bytes */
#define DDO_OPT_CTYPE_GB     double
#define DDO_OPT_CTYPE_MB     double
#define DDO_OPT_CTYPE_FLOAT  double
#define DDO_OPT_CTYPE_STRING char *
#define DDO_OPT_CTYPE_ENUM   char *
#define DDO_OPT_CTYPE_LIST   ddo__strlist

typedef struct ddo__options {
#define DDO_OPT(key, type, effect, def, lo, hi, choices, env, flag, help) DDO_OPT_CTYPE_##type key;
#include "config/options.def"
#undef DDO_OPT
} ddo__options;

/* The resolved values of cfg (valid until cfg changes). Never NULL for a valid cfg. */
const ddo__options *ddo__config_options(const ddo_config *cfg);

/* The planner's defence in depth (config_validate.c), called by the planner: every numeric option
 * of cfg within its catalog range before the planner converts it. 0 or DDO_E_CONFIG naming the
 * option (last error). */
int ddo__config_check_ranges(const ddo_config *cfg);

/* The upstream default always-resident regex (docs/options.md, "Resolution order"). */
#define DDO_DEFAULT_ALWAYS_RESIDENT_PATTERN \
    "(^|\\.)(proj_in|time_embed|prompt_adaln|norm_out|proj_out)(\\.|$)"

#endif /* DDO_CONFIG_H */
