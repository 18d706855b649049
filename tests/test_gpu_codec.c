/*
 * test_gpu_codec.c - the codec's device decoder on a real GPU: decodes on the
 * cuda device bit-identical to the C reference (every coded dtype, partial
 * groups and blocks, raw blocks, all 65,536 BF16 patterns; FP8 whole-byte
 * streams and their decode rate), nothing written
 * outside the destination, corrupt input (payload, lane table, header)
 * detected through the status words, batches (several tensors of every dtype
 * in one launch, each written only into its own range, a corrupted middle
 * tensor reported alone), and the decoder's throughput printed (GB/s of
 * decoded BF16 output; Gaussian weights like `ddo synth --values normal`, or
 * the BF16 tensors of the checkpoint named by DDO_CODEC_BENCH_CHECKPOINT): one
 * stream of 64 MiB..DDO_CODEC_BENCH_MIB, and the 32 tensors of a Flux.1
 * double block decoded one launch per tensor, in the session's batches and
 * in one launch.
 *
 * Skips (77) when ddo_device_create("cuda:0") fails with DDO_E_NO_DEVICE.
 *
 * Also a measuring tool that needs no GPU:
 *   test_gpu_codec --ratio CHECKPOINT [--verify]
 * codes every tensor of a checkpoint (one stream per tensor, default blocks, all cores) and
 * prints the coded ratio per dtype and in total (--verify decodes each and compares).
 *
 * ctest-labels: gpu
 */
#include "codec/codec.h"
#include "ddo.h"
#include "device/device.h"
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GROUP DDO_CODEC_GROUP_ELEMS
#define GUARD ((uint64_t)4096)
#define MIB   ((uint64_t)1 << 20)

static ddo_device *g_dev;
static void *g_stream;
static uint64_t g_rng = 7;

