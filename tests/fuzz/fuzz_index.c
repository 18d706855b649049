/*
 * fuzz_index.c - libFuzzer target for the sharded index reader: the input is the text of a
 * *.safetensors.index.json, written into a temporary directory that also holds two valid
 * shards (a.safetensors: tensors "x", "blocks.0.w"; b.safetensors: "y", "blocks.1.w"). The
 * reader must never crash, hang or leak; a failure leaves *out NULL and says why in one line;
 * a success is a table consistent with the shards. The corpus (tests/fuzz/corpus/index/) is
 * replayed by every build.
 */
#include "ddo.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[64];
static char g_index[128];

static void put(const char *name, const void *data, size_t len)
{
    char path[160];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0)
        abort();
}

/* A shard holding two U8 tensors of 2 bytes each. */
static void put_shard(const char *name, const char *t0, const char *t1)
{
    char hdr[256];
    int n = snprintf(hdr, sizeof(hdr),
                     "{\"%s\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                     "\"%s\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
                     t0, t1);
    uint8_t img[300];
    for (int i = 0; i < 8; i++)
        img[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(img + 8, hdr, (size_t)n);
    memcpy(img + 8 + n, "\1\2\3\4", 4);
    put(name, img, 8 + (size_t)n + 4);
}

static void setup(void)
{
    if (g_dir[0] != '\0')
        return;
    snprintf(g_dir, sizeof(g_dir), "/tmp/ddo_fuzz_index_XXXXXX");
    if (mkdtemp(g_dir) == NULL)
        abort();
    put_shard("a.safetensors", "x", "blocks.0.w");
    put_shard("b.safetensors", "y", "blocks.1.w");
    snprintf(g_index, sizeof(g_index), "%s/m.safetensors.index.json", g_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    put("m.safetensors.index.json", data, size);
    ddo_checkpoint *ck = NULL;
    if (ddo_checkpoint_create(g_index, DDO_READ_DEFAULT, &ck) != 0) {
        const char *m = ddo_last_error();
        if (ck != NULL || m[0] == '\0' || strchr(m, '\n') != NULL)
            abort(); /* failures leave *out NULL and say why, in one line */
        return 0;
    }
    size_t n = ddo_checkpoint_tensor_count(ck);
    if (n == 0 || n > 4 || ddo_checkpoint_file_count(ck) == 0 ||
        ddo_checkpoint_file_count(ck) > 2 || ddo_checkpoint_total_bytes(ck) != 2 * n)
        abort();
    for (size_t i = 0; i < n; i++) {
        const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, i);
        uint8_t b[2];
        size_t found = SIZE_MAX;
        if (ddo_checkpoint_read(ck, i, 0, b, 2) != 0 ||
            ddo_checkpoint_find(ck, t->name, &found) != 0 || found != i)
            abort();
    }
    char *json = NULL;
    if (ddo_checkpoint_to_json(ck, &json) != 0)
        abort();
    ddo_free(json);
    ddo_checkpoint_destroy(ck);
    return 0;
}
