/*
 * common.c - error details, checked allocation, clocks and text buffers
 * shared by every module.
 */
#include "base/common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Thread_local char last_error[DDO_ERRBUF_BYTES];

const char *ddo_version_string(void)
{
    return DDO_VERSION_STRING;
}

unsigned ddo_version_number(void)
{
    return DDO_VERSION_NUMBER;
}

const char *ddo_strerror(int code)
{
    switch (code) {
    case DDO_OK:
        return "success";
#define DDO_ERROR_TEXT_(name, value, text) \
    case name:                             \
        return text;
        DDO_ERRORS(DDO_ERROR_TEXT_)
#undef DDO_ERROR_TEXT_
    default:
        return "unknown error";
    }
}

const char *ddo_errname(int code)
{
    switch (code) {
    case DDO_OK:
        return "DDO_OK";
#define DDO_ERROR_NAME_(name, value, text) \
    case name:                             \
        return #name;
        DDO_ERRORS(DDO_ERROR_NAME_)
#undef DDO_ERROR_NAME_
    default:
        return "DDO_E_UNKNOWN";
    }
}

const char *ddo_last_error(void)
{
    return last_error;
}

void ddo_free(void *p)
{
    free(p);
}

int ddo__vfail(ddo__errbuf *eb, int code, const char *fmt, va_list ap)
{
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    if (eb != NULL) {
        eb->code = code;
        memcpy(eb->msg, last_error, sizeof(eb->msg));
    }
    return code;
}

int ddo__fail(ddo__errbuf *eb, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ddo__vfail(eb, code, fmt, ap);
    va_end(ap);
    return code;
}

int ddo__fail_from_last(ddo__errbuf *eb, int code)
{
    if (eb != NULL) {
        eb->code = code;
        memcpy(eb->msg, last_error, sizeof(eb->msg));
    }
    return code;
}

void ddo__errbuf_clear(ddo__errbuf *eb)
{
    if (eb != NULL) {
        eb->code = 0;
        eb->msg[0] = '\0';
    }
}

void *ddo__malloc(size_t size)
{
    return malloc(size == 0 ? 1 : size);
}

void *ddo__calloc(size_t count, size_t size)
{
    if (count == 0 || size == 0)
        return calloc(1, 1);
    return calloc(count, size);
}

void *ddo__reallocarray(void *p, size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size)
        return NULL;
    size_t n = count * size;
    return realloc(p, n == 0 ? 1 : n);
}

char *ddo__strdup(const char *s)
{
    return ddo__strndup(s, strlen(s));
}

char *ddo__strndup(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d == NULL)
        return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *ddo__asprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (s == NULL)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

bool ddo__mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > UINT64_MAX / a)
        return false;
    *out = a * b;
    return true;
}

bool ddo__add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (b > UINT64_MAX - a)
        return false;
    *out = a + b;
    return true;
}

uint64_t ddo__sat_add_u64(uint64_t a, uint64_t b)
{
    uint64_t r;
    return ddo__add_u64(a, b, &r) ? r : UINT64_MAX;
}

uint64_t ddo__sat_mul_u64(uint64_t a, uint64_t b)
{
    uint64_t r;
    return ddo__mul_u64(a, b, &r) ? r : UINT64_MAX;
}

uint64_t ddo__round_up(uint64_t v, uint64_t align)
{
    uint64_t r = v % align;
    if (r == 0)
        return v;
    if (v > UINT64_MAX - (align - r))
        return UINT64_MAX;
    return v + (align - r);
}

uint64_t ddo__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t ddo__gb_to_bytes(double gb)
{
    if (!(gb > 0.0))
        return 0;
    double b = gb * (double)DDO_GIB;
    if (b >= 18446744073709551615.0)
        return UINT64_MAX;
    return (uint64_t)b;
}

double ddo__bytes_to_gb(uint64_t bytes)
{
    return (double)bytes / (double)DDO_GIB;
}

void ddo__sbuf_init(ddo__sbuf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->ok = true;
}

static bool sbuf_reserve(ddo__sbuf *b, size_t extra)
{
    if (!b->ok)
        return false;
    if (b->len + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap == 0 ? 256 : b->cap;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2) {
            b->ok = false;
            return false;
        }
        cap *= 2;
    }
    char *d = realloc(b->data, cap);
    if (d == NULL) {
        b->ok = false;
        return false;
    }
    b->data = d;
    b->cap = cap;
    return true;
}

void ddo__sbuf_append(ddo__sbuf *b, const char *s, size_t n)
{
    if (!sbuf_reserve(b, n))
        return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void ddo__sbuf_printf(ddo__sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->ok = false;
        return;
    }
    if (!sbuf_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void ddo__sbuf_free(ddo__sbuf *b)
{
    free(b->data);
    ddo__sbuf_init(b);
}

char *ddo__sbuf_take(ddo__sbuf *b)
{
    if (!b->ok) {
        ddo__sbuf_free(b);
        return NULL;
    }
    if (b->data == NULL && !sbuf_reserve(b, 0))
        return NULL;
    char *d = b->data;
    ddo__sbuf_init(b);
    return d;
}
