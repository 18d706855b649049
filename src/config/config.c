/*
 * config.c - the option catalog as data and a config's values: each option's value with its
 * canonical text, source and rank, parsed from text by its catalog row and stored only over a
 * value of no higher rank, reset to its base value; the string lists of LIST options and the
 * warnings; the config's lifecycle (create, destroy, clone, move). Typed set/get, iteration
 * and the settings object live in config_access.c, validation in config_validate.c, the
 * text helpers and NAME=VALUE lists in config_text.c, presets in presets.c, the environment
 * in config_env.c, --ddo-* flags in config_args.c, component routes in components.c, JSON
 * and docs in config_doc.c.
 */
#include "config/config_priv.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const ddo__optdesc ddo__optdescs[DDO_OPT_COUNT] = {
#define DDO_OPT(key, type, effect, def, lo, hi, choices, env, flag, help) \
    { #key,                                                               \
      DDO__OT_##type,                                                     \
      DDO__EFFECT_##effect,                                               \
      def,                                                                \
      (double)(lo),                                                       \
      (double)(hi),                                                       \
      choices,                                                            \
      env,                                                                \
      flag,                                                               \
      help,                                                               \
      offsetof(ddo__options, key) },
#include "config/options.def"
#undef DDO_OPT
};

/* ------------------------------------------------------------------------ */
/* String lists and warnings                                                 */
/* ------------------------------------------------------------------------ */

static void strlist_free(ddo__strlist *l)
{
    for (size_t i = 0; i < l->count; i++)
        free(l->items[i]);
    free(l->items);
    l->items = NULL;
    l->count = 0;
}

static int strlist_push(ddo__strlist *l, const char *s, size_t n)
{
    char *d = ddo__strndup(s, n);
    char **items = d == NULL ? NULL : ddo__reallocarray(l->items, l->count + 1, sizeof(char *));
    if (items == NULL) {
        free(d);
        return DDO_E_NO_MEMORY;
    }
    l->items = items;
    l->items[l->count++] = d;
    return 0;
}

static int strlist_copy(ddo__strlist *dst, const ddo__strlist *src)
{
    dst->items = NULL;
    dst->count = 0;
    for (size_t i = 0; i < src->count; i++)
        if (strlist_push(dst, src->items[i], strlen(src->items[i])) != 0) {
            strlist_free(dst);
            return DDO_E_NO_MEMORY;
        }
    return 0;
}

/* Splits on ',' or ';', strips items, drops empties. */
static int strlist_parse(ddo__strlist *out, const char *s)
{
    out->items = NULL;
    out->count = 0;
    while (*s != '\0') {
        size_t n = strcspn(s, ",;");
        const char *a = s, *b = s + n;
        while (a < b && isspace((unsigned char)*a))
            a++;
        while (b > a && isspace((unsigned char)b[-1]))
            b--;
        if (b > a && strlist_push(out, a, (size_t)(b - a)) != 0) {
            strlist_free(out);
            return DDO_E_NO_MEMORY;
        }
        s += n;
        if (*s != '\0')
            s++;
    }
    return 0;
}

/* A list of more patterns than a list may hold is freed and refused. */
static int list_limit(ddo_config *cfg, const char *origin, ddo__strlist *l)
{
    if (l->count <= DDO__CONFIG_MAX_LIST_ITEMS)
        return 0;
    size_t n = l->count;
    strlist_free(l);
    return ddo__fail(&cfg->err, DDO_E_CONFIG, "%s: %zu patterns, more than the %d a list may hold",
                     origin, n, DDO__CONFIG_MAX_LIST_ITEMS);
}

void ddo__config_warn(ddo_config *cfg, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char buf[512];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    (void)strlist_push(&cfg->warnings, buf, strlen(buf));
}

/* ------------------------------------------------------------------------ */
/* Catalog lookups                                                           */
/* ------------------------------------------------------------------------ */

