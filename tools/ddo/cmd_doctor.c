/*
 * cmd_doctor.c - `ddo doctor`. PLACEHOLDER: not implemented yet (owned by the issue that builds it).
 */
#include "tool.h"

#include <stdio.h>

int ddo_cmd_doctor(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ddo doctor: not implemented yet\n");
    return DDO_EXIT_FAILURE;
}
