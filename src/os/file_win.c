/*
 * file_win.c - checkpoint file access on Windows: CreateFileW on UTF-16 paths (shared for
 * reading, writing and deletion, so a reader never blocks a writer's replace), identity from
 * GetFileInformationByHandleEx (volume serial, file id, size, last-write and change times at
 * 100 ns), positioned ReadFile/WriteFile with an OVERLAPPED offset (64-bit, no shared file
 * position), read-only mappings (CreateFileMappingW + MapViewOfFile) and direct opens
 * (FILE_FLAG_NO_BUFFERING). Handles are wrapped in CRT descriptors (_open_osfhandle), so the
 * interface of file.h stays the one of POSIX systems.
 */
#if defined(_WIN32)
#    include "os/file.h"
#    include "os/win.h"

#    include <errno.h>
#    include <fcntl.h>
#    include <io.h>
#    include <stdlib.h>
#    include <string.h>

/* Largest single ReadFile/WriteFile: the count is a DWORD. */
#    define PIECE_BYTES ((size_t)1 << 30)

/* CreateFileW's arguments for open(2)-style flags. */
static void open_args(int flags, DWORD *access, DWORD *disposition)
{
    int acc = flags & (O_RDONLY | O_WRONLY | O_RDWR);
    *access = acc == O_WRONLY ? GENERIC_WRITE
              : acc == O_RDWR ? GENERIC_READ | GENERIC_WRITE
                              : GENERIC_READ;
    if ((flags & O_CREAT) && (flags & O_EXCL))
        *disposition = CREATE_NEW;
    else if ((flags & O_CREAT) && (flags & O_TRUNC))
        *disposition = CREATE_ALWAYS;
    else if (flags & O_CREAT)
        *disposition = OPEN_ALWAYS;
    else if (flags & O_TRUNC)
        *disposition = TRUNCATE_EXISTING;
    else
        *disposition = OPEN_EXISTING;
}

/* Opens path with CreateFileW's flags; regular files only (EISDIR, DDO__OS_NOT_REGULAR). */
static int open_handle(const char *path, int flags, DWORD extra, HANDLE *out)
{
    wchar_t *w = ddo__win_wide(path);
    if (w == NULL)
        return errno;
    DWORD attr = GetFileAttributesW(w);
    if (attr != INVALID_FILE_ATTRIBUTES && (attr & FILE_ATTRIBUTE_DIRECTORY)) {
        free(w);
        return EISDIR;
    }
    DWORD access, disposition;
    open_args(flags, &access, &disposition);
    /* Read-only handles are overlapped: the read engine keeps several reads in flight on
     * them (read_win.c); the positioned reads below wait for their own completion. */
    if ((flags & (O_WRONLY | O_RDWR)) == 0)
        extra |= FILE_FLAG_OVERLAPPED;
    HANDLE h = CreateFileW(w, access, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, NULL,
                           disposition, FILE_ATTRIBUTE_NORMAL | extra, NULL);
    DWORD err = GetLastError();
    free(w);
    if (h == INVALID_HANDLE_VALUE)
        return ddo__win_errno(err);
    if (GetFileType(h) != FILE_TYPE_DISK) {
        CloseHandle(h);
        return DDO__OS_NOT_REGULAR; /* a pipe, console or device (NUL, CON, COM1...) */
    }
    if ((flags & O_APPEND) && SetFilePointerEx(h, (LARGE_INTEGER){ 0 }, NULL, FILE_END) == 0) {
        err = GetLastError();
        CloseHandle(h);
        return ddo__win_errno(err);
    }
    *out = h;
    return 0;
}

int ddo__os_open_regular(const char *path, int flags, unsigned mode, int *fd)
{
    (void)mode; /* Windows files carry ACLs, not modes */
    HANDLE h;
    int e = open_handle(path, flags, 0, &h);
    if (e != 0)
        return e;
    return ddo__win_wrap(h, fd);
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
    HANDLE h;
    int e = open_handle(path, O_RDONLY, FILE_FLAG_NO_BUFFERING, &h);
    if (e != 0)
        return e;
    return ddo__win_wrap(h, fd);
}

void ddo__os_file_close(int fd)
{
    if (fd >= 0)
        _close(fd); /* closes the wrapped handle */
}

