/*
 * inspect_codec.h - `ddo inspect --codec`: the coded/raw ratio the weight codec would give a
 * checkpoint, per dtype and per block group (inspect_codec.c).
 */
#ifndef DDO_TOOL_INSPECT_CODEC_H
#define DDO_TOOL_INSPECT_CODEC_H

#include "ddo.h"

#include <stdbool.h>

/* Codes every tensor of ck on `threads` workers (0: the online CPU count) and prints the
 * ratios (JSON when json); verify: also decodes each stream, compares it and times the
 * decoder. Returns the exit status. */
int ddo_tool_inspect_codec(const ddo_checkpoint *ck, unsigned threads, bool verify, bool json);

#endif /* DDO_TOOL_INSPECT_CODEC_H */
