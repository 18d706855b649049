/*
 * checkpoint_header.c - one safetensors file's header, validated strictly before any tensor
 * is used: the 8-byte length prefix, the header's bytes (no byte-order mark, no NUL), the
 * JSON (through checkpoint_json.c's bounded loader), each entry's dtype, shape and offsets,
 * the layout (the non-empty ranges tile the data area exactly: no overlap, no gap, nothing
 * after the last tensor) and the metadata; and the opening of one file (open, identity, the
 * prefix and the header read, the identity checked again, the mapping) or of an image in
 * memory that reads them. Part of the checkpoint (checkpoint_internal.h).
 *
 * Messages name the file by its basename (the path as given only for errors
 * of the file system: cannot open, not found), then the tensor, then the rule.
 */
#include "checkpoint/checkpoint_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define Q ddo__checkpoint_quote

/* ------------------------------------------------------------------------ */
/* Header validation                                                         */
/* ------------------------------------------------------------------------ */

/* "[-4, 3, 3, 3]" from a JSON array as written (non-integers as their type). */
static void format_json_array(char *buf, size_t len, const json_t *arr, const ddo__json_bigs *bigs)
{
    size_t at = 0;
    int w = snprintf(buf, len, "[");
    at = w > 0 ? (size_t)w : 0;
    for (size_t i = 0; i < json_array_size(arr) && at < len; i++) {
        const json_t *v = json_array_get(arr, i);
        const char *sep = i ? ", " : "";
        uint64_t big;
        if (ddo__json_bigs_get(bigs, v, &big))
            w = snprintf(buf + at, len - at, "%s%" PRIu64, sep, big);
        else if (json_is_integer(v))
            w = snprintf(buf + at, len - at, "%s%lld", sep, (long long)json_integer_value(v));
        else if (json_is_real(v)) {
            char real[40];
            ddo__checkpoint_format_real(real, sizeof(real), json_real_value(v));
            w = snprintf(buf + at, len - at, "%s%s", sep, real);
        } else if (json_is_string(v))
            w = snprintf(buf + at, len - at, "%s\"%s\"", sep, Q(json_string_value(v)));
        else
            w = snprintf(buf + at, len - at, "%s%s", sep,
                         json_is_null(v)      ? "null"
                         : json_is_boolean(v) ? "a boolean"
                                              : "...");
        if (w < 0)
            return;
        at += (size_t)w;
    }
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

/* Checks a shape against the dtype: dims[] and *nbytes on success. */
static int parse_shape(const char *fname, const char *name, ddo_dtype dtype, const json_t *jshape,
                       const ddo__json_bigs *bigs, uint64_t dims[DDO_MAX_DIMS], size_t *ndim_out,
                       uint64_t *nbytes)
{
    char shape_text[256];
    size_t ndim = json_array_size(jshape);
    for (size_t i = 0; i < ndim; i++) {
        const json_t *d = json_array_get(jshape, i);
        uint64_t v;
        if (!ddo__checkpoint_json_u64(d, bigs, &v)) {
            format_json_array(shape_text, sizeof(shape_text), jshape, bigs);
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: tensor \"%s\": shape %s: dimension %zu is %s, not a "
                             "non-negative integer",
                             fname, Q(name), shape_text, i,
                             json_is_integer(d) ? "negative" : ddo__checkpoint_json_type(d));
        }
        if (i < DDO_MAX_DIMS)
            dims[i] = v;
    }
    if (ndim > DDO_MAX_DIMS) {
        format_json_array(shape_text, sizeof(shape_text), jshape, bigs);
        return ddo__fail(NULL, DDO_E_UNSUPPORTED,
                         "%s: tensor \"%s\": shape %s has %zu dimensions; at most %d are supported "
                         "(stricter than the official reader)",
                         fname, Q(name), shape_text, ndim, DDO_MAX_DIMS);
    }
    int rc = ddo__dtype_nbytes(dtype, dims, ndim, nbytes);
    if (rc != 0) {
        ddo__checkpoint_format_dims(shape_text, sizeof(shape_text), dims, ndim);
        if (rc == DDO_E_OVERFLOW)
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: tensor \"%s\": %s %s: element count or size overflows 64 bits",
                             fname, Q(name), ddo_dtype_name(dtype), shape_text);
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: tensor \"%s\": %s %s: %u-bit elements do not fill whole bytes", fname,
                         Q(name), ddo_dtype_name(dtype), shape_text, ddo__dtype_bits(dtype));
    }
    *ndim_out = ndim;
    return 0;
}

