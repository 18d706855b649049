/*
 * cleanup.h - files and directories the tool must not leave behind when it is
 * interrupted: while registered, SIGINT, SIGTERM and SIGHUP remove them (newest
 * first) and then end the process with the same signal (its default action), so
 * the exit status still says what happened.
 */
#ifndef DDO_TOOL_CLEANUP_H
#define DDO_TOOL_CLEANUP_H

#include <stdbool.h>

/* Registers path (a file, or an empty directory when is_dir) for removal on a signal.
 * Returns a slot for tool_cleanup_forget, or -1 when the path is too long or all slots are
 * taken (then nothing is registered). Installs the handlers on first use. */
int tool_cleanup_add(const char *path, bool is_dir);
/* Unregisters a slot (the path stays on disk); -1 is a no-op. */
void tool_cleanup_forget(int slot);

/* A saved signal mask (a sigset_t, kept opaque so callers need no POSIX feature macros). */
typedef struct tool_sigmask {
    _Alignas(16) unsigned char bytes[256];
} tool_sigmask;
/* Defers SIGINT, SIGTERM and SIGHUP while a file is being replaced (a pending signal is
 * delivered by tool_signals_resume); old receives the previous mask. */
void tool_signals_defer(tool_sigmask *old);
void tool_signals_resume(const tool_sigmask *old);

#endif /* DDO_TOOL_CLEANUP_H */
