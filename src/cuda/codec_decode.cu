/*
 * codec_decode.cu - the device decoder of ddo's weight codec (format DDOC v1,
 * src/codec/codec.h and docs/codec.md), compiled to PTX at build time, embedded in
 * libddo and loaded through the driver API (cuModuleLoadData), so libddo has
 * no CUDA runtime dependency.
 *
 * One launch decodes a batch of up to MAX_BATCH tensors (their descriptors in
 * the kernel parameters, struct kbatch): tensor i owns thread blocks
 * [first_cta_i, first_cta_i + n_blocks_i * ctas_per_block_i) of the grid, and
 * a thread block finds its tensor by a binary search over first_cta.
 *
 * Work split within a tensor: its thread block c decodes part
 * (c % ctas_per_block) of coded block (c / ctas_per_block); each warp decodes
 * one group of 32768 elements, lane l
 * its lane stream (elements k*32 + l), so the raw-plane loads and the stores
 * of a warp are contiguous. The decoding table (4096 entries of symbol and
 * length, from the block's 4-bit canonical code lengths) lives in shared
 * memory; each element costs one table lookup.
 *
 * Safety: geometry (block count and size, element size, total) comes from the
 * kernel arguments, which the host took from validated plans; everything read
 * from a tensor's coded bytes is checked against its src_bytes before use, and
 * writes go only to its dst[0, total_elems * esize) (checked against its
 * dst_bytes) and its status words.
 * Integrity: every block adds the checksum of what it decoded into its first
 * status word, ORs flags into the second and counts its finished thread
 * blocks in that word's high half; the host compares (ddo__codec_status_check).
 */
#define LANES       32
#define LANE_SYMS   1024
#define GROUP_ELEMS (LANES * LANE_SYMS)
#define MAX_BITS    12
#define LUT_SIZE    (1 << MAX_BITS)
#define BLOCK_MAGIC 0x424F4444u
#define HEADER      48
#define LENS_OFF    48
#define TABLE_OFF   176
#define BAD_HEADER  1u
#define BAD_TABLE   2u
#define BAD_STREAM  4u
#define MAX_BATCH   48 /* DDO_CODEC_BATCH_MAX (codec.h) */

typedef unsigned long long u64;
typedef unsigned int u32;

