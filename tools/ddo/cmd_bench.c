/*
 * cmd_bench.c - `ddo bench`: measures, in one run, the physical limits of the
 * machine and how close each requested route gets to them.
 *
 *   1. the bus limit: pinned host->device copies in 16 MiB pieces (cuda), or
 *      the cpu device's configured throttle / a memcpy;
 *   2. the page-cache read speed of the checkpoint (every file read once
 *      with pread in 16 MiB pieces), and a sample of O_DIRECT reads;
 *   3. the resident step time (every tensor resident, when it fits): the
 *      compute time of a step;
 *   4. each requested case (--case "NAME --ddo-flag value ..."): setup time,
 *      a warm-up step, N timed steps, one checksum step, the peaks.
 *
 * A step runs every unit in plan order: acquire, the unit's products on the
 * host stream (host.h), release; it ends when the stream is synchronized.
 * The bound of a step is max(compute, bus-fed bytes / bus bandwidth,
 * file-fed bytes / file read speed); the table prints step / bound.
 *
 * --trace FILE writes a Chrome/Perfetto trace (JSON trace-event format) of
 * the trace steps run after the timed steps: acquire waits, host compute
 * (issue, and on cuda the span the stream spent on the unit, via host
 * callbacks), releases, counters of bytes copied, hits and free device
 * memory, and the session's uploads, maps, unmaps and reclaims through its
 * trace hook (ddo_session_options.trace).
 */
#include "cleanup.h"
#include "compat.h"
#include "devset.h"
#include "host.h"
#include "order.h"
#include "os/thread.h"
#include "synth.h"
#include "tool.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* host_cuda.c (bench helpers; DDO_E_NO_DEVICE without CUDA). */
int ref_host_cuda_bus_bandwidth(ddo_stream *stream, uint64_t total_bytes, size_t piece_bytes,
                                double *bytes_per_s, char *err, size_t err_len);
int ref_host_cuda_stream_callback(ddo_stream *stream, void (*fn)(void *), void *user, char *err,
                                  size_t err_len);

#define MIB_D       (1024.0 * 1024.0)
#define GIB_D       (1024.0 * 1024.0 * 1024.0)
#define PIECE_BYTES ((size_t)16 << 20)
#define MAX_CASES   16

/* ---- small helpers ----------------------------------------------------------------- */

static uint64_t device_free(ddo_device *dev)
{
    ddo_device_caps caps;
    if (ddo_device_caps_get(dev, &caps) != 0)
        return 0;
    return caps.free_bytes;
}

/* ---- the trace --------------------------------------------------------------------- */

enum {
    TID_ACQUIRE = 1,
    TID_COMPUTE = 2,
    TID_GPU = 3,
    TID_RELEASE = 4,
    TID_STEP = 5,
    TID_COPY = 6,
    TID_MAP = 7,
    TID_LAST = TID_MAP
};

typedef struct trace_ev {
    const char *name; /* copied into text by trace_add (unit names die with their plan) */
    char text[64];
    const char *cat;
    char ph; /* 'X' span, 'C' counter */
    int tid;
    uint64_t ts_ns, dur_ns;
    double value; /* counters */
    int pid;      /* one process per case */
} trace_ev;

/* Filled by a host callback on the compute stream (cuda): when the stream reached it. */
typedef struct gpu_mark {
    uint64_t ns;
} gpu_mark;

typedef struct trace {
    trace_ev *ev;
    size_t len, cap;
    gpu_mark *marks; /* 2 per group of a trace step */
    size_t marks_cap;
    char **pid_names;
    size_t pids;
    uint64_t t0;
    bool ok;
    /* The session's own events (uploads, maps, reclaims) arrive from its threads. */
    ddo__mutex mu;
    bool session_on;      /* only during the trace steps */
    const ddo_plan *plan; /* names the units of the session's events */
} trace;

static void trace_add(trace *t, trace_ev e)
{
    if (t == NULL)
        return;
    ddo__mutex_lock(&t->mu);
    if (!t->ok) {
        ddo__mutex_unlock(&t->mu);
        return;
    }
    if (t->len == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1024;
        trace_ev *p = realloc(t->ev, cap * sizeof(*p));
        if (p == NULL) {
            t->ok = false;
            ddo__mutex_unlock(&t->mu);
            return;
        }
        t->ev = p;
        t->cap = cap;
    }
    e.pid = (int)t->pids;
    snprintf(e.text, sizeof(e.text), "%s", e.name != NULL ? e.name : "?");
    e.name = NULL;
    t->ev[t->len++] = e;
    ddo__mutex_unlock(&t->mu);
}

/* A span on track tid of the current case. */
static void trace_span(trace *t, const char *name, const char *cat, int tid, uint64_t ts_ns,
                       uint64_t dur_ns)
{
    trace_ev e;
    memset(&e, 0, sizeof(e));
    e.name = name;
    e.cat = cat;
    e.ph = 'X';
    e.tid = tid;
    e.ts_ns = ts_ns;
    e.dur_ns = dur_ns;
    trace_add(t, e);
}

/* A counter sample of the current case. */
static void trace_counter(trace *t, const char *name, uint64_t ts_ns, double value)
{
    trace_ev e;
    memset(&e, 0, sizeof(e));
    e.name = name;
    e.cat = "";
    e.ph = 'C';
    e.ts_ns = ts_ns;
    e.value = value;
    trace_add(t, e);
}

/* ddo_session_options.trace: the session's uploads on the copy-engine track, its maps,
 * unmaps and reclaims on another, during the trace steps only. */
static void session_trace_fn(void *user, const char *kind, size_t unit, uint64_t begin_ns,
                             uint64_t end_ns, uint64_t bytes)
{
    trace *t = user;
    (void)bytes;
    ddo__mutex_lock(&t->mu);
    bool on = t->session_on;
    const ddo_plan *plan = t->plan;
    ddo__mutex_unlock(&t->mu);
    if (!on || end_ns < begin_ns)
        return;
    ddo_unit_info ui;
    const char *name = plan != NULL && ddo_plan_unit(plan, unit, &ui) == 0 ? ui.name : kind;
    trace_span(t, name, kind, strcmp(kind, "upload") == 0 ? TID_COPY : TID_MAP, begin_ns,
               end_ns - begin_ns);
}

static void gpu_mark_fn(void *user)
{
    ((gpu_mark *)user)->ns = tool_now_ns();
}

static int trace_write(const trace *t, const char *path)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "ddo bench: %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    static const char *const tids[] = { "",
                                        "host: acquire (wait)",
                                        "host: compute issue",
                                        "device: compute stream",
                                        "host: release",
                                        "step",
                                        "session: copy engine (uploads)",
                                        "session: map / unmap / reclaim" };
    bool first = true;
    for (size_t p = 1; p <= t->pids; p++) {
        json_t *name = json_string(t->pid_names[p - 1]);
        char *s = json_dumps(name, JSON_ENCODE_ANY);
        fprintf(f, "%s{\"ph\":\"M\",\"pid\":%zu,\"name\":\"process_name\",\"args\":{\"name\":%s}}",
                first ? "" : ",\n", p, s ? s : "\"?\"");
        free(s);
        json_decref(name);
        first = false;
        for (int k = 1; k <= TID_LAST; k++)
            fprintf(f,
                    ",\n{\"ph\":\"M\",\"pid\":%zu,\"tid\":%d,\"name\":\"thread_name\",\"args\":"
                    "{\"name\":\"%s\"}}",
                    p, k, tids[k]);
    }
    for (size_t i = 0; i < t->len; i++) {
        const trace_ev *e = &t->ev[i];
        json_t *name = json_string(e->text);
        char *s = json_dumps(name, JSON_ENCODE_ANY);
        double ts = (double)(e->ts_ns - t->t0) / 1e3;
        if (e->ph == 'C')
            fprintf(
                f, ",\n{\"ph\":\"C\",\"pid\":%d,\"name\":%s,\"ts\":%.3f,\"args\":{\"value\":%.0f}}",
                e->pid, s ? s : "\"?\"", ts, e->value);
        else
            fprintf(f,
                    ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"cat\":\"%s\",\"name\":%s,\"ts\":%.3f,"
                    "\"dur\":%.3f}",
                    e->pid, e->tid, e->cat, s ? s : "\"?\"", ts, (double)e->dur_ns / 1e3);
        free(s);
        json_decref(name);
    }
    fprintf(f, "\n]}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "ddo bench: %s: write failed\n", path);
        return -1;
    }
    return 0;
}

/* ---- arguments --------------------------------------------------------------------- */

typedef struct bench_case {
    char name[64];
    char *flags;    /* owned copy of the case text after the name */
    uint64_t steps; /* 0 = --steps */
    uint64_t trace_steps;
    bool has_trace_steps; /* else --trace-steps */
} bench_case;

