/*
 * codec.c - ddo's lossless weight codec (codec.h): format DDOC v1, the
 * encoder (canonical length-limited Huffman on the 8-bit exponent symbol of
 * each element, sign and mantissa raw, 32 lane streams per group), the plan
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
 */
#define _POSIX_C_SOURCE 200809L
#include "codec.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_MAGIC   0x434F4444u /* "DDOC" */
#define BLOCK_MAGIC    0x424F4444u /* "DDOB" */
#define VERSION        1u
#define LENS_OFF       DDO_CODEC_BLOCK_HEADER
#define TABLE_OFF      (LENS_OFF + 128)
#define LUT_SIZE       (1u << DDO_CODEC_MAX_CODE_BITS)
#define LANE_MAX_BYTES (DDO_CODEC_LANE_SYMS * DDO_CODEC_MAX_CODE_BITS / 8)

/* ---- little helpers ---- */

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void wr64(uint8_t *p, uint64_t v)
{
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t pad16(uint64_t n)
{
    return (n + 15) & ~(uint64_t)15;
}

static uint64_t fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

uint64_t ddo__codec_checksum(const void *p, uint64_t n, uint64_t first_word)
{
    const uint8_t *b = p;
    uint64_t sum = 0, words = n / 4, i = 0;
    for (; i < words; i++)
        sum += fmix64((uint64_t)rd32(b + 4 * i) | (first_word + i) << 32);
    if (n % 4 != 0) {
        uint8_t last[4] = { 0, 0, 0, 0 };
        memcpy(last, b + 4 * words, (size_t)(n % 4));
        sum += fmix64((uint64_t)rd32(last) | (first_word + words) << 32);
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
    return dtype == DDO_DTYPE_BF16 || dtype == DDO_DTYPE_F16 || dtype == DDO_DTYPE_F32;
}

/* The stream's element size: the dtype's for coded dtypes, 1 (bytes) for every other. */
static uint32_t stream_esize(ddo_dtype dtype)
{
    return ddo__codec_codes_dtype(dtype) ? (uint32_t)ddo_dtype_size(dtype) : 1u;
}

static uint64_t dir_end(uint64_t n_blocks)
{
    return DDO_CODEC_STREAM_HEADER + pad16(8 * n_blocks);
}

static uint64_t raw_block_bytes(uint64_t bytes)
{
    return DDO_CODEC_BLOCK_HEADER + pad16(bytes);
}

static uint64_t groups_of(uint64_t elems)
{
    return (elems + DDO_CODEC_GROUP_ELEMS - 1) / DDO_CODEC_GROUP_ELEMS;
}

static uint64_t table_bytes(uint64_t elems)
{
    return pad16((groups_of(elems) * DDO_CODEC_LANES + 1) * 4);
}

/* Byte offsets of a huff block's sections and its total length. */
typedef struct huff_layout {
    uint64_t raw_off, exp_off, total;
} huff_layout;

static huff_layout layout_of(uint64_t elems, uint32_t esize, uint64_t exp_bytes)
{
    huff_layout h;
    h.raw_off = TABLE_OFF + table_bytes(elems);
    h.exp_off = h.raw_off + pad16(elems * (esize - 1));
    h.total = h.exp_off + pad16(exp_bytes);
    return h;
}

static uint32_t block_param(uint32_t block_elems)
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
    block_elems = block_param(block_elems);
    uint32_t es = stream_esize(dtype);
    if (!block_param_ok(block_elems) || (unsigned)dtype >= DDO_DTYPE_COUNT || src_bytes % es != 0)
        return 0;
    uint64_t block_bytes = (uint64_t)block_elems * es;
    uint64_t n = (src_bytes + block_bytes - 1) / block_bytes;
    if (src_bytes > UINT64_MAX / 2 || n > UINT32_MAX)
        return 0;
    return dir_end(n) + n * (DDO_CODEC_BLOCK_HEADER + 16) + src_bytes;
}

/* ---- symbols ---- */

/* Rebuilds element e from its symbol and raw bytes. */
static void join(uint8_t sym, const uint8_t *r, uint32_t esize, uint8_t *e)
{
    if (esize == 2) {
        e[0] = (uint8_t)((r[0] & 0x7F) | (sym & 1) << 7);
        e[1] = (uint8_t)((r[0] & 0x80) | sym >> 1);
    } else {
        e[0] = r[0];
        e[1] = r[1];
        e[2] = (uint8_t)((r[2] & 0x7F) | (sym & 1) << 7);
        e[3] = (uint8_t)((r[2] & 0x80) | sym >> 1);
    }
}

/* ---- Huffman code ---- */

typedef struct hnode {
    uint64_t w;
    int parent;
} hnode;

static int by_weight(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b; /* pairs (weight, symbol) */
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : (x[1] > y[1]);
}

/* Huffman code lengths of the nonzero weights (two-queue construction); returns the maximum. */
static unsigned huff_lengths(const uint32_t w[256], uint8_t lens[256])
{
    uint32_t leaf[256][2];
    hnode nd[511];
    int m = 0;
    memset(lens, 0, 256);
    for (int s = 0; s < 256; s++)
        if (w[s] != 0) {
            leaf[m][0] = w[s];
            leaf[m][1] = (uint32_t)s;
            m++;
        }
    if (m == 1)
        lens[leaf[0][1]] = 1;
    if (m <= 1)
        return (unsigned)m;
    qsort(leaf, (size_t)m, sizeof(leaf[0]), by_weight);
    for (int i = 0; i < m; i++)
        nd[i] = (hnode){ leaf[i][0], -1 };
    int q1 = 0, q2 = m, next = m;
    for (int k = 0; k < m - 1; k++) {
        int pick[2];
        for (int j = 0; j < 2; j++) {
            if (q1 < m && (q2 >= next || nd[q1].w <= nd[q2].w))
                pick[j] = q1++;
            else
                pick[j] = q2++;
        }
        nd[next] = (hnode){ nd[pick[0]].w + nd[pick[1]].w, -1 };
        nd[pick[0]].parent = nd[pick[1]].parent = next;
        next++;
    }
    uint8_t depth[511];
    depth[next - 1] = 0;
    unsigned maxlen = 0;
    for (int i = next - 2; i >= 0; i--) {
        depth[i] = (uint8_t)(depth[nd[i].parent] + 1);
        if (i < m) {
            lens[leaf[i][1]] = depth[i];
            if (depth[i] > maxlen)
                maxlen = depth[i];
        }
    }
    return maxlen;
}

/* Lengths limited to DDO_CODEC_MAX_CODE_BITS: weights are halved (kept >= 1) until they fit. */
static void limited_lengths(const uint32_t hist[256], uint8_t lens[256])
{
    uint32_t w[256];
    memcpy(w, hist, sizeof(w));
    while (huff_lengths(w, lens) > DDO_CODEC_MAX_CODE_BITS)
        for (int s = 0; s < 256; s++)
            if (w[s] != 0)
                w[s] = w[s] / 2 + 1;
}

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
static bool canonical_codes(const uint8_t lens[256], uint16_t rev[256])
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
    if (!canonical_codes(lens, rev))
        return false;
    memset(lut, 0, LUT_SIZE * sizeof(lut[0]));
    for (int s = 0; s < 256; s++)
        if (lens[s] != 0)
            for (uint32_t i = rev[s]; i < LUT_SIZE; i += 1u << lens[s])
                lut[i] = (uint16_t)((unsigned)s | (unsigned)lens[s] << 8);
    return true;
}

