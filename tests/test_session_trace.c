/*
 * test_session_trace.c - the session's trace hook reports every upload (on
 * the copy engine), every map and unmap of an execution slot, with sane
 * times and byte counts, from the session's own threads.
 * ctest-labels: unit backend threads
 */
#include "ddo.h"
#include "os/thread.h"
#include "t.h"

#include <stdint.h>

#define BLOCKS 6
#define ROWS   64
#define COLS   1024 /* F32: 256 KiB per weight, two weights per block */

typedef struct seen {
    ddo__mutex mu;
    int uploads, maps, unmaps, other;
    uint64_t upload_bytes;
    int bad_times;
} seen;

static void on_trace(void *user, const char *kind, size_t unit, uint64_t begin_ns, uint64_t end_ns,
                     uint64_t bytes)
{
    seen *s = user;
    (void)unit;
    ddo__mutex_lock(&s->mu);
    if (end_ns < begin_ns || begin_ns == 0)
        s->bad_times++;
    if (strcmp(kind, "upload") == 0) {
        s->uploads++;
        s->upload_bytes += bytes;
    } else if (strcmp(kind, "map") == 0) {
        s->maps++;
    } else if (strcmp(kind, "unmap") == 0) {
        s->unmaps++;
    } else {
        s->other++;
    }
    ddo__mutex_unlock(&s->mu);
}

static void test_trace_reports_uploads_and_maps(void)
{
    static float data[BLOCKS][2][ROWS * COLS];
    static char names[BLOCKS][2][64];
    static const uint64_t shape[2] = { ROWS, COLS };
    ddo_tensor_desc td[BLOCKS * 2];
    for (int b = 0; b < BLOCKS; b++)
        for (int w = 0; w < 2; w++) {
            snprintf(names[b][w], sizeof(names[b][w]), "blocks.%d.%s.weight", b, w ? "b" : "a");
            for (size_t i = 0; i < ROWS * COLS; i++)
                data[b][w][i] = (float)(b * 2 + w) + (float)i * 1e-6f;
            td[b * 2 + w] = (ddo_tensor_desc){ names[b][w], DDO_DTYPE_F32, 2, shape, data[b][w] };
        }
    ddo_checkpoint *ck = NULL;
    ddo_config *cfg = NULL;
    ddo_device *dev = NULL;
    ddo_plan *plan = NULL;
    ddo_session *s = NULL;
    ddo_stream *st = NULL;
    T_REQUIRE(ddo_checkpoint_create_from_memory(td, BLOCKS * 2, &ck) == 0);
    T_REQUIRE(ddo_config_create(&cfg) == 0);
    T_REQUIRE(ddo_config_apply_preset(cfg, "vmm", "auto") == 0);
    T_REQUIRE(ddo_config_set(cfg, "execution_device", "cpu") == 0);
    T_REQUIRE(ddo_config_set(cfg, "small_tensor_threshold_bytes", "0") == 0);
    T_REQUIRE(ddo_config_set(cfg, "vmm_resident_weight_budget_gb", "0.25") == 0);
    T_REQUIRE(ddo_config_set(cfg, "resident_module_budget_gb", "0") == 0); /* stream */
    T_REQUIRE(ddo_config_set(cfg, "execution_slots", "2") == 0);
    ddo_cpu_options dopt_cpu = DDO_CPU_OPTIONS_INIT;
    dopt_cpu.memory_bytes = (uint64_t)1 << 30;
    dopt_cpu.granularity = 64 * 1024;
    ddo_device_options dopt = DDO_DEVICE_OPTIONS_INIT;
    dopt.cpu = &dopt_cpu;
    T_REQUIRE(ddo_device_create("cpu", &dopt, &dev) == 0);
    ddo_device_caps caps;
    T_REQUIRE(ddo_device_caps_get(dev, &caps) == 0);
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    in.device_total_bytes = caps.total_bytes;
    in.device_granularity = caps.granularity;
    in.device_is_cpu = true;
    in.device_vmm_supported = true;
    T_REQUIRE(ddo_plan_build(ck, cfg, &in, &plan) == 0);
    T_REQUIRE(ddo_plan_unit_count(plan) == BLOCKS);
    seen sn;
    memset(&sn, 0, sizeof(sn));
    ddo__mutex_init(&sn.mu);
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = cfg;
    so.trace = on_trace;
    so.trace_user = &sn;
    T_REQUIRE(ddo_session_create(plan, ck, dev, &so, &s) == 0);
    T_REQUIRE(ddo_stream_create(dev, &st) == 0);
    int maps_settled = -1, uploads_settled = -1;
    for (int pass = 0; pass < 5; pass++) {
        for (size_t u = 0; u < BLOCKS; u++) {
            T_CHECK(ddo_session_acquire(s, u, st) == 0);
            T_CHECK(ddo_stream_synchronize(st) == 0);
            T_CHECK(ddo_session_release(s, u, st) == 0);
        }
        if (pass == 2) { /* learned in pass 1, settled in pass 2 */
            T_CHECK(ddo_session_synchronize(s) == 0);
            ddo__mutex_lock(&sn.mu);
            maps_settled = sn.maps;
            uploads_settled = sn.uploads;
            ddo__mutex_unlock(&sn.mu);
        }
    }
    T_CHECK(ddo_session_synchronize(s) == 0);
    ddo_metrics *m = NULL;
    T_REQUIRE(ddo_session_metrics(s, true, &m) == 0);
    double uploads = -1, copied = -1, vmm_maps = -1;
    T_CHECK(ddo_metrics_get(m, "uploads", &uploads) == 0);
    T_CHECK(ddo_metrics_get(m, "vmm_maps", &vmm_maps) == 0);
    T_CHECK(ddo_metrics_get(m, "copy_bytes", &copied) == 0);
    ddo_metrics_destroy(m);
    ddo__mutex_lock(&sn.mu);
    T_CHECK(sn.uploads > 0);
    T_EQ_INT(sn.uploads, (long long)uploads);
    T_EQ_U64(sn.upload_bytes, (uint64_t)copied);
    /* A load maps the slot's handle into the unit's range unless that range still maps it
     * (an alias kept from an earlier load); a range is unmapped only to move it to another
     * slot. Once the order is known and every unit has settled into its slot (6 units, 2
     * slots), uploads map nothing. */
    T_EQ_INT(sn.maps, (long long)vmm_maps);
    T_CHECK(sn.maps >= 2 && sn.maps <= sn.uploads);
    T_CHECK(sn.unmaps <= sn.maps);
    T_CHECK(sn.uploads > uploads_settled);
    T_EQ_INT(sn.maps, maps_settled);
    T_EQ_INT(sn.bad_times, 0);
    T_EQ_INT(sn.other, 0);
    ddo__mutex_unlock(&sn.mu);
    ddo_stream_destroy(st);
    ddo_session_destroy(s);
    ddo__mutex_destroy(&sn.mu);
    ddo_plan_destroy(plan);
    ddo_device_destroy(dev);
    ddo_config_destroy(cfg);
    ddo_checkpoint_destroy(ck);
}

int main(void)
{
    T_RUN(test_trace_reports_uploads_and_maps);
    return t_done();
}