static uint64_t rnd(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static unsigned cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

/* Gaussian BF16 (std sd), as `ddo synth --values normal` makes them. */
static void normal_bf16(uint16_t *v, uint64_t n, double sd)
{
    for (uint64_t i = 0; i + 1 < n + 1; i += 2) {
        uint64_t r = rnd();
        float u1 = ((float)(r >> 40) + 0.5f) / 16777216.0f,
              u2 = (float)(r & 0xFFFFFF) / 16777216.0f;
        float m = (float)sd * sqrtf(-2.0f * logf(u1)), a = 6.2831853f * u2;
        float f[2] = { m * cosf(a), m * sinf(a) };
        for (int k = 0; k < 2 && i + (uint64_t)k < n; k++) {
            uint32_t u;
            memcpy(&u, &f[k], 4);
            v[i + (uint64_t)k] = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        }
    }
}

static uint8_t *encode(const void *src, uint64_t bytes, ddo_dtype dt, uint32_t block, uint64_t *len)
{
    uint64_t bound = ddo__codec_bound(dt, bytes, block);
    uint8_t *c = malloc(bound);
    ddo__codec_params p = { block, cores() };
    ddo__errbuf eb = { 0, "" };
    if (c == NULL || ddo__codec_encode(src, bytes, dt, &p, c, bound, len, "gpu.weight", &eb) != 0) {
        fprintf(stderr, "  encode: %s\n", eb.msg);
        free(c);
        return NULL;
    }
    return c;
}

/* A coded stream on the device with its decode target (guarded) and status area. */
typedef struct dstream {
    ddo__codec_plan *plan;
    uint64_t src, dst, status, dst_bytes;
    ddo__codec_desc d; /* a batch of one */
} dstream;

static int dstream_open(dstream *d, const uint8_t *coded, uint64_t len)
{
    memset(d, 0, sizeof(*d));
    ddo__errbuf eb = { 0, "" };
    if (ddo__codec_plan_create(coded, len, "gpu.weight", &d->plan, &eb) != 0) {
        fprintf(stderr, "  plan: %s\n", eb.msg);
        return -1;
    }
    d->dst_bytes = d->plan->decoded_bytes;
    int rc = ddo__dev_mem_alloc(g_dev, len, &d->src);
    if (rc == 0)
        rc = ddo__dev_mem_alloc(g_dev, d->dst_bytes + GUARD, &d->dst);
    if (rc == 0)
        rc = ddo__dev_mem_alloc(g_dev, d->plan->launch.status_bytes + 16, &d->status);
    if (rc == 0)
        rc = ddo__dev_copy_h2d(g_dev, d->src, coded, len, g_stream);
    d->d = (ddo__codec_desc){ d->src, len, d->dst, d->dst_bytes, d->plan->launch };
    d->d.l.status_dev = d->status;
    return rc;
}

static void dstream_close(dstream *d)
{
    ddo__dev_mem_free(g_dev, d->src);
    ddo__dev_mem_free(g_dev, d->dst);
    ddo__dev_mem_free(g_dev, d->status);
    ddo__codec_plan_destroy(d->plan);
}

/* Poisons dst and its guard, decodes, and returns the status check (0 or DDO_E_FORMAT). */
static int dstream_decode(dstream *d, uint8_t *out, ddo__errbuf *eb)
{
    uint64_t n = d->dst_bytes + GUARD;
    uint8_t *poison = malloc(n);
    memset(poison, 0xA5, n);
    int rc = ddo__dev_copy_h2d(g_dev, d->dst, poison, n, g_stream);
    if (rc == 0)
        rc = ddo__dev_codec_decode(g_dev, g_stream, &d->d, 1);
    if (rc == 0)
        rc = ddo__dev_stream_synchronize(g_dev, g_stream);
    uint8_t *got = malloc(n);
    uint64_t *st = malloc(d->d.l.status_bytes + 16);
    if (rc == 0)
        rc = ddo__dev_copy_d2h(g_dev, got, d->dst, n);
    if (rc == 0)
        rc = ddo__dev_copy_d2h(g_dev, st, d->status, d->d.l.status_bytes);
    T_CHECK_MSG(rc == 0, "decode on cuda: %s", ddo_last_error());
    if (rc == 0) {
        T_CHECK_MSG(memcmp(got + d->dst_bytes, poison, GUARD) == 0, "guard overwritten");
        memcpy(out, got, d->dst_bytes);
        rc = ddo__codec_status_check(d->plan, st, eb);
    }
    free(st);
    free(got);
    free(poison);
    return rc;
}

/* Decodes src (coded) on the device and with the C reference: both must give src back. */
static void check_same(const void *src, uint64_t bytes, ddo_dtype dt, uint32_t block)
{
    uint64_t len = 0;
    uint8_t *coded = encode(src, bytes, dt, block, &len);
    T_REQUIRE(coded != NULL);
    uint8_t *ref = malloc(bytes + 1), *dev = malloc(bytes + 1);
    ddo__errbuf eb = { 0, "" };
    T_EQ_INT(ddo__codec_decode(coded, len, ref, bytes, "gpu.weight", &eb), 0);
    dstream d;
    T_REQUIRE(dstream_open(&d, coded, len) == 0);
    int rc = dstream_decode(&d, dev, &eb);
    T_CHECK_MSG(rc == 0, "%s %llu bytes: %s", ddo_dtype_name(dt), (unsigned long long)bytes,
                eb.msg);
    T_CHECK(memcmp(ref, src, bytes) == 0);
    T_CHECK_MSG(memcmp(dev, src, bytes) == 0, "%s %llu bytes: device output differs",
                ddo_dtype_name(dt), (unsigned long long)bytes);
    dstream_close(&d);
    free(ref);
    free(dev);
    free(coded);
}

static void test_bit_identical(void)
{
    static const uint64_t counts[] = { 1, 31, 1000, GROUP + 1, 9 * GROUP + 4097 };
    const ddo_dtype types[] = { DDO_DTYPE_BF16, DDO_DTYPE_F16, DDO_DTYPE_F32, DDO_DTYPE_U8 };
    for (size_t t = 0; t < DDO_ARRAY_LEN(types); t++)
        for (size_t k = 0; k < DDO_ARRAY_LEN(counts); k++) {
            uint64_t n = counts[k], es = ddo_dtype_size(types[t]);
            uint8_t *v = malloc(n * 4 + 8);
            normal_bf16((uint16_t *)v, n * es / 2 + 1, 0.02); /* shaped for 16-bit, bytes else */
            if (types[t] == DDO_DTYPE_F32)
                for (uint64_t i = 0; i < n; i++) {
                    float f = (float)((double)(int64_t)(rnd() >> 40) * 1e-9);
                    memcpy(v + 4 * i, &f, 4);
                }
            check_same(v, n * es, types[t], 2 * GROUP);
            free(v);
        }
}

static void test_patterns_and_raw(void)
{
    uint16_t *v = malloc(4 * 65536 * 2);
    for (uint32_t i = 0; i < 65536; i++) {
        v[i] = (uint16_t)i;
        v[65536 + i] = (uint16_t)(i * 40503u + 7);
    }
    for (uint32_t i = 2 * 65536; i < 4 * 65536; i++)
        v[i] = (uint16_t)rnd(); /* random bits: stored raw */
    check_same(v, 4 * 65536 * 2, DDO_DTYPE_BF16, GROUP);
    check_same(v, 4 * 65536 * 2, DDO_DTYPE_F16, 4 * GROUP);
    free(v);
}

static void test_corrupt_detected(void)
{
    uint64_t n = 3 * GROUP + 500, len = 0;
    uint16_t *v = malloc(n * 2);
    normal_bf16(v, n, 0.02);
    for (uint64_t i = GROUP; i < 2 * GROUP; i++)
        v[i] = (uint16_t)rnd(); /* block 1 raw */
    uint8_t *coded = encode(v, n * 2, DDO_DTYPE_BF16, GROUP, &len);
    T_REQUIRE(coded != NULL);
    dstream d;
    T_REQUIRE(dstream_open(&d, coded, len) == 0);
    /* block 1 (random bits) and block 3 (500 elements: tables cost more than they save) raw */
    T_EQ_INT(d.plan->blocks[1].mode, DDO_CODEC_MODE_RAW);
    T_EQ_INT(d.plan->blocks[0].mode, DDO_CODEC_MODE_HUFF);
    uint8_t *out = malloc(n * 2);
    ddo__errbuf eb = { 0, "" };
    T_EQ_INT(dstream_decode(&d, out, &eb), 0);
    /* one byte in: block 0's payload, its lane table, block 1's raw bytes, block 2's header,
     * block 3's exponent stream */
    const uint64_t at[] = { d.plan->blocks[0].coded_offset + 5000,
                            d.plan->blocks[0].coded_offset + 200,
                            d.plan->blocks[1].coded_offset + 777,
                            d.plan->blocks[2].coded_offset + 8,
                            d.plan->blocks[3].coded_offset + d.plan->blocks[3].coded_bytes - 40 };
    const unsigned which[] = { 0, 0, 1, 2, 3 };
    for (size_t k = 0; k < DDO_ARRAY_LEN(at); k++) {
        coded[at[k]] ^= 0x21;
        T_EQ_INT(ddo__dev_copy_h2d(g_dev, d.src, coded, len, g_stream), 0);
        T_EQ_INT(dstream_decode(&d, out, &eb), DDO_E_FORMAT);
        char want[64];
        snprintf(want, sizeof(want), "block %u of 4", which[k]);
        T_CONTAINS(eb.msg, want);
        coded[at[k]] ^= 0x21;
    }
    T_EQ_INT(ddo__dev_copy_h2d(g_dev, d.src, coded, len, g_stream), 0);
    T_EQ_INT(dstream_decode(&d, out, &eb), 0);
    T_CHECK(memcmp(out, v, n * 2) == 0);
    /* A destination one element short is refused before anything runs. */
    ddo__codec_desc short_dst = d.d;
    short_dst.dst_bytes = n * 2 - 2;
    T_EQ_INT(ddo__dev_codec_decode(g_dev, g_stream, &short_dst, 1), DDO_E_INVALID_ARGUMENT);
    dstream_close(&d);
    free(out);
    free(coded);
    free(v);
}

/* BF16 values for the benchmark: the checkpoint's BF16 tensors, else Gaussian ones. */
static uint16_t *bench_values(uint64_t n, const char **what)
{
    uint16_t *v = malloc(n * 2);
    const char *path = getenv("DDO_CODEC_BENCH_CHECKPOINT");
    ddo_checkpoint *ck = NULL;
    *what = "in-process Gaussian BF16 (std 1/sqrt(3072), as ddo synth --values normal)";
    if (v != NULL && path != NULL && path[0] != '\0' &&
        ddo_checkpoint_create(path, DDO_READ_DEFAULT, &ck) == 0) {
        uint64_t got = 0;
        for (size_t i = 0; i < ddo_checkpoint_tensor_count(ck) && got < n; i++) {
            const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, i);
            uint64_t take = t->nbytes / 2 < n - got ? t->nbytes / 2 : n - got;
            if (t->dtype == DDO_DTYPE_BF16 && ddo_checkpoint_read(ck, i, 0, v + got, take * 2) == 0)
                got += take;
        }
        ddo_checkpoint_destroy(ck);
        if (got == n) {
            *what = path;
            return v;
        }
    }
    if (v != NULL)
        normal_bf16(v, n, 1.0 / sqrt(3072.0));
    return v;
}

