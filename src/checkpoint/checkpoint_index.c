/*
 * checkpoint_index.c - sharded sets: the *.safetensors.index.json weight_map names the
 * shards (files in the index's directory, opened in name order); every mapped
 * tensor must be in its shard, no shard may hold an unmapped tensor, and
 * metadata.total_size, when present, must equal the tensors' bytes.
 */
#include "checkpoint/checkpoint_internal.h"

#include <inttypes.h>
#include <math.h>
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
    rc = ddo__checkpoint_json_load(label, what, text, len, root, NULL);
    free(text);
    return rc;
}

/* metadata (null or an object) and its total_size, when present, into *total. */
static int index_metadata(const char *iname, const json_t *meta, const ddo__json_bigs *bigs,
                          bool *have_total, uint64_t *total)
{
    *have_total = false;
    if (meta == NULL || json_is_null(meta))
        return 0;
    if (!json_is_object(meta))
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: index: \"metadata\" is %s, not an object", iname,
                         ddo__checkpoint_json_type(meta));
    const json_t *ts = json_object_get(meta, "total_size");
    if (ts == NULL)
        return 0;
    double r = json_is_real(ts) ? json_real_value(ts) : -1;
    if (json_is_real(ts) && r >= 0 && !signbit(r) && r < 1.8e19 && r == (double)(uint64_t)r) {
        *total = (uint64_t)r; /* a whole real such as 297888.0, as Python writers may emit */
    } else if (!ddo__checkpoint_json_u64(ts, bigs, total)) {
        char what[64];
        if (json_is_integer(ts))
            snprintf(what, sizeof(what), "%lld", (long long)json_integer_value(ts));
        else if (json_is_real(ts))
            ddo__checkpoint_format_real(what, sizeof(what), r);
        else
            snprintf(what, sizeof(what), "%s", ddo__checkpoint_json_type(ts));
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: index: metadata.total_size is %s, not a non-negative integer "
                         "number of bytes",
                         iname, what);
    }
    *have_total = true;
    return 0;
}

/* The distinct shard names of the weight_map, sorted (borrowed from wm; free the array). */
static int index_shards(const char *iname, const json_t *wm, const char ***out, size_t *count)
{
    const char **shards = ddo__calloc(json_object_size(wm) + 1, sizeof(*shards));
    if (shards == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", iname);
    size_t n = 0;
    const char *tname;
    json_t *jshard;
    json_object_foreach((json_t *)(uintptr_t)wm, tname, jshard)
    {
        const char *s = json_is_string(jshard) ? json_string_value(jshard) : NULL;
        int rc = 0;
        if (s == NULL)
            rc = ddo__fail(NULL, DDO_E_FORMAT,
                           "%s: weight_map: tensor \"%s\" is mapped to %s, not a file name", iname,
                           Q(tname), ddo__checkpoint_json_type(jshard));
        else if (s[0] == '\0' || strchr(s, '/') != NULL || strcmp(s, ".") == 0 ||
                 strcmp(s, "..") == 0 || strlen(s) != json_string_length(jshard))
            rc = ddo__fail(NULL, DDO_E_FORMAT,
                           "%s: weight_map: tensor \"%s\" is mapped to \"%s\", not a file name in "
                           "the index's directory",
                           iname, Q(tname), Q(s));
        if (rc != 0) {
            free(shards);
            return rc;
        }
        shards[n++] = s;
    }
    if (n == 0) {
        free(shards);
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: index: weight_map is empty", iname);
    }
    qsort(shards, n, sizeof(*shards), cmp_str);
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++)
        if (distinct == 0 || strcmp(shards[distinct - 1], shards[i]) != 0)
            shards[distinct++] = shards[i];
    *out = shards;
    *count = distinct;
    return 0;
}

/* Opens shard `shard` (in dir) and checks that each of its tensors is mapped to it. */
static int open_shard(ddo_checkpoint *ck, const char *iname, const json_t *wm, const char *dir,
                      const char *shard)
{
    char *shard_path = ddo__asprintf("%s%s", dir, shard);
    uint32_t fi;
    int rc = shard_path == NULL ? DDO_E_NO_MEMORY : ddo__checkpoint_add_file(ck, shard_path, &fi);
    free(shard_path);
    if (rc != 0)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", iname);
    size_t first = ck->tensor_count;
    ck->files[fi].in_set = true;
    rc = ddo__checkpoint_open_file(ck, fi);
    if (rc != 0)
        return rc;
    for (size_t i = first; i < ck->tensor_count; i++) {
        const json_t *m = json_object_get(wm, ck->tensors[i].name);
        if (m == NULL)
            return ddo__fail(NULL, DDO_E_FORMAT, "%s: tensor \"%s\" is not in the weight_map of %s",
                             ck->files[fi].label, Q(ck->tensors[i].name), iname);
        if (strcmp(json_string_value(m), shard) != 0)
            return ddo__fail(
                NULL, DDO_E_FORMAT, "%s: tensor \"%s\" is mapped to %s by %s, not to this shard",
                ck->files[fi].label, Q(ck->tensors[i].name), Q(json_string_value(m)), iname);
    }
    return 0;
}

