/*
 * test_codec.c - the weight codec (src/codec/codec.c): bit-exact round trips for
 * every dtype and for edge values (signed zeros, subnormals, infinities, NaN
 * payloads, all 65,536 BF16 and F16 patterns; FP8 streams of normal-derived,
 * random and adversarial bytes, whole-byte Huffman or raw), results independent of the
 * encoder's thread count, raw fallback on random bits within the bound,
 * Gaussian BF16 weights coding smaller, corruption of every region of a
 * stream detected without a write outside the output, the decode through
 * the cpu device's codec_decode operation equal to the C reference (one tensor,
 * and a batch of several in one operation, corruption reported per tensor,
 * refused batches queuing nothing), and its asynchronous device->host copy.
 *
 * ctest-labels: unit threads
 */
#include "codec/codec.h"
#include "device/device.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GROUP DDO_CODEC_GROUP_ELEMS
#define GUARD ((uint64_t)64)

static uint64_t g_rng = 1;

static uint64_t rnd(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double gauss(void)
{
    double u = ((double)(rnd() >> 11) + 0.5) / 9007199254740992.0;
    double v = (double)(rnd() >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* n elements of dtype shaped like trained weights (Gaussian, std 0.02), or random bits. */
static uint8_t *make(ddo_dtype dt, uint64_t n, bool random_bits)
{
    size_t es = ddo_dtype_size(dt);
    uint8_t *p = malloc(n * es + 1);
    for (uint64_t i = 0; i < n; i++) {
        float f = (float)(gauss() * 0.02);
        uint64_t r = rnd();
        if (!random_bits && dt == DDO_DTYPE_BF16) {
            uint16_t h = to_bf16(f);
            memcpy(p + 2 * i, &h, 2);
        } else if (!random_bits && dt == DDO_DTYPE_F32) {
            memcpy(p + 4 * i, &f, 4);
        } else if (!random_bits && dt == DDO_DTYPE_F16) {
            /* exponent near 15 - 6, 10 random mantissa bits */
            unsigned ex = (unsigned)(9 + (int)(gauss() * 1.2)) & 31u;
            uint16_t h = (uint16_t)((r & 0x83FF) | ex << 10);
            memcpy(p + 2 * i, &h, 2);
        } else {
            memcpy(p + es * i, &r, es);
        }
    }
    return p;
}

/* Encodes, checks the bound and the plan, decodes into a guarded buffer and compares. */
static uint64_t round_trip(const uint8_t *src, uint64_t bytes, ddo_dtype dt, uint32_t block,
                           unsigned threads, uint8_t **coded_out)
{
    uint64_t bound = ddo__codec_bound(dt, bytes, block);
    T_CHECK(bound >= bytes);
    uint8_t *coded = malloc(bound + 1);
    uint64_t len = 0;
    ddo__codec_params p = { block, threads };
    ddo__errbuf eb = { 0, "" };
    int rc = ddo__codec_encode(src, bytes, dt, &p, coded, bound, &len, "t.weight", &eb);
    T_CHECK_MSG(rc == 0, "%s", eb.msg);
    T_CHECK(len <= bound);
    uint8_t *out = malloc(bytes + 2 * GUARD);
    memset(out, 0xA5, bytes + 2 * GUARD);
    rc = ddo__codec_decode(coded, len, out + GUARD, bytes, "t.weight", &eb);
    T_CHECK_MSG(rc == 0, "%s %s: %s", ddo_dtype_name(dt), "decode", eb.msg);
    T_CHECK(memcmp(out + GUARD, src, bytes) == 0);
    for (uint64_t i = 0; i < GUARD; i++)
        T_CHECK(out[i] == 0xA5 && out[GUARD + bytes + i] == 0xA5);
    free(out);
    if (coded_out)
        *coded_out = coded;
    else
        free(coded);
    return len;
}

static void test_every_dtype(void)
{
    static const uint64_t counts[] = {
        0, 1, 3, 31, 33, 1000, GROUP - 1, GROUP + 17, 3 * GROUP + 5
    };
    for (int dt = 0; dt < DDO_DTYPE_COUNT; dt++) {
        for (size_t k = 0; k < DDO_ARRAY_LEN(counts); k++) {
            uint64_t n = counts[k];
            uint8_t *src = make((ddo_dtype)dt, n, false);
            round_trip(src, n * ddo_dtype_size((ddo_dtype)dt), (ddo_dtype)dt, GROUP, 2, NULL);
            free(src);
        }
    }
}

static void test_all_16bit_patterns(void)
{
    const ddo_dtype types[] = { DDO_DTYPE_BF16, DDO_DTYPE_F16 };
    uint16_t *v = malloc(3 * 65536 * 2);
    for (uint32_t i = 0; i < 65536; i++) {
        v[i] = (uint16_t)i;                                  /* in order */
        v[65536 + i] = (uint16_t)(i * 40503u + 7);           /* a permutation */
        v[131072 + i] = (uint16_t)(i & 1 ? 0x8000 : 0x0001); /* -0 and the smallest subnormal */
    }
    for (size_t t = 0; t < 2; t++)
        round_trip((const uint8_t *)v, 3 * 65536 * 2, types[t], GROUP, 3, NULL);
    free(v);
}

static void test_f32_edges(void)
{
    static const uint32_t edge[] = { 0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000,
                                     0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF,
                                     0x7FBFFFFF, 0x3F800000, 0xBF800000, 0x7F7FFFFF };
    uint64_t n = 2 * GROUP + 100;
    uint32_t *v = (uint32_t *)make(DDO_DTYPE_F32, n, false);
    for (uint64_t i = 0; i < n; i += 3)
        v[i] = edge[i % DDO_ARRAY_LEN(edge)] ^ (uint32_t)(rnd() & (i % 2 ? 0x3FF : 0));
    round_trip((const uint8_t *)v, n * 4, DDO_DTYPE_F32, GROUP, 2, NULL);
    free(v);
}

static void test_threads_same_bytes(void)
{
    uint64_t n = 5 * GROUP + 77;
    uint8_t *src = make(DDO_DTYPE_BF16, n, false);
    uint8_t *a = NULL, *b = NULL;
    uint64_t la = round_trip(src, n * 2, DDO_DTYPE_BF16, GROUP, 1, &a);
    uint64_t lb = round_trip(src, n * 2, DDO_DTYPE_BF16, GROUP, 4, &b);
    T_EQ_U64(la, lb);
    T_CHECK(la == lb && memcmp(a, b, (size_t)la) == 0);
    free(a);
    free(b);
    free(src);
}

static void test_ratio_and_raw_fallback(void)
{
    uint64_t n = 8 * GROUP;
    uint8_t *w = make(DDO_DTYPE_BF16, n, false), *r = make(DDO_DTYPE_BF16, n, true);
    uint8_t *cw = NULL, *cr = NULL;
    uint64_t lw = round_trip(w, n * 2, DDO_DTYPE_BF16, 2 * GROUP, 2, &cw);
    uint64_t lr = round_trip(r, n * 2, DDO_DTYPE_BF16, 2 * GROUP, 2, &cr);
    /* Gaussian BF16 carries ~2.6 bits in its 8 exponent bits: well under 0.75 of raw. */
    T_CHECK_MSG((double)lw < 0.75 * (double)(n * 2), "gaussian ratio %.4f",
                (double)lw / (double)(n * 2));
    /* Random bits: every block stored raw, within the bound (raw + 64 + 56 per block). */
    T_CHECK(lr <= ddo__codec_bound(DDO_DTYPE_BF16, n * 2, 2 * GROUP));
    T_CHECK(lr >= n * 2);
    ddo__codec_plan *pw = NULL, *pr = NULL;
    T_EQ_INT(ddo__codec_plan_create(cw, lw, "w", &pw, NULL), 0);
    T_EQ_INT(ddo__codec_plan_create(cr, lr, "r", &pr, NULL), 0);
    T_REQUIRE(pw != NULL && pr != NULL);
    T_EQ_U64(pw->raw_blocks, 0);
    T_EQ_U64(pr->raw_blocks, pr->launch.n_blocks);
    T_EQ_U64(pr->launch.n_blocks, 4);
    ddo__codec_plan_destroy(pw);
    ddo__codec_plan_destroy(pr);
    free(w);
    free(r);
    free(cw);
    free(cr);
}

static void test_arguments(void)
{
    uint8_t src[64] = { 0 }, dst[512];
    uint64_t len = 0;
    ddo__errbuf eb = { 0, "" };
    T_EQ_U64(ddo__codec_bound(DDO_DTYPE_BF16, 3, 0), 0); /* half an element */
    T_EQ_U64(ddo__codec_bound(DDO_DTYPE_BF16, 2, 1000), 0);
    T_CHECK(ddo__codec_bound(DDO_DTYPE_U8, 3, 0) > 0);
    ddo__codec_params p = { 0, 1 };
    T_EQ_INT(ddo__codec_encode(src, 64, DDO_DTYPE_BF16, &p, dst, 100, &len, "x.w", &eb),
             DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(eb.msg, "x.w");
    T_EQ_INT(ddo__codec_encode(src, 64, DDO_DTYPE_BF16, &p, dst, sizeof(dst), &len, "x.w", &eb), 0);
    uint8_t out[64];
    memset(out, 7, sizeof(out));
    T_EQ_INT(ddo__codec_decode(dst, len, out, 62, "x.w", &eb), DDO_E_INVALID_ARGUMENT);
    T_CHECK(out[0] == 7 && out[63] == 7);
    T_EQ_INT(ddo__codec_decode(dst, len - 16, out, 64, "x.w", &eb), DDO_E_FORMAT);
    T_CONTAINS(eb.msg, "tensor `x.w`");
    T_EQ_INT(ddo__codec_decode(dst, 10, out, 64, "x.w", &eb), DDO_E_FORMAT);
    T_CHECK(out[0] == 7);
}

/* A stream of three blocks: Gaussian (huff), random (raw), a short Gaussian tail (huff). */
static uint8_t *three_blocks(uint64_t *len, uint8_t **src_out, uint64_t *bytes)
{
    uint64_t n = 2 * GROUP + 1000;
    uint8_t *src = make(DDO_DTYPE_BF16, n, false);
    uint8_t *rb = make(DDO_DTYPE_BF16, GROUP, true);
    memcpy(src + 2 * GROUP, rb, 2 * GROUP);
    free(rb);
    uint8_t *coded = NULL;
    *len = round_trip(src, n * 2, DDO_DTYPE_BF16, GROUP, 2, &coded);
    *src_out = src;
    *bytes = n * 2;
    return coded;
}

static void test_corruption_detected(void)
{
    uint64_t len = 0, bytes = 0;
    uint8_t *src = NULL, *coded = three_blocks(&len, &src, &bytes);
    ddo__codec_plan *p = NULL;
    T_EQ_INT(ddo__codec_plan_create(coded, len, "t.weight", &p, NULL), 0);
    T_REQUIRE(p != NULL && p->launch.n_blocks == 3);
    T_EQ_U64(p->raw_blocks, 1);
    uint8_t *out = malloc(bytes + 2 * GUARD);
    int missed = 0, failed_guard = 0;
    ddo__errbuf eb = { 0, "" };
    /* Every byte of the metadata regions and of the short last block, every 41st byte of the
     * payloads; one bit each. */
    for (uint64_t i = 0; i < len; i++) {
        bool meta = i < p->blocks[0].coded_offset + 176 + 16 * 9 ||
                    (i >= p->blocks[1].coded_offset && i < p->blocks[1].coded_offset + 48) ||
                    i >= p->blocks[2].coded_offset;
        if (!meta && i % 41 != 0)
            continue;
        uint8_t bit = (uint8_t)(1u << (i % 8));
        coded[i] ^= bit;
        memset(out, 0x5A, bytes + 2 * GUARD);
        int rc = ddo__codec_decode(coded, len, out + GUARD, bytes, "t.weight", &eb);
        if (rc != DDO_E_FORMAT || strstr(eb.msg, "tensor `t.weight`") == NULL) {
            if (missed++ < 5)
                fprintf(stderr, "  flip at byte %llu not detected (rc %d)\n", (unsigned long long)i,
                        rc);
        }
        for (uint64_t g = 0; g < GUARD; g++)
            failed_guard += out[g] != 0x5A || out[GUARD + bytes + g] != 0x5A;
        coded[i] ^= bit;
    }
    T_EQ_INT(missed, 0);
    T_EQ_INT(failed_guard, 0);
    /* The device path: the plan comes from the intact host copy, the device copy is bad. */
    uint64_t *st = calloc(2 * p->launch.n_blocks, sizeof(uint64_t));
    for (uint32_t b = 0; b < 3; b++) {
        uint64_t at = p->blocks[b].coded_offset + p->blocks[b].coded_bytes - 200;
        coded[at] ^= 0x10;
        ddo__codec_decode_status(coded, len, out + GUARD, bytes, &p->launch, st);
        T_EQ_INT(ddo__codec_status_check(p, st, &eb), DDO_E_FORMAT);
        char want[64];
        snprintf(want, sizeof(want), "block %u of 3", b);
        T_CONTAINS(eb.msg, want);
        coded[at] ^= 0x10;
    }
    ddo__codec_decode_status(coded, len, out + GUARD, bytes, &p->launch, st);
    T_EQ_INT(ddo__codec_status_check(p, st, &eb), 0);
    free(st);
    free(out);
    ddo__codec_plan_destroy(p);
    free(coded);
    free(src);
}

/* ---- FP8 (whole-byte symbols) ---- */

static const ddo_dtype fp8_types[] = { DDO_DTYPE_F8_E4M3, DDO_DTYPE_F8_E5M2, DDO_DTYPE_F8_E4M3FNUZ,
                                       DDO_DTYPE_F8_E5M2FNUZ };

/* The value of FP8 byte b (E4M3: bias 7, 3 mantissa bits; E5M2: bias 15, 2); NaN/inf codes
 * are never produced by fp8_of below (it searches only the finite positive codes). */
static double fp8_value(uint8_t b, bool e4m3)
{
    unsigned mb = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    unsigned ex = (b & 0x7F) >> mb, m = b & ((1u << mb) - 1);
    double v = ex == 0 ? ldexp((double)m / (1 << mb), 1 - (int)bias)
                       : ldexp(1.0 + (double)m / (1 << mb), (int)ex - (int)bias);
    return b & 0x80 ? -v : v;
}

/* x rounded to the nearest finite FP8 code (E4M3 up to 448 = 0x7E, E5M2 up to 57344 = 0x7B). */
static uint8_t fp8_of(double x, bool e4m3)
{
    uint8_t top = e4m3 ? 0x7E : 0x7B, best = 0;
    double a = fabs(x), err = a;
    for (unsigned c = 1; c <= top; c++) {
        double d = fabs(fp8_value((uint8_t)c, e4m3) - a);
        if (d < err) {
            err = d;
            best = (uint8_t)c;
        }
    }
    return (uint8_t)(best | (x < 0 && best != 0 ? 0x80 : 0));
}

/* n FP8 weights made as the measurement makes them: Gaussian, scaled so the largest magnitude
 * is the format's largest finite value (448 E4M3, 57344 E5M2), rounded to nearest. */
static uint8_t *make_fp8_normal(uint64_t n, bool e4m3)
{
    double *g = malloc(n * sizeof(double)), mx = 0;
    for (uint64_t i = 0; i < n; i++) {
        g[i] = gauss();
        mx = fabs(g[i]) > mx ? fabs(g[i]) : mx;
    }
    uint8_t lut[4096], *p = malloc(n + 1);
    double top = e4m3 ? 448.0 : 57344.0;
    for (int i = 0; i < 4096; i++) /* a fine quantisation of [0, top]: the nearest code each */
        lut[i] = fp8_of(top * ((double)i + 0.5) / 4096.0, e4m3);
    for (uint64_t i = 0; i < n; i++) {
        double x = g[i] / mx * top, a = fabs(x);
        /* small magnitudes exactly, the rest through the table (codes there are > 1/512 apart) */
        uint8_t c = a < top / 64 ? fp8_of(a, e4m3) : lut[(int)(a / top * 4095.999)];
        p[i] = (uint8_t)(c | (x < 0 && c != 0 ? 0x80 : 0));
    }
    free(g);
    return p;
}

/* Round trips of FP8 streams: normal-derived codes smaller with no raw block, random bytes
 * and all 256 values uniformly stay raw, one repeated byte codes to ~1 bit per element. */
/* The stream of coded (len) given to a reader in pieces of `piece` bytes (the last shorter);
 * its finish's result, *plan on success. */
static int read_in_pieces(const uint8_t *coded, uint64_t len, uint64_t piece,
                          ddo__codec_plan **plan)
{
    ddo__codec_reader *r = NULL;
    ddo__errbuf eb = { 0, "" };
    if (ddo__codec_reader_create(len, "t.weight", &r, &eb) != 0)
        return -1;
    T_EQ_U64(ddo__codec_reader_total(r), len);
    int rc = 0;
    for (uint64_t at = 0; at < len && rc == 0; at += piece)
        rc = ddo__codec_reader_feed(r, coded + at, len - at < piece ? len - at : piece, &eb);
    int frc = ddo__codec_reader_finish(r, plan, &eb);
    T_CHECK(rc == 0 || frc == rc); /* the first failure is kept */
    T_CHECK(frc != 0 || strstr(eb.msg, "t.weight") != NULL || eb.msg[0] == '\0');
    ddo__codec_reader_destroy(r);
    return frc;
}

/* A stream read in pieces of any size (a header or block across two or more of them) gives
 * the plan ddo__codec_plan_create gives for the whole stream; every metadata byte flipped is
 * refused by both alike; a stream cut short or fed too much is refused. */
static void test_reader_pieces(void)
{
    uint64_t len = 0, bytes = 0;
    uint8_t *src = NULL, *coded = three_blocks(&len, &src, &bytes);
    ddo__codec_plan *want = NULL;
    T_REQUIRE(ddo__codec_plan_create(coded, len, "t.weight", &want, NULL) == 0);
    static const uint64_t pieces[] = { 1, 7, 8, 48, 100, 3328, 65536, 65537, 1 << 20 };
    for (size_t k = 0; k < DDO_ARRAY_LEN(pieces); k++) {
        ddo__codec_plan *got = NULL;
        T_EQ_INT(read_in_pieces(coded, len, pieces[k], &got), 0);
        T_REQUIRE(got != NULL);
        T_EQ_U64(got->coded_bytes, want->coded_bytes);
        T_EQ_U64(got->decoded_bytes, want->decoded_bytes);
        T_EQ_U64(got->raw_blocks, want->raw_blocks);
        T_CHECK(got->dtype == want->dtype);
        T_CHECK(memcmp(&got->launch, &want->launch, sizeof(got->launch)) == 0);
        for (uint32_t b = 0; b < want->launch.n_blocks; b++) {
            const ddo__codec_block *x = &got->blocks[b], *y = &want->blocks[b];
            T_CHECK_MSG(x->coded_offset == y->coded_offset && x->coded_bytes == y->coded_bytes &&
                            x->elems == y->elems && x->checksum == y->checksum &&
                            x->mode == y->mode,
                        "piece %llu block %u", (unsigned long long)pieces[k], b);
        }
        ddo__codec_plan_destroy(got);
    }
    /* every byte of the header, directory and block headers, every 97th of the rest */
    int differ = 0, refused = 0;
    for (uint64_t i = 0; i < len; i++) {
        bool meta = i < want->blocks[0].coded_offset + 176 + 16 * 9 ||
                    (i >= want->blocks[1].coded_offset && i < want->blocks[1].coded_offset + 48) ||
                    (i >= want->blocks[2].coded_offset && i < want->blocks[2].coded_offset + 48);
        if (!meta && i % 97 != 0)
            continue;
        coded[i] ^= (uint8_t)(1u << (i % 8));
        ddo__codec_plan *a = NULL, *b = NULL;
        int ra = ddo__codec_plan_create(coded, len, "t.weight", &a, NULL);
        int rb = read_in_pieces(coded, len, 1000 + i % 3, &b);
        differ += (ra == 0) != (rb == 0);
        refused += rb != 0;
        ddo__codec_plan_destroy(a);
        ddo__codec_plan_destroy(b);
        coded[i] ^= (uint8_t)(1u << (i % 8));
    }
    T_EQ_INT(differ, 0);
    T_CHECK_MSG(refused > 100, "%d flips refused", refused);
    ddo__codec_plan *p = NULL;
    T_CHECK(read_in_pieces(coded, len - 16, 4096, &p) == DDO_E_FORMAT && p == NULL);
    ddo__codec_reader *r = NULL;
    T_REQUIRE(ddo__codec_reader_create(len - 16, "t.weight", &r, NULL) == 0);
    T_CHECK(ddo__codec_reader_feed(r, coded, len, NULL) == DDO_E_FORMAT); /* more than its bytes */
    T_CHECK(ddo__codec_reader_finish(r, &p, NULL) == DDO_E_FORMAT && p == NULL);
    ddo__codec_reader_destroy(r);
    ddo__codec_plan_destroy(want);
    free(coded);
    free(src);
}

static void test_fp8_round_trips(void)
{
    static const uint64_t counts[] = { 1, 5, 31, 33, 1000, GROUP - 1, GROUP + 17, 3 * GROUP + 5 };
    for (size_t t = 0; t < DDO_ARRAY_LEN(fp8_types); t++) {
        ddo_dtype dt = fp8_types[t];
        bool e4m3 = dt == DDO_DTYPE_F8_E4M3 || dt == DDO_DTYPE_F8_E4M3FNUZ;
        T_CHECK(ddo__codec_codes_dtype(dt) && ddo__codec_codes_bytes(dt));
        for (size_t k = 0; k < DDO_ARRAY_LEN(counts); k++) {
            uint8_t *w = make_fp8_normal(counts[k], e4m3), *r = make(dt, counts[k], true);
            round_trip(w, counts[k], dt, GROUP, 2, NULL);
            round_trip(r, counts[k], dt, GROUP, 2, NULL);
            free(w);
            free(r);
        }
        uint64_t n = 4 * GROUP;
        uint8_t *w = make_fp8_normal(n, e4m3), *cw = NULL;
        uint64_t lw = round_trip(w, n, dt, 2 * GROUP, 2, &cw);
        ddo__codec_plan *p = NULL;
        T_EQ_INT(ddo__codec_plan_create(cw, lw, "w", &p, NULL), 0);
        T_REQUIRE(p != NULL);
        T_EQ_U64(p->raw_blocks, 0);
        /* E4M3 scaled to 448: about 6.5 bits of entropy per byte (measured 0.81 of raw);
         * E5M2 to 57344: fewer distinct codes used, fewer bits. */
        T_CHECK_MSG((double)lw < 0.86 * (double)n, "%s normal ratio %.4f", ddo_dtype_name(dt),
                    (double)lw / (double)n);
        fprintf(stderr, "  %s normal-derived: coded / raw %.4f\n", ddo_dtype_name(dt),
                (double)lw / (double)n);
        ddo__codec_plan_destroy(p);
        free(cw);
        free(w);
    }
}

static void test_fp8_adversarial(void)
{
    uint64_t n = 2 * GROUP + 3;
    uint8_t *v = malloc(n), *c = NULL;
    for (size_t t = 0; t < DDO_ARRAY_LEN(fp8_types); t++) {
        ddo_dtype dt = fp8_types[t];
        static const uint8_t ones[] = { 0x00, 0x7F, 0x80, 0xFF, 0x38 };
        for (size_t k = 0; k < DDO_ARRAY_LEN(ones); k++) { /* one byte: one 1-bit code */
            memset(v, ones[k], n);
            uint64_t len = round_trip(v, n, dt, GROUP, 2, &c);
            T_CHECK_MSG(len < n / 6, "all 0x%02X: %llu bytes", ones[k], (unsigned long long)len);
            free(c);
        }
        for (uint64_t i = 0; i < n; i++) /* all 256 values, equally often: nothing to gain */
            v[i] = (uint8_t)(i * 167u + 3);
        uint64_t len = round_trip(v, n, dt, GROUP, 2, &c);
        ddo__codec_plan *p = NULL;
        T_EQ_INT(ddo__codec_plan_create(c, len, "u", &p, NULL), 0);
        T_REQUIRE(p != NULL);
        T_EQ_U64(p->raw_blocks, p->launch.n_blocks);
        T_CHECK(len <= ddo__codec_bound(dt, n, GROUP));
        ddo__codec_plan_destroy(p);
        free(c);
        for (uint64_t i = 0; i < n; i++) /* all 256 values, skewed: some codes at 12 bits */
            v[i] = (uint8_t)(rnd() % 3 ? i % 2 : (i % 64 == 0 ? rnd() : rnd() % 16));
        round_trip(v, n, dt, GROUP, 3, NULL);
        /* Byte k with probability 2^-(k+1) (the trailing zeros of i + 1): a Huffman code 17 bits
         * deep, cut to 12; about 2 bits per element, as the unlimited code */
        for (uint64_t i = 0; i < n; i++) {
            uint8_t tz = 0;
            for (uint64_t x = i + 1; (x & 1) == 0; x >>= 1)
                tz++;
            v[i] = (uint8_t)(tz * 37u);
        }
        len = round_trip(v, n, dt, GROUP, 2, &c);
        T_CHECK_MSG(len < n / 4 + n / 50, "geometric: %llu bytes", (unsigned long long)len);
        free(c);
    }
    /* Other one-byte dtypes stay raw, however compressible. */
    memset(v, 0, n);
    const ddo_dtype raw1[] = { DDO_DTYPE_U8, DDO_DTYPE_I8, DDO_DTYPE_BOOL, DDO_DTYPE_F8_E8M0 };
    for (size_t t = 0; t < DDO_ARRAY_LEN(raw1); t++) {
        T_CHECK(!ddo__codec_codes_dtype(raw1[t]));
        uint64_t len = round_trip(v, n, raw1[t], GROUP, 2, NULL);
        T_CHECK(len >= n);
    }
    free(v);
}

/* An F8 stream's Huffman block under another one-byte dtype is refused; corruption of an FP8
 * stream is detected without a write outside the output. */
static void test_fp8_forged_and_corrupted(void)
{
    uint64_t n = GROUP + 500;
    uint8_t *src = make_fp8_normal(n, true), *c = NULL;
    uint64_t len = round_trip(src, n, DDO_DTYPE_F8_E4M3, GROUP, 2, &c);
    ddo__errbuf eb = { 0, "" };
    uint8_t *out = malloc(n + 2 * GUARD);
    int missed = 0, failed_guard = 0;
    for (uint64_t i = 0; i < len; i += (i < 512 ? 1 : 37)) {
        c[i] ^= (uint8_t)(1u << (i % 8));
        memset(out, 0x5A, n + 2 * GUARD);
        missed += ddo__codec_decode(c, len, out + GUARD, n, "f8", &eb) != DDO_E_FORMAT;
        for (uint64_t g = 0; g < GUARD; g++)
            failed_guard += out[g] != 0x5A || out[GUARD + n + g] != 0x5A;
        c[i] ^= (uint8_t)(1u << (i % 8));
    }
    T_EQ_INT(missed, 0);
    T_EQ_INT(failed_guard, 0);
    T_EQ_INT(ddo__codec_decode(c, len, out + GUARD, n, "f8", &eb), 0);
    /* The same stream claimed as U8, its meta hash made consistent (2 blocks: a directory of
     * 16 bytes): the Huffman block of a dtype stored raw is refused. */
    c[6] = (uint8_t)DDO_DTYPE_U8;
    uint64_t h =
        ddo__codec_checksum(c, 56, 0) + ddo__codec_checksum(c + DDO_CODEC_STREAM_HEADER, 16, 16);
    for (int i = 0; i < 8; i++)
        c[56 + i] = (uint8_t)(h >> (8 * i));
    T_EQ_INT(ddo__codec_decode(c, len, out + GUARD, n, "f8", &eb), DDO_E_FORMAT);
    T_CONTAINS(eb.msg, "block 0: header invalid");
    free(out);
    free(c);
    free(src);
}

static void test_cpu_device_op(void)
{
    uint64_t len = 0, bytes = 0;
    uint8_t *src = NULL, *coded = three_blocks(&len, &src, &bytes);
    ddo__codec_plan *p = NULL;
    T_EQ_INT(ddo__codec_plan_create(coded, len, "t.weight", &p, NULL), 0);
    T_REQUIRE(p != NULL);
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    ddo_device *dev = NULL;
    T_REQUIRE(ddo_device_create("cpu", &o, &dev) == 0);
    void *s = NULL;
    uint64_t dsrc = 0, ddst = 0, dst_st = 0;
    T_EQ_INT(ddo__dev_stream_create(dev, 1, &s), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, len, &dsrc), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, bytes, &ddst), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, p->launch.status_bytes, &dst_st), 0);
    ddo__codec_desc l = { dsrc, len, ddst, bytes, p->launch };
    l.l.status_dev = dst_st;
    uint8_t *got = malloc(bytes);
    uint64_t st[6];
    for (int corrupt = 0; corrupt < 2; corrupt++) {
        if (corrupt)
            coded[p->blocks[2].coded_offset + 300] ^= 4;
        T_EQ_INT(ddo__dev_copy_h2d(dev, dsrc, coded, len, s), 0);
        T_EQ_INT(ddo__dev_codec_decode(dev, s, &l, 1), 0);
        T_EQ_INT(ddo__dev_stream_synchronize(dev, s), 0);
        T_EQ_INT(ddo__dev_copy_d2h(dev, got, ddst, bytes), 0);
        T_EQ_INT(ddo__dev_copy_d2h(dev, st, dst_st, sizeof(st)), 0);
        ddo__errbuf eb = { 0, "" };
        T_EQ_INT(ddo__codec_status_check(p, st, &eb), corrupt ? DDO_E_FORMAT : 0);
        if (!corrupt)
            T_CHECK(memcmp(got, src, bytes) == 0);
        else
            T_CONTAINS(eb.msg, "block 2 of 3");
    }
    /* A destination smaller than the decoded stream is refused before anything is queued. */
    ddo__codec_desc bad = l;
    bad.dst_bytes = bytes - 2;
    T_EQ_INT(ddo__dev_codec_decode(dev, s, &bad, 1), DDO_E_INVALID_ARGUMENT);
    bad = l;
    bad.l.status_dev = 0;
    T_EQ_INT(ddo__dev_codec_decode(dev, s, &bad, 1), DDO_E_INVALID_ARGUMENT);
    bad = l;
    bad.l.status_dev = (uint64_t)(uintptr_t)st; /* host memory, not device memory */
    T_EQ_INT(ddo__dev_codec_decode(dev, s, &bad, 1), DDO_E_INVALID_ARGUMENT);
    ddo__devop_stats stats[DDO__OP_COUNT];
    ddo__device_stats(dev, stats);
    T_EQ_U64(stats[DDO__OP_CODEC_DECODE].calls, 5);
    T_EQ_U64(stats[DDO__OP_CODEC_DECODE].bytes, 2 * bytes);
    T_EQ_STR(ddo__devop_name(DDO__OP_CODEC_DECODE), "codec_decode");
    T_EQ_INT(ddo__dev_stream_destroy(dev, s), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, dsrc), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, ddst), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, dst_st), 0);
    ddo_device_destroy(dev);
    free(got);
    ddo__codec_plan_destroy(p);
    free(coded);
    free(src);
}