typedef struct bench_args {
    const char *path;
    const char *layout;
    const char *synth_out;
    bool keep_synth;
    bool no_cache_read; /* --no-page-cache-read */
    double scale;
    uint64_t tokens;
    uint64_t steps;
    uint64_t trace_steps;
    double bus_gib;
    double direct_gib;
    double file_gbps; /* --file-read-gbps: the disk's rate for the plans; 0 = the measured one */
    bool resident;
    const char *json_path;
    const char *trace_path;
    bench_case cases[MAX_CASES];
    size_t ncases;
    ddo_cpu_options cpu; /* --cpu-gbps, --cpu-gflops, --cpu-memory-gb */
} bench_args;

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: ddo bench PATH | --layout FILE [--scale S] [--tokens T] [--steps N]\n"
        "                 [--case \"NAME [--ddo-* flags] [--steps N]\"]... [--ddo-* flags]\n"
        "                 [--json FILE] [--trace FILE] [--trace-steps N] [--no-resident]\n"
        "                 [--bus-gib G] [--direct-gib G] [--file-read-gbps F]\n"
        "                 [--synth-out FILE] [--keep-synth]\n"
        "                 [--cpu-gbps B] [--cpu-gflops C] [--cpu-memory-gb M]\n\n"
        "Measures the bus limit (pinned host->device copies in 16 MiB pieces), the\n"
        "page-cache and O_DIRECT read speed of the checkpoint, the resident step time, and\n"
        "each case: setup time, step time against max(compute, bytes / bandwidth), achieved\n"
        "GB/s, stall, peak device memory against the plan and the driver's free-memory\n"
        "figures, and whether the output is bit-identical to the resident run.\n\n"
        "  PATH             a .safetensors or .gguf file, a sharded index or a model directory\n"
        "  --layout FILE    synthesise the checkpoint from a layout (ddo synth) first\n"
        "  --scale S        layout scale (default 1)\n"
        "  --tokens T       activation rows per product (default 256)\n"
        "  --steps N        timed steps per case (default 5)\n"
        "  --case TEXT      a named case: its --ddo-* flags (and --steps N, --trace-steps N)\n"
        "                   apply on top of the global ones (repeatable; without --case one\n"
        "                   case uses the global flags)\n"
        "  --no-resident    skip the resident run (no compute time, no bit-identity check)\n"
        "  --no-page-cache-read  skip the page-cache read of the whole checkpoint (it fills\n"
        "                   the page cache, which a memory cgroup counts against the case)\n"
        "  --json FILE      write the results as JSON\n"
        "  --trace FILE     write a Chrome/Perfetto trace of --trace-steps extra steps per\n"
        "                   case (default 2)\n"
        "  --bus-gib G      bytes copied to measure the bus (default 4)\n"
        "  --direct-gib G   bytes read with O_DIRECT to measure the file (default 2; 0 = off)\n"
        "  --file-read-gbps F  the file's read rate the plans are given, GB/s (default: the\n"
        "                   O_DIRECT rate measured here; weight_codec=auto reads a sidecar\n"
        "                   when the plan is disk-bound, docs/codec.md)\n\n"
        "A device set (--ddo-devices A,B[,...], docs/multi-gpu.md): donor mode opens the\n"
        "second device as the store once and measures its link, which bounds the bytes that\n"
        "came from it; split mode (--ddo-device-mode split) opens every device after the\n"
        "first and compares every other device's bytes with the first's in each case.\n");
}

/* Splits a case's text "NAME --flag v ..." (whitespace separated; no quoting). */
static int case_parse(bench_case *c, const char *text)
{
    memset(c, 0, sizeof(*c));
    while (*text == ' ' || *text == '\t')
        text++;
    size_t n = strcspn(text, " \t");
    if (n == 0 || n >= sizeof(c->name) || text[0] == '-')
        return -1;
    memcpy(c->name, text, n);
    c->name[n] = '\0';
    c->flags = strdup(text + n);
    return c->flags == NULL ? -1 : 0;
}

/* argv of a case's flags (pointers into a scratch copy). argv[0] is a program name. */
static int split_words(char *buf, char **argv, int max)
{
    int argc = 0;
    argv[argc++] = "ddo-bench-case";
    char *save = NULL;
    for (char *w = strtok_r(buf, " \t", &save); w != NULL; w = strtok_r(NULL, " \t", &save)) {
        if (argc + 1 >= max)
            return -1;
        argv[argc++] = w;
    }
    argv[argc] = NULL;
    return argc;
}

/* ---- results ----------------------------------------------------------------------- */

/* The session's setup, phase by phase (the setup_* metrics in seconds, in the JSON). */
static const char *const setup_phase_metric[] = {
    "setup_read_ns", "setup_register_ns", "setup_encode_ns", "setup_codec_ns", "setup_allocate_ns",
};
#define SETUP_PHASES (sizeof(setup_phase_metric) / sizeof(setup_phase_metric[0]))

typedef struct case_result {
    char name[64];
    char route[32];
    char read_engine[16];
    bool ran;
    char error[512];
    uint64_t steps;
    double setup_s;
    double setup_read_s;
    double setup_phase_s[SETUP_PHASES]; /* setup_phase_metric[] of the session's metrics */
    double step_s;                      /* mean of the timed steps */
    double step_min_s;                  /* fastest timed step */
    double bound_s;
    double ratio;
    double gbps;           /* bytes copied per step / step time */
    double stall_s;        /* per step */
    double bus_bytes;      /* per step: uploads from registered or staged retained memory */
    double file_bytes;     /* per step: staged from the file */
    double copy_bytes;     /* per step */
    double hits;           /* per step */
    bool coded;            /* the plan codes weights (weight_codec=ddoc1) */
    double sidecar_bytes;  /* per step: coded streams read from the sidecar (file reads too) */
    double coded_bytes;    /* per step: coded bytes uploaded (copy_bytes counts them too) */
    double decoded_bytes;  /* per step: what the decoder wrote from them */
    double decode_rate;    /* the timed decodes' bytes per second of device time */
    double raw_bound_s;    /* coded cases: the bytes raw (copy - coded + decoded) / bus */
    double coded_bound_s;  /* coded cases: copy_bytes (coded and raw) / bus */
    uint64_t plan_peak;    /* the plan's device weights peak */
    uint64_t plan_limit;   /* the device weights budget (0 = none) */
    uint64_t session_peak; /* device_weights_peak_bytes */
    uint64_t driver_peak;  /* baseline free - lowest free seen (sampled) */
    uint64_t driver_after; /* baseline free - free after destroy */
    bool peak_ok;
    uint64_t checksum;
    bool have_checksum;
    int identical; /* -1 unknown (no resident run), 0 no, 1 yes */
    uint64_t computed, skipped;
    /* split mode: every tensor on every other device against the first device's bytes */
    size_t split_devices; /* 0: not a split case */
    uint64_t split_checked, split_differ;
    double store_bytes; /* donor mode, per step: copied from the store device */
} case_result;

/* ---- the bench context ------------------------------------------------------------- */

typedef struct bench {
    bench_args *a;
    ddo_config *cfg; /* the global configuration (environment + global flags) */
    ddo_setup *setup;
    ddo_device *dev; /* the setup's */
    ddo_device_caps caps;
    ddo_checkpoint *ck;
    ddo_stream *stream;
    ref_host *timing; /* outputs stay on the device */
    ref_host *verify; /* checksum mode */
    double bus_bps;
    const char *bus_how;
    double read_s, read_bps; /* page cache, whole checkpoint */
    double direct_bps;       /* O_DIRECT sample; 0 = not measured */
    double compute_s;        /* resident step time; 0 = unknown */
    uint64_t resident_checksum;
    bool have_resident;
    trace tr;
    tool_devset set; /* the set's devices after the first (opened once) */
    double peer_bps; /* donor mode: the store device -> this device rate, measured; 0 unknown */
} bench;

static int fail_case(case_result *r, const char *what, int rc, const char *detail)
{
    snprintf(r->error, sizeof(r->error), "%s: %s%s%s", what, ddo_strerror(rc),
             detail != NULL && detail[0] ? ": " : "", detail != NULL ? detail : "");
    fprintf(stderr, "ddo bench: case %s: %s\n", r->name, r->error);
    return rc;
}

