/*
 * cleanup.c - removal of registered temporary paths on SIGINT, SIGTERM and
 * SIGHUP (see cleanup.h). The handler only calls async-signal-safe functions
 * (unlink, rmdir, sigaction, raise) on data written with the signals blocked.
 */
#include "cleanup.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#define SLOTS     8
#define PATH_SIZE 4096

static char paths[SLOTS][PATH_SIZE];
static volatile sig_atomic_t used[SLOTS]; /* 0 free, 1 file, 2 directory */
static bool installed;

static const int signals[] = { SIGINT, SIGTERM, SIGHUP };

static void on_signal(int sig)
{
    for (int i = SLOTS - 1; i >= 0; i--) {
        if (used[i] == 1)
            unlink(paths[i]);
        else if (used[i] == 2)
            rmdir(paths[i]);
        used[i] = 0;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
    /* The signal is blocked while its handler runs: raised now, it is delivered on return
     * with the default action. */
    raise(sig);
}

static void block(sigset_t *old)
{
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++)
        sigaddset(&set, signals[i]);
    sigprocmask(SIG_BLOCK, &set, old);
}

int tool_cleanup_add(const char *path, bool is_dir)
{
    if (path == NULL || strlen(path) >= PATH_SIZE)
        return -1;
    sigset_t old;
    block(&old);
    if (!installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++) {
            struct sigaction prev;
            /* A signal the caller chose to ignore (nohup) stays ignored. */
            if (sigaction(signals[i], NULL, &prev) == 0 && prev.sa_handler == SIG_IGN)
                continue;
            sigaction(signals[i], &sa, NULL);
        }
        installed = true;
    }
    /* A new path takes the slot above every used one, so the handler (which walks down)
     * removes it first: a file before the directory that holds it. */
    int top = -1;
    for (int i = 0; i < SLOTS; i++)
        if (used[i] != 0)
            top = i;
    int slot = top + 1 < SLOTS ? top + 1 : -1;
    if (slot >= 0) {
        memcpy(paths[slot], path, strlen(path) + 1);
        used[slot] = is_dir ? 2 : 1;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    return slot;
}

void tool_cleanup_forget(int slot)
{
    if (slot < 0 || slot >= SLOTS)
        return;
    sigset_t old;
    block(&old);
    used[slot] = 0;
    sigprocmask(SIG_SETMASK, &old, NULL);
}

_Static_assert(sizeof(sigset_t) <= sizeof(tool_sigmask), "tool_sigmask is too small");

void tool_signals_defer(tool_sigmask *old)
{
    block((sigset_t *)(void *)old->bytes);
}

void tool_signals_resume(const tool_sigmask *old)
{
    sigprocmask(SIG_SETMASK, (const sigset_t *)(const void *)old->bytes, NULL);
}