int ddo__config_find(const char *key)
{
    for (int i = 0; i < DDO_OPT_COUNT; i++)
        if (strcmp(ddo__optdescs[i].key, key) == 0)
            return i;
    return -1;
}

int ddo__config_find_env(const char *name)
{
    for (int i = 0; i < DDO_OPT_COUNT; i++)
        if (ddo__optdescs[i].env[0] != '\0' && strcmp(ddo__optdescs[i].env, name) == 0)
            return i;
    return -1;
}

int ddo__config_find_flag(const char *name)
{
    for (int i = 0; i < DDO_OPT_COUNT; i++)
        if (ddo__optdescs[i].flag[0] != '\0' && strcmp(ddo__optdescs[i].flag, name) == 0)
            return i;
    return -1;
}

void *ddo__config_field(ddo_config *cfg, int id)
{
    return (char *)&cfg->opt + ddo__optdescs[id].offset;
}

const void *ddo__config_cfield(const ddo_config *cfg, int id)
{
    return (const char *)&cfg->opt + ddo__optdescs[id].offset;
}

/* Frees the heap parts of a value. */
static void value_free(ddo_config *cfg, int id)
{
    switch (ddo__optdescs[id].type) {
    case DDO__OT_STRING:
    case DDO__OT_ENUM: {
        char **p = ddo__config_field(cfg, id);
        free(*p);
        *p = NULL;
        break;
    }
    case DDO__OT_LIST:
        strlist_free(ddo__config_field(cfg, id));
        break;
    default:
        break;
    }
}

/* The canonical text of the current value (new string). */
static char *value_text(const ddo_config *cfg, int id)
{
    char buf[64];
    const void *f = ddo__config_cfield(cfg, id);
    switch (ddo__optdescs[id].type) {
    case DDO__OT_BOOL:
        return ddo__strdup(*(const bool *)f ? "true" : "false");
    case DDO__OT_INT:
    case DDO__OT_KB:
        snprintf(buf, sizeof(buf), "%" PRId64, *(const int64_t *)f);
        return ddo__strdup(buf);
    case DDO__OT_GB:
    case DDO__OT_MB:
    case DDO__OT_FLOAT:
        ddo__config_fmt_double(*(const double *)f, buf, sizeof(buf));
        return ddo__strdup(buf);
    case DDO__OT_STRING:
    case DDO__OT_ENUM: {
        const char *s = *(char *const *)f;
        return ddo__strdup(s != NULL ? s : "");
    }
    case DDO__OT_LIST: {
        const ddo__strlist *l = f;
        ddo__sbuf b;
        ddo__sbuf_init(&b);
        ddo__sbuf_append(&b, "", 0);
        for (size_t i = 0; i < l->count; i++) {
            if (i > 0)
                ddo__sbuf_append(&b, ",", 1);
            ddo__sbuf_append(&b, l->items[i], strlen(l->items[i]));
        }
        return ddo__sbuf_take(&b);
    }
    }
    return NULL;
}

static bool choice_ok(const char *choices, const char *v)
{
    size_t n = strlen(v);
    const char *p = choices;
    for (;;) {
        size_t m = strcspn(p, "|");
        if (m == n && strncmp(p, v, n) == 0)
            return true;
        if (p[m] == '\0')
            return false;
        p += m + 1;
    }
}

/* "a, b, c" (the empty choice shown as "\"\""). */
static void choices_text(const char *choices, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    const char *p = choices;
    for (bool first = true;; first = false) {
        size_t m = strcspn(p, "|");
        int w = snprintf(buf + o, len - o, "%s%s%.*s", first ? "" : ", ", m == 0 ? "\"\"" : "",
                         (int)m, p);
        if (w < 0 || (size_t)w >= len - o)
            return;
        o += (size_t)w;
        if (p[m] == '\0')
            return;
        p += m + 1;
    }
}

