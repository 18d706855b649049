/*
 * test_session_sidecar_stream.c - file streaming from the coded sidecar (weight_codec_cache_dir,
 * docs/codec.md "Sidecar"), cpu device, vmm_source_cache_gb smaller than the model: once a
 * sidecar holds every tensor's stream, a session whose store keeps only some units streams the
 * others' coded streams from the sidecar (coded_file: bytes_staged_from_sidecar, fewer file
 * bytes than the raw run) with the leased bytes identical over two steps, on linear_runtime
 * and vmm_fast_runtime; a corrupted stream of a streamed tensor is read raw from the
 * checkpoint instead, with a note and a count, the bytes still identical; a changed checkpoint
 * fails the next streamed load (DDO_E_FILE_CHANGED); the first setup with a small store codes
 * the streamed tensors into the sidecar, so it already streams coded bytes; vmm_runtime streams
 * raw; every device budget
 * is back at zero after teardown (fx_destroy).
 *
 * ctest-labels: unit threads
 */
#include "session_fx.h"

#include "checkpoint/checkpoint.h"
#include "session/session_codec.h"
#include "store/source.h"
#include "store/source_codec.h"
#include "store/source_sidecar.h"

#include <dirent.h>
#include <fcntl.h>
#include <time.h>

static char cache[256];

/* vmm_source_cache_gb below one segment: the store keeps no unit (linear_runtime: the host
 * memory left, replan) */
#define SMALL_GB (96.0 * 1024.0 / (double)DDO_GIB)

static fx_opts stream_opts(const char *route, double cache_gb, const char *dir)
{
    fx_opts o = { .blocks = 4, .slots = 2, .mode = route, .file = true, .cache_gb = cache_gb };
    o.weight_codec = "ddoc1";
    o.trained = true;
    o.codec_cache_dir = dir;
    return o;
}

/* A new plan with vmm_source_cache_gb = gb and cache dir dir (NULL: none) and a new session on
 * the same checkpoint file (so the same sidecar). */
static void replan(fx *f, double gb, const char *dir)
{
    /* linear_runtime sizes its store by the host memory left: a small store is little memory */
    bool linear = strcmp(f->o.mode, "linear_runtime") == 0;
    ddo_session_destroy(f->s);
    f->s = NULL;
    ddo_plan_destroy(f->plan);
    f->plan = NULL;
    char v[64];
    snprintf(v, sizeof(v), "%g", gb);
    fx_set(f, "vmm_source_cache_gb", v);
    fx_set(f, "weight_codec_cache_dir", dir != NULL ? dir : "");
    ddo_plan_inputs in = fx_cpu_inputs(f->o.device_bytes, linear && gb < 1 ? 1 : 8 * DDO_GIB);
    T_REQUIRE(ddo_plan_build(f->ck, f->cfg, &in, &f->plan) == 0);
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f->cfg;
    f->rc = ddo_session_create(f->plan, f->ck, f->dev, &so, &f->s);
    if (f->rc != 0)
        fprintf(stderr, "  session: %s\n", ddo_last_error());
    T_REQUIRE(f->rc == 0);
}

/* One checkpoint file: the small-store session's raw file bytes over two steps (*raw), then a
 * whole-store session that writes the sidecar of every tensor, then the small-store session
 * again with the sidecar dir. */
static void setup(fx *f, const char *route, bool pin, double *raw)
{
    fx_clear_sidecars(cache);
    fx_opts o = stream_opts(route, 1, NULL);
    o.pin = pin; /* pin_cpu_memory: staging from pinned windows either way */
    T_REQUIRE(fx_create(f, &o) == 0);
    T_REQUIRE(f->rc == 0);
    replan(f, SMALL_GB, NULL);
    fx_two_steps(f, "raw");
    *raw = fx_metric(f, "bytes_staged_from_file");
    T_CHECK_MSG(fx_metric(f, "bytes_staged_from_sidecar") == 0, "%s: raw run", route);
    replan(f, 1, cache);
    T_CHECK(fx_metric(f, "codec_sidecar_written_bytes") > 0);
    T_REQUIRE(fx_sidecars(cache, NULL, 0) == 1);
}

