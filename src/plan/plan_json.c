/*
 * plan_json.c - the plan as JSON (schema in docs/plan.md) and back: a plan
 * printed by ddo_plan_to_json can be saved, checked and rebuilt with
 * ddo_plan_from_json, which prints the identical text again.
 */
#include "plan/plan.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_SCHEMA         "ddo.plan"
#define PLAN_SCHEMA_VERSION 1
#define JSON_FLAGS          (JSON_INDENT(2) | JSON_REAL_PRECISION(10))

static const char *const placement_names[] = { "resident", "streamed", "skipped" };
static const char *const reason_names[] = { "none", "always_resident", "small", "budget",
                                            "skip_pattern" };

static json_t *jint(uint64_t v)
{
    return json_integer(v > (uint64_t)INT64_MAX ? (json_int_t)INT64_MAX : (json_int_t)v);
}

/* json_object_set_new that remembers a failure. */
static void put(json_t *o, const char *key, json_t *v, bool *ok)
{
    if (v == NULL || json_object_set_new(o, key, v) != 0)
        *ok = false;
}

static void append(json_t *a, json_t *v, bool *ok)
{
    if (v == NULL || json_array_append_new(a, v) != 0)
        *ok = false;
}

static json_t *str_array(char *const *items, size_t n, bool *ok)
{
    json_t *a = json_array();
    if (a == NULL) {
        *ok = false;
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        append(a, json_string(items[i]), ok);
    return a;
}

static json_t *decision_value(const ddo__decision *d)
{
    if (!d->is_number)
        return json_string(d->value);
    if (strcmp(d->value, "true") == 0)
        return json_true();
    if (strcmp(d->value, "false") == 0)
        return json_false();
    return json_real(strtod(d->value, NULL));
}

/* The "inputs" object: the facts the planner was given. */
static json_t *inputs_json(const ddo_plan_inputs *in, bool *ok)
{
    json_t *ji = json_object();
    if (ji != NULL) {
        put(ji, "device_total_bytes", jint(in->device_total_bytes), ok);
        put(ji, "device_free_bytes", jint(in->device_free_bytes), ok);
        put(ji, "device_granularity", jint(in->device_granularity), ok);
        put(ji, "device_is_cpu", json_boolean(in->device_is_cpu), ok);
        put(ji, "device_vmm_supported", json_boolean(in->device_vmm_supported), ok);
        put(ji, "host_available_bytes", jint(in->host_available_bytes), ok);
        put(ji, "bus_bytes_per_s", json_real(in->bus_bytes_per_s), ok);
        put(ji, "flops_per_s", json_real(in->flops_per_s), ok);
        put(ji, "tokens", jint(in->tokens), ok);
        put(ji, "codec_ratio", json_real(in->codec_ratio), ok);
        put(ji, "decode_bytes_per_s", json_real(in->decode_bytes_per_s), ok);
        put(ji, "file_read_bytes_per_s", json_real(in->file_read_bytes_per_s), ok);
    }
    return ji;
}

/* The "cost_model" object. */
static json_t *cost_json(const ddo_plan *p, bool *ok)
{
    json_t *jc = json_object();
    if (jc != NULL) {
        put(jc, "enabled", json_boolean(p->cost_enabled), ok);
        put(jc, "tokens", jint(p->tokens), ok);
        put(jc, "reason", json_string(p->cost_reason ? p->cost_reason : ""), ok);
    }
    return jc;
}

/* The "budgets" object: device weights, retained, registered and staging. */
static json_t *budgets_json(const ddo_plan *p, bool *ok)
{
    const ddo_plan_budgets *bg = &p->budgets;
    json_t *jb = json_object();
    if (jb != NULL) {
        json_t *dw = json_object(), *rt = json_object(), *rg = json_object(), *st = json_object();
        put(jb, "device_weights", dw, ok);
        put(jb, "retained_host", rt, ok);
        put(jb, "registered_host", rg, ok);
        put(jb, "staging", st, ok);
        put(jb, "predicted_step_s", json_real(bg->predicted_step_s), ok);
        if (dw != NULL) {
            put(dw, "peak", jint(bg->device_weights_peak), ok);
            put(dw, "limit", jint(bg->device_weights_limit), ok);
            put(dw, "limit_source",
                json_string(p->device_limit_source ? p->device_limit_source : "none"), ok);
            put(dw, "resident_bytes", jint(bg->resident_bytes), ok);
            put(dw, "slot_bytes", jint(bg->slot_bytes), ok);
            put(dw, "slot_count", jint(bg->slot_count), ok);
        }
        if (rt != NULL) {
            put(rt, "peak", jint(bg->retained_peak), ok);
            put(rt, "limit", jint(bg->retained_limit), ok);
        }
        if (rg != NULL) {
            put(rg, "peak", jint(bg->registered_peak), ok);
            put(rg, "limit", jint(bg->registered_limit), ok);
        }
        if (st != NULL) {
            put(st, "peak", jint(bg->staging_peak), ok);
            put(st, "window_bytes", jint(bg->staging_window_bytes), ok);
            put(st, "windows", jint(bg->staging_windows), ok);
        }
    }
    return jb;
}

/* The "units" array, each unit with its tensor indices. */
static json_t *units_json(const ddo_plan *p, bool *ok)
{
    json_t *ju = json_array();
    for (size_t u = 0; ju != NULL && u < p->unit_count; u++) {
        const ddo__plan_unit *un = &p->units[u];
        json_t *o = json_object();
        append(ju, o, ok);
        if (o == NULL)
            continue;
        put(o, "index", jint(u), ok);
        put(o, "name", json_string(un->name), ok);
        put(o, "bytes", jint(un->bytes), ok);
        put(o, "span_bytes", jint(un->span_bytes), ok);
        put(o, "full_bytes", jint(un->full_bytes), ok);
        put(o, "flops_per_token", jint(un->flops_per_token), ok);
        put(o, "resident", json_boolean(un->resident), ok);
        put(o, "retained", json_boolean(un->retained), ok);
        put(o, "registered", json_boolean(un->registered), ok);
        put(o, "transfer_s", json_real(un->transfer_s), ok);
        put(o, "compute_s", json_real(un->compute_s), ok);
        put(o, "hidden", json_boolean(un->hidden), ok);
        put(o, "coded_bytes", jint(un->coded_bytes), ok);
        put(o, "decoded_bytes", jint(un->decoded_bytes), ok);
        put(o, "reread_s", json_real(un->reread_s), ok);
        put(o, "reread_stall_s", json_real(un->reread_stall_s), ok);
        json_t *tl = json_array();
        put(o, "tensors", tl, ok);
        for (size_t k = 0; tl != NULL && k < un->tensor_count; k++)
            append(tl, jint(p->unit_tensors[un->first_tensor + k]), ok);
    }
    return ju;
}

/* The "tensors" array: each tensor's placement. */
static json_t *tensors_json(const ddo_plan *p, bool *ok)
{
    json_t *jt = json_array();
    for (size_t i = 0; jt != NULL && i < p->tensor_count; i++) {
        const ddo__plan_tensor *t = &p->tensors[i];
        json_t *o = json_object();
        append(jt, o, ok);
        if (o == NULL)
            continue;
        put(o, "name", json_string(t->name), ok);
        put(o, "placement", json_string(placement_names[t->loc.placement]), ok);
        put(o, "reason", json_string(reason_names[t->loc.reason]), ok);
        put(o, "unit", t->loc.unit == SIZE_MAX ? json_null() : jint(t->loc.unit), ok);
        put(o, "offset", jint(t->loc.offset), ok);
        put(o, "nbytes", jint(t->loc.nbytes), ok);
        put(o, "eligible", json_boolean(t->eligible), ok);
    }
    return jt;
}

static json_t *plan_json(const ddo_plan *p, bool *ok)
{
    json_t *root = json_object();
    if (root == NULL) {
        *ok = false;
        return NULL;
    }
    put(root, "schema", json_string(PLAN_SCHEMA), ok);
    put(root, "schema_version", json_integer(PLAN_SCHEMA_VERSION), ok);
    put(root, "route", json_string(p->route_label ? p->route_label : ""), ok);
    put(root, "unit_granularity", json_string(p->unit_granularity ? p->unit_granularity : ""), ok);
    put(root, "tensor_count", jint(p->tensor_count), ok);
    put(root, "unit_count", jint(p->unit_count), ok);
    put(root, "total_bytes", jint(p->total_bytes), ok);

    put(root, "inputs", inputs_json(&p->inputs, ok), ok);
    put(root, "cost_model", cost_json(p, ok), ok);
    put(root, "budgets", budgets_json(p, ok), ok);

    json_t *bp = json_object();
    put(root, "bytes_by_placement", bp, ok);
    for (size_t i = 0; bp != NULL && i < DDO_ARRAY_LEN(placement_names); i++)
        put(bp, placement_names[i], jint(p->bytes_by_placement[i]), ok);
    json_t *br = json_object();
    put(root, "bytes_by_reason", br, ok);
    for (size_t i = 1; br != NULL && i < DDO_ARRAY_LEN(reason_names); i++)
        put(br, reason_names[i], jint(p->bytes_by_reason[i]), ok);

    put(root, "resolved_resident_module_patterns",
        str_array(p->resident_patterns, p->resident_pattern_count, ok), ok);
    put(root, "selected_resident_modules",
        str_array(p->selected_resident, p->selected_resident_count, ok), ok);

    json_t *jd = json_object();
    put(root, "planner_decisions", jd, ok);
    for (size_t i = 0; jd != NULL && i < p->decisions.count; i++)
        put(jd, p->decisions.items[i].key, decision_value(&p->decisions.items[i]), ok);

    put(root, "units", units_json(p, ok), ok);
    put(root, "tensors", tensors_json(p, ok), ok);
    if (ddo__plan_devset_json(p, root) != 0)
        *ok = false;
    return root;
}

int ddo_plan_to_json(const ddo_plan *p, char **json)
{
    if (p == NULL || json == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_plan_to_json: plan and json");
    bool ok = true;
    json_t *root = plan_json(p, &ok);
    char *text = ok && root != NULL ? json_dumps(root, JSON_FLAGS) : NULL;
    json_decref(root);
    if (text == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_plan_to_json: %zu tensors", p->tensor_count);
    /* Hand back memory the caller frees with ddo_free (free), whatever jansson allocates with. */
    char *copy = ddo__strdup(text);
    free(text);
    if (copy == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_plan_to_json: %zu tensors", p->tensor_count);
    *json = copy;
    return 0;
}

/* ---- reading a plan back ---- */

typedef struct reader {
    const char *err; /* the field at fault */
} reader;

static json_t *field(reader *r, json_t *o, const char *key)
{
    json_t *v = json_is_object(o) ? json_object_get(o, key) : NULL;
    if (v == NULL && r->err == NULL)
        r->err = key;
    return v;
}

static uint64_t get_u64(reader *r, json_t *o, const char *key)
{
    json_t *v = field(r, o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        if (r->err == NULL)
            r->err = key;
        return 0;
    }
    return (uint64_t)json_integer_value(v);
}

static double get_real(reader *r, json_t *o, const char *key)
{
    json_t *v = field(r, o, key);
    if (!json_is_number(v)) {
        if (r->err == NULL)
            r->err = key;
        return 0.0;
    }
    return json_number_value(v);
}

/* Fields added after schema version 1 was first written: 0 when absent, else checked. */
static double opt_real(reader *r, json_t *o, const char *key)
{
    return json_is_object(o) && json_object_get(o, key) != NULL ? get_real(r, o, key) : 0.0;
}

static uint64_t opt_u64(reader *r, json_t *o, const char *key)
{
    return json_is_object(o) && json_object_get(o, key) != NULL ? get_u64(r, o, key) : 0;
}

static bool get_bool(reader *r, json_t *o, const char *key)
{
    json_t *v = field(r, o, key);
    if (!json_is_boolean(v)) {
        if (r->err == NULL)
            r->err = key;
        return false;
    }
    return json_is_true(v);
}

static char *get_str(reader *r, json_t *o, const char *key)
{
    json_t *v = field(r, o, key);
    if (!json_is_string(v)) {
        if (r->err == NULL)
            r->err = key;
        return NULL;
    }
    char *s = ddo__strdup(json_string_value(v));
    if (s == NULL && r->err == NULL)
        r->err = "(out of memory)";
    return s;
}

static int name_index(const char *const *names, size_t n, const char *s)
{
    for (size_t i = 0; s != NULL && i < n; i++)
        if (strcmp(names[i], s) == 0)
            return (int)i;
    return -1;
}

static char **get_str_list(reader *r, json_t *o, const char *key, size_t *count)
{
    json_t *a = field(r, o, key);
    *count = 0;
    if (!json_is_array(a)) {
        if (r->err == NULL)
            r->err = key;
        return NULL;
    }
    size_t n = json_array_size(a);
    char **items = ddo__calloc(n ? n : 1, sizeof(char *));
    if (items == NULL) {
        r->err = "(out of memory)";
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        items[i] = json_is_string(v) ? ddo__strdup(json_string_value(v)) : NULL;
        if (items[i] == NULL) {
            if (r->err == NULL)
                r->err = key;
            break;
        }
        *count = i + 1;
    }
    return items;
}

/* The "inputs" object ji into in. */
static void read_inputs(reader *r, json_t *ji, ddo_plan_inputs *in)
{
    in->device_total_bytes = get_u64(r, ji, "device_total_bytes");
    in->device_free_bytes = get_u64(r, ji, "device_free_bytes");
    in->device_granularity = (size_t)get_u64(r, ji, "device_granularity");
    in->device_is_cpu = get_bool(r, ji, "device_is_cpu");
    in->device_vmm_supported = get_bool(r, ji, "device_vmm_supported");
    in->host_available_bytes = get_u64(r, ji, "host_available_bytes");
    in->bus_bytes_per_s = get_real(r, ji, "bus_bytes_per_s");
    in->flops_per_s = get_real(r, ji, "flops_per_s");
    in->tokens = get_u64(r, ji, "tokens");
    /* Added with the codec estimates: absent in older plans (0). */
    in->codec_ratio = opt_real(r, ji, "codec_ratio");
    in->decode_bytes_per_s = opt_real(r, ji, "decode_bytes_per_s");
    /* Added with the re-read cost: absent in older plans (0). */
    in->file_read_bytes_per_s = opt_real(r, ji, "file_read_bytes_per_s");
}

/* The "cost_model" object jc into p. */
static void read_cost(reader *r, json_t *jc, ddo_plan *p)
{
    p->cost_enabled = get_bool(r, jc, "enabled");
    p->tokens = get_u64(r, jc, "tokens");
    p->cost_reason = get_str(r, jc, "reason");
}

/* The "budgets" object jb into p. */
static void read_budgets(reader *r, json_t *jb, ddo_plan *p)
{
    ddo_plan_budgets *bg = &p->budgets;
    json_t *dw = field(r, jb, "device_weights"), *rt = field(r, jb, "retained_host"),
           *rg = field(r, jb, "registered_host"), *st = field(r, jb, "staging");
    bg->predicted_step_s = get_real(r, jb, "predicted_step_s");
    bg->device_weights_peak = get_u64(r, dw, "peak");
    bg->device_weights_limit = get_u64(r, dw, "limit");
    p->device_limit_source = get_str(r, dw, "limit_source");
    bg->resident_bytes = get_u64(r, dw, "resident_bytes");
    bg->slot_bytes = get_u64(r, dw, "slot_bytes");
    bg->slot_count = (size_t)get_u64(r, dw, "slot_count");
    bg->retained_peak = get_u64(r, rt, "peak");
    bg->retained_limit = get_u64(r, rt, "limit");
    bg->registered_peak = get_u64(r, rg, "peak");
    bg->registered_limit = get_u64(r, rg, "limit");
    bg->staging_peak = get_u64(r, st, "peak");
    bg->staging_window_bytes = get_u64(r, st, "window_bytes");
    bg->staging_windows = (size_t)get_u64(r, st, "windows");
}

/* The "planner_decisions" object into p; false when reading must stop. */
static bool read_decisions(reader *r, json_t *root, ddo_plan *p)
{
    json_t *jd = field(r, root, "planner_decisions");
    if (!json_is_object(jd)) {
        if (r->err == NULL)
            r->err = "planner_decisions";
        return false;
    }
    const char *key;
    json_t *v;
    json_object_foreach(jd, key, v)
    {
        if (json_is_string(v))
            ddo__decisions_set_str(&p->decisions, key, json_string_value(v));
        else if (json_is_boolean(v))
            ddo__decisions_set_bool(&p->decisions, key, json_is_true(v));
        else if (json_is_number(v))
            ddo__decisions_set_num(&p->decisions, key, json_number_value(v));
        else if (r->err == NULL)
            r->err = "planner_decisions";
    }
    if (p->decisions.failed && r->err == NULL)
        r->err = "(out of memory)";
    return true;
}

/* The "tensors" array jt (of a plan with un units) into p->tensors. */
static void read_tensors(reader *r, json_t *jt, size_t un, ddo_plan *p)
{
    size_t n = json_array_size(jt);
    for (size_t i = 0; i < n && r->err == NULL; i++) {
        json_t *o = json_array_get(jt, i);
        ddo__plan_tensor *t = &p->tensors[i];
        p->tensor_count = i + 1;
        t->name = get_str(r, o, "name");
        json_t *pl = field(r, o, "placement"), *rs = field(r, o, "reason");
        int pi = name_index(placement_names, DDO_ARRAY_LEN(placement_names), json_string_value(pl));
        int ri = name_index(reason_names, DDO_ARRAY_LEN(reason_names), json_string_value(rs));
        if (pi < 0 || ri < 0) {
            if (r->err == NULL)
                r->err = pi < 0 ? "placement" : "reason";
            return;
        }
        t->loc.placement = (ddo_placement)pi;
        t->loc.reason = (ddo_reason)ri;
        json_t *ju1 = field(r, o, "unit");
        if (json_is_null(ju1))
            t->loc.unit = SIZE_MAX;
        else {
            uint64_t uu = get_u64(r, o, "unit");
            if (uu >= un || t->loc.placement != DDO_PLACEMENT_STREAMED) {
                if (r->err == NULL)
                    r->err = "unit";
                return;
            }
            t->loc.unit = (size_t)uu;
        }
        t->loc.offset = get_u64(r, o, "offset");
        t->loc.nbytes = get_u64(r, o, "nbytes");
        t->eligible = get_bool(r, o, "eligible");
    }
}

/* The "units" array ju (of a plan with n tensors) into p->units and p->unit_tensors. */
static void read_units(reader *r, json_t *ju, size_t n, ddo_plan *p)
{
    size_t un = json_array_size(ju);
    size_t at = 0;
    for (size_t u = 0; u < un && r->err == NULL; u++) {
        json_t *o = json_array_get(ju, u);
        ddo__plan_unit *x = &p->units[u];
        p->unit_count = u + 1;
        if (get_u64(r, o, "index") != u) {
            if (r->err == NULL)
                r->err = "index";
            return;
        }
        x->name = get_str(r, o, "name");
        x->bytes = get_u64(r, o, "bytes");
        x->span_bytes = get_u64(r, o, "span_bytes");
        x->full_bytes = get_u64(r, o, "full_bytes");
        x->flops_per_token = get_u64(r, o, "flops_per_token");
        x->resident = get_bool(r, o, "resident");
        x->retained = get_bool(r, o, "retained");
        x->registered = get_bool(r, o, "registered");
        x->transfer_s = get_real(r, o, "transfer_s");
        x->compute_s = get_real(r, o, "compute_s");
        x->hidden = get_bool(r, o, "hidden");
        x->coded_bytes = opt_u64(r, o, "coded_bytes");
        x->decoded_bytes = opt_u64(r, o, "decoded_bytes");
        x->reread_s = opt_real(r, o, "reread_s");
        x->reread_stall_s = opt_real(r, o, "reread_stall_s");
        json_t *tl = field(r, o, "tensors");
        if (!json_is_array(tl) || json_array_size(tl) > n - at) {
            if (r->err == NULL)
                r->err = "units.tensors";
            return;
        }
        x->first_tensor = at;
        x->tensor_count = json_array_size(tl);
        for (size_t k = 0; k < x->tensor_count; k++) {
            json_t *e = json_array_get(tl, k);
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                (uint64_t)json_integer_value(e) >= n) {
                r->err = "units.tensors";
                return;
            }
            p->unit_tensors[at++] = (size_t)json_integer_value(e);
        }
    }
}

/* The tensor and unit tables of root into p. */
static void read_tables(reader *r, json_t *root, ddo_plan *p)
{
    json_t *jt = field(r, root, "tensors");
    json_t *ju = field(r, root, "units");
    if (!json_is_array(jt) || !json_is_array(ju)) {
        if (r->err == NULL)
            r->err = "tensors";
        return;
    }
    size_t n = json_array_size(jt), un = json_array_size(ju);
    if (get_u64(r, root, "tensor_count") != n || get_u64(r, root, "unit_count") != un) {
        if (r->err == NULL)
            r->err = "tensor_count";
        return;
    }
    p->tensors = ddo__calloc(n ? n : 1, sizeof(*p->tensors));
    p->units = ddo__calloc(un ? un : 1, sizeof(*p->units));
    p->unit_tensors = ddo__calloc(n ? n : 1, sizeof(*p->unit_tensors));
    if (p->tensors == NULL || p->units == NULL || p->unit_tensors == NULL) {
        r->err = "(out of memory)";
        return;
    }
    read_tensors(r, jt, un, p);
    read_units(r, ju, n, p);
}

/* The facts a session acts on (ddo_plan_info), from the words the planner wrote for them: the
 * JSON keeps them only in its fields and decisions, and reading a saved plan is the one place
 * they are read back. */
static void read_facts(ddo_plan *p)
{
    const char *hr = ddo__decisions_get(&p->decisions, "host_residents");
    const char *wc = ddo__decisions_get(&p->decisions, "weight_codec");
    const char *rs = ddo__decisions_get(&p->decisions, "retained_selection");
    p->granularity = p->unit_granularity != NULL && strcmp(p->unit_granularity, "leaf") == 0
                         ? DDO_UNIT_LEAF
                         : DDO_UNIT_BLOCK;
    p->host_residents = hr == NULL                               ? DDO_HOST_RESIDENTS_NONE
                        : strcmp(hr, "registered_in_place") == 0 ? DDO_HOST_RESIDENTS_REGISTERED
                                                                 : DDO_HOST_RESIDENTS_BOUNCE_BUFFER;
    p->weight_codec =
        wc != NULL && strcmp(wc, "ddoc1") == 0 ? DDO_WEIGHT_CODEC_DDOC1 : DDO_WEIGHT_CODEC_NONE;
    p->retained_by_stall = rs != NULL && strcmp(rs, "stall") == 0;
    const char *sc = ddo__decisions_get(&p->decisions, "codec_sidecar");
    p->codec_sidecar = sc == NULL || strcmp(sc, "off") != 0;
    const char *ar = ddo__decisions_get(&p->decisions, "device_activation_reserve_gb");
    const char *as = ddo__decisions_get(&p->decisions, "device_activation_reserve_source");
    p->activation_reserve = ar != NULL ? (uint64_t)(strtod(ar, NULL) * (double)DDO_GIB) : 0;
    p->activation_reserve_estimated = as != NULL && strncmp(as, "estimated", 9) == 0;
}

static void read_plan(reader *r, json_t *root, ddo_plan *p)
{
    json_t *schema = field(r, root, "schema");
    if (!json_is_string(schema) || strcmp(json_string_value(schema), PLAN_SCHEMA) != 0 ||
        get_u64(r, root, "schema_version") != PLAN_SCHEMA_VERSION) {
        if (r->err == NULL)
            r->err = "schema";
        return;
    }
    p->route_label = get_str(r, root, "route");
    p->unit_granularity = get_str(r, root, "unit_granularity");
    p->total_bytes = get_u64(r, root, "total_bytes");

    read_inputs(r, field(r, root, "inputs"), &p->inputs);
    read_cost(r, field(r, root, "cost_model"), p);
    read_budgets(r, field(r, root, "budgets"), p);

    json_t *bp = field(r, root, "bytes_by_placement");
    for (size_t i = 0; i < DDO_ARRAY_LEN(placement_names); i++)
        p->bytes_by_placement[i] = get_u64(r, bp, placement_names[i]);
    json_t *br = field(r, root, "bytes_by_reason");
    for (size_t i = 1; i < DDO_ARRAY_LEN(reason_names); i++)
        p->bytes_by_reason[i] = get_u64(r, br, reason_names[i]);

    p->resident_patterns =
        get_str_list(r, root, "resolved_resident_module_patterns", &p->resident_pattern_count);
    p->selected_resident =
        get_str_list(r, root, "selected_resident_modules", &p->selected_resident_count);

    if (!read_decisions(r, root, p))
        return;
    read_facts(p);
    read_tables(r, root, p);
    const char *bad = ddo__plan_devset_read(p, root);
    if (bad != NULL && r->err == NULL)
        r->err = bad;
}

int ddo_plan_from_json(const char *json, ddo_plan **out)
{
    if (json == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "ddo_plan_from_json: json and out");
    json_error_t jerr;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return ddo__fail(NULL, DDO_E_FORMAT, "plan JSON: line %d: %s", jerr.line, jerr.text);
    ddo_plan *p = ddo__plan_alloc();
    if (p == NULL) {
        json_decref(root);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_plan_from_json");
    }
    reader r = { NULL };
    read_plan(&r, root, p);
    json_decref(root);
    if (r.err == NULL && ddo__plan_restore(p) != 0)
        r.err = "(out of memory)";
    if (r.err != NULL) {
        ddo_plan_destroy(p);
        if (strcmp(r.err, "(out of memory)") == 0)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "ddo_plan_from_json");
        return ddo__fail(NULL, DDO_E_FORMAT, "plan JSON: field \"%s\" is missing or invalid",
                         r.err);
    }
    *out = p;
    return 0;
}
