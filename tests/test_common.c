/*
 * test_common.c - the helpers every module of src/ shares, one of each: overflow-checked and
 * saturating arithmetic (common.c), the byte formatters of messages and the device-spec parser
 * (text.c) and the string map with its FNV-1a hash (strmap.c).
 *
 * ctest-labels: unit
 */
#include "base/common.h"
#include "base/strmap.h"
#include "t.h"

static void test_checked_and_saturating(void)
{
    uint64_t r = 7;
    T_CHECK(ddo__add_u64(UINT64_MAX - 1, 1, &r));
    T_EQ_U64(r, UINT64_MAX);
    r = 7;
    T_CHECK(!ddo__add_u64(UINT64_MAX, 1, &r));
    T_EQ_U64(r, 7); /* not written on overflow */
    T_CHECK(ddo__mul_u64(UINT64_C(1) << 32, (UINT64_C(1) << 32) - 1, &r));
    T_EQ_U64(r, (UINT64_C(1) << 32) * ((UINT64_C(1) << 32) - 1));
    T_CHECK(!ddo__mul_u64(UINT64_C(1) << 32, UINT64_C(1) << 32, &r));
    T_CHECK(ddo__mul_u64(0, UINT64_MAX, &r) && r == 0);

    T_EQ_U64(ddo__sat_add_u64(2, 3), 5);
    T_EQ_U64(ddo__sat_add_u64(UINT64_MAX - 2, 2), UINT64_MAX);
    T_EQ_U64(ddo__sat_add_u64(UINT64_MAX - 2, 3), UINT64_MAX);
    T_EQ_U64(ddo__sat_add_u64(UINT64_MAX, UINT64_MAX), UINT64_MAX);
    T_EQ_U64(ddo__sat_mul_u64(3, 5), 15);
    T_EQ_U64(ddo__sat_mul_u64(0, UINT64_MAX), 0);
    T_EQ_U64(ddo__sat_mul_u64(UINT64_C(1) << 32, UINT64_C(1) << 32), UINT64_MAX);
    T_EQ_U64(ddo__sat_mul_u64(2, UINT64_MAX / 2 + 1), UINT64_MAX);

    T_EQ_U64(ddo__round_up(65, 64), 128);
    T_EQ_U64(ddo__round_up(128, 64), 128);
    T_EQ_U64(ddo__round_up(UINT64_MAX - 3, 64), UINT64_MAX);
}

static void test_format_bytes(void)
{
    char b[32];
    T_EQ_STR(ddo__format_bytes(0, b, sizeof(b)), "0 B");
    T_EQ_STR(ddo__format_bytes(1023, b, sizeof(b)), "1023 B");
    T_EQ_STR(ddo__format_bytes(3 * DDO_KIB, b, sizeof(b)), "3.00 KiB");
    T_EQ_STR(ddo__format_bytes(64 * DDO_MIB, b, sizeof(b)), "64.00 MiB");
    T_EQ_STR(ddo__format_bytes(DDO_GIB + DDO_GIB / 2, b, sizeof(b)), "1.50 GiB");
    /* GiB is the largest unit. */
    T_EQ_STR(ddo__format_bytes(2048 * DDO_GIB, b, sizeof(b)), "2048.00 GiB");
    /* GiB whatever the size. */
    T_EQ_STR(ddo__format_gib(DDO_GIB / 2, b, sizeof(b)), "0.50 GiB");
    T_EQ_STR(ddo__format_gib(0, b, sizeof(b)), "0.00 GiB");
    T_EQ_STR(ddo__format_gib(3 * DDO_GIB, b, sizeof(b)), "3.00 GiB");
    /* Cut to fit, always terminated. */
    char small[5];
    T_EQ_STR(ddo__format_bytes(64 * DDO_MIB, small, sizeof(small)), "64.0");
}

/* The one parser of device specs: cpu, cpu:N, cuda, cuda:N (N of 1 to 6 digits), nothing
 * else; a refused spec leaves *out as it was. */
