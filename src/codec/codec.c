/*
 * codec.c - ddo's lossless weight codec (codec.h): format DDOC v1, the
 * encoder (canonical length-limited Huffman on the 8-bit exponent symbol of
 * each element, sign and mantissa raw; FP8: the whole byte, nothing raw; 32
 * lane streams per group), the plan
 * (full validation of a stream's structure) and the C reference decoder,
 * which is also what the cpu device runs as its "device" decoder.
 *
 * Layout (all little-endian; docs/codec.md):
 *   stream header, 64 bytes: "DDOC" u32, version u16, dtype u8, esize u8,
 *     block_elems u32, n_blocks u32, decoded_bytes u64, coded_bytes u64,
 *     24 zero bytes, meta hash u64 (checksum of bytes 0..55 + directory)
 *   directory: n_blocks u64 block offsets, zero-padded to 16 bytes
 *   blocks, contiguous, each a multiple of 16 bytes:
 *     header, 48 bytes: "DDOB" u32, mode u8, esize u8, 0 u16, elems u32,
 *       coded_len u32, exp_bytes u32, 0 u32, checksum u64, 0 u64, meta hash u64
 *     raw:  the decoded bytes, zero-padded
 *     huff: 128 bytes of 4-bit code lengths (symbol 2i low nibble), the lane
 *       table ((groups * 32 + 1) u32 byte offsets into the exponent streams),
 *       the raw plane (elems * (esize - 1) bytes), the exponent streams
 *       (each lane's codes LSB first, zero-padded to 32 bits), each section
 *       zero-padded to 16 bytes.
 *
 * This file: the format's sizes and checks, the canonical codes, the plan and
 * the reference decoder. The encoder (code lengths, blocks, worker threads):
 * codec_encode.c; what the two share: codec_internal.h.
 */
#include "codec/codec_internal.h"

#include "os/thread.h"
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- little helpers ---- */

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)ddo__codec_rd32(p) | (uint64_t)ddo__codec_rd32(p + 4) << 32;
}

static uint64_t pad16(uint64_t n)
{
    return (n + 15) & ~(uint64_t)15;
}

uint64_t ddo__codec_checksum(const void *p, uint64_t n, uint64_t first_word)
{
    const uint8_t *b = p;
    uint64_t sum = 0, words = n / 4, i = 0;
    for (; i < words; i++)
        sum += ddo__codec_fmix64((uint64_t)ddo__codec_rd32(b + 4 * i) | (first_word + i) << 32);
    if (n % 4 != 0) {
        uint8_t last[4] = { 0, 0, 0, 0 };
        memcpy(last, b + 4 * words, (size_t)(n % 4));
        sum += ddo__codec_fmix64((uint64_t)ddo__codec_rd32(last) | (first_word + words) << 32);
    }
    return sum;
}

static bool all_zero(const uint8_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i] != 0)
            return false;
    return true;
}

bool ddo__codec_codes_dtype(ddo_dtype dtype)
{
    return dtype == DDO_DTYPE_BF16 || dtype == DDO_DTYPE_F16 || dtype == DDO_DTYPE_F32 ||
           ddo__codec_codes_bytes(dtype);
}

/* The FP8 weight dtypes: each element's whole byte is the symbol (no raw plane). */
bool ddo__codec_codes_bytes(ddo_dtype dtype)
{
    return dtype == DDO_DTYPE_F8_E4M3 || dtype == DDO_DTYPE_F8_E5M2 ||
           dtype == DDO_DTYPE_F8_E4M3FNUZ || dtype == DDO_DTYPE_F8_E5M2FNUZ;
}

bool ddo__codec_codes_tensor(ddo_dtype dtype, uint64_t nbytes)
{
    return ddo__codec_codes_dtype(dtype) && nbytes > 0 && ddo__codec_bound(dtype, nbytes, 0) > 0;
}

/* The stream's element size: the dtype's for coded dtypes, 1 (bytes) for every other. */
uint32_t ddo__codec_stream_esize(ddo_dtype dtype)
{
    return ddo__codec_codes_dtype(dtype) ? (uint32_t)ddo_dtype_size(dtype) : 1u;
}

uint64_t ddo__codec_dir_end(uint64_t n_blocks)
{
    return DDO_CODEC_STREAM_HEADER + pad16(8 * n_blocks);
}

uint64_t ddo__codec_raw_block_bytes(uint64_t bytes)
{
    return DDO_CODEC_BLOCK_HEADER + pad16(bytes);
}

uint64_t ddo__codec_groups_of(uint64_t elems)
{
    return (elems + DDO_CODEC_GROUP_ELEMS - 1) / DDO_CODEC_GROUP_ELEMS;
}

static uint64_t table_bytes(uint64_t elems)
{
    return pad16((ddo__codec_groups_of(elems) * DDO_CODEC_LANES + 1) * 4);
}

huff_layout ddo__codec_layout_of(uint64_t elems, uint32_t esize, uint64_t exp_bytes)
{
    huff_layout h;
    h.raw_off = TABLE_OFF + table_bytes(elems);
    h.exp_off = h.raw_off + pad16(elems * (esize - 1));
    h.total = h.exp_off + pad16(exp_bytes);
    return h;
}

