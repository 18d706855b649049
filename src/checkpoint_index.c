/*
 * checkpoint_index.c - sharded sets: the *.safetensors.index.json weight_map names the
 * shards (files in the index's directory, opened in name order); every mapped
 * tensor must be in its shard, no shard may hold an unmapped tensor, and
 * metadata.total_size, when present, must equal the tensors' bytes.
 */
#define _POSIX_C_SOURCE 200809L
#include "checkpoint_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define Q ddo__checkpoint_quote

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Reads a whole small JSON file (at most limit bytes) into a new buffer, refusing FIFOs,
 * sockets and devices without blocking; label names it in messages. */
static int read_small_file(const char *path, const char *label, const char *what, uint64_t limit,
                           char **out, size_t *len)
{
    int fd;
    int e = ddo__os_file_open(path, &fd);
    if (e != 0)
        return ddo__checkpoint_os_failure(path, "cannot open", e);
    ddo__file_id id;
    e = ddo__os_file_identity(fd, &id);
    if (e != 0) {
        ddo__os_file_close(fd);
        return ddo__checkpoint_os_failure(path, "cannot stat", e);
    }
    if (!id.regular) {
        ddo__os_file_close(fd);
        return ddo__checkpoint_os_failure(path, "cannot open", DDO__OS_NOT_REGULAR);
    }
    if (id.size > limit) {
        ddo__os_file_close(fd);
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: %s is %" PRIu64 " bytes, over ddo's limit of %" PRIu64
                         " bytes (see docs/inspect.md)",
                         label, what, id.size, limit);
    }
    char *buf = ddo__malloc((size_t)id.size + 1);
    if (buf == NULL) {
        ddo__os_file_close(fd);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", label);
    }
    e = ddo__os_pread_full(fd, buf, (size_t)id.size, 0);
    ddo__os_file_close(fd);
    if (e != 0) {
        free(buf);
        return ddo__checkpoint_os_failure(path, "read", e);
    }
    buf[id.size] = '\0';
    *out = buf;
    *len = (size_t)id.size;
    return 0;
}

int ddo__checkpoint_read_json_file(const char *path, const char *label, const char *what,
                                   uint64_t limit, struct json_t **root)
{
    char *text = NULL;
    size_t len = 0;
    int rc = read_small_file(path, label, what, limit, &text, &len);
    if (rc != 0)
        return rc;
    rc = ddo__checkpoint_json_load(label, what, text, len, root);
    free(text);
    return rc;
}

