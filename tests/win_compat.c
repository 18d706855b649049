/*
 * win_compat.c - the Windows spellings of the tests' POSIX fixture calls (win_compat.h).
 */
#if defined(_WIN32)
#    include "win_compat.h"

#    include <windows.h>

char *ddo_t_mkdtemp(char *tmpl)
{
    size_t n = strlen(tmpl);
    if (n < 6)
        return NULL;
    static unsigned counter;
    for (int attempt = 0; attempt < 1000; attempt++) {
        LARGE_INTEGER t;
        QueryPerformanceCounter(&t);
        unsigned long long r = (unsigned long long)t.QuadPart * 6364136223846793005ULL +
                               GetCurrentProcessId() * 7919ULL + counter++;
        for (size_t i = 0; i < 6; i++, r /= 36)
            tmpl[n - 6 + i] = "abcdefghijklmnopqrstuvwxyz0123456789"[r % 36];
        if (_mkdir(tmpl) == 0)
            return tmpl;
        if (errno != EEXIST)
            return NULL;
    }
    return NULL;
}

long ddo_t_sysconf(int name)
{
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    return name == _SC_PAGESIZE ? (long)si.dwPageSize : (long)si.dwNumberOfProcessors;
}

ssize_t ddo_t_prw(int fd, void *buf, size_t n, int64_t off, int write)
{
    HANDLE h = (HANDLE)_get_osfhandle(fd);
    OVERLAPPED ov;
    memset(&ov, 0, sizeof(ov));
    ov.Offset = (DWORD)off;
    ov.OffsetHigh = (DWORD)((uint64_t)off >> 32);
    DWORD got = 0, len = n > (1u << 30) ? (1u << 30) : (DWORD)n;
    BOOL ok = write ? WriteFile(h, buf, len, &got, &ov) : ReadFile(h, buf, len, &got, &ov);
    if (!ok && GetLastError() == ERROR_HANDLE_EOF)
        return 0;
    if (!ok) {
        errno = EIO;
        return -1;
    }
    return (ssize_t)got;
}

int ddo_t_unsupported(void)
{
    errno = ENOSYS;
    return -1;
}

int ddo_t_copy(const char *from, const char *to)
{
    if (CopyFileA(from, to, TRUE))
        return 0;
    errno = GetLastError() == ERROR_FILE_EXISTS ? EEXIST : ENOENT;
    return -1;
}

int ddo_t_rename(const char *from, const char *to)
{
    if (MoveFileExA(from, to, MOVEFILE_REPLACE_EXISTING))
        return 0;
    errno = EACCES;
    return -1;
}

int ddo_t_utimensat(int dirfd, const char *path, const struct timespec ts[2], int fl)
{
    (void)dirfd;
    (void)fl;
    HANDLE h = CreateFileA(path, FILE_WRITE_ATTRIBUTES,
                           FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, NULL,
                           OPEN_EXISTING, FILE_FLAG_BACKUP_SEMANTICS, NULL);
    if (h == INVALID_HANDLE_VALUE) {
        errno = ENOENT;
        return -1;
    }
    uint64_t t =
        (uint64_t)ts[1].tv_sec * 10000000u + (uint64_t)ts[1].tv_nsec / 100u + 116444736000000000ULL;
    FILETIME ft = { (DWORD)t, (DWORD)(t >> 32) };
    BOOL ok = SetFileTime(h, NULL, &ft, &ft);
    CloseHandle(h);
    return ok ? 0 : -1;
}

#endif /* _WIN32 */
