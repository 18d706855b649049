/*
 * test_gpu_codec.c - the codec's device decoder on a real GPU: decodes on the
 * cuda device bit-identical to the C reference (every coded dtype, partial
 * groups and blocks, raw blocks, all 65,536 BF16 patterns), nothing written
 * outside the destination, corrupt input (payload, lane table, header)
 * detected through the status words, and the decoder's throughput printed
 * (GB/s of decoded BF16 output; Gaussian weights like `ddo synth --values
 * normal`, or the BF16 tensors of the checkpoint named by
 * DDO_CODEC_BENCH_CHECKPOINT).
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
#define _POSIX_C_SOURCE 200809L
#include "codec.h"
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
    ddo__codec_launch l;
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
    d->l = d->plan->launch;
    d->l.status_dev = d->status;
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
        rc = ddo__dev_codec_decode(g_dev, g_stream, d->src, d->plan->coded_bytes, d->dst,
                                   d->dst_bytes, &d->l);
    if (rc == 0)
        rc = ddo__dev_stream_synchronize(g_dev, g_stream);
    uint8_t *got = malloc(n);
    uint64_t *st = malloc(d->l.status_bytes + 16);
    if (rc == 0)
        rc = ddo__dev_copy_d2h(g_dev, got, d->dst, n);
    if (rc == 0)
        rc = ddo__dev_copy_d2h(g_dev, st, d->status, d->l.status_bytes);
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
    T_EQ_INT(ddo__dev_codec_decode(g_dev, g_stream, d.src, len, d.dst, n * 2 - 2, &d.l),
             DDO_E_INVALID_ARGUMENT);
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
    d->l.cta_warps = warps;
    d->l.ctas_per_block = (d->l.block_elems / GROUP + warps - 1) / warps;
    /* the status check counts the thread blocks of the launch the plan records */
    d->plan->launch.cta_warps = d->l.cta_warps;
    d->plan->launch.ctas_per_block = d->l.ctas_per_block;
    for (int k = 0; k < 3; k++)
        ddo__dev_codec_decode(g_dev, g_stream, d->src, d->plan->coded_bytes, d->dst, d->dst_bytes,
                              &d->l);
    ddo__dev_stream_synchronize(g_dev, g_stream);
    for (int round = 0; round < 7; round++) {
        uint64_t t0 = ddo__now_ns();
        for (int k = 0; k < 10; k++)
            ddo__dev_codec_decode(g_dev, g_stream, d->src, d->plan->coded_bytes, d->dst,
                                  d->dst_bytes, &d->l);
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
    ddo_cuda_options o_cuda = DDO_CUDA_OPTIONS_INIT;
    o_cuda.library_env = getenv("DDO_VMM_LIBRARY_PATH");
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cuda = &o_cuda;
    int rc = ddo_device_create("cuda:0", &o, &g_dev);
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
    T_RUN(test_throughput);
    ddo__dev_stream_destroy(g_dev, g_stream);
    ddo_device_destroy(g_dev);
    return t_done();
}
