/*
 * checkpoint_json.c - what the checkpoint, index and pipeline readers need around jansson:
 * a linear pre-scan of a JSON text that enforces the nesting limit of the official reader and
 * ddo's token limits before anything is allocated (so a hostile header is refused in
 * bounded memory), the rewrite that keeps `-0` a real (the official reader reads it as a
 * float; jansson would make it the integer 0), and quoting of names and reals for messages.
 */
#include "checkpoint/checkpoint_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_token_char(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '+' ||
           c == '-' || c == '.';
}

enum { TOK_PLAIN, TOK_REAL, TOK_BIG };

/*
 * What jansson would read otherwise than the official reader in a number token: `-0` (an
 * integer to jansson, a float to the official reader), and integers beyond int64_t (refused by
 * jansson; to the official reader a u64 up to 2^64 - 1, else a float). *big gets the value of a
 * TOK_BIG. Anything else, valid or not, is left to jansson.
 */
static int classify(const char *t, size_t n, uint64_t *big)
{
    size_t d = t[0] == '-' ? 1 : 0;
    if (d >= n || (n - d > 1 && t[d] == '0'))
        return TOK_PLAIN;
    for (size_t i = d; i < n; i++)
        if (t[i] < '0' || t[i] > '9')
            return TOK_PLAIN;
    if (d == 1 && n == 2 && t[1] == '0')
        return TOK_REAL;
    if (n - d < 19)
        return TOK_PLAIN;
    uint64_t v = 0;
    bool over = false;
    for (size_t i = d; i < n && !over; i++) {
        unsigned dig = (unsigned)(t[i] - '0');
        over = v > (UINT64_MAX - dig) / 10;
        v = v * 10 + dig;
    }
    if (d == 1)
        return over || v > (uint64_t)INT64_MAX + 1 ? TOK_REAL : TOK_PLAIN;
    if (over)
        return TOK_REAL;
    if (v > (uint64_t)INT64_MAX) {
        *big = v;
        return TOK_BIG;
    }
    return TOK_PLAIN;
}

int ddo__checkpoint_json_scan(const char *fname, const char *what, const char *text, size_t len,
                              size_t *reals, size_t *bigs)
{
    size_t depth = 0, tokens = 0, containers = 0;
    /* An index or model_index.json needs a handful of objects; a header three per tensor. */
    const size_t max_containers = strcmp(what, "header") == 0
                                      ? DDO__CHECKPOINT_MAX_JSON_CONTAINERS
                                      : DDO__CHECKPOINT_MAX_INDEX_CONTAINERS;
    *reals = *bigs = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '"') {
            for (i++; i < len && text[i] != '"'; i++)
                if (text[i] == '\\')
                    i++;
            tokens++;
        } else if (c == '{' || c == '[') {
            tokens++;
            containers++;
            if (++depth > DDO__CHECKPOINT_MAX_DEPTH)
                return ddo__fail(NULL, DDO_E_FORMAT,
                                 "%s: %s nests arrays and objects more than %d deep (at byte %zu; "
                                 "the official reader's recursion limit)",
                                 fname, what, DDO__CHECKPOINT_MAX_DEPTH, i);
            if (containers > max_containers)
                return ddo__fail(NULL, DDO_E_FORMAT,
                                 "%s: %s holds more than %zu JSON arrays and objects (ddo's limit, "
                                 "stricter than the official reader; see docs/inspect.md)",
                                 fname, what, max_containers);
        } else if (c == '}' || c == ']') {
            if (depth > 0)
                depth--;
        } else if (is_token_char(c)) {
            size_t start = i;
            while (i + 1 < len && is_token_char((unsigned char)text[i + 1]))
                i++;
            uint64_t big;
            int k = classify(text + start, i - start + 1, &big);
            *reals += k == TOK_REAL;
            *bigs += k == TOK_BIG;
            tokens++;
        }
        if (tokens > DDO__CHECKPOINT_MAX_JSON_TOKENS)
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: %s holds more than %d JSON keys and values (ddo's limit, "
                             "stricter than the official reader; see docs/inspect.md)",
                             fname, what, DDO__CHECKPOINT_MAX_JSON_TOKENS);
    }
    return 0;
}

/* Calls fn(ctx, token, n) for every token outside strings, and copies strings and the rest to
 * out (when out is not NULL) as they are; fn writes its token's replacement at *o. */
typedef void (*token_fn)(void *ctx, const char *t, size_t n, char *out, size_t *o);

static void walk(const char *text, size_t len, char *out, size_t *o, token_fn fn, void *ctx)
{
    for (size_t i = 0; i < len; i++) {
        size_t start = i;
        if (text[i] == '"') {
            for (i++; i < len && text[i] != '"'; i++)
                if (text[i] == '\\' && i + 1 < len)
                    i++;
        } else if (is_token_char((unsigned char)text[i])) {
            while (i + 1 < len && is_token_char((unsigned char)text[i + 1]))
                i++;
            fn(ctx, text + start, i - start + 1, out, o);
            continue;
        }
        size_t n = (i < len ? i + 1 : len) - start;
        if (out != NULL)
            memcpy(out + *o, text + start, n);
        *o += n;
    }
}

