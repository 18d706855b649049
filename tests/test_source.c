/*
 * test_source.c - the retained source store on the cpu device: retained
 * bytes equal the file's for both read engines and several worker counts,
 * registered segments are whole 64 MiB, accounts refuse before anything is
 * allocated, registration failure with and without fallback, file reads
 * with odd offsets and lengths (O_DIRECT alignment shifts), a changed file,
 * host-memory tensors, and concurrent reads.
 * ctest-labels: unit backend threads
 */
#include "checkpoint/checkpoint.h"
#include "device/device.h"
#include "os/sys.h"
#include "os/thread.h"
#include "store/source.h"
#include "t.h"

#include <fcntl.h>
#include <pthread.h> /* pthread_self, pthread_equal: the progress callback's thread */
#include <sys/stat.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static char dir[512];
static char path[640];
static uint8_t *file_bytes; /* the whole file as written */
static size_t file_size;

/* Tensor sizes: odd, tiny, empty, spanning several 16 MiB read pieces. */
static const size_t sizes[] = { 4097,         3 * MIB + 5, 1,           0,
                                40 * MIB + 3, 12345,       2 * MIB - 1, 70 * MIB + 11 };
#define NT (sizeof(sizes) / sizeof(sizes[0]))

static uint64_t offs[NT]; /* absolute file offsets */

static uint8_t pattern(uint64_t i)
{
    uint64_t x = i * 0x9E3779B97F4A7C15ull;
    return (uint8_t)(x >> 56 ^ x >> 23);
}

