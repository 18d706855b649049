/*
 * checkpoint_gguf.c - one GGUF file (v2 or v3, little-endian), validated strictly before any
 * tensor is used: the magic and version, the counts (bounded by ddo's limits and by the bytes
 * that follow), every key/value pair of the metadata (each value type, arrays nested at most
 * DDO__GGUF_MAX_ARRAY_DEPTH deep, every claimed length checked against the file before it is
 * read or allocated), the tensor infos (name, at most 4 dimensions, the GGML type, the offset)
 * and the data section (general.alignment, each tensor aligned, inside the file, no overlap).
 * Each tensor becomes a checkpoint tensor holding its stored bytes: F32/F16/BF16/I8.. keep
 * their safetensors dtype, the GGML block types get their own (dtype.c); the shape is GGML's
 * dimensions reversed (outermost first, as PyTorch orders them). The metadata becomes
 * checkpoint metadata as text. Part of the checkpoint (checkpoint_internal.h); a file that
 * starts with "GGUF" reaches here from checkpoint_header.c.
 *
 * The header (everything before the data section) is read as the parser needs it, in growing
 * chunks, never past DDO__CHECKPOINT_MAX_HEADER_BYTES. Messages name the file by its
 * basename, then the tensor or key, then the rule.
 */
#include "checkpoint/checkpoint_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define Q ddo__checkpoint_quote

enum {
    GV_UINT8,
    GV_INT8,
    GV_UINT16,
    GV_INT16,
    GV_UINT32,
    GV_INT32,
    GV_FLOAT32,
    GV_BOOL,
    GV_STRING,
    GV_ARRAY,
    GV_UINT64,
    GV_INT64,
    GV_FLOAT64,
    GV_COUNT
};

static const char *const value_names[GV_COUNT] = {
    "UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",   "FLOAT32",
    "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64",
};

/* Bytes of a fixed-size value; 0 for STRING and ARRAY. */
static unsigned value_size(uint32_t type)
{
    static const unsigned sizes[GV_COUNT] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
    return sizes[type];
}

/* GGML type ids (ggml.h) to dtypes; -1 for ids GGML removed or never assigned. */
static int dtype_of_ggml(uint32_t id)
{
    static const int8_t map[] = {
        [0] = DDO_DTYPE_F32,
        [1] = DDO_DTYPE_F16,
        [2] = DDO_DTYPE_Q4_0,
        [3] = DDO_DTYPE_Q4_1,
        [4] = -1,
        [5] = -1,
        [6] = DDO_DTYPE_Q5_0,
        [7] = DDO_DTYPE_Q5_1,
        [8] = DDO_DTYPE_Q8_0,
        [9] = DDO_DTYPE_Q8_1,
        [10] = DDO_DTYPE_Q2_K,
        [11] = DDO_DTYPE_Q3_K,
        [12] = DDO_DTYPE_Q4_K,
        [13] = DDO_DTYPE_Q5_K,
        [14] = DDO_DTYPE_Q6_K,
        [15] = DDO_DTYPE_Q8_K,
        [16] = DDO_DTYPE_IQ2_XXS,
        [17] = DDO_DTYPE_IQ2_XS,
        [18] = DDO_DTYPE_IQ3_XXS,
        [19] = DDO_DTYPE_IQ1_S,
        [20] = DDO_DTYPE_IQ4_NL,
        [21] = DDO_DTYPE_IQ3_S,
        [22] = DDO_DTYPE_IQ2_S,
        [23] = DDO_DTYPE_IQ4_XS,
        [24] = DDO_DTYPE_I8,
        [25] = DDO_DTYPE_I16,
        [26] = DDO_DTYPE_I32,
        [27] = DDO_DTYPE_I64,
        [28] = DDO_DTYPE_F64,
        [29] = DDO_DTYPE_IQ1_M,
        [30] = DDO_DTYPE_BF16,
        [31] = -1,
        [32] = -1,
        [33] = -1,
        [34] = DDO_DTYPE_TQ1_0,
        [35] = DDO_DTYPE_TQ2_0,
        [36] = -1,
        [37] = -1,
        [38] = -1,
        [39] = DDO_DTYPE_MXFP4,
        [40] = DDO_DTYPE_NVFP4,
    };
    return id < DDO_ARRAY_LEN(map) ? map[id] : -1;
}

