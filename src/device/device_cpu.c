/*
 * device_cpu.c - the cpu device: host memory posing as device memory, the
 * reference implementation of the device table that every test runs on.
 *
 * Model:
 *   - A virtual range is reserved address space (PROT_NONE), aligned to the
 *     granularity. A physical handle is a memfd of whole granules, mapped
 *     once into a private "master" view; the fd is closed at once (so handles
 *     cost no file descriptors). map places the handle's pages at a reserved
 *     address (mremap of the shared view with old size 0 creates a second
 *     view of the same pages), so a handle mapped at two addresses shows the
 *     same bytes; unmap puts PROT_NONE back.
 *   - Like CUDA, a handle's memory lives while the handle or any mapping of
 *     it does: releasing a mapped handle frees nothing until the last unmap.
 *     Handles and plain allocations count against the device size.
 *   - Each stream is a FIFO run in order by its own worker thread. Copies can
 *     be throttled to a bandwidth and a per-copy latency, timed from a
 *     per-stream clock so that back-to-back copies take exactly
 *     sum(size / bandwidth + latency). Events complete when the marker queued
 *     by their latest record runs.
 *
 * Thread-safety: every operation may be called from any thread; one mutex per
 * device guards the tables and queues (copies and host functions run outside
 * it).
 */
#define _GNU_SOURCE
#include "device.h"

#include "../codec.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CPU_DEFAULT_SIZE        (64 * DDO_GIB)
#define CPU_DEFAULT_GRANULARITY (2 * DDO_MIB)
#define CPU_ALLOC_ALIGN         256

typedef struct cpu_handle {
    uint64_t id;
    uint64_t size;
    char *base;                  /* the master view of the handle's pages */
    unsigned refs;               /* 1 while the handle is alive, +1 per mapped piece */
    uint64_t last_va, last_size; /* its latest mapping */
} cpu_handle;

typedef struct cpu_range {
    uint64_t va, size;
    ddo__devtab pieces; /* mapped pieces: va -> size, obj = cpu_handle * */
} cpu_range;

typedef enum op_kind { OP_COPY, OP_MARK, OP_WAIT, OP_FN } op_kind;

typedef struct cpu_event {
    uint64_t rec_gen;  /* generation of the latest record */
    uint64_t done_gen; /* highest generation whose marker has run */
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
    ddo__host_fn fn;
    void *user;
} cpu_op;

typedef struct cpu_dev cpu_dev;

typedef struct cpu_stream {
    cpu_dev *d;
    int priority; /* recorded only */
    pthread_t thread;
    pthread_cond_t work;
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
    pthread_mutex_t lock;
    pthread_cond_t progress; /* broadcast whenever any stream completes an op */
    double bytes_per_s;
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

static uint64_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (uint64_t)p : 4096;
}

static uint64_t mem_rounded(uint64_t size)
{
    return ddo__round_up(size, CPU_ALLOC_ALIGN);
}

static uint64_t map_rounded(uint64_t size)
{
    return ddo__round_up(size, page_size());
}

/* ---- open, close, caps ---- */

static int cpu_open(const char *spec, const ddo_device_options *opts, void **st, ddo__errbuf *eb)
{
    (void)spec;
    const ddo_cpu_options *o = opts->cpu; /* never NULL (device.h) */
    uint64_t size = o->memory_bytes ? o->memory_bytes : CPU_DEFAULT_SIZE;
    uint64_t gran = o->granularity ? o->granularity : CPU_DEFAULT_GRANULARITY;
    if (gran % page_size() != 0)
        return ddo__fail(eb, DDO_E_CONFIG,
                         "cpu device: granularity %" PRIu64
                         " bytes is not a multiple of the page size %" PRIu64,
                         gran, page_size());
    if (!(o->bytes_per_s >= 0.0 && o->bytes_per_s < 1e300))
        return ddo__fail(eb, DDO_E_CONFIG,
                         "cpu device: copy bandwidth %g bytes/s is not a finite value >= 0",
                         o->bytes_per_s);
    cpu_dev *d = ddo__calloc(1, sizeof(*d));
    if (d == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu device: out of host memory");
    d->size = size;
    d->gran = gran;
    d->flops_per_s = o->flops_per_s > 0 ? o->flops_per_s : 0;
    d->bytes_per_s = o->bytes_per_s;
    d->latency_ns = o->copy_latency_ns;
    d->next_handle = 1;
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->progress, NULL);
    *st = d;
    return 0;
}

static void handle_unref(cpu_dev *d, cpu_handle *h)
{
    if (--h->refs > 0)
        return;
    munmap(h->base, h->size);
    d->allocated -= h->size;
    free(h);
}

static void event_unref(cpu_event *e)
{
    if (--e->refs == 0)
        free(e);
}

