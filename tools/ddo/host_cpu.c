/*
 * host_cpu.c - the cpu back end of the reference host: a plain loop.
 *
 * For each 2-D weight W [out, in] in BF16, F16 or F32 it computes
 * Y = X W^T with X [tokens, in] from ref_activation(), each output element
 * accumulated in float32 over `in` in ascending order, and folds Y into the
 * step checksum (host.h). Other tensors are moved only: their raw bytes are
 * folded instead, so every byte a session delivers is checked.
 *
 * On the cpu device the session's device addresses are host pointers; the
 * stream is synchronized first so that its uploads are complete, and the
 * loop runs on the calling thread while the session's copy worker prefetches
 * the next units.
 */
#include "host.h"
#include "tool.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Tokens processed together: independent accumulators, so the loop is not
 * bound by the latency of one float addition chain. */
#define TOKEN_BLOCK 8

struct ref_host_cpu {
    const ddo_checkpoint *ck;
    ref_host_config cfg;
    uint64_t checksum;     /* fold of tensors without a slot below (calibration only) */
    uint64_t *tensor_hash; /* per checkpoint tensor: its output's fold this step */
    unsigned char *ran;    /* per checkpoint tensor: ran since the last step checksum */
    size_t tensor_count;
    float *xt; /* X transposed: xt[i * tokens + t] */
    size_t xt_cap;
    float *y; /* Y [tokens, out] */
    size_t y_cap;
    float *row; /* one row of W as floats */
    size_t row_cap;
    void *read_buf; /* ref_host_cpu_run_checkpoint */
    size_t read_cap;
};

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = { (time_t)(ns / 1000000000u), (long)(ns % 1000000000u) };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Grows *buf to hold n elements of size sz. */
static int reserve(void **buf, size_t *cap, size_t n, size_t sz)
{
    if (n <= *cap)
        return 0;
    if (sz != 0 && n > SIZE_MAX / sz)
        return DDO_E_OVERFLOW;
    void *p = realloc(*buf, n * sz);
    if (p == NULL)
        return DDO_E_NO_MEMORY;
    *buf = p;
    *cap = n;
    return 0;
}

int ref_host_cpu_create(const ddo_checkpoint *ck, const ref_host_config *cfg, ref_host_cpu **out,
                        char *err, size_t err_len)
{
    if (ck == NULL || cfg == NULL || out == NULL || cfg->tokens == 0 || cfg->cpu_flops_per_s < 0)
        return tool_fail(err, err_len, DDO_E_INVALID_ARGUMENT,
                         "reference host: needs a checkpoint and tokens >= 1");
    ref_host_cpu *c = calloc(1, sizeof *c);
    if (c == NULL)
        return tool_fail(err, err_len, DDO_E_NO_MEMORY, "reference host: out of memory");
    c->ck = ck;
    c->cfg = *cfg;
    c->checksum = REF_CHECKSUM_INIT;
    c->tensor_count = ddo_checkpoint_tensor_count(ck);
    c->tensor_hash = calloc(c->tensor_count + 1, sizeof *c->tensor_hash);
    c->ran = calloc(c->tensor_count + 1, 1);
    if (c->tensor_hash == NULL || c->ran == NULL) {
        ref_host_cpu_destroy(c);
        return tool_fail(err, err_len, DDO_E_NO_MEMORY, "reference host: out of memory");
    }
    *out = c;
    return 0;
}