/* Times the decode of one stream: the median and best of 7 rounds of 10 launches. */
static void time_decode(dstream *d, uint32_t warps, double *med, double *best)
{
    double r[7];
    d->d.l.cta_warps = warps;
    d->d.l.ctas_per_block = (d->d.l.block_elems / GROUP + warps - 1) / warps;
    /* the status check counts the thread blocks of the launch the plan records */
    d->plan->launch.cta_warps = d->d.l.cta_warps;
    d->plan->launch.ctas_per_block = d->d.l.ctas_per_block;
    for (int k = 0; k < 3; k++)
        ddo__dev_codec_decode(g_dev, g_stream, &d->d, 1);
    ddo__dev_stream_synchronize(g_dev, g_stream);
    for (int round = 0; round < 7; round++) {
        uint64_t t0 = ddo__now_ns();
        for (int k = 0; k < 10; k++)
            ddo__dev_codec_decode(g_dev, g_stream, &d->d, 1);
        ddo__dev_stream_synchronize(g_dev, g_stream);
        r[round] = 10.0 * (double)d->dst_bytes / (double)(ddo__now_ns() - t0);
    }
    for (int i = 0; i < 7; i++)
        for (int j = i + 1; j < 7; j++)
            if (r[j] < r[i]) {
                double x = r[i];
                r[i] = r[j];
                r[j] = x;
            }
    *med = r[3];
    *best = r[6];
}