uint32_t ddo__codec_block_param(uint32_t block_elems)
{
    return block_elems == 0 ? DDO_CODEC_DEFAULT_BLOCK : block_elems;
}

static bool block_param_ok(uint32_t block_elems)
{
    return block_elems % DDO_CODEC_GROUP_ELEMS == 0 && block_elems > 0 &&
           block_elems <= DDO_CODEC_MAX_BLOCK;
}

uint64_t ddo__codec_bound(ddo_dtype dtype, uint64_t src_bytes, uint32_t block_elems)
{
    block_elems = ddo__codec_block_param(block_elems);
    uint32_t es = ddo__codec_stream_esize(dtype);
    if (!block_param_ok(block_elems) || (unsigned)dtype >= DDO_DTYPE_COUNT || src_bytes % es != 0)
        return 0;
    uint64_t block_bytes = (uint64_t)block_elems * es;
    uint64_t n = (src_bytes + block_bytes - 1) / block_bytes;
    if (src_bytes > UINT64_MAX / 2 || n > UINT32_MAX)
        return 0;
    return ddo__codec_dir_end(n) + n * (DDO_CODEC_BLOCK_HEADER + 16) + src_bytes;
}

uint64_t ddo__codec_area_bytes(uint64_t largest_stream, uint64_t largest_unit, uint64_t cap)
{
    uint64_t unit = largest_unit < cap ? largest_unit : cap;
    uint64_t area = largest_stream > unit ? largest_stream : unit;
    return ddo__round_up(area, DDO_CODEC_AREA_ALIGN);
}

/* ---- symbols ---- */

/* Rebuilds element e from its symbol and raw bytes. */
static void join(uint8_t sym, const uint8_t *r, uint32_t esize, uint8_t *e)
{
    if (esize == 1) {
        e[0] = sym;
    } else if (esize == 2) {
        e[0] = (uint8_t)((r[0] & 0x7F) | (sym & 1) << 7);
        e[1] = (uint8_t)((r[0] & 0x80) | sym >> 1);
    } else {
        e[0] = r[0];
        e[1] = r[1];
        e[2] = (uint8_t)((r[2] & 0x7F) | (sym & 1) << 7);
        e[3] = (uint8_t)((r[2] & 0x80) | sym >> 1);
    }
}

/* ---- canonical codes (the encoder's and the decoders') ---- */

static uint32_t reverse_bits(uint32_t code, unsigned len)
{
    uint32_t r = 0;
    for (unsigned i = 0; i < len; i++)
        r |= ((code >> i) & 1u) << (len - 1 - i);
    return r;
}

/*
 * Canonical codes (by length, then symbol) of lens, bit-reversed for LSB-first
 * streams. False when a length is over the limit, no symbol has a code, or the
 * lengths oversubscribe the code space (Kraft sum over 1).
 */
bool ddo__codec_canonical_codes(const uint8_t lens[256], uint16_t rev[256])
{
    uint32_t count[DDO_CODEC_MAX_CODE_BITS + 1] = { 0 };
    uint32_t kraft = 0;
    for (int s = 0; s < 256; s++) {
        if (lens[s] > DDO_CODEC_MAX_CODE_BITS)
            return false;
        if (lens[s] != 0) {
            count[lens[s]]++;
            kraft += LUT_SIZE >> lens[s];
        }
    }
    if (kraft == 0 || kraft > LUT_SIZE)
        return false;
    uint32_t next[DDO_CODEC_MAX_CODE_BITS + 1] = { 0 }, code = 0;
    for (unsigned l = 1; l <= DDO_CODEC_MAX_CODE_BITS; l++) {
        code = (code + count[l - 1]) << 1;
        next[l] = code;
    }
    for (int s = 0; s < 256; s++)
        rev[s] = lens[s] ? (uint16_t)reverse_bits(next[lens[s]]++, lens[s]) : 0;
    return true;
}

/* The decoding table: entry = symbol | length << 8 for every 12-bit window; 0 = no code. */
static bool build_lut(const uint8_t lens[256], uint16_t lut[LUT_SIZE])
{
    uint16_t rev[256];
    if (!ddo__codec_canonical_codes(lens, rev))
        return false;
    memset(lut, 0, LUT_SIZE * sizeof(lut[0]));
    for (int s = 0; s < 256; s++)
        if (lens[s] != 0)
            for (uint32_t i = rev[s]; i < LUT_SIZE; i += 1u << lens[s])
                lut[i] = (uint16_t)((unsigned)s | (unsigned)lens[s] << 8);
    return true;
}

uint64_t ddo__codec_block_meta_hash(const uint8_t *b, uint64_t meta_end)
{
    return ddo__codec_checksum(b, 40, 0) +
           ddo__codec_checksum(b + DDO_CODEC_BLOCK_HEADER, meta_end - DDO_CODEC_BLOCK_HEADER, 12);
}

/* ---- validation and plan ---- */