/* ---- encoder ---- */

/* Per-worker scratch: the symbols of a block and its lane offsets. */
typedef struct enc_scratch {
    uint8_t *syms;
    uint8_t *raw; /* the raw plane */
    uint32_t *lanes;
} enc_scratch;

/*
 * One pass over a block of 16-bit elements: the checksum, each element's symbol
 * (bits 14..7) and raw byte (sign << 7 | bits 6..0), and the histogram (four
 * interleaved counters, so runs of one symbol do not serialise on one counter).
 */
static uint64_t split16(const uint8_t *src, uint32_t n, enc_scratch *sc, uint32_t hist[256])
{
    uint32_t h4[4][256];
    memset(h4, 0, sizeof(h4));
    uint64_t sum = 0;
    for (uint32_t i = 0; i < (n + 1) / 2; i++) {
        uint32_t e = 2 * i, w = 2 * i + 1 < n ? rd32(src + 4 * (uint64_t)i)
                                              : (uint32_t)src[4 * (uint64_t)i] |
                                                    (uint32_t)src[4 * (uint64_t)i + 1] << 8;
        sum += fmix64((uint64_t)w | (uint64_t)i << 32);
        for (uint32_t k = 0; k < 2 && e + k < n; k++) {
            uint32_t v = (w >> (16 * k)) & 0xFFFFu;
            uint8_t sym = (uint8_t)(v >> 7);
            sc->syms[e + k] = sym;
            sc->raw[e + k] = (uint8_t)(((v >> 8) & 0x80u) | (v & 0x7Fu));
            h4[(e + k) & 3][sym]++;
        }
    }
    for (int s = 0; s < 256; s++)
        hist[s] = h4[0][s] + h4[1][s] + h4[2][s] + h4[3][s];
    return sum;
}

