/*
 * fuzz_header.c - libFuzzer target for safetensors header parsing: the input
 * is a whole file image (8-byte length, JSON header, data). A valid image is
 * then used fully: every tensor read, the name index, block groups and the
 * JSON document. Must never crash, hang or leak. The corpus
 * (tests/fuzz/corpus/header/) holds the fixtures and is replayed by every build.
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
    if (ddo__checkpoint_parse_buffer(data, size, "fuzz.safetensors", &ck) != 0) {
        if (ck != NULL || ddo_last_error()[0] == '\0')
            abort(); /* failures leave *out alone and always say why */
        return 0;
    }
    uint64_t total = 0;
    unsigned char buf[256];
    for (size_t i = 0; i < ddo_checkpoint_tensor_count(ck); i++) {
        const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, i);
        size_t found = SIZE_MAX;
        if (ddo_checkpoint_find(ck, t->name, &found) != 0 || found != i)
            abort();
        if (t->offset + t->nbytes > size)
            abort();
        size_t n = t->nbytes < sizeof(buf) ? (size_t)t->nbytes : sizeof(buf);
        if (ddo_checkpoint_read(ck, i, t->nbytes - n, buf, n) != 0 ||
            memcmp(buf, data + t->offset + t->nbytes - n, n) != 0)
            abort();
        total += t->nbytes;
    }
    if (total != ddo_checkpoint_total_bytes(ck))
        abort();
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
