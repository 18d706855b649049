/*
 * bench_cpu_stream.c - the streaming pipeline on the cpu device, throttled:
 * copies run at bandwidth B and every unit costs C seconds of host compute.
 * With prefetch the step time should be max(units x C, streamed bytes / B)
 * plus little; this prints measured / ideal for a bandwidth-bound, a
 * balanced and a compute-bound case (issue 5 asks for within 10%).
 *
 * usage: bench_cpu_stream [--gbps B] [--units N] [--unit-mib M] [--steps S]
 *                         [--slots K] [--backend linear|vmm]
 *
 * A benchmark, not a test: the numbers are recorded in docs/benchmarks.md.
 */
#include "ddo.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Writes a checkpoint of n blocks "blocks.i.{a,b}.weight", each tensor [rows, 1024] F32. */
static int write_model(const char *path, size_t n, size_t rows)
{
    size_t cap = 256 + n * 256, len = 0;
    char *hdr = malloc(cap);
    if (hdr == NULL)
        return -1;
    uint64_t tensor_bytes = (uint64_t)rows * 1024u * 4u, off = 0;
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            len += (size_t)snprintf(hdr + len, cap - len,
                                    "%s\"blocks.%zu.%c.weight\":{\"dtype\":\"F32\",\"shape\":[%zu,"
                                    "1024],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                                    (i == 0 && k == 0) ? "" : ",", i, k == 0 ? 'a' : 'b', rows, off,
                                    off + tensor_bytes);
            off += tensor_bytes;
        }
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8 != 0)
        hdr[len++] = ' ';
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        free(hdr);
        return -1;
    }
    uint64_t hl = len;
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(hl >> (8 * i));
    int ok = fwrite(le, 1, 8, f) == 8 && fwrite(hdr, 1, len, f) == len;
    float *buf = malloc((size_t)tensor_bytes);
    ok = ok && buf != NULL;
    for (size_t i = 0; ok && i < 2 * n; i++) {
        for (size_t j = 0; j < rows * 1024u; j++)
            buf[j] = (float)((i * 31u + j) % 97u) / 97.0f;
        ok = fwrite(buf, 1, (size_t)tensor_bytes, f) == tensor_bytes;
    }
    free(buf);
    free(hdr);
    return fclose(f) == 0 && ok ? 0 : -1;
}

typedef struct result {
    double step_s;  /* mean over the measured steps */
    double ideal_s; /* max(compute, streamed bytes / B) */
    double compute_s, transfer_s;
    double stall_s;       /* per step */
    double bytes;         /* streamed per step */
    double hits;          /* per step */
    double planned_bytes; /* bytes of the plan's streamed units */
} result;

static double metric(ddo_session *s, const char *name)
{
    ddo_metrics *m = NULL;
    double v = 0;
    if (ddo_session_metrics(s, false, &m) == 0)
        ddo_metrics_get(m, name, &v);
    ddo_metrics_destroy(m);
    return v;
}

/* Busy host work of at least c seconds that also reads every byte of the unit. */
static double compute(ddo_session *s, const size_t *t, size_t count, const ddo_checkpoint *ck,
                      double c)
{
    uint64_t t0 = now_ns();
    double sum = 0;
    for (size_t j = 0; j < count; j++) {
        void *p = NULL;
        if (ddo_session_tensor_address(s, t[j], &p) != 0 || p == NULL)
            continue;
        const ddo_tensor_info *ti = ddo_checkpoint_tensor(ck, t[j]);
        const float *f = p;
        for (uint64_t k = 0; k < ti->nbytes / 4; k += 16)
            sum += f[k];
    }
    while ((double)(now_ns() - t0) / 1e9 < c)
        ;
    return sum;
}

