/*
 * session_fx.h - a fixture for the session tests: a small checkpoint of
 * numbered blocks (in host memory or written as a .safetensors file into a
 * temporary directory) whose bytes are known, a cpu device, a config, a
 * plan and a session. Used by tests/test_session*.c only.
 */
#ifndef DDO_SESSION_FX_H
#define DDO_SESSION_FX_H

#include "ddo.h"
#include "device/device.h"
#include "session/session.h"
#include "t.h"

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FX_MAX_TENSORS 128
#define FX_ROWS        64
#define FX_COLS        128 /* F32 [64, 128] = 32 KiB per weight */

typedef struct fx_opts {
    int blocks;            /* units: blocks.0 .. blocks.N-1, two weights each */
    int slots;             /* execution_slots */
    const char *mode;      /* execution_mode: "vmm_fast_runtime" or "linear_runtime" */
    bool file;             /* write a .safetensors file (else host memory) */
    double cache_gb;       /* vmm_source_cache_gb */
    bool pin;              /* pin_cpu_memory (registered retained bytes) */
    uint64_t device_bytes; /* cpu_memory_bytes; 0 = 1 GiB */
    double budget_gb;      /* vmm_resident_weight_budget_gb; 0 = 0.0625 */
    bool reclaim;          /* vmm_execution_backing_reclaim */
    double bytes_per_s;    /* copy throttle */
    uint64_t latency_ns;
    bool no_session;             /* stop after the plan */
    uint64_t cols;               /* columns of the block weights; 0 = FX_COLS */
    const char *weight_codec;    /* weight_codec (NULL: the default) */
    const char *codec_cache_dir; /* weight_codec_cache_dir (NULL: the default) */
    bool trained;                /* block weights shaped like trained ones (Gaussian F32, so the
                                    codec really codes them); salt 0 only */
    int weights;                 /* weights per block: attn, then blocks.N.wK.weight (K = 0..),
                                    then ff; 0 = 2 (attn and ff) */
    const char *random_tensor;   /* with trained: this tensor holds random bits (the codec keeps
                                    it raw) */
    bool fp8;                    /* every tensor F8_E4M3 (one byte per element; with trained:
                                    Gaussian values scaled to E4M3's range and rounded) */
} fx_opts;

typedef struct fx {
    fx_opts o;
    ddo_device *dev;
    ddo_stream *stream;
    ddo_checkpoint *ck;
    ddo_config *cfg;
    ddo_plan *plan;
    ddo_session *s;
    size_t nt;
    char *names[FX_MAX_TENSORS];
    unsigned char *bytes[FX_MAX_TENSORS];
    uint64_t sizes[FX_MAX_TENSORS];
    uint64_t shapes[FX_MAX_TENSORS][2];
    char dir[256];
    char path[320];
    int rc; /* create's result */
} fx;

#define FX_GRAN (64 * 1024)
/* The host's own synchronize / read-back failed (a fault injected into it, not the session). */
#define FX_HOST_FAILED (-2000)

static inline unsigned char fx_byte(size_t t, size_t j, unsigned salt)
{
    return (unsigned char)(t * 131u + j * 7u + (j >> 9) + salt * 17u);
}

static inline void fx_fill(fx *f, unsigned salt)
{
    for (size_t t = 0; t < f->nt; t++)
        for (size_t j = 0; j < f->sizes[t]; j++)
            f->bytes[t][j] = fx_byte(t, j, salt);
}

/* fx_opts.trained: F32 values of a Gaussian (std 0.02, a fixed sequence), not repeating. */
static inline void fx_fill_trained(fx *f)
{
    uint64_t z = 0x9E3779B97F4A7C15ull;
    for (size_t t = 0; t < f->nt; t++)
        for (size_t j = 0; j + 4 <= f->sizes[t]; j += 4) {
            double sum = 0;
            for (int k = 0; k < 4; k++) { /* Irwin-Hall: close enough to a Gaussian */
                z = z * 6364136223846793005ull + 1442695040888963407ull;
                sum += (double)(z >> 11) / 9007199254740992.0;
            }
            float v = (float)((sum - 2.0) * 0.02 * 1.7320508);
            memcpy(f->bytes[t] + j, &v, 4);
        }
}