/* One step over every group. The trace (if any) records spans. */
static int run_step(bench *b, ddo_session *s, ref_host *host, const exec_order *o, trace *tr,
                    uint64_t *min_free, uint64_t *checksum, case_result *r)
{
    uint64_t t_step = tool_now_ns();
    int rc = 0;
    for (size_t gi = 0; gi < o->count; gi++) {
        const exec_group *g = &o->groups[gi];
        uint64_t t0 = tool_now_ns();
        if (g->unit != SIZE_MAX) {
            rc = ddo_session_acquire(s, g->unit, b->stream);
            if (rc != 0)
                return fail_case(r, "acquire", rc, ddo_session_error(s));
        }
        uint64_t t1 = tool_now_ns();
        if (min_free != NULL && g->unit != SIZE_MAX) {
            uint64_t f = device_free(b->dev);
            if (f > 0 && f < *min_free)
                *min_free = f;
        }
        if (tr != NULL && !b->caps.is_cpu && 2 * gi + 1 < tr->marks_cap)
            ref_host_cuda_stream_callback(b->stream, gpu_mark_fn, &tr->marks[2 * gi], NULL, 0);
        uint64_t t2 = tool_now_ns();
        rc = ref_host_run_tensors(host, s, g->tensors, g->count, b->stream);
        if (rc != 0)
            return fail_case(r, "compute", rc, ref_host_error(host));
        uint64_t t3 = tool_now_ns();
        if (tr != NULL && !b->caps.is_cpu && 2 * gi + 1 < tr->marks_cap)
            ref_host_cuda_stream_callback(b->stream, gpu_mark_fn, &tr->marks[2 * gi + 1], NULL, 0);
        if (g->unit != SIZE_MAX) {
            rc = ddo_session_release(s, g->unit, b->stream);
            if (rc != 0)
                return fail_case(r, "release", rc, ddo_session_error(s));
        }
        uint64_t t4 = tool_now_ns();
        if (tr != NULL) {
            if (g->unit != SIZE_MAX)
                trace_span(tr, g->name, "acquire", TID_ACQUIRE, t0, t1 - t0);
            trace_span(tr, g->name, "compute", TID_COMPUTE, t2, t3 - t2);
            if (g->unit != SIZE_MAX)
                trace_span(tr, g->name, "release", TID_RELEASE, t3, t4 - t3);
            ddo_metrics *m = NULL;
            if (ddo_session_metrics(s, false, &m) == 0) {
                trace_counter(tr, "bytes copied (MiB)", t4, tool_metric(m, "copy_bytes") / MIB_D);
                trace_counter(tr, "hits", t4, tool_metric(m, "hits"));
                trace_counter(tr, "reclaims", t4, tool_metric(m, "reclaim_events"));
                ddo_metrics_destroy(m);
            }
            trace_counter(tr, "device free (MiB)", t4, (double)device_free(b->dev) / MIB_D);
        }
    }
    uint64_t sum = 0;
    rc = ref_host_step_checksum(host, b->stream, &sum);
    if (rc != 0)
        return fail_case(r, "step", rc, ref_host_error(host));
    if (tr != NULL) {
        trace_span(tr, "step", "step", TID_STEP, t_step, tool_now_ns() - t_step);
        if (!b->caps.is_cpu)
            for (size_t gi = 0; gi < o->count && 2 * gi + 1 < tr->marks_cap; gi++) {
                const gpu_mark *m0 = &tr->marks[2 * gi], *m1 = &tr->marks[2 * gi + 1];
                if (m0->ns != 0 && m1->ns >= m0->ns)
                    trace_span(tr, o->groups[gi].name, "gpu", TID_GPU, m0->ns, m1->ns - m0->ns);
            }
    }
    if (checksum != NULL)
        *checksum = sum;
    return 0;
}

/*
 * The checksum step: every tensor in checkpoint order (the same order for every case, so the
 * step checksums of different plans compare), each unit leased while its tensors run.
 */
static int verify_step(bench *b, ddo_session *s, const ddo_plan *plan, uint64_t *checksum,
                       case_result *r)
{
    size_t n = ddo_checkpoint_tensor_count(b->ck), held = SIZE_MAX;
    int rc = 0;
    for (size_t t = 0; t < n && rc == 0; t++) {
        ddo_placement pl = tool_placement(plan, t);
        if (pl == DDO_PLACEMENT_SKIPPED)
            continue;
        size_t u = pl == DDO_PLACEMENT_STREAMED ? tool_unit(plan, t) : SIZE_MAX;
        if (u != SIZE_MAX && u != held) {
            if (held != SIZE_MAX) {
                rc = ddo_session_release(s, held, b->stream);
                held = SIZE_MAX;
                if (rc != 0)
                    return fail_case(r, "release", rc, ddo_session_error(s));
            }
            rc = ddo_session_acquire(s, u, b->stream);
            if (rc != 0)
                return fail_case(r, "acquire", rc, ddo_session_error(s));
            held = u;
        }
        rc = ref_host_run_tensors(b->verify, s, &t, 1, b->stream);
        if (rc != 0)
            fail_case(r, "compute", rc, ref_host_error(b->verify));
    }
    if (held != SIZE_MAX) {
        int rc2 = ddo_session_release(s, held, b->stream);
        if (rc == 0 && rc2 != 0)
            return fail_case(r, "release", rc2, ddo_session_error(s));
    }
    if (rc != 0)
        return rc;
    rc = ref_host_step_checksum(b->verify, b->stream, checksum);
    if (rc != 0)
        return fail_case(r, "checksum", rc, ref_host_error(b->verify));
    return 0;
}

/* A device set (docs/multi-gpu.md): opens the set's devices after the first, once per bench (donor
 * mode: the store, and its link to this device measured once); *is_split tells whether plan is
 * a split plan. */
static int open_set(bench *b, const ddo_plan *plan, bool *is_split, case_result *r)
{
    ddo_device_mode had = b->set.count > 0 ? b->set.mode : DDO_DEVICE_MODE_SINGLE;
    int rc = tool_devset_open(&b->set, plan);
    if (rc != 0)
        return fail_case(r, "device set", rc, ddo_last_error());
    *is_split = tool_devset_split(&b->set, plan);
    if (had == DDO_DEVICE_MODE_DONOR || b->set.mode != DDO_DEVICE_MODE_DONOR)
        return 0;
    if (ddo_device_measure_peer(b->dev, b->set.dev[0], 64 * (uint64_t)1048576, &b->peer_bps) != 0)
        b->peer_bps = 0;
    printf("store device: %s (donor mode), link to the computing device %.2f GB/s%s\n",
           b->set.names, b->peer_bps / 1e9, b->peer_bps > 0 ? "" : " (not measured)");
    return 0;
}

/* Split mode: every tensor as every other device holds it, read back, against the first
 * device's bytes (each unit acquired once, its upload complete first). */
static int split_compare(bench *b, ddo_session *s, const ddo_plan *plan, case_result *r)
{
    size_t n = ddo_checkpoint_tensor_count(b->ck), held = SIZE_MAX;
    int rc = 0;
    r->split_devices = b->set.count + 1;
    for (size_t t = 0; t < n && rc == 0; t++) {
        ddo_placement pl = tool_placement(plan, t);
        if (pl == DDO_PLACEMENT_SKIPPED)
            continue;
        size_t u = pl == DDO_PLACEMENT_STREAMED ? tool_unit(plan, t) : SIZE_MAX;
        if (u != SIZE_MAX && u != held) {
            rc = held != SIZE_MAX ? ddo_session_release(s, held, b->stream) : 0;
            held = SIZE_MAX;
            if (rc == 0 && (rc = ddo_session_acquire(s, u, b->stream)) == 0)
                held = u;
            if (rc == 0)
                rc = ddo_stream_synchronize(b->stream);
            if (rc != 0)
                break;
        }
        rc = tool_devset_compare(s, b->ck, t, b->set.count, &r->split_checked, &r->split_differ);
    }
    int rc2 = held != SIZE_MAX ? ddo_session_release(s, held, b->stream) : 0;
    rc = rc != 0 ? rc : rc2;
    if (rc != 0)
        return fail_case(r, "split: comparing the devices", rc, ddo_session_error(s));
    return 0;
}

/* Runs one case with cfg. The result records what happened; returns 0 or the failure. */
/* The case's plan and execution order, printed; fails the case on error. */
static int case_plan(bench *b, ddo_config *cfg, case_result *r, ddo_plan **plan, exec_order *o)
{
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    int rc = ddo_setup_plan_inputs(b->setup, &in);
    /* The measured bus limit; no compute rate (a cpu device's throttle included): the cases
     * are timed, not predicted. */
    in.bus_bytes_per_s = b->bus_bps;
    in.flops_per_s = 0;
    in.tokens = b->a->tokens;
    /* The disk's rate: what weight_codec=auto asks whether the plan is disk-bound with. */
    in.file_read_bytes_per_s = b->a->file_gbps > 0 ? b->a->file_gbps * 1e9 : b->direct_bps;
    if (rc == 0)
        rc = ddo_setup_plan(b->setup, b->ck, cfg, &in, plan);
    if (rc != 0) {
        fail_case(r, "plan", rc, ddo_last_error());
        return rc;
    }
    snprintf(r->route, sizeof(r->route), "%s", ddo_plan_route(*plan));
    /* Coded: weight_codec=ddoc1 with something to code (an explicit ddoc1 may have nothing). */
    ddo_plan_info info = DDO_PLAN_INFO_INIT;
    const char *cand = tool_decision(*plan, "codec_candidate_gb");
    r->coded = ddo_plan_info_get(*plan, &info) == 0 &&
               info.weight_codec == DDO_WEIGHT_CODEC_DDOC1 && cand != NULL &&
               strtod(cand, NULL) > 0.0;
    const char *engine = NULL;
    if (ddo_config_get(cfg, "read_engine", &engine) == 0 && engine != NULL)
        snprintf(r->read_engine, sizeof(r->read_engine), "%s", engine);
    ddo_plan_budgets bud;
    memset(&bud, 0, sizeof(bud));
    ddo_plan_budgets_get(*plan, &bud);
    r->plan_peak = bud.device_weights_peak;
    r->plan_limit = bud.device_weights_limit;
    rc = exec_order_build(*plan, b->ck, o);
    if (rc != 0) {
        fail_case(r, "order", rc, NULL);
        return rc;
    }
    printf("case %s: route %s, %zu units, device weights peak %.2f GiB (resident %.2f GiB + "
           "%zu slots x %.1f MiB)%s\n",
           r->name, r->route, ddo_plan_unit_count(*plan), (double)bud.device_weights_peak / GIB_D,
           (double)bud.resident_bytes / GIB_D, bud.slot_count, (double)bud.slot_bytes / MIB_D,
           bud.device_weights_limit ? "" : ", no device budget");
    fflush(stdout);
    return 0;
}

