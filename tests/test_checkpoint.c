/*
 * test_checkpoint.c - the safetensors reader against the fixtures written by
 * the official library (tests/data/safetensors/manifest.json): names, dtypes,
 * shapes, offsets and the SHA-256 of every tensor through both read backends;
 * the tiny Flux model as one file and as an 8-shard set; every malformed file
 * rejected with its rule; sharded-set rules; changed files; host tensors;
 * block groups.
 *
 * ctest-labels: unit threads
 */
#include "t.h"
#include "checkpoint/checkpoint.h"
#include "ddo.h"
#include "os/sys.h"
#include "os/thread.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char g_path[4096];

/* tests/data/safetensors/<rel> */
static const char *st_path(const char *rel)
{
    static char buf[4096];
    char sub[2048];
    snprintf(sub, sizeof(sub), "safetensors/%s", rel);
    return t_data(buf, sizeof(buf), sub);
}

static json_t *load_manifest(void)
{
    json_error_t err;
    json_t *m = json_load_file(st_path("manifest.json"), 0, &err);
    if (m == NULL)
        fprintf(stderr, "  manifest.json: %s\n", err.text);
    return m;
}

static void sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char md[DDO__OS_SHA256_BYTES] = { 0 };
    ddo__os_sha256 *h = ddo__os_sha256_begin();
    if (h != NULL) {
        ddo__os_sha256_update(h, data, len);
        (void)ddo__os_sha256_end(h, md);
    }
    for (unsigned i = 0; i < DDO__OS_SHA256_BYTES; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    out[64] = '\0';
}

/* The SHA-256 of tensor i read through the checkpoint (in two pieces, to
 * exercise offsets inside a tensor). */
static int tensor_sha(const ddo_checkpoint *ck, size_t i, char out[65])
{
    const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, i);
    unsigned char *buf = malloc(t->nbytes + 1);
    if (buf == NULL)
        return DDO_E_NO_MEMORY;
    uint64_t half = t->nbytes / 2;
    int rc = ddo_checkpoint_read(ck, i, 0, buf, (size_t)half);
    if (rc == 0)
        rc = ddo_checkpoint_read(ck, i, half, buf + half, (size_t)(t->nbytes - half));
    if (rc == 0)
        sha256_hex(buf, (size_t)t->nbytes, out);
    free(buf);
    return rc;
}

static void format_shape(char *buf, size_t len, const ddo_tensor_info *t)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (uint32_t d = 0; d < t->ndim && at < len; d++)
        at += (size_t)snprintf(buf + at, len - at, "%s%" PRIu64, d ? "," : "", t->shape[d]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

static void format_json_shape(char *buf, size_t len, const json_t *shape)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (size_t d = 0; d < json_array_size(shape) && at < len; d++)
        at += (size_t)snprintf(buf + at, len - at, "%s%lld", d ? "," : "",
                               (long long)json_integer_value(json_array_get(shape, d)));
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

/* Checks every tensor of one manifest file entry against file `file` of ck. */
static void check_against_manifest(const ddo_checkpoint *ck, size_t file, const char *key,
                                   const json_t *entry)
{
    const ddo_file_info *fi = ddo_checkpoint_file(ck, file);
    T_REQUIRE(fi != NULL);
    uint64_t header_len = (uint64_t)json_integer_value(json_object_get(entry, "header_len"));
    T_EQ_U64(fi->header_bytes, header_len);
    T_EQ_U64(fi->data_offset, 8 + header_len);
    const char *name;
    json_t *jt;
    json_object_foreach(json_object_get(entry, "tensors"), name, jt)
    {
        size_t i;
        int rc = ddo_checkpoint_find(ck, name, &i);
        T_CHECK_MSG(rc == 0, "%s: tensor \"%s\" not found", key, name);
        if (rc != 0)
            continue;
        const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, i);
        T_EQ_STR(t->name, name);
        T_EQ_STR(ddo_dtype_name(t->dtype), json_string_value(json_object_get(jt, "dtype")));
        char a[512], b[512];
        format_shape(a, sizeof(a), t);
        format_json_shape(b, sizeof(b), json_object_get(jt, "shape"));
        T_EQ_STR(a, b);
        const json_t *offs = json_object_get(jt, "data_offsets");
        uint64_t begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
        uint64_t end = (uint64_t)json_integer_value(json_array_get(offs, 1));
        T_EQ_U64(t->file_index, file);
        T_EQ_U64(t->offset, 8 + header_len + begin);
        T_EQ_U64(t->nbytes, end - begin);
        T_CHECK(t->host_data == NULL);
        char sha[65];
        T_EQ_INT(tensor_sha(ck, i, sha), 0);
        T_CHECK_MSG(strcmp(sha, json_string_value(json_object_get(jt, "sha256"))) == 0,
                    "%s: tensor \"%s\": sha256 %s, manifest %s", key, name, sha,
                    json_string_value(json_object_get(jt, "sha256")));
    }
}

/* Tensors of each file are in data-offset order, files in order. */
static void check_order(const ddo_checkpoint *ck)
{
    for (size_t i = 1; i < ddo_checkpoint_tensor_count(ck); i++) {
        const ddo_tensor_info *p = ddo_checkpoint_tensor(ck, i - 1);
        const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, i);
        T_CHECK(p->file_index < t->file_index ||
                (p->file_index == t->file_index && p->offset <= t->offset));
    }
}

