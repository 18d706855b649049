/*
 * codec_encode.c - the DDOC v1 encoder (format: codec.c): per block, the
 * symbols' histogram (FP8: of the bytes themselves), length-limited Huffman
 * code lengths (package-merge where a Huffman code is too deep), the lane streams
 * and the raw plane (or a raw block where coding does not pay), blocks encoded
 * in parallel by worker threads into fixed slots, then packed into the stream.
 */
#include "codec/codec_internal.h"

#include "os/thread.h"
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

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

/*
 * Lengths limited to DDO_CODEC_MAX_CODE_BITS. A Huffman code whose longest code fits is kept;
 * otherwise the optimal length-limited code (package-merge, Larmore and Hirschberg): L lists,
 * the first the symbols by increasing weight, each next one those symbols merged with the
 * pairs ("packages") of the list before; the first 2m - 2 items of the last list, unfolded
 * level by level, give each symbol its length (how many levels hold it in their selected
 * prefix). Halving every weight until the code fit, as before, cost FP8 weights (codes up to
 * 19 bits deep) about 0.03 bit per element more.
 */
static void limited_lengths(const uint32_t hist[256], uint8_t lens[256])
{
    enum { L = DDO_CODEC_MAX_CODE_BITS, N = 512 };
    if (huff_lengths(hist, lens) <= L)
        return;
    uint32_t leaf[256][2];
    int m = 0;
    for (int s = 0; s < 256; s++)
        if (hist[s] != 0) {
            leaf[m][0] = hist[s];
            leaf[m][1] = (uint32_t)s;
            m++;
        }
    qsort(leaf, (size_t)m, sizeof(leaf[0]), by_weight);
    uint64_t w[2][N];
    uint8_t is_leaf[L][N];
    int len[L];
    for (int i = 0; i < m; i++) {
        w[0][i] = leaf[i][0];
        is_leaf[0][i] = 1;
    }
    len[0] = m;
    for (int lv = 1; lv < L; lv++) { /* merge the leaves with the packages of level lv - 1 */
        const uint64_t *prev = w[(lv - 1) & 1];
        uint64_t *cur = w[lv & 1];
        int np = len[lv - 1] / 2, a = 0, b = 0, k = 0;
        while (a < m || b < np) {
            uint64_t pw = b < np ? prev[2 * b] + prev[2 * b + 1] : UINT64_MAX;
            bool take_leaf = a < m && (uint64_t)leaf[a][0] <= pw;
            cur[k] = take_leaf ? leaf[a++][0] : pw;
            is_leaf[lv][k++] = take_leaf;
            b += !take_leaf;
        }
        len[lv] = k;
    }
    memset(lens, 0, 256);
    int sel = 2 * m - 2;
    for (int lv = L - 1; lv >= 0 && sel > 0; lv--) {
        int leaves = 0;
        for (int k = 0; k < sel; k++)
            leaves += is_leaf[lv][k];
        for (int r = 0; r < leaves; r++) /* the lightest `leaves` symbols are one bit longer */
            lens[leaf[r][1]]++;
        sel = 2 * (sel - leaves);
    }
}

/* ---- encoder ---- */

/* Per-worker scratch: the symbols of a block, its lane offsets and its exponent streams. */
typedef struct enc_scratch {
    uint8_t *syms;
    uint8_t *raw; /* the raw plane */
    uint32_t *lanes;
    uint8_t *exp; /* the lane streams, before the block's layout is known */
} enc_scratch;

/* The most bytes the lane streams of n elements take: every code at its longest, every lane
 * padded to a whole word. */
static uint64_t exp_cap(uint32_t n)
{
    return ((uint64_t)n * DDO_CODEC_MAX_CODE_BITS + 7) / 8 +
           4 * (ddo__codec_groups_of(n) * DDO_CODEC_LANES + 1);
}

/* Two elements of a 16-bit block from one little-endian word: their symbols (bits 14..7) and
 * raw bytes (sign << 7 | bits 6..0), and the word's share of the checksum. */
static inline uint64_t split_word(uint32_t w, uint64_t i, uint8_t *syms, uint8_t *raw)
{
    uint32_t r = ((w >> 8) & 0x00800080u) | (w & 0x007F007Fu); /* both raw bytes */
    syms[0] = (uint8_t)(w >> 7);
    syms[1] = (uint8_t)(w >> 23);
    raw[0] = (uint8_t)r;
    raw[1] = (uint8_t)(r >> 16);
    return ddo__codec_fmix64((uint64_t)w | i << 32);
}

