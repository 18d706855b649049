/*
 * test_sidecar_format.c - the coded sidecar's file format (src/store/source_sidecar.c): a written
 * sidecar opens and finds its entries by (offset, length, dtype); it is refused for another
 * identity, a smaller tensor limit, every truncation, and a changed bit anywhere in its header
 * or table; with the hashes made to match again (a forger's sidecar), every changed byte of
 * the header and table is refused or leaves entries that stay inside both files, ordered and
 * disjoint. The parts of a stream hash to the stream's hash.
 *
 * ctest-labels: unit
 */
#include "t.h"
#include "codec/codec_internal.h"
#include "store/source_sidecar.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];
static const ddo__file_id id = { 7, 1234, 1u << 20, 111222333, 444555666, true };
static uint8_t blob_a[100], blob_b[5000];

static void write_sample(uint64_t *len, char **out)
{
    for (size_t i = 0; i < sizeof(blob_b); i++)
        blob_b[i] = (uint8_t)(i * 37 + 5);
    memset(blob_a, 0xab, sizeof(blob_a));
    ddo__sidecar_item items[] = {
        { 9000, 20000, DDO_DTYPE_F32, blob_b, sizeof(blob_b), false, 0 },
        { 200, 400, DDO_DTYPE_BF16, blob_a, sizeof(blob_a), false, 0 },
        { 600, 800, DDO_DTYPE_F16, NULL, 0, false, 0 }, /* kept raw */
    };
    char *path = ddo__sidecar_path(dir, &id);
    *out = path;
    T_REQUIRE(path != NULL);
    char why[256];
    T_REQUIRE(ddo__sidecar_write(path, &id, items, 3, len, why, sizeof(why)) == 0);
}

static uint8_t file_bytes[65536];

static void slurp(const char *path, size_t *len)
{
    *len = 0;
    FILE *f = fopen(path, "rb");
    T_REQUIRE(f != NULL);
    *len = fread(file_bytes, 1, sizeof(file_bytes), f);
    fclose(f);
}

static void put(const char *path, const uint8_t *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    T_REQUIRE(f != NULL);
    T_REQUIRE(fwrite(b, 1, len, f) == len);
    fclose(f);
}

static int try_open(const char *path, ddo__sidecar **s)
{
    char why[256];
    *s = NULL;
    int e = ddo__sidecar_open(path, &id, 16, s, why, sizeof(why));
    T_CHECK(e == 0 || why[0] != '\0' || e == ENOENT);
    return e;
}

static void test_round_trip(void)
{
    uint64_t len = 0;
    char *path = NULL;
    write_sample(&len, &path);
    ddo__sidecar *s = NULL;
    T_REQUIRE(try_open(path, &s) == 0);
    T_EQ_U64(s->count, 3);
    T_EQ_U64(s->bytes, len);
    const ddo__sidecar_entry *a = ddo__sidecar_find(s, 200, 400, DDO_DTYPE_BF16);
    const ddo__sidecar_entry *b = ddo__sidecar_find(s, 9000, 20000, DDO_DTYPE_F32);
    const ddo__sidecar_entry *r = ddo__sidecar_find(s, 600, 800, DDO_DTYPE_F16);
    T_REQUIRE(a != NULL && b != NULL && r != NULL);
    T_CHECK(ddo__sidecar_find(s, 200, 401, DDO_DTYPE_BF16) == NULL);
    T_CHECK(ddo__sidecar_find(s, 200, 400, DDO_DTYPE_F32) == NULL);
    T_CHECK(ddo__sidecar_find(s, 201, 400, DDO_DTYPE_BF16) == NULL);
    T_EQ_U64(r->coded_bytes, 0);
    T_EQ_U64(a->coded_off % DDO__SIDECAR_ALIGN, 0);
    T_EQ_U64(b->coded_off % DDO__SIDECAR_ALIGN, 0);
    size_t n = 0;
    slurp(path, &n);
    const uint8_t *bytes = file_bytes;
    T_CHECK(memcmp(bytes + a->coded_off, blob_a, sizeof(blob_a)) == 0);
    T_CHECK(memcmp(bytes + b->coded_off, blob_b, sizeof(blob_b)) == 0);
    T_EQ_U64(a->hash, ddo__sidecar_hash(blob_a, sizeof(blob_a), 0));
    /* parts at multiples of 8 bytes add up to the whole */
    uint64_t parts = ddo__sidecar_hash(blob_b, 4096, 0) +
                     ddo__sidecar_hash(blob_b + 4096, sizeof(blob_b) - 4096, 4096 / 8);
    T_EQ_U64(parts, b->hash);
    ddo__sidecar_close(s);
    /* another identity, a smaller limit */
    ddo__file_id other = id;
    other.mtime_ns++;
    char why[256];
    T_CHECK(ddo__sidecar_open(path, &other, 16, &s, why, sizeof(why)) != 0);
    T_CONTAINS(why, "identity");
    T_CHECK(ddo__sidecar_open(path, &id, 2, &s, why, sizeof(why)) != 0);
    char *p2 = ddo__sidecar_path(dir, &other);
    T_CHECK(strcmp(p2, path) != 0); /* another identity, another name */
    free(p2);
    unlink(path);
    T_CHECK(try_open(path, &s) == ENOENT);
    free(path);
}