static int run_case(const char *path, const char *backend, double gbps, size_t slots,
                    double c_per_unit, uint64_t steps, result *r)
{
    ddo_checkpoint *ck = NULL;
    ddo_config *cfg = NULL;
    ddo_device *dev = NULL;
    ddo_plan *plan = NULL;
    ddo_session *s = NULL;
    ddo_stream *st = NULL;
    ddo_cpu_options o_cpu = DDO_CPU_OPTIONS_INIT;
    o_cpu.bytes_per_s = gbps * 1e9;
    ddo_device_options o = DDO_DEVICE_OPTIONS_INIT;
    o.cpu = &o_cpu;
    char slots_s[32];
    snprintf(slots_s, sizeof slots_s, "%zu", slots);
    int rc = ddo_checkpoint_create(path, DDO_READ_DEFAULT, &ck);
    if (rc == 0)
        rc = ddo_config_create(&cfg);
    if (rc == 0)
        rc = ddo_config_apply_preset(cfg, backend, "auto");
    if (rc == 0)
        rc = ddo_config_set(cfg, "execution_device", "cpu");
    if (rc == 0)
        rc = ddo_config_set(cfg, "execution_slots", slots_s);
    if (rc == 0) /* retain everything: the copy throttle, not the file, is the bus */
        rc = ddo_config_set(cfg, "vmm_source_cache_gb", "64");
    if (rc == 0)
        rc = ddo_config_validate(cfg);
    if (rc == 0)
        rc = ddo_device_create("cpu", &o, &dev);
    if (rc == 0) {
        ddo_device_caps caps;
        ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
        rc = ddo_device_caps_get(dev, &caps);
        in.device_total_bytes = caps.total_bytes;
        in.device_free_bytes = caps.free_bytes;
        in.device_granularity = caps.granularity;
        in.device_is_cpu = true;
        in.device_vmm_supported = caps.vmm_supported;
        if (rc == 0)
            rc = ddo_plan_build(ck, cfg, &in, &plan);
    }
    if (rc == 0)
        rc = ddo_stream_create(dev, &st);
    if (rc == 0)
        rc = ddo_session_create(plan, ck, dev, NULL, &s);
    if (rc != 0) {
        fprintf(stderr, "bench_cpu_stream: setup: %s: %s\n", ddo_strerror(rc), ddo_last_error());
        goto out;
    }
    size_t units = ddo_plan_unit_count(plan);
    double sink = 0;
    uint64_t t_measure = 0;
    double bytes0 = 0, stall0 = 0, hits0 = 0;
    for (size_t u = 0; u < units; u++) {
        ddo_unit_info ui;
        if (ddo_plan_unit(plan, u, &ui) == 0 && !ui.resident)
            r->planned_bytes += (double)ui.bytes;
    }
    for (uint64_t step = 0; step < steps + 1 && rc == 0; step++) {
        if (step == 1) { /* step 0 learns the order; measure from here */
            t_measure = now_ns();
            bytes0 = metric(s, "copy_bytes");
            stall0 = metric(s, "stall_ns");
            hits0 = metric(s, "hits");
        }
        for (size_t u = 0; u < units && rc == 0; u++) {
            size_t count = 0;
            const size_t *t = ddo_plan_unit_tensors(plan, u, &count);
            rc = ddo_session_acquire(s, u, st);
            if (rc == 0)
                rc = ddo_stream_synchronize(st);
            if (rc == 0) {
                sink += compute(s, t, count, ck, c_per_unit);
                rc = ddo_session_release(s, u, st);
            }
        }
    }
    if (rc != 0) {
        fprintf(stderr, "bench_cpu_stream: step: %s: %s\n", ddo_strerror(rc), ddo_session_error(s));
        goto out;
    }
    r->step_s = (double)(now_ns() - t_measure) / 1e9 / (double)steps;
    r->bytes = (metric(s, "copy_bytes") - bytes0) / (double)steps;
    r->hits = (metric(s, "hits") - hits0) / (double)steps;
    r->stall_s = (metric(s, "stall_ns") - stall0) / 1e9 / (double)steps;
    r->compute_s = c_per_unit * (double)units;
    r->transfer_s = r->bytes / (gbps * 1e9);
    r->ideal_s = r->compute_s > r->transfer_s ? r->compute_s : r->transfer_s;
    if (sink == 12345.678) /* keep the reads */
        fprintf(stderr, " ");
out:
    ddo_session_destroy(s);
    ddo_stream_destroy(st);
    ddo_plan_destroy(plan);
    ddo_device_destroy(dev);
    ddo_config_destroy(cfg);
    ddo_checkpoint_destroy(ck);
    return rc;
}