/* The warm-up pass, then `steps` timed steps: step times and per-step byte counts. */
static int timed_steps(bench *b, ddo_session *s, const exec_order *o, uint64_t steps,
                       uint64_t *min_free, case_result *r)
{
    ddo_metrics *m = NULL;
    /* Warm-up: the first pass teaches the session the order. */
    int rc = run_step(b, s, b->timing, o, NULL, min_free, NULL, r);
    if (rc != 0)
        return rc;
    if ((rc = ddo_session_metrics(s, false, &m)) != 0) {
        fail_case(r, "metrics", rc, ddo_session_error(s));
        return rc;
    }
    double m0[11] = { tool_metric(m, "stall_ns"),
                      tool_metric(m, "bytes_from_registered") +
                          tool_metric(m, "bytes_staged_from_retained"),
                      tool_metric(m, "bytes_staged_from_file"),
                      tool_metric(m, "copy_bytes"),
                      tool_metric(m, "hits"),
                      tool_metric(m, "bytes_coded_uploaded"),
                      tool_metric(m, "bytes_decoded"),
                      tool_metric(m, "codec_decode_timed_bytes"),
                      tool_metric(m, "codec_decode_ns"),
                      tool_metric(m, "bytes_staged_from_sidecar"),
                      tool_metric(m, "bytes_from_store") };
    ddo_metrics_destroy(m);
    m = NULL;
    double total = 0, best = 0;
    for (uint64_t i = 0; i < steps; i++) {
        uint64_t ts = tool_now_ns();
        if ((rc = run_step(b, s, b->timing, o, NULL, min_free, NULL, r)) != 0)
            return rc;
        double dt = (double)(tool_now_ns() - ts) / 1e9;
        total += dt;
        if (i == 0 || dt < best)
            best = dt;
    }
    if ((rc = ddo_session_metrics(s, false, &m)) != 0) {
        fail_case(r, "metrics", rc, ddo_session_error(s));
        return rc;
    }
    double ns = (double)(steps ? steps : 1);
    r->step_s = total / ns;
    r->step_min_s = best;
    r->stall_s = (tool_metric(m, "stall_ns") - m0[0]) / 1e9 / ns;
    r->bus_bytes = (tool_metric(m, "bytes_from_registered") +
                    tool_metric(m, "bytes_staged_from_retained") - m0[1]) /
                   ns;
    r->file_bytes = (tool_metric(m, "bytes_staged_from_file") - m0[2]) / ns;
    r->sidecar_bytes = (tool_metric(m, "bytes_staged_from_sidecar") - m0[9]) / ns;
    r->copy_bytes = (tool_metric(m, "copy_bytes") - m0[3]) / ns;
    r->store_bytes = (tool_metric(m, "bytes_from_store") - m0[10]) / ns;
    r->hits = (tool_metric(m, "hits") - m0[4]) / ns;
    r->coded_bytes = (tool_metric(m, "bytes_coded_uploaded") - m0[5]) / ns;
    r->decoded_bytes = (tool_metric(m, "bytes_decoded") - m0[6]) / ns;
    double timed_ns = tool_metric(m, "codec_decode_ns") - m0[8];
    r->decode_rate =
        timed_ns > 0 ? (tool_metric(m, "codec_decode_timed_bytes") - m0[7]) / (timed_ns / 1e9) : 0;
    ddo_metrics_destroy(m);
    return 0;
}

/* `trace_steps` more steps recorded into the Perfetto trace (when one is asked for). */
static int traced_steps(bench *b, ddo_session *s, const exec_order *o, uint64_t trace_steps,
                        uint64_t *min_free, case_result *r)
{
    if (b->a->trace_path == NULL || !b->tr.ok || trace_steps == 0)
        return 0;
    trace *tr = &b->tr;
    char **names = realloc(tr->pid_names, (tr->pids + 1) * sizeof(*names));
    if (names != NULL) {
        tr->pid_names = names;
        tr->pid_names[tr->pids] = strdup(r->name);
        tr->pids++;
    }
    if (tr->marks_cap < 2 * o->count) {
        free(tr->marks);
        tr->marks = calloc(2 * o->count, sizeof(*tr->marks));
        tr->marks_cap = tr->marks != NULL ? 2 * o->count : 0;
    }
    ddo__mutex_lock(&tr->mu);
    tr->session_on = true;
    ddo__mutex_unlock(&tr->mu);
    int rc = 0;
    for (uint64_t i = 0; i < trace_steps && rc == 0; i++) {
        if (tr->marks != NULL)
            memset(tr->marks, 0, tr->marks_cap * sizeof(*tr->marks));
        rc = run_step(b, s, b->timing, o, tr, min_free, NULL, r);
    }
    /* Uploads still in flight report after the steps: wait, then stop listening. */
    if (rc == 0)
        rc = ddo_session_synchronize(s);
    ddo__mutex_lock(&tr->mu);
    tr->session_on = false;
    ddo__mutex_unlock(&tr->mu);
    return rc;
}

/* The session's final figures and the reference host's counts. */
static int final_metrics(bench *b, ddo_session *s, case_result *r)
{
    ddo_metrics *m = NULL;
    int rc = ddo_session_synchronize(s);
    if (rc == 0)
        rc = ddo_session_metrics(s, true, &m);
    if (rc != 0) {
        fail_case(r, "metrics", rc, ddo_session_error(s));
        return rc;
    }
    r->session_peak = (uint64_t)tool_metric(m, "device_weights_peak_bytes");
    /* The engine the session really used decides which file speed bounds the case. */
    const char *used = ddo_metrics_label(m, "read_engine");
    if (used != NULL && strcmp(used, "none") != 0)
        snprintf(r->read_engine, sizeof(r->read_engine), "%s", used);
    ddo_metrics_destroy(m);
    ref_host_stats hs;
    ref_host_stats_get(b->timing, &hs);
    r->computed = hs.weights_computed;
    r->skipped = hs.weights_skipped;
    return 0;
}

static int run_case(bench *b, ddo_config *cfg, uint64_t steps, uint64_t trace_steps, case_result *r)
{
    ddo_plan *plan = NULL;
    ddo_session *s = NULL;
    exec_order o;
    memset(&o, 0, sizeof(o));
    ddo_metrics *m = NULL;
    uint64_t base_free = 0, min_free = 0;
    r->steps = steps;
    r->identical = -1;
    int rc = case_plan(b, cfg, r, &plan, &o);
    if (rc != 0)
        goto out;
    bool split = false;
    if ((rc = open_set(b, plan, &split, r)) != 0)
        goto out;
    base_free = device_free(b->dev);
    min_free = base_free;
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = cfg;
    tool_devset_session(&b->set, plan, &so);
    if (b->a->trace_path != NULL) {
        so.trace = session_trace_fn;
        so.trace_user = &b->tr;
        ddo__mutex_lock(&b->tr.mu);
        b->tr.plan = plan;
        ddo__mutex_unlock(&b->tr.mu);
    }
    uint64_t t0 = tool_now_ns();
    rc = ddo_session_create(plan, b->ck, b->dev, &so, &s);
    if (rc != 0) {
        fail_case(r, "session", rc, ddo_last_error());
        goto out;
    }
    r->setup_s = (double)(tool_now_ns() - t0) / 1e9;
    uint64_t f = device_free(b->dev);
    if (f > 0 && f < min_free)
        min_free = f;
    if (ddo_session_metrics(s, false, &m) == 0) {
        r->setup_read_s = tool_metric(m, "setup_read_ns") / 1e9;
        for (size_t k = 0; k < SETUP_PHASES; k++)
            r->setup_phase_s[k] = tool_metric(m, setup_phase_metric[k]) / 1e9;
        ddo_metrics_destroy(m);
        m = NULL;
    }
    if ((rc = timed_steps(b, s, &o, steps, &min_free, r)) != 0)
        goto out;
    /* The checksum step (outputs sampled back to the host), in checkpoint order. */
    if ((rc = verify_step(b, s, plan, &r->checksum, r)) != 0)
        goto out;
    r->have_checksum = true;
    if (split && (rc = split_compare(b, s, plan, r)) != 0)
        goto out;
    if ((rc = traced_steps(b, s, &o, trace_steps, &min_free, r)) != 0 ||
        (rc = final_metrics(b, s, r)) != 0)
        goto out;
    r->driver_peak = base_free > min_free ? base_free - min_free : 0;
    r->ran = true;
out:
    ddo_session_destroy(s);
    if (base_free > 0) {
        uint64_t after = device_free(b->dev);
        r->driver_after = base_free > after ? base_free - after : 0;
    }
    exec_order_free(&o);
    ddo_plan_destroy(plan);
    return rc;
}