/* Flips a byte inside the stream of the first tensor of the first unit the store does not
 * keep; *done false when every unit is kept. */
static void corrupt_streamed(fx *f, bool *done)
{
    *done = false;
    for (int b = 0; b < f->o.blocks; b++) {
        ddo_unit_info ui;
        T_REQUIRE(ddo_plan_unit(f->plan, fx_unit(f, b), &ui) == 0);
        if (ui.retained)
            continue;
        size_t n = 0;
        const size_t *t = ddo_plan_unit_tensors(f->plan, fx_unit(f, b), &n);
        T_REQUIRE(n > 0);
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(f->ck, t[0]);
        ddo__file_id id;
        T_REQUIRE(ddo__checkpoint_file_identity(f->ck, ti->file_index, &id));
        char path[600], why[256];
        T_REQUIRE(fx_sidecars(cache, path, sizeof(path)) == 1);
        ddo__sidecar *s = NULL;
        T_REQUIRE(ddo__sidecar_open(path, &id, 1024, &s, why, sizeof(why)) == 0);
        const ddo__sidecar_entry *e = ddo__sidecar_find(s, ti->offset, ti->nbytes, ti->dtype);
        T_REQUIRE(e != NULL && e->coded_bytes > 64);
        uint64_t at = e->coded_off + e->coded_bytes / 2;
        ddo__sidecar_close(s);
        int fd = open(path, O_RDWR);
        T_REQUIRE(fd >= 0);
        unsigned char c = 0;
        T_REQUIRE(pread(fd, &c, 1, (off_t)at) == 1);
        c ^= 0x5a;
        T_REQUIRE(pwrite(fd, &c, 1, (off_t)at) == 1);
        close(fd);
        *done = true;
        return;
    }
}

static void test_streams_from_sidecar(void)
{
    static const char *const routes[] = { "linear_runtime", "vmm_fast_runtime" };
    for (size_t k = 0; k < 2 * DDO_ARRAY_LEN(routes); k++) {
        char what[64];
        snprintf(what, sizeof(what), "%s pin=%zu", routes[k / 2], k % 2);
        double raw = 0;
        fx f;
        setup(&f, routes[k / 2], k % 2 != 0, &raw);
        T_CHECK_MSG(raw > 0, "%s: the small store streams from the file", what);
        replan(&f, SMALL_GB, cache);
        fx_two_steps(&f, what);
        double side = fx_metric(&f, "bytes_staged_from_sidecar");
        double file = fx_metric(&f, "bytes_staged_from_file");
        T_CHECK_MSG(side > 0, "%s: nothing streamed from the sidecar", what);
        T_CHECK_MSG(side + file < raw, "%s: %g + %g bytes against %g raw", what, side, file, raw);
        T_CHECK_MSG(fx_metric(&f, "codec_stream_fallbacks") == 0, "%s", what);
        char b[600];
        T_EQ_STR(fx_label(&f, "codec_stream_note", b, sizeof(b)), "");
        fx_destroy(&f);
    }
}

/* A new session over the sidecar with one streamed tensor's stream corrupted, two steps: that
 * stream goes raw (one fallback, a note naming its hash), the others still come from the
 * sidecar. */
static void rerun_corrupted(fx *f, const char *what)
{
    ddo_session_destroy(f->s);
    f->s = NULL;
    bool done = false;
    corrupt_streamed(f, &done);
    T_REQUIRE(done);
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f->cfg;
    T_REQUIRE(ddo_session_create(f->plan, f->ck, f->dev, &so, &f->s) == 0);
    fx_two_steps(f, what);
    T_CHECK_MSG(fx_metric(f, "codec_stream_fallbacks") == 1, "%s: %g fallbacks", what,
                fx_metric(f, "codec_stream_fallbacks"));
    T_CHECK_MSG(fx_metric(f, "bytes_staged_from_sidecar") > 0, "%s", what);
    char b[600];
    T_CHECK_MSG(strstr(fx_label(f, "codec_stream_note", b, sizeof(b)), "hash") != NULL,
                "%s: note \"%s\"", what, b);
}

