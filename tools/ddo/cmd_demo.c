/*
 * cmd_demo.c - `ddo demo`. PLACEHOLDER: not implemented yet (owned by the issue that builds it).
 */
#include "tool.h"

#include <stdio.h>

int ddo_cmd_demo(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ddo demo: not implemented yet\n");
    return DDO_EXIT_FAILURE;
}
