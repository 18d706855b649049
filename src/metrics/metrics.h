/*
 * metrics.h - the running metric accumulator a session updates, and the
 * snapshot built from it. The catalog is metrics.def.
 */
#ifndef DDO_METRICS_H
#define DDO_METRICS_H

#include "base/common.h"

#include "os/thread.h"

typedef enum ddo__metric_id {
#define DDO_METRIC(name, kind, unit, help) DDO_M_##name,
#include "metrics/metrics.def"
#undef DDO_METRIC
    DDO_M_COUNT
} ddo__metric_id;

typedef enum ddo__metric_kind {
    DDO__METRIC_COUNTER,
    DDO__METRIC_GAUGE,
    DDO__METRIC_PEAK,
    DDO__METRIC_CAPACITY
} ddo__metric_kind;

/* Thread-safe accumulator (the session's threads update it). */
typedef struct ddo__metrics_acc {
    ddo__mutex lock;
    double v[DDO_M_COUNT];
} ddo__metrics_acc;

void ddo__metrics_init(ddo__metrics_acc *m);
void ddo__metrics_fini(ddo__metrics_acc *m);
void ddo__metrics_add(ddo__metrics_acc *m, ddo__metric_id id, double delta);
void ddo__metrics_set(ddo__metrics_acc *m, ddo__metric_id id, double value); /* GAUGE/CAPACITY */
void ddo__metrics_max(ddo__metrics_acc *m, ddo__metric_id id, double value); /* PEAK */
double ddo__metrics_value(ddo__metrics_acc *m, ddo__metric_id id);

const char *ddo__metric_name(ddo__metric_id id);
ddo__metric_kind ddo__metric_kind_of(ddo__metric_id id);
const char *ddo__metric_unit(ddo__metric_id id);

/*
 * Builds the public snapshot: copies the values, adds derived figures
 * (achieved bandwidth, mean prefetch depth, hit rate), the plan's decision
 * labels, route and planned capacities as the caller hands them down (the
 * metrics never read a plan; plan may be NULL: the accumulator's planned_*
 * values are kept and the route is "none"), and the session's
 * descriptive strings: labels[2*i] is a key and labels[2*i+1] its value,
 * label_count is the number of pairs (labels may be NULL when it is 0).
 * Everything is copied. Errors: DDO_E_INVALID_ARGUMENT, DDO_E_NO_MEMORY.
 */
typedef struct ddo__metrics_plan_facts {
    const char *route;               /* NULL: "none" */
    const ddo_plan_budgets *budgets; /* NULL: the accumulator's planned_* values are kept */
    const char *const *decisions;    /* decisions[2*i] a key, decisions[2*i+1] its value */
    size_t decision_count;           /* pairs */
} ddo__metrics_plan_facts;
int ddo__metrics_snapshot(ddo__metrics_acc *m, const ddo__metrics_plan_facts *plan,
                          const char *const *labels, size_t label_count, ddo_metrics **out);

/*
 * The metric catalog as Markdown: exactly the text of docs/metrics.md
 * (tests/test_metrics.c fails when the committed file differs). Free with
 * free(). Errors: DDO_E_NO_MEMORY.
 */
int ddo__metrics_catalog_markdown(char **out);

#endif /* DDO_METRICS_H */
