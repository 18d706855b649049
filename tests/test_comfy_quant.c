/*
 * test_comfy_quant.c - ComfyUI's safetensors quantization layout, on files this test writes:
 * layers found through <layer>.comfy_quant tensors, through the __metadata__ entry
 * _quantization_metadata and through the older scaled_fp8 marker, each naming its weight,
 * scales and marker, with the tensors' stored dtypes and bytes unchanged; a layer's tensors
 * land in one streamed unit of a plan; and every malformed case refused with one line
 * (comfy_quant not JSON, an unknown format, a scale tensor missing or of the wrong shape, a
 * weight of the wrong dtype, the two sources disagreeing, a marker that is not F8).
 *
 * ctest-labels: unit
 */
#include "t.h"
#include "checkpoint/checkpoint.h"
#include "ddo.h"
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

typedef struct spec {
    const char *name, *dtype;
    unsigned ndim;
    uint64_t shape[2];
    const char *bytes; /* the data (a comfy_quant JSON), else the tensor is filled with its index */
} spec;

static size_t esize(const char *dtype)
{
    return strcmp(dtype, "F32") == 0 ? 4 : strcmp(dtype, "BF16") == 0 ? 2 : 1;
}

static uint64_t nbytes(const spec *s)
{
    if (s->bytes != NULL)
        return strlen(s->bytes);
    uint64_t n = esize(s->dtype);
    for (unsigned d = 0; d < s->ndim; d++)
        n *= s->shape[d];
    return n;
}

/* A safetensors image of the n tensors (in order) with an optional __metadata__ object. */
static uint8_t *image(const spec *s, size_t n, const char *meta, size_t *size)
{
    char hdr[8192];
    size_t at = 0;
    uint64_t off = 0;
    at += (size_t)snprintf(hdr + at, sizeof(hdr) - at, "{");
    if (meta != NULL)
        at += (size_t)snprintf(hdr + at, sizeof(hdr) - at, "\"__metadata__\":%s,", meta);
    for (size_t i = 0; i < n; i++) {
        uint64_t nb = nbytes(&s[i]);
        char shape[64] = "";
        if (s[i].bytes != NULL)
            snprintf(shape, sizeof(shape), "%llu", (unsigned long long)nb);
        else if (s[i].ndim == 1)
            snprintf(shape, sizeof(shape), "%llu", (unsigned long long)s[i].shape[0]);
        else if (s[i].ndim == 2)
            snprintf(shape, sizeof(shape), "%llu,%llu", (unsigned long long)s[i].shape[0],
                     (unsigned long long)s[i].shape[1]);
        at += (size_t)snprintf(hdr + at, sizeof(hdr) - at,
                               "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%llu,"
                               "%llu]}",
                               i ? "," : "", s[i].name, s[i].dtype, shape, (unsigned long long)off,
                               (unsigned long long)(off + nb));
        off += nb;
    }
    at += (size_t)snprintf(hdr + at, sizeof(hdr) - at, "}");
    *size = 8 + at + off;
    uint8_t *img = malloc(*size);
    if (img == NULL)
        abort();
    for (int i = 0; i < 8; i++)
        img[i] = (uint8_t)((uint64_t)at >> (8 * i));
    memcpy(img + 8, hdr, at);
    uint8_t *d = img + 8 + at;
    for (size_t i = 0; i < n; i++) {
        uint64_t nb = nbytes(&s[i]);
        if (s[i].bytes != NULL)
            memcpy(d, s[i].bytes, nb);
        else
            memset(d, (int)(i + 1), nb);
        d += nb;
    }
    return img;
}

static ddo_checkpoint *open_ok(const spec *s, size_t n, const char *meta, uint8_t **img)
{
    size_t size;
    *img = image(s, n, meta, &size);
    ddo_checkpoint *ck = NULL;
    int rc = ddo__checkpoint_parse_buffer(*img, size, "q.safetensors", &ck);
    T_CHECK_MSG(rc == 0, "open: %s", ddo_last_error());
    return ck;
}

