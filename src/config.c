/*
 * config.c - the option catalog as data, a config's values with their
 * sources, typed set/get, iteration, validation and the settings object.
 * Presets live in presets.c, the environment in config_env.c, --ddo-* flags
 * in config_args.c, component routes in components.c, JSON and docs in
 * config_doc.c.
 */
#include "config_priv.h"
#include "route.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const ddo__optdesc ddo__optdescs[DDO_OPT_COUNT] = {
#define DDO_OPT(key, type, def, lo, hi, choices, env, flag, help) \
    { #key,         DDO__OT_##type,                               \
      def,          (double)(lo),                                 \
      (double)(hi), choices,                                      \
      env,          flag,                                         \
      help,         offsetof(ddo__options, key) },
#include "options.def"
#undef DDO_OPT
};

/* ------------------------------------------------------------------------ */
/* Small text helpers                                                        */
/* ------------------------------------------------------------------------ */

char *ddo__config_trim_lower(const char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        n--;
    char *d = ddo__strndup(s, n);
    if (d != NULL)
        for (size_t i = 0; i < n; i++)
            d[i] = (char)tolower((unsigned char)d[i]);
    return d;
}

static bool word_is(const char *s, const char *const *words)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        n--;
    for (; *words != NULL; words++)
        if (strlen(*words) == n) {
            size_t i = 0;
            while (i < n && tolower((unsigned char)s[i]) == (*words)[i])
                i++;
            if (i == n)
                return true;
        }
    return false;
}

static const char *const true_words[] = { "1", "true", "yes", "on", NULL };
static const char *const false_words[] = { "0", "false", "no", "off", NULL };

bool ddo__config_env_bool(const char *s)
{
    return word_is(s, true_words);
}

int ddo__config_strict_bool(const char *s, bool *out)
{
    if (word_is(s, true_words)) {
        *out = true;
        return 0;
    }
    if (word_is(s, false_words)) {
        *out = false;
        return 0;
    }
    return -1;
}

size_t ddo__edit_distance(const char *a, const char *b)
{
    /* Suggestions are for typos of short names: a hostile 1 MB name costs nothing. */
    if (strlen(a) > 256 || strlen(b) > 256)
        return SIZE_MAX;
    size_t la = strlen(a), lb = strlen(b);
    size_t *row = ddo__calloc(lb + 1, sizeof(size_t));
    if (row == NULL)
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t best = diag + cost;
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    size_t d = row[lb];
    free(row);
    return d;
}

void ddo__config_fmt_double(double v, char *buf, size_t len)
{
    ddo_format_real(v, buf, len);
}

/* ------------------------------------------------------------------------ */
/* kvlist                                                                    */
/* ------------------------------------------------------------------------ */

const ddo__kv *ddo__kv_find(const ddo__kvlist *l, const char *name)
{
    for (size_t i = 0; i < l->count; i++)
        if (strcmp(l->items[i].name, name) == 0)
            return &l->items[i];
    return NULL;
}

int ddo__kv_set(ddo__kvlist *l, const char *name, const char *value)
{
    char *v = ddo__strdup(value);
    if (v == NULL)
        return DDO_E_NO_MEMORY;
    for (size_t i = 0; i < l->count; i++)
        if (strcmp(l->items[i].name, name) == 0) {
            free(l->items[i].value);
            l->items[i].value = v;
            return 0;
        }
    char *n = ddo__strdup(name);
    ddo__kv *items = ddo__reallocarray(l->items, l->count + 1, sizeof(*items));
    if (n == NULL || items == NULL) {
        free(n);
        free(v);
        if (items != NULL)
            l->items = items;
        return DDO_E_NO_MEMORY;
    }
    l->items = items;
    l->items[l->count].name = n;
    l->items[l->count].value = v;
    l->count++;
    return 0;
}

void ddo__kv_free(ddo__kvlist *l)
{
    for (size_t i = 0; i < l->count; i++) {
        free(l->items[i].name);
        free(l->items[i].value);
    }
    free(l->items);
    l->items = NULL;
    l->count = 0;
}