typedef struct stream_hdr {
    ddo_dtype dtype;
    uint32_t esize, block_elems, n_blocks;
    uint64_t decoded_bytes, coded_bytes;
} stream_hdr;

#define BAD(...) ddo__fail(eb, DDO_E_FORMAT, __VA_ARGS__)

static int parse_stream_header(const uint8_t *c, uint64_t len, const char *nm, stream_hdr *h,
                               ddo__errbuf *eb)
{
    if (len < DDO_CODEC_STREAM_HEADER || ddo__codec_rd32(c) != STREAM_MAGIC)
        return BAD("codec: tensor `%s`: not a DDOC stream (%" PRIu64 " bytes, no magic)", nm, len);
    if ((c[4] | c[5] << 8) != VERSION || !all_zero(c + 32, 24))
        return BAD("codec: tensor `%s`: stream header: version %u or reserved bytes invalid", nm,
                   (unsigned)(c[4] | c[5] << 8));
    if (c[6] >= DDO_DTYPE_COUNT || c[7] != ddo__codec_stream_esize((ddo_dtype)c[6]))
        return BAD("codec: tensor `%s`: stream header: dtype %u / element size %u invalid", nm,
                   c[6], c[7]);
    h->dtype = (ddo_dtype)c[6];
    h->esize = c[7];
    h->block_elems = ddo__codec_rd32(c + 8);
    h->n_blocks = ddo__codec_rd32(c + 12);
    h->decoded_bytes = rd64(c + 16);
    h->coded_bytes = rd64(c + 24);
    if (!block_param_ok(h->block_elems) || h->decoded_bytes % h->esize != 0 ||
        h->decoded_bytes > UINT64_MAX / 2)
        return BAD("codec: tensor `%s`: stream header: block of %" PRIu32 " elements or %" PRIu64
                   " decoded bytes invalid",
                   nm, h->block_elems, h->decoded_bytes);
    uint64_t bb = (uint64_t)h->block_elems * h->esize;
    if (h->n_blocks != (h->decoded_bytes + bb - 1) / bb)
        return BAD("codec: tensor `%s`: stream header: %" PRIu32 " blocks for %" PRIu64 " bytes",
                   nm, h->n_blocks, h->decoded_bytes);
    if (h->coded_bytes != len || ddo__codec_dir_end(h->n_blocks) > len)
        return BAD("codec: tensor `%s`: stream header says %" PRIu64 " coded bytes, %" PRIu64
                   " given",
                   nm, h->coded_bytes, len);
    uint64_t want =
        ddo__codec_checksum(c, 56, 0) +
        ddo__codec_checksum(c + DDO_CODEC_STREAM_HEADER,
                            ddo__codec_dir_end(h->n_blocks) - DDO_CODEC_STREAM_HEADER, 16);
    if (rd64(c + 56) != want)
        return BAD("codec: tensor `%s`: stream header or block directory corrupted (hash)", nm);
    return 0;
}

static uint32_t elems_of_block(const stream_hdr *h, uint32_t b)
{
    uint64_t total = h->decoded_bytes / h->esize, e0 = (uint64_t)b * h->block_elems;
    return (uint32_t)(total - e0 < h->block_elems ? total - e0 : h->block_elems);
}

/* The huff sections of block blk (n elements): lengths, lane table, padding. */
static int check_huff(const uint8_t *blk, uint32_t n, uint32_t esize, uint64_t exp_bytes,
                      const char *nm, uint32_t b, ddo__errbuf *eb)
{
    uint8_t lens[256];
    uint16_t rev[256];
    for (int i = 0; i < 128; i++) {
        lens[2 * i] = blk[LENS_OFF + i] & 15;
        lens[2 * i + 1] = blk[LENS_OFF + i] >> 4;
    }
    if (!ddo__codec_canonical_codes(lens, rev))
        return BAD("codec: tensor `%s`: block %" PRIu32 ": code lengths invalid", nm, b);
    uint64_t lanes_n = ddo__codec_groups_of(n) * DDO_CODEC_LANES;
    huff_layout h = ddo__codec_layout_of(n, esize, exp_bytes);
    uint32_t prev = 0;
    for (uint64_t i = 0; i <= lanes_n; i++) {
        uint32_t o = ddo__codec_rd32(blk + TABLE_OFF + 4 * i);
        if (o % 4 != 0 || o < prev || (i == 0 && o != 0) || o - prev > LANE_MAX_BYTES ||
            (i == lanes_n && o != exp_bytes))
            return BAD("codec: tensor `%s`: block %" PRIu32 ": lane table entry %" PRIu64
                       " invalid",
                       nm, b, i);
        prev = o;
    }
    uint64_t tb = TABLE_OFF + (lanes_n + 1) * 4, rb = h.raw_off + (uint64_t)n * (esize - 1);
    if (!all_zero(blk + tb, h.raw_off - tb) || !all_zero(blk + rb, h.exp_off - rb) ||
        !all_zero(blk + h.exp_off + exp_bytes, h.total - h.exp_off - exp_bytes))
        return BAD("codec: tensor `%s`: block %" PRIu32 ": padding not zero", nm, b);
    return 0;
}

