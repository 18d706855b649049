/*
 * sys_win.c - process-level facilities on Windows (sys.h): _aligned_malloc, a monotonic
 * sleep on a high-resolution waitable timer (winpthreads' clock_nanosleep refuses
 * CLOCK_MONOTONIC), CNG's SHA-256 (bcrypt), and the cpu device's virtual memory: a reserved
 * range is one reservation per granule, so that mapping a pagefile-backed section at a fixed
 * address (MapViewOfFileEx) can free exactly the granules it covers; unmapping reserves them
 * again. Also the helpers of win.h.
 */
#if defined(_WIN32)
#    include "os/sys.h"
#    include "os/win.h"

#    include <bcrypt.h>
#    include <errno.h>
#    include <io.h>
#    include <malloc.h>
#    include <stdio.h>
#    include <stdlib.h>
#    include <string.h>
#    include <wchar.h>

/* ---- win.h ---- */

wchar_t *ddo__win_wide(const char *path)
{
    int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, NULL, 0);
    if (n <= 0) {
        errno = EINVAL; /* not UTF-8 */
        return NULL;
    }
    wchar_t *w = malloc((size_t)n * sizeof(wchar_t));
    if (w == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, w, n);
    for (int i = 0; i < n; i++) /* the Win32 file APIs want backslashes in \\?\ paths */
        w[i] = w[i] == L'/' ? L'\\' : w[i];
    return w;
}

char *ddo__win_narrow(const wchar_t *w)
{
    int n = WideCharToMultiByte(CP_UTF8, 0, w, -1, NULL, 0, NULL, NULL);
    char *s = n > 0 ? malloc((size_t)n) : NULL;
    if (s != NULL)
        WideCharToMultiByte(CP_UTF8, 0, w, -1, s, n, NULL, NULL);
    return s;
}

int ddo__win_errno(DWORD err)
{
    switch (err) {
    case ERROR_FILE_NOT_FOUND:
    case ERROR_PATH_NOT_FOUND:
    case ERROR_INVALID_NAME: /* a name Windows cannot hold (a '\n', ':', '*'...) names nothing */
    case ERROR_INVALID_DRIVE:
    case ERROR_BAD_NETPATH:
        return ENOENT;
    case ERROR_ACCESS_DENIED:
    case ERROR_SHARING_VIOLATION:
    case ERROR_LOCK_VIOLATION:
        return EACCES;
    case ERROR_FILE_EXISTS:
    case ERROR_ALREADY_EXISTS:
        return EEXIST;
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY:
    case ERROR_COMMITMENT_LIMIT:
        return ENOMEM;
    case ERROR_DISK_FULL:
    case ERROR_HANDLE_DISK_FULL:
        return ENOSPC;
    case ERROR_INVALID_HANDLE:
        return EBADF;
    case ERROR_WRITE_PROTECT:
        return EROFS;
    case ERROR_FILENAME_EXCED_RANGE:
    case ERROR_BUFFER_OVERFLOW:
        return ENAMETOOLONG;
    case ERROR_DIRECTORY:
        return ENOTDIR;
    case ERROR_NOT_SUPPORTED:
        return ENOTSUP;
    case ERROR_INVALID_PARAMETER:
        return EINVAL;
    default:
        return EIO;
    }
}

HANDLE ddo__win_handle(int fd)
{
    return fd < 0 ? INVALID_HANDLE_VALUE : (HANDLE)_get_osfhandle(fd);
}

int ddo__win_wrap(HANDLE h, int *fd)
{
    int f = _open_osfhandle((intptr_t)h, 0);
    if (f < 0) {
        CloseHandle(h);
        return EMFILE;
    }
    *fd = f;
    return 0;
}

uint64_t ddo__win_time_ns(int64_t filetime)
{
    const int64_t epoch = 116444736000000000LL; /* 1970-01-01 in 100 ns units since 1601 */
    return filetime <= epoch ? 0 : (uint64_t)(filetime - epoch) * 100u;
}

/* ---- sys.h ---- */

void *ddo__os_aligned_alloc(size_t align, size_t size)
{
    return _aligned_malloc(size > 0 ? size : 1, align);
}

