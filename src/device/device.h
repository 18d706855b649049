/*
 * device.h - the one internal table of device operations, and the thin
 * wrappers every other module calls.
 *
 * A device knows nothing of checkpoints or plans: it reserves virtual ranges,
 * creates physical handles, maps them, allocates plain device buffers,
 * registers and allocates host memory, and runs asynchronous host->device
 * copies ordered by streams and events. Two implementations exist:
 * device_cpu.c (host memory posing as device memory; the reference every test
 * runs on) and device_cuda.c (the CUDA driver API, loaded at run time).
 *
 * The wrappers (device_calls.c) check arguments, count calls and bytes, and inject
 * faults (fail the Nth call of an operation once or from then on), so every
 * failure path of the session can be tested on the cpu device.
 *
 * Addresses: device addresses are uint64_t (a CUdeviceptr on cuda, a host
 * address on cpu). Physical handles are uint64_t (a CUmemGenericAllocationHandle
 * on cuda). Streams and events are opaque pointers owned by the device.
 */
#ifndef DDO_DEVICE_H
#define DDO_DEVICE_H

#include "base/common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Every operation, for counters and fault injection. */
#define DDO_DEVICE_OPS(X)                     \
    X(MEM_INFO, mem_info)                     \
    X(VA_RESERVE, va_reserve)                 \
    X(VA_RELEASE, va_release)                 \
    X(PHYS_CREATE, phys_create)               \
    X(PHYS_RELEASE, phys_release)             \
    X(MAP, map)                               \
    X(UNMAP, unmap)                           \
    X(SET_ACCESS, set_access)                 \
    X(MEM_ALLOC, mem_alloc)                   \
    X(MEM_FREE, mem_free)                     \
    X(HOST_REGISTER, host_register)           \
    X(HOST_UNREGISTER, host_unregister)       \
    X(HOST_ALLOC, host_alloc)                 \
    X(HOST_FREE, host_free)                   \
    X(STREAM_CREATE, stream_create)           \
    X(STREAM_DESTROY, stream_destroy)         \
    X(STREAM_SYNCHRONIZE, stream_synchronize) \
    X(COPY_H2D, copy_h2d)                     \
    X(COPY_D2H, copy_d2h)                     \
    X(COPY_D2H_ASYNC, copy_d2h_async)         \
    X(EVENT_CREATE, event_create)             \
    X(EVENT_DESTROY, event_destroy)           \
    X(EVENT_RECORD, event_record)             \
    X(EVENT_QUERY, event_query)               \
    X(EVENT_SYNCHRONIZE, event_synchronize)   \
    X(STREAM_WAIT_EVENT, stream_wait_event)   \
    X(HOST_FN, host_fn)                       \
    X(CODEC_DECODE, codec_decode)             \
    X(EVENT_CREATE_TIMED, event_create_timed) \
    X(EVENT_ELAPSED, event_elapsed)           \
    X(COPY_PEER, copy_peer)

typedef enum ddo__devop {
#define DDO_DEVOP_ENUM_(NAME, name) DDO__OP_##NAME,
    DDO_DEVICE_OPS(DDO_DEVOP_ENUM_)
#undef DDO_DEVOP_ENUM_
        DDO__OP_COUNT
} ddo__devop;

/* Name of an operation ("map"), for messages and metrics. */
const char *ddo__devop_name(ddo__devop op);

typedef void (*ddo__host_fn)(void *user);

/* One tensor of a batched decode for a device decoder (codec.h). */
typedef struct ddo__codec_desc ddo__codec_desc;

/*
 * The operation table. Every function returns 0 or a negative DDO_E_* code
 * and writes a one-line detail into eb on failure (naming the driver call and
 * its error, e.g. "cuMemMap: CUDA_ERROR_OUT_OF_MEMORY"). `st` is the state
 * returned by open.
 */