/* Block b at offset off of the stream, its bytes at blk (the whole block: the caller checked
 * that its header's length is inside the stream, or gives the stream from blk on). */
static int check_block(const uint8_t *blk, const stream_hdr *h, uint32_t b, uint64_t off,
                       const char *nm, ddo__codec_block *out, ddo__errbuf *eb)
{
    if (off % 16 != 0 || off > h->coded_bytes || h->coded_bytes - off < DDO_CODEC_BLOCK_HEADER)
        return BAD("codec: tensor `%s`: block %" PRIu32 ": offset %" PRIu64 " out of bounds", nm, b,
                   off);
    uint32_t n = elems_of_block(h, b), len = ddo__codec_rd32(blk + 12);
    uint64_t exp_bytes = ddo__codec_rd32(blk + 16), bytes = (uint64_t)n * h->esize;
    uint8_t mode = blk[4];
    if (ddo__codec_rd32(blk) != BLOCK_MAGIC || blk[5] != h->esize ||
        ddo__codec_rd32(blk + 8) != n || blk[6] || blk[7] || ddo__codec_rd32(blk + 20) != 0 ||
        rd64(blk + 32) != 0 || len % 16 != 0 || len > h->coded_bytes - off ||
        mode > DDO_CODEC_MODE_HUFF ||
        (mode == DDO_CODEC_MODE_HUFF && (!ddo__codec_codes_dtype(h->dtype) || exp_bytes % 4 != 0)))
        return BAD("codec: tensor `%s`: block %" PRIu32 ": header invalid", nm, b);
    uint64_t want = mode == DDO_CODEC_MODE_RAW ? ddo__codec_raw_block_bytes(bytes)
                                               : ddo__codec_layout_of(n, h->esize, exp_bytes).total;
    if (len != want || (mode == DDO_CODEC_MODE_RAW && exp_bytes != 0))
        return BAD("codec: tensor `%s`: block %" PRIu32 ": length %" PRIu32 " invalid", nm, b, len);
    uint64_t meta_end = mode == DDO_CODEC_MODE_RAW
                            ? DDO_CODEC_BLOCK_HEADER
                            : ddo__codec_layout_of(n, h->esize, exp_bytes).raw_off;
    if (rd64(blk + 40) != ddo__codec_block_meta_hash(blk, meta_end))
        return BAD("codec: tensor `%s`: block %" PRIu32 ": metadata corrupted (hash)", nm, b);
    if (mode == DDO_CODEC_MODE_RAW &&
        !all_zero(blk + DDO_CODEC_BLOCK_HEADER + bytes, len - DDO_CODEC_BLOCK_HEADER - bytes))
        return BAD("codec: tensor `%s`: block %" PRIu32 ": padding not zero", nm, b);
    if (mode == DDO_CODEC_MODE_HUFF) {
        int rc = check_huff(blk, n, h->esize, exp_bytes, nm, b, eb);
        if (rc != 0)
            return rc;
    }
    *out = (ddo__codec_block){ off, len, n, rd64(blk + 24), mode };
    return 0;
}

static void fill_launch(ddo__codec_plan *p, const stream_hdr *h)
{
    ddo__codec_launch *l = &p->launch;
    memset(l, 0, sizeof(*l));
    l->coded_bytes = h->coded_bytes;
    l->decoded_bytes = h->decoded_bytes;
    l->total_elems = h->decoded_bytes / h->esize;
    l->n_blocks = h->n_blocks;
    l->block_elems = h->block_elems;
    l->esize = h->esize;
    l->cta_warps = DDO_CODEC_DEFAULT_CTA_WARPS;
    uint64_t groups = h->block_elems / DDO_CODEC_GROUP_ELEMS;
    l->ctas_per_block = (uint32_t)((groups + l->cta_warps - 1) / l->cta_warps);
    l->status_bytes = 16 * (uint64_t)h->n_blocks;
}

int ddo__codec_plan_create(const void *coded, uint64_t coded_bytes, const char *name,
                           ddo__codec_plan **out, ddo__errbuf *eb)
{
    const char *nm = name ? name : "?";
    if (out == NULL || (coded == NULL && coded_bytes > 0))
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT, "codec: tensor `%s`: NULL argument", nm);
    *out = NULL;
    const uint8_t *c = coded;
    stream_hdr h;
    memset(&h, 0, sizeof(h));
    int rc = parse_stream_header(c, coded_bytes, nm, &h, eb);
    if (rc != 0)
        return rc;
    ddo__codec_plan *p = ddo__calloc(1, sizeof(*p));
    ddo__codec_block *blocks = ddo__calloc(h.n_blocks ? h.n_blocks : 1, sizeof(*blocks));
    if (p == NULL || blocks == NULL) {
        free(p);
        free(blocks);
        return ddo__fail(eb, DDO_E_NO_MEMORY, "codec: tensor `%s`: out of host memory", nm);
    }
    uint64_t off = ddo__codec_dir_end(h.n_blocks);
    for (uint32_t b = 0; b < h.n_blocks && rc == 0; b++) {
        uint64_t at = rd64(c + DDO_CODEC_STREAM_HEADER + 8 * (uint64_t)b);
        if (at != off)
            rc = BAD("codec: tensor `%s`: block %" PRIu32 ": directory offset %" PRIu64
                     " (expected %" PRIu64 ")",
                     nm, b, at, off);
        else
            rc = check_block(c + off, &h, b, off, nm, &blocks[b], eb);
        off += rc == 0 ? blocks[b].coded_bytes : 0;
        p->raw_blocks += rc == 0 && blocks[b].mode == DDO_CODEC_MODE_RAW;
    }
    if (rc == 0 && off != coded_bytes)
        rc = BAD("codec: tensor `%s`: %" PRIu64 " bytes after the last block", nm,
                 coded_bytes - off);
    if (rc != 0) {
        free(blocks);
        free(p);
        return rc;
    }
    snprintf(p->name, sizeof(p->name), "%s", nm);
    p->dtype = h.dtype;
    p->decoded_bytes = h.decoded_bytes;
    p->coded_bytes = coded_bytes;
    p->blocks = blocks;
    fill_launch(p, &h);
    *out = p;
    return 0;
}