/* Checks data_offsets [begin, end] against the data area and the byte size. */
static int parse_offsets(const char *fname, const char *name, const json_t *joffs,
                         const ddo__json_bigs *bigs, uint64_t data_len, uint64_t *begin_out,
                         uint64_t *end_out)
{
    if (joffs == NULL)
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: tensor \"%s\": missing \"data_offsets\"", fname,
                         Q(name));
    if (!json_is_array(joffs))
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: tensor \"%s\": \"data_offsets\" is %s, not [begin, end]", fname,
                         Q(name), ddo__checkpoint_json_type(joffs));
    if (json_array_size(joffs) != 2)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: tensor \"%s\": \"data_offsets\" must be [begin, end], got %zu "
                         "element(s)",
                         fname, Q(name), json_array_size(joffs));
    uint64_t begin, end;
    if (!ddo__checkpoint_json_u64(json_array_get(joffs, 0), bigs, &begin) ||
        !ddo__checkpoint_json_u64(json_array_get(joffs, 1), bigs, &end)) {
        char offs_text[160];
        format_json_array(offs_text, sizeof(offs_text), joffs, bigs);
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: tensor \"%s\": data_offsets %s are not non-negative integers", fname,
                         Q(name), offs_text);
    }
    if (begin > end)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                         "] are reversed (begin > end)",
                         fname, Q(name), begin, end);
    if (end > data_len)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                         "] run past the end of the data area (%" PRIu64 " bytes)",
                         fname, Q(name), begin, end, data_len);
    *begin_out = begin;
    *end_out = end;
    return 0;
}

/* Validates one tensor entry and appends it with its relative begin in offset. */
static int parse_entry(ddo_checkpoint *ck, const char *fname, uint32_t file_index, const char *name,
                       const json_t *entry, uint64_t data_len, const ddo__json_bigs *bigs)
{
    if (strlen(name) > DDO__CHECKPOINT_MAX_NAME_BYTES)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: tensor \"%s\": name is %zu bytes, over ddo's limit of %d (stricter "
                         "than the official reader; see docs/inspect.md)",
                         fname, Q(name), strlen(name), DDO__CHECKPOINT_MAX_NAME_BYTES);
    if (ck->tensor_count >= DDO__CHECKPOINT_MAX_TENSORS)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: more than %d tensors (ddo's limit, stricter than the official "
                         "reader; see docs/inspect.md)",
                         fname, DDO__CHECKPOINT_MAX_TENSORS);
    if (!json_is_object(entry))
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: tensor \"%s\": entry is %s, not an object", fname,
                         Q(name), ddo__checkpoint_json_type(entry));
    const json_t *jdtype = json_object_get(entry, "dtype");
    const json_t *jshape = json_object_get(entry, "shape");
    if (jdtype == NULL)
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: tensor \"%s\": missing \"dtype\"", fname,
                         Q(name));
    if (!json_is_string(jdtype))
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: tensor \"%s\": \"dtype\" is %s, not a string",
                         fname, Q(name), ddo__checkpoint_json_type(jdtype));
    ddo_dtype dtype;
    if (ddo_dtype_from_name(json_string_value(jdtype), &dtype) != 0 ||
        ddo_dtype_block(dtype, NULL) != 0) /* GGML block types are GGUF's, not safetensors' */
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: tensor \"%s\": unknown dtype \"%s\"", fname,
                         Q(name), Q(json_string_value(jdtype)));
    if (jshape == NULL)
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: tensor \"%s\": missing \"shape\"", fname,
                         Q(name));
    if (!json_is_array(jshape))
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: tensor \"%s\": \"shape\" is %s, not an array",
                         fname, Q(name), ddo__checkpoint_json_type(jshape));
    uint64_t dims[DDO_MAX_DIMS] = { 0 }, nbytes = 0, begin = 0, end = 0;
    size_t ndim = 0;
    int rc = parse_shape(fname, name, dtype, jshape, bigs, dims, &ndim, &nbytes);
    if (rc == 0)
        rc = parse_offsets(fname, name, json_object_get(entry, "data_offsets"), bigs, data_len,
                           &begin, &end);
    if (rc != 0)
        return rc;
    if (end - begin != nbytes) {
        char shape_text[256];
        ddo__checkpoint_format_dims(shape_text, sizeof(shape_text), dims, ndim);
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                         " bytes but %s %s needs %" PRIu64,
                         fname, Q(name), begin, end, end - begin, ddo_dtype_name(dtype), shape_text,
                         nbytes);
    }
    ddo_tensor_info *t = ddo__checkpoint_add_tensor(ck, name);
    if (t == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory reading the header", fname);
    t->dtype = dtype;
    t->ndim = (uint32_t)ndim;
    memcpy(t->shape, dims, ndim * sizeof(dims[0]));
    t->file_index = file_index;
    t->offset = begin; /* made absolute once the layout is checked */
    t->nbytes = nbytes;
    return 0;
}

