/*
 * dl_win.c - shared libraries on Windows (dl.h): LoadLibraryExW with a safe search path,
 * GetProcAddress, FreeLibrary.
 */
#if defined(_WIN32)
#    include "os/dl.h"
#    include "os/win.h"

#    include <stdbool.h>
#    include <stdio.h>
#    include <stdlib.h>
#    include <string.h>
#    include <wchar.h>

void *ddo__os_lib_open(const char *path, char *err, size_t err_len)
{
    wchar_t *w = ddo__win_wide(path);
    if (w == NULL) {
        snprintf(err, err_len, "not a UTF-8 path");
        return NULL;
    }
    /* A bare name (nvcuda.dll) comes from System32 or beside the program, never from the
     * current directory; a path is loaded with its own directory searched for dependencies. */
    bool bare = wcschr(w, L'\\') == NULL;
    DWORD flags = bare ? LOAD_LIBRARY_SEARCH_DEFAULT_DIRS
                       : LOAD_LIBRARY_SEARCH_DLL_LOAD_DIR | LOAD_LIBRARY_SEARCH_DEFAULT_DIRS;
    HMODULE m = LoadLibraryExW(w, NULL, flags);
    DWORD e = GetLastError();
    free(w);
    if (m == NULL && err_len > 0) {
        char msg[256] = "";
        FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, NULL, e, 0, msg,
                       sizeof(msg), NULL);
        size_t n = strlen(msg);
        while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r' || msg[n - 1] == ' '))
            msg[--n] = '\0';
        snprintf(err, err_len, "LoadLibraryExW: error %lu%s%s", (unsigned long)e, n ? ": " : "",
                 msg);
    }
    return (void *)m;
}

void *ddo__os_lib_sym(void *lib, const char *name)
{
    FARPROC p = GetProcAddress((HMODULE)lib, name);
    void *v;
    memcpy(&v, &p, sizeof(v));
    return v;
}

void ddo__os_lib_close(void *lib)
{
    if (lib != NULL)
        FreeLibrary((HMODULE)lib);
}

#endif /* _WIN32 */