/*
 * One pass over a block of 16-bit elements: the checksum, each element's symbol and raw
 * byte, and the histogram. Two words (four elements) a step, each element into its own of
 * four interleaved counters, so runs of one symbol do not serialise on one counter and no
 * counter index is computed.
 */
static uint64_t split16(const uint8_t *src, uint32_t n, enc_scratch *sc, uint32_t hist[256])
{
    uint32_t h4[4][256];
    memset(h4, 0, sizeof(h4));
    uint64_t sum = 0;
    uint32_t pairs = n / 2, i = 0;
    uint8_t *sy = sc->syms, *rw = sc->raw;
    for (; i + 2 <= pairs; i += 2) { /* whole words, no tail tests */
        sum += split_word(ddo__codec_rd32(src + 4 * (uint64_t)i), i, sy + 2 * i, rw + 2 * i);
        sum += split_word(ddo__codec_rd32(src + 4 * (uint64_t)i + 4), i + 1, sy + 2 * i + 2,
                          rw + 2 * i + 2);
        h4[0][sy[2 * i]]++;
        h4[1][sy[2 * i + 1]]++;
        h4[2][sy[2 * i + 2]]++;
        h4[3][sy[2 * i + 3]]++;
    }
    if (i < pairs) { /* an odd word */
        sum += split_word(ddo__codec_rd32(src + 4 * (uint64_t)i), i, sy + 2 * i, rw + 2 * i);
        h4[0][sy[2 * i]]++;
        h4[1][sy[2 * i + 1]]++;
    }
    if (n & 1u) { /* the last element alone: its word zero-padded */
        uint32_t e = n - 1,
                 v = (uint32_t)src[2 * (uint64_t)e] | (uint32_t)src[2 * (uint64_t)e + 1] << 8;
        sum += ddo__codec_fmix64((uint64_t)v | (uint64_t)pairs << 32);
        uint8_t sym = (uint8_t)(v >> 7);
        sy[e] = sym;
        rw[e] = (uint8_t)(((v >> 8) & 0x80u) | (v & 0x7Fu));
        h4[0][sym]++;
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
        uint32_t w = ddo__codec_rd32(src + 4 * (uint64_t)e);
        sum += ddo__codec_fmix64((uint64_t)w | (uint64_t)e << 32);
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
    ddo__codec_wr32(b, BLOCK_MAGIC);
    b[4] = mode;
    b[5] = (uint8_t)esize;
    ddo__codec_wr32(b + 8, elems);
    ddo__codec_wr32(b + 12, (uint32_t)len);
    ddo__codec_wr32(b + 16, (uint32_t)exp_bytes);
    ddo__codec_wr64(b + 24, checksum);
}

static uint64_t put_raw(const uint8_t *src, uint64_t bytes, uint32_t esize, uint64_t sum,
                        uint8_t *out)
{
    uint64_t len = ddo__codec_raw_block_bytes(bytes);
    put_header(out, DDO_CODEC_MODE_RAW, esize, (uint32_t)(bytes / esize), len, 0, sum);
    memcpy(out + DDO_CODEC_BLOCK_HEADER, src, (size_t)bytes);
    memset(out + DDO_CODEC_BLOCK_HEADER + bytes, 0, (size_t)(len - DDO_CODEC_BLOCK_HEADER - bytes));
    ddo__codec_wr64(out + 40, ddo__codec_block_meta_hash(out, DDO_CODEC_BLOCK_HEADER));
    return len;
}

/* The lane streams into exp (one pass: each lane's bits follow the one before, padded to a
 * word) and each lane's offset into lanes (the last entry: the total); returns the total. */
static uint64_t put_lanes(const uint8_t *syms, uint32_t n, const uint8_t lens[256],
                          const uint16_t rev[256], uint32_t *lanes, uint8_t *exp)
{
    uint64_t lanes_n = ddo__codec_groups_of(n) * DDO_CODEC_LANES;
    uint8_t *p = exp;
    for (uint64_t li = 0; li < lanes_n; li++) {
        uint64_t g = li / DDO_CODEC_LANES, l = li % DDO_CODEC_LANES, acc = 0;
        uint64_t end = (g + 1) * DDO_CODEC_GROUP_ELEMS < n ? (g + 1) * DDO_CODEC_GROUP_ELEMS : n;
        unsigned nacc = 0;
        lanes[li] = (uint32_t)(p - exp);
        for (uint64_t e = g * DDO_CODEC_GROUP_ELEMS + l; e < end; e += DDO_CODEC_LANES) {
            acc |= (uint64_t)rev[syms[e]] << nacc;
            nacc += lens[syms[e]];
            if (nacc >= 32) {
                ddo__codec_wr32(p, (uint32_t)acc);
                p += 4;
                acc >>= 32;
                nacc -= 32;
            }
        }
        if (nacc > 0) {
            ddo__codec_wr32(p, (uint32_t)acc);
            p += 4;
        }
    }
    lanes[lanes_n] = (uint32_t)(p - exp);
    return (uint64_t)(p - exp);
}

/* The same for bytes (FP8): each byte is its own symbol (no raw plane); the histogram only,
 * four interleaved counters as above, and the checksum. */
static uint64_t split8(const uint8_t *src, uint32_t n, uint32_t hist[256])
{
    uint32_t h4[4][256];
    memset(h4, 0, sizeof(h4));
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        h4[0][src[i]]++;
        h4[1][src[i + 1]]++;
        h4[2][src[i + 2]]++;
        h4[3][src[i + 3]]++;
    }
    for (; i < n; i++)
        h4[i & 3][src[i]]++;
    for (int s = 0; s < 256; s++)
        hist[s] = h4[0][s] + h4[1][s] + h4[2][s] + h4[3][s];
    return ddo__codec_checksum(src, n, 0);
}

