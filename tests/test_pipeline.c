/*
 * test_pipeline.c - ddo_pipeline: a Diffusers directory's model_index.json. Components in file
 * order with their library, class, path and whether their folder holds weights; attributes
 * skipped; a component name that is not a plain folder name (".", "..", separators, NUL,
 * empty) refused with the rule; the size, nesting and count limits; files that are missing or
 * not JSON objects.
 *
 * ctest-labels: unit
 */
#include "ddo.h"
#include "ddo_host.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static char g_dir[256];

static const char *at(const char *name)
{
    static char buf[4][512];
    static unsigned k;
    char *b = buf[k++ % 4];
    snprintf(b, 512, "%s/%s", g_dir, name);
    return b;
}

static int put(const char *name, const char *text)
{
    FILE *f = fopen(at(name), "wb");
    if (f == NULL)
        return -1;
    size_t n = fwrite(text, 1, strlen(text), f);
    return (fclose(f) == 0 && n == strlen(text)) ? 0 : -1;
}

static int open_with(const char *model_index, ddo_pipeline **p)
{
    if (put("model_index.json", model_index) != 0)
        return -1000;
    *p = (ddo_pipeline *)p; /* must be reset to NULL on failure */
    return ddo_pipeline_create(g_dir, p);
}

static void test_components(void)
{
    T_REQUIRE(mkdir(at("transformer"), 0700) == 0);
    T_REQUIRE(mkdir(at("text_encoder"), 0700) == 0);
    T_REQUIRE(mkdir(at("vae"), 0700) == 0);
    T_REQUIRE(mkdir(at("scheduler"), 0700) == 0);
    T_REQUIRE(put("transformer/diffusion_pytorch_model.safetensors.index.json", "{}") == 0);
    T_REQUIRE(put("text_encoder/model.safetensors", "") == 0);
    T_REQUIRE(put("scheduler/scheduler_config.json", "{}") == 0);
    ddo_pipeline *p = NULL;
    int rc =
        open_with("{\"_class_name\": \"FluxPipeline\", \"_diffusers_version\": \"0.30.0\",\n"
                  " \"scheduler\": [\"diffusers\", \"FlowMatchEulerDiscreteScheduler\"],\n"
                  " \"force_zeros_for_empty_prompt\": true,\n"
                  " \"transformer\": [\"diffusers\", \"FluxTransformer2DModel\"],\n"
                  " \"image_encoder\": [null, null],\n"
                  " \"text_encoder\": [\"transformers\", \"CLIPTextModel\"],\n"
                  " \"_ignored\": [\"a\", \"b\"], \"vae\": [\"diffusers\", \"AutoencoderKL\"]}",
                  &p);
    T_REQUIRE(rc == 0);
    T_EQ_STR(ddo_pipeline_class_name(p), "FluxPipeline");
    T_EQ_U64(ddo_pipeline_component_count(p), 5);
    static const struct {
        const char *name, *library, *class_name;
        bool weights;
    } want[] = {
        { "scheduler", "diffusers", "FlowMatchEulerDiscreteScheduler", false },
        { "transformer", "diffusers", "FluxTransformer2DModel", true },
        { "image_encoder", NULL, NULL, false },
        { "text_encoder", "transformers", "CLIPTextModel", true },
        { "vae", "diffusers", "AutoencoderKL", false },
    };
    for (size_t i = 0; i < ARRAY_LEN(want) && i < ddo_pipeline_component_count(p); i++) {
        ddo_pipeline_component_info c;
        T_REQUIRE(ddo_pipeline_component(p, i, &c) == 0);
        T_EQ_STR(c.name, want[i].name);
        if (want[i].library == NULL)
            T_CHECK(c.library == NULL && c.class_name == NULL);
        else {
            T_EQ_STR(c.library, want[i].library);
            T_EQ_STR(c.class_name, want[i].class_name);
        }
        T_EQ_STR(c.path, at(want[i].name));
        T_CHECK_MSG(c.has_weights == want[i].weights, "%s", c.name);
    }
    ddo_pipeline_component_info c;
    T_EQ_INT(ddo_pipeline_component(p, 5, &c), DDO_E_INVALID_ARGUMENT);
    T_CONTAINS(ddo_last_error(), "component 5 out of range (the pipeline has 5)");
    ddo_pipeline_destroy(p);
    ddo_pipeline_destroy(NULL);
    T_EQ_U64(ddo_pipeline_component_count(NULL), 0);
}

