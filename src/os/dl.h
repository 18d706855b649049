/*
 * dl.h - shared libraries loaded at run time: dlopen/dlsym on POSIX systems (dl.c),
 * LoadLibraryExW/GetProcAddress on Windows (dl_win.c). The cuda device loads its driver through
 * it; nothing outside os/ calls the system's loader.
 */
#ifndef DDO_OS_DL_H
#define DDO_OS_DL_H

#include <stddef.h>

/* Loads the library at path (a bare name is searched the system's way: Windows searches the
 * application's directory and System32 only). NULL with the reason in err. */
void *ddo__os_lib_open(const char *path, char *err, size_t err_len);
/* A symbol of a loaded library; NULL when it has none. */
void *ddo__os_lib_sym(void *lib, const char *name);
void ddo__os_lib_close(void *lib);

#endif /* DDO_OS_DL_H */