void ddo__codec_plan_destroy(ddo__codec_plan *plan)
{
    if (plan == NULL)
        return;
    free(plan->blocks);
    free(plan);
}

/* ---- validating a stream read in pieces ---- */

/* The most bytes of one unit (the header and directory, or a block) that spans two pieces. */
#define READER_BUF_MAX ((uint64_t)16 << 20)

struct ddo__codec_reader {
    char name[160];
    uint64_t coded_bytes;
    uint64_t fed; /* bytes given so far */
    uint64_t off; /* where the next unit starts: the header and directory, then block next */
    bool head_done;
    stream_hdr h;
    ddo__codec_block *blocks; /* until checked: coded_offset is the directory's */
    uint32_t next, raw_blocks;
    uint8_t *buf; /* the part of a unit that began in an earlier piece */
    uint64_t buf_cap, buf_len;
    int err; /* the first failure; later pieces are ignored */
};

int ddo__codec_reader_create(uint64_t coded_bytes, const char *name, ddo__codec_reader **out,
                             ddo__errbuf *eb)
{
    *out = ddo__calloc(1, sizeof(**out));
    if (*out == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "codec: tensor `%s`: out of host memory",
                         name ? name : "?");
    snprintf((*out)->name, sizeof((*out)->name), "%s", name ? name : "?");
    (*out)->coded_bytes = coded_bytes;
    return 0;
}

uint64_t ddo__codec_reader_total(const ddo__codec_reader *r)
{
    return r->coded_bytes;
}

void ddo__codec_reader_destroy(ddo__codec_reader *r)
{
    if (r == NULL)
        return;
    free(r->blocks);
    free(r->buf);
    free(r);
}

/* The bytes the unit at r->off needs, given its first have bytes at u: its header's length
 * while fewer are at hand; UINT64_MAX after the last block. */
static uint64_t unit_need(const ddo__codec_reader *r, const uint8_t *u, uint64_t have)
{
    if (!r->head_done)
        return have < DDO_CODEC_STREAM_HEADER ? DDO_CODEC_STREAM_HEADER
                                              : ddo__codec_dir_end(ddo__codec_rd32(u + 12));
    if (r->next >= r->h.n_blocks)
        return UINT64_MAX;
    if (have < DDO_CODEC_BLOCK_HEADER)
        return DDO_CODEC_BLOCK_HEADER;
    uint32_t len = ddo__codec_rd32(u + 12);
    return len < DDO_CODEC_BLOCK_HEADER ? DDO_CODEC_BLOCK_HEADER : len;
}

/* Why a unit of need bytes cannot be at r->off (r->err set), or 0. */
static int unit_bad(ddo__codec_reader *r, uint64_t need, uint64_t cap, ddo__errbuf *eb)
{
    const char *nm = r->name;
    if (need == UINT64_MAX)
        r->err = BAD("codec: tensor `%s`: %" PRIu64 " bytes after the last block", nm,
                     r->coded_bytes - r->off);
    else if (need > r->coded_bytes - r->off)
        r->err =
            BAD("codec: tensor `%s`: %s at %" PRIu64 " of %" PRIu64 " bytes runs past the stream",
                nm, r->head_done ? "a block" : "the header", need, r->off);
    else if (need > cap)
        r->err = BAD("codec: tensor `%s`: a block of %" PRIu64
                     " bytes spans two pieces (at most %" PRIu64 ")",
                     nm, need, cap);
    return r->err;
}

