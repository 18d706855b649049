/*
 * cmd_bench.c - `ddo bench`. PLACEHOLDER: not implemented yet (owned by the issue that builds it).
 */
#include "tool.h"

#include <stdio.h>

int ddo_cmd_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ddo bench: not implemented yet\n");
    return DDO_EXIT_FAILURE;
}
