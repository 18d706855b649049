/*
 * ddo.h - the core public header of libddo (checkpoint, configuration, device and stream,
 * plan, session, metrics).
 *
 * The header comes in three tiers, one file each:
 *   ddo.h        the core: every host needs it; the ABI rules below hold for it.
 *   ddo_host.h   the host layer built on the core: setup from a configuration, capacity
 *                profiles, Diffusers pipelines, measurement and host facts. Includes ddo.h.
 *   ddo_compat.h names kept for hosts written against the compatible settings surface, and
 *                controls that act only on Windows or do nothing by default; no promise that
 *                they stay. Includes ddo.h.
 *
 * ddo streams the weights of a safetensors checkpoint into device memory just
 * before a host program needs them, inside hard budgets for device memory,
 * retained host memory and registered (pinned) host memory.
 *
 * Conventions:
 *   - Every fallible function returns int: 0 or a negative DDO_E_* code.
 *     Out-parameters are written only on success; handles are set to NULL on
 *     failure. Its comment lists the codes it returns ("Errors:"); any of them
 *     may also return DDO_E_INTERNAL, which means a broken invariant of the
 *     library (a bug to report), and is not listed.
 *   - The one-line detail of the most recent failure is kept on the handle
 *     that failed (ddo_<object>_error()) and, for every call, on the calling
 *     thread (ddo_last_error()), readable until the next failing call.
 *   - Lifecycles are _create / _destroy; _destroy(NULL) is a no-op.
 *   - The library never prints, aborts or reads the environment by itself.
 *   - Sizes are bytes, durations nanoseconds, "gb" values GiB (bytes / 2^30).
 *
 * Thread-safety: unless a comment says otherwise, one thread at a time per
 * handle; distinct handles may be used from distinct threads.
 *
 * Structs that grow (the ABI rule). Every struct the caller fills for the library —
 * ddo_device_options with its per-device blocks ddo_cpu_options and ddo_cuda_options,
 * ddo_plan_inputs, ddo_session_options, ddo_setup_options, ddo_profile_calibration — starts
 * with `size_t size`: the caller sets it to sizeof the struct as its own ddo.h declares it,
 * by initialising with the struct's DDO_<NAME>_INIT macro (which zeroes every other field),
 * e.g. `ddo_session_options o = DDO_SESSION_OPTIONS_INIT;`; a binding sets the size of its
 * own mirror. The library reads the fields that lie wholly within size and gives every field
 * past it its default, which is always the field's zero value; so a program built against an
 * older ddo.h keeps working when fields are added (they are only ever added at the end, past
 * the previous sizeof). A size below sizeof(size_t), above the library's own sizeof (a program
 * built against a newer ddo.h) or not a multiple of the alignment of size_t is refused with
 * DDO_E_INVALID_ARGUMENT naming the struct. Where the library writes such a struct
 * (ddo_plan_info_get; ddo_host.h: ddo_plan_inputs_from_caps, ddo_setup_plan_inputs,
 * ddo_setup_profile_record), it
 * writes only the fields within the caller's size. ddo_struct_size reports the library's sizes.
 * Structs the library fills for the caller (ddo_device_caps, ddo_unit_info, ...) or returns
 * pointers to keep their layout within a minor version.
 */
#ifndef DDO_H
#define DDO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Export macro and version                                                  */
/* ------------------------------------------------------------------------ */

#if defined(_WIN32) && defined(DDO_SHARED_BUILD)
#    define DDO_API __declspec(dllexport)
#elif defined(_WIN32) && defined(DDO_SHARED)
#    define DDO_API __declspec(dllimport)
#elif defined(__GNUC__)
#    define DDO_API __attribute__((visibility("default")))
#else
#    define DDO_API
#endif

/* The one place the version is written: CMake (CMakeLists.txt), the wheel's metadata
 * (python/build_backend/ddo_build.py) and the Python package (python/ddo/_enums.py, generated)
 * read these three lines. */
#define DDO_VERSION_MAJOR    0
#define DDO_VERSION_MINOR    1
#define DDO_VERSION_PATCH    0
#define DDO_VERSION_NUMBER   (DDO_VERSION_MAJOR * 10000 + DDO_VERSION_MINOR * 100 + DDO_VERSION_PATCH)
#define DDO_VERSION_TEXT_(x) #x
#define DDO_VERSION_TEXT(x)  DDO_VERSION_TEXT_(x)
#define DDO_VERSION_STRING              \
    DDO_VERSION_TEXT(DDO_VERSION_MAJOR) \
    "." DDO_VERSION_TEXT(DDO_VERSION_MINOR) "." DDO_VERSION_TEXT(DDO_VERSION_PATCH)

/* The initialiser of a struct that grows (see above): its size set, every other field zero. */
#define DDO_STRUCT_INIT(type) \
    {                         \
        .size = sizeof(type)  \
    }

/* The library's version, "MAJOR.MINOR.PATCH"; never NULL. */
DDO_API const char *ddo_version_string(void);
/* DDO_VERSION_NUMBER of the library actually linked. */
DDO_API unsigned ddo_version_number(void);

/* ------------------------------------------------------------------------ */
/* Errors. Values never change once released; new codes go at the end.      */
/* ------------------------------------------------------------------------ */

#define DDO_ERRORS(X)                                                              \
    X(DDO_E_INVALID_ARGUMENT, -1, "invalid argument")                              \
    X(DDO_E_NO_MEMORY, -2, "out of host memory")                                   \
    X(DDO_E_IO, -3, "input/output error")                                          \
    X(DDO_E_FORMAT, -4, "malformed checkpoint")                                    \
    X(DDO_E_FILE_CHANGED, -5, "checkpoint file changed after it was opened")       \
    X(DDO_E_NOT_FOUND, -6, "not found")                                            \
    X(DDO_E_UNSUPPORTED, -7, "not supported")                                      \
    X(DDO_E_CONFIG, -8, "invalid configuration")                                   \
    X(DDO_E_BUDGET, -9, "budget exceeded")                                         \
    X(DDO_E_DEVICE, -10, "device operation failed")                                \
    X(DDO_E_NO_DEVICE, -11, "no usable device (no CUDA driver or no GPU)")         \
    X(DDO_E_DEVICE_MEMORY, -12, "out of device memory")                            \
    X(DDO_E_STATE, -13, "operation not valid in the current state")                \
    X(DDO_E_BUSY, -14, "resource busy")                                            \
    X(DDO_E_UNSAFE, -15, "resource left in an unsafe state by an earlier failure") \
    X(DDO_E_OVERFLOW, -16, "size overflow")                                        \
    X(DDO_E_TIMEOUT, -17, "timed out")                                             \
    X(DDO_E_CANCELLED, -18, "cancelled")                                           \
    X(DDO_E_INTERNAL, -19, "internal error")

enum ddo_error {
    DDO_OK = 0,
#define DDO_ERROR_ENUM_(name, value, text) name = value,
    DDO_ERRORS(DDO_ERROR_ENUM_)
#undef DDO_ERROR_ENUM_
};

/* A short English description of an error code ("unknown error" if none). */
DDO_API const char *ddo_strerror(int code);
/* The code's name, e.g. "DDO_E_FORMAT" ("DDO_OK" for 0, "DDO_E_UNKNOWN" if none). */
DDO_API const char *ddo_errname(int code);
/* The detail of the most recent failed call on this thread ("" if none). */
DDO_API const char *ddo_last_error(void);

/* Frees memory the library returned to the caller (JSON text and the like). */
DDO_API void ddo_free(void *p);

/*
 * sizeof() of a public struct as this library was built ("ddo_tensor_info",
 * "ddo_config_item", ...), 0 for an unknown name: lets a binding that mirrors the layouts
 * (ctypes) refuse a library whose layouts differ from its own, instead of corrupting memory.
 */
DDO_API size_t ddo_struct_size(const char *name);

/* ------------------------------------------------------------------------ */
/* Data types                                                                */
/* ------------------------------------------------------------------------ */

