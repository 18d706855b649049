/*
 * test_session_codec.c - the weight codec through sessions (weight_codec, docs/codec.md), on
 * the cpu device whose C decoder is the reference: every route with weight_codec=ddoc1 and
 * auto, registered and pageable retained bytes, delivers bytes identical to the raw ones
 * while the store holds coded bytes and the bus carries them; the plan's decision and budget
 * accounting; tensors that do not shrink stay raw; a corrupted coded stream fails the load
 * naming the tensor; faults injected into the encoder, the decode and the copies around it
 * end in clean errors with every account back at zero. Batches: a unit of many coded tensors
 * decodes in fewer launches than tensors (codec_launches), batches split at the batch size,
 * at a full area and never at a raw tensor, a corrupted middle tensor of a batch is named,
 * the status comes back by one asynchronous copy per load. An FP8 checkpoint is coded
 * whole-byte the same way.
 *
 * ctest-labels: unit threads
 */
#include "session_fx.h"

#include "session/session_codec.h"
#include "store/source.h"
#include "store/source_codec.h"

static const char *const routes[] = { "linear_runtime", "vmm_fast_runtime", "vmm_runtime" };

static fx_opts codec_opts(const char *route, const char *codec, bool pin, int slots)
{
    fx_opts o = { .blocks = 4, .slots = slots, .mode = route, .file = true, .cache_gb = 1 };
    o.pin = pin;
    o.weight_codec = codec;
    o.trained = true;
    return o;
}

/* Raw bytes of the streamed tensors of every unit (what the decoder writes per step). */
static uint64_t streamed_bytes(fx *f)
{
    uint64_t sum = 0;
    for (size_t u = 0; u < ddo_plan_unit_count(f->plan); u++) {
        size_t n = 0;
        const size_t *ts = ddo_plan_unit_tensors(f->plan, u, &n);
        for (size_t k = 0; k < n; k++) {
            ddo_tensor_location loc;
            if (ddo_plan_tensor_location(f->plan, ts[k], &loc) == 0 &&
                loc.placement == DDO_PLACEMENT_STREAMED)
                sum += loc.nbytes;
        }
    }
    return sum;
}

/* One session of o with the codec on a route that retains (linear_runtime, vmm_fast_runtime). */
static void coded_case_of(const char *what, int slots, fx_opts o)
{
    fx f;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_CHECK_MSG(f.rc == 0, "%s", what);
    T_REQUIRE(f.rc == 0);
    T_EQ_STR(ddo__plan_decision_get(f.plan, "weight_codec"), "ddoc1");
    ddo_plan_info info = DDO_PLAN_INFO_INIT;
    T_EQ_INT(ddo_plan_info_get(f.plan, &info), 0);
    T_EQ_INT(info.weight_codec, DDO_WEIGHT_CODEC_DDOC1);
    double raw = fx_metric(&f, "setup_encode_bytes");
    double coded = fx_metric(&f, "setup_coded_bytes");
    T_CHECK_MSG(raw == (double)streamed_bytes(&f) && coded > 0 && coded < raw, "%s: %g -> %g", what,
                raw, coded);
    T_CHECK(fx_metric(&f, "setup_codec_raw_tensors") == 0);
    fx_two_steps(&f, what);
    /* the figures are read with no upload in flight: the window's prefetch after the last
     * acquire may still be copying (its bytes counted in one metric and not yet the other) */
    T_CHECK(ddo_session_synchronize(f.s) == 0);
    double decoded = fx_metric(&f, "bytes_decoded");
    double bus = fx_metric(&f, "bytes_coded_uploaded");
    if (slots >= f.o.blocks) { /* every unit loads once: exact figures */
        T_CHECK_MSG(fx_metric(&f, "uploads") == f.o.blocks, "%s: uploads", what);
        T_CHECK_MSG(decoded == raw && bus == coded, "%s: decoded %g of %g, bus %g of %g", what,
                    decoded, raw, bus, coded);
        T_CHECK(fx_metric(&f, "codec_decodes") == 2.0 * f.o.blocks);
    }
    T_CHECK_MSG(bus > 0 && bus < decoded, "%s: bus %g decoded %g", what, bus, decoded);
    /* Every checked load's decodes are timed: their bytes and device time (the profile table
     * shows the throughput); loads prefetched and never acquired are not checked, not timed. */
    double timed = fx_metric(&f, "codec_decode_timed_bytes");
    T_CHECK_MSG(timed > 0 && timed <= decoded, "%s: timed %g of %g", what, timed, decoded);
    if (slots >= f.o.blocks)
        T_CHECK_MSG(timed == decoded, "%s: timed %g of %g", what, timed, decoded);
    T_CHECK_MSG(fx_metric(&f, "codec_decode_ns") > 0, "%s: no decode time", what);
    T_CHECK_MSG(fx_metric(&f, "copy_bytes") == bus + fx_metric(&f, "bytes_resident_uploaded"),
                "%s: copy_bytes", what);
    T_CHECK(fx_metric(&f, "bytes_from_registered") == 0);
    T_CHECK(fx_metric(&f, "bytes_staged_from_retained") == 0);
    fx_destroy(&f);
}