int main(int argc, char **argv)
{
    double gbps = 2.0, unit_mib = 8.0;
    size_t units = 24, slots = 3;
    uint64_t steps = 5;
    const char *backend = "linear";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--gbps") == 0)
            gbps = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--units") == 0)
            units = (size_t)atol(argv[i + 1]);
        else if (strcmp(argv[i], "--unit-mib") == 0)
            unit_mib = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--steps") == 0)
            steps = (uint64_t)atol(argv[i + 1]);
        else if (strcmp(argv[i], "--slots") == 0)
            slots = (size_t)atol(argv[i + 1]);
        else if (strcmp(argv[i], "--backend") == 0)
            backend = argv[i + 1];
        else {
            fprintf(stderr, "bench_cpu_stream: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (gbps <= 0 || units < 2 || unit_mib < 1 || steps < 1 || slots < 2) {
        fprintf(stderr, "bench_cpu_stream: bad arguments\n");
        return 2;
    }
    const char *tmp = getenv("TMPDIR");
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/ddo-bench-XXXXXX", tmp != NULL && *tmp ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "bench_cpu_stream: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    /* two tensors per unit, [rows, 1024] F32 each */
    size_t rows = (size_t)(unit_mib * 1024.0 * 1024.0 / 2.0 / 4096.0);
    if (write_model(path, units, rows) != 0) {
        fprintf(stderr, "bench_cpu_stream: cannot write %s\n", path);
        rmdir(dir);
        return 1;
    }
    double unit_bytes = (double)rows * 1024.0 * 4.0 * 2.0;
    double t_unit = unit_bytes / (gbps * 1e9);
    printf("cpu device throttled to B = %.2f GB/s; %zu units of %.1f MiB (%.2f ms each at B); "
           "%zu slots; route family %s; %" PRIu64 " measured steps after one learning step\n\n",
           gbps, units, unit_bytes / 1048576.0, t_unit * 1e3, slots, backend, steps);
    printf("%-16s %9s %9s %10s %9s %9s %9s %9s %6s %7s\n", "case", "C/unit", "compute", "streamed",
           "bytes/B", "ideal", "measured", "stall", "hits", "ratio");
    const struct {
        const char *name;
        double factor; /* C = factor x transfer time of one unit */
    } cases[] = { { "bandwidth-bound", 0.5 }, { "balanced", 1.0 }, { "compute-bound", 2.0 } };
    int worst_ok = 1, rc = 0;
    double planned = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        result r;
        memset(&r, 0, sizeof r);
        rc = run_case(path, backend, gbps, slots, cases[k].factor * t_unit, steps, &r);
        if (rc != 0)
            break;
        double ratio = r.step_s / r.ideal_s;
        printf("%-16s %7.2fms %7.1fms %6.1f MiB %7.1fms %7.1fms %7.1fms %7.1fms %6.1f %7.3f%s\n",
               cases[k].name, cases[k].factor * t_unit * 1e3, r.compute_s * 1e3,
               r.bytes / 1048576.0, r.transfer_s * 1e3, r.ideal_s * 1e3, r.step_s * 1e3,
               r.stall_s * 1e3, r.hits, ratio, ratio <= 1.10 ? "" : "  (> 1.10)");
        if (k == 0)
            planned = r.planned_bytes;
        if (ratio > 1.10)
            worst_ok = 0;
    }
    unlink(path);
    rmdir(dir);
    if (rc != 0)
        return 1;
    printf("\nthe plan streams %.1f MiB per step; \"streamed\" is what the session copied "
           "(slots still holding a unit are hits: no copy)\n",
           planned / 1048576.0);
    printf("%s: measured step time %s within 10%% of max(compute, streamed bytes / B)\n",
           worst_ok ? "OK" : "NOT OK", worst_ok ? "is" : "is NOT");
    return worst_ok ? 0 : 1;
}