typedef struct fix_ctx {
    ddo__json_bigs *bigs;
    int64_t *low; /* negative literals that a sentinel could collide with */
    size_t low_count, low_cap;
} fix_ctx;

/* First pass: the literals in [INT64_MIN, INT64_MIN + 2^32), where sentinels live. */
static void collect_low(void *vctx, const char *t, size_t n, char *out, size_t *o)
{
    (void)out;
    (void)o;
    fix_ctx *c = vctx;
    uint64_t big;
    /* The token is not NUL-terminated (it may end the buffer): strtoll reads a copy. An int64
     * literal has at most 20 characters; a longer one is out of range anyway. */
    char lit[32];
    if (t[0] != '-' || n < 20 || n >= sizeof(lit) || classify(t, n, &big) != TOK_PLAIN)
        return;
    memcpy(lit, t, n);
    lit[n] = '\0';
    char *end = NULL;
    long long v = strtoll(lit, &end, 10);
    if (end != lit + n || v >= INT64_MIN + ((int64_t)1 << 32))
        return;
    if (c->low_count == c->low_cap) {
        size_t cap = c->low_cap == 0 ? 16 : c->low_cap * 2;
        int64_t *nl = ddo__reallocarray(c->low, cap, sizeof(*nl));
        if (nl == NULL)
            return; /* at worst a sentinel collides: never a crash */
        c->low = nl;
        c->low_cap = cap;
    }
    c->low[c->low_count++] = (int64_t)v;
}

/* Second pass: -0 and out-of-range integers as reals, u64 beyond int64 as sentinels. */
static void rewrite(void *vctx, const char *t, size_t n, char *out, size_t *o)
{
    fix_ctx *c = vctx;
    uint64_t big = 0;
    int k = classify(t, n, &big);
    if (k == TOK_BIG) {
        ddo__json_bigs *b = c->bigs;
        b->values[b->count] = big;
        *o += (size_t)sprintf(out + *o, "%" PRId64, (int64_t)(b->base + (json_int_t)b->count));
        b->count++;
        return;
    }
    memcpy(out + *o, t, n);
    *o += n;
    if (k == TOK_REAL) {
        memcpy(out + *o, ".0", 2);
        *o += 2;
    }
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

char *ddo__checkpoint_json_fix_numbers(const char *text, size_t len, size_t reals, size_t bigs,
                                       ddo__json_bigs *table, size_t *out_len)
{
    fix_ctx c = { table, NULL, 0, 0 };
    memset(table, 0, sizeof(*table));
    table->base = INT64_MIN;
    if (bigs > 0) {
        table->values = ddo__calloc(bigs, sizeof(*table->values));
        if (table->values == NULL)
            return NULL;
        size_t ignored = 0;
        walk(text, len, NULL, &ignored, collect_low, &c);
        if (c.low_count > 1)
            qsort(c.low, c.low_count, sizeof(*c.low), cmp_i64);
        for (size_t i = 0; i < c.low_count; i++) /* the first gap of `bigs` free values */
            if (c.low[i] >= table->base && (uint64_t)c.low[i] - (uint64_t)table->base < bigs)
                table->base = c.low[i] + 1;
        free(c.low);
    }
    char *out = ddo__malloc(len + 2 * reals + bigs + 1);
    if (out == NULL) {
        free(table->values);
        table->values = NULL;
        return NULL;
    }
    size_t o = 0;
    walk(text, len, out, &o, rewrite, &c);
    out[o] = '\0';
    *out_len = o;
    return out;
}

void ddo__json_bigs_free(ddo__json_bigs *b)
{
    if (b != NULL) {
        free(b->values);
        memset(b, 0, sizeof(*b));
    }
}

bool ddo__json_bigs_get(const ddo__json_bigs *b, const json_t *v, uint64_t *out)
{
    if (b == NULL || b->count == 0 || !json_is_integer(v))
        return false;
    json_int_t x = json_integer_value(v);
    uint64_t k = (uint64_t)x - (uint64_t)b->base; /* unsigned: no overflow */
    if (x < b->base || k >= b->count)
        return false;
    *out = b->values[k];
    return true;
}

int ddo__checkpoint_json_load(const char *fname, const char *what, const char *text, size_t len,
                              json_t **out, ddo__json_bigs *bigs)
{
    size_t reals = 0, nbig = 0;
    ddo__json_bigs local;
    ddo__json_bigs *table = bigs != NULL ? bigs : &local;
    memset(table, 0, sizeof(*table));
    int rc = ddo__checkpoint_json_scan(fname, what, text, len, &reals, &nbig);
    if (rc != 0)
        return rc;
    char *fixed = NULL;
    if (reals + nbig > 0) {
        fixed = ddo__checkpoint_json_fix_numbers(text, len, reals, nbig, table, &len);
        if (fixed == NULL)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory reading the %s", fname,
                             what);
    }
    json_error_t jerr;
    json_t *root = json_loadb(fixed != NULL ? fixed : text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(fixed);
    if (table == &local)
        ddo__json_bigs_free(&local);
    if (root == NULL) {
        ddo__json_bigs_free(bigs);
        return ddo__checkpoint_json_failure(fname, what, &jerr);
    }
    *out = root;
    return 0;
}

/* ---- quoting for messages ---- */

#define QUOTE_SLOTS 6
#define QUOTE_BYTES 320

static const char *quote(const char *s, bool quotes);

const char *ddo__checkpoint_quote(const char *s)
{
    return quote(s, true);
}

const char *ddo__checkpoint_quote_text(const char *s)
{
    return quote(s, false);
}

/* Into the next of a few per-thread buffers, so several may appear in one message. */
static const char *quote(const char *s, bool quotes)
{
    static _Thread_local char ring[QUOTE_SLOTS][QUOTE_BYTES];
    static _Thread_local unsigned next;
    if (s == NULL)
        return "(null)";
    char *buf = ring[next++ % QUOTE_SLOTS];
    ddo__quote(s, quotes, buf, QUOTE_BYTES);
    return buf;
}

void ddo__checkpoint_format_real(char *buf, size_t len, double v)
{
    if (!isfinite(v)) {
        snprintf(buf, len, "%s", isnan(v) ? "nan" : v < 0 ? "-inf" : "inf");
        return;
    }
    /* The shortest text that reads back as v, marked as a real when it looks like an integer
     * (so 1e3 reads "1000.0", never a bare "1000" that contradicts "not an integer"). */
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, len, "%.1f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    if (strpbrk(buf, ".eE") == NULL && strlen(buf) + 3 <= len)
        strcat(buf, ".0");
}

/* ---- helpers of the readers' messages and JSON values ---- */

/* "[4, 3, 3, 3]" from dims. */
void ddo__checkpoint_format_dims(char *buf, size_t len, const uint64_t *dims, size_t n)
{
    size_t at = 0;
    int w = snprintf(buf, len, "[");
    at = w > 0 ? (size_t)w : 0;
    for (size_t i = 0; i < n && at < len; i++) {
        w = snprintf(buf + at, len - at, "%s%" PRIu64, i ? ", " : "", dims[i]);
        if (w < 0)
            return;
        at += (size_t)w;
    }
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

const char *ddo__checkpoint_json_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
    default:
        return "null";
    }
}