static void coded_case(const char *route, const char *codec, int pin, int slots)
{
    char what[96];
    snprintf(what, sizeof(what), "%s %s pin=%d slots=%d", route, codec, pin, slots);
    coded_case_of(what, slots, codec_opts(route, codec, pin != 0, slots));
}

/* An FP8 checkpoint (every tensor F8_E4M3, the block weights Gaussian scaled to E4M3's range):
 * its streamed weights are coded whole-byte, the bus carries fewer bytes than the decoder
 * writes, and every step's bytes are identical to the file's (fx_two_steps checks each byte),
 * from a file and from a caller's host tensors (what the Python binding builds). */
static void test_fp8_checkpoint_is_coded(void)
{
    static const char *const codecs[] = { "ddoc1", "auto" };
    for (size_t r = 0; r < 2; r++)
        for (size_t c = 0; c < DDO_ARRAY_LEN(codecs); c++)
            for (int file = 0; file < 2; file++)
                for (int slots = 2; slots <= 4; slots += 2) {
                    char what[96];
                    snprintf(what, sizeof(what), "FP8 %s %s file=%d slots=%d", routes[r], codecs[c],
                             file, slots);
                    fx_opts o = codec_opts(routes[r], codecs[c], c == 0, slots);
                    o.fp8 = true;
                    o.file = file != 0;
                    o.cols = 1024; /* 64 x 1024 bytes: two groups of 32,768 */
                    coded_case_of(what, slots, o);
                }
    /* Random bytes (one tensor) and fx_byte patterns of FP8 stay raw where coding does not pay,
     * delivered bit for bit beside the coded ones. */
    fx f;
    fx_opts o = codec_opts("vmm_fast_runtime", "ddoc1", false, 4);
    o.fp8 = true;
    o.cols = 1024;
    o.random_tensor = "blocks.1.ff.weight";
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    T_EQ_STR(ddo__plan_decision_get(f.plan, "weight_codec"), "ddoc1");
    T_CHECK(fx_metric(&f, "setup_codec_raw_tensors") == 1);
    size_t t = fx_tensor(&f, "blocks.1.ff.weight");
    T_CHECK(ddo__source_coded(f.s->source, t) == NULL);
    T_CHECK(ddo__source_coded(f.s->source, fx_tensor(&f, "blocks.1.attn.weight")) != NULL);
    fx_two_steps(&f, "FP8 random tensor");
    T_CHECK(ddo_session_synchronize(f.s) == 0);
    T_CHECK(fx_metric(&f, "bytes_coded_uploaded") < fx_metric(&f, "bytes_decoded"));
    fx_destroy(&f);
}

static void test_every_route_is_bit_identical(void)
{
    static const char *const codecs[] = { "ddoc1", "auto" };
    for (size_t r = 0; r < 2; r++)
        for (size_t c = 0; c < DDO_ARRAY_LEN(codecs); c++)
            for (int pin = 0; pin < 2; pin++) {
                coded_case(routes[r], codecs[c], pin, 4);
                coded_case(routes[r], codecs[c], pin, 2); /* slots reused, area reused */
            }
    /* vmm_runtime keeps no retained store (it re-reads the file): nothing to code, bytes
     * raw; auto says so, ddoc1 notes it. */
    for (size_t c = 0; c < DDO_ARRAY_LEN(codecs); c++) {
        fx f;
        fx_opts o = codec_opts("vmm_runtime", codecs[c], false, 2);
        T_REQUIRE(fx_create(&f, &o) == 0);
        T_REQUIRE(f.rc == 0);
        T_EQ_STR(ddo__plan_decision_get(f.plan, "weight_codec"), c == 0 ? "ddoc1" : "none");
        ddo_plan_info info = DDO_PLAN_INFO_INIT;
        T_EQ_INT(ddo_plan_info_get(f.plan, &info), 0);
        T_EQ_INT(info.weight_codec, c == 0 ? DDO_WEIGHT_CODEC_DDOC1 : DDO_WEIGHT_CODEC_NONE);
        T_CHECK(ddo__plan_decision_get(f.plan, "weight_codec_note") != NULL);
        fx_two_steps(&f, "vmm_runtime");
        T_CHECK(fx_metric(&f, "bytes_decoded") == 0);
        T_CHECK(fx_metric(&f, "bytes_staged_from_file") > 0);
        fx_destroy(&f);
    }
}

/* A coded tensor whose stored bytes change after setup (one flipped bit at many places): the
 * load fails naming it, or (a bit of padding the decoder never reads) delivers the right
 * bytes; never wrong weights. Restored, the same session loads it bit for bit. */
