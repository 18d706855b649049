/*
 * dtype.c - the element types: the safetensors ones (names and sizes in bits, since F4 and the
 * F6 types are smaller than a byte; the official reader's Dtype list and bit sizes) and the
 * GGML block types of GGUF files (elements and bytes per block, as GGML defines them).
 */
#include "base/dtype.h"
#include "base/common.h"

#include <string.h>

static const struct {
    const char *name;
    unsigned bits;    /* element types; 0 for block types */
    unsigned block;   /* block types: elements per block; 0 for element types */
    unsigned bblocks; /* block types: bytes per block */
} dtypes[DDO_DTYPE_COUNT] = {
    [DDO_DTYPE_BOOL] = { "BOOL", 8, 0, 0 },
    [DDO_DTYPE_U8] = { "U8", 8, 0, 0 },
    [DDO_DTYPE_I8] = { "I8", 8, 0, 0 },
    [DDO_DTYPE_F8_E5M2] = { "F8_E5M2", 8, 0, 0 },
    [DDO_DTYPE_F8_E4M3] = { "F8_E4M3", 8, 0, 0 },
    [DDO_DTYPE_F8_E8M0] = { "F8_E8M0", 8, 0, 0 },
    [DDO_DTYPE_I16] = { "I16", 16, 0, 0 },
    [DDO_DTYPE_U16] = { "U16", 16, 0, 0 },
    [DDO_DTYPE_F16] = { "F16", 16, 0, 0 },
    [DDO_DTYPE_BF16] = { "BF16", 16, 0, 0 },
    [DDO_DTYPE_I32] = { "I32", 32, 0, 0 },
    [DDO_DTYPE_U32] = { "U32", 32, 0, 0 },
    [DDO_DTYPE_F32] = { "F32", 32, 0, 0 },
    [DDO_DTYPE_F64] = { "F64", 64, 0, 0 },
    [DDO_DTYPE_I64] = { "I64", 64, 0, 0 },
    [DDO_DTYPE_U64] = { "U64", 64, 0, 0 },
    [DDO_DTYPE_F4] = { "F4", 4, 0, 0 },
    [DDO_DTYPE_F6_E2M3] = { "F6_E2M3", 6, 0, 0 },
    [DDO_DTYPE_F6_E3M2] = { "F6_E3M2", 6, 0, 0 },
    [DDO_DTYPE_F8_E4M3FNUZ] = { "F8_E4M3FNUZ", 8, 0, 0 },
    [DDO_DTYPE_F8_E5M2FNUZ] = { "F8_E5M2FNUZ", 8, 0, 0 },
    [DDO_DTYPE_C64] = { "C64", 64, 0, 0 },
    /* GGML's blocks: (elements, bytes) of each block as its quantizer lays them out. */
    [DDO_DTYPE_Q4_0] = { "Q4_0", 0, 32, 18 },
    [DDO_DTYPE_Q4_1] = { "Q4_1", 0, 32, 20 },
    [DDO_DTYPE_Q5_0] = { "Q5_0", 0, 32, 22 },
    [DDO_DTYPE_Q5_1] = { "Q5_1", 0, 32, 24 },
    [DDO_DTYPE_Q8_0] = { "Q8_0", 0, 32, 34 },
    [DDO_DTYPE_Q8_1] = { "Q8_1", 0, 32, 36 },
    [DDO_DTYPE_Q2_K] = { "Q2_K", 0, 256, 84 },
    [DDO_DTYPE_Q3_K] = { "Q3_K", 0, 256, 110 },
    [DDO_DTYPE_Q4_K] = { "Q4_K", 0, 256, 144 },
    [DDO_DTYPE_Q5_K] = { "Q5_K", 0, 256, 176 },
    [DDO_DTYPE_Q6_K] = { "Q6_K", 0, 256, 210 },
    [DDO_DTYPE_Q8_K] = { "Q8_K", 0, 256, 292 },
    [DDO_DTYPE_IQ2_XXS] = { "IQ2_XXS", 0, 256, 66 },
    [DDO_DTYPE_IQ2_XS] = { "IQ2_XS", 0, 256, 74 },
    [DDO_DTYPE_IQ3_XXS] = { "IQ3_XXS", 0, 256, 98 },
    [DDO_DTYPE_IQ1_S] = { "IQ1_S", 0, 256, 50 },
    [DDO_DTYPE_IQ4_NL] = { "IQ4_NL", 0, 32, 18 },
    [DDO_DTYPE_IQ3_S] = { "IQ3_S", 0, 256, 110 },
    [DDO_DTYPE_IQ2_S] = { "IQ2_S", 0, 256, 82 },
    [DDO_DTYPE_IQ4_XS] = { "IQ4_XS", 0, 256, 136 },
    [DDO_DTYPE_IQ1_M] = { "IQ1_M", 0, 256, 56 },
    [DDO_DTYPE_TQ1_0] = { "TQ1_0", 0, 256, 54 },
    [DDO_DTYPE_TQ2_0] = { "TQ2_0", 0, 256, 66 },
    [DDO_DTYPE_MXFP4] = { "MXFP4", 0, 32, 17 },
    [DDO_DTYPE_NVFP4] = { "NVFP4", 0, 64, 36 },
};

