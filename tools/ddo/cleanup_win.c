/*
 * cleanup_win.c - removal of registered temporary paths on Windows (see cleanup.h): a console
 * control handler (Ctrl-C, Ctrl-Break, closing the console, logoff, shutdown) removes them and
 * lets the default handler end the process. The handler runs on a thread of its own, so the
 * table is guarded by a lock instead of blocked signals.
 */
#if defined(_WIN32)
#    include "cleanup.h"

#    include <string.h>
#    include <windows.h>

#    define SLOTS     8
#    define PATH_SIZE 4096

static char paths[SLOTS][PATH_SIZE];
static int used[SLOTS]; /* 0 free, 1 file, 2 directory */
static bool installed;
static SRWLOCK lock = SRWLOCK_INIT;

static BOOL WINAPI on_control(DWORD type)
{
    (void)type;
    AcquireSRWLockExclusive(&lock);
    for (int i = SLOTS - 1; i >= 0; i--) {
        if (used[i] == 1)
            DeleteFileA(paths[i]);
        else if (used[i] == 2)
            RemoveDirectoryA(paths[i]);
        used[i] = 0;
    }
    ReleaseSRWLockExclusive(&lock);
    return FALSE; /* the next handler (the default one) ends the process */
}

int tool_cleanup_add(const char *path, bool is_dir)
{
    if (path == NULL || strlen(path) >= PATH_SIZE)
        return -1;
    AcquireSRWLockExclusive(&lock);
    if (!installed)
        installed = SetConsoleCtrlHandler(on_control, TRUE) != 0;
    /* A new path takes the slot above every used one: removed before what holds it. */
    int top = -1;
    for (int i = 0; i < SLOTS; i++)
        if (used[i] != 0)
            top = i;
    int slot = top + 1 < SLOTS ? top + 1 : -1;
    if (slot >= 0) {
        memcpy(paths[slot], path, strlen(path) + 1);
        used[slot] = is_dir ? 2 : 1;
    }
    ReleaseSRWLockExclusive(&lock);
    return slot;
}

void tool_cleanup_forget(int slot)
{
    if (slot < 0 || slot >= SLOTS)
        return;
    AcquireSRWLockExclusive(&lock);
    used[slot] = 0;
    ReleaseSRWLockExclusive(&lock);
}

/* Deferring takes the lock, so the handler waits until the section ends. */
void tool_signals_defer(tool_sigmask *old)
{
    (void)old;
    AcquireSRWLockExclusive(&lock);
}

void tool_signals_resume(const tool_sigmask *old)
{
    (void)old;
    ReleaseSRWLockExclusive(&lock);
}

#endif /* _WIN32 */
