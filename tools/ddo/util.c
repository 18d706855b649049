/*
 * util.c - small helpers shared by the tool's commands.
 */
#define _POSIX_C_SOURCE 200809L
#include "tool.h"

#include <ctype.h>
#include <string.h>
#include <sys/utsname.h>

int ddo_tool_running_on_wsl(void)
{
    struct utsname u;
    if (uname(&u) != 0)
        return 0;
    char rel[sizeof(u.release)];
    size_t i = 0;
    for (; u.release[i] != '\0' && i + 1 < sizeof(rel); i++)
        rel[i] = (char)tolower((unsigned char)u.release[i]);
    rel[i] = '\0';
    return strstr(rel, "microsoft") != NULL || strstr(rel, "wsl") != NULL;
}
