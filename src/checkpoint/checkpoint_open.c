/*
 * checkpoint_open.c - the ways to open a checkpoint, at the top of the checkpoint's files: a
 * safetensors or GGUF file, a Diffusers / Transformers directory, a sharded set, an image in
 * memory, a host-memory table. Each file's identity is recorded at open.
 *
 * Messages name the file by its basename (the path as given only for errors
 * of the file system: cannot open, not found), then the tensor, then the rule.
 */
#include "checkpoint/checkpoint_internal.h"

#include <stdlib.h>
#include <string.h>

#define Q ddo__checkpoint_quote

static int open_single(ddo_checkpoint *ck, const char *path)
{
    uint32_t fi;
    int rc = ddo__checkpoint_add_file(ck, path, &fi);
    if (rc != 0)
        return ddo__fail(NULL, rc, "%s: out of memory", Q(path));
    rc = ddo__checkpoint_open_file(ck, fi);
    if (rc != 0)
        return rc;
    return ddo__checkpoint_finish(ck, ck->files[fi].label);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The checkpoint file a directory holds (Diffusers first, an index first). */
static int open_directory(ddo_checkpoint *ck, const char *path)
{
    static const char *const candidates[] = {
        "diffusion_pytorch_model.safetensors.index.json",
        "diffusion_pytorch_model.safetensors",
        "model.safetensors.index.json",
        "model.safetensors",
    };
    const char *sep = ends_with(path, "/") ? "" : "/";
    for (size_t i = 0; i < DDO_ARRAY_LEN(candidates); i++) {
        char *p = ddo__asprintf("%s%s%s", path, sep, candidates[i]);
        if (p == NULL)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", Q(path));
        ddo__file_id id;
        if (ddo__os_path_identity(p, &id) == 0) {
            int rc = ends_with(p, ".json") ? ddo__checkpoint_open_index(ck, p) : open_single(ck, p);
            free(p);
            return rc;
        }
        free(p);
    }
    return ddo__fail(NULL, DDO_E_NOT_FOUND,
                     "%s: directory holds no diffusion_pytorch_model.safetensors[.index.json] or "
                     "model.safetensors[.index.json]",
                     Q(path));
}

int ddo_checkpoint_create(const char *path, ddo_read_backend backend, ddo_checkpoint **out)
{
    if (path == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_checkpoint_create: NULL argument");
    if (backend != DDO_READ_DEFAULT && backend != DDO_READ_PREAD && backend != DDO_READ_MMAP)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_checkpoint_create: unknown read backend %d", (int)backend);
    if (path[0] == '\0')
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_checkpoint_create: empty path");
    ddo_checkpoint *ck =
        ddo__checkpoint_new(backend == DDO_READ_DEFAULT ? DDO_READ_PREAD : backend);
    if (ck == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", Q(path));
    int rc;
    if (ddo__os_is_directory(path))
        rc = open_directory(ck, path);
    else if (ends_with(path, ".json"))
        rc = ddo__checkpoint_open_index(ck, path);
    else
        rc = open_single(ck, path);
    if (rc != 0) {
        ddo_checkpoint_destroy(ck);
        return rc;
    }
    *out = ck;
    return 0;
}

int ddo__checkpoint_parse_buffer(const uint8_t *data, size_t size, const char *name,
                                 ddo_checkpoint **out)
{
    if ((data == NULL && size > 0) || name == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo__checkpoint_parse_buffer: NULL argument");
    ddo_checkpoint *ck = ddo__checkpoint_new(DDO_READ_MMAP);
    if (ck == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", name);
    uint32_t fi;
    int rc = ddo__checkpoint_add_file(ck, name, &fi);
    if (rc != 0) {
        ddo_checkpoint_destroy(ck);
        return ddo__fail(NULL, rc, "%s: out of memory", name);
    }
    ck->files[fi].data = data;
    ck->files[fi].id.size = size;
    rc = ddo__checkpoint_parse_image(ck, fi, data, size);
    if (rc == 0)
        rc = ddo__checkpoint_finish(ck, ck->files[fi].label);
    if (rc != 0) {
        ddo_checkpoint_destroy(ck);
        return rc;
    }
    *out = ck;
    return 0;
}

/* Element i of a caller's array of desc_size-byte descriptors, fields past it zero. */
static ddo_tensor_desc desc_at(const ddo_tensor_desc *tensors, size_t desc_size, size_t i)
{
    ddo_tensor_desc d;
    memset(&d, 0, sizeof(d));
    memcpy(&d, (const unsigned char *)tensors + i * desc_size, desc_size);
    return d;
}

int ddo_checkpoint_create_from_memory_sized(const ddo_tensor_desc *tensors, size_t count,
                                            size_t desc_size, ddo_checkpoint **out)
{
    if ((tensors == NULL && count > 0) || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_checkpoint_create_from_memory: NULL argument");
    size_t first = offsetof(ddo_tensor_desc, data) + sizeof(void *);
    if (desc_size < first || desc_size > sizeof(ddo_tensor_desc) || desc_size % sizeof(void *) != 0)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_checkpoint_create_from_memory: an element of %zu bytes is not a "
                         "ddo_tensor_desc this library reads (%zu to %zu bytes)",
                         desc_size, first, sizeof(ddo_tensor_desc));
    ddo_checkpoint *ck = ddo__checkpoint_new(DDO_READ_DEFAULT);
    if (ck == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "host tensors: out of memory");
    int rc = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        ddo_tensor_desc di = desc_at(tensors, desc_size, i);
        const ddo_tensor_desc *d = &di;
        if (d->name == NULL) {
            rc = ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "host tensors: tensor %zu has no name", i);
            break;
        }
        if ((unsigned)d->dtype >= DDO_DTYPE_COUNT) {
            rc = ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                           "host tensors: tensor \"%s\": unknown dtype %d", Q(d->name),
                           (int)d->dtype);
            break;
        }
        if (d->ndim > DDO_MAX_DIMS || (d->ndim > 0 && d->shape == NULL)) {
            rc = ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                           "host tensors: tensor \"%s\": %u dimensions (at most %d, with a shape)",
                           Q(d->name), d->ndim, DDO_MAX_DIMS);
            break;
        }
        uint64_t nbytes = 0;
        rc = ddo__dtype_nbytes(d->dtype, d->shape, d->ndim, &nbytes);
        if (rc != 0) {
            char shape_text[256];
            ddo__checkpoint_format_dims(shape_text, sizeof(shape_text), d->shape, d->ndim);
            rc = ddo__fail(NULL, rc == DDO_E_OVERFLOW ? DDO_E_OVERFLOW : DDO_E_INVALID_ARGUMENT,
                           "host tensors: tensor \"%s\": %s %s: %s", Q(d->name),
                           ddo_dtype_name(d->dtype), shape_text,
                           rc == DDO_E_OVERFLOW ? "element count or size overflows 64 bits"
                           : ddo_dtype_block(d->dtype, NULL) != 0
                               ? "the last dimension is not a whole number of blocks"
                               : "the elements do not fill whole bytes");
            break;
        }
        ddo_tensor_info *t = ddo__checkpoint_add_tensor(ck, d->name);
        if (t == NULL) {
            rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "host tensors: out of memory");
            break;
        }
        t->dtype = d->dtype;
        t->ndim = d->ndim;
        if (d->ndim > 0)
            memcpy(t->shape, d->shape, d->ndim * sizeof(uint64_t));
        t->file_index = UINT32_MAX;
        t->offset = 0;
        t->nbytes = nbytes;
        t->host_data = d->data;
    }
    if (rc == 0)
        rc = ddo__checkpoint_finish(ck, "host tensors");
    if (rc != 0) {
        ddo_checkpoint_destroy(ck);
        return rc;
    }
    *out = ck;
    return 0;
}