static void test_device_spec(void)
{
    static const struct {
        const char *spec;
        bool cuda, numbered;
        int ordinal;
    } good[] = {
        { "cpu", false, false, 0 },
        { "cpu:0", false, true, 0 },
        { "cpu:3", false, true, 3 },
        { "cuda", true, false, 0 },
        { "cuda:0", true, true, 0 },
        { "cuda:7", true, true, 7 },
        { "cuda:012", true, true, 12 },
        { "cuda:999999", true, true, 999999 },
        { "cpu:123456", false, true, 123456 },
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        ddo__device_spec d = { false, false, -1 };
        T_CHECK(ddo__device_spec_parse(good[i].spec, &d));
        T_CHECK(d.cuda == good[i].cuda);
        T_CHECK(d.numbered == good[i].numbered);
        T_EQ_INT(d.ordinal, good[i].ordinal);
        T_CHECK(ddo__device_spec_parse(good[i].spec, NULL));
    }
    static const char *const bad[] = {
        "",        "gpu",      "cu",           "cpu:",        "cuda:",   "cuda:x",  "cuda:1x",
        "cuda0",   "cpu0",     "cudax",        "CPU",         "cuda:-1", "cuda:+1", " cuda:0",
        "cuda:0 ", "cuda:1:2", "cuda:1000000", "cpu:1234567", "cuda:\n", "mps",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ddo__device_spec d = { true, true, 42 };
        T_CHECK(!ddo__device_spec_parse(bad[i], &d));
        T_CHECK(d.cuda && d.numbered && d.ordinal == 42); /* untouched */
    }
    T_CHECK(!ddo__device_spec_parse(NULL, NULL));
    /* The one text every refusal carries, through the device and the configuration. */
    ddo_device *dev = NULL;
    T_EQ_INT(ddo_device_create("gpu:0", NULL, &dev), DDO_E_INVALID_ARGUMENT);
    T_CHECK(dev == NULL);
    T_EQ_STR(ddo_last_error(), "device \"gpu:0\": " DDO__DEVICE_SPEC_UNKNOWN);
    ddo_config *cfg = NULL;
    T_EQ_INT(ddo_config_create(&cfg), 0);
    T_EQ_INT(ddo_config_set(cfg, "devices", "cpu:0,cpu:x"), 0);
    T_EQ_INT(ddo_config_validate(cfg), DDO_E_CONFIG);
    T_CONTAINS(ddo_config_error(cfg), "\"cpu:x\": " DDO__DEVICE_SPEC_UNKNOWN);
    ddo_config_destroy(cfg);
}

static void test_fnv1a(void)
{
    /* The published FNV-1a 64 test vectors. */
    T_EQ_U64(ddo__fnv1a(DDO__FNV_BASIS, "", 0), UINT64_C(0xcbf29ce484222325));
    T_EQ_U64(ddo__fnv1a(DDO__FNV_BASIS, "a", 1), UINT64_C(0xaf63dc4c8601ec8c));
    T_EQ_U64(ddo__fnv1a(DDO__FNV_BASIS, "foobar", 6), UINT64_C(0x85944171f73967e8));
    /* Continued hashing equals hashing the concatenation. */
    T_EQ_U64(ddo__fnv1a(ddo__fnv1a(DDO__FNV_BASIS, "foo", 3), "bar", 3),
             ddo__fnv1a(DDO__FNV_BASIS, "foobar", 6));
}

static void test_strmap(void)
{
    ddo__strmap m = { NULL, 0, 0 };
    T_EQ_U64(ddo__strmap_get(&m, "x", 1), SIZE_MAX); /* zeroed: empty and valid */
    /* Keys are byte ranges: prefixes of one name are different keys. */
    const char *name = "transformer.blocks.0.attn.weight";
    T_EQ_U64(ddo__strmap_put(&m, name, 11, 1), 1);          /* "transformer" */
    T_EQ_U64(ddo__strmap_put(&m, name, 18, 2), 2);          /* "transformer.blocks" */
    T_EQ_U64(ddo__strmap_put(&m, "transformer", 11, 9), 1); /* present: the earlier value */
    T_EQ_U64(ddo__strmap_get(&m, "transformer.blocks", 18), 2);
    T_EQ_U64(ddo__strmap_get(&m, "transformer.blocks", 12), SIZE_MAX);
    T_EQ_U64(ddo__strmap_get(&m, "", 0), SIZE_MAX);
    T_EQ_U64(ddo__strmap_put(&m, "", 0, 3), 3); /* the empty key is a key */
    T_EQ_U64(ddo__strmap_get(&m, "", 0), 3);
    /* Growth keeps every entry (16 slots at first, kept at most half full). */
    static char keys[1000][8];
    for (size_t i = 0; i < 1000; i++) {
        snprintf(keys[i], sizeof(keys[i]), "k%zu", i);
        T_EQ_U64(ddo__strmap_put(&m, keys[i], strlen(keys[i]), 100 + i), 100 + i);
    }
    T_EQ_U64(m.count, 1003);
    T_CHECK(m.cap >= 2 * m.count && (m.cap & (m.cap - 1)) == 0);
    size_t bad = 0;
    for (size_t i = 0; i < 1000; i++)
        bad += ddo__strmap_get(&m, keys[i], strlen(keys[i])) != 100 + i;
    T_EQ_U64(bad, 0);
    T_EQ_U64(ddo__strmap_get(&m, "transformer", 11), 1);
    T_EQ_U64(ddo__strmap_get(&m, "k1000", 5), SIZE_MAX);
    ddo__strmap_free(&m);
    T_CHECK(m.slots == NULL && m.cap == 0 && m.count == 0);
    T_EQ_U64(ddo__strmap_get(&m, "k1", 2), SIZE_MAX); /* empty again */
    ddo__strmap_free(&m);                             /* twice: a no-op */
}

int main(void)
{
    T_RUN(test_checked_and_saturating);
    T_RUN(test_format_bytes);
    T_RUN(test_device_spec);
    T_RUN(test_fnv1a);
    T_RUN(test_strmap);
    return t_done();
}
