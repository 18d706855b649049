/*
 * test_staging.c - the staging ring on the cpu device: windows taken through
 * the staging account (refused before any pinned allocation), ring order,
 * acquire waiting for the window's last copy, drain, and clean failure when a
 * pinned allocation or an event cannot be created.
 * ctest-labels: unit backend threads
 */
#include "device/device.h"
#include "store/staging.h"
#include "t.h"

#define MIB ((size_t)1 << 20)

static ddo_device *open_cpu(double bytes_per_s)
{
    ddo_cpu_options o_cpu = DDO_CPU_OPTIONS_INIT;
    o_cpu.bytes_per_s = bytes_per_s;
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cpu = &o_cpu;
    ddo_device *dev = NULL;
    if (ddo_device_create("cpu", &o, &dev) != 0) {
        fprintf(stderr, "  device: %s\n", ddo_last_error());
        return NULL;
    }
    return dev;
}

static void check_zero(ddo_device *dev, ddo__account *a)
{
    T_EQ_U64(ddo__account_used(a), 0);
    ddo__device_usage_t u;
    ddo__device_usage(dev, &u);
    T_EQ_U64(u.pinned_bytes, 0);
}

static void test_ring_order_and_accounting(void)
{
    ddo_device *dev = open_cpu(0);
    T_REQUIRE(dev != NULL);
    ddo__account acc;
    ddo__account_init(&acc, "staging", "vmm_staging_buffer_gb", 3 * MIB);
    ddo__staging *st = NULL;
    T_EQ_INT(ddo__staging_create(dev, 3, MIB, &acc, &st, NULL), 0);
    T_REQUIRE(st != NULL);
    T_EQ_U64(ddo__staging_window_bytes(st), MIB);
    T_EQ_U64(ddo__staging_window_count(st), 3);
    T_EQ_U64(ddo__account_used(&acc), 3 * MIB);
    ddo__device_usage_t u;
    ddo__device_usage(dev, &u);
    T_EQ_U64(u.pinned_bytes, 3 * MIB);
    void *seen[3] = { NULL, NULL, NULL };
    for (size_t k = 0; k < 7; k++) {
        size_t idx = 99;
        void *w = NULL;
        uint64_t waited = 1;
        T_EQ_INT(ddo__staging_acquire(st, &idx, &w, &waited, NULL), 0);
        T_EQ_U64(idx, k % 3);
        T_EQ_U64(waited, 0); /* nothing submitted: no wait */
        T_CHECK(w != NULL && (uintptr_t)w % 4096 == 0);
        if (k < 3)
            seen[k] = w;
        else
            T_CHECK(seen[k % 3] == w);
    }
    T_CHECK(seen[0] != seen[1] && seen[1] != seen[2] && seen[0] != seen[2]);
    T_EQ_INT(ddo__staging_drain(st, NULL), 0);
    ddo__staging_destroy(st);
    ddo__staging_destroy(NULL);
    check_zero(dev, &acc);
    ddo__account_fini(&acc);
    ddo_device_destroy(dev);
}

static void test_acquire_waits_for_last_copy(void)
{
    /* 1 MiB at 50 MB/s: each copy takes about 21 ms */
    ddo_device *dev = open_cpu(50e6);
    T_REQUIRE(dev != NULL);
    ddo__account acc;
    ddo__account_init(&acc, "staging", "vmm_staging_buffer_gb", UINT64_MAX);
    ddo__staging *st = NULL;
    T_REQUIRE(ddo__staging_create(dev, 2, MIB, &acc, &st, NULL) == 0);
    void *stream = NULL;
    T_REQUIRE(ddo__dev_stream_create(dev, 1, &stream) == 0);
    uint64_t dptr[2] = { 0, 0 };
    T_REQUIRE(ddo__dev_mem_alloc(dev, MIB, &dptr[0]) == 0);
    T_REQUIRE(ddo__dev_mem_alloc(dev, MIB, &dptr[1]) == 0);
    for (int k = 0; k < 2; k++) {
        size_t idx;
        void *w;
        T_REQUIRE(ddo__staging_acquire(st, &idx, &w, NULL, NULL) == 0);
        memset(w, 0x10 + k, MIB);
        T_REQUIRE(ddo__dev_copy_h2d(dev, dptr[k], w, MIB, stream) == 0);
        T_EQ_INT(ddo__staging_submit(st, idx, stream, NULL), 0);
    }
    /* window 0 again: must not come back before its copy has finished */
    size_t idx = 9;
    void *w = NULL;
    uint64_t waited = 0;
    T_EQ_INT(ddo__staging_acquire(st, &idx, &w, &waited, NULL), 0);
    T_EQ_U64(idx, 0);
    T_CHECK_MSG(waited > 1000000, "waited only %llu ns", (unsigned long long)waited);
    memset(w, 0xEE, MIB); /* reusing it now must not change what the device received */
    uint8_t *back = malloc(MIB);
    T_REQUIRE(back != NULL);
    T_EQ_INT(ddo__dev_copy_d2h(dev, back, dptr[0], MIB), 0);
    size_t bad = 0;
    for (size_t i = 0; i < MIB; i++)
        bad += back[i] != 0x10;
    T_EQ_U64(bad, 0);
    /* drain waits for window 1's copy too */
    T_EQ_INT(ddo__staging_drain(st, NULL), 0);
    T_EQ_INT(ddo__dev_copy_d2h(dev, back, dptr[1], MIB), 0);
    bad = 0;
    for (size_t i = 0; i < MIB; i++)
        bad += back[i] != 0x11;
    T_EQ_U64(bad, 0);
    free(back);
    T_EQ_INT(ddo__staging_submit(st, 2, stream, NULL), DDO_E_INVALID_ARGUMENT);
    ddo__dev_mem_free(dev, dptr[0]);
    ddo__dev_mem_free(dev, dptr[1]);
    ddo__dev_stream_destroy(dev, stream);
    ddo__staging_destroy(st);
    check_zero(dev, &acc);
    ddo__account_fini(&acc);
    ddo_device_destroy(dev);
}

