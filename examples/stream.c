/*
 * stream.c - the smallest C host of libddo: four blocks of weights held in host memory are
 * planned under a zero-resident budget on the cpu reference device, streamed one unit at a
 * time, and every weight is checked against its source bytes. Built against an installed
 * libddo, with pkg-config or with CMake's find_package(ddo) (examples/CMakeLists.txt):
 *
 *     cc stream.c $(pkg-config --cflags --libs ddo) -o stream && ./stream
 *
 * Prints one line and exits 0 when every streamed byte matched.
 */
#include <ddo.h>
#include <ddo_host.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCKS 4
#define ROWS   256
#define COLS   256

static int fail(const char *what, int rc)
{
    fprintf(stderr, "stream: %s: %s (%s)\n", what, ddo_errname(rc), ddo_last_error());
    return 1;
}

/* Tensor t where the acquired unit put it on the device, against its source bytes (the cpu
 * device's memory is host memory; on a GPU a host would copy it back first). */
static int check_tensor(ddo_session *s, size_t t, const float *src, size_t bytes)
{
    void *at = NULL;
    int rc = ddo_session_tensor_address(s, t, &at);
    if (rc != 0)
        return fail("ddo_session_tensor_address", rc);
    if (at == (const void *)src || memcmp(at, src, bytes) != 0)
        return fprintf(stderr, "stream: tensor %zu was not streamed intact\n", t), 1;
    return 0;
}

/* Acquires every unit in order and checks its tensors; returns the units streamed, or -1. */
static long stream_all(ddo_session *s, const ddo_plan *plan, ddo_stream *st, float **w)
{
    long streamed = 0;
    for (size_t u = 0; u < ddo_plan_unit_count(plan); u++) {
        int rc = ddo_session_acquire(s, u, st);
        if (rc != 0)
            return fail("ddo_session_acquire", rc), -1;
        size_t n = 0;
        const size_t *ts = ddo_plan_unit_tensors(plan, u, &n);
        for (size_t i = 0; i < n; i++)
            if (check_tensor(s, ts[i], w[ts[i]], sizeof(float) * ROWS * COLS) != 0)
                return -1;
        rc = ddo_session_release(s, u, st);
        if (rc != 0)
            return fail("ddo_session_release", rc), -1;
        streamed++;
    }
    return streamed;
}

static int configure(ddo_config **cfg)
{
    static const char *const set[][2] = {
        { "execution_device", "cpu" },
        { "always_resident_modules_pattern", "^$" },
        { "small_tensor_threshold_bytes", "0" },
        { "resident_module_budget_gb", "0" },
    };
    int rc = ddo_config_create(cfg);
    for (size_t i = 0; rc == 0 && i < sizeof(set) / sizeof(set[0]); i++)
        rc = ddo_config_set(*cfg, set[i][0], set[i][1]);
    return rc == 0 ? ddo_config_validate(*cfg) : rc;
}

static int run(float **w, ddo_tensor_desc *descs)
{
    ddo_config *cfg = NULL;
    ddo_checkpoint *ck = NULL;
    ddo_setup *setup = NULL;
    ddo_plan *plan = NULL;
    ddo_session *s = NULL;
    ddo_stream *st = NULL;
    ddo_setup_options so = DDO_SETUP_OPTIONS_INIT;
    so.device = DDO_DEVICE_CHOICE_EXACT;
    ddo_session_options opts = DDO_SESSION_OPTIONS_INIT;
    long streamed = -1;
    int rc = configure(&cfg);
    if (rc == 0)
        rc = ddo_checkpoint_create_from_memory(descs, BLOCKS, &ck);
    if (rc == 0)
        rc = ddo_setup_create(cfg, &so, &setup);
    if (rc == 0)
        rc = ddo_setup_plan(setup, ck, cfg, NULL, &plan);
    opts.config = cfg;
    if (rc == 0)
        rc = ddo_session_create(plan, ck, ddo_setup_device(setup), &opts, &s);
    if (rc == 0)
        rc = ddo_stream_wrap(ddo_setup_device(setup), NULL, &st);
    if (rc == 0)
        streamed = stream_all(s, plan, st, w);
    if (rc == 0 && streamed > 0)
        printf("stream: libddo %s, %ld units streamed on %s, every byte matched\n",
               ddo_version_string(), streamed, ddo_setup_device_spec(setup));
    ddo_stream_destroy(st);
    ddo_session_destroy(s);
    ddo_plan_destroy(plan);
    ddo_setup_destroy(setup);
    ddo_checkpoint_destroy(ck);
    ddo_config_destroy(cfg);
    if (rc != 0)
        return fail("setup", rc);
    return streamed > 0 ? 0 : 1;
}

int main(void)
{
    static char names[BLOCKS][32];
    static const uint64_t shape[2] = { ROWS, COLS };
    float *w[BLOCKS] = { 0 };
    ddo_tensor_desc descs[BLOCKS];
    int rc = 0;
    for (size_t b = 0; b < BLOCKS && rc == 0; b++) {
        w[b] = malloc(sizeof(float) * ROWS * COLS);
        if (w[b] == NULL) {
            rc = 1;
            break;
        }
        for (size_t i = 0; i < (size_t)ROWS * COLS; i++)
            w[b][i] = (float)(b * 1000 + i % 997);
        snprintf(names[b], sizeof(names[b]), "blocks.%zu.weight", b);
        descs[b] = (ddo_tensor_desc){ names[b], DDO_DTYPE_F32, 2, shape, w[b] };
    }
    if (rc == 0)
        rc = run(w, descs);
    for (size_t b = 0; b < BLOCKS; b++)
        free(w[b]);
    return rc;
}
