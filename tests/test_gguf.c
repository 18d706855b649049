/*
 * test_gguf.c - the GGUF reader on files this test writes: a valid v3 file (every metadata
 * value type, nested arrays, F32/F16/BF16 and GGML block tensors) read from memory, through
 * pread and through mmap, with exact byte sizes (computed here from GGML's block table, not
 * the library's), shapes reversed, offsets aligned and every byte read back; a header over 64
 * KiB (read in growing chunks); v2; and each malformed case refused with one line naming the
 * rule: every truncation, unknown GGML and value types, overlapping and misaligned tensors,
 * absurd dimension and tensor counts, a 4 GiB claimed string (also in a sparse file larger
 * than it, refused before anything is allocated), overflow, blocks that do not fit, bad
 * alignment, duplicates, big-endian and unknown versions, nesting past the limit.
 *
 * ctest-labels: unit
 */
#include "checkpoint/checkpoint.h"
#include "ddo.h"
#include "t.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- a little-endian byte builder ---- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (b->p == NULL)
            abort();
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void le(buf *b, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        uint8_t c = (uint8_t)(v >> (8 * i));
        put(b, &c, 1);
    }
}

static void str(buf *b, const char *s)
{
    le(b, strlen(s), 8);
    put(b, s, strlen(s));
}

/* GGUF value types */
enum { U8, I8, U16, I16, U32, I32, F32V, BOOLV, STR, ARR, U64, I64, F64V };

static void kv_u32(buf *b, const char *k, uint32_t v)
{
    str(b, k);
    le(b, U32, 4);
    le(b, v, 4);
}

static void kv_str(buf *b, const char *k, const char *v)
{
    str(b, k);
    le(b, STR, 4);
    str(b, v);
}

/* ---- GGML types as GGML defines them: id, elements and bytes per block ---- */

static const struct {
    uint32_t id, block, bytes;
    ddo_dtype dt;
} ggml[] = {
    { 0, 1, 4, DDO_DTYPE_F32 },         { 1, 1, 2, DDO_DTYPE_F16 },
    { 30, 1, 2, DDO_DTYPE_BF16 },       { 2, 32, 18, DDO_DTYPE_Q4_0 },
    { 3, 32, 20, DDO_DTYPE_Q4_1 },      { 6, 32, 22, DDO_DTYPE_Q5_0 },
    { 7, 32, 24, DDO_DTYPE_Q5_1 },      { 8, 32, 34, DDO_DTYPE_Q8_0 },
    { 10, 256, 84, DDO_DTYPE_Q2_K },    { 11, 256, 110, DDO_DTYPE_Q3_K },
    { 12, 256, 144, DDO_DTYPE_Q4_K },   { 13, 256, 176, DDO_DTYPE_Q5_K },
    { 14, 256, 210, DDO_DTYPE_Q6_K },   { 15, 256, 292, DDO_DTYPE_Q8_K },
    { 16, 256, 66, DDO_DTYPE_IQ2_XXS }, { 20, 32, 18, DDO_DTYPE_IQ4_NL },
    { 23, 256, 136, DDO_DTYPE_IQ4_XS }, { 29, 256, 56, DDO_DTYPE_IQ1_M },
    { 34, 256, 54, DDO_DTYPE_TQ1_0 },   { 39, 32, 17, DDO_DTYPE_MXFP4 },
    { 24, 1, 1, DDO_DTYPE_I8 },         { 28, 1, 8, DDO_DTYPE_F64 },
};

static size_t ggml_index(uint32_t id)
{
    for (size_t i = 0; i < DDO_ARRAY_LEN(ggml); i++)
        if (ggml[i].id == id)
            return i;
    return SIZE_MAX;
}

typedef struct tdesc {
    const char *name;
    uint32_t nd;
    uint64_t ne[4];
    uint32_t type;
    uint64_t offset; /* UINT64_MAX: the next aligned place */
} tdesc;

static uint64_t tbytes(const tdesc *t)
{
    size_t g = ggml_index(t->type);
    uint64_t n = t->ne[0] / ggml[g].block * ggml[g].bytes;
    for (uint32_t i = 1; i < t->nd; i++)
        n *= t->ne[i];
    return n;
}