static void test_dtypes(void)
{
    static const char *const names[] = { "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16",
                                         "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64",
                                         "U64", "F4", "F6_E2M3", "F6_E3M2", "F8_E4M3FNUZ",
                                         "F8_E5M2FNUZ", "C64",
                                         /* the GGML block types (sizes 0) */
                                         "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
                                         "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS",
                                         "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S",
                                         "IQ4_XS", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4" };
    /* bytes per element; 0 for the sub-byte F4 and F6 types and the block types */
    static const size_t sizes[] = { 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8,
                                    0, 0, 0, 1, 1, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 };
    T_EQ_INT(DDO_ARRAY_LEN(sizes), DDO_DTYPE_COUNT);
    T_EQ_INT(DDO_ARRAY_LEN(names), DDO_DTYPE_COUNT);
    for (int d = 0; d < DDO_DTYPE_COUNT; d++) {
        T_EQ_STR(ddo_dtype_name((ddo_dtype)d), names[d]);
        T_EQ_U64(ddo_dtype_size((ddo_dtype)d), sizes[d]);
        ddo_dtype back = DDO_DTYPE_COUNT;
        T_EQ_INT(ddo_dtype_from_name(names[d], &back), 0);
        T_EQ_INT(back, d);
    }
    ddo_dtype x = DDO_DTYPE_U8;
    T_EQ_INT(ddo_dtype_from_name("bf16", &x), DDO_E_NOT_FOUND);
    T_EQ_INT(ddo_dtype_from_name("Q7", &x), DDO_E_NOT_FOUND);
    T_EQ_INT(x, DDO_DTYPE_U8);
    T_CHECK(ddo_dtype_name(DDO_DTYPE_COUNT) == NULL);
    T_EQ_U64(ddo_dtype_size(DDO_DTYPE_COUNT), 0);
}

/* Every valid file of the manifest, through both backends. */
static void test_valid_files(void)
{
    json_t *m = load_manifest();
    T_REQUIRE(m != NULL);
    const char *key;
    json_t *entry;
    int files = 0;
    json_object_foreach(json_object_get(m, "valid"), key, entry)
    {
        char rel[1024];
        snprintf(rel, sizeof(rel), "%s%s", strchr(key, '/') ? "" : "valid/", key);
        snprintf(g_path, sizeof(g_path), "%s", st_path(rel));
        for (int b = 0; b < 2; b++) {
            ddo_read_backend backend = b == 0 ? DDO_READ_PREAD : DDO_READ_MMAP;
            ddo_checkpoint *ck = NULL;
            int rc = ddo_checkpoint_create(g_path, backend, &ck);
            T_CHECK_MSG(rc == 0, "%s: %s", g_path, ddo_last_error());
            if (rc != 0)
                continue;
            const json_t *tensors = json_object_get(entry, "tensors");
            T_EQ_U64(ddo_checkpoint_tensor_count(ck), json_object_size(tensors));
            T_EQ_U64(ddo_checkpoint_file_count(ck), 1);
            check_against_manifest(ck, 0, key, entry);
            check_order(ck);
            /* metadata */
            const json_t *meta = json_object_get(entry, "metadata");
            T_EQ_U64(ddo_checkpoint_metadata_count(ck),
                     json_is_object(meta) ? json_object_size(meta) : 0);
            for (size_t i = 0; i < ddo_checkpoint_metadata_count(ck); i++) {
                const char *k = NULL, *v = NULL;
                T_EQ_INT(ddo_checkpoint_metadata(ck, i, &k, &v), 0);
                T_EQ_STR(v, json_string_value(json_object_get(meta, k)));
            }
            uint64_t total = 0;
            for (size_t i = 0; i < ddo_checkpoint_tensor_count(ck); i++)
                total += ddo_checkpoint_tensor(ck, i)->nbytes;
            T_EQ_U64(ddo_checkpoint_total_bytes(ck), total);
            ddo_checkpoint_destroy(ck);
        }
        files++;
    }
    T_CHECK(files >= 12);
    json_decref(m);
}

/* A manifest tensor's sha256 by name in any file entry under prefix. */
static const char *manifest_sha(const json_t *m, const char *prefix, const char *name)
{
    const char *key;
    json_t *entry;
    json_object_foreach(json_object_get(m, "valid"), key, entry)
    {
        if (strncmp(key, prefix, strlen(prefix)) != 0)
            continue;
        const json_t *t = json_object_get(json_object_get(entry, "tensors"), name);
        if (t != NULL)
            return json_string_value(json_object_get(t, "sha256"));
    }
    return NULL;
}

static void check_flux_groups(const ddo_checkpoint *ck, bool sharded)
{
    T_REQUIRE(ddo_checkpoint_block_group_count(ck) == 2);
    const ddo_block_group *a = ddo_checkpoint_block_group(ck, sharded ? 0 : 1);
    const ddo_block_group *b = ddo_checkpoint_block_group(ck, sharded ? 1 : 0);
    T_EQ_STR(a->prefix, "transformer_blocks");
    T_EQ_U64(a->count, 2);
    T_EQ_U64(a->bytes_per_block, 75776);
    T_EQ_U64(a->total_bytes, 2 * 75776);
    T_EQ_STR(b->prefix, "single_transformer_blocks");
    T_EQ_U64(b->count, 3);
    T_EQ_U64(b->bytes_per_block, 31488);
    T_EQ_U64(b->total_bytes, 3 * 31488);
    T_CHECK(ddo_checkpoint_block_group(ck, 2) == NULL);
}

/* The tiny Flux model: one file, the 8-shard set through its index, and both
 * directories: one checkpoint of 126 tensors whose total matches the index. */
static void test_tiny_flux(void)
{
    json_t *m = load_manifest();
    T_REQUIRE(m != NULL);
    const json_t *sh = json_object_get(m, "sharded");
    uint64_t total_size = (uint64_t)json_integer_value(json_object_get(sh, "total_size"));
    size_t count = (size_t)json_integer_value(json_object_get(sh, "tensor_count"));
    T_EQ_U64(count, 126);
    const char *paths[4];
    char p0[4096], p1[4096], p2[4096], p3[4096];
    paths[0] = strcpy(p0, st_path("tiny_flux/diffusion_pytorch_model.safetensors"));
    paths[1] = strcpy(p1, st_path("tiny_flux"));
    paths[2] = strcpy(p2, st_path(json_string_value(json_object_get(sh, "index"))));
    paths[3] = strcpy(p3, st_path("tiny_flux_sharded/"));
    for (int k = 0; k < 4; k++) {
        bool sharded = k >= 2;
        ddo_checkpoint *ck = NULL;
        int rc = ddo_checkpoint_create(paths[k], k == 3 ? DDO_READ_MMAP : DDO_READ_DEFAULT, &ck);
        T_CHECK_MSG(rc == 0, "%s: %s", paths[k], ddo_last_error());
        if (rc != 0)
            continue;
        T_EQ_U64(ddo_checkpoint_tensor_count(ck), count);
        T_EQ_U64(ddo_checkpoint_total_bytes(ck), total_size);
        T_EQ_U64(ddo_checkpoint_file_count(ck), sharded ? 8 : 1);
        if (sharded) {
            const json_t *shards = json_object_get(sh, "shards");
            for (size_t f = 0; f < 8; f++) {
                const char *want = json_string_value(json_array_get(shards, f));
                const char *got = ddo_checkpoint_file(ck, f)->path;
                T_CHECK_MSG(strlen(got) >= strlen(want) &&
                                strcmp(got + strlen(got) - strlen(want), want) == 0,
                            "file %zu is %s, not %s", f, got, want);
                char key[1024];
                snprintf(key, sizeof(key), "tiny_flux_sharded/%s", want);
                check_against_manifest(ck, f, key,
                                       json_object_get(json_object_get(m, "valid"), key));
            }
        } else {
            check_against_manifest(
                ck, 0, "tiny_flux",
                json_object_get(json_object_get(m, "valid"),
                                "tiny_flux/diffusion_pytorch_model.safetensors"));
        }
        /* Same bytes whichever layout: each tensor's hash equals the single file's. */
        for (size_t i = 0; i < ddo_checkpoint_tensor_count(ck); i++) {
            char sha[65];
            const char *want = manifest_sha(m, "tiny_flux/", ddo_checkpoint_tensor(ck, i)->name);
            T_REQUIRE(want != NULL);
            T_EQ_INT(tensor_sha(ck, i, sha), 0);
            T_EQ_STR(sha, want);
        }
        check_order(ck);
        check_flux_groups(ck, sharded);
        T_EQ_U64(ddo_checkpoint_metadata_count(ck), 1);
        const char *mk = NULL, *mv = NULL;
        T_EQ_INT(ddo_checkpoint_metadata(ck, 0, &mk, &mv), 0);
        T_EQ_STR(mk, "format");
        T_EQ_STR(mv, "pt");
        T_EQ_INT(ddo_checkpoint_metadata(ck, 1, &mk, &mv), DDO_E_INVALID_ARGUMENT);
        T_EQ_INT(ddo_checkpoint_check(ck), 0);
        ddo_checkpoint_destroy(ck);
    }
    json_decref(m);
}

struct invalid_case {
    const char *file;
    int code;
    const char *message; /* NULL: accepted */
};

static const struct invalid_case invalid_cases[] = {
    { "bom_header.safetensors", DDO_E_FORMAT,
      "bom_header.safetensors: header starts with a UTF-8 byte-order mark (not allowed)" },
    { "duplicate_key.safetensors", DDO_E_FORMAT,
      "duplicate_key.safetensors: duplicate key \"one\" in the header at line 1, column 351 "
      "(rejected: stricter than the official library, which keeps the last)" },
    { "empty_file.safetensors", DDO_E_FORMAT,
      "empty_file.safetensors: file is 0 bytes, too short for the 8-byte header length" },
    { "header_len_past_eof.safetensors", DDO_E_FORMAT,
      "header_len_past_eof.safetensors: header length 533 runs past the end of the file (533 "
      "bytes)" },
    { "header_len_too_big.safetensors", DDO_E_FORMAT,
      "header_len_too_big.safetensors: header length 1000000000 exceeds the limit of 100000000 "
      "bytes (the official reader's)" },
    { "header_not_object.safetensors", DDO_E_FORMAT,
      "header_not_object.safetensors: header is an array, not a JSON object" },
    { "header_nul_padding.safetensors", DDO_E_FORMAT,
      "header_nul_padding.safetensors: header is padded with NUL bytes from byte 302 (only "
      "trailing spaces are allowed)" },
    { "metadata_not_strings.safetensors", DDO_E_FORMAT,
      "metadata_not_strings.safetensors: __metadata__: value of \"x\" is an integer, not a "
      "string" },
    { "missing_dtype.safetensors", DDO_E_FORMAT,
      "missing_dtype.safetensors: tensor \"conv\": missing \"dtype\"" },
    { "negative_dim.safetensors", DDO_E_FORMAT,
      "negative_dim.safetensors: tensor \"conv\": shape [-4, 3, 3, 3]: dimension 0 is negative, "
      "not a non-negative integer" },
    { "not_json.safetensors", DDO_E_FORMAT,
      "not_json.safetensors: header is not valid JSON: string or '}' expected near 'not' at line "
      "1, column 4" },
    { "offset_past_eof.safetensors", DDO_E_FORMAT,
      "offset_past_eof.safetensors: tensor \"conv\": data_offsets [4, 1000220] run past the end "
      "of the data area (221 bytes)" },
    { "offsets_reversed.safetensors", DDO_E_FORMAT,
      "offsets_reversed.safetensors: tensor \"conv\": data_offsets [220, 4] are reversed (begin "
      "> end)" },
    { "overlapping.safetensors", DDO_E_FORMAT,
      "overlapping.safetensors: tensor \"scalar\": data_offsets [4, 220] overlap tensor \"conv\" "
      "[4, 220]" },
    { "shape_offsets_mismatch.safetensors", DDO_E_FORMAT,
      "shape_offsets_mismatch.safetensors: tensor \"conv\": data_offsets [4, 220] hold 216 bytes "
      "but F16 [4, 3, 3, 4] needs 288" },
    { "shape_overflow.safetensors", DDO_E_FORMAT,
      "shape_overflow.safetensors: tensor \"conv\": F16 [4611686018427387904, "
      "4611686018427387904]: element count or size overflows 64 bits" },
    { "short_offsets.safetensors", DDO_E_FORMAT,
      "short_offsets.safetensors: tensor \"conv\": \"data_offsets\" must be [begin, end], got 1 "
      "element(s)" },
    { "trailing_garbage.safetensors", DDO_E_FORMAT,
      "trailing_garbage.safetensors: 16 bytes follow the last tensor (the data area holds 237 "
      "bytes, the tensors end at 221)" },
    { "truncated_len.safetensors", DDO_E_FORMAT,
      "truncated_len.safetensors: file is 5 bytes, too short for the 8-byte header length" },
    { "unknown_dtype.safetensors", DDO_E_FORMAT,
      "unknown_dtype.safetensors: tensor \"conv\": unknown dtype \"Q7\"" },
    { "unpadded_header.safetensors", 0, NULL },
};

/* Every file in invalid/ is rejected with its rule (unpadded_header accepted),
 * with the same verdict from the file and from a memory image. */
static void test_invalid_files(void)
{
    json_t *m = load_manifest();
    T_REQUIRE(m != NULL);
    T_EQ_U64(json_object_size(json_object_get(m, "invalid")), DDO_ARRAY_LEN(invalid_cases));
    for (size_t k = 0; k < DDO_ARRAY_LEN(invalid_cases); k++) {
        const struct invalid_case *c = &invalid_cases[k];
        T_CHECK_MSG(json_object_get(json_object_get(m, "invalid"), c->file) != NULL,
                    "%s is not in the manifest", c->file);
        char rel[512];
        snprintf(rel, sizeof(rel), "invalid/%s", c->file);
        snprintf(g_path, sizeof(g_path), "%s", st_path(rel));
        for (int b = 0; b < 2; b++) {
            ddo_checkpoint *ck = (ddo_checkpoint *)&ck; /* must be reset to NULL on failure */
            int rc = ddo_checkpoint_create(g_path, b ? DDO_READ_MMAP : DDO_READ_PREAD, &ck);
            T_CHECK_MSG(rc == c->code, "%s: %s (%s)", c->file, ddo_errname(rc), ddo_last_error());
            if (c->message != NULL) {
                T_EQ_STR(ddo_last_error(), c->message);
                T_CHECK(ck == (ddo_checkpoint *)&ck); /* untouched on failure */
                T_CHECK(strchr(ddo_last_error(), '\n') == NULL);
            } else if (rc == 0) {
                T_EQ_U64(ddo_checkpoint_tensor_count(ck), 5);
                ddo_checkpoint_destroy(ck);
            }
        }
        /* the same verdict for the image in memory */
        FILE *f = fopen(g_path, "rb");
        T_REQUIRE(f != NULL);
        unsigned char buf[8192];
        size_t n = fread(buf, 1, sizeof(buf), f);
        fclose(f);
        ddo_checkpoint *ck = NULL;
        int rc = ddo__checkpoint_parse_buffer(buf, n, c->file, &ck);
        T_EQ_INT(rc, c->code);
        if (c->message != NULL)
            T_EQ_STR(ddo_last_error(), c->message);
        ddo_checkpoint_destroy(ck);
    }
    json_decref(m);
}

/* ---- temp-dir helpers ---- */

static int write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    size_t n = fwrite(data, 1, len, f);
    return (fclose(f) == 0 && n == len) ? 0 : -1;
}

