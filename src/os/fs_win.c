/*
 * fs_win.c - the library's own small files on Windows, the system calls under fs_common.c:
 * positioned reads for the bounded reads, atomic replacement (a named temporary file in the
 * same directory, flushed, then MoveFileExW with MOVEFILE_REPLACE_EXISTING, retried while
 * another process holds the old file without FILE_SHARE_DELETE, as virus scanners and
 * indexers do), appends with FILE_APPEND_DATA (one WriteFile each, so concurrent lines stay
 * whole) and LockFileEx locks.
 */
#if defined(_WIN32)
#    include "os/fs.h"

#    include "os/file.h"
#    include "os/fs_impl.h"
#    include "os/win.h"

#    include <bcrypt.h>
#    include <errno.h>
#    include <fcntl.h>
#    include <io.h>
#    include <stdint.h>
#    include <stdio.h>
#    include <stdlib.h>
#    include <string.h>

int64_t ddo__os_fs_read_at(int fd, void *dst, size_t len, uint64_t offset)
{
    return ddo__win_pread(fd, dst, len, offset);
}

uint64_t ddo__os_fs_random_tag(void)
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
    int e = ddo__os_fs_temp_name(path, tmp, sizeof(tmp));
    if (e != 0)
        return e;
    int fd;
    e = ddo__os_open_regular(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644, &fd);
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
                     (unsigned long long)ddo__os_fs_random_tag());
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