/* A sharded set: the index's weight_map names the shards (in its directory). */
int ddo__checkpoint_open_index(ddo_checkpoint *ck, const char *path)
{
    const char *base = ddo__checkpoint_base_name(path);
    char iname[512];
    snprintf(iname, sizeof(iname), "%s", Q(base));
    json_t *root = NULL;
    int rc = ddo__checkpoint_read_json_file(path, iname, "index", DDO__CHECKPOINT_MAX_INDEX_BYTES,
                                            &root);
    const char **shards = NULL;
    size_t shard_count = 0;
    char *dir = NULL;
    char *shard_path = NULL;
    if (rc != 0)
        goto out;
    if (!json_is_object(root)) {
        rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: index is %s, not a JSON object", iname,
                       ddo__checkpoint_json_type(root));
        goto out;
    }
    const json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: index: \"weight_map\" is %s, not an object", iname,
                       wm == NULL ? "missing" : ddo__checkpoint_json_type(wm));
        goto out;
    }
    const json_t *meta = json_object_get(root, "metadata");
    bool have_total = false;
    uint64_t total_size = 0;
    if (meta != NULL && !json_is_null(meta)) {
        if (!json_is_object(meta)) {
            rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: index: \"metadata\" is %s, not an object",
                           iname, ddo__checkpoint_json_type(meta));
            goto out;
        }
        const json_t *ts = json_object_get(meta, "total_size");
        if (ts != NULL) {
            if (json_is_real(ts) && json_real_value(ts) >= 0 && json_real_value(ts) < 1.8e19 &&
                json_real_value(ts) == (double)(uint64_t)json_real_value(ts)) {
                total_size = (uint64_t)json_real_value(ts);
            } else if (!ddo__checkpoint_json_u64(ts, &total_size)) {
                char what[64];
                if (json_is_integer(ts))
                    snprintf(what, sizeof(what), "%" JSON_INTEGER_FORMAT, json_integer_value(ts));
                else if (json_is_real(ts))
                    ddo__checkpoint_format_real(what, sizeof(what), json_real_value(ts));
                else
                    snprintf(what, sizeof(what), "%s", ddo__checkpoint_json_type(ts));
                rc = ddo__fail(NULL, DDO_E_FORMAT,
                               "%s: index: metadata.total_size is %s, not a non-negative integer "
                               "number of bytes",
                               iname, what);
                goto out;
            }
            have_total = true;
        }
    }
    /* The distinct shard names, sorted. */
    shards = ddo__calloc(json_object_size(wm), sizeof(*shards));
    if (shards == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", iname);
        goto out;
    }
    const char *tname;
    json_t *jshard;
    json_object_foreach((json_t *)(uintptr_t)wm, tname, jshard)
    {
        if (!json_is_string(jshard)) {
            rc = ddo__fail(NULL, DDO_E_FORMAT,
                           "%s: weight_map: tensor \"%s\" is mapped to %s, not a file name", iname,
                           Q(tname), ddo__checkpoint_json_type(jshard));
            goto out;
        }
        const char *s = json_string_value(jshard);
        if (s[0] == '\0' || strchr(s, '/') != NULL || strcmp(s, ".") == 0 || strcmp(s, "..") == 0 ||
            strlen(s) != json_string_length(jshard)) {
            rc = ddo__fail(NULL, DDO_E_FORMAT,
                           "%s: weight_map: tensor \"%s\" is mapped to \"%s\", not a file name in "
                           "the index's directory",
                           iname, Q(tname), Q(s));
            goto out;
        }
        shards[shard_count++] = s;
    }
    if (shard_count == 0) {
        rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: index: weight_map is empty", iname);
        goto out;
    }
    qsort(shards, shard_count, sizeof(*shards), cmp_str);
    size_t distinct = 0;
    for (size_t i = 0; i < shard_count; i++)
        if (distinct == 0 || strcmp(shards[distinct - 1], shards[i]) != 0)
            shards[distinct++] = shards[i];
    shard_count = distinct;
    /* Index metadata strings first. */
    if (json_is_object(meta)) {
        const char *mkey;
        json_t *mval;
        json_object_foreach((json_t *)(uintptr_t)meta, mkey, mval)
        {
            if (json_is_string(mval) &&
                ddo__checkpoint_add_metadata(ck, mkey, json_string_value(mval)) != 0) {
                rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", iname);
                goto out;
            }
        }
    }
    size_t dlen = (size_t)(base - path);
    dir = ddo__strndup(path, dlen);
    if (dir == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", iname);
        goto out;
    }
    for (size_t s = 0; s < shard_count; s++) {
        free(shard_path);
        shard_path = ddo__asprintf("%s%s", dir, shards[s]);
        uint32_t fi;
        if (shard_path == NULL || ddo__checkpoint_add_file(ck, shard_path, &fi) != 0) {
            rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", iname);
            goto out;
        }
        size_t first = ck->tensor_count;
        rc = ddo__checkpoint_open_file(ck, fi);
        if (rc != 0)
            goto out;
        /* Every tensor of the shard must be mapped to this shard. */
        for (size_t i = first; i < ck->tensor_count; i++) {
            const json_t *m = json_object_get(wm, ck->tensors[i].name);
            if (m == NULL) {
                rc = ddo__fail(NULL, DDO_E_FORMAT,
                               "%s: tensor \"%s\" is not in the weight_map of %s",
                               ck->files[fi].label, Q(ck->tensors[i].name), iname);
                goto out;
            }
            if (strcmp(json_string_value(m), shards[s]) != 0) {
                rc = ddo__fail(NULL, DDO_E_FORMAT,
                               "%s: tensor \"%s\" is mapped to %s by %s, not to this shard",
                               ck->files[fi].label, Q(ck->tensors[i].name), Q(json_string_value(m)),
                               iname);
                goto out;
            }
        }
    }
    /* Every mapped tensor was found (each shard's tensors map to it, so the
     * counts match exactly when none is missing). */
    if (ck->tensor_count != json_object_size(wm)) {
        ddo__checkpoint_map seen = { NULL, 0, 0 };
        for (size_t i = 0; i < ck->tensor_count; i++) {
            if (ddo__checkpoint_map_put(&seen, ck->tensors[i].name, i) == SIZE_MAX) {
                ddo__checkpoint_map_free(&seen);
                rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", iname);
                goto out;
            }
        }
        json_object_foreach((json_t *)(uintptr_t)wm, tname, jshard)
        {
            if (ddo__checkpoint_map_get(&seen, tname) == SIZE_MAX) {
                rc = ddo__fail(NULL, DDO_E_FORMAT,
                               "%s: tensor \"%s\" is mapped to %s, but that shard does not hold it",
                               iname, Q(tname), Q(json_string_value(jshard)));
                break;
            }
        }
        ddo__checkpoint_map_free(&seen);
        if (rc == 0)
            rc = ddo__fail(NULL, DDO_E_INTERNAL, "%s: tensor count mismatch", iname);
        goto out;
    }
    rc = ddo__checkpoint_finish(ck, iname);
    if (rc != 0)
        goto out;
    if (have_total && total_size != ck->total_bytes)
        rc = ddo__fail(NULL, DDO_E_FORMAT,
                       "%s: index: metadata.total_size is %" PRIu64
                       " but the shards' tensors hold %" PRIu64 " bytes",
                       iname, total_size, ck->total_bytes);
out:
    free(shard_path);
    free(dir);
    free(shards);
    json_decref(root);
    return rc;
}