static int copy_file(const char *from, const char *to)
{
    FILE *f = fopen(from, "rb");
    if (f == NULL)
        return -1;
    unsigned char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, 1 << 20, f) : 0;
    fclose(f);
    int rc = buf ? write_file(to, buf, n) : -1;
    free(buf);
    return rc;
}

static void remove_dir(const char *dir, const char *const *names, size_t count)
{
    char p[4096];
    for (size_t i = 0; i < count; i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* A file rewritten, grown, touched or replaced after open is detected on
 * the next read with DDO_E_FILE_CHANGED and nothing is read. */
static void test_file_changed(void)
{
    static const char *const names[] = { "edge_shapes.safetensors", "other.safetensors" };
    for (int scenario = 0; scenario < 4; scenario++) {
        for (int b = 0; b < 2; b++) {
#if defined(_WIN32)
            /* Windows refuses to replace or remove a file while a view of it is mapped, and
             * Wine 8 refuses to replace one held open even with FILE_SHARE_DELETE (which
             * Windows allows; not verified here): the change cannot be made, so there is
             * nothing to detect. A file deleted while open keeps its name under Wine 8 and
             * Wine reports no DeletePending, so the removal is seen only after the read
             * (file_win.c checks DeletePending; not verified on Windows). */
            if (scenario >= 2)
                continue;
#endif
            char dir[] = "/tmp/ddo_ck_XXXXXX";
            T_REQUIRE(mkdtemp(dir) != NULL);
            char p[4096], q[4096];
            snprintf(p, sizeof(p), "%s/%s", dir, names[0]);
            snprintf(q, sizeof(q), "%s/%s", dir, names[1]);
            T_REQUIRE(copy_file(st_path("valid/edge_shapes.safetensors"), p) == 0);
            ddo_checkpoint *ck = NULL;
            T_EQ_INT(ddo_checkpoint_create(p, b ? DDO_READ_MMAP : DDO_READ_PREAD, &ck), 0);
            T_REQUIRE(ck != NULL);
            size_t conv;
            T_EQ_INT(ddo_checkpoint_find(ck, "conv", &conv), 0);
            unsigned char before[216], sentinel[216];
            T_EQ_INT(ddo_checkpoint_read(ck, conv, 0, before, sizeof(before)), 0);
            const char *expect = NULL;
            if (scenario == 0) { /* grown in place */
                FILE *f = fopen(p, "ab");
                T_REQUIRE(f != NULL);
                fputc('x', f);
                fclose(f);
                expect = "edge_shapes.safetensors: file changed after it was opened (modified in "
                         "place: size 533 -> 534 bytes)";
            } else if (scenario == 1) { /* same size, new modification time */
                struct timespec ts[2] = { { 1000000000, 5 }, { 1000000000, 5 } };
                T_REQUIRE(utimensat(AT_FDCWD, p, ts, 0) == 0);
                expect = NULL;          /* the times differ by machine; checked by prefix */
            } else if (scenario == 2) { /* replaced by another file under its name */
                T_REQUIRE(copy_file(st_path("valid/edge_shapes.safetensors"), q) == 0);
                T_REQUIRE(rename(q, p) == 0);
                expect = "edge_shapes.safetensors: file changed after it was opened (replaced: "
                         "another file now has its name)";
            } else { /* removed */
                T_REQUIRE(unlink(p) == 0);
                expect = "edge_shapes.safetensors: file changed after it was opened (removed or "
                         "renamed)";
            }
            memset(sentinel, 0xA5, sizeof(sentinel));
            int rc = ddo_checkpoint_read(ck, conv, 0, sentinel, sizeof(sentinel));
            T_EQ_INT(rc, DDO_E_FILE_CHANGED);
            bool untouched = true;
            for (size_t i = 0; i < sizeof(sentinel); i++)
                untouched = untouched && sentinel[i] == 0xA5;
            T_CHECK(untouched);
            if (expect != NULL) {
                T_EQ_STR(ddo_last_error(), expect);
            } else {
                T_CONTAINS(ddo_last_error(), "edge_shapes.safetensors: file changed after it was "
                                             "opened (modified in place: modification time ");
            }
            T_EQ_STR(ddo_checkpoint_error(ck), ddo_last_error());
            T_EQ_INT(ddo_checkpoint_check(ck), DDO_E_FILE_CHANGED);
            T_EQ_INT(ddo__checkpoint_check_file(ck, 0), DDO_E_FILE_CHANGED);
            unsigned char x[4];
            T_EQ_INT(ddo__checkpoint_read_range(ck, 0, 8, x, 4), DDO_E_FILE_CHANGED);
            int fd = 5;
            T_EQ_INT(ddo__checkpoint_open_direct(ck, 0, &fd), DDO_E_FILE_CHANGED);
            T_EQ_INT(fd, -1);
            ddo_checkpoint_destroy(ck);
            remove_dir(dir, names, 2);
        }
    }
}

/* Internal entry points: absolute ranges, direct opens, bounds. */
static void test_internal_reads(void)
{
    ddo_checkpoint *ck = NULL;
    const char *p = st_path("valid/edge_shapes.safetensors");
    T_REQUIRE(ddo_checkpoint_create(p, DDO_READ_DEFAULT, &ck) == 0);
    size_t conv;
    T_REQUIRE(ddo_checkpoint_find(ck, "conv", &conv) == 0);
    const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, conv);
    unsigned char a[216], b[216];
    T_EQ_INT(ddo_checkpoint_read(ck, conv, 0, a, sizeof(a)), 0);
    T_EQ_INT(ddo__checkpoint_read_range(ck, 0, t->offset, b, sizeof(b)), 0);
    T_CHECK(memcmp(a, b, sizeof(a)) == 0);
    T_EQ_INT(ddo__checkpoint_check_file(ck, 0), 0);
    T_EQ_INT(ddo__checkpoint_check_file(ck, 1), DDO_E_INVALID_ARGUMENT);
    T_EQ_STR(ddo__checkpoint_file_name(ck, 0), "edge_shapes.safetensors");
    /* past the end of the file / of the tensor */
    T_EQ_INT(ddo__checkpoint_read_range(ck, 0, 530, b, 4), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__checkpoint_read_range(ck, 0, UINT64_MAX, b, 4), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_checkpoint_read(ck, conv, 1, a, sizeof(a)), DDO_E_INVALID_ARGUMENT);
    T_EQ_STR(ddo_checkpoint_error(ck),
             "tensor \"conv\": read of 216 bytes at byte 1 runs past its 216 bytes");
    T_EQ_INT(ddo_checkpoint_read(ck, 99, 0, a, 1), DDO_E_INVALID_ARGUMENT);
    size_t idx = 7;
    T_EQ_INT(ddo_checkpoint_find(ck, "nope", &idx), DDO_E_NOT_FOUND);
    T_EQ_U64(idx, 7);
    T_EQ_STR(ddo_checkpoint_error(ck), "no tensor named \"nope\" in the checkpoint");
    /* direct I/O: a descriptor on the same file, or "unsupported" (tmpfs) */
    int fd = 5;
    int rc = ddo__checkpoint_open_direct(ck, 0, &fd);
    T_CHECK(rc == 0 || rc == DDO_E_UNSUPPORTED);
    if (rc == 0) {
        T_CHECK(fd >= 0);
        close(fd);
    } else {
        T_EQ_INT(fd, -1);
    }
    ddo_checkpoint_destroy(ck);
    ddo_checkpoint_destroy(NULL);
}

struct reader {
    const ddo_checkpoint *ck;
    int failures;
};

static void *read_all(void *arg)
{
    struct reader *r = arg;
    for (int round = 0; round < 20; round++) {
        for (size_t i = 0; i < ddo_checkpoint_tensor_count(r->ck); i++) {
            const ddo_tensor_info *t = ddo_checkpoint_tensor(r->ck, i);
            unsigned char buf[16384];
            if (t->nbytes > sizeof(buf) || ddo_checkpoint_read(r->ck, i, 0, buf, t->nbytes) != 0)
                r->failures++;
        }
    }
    return NULL;
}

/* Reads from several threads at once return the same bytes (TSan checks the rest). */
static void test_concurrent_reads(void)
{
    for (int b = 0; b < 2; b++) {
        ddo_checkpoint *ck = NULL;
        T_REQUIRE(ddo_checkpoint_create(st_path("tiny_flux_sharded"),
                                        b ? DDO_READ_MMAP : DDO_READ_PREAD, &ck) == 0);
        ddo__thread th[4];
        struct reader r[4];
        for (int i = 0; i < 4; i++) {
            r[i] = (struct reader){ ck, 0 };
            T_REQUIRE(ddo__thread_create(&th[i], read_all, &r[i]) == 0);
        }
        for (int i = 0; i < 4; i++) {
            ddo__thread_join(th[i]);
            T_EQ_INT(r[i].failures, 0);
        }
        ddo_checkpoint_destroy(ck);
    }
}

/* Sharded-set rules, with index files written into a temp dir next to links
 * to the real shards. */
static void test_sharded_rules(void)
{
    json_t *m = load_manifest();
    T_REQUIRE(m != NULL);
    const json_t *shards = json_object_get(json_object_get(m, "sharded"), "shards");
    json_error_t err;
    json_t *index = json_load_file(st_path("tiny_flux_sharded/"
                                           "diffusion_pytorch_model.safetensors.index.json"),
                                   0, &err);
    T_REQUIRE(index != NULL);
    char dir[] = "/tmp/ddo_sh_XXXXXX";
    T_REQUIRE(mkdtemp(dir) != NULL);
    const char *names[10];
    size_t nn = 0;
    for (size_t i = 0; i < json_array_size(shards); i++) {
        const char *s = json_string_value(json_array_get(shards, i));
        char from[4096], to[4096], rel[1024];
        snprintf(rel, sizeof(rel), "tiny_flux_sharded/%s", s);
        char *abs = realpath(st_path(rel), NULL);
        T_REQUIRE(abs != NULL);
        snprintf(from, sizeof(from), "%s", abs);
        free(abs);
        snprintf(to, sizeof(to), "%s/%s", dir, s);
        T_REQUIRE(symlink(from, to) == 0);
        names[nn++] = s;
    }
    names[nn++] = "model.safetensors.index.json";
    char ipath[4096];
    snprintf(ipath, sizeof(ipath), "%s/model.safetensors.index.json", dir);

    struct {
        const char *what;
        const char *message;
    } cases[] = {
        { "ok", NULL },
        { "ghost",
          "model.safetensors.index.json: tensor \"ghost.weight\" is mapped to "
          "diffusion_pytorch_model-00001-of-00008.safetensors, but that shard does not hold it" },
        { "unmapped", "diffusion_pytorch_model-00002-of-00008.safetensors: tensor "
                      "\"context_embedder.bias\" is not in the weight_map of "
                      "model.safetensors.index.json" },
        { "moved", "diffusion_pytorch_model-00002-of-00008.safetensors: tensor "
                   "\"context_embedder.bias\" is mapped to "
                   "diffusion_pytorch_model-00001-of-00008.safetensors by "
                   "model.safetensors.index.json, not to this shard" },
        { "total",
          "model.safetensors.index.json: index: metadata.total_size is 297889 but the shards' "
          "tensors hold 297888 bytes" },
        { "escape", "model.safetensors.index.json: weight_map: tensor \"context_embedder.bias\" "
                    "is mapped to \"../x.safetensors\", not a file name in the index's directory" },
        { "missing_shard", NULL },
    };
    for (size_t k = 0; k < DDO_ARRAY_LEN(cases); k++) {
        json_t *ix = json_deep_copy(index);
        json_t *wm = json_object_get(ix, "weight_map");
        const char *what = cases[k].what;
        if (strcmp(what, "ghost") == 0)
            json_object_set_new(wm, "ghost.weight",
                                json_string("diffusion_pytorch_model-00001-of-00008.safetensors"));
        else if (strcmp(what, "unmapped") == 0)
            json_object_del(wm, "context_embedder.bias");
        else if (strcmp(what, "moved") == 0)
            json_object_set_new(wm, "context_embedder.bias",
                                json_string("diffusion_pytorch_model-00001-of-00008.safetensors"));
        else if (strcmp(what, "total") == 0)
            json_object_set_new(json_object_get(ix, "metadata"), "total_size",
                                json_integer(297889));
        else if (strcmp(what, "escape") == 0)
            json_object_set_new(wm, "context_embedder.bias", json_string("../x.safetensors"));
        else if (strcmp(what, "missing_shard") == 0)
            json_object_set_new(wm, "ghost.weight",
                                json_string("diffusion_pytorch_model-00009-of-00008.safetensors"));
        T_REQUIRE(json_dump_file(ix, ipath, JSON_INDENT(2)) == 0);
        json_decref(ix);
        ddo_checkpoint *ck = NULL;
        int rc = ddo_checkpoint_create(ipath, DDO_READ_DEFAULT, &ck);
        if (strcmp(what, "ok") == 0) {
            T_CHECK_MSG(rc == 0, "%s", ddo_last_error());
            T_EQ_U64(ddo_checkpoint_tensor_count(ck), 126);
            /* the directory path finds model.safetensors.index.json */
            ddo_checkpoint *ck2 = NULL;
            T_EQ_INT(ddo_checkpoint_create(dir, DDO_READ_DEFAULT, &ck2), 0);
            T_EQ_U64(ddo_checkpoint_file_count(ck2), 8);
            ddo_checkpoint_destroy(ck2);
        } else if (strcmp(what, "missing_shard") == 0) {
            T_EQ_INT(rc, DDO_E_NOT_FOUND);
            T_CONTAINS(ddo_last_error(),
                       "/diffusion_pytorch_model-00009-of-00008.safetensors: cannot open: No "
                       "such file or directory");
        } else {
            T_EQ_INT(rc, DDO_E_FORMAT);
            T_EQ_STR(ddo_last_error(), cases[k].message);
        }
        ddo_checkpoint_destroy(ck);
    }
    /* a directory with both layouts prefers the index; an empty one has none */
    char single[4096];
    snprintf(single, sizeof(single), "%s/diffusion_pytorch_model.safetensors", dir);
    char *abs = realpath(st_path("tiny_flux/diffusion_pytorch_model.safetensors"), NULL);
    T_REQUIRE(abs != NULL);
    T_CHECK(symlink(abs, single) == 0);
    free(abs);
    names[nn++] = "diffusion_pytorch_model.safetensors";
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo_checkpoint_create(dir, DDO_READ_DEFAULT, &ck), 0);
    T_EQ_U64(ddo_checkpoint_file_count(ck), 1); /* diffusers single file before model.* index */
    ddo_checkpoint_destroy(ck);
    remove_dir(dir, names, nn);

    char empty[] = "/tmp/ddo_em_XXXXXX";
    T_REQUIRE(mkdtemp(empty) != NULL);
    ck = (ddo_checkpoint *)&ck;
    T_EQ_INT(ddo_checkpoint_create(empty, DDO_READ_DEFAULT, &ck), DDO_E_NOT_FOUND);
    char want[4096];
    snprintf(want, sizeof(want),
             "%s: directory holds no diffusion_pytorch_model.safetensors[.index.json] or "
             "model.safetensors[.index.json]",
             empty);
    T_EQ_STR(ddo_last_error(), want);
    rmdir(empty);
    T_EQ_INT(ddo_checkpoint_create("/nonexistent/x.safetensors", DDO_READ_DEFAULT, &ck),
             DDO_E_NOT_FOUND);
    T_EQ_STR(ddo_last_error(),
             "/nonexistent/x.safetensors: cannot open: No such file or directory");
    T_EQ_INT(ddo_checkpoint_create(NULL, DDO_READ_DEFAULT, &ck), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_checkpoint_create("x", (ddo_read_backend)9, &ck), DDO_E_INVALID_ARGUMENT);
    json_decref(index);
    json_decref(m);
}

