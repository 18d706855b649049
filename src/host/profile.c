/*
 * profile.c - capacity profiles: named workload records under
 * DDO_PROFILE_DIR (default ~/.ddo/profiles) from which the next run's
 * resident budget and the cost model's measured figures are derived.
 *
 * The file format and the arithmetic follow the upstream Python DDO
 * (schema_version 1, "ddo-capacity-v1-" keys from a SHA-256 of the canonical
 * context JSON, 20 observations kept, capacity limits merged per metric,
 * atomic replacement by temporary file + rename). ddo adds bounds: a profile
 * file is read only when it is a regular file of at most 1 MiB, and a record
 * reads, merges and writes under an flock on "<profile>.lock", so concurrent
 * writers of one profile keep every observation.
 */
#include "base/common.h"
#include "config/config.h"
#include "config/config_store.h"
#include "os/file.h"
#include "os/fs.h"
#include "os/sys.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ddo_profile {
    json_t *doc; /* the whole document */
};

/* Test hook: when set, ddo_profile_record stops after writing the temporary
 * file and before the rename, as a crash would (see tests/test_profile.c). */
bool ddo__profile_crash_before_rename = false;

#define KEY_PREFIX "ddo-capacity-v1-"
/* How long a record waits for another writer of the same profile. */
#define DDO_PROFILE_LOCK_TIMEOUT_MS 10000u

static const size_t canon_flags = JSON_SORT_KEYS | JSON_COMPACT | JSON_ENSURE_ASCII;