static int handle_identity(HANDLE h, ddo__file_id *id, bool *delete_pending)
{
    FILE_BASIC_INFO basic;
    FILE_STANDARD_INFO std;
    BY_HANDLE_FILE_INFORMATION bh;
    if (!GetFileInformationByHandleEx(h, FileBasicInfo, &basic, sizeof(basic)) ||
        !GetFileInformationByHandleEx(h, FileStandardInfo, &std, sizeof(std)) ||
        !GetFileInformationByHandle(h, &bh))
        return ddo__win_errno(GetLastError());
    memset(id, 0, sizeof(*id));
    id->dev = bh.dwVolumeSerialNumber;
    id->ino = ((uint64_t)bh.nFileIndexHigh << 32) | bh.nFileIndexLow;
    FILE_ID_INFO fid; /* 128-bit ids (ReFS): fold both halves in */
    if (GetFileInformationByHandleEx(h, FileIdInfo, &fid, sizeof(fid))) {
        uint64_t lo, hi;
        memcpy(&lo, fid.FileId.Identifier, 8);
        memcpy(&hi, fid.FileId.Identifier + 8, 8);
        id->dev = fid.VolumeSerialNumber;
        id->ino = lo ^ hi;
    }
    id->size = std.EndOfFile.QuadPart < 0 ? 0 : (uint64_t)std.EndOfFile.QuadPart;
    id->mtime_ns = ddo__win_time_ns(basic.LastWriteTime.QuadPart);
    id->ctime_ns = ddo__win_time_ns(basic.ChangeTime.QuadPart);
    id->regular = !std.Directory && GetFileType(h) == FILE_TYPE_DISK;
    *delete_pending = std.DeletePending != 0;
    return 0;
}

int ddo__os_file_identity(int fd, ddo__file_id *id)
{
    HANDLE h = ddo__win_handle(fd);
    if (h == INVALID_HANDLE_VALUE)
        return EBADF;
    bool pending;
    return handle_identity(h, id, &pending);
}

int ddo__os_path_identity(const char *path, ddo__file_id *id)
{
    wchar_t *w = ddo__win_wide(path);
    if (w == NULL)
        return errno;
    /* No access rights needed for the attributes; BACKUP_SEMANTICS opens directories too. */
    HANDLE h =
        CreateFileW(w, FILE_READ_ATTRIBUTES, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                    NULL, OPEN_EXISTING, FILE_FLAG_BACKUP_SEMANTICS, NULL);
    DWORD err = GetLastError();
    free(w);
    if (h == INVALID_HANDLE_VALUE)
        return ddo__win_errno(err);
    bool pending = false;
    int e = handle_identity(h, id, &pending);
    CloseHandle(h);
    /* Deleted while another handle holds it open: the name goes with the last handle, but
     * the file is removed already (a POSIX unlink). */
    return e == 0 && pending ? ENOENT : e;
}

bool ddo__os_file_id_equal(const ddo__file_id *a, const ddo__file_id *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns && a->regular == b->regular;
}

/* One event per thread for the positioned calls below (never shared between calls). */
static HANDLE thread_event(void)
{
    static _Thread_local HANDLE ev;
    if (ev == NULL)
        ev = CreateEventW(NULL, TRUE, FALSE, NULL);
    return ev;
}

/* One ReadFile or WriteFile of n bytes at offset, waited for: bytes moved (0 at the end of the
 * file), or -errno. Works on overlapped and synchronous handles alike. */
static int64_t positioned(HANDLE h, bool write, void *p, DWORD n, uint64_t offset)
{
    OVERLAPPED ov;
    memset(&ov, 0, sizeof(ov));
    ov.Offset = (DWORD)offset;
    ov.OffsetHigh = (DWORD)(offset >> 32);
    ov.hEvent = thread_event();
    if (ov.hEvent == NULL)
        return -ENOMEM;
    DWORD got = 0;
    BOOL ok = write ? WriteFile(h, p, n, NULL, &ov) : ReadFile(h, p, n, NULL, &ov);
    DWORD err = ok ? 0 : GetLastError();
    if (ok || err == ERROR_IO_PENDING) {
        ok = GetOverlappedResult(h, &ov, &got, TRUE);
        err = ok ? 0 : GetLastError();
    }
    if (!ok)
        return err == ERROR_HANDLE_EOF ? 0 : -(int64_t)ddo__win_errno(err);
    return (int64_t)got;
}

int64_t ddo__win_pread(int fd, void *dst, size_t len, uint64_t offset)
{
    HANDLE h = ddo__win_handle(fd);
    if (h == INVALID_HANDLE_VALUE)
        return -EBADF;
    return positioned(h, false, dst, (DWORD)(len < PIECE_BYTES ? len : PIECE_BYTES), offset);
}

