/*
 * metrics.c - the metric accumulator a session updates, the versioned
 * snapshot built from it (ddo_metrics), its JSON and profile text, and the
 * generated catalog page (docs/metrics.md). The catalog is metrics.def.
 */
#include "metrics/metrics.h"

#include "base/budget.h"
#include "base/common.h"
#include "os/fs.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the catalog ---- */

typedef struct metric_row {
    const char *name;
    ddo__metric_kind kind;
    const char *unit;
    const char *help;
} metric_row;

static const metric_row rows[DDO_M_COUNT] = {
#define DDO_METRIC(name, kind, unit, help) { #name, DDO__METRIC_##kind, unit, help },
#include "metrics/metrics.def"
#undef DDO_METRIC
};

/* The catalog in file order with its section markers (group rows have id == DDO_M_COUNT). */
typedef struct catalog_entry {
    ddo__metric_id id;
    const char *group_key;
    const char *group_title;
} catalog_entry;

static const catalog_entry catalog[] = {
#define DDO_METRIC_GROUP(key, title)       { DDO_M_COUNT, #key, title },
#define DDO_METRIC(name, kind, unit, help) { DDO_M_##name, NULL, NULL },
#include "metrics/metrics.def"
#undef DDO_METRIC
#undef DDO_METRIC_GROUP
};

/* Figures computed from the values when the snapshot is taken. */
typedef enum derived_id {
    DERIVED_ACHIEVED_BYTES_PER_S,
    DERIVED_MEAN_PREFETCH_DEPTH,
    DERIVED_HIT_RATE,
    DERIVED_DECODE_BYTES_PER_S,
    DERIVED_COUNT
} derived_id;

static const metric_row derived_rows[DERIVED_COUNT] = {
    { "achieved_bytes_per_s", DDO__METRIC_GAUGE, "bytes_per_s",
      "copy_bytes / copy_busy_ns (0 when nothing was copied)" },
    { "mean_prefetch_depth", DDO__METRIC_GAUGE, "count", "prefetch_depth_sum / acquires" },
    { "hit_rate", DDO__METRIC_GAUGE, "ratio", "hits / acquires (0 when nothing was acquired)" },
    { "decode_bytes_per_s", DDO__METRIC_GAUGE, "bytes_per_s",
      "codec_decode_timed_bytes / codec_decode_ns: the device decoder's throughput (0 when "
      "nothing was decoded)" },
};

#define CAPACITY_NOTE "capacity (does not prove physical placement)"

const char *ddo__metric_name(ddo__metric_id id)
{
    return (unsigned)id < DDO_M_COUNT ? rows[id].name : NULL;
}

ddo__metric_kind ddo__metric_kind_of(ddo__metric_id id)
{
    return (unsigned)id < DDO_M_COUNT ? rows[id].kind : DDO__METRIC_COUNTER;
}

const char *ddo__metric_unit(ddo__metric_id id)
{
    return (unsigned)id < DDO_M_COUNT ? rows[id].unit : NULL;
}

static const char *kind_text(ddo__metric_kind kind)
{
    switch (kind) {
    case DDO__METRIC_COUNTER:
        return "counter";
    case DDO__METRIC_GAUGE:
        return "gauge";
    case DDO__METRIC_PEAK:
        return "peak";
    case DDO__METRIC_CAPACITY:
        return CAPACITY_NOTE;
    }
    return "counter";
}

/* ---- the accumulator ---- */

void ddo__metrics_init(ddo__metrics_acc *m)
{
    ddo__mutex_init(&m->lock);
    for (size_t i = 0; i < DDO_M_COUNT; i++)
        m->v[i] = 0.0;
}

void ddo__metrics_fini(ddo__metrics_acc *m)
{
    ddo__mutex_destroy(&m->lock);
}

void ddo__metrics_add(ddo__metrics_acc *m, ddo__metric_id id, double delta)
{
    if (m == NULL || (unsigned)id >= DDO_M_COUNT)
        return;
    ddo__mutex_lock(&m->lock);
    m->v[id] += delta;
    ddo__mutex_unlock(&m->lock);
}

void ddo__metrics_set(ddo__metrics_acc *m, ddo__metric_id id, double value)
{
    if (m == NULL || (unsigned)id >= DDO_M_COUNT)
        return;
    ddo__mutex_lock(&m->lock);
    m->v[id] = value;
    ddo__mutex_unlock(&m->lock);
}