static void test_throughput(void)
{
    const char *env = getenv("DDO_CODEC_BENCH_MIB");
    uint64_t max_mib = env ? strtoull(env, NULL, 10) : 256;
    if (max_mib == 0)
        T_SKIP("DDO_CODEC_BENCH_MIB=0");
    if (max_mib < 64)
        max_mib = 64;
    const char *what = "";
    uint16_t *v = bench_values(max_mib * MIB / 2, &what);
    T_REQUIRE(v != NULL);
    printf("codec decode throughput, BF16 from %s\n", what);
    printf("%10s %8s %6s %10s %10s %10s\n", "MiB", "ratio", "warps", "GB/s med", "GB/s best",
           "check");
    for (uint64_t mib = 64; mib <= max_mib; mib *= 4) {
        uint64_t len = 0;
        uint8_t *coded = encode(v, mib * MIB, DDO_DTYPE_BF16, 0, &len);
        T_REQUIRE(coded != NULL);
        dstream d;
        T_REQUIRE(dstream_open(&d, coded, len) == 0);
        uint8_t *out = malloc(mib * MIB);
        ddo__errbuf eb = { 0, "" };
        int rc = dstream_decode(&d, out, &eb);
        bool same = rc == 0 && memcmp(out, v, mib * MIB) == 0;
        T_CHECK_MSG(same, "%llu MiB: %s", (unsigned long long)mib, eb.msg);
        const uint32_t warps[] = { 4, 8, 16 };
        for (size_t w = 0; w < DDO_ARRAY_LEN(warps); w++) {
            double med = 0, best = 0;
            time_decode(&d, warps[w], &med, &best);
            memset(out, 0, mib * MIB);
            bool ok = dstream_decode(&d, out, &eb) == 0 && memcmp(out, v, mib * MIB) == 0;
            T_CHECK_MSG(ok, "%llu MiB, %u warps: %s", (unsigned long long)mib, warps[w], eb.msg);
            printf("%10llu %8.4f %6u %10.1f %10.1f %10s\n", (unsigned long long)mib,
                   (double)len / (double)(mib * MIB), warps[w], med, best,
                   ok ? "identical" : "DIFFERS");
        }
        fflush(stdout);
        free(out);
        dstream_close(&d);
        free(coded);
    }
    free(v);
}

/* FP8 bytes (E4M3 when e4m3, else E5M2): Gaussian values scaled so that the largest
 * magnitude Box-Muller gives here (5.8 standard deviations) is the format's largest finite
 * value, rounded to the nearest code (ties away from zero). */
static void normal_fp8(uint8_t *v, uint64_t n, bool e4m3)
{
    int mb = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    double top = e4m3 ? 448.0 : 57344.0, sub = ldexp(1.0, 1 - bias);
    unsigned maxc = e4m3 ? 0x7Eu : 0x7Bu;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t r = rnd();
        double u1 = ((double)(r >> 40) + 0.5) / 16777216.0,
               u2 = (double)(r & 0xFFFFFF) / 16777216.0;
        double x = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2) * top / 5.8, a = fabs(x);
        unsigned c;
        if (a < sub) {
            c = (unsigned)(a / sub * (1 << mb) + 0.5);
        } else {
            int e = 0;
            double m = frexp(a, &e) * 2.0;
            c = (unsigned)(e - 1 + bias) * (1u << mb) + (unsigned)((m - 1.0) * (1 << mb) + 0.5);
        }
        c = c > maxc ? maxc : c;
        v[i] = (uint8_t)(c | (x < 0 && c != 0 ? 0x80u : 0u));
    }
}

/* FP8 streams (whole-byte Huffman blocks, element size 1): normal-derived E4M3 and E5M2 and
 * their FNUZ variants at partial groups and blocks, one repeated byte (1-bit codes), codes cut
 * to 12 bits, all 256 values (raw blocks), decoded on the device bit-identical to the source;
 * corruption detected; and the decode rate of 256 MiB of E4M3 printed. */