static void test_corrupted_stream_is_detected(void)
{
    for (int pin = 0; pin < 2; pin++) {
        fx f;
        fx_opts o = codec_opts("vmm_fast_runtime", "ddoc1", pin != 0, 2);
        T_REQUIRE(fx_create(&f, &o) == 0);
        T_REQUIRE(f.rc == 0);
        size_t t = fx_tensor(&f, "blocks.2.ff.weight");
        const ddo__codec_plan *cp = ddo__source_coded(f.s->source, t);
        T_REQUIRE(cp != NULL);
        unsigned char *p = (unsigned char *)(uintptr_t)ddo__source_host_ptr(f.s->source, t, NULL);
        T_REQUIRE(p != NULL);
        size_t tried = 0, detected = 0;
        for (size_t at = 7; at < cp->coded_bytes; at += 509) {
            p[at] ^= (unsigned char)(1u << (at % 8));
            size_t u = fx_unit(&f, 2);
            int rc = ddo_session_acquire(f.s, u, f.stream);
            tried++;
            if (rc == DDO_E_FORMAT) {
                detected++;
                T_CONTAINS(ddo_session_error(f.s), "blocks.2.ff.weight");
            } else {
                T_CHECK_MSG(rc == 0, "pin=%d byte %zu: %s", pin, at, ddo_errname(rc));
                T_REQUIRE(ddo_stream_synchronize(f.stream) == 0);
                T_CHECK_MSG(fx_check_unit(&f, u, 0) == 0, "pin=%d byte %zu: wrong weights", pin,
                            at);
                (void)ddo_session_release(f.s, u, f.stream);
            }
            p[at] ^= (unsigned char)(1u << (at % 8));
            T_CHECK(fx_use(&f, u) == 0);
            /* evict it, so the next acquire decodes again */
            T_CHECK(fx_use(&f, fx_unit(&f, 0)) == 0);
            T_CHECK(fx_use(&f, fx_unit(&f, 1)) == 0);
        }
        fprintf(stderr, "  pin=%d: %zu of %zu flips detected\n", pin, detected, tried);
        T_CHECK_MSG(tried > 40 && detected * 10 >= tried * 9, "pin=%d: %zu of %zu detected", pin,
                    detected, tried);
        fx_destroy(&f);
    }
}

/* Calls of op in a clean run of two steps with the codec. */
static uint64_t clean_calls(const fx_opts *o, ddo__devop op)
{
    fx f;
    if (fx_create(&f, o) != 0 || f.rc != 0) {
        T_CHECK_MSG(false, "clean run");
        return 0;
    }
    ddo__device_stats_reset(f.dev);
    fx_two_steps(&f, "clean");
    ddo__devop_stats st[DDO__OP_COUNT];
    ddo__device_stats(f.dev, st);
    fx_destroy(&f);
    return st[op].calls;
}

/* Faults in the decode, the copies around it and the status read-back: a clean error naming
 * what failed, the session usable afterwards, every account at zero after release. */
static void test_faults_during_decode(void)
{
    static const ddo__devop ops[] = { DDO__OP_CODEC_DECODE, DDO__OP_COPY_H2D, DDO__OP_COPY_D2H,
                                      DDO__OP_STREAM_SYNCHRONIZE, DDO__OP_COPY_D2H_ASYNC };
    for (int pin = 0; pin < 2; pin++)
        for (size_t k = 0; k < DDO_ARRAY_LEN(ops); k++) {
            fx_opts o = codec_opts("linear_runtime", "ddoc1", pin != 0, 2);
            uint64_t calls = clean_calls(&o, ops[k]);
            T_CHECK_MSG(calls > 0, "%s", ddo__devop_name(ops[k]));
            for (uint64_t nth = 1; nth <= calls && nth <= 24; nth++) {
                fx f;
                T_REQUIRE(fx_create(&f, &o) == 0);
                T_REQUIRE(f.rc == 0);
                ddo__device_inject_fault(f.dev, ops[k], nth, false, DDO_E_DEVICE);
                int failed = 0;
                for (int step = 0; step < 2; step++)
                    for (int b = 0; b < f.o.blocks; b++) {
                        int rc = fx_use(&f, fx_unit(&f, b));
                        T_CHECK_MSG(rc == 0 || rc == DDO_E_DEVICE || rc == FX_HOST_FAILED,
                                    "%s nth=%llu: %d %s", ddo__devop_name(ops[k]),
                                    (unsigned long long)nth, rc, ddo_session_error(f.s));
                        failed += rc != 0;
                    }
                ddo__device_clear_faults(f.dev);
                for (int b = 0; b < f.o.blocks; b++) /* usable again, bit for bit */
                    T_CHECK_MSG(fx_use(&f, fx_unit(&f, b)) == 0, "%s nth=%llu after",
                                ddo__devop_name(ops[k]), (unsigned long long)nth);
                uint64_t used[4];
                ddo__session_accounts(f.s, used);
                T_CHECK(used[1] > 0); /* the coded store */
                T_EQ_U64(ddo__session_release_all(f.s), 0);
                ddo__session_accounts(f.s, used);
                for (int a = 0; a < 4; a++)
                    T_EQ_U64(used[a], 0);
                fx_destroy(&f); /* checks the device holds nothing */
                (void)failed;
            }
        }
}