typedef struct ddo__device_ops {
    const char *name; /* "cpu", "cuda" */
    /* opts as device.c took it (ddo.h's ABI rule): from there, opts->cpu and opts->cuda are
     * never NULL and are this library's full structs (zero past the caller's fields). */
    int (*open)(const char *spec, const ddo_device_options *opts, void **st, ddo__errbuf *eb);
    void (*close)(void *st);
    int (*caps)(void *st, ddo_device_caps *out, ddo__errbuf *eb);
    int (*mem_info)(void *st, uint64_t *free_bytes, uint64_t *total_bytes, ddo__errbuf *eb);

    /* VMM: reserve -> create -> map -> set access; unmap -> release -> free range. */
    int (*va_reserve)(void *st, uint64_t size, uint64_t *va, ddo__errbuf *eb);
    int (*va_release)(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb);
    int (*phys_create)(void *st, uint64_t size, uint64_t *handle, ddo__errbuf *eb);
    int (*phys_release)(void *st, uint64_t handle, ddo__errbuf *eb);
    /* handle_offset must be 0 on both devices: cuMemMap's offset "currently must be zero"
     * (CUDA_ERROR_NOT_SUPPORTED -> DDO_E_UNSUPPORTED, and the cpu device refuses it alike).
     * It stays in the table for a future driver. */
    int (*map)(void *st, uint64_t va, uint64_t size, uint64_t handle, uint64_t handle_offset,
               ddo__errbuf *eb);
    int (*unmap)(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb);
    int (*set_access)(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb);

    /* Plain device buffers (linear route, resident tensors). */
    int (*mem_alloc)(void *st, uint64_t size, uint64_t *ptr, ddo__errbuf *eb);
    int (*mem_free)(void *st, uint64_t ptr, ddo__errbuf *eb);

    /* Host memory: register existing pages / allocate pinned pages. */
    int (*host_register)(void *st, void *p, size_t size, ddo__errbuf *eb);
    int (*host_unregister)(void *st, void *p, ddo__errbuf *eb);
    int (*host_alloc)(void *st, size_t size, void **p, ddo__errbuf *eb);
    int (*host_free)(void *st, void *p, ddo__errbuf *eb);

    /* Streams: priority 0 = high (the reference host's compute, ddo's decode stream);
     * 1 = low (ddo's copy and notify streams). */
    int (*stream_create)(void *st, int priority, void **stream, ddo__errbuf *eb);
    int (*stream_destroy)(void *st, void *stream, ddo__errbuf *eb);
    int (*stream_synchronize)(void *st, void *stream, ddo__errbuf *eb);
    /* A host's stream borrowed for leases (ddo_stream_wrap): cuda takes a CUstream (NULL: the
     * legacy default stream) and never destroys it; cpu takes NULL, the calling thread, on
     * which queued work runs at once. unwrap ends the borrow. Not counted as device ops. */
    int (*stream_wrap)(void *st, void *native, void **stream, ddo__errbuf *eb);
    int (*stream_unwrap)(void *st, void *stream, ddo__errbuf *eb);
    /* Asynchronous copy ordered on stream; src must stay valid until it completes. */
    int (*copy_h2d)(void *st, uint64_t dst, const void *src, size_t size, void *stream,
                    ddo__errbuf *eb);
    /* Synchronous device->host copy (verification, tests). */
    int (*copy_d2h)(void *st, void *dst, uint64_t src, size_t size, ddo__errbuf *eb);
    /* Asynchronous device->host copy ordered on stream into pinned host memory (host_alloc,
     * or registered); dst is written when the stream reaches it (an event recorded after it
     * tells when). */
    int (*copy_d2h_async)(void *st, void *dst, uint64_t src, size_t size, void *stream,
                          ddo__errbuf *eb);

    /* Events: query returns 0 when complete, DDO_E_BUSY when not yet. */
    int (*event_create)(void *st, void **event, ddo__errbuf *eb);
    int (*event_destroy)(void *st, void *event, ddo__errbuf *eb);
    int (*event_record)(void *st, void *event, void *stream, ddo__errbuf *eb);
    int (*event_query)(void *st, void *event, ddo__errbuf *eb);
    int (*event_synchronize)(void *st, void *event, ddo__errbuf *eb);
    int (*stream_wait_event)(void *st, void *stream, void *event, ddo__errbuf *eb);
    /* Runs fn(user) on a host thread once all earlier work on stream is done. */
    int (*host_fn)(void *st, void *stream, ddo__host_fn fn, void *user, ddo__errbuf *eb);
    /* Queues ONE decode of a batch of n (1..DDO_CODEC_BATCH_MAX) coded streams on stream,
     * each d[i] with the geometry of a validated plan: tensor i's stream at d[i].src
     * (d[i].src_bytes of device memory) into d[i].dst (d[i].dst_bytes); the decoder writes
     * tensor i's status words at d[i].l.status_dev (d[i].l.status_bytes of device memory),
     * which the caller reads after the stream and checks with ddo__codec_status_check. Writes
     * only each d[i].dst[0, decoded) and the status areas. cuda: one kernel launch; cpu: the
     * C decoder on each in order. DDO_E_UNSUPPORTED where the device has no decoder (cuda
     * built without nvcc). */
    int (*codec_decode)(void *st, void *stream, const ddo__codec_desc *d, size_t n,
                        ddo__errbuf *eb);
    /* An event that also takes the time when it completes (event_create's do not: they cost
     * less to record and wait on), for event_elapsed. */
    int (*event_create_timed)(void *st, void **event, ddo__errbuf *eb);
    /* *seconds between two timed events' completions (start before end); DDO_E_BUSY while
     * either is not complete. */
    int (*event_elapsed)(void *st, void *start, void *end, double *seconds, ddo__errbuf *eb);
    /* Asynchronous device->device copy ordered on stream (a stream of this device, the
     * destination's): size bytes from src in the memory of another device of the same kind
     * (src_st, its state; may be st itself) to dst in this one. cuda: cuMemcpyPeerAsync, after
     * peer access was enabled where the two GPUs allow it; cpu: a memcpy at the destination's
     * peer-link throttle (ddo_cpu_options.peer_bytes_per_s). */
    int (*copy_peer)(void *st, uint64_t dst, void *src_st, uint64_t src, size_t size, void *stream,
                     ddo__errbuf *eb);
} ddo__device_ops;

