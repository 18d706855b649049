/*
 * fs.c - the library's own small files on POSIX systems, the system calls under fs_common.c:
 * positioned reads for the bounded reads, atomic replacement (Linux: O_TMPFILE + linkat, so
 * an interrupted write leaves no name behind; elsewhere a named temporary file), single-write
 * appends and flock locks.
 */
#include "os/fs.h"

#include "os/file.h"
#include "os/fs_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int64_t ddo__os_fs_read_at(int fd, void *dst, size_t len, uint64_t offset)
{
    ssize_t r;
    do {
        r = pread(fd, dst, len, (off_t)offset);
    } while (r < 0 && errno == EINTR);
    return r < 0 ? -(int64_t)errno : (int64_t)r;
}

static int write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? errno : EIO;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

uint64_t ddo__os_fs_random_tag(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t r = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        uint64_t x = 0;
        if (read(fd, &x, sizeof(x)) == (ssize_t)sizeof(x))
            r ^= x;
        close(fd);
    }
    return r;
}

/* The portable way: a named temporary file, removed again on any failure. */
static int write_named(const char *path, ddo__os_write_fn gen, void *user, bool stop)
{
    char tmp[4200];
    int e = ddo__os_fs_temp_name(path, tmp, sizeof(tmp));
    if (e != 0)
        return e;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return errno;
    e = gen(user, fd);
    if (e == 0 && fsync(fd) != 0)
        e = errno;
    if (close(fd) != 0 && e == 0)
        e = errno;
    if (e == 0 && stop)
        return EINTR; /* the test hook: the temporary file stays, as after a crash */
    if (e == 0 && rename(tmp, path) != 0)
        e = errno;
    if (e != 0)
        unlink(tmp);
    return e;
}

#if defined(__linux__) && defined(O_TMPFILE)
/* O_TMPFILE: the file has no name until linkat gives it one right before the rename. */
static int write_unnamed(const char *path, ddo__os_write_fn gen, void *user, bool stop)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == path)
        snprintf(dir, sizeof(dir), "/");
    else if ((size_t)(slash - path) < sizeof(dir))
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    else
        return ENAMETOOLONG;
    int fd = open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno; /* negative: fall back to a named file */
    int e = gen(user, fd);
    if (e == 0 && fsync(fd) != 0)
        e = errno;
    if (e == 0 && stop)
        e = EINTR;
    char tmp[4200], proc[64];
    if (e == 0)
        e = ddo__os_fs_temp_name(path, tmp, sizeof(tmp));
    if (e == 0) {
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
        if (linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) != 0)
            e = -errno;
    }
    close(fd);
    if (e == 0 && rename(tmp, path) != 0) {
        e = errno;
        unlink(tmp);
    }
    return e;
}
#endif

int ddo__os_write_atomic_with(const char *path, ddo__os_write_fn gen, void *user,
                              bool stop_before_rename)
{
#if defined(__linux__) && defined(O_TMPFILE)
    int e = write_unnamed(path, gen, user, stop_before_rename);
    if (e >= 0)
        return e;
        /* The file system has no O_TMPFILE (or /proc is missing): the portable way. */
#endif
    return write_named(path, gen, user, stop_before_rename);
}

int ddo__os_append(const char *path, const void *data, size_t len, bool *opened)
{
    *opened = false;
    int fd;
    do {
        fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return errno;
    *opened = true;
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    int e = write_all(fd, data, len);
    if (close(fd) != 0 && e == 0)
        e = errno;
    return e;
}

int ddo__os_lock_file(const char *path, unsigned timeout_ms, int *fd)
{
    int f;
    int oe = ddo__os_open_regular(path, O_RDWR | O_CREAT | O_NOFOLLOW, 0644, &f);
    if (oe != 0)
        return oe == EISDIR ? DDO__OS_NOT_REGULAR : oe;
    /* Poll: a holder that never lets go is reported instead of waited on forever. */
    for (unsigned waited = 0;; waited += 5) {
        if (flock(f, LOCK_EX | LOCK_NB) == 0)
            break;
        int e = errno;
        if ((e != EWOULDBLOCK && e != EINTR) || waited >= timeout_ms) {
            close(f);
            return e == EWOULDBLOCK ? DDO__OS_LOCK_TIMEOUT : e;
        }
        struct timespec ts = { 0, 5 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    *fd = f;
    return 0;
}

void ddo__os_unlock_file(int fd)
{
    if (fd >= 0)
        close(fd); /* closing the last descriptor releases the flock */
}

int ddo__os_make_dirs(const char *dir)
{
    size_t n = strlen(dir);
    char *d = malloc(n + 1);
    if (d == NULL)
        return ENOMEM;
    memcpy(d, dir, n + 1);
    int e = 0;
    for (char *p = d + 1; n > 0; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(d, 0755) != 0 && errno != EEXIST) {
            e = errno;
            break;
        }
        *p = c;
        if (c == '\0')
            break;
    }
    free(d);
    return e;
}

int ddo__os_dir_writable(const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0)
        return errno;
    if (!S_ISDIR(st.st_mode))
        return ENOTDIR;
    if (access(dir, W_OK | X_OK) != 0)
        return errno;
    return 0;
}