/* Names a mapped tensor that no shard holds (called when the counts differ). */
static int report_missing(const ddo_checkpoint *ck, const char *iname, const json_t *wm)
{
    ddo__strmap seen = { NULL, 0, 0 };
    for (size_t i = 0; i < ck->tensor_count; i++) {
        if (ddo__strmap_put(&seen, ck->tensors[i].name, strlen(ck->tensors[i].name), i) ==
            SIZE_MAX) {
            ddo__strmap_free(&seen);
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", iname);
        }
    }
    int rc = 0;
    const char *tname;
    json_t *jshard;
    json_object_foreach((json_t *)(uintptr_t)wm, tname, jshard)
    {
        if (ddo__strmap_get(&seen, tname, strlen(tname)) == SIZE_MAX) {
            rc = ddo__fail(NULL, DDO_E_FORMAT,
                           "%s: tensor \"%s\" is mapped to %s, but that shard does not hold it",
                           iname, Q(tname), Q(json_string_value(jshard)));
            break;
        }
    }
    ddo__strmap_free(&seen);
    if (rc == 0)
        rc = ddo__fail(NULL, DDO_E_INTERNAL, "%s: tensor count mismatch", iname);
    return rc;
}

/* A sharded set: the index's weight_map names the shards (in its directory). */
int ddo__checkpoint_open_index(ddo_checkpoint *ck, const char *path)
{
    const char *base = ddo__checkpoint_base_name(path);
    char iname[512];
    snprintf(iname, sizeof(iname), "%s", Q(base));
    json_t *root = NULL;
    const char **shards = NULL;
    size_t shard_count = 0;
    char *dir = NULL;
    bool have_total = false;
    uint64_t total_size = 0;
    ddo__json_bigs bigs = { NULL, 0, 0 };
    char *text = NULL;
    size_t len = 0;
    int rc = read_small_file(path, iname, "index", DDO__CHECKPOINT_MAX_INDEX_BYTES, &text, &len);
    if (rc == 0)
        rc = ddo__checkpoint_json_load(iname, "index", text, len, &root, &bigs);
    free(text);
    if (rc != 0)
        goto out;
    const json_t *wm = json_object_get(root, "weight_map");
    const json_t *meta = json_object_get(root, "metadata");
    if (!json_is_object(root))
        rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: index is %s, not a JSON object", iname,
                       ddo__checkpoint_json_type(root));
    else if (!json_is_object(wm))
        rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: index: \"weight_map\" is %s, not an object", iname,
                       wm == NULL ? "missing" : ddo__checkpoint_json_type(wm));
    if (rc == 0)
        rc = index_metadata(iname, meta, &bigs, &have_total, &total_size);
    if (rc == 0)
        rc = index_shards(iname, wm, &shards, &shard_count);
    if (rc != 0)
        goto out;
    /* Index metadata strings first. */
    const char *mkey;
    json_t *mval;
    json_object_foreach((json_t *)(uintptr_t)(json_is_object(meta) ? meta : NULL), mkey, mval)
    {
        if (json_is_string(mval) &&
            ddo__checkpoint_add_metadata(ck, mkey, json_string_value(mval)) != 0) {
            rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", iname);
            goto out;
        }
    }
    dir = ddo__strndup(path, (size_t)(base - path));
    if (dir == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", iname);
        goto out;
    }
    for (size_t s = 0; s < shard_count && rc == 0; s++)
        rc = open_shard(ck, iname, wm, dir, shards[s]);
    /* Every mapped tensor was found (each shard's tensors map to it, so the
     * counts match exactly when none is missing). */
    if (rc == 0 && ck->tensor_count != json_object_size(wm))
        rc = report_missing(ck, iname, wm);
    if (rc == 0)
        rc = ddo__checkpoint_finish(ck, iname);
    if (rc == 0 && have_total && total_size != ck->total_bytes)
        rc = ddo__fail(NULL, DDO_E_FORMAT,
                       "%s: index: metadata.total_size is %" PRIu64
                       " but the shards' tensors hold %" PRIu64 " bytes",
                       iname, total_size, ck->total_bytes);
out:
    free(dir);
    free(shards);
    json_decref(root);
    ddo__json_bigs_free(&bigs);
    return rc;
}