static void cpu_close(void *st)
{
    cpu_dev *d = st;
    if (d == NULL)
        return;
    /* Streams drain before their workers exit. */
    pthread_mutex_lock(&d->lock);
    while (d->streams.len > 0) {
        cpu_stream *s = d->streams.v[d->streams.len - 1].obj;
        ddo__devtab_remove_at(&d->streams, d->streams.len - 1);
        s->stop = true;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&d->lock);
        pthread_join(s->thread, NULL);
        pthread_mutex_lock(&d->lock);
        pthread_cond_destroy(&s->work);
        free(s);
    }
    for (size_t i = 0; i < d->events.len; i++)
        event_unref(d->events.v[i].obj);
    for (size_t i = 0; i < d->ranges.len; i++) {
        cpu_range *r = d->ranges.v[i].obj;
        for (size_t j = 0; j < r->pieces.len; j++)
            handle_unref(d, r->pieces.v[j].obj);
        ddo__devtab_free(&r->pieces);
        munmap((void *)(uintptr_t)r->va, r->size);
        free(r);
    }
    for (size_t i = 0; i < d->handles.len; i++)
        handle_unref(d, d->handles.v[i].obj);
    for (size_t i = 0; i < d->mems.len; i++)
        munmap((void *)(uintptr_t)d->mems.v[i].key, map_rounded(d->mems.v[i].size));
    for (size_t i = 0; i < d->pinned.len; i++)
        free((void *)(uintptr_t)d->pinned.v[i].key);
    pthread_mutex_unlock(&d->lock);
    ddo__devtab_free(&d->streams);
    ddo__devtab_free(&d->events);
    ddo__devtab_free(&d->ranges);
    ddo__devtab_free(&d->handles);
    ddo__devtab_free(&d->mems);
    ddo__devtab_free(&d->regs);
    ddo__devtab_free(&d->pinned);
    pthread_cond_destroy(&d->progress);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static int cpu_caps(void *st, ddo_device_caps *out, ddo__errbuf *eb)
{
    (void)eb;
    cpu_dev *d = st;
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "cpu (host memory posing as device memory)");
    pthread_mutex_lock(&d->lock);
    out->total_bytes = d->size;
    out->free_bytes = d->size - d->allocated;
    out->bus_bytes_per_s = d->bytes_per_s;
    pthread_mutex_unlock(&d->lock);
    out->granularity = (size_t)d->gran;
    out->vmm_supported = true;
    out->is_cpu = true;
    out->flops_per_s = d->flops_per_s;
    return 0;
}

static int cpu_mem_info(void *st, uint64_t *free_bytes, uint64_t *total_bytes, ddo__errbuf *eb)
{
    (void)eb;
    cpu_dev *d = st;
    pthread_mutex_lock(&d->lock);
    *free_bytes = d->size - d->allocated;
    *total_bytes = d->size;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

int ddo__cpu_set_throttle(void *st, double bytes_per_s, uint64_t latency_ns, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    if (!(bytes_per_s >= 0.0 && bytes_per_s < 1e300))
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu device: copy bandwidth %g bytes/s is not a finite value >= 0",
                         bytes_per_s);
    pthread_mutex_lock(&d->lock);
    d->bytes_per_s = bytes_per_s;
    d->latency_ns = latency_ns;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

/* ---- lookups (under the lock) ---- */

/* The reserved range holding [p, p + n), or NULL. */
static cpu_range *range_of(cpu_dev *d, uint64_t p, uint64_t n)
{
    size_t i = ddo__devtab_floor(&d->ranges, p);
    if (i == SIZE_MAX)
        return NULL;
    cpu_range *r = d->ranges.v[i].obj;
    uint64_t off = p - r->va;
    if (off >= r->size || n > r->size - off)
        return NULL;
    return r;
}

/* True when every byte of [p, p + n) inside r is mapped. */
static bool range_mapped(const cpu_range *r, uint64_t p, uint64_t n)
{
    uint64_t cur = p, end = p + n;
    size_t j = ddo__devtab_floor(&r->pieces, cur);
    while (cur < end) {
        if (j == SIZE_MAX || j >= r->pieces.len)
            return false;
        const ddo__devtab_entry *e = &r->pieces.v[j];
        if (cur < e->key || cur - e->key >= e->size)
            return false;
        cur = e->key + e->size;
        j++;
    }
    return true;
}

/* True when [p, p + n) is device memory: inside one mem_alloc buffer or a mapped range. */
static bool device_bytes(cpu_dev *d, uint64_t p, uint64_t n)
{
    if (p + n < p)
        return false;
    size_t i = ddo__devtab_floor(&d->mems, p);
    if (i != SIZE_MAX) {
        uint64_t off = p - d->mems.v[i].key;
        if (off < d->mems.v[i].size && n <= d->mems.v[i].size - off)
            return true;
    }
    const cpu_range *r = range_of(d, p, n);
    return r != NULL && range_mapped(r, p, n);
}

static bool overlaps(uint64_t a, uint64_t an, uint64_t b, uint64_t bn)
{
    return a < b + bn && b < a + an;
}

static bool op_touches(const cpu_op *op, uint64_t lo, uint64_t n, bool as_dst)
{
    if (op == NULL || op->kind != OP_COPY)
        return false;
    uint64_t p = as_dst ? op->dst : (uint64_t)(uintptr_t)op->src;
    return overlaps(p, op->size, lo, n);
}

/*
 * Waits until no queued or running copy writes (as_dst) or reads (!as_dst)
 * [lo, lo + n): freeing memory a copy still uses waits for the copy, as the
 * driver's free does.
 */
static void wait_unused(cpu_dev *d, uint64_t lo, uint64_t n, bool as_dst)
{
    for (;;) {
        bool busy = false;
        for (size_t i = 0; i < d->streams.len && !busy; i++) {
            const cpu_stream *s = d->streams.v[i].obj;
            busy = op_touches(s->current, lo, n, as_dst);
            for (const cpu_op *op = s->head; op != NULL && !busy; op = op->next)
                busy = op_touches(op, lo, n, as_dst);
        }
        if (!busy)
            return;
        pthread_cond_wait(&d->progress, &d->lock);
    }
}

/* ---- virtual ranges, handles, mappings ---- */

static int cpu_va_reserve(void *st, uint64_t size, uint64_t *va, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    if (size == 0 || size % d->gran != 0)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: va_reserve: %" PRIu64 " bytes is not a multiple of the "
                         "granularity %" PRIu64,
                         size, d->gran);
    cpu_range *r = ddo__calloc(1, sizeof(*r));
    if (r == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: va_reserve: out of host memory");
    size_t span = (size_t)(size + d->gran);
    char *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        free(r);
        return ddo__fail(eb, DDO_E_DEVICE_MEMORY,
                         "cpu: va_reserve: reserving %" PRIu64 " bytes of address space: %s", size,
                         strerror(e));
    }
    uintptr_t start = (uintptr_t)ddo__round_up((uintptr_t)p, d->gran);
    size_t head = (size_t)(start - (uintptr_t)p);
    if (head)
        munmap(p, head);
    if (span - head > size)
        munmap((char *)start + size, span - head - (size_t)size);
    r->va = start;
    r->size = size;
    pthread_mutex_lock(&d->lock);
    int rc = ddo__devtab_insert(&d->ranges, r->va, size, r);
    pthread_mutex_unlock(&d->lock);
    if (rc != 0) {
        munmap((void *)start, (size_t)size);
        free(r);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: va_reserve: out of host memory");
    }
    *va = r->va;
    return 0;
}

