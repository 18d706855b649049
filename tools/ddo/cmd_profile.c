/*
 * cmd_profile.c - `ddo profile list | show NAME | build NAME PATH [run options] | rm NAME`:
 * named capacity profiles under DDO_PROFILE_DIR (default ~/.ddo/profiles).
 */
#include "compat.h"
#include "tool.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: ddo profile [--dir DIR] list\n"
        "       ddo profile [--dir DIR] show NAME\n"
        "       ddo profile [--dir DIR] build NAME PATH [ddo run options]\n"
        "       ddo profile [--dir DIR] rm NAME\n"
        "Profiles live in --dir, else DDO_PROFILE_DIR, else ~/.ddo/profiles.\n"
        "build runs a calibration (`ddo run PATH --ddo-profile-name NAME --ddo-build-profile`):\n"
        "zero resident weights, the peak device memory measured, and the next run's resident\n"
        "budget (total - peak - profile_vram_headroom_gb) saved with the measured bus\n"
        "bandwidth, file read speed and compute rate.\n");
}

/* Calls fn(path, profile, user) for each readable profile of dir; returns how many. */
typedef void (*visit_fn)(const char *path, const ddo_profile *p, json_t *doc, void *user);

/* A listing reads at most this many profile files and this many bytes of them (real
 * profiles are a few KiB); with each file capped at DDO_PROFILE_MAX_FILE_BYTES and read one
 * at a time, it stays bounded in memory and time whatever the directory holds. */
#define MAX_PROFILE_FILES 10000
#define MAX_LISTED_BYTES  ((uint64_t)64 << 20)

static int visit(const char *dir, visit_fn fn, void *user, int *corrupt)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    int n = 0, seen = 0;
    uint64_t bytes = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0 ||
            strncmp(e->d_name, "ddo-capacity-", 13) != 0)
            continue;
        if (++seen > MAX_PROFILE_FILES) {
            char q[512];
            fprintf(stderr,
                    "ddo profile: more than %d profile files in %s; the rest are not read\n",
                    MAX_PROFILE_FILES, tool_quote(dir, q, sizeof q));
            break;
        }
        char path[4096];
        if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path))
            continue;
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
            (bytes += (uint64_t)st.st_size) > MAX_LISTED_BYTES) {
            char q[512];
            fprintf(stderr,
                    "ddo profile: over %llu MiB of profile files in %s; the rest are not "
                    "read\n",
                    (unsigned long long)(MAX_LISTED_BYTES >> 20), tool_quote(dir, q, sizeof q));
            break;
        }
        ddo_profile *p = NULL;
        /* The library opens without blocking and refuses FIFOs, devices and files over
         * DDO_PROFILE_MAX_FILE_BYTES, so a hostile entry costs one line, not a hang. */
        if (ddo_profile_load_file(path, &p) != 0) {
            fprintf(stderr, "ddo profile: %s\n", ddo_last_error());
            if (corrupt != NULL)
                (*corrupt)++;
            continue;
        }
        char *text = NULL;
        json_t *doc = NULL;
        if (ddo_profile_to_json(p, &text) == 0)
            doc = json_loads(text, 0, NULL);
        ddo_free(text);
        if (doc != NULL)
            fn(path, p, doc, user);
        json_decref(doc);
        ddo_profile_destroy(p);
        n++;
    }
    closedir(d);
    return n;
}

static const char *ctx_name(json_t *doc)
{
    const char *n = json_string_value(json_object_get(json_object_get(doc, "context"), "name"));
    return n ? n : "(unnamed)";
}

static void print_row(const char *path, const ddo_profile *p, json_t *doc, void *user)
{
    (void)path;
    (void)user;
    double budget = 0;
    char b[32] = "-";
    if (ddo_profile_recommendation(p, "profile_resident_module_budget_gb", &budget) == 0)
        snprintf(b, sizeof(b), "%.4f", budget);
    char q[64];
    printf("%-24s %-20s %-32s %4zu  %s\n", tool_quote(ctx_name(doc), q, sizeof q),
           json_string_value(json_object_get(doc, "profile_key")),
           json_string_value(json_object_get(doc, "updated_at")), ddo_profile_observation_count(p),
           b);
}