void ddo__os_aligned_free(void *p)
{
    _aligned_free(p);
}

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the clock the callers' deadlines come from */
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void ddo__os_sleep_until_ns(uint64_t t_ns)
{
    /* CREATE_WAITABLE_TIMER_HIGH_RESOLUTION (Windows 10 1803+); a plain timer elsewhere. */
    static _Thread_local HANDLE timer;
    if (timer == NULL)
        timer = CreateWaitableTimerExW(NULL, NULL, 0x2, TIMER_ALL_ACCESS);
    if (timer == NULL)
        timer = CreateWaitableTimerExW(NULL, NULL, 0, TIMER_ALL_ACCESS);
    for (;;) {
        uint64_t now = monotonic_ns();
        if (now >= t_ns)
            return;
        LARGE_INTEGER due;
        due.QuadPart = -(LONGLONG)((t_ns - now + 99) / 100); /* relative, 100 ns units */
        if (timer == NULL || !SetWaitableTimer(timer, &due, 0, NULL, NULL, FALSE))
            Sleep((DWORD)((t_ns - now) / 1000000u));
        else
            WaitForSingleObject(timer, INFINITE);
    }
}

int ddo__os_gmtime(time_t t, struct tm *out)
{
    return gmtime_s(out, &t) == 0 ? 0 : -1;
}

void ddo__os_discard_pages(void *p, size_t len)
{
    /* Private pages: MEM_RESET lets the system drop them without writing them out; their
     * bytes are undefined afterwards, which is all callers ask. Views ignore it. */
    uintptr_t page = 4096, a = ((uintptr_t)p + page - 1) / page * page;
    uintptr_t e = ((uintptr_t)p + len) / page * page;
    if (e > a)
        (void)VirtualAlloc((void *)a, e - a, MEM_RESET, PAGE_READWRITE);
}

/* ---- SHA-256 ---- */

struct ddo__os_sha256 {
    BCRYPT_ALG_HANDLE alg;
    BCRYPT_HASH_HANDLE hash;
    bool failed;
};

ddo__os_sha256 *ddo__os_sha256_begin(void)
{
    ddo__os_sha256 *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return NULL;
    if (BCryptOpenAlgorithmProvider(&h->alg, BCRYPT_SHA256_ALGORITHM, NULL, 0) != 0 ||
        BCryptCreateHash(h->alg, &h->hash, NULL, 0, NULL, 0, 0) != 0) {
        if (h->alg != NULL)
            BCryptCloseAlgorithmProvider(h->alg, 0);
        free(h);
        return NULL;
    }
    return h;
}

void ddo__os_sha256_update(ddo__os_sha256 *h, const void *data, size_t len)
{
    const unsigned char *p = data;
    while (len > 0 && !h->failed) {
        ULONG piece = len > (1u << 30) ? (1u << 30) : (ULONG)len;
        h->failed = BCryptHashData(h->hash, (PUCHAR)(uintptr_t)p, piece, 0) != 0;
        p += piece;
        len -= piece;
    }
}

int ddo__os_sha256_end(ddo__os_sha256 *h, unsigned char out[DDO__OS_SHA256_BYTES])
{
    bool ok = !h->failed && BCryptFinishHash(h->hash, out, DDO__OS_SHA256_BYTES, 0) == 0;
    BCryptDestroyHash(h->hash);
    BCryptCloseAlgorithmProvider(h->alg, 0);
    free(h);
    return ok ? 0 : -1;
}

/* ---- virtual memory of the cpu device ---- */

uint64_t ddo__os_vm_granularity(void)
{
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    return si.dwAllocationGranularity > 0 ? si.dwAllocationGranularity : 65536;
}

/*
 * Mapping at a fixed address frees granules and maps a view into the hole; reserving finds a
 * hole, gives it back and takes it granule by granule. Between the two steps another thread's
 * VirtualAlloc could land in the hole: these operations of the process take this lock, so
 * they never race each other. Ranges are reserved top-down, away from other code's
 * allocations, which could still take a hole in that window (VirtualAlloc2 placeholders would
 * close it, but Wine cannot run them, so nothing here could test them).
 */
static SRWLOCK vm_lock = SRWLOCK_INIT;

/* Reserves [p, p + size) as one reservation per granule; false (nothing left reserved) when
 * another thread took part of it. */
static bool reserve_granules(char *p, uint64_t size, uint64_t gran)
{
    for (uint64_t off = 0; off < size; off += gran) {
        if (VirtualAlloc(p + off, (SIZE_T)gran, MEM_RESERVE, PAGE_NOACCESS) == NULL) {
            for (uint64_t k = 0; k < off; k += gran)
                VirtualFree(p + k, 0, MEM_RELEASE);
            return false;
        }
    }
    return true;
}