/* Parses a JSON object; DDO_E_INVALID_ARGUMENT naming what when it is not one. */
static int parse_object(const char *text, const char *what, json_t **out)
{
    if (text == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: %s is NULL", what);
    json_error_t jerr;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (j == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: %s is not JSON: %s", what,
                         jerr.text);
    if (!json_is_object(j)) {
        json_decref(j);
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: %s must be a JSON object", what);
    }
    *out = j;
    return 0;
}

static int context_canonical(const char *context_json, json_t **ctx, char **canon)
{
    *ctx = NULL;
    *canon = NULL;
    json_t *j;
    int rc = parse_object(context_json, "context", &j);
    if (rc != 0)
        return rc;
    if (json_object_size(j) == 0) {
        json_decref(j);
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: context must not be empty");
    }
    char *c = json_dumps(j, canon_flags);
    if (c == NULL) {
        json_decref(j);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
    }
    *ctx = j;
    *canon = c;
    return 0;
}

int ddo_profile_dir(const char *explicit_dir, const char *env_value, const char *home, char **dir)
{
    char *d;
    if (explicit_dir != NULL && explicit_dir[0] != '\0')
        d = ddo__strdup(explicit_dir);
    else if (env_value != NULL && env_value[0] != '\0')
        d = ddo__strdup(env_value);
    else if (home != NULL && home[0] != '\0')
        d = ddo__asprintf("%s/.ddo/profiles", home);
    else
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT,
                         "profile directory unknown: no explicit directory, DDO_PROFILE_DIR "
                         "or home directory");
    if (d == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
    /* "~/..." in an explicit value or DDO_PROFILE_DIR is expanded like upstream. */
    if (d[0] == '~' && (d[1] == '/' || d[1] == '\0') && home != NULL && home[0] != '\0') {
        char *x = ddo__asprintf("%s%s", home, d + 1);
        free(d);
        if (x == NULL)
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
        d = x;
    }
    *dir = d;
    return 0;
}

static void key_of_canonical(const char *canon, char key[DDO_PROFILE_KEY_BYTES])
{
    unsigned char md[DDO__OS_SHA256_BYTES] = { 0 };
    ddo__os_sha256 *h = ddo__os_sha256_begin();
    if (h != NULL) {
        ddo__os_sha256_update(h, canon, strlen(canon));
        (void)ddo__os_sha256_end(h, md);
    }
    static const char hex[] = "0123456789abcdef";
    size_t n = strlen(KEY_PREFIX);
    memcpy(key, KEY_PREFIX, n);
    for (size_t i = 0; i < 12; i++) {
        key[n + 2 * i] = hex[md[i] >> 4];
        key[n + 2 * i + 1] = hex[md[i] & 15];
    }
    key[n + 24] = '\0';
}

int ddo_profile_key(const char *context_json, char key[DDO_PROFILE_KEY_BYTES])
{
    json_t *ctx;
    char *canon;
    int rc = context_canonical(context_json, &ctx, &canon);
    if (rc != 0)
        return rc;
    key_of_canonical(canon, key);
    free(canon);
    json_decref(ctx);
    return 0;
}

int ddo_profile_path(const char *dir, const char *context_json, char **path)
{
    if (dir == NULL || path == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: directory or path is NULL");
    char key[DDO_PROFILE_KEY_BYTES];
    int rc = ddo_profile_key(context_json, key);
    if (rc != 0)
        return rc;
    char *p = ddo__asprintf("%s/%s.json", dir, key);
    if (p == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
    *path = p;
    return 0;
}

/* Checks the document's shape; fills the detail and returns DDO_E_FORMAT when foreign. */
static int check_doc(const char *path, json_t *doc, const char *want_key)
{
    if (!json_is_object(doc))
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: not a profile (not a JSON object); ignored",
                         path);
    json_t *v = json_object_get(doc, "schema_version");
    if (!json_is_integer(v) || json_integer_value(v) != DDO_PROFILE_SCHEMA_VERSION)
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: schema_version is not %d; ignored", path,
                         DDO_PROFILE_SCHEMA_VERSION);
    json_t *k = json_object_get(doc, "profile_key");
    if (!json_is_string(k) || (want_key != NULL && strcmp(json_string_value(k), want_key) != 0))
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: profile_key does not match; ignored", path);
    if (!json_is_object(json_object_get(doc, "context")))
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: context missing; ignored", path);
    json_t *obs = json_object_get(doc, "observations");
    if (obs != NULL && !json_is_array(obs))
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: observations is not a list; ignored", path);
    json_t *lim = json_object_get(doc, "capacity_limits");
    if (lim != NULL && !json_is_object(lim))
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: capacity_limits is not an object; ignored", path);
    json_t *rec = json_object_get(doc, "recommendation");
    if (rec != NULL && !json_is_object(rec) && !json_is_null(rec))
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: recommendation is not an object; ignored", path);
    return 0;
}

/* A file of a profile path for a message (escaped). */
static const char *qpath(const char *path, char *buf, size_t len)
{
    ddo__quote(path, true, buf, len);
    return buf;
}

static int load_path(const char *path, const char *want_key, ddo_profile **out)
{
    char q[512];
    char *text = NULL;
    size_t len = 0;
    int e = ddo__os_read_small_file(path, DDO_PROFILE_MAX_FILE_BYTES, &text, &len);
    if (e == ENOENT)
        return ddo__fail(NULL, DDO_E_NOT_FOUND, "%s: no profile", qpath(path, q, sizeof(q)));
    if (e == DDO__OS_TOO_LARGE)
        return ddo__fail(NULL, DDO_E_FORMAT,
                         "%s: profile larger than %u bytes (the profile file limit); ignored",
                         qpath(path, q, sizeof(q)), (unsigned)DDO_PROFILE_MAX_FILE_BYTES);
    if (e != 0)
        return ddo__fail(NULL, e == ENOMEM ? DDO_E_NO_MEMORY : DDO_E_FORMAT,
                         "%s: cannot read profile: %s; ignored", qpath(path, q, sizeof(q)),
                         ddo__os_fs_strerror(e));
    json_error_t jerr;
    json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (doc == NULL) {
        char qt[200];
        ddo__quote(jerr.text, true, qt, sizeof(qt));
        return ddo__fail(NULL, DDO_E_FORMAT, "%s: corrupt profile (%s at line %d); ignored",
                         qpath(path, q, sizeof(q)), qt, jerr.line);
    }
    int rc = check_doc(path, doc, want_key);
    if (rc != 0) {
        json_decref(doc);
        return rc;
    }
    /* A hand-edited file may hold more observations than a profile keeps: the newest stay. */
    json_t *obs = json_object_get(doc, "observations");
    if (json_array_size(obs) > DDO_PROFILE_MAX_OBSERVATIONS) {
        size_t extra = json_array_size(obs) - DDO_PROFILE_MAX_OBSERVATIONS;
        json_t *kept = json_array();
        for (size_t i = extra; kept != NULL && i < json_array_size(obs); i++)
            json_array_append(kept, json_array_get(obs, i));
        if (kept == NULL || json_object_set_new(doc, "observations", kept) != 0) {
            json_decref(doc);
            return ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
        }
    }
    ddo_profile *p = ddo__calloc(1, sizeof(*p));
    if (p == NULL) {
        json_decref(doc);
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
    }
    p->doc = doc;
    *out = p;
    return 0;
}

int ddo_profile_load_file(const char *path, ddo_profile **out)
{
    if (out != NULL)
        *out = NULL;
    if (path == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: path or out is NULL");
    return load_path(path, NULL, out);
}

int ddo_profile_load(const char *dir, const char *context_json, ddo_profile **out)
{
    if (out != NULL)
        *out = NULL;
    if (dir == NULL || out == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: directory or out is NULL");
    json_t *ctx;
    char *canon;
    int rc = context_canonical(context_json, &ctx, &canon);
    if (rc != 0)
        return rc;
    char key[DDO_PROFILE_KEY_BYTES];
    key_of_canonical(canon, key);
    char *path = ddo__asprintf("%s/%s.json", dir, key);
    ddo_profile *p = NULL;
    if (path == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
        goto out;
    }
    rc = load_path(path, key, &p);
    if (rc != 0)
        goto out;
    /* A stored context different from the requested one is a foreign file (a key clash or a
     * hand edit): ignored like upstream. */
    if (!json_equal(json_object_get(p->doc, "context"), ctx)) {
        rc = ddo__fail(NULL, DDO_E_FORMAT, "%s: stored context differs from the workload; ignored",
                       path);
        ddo_profile_destroy(p);
        goto out;
    }
    *out = p;
out:
    free(path);
    free(canon);
    json_decref(ctx);
    return rc;
}

void ddo_profile_destroy(ddo_profile *p)
{
    if (p == NULL)
        return;
    json_decref(p->doc);
    free(p);
}

int ddo_profile_to_json(const ddo_profile *p, char **json)
{
    if (p == NULL || json == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: NULL argument");
    char *s = json_dumps(p->doc, JSON_SORT_KEYS | JSON_INDENT(2));
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
    *json = s;
    return 0;
}

int ddo_profile_context(const ddo_profile *p, char **context_json)
{
    if (p == NULL || context_json == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: NULL argument");
    char *s = json_dumps(json_object_get(p->doc, "context"), canon_flags);
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
    *context_json = s;
    return 0;
}

size_t ddo_profile_observation_count(const ddo_profile *p)
{
    if (p == NULL)
        return 0;
    return json_array_size(json_object_get(p->doc, "observations"));
}

int ddo_profile_capacity(const ddo_profile *p, const char *metric, double *max_success,
                         bool *has_max_success, double *min_failure, bool *has_min_failure)
{
    if (p == NULL || metric == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: NULL argument");
    json_t *lim = json_object_get(json_object_get(p->doc, "capacity_limits"), metric);
    json_t *ms = json_object_get(lim, "max_success");
    json_t *mf = json_object_get(lim, "min_failure");
    bool hm = json_is_number(ms), hf = json_is_number(mf);
    if (!hm && !hf)
        return ddo__fail(NULL, DDO_E_NOT_FOUND, "profile: no capacity limits for metric \"%s\"",
                         metric);
    if (has_max_success != NULL)
        *has_max_success = hm;
    if (has_min_failure != NULL)
        *has_min_failure = hf;
    if (max_success != NULL && hm)
        *max_success = json_number_value(ms);
    if (min_failure != NULL && hf)
        *min_failure = json_number_value(mf);
    return 0;
}

int ddo_profile_recommendation(const ddo_profile *p, const char *key, double *value)
{
    if (p == NULL || key == NULL || value == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: NULL argument");
    json_t *v = json_object_get(json_object_get(p->doc, "recommendation"), key);
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return ddo__fail(NULL, DDO_E_NOT_FOUND, "profile: recommendation has no number \"%s\"",
                         key);
    *value = json_number_value(v);
    return 0;
}

/* Python's round(x, 4) for the values profiles hold (half to even at the 4th decimal). */
static double round4(double x)
{
    double scaled = x * 10000.0;
    double r = nearbyint(scaled); /* default rounding mode: half to even */
    return r / 10000.0;
}

double ddo_profile_recommend_resident_budget(double total_gb, double peak_gb, double headroom_gb)
{
    double v = total_gb - peak_gb - headroom_gb;
    return round4(v > 0.0 ? v : 0.0);
}

double ddo_profile_peak_gb(const ddo_profile_sample *s)
{
    if (s == NULL)
        return 0.0;
    uint64_t a = s->total_bytes > s->free_start_bytes ? s->total_bytes - s->free_start_bytes : 0;
    uint64_t b = s->total_bytes > s->free_end_bytes ? s->total_bytes - s->free_end_bytes : 0;
    uint64_t external = a > s->held_start_bytes ? a - s->held_start_bytes : 0;
    uint64_t c = external + s->held_peak_bytes;
    uint64_t peak = a;
    if (b > peak)
        peak = b;
    if (c > peak)
        peak = c;
    if (s->sampled_used_peak_bytes > peak)
        peak = s->sampled_used_peak_bytes;
    return (double)peak / (double)DDO_GIB;
}

/* Creates dir and its parents (src/os/fs.c). */
static int make_dirs(const char *dir)
{
    if (dir[0] == '\0')
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: directory is empty");
    int e = ddo__os_make_dirs(dir);
    if (e == 0)
        return 0;
    char q[512];
    return ddo__fail(NULL, e == ENOMEM ? DDO_E_NO_MEMORY : DDO_E_IO,
                     "%s: cannot create profile directory: %s", qpath(dir, q, sizeof(q)),
                     ddo__os_fs_strerror(e));
}

/* Merges one observation's capacity into limits (upstream's rule). */
static void merge_capacity(json_t *limits, json_t *obs)
{
    json_t *cap = json_object_get(obs, "capacity");
    json_t *metric = json_object_get(cap, "metric");
    json_t *value = json_object_get(cap, "value");
    if (!json_is_string(metric) || json_string_length(metric) == 0 || !json_is_number(value))
        return;
    const char *status = json_string_value(json_object_get(obs, "status"));
    if (status == NULL)
        return;
    const char *field;
    bool want_max;
    if (strcmp(status, "success") == 0) {
        field = "max_success";
        want_max = true;
    } else if (strcmp(status, "failure") == 0) {
        field = "min_failure";
        want_max = false;
    } else {
        return;
    }
    json_t *entry = json_object_get(limits, json_string_value(metric));
    if (!json_is_object(entry)) {
        entry = json_object();
        json_object_set_new(limits, json_string_value(metric), entry);
    }
    double v = json_number_value(value);
    json_t *prev = json_object_get(entry, field);
    if (json_is_number(prev)) {
        double pv = json_number_value(prev);
        v = want_max ? (v > pv ? v : pv) : (v < pv ? v : pv);
    }
    json_object_set_new(entry, field, json_real(v));
}

static void utc_now(char *buf, size_t len)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    if (ddo__os_gmtime(ts.tv_sec, &tm) != 0)
        memset(&tm, 0, sizeof(tm));
    char base[32];
    strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, len, "%s.%06ld+00:00", base, ts.tv_nsec / 1000);
}

/* Writes text to path atomically (src/os/fs.c: an unnamed temporary file, fsync, rename). */
static int write_atomic(const char *path, const char *text)
{
    char q[512];
    int e = ddo__os_write_atomic(path, text, strlen(text), ddo__profile_crash_before_rename);
    if (e == 0)
        return 0;
    if (ddo__profile_crash_before_rename)
        return ddo__fail(NULL, DDO_E_IO, "%s: simulated crash before rename",
                         qpath(path, q, sizeof(q)));
    return ddo__fail(NULL, DDO_E_IO, "%s: cannot write profile: %s", qpath(path, q, sizeof(q)),
                     ddo__os_fs_strerror(e));
}

/* Takes the profile's lock "<path>.lock" (held across read, merge and write). */
static int lock_profile(const char *path, int *fd)
{
    char *lock = ddo__asprintf("%s.lock", path);
    if (lock == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
    char q[512];
    int e = ddo__os_lock_file(lock, DDO_PROFILE_LOCK_TIMEOUT_MS, fd);
    int rc = e == 0 ? 0
                    : ddo__fail(NULL, DDO_E_IO, "%s: cannot lock profile: %s",
                                qpath(lock, q, sizeof(q)), ddo__os_fs_strerror(e));
    free(lock);
    return rc;
}

int ddo_profile_check_writable(const char *dir)
{
    if (dir == NULL || dir[0] == '\0')
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: directory is empty");
    int rc = make_dirs(dir);
    if (rc != 0)
        return rc;
    int e = ddo__os_dir_writable(dir);
    if (e != 0) {
        char q[512];
        return ddo__fail(NULL, DDO_E_IO,
                         "%s: profile directory is not writable: %s (profile_dir / "
                         "DDO_PROFILE_DIR)",
                         qpath(dir, q, sizeof(q)), ddo__os_fs_strerror(e));
    }
    return 0;
}

/* The text of the next profile document: old's limits and observations (when old is not
 * NULL) with obs merged in, rec or old's recommendation. NULL when out of memory. */
static char *next_text(const ddo_profile *old, const char *key, json_t *ctx, json_t *obs,
                       json_t *rec)
{
    json_t *limits = old ? json_deep_copy(json_object_get(old->doc, "capacity_limits")) : NULL;
    if (limits == NULL)
        limits = json_object();
    json_t *observations = old ? json_deep_copy(json_object_get(old->doc, "observations")) : NULL;
    if (observations == NULL)
        observations = json_array();
    merge_capacity(limits, obs);
    json_array_append(observations, obs);
    while (json_array_size(observations) > DDO_PROFILE_MAX_OBSERVATIONS)
        json_array_remove(observations, 0);
    json_t *recommendation = rec ? json_incref(rec) : NULL;
    if (recommendation == NULL && old != NULL) {
        json_t *prev = json_object_get(old->doc, "recommendation");
        if (json_is_object(prev))
            recommendation = json_deep_copy(prev);
    }
    char stamp[64];
    utc_now(stamp, sizeof(stamp));
    json_t *doc = json_object();
    json_object_set_new(doc, "schema_version", json_integer(DDO_PROFILE_SCHEMA_VERSION));
    json_object_set_new(doc, "profile_key", json_string(key));
    json_object_set_new(doc, "updated_at", json_string(stamp));
    json_object_set(doc, "context", ctx);
    json_object_set_new(doc, "capacity_limits", limits);
    json_object_set_new(doc, "observations", observations);
    if (recommendation != NULL)
        json_object_set_new(doc, "recommendation", recommendation);
    char *body = json_dumps(doc, JSON_SORT_KEYS | JSON_INDENT(2));
    json_decref(doc);
    char *text = body ? ddo__asprintf("%s\n", body) : NULL;
    free(body);
    return text;
}

int ddo_profile_record(const char *dir, const char *context_json, const char *observation_json,
                       const char *recommendation_json, char **path_out)
{
    if (dir == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: directory is NULL");
    json_t *ctx = NULL, *obs = NULL, *rec = NULL;
    char *canon = NULL, *path = NULL, *text = NULL;
    ddo_profile *old = NULL;
    int lock_fd = -1;
    int rc = context_canonical(context_json, &ctx, &canon);
    if (rc != 0)
        return rc;
    if ((rc = parse_object(observation_json, "observation", &obs)) != 0)
        goto out;
    if (recommendation_json != NULL &&
        (rc = parse_object(recommendation_json, "recommendation", &rec)) != 0)
        goto out;
    char key[DDO_PROFILE_KEY_BYTES];
    key_of_canonical(canon, key);
    if ((rc = make_dirs(dir)) != 0)
        goto out;
    path = ddo__asprintf("%s/%s.json", dir, key);
    if (path == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
        goto out;
    }
    /* Read, merge and write under the lock: a concurrent record of the same profile waits,
     * then merges into what this one wrote (no observation is lost). */
    if ((rc = lock_profile(path, &lock_fd)) != 0)
        goto out;
    /* A missing, corrupt or foreign previous file starts a fresh profile. */
    if (ddo_profile_load(dir, context_json, &old) != 0)
        old = NULL;
    text = next_text(old, key, ctx, obs, rec);
    if (text == NULL) {
        rc = ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
        goto out;
    }
    if ((rc = write_atomic(path, text)) != 0)
        goto out;
    if (path_out != NULL) {
        *path_out = path;
        path = NULL;
    }
out:
    ddo__os_unlock_file(lock_fd);
    ddo_profile_destroy(old);
    free(text);
    free(path);
    free(canon);
    json_decref(rec);
    json_decref(obs);
    json_decref(ctx);
    return rc;
}

int ddo_profile_workload_context(const char *name, const ddo_checkpoint *ck, char **context_json)
{
    if (name == NULL || name[0] == '\0' || context_json == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: a workload needs a name");
    /* The model's identity is its tensor table (names, dtypes, shapes), not its path: the
     * same model moved or re-downloaded keeps its profile. */
    ddo__os_sha256 *md = ddo__os_sha256_begin();
    if (md == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
    size_t n = ck ? ddo_checkpoint_tensor_count(ck) : 0;
    for (size_t i = 0; i < n; i++) {
        const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, i);
        char line[96];
        ddo__os_sha256_update(md, t->name, strlen(t->name) + 1);
        int len = snprintf(line, sizeof(line), "%d:%u", (int)t->dtype, t->ndim);
        ddo__os_sha256_update(md, line, (size_t)len);
        for (uint32_t d = 0; d < t->ndim; d++) {
            len = snprintf(line, sizeof(line), ",%llu", (unsigned long long)t->shape[d]);
            ddo__os_sha256_update(md, line, (size_t)len);
        }
        ddo__os_sha256_update(md, ";", 1);
    }
    unsigned char digest[DDO__OS_SHA256_BYTES];
    if (ddo__os_sha256_end(md, digest) != 0)
        return ddo__fail(NULL, DDO_E_INTERNAL, "profile: SHA-256 failed");
    char sig[64] = "ddo-tensors-";
    static const char hex[] = "0123456789abcdef";
    size_t off = strlen(sig);
    for (size_t i = 0; i < 12; i++) {
        sig[off + 2 * i] = hex[digest[i] >> 4];
        sig[off + 2 * i + 1] = hex[digest[i] & 15];
    }
    sig[off + 24] = '\0';
    json_t *ctx =
        json_pack("{s:s, s:s, s:i}", "name", name, "model_class", sig, "identity_version", 2);
    char *s = ctx ? json_dumps(ctx, canon_flags) : NULL;
    json_decref(ctx);
    if (s == NULL)
        return ddo__fail(NULL, DDO_E_NO_MEMORY, "profile: out of memory");
    *context_json = s;
    return 0;
}

const char *ddo_profile_status_name(ddo_profile_status status)
{
    switch (status) {
    case DDO_PROFILE_DISABLED:
        return "disabled";
    case DDO_PROFILE_CALIBRATING:
        return "calibrating";
    case DDO_PROFILE_MANUAL:
        return "manual";
    case DDO_PROFILE_MISSING:
        return "missing";
    case DDO_PROFILE_APPLIED:
        return "applied";
    }
    return "unknown";
}

/* A profile's decision outranks every other source (it is applied last, at setup, like
 * upstream's prepare()); its source names the profile. */
static int set_profile_value(ddo_config *cfg, const char *key, const char *text)
{
    const ddo__options *o = ddo__config_options(cfg);
    char source[160];
    snprintf(source, sizeof(source), "profile:%s", o->profile_name ? o->profile_name : "");
    return ddo__config_store_top(cfg, key, text, source);
}

static int set_gb(ddo_config *cfg, const char *key, double v)
{
    char text[64];
    snprintf(text, sizeof(text), "%.17g", v);
    return set_profile_value(cfg, key, text);
}

/* A measured rate of the recommendation: finite, positive and below 1e18 per second (an
 * exabyte or exaflop per second is no measurement), else 0 (not used). */
static double measured_rate(const ddo_profile *p, const char *key)
{
    double v = 0.0;
    if (ddo_profile_recommendation(p, key, &v) != 0 || !(v > 0.0) || !(v < 1e18))
        return 0.0;
    return v;
}

/* The recommended resident budget, range-checked before it is applied: a number within the
 * catalog range of resident_module_budget_gb. false with a detail naming the file, the key and
 * the value otherwise. */
static bool usable_budget(const ddo_profile *p, const char *dir, const char *context_json,
                          double *budget)
{
    static const char key[] = "profile_resident_module_budget_gb";
    char *path = NULL, q[512], v[64];
    if (ddo_profile_path(dir, context_json, &path) != 0)
        return false;
    qpath(path, q, sizeof(q));
    free(path);
    json_t *j = json_object_get(json_object_get(p->doc, "recommendation"), key);
    if (j == NULL) {
        ddo__fail(NULL, DDO_E_NOT_FOUND, "%s: the recommendation has no %s", q, key);
        return false;
    }
    double x = json_is_number(j) ? json_number_value(j) : NAN;
    double lo = 0.0, hi = 1e9;
    (void)ddo__config_range("resident_module_budget_gb", &lo, &hi);
    if (!isfinite(x) || x < 0.0 || x > hi) {
        if (isfinite(x))
            ddo__format_real(x, v, sizeof(v));
        else
            snprintf(v, sizeof(v), "(not a number)");
        ddo__fail(NULL, DDO_E_FORMAT,
                  "%s: recommendation %s=%s is outside 0..%.0f GiB (a resident budget); "
                  "ignored",
                  q, key, v, hi);
        return false;
    }
    *budget = x;
    return true;
}

int ddo_profile_apply(ddo_config *cfg, const char *dir, const char *context_json,
                      ddo_profile_status *status, double *budget_gb, ddo_profile_measured *measured)
{
    if (cfg == NULL)
        return ddo__fail(NULL, DDO_E_INVALID_ARGUMENT, "profile: config is NULL");
    const ddo__options *o = ddo__config_options(cfg);
    ddo_profile_status st = DDO_PROFILE_DISABLED;
    double budget = 0.0;
    int rc = 0;
    if (measured != NULL)
        memset(measured, 0, sizeof(*measured));
    bool named = o->profile_name != NULL && o->profile_name[0] != '\0';
    if (o->build_profile) {
        if (!named)
            return ddo__fail(NULL, DDO_E_CONFIG,
                             "build_profile: calibration requires profile_name (got an empty "
                             "name)");
        if (!(o->profile_vram_headroom_gb >= 0.0) || !isfinite(o->profile_vram_headroom_gb))
            return ddo__fail(NULL, DDO_E_CONFIG,
                             "profile_vram_headroom_gb: must be finite and >= 0");
        /* Calibration measures the zero-resident peak: a manual budget is overridden. */
        if ((rc = set_gb(cfg, "resident_module_budget_gb", 0.0)) != 0 ||
            (rc = set_gb(cfg, "profile_resident_module_budget_gb", 0.0)) != 0 ||
            (rc = set_profile_value(cfg, "always_resident_modules_pattern", "")) != 0)
            return rc;
        st = DDO_PROFILE_CALIBRATING;
        goto done;
    }
    if (!named)
        goto done;
    /* A manual budget wins over the recommended one; the measured figures still apply. */
    bool manual = o->resident_module_budget_gb > 0.0;
    if (manual) {
        st = DDO_PROFILE_MANUAL;
        budget = o->resident_module_budget_gb;
    }
    ddo_profile *p = NULL;
    if (dir == NULL || context_json == NULL) {
        if (!manual) {
            ddo__fail(NULL, DDO_E_NOT_FOUND, "no profile directory or workload context");
            st = DDO_PROFILE_MISSING;
        }
        goto done;
    }
    if (ddo_profile_load(dir, context_json, &p) != 0) {
        if (!manual)
            st = DDO_PROFILE_MISSING; /* the detail (missing, corrupt, too large...) stays */
        goto done;
    }
    if (measured != NULL) {
        measured->bus_bytes_per_s = measured_rate(p, "bus_bytes_per_s");
        measured->flops_per_s = measured_rate(p, "flops_per_s");
        measured->file_read_bytes_per_s = measured_rate(p, "file_read_bytes_per_s");
    }
    if (manual) {
        ddo_profile_destroy(p);
        goto done;
    }
    if (!usable_budget(p, dir, context_json, &budget)) {
        ddo_profile_destroy(p);
        st = DDO_PROFILE_MISSING;
        budget = 0.0;
        goto done;
    }
    ddo_profile_destroy(p);
    if (o->max_resident_module_budget_gb > 0.0 && budget > o->max_resident_module_budget_gb)
        budget = o->max_resident_module_budget_gb;
    bool policy_off = o->auto_budget_policy == NULL || strcmp(o->auto_budget_policy, "off") == 0;
    rc = set_gb(cfg, policy_off ? "resident_module_budget_gb" : "profile_resident_module_budget_gb",
                budget);
    if (rc != 0)
        return rc;
    st = DDO_PROFILE_APPLIED;
done:
    if (status != NULL)
        *status = st;
    if (budget_gb != NULL)
        *budget_gb = budget;
    return 0;
}
