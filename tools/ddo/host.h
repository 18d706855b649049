/*
 * host.h - the tool's reference host: runs every unit's matrix products on
 * the device so that streaming can be timed and checked end to end without
 * any other framework. Each 2-D weight W [out, in] (BF16, F16 or F32) is
 * applied to its own deterministic activation X [tokens, in]: Y = X W^T,
 * accumulated in F32. The outputs of a step are folded into a 64-bit
 * checksum that is bit-identical between a resident and a streamed run.
 *
 * Two back ends: host_cpu.c (a plain loop on the cpu device, after the
 * stream's uploads are complete) and host_cuda.c (cuBLASLt loaded at run
 * time, on the host stream that waits on ddo's upload events). FP8 and other
 * dtypes are moved as bytes; their compute is skipped and counted.
 *
 * host.c dispatches: a device whose caps say is_cpu gets the cpu back end,
 * any other device the cuda back end (the ref_host_cuda_* functions below,
 * implemented by host_cuda.c; without CUDA headers they return
 * DDO_E_NO_DEVICE).
 *
 * The checksum (both back ends): per weight, Y [tokens, out] row-major is
 * folded with ref_checksum_floats() starting from REF_CHECKSUM_INIT; the
 * step checksum starts from REF_CHECKSUM_INIT and, for each tensor that ran
 * in the step in checkpoint index order (not run order, so every route and
 * unit granularity gives the same value), folds the index then the tensor's
 * value with ref_checksum_u64(). The cpu back end also folds the raw bytes of
 * moved-only tensors (ref_checksum_bytes), so a wrong bias or norm byte is
 * noticed too. `ddo run --verify` only compares checksums of one back end. Activations: element i
 * of the row-major X [tokens, in] of checkpoint tensor t is ref_activation(t, i).
 */
#ifndef DDO_TOOL_HOST_H
#define DDO_TOOL_HOST_H

#include "ddo.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct ref_host ref_host;

typedef struct ref_host_stats {
    uint64_t weights_computed; /* 2-D weights whose product ran */
    uint64_t weights_skipped;  /* FP8 / integer / non-2-D: moved only */
    uint64_t flops;            /* 2 * tokens * out * in summed */
} ref_host_stats;

/* Creates the host for dev (cpu or cuda) with `tokens` activation rows. */
int ref_host_create(ddo_device *dev, const ddo_checkpoint *ck, uint64_t tokens, ref_host **out);
void ref_host_destroy(ref_host *h);
/* Queues (cuda) or runs (cpu) the products of every 2-D weight among tensors[0..count)
 * whose device addresses the session gives, on stream. */
int ref_host_run_tensors(ref_host *h, ddo_session *s, const size_t *tensors, size_t count,
                         ddo_stream *stream);
/* Waits for the queued work and returns the checksum of all outputs since the last call. */
int ref_host_step_checksum(ref_host *h, ddo_stream *stream, uint64_t *checksum);
void ref_host_stats_get(const ref_host *h, ref_host_stats *out);
const char *ref_host_error(const ref_host *h);

/* cuda back end entry points (host_cuda.c); return DDO_E_NO_DEVICE without CUDA. */
int ref_host_cuda_available(void);

/* ---- added by the run helper (additive) ---------------------------------------- */

/* Creation settings beyond the token count. Zero-initialise, then set. */
typedef struct ref_host_config {
    uint64_t tokens;        /* activation rows, >= 1 */
    bool checksum;          /* fold outputs into the step checksum (cuda: copies outputs back,
                               so timing runs leave it off); ref_host_create sets it true */
    double cpu_flops_per_s; /* cpu back end: a unit's compute takes at least flops / rate
                               (sleeps the rest); 0 = as fast as it runs. Ignored by cuda. */
} ref_host_config;

/* Like ref_host_create with every setting explicit. */
int ref_host_create_ex(ddo_device *dev, const ddo_checkpoint *ck, const ref_host_config *cfg,
                       ref_host **out);

/*
 * The independent reference of `ddo run --verify` on the cpu: reads each of
 * tensors[0..count) from the checkpoint into host memory (ddo_checkpoint_read,
 * no session, no device) and runs the cpu loop on it, folding into the same
 * step checksum as ref_host_run_tensors. Works with either back end's host
 * object but is only comparable with the cpu back end's checksums.
 */