/* The E4M3 code nearest to x (|x| clamped to 448; ties away from zero: a fixture, not a cast). */
static inline unsigned char fx_e4m3(double x)
{
    double a = x < 0 ? -x : x;
    unsigned code;
    if (a < 0.015625) { /* subnormal: m / 8 * 2^-6 (m = 8 is the smallest normal, code 8) */
        code = (unsigned)(a * 512.0 + 0.5);
    } else {
        int e = 0;
        double m = frexp(a, &e) * 2.0; /* a = m * 2^(e - 1), 1 <= m < 2 */
        unsigned q = (unsigned)((m - 1.0) * 8.0 + 0.5);
        code = (unsigned)(e - 1 + 7) * 8u + q; /* q = 8 carries into the exponent */
        code = code > 0x7Eu ? 0x7Eu : code;
    }
    return (unsigned char)(code | (x < 0 && code != 0 ? 0x80u : 0u));
}

/* fx_opts.trained with fx_opts.fp8: the same Gaussian, its largest possible magnitude (3.46
 * standard deviations) scaled to 448, each value rounded to E4M3. */
static inline void fx_fill_trained_fp8(fx *f)
{
    uint64_t z = 0x9E3779B97F4A7C15ull;
    for (size_t t = 0; t < f->nt; t++)
        for (size_t j = 0; j < f->sizes[t]; j++) {
            double sum = 0;
            for (int k = 0; k < 4; k++) {
                z = z * 6364136223846793005ull + 1442695040888963407ull;
                sum += (double)(z >> 11) / 9007199254740992.0;
            }
            f->bytes[t][j] = fx_e4m3((sum - 2.0) * 224.0);
        }
}

/* What byte j of local tensor t holds with salt. */
static inline unsigned char fx_want(const fx *f, size_t t, size_t j, unsigned salt)
{
    return f->o.trained ? f->bytes[t][j] : fx_byte(t, j, salt);
}

static inline int fx_write_file(fx *f)
{
    char *hdr = malloc(64 * 1024);
    size_t n = 0;
    uint64_t off = 0;
    n += (size_t)sprintf(hdr + n, "{");
    for (size_t t = 0; t < f->nt; t++) {
        n += (size_t)sprintf(hdr + n,
                             "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%llu,%llu],"
                             "\"data_offsets\":[%llu,%llu]}",
                             t ? "," : "", f->names[t], f->o.fp8 ? "F8_E4M3" : "F32",
                             (unsigned long long)f->shapes[t][0],
                             (unsigned long long)f->shapes[t][1], (unsigned long long)off,
                             (unsigned long long)(off + f->sizes[t]));
        off += f->sizes[t];
    }
    n += (size_t)sprintf(hdr + n, "}");
    while (n % 8 != 0)
        hdr[n++] = ' ';
    FILE *fp = fopen(f->path, "wb");
    if (fp == NULL) {
        free(hdr);
        return -1;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)n >> (8 * i));
    fwrite(len8, 1, 8, fp);
    fwrite(hdr, 1, n, fp);
    for (size_t t = 0; t < f->nt; t++)
        fwrite(f->bytes[t], 1, f->sizes[t], fp);
    fclose(fp);
    free(hdr);
    return 0;
}

static inline void fx_add(fx *f, const char *name, uint64_t rows, uint64_t cols)
{
    size_t t = f->nt++;
    f->names[t] = strdup(name);
    f->shapes[t][0] = rows;
    f->shapes[t][1] = cols;
    f->sizes[t] = rows * cols * (f->o.fp8 ? 1 : 4);
    f->bytes[t] = malloc(f->sizes[t]);
}

static inline void fx_set(fx *f, const char *key, const char *value)
{
    int rc = ddo_config_set(f->cfg, key, value);
    if (rc != 0)
        fprintf(stderr, "  config %s=%s: %s\n", key, value, ddo_last_error());
}

/* Builds everything; f->rc is ddo_session_create's result (others must succeed). */
/* The plan inputs of the fixture's cpu device: device_bytes of memory, free, FX_GRAN, VMM. */
static inline ddo_plan_inputs fx_cpu_inputs(uint64_t device_bytes, uint64_t host_bytes)
{
    ddo_plan_inputs in = DDO_PLAN_INPUTS_INIT;
    in.device_total_bytes = device_bytes;
    in.device_free_bytes = device_bytes;
    in.device_granularity = FX_GRAN;
    in.device_is_cpu = true;
    in.device_vmm_supported = true;
    in.host_available_bytes = host_bytes;
    return in;
}