/* Host-memory tensors: reads copy from the caller's memory. */
static void test_from_memory(void)
{
    static const float w[6] = { 1, 2, 3, 4, 5, 6 };
    static const uint16_t bias[3] = { 7, 8, 9 };
    const uint64_t s_w[2] = { 3, 2 }, s_b[1] = { 3 }, s_e[2] = { 0, 5 };
    ddo_tensor_desc d[] = {
        { "layers.0.linear.weight", DDO_DTYPE_F32, 2, s_w, w },
        { "layers.0.linear.bias", DDO_DTYPE_BF16, 1, s_b, bias },
        { "layers.1.linear.weight", DDO_DTYPE_F32, 2, s_w, w },
        { "layers.1.empty", DDO_DTYPE_F16, 2, s_e, NULL },
        { "head.weight", DDO_DTYPE_F32, 2, s_w, NULL },
    };
    ddo_checkpoint *ck = NULL;
    T_REQUIRE(ddo_checkpoint_create_from_memory(d, DDO_ARRAY_LEN(d), &ck) == 0);
    T_EQ_U64(ddo_checkpoint_tensor_count(ck), 5);
    T_EQ_U64(ddo_checkpoint_file_count(ck), 0);
    T_EQ_U64(ddo_checkpoint_total_bytes(ck), 24 + 6 + 24 + 0 + 24);
    const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, 1);
    T_EQ_STR(t->name, "layers.0.linear.bias");
    T_EQ_U64(t->file_index, UINT32_MAX);
    T_EQ_U64(t->nbytes, 6);
    T_CHECK(t->host_data == bias);
    T_CHECK(t->name != d[1].name); /* copied */
    uint16_t got[2] = { 0, 0 };
    T_EQ_INT(ddo_checkpoint_read(ck, 1, 2, got, 4), 0);
    T_EQ_INT(got[0], 8);
    T_EQ_INT(got[1], 9);
    T_EQ_INT(ddo_checkpoint_read(ck, 4, 0, got, 4), DDO_E_INVALID_ARGUMENT);
    T_EQ_STR(ddo_checkpoint_error(ck),
             "tensor \"head.weight\": no host data (described for planning only)");
    T_EQ_INT(ddo_checkpoint_read(ck, 3, 0, got, 0), 0);
    size_t i = 0;
    T_EQ_INT(ddo_checkpoint_find(ck, "head.weight", &i), 0);
    T_EQ_U64(i, 4);
    T_REQUIRE(ddo_checkpoint_block_group_count(ck) == 1);
    const ddo_block_group *g = ddo_checkpoint_block_group(ck, 0);
    T_EQ_STR(g->prefix, "layers");
    T_EQ_U64(g->count, 2);
    T_EQ_U64(g->bytes_per_block, 30);
    T_EQ_U64(g->total_bytes, 54);
    char *json = NULL;
    T_REQUIRE(ddo_checkpoint_to_json(ck, &json) == 0);
    json_error_t err;
    json_t *doc = json_loads(json, JSON_REJECT_DUPLICATES, &err);
    T_CHECK_MSG(doc != NULL, "%s", err.text);
    const json_t *t0 = json_array_get(json_object_get(doc, "tensors"), 0);
    T_CHECK(json_is_null(json_object_get(t0, "file")));
    T_CHECK(json_is_null(json_object_get(t0, "offset")));
    T_EQ_INT(json_array_size(json_object_get(doc, "files")), 0);
    json_decref(doc);
    ddo_free(json);
    ddo_checkpoint_destroy(ck);

    /* duplicates and bad descriptions are refused; *out untouched */
    ddo_tensor_desc dup[] = { d[0], d[2], d[0] };
    ck = (ddo_checkpoint *)&ck;
    T_EQ_INT(ddo_checkpoint_create_from_memory(dup, 3, &ck), DDO_E_INVALID_ARGUMENT);
    T_EQ_STR(ddo_last_error(), "host tensors: duplicate tensor name \"layers.0.linear.weight\"");
    T_CHECK(ck == (ddo_checkpoint *)&ck);
    ddo_tensor_desc bad = { "x", DDO_DTYPE_COUNT, 0, NULL, NULL };
    T_EQ_INT(ddo_checkpoint_create_from_memory(&bad, 1, &ck), DDO_E_INVALID_ARGUMENT);
    const uint64_t huge[2] = { UINT64_MAX / 2, 3 };
    ddo_tensor_desc over = { "x", DDO_DTYPE_F32, 2, huge, NULL };
    T_EQ_INT(ddo_checkpoint_create_from_memory(&over, 1, &ck), DDO_E_OVERFLOW);
    ddo_checkpoint *none = NULL;
    T_EQ_INT(ddo_checkpoint_create_from_memory(NULL, 0, &none), 0);
    T_EQ_U64(ddo_checkpoint_tensor_count(none), 0);
    ddo_checkpoint_destroy(none);
}