/* A GGUF image: the preamble (version), n_kv pairs already encoded in kv, the tensor infos,
 * the padding to align and the data (byte k of the data section is (k * 7 + 3) & 0xFF); the
 * last tensor ends the file. t[i].offset is filled in. */
static uint8_t *gguf(uint32_t version, const buf *kv, uint64_t n_kv, tdesc *t, size_t nt,
                     uint64_t align, size_t *size)
{
    buf b = { 0 };
    put(&b, "GGUF", 4);
    le(&b, version, 4);
    le(&b, nt, 8);
    le(&b, n_kv, 8);
    if (kv->n)
        put(&b, kv->p, kv->n);
    uint64_t end = 0;
    for (size_t i = 0; i < nt; i++) {
        if (t[i].offset == UINT64_MAX)
            t[i].offset = (end + align - 1) / align * align;
        if (t[i].offset + tbytes(&t[i]) > end)
            end = t[i].offset + tbytes(&t[i]);
        str(&b, t[i].name);
        le(&b, t[i].nd, 4);
        for (uint32_t d = 0; d < t[i].nd; d++)
            le(&b, t[i].ne[d], 8);
        le(&b, t[i].type, 4);
        le(&b, t[i].offset, 8);
    }
    while (b.n % align != 0)
        le(&b, 0, 1);
    for (uint64_t k = 0; k < end; k++)
        le(&b, (k * 7 + 3) & 0xFF, 1);
    *size = b.n;
    return b.p;
}

/* The metadata of the valid file: every value type, arrays (strings, u8, nested). */
static uint64_t valid_kv(buf *kv)
{
    kv_str(kv, "general.architecture", "flux");
    kv_u32(kv, "general.alignment", 32);
    str(kv, "k.u8"), le(kv, U8, 4), le(kv, 200, 1);
    str(kv, "k.i8"), le(kv, I8, 4), le(kv, 0xFE, 1);
    str(kv, "k.u16"), le(kv, U16, 4), le(kv, 65535, 2);
    str(kv, "k.i16"), le(kv, I16, 4), le(kv, 0xFFFF, 2);
    str(kv, "k.i32"), le(kv, I32, 4), le(kv, 0xFFFFFFF6, 4);
    str(kv, "k.f32"), le(kv, F32V, 4), le(kv, 0x3FC00000, 4); /* 1.5 */
    str(kv, "k.bool"), le(kv, BOOLV, 4), le(kv, 1, 1);
    str(kv, "k.u64"), le(kv, U64, 4), le(kv, UINT64_MAX, 8);
    str(kv, "k.i64"), le(kv, I64, 4), le(kv, (uint64_t)-5, 8);
    str(kv, "k.f64"), le(kv, F64V, 4), le(kv, 0x3FF0000000000000ull, 8); /* 1.0 */
    str(kv, "k.strings"), le(kv, ARR, 4), le(kv, STR, 4), le(kv, 3, 8);
    str(kv, "a"), str(kv, ""), str(kv, "ccc");
    str(kv, "k.bytes"), le(kv, ARR, 4), le(kv, U8, 4), le(kv, 5, 8), put(kv, "\1\2\3\4\5", 5);
    /* [[true, false], []] */
    str(kv, "k.nested"), le(kv, ARR, 4), le(kv, ARR, 4), le(kv, 2, 8);
    le(kv, BOOLV, 4), le(kv, 2, 8), le(kv, 1, 1), le(kv, 0, 1);
    le(kv, F64V, 4), le(kv, 0, 8);
    return 15;
}

static size_t valid_tensors(tdesc *t)
{
    const tdesc v[] = {
        { "double_blocks.0.img_attn.qkv.weight", 2, { 64, 3 }, 8, UINT64_MAX },
        { "double_blocks.0.norm.scale", 1, { 64 }, 0, UINT64_MAX },
        { "double_blocks.1.img_attn.qkv.weight", 2, { 64, 3 }, 8, UINT64_MAX },
        { "double_blocks.1.norm.scale", 1, { 64 }, 0, UINT64_MAX },
        { "img_in.weight", 2, { 512, 2 }, 12, UINT64_MAX },
        { "final.q6", 3, { 256, 1, 2 }, 14, UINT64_MAX },
        { "final.bf16", 1, { 3 }, 30, UINT64_MAX },
        { "final.f16", 4, { 2, 1, 1, 1 }, 1, UINT64_MAX },
        { "final.mxfp4", 1, { 64 }, 39, UINT64_MAX },
    };
    memcpy(t, v, sizeof(v));
    return DDO_ARRAY_LEN(v);
}