static void test_account_refuses_before_allocating(void)
{
    ddo_device *dev = open_cpu(0);
    T_REQUIRE(dev != NULL);
    ddo__account acc;
    ddo__account_init(&acc, "staging", "vmm_staging_buffer_gb", 3 * MIB - 1);
    ddo__device_stats_reset(dev);
    ddo__staging *st = (ddo__staging *)&acc;
    ddo__errbuf eb = { 0 };
    T_EQ_INT(ddo__staging_create(dev, 3, MIB, &acc, &st, &eb), DDO_E_BUDGET);
    T_CHECK(st == (ddo__staging *)&acc); /* not written on failure */
    T_CONTAINS(eb.msg, "staging: taking 3.00 MiB would use 3.00 MiB of 3.00 MiB "
                       "(vmm_staging_buffer_gb)");
    ddo__devop_stats s[DDO__OP_COUNT];
    ddo__device_stats(dev, s);
    T_EQ_U64(s[DDO__OP_HOST_ALLOC].calls, 0);
    T_EQ_U64(ddo__account_peak(&acc), 0);
    T_EQ_INT(ddo__staging_create(dev, 0, MIB, &acc, &st, &eb), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo__staging_create(dev, SIZE_MAX, SIZE_MAX, &acc, &st, &eb), DDO_E_OVERFLOW);
    ddo__account_fini(&acc);
    ddo_device_destroy(dev);
}

static void test_faults(void)
{
    static const ddo__devop ops[] = { DDO__OP_HOST_ALLOC, DDO__OP_EVENT_CREATE };
    for (size_t o = 0; o < DDO_ARRAY_LEN(ops); o++) {
        for (uint64_t nth = 1; nth <= 3; nth++) {
            ddo_device *dev = open_cpu(0);
            T_REQUIRE(dev != NULL);
            ddo__account acc;
            ddo__account_init(&acc, "staging", "vmm_staging_buffer_gb", UINT64_MAX);
            ddo__device_inject_fault(dev, ops[o], nth, false, DDO_E_DEVICE_MEMORY);
            ddo__staging *st = NULL;
            ddo__errbuf eb = { 0 };
            T_EQ_INT(ddo__staging_create(dev, 3, MIB, &acc, &st, &eb), DDO_E_DEVICE_MEMORY);
            T_CHECK(st == NULL);
            T_CONTAINS(eb.msg, "staging: ");
            check_zero(dev, &acc);
            ddo__device_clear_faults(dev);
            /* the same device works again afterwards */
            T_EQ_INT(ddo__staging_create(dev, 3, MIB, &acc, &st, &eb), 0);
            ddo__staging_destroy(st);
            check_zero(dev, &acc);
            ddo__account_fini(&acc);
            ddo_device_destroy(dev);
        }
    }
}

static void test_wait_failure_keeps_window(void)
{
    ddo_device *dev = open_cpu(0);
    T_REQUIRE(dev != NULL);
    ddo__account acc;
    ddo__account_init(&acc, "staging", "vmm_staging_buffer_gb", UINT64_MAX);
    ddo__staging *st = NULL;
    T_REQUIRE(ddo__staging_create(dev, 1, MIB, &acc, &st, NULL) == 0);
    void *stream = NULL;
    T_REQUIRE(ddo__dev_stream_create(dev, 1, &stream) == 0);
    size_t idx;
    void *w;
    T_REQUIRE(ddo__staging_acquire(st, &idx, &w, NULL, NULL) == 0);
    T_REQUIRE(ddo__staging_submit(st, idx, stream, NULL) == 0);
    ddo__device_inject_fault(dev, DDO__OP_EVENT_SYNCHRONIZE, 1, false, DDO_E_DEVICE);
    ddo__errbuf eb = { 0 };
    T_EQ_INT(ddo__staging_acquire(st, &idx, &w, NULL, &eb), DDO_E_DEVICE);
    T_CONTAINS(eb.msg, "staging: waiting for the copy from window 1: ");
    /* the window is still owed a wait: the next acquire waits again and succeeds */
    ddo__devop_stats before[DDO__OP_COUNT], after[DDO__OP_COUNT];
    ddo__device_stats(dev, before);
    T_EQ_INT(ddo__staging_acquire(st, &idx, &w, NULL, NULL), 0);
    ddo__device_stats(dev, after);
    T_EQ_U64(after[DDO__OP_EVENT_SYNCHRONIZE].calls - before[DDO__OP_EVENT_SYNCHRONIZE].calls, 1);
    ddo__dev_stream_destroy(dev, stream);
    ddo__staging_destroy(st);
    check_zero(dev, &acc);
    ddo__account_fini(&acc);
    ddo_device_destroy(dev);
}

int main(void)
{
    T_RUN(test_ring_order_and_accounting);
    T_RUN(test_acquire_waits_for_last_copy);
    T_RUN(test_account_refuses_before_allocating);
    T_RUN(test_faults);
    T_RUN(test_wait_failure_keeps_window);
    return t_done();
}
