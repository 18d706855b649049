/*
 * codec.h - ddo's lossless weight codec (format "DDOC" version 1): the size
 * bound, the multi-threaded encoder, the C reference decoder, and the plan a
 * device decoder needs. docs/codec.md describes the format byte by byte.
 *
 * A coded stream holds the bytes of one tensor (or one byte range of it) in
 * blocks of block_elems elements, each coded on its own. For BF16, F16 and
 * F32 an element is split into an 8-bit symbol (BF16/F32: the exponent; F16:
 * the exponent and the top 3 mantissa bits) and its remaining bits (sign and
 * mantissa, kept raw: 1 byte per element for 16-bit types, 3 for F32). For
 * the FP8 weight dtypes (F8_E4M3, F8_E5M2, their FNUZ variants) the symbol is
 * the whole byte and nothing is kept raw. The symbols are coded with a
 * canonical Huffman code of at most 12 bits per block, in 32 interleaved
 * lane streams per group of 32768 elements (element k*32+l of a group belongs
 * to lane l), each lane's byte offset in a table, so a device decodes every
 * lane in parallel with one table lookup per element. A block that would not
 * get smaller, and every block of any other dtype, is stored raw. Every
 * block carries its element count, a 64-bit checksum of its decoded bytes and
 * a hash of its metadata; the stream header carries a hash of itself and of
 * the block directory, so corruption anywhere is detected.
 *
 * The checksum of n decoded bytes is sum over 32-bit little-endian words w_i
 * (the last zero-padded) of fmix64(w_i | i << 32), modulo 2^64: each term
 * depends on the word and its position, and the sum can be formed in any
 * order (by atomics on a device).
 *
 * Thread-safety: every function is reentrant; the encoder runs its own
 * worker threads.
 */
#ifndef DDO_CODEC_H
#define DDO_CODEC_H

#include "base/common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DDO_CODEC_LANES             32
#define DDO_CODEC_LANE_SYMS         1024
#define DDO_CODEC_GROUP_ELEMS       (DDO_CODEC_LANES * DDO_CODEC_LANE_SYMS)
#define DDO_CODEC_MAX_CODE_BITS     12
#define DDO_CODEC_STREAM_HEADER     64
#define DDO_CODEC_BLOCK_HEADER      48
#define DDO_CODEC_DEFAULT_BLOCK     ((uint32_t)1 << 20) /* elements: 2 MiB of BF16 */
#define DDO_CODEC_MAX_BLOCK         ((uint32_t)1 << 26)
#define DDO_CODEC_DEFAULT_CTA_WARPS 8

/* Block modes. */
#define DDO_CODEC_MODE_RAW  0
#define DDO_CODEC_MODE_HUFF 1

/* Device status flags (the low 32 bits of a block's second status word). */
#define DDO_CODEC_BAD_HEADER                                                                      \
    1u                          /* block directory entry or block header out of bounds or invalid \
                                 */
#define DDO_CODEC_BAD_TABLE  2u /* code lengths invalid */
#define DDO_CODEC_BAD_STREAM 4u /* a lane's bits did not decode to exactly its elements */

typedef struct ddo__codec_params {
    uint32_t block_elems; /* 0: DDO_CODEC_DEFAULT_BLOCK; else a multiple of DDO_CODEC_GROUP_ELEMS */
    unsigned threads;     /* encoder worker threads (pin_cpu_workers); 0 or 1: the calling thread */
} ddo__codec_params;

/* True when the codec codes dtype (BF16, F16, F32: the exponent symbol; the FP8 weight dtypes:
 * the whole byte); every other dtype is stored raw. */
bool ddo__codec_codes_dtype(ddo_dtype dtype);

/* True for the coded dtypes of one byte (F8_E4M3, F8_E5M2 and their FNUZ variants), whose
 * Huffman blocks code each element's whole byte and have no raw plane. */
bool ddo__codec_codes_bytes(ddo_dtype dtype);

/* True when a tensor of dtype and nbytes is one the codec tries to code (a coded dtype, not
 * empty, a whole number of elements): the rule the planner, the store and the sidecars share. */
bool ddo__codec_codes_tensor(ddo_dtype dtype, uint64_t nbytes);

/*
 * The most bytes ddo__codec_encode can write for src_bytes of dtype in blocks
 * of block_elems (0: the default): raw plus 64 bytes plus 56 per block. 0 when
 * the arguments are invalid (block_elems not a multiple of the group, a coded
 * dtype whose length is not a multiple of its element size).
 */
