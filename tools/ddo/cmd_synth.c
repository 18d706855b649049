/*
 * cmd_synth.c - `ddo synth`. PLACEHOLDER: not implemented yet (owned by the issue that builds it).
 */
#include "tool.h"

#include <stdio.h>

int ddo_cmd_synth(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ddo synth: not implemented yet\n");
    return DDO_EXIT_FAILURE;
}