/* The unit at r->off, whole at u (need bytes), checked. */
static int unit_done(ddo__codec_reader *r, const uint8_t *u, uint64_t need, ddo__errbuf *eb)
{
    const char *nm = r->name;
    if (!r->head_done) {
        int rc = parse_stream_header(u, r->coded_bytes, nm, &r->h, eb);
        if (rc == 0 && (r->blocks = ddo__calloc(r->h.n_blocks + 1u, sizeof(*r->blocks))) == NULL)
            rc = ddo__fail(eb, DDO_E_NO_MEMORY, "codec: tensor `%s`: out of host memory", nm);
        for (uint32_t b = 0; rc == 0 && b < r->h.n_blocks; b++)
            r->blocks[b].coded_offset = rd64(u + DDO_CODEC_STREAM_HEADER + 8 * (uint64_t)b);
        r->head_done = rc == 0;
        r->off += need;
        return r->err = rc;
    }
    uint32_t b = r->next;
    if (r->blocks[b].coded_offset != r->off)
        return r->err = BAD("codec: tensor `%s`: block %" PRIu32 ": directory offset %" PRIu64
                            " (expected %" PRIu64 ")",
                            nm, b, r->blocks[b].coded_offset, r->off);
    int rc = check_block(u, &r->h, b, r->off, nm, &r->blocks[b], eb);
    if (rc != 0)
        return r->err = rc;
    r->raw_blocks += r->blocks[b].mode == DDO_CODEC_MODE_RAW;
    r->off += need;
    r->next++;
    return 0;
}

/* The units wholly inside p (len bytes, r's buffer empty), checked where they lie; the bytes
 * they took. */
static uint64_t in_place(ddo__codec_reader *r, const uint8_t *p, uint64_t len, ddo__errbuf *eb)
{
    uint64_t at = 0;
    while (r->err == 0 && at < len) {
        uint64_t need = unit_need(r, p + at, len - at);
        if (need > len - at || unit_bad(r, need, UINT64_MAX - 1, eb) != 0)
            break;
        if (unit_done(r, p + at, need, eb) == 0)
            at += need;
    }
    return at;
}

/* Bytes of p (len) into the buffer until it holds the unit at r->off, which is then checked;
 * the bytes taken. */
static uint64_t to_buffer(ddo__codec_reader *r, const uint8_t *p, uint64_t len, ddo__errbuf *eb)
{
    uint64_t taken = 0;
    while (r->err == 0) {
        uint64_t need = unit_need(r, r->buf, r->buf_len);
        if (unit_bad(r, need, READER_BUF_MAX, eb) != 0)
            break;
        if (r->buf_len >= need) {
            r->buf_len = 0;
            unit_done(r, r->buf, need, eb);
            break;
        }
        if (need > r->buf_cap) {
            uint8_t *nb = realloc(r->buf, (size_t)need);
            if (nb == NULL) {
                r->err = ddo__fail(eb, DDO_E_NO_MEMORY, "codec: tensor `%s`: out of host memory",
                                   r->name);
                break;
            }
            r->buf = nb;
            r->buf_cap = need;
        }
        uint64_t n = need - r->buf_len < len - taken ? need - r->buf_len : len - taken;
        if (n == 0)
            break;
        memcpy(r->buf + r->buf_len, p + taken, (size_t)n);
        r->buf_len += n;
        taken += n;
    }
    return taken;
}

int ddo__codec_reader_feed(ddo__codec_reader *r, const void *piece, uint64_t len, ddo__errbuf *eb)
{
    const uint8_t *p = piece;
    if (r->err != 0)
        return r->err;
    if (len > r->coded_bytes - r->fed)
        return r->err = BAD("codec: tensor `%s`: more than its %" PRIu64 " coded bytes", r->name,
                            r->coded_bytes);
    r->fed += len;
    while (len > 0 && r->err == 0) {
        uint64_t used = r->buf_len == 0 ? in_place(r, p, len, eb) : 0;
        if (used < len && r->err == 0)
            used += to_buffer(r, p + used, len - used, eb);
        p += used;
        len -= used;
    }
    return r->err;
}

int ddo__codec_reader_finish(ddo__codec_reader *r, ddo__codec_plan **out, ddo__errbuf *eb)
{
    *out = NULL;
    if (r->err != 0)
        return r->err;
    if (!r->head_done || r->next != r->h.n_blocks || r->off != r->coded_bytes ||
        r->fed != r->coded_bytes)
        return r->err = BAD("codec: tensor `%s`: stream ends at %" PRIu64 " of %" PRIu64
                            " bytes, in block %" PRIu32,
                            r->name, r->fed, r->coded_bytes, r->next);
    ddo__codec_plan *p = ddo__calloc(1, sizeof(*p));
    if (p == NULL)
        return r->err = ddo__fail(eb, DDO_E_NO_MEMORY, "codec: tensor `%s`: out of host memory",
                                  r->name);
    snprintf(p->name, sizeof(p->name), "%s", r->name);
    p->dtype = r->h.dtype;
    p->decoded_bytes = r->h.decoded_bytes;
    p->coded_bytes = r->coded_bytes;
    p->raw_blocks = r->raw_blocks;
    p->blocks = r->blocks;
    r->blocks = NULL;
    fill_launch(p, &r->h);
    *out = p;
    return 0;
}

/* ---- decoding (what a device does) ---- */