void ddo__metrics_max(ddo__metrics_acc *m, ddo__metric_id id, double value)
{
    if (m == NULL || (unsigned)id >= DDO_M_COUNT)
        return;
    ddo__mutex_lock(&m->lock);
    if (value > m->v[id])
        m->v[id] = value;
    ddo__mutex_unlock(&m->lock);
}

double ddo__metrics_value(ddo__metrics_acc *m, ddo__metric_id id)
{
    if (m == NULL || (unsigned)id >= DDO_M_COUNT)
        return 0.0;
    ddo__mutex_lock(&m->lock);
    double v = m->v[id];
    ddo__mutex_unlock(&m->lock);
    return v;
}

/* ---- the snapshot ---- */

typedef struct kv_list {
    size_t count;
    char **keys;
    char **values;
} kv_list;

struct ddo_metrics {
    double v[DDO_M_COUNT];
    double derived[DERIVED_COUNT];
    char *route;
    kv_list decisions;
    kv_list labels;
};

static void kv_free(kv_list *l)
{
    for (size_t i = 0; i < l->count; i++) {
        free(l->keys[i]);
        free(l->values[i]);
    }
    free(l->keys);
    free(l->values);
    l->count = 0;
    l->keys = l->values = NULL;
}

/* Appends a copy of key=value (NULL texts become ""). false on allocation failure. */
static bool kv_push(kv_list *l, const char *key, const char *value)
{
    char **k = ddo__reallocarray(l->keys, l->count + 1, sizeof(*k));
    if (k == NULL)
        return false;
    l->keys = k;
    char **v = ddo__reallocarray(l->values, l->count + 1, sizeof(*v));
    if (v == NULL)
        return false;
    l->values = v;
    char *kc = ddo__strdup(key ? key : "");
    char *vc = ddo__strdup(value ? value : "");
    if (kc == NULL || vc == NULL) {
        free(kc);
        free(vc);
        return false;
    }
    l->keys[l->count] = kc;
    l->values[l->count] = vc;
    l->count++;
    return true;
}

static double ratio(double num, double den)
{
    return den > 0.0 ? num / den : 0.0;
}

static void compute_derived(ddo_metrics *s)
{
    s->derived[DERIVED_ACHIEVED_BYTES_PER_S] =
        ratio(s->v[DDO_M_copy_bytes], s->v[DDO_M_copy_busy_ns] / 1e9);
    s->derived[DERIVED_MEAN_PREFETCH_DEPTH] =
        ratio(s->v[DDO_M_prefetch_depth_sum], s->v[DDO_M_acquires]);
    s->derived[DERIVED_HIT_RATE] = ratio(s->v[DDO_M_hits], s->v[DDO_M_acquires]);
    s->derived[DERIVED_DECODE_BYTES_PER_S] =
        ratio(s->v[DDO_M_codec_decode_timed_bytes], s->v[DDO_M_codec_decode_ns] / 1e9);
}

static void fill_from_plan(ddo_metrics *s, const ddo_plan_budgets *b)
{
    s->v[DDO_M_planned_device_weights_bytes] = (double)b->device_weights_peak;
    s->v[DDO_M_planned_resident_bytes] = (double)b->resident_bytes;
    s->v[DDO_M_planned_slot_count] = (double)b->slot_count;
    s->v[DDO_M_planned_slot_bytes] = (double)b->slot_bytes;
    s->v[DDO_M_planned_retained_bytes] = (double)b->retained_peak;
    s->v[DDO_M_planned_registered_bytes] = (double)b->registered_peak;
    s->v[DDO_M_planned_staging_bytes] = (double)b->staging_peak;
}