static void rehash(uint8_t *b, size_t len)
{
    uint64_t tb = (uint64_t)ddo__codec_rd32(b + 20) * DDO__SIDECAR_ENTRY;
    if (DDO__SIDECAR_HEADER + tb <= len)
        ddo__codec_wr64(b + 112, ddo__sidecar_hash(b + DDO__SIDECAR_HEADER, tb, 0));
    ddo__codec_wr64(b + 120, ddo__sidecar_hash(b, 120, 0));
}

/* A sidecar that opened: its entries stay inside both files, ordered and disjoint. */
static void check_sane(const ddo__sidecar *s)
{
    uint64_t tensor_end = 0, stream_end = 0;
    for (size_t i = 0; i < s->count; i++) {
        const ddo__sidecar_entry *e = &s->entries[i];
        T_CHECK(e->offset >= tensor_end && e->offset + e->raw_bytes <= id.size);
        T_CHECK(e->raw_bytes > 0 && e->offset + e->raw_bytes > e->offset);
        tensor_end = e->offset + e->raw_bytes;
        if (e->coded_bytes == 0)
            continue;
        T_CHECK(e->coded_off >= stream_end && e->coded_off + e->coded_bytes <= s->bytes);
        T_CHECK(e->coded_bytes < e->raw_bytes && e->coded_off + e->coded_bytes > e->coded_off);
        stream_end = e->coded_off + e->coded_bytes;
    }
}

static void test_damage(void)
{
    uint64_t len = 0;
    char *path = NULL;
    write_sample(&len, &path);
    size_t n = 0;
    slurp(path, &n);
    static uint8_t b[65536];
    const uint8_t *orig = file_bytes;
    T_REQUIRE(n == len && n <= sizeof(b));
    size_t table_end = DDO__SIDECAR_HEADER + 3 * DDO__SIDECAR_ENTRY;
    ddo__sidecar *s = NULL;
    int refused = 0, opened = 0;
    for (size_t i = 0; i < table_end; i++) {
        for (int bit = 0; bit < 8; bit += 3) { /* a flipped bit: the hashes see it */
            memcpy(b, orig, n);
            b[i] ^= (uint8_t)(1u << bit);
            put(path, b, n);
            T_CHECK_MSG(try_open(path, &s) != 0, "byte %zu bit %d accepted", i, bit);
            ddo__sidecar_close(s);
        }
        static const uint8_t values[] = { 0x00, 0xff, 0x80, 0x01, 0x7f };
        for (size_t v = 0; v < sizeof(values); v++) { /* forged: the hashes match again */
            memcpy(b, orig, n);
            b[i] = values[v];
            rehash(b, n);
            put(path, b, n);
            if (try_open(path, &s) == 0) {
                check_sane(s);
                opened++;
            } else {
                refused++;
            }
            ddo__sidecar_close(s);
        }
    }
    T_CHECK(refused > 0 && opened > 0);
    for (size_t cut = 0; cut < n; cut += 61) { /* every truncation */
        put(path, orig, cut);
        T_CHECK_MSG(try_open(path, &s) != 0, "truncated to %zu accepted", cut);
        ddo__sidecar_close(s);
    }
    memcpy(b, orig, n);
    b[n] = 0; /* one byte more */
    put(path, b, n + 1);
    T_CHECK(try_open(path, &s) != 0);
    unlink(path);
    free(path);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/ddo-sidecar-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return 1;
    T_RUN(test_round_trip);
    T_RUN(test_damage);
    rmdir(dir);
    return t_done();
}