typedef enum ddo_dtype {
    DDO_DTYPE_BOOL,
    DDO_DTYPE_U8,
    DDO_DTYPE_I8,
    DDO_DTYPE_F8_E5M2,
    DDO_DTYPE_F8_E4M3,
    DDO_DTYPE_F8_E8M0,
    DDO_DTYPE_I16,
    DDO_DTYPE_U16,
    DDO_DTYPE_F16,
    DDO_DTYPE_BF16,
    DDO_DTYPE_I32,
    DDO_DTYPE_U32,
    DDO_DTYPE_F32,
    DDO_DTYPE_F64,
    DDO_DTYPE_I64,
    DDO_DTYPE_U64,
    /* Added later, so appended (the values above never change): the rest of the official
     * safetensors Dtype list. F4 (4 bits) and F6_* (6 bits) are sub-byte types: a tensor's
     * bits must fill whole bytes, and ddo_dtype_size() returns 0 for them. All of these are
     * moved as bytes; ddo never computes on them. */
    DDO_DTYPE_F4,
    DDO_DTYPE_F6_E2M3,
    DDO_DTYPE_F6_E3M2,
    DDO_DTYPE_F8_E4M3FNUZ,
    DDO_DTYPE_F8_E5M2FNUZ,
    DDO_DTYPE_C64,
    /* GGML block types (GGUF files; ddo's own extension): a tensor of these is stored as blocks
     * of ddo_dtype_block() elements along its last (innermost) dimension, which must be a
     * multiple of the block; ddo_dtype_size() returns 0 for them. Named as GGML names them. */
    DDO_DTYPE_Q4_0,
    DDO_DTYPE_Q4_1,
    DDO_DTYPE_Q5_0,
    DDO_DTYPE_Q5_1,
    DDO_DTYPE_Q8_0,
    DDO_DTYPE_Q8_1,
    DDO_DTYPE_Q2_K,
    DDO_DTYPE_Q3_K,
    DDO_DTYPE_Q4_K,
    DDO_DTYPE_Q5_K,
    DDO_DTYPE_Q6_K,
    DDO_DTYPE_Q8_K,
    DDO_DTYPE_IQ2_XXS,
    DDO_DTYPE_IQ2_XS,
    DDO_DTYPE_IQ3_XXS,
    DDO_DTYPE_IQ1_S,
    DDO_DTYPE_IQ4_NL,
    DDO_DTYPE_IQ3_S,
    DDO_DTYPE_IQ2_S,
    DDO_DTYPE_IQ4_XS,
    DDO_DTYPE_IQ1_M,
    DDO_DTYPE_TQ1_0,
    DDO_DTYPE_TQ2_0,
    DDO_DTYPE_MXFP4,
    DDO_DTYPE_NVFP4,
    DDO_DTYPE_COUNT
} ddo_dtype;

/* The safetensors name of a dtype ("BF16"), or NULL when out of range. */
DDO_API const char *ddo_dtype_name(ddo_dtype dtype);
/* Bytes per element (1 for BOOL and the F8 types), 0 when out of range. */
DDO_API size_t ddo_dtype_size(ddo_dtype dtype);
/* Parses a dtype name (exact, case-sensitive): a safetensors name or a GGML block type's.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_NOT_FOUND (unknown name). */
DDO_API int ddo_dtype_from_name(const char *name, ddo_dtype *out);
/* Elements per block of a GGML block type (32 for Q8_0, 256 for Q4_K) and, in *block_bytes
 * (may be NULL), the bytes of one block (34, 144); 0 for element types and out of range. */
DDO_API size_t ddo_dtype_block(ddo_dtype dtype, size_t *block_bytes);

/* ------------------------------------------------------------------------ */
/* Checkpoint: safetensors files, sharded sets, or host memory               */
/* ------------------------------------------------------------------------ */

typedef struct ddo_checkpoint ddo_checkpoint;

typedef enum ddo_read_backend {
    DDO_READ_DEFAULT = 0, /* "" : the library default, which is pread */
    DDO_READ_PREAD,       /* "pread" */
    DDO_READ_MMAP         /* "mmap" */
} ddo_read_backend;

#define DDO_MAX_DIMS 8

typedef struct ddo_tensor_info {
    const char *name;
    ddo_dtype dtype;
    uint32_t ndim;
    uint64_t shape[DDO_MAX_DIMS];
    uint32_t file_index; /* index into the checkpoint's files; UINT32_MAX for host memory */
    uint64_t offset;     /* absolute offset of the first byte in its file */
    uint64_t nbytes;
    const void *host_data; /* host-memory tensors only, else NULL */
} ddo_tensor_info;

typedef struct ddo_file_info {
    const char *path;
    uint64_t size;         /* bytes */
    uint64_t header_bytes; /* the JSON header's length (without the 8-byte prefix) */
    uint64_t data_offset;  /* 8 + header_bytes */
} ddo_file_info;

typedef struct ddo_block_group {
    const char *prefix;       /* e.g. "transformer_blocks" */
    size_t count;             /* number of blocks prefix.0 .. prefix.N */
    uint64_t bytes_per_block; /* the largest block's bytes */
    uint64_t total_bytes;
} ddo_block_group;

/*
 * Opens a checkpoint: a .safetensors file, a *.safetensors.index.json sharded
 * set, or a directory holding either in the Diffusers/Transformers layout.
 * Every file is validated strictly before any tensor is used. Tensors are in
 * checkpoint order (file order, then data offset). On failure *out is NULL and
 * ddo_last_error() names the file, the tensor and the rule broken.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL or empty path, unknown backend),
 * DDO_E_NOT_FOUND (no such file; a directory without a checkpoint), DDO_E_IO,
 * DDO_E_FORMAT (a malformed file or index, not a regular file), DDO_E_UNSUPPORTED
 * (a tensor of more than DDO_MAX_DIMS dimensions), DDO_E_OVERFLOW (the tensors'
 * total exceeds 64 bits), DDO_E_FILE_CHANGED (a file changed while it was read),
 * DDO_E_NO_MEMORY.
 */
DDO_API int ddo_checkpoint_create(const char *path, ddo_read_backend backend, ddo_checkpoint **out);

/* Describes one tensor held in host memory by the caller (see below). The array's element
 * size travels with the call (ddo_checkpoint_create_from_memory is a macro passing
 * sizeof(ddo_tensor_desc)), so fields can be appended: a library reads the fields an older
 * caller's elements hold and takes zero for the rest. */
typedef struct ddo_tensor_desc {
    const char *name;
    ddo_dtype dtype;
    uint32_t ndim;
    const uint64_t *shape;
    const void *data; /* may be NULL for planning only */
} ddo_tensor_desc;

/*
 * Builds a checkpoint whose tensors live in host memory the caller owns and
 * keeps immutable and alive until the checkpoint is destroyed (a PyTorch host
 * passing its CPU tensors; tests and fuzzers building tables). Names are
 * copied. Duplicate names are rejected.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL tensors with a count, no name, an unknown dtype,
 * too many dimensions, elements that do not fill whole bytes, a duplicate name),
 * DDO_E_OVERFLOW (a size or the total exceeds 64 bits), DDO_E_NO_MEMORY; DDO_E_INVALID_ARGUMENT
 * also for a desc_size smaller than the first version's 40 bytes (on LP64), not a multiple
 * of a pointer's size, or larger than this library's sizeof(ddo_tensor_desc).
 * desc_size is the size of one element of tensors as the caller built them (a binding passes
 * its mirror's size; C callers use the macro).
 */
DDO_API int ddo_checkpoint_create_from_memory_sized(const ddo_tensor_desc *tensors, size_t count,
                                                    size_t desc_size, ddo_checkpoint **out);
#define ddo_checkpoint_create_from_memory(tensors, count, out) \
    ddo_checkpoint_create_from_memory_sized((tensors), (count), sizeof(ddo_tensor_desc), (out))

DDO_API void ddo_checkpoint_destroy(ddo_checkpoint *ck);

DDO_API size_t ddo_checkpoint_tensor_count(const ddo_checkpoint *ck);
/* The i-th tensor; NULL when out of range. Valid until destroy. */
DDO_API const ddo_tensor_info *ddo_checkpoint_tensor(const ddo_checkpoint *ck, size_t i);
/* Index of the tensor named name. Errors: DDO_E_INVALID_ARGUMENT (NULL argument),
 * DDO_E_NOT_FOUND (no such tensor). */
DDO_API int ddo_checkpoint_find(const ddo_checkpoint *ck, const char *name, size_t *index);
DDO_API size_t ddo_checkpoint_file_count(const ddo_checkpoint *ck);
DDO_API const ddo_file_info *ddo_checkpoint_file(const ddo_checkpoint *ck, size_t i);
DDO_API uint64_t ddo_checkpoint_total_bytes(const ddo_checkpoint *ck);
/* __metadata__ entries of all files (sharded: the index's "metadata" strings first). */
DDO_API size_t ddo_checkpoint_metadata_count(const ddo_checkpoint *ck);
/* Entry i (strings valid until destroy). Errors: DDO_E_INVALID_ARGUMENT (NULL argument, i out of
 * range). */
DDO_API int ddo_checkpoint_metadata(const ddo_checkpoint *ck, size_t i, const char **key,
                                    const char **value);
/* Block groups: outermost numbered groups prefix.N with >= 2 members holding bytes. */
DDO_API size_t ddo_checkpoint_block_group_count(const ddo_checkpoint *ck);
DDO_API const ddo_block_group *ddo_checkpoint_block_group(const ddo_checkpoint *ck, size_t i);

/*
 * A layer stored in ComfyUI's safetensors quantization layout (ddo's own extension;
 * docs/formats.md): <layer>.weight with its scales and a format read from <layer>.comfy_quant
 * or the __metadata__ entry _quantization_metadata, or the older layout (F8 weights, F32
 * <layer>.scale_weight, a scaled_fp8 marker tensor). Found and validated when a checkpoint of
 * files is opened (a malformed layout refuses the checkpoint, DDO_E_FORMAT); the tensors keep
 * their stored dtypes and bytes, and the names put a layer's tensors in one module (one unit).
 */