/* The parser's cursor over the file (through fd) or an image in memory. */
typedef struct gg {
    const char *fname; /* label in messages */
    const char *path;  /* for errors of the file system */
    int fd;
    const uint8_t *image; /* the whole file, or NULL: read through fd into buf */
    uint8_t *buf;
    uint64_t have; /* bytes of buf read */
    uint64_t pos, size;
    uint64_t alignment;
} gg;

static const uint8_t *at(const gg *g)
{
    return (g->image != NULL ? g->image : g->buf) + g->pos;
}

static int truncated(const gg *g, const char *what, uint64_t n)
{
    return ddo__fail(NULL, DDO_E_FORMAT,
                     "%s: truncated: %s at byte %" PRIu64 " needs %" PRIu64
                     " bytes, the file ends at %" PRIu64,
                     g->fname, what, g->pos, n, g->size);
}

/* Makes n bytes at pos readable through at(): refused past the end of the file or past the
 * header limit, before anything is allocated for them. */
static int need(gg *g, uint64_t n, const char *what)
{
    if (n > g->size - g->pos)
        return truncated(g, what, n);
    uint64_t end = g->pos + n;
    if (end > DDO__CHECKPOINT_MAX_HEADER_BYTES)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: %s at byte %" PRIu64 ": the metadata and tensor infos run past "
                         "ddo's limit of %" PRIu64 " bytes (see docs/formats.md)",
                         g->fname, what, g->pos, (uint64_t)DDO__CHECKPOINT_MAX_HEADER_BYTES);
    if (g->image != NULL || end <= g->have)
        return 0;
    uint64_t want = g->have < 32768 ? 65536 : g->have * 2;
    uint64_t cap =
        g->size < DDO__CHECKPOINT_MAX_HEADER_BYTES ? g->size : DDO__CHECKPOINT_MAX_HEADER_BYTES;
    want = want < end ? end : want > cap ? cap : want;
    uint8_t *b = realloc(g->buf, (size_t)want);
    if (b == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory reading the header", g->fname);
    g->buf = b;
    int e = ddo__os_pread_full(g->fd, b + g->have, (size_t)(want - g->have), g->have);
    if (e != 0)
        return ddo__checkpoint_os_failure(g->path, "read", e);
    g->have = want;
    return 0;
}

static uint64_t le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = n; i-- > 0;)
        v = (v << 8) | p[i];
    return v;
}

/* A little-endian integer of n bytes (1, 2, 4, 8). */
static int get_uint(gg *g, unsigned n, const char *what, uint64_t *v)
{
    int rc = need(g, n, what);
    if (rc != 0)
        return rc;
    *v = le(at(g), n);
    g->pos += n;
    return 0;
}

static int get_u32(gg *g, const char *what, uint32_t *v)
{
    uint64_t x = 0;
    int rc = get_uint(g, 4, what, &x);
    *v = (uint32_t)x;
    return rc;
}

