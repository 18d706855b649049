/*
 * text.c - the text helpers every module's messages share: quoting a value for a one-line
 * message, the strict decimal syntax of numbers, byte counts in binary units, the shortest text
 * of a real that reads back as the same value, and the one parser of device specs. The private
 * static library ddo_support (base/support.h), linked into libddo and the ddo tool, so the tool
 * writes its messages and reads device specs the same way; not exported by libddo.
 */
#include "base/common.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One byte (or a C1 control, two bytes) escaped into e; returns its length and how many input
 * bytes it took in *used. */
static size_t quote_one(const unsigned char *p, bool quotes, char e[8], size_t *used)
{
    unsigned char c = p[0];
    *used = 1;
    if (c == '\n' || c == '\r' || c == '\t' || (quotes && (c == '\\' || c == '"'))) {
        e[0] = '\\';
        e[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : (char)c;
        e[2] = '\0';
        return 2;
    }
    if (c < 0x20 || c == 0x7f)
        return (size_t)snprintf(e, 8, "\\x%02x", c);
    if (c == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
        /* C1 controls (U+0080..U+009F; U+009B is a terminal's CSI) */
        *used = 2;
        return (size_t)snprintf(e, 8, "\\u%04x", p[1]);
    }
    e[0] = (char)c;
    e[1] = '\0';
    return 1;
}

void ddo__quote(const char *s, bool quotes, char *buf, size_t len)
{
    if (len == 0)
        return;
    const unsigned char *p = (const unsigned char *)(s != NULL ? s : "");
    size_t o = 0, keep = 0; /* keep: the end of the text that still leaves room for "..." */
    while (*p != '\0') {
        char e[8];
        size_t used = 1;
        size_t n = quote_one(p, quotes, e, &used);
        if (o + n + 1 > len)
            break;
        memcpy(buf + o, e, n);
        o += n;
        p += used;
        if (o + 4 <= len)
            keep = o;
    }
    if (*p != '\0') { /* cut: end with "..." where it fits */
        o = keep;
        size_t dots = len - 1 - o < 3 ? len - 1 - o : 3;
        memcpy(buf + o, "...", dots);
        o += dots;
    }
    buf[o] = '\0';
}

bool ddo__decimal_syntax(const char *s, bool integer)
{
    if (s == NULL)
        return false;
    const char *p = s;
    if (*p == '+' || *p == '-')
        p++;
    size_t digits = 0;
    while (isdigit((unsigned char)*p))
        p++, digits++;
    if (!integer && *p == '.') {
        p++;
        while (isdigit((unsigned char)*p))
            p++, digits++;
    }
    if (digits == 0)
        return false;
    if (!integer && (*p == 'e' || *p == 'E')) {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!isdigit((unsigned char)*p))
            return false;
        while (isdigit((unsigned char)*p))
            p++;
    }
    return *p == '\0';
}

const char *ddo__format_gib(uint64_t bytes, char *buf, size_t len)
{
    snprintf(buf, len, "%.2f GiB", (double)bytes / (double)DDO_GIB);
    return buf;
}

const char *ddo__format_bytes(uint64_t bytes, char *buf, size_t len)
{
    if (bytes >= DDO_GIB)
        ddo__format_gib(bytes, buf, len);
    else if (bytes >= DDO_MIB)
        snprintf(buf, len, "%.2f MiB", (double)bytes / (double)DDO_MIB);
    else if (bytes >= DDO_KIB)
        snprintf(buf, len, "%.2f KiB", (double)bytes / (double)DDO_KIB);
    else
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    return buf;
}

void ddo__format_real(double v, char *buf, size_t len)
{
    if (len == 0)
        return;
    if (v == 0.0)
        v = 0.0; /* no "-0" */
    if (fabs(v) < 1e15 && v == floor(v)) {
        snprintf(buf, len, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

bool ddo__device_spec_parse(const char *spec, ddo__device_spec *out)
{
    if (spec == NULL)
        return false;
    bool cuda = strncmp(spec, "cuda", 4) == 0;
    if (!cuda && strncmp(spec, "cpu", 3) != 0)
        return false;
    const char *p = spec + (cuda ? 4 : 3);
    ddo__device_spec d = { cuda, *p == ':', 0 };
    if (*p != '\0' && !d.numbered)
        return false;
    if (d.numbered) {
        size_t n = strlen(++p);
        if (n == 0 || n > 6)
            return false;
        for (size_t i = 0; i < n; i++) {
            if (p[i] < '0' || p[i] > '9')
                return false;
            d.ordinal = d.ordinal * 10 + (p[i] - '0');
        }
    }
    if (out != NULL)
        *out = d;
    return true;
}
