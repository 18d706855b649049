/*
 * test_metrics.c - the metric catalog, the accumulator, the snapshot's JSON
 * (round trip through jansson), the profile table, record (one JSON line per
 * call) and docs/metrics.md being the generated text.
 * ctest-labels: unit threads
 */
#include "metrics/metrics.h"
#include "os/thread.h"
#include "t.h"

#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static ddo_metrics *sample(void)
{
    ddo__metrics_acc acc;
    ddo__metrics_init(&acc);
    ddo__metrics_set(&acc, DDO_M_planned_slot_count, 3);
    ddo__metrics_set(&acc, DDO_M_planned_device_weights_bytes, 4.0 * 1073741824.0);
    ddo__metrics_max(&acc, DDO_M_device_weights_peak_bytes, 1024);
    ddo__metrics_max(&acc, DDO_M_device_weights_peak_bytes, 512);
    ddo__metrics_add(&acc, DDO_M_copy_bytes, 3e9);
    ddo__metrics_add(&acc, DDO_M_copy_busy_ns, 1e9);
    ddo__metrics_add(&acc, DDO_M_copy_busy_ns, 0.5e9);
    ddo__metrics_add(&acc, DDO_M_acquires, 8);
    ddo__metrics_add(&acc, DDO_M_hits, 2);
    ddo__metrics_add(&acc, DDO_M_prefetch_depth_sum, 12);
    ddo__metrics_add(&acc, DDO_M_bytes_staged_from_file, 1048576);
    const char *labels[] = { "device", "cpu", "checkpoint", "model.safetensors" };
    ddo_metrics *m = NULL;
    int rc = ddo__metrics_snapshot(&acc, NULL, labels, 2, &m);
    ddo__metrics_fini(&acc);
    return rc == 0 ? m : NULL;
}

static void test_catalog(void)
{
    T_EQ_STR(ddo__metric_name(DDO_M_hits), "hits");
    T_EQ_STR(ddo__metric_unit(DDO_M_stall_ns), "ns");
    T_EQ_INT(ddo__metric_kind_of(DDO_M_planned_staging_bytes), DDO__METRIC_CAPACITY);
    T_EQ_INT(ddo__metric_kind_of(DDO_M_retained_peak_bytes), DDO__METRIC_PEAK);
    T_CHECK(ddo__metric_name(DDO_M_COUNT) == NULL);
    for (int i = 0; i < DDO_M_COUNT; i++) {
        const char *u = ddo__metric_unit((ddo__metric_id)i);
        T_CHECK_MSG(strcmp(u, "bytes") == 0 || strcmp(u, "ns") == 0 || strcmp(u, "count") == 0 ||
                        strcmp(u, "bytes_per_s") == 0,
                    "%s has unit %s", ddo__metric_name((ddo__metric_id)i), u);
        for (int k = 0; k < i; k++)
            T_CHECK(strcmp(ddo__metric_name((ddo__metric_id)i),
                           ddo__metric_name((ddo__metric_id)k)) != 0);
    }
}

static void test_get_and_derived(void)
{
    ddo_metrics *m = sample();
    T_REQUIRE(m != NULL);
    double v = -1;
    T_EQ_INT(ddo_metrics_get(m, "planned_slot_count", &v), 0);
    T_NEAR(v, 3, 0);
    T_EQ_INT(ddo_metrics_get(m, "device_weights_peak_bytes", &v), 0);
    T_NEAR(v, 1024, 0);
    T_EQ_INT(ddo_metrics_get(m, "copy_busy_ns", &v), 0);
    T_NEAR(v, 1.5e9, 0);
    T_EQ_INT(ddo_metrics_get(m, "achieved_bytes_per_s", &v), 0);
    T_NEAR(v, 2e9, 1e-3);
    T_EQ_INT(ddo_metrics_get(m, "hit_rate", &v), 0);
    T_NEAR(v, 0.25, 1e-12);
    T_EQ_INT(ddo_metrics_get(m, "mean_prefetch_depth", &v), 0);
    T_NEAR(v, 1.5, 1e-12);
    T_EQ_INT(ddo_metrics_get(m, "schema_version", &v), 0);
    T_NEAR(v, DDO_METRICS_SCHEMA_VERSION, 0);
    v = 42;
    T_EQ_INT(ddo_metrics_get(m, "no_such_metric", &v), DDO_E_NOT_FOUND);
    T_NEAR(v, 42, 0); /* out-param untouched on failure */
    T_EQ_STR(ddo_last_error(), "metrics: no metric named \"no_such_metric\" (see docs/metrics.md)");
    ddo_metrics_destroy(m);
    ddo_metrics_destroy(NULL);

    /* Nothing acquired or copied: derived figures are 0, not NaN. */
    ddo__metrics_acc acc;
    ddo__metrics_init(&acc);
    T_EQ_INT(ddo__metrics_snapshot(&acc, NULL, NULL, 0, &m), 0);
    ddo__metrics_fini(&acc);
    T_EQ_INT(ddo_metrics_get(m, "hit_rate", &v), 0);
    T_NEAR(v, 0, 0);
    T_EQ_INT(ddo_metrics_get(m, "achieved_bytes_per_s", &v), 0);
    T_NEAR(v, 0, 0);
    ddo_metrics_destroy(m);
}