static uint8_t *valid_image(size_t *size, tdesc *t, size_t *nt)
{
    buf kv = { 0 };
    uint64_t n_kv = valid_kv(&kv);
    *nt = valid_tensors(t);
    uint8_t *img = gguf(3, &kv, n_kv, t, *nt, 32, size);
    free(kv.p);
    return img;
}

static const char *meta(const ddo_checkpoint *ck, const char *key)
{
    for (size_t i = 0; i < ddo_checkpoint_metadata_count(ck); i++) {
        const char *k, *v;
        if (ddo_checkpoint_metadata(ck, i, &k, &v) == 0 && strcmp(k, key) == 0)
            return v;
    }
    return "(missing)";
}

/* Every tensor of ck against t (shape reversed, bytes, offset, content). */
static void check_tensors(const ddo_checkpoint *ck, const tdesc *t, size_t nt, uint64_t data_off)
{
    T_EQ_U64(ddo_checkpoint_tensor_count(ck), nt);
    uint64_t total = 0;
    for (size_t i = 0; i < nt; i++) {
        size_t k = SIZE_MAX;
        T_REQUIRE(ddo_checkpoint_find(ck, t[i].name, &k) == 0);
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(ck, k);
        T_EQ_INT(ti->dtype, ggml[ggml_index(t[i].type)].dt);
        T_EQ_U64(ti->ndim, t[i].nd);
        for (uint32_t d = 0; d < t[i].nd; d++)
            T_EQ_U64(ti->shape[d], t[i].ne[t[i].nd - 1 - d]);
        T_EQ_U64(ti->nbytes, tbytes(&t[i]));
        T_EQ_U64(ti->offset, data_off + t[i].offset);
        T_EQ_U64(ti->offset % 32, 0);
        uint8_t got[2048];
        T_REQUIRE(ti->nbytes <= sizeof(got));
        T_EQ_INT(ddo_checkpoint_read(ck, k, 0, got, (size_t)ti->nbytes), 0);
        bool same = true;
        for (uint64_t j = 0; j < ti->nbytes; j++)
            same = same && got[j] == (((t[i].offset + j) * 7 + 3) & 0xFF);
        T_CHECK_MSG(same, "tensor %s bytes", t[i].name);
        total += ti->nbytes;
    }
    T_EQ_U64(ddo_checkpoint_total_bytes(ck), total);
    for (size_t i = 1; i < nt; i++) /* data-offset order */
        T_CHECK(ddo_checkpoint_tensor(ck, i - 1)->offset < ddo_checkpoint_tensor(ck, i)->offset);
}