/*
 * The catalog's "number": an optional sign, decimal digits with an optional point, an optional
 * decimal exponent; nothing before or after (ddo__decimal_syntax). strtod alone would also take
 * leading spaces, hexadecimal (0x10), inf, nan and locale forms; those are refused here.
 */
static int parse_double(const char *s, double *out)
{
    if (!ddo__decimal_syntax(s, false))
        return -1;
    errno = 0;
    double v = strtod(s, NULL);
    if (errno == ERANGE || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

static int parse_int(const char *s, int64_t *out)
{
    if (!ddo__decimal_syntax(s, true))
        return -1;
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE)
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* Options whose out-of-range values ddo_config_validate clamps (upstream normalisation)
 * instead of refusing: the pin ratio (to 0..1) and worker counts below one (to 1). */
bool ddo__config_clamped_below(int id)
{
    return id == DDO_OPT_ID_pin_weight_budget_ratio || id == DDO_OPT_ID_pin_cpu_workers;
}

/* The catalog range, checked before a value is stored (nothing is cast before this). */
static int check_range(ddo_config *cfg, int id, double v, const char *text, const char *origin,
                       bool kib)
{
    const ddo__optdesc *d = &ddo__optdescs[id];
    double scale = d->type == DDO__OT_KB && kib ? 1024.0 : 1.0;
    bool low = v < d->lo && !ddo__config_clamped_below(id);
    bool high = v > d->hi && id != DDO_OPT_ID_pin_weight_budget_ratio;
    if (!low && !high)
        return 0;
    char q[160], a[64], b[64];
    ddo__config_quote(text, q, sizeof(q));
    ddo__config_fmt_double(d->lo / scale, a, sizeof(a));
    ddo__config_fmt_double(d->hi / scale, b, sizeof(b));
    const char *unit = d->type == DDO__OT_GB   ? " GiB"
                       : d->type == DDO__OT_MB ? " MiB"
                       : d->type == DDO__OT_KB ? (kib ? " KiB" : " bytes")
                                               : "";
    return ddo__fail(&cfg->err, DDO_E_CONFIG, "%s=\"%s\": %s the range %s..%s%s of %s", origin, q,
                     low ? "below" : "above", a, b, unit, d->key);
}

/* A parsed value of any option type. */
typedef union ovalue {
    bool b;
    int64_t i;
    double f;
    char *s;
    ddo__strlist l;
} ovalue;

/* INT, KB, GB, MB and FLOAT rows: the catalog syntax, then the range, then the conversion. */
static int parse_number(ddo_config *cfg, int id, const char *text, const char *origin, bool kib,
                        ovalue *v)
{
    const ddo__optdesc *d = &ddo__optdescs[id];
    char q[160];
    if (d->type == DDO__OT_INT || d->type == DDO__OT_KB) {
        bool in_kib = d->type == DDO__OT_KB && kib;
        if (parse_int(text, &v->i) != 0) {
            ddo__config_quote(text, q, sizeof(q));
            return ddo__fail(&cfg->err, DDO_E_CONFIG, "%s=\"%s\": expected an integer", origin, q);
        }
        if (check_range(cfg, id, (double)v->i * (in_kib ? 1024.0 : 1.0), text, origin, kib) != 0)
            return DDO_E_CONFIG;
        if (in_kib)
            v->i *= 1024; /* within the range checked above: cannot overflow */
        return 0;
    }
    if (parse_double(text, &v->f) != 0) {
        ddo__config_quote(text, q, sizeof(q));
        return ddo__fail(&cfg->err, DDO_E_CONFIG, "%s=\"%s\": expected a number", origin, q);
    }
    return check_range(cfg, id, v->f, text, origin, kib) != 0 ? DDO_E_CONFIG : 0;
}

/* Parses text as option id's type into v (strings and lists are new allocations). */
static int parse_value(ddo_config *cfg, int id, const char *text, const char *origin,
                       bool env_rules, bool kib, ovalue *v)
{
    const ddo__optdesc *d = &ddo__optdescs[id];
    char what[400], q[160];
    if (strlen(text) > DDO__CONFIG_MAX_TEXT_BYTES) {
        ddo__config_quote(text, q, sizeof(q));
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "%s=\"%s\": %zu bytes, more than the %d a value "
                         "may hold",
                         origin, q, strlen(text), DDO__CONFIG_MAX_TEXT_BYTES);
    }
    switch (d->type) {
    case DDO__OT_BOOL:
        if (env_rules) {
            v->b = ddo__config_env_bool(text);
        } else if (ddo__config_strict_bool(text, &v->b) != 0) {
            ddo__config_quote(text, q, sizeof(q));
            return ddo__fail(&cfg->err, DDO_E_CONFIG,
                             "%s=\"%s\": expected a boolean (1, true, yes, on or 0, false, no, "
                             "off)",
                             origin, q);
        }
        return 0;
    case DDO__OT_INT:
    case DDO__OT_KB:
    case DDO__OT_GB:
    case DDO__OT_MB:
    case DDO__OT_FLOAT:
        return parse_number(cfg, id, text, origin, kib, v);
    case DDO__OT_STRING:
        /* Preset names are stripped and lowercased, as upstream. */
        v->s = id == DDO_OPT_ID_preset ? ddo__config_trim_lower(text) : ddo__strdup(text);
        break;
    case DDO__OT_ENUM:
        v->s = ddo__config_trim_lower(text);
        if (v->s != NULL && !choice_ok(d->choices, v->s)) {
            choices_text(d->choices, what, sizeof(what));
            ddo__config_quote(text, q, sizeof(q));
            free(v->s);
            return ddo__fail(&cfg->err, DDO_E_CONFIG, "%s=\"%s\": expected one of %s", origin, q,
                             what);
        }
        break;
    case DDO__OT_LIST:
        if (strlist_parse(&v->l, text) != 0)
            return ddo__fail(&cfg->err, DDO_E_NO_MEMORY, "%s: out of memory", origin);
        return list_limit(cfg, origin, &v->l);
    }
    if (v->s == NULL)
        return ddo__fail(&cfg->err, DDO_E_NO_MEMORY, "%s: out of memory", origin);
    return 0;
}

/* Moves v into option id's field (the old value freed). */
static void put_value(ddo_config *cfg, int id, const ovalue *v)
{
    value_free(cfg, id);
    void *f = ddo__config_field(cfg, id);
    switch (ddo__optdescs[id].type) {
    case DDO__OT_BOOL:
        *(bool *)f = v->b;
        break;
    case DDO__OT_INT:
    case DDO__OT_KB:
        *(int64_t *)f = v->i;
        break;
    case DDO__OT_GB:
    case DDO__OT_MB:
    case DDO__OT_FLOAT:
        *(double *)f = v->f;
        break;
    case DDO__OT_STRING:
    case DDO__OT_ENUM:
        *(char **)f = v->s;
        break;
    case DDO__OT_LIST:
        *(ddo__strlist *)f = v->l;
        break;
    }
}

/* Moves the parsed value v into option id with its source and rank (v is freed on failure). */
static int commit_value(ddo_config *cfg, int id, ovalue *v, ddo__rank rank, const char *source,
                        const char *origin)
{
    const ddo__optdesc *d = &ddo__optdescs[id];
    char *src = ddo__strdup(source);
    if (src == NULL) {
        if (d->type == DDO__OT_STRING || d->type == DDO__OT_ENUM)
            free(v->s);
        else if (d->type == DDO__OT_LIST)
            strlist_free(&v->l);
        return ddo__fail(&cfg->err, DDO_E_NO_MEMORY, "%s: out of memory", origin);
    }
    put_value(cfg, id, v);
    char *t = value_text(cfg, id);
    free(cfg->text[id]);
    cfg->text[id] = t != NULL ? t : ddo__strdup("");
    free(cfg->source[id]);
    cfg->source[id] = src;
    cfg->rank[id] = (unsigned char)rank;
    return 0;
}

int ddo__config_store(ddo_config *cfg, int id, const char *text, ddo__rank rank, const char *source,
                      const char *origin, bool env_rules, bool kib)
{
    if ((int)rank < (int)cfg->rank[id])
        return 0;
    if (id == DDO_OPT_ID_vmm_staging_buffer_gb)
        cfg->staging_translated = false;
    ovalue v;
    memset(&v, 0, sizeof(v));
    int rc = parse_value(cfg, id, text, origin, env_rules, kib, &v);
    if (rc != 0)
        return rc;
    return commit_value(cfg, id, &v, rank, source, origin);
}

int ddo__config_store_list(ddo_config *cfg, int id, const char *const *items, size_t count,
                           ddo__rank rank, const char *source)
{
    const char *key = ddo__optdescs[id].key;
    if (ddo__optdescs[id].type != DDO__OT_LIST)
        return ddo__fail(&cfg->err, DDO_E_CONFIG, "%s: not a list option", key);
    ovalue v;
    memset(&v, 0, sizeof(v));
    for (size_t i = 0; i < count; i++) {
        if (items[i][0] == '\0')
            continue; /* as the text form: no empty pattern */
        if (strlist_push(&v.l, items[i], strlen(items[i])) != 0) {
            strlist_free(&v.l);
            return ddo__fail(&cfg->err, DDO_E_NO_MEMORY, "%s: out of memory", key);
        }
    }
    int rc = list_limit(cfg, key, &v.l);
    if (rc != 0)
        return rc;
    if ((int)rank < (int)cfg->rank[id]) {
        strlist_free(&v.l);
        return 0;
    }
    return commit_value(cfg, id, &v, rank, source, key);
}

/* The from_env operational defaults (config reference, "DynamicOffloadSettings.from_env"). */
static const char *env_default(const ddo_config *cfg, int id, char *buf, size_t len)
{
    if (!cfg->env_defaults)
        return NULL;
    switch (id) {
    case DDO_OPT_ID_small_tensor_threshold_bytes:
        return "16384"; /* the catalog's: one small-tensor default everywhere */
    case DDO_OPT_ID_pin_cpu_workers:
        return "4";
    case DDO_OPT_ID_always_resident_modules_pattern:
        return DDO_DEFAULT_ALWAYS_RESIDENT_PATTERN;
    case DDO_OPT_ID_show_profile:
        return "false";
    case DDO_OPT_ID_available_system_ram_gb:
        ddo__config_fmt_double(cfg->detected_ram_gb, buf, len);
        return buf;
    default:
        return NULL;
    }
}

int ddo__config_reset(ddo_config *cfg, int id)
{
    char buf[64];
    const char *base = env_default(cfg, id, buf, sizeof(buf));
    if (base == NULL)
        base = ddo__optdescs[id].def;
    cfg->rank[id] = DDO__RANK_DEFAULT;
    return ddo__config_store(cfg, id, base, DDO__RANK_DEFAULT, "default", ddo__optdescs[id].key,
                             false, false);
}

/* ------------------------------------------------------------------------ */
/* Lifecycle                                                                 */
/* ------------------------------------------------------------------------ */

static void config_free_content(ddo_config *cfg)
{
    for (int i = 0; i < DDO_OPT_COUNT; i++) {
        value_free(cfg, i);
        free(cfg->text[i]);
        free(cfg->source[i]);
        cfg->text[i] = NULL;
        cfg->source[i] = NULL;
    }
    free(cfg->effective_preset);
    cfg->effective_preset = NULL;
    ddo__kv_free(&cfg->env);
    ddo__kv_free(&cfg->policies);
    strlist_free(&cfg->warnings);
}

int ddo_config_create(ddo_config **out)
{
    if (out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_create: out is NULL");
    ddo_config *cfg = ddo__calloc(1, sizeof(*cfg));
    if (cfg == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_config_create: out of memory");
    cfg->effective_preset = ddo__strdup("");
    if (cfg->effective_preset == NULL)
        goto fail;
    for (int i = 0; i < DDO_OPT_COUNT; i++)
        if (ddo__config_reset(cfg, i) != 0)
            goto fail;
    *out = cfg;
    return 0;
fail:
    config_free_content(cfg);
    free(cfg);
    return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_config_create: out of memory");
}

void ddo_config_destroy(ddo_config *cfg)
{
    if (cfg == NULL)
        return;
    config_free_content(cfg);
    free(cfg);
}

int ddo_config_clone(const ddo_config *cfg, ddo_config **out)
{
    if (cfg == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_clone: NULL argument");
    ddo_config *c = ddo__calloc(1, sizeof(*c));
    if (c == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_config_clone: out of memory");
    c->opt = cfg->opt;
    /* Detach the heap parts before copying them. */
    for (int i = 0; i < DDO_OPT_COUNT; i++) {
        switch (ddo__optdescs[i].type) {
        case DDO__OT_STRING:
        case DDO__OT_ENUM:
            *(char **)ddo__config_field(c, i) = NULL;
            break;
        case DDO__OT_LIST:
            ((ddo__strlist *)ddo__config_field(c, i))->items = NULL;
            ((ddo__strlist *)ddo__config_field(c, i))->count = 0;
            break;
        default:
            break;
        }
    }
    bool ok = true;
    for (int i = 0; i < DDO_OPT_COUNT && ok; i++) {
        switch (ddo__optdescs[i].type) {
        case DDO__OT_STRING:
        case DDO__OT_ENUM:
            *(char **)ddo__config_field(c, i) =
                ddo__strdup(*(char *const *)ddo__config_cfield(cfg, i));
            ok = *(char **)ddo__config_field(c, i) != NULL;
            break;
        case DDO__OT_LIST:
            ok = strlist_copy(ddo__config_field(c, i), ddo__config_cfield(cfg, i)) == 0;
            break;
        default:
            break;
        }
        c->text[i] = ddo__strdup(cfg->text[i]);
        c->source[i] = ddo__strdup(cfg->source[i]);
        c->rank[i] = cfg->rank[i];
        ok = ok && c->text[i] != NULL && c->source[i] != NULL;
    }
    c->running_on_wsl = cfg->running_on_wsl;
    c->env_defaults = cfg->env_defaults;
    c->detected_ram_gb = cfg->detected_ram_gb;
    c->env_captured = cfg->env_captured;
    c->staging_translated = cfg->staging_translated;
    c->err = cfg->err;
    if (ok)
        c->effective_preset = ddo__strdup(cfg->effective_preset);
    ok = ok && c->effective_preset != NULL;
    ok = ok && ddo__kv_copy(&c->env, &cfg->env) == 0;
    ok = ok && ddo__kv_copy(&c->policies, &cfg->policies) == 0;
    ok = ok && strlist_copy(&c->warnings, &cfg->warnings) == 0;
    if (!ok) {
        ddo_config_destroy(c);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_config_clone: out of memory");
    }
    *out = c;
    return 0;
}

void ddo__config_move(ddo_config *dst, ddo_config *src)
{
    config_free_content(dst);
    *dst = *src;
    free(src);
}

int ddo__config_commit(ddo_config *cfg, ddo_config *c, int rc)
{
    if (rc != 0) {
        cfg->err = c->err;
        ddo_config_destroy(c);
        return rc;
    }
    ddo__config_move(cfg, c);
    return 0;
}

const ddo__options *ddo__config_options(const ddo_config *cfg)
{
    return &cfg->opt;
}

const char *ddo_config_error(const ddo_config *cfg)
{
    return cfg != NULL ? cfg->err.msg : "";
}