static void refused(const spec *s, size_t n, const char *meta, const char *want)
{
    size_t size;
    uint8_t *img = image(s, n, meta, &size);
    ddo_checkpoint *ck = NULL;
    T_EQ_INT(ddo__checkpoint_parse_buffer(img, size, "q.safetensors", &ck), DDO_E_FORMAT);
    T_CHECK(ck == NULL);
    T_CONTAINS(ddo_last_error(), "q.safetensors: ");
    T_CONTAINS(ddo_last_error(), want);
    T_CHECK(strchr(ddo_last_error(), '\n') == NULL);
    free(img);
}

static size_t idx(const ddo_checkpoint *ck, const char *name)
{
    size_t i = SIZE_MAX;
    return ddo_checkpoint_find(ck, name, &i) == 0 ? i : SIZE_MAX;
}

#define FP8_JSON   "{\"format\": \"float8_e4m3fn\"}"
#define NVFP4_JSON "{\"format\": \"nvfp4\"}"

/* blocks.0.q: float8_e4m3fn; blocks.0.k: nvfp4 (U8 [64, 32] = 64 x 64 values, 16 per scale);
 * blocks.0.norm stays plain. */
static const spec newer[] = {
    { "blocks.0.q.weight", "F8_E4M3", 2, { 64, 64 }, NULL },
    { "blocks.0.q.weight_scale", "F32", 0, { 0 }, NULL },
    { "blocks.0.q.input_scale", "F32", 1, { 1 }, NULL },
    { "blocks.0.q.comfy_quant", "U8", 1, { 0 }, FP8_JSON },
    { "blocks.0.k.weight", "U8", 2, { 64, 32 }, NULL },
    { "blocks.0.k.weight_scale", "F8_E4M3", 2, { 128, 4 }, NULL },
    { "blocks.0.k.weight_scale_2", "F32", 0, { 0 }, NULL },
    { "blocks.0.k.comfy_quant", "U8", 1, { 0 }, NVFP4_JSON },
    { "blocks.0.norm.weight", "BF16", 1, { 64 }, NULL },
};

