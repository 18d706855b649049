/*
 * collective.h - the all-gather of a device set (docs/multi-gpu.md, split mode): a
 * communicator over n devices of one kind that this process drives (rank r = devs[r]), and
 * the split upload built on it: each rank copies 1/n of a buffer from host memory over its own
 * link, then an all-gather completes the buffer on every rank.
 *
 *   cpu   an emulated all-gather: a host function on each rank's stream meets the others at
 *         a barrier, copies their shards, and meets them again before its stream goes on, so
 *         every path runs in CI
 *   cuda  NCCL, loaded at run time with dlopen like the CUDA driver (libnccl.so.2, or the
 *         path given): ncclCommInitAll over the devices' ordinals, one ncclAllGather per rank
 *         inside a group. Never the NVLink multicast path: NCCL_NVLS_ENABLE is set to 0 when
 *         unset, and a communicator is refused when it asks for anything else.
 *
 * Internal; never installed. Thread-safety: one caller at a time per communicator.
 */
#ifndef DDO_COLLECTIVE_H
#define DDO_COLLECTIVE_H

#include "device/device.h"

#define DDO__COMM_MAX 16

typedef struct ddo__comm ddo__comm;

/* A communicator over devs[0..n) (2..DDO__COMM_MAX devices, one kind, each once). cuda:
 * nccl_path is the library to load (NULL or "": libnccl.so.2); DDO_E_NO_DEVICE with one line
 * ("NCCL not available: dlopen(libnccl.so.2): ...") when it does not load. */
int ddo__comm_create(ddo_device *const *devs, size_t n, const char *nccl_path, ddo__comm **out,
                     ddo__errbuf *eb);
void ddo__comm_destroy(ddo__comm *c);
size_t ddo__comm_size(const ddo__comm *c);
/* "emulated (cpu)" or "NCCL <version>". */
const char *ddo__comm_engine(const ddo__comm *c);

/* All-gather of `bytes` per rank, queued on streams[r] (a stream of devs[r]): rank k's bytes
 * at send[k] land at recv[r] + k * bytes on every rank r (recv[r] holds n * bytes). In place
 * when send[r] == recv[r] + r * bytes. */
int ddo__comm_all_gather(ddo__comm *c, const uint64_t *send, const uint64_t *recv, uint64_t bytes,
                         void *const *streams, ddo__errbuf *eb);

/* The shard of a split of `bytes` over n ranks (every rank's, padded: n * shard >= bytes). */
uint64_t ddo__split_shard(uint64_t bytes, size_t n);
/* The split upload: rank r copies bytes [r * shard, ...) of host (its share, the last one
 * shorter) to dst[r] + r * shard on streams[r], then the all-gather completes dst[r][0, bytes)
 * on every rank. Every dst[r] holds n * ddo__split_shard(bytes, n) bytes (the padding past
 * `bytes` is overwritten). host must stay valid until the streams reach the copies. */
int ddo__split_upload(ddo__comm *c, const void *host, uint64_t bytes, const uint64_t *dst,
                      void *const *streams, ddo__errbuf *eb);

#endif /* DDO_COLLECTIVE_H */