/* Sorts t[0..n) by data offset and checks that the non-empty ranges tile the
 * data area exactly: no overlap, no gap, nothing after the last tensor. */
static int check_layout(const char *fname, ddo_tensor_info *t, size_t n, uint64_t data_len)
{
    if (n > 1)
        qsort(t, n, sizeof(*t), ddo__checkpoint_cmp_offset);
    const ddo_tensor_info *prev = NULL; /* the non-empty tensor ending last so far */
    for (size_t i = 0; i < n; i++) {
        if (prev != NULL && t[i].offset < prev->offset + prev->nbytes) {
            if (t[i].nbytes == 0)
                return ddo__fail(NULL, DDO_E_FORMAT,
                                 "%s: tensor \"%s\": empty data_offsets [%" PRIu64 ", %" PRIu64
                                 "] lie inside tensor \"%s\" [%" PRIu64 ", %" PRIu64 "]",
                                 fname, Q(t[i].name), t[i].offset, t[i].offset, Q(prev->name),
                                 prev->offset, prev->offset + prev->nbytes);
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                             "] overlap tensor \"%s\" [%" PRIu64 ", %" PRIu64 "]",
                             fname, Q(t[i].name), t[i].offset, t[i].offset + t[i].nbytes,
                             Q(prev->name), prev->offset, prev->offset + prev->nbytes);
        }
        if (t[i].nbytes > 0)
            prev = &t[i];
    }
    uint64_t covered = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i].offset > covered)
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
                             "] leave a gap: bytes [%" PRIu64 ", %" PRIu64
                             ") of the data area belong to no tensor",
                             fname, Q(t[i].name), t[i].offset, t[i].offset + t[i].nbytes, covered,
                             t[i].offset);
        if (t[i].offset + t[i].nbytes > covered)
            covered = t[i].offset + t[i].nbytes;
    }
    if (covered != data_len)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: %" PRIu64
                         " bytes follow the last tensor (the data area holds %" PRIu64
                         " bytes, the tensors end at %" PRIu64 ")",
                         fname, data_len - covered, data_len, covered);
    return 0;
}

/* Refuses a header that starts with a byte-order mark or holds a NUL byte. */
static int check_header_bytes(const char *fname, const uint8_t *hdr, size_t hdr_len)
{
    if (hdr_len >= 3 && hdr[0] == 0xEF && hdr[1] == 0xBB && hdr[2] == 0xBF)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: header starts with a UTF-8 byte-order mark (not allowed)", fname);
    const uint8_t *nul = memchr(hdr, 0, hdr_len);
    if (nul != NULL) {
        size_t at = (size_t)(nul - hdr);
        bool padding = true;
        for (size_t i = at; i < hdr_len && padding; i++)
            padding = hdr[i] == 0 || hdr[i] == ' ';
        if (padding)
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: header is padded with NUL bytes from byte %zu (only trailing "
                             "spaces are allowed)",
                             fname, at);
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: header contains a NUL byte at byte %zu", fname,
                         at);
    }
    return 0;
}