static void test_comfy_quant_tensors(void)
{
    uint8_t *img;
    ddo_checkpoint *ck = open_ok(newer, DDO_ARRAY_LEN(newer), NULL, &img);
    T_REQUIRE(ck != NULL);
    T_EQ_U64(ddo_checkpoint_quant_layer_count(ck), 2);
    const ddo_quant_layer *q = ddo_checkpoint_quant_layer(ck, 0), *k;
    k = ddo_checkpoint_quant_layer(ck, 1);
    if (strcmp(q->layer, "blocks.0.k") == 0) { /* weight order */
        const ddo_quant_layer *x = q;
        q = k;
        k = x;
    }
    T_EQ_STR(q->layer, "blocks.0.q");
    T_EQ_STR(q->format, "float8_e4m3fn");
    T_EQ_STR(q->source, "comfy_quant");
    T_EQ_U64(q->weight, idx(ck, "blocks.0.q.weight"));
    T_EQ_U64(q->weight_scale, idx(ck, "blocks.0.q.weight_scale"));
    T_EQ_U64(q->input_scale, idx(ck, "blocks.0.q.input_scale"));
    T_EQ_U64(q->weight_scale_2, SIZE_MAX);
    T_EQ_U64(q->marker, idx(ck, "blocks.0.q.comfy_quant"));
    T_EQ_STR(k->format, "nvfp4");
    T_EQ_U64(k->weight_scale_2, idx(ck, "blocks.0.k.weight_scale_2"));
    /* stored dtypes and bytes unchanged */
    const ddo_tensor_info *w = ddo_checkpoint_tensor(ck, q->weight);
    T_EQ_INT(w->dtype, DDO_DTYPE_F8_E4M3);
    T_EQ_U64(w->nbytes, 64 * 64);
    T_EQ_INT(ddo_checkpoint_tensor(ck, k->weight)->dtype, DDO_DTYPE_U8);
    uint8_t b[4];
    T_EQ_INT(ddo_checkpoint_read(ck, q->weight, 100, b, 4), 0);
    T_CHECK(b[0] == 1 && b[3] == 1);
    char *json = NULL;
    T_EQ_INT(ddo_checkpoint_to_json(ck, &json), 0);
    T_CONTAINS(json, "\"quantization\":[{\"layer\":\"blocks.0.q\",\"format\":\"float8_e4m3fn\","
                     "\"source\":\"comfy_quant\"}");
    ddo_free(json);
    /* a plan without a small-tensor threshold: each layer's tensors in one unit (leaf units) */
    ddo_config *cfg = NULL;
    T_REQUIRE(ddo_config_create(&cfg) == 0);
    T_REQUIRE(ddo_config_set(cfg, "small_tensor_threshold_bytes", "0") == 0);
    T_REQUIRE(ddo_config_set(cfg, "unit_granularity", "leaf") == 0);
    ddo_plan *plan = NULL;
    int rc = ddo_plan_build(ck, cfg, NULL, &plan);
    T_CHECK_MSG(rc == 0, "plan: %s", ddo_last_error());
    if (rc == 0) {
        const size_t lq[] = { q->weight, q->weight_scale, q->input_scale, q->marker };
        for (size_t i = 1; i < DDO_ARRAY_LEN(lq); i++)
            T_EQ_U64(ddo__plan_tensor_unit(plan, lq[i]), ddo__plan_tensor_unit(plan, lq[0]));
        const size_t lk[] = { k->weight, k->weight_scale, k->weight_scale_2, k->marker };
        for (size_t i = 1; i < DDO_ARRAY_LEN(lk); i++)
            T_EQ_U64(ddo__plan_tensor_unit(plan, lk[i]), ddo__plan_tensor_unit(plan, lk[0]));
        T_CHECK(ddo__plan_tensor_unit(plan, q->weight) != ddo__plan_tensor_unit(plan, k->weight));
        ddo_plan_destroy(plan);
    }
    ddo_config_destroy(cfg);
    ddo_checkpoint_destroy(ck);
    free(img);
}

static void test_metadata_entry(void)
{
    /* the newer layout without comfy_quant tensors: the header entry names the formats */
    const spec s[] = {
        { "m.a.weight", "F8_E5M2", 2, { 4, 8 }, NULL },
        { "m.a.weight_scale", "F32", 1, { 1 }, NULL },
        { "m.b.weight", "I8", 2, { 4, 8 }, NULL },
        { "m.b.weight_scale", "F32", 0, { 0 }, NULL },
    };
    const char *meta = "{\"_quantization_metadata\":\"{\\\"format_version\\\": \\\"1.0\\\", "
                       "\\\"layers\\\": {\\\"m.a\\\": {\\\"format\\\": \\\"float8_e5m2\\\"}, "
                       "\\\"m.b\\\": {\\\"format\\\": \\\"int8_tensorwise\\\"}}}\"}";
    uint8_t *img;
    ddo_checkpoint *ck = open_ok(s, DDO_ARRAY_LEN(s), meta, &img);
    T_REQUIRE(ck != NULL);
    T_EQ_U64(ddo_checkpoint_quant_layer_count(ck), 2);
    const ddo_quant_layer *a = ddo_checkpoint_quant_layer(ck, 0);
    T_EQ_STR(a->layer, "m.a");
    T_EQ_STR(a->format, "float8_e5m2");
    T_EQ_STR(a->source, "_quantization_metadata");
    T_EQ_U64(a->marker, SIZE_MAX);
    T_EQ_STR(ddo_checkpoint_quant_layer(ck, 1)->format, "int8_tensorwise");
    ddo_checkpoint_destroy(ck);
    free(img);
    refused(s, DDO_ARRAY_LEN(s), "{\"_quantization_metadata\":\"{not json\"}",
            "__metadata__ _quantization_metadata is not JSON");
    refused(s, DDO_ARRAY_LEN(s), "{\"_quantization_metadata\":\"{}\"}", "has no \"layers\" object");
    refused(s, DDO_ARRAY_LEN(s),
            "{\"_quantization_metadata\":\"{\\\"layers\\\": {\\\"m.a\\\": {\\\"format\\\": "
            "\\\"fp7\\\"}}}\"}",
            "layer \"m.a\": unknown quantization format \"fp7\"");
    refused(s, DDO_ARRAY_LEN(s),
            "{\"_quantization_metadata\":\"{\\\"layers\\\": {\\\"m.z\\\": {\\\"format\\\": "
            "\\\"float8_e5m2\\\"}}}\"}",
            "layer \"m.z\" (float8_e5m2): no tensor \"m.z.weight\"");
    /* both sources: they must agree */
    const spec both[] = {
        { "m.a.weight", "F8_E5M2", 2, { 4, 8 }, NULL },
        { "m.a.weight_scale", "F32", 1, { 1 }, NULL },
        { "m.a.comfy_quant", "U8", 1, { 0 }, "{\"format\": \"float8_e4m3fn\"}" },
    };
    refused(both, DDO_ARRAY_LEN(both),
            "{\"_quantization_metadata\":\"{\\\"layers\\\": {\\\"m.a\\\": {\\\"format\\\": "
            "\\\"float8_e5m2\\\"}}}\"}",
            "_quantization_metadata says \"float8_e5m2\" but its comfy_quant tensor says");
}

