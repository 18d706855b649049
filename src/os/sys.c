/*
 * sys.c - process-level facilities on POSIX systems (sys.h): posix_memalign,
 * clock_nanosleep, gmtime_r, madvise, OpenSSL's SHA-256, and the cpu device's virtual
 * memory (PROT_NONE reservations, a memfd mapped once and aliased at fixed addresses with
 * mremap of old size 0).
 */
#if !defined(_WIN32)
#    include "os/sys.h"

#    include <errno.h>
#    include <openssl/evp.h>
#    include <stdio.h>
#    include <stdlib.h>
#    include <string.h>
#    include <sys/mman.h>
#    include <unistd.h>

void *ddo__os_aligned_alloc(size_t align, size_t size)
{
    void *p = NULL;
    return posix_memalign(&p, align, size) == 0 ? p : NULL;
}

void ddo__os_aligned_free(void *p)
{
    free(p);
}

void ddo__os_sleep_until_ns(uint64_t t_ns)
{
    struct timespec ts = { (time_t)(t_ns / 1000000000u), (long)(t_ns % 1000000000u) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

int ddo__os_gmtime(time_t t, struct tm *out)
{
    return gmtime_r(&t, out) != NULL ? 0 : -1;
}

void ddo__os_discard_pages(void *p, size_t len)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t page = pg > 0 ? (uintptr_t)pg : 4096;
    uintptr_t a = ((uintptr_t)p + page - 1) / page * page, e = ((uintptr_t)p + len) / page * page;
    if (e > a)
        (void)madvise((void *)a, e - a, MADV_DONTNEED);
}

/* ---- SHA-256 ---- */

ddo__os_sha256 *ddo__os_sha256_begin(void)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (md != NULL && EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(md);
        md = NULL;
    }
    return (ddo__os_sha256 *)md;
}

void ddo__os_sha256_update(ddo__os_sha256 *h, const void *data, size_t len)
{
    EVP_DigestUpdate((EVP_MD_CTX *)h, data, len);
}

int ddo__os_sha256_end(ddo__os_sha256 *h, unsigned char out[DDO__OS_SHA256_BYTES])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    int ok = EVP_DigestFinal_ex((EVP_MD_CTX *)h, md, &len);
    EVP_MD_CTX_free((EVP_MD_CTX *)h);
    if (ok != 1 || len != DDO__OS_SHA256_BYTES)
        return -1;
    memcpy(out, md, DDO__OS_SHA256_BYTES);
    return 0;
}

/* ---- virtual memory of the cpu device ---- */

uint64_t ddo__os_vm_granularity(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (uint64_t)p : 4096;
}

int ddo__os_vm_reserve(uint64_t size, uint64_t gran, void **p)
{
    size_t span = (size_t)(size + gran);
    char *m = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return errno;
    uintptr_t start = ((uintptr_t)m + (uintptr_t)gran - 1) / (uintptr_t)gran * (uintptr_t)gran;
    size_t head = (size_t)(start - (uintptr_t)m);
    if (head)
        munmap(m, head);
    if (span - head > size)
        munmap((char *)start + size, span - head - (size_t)size);
    *p = (void *)start;
    return 0;
}

void ddo__os_vm_release(void *p, uint64_t size, uint64_t gran)
{
    (void)gran;
    munmap(p, (size_t)size);
}

int ddo__os_shm_create(uint64_t size, ddo__os_shm *s)
{
    s->base = NULL;
    s->section = NULL;
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
            s->base = p;
    }
    if (fd >= 0)
        close(fd); /* the mapping keeps the memory: handles cost no descriptors */
    return e;
}

void ddo__os_shm_destroy(ddo__os_shm *s, uint64_t size)
{
    if (s->base != NULL)
        munmap(s->base, (size_t)size);
    s->base = NULL;
}

int ddo__os_shm_map_at(const ddo__os_shm *s, uint64_t size, void *va, uint64_t gran)
{
    (void)gran;
    /* mremap of a shared mapping with old size 0 creates a second view of the same pages. */
    void *p = mremap(s->base, 0, (size_t)size, MREMAP_MAYMOVE | MREMAP_FIXED, va);
    return p == MAP_FAILED ? errno : 0;
}

int ddo__os_vm_unmap(void *va, uint64_t size, uint64_t gran)
{
    (void)gran;
    void *p = mmap(va, (size_t)size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    return p == MAP_FAILED ? errno : 0;
}

int ddo__os_vm_alloc(uint64_t size, void **p)
{
    void *m = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return errno;
    *p = m;
    return 0;
}

void ddo__os_vm_free(void *p, uint64_t size)
{
    munmap(p, (size_t)size);
}

#endif /* !_WIN32 */
