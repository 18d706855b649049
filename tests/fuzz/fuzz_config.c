/*
 * fuzz_config.c - bytes become an environment block (first half) and a
 * --ddo-* argument vector (second half, split at NUL or newline); the config
 * must parse, validate, describe itself as JSON and clean up without a crash,
 * a leak or an undefined behaviour, whatever the input. The same items are also
 * set as the elements of a list option (ddo_config_set_list /
 * ddo_config_override_list, never split), and each environment entry's name is
 * read as a host phase reads a DDO_* variable (ddo_config_preset_value).
 */
#include "config/config_priv.h"
#include "ddo.h"
#include "ddo_compat.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ITEMS 64

/* Splits text (modified in place) at '\n' or '\0' into at most MAX_ITEMS strings. */
static size_t split(char *text, size_t len, char **items)
{
    size_t n = 0, start = 0;
    for (size_t i = 0; i <= len && n < MAX_ITEMS; i++) {
        if (i == len || text[i] == '\n' || text[i] == '\0') {
            text[i] = '\0';
            if (i > start)
                items[n++] = text + start;
            start = i + 1;
        }
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 8192)
        return 0;
    char *text = malloc(size + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    size_t half = size / 2;
    /* A '|' byte, when present, decides the split instead. */
    char *bar = memchr(text, '|', size);
    if (bar != NULL)
        half = (size_t)(bar - text);

    char *env[MAX_ITEMS + 1];
    size_t nenv = split(text, half, env);
    env[nenv] = NULL;
    char *args[MAX_ITEMS + 2];
    args[0] = "fuzz";
    size_t rest = half < size ? size - half - 1 : 0;
    int argc = 1 + (int)split(text + half + (half < size ? 1 : 0), rest, args + 1);
    args[argc] = NULL;

    ddo_config *cfg = NULL;
    if (ddo_config_create(&cfg) == 0) {
        ddo_config_set_running_on_wsl(cfg, (size & 1) != 0);
        (void)ddo_config_apply_preset(cfg, NULL, "auto");
        (void)ddo_config_apply_env(cfg, (const char *const *)env);
        int n = argc;
        (void)ddo_config_parse_args(cfg, &n, args);
        static const char *const lists[] = { "always_resident_modules_pattern",
                                             "skip_modules_pattern", "resident_module_patterns",
                                             "target_module_classes", "pin_cpu_workers" };
        const char *key = lists[size % (sizeof(lists) / sizeof(lists[0]))];
        if (size & 2)
            (void)ddo_config_override_list(cfg, key, (const char *const *)args + 1,
                                           (size_t)argc - 1);
        else
            (void)ddo_config_set_list(cfg, key, (const char *const *)args + 1, (size_t)argc - 1);
        for (size_t i = 0; i < nenv; i++) {
            char name[128];
            size_t k = strcspn(env[i], "=");
            if (k >= sizeof(name))
                continue;
            memcpy(name, env[i], k);
            name[k] = '\0';
            const char *v = NULL;
            bool b = false;
            if (ddo_config_preset_value(cfg, name, (const char *const *)env, &v) != 0 ||
                ddo_config_preset_bool(cfg, name, (const char *const *)env, v, &b) != 0)
                abort(); /* never fails on a non-NULL name */
        }
        (void)ddo_config_validate(cfg);
        char *json = NULL;
        if (ddo_config_to_json(cfg, &json) == 0)
            ddo_free(json);
        ddo_settings st;
        (void)ddo_config_settings(cfg, &st);
        const char *route = NULL;
        (void)ddo__config_component_route(cfg, "text_encoder", &route);
        for (size_t i = 0; i < ddo_config_count(); i++) {
            ddo_config_item item;
            (void)ddo_config_entry(cfg, i, &item);
        }
        ddo_config *copy = NULL;
        if (ddo_config_clone(cfg, &copy) == 0)
            ddo_config_destroy(copy);
        ddo_config_destroy(cfg);
    }
    free(text);
    return 0;
}
