/*
 * device_cpu_vmm.c - the cpu device's memory (see the model in device_cpu.c):
 * reserved virtual ranges, physical handles, map and unmap, the mapping a
 * copy writes through, plain device buffers and host memory (registered and
 * pinned), with the lookups that say what is device memory.
 */
#include "device/device_cpu.h"

#include "os/sys.h"

#include "os/thread.h"
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

uint64_t ddo__cpu_page_size(void)
{
    return ddo__os_vm_granularity();
}

uint64_t ddo__cpu_map_rounded(uint64_t size)
{
    return ddo__round_up(size, ddo__cpu_page_size());
}

static uint64_t mem_rounded(uint64_t size)
{
    return ddo__round_up(size, CPU_ALLOC_ALIGN);
}

void ddo__cpu_handle_unref(cpu_dev *d, cpu_handle *h)
{
    if (--h->refs > 0)
        return;
    ddo__os_shm_destroy(&h->mem, h->size);
    d->allocated -= h->size;
    free(h);
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
bool ddo__cpu_device_bytes(cpu_dev *d, uint64_t p, uint64_t n)
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
        ddo__cond_wait(&d->progress, &d->lock);
    }
}

/* ---- virtual ranges, handles, mappings ---- */

int ddo__cpu_va_reserve(void *st, uint64_t size, uint64_t *va, ddo__errbuf *eb)
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
    void *p = NULL;
    int e = ddo__os_vm_reserve(size, d->gran, &p);
    if (e != 0) {
        free(r);
        return ddo__fail(eb, DDO_E_DEVICE_MEMORY,
                         "cpu: va_reserve: reserving %" PRIu64 " bytes of address space: %s", size,
                         strerror(e));
    }
    uintptr_t start = (uintptr_t)p;
    r->va = start;
    r->size = size;
    ddo__mutex_lock(&d->lock);
    int rc = ddo__devtab_insert(&d->ranges, r->va, size, r);
    ddo__mutex_unlock(&d->lock);
    if (rc != 0) {
        ddo__os_vm_release((void *)start, size, d->gran);
        free(r);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: va_reserve: out of host memory");
    }
    *va = r->va;
    return 0;
}

int ddo__cpu_va_release(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
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
    ddo__mutex_unlock(&d->lock);
    if (rc != 0)
        return rc;
    ddo__os_vm_release((void *)(uintptr_t)va, size, d->gran);
    ddo__devtab_free(&r->pieces);
    free(r);
    return 0;
}

int ddo__cpu_phys_create(void *st, uint64_t size, uint64_t *handle, ddo__errbuf *eb)
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
    ddo__mutex_lock(&d->lock);
    uint64_t free_bytes = d->size - d->allocated;
    if (size > free_bytes) {
        ddo__mutex_unlock(&d->lock);
        free(h);
        return ddo__fail(eb, DDO_E_DEVICE_MEMORY,
                         "cpu: phys_create: out of device memory (like "
                         "CUDA_ERROR_OUT_OF_MEMORY): %" PRIu64 " bytes requested, %" PRIu64
                         " free of %" PRIu64,
                         size, free_bytes, d->size);
    }
    d->allocated += size;
    h->id = d->next_handle++;
    ddo__mutex_unlock(&d->lock);

    int e = ddo__os_shm_create(size, &h->mem);
    ddo__mutex_lock(&d->lock);
    int rc = 0;
    if (e != 0)
        rc = ddo__fail(eb, DDO_E_DEVICE_MEMORY, "cpu: phys_create: %" PRIu64 " bytes: %s", size,
                       strerror(e));
    else if (ddo__devtab_insert(&d->handles, h->id, size, h) != 0)
        rc = ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: phys_create: out of host memory");
    if (rc != 0) {
        d->allocated -= size;
        ddo__mutex_unlock(&d->lock);
        ddo__os_shm_destroy(&h->mem, size);
        free(h);
        return rc;
    }
    h->size = size;
    h->refs = 1;
    *handle = h->id;
    ddo__mutex_unlock(&d->lock);
    return 0;
}