static void test_fp8(void)
{
    static const uint64_t counts[] = { 1, 3, 31, 1000, GROUP + 1, 9 * GROUP + 4097 };
    const ddo_dtype types[] = { DDO_DTYPE_F8_E4M3, DDO_DTYPE_F8_E5M2, DDO_DTYPE_F8_E4M3FNUZ,
                                DDO_DTYPE_F8_E5M2FNUZ };
    uint64_t big = 9 * GROUP + 4097;
    uint8_t *v = malloc(big);
    for (size_t t = 0; t < DDO_ARRAY_LEN(types); t++)
        for (size_t k = 0; k < DDO_ARRAY_LEN(counts); k++) {
            normal_fp8(v, counts[k], t % 2 == 0);
            check_same(v, counts[k], types[t], 2 * GROUP);
        }
    memset(v, 0x38, big);
    check_same(v, big, DDO_DTYPE_F8_E4M3, 2 * GROUP);
    for (uint64_t i = 0; i < big; i++) {
        uint8_t tz = 0; /* byte k with probability 2^-(k+1): codes 18 deep, cut to 12 */
        for (uint64_t x = i + 1; (x & 1) == 0; x >>= 1)
            tz++;
        v[i] = (uint8_t)(tz * 37u);
    }
    check_same(v, big, DDO_DTYPE_F8_E5M2, 2 * GROUP);
    for (uint64_t i = 0; i < big; i++)
        v[i] = (uint8_t)(i * 167u + 3);
    check_same(v, big, DDO_DTYPE_F8_E4M3, 2 * GROUP);
    /* corruption of the payload of block 1 of a coded FP8 stream */
    normal_fp8(v, big, true);
    uint64_t len = 0;
    uint8_t *coded = encode(v, big, DDO_DTYPE_F8_E4M3, 2 * GROUP, &len), *out = malloc(big);
    T_REQUIRE(coded != NULL);
    dstream d;
    T_REQUIRE(dstream_open(&d, coded, len) == 0);
    T_EQ_INT(d.plan->blocks[1].mode, DDO_CODEC_MODE_HUFF);
    ddo__errbuf eb = { 0, "" };
    coded[d.plan->blocks[1].coded_offset + 9000] ^= 0x21;
    T_EQ_INT(ddo__dev_copy_h2d(g_dev, d.src, coded, len, g_stream), 0);
    T_EQ_INT(dstream_decode(&d, out, &eb), DDO_E_FORMAT);
    T_CONTAINS(eb.msg, "block 1 of");
    dstream_close(&d);
    free(coded);
    free(out);
    free(v);
    /* throughput: 256 MiB of normal-derived E4M3 in one stream */
    uint64_t bytes = 256 * MIB;
    v = malloc(bytes);
    normal_fp8(v, bytes, true);
    coded = encode(v, bytes, DDO_DTYPE_F8_E4M3, 0, &len);
    T_REQUIRE(coded != NULL);
    T_REQUIRE(dstream_open(&d, coded, len) == 0);
    out = malloc(bytes);
    double med = 0, best = 0;
    time_decode(&d, 8, &med, &best);
    bool ok = dstream_decode(&d, out, &eb) == 0 && memcmp(out, v, bytes) == 0;
    T_CHECK_MSG(ok, "FP8 256 MiB: %s", eb.msg);
    printf("codec decode throughput, F8_E4M3 (normal-derived, ratio %.4f), %llu MiB, 8 warps: "
           "%.1f GB/s median, %.1f best, %s\n",
           (double)len / (double)bytes, (unsigned long long)(bytes / MIB), med, best,
           ok ? "identical" : "DIFFERS");
    fflush(stdout);
    dstream_close(&d);
    free(out);
    free(coded);
    free(v);
}

/* A batch on the device: n coded tensors packed in one source buffer (256-byte offsets),
 * their outputs packed in one destination buffer, their status areas adjacent. */
typedef struct dbatch {
    size_t n;
    ddo__codec_plan *plan[DDO_CODEC_BATCH_MAX];
    ddo__codec_desc d[DDO_CODEC_BATCH_MAX];
    uint64_t src, dst, status, src_total, dst_total, status_total;
} dbatch;

static uint64_t up256(uint64_t v)
{
    return (v + 255) / 256 * 256;
}

/* coded[i] (len[i] bytes, decoding to raw[i] bytes) into a batch on the device. */
static int dbatch_open(dbatch *b, size_t n, uint8_t *const *coded, const uint64_t *len)
{
    memset(b, 0, sizeof(*b));
    b->n = n;
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof(name), "batch.%zu.weight", i);
        if (ddo__codec_plan_create(coded[i], len[i], name, &b->plan[i], NULL) != 0)
            return -1;
        b->src_total += up256(len[i]);
        b->dst_total += up256(b->plan[i]->decoded_bytes);
        b->status_total += b->plan[i]->launch.status_bytes;
    }
    int rc = ddo__dev_mem_alloc(g_dev, b->src_total, &b->src);
    if (rc == 0)
        rc = ddo__dev_mem_alloc(g_dev, b->dst_total, &b->dst);
    if (rc == 0)
        rc = ddo__dev_mem_alloc(g_dev, b->status_total, &b->status);
    uint64_t so = 0, dof = 0, sto = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        b->d[i] = (ddo__codec_desc){ b->src + so, len[i], b->dst + dof, b->plan[i]->decoded_bytes,
                                     b->plan[i]->launch };
        b->d[i].l.status_dev = b->status + sto;
        rc = ddo__dev_copy_h2d(g_dev, b->src + so, coded[i], len[i], g_stream);
        so += up256(len[i]);
        dof += up256(b->plan[i]->decoded_bytes);
        sto += b->plan[i]->launch.status_bytes;
    }
    if (rc == 0)
        rc = ddo__dev_stream_synchronize(g_dev, g_stream);
    return rc;
}

