/*
 * file.c - checkpoint file access for POSIX systems: open, identity via
 * fstat/stat (st_dev, st_ino, st_size, st_mtim, st_ctim), pread loops, read-only
 * mappings and O_DIRECT opens (Linux).
 */
#include "os/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* Largest single read: Linux transfers at most 0x7ffff000 bytes per call. */
#define PIECE_BYTES ((size_t)1 << 30)

int ddo__os_open_regular(const char *path, int flags, unsigned mode, int *fd)
{
    int f;
    do {
        f = open(path, flags | O_CLOEXEC | O_NONBLOCK, (mode_t)mode);
    } while (f < 0 && errno == EINTR);
    if (f < 0) {
        /* A socket cannot be opened at all (ENXIO): say what it is, not "no such device". */
        int e = errno;
        struct stat st;
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
            return DDO__OS_NOT_REGULAR;
        return e;
    }
    struct stat st;
    if (fstat(f, &st) != 0) {
        int e = errno;
        close(f);
        return e;
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return S_ISDIR(st.st_mode) ? EISDIR : DDO__OS_NOT_REGULAR;
    }
    int fl = fcntl(f, F_GETFL);
    if (fl >= 0)
        (void)fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
    *fd = f;
    return 0;
}

int ddo__os_file_open(const char *path, int *fd)
{
    return ddo__os_open_regular(path, O_RDONLY, 0, fd);
}

const char *ddo__os_file_strerror(int e)
{
    return e == DDO__OS_NOT_REGULAR ? "not a regular file" : strerror(e);
}

int ddo__os_file_open_direct(const char *path, int *fd)
{
#if defined(__linux__)
    return ddo__os_open_regular(path, O_RDONLY | O_DIRECT, 0, fd);
#else
    (void)path;
    (void)fd;
    return ENOTSUP;
#endif
}

void ddo__os_file_close(int fd)
{
    if (fd >= 0)
        close(fd);
}

static void fill_id(const struct stat *st, ddo__file_id *id)
{
    id->dev = (uint64_t)st->st_dev;
    id->ino = (uint64_t)st->st_ino;
    id->size = st->st_size < 0 ? 0 : (uint64_t)st->st_size;
    id->mtime_ns = (uint64_t)st->st_mtim.tv_sec * 1000000000u + (uint64_t)st->st_mtim.tv_nsec;
    id->ctime_ns = (uint64_t)st->st_ctim.tv_sec * 1000000000u + (uint64_t)st->st_ctim.tv_nsec;
    id->regular = S_ISREG(st->st_mode);
}

int ddo__os_file_identity(int fd, ddo__file_id *id)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return errno;
    fill_id(&st, id);
    return 0;
}

int ddo__os_path_identity(const char *path, ddo__file_id *id)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return errno;
    fill_id(&st, id);
    return 0;
}

bool ddo__os_file_id_equal(const ddo__file_id *a, const ddo__file_id *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns && a->regular == b->regular;
}

int ddo__os_pread_full(int fd, void *dst, size_t len, uint64_t offset)
{
    unsigned char *p = dst;
    while (len > 0) {
        if (offset > (uint64_t)INT64_MAX)
            return EOVERFLOW;
        size_t piece = len < PIECE_BYTES ? len : PIECE_BYTES;
        ssize_t n = pread(fd, p, piece, (off_t)offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (n == 0)
            return DDO__OS_EOF;
        p += n;
        len -= (size_t)n;
        offset += (uint64_t)n;
    }
    return 0;
}

int ddo__os_pwrite_full(int fd, const void *src, size_t len, uint64_t offset)
{
    const unsigned char *p = src;
    while (len > 0) {
        if (offset > (uint64_t)INT64_MAX)
            return EOVERFLOW;
        size_t piece = len < PIECE_BYTES ? len : PIECE_BYTES;
        ssize_t n = pwrite(fd, p, piece, (off_t)offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (n == 0)
            return EIO;
        p += n;
        len -= (size_t)n;
        offset += (uint64_t)n;
    }
    return 0;
}

int ddo__os_set_length(int fd, uint64_t length)
{
    if (length > (uint64_t)INT64_MAX)
        return EOVERFLOW;
    int rc;
    do {
        rc = ftruncate(fd, (off_t)length);
    } while (rc != 0 && errno == EINTR);
    return rc == 0 ? 0 : errno;
}

int ddo__os_map_file(int fd, uint64_t size, const void **map)
{
    if (size == 0 || size > (uint64_t)SIZE_MAX)
        return EINVAL;
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return errno;
    *map = m;
    return 0;
}

void ddo__os_unmap_file(const void *map, uint64_t size)
{
    if (map != NULL && size > 0)
        munmap((void *)(uintptr_t)map, (size_t)size);
}

bool ddo__os_dir_has_suffix(const char *dir, const char *const *suffixes, size_t n)
{
    int fd = open(dir, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_DIRECTORY);
    if (fd < 0)
        return false;
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        close(fd);
        return false;
    }
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        for (size_t i = 0; i < n && !found; i++) {
            size_t k = strlen(suffixes[i]);
            found = len >= k && strcmp(e->d_name + len - k, suffixes[i]) == 0;
        }
    }
    closedir(d);
    return found;
}

bool ddo__os_is_directory(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

void ddo__os_drop_cached(int fd, uint64_t off, uint64_t len)
{
#if defined(__linux__) && defined(POSIX_FADV_DONTNEED)
    (void)posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
#else
    (void)fd;
    (void)off;
    (void)len;
#endif
}

char *ddo__os_realpath(const char *path)
{
    return realpath(path, NULL);
}

int64_t ddo__os_cached_bytes(const char *path, uint64_t size)
{
#if defined(__linux__)
    if (size == 0)
        return 0;
    int fd;
    if (ddo__os_open_regular(path, O_RDONLY, 0, &fd) != 0) /* never blocks on a FIFO */
        return -1;
    long page = sysconf(_SC_PAGESIZE);
    int64_t cached = -1;
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED && page > 0) {
        size_t pages = (size_t)((size + (uint64_t)page - 1) / (uint64_t)page);
        unsigned char *vec = malloc(pages);
        if (vec != NULL && mincore(map, (size_t)size, vec) == 0) {
            uint64_t n = 0;
            for (size_t i = 0; i < pages; i++)
                n += vec[i] & 1u;
            cached = (int64_t)(n * (uint64_t)page > size ? size : n * (uint64_t)page);
        }
        free(vec);
        munmap(map, (size_t)size);
    }
    close(fd);
    return cached;
#else
    (void)path;
    (void)size;
    return -1;
#endif
}

void ddo__os_advise_huge(void *p, size_t len)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)madvise(p, len, MADV_HUGEPAGE);
#else
    (void)p;
    (void)len;
#endif
}