uint64_t ddo__codec_bound(ddo_dtype dtype, uint64_t src_bytes, uint32_t block_elems);

/*
 * Encodes src_bytes at src (elements of dtype) into dst (dst_cap bytes, at least
 * the bound) on p->threads workers; the result does not depend on the thread
 * count. *coded_bytes receives the stream's length. name (the tensor) is used
 * in messages. Errors: DDO_E_INVALID_ARGUMENT (arguments, dst_cap below the
 * bound), DDO_E_NO_MEMORY.
 */
int ddo__codec_encode(const void *src, uint64_t src_bytes, ddo_dtype dtype,
                      const ddo__codec_params *p, void *dst, uint64_t dst_cap,
                      uint64_t *coded_bytes, const char *name, ddo__errbuf *eb);

/* One block as the plan records it (validated). */
typedef struct ddo__codec_block {
    uint64_t coded_offset; /* from the start of the stream */
    uint32_t coded_bytes;  /* the whole block, header included */
    uint32_t elems;
    uint64_t checksum; /* of the decoded bytes */
    uint8_t mode;      /* DDO_CODEC_MODE_* */
} ddo__codec_block;

/*
 * What a device decoder is launched with: the geometry of the stream (from a
 * validated plan) and where the status words go. The status area holds two
 * 64-bit words per block: the checksum of what was decoded, and the flags
 * (low 32 bits) with the count of thread blocks that finished the block (high
 * 32 bits). The caller sets status_dev.
 */
typedef struct ddo__codec_launch {
    uint64_t coded_bytes;
    uint64_t decoded_bytes;
    uint64_t total_elems;
    uint32_t n_blocks;
    uint32_t block_elems;
    uint32_t esize;
    uint32_t cta_warps;      /* warps per thread block (each decodes one group) */
    uint32_t ctas_per_block; /* ceil(groups per full block / cta_warps), 1 for raw streams */
    uint64_t status_bytes;   /* 16 * n_blocks */
    uint64_t status_dev;     /* device address of the status area (set by the caller) */
} ddo__codec_launch;

/*
 * One tensor of a batched decode (ddo__dev_codec_decode): its coded stream at
 * src (src_bytes of device memory the decoder may read, at least
 * l.coded_bytes), its output at dst (dst_bytes, at least l.decoded_bytes), and
 * the geometry and status area of its validated plan (l, status_dev set). A
 * batch decodes up to DDO_CODEC_BATCH_MAX tensors in one launch: every thread
 * block of every tensor in one grid, each writing only its own tensor's
 * output and status words.
 */
typedef struct ddo__codec_desc {
    uint64_t src, src_bytes;
    uint64_t dst, dst_bytes;
    ddo__codec_launch l;
} ddo__codec_desc;

/* The most tensors of one batch: their descriptors travel in the kernel's parameters
 * (72 bytes each on the cuda device, within the 4 KiB the driver takes). */
#define DDO_CODEC_BATCH_MAX 48

/* Alignment of a coded stream inside a decode area (the cuda decoder wants 16). */
#define DDO_CODEC_AREA_ALIGN 256u

/* The batch size the session aims at: the decoder is latency-bound below a few hundred MiB
 * of output (docs/codec.md, "Throughput"), so a decode area holds up to this many coded
 * bytes (or the largest coded stream, when larger). */
#define DDO_CODEC_AREA_CAP ((uint64_t)256 << 20)

/*
 * The bytes of one decode area (plan_codec.c and session_codec.c use this one rule):
 * max(largest_stream, min(largest_unit, cap)), rounded up to DDO_CODEC_AREA_ALIGN, where
 * largest_stream is the largest coded stream bound of any streamed tensor, largest_unit the
 * most one streamed unit's stream bounds (each rounded to the alignment) add up to, and cap
 * DDO_CODEC_AREA_CAP (or a smaller cap, > 0, a test asks for). A unit whose coded bytes fit
 * the area decodes in one launch.
 */
uint64_t ddo__codec_area_bytes(uint64_t largest_stream, uint64_t largest_unit, uint64_t cap);

/* A validated description of a coded stream. */
typedef struct ddo__codec_plan {
    char name[160]; /* the tensor, for messages */
    ddo_dtype dtype;
    uint64_t decoded_bytes;
    uint64_t coded_bytes;
    uint32_t raw_blocks; /* blocks stored raw */
    ddo__codec_block *blocks;
    ddo__codec_launch launch;
} ddo__codec_plan;