/* A failing encoder at setup: the session is refused with the tensor named, nothing held. */
static void test_faults_during_encode(void)
{
    for (uint64_t nth = 1; nth <= 8; nth++) {
        fx f;
        fx_opts o = codec_opts("vmm_fast_runtime", "ddoc1", nth % 2 == 0, 2);
        ddo__source_codec_fault_nth(nth);
        T_REQUIRE(fx_create(&f, &o) == 0);
        ddo__source_codec_fault_nth(0);
        T_CHECK_MSG(f.rc == DDO_E_IO, "nth=%llu: %s", (unsigned long long)nth, ddo_errname(f.rc));
        T_CONTAINS(ddo_last_error(), "injected fault");
        T_CONTAINS(ddo_last_error(), "blocks.");
        T_CHECK(f.s == NULL);
        fx_destroy(&f);
    }
}

/* A tensor coding does not shrink (random bits) stays raw; the rest is coded. */
static void test_incompressible_tensor_stays_raw(void)
{
    fx f;
    fx_opts o = codec_opts("linear_runtime", "auto", true, 2);
    o.trained = false; /* fx_byte patterns: bytes, not weights */
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    double raw_tensors = fx_metric(&f, "setup_codec_raw_tensors");
    double coded = fx_metric(&f, "setup_encode_bytes");
    for (size_t t = 0; t < ddo_checkpoint_tensor_count(f.ck); t++) {
        const ddo__codec_plan *cp = ddo__source_coded(f.s->source, t);
        T_CHECK(cp == NULL || cp->coded_bytes < cp->decoded_bytes);
    }
    T_CHECK_MSG(raw_tensors + (coded > 0 ? 1 : 0) > 0, "raw %g coded %g", raw_tensors, coded);
    fx_two_steps(&f, "incompressible");
    T_CHECK(fx_metric(&f, "bytes_from_registered") + fx_metric(&f, "bytes_coded_uploaded") > 0);
    fx_destroy(&f);
}

/* A checkpoint of a caller's host tensors (what the Python binding builds): with the codec
 * each tensor that shrinks is coded into the session's own store and the caller's bytes are
 * never read again (poisoned here after setup, the loads stay exact); one that does not
 * shrink is copied into the store raw, so it is the session's too (the resident ones stay the
 * caller's). ddo_session_tensor_read_host gives back every tensor's bytes exactly; the plan's
 * retained and registered peaks hold, and the registered one is the store's segments plus the
 * residents' in-place registration (no in-place share for the coded tensors). */