static void dbatch_close(dbatch *b)
{
    ddo__dev_mem_free(g_dev, b->src);
    ddo__dev_mem_free(g_dev, b->dst);
    ddo__dev_mem_free(g_dev, b->status);
    for (size_t i = 0; i < b->n; i++)
        ddo__codec_plan_destroy(b->plan[i]);
}

/* How many tensors from i go in one launch: at most per, and while their coded bytes (at
 * 256-byte offsets) fit area bytes (0: no limit), as the session packs its decode areas. */
static size_t launch_size(const dbatch *b, size_t i, size_t per, uint64_t area)
{
    size_t k = 0;
    for (uint64_t used = 0; i + k < b->n && k < per; k++) {
        used += up256(b->d[i + k].l.coded_bytes);
        if (area > 0 && k > 0 && used > area)
            break;
    }
    return k;
}

/* Decodes the batch in launches of launch_size tensors; checks every status and output
 * against raw (NULL: not compared). Returns the index of the first tensor whose status check
 * failed, b->n when none did, or -1 when a device call failed. */
static long dbatch_decode(dbatch *b, size_t per, uint64_t area, uint8_t *const *raw,
                          ddo__errbuf *eb)
{
    uint8_t *poison = malloc(b->dst_total);
    memset(poison, 0xA5, b->dst_total);
    int rc = ddo__dev_copy_h2d(g_dev, b->dst, poison, b->dst_total, g_stream);
    for (size_t i = 0, k = 0; i < b->n && rc == 0; i += k) {
        k = launch_size(b, i, per, area);
        rc = ddo__dev_codec_decode(g_dev, g_stream, &b->d[i], k);
    }
    if (rc == 0)
        rc = ddo__dev_stream_synchronize(g_dev, g_stream);
    uint8_t *got = malloc(b->dst_total);
    uint64_t *st = malloc(b->status_total);
    if (rc == 0)
        rc = ddo__dev_copy_d2h(g_dev, got, b->dst, b->dst_total);
    if (rc == 0)
        rc = ddo__dev_copy_d2h(g_dev, st, b->status, b->status_total);
    long bad = rc == 0 ? (long)b->n : -1;
    for (size_t i = 0; i < b->n && rc == 0; i++) {
        uint64_t at = b->d[i].dst - b->dst, n = b->plan[i]->decoded_bytes;
        if (ddo__codec_status_check(b->plan[i], st + (b->d[i].l.status_dev - b->status) / 8, eb) !=
            0) {
            bad = bad == (long)b->n ? (long)i : bad;
            continue;
        }
        T_CHECK_MSG(raw == NULL || memcmp(got + at, raw[i], n) == 0, "tensor %zu differs", i);
        T_CHECK_MSG(memcmp(got + at + n, poison, up256(n) - n) == 0, "tensor %zu: padding", i);
    }
    free(st);
    free(got);
    free(poison);
    return bad;
}

/* Tensors of every coded dtype and raw blocks in one batch: bit-identical to the source, the
 * padding between outputs untouched, a corrupted middle tensor reported by its status alone;
 * the same tensors in one launch each give the same bytes. */
static void test_batch_bit_identical(void)
{
    enum { N = 8 };
    const ddo_dtype dt[N] = { DDO_DTYPE_BF16, DDO_DTYPE_F32,  DDO_DTYPE_U8,  DDO_DTYPE_BF16,
                              DDO_DTYPE_F16,  DDO_DTYPE_BF16, DDO_DTYPE_F32, DDO_DTYPE_F8_E4M3 };
    const uint64_t elems[N] = { 3 * GROUP + 17, GROUP + 1, 1000,         9 * GROUP + 4097, 31,
                                5 * GROUP,      2 * GROUP, 3 * GROUP + 5 };
    uint8_t *raw[N], *coded[N];
    uint64_t len[N];
    for (size_t i = 0; i < N; i++) {
        uint64_t bytes = elems[i] * ddo_dtype_size(dt[i]);
        raw[i] = malloc(bytes + 8);
        normal_bf16((uint16_t *)raw[i], bytes / 2 + 1, 0.02);
        if (i == 5)
            for (uint64_t k = GROUP; k < 2 * GROUP; k++)
                ((uint16_t *)raw[i])[k] = (uint16_t)rnd(); /* a raw block */
        if (dt[i] == DDO_DTYPE_F8_E4M3)
            normal_fp8(raw[i], bytes, true);
        coded[i] = encode(raw[i], bytes, dt[i], 2 * GROUP, &len[i]);
        T_REQUIRE(coded[i] != NULL);
    }
    dbatch b;
    T_REQUIRE(dbatch_open(&b, N, coded, len) == 0);
    ddo__errbuf eb = { 0, "" };
    T_EQ_INT(dbatch_decode(&b, N, 0, raw, &eb), N);
    T_EQ_INT(dbatch_decode(&b, 1, 0, raw, &eb), N);
    coded[3][b.plan[3]->blocks[2].coded_offset + 3000] ^= 0x40;
    T_EQ_INT(ddo__dev_copy_h2d(g_dev, b.d[3].src, coded[3], len[3], g_stream), 0);
    T_EQ_INT(dbatch_decode(&b, N, 0, raw, &eb), 3);
    T_CONTAINS(eb.msg, "batch.3.weight");
    T_CONTAINS(eb.msg, "block 2 of");
    dbatch_close(&b);
    for (size_t i = 0; i < N; i++) {
        free(raw[i]);
        free(coded[i]);
    }
}