/* Whether p[0..n) is UTF-8 (no overlong forms, surrogates or values past U+10FFFF). */
static bool utf8_valid(const uint8_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < n;) {
        uint8_t c = p[i];
        unsigned len = c < 0x80             ? 1
                       : (c & 0xE0) == 0xC0 ? 2
                       : (c & 0xF0) == 0xE0 ? 3
                       : (c & 0xF8) == 0xF0 ? 4
                                            : 0;
        if (len == 0 || len > n - i)
            return false;
        uint32_t v = len == 1 ? c : c & (0x7Fu >> len);
        for (unsigned k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return false;
            v = (v << 6) | (p[i + k] & 0x3Fu);
        }
        static const uint32_t least[5] = { 0, 0, 0x80, 0x800, 0x10000 };
        if (v < least[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
            return false;
        i += len;
    }
    return true;
}

/*
 * A string: u64 length, then the bytes. The claimed length is checked against the file and
 * against limit before it is read; *out (may be NULL: skipped) gets a NUL-terminated copy,
 * and a string holding NUL or not UTF-8 is refused then (ddo's names and metadata are C
 * strings, and its JSON documents hold them).
 */
static int get_string(gg *g, const char *what, uint64_t limit, char **out)
{
    uint64_t n;
    int rc = get_uint(g, 8, what, &n);
    if (rc != 0)
        return rc;
    if (n > g->size - g->pos)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: %s: a string of %" PRIu64 " bytes claimed at byte %" PRIu64
                         " runs past the end of the file (%" PRIu64 " bytes)",
                         g->fname, what, n, g->pos - 8, g->size);
    if (n > limit)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: %s: a string of %" PRIu64 " bytes at byte %" PRIu64
                         " is over ddo's limit of %" PRIu64 " bytes",
                         g->fname, what, n, g->pos - 8, limit);
    rc = need(g, n, what);
    if (rc != 0)
        return rc;
    if (out != NULL) {
        if (memchr(at(g), 0, (size_t)n) != NULL)
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: %s: the string at byte %" PRIu64
                             " holds a NUL byte (refused: stricter than GGML)",
                             g->fname, what, g->pos - 8);
        if (!utf8_valid(at(g), n))
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: %s: the string at byte %" PRIu64 " is not UTF-8", g->fname, what,
                             g->pos - 8);
        *out = ddo__strndup((const char *)at(g), (size_t)n);
        if (*out == NULL)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory reading the header",
                             g->fname);
    }
    g->pos += n;
    return 0;
}

/* The text of a scalar of fixed size (the bytes at the cursor, already checked). */
static int scalar_text(gg *g, const char *key, uint32_t type, char *buf, size_t len)
{
    const uint8_t *p = at(g);
    uint64_t u = le(p, value_size(type));
    switch (type) {
    case GV_INT8:
        snprintf(buf, len, "%d", (int)(int8_t)u);
        break;
    case GV_INT16:
        snprintf(buf, len, "%d", (int)(int16_t)u);
        break;
    case GV_INT32:
        snprintf(buf, len, "%" PRId32, (int32_t)u);
        break;
    case GV_INT64:
        snprintf(buf, len, "%" PRId64, (int64_t)u);
        break;
    case GV_FLOAT32: {
        float f;
        uint32_t w = (uint32_t)u;
        memcpy(&f, &w, 4);
        ddo__checkpoint_format_real(buf, len, (double)f);
        break;
    }
    case GV_FLOAT64: {
        double d;
        memcpy(&d, &u, 8);
        ddo__checkpoint_format_real(buf, len, d);
        break;
    }
    case GV_BOOL:
        if (u > 1)
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: key \"%s\": BOOL value %" PRIu64 " at byte %" PRIu64
                             " is neither 0 nor 1",
                             g->fname, Q(key), u, g->pos);
        snprintf(buf, len, "%s", u ? "true" : "false");
        break;
    default: /* the unsigned types */
        snprintf(buf, len, "%" PRIu64, u);
        break;
    }
    return 0;
}

static int value(gg *g, const char *key, uint32_t type, unsigned depth, char **text);

/* An array value: u32 element type, u64 count, the elements. *text (may be NULL) gets
 * "array[TYPE, N]". */
static int array_value(gg *g, const char *key, unsigned depth, char **text)
{
    uint32_t et;
    uint64_t n;
    int rc = get_u32(g, "an array's element type", &et);
    if (rc == 0)
        rc = get_uint(g, 8, "an array's length", &n);
    if (rc != 0)
        return rc;
    if (et >= GV_COUNT)
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: key \"%s\": unknown array element type %" PRIu32,
                         g->fname, Q(key), et);
    if (et == GV_ARRAY && depth + 1 >= DDO__GGUF_MAX_ARRAY_DEPTH)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: key \"%s\": arrays nested deeper than %d (ddo's limit)", g->fname,
                         Q(key), DDO__GGUF_MAX_ARRAY_DEPTH);
    /* The fewest bytes each element takes: refuses an absurd count before the loop. */
    uint64_t least = et == GV_STRING ? 8 : et == GV_ARRAY ? 12 : value_size(et);
    if (n > (g->size - g->pos) / least)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: key \"%s\": an array of %" PRIu64 " %s values (at least %" PRIu64
                         " bytes each) runs past the end of the file at byte %" PRIu64,
                         g->fname, Q(key), n, value_names[et], least, g->pos);
    if (et != GV_STRING && et != GV_ARRAY && et != GV_BOOL) {
        rc = need(g, n * least, "an array");
        if (rc != 0)
            return rc;
        g->pos += n * least;
    } else {
        for (uint64_t i = 0; i < n && rc == 0; i++)
            rc = value(g, key, et, depth + 1, NULL);
        if (rc != 0)
            return rc;
    }
    if (text != NULL) {
        *text = ddo__asprintf("array[%s, %" PRIu64 "]", value_names[et], n);
        if (*text == NULL)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory reading the header",
                             g->fname);
    }
    return 0;
}