typedef struct ddo_quant_layer {
    const char *layer;  /* the weight's name without ".weight" */
    const char *format; /* "float8_e4m3fn", "nvfp4", ...; "scaled_fp8" for the older layout */
    const char *source; /* "comfy_quant", "_quantization_metadata" or "scaled_fp8" */
    /* Tensor indices, SIZE_MAX when absent: the weight, weight_scale (older layout:
     * scale_weight), weight_scale_2, input_scale (older layout: scale_input), and the marker
     * (the <layer>.comfy_quant tensor, or the scaled_fp8 tensor). */
    size_t weight, weight_scale, weight_scale_2, input_scale, marker;
} ddo_quant_layer;
DDO_API size_t ddo_checkpoint_quant_layer_count(const ddo_checkpoint *ck);
/* Layer i (in weight order); NULL when out of range. Valid until destroy. */
DDO_API const ddo_quant_layer *ddo_checkpoint_quant_layer(const ddo_checkpoint *ck, size_t i);

/*
 * Copies len bytes of tensor i starting at byte offset into dst. The file's
 * identity (device, inode, size, mtime ns) is checked first: a changed file
 * fails with DDO_E_FILE_CHANGED and nothing is read. Short reads and EINTR are
 * retried; large reads are split. Safe to call from several threads at once.
 * Errors: DDO_E_INVALID_ARGUMENT, DDO_E_FILE_CHANGED, DDO_E_IO.
 */
DDO_API int ddo_checkpoint_read(const ddo_checkpoint *ck, size_t i, uint64_t offset, void *dst,
                                size_t len);
/* Re-checks every file's identity. Errors: DDO_E_INVALID_ARGUMENT (NULL ck),
 * DDO_E_FILE_CHANGED (naming the first changed file), DDO_E_IO (a file cannot be examined). */
DDO_API int ddo_checkpoint_check(const ddo_checkpoint *ck);
/* The checkpoint as JSON (the `ddo inspect --json` document). Free with ddo_free.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_NO_MEMORY. */
DDO_API int ddo_checkpoint_to_json(const ddo_checkpoint *ck, char **json);
/* The detail of the last failure on this handle ("" if none). */
DDO_API const char *ddo_checkpoint_error(const ddo_checkpoint *ck);

/* ------------------------------------------------------------------------ */
/* Configuration: the option catalog, presets, environment and --ddo-* flags */
/* ------------------------------------------------------------------------ */

typedef struct ddo_config ddo_config;

typedef enum ddo_option_type {
    DDO_OPTION_BOOL,
    DDO_OPTION_INT,
    DDO_OPTION_SIZE_GB, /* float GiB */
    DDO_OPTION_SIZE_MB, /* float or integer MiB */
    DDO_OPTION_FLOAT,
    DDO_OPTION_STRING,
    DDO_OPTION_ENUM,
    DDO_OPTION_LIST /* regex list, split on ',' or ';' */
} ddo_option_type;

/* One resolved option, as iterated by ddo_config_entry(). */
typedef struct ddo_config_item {
    const char *key;  /* "vmm_source_cache_gb" */
    const char *env;  /* "DDO_VMM_SOURCE_CACHE_GB" */
    const char *flag; /* "--ddo-vmm-source-cache-gb" */
    ddo_option_type type;
    const char *value;  /* canonical text of the resolved value */
    const char *source; /* "default", "preset:NAME", "env:DDO_X", "flag", "api" */
    const char *help;
} ddo_config_item;

/* A config holding the dataclass defaults of DynamicOffloadConfig.
 * Errors: DDO_E_INVALID_ARGUMENT (out is NULL), DDO_E_NO_MEMORY. */
DDO_API int ddo_config_create(ddo_config **out);
DDO_API void ddo_config_destroy(ddo_config *cfg);
/* A deep copy. Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_NO_MEMORY. */
DDO_API int ddo_config_clone(const ddo_config *cfg, ddo_config **out);

/*
 * Applies a preset for a route family: backend "linear" (or NULL) or "vmm";
 * preset "auto", "one_shot_fast", ..., "nvme_baseline". Values it sets get
 * source "preset:NAME". cfg is unchanged on failure.
 * Errors: DDO_E_INVALID_ARGUMENT (cfg or preset NULL), DDO_E_CONFIG (an unknown backend or
 * preset, naming DDO_PRESET), DDO_E_NO_MEMORY.
 */
DDO_API int ddo_config_apply_preset(ddo_config *cfg, const char *backend, const char *preset);
/* Sets a value from text, source "api"; the typed forms need an option of their type (a boolean;
 * a number, whole for integer options; finite). Errors: DDO_E_INVALID_ARGUMENT (NULL argument),
 * DDO_E_NOT_FOUND (unknown key), DDO_E_CONFIG (a bad value or the wrong type), DDO_E_NO_MEMORY. */
DDO_API int ddo_config_set(ddo_config *cfg, const char *key, const char *value);
DDO_API int ddo_config_set_bool(ddo_config *cfg, const char *key, bool value);
DDO_API int ddo_config_set_int(ddo_config *cfg, const char *key, int64_t value);
DDO_API int ddo_config_set_double(ddo_config *cfg, const char *key, double value);
/*
 * Sets a value that wins over the environment and earlier flags (source "argument"): a host's
 * explicit arguments, such as the overrides of the Python enable_offload, which upstream
 * applies on top of the settings it read from DDO_*. Errors: DDO_E_INVALID_ARGUMENT (NULL
 * argument), DDO_E_NOT_FOUND (unknown key; the detail names the nearest key), DDO_E_CONFIG (a bad
 * value), DDO_E_NO_MEMORY.
 */
DDO_API int ddo_config_override(ddo_config *cfg, const char *key, const char *value);
/*
 * A list option from its elements, none of them split, at the rank of ddo_config_override
 * (source "argument") or of ddo_config_set (source "api"): a pattern may hold ',' or ';' (a
 * text value, as DDO_* and --ddo-* flags, is split on both). Empty elements are dropped.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL cfg or key, NULL items with count > 0, a NULL item),
 * DDO_E_NOT_FOUND (unknown key, naming the nearest), DDO_E_CONFIG (not a list option, more
 * elements than a list holds), DDO_E_NO_MEMORY.
 */
DDO_API int ddo_config_override_list(ddo_config *cfg, const char *key, const char *const *items,
                                     size_t count);
DDO_API int ddo_config_set_list(ddo_config *cfg, const char *key, const char *const *items,
                                size_t count);
/* Reads a value (text form valid until the next change of cfg); the typed forms need an option
 * of their type (get_int also reads booleans as 0/1; get_double integers). Errors:
 * DDO_E_INVALID_ARGUMENT (NULL argument, the wrong type), DDO_E_NOT_FOUND (unknown key). */
DDO_API int ddo_config_get(const ddo_config *cfg, const char *key, const char **value);
DDO_API int ddo_config_get_bool(const ddo_config *cfg, const char *key, bool *value);
DDO_API int ddo_config_get_int(const ddo_config *cfg, const char *key, int64_t *value);
DDO_API int ddo_config_get_double(const ddo_config *cfg, const char *key, double *value);
/* Where the value came from ("default", "preset:one_shot_fast", "env:DDO_X", "flag", "api").
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_NOT_FOUND (unknown key). */
DDO_API int ddo_config_source(const ddo_config *cfg, const char *key, const char **source);

/*
 * Applies a NULL-terminated "NAME=VALUE" environment block (pass environ to
 * use the process environment). DDO_PRESET and DDO_BACKEND select the preset
 * first; recognised DDO_* variables then override it (set, even to "", wins).
 * Unknown DDO_* variables produce warnings (see ddo_config_warning_*). cfg is unchanged on
 * failure. Errors: DDO_E_INVALID_ARGUMENT (cfg is NULL), DDO_E_CONFIG (naming the variable),
 * DDO_E_NO_MEMORY.
 */
DDO_API int ddo_config_apply_env(ddo_config *cfg, const char *const *envp);

/*
 * Parses and removes --ddo-* flags from argv (leaving the host's arguments in
 * order, argv[*argc] = NULL). Accepts "--ddo-key value" and "--ddo-key=value";
 * boolean flags may omit the value. --ddo-backend and --ddo-preset select the
 * route. Flags do not merge the environment. cfg and argv are unchanged on failure.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_CONFIG (an unknown flag, a missing or
 * bad value), DDO_E_NO_MEMORY.
 */
DDO_API int ddo_config_parse_args(ddo_config *cfg, int *argc, char **argv);
/* The help text for the --ddo-* flags, generated from the catalog. Static, never NULL. */
DDO_API const char *ddo_config_flags_help(void);

/* Validates and normalises (clamps ratios, worker counts). Errors: DDO_E_INVALID_ARGUMENT (cfg is
 * NULL), DDO_E_CONFIG (with a one-line detail), DDO_E_NO_MEMORY. */
DDO_API int ddo_config_validate(ddo_config *cfg);

/* Iterates the catalog with resolved values (strings valid until cfg changes).
 * ddo_config_entry errors: DDO_E_INVALID_ARGUMENT (NULL argument, i out of range). */