/* The weights and biases of a Flux.1 double block (transformer_blocks.N of
 * data/layouts/flux1-dev.json): 32 BF16 tensors, 679.7 MB. */
static const uint64_t flux_double[][2] = {
    { 18432, 3072 }, { 18432, 1 }, { 18432, 3072 }, { 18432, 1 }, { 128, 1 },      { 128, 1 },
    { 3072, 3072 },  { 3072, 1 },  { 3072, 3072 },  { 3072, 1 },  { 3072, 3072 },  { 3072, 1 },
    { 3072, 3072 },  { 3072, 1 },  { 128, 1 },      { 128, 1 },   { 3072, 3072 },  { 3072, 1 },
    { 3072, 3072 },  { 3072, 1 },  { 3072, 3072 },  { 3072, 1 },  { 3072, 3072 },  { 3072, 1 },
    { 12288, 3072 }, { 12288, 1 }, { 3072, 12288 }, { 3072, 1 },  { 12288, 3072 }, { 12288, 1 },
    { 3072, 12288 }, { 3072, 1 },
};

/* Times decoding the whole batch in launches of launch_size tensors: median and best GB/s of 7
 * rounds of 5. */
static void time_batch(dbatch *b, size_t per, uint64_t area, double *med, double *best)
{
    double r[7];
    uint64_t decoded = 0;
    for (size_t i = 0; i < b->n; i++)
        decoded += b->plan[i]->decoded_bytes;
    for (int round = -1; round < 7; round++) {
        uint64_t t0 = ddo__now_ns();
        for (int k = 0; k < 5; k++)
            for (size_t i = 0, n = 0; i < b->n; i += n) {
                n = launch_size(b, i, per, area);
                ddo__dev_codec_decode(g_dev, g_stream, &b->d[i], n);
            }
        ddo__dev_stream_synchronize(g_dev, g_stream);
        if (round >= 0)
            r[round] = 5.0 * (double)decoded / (double)(ddo__now_ns() - t0);
    }
    for (int i = 0; i < 7; i++)
        for (int j = i + 1; j < 7; j++)
            if (r[j] < r[i]) {
                double x = r[i];
                r[i] = r[j];
                r[j] = x;
            }
    *med = r[3];
    *best = r[6];
}

/* A Flux double block decoded one launch per tensor (as before batching), as the session
 * batches it (areas of 256 MiB: two launches) and in one launch; GB/s of decoded output. */
static void test_batch_throughput(void)
{
    const char *env = getenv("DDO_CODEC_BENCH_MIB");
    if (env != NULL && strtoull(env, NULL, 10) == 0)
        T_SKIP("DDO_CODEC_BENCH_MIB=0");
    enum { N = DDO_ARRAY_LEN(flux_double) };
    uint64_t total = 0, len[N];
    for (size_t i = 0; i < N; i++)
        total += flux_double[i][0] * flux_double[i][1];
    const char *what = "";
    uint16_t *v = bench_values(total, &what);
    T_REQUIRE(v != NULL);
    uint8_t *raw[N], *coded[N];
    uint64_t at = 0, coded_total = 0;
    for (size_t i = 0; i < N; i++) {
        uint64_t n = flux_double[i][0] * flux_double[i][1];
        raw[i] = (uint8_t *)(v + at);
        at += n;
        coded[i] = encode(raw[i], 2 * n, DDO_DTYPE_BF16, 0, &len[i]);
        T_REQUIRE(coded[i] != NULL);
        coded_total += len[i];
    }
    dbatch b;
    T_REQUIRE(dbatch_open(&b, N, coded, len) == 0);
    printf("codec batch decode, Flux double block: %d BF16 tensors, %.1f MB -> %.1f MB coded, "
           "from %s\n",
           N, 2.0 * (double)total / 1e6, (double)coded_total / 1e6, what);
    printf("%-34s %9s %10s %10s %10s\n", "launches", "count", "GB/s med", "GB/s best", "check");
    const struct {
        const char *name;
        size_t per;
        uint64_t area;
    } modes[] = { { "one per tensor (before batching)", 1, 0 },
                  { "session batches (256 MiB areas)", DDO_CODEC_BATCH_MAX, (uint64_t)256 << 20 },
                  { "one batch", N, 0 } };
    for (size_t m = 0; m < DDO_ARRAY_LEN(modes); m++) {
        size_t launches = 0;
        for (size_t i = 0; i < N; i += launch_size(&b, i, modes[m].per, modes[m].area))
            launches++;
        ddo__errbuf eb = { 0, "" };
        long ok = dbatch_decode(&b, modes[m].per, modes[m].area, raw, &eb);
        T_CHECK_MSG(ok == N, "%s: %s", modes[m].name, eb.msg);
        double med = 0, best = 0;
        time_batch(&b, modes[m].per, modes[m].area, &med, &best);
        printf("%-34s %9zu %10.1f %10.1f %10s\n", modes[m].name, launches, med, best,
               ok == N ? "identical" : "DIFFERS");
    }
    fflush(stdout);
    dbatch_close(&b);
    for (size_t i = 0; i < N; i++)
        free(coded[i]);
    free(v);
}