/* One value of type (already checked to be known); *text (may be NULL) gets its text. */
static int value(gg *g, const char *key, uint32_t type, unsigned depth, char **text)
{
    if (type == GV_STRING)
        return get_string(g, "a string value", DDO__CHECKPOINT_MAX_HEADER_BYTES, text);
    if (type == GV_ARRAY)
        return array_value(g, key, depth, text);
    unsigned n = value_size(type);
    int rc = need(g, n, value_names[type]);
    if (rc != 0)
        return rc;
    char buf[64];
    rc = scalar_text(g, key, type, buf, sizeof(buf));
    if (rc != 0)
        return rc;
    if (type == GV_UINT32 && strcmp(key, "general.alignment") == 0)
        g->alignment = le(at(g), 4);
    g->pos += n;
    if (text != NULL) {
        *text = ddo__strdup(buf);
        if (*text == NULL)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory reading the header",
                             g->fname);
    }
    return 0;
}

/* Checks general.alignment's type and value (once read). */
static int check_alignment(gg *g, const char *key, uint32_t type)
{
    if (strcmp(key, "general.alignment") != 0)
        return 0;
    if (type != GV_UINT32)
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: general.alignment is %s, not UINT32", g->fname,
                         value_names[type]);
    if (g->alignment == 0 || (g->alignment & (g->alignment - 1)) != 0)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: general.alignment %" PRIu64 " is not a power of two", g->fname,
                         g->alignment);
    return 0;
}

/* One key/value pair, added to ck's metadata (a duplicate key refused: the file is the
 * checkpoint's only one, so its metadata so far are this file's). */
static int key_value(gg *g, ddo_checkpoint *ck)
{
    char *key = NULL, *text = NULL;
    uint32_t type = 0;
    int rc = get_string(g, "a metadata key", DDO__CHECKPOINT_MAX_NAME_BYTES, &key);
    if (rc == 0)
        rc = get_u32(g, "a value type", &type);
    if (rc == 0 && ddo__strmap_get(&ck->meta_by_key, key, strlen(key)) != SIZE_MAX)
        rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: duplicate metadata key \"%s\"", g->fname, Q(key));
    if (rc == 0 && type >= GV_COUNT)
        rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: key \"%s\": unknown value type %" PRIu32, g->fname,
                       Q(key), type);
    if (rc == 0)
        rc = value(g, key, type, 0, &text);
    if (rc == 0)
        rc = check_alignment(g, key, type);
    if (rc == 0 && ddo__checkpoint_add_metadata(ck, key, text) != 0)
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory reading the header", g->fname);
    free(text);
    free(key);
    return rc;
}