/* Encodes one block of n elements into out (room for its raw size); returns its length.
 * code false: a dtype the codec does not code (stored raw). */
static uint64_t encode_block(const uint8_t *src, uint32_t n, uint32_t esize, bool code,
                             enc_scratch *sc, uint8_t *out)
{
    uint64_t bytes = (uint64_t)n * esize;
    if (!code)
        return put_raw(src, bytes, esize, ddo__codec_checksum(src, bytes, 0), out);
    uint32_t hist[256];
    uint64_t sum = esize == 1   ? split8(src, n, hist)
                   : esize == 2 ? split16(src, n, sc, hist)
                                : split32(src, n, sc, hist);
    const uint8_t *syms = esize == 1 ? src : sc->syms;
    uint8_t lens[256];
    uint16_t rev[256];
    limited_lengths(hist, lens);
    if (!ddo__codec_canonical_codes(lens, rev))
        return put_raw(src, bytes, esize, sum, out);
    uint64_t exp_bytes = put_lanes(syms, n, lens, rev, sc->lanes, sc->exp);
    huff_layout h = ddo__codec_layout_of(n, esize, exp_bytes);
    if (h.total >= ddo__codec_raw_block_bytes(bytes))
        return put_raw(src, bytes, esize, sum, out);
    memset(out + TABLE_OFF, 0, (size_t)(h.total - TABLE_OFF));
    put_header(out, DDO_CODEC_MODE_HUFF, esize, n, h.total, exp_bytes, sum);
    for (int i = 0; i < 128; i++)
        out[LENS_OFF + i] = (uint8_t)(lens[2 * i] | lens[2 * i + 1] << 4);
    uint64_t lanes_n = ddo__codec_groups_of(n) * DDO_CODEC_LANES;
    for (uint64_t i = 0; i <= lanes_n; i++)
        ddo__codec_wr32(out + TABLE_OFF + 4 * i, sc->lanes[i]);
    memcpy(out + h.raw_off, sc->raw, (size_t)n * (esize - 1));
    memcpy(out + h.exp_off, sc->exp, (size_t)exp_bytes);
    ddo__codec_wr64(out + 40, ddo__codec_block_meta_hash(out, h.raw_off));
    return h.total;
}

typedef struct enc_job {
    const uint8_t *src;
    uint64_t src_bytes;
    uint32_t esize, block_elems, n_blocks;
    bool code; /* a coded dtype (else every block is raw) */
    uint8_t *dst;
    uint64_t *lens; /* coded length of each block */
    ddo__mutex lock;
    uint32_t next;
    bool failed;
} enc_job;

static uint64_t slot_offset(const enc_job *j, uint64_t b)
{
    return ddo__codec_dir_end(j->n_blocks) +
           b * ddo__codec_raw_block_bytes((uint64_t)j->block_elems * j->esize);
}