DDO_API size_t ddo_config_count(void);
DDO_API int ddo_config_entry(const ddo_config *cfg, size_t i, ddo_config_item *out);
/* Warnings gathered while applying the environment (unknown DDO_* variables, ...). */
DDO_API size_t ddo_config_warning_count(const ddo_config *cfg);
DDO_API const char *ddo_config_warning(const ddo_config *cfg, size_t i);
/* The resolved settings (with sources and the settings object) as JSON. Free with ddo_free.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_NO_MEMORY. */
DDO_API int ddo_config_to_json(const ddo_config *cfg, char **json);
/* The resolved settings object: requested/effective preset, enabled, plan, pinning, WSL. */
typedef struct ddo_settings {
    const char *requested_preset;
    const char *effective_preset;
    const char *backend; /* "linear" or "vmm" */
    const char *route;   /* "one_shot_fast", "vmm_fast_runtime", "vmm_runtime", ... */
    bool enabled;
    bool plan;
    bool requested_pin_cpu_memory;
    bool effective_pin_cpu_memory;
    bool disable_pin_on_wsl;
    bool running_on_wsl;
} ddo_settings;
/* Errors: DDO_E_INVALID_ARGUMENT (NULL argument). */
DDO_API int ddo_config_settings(const ddo_config *cfg, ddo_settings *out);
DDO_API const char *ddo_config_error(const ddo_config *cfg);

/*
 * Component policies: how a pipeline component (text_encoder, transformer,
 * vae, ...) is run. Routes: "dynamic_offload" (streamed by ddo),
 * "diffusers_group_offload" (group/leaf offload compatibility: ddo streams it
 * as leaf units, or block units for offload_type block_level) and "none"
 * (unmanaged, resident on the execution device); "auto" picks one. Component
 * names are normalised (uppercase, runs of non [A-Z0-9] become '_'; empty is
 * MODEL). Lookup order per option: API policy, then DDO_<COMPONENT>_<OPTION>
 * (environment, then preset), then DDO_RUNNER_<COMPONENT>_<OPTION>; the
 * environment only when captured by ddo_config_apply_env with use_environment.
 * Options: route, group_offload, dynamic_offload, offload_stream,
 * offload_record_stream, offload_type, offload_low_cpu_mem_usage,
 * num_blocks_per_group. Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_NOT_FOUND (another
 * option name), DDO_E_NO_MEMORY.
 */
DDO_API int ddo_config_set_component_policy(ddo_config *cfg, const char *component,
                                            const char *option, const char *value);
/* The resolved text of a component option; source (may be NULL) receives "api", "env:DDO_X",
 * "preset:NAME". Valid until cfg changes. Errors: DDO_E_INVALID_ARGUMENT (NULL argument),
 * DDO_E_NOT_FOUND (an unknown option, or nothing sets it). */
DDO_API int ddo_config_component_value(const ddo_config *cfg, const char *component,
                                       const char *option, const char **value, char *source,
                                       size_t source_len);
typedef struct ddo_component_policy {
    const char *route;            /* "dynamic_offload", "diffusers_group_offload", "none" */
    char route_source[96];        /* "argument", "api", "env:DDO_VAE_ROUTE", "preset:X", "auto" */
    const char *offload_type;     /* group route: "leaf_level" (default) or "block_level" */
    const char *unit_granularity; /* what ddo streams: "block" or "leaf"; "" for none */
    bool use_stream;              /* forced false on WSL with disable_pin_on_wsl */
    bool record_stream;
    bool low_cpu_mem_usage;
    int64_t num_blocks_per_group;
} ddo_component_policy;
/* Resolves a component's route and group options. explicit_route (may be NULL) wins over
 * every policy; quantized_backend routes auto to group offload when dynamic is enabled.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_CONFIG (unknown route word, bad group
 * options, build_profile off the dynamic route). */
DDO_API int ddo_config_component_policy(const ddo_config *cfg, const char *component,
                                        const char *explicit_route, bool quantized_backend,
                                        ddo_component_policy *out);

/* The catalog, presets, routes and resolution rules as text (`ddo config --list`) or as
 * Markdown (docs/options.md). Free with ddo_free. Errors: DDO_E_INVALID_ARGUMENT (text NULL, an
 * unknown format), DDO_E_NO_MEMORY. */
typedef enum ddo_config_doc { DDO_CONFIG_DOC_LIST, DDO_CONFIG_DOC_MARKDOWN } ddo_config_doc;
DDO_API int ddo_config_describe(ddo_config_doc format, char **text);

/* ------------------------------------------------------------------------ */
/* Devices                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct ddo_device ddo_device;
typedef struct ddo_stream ddo_stream;

typedef struct ddo_device_caps {
    char name[128];
    uint64_t total_bytes; /* device memory; 0 = unknown */
    uint64_t free_bytes;  /* at the time of the query */
    size_t granularity;   /* physical allocation granularity (VMM), bytes */
    bool vmm_supported;
    bool is_cpu;
    double bus_bytes_per_s; /* measured or configured host->device bandwidth; 0 = unknown */
    double flops_per_s;     /* configured compute rate (cpu), or on cuda an estimate from the
                               SM count, clock and architecture; 0 = unknown */
    int driver_version;     /* cuDriverGetVersion (13000 = 13.0); 0 on cpu */
    int ordinal;            /* N of cuda:N; 0 on cpu */
} ddo_device_caps;

/* Options of the cpu device (ignored by cuda). Zero means "unthrottled" / defaults. */
typedef struct ddo_cpu_options {
    size_t size;              /* DDO_CPU_OPTIONS_INIT */
    uint64_t memory_bytes;    /* the "device" size; 0 = 64 GiB */
    size_t granularity;       /* 0 = 2 MiB */
    double bytes_per_s;       /* copy throttle; 0 = unthrottled */
    uint64_t copy_latency_ns; /* added per copy */
    double flops_per_s;       /* reference host compute throttle; 0 = as fast as it runs */
    double peer_bytes_per_s;  /* device->device copy throttle into this device (the emulated
                                 link of a device set, docs/multi-gpu.md); 0 = unthrottled */
} ddo_cpu_options;
#define DDO_CPU_OPTIONS_INIT DDO_STRUCT_INIT(ddo_cpu_options)

/* Options of the cuda device (ignored by cpu). */
typedef struct ddo_cuda_options {
    size_t size;              /* DDO_CUDA_OPTIONS_INIT */
    const char *library_path; /* explicit libcuda path (order: this, then library_env, then
                                 discovery: libcuda.so.1) */
    const char *library_env;  /* a driver path a host took from its own setting; ddo's tools
                                 pass none (DDO_VMM_LIBRARY_PATH is not a driver path: the
                                 variable names ddo's own library, docs/cuda.md) */
} ddo_cuda_options;
#define DDO_CUDA_OPTIONS_INIT DDO_STRUCT_INIT(ddo_cuda_options)

/* Options of ddo_device_create: one block per kind of device (NULL = that device's defaults),
 * so a new kind of device adds a block and never moves another's fields. The blocks are read
 * during the call only. */
typedef struct ddo_device_options {
    size_t size;                  /* DDO_DEVICE_OPTIONS_INIT */
    const ddo_cpu_options *cpu;   /* the cpu device's options */
    const ddo_cuda_options *cuda; /* the cuda device's options */
} ddo_device_options;
#define DDO_DEVICE_OPTIONS_INIT DDO_STRUCT_INIT(ddo_device_options)

/*
 * Opens the device named by spec: "cpu", "cpu:N", "cuda", "cuda:N". Each cpu device (cpu:N
 * included) is a separate instance with its own memory and accounting: cpu:0 and cpu:1 emulate
 * two GPUs of a device set (docs/multi-gpu.md). opts may be NULL (defaults); every
 * block it gives is checked (the ABI rule above), also the one the device ignores.
 * Errors: DDO_E_INVALID_ARGUMENT (unknown spec, a struct's size), DDO_E_NO_DEVICE (no CUDA
 * driver, no such GPU, a build without CUDA: "no CUDA driver: ..."), DDO_E_CONFIG (cpu options
 * out of range), DDO_E_DEVICE, DDO_E_DEVICE_MEMORY (the driver's context), DDO_E_NO_MEMORY.
 */
DDO_API int ddo_device_create(const char *spec, const ddo_device_options *opts, ddo_device **out);
DDO_API void ddo_device_destroy(ddo_device *dev);
/* What dev is and has now (free memory at the time of the call). Errors: DDO_E_INVALID_ARGUMENT
 * (NULL argument), DDO_E_DEVICE (the driver's memory query failed). */
DDO_API int ddo_device_caps_get(ddo_device *dev, ddo_device_caps *out);
/* A stream for host work (priority 0 = normal; the copy stream is below). Errors:
 * DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_DEVICE, DDO_E_NO_MEMORY. */
DDO_API int ddo_stream_create(ddo_device *dev, ddo_stream **out);
DDO_API void ddo_stream_destroy(ddo_stream *s);
/* Blocks until all work queued on s is done. Errors: DDO_E_INVALID_ARGUMENT (s is NULL),
 * DDO_E_DEVICE (the work failed). */
DDO_API int ddo_stream_synchronize(ddo_stream *s);
/* The native handle (a CUstream on cuda, NULL on cpu). */
DDO_API void *ddo_stream_native(ddo_stream *s);
/*
 * Borrows a host framework's stream for ddo_session_acquire / release (torch's
 * torch.cuda.current_stream().cuda_stream): on cuda, native is a CUstream of dev's primary
 * context (NULL or 0 = the legacy default stream) which ddo never destroys; on cpu, native
 * must be NULL and the stream is the calling thread: acquire blocks it until the unit's upload
 * is done, and release records that its work is already complete. ddo_stream_destroy ends the
 * borrow. Errors: DDO_E_INVALID_ARGUMENT (dev or out NULL, a native handle on cpu),
 * DDO_E_NO_MEMORY.
 */
