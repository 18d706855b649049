/*
 * cmd_synth.c - `ddo synth --layout FILE --out PATH [--scale S] [--seed N]`:
 * writes a synthetic checkpoint with the exact names, shapes and dtypes of an
 * architecture layout, filled with deterministic finite values.
 */
#include "synth.h"
#include "tool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: ddo synth --layout FILE.json --out PATH [--scale S] [--seed N]\n"
        "                 [--values uniform|normal] [--threads N] [--quant TYPE]\n\n"
        "Writes a .safetensors file (a .gguf v3 file when PATH ends in .gguf: GGML's types\n"
        "and block types such as Q8_0 and Q4_K, the last dimension rounded up to whole\n"
        "blocks, random block bytes) with exactly the tensor names, shapes and dtypes of\n"
        "the layout (data/layouts/*.json), in layout order, filled with deterministic\n"
        "pseudo-random finite values.\n"
        "  --scale S   0 < S <= 1: every dimension d becomes max(1, round(d * S)) (default 1)\n"
        "  --seed N    the generator seed (default 0); same layout, scale and seed give the\n"
        "              same bytes\n"
        "  --values V  uniform (default: exponents in a narrow band) or normal (shaped like\n"
        "              trained weights: per tensor a Gaussian of standard deviation\n"
        "              1/sqrt(fan_in), never repeating; what codec ratios are measured on;\n"
        "              F8_E4M3 / F8_E5M2 scaled per tensor as FP8 checkpoints are: 5.8\n"
        "              standard deviations to the largest finite value, then rounded)\n"
        "  --threads N the generator threads, 1..256 (default: the online CPU count; each holds\n"
        "              an 8 MiB piece); the bytes do not depend on it\n"
        "  --quant T   with a .gguf PATH: every 2-D BF16/F16/F32 tensor whose rows are whole\n"
        "              blocks of the GGML block type T (Q8_0, Q4_K, ...) is written as T\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int ddo_cmd_synth(int argc, char **argv)
{
    const char *layout = NULL, *out = NULL;
    double scale = 1.0;
    ddo_tool_values values = DDO_TOOL_VALUES_UNIFORM;
    uint64_t seed = 0, threads = 0;
    ddo_dtype quant = DDO_DTYPE_COUNT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return DDO_EXIT_OK;
        } else if (strcmp(a, "--layout") == 0 && v != NULL) {
            layout = v;
            i++;
        } else if (strcmp(a, "--out") == 0 && v != NULL) {
            out = v;
            i++;
        } else if (strcmp(a, "--scale") == 0) {
            if (tool_flag_real("synth", a, v, 1e-6, 1.0, &scale) != 0)
                return DDO_EXIT_USAGE;
            i++;
        } else if (strcmp(a, "--seed") == 0) {
            if (tool_flag_count("synth", a, v, 0, UINT64_MAX, &seed) != 0)
                return DDO_EXIT_USAGE;
            i++;
        } else if (strcmp(a, "--threads") == 0) {
            if (tool_flag_count("synth", a, v, 1, 256, &threads) != 0)
                return DDO_EXIT_USAGE;
            i++;
        } else if (strcmp(a, "--quant") == 0 && v != NULL && ddo_dtype_from_name(v, &quant) == 0 &&
                   ddo_dtype_block(quant, NULL) != 0) {
            i++;
        } else if (strcmp(a, "--values") == 0 && v != NULL &&
                   (strcmp(v, "uniform") == 0 || strcmp(v, "normal") == 0)) {
            values = strcmp(v, "normal") == 0 ? DDO_TOOL_VALUES_NORMAL : DDO_TOOL_VALUES_UNIFORM;
            i++;
        } else {
            fprintf(stderr, "ddo synth: unknown or incomplete argument '%s'\n", a);
            usage(stderr);
            return DDO_EXIT_USAGE;
        }
    }
    if (layout == NULL || out == NULL) {
        fprintf(stderr, "ddo synth: --layout and --out are required\n");
        usage(stderr);
        return DDO_EXIT_USAGE;
    }
    size_t ol = strlen(out);
    if (quant != DDO_DTYPE_COUNT && (ol < 5 || strcmp(out + ol - 5, ".gguf") != 0)) {
        fprintf(stderr, "ddo synth: --quant takes a .gguf output\n");
        return DDO_EXIT_FAILURE;
    }
    char err[1024] = "";
    uint64_t bytes = 0;
    double t0 = now_s();
    int rc = ddo_tool_synth_values(layout, out, scale, (uint64_t)seed, values, (unsigned)threads,
                                   quant, &bytes, err, sizeof(err));
    double dt = now_s() - t0;
    if (rc != 0) {
        fprintf(stderr, "ddo synth: %s\n", err[0] != '\0' ? err : ddo_strerror(rc));
        return DDO_EXIT_FAILURE;
    }
    printf("wrote %s: %llu bytes in %.3f s (%.0f MB/s)\n", out, (unsigned long long)bytes, dt,
           dt > 0.0 ? (double)bytes / dt / 1e6 : 0.0);
    return DDO_EXIT_OK;
}