extern const ddo__device_ops ddo__device_cpu_ops;
/* NULL when built without CUDA headers. */
extern const ddo__device_ops *const ddo__device_cuda_ops;

/* Per-operation counters kept by the wrappers. */
typedef struct ddo__devop_stats {
    uint64_t calls;
    uint64_t failures;
    uint64_t bytes; /* copies, allocations, registrations */
    uint64_t ns;    /* time spent inside the call (not async completion) */
} ddo__devop_stats;

/* measure.c: the pinned host->device rate of 32 MiB copied in 16 MiB pieces (a warm-up pass,
 * then the median of three): the bus figure the host layer gives the plan (setup.c). */
int ddo__measure_bus_quick(ddo_device *dev, double *rate);

/* ---- wrappers (device_calls.c): what every other module calls ---- */

const ddo__device_ops *ddo__device_ops_of(const ddo_device *dev);
bool ddo__device_is_cpu(const ddo_device *dev);

int ddo__dev_mem_info(ddo_device *dev, uint64_t *free_bytes, uint64_t *total_bytes);
int ddo__dev_va_reserve(ddo_device *dev, uint64_t size, uint64_t *va);
int ddo__dev_va_release(ddo_device *dev, uint64_t va, uint64_t size);
int ddo__dev_phys_create(ddo_device *dev, uint64_t size, uint64_t *handle);
int ddo__dev_phys_release(ddo_device *dev, uint64_t handle);
/* Maps handle at va; handle_offset must be 0 (else DDO_E_UNSUPPORTED on both devices). */
int ddo__dev_map(ddo_device *dev, uint64_t va, uint64_t size, uint64_t handle,
                 uint64_t handle_offset);
int ddo__dev_unmap(ddo_device *dev, uint64_t va, uint64_t size);
int ddo__dev_set_access(ddo_device *dev, uint64_t va, uint64_t size);
int ddo__dev_mem_alloc(ddo_device *dev, uint64_t size, uint64_t *ptr);
int ddo__dev_mem_free(ddo_device *dev, uint64_t ptr);
int ddo__dev_host_register(ddo_device *dev, void *p, size_t size);
int ddo__dev_host_unregister(ddo_device *dev, void *p);
int ddo__dev_host_alloc(ddo_device *dev, size_t size, void **p);
int ddo__dev_host_free(ddo_device *dev, void *p);
int ddo__dev_stream_create(ddo_device *dev, int priority, void **stream);
int ddo__dev_stream_destroy(ddo_device *dev, void *stream);
int ddo__dev_stream_synchronize(ddo_device *dev, void *stream);
int ddo__dev_copy_h2d(ddo_device *dev, uint64_t dst, const void *src, size_t size, void *stream);
int ddo__dev_copy_d2h(ddo_device *dev, void *dst, uint64_t src, size_t size);
int ddo__dev_copy_d2h_async(ddo_device *dev, void *dst, uint64_t src, size_t size, void *stream);
int ddo__dev_event_create(ddo_device *dev, void **event);
int ddo__dev_event_destroy(ddo_device *dev, void *event);
int ddo__dev_event_record(ddo_device *dev, void *event, void *stream);
int ddo__dev_event_query(ddo_device *dev, void *event);
int ddo__dev_event_synchronize(ddo_device *dev, void *event);
int ddo__dev_stream_wait_event(ddo_device *dev, void *stream, void *event);
int ddo__dev_host_fn(ddo_device *dev, void *stream, ddo__host_fn fn, void *user);
/* Checks the batch (1..DDO_CODEC_BATCH_MAX descriptors, n == 0 a no-op; each decoded length
 * within its dst and coded length within its src, status area given, one cta_warps for the
 * batch, destinations disjoint from each other and from every source) and queues its one
 * decode. */
