/*
 * dtype.c - the safetensors element types: names and sizes.
 */
#include "common.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[DDO_DTYPE_COUNT] = {
    [DDO_DTYPE_BOOL] = { "BOOL", 1 },       [DDO_DTYPE_U8] = { "U8", 1 },
    [DDO_DTYPE_I8] = { "I8", 1 },           [DDO_DTYPE_F8_E5M2] = { "F8_E5M2", 1 },
    [DDO_DTYPE_F8_E4M3] = { "F8_E4M3", 1 }, [DDO_DTYPE_F8_E8M0] = { "F8_E8M0", 1 },
    [DDO_DTYPE_I16] = { "I16", 2 },         [DDO_DTYPE_U16] = { "U16", 2 },
    [DDO_DTYPE_F16] = { "F16", 2 },         [DDO_DTYPE_BF16] = { "BF16", 2 },
    [DDO_DTYPE_I32] = { "I32", 4 },         [DDO_DTYPE_U32] = { "U32", 4 },
    [DDO_DTYPE_F32] = { "F32", 4 },         [DDO_DTYPE_F64] = { "F64", 8 },
    [DDO_DTYPE_I64] = { "I64", 8 },         [DDO_DTYPE_U64] = { "U64", 8 },
};

const char *ddo_dtype_name(ddo_dtype dtype)
{
    if ((unsigned)dtype >= DDO_DTYPE_COUNT)
        return NULL;
    return dtypes[dtype].name;
}

size_t ddo_dtype_size(ddo_dtype dtype)
{
    if ((unsigned)dtype >= DDO_DTYPE_COUNT)
        return 0;
    return dtypes[dtype].size;
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