static void host_memory_case(const char *route, bool pin, const char *random_tensor)
{
    char what[96];
    snprintf(what, sizeof(what), "host memory %s pin=%d %s", route, pin,
             random_tensor != NULL ? random_tensor : "");
    fx f;
    fx_opts o = codec_opts(route, "ddoc1", pin, 2);
    o.file = false;
    o.random_tensor = random_tensor;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_CHECK_MSG(f.rc == 0, "%s", what);
    T_REQUIRE(f.rc == 0);
    T_EQ_STR(ddo__plan_decision_get(f.plan, "retained_store"), "host_memory_coded");
    size_t owned_n = 0, in_place = 0;
    unsigned char *poisoned[FX_MAX_TENSORS] = { 0 };
    for (size_t t = 0; t < ddo_checkpoint_tensor_count(f.ck); t++) {
        size_t l = fx_local(&f, t);
        bool owned = true;
        T_EQ_INT(ddo_session_tensor_host_owned(f.s, t, &owned), 0);
        unsigned char *back = malloc(f.sizes[l]);
        T_REQUIRE(back != NULL);
        T_EQ_INT(ddo_session_tensor_read_host(f.s, t, back, f.sizes[l] - 1),
                 DDO_E_INVALID_ARGUMENT);
        T_EQ_INT(ddo_session_tensor_read_host(f.s, t, back, f.sizes[l]), 0);
        T_CHECK_MSG(memcmp(back, f.bytes[l], f.sizes[l]) == 0, "%s: %s read back", what,
                    f.names[l]);
        ddo_tensor_location loc;
        T_REQUIRE(ddo_plan_tensor_location(f.plan, t, &loc) == 0);
        if (loc.placement != DDO_PLACEMENT_STREAMED)
            T_CHECK_MSG(!owned, "%s: %s is served in place", what, f.names[l]);
        else
            T_CHECK_MSG(owned, "%s: %s is the session's", what, f.names[l]);
        const ddo__codec_plan *cp = ddo__source_coded(f.s->source, t);
        if (random_tensor != NULL && strcmp(f.names[l], random_tensor) == 0)
            T_CHECK_MSG(cp == NULL, "%s: %s is stored raw", what, f.names[l]);
        if (owned) { /* the caller frees its copy: the test keeps it, poisoned */
            poisoned[l] = f.bytes[l];
            f.bytes[l] = back;
            memset(poisoned[l], 0xA5, f.sizes[l]);
            owned_n++;
        } else {
            in_place += loc.placement == DDO_PLACEMENT_STREAMED ? 1 : 0;
            free(back);
        }
    }
    T_CHECK_MSG(owned_n == 2u * (size_t)f.o.blocks, "%s: %zu", what, owned_n);
    T_CHECK_MSG(in_place == 0, "%s: in place %zu", what, in_place);
    T_CHECK_MSG(fx_metric(&f, "setup_codec_raw_tensors") == (random_tensor != NULL ? 1 : 0),
                "%s: %g kept raw", what, fx_metric(&f, "setup_codec_raw_tensors"));
    fx_two_steps(&f, what);
    T_CHECK_MSG(fx_metric(&f, "bytes_decoded") > 0, "%s: nothing decoded", what);
    ddo_plan_budgets b;
    T_REQUIRE(ddo_plan_budgets_get(f.plan, &b) == 0);
    T_CHECK_MSG(fx_metric(&f, "retained_peak_bytes") <= (double)b.retained_peak &&
                    fx_metric(&f, "retained_peak_bytes") > 0,
                "%s: retained peak %g of %llu", what, fx_metric(&f, "retained_peak_bytes"),
                (unsigned long long)b.retained_peak);
    T_CHECK_MSG(fx_metric(&f, "registered_peak_bytes") <= (double)b.registered_peak,
                "%s: registered peak %g of %llu", what, fx_metric(&f, "registered_peak_bytes"),
                (unsigned long long)b.registered_peak);
    /* registered: the store's one segment and the residents' arena page, not also the
     * in-place share of the coded tensors (8 of 32 KiB) */
    T_CHECK_MSG(b.registered_peak == 0 || b.registered_peak <= DDO_SEGMENT_BYTES + 16384,
                "%s: registered %llu", what, (unsigned long long)b.registered_peak);
    fx_destroy(&f);
    for (size_t l = 0; l < FX_MAX_TENSORS; l++)
        free(poisoned[l]);
}

static void test_host_memory_is_coded(void)
{
    for (size_t r = 0; r < 2; r++)
        for (int pin = 0; pin < 2; pin++) {
            host_memory_case(routes[r], pin != 0, NULL);
            host_memory_case(routes[r], pin != 0, "blocks.1.attn.weight");
        }
    /* vmm_runtime keeps no store of its own: the caller's tensors move raw, with a note. */
    fx f;
    fx_opts o = codec_opts("vmm_runtime", "ddoc1", false, 2);
    o.file = false;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    T_EQ_STR(ddo__plan_decision_get(f.plan, "retained_store"), "host_memory");
    T_CONTAINS(ddo__plan_decision_get(f.plan, "weight_codec_note"), "nothing to code");
    fx_two_steps(&f, "host memory vmm_runtime");
    T_CHECK(fx_metric(&f, "bytes_decoded") == 0);
    fx_destroy(&f);
    /* Errors, and a file checkpoint's tensor the store does not hold. */
    o = codec_opts("vmm_fast_runtime", "ddoc1", false, 2);
    o.cache_gb = 0;
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    bool owned = true;
    unsigned char buf[8];
    size_t t = fx_tensor(&f, "blocks.0.attn.weight");
    T_EQ_INT(ddo_session_tensor_host_owned(f.s, t, &owned), 0);
    T_CHECK(!owned);
    unsigned char *big = malloc(1u << 20);
    T_REQUIRE(big != NULL);
    T_EQ_INT(ddo_session_tensor_read_host(f.s, t, big, 1u << 20), DDO_E_NOT_FOUND);
    free(big);
    T_CONTAINS(ddo_session_error(f.s), "blocks.0.attn.weight");
    T_EQ_INT(ddo_session_tensor_host_owned(f.s, 999, &owned), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_session_tensor_read_host(NULL, t, buf, 8), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_session_tensor_host_owned(f.s, t, NULL), DDO_E_INVALID_ARGUMENT);
    fx_destroy(&f);
    /* A failing encoder on host tensors: refused, the tensor named, nothing held. */
    o = codec_opts("linear_runtime", "ddoc1", true, 2);
    o.file = false;
    ddo__source_codec_fault_nth(3);
    T_REQUIRE(fx_create(&f, &o) == 0);
    ddo__source_codec_fault_nth(0);
    T_EQ_INT(f.rc, DDO_E_IO);
    T_CONTAINS(ddo_last_error(), "injected fault");
    fx_destroy(&f);
}

/* The plan: the decode memory in the device peak (two areas of the largest unit's stream
 * bounds, a status part per slot), the encoder's buffer in the retained peak. */
