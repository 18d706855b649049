/*
 * config_priv.h - the configuration module's own shared state: the catalog
 * descriptors, the ddo_config structure and the helpers its files
 * (config.c, config_text.c, config_access.c, config_validate.c, config_env.c,
 * config_args.c, presets.c, components.c, config_doc.c) use between them.
 * Other modules read values through ddo__config_options() in config.h; the host layer also
 * uses config_store.h.
 */
#ifndef DDO_CONFIG_PRIV_H
#define DDO_CONFIG_PRIV_H

#include "base/common.h"
#include "config/config.h"
#include "config/config_store.h"

#include <stdbool.h>
#include <stddef.h>

/* Option ids in catalog order. */
enum ddo__opt_id {
#define DDO_OPT(key, type, effect, def, lo, hi, choices, env, flag, help) DDO_OPT_ID_##key,
#include "config/options.def"
#undef DDO_OPT
    DDO_OPT_COUNT
};

typedef enum ddo__otype {
    DDO__OT_BOOL,
    DDO__OT_INT,
    DDO__OT_KB,
    DDO__OT_GB,
    DDO__OT_MB,
    DDO__OT_FLOAT,
    DDO__OT_STRING,
    DDO__OT_ENUM,
    DDO__OT_LIST
} ddo__otype;

/* What an option does (the catalog's effect column, options.def). */
typedef enum ddo__oeffect {
    DDO__EFFECT_LIVE,    /* read by libddo */
    DDO__EFFECT_HOST,    /* read by the hosts (the tool, the Python binding), not by libddo */
    DDO__EFFECT_COMPAT,  /* accepted for compatibility, no effect */
    DDO__EFFECT_WINDOWS, /* Windows only: no effect on Linux */
} ddo__oeffect;

/* The effect's words, as `ddo config --list` and docs/options.md print them. */
const char *ddo__config_effect_text(ddo__oeffect effect);

/* One catalog row, as data. */
typedef struct ddo__optdesc {
    const char *key;
    ddo__otype type;
    ddo__oeffect effect;
    const char *def; /* dataclass default, as text (KB rows: bytes) */
    double lo, hi;
    const char *choices; /* "a|b|c" for ENUM, "" otherwise */
    const char *env;
    const char *flag;
    const char *help;
    size_t offset; /* into ddo__options */
} ddo__optdesc;

extern const ddo__optdesc ddo__optdescs[DDO_OPT_COUNT];

/* Who set a value; a write never replaces a value of a higher rank. */
typedef enum ddo__rank {
    DDO__RANK_DEFAULT = 0,
    DDO__RANK_PRESET = 1,
    DDO__RANK_API = 2,
    DDO__RANK_ENV = 3,
    DDO__RANK_FLAG = 4
} ddo__rank;

/* NAME=VALUE pairs (captured DDO_* variables, API component policies). */
typedef struct ddo__kv {
    char *name;
    char *value;
} ddo__kv;
typedef struct ddo__kvlist {
    ddo__kv *items;
    size_t count;
} ddo__kvlist;

struct ddo_config {
    ddo__options opt;
    char *text[DDO_OPT_COUNT];   /* canonical text of each value */
    char *source[DDO_OPT_COUNT]; /* "default", "preset:NAME", "env:DDO_X", "flag", "api" */
    unsigned char rank[DDO_OPT_COUNT];
    char *effective_preset; /* "" when no preset applies */
    bool running_on_wsl;
    bool env_defaults;       /* the from_env operational defaults are in force */
    double detected_ram_gb;  /* what apply_env detected (4 decimals) */
    bool env_captured;       /* env holds the DDO_* block of the last apply_env */
    bool staging_translated; /* vmm_staging_buffer_gb came from vmm_total_staging_gb */
    ddo__kvlist env;         /* DDO_* variables of the last apply_env */
    ddo__kvlist policies;    /* API component policies: name "COMPONENT/option" */
    ddo__strlist warnings;
    ddo__errbuf err;
};

/* Bounds of any value's text and of a list's entries: a value, a path or a pattern is far
 * smaller, and the planner matches every pattern against every module name. */
#define DDO__CONFIG_MAX_TEXT_BYTES 65536
#define DDO__CONFIG_MAX_LIST_ITEMS 256

