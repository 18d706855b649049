/*
 * dtype.c - the safetensors element types: names and sizes (in bits, since F4 and the F6
 * types are smaller than a byte; the official reader's Dtype list and bit sizes).
 */
#include "checkpoint.h"
#include "common.h"

#include <string.h>

static const struct {
    const char *name;
    unsigned bits;
} dtypes[DDO_DTYPE_COUNT] = {
    [DDO_DTYPE_BOOL] = { "BOOL", 8 },
    [DDO_DTYPE_U8] = { "U8", 8 },
    [DDO_DTYPE_I8] = { "I8", 8 },
    [DDO_DTYPE_F8_E5M2] = { "F8_E5M2", 8 },
    [DDO_DTYPE_F8_E4M3] = { "F8_E4M3", 8 },
    [DDO_DTYPE_F8_E8M0] = { "F8_E8M0", 8 },
    [DDO_DTYPE_I16] = { "I16", 16 },
    [DDO_DTYPE_U16] = { "U16", 16 },
    [DDO_DTYPE_F16] = { "F16", 16 },
    [DDO_DTYPE_BF16] = { "BF16", 16 },
    [DDO_DTYPE_I32] = { "I32", 32 },
    [DDO_DTYPE_U32] = { "U32", 32 },
    [DDO_DTYPE_F32] = { "F32", 32 },
    [DDO_DTYPE_F64] = { "F64", 64 },
    [DDO_DTYPE_I64] = { "I64", 64 },
    [DDO_DTYPE_U64] = { "U64", 64 },
    [DDO_DTYPE_F4] = { "F4", 4 },
    [DDO_DTYPE_F6_E2M3] = { "F6_E2M3", 6 },
    [DDO_DTYPE_F6_E3M2] = { "F6_E3M2", 6 },
    [DDO_DTYPE_F8_E4M3FNUZ] = { "F8_E4M3FNUZ", 8 },
    [DDO_DTYPE_F8_E5M2FNUZ] = { "F8_E5M2FNUZ", 8 },
    [DDO_DTYPE_C64] = { "C64", 64 },
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

int ddo__dtype_nbytes(ddo_dtype dtype, const uint64_t *dims, size_t ndim, uint64_t *nbytes)
{
    /* As the official reader: the element count first (so [2^32, 2^32, 0] overflows before
     * the zero), then the bits, which must fill whole bytes. */
    uint64_t n = 1;
    for (size_t i = 0; i < ndim; i++)
        if (!ddo__mul_u64(n, dims[i], &n))
            return DDO_E_OVERFLOW;
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