/* Fills the derived columns once the resident run and the limits are known. The bound of a
 * step: compute, every copied byte over the bus, and the file-fed bytes at the file's read
 * speed (O_DIRECT unless the case reads with pread) all overlap, so the slowest one. */
static void finish_result(const bench *b, case_result *r)
{
    if (!r->ran)
        return;
    double bound = b->compute_s;
    /* Donor mode: what came from the store crossed the device->device link, not the bus. */
    double over_bus = r->copy_bytes - r->store_bytes;
    if (b->bus_bps > 0 && over_bus / b->bus_bps > bound)
        bound = over_bus / b->bus_bps;
    if (b->peer_bps > 0 && r->store_bytes / b->peer_bps > bound)
        bound = r->store_bytes / b->peer_bps;
    double file_bps =
        strcmp(r->read_engine, "pread") != 0 && b->direct_bps > 0 ? b->direct_bps : b->read_bps;
    if (file_bps <= 0 && b->a->file_gbps > 0) /* neither measured: the rate the plans were given */
        file_bps = b->a->file_gbps * 1e9;
    if (file_bps > 0 && (r->file_bytes + r->sidecar_bytes) / file_bps > bound)
        bound = (r->file_bytes + r->sidecar_bytes) / file_bps;
    r->bound_s = bound;
    r->ratio = bound > 0 ? r->step_s / bound : 0;
    if (r->coded && b->bus_bps > 0) {
        r->raw_bound_s = (r->copy_bytes - r->coded_bytes + r->decoded_bytes) / b->bus_bps;
        r->coded_bound_s = r->copy_bytes / b->bus_bps;
    }
    r->gbps = r->step_s > 0 ? r->copy_bytes / r->step_s / 1e9 : 0;
    /* The session's own peak never above the plan's, the plan's never above its limit, and
     * the driver's figure (sampled) within the plan's prediction plus 64 MiB of driver
     * overhead (streams, events, page tables). */
    r->peak_ok = r->session_peak <= r->plan_peak &&
                 (r->plan_limit == 0 || r->plan_peak <= r->plan_limit) &&
                 (b->caps.is_cpu || r->driver_peak <= r->plan_peak + 64 * (uint64_t)1048576);
    if (b->have_resident && r->have_checksum)
        r->identical = r->checksum == b->resident_checksum ? 1 : 0;
}

/* ---- machine measurements ---------------------------------------------------------- */

static double memcpy_bandwidth(void)
{
    size_t n = (size_t)64 << 20;
    char *a = malloc(n), *c = malloc(n);
    if (a == NULL || c == NULL) {
        free(a);
        free(c);
        return 0;
    }
    memset(a, 1, n);
    memset(c, 2, n);
    uint64_t t0 = tool_now_ns();
    for (int i = 0; i < 8; i++)
        memcpy(i % 2 ? a : c, i % 2 ? c : a, n);
    double s = (double)(tool_now_ns() - t0) / 1e9;
    free(a);
    free(c);
    return s > 0 ? 8.0 * (double)n / s : 0;
}

/* Reads every file of the checkpoint once with pread in 16 MiB pieces. */
static int read_speed(const ddo_checkpoint *ck, double *seconds, uint64_t *bytes)
{
    char *buf = malloc(PIECE_BYTES);
    if (buf == NULL)
        return DDO_E_NO_MEMORY;
    uint64_t total = 0;
    uint64_t t0 = tool_now_ns();
    for (size_t i = 0; i < ddo_checkpoint_file_count(ck); i++) {
        const ddo_file_info *fi = ddo_checkpoint_file(ck, i);
        if (fi == NULL || fi->path == NULL)
            continue;
        int fd = open(fi->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            fprintf(stderr, "ddo bench: %s: %s\n", fi->path, strerror(errno));
            free(buf);
            return DDO_E_IO;
        }
        for (;;) {
            ssize_t got = read(fd, buf, PIECE_BYTES);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0)
                break;
            total += (uint64_t)got;
        }
        close(fd);
    }
    *seconds = (double)(tool_now_ns() - t0) / 1e9;
    *bytes = total;
    free(buf);
    return 0;
}

/* O_DIRECT read speed of the largest file (up to limit bytes), with the reads in flight the
 * retained store uses (ddo_measure_file_read); 0 if the file system refuses O_DIRECT. */
static double direct_speed(const ddo_checkpoint *ck, uint64_t limit)
{
    const ddo_file_info *big = NULL;
    for (size_t i = 0; i < ddo_checkpoint_file_count(ck); i++) {
        const ddo_file_info *fi = ddo_checkpoint_file(ck, i);
        if (fi != NULL && fi->path != NULL && (big == NULL || fi->size > big->size))
            big = fi;
    }
    ddo_file_speed fs;
    if (big == NULL || limit == 0 ||
        ddo_measure_file_read(big->path, limit, DDO_MEASURE_DIRECT, &fs) != 0)
        return 0;
    return fs.direct_bytes_per_s;
}

/* ---- output ------------------------------------------------------------------------ */

static const char *yes_no(int v)
{
    return v < 0 ? "-" : v ? "yes" : "NO";
}

/* The cases whose plan codes weights: bytes over the bus per step coded and raw, the step
 * against the raw bound (the bytes raw / bus) and the coded bound (the bytes moved / bus). */
static void print_codec_table(const case_result *res, size_t n)
{
    bool any = false;
    for (size_t i = 0; i < n; i++)
        any = any || (res[i].ran && res[i].coded);
    if (!any)
        return;
    printf(
        "\nweight codec (per step; bounds: bytes / bus, the raw one as if nothing were coded)\n");
    printf("%-14s %12s %12s %12s %11s %11s %8s %8s %10s\n", "case", "coded GiB", "decoded GiB",
           "moved GiB", "raw bound", "coded bnd", "/raw", "/coded", "dec GB/s");
    for (size_t i = 0; i < n; i++) {
        const case_result *r = &res[i];
        if (!r->ran || !r->coded)
            continue;
        printf("%-14s %12.3f %12.3f %12.3f %11.4f %11.4f %8.3f %8.3f %10.1f\n", r->name,
               r->coded_bytes / GIB_D, r->decoded_bytes / GIB_D, r->copy_bytes / GIB_D,
               r->raw_bound_s, r->coded_bound_s,
               r->raw_bound_s > 0 ? r->step_s / r->raw_bound_s : 0.0,
               r->coded_bound_s > 0 ? r->step_s / r->coded_bound_s : 0.0, r->decode_rate / 1e9);
    }
}

static void print_table(const bench *b, const case_result *res, size_t n)
{
    printf("\nbus %.2f GB/s (%s); page-cache read %.2f GB/s (%.2f s for %.2f GiB)",
           b->bus_bps / 1e9, b->bus_how, b->read_bps / 1e9, b->read_s,
           (double)ddo_checkpoint_total_bytes(b->ck) / GIB_D);
    if (b->direct_bps > 0)
        printf("; O_DIRECT read %.2f GB/s", b->direct_bps / 1e9);
    if (b->compute_s > 0)
        printf("; compute (resident step) %.4f s\n", b->compute_s);
    else
        printf("; compute unknown (no resident run)\n");
    printf("%-14s %-17s %9s %9s %6s %7s %9s %8s %6s %10s %10s %9s %5s %4s\n", "case", "route",
           "step s", "bound s", "ratio", "GB/s", "stall ms", "setup s", "/read", "peak GiB",
           "plan GiB", "budget", "peak", "same");
    for (size_t i = 0; i < n; i++) {
        const case_result *r = &res[i];
        if (!r->ran) {
            printf("%-14s FAILED: %s\n", r->name, r->error);
            continue;
        }
        char budget[16] = "-";
        if (r->plan_limit > 0)
            snprintf(budget, sizeof(budget), "%.2f", (double)r->plan_limit / GIB_D);
        printf("%-14s %-17s %9.4f %9.4f %6.3f %7.2f %9.2f %8.2f %6.2f %10.2f %10.2f %9s %5s %4s\n",
               r->name, r->route, r->step_s, r->bound_s, r->ratio, r->gbps, r->stall_s * 1e3,
               r->setup_s, b->read_s > 0 ? r->setup_s / b->read_s : 0,
               (double)(b->caps.is_cpu ? r->session_peak : r->driver_peak) / GIB_D,
               (double)r->plan_peak / GIB_D, budget, r->peak_ok ? "ok" : "OVER",
               yes_no(r->identical));
        if (r->split_devices > 0)
            printf("%-14s split over %zu devices: %" PRIu64 " of %" PRIu64
                   " tensor copies on the other devices differ from the first's\n",
                   "", r->split_devices, r->split_differ, r->split_checked);
    }
    print_codec_table(res, n);
    fflush(stdout);
}

