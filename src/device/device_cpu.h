/*
 * device_cpu.h - what the files of the cpu device share: its objects (handles,
 * reserved ranges, queued operations, events, streams, the device) and the
 * functions one file calls in another. Private to device_cpu.c (open, close,
 * caps, the operation table), device_cpu_vmm.c (virtual ranges, handles,
 * mappings, plain buffers, host memory) and device_cpu_stream.c (streams and
 * their workers, copies, events, host functions, decode). The model and the
 * thread-safety rule: device_cpu.c.
 */
#ifndef DDO_DEVICE_CPU_H
#define DDO_DEVICE_CPU_H

#include "device/device.h"
#include "os/sys.h"

#include "os/thread.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CPU_DEFAULT_SIZE        (64 * DDO_GIB)
#define CPU_DEFAULT_GRANULARITY (2 * DDO_MIB)
#define CPU_ALLOC_ALIGN         256

typedef struct cpu_handle {
    uint64_t id;
    uint64_t size;
    ddo__os_shm mem;             /* the handle's pages and their master view (mem.base) */
    unsigned refs;               /* 1 while the handle is alive, +1 per mapped piece */
    uint64_t last_va, last_size; /* its latest mapping */
} cpu_handle;

typedef struct cpu_range {
    uint64_t va, size;
    ddo__devtab pieces; /* mapped pieces: va -> size, obj = cpu_handle * */
} cpu_range;

typedef enum op_kind { OP_COPY, OP_READ, OP_MARK, OP_WAIT, OP_FN } op_kind;

typedef struct cpu_event {
    uint64_t rec_gen;  /* generation of the latest record */
    uint64_t done_gen; /* highest generation whose marker has run */
    uint64_t done_ns;  /* when that marker ran (event_elapsed) */
    unsigned refs;     /* 1 while alive, +1 per queued marker or wait */
} cpu_event;

typedef struct cpu_op {
    struct cpu_op *next;
    op_kind kind;
    uint64_t dst;
    const void *src;
    size_t size;
    uint64_t queued_ns; /* copies: when copy_h2d queued it */
    cpu_event *ev;
    uint64_t gen;
    bool peer; /* a device->device copy: the peer-link throttle */
    ddo__host_fn fn;
    void *user;
} cpu_op;

typedef struct cpu_dev cpu_dev;

typedef struct cpu_stream {
    cpu_dev *d;
    int priority; /* recorded only */
    ddo__thread thread;
    ddo__cond work;
    cpu_op *head, *tail, *current;
    uint64_t enqueued, completed;
    bool stop;
    bool host_thread;  /* the calling thread (ddo_stream_wrap): no worker, ops run inline */
    uint64_t clock_ns; /* worker only: when the stream's last copy, wait or host function ended */
} cpu_stream;

struct cpu_dev {
    uint64_t size;
    uint64_t gran;
    double flops_per_s;
    ddo__mutex lock;
    ddo__cond progress; /* broadcast whenever any stream completes an op */
    double bytes_per_s;
    double peer_bytes_per_s; /* copy_peer into this device */
    uint64_t latency_ns;
    uint64_t allocated; /* live handles (until their last unmap) + plain buffers */
    uint64_t next_handle;
    ddo__devtab handles; /* alive handles: id -> cpu_handle * */
    ddo__devtab ranges;  /* va -> cpu_range * */
    ddo__devtab mems;    /* ptr -> requested size */
    ddo__devtab regs;    /* registered host ranges: p -> size */
    ddo__devtab pinned;  /* host_alloc: p -> size */
    ddo__devtab streams; /* cpu_stream * -> */
    ddo__devtab events;  /* alive cpu_event * -> */
};

/* device_cpu.c */
uint64_t ddo__cpu_page_size(void);
uint64_t ddo__cpu_map_rounded(uint64_t size);

/* device_cpu_vmm.c (the lookups and ddo__cpu_handle_unref: d->lock held) */
void ddo__cpu_handle_unref(cpu_dev *d, cpu_handle *h);
bool ddo__cpu_device_bytes(cpu_dev *d, uint64_t p, uint64_t n);
void ddo__cpu_use_mapping_at(cpu_dev *d, uint64_t dst, size_t size);
int ddo__cpu_va_reserve(void *st, uint64_t size, uint64_t *va, ddo__errbuf *eb);
int ddo__cpu_va_release(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb);
int ddo__cpu_phys_create(void *st, uint64_t size, uint64_t *handle, ddo__errbuf *eb);
int ddo__cpu_phys_release(void *st, uint64_t handle, ddo__errbuf *eb);
int ddo__cpu_map(void *st, uint64_t va, uint64_t size, uint64_t handle, uint64_t handle_offset,
                 ddo__errbuf *eb);
int ddo__cpu_unmap(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb);
int ddo__cpu_set_access(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb);
int ddo__cpu_mem_alloc(void *st, uint64_t size, uint64_t *ptr, ddo__errbuf *eb);
int ddo__cpu_mem_free(void *st, uint64_t ptr, ddo__errbuf *eb);
int ddo__cpu_host_register(void *st, void *p, size_t size, ddo__errbuf *eb);
int ddo__cpu_host_unregister(void *st, void *p, ddo__errbuf *eb);
int ddo__cpu_host_alloc(void *st, size_t size, void **p, ddo__errbuf *eb);
int ddo__cpu_host_free(void *st, void *p, ddo__errbuf *eb);

/* device_cpu_stream.c */
void ddo__cpu_event_unref(cpu_event *e);
int ddo__cpu_stream_create(void *st, int priority, void **stream, ddo__errbuf *eb);
int ddo__cpu_stream_wrap(void *st, void *native, void **stream, ddo__errbuf *eb);
int ddo__cpu_stream_unwrap(void *st, void *stream, ddo__errbuf *eb);
int ddo__cpu_stream_destroy(void *st, void *stream, ddo__errbuf *eb);
int ddo__cpu_stream_synchronize(void *st, void *stream, ddo__errbuf *eb);
int ddo__cpu_copy_h2d(void *st, uint64_t dst, const void *src, size_t size, void *stream,
                      ddo__errbuf *eb);
int ddo__cpu_copy_d2h(void *st, void *dst, uint64_t src, size_t size, ddo__errbuf *eb);
int ddo__cpu_event_create(void *st, void **event, ddo__errbuf *eb);
int ddo__cpu_event_destroy(void *st, void *event, ddo__errbuf *eb);
int ddo__cpu_event_record(void *st, void *event, void *stream, ddo__errbuf *eb);
int ddo__cpu_event_query(void *st, void *event, ddo__errbuf *eb);
int ddo__cpu_event_elapsed(void *st, void *start, void *end, double *seconds, ddo__errbuf *eb);
int ddo__cpu_event_synchronize(void *st, void *event, ddo__errbuf *eb);
int ddo__cpu_stream_wait_event(void *st, void *stream, void *event, ddo__errbuf *eb);
int ddo__cpu_host_fn(void *st, void *stream, ddo__host_fn fn, void *user, ddo__errbuf *eb);
int ddo__cpu_copy_peer(void *st, uint64_t dst, void *src_st, uint64_t src, size_t size,
                       void *stream, ddo__errbuf *eb);
int ddo__cpu_copy_d2h_async(void *st, void *dst, uint64_t src, size_t size, void *stream,
                            ddo__errbuf *eb);
int ddo__cpu_codec_decode(void *st, void *stream, const ddo__codec_desc *x, size_t n,
                          ddo__errbuf *eb);

#endif
