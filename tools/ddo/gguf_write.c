/*
 * gguf_write.c - the header of a GGUF v3 file (gguf_write.h).
 */
#include "gguf_write.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

int tool_gguf_type(ddo_dtype dtype)
{
    static const struct {
        ddo_dtype dt;
        int id;
    } map[] = {
        { DDO_DTYPE_F32, 0 },     { DDO_DTYPE_F16, 1 },      { DDO_DTYPE_Q4_0, 2 },
        { DDO_DTYPE_Q4_1, 3 },    { DDO_DTYPE_Q5_0, 6 },     { DDO_DTYPE_Q5_1, 7 },
        { DDO_DTYPE_Q8_0, 8 },    { DDO_DTYPE_Q8_1, 9 },     { DDO_DTYPE_Q2_K, 10 },
        { DDO_DTYPE_Q3_K, 11 },   { DDO_DTYPE_Q4_K, 12 },    { DDO_DTYPE_Q5_K, 13 },
        { DDO_DTYPE_Q6_K, 14 },   { DDO_DTYPE_Q8_K, 15 },    { DDO_DTYPE_IQ2_XXS, 16 },
        { DDO_DTYPE_IQ2_XS, 17 }, { DDO_DTYPE_IQ3_XXS, 18 }, { DDO_DTYPE_IQ1_S, 19 },
        { DDO_DTYPE_IQ4_NL, 20 }, { DDO_DTYPE_IQ3_S, 21 },   { DDO_DTYPE_IQ2_S, 22 },
        { DDO_DTYPE_IQ4_XS, 23 }, { DDO_DTYPE_I8, 24 },      { DDO_DTYPE_I16, 25 },
        { DDO_DTYPE_I32, 26 },    { DDO_DTYPE_I64, 27 },     { DDO_DTYPE_F64, 28 },
        { DDO_DTYPE_IQ1_M, 29 },  { DDO_DTYPE_BF16, 30 },    { DDO_DTYPE_TQ1_0, 34 },
        { DDO_DTYPE_TQ2_0, 35 },  { DDO_DTYPE_MXFP4, 39 },   { DDO_DTYPE_NVFP4, 40 },
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (map[i].dt == dtype)
            return map[i].id;
    return -1;
}

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
    bool failed;
} wbuf;

static void put(wbuf *b, const void *d, size_t n)
{
    if (b->failed)
        return;
    if (b->n + n > b->cap) {
        size_t cap = (b->n + n) * 2 + 256;
        uint8_t *p = realloc(b->p, cap);
        if (p == NULL) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void le(wbuf *b, uint64_t v, unsigned n)
{
    uint8_t x[8];
    for (unsigned i = 0; i < n; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, n);
}

static void str(wbuf *b, const char *s)
{
    le(b, strlen(s), 8);
    put(b, s, strlen(s));
}

int tool_gguf_header(const char *const *keys, const char *const *values, size_t nkv,
                     const tool_gguf_tensor *t, size_t nt, uint8_t **out, size_t *len)
{
    wbuf b = { 0 };
    put(&b, "GGUF", 4);
    le(&b, 3, 4);
    le(&b, nt, 8);
    le(&b, nkv + 1, 8);
    str(&b, "general.alignment");
    le(&b, 4, 4); /* UINT32 */
    le(&b, TOOL_GGUF_ALIGNMENT, 4);
    for (size_t i = 0; i < nkv; i++) {
        str(&b, keys[i]);
        le(&b, 8, 4); /* STRING */
        str(&b, values[i]);
    }
    for (size_t i = 0; i < nt; i++) {
        int id = tool_gguf_type(t[i].dtype);
        if (id < 0 || t[i].ndim > 4 || t[i].offset % TOOL_GGUF_ALIGNMENT != 0) {
            free(b.p);
            return DDO_E_INVALID_ARGUMENT;
        }
        str(&b, t[i].name);
        le(&b, t[i].ndim, 4);
        for (uint32_t d = t[i].ndim; d-- > 0;)
            le(&b, t[i].shape[d], 8);
        le(&b, (uint64_t)id, 4);
        le(&b, t[i].offset, 8);
    }
    while (!b.failed && b.n % TOOL_GGUF_ALIGNMENT != 0)
        le(&b, 0, 1);
    if (b.failed) {
        free(b.p);
        return DDO_E_NO_MEMORY;
    }
    *out = b.p;
    *len = b.n;
    return 0;
}