static int cpu_va_release(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    pthread_mutex_lock(&d->lock);
    size_t i = ddo__devtab_find(&d->ranges, va);
    cpu_range *r = i == SIZE_MAX ? NULL : d->ranges.v[i].obj;
    int rc = 0;
    if (r == NULL || r->size != size)
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: va_release: 0x%" PRIx64 " + %" PRIu64 " is not a reserved range", va,
                       size);
    else if (r->pieces.len > 0)
        rc = ddo__fail(eb, DDO_E_STATE,
                       "cpu: va_release: range 0x%" PRIx64 " still has %zu mapped piece(s)", va,
                       r->pieces.len);
    else
        ddo__devtab_remove_at(&d->ranges, i);
    pthread_mutex_unlock(&d->lock);
    if (rc != 0)
        return rc;
    munmap((void *)(uintptr_t)va, (size_t)size);
    ddo__devtab_free(&r->pieces);
    free(r);
    return 0;
}

static int cpu_phys_create(void *st, uint64_t size, uint64_t *handle, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    if (size == 0 || size % d->gran != 0)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: phys_create: %" PRIu64 " bytes is not a multiple of the "
                         "granularity %" PRIu64,
                         size, d->gran);
    cpu_handle *h = ddo__calloc(1, sizeof(*h));
    if (h == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: phys_create: out of host memory");
    /* Take the bytes from the device's size first: refuse before any system call. */
    pthread_mutex_lock(&d->lock);
    uint64_t free_bytes = d->size - d->allocated;
    if (size > free_bytes) {
        pthread_mutex_unlock(&d->lock);
        free(h);
        return ddo__fail(eb, DDO_E_DEVICE_MEMORY,
                         "cpu: phys_create: out of device memory (like "
                         "CUDA_ERROR_OUT_OF_MEMORY): %" PRIu64 " bytes requested, %" PRIu64
                         " free of %" PRIu64,
                         size, free_bytes, d->size);
    }
    d->allocated += size;
    h->id = d->next_handle++;
    pthread_mutex_unlock(&d->lock);

    int fd = memfd_create("ddo-cpu-handle", MFD_CLOEXEC);
    int e = 0;
    if (fd < 0) {
        e = errno;
    } else if (ftruncate(fd, (off_t)size) != 0) {
        e = errno;
    } else {
        void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            e = errno;
        else
            h->base = p;
    }
    if (fd >= 0)
        close(fd);
    pthread_mutex_lock(&d->lock);
    int rc = 0;
    if (e != 0)
        rc = ddo__fail(eb, DDO_E_DEVICE_MEMORY, "cpu: phys_create: %" PRIu64 " bytes: %s", size,
                       strerror(e));
    else if (ddo__devtab_insert(&d->handles, h->id, size, h) != 0)
        rc = ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: phys_create: out of host memory");
    if (rc != 0) {
        d->allocated -= size;
        pthread_mutex_unlock(&d->lock);
        if (h->base != NULL)
            munmap(h->base, (size_t)size);
        free(h);
        return rc;
    }
    h->size = size;
    h->refs = 1;
    *handle = h->id;
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static int cpu_phys_release(void *st, uint64_t handle, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    pthread_mutex_lock(&d->lock);
    size_t i = ddo__devtab_find(&d->handles, handle);
    if (i == SIZE_MAX) {
        pthread_mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: phys_release: %" PRIu64 " is not a live physical handle", handle);
    }
    cpu_handle *h = d->handles.v[i].obj;
    ddo__devtab_remove_at(&d->handles, i);
    handle_unref(d, h); /* mappings keep the memory until their unmap */
    pthread_mutex_unlock(&d->lock);
    return 0;
}

/*
 * A handle mapped at several ranges (a session keeps a slot's handle mapped into the ranges of
 * the units it held before) shares its pages, but the kernel counts them in RSS once per range
 * whose page tables touched them. Before a range of h is written, the page table entries of the
 * range used before are dropped: RSS stays a measure of memory (the shared pages remain; a
 * later access there faults them back in, with their bytes). d->lock held.
 */
static void use_mapping(cpu_handle *h, uint64_t va, uint64_t size)
{
    if (h->last_va != 0 && h->last_va != va && h->refs > 2)
        (void)madvise((void *)(uintptr_t)h->last_va, (size_t)h->last_size, MADV_DONTNEED);
    h->last_va = va;
    h->last_size = size;
}

/* Marks the range a copy to dst writes as its handle's range in use (see use_mapping). */
static void use_mapping_at(cpu_dev *d, uint64_t dst, size_t size)
{
    cpu_range *r = range_of(d, dst, size);
    size_t j = r != NULL ? ddo__devtab_floor(&r->pieces, dst) : SIZE_MAX;
    if (j != SIZE_MAX)
        use_mapping(r->pieces.v[j].obj, r->pieces.v[j].key, r->pieces.v[j].size);
}

static int cpu_map(void *st, uint64_t va, uint64_t size, uint64_t handle, uint64_t handle_offset,
                   ddo__errbuf *eb)
{
    cpu_dev *d = st;
    if (size == 0 || va % d->gran || size % d->gran || handle_offset % d->gran)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: map: 0x%" PRIx64 " + %" PRIu64 " at handle offset %" PRIu64
                         " is not aligned to the granularity %" PRIu64,
                         va, size, handle_offset, d->gran);
    /* As the driver: cuMemMap's offset "currently must be zero" (CUDA_ERROR_NOT_SUPPORTED). */
    if (handle_offset != 0)
        return ddo__fail(eb, DDO_E_UNSUPPORTED,
                         "cpu: map: handle offset %llu: not supported (as cuMemMap: "
                         "CUDA_ERROR_NOT_SUPPORTED; the offset must be zero)",
                         (unsigned long long)handle_offset);
    pthread_mutex_lock(&d->lock);
    int rc = 0;
    size_t i = ddo__devtab_find(&d->handles, handle);
    cpu_handle *h = i == SIZE_MAX ? NULL : d->handles.v[i].obj;
    cpu_range *r = range_of(d, va, size);
    size_t j = r ? ddo__devtab_floor(&r->pieces, va + size - 1) : SIZE_MAX;
    if (h == NULL) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: map: %" PRIu64 " is not a live physical handle", handle);
    } else if (handle_offset > h->size || size > h->size - handle_offset) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: map: %" PRIu64 " bytes at offset %" PRIu64
                       " exceed the handle's %" PRIu64 " bytes",
                       size, handle_offset, h->size);
    } else if (r == NULL) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: map: 0x%" PRIx64 " + %" PRIu64 " is not inside a reserved range", va,
                       size);
    } else if (j != SIZE_MAX && r->pieces.v[j].key + r->pieces.v[j].size > va) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: map: 0x%" PRIx64 " + %" PRIu64 " overlaps a mapping at 0x%" PRIx64, va,
                       size, r->pieces.v[j].key);
    } else if (ddo__devtab_insert(&r->pieces, va, size, h) != 0) {
        rc = ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: map: out of host memory");
    } else {
        void *p = mremap(h->base + handle_offset, 0, (size_t)size, MREMAP_MAYMOVE | MREMAP_FIXED,
                         (void *)(uintptr_t)va);
        if (p == MAP_FAILED) {
            int e = errno;
            ddo__devtab_remove_at(&r->pieces, ddo__devtab_find(&r->pieces, va));
            rc = ddo__fail(eb, DDO_E_DEVICE, "cpu: map: 0x%" PRIx64 " + %" PRIu64 ": %s", va, size,
                           strerror(e));
        } else {
            h->refs++;
            use_mapping(h, va, size);
        }
    }
    pthread_mutex_unlock(&d->lock);
    return rc;
}

