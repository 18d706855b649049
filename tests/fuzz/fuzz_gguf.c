/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader: the input is a whole file image
 * (magic, version, counts, metadata, tensor infos, data). A valid image is then used fully:
 * every tensor read and compared with the image, the name index, the block groups, the
 * metadata and the JSON document. Must never crash, hang or leak. The corpus
 * (tests/fuzz/corpus/gguf/) holds valid and malformed files and is replayed by every build.
 */
#include "checkpoint/checkpoint.h"
#include "ddo.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ddo_checkpoint *ck = NULL;
    if (ddo__checkpoint_parse_buffer(data, size, "fuzz.gguf", &ck) != 0) {
        if (ck != NULL || ddo_last_error()[0] == '\0' || strchr(ddo_last_error(), '\n') != NULL)
            abort(); /* failures leave *out alone and always say why, on one line */
        return 0;
    }
    uint64_t total = 0, data_offset = ddo_checkpoint_file(ck, 0)->data_offset;
    unsigned char buf[256];
    for (size_t i = 0; i < ddo_checkpoint_tensor_count(ck); i++) {
        const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, i);
        size_t found = SIZE_MAX;
        if (ddo_checkpoint_find(ck, t->name, &found) != 0 || found != i)
            abort();
        if (t->offset < data_offset || t->offset > size || t->nbytes > size - t->offset)
            abort();
        if (i > 0 && t->offset < ddo_checkpoint_tensor(ck, i - 1)->offset)
            abort();
        size_t n = t->nbytes < sizeof(buf) ? (size_t)t->nbytes : sizeof(buf);
        if (ddo_checkpoint_read(ck, i, t->nbytes - n, buf, n) != 0 ||
            memcmp(buf, data + t->offset + t->nbytes - n, n) != 0)
            abort();
        total += t->nbytes;
    }
    if (total != ddo_checkpoint_total_bytes(ck))
        abort();
    for (size_t i = 0; i < ddo_checkpoint_metadata_count(ck); i++) {
        const char *k = NULL, *v = NULL;
        if (ddo_checkpoint_metadata(ck, i, &k, &v) != 0 || k == NULL || v == NULL)
            abort();
    }
    for (size_t i = 0; i < ddo_checkpoint_block_group_count(ck); i++) {
        const ddo_block_group *g = ddo_checkpoint_block_group(ck, i);
        if (g->count < 2 || g->bytes_per_block > g->total_bytes)
            abort();
    }
    char *json = NULL;
    if (ddo_checkpoint_to_json(ck, &json) != 0)
        abort();
    ddo_free(json);
    ddo_checkpoint_destroy(ck);
    return 0;
}