/* Outermost groups only; groups need >= 2 blocks holding bytes. */
static void test_block_groups(void)
{
    static const uint8_t bytes[64];
    const uint64_t s4[1] = { 4 }, s0[1] = { 0 };
    ddo_tensor_desc d[] = {
        { "embed.weight", DDO_DTYPE_U8, 1, s4, bytes },
        { "blocks.0.ff.net.0.weight", DDO_DTYPE_U8, 1, s4, bytes },
        { "blocks.0.ff.net.2.weight", DDO_DTYPE_F32, 1, s4, bytes },
        { "blocks.1.ff.net.0.weight", DDO_DTYPE_U8, 1, s4, bytes },
        { "blocks.1.ff.net.2.weight", DDO_DTYPE_U8, 1, s4, bytes },
        { "solo.0.weight", DDO_DTYPE_U8, 1, s4, bytes },
        { "empty.0.weight", DDO_DTYPE_U8, 1, s4, bytes },
        { "empty.1.weight", DDO_DTYPE_U8, 1, s0, bytes },
        { "outer.0.inner.0.w", DDO_DTYPE_U8, 1, s4, bytes },
        { "outer.0.inner.1.w", DDO_DTYPE_U8, 1, s4, bytes },
        { "outer.0.inner.2.w", DDO_DTYPE_U8, 1, s4, bytes },
        { "0.weight", DDO_DTYPE_U8, 1, s4, bytes },
        { "1.weight", DDO_DTYPE_U8, 1, s4, bytes },
        { "tail.7", DDO_DTYPE_U8, 1, s4, bytes },
        { "tail.8", DDO_DTYPE_U8, 1, s4, bytes },
    };
    ddo_checkpoint *ck = NULL;
    T_REQUIRE(ddo_checkpoint_create_from_memory(d, DDO_ARRAY_LEN(d), &ck) == 0);
    T_REQUIRE(ddo_checkpoint_block_group_count(ck) == 2);
    const ddo_block_group *a = ddo_checkpoint_block_group(ck, 0);
    const ddo_block_group *b = ddo_checkpoint_block_group(ck, 1);
    T_EQ_STR(a->prefix, "blocks");
    T_EQ_U64(a->count, 2);
    T_EQ_U64(a->bytes_per_block, 20);
    T_EQ_U64(a->total_bytes, 28);
    T_EQ_STR(b->prefix, "outer.0.inner"); /* outer has one block: the inner group counts */
    T_EQ_U64(b->count, 3);
    T_EQ_U64(b->bytes_per_block, 4);
    T_EQ_U64(b->total_bytes, 12);
    ddo_checkpoint_destroy(ck);
}