static void test_plain_names(void)
{
    static const struct {
        const char *index;
        const char *message_end;
    } cases[] = {
        { "{\"..\": [\"diffusers\", \"X\"]}",
          "component \"..\" is \".\" or \"..\"; a component is a plain folder name in the "
          "pipeline's directory" },
        { "{\".\": [\"diffusers\", \"X\"]}", "component \".\" is \".\" or \"..\"" },
        { "{\"../vae\": [\"diffusers\", \"X\"]}",
          "component \"../vae\" contains a path separator" },
        { "{\"/etc\": [\"diffusers\", \"X\"]}", "component \"/etc\" contains a path separator" },
        { "{\"a\\\\b\": [\"diffusers\", \"X\"]}",
          "component \"a\\\\b\" contains a path separator" },
        { "{\"vae\\u0000x\": [\"diffusers\", \"X\"]}", "NUL byte in object key not supported" },
        { "{\"\": [\"diffusers\", \"X\"]}", "component \"\" is empty" },
        { "{\"a\\nb\": [\"diffusers\", \"X\"], \"..\": 1}", NULL }, /* accepted: "..": 1 */
    };
    for (size_t k = 0; k < ARRAY_LEN(cases); k++) {
        ddo_pipeline *p = NULL;
        int rc = open_with(cases[k].index, &p);
        if (cases[k].message_end == NULL) {
            T_CHECK_MSG(rc == 0, "%s: %s", cases[k].index, ddo_last_error());
            ddo_pipeline_destroy(p);
            continue;
        }
        T_CHECK_MSG(rc == DDO_E_FORMAT, "%s: %s", cases[k].index, ddo_errname(rc));
        T_CHECK(p == NULL);
        T_CONTAINS(ddo_last_error(), "/model_index.json: ");
        T_CONTAINS(ddo_last_error(), cases[k].message_end);
    }
}

static void test_limits_and_errors(void)
{
    ddo_pipeline *p = NULL;
    T_EQ_INT(open_with("[1, 2]", &p), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "model_index.json is not a JSON object");
    T_EQ_INT(open_with("{\"a\": [\"x\", \"y\"], \"a\": [\"x\", \"y\"]}", &p), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "duplicate key \"a\" in the model_index.json");
    T_EQ_INT(open_with("{\"a\": ", &p), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "model_index.json is not valid JSON");
    /* nesting: 127 levels as the official safetensors reader (and serde_json) allow */
    char deep[512];
    size_t o = (size_t)sprintf(deep, "{\"x\":");
    for (int i = 0; i < 127; i++)
        deep[o++] = '[';
    for (int i = 0; i < 127; i++)
        deep[o++] = ']';
    strcpy(deep + o, "}");
    T_EQ_INT(open_with(deep, &p), DDO_E_FORMAT);
    T_CONTAINS(ddo_last_error(), "more than 127 deep");
    /* 256 components are accepted, 257 refused */
    char *big = malloc(300 * 40);
    T_REQUIRE(big != NULL);
    for (int n = 256; n <= 257; n++) {
        o = 0;
        big[o++] = '{';
        for (int i = 0; i < n; i++)
            o += (size_t)sprintf(big + o, "%s\"c%d\": [\"diffusers\", \"X\"]", i ? "," : "", i);
        strcpy(big + o, "}");
        int rc = open_with(big, &p);
        if (n == 256) {
            T_EQ_INT(rc, 0);
            T_EQ_U64(ddo_pipeline_component_count(p), 256);
            ddo_pipeline_destroy(p);
        } else {
            T_EQ_INT(rc, DDO_E_FORMAT);
            T_CONTAINS(ddo_last_error(), "more than 256 components");
        }
    }
    free(big);
    T_REQUIRE(unlink(at("model_index.json")) == 0);
    p = (ddo_pipeline *)&p;
    T_EQ_INT(ddo_pipeline_create(g_dir, &p), DDO_E_NOT_FOUND);
    T_CHECK(p == NULL);
    T_EQ_INT(ddo_pipeline_create(NULL, &p), DDO_E_INVALID_ARGUMENT);
    T_EQ_INT(ddo_pipeline_create("", &p), DDO_E_INVALID_ARGUMENT);
}

int main(void)
{
    snprintf(g_dir, sizeof(g_dir), "/var/tmp/ddo_pipeline_XXXXXX");
    if (mkdtemp(g_dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    T_RUN(test_components);
    T_RUN(test_plain_names);
    T_RUN(test_limits_and_errors);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return t_done();
}
