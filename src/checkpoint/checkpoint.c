/*
 * checkpoint.c - the checkpoint: its lifecycle and tables (the handle, its files, tensors and
 * metadata; the details of failures recorded on it), finishing a table (absolute offsets, the
 * name index, the total, the block groups), and the ways to open one: a safetensors file, a
 * Diffusers / Transformers directory, a sharded set, an image in memory, a host-memory table.
 * Header parsing and validation: checkpoint_header.c; sharded sets: checkpoint_index.c; block
 * groups: checkpoint_blocks.c; reads: checkpoint_io.c; queries and JSON: checkpoint_query.c.
 * Each file's identity is recorded at open.
 *
 * Messages name the file by its basename (the path as given only for errors
 * of the file system: cannot open, not found), then the tensor, then the rule.
 */
#include "checkpoint/checkpoint_internal.h"

#include "os/thread.h"
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define Q ddo__checkpoint_quote

/* ------------------------------------------------------------------------ */
/* The checkpoint                                                            */
/* ------------------------------------------------------------------------ */

/* Copies the thread's last detail (set by an internal call) onto the handle. */
int ddo__checkpoint_record(const ddo_checkpoint *ck, int code)
{
    ddo_checkpoint *m = (ddo_checkpoint *)(uintptr_t)ck;
    ddo__mutex_lock(&m->err_lock);
    ddo__fail_from_last(&m->err, code);
    ddo__mutex_unlock(&m->err_lock);
    return code;
}

/* Records a failure on a handle other threads may read from (reads are
 * concurrent): the detail goes to the thread and, under a lock, the handle. */
int ddo__checkpoint_fail(const ddo_checkpoint *ck, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ddo__vfail(NULL, code, fmt, ap);
    va_end(ap);
    return ddo__checkpoint_record(ck, code);
}

static ddo_checkpoint *ck_new(ddo_read_backend backend)
{
    ddo_checkpoint *ck = ddo__calloc(1, sizeof(*ck));
    if (ck == NULL)
        return NULL;
    if (ddo__mutex_init(&ck->err_lock) != 0) {
        free(ck);
        return NULL;
    }
    ck->backend = backend;
    return ck;
}

void ddo_checkpoint_destroy(ddo_checkpoint *ck)
{
    if (ck == NULL)
        return;
    for (size_t i = 0; i < ck->file_count; i++) {
        ddo__checkpoint_file *f = &ck->files[i];
        if (f->mapped)
            ddo__os_unmap_file(f->data, f->info.size);
        ddo__os_file_close(f->fd);
        free((char *)(uintptr_t)f->info.path);
        free(f->label);
        free(f->real_path);
    }
    free(ck->files);
    for (size_t i = 0; i < ck->tensor_count; i++)
        free((char *)(uintptr_t)ck->tensors[i].name);
    free(ck->tensors);
    ddo__strmap_free(&ck->by_name);
    for (size_t i = 0; i < ck->meta_count; i++) {
        free(ck->meta_keys[i]);
        free(ck->meta_values[i]);
    }
    free(ck->meta_keys);
    free(ck->meta_values);
    ddo__strmap_free(&ck->meta_by_key);
    for (size_t i = 0; i < ck->group_count; i++)
        free((char *)(uintptr_t)ck->groups[i].prefix);
    free(ck->groups);
    ddo__checkpoint_quant_free(ck);
    ddo__mutex_destroy(&ck->err_lock);
    free(ck);
}

const char *ddo__checkpoint_base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s == NULL ? path : s + 1;
}

/* Adds a file slot (path copied); returns its index or -1 (out of memory). */
int ddo__checkpoint_add_file(ddo_checkpoint *ck, const char *path, uint32_t *index)
{
    if (ck->file_count >= UINT32_MAX - 1)
        return DDO_E_OVERFLOW;
    ddo__checkpoint_file *files = ddo__reallocarray(ck->files, ck->file_count + 1, sizeof(*files));
    if (files == NULL)
        return DDO_E_NO_MEMORY;
    ck->files = files;
    ddo__checkpoint_file *f = &files[ck->file_count];
    memset(f, 0, sizeof(*f));
    f->fd = -1;
    char *p = ddo__strdup(path);
    if (p == NULL)
        return DDO_E_NO_MEMORY;
    f->info.path = p;
    f->name = ddo__checkpoint_base_name(p);
    f->label = ddo__strdup(Q(f->name));
    if (f->label == NULL) {
        free(p);
        return DDO_E_NO_MEMORY;
    }
    *index = (uint32_t)ck->file_count++;
    return 0;
}

int ddo__checkpoint_add_metadata(ddo_checkpoint *ck, const char *key, const char *value)
{
    if (ddo__strmap_get(&ck->meta_by_key, key, strlen(key)) != SIZE_MAX)
        return 0; /* the first value of a key wins (shards repeat theirs) */
    if (ck->meta_count == ck->meta_cap) {
        size_t cap = ck->meta_cap == 0 ? 8 : ck->meta_cap * 2;
        char **k = ddo__reallocarray(ck->meta_keys, cap, sizeof(*k));
        if (k == NULL)
            return DDO_E_NO_MEMORY;
        ck->meta_keys = k;
        char **v = ddo__reallocarray(ck->meta_values, cap, sizeof(*v));
        if (v == NULL)
            return DDO_E_NO_MEMORY;
        ck->meta_values = v;
        ck->meta_cap = cap;
    }
    char *k = ddo__strdup(key);
    char *v = ddo__strdup(value);
    if (k == NULL || v == NULL) {
        free(k);
        free(v);
        return DDO_E_NO_MEMORY;
    }
    if (ddo__strmap_put(&ck->meta_by_key, k, strlen(k), ck->meta_count) == SIZE_MAX) {
        free(k);
        free(v);
        return DDO_E_NO_MEMORY;
    }
    ck->meta_keys[ck->meta_count] = k;
    ck->meta_values[ck->meta_count] = v;
    ck->meta_count++;
    return 0;
}

/* Appends a tensor (name copied); the caller fills the rest. */
ddo_tensor_info *ddo__checkpoint_add_tensor(ddo_checkpoint *ck, const char *name)
{
    if (ck->tensor_count == ck->tensor_cap) {
        size_t cap = ck->tensor_cap == 0 ? 64 : ck->tensor_cap * 2;
        ddo_tensor_info *t = ddo__reallocarray(ck->tensors, cap, sizeof(*t));
        if (t == NULL)
            return NULL;
        ck->tensors = t;
        ck->tensor_cap = cap;
    }
    char *n = ddo__strdup(name);
    if (n == NULL)
        return NULL;
    ddo_tensor_info *t = &ck->tensors[ck->tensor_count++];
    memset(t, 0, sizeof(*t));
    t->name = n;
    return t;
}

/* ------------------------------------------------------------------------ */
/* Finishing a table                                                         */
/* ------------------------------------------------------------------------ */

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

/* ------------------------------------------------------------------------ */
/* Opening                                                                   */
/* ------------------------------------------------------------------------ */

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
    ddo_checkpoint *ck = ck_new(backend == DDO_READ_DEFAULT ? DDO_READ_PREAD : backend);
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
    ddo_checkpoint *ck = ck_new(DDO_READ_MMAP);
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
    ddo_checkpoint *ck = ck_new(DDO_READ_DEFAULT);
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