int ddo__cpu_phys_release(void *st, uint64_t handle, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
    size_t i = ddo__devtab_find(&d->handles, handle);
    if (i == SIZE_MAX) {
        ddo__mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: phys_release: %" PRIu64 " is not a live physical handle", handle);
    }
    cpu_handle *h = d->handles.v[i].obj;
    ddo__devtab_remove_at(&d->handles, i);
    ddo__cpu_handle_unref(d, h); /* mappings keep the memory until their unmap */
    ddo__mutex_unlock(&d->lock);
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
        ddo__os_discard_pages((void *)(uintptr_t)h->last_va, (size_t)h->last_size);
    h->last_va = va;
    h->last_size = size;
}

/* Marks the range a copy to dst writes as its handle's range in use (see use_mapping). */
void ddo__cpu_use_mapping_at(cpu_dev *d, uint64_t dst, size_t size)
{
    cpu_range *r = range_of(d, dst, size);
    size_t j = r != NULL ? ddo__devtab_floor(&r->pieces, dst) : SIZE_MAX;
    if (j != SIZE_MAX)
        use_mapping(r->pieces.v[j].obj, r->pieces.v[j].key, r->pieces.v[j].size);
}

int ddo__cpu_map(void *st, uint64_t va, uint64_t size, uint64_t handle, uint64_t handle_offset,
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
    ddo__mutex_lock(&d->lock);
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
        int e = ddo__os_shm_map_at(&h->mem, size, (void *)(uintptr_t)va, d->gran);
        if (e != 0) {
            ddo__devtab_remove_at(&r->pieces, ddo__devtab_find(&r->pieces, va));
            rc = ddo__fail(eb, DDO_E_DEVICE, "cpu: map: 0x%" PRIx64 " + %" PRIu64 ": %s", va, size,
                           strerror(e));
        } else {
            h->refs++;
            use_mapping(h, va, size);
        }
    }
    ddo__mutex_unlock(&d->lock);
    return rc;
}

int ddo__cpu_unmap(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
    wait_unused(d, va, size, true);
    int rc = 0, e = 0;
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
    } else if ((e = ddo__os_vm_unmap((void *)(uintptr_t)va, size, d->gran)) != 0) {
        rc = ddo__fail(eb, DDO_E_DEVICE, "cpu: unmap: 0x%" PRIx64 " + %" PRIu64 ": %s", va, size,
                       strerror(e));
    } else {
        for (size_t k = first; k < last; k++)
            ddo__cpu_handle_unref(d, r->pieces.v[k].obj);
        for (size_t k = first; k < last; k++)
            ddo__devtab_remove_at(&r->pieces, first);
    }
    ddo__mutex_unlock(&d->lock);
    return rc;
}

int ddo__cpu_set_access(void *st, uint64_t va, uint64_t size, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
    const cpu_range *r = range_of(d, va, size);
    bool ok = r != NULL && range_mapped(r, va, size);
    ddo__mutex_unlock(&d->lock);
    if (!ok)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: set_access: 0x%" PRIx64 " + %" PRIu64 " is not mapped", va, size);
    return 0;
}

/* ---- plain device buffers ---- */

int ddo__cpu_mem_alloc(void *st, uint64_t size, uint64_t *ptr, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    uint64_t need = mem_rounded(size);
    ddo__mutex_lock(&d->lock);
    uint64_t free_bytes = d->size - d->allocated;
    if (need > free_bytes) {
        ddo__mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_DEVICE_MEMORY,
                         "cpu: mem_alloc: out of device memory (like "
                         "CUDA_ERROR_OUT_OF_MEMORY): %" PRIu64 " bytes requested, %" PRIu64
                         " free of %" PRIu64,
                         size, free_bytes, d->size);
    }
    d->allocated += need;
    ddo__mutex_unlock(&d->lock);
    void *p = NULL;
    int e = ddo__os_vm_alloc(ddo__cpu_map_rounded(size), &p);
    ddo__mutex_lock(&d->lock);
    int rc = 0;
    if (e != 0)
        rc = ddo__fail(eb, DDO_E_DEVICE_MEMORY, "cpu: mem_alloc: %" PRIu64 " bytes: %s", size,
                       strerror(e));
    else if (ddo__devtab_insert(&d->mems, (uintptr_t)p, size, NULL) != 0)
        rc = ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: mem_alloc: out of host memory");
    if (rc != 0)
        d->allocated -= need;
    ddo__mutex_unlock(&d->lock);
    if (rc != 0) {
        if (e == 0)
            ddo__os_vm_free(p, ddo__cpu_map_rounded(size));
        return rc;
    }
    *ptr = (uintptr_t)p;
    return 0;
}