void ref_host_cpu_destroy(ref_host_cpu *c)
{
    if (c == NULL)
        return;
    free(c->xt);
    free(c->y);
    free(c->row);
    free(c->read_buf);
    free(c->tensor_hash);
    free(c->ran);
    free(c);
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while ((man & 0x400u) == 0);
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Converts row o of W (in elements of dtype) to floats. */
static void load_row(float *row, const unsigned char *w, ddo_dtype dtype, size_t in)
{
    switch (dtype) {
    case DDO_DTYPE_BF16:
        for (size_t i = 0; i < in; i++) {
            uint16_t v;
            memcpy(&v, w + 2 * i, 2);
            uint32_t bits = (uint32_t)v << 16;
            memcpy(&row[i], &bits, 4);
        }
        break;
    case DDO_DTYPE_F16:
        for (size_t i = 0; i < in; i++) {
            uint16_t v;
            memcpy(&v, w + 2 * i, 2);
            row[i] = half_to_float(v);
        }
        break;
    default: /* F32 */
        memcpy(row, w, in * sizeof(float));
        break;
    }
}

static bool computable(const ddo_tensor_info *ti)
{
    return ti->ndim == 2 && ti->shape[0] > 0 && ti->shape[1] > 0 &&
           (ti->dtype == DDO_DTYPE_BF16 || ti->dtype == DDO_DTYPE_F16 ||
            ti->dtype == DDO_DTYPE_F32);
}

/* Records tensor t's output fold h for this step. */
static void record(ref_host_cpu *c, size_t t, uint64_t h)
{
    if (t >= c->tensor_count) {
        c->checksum = ref_checksum_u64(c->checksum, h);
        return;
    }
    c->tensor_hash[t] = c->ran[t] ? ref_checksum_u64(c->tensor_hash[t], h) : h;
    c->ran[t] = 1;
}

/* Runs one tensor whose bytes are at data; returns its flops (0 when moved only). */
static int run_one(ref_host_cpu *c, size_t t, const ddo_tensor_info *ti, const void *data,
                   ref_host_stats *st, uint64_t *flops, char *err, size_t err_len)
{
    *flops = 0;
    if (!computable(ti)) {
        record(c, t, ref_checksum_bytes(REF_CHECKSUM_INIT, data, (size_t)ti->nbytes));
        st->weights_skipped++;
        return 0;
    }
    const size_t tokens = (size_t)c->cfg.tokens;
    const size_t out = (size_t)ti->shape[0], in = (size_t)ti->shape[1];
    const size_t esz = ddo_dtype_size(ti->dtype);
    if ((uint64_t)out * in * esz != ti->nbytes)
        return tool_fail(
            err, err_len, DDO_E_FORMAT,
            "reference host: tensor \"%s\": %zu x %zu elements do not match %llu bytes", ti->name,
            out, in, (unsigned long long)ti->nbytes);
    if (in > SIZE_MAX / tokens || out > SIZE_MAX / tokens)
        return tool_fail(err, err_len, DDO_E_OVERFLOW, "reference host: tensor \"%s\": too large",
                         ti->name);
    int rc = reserve((void **)&c->xt, &c->xt_cap, in * tokens, sizeof(float));
    if (rc == 0)
        rc = reserve((void **)&c->y, &c->y_cap, out * tokens, sizeof(float));
    if (rc == 0)
        rc = reserve((void **)&c->row, &c->row_cap, in, sizeof(float));
    if (rc != 0)
        return tool_fail(err, err_len, rc, "reference host: tensor \"%s\": no memory for %zu x %zu",
                         ti->name, tokens, in > out ? in : out);

    /* X [tokens, in] with element (t, i) = ref_activation(tensor, t * in + i), stored transposed
     * so that one weight element meets TOKEN_BLOCK consecutive activations. */
    for (size_t k = 0; k < tokens; k++)
        for (size_t i = 0; i < in; i++)
            c->xt[i * tokens + k] = ref_activation(t, (uint64_t)k * in + i);

    const unsigned char *w = data;
    for (size_t o = 0; o < out; o++) {
        load_row(c->row, w + o * in * esz, ti->dtype, in);
        for (size_t k0 = 0; k0 < tokens; k0 += TOKEN_BLOCK) {
            size_t nk = tokens - k0 < TOKEN_BLOCK ? tokens - k0 : TOKEN_BLOCK;
            float acc[TOKEN_BLOCK] = { 0 };
            if (nk == TOKEN_BLOCK) {
                for (size_t i = 0; i < in; i++) {
                    const float wi = c->row[i];
                    const float *x = &c->xt[i * tokens + k0];
                    for (size_t k = 0; k < TOKEN_BLOCK; k++)
                        acc[k] += x[k] * wi;
                }
            } else {
                for (size_t i = 0; i < in; i++) {
                    const float wi = c->row[i];
                    const float *x = &c->xt[i * tokens + k0];
                    for (size_t k = 0; k < nk; k++)
                        acc[k] += x[k] * wi;
                }
            }
            for (size_t k = 0; k < nk; k++)
                c->y[(k0 + k) * out + o] = acc[k];
        }
    }
    record(c, t, ref_checksum_floats(REF_CHECKSUM_INIT, c->y, out * tokens));
    st->weights_computed++;
    *flops = 2u * (uint64_t)tokens * out * in;
    st->flops += *flops;
    return 0;
}

/* Sleeps so that work of `flops` started at t0 takes at least flops / rate. */
static void throttle(const ref_host_cpu *c, uint64_t t0, uint64_t flops)
{
    if (c->cfg.cpu_flops_per_s <= 0 || flops == 0)
        return;
    double t = (double)flops / c->cfg.cpu_flops_per_s * 1e9;
    uint64_t want = t < 9.0e18 ? (uint64_t)t : UINT64_C(9000000000000000000); /* no overflow */
    uint64_t spent = tool_now_ns() - t0;
    if (spent < want)
        sleep_ns(want - spent);
}

int ref_host_cpu_run_tensors(ref_host_cpu *c, ddo_session *s, const size_t *tensors, size_t count,
                             ddo_stream *stream, ref_host_stats *stats, char *err, size_t err_len)
{
    if (c == NULL || s == NULL || (tensors == NULL && count > 0) || stats == NULL)
        return tool_fail(err, err_len, DDO_E_INVALID_ARGUMENT, "reference host: bad arguments");
    uint64_t t0 = tool_now_ns();
    if (stream != NULL) {
        int rc = ddo_stream_synchronize(stream);
        if (rc != 0)
            return tool_fail(err, err_len, rc, "reference host: waiting for uploads: %s",
                             ddo_last_error());
    }
    uint64_t total = 0;
    for (size_t j = 0; j < count; j++) {
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(c->ck, tensors[j]);
        if (ti == NULL)
            return tool_fail(err, err_len, DDO_E_INVALID_ARGUMENT,
                             "reference host: no tensor %zu in the checkpoint", tensors[j]);
        void *addr = NULL;
        int rc = ddo_session_tensor_address(s, tensors[j], &addr);
        if (rc != 0)
            return tool_fail(err, err_len, rc, "reference host: tensor \"%s\": no address: %s",
                             ti->name, ddo_session_error(s));
        if (addr == NULL && ti->nbytes > 0)
            return tool_fail(err, err_len, DDO_E_INTERNAL,
                             "reference host: tensor \"%s\": session gave a NULL address",
                             ti->name);
        uint64_t flops;
        rc = run_one(c, tensors[j], ti, addr, stats, &flops, err, err_len);
        if (rc != 0)
            return rc;
        total += flops;
    }
    throttle(c, t0, total);
    return 0;
}

int ref_host_cpu_run_checkpoint(ref_host_cpu *c, const size_t *tensors, size_t count,
                                ref_host_stats *stats, char *err, size_t err_len)
{
    if (c == NULL || (tensors == NULL && count > 0) || stats == NULL)
        return tool_fail(err, err_len, DDO_E_INVALID_ARGUMENT, "reference host: bad arguments");
    for (size_t j = 0; j < count; j++) {
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(c->ck, tensors[j]);
        if (ti == NULL)
            return tool_fail(err, err_len, DDO_E_INVALID_ARGUMENT,
                             "reference host: no tensor %zu in the checkpoint", tensors[j]);
        if (ti->nbytes > SIZE_MAX)
            return tool_fail(err, err_len, DDO_E_OVERFLOW,
                             "reference host: tensor \"%s\": too large", ti->name);
        size_t n = (size_t)ti->nbytes;
        int rc = reserve(&c->read_buf, &c->read_cap, n > 0 ? n : 1, 1);
        if (rc != 0)
            return tool_fail(err, err_len, rc,
                             "reference host: tensor \"%s\": no memory for %zu bytes", ti->name, n);
        rc = ddo_checkpoint_read(c->ck, tensors[j], 0, c->read_buf, n);
        if (rc != 0)
            return tool_fail(err, err_len, rc, "reference host: %s", ddo_checkpoint_error(c->ck));
        uint64_t flops;
        rc = run_one(c, tensors[j], ti, c->read_buf, stats, &flops, err, err_len);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int ref_host_cpu_step_checksum(ref_host_cpu *c, uint64_t *checksum)
{
    if (c == NULL || checksum == NULL)
        return DDO_E_INVALID_ARGUMENT;
    /* Checkpoint order, whatever order the route ran them in: the same products give the
     * same checksum on every route and unit granularity. */
    uint64_t h = c->checksum;
    for (size_t t = 0; t < c->tensor_count; t++) {
        if (!c->ran[t])
            continue;
        h = ref_checksum_u64(h, (uint64_t)t);
        h = ref_checksum_u64(h, c->tensor_hash[t]);
        c->ran[t] = 0;
    }
    *checksum = h;
    c->checksum = REF_CHECKSUM_INIT;
    return 0;
}

double ref_host_cpu_measure_flops(uint64_t tokens)
{
    enum { OUT = 1024, IN = 1024 }; /* 2 MiB of BF16: beyond L2, like real weights */
    ref_host_config cfg = { 0 };
    cfg.tokens = tokens > 0 ? tokens : 1;
    ref_host_cpu *c = NULL;
    uint16_t *w = calloc((size_t)OUT * IN, sizeof *w);
    ddo_tensor_info ti;
    memset(&ti, 0, sizeof ti);
    ti.name = "calibration";
    ti.dtype = DDO_DTYPE_BF16;
    ti.ndim = 2;
    ti.shape[0] = OUT;
    ti.shape[1] = IN;
    ti.nbytes = (uint64_t)OUT * IN * 2u;
    c = calloc(1, sizeof *c);
    double rate = 0;
    if (c != NULL && w != NULL) {
        c->cfg = cfg;
        c->checksum = REF_CHECKSUM_INIT;
        for (size_t i = 0; i < (size_t)OUT * IN; i++)
            w[i] = (uint16_t)(0x3c00u + (i % 97u)); /* small finite BF16 values */
        ref_host_stats st;
        memset(&st, 0, sizeof st);
        uint64_t flops = 0, total = 0, t0 = 0;
        for (int rep = 0; rep < 7; rep++) {
            if (rep == 1) /* the first pass warms the buffers */
                t0 = tool_now_ns();
            if (run_one(c, 0, &ti, w, &st, &flops, NULL, 0) != 0)
                break;
            if (rep >= 1)
                total += flops;
        }
        uint64_t dt = tool_now_ns() - t0;
        if (total > 0 && dt > 0)
            rate = (double)total / ((double)dt / 1e9);
    }
    ref_host_cpu_destroy(c);
    free(w);
    return rate;
}
