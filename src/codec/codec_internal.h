/*
 * codec_internal.h - what codec.c (the format, the plan, the reference decoder)
 * and codec_encode.c (the encoder) share: the format's constants, the sizes
 * of its sections and the canonical codes (the byte and hash primitives, which the
 * coded sidecar's format uses too, are in codec.h). Private to those two files.
 */
#ifndef DDO_CODEC_INTERNAL_H
#define DDO_CODEC_INTERNAL_H

#include "codec/codec.h"

#include <stdbool.h>
#include <stdint.h>

#define STREAM_MAGIC   0x434F4444u /* "DDOC" */
#define BLOCK_MAGIC    0x424F4444u /* "DDOB" */
#define VERSION        1u
#define LENS_OFF       DDO_CODEC_BLOCK_HEADER
#define TABLE_OFF      (LENS_OFF + 128)
#define LUT_SIZE       (1u << DDO_CODEC_MAX_CODE_BITS)
#define LANE_MAX_BYTES (DDO_CODEC_LANE_SYMS * DDO_CODEC_MAX_CODE_BITS / 8)

/* Byte offsets of a huff block's sections and its total length. */
typedef struct huff_layout {
    uint64_t raw_off, exp_off, total;
} huff_layout;

/* codec.c */
/* The stream's element size: the dtype's for coded dtypes, 1 (bytes) for every other. */
uint32_t ddo__codec_stream_esize(ddo_dtype dtype);
uint64_t ddo__codec_dir_end(uint64_t n_blocks);
uint64_t ddo__codec_raw_block_bytes(uint64_t bytes);
uint64_t ddo__codec_groups_of(uint64_t elems);
huff_layout ddo__codec_layout_of(uint64_t elems, uint32_t esize, uint64_t exp_bytes);
uint32_t ddo__codec_block_param(uint32_t block_elems);
bool ddo__codec_canonical_codes(const uint8_t lens[256], uint16_t rev[256]);
uint64_t ddo__codec_block_meta_hash(const uint8_t *b, uint64_t meta_end);

#endif