/* A 3500-tensor checkpoint opens in milliseconds and finds every name. */
static void test_large_header(void)
{
    enum { N = 3500 };
    size_t cap = (size_t)N * 160 + 64;
    char *hdr = malloc(cap);
    T_REQUIRE(hdr != NULL);
    size_t len = (size_t)snprintf(hdr, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < N; i++)
        len += (size_t)snprintf(hdr + len, cap - len,
                                ",\"model.layers.%d.mlp.w%d.weight\":{\"dtype\":\"BF16\",\"shape\":"
                                "[2,2],\"data_offsets\":[%d,%d]}",
                                i / 10, i % 10, i * 8, i * 8 + 8);
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    size_t total = 8 + len + (size_t)N * 8;
    unsigned char *img = calloc(1, total);
    T_REQUIRE(img != NULL);
    for (int k = 0; k < 8; k++)
        img[k] = (unsigned char)((uint64_t)len >> (8 * k));
    memcpy(img + 8, hdr, len);
    char dir[] = "/tmp/ddo_lg_XXXXXX";
    T_REQUIRE(mkdtemp(dir) != NULL);
    char p[4096];
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    T_REQUIRE(write_file(p, img, total) == 0);
    uint64_t t0 = ddo__now_ns();
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo_checkpoint_create(dir, DDO_READ_DEFAULT, &ck), 0);
    uint64_t t1 = ddo__now_ns();
    T_REQUIRE(ck != NULL);
    T_EQ_U64(ddo_checkpoint_tensor_count(ck), N);
    for (int i = 0; i < N; i++) {
        char name[128];
        snprintf(name, sizeof(name), "model.layers.%d.mlp.w%d.weight", i / 10, i % 10);
        size_t idx = SIZE_MAX;
        T_EQ_INT(ddo_checkpoint_find(ck, name, &idx), 0);
        T_EQ_U64(idx, (size_t)i); /* offset order */
    }
    uint64_t t2 = ddo__now_ns();
    T_REQUIRE(ddo_checkpoint_block_group_count(ck) == 1);
    T_EQ_STR(ddo_checkpoint_block_group(ck, 0)->prefix, "model.layers");
    T_EQ_U64(ddo_checkpoint_block_group(ck, 0)->count, 350);
    fprintf(stderr, "  open %.2f ms, %d finds %.2f ms\n", (double)(t1 - t0) / 1e6, N,
            (double)(t2 - t1) / 1e6);
    /* generous for sanitizer builds; an unindexed table takes far longer */
    T_CHECK(t1 - t0 < 500u * 1000 * 1000);
    T_CHECK(t2 - t1 < 100u * 1000 * 1000);
    ddo_checkpoint_destroy(ck);
    unlink(p);
    rmdir(dir);
    free(img);
    free(hdr);
}