/* --ratio: the coded ratio of every tensor of a checkpoint, per dtype. */
static int ratio_main(const char *path, bool verify)
{
    ddo_checkpoint *ck = NULL;
    if (ddo_checkpoint_create(path, DDO_READ_DEFAULT, &ck) != 0) {
        fprintf(stderr, "%s: %s\n", path, ddo_last_error());
        return 1;
    }
    uint64_t raw[DDO_DTYPE_COUNT] = { 0 }, coded[DDO_DTYPE_COUNT] = { 0 };
    uint64_t count[DDO_DTYPE_COUNT] = { 0 }, t0 = ddo__now_ns(), enc_ns = 0;
    int bad = 0;
    for (size_t i = 0; i < ddo_checkpoint_tensor_count(ck); i++) {
        const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, i);
        uint8_t *buf = malloc(t->nbytes + 1), *back = verify ? malloc(t->nbytes + 1) : NULL;
        uint64_t len = 0;
        if (buf == NULL || ddo_checkpoint_read(ck, i, 0, buf, t->nbytes) != 0) {
            fprintf(stderr, "%s: %s\n", t->name, ddo_last_error());
            return 1;
        }
        uint64_t e0 = ddo__now_ns();
        uint8_t *c = encode(buf, t->nbytes, t->dtype, 0, &len);
        enc_ns += ddo__now_ns() - e0;
        if (c == NULL)
            return 1;
        ddo__errbuf eb = { 0, "" };
        if (verify && (ddo__codec_decode(c, len, back, t->nbytes, t->name, &eb) != 0 ||
                       memcmp(back, buf, t->nbytes) != 0)) {
            fprintf(stderr, "%s: round trip failed: %s\n", t->name, eb.msg);
            bad++;
        }
        raw[t->dtype] += t->nbytes;
        coded[t->dtype] += len;
        count[t->dtype]++;
        free(c);
        free(back);
        free(buf);
    }
    uint64_t R = 0, C = 0;
    printf("%-8s %8s %16s %16s %8s\n", "dtype", "tensors", "raw bytes", "coded bytes", "ratio");
    for (int d = 0; d < DDO_DTYPE_COUNT; d++) {
        if (count[d] == 0)
            continue;
        printf("%-8s %8llu %16llu %16llu %8.4f\n", ddo_dtype_name((ddo_dtype)d),
               (unsigned long long)count[d], (unsigned long long)raw[d],
               (unsigned long long)coded[d], (double)coded[d] / (double)raw[d]);
        R += raw[d];
        C += coded[d];
    }
    printf("%-8s %8zu %16llu %16llu %8.4f\n", "total", ddo_checkpoint_tensor_count(ck),
           (unsigned long long)R, (unsigned long long)C, R ? (double)C / (double)R : 0.0);
    printf("encode: %.1f s on %u threads (%.2f GB/s); wall %.1f s%s\n", (double)enc_ns / 1e9,
           cores(), (double)R / (double)(enc_ns ? enc_ns : 1), (double)(ddo__now_ns() - t0) / 1e9,
           verify ? (bad ? "; ROUND TRIP FAILED" : "; every tensor round-trips bit-exact") : "");
    ddo_checkpoint_destroy(ck);
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--ratio") == 0)
        return ratio_main(argv[2], argc >= 4 && strcmp(argv[3], "--verify") == 0);
    int rc = ddo_device_create("cuda:0", NULL, &g_dev);
    if (rc == DDO_E_NO_DEVICE) {
        fprintf(stderr, "skipped: %s\n", ddo_last_error());
        return 77;
    }
    if (rc != 0 || ddo__dev_stream_create(g_dev, 1, &g_stream) != 0) {
        fprintf(stderr, "cuda:0: %s\n", ddo_last_error());
        return 1;
    }
    T_RUN(test_bit_identical);
    T_RUN(test_patterns_and_raw);
    T_RUN(test_corrupt_detected);
    T_RUN(test_fp8);
    T_RUN(test_batch_bit_identical);
    T_RUN(test_throughput);
    T_RUN(test_batch_throughput);
    ddo__dev_stream_destroy(g_dev, g_stream);
    ddo_device_destroy(g_dev);
    return t_done();
}
