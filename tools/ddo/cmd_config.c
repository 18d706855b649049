/*
 * cmd_config.c - `ddo config [--ddo-* flags] [--json] [--list [--markdown]]`:
 * the resolved settings with the source of every value, or the catalog. The
 * tool always applies the environment first, then the flags (flags win).
 */
#include "compat.h"
#include "tool.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: ddo config [--ddo-* flags] [--json] [--list [--markdown]]\n\n"
            "Prints the resolved configuration (DDO_* environment, then --ddo-* flags)\n"
            "with the source of every value; --json as JSON; --list the whole catalog\n"
            "(--markdown: docs/options.md).\n\n%s",
            ddo_config_flags_help());
}

static void print_text(const ddo_config *cfg)
{
    ddo_settings s;
    ddo_config_settings(cfg, &s);
    printf("settings:\n");
    printf("  requested_preset          %s\n", s.requested_preset);
    printf("  effective_preset          %s\n", s.effective_preset);
    printf("  backend                   %s\n", s.backend);
    printf("  route                     %s\n", s.route);
    printf("  enabled                   %s\n", s.enabled ? "true" : "false");
    printf("  plan                      %s\n", s.plan ? "true" : "false");
    printf("  requested_pin_cpu_memory  %s\n", s.requested_pin_cpu_memory ? "true" : "false");
    printf("  effective_pin_cpu_memory  %s\n", s.effective_pin_cpu_memory ? "true" : "false");
    printf("  disable_pin_on_wsl        %s\n", s.disable_pin_on_wsl ? "true" : "false");
    printf("  running_on_wsl            %s\n", s.running_on_wsl ? "true" : "false");
    printf("components:\n");
    static const char *const comps[] = { "text_encoder", "transformer", "vae" };
    for (size_t i = 0; i < sizeof(comps) / sizeof(comps[0]); i++) {
        ddo_component_policy p;
        if (ddo_config_component_policy(cfg, comps[i], NULL, false, &p) != 0) {
            printf("  %-25s error: %s\n", comps[i], ddo_last_error());
            continue;
        }
        printf("  %-25s %s (%s)", comps[i], p.route, p.route_source);
        if (strcmp(p.route, "diffusers_group_offload") == 0)
            printf(" %s, stream %s", p.offload_type, p.use_stream ? "on" : "off");
        printf("\n");
    }
    printf("options:\n");
    for (size_t i = 0; i < ddo_config_count(); i++) {
        ddo_config_item it;
        if (ddo_config_entry(cfg, i, &it) != 0)
            continue;
        printf("  %-40s %-24s %s\n", it.key, it.value[0] != '\0' ? it.value : "\"\"", it.source);
    }
}

int ddo_cmd_config(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return DDO_EXIT_OK;
        }
    ddo_config *cfg;
    if (tool_config_create(&cfg) != 0) {
        fprintf(stderr, "ddo config: %s\n", ddo_last_error());
        return DDO_EXIT_FAILURE;
    }
    int status = DDO_EXIT_FAILURE;
    if (ddo_config_apply_env(cfg, TOOL_ENVIRON) != 0 ||
        ddo_config_parse_args(cfg, &argc, argv) != 0) {
        fprintf(stderr, "ddo config: %s\n", ddo_config_error(cfg));
        goto out;
    }
    bool json = false, list = false, markdown = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--list") == 0) {
            list = true;
        } else if (strcmp(argv[i], "--markdown") == 0) {
            markdown = true;
        } else {
            fprintf(stderr, "ddo config: unknown argument '%s'\n\n", argv[i]);
            usage(stderr);
            status = DDO_EXIT_USAGE;
            goto out;
        }
    }
    if (markdown && !list) {
        fprintf(stderr, "ddo config: --markdown goes with --list\n");
        status = DDO_EXIT_USAGE;
        goto out;
    }
    if (list) {
        char *text;
        if (ddo_config_describe(markdown ? DDO_CONFIG_DOC_MARKDOWN : DDO_CONFIG_DOC_LIST, &text) !=
            0) {
            fprintf(stderr, "ddo config: %s\n", ddo_last_error());
            goto out;
        }
        fputs(text, stdout);
        ddo_free(text);
        status = DDO_EXIT_OK;
        goto out;
    }
    for (size_t i = 0; i < ddo_config_warning_count(cfg); i++)
        fprintf(stderr, "ddo: warning: %s\n", ddo_config_warning(cfg, i));
    if (ddo_config_validate(cfg) != 0) {
        fprintf(stderr, "ddo config: %s\n", ddo_config_error(cfg));
        goto out;
    }
    if (json) {
        char *text;
        if (ddo_config_to_json(cfg, &text) != 0) {
            fprintf(stderr, "ddo config: %s\n", ddo_last_error());
            goto out;
        }
        printf("%s\n", text);
        ddo_free(text);
    } else {
        print_text(cfg);
    }
    status = DDO_EXIT_OK;
out:
    ddo_config_destroy(cfg);
    return status;
}