/* The same for 32-bit elements: symbol bits 30..23, raw bytes 0, 1 and sign << 7 | 22..16. */
static uint64_t split32(const uint8_t *src, uint32_t n, enc_scratch *sc, uint32_t hist[256])
{
    uint32_t h4[4][256];
    memset(h4, 0, sizeof(h4));
    uint64_t sum = 0;
    for (uint32_t e = 0; e < n; e++) {
        uint32_t w = rd32(src + 4 * (uint64_t)e);
        sum += fmix64((uint64_t)w | (uint64_t)e << 32);
        uint8_t sym = (uint8_t)(w >> 23);
        uint8_t *r = sc->raw + 3 * (uint64_t)e;
        r[0] = (uint8_t)w;
        r[1] = (uint8_t)(w >> 8);
        r[2] = (uint8_t)(((w >> 24) & 0x80u) | ((w >> 16) & 0x7Fu));
        sc->syms[e] = sym;
        h4[e & 3][sym]++;
    }
    for (int s = 0; s < 256; s++)
        hist[s] = h4[0][s] + h4[1][s] + h4[2][s] + h4[3][s];
    return sum;
}

static void put_header(uint8_t *b, uint8_t mode, uint32_t esize, uint32_t elems, uint64_t len,
                       uint64_t exp_bytes, uint64_t checksum)
{
    memset(b, 0, DDO_CODEC_BLOCK_HEADER);
    wr32(b, BLOCK_MAGIC);
    b[4] = mode;
    b[5] = (uint8_t)esize;
    wr32(b + 8, elems);
    wr32(b + 12, (uint32_t)len);
    wr32(b + 16, (uint32_t)exp_bytes);
    wr64(b + 24, checksum);
}

static uint64_t block_meta_hash(const uint8_t *b, uint64_t meta_end)
{
    return ddo__codec_checksum(b, 40, 0) +
           ddo__codec_checksum(b + DDO_CODEC_BLOCK_HEADER, meta_end - DDO_CODEC_BLOCK_HEADER, 12);
}

static uint64_t put_raw(const uint8_t *src, uint64_t bytes, uint32_t esize, uint64_t sum,
                        uint8_t *out)
{
    uint64_t len = raw_block_bytes(bytes);
    put_header(out, DDO_CODEC_MODE_RAW, esize, (uint32_t)(bytes / esize), len, 0, sum);
    memcpy(out + DDO_CODEC_BLOCK_HEADER, src, (size_t)bytes);
    memset(out + DDO_CODEC_BLOCK_HEADER + bytes, 0, (size_t)(len - DDO_CODEC_BLOCK_HEADER - bytes));
    wr64(out + 40, block_meta_hash(out, DDO_CODEC_BLOCK_HEADER));
    return len;
}

