/*
 * dl.c - shared libraries on POSIX systems (dl.h): dlopen, dlsym, dlclose.
 */
#if !defined(_WIN32)
#    include "os/dl.h"

#    include <dlfcn.h>
#    include <stdio.h>

void *ddo__os_lib_open(const char *path, char *err, size_t err_len)
{
    dlerror();
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL && err_len > 0) {
        const char *e = dlerror();
        snprintf(err, err_len, "%s", e != NULL ? e : "unknown error");
    }
    return lib;
}

void *ddo__os_lib_sym(void *lib, const char *name)
{
    return dlsym(lib, name);
}

void ddo__os_lib_close(void *lib)
{
    if (lib != NULL)
        dlclose(lib);
}

#endif /* !_WIN32 */