/* Streams longer than a window (a full-size tensor's: tens of MiB against the 32 MiB window),
 * here with the window's share scaled down to 3333 bytes (ddo__session_codec_test_piece_cap):
 * they are still read from the sidecar, in pieces straight into the decode area, none read raw
 * (before, such a stream was read raw from the checkpoint: the full-size bug), the leased bytes
 * identical; a corrupted one goes raw with a note. */
static void test_long_streams_in_pieces(void)
{
    static const char *const routes[] = { "linear_runtime", "vmm_fast_runtime" };
    for (size_t r = 0; r < DDO_ARRAY_LEN(routes); r++) {
        const char *what = routes[r];
        double raw = 0;
        fx f;
        setup(&f, what, r != 0, &raw);
        replan(&f, SMALL_GB, cache);
        fx_two_steps(&f, what);
        double whole = fx_metric(&f, "bytes_staged_from_sidecar");
        double whole_file = fx_metric(&f, "bytes_staged_from_file");
        ddo__session_codec_test_piece_cap(3333);
        replan(&f, SMALL_GB, cache);
        fx_two_steps(&f, what);
        double side = fx_metric(&f, "bytes_staged_from_sidecar");
        double file = fx_metric(&f, "bytes_staged_from_file");
        /* every streamed tensor's stream spans pieces, and none is read raw */
        T_CHECK_MSG(whole > 4 * 3333.0 && whole_file == 0, "%s: %g + %g bytes", what, whole,
                    whole_file);
        T_CHECK_MSG(side > 4 * 3333.0 && file == 0, "%s: %g bytes in pieces, %g raw", what, side,
                    file);
        T_CHECK_MSG(side + file < raw, "%s: %g + %g bytes against %g raw", what, side, file, raw);
        T_CHECK_MSG(fx_metric(&f, "codec_stream_fallbacks") == 0, "%s", what);
        rerun_corrupted(&f, what);
        ddo__session_codec_test_piece_cap(0);
        fx_destroy(&f);
    }
}

/* Whether this cache directory's file system takes O_DIRECT (tmpfs does not). */
static bool cache_takes_direct(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/probe", cache);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    if (fd < 0)
        return false;
    close(fd);
    int dfd = -1;
    bool ok = ddo__os_file_open_direct(path, &dfd) == 0;
    if (ok)
        ddo__os_file_close(dfd);
    unlink(path);
    return ok;
}

/* Streams read with O_DIRECT (where the sidecar's file system takes it: the disk's rate, as
 * raw file reads; every stream here, scaled down from the 1 MiB such reads start at), whole and
 * in 3333-byte pieces (so most pieces start inside a page: the aligned range around them is
 * read and the piece taken from inside it): every stream from the sidecar, none raw and none
 * falling back, the leased bytes those of the checkpoint. */
static void test_streams_read_direct(void)
{
    static const char *const routes[] = { "linear_runtime", "vmm_fast_runtime" };
    bool direct = cache_takes_direct();
    for (size_t r = 0; r < DDO_ARRAY_LEN(routes); r++) {
        const char *what = routes[r];
        double raw = 0;
        fx f;
        setup(&f, what, true, &raw);
        ddo__source_test_stream_direct_min(1);
        for (int pieces = 0; pieces < 2; pieces++) {
            ddo__session_codec_test_piece_cap(pieces ? 3333 : 0);
            uint64_t before = ddo__source_test_stream_direct_reads();
            replan(&f, SMALL_GB, cache);
            fx_two_steps(&f, what); /* the leased bytes checked against the checkpoint's */
            uint64_t reads = ddo__source_test_stream_direct_reads() - before;
            /* (how many loads a pass makes moves with the prefetch's timing: bytes are not
             * compared between runs) */
            double side = fx_metric(&f, "bytes_staged_from_sidecar");
            T_CHECK_MSG(side > 0 && fx_metric(&f, "bytes_staged_from_file") == 0 &&
                            fx_metric(&f, "codec_stream_fallbacks") == 0,
                        "%s, pieces %d: %g bytes from the sidecar, %g raw", what, pieces, side,
                        fx_metric(&f, "bytes_staged_from_file"));
            T_CHECK_MSG(!direct || reads > 0, "%s, pieces %d: no direct read", what, pieces);
        }
        ddo__session_codec_test_piece_cap(0);
        ddo__source_test_stream_direct_min(0);
        fx_destroy(&f);
    }
    if (!direct)
        printf("  (this file system refuses O_DIRECT: the buffered reads were checked)\n");
}