/* Writes a safetensors file: 8-byte little-endian header length, JSON padded, data. */
static int write_checkpoint(const char *p)
{
    char header[4096];
    size_t h = 0;
    uint64_t data = 0;
    h += (size_t)snprintf(header + h, sizeof(header) - h, "{");
    for (size_t i = 0; i < NT; i++) {
        h += (size_t)snprintf(
            header + h, sizeof(header) - h,
            "%s\"t%zu\":{\"dtype\":\"U8\",\"shape\":[%zu],\"data_offsets\":[%llu,%llu]}",
            i ? "," : "", i, sizes[i], (unsigned long long)data,
            (unsigned long long)(data + sizes[i]));
        data += sizes[i];
    }
    h += (size_t)snprintf(header + h, sizeof(header) - h, "}");
    /* pad to a multiple of 8, plus 3 spaces more: data starts off any 4 KiB boundary */
    while (h % 8 != 3)
        header[h++] = ' ';
    while (h % 8 != 0)
        header[h++] = ' ';
    file_size = 8 + h + data;
    free(file_bytes); /* a rewrite replaces the previous image */
    file_bytes = malloc(file_size);
    if (file_bytes == NULL)
        return -1;
    for (int i = 0; i < 8; i++)
        file_bytes[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(file_bytes + 8, header, h);
    for (uint64_t i = 0; i < data; i++)
        file_bytes[8 + h + i] = pattern(i);
    uint64_t o = 8 + h;
    for (size_t i = 0; i < NT; i++) {
        offs[i] = o;
        o += sizes[i];
    }
    FILE *f = fopen(p, "wb");
    if (f == NULL)
        return -1;
    size_t w = fwrite(file_bytes, 1, file_size, f);
    return fclose(f) == 0 && w == file_size ? 0 : -1;
}

typedef struct fixture {
    ddo_checkpoint *ck;
    ddo_device *dev;
    ddo__account retained, registered;
    ddo__metrics_acc metrics;
} fixture;

static int fixture_open(fixture *fx, uint64_t retained_limit, uint64_t registered_limit)
{
    memset(fx, 0, sizeof(*fx));
    if (ddo_checkpoint_create(path, DDO_READ_DEFAULT, &fx->ck) != 0) {
        fprintf(stderr, "  checkpoint: %s\n", ddo_last_error());
        return -1;
    }
    if (ddo_device_create("cpu", NULL, &fx->dev) != 0) {
        fprintf(stderr, "  device: %s\n", ddo_last_error());
        ddo_checkpoint_destroy(fx->ck);
        return -1;
    }
    ddo__account_init(&fx->retained, "retained host", "vmm_source_cache_gb", retained_limit);
    ddo__account_init(&fx->registered, "registered host", "vmm_source_registered_gb",
                      registered_limit);
    ddo__metrics_init(&fx->metrics);
    return 0;
}

/* Checks that everything was given back, then closes. */
static void fixture_close(fixture *fx)
{
    T_EQ_U64(ddo__account_used(&fx->retained), 0);
    T_EQ_U64(ddo__account_used(&fx->registered), 0);
    ddo__device_usage_t u;
    ddo__device_usage(fx->dev, &u);
    T_EQ_U64(u.registered_bytes, 0);
    T_EQ_U64(u.pinned_bytes, 0);
    ddo__metrics_fini(&fx->metrics);
    ddo__account_fini(&fx->retained);
    ddo__account_fini(&fx->registered);
    ddo_device_destroy(fx->dev);
    ddo_checkpoint_destroy(fx->ck);
}

static ddo__source_params params(fixture *fx, size_t workers, ddo__read_engine engine,
                                 bool fallback)
{
    ddo__source_params p = { 0 };
    p.ck = fx->ck;
    p.dev = fx->dev;
    p.workers = workers;
    p.engine = engine;
    p.allow_register_fallback = fallback;
    p.retained = &fx->retained;
    p.registered = &fx->registered;
    p.metrics = &fx->metrics;
    return p;
}

/* t0..t7: even tensors registered, odd ones pageable, t5 not retained. */
static size_t requests(const ddo_checkpoint *ck, ddo__source_request *req)
{
    size_t n = 0;
    for (size_t i = 0; i < NT; i++) {
        char name[16];
        snprintf(name, sizeof(name), "t%zu", i);
        size_t idx = SIZE_MAX;
        if (ddo_checkpoint_find(ck, name, &idx) != 0)
            return 0;
        req[n++] = (ddo__source_request){ idx, i != 5, i % 2 == 0, 0, 0, false };
    }
    return n;
}

static size_t tensor_index(const ddo_checkpoint *ck, size_t i)
{
    char name[16];
    snprintf(name, sizeof(name), "t%zu", i);
    size_t idx = SIZE_MAX;
    ddo_checkpoint_find(ck, name, &idx);
    return idx;
}

typedef struct progress_log {
    pthread_t main; /* thread identity: pthread_self, which os/thread.h does not wrap */
    int calls, wrong_thread;
    uint64_t read_done, read_total, reg_done, reg_total;
    uint64_t last_read_done;
    int backwards;
} progress_log;

static void on_progress(void *user, const char *phase, uint64_t done, uint64_t total)
{
    progress_log *l = user;
    l->calls++;
    if (!pthread_equal(pthread_self(), l->main))
        l->wrong_thread++;
    if (strcmp(phase, "read") == 0) {
        if (done < l->last_read_done)
            l->backwards++;
        l->last_read_done = l->read_done = done;
        l->read_total = total;
    } else if (strcmp(phase, "register") == 0) {
        l->reg_done = done;
        l->reg_total = total;
    }
}

static void check_engine_workers(ddo__read_engine engine, size_t workers)
{
    fixture fx;
    T_REQUIRE(fixture_open(&fx, UINT64_MAX, UINT64_MAX) == 0);
    ddo__source_request req[NT];
    size_t n = requests(fx.ck, req);
    T_REQUIRE(n == NT);
    uint64_t want_retained = 0, want_registered = 0;
    T_EQ_INT(ddo__source_bytes(fx.ck, req, n, &want_retained, &want_registered, NULL), 0);
    /* registered: t0 t2 t4 t6 = 4097 + 1 + 40 MiB+3 + 2 MiB-1 -> one segment; everything
     * retained (all but t5, about 115 MiB) -> two */
    T_EQ_U64(want_registered, 64 * MIB);
    T_EQ_U64(want_retained, 128 * MIB);
    ddo__source_params p = params(&fx, workers, engine, false);
    progress_log log = { .main = pthread_self() };
    p.progress = on_progress;
    p.progress_user = &log;
    ddo__source *src = NULL;
    int rc = ddo__source_create(&p, req, n, &src, NULL);
    T_CHECK_MSG(rc == 0, "%s", ddo_last_error());
    if (rc != 0) {
        fixture_close(&fx);
        return;
    }
    if (engine == DDO__READ_ENGINE_PREAD)
        T_EQ_INT(ddo__source_engine(src), DDO__READ_ENGINE_PREAD);
    else if (ddo__source_engine(src) != DDO__READ_ENGINE_IO_URING)
        fprintf(stderr, "  note: io_uring/O_DIRECT unavailable here; the pread fallback ran\n");
    T_EQ_U64(ddo__account_used(&fx.retained), want_retained);
    T_EQ_U64(ddo__account_used(&fx.registered), want_registered);
    uint64_t retained_file_bytes = 0;
    for (size_t i = 0; i < NT; i++) {
        size_t idx = tensor_index(fx.ck, i);
        bool reg = true;
        const uint8_t *ptr = ddo__source_host_ptr(src, idx, &reg);
        if (i == 5) {
            T_CHECK(ptr == NULL);
            T_CHECK(!reg);
            continue;
        }
        T_REQUIRE(ptr != NULL);
        /* pageable t1 and t3 follow the registered tensors inside the registered first
         * segment; t7 reaches into the second, unregistered one */
        T_CHECK_MSG(reg == (i != 7), "t%zu registered=%d", i, (int)reg);
        T_CHECK_MSG(memcmp(ptr, file_bytes + offs[i], sizes[i]) == 0,
                    "t%zu bytes differ (engine %d, %zu workers)", i, (int)engine, workers);
        /* placed congruent to its file offset modulo 4 KiB */
        T_EQ_U64((uintptr_t)ptr % 4096, offs[i] % 4096);
        retained_file_bytes += sizes[i];
    }
    T_NEAR(ddo__metrics_value(&fx.metrics, DDO_M_setup_read_bytes), (double)retained_file_bytes, 0);
    T_CHECK(ddo__metrics_value(&fx.metrics, DDO_M_setup_read_ns) > 0);
    T_CHECK(ddo__metrics_value(&fx.metrics, DDO_M_setup_register_ns) > 0);
    T_NEAR(ddo__metrics_value(&fx.metrics, DDO_M_registration_fallback_bytes), 0, 0);
    T_CHECK(log.calls > 0);
    T_EQ_INT(log.wrong_thread, 0);
    T_EQ_INT(log.backwards, 0);
    T_EQ_U64(log.read_done, retained_file_bytes);
    T_EQ_U64(log.read_total, retained_file_bytes);
    T_EQ_U64(log.reg_done, 64 * MIB);
    T_EQ_U64(log.reg_total, 64 * MIB);
    ddo__device_usage_t u;
    ddo__device_usage(fx.dev, &u);
    T_EQ_U64(u.registered_bytes, 64 * MIB);
    ddo__source_destroy(src);
    fixture_close(&fx);
}

static void test_sizes_are_the_planner_formula(void)
{
    /* 40 MiB registered + 5 MiB pageable: one segment in each account (the planner's
     * round_up(registered) and round_up(retained)), and the create fits exactly */
    fixture fx;
    T_REQUIRE(fixture_open(&fx, 64 * MIB, 64 * MIB) == 0);
    ddo__source_request req[4] = { { tensor_index(fx.ck, 1), true, false, 0, 0, false },
                                   { tensor_index(fx.ck, 4), true, true, 0, 0, false },
                                   { tensor_index(fx.ck, 6), true, false, 0, 0, false },
                                   { tensor_index(fx.ck, 5), false, false, 0, 0, false } };
    uint64_t ret = 0, reg = 0;
    T_EQ_INT(ddo__source_bytes(fx.ck, req, 4, &ret, &reg, NULL), 0);
    T_EQ_U64(ret, 64 * MIB);
    T_EQ_U64(reg, 64 * MIB);
    ddo__source_params p = params(&fx, 2, DDO__READ_ENGINE_AUTO, false);
    ddo__source *src = NULL;
    T_EQ_INT(ddo__source_create(&p, req, 4, &src, NULL), 0);
    T_REQUIRE(src != NULL);
    T_EQ_U64(ddo__account_used(&fx.retained), 64 * MIB);
    T_EQ_U64(ddo__account_used(&fx.registered), 64 * MIB);
    static const size_t which[3] = { 1, 4, 6 };
    for (size_t k = 0; k < 3; k++) {
        bool r = false;
        const uint8_t *ptr = ddo__source_host_ptr(src, tensor_index(fx.ck, which[k]), &r);
        T_REQUIRE(ptr != NULL);
        T_CHECK(r);
        T_CHECK(memcmp(ptr, file_bytes + offs[which[k]], sizes[which[k]]) == 0);
    }
    T_CHECK(ddo__source_host_ptr(src, tensor_index(fx.ck, 5), NULL) == NULL);
    ddo__source_destroy(src);
    fixture_close(&fx);
}

static void test_bytes_pread_engine(void)
{
    check_engine_workers(DDO__READ_ENGINE_PREAD, 1);
    check_engine_workers(DDO__READ_ENGINE_PREAD, 3);
    check_engine_workers(DDO__READ_ENGINE_PREAD, 8);
}

static void test_bytes_io_uring_engine(void)
{
    check_engine_workers(DDO__READ_ENGINE_IO_URING, 1);
    check_engine_workers(DDO__READ_ENGINE_IO_URING, 2);
    check_engine_workers(DDO__READ_ENGINE_AUTO, 5);
}

/* Every tensor registered: t4 (40 MiB) and t7 (70 MiB) span segments. */
static size_t all_registered(const ddo_checkpoint *ck, ddo__source_request *req)
{
    for (size_t i = 0; i < NT; i++)
        req[i] = (ddo__source_request){ tensor_index(ck, i), true, true, 0, 0, false };
    return NT;
}

static void test_registered_segments_whole(void)
{
    fixture fx;
    T_REQUIRE(fixture_open(&fx, UINT64_MAX, UINT64_MAX) == 0);
    ddo__source_request req[NT];
    size_t n = all_registered(fx.ck, req);
    ddo__device_stats_reset(fx.dev);
    ddo__source_params p = params(&fx, 4, DDO__READ_ENGINE_AUTO, false);
    ddo__source *src = NULL;
    T_EQ_INT(ddo__source_create(&p, req, n, &src, NULL), 0);
    T_REQUIRE(src != NULL);
    /* about 115 MiB of tensors: two whole segments */
    T_EQ_U64(ddo__account_used(&fx.registered), 128 * MIB);
    T_EQ_U64(ddo__account_used(&fx.retained), 128 * MIB);
    ddo__devop_stats st[DDO__OP_COUNT];
    ddo__device_stats(fx.dev, st);
    T_EQ_U64(st[DDO__OP_HOST_REGISTER].calls, 2);
    T_EQ_U64(st[DDO__OP_HOST_REGISTER].bytes, 128 * MIB);
    for (size_t i = 0; i < NT; i++) {
        bool reg = false;
        const uint8_t *ptr = ddo__source_host_ptr(src, tensor_index(fx.ck, i), &reg);
        T_REQUIRE(ptr != NULL);
        T_CHECK(reg);
        T_CHECK(memcmp(ptr, file_bytes + offs[i], sizes[i]) == 0);
    }
    ddo__source_destroy(src);
    ddo__device_stats(fx.dev, st);
    T_EQ_U64(st[DDO__OP_HOST_UNREGISTER].calls, 2);
    fixture_close(&fx);
}

static void test_accounts_refuse_before_allocating(void)
{
    ddo__source_request req[NT];
    for (int which = 0; which < 2; which++) {
        fixture fx;
        /* retained too small, or registered one byte short of the two segments needed */
        T_REQUIRE(fixture_open(&fx, which == 0 ? 100 * MIB : UINT64_MAX,
                               which == 1 ? 128 * MIB - 1 : UINT64_MAX) == 0);
        size_t n = all_registered(fx.ck, req);
        ddo__device_stats_reset(fx.dev);
        ddo__source_params p = params(&fx, 2, DDO__READ_ENGINE_AUTO, true);
        ddo__source *src = (ddo__source *)&fx; /* must come back NULL-untouched: not written */
        ddo__errbuf eb = { 0 };
        T_EQ_INT(ddo__source_create(&p, req, n, &src, &eb), DDO_E_BUDGET);
        T_CHECK(src == (ddo__source *)&fx);
        T_EQ_INT(eb.code, DDO_E_BUDGET);
        T_CONTAINS(eb.msg, which == 0 ? "retained host: taking 128.00 MiB would use 128.00 MiB "
                                        "of 100.00 MiB (vmm_source_cache_gb)"
                                      : "registered host: taking 128.00 MiB");
        T_CONTAINS(eb.msg, which == 0 ? "vmm_source_cache_gb" : "vmm_source_registered_gb");
        ddo__devop_stats st[DDO__OP_COUNT];
        ddo__device_stats(fx.dev, st);
        T_EQ_U64(st[DDO__OP_HOST_REGISTER].calls, 0);
        T_EQ_U64(st[DDO__OP_HOST_ALLOC].calls, 0);
        T_EQ_U64(ddo__account_peak(&fx.registered), 0);
        T_NEAR(ddo__metrics_value(&fx.metrics, DDO_M_setup_read_bytes), 0, 0);
        fixture_close(&fx);
    }
}

static void test_registration_failure(void)
{
    ddo__source_request req[NT];
    /* without fallback: the create fails cleanly with the device's error */
    fixture fx;
    T_REQUIRE(fixture_open(&fx, UINT64_MAX, UINT64_MAX) == 0);
    size_t n = all_registered(fx.ck, req);
    ddo__device_inject_fault(fx.dev, DDO__OP_HOST_REGISTER, 2, false, DDO_E_DEVICE);
    ddo__source_params p = params(&fx, 1, DDO__READ_ENGINE_AUTO, false);
    ddo__source *src = NULL;
    ddo__errbuf eb = { 0 };
    T_EQ_INT(ddo__source_create(&p, req, n, &src, &eb), DDO_E_DEVICE);
    T_CHECK(src == NULL);
    T_CONTAINS(eb.msg, "retained store: registering segment 2 of 2 (64.00 MiB): ");
    T_CONTAINS(eb.msg, "allow_pin_memory_fallback");
    fixture_close(&fx); /* checks: accounts and registered bytes back at zero */

    /* with fallback: the failed segment stays pageable and is counted. One worker registers
     * in order, so the second call is segment 2: t0..t6 lie in segment 1, t7 spans both. */
    T_REQUIRE(fixture_open(&fx, UINT64_MAX, UINT64_MAX) == 0);
    n = all_registered(fx.ck, req);
    ddo__device_inject_fault(fx.dev, DDO__OP_HOST_REGISTER, 2, false, DDO_E_DEVICE);
    p = params(&fx, 1, DDO__READ_ENGINE_AUTO, true);
    T_EQ_INT(ddo__source_create(&p, req, n, &src, NULL), 0);
    T_REQUIRE(src != NULL);
    T_NEAR(ddo__metrics_value(&fx.metrics, DDO_M_registration_fallback_bytes), 64.0 * MIB, 0);
    T_EQ_U64(ddo__account_used(&fx.registered), 64 * MIB);
    T_EQ_U64(ddo__account_used(&fx.retained), 128 * MIB);
    for (size_t i = 0; i < NT; i++) {
        bool reg = false;
        const uint8_t *ptr = ddo__source_host_ptr(src, tensor_index(fx.ck, i), &reg);
        T_REQUIRE(ptr != NULL);
        T_CHECK(memcmp(ptr, file_bytes + offs[i], sizes[i]) == 0);
        T_CHECK_MSG(reg == (i != 7), "t%zu registered=%d", i, (int)reg);
    }
    ddo__device_usage_t u;
    ddo__device_usage(fx.dev, &u);
    T_EQ_U64(u.registered_bytes, 64 * MIB);
    ddo__source_destroy(src);
    fixture_close(&fx);
}

/* A window as the staging ring hands out: page aligned. */
static void *window(size_t cap)
{
    return ddo__os_aligned_alloc(4096, cap);
}

static void check_read(ddo__source *src, size_t idx, size_t i, uint64_t off, size_t len,
                       size_t shift)
{
    size_t cap = ddo__source_window_need(len) + shift;
    uint8_t *w = window(cap);
    T_REQUIRE(w != NULL);
    const void *data = NULL;
    ddo__errbuf eb = { 0 };
    int rc = ddo__source_read_file(src, idx, off, len, w + shift, cap - shift, &data, &eb);
    T_CHECK_MSG(rc == 0, "t%zu off %llu len %zu: %s", i, (unsigned long long)off, len, eb.msg);
    if (rc == 0) {
        T_CHECK((const uint8_t *)data >= w + shift);
        T_CHECK((const uint8_t *)data + len <= w + cap);
        T_CHECK_MSG(memcmp(data, file_bytes + offs[i] + off, len) == 0,
                    "t%zu off %llu len %zu shift %zu: bytes differ", i, (unsigned long long)off,
                    len, shift);
        if (shift != 0)
            T_CHECK(data == w + shift); /* unaligned window: the page-cache path */
    }
    ddo__os_aligned_free(w);
}

static void test_read_file_alignment(void)
{
    fixture fx;
    T_REQUIRE(fixture_open(&fx, UINT64_MAX, UINT64_MAX) == 0);
    for (int e = 0; e < 2; e++) {
        ddo__source_params p =
            params(&fx, 1, e ? DDO__READ_ENGINE_IO_URING : DDO__READ_ENGINE_PREAD, false);
        ddo__source *src = NULL;
        T_REQUIRE(ddo__source_create(&p, NULL, 0, &src, NULL) == 0);
        size_t t4 = tensor_index(fx.ck, 4), t7 = tensor_index(fx.ck, 7);
        size_t t1 = tensor_index(fx.ck, 1), t0 = tensor_index(fx.ck, 0);
        static const struct {
            uint64_t off;
            size_t len;
        } cases[] = { { 0, 40 * MIB + 3 },
                      { 1, 3 * MIB },
                      { 4095, 1 * MIB + 1 },
                      { 4096, 2 * MIB },
                      { 12345, 17 * MIB + 7 },
                      { 40 * MIB - 5, 8 },
                      { 7, 1 } };
        for (size_t c = 0; c < DDO_ARRAY_LEN(cases); c++) {
            check_read(src, t4, 4, cases[c].off, cases[c].len, 0);
            check_read(src, t7, 7, cases[c].off + 30 * MIB, cases[c].len, 0);
        }
        check_read(src, t4, 4, 3, 5 * MIB, 1); /* misaligned window */
        check_read(src, t1, 1, 0, 3 * MIB + 5, 0);
        check_read(src, t0, 0, 1, 4096, 0);
        /* out of range, too small a window */
        uint8_t *w = window(1 << 16);
        const void *data = (const void *)w;
        ddo__errbuf eb = { 0 };
        T_EQ_INT(ddo__source_read_file(src, t0, 4000, 98, w, 1 << 16, &data, &eb),
                 DDO_E_INVALID_ARGUMENT);
        T_CONTAINS(eb.msg, "tensor \"t0\"");
        T_EQ_INT(ddo__source_read_file(src, t4, 0, 100, w, 99, &data, &eb), DDO_E_INVALID_ARGUMENT);
        T_CHECK(data == (const void *)w); /* not written on failure */
        ddo__os_aligned_free(w);
        ddo__source_destroy(src);
    }
    fixture_close(&fx);
}

static void test_read_file_changed(void)
{
    fixture fx;
    T_REQUIRE(fixture_open(&fx, UINT64_MAX, UINT64_MAX) == 0);
    ddo__source_params p = params(&fx, 1, DDO__READ_ENGINE_AUTO, false);
    ddo__source *src = NULL;
    T_REQUIRE(ddo__source_create(&p, NULL, 0, &src, NULL) == 0);
    size_t t4 = tensor_index(fx.ck, 4);
    check_read(src, t4, 4, 0, 4 * MIB, 0);
    /* same size, new mtime: the identity check refuses both read paths */
    struct timespec ts[2] = { { 1000000, 0 }, { 1000000, 0 } };
    T_REQUIRE(utimensat(AT_FDCWD, path, ts, 0) == 0);
    size_t cap = ddo__source_window_need(4 * MIB);
    uint8_t *w = window(cap);
    T_REQUIRE(w != NULL);
    const void *data = NULL;
    ddo__errbuf eb = { 0 };
    T_EQ_INT(ddo__source_read_file(src, t4, 0, 4 * MIB, w, cap, &data, &eb), DDO_E_FILE_CHANGED);
    T_CONTAINS(eb.msg, "changed");
    T_EQ_INT(ddo__source_read_file(src, t4, 5, 100, w, cap, &data, &eb), DDO_E_FILE_CHANGED);
    T_CHECK(data == NULL);
    /* a store created now refuses too (checkpoint identity) */
    ddo__source *src2 = NULL;
    ddo__source_request req[NT];
    size_t n = requests(fx.ck, req);
    T_EQ_INT(ddo__source_create(&p, req, n, &src2, &eb), DDO_E_FILE_CHANGED);
    T_CHECK(src2 == NULL);
    ddo__os_aligned_free(w);
    ddo__source_destroy(src);
    fixture_close(&fx);
    /* put the file back for the other tests */
    T_REQUIRE(write_checkpoint(path) == 0);
}

static void test_memory_image_falls_back_to_pread(void)
{
    /* A checkpoint held in memory has no file to open with O_DIRECT: io_uring falls back. */
    ddo_checkpoint *ck = NULL;
    T_REQUIRE(ddo__checkpoint_parse_buffer(file_bytes, file_size, "image.safetensors", &ck) == 0);
    ddo_device *dev = NULL;
    T_REQUIRE(ddo_device_create("cpu", NULL, &dev) == 0);
    ddo__account ret, reg;
    ddo__account_init(&ret, "retained host", "vmm_source_cache_gb", UINT64_MAX);
    ddo__account_init(&reg, "registered host", "vmm_source_registered_gb", UINT64_MAX);
    ddo__source_params p = { .ck = ck,
                             .dev = dev,
                             .workers = 3,
                             .engine = DDO__READ_ENGINE_IO_URING,
                             .retained = &ret,
                             .registered = &reg };
    ddo__source_request req[NT];
    size_t n = requests(ck, req);
    ddo__source *src = NULL;
    T_EQ_INT(ddo__source_create(&p, req, n, &src, NULL), 0);
    T_REQUIRE(src != NULL);
    T_EQ_INT(ddo__source_engine(src), DDO__READ_ENGINE_PREAD);
    for (size_t i = 0; i < NT; i++) {
        const uint8_t *ptr = ddo__source_host_ptr(src, tensor_index(ck, i), NULL);
        if (i == 5)
            continue;
        T_REQUIRE(ptr != NULL);
        T_CHECK(memcmp(ptr, file_bytes + offs[i], sizes[i]) == 0);
    }
    check_read(src, tensor_index(ck, 7), 7, 3, 20 * MIB, 0);
    ddo__source_destroy(src);
    T_EQ_U64(ddo__account_used(&ret), 0);
    T_EQ_U64(ddo__account_used(&reg), 0);
    ddo__account_fini(&ret);
    ddo__account_fini(&reg);
    ddo_device_destroy(dev);
    ddo_checkpoint_destroy(ck);
}

/* A host tensor registered in place: its whole inner pages where they lie, its two end
 * fragments (which share pages with other memory) from the pinned arena; nothing outside the
 * tensor is registered. */
static void test_host_tensor_pieces(void)
{
    uint8_t *buf = NULL;
    T_REQUIRE((buf = ddo__os_aligned_alloc(4096, 24 * 4096)) != NULL);
    for (size_t i = 0; i < 24 * 4096; i++)
        buf[i] = (uint8_t)(i * 7);
    uint8_t *a = buf + 100; /* 20 pages and a bit (over DDO__PIN_SMALL_BYTES), 100 bytes in */
    uint64_t n = 20 * 4096 + 300;
    ddo_tensor_desc d[1] = { { "w", DDO_DTYPE_U8, 1, &n, a } };
    ddo_checkpoint *ck = NULL;
    T_REQUIRE(ddo_checkpoint_create_from_memory(d, 1, &ck) == 0);
    ddo_device *dev = NULL;
    T_REQUIRE(ddo_device_create("cpu", NULL, &dev) == 0);
    ddo__account ret, reg;
    ddo__account_init(&ret, "retained host", "vmm_source_cache_gb", 0);
    ddo__account_init(&reg, "registered host", "vmm_source_registered_gb", 1 << 20);
    ddo__source_params p = {
        .ck = ck, .dev = dev, .workers = 1, .retained = &ret, .registered = &reg
    };
    ddo__source_request req[1] = { { 0, true, true, 0, 0, false } };
    ddo__source *src = NULL;
    T_REQUIRE(ddo__source_create(&p, req, 1, &src, NULL) == 0);
    ddo__host_piece pc[3];
    T_REQUIRE(ddo__source_host_pieces(src, 0, pc) == 3);
    T_CHECK(pc[0].offset == 0 && pc[0].len == 4096 - 100);
    T_CHECK(pc[1].offset == 4096 - 100 && pc[1].len == 19 * 4096 && pc[1].src == buf + 4096);
    T_CHECK(pc[2].offset == 20 * 4096 - 100 && pc[2].len == 400);
    T_CHECK(pc[0].src != (const void *)a && memcmp(pc[0].src, a, (size_t)pc[0].len) == 0);
    T_CHECK(memcmp(pc[2].src, a + pc[2].offset, (size_t)pc[2].len) == 0);
    /* inner pages + the arena (3996 + 400 fragment bytes, rounded to pages) */
    T_EQ_U64(ddo__account_used(&reg), 19 * 4096 + 2 * 4096);
    /* Memory right after the tensor shares its last page and was never registered: a copy
     * from it (here 4 KiB, crossing into the next page) is an ordinary pageable copy. */
    void *stream = NULL;
    uint64_t dst = 0;
    T_REQUIRE(ddo__dev_stream_create(dev, 1, &stream) == 0);
    T_REQUIRE(ddo__dev_mem_alloc(dev, 4096, &dst) == 0);
    T_EQ_INT(ddo__dev_copy_h2d(dev, dst, a + n, 4096, stream), 0);
    T_EQ_INT(ddo__dev_stream_synchronize(dev, stream), 0);
    ddo__dev_mem_free(dev, dst);
    ddo__dev_stream_destroy(dev, stream);
    ddo__source_destroy(src);
    T_EQ_U64(ddo__account_used(&reg), 0);
    ddo__account_fini(&ret);
    ddo__account_fini(&reg);
    ddo_device_destroy(dev);
    ddo_checkpoint_destroy(ck);
    ddo__os_aligned_free(buf);
}

static void test_host_memory_tensors(void)
{
    static uint8_t a[1000], b[3];
    for (size_t i = 0; i < sizeof(a); i++)
        a[i] = (uint8_t)i;
    uint64_t sa = sizeof(a), sb = sizeof(b);
    ddo_tensor_desc d[2] = { { "a", DDO_DTYPE_U8, 1, &sa, a }, { "b", DDO_DTYPE_U8, 1, &sb, b } };
    ddo_checkpoint *ck = NULL;
    T_REQUIRE(ddo_checkpoint_create_from_memory(d, 2, &ck) == 0);
    ddo_device *dev = NULL;
    T_REQUIRE(ddo_device_create("cpu", NULL, &dev) == 0);
    ddo__account ret, reg;
    ddo__account_init(&ret, "retained host", "vmm_source_cache_gb", 0);
    ddo__account_init(&reg, "registered host", "vmm_source_registered_gb", 0);
    ddo__source_params p = {
        .ck = ck, .dev = dev, .workers = 2, .retained = &ret, .registered = &reg
    };
    size_t ia = SIZE_MAX, ib = SIZE_MAX;
    T_REQUIRE(ddo_checkpoint_find(ck, "a", &ia) == 0 && ddo_checkpoint_find(ck, "b", &ib) == 0);
    ddo__source_request req[2] = { { ia, true, true, 0, 0, false },
                                   { ib, false, false, 0, 0, false } };
    uint64_t r1 = 1, r2 = 1;
    T_EQ_INT(ddo__source_bytes(ck, req, 2, &r1, &r2, NULL), 0);
    T_EQ_U64(r1, 0); /* the caller's memory: the store copies nothing */
    T_EQ_U64(r2, 0);
    /* Registered in place: the pages under "a" go through the registered account, which
     * refuses before the registration when it has no room. */
    ddo__source *src = NULL;
    ddo__errbuf eb = { 0 };
    T_EQ_INT(ddo__source_create(&p, req, 2, &src, &eb), DDO_E_BUDGET);
    T_CONTAINS(eb.msg, "vmm_source_registered_gb");
    T_CHECK(src == NULL);
    T_EQ_U64(ddo__account_used(&reg), 0);
    ddo__account_fini(&reg);
    ddo__account_init(&reg, "registered host", "vmm_source_registered_gb", 3 * 4096);
    T_EQ_INT(ddo__source_create(&p, req, 2, &src, NULL), 0);
    T_REQUIRE(src != NULL);
    /* 1000 bytes hold no whole page: all of it is a fragment, copied to the pinned arena. */
    ddo__host_range ra = { a, sizeof(a), 0, 0 };
    T_EQ_U64(ddo__account_used(&reg), ddo__host_pins_bytes(&ra, 1));
    T_EQ_U64(ddo__account_used(&reg), 4096);
    T_EQ_U64(ddo__account_used(&ret), 0);
    ddo__host_piece pc[3];
    T_EQ_U64(ddo__source_host_pieces(src, ia, pc), 1);
    T_CHECK(pc[0].offset == 0 && pc[0].len == sizeof(a) && pc[0].src != (const void *)a);
    T_CHECK(memcmp(pc[0].src, a, sizeof(a)) == 0);
    bool registered = false;
    T_CHECK(ddo__source_host_ptr(src, ia, &registered) == (const void *)a);
    T_CHECK(registered);
    T_CHECK(ddo__source_host_ptr(src, ib, NULL) == NULL);
    uint8_t w[64];
    const void *data = NULL;
    T_EQ_INT(ddo__source_read_file(src, ia, 10, 20, w, sizeof(w), &data, NULL), 0);
    T_CHECK(data == (const void *)w && memcmp(w, a + 10, 20) == 0);
    ddo__source_destroy(src);
    T_EQ_U64(ddo__account_used(&reg), 0); /* unregistered */
    /* bad requests */
    ddo__source_request dup[2] = { { ia, true, false, 0, 0, false },
                                   { ia, true, false, 0, 0, false } };
    T_EQ_INT(ddo__source_create(&p, dup, 2, &src, &eb), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(eb.msg, "tensor \"a\": requested twice");
    ddo__source_request bad[1] = { { ib, false, true, 0, 0, false } };
    T_EQ_INT(ddo__source_create(&p, bad, 1, &src, &eb), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(eb.msg, "register_ without retain");
    ddo__account_fini(&ret);
    ddo__account_fini(&reg);
    ddo_device_destroy(dev);
    ddo_checkpoint_destroy(ck);
}

typedef struct reader {
    ddo__source *src;
    size_t idx;
    int seed;
    int bad;
} reader;

static void *read_many(void *arg)
{
    reader *r = arg;
    size_t cap = ddo__source_window_need(3 * MIB);
    uint8_t *w = window(cap);
    if (w == NULL) {
        r->bad = 1;
        return NULL;
    }
    uint64_t x = (uint64_t)r->seed * 7919 + 1;
    for (int k = 0; k < 24; k++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t off = (x >> 20) % (70 * MIB - 3 * MIB);
        size_t len = k % 3 == 0 ? 3 * MIB : (size_t)((x >> 8) % (2 * MIB)) + 1;
        const void *data = NULL;
        if (ddo__source_read_file(r->src, r->idx, off, len, w, cap, &data, NULL) != 0 ||
            memcmp(data, file_bytes + offs[7] + off, len) != 0)
            r->bad = 1;
    }
    ddo__os_aligned_free(w);
    return NULL;
}

static void test_concurrent_reads(void)
{
    fixture fx;
    T_REQUIRE(fixture_open(&fx, UINT64_MAX, UINT64_MAX) == 0);
    ddo__source_params p = params(&fx, 1, DDO__READ_ENGINE_AUTO, false);
    ddo__source *src = NULL;
    T_REQUIRE(ddo__source_create(&p, NULL, 0, &src, NULL) == 0);
    ddo__thread t[4];
    reader r[4];
    for (int i = 0; i < 4; i++) {
        r[i] = (reader){ src, tensor_index(fx.ck, 7), i, 0 };
        T_REQUIRE(ddo__thread_create(&t[i], read_many, &r[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        ddo__thread_join(t[i]);
        T_EQ_INT(r[i].bad, 0);
    }
    ddo__source_destroy(src);
    fixture_close(&fx);
}

int main(void)
{
    const char *base = getenv("DDO_BUILD_DIR");
    /* not /tmp: O_DIRECT needs a real file system (tmpfs may refuse it) */
    snprintf(dir, sizeof(dir), "%s/ddo-test-source-XXXXXX", base ? base : "/var/tmp");
    if (mkdtemp(dir) == NULL) {
        perror(dir);
        return 1;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if (write_checkpoint(path) != 0) {
        perror(path);
        return 1;
    }
    T_RUN(test_sizes_are_the_planner_formula);
    T_RUN(test_bytes_pread_engine);
    T_RUN(test_bytes_io_uring_engine);
    T_RUN(test_registered_segments_whole);
    T_RUN(test_accounts_refuse_before_allocating);
    T_RUN(test_registration_failure);
    T_RUN(test_read_file_alignment);
    T_RUN(test_read_file_changed);
    T_RUN(test_memory_image_falls_back_to_pread);
    T_RUN(test_host_memory_tensors);
    T_RUN(test_host_tensor_pieces);
    T_RUN(test_concurrent_reads);
    unlink(path);
    rmdir(dir);
    free(file_bytes);
    return t_done();
}
