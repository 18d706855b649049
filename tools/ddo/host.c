/*
 * host.c - the reference host's dispatch: a cpu device (or no device) gets
 * the plain loop of host_cpu.c, any other device the cuBLASLt back end of
 * host_cuda.c. Keeps the running statistics, the compute time and the
 * one-line detail of the last failure.
 */
#include "host.h"
#include "tool.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct ref_host {
    ref_host_config cfg;
    const ddo_checkpoint *ck;
    ref_host_cpu *cpu;   /* always: the cpu loop and the checkpoint reference */
    ref_host_cuda *cuda; /* devices other than cpu */
    ref_host_stats stats;
    uint64_t compute_ns;
    char err[512];
};

int ref_host_create_ex(ddo_device *dev, const ddo_checkpoint *ck, const ref_host_config *cfg,
                       ref_host **out)
{
    if (ck == NULL || cfg == NULL || out == NULL || cfg->tokens == 0)
        return DDO_E_INVALID_ARGUMENT;
    bool is_cpu = true;
    if (dev != NULL) {
        ddo_device_caps caps;
        int rc = ddo_device_caps_get(dev, &caps);
        if (rc != 0)
            return rc;
        is_cpu = caps.is_cpu;
    }
    ref_host *h = calloc(1, sizeof *h);
    if (h == NULL)
        return DDO_E_NO_MEMORY;
    h->cfg = *cfg;
    h->ck = ck;
    int rc = ref_host_cpu_create(ck, cfg, &h->cpu, h->err, sizeof h->err);
    if (rc == 0 && !is_cpu)
        rc = ref_host_cuda_create(dev, ck, cfg, &h->cuda, h->err, sizeof h->err);
    if (rc != 0) {
        fprintf(stderr, "ddo: %s\n", h->err);
        ref_host_destroy(h);
        return rc;
    }
    *out = h;
    return 0;
}

int ref_host_create(ddo_device *dev, const ddo_checkpoint *ck, uint64_t tokens, ref_host **out)
{
    ref_host_config cfg = { 0 };
    cfg.tokens = tokens;
    cfg.checksum = true;
    return ref_host_create_ex(dev, ck, &cfg, out);
}

void ref_host_destroy(ref_host *h)
{
    if (h == NULL)
        return;
    ref_host_cuda_destroy(h->cuda);
    ref_host_cpu_destroy(h->cpu);
    free(h);
}

int ref_host_run_tensors(ref_host *h, ddo_session *s, const size_t *tensors, size_t count,
                         ddo_stream *stream)
{
    if (h == NULL)
        return DDO_E_INVALID_ARGUMENT;
    uint64_t t0 = tool_now_ns();
    int rc = h->cuda != NULL ? ref_host_cuda_run_tensors(h->cuda, s, tensors, count, stream,
                                                         &h->stats, h->err, sizeof h->err)
                             : ref_host_cpu_run_tensors(h->cpu, s, tensors, count, stream,
                                                        &h->stats, h->err, sizeof h->err);
    h->compute_ns += tool_now_ns() - t0;
    return rc;
}

int ref_host_run_checkpoint(ref_host *h, const size_t *tensors, size_t count)
{
    if (h == NULL)
        return DDO_E_INVALID_ARGUMENT;
    uint64_t t0 = tool_now_ns();
    int rc = ref_host_cpu_run_checkpoint(h->cpu, tensors, count, &h->stats, h->err, sizeof h->err);
    h->compute_ns += tool_now_ns() - t0;
    return rc;
}

int ref_host_step_checksum(ref_host *h, ddo_stream *stream, uint64_t *checksum)
{
    if (h == NULL || checksum == NULL)
        return DDO_E_INVALID_ARGUMENT;
    uint64_t t0 = tool_now_ns();
    int rc;
    uint64_t v = 0;
    if (h->cuda != NULL) {
        rc = ref_host_cuda_step_checksum(h->cuda, stream, &v, h->err, sizeof h->err);
    } else {
        rc = stream != NULL ? ddo_stream_synchronize(stream) : 0;
        if (rc != 0)
            snprintf(h->err, sizeof h->err, "reference host: stream: %s", ddo_last_error());
        else
            rc = ref_host_cpu_step_checksum(h->cpu, &v);
    }
    h->compute_ns += tool_now_ns() - t0;
    if (rc == 0)
        *checksum = v;
    return rc;
}

void ref_host_stats_get(const ref_host *h, ref_host_stats *out)
{
    if (h != NULL && out != NULL)
        *out = h->stats;
}

const char *ref_host_error(const ref_host *h)
{
    return h != NULL ? h->err : "";
}

uint64_t ref_host_compute_ns(const ref_host *h)
{
    return h != NULL ? h->compute_ns : 0;
}

const char *ref_host_backend_name(const ref_host *h)
{
    return h != NULL && h->cuda != NULL ? "cuda" : "cpu";
}
