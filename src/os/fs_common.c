/*
 * fs_common.c - the parts of the small-file module that are the same on every platform:
 * error texts, the bounded read loop, temporary names and writing a file from parts. The
 * system calls are in fs.c (POSIX) and fs_win.c (Windows).
 */
#include "os/fs.h"

#include "os/file.h"
#include "os/fs_impl.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

const char *ddo__os_fs_strerror(int e)
{
    switch (e) {
    case DDO__OS_TOO_LARGE:
        return "larger than the limit";
    case DDO__OS_LOCK_TIMEOUT:
        return "locked by another process for too long";
    default:
        return ddo__os_file_strerror(e);
    }
}

/* Reads fd (size bytes when it was opened) to its end into a new NUL-terminated buffer;
 * DDO__OS_TOO_LARGE past max_bytes. */
static int read_bounded(int fd, uint64_t size, size_t max_bytes, char **data, size_t *len)
{
    /* Read one byte past the size: a file that grew past the limit is refused too. */
    size_t cap = (size_t)size + 2, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL)
        return ENOMEM;
    int e = 0;
    for (;;) {
        if (n + 1 >= cap) {
            size_t ncap = cap * 2 > max_bytes + 2 ? max_bytes + 2 : cap * 2;
            char *nb = n + 1 >= ncap ? NULL : realloc(buf, ncap);
            if (nb == NULL) {
                e = n + 1 >= ncap ? DDO__OS_TOO_LARGE : ENOMEM;
                break;
            }
            buf = nb;
            cap = ncap;
        }
        int64_t r = ddo__os_fs_read_at(fd, buf + n, cap - 1 - n, n);
        if (r <= 0) {
            e = r < 0 ? (int)-r : 0;
            break;
        }
        n += (size_t)r;
        if (n > max_bytes) {
            e = DDO__OS_TOO_LARGE;
            break;
        }
    }
    if (e != 0) {
        free(buf);
        return e;
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return 0;
}

int ddo__os_read_small_file(const char *path, size_t max_bytes, char **data, size_t *len)
{
    int fd = -1;
    int e = ddo__os_file_open(path, &fd);
    if (e != 0)
        return e;
    ddo__file_id id;
    if ((e = ddo__os_file_identity(fd, &id)) == 0)
        e = id.size > (uint64_t)max_bytes ? DDO__OS_TOO_LARGE
                                          : read_bounded(fd, id.size, max_bytes, data, len);
    ddo__os_file_close(fd);
    return e;
}

/* Sequential writes through the positioned writer (on Windows the descriptor has no shared
 * offset). */
typedef struct parts_gen {
    const ddo__os_part *parts;
    size_t n;
} parts_gen;

static int write_parts(void *user, int fd)
{
    const parts_gen *g = user;
    uint64_t at = 0;
    int e = 0;
    for (size_t i = 0; i < g->n && e == 0; i++) {
        e = ddo__os_pwrite_full(fd, g->parts[i].data, g->parts[i].len, at);
        at += g->parts[i].len;
    }
    return e;
}

int ddo__os_write_atomic_parts(const char *path, const ddo__os_part *parts, size_t n,
                               bool stop_before_rename)
{
    parts_gen g = { parts, n };
    return ddo__os_write_atomic_with(path, write_parts, &g, stop_before_rename);
}

int ddo__os_write_atomic(const char *path, const void *data, size_t len, bool stop_before_rename)
{
    ddo__os_part part = { data, len };
    return ddo__os_write_atomic_parts(path, &part, 1, stop_before_rename);
}