/* Batches the wrapper refuses before anything is queued: too many tensors, an output over
 * another's or over a source, mixed warps per thread block. d: a valid batch of 3, src_off2
 * tensor 2's source offset from tensor 0's. */
static void refused_batches(ddo_device *dev, void *s, const ddo__codec_desc *d, uint64_t src_off2)
{
    ddo__codec_desc bad[3];
    memcpy(bad, d, sizeof(bad));
    bad[2].dst = bad[1].dst + 16; /* overlaps tensor 1's output */
    T_EQ_INT(ddo__dev_codec_decode(dev, s, bad, 3), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "overlaps tensor 1's destination");
    memcpy(bad, d, sizeof(bad));
    bad[0].dst = d[0].src + src_off2; /* over tensor 2's coded bytes */
    T_EQ_INT(ddo__dev_codec_decode(dev, s, bad, 3), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "source");
    memcpy(bad, d, sizeof(bad));
    bad[1].l.cta_warps = 4;
    T_EQ_INT(ddo__dev_codec_decode(dev, s, bad, 3), DDO_E_INVALID_ARGUMENT);
    ddo__codec_desc many[DDO_CODEC_BATCH_MAX + 1];
    for (size_t i = 0; i < DDO_ARRAY_LEN(many); i++)
        many[i] = d[0];
    T_EQ_INT(ddo__dev_codec_decode(dev, s, many, DDO_ARRAY_LEN(many)), DDO_E_INVALID_ARGUMENT);
}

