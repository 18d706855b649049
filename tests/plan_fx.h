/*
 * plan_fx.h - fixtures of the planner tests: tensor tables built in memory
 * (data = NULL, planning only), the LTX-like table of the upstream worked
 * examples, and helpers to build plans and read their decisions.
 */
#ifndef DDO_PLAN_FX_H
#define DDO_PLAN_FX_H

#include "ddo.h"
#include "ddo_compat.h"
#include "plan/plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fx_table {
    ddo_tensor_desc *t;
    uint64_t (*shapes)[DDO_MAX_DIMS];
    char **names;
    size_t n, cap;
} fx_table;

static inline void fx_add(fx_table *tb, ddo_dtype dt, const char *name, uint32_t ndim, ...)
{
    if (tb->n == tb->cap) {
        size_t cap = tb->cap ? tb->cap * 2 : 64;
        tb->t = realloc(tb->t, cap * sizeof(*tb->t));
        tb->shapes = realloc(tb->shapes, cap * sizeof(*tb->shapes));
        tb->names = realloc(tb->names, cap * sizeof(*tb->names));
        if (tb->t == NULL || tb->shapes == NULL || tb->names == NULL)
            abort();
        tb->cap = cap;
    }
    va_list ap;
    va_start(ap, ndim);
    for (uint32_t i = 0; i < ndim; i++)
        tb->shapes[tb->n][i] = va_arg(ap, uint64_t);
    va_end(ap);
    size_t len = strlen(name);
    tb->names[tb->n] = malloc(len + 1);
    if (tb->names[tb->n] == NULL)
        abort();
    memcpy(tb->names[tb->n], name, len + 1);
    tb->t[tb->n].name = tb->names[tb->n];
    tb->t[tb->n].dtype = dt;
    tb->t[tb->n].ndim = ndim;
    tb->t[tb->n].shape = NULL;
    tb->t[tb->n].data = NULL;
    tb->n++;
}

/* printf-style name. */
static inline void fx_addf(fx_table *tb, ddo_dtype dt, uint32_t ndim, uint64_t d0, uint64_t d1,
                           const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    if (ndim == 1)
        fx_add(tb, dt, name, 1, d0);
    else
        fx_add(tb, dt, name, 2, d0, d1);
}

static inline ddo_checkpoint *fx_checkpoint(fx_table *tb)
{
    for (size_t i = 0; i < tb->n; i++)
        tb->t[i].shape = tb->shapes[i];
    ddo_checkpoint *ck = NULL;
    if (ddo_checkpoint_create_from_memory(tb->t, tb->n, &ck) != 0) {
        fprintf(stderr, "  fx_checkpoint: %s\n", ddo_last_error());
        return NULL;
    }
    return ck;
}

static inline void fx_free(fx_table *tb)
{
    for (size_t i = 0; i < tb->n; i++)
        free(tb->names[i]);
    free(tb->t);
    free(tb->shapes);
    free(tb->names);
    memset(tb, 0, sizeof(*tb));
}

/*
 * The LTX-like table of the balanced policy's worked examples (docs/plan.md): four always-resident
 * modules outside the blocks and 48 transformer blocks, each holding 0.500488 GiB of large 2-D
 * weights (W = 24.0234 GiB) and 224 KiB of biases, norms and tables, 0.5007 GiB in all.
 */
static inline void fx_ltx(fx_table *tb)
{
    const ddo_dtype B = DDO_DTYPE_BF16;
    fx_addf(tb, B, 2, 4096, 128, "proj_in.weight");
    fx_addf(tb, B, 1, 4096, 0, "proj_in.bias");
    fx_addf(tb, B, 2, 4096, 256, "time_embed.linear_1.weight");
    fx_addf(tb, B, 1, 4096, 0, "time_embed.linear_1.bias");
    static const char *const attn[] = { "attn1", "attn2" };
    static const char *const proj[] = { "to_q", "to_k", "to_v", "to_out.0" };
    for (int b = 0; b < 48; b++) {
        fx_addf(tb, B, 2, 6, 4096, "transformer_blocks.%d.scale_shift_table", b);
        fx_addf(tb, B, 2, 5, 4096, "transformer_blocks.%d.audio_scale_shift_table", b);
        for (int a = 0; a < 2; a++) {
            for (int p = 0; p < 4; p++) {
                uint64_t in = (a == 1 && p == 1) ? 4160 : 4096;
                fx_addf(tb, B, 2, 4096, in, "transformer_blocks.%d.%s.%s.weight", b, attn[a],
                        proj[p]);
                fx_addf(tb, B, 1, 4096, 0, "transformer_blocks.%d.%s.%s.bias", b, attn[a], proj[p]);
            }
            fx_addf(tb, B, 1, 4096, 0, "transformer_blocks.%d.%s.norm_q.weight", b, attn[a]);
            fx_addf(tb, B, 1, 4096, 0, "transformer_blocks.%d.%s.norm_k.weight", b, attn[a]);
        }
        fx_addf(tb, B, 2, 16384, 4096, "transformer_blocks.%d.ff.net.0.proj.weight", b);
        fx_addf(tb, B, 1, 16384, 0, "transformer_blocks.%d.ff.net.0.proj.bias", b);
        fx_addf(tb, B, 2, 4096, 16384, "transformer_blocks.%d.ff.net.2.weight", b);
        fx_addf(tb, B, 1, 4096, 0, "transformer_blocks.%d.ff.net.2.bias", b);
    }
    fx_addf(tb, B, 2, 8192, 4096, "norm_out.linear.weight");
    fx_addf(tb, B, 2, 128, 4096, "proj_out.weight");
    fx_addf(tb, B, 1, 128, 0, "proj_out.bias");
}

/* The one_shot_fast configuration of the worked examples (upstream's from_env patterns). */
static inline ddo_config *fx_one_shot_fast(void)
{
    ddo_config *cfg = NULL;
    if (ddo_config_create(&cfg) != 0)
        return NULL;
    /* The worked examples' small-tensor threshold is upstream's from_env one, 1 MiB. */
    if (ddo_config_apply_preset(cfg, "linear", "one_shot_fast") != 0 ||
        ddo_config_set(cfg, "small_tensor_threshold_bytes", "1048576") != 0 ||
        ddo_config_set(cfg, "always_resident_modules_pattern",
                       "(^|\\.)(proj_in|time_embed|prompt_adaln|norm_out|proj_out)(\\.|$)") != 0) {
        fprintf(stderr, "  fx_one_shot_fast: %s\n", ddo_last_error());
        ddo_config_destroy(cfg);
        return NULL;
    }
    return cfg;
}

static inline const char *fx_decision(const ddo_plan *plan, const char *key)
{
    const char *v = ddo__plan_decision_get(plan, key);
    return v != NULL ? v : "(absent)";
}

static inline uint64_t fx_gib(double g)
{
    return (uint64_t)(g * 1073741824.0);
}

#endif /* DDO_PLAN_FX_H */