static void test_corrupted_stream_reads_raw(void)
{
    static const char *const routes[] = { "linear_runtime", "vmm_fast_runtime" };
    for (size_t r = 0; r < DDO_ARRAY_LEN(routes); r++) {
        const char *what = routes[r];
        double raw = 0;
        fx f;
        setup(&f, what, false, &raw);
        replan(&f, SMALL_GB, cache); /* plans for the small store, before the sidecar changes */
        rerun_corrupted(&f, what);
        T_CHECK_MSG(fx_metric(&f, "bytes_staged_from_file") > 0, "%s", what);
        fx_destroy(&f);
    }
}

/* A stream's hash is checked at its first read only: the second step hashes nothing (hashing
 * every load ran in series with the disk at about 2 GB/s). A sidecar changed in place after
 * that is caught by its identity: the next loads go raw with a note, the leased bytes exact
 * (without the identity check its bytes would be used unchecked: this test then fails). */
static void test_streams_hashed_once(void)
{
    static const char *const routes[] = { "linear_runtime", "vmm_fast_runtime" };
    for (size_t r = 0; r < DDO_ARRAY_LEN(routes); r++) {
        const char *what = routes[r];
        double raw = 0;
        fx f;
        setup(&f, what, false, &raw);
        replan(&f, SMALL_GB, cache);
        uint64_t h0 = ddo__source_test_stream_hashed_bytes();
        fx_step(&f, what, 0);
        uint64_t h1 = ddo__source_test_stream_hashed_bytes();
        fx_step(&f, what, 1);
        uint64_t h2 = ddo__source_test_stream_hashed_bytes();
        T_CHECK_MSG(h1 > h0, "%s: the first step hashed %llu bytes", what,
                    (unsigned long long)(h1 - h0));
        T_CHECK_MSG(h2 == h1, "%s: the second step hashed %llu bytes", what,
                    (unsigned long long)(h2 - h1));
        double side = fx_metric(&f, "bytes_staged_from_sidecar");
        T_CHECK_MSG(side > 0 && fx_metric(&f, "codec_stream_fallbacks") == 0, "%s", what);
        struct timespec pause = { 0, 20 * 1000 * 1000 }; /* past the file clock's tick */
        nanosleep(&pause, NULL);
        bool done = false;
        corrupt_streamed(&f, &done);
        T_REQUIRE(done);
        fx_step(&f, what, 2);
        T_CHECK_MSG(fx_metric(&f, "codec_stream_fallbacks") >= 1, "%s: %g fallbacks", what,
                    fx_metric(&f, "codec_stream_fallbacks"));
        char b[600];
        T_CHECK_MSG(strstr(fx_label(&f, "codec_stream_note", b, sizeof(b)),
                           "changed since it was opened") != NULL,
                    "%s: note \"%s\"", what, b);
        fx_destroy(&f);
    }
}

/* The checkpoint changes under a session streaming from its sidecar: the next load of a
 * streamed unit is refused (DDO_E_FILE_CHANGED), as a raw file read is. */