/* n Gaussian BF16 elements coded in blocks of one group (*src, *coded, *len), and the plan of
 * the stream, named "t<i>.weight". */
static ddo__codec_plan *encode_bf16(uint64_t n, int i, uint8_t **src, uint8_t **coded,
                                    uint64_t *len)
{
    *src = make(DDO_DTYPE_BF16, n, false);
    uint64_t bound = ddo__codec_bound(DDO_DTYPE_BF16, 2 * n, GROUP);
    *coded = malloc(bound);
    ddo__codec_params cp = { GROUP, 1 };
    T_EQ_INT(ddo__codec_encode(*src, 2 * n, DDO_DTYPE_BF16, &cp, *coded, bound, len, "t", NULL), 0);
    char name[16];
    snprintf(name, sizeof(name), "t%d.weight", i);
    ddo__codec_plan *p = NULL;
    T_EQ_INT(ddo__codec_plan_create(*coded, *len, name, &p, NULL), 0);
    return p;
}

/* Three coded tensors in one device buffer, decoded by one batch into one output buffer:
 * each tensor where it belongs, one status area per tensor, in one queued operation; the
 * middle tensor corrupted is reported by its own status alone; batches the wrapper refuses
 * (too many tensors, overlapping outputs, an output over a source, mixed warps) queue
 * nothing. */
