/*
 * inspect_codec.c - `ddo inspect --codec PATH [--json] [--threads N]`: what the weight codec
 * (DDOC v1, docs/codec.md) would make of a checkpoint. Every tensor is read and coded with
 * the library's encoder (ddo__codec_encode, src/codec/codec.h: the one internal header the tool
 * uses) on N workers, each holding one tensor and its coded scratch at a time; a tensor of a
 * coded dtype is counted coded when its stream is smaller than its bytes and raw otherwise,
 * as the session's store keeps it (src/store/source_codec.c); every other dtype counts raw.
 * Printed: coded/raw per dtype, per block group (the planner's prefixes; "(root)" for the rest), in
 * total, the ratio over the coded dtypes (what `ddo plan --codec-ratio` takes) and the time.
 * --verify also decodes every stream with the C reference decoder, compares it with the
 * tensor and prints the decoder's throughput per thread.
 */
#include "inspect_codec.h"
#include "compat.h"
#include "tool.h"

#include "codec/codec.h"
#include "os/thread.h"

#include <ctype.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct ic_tensor {
    uint64_t coded;  /* the bytes as the store would keep them */
    bool coded_kept; /* the coded stream was smaller */
} ic_tensor;

typedef struct ic_run {
    const ddo_checkpoint *ck;
    size_t n;
    bool verify;
    ic_tensor *res;
    ddo__mutex mu;
    size_t next;
    int rc;
    char err[512];
    uint64_t decode_ns, decoded, verified; /* --verify: summed over the workers */
} ic_run;

/* A worker's buffers: the tensor, its coded stream, its decoded copy (--verify). */
typedef struct ic_scratch {
    uint8_t *buf[3];
    size_t cap[3];
} ic_scratch;

static uint8_t *scratch(ic_scratch *s, int k, uint64_t bytes)
{
    if (s->cap[k] < bytes) {
        free(s->buf[k]);
        s->cap[k] = 0;
        if ((s->buf[k] = malloc((size_t)bytes)) == NULL)
            return NULL;
        s->cap[k] = (size_t)bytes;
    }
    return s->buf[k];
}

/* --verify: decodes the stream of tensor t with the C reference decoder (what the cpu device
 * runs) and compares it with the tensor's bytes. */
static int verify_one(ic_run *r, const ddo_tensor_info *t, ic_scratch *s, uint64_t coded, char *err,
                      size_t err_len)
{
    uint8_t *out = scratch(s, 2, t->nbytes);
    if (out == NULL)
        return tool_fail(err, err_len, DDO_E_NO_MEMORY, "out of memory for %s", t->name);
    ddo__errbuf eb;
    eb.msg[0] = '\0';
    uint64_t t0 = tool_now_ns();
    int rc = ddo__codec_decode(s->buf[1], coded, out, t->nbytes, t->name, &eb);
    uint64_t dt = tool_now_ns() - t0;
    if (rc != 0)
        return tool_fail(err, err_len, rc, "%s", eb.msg[0] ? eb.msg : ddo_strerror(rc));
    if (memcmp(out, s->buf[0], (size_t)t->nbytes) != 0)
        return tool_fail(err, err_len, DDO_E_INTERNAL,
                         "codec: tensor %s: decoded bytes differ from the tensor's", t->name);
    ddo__mutex_lock(&r->mu);
    r->decode_ns += dt;
    r->decoded += t->nbytes;
    r->verified++;
    ddo__mutex_unlock(&r->mu);
    return 0;
}

/* Codes tensor i into the worker's scratch; 0 or a DDO_E_* code with the message in err. */
static int code_one(ic_run *r, size_t i, ic_scratch *s, char *err, size_t err_len)
{
    const ddo_tensor_info *t = ddo_checkpoint_tensor(r->ck, i);
    r->res[i] = (ic_tensor){ t->nbytes, false };
    uint64_t bound = ddo__codec_bound(t->dtype, t->nbytes, 0);
    if (t->nbytes == 0 || !ddo__codec_codes_dtype(t->dtype) || bound == 0)
        return 0;
    if (scratch(s, 0, t->nbytes) == NULL || scratch(s, 1, bound) == NULL)
        return tool_fail(err, err_len, DDO_E_NO_MEMORY, "out of memory for %s", t->name);
    if (ddo_checkpoint_read(r->ck, i, 0, s->buf[0], (size_t)t->nbytes) != 0)
        return tool_fail(err, err_len, DDO_E_IO, "%s", ddo_last_error());
    ddo__codec_params p = { 0, 1 };
    ddo__errbuf eb;
    eb.msg[0] = '\0';
    uint64_t coded = 0;
    int rc = ddo__codec_encode(s->buf[0], t->nbytes, t->dtype, &p, s->buf[1], bound, &coded,
                               t->name, &eb);
    if (rc != 0)
        return tool_fail(err, err_len, rc, "%s", eb.msg[0] ? eb.msg : ddo_strerror(rc));
    if (coded < t->nbytes)
        r->res[i] = (ic_tensor){ coded, true };
    return r->verify ? verify_one(r, t, s, coded, err, err_len) : 0;
}

