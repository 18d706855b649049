/*
 * gguf_write.h - writes the header of a GGUF v3 file (ddo synth --out X.gguf): the preamble,
 * string metadata, general.alignment (32) and the tensor infos, padded to the alignment; the
 * tensors' bytes follow at their offsets in the data section.
 */
#ifndef DDO_TOOL_GGUF_WRITE_H
#define DDO_TOOL_GGUF_WRITE_H

#include "ddo.h"

#include <stddef.h>
#include <stdint.h>

#define TOOL_GGUF_ALIGNMENT 32

typedef struct tool_gguf_tensor {
    const char *name;
    ddo_dtype dtype;
    uint32_t ndim;         /* at most 4 */
    const uint64_t *shape; /* outermost first (written reversed, as GGML orders them) */
    uint64_t offset;       /* in the data section, a multiple of TOOL_GGUF_ALIGNMENT */
} tool_gguf_tensor;

/* GGML's type id of dtype, or -1 when GGML has none (U8, BOOL, the F8 types...). */
int tool_gguf_type(ddo_dtype dtype);

/* The header in a malloc'd buffer (*out, *len); nkv string pairs keys[i] = values[i].
 * 0, DDO_E_NO_MEMORY, or DDO_E_INVALID_ARGUMENT (a dtype without a GGML type, > 4 dims). */
int tool_gguf_header(const char *const *keys, const char *const *values, size_t nkv,
                     const tool_gguf_tensor *t, size_t nt, uint8_t **out, size_t *len);

#endif /* DDO_TOOL_GGUF_WRITE_H */
