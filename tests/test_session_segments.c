/*
 * test_session_segments.c - uploads from registered retained memory never
 * cross a 64 MiB registration segment: each segment is its own registration
 * and the CUDA driver rejects a copy whose host range spans two (seen on the
 * H200 as cuMemcpyHtoDAsync: CUDA_ERROR_INVALID_VALUE); the cpu device
 * rejects it the same way, so this test fails if the session splits wrongly.
 * ctest-labels: unit backend
 */
#include "session_fx.h"
#include "t.h"

/* 40 MiB weights: every other one straddles a 64 MiB segment boundary of the store. */
static void test_registered_uploads_split_at_segments(void)
{
    fx f;
    fx_opts o = { 0 };
    o.blocks = 3;
    o.slots = 2;
    o.mode = "vmm_fast_runtime";
    o.file = true;
    o.cache_gb = 1.0;
    o.pin = true;
    o.device_bytes = (uint64_t)1 << 30;
    o.budget_gb = 0.5;
    o.cols = (uint64_t)40 << 20 >> 8; /* F32 [64, cols] = 40 MiB */
    int rc = fx_create(&f, &o);
    T_REQUIRE(rc == 0);
    T_CHECK(fx_metric(&f, "planned_registered_bytes") > 0);
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 3; b++) {
            size_t u = fx_unit(&f, b);
            T_REQUIRE(u != SIZE_MAX);
            rc = fx_use(&f, u);
            T_CHECK_MSG(rc == 0, "unit blocks.%d: %d: %s", b, rc, ddo_last_error());
        }
    /* Every upload came straight from registered memory. */
    T_CHECK(fx_metric(&f, "bytes_from_registered") > 0);
    T_NEAR(fx_metric(&f, "bytes_staged_from_retained"), 0, 0);
    fx_destroy(&f);
}

int main(void)
{
    T_RUN(test_registered_uploads_split_at_segments);
    return t_done();
}
