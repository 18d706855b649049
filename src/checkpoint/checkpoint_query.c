/*
 * checkpoint_query.c - the read-only view of a checkpoint: tensors, files, metadata, block
 * groups, and the JSON document of `ddo inspect --json` (docs/inspect.md).
 */
#include "checkpoint/checkpoint_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Queries                                                                   */
/* ------------------------------------------------------------------------ */

size_t ddo_checkpoint_tensor_count(const ddo_checkpoint *ck)
{
    return ck == NULL ? 0 : ck->tensor_count;
}

const ddo_tensor_info *ddo_checkpoint_tensor(const ddo_checkpoint *ck, size_t i)
{
    if (ck == NULL || i >= ck->tensor_count)
        return NULL;
    return &ck->tensors[i];
}

int ddo_checkpoint_find(const ddo_checkpoint *ck, const char *name, size_t *index)
{
    if (ck == NULL || name == NULL || index == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_checkpoint_find: NULL argument");
    size_t i = ddo__strmap_get(&ck->by_name, name, strlen(name));
    if (i == SIZE_MAX)
        return ddo__checkpoint_fail(ck, DDO_E_NOT_FOUND, "no tensor named \"%s\" in the checkpoint",
                                    ddo__checkpoint_quote(name));
    *index = i;
    return 0;
}

size_t ddo_checkpoint_file_count(const ddo_checkpoint *ck)
{
    return ck == NULL ? 0 : ck->file_count;
}

const ddo_file_info *ddo_checkpoint_file(const ddo_checkpoint *ck, size_t i)
{
    if (ck == NULL || i >= ck->file_count)
        return NULL;
    return &ck->files[i].info;
}

uint64_t ddo_checkpoint_total_bytes(const ddo_checkpoint *ck)
{
    return ck == NULL ? 0 : ck->total_bytes;
}

size_t ddo_checkpoint_metadata_count(const ddo_checkpoint *ck)
{
    return ck == NULL ? 0 : ck->meta_count;
}

int ddo_checkpoint_metadata(const ddo_checkpoint *ck, size_t i, const char **key,
                            const char **value)
{
    if (ck == NULL || key == NULL || value == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_checkpoint_metadata: NULL argument");
    if (i >= ck->meta_count)
        return ddo__checkpoint_fail(ck, DDO_E_INVALID_ARGUMENT,
                                    "metadata entry %zu out of range (the checkpoint has %zu)", i,
                                    ck->meta_count);
    *key = ck->meta_keys[i];
    *value = ck->meta_values[i];
    return 0;
}

size_t ddo_checkpoint_block_group_count(const ddo_checkpoint *ck)
{
    return ck == NULL ? 0 : ck->group_count;
}

const ddo_block_group *ddo_checkpoint_block_group(const ddo_checkpoint *ck, size_t i)
{
    if (ck == NULL || i >= ck->group_count)
        return NULL;
    return &ck->groups[i];
}

const char *ddo_checkpoint_error(const ddo_checkpoint *ck)
{
    return ck == NULL ? "" : ck->err.msg;
}

const char *ddo__checkpoint_file_name(const ddo_checkpoint *ck, uint32_t file)
{
    if (ck == NULL || file >= ck->file_count)
        return NULL;
    return ck->files[file].label;
}

bool ddo__checkpoint_file_identity(const ddo_checkpoint *ck, uint32_t file, ddo__file_id *id)
{
    if (ck == NULL || id == NULL || file >= ck->file_count || ck->files[file].fd < 0)
        return false;
    *id = ck->files[file].id;
    return true;
}

/* ------------------------------------------------------------------------ */
/* JSON                                                                      */
/* ------------------------------------------------------------------------ */

/* Adds value to obj under key; the value is taken over (released on failure). */
static bool put(json_t *obj, const char *key, json_t *value)
{
    if (value == NULL)
        return false;
    if (obj == NULL) {
        json_decref(value);
        return false;
    }
    return json_object_set_new(obj, key, value) == 0;
}

/* Appends value to arr; the value is taken over (released on failure). */
static bool push(json_t *arr, json_t *value)
{
    if (value == NULL)
        return false;
    if (arr == NULL) {
        json_decref(value);
        return false;
    }
    return json_array_append_new(arr, value) == 0;
}

static json_t *jint(uint64_t v)
{
    return json_integer(v > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)v);
}

static json_t *build_json(const ddo_checkpoint *ck)
{
    /* put() and push() always take over their value, so releasing root
     * releases everything built so far. */
    json_t *root = json_object();
    json_t *files = NULL, *meta = NULL, *tensors = NULL, *blocks = NULL;
    bool ok = root != NULL && put(root, "files", (files = json_array())) &&
              put(root, "metadata", (meta = json_object())) &&
              put(root, "tensors", (tensors = json_array()));
    for (size_t i = 0; ok && i < ck->file_count; i++) {
        const ddo_file_info *f = &ck->files[i].info;
        json_t *o = json_object();
        ok = push(files, o) && put(o, "path", json_string(f->path)) &&
             put(o, "size", jint(f->size)) && put(o, "header_bytes", jint(f->header_bytes));
    }
    for (size_t i = 0; ok && i < ck->meta_count; i++)
        ok = put(meta, ck->meta_keys[i], json_string(ck->meta_values[i]));
    for (size_t i = 0; ok && i < ck->tensor_count; i++) {
        const ddo_tensor_info *t = &ck->tensors[i];
        json_t *o = json_object(), *shape = NULL;
        bool host = t->file_index == UINT32_MAX;
        ok = push(tensors, o) && put(o, "name", json_string(t->name)) &&
             put(o, "dtype", json_string(ddo_dtype_name(t->dtype))) &&
             put(o, "shape", (shape = json_array())) &&
             put(o, "file", host ? json_null() : jint(t->file_index)) &&
             put(o, "offset", host ? json_null() : jint(t->offset)) &&
             put(o, "nbytes", jint(t->nbytes));
        for (uint32_t d = 0; ok && d < t->ndim; d++)
            ok = push(shape, jint(t->shape[d]));
    }
    ok = ok && put(root, "total_bytes", jint(ck->total_bytes)) &&
         put(root, "blocks", (blocks = json_array()));
    for (size_t i = 0; ok && i < ck->group_count; i++) {
        const ddo_block_group *g = &ck->groups[i];
        json_t *o = json_object();
        ok = push(blocks, o) && put(o, "prefix", json_string(g->prefix)) &&
             put(o, "count", jint(g->count)) && put(o, "bytes_per_block", jint(g->bytes_per_block));
    }
    json_t *quant = NULL; /* only when there are quantized layers: older documents unchanged */
    if (ok && ck->quant_count > 0)
        ok = put(root, "quantization", (quant = json_array()));
    for (size_t i = 0; ok && i < ck->quant_count; i++) {
        const ddo_quant_layer *q = &ck->quant[i];
        json_t *o = json_object();
        ok = push(quant, o) && put(o, "layer", json_string(q->layer)) &&
             put(o, "format", json_string(q->format)) && put(o, "source", json_string(q->source));
    }
    if (!ok) {
        json_decref(root);
        return NULL;
    }
    return root;
}

int ddo_checkpoint_to_json(const ddo_checkpoint *ck, char **json)
{
    if (ck == NULL || json == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_checkpoint_to_json: NULL argument");
    json_t *root = build_json(ck);
    char *text = root == NULL ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (text == NULL)
        return ddo__checkpoint_fail(ck, DDO_E_NO_MEMORY, "checkpoint JSON: out of memory");
    /* jansson allocates with malloc (no custom allocator is set), so ddo_free fits. */
    *json = text;
    return 0;
}
