/*
 * checkpoint_quant.c - ComfyUI's safetensors quantization layout (ddo's own extension,
 * docs/formats.md), found and validated when a checkpoint of files is opened:
 *
 *  - <layer>.comfy_quant: a 1-D U8 tensor holding JSON {"format": ...}, and/or the
 *    __metadata__ entry _quantization_metadata, JSON {"layers": {"<layer>": {"format": ...}}}
 *    (both may be present; they must agree). The format must be one ddo knows; the layer needs
 *    <layer>.weight of the format's stored dtype and <layer>.weight_scale of the format's
 *    shape (one value, or at least one per group of a row), <layer>.weight_scale_2 where the
 *    format has one (nvfp4), and an <layer>.input_scale, when present, of one value.
 *  - the older layout: a scaled_fp8 marker tensor of an F8 dtype; then every F8 <layer>.weight
 *    needs <layer>.scale_weight (or <layer>.weight_scale) of one value (or one per output row)
 *    and an optional <layer>.scale_input (or <layer>.input_scale) of one value.
 *
 * Each layer becomes a ddo_quant_layer naming its tensors. Nothing is converted: the tensors
 * keep their stored dtypes and bytes. Part of the checkpoint (checkpoint_internal.h).
 */
#include "checkpoint/checkpoint_internal.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define Q    ddo__checkpoint_quote
#define NONE SIZE_MAX
/* The largest <layer>.comfy_quant tensor read (real ones hold a few dozen bytes). */
#define MAX_COMFY_QUANT_BYTES 65536

/* What a format stores and which scales it needs. */
typedef struct rule {
    const char *name;
    ddo_dtype weight[2]; /* the stored dtypes accepted */
    unsigned nweight;    /* 0: any (formats whose layout ddo does not check) */
    unsigned group;      /* 0: weight_scale is one value; else values per scale along a row */
    bool packed;         /* two values per stored byte (nvfp4) */
    bool scale2;         /* weight_scale_2 required, one value */
} rule;

static const rule rules[] = {
    { "float8_e4m3fn", { DDO_DTYPE_F8_E4M3, DDO_DTYPE_U8 }, 2, 0, false, false },
    { "float8_e5m2", { DDO_DTYPE_F8_E5M2, DDO_DTYPE_U8 }, 2, 0, false, false },
    { "nvfp4", { DDO_DTYPE_U8, DDO_DTYPE_U8 }, 1, 16, true, true },
    { "mxfp8", { DDO_DTYPE_F8_E4M3, DDO_DTYPE_U8 }, 2, 32, false, false },
    { "int8_tensorwise", { DDO_DTYPE_I8, DDO_DTYPE_I8 }, 1, 0, false, false },
    /* Known names whose scale layouts ddo does not check (weight_scale must exist). */
    { "int8_blockwise", { DDO_DTYPE_I8, DDO_DTYPE_I8 }, 0, 0, false, false },
    { "convrot_w4a4", { DDO_DTYPE_U8, DDO_DTYPE_U8 }, 0, 0, false, false },
    { "asym_w4a8_int8", { DDO_DTYPE_U8, DDO_DTYPE_U8 }, 0, 0, false, false },
    { "awq_w4a16", { DDO_DTYPE_U8, DDO_DTYPE_U8 }, 0, 0, false, false },
};

static const rule *rule_of(const char *format)
{
    for (size_t i = 0; i < DDO_ARRAY_LEN(rules); i++)
        if (strcmp(rules[i].name, format) == 0)
            return &rules[i];
    return NULL;
}

/* The index of tensor "<layer><suffix>", or NONE. */
static size_t find(const ddo_checkpoint *ck, const char *layer, const char *suffix)
{
    size_t n = strlen(layer), m = strlen(suffix);
    char *name = ddo__malloc(n + m + 1);
    if (name == NULL)
        return NONE;
    memcpy(name, layer, n);
    memcpy(name + n, suffix, m + 1);
    size_t i = ddo__strmap_get(&ck->by_name, name, n + m);
    free(name);
    return i;
}

static uint64_t numel(const ddo_tensor_info *t)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->ndim; d++)
        n = ddo__sat_mul_u64(n, t->shape[d]);
    return n;
}

