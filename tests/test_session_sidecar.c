/*
 * test_session_sidecar.c - the coded sidecar (weight_codec_cache_dir, docs/codec.md
 * "Sidecar") through sessions on the cpu device: the first setup codes the store and writes
 * the sidecar; the next setup on the same file takes the store from it (codec_store=sidecar,
 * codec_sidecar_hits) and delivers the same bytes; a changed checkpoint gets a new one; a
 * corrupted, truncated, foreign or oversized sidecar is ignored with a note naming it, the
 * store is coded the normal way and the bytes stay identical; an unwritable directory is a
 * note; faults while reading a sidecar end cleanly. An FP8 checkpoint's streams go through it too.
 *
 * ctest-labels: unit threads
 */
#include "session_fx.h"

#include "codec/codec_internal.h"
#include "store/source.h"
#include "store/source_sidecar.h"

#include <dirent.h>

static char cache[256];

static fx_opts side_opts(const char *route, bool pin, bool trained)
{
    fx_opts o = { .blocks = 4, .slots = 2, .mode = route, .file = true, .cache_gb = 1 };
    o.pin = pin;
    o.weight_codec = "ddoc1";
    o.trained = trained;
    o.codec_cache_dir = cache;
    return o;
}

/* A new session on the same plan, checkpoint and device (the old one destroyed). */
static void resession(fx *f)
{
    ddo_session_destroy(f->s);
    f->s = NULL;
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f->cfg;
    f->rc = ddo_session_create(f->plan, f->ck, f->dev, &so, &f->s);
    if (f->rc != 0)
        fprintf(stderr, "  session: %s\n", ddo_last_error());
}

/* Expects a setup that coded the store (no sidecar used), identical bytes. */
static void expect_encoded(fx *f, const char *what)
{
    char b[600];
    T_CHECK_MSG(f->rc == 0, "%s", what);
    T_REQUIRE(f->rc == 0);
    T_EQ_STR(fx_label(f, "codec_store", b, sizeof(b)), "encoded");
    T_CHECK_MSG(fx_metric(f, "codec_sidecar_hits") == 0, "%s", what);
    T_CHECK_MSG(fx_metric(f, "setup_encode_bytes") > 0, "%s", what);
    fx_two_steps(f, what);
}

/* Expects a setup that took the whole store from the sidecar, identical bytes. */
static void expect_sidecar(fx *f, const char *what)
{
    char b[600];
    T_CHECK_MSG(f->rc == 0, "%s", what);
    T_REQUIRE(f->rc == 0);
    T_EQ_STR(fx_label(f, "codec_store", b, sizeof(b)), "sidecar");
    T_EQ_STR(fx_label(f, "codec_sidecar_note", b, sizeof(b)), "");
    T_CHECK_MSG(fx_metric(f, "codec_sidecar_hits") == 2.0 * f->o.blocks, "%s: hits %g", what,
                fx_metric(f, "codec_sidecar_hits"));
    T_CHECK_MSG(fx_metric(f, "setup_encode_bytes") == 0, "%s: encoded again", what);
    T_CHECK_MSG(fx_metric(f, "codec_sidecar_written_bytes") == 0, "%s: rewritten", what);
    fx_two_steps(f, what);
}

/* First setup codes and writes; the second reads the sidecar: same store, same bytes. */
static void test_second_setup_uses_sidecar(void)
{
    static const char *const routes[] = { "linear_runtime", "vmm_fast_runtime" };
    for (size_t r = 0; r < DDO_ARRAY_LEN(routes); r++)
        for (int pin = 0; pin < 2; pin++) {
            char what[96];
            snprintf(what, sizeof(what), "%s pin=%d", routes[r], pin);
            fx_clear_sidecars(cache);
            fx f;
            fx_opts o = side_opts(routes[r], pin != 0, true);
            T_REQUIRE(fx_create(&f, &o) == 0);
            expect_encoded(&f, what);
            double coded = fx_metric(&f, "setup_coded_bytes");
            double written = fx_metric(&f, "codec_sidecar_written_bytes");
            T_CHECK_MSG(written > coded && written < coded + 3 * 4096 * 10, "%s: %g for %g", what,
                        written, coded);
            T_CHECK(fx_sidecars(cache, NULL, 0) == 1);
            uint64_t first[4], second[4];
            ddo__session_accounts(f.s, first);
            resession(&f);
            expect_sidecar(&f, what);
            T_CHECK_MSG(fx_metric(&f, "codec_sidecar_read_bytes") == coded, "%s: read %g of %g",
                        what, fx_metric(&f, "codec_sidecar_read_bytes"), coded);
            T_CHECK(fx_metric(&f, "bytes_coded_uploaded") > 0);
            /* laid out at the coded sizes: every stream is read into its final place */
            T_CHECK_MSG(fx_metric(&f, "setup_moved_bytes") == 0, "%s: %g bytes moved", what,
                        fx_metric(&f, "setup_moved_bytes"));
            ddo__session_accounts(f.s, second);
            for (int k = 0; k < 4; k++)
                T_EQ_U64(second[k], first[k]);
            fx_destroy(&f);
        }
}

