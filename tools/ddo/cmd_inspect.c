/*
 * cmd_inspect.c - `ddo inspect PATH [--json] [--codec [--threads N]]`: the tensors, dtypes
 * and block groups of a checkpoint, or with --codec the ratio the weight codec would give
 * them (inspect_codec.c; docs/inspect.md). Exit 0 on success, 1 when the
 * checkpoint is rejected (one line on stderr, nothing on stdout), 2 on a
 * usage error.
 */
#include "inspect_codec.h"
#include "tool.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define NAME_COLUMN_MAX 64

static void usage(FILE *out)
{
    fprintf(out,
            "usage: ddo inspect PATH [--json]\n"
            "       ddo inspect --codec PATH [--json] [--threads N] [--verify]\n"
            "  PATH    a .safetensors or .gguf file, a *.safetensors.index.json sharded set, or a\n"
            "          directory holding either (Diffusers/Transformers layout)\n"
            "  --json  print the checkpoint as JSON (see docs/inspect.md)\n"
            "  --codec read and code every tensor with the weight codec (ddoc1) and print\n"
            "          coded/raw per dtype, per block group and in total, the time, and the\n"
            "          codec_ratio that ddo plan --codec-ratio takes (JSON with --json)\n"
            "  --threads N  the coding workers, 1..1024 (default: the online CPU count);\n"
            "          each holds one tensor and its coded copy at a time\n"
            "  --verify     with --codec: decode every stream with the C reference decoder,\n"
            "          compare it with the tensor and print the decoder's GB/s per thread\n");
}

/* One escaped character of s at *p (advanced): newline, tab, CR, backslash as \n \t \r \\,
 * other C0 controls, DEL and C1 controls (UTF-8 C2 80..C2 9F) as \xNN / \u00NN, so that no
 * name reaches the terminal raw. Returns the bytes written to out (at most 7). */
static size_t esc_char(const unsigned char **p, char out[8])
{
    unsigned char c = **p;
    (*p)++;
    if (c == '\n' || c == '\t' || c == '\r' || c == '\\') {
        out[0] = '\\';
        out[1] = c == '\n' ? 'n' : c == '\t' ? 't' : c == '\r' ? 'r' : '\\';
        return 2;
    }
    if (c < 0x20 || c == 0x7f)
        return (size_t)snprintf(out, 8, "\\x%02x", c);
    if (c == 0xc2 && **p >= 0x80 && **p <= 0x9f) {
        unsigned char d = **p;
        (*p)++;
        return (size_t)snprintf(out, 8, "\\u%04x", d);
    }
    out[0] = (char)c;
    return 1;
}

/* The escaped length of s. */
static size_t esc_len(const char *s)
{
    size_t n = 0;
    char tmp[8];
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0';)
        n += esc_char(&p, tmp);
    return n;
}

/* Prints s escaped to out, padded with spaces to width. */
static void fput_esc(FILE *out, const char *s, int width)
{
    size_t n = 0;
    char tmp[8];
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0';) {
        size_t k = esc_char(&p, tmp);
        fwrite(tmp, 1, k, out);
        n += k;
    }
    for (; (int)n < width; n++)
        fputc(' ', out);
}

static void put_esc(const char *s, int width)
{
    fput_esc(stdout, s, width);
}