/* Lane offsets (bytes into the exponent streams) from the code lengths; returns the total. */
static uint64_t lane_offsets(const uint8_t *syms, uint32_t n, const uint8_t lens[256],
                             uint32_t *lanes)
{
    uint64_t lanes_n = groups_of(n) * DDO_CODEC_LANES, off = 0;
    for (uint64_t li = 0; li < lanes_n; li++) {
        uint64_t g = li / DDO_CODEC_LANES, l = li % DDO_CODEC_LANES, bits = 0;
        for (uint64_t e = g * DDO_CODEC_GROUP_ELEMS + l;
             e < n && e < (g + 1) * DDO_CODEC_GROUP_ELEMS; e += DDO_CODEC_LANES)
            bits += lens[syms[e]];
        lanes[li] = (uint32_t)off;
        off += (bits + 31) / 32 * 4;
    }
    lanes[lanes_n] = (uint32_t)off;
    return off;
}

static void put_lanes(const uint8_t *syms, uint32_t n, const uint8_t lens[256],
                      const uint16_t rev[256], uint8_t *exp)
{
    uint64_t lanes_n = groups_of(n) * DDO_CODEC_LANES;
    uint8_t *p = exp;
    for (uint64_t li = 0; li < lanes_n; li++) {
        uint64_t g = li / DDO_CODEC_LANES, l = li % DDO_CODEC_LANES, acc = 0;
        unsigned nacc = 0;
        for (uint64_t e = g * DDO_CODEC_GROUP_ELEMS + l;
             e < n && e < (g + 1) * DDO_CODEC_GROUP_ELEMS; e += DDO_CODEC_LANES) {
            acc |= (uint64_t)rev[syms[e]] << nacc;
            nacc += lens[syms[e]];
            if (nacc >= 32) {
                wr32(p, (uint32_t)acc);
                p += 4;
                acc >>= 32;
                nacc -= 32;
            }
        }
        if (nacc > 0) {
            wr32(p, (uint32_t)acc);
            p += 4;
        }
    }
}

/* Encodes one block of n elements into out (room for its raw size); returns its length. */
static uint64_t encode_block(const uint8_t *src, uint32_t n, uint32_t esize, enc_scratch *sc,
                             uint8_t *out)
{
    uint64_t bytes = (uint64_t)n * esize;
    if (esize == 1)
        return put_raw(src, bytes, esize, ddo__codec_checksum(src, bytes, 0), out);
    uint32_t hist[256];
    uint64_t sum = esize == 2 ? split16(src, n, sc, hist) : split32(src, n, sc, hist);
    uint8_t lens[256];
    uint16_t rev[256];
    limited_lengths(hist, lens);
    if (!canonical_codes(lens, rev))
        return put_raw(src, bytes, esize, sum, out);
    uint64_t exp_bytes = lane_offsets(sc->syms, n, lens, sc->lanes);
    huff_layout h = layout_of(n, esize, exp_bytes);
    if (h.total >= raw_block_bytes(bytes))
        return put_raw(src, bytes, esize, sum, out);
    memset(out + TABLE_OFF, 0, (size_t)(h.total - TABLE_OFF));
    put_header(out, DDO_CODEC_MODE_HUFF, esize, n, h.total, exp_bytes, sum);
    for (int i = 0; i < 128; i++)
        out[LENS_OFF + i] = (uint8_t)(lens[2 * i] | lens[2 * i + 1] << 4);
    uint64_t lanes_n = groups_of(n) * DDO_CODEC_LANES;
    for (uint64_t i = 0; i <= lanes_n; i++)
        wr32(out + TABLE_OFF + 4 * i, sc->lanes[i]);
    memcpy(out + h.raw_off, sc->raw, (size_t)n * (esize - 1));
    put_lanes(sc->syms, n, lens, rev, out + h.exp_off);
    wr64(out + 40, block_meta_hash(out, h.raw_off));
    return h.total;
}

typedef struct enc_job {
    const uint8_t *src;
    uint64_t src_bytes;
    uint32_t esize, block_elems, n_blocks;
    uint8_t *dst;
    uint64_t *lens; /* coded length of each block */
    pthread_mutex_t lock;
    uint32_t next;
    bool failed;
} enc_job;