static int cpu_unmap(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    pthread_mutex_lock(&d->lock);
    wait_unused(d, va, size, true);
    int rc = 0;
    cpu_range *r = range_of(d, va, size);
    size_t first = r ? ddo__devtab_find(&r->pieces, va) : SIZE_MAX;
    size_t last = first;
    if (first != SIZE_MAX) {
        /* The pieces must tile [va, va + size) exactly. */
        uint64_t cur = va;
        while (cur < va + size && last < r->pieces.len && r->pieces.v[last].key == cur &&
               r->pieces.v[last].size <= va + size - cur)
            cur += r->pieces.v[last++].size;
        if (cur != va + size)
            first = SIZE_MAX;
    }
    if (first == SIZE_MAX) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: unmap: 0x%" PRIx64 " + %" PRIu64 " is not exactly a set of mappings",
                       va, size);
    } else if (mmap((void *)(uintptr_t)va, (size_t)size, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
        rc = ddo__fail(eb, DDO_E_DEVICE, "cpu: unmap: 0x%" PRIx64 " + %" PRIu64 ": %s", va, size,
                       strerror(errno));
    } else {
        for (size_t k = first; k < last; k++)
            handle_unref(d, r->pieces.v[k].obj);
        for (size_t k = first; k < last; k++)
            ddo__devtab_remove_at(&r->pieces, first);
    }
    pthread_mutex_unlock(&d->lock);
    return rc;
}