static void test_cpu_device_batch(void)
{
    enum { N = 3 };
    const uint64_t elems[N] = { 3 * GROUP + 77, GROUP, 2 * GROUP + 5 };
    uint8_t *src[N], *coded[N];
    uint64_t len[N], off[N], out_off[N], st_off[N], in_total = 0, out_total = 0, st_total = 0;
    ddo__codec_plan *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = encode_bf16(elems[i], i, &src[i], &coded[i], &len[i]);
        T_REQUIRE(p[i] != NULL);
        off[i] = in_total;
        in_total += (len[i] + 255) / 256 * 256;
        out_off[i] = out_total;
        out_total += (2 * elems[i] + 255) / 256 * 256;
        st_off[i] = st_total;
        st_total += p[i]->launch.status_bytes;
    }
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    ddo_device *dev = NULL;
    T_REQUIRE(ddo_device_create("cpu", &o, &dev) == 0);
    void *s = NULL;
    uint64_t din = 0, dout = 0, dst_st = 0;
    T_EQ_INT(ddo__dev_stream_create(dev, 1, &s), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, in_total, &din), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, out_total, &dout), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, st_total, &dst_st), 0);
    ddo__codec_desc d[N];
    for (int i = 0; i < N; i++) {
        d[i] = (ddo__codec_desc){ din + off[i], len[i], dout + out_off[i], 2 * elems[i],
                                  p[i]->launch };
        d[i].l.status_dev = dst_st + st_off[i];
    }
    uint64_t *st = malloc(st_total);
    uint8_t *got = malloc(out_total);
    for (int corrupt = 0; corrupt < 2; corrupt++) {
        if (corrupt)
            coded[1][p[1]->blocks[0].coded_offset + 400] ^= 8;
        for (int i = 0; i < N; i++)
            T_EQ_INT(ddo__dev_copy_h2d(dev, din + off[i], coded[i], len[i], s), 0);
        memset((void *)(uintptr_t)dout, 0x5A, out_total);
        ddo__devop_stats before[DDO__OP_COUNT], after[DDO__OP_COUNT];
        ddo__device_stats(dev, before);
        T_EQ_INT(ddo__dev_codec_decode(dev, s, d, N), 0);
        ddo__device_stats(dev, after);
        T_EQ_U64(after[DDO__OP_CODEC_DECODE].calls - before[DDO__OP_CODEC_DECODE].calls, 1);
        T_EQ_INT(ddo__dev_stream_synchronize(dev, s), 0);
        T_EQ_INT(ddo__dev_copy_d2h(dev, got, dout, out_total), 0);
        T_EQ_INT(ddo__dev_copy_d2h(dev, st, dst_st, st_total), 0);
        for (int i = 0; i < N; i++) {
            ddo__errbuf eb = { 0, "" };
            int want = corrupt && i == 1 ? DDO_E_FORMAT : 0;
            T_EQ_INT(ddo__codec_status_check(p[i], st + st_off[i] / 8, &eb), want);
            if (want != 0)
                T_CONTAINS(eb.msg, "t1.weight");
            if (want == 0)
                T_CHECK_MSG(memcmp(got + out_off[i], src[i], 2 * elems[i]) == 0, "tensor %d", i);
            /* the padding between outputs is never written */
            for (uint64_t k = out_off[i] + 2 * elems[i];
                 k < (i + 1 < N ? out_off[i + 1] : out_total); k++)
                T_CHECK(got[k] == 0x5A);
        }
    }
    refused_batches(dev, s, d, off[2]);
    T_EQ_INT(ddo__dev_codec_decode(dev, s, d, 0), 0); /* nothing to do */
    T_EQ_INT(ddo__dev_stream_destroy(dev, s), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, din), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, dout), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, dst_st), 0);
    ddo_device_destroy(dev);
    free(st);
    free(got);
    for (int i = 0; i < N; i++) {
        ddo__codec_plan_destroy(p[i]);
        free(coded[i]);
        free(src[i]);
    }
}