static void *enc_worker(void *arg)
{
    enc_job *j = arg;
    enc_scratch sc;
    sc.syms = ddo__malloc(j->block_elems);
    sc.raw = ddo__malloc((size_t)j->block_elems * 3);
    sc.lanes = ddo__calloc(j->block_elems / DDO_CODEC_LANE_SYMS + 1, sizeof(uint32_t));
    sc.exp = ddo__malloc((size_t)exp_cap(j->block_elems));
    for (;;) {
        ddo__mutex_lock(&j->lock);
        bool nomem = sc.syms == NULL || sc.raw == NULL || sc.lanes == NULL || sc.exp == NULL;
        bool stop = j->failed || j->next >= j->n_blocks || nomem;
        uint32_t b = j->next++;
        if (nomem)
            j->failed = true;
        ddo__mutex_unlock(&j->lock);
        if (stop)
            break;
        uint64_t e0 = (uint64_t)b * j->block_elems, total = j->src_bytes / j->esize;
        uint32_t n = (uint32_t)(total - e0 < j->block_elems ? total - e0 : j->block_elems);
        j->lens[b] = encode_block(j->src + e0 * j->esize, n, j->esize, j->code, &sc,
                                  j->dst + slot_offset(j, b));
    }
    free(sc.syms);
    free(sc.raw);
    free(sc.lanes);
    free(sc.exp);
    return NULL;
}

static void run_workers(enc_job *j, unsigned threads)
{
    enum { MAX_THREADS = 256 };
    ddo__thread tid[MAX_THREADS];
    unsigned started = 0;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads > j->n_blocks)
        threads = j->n_blocks;
    for (unsigned t = 1; t < threads; t++) {
        if (ddo__thread_create(&tid[started], enc_worker, j) != 0)
            break;
        started++;
    }
    enc_worker(j);
    for (unsigned t = 0; t < started; t++)
        ddo__thread_join(tid[t]);
}

/* Moves the blocks from their worst-case slots to their final places; writes header and dir. */
static uint64_t finish_stream(const enc_job *j, ddo_dtype dtype)
{
    uint8_t *d = j->dst;
    uint64_t off = ddo__codec_dir_end(j->n_blocks);
    memset(d, 0, (size_t)off);
    for (uint32_t b = 0; b < j->n_blocks; b++) {
        memmove(d + off, d + slot_offset(j, b), (size_t)j->lens[b]);
        ddo__codec_wr64(d + DDO_CODEC_STREAM_HEADER + 8 * (uint64_t)b, off);
        off += j->lens[b];
    }
    ddo__codec_wr32(d, STREAM_MAGIC);
    d[4] = (uint8_t)VERSION;
    d[6] = (uint8_t)dtype;
    d[7] = (uint8_t)j->esize;
    ddo__codec_wr32(d + 8, j->block_elems);
    ddo__codec_wr32(d + 12, j->n_blocks);
    ddo__codec_wr64(d + 16, j->src_bytes);
    ddo__codec_wr64(d + 24, off);
    uint64_t h = ddo__codec_checksum(d, 56, 0) +
                 ddo__codec_checksum(d + DDO_CODEC_STREAM_HEADER,
                                     ddo__codec_dir_end(j->n_blocks) - DDO_CODEC_STREAM_HEADER, 16);
    ddo__codec_wr64(d + 56, h);
    return off;
}

int ddo__codec_encode(const void *src, uint64_t src_bytes, ddo_dtype dtype,
                      const ddo__codec_params *p, void *dst, uint64_t dst_cap,
                      uint64_t *coded_bytes, const char *name, ddo__errbuf *eb)
{
    const char *nm = name ? name : "?";
    uint32_t be = ddo__codec_block_param(p ? p->block_elems : 0);
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
    j.esize = ddo__codec_stream_esize(dtype);
    j.code = ddo__codec_codes_dtype(dtype);
    j.block_elems = be;
    j.n_blocks = (uint32_t)((src_bytes / j.esize + be - 1) / be);
    j.dst = dst;
    j.lens = ddo__calloc(j.n_blocks ? j.n_blocks : 1, sizeof(uint64_t));
    if (j.lens == NULL)
        return ddo__fail(eb, DDO_E_NO_MEMORY, "codec: tensor `%s`: out of host memory", nm);
    ddo__mutex_init(&j.lock);
    run_workers(&j, p && p->threads > 1 ? p->threads : 1);
    ddo__mutex_destroy(&j.lock);
    int rc = 0;
    if (j.failed)
        rc = ddo__fail(eb, DDO_E_NO_MEMORY, "codec: tensor `%s`: out of host memory", nm);
    else
        *coded_bytes = finish_stream(&j, dtype);
    free(j.lens);
    return rc;
}
