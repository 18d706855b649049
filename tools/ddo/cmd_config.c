/*
 * cmd_config.c - `ddo config`. PLACEHOLDER: not implemented yet (owned by the issue that builds it).
 */
#include "tool.h"

#include <stdio.h>

int ddo_cmd_config(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ddo config: not implemented yet\n");
    return DDO_EXIT_FAILURE;
}