static __device__ __forceinline__ u64 fmix64(u64 k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

static __device__ __forceinline__ u64 pad16(u64 n)
{
    return (n + 15) & ~15ull;
}

static __device__ __forceinline__ u64 warp_sum(u64 v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ u32 warp_or(u32 v)
{
    for (int o = 16; o > 0; o >>= 1)
        v |= __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

struct block_info {
    u64 off;       /* of the block in src */
    u32 mode;      /* 0 raw, 1 huff */
    u32 exp_bytes; /* huff */
    u32 flags;
};

/* Thread 0: reads and checks block b's directory entry and header. */
static __device__ void locate(const unsigned char *src, u64 src_bytes, u32 n_blocks, u32 b, u32 n,
                              u32 esize, block_info *bi)
{
    bi->flags = BAD_HEADER;
    u64 de = 64ull + 8ull * n_blocks;
    if (de > src_bytes)
        return;
    u64 off = *(const u64 *)(src + 64 + 8ull * b);
    if ((off & 15) != 0 || off < de || off > src_bytes || src_bytes - off < HEADER)
        return;
    const u32 *h = (const u32 *)(src + off);
    u32 mode = h[1] & 0xff, es = (h[1] >> 8) & 0xff, len = h[3], exp_bytes = h[4];
    if (h[0] != BLOCK_MAGIC || es != esize || h[2] != n || len > src_bytes - off || mode > 1)
        return;
    if (mode == 0) {
        if (len < HEADER + (u64)n * esize)
            return;
    } else {
        u64 groups = (n + GROUP_ELEMS - 1) / GROUP_ELEMS;
        u64 raw_off = TABLE_OFF + pad16((groups * LANES + 1) * 4);
        u64 total = raw_off + pad16((u64)n * (esize - 1)) + pad16(exp_bytes);
        if ((exp_bytes & 3) != 0 || total > len)
            return;
    }
    bi->off = off;
    bi->mode = mode;
    bi->exp_bytes = exp_bytes;
    bi->flags = 0;
}

/* Copies this thread block's share of a raw block, hashing 16-byte vectors. */
static __device__ u64 copy_raw(const unsigned char *blk, unsigned char *out, u64 bytes, u32 part,
                               u32 parts)
{
    u64 vecs = bytes / 16, per = (vecs + parts - 1) / parts;
    u64 v0 = per * part, v1 = min(vecs, v0 + per);
    const uint4 *in = (const uint4 *)(blk + HEADER);
    uint4 *o = (uint4 *)out;
    u64 sum = 0;
    for (u64 v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
        uint4 x = in[v];
        o[v] = x;
        sum += fmix64((u64)x.x | (4 * v) << 32) + fmix64((u64)x.y | (4 * v + 1) << 32) +
               fmix64((u64)x.z | (4 * v + 2) << 32) + fmix64((u64)x.w | (4 * v + 3) << 32);
    }
    if (part == parts - 1 && threadIdx.x == 0 && bytes % 16 != 0) {
        for (u64 w = vecs * 4; w * 4 < bytes; w++) {
            u32 word = 0;
            for (u32 i = 0; i < 4 && w * 4 + i < bytes; i++) {
                unsigned char c = blk[HEADER + w * 4 + i];
                out[w * 4 + i] = c;
                word |= (u32)c << (8 * i);
            }
            sum += fmix64((u64)word | w << 32);
        }
    }
    return sum;
}

/* Builds the decoding table from the block's code lengths; false when they are invalid. */
static __device__ bool build_lut(const unsigned char *blk, unsigned short *lut,
                                 unsigned short *codes, unsigned char *lens, u32 *ok)
{
    for (u32 i = threadIdx.x; i < LUT_SIZE; i += blockDim.x)
        lut[i] = 0;
    for (u32 i = threadIdx.x; i < 128; i += blockDim.x) {
        unsigned char v = blk[LENS_OFF + i];
        lens[2 * i] = v & 15;
        lens[2 * i + 1] = v >> 4;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 count[MAX_BITS + 1] = { 0 }, next[MAX_BITS + 1] = { 0 }, kraft = 0, good = 1;
        for (int s = 0; s < 256; s++) {
            u32 l = lens[s];
            if (l > MAX_BITS)
                good = 0;
            else if (l != 0) {
                count[l]++;
                kraft += LUT_SIZE >> l;
            }
        }
        if (kraft == 0 || kraft > LUT_SIZE)
            good = 0;
        u32 code = 0;
        for (int l = 1; l <= MAX_BITS; l++) {
            code = (code + count[l - 1]) << 1;
            next[l] = code;
        }
        for (int s = 0; s < 256 && good; s++) {
            u32 l = lens[s];
            codes[s] = l ? (unsigned short)(__brev(next[l]++) >> (32 - l)) : 0;
        }
        *ok = good;
    }
    __syncthreads();
    bool good = *ok != 0;
    if (good)
        for (u32 s = threadIdx.x; s < 256; s += blockDim.x) {
            u32 l = lens[s];
            if (l != 0)
                for (u32 i = codes[s]; i < LUT_SIZE; i += 1u << l)
                    lut[i] = (unsigned short)(s | l << 8);
        }
    __syncthreads();
    return good;
}

/* One warp decodes group g of a huff block; returns this lane's checksum terms. */
template <int ESIZE>
static __device__ u64 decode_group(const unsigned char *blk, u32 n, u32 exp_bytes, u32 g,
                                   const unsigned short *lut, unsigned char *out, u32 *flags)
{
    const u32 lane = threadIdx.x & 31;
    u64 groups = (n + GROUP_ELEMS - 1) / GROUP_ELEMS;
    u64 raw_off = TABLE_OFF + pad16((groups * LANES + 1) * 4);
    u64 exp_off = raw_off + pad16((u64)n * (ESIZE - 1));
    const u32 *tab = (const u32 *)(blk + TABLE_OFF);
    u32 s = tab[g * LANES + lane], e = tab[g * LANES + lane + 1];
    if (s > e || e > exp_bytes || (s & 3) != 0 || (e & 3) != 0 || e - s > LANE_SYMS * 2) {
        *flags |= BAD_STREAM;
        s = e = 0;
    }
    const u32 *wp = (const u32 *)(blk + exp_off + s), *wend = (const u32 *)(blk + exp_off + e);
    u32 g0 = g * GROUP_ELEMS, cnt = min((u32)GROUP_ELEMS, n - g0);
    const unsigned char *raw = blk + raw_off + (u64)g0 * (ESIZE - 1);
    u32 steps = (cnt + 31) / 32;
    u64 buf = 0, sum = 0;
    u32 nb = 0;
    for (u32 k = 0; k < steps; k++) {
        u32 idx = k * 32 + lane, v = 0;
        bool act = idx < cnt;
        if (act) {
            if (nb < 32 && wp < wend) {
                buf |= (u64)__ldg(wp++) << nb;
                nb += 32;
            }
            u32 ent = lut[buf & (LUT_SIZE - 1)], len = ent >> 8;
            if (len == 0 || len > nb) {
                *flags |= BAD_STREAM;
                len = min(len, nb);
            }
            buf >>= len;
            nb -= len;
            u32 sym = ent & 0xff;
            if (ESIZE == 1) {
                v = sym;
                out[g0 + idx] = (unsigned char)v;
            } else if (ESIZE == 2) {
                u32 r = __ldg(raw + idx);
                v = (r & 0x80) << 8 | sym << 7 | (r & 0x7f);
                ((unsigned short *)out)[g0 + idx] = (unsigned short)v;
            } else {
                const unsigned char *r = raw + 3 * (u64)idx;
                u32 r24 = (u32)__ldg(r) | (u32)__ldg(r + 1) << 8 | (u32)__ldg(r + 2) << 16;
                v = (r24 >> 23) << 31 | sym << 23 | (r24 & 0x7fffff);
                ((u32 *)out)[g0 + idx] = v;
            }
        }
        if (ESIZE == 1) {
            u32 w = v | __shfl_down_sync(0xffffffffu, v, 1) << 8 |
                    __shfl_down_sync(0xffffffffu, v, 2) << 16 |
                    __shfl_down_sync(0xffffffffu, v, 3) << 24;
            if (act && (lane & 3) == 0)
                sum += fmix64((u64)w | (u64)((g0 + idx) / 4) << 32);
        } else if (ESIZE == 2) {
            u32 pv = __shfl_down_sync(0xffffffffu, v, 1);
            if (act && (lane & 1) == 0)
                sum += fmix64((u64)(v | pv << 16) | (u64)((g0 + idx) / 2) << 32);
        } else if (act) {
            sum += fmix64((u64)v | (u64)(g0 + idx) << 32);
        }
    }
    if (wp != wend || buf != 0 || nb >= 32)
        *flags |= BAD_STREAM;
    return sum;
}

/* One tensor of a batch, as the host lays it out (device_cuda.c, struct codec_kdesc). */
struct kdesc {
    u64 src, src_bytes, dst, dst_bytes, status, total_elems;
    u32 n_blocks, block_elems, esize, ctas_per_block, first_cta, pad;
};

/* The kernel's parameters: the batch's descriptors, first_cta ascending from 0. */
struct kbatch {
    u32 count, pad;
    kdesc d[MAX_BATCH];
};

/* Thread block cta of one tensor: part (cta % ctas_per_block) of its coded block
 * (cta / ctas_per_block). */
static __device__ __forceinline__ void decode_cta(const kdesc &x, u32 cta)
{
    __shared__ unsigned short lut[LUT_SIZE];
    __shared__ unsigned short codes[256];
    __shared__ unsigned char lens[256];
    __shared__ block_info bi;
    __shared__ u32 ok;
    const unsigned char *src = (const unsigned char *)x.src;
    u64 src_bytes = x.src_bytes;
    u32 b = cta / x.ctas_per_block, part = cta % x.ctas_per_block;
    if (b >= x.n_blocks)
        return;
    u64 e0 = (u64)b * x.block_elems;
    u32 n = (u32)min((u64)x.block_elems, x.total_elems - e0);
    u64 *st = (u64 *)x.status + 2ull * b;
    if (threadIdx.x == 0) {
        locate(src, src_bytes, x.n_blocks, b, n, x.esize, &bi);
        if ((e0 + n) * x.esize > x.dst_bytes)
            bi.flags = BAD_HEADER;
    }
    __syncthreads();
    u64 sum = 0;
    u32 flags = bi.flags;
    unsigned char *out = (unsigned char *)x.dst + e0 * x.esize;
    const unsigned char *blk = src + bi.off;
    if (flags == 0 && bi.mode == 0) {
        sum = copy_raw(blk, out, (u64)n * x.esize, part, x.ctas_per_block);
    } else if (flags == 0) {
        if (!build_lut(blk, lut, codes, lens, &ok)) {
            flags = BAD_TABLE;
        } else {
            u32 warps = blockDim.x / 32, g = part * warps + threadIdx.x / 32;
            if ((u64)g * GROUP_ELEMS < n) {
                if (x.esize == 1)
                    sum = decode_group<1>(blk, n, bi.exp_bytes, g, lut, out, &flags);
                else if (x.esize == 2)
                    sum = decode_group<2>(blk, n, bi.exp_bytes, g, lut, out, &flags);
                else
                    sum = decode_group<4>(blk, n, bi.exp_bytes, g, lut, out, &flags);
            }
        }
    }
    sum = warp_sum(sum);
    flags = warp_or(flags);
    if ((threadIdx.x & 31) == 0) {
        if (sum != 0)
            atomicAdd(st, sum);
        if (flags != 0)
            atomicOr(st + 1, (u64)flags);
    }
    __syncthreads();
    if (threadIdx.x == 0)
        atomicAdd(st + 1, 1ull << 32);
}

/* A batch: every thread block of every tensor in one grid; each finds its tensor by a binary
 * search over the first thread block of each (uniform across the block: no divergence). */
extern "C" __global__ void __launch_bounds__(512) ddo_codec_decode_batch(const __grid_constant__ kbatch p)
{
    if (p.count == 0 || p.count > MAX_BATCH)
        return;
    u32 lo = 0, hi = p.count - 1;
    while (lo < hi) {
        u32 mid = (lo + hi + 1) / 2;
        if (p.d[mid].first_cta <= blockIdx.x)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (blockIdx.x < p.d[lo].first_cta)
        return;
    decode_cta(p.d[lo], blockIdx.x - p.d[lo].first_cta);
}
