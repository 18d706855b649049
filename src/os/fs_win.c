/*
 * fs_win.c - the library's own small files on Windows: bounded reads, atomic replacement (a
 * named temporary file in the same directory, flushed, then MoveFileExW with
 * MOVEFILE_REPLACE_EXISTING, retried while another process holds the old file without
 * FILE_SHARE_DELETE, as virus scanners and indexers do), appends with FILE_APPEND_DATA (one
 * WriteFile each, so concurrent lines stay whole) and LockFileEx locks.
 */
#if defined(_WIN32)
#    include "fs.h"

#    include "file.h"
#    include "win.h"

#    include <bcrypt.h>
#    include <errno.h>
#    include <fcntl.h>
#    include <io.h>
#    include <stdint.h>
#    include <stdio.h>
#    include <stdlib.h>
#    include <string.h>

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

int ddo__os_read_small_file(const char *path, size_t max_bytes, char **data, size_t *len)
{
    int fd = -1;
    int e = ddo__os_file_open(path, &fd);
    if (e != 0)
        return e;
    ddo__file_id id;
    if ((e = ddo__os_file_identity(fd, &id)) != 0 || id.size > (uint64_t)max_bytes) {
        ddo__os_file_close(fd);
        return e != 0 ? e : DDO__OS_TOO_LARGE;
    }
    /* Read one byte past the size: a file that grew past the limit is refused too. */
    size_t cap = (size_t)id.size + 2, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL) {
        ddo__os_file_close(fd);
        return ENOMEM;
    }
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
        int64_t r = ddo__win_pread(fd, buf + n, cap - 1 - n, n);
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
    ddo__os_file_close(fd);
    if (e != 0) {
        free(buf);
        return e;
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return 0;
}

/* Sequential writes through the positioned writer (the descriptor has no shared offset). */
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

static uint64_t random_tag(void)
{
    uint64_t r = ((uint64_t)GetCurrentProcessId() << 32) ^ GetTickCount64();
    uint64_t x = 0;
    if (BCryptGenRandom(NULL, (PUCHAR)&x, sizeof(x), BCRYPT_USE_SYSTEM_PREFERRED_RNG) == 0)
        r ^= x;
    return r;
}

/* MoveFileExW over an existing file, retried for about a second while another process holds
 * the target open without FILE_SHARE_DELETE (sharing violation or access denied). */
static int replace_file(const char *from, const char *to)
{
    wchar_t *wf = ddo__win_wide(from), *wt = ddo__win_wide(to);
    int e = wf == NULL || wt == NULL ? ENOMEM : 0;
    for (unsigned attempt = 0; e == 0; attempt++) {
        if (MoveFileExW(wf, wt, MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH))
            break;
        DWORD err = GetLastError();
        if ((err != ERROR_SHARING_VIOLATION && err != ERROR_ACCESS_DENIED &&
             err != ERROR_LOCK_VIOLATION) ||
            attempt >= 20) {
            e = ddo__win_errno(err);
            break;
        }
        Sleep(5 + 5 * attempt);
    }
    free(wf);
    free(wt);
    return e;
}

static void remove_file(const char *path)
{
    wchar_t *w = ddo__win_wide(path);
    if (w != NULL)
        DeleteFileW(w);
    free(w);
}