const char *ddo_dtype_name(ddo_dtype dtype)
{
    if ((unsigned)dtype >= DDO_DTYPE_COUNT)
        return NULL;
    return dtypes[dtype].name;
}

size_t ddo_dtype_size(ddo_dtype dtype)
{
    if ((unsigned)dtype >= DDO_DTYPE_COUNT || dtypes[dtype].bits % 8 != 0)
        return 0;
    return dtypes[dtype].bits / 8;
}

unsigned ddo__dtype_bits(ddo_dtype dtype)
{
    if ((unsigned)dtype >= DDO_DTYPE_COUNT)
        return 0;
    return dtypes[dtype].bits;
}

size_t ddo_dtype_block(ddo_dtype dtype, size_t *block_bytes)
{
    size_t block = (unsigned)dtype < DDO_DTYPE_COUNT ? dtypes[dtype].block : 0;
    if (block_bytes != NULL)
        *block_bytes = block != 0 ? dtypes[dtype].bblocks : 0;
    return block;
}

/* The bytes of a block type's tensor: whole blocks along the last dimension. */
static int block_nbytes(ddo_dtype dtype, const uint64_t *dims, size_t ndim, uint64_t *nbytes)
{
    if (ndim == 0 || dims[ndim - 1] % dtypes[dtype].block != 0)
        return DDO_E_FORMAT;
    uint64_t rows = 1, bytes;
    for (size_t i = 0; i + 1 < ndim; i++)
        if (!ddo__mul_u64(rows, dims[i], &rows))
            return DDO_E_OVERFLOW;
    if (!ddo__mul_u64(rows, dims[ndim - 1] / dtypes[dtype].block, &bytes) ||
        !ddo__mul_u64(bytes, dtypes[dtype].bblocks, &bytes))
        return DDO_E_OVERFLOW;
    *nbytes = bytes;
    return 0;
}

int ddo__dtype_nbytes(ddo_dtype dtype, const uint64_t *dims, size_t ndim, uint64_t *nbytes)
{
    /* As the official reader: the element count first (so [2^32, 2^32, 0] overflows before
     * the zero), then the bits, which must fill whole bytes. */
    uint64_t n = 1;
    for (size_t i = 0; i < ndim; i++)
        if (!ddo__mul_u64(n, dims[i], &n))
            return DDO_E_OVERFLOW;
    if ((unsigned)dtype < DDO_DTYPE_COUNT && dtypes[dtype].block != 0)
        return block_nbytes(dtype, dims, ndim, nbytes);
    uint64_t bits;
    if (!ddo__mul_u64(n, ddo__dtype_bits(dtype), &bits))
        return DDO_E_OVERFLOW;
    if (bits % 8 != 0)
        return DDO_E_FORMAT;
    *nbytes = bits / 8;
    return 0;
}

int ddo_dtype_from_name(const char *name, ddo_dtype *out)
{
    if (name == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_dtype_from_name: NULL argument");
    for (unsigned i = 0; i < DDO_DTYPE_COUNT; i++) {
        if (strcmp(name, dtypes[i].name) == 0) {
            *out = (ddo_dtype)i;
            return 0;
        }
    }
    return ddo__fail(NULL, DDO_E_NOT_FOUND, "unknown dtype \"%s\"", name);
}