DDO_API int ddo_stream_wrap(ddo_device *dev, void *native, ddo_stream **out);
DDO_API const char *ddo_device_error(const ddo_device *dev);

/* ------------------------------------------------------------------------ */
/* Plan                                                                      */
/* ------------------------------------------------------------------------ */

typedef struct ddo_plan ddo_plan;

/* What the planner knows about the machine. Zero fields mean "unknown". */
typedef struct ddo_plan_inputs {
    size_t size;                 /* DDO_PLAN_INPUTS_INIT */
    uint64_t device_total_bytes; /* device memory; 0 = no device limit known */
    uint64_t device_free_bytes;
    size_t device_granularity; /* 0 = 2 MiB */
    bool device_is_cpu;
    bool device_vmm_supported;
    uint64_t host_available_bytes; /* available system RAM; 0 = unknown */
    double bus_bytes_per_s;        /* for the cost model; 0 = no cost columns */
    double flops_per_s;
    uint64_t tokens; /* activation rows for the cost model; 0 = 4096 */
    /* Measured compute per unit, a JSON object {"unit name": seconds, ...} (a profile's
     * recommendation "unit_compute_s"; docs/plan.md "Cost model"), borrowed for the call;
     * NULL = none. Units it names use it instead of the FLOP estimate, and with it a bus rate
     * alone enables the cost model. */
    const char *unit_compute_json;
    /* weight_codec (docs/codec.md, "Estimates"): the plan estimates coded sizes before the
     * store is coded. codec_ratio: coded / raw of the tensors of coded dtypes (what `ddo
     * inspect --codec` measures); 0 = the defaults per dtype (BF16 0.67, F16 0.85, F32 0.83,
     * measured on `ddo synth --values normal`). decode_bytes_per_s: the device decoder's
     * decoded output per second for the cost model; 0 = the default (cuda 400e9, the cpu
     * device's C decoder 0.25e9). */
    double codec_ratio;
    double decode_bytes_per_s;
    /* Device sets (docs/multi-gpu.md): the store device's free memory and the measured
     * device->device rate from it to the computing device (ddo_device_measure_peer); 0 =
     * unknown. */
    uint64_t store_free_bytes;
    double peer_bytes_per_s;
    /* The file's read rate (bytes/s, what the disk delivers to ddo's reads; a profile's
     * measured file_read_bytes_per_s); 0 = unknown. With the cost model on it prices a
     * re-read from the file: the retained store then keeps the units whose re-read would
     * stall most (docs/plan.md, "Retained store and registration"). */
    double file_read_bytes_per_s;
    /* Device memory that other parts of this process hold now and give back before this
     * plan's session takes its own (a staged pipeline's other components, which its stager
     * unloads first: docs/python.md, "Pipelines"); counted as free beside device_free_bytes,
     * after device_memory_limit_gb's and the DXGI budget's caps, never above the device's
     * memory. 0 = none. */
    uint64_t device_reclaimable_bytes;
} ddo_plan_inputs;
#define DDO_PLAN_INPUTS_INIT DDO_STRUCT_INIT(ddo_plan_inputs)

typedef enum ddo_placement {
    DDO_PLACEMENT_RESIDENT,
    DDO_PLACEMENT_STREAMED,
    DDO_PLACEMENT_SKIPPED
} ddo_placement;

/* Why a tensor is resident (DDO_REASON_NONE for streamed/skipped). */
typedef enum ddo_reason {
    DDO_REASON_NONE,
    DDO_REASON_ALWAYS_RESIDENT, /* always_resident_modules_pattern */
    DDO_REASON_SMALL,           /* <= small_tensor_threshold_bytes */
    DDO_REASON_BUDGET,          /* selected under resident_module_budget_gb */
    DDO_REASON_SKIP_PATTERN     /* skipped: skip_modules_pattern */
} ddo_reason;

typedef struct ddo_unit_info {
    const char *name;    /* block ("transformer_blocks.3") or module name */
    size_t first_tensor; /* tensors of a unit are listed by ddo_plan_unit_tensors */
    size_t tensor_count;
    uint64_t bytes;           /* streamed bytes of the unit */
    uint64_t flops_per_token; /* 2 * sum(out*in) of its 2-D weights */
    bool resident;            /* the whole unit was made resident (budget selection) */
    bool retained;            /* bytes kept in the retained store */
    bool registered;          /* retained bytes registered (copy engine reads directly) */
    double transfer_s;        /* predicted; 0 when the cost model is off */
    double compute_s;
    bool hidden; /* transfer hidden behind the previous unit's compute */
} ddo_unit_info;

/* Predicted peaks and limits of every budget, bytes. */
typedef struct ddo_plan_budgets {
    uint64_t device_weights_peak;  /* resident + slots */
    uint64_t device_weights_limit; /* 0 = none */
    uint64_t resident_bytes;
    uint64_t slot_bytes;
    size_t slot_count;
    uint64_t retained_peak;
    uint64_t retained_limit;
    uint64_t registered_peak;
    uint64_t registered_limit;
    uint64_t staging_peak;
    uint64_t staging_window_bytes;
    size_t staging_windows;
    double predicted_step_s; /* 0 when the cost model is off */
} ddo_plan_budgets;

/*
 * Builds a plan: pure (no I/O, no device), deterministic. A plan whose
 * predicted peak exceeds a budget is refused with DDO_E_BUDGET naming the
 * budget, the need, the limit and the option to raise. inputs may be NULL (nothing known).
 * Errors: DDO_E_INVALID_ARGUMENT (ck, cfg or out NULL; inputs' size), DDO_E_CONFIG (an option
 * out of range or inconsistent with the route, a bad or too costly pattern), DDO_E_BUDGET,
 * DDO_E_NO_MEMORY.
 */
DDO_API int ddo_plan_build(const ddo_checkpoint *ck, const ddo_config *cfg,
                           const ddo_plan_inputs *inputs, ddo_plan **out);
DDO_API void ddo_plan_destroy(ddo_plan *plan);

DDO_API size_t ddo_plan_unit_count(const ddo_plan *plan);
/* Unit `unit` in execution order. Errors: DDO_E_INVALID_ARGUMENT (NULL argument, out of range). */
DDO_API int ddo_plan_unit(const ddo_plan *plan, size_t unit, ddo_unit_info *out);
/*
 * weight_codec: the estimated bytes unit moves over the bus when its retained tensors are
 * coded (*coded_bytes; the unit's raw streamed bytes when nothing of it is coded) and the raw
 * bytes its decoder writes (*decoded_bytes, 0 when nothing is coded). Either pointer may be
 * NULL. Errors: DDO_E_INVALID_ARGUMENT (unit out of range).
 */
DDO_API int ddo_plan_unit_coded(const ddo_plan *plan, size_t unit, uint64_t *coded_bytes,
                                uint64_t *decoded_bytes);
/*
 * The cost of reading unit from the file at every use instead of keeping it retained:
 * *read_s, its bytes at the inputs' file_read_bytes_per_s, and *stall_s, the part of that the
 * compute before it cannot hide (what the step loses when it is not retained; docs/plan.md,
 * "Retained store and registration"). Both 0 when the plan knows no file rate or the cost
 * model is off, and for resident units. Either pointer may be NULL. Errors:
 * DDO_E_INVALID_ARGUMENT (unit out of range).
 */
DDO_API int ddo_plan_unit_reread(const ddo_plan *plan, size_t unit, double *read_s,
                                 double *stall_s);
/* Checkpoint tensor indices of a unit, in order. Valid until destroy. */
DDO_API const size_t *ddo_plan_unit_tensors(const ddo_plan *plan, size_t unit, size_t *count);
/* Where a tensor lives on the device: streamed tensors at `offset` inside their unit's slot
 * (VMM: inside the unit's own virtual range), resident tensors at `offset` inside the
 * resident arena. Offsets are aligned to DDO_TENSOR_ALIGN. */
#define DDO_TENSOR_ALIGN 256
typedef struct ddo_tensor_location {
    ddo_placement placement;
    ddo_reason reason;
    size_t unit;     /* SIZE_MAX unless streamed */
    uint64_t offset; /* bytes, within the unit's slot or the resident arena */
    uint64_t nbytes;
} ddo_tensor_location;
/* Errors: DDO_E_INVALID_ARGUMENT (NULL argument, tensor out of range). */
DDO_API int ddo_plan_tensor_location(const ddo_plan *plan, size_t tensor, ddo_tensor_location *out);
/* Errors: DDO_E_INVALID_ARGUMENT (NULL argument). */
DDO_API int ddo_plan_budgets_get(const ddo_plan *plan, ddo_plan_budgets *out);
/* Planner decision labels (key/value), e.g. auto_pin_weight_decision=budgeted; strings valid
 * until destroy. ddo_plan_decision errors: DDO_E_INVALID_ARGUMENT (NULL argument, i out of
 * range). */