static void test_plan_accounting(void)
{
    fx a, b;
    fx_opts o = codec_opts("linear_runtime", "none", false, 2);
    o.no_session = true;
    T_REQUIRE(fx_create(&a, &o) == 0);
    o.weight_codec = "ddoc1";
    T_REQUIRE(fx_create(&b, &o) == 0);
    ddo_plan_budgets ba, bb;
    T_REQUIRE(ddo_plan_budgets_get(a.plan, &ba) == 0);
    T_REQUIRE(ddo_plan_budgets_get(b.plan, &bb) == 0);
    /* the largest weight: blocks.3.ff.weight, [67, 128] F32, one block; the largest unit:
     * blocks.3 with it and attn.weight [64, 128]: one area holds both (a batch per unit) */
    uint64_t bound = 67 * 128 * 4 + 64 + 56, attn = 64 * 128 * 4 + 64 + 56;
    uint64_t area = 2 * ((bound + 255) / 256 * 256 + (attn + 255) / 256 * 256) +
                    2 * 256 /* two slots, each two tensors' status: 32 bytes */;
    T_EQ_U64(bb.device_weights_peak, ba.device_weights_peak + area);
    T_EQ_U64(bb.retained_peak, ba.retained_peak + (bound + 255) / 256 * 256);
    T_EQ_U64(bb.registered_peak, ba.registered_peak);
    T_CHECK(ddo__plan_decision_get(b.plan, "codec_decode_area_gb") != NULL);
    T_EQ_STR(ddo__plan_decision_get(b.plan, "codec_decode_areas"), "2");
    fx_destroy(&a);
    fx_destroy(&b);
}

/* Calls of op since the last reset. */
static uint64_t op_calls(fx *f, ddo__devop op)
{
    ddo__devop_stats st[DDO__OP_COUNT];
    ddo__device_stats(f->dev, st);
    return st[op].calls;
}

/* The plan's tensors of unit u that the store coded, in upload order. */
static size_t coded_of_unit(fx *f, size_t u, const ddo__codec_plan **out, size_t cap)
{
    size_t n = 0, k = 0;
    const size_t *ts = ddo_plan_unit_tensors(f->plan, u, &n);
    for (size_t i = 0; i < n; i++) {
        const ddo__codec_plan *cp = ddo__source_coded(f->s->source, ts[i]);
        if (cp != NULL && k < cap)
            out[k++] = cp;
    }
    return k;
}

/* Launches the session's packing gives unit u with areas of area bytes: tensors in order
 * while their coded bytes (256-byte aligned) fit, at most DDO_CODEC_BATCH_MAX a batch. */
static size_t expected_launches(fx *f, size_t u, uint64_t area)
{
    const ddo__codec_plan *cp[FX_MAX_TENSORS];
    size_t n = coded_of_unit(f, u, cp, FX_MAX_TENSORS), launches = 0, count = 0;
    uint64_t used = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t need = (cp[i]->coded_bytes + 255) / 256 * 256;
        if (count == 0 || used + need > area || count == DDO_CODEC_BATCH_MAX) {
            launches++;
            used = count = 0;
        }
        used += need;
        count++;
    }
    return launches;
}

/* A unit of many coded tensors decodes in one launch per load (linear and vmm_fast routes,
 * registered and pageable retained bytes), bit for bit; the status comes back by one
 * asynchronous copy per load (no synchronous read-back by the session); the device memory
 * the session holds is the plan's figure exactly. */
static void test_batches_fewer_launches(void)
{
    for (size_t r = 0; r < 2; r++)
        for (int pin = 0; pin < 2; pin++) {
            char what[96];
            snprintf(what, sizeof(what), "%s pin=%d", routes[r], pin);
            fx f;
            fx_opts o = codec_opts(routes[r], "ddoc1", pin != 0, 4);
            o.weights = 8;
            T_REQUIRE(fx_create(&f, &o) == 0);
            T_REQUIRE(f.rc == 0);
            T_REQUIRE(fx_metric(&f, "setup_codec_raw_tensors") == 0);
            ddo_plan_budgets b;
            T_REQUIRE(ddo_plan_budgets_get(f.plan, &b) == 0);
            uint64_t used[4];
            ddo__session_accounts(f.s, used);
            if (r == 0) /* linear: every slot backed, the decode memory allocated */
                T_CHECK_MSG(used[0] == b.device_weights_peak, "%s: device %llu, plan %llu", what,
                            (unsigned long long)used[0], (unsigned long long)b.device_weights_peak);
            ddo__device_stats_reset(f.dev);
            fx_two_steps(&f, what); /* every lease checked byte for byte */
            double loads = fx_metric(&f, "uploads");
            T_CHECK_MSG(loads == f.o.blocks, "%s: %g loads", what, loads);
            T_CHECK_MSG(fx_metric(&f, "codec_decodes") == 8.0 * loads, "%s: decodes %g", what,
                        fx_metric(&f, "codec_decodes"));
            T_CHECK_MSG(fx_metric(&f, "codec_launches") == loads, "%s: launches %g for %g loads",
                        what, fx_metric(&f, "codec_launches"), loads);
            T_EQ_U64(op_calls(&f, DDO__OP_CODEC_DECODE), (uint64_t)loads);
            T_EQ_U64(op_calls(&f, DDO__OP_COPY_D2H_ASYNC), (uint64_t)loads);
            /* the only synchronous read-backs: the fixture's own checks of every lease */
            T_EQ_U64(op_calls(&f, DDO__OP_COPY_D2H), 2 * 8 * (uint64_t)f.o.blocks);
            fx_destroy(&f);
        }
}