static inline int fx_create(fx *f, const fx_opts *o)
{
    memset(f, 0, sizeof(*f));
    f->o = *o;
    if (f->o.blocks == 0)
        f->o.blocks = 4;
    if (f->o.slots == 0)
        f->o.slots = 3;
    if (f->o.mode == NULL)
        f->o.mode = "vmm_fast_runtime";
    if (f->o.device_bytes == 0)
        f->o.device_bytes = DDO_GIB;
    if (f->o.cols == 0)
        f->o.cols = FX_COLS;
    fx_add(f, "norm.bias", 1, 16); /* small: resident */
    for (int b = 0; b < f->o.blocks; b++) {
        char name[64];
        snprintf(name, sizeof(name), "blocks.%d.attn.weight", b);
        fx_add(f, name, FX_ROWS, f->o.cols);
        for (int k = 0; k + 2 < f->o.weights; k++) {
            snprintf(name, sizeof(name), "blocks.%d.w%d.weight", b, k);
            fx_add(f, name, FX_ROWS, f->o.cols);
        }
        snprintf(name, sizeof(name), "blocks.%d.ff.weight", b);
        fx_add(f, name, FX_ROWS + (uint64_t)b, f->o.cols);
    }
    fx_add(f, "head.weight", 8, 16); /* small: resident */
    fx_fill(f, 0);
    if (f->o.trained && f->o.fp8)
        fx_fill_trained_fp8(f);
    else if (f->o.trained)
        fx_fill_trained(f);
    for (size_t t = 0; f->o.trained && f->o.random_tensor != NULL && t < f->nt; t++)
        if (strcmp(f->names[t], f->o.random_tensor) == 0) {
            uint64_t z = 88172645463325252ull;
            for (size_t j = 0; j < f->sizes[t]; j++) {
                z ^= z << 13, z ^= z >> 7, z ^= z << 17;
                f->bytes[t][j] = (unsigned char)(z >> 24);
            }
        }

    if (f->o.file) {
        snprintf(f->dir, sizeof(f->dir), "/var/tmp/ddo_session_XXXXXX");
        if (mkdtemp(f->dir) == NULL)
            return -1;
        snprintf(f->path, sizeof(f->path), "%s/model.safetensors", f->dir);
        if (fx_write_file(f) != 0)
            return -1;
        if (ddo_checkpoint_create(f->path, DDO_READ_DEFAULT, &f->ck) != 0) {
            fprintf(stderr, "  checkpoint: %s\n", ddo_last_error());
            return -1;
        }
    } else {
        ddo_tensor_desc d[FX_MAX_TENSORS];
        for (size_t t = 0; t < f->nt; t++) {
            d[t].name = f->names[t];
            d[t].dtype = f->o.fp8 ? DDO_DTYPE_F8_E4M3 : DDO_DTYPE_F32;
            d[t].ndim = 2;
            d[t].shape = f->shapes[t];
            d[t].data = f->bytes[t];
        }
        if (ddo_checkpoint_create_from_memory(d, f->nt, &f->ck) != 0) {
            fprintf(stderr, "  checkpoint: %s\n", ddo_last_error());
            return -1;
        }
    }

    ddo_cpu_options dopt_cpu = DDO_CPU_OPTIONS_INIT;
    dopt_cpu.memory_bytes = f->o.device_bytes;
    dopt_cpu.granularity = FX_GRAN;
    dopt_cpu.bytes_per_s = f->o.bytes_per_s;
    dopt_cpu.copy_latency_ns = f->o.latency_ns;
    ddo_device_options dopt = DDO_DEVICE_OPTIONS_INIT;
    dopt.cpu = &dopt_cpu;
    if (ddo_device_create("cpu", &dopt, &f->dev) != 0) {
        fprintf(stderr, "  device: %s\n", ddo_last_error());
        return -1;
    }
    if (ddo_stream_create(f->dev, &f->stream) != 0)
        return -1;

    if (ddo_config_create(&f->cfg) != 0)
        return -1;
    char v[64];
    fx_set(f, "execution_device", "cpu");
    if (strcmp(f->o.mode, "linear_runtime") != 0)
        fx_set(f, "backend", "vmm");
    fx_set(f, "execution_mode", f->o.mode);
    snprintf(v, sizeof(v), "%d", f->o.slots);
    fx_set(f, "execution_slots", v);
    snprintf(v, sizeof(v), "%g", f->o.budget_gb > 0 ? f->o.budget_gb : 0.0625);
    fx_set(f, "vmm_resident_weight_budget_gb", v);
    /* These tests stream: nothing resident by budget (a device budget alone fills itself). */
    fx_set(f, "resident_module_budget_gb", "0");
    fx_set(f, "vmm_staging_buffer_gb", "0.0625");
    snprintf(v, sizeof(v), "%g", f->o.cache_gb);
    fx_set(f, "vmm_source_cache_gb", v);
    fx_set(f, "pin_cpu_memory", f->o.pin ? "true" : "false");
    fx_set(f, "vmm_execution_backing_reclaim", f->o.reclaim ? "true" : "false");
    if (f->o.weight_codec != NULL)
        fx_set(f, "weight_codec", f->o.weight_codec);
    if (f->o.codec_cache_dir != NULL)
        fx_set(f, "weight_codec_cache_dir", f->o.codec_cache_dir);
    if (ddo_config_validate(f->cfg) != 0) {
        fprintf(stderr, "  config: %s\n", ddo_last_error());
        return -1;
    }

    ddo_plan_inputs in = fx_cpu_inputs(f->o.device_bytes, 8 * DDO_GIB);
    if (ddo_plan_build(f->ck, f->cfg, &in, &f->plan) != 0) {
        fprintf(stderr, "  plan: %s\n", ddo_last_error());
        return -1;
    }
    if (f->o.no_session)
        return 0;
    ddo_session_options so = DDO_SESSION_OPTIONS_INIT;
    so.config = f->cfg;
    f->rc = ddo_session_create(f->plan, f->ck, f->dev, &so, &f->s);
    if (f->rc != 0)
        fprintf(stderr, "  session: %s\n", ddo_last_error());
    return 0;
}

