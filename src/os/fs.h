/*
 * fs.h - small files the library writes and reads for itself (capacity profiles, metrics
 * lines): bounded reads of regular files, atomic replacement, appends and advisory locks.
 * The only place that knows how a platform spells these.
 */
#ifndef DDO_OS_FS_H
#define DDO_OS_FS_H

#include <stdbool.h>
#include <stddef.h>

/* Returned by ddo__os_read_small_file for a file larger than its limit. */
#define DDO__OS_TOO_LARGE (-3)
/* Returned by ddo__os_lock_file when another process held the lock for the whole wait. */
#define DDO__OS_LOCK_TIMEOUT (-4)

/*
 * Reads the whole regular file at path, at most max_bytes, into a new NUL-terminated buffer
 * (*data, free with free(); *len its length without the terminator). Opens without blocking:
 * a FIFO, socket or device node is refused (DDO__OS_NOT_REGULAR of file.h), a file over
 * max_bytes is refused (DDO__OS_TOO_LARGE) before it is read, and a file that grows past the
 * limit while being read too. 0 or an errno value.
 */
int ddo__os_read_small_file(const char *path, size_t max_bytes, char **data, size_t *len);

/*
 * Replaces path with data atomically: the bytes go to a file in path's directory that has no
 * name until it is complete (O_TMPFILE on Linux; elsewhere "<path>.<random>.tmp", removed on
 * failure), are synced, and then take path's name in one rename. A process killed at any point
 * leaves the old file or the new one, and (with O_TMPFILE) no temporary name.
 * stop_before_rename (a test hook) stops after the sync as a crash would. 0 or an errno value.
 */
int ddo__os_write_atomic(const char *path, const void *data, size_t len, bool stop_before_rename);

/* One piece of a file written by ddo__os_write_atomic_parts. */
typedef struct ddo__os_part {
    const void *data;
    size_t len;
} ddo__os_part;
/* The same for a file made of n parts written in order (no copy into one buffer). */
int ddo__os_write_atomic_parts(const char *path, const ddo__os_part *parts, size_t n,
                               bool stop_before_rename);

/*
 * The same for a file gen(user, fd) writes (write and pwrite on fd, which is open for
 * writing only; 0 or an errno value): for a file whose first bytes depend on what follows.
 * A failing gen leaves the old file.
 */
typedef int (*ddo__os_write_fn)(void *user, int fd);
int ddo__os_write_atomic_with(const char *path, ddo__os_write_fn gen, void *user,
                              bool stop_before_rename);

/*
 * Appends len bytes to path in one write (created 0644 when missing), so lines of concurrent
 * writers stay whole. Opens without blocking: a FIFO without a reader or a directory is
 * refused. 0 or an errno value; *opened says whether the open succeeded (the failure was
 * the write).
 */
int ddo__os_append(const char *path, const void *data, size_t len, bool *opened);

/*
 * Takes an exclusive advisory lock (flock) on the lock file path (created 0644 when missing;
 * only a regular file is accepted), waiting up to timeout_ms for another holder.
 * *fd receives the open lock; ddo__os_unlock_file releases it. 0, DDO__OS_LOCK_TIMEOUT or an
 * errno value.
 */
int ddo__os_lock_file(const char *path, unsigned timeout_ms, int *fd);
void ddo__os_unlock_file(int fd);

/* Creates dir and its missing parents (mode 0755); existing ones are kept. 0 or an errno
 * value (ENOTDIR when a component is a file). */
int ddo__os_make_dirs(const char *dir);

/* Whether the directory dir exists and this process may create files in it. 0 or an errno
 * value (ENOENT, ENOTDIR, EACCES, EROFS...). */
int ddo__os_dir_writable(const char *dir);

/* strerror() of a value from this module or file.h, with texts for the DDO__OS_* values. */
const char *ddo__os_fs_strerror(int e);

#endif /* DDO_OS_FS_H */