int ddo__os_vm_reserve(uint64_t size, uint64_t gran, void **p)
{
    /* Find a hole, give it back, and take it again granule by granule (retried should other
     * code take part of the hole in between). */
    int e = ENOMEM;
    AcquireSRWLockExclusive(&vm_lock);
    for (int attempt = 0; attempt < 16; attempt++) {
        /* Top-down: far from the bottom-up allocations of heaps and thread stacks, which
         * could otherwise land in a hole that a fixed mapping opens. */
        char *m =
            VirtualAlloc(NULL, (SIZE_T)(size + gran), MEM_RESERVE | MEM_TOP_DOWN, PAGE_NOACCESS);
        if (m == NULL) {
            e = ddo__win_errno(GetLastError());
            break;
        }
        VirtualFree(m, 0, MEM_RELEASE);
        char *start = (char *)(((uintptr_t)m + (uintptr_t)gran - 1) / gran * gran);
        if (reserve_granules(start, size, gran)) {
            *p = start;
            e = 0;
            break;
        }
    }
    ReleaseSRWLockExclusive(&vm_lock);
    return e;
}

/* Unmaps the views and releases the reservations in [p, p + size). */
static void release_regions(char *p, uint64_t size)
{
    char *end = p + size;
    while (p < end) {
        MEMORY_BASIC_INFORMATION mi;
        if (VirtualQuery(p, &mi, sizeof(mi)) == 0)
            break;
        char *next = (char *)mi.BaseAddress + mi.RegionSize;
        if (mi.Type == MEM_MAPPED)
            UnmapViewOfFile(mi.AllocationBase);
        else if (mi.State == MEM_RESERVE || mi.State == MEM_COMMIT)
            VirtualFree(mi.AllocationBase, 0, MEM_RELEASE);
        p = next;
    }
}

void ddo__os_vm_release(void *p, uint64_t size, uint64_t gran)
{
    (void)gran;
    AcquireSRWLockExclusive(&vm_lock);
    release_regions(p, size);
    ReleaseSRWLockExclusive(&vm_lock);
}

int ddo__os_shm_create(uint64_t size, ddo__os_shm *s)
{
    s->base = NULL;
    s->section = CreateFileMappingW(INVALID_HANDLE_VALUE, NULL, PAGE_READWRITE, (DWORD)(size >> 32),
                                    (DWORD)size, NULL);
    if (s->section == NULL)
        return ddo__win_errno(GetLastError());
    AcquireSRWLockExclusive(&vm_lock); /* never into a hole a fixed mapping is about to take */
    s->base = MapViewOfFile(s->section, FILE_MAP_ALL_ACCESS, 0, 0, (SIZE_T)size);
    ReleaseSRWLockExclusive(&vm_lock);
    if (s->base == NULL) {
        int e = ddo__win_errno(GetLastError());
        CloseHandle(s->section);
        s->section = NULL;
        return e;
    }
    return 0;
}

void ddo__os_shm_destroy(ddo__os_shm *s, uint64_t size)
{
    (void)size;
    if (s->base != NULL)
        UnmapViewOfFile(s->base);
    if (s->section != NULL)
        CloseHandle(s->section); /* views at fixed addresses keep the section alive */
    s->base = NULL;
    s->section = NULL;
}

int ddo__os_shm_map_at(const ddo__os_shm *s, uint64_t size, void *va, uint64_t gran)
{
    char *p = va;
    int e = 0;
    AcquireSRWLockExclusive(&vm_lock);
    for (uint64_t off = 0; off < size; off += gran)
        VirtualFree(p + off, 0, MEM_RELEASE);
    if (MapViewOfFileEx(s->section, FILE_MAP_ALL_ACCESS, 0, 0, (SIZE_T)size, va) == NULL) {
        e = ddo__win_errno(GetLastError());
        (void)reserve_granules(p, size, gran);
    }
    ReleaseSRWLockExclusive(&vm_lock);
    return e;
}

int ddo__os_vm_unmap(void *va, uint64_t size, uint64_t gran)
{
    AcquireSRWLockExclusive(&vm_lock);
    release_regions(va, size);
    bool ok = reserve_granules(va, size, gran);
    ReleaseSRWLockExclusive(&vm_lock);
    return ok ? 0 : ENOMEM;
}

int ddo__os_vm_alloc(uint64_t size, void **p)
{
    AcquireSRWLockExclusive(&vm_lock);
    void *m = VirtualAlloc(NULL, (SIZE_T)size, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
    ReleaseSRWLockExclusive(&vm_lock);
    if (m == NULL)
        return ddo__win_errno(GetLastError());
    *p = m;
    return 0;
}

void ddo__os_vm_free(void *p, uint64_t size)
{
    (void)size;
    VirtualFree(p, 0, MEM_RELEASE);
}

#endif /* _WIN32 */