int ddo__metrics_snapshot(ddo__metrics_acc *m, const ddo__metrics_plan_facts *plan,
                          const char *const *labels, size_t label_count, ddo_metrics **out)
{
    if (m == NULL || out == NULL || (labels == NULL && label_count > 0) ||
        (plan != NULL && plan->decisions == NULL && plan->decision_count > 0))
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "metrics snapshot: invalid argument");
    ddo_metrics *s = ddo__calloc(1, sizeof(*s));
    if (s == NULL)
        goto nomem;
    ddo__mutex_lock(&m->lock);
    memcpy(s->v, m->v, sizeof(s->v));
    ddo__mutex_unlock(&m->lock);
    const char *route = "none";
    if (plan != NULL) {
        if (plan->budgets != NULL)
            fill_from_plan(s, plan->budgets);
        if (plan->route != NULL)
            route = plan->route;
        for (size_t i = 0; i < plan->decision_count; i++)
            if (!kv_push(&s->decisions, plan->decisions[2 * i], plan->decisions[2 * i + 1]))
                goto nomem;
    }
    s->route = ddo__strdup(route);
    if (s->route == NULL)
        goto nomem;
    for (size_t i = 0; i < label_count; i++)
        if (!kv_push(&s->labels, labels[2 * i], labels[2 * i + 1]))
            goto nomem;
    compute_derived(s);
    *out = s;
    return 0;
nomem:
    ddo_metrics_destroy(s);
    return ddo__fail(NULL, DDO_E_NO_MEMORY, "metrics snapshot: out of host memory");
}

void ddo_metrics_destroy(ddo_metrics *m)
{
    if (m == NULL)
        return;
    free(m->route);
    kv_free(&m->decisions);
    kv_free(&m->labels);
    free(m);
}

int ddo_metrics_get(const ddo_metrics *m, const char *name, double *value)
{
    if (m == NULL || name == NULL || value == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "metrics: invalid argument");
    for (size_t i = 0; i < DDO_M_COUNT; i++) {
        if (strcmp(rows[i].name, name) == 0) {
            *value = m->v[i];
            return 0;
        }
    }
    for (size_t i = 0; i < DERIVED_COUNT; i++) {
        if (strcmp(derived_rows[i].name, name) == 0) {
            *value = m->derived[i];
            return 0;
        }
    }
    if (strcmp(name, "schema_version") == 0) {
        *value = DDO_METRICS_SCHEMA_VERSION;
        return 0;
    }
    return ddo__fail(NULL, DDO_E_NOT_FOUND, "metrics: no metric named \"%s\" (see docs/metrics.md)",
                     name);
}

const char *ddo_metrics_label(const ddo_metrics *m, const char *key)
{
    if (m == NULL || key == NULL)
        return NULL;
    for (size_t i = 0; i < m->labels.count; i++)
        if (strcmp(m->labels.keys[i], key) == 0)
            return m->labels.values[i];
    return NULL;
}

/* ---- JSON ---- */

/* Whole numbers as JSON integers, others as reals; non-finite values as null. */
static json_t *number(double v)
{
    if (!isfinite(v))
        return json_null();
    if (v == floor(v) && fabs(v) <= 9007199254740992.0)
        return json_integer((json_int_t)v);
    return json_real(v);
}

static int set_new(json_t *obj, const char *key, json_t *val)
{
    return val == NULL ? -1 : json_object_set_new(obj, key, val);
}

static json_t *build_json(const ddo_metrics *m, const char *component)
{
    json_t *root = json_object();
    if (root == NULL)
        return NULL;
    int bad = 0;
    bad |= set_new(root, "schema_version", json_integer(DDO_METRICS_SCHEMA_VERSION));
    bad |= set_new(root, "component", component ? json_string(component) : json_null());
    bad |= set_new(root, "route", json_string(m->route));
    json_t *notes = json_object();
    bad |= set_new(notes, "capacities", json_string(CAPACITY_NOTE));
    bad |= set_new(root, "notes", notes);
    json_t *group = NULL;
    for (size_t i = 0; i < DDO_ARRAY_LEN(catalog); i++) {
        const catalog_entry *e = &catalog[i];
        if (e->id == DDO_M_COUNT) {
            group = json_object();
            bad |= set_new(root, e->group_key, group);
            continue;
        }
        if (group == NULL) /* metrics.def starts with a group */
            continue;
        bad |= set_new(group, rows[e->id].name, number(m->v[e->id]));
    }
    json_t *derived = json_object();
    for (size_t i = 0; i < DERIVED_COUNT && derived != NULL; i++)
        bad |= set_new(derived, derived_rows[i].name, number(m->derived[i]));
    bad |= set_new(root, "derived", derived);
    json_t *dec = json_object();
    for (size_t i = 0; i < m->decisions.count && dec != NULL; i++)
        bad |= set_new(dec, m->decisions.keys[i], json_string(m->decisions.values[i]));
    bad |= set_new(root, "decisions", dec);
    json_t *lab = json_object();
    for (size_t i = 0; i < m->labels.count && lab != NULL; i++)
        bad |= set_new(lab, m->labels.keys[i], json_string(m->labels.values[i]));
    bad |= set_new(root, "labels", lab);
    if (bad) {
        json_decref(root);
        return NULL;
    }
    return root;
}

