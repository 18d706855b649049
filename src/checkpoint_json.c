/*
 * checkpoint_json.c - what the checkpoint, index and pipeline readers need around jansson:
 * a linear pre-scan of a JSON text that enforces the nesting limit of the official reader and
 * ddo's token limits before anything is allocated (so a hostile header is refused in
 * bounded memory), the rewrite that keeps `-0` a real (the official reader reads it as a
 * float; jansson would make it the integer 0), and quoting of names and reals for messages.
 */
#define _POSIX_C_SOURCE 200809L
#include "checkpoint_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_token_char(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '+' ||
           c == '-' || c == '.';
}

int ddo__checkpoint_json_scan(const char *fname, const char *what, const char *text, size_t len,
                              size_t *neg_zeros)
{
    size_t depth = 0, tokens = 0, containers = 0, zeros = 0;
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
            if (containers > DDO__CHECKPOINT_MAX_JSON_CONTAINERS)
                return ddo__fail(NULL, DDO_E_FORMAT,
                                 "%s: %s holds more than %d JSON arrays and objects (ddo's limit, "
                                 "stricter than the official reader; see docs/inspect.md)",
                                 fname, what, DDO__CHECKPOINT_MAX_JSON_CONTAINERS);
        } else if (c == '}' || c == ']') {
            if (depth > 0)
                depth--;
        } else if (is_token_char(c)) {
            size_t start = i;
            while (i + 1 < len && is_token_char((unsigned char)text[i + 1]))
                i++;
            if (i - start == 1 && c == '-' && text[i] == '0')
                zeros++;
            tokens++;
        }
        if (tokens > DDO__CHECKPOINT_MAX_JSON_TOKENS)
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: %s holds more than %d JSON keys and values (ddo's limit, "
                             "stricter than the official reader; see docs/inspect.md)",
                             fname, what, DDO__CHECKPOINT_MAX_JSON_TOKENS);
    }
    *neg_zeros = zeros;
    return 0;
}

char *ddo__checkpoint_json_real_zeros(const char *text, size_t len, size_t zeros, size_t *out_len)
{
    size_t n = len + 2 * zeros;
    char *out = ddo__malloc(n + 1);
    if (out == NULL)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c == '"') {
            out[o++] = text[i];
            for (i++; i < len && text[i] != '"'; i++) {
                out[o++] = text[i];
                if (text[i] == '\\' && i + 1 < len)
                    out[o++] = text[++i];
            }
            if (i < len)
                out[o++] = text[i];
            continue;
        }
        if (is_token_char((unsigned char)c)) {
            size_t start = i;
            while (i + 1 < len && is_token_char((unsigned char)text[i + 1]))
                i++;
            memcpy(out + o, text + start, i - start + 1);
            o += i - start + 1;
            if (i - start == 1 && c == '-' && text[i] == '0') {
                memcpy(out + o, ".0", 2);
                o += 2;
            }
            continue;
        }
        out[o++] = c;
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

int ddo__checkpoint_json_load(const char *fname, const char *what, const char *text, size_t len,
                              json_t **out)
{
    size_t zeros = 0;
    int rc = ddo__checkpoint_json_scan(fname, what, text, len, &zeros);
    if (rc != 0)
        return rc;
    char *fixed = NULL;
    if (zeros > 0) {
        fixed = ddo__checkpoint_json_real_zeros(text, len, zeros, &len);
        if (fixed == NULL)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory reading the %s", fname,
                             what);
    }
    json_error_t jerr;
    json_t *root = json_loadb(fixed != NULL ? fixed : text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(fixed);
    if (root == NULL)
        return ddo__checkpoint_json_failure(fname, what, &jerr);
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

static const char *quote(const char *s, bool quotes)
{
    static _Thread_local char ring[QUOTE_SLOTS][QUOTE_BYTES];
    static _Thread_local unsigned next;
    char *buf = ring[next++ % QUOTE_SLOTS];
    if (s == NULL)
        return "(null)";
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)s;
    for (; *p != '\0'; p++) {
        char tmp[8];
        size_t n;
        unsigned char c = *p;
        if (c == '\n' || c == '\r' || c == '\t' || (quotes && (c == '\\' || c == '"'))) {
            tmp[0] = '\\';
            tmp[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : (char)c;
            n = 2;
        } else if (c < 0x20 || c == 0x7f) {
            n = (size_t)snprintf(tmp, sizeof(tmp), "\\x%02x", c);
        } else if (c == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
            /* C1 controls (U+0080..U+009F; U+009B is a terminal's CSI) */
            n = (size_t)snprintf(tmp, sizeof(tmp), "\\u%04x", p[1]);
            p++;
        } else {
            tmp[0] = (char)c;
            n = 1;
        }
        if (o + n + 4 > QUOTE_BYTES) {
            memcpy(buf + o, "...", 4);
            return buf;
        }
        memcpy(buf + o, tmp, n);
        o += n;
    }
    buf[o] = '\0';
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
