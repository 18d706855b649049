/*
 * sys.h - the process-level facilities the rest of the library needs from the operating
 * system: aligned allocations, a monotonic sleep, SHA-256, UTC calendar time, dropping
 * pages, and the virtual-memory primitives of the cpu device (reserved ranges, shared memory
 * objects mapped at fixed addresses). sys.c implements them on POSIX systems, sys_win.c on
 * Windows.
 */
#ifndef DDO_OS_SYS_H
#define DDO_OS_SYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* size bytes aligned to align (a power of two, a multiple of sizeof(void *)); NULL when out
 * of memory. Free with ddo__os_aligned_free, never free(). */
void *ddo__os_aligned_alloc(size_t align, size_t size);
void ddo__os_aligned_free(void *p);

/* Sleeps until the monotonic clock (clock_gettime(CLOCK_MONOTONIC), in ns) reaches t_ns. */
void ddo__os_sleep_until_ns(uint64_t t_ns);

/* UTC calendar time of t (seconds since 1970). 0, or -1 when it cannot be represented. */
int ddo__os_gmtime(time_t t, struct tm *out);

/* Drops the pages of [p, p + len) (whole pages inside it) from the process's resident set;
 * private anonymous pages read back as zero afterwards, shared ones keep their bytes. */
void ddo__os_discard_pages(void *p, size_t len);

/* ---- SHA-256 (OpenSSL on POSIX systems, CNG's BCryptHash on Windows) ---- */

#define DDO__OS_SHA256_BYTES 32
typedef struct ddo__os_sha256 ddo__os_sha256;
/* A running digest; NULL when out of memory. */
ddo__os_sha256 *ddo__os_sha256_begin(void);
void ddo__os_sha256_update(ddo__os_sha256 *h, const void *data, size_t len);
/* Writes the digest and frees h. 0, or -1 when the system's hash failed. */
int ddo__os_sha256_end(ddo__os_sha256 *h, unsigned char out[DDO__OS_SHA256_BYTES]);

/* ---- virtual memory of the cpu device ---- */

/* The unit of mappings at fixed addresses: the page size on POSIX systems, the allocation
 * granularity (64 KiB) on Windows. */
uint64_t ddo__os_vm_granularity(void);
/* Reserves size bytes of address space (no access) aligned to gran (a multiple of
 * ddo__os_vm_granularity; size a multiple of gran). 0 or an errno value. */
int ddo__os_vm_reserve(uint64_t size, uint64_t gran, void **p);
/* Releases a reserved range and whatever is still mapped in it. */
void ddo__os_vm_release(void *p, uint64_t size, uint64_t gran);

/* A shared memory object (Linux: a memfd; Windows: a pagefile-backed section), mapped
 * read-write once at base. */
typedef struct ddo__os_shm {
    void *base;
    void *section; /* Windows: the section handle; unused elsewhere */
} ddo__os_shm;
int ddo__os_shm_create(uint64_t size, ddo__os_shm *s);
/* Unmaps the base view; the object lives on while another view of it does. */
void ddo__os_shm_destroy(ddo__os_shm *s, uint64_t size);
/* Maps the object's first size bytes read-write at va, a gran-aligned part of a reserved
 * range: a second view of the same pages. 0 or an errno value. */
int ddo__os_shm_map_at(const ddo__os_shm *s, uint64_t size, void *va, uint64_t gran);
/* Puts [va, va + size), a set of whole views made by ddo__os_shm_map_at, back to reserved
 * address space. 0 or an errno value. */
int ddo__os_vm_unmap(void *va, uint64_t size, uint64_t gran);

/* Anonymous read-write memory of size bytes (zeroed, committed lazily where the system can).
 * 0 or an errno value. */
int ddo__os_vm_alloc(uint64_t size, void **p);
void ddo__os_vm_free(void *p, uint64_t size);

#endif /* DDO_OS_SYS_H */