static void test_valid_memory(void)
{
    tdesc t[16];
    size_t nt, size;
    uint8_t *img = valid_image(&size, t, &nt);
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo__checkpoint_parse_buffer(img, size, "v.gguf", &ck), 0);
    T_REQUIRE(ck != NULL);
    const ddo_file_info *f = ddo_checkpoint_file(ck, 0);
    T_EQ_U64(f->size, size);
    T_EQ_U64(f->data_offset % 32, 0);
    T_EQ_U64(f->header_bytes, f->data_offset);
    check_tensors(ck, t, nt, f->data_offset);
    T_EQ_STR(meta(ck, "general.architecture"), "flux");
    T_EQ_STR(meta(ck, "general.alignment"), "32");
    T_EQ_STR(meta(ck, "k.u8"), "200");
    T_EQ_STR(meta(ck, "k.i8"), "-2");
    T_EQ_STR(meta(ck, "k.u16"), "65535");
    T_EQ_STR(meta(ck, "k.i16"), "-1");
    T_EQ_STR(meta(ck, "k.i32"), "-10");
    T_EQ_STR(meta(ck, "k.f32"), "1.5");
    T_EQ_STR(meta(ck, "k.bool"), "true");
    T_EQ_STR(meta(ck, "k.u64"), "18446744073709551615");
    T_EQ_STR(meta(ck, "k.i64"), "-5");
    T_EQ_STR(meta(ck, "k.f64"), "1.0");
    T_EQ_STR(meta(ck, "k.strings"), "array[STRING, 3]");
    T_EQ_STR(meta(ck, "k.bytes"), "array[UINT8, 5]");
    T_EQ_STR(meta(ck, "k.nested"), "array[ARRAY, 2]");
    T_EQ_U64(ddo_checkpoint_block_group_count(ck), 1);
    const ddo_block_group *g = ddo_checkpoint_block_group(ck, 0);
    T_EQ_STR(g->prefix, "double_blocks");
    T_EQ_U64(g->count, 2);
    T_EQ_U64(g->bytes_per_block, 3 * 2 * 34 + 64 * 4);
    char *json = NULL;
    T_EQ_INT(ddo_checkpoint_to_json(ck, &json), 0);
    T_CONTAINS(json, "\"Q4_K\"");
    ddo_free(json);
    ddo_checkpoint_destroy(ck);
    free(img);
}

static char g_dir[256];

static const char *path_of(const char *name)
{
    static char b[2][512];
    static unsigned k;
    char *p = b[k++ % 2];
    snprintf(p, 512, "%s/%s", g_dir, name);
    return p;
}

