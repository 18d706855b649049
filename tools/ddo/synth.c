/*
 * synth.c - synthetic checkpoints with the exact tensor names, shapes and
 * dtypes of a real architecture layout (data/layouts/<name>.json), filled with
 * deterministic finite pseudo-random values from splitmix64, generated in pieces on
 * several threads and written in order with large write() calls.
 */
#include "synth.h"
#include "compat.h"

#include "cleanup.h"
#include "gguf_write.h"
#include "os/thread.h"
#include "tool.h"

#include "ddo.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* One random word turned into finite values of dtype (little-endian lanes). */
static uint64_t shape_word(uint64_t r, ddo_dtype dt)
{
    switch (dt) {
    case DDO_DTYPE_BF16: /* sign, 7 mantissa bits, exponent 120..123: |v| < 0.125 */
        return (r & 0x81FF81FF81FF81FFull) | 0x3C003C003C003C00ull;
    case DDO_DTYPE_F16: /* exponent 8..11 of bias 15 */
        return (r & 0x8FFF8FFF8FFF8FFFull) | 0x2000200020002000ull;
    case DDO_DTYPE_F32:
        return (r & 0x81FFFFFF81FFFFFFull) | 0x3C0000003C000000ull;
    case DDO_DTYPE_F64:
        return (r & 0x801FFFFFFFFFFFFFull) | 0x3F80000000000000ull;
    case DDO_DTYPE_BOOL:
        return r & 0x0101010101010101ull;
    case DDO_DTYPE_F8_E4M3:
    case DDO_DTYPE_F8_E5M2:
    case DDO_DTYPE_F8_E8M0: {
        uint64_t w = 0;
        for (int i = 0; i < 8; i++) {
            uint8_t b = (uint8_t)(r >> (8 * i));
            if (dt == DDO_DTYPE_F8_E4M3 && (b & 0x7F) == 0x7F)
                b ^= 1; /* 0x7F / 0xFF are NaN */
            else if (dt == DDO_DTYPE_F8_E5M2 && (b & 0x7C) == 0x7C)
                b &= 0xFB; /* exponent 31 is inf/NaN */
            else if (dt == DDO_DTYPE_F8_E8M0 && b == 0xFF)
                b = 0xFE;
            w |= (uint64_t)b << (8 * i);
        }
        return w;
    }
    default: /* integers: any bits */
        return r;
    }
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Two Gaussian values of standard deviation sd from one 64-bit draw (Box-Muller on two 24-bit
 * uniforms; |z| < 5.8). */
static void gauss_pair(uint64_t r, double sd, double *a, double *b)
{
    /* float math: what matters is the shape (exponents), and it is several times faster */
    float u1 = ((float)(uint32_t)(r >> 40) + 0.5f) * (1.0f / 16777216.0f);
    float u2 = (float)(uint32_t)(r & 0xFFFFFF) * (1.0f / 16777216.0f);
    float m = (float)sd * sqrtf(-2.0f * logf(u1)), t = 6.2831853f * u2;
    *a = (double)(m * cosf(t));
    *b = (double)(m * sinf(t));
}

static uint32_t f32_bits(double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Round to nearest even (finite inputs). */
static uint16_t bf16_of(double v)
{
    uint32_t u = f32_bits(v);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static uint16_t f16_of(double v)
{
    uint32_t x = f32_bits(v), sign = (x >> 16) & 0x8000u, m = x & 0x7FFFFFu;
    int e = (int)((x >> 23) & 0xFF) - 112;
    if (e >= 31)
        return (uint16_t)(sign | 0x7C00u);
    if (e <= 0) { /* subnormal: the 24-bit significand shifted down, rounded to even */
        if (e < -10)
            return (uint16_t)sign;
        unsigned shift = (unsigned)(14 - e);
        uint32_t sig = m | 0x800000u, hm = sig >> shift, rem = sig & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        hm += rem > half || (rem == half && (hm & 1u));
        return (uint16_t)(sign | hm);
    }
    uint32_t h = sign | (uint32_t)e << 10 | m >> 13, rem = m & 0x1FFFu;
    h += rem > 0x1000u || (rem == 0x1000u && (h & 1u));
    return (uint16_t)h;
}

#define GOLDEN 0x9E3779B97F4A7C15ull

/* The FP8 code nearest to x (E4M3: bias 7, 3 mantissa bits, largest 448 = 0x7E; E5M2: bias 15,
 * 2 bits, largest 57344 = 0x7B; ties away from zero), |x| clamped to the largest. */
static uint8_t fp8_of(double x, bool e4m3)
{
    int mb = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    unsigned top = e4m3 ? 0x7Eu : 0x7Bu, c;
    double a = fabs(x), sub = ldexp(1.0, 1 - bias);
    if (a < sub) {
        c = (unsigned)(a / sub * (1 << mb) + 0.5);
    } else {
        int e = 0;
        double m = frexp(a, &e) * 2.0; /* a = m * 2^(e - 1), 1 <= m < 2 */
        c = (unsigned)(e - 1 + bias) * (1u << mb) + (unsigned)((m - 1.0) * (1 << mb) + 0.5);
    }
    c = c > top ? top : c;
    return (uint8_t)(c | (x < 0 && c != 0 ? 0x80u : 0u));
}

/* Word k of a tensor with normal values: 16-bit types take two draws per word, wider one. */
static uint64_t normal_word(uint64_t state, uint64_t k, ddo_dtype dt, double sd)
{
    double v[4];
    uint64_t w = 0;
    switch (dt) {
    case DDO_DTYPE_BF16:
    case DDO_DTYPE_F16:
        gauss_pair(mix64(state + (2 * k + 1) * GOLDEN), sd, &v[0], &v[1]);
        gauss_pair(mix64(state + (2 * k + 2) * GOLDEN), sd, &v[2], &v[3]);
        for (int i = 0; i < 4; i++)
            w |= (uint64_t)(dt == DDO_DTYPE_BF16 ? bf16_of(v[i]) : f16_of(v[i])) << (16 * i);
        return w;
    case DDO_DTYPE_F32:
        gauss_pair(mix64(state + (k + 1) * GOLDEN), sd, &v[0], &v[1]);
        return (uint64_t)f32_bits(v[0]) | (uint64_t)f32_bits(v[1]) << 32;
    case DDO_DTYPE_F64:
        gauss_pair(mix64(state + (k + 1) * GOLDEN), sd, &v[0], &v[1]);
        memcpy(&w, &v[0], 8);
        return w;
    case DDO_DTYPE_F8_E4M3:
    case DDO_DTYPE_F8_E5M2: { /* scaled per tensor as FP8 checkpoints are: 5.8 sd -> largest */
        double top = dt == DDO_DTYPE_F8_E4M3 ? 448.0 : 57344.0;
        for (uint64_t j = 0; j < 4; j++) {
            gauss_pair(mix64(state + (4 * k + j + 1) * GOLDEN), top / 5.8, &v[0], &v[1]);
            for (int i = 0; i < 2; i++)
                w |= (uint64_t)fp8_of(v[i], dt == DDO_DTYPE_F8_E4M3) << (16 * j + 8 * (uint64_t)i);
        }
        return w;
    }
    default:
        return shape_word(mix64(state + (k + 1) * GOLDEN), dt);
    }
}

/* What one tensor is filled with. */
typedef struct fill_kind {
    ddo_dtype dt;
    ddo_tool_values values;
    double sd; /* normal: the standard deviation */
} fill_kind;

static uint64_t value_word(const fill_kind *fk, uint64_t state, uint64_t k)
{
    if (fk->values == DDO_TOOL_VALUES_NORMAL)
        return normal_word(state, k, fk->dt, fk->sd);
    return shape_word(mix64(state + (k + 1) * GOLDEN), fk->dt);
}

/* splitmix64 is counter based: word k of a tensor is mix(state + (k + 1) * golden), so any
 * byte range [a, b) of a tensor can be filled on its own (and so in parallel) with the same
 * bytes: a range that starts or ends inside a word takes that word's bytes. */
static void fill_range(uint8_t *dst, const fill_kind *fk, uint64_t state, uint64_t a, uint64_t b)
{
    while (a < b && a % 8 != 0) { /* the head: part of one word */
        uint64_t w = value_word(fk, state, a / 8);
        size_t at = (size_t)(a % 8), n = 8 - at;
        n = (uint64_t)n > b - a ? (size_t)(b - a) : n;
        memcpy(dst, (const uint8_t *)&w + at, n);
        dst += n;
        a += n;
    }
    for (; a + 8 <= b; a += 8, dst += 8) {
        uint64_t w = value_word(fk, state, a / 8);
        memcpy(dst, &w, 8);
    }
    if (a < b) {
        uint64_t w = value_word(fk, state, a / 8);
        memcpy(dst, &w, (size_t)(b - a));
    }
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, TOOL_IO_COUNT(n));
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

typedef struct lt {
    const char *name;
    ddo_dtype dtype;
    size_t esize;
    uint64_t nbytes;
    uint64_t fan_in;
    uint64_t offset; /* in the data section */
    uint32_t ndim;
    uint64_t shape[DDO_MAX_DIMS];
} lt;

/* A tensor's bytes: elements of whole bytes, or (GGML block types) whole blocks along the
 * last dimension, which a scaled shape rounds up to a multiple of the block. */
static uint64_t tensor_bytes(ddo_dtype dt, uint32_t ndim, uint64_t *shape)
{
    size_t bb = 0, block = ddo_dtype_block(dt, &bb);
    uint64_t numel = 1;
    if (block != 0 && ndim > 0)
        shape[ndim - 1] = (shape[ndim - 1] + block - 1) / block * block;
    for (uint32_t k = 0; k < ndim; k++)
        numel *= shape[k];
    return block != 0 ? numel / block * bb : numel * ddo_dtype_size(dt);
}

/* Whether dtype dt may be written to the output (a .gguf takes GGML's types only, a
 * .safetensors no block type). */
static int check_dtype(ddo_dtype dt, bool gguf, const char *layout_path, const char *name,
                       char *err, size_t err_len)
{
    if (gguf && tool_gguf_type(dt) < 0)
        return tool_fail(err, err_len, DDO_E_FORMAT,
                         "%s: tensor \"%s\": %s has no GGML type (a .gguf output takes F32, F16, "
                         "BF16, I8..I64, F64 and the GGML block types)",
                         layout_path, name, ddo_dtype_name(dt));
    if (!gguf && ddo_dtype_block(dt, NULL) != 0)
        return tool_fail(err, err_len, DDO_E_FORMAT,
                         "%s: tensor \"%s\": %s is a GGML block type (write a .gguf)", layout_path,
                         name, ddo_dtype_name(dt));
    return 0;
}

/*
 * Adds tensor i of the layout (json t) to the header hdr at *off, its shape scaled by scale;
 * describes it in *out and advances *off.
 */
static int add_tensor(json_t *hdr, json_t *t, size_t i, const char *layout_path, double scale,
                      bool gguf, ddo_dtype quant, lt *out, uint64_t *off, char *err, size_t err_len)
{
    json_t *jn = json_object_get(t, "name"), *js = json_object_get(t, "shape"),
           *jd = json_object_get(t, "dtype");
    if (!json_is_string(jn) || !json_is_array(js) || !json_is_string(jd)) {
        return tool_fail(err, err_len, DDO_E_FORMAT,
                         "%s: tensor %zu: needs \"name\", \"shape\" and \"dtype\"", layout_path, i);
    }
    const char *name = json_string_value(jn);
    if (strcmp(name, "__metadata__") == 0 || json_object_get(hdr, name) != NULL) {
        return tool_fail(err, err_len, DDO_E_FORMAT, "%s: tensor \"%s\": duplicate name",
                         layout_path, name);
    }
    ddo_dtype dt;
    if (ddo_dtype_from_name(json_string_value(jd), &dt) != 0) {
        return tool_fail(err, err_len, DDO_E_FORMAT, "%s: tensor \"%s\": unknown dtype \"%s\"",
                         layout_path, name, json_string_value(jd));
    }
    int rc = check_dtype(dt, gguf, layout_path, name, err, err_len);
    if (rc != 0)
        return rc;
    if (json_array_size(js) > (gguf ? 4u : (size_t)DDO_MAX_DIMS))
        return tool_fail(err, err_len, DDO_E_FORMAT, "%s: tensor \"%s\": too many dimensions",
                         layout_path, name);
    *out = (lt){ .name = name, .dtype = dt, .ndim = (uint32_t)json_array_size(js) };
    json_t *shape = json_array();
    uint64_t numel = 1, dim0 = 1;
    for (size_t k = 0; k < json_array_size(js); k++) {
        json_t *d = json_array_get(js, k);
        if (!json_is_integer(d) || json_integer_value(d) < 0) {
            json_decref(shape);
            return tool_fail(err, err_len, DDO_E_FORMAT,
                             "%s: tensor \"%s\": shape entries must be non-negative integers",
                             layout_path, name);
        }
        uint64_t v = (uint64_t)json_integer_value(d);
        if (scale < 1.0 && v > 0) {
            double s = nearbyint((double)v * scale);
            v = s < 1.0 ? 1 : (uint64_t)s;
        }
        out->shape[k] = v;
    }
    /* --quant: 2-D float weights whose rows are whole blocks take the block type */
    size_t qblock = gguf && quant != DDO_DTYPE_COUNT ? ddo_dtype_block(quant, NULL) : 0;
    if (qblock != 0 && out->ndim == 2 && out->shape[1] % qblock == 0 &&
        (dt == DDO_DTYPE_BF16 || dt == DDO_DTYPE_F16 || dt == DDO_DTYPE_F32))
        dt = out->dtype = quant;
    uint64_t nb = tensor_bytes(dt, out->ndim, out->shape);
    for (uint32_t k = 0; k < out->ndim; k++) {
        numel *= out->shape[k];
        dim0 = k == 0 && out->ndim > 1 ? out->shape[k] : dim0;
        json_array_append_new(shape, json_integer((json_int_t)out->shape[k]));
    }
    if (gguf)
        *off = (*off + TOOL_GGUF_ALIGNMENT - 1) / TOOL_GGUF_ALIGNMENT * TOOL_GGUF_ALIGNMENT;
    json_t *e = json_object();
    json_object_set_new(e, "dtype", json_string(ddo_dtype_name(dt)));
    json_object_set_new(e, "shape", shape);
    json_t *offs = json_array();
    json_array_append_new(offs, json_integer((json_int_t)*off));
    json_array_append_new(offs, json_integer((json_int_t)(*off + nb)));
    json_object_set_new(e, "data_offsets", offs);
    json_object_set_new(hdr, name, e);
    out->esize = ddo_dtype_size(dt);
    out->nbytes = nb;
    out->fan_in = dim0 ? numel / dim0 : 0;
    out->offset = *off;
    *off += nb;
    return 0;
}

/* Writes the 8-byte length and the header padded with spaces to `padded` bytes; -1 with errno. */
static int put_header(int fd, const char *header, size_t hlen, size_t padded)
{
    uint8_t b[64];
    uint64_t hl = padded;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(hl >> (8 * i));
    if (write_all(fd, b, 8) != 0 || write_all(fd, (const uint8_t *)header, hlen) != 0)
        return -1;
    memset(b, ' ', sizeof b);
    for (size_t left = padded - hlen; left > 0;) {
        size_t k = left < sizeof b ? left : sizeof b;
        if (write_all(fd, b, k) != 0)
            return -1;
        left -= k;
    }
    return 0;
}

/*
 * The data section is cut into pieces of SYNTH_PIECE_BYTES, filled by `threads` workers (each
 * takes the next piece) into a ring of threads + 2 buffers and written in order by the calling
 * thread with write() (so --out may be a FIFO): the bytes of a piece depend only on its place,
 * not on which worker filled it, so the file is the same for any thread count.
 */
#define SYNTH_PIECE_BYTES ((size_t)8 << 20)
#define SYNTH_MAX_THREADS 256u /* (threads + 2) pieces in memory: at most about 2 GiB */

typedef struct synth_pipe {
    const lt *ts;
    size_t n;
    uint64_t seed, data_bytes, pieces;
    ddo_tool_values values;
    uint8_t **buf;
    uint64_t *done; /* per buffer: 1 + the piece it holds, filled */
    size_t nbuf;
    ddo__mutex mu;
    ddo__cond cv;
    uint64_t next, written; /* the next piece to claim; the pieces written */
    bool stop;
    bool gaps; /* the tensors do not tile the data section */
} synth_pipe;

/* Fills piece p (bytes [p * piece, ...) of the data section) into dst. */
static void fill_piece(const synth_pipe *sp, uint64_t p, uint8_t *dst)
{
    uint64_t a = p * SYNTH_PIECE_BYTES, b = a + SYNTH_PIECE_BYTES;
    b = b > sp->data_bytes ? sp->data_bytes : b;
    if (sp->gaps) /* padding between tensors (a .gguf's alignment) reads as zeros */
        memset(dst, 0, (size_t)(b - a));
    size_t lo = 0, hi = sp->n; /* the last tensor starting at or before a */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (sp->ts[mid].offset <= a)
            lo = mid;
        else
            hi = mid;
    }
    for (size_t i = lo; i < sp->n && sp->ts[i].offset < b; i++) {
        const lt *t = &sp->ts[i];
        uint64_t t0 = t->offset > a ? t->offset : a, t1 = t->offset + t->nbytes;
        t1 = t1 < b ? t1 : b;
        if (t1 <= t0)
            continue;
        fill_kind fk = { t->dtype, sp->values,
                         1.0 / sqrt((double)(t->fan_in > 1 ? t->fan_in : 1)) };
        uint64_t state = sp->seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(i + 1));
        splitmix64(&state);
        fill_range(dst + (t0 - a), &fk, state, t0 - t->offset, t1 - t->offset);
    }
}

static void *synth_worker(void *arg)
{
    synth_pipe *sp = arg;
    ddo__mutex_lock(&sp->mu);
    while (!sp->stop && sp->next < sp->pieces) {
        uint64_t p = sp->next;
        if (p >= sp->written + sp->nbuf) { /* its buffer still holds an unwritten piece */
            ddo__cond_wait(&sp->cv, &sp->mu);
            continue;
        }
        sp->next++;
        ddo__mutex_unlock(&sp->mu);
        fill_piece(sp, p, sp->buf[p % sp->nbuf]);
        ddo__mutex_lock(&sp->mu);
        sp->done[p % sp->nbuf] = p + 1;
        ddo__cond_broadcast(&sp->cv);
    }
    ddo__mutex_unlock(&sp->mu);
    return NULL;
}

/* Writes the pieces in order as the workers fill them; -1 with errno. */
static int synth_write_pieces(int fd, synth_pipe *sp)
{
    for (uint64_t p = 0; p < sp->pieces; p++) {
        size_t slot = (size_t)(p % sp->nbuf);
        ddo__mutex_lock(&sp->mu);
        while (sp->done[slot] != p + 1)
            ddo__cond_wait(&sp->cv, &sp->mu);
        ddo__mutex_unlock(&sp->mu);
        uint64_t left = sp->data_bytes - p * SYNTH_PIECE_BYTES;
        size_t len = left < SYNTH_PIECE_BYTES ? (size_t)left : SYNTH_PIECE_BYTES;
        int rc = write_all(fd, sp->buf[slot], len);
        ddo__mutex_lock(&sp->mu);
        sp->written = p + 1;
        sp->stop = rc != 0;
        ddo__cond_broadcast(&sp->cv);
        ddo__mutex_unlock(&sp->mu);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* Writes the values of the n tensors ts (data_bytes in all) on `threads` workers; -1 with
 * errno (ENOMEM when no buffer or worker could be had). */
static int write_values(int fd, const lt *ts, size_t n, uint64_t data_bytes, uint64_t seed,
                        ddo_tool_values values, unsigned threads, bool gaps)
{
    synth_pipe sp = { .ts = ts, .n = n, .seed = seed, .values = values, .data_bytes = data_bytes };
    sp.gaps = gaps;
    sp.pieces = (data_bytes + SYNTH_PIECE_BYTES - 1) / SYNTH_PIECE_BYTES;
    if (sp.pieces == 0)
        return 0;
    threads = threads == 0 ? 1 : threads;
    if ((uint64_t)threads > sp.pieces)
        threads = (unsigned)sp.pieces;
    sp.nbuf = (size_t)threads + 2;
    sp.buf = calloc(sp.nbuf, sizeof(*sp.buf));
    sp.done = calloc(sp.nbuf, sizeof(*sp.done));
    ddo__thread *tid = calloc(threads, sizeof(*tid));
    bool ok = sp.buf != NULL && sp.done != NULL && tid != NULL;
    for (size_t i = 0; ok && i < sp.nbuf; i++)
        ok = (sp.buf[i] = malloc(SYNTH_PIECE_BYTES)) != NULL;
    unsigned started = 0;
    int rc = -1, saved = ENOMEM;
    if (ok) {
        ddo__mutex_init(&sp.mu);
        ddo__cond_init(&sp.cv);
        while (started < threads && ddo__thread_create(&tid[started], synth_worker, &sp) == 0)
            started++;
        if (started > 0) { /* fewer workers than asked for give the same bytes */
            rc = synth_write_pieces(fd, &sp);
            saved = errno;
        }
        ddo__mutex_lock(&sp.mu);
        sp.stop = true;
        ddo__cond_broadcast(&sp.cv);
        ddo__mutex_unlock(&sp.mu);
        for (unsigned t = 0; t < started; t++)
            ddo__thread_join(tid[t]);
        ddo__cond_destroy(&sp.cv);
        ddo__mutex_destroy(&sp.mu);
    }
    for (size_t i = 0; sp.buf != NULL && i < sp.nbuf; i++)
        free(sp.buf[i]);
    free(sp.buf);
    free(sp.done);
    free(tid);
    errno = saved;
    return rc;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The header of a .gguf output: the architecture and the synth description as metadata. */
static int gguf_header(const lt *ts, size_t n, const char *arch, const char *desc, uint8_t **out,
                       size_t *len)
{
    tool_gguf_tensor *t = calloc(n, sizeof(*t));
    if (t == NULL)
        return DDO_E_NO_MEMORY;
    for (size_t i = 0; i < n; i++)
        t[i] = (tool_gguf_tensor){ ts[i].name, ts[i].dtype, ts[i].ndim, ts[i].shape, ts[i].offset };
    const char *keys[] = { "general.architecture", "ddo.synth" };
    const char *values[] = { arch, desc };
    int rc = tool_gguf_header(keys, values, 2, t, n, out, len);
    free(t);
    return rc;
}

/* The synth's description, kept in the file's metadata. */
static void describe(char *desc, size_t len, const json_t *arch, double scale, uint64_t seed,
                     ddo_tool_values values, ddo_dtype quant)
{
    snprintf(desc, len, "layout=%s scale=%g seed=%llu%s%s%s",
             json_is_string(arch) ? json_string_value(arch) : "?", scale, (unsigned long long)seed,
             values == DDO_TOOL_VALUES_NORMAL ? " values=normal" : "",
             quant != DDO_DTYPE_COUNT ? " quant=" : "",
             quant != DDO_DTYPE_COUNT ? ddo_dtype_name(quant) : "");
}

/* The header bytes (*len): a .gguf's, or the safetensors JSON of hdr; NULL when out of
 * memory. */
static char *make_header(bool gguf, const lt *ts, size_t n, const char *arch, const char *desc,
                         const json_t *hdr, size_t *len)
{
    uint8_t *gh = NULL;
    if (gguf)
        return gguf_header(ts, n, arch, desc, &gh, len) == 0 ? (char *)gh : NULL;
    char *text = json_dumps(hdr, JSON_COMPACT);
    *len = text != NULL ? strlen(text) : 0;
    return text;
}

int ddo_tool_synth_values(const char *layout_path, const char *out_path, double scale,
                          uint64_t seed, ddo_tool_values values, unsigned threads, ddo_dtype quant,
                          uint64_t *bytes_written, char *err, size_t err_len)
{
    if (layout_path == NULL || out_path == NULL || !(scale > 0.0) || scale > 1.0)
        return tool_fail(err, err_len, DDO_E_INVALID_ARGUMENT,
                         "synth: a layout, an output path and 0 < scale <= 1 are required");
    /* A layout is a regular file of at most 64 MiB, opened without blocking (a FIFO would
     * hang json_load_file). */
    char *text = tool_read_file(layout_path, (size_t)64 << 20);
    if (text == NULL) {
        char q[512];
        tool_quote(layout_path, q, sizeof(q));
        return tool_fail(err, err_len, errno == ENOENT ? DDO_E_NOT_FOUND : DDO_E_FORMAT, "%s: %s",
                         q,
                         errno == EINVAL  ? "not a regular file (a FIFO, socket or device)"
                         : errno == EFBIG ? "larger than 64 MiB (the layout limit)"
                                          : strerror(errno));
    }
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (root == NULL)
        return tool_fail(err, err_len, DDO_E_FORMAT, "%s: line %d: %s", layout_path, jerr.line,
                         jerr.text);
    int rc = 0, fd = -1, tmp_slot = -1;
    bool created = false, gguf = ends_with(out_path, ".gguf");
    char tmp_path[4200];
    char *header = NULL;
    lt *ts = NULL;
    json_t *hdr = json_object(), *meta = json_object();
    json_t *tensors = json_object_get(root, "tensors");
    json_t *arch = json_object_get(root, "architecture");
    size_t n = json_array_size(tensors);
    if (!json_is_array(tensors) || n == 0) {
        rc = tool_fail(err, err_len, DDO_E_FORMAT, "%s: \"tensors\" must be a non-empty array",
                       layout_path);
        goto out;
    }
    ts = calloc(n, sizeof(*ts));
    if (ts == NULL || hdr == NULL || meta == NULL) {
        rc = tool_fail(err, err_len, DDO_E_NO_MEMORY, "synth: out of memory");
        goto out;
    }
    char desc[256];
    describe(desc, sizeof(desc), arch, scale, seed, values, quant);
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(meta, "ddo_synth", json_string(desc));
    json_object_set(hdr, "__metadata__", meta);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        rc = add_tensor(hdr, json_array_get(tensors, i), i, layout_path, scale, gguf, quant, &ts[i],
                        &off, err, err_len);
        if (rc != 0)
            goto out;
    }
    size_t hlen = 0;
    header = make_header(gguf, ts, n, json_is_string(arch) ? json_string_value(arch) : "?", desc,
                         hdr, &hlen);
    if (header == NULL) {
        rc = tool_fail(err, err_len, DDO_E_NO_MEMORY, "synth: out of memory");
        goto out;
    }
    size_t padded = gguf ? hlen : (hlen + 7) / 8 * 8;
    if (threads == 0) {
        long ncpu = tool_ncpu();
        threads = ncpu > 1 ? (unsigned)ncpu : 1;
    }
    threads = threads > SYNTH_MAX_THREADS ? SYNTH_MAX_THREADS : threads;
    /* The bytes go to a temporary name beside out_path, renamed over it at the end: an
     * interrupted synth leaves an existing out_path intact (and a signal removes the
     * temporary file, see cleanup.h). A path that exists and is not a regular file
     * (/dev/null, a FIFO) is written in place: a rename would replace the node itself. */
    struct stat ost;
    bool in_place = stat(out_path, &ost) == 0 && !S_ISREG(ost.st_mode);
    if (snprintf(tmp_path, sizeof tmp_path, in_place ? "%s" : "%s.%ld.tmp", out_path,
                 (long)getpid()) >= (int)sizeof tmp_path) {
        rc = tool_fail(err, err_len, DDO_E_INVALID_ARGUMENT, "%s: path too long", out_path);
        goto out;
    }
    /* Registered before it is created: a signal between the open and the registration
     * would leave the file behind (the name holds this process's id, so nothing else's). */
    tmp_slot = in_place ? -1 : tool_cleanup_add(tmp_path, false);
    fd = in_place ? open(out_path, O_WRONLY | O_CLOEXEC)
                  : open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        rc = tool_fail(err, err_len, DDO_E_IO, "%s: %s", tmp_path, strerror(errno));
        goto out;
    }
    created = !in_place;
    if ((gguf ? write_all(fd, (const uint8_t *)header, hlen)
              : put_header(fd, header, hlen, padded)) != 0 ||
        write_values(fd, ts, n, off, seed, values, threads, gguf) != 0)
        goto io_fail;
    if (close(fd) != 0) {
        fd = -1;
        goto io_fail;
    }
    fd = -1;
    if (!in_place && tool_rename(tmp_path, out_path) != 0) {
        rc = tool_fail(err, err_len, DDO_E_IO, "%s: rename from %s: %s", out_path, tmp_path,
                       strerror(errno));
        goto out;
    }
    created = false;
    if (bytes_written != NULL)
        *bytes_written = (gguf ? 0 : 8) + padded + off;
    goto out;
io_fail:
    rc = tool_fail(err, err_len, DDO_E_IO, "%s: write: %s", out_path, strerror(errno));
out:
    if (fd >= 0)
        close(fd);
    if (created)
        unlink(tmp_path);
    tool_cleanup_forget(tmp_slot);
    free(header);
    free(ts);
    json_decref(meta);
    json_decref(hdr);
    json_decref(root);
    return rc;
}

int ddo_tool_synth(const char *layout_path, const char *out_path, double scale, uint64_t seed,
                   uint64_t *bytes_written, char *err, size_t err_len)
{
    return ddo_tool_synth_values(layout_path, out_path, scale, seed, DDO_TOOL_VALUES_UNIFORM, 0,
                                 DDO_DTYPE_COUNT, bytes_written, err, err_len);
}

const char *ddo_tool_default_layout(void)
{
#ifdef DDO_SOURCE_DIR
    static const char path[] = DDO_SOURCE_DIR "/data/layouts/flux1-dev.json";
    if (access(path, R_OK) == 0)
        return path;
#endif
    return NULL;
}