struct match {
    const char *name;
    int found;
    int remove;
};

static void show_or_rm(const char *path, const ddo_profile *p, json_t *doc, void *user)
{
    (void)p;
    struct match *m = user;
    if (strcmp(ctx_name(doc), m->name) != 0)
        return;
    m->found++;
    if (m->remove) {
        char lock[4200];
        if (unlink(path) == 0) {
            printf("removed %s\n", path);
            snprintf(lock, sizeof lock, "%s.lock", path);
            (void)unlink(lock); /* the lock file beside it, if a record left one */
        } else {
            perror(path);
        }
        return;
    }
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS);
    printf("# %s\n%s\n", path, text ? text : "");
    free(text);
}

int ddo_cmd_profile(int argc, char **argv)
{
    int i = 1;
    const char *explicit_dir = NULL;
    if (i + 1 < argc && strcmp(argv[i], "--dir") == 0) {
        explicit_dir = argv[i + 1];
        i += 2;
    }
    if (i >= argc) {
        usage(stderr);
        return DDO_EXIT_USAGE;
    }
    const char *verb = argv[i++];
    if (strcmp(verb, "--help") == 0 || strcmp(verb, "-h") == 0) {
        usage(stdout);
        return DDO_EXIT_OK;
    }
    char *dir = NULL;
    const char *home = getenv("HOME"); /* else Windows' USERPROFILE, as ddo_setup_create reads */
    if (home == NULL || home[0] == '\0')
        home = getenv("USERPROFILE");
    if (ddo_profile_dir(explicit_dir, getenv("DDO_PROFILE_DIR"), home, &dir) != 0) {
        fprintf(stderr, "ddo profile: %s\n", ddo_last_error());
        return DDO_EXIT_FAILURE;
    }
    int status = DDO_EXIT_OK;
    if (strcmp(verb, "list") == 0 && i == argc) {
        printf("%-24s %-20s %-32s %4s  %s\n", "NAME", "KEY", "UPDATED", "OBS", "RESIDENT_GB");
        int corrupt = 0;
        int n = visit(dir, print_row, NULL, &corrupt);
        if (n == 0)
            printf("(no profiles in %s)\n", dir);
        (void)corrupt;
    } else if ((strcmp(verb, "show") == 0 || strcmp(verb, "rm") == 0) && i + 1 == argc) {
        struct match m = { argv[i], 0, strcmp(verb, "rm") == 0 };
        visit(dir, show_or_rm, &m, NULL);
        if (m.found == 0) {
            char q[256], qd[512];
            fprintf(stderr, "ddo profile: no profile named \"%s\" in %s\n",
                    tool_quote(argv[i], q, sizeof q), tool_quote(dir, qd, sizeof qd));
            status = DDO_EXIT_FAILURE;
        }
    } else if (strcmp(verb, "build") == 0 && i + 2 <= argc) {
        const char *name = argv[i];
        /* ddo run PATH [options] --ddo-profile-name NAME --ddo-build-profile --ddo-profile-dir DIR
         */
        int rargc = argc - i + 6;
        char **rargv = calloc((size_t)rargc + 1, sizeof(char *));
        if (rargv == NULL) {
            free(dir);
            return DDO_EXIT_FAILURE;
        }
        int k = 0;
        rargv[k++] = "run";
        for (int j = i + 1; j < argc; j++)
            rargv[k++] = argv[j];
        rargv[k++] = "--ddo-profile-name";
        rargv[k++] = (char *)name;
        rargv[k++] = "--ddo-build-profile";
        rargv[k++] = "--ddo-profile-dir";
        rargv[k++] = dir;
        rargv[k] = NULL;
        status = ddo_cmd_run(k, rargv);
        free(rargv);
    } else {
        usage(stderr);
        status = DDO_EXIT_USAGE;
    }
    free(dir);
    return status;
}