/* Device bytes, pinned and registered bytes held by the device right now. */
static inline uint64_t fx_device_held(fx *f)
{
    ddo__device_usage_t u;
    ddo__device_usage(f->dev, &u);
    return u.device_bytes + u.pinned_bytes + u.registered_bytes + u.mapped_bytes + u.va_bytes;
}

static inline void fx_destroy(fx *f)
{
    ddo_session_destroy(f->s);
    f->s = NULL;
    if (f->dev != NULL) {
        ddo__device_usage_t u;
        ddo__device_usage(f->dev, &u);
        T_EQ_U64(u.device_bytes, 0);
        T_EQ_U64(u.pinned_bytes, 0);
        T_EQ_U64(u.registered_bytes, 0);
        T_EQ_U64(u.va_bytes, 0);
        T_EQ_U64(u.mapped_bytes, 0);
    }
    ddo_plan_destroy(f->plan);
    ddo_config_destroy(f->cfg);
    ddo_stream_destroy(f->stream);
    ddo_device_destroy(f->dev);
    ddo_checkpoint_destroy(f->ck);
    if (f->o.file) {
        unlink(f->path);
        rmdir(f->dir);
    }
    for (size_t t = 0; t < f->nt; t++) {
        free(f->names[t]);
        free(f->bytes[t]);
    }
    memset(f, 0, sizeof(*f));
}

/* Index of the tensor named name in the checkpoint. */
static inline size_t fx_tensor(fx *f, const char *name)
{
    size_t i = SIZE_MAX;
    ddo_checkpoint_find(f->ck, name, &i);
    return i;
}

/* Index into f->bytes of checkpoint tensor i. */
static inline size_t fx_local(fx *f, size_t i)
{
    const ddo_tensor_info *ti = ddo_checkpoint_tensor(f->ck, i);
    for (size_t t = 0; t < f->nt; t++)
        if (ti != NULL && strcmp(ti->name, f->names[t]) == 0)
            return t;
    return SIZE_MAX;
}