/* The layer named layer (len bytes), added with format when new; *at its index. */
static int layer_add(ddo_checkpoint *ck, ddo__strmap *map, const char *layer, size_t len,
                     const char *format, const char *source, size_t *at)
{
    size_t i = ddo__strmap_get(map, layer, len);
    if (i != NONE) {
        *at = i;
        return 0;
    }
    ddo_quant_layer *q = ddo__reallocarray(ck->quant, ck->quant_count + 1, sizeof(*q));
    if (q == NULL)
        return DDO_E_NO_MEMORY;
    ck->quant = q;
    q = &ck->quant[ck->quant_count];
    memset(q, 0, sizeof(*q));
    q->layer = ddo__strndup(layer, len);
    q->format = ddo__strdup(format);
    q->source = source;
    q->weight = q->weight_scale = q->weight_scale_2 = q->input_scale = q->marker = NONE;
    ck->quant_count++; /* freed with the checkpoint from here on */
    if (q->layer == NULL || q->format == NULL ||
        ddo__strmap_put(map, q->layer, len, ck->quant_count - 1) == SIZE_MAX)
        return DDO_E_NO_MEMORY;
    *at = ck->quant_count - 1;
    return 0;
}

/* The format of a comfy_quant tensor t (index ti): its bytes as JSON {"format": "..."}. */
static int comfy_quant_format(ddo_checkpoint *ck, const char *what, size_t ti, char **format)
{
    const ddo_tensor_info *t = &ck->tensors[ti];
    if (t->dtype != DDO_DTYPE_U8 || t->ndim != 1 || t->nbytes > MAX_COMFY_QUANT_BYTES)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: tensor \"%s\" is %s of %" PRIu64
                         " bytes, not a 1-D U8 tensor of JSON (at most %d bytes)",
                         what, Q(t->name), ddo_dtype_name(t->dtype), t->nbytes,
                         MAX_COMFY_QUANT_BYTES);
    char *text = ddo__malloc((size_t)t->nbytes + 1);
    if (text == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", what);
    int rc = ddo_checkpoint_read(ck, ti, 0, text, (size_t)t->nbytes);
    if (rc != 0) {
        free(text);
        return rc;
    }
    json_error_t jerr;
    json_t *root = json_loadb(text, (size_t)t->nbytes, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    const json_t *f = json_object_get(root, "format");
    if (root == NULL)
        rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: tensor \"%s\" is not JSON: %s", what, Q(t->name),
                       ddo__checkpoint_quote_text(jerr.text));
    else if (!json_is_string(f))
        rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: tensor \"%s\": JSON without a \"format\" string",
                       what, Q(t->name));
    else if ((*format = ddo__strdup(json_string_value(f))) == NULL)
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", what);
    json_decref(root);
    return rc;
}

/* Every <layer>.comfy_quant tensor. */
static int from_tensors(ddo_checkpoint *ck, ddo__strmap *map, const char *what)
{
    static const char suffix[] = ".comfy_quant";
    const size_t sl = sizeof(suffix) - 1;
    for (size_t i = 0; i < ck->tensor_count; i++) {
        const char *name = ck->tensors[i].name;
        size_t n = strlen(name);
        if (n <= sl || strcmp(name + n - sl, suffix) != 0)
            continue;
        char *format = NULL;
        size_t at;
        int rc = comfy_quant_format(ck, what, i, &format);
        if (rc == 0 && layer_add(ck, map, name, n - sl, format, "comfy_quant", &at) != 0)
            rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", what);
        free(format);
        if (rc != 0)
            return rc;
        ck->quant[at].marker = i;
    }
    return 0;
}

/* One entry of _quantization_metadata's "layers": added, or checked against comfy_quant's. */
static int metadata_layer(ddo_checkpoint *ck, ddo__strmap *map, const char *what, const char *key,
                          const json_t *v)
{
    const json_t *f = json_object_get(v, "format");
    if (!json_is_string(f))
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: _quantization_metadata: layer \"%s\" has no \"format\" string", what,
                         Q(key));
    const char *format = json_string_value(f);
    size_t before = ck->quant_count, at;
    if (layer_add(ck, map, key, strlen(key), format, "_quantization_metadata", &at) != 0)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", what);
    if (at < before && strcmp(ck->quant[at].format, format) != 0)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: layer \"%s\": _quantization_metadata says \"%s\" but its "
                         "comfy_quant tensor says \"%s\"",
                         what, Q(key), Q(format), ck->quant[at].format);
    return 0;
}

/* The __metadata__ entry _quantization_metadata, if any. */
static int from_metadata(ddo_checkpoint *ck, ddo__strmap *map, const char *what)
{
    static const char key[] = "_quantization_metadata";
    size_t mi = ddo__strmap_get(&ck->meta_by_key, key, sizeof(key) - 1);
    if (mi == NONE)
        return 0;
    json_error_t jerr;
    json_t *root = json_loads(ck->meta_values[mi], JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: __metadata__ _quantization_metadata is not "
                         "JSON: %s",
                         what, ddo__checkpoint_quote_text(jerr.text));
    const json_t *layers = json_object_get(root, "layers");
    int rc = 0;
    if (!json_is_object(layers))
        rc = ddo__fail(NULL, DDO_E_FORMAT,
                       "%s: __metadata__ _quantization_metadata has no \"layers\" object", what);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)(uintptr_t)layers, k, v)
    {
        if (rc == 0)
            rc = metadata_layer(ck, map, what, k, v);
    }
    json_decref(root);
    return rc;
}