/* Checks the value of "__metadata__": null, or an object of strings. */
static int check_metadata(const char *fname, const json_t *value)
{
    if (json_is_null(value))
        return 0;
    if (!json_is_object(value))
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: __metadata__ is %s, not an object", fname,
                         ddo__checkpoint_json_type(value));
    const char *mkey;
    json_t *mval;
    json_object_foreach((json_t *)(uintptr_t)value, mkey, mval)
    {
        if (!json_is_string(mval))
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: __metadata__: value of \"%s\" is %s, not a string", fname,
                             Q(mkey), ddo__checkpoint_json_type(mval));
    }
    return 0;
}

/* Copies the (checked) metadata of root, if any, into ck. */
static int add_metadata(ddo_checkpoint *ck, const char *fname, const json_t *root)
{
    const json_t *meta = json_object_get(root, "__metadata__");
    if (!json_is_object(meta))
        return 0;
    const char *mkey;
    json_t *mval;
    json_object_foreach((json_t *)(uintptr_t)meta, mkey, mval)
    {
        if (ddo__checkpoint_add_metadata(ck, mkey, json_string_value(mval)) != 0)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory reading the header", fname);
    }
    return 0;
}

/*
 * Validates the header hdr[0..hdr_len) of file `file_index` whose data area
 * holds data_len bytes, and appends its tensors (absolute offsets, sorted)
 * and metadata to ck. On failure ck may hold a partial table (it is
 * destroyed by the caller).
 */
static int parse_header(ddo_checkpoint *ck, uint32_t file_index, const char *fname,
                        const uint8_t *hdr, size_t hdr_len, uint64_t data_len)
{
    int rc = check_header_bytes(fname, hdr, hdr_len);
    if (rc != 0)
        return rc;
    json_t *root = NULL;
    ddo__json_bigs bigs;
    rc = ddo__checkpoint_json_load(fname, "header", (const char *)hdr, hdr_len, &root, &bigs);
    if (rc != 0)
        return rc;
    size_t first = ck->tensor_count;
    if (!json_is_object(root)) {
        rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: header is %s, not a JSON object", fname,
                       ddo__checkpoint_json_type(root));
        goto out;
    }
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value)
    {
        if (strcmp(key, "__metadata__") == 0)
            rc = check_metadata(fname, value);
        else
            rc = parse_entry(ck, fname, file_index, key, value, data_len, &bigs);
        if (rc != 0)
            goto out;
    }
    rc = check_layout(fname, ck->tensor_count > first ? ck->tensors + first : NULL,
                      ck->tensor_count - first, data_len);
    if (rc != 0)
        goto out;
    /* Metadata only once the file is known to be valid. */
    rc = add_metadata(ck, fname, root);
out:
    json_decref(root);
    ddo__json_bigs_free(&bigs);
    return rc;
}

/* Checks the 8-byte prefix of a file of file_size bytes; *hdr_len on success. */
static int check_prefix(const char *fname, const uint8_t prefix[8], uint64_t file_size,
                        uint64_t *hdr_len)
{
    *hdr_len = 0;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | prefix[i];
    if (n > DDO__CHECKPOINT_MAX_HEADER_BYTES)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: header length %" PRIu64 " exceeds the limit of %" PRIu64
                         " bytes (the official reader's)",
                         fname, n, (uint64_t)DDO__CHECKPOINT_MAX_HEADER_BYTES);
    if (n > file_size - 8)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: header length %" PRIu64 " runs past the end of the file (%" PRIu64
                         " bytes)",
                         fname, n, file_size);
    *hdr_len = n;
    return 0;
}