static int dump(const ddo_metrics *m, const char *component, size_t flags, char **out)
{
    json_t *root = build_json(m, component);
    char *text = root ? json_dumps(root, flags | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (text == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY,
                         "metrics: building the JSON snapshot failed (out of memory or a "
                         "label that is not UTF-8)");
    /* json_dumps allocates with jansson's allocator (malloc by default); hand over a copy
     * so ddo_free is always right. */
    char *copy = ddo__strdup(text);
    free(text);
    if (copy == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "metrics: out of host memory");
    *out = copy;
    return 0;
}

int ddo_metrics_to_json(const ddo_metrics *m, const char *component, char **json)
{
    if (m == NULL || json == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "metrics to_json: invalid argument");
    return dump(m, component, JSON_INDENT(2), json);
}

int ddo_metrics_record(const ddo_metrics *m, const char *component, const char *path)
{
    if (m == NULL || path == NULL || path[0] == '\0')
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "metrics record: invalid argument");
    char *line = NULL;
    int rc = dump(m, component, JSON_COMPACT, &line);
    if (rc != 0)
        return rc;
    size_t len = strlen(line);
    line[len] = '\n'; /* replaces the terminator: written with an explicit length */
    /* One write of the whole line: O_APPEND keeps lines from concurrent writers whole. */
    bool opened = false;
    int e = ddo__os_append(path, line, len + 1, &opened);
    free(line);
    if (e != 0) {
        char q[512];
        ddo__quote(path, true, q, sizeof(q));
        return ddo__fail(NULL, DDO_E_IO, "%s: %s: %s", q,
                         opened ? "appending metrics" : "opening the metrics file",
                         ddo__os_fs_strerror(e));
    }
    return 0;
}

/* ---- the profile table ---- */

static const char *fmt_bytes(double v, char *buf, size_t len)
{
    return ddo__format_bytes(v > 0.0 ? (uint64_t)v : 0, buf, len);
}

static double secs(double ns)
{
    return ns / 1e9;
}

/* The profile table's codec line (only when something was coded). */
static void format_codec_line(const ddo_metrics *m, ddo__sbuf *s)
{
    const double *v = m->v;
    char a[32], b[32], c[32], d[32];
    if (!(v[DDO_M_setup_coded_bytes] > 0.0 || v[DDO_M_bytes_coded_uploaded] > 0.0))
        return;
    ddo__sbuf_printf(s,
                     "  codec      setup coded %s into %s in %.4f s; %s over the bus "
                     "decoded into %s (%.0f tensors, %.0f launches, %.1f GB/s), waited "
                     "%.4f s\n",
                     fmt_bytes(v[DDO_M_setup_encode_bytes], a, sizeof(a)),
                     fmt_bytes(v[DDO_M_setup_coded_bytes], b, sizeof(b)),
                     secs(v[DDO_M_setup_encode_ns]),
                     fmt_bytes(v[DDO_M_bytes_coded_uploaded], c, sizeof(c)),
                     fmt_bytes(v[DDO_M_bytes_decoded], d, sizeof(d)), v[DDO_M_codec_decodes],
                     v[DDO_M_codec_launches], m->derived[DERIVED_DECODE_BYTES_PER_S] / 1e9,
                     secs(v[DDO_M_codec_wait_ns]));
}