static void test_changed_checkpoint_is_refused(void)
{
    double raw = 0;
    fx f;
    setup(&f, "vmm_fast_runtime", false, &raw);
    replan(&f, SMALL_GB, cache);
    fx_two_steps(&f, "before the change");
    T_CHECK(fx_metric(&f, "bytes_staged_from_sidecar") > 0);
    T_EQ_INT(ddo_session_synchronize(f.s), 0);
    T_EQ_INT(ddo_stream_synchronize(f.stream), 0);
    struct timespec ts = { 0, 50 * 1000 * 1000 };
    nanosleep(&ts, NULL); /* a later mtime on coarse clocks too */
    T_REQUIRE(fx_write_file(&f) == 0);
    int rc = 0;
    for (int b = 0; b < f.o.blocks && rc == 0; b++) {
        size_t u = fx_unit(&f, b);
        if (ddo__session_unit_state(f.s, u, NULL) != -1)
            continue; /* still held from before the change: no load */
        rc = ddo_session_acquire(f.s, u, f.stream);
        if (rc == 0)
            (void)ddo_session_release(f.s, u, f.stream);
    }
    T_EQ_INT(rc, DDO_E_FILE_CHANGED);
    fx_destroy(&f);
}

typedef struct phases {
    uint64_t sidecar_done, sidecar_total;
    int sidecar_calls;
} phases;

static void on_progress(void *user, const char *phase, uint64_t done, uint64_t total)
{
    phases *ph = user;
    if (strcmp(phase, "sidecar") == 0) {
        ph->sidecar_done = done;
        ph->sidecar_total = total;
        ph->sidecar_calls++;
    }
}

/* The first setup with a small store and no sidecar yet: the file-streamed tensors are read
 * and coded one at a time into the sidecar with the stored ones, so this very session streams
 * their coded bytes (and says how far the coding got through the progress callback); the next
 * setup writes nothing and streams the same way. The retained peak stays within the plan's. */
static void test_first_run_codes_streamed_tensors(void)
{
    static const char *const routes[] = { "linear_runtime", "vmm_fast_runtime" };
    for (size_t r = 0; r < DDO_ARRAY_LEN(routes); r++) {
        const char *what = routes[r];
        double raw = 0;
        fx f;
        fx_clear_sidecars(cache);
        fx_opts o = stream_opts(what, 1, NULL);
        T_REQUIRE(fx_create(&f, &o) == 0);
        T_REQUIRE(f.rc == 0);
        replan(&f, SMALL_GB, NULL);
        fx_two_steps(&f, "raw");
        raw = fx_metric(&f, "bytes_staged_from_file");
        T_REQUIRE(fx_sidecars(cache, NULL, 0) == 0);
        for (int run = 0; run < 2; run++) {
            ddo_session_destroy(f.s);
            f.s = NULL;
            ddo_plan_destroy(f.plan);
            f.plan = NULL;
            fx_set(&f, "weight_codec_cache_dir", cache);
            ddo_plan_inputs in = fx_cpu_inputs(f.o.device_bytes, r == 0 ? 1 : 8 * DDO_GIB);
            T_REQUIRE(ddo_plan_build(f.ck, f.cfg, &in, &f.plan) == 0);
            phases ph = { 0 };
            ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
            so.config = f.cfg;
            so.progress = on_progress;
            so.progress_user = &ph;
            T_REQUIRE(ddo_session_create(f.plan, f.ck, f.dev, &so, &f.s) == 0);
            double coded = fx_metric(&f, "codec_sidecar_encoded_bytes");
            double written = fx_metric(&f, "codec_sidecar_written_bytes");
            if (run == 0) {
                T_CHECK_MSG(coded > 0 && written > 0, "%s: coded %g written %g", what, coded,
                            written);
                T_CHECK_MSG(ph.sidecar_calls > 0 && ph.sidecar_done == ph.sidecar_total &&
                                (double)ph.sidecar_total == coded,
                            "%s: progress %d calls, %llu of %llu", what, ph.sidecar_calls,
                            (unsigned long long)ph.sidecar_done,
                            (unsigned long long)ph.sidecar_total);
                T_REQUIRE(fx_sidecars(cache, NULL, 0) == 1);
            } else {
                T_CHECK_MSG(coded == 0 && written == 0 && ph.sidecar_calls == 0,
                            "%s: the second setup coded %g, wrote %g", what, coded, written);
            }
            fx_two_steps(&f, what);
            double side = fx_metric(&f, "bytes_staged_from_sidecar");
            double file = fx_metric(&f, "bytes_staged_from_file");
            T_CHECK_MSG(side > 0 && side + file < raw, "%s run %d: %g + %g against %g raw", what,
                        run, side, file, raw);
            T_CHECK_MSG(fx_metric(&f, "codec_stream_fallbacks") == 0, "%s", what);
            ddo_plan_budgets b;
            T_REQUIRE(ddo_plan_budgets_get(f.plan, &b) == 0);
            T_CHECK_MSG(fx_metric(&f, "retained_peak_bytes") <= (double)b.retained_peak,
                        "%s: retained peak %g of %llu", what, fx_metric(&f, "retained_peak_bytes"),
                        (unsigned long long)b.retained_peak);
        }
        fx_destroy(&f);
    }
}