static uint64_t slot_offset(const enc_job *j, uint64_t b)
{
    return dir_end(j->n_blocks) + b * raw_block_bytes((uint64_t)j->block_elems * j->esize);
}

static void *enc_worker(void *arg)
{
    enc_job *j = arg;
    enc_scratch sc;
    sc.syms = ddo__malloc(j->block_elems);
    sc.raw = ddo__malloc((size_t)j->block_elems * 3);
    sc.lanes = ddo__calloc(j->block_elems / DDO_CODEC_LANE_SYMS + 1, sizeof(uint32_t));
    for (;;) {
        pthread_mutex_lock(&j->lock);
        bool nomem = sc.syms == NULL || sc.raw == NULL || sc.lanes == NULL;
        bool stop = j->failed || j->next >= j->n_blocks || nomem;
        uint32_t b = j->next++;
        if (nomem)
            j->failed = true;
        pthread_mutex_unlock(&j->lock);
        if (stop)
            break;
        uint64_t e0 = (uint64_t)b * j->block_elems, total = j->src_bytes / j->esize;
        uint32_t n = (uint32_t)(total - e0 < j->block_elems ? total - e0 : j->block_elems);
        j->lens[b] =
            encode_block(j->src + e0 * j->esize, n, j->esize, &sc, j->dst + slot_offset(j, b));
    }
    free(sc.syms);
    free(sc.raw);
    free(sc.lanes);
    return NULL;
}

static void run_workers(enc_job *j, unsigned threads)
{
    enum { MAX_THREADS = 256 };
    pthread_t tid[MAX_THREADS];
    unsigned started = 0;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads > j->n_blocks)
        threads = j->n_blocks;
    for (unsigned t = 1; t < threads; t++) {
        if (pthread_create(&tid[started], NULL, enc_worker, j) != 0)
            break;
        started++;
    }
    enc_worker(j);
    for (unsigned t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
}

/* Moves the blocks from their worst-case slots to their final places; writes header and dir. */
static uint64_t finish_stream(const enc_job *j, ddo_dtype dtype)
{
    uint8_t *d = j->dst;
    uint64_t off = dir_end(j->n_blocks);
    memset(d, 0, (size_t)off);
    for (uint32_t b = 0; b < j->n_blocks; b++) {
        memmove(d + off, d + slot_offset(j, b), (size_t)j->lens[b]);
        wr64(d + DDO_CODEC_STREAM_HEADER + 8 * (uint64_t)b, off);
        off += j->lens[b];
    }
    wr32(d, STREAM_MAGIC);
    d[4] = (uint8_t)VERSION;
    d[6] = (uint8_t)dtype;
    d[7] = (uint8_t)j->esize;
    wr32(d + 8, j->block_elems);
    wr32(d + 12, j->n_blocks);
    wr64(d + 16, j->src_bytes);
    wr64(d + 24, off);
    uint64_t h = ddo__codec_checksum(d, 56, 0) +
                 ddo__codec_checksum(d + DDO_CODEC_STREAM_HEADER,
                                     dir_end(j->n_blocks) - DDO_CODEC_STREAM_HEADER, 16);
    wr64(d + 56, h);
    return off;
}