/* A coded case's codec figures (per step). */
static void add_codec_json(json_t *o, const case_result *r)
{
    json_object_set_new(o, "coded_bytes_per_step", json_real(r->coded_bytes));
    json_object_set_new(o, "decoded_bytes_per_step", json_real(r->decoded_bytes));
    json_object_set_new(o, "decode_bytes_per_s", json_real(r->decode_rate));
    json_object_set_new(o, "raw_bytes_per_step",
                        json_real(r->copy_bytes - r->coded_bytes + r->decoded_bytes));
    json_object_set_new(o, "raw_bound_s", json_real(r->raw_bound_s));
    json_object_set_new(o, "coded_bound_s", json_real(r->coded_bound_s));
    json_object_set_new(o, "step_over_raw_bound",
                        json_real(r->raw_bound_s > 0 ? r->step_s / r->raw_bound_s : 0.0));
    json_object_set_new(o, "step_over_coded_bound",
                        json_real(r->coded_bound_s > 0 ? r->step_s / r->coded_bound_s : 0.0));
}

static int write_json(const bench *b, const case_result *res, size_t n, const char *path)
{
    json_t *root = json_object();
    json_object_set_new(root, "schema", json_string("ddo-bench/1"));
    json_object_set_new(root, "ddo_version", json_string(ddo_version_string()));
    json_object_set_new(root, "device", json_string(b->caps.name));
    json_object_set_new(root, "device_total_bytes", json_integer((json_int_t)b->caps.total_bytes));
    json_object_set_new(root, "checkpoint_bytes",
                        json_integer((json_int_t)ddo_checkpoint_total_bytes(b->ck)));
    json_object_set_new(root, "tokens", json_integer((json_int_t)b->a->tokens));
    json_object_set_new(root, "bus_bytes_per_s", json_real(b->bus_bps));
    json_object_set_new(root, "bus_method", json_string(b->bus_how));
    json_object_set_new(root, "page_cache_read_s", json_real(b->read_s));
    json_object_set_new(root, "page_cache_read_bytes_per_s", json_real(b->read_bps));
    json_object_set_new(root, "direct_read_bytes_per_s", json_real(b->direct_bps));
    json_object_set_new(root, "resident_step_s", json_real(b->compute_s));
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        const case_result *r = &res[i];
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(r->name));
        json_object_set_new(o, "ok", json_boolean(r->ran));
        if (!r->ran) {
            json_object_set_new(o, "error", json_string(r->error));
            json_array_append_new(arr, o);
            continue;
        }
        json_object_set_new(o, "route", json_string(r->route));
        json_object_set_new(o, "read_engine", json_string(r->read_engine));
        json_object_set_new(o, "steps", json_integer((json_int_t)r->steps));
        json_object_set_new(o, "step_s", json_real(r->step_s));
        json_object_set_new(o, "step_min_s", json_real(r->step_min_s));
        json_object_set_new(o, "bound_s", json_real(r->bound_s));
        json_object_set_new(o, "ratio", json_real(r->ratio));
        json_object_set_new(o, "achieved_gb_per_s", json_real(r->gbps));
        json_object_set_new(o, "stall_s_per_step", json_real(r->stall_s));
        json_object_set_new(o, "copy_bytes_per_step", json_real(r->copy_bytes));
        json_object_set_new(o, "bus_fed_bytes_per_step", json_real(r->bus_bytes));
        json_object_set_new(o, "file_fed_bytes_per_step", json_real(r->file_bytes));
        json_object_set_new(o, "sidecar_fed_bytes_per_step", json_real(r->sidecar_bytes));
        json_object_set_new(o, "hits_per_step", json_real(r->hits));
        json_object_set_new(o, "setup_s", json_real(r->setup_s));
        json_object_set_new(o, "setup_read_s", json_real(r->setup_read_s));
        json_t *phases = json_object();
        for (size_t k = 0; k < SETUP_PHASES; k++)
            json_object_set_new(phases, setup_phase_metric[k], json_real(r->setup_phase_s[k]));
        json_object_set_new(o, "setup_phases_s", phases);
        json_object_set_new(o, "setup_over_read",
                            json_real(b->read_s > 0 ? r->setup_s / b->read_s : 0));
        json_object_set_new(o, "plan_device_peak_bytes", json_integer((json_int_t)r->plan_peak));
        json_object_set_new(o, "plan_device_limit_bytes", json_integer((json_int_t)r->plan_limit));
        json_object_set_new(o, "session_device_peak_bytes",
                            json_integer((json_int_t)r->session_peak));
        json_object_set_new(o, "driver_device_peak_bytes",
                            json_integer((json_int_t)r->driver_peak));
        json_object_set_new(o, "driver_bytes_after_destroy",
                            json_integer((json_int_t)r->driver_after));
        json_object_set_new(o, "peak_ok", json_boolean(r->peak_ok));
        char sum[24];
        snprintf(sum, sizeof(sum), "%016" PRIx64, r->checksum);
        json_object_set_new(o, "checksum", json_string(sum));
        json_object_set_new(o, "bit_identical",
                            r->identical < 0 ? json_null() : json_boolean(r->identical == 1));
        if (r->store_bytes > 0) {
            json_object_set_new(o, "bytes_from_store", json_real(r->store_bytes));
            json_object_set_new(o, "peer_bytes_per_s", json_real(b->peer_bps));
        }
        if (r->split_devices > 0) {
            json_object_set_new(o, "split_devices", json_integer((json_int_t)r->split_devices));
            json_object_set_new(o, "split_devices_identical",
                                json_boolean(r->split_checked > 0 && r->split_differ == 0));
        }
        json_object_set_new(o, "weights_computed", json_integer((json_int_t)r->computed));
        json_object_set_new(o, "weights_skipped", json_integer((json_int_t)r->skipped));
        json_object_set_new(o, "weight_codec", json_string(r->coded ? "ddoc1" : "none"));
        if (r->coded)
            add_codec_json(o, r);
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "cases", arr);
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (rc != 0) {
        fprintf(stderr, "ddo bench: %s: cannot write the JSON\n", path);
        return -1;
    }
    return 0;
}

/* ---- the command ------------------------------------------------------------------- */

