/*
 * config_args.c - the --ddo-* flags: parsing them out of argc/argv (the
 * host keeps its own arguments) and their help text, both generated from the
 * catalog. Flags build a config directly; they do not merge the environment.
 */
#include "config/config_priv.h"

#include "os/thread.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_bool_word(const char *s)
{
    bool b;
    return ddo__config_strict_bool(s, &b) == 0;
}

static int unknown_flag(ddo_config *cfg, const char *name)
{
    size_t best = SIZE_MAX;
    const char *near = NULL;
    for (int i = 0; i < DDO_OPT_COUNT; i++) {
        if (ddo__optdescs[i].flag[0] == '\0')
            continue;
        size_t d = ddo__edit_distance(name, ddo__optdescs[i].flag);
        if (d < best) {
            best = d;
            near = ddo__optdescs[i].flag;
        }
    }
    char q[160];
    ddo__config_quote(name, q, sizeof(q));
    if (near != NULL && best * 4 <= strlen(name))
        return ddo__fail(&cfg->err, DDO_E_CONFIG, "unknown flag %s (did you mean %s?)", q, near);
    return ddo__fail(&cfg->err, DDO_E_CONFIG,
                     "unknown flag %s (`ddo config --list` lists every --ddo-* flag)", q);
}

static int parse(ddo_config *cfg, int argc, char **argv, char **keep, int *kept)
{
    int out = 0;
    if (argc > 0)
        keep[out++] = argv[0];
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            for (; i < argc; i++)
                keep[out++] = argv[i];
            break;
        }
        if (strncmp(a, "--ddo-", 6) != 0) {
            keep[out++] = a;
            continue;
        }
        const char *eq = strchr(a, '=');
        size_t n = eq != NULL ? (size_t)(eq - a) : strlen(a);
        char name[128];
        if (n >= sizeof(name))
            n = sizeof(name) - 1;
        memcpy(name, a, n);
        name[n] = '\0';
        int id = ddo__config_find_flag(name);
        if (id < 0)
            return unknown_flag(cfg, name);
        const char *value;
        if (eq != NULL)
            value = eq + 1;
        else if (ddo__optdescs[id].type == DDO__OT_BOOL)
            value = i + 1 < argc && is_bool_word(argv[i + 1]) ? argv[++i] : "true";
        else if (i + 1 < argc)
            value = argv[++i];
        else
            return ddo__fail(&cfg->err, DDO_E_CONFIG, "%s: expects a value", name);
        int rc = ddo__config_store(cfg, id, value, DDO__RANK_FLAG, "flag", name, false, true);
        if (rc != 0)
            return rc;
    }
    /* The flag helper's default preset is auto (linear -> one_shot_fast). */
    if (cfg->opt.preset[0] == '\0' && cfg->rank[DDO_OPT_ID_preset] == DDO__RANK_DEFAULT) {
        int rc = ddo__config_store(cfg, DDO_OPT_ID_preset, "auto", DDO__RANK_DEFAULT, "default",
                                   "preset", false, false);
        if (rc != 0)
            return rc;
    }
    int rc = ddo__config_resolve(cfg);
    if (rc != 0)
        return rc;
    *kept = out;
    return 0;
}

int ddo_config_parse_args(ddo_config *cfg, int *argc, char **argv)
{
    if (cfg == NULL || argc == NULL || *argc < 0 || (argv == NULL && *argc > 0))
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_config_parse_args: NULL argument");
    char **keep = ddo__calloc((size_t)*argc + 1, sizeof(char *));
    ddo_config *c = NULL;
    int rc = keep == NULL ? DDO_E_NO_MEMORY : ddo_config_clone(cfg, &c);
    if (rc != 0) {
        free(keep);
        return ddo__fail(&cfg->err, rc, "ddo_config_parse_args: out of memory");
    }
    int kept = 0;
    rc = parse(c, *argc, argv, keep, &kept);
    if (rc != 0) {
        cfg->err = c->err;
        ddo_config_destroy(c);
        free(keep);
        return rc;
    }
    ddo__config_move(cfg, c);
    for (int i = 0; i < kept; i++)
        argv[i] = keep[i];
    argv[kept] = NULL;
    *argc = kept;
    free(keep);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Help                                                                      */
/* ------------------------------------------------------------------------ */

static const char *metavar(const ddo__optdesc *d)
{
    switch (d->type) {
    case DDO__OT_BOOL:
        return "[BOOL]";
    case DDO__OT_INT:
        return "N";
    case DDO__OT_KB:
        return "KIB";
    case DDO__OT_GB:
        return "GIB";
    case DDO__OT_MB:
        return "MIB";
    case DDO__OT_FLOAT:
        return "X";
    case DDO__OT_STRING:
        return "TEXT";
    case DDO__OT_ENUM:
        return "WORD";
    case DDO__OT_LIST:
        return "REGEX[,REGEX...]";
    }
    return "VALUE";
}

static char *help_text;
static ddo__once_flag help_once = DDO__ONCE_INIT;

static void build_help(void)
{
    ddo__sbuf b;
    ddo__sbuf_init(&b);
    ddo__sbuf_printf(&b, "ddo options (flags win over DDO_* variables; booleans take 1, true, "
                         "yes, on or 0, false, no, off):\n");
    for (int i = 0; i < DDO_OPT_COUNT; i++) {
        const ddo__optdesc *d = &ddo__optdescs[i];
        if (d->flag[0] == '\0')
            continue;
        ddo__sbuf_printf(&b, "  %s %s\n      %s", d->flag, metavar(d), d->help);
        if (d->type == DDO__OT_ENUM) {
            ddo__sbuf_printf(&b, " [");
            for (const char *p = d->choices;;) {
                size_t m = strcspn(p, "|");
                ddo__sbuf_printf(&b, "%s%.*s", p == d->choices ? "" : ", ", m == 0 ? 2 : (int)m,
                                 m == 0 ? "\"\"" : p);
                if (p[m] == '\0')
                    break;
                p += m + 1;
            }
            ddo__sbuf_printf(&b, "]");
        }
        if (d->type == DDO__OT_KB)
            ddo__sbuf_printf(&b, " (default %lld KiB", atoll(d->def) / 1024);
        else
            ddo__sbuf_printf(&b, " (default %s%s%s", d->def[0] == '\0' ? "\"" : "", d->def,
                             d->def[0] == '\0' ? "\"" : "");
        if (d->env[0] != '\0')
            ddo__sbuf_printf(&b, "; %s", d->env);
        ddo__sbuf_printf(&b, ")\n");
    }
    help_text = ddo__sbuf_take(&b);
}

const char *ddo_config_flags_help(void)
{
    ddo__once(&help_once, build_help);
    return help_text != NULL ? help_text : "";
}