int ddo__codec_encode(const void *src, uint64_t src_bytes, ddo_dtype dtype,
                      const ddo__codec_params *p, void *dst, uint64_t dst_cap,
                      uint64_t *coded_bytes, const char *name, ddo__errbuf *eb)
{
    const char *nm = name ? name : "?";
    uint32_t be = block_param(p ? p->block_elems : 0);
    uint64_t bound = ddo__codec_bound(dtype, src_bytes, be);
    if (bound == 0 || (src == NULL && src_bytes > 0) || dst == NULL || coded_bytes == NULL)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "codec: tensor `%s`: cannot encode %" PRIu64 " bytes of %s in blocks of "
                         "%" PRIu32 " elements (a multiple of %u up to %" PRIu32
                         ", whole elements)",
                         nm, src_bytes, ddo_dtype_name(dtype) ? ddo_dtype_name(dtype) : "?", be,
                         (unsigned)DDO_CODEC_GROUP_ELEMS, DDO_CODEC_MAX_BLOCK);
    if (dst_cap < bound)
        return ddo__fail(eb, DDO_E_INVALID_ARGUMENT,
                         "codec: tensor `%s`: output of %" PRIu64 " bytes is under the bound "
                         "%" PRIu64,
                         nm, dst_cap, bound);
    enc_job j;
    memset(&j, 0, sizeof(j));
    j.src = src;
    j.src_bytes = src_bytes;
    j.esize = stream_esize(dtype);
    j.block_elems = be;
    j.n_blocks = (uint32_t)((src_bytes / j.esize + be - 1) / be);
    j.dst = dst;
    j.lens = ddo__calloc(j.n_blocks ? j.n_blocks : 1, sizeof(uint64_t));
    if (j.lens == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "codec: tensor `%s`: out of host memory", nm);
    pthread_mutex_init(&j.lock, NULL);
    run_workers(&j, p && p->threads > 1 ? p->threads : 1);
    pthread_mutex_destroy(&j.lock);
    int rc = 0;
    if (j.failed)
        rc = ddo__fail(eb, DDO_E_NO_MEMORY, "codec: tensor `%s`: out of host memory", nm);
    else
        *coded_bytes = finish_stream(&j, dtype);
    free(j.lens);
    return rc;
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
    if (len < DDO_CODEC_STREAM_HEADER || rd32(c) != STREAM_MAGIC)
        return BAD("codec: tensor `%s`: not a DDOC stream (%" PRIu64 " bytes, no magic)", nm, len);
    if ((c[4] | c[5] << 8) != VERSION || !all_zero(c + 32, 24))
        return BAD("codec: tensor `%s`: stream header: version %u or reserved bytes invalid", nm,
                   (unsigned)(c[4] | c[5] << 8));
    if (c[6] >= DDO_DTYPE_COUNT || c[7] != stream_esize((ddo_dtype)c[6]))
        return BAD("codec: tensor `%s`: stream header: dtype %u / element size %u invalid", nm,
                   c[6], c[7]);
    h->dtype = (ddo_dtype)c[6];
    h->esize = c[7];
    h->block_elems = rd32(c + 8);
    h->n_blocks = rd32(c + 12);
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
    if (h->coded_bytes != len || dir_end(h->n_blocks) > len)
        return BAD("codec: tensor `%s`: stream header says %" PRIu64 " coded bytes, %" PRIu64
                   " given",
                   nm, h->coded_bytes, len);
    uint64_t want = ddo__codec_checksum(c, 56, 0) +
                    ddo__codec_checksum(c + DDO_CODEC_STREAM_HEADER,
                                        dir_end(h->n_blocks) - DDO_CODEC_STREAM_HEADER, 16);
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
    if (!canonical_codes(lens, rev))
        return BAD("codec: tensor `%s`: block %" PRIu32 ": code lengths invalid", nm, b);
    uint64_t lanes_n = groups_of(n) * DDO_CODEC_LANES;
    huff_layout h = layout_of(n, esize, exp_bytes);
    uint32_t prev = 0;
    for (uint64_t i = 0; i <= lanes_n; i++) {
        uint32_t o = rd32(blk + TABLE_OFF + 4 * i);
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

static int check_block(const uint8_t *c, const stream_hdr *h, uint32_t b, uint64_t off,
                       const char *nm, ddo__codec_block *out, ddo__errbuf *eb)
{
    if (off % 16 != 0 || off > h->coded_bytes || h->coded_bytes - off < DDO_CODEC_BLOCK_HEADER)
        return BAD("codec: tensor `%s`: block %" PRIu32 ": offset %" PRIu64 " out of bounds", nm, b,
                   off);
    const uint8_t *blk = c + off;
    uint32_t n = elems_of_block(h, b), len = rd32(blk + 12);
    uint64_t exp_bytes = rd32(blk + 16), bytes = (uint64_t)n * h->esize;
    uint8_t mode = blk[4];
    if (rd32(blk) != BLOCK_MAGIC || blk[5] != h->esize || rd32(blk + 8) != n || blk[6] || blk[7] ||
        rd32(blk + 20) != 0 || rd64(blk + 32) != 0 || len % 16 != 0 || len > h->coded_bytes - off ||
        mode > DDO_CODEC_MODE_HUFF ||
        (mode == DDO_CODEC_MODE_HUFF && (h->esize == 1 || exp_bytes % 4 != 0)))
        return BAD("codec: tensor `%s`: block %" PRIu32 ": header invalid", nm, b);
    uint64_t want = mode == DDO_CODEC_MODE_RAW ? raw_block_bytes(bytes)
                                               : layout_of(n, h->esize, exp_bytes).total;
    if (len != want || (mode == DDO_CODEC_MODE_RAW && exp_bytes != 0))
        return BAD("codec: tensor `%s`: block %" PRIu32 ": length %" PRIu32 " invalid", nm, b, len);
    uint64_t meta_end = mode == DDO_CODEC_MODE_RAW ? DDO_CODEC_BLOCK_HEADER
                                                   : layout_of(n, h->esize, exp_bytes).raw_off;
    if (rd64(blk + 40) != block_meta_hash(blk, meta_end))
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
    uint64_t off = dir_end(h.n_blocks);
    for (uint32_t b = 0; b < h.n_blocks && rc == 0; b++) {
        uint64_t at = rd64(c + DDO_CODEC_STREAM_HEADER + 8 * (uint64_t)b);
        if (at != off)
            rc = BAD("codec: tensor `%s`: block %" PRIu32 ": directory offset %" PRIu64
                     " (expected %" PRIu64 ")",
                     nm, b, at, off);
        else
            rc = check_block(c, &h, b, off, nm, &blocks[b], eb);
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
            buf |= (uint64_t)rd32(words + 4 * (uint64_t)wi++) << nb;
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
    uint64_t len = rd32(blk + 12), exp_bytes = rd32(blk + 16);
    if (rd32(blk) != BLOCK_MAGIC || blk[5] != l->esize || rd32(blk + 8) != n ||
        len > src_bytes - off || blk[4] > DDO_CODEC_MODE_HUFF)
        return UINT64_MAX;
    if (blk[4] == DDO_CODEC_MODE_RAW)
        return len >= DDO_CODEC_BLOCK_HEADER + (uint64_t)n * l->esize ? off : UINT64_MAX;
    if (l->esize == 1 || exp_bytes % 4 != 0 || layout_of(n, l->esize, exp_bytes).total > len)
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
    uint64_t exp_bytes = rd32(blk + 16);
    huff_layout h = layout_of(n, esize, exp_bytes);
    uint32_t flags = 0;
    for (uint64_t g = 0; g < groups_of(n); g++) {
        uint64_t g0 = g * DDO_CODEC_GROUP_ELEMS;
        uint32_t cnt = (uint32_t)(n - g0 < DDO_CODEC_GROUP_ELEMS ? n - g0 : DDO_CODEC_GROUP_ELEMS);
        for (uint32_t l = 0; l < DDO_CODEC_LANES; l++) {
            const uint8_t *t = blk + TABLE_OFF + 4 * (g * DDO_CODEC_LANES + l);
            uint32_t s = rd32(t), e = rd32(t + 4);
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

int ddo__codec_decode(const void *coded, uint64_t coded_bytes, void *dst, uint64_t dst_bytes,
                      const char *name, ddo__errbuf *eb)
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
    for (uint32_t b = 0; b < p->launch.n_blocks && rc == 0; b++) {
        uint64_t st[2];
        decode_one(coded, coded_bytes, dst, dst_bytes, &p->launch, b, st);
        const char *what = block_problem(&p->launch, p->blocks[b].checksum, st);
        if (what != NULL)
            rc = corrupted(eb, p, b, what);
    }
    ddo__codec_plan_destroy(p);
    return rc;
}