static int write_file(const char *path, const void *d, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    size_t w = fwrite(d, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

/* Through pread (the header read in growing chunks: a 200 KiB string) and mmap; and v2. */
static void test_valid_files(void)
{
    tdesc t[16];
    size_t nt = valid_tensors(t), size;
    buf kv = { 0 };
    uint64_t n_kv = valid_kv(&kv);
    char *big = malloc(200001);
    T_REQUIRE(big != NULL);
    memset(big, 'x', 200000);
    big[200000] = '\0';
    kv_str(&kv, "big", big);
    free(big);
    for (uint32_t version = 2; version <= 3; version++) {
        for (size_t i = 0; i < nt; i++)
            t[i].offset = UINT64_MAX;
        uint8_t *img = gguf(version, &kv, n_kv + 1, t, nt, 32, &size);
        const char *p = path_of("model.gguf");
        T_REQUIRE(write_file(p, img, size) == 0);
        for (int be = 0; be < 2; be++) {
            ddo_checkpoint *ck = NULL;
            T_EQ_INT(ddo_checkpoint_create(p, be ? DDO_READ_MMAP : DDO_READ_PREAD, &ck), 0);
            T_REQUIRE(ck != NULL);
            const ddo_file_info *f = ddo_checkpoint_file(ck, 0);
            T_CHECK(f->data_offset > 200000);
            check_tensors(ck, t, nt, f->data_offset);
            T_EQ_U64(strlen(meta(ck, "big")), 200000);
            ddo_checkpoint_destroy(ck);
        }
        free(img);
    }
    free(kv.p);
}

/* Parses img; expects code and a one-line message holding want. */
static void refused(const uint8_t *img, size_t size, int code, const char *want)
{
    ddo_checkpoint *ck = NULL;
    int rc = ddo__checkpoint_parse_buffer(img, size, "bad.gguf", &ck);
    T_EQ_INT(rc, code);
    T_CHECK(ck == NULL);
    const char *e = ddo_last_error();
    T_CONTAINS(e, "bad.gguf: ");
    T_CONTAINS(e, want);
    T_CHECK_MSG(strchr(e, '\n') == NULL, "one line: %s", e);
    if (ck != NULL)
        ddo_checkpoint_destroy(ck);
}

/* Every proper prefix of the valid file is refused (the last tensor ends the file). */
static void test_truncated(void)
{
    tdesc t[16];
    size_t nt, size;
    uint8_t *img = valid_image(&size, t, &nt);
    size_t fails = 0;
    for (size_t cut = 0; cut < size; cut++) {
        uint8_t *copy = malloc(cut + 1); /* exactly cut bytes readable under ASan */
        T_REQUIRE(copy != NULL);
        memcpy(copy, img, cut);
        ddo_checkpoint *ck = NULL;
        int rc = ddo__checkpoint_parse_buffer(copy, cut, "cut.gguf", &ck);
        if (rc == DDO_E_FORMAT && ck == NULL && strstr(ddo_last_error(), "cut.gguf: ") != NULL)
            fails++;
        else
            T_CHECK_MSG(false, "cut at %zu: rc %d: %s", cut, rc, ddo_last_error());
        ddo_checkpoint_destroy(ck);
        free(copy);
    }
    T_EQ_U64(fails, size);
    refused(img, size - 1, DDO_E_FORMAT, "truncated: tensor \"final.mxfp4\"");
    refused(img, 30, DDO_E_FORMAT, "truncated");
    free(img);
}

/* An image of one tensor (name "w") with kv pairs kv. */
static uint8_t *one(const buf *kv, uint64_t n_kv, uint32_t nd, const uint64_t *ne, uint32_t type,
                    uint64_t offset, size_t *size)
{
    buf b = { 0 };
    put(&b, "GGUF", 4);
    le(&b, 3, 4);
    le(&b, 1, 8);
    le(&b, n_kv, 8);
    if (kv != NULL && kv->n)
        put(&b, kv->p, kv->n);
    str(&b, "w");
    le(&b, nd, 4);
    for (uint32_t d = 0; d < nd && d < 5; d++) /* the dimensions written: at most 5 */
        le(&b, ne[d], 8);
    le(&b, type, 4);
    le(&b, offset, 8);
    while (b.n % 32 != 0)
        le(&b, 0, 1);
    for (int k = 0; k < 256; k++)
        le(&b, 0, 1);
    *size = b.n;
    return b.p;
}

static void refuse_one(const buf *kv, uint64_t n_kv, uint32_t nd, const uint64_t *ne, uint32_t type,
                       uint64_t offset, int code, const char *want)
{
    size_t size;
    uint8_t *img = one(kv, n_kv, nd, ne, type, offset, &size);
    refused(img, size, code, want);
    free(img);
}

static void test_tensor_infos(void)
{
    const uint64_t ne32[] = { 32, 2 }, ne5[] = { 1, 1, 1, 1, 1 };
    size_t size;
    uint8_t *img = one(NULL, 0, 2, ne32, 8, 0, &size); /* Q8_0 [2, 32]: 68 bytes */
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo__checkpoint_parse_buffer(img, size, "ok.gguf", &ck), 0);
    T_REQUIRE(ck != NULL);
    T_EQ_U64(ddo_checkpoint_tensor(ck, 0)->nbytes, 68);
    ddo_checkpoint_destroy(ck);
    free(img);
    refuse_one(NULL, 0, 2, ne32, 77, 0, DDO_E_FORMAT, "tensor \"w\": unknown GGML type 77");
    refuse_one(NULL, 0, 2, ne32, 4, 0, DDO_E_FORMAT, "unknown GGML type 4"); /* removed Q4_2 */
    refuse_one(NULL, 0, 2, ne32, 0xFFFFFFFFu, 0, DDO_E_FORMAT, "unknown GGML type 4294967295");
    refuse_one(NULL, 0, 2, ne32, 8, 16, DDO_E_FORMAT,
               "offset 16 is not a multiple of the "
               "alignment 32");
    refuse_one(NULL, 0, 2, ne32, 8, 256, DDO_E_FORMAT, "runs past the end of the data section");
    refuse_one(NULL, 0, 5, ne5, 0, 0, DDO_E_FORMAT, "5 dimensions; GGUF allows at most 4");
    refuse_one(NULL, 0, 0xFFFFFFFFu, ne5, 0, 0, DDO_E_FORMAT, "4294967295 dimensions");
    const uint64_t huge[] = { (uint64_t)1 << 62, (uint64_t)1 << 62 };
    refuse_one(NULL, 0, 2, huge, 0, 0, DDO_E_FORMAT, "overflows 64 bits");
    const uint64_t neg[] = { (uint64_t)1 << 63, 1 };
    refuse_one(NULL, 0, 2, neg, 0, 0, DDO_E_FORMAT, "over GGML's INT64_MAX");
    const uint64_t odd[] = { 100, 2 };
    refuse_one(NULL, 0, 2, odd, 12, 0, DDO_E_FORMAT,
               "Q4_K ne [100, 2]: ne[0] is not a multiple of the 256-element block");
}

static void test_layout(void)
{
    /* two tensors at the same offset; then one inside the other */
    tdesc t[2] = { { "a", 1, { 64 }, 0, 0 }, { "b", 1, { 32 }, 0, 0 } };
    buf kv = { 0 };
    size_t size;
    uint8_t *img = gguf(3, &kv, 0, t, 2, 32, &size);
    refused(img, size, DDO_E_FORMAT, "overlaps tensor");
    free(img);
    tdesc u[2] = { { "a", 1, { 64 }, 0, 0 }, { "b", 1, { 8 }, 0, 128 } };
    img = gguf(3, &kv, 0, u, 2, 32, &size);
    refused(img, size, DDO_E_FORMAT, "tensor \"b\" [128, 160) overlaps tensor \"a\" [0, 256)");
    free(img);
    tdesc d[2] = { { "a", 1, { 8 }, 0, UINT64_MAX }, { "a", 1, { 8 }, 0, UINT64_MAX } };
    img = gguf(3, &kv, 0, d, 2, 32, &size);
    refused(img, size, DDO_E_FORMAT, "duplicate tensor name \"a\"");
    free(img);
    /* alignment 64 honoured; 0, 3 and a UINT64 refused */
    tdesc a[2] = { { "a", 1, { 8 }, 0, UINT64_MAX }, { "b", 1, { 8 }, 0, 32 } };
    kv_u32(&kv, "general.alignment", 64);
    img = gguf(3, &kv, 1, a, 2, 64, &size);
    refused(img, size, DDO_E_FORMAT, "offset 32 is not a multiple of the alignment 64");
    free(img);
    free(kv.p);
    const uint64_t ne[] = { 8 };
    static const uint32_t bad_align[] = { 0, 3, 48 };
    for (size_t i = 0; i < DDO_ARRAY_LEN(bad_align); i++) {
        buf k2 = { 0 };
        kv_u32(&k2, "general.alignment", bad_align[i]);
        refuse_one(&k2, 1, 1, ne, 0, 0, DDO_E_FORMAT, "is not a power of two");
        free(k2.p);
    }
    buf k3 = { 0 };
    str(&k3, "general.alignment"), le(&k3, U64, 4), le(&k3, 32, 8);
    refuse_one(&k3, 1, 1, ne, 0, 0, DDO_E_FORMAT, "general.alignment is UINT64, not UINT32");
    free(k3.p);
}

static void test_metadata(void)
{
    const uint64_t ne[] = { 8 };
    buf k = { 0 };
    kv_u32(&k, "x", 1);
    kv_u32(&k, "x", 2);
    refuse_one(&k, 2, 1, ne, 0, 0, DDO_E_FORMAT, "duplicate metadata key \"x\"");
    free(k.p);
    memset(&k, 0, sizeof(k));
    str(&k, "t"), le(&k, 13, 4);
    refuse_one(&k, 1, 1, ne, 0, 0, DDO_E_FORMAT, "key \"t\": unknown value type 13");
    free(k.p);
    memset(&k, 0, sizeof(k));
    str(&k, "t"), le(&k, ARR, 4), le(&k, 99, 4), le(&k, 0, 8);
    refuse_one(&k, 1, 1, ne, 0, 0, DDO_E_FORMAT, "unknown array element type 99");
    free(k.p);
    memset(&k, 0, sizeof(k));
    str(&k, "b"), le(&k, BOOLV, 4), le(&k, 2, 1);
    refuse_one(&k, 1, 1, ne, 0, 0, DDO_E_FORMAT, "BOOL value 2");
    free(k.p);
    /* a 4 GiB string, claimed as a key and as a value */
    memset(&k, 0, sizeof(k));
    le(&k, (uint64_t)4 << 30, 8);
    refuse_one(&k, 1, 1, ne, 0, 0, DDO_E_FORMAT, "a string of 4294967296 bytes claimed");
    free(k.p);
    memset(&k, 0, sizeof(k));
    str(&k, "s"), le(&k, STR, 4), le(&k, (uint64_t)4 << 30, 8);
    refuse_one(&k, 1, 1, ne, 0, 0, DDO_E_FORMAT, "runs past the end of the file");
    free(k.p);
    /* an array claiming 2^60 elements; arrays nested 9 deep */
    memset(&k, 0, sizeof(k));
    str(&k, "a"), le(&k, ARR, 4), le(&k, U32, 4), le(&k, (uint64_t)1 << 60, 8);
    refuse_one(&k, 1, 1, ne, 0, 0, DDO_E_FORMAT, "an array of 1152921504606846976 UINT32");
    free(k.p);
    memset(&k, 0, sizeof(k));
    str(&k, "n"), le(&k, ARR, 4);
    for (int d = 0; d < 9; d++)
        le(&k, ARR, 4), le(&k, 1, 8);
    le(&k, U8, 4), le(&k, 0, 8);
    refuse_one(&k, 1, 1, ne, 0, 0, DDO_E_FORMAT, "arrays nested deeper than 8");
    free(k.p);
    /* a key that is not UTF-8 */
    memset(&k, 0, sizeof(k));
    str(&k, "\xffkey"), le(&k, U8, 4), le(&k, 1, 1);
    refuse_one(&k, 1, 1, ne, 0, 0, DDO_E_FORMAT,
               "a metadata key: the string at byte 24 is not UTF-8");
    free(k.p);
    memset(&k, 0, sizeof(k));
    str(&k, "k"), le(&k, STR, 4), str(&k, "\xed\xa0\x80"); /* a surrogate */
    refuse_one(&k, 1, 1, ne, 0, 0, DDO_E_FORMAT, "is not UTF-8");
    free(k.p);
    /* a NUL inside a tensor name */
    buf b = { 0 };
    put(&b, "GGUF", 4), le(&b, 3, 4), le(&b, 1, 8), le(&b, 0, 8);
    le(&b, 3, 8), put(&b, "a\0b", 3), le(&b, 1, 4), le(&b, 8, 8), le(&b, 0, 4), le(&b, 0, 8);
    for (int i = 0; i < 64; i++)
        le(&b, 0, 1);
    refused(b.p, b.n, DDO_E_FORMAT, "holds a NUL byte");
    free(b.p);
}

static void test_preamble(void)
{
    static const struct {
        uint32_t version;
        uint64_t nt, nkv;
        int code;
        const char *want;
    } cases[] = {
        { 0x03000000u, 0, 0, DDO_E_UNSUPPORTED, "big-endian" },
        { 1, 0, 0, DDO_E_UNSUPPORTED, "GGUF version 1 (versions 2 and 3" },
        { 4, 0, 0, DDO_E_UNSUPPORTED, "GGUF version 4" },
        { 3, (uint64_t)1 << 40, 0, DDO_E_FORMAT, "1099511627776 tensors, over ddo's limit" },
        { 3, 2, 0, DDO_E_FORMAT, "cannot fit" },
        { 3, 0, (uint64_t)1 << 62, DDO_E_FORMAT, "key/value pairs" },
    };
    for (size_t i = 0; i < DDO_ARRAY_LEN(cases); i++) {
        buf b = { 0 };
        put(&b, "GGUF", 4), le(&b, cases[i].version, 4), le(&b, cases[i].nt, 8);
        le(&b, cases[i].nkv, 8);
        for (int k = 0; k < 40; k++)
            le(&b, 0, 1);
        refused(b.p, b.n, cases[i].code, cases[i].want);
        free(b.p);
    }
    /* no tensors, no metadata, no data: valid */
    buf b = { 0 };
    put(&b, "GGUF", 4), le(&b, 3, 4), le(&b, 0, 8), le(&b, 0, 8);
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo__checkpoint_parse_buffer(b.p, b.n, "empty.gguf", &ck), 0);
    T_EQ_U64(ddo_checkpoint_tensor_count(ck), 0);
    ddo_checkpoint_destroy(ck);
    free(b.p);
}