/* The asynchronous device->host copy: ordered on its stream, into pinned memory only. */
static void test_cpu_d2h_async(void)
{
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    ddo_device *dev = NULL;
    T_REQUIRE(ddo_device_create("cpu", &o, &dev) == 0);
    void *s = NULL, *ev = NULL, *pinned = NULL;
    uint64_t buf = 0;
    T_EQ_INT(ddo__dev_stream_create(dev, 1, &s), 0);
    T_EQ_INT(ddo__dev_event_create(dev, &ev), 0);
    T_EQ_INT(ddo__dev_mem_alloc(dev, 4096, &buf), 0);
    T_EQ_INT(ddo__dev_host_alloc(dev, 4096, &pinned), 0);
    uint8_t pattern[4096], pageable[64];
    memset(pattern, 0x3C, sizeof(pattern));
    memset(pinned, 0, 4096);
    /* slow h2d first: the d2h behind it on the same stream reads what it wrote */
    T_EQ_INT(ddo__device_cpu_throttle(dev, 20e6, 0), 0);
    T_EQ_INT(ddo__dev_copy_h2d(dev, buf, pattern, sizeof(pattern), s), 0);
    T_EQ_INT(ddo__dev_copy_d2h_async(dev, (uint8_t *)pinned + 100, buf + 8, 3000, s), 0);
    T_EQ_INT(ddo__dev_event_record(dev, ev, s), 0);
    T_EQ_INT(ddo__dev_event_synchronize(dev, ev), 0);
    T_EQ_INT(ddo__device_cpu_throttle(dev, 0, 0), 0);
    const uint8_t *h = pinned;
    T_CHECK(h[99] == 0 && h[100] == 0x3C && h[3099] == 0x3C && h[3100] == 0);
    /* pageable host memory, a range past the pinned block, memory that is not the device's */
    T_EQ_INT(ddo__dev_copy_d2h_async(dev, pageable, buf, sizeof(pageable), s),
             DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "not pinned");
    T_EQ_INT(ddo__dev_copy_d2h_async(dev, (uint8_t *)pinned + 4000, buf, 200, s),
             DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_copy_d2h_async(dev, pinned, (uintptr_t)pattern, 64, s),
             DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_copy_d2h_async(dev, pinned, buf, 64, NULL), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__dev_copy_d2h_async(dev, pinned, buf, 0, s), 0);
    ddo__devop_stats stats[DDO__OP_COUNT];
    ddo__device_stats(dev, stats);
    T_EQ_U64(stats[DDO__OP_COPY_D2H_ASYNC].calls, 6);
    T_EQ_U64(stats[DDO__OP_COPY_D2H_ASYNC].bytes, 3000);
    T_EQ_STR(ddo__devop_name(DDO__OP_COPY_D2H_ASYNC), "copy_d2h_async");
    T_EQ_INT(ddo__dev_stream_synchronize(dev, s), 0);
    T_EQ_INT(ddo__dev_event_destroy(dev, ev), 0);
    T_EQ_INT(ddo__dev_stream_destroy(dev, s), 0);
    T_EQ_INT(ddo__dev_mem_free(dev, buf), 0);
    T_EQ_INT(ddo__dev_host_free(dev, pinned), 0);
    ddo_device_destroy(dev);
}

int main(void)
{
    T_RUN(test_every_dtype);
    T_RUN(test_all_16bit_patterns);
    T_RUN(test_f32_edges);
    T_RUN(test_threads_same_bytes);
    T_RUN(test_ratio_and_raw_fallback);
    T_RUN(test_arguments);
    T_RUN(test_corruption_detected);
    T_RUN(test_reader_pieces);
    T_RUN(test_fp8_round_trips);
    T_RUN(test_fp8_adversarial);
    T_RUN(test_fp8_forged_and_corrupted);
    T_RUN(test_cpu_device_op);
    T_RUN(test_cpu_device_batch);
    T_RUN(test_cpu_d2h_async);
    return t_done();
}
