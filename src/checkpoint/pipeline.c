/*
 * pipeline.c - a Diffusers pipeline directory: its model_index.json read through the
 * checkpoint reader's guards (regular files only, bounded size and nesting), and the
 * components it names, each a plain folder name inside the directory.
 */
#include "base/common.h"
#include "checkpoint/checkpoint.h"
#include "os/file.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Limits (docs/inspect.md, "Limits"). */
#define MAX_MODEL_INDEX_BYTES    ((uint64_t)1 << 20)
#define MAX_COMPONENTS           256
#define MAX_COMPONENT_NAME_BYTES 255

#define Q ddo__checkpoint_quote

struct ddo_pipeline {
    char *class_name;
    ddo_pipeline_component_info *comps; /* strings owned */
    size_t count;
};

void ddo_pipeline_destroy(ddo_pipeline *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->count; i++) {
        free((char *)(uintptr_t)p->comps[i].name);
        free((char *)(uintptr_t)p->comps[i].library);
        free((char *)(uintptr_t)p->comps[i].class_name);
        free((char *)(uintptr_t)p->comps[i].path);
    }
    free(p->comps);
    free(p->class_name);
    free(p);
}

/* Whether value is [string-or-null, string-or-null]: a component rather than an attribute. */
static bool is_component(const json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) != 2)
        return false;
    for (size_t i = 0; i < 2; i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_string(x) && !json_is_null(x))
            return false;
    }
    return true;
}

/* NULL when the rule holds, else what breaks it. */
static const char *plain_name_rule(const char *name, size_t len)
{
    if (len == 0)
        return "is empty";
    if (strlen(name) != len)
        return "contains a NUL byte";
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return "is \".\" or \"..\"";
    if (strchr(name, '/') != NULL || strchr(name, '\\') != NULL)
        return "contains a path separator";
    if (len > MAX_COMPONENT_NAME_BYTES)
        return "is longer than 255 bytes";
    return NULL;
}

/* A string of a [library, class] pair (copied), or NULL for null; *oom on failure. */
static char *dup_or_null(const json_t *v, bool *oom)
{
    if (!json_is_string(v))
        return NULL;
    char *s = ddo__strdup(json_string_value(v));
    *oom = *oom || s == NULL;
    return s;
}

static int add_component(ddo_pipeline *p, const char *dir, const char *label, const char *key,
                         const json_t *v)
{
    static const char *const weights[] = { ".safetensors", ".safetensors.index.json" };
    if (p->count >= MAX_COMPONENTS)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: more than %d components (ddo's limit; see docs/inspect.md)", label,
                         MAX_COMPONENTS);
    ddo_pipeline_component_info *c = &p->comps[p->count];
    memset(c, 0, sizeof(*c));
    bool oom = false;
    c->name = ddo__strdup(key);
    c->library = dup_or_null(json_array_get(v, 0), &oom);
    c->class_name = dup_or_null(json_array_get(v, 1), &oom);
    const char *sep = dir[0] != '\0' && dir[strlen(dir) - 1] == '/' ? "" : "/";
    c->path = ddo__asprintf("%s%s%s", dir, sep, key);
    p->count++; /* owned from here: destroy frees what was copied */
    if (oom || c->name == NULL || c->path == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", label);
    c->has_weights = ddo__os_dir_has_suffix(c->path, weights, DDO_ARRAY_LEN(weights));
    return 0;
}

static int read_components(ddo_pipeline *p, const char *dir, const char *label, json_t *root)
{
    if (!json_is_object(root))
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: model_index.json is not a JSON object", label);
    const json_t *cls = json_object_get(root, "_class_name");
    if (json_is_string(cls) && (p->class_name = ddo__strdup(json_string_value(cls))) == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", label);
    size_t n = json_object_size(root);
    p->comps = ddo__calloc(n > 0 ? n : 1, sizeof(*p->comps));
    if (p->comps == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", label);
    for (void *it = json_object_iter(root); it != NULL; it = json_object_iter_next(root, it)) {
        const char *key = json_object_iter_key(it);
        size_t klen = json_object_iter_key_len(it);
        const json_t *v = json_object_iter_value(it);
        if ((klen > 0 && key[0] == '_') || !is_component(v))
            continue; /* an attribute ("_class_name", "requires_safety_checker") */
        const char *broken = plain_name_rule(key, klen);
        if (broken != NULL)
            return ddo__fail(NULL, DDO_E_FORMAT,
                             "%s: component \"%s\" %s; a component is a plain folder name in "
                             "the pipeline's directory",
                             label, Q(key), broken);
        int rc = add_component(p, dir, label, key, v);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int ddo_pipeline_create(const char *dir, ddo_pipeline **out)
{
    if (dir == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_pipeline_create: NULL argument");
    *out = NULL;
    if (dir[0] == '\0')
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_pipeline_create: empty path");
    const char *sep = dir[strlen(dir) - 1] == '/' ? "" : "/";
    char *path = ddo__asprintf("%s%smodel_index.json", dir, sep);
    char *label = path == NULL ? NULL : ddo__strdup(Q(path));
    ddo_pipeline *p = ddo__calloc(1, sizeof(*p));
    int rc;
    if (path == NULL || label == NULL || p == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "%s: out of memory", Q(dir));
        goto out;
    }
    json_t *root = NULL;
    rc = ddo__checkpoint_read_json_file(path, label, "model_index.json", MAX_MODEL_INDEX_BYTES,
                                        &root);
    if (rc == 0) {
        rc = read_components(p, dir, label, root);
        json_decref(root);
    }
out:
    free(path);
    free(label);
    if (rc != 0) {
        ddo_pipeline_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

const char *ddo_pipeline_class_name(const ddo_pipeline *p)
{
    return p == NULL ? NULL : p->class_name;
}

size_t ddo_pipeline_component_count(const ddo_pipeline *p)
{
    return p == NULL ? 0 : p->count;
}

int ddo_pipeline_component(const ddo_pipeline *p, size_t i, ddo_pipeline_component_info *info)
{
    if (p == NULL || info == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_pipeline_component: NULL argument");
    if (i >= p->count)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "ddo_pipeline_component: component %zu out of range (the pipeline has "
                         "%zu)",
                         i, p->count);
    *info = p->comps[i];
    return 0;
}