static int parse_args(int argc, char **argv, bench_args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            return 1;
        } else if (strcmp(arg, "--no-resident") == 0) {
            a->resident = false;
        } else if (strcmp(arg, "--keep-synth") == 0) {
            a->keep_synth = true;
        } else if (strcmp(arg, "--no-page-cache-read") == 0) {
            a->no_cache_read = true;
        } else if (strcmp(arg, "--steps") == 0 || strcmp(arg, "--tokens") == 0 ||
                   strcmp(arg, "--trace-steps") == 0) {
            uint64_t v = 0;
            bool steps = strcmp(arg, "--tokens") != 0;
            uint64_t lo = strcmp(arg, "--trace-steps") == 0 ? 0 : 1;
            if (tool_flag_count("bench", arg, val, lo, steps ? 10000u : 65536u, &v) != 0)
                return -1;
            if (strcmp(arg, "--steps") == 0)
                a->steps = v;
            else if (strcmp(arg, "--tokens") == 0)
                a->tokens = v;
            else
                a->trace_steps = v;
            i++;
        } else if (strcmp(arg, "--scale") == 0 || strcmp(arg, "--bus-gib") == 0 ||
                   strcmp(arg, "--direct-gib") == 0 || strcmp(arg, "--file-read-gbps") == 0 ||
                   strcmp(arg, "--cpu-gbps") == 0 || strcmp(arg, "--cpu-gflops") == 0 ||
                   strcmp(arg, "--cpu-memory-gb") == 0) {
            int bad = 0;
            if (strcmp(arg, "--scale") == 0)
                bad = tool_flag_real("bench", arg, val, 1e-6, 1.0, &a->scale);
            else if (strcmp(arg, "--bus-gib") == 0)
                bad = tool_flag_real("bench", arg, val, 0.0, TOOL_MAX_MEMORY_GB, &a->bus_gib);
            else if (strcmp(arg, "--direct-gib") == 0)
                bad = tool_flag_real("bench", arg, val, 0.0, TOOL_MAX_MEMORY_GB, &a->direct_gib);
            else if (strcmp(arg, "--file-read-gbps") == 0)
                bad = tool_flag_real("bench", arg, val, 0.001, TOOL_MAX_GBPS, &a->file_gbps);
            else
                bad = tool_device_flag("bench", arg, val, &a->cpu);
            if (bad != 0)
                return -1;
            i++;
        } else if (strcmp(arg, "--layout") == 0 || strcmp(arg, "--json") == 0 ||
                   strcmp(arg, "--trace") == 0 || strcmp(arg, "--synth-out") == 0 ||
                   strcmp(arg, "--case") == 0) {
            if (val == NULL) {
                fprintf(stderr, "ddo bench: %s needs a value\n", arg);
                return -1;
            }
            if (strcmp(arg, "--layout") == 0) {
                a->layout = val;
            } else if (strcmp(arg, "--json") == 0) {
                a->json_path = val;
            } else if (strcmp(arg, "--trace") == 0) {
                a->trace_path = val;
            } else if (strcmp(arg, "--synth-out") == 0) {
                a->synth_out = val;
            } else {
                if (a->ncases == MAX_CASES) {
                    fprintf(stderr, "ddo bench: at most %d cases\n", MAX_CASES);
                    return -1;
                }
                if (case_parse(&a->cases[a->ncases], val) != 0) {
                    fprintf(stderr,
                            "ddo bench: --case \"%s\": expected \"NAME [--ddo-* flags] "
                            "[--steps N]\" (NAME up to 63 characters, not starting with -)\n",
                            val);
                    return -1;
                }
                a->ncases++;
            }
            i++;
        } else if (arg[0] == '-') {
            fprintf(stderr, "ddo bench: unknown option '%s' (see ddo bench --help)\n", arg);
            return -1;
        } else if (a->path == NULL) {
            a->path = arg;
        } else {
            fprintf(stderr, "ddo bench: one PATH only ('%s' is extra)\n", arg);
            return -1;
        }
    }
    if ((a->path == NULL) == (a->layout == NULL)) {
        fprintf(stderr, "ddo bench: give a checkpoint PATH or --layout FILE (one of them)\n");
        return -1;
    }
    return 0;
}

/* The configuration of a case: a clone of the global one with the case's flags on top. */
static int case_config(const bench *b, bench_case *c, ddo_config **out)
{
    ddo_config *cfg = NULL;
    int rc = ddo_config_clone(b->cfg, &cfg);
    if (rc != 0)
        return rc;
    char *buf = strdup(c->flags != NULL ? c->flags : "");
    char *argv[128];
    int argc = buf != NULL ? split_words(buf, argv, 128) : -1;
    if (argc < 0) {
        fprintf(stderr, "ddo bench: case %s: too many words\n", c->name);
        rc = DDO_E_CONFIG;
        goto out;
    }
    rc = ddo_config_parse_args(cfg, &argc, argv);
    if (rc != 0) {
        fprintf(stderr, "ddo bench: case %s: %s\n", c->name, ddo_config_error(cfg));
        goto out;
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc &&
            tool_parse_u64(argv[i + 1], &c->steps) == 0 && c->steps > 0 && c->steps <= 10000) {
            i++;
            continue;
        }
        if (strcmp(argv[i], "--trace-steps") == 0 && i + 1 < argc &&
            tool_parse_u64(argv[i + 1], &c->trace_steps) == 0 && c->trace_steps <= 10000) {
            c->has_trace_steps = true;
            i++;
            continue;
        }
        fprintf(stderr,
                "ddo bench: case %s: unknown word '%s' (only --ddo-* flags, --steps N and "
                "--trace-steps N)\n",
                c->name, argv[i]);
        rc = DDO_E_CONFIG;
        goto out;
    }
    rc = ddo_config_validate(cfg);
    if (rc != 0)
        fprintf(stderr, "ddo bench: case %s: %s\n", c->name, ddo_config_error(cfg));
out:
    free(buf);
    if (rc != 0) {
        ddo_config_destroy(cfg);
        return rc;
    }
    *out = cfg;
    return 0;
}

/* The configured device exactly (no stand-in: a bench measures the device asked for) and a
 * copy stream; -1 after a message. */
static int open_device(bench *b, bench_args *a)
{
    const char *spec = "cuda:0";
    ddo_config_get(b->cfg, "execution_device", &spec);
    char spec_buf[64];
    snprintf(spec_buf, sizeof(spec_buf), "%s", spec != NULL ? spec : "cuda:0");
    ddo_device_options dopt = DDO_DEVICE_OPTIONS_INIT;
    dopt.cpu = &a->cpu;
    ddo_setup_options so = DDO_SETUP_OPTIONS_INIT;
    so.device = DDO_DEVICE_CHOICE_EXACT;
    so.device_options = &dopt;
    if (ddo_setup_create(b->cfg, &so, &b->setup) != 0) {
        bool cuda = strncmp(spec_buf, "cuda", 4) == 0;
        fprintf(stderr, "ddo bench: device %s: %s%s\n", spec_buf, ddo_last_error(),
                cuda ? " (--ddo-execution-device cpu benches the cpu reference device)" : "");
        return -1;
    }
    b->dev = ddo_setup_device(b->setup);
    if (ddo_device_caps_get(b->dev, &b->caps) != 0) {
        fprintf(stderr, "ddo bench: device %s: %s\n", spec_buf, ddo_device_error(b->dev));
        return -1;
    }
    if (ddo_stream_create(b->dev, &b->stream) != 0) {
        fprintf(stderr, "ddo bench: stream: %s\n", ddo_last_error());
        return -1;
    }
    printf("device: %s (%s), %.2f GiB, %.2f GiB free\n", spec_buf, b->caps.name,
           (double)b->caps.total_bytes / GIB_D, (double)b->caps.free_bytes / GIB_D);
    return 0;
}

/* The checkpoint, synthesised from a layout into synth_path when asked (a temporary one is
 * registered for removal on SIGINT/SIGTERM/SIGHUP into *slot); -1 after a message. */
static int open_checkpoint(bench *b, const bench_args *a, char *synth_path, size_t len,
                           bool *synth_made, int *slot)
{
    const char *path = a->path;
    if (a->layout != NULL) {
        if (a->synth_out != NULL)
            snprintf(synth_path, len, "%s", a->synth_out);
        else
            snprintf(synth_path, len, "%s/ddo-bench-%ld.safetensors", tool_tmpdir(),
                     (long)getpid());
        *synth_made = a->synth_out == NULL && !a->keep_synth;
        if (*synth_made)
            *slot = tool_cleanup_add(synth_path, false);
        char err[512] = "";
        uint64_t written = 0;
        uint64_t ts = tool_now_ns();
        if (ddo_tool_synth(a->layout, synth_path, a->scale, 0, &written, err, sizeof(err)) != 0) {
            fprintf(stderr, "ddo bench: synth %s: %s\n", a->layout, err);
            return -1;
        }
        printf("synth: %s -> %s, %.2f GiB in %.1f s\n", a->layout, synth_path,
               (double)written / GIB_D, (double)(tool_now_ns() - ts) / 1e9);
        path = synth_path;
    }
    if (ddo_checkpoint_create_from_config(path, b->cfg, &b->ck) != 0) {
        fprintf(stderr, "ddo bench: %s: %s\n", path, ddo_last_error());
        return -1;
    }
    printf("checkpoint: %s: %zu tensors, %.2f GiB\n", path, ddo_checkpoint_tensor_count(b->ck),
           (double)ddo_checkpoint_total_bytes(b->ck) / GIB_D);
    return 0;
}

/* 1. the bus, 2. the file: the limits every case is measured against; -1 after a message. */
static int measure_limits(bench *b, const bench_args *a)
{
    if (!b->caps.is_cpu) {
        char err[512] = "";
        uint64_t total = (uint64_t)(a->bus_gib * GIB_D);
        if (total < 16 * PIECE_BYTES)
            total = 16 * PIECE_BYTES;
        if (ref_host_cuda_bus_bandwidth(b->stream, total, PIECE_BYTES, &b->bus_bps, err,
                                        sizeof(err)) != 0) {
            fprintf(stderr, "ddo bench: %s\n", err);
            return -1;
        }
        b->bus_how = "pinned, 16 MiB pieces";
    } else if (b->caps.bus_bytes_per_s > 0 || a->cpu.bytes_per_s > 0) {
        b->bus_bps = b->caps.bus_bytes_per_s > 0 ? b->caps.bus_bytes_per_s : a->cpu.bytes_per_s;
        b->bus_how = "cpu device throttle";
    } else {
        b->bus_bps = memcpy_bandwidth();
        b->bus_how = "cpu device, memcpy";
    }
    uint64_t read_bytes = 0;
    if (!a->no_cache_read && read_speed(b->ck, &b->read_s, &read_bytes) != 0)
        return -1;
    b->read_bps = b->read_s > 0 ? (double)read_bytes / b->read_s : 0;
    if (a->direct_gib > 0)
        b->direct_bps = direct_speed(b->ck, (uint64_t)(a->direct_gib * GIB_D));
    if (a->no_cache_read)
        printf("limits: bus %.2f GB/s (%s); page-cache read not measured; O_DIRECT %s\n",
               b->bus_bps / 1e9, b->bus_how, b->direct_bps > 0 ? "" : "not measured");
    else
        printf("limits: bus %.2f GB/s (%s); page-cache read %.2f GB/s (%.3f s); O_DIRECT %s\n",
               b->bus_bps / 1e9, b->bus_how, b->read_bps / 1e9, b->read_s,
               b->direct_bps > 0 ? "" : "not measured");
    if (b->direct_bps > 0)
        printf("limits: O_DIRECT read %.2f GB/s (4 reads of 16 MiB in flight)\n",
               b->direct_bps / 1e9);
    fflush(stdout);
    return 0;
}