/* "[4, 3, 3, 3]" */
static void format_shape(char *buf, size_t len, const ddo_tensor_info *t)
{
    size_t at = 0;
    int w = snprintf(buf, len, "[");
    at = w > 0 ? (size_t)w : 0;
    for (uint32_t d = 0; d < t->ndim && at < len; d++) {
        w = snprintf(buf + at, len - at, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
        if (w < 0)
            return;
        at += (size_t)w;
    }
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

/* "1.5 GiB" */
static void format_size(char *buf, size_t len, uint64_t bytes)
{
    static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    double v = (double)bytes;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%" PRIu64 " B", bytes);
    else
        snprintf(buf, len, "%.1f %s", v, units[u]);
}

static void print_blocks(const ddo_checkpoint *ck);
static void print_quant(const ddo_checkpoint *ck);

static void print_human(const ddo_checkpoint *ck, const char *path)
{
    size_t nt = ddo_checkpoint_tensor_count(ck);
    size_t nf = ddo_checkpoint_file_count(ck);
    char size_text[32];
    format_size(size_text, sizeof(size_text), ddo_checkpoint_total_bytes(ck));
    put_esc(path, 0);
    printf(": %zu tensor%s, %" PRIu64 " bytes (%s) in %zu file%s\n", nt, nt == 1 ? "" : "s",
           ddo_checkpoint_total_bytes(ck), size_text, nf, nf == 1 ? "" : "s");
    for (size_t i = 0; i < nf; i++) {
        const ddo_file_info *f = ddo_checkpoint_file(ck, i);
        printf("  file %zu: ", i);
        put_esc(f->path, 0);
        printf(" (%" PRIu64 " bytes, header %" PRIu64 " bytes)\n", f->size, f->header_bytes);
    }
    size_t nm = ddo_checkpoint_metadata_count(ck);
    for (size_t i = 0; i < nm; i++) {
        const char *k, *v;
        if (ddo_checkpoint_metadata(ck, i, &k, &v) == 0) {
            printf("  metadata: ");
            put_esc(k, 0);
            printf(" = ");
            put_esc(v, 0);
            printf("\n");
        }
    }

    int name_w = 4;
    for (size_t i = 0; i < nt; i++) {
        size_t n = esc_len(ddo_checkpoint_tensor(ck, i)->name);
        if (n > (size_t)name_w)
            name_w = n > NAME_COLUMN_MAX ? NAME_COLUMN_MAX : (int)n;
    }
    printf("\n%-*s  %-7s  %-20s  %12s\n", name_w, "NAME", "DTYPE", "SHAPE", "BYTES");
    uint64_t dtype_bytes[DDO_DTYPE_COUNT] = { 0 };
    size_t dtype_count[DDO_DTYPE_COUNT] = { 0 };
    for (size_t i = 0; i < nt; i++) {
        const ddo_tensor_info *t = ddo_checkpoint_tensor(ck, i);
        char shape[256];
        format_shape(shape, sizeof(shape), t);
        put_esc(t->name, name_w);
        printf("  %-7s  %-20s  %12" PRIu64 "\n", ddo_dtype_name(t->dtype), shape, t->nbytes);
        dtype_bytes[t->dtype] += t->nbytes;
        dtype_count[t->dtype]++;
    }

    printf("\n%-7s  %8s  %14s\n", "DTYPE", "TENSORS", "BYTES");
    for (int d = 0; d < DDO_DTYPE_COUNT; d++)
        if (dtype_count[d] > 0)
            printf("%-7s  %8zu  %14" PRIu64 "\n", ddo_dtype_name((ddo_dtype)d), dtype_count[d],
                   dtype_bytes[d]);
    printf("%-7s  %8zu  %14" PRIu64 "\n", "total", nt, ddo_checkpoint_total_bytes(ck));
    print_blocks(ck);
    print_quant(ck);
}

/* The layers of ComfyUI's quantization layout: format and where it was read (docs/formats.md). */
static void print_quant(const ddo_checkpoint *ck)
{
    size_t nq = ddo_checkpoint_quant_layer_count(ck);
    if (nq == 0)
        return;
    int layer_w = 15;
    for (size_t i = 0; i < nq; i++) {
        size_t n = esc_len(ddo_checkpoint_quant_layer(ck, i)->layer);
        if (n > (size_t)layer_w)
            layer_w = n > NAME_COLUMN_MAX ? NAME_COLUMN_MAX : (int)n;
    }
    printf("\n%-*s  %-16s  %-22s  %14s\n", layer_w, "QUANTIZED LAYER", "FORMAT", "SOURCE", "BYTES");
    for (size_t i = 0; i < nq; i++) {
        const ddo_quant_layer *q = ddo_checkpoint_quant_layer(ck, i);
        /* the layer's own tensors (the older layout's marker is shared by every layer) */
        const size_t parts[] = { q->weight, q->weight_scale, q->weight_scale_2, q->input_scale,
                                 strcmp(q->source, "comfy_quant") == 0 ? q->marker : SIZE_MAX };
        uint64_t bytes = 0;
        for (size_t k = 0; k < sizeof(parts) / sizeof(parts[0]); k++)
            if (parts[k] != SIZE_MAX)
                bytes += ddo_checkpoint_tensor(ck, parts[k])->nbytes;
        put_esc(q->layer, layer_w);
        printf("  %-16s  %-22s  %14" PRIu64 "\n", q->format, q->source, bytes);
    }
}

static void print_blocks(const ddo_checkpoint *ck)
{
    size_t ng = ddo_checkpoint_block_group_count(ck);
    if (ng == 0) {
        printf("\nblock groups: none\n");
        return;
    }
    int prefix_w = 6;
    for (size_t i = 0; i < ng; i++) {
        size_t n = esc_len(ddo_checkpoint_block_group(ck, i)->prefix);
        if (n > (size_t)prefix_w)
            prefix_w = n > NAME_COLUMN_MAX ? NAME_COLUMN_MAX : (int)n;
    }
    printf("\n%-*s  %6s  %15s  %14s\n", prefix_w, "BLOCKS", "COUNT", "BYTES/BLOCK", "TOTAL");
    for (size_t i = 0; i < ng; i++) {
        const ddo_block_group *g = ddo_checkpoint_block_group(ck, i);
        put_esc(g->prefix, prefix_w);
        printf("  %6zu  %15" PRIu64 "  %14" PRIu64 "\n", g->count, g->bytes_per_block,
               g->total_bytes);
    }
}

int ddo_cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0, codec = 0, verify = 0;
    uint64_t threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--codec") == 0) {
            codec = 1;
        } else if (strcmp(a, "--verify") == 0) {
            verify = 1;
        } else if (strcmp(a, "--threads") == 0) {
            if (tool_flag_count("inspect", a, i + 1 < argc ? argv[i + 1] : NULL, 1, 1024,
                                &threads) != 0)
                return DDO_EXIT_USAGE;
            i++;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return DDO_EXIT_OK;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "ddo inspect: unknown option '");
            fput_esc(stderr, a, 0);
            fprintf(stderr, "'\n");
            usage(stderr);
            return DDO_EXIT_USAGE;
        } else if (path != NULL) {
            fprintf(stderr, "ddo inspect: more than one PATH ('");
            fput_esc(stderr, path, 0);
            fprintf(stderr, "' and '");
            fput_esc(stderr, a, 0);
            fprintf(stderr, "')\n");
            usage(stderr);
            return DDO_EXIT_USAGE;
        } else {
            path = a;
        }
    }
    if (path == NULL) {
        fprintf(stderr, "ddo inspect: missing PATH\n");
        usage(stderr);
        return DDO_EXIT_USAGE;
    }

    ddo_checkpoint *ck = NULL;
    int rc = ddo_checkpoint_create(path, DDO_READ_DEFAULT, &ck);
    if (rc != 0) {
        fprintf(stderr, "ddo inspect: %s\n", ddo_last_error());
        return DDO_EXIT_FAILURE;
    }
    if (codec) {
        rc = ddo_tool_inspect_codec(ck, (unsigned)threads, verify != 0, json != 0);
        ddo_checkpoint_destroy(ck);
        if (rc == DDO_EXIT_OK && (fflush(stdout) != 0 || ferror(stdout))) {
            fprintf(stderr, "ddo inspect: cannot write the output\n");
            return DDO_EXIT_FAILURE;
        }
        return rc;
    }
    if (json) {
        char *text = NULL;
        rc = ddo_checkpoint_to_json(ck, &text);
        if (rc != 0) {
            fprintf(stderr, "ddo inspect: %s\n", ddo_checkpoint_error(ck));
            ddo_checkpoint_destroy(ck);
            return DDO_EXIT_FAILURE;
        }
        printf("%s\n", text);
        ddo_free(text);
    } else {
        print_human(ck, path);
    }
    ddo_checkpoint_destroy(ck);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "ddo inspect: cannot write the output\n");
        return DDO_EXIT_FAILURE;
    }
    return DDO_EXIT_OK;
}