static int cpu_set_access(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    pthread_mutex_lock(&d->lock);
    const cpu_range *r = range_of(d, va, size);
    bool ok = r != NULL && range_mapped(r, va, size);
    pthread_mutex_unlock(&d->lock);
    if (!ok)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: set_access: 0x%" PRIx64 " + %" PRIu64 " is not mapped", va, size);
    return 0;
}

/* ---- plain device buffers ---- */

static int cpu_mem_alloc(void *st, uint64_t size, uint64_t *ptr, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    uint64_t need = mem_rounded(size);
    pthread_mutex_lock(&d->lock);
    uint64_t free_bytes = d->size - d->allocated;
    if (need > free_bytes) {
        pthread_mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_DEVICE_MEMORY,
                         "cpu: mem_alloc: out of device memory (like "
                         "CUDA_ERROR_OUT_OF_MEMORY): %" PRIu64 " bytes requested, %" PRIu64
                         " free of %" PRIu64,
                         size, free_bytes, d->size);
    }
    d->allocated += need;
    pthread_mutex_unlock(&d->lock);
    void *p = mmap(NULL, (size_t)map_rounded(size), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    int e = p == MAP_FAILED ? errno : 0;
    pthread_mutex_lock(&d->lock);
    int rc = 0;
    if (e != 0)
        rc = ddo__fail(eb, DDO_E_DEVICE_MEMORY, "cpu: mem_alloc: %" PRIu64 " bytes: %s", size,
                       strerror(e));
    else if (ddo__devtab_insert(&d->mems, (uintptr_t)p, size, NULL) != 0)
        rc = ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: mem_alloc: out of host memory");
    if (rc != 0)
        d->allocated -= need;
    pthread_mutex_unlock(&d->lock);
    if (rc != 0) {
        if (e == 0)
            munmap(p, (size_t)map_rounded(size));
        return rc;
    }
    *ptr = (uintptr_t)p;
    return 0;
}

static int cpu_mem_free(void *st, uint64_t ptr, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    pthread_mutex_lock(&d->lock);
    size_t i = ddo__devtab_find(&d->mems, ptr);
    if (i != SIZE_MAX) {
        wait_unused(d, ptr, d->mems.v[i].size, true);
        i = ddo__devtab_find(&d->mems, ptr);
    }
    if (i == SIZE_MAX) {
        pthread_mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: mem_free: 0x%" PRIx64 " is not a mem_alloc buffer", ptr);
    }
    uint64_t size = d->mems.v[i].size;
    ddo__devtab_remove_at(&d->mems, i);
    d->allocated -= mem_rounded(size);
    pthread_mutex_unlock(&d->lock);
    munmap((void *)(uintptr_t)ptr, (size_t)map_rounded(size));
    return 0;
}

/* ---- host memory ---- */

static int cpu_host_register(void *st, void *p, size_t size, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    uint64_t a = (uintptr_t)p;
    pthread_mutex_lock(&d->lock);
    int rc = 0;
    size_t i = ddo__devtab_floor(&d->regs, a + size - 1);
    if (i != SIZE_MAX && overlaps(a, size, d->regs.v[i].key, d->regs.v[i].size))
        rc = ddo__fail(eb, DDO_E_DEVICE,
                       "cpu: host_register: %p + %zu overlaps the registered range 0x%" PRIx64
                       " + %" PRIu64 " (like CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)",
                       p, size, d->regs.v[i].key, d->regs.v[i].size);
    else if (ddo__devtab_insert(&d->regs, a, size, NULL) != 0)
        rc = ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: host_register: out of host memory");
    pthread_mutex_unlock(&d->lock);
    return rc;
}

static int cpu_host_unregister(void *st, void *p, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    pthread_mutex_lock(&d->lock);
    size_t i = ddo__devtab_find(&d->regs, (uintptr_t)p);
    if (i != SIZE_MAX) {
        wait_unused(d, (uintptr_t)p, d->regs.v[i].size, false);
        i = ddo__devtab_find(&d->regs, (uintptr_t)p);
    }
    if (i == SIZE_MAX) {
        pthread_mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_DEVICE,
                         "cpu: host_unregister: %p is not the start of a registered range "
                         "(like CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)",
                         p);
    }
    ddo__devtab_remove_at(&d->regs, i);
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static int cpu_host_alloc(void *st, size_t size, void **p, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    void *q = NULL;
    int e = posix_memalign(&q, (size_t)page_size(), size);
    if (e != 0)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: host_alloc: %zu pinned bytes: %s", size,
                         strerror(e));
    pthread_mutex_lock(&d->lock);
    int rc = ddo__devtab_insert(&d->pinned, (uintptr_t)q, size, NULL);
    pthread_mutex_unlock(&d->lock);
    if (rc != 0) {
        free(q);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: host_alloc: out of host memory");
    }
    *p = q;
    return 0;
}

static int cpu_host_free(void *st, void *p, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    pthread_mutex_lock(&d->lock);
    size_t i = ddo__devtab_find(&d->pinned, (uintptr_t)p);
    if (i != SIZE_MAX) {
        wait_unused(d, (uintptr_t)p, d->pinned.v[i].size, false);
        i = ddo__devtab_find(&d->pinned, (uintptr_t)p);
    }
    if (i == SIZE_MAX) {
        pthread_mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: host_free: %p was not allocated by host_alloc", p);
    }
    ddo__devtab_remove_at(&d->pinned, i);
    pthread_mutex_unlock(&d->lock);
    free(p);
    return 0;
}

/* ---- streams ---- */