/* An FP8 checkpoint (F8_E4M3 weights, whole-byte streams): the sidecar holds their streams and
 * the second setup takes the whole store from it, the same bytes delivered. */
static void test_fp8_sidecar(void)
{
    fx_clear_sidecars(cache);
    fx f;
    fx_opts o = side_opts("vmm_fast_runtime", false, true);
    o.fp8 = true;
    o.cols = 1024;
    T_REQUIRE(fx_create(&f, &o) == 0);
    expect_encoded(&f, "FP8 first");
    double coded = fx_metric(&f, "setup_coded_bytes"), raw = fx_metric(&f, "setup_encode_bytes");
    T_CHECK_MSG(coded > 0 && coded < 0.9 * raw, "FP8: %g of %g", coded, raw);
    T_CHECK(fx_sidecars(cache, NULL, 0) == 1);
    resession(&f);
    expect_sidecar(&f, "FP8 second");
    T_CHECK(fx_metric(&f, "codec_sidecar_read_bytes") == coded);
    fx_destroy(&f);
}

/* Tensors that coding does not shrink are kept raw in the table: not coded again. */
static void test_raw_entries(void)
{
    fx_clear_sidecars(cache);
    fx f;
    fx_opts o = side_opts("linear_runtime", true, false); /* byte patterns: some stay raw */
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    double raw = fx_metric(&f, "setup_codec_raw_tensors");
    fx_two_steps(&f, "raw first");
    resession(&f);
    T_REQUIRE(f.rc == 0);
    T_CHECK(fx_metric(&f, "codec_sidecar_hits") == 2.0 * f.o.blocks);
    T_CHECK(fx_metric(&f, "setup_codec_raw_tensors") == 0);
    T_CHECK(fx_metric(&f, "setup_encode_bytes") == 0);
    T_CHECK_MSG(raw > 0 || fx_metric(&f, "codec_sidecar_read_bytes") > 0, "raw %g", raw);
    fx_two_steps(&f, "raw second");
    fx_destroy(&f);
}

/* Reopens the checkpoint after rewriting its file (new identity) and plans again. */
static void rewrite_and_reopen(fx *f)
{
    ddo_session_destroy(f->s);
    f->s = NULL;
    ddo_plan_destroy(f->plan);
    f->plan = NULL;
    ddo_checkpoint_destroy(f->ck);
    f->ck = NULL;
    struct timespec pause = { 0, 20 * 1000 * 1000 };
    nanosleep(&pause, NULL); /* a later mtime on coarse clocks too */
    T_REQUIRE(fx_write_file(f) == 0);
    T_REQUIRE(ddo_checkpoint_create(f->path, DDO_READ_DEFAULT, &f->ck) == 0);
    ddo_plan_inputs in = fx_cpu_inputs(f->o.device_bytes, 8 * DDO_GIB);
    T_REQUIRE(ddo_plan_build(f->ck, f->cfg, &in, &f->plan) == 0);
    resession(f);
}

static void test_changed_checkpoint_gets_new_sidecar(void)
{
    fx_clear_sidecars(cache);
    fx f;
    fx_opts o = side_opts("vmm_fast_runtime", false, true);
    T_REQUIRE(fx_create(&f, &o) == 0);
    expect_encoded(&f, "first");
    rewrite_and_reopen(&f);
    expect_encoded(&f, "rewritten"); /* the old sidecar has another identity: not used */
    T_CHECK(fx_sidecars(cache, NULL, 0) == 2);
    resession(&f);
    expect_sidecar(&f, "rewritten, again");
    fx_destroy(&f);
}

/* Rewrites the sidecar's header and table hashes after a change (to reach later checks). */
static void rehash(uint8_t *b, size_t len)
{
    uint32_t n = ddo__codec_rd32(b + 20);
    uint64_t tb = (uint64_t)n * DDO__SIDECAR_ENTRY;
    if (DDO__SIDECAR_HEADER + tb <= len)
        ddo__codec_wr64(b + 112, ddo__sidecar_hash(b + DDO__SIDECAR_HEADER, tb, 0));
    ddo__codec_wr64(b + 120, ddo__sidecar_hash(b, 120, 0));
}

typedef enum { FLIP_STREAM, FLIP_HEADER, TRUNCATE, MAGIC, HUGE_LEN, HUGE_COUNT, OVERLAP } damage;

