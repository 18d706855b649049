/*
 * compat.h - the few POSIX spellings the tool uses that Windows (mingw-w64) lacks or spells
 * differently: open flags, the processor count, mkdtemp, lstat and the temporary directory.
 * Elsewhere these are the POSIX calls themselves.
 */
#ifndef DDO_TOOL_COMPAT_H
#define DDO_TOOL_COMPAT_H

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

#if defined(_WIN32)
/* Every open of the tool passes O_CLOEXEC: binary mode goes with it (no CRLF, no ^Z). */
#    ifndef O_CLOEXEC
#        define O_CLOEXEC (_O_NOINHERIT | _O_BINARY)
#    endif
/* Windows has no FIFOs to block on and no symbolic links in the tool's paths. */
#    ifndef O_NONBLOCK
#        define O_NONBLOCK 0
#    endif
#    ifndef O_NOFOLLOW
#        define O_NOFOLLOW 0
#    endif
#    define lstat stat
/* The environment as ddo_config_apply_env takes it. */
#    define TOOL_ENVIRON ((const char *const *)_environ)
/* dlopen & co. for the cuBLASLt loader (host_cuda.c), on LoadLibraryExW/GetProcAddress. */
#    define RTLD_NOW   2
#    define RTLD_LOCAL 0
void *dlopen(const char *name, int flags);
void *dlsym(void *lib, const char *name);
char *dlerror(void);
/* read() and write() take an unsigned count: at most 1 GiB a call (callers loop). */
#    define TOOL_IO_COUNT(n) ((unsigned)((n) > (1u << 30) ? (1u << 30) : (n)))

#else
#    define TOOL_IO_COUNT(n) (n)
extern char **environ;
#    define TOOL_ENVIRON     ((const char *const *)environ)

#endif

/* The number of online processors (sysconf(_SC_NPROCESSORS_ONLN)). */
long tool_ncpu(void);
/* mkdtemp(3): the trailing XXXXXX of tmpl replaced, the directory created; NULL on failure. */
char *tool_mkdtemp(char *tmpl);
/* The directory for temporary files: TMPDIR (Windows: then TEMP, TMP), else /tmp (Windows:
 * the current directory). */
const char *tool_tmpdir(void);
/* rename(2): replaces an existing target (Windows: MoveFileExA with REPLACE_EXISTING, which
 * the CRT's rename does not do). 0, or -1 with errno set. */
int tool_rename(const char *from, const char *to);

#endif /* DDO_TOOL_COMPAT_H */