/* Checks one snapshot document; the caller owns root. */
static void check_document(json_t *root, const char *component)
{
    T_EQ_INT(json_integer_value(json_object_get(root, "schema_version")), 1);
    if (component)
        T_EQ_STR(json_string_value(json_object_get(root, "component")), component);
    else
        T_CHECK(json_is_null(json_object_get(root, "component")));
    T_EQ_STR(json_string_value(json_object_get(root, "route")), "none");
    T_EQ_STR(json_string_value(json_object_get(json_object_get(root, "notes"), "capacities")),
             "capacity (does not prove physical placement)");
    json_t *cap = json_object_get(root, "capacities");
    T_CHECK(json_is_integer(json_object_get(cap, "planned_slot_count")));
    T_EQ_INT(json_integer_value(json_object_get(cap, "planned_slot_count")), 3);
    T_EQ_U64(json_integer_value(json_object_get(cap, "planned_device_weights_bytes")), 4ull << 30);
    T_EQ_INT(json_integer_value(
                 json_object_get(json_object_get(root, "bytes"), "bytes_staged_from_file")),
             1048576);
    T_EQ_INT(json_integer_value(json_object_get(json_object_get(root, "leases"), "hits")), 2);
    json_t *derived = json_object_get(root, "derived");
    T_NEAR(json_number_value(json_object_get(derived, "hit_rate")), 0.25, 1e-12);
    T_NEAR(json_number_value(json_object_get(derived, "achieved_bytes_per_s")), 2e9, 1e-3);
    T_EQ_STR(json_string_value(json_object_get(json_object_get(root, "labels"), "device")), "cpu");
    T_EQ_STR(json_string_value(json_object_get(json_object_get(root, "labels"), "checkpoint")),
             "model.safetensors");
    T_CHECK(json_is_object(json_object_get(root, "decisions")));
    /* Every catalog metric appears exactly once, as a number, in one of the groups. */
    static const char *groups[] = { "capacities", "bytes",   "leases", "setup",
                                    "codec",      "reclaim", "devices" };
    size_t numbers = 0;
    for (size_t g = 0; g < DDO_ARRAY_LEN(groups); g++) {
        json_t *obj = json_object_get(root, groups[g]);
        T_CHECK_MSG(json_is_object(obj), "group %s", groups[g]);
        numbers += json_object_size(obj);
    }
    T_EQ_U64(numbers, DDO_M_COUNT);
    for (int i = 0; i < DDO_M_COUNT; i++) {
        int found = 0;
        for (size_t g = 0; g < DDO_ARRAY_LEN(groups); g++) {
            json_t *val = json_object_get(json_object_get(root, groups[g]),
                                          ddo__metric_name((ddo__metric_id)i));
            found += json_is_number(val) ? 1 : 0;
        }
        T_CHECK_MSG(found == 1, "%s appears %d times", ddo__metric_name((ddo__metric_id)i), found);
    }
}

static void test_json_round_trip(void)
{
    ddo_metrics *m = sample();
    T_REQUIRE(m != NULL);
    char *json = NULL;
    T_EQ_INT(ddo_metrics_to_json(m, "transformer", &json), 0);
    T_REQUIRE(json != NULL);
    json_error_t err;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &err);
    T_CHECK_MSG(root != NULL, "%s", err.text);
    if (root)
        check_document(root, "transformer");
    json_decref(root);
    ddo_free(json);
    T_EQ_INT(ddo_metrics_to_json(m, NULL, &json), 0);
    root = json_loads(json, JSON_REJECT_DUPLICATES, &err);
    T_CHECK(root != NULL);
    if (root)
        check_document(root, NULL);
    json_decref(root);
    ddo_free(json);
    T_EQ_INT(ddo_metrics_to_json(NULL, NULL, &json), DDO_E_INVALID_ARGUMENT);
    ddo_metrics_destroy(m);
}

