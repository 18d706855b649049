/*
 * dll_load.c - a Windows program that loads libddo.dll at run time, as a host does (ctypes,
 * LoadLibrary), resolves ddo_version_string and ddo_config_create/destroy by name and calls
 * them: the DLL exports the API and runs on its own (libgcc and winpthreads inside). Built and
 * run only in Windows builds (under Wine in CI). Exit 0 when all of it worked.
 *
 *     dll_load [PATH]    PATH: the DLL to load (tools/windows/check-wheel.sh gives the one of the
 *                        unpacked wheel); default libddo.dll beside this program.
 */
#include <stdio.h>
#include <string.h>
#include <windows.h>

typedef const char *(*version_fn)(void);
typedef int (*create_fn)(void **);
typedef void (*destroy_fn)(void *);

static void *sym(HMODULE m, const char *name)
{
    FARPROC p = GetProcAddress(m, name);
    void *v;
    memcpy(&v, &p, sizeof(v));
    if (v == NULL)
        fprintf(stderr, "dll_load: libddo.dll has no %s\n", name);
    return v;
}

/* By full path, as the Python binding loads it: argv[1], else this program's directory. */
static int dll_path(int argc, char **argv, char *path, size_t len)
{
    if (argc > 1) {
        if (strlen(argv[1]) >= len)
            return -1;
        strcpy(path, argv[1]);
        return 0;
    }
    DWORD n = GetModuleFileNameA(NULL, path, (DWORD)len);
    char *slash = n > 0 ? strrchr(path, '\\') : NULL;
    if (slash == NULL || (size_t)(slash - path) + sizeof("\\libddo.dll") > len)
        return -1;
    strcpy(slash, "\\libddo.dll");
    return 0;
}

int main(int argc, char **argv)
{
    char path[MAX_PATH];
    if (dll_path(argc, argv, path, sizeof(path)) != 0)
        return 2;
    HMODULE m = LoadLibraryExA(path, NULL, LOAD_WITH_ALTERED_SEARCH_PATH);
    if (m == NULL) {
        fprintf(stderr, "dll_load: LoadLibraryExA(%s): error %lu\n", path,
                (unsigned long)GetLastError());
        return 1;
    }
    version_fn version = (version_fn)sym(m, "ddo_version_string");
    create_fn create = (create_fn)sym(m, "ddo_config_create");
    destroy_fn destroy = (destroy_fn)sym(m, "ddo_config_destroy");
    if (version == NULL || create == NULL || destroy == NULL)
        return 1;
    void *cfg = NULL;
    int rc = create(&cfg);
    printf("%s: ddo %s, ddo_config_create: %d\n", path, version(), rc);
    if (rc != 0 || cfg == NULL || strcmp(version(), DDO_EXPECTED_VERSION) != 0)
        return 1;
    destroy(cfg);
    FreeLibrary(m);
    return 0;
}