static void test_bad_layers(void)
{
    spec s[DDO_ARRAY_LEN(newer)];
    memcpy(s, newer, sizeof(s));
    s[3].bytes = "{format: fp8}";
    refused(s, DDO_ARRAY_LEN(s), NULL, "tensor \"blocks.0.q.comfy_quant\" is not JSON");
    s[3].bytes = "{\"format\": \"float9\"}";
    refused(s, DDO_ARRAY_LEN(s), NULL,
            "layer \"blocks.0.q\": unknown quantization format "
            "\"float9\"");
    s[3].bytes = "[1, 2]";
    refused(s, DDO_ARRAY_LEN(s), NULL, "JSON without a \"format\" string");
    memcpy(s, newer, sizeof(s));
    s[3].dtype = "I8";
    refused(s, DDO_ARRAY_LEN(s), NULL, "not a 1-D U8 tensor of JSON");
    /* weight_scale missing: the layer without its scale tensor */
    memcpy(s, newer, sizeof(s));
    s[1] = newer[8];
    refused(s, DDO_ARRAY_LEN(s) - 1, NULL,
            "layer \"blocks.0.q\" (float8_e4m3fn): scale tensor \"blocks.0.q.weight_scale\" is "
            "missing");
    /* weight_scale of the wrong shape (two values for a per-tensor format) */
    memcpy(s, newer, sizeof(s));
    s[1].ndim = 1;
    s[1].shape[0] = 2;
    refused(s, DDO_ARRAY_LEN(s), NULL,
            "scale tensor \"blocks.0.q.weight_scale\" has shape [2], not one value");
    /* input_scale of the wrong shape */
    memcpy(s, newer, sizeof(s));
    s[2].shape[0] = 3;
    refused(s, DDO_ARRAY_LEN(s), NULL, "\"blocks.0.q.input_scale\" has shape [3], not one value");
    /* nvfp4: too few block scales; weight_scale_2 missing */
    memcpy(s, newer, sizeof(s));
    s[5].shape[0] = 16;
    refused(s, DDO_ARRAY_LEN(s), NULL,
            "scale tensor \"blocks.0.k.weight_scale\" has shape [16, 4], fewer than the 256 "
            "values (one per 16 of a row) weight [64, 32] needs");
    memcpy(s, newer, sizeof(s));
    s[6] = newer[8];
    refused(s, DDO_ARRAY_LEN(s) - 1, NULL, "scale tensor \"blocks.0.k.weight_scale_2\" is missing");
    /* a weight of the wrong stored dtype */
    memcpy(s, newer, sizeof(s));
    s[0].dtype = "BF16";
    refused(s, DDO_ARRAY_LEN(s), NULL, "weight is BF16, not F8_E4M3 or U8");
}