/* A 4 GiB string claimed in a sparse file of 5 GiB (so the file does hold that many bytes):
 * refused by the header limit, checked before the string is read or anything allocated. */
static void test_claimed_string_in_big_file(void)
{
    const char *p = path_of("sparse.gguf");
    buf b = { 0 };
    put(&b, "GGUF", 4), le(&b, 3, 4), le(&b, 0, 8), le(&b, 1, 8);
    str(&b, "s"), le(&b, STR, 4), le(&b, (uint64_t)4 << 30, 8);
    int fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    T_REQUIRE(fd >= 0);
    T_REQUIRE(write(fd, b.p, (unsigned)b.n) == (ssize_t)b.n); /* a few bytes (mingw: unsigned) */
    if (ftruncate(fd, (off_t)5 << 30) != 0) {
        close(fd);
        free(b.p);
        T_SKIP("no sparse 5 GiB file here");
    }
    close(fd);
    free(b.p);
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo_checkpoint_create(p, DDO_READ_PREAD, &ck), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "over ddo's limit of 100000000 bytes");
    T_CHECK(ck == NULL);
    unlink(p);
}

/* Safetensors files do not take the GGML block types; an index's shard cannot be GGUF. */
static void test_boundaries(void)
{
    const char *hdr = "{\"w\":{\"dtype\":\"Q8_0\",\"shape\":[1,32],\"data_offsets\":[0,34]}}";
    buf b = { 0 };
    le(&b, strlen(hdr), 8), put(&b, hdr, strlen(hdr));
    for (int i = 0; i < 34; i++)
        le(&b, 0, 1);
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo__checkpoint_parse_buffer(b.p, b.n, "q.safetensors", &ck), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "unknown dtype \"Q8_0\"");
    free(b.p);
    size_t bb = 0;
    T_EQ_U64(ddo_dtype_block(DDO_DTYPE_Q8_0, &bb), 32);
    T_EQ_U64(bb, 34);
    T_EQ_U64(ddo_dtype_block(DDO_DTYPE_Q4_K, &bb), 256);
    T_EQ_U64(bb, 144);
    T_EQ_U64(ddo_dtype_block(DDO_DTYPE_BF16, &bb), 0);
    T_EQ_U64(bb, 0);
    T_EQ_U64(ddo_dtype_size(DDO_DTYPE_Q4_K), 0);
    /* host tensors of a block type: whole blocks only */
    const uint64_t shape[] = { 2, 64 }, bad[] = { 2, 60 };
    ddo_tensor_desc d = { "q", DDO_DTYPE_Q8_0, 2, shape, NULL };
    T_EQ_INT(ddo_checkpoint_create_from_memory(&d, 1, &ck), 0);
    T_EQ_U64(ddo_checkpoint_tensor(ck, 0)->nbytes, 2 * 2 * 34);
    ddo_checkpoint_destroy(ck);
    d.shape = bad;
    T_EQ_INT(ddo_checkpoint_create_from_memory(&d, 1, &ck), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "not a whole number of blocks");
    /* an index naming a GGUF shard */
    tdesc t[16];
    size_t nt, size;
    uint8_t *img = valid_image(&size, t, &nt);
    T_REQUIRE(write_file(path_of("s.gguf"), img, size) == 0);
    free(img);
    const char *idx = "{\"weight_map\":{\"final.bf16\":\"s.gguf\"}}";
    T_REQUIRE(write_file(path_of("m.safetensors.index.json"), idx, strlen(idx)) == 0);
    T_EQ_INT(ddo_checkpoint_create(path_of("m.safetensors.index.json"), 0, &ck), DDO_E_UNSUPPORTED);
    T_CONTAINS(ddo_last_error(), "a GGUF file in a sharded set");
}

int main(void)
{
    snprintf(g_dir, sizeof(g_dir), "/var/tmp/ddo_gguf_XXXXXX");
    if (mkdtemp(g_dir) == NULL)
        return 1;
    T_RUN(test_valid_memory);
    T_RUN(test_valid_files);
    T_RUN(test_truncated);
    T_RUN(test_tensor_infos);
    T_RUN(test_layout);
    T_RUN(test_metadata);
    T_RUN(test_preamble);
    T_RUN(test_claimed_string_in_big_file);
    T_RUN(test_boundaries);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return t_done();
}