DDO_API size_t ddo_plan_decision_count(const ddo_plan *plan);
DDO_API int ddo_plan_decision(const ddo_plan *plan, size_t i, const char **key, const char **value);
/* The plan's route label, for display: the route's name on the VMM routes, the effective
 * preset ("one_shot_fast", ...), "plan" or "off" on the linear route. A host that acts on the
 * route reads ddo_plan_info's route instead. */
DDO_API const char *ddo_plan_route(const ddo_plan *plan);
/* JSON (documented in docs/plan.md). Free with ddo_free. Errors: DDO_E_INVALID_ARGUMENT (NULL
 * argument), DDO_E_NO_MEMORY. */
DDO_API int ddo_plan_to_json(const ddo_plan *plan, char **json);
DDO_API const char *ddo_plan_error(const ddo_plan *plan);
/* Number of tensors the plan places (the checkpoint's tensor count). */
DDO_API size_t ddo_plan_tensor_count(const ddo_plan *plan);

/* The facts of a plan that a session (and a host) acts on, set by the planner; a saved plan
 * read back by ddo_plan_from_json carries the same. Values are only ever added at the end. */
typedef enum ddo_route {
    DDO_ROUTE_LINEAR,     /* slots are device buffers: a unit's addresses change per load */
    DDO_ROUTE_VMM_FAST,   /* vmm_fast_runtime: one physical handle per slot, mapped into each
                           * unit's own virtual range (addresses stable for the session) */
    DDO_ROUTE_VMM_RUNTIME /* vmm_runtime: one handle per weight, mapped into its own range */
} ddo_route;
/* Where a caller's resident tensors (a checkpoint of host tensors) are read from. */
typedef enum ddo_host_residents {
    DDO_HOST_RESIDENTS_NONE,          /* the checkpoint holds no host tensors (files) */
    DDO_HOST_RESIDENTS_BOUNCE_BUFFER, /* uploaded through a pinned bounce buffer */
    DDO_HOST_RESIDENTS_REGISTERED     /* registered in place: the copy engine reads them */
} ddo_host_residents;
/* How streamed weights cross the bus (weight_codec). */
typedef enum ddo_weight_codec {
    DDO_WEIGHT_CODEC_NONE, /* raw */
    DDO_WEIGHT_CODEC_DDOC1 /* coded (ddoc1), decoded on the device */
} ddo_weight_codec;
/* What one streamed unit is (unit_granularity). */
typedef enum ddo_unit_granularity {
    DDO_UNIT_BLOCK, /* a block of a module list ("transformer_blocks.3") */
    DDO_UNIT_LEAF   /* a single leaf module */
} ddo_unit_granularity;
/* How a plan uses a device set (the devices option; docs/multi-gpu.md). */
typedef enum ddo_device_mode {
    DDO_DEVICE_MODE_SINGLE, /* one device; host memory is the store */
    DDO_DEVICE_MODE_DONOR,  /* the first device computes, the second holds every streamed unit
                               (the store): units arrive by device->device copies */
    DDO_DEVICE_MODE_SPLIT   /* every device computes; each reads 1/N of a unit from host memory
                               and an all-gather completes it on every device */
} ddo_device_mode;
typedef struct ddo_plan_info {
    size_t size; /* DDO_PLAN_INFO_INIT */
    ddo_route route;
    /* True on the VMM routes: every streamed tensor keeps one device address for the whole
     * session, so a host may bind it once; false: rebind at every acquire. */
    bool stable_addresses;
    const char *route_label; /* ddo_plan_route's label, for display; valid until destroy */
    ddo_host_residents host_residents;
    ddo_weight_codec weight_codec;
    ddo_unit_granularity unit_granularity;
    /* The device set (docs/multi-gpu.md). */
    ddo_device_mode device_mode;
    size_t device_count;     /* 1 without a set */
    const char *devices;     /* the set, computing device first, comma-separated ("" without one);
                                valid until destroy */
    uint64_t store_bytes;    /* donor: the bytes the store device holds (every streamed unit) */
    uint64_t store_limit;    /* donor: store_device_budget_gb, else the inputs' store_free_bytes;
                                0 = no limit known */
    double peer_bytes_per_s; /* the device->device link: peer_link_gbps, else the inputs'
                                measured figure; 0 = unknown */
    /* True when the retained store could not hold every streamed unit and kept those whose
     * re-read from the file would stall most (ddo_plan_unit_reread); false when it kept all,
     * none, or chose by pin_weight_selection (no file rate or cost model). */
    bool retained_by_stall;
    /* weight_codec DDOC1: with weight_codec_cache_dir set, the tensors streamed from the file
     * are read from their sidecar's coded streams; false when weight_codec=auto found the plan
     * not disk-bound (they are read raw; docs/codec.md, "Sidecar"). False without the codec. */
    bool codec_sidecar;
    /* A plan sized from the device (no budget given): the activation reserve its device weights
     * limit keeps off the device's free memory (0 otherwise), and whether that reserve is the
     * planner's estimate from the plan's units (no auto_vram_headroom_gb nor
     * activation_reserve_gb given): a host may measure the first forward's need and plan again
     * with activation_reserve_gb (the Python binding does, docs/python.md). */
    uint64_t activation_reserve_bytes;
    bool activation_reserve_estimated;
} ddo_plan_info;
#define DDO_PLAN_INFO_INIT DDO_STRUCT_INIT(ddo_plan_info)
/* Writes the plan's facts into *out (the fields within out->size; see the ABI rule).
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument, out's size). */
DDO_API int ddo_plan_info_get(const ddo_plan *plan, ddo_plan_info *out);
/* Rebuilds a plan from the text of ddo_plan_to_json (a saved plan); ddo_plan_to_json of the
 * result reproduces that text exactly. In ddo_plan_budgets a limit of 0 means "no limit".
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_FORMAT (naming the field at fault),
 * DDO_E_NO_MEMORY. */
DDO_API int ddo_plan_from_json(const char *json, ddo_plan **out);

/* Resident selection (docs/plan.md, "Resident selection"), exposed for hosts and tests:
 * fills chosen_idx[0..count) with the indices of the chosen items (greedy, skip on
 * overflow, in the selection's order) and returns their number in *chosen.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL arrays with a count, chosen NULL, DDO_SELECTION_COST:
 * it needs per-unit deficits, which only ddo_plan_build has), DDO_E_NO_MEMORY. */
typedef enum ddo_selection {
    DDO_SELECTION_FIRST,
    DDO_SELECTION_SPREAD,
    DDO_SELECTION_LARGEST,
    DDO_SELECTION_COST
} ddo_selection;
DDO_API int ddo_select_under_budget(const uint64_t *sizes, size_t count, uint64_t budget,
                                    ddo_selection how, size_t *chosen_idx, size_t *chosen);

/* ------------------------------------------------------------------------ */
/* Session: executing a plan                                                 */
/* ------------------------------------------------------------------------ */

typedef struct ddo_session ddo_session;
typedef struct ddo_metrics ddo_metrics;

/* Setup progress: phase ("read", "register", "allocate", "resident", "sidecar" while
 * weight_codec codes file-streamed tensors into their sidecar, and "store" while donor mode
 * fills the store device), done/total bytes. */
typedef void (*ddo_progress_fn)(void *user, const char *phase, uint64_t done, uint64_t total);

typedef struct ddo_session_options {
    size_t size; /* DDO_SESSION_OPTIONS_INIT */
    ddo_progress_fn progress;
    void *progress_user;
    /* The configuration the plan was built from (borrowed during create only; may be
     * NULL): pin_cpu_workers, read_engine, allow_pin_memory_fallback and
     * vmm_execution_backing_reclaim come from it. NULL means 1 worker, the automatic
     * read engine, registration fallback allowed and no automatic reclaim. */
    const ddo_config *config;
    /* Optional trace of what the session does on its own threads (the loader and the copy
     * stream's host thread): kind "upload" (the copy engine's span for one unit: from when it
     * could start — issue time or the previous upload's end — to completion; a coded unit's
     * completes when its decodes have), "map" / "unmap"
     * (a slot's backing moved into / out of a unit's range), "reclaim" (backing released).
     * unit is the plan's unit index, times are CLOCK_MONOTONIC ns, bytes moved or mapped.
     * Called concurrently from several threads: it must be thread-safe and quick. */
    void (*trace)(void *user, const char *kind, size_t unit, uint64_t begin_ns, uint64_t end_ns,
                  uint64_t bytes);
    void *trace_user;
    /* Donor mode (a plan of DDO_DEVICE_MODE_DONOR; docs/multi-gpu.md): the store device, of
     * the same kind as the session's, borrowed for the session's life. Every streamed unit is
     * copied into its memory at create (within the plan's store_limit) and reaches the
     * session's device by device->device copies. NULL: required for a donor plan that streams
     * (store_bytes > 0), refused for any other plan. */
    ddo_device *store_device;
    /* Split mode (a plan of DDO_DEVICE_MODE_SPLIT; docs/multi-gpu.md): the set's devices after
     * the first (the session's), in the plan's order, of the session device's kind, borrowed
     * for the session's life; split_device_count of them (the plan's device_count - 1). Every
     * device holds the same residents and slots; each streamed unit is uploaded to all of them
     * (1/N of each tensor from host memory per device, then an all-gather), and an acquire that
     * returns has it complete on every device. The host's work on the other devices must be
     * complete before it releases a unit. NULL / 0: required for a split plan, refused for any
     * other. */
    ddo_device *const *split_devices;
    size_t split_device_count;
    /* Share mode (docs/multi-gpu.md, "One process per device"): this session is rank
     * share_rank of share_count sessions, one per process and device, that run the same plan
     * (one rank's, given to the others by ddo_plan_from_json) and whose host completes every
     * streamed unit with its own all-gather (torch.distributed over NCCL, say). Of a streamed
     * unit with a share (ddo_session_unit_share), the session uploads from host memory only
     * bytes [share_rank x share, (share_rank + 1) x share) of the unit's view
     * (ddo_session_unit_dlpack) and the tail past share_count shares; a tensor without host
     * bytes (re-read from the file) is uploaded whole. After each acquire of such a unit, and
     * before reading it, the host all-gathers the view's first share_count x share bytes in
     * place, rank r contributing bytes [r x share, (r + 1) x share). share_count 0 or 1: whole
     * units. Refused with a donor or split plan, on vmm_runtime and with weight_codec. */
    size_t share_rank;
    size_t share_count;
} ddo_session_options;
#define DDO_SESSION_OPTIONS_INIT DDO_STRUCT_INIT(ddo_session_options)

