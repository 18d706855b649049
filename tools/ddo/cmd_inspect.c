/*
 * cmd_inspect.c - `ddo inspect`. PLACEHOLDER: not implemented yet (owned by the issue that builds it).
 */
#include "tool.h"

#include <stdio.h>

int ddo_cmd_inspect(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ddo inspect: not implemented yet\n");
    return DDO_EXIT_FAILURE;
}