static int too_small(const char *fname, uint64_t size)
{
    return ddo__fail(NULL, DDO_E_FORMAT,
                     "%s: file is %" PRIu64 " bytes, too short for the 8-byte header length", fname,
                     size);
}

/* Validates an image already in memory as file `fi` of ck. */
int ddo__checkpoint_parse_image(ddo_checkpoint *ck, uint32_t fi, const uint8_t *data, uint64_t size)
{
    ddo__checkpoint_file *f = &ck->files[fi];
    if (size < 8)
        return too_small(f->label, size);
    if (memcmp(data, "GGUF", 4) == 0)
        return ddo__checkpoint_parse_gguf(ck, fi, data, size);
    uint64_t hdr_len;
    int rc = check_prefix(f->label, data, size, &hdr_len);
    if (rc != 0)
        return rc;
    f->info.size = size;
    f->info.header_bytes = hdr_len;
    f->info.data_offset = 8 + hdr_len;
    return parse_header(ck, fi, f->label, data + 8, (size_t)hdr_len, size - 8 - hdr_len);
}

/* Reads and validates the safetensors header of file fi (size bytes, its first 8 in prefix). */
static int read_header(ddo_checkpoint *ck, uint32_t fi, const uint8_t prefix[8], uint64_t size)
{
    ddo__checkpoint_file *f = &ck->files[fi];
    uint64_t hdr_len;
    int rc = check_prefix(f->label, prefix, size, &hdr_len);
    if (rc != 0)
        return rc;
    f->info.size = size;
    f->info.header_bytes = hdr_len;
    f->info.data_offset = 8 + hdr_len;
    uint8_t *hdr = ddo__malloc((size_t)hdr_len);
    if (hdr == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory for a %" PRIu64 "-byte header",
                         f->label, hdr_len);
    int e = ddo__os_pread_full(f->fd, hdr, (size_t)hdr_len, 8);
    if (e != 0) {
        free(hdr);
        return ddo__checkpoint_os_failure(f->info.path, "read", e);
    }
    rc = parse_header(ck, fi, f->label, hdr, (size_t)hdr_len, size - 8 - hdr_len);
    free(hdr);
    return rc;
}

/* Opens, identifies and validates one safetensors or GGUF file as file `fi`. */
int ddo__checkpoint_open_file(ddo_checkpoint *ck, uint32_t fi)
{
    ddo__checkpoint_file *f = &ck->files[fi];
    int e = ddo__os_file_open(f->info.path, &f->fd);
    if (e != 0)
        return ddo__checkpoint_os_failure(f->info.path, "cannot open", e);
    e = ddo__os_file_identity(f->fd, &f->id);
    if (e != 0)
        return ddo__checkpoint_os_failure(f->info.path, "cannot stat", e);
    if (!f->id.regular)
        return ddo__checkpoint_os_failure(f->info.path, "cannot open", DDO__OS_NOT_REGULAR);
    f->real_path = ddo__os_realpath(f->info.path);
    if (f->real_path == NULL)
        return ddo__checkpoint_os_failure(f->info.path, "cannot resolve the path", errno);
    uint64_t size = f->id.size;
    if (size < 8)
        return too_small(f->label, size);
    uint8_t prefix[8];
    e = ddo__os_pread_full(f->fd, prefix, 8, 0);
    if (e != 0)
        return ddo__checkpoint_os_failure(f->info.path, "read", e);
    int rc = memcmp(prefix, "GGUF", 4) == 0 ? ddo__checkpoint_parse_gguf(ck, fi, NULL, size)
                                            : read_header(ck, fi, prefix, size);
    if (rc != 0)
        return rc;
    rc = ddo__checkpoint_check_file(ck, fi); /* changed while we read it? */
    if (rc != 0)
        return rc;
    if (ck->backend == DDO_READ_MMAP) {
        const void *map;
        e = ddo__os_map_file(f->fd, size, &map);
        if (e != 0)
            return ddo__checkpoint_os_failure(f->info.path, "mmap", e);
        f->data = map;
        f->mapped = true;
    }
    return 0;
}
