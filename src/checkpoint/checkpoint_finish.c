/*
 * checkpoint_finish.c - finishing a checkpoint's table once its files or host tensors are read:
 * absolute offsets, the name index, the total, ComfyUI's quantized layout
 * (checkpoint_quant.c) and the block groups (checkpoint_blocks.c). Above the readers' tables
 * and reads, below the headers, sets and openings that call it.
 */
#include "checkpoint/checkpoint_internal.h"

#include <string.h>

#define Q ddo__checkpoint_quote

/* Absolute offsets, the name index, the total and the block groups. */
int ddo__checkpoint_finish(ddo_checkpoint *ck, const char *what)
{
    uint64_t total = 0;
    for (size_t i = 0; i < ck->tensor_count; i++) {
        ddo_tensor_info *t = &ck->tensors[i];
        if (t->file_index != UINT32_MAX)
            t->offset += ck->files[t->file_index].info.data_offset;
        if (!ddo__add_u64(total, t->nbytes, &total))
            return ddo__fail(NULL, DDO_E_OVERFLOW, "%s: the tensors' total size overflows", what);
        size_t at = ddo__strmap_put(&ck->by_name, t->name, strlen(t->name), i);
        if (at == SIZE_MAX)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory indexing tensors", what);
        if (at != i) {
            const ddo_tensor_info *o = &ck->tensors[at];
            if (t->file_index != UINT32_MAX && o->file_index != UINT32_MAX)
                return ddo__fail(NULL, DDO_E_FORMAT, "%s: tensor \"%s\" appears in both %s and %s",
                                 what, Q(t->name), ck->files[o->file_index].label,
                                 ck->files[t->file_index].label);
            return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "%s: duplicate tensor name \"%s\"", what,
                             Q(t->name));
        }
    }
    ck->total_bytes = total;
    int rc = ck->file_count > 0 && !ck->files[0].gguf ? ddo__checkpoint_quant(ck, what) : 0;
    return rc != 0 ? rc : ddo__checkpoint_block_groups(ck, what);
}
