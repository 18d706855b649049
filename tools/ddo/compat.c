/*
 * compat.c - the tool's portable spellings of a few POSIX calls (compat.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "compat.h"

#if defined(_WIN32)
#    include <direct.h>
#    include <errno.h>
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

const char *tool_tmpdir(void)
{
    const char *v = getenv("TMPDIR");
    return v != NULL && *v ? v : "/tmp";
}
#endif