/* Decodes one lane's elements into out; returns the lane's flags. */
static uint32_t decode_lane(const uint8_t *words, uint32_t nwords, const uint16_t *lut,
                            const uint8_t *raw, uint32_t esize, uint32_t first, uint32_t count,
                            uint8_t *out)
{
    uint64_t buf = 0;
    unsigned nb = 0;
    uint32_t wi = 0, flags = 0;
    for (uint32_t e = first; e < count; e += DDO_CODEC_LANES) {
        if (nb < 32 && wi < nwords) {
            buf |= (uint64_t)ddo__codec_rd32(words + 4 * (uint64_t)wi++) << nb;
            nb += 32;
        }
        uint16_t ent = lut[buf & (LUT_SIZE - 1)];
        unsigned len = ent >> 8;
        if (len == 0 || len > nb) {
            flags |= DDO_CODEC_BAD_STREAM;
            len = len > nb ? nb : len;
        }
        buf >>= len;
        nb -= len;
        join((uint8_t)ent, raw + (uint64_t)e * (esize - 1), esize, out + (uint64_t)e * esize);
    }
    if (wi != nwords || buf != 0 || nb >= 32)
        flags |= DDO_CODEC_BAD_STREAM;
    return flags;
}

/* Validates block b's directory entry and header against l and src; its offset or UINT64_MAX. */
static uint64_t locate_block(const uint8_t *src, uint64_t src_bytes, const ddo__codec_launch *l,
                             uint32_t b, uint32_t n)
{
    uint64_t de = DDO_CODEC_STREAM_HEADER + 8 * (uint64_t)l->n_blocks;
    if (de > src_bytes)
        return UINT64_MAX;
    uint64_t off = rd64(src + DDO_CODEC_STREAM_HEADER + 8 * (uint64_t)b);
    if (off % 16 != 0 || off < de || off > src_bytes || src_bytes - off < DDO_CODEC_BLOCK_HEADER)
        return UINT64_MAX;
    const uint8_t *blk = src + off;
    uint64_t len = ddo__codec_rd32(blk + 12), exp_bytes = ddo__codec_rd32(blk + 16);
    if (ddo__codec_rd32(blk) != BLOCK_MAGIC || blk[5] != l->esize ||
        ddo__codec_rd32(blk + 8) != n || len > src_bytes - off || blk[4] > DDO_CODEC_MODE_HUFF)
        return UINT64_MAX;
    if (blk[4] == DDO_CODEC_MODE_RAW)
        return len >= DDO_CODEC_BLOCK_HEADER + (uint64_t)n * l->esize ? off : UINT64_MAX;
    if (exp_bytes % 4 != 0 || ddo__codec_layout_of(n, l->esize, exp_bytes).total > len)
        return UINT64_MAX;
    return off;
}

static uint32_t decode_huff(const uint8_t *blk, uint32_t n, uint32_t esize, uint8_t *out)
{
    uint8_t lens[256];
    uint16_t lut[LUT_SIZE];
    for (int i = 0; i < 128; i++) {
        lens[2 * i] = blk[LENS_OFF + i] & 15;
        lens[2 * i + 1] = blk[LENS_OFF + i] >> 4;
    }
    if (!build_lut(lens, lut))
        return DDO_CODEC_BAD_TABLE;
    uint64_t exp_bytes = ddo__codec_rd32(blk + 16);
    huff_layout h = ddo__codec_layout_of(n, esize, exp_bytes);
    uint32_t flags = 0;
    for (uint64_t g = 0; g < ddo__codec_groups_of(n); g++) {
        uint64_t g0 = g * DDO_CODEC_GROUP_ELEMS;
        uint32_t cnt = (uint32_t)(n - g0 < DDO_CODEC_GROUP_ELEMS ? n - g0 : DDO_CODEC_GROUP_ELEMS);
        for (uint32_t l = 0; l < DDO_CODEC_LANES; l++) {
            const uint8_t *t = blk + TABLE_OFF + 4 * (g * DDO_CODEC_LANES + l);
            uint32_t s = ddo__codec_rd32(t), e = ddo__codec_rd32(t + 4);
            if (s > e || e > exp_bytes || s % 4 != 0 || e % 4 != 0) {
                flags |= DDO_CODEC_BAD_STREAM;
                s = e = 0;
            }
            flags |=
                decode_lane(blk + h.exp_off + s, (e - s) / 4, lut,
                            blk + h.raw_off + g0 * (esize - 1), esize, l, cnt, out + g0 * esize);
        }
    }
    return flags;
}

/* Decodes block b (as a device would) into dst; sets its status words. */
static void decode_one(const uint8_t *src, uint64_t src_bytes, uint8_t *dst, uint64_t dst_bytes,
                       const ddo__codec_launch *l, uint32_t b, uint64_t *st)
{
    uint64_t e0 = (uint64_t)b * l->block_elems;
    uint32_t n =
        (uint32_t)(l->total_elems - e0 < l->block_elems ? l->total_elems - e0 : l->block_elems);
    uint64_t at = e0 * l->esize, bytes = (uint64_t)n * l->esize;
    uint64_t off = locate_block(src, src_bytes, l, b, n);
    uint32_t flags = 0;
    st[0] = 0;
    if (at > dst_bytes || bytes > dst_bytes - at || off == UINT64_MAX) {
        flags = DDO_CODEC_BAD_HEADER;
    } else if (src[off + 4] == DDO_CODEC_MODE_RAW) {
        memcpy(dst + at, src + off + DDO_CODEC_BLOCK_HEADER, (size_t)bytes);
    } else {
        flags = decode_huff(src + off, n, l->esize, dst + at);
    }
    if (flags == 0)
        st[0] = ddo__codec_checksum(dst + at, bytes, 0);
    st[1] = (uint64_t)flags | (uint64_t)l->ctas_per_block << 32;
}