int ddo__dev_codec_decode(ddo_device *dev, void *stream, const ddo__codec_desc *d, size_t n);
int ddo__dev_event_create_timed(ddo_device *dev, void **event);
/* DDO_E_BUSY (not a failure) while either event is not complete. */
int ddo__dev_event_elapsed(ddo_device *dev, void *start, void *end, double *seconds);
/* Queues a copy of size bytes from src on src_dev (another device of dev's kind, or dev) to dst
 * on dev, ordered on stream (one of dev's). Counted and faulted as dev's copy_peer. */
int ddo__dev_copy_peer(ddo_device *dev, uint64_t dst, ddo_device *src_dev, uint64_t src,
                       size_t size, void *stream);

/* The device's native stream handle behind a public ddo_stream. */
void *ddo__stream_handle(const ddo_stream *s);
ddo_device *ddo__stream_device(const ddo_stream *s);

/* The wrapper's detail buffer (the last failed call's message). */
ddo__errbuf *ddo__device_errbuf(ddo_device *dev);

/* Counters since creation (or the last reset). */
void ddo__device_stats(const ddo_device *dev, ddo__devop_stats out[DDO__OP_COUNT]);
void ddo__device_stats_reset(ddo_device *dev);

/*
 * Fault injection: the nth call (1-based, counted from now) of op fails with
 * code; persistent keeps failing every call from then on. nth == 0 clears.
 * Thread-safe. For tests; costs one atomic load per call otherwise.
 */
void ddo__device_inject_fault(ddo_device *dev, ddo__devop op, uint64_t nth, bool persistent,
                              int code);
void ddo__device_clear_faults(ddo_device *dev);

/* cpu device only: change the copy throttle at run time (bytes/s, 0 = off; latency ns). */
int ddo__device_cpu_throttle(ddo_device *dev, double bytes_per_s, uint64_t latency_ns);

/*
 * What the device holds right now through the wrappers, with peaks since
 * creation: device bytes (phys_create + mem_alloc - their releases), pinned
 * host bytes (host_alloc - host_free), registered host bytes, reserved
 * virtual bytes and mapped bytes. Every figure returns to zero when everything
 * taken has been given back. Thread-safe.
 */
typedef struct ddo__device_usage_t {
    uint64_t device_bytes, device_peak_bytes;
    uint64_t pinned_bytes, pinned_peak_bytes;
    uint64_t registered_bytes, registered_peak_bytes;
    uint64_t va_bytes, va_peak_bytes;
    uint64_t mapped_bytes, mapped_peak_bytes;
} ddo__device_usage_t;
void ddo__device_usage(const ddo_device *dev, ddo__device_usage_t *out);

/* cpu device hook behind ddo__device_cpu_throttle (device_cpu.c). */
int ddo__cpu_set_throttle(void *st, double bytes_per_s, uint64_t latency_ns, ddo__errbuf *eb);

/*
 * A small table of (key, size, obj) kept sorted by key, shared by the device
 * files: exact lookup, floor lookup (the entry containing an address) and
 * ordered insertion. Not thread-safe by itself.
 */
typedef struct ddo__devtab_entry {
    uint64_t key;
    uint64_t size;
    void *obj;
} ddo__devtab_entry;
typedef struct ddo__devtab {
    ddo__devtab_entry *v;
    size_t len, cap;
} ddo__devtab;
/* Index of the entry with key, or SIZE_MAX. */
size_t ddo__devtab_find(const ddo__devtab *t, uint64_t key);
/* Index of the entry with the greatest key <= key, or SIZE_MAX. */
size_t ddo__devtab_floor(const ddo__devtab *t, uint64_t key);
/* Inserts in order; DDO_E_NO_MEMORY, or DDO_E_INVALID_ARGUMENT if key exists (eb untouched). */
int ddo__devtab_insert(ddo__devtab *t, uint64_t key, uint64_t size, void *obj);
void ddo__devtab_remove_at(ddo__devtab *t, size_t i);
void ddo__devtab_free(ddo__devtab *t);

#endif /* DDO_DEVICE_H */