/*
 * Validates every header, hash, directory entry, offset, length, lane table,
 * code-length table and padding byte of the stream (not the coded payload:
 * decoding checks that) and describes it. Errors: DDO_E_FORMAT naming the
 * tensor, the block and the field; DDO_E_NO_MEMORY. Free with
 * ddo__codec_plan_destroy (NULL is a no-op).
 */
int ddo__codec_plan_create(const void *coded, uint64_t coded_bytes, const char *name,
                           ddo__codec_plan **out, ddo__errbuf *eb);
void ddo__codec_plan_destroy(ddo__codec_plan *plan);

/*
 * The same checks on a stream of coded_bytes given in pieces, in order (a stream longer than
 * the window it is read through): feed each piece as it arrives (a header or block that spans
 * two pieces is kept in a buffer of its size, at most 16 MiB), then finish for the plan, as
 * ddo__codec_plan_create would give it for the whole stream. The first failure is kept:
 * later feeds return it, and finish too. destroy frees the reader (NULL is a no-op).
 */
typedef struct ddo__codec_reader ddo__codec_reader;
int ddo__codec_reader_create(uint64_t coded_bytes, const char *name, ddo__codec_reader **out,
                             ddo__errbuf *eb);
int ddo__codec_reader_feed(ddo__codec_reader *r, const void *piece, uint64_t len, ddo__errbuf *eb);
int ddo__codec_reader_finish(ddo__codec_reader *r, ddo__codec_plan **out, ddo__errbuf *eb);
/* The coded_bytes the reader was created for. */
uint64_t ddo__codec_reader_total(const ddo__codec_reader *r);
void ddo__codec_reader_destroy(ddo__codec_reader *r);

/*
 * The reference decoder: validates the stream (as plan_create), decodes it
 * into dst (dst_bytes at least its decoded length) and verifies every block's
 * checksum. Never writes outside dst[0, decoded length). Errors: DDO_E_FORMAT
 * naming the tensor and block (corruption), DDO_E_INVALID_ARGUMENT (dst too
 * small), DDO_E_NO_MEMORY.
 */
int ddo__codec_decode(const void *coded, uint64_t coded_bytes, void *dst, uint64_t dst_bytes,
                      const char *name, ddo__errbuf *eb);
/* The same on `threads` threads (the blocks shared out; 0 or 1: the calling thread only). */
int ddo__codec_decode_threads(const void *coded, uint64_t coded_bytes, void *dst,
                              uint64_t dst_bytes, const char *name, unsigned threads,
                              ddo__errbuf *eb);

/*
 * What a device decoder does, in C (the cpu device runs it on its stream
 * worker): decodes the blocks of the stream at src (src_bytes) described by l
 * into dst (dst_bytes) and writes l->n_blocks pairs of status words. Trusts
 * only l (from a validated plan) for geometry: whatever src holds, it reads
 * only src[0, src_bytes) and writes only dst[0, min(dst_bytes, decoded)).
 */
void ddo__codec_decode_status(const void *src, uint64_t src_bytes, void *dst, uint64_t dst_bytes,
                              const ddo__codec_launch *l, uint64_t *status);

/*
 * Checks the status words a decoder wrote against the plan: every block
 * finished by all its thread blocks (plan->launch.ctas_per_block: a caller
 * that launches another geometry records it there), no flag, the checksum
 * equal. Errors:
 * DDO_E_FORMAT naming the tensor, the block and what was wrong.
 */
int ddo__codec_status_check(const ddo__codec_plan *plan, const uint64_t *status, ddo__errbuf *eb);

/* The checksum of n bytes (the definition above), words numbered from first_word. */
uint64_t ddo__codec_checksum(const void *p, uint64_t n, uint64_t first_word);

/* The format's little-endian byte and hash primitives, shared with the coded sidecar's format
 * (store/source_sidecar.c); inline: the encoder runs them once per element. */
static inline uint32_t ddo__codec_rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void ddo__codec_wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void ddo__codec_wr64(uint8_t *p, uint64_t v)
{
    ddo__codec_wr32(p, (uint32_t)v);
    ddo__codec_wr32(p + 4, (uint32_t)(v >> 32));
}

static inline uint64_t ddo__codec_fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

#endif /* DDO_CODEC_H */