/* 3. the resident run (when the weights fit), into *r. */
static void run_resident(bench *b, const bench_args *a, case_result *res, size_t *nres)
{
    const ddo_checkpoint *ck = b->ck;
    uint64_t need = ddo_checkpoint_total_bytes(ck) + ((uint64_t)1 << 30);
    if (!a->resident)
        return;
    if (need > device_free(b->dev)) {
        printf("resident: skipped: %.2f GiB of weights + 1 GiB do not fit in %.2f GiB free\n",
               (double)ddo_checkpoint_total_bytes(ck) / GIB_D, (double)device_free(b->dev) / GIB_D);
        return;
    }
    ddo_config *rcfg = NULL;
    case_result *r = &res[(*nres)++];
    snprintf(r->name, sizeof(r->name), "resident");
    int rc = ddo_config_clone(b->cfg, &rcfg);
    if (rc == 0)
        rc = ddo_config_set(rcfg, "always_resident_modules_pattern", ".*");
    if (rc == 0)
        rc = ddo_config_set(rcfg, "vmm_resident_weight_budget_gb", "0");
    /* everything is uploaded once at setup: nothing to retain or pin */
    if (rc == 0)
        rc = ddo_config_set(rcfg, "vmm_source_cache_gb", "0");
    if (rc == 0)
        rc = ddo_config_set(rcfg, "pin_cpu_memory", "false");
    if (rc != 0) {
        fail_case(r, "configuration", rc, ddo_config_error(rcfg));
    } else if (run_case(b, rcfg, a->steps, a->trace_steps, r) == 0) {
        b->compute_s = r->step_s;
        b->resident_checksum = r->checksum;
        b->have_resident = true;
    }
    ddo_config_destroy(rcfg);
}

/* 4. the cases; then every result is finished. true when all ran, fit and matched. */
static bool run_cases(bench *b, bench_args *a, case_result *res, size_t *nres)
{
    size_t want = a->ncases > 0 ? a->ncases : 1;
    for (size_t i = 0; i < want; i++) {
        bench_case dflt;
        memset(&dflt, 0, sizeof(dflt));
        snprintf(dflt.name, sizeof(dflt.name), "default");
        bench_case *c = a->ncases > 0 ? &a->cases[i] : &dflt;
        case_result *r = &res[(*nres)++];
        snprintf(r->name, sizeof(r->name), "%s", c->name);
        ddo_config *ccfg = NULL;
        int rc = case_config(b, c, &ccfg);
        if (rc != 0) {
            snprintf(r->error, sizeof(r->error), "configuration: %s", ddo_strerror(rc));
            continue;
        }
        run_case(b, ccfg, c->steps ? c->steps : a->steps,
                 c->has_trace_steps ? c->trace_steps : a->trace_steps, r);
        ddo_config_destroy(ccfg);
    }
    bool all_ok = true;
    for (size_t i = 0; i < *nres; i++) {
        finish_result(b, &res[i]);
        if (!res[i].ran || !res[i].peak_ok || res[i].identical == 0 ||
            (res[i].split_devices > 0 && (res[i].split_differ > 0 || res[i].split_checked == 0)))
            all_ok = false;
    }
    return all_ok;
}

int ddo_cmd_bench(int argc, char **argv)
{
    bench_args a;
    memset(&a, 0, sizeof(a));
    a.cpu = (ddo_cpu_options)DDO_CPU_OPTIONS_INIT;
    a.scale = 1.0;
    a.tokens = 256;
    a.steps = 5;
    a.trace_steps = 2;
    a.bus_gib = 4;
    a.direct_gib = 2;
    a.resident = true;
    bench b;
    memset(&b, 0, sizeof(b));
    b.a = &a;
    b.tr.ok = true;
    ddo__mutex_init(&b.tr.mu);
    case_result *res = NULL;
    size_t nres = 0;
    char synth_path[4096] = "";
    bool synth_made = false;
    int synth_slot = -1;
    int status = DDO_EXIT_USAGE;

    int rc = tool_config_create(&b.cfg);
    if (rc != 0) {
        fprintf(stderr, "ddo bench: %s\n", ddo_last_error());
        return DDO_EXIT_FAILURE;
    }
    rc = ddo_config_apply_env(b.cfg, TOOL_ENVIRON);
    if (rc == 0)
        rc = ddo_config_parse_args(b.cfg, &argc, argv);
    if (rc != 0) {
        fprintf(stderr, "ddo bench: %s\n", ddo_config_error(b.cfg));
        goto out;
    }
    for (size_t i = 0; i < ddo_config_warning_count(b.cfg); i++)
        fprintf(stderr, "ddo bench: warning: %s\n", ddo_config_warning(b.cfg, i));
    int pr = parse_args(argc, argv, &a);
    if (pr != 0) {
        status = pr > 0 ? DDO_EXIT_OK : DDO_EXIT_USAGE;
        if (pr < 0)
            usage(stderr);
        goto out;
    }
    status = DDO_EXIT_FAILURE;
    rc = ddo_config_validate(b.cfg);
    if (rc != 0) {
        fprintf(stderr, "ddo bench: %s\n", ddo_config_error(b.cfg));
        goto out;
    }
    /* Output files are written at the end: one that cannot be is refused before the run. */
    if ((a.json_path != NULL && tool_check_output_file("bench", "--json", a.json_path) != 0) ||
        (a.trace_path != NULL && tool_check_output_file("bench", "--trace", a.trace_path) != 0))
        goto out;
    if (open_device(&b, &a) != 0 ||
        open_checkpoint(&b, &a, synth_path, sizeof(synth_path), &synth_made, &synth_slot) != 0 ||
        measure_limits(&b, &a) != 0)
        goto out;

    /* The hosts: one for timing (outputs stay on the device), one for checksums. */
    ref_host_config hc;
    memset(&hc, 0, sizeof(hc));
    hc.tokens = a.tokens;
    hc.cpu_flops_per_s = a.cpu.flops_per_s;
    hc.checksum = false;
    rc = ref_host_create_ex(b.dev, b.ck, &hc, &b.timing);
    if (rc == 0) {
        hc.checksum = true;
        rc = ref_host_create_ex(b.dev, b.ck, &hc, &b.verify);
    }
    if (rc != 0) {
        fprintf(stderr, "ddo bench: reference host: %s\n", ddo_strerror(rc));
        goto out;
    }
    b.tr.t0 = tool_now_ns();
    res = calloc((a.ncases > 0 ? a.ncases : 1) + 1, sizeof(*res));
    if (res == NULL)
        goto out;
    run_resident(&b, &a, res, &nres);
    bool all_ok = run_cases(&b, &a, res, &nres);
    print_table(&b, res, nres);
    if (a.json_path != NULL && write_json(&b, res, nres, a.json_path) != 0)
        all_ok = false;
    if (a.trace_path != NULL && (!b.tr.ok || trace_write(&b.tr, a.trace_path) != 0))
        all_ok = false;
    status = all_ok ? DDO_EXIT_OK : DDO_EXIT_FAILURE;
out:
    ref_host_destroy(b.verify);
    ref_host_destroy(b.timing);
    ddo_checkpoint_destroy(b.ck);
    if (synth_made)
        unlink(synth_path);
    tool_cleanup_forget(synth_slot);
    ddo_stream_destroy(b.stream);
    tool_devset_close(&b.set);
    ddo_setup_destroy(b.setup);
    ddo_config_destroy(b.cfg);
    for (size_t i = 0; i < a.ncases; i++)
        free(a.cases[i].flags);
    for (size_t i = 0; i < b.tr.pids; i++)
        free(b.tr.pid_names[i]);
    free(b.tr.pid_names);
    free(b.tr.ev);
    free(b.tr.marks);
    ddo__mutex_destroy(&b.tr.mu);
    free(res);
    return status;
}