int ddo_metrics_format_profile(const ddo_metrics *m, char **text)
{
    if (m == NULL || text == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "metrics profile: invalid argument");
    const double *v = m->v;
    char a[32], b[32], c[32], d[32];
    ddo__sbuf s;
    ddo__sbuf_init(&s);
    ddo__sbuf_printf(&s, "[ddo-profile] summary: route=%s", m->route);
    for (size_t i = 0; i < m->labels.count; i++)
        ddo__sbuf_printf(&s, " %s=%s", m->labels.keys[i], m->labels.values[i]);
    ddo__sbuf_printf(&s, "\n");
    ddo__sbuf_printf(&s,
                     "  setup      %.4f s: read %.4f s (%s, %.2f GB/s), register %.4f s, "
                     "allocate %.4f s\n",
                     secs(v[DDO_M_setup_ns]), secs(v[DDO_M_setup_read_ns]),
                     fmt_bytes(v[DDO_M_setup_read_bytes], a, sizeof(a)),
                     ratio(v[DDO_M_setup_read_bytes], v[DDO_M_setup_read_ns]),
                     secs(v[DDO_M_setup_register_ns]), secs(v[DDO_M_setup_allocate_ns]));
    ddo__sbuf_printf(&s,
                     "  bytes      registered %s | staged from retained %s | staged from file %s "
                     "(%.0f re-reads) | resident %s\n",
                     fmt_bytes(v[DDO_M_bytes_from_registered], a, sizeof(a)),
                     fmt_bytes(v[DDO_M_bytes_staged_from_retained], b, sizeof(b)),
                     fmt_bytes(v[DDO_M_bytes_staged_from_file], c, sizeof(c)),
                     v[DDO_M_file_rereads],
                     fmt_bytes(v[DDO_M_bytes_resident_uploaded], d, sizeof(d)));
    ddo__sbuf_printf(&s,
                     "  leases     %.0f acquires: %.0f hits (%.1f%%), %.0f misses, %.0f "
                     "prefetched; prefetch depth mean %.2f, max %.0f\n",
                     v[DDO_M_acquires], v[DDO_M_hits], 100.0 * m->derived[DERIVED_HIT_RATE],
                     v[DDO_M_misses], v[DDO_M_prefetch_hits],
                     m->derived[DERIVED_MEAN_PREFETCH_DEPTH], v[DDO_M_prefetch_depth_max]);
    ddo__sbuf_printf(&s, "  copies     %s in %.4f s busy = %.2f GB/s achieved; host stall %.4f s\n",
                     fmt_bytes(v[DDO_M_copy_bytes], a, sizeof(a)), secs(v[DDO_M_copy_busy_ns]),
                     m->derived[DERIVED_ACHIEVED_BYTES_PER_S] / 1e9, secs(v[DDO_M_stall_ns]));
    format_codec_line(m, &s);
    ddo__sbuf_printf(&s, "  peaks      (%s)\n", CAPACITY_NOTE);
    static const struct {
        const char *label;
        ddo__metric_id peak, planned;
    } peaks[] = {
        { "device weights", DDO_M_device_weights_peak_bytes, DDO_M_planned_device_weights_bytes },
        { "retained", DDO_M_retained_peak_bytes, DDO_M_planned_retained_bytes },
        { "registered", DDO_M_registered_peak_bytes, DDO_M_planned_registered_bytes },
        { "staging", DDO_M_staging_peak_bytes, DDO_M_planned_staging_bytes },
    };
    for (size_t i = 0; i < DDO_ARRAY_LEN(peaks); i++)
        ddo__sbuf_printf(&s, "    %-15s %s of %s planned\n", peaks[i].label,
                         fmt_bytes(v[peaks[i].peak], a, sizeof(a)),
                         fmt_bytes(v[peaks[i].planned], b, sizeof(b)));
    if (v[DDO_M_registration_fallback_bytes] > 0.0)
        ddo__sbuf_printf(&s, "    registration fell back to pageable for %s\n",
                         fmt_bytes(v[DDO_M_registration_fallback_bytes], a, sizeof(a)));
    ddo__sbuf_printf(&s,
                     "  reclaim    %.0f events, %s (%.0f by pressure), %.0f failures, %.0f unsafe "
                     "slots\n",
                     v[DDO_M_reclaim_events], fmt_bytes(v[DDO_M_reclaim_bytes], a, sizeof(a)),
                     v[DDO_M_reclaim_pressure_events], v[DDO_M_reclaim_failures],
                     v[DDO_M_unsafe_slots]);
    if (m->decisions.count > 0) {
        ddo__sbuf_printf(&s, "  decisions ");
        for (size_t i = 0; i < m->decisions.count; i++)
            ddo__sbuf_printf(&s, " %s=%s", m->decisions.keys[i], m->decisions.values[i]);
        ddo__sbuf_printf(&s, "\n");
    }
    char *t = ddo__sbuf_take(&s);
    if (t == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "metrics profile: out of host memory");
    *text = t;
    return 0;
}

/* ---- docs/metrics.md ---- */

