/*
 * win_compat.h - the POSIX calls the tests use to set up their fixtures, spelled for Windows
 * (mingw-w64); implemented in win_compat.c. Force-included into every test, replay and bench
 * program of a Windows build (CMakeLists.txt); never used elsewhere. Fixtures that Windows
 * cannot make (FIFOs, sockets, fork, symbolic links) are skipped by the tests themselves,
 * each naming why.
 */
#ifndef DDO_TESTS_WIN_COMPAT_H
#define DDO_TESTS_WIN_COMPAT_H
#if defined(_WIN32)

/* First the headers that declare the names redefined below (no windows.h: its names, such
 * as CONTEXT, would collide with the tests' own). */
#    include <direct.h>
#    include <errno.h>
#    include <fcntl.h>
#    include <io.h>
#    include <stdint.h>
#    include <stdio.h>
#    include <stdlib.h>
#    include <string.h>
#    include <sys/stat.h>
#    include <sys/types.h>
#    include <time.h>
#    include <unistd.h>

#    define mkdir(path, mode) _mkdir(path)
char *ddo_t_mkdtemp(char *tmpl);
#    define mkdtemp                  ddo_t_mkdtemp
#    define realpath(path, resolved) _fullpath((resolved), (path), 4096)

#    define _SC_PAGESIZE         1
#    define _SC_NPROCESSORS_ONLN 2
long ddo_t_sysconf(int name);
#    define sysconf ddo_t_sysconf

/* Positioned I/O on a CRT descriptor (ReadFile/WriteFile with an OVERLAPPED offset). */
ssize_t ddo_t_prw(int fd, void *buf, size_t n, int64_t off, int write);
#    define pread(fd, buf, n, off)  ddo_t_prw(fd, buf, n, (int64_t)(off), 0)
#    define pwrite(fd, buf, n, off) ddo_t_prw(fd, (void *)(uintptr_t)(buf), n, (int64_t)(off), 1)

/* Windows has no FIFOs: mkfifo fails with ENOSYS. Symbolic links need a privilege there: the
 * tests link only to place a file under another name, so symlink copies it (CopyFileA). */
int ddo_t_unsupported(void);
#    define mkfifo(path, mode) ((void)(path), (void)(mode), ddo_t_unsupported())
int ddo_t_copy(const char *from, const char *to);
#    define symlink(from, to) ddo_t_copy(from, to)
/* rename(2) replaces an existing target; the CRT's refuses: MoveFileExA(REPLACE_EXISTING). */
int ddo_t_rename(const char *from, const char *to);
#    define rename(from, to) ddo_t_rename(from, to)

/* utimensat(AT_FDCWD, path, ts, 0): the last-write time set with SetFileTime. */
#    define AT_FDCWD (-100)
int ddo_t_utimensat(int dirfd, const char *path, const struct timespec ts[2], int flags);
#    define utimensat ddo_t_utimensat

#endif /* _WIN32 */
#endif /* DDO_TESTS_WIN_COMPAT_H */
