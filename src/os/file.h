/*
 * file.h - the operating system's view of a checkpoint file: open, identity
 * (device, inode, size, modification and change times), exact positioned reads, mappings
 * and direct (uncached) opens. The only place that knows how a platform spells
 * these.
 */
#ifndef DDO_OS_FILE_H
#define DDO_OS_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * A file's identity; two equal identities mean "the same, unchanged file". The change time
 * (st_ctim) is set by the kernel on every write, truncate or utime call and cannot be set back
 * by a writer, so bytes rewritten in place with the modification time restored still differ.
 */
typedef struct ddo__file_id {
    uint64_t dev;
    uint64_t ino;
    uint64_t size;
    uint64_t mtime_ns;
    uint64_t ctime_ns;
    bool regular; /* a regular file (not a directory, FIFO or device) */
} ddo__file_id;

/* Returned by ddo__os_pread_full when the file ends before len bytes. */
#define DDO__OS_EOF (-1)

/* Returned by the opens below for a path that names a FIFO, socket or device node. */
#define DDO__OS_NOT_REGULAR (-2)

/*
 * Opens path read-only and close-on-exec, never blocking: a FIFO, socket or device node is
 * refused with DDO__OS_NOT_REGULAR and a directory with EISDIR, before anything is read.
 * 0 or an errno value.
 */
int ddo__os_file_open(const char *path, int *fd);
/* The same with the caller's open flags (O_RDONLY, O_RDWR | O_CREAT, ...; close-on-exec and
 * non-blocking are added) and creation mode: any path from a user, never blocking, regular
 * files only. */
int ddo__os_open_regular(const char *path, int flags, unsigned mode, int *fd);
/* strerror() of an errno value from this module, with a text for DDO__OS_NOT_REGULAR. */
const char *ddo__os_file_strerror(int e);
/*
 * Opens path read-only for direct (uncached) I/O, regular files only as above. 0, or an
 * errno value;
 * EINVAL or EOPNOTSUPP mean the file system refuses direct I/O, and ENOTSUP
 * that the platform has none.
 */
int ddo__os_file_open_direct(const char *path, int *fd);
void ddo__os_file_close(int fd);

/* Identity of an open file / of the file a path names now. 0 or an errno value. */
int ddo__os_file_identity(int fd, ddo__file_id *id);
int ddo__os_path_identity(const char *path, ddo__file_id *id);
bool ddo__os_file_id_equal(const ddo__file_id *a, const ddo__file_id *b);

/*
 * Reads exactly len bytes at offset into dst: short reads are continued,
 * EINTR retried, and large reads split. Thread-safe (no shared file offset).
 * 0, an errno value, or DDO__OS_EOF when the file ends first.
 */
int ddo__os_pread_full(int fd, void *dst, size_t len, uint64_t offset);

/* Writes exactly len bytes at offset (short writes continued, EINTR retried). 0 or an errno
 * value. */
int ddo__os_pwrite_full(int fd, const void *src, size_t len, uint64_t offset);
/* Sets the file's length (ftruncate). 0 or an errno value. */
int ddo__os_set_length(int fd, uint64_t length);

/* Maps size bytes of fd read-only (size > 0). 0 or an errno value. */
int ddo__os_map_file(int fd, uint64_t size, const void **map);
void ddo__os_unmap_file(const void *map, uint64_t size);

/* Whether the directory dir (opened without blocking) holds an entry whose name ends with one
 * of the n suffixes. False when dir is not a readable directory. */
bool ddo__os_dir_has_suffix(const char *dir, const char *const *suffixes, size_t n);
/* Whether path names a directory (false when it does not exist). */
bool ddo__os_is_directory(const char *path);
/* Bytes of [0, size) of the file at path that sit in the page cache (mincore); -1 when the
 * system cannot tell. */
int64_t ddo__os_cached_bytes(const char *path, uint64_t size);
/* Asks for transparent huge pages on a large anonymous range (fewer faults and fewer pages to
 * pin when it is registered). A hint: failures are ignored. */
void ddo__os_advise_huge(void *p, size_t len);
/* Drops [off, off + len) of fd's file from the page cache (POSIX_FADV_DONTNEED) after a
 * buffered read into memory of ddo's own, so the cache never holds a second copy. A hint. */
void ddo__os_drop_cached(int fd, uint64_t off, uint64_t len);
/* The absolute, resolved path (free with free()); NULL with errno set on failure. */
char *ddo__os_realpath(const char *path);

#endif /* DDO_OS_FILE_H */