/* Maps a jansson error to the broken rule; what is "header", "index" or the like. */
int ddo__checkpoint_json_failure(const char *fname, const char *what, const json_error_t *jerr)
{
    if (json_error_code(jerr) == json_error_duplicate_key) {
        const char *near = strstr(jerr->text, "near '");
        const char *key = near != NULL ? near + 6 : "?";
        size_t klen = strlen(key);
        if (klen > 0 && key[klen - 1] == '\'')
            klen--;
        if (klen >= 2 && key[0] == '"' && key[klen - 1] == '"') {
            key++;
            klen -= 2;
        }
        char *k = ddo__strndup(key, klen);
        int rc = ddo__fail(NULL, DDO_E_FORMAT,
                           "%s: duplicate key \"%s\" in the %s at line %d, column %d (rejected: "
                           "stricter than the official library, which keeps the last)",
                           fname, ddo__checkpoint_quote(k != NULL ? k : "?"), what, jerr->line,
                           jerr->column);
        free(k);
        return rc;
    }
    if (json_error_code(jerr) == json_error_premature_end_of_input && jerr->position == 0)
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: %s is empty, not a JSON object", fname, what);
    /* A key holding NUL (\u0000) is valid JSON that jansson cannot represent. */
    bool nul_key = strstr(jerr->text, "NUL byte in object key") != NULL;
    return ddo__fail(NULL, DDO_E_FORMAT, "%s: %s is not valid JSON: %s at line %d, column %d%s",
                     fname, what, ddo__checkpoint_quote_text(jerr->text), jerr->line, jerr->column,
                     nul_key ? " (refused: stricter than the official reader)" : "");
}

/* A non-negative JSON integer, or false. */
bool ddo__checkpoint_json_u64(const json_t *v, const ddo__json_bigs *bigs, uint64_t *out)
{
    if (ddo__json_bigs_get(bigs, v, out))
        return true;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

int ddo__checkpoint_cmp_offset(const void *a, const void *b)
{
    const ddo_tensor_info *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

int ddo__checkpoint_os_failure(const char *path, const char *what, int e)
{
    if (e == DDO__OS_EOF)
        return ddo__fail(NULL, DDO_E_IO, "%s: %s: unexpected end of file",
                         ddo__checkpoint_quote(path), what);
    if (e == DDO__OS_NOT_REGULAR || e == EISDIR)
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: not a regular file (%s)",
                         ddo__checkpoint_quote(path),
                         e == EISDIR ? "a directory" : "a FIFO, socket or device");
    return ddo__fail(NULL, e == ENOENT ? DDO_E_NOT_FOUND : DDO_E_IO, "%s: %s: %s",
                     ddo__checkpoint_quote(path), what, ddo__os_file_strerror(e));
}