/* The dimensions and type of tensor name; fills t (shape outermost first, nbytes). */
static int tensor_shape(gg *g, const char *name, ddo_tensor_info *t)
{
    uint32_t nd, type;
    int rc = get_u32(g, "a tensor's dimension count", &nd);
    if (rc != 0)
        return rc;
    if (nd > DDO__GGUF_MAX_DIMS)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: tensor \"%s\": %" PRIu32 " dimensions; GGUF allows at most %d",
                         g->fname, Q(name), nd, DDO__GGUF_MAX_DIMS);
    uint64_t ne[DDO__GGUF_MAX_DIMS] = { 0 };
    for (uint32_t i = 0; i < nd && rc == 0; i++) {
        rc = get_uint(g, 8, "a tensor's dimension", &ne[i]);
        if (rc == 0 && ne[i] > (uint64_t)INT64_MAX)
            rc = ddo__fail(NULL, DDO_E_FORMAT,
                           "%s: tensor \"%s\": dimension %" PRIu32 " is %" PRIu64
                           ", over GGML's INT64_MAX",
                           g->fname, Q(name), i, ne[i]);
        t->shape[nd - 1 - i] = ne[i];
    }
    if (rc == 0)
        rc = get_u32(g, "a tensor's GGML type", &type);
    if (rc != 0)
        return rc;
    int dt = dtype_of_ggml(type);
    if (dt < 0)
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: tensor \"%s\": unknown GGML type %" PRIu32,
                         g->fname, Q(name), type);
    t->dtype = (ddo_dtype)dt;
    t->ndim = nd;
    rc = ddo__dtype_nbytes(t->dtype, t->shape, nd, &t->nbytes);
    if (rc == 0)
        return 0;
    char dims[160];
    ddo__checkpoint_format_dims(dims, sizeof(dims), ne, nd);
    if (rc == DDO_E_OVERFLOW)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: tensor \"%s\": %s ne %s: element count or size overflows 64 bits",
                         g->fname, Q(name), ddo_dtype_name(t->dtype), dims);
    return ddo__fail(
        NULL, DDO_E_FORMAT,
        "%s: tensor \"%s\": %s ne %s: ne[0] is not a multiple of the %zu-element block", g->fname,
        Q(name), ddo_dtype_name(t->dtype), dims, ddo_dtype_block(t->dtype, NULL));
}

/* One tensor info, appended to ck with its offset relative to the data section. */
static int tensor_info(gg *g, ddo_checkpoint *ck, uint32_t fi, ddo__strmap *names)
{
    char *name = NULL;
    int rc = get_string(g, "a tensor name", DDO__CHECKPOINT_MAX_NAME_BYTES, &name);
    if (rc != 0)
        return rc;
    if (ddo__strmap_get(names, name, strlen(name)) != SIZE_MAX) {
        rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: duplicate tensor name \"%s\"", g->fname, Q(name));
        free(name);
        return rc;
    }
    ddo_tensor_info *t = ddo__checkpoint_add_tensor(ck, name);
    free(name);
    if (t == NULL || ddo__strmap_put(names, t->name, strlen(t->name), 0) == SIZE_MAX)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory reading the header", g->fname);
    t->file_index = fi;
    rc = tensor_shape(g, t->name, t);
    if (rc == 0)
        rc = get_uint(g, 8, "a tensor's offset", &t->offset);
    return rc;
}

/* Each tensor aligned and inside the data section of data_len bytes; sorted by offset, no
 * two non-empty ranges overlapping. */
static int check_data(const gg *g, ddo_tensor_info *t, size_t n, uint64_t data_len)
{
    for (size_t i = 0; i < n; i++) {
        if (t[i].offset % g->alignment != 0)
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: tensor \"%s\": offset %" PRIu64
                             " is not a multiple of the alignment %" PRIu64,
                             g->fname, Q(t[i].name), t[i].offset, g->alignment);
        if (t[i].offset > data_len || t[i].nbytes > data_len - t[i].offset)
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: truncated: tensor \"%s\" [%" PRIu64 ", +%" PRIu64
                             ") runs past the end of the data section (%" PRIu64 " bytes)",
                             g->fname, Q(t[i].name), t[i].offset, t[i].nbytes, data_len);
    }
    if (n > 1)
        qsort(t, n, sizeof(*t), ddo__checkpoint_cmp_offset);
    const ddo_tensor_info *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        if (t[i].nbytes == 0)
            continue;
        if (prev != NULL && t[i].offset < prev->offset + prev->nbytes)
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: tensor \"%s\" [%" PRIu64 ", %" PRIu64
                             ") overlaps tensor \"%s\" [%" PRIu64 ", %" PRIu64 ")",
                             g->fname, Q(t[i].name), t[i].offset, t[i].offset + t[i].nbytes,
                             Q(prev->name), prev->offset, prev->offset + prev->nbytes);
        prev = &t[i];
    }
    return 0;
}