static void *ic_worker(void *arg)
{
    ic_run *r = arg;
    ic_scratch s;
    memset(&s, 0, sizeof(s));
    char err[512];
    for (;;) {
        ddo__mutex_lock(&r->mu);
        size_t i = r->rc == 0 ? r->next++ : r->n;
        ddo__mutex_unlock(&r->mu);
        if (i >= r->n)
            break;
        int rc = code_one(r, i, &s, err, sizeof err);
        if (rc != 0) {
            ddo__mutex_lock(&r->mu);
            if (r->rc == 0) {
                r->rc = rc;
                snprintf(r->err, sizeof r->err, "%s", err);
            }
            ddo__mutex_unlock(&r->mu);
        }
    }
    for (int k = 0; k < 3; k++)
        free(s.buf[k]);
    return NULL;
}

/* The block group of name: the index of the group whose prefix.N it starts with, else ng. */
static size_t group_of(const ddo_checkpoint *ck, const char *name)
{
    size_t ng = ddo_checkpoint_block_group_count(ck), best = ng, best_len = 0;
    for (size_t g = 0; g < ng; g++) {
        const char *pre = ddo_checkpoint_block_group(ck, g)->prefix;
        size_t len = strlen(pre);
        if (strncmp(name, pre, len) != 0 || name[len] != '.' ||
            !isdigit((unsigned char)name[len + 1]) || len < best_len)
            continue;
        size_t k = len + 1;
        while (isdigit((unsigned char)name[k]))
            k++;
        if (name[k] == '.' || name[k] == '\0') {
            best = g;
            best_len = len;
        }
    }
    return best;
}

typedef struct ic_sum {
    size_t tensors, kept_raw; /* kept_raw: tensors of a coded dtype that stay raw */
    uint64_t raw, coded;
} ic_sum;

static double ratio_of(const ic_sum *s)
{
    return s->raw > 0 ? (double)s->coded / (double)s->raw : 1.0;
}

static void add_to(ic_sum *s, const ddo_tensor_info *t, const ic_tensor *r)
{
    s->tensors++;
    s->raw += t->nbytes;
    s->coded += r->coded;
    s->kept_raw += ddo__codec_codes_dtype(t->dtype) && !r->coded_kept && t->nbytes > 0;
}

static json_t *sum_json(const char *key, const char *name, const ic_sum *s)
{
    return json_pack("{s:s, s:I, s:I, s:I, s:I, s:f}", key, name, "tensors", (json_int_t)s->tensors,
                     "raw_bytes", (json_int_t)s->raw, "coded_bytes", (json_int_t)s->coded,
                     "kept_raw", (json_int_t)s->kept_raw, "ratio", ratio_of(s));
}

static void sum_line(const char *name, const ic_sum *s)
{
    printf("%-28s %8zu %16" PRIu64 " %16" PRIu64 " %8.4f %9zu\n", name, s->tensors, s->raw,
           s->coded, ratio_of(s), s->kept_raw);
}

