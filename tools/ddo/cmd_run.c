/*
 * cmd_run.c - `ddo run`. PLACEHOLDER: not implemented yet (owned by the issue that builds it).
 */
#include "tool.h"

#include <stdio.h>

int ddo_cmd_run(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ddo run: not implemented yet\n");
    return DDO_EXIT_FAILURE;
}