/* The magic, the version and the two counts. */
static int preamble(gg *g, uint64_t *n_tensors, uint64_t *n_kv)
{
    uint32_t version;
    int rc = need(g, 4, "the magic");
    if (rc == 0 && memcmp(at(g), "GGUF", 4) != 0)
        rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: not a GGUF file (no \"GGUF\" magic)", g->fname);
    g->pos += rc == 0 ? 4 : 0;
    if (rc == 0)
        rc = get_u32(g, "the version", &version);
    if (rc != 0)
        return rc;
    if (version == 0x02000000u || version == 0x03000000u)
        return ddo__fail(NULL, DDO_E_UNSUPPORTED,
                         "%s: a big-endian GGUF file (only little-endian files are supported)",
                         g->fname);
    if (version != 2 && version != 3)
        return ddo__fail(NULL, DDO_E_UNSUPPORTED,
                         "%s: GGUF version %" PRIu32 " (versions 2 and 3 are supported)", g->fname,
                         version);
    rc = get_uint(g, 8, "the tensor count", n_tensors);
    if (rc == 0)
        rc = get_uint(g, 8, "the metadata count", n_kv);
    if (rc != 0)
        return rc;
    if (*n_tensors > DDO__CHECKPOINT_MAX_TENSORS)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: %" PRIu64 " tensors, over ddo's limit of %d (see docs/formats.md)",
                         g->fname, *n_tensors, DDO__CHECKPOINT_MAX_TENSORS);
    /* A key/value pair takes at least 13 bytes, a tensor info 24. */
    uint64_t left = g->size - g->pos;
    if (*n_kv > left / 13 || *n_tensors > (left - *n_kv * 13) / 24)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: truncated: %" PRIu64 " key/value pairs and %" PRIu64
                         " tensor infos cannot fit in the %" PRIu64 " bytes that follow",
                         g->fname, *n_kv, *n_tensors, left);
    return 0;
}

/* Parses the metadata and the tensor infos, then places the data section. */
static int parse(gg *g, ddo_checkpoint *ck, uint32_t fi)
{
    uint64_t n_tensors = 0, n_kv = 0;
    ddo__strmap names;
    memset(&names, 0, sizeof(names));
    int rc = preamble(g, &n_tensors, &n_kv);
    for (uint64_t i = 0; i < n_kv && rc == 0; i++)
        rc = key_value(g, ck);
    size_t first = ck->tensor_count;
    for (uint64_t i = 0; i < n_tensors && rc == 0; i++)
        rc = tensor_info(g, ck, fi, &names);
    ddo__strmap_free(&names);
    if (rc != 0)
        return rc;
    uint64_t pad = (g->alignment - g->pos % g->alignment) % g->alignment;
    uint64_t data_offset = g->pos + pad;
    if (data_offset > g->size) {
        if (n_tensors > 0)
            return truncated(g, "the padding before the data section", pad);
        data_offset = g->size;
    }
    ddo__checkpoint_file *f = &ck->files[fi];
    f->info.size = g->size;
    f->info.header_bytes = data_offset;
    f->info.data_offset = data_offset;
    return check_data(g, ck->tensor_count > first ? ck->tensors + first : NULL,
                      ck->tensor_count - first, g->size - data_offset);
}

int ddo__checkpoint_parse_gguf(ddo_checkpoint *ck, uint32_t fi, const uint8_t *image, uint64_t size)
{
    ddo__checkpoint_file *f = &ck->files[fi];
    if (f->in_set)
        return ddo__fail(NULL, DDO_E_UNSUPPORTED,
                         "%s: a GGUF file in a sharded set (GGUF files are opened alone)",
                         f->label);
    gg g;
    memset(&g, 0, sizeof(g));
    g.fname = f->label;
    g.path = f->info.path;
    g.fd = f->fd;
    g.image = image;
    g.size = size;
    g.alignment = 32;
    f->gguf = true;
    int rc = parse(&g, ck, fi);
    free(g.buf);
    return rc;
}