int ddo__os_write_atomic_with(const char *path, ddo__os_write_fn gen, void *user,
                              bool stop_before_rename)
{
    char tmp[4200];
    int n = snprintf(tmp, sizeof(tmp), "%s.%016llx.tmp", path, (unsigned long long)random_tag());
    if (n < 0 || (size_t)n >= sizeof(tmp))
        return ENAMETOOLONG;
    int fd;
    int e = ddo__os_open_regular(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644, &fd);
    if (e != 0)
        return e;
    e = gen(user, fd);
    if (e == 0 && !FlushFileBuffers(ddo__win_handle(fd)))
        e = ddo__win_errno(GetLastError());
    ddo__os_file_close(fd);
    if (e == 0 && stop_before_rename)
        return EINTR; /* the test hook: the temporary file stays, as after a crash */
    if (e == 0)
        e = replace_file(tmp, path);
    if (e != 0)
        remove_file(tmp);
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

int ddo__os_append(const char *path, const void *data, size_t len, bool *opened)
{
    *opened = false;
    wchar_t *w = ddo__win_wide(path);
    if (w == NULL)
        return errno;
    /* FILE_APPEND_DATA without FILE_WRITE_DATA: every write goes to the current end. */
    HANDLE h = CreateFileW(w, FILE_APPEND_DATA | SYNCHRONIZE,
                           FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, NULL,
                           OPEN_ALWAYS, FILE_ATTRIBUTE_NORMAL, NULL);
    DWORD err = GetLastError();
    free(w);
    if (h == INVALID_HANDLE_VALUE)
        return ddo__win_errno(err);
    if (GetFileType(h) != FILE_TYPE_DISK) {
        CloseHandle(h);
        return DDO__OS_NOT_REGULAR;
    }
    *opened = true;
    int e = 0;
    const char *p = data;
    while (len > 0 && e == 0) {
        DWORD piece = len > (1u << 30) ? (1u << 30) : (DWORD)len, done = 0;
        if (!WriteFile(h, p, piece, &done, NULL))
            e = ddo__win_errno(GetLastError());
        else if (done == 0)
            e = EIO;
        p += done;
        len -= done;
    }
    CloseHandle(h);
    return e;
}

int ddo__os_lock_file(const char *path, unsigned timeout_ms, int *fd)
{
    int f;
    int oe = ddo__os_open_regular(path, O_RDWR | O_CREAT, 0644, &f);
    if (oe != 0)
        return oe == EISDIR ? DDO__OS_NOT_REGULAR : oe;
    HANDLE h = ddo__win_handle(f);
    /* Poll: a holder that never lets go is reported instead of waited on forever. */
    for (unsigned waited = 0;; waited += 5) {
        OVERLAPPED ov;
        memset(&ov, 0, sizeof(ov));
        if (LockFileEx(h, LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY, 0, MAXDWORD,
                       MAXDWORD, &ov))
            break;
        DWORD err = GetLastError();
        if (err != ERROR_LOCK_VIOLATION || waited >= timeout_ms) {
            ddo__os_file_close(f);
            return err == ERROR_LOCK_VIOLATION ? DDO__OS_LOCK_TIMEOUT : ddo__win_errno(err);
        }
        Sleep(5);
    }
    *fd = f;
    return 0;
}

void ddo__os_unlock_file(int fd)
{
    ddo__os_file_close(fd); /* closing the handle releases its locks */
}

/* Creates one directory; an existing directory is fine, an existing file is ENOTDIR. */
static int make_dir(const char *d)
{
    wchar_t *w = ddo__win_wide(d);
    if (w == NULL)
        return errno;
    int e = 0;
    if (!CreateDirectoryW(w, NULL)) {
        DWORD err = GetLastError();
        DWORD attr = GetFileAttributesW(w);
        if (attr == INVALID_FILE_ATTRIBUTES)
            e = ddo__win_errno(err);
        else if (!(attr & FILE_ATTRIBUTE_DIRECTORY))
            e = ENOTDIR;
    }
    free(w);
    return e;
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
        if (*p != '/' && *p != '\\' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        /* "C:" is a drive, not a directory to create */
        bool drive = strlen(d) == 2 && d[1] == ':';
        if (!drive && (e = make_dir(d)) != 0)
            break;
        *p = c;
        if (c == '\0')
            break;
    }
    free(d);
    return e;
}

int ddo__os_dir_writable(const char *dir)
{
    wchar_t *w = ddo__win_wide(dir);
    if (w == NULL)
        return errno;
    DWORD attr = GetFileAttributesW(w);
    DWORD err = GetLastError();
    free(w);
    if (attr == INVALID_FILE_ATTRIBUTES)
        return ddo__win_errno(err);
    if (!(attr & FILE_ATTRIBUTE_DIRECTORY))
        return ENOTDIR;
    /* ACLs decide: try to create a file there, which deletes itself on close. */
    char probe[4200];
    int n = snprintf(probe, sizeof(probe), "%s\\.ddo-probe-%016llx", dir,
                     (unsigned long long)random_tag());
    if (n < 0 || (size_t)n >= sizeof(probe))
        return ENAMETOOLONG;
    wchar_t *wp = ddo__win_wide(probe);
    if (wp == NULL)
        return errno;
    HANDLE h = CreateFileW(wp, GENERIC_WRITE, 0, NULL, CREATE_NEW,
                           FILE_ATTRIBUTE_TEMPORARY | FILE_FLAG_DELETE_ON_CLOSE, NULL);
    err = GetLastError();
    free(wp);
    if (h == INVALID_HANDLE_VALUE)
        return ddo__win_errno(err);
    CloseHandle(h);
    return 0;
}

#endif /* _WIN32 */