/* The unit named "blocks.N". */
static inline size_t fx_unit(fx *f, int block)
{
    char name[32];
    snprintf(name, sizeof(name), "blocks.%d", block);
    for (size_t u = 0; u < ddo_plan_unit_count(f->plan); u++) {
        ddo_unit_info info;
        if (ddo_plan_unit(f->plan, u, &info) == 0 && strcmp(info.name, name) == 0)
            return u;
    }
    return SIZE_MAX;
}

/* Checks the bytes of every tensor of unit (leased, stream synchronised) against salt:
 * 0, -1 on a wrong byte, -2 when reading back failed. */
static inline int fx_check_unit(fx *f, size_t unit, unsigned salt)
{
    size_t n = 0;
    const size_t *ts = ddo_plan_unit_tensors(f->plan, unit, &n);
    int bad = 0;
    for (size_t k = 0; k < n; k++) {
        void *p = NULL;
        if (ddo_session_tensor_address(f->s, ts[k], &p) != 0) {
            fprintf(stderr, "  address: %s\n", ddo_last_error());
            return -1;
        }
        size_t t = fx_local(f, ts[k]);
        unsigned char *buf = malloc(f->sizes[t]);
        if (ddo__dev_copy_d2h(f->dev, buf, (uint64_t)(uintptr_t)p, f->sizes[t]) != 0)
            bad = -2; /* the host's own read failed (fault injection) */
        for (size_t j = 0; j < f->sizes[t] && bad == 0; j++)
            if (buf[j] != fx_want(f, t, j, salt)) {
                fprintf(stderr, "  tensor %s byte %zu: %u != %u\n", f->names[t], j, buf[j],
                        fx_want(f, t, j, salt));
                bad = -1;
            }
        free(buf);
    }
    return bad;
}

/* acquire + synchronize + check + release. */
static inline int fx_use(fx *f, size_t unit)
{
    int rc = ddo_session_acquire(f->s, unit, f->stream);
    if (rc != 0)
        return rc;
    rc = ddo_stream_synchronize(f->stream);
    if (rc != 0) {
        rc = FX_HOST_FAILED;
    } else {
        int c = fx_check_unit(f, unit, 0);
        rc = c == 0 ? 0 : c == -2 ? FX_HOST_FAILED : -100;
    }
    int rc2 = ddo_session_release(f->s, unit, f->stream);
    return rc != 0 ? rc : rc2;
}

static inline double fx_metric(fx *f, const char *name)
{
    ddo_metrics *m = NULL;
    double v = -1;
    if (ddo_session_metrics(f->s, false, &m) == 0) {
        if (ddo_metrics_get(m, name, &v) != 0)
            v = -2;
        ddo_metrics_destroy(m);
    }
    return v;
}

/* A label of the session's metrics into buf ("(none)" when absent). */
static inline const char *fx_label(fx *f, const char *key, char *buf, size_t len)
{
    ddo_metrics *m = NULL;
    buf[0] = '\0';
    if (ddo_session_metrics(f->s, false, &m) == 0) {
        const char *v = ddo_metrics_label(m, key);
        snprintf(buf, len, "%s", v != NULL ? v : "(none)");
        ddo_metrics_destroy(m);
    }
    return buf;
}

/* One step: every block used in order, each lease checked byte for byte. */
static inline void fx_step(fx *f, const char *what, int step)
{
    for (int b = 0; b < f->o.blocks; b++)
        T_CHECK_MSG(fx_use(f, fx_unit(f, b)) == 0, "%s: step %d block %d", what, step, b);
}

/* Streams every unit twice, each lease checked against the raw bytes. */
static inline void fx_two_steps(fx *f, const char *what)
{
    for (int step = 0; step < 2; step++)
        fx_step(f, what, step);
}

/* The coded sidecars (*.ddoc) in dir: their count, and the path of the last one seen. */
static inline int fx_sidecars(const char *dir, char *path, size_t len)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d != NULL && (de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (l > 5 && strcmp(de->d_name + l - 5, ".ddoc") == 0) {
            n++;
            if (path != NULL)
                snprintf(path, len, "%s/%s", dir, de->d_name);
        }
    }
    if (d != NULL)
        closedir(d);
    return n;
}

/* Removes every coded sidecar in dir. */
static inline void fx_clear_sidecars(const char *dir)
{
    char p[600];
    while (fx_sidecars(dir, p, sizeof(p)) > 0)
        T_REQUIRE(unlink(p) == 0);
}

#endif /* DDO_SESSION_FX_H */
