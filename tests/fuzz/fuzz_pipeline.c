/*
 * fuzz_pipeline.c - libFuzzer target for the model_index.json reader (ddo_pipeline_create):
 * the input is the file's text, written into a temporary pipeline directory whose
 * "transformer" folder holds a .safetensors file and whose "vae" folder is empty. The reader
 * must never crash, hang or leak; a failure leaves *out NULL and says why in one line; every
 * component it lists is a plain folder name inside the directory. The corpus
 * (tests/fuzz/corpus/pipeline/) is replayed by every build.
 */
#include "ddo.h"
#include "ddo_host.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[64];

static void put(const char *name, const void *data, size_t len)
{
    char path[160];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0)
        abort();
}

static void setup(void)
{
    if (g_dir[0] != '\0')
        return;
    snprintf(g_dir, sizeof(g_dir), "/tmp/ddo_fuzz_pipeline_XXXXXX");
    if (mkdtemp(g_dir) == NULL)
        abort();
    char p[128];
    snprintf(p, sizeof(p), "%s/transformer", g_dir);
    if (mkdir(p, 0700) != 0)
        abort();
    snprintf(p, sizeof(p), "%s/vae", g_dir);
    if (mkdir(p, 0700) != 0)
        abort();
    put("transformer/diffusion_pytorch_model.safetensors", "", 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    put("model_index.json", data, size);
    ddo_pipeline *p = (ddo_pipeline *)&p;
    if (ddo_pipeline_create(g_dir, &p) != 0) {
        const char *m = ddo_last_error();
        if (p != NULL || m[0] == '\0' || strchr(m, '\n') != NULL)
            abort();
        return 0;
    }
    size_t n = ddo_pipeline_component_count(p);
    size_t dlen = strlen(g_dir);
    for (size_t i = 0; i < n; i++) {
        ddo_pipeline_component_info c;
        if (ddo_pipeline_component(p, i, &c) != 0)
            abort();
        if (c.name[0] == '\0' || strcmp(c.name, ".") == 0 || strcmp(c.name, "..") == 0 ||
            strchr(c.name, '/') != NULL || strchr(c.name, '\\') != NULL || c.name[0] == '_')
            abort(); /* only plain folder names */
        if (strncmp(c.path, g_dir, dlen) != 0 || c.path[dlen] != '/' ||
            strcmp(c.path + dlen + 1, c.name) != 0)
            abort();
        if (c.has_weights != (strcmp(c.name, "transformer") == 0))
            abort();
    }
    ddo_pipeline_component_info c;
    if (ddo_pipeline_component(p, n, &c) != DDO_E_INVALID_ARGUMENT)
        abort();
    ddo_pipeline_destroy(p);
    return 0;
}