static void spoil(damage d)
{
    char path[600];
    T_REQUIRE(fx_sidecars(cache, path, sizeof(path)) == 1);
    FILE *fp = fopen(path, "rb");
    T_REQUIRE(fp != NULL);
    static uint8_t b[1 << 20];
    size_t len = fread(b, 1, sizeof(b), fp);
    fclose(fp);
    T_REQUIRE(len > 8192 && len < sizeof(b));
    uint8_t *e0 = b + DDO__SIDECAR_HEADER, *e1 = e0 + DDO__SIDECAR_ENTRY;
    switch (d) {
    case FLIP_STREAM:
        b[len - 100] ^= 0x10;
        break;
    case FLIP_HEADER:
        b[30] ^= 1;
        break;
    case TRUNCATE:
        len = len / 2;
        break;
    case MAGIC:
        b[0] = 'X';
        break;
    case HUGE_LEN:
        ddo__codec_wr64(e0 + 24, UINT64_MAX - 4096), rehash(b, len);
        break;
    case HUGE_COUNT:
        ddo__codec_wr32(b + 20, UINT32_MAX), rehash(b, len);
        break;
    case OVERLAP:
        memcpy(e1 + 16, e0 + 16, 8), rehash(b, len);
        break;
    }
    fp = fopen(path, "wb");
    T_REQUIRE(fp != NULL);
    T_REQUIRE(fwrite(b, 1, len, fp) == len);
    fclose(fp);
}

static void test_damaged_sidecar_is_ignored(void)
{
    static const char *const names[] = { "flipped stream byte", "flipped header byte",
                                         "truncated",           "wrong magic",
                                         "huge stream length",  "huge entry count",
                                         "overlapping streams" };
    static const char *const why[] = { "stream hash differs",
                                       "header hash differs",
                                       "differs from the header",
                                       "magic",
                                       "out of place",
                                       "more than the checkpoint's tensors",
                                       "out of place" };
    for (int d = FLIP_STREAM; d <= OVERLAP; d++) {
        fx_clear_sidecars(cache);
        fx f;
        fx_opts o = side_opts(d % 2 ? "linear_runtime" : "vmm_fast_runtime", d % 3 == 0, true);
        T_REQUIRE(fx_create(&f, &o) == 0);
        expect_encoded(&f, names[d]);
        char path[600], b[600];
        T_REQUIRE(fx_sidecars(cache, path, sizeof(path)) == 1);
        spoil((damage)d);
        resession(&f);
        expect_encoded(&f, names[d]);
        fx_label(&f, "codec_sidecar_note", b, sizeof(b));
        T_CONTAINS(b, "ignored");
        T_CONTAINS(b, path);
        T_CONTAINS(b, why[d]);
        T_CHECK_MSG(fx_metric(&f, "codec_sidecar_ignored") == 1, "%s", names[d]);
        T_CHECK_MSG(fx_metric(&f, "codec_sidecar_written_bytes") > 0, "%s: not rewritten",
                    names[d]);
        resession(&f); /* the rewritten sidecar serves the next setup */
        expect_sidecar(&f, names[d]);
        fx_destroy(&f);
    }
}

/* A directory that cannot be created: a note, the session works, nothing written. */
static void test_unwritable_dir_is_a_note(void)
{
    char file[300], dir[320], b[600];
    snprintf(file, sizeof(file), "%s/plain", cache);
    FILE *fp = fopen(file, "wb");
    T_REQUIRE(fp != NULL);
    fclose(fp);
    snprintf(dir, sizeof(dir), "%s/sub", file);
    fx f;
    fx_opts o = side_opts("linear_runtime", false, true);
    o.codec_cache_dir = dir;
    T_REQUIRE(fx_create(&f, &o) == 0);
    expect_encoded(&f, "unwritable");
    fx_label(&f, "codec_sidecar_note", b, sizeof(b));
    T_CONTAINS(b, "not written");
    T_CONTAINS(b, dir);
    T_CHECK(fx_metric(&f, "codec_sidecar_written_bytes") == 0);
    fx_destroy(&f);
    unlink(file);
}

/* Read faults while the store is read from the sidecar: clean errors, nothing left. */
static void test_faults_reading_sidecar(void)
{
    fx_clear_sidecars(cache);
    fx f;
    fx_opts o = side_opts("vmm_fast_runtime", true, true);
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    for (uint64_t nth = 1; nth <= 6; nth++) {
        ddo__source_fault_nth(nth, false);
        resession(&f);
        ddo__source_fault_nth(0, false);
        T_CHECK_MSG(f.rc == DDO_E_IO || f.rc == 0, "nth=%llu: %s", (unsigned long long)nth,
                    ddo_errname(f.rc));
        if (f.rc == DDO_E_IO) {
            T_CONTAINS(ddo_last_error(), "injected fault");
            T_CHECK(f.s == NULL);
        } else {
            fx_two_steps(&f, "fault beyond the reads");
        }
    }
    resession(&f);
    expect_sidecar(&f, "after the faults");
    fx_destroy(&f);
}

int main(void)
{
    snprintf(cache, sizeof(cache), "/var/tmp/ddo_sidecar_XXXXXX");
    if (mkdtemp(cache) == NULL)
        return 1;
    T_RUN(test_second_setup_uses_sidecar);
    T_RUN(test_fp8_sidecar);
    T_RUN(test_raw_entries);
    T_RUN(test_changed_checkpoint_gets_new_sidecar);
    T_RUN(test_damaged_sidecar_is_ignored);
    T_RUN(test_unwritable_dir_is_a_note);
    T_RUN(test_faults_reading_sidecar);
    fx_clear_sidecars(cache);
    rmdir(cache);
    return t_done();
}
