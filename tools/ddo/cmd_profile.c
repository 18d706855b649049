/*
 * cmd_profile.c - `ddo profile`. PLACEHOLDER: not implemented yet (owned by the issue that builds it).
 */
#include "tool.h"

#include <stdio.h>

int ddo_cmd_profile(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ddo profile: not implemented yet\n");
    return DDO_EXIT_FAILURE;
}