void ddo__codec_decode_status(const void *src, uint64_t src_bytes, void *dst, uint64_t dst_bytes,
                              const ddo__codec_launch *l, uint64_t *status)
{
    for (uint32_t b = 0; b < l->n_blocks; b++)
        decode_one(src, src_bytes, dst, dst_bytes, l, b, status + 2 * (uint64_t)b);
}

/* What is wrong with one block's status words, or NULL. */
static const char *block_problem(const ddo__codec_launch *l, uint64_t want, const uint64_t st[2])
{
    uint32_t flags = (uint32_t)st[1], done = (uint32_t)(st[1] >> 32);
    if (flags & DDO_CODEC_BAD_HEADER)
        return "block header invalid where it was decoded";
    if (flags & DDO_CODEC_BAD_TABLE)
        return "code lengths invalid";
    if (flags & DDO_CODEC_BAD_STREAM)
        return "coded bits do not decode to the block's elements";
    if (done != l->ctas_per_block)
        return "the decoder did not finish the block";
    if (st[0] != want)
        return "checksum of the decoded bytes differs from the encoded one";
    return NULL;
}

static int corrupted(ddo__errbuf *eb, const ddo__codec_plan *p, uint32_t b, const char *what)
{
    return ddo__fail(eb, DDO_E_FORMAT,
                     "codec: tensor `%s`: block %" PRIu32 " of %" PRIu32 ": corrupted: %s", p->name,
                     b, p->launch.n_blocks, what);
}

int ddo__codec_status_check(const ddo__codec_plan *plan, const uint64_t *status, ddo__errbuf *eb)
{
    for (uint32_t b = 0; b < plan->launch.n_blocks; b++) {
        const char *what =
            block_problem(&plan->launch, plan->blocks[b].checksum, status + 2 * (uint64_t)b);
        if (what != NULL)
            return corrupted(eb, plan, b, what);
    }
    return 0;
}

/* The blocks of one decode, shared by its worker threads (each takes the next block). */
typedef struct dec_job {
    const uint8_t *src;
    uint64_t src_bytes;
    uint8_t *dst;
    uint64_t dst_bytes;
    const ddo__codec_launch *l;
    uint64_t *status; /* two words per block */
    atomic_uint next;
} dec_job;

static void *dec_worker(void *arg)
{
    dec_job *j = arg;
    for (uint32_t b; (b = atomic_fetch_add(&j->next, 1)) < j->l->n_blocks;)
        decode_one(j->src, j->src_bytes, j->dst, j->dst_bytes, j->l, b,
                   j->status + 2 * (uint64_t)b);
    return NULL;
}

int ddo__codec_decode_threads(const void *coded, uint64_t coded_bytes, void *dst,
                              uint64_t dst_bytes, const char *name, unsigned threads,
                              ddo__errbuf *eb)
{
    ddo__codec_plan *p = NULL;
    int rc = ddo__codec_plan_create(coded, coded_bytes, name, &p, eb);
    if (rc != 0)
        return rc;
    if (dst == NULL || dst_bytes < p->decoded_bytes)
        rc = ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                       "codec: tensor `%s`: output of %" PRIu64 " bytes for %" PRIu64
                       " decoded bytes",
                       p->name, dst ? dst_bytes : 0, p->decoded_bytes);
    uint64_t *status = rc == 0 ? ddo__calloc(2 * (size_t)p->launch.n_blocks + 2, 8) : NULL;
    if (rc == 0 && status == NULL)
        rc = ddo__fail(eb, DDO_E_NO_MEMORY, "codec: tensor `%s`: out of memory", p->name);
    if (rc == 0) {
        enum { MAX_THREADS = 64 };
        dec_job j = { coded, coded_bytes, dst, dst_bytes, &p->launch, status, 0 };
        ddo__thread tid[MAX_THREADS];
        unsigned started = 0, want = threads < MAX_THREADS ? threads : MAX_THREADS;
        while (started + 1 < want && started + 1 < p->launch.n_blocks &&
               ddo__thread_create(&tid[started], dec_worker, &j) == 0)
            started++;
        dec_worker(&j);
        for (unsigned t = 0; t < started; t++)
            ddo__thread_join(tid[t]);
        rc = ddo__codec_status_check(p, status, eb);
    }
    free(status);
    ddo__codec_plan_destroy(p);
    return rc;
}

int ddo__codec_decode(const void *coded, uint64_t coded_bytes, void *dst, uint64_t dst_bytes,
                      const char *name, ddo__errbuf *eb)
{
    return ddo__codec_decode_threads(coded, coded_bytes, dst, dst_bytes, name, 1, eb);
}
