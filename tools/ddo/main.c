/*
 * main.c - the ddo tool's entry point: dispatches to one command per file.
 */
#include "tool.h"

#include <stdio.h>
#include <string.h>

#if defined(_WIN32)
#    include <fcntl.h>
#    include <io.h>
#    include <stdlib.h>
#    include <windows.h>

static UINT console_cp; /* the console's output code page before ddo set UTF-8's */

static void console_cp_restore(void)
{
    SetConsoleOutputCP(console_cp);
}

/* Ctrl-C, Ctrl-Break, a closed console: the code page back before the default handler (after
 * the cleanup's, tools/ddo/cleanup_win.c) ends the process. */
static BOOL WINAPI console_cp_on_control(DWORD type)
{
    (void)type;
    console_cp_restore();
    return FALSE;
}
#endif

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
};

static const struct command commands[] = {
#define DDO_TOOL_ROW_(name, help) { #name, ddo_cmd_##name, help },
    DDO_TOOL_COMMANDS(DDO_TOOL_ROW_)
#undef DDO_TOOL_ROW_
};

static void usage(FILE *out)
{
    fprintf(out, "usage: ddo COMMAND [ARGS]\n\n"
                 "ddo streams the weights of a safetensors checkpoint into device memory\n"
                 "just before they are needed, inside hard memory budgets.\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %s\n", commands[i].help);
    fprintf(out, "  version: print the version\n\n"
                 "Run `ddo COMMAND --help` for a command's options and `ddo config --list`\n"
                 "for every --ddo-* option.\n");
}

int main(int argc, char **argv)
{
#if defined(_WIN32)
    /* Output is bytes: no CRLF translation of '\n' on stdout and stderr. */
    _setmode(_fileno(stdout), _O_BINARY);
    _setmode(_fileno(stderr), _O_BINARY);
    /* Text is UTF-8 (the manifest makes it the process code page: tools/windows/ddo.manifest);
     * a console shows it as such while ddo runs, and gets its own code page back at exit. */
    console_cp = GetConsoleOutputCP(); /* 0: no console (a pipe, a file) */
    if (console_cp != 0 && console_cp != CP_UTF8 && SetConsoleOutputCP(CP_UTF8)) {
        atexit(console_cp_restore);
        SetConsoleCtrlHandler(console_cp_on_control, TRUE);
    }
#endif
    if (argc < 2) {
        usage(stderr);
        return DDO_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return DDO_EXIT_OK;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("ddo %s\n", ddo_version_string());
        return DDO_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(cmd, commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "ddo: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return DDO_EXIT_USAGE;
}