int ref_host_run_checkpoint(ref_host *h, const size_t *tensors, size_t count);

/* Host time spent inside ref_host_run_tensors / ref_host_step_checksum since create, ns. */
uint64_t ref_host_compute_ns(const ref_host *h);
/* "cpu" or "cuda". */
const char *ref_host_backend_name(const ref_host *h);

/*
 * The cuda back end, called only by host.c. err (err_len bytes) receives a one-line detail
 * on failure; stats is the host's running total, to which run_tensors adds.
 */
typedef struct ref_host_cuda ref_host_cuda;
int ref_host_cuda_create(ddo_device *dev, const ddo_checkpoint *ck, const ref_host_config *cfg,
                         ref_host_cuda **out, char *err, size_t err_len);
void ref_host_cuda_destroy(ref_host_cuda *c);
int ref_host_cuda_run_tensors(ref_host_cuda *c, ddo_session *s, const size_t *tensors, size_t count,
                              ddo_stream *stream, ref_host_stats *stats, char *err, size_t err_len);
/* Waits for stream; *checksum is the fold of outputs since the last call (0 if checksum off). */
int ref_host_cuda_step_checksum(ref_host_cuda *c, ddo_stream *stream, uint64_t *checksum, char *err,
                                size_t err_len);

/*
 * The cpu back end (host_cpu.c), called only by host.c: the plain loop. Works on any tensor
 * bytes in host memory; run_tensors takes them from the session (on the cpu device device
 * addresses are host pointers) after synchronizing stream.
 */
typedef struct ref_host_cpu ref_host_cpu;
int ref_host_cpu_create(const ddo_checkpoint *ck, const ref_host_config *cfg, ref_host_cpu **out,
                        char *err, size_t err_len);
void ref_host_cpu_destroy(ref_host_cpu *c);
int ref_host_cpu_run_tensors(ref_host_cpu *c, ddo_session *s, const size_t *tensors, size_t count,
                             ddo_stream *stream, ref_host_stats *stats, char *err, size_t err_len);
int ref_host_cpu_run_checkpoint(ref_host_cpu *c, const size_t *tensors, size_t count,
                                ref_host_stats *stats, char *err, size_t err_len);
int ref_host_cpu_step_checksum(ref_host_cpu *c, uint64_t *checksum);
/* The plain loop's rate on this machine for `tokens` rows (FLOP/s; 0 if it cannot tell): a
 * cost-model input for the cpu device when its compute is not throttled. ~10-50 ms. */
double ref_host_cpu_measure_flops(uint64_t tokens);

/* ---- the shared deterministic definitions (both back ends) ----------------------- */

#define REF_CHECKSUM_INIT   UINT64_C(0xcbf29ce484222325) /* FNV-1a 64 offset basis */
#define REF_CHECKSUM_PRIME  UINT64_C(0x100000001b3)
#define REF_ACTIVATION_SEED UINT64_C(0x646430726566686f) /* "dd0refho" */

/* Folds n bytes (FNV-1a 64). */
static inline uint64_t ref_checksum_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= REF_CHECKSUM_PRIME;
    }
    return h;
}

/* Folds a 64-bit value as its 8 little-endian bytes. */
static inline uint64_t ref_checksum_u64(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xffu;
        h *= REF_CHECKSUM_PRIME;
    }
    return h;
}

/* Folds n floats as the little-endian bytes of their IEEE bits, in order. */
static inline uint64_t ref_checksum_floats(uint64_t h, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &y[i], sizeof bits);
        for (int k = 0; k < 4; k++) {
            h ^= (bits >> (8 * k)) & 0xffu;
            h *= REF_CHECKSUM_PRIME;
        }
    }
    return h;
}

/*
 * Element i of the activation of checkpoint tensor t: a multiple of 1/256 in
 * [-1, 1), exact in BF16, F16 and F32 (so a device may generate it in any of
 * them). splitmix64 of (seed, t, i).
 */
static inline float ref_activation(uint64_t t, uint64_t i)
{
    uint64_t z = REF_ACTIVATION_SEED ^ (t * UINT64_C(0x9e3779b97f4a7c15)) ^
                 (i * UINT64_C(0xd1b54a32d192ed03));
    z += UINT64_C(0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    z ^= z >> 31;
    return (float)((int)(z & 511u) - 256) / 256.0f;
}

#endif /* DDO_TOOL_HOST_H */