/* Index of key (exact), or -1. */
int ddo__config_find(const char *key);
/* Index of the option whose env is name, or -1. */
int ddo__config_find_env(const char *name);
/* Index of the option whose flag is name, or -1. */
int ddo__config_find_flag(const char *name);

/*
 * Parses text for option id and stores it with rank/source when rank is at
 * least the current one (else it is a no-op returning 0). origin names the
 * input in errors ("DDO_PIN_CPU_WORKERS", "--ddo-pin-cpu-workers", "pin_cpu_workers").
 * env_rules: the environment's boolean vocabulary (anything else is false).
 * KB rows take KiB when kib is true, bytes otherwise. Errors: DDO_E_CONFIG.
 */
int ddo__config_store(ddo_config *cfg, int id, const char *text, ddo__rank rank, const char *source,
                      const char *origin, bool env_rules, bool kib);
/* A list option from its elements, none split (ddo_config_override_list). */
int ddo__config_store_list(ddo_config *cfg, int id, const char *const *items, size_t count,
                           ddo__rank rank, const char *source);
/* Resets option id to its base value (dataclass default or from_env default), rank default. */
int ddo__config_reset(ddo_config *cfg, int id);
/* Option id's field in cfg->opt (config.c). */
void *ddo__config_field(ddo_config *cfg, int id);
const void *ddo__config_cfield(const ddo_config *cfg, int id);
/* Options whose out-of-range values ddo_config_validate clamps instead of refusing (config.c). */
bool ddo__config_clamped_below(int id);
/* Re-resolves the preset from opt.backend/opt.preset and derived values (staging). */
int ddo__config_resolve(ddo_config *cfg);
/* The route of ddo_config_component_policy alone (a static string), for the tests. Errors: those
 * of ddo_config_component_policy, DDO_E_INVALID_ARGUMENT (route is NULL). */
int ddo__config_component_route(const ddo_config *cfg, const char *component, const char **route);
/* Moves src's content into dst (dst's old content freed); src is left empty and freed. */
void ddo__config_move(ddo_config *dst, ddo_config *src);
/* Ends a change made on the copy c of cfg: rc == 0 moves c into cfg; otherwise cfg keeps its
 * values, takes c's error detail, and c is destroyed. Returns rc. */
int ddo__config_commit(ddo_config *cfg, ddo_config *c, int rc);
/* Appends a formatted warning. */
void ddo__config_warn(ddo_config *cfg, const char *fmt, ...) DDO_PRINTF(2, 3);

/* Text helpers. */
int ddo__config_strict_bool(const char *s, bool *out); /* also 0/false/no/off; -1 otherwise */
char *ddo__config_trim_lower(const char *s);           /* new string */
size_t ddo__edit_distance(const char *a, const char *b);
/* s for a one-line message: control characters, quotes and backslashes escaped (\n, \x1b),
 * cut with "..." to fit len. */
void ddo__config_quote(const char *s, char *buf, size_t len);
/* Canonical text of a double (shortest that round-trips). */
void ddo__config_fmt_double(double v, char *buf, size_t len);

/* kvlist helpers. */
const ddo__kv *ddo__kv_find(const ddo__kvlist *l, const char *name);
int ddo__kv_set(ddo__kvlist *l, const char *name, const char *value);
void ddo__kv_free(ddo__kvlist *l);
int ddo__kv_copy(ddo__kvlist *dst, const ddo__kvlist *src);

/* Presets (presets.c). */
typedef struct ddo__preset_row {
    const char *preset;
    const char *var;
    const char *value;
} ddo__preset_row;
/*
 * Resolves a requested preset for a backend: "" -> "" (no preset), "auto" ->
 * one_shot_fast (linear) or vmm_fast_runtime (vmm). Writes the effective name
 * (static) or fails with DDO_E_CONFIG.
 */
int ddo__preset_resolve(ddo__errbuf *eb, const char *backend, const char *requested,
                        const char **effective);
size_t ddo__preset_row_count(void);
const ddo__preset_row *ddo__preset_row_at(size_t i);
size_t ddo__preset_name_count(void);
/* i-th preset: name, backend family, intent. */
void ddo__preset_name_at(size_t i, const char **name, const char **backend, const char **intent);

#endif /* DDO_CONFIG_PRIV_H */
