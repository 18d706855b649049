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
 */
#ifndef DDO_TOOL_HOST_H
#define DDO_TOOL_HOST_H

#include "ddo.h"

#include <stdbool.h>
#include <stdint.h>

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

#endif /* DDO_TOOL_HOST_H */