/*
 * Creates a session executing plan on dev, reading bytes from ck. Allocates
 * exactly what the plan predicted (every byte through a budget account), reads
 * the retained store, registers the planned share, creates staging windows and
 * execution slots, and uploads resident tensors. The plan, checkpoint and
 * device are borrowed and must outlive the session.
 * Thread-safety: one host thread at a time per session (every ddo_session_*
 * call); the session's own loader thread issues uploads on a copy stream.
 * opts may be NULL. On failure everything taken is given back and *out is NULL.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument, opts' size, a plan that does not fit ck or
 * its own slots), DDO_E_BUDGET (an account refused), DDO_E_NO_MEMORY, DDO_E_IO,
 * DDO_E_FILE_CHANGED (reading the retained store), DDO_E_OVERFLOW, DDO_E_DEVICE,
 * DDO_E_DEVICE_MEMORY, DDO_E_UNSUPPORTED (an operation the device or driver refuses, e.g.
 * VMM).
 */
DDO_API int ddo_session_create(const ddo_plan *plan, const ddo_checkpoint *ck, ddo_device *dev,
                               const ddo_session_options *opts, ddo_session **out);
/* Releases everything safe to release; budget accounts return to zero. With DLPack views
 * alive (ddo_session_tensor_dlpack) the session is freed when the last view is. */
DDO_API void ddo_session_destroy(ddo_session *s);

/*
 * Leases unit for work on stream: the stream waits for the unit's upload (a
 * hit when a ready slot still holds it). Tensor addresses stay valid until
 * ddo_session_release. Errors: DDO_E_INVALID_ARGUMENT (NULL argument, unit out
 * of range), DDO_E_STATE (unloaded, already leased),
 * DDO_E_BUSY (every slot leased, or the mapped budget held by leases), DDO_E_UNSAFE
 * (the unit's range left mapped by a failed release), DDO_E_FILE_CHANGED, DDO_E_IO,
 * DDO_E_BUDGET, DDO_E_NO_MEMORY, DDO_E_DEVICE, DDO_E_DEVICE_MEMORY (the upload's).
 */
DDO_API int ddo_session_acquire(ddo_session *s, size_t unit, ddo_stream *stream);
/* Records that stream's work on unit has been queued; the slot is reusable once it completes.
 * Errors: DDO_E_INVALID_ARGUMENT (as acquire), DDO_E_STATE (not leased), DDO_E_DEVICE
 * (recording the release event; the lease stays). */
DDO_API int ddo_session_release(ddo_session *s, size_t unit, ddo_stream *stream);
/* Device address of a tensor (resident, or streamed and currently leased). Errors:
 * DDO_E_INVALID_ARGUMENT (NULL argument, tensor out of range), DDO_E_NOT_FOUND (skipped
 * tensor), DDO_E_STATE (unloaded, or its unit not leased). */
DDO_API int ddo_session_tensor_address(ddo_session *s, size_t tensor, void **device_ptr);
/*
 * Split mode: the address of a tensor on device `device` of the set (0: the session's, as
 * ddo_session_tensor_address; k: split_devices[k - 1]). Valid while its unit is leased (a
 * resident tensor's until unload); the bytes are the same on every device. Errors: as
 * ddo_session_tensor_address, and DDO_E_INVALID_ARGUMENT (device out of the set's range).
 */
DDO_API int ddo_session_device_tensor_address(ddo_session *s, size_t device, size_t tensor,
                                              void **device_ptr);
/*
 * Copies the bytes of tensor as device `device` of the set holds them (0: the session's own
 * device, with or without a set) into host memory dst (dst_bytes, at least the tensor's nbytes),
 * synchronously: what a host uses to check that every device holds the same bytes. The tensor
 * must be addressable (ddo_session_device_tensor_address) and its upload complete (the acquire's
 * stream synchronised). Errors: as ddo_session_device_tensor_address, DDO_E_INVALID_ARGUMENT
 * (dst NULL or too small), DDO_E_DEVICE (the copy).
 */
DDO_API int ddo_session_device_tensor_read(ddo_session *s, size_t device, size_t tensor, void *dst,
                                           size_t dst_bytes);
/*
 * The session-long address of a tensor on the VMM routes (its unit's own virtual range, or its
 * weight's on vmm_runtime), without a lease: what a host binds once. The bytes are there only
 * while the unit is leased. Errors: DDO_E_UNSUPPORTED on the linear route (addresses change per
 * lease), DDO_E_NOT_FOUND (skipped tensor), DDO_E_INVALID_ARGUMENT (NULL argument, tensor out of
 * range).
 */
DDO_API int ddo_session_tensor_stable_address(ddo_session *s, size_t tensor, void **device_ptr);
/*
 * Every tensor address of unit in ddo_plan_unit_tensors order (ptrs[0..*n)): stable ones on
 * the VMM routes, the leased slot's on linear (which must be leased). *n is set to the tensor
 * count even when cap is too small. Errors: DDO_E_INVALID_ARGUMENT (NULL argument, cap too
 * small, bad unit),
 * DDO_E_STATE (not leased on linear, or unloaded).
 */
DDO_API int ddo_session_unit_addresses(ddo_session *s, size_t unit, void **ptrs, size_t cap,
                                       size_t *n);
/*
 * weight_codec with a checkpoint of a caller's host tensors (ddo_checkpoint_create_from_memory):
 * *owned is true when the session keeps tensor in host memory of its own (coded, or raw where
 * coding does not shrink it) and never reads the caller's bytes again, so the caller may free
 * them while the session lives (a resident tensor, a dtype the codec does not code, or any
 * tensor without the codec or on vmm_runtime: false, the caller's memory serves it). Errors:
 * DDO_E_INVALID_ARGUMENT (NULL argument, tensor out of range).
 */
DDO_API int ddo_session_tensor_host_owned(ddo_session *s, size_t tensor, bool *owned);
/*
 * Copies tensor's bytes, exactly as the checkpoint held them, from the session's host memory
 * into dst (dst_bytes, at least the tensor's nbytes): decoded when the session stores them
 * coded. What a host calls to get back a tensor it freed (ddo_session_tensor_host_owned).
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument, tensor out of range, dst too small),
 * DDO_E_NOT_FOUND (the session keeps no host bytes of it: a skipped tensor, or a file's
 * tensor the retained store does not hold),
 * DDO_E_FORMAT (its coded bytes do not decode: corruption, named), DDO_E_NO_MEMORY.
 */
DDO_API int ddo_session_tensor_read_host(ddo_session *s, size_t tensor, void *dst,
                                         uint64_t dst_bytes);
/* ddo_session_tensor_dlpack flag: a one-dimensional uint8 view of the tensor's bytes (for
 * dtypes DLPack or the host cannot name, such as the F8 types: view them as the dtype). */
#define DDO_VIEW_BYTES 1u
/*
 * A DLPack (v0) DLManagedTensor over tensor's device bytes at its current address (stable on
 * VMM, the leased slot's on linear), kDLCUDA with the device ordinal or kDLCPU on the cpu
 * device; its dtype and shape are the tensor's (DDO_VIEW_BYTES: uint8 bytes). Each live view
 * holds a reference on the session: ddo_session_destroy frees the session when the host's
 * handle and every view are gone (the view's deleter may run on any thread). The bytes are
 * valid only while the unit is leased (resident tensors: always). The plan, checkpoint and
 * device must outlive the last view. Errors: DDO_E_INVALID_ARGUMENT (NULL argument, tensor
 * out of range), DDO_E_STATE (its unit not leased, on the linear route), DDO_E_UNSUPPORTED (a
 * dtype DLPack cannot name without DDO_VIEW_BYTES), DDO_E_NOT_FOUND (skipped tensor),
 * DDO_E_OVERFLOW (a shape DLPack cannot hold), DDO_E_DEVICE (the device's ordinal),
 * DDO_E_NO_MEMORY.
 */