/* Hand-built images: padding, zero-size tensors, layout rules, the JSON document. */
static int image(const char *header, size_t data_len, unsigned char *out, size_t cap, size_t *size)
{
    size_t len = strlen(header);
    if (8 + len + data_len > cap)
        return -1;
    for (int k = 0; k < 8; k++)
        out[k] = (unsigned char)((uint64_t)len >> (8 * k));
    memcpy(out + 8, header, len);
    for (size_t i = 0; i < data_len; i++)
        out[8 + len + i] = (unsigned char)i;
    *size = 8 + len + data_len;
    return 0;
}

static void test_layout_rules(void)
{
    struct {
        const char *header;
        size_t data;
        int code;
        const char *message;
    } cases[] = {
        { "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}  \t\n ", 2, 0, NULL },
        { "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
          "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]},"
          "\"y\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]},"
          "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]},"
          "\"__metadata__\":null}",
          3, 0, NULL },
        { "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
          "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]}}",
          4, DDO_E_FORMAT,
          "m.safetensors: tensor \"z\": empty data_offsets [2, 2] lie inside tensor \"a\" [0, 4]" },
        { "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
          "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[3,4]}}",
          4, DDO_E_FORMAT,
          "m.safetensors: tensor \"b\": data_offsets [3, 4] leave a gap: bytes [2, 3) of the data "
          "area belong to no tensor" },
        { "{}", 0, 0, NULL },
        { "{}", 1, DDO_E_FORMAT,
          "m.safetensors: 1 bytes follow the last tensor (the data area holds 1 bytes, the "
          "tensors end at 0)" },
        { "", 0, DDO_E_FORMAT, "m.safetensors: header is empty, not a JSON object" },
        { "\"x\"", 0, DDO_E_FORMAT,
          "m.safetensors: header is not valid JSON: '[' or '{' expected near '\"x\"' at line 1, "
          "column 3" },
        { "{\"a\":[1]}", 0, DDO_E_FORMAT,
          "m.safetensors: tensor \"a\": entry is an array, not an object" },
        { "{\"a\":{\"dtype\":7,\"shape\":[],\"data_offsets\":[0,1]}}", 1, DDO_E_FORMAT,
          "m.safetensors: tensor \"a\": \"dtype\" is an integer, not a string" },
        { "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, DDO_E_FORMAT,
          "m.safetensors: tensor \"a\": missing \"shape\"" },
        { "{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, DDO_E_FORMAT,
          "m.safetensors: tensor \"a\": shape [1.5]: dimension 0 is a real number, not a "
          "non-negative integer" },
        { "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
          DDO_E_UNSUPPORTED,
          "m.safetensors: tensor \"a\": shape [1, 1, 1, 1, 1, 1, 1, 1, 1] has 9 dimensions; at "
          "most 8 are supported (stricter than the official reader)" },
        { "{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, DDO_E_FORMAT,
          "m.safetensors: tensor \"a\": missing \"data_offsets\"" },
        { "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,-1]}}", 1, DDO_E_FORMAT,
          "m.safetensors: tensor \"a\": data_offsets [0, -1] are not non-negative integers" },
        { "{\"__metadata__\":[]}", 0, DDO_E_FORMAT,
          "m.safetensors: __metadata__ is an array, not an object" },
        { "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"dtype\":\"U8\"}}", 1,
          DDO_E_FORMAT,
          "m.safetensors: duplicate key \"dtype\" in the header at line 1, column 59 (rejected: "
          "stricter than the official library, which keeps the last)" },
        { "{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}} x", 1, DDO_E_FORMAT,
          "m.safetensors: header is not valid JSON: end of file expected near 'x' at line 1, "
          "column 54" },
        { "{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}\0 ", 1, DDO_E_FORMAT,
          NULL /* strlen stops at the NUL: the header is exact, so accepted */ },
    };
    unsigned char buf[4096];
    for (size_t k = 0; k < DDO_ARRAY_LEN(cases); k++) {
        size_t size = 0;
        T_REQUIRE(image(cases[k].header, cases[k].data, buf, sizeof(buf), &size) == 0);
        ddo_checkpoint *ck = NULL;
        int rc = ddo__checkpoint_parse_buffer(buf, size, "m.safetensors", &ck);
        int want = cases[k].message == NULL ? 0 : cases[k].code;
        T_CHECK_MSG(rc == want, "case %zu: %s: %s", k, ddo_errname(rc), ddo_last_error());
        if (cases[k].message != NULL)
            T_EQ_STR(ddo_last_error(), cases[k].message);
        if (rc == 0 && k == 1) {
            T_EQ_U64(ddo_checkpoint_tensor_count(ck), 4);
            const char *order[] = { "a", "y", "z", "b" };
            for (size_t i = 0; i < 4; i++)
                T_EQ_STR(ddo_checkpoint_tensor(ck, i)->name, order[i]);
            unsigned char x[1];
            T_EQ_INT(ddo_checkpoint_read(ck, 3, 0, x, 1), 0);
            T_EQ_INT(x[0], 2);
        }
        ddo_checkpoint_destroy(ck);
    }
    /* A header ending in a NUL byte followed by spaces. */
    const char *h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}";
    size_t hl = strlen(h);
    size_t size = 0;
    unsigned char img[256];
    memset(img, 0, sizeof(img));
    img[0] = (unsigned char)(hl + 3);
    memcpy(img + 8, h, hl);
    img[8 + hl] = 0;
    img[8 + hl + 1] = ' ';
    img[8 + hl + 2] = 'x';
    size = 8 + hl + 3 + 1;
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo__checkpoint_parse_buffer(img, size, "m.safetensors", &ck), DDO_E_FORMAT);
    T_EQ_STR(ddo_last_error(), "m.safetensors: header contains a NUL byte at byte 52");
}

