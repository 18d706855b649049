/*
 * synth.h - writes synthetic checkpoints with the exact tensor names, shapes
 * and dtypes of a real architecture layout (data/layouts/NAME.json), filled
 * with deterministic pseudo-random finite values.
 */
#ifndef DDO_TOOL_SYNTH_H
#define DDO_TOOL_SYNTH_H

#include "ddo.h"

#include <stddef.h>
#include <stdint.h>

/*
 * Writes one .safetensors file at out_path from the layout JSON at layout_path.
 * scale (0 < scale <= 1) shrinks every dimension proportionally: d -> max(1, round(d*scale)).
 * The same (layout, scale, seed) always gives the same bytes. *bytes_written may be NULL.
 * Returns 0 or a negative DDO_E_* code; the message is printed to stderr by the caller
 * from the text written into err (err may be NULL).
 */
int ddo_tool_synth(const char *layout_path, const char *out_path, double scale, uint64_t seed,
                   uint64_t *bytes_written, char *err, size_t err_len);

/*
 * The values a synthetic checkpoint holds: uniform (the default: exponents in a narrow band)
 * or normal (shaped like trained weights: per tensor a Gaussian of standard deviation
 * 1/sqrt(fan_in), fan_in the product of every dimension after the first, or the only one).
 * Both are counter based: the same bytes whatever the core count.
 */
typedef enum ddo_tool_values { DDO_TOOL_VALUES_UNIFORM, DDO_TOOL_VALUES_NORMAL } ddo_tool_values;

/* ddo_tool_synth with a choice of values, generated on `threads` threads (0: the online CPU
 * count; at most 256); the bytes do not depend on the thread count. ddo_tool_synth uses 0.
 * quant (DDO_DTYPE_COUNT: none), for a .gguf output only (ignored otherwise): a GGML block type
 * that every 2-D BF16/F16/F32 tensor whose rows are whole blocks takes (as GGUF quantizers leave
 * 1-D tensors and odd rows in float). */
int ddo_tool_synth_values(const char *layout_path, const char *out_path, double scale,
                          uint64_t seed, ddo_tool_values values, unsigned threads, ddo_dtype quant,
                          uint64_t *bytes_written, char *err, size_t err_len);

/* The layout file the demo uses, resolved against the install/source tree; NULL if absent. */
const char *ddo_tool_default_layout(void);

#endif /* DDO_TOOL_SYNTH_H */