static void sleep_until(uint64_t t_ns)
{
    struct timespec ts = { (time_t)(t_ns / 1000000000u), (long)(t_ns % 1000000000u) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static uint64_t later(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/*
 * Runs one copy. A throttled copy starts when the copy engine is free (the
 * end of the stream's previous throttled copy) or when it was queued,
 * whichever is later, and ends size / bandwidth + latency after that: the
 * worker's own wake-up delays never add up over back-to-back copies.
 */
static void run_copy(cpu_stream *s, const cpu_op *op, double bytes_per_s, uint64_t latency_ns)
{
    memcpy((void *)(uintptr_t)op->dst, op->src, op->size);
    if (!(bytes_per_s > 0.0 || latency_ns > 0))
        return;
    uint64_t start = later(s->clock_ns, op->queued_ns);
    uint64_t dur = latency_ns;
    if (bytes_per_s > 0.0) {
        /* Saturated before the cast: a tiny rate (1e-300 bytes/s) would overflow uint64_t. */
        double t = (double)op->size * 1e9 / bytes_per_s;
        uint64_t ns = t < 9.0e18 ? (uint64_t)t : UINT64_C(9000000000000000000);
        dur = ddo__sat_add_u64(dur, ns);
    }
    s->clock_ns = ddo__sat_add_u64(start, dur);
    sleep_until(s->clock_ns);
}

/* Runs one op of s (lock held; dropped around copies and host functions). */
static void run_op(cpu_dev *d, cpu_stream *s, cpu_op *op)
{
    s->current = op;
    switch (op->kind) {
    case OP_COPY: {
        double bps = d->bytes_per_s;
        uint64_t lat = d->latency_ns;
        pthread_mutex_unlock(&d->lock);
        run_copy(s, op, bps, lat);
        pthread_mutex_lock(&d->lock);
        break;
    }
    case OP_MARK:
        if (op->ev->done_gen < op->gen)
            op->ev->done_gen = op->gen;
        event_unref(op->ev);
        break;
    case OP_WAIT:
        if (op->ev->done_gen < op->gen) {
            while (op->ev->done_gen < op->gen)
                pthread_cond_wait(&d->progress, &d->lock);
            /* Copies queued behind the wait start after it, not when they were queued. */
            s->clock_ns = later(s->clock_ns, ddo__now_ns());
        }
        event_unref(op->ev);
        break;
    case OP_FN:
        pthread_mutex_unlock(&d->lock);
        op->fn(op->user);
        pthread_mutex_lock(&d->lock);
        s->clock_ns = later(s->clock_ns, ddo__now_ns());
        break;
    }
    s->current = NULL;
    s->completed++;
    free(op);
    pthread_cond_broadcast(&d->progress);
}

static void *worker(void *arg)
{
    cpu_stream *s = arg;
    cpu_dev *d = s->d;
    pthread_mutex_lock(&d->lock);
    for (;;) {
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&s->work, &d->lock);
        if (s->head == NULL)
            break;
        cpu_op *op = s->head;
        s->head = op->next;
        if (s->head == NULL)
            s->tail = NULL;
        run_op(d, s, op);
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

static bool stream_known(cpu_dev *d, void *stream)
{
    return ddo__devtab_find(&d->streams, (uintptr_t)stream) != SIZE_MAX;
}

static bool event_known(cpu_dev *d, void *event)
{
    return ddo__devtab_find(&d->events, (uintptr_t)event) != SIZE_MAX;
}

/* Queues op on s (under the lock). On the calling thread's stream (ddo_stream_wrap) the op
 * runs at once, on the caller's thread: a wait blocks it, a record marks its event done. */
static void enqueue(cpu_stream *s, cpu_op *op)
{
    s->enqueued++;
    if (s->host_thread) {
        run_op(s->d, s, op);
        return;
    }
    op->next = NULL;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_signal(&s->work);
}

/* Waits until everything queued on s before this call has run (under the lock). */
static void drain(cpu_dev *d, cpu_stream *s)
{
    uint64_t target = s->enqueued;
    while (s->completed < target)
        pthread_cond_wait(&d->progress, &d->lock);
}

static int cpu_stream_create(void *st, int priority, void **stream, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_stream *s = ddo__calloc(1, sizeof(*s));
    if (s == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: stream_create: out of host memory");
    s->d = d;
    s->priority = priority;
    pthread_cond_init(&s->work, NULL);
    pthread_mutex_lock(&d->lock);
    int rc = ddo__devtab_insert(&d->streams, (uintptr_t)s, 0, s);
    if (rc != 0) {
        rc = ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: stream_create: out of host memory");
    } else {
        int e = pthread_create(&s->thread, NULL, worker, s);
        if (e != 0) {
            ddo__devtab_remove_at(&d->streams, ddo__devtab_find(&d->streams, (uintptr_t)s));
            rc = ddo__fail(eb, DDO_E_DEVICE, "cpu: stream_create: starting the worker: %s",
                           strerror(e));
        }
    }
    pthread_mutex_unlock(&d->lock);
    if (rc != 0) {
        pthread_cond_destroy(&s->work);
        free(s);
        return rc;
    }
    *stream = s;
    return 0;
}

/* The calling thread as a stream: ops queued on it run at once on the caller's thread. */
static int cpu_stream_wrap(void *st, void *native, void **stream, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    if (native != NULL)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: stream_wrap: the cpu device has no native streams (pass NULL for "
                         "the calling thread)");
    cpu_stream *s = ddo__calloc(1, sizeof(*s));
    if (s == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: stream_wrap: out of host memory");
    s->d = d;
    s->host_thread = true;
    pthread_cond_init(&s->work, NULL);
    pthread_mutex_lock(&d->lock);
    int rc = ddo__devtab_insert(&d->streams, (uintptr_t)s, 0, s);
    pthread_mutex_unlock(&d->lock);
    if (rc != 0) {
        pthread_cond_destroy(&s->work);
        free(s);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: stream_wrap: out of host memory");
    }
    *stream = s;
    return 0;
}

/* A wrapped stream is the device's own object on cpu: destroyed as any stream. */
static int cpu_stream_destroy(void *st, void *stream, ddo__errbuf *eb);
static int cpu_stream_unwrap(void *st, void *stream, ddo__errbuf *eb)
{
    return cpu_stream_destroy(st, stream, eb);
}

static int cpu_stream_destroy(void *st, void *stream, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_stream *s = stream;
    pthread_mutex_lock(&d->lock);
    if (!stream_known(d, stream)) {
        pthread_mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: stream_destroy: unknown stream %p",
                         stream);
    }
    drain(d, s);
    size_t i = ddo__devtab_find(&d->streams, (uintptr_t)s);
    if (i != SIZE_MAX)
        ddo__devtab_remove_at(&d->streams, i);
    s->stop = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&d->lock);
    if (!s->host_thread)
        pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->work);
    free(s);
    return 0;
}

static int cpu_stream_synchronize(void *st, void *stream, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    pthread_mutex_lock(&d->lock);
    if (!stream_known(d, stream)) {
        pthread_mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: stream_synchronize: unknown stream %p",
                         stream);
    }
    drain(d, stream);
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static cpu_op *new_op(op_kind kind)
{
    cpu_op *op = ddo__calloc(1, sizeof(*op));
    if (op != NULL)
        op->kind = kind;
    return op;
}

/* True when [a, a + size) starts inside a registered range and runs past its end (lock held). */
static bool spans_registration(cpu_dev *d, uint64_t a, size_t size)
{
    size_t i = ddo__devtab_floor(&d->regs, a);
    if (i == SIZE_MAX)
        return false;
    uint64_t b = d->regs.v[i].key, n = d->regs.v[i].size;
    return a < b + n && a + size > b + n;
}

static int cpu_copy_h2d(void *st, uint64_t dst, const void *src, size_t size, void *stream,
                        ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_op *op = new_op(OP_COPY);
    if (op == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: copy_h2d: out of host memory");
    op->dst = dst;
    op->src = src;
    op->size = size;
    op->queued_ns = ddo__now_ns();
    pthread_mutex_lock(&d->lock);
    int rc = 0;
    if (!stream_known(d, stream))
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: copy_h2d: unknown stream %p", stream);
    else if (!device_bytes(d, dst, size))
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: copy_h2d: destination 0x%" PRIx64 " + %zu is not mapped device "
                       "memory",
                       dst, size);
    else if (spans_registration(d, (uintptr_t)src, size))
        /* The CUDA driver rejects (CUDA_ERROR_INVALID_VALUE) a copy that starts in registered
         * memory and runs past the end of that registration; so does the reference device. */
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: copy_h2d: source %p + %zu runs past the end of its host "
                       "registration (as cuMemcpyHtoDAsync: CUDA_ERROR_INVALID_VALUE)",
                       src, size);
    else
        enqueue(stream, op);
    if (rc == 0)
        use_mapping_at(d, dst, size);
    pthread_mutex_unlock(&d->lock);
    if (rc != 0)
        free(op);
    return rc;
}

static int cpu_copy_d2h(void *st, void *dst, uint64_t src, size_t size, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    pthread_mutex_lock(&d->lock);
    bool ok = device_bytes(d, src, size);
    pthread_mutex_unlock(&d->lock);
    if (!ok)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: copy_d2h: source 0x%" PRIx64 " + %zu is not mapped device memory",
                         src, size);
    memcpy(dst, (const void *)(uintptr_t)src, size);
    return 0;
}

/* ---- events ---- */

static int cpu_event_create(void *st, void **event, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_event *e = ddo__calloc(1, sizeof(*e));
    if (e == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: event_create: out of host memory");
    e->refs = 1;
    pthread_mutex_lock(&d->lock);
    int rc = ddo__devtab_insert(&d->events, (uintptr_t)e, 0, e);
    pthread_mutex_unlock(&d->lock);
    if (rc != 0) {
        free(e);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: event_create: out of host memory");
    }
    *event = e;
    return 0;
}

static int cpu_event_destroy(void *st, void *event, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    pthread_mutex_lock(&d->lock);
    size_t i = ddo__devtab_find(&d->events, (uintptr_t)event);
    if (i == SIZE_MAX) {
        pthread_mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: event_destroy: unknown event %p", event);
    }
    ddo__devtab_remove_at(&d->events, i);
    event_unref(event); /* queued markers and waits keep it until they run */
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static int cpu_event_record(void *st, void *event, void *stream, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_op *op = new_op(OP_MARK);
    if (op == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: event_record: out of host memory");
    pthread_mutex_lock(&d->lock);
    int rc = 0;
    if (!event_known(d, event)) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: event_record: unknown event %p", event);
    } else if (!stream_known(d, stream)) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: event_record: unknown stream %p", stream);
    } else {
        cpu_event *e = event;
        op->ev = e;
        op->gen = ++e->rec_gen;
        e->refs++;
        enqueue(stream, op);
    }
    pthread_mutex_unlock(&d->lock);
    if (rc != 0)
        free(op);
    return rc;
}

static int cpu_event_query(void *st, void *event, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    pthread_mutex_lock(&d->lock);
    int rc = 0;
    if (!event_known(d, event)) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: event_query: unknown event %p", event);
    } else {
        const cpu_event *e = event;
        rc = e->done_gen >= e->rec_gen ? 0 : DDO_E_BUSY;
    }
    pthread_mutex_unlock(&d->lock);
    return rc;
}

static int cpu_event_synchronize(void *st, void *event, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    pthread_mutex_lock(&d->lock);
    if (!event_known(d, event)) {
        pthread_mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: event_synchronize: unknown event %p",
                         event);
    }
    cpu_event *e = event;
    uint64_t target = e->rec_gen;
    e->refs++; /* a concurrent destroy must not free it under us */
    while (e->done_gen < target)
        pthread_cond_wait(&d->progress, &d->lock);
    event_unref(e);
    pthread_mutex_unlock(&d->lock);
    return 0;
}