int ddo__kv_copy(ddo__kvlist *dst, const ddo__kvlist *src)
{
    dst->items = NULL;
    dst->count = 0;
    for (size_t i = 0; i < src->count; i++)
        if (ddo__kv_set(dst, src->items[i].name, src->items[i].value) != 0) {
            ddo__kv_free(dst);
            return DDO_E_NO_MEMORY;
        }
    return 0;
}

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

static void *field(ddo_config *cfg, int id)
{
    return (char *)&cfg->opt + ddo__optdescs[id].offset;
}

static const void *cfield(const ddo_config *cfg, int id)
{
    return (const char *)&cfg->opt + ddo__optdescs[id].offset;
}

/* Frees the heap parts of a value. */
static void value_free(ddo_config *cfg, int id)
{
    switch (ddo__optdescs[id].type) {
    case DDO__OT_STRING:
    case DDO__OT_ENUM: {
        char **p = field(cfg, id);
        free(*p);
        *p = NULL;
        break;
    }
    case DDO__OT_LIST:
        strlist_free(field(cfg, id));
        break;
    default:
        break;
    }
}

/* The canonical text of the current value (new string). */
static char *value_text(const ddo_config *cfg, int id)
{
    char buf[64];
    const void *f = cfield(cfg, id);
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
 * decimal exponent; nothing before or after (ddo_decimal_syntax). strtod alone would also take
 * leading spaces, hexadecimal (0x10), inf, nan and locale forms; those are refused here.
 */
static int parse_double(const char *s, double *out)
{
    if (!ddo_decimal_syntax(s, false))
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
    if (!ddo_decimal_syntax(s, true))
        return -1;
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE)
        return -1;
    *out = (int64_t)v;
    return 0;
}

void ddo__config_quote(const char *s, char *buf, size_t len)
{
    ddo__quote(s, true, buf, len);
}

/* Options whose out-of-range values ddo_config_validate clamps (upstream normalisation)
 * instead of refusing: the pin ratio (to 0..1) and worker counts below one (to 1). */
static bool clamped_below(int id)
{
    return id == DDO_OPT_ID_pin_weight_budget_ratio || id == DDO_OPT_ID_pin_cpu_workers;
}

/* The catalog range, checked before a value is stored (nothing is cast before this). */
static int check_range(ddo_config *cfg, int id, double v, const char *text, const char *origin,
                       bool kib)
{
    const ddo__optdesc *d = &ddo__optdescs[id];
    double scale = d->type == DDO__OT_KB && kib ? 1024.0 : 1.0;
    bool low = v < d->lo && !clamped_below(id);
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
        if (v->l.count > DDO__CONFIG_MAX_LIST_ITEMS) {
            size_t n = v->l.count;
            strlist_free(&v->l);
            return ddo__fail(&cfg->err, DDO_E_CONFIG,
                             "%s: %zu patterns, more than the %d a list "
                             "may hold",
                             origin, n, DDO__CONFIG_MAX_LIST_ITEMS);
        }
        return 0;
    }
    if (v->s == NULL)
        return ddo__fail(&cfg->err, DDO_E_NO_MEMORY, "%s: out of memory", origin);
    return 0;
}