/* Prints the sums (human table or JSON). */
static int ic_print(const ddo_checkpoint *ck, const ic_run *r, unsigned threads, double secs,
                    bool json)
{
    size_t ng = ddo_checkpoint_block_group_count(ck);
    ic_sum dt[DDO_DTYPE_COUNT] = { 0 }, total = { 0 }, codable = { 0 };
    ic_sum *gs = calloc(ng + 1, sizeof(*gs));
    if (gs == NULL)
        return -1;
    for (size_t i = 0; i < r->n; i++) {
        const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, i);
        add_to(&dt[t->dtype], t, &r->res[i]);
        add_to(&gs[group_of(ck, t->name)], t, &r->res[i]);
        add_to(&total, t, &r->res[i]);
        if (ddo__codec_codes_dtype(t->dtype))
            add_to(&codable, t, &r->res[i]);
    }
    double gbps = secs > 0 ? (double)total.raw / secs / 1e9 : 0.0;
    double dec_gbps = r->decode_ns > 0 ? (double)r->decoded / (double)r->decode_ns : 0.0;
    if (json) {
        json_t *o =
            json_pack("{s:s, s:I, s:f, s:f, s:f}", "codec", "ddoc1", "threads", (json_int_t)threads,
                      "seconds", secs, "gb_per_s", gbps, "codec_ratio", ratio_of(&codable));
        json_t *ad = json_array(), *ag = json_array();
        for (int d = 0; d < DDO_DTYPE_COUNT; d++)
            if (dt[d].tensors > 0)
                json_array_append_new(ad, sum_json("dtype", ddo_dtype_name((ddo_dtype)d), &dt[d]));
        for (size_t g = 0; g <= ng; g++)
            if (gs[g].tensors > 0)
                json_array_append_new(
                    ag,
                    sum_json("group", g < ng ? ddo_checkpoint_block_group(ck, g)->prefix : "(root)",
                             &gs[g]));
        json_object_set_new(o, "dtypes", ad);
        json_object_set_new(o, "groups", ag);
        json_object_set_new(o, "total", sum_json("name", "total", &total));
        if (r->verify) {
            json_object_set_new(o, "verified_streams", json_integer((json_int_t)r->verified));
            json_object_set_new(o, "decoder_gb_per_s_per_thread", json_real(dec_gbps));
        }
        char *text = json_dumps(o, JSON_INDENT(2));
        json_decref(o);
        if (text != NULL)
            printf("%s\n", text);
        free(text);
        free(gs);
        return text != NULL ? 0 : -1;
    }
    printf("codec ddoc1: %zu tensors coded on %u threads in %.3f s (%.2f GB/s of raw bytes)\n",
           r->n, threads, secs, gbps);
    printf("\n%-28s %8s %16s %16s %8s %9s\n", "DTYPE", "TENSORS", "RAW BYTES", "CODED BYTES",
           "RATIO", "KEPT RAW");
    for (int d = 0; d < DDO_DTYPE_COUNT; d++)
        if (dt[d].tensors > 0)
            sum_line(ddo_dtype_name((ddo_dtype)d), &dt[d]);
    printf("\n%-28s %8s %16s %16s %8s %9s\n", "GROUP", "TENSORS", "RAW BYTES", "CODED BYTES",
           "RATIO", "KEPT RAW");
    for (size_t g = 0; g <= ng; g++)
        if (gs[g].tensors > 0)
            sum_line(g < ng ? ddo_checkpoint_block_group(ck, g)->prefix : "(root)", &gs[g]);
    sum_line("total", &total);
    printf("\ncodec_ratio %.4f (coded / raw over the BF16, F16, F32 and FP8 tensors; "
           "ddo plan --codec-ratio takes it)\n",
           ratio_of(&codable));
    if (r->verify)
        printf("verify: %" PRIu64 " coded streams decoded by the C reference decoder, "
               "bit-identical; %.2f GB/s of decoded bytes per thread (the cpu device's decoder; "
               "ddo plan --decode-gbps)\n",
               r->verified, dec_gbps);
    free(gs);
    return 0;
}

int ddo_tool_inspect_codec(const ddo_checkpoint *ck, unsigned threads, bool verify, bool json)
{
    if (threads == 0) {
        long ncpu = tool_ncpu();
        threads = ncpu > 1 ? (unsigned)ncpu : 1;
    }
    ic_run r = { .ck = ck, .n = ddo_checkpoint_tensor_count(ck), .verify = verify };
    if ((size_t)threads > r.n)
        threads = r.n > 0 ? (unsigned)r.n : 1;
    r.res = calloc(r.n > 0 ? r.n : 1, sizeof(*r.res));
    ddo__thread *tid = calloc(threads, sizeof(*tid));
    if (r.res == NULL || tid == NULL) {
        free(r.res);
        free(tid);
        fprintf(stderr, "ddo inspect: out of memory\n");
        return DDO_EXIT_FAILURE;
    }
    ddo__mutex_init(&r.mu);
    uint64_t t0 = tool_now_ns();
    unsigned started = 0;
    while (started < threads && ddo__thread_create(&tid[started], ic_worker, &r) == 0)
        started++;
    if (started == 0)
        ic_worker(&r);
    for (unsigned t = 0; t < started; t++)
        ddo__thread_join(tid[t]);
    double secs = (double)(tool_now_ns() - t0) * 1e-9;
    ddo__mutex_destroy(&r.mu);
    free(tid);
    int rc = DDO_EXIT_OK;
    if (r.rc != 0) {
        fprintf(stderr, "ddo inspect: %s\n", r.err);
        rc = DDO_EXIT_FAILURE;
    } else if (ic_print(ck, &r, started > 0 ? started : 1, secs, json) != 0) {
        fprintf(stderr, "ddo inspect: out of memory\n");
        rc = DDO_EXIT_FAILURE;
    }
    free(r.res);
    return rc;
}