static int cpu_stream_wait_event(void *st, void *stream, void *event, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_op *op = new_op(OP_WAIT);
    if (op == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: stream_wait_event: out of host memory");
    pthread_mutex_lock(&d->lock);
    int rc = 0;
    bool queued = false;
    if (!event_known(d, event)) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: stream_wait_event: unknown event %p",
                       event);
    } else if (!stream_known(d, stream)) {
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: stream_wait_event: unknown stream %p",
                       stream);
    } else {
        cpu_event *e = event;
        /* Waits for the latest record at the time of the call; nothing if already done. */
        if (e->done_gen < e->rec_gen) {
            op->ev = e;
            op->gen = e->rec_gen;
            e->refs++;
            enqueue(stream, op);
            queued = true;
        }
    }
    pthread_mutex_unlock(&d->lock);
    if (!queued)
        free(op);
    return rc;
}

static int cpu_host_fn(void *st, void *stream, ddo__host_fn fn, void *user, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_op *op = new_op(OP_FN);
    if (op == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: host_fn: out of host memory");
    op->fn = fn;
    op->user = user;
    pthread_mutex_lock(&d->lock);
    int rc = 0;
    if (!stream_known(d, stream))
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: host_fn: unknown stream %p", stream);
    else
        enqueue(stream, op);
    pthread_mutex_unlock(&d->lock);
    if (rc != 0)
        free(op);
    return rc;
}

/* A queued decode: the C reference decoder run in order on the stream's worker. */
typedef struct cpu_codec_job {
    uint64_t src, src_bytes, dst, dst_bytes;
    ddo__codec_launch l;
} cpu_codec_job;

static void run_codec_job(void *user)
{
    cpu_codec_job *j = user;
    ddo__codec_decode_status((const void *)(uintptr_t)j->src, j->src_bytes,
                             (void *)(uintptr_t)j->dst, j->dst_bytes, &j->l,
                             (uint64_t *)(uintptr_t)j->l.status_dev);
    free(j);
}

static int cpu_codec_decode(void *st, void *stream, uint64_t src, uint64_t src_bytes, uint64_t dst,
                            uint64_t dst_bytes, const ddo__codec_launch *desc, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    cpu_codec_job *j = ddo__calloc(1, sizeof(*j));
    cpu_op *op = new_op(OP_FN);
    if (j == NULL || op == NULL) {
        free(j);
        free(op);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: codec_decode: out of host memory");
    }
    *j = (cpu_codec_job){ src, src_bytes, dst, dst_bytes, *desc };
    op->fn = run_codec_job;
    op->user = j;
    pthread_mutex_lock(&d->lock);
    int rc = 0;
    if (!stream_known(d, stream))
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "cpu: codec_decode: unknown stream %p", stream);
    else if (!device_bytes(d, src, src_bytes) || !device_bytes(d, dst, dst_bytes) ||
             !device_bytes(d, desc->status_dev, desc->status_bytes))
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "cpu: codec_decode: source, destination or status area is not device "
                       "memory");
    else
        enqueue(stream, op);
    pthread_mutex_unlock(&d->lock);
    if (rc != 0) {
        free(j);
        free(op);
    }
    return rc;
}

const ddo__device_ops ddo__device_cpu_ops = {
    .name = "cpu",
    .open = cpu_open,
    .close = cpu_close,
    .caps = cpu_caps,
    .mem_info = cpu_mem_info,
    .va_reserve = cpu_va_reserve,
    .va_release = cpu_va_release,
    .phys_create = cpu_phys_create,
    .phys_release = cpu_phys_release,
    .map = cpu_map,
    .unmap = cpu_unmap,
    .set_access = cpu_set_access,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .host_register = cpu_host_register,
    .host_unregister = cpu_host_unregister,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_synchronize = cpu_stream_synchronize,
    .copy_h2d = cpu_copy_h2d,
    .copy_d2h = cpu_copy_d2h,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_query = cpu_event_query,
    .event_synchronize = cpu_event_synchronize,
    .stream_wait_event = cpu_stream_wait_event,
    .stream_wrap = cpu_stream_wrap,
    .stream_unwrap = cpu_stream_unwrap,
    .host_fn = cpu_host_fn,
    .codec_decode = cpu_codec_decode,
};