int ddo__cpu_mem_free(void *st, uint64_t ptr, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
    size_t i = ddo__devtab_find(&d->mems, ptr);
    if (i != SIZE_MAX) {
        wait_unused(d, ptr, d->mems.v[i].size, true);
        i = ddo__devtab_find(&d->mems, ptr);
    }
    if (i == SIZE_MAX) {
        ddo__mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: mem_free: 0x%" PRIx64 " is not a mem_alloc buffer", ptr);
    }
    uint64_t size = d->mems.v[i].size;
    ddo__devtab_remove_at(&d->mems, i);
    d->allocated -= mem_rounded(size);
    ddo__mutex_unlock(&d->lock);
    ddo__os_vm_free((void *)(uintptr_t)ptr, ddo__cpu_map_rounded(size));
    return 0;
}

/* ---- host memory ---- */

int ddo__cpu_host_register(void *st, void *p, size_t size, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    uint64_t a = (uintptr_t)p;
    ddo__mutex_lock(&d->lock);
    int rc = 0;
    size_t i = ddo__devtab_floor(&d->regs, a + size - 1);
    if (i != SIZE_MAX && overlaps(a, size, d->regs.v[i].key, d->regs.v[i].size))
        rc = ddo__fail(eb, DDO_E_DEVICE,
                       "cpu: host_register: %p + %zu overlaps the registered range 0x%" PRIx64
                       " + %" PRIu64 " (like CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)",
                       p, size, d->regs.v[i].key, d->regs.v[i].size);
    else if (ddo__devtab_insert(&d->regs, a, size, NULL) != 0)
        rc = ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: host_register: out of host memory");
    ddo__mutex_unlock(&d->lock);
    return rc;
}

int ddo__cpu_host_unregister(void *st, void *p, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
    size_t i = ddo__devtab_find(&d->regs, (uintptr_t)p);
    if (i != SIZE_MAX) {
        wait_unused(d, (uintptr_t)p, d->regs.v[i].size, false);
        i = ddo__devtab_find(&d->regs, (uintptr_t)p);
    }
    if (i == SIZE_MAX) {
        ddo__mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_DEVICE,
                         "cpu: host_unregister: %p is not the start of a registered range "
                         "(like CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)",
                         p);
    }
    ddo__devtab_remove_at(&d->regs, i);
    ddo__mutex_unlock(&d->lock);
    return 0;
}

int ddo__cpu_host_alloc(void *st, size_t size, void **p, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    void *q = ddo__os_aligned_alloc((size_t)ddo__cpu_page_size(), size);
    if (q == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: host_alloc: %zu pinned bytes: out of memory",
                         size);
    ddo__mutex_lock(&d->lock);
    int rc = ddo__devtab_insert(&d->pinned, (uintptr_t)q, size, NULL);
    ddo__mutex_unlock(&d->lock);
    if (rc != 0) {
        ddo__os_aligned_free(q);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "cpu: host_alloc: out of host memory");
    }
    *p = q;
    return 0;
}

int ddo__cpu_host_free(void *st, void *p, ddo__errbuf *eb)
{
    cpu_dev *d = st;
    ddo__mutex_lock(&d->lock);
    size_t i = ddo__devtab_find(&d->pinned, (uintptr_t)p);
    if (i != SIZE_MAX) {
        wait_unused(d, (uintptr_t)p, d->pinned.v[i].size, false);
        i = ddo__devtab_find(&d->pinned, (uintptr_t)p);
    }
    if (i == SIZE_MAX) {
        ddo__mutex_unlock(&d->lock);
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "cpu: host_free: %p was not allocated by host_alloc", p);
    }
    ddo__devtab_remove_at(&d->pinned, i);
    ddo__mutex_unlock(&d->lock);
    ddo__os_aligned_free(p);
    return 0;
}