/* Batches split where they must: more coded tensors than one batch takes, coded bytes over
 * the area (areas capped for the test), and a raw tensor in the middle of a unit goes by the
 * raw transport without splitting its unit's batch. Bit for bit throughout. */
static void test_batches_split(void)
{
    for (size_t r = 0; r < 2; r++) {
        /* 50 coded tensors a unit: a full batch of 48, then 2 */
        fx f;
        fx_opts o = codec_opts(routes[r], "ddoc1", r == 0, 2);
        o.blocks = 2;
        o.weights = 50;
        T_REQUIRE(fx_create(&f, &o) == 0);
        T_REQUIRE(f.rc == 0);
        fx_two_steps(&f, "50 weights");
        double loads = fx_metric(&f, "uploads");
        T_CHECK(loads == 2);
        T_CHECK_MSG(fx_metric(&f, "codec_launches") == 2 * loads, "launches %g",
                    fx_metric(&f, "codec_launches"));
        T_CHECK(fx_metric(&f, "codec_decodes") == 50 * loads);
        fx_destroy(&f);

        /* areas of 64 KiB: two or so coded tensors a batch */
        ddo__session_codec_test_area_cap(64 * 1024);
        o = codec_opts(routes[r], "ddoc1", r != 0, 4);
        o.weights = 8;
        T_REQUIRE(fx_create(&f, &o) == 0);
        ddo__session_codec_test_area_cap(0);
        T_REQUIRE(f.rc == 0);
        size_t want = 0;
        for (int b = 0; b < f.o.blocks; b++)
            want += expected_launches(&f, fx_unit(&f, b), 64 * 1024);
        T_CHECK_MSG(want > (size_t)f.o.blocks && want < 8 * (size_t)f.o.blocks, "%zu", want);
        fx_two_steps(&f, "64 KiB areas");
        T_CHECK_MSG(fx_metric(&f, "codec_launches") == (double)want, "launches %g, want %zu",
                    fx_metric(&f, "codec_launches"), want);
        T_CHECK(fx_metric(&f, "codec_decodes") == 8.0 * f.o.blocks);
        fx_destroy(&f);

        /* a raw (random-bits) tensor in the middle of blocks.1 */
        for (int pin = 0; pin < 2; pin++) {
            o = codec_opts(routes[r], "ddoc1", pin != 0, 4);
            o.weights = 8;
            o.random_tensor = "blocks.1.w3.weight";
            T_REQUIRE(fx_create(&f, &o) == 0);
            T_REQUIRE(f.rc == 0);
            size_t t = fx_tensor(&f, "blocks.1.w3.weight"), n = 0, at = SIZE_MAX;
            const size_t *ts = ddo_plan_unit_tensors(f.plan, fx_unit(&f, 1), &n);
            for (size_t k = 0; k < n; k++)
                at = ts[k] == t ? k : at;
            T_CHECK_MSG(at > 0 && at + 1 < n, "position %zu of %zu", at, n);
            T_CHECK(ddo__source_coded(f.s->source, t) == NULL);
            T_CHECK(fx_metric(&f, "setup_codec_raw_tensors") == 1);
            fx_two_steps(&f, "raw in the middle");
            T_CHECK(fx_metric(&f, "uploads") == f.o.blocks);
            T_CHECK(fx_metric(&f, "codec_launches") == f.o.blocks); /* not split by it */
            T_CHECK(fx_metric(&f, "codec_decodes") == 8.0 * f.o.blocks - 1);
            /* by a raw transport (registered or pageable: the store registers what fits) */
            double raw = fx_metric(&f, "bytes_from_registered") +
                         fx_metric(&f, "bytes_staged_from_retained");
            T_CHECK_MSG(raw == 64.0 * FX_COLS * 4, "pin=%d: %g raw bytes", pin, raw);
            fx_destroy(&f);
        }
    }
}

/* A corrupted tensor in the middle of a batch fails the acquire naming it (no other tensor of
 * the batch); the other units stay usable, and once restored it loads bit for bit. */