/* A scale tensor that must hold one value (shape [] or [1] or [1, 1]...). */
static int one_value(const ddo_checkpoint *ck, const char *what, const ddo_quant_layer *q,
                     size_t ti)
{
    if (ti == NONE || numel(&ck->tensors[ti]) == 1)
        return 0;
    char dims[128];
    const ddo_tensor_info *t = &ck->tensors[ti];
    ddo__checkpoint_format_dims(dims, sizeof(dims), t->shape, t->ndim);
    return ddo__fail(NULL, DDO_E_FORMAT,
                     "%s: layer \"%s\" (%s): scale tensor \"%s\" has shape %s, not one value", what,
                     Q(q->layer), q->format, Q(t->name), dims);
}

/* weight_scale of a grouped format: at least one value per group of each row. */
static int grouped_scale(const ddo_checkpoint *ck, const char *what, const ddo_quant_layer *q,
                         const rule *r)
{
    const ddo_tensor_info *w = &ck->tensors[q->weight], *s = &ck->tensors[q->weight_scale];
    char dims[128];
    ddo__checkpoint_format_dims(dims, sizeof(dims), w->shape, w->ndim);
    if (w->ndim != 2)
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: layer \"%s\" (%s): weight has shape %s, not 2-D",
                         what, Q(q->layer), q->format, dims);
    uint64_t cols = w->shape[1] * (r->packed ? 2 : 1);
    uint64_t need = ddo__sat_mul_u64(w->shape[0], (cols + r->group - 1) / r->group);
    if (numel(s) >= need)
        return 0;
    char sdims[128];
    ddo__checkpoint_format_dims(sdims, sizeof(sdims), s->shape, s->ndim);
    return ddo__fail(
        NULL, DDO_E_FORMAT,
        "%s: layer \"%s\" (%s): scale tensor \"%s\" has shape %s, fewer than the %" PRIu64
        " values (one per %u of a row) weight %s needs",
        what, Q(q->layer), q->format, Q(s->name), sdims, need, r->group, dims);
}

/* The tensors of layer q and their dtypes and shapes under its format's rule. */
static int check_layer(ddo_checkpoint *ck, const char *what, ddo_quant_layer *q)
{
    const rule *r = rule_of(q->format);
    if (r == NULL)
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: layer \"%s\": unknown quantization format \"%s\"",
                         what, Q(q->layer), Q(q->format));
    q->weight = find(ck, q->layer, ".weight");
    q->weight_scale = find(ck, q->layer, ".weight_scale");
    q->weight_scale_2 = find(ck, q->layer, ".weight_scale_2");
    q->input_scale = find(ck, q->layer, ".input_scale");
    if (q->weight == NONE)
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: layer \"%s\" (%s): no tensor \"%s.weight\"", what,
                         Q(q->layer), q->format, Q(q->layer));
    ddo_dtype dt = ck->tensors[q->weight].dtype;
    if (r->nweight > 0 && dt != r->weight[0] && (r->nweight < 2 || dt != r->weight[1]))
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: layer \"%s\" (%s): weight is %s, not %s%s%s",
                         what, Q(q->layer), q->format, ddo_dtype_name(dt),
                         ddo_dtype_name(r->weight[0]), r->nweight > 1 ? " or " : "",
                         r->nweight > 1 ? ddo_dtype_name(r->weight[1]) : "");
    const char *missing = q->weight_scale == NONE                  ? ".weight_scale"
                          : r->scale2 && q->weight_scale_2 == NONE ? ".weight_scale_2"
                                                                   : NULL;
    if (missing != NULL)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: layer \"%s\" (%s): scale tensor \"%s%s\" is missing", what,
                         Q(q->layer), q->format, Q(q->layer), missing);
    if (r->nweight == 0) /* a format whose scale layout ddo does not check */
        return 0;
    int rc =
        r->group != 0 ? grouped_scale(ck, what, q, r) : one_value(ck, what, q, q->weight_scale);
    if (rc == 0 && r->scale2)
        rc = one_value(ck, what, q, q->weight_scale_2);
    if (rc == 0)
        rc = one_value(ck, what, q, q->input_scale);
    return rc;
}