/* The --json document of a file checkpoint. */
static void test_json(void)
{
    ddo_checkpoint *ck = NULL;
    T_REQUIRE(ddo_checkpoint_create(st_path("tiny_flux_sharded"), DDO_READ_DEFAULT, &ck) == 0);
    char *text = NULL;
    T_REQUIRE(ddo_checkpoint_to_json(ck, &text) == 0);
    json_error_t err;
    json_t *doc = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    T_CHECK_MSG(doc != NULL, "%s", err.text);
    T_REQUIRE(doc != NULL);
    const json_t *files = json_object_get(doc, "files");
    T_EQ_U64(json_array_size(files), 8);
    const json_t *f1 = json_array_get(files, 1);
    T_EQ_STR(json_string_value(json_object_get(f1, "path")), ddo_checkpoint_file(ck, 1)->path);
    T_EQ_U64(json_integer_value(json_object_get(f1, "size")), 40896);
    T_EQ_U64(json_integer_value(json_object_get(f1, "header_bytes")), 1784);
    T_EQ_STR(json_string_value(json_object_get(json_object_get(doc, "metadata"), "format")), "pt");
    const json_t *tensors = json_object_get(doc, "tensors");
    T_EQ_U64(json_array_size(tensors), 126);
    for (size_t i = 0; i < json_array_size(tensors); i++) {
        const json_t *t = json_array_get(tensors, i);
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(ck, i);
        T_EQ_STR(json_string_value(json_object_get(t, "name")), ti->name);
        T_EQ_STR(json_string_value(json_object_get(t, "dtype")), ddo_dtype_name(ti->dtype));
        T_EQ_U64(json_array_size(json_object_get(t, "shape")), ti->ndim);
        T_EQ_U64(json_integer_value(json_object_get(t, "file")), ti->file_index);
        T_EQ_U64(json_integer_value(json_object_get(t, "offset")), ti->offset);
        T_EQ_U64(json_integer_value(json_object_get(t, "nbytes")), ti->nbytes);
    }
    T_EQ_U64(json_integer_value(json_object_get(doc, "total_bytes")), 297888);
    const json_t *blocks = json_object_get(doc, "blocks");
    T_EQ_U64(json_array_size(blocks), 2);
    const json_t *b0 = json_array_get(blocks, 0);
    T_EQ_STR(json_string_value(json_object_get(b0, "prefix")), "transformer_blocks");
    T_EQ_U64(json_integer_value(json_object_get(b0, "count")), 2);
    T_EQ_U64(json_integer_value(json_object_get(b0, "bytes_per_block")), 75776);
    /* the first tensor of file 0 sits right after the header */
    const json_t *t0 = json_array_get(tensors, 0);
    T_EQ_U64(json_integer_value(json_object_get(t0, "offset")), 8 + 1136);
    json_decref(doc);
    ddo_free(text);
    ddo_checkpoint_destroy(ck);
}

int main(void)
{
    T_RUN(test_dtypes);
    T_RUN(test_valid_files);
    T_RUN(test_tiny_flux);
    T_RUN(test_invalid_files);
    T_RUN(test_file_changed);
    T_RUN(test_internal_reads);
    T_RUN(test_concurrent_reads);
    T_RUN(test_sharded_rules);
    T_RUN(test_from_memory);
    T_RUN(test_block_groups);
    T_RUN(test_large_header);
    T_RUN(test_layout_rules);
    T_RUN(test_json);
    return t_done();
}
