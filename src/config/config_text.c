/*
 * config_text.c - the configuration's text helpers, shared by its files: trimming and
 * lowercasing, the boolean vocabularies (the environment's and the strict one), the edit
 * distance behind "nearest:" suggestions, quoting for one-line messages, the canonical text
 * of a double; and the NAME=VALUE lists (captured DDO_* variables, API component policies).
 */
#include "config/config_priv.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

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

void ddo__config_quote(const char *s, char *buf, size_t len)
{
    ddo__quote(s, true, buf, len);
}

void ddo__config_fmt_double(double v, char *buf, size_t len)
{
    ddo__format_real(v, buf, len);
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