static bool is_f8(ddo_dtype dt)
{
    return dt == DDO_DTYPE_F8_E4M3 || dt == DDO_DTYPE_F8_E5M2;
}

/* One F8 weight (index wi) of the older layout: its scale_weight and scale_input. */
static int legacy_layer(ddo_checkpoint *ck, ddo__strmap *map, const char *what, size_t wi,
                        size_t marker)
{
    const ddo_tensor_info *w = &ck->tensors[wi];
    size_t len = strlen(w->name) - strlen(".weight"), at;
    if (ddo__strmap_get(map, w->name, len) != NONE)
        return 0; /* a layer of the newer layout */
    if (layer_add(ck, map, w->name, len, "scaled_fp8", "scaled_fp8", &at) != 0)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", what);
    ddo_quant_layer *q = &ck->quant[at];
    q->weight = wi;
    q->marker = marker;
    q->weight_scale = find(ck, q->layer, ".scale_weight");
    q->input_scale = find(ck, q->layer, ".scale_input");
    if (q->weight_scale == NONE) /* the newer spelling, which loaders of this layout also take */
        q->weight_scale = find(ck, q->layer, ".weight_scale");
    if (q->input_scale == NONE)
        q->input_scale = find(ck, q->layer, ".input_scale");
    if (q->weight_scale == NONE)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: layer \"%s\" (scaled_fp8): scale tensor \"%s.scale_weight\" is "
                         "missing",
                         what, Q(q->layer), Q(q->layer));
    uint64_t n = numel(&ck->tensors[q->weight_scale]);
    if (n != 1 && !(w->ndim >= 1 && n == w->shape[0])) {
        char dims[128];
        const ddo_tensor_info *s = &ck->tensors[q->weight_scale];
        ddo__checkpoint_format_dims(dims, sizeof(dims), s->shape, s->ndim);
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: layer \"%s\" (scaled_fp8): scale tensor \"%s\" has shape %s, not "
                         "one value or one per output row",
                         what, Q(q->layer), Q(s->name), dims);
    }
    return one_value(ck, what, q, q->input_scale);
}

/* The older layout: a scaled_fp8 marker, then every F8 <layer>.weight. */
static int from_marker(ddo_checkpoint *ck, ddo__strmap *map, const char *what)
{
    size_t marker = NONE;
    for (size_t i = 0; i < ck->tensor_count && marker == NONE; i++) {
        const char *n = ck->tensors[i].name;
        size_t l = strlen(n);
        if (strcmp(n, "scaled_fp8") == 0 || (l > 11 && strcmp(n + l - 11, ".scaled_fp8") == 0))
            marker = i;
    }
    if (marker == NONE)
        return 0;
    if (!is_f8(ck->tensors[marker].dtype))
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: marker tensor \"%s\" is %s, not F8_E4M3 or F8_E5M2 (its dtype "
                         "names the weights' FP8 type)",
                         what, Q(ck->tensors[marker].name),
                         ddo_dtype_name(ck->tensors[marker].dtype));
    for (size_t i = 0; i < ck->tensor_count; i++) {
        const ddo_tensor_info *t = &ck->tensors[i];
        size_t l = strlen(t->name);
        if (!is_f8(t->dtype) || l <= 7 || strcmp(t->name + l - 7, ".weight") != 0)
            continue;
        int rc = legacy_layer(ck, map, what, i, marker);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int cmp_weight(const void *a, const void *b)
{
    const ddo_quant_layer *x = a, *y = b;
    return x->weight < y->weight ? -1 : x->weight > y->weight;
}

int ddo__checkpoint_quant(ddo_checkpoint *ck, const char *what)
{
    ddo__strmap map;
    memset(&map, 0, sizeof(map));
    int rc = from_tensors(ck, &map, what);
    if (rc == 0)
        rc = from_metadata(ck, &map, what);
    for (size_t i = 0; i < ck->quant_count && rc == 0; i++)
        rc = check_layer(ck, what, &ck->quant[i]);
    if (rc == 0)
        rc = from_marker(ck, &map, what);
    ddo__strmap_free(&map);
    if (rc == 0 && ck->quant_count > 1)
        qsort(ck->quant, ck->quant_count, sizeof(*ck->quant), cmp_weight);
    return rc;
}

size_t ddo_checkpoint_quant_layer_count(const ddo_checkpoint *ck)
{
    return ck == NULL ? 0 : ck->quant_count;
}

const ddo_quant_layer *ddo_checkpoint_quant_layer(const ddo_checkpoint *ck, size_t i)
{
    if (ck == NULL || i >= ck->quant_count)
        return NULL;
    return &ck->quant[i];
}