/* Moves v into option id's field (the old value freed). */
static void put_value(ddo_config *cfg, int id, const ovalue *v)
{
    value_free(cfg, id);
    void *f = field(cfg, id);
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

int ddo__config_store(ddo_config *cfg, int id, const char *text, ddo__rank rank, const char *source,
                      const char *origin, bool env_rules, bool kib)
{
    const ddo__optdesc *d = &ddo__optdescs[id];
    if ((int)rank < (int)cfg->rank[id])
        return 0;
    if (id == DDO_OPT_ID_vmm_staging_buffer_gb)
        cfg->staging_translated = false;
    ovalue v;
    memset(&v, 0, sizeof(v));
    int rc = parse_value(cfg, id, text, origin, env_rules, kib, &v);
    if (rc != 0)
        return rc;
    char *src = ddo__strdup(source);
    if (src == NULL) {
        if (d->type == DDO__OT_STRING || d->type == DDO__OT_ENUM)
            free(v.s);
        else if (d->type == DDO__OT_LIST)
            strlist_free(&v.l);
        return ddo__fail(&cfg->err, DDO_E_NO_MEMORY, "%s: out of memory", origin);
    }
    put_value(cfg, id, &v);
    char *t = value_text(cfg, id);
    free(cfg->text[id]);
    cfg->text[id] = t != NULL ? t : ddo__strdup("");
    free(cfg->source[id]);
    cfg->source[id] = src;
    cfg->rank[id] = (unsigned char)rank;
    return 0;
}

/* The from_env operational defaults (config reference, "DynamicOffloadSettings.from_env"). */
static const char *env_default(const ddo_config *cfg, int id, char *buf, size_t len)
{
    if (!cfg->env_defaults)
        return NULL;
    switch (id) {
    case DDO_OPT_ID_small_tensor_threshold_bytes:
        return "1048576";
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
            *(char **)field(c, i) = NULL;
            break;
        case DDO__OT_LIST:
            ((ddo__strlist *)field(c, i))->items = NULL;
            ((ddo__strlist *)field(c, i))->count = 0;
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
            *(char **)field(c, i) = ddo__strdup(*(char *const *)cfield(cfg, i));
            ok = *(char **)field(c, i) != NULL;
            break;
        case DDO__OT_LIST:
            ok = strlist_copy(field(c, i), cfield(cfg, i)) == 0;
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

const ddo__options *ddo__config_options(const ddo_config *cfg)
{
    return &cfg->opt;
}

const char *ddo_config_error(const ddo_config *cfg)
{
    return cfg != NULL ? cfg->err.msg : "";
}

/* ------------------------------------------------------------------------ */
/* Set and get                                                               */
/* ------------------------------------------------------------------------ */

static int lookup(const ddo_config *cfg, const char *key, const char *fn, int *id)
{
    if (cfg == NULL || key == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "%s: NULL argument", fn);
    int i = ddo__config_find(key);
    if (i < 0) {
        /* Suggest the nearest key. */
        size_t best = SIZE_MAX;
        int bi = 0;
        for (int j = 0; j < DDO_OPT_COUNT; j++) {
            size_t dist = ddo__edit_distance(key, ddo__optdescs[j].key);
            if (dist < best) {
                best = dist;
                bi = j;
            }
        }
        return ddo__fail((ddo__errbuf *)&cfg->err, DDO_E_NOT_FOUND,
                         "%s: unknown option \"%s\" (nearest: %s)", fn, key, ddo__optdescs[bi].key);
    }
    *id = i;
    return 0;
}

/* A write through the API: preset/backend changes re-resolve the preset atomically. */
/* Stores a value set through the API at rank (the route-selecting options re-resolve). */
static int ranked_store(ddo_config *cfg, int id, const char *text, ddo__rank rank,
                        const char *source)
{
    if (id != DDO_OPT_ID_preset && id != DDO_OPT_ID_backend &&
        id != DDO_OPT_ID_vmm_total_staging_gb && id != DDO_OPT_ID_execution_mode)
        return ddo__config_store(cfg, id, text, rank, source, ddo__optdescs[id].key, false, false);
    ddo_config *c;
    int rc = ddo_config_clone(cfg, &c);
    if (rc != 0)
        return ddo__fail_from_last(&cfg->err, rc);
    rc = ddo__config_store(c, id, text, rank, source, ddo__optdescs[id].key, false, false);
    if (rc == 0)
        rc = ddo__config_resolve(c);
    return ddo__config_commit(cfg, c, rc);
}

static int api_store(ddo_config *cfg, int id, const char *text)
{
    return ranked_store(cfg, id, text, DDO__RANK_API, "api");
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

int ddo_config_override(ddo_config *cfg, const char *key, const char *value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_override", &id);
    if (rc != 0)
        return rc;
    if (value == NULL)
        return ddo__fail(&cfg->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_config_override: %s: value is NULL", key);
    return ranked_store(cfg, id, value, DDO__RANK_FLAG, "argument");
}

int ddo_config_set(ddo_config *cfg, const char *key, const char *value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_set", &id);
    if (rc != 0)
        return rc;
    if (value == NULL)
        return ddo__fail(&cfg->err, DDO_E_INVALID_ARGUMENT, "ddo_config_set: %s: value is NULL",
                         key);
    return api_store(cfg, id, value);
}

int ddo_config_set_bool(ddo_config *cfg, const char *key, bool value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_set_bool", &id);
    if (rc != 0)
        return rc;
    if (ddo__optdescs[id].type != DDO__OT_BOOL)
        return ddo__fail(&cfg->err, DDO_E_CONFIG, "ddo_config_set_bool: %s is not a boolean", key);
    return api_store(cfg, id, value ? "true" : "false");
}

int ddo_config_set_int(ddo_config *cfg, const char *key, int64_t value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_set_int", &id);
    if (rc != 0)
        return rc;
    char buf[32];
    snprintf(buf, sizeof(buf), "%" PRId64, value);
    switch (ddo__optdescs[id].type) {
    case DDO__OT_INT:
    case DDO__OT_KB:
    case DDO__OT_GB:
    case DDO__OT_MB:
    case DDO__OT_FLOAT:
        return api_store(cfg, id, buf);
    default:
        return ddo__fail(&cfg->err, DDO_E_CONFIG, "ddo_config_set_int: %s is not numeric", key);
    }
}

int ddo_config_set_double(ddo_config *cfg, const char *key, double value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_set_double", &id);
    if (rc != 0)
        return rc;
    char buf[64];
    switch (ddo__optdescs[id].type) {
    case DDO__OT_GB:
    case DDO__OT_MB:
    case DDO__OT_FLOAT:
        if (!isfinite(value))
            return ddo__fail(&cfg->err, DDO_E_CONFIG, "%s: expected a finite number", key);
        ddo__config_fmt_double(value, buf, sizeof(buf));
        return api_store(cfg, id, buf);
    case DDO__OT_INT:
    case DDO__OT_KB:
        if (!(value == floor(value)) || fabs(value) > 9.0e18) {
            if (isfinite(value))
                ddo__config_fmt_double(value, buf, sizeof(buf));
            else
                snprintf(buf, sizeof(buf), "%s", isnan(value) ? "nan" : "inf");
            return ddo__fail(&cfg->err, DDO_E_CONFIG,
                             "%s=%s: expected a whole number within the range of the option", key,
                             buf);
        }
        snprintf(buf, sizeof(buf), "%" PRId64, (int64_t)value);
        return api_store(cfg, id, buf);
    default:
        return ddo__fail(&cfg->err, DDO_E_CONFIG, "ddo_config_set_double: %s is not numeric", key);
    }
}

int ddo_config_get(const ddo_config *cfg, const char *key, const char **value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_get", &id);
    if (rc != 0)
        return rc;
    if (value == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_get: value is NULL");
    *value = cfg->text[id];
    return 0;
}

int ddo_config_get_bool(const ddo_config *cfg, const char *key, bool *value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_get_bool", &id);
    if (rc != 0)
        return rc;
    if (ddo__optdescs[id].type != DDO__OT_BOOL || value == NULL)
        return ddo__fail((ddo__errbuf *)&cfg->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_config_get_bool: %s is not a boolean", key);
    *value = *(const bool *)cfield(cfg, id);
    return 0;
}

int ddo_config_get_int(const ddo_config *cfg, const char *key, int64_t *value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_get_int", &id);
    if (rc != 0)
        return rc;
    if (value == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_get_int: value is NULL");
    switch (ddo__optdescs[id].type) {
    case DDO__OT_INT:
    case DDO__OT_KB:
        *value = *(const int64_t *)cfield(cfg, id);
        return 0;
    case DDO__OT_BOOL:
        *value = *(const bool *)cfield(cfg, id) ? 1 : 0;
        return 0;
    default:
        return ddo__fail((ddo__errbuf *)&cfg->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_config_get_int: %s is not an integer", key);
    }
}

int ddo_config_get_double(const ddo_config *cfg, const char *key, double *value)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_get_double", &id);
    if (rc != 0)
        return rc;
    if (value == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_get_double: value is NULL");
    switch (ddo__optdescs[id].type) {
    case DDO__OT_INT:
    case DDO__OT_KB:
        *value = (double)*(const int64_t *)cfield(cfg, id);
        return 0;
    case DDO__OT_GB:
    case DDO__OT_MB:
    case DDO__OT_FLOAT:
        *value = *(const double *)cfield(cfg, id);
        return 0;
    default:
        return ddo__fail((ddo__errbuf *)&cfg->err, DDO_E_INVALID_ARGUMENT,
                         "ddo_config_get_double: %s is not numeric", key);
    }
}

int ddo_config_source(const ddo_config *cfg, const char *key, const char **source)
{
    int id;
    int rc = lookup(cfg, key, "ddo_config_source", &id);
    if (rc != 0)
        return rc;
    if (source == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_source: source is NULL");
    *source = cfg->source[id];
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Iteration, warnings, settings                                             */
/* ------------------------------------------------------------------------ */

size_t ddo_config_count(void)
{
    return DDO_OPT_COUNT;
}

static ddo_option_type public_type(ddo__otype t)
{
    switch (t) {
    case DDO__OT_BOOL:
        return DDO_OPTION_BOOL;
    case DDO__OT_INT:
    case DDO__OT_KB:
        return DDO_OPTION_INT;
    case DDO__OT_GB:
        return DDO_OPTION_SIZE_GB;
    case DDO__OT_MB:
        return DDO_OPTION_SIZE_MB;
    case DDO__OT_FLOAT:
        return DDO_OPTION_FLOAT;
    case DDO__OT_STRING:
        return DDO_OPTION_STRING;
    case DDO__OT_ENUM:
        return DDO_OPTION_ENUM;
    case DDO__OT_LIST:
        return DDO_OPTION_LIST;
    }
    return DDO_OPTION_STRING;
}

int ddo_config_entry(const ddo_config *cfg, size_t i, ddo_config_item *out)
{
    if (cfg == NULL || out == NULL || i >= DDO_OPT_COUNT)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_entry: index %zu of %d", i,
                         (int)DDO_OPT_COUNT);
    const ddo__optdesc *d = &ddo__optdescs[i];
    out->key = d->key;
    out->env = d->env;
    out->flag = d->flag;
    out->type = public_type(d->type);
    out->value = cfg->text[i];
    out->source = cfg->source[i];
    out->help = d->help;
    return 0;
}

size_t ddo_config_warning_count(const ddo_config *cfg)
{
    return cfg != NULL ? cfg->warnings.count : 0;
}

const char *ddo_config_warning(const ddo_config *cfg, size_t i)
{
    if (cfg == NULL || i >= cfg->warnings.count)
        return NULL;
    return cfg->warnings.items[i];
}

void ddo_config_set_running_on_wsl(ddo_config *cfg, bool running_on_wsl)
{
    if (cfg != NULL)
        cfg->running_on_wsl = running_on_wsl;
}

/* The route the settings select (docs/options.md, "Routes"). */
static const char *route_of(const ddo_config *cfg)
{
    ddo__route r = DDO__ROUTE_LINEAR;
    bool runtime = ddo__route_lookup(cfg->opt.execution_mode, &r);
    if (runtime && ddo__route_maps(r))
        return ddo__route_name(r);
    if (cfg->effective_preset[0] != '\0')
        return cfg->effective_preset;
    if (runtime)
        return ddo__route_name(r);
    return cfg->opt.plan ? "plan" : "off";
}

int ddo_config_settings(const ddo_config *cfg, ddo_settings *out)
{
    if (cfg == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_settings: NULL argument");
    ddo_settings s;
    s.requested_preset = cfg->opt.preset;
    s.effective_preset = cfg->effective_preset;
    s.backend = cfg->opt.backend;
    s.route = route_of(cfg);
    s.plan = cfg->opt.plan;
    s.enabled = cfg->opt.plan || strcmp(cfg->opt.execution_mode, "plan") != 0;
    s.requested_pin_cpu_memory = cfg->opt.pin_cpu_memory;
    s.disable_pin_on_wsl = cfg->opt.disable_pin_on_wsl;
    s.running_on_wsl = cfg->running_on_wsl;
    s.effective_pin_cpu_memory =
        cfg->opt.pin_cpu_memory && !(cfg->running_on_wsl && cfg->opt.disable_pin_on_wsl);
    *out = s;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Validation                                                                */
/* ------------------------------------------------------------------------ */

#define V(id) cfg->text[DDO_OPT_ID_##id], cfg->source[DDO_OPT_ID_##id]
/* A text value quoted for a one-line message (into the caller's q), and its source. */
#define QV(id) \
    (ddo__config_quote(cfg->text[DDO_OPT_ID_##id], q, sizeof(q)), q), cfg->source[DDO_OPT_ID_##id]

static bool device_ok(const char *s)
{
    if (strcmp(s, "cpu") == 0 || strcmp(s, "cuda") == 0)
        return true;
    if (strncmp(s, "cuda:", 5) != 0 || s[5] == '\0' || strlen(s) > 12)
        return false;
    for (const char *p = s + 5; *p != '\0'; p++)
        if (!isdigit((unsigned char)*p))
            return false;
    return true;
}

static double num_value(const ddo_config *cfg, int id)
{
    switch (ddo__optdescs[id].type) {
    case DDO__OT_INT:
    case DDO__OT_KB:
        return (double)*(const int64_t *)cfield(cfg, id);
    default:
        return *(const double *)cfield(cfg, id);
    }
}

static bool is_numeric(ddo__otype t)
{
    return t == DDO__OT_INT || t == DDO__OT_KB || t == DDO__OT_GB || t == DDO__OT_MB ||
           t == DDO__OT_FLOAT;
}

/* Rewrites a clamped number's text (the source stays). */
static int clamp_to(ddo_config *cfg, int id, double v)
{
    char buf[64];
    if (ddo__optdescs[id].type == DDO__OT_INT || ddo__optdescs[id].type == DDO__OT_KB) {
        *(int64_t *)field(cfg, id) = (int64_t)v;
        snprintf(buf, sizeof(buf), "%" PRId64, (int64_t)v);
    } else {
        *(double *)field(cfg, id) = v;
        ddo__config_fmt_double(v, buf, sizeof(buf));
    }
    char *t = ddo__strdup(buf);
    if (t == NULL)
        return ddo__fail(&cfg->err, DDO_E_NO_MEMORY, "ddo_config_validate: out of memory");
    free(cfg->text[id]);
    cfg->text[id] = t;
    return 0;
}

int ddo__config_check_ranges(const ddo_config *cfg)
{
    for (int i = 0; i < DDO_OPT_COUNT; i++) {
        const ddo__optdesc *d = &ddo__optdescs[i];
        if (!is_numeric(d->type))
            continue;
        double v = num_value(cfg, i);
        if (i == DDO_OPT_ID_pin_weight_budget_ratio
                ? isfinite(v)
                : (v >= d->lo || clamped_below(i)) && v <= d->hi)
            continue;
        char a[64], b[64], t[64];
        ddo__config_fmt_double(d->lo, a, sizeof(a));
        ddo__config_fmt_double(d->hi, b, sizeof(b));
        if (isfinite(v))
            ddo__config_fmt_double(v, t, sizeof(t));
        else
            snprintf(t, sizeof(t), "%s", isnan(v) ? "nan" : "inf");
        return ddo__fail(NULL, DDO_E_CONFIG, "%s=%s (%s): expected a value in %s..%s", d->key, t,
                         cfg->source[i], a, b);
    }
    return 0;
}

static int check_rules(ddo_config *cfg);

int ddo_config_validate(ddo_config *cfg)
{
    if (cfg == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_validate: cfg is NULL");
    const ddo__options *o = &cfg->opt;
    int rc;

    /* Normalisation first: the ratio is clamped to 0..1, worker counts to >= 1. */
    if (o->pin_weight_budget_ratio < 0.0 || o->pin_weight_budget_ratio > 1.0) {
        rc = clamp_to(cfg, DDO_OPT_ID_pin_weight_budget_ratio,
                      o->pin_weight_budget_ratio < 0.0 ? 0.0 : 1.0);
        if (rc != 0)
            return rc;
    }
    if (o->pin_cpu_workers < 1 && (rc = clamp_to(cfg, DDO_OPT_ID_pin_cpu_workers, 1)) != 0)
        return rc;

    if ((rc = ddo__config_check_ranges(cfg)) != 0)
        return ddo__fail_from_last(&cfg->err, rc);
    return check_rules(cfg);
}

/* The devices and the route family. */
static int check_route(ddo_config *cfg)
{
    const ddo__options *o = &cfg->opt;
    char q[160];
    if (!device_ok(o->execution_device))
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "execution_device=\"%s\" (%s): expected cpu, cuda or cuda:N",
                         QV(execution_device));
    if (strcmp(o->offload_device, "cpu") != 0)
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "offload_device=\"%s\" (%s): expected cpu (inactive weights are kept in "
                         "host memory)",
                         QV(offload_device));

    bool is_vmm_backend = strcmp(o->backend, "vmm") == 0;
    ddo__route route = DDO__ROUTE_LINEAR;
    bool runtime = ddo__route_lookup(o->execution_mode, &route);
    if (runtime && ddo__route_maps(route) && !is_vmm_backend)
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "execution_mode=%s (%s) needs backend=vmm, but backend=%s (%s): native "
                         "VMM is never chosen silently; pass --ddo-backend vmm",
                         V(execution_mode), V(backend));
    if (is_vmm_backend && runtime && !ddo__route_maps(route))
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "execution_mode=%s (%s) conflicts with backend=vmm (%s): the vmm backend "
                         "runs vmm_fast_runtime, vmm_runtime or plan",
                         V(execution_mode), cfg->source[DDO_OPT_ID_backend]);
    if (runtime && ddo__route_per_weight(route) && !(o->vmm_resident_weight_budget_gb > 0.0))
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "vmm_resident_weight_budget_gb=%s (%s): execution_mode=vmm_runtime (%s) "
                         "needs a positive mapped weight budget in GiB",
                         V(vmm_resident_weight_budget_gb), cfg->source[DDO_OPT_ID_execution_mode]);
    return 0;
}

/* The cross-option rules (after the numbers are known to be in range). */
static int check_rules(ddo_config *cfg)
{
    int rc = check_route(cfg);
    if (rc != 0)
        return rc;
    const ddo__options *o = &cfg->opt;
    ddo__route route = DDO__ROUTE_LINEAR;
    bool mode_vmm_fast =
        ddo__route_lookup(o->execution_mode, &route) && route == DDO__ROUTE_VMM_FAST;
    if (o->vmm_execution_backing_reclaim && !mode_vmm_fast)
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "vmm_execution_backing_reclaim=true (%s) needs the native fast route "
                         "(execution_mode=vmm_fast_runtime), but execution_mode=%s (%s)",
                         cfg->source[DDO_OPT_ID_vmm_execution_backing_reclaim], V(execution_mode));
    if (o->vmm_component_tensor_ownership && !mode_vmm_fast)
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "vmm_component_tensor_ownership=true (%s) needs the native fast route "
                         "(execution_mode=vmm_fast_runtime), but execution_mode=%s (%s)",
                         cfg->source[DDO_OPT_ID_vmm_component_tensor_ownership], V(execution_mode));
    if (o->vmm_source_registered_gb > 0.0) {
        if (o->vmm_source_registered_gb > o->vmm_source_cache_gb)
            return ddo__fail(&cfg->err, DDO_E_CONFIG,
                             "vmm_source_registered_gb=%s (%s) exceeds vmm_source_cache_gb=%s "
                             "(%s): registration must fit within the retained storage",
                             V(vmm_source_registered_gb), V(vmm_source_cache_gb));
        double segments = o->vmm_source_registered_gb * 16.0; /* 64 MiB = 1/16 GiB */
        if (fabs(segments - round(segments)) > 1e-9)
            return ddo__fail(&cfg->err, DDO_E_CONFIG,
                             "vmm_source_registered_gb=%s (%s): explicit registration must be "
                             "whole 64 MiB segments (a multiple of 0.0625 GiB)",
                             V(vmm_source_registered_gb));
    }
    if ((o->vmm_native_source_cache_slots > 0) != (o->vmm_native_source_cache_slot_mb > 0.0))
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "vmm_native_source_cache_slots=%s (%s) and "
                         "vmm_native_source_cache_slot_mb=%s (%s): the legacy micro-cache takes a "
                         "slot count and a slot size together (both 0 keeps it off)",
                         V(vmm_native_source_cache_slots), V(vmm_native_source_cache_slot_mb));
    if (o->build_profile && o->profile_name[0] == '\0')
        return ddo__fail(&cfg->err, DDO_E_CONFIG,
                         "build_profile=true (%s) needs profile_name: a calibration is saved "
                         "under a workload name",
                         cfg->source[DDO_OPT_ID_build_profile]);
    return 0;
}