/* A read or an encoding that fails while the streamed tensors are coded for the sidecar: no
 * sidecar, a note naming the fault, and the session streams raw bytes, identical. */
static void test_failed_sidecar_build_is_a_note(void)
{
    fx_clear_sidecars(cache);
    fx f;
    fx_opts o = stream_opts("vmm_fast_runtime", 1, NULL);
    T_REQUIRE(fx_create(&f, &o) == 0);
    T_REQUIRE(f.rc == 0);
    for (int k = 0; k < 2; k++) { /* a failing read, then a failing encoder */
        if (k == 0)
            ddo__source_fault_nth(1, false); /* the first file read from now on */
        else
            ddo__source_codec_fault_nth(2); /* the second tensor coded from now on */
        replan(&f, SMALL_GB, cache);
        ddo__source_fault_nth(0, false);
        ddo__source_codec_fault_nth(0);
        char b[600];
        fx_label(&f, "codec_sidecar_note", b, sizeof(b));
        T_CONTAINS(b, "not written");
        T_CONTAINS(b, "injected fault");
        T_CHECK(fx_sidecars(cache, NULL, 0) == 0);
        fx_two_steps(&f, "raw after a failed sidecar");
        T_CHECK(fx_metric(&f, "bytes_staged_from_sidecar") == 0);
        T_CHECK(fx_metric(&f, "bytes_staged_from_file") > 0);
    }
    fx_destroy(&f);
}

/* vmm_runtime (per-weight handles) streams raw bytes even with a sidecar of every tensor. */
static void test_vmm_runtime_streams_raw(void)
{
    double raw = 0;
    fx f;
    setup(&f, "vmm_fast_runtime", false, &raw);
    fx_set(&f, "execution_mode", "vmm_runtime");
    f.o.mode = "vmm_runtime";
    replan(&f, SMALL_GB, cache);
    T_EQ_STR(ddo_plan_route(f.plan), "vmm_runtime");
    fx_two_steps(&f, "vmm_runtime");
    T_CHECK(fx_metric(&f, "bytes_staged_from_sidecar") == 0);
    T_CHECK(fx_metric(&f, "bytes_staged_from_file") > 0);
    fx_destroy(&f);
}

int main(void)
{
    snprintf(cache, sizeof(cache), "/var/tmp/ddo_sidestream_XXXXXX");
    if (mkdtemp(cache) == NULL)
        return 1;
    T_RUN(test_streams_from_sidecar);
    T_RUN(test_first_run_codes_streamed_tensors);
    T_RUN(test_failed_sidecar_build_is_a_note);
    T_RUN(test_long_streams_in_pieces);
    T_RUN(test_streams_read_direct);
    T_RUN(test_corrupted_stream_reads_raw);
    T_RUN(test_streams_hashed_once);
    T_RUN(test_changed_checkpoint_is_refused);
    T_RUN(test_vmm_runtime_streams_raw);
    fx_clear_sidecars(cache);
    rmdir(cache);
    return t_done();
}
