/*
 * checkpoint.c - the checkpoint: its lifecycle and tables (the handle, its files, tensors and
 * metadata; the details of failures recorded on it), at the bottom of the checkpoint's files
 * (above only checkpoint_json.c's helpers). Finishing a table: checkpoint_finish.c; the ways to
 * open one: checkpoint_open.c. Header parsing and validation: checkpoint_header.c; sharded sets:
 * checkpoint_index.c; block groups: checkpoint_blocks.c; reads: checkpoint_io.c; queries and
 * JSON: checkpoint_query.c. Each file's identity is recorded at open.
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

ddo_checkpoint *ddo__checkpoint_new(ddo_read_backend backend)
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

void ddo__checkpoint_quant_free(ddo_checkpoint *ck)
{
    for (size_t i = 0; i < ck->quant_count; i++) {
        free((char *)(uintptr_t)ck->quant[i].layer);
        free((char *)(uintptr_t)ck->quant[i].format);
    }
    free(ck->quant);
    ck->quant = NULL;
    ck->quant_count = 0;
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