int ddo__metrics_catalog_markdown(char **out)
{
    if (out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "metrics catalog: invalid argument");
    ddo__sbuf s;
    ddo__sbuf_init(&s);
    ddo__sbuf_printf(
        &s,
        "# Metrics\n"
        "\n"
        "<!-- Generated from src/metrics/metrics.def by ddo__metrics_catalog_markdown(); do not "
        "edit.\n"
        "     Regenerate: DDO_REGENERATE_DOCS=1 ctest -R test_metrics (tests/test_metrics.c\n"
        "     fails while this file differs from the catalog). -->\n"
        "\n"
        "A session reports what was requested and what happened as a versioned snapshot:\n"
        "`ddo_session_metrics(s, collect_completed, &m)`. Read one figure with\n"
        "`ddo_metrics_get(m, \"name\", &value)`, the whole snapshot as JSON with\n"
        "`ddo_metrics_to_json(m, component, &json)` (the `as_dict()` of the compatible Python "
        "API), a short table\n"
        "for people with `ddo_metrics_format_profile` (`ddo run --show-profile`), and append\n"
        "one JSON line to a file with `ddo_metrics_record(m, component, path)` (the compatible "
        "API's\n"
        "`tracker.record_ddo_metrics(report, component=...)`; `ddo run --metrics FILE`).\n"
        "\n"
        "Hosts consume this versioned object, never internal state. A new metric is a new\n"
        "key; a key never changes meaning without a new `schema_version`.\n"
        "\n"
        "## JSON layout (schema_version %d)\n"
        "\n"
        "```\n"
        "{\n"
        "  \"schema_version\": %d,\n"
        "  \"component\": \"transformer\" | null,  the tag given to to_json/record\n"
        "  \"route\": \"vmm_fast_runtime\",        the plan's route (\"none\" without a plan)\n"
        "  \"notes\": {\"capacities\": \"%s\"},\n",
        DDO_METRICS_SCHEMA_VERSION, DDO_METRICS_SCHEMA_VERSION, CAPACITY_NOTE);
    for (size_t i = 0; i < DDO_ARRAY_LEN(catalog); i++)
        if (catalog[i].id == DDO_M_COUNT)
            ddo__sbuf_printf(&s, "  \"%s\": {...},%*s one number per row below\n",
                             catalog[i].group_key, (int)(12 - strlen(catalog[i].group_key)), "");
    ddo__sbuf_printf(&s,
                     "  \"derived\": {...},      computed when the snapshot is taken\n"
                     "  \"decisions\": {...},    the plan's decision labels (strings)\n"
                     "  \"labels\": {...}        the session's descriptive strings\n"
                     "}\n"
                     "```\n"
                     "\n"
                     "Whole numbers are JSON integers; other numbers are reals. Units: `bytes`,\n"
                     "`ns` (nanoseconds), `count`, `bytes_per_s`, `ratio` (0 to 1).\n"
                     "\n"
                     "Kinds: **counter** sums over the session; **gauge** is the value now;\n"
                     "**peak** is the largest value seen; **%s** is what was requested or\n"
                     "planned, or bytes taken through a budget account: it counts what ddo asked\n"
                     "for, not where the operating system or driver physically placed it.\n",
                     CAPACITY_NOTE);
    for (size_t i = 0; i < DDO_ARRAY_LEN(catalog); i++) {
        const catalog_entry *e = &catalog[i];
        if (e->id == DDO_M_COUNT) {
            ddo__sbuf_printf(&s,
                             "\n## %s (`\"%s\"`)\n\n| name | kind | unit | meaning |\n"
                             "| --- | --- | --- | --- |\n",
                             e->group_title, e->group_key);
            continue;
        }
        const metric_row *r = &rows[e->id];
        ddo__sbuf_printf(&s, "| `%s` | %s | %s | %s |\n", r->name, kind_text(r->kind), r->unit,
                         r->help);
    }
    ddo__sbuf_printf(&s, "\n## Derived (`\"derived\"`)\n\n| name | unit | how |\n"
                         "| --- | --- | --- |\n");
    for (size_t i = 0; i < DERIVED_COUNT; i++)
        ddo__sbuf_printf(&s, "| `%s` | %s | %s |\n", derived_rows[i].name, derived_rows[i].unit,
                         derived_rows[i].help);
    char *t = ddo__sbuf_take(&s);
    if (t == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "metrics catalog: out of host memory");
    *out = t;
    return 0;
}