static void test_corrupted_middle_of_batch(void)
{
    for (size_t r = 0; r < 2; r++) {
        fx f;
        fx_opts o = codec_opts(routes[r], "ddoc1", r == 1, 2);
        o.weights = 8;
        T_REQUIRE(fx_create(&f, &o) == 0);
        T_REQUIRE(f.rc == 0);
        size_t t = fx_tensor(&f, "blocks.2.w3.weight");
        const ddo__codec_plan *cp = ddo__source_coded(f.s->source, t);
        T_REQUIRE(cp != NULL);
        unsigned char *p = (unsigned char *)(uintptr_t)ddo__source_host_ptr(f.s->source, t, NULL);
        T_REQUIRE(p != NULL);
        uint64_t at = cp->blocks[0].coded_offset + cp->blocks[0].coded_bytes / 2;
        p[at] ^= 0x10;
        size_t u = fx_unit(&f, 2);
        T_EQ_INT(ddo_session_acquire(f.s, u, f.stream), DDO_E_FORMAT);
        T_CONTAINS(ddo_session_error(f.s), "blocks.2.w3.weight");
        T_CHECK(strstr(ddo_session_error(f.s), "w2.weight") == NULL &&
                strstr(ddo_session_error(f.s), "w4.weight") == NULL);
        T_CHECK(fx_metric(&f, "codec_launches") >= 1);
        p[at] ^= 0x10; /* restored before anything prefetches blocks.2 again */
        T_CHECK(fx_use(&f, fx_unit(&f, 1)) == 0);
        T_CHECK(fx_use(&f, u) == 0);
        T_EQ_U64(ddo__session_release_all(f.s), 0);
        fx_destroy(&f);
    }
}

/* Faults in the batched decode and the asynchronous status copy of a unit of many coded
 * tensors: each fails its load cleanly (never a lease of unverified weights), the session is
 * usable again bit for bit, and every account ends at zero. */
static void test_faults_in_batches(void)
{
    static const ddo__devop ops[] = { DDO__OP_CODEC_DECODE, DDO__OP_COPY_D2H_ASYNC,
                                      DDO__OP_STREAM_WAIT_EVENT, DDO__OP_EVENT_RECORD };
    for (size_t k = 0; k < DDO_ARRAY_LEN(ops); k++)
        for (uint64_t nth = 1; nth <= 6; nth++) {
            fx f;
            fx_opts o = codec_opts("vmm_fast_runtime", "ddoc1", nth % 2 == 0, 2);
            o.weights = 8;
            T_REQUIRE(fx_create(&f, &o) == 0);
            T_REQUIRE(f.rc == 0);
            ddo__device_inject_fault(f.dev, ops[k], nth, false, DDO_E_DEVICE);
            int failed = 0;
            for (int b = 0; b < f.o.blocks; b++) {
                int rc = fx_use(&f, fx_unit(&f, b));
                T_CHECK_MSG(rc == 0 || rc == DDO_E_DEVICE || rc == FX_HOST_FAILED,
                            "%s nth=%llu: %d %s", ddo__devop_name(ops[k]), (unsigned long long)nth,
                            rc, ddo_session_error(f.s));
                failed += rc != 0;
            }
            /* one launch and one status copy per load, at least one load per unit: the fault
             * fired once (a prefetch it failed is loaded again by its acquire) */
            ddo__devop_stats st[DDO__OP_COUNT];
            ddo__device_stats(f.dev, st);
            if ((ops[k] == DDO__OP_CODEC_DECODE || ops[k] == DDO__OP_COPY_D2H_ASYNC) &&
                nth <= (uint64_t)f.o.blocks)
                T_CHECK_MSG(st[ops[k]].failures == 1 && failed <= 1, "%s nth=%llu: %d failed",
                            ddo__devop_name(ops[k]), (unsigned long long)nth, failed);
            ddo__device_clear_faults(f.dev);
            for (int b = 0; b < f.o.blocks; b++)
                T_CHECK_MSG(fx_use(&f, fx_unit(&f, b)) == 0, "%s nth=%llu after",
                            ddo__devop_name(ops[k]), (unsigned long long)nth);
            T_EQ_U64(ddo__session_release_all(f.s), 0);
            uint64_t used[4];
            ddo__session_accounts(f.s, used);
            for (int a = 0; a < 4; a++)
                T_EQ_U64(used[a], 0);
            fx_destroy(&f);
        }
}

int main(void)
{
    T_RUN(test_every_route_is_bit_identical);
    T_RUN(test_fp8_checkpoint_is_coded);
    T_RUN(test_corrupted_stream_is_detected);
    T_RUN(test_faults_during_decode);
    T_RUN(test_faults_during_encode);
    T_RUN(test_incompressible_tensor_stays_raw);
    T_RUN(test_host_memory_is_coded);
    T_RUN(test_plan_accounting);
    T_RUN(test_batches_fewer_launches);
    T_RUN(test_batches_split);
    T_RUN(test_corrupted_middle_of_batch);
    T_RUN(test_faults_in_batches);
    return t_done();
}
