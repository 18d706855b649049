/*
 * cmd_plan.c - `ddo plan`. PLACEHOLDER: not implemented yet (owned by the issue that builds it).
 */
#include "tool.h"

#include <stdio.h>

int ddo_cmd_plan(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ddo plan: not implemented yet\n");
    return DDO_EXIT_FAILURE;
}
