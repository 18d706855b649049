/*
 * compat.c - the tool's portable spellings of a few POSIX calls (compat.h).
 */
#include "compat.h"

#include <stdio.h>

#if defined(_WIN32)
#    include <direct.h>
#    include <errno.h>
#    include <stdio.h>
#    include <string.h>
#    include <windows.h>

long tool_ncpu(void)
{
    return (long)GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);
}

/* mkdtemp: the trailing XXXXXX replaced by random letters, the directory created. */
char *tool_mkdtemp(char *tmpl)
{
    size_t n = strlen(tmpl);
    if (n < 6 || strcmp(tmpl + n - 6, "XXXXXX") != 0) {
        errno = EINVAL;
        return NULL;
    }
    static const char set[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    for (int attempt = 0; attempt < 100; attempt++) {
        LARGE_INTEGER t;
        QueryPerformanceCounter(&t);
        unsigned long long r = (unsigned long long)t.QuadPart * 6364136223846793005ULL +
                               (unsigned long long)GetCurrentProcessId() + (unsigned)attempt;
        for (size_t i = 0; i < 6; i++, r /= 36)
            tmpl[n - 6 + i] = set[r % 36];
        if (_mkdir(tmpl) == 0)
            return tmpl;
        if (errno != EEXIST)
            return NULL;
    }
    return NULL;
}

int tool_rename(const char *from, const char *to)
{
    if (MoveFileExA(from, to, MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH))
        return 0;
    DWORD e = GetLastError();
    errno = e == ERROR_FILE_NOT_FOUND || e == ERROR_PATH_NOT_FOUND ? ENOENT : EACCES;
    return -1;
}

static char dl_error[128];

void *dlopen(const char *name, int flags)
{
    (void)flags;
    /* A full path's own folder is searched for its dependencies too. */
    DWORD search = LOAD_LIBRARY_SEARCH_DEFAULT_DIRS;
    if (strchr(name, '\\') != NULL || strchr(name, '/') != NULL)
        search |= LOAD_LIBRARY_SEARCH_DLL_LOAD_DIR;
    HMODULE m = LoadLibraryExA(name, NULL, search);
    if (m == NULL)
        snprintf(dl_error, sizeof(dl_error), "%s: LoadLibraryExA: error %lu", name,
                 (unsigned long)GetLastError());
    return (void *)m;
}

void *dlsym(void *lib, const char *name)
{
    FARPROC p = GetProcAddress((HMODULE)lib, name);
    void *v;
    memcpy(&v, &p, sizeof(v));
    return v;
}

char *dlerror(void)
{
    return dl_error;
}

const char *tool_tmpdir(void)
{
    const char *names[] = { "TMPDIR", "TEMP", "TMP" };
    for (size_t i = 0; i < 3; i++) {
        const char *v = getenv(names[i]);
        if (v != NULL && *v)
            return v;
    }
    return ".";
}
#else
#    include <unistd.h>

long tool_ncpu(void)
{
    return sysconf(_SC_NPROCESSORS_ONLN);
}

char *tool_mkdtemp(char *tmpl)
{
    return mkdtemp(tmpl);
}

int tool_rename(const char *from, const char *to)
{
    return rename(from, to);
}

const char *tool_tmpdir(void)
{
    const char *v = getenv("TMPDIR");
    return v != NULL && *v ? v : "/tmp";
}
#endif