int ddo__os_pread_full(int fd, void *dst, size_t len, uint64_t offset)
{
    unsigned char *p = dst;
    while (len > 0) {
        if (offset > (uint64_t)INT64_MAX)
            return EOVERFLOW;
        int64_t n = ddo__win_pread(fd, p, len, offset);
        if (n < 0)
            return (int)-n;
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
    HANDLE h = ddo__win_handle(fd);
    if (h == INVALID_HANDLE_VALUE)
        return EBADF;
    const unsigned char *p = src;
    while (len > 0) {
        if (offset > (uint64_t)INT64_MAX)
            return EOVERFLOW;
        DWORD piece = (DWORD)(len < PIECE_BYTES ? len : PIECE_BYTES);
        int64_t n = positioned(h, true, (void *)(uintptr_t)p, piece, offset);
        if (n < 0)
            return (int)-n;
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
    HANDLE h = ddo__win_handle(fd);
    if (h == INVALID_HANDLE_VALUE)
        return EBADF;
    if (length > (uint64_t)INT64_MAX)
        return EOVERFLOW;
    FILE_END_OF_FILE_INFO eof;
    eof.EndOfFile.QuadPart = (LONGLONG)length;
    if (!SetFileInformationByHandle(h, FileEndOfFileInfo, &eof, sizeof(eof)))
        return ddo__win_errno(GetLastError());
    return 0;
}

int ddo__os_map_file(int fd, uint64_t size, const void **map)
{
    if (size == 0 || size > (uint64_t)SIZE_MAX)
        return EINVAL;
    HANDLE h = ddo__win_handle(fd);
    if (h == INVALID_HANDLE_VALUE)
        return EBADF;
    /* The mapping object may be closed at once: the view keeps the section. */
    HANDLE m = CreateFileMappingW(h, NULL, PAGE_READONLY, (DWORD)(size >> 32), (DWORD)size, NULL);
    if (m == NULL)
        return ddo__win_errno(GetLastError());
    void *v = MapViewOfFile(m, FILE_MAP_READ, 0, 0, (SIZE_T)size);
    DWORD err = GetLastError();
    CloseHandle(m);
    if (v == NULL)
        return ddo__win_errno(err);
    *map = v;
    return 0;
}

void ddo__os_unmap_file(const void *map, uint64_t size)
{
    if (map != NULL && size > 0)
        UnmapViewOfFile(map);
}

bool ddo__os_dir_has_suffix(const char *dir, const char *const *suffixes, size_t n)
{
    size_t dl = strlen(dir);
    char *pattern = malloc(dl + 3);
    if (pattern == NULL)
        return false;
    memcpy(pattern, dir, dl);
    memcpy(pattern + dl, "\\*", 3);
    wchar_t *w = ddo__win_wide(pattern);
    free(pattern);
    if (w == NULL)
        return false;
    WIN32_FIND_DATAW fd;
    HANDLE f = FindFirstFileExW(w, FindExInfoBasic, &fd, FindExSearchNameMatch, NULL, 0);
    free(w);
    if (f == INVALID_HANDLE_VALUE)
        return false;
    bool found = false;
    do {
        char *name = ddo__win_narrow(fd.cFileName);
        size_t len = name ? strlen(name) : 0;
        for (size_t i = 0; i < n && !found && name; i++) {
            size_t k = strlen(suffixes[i]);
            found = len >= k && strcmp(name + len - k, suffixes[i]) == 0;
        }
        free(name);
    } while (!found && FindNextFileW(f, &fd));
    FindClose(f);
    return found;
}

bool ddo__os_is_directory(const char *path)
{
    wchar_t *w = ddo__win_wide(path);
    if (w == NULL)
        return false;
    DWORD attr = GetFileAttributesW(w);
    free(w);
    return attr != INVALID_FILE_ATTRIBUTES && (attr & FILE_ATTRIBUTE_DIRECTORY);
}

char *ddo__os_realpath(const char *path)
{
    wchar_t *w = ddo__win_wide(path);
    if (w == NULL)
        return NULL;
    DWORD attr = GetFileAttributesW(w);
    if (attr == INVALID_FILE_ATTRIBUTES) { /* realpath: the path must exist */
        errno = ddo__win_errno(GetLastError());
        free(w);
        return NULL;
    }
    DWORD need = GetFullPathNameW(w, 0, NULL, NULL);
    wchar_t *full = need ? malloc(need * sizeof(wchar_t)) : NULL;
    char *out = NULL;
    if (full != NULL && GetFullPathNameW(w, need, full, NULL) > 0)
        out = ddo__win_narrow(full);
    if (out == NULL)
        errno = ENOMEM;
    free(full);
    free(w);
    return out;
}

int64_t ddo__os_cached_bytes(const char *path, uint64_t size)
{
    (void)path;
    (void)size;
    return -1; /* Windows has no mincore: the page cache cannot be asked */
}

void ddo__os_drop_cached(int fd, uint64_t off, uint64_t len)
{
    (void)fd;  /* no per-range eviction on Windows: the direct reader (FILE_FLAG_NO_BUFFERING) */
    (void)off; /* is the way past the standby list */
    (void)len;
}

void ddo__os_advise_huge(void *p, size_t len)
{
    (void)p; /* large pages need MEM_LARGE_PAGES at allocation and a privilege: no hint */
    (void)len;
}

#endif /* _WIN32 */