DDO_API int ddo_session_tensor_dlpack(ddo_session *s, size_t tensor, unsigned flags,
                                      void **managed);
/* DLPack views of the session still alive (ddo_session_tensor_dlpack). */
DDO_API size_t ddo_session_view_count(const ddo_session *s);
/*
 * How many times the device copy of tensor was written from the host: its unit's loads into a
 * slot (streamed), or the resident uploads (at create and every reload). A host that edits a
 * device copy in place (a fused LoRA replayed on it) compares the count with the one it saw
 * when it last edited: a larger count means the copy is fresh from the checkpoint. Errors:
 * DDO_E_INVALID_ARGUMENT (NULL argument, tensor out of range), DDO_E_NOT_FOUND (skipped).
 */
DDO_API int ddo_session_tensor_loads(ddo_session *s, size_t tensor, uint64_t *loads);
/* Live DLPack views of one checkpoint tensor (0 out of range): a binding that dropped its own
 * view of a streamed tensor learns from it whether a view escaped the unit's lease. */
DDO_API size_t ddo_session_tensor_view_count(const ddo_session *s, size_t tensor);
/*
 * A DLPack (v0) DLManagedTensor over a unit's device bytes in one piece: one-dimensional uint8
 * from the unit's start (a tensor of it is at its ddo_tensor_location offset) to the end of
 * its last streamed tensor, at the current address (stable on VMM, the leased slot's on
 * linear). A host views each tensor as a slice of it: one view per unit instead of one per
 * tensor. It holds a reference on the session as ddo_session_tensor_dlpack's views do.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument, unit out of range), DDO_E_STATE (unloaded,
 * or not leased on the linear route), DDO_E_UNSUPPORTED (a route that maps each weight apart,
 * vmm_runtime: view the tensors one by one), DDO_E_NOT_FOUND (no streamed tensor with bytes),
 * DDO_E_OVERFLOW (a range DLPack cannot hold), DDO_E_DEVICE (the device's ordinal),
 * DDO_E_NO_MEMORY.
 */
DDO_API int ddo_session_unit_dlpack(ddo_session *s, size_t unit, void **managed);
/* Live DLPack views of a unit's memory (0 out of range): its unit-wide views
 * (ddo_session_unit_dlpack) and the views of its streamed tensors (ddo_session_tensor_dlpack;
 * not its resident ones),
 * in one call: a binding that dropped its own views learns whether one escaped the lease. */
DDO_API size_t ddo_session_unit_view_count(const ddo_session *s, size_t unit);
/*
 * Share mode (ddo_session_options.share_count > 1): *share_bytes is each rank's share of unit,
 * the bytes from the start of its view (ddo_session_unit_dlpack) that the host all-gathers after
 * each acquire (share_count shares, rank r's at r x *share_bytes); the same on every rank of the
 * same plan. 0: the unit is uploaded whole and there is nothing to gather (not in share mode, a
 * resident unit, or one under share_count x 64 KiB). Errors: DDO_E_INVALID_ARGUMENT (NULL
 * argument, unit out of range).
 */
DDO_API int ddo_session_unit_share(const ddo_session *s, size_t unit, uint64_t *share_bytes);
/* Declares the execution order (unit indices); otherwise learned on the first pass. With no
 * unit leased, the order's first `execution slots` streamed units start loading at once (as
 * after ddo_session_reload). Errors: DDO_E_INVALID_ARGUMENT (NULL or empty, more units than
 * the plan's, out of range, listed twice). */
DDO_API int ddo_session_declare_order(ddo_session *s, const size_t *units, size_t count);
/* Marks the start of a pass (one forward of the host's model). From then on a unit acquired
 * again before the next mark does not move the prefetch window, which its first acquire of the
 * pass moved: a module read at a pass's start and at its end (the gathered unit of the modules
 * outside the blocks) would otherwise, at the end, start loading the next pass's unit whose
 * slot the pass's last block still computes in, and a synchronize after the pass would wait
 * for that copy. A host that marks no pass keeps a window move at every acquire. Errors:
 * DDO_E_INVALID_ARGUMENT (NULL). */
DDO_API int ddo_session_begin_pass(ddo_session *s);
/* What one unit's acquires waited for since the session was created (docs/io.md, "Which units
 * waited on the file"): a host reads it to see which units a disk slower than planned stalls,
 * and for how long. */
typedef struct ddo_unit_waits {
    uint64_t acquires;     /* acquires of the unit */
    uint64_t waits;        /* acquires that waited (for its load, or for a slot to load into) */
    uint64_t wait_ns;      /* their time waiting */
    uint64_t file_waits;   /* of those, waits on a load that read the file (or its sidecar) */
    uint64_t file_wait_ns; /* their time waiting */
    uint64_t file_loads;   /* loads of the unit that read the file (or its sidecar) */
    uint64_t file_load_ns; /* the loader's time in them: reading and issuing the copies */
} ddo_unit_waits;
/* Errors: DDO_E_INVALID_ARGUMENT (NULL argument, unit out of range). */
DDO_API int ddo_session_unit_waits(ddo_session *s, size_t unit, ddo_unit_waits *out);
/* Explicit reclaim: releases at most one completed idle slot's backing. *released = bytes.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_DEVICE (unmapping or releasing). */
DDO_API int ddo_session_reclaim(ddo_session *s, uint64_t *released);
/* Unload: device weights invalidated; acquire fails with DDO_E_STATE until reload. Returns the
 * first failure of waiting for the uploads and releasing (it releases what it can).
 * Errors: DDO_E_INVALID_ARGUMENT (s is NULL), DDO_E_DEVICE. */
DDO_API int ddo_session_unload(ddo_session *s);
/* Reload after unload: the device state again (resident tensors uploaded; with an order
 * known, its first units start loading, as ddo_session_declare_order does). Errors:
 * DDO_E_INVALID_ARGUMENT (s is NULL), DDO_E_STATE (the session was released), those of
 * ddo_session_create's device steps (DDO_E_BUDGET, DDO_E_DEVICE, DDO_E_DEVICE_MEMORY, DDO_E_IO,
 * DDO_E_FILE_CHANGED, DDO_E_NO_MEMORY). */
DDO_API int ddo_session_reload(ddo_session *s);
/* Unload, and the host stores too: the retained store (and its registration) is freed, so an
 * inactive session (an expert of a mixture-of-experts pipeline between its phases) holds no
 * host memory beyond its staging windows; ddo_session_reload reads the store again from the
 * files before the device state. Errors: those of ddo_session_unload; DDO_E_UNSUPPORTED with
 * weight_codec's stores or a caller's host tensors (unload() keeps them). */
DDO_API int ddo_session_release_host(ddo_session *s);
/*
 * Error boundary: runs phase(user). On failure attempts cleanup (unload) once
 * and returns the phase's original error; a cleanup failure is attached as a
 * diagnostic (ddo_session_error). Success does no implicit unload or wait.
 * Errors: DDO_E_INVALID_ARGUMENT (s or phase NULL), the phase's own code.
 */
DDO_API int ddo_session_run_phase(ddo_session *s, int (*phase)(void *user), void *user);
/* Waits for all outstanding uploads (tests, benchmarks, shutdown). Errors:
 * DDO_E_INVALID_ARGUMENT (s is NULL), DDO_E_DEVICE. */
DDO_API int ddo_session_synchronize(ddo_session *s);
/* A versioned metrics snapshot; collect_completed retires finished upload tickets. Errors:
 * DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_NO_MEMORY. */
DDO_API int ddo_session_metrics(ddo_session *s, bool collect_completed, ddo_metrics **out);
DDO_API const char *ddo_session_error(const ddo_session *s);

/* ------------------------------------------------------------------------ */
/* Metrics                                                                   */
/* ------------------------------------------------------------------------ */

#define DDO_METRICS_SCHEMA_VERSION 1

DDO_API void ddo_metrics_destroy(ddo_metrics *m);
/* Value of a numeric metric by catalog name (docs/metrics.md). Errors: DDO_E_INVALID_ARGUMENT
 * (NULL argument), DDO_E_NOT_FOUND (no such metric). */
DDO_API int ddo_metrics_get(const ddo_metrics *m, const char *name, double *value);
/* A descriptive label of the snapshot ("route", "read_engine", "slot_kind", ...), or NULL. */
DDO_API const char *ddo_metrics_label(const ddo_metrics *m, const char *key);
/* JSON (as_dict), free with ddo_free. component may be NULL; it tags the snapshot.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_NO_MEMORY. */
DDO_API int ddo_metrics_to_json(const ddo_metrics *m, const char *component, char **json);
/* The short human profile table. Free with ddo_free. Errors: DDO_E_INVALID_ARGUMENT (NULL
 * argument), DDO_E_NO_MEMORY. */
DDO_API int ddo_metrics_format_profile(const ddo_metrics *m, char **text);
/* Appends the JSON snapshot tagged with component as one line to path (record_ddo_metrics).
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_IO (path cannot be appended to),
 * DDO_E_NO_MEMORY. */
DDO_API int ddo_metrics_record(const ddo_metrics *m, const char *component, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* DDO_H */
