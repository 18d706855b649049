/*
 * win.h - helpers shared by the Windows platform files (*_win.c): UTF-8 paths to UTF-16,
 * Win32 errors to errno values, and the HANDLE behind a descriptor. Windows only.
 */
#ifndef DDO_OS_WIN_H
#define DDO_OS_WIN_H

#if defined(_WIN32)
#    ifndef WIN32_LEAN_AND_MEAN
#        define WIN32_LEAN_AND_MEAN
#    endif
#    include <windows.h>

#    include <stdint.h>

/* path (UTF-8) as a new UTF-16 string (free with free()); NULL with errno set. */
wchar_t *ddo__win_wide(const char *path);
/* A UTF-16 string as new UTF-8 (free with free()); NULL on failure. */
char *ddo__win_narrow(const wchar_t *w);
/* The errno value that best says what a Win32 error code means. */
int ddo__win_errno(DWORD err);
/* The HANDLE of a descriptor from the opens of file_win.c; INVALID_HANDLE_VALUE if none. */
HANDLE ddo__win_handle(int fd);
/* A HANDLE wrapped as a CRT descriptor (the descriptor owns it). 0 or an errno value. */
int ddo__win_wrap(HANDLE h, int *fd);
/* One positioned read of at most 1 GiB (file_win.c): bytes read, 0 at the end, or -errno. */
int64_t ddo__win_pread(int fd, void *dst, size_t len, uint64_t offset);
/* 100 ns FILETIME units since 1601 to ns since 1970 (0 for earlier times). */
uint64_t ddo__win_time_ns(int64_t filetime);

#endif /* _WIN32 */
#endif /* DDO_OS_WIN_H */