static void test_record_appends_lines(void)
{
    ddo_metrics *m = sample();
    T_REQUIRE(m != NULL);
    char path[512];
    snprintf(path, sizeof(path), "%s/metrics.jsonl", tmpdir);
    T_EQ_INT(ddo_metrics_record(m, "text_encoder", path), 0);
    T_EQ_INT(ddo_metrics_record(m, "transformer", path), 0);
    FILE *f = fopen(path, "r");
    T_REQUIRE(f != NULL);
    char line[65536];
    int lines = 0;
    const char *want[] = { "text_encoder", "transformer" };
    while (fgets(line, sizeof(line), f) != NULL) {
        size_t n = strlen(line);
        T_CHECK(n > 0 && line[n - 1] == '\n');
        T_CHECK(strchr(line, '\n') == line + n - 1); /* one line per record */
        json_error_t err;
        json_t *root = json_loads(line, JSON_REJECT_DUPLICATES, &err);
        T_CHECK_MSG(root != NULL, "%s", err.text);
        if (root && lines < 2)
            check_document(root, want[lines]);
        json_decref(root);
        lines++;
    }
    fclose(f);
    T_EQ_INT(lines, 2);
    unlink(path);

    /* A directory cannot be appended to: DDO_E_IO naming the path. */
    T_EQ_INT(ddo_metrics_record(m, NULL, tmpdir), DDO_E_IO);
    T_CONTAINS(ddo_last_error(), tmpdir);
    T_CONTAINS(ddo_last_error(), "opening the metrics file");
    T_EQ_INT(ddo_metrics_record(m, NULL, ""), DDO_E_INVALID_ARGUMENT);
    ddo_metrics_destroy(m);
}

static void test_profile(void)
{
    ddo_metrics *m = sample();
    T_REQUIRE(m != NULL);
    char *text = NULL;
    T_EQ_INT(ddo_metrics_format_profile(m, &text), 0);
    T_REQUIRE(text != NULL);
    T_CONTAINS(text, "[ddo-profile] summary: route=none device=cpu checkpoint=model.safetensors\n");
    T_CONTAINS(text, "staged from file 1.00 MiB");
    T_CONTAINS(text, "8 acquires: 2 hits (25.0%)");
    T_CONTAINS(text, "2.79 GiB in 1.5000 s busy = 2.00 GB/s achieved");
    T_CONTAINS(text, "peaks      (capacity (does not prove physical placement))");
    T_CONTAINS(text, "device weights  1.00 KiB of 4.00 GiB planned");
    /* short: one screen */
    size_t lines = 0;
    for (const char *p = text; *p; p++)
        lines += *p == '\n';
    T_CHECK(lines <= 14);
    ddo_free(text);
    ddo_metrics_destroy(m);
}

typedef struct adder {
    ddo__metrics_acc *acc;
    int base;
} adder;

static void *add_many(void *arg)
{
    adder *a = arg;
    for (int i = 0; i < 20000; i++) {
        ddo__metrics_add(a->acc, DDO_M_copy_bytes, 2);
        ddo__metrics_max(a->acc, DDO_M_prefetch_depth_max, a->base + i % 7);
    }
    return NULL;
}

static void test_accumulator_threads(void)
{
    ddo__metrics_acc acc;
    ddo__metrics_init(&acc);
    ddo__thread t[4];
    adder a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (adder){ &acc, i * 10 };
        T_REQUIRE(ddo__thread_create(&t[i], add_many, &a[i]) == 0);
    }
    for (int i = 0; i < 4; i++)
        ddo__thread_join(t[i]);
    T_NEAR(ddo__metrics_value(&acc, DDO_M_copy_bytes), 4 * 20000 * 2, 0);
    T_NEAR(ddo__metrics_value(&acc, DDO_M_prefetch_depth_max), 36, 0);
    ddo__metrics_fini(&acc);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf)
        buf[len] = '\0';
    return buf;
}

static void test_docs_up_to_date(void)
{
    char *md = NULL;
    T_REQUIRE(ddo__metrics_catalog_markdown(&md) == 0);
    T_CONTAINS(md, "| `planned_staging_bytes` | capacity (does not prove physical placement) |");
    T_CONTAINS(md, "## Derived (`\"derived\"`)");
    const char *root = getenv("DDO_SOURCE_DIR");
    if (root == NULL) {
        free(md);
        T_SKIP("DDO_SOURCE_DIR not set");
    }
    char path[1024];
    snprintf(path, sizeof(path), "%s/docs/metrics.md", root);
    const char *regen = getenv("DDO_REGENERATE_DOCS");
    if (regen != NULL && strcmp(regen, "1") == 0) {
        FILE *f = fopen(path, "wb");
        T_REQUIRE(f != NULL);
        fputs(md, f);
        fclose(f);
    }
    char *have = read_text(path);
    T_CHECK_MSG(have != NULL && strcmp(have, md) == 0,
                "%s differs from the catalog: run DDO_REGENERATE_DOCS=1 ctest -R test_metrics",
                path);
    free(have);
    free(md);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/ddo-test-metrics-XXXXXX");
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    T_RUN(test_catalog);
    T_RUN(test_get_and_derived);
    T_RUN(test_json_round_trip);
    T_RUN(test_record_appends_lines);
    T_RUN(test_profile);
    T_RUN(test_accumulator_threads);
    T_RUN(test_docs_up_to_date);
    rmdir(tmpdir);
    return t_done();
}