static void test_scaled_fp8(void)
{
    const spec s[] = {
        { "scaled_fp8", "F8_E4M3", 1, { 2 }, NULL },
        { "blocks.0.q.weight", "F8_E4M3", 2, { 8, 16 }, NULL },
        { "blocks.0.q.scale_weight", "F32", 1, { 1 }, NULL },
        { "blocks.0.q.scale_input", "F32", 0, { 0 }, NULL },
        { "blocks.0.k.weight", "F8_E4M3", 2, { 8, 16 }, NULL },
        { "blocks.0.k.scale_weight", "F32", 1, { 8 }, NULL }, /* one per output row */
        { "blocks.0.k.bias", "BF16", 1, { 8 }, NULL },
        { "norm.weight", "BF16", 1, { 16 }, NULL },
    };
    uint8_t *img;
    ddo_checkpoint *ck = open_ok(s, DDO_ARRAY_LEN(s), NULL, &img);
    T_REQUIRE(ck != NULL);
    T_EQ_U64(ddo_checkpoint_quant_layer_count(ck), 2);
    for (size_t i = 0; i < 2; i++) {
        const ddo_quant_layer *q = ddo_checkpoint_quant_layer(ck, i);
        T_EQ_STR(q->format, "scaled_fp8");
        T_EQ_STR(q->source, "scaled_fp8");
        T_EQ_U64(q->marker, idx(ck, "scaled_fp8"));
        T_CHECK(q->weight_scale != SIZE_MAX);
    }
    T_EQ_U64(ddo_checkpoint_quant_layer(ck, 0)->input_scale, idx(ck, "blocks.0.q.scale_input"));
    ddo_checkpoint_destroy(ck);
    free(img);
    spec b[DDO_ARRAY_LEN(s)];
    memcpy(b, s, sizeof(b));
    b[5].shape[0] = 3;
    refused(b, DDO_ARRAY_LEN(b), NULL,
            "layer \"blocks.0.k\" (scaled_fp8): scale tensor \"blocks.0.k.scale_weight\" has "
            "shape [3], not one value or one per output row");
    memcpy(b, s, sizeof(b));
    b[2] = s[7];
    refused(b, DDO_ARRAY_LEN(b) - 1, NULL, "scale tensor \"blocks.0.q.scale_weight\" is missing");
    memcpy(b, s, sizeof(b));
    b[5].name = "blocks.0.k.weight_scale"; /* the newer spelling is taken too */
    ck = open_ok(b, DDO_ARRAY_LEN(b), NULL, &img);
    T_REQUIRE(ck != NULL);
    T_EQ_U64(ddo_checkpoint_quant_layer(ck, 1)->weight_scale, idx(ck, "blocks.0.k.weight_scale"));
    ddo_checkpoint_destroy(ck);
    free(img);
    memcpy(b, s, sizeof(b));
    b[0].dtype = "U8";
    refused(b, DDO_ARRAY_LEN(b), NULL,
            "marker tensor \"scaled_fp8\" is U8, not F8_E4M3 or F8_E5M2");
    /* without the marker, F8 weights are plain tensors */
    size_t size;
    uint8_t *plain = image(s + 1, DDO_ARRAY_LEN(s) - 1, NULL, &size);
    T_EQ_INT(ddo__checkpoint_parse_buffer(plain, size, "p.safetensors", &ck), 0);
    T_EQ_U64(ddo_checkpoint_quant_layer_count(ck), 0);
    T_CHECK(ddo_checkpoint_quant_layer(ck, 0) == NULL);
    ddo_checkpoint_destroy(ck);
    free(plain);
}

int main(void)
{
    T_RUN(test_comfy_quant_tensors);
    T_RUN(test_metadata_entry);
    T_RUN(test_bad_layers);
    T_RUN(test_scaled_fp8);
    return t_done();
}
