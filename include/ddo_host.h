/*
 * ddo_host.h - the host layer of libddo, over the core of ddo.h: the policy every host would
 * otherwise repeat (the device a configuration names, the read backend, the plan inputs of a
 * device and this machine, the workload profile applied before planning and recorded after a
 * calibration), capacity profiles, Diffusers pipeline directories, and measurements of the
 * device, files and this machine. The conventions and the ABI rule of ddo.h hold here.
 */
#ifndef DDO_HOST_H
#define DDO_HOST_H

#include "ddo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Measurement: the device's bus, a file's read speed                       */
/* ------------------------------------------------------------------------ */

/* Host->device figures measured on a device (ddo doctor, ddo bench). 0 = not measured. */
typedef struct ddo_device_bandwidth {
    double pinned_bytes_per_s;      /* from pinned memory, 16 MiB pieces: the bus limit */
    double pinned_2mib_bytes_per_s; /* from pinned memory, 2 MiB pieces */
    double pageable_bytes_per_s;    /* from ordinary (pageable) memory */
    double register_s_per_gib;      /* registering existing pages (cuMemHostRegister) */
    double pinned_alloc_s_per_gib;  /* allocating pinned pages (cuMemHostAlloc) */
    uint64_t bytes;                 /* bytes moved per measurement */
} ddo_device_bandwidth;
/*
 * Measures dev's host->device paths with `bytes` per measurement (0 = 1 GiB; the median of
 * 3 passes each). Takes bytes of pinned host memory and of device memory for the duration.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument), DDO_E_DEVICE_MEMORY, DDO_E_NO_MEMORY (host
 * memory, pinned or not), DDO_E_DEVICE, DDO_E_UNSUPPORTED (registration refused by the driver).
 */
DDO_API int ddo_device_measure(ddo_device *dev, uint64_t bytes, ddo_device_bandwidth *out);
/*
 * Measures the device->device link of a device set (docs/multi-gpu.md): *bytes_per_s of copies
 * from src's memory into dst's, `bytes` per pass (0 = 256 MiB) in 64 MiB pieces on a stream of
 * dst, a warm-up pass then the median of three. cuda: cuMemcpyPeerAsync (peer access enabled
 * where the GPUs allow it); cpu: the emulated link (ddo_cpu_options.peer_bytes_per_s of dst).
 * Takes bytes of device memory on each device for the duration. Errors:
 * DDO_E_INVALID_ARGUMENT (NULL argument, dst == src, devices of two kinds),
 * DDO_E_DEVICE_MEMORY, DDO_E_DEVICE, DDO_E_NO_MEMORY.
 */
DDO_API int ddo_device_measure_peer(ddo_device *dst, ddo_device *src, uint64_t bytes,
                                    double *bytes_per_s);
/*
 * Measures split mode's intake (docs/multi-gpu.md) on devs[0..n) (2..16 devices of one kind,
 * each once): `bytes` (0 = 1 GiB) of pinned host memory reach every device, each device copying
 * its 1/n over its own host link and an all-gather completing the rest; *bytes_per_s is bytes
 * over the time until every device holds them all (each device's weight intake), the median of
 * three after a warm-up. The last pass is read back and compared on every device. cuda: the
 * all-gather is NCCL's, loaded at run time (nccl_path, NULL or "": libnccl.so.2; never the
 * NVLink multicast path: NCCL_NVLS_ENABLE=0); cpu: the emulated one. Takes bytes of pinned
 * host memory and n * ceil(bytes / n) bytes of device memory on each device for the duration.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument, a bad set), DDO_E_NO_DEVICE (NCCL absent:
 * "NCCL not available: ..."), DDO_E_CONFIG (NCCL_NVLS_ENABLE set to another value),
 * DDO_E_DEVICE_MEMORY, DDO_E_DEVICE, DDO_E_NO_MEMORY, DDO_E_INTERNAL (bytes differ).
 */
DDO_API int ddo_device_measure_split(ddo_device *const *devs, size_t n, uint64_t bytes,
                                     const char *nccl_path, double *bytes_per_s);

/* Read speed of a file: from the page cache (after warming it) and with O_DIRECT. */
typedef struct ddo_file_speed {
    double page_cache_bytes_per_s; /* 0 = not measured */
    double direct_bytes_per_s;     /* 0 = not measured, or O_DIRECT not supported here */
    unsigned direct_streams;       /* O_DIRECT reads in flight (the retained store's depth) */
    uint64_t bytes;                /* bytes read per pass */
} ddo_file_speed;
#define DDO_MEASURE_PAGE_CACHE 1u /* warm the cache, then the median of three passes */
#define DDO_MEASURE_DIRECT     2u /* one O_DIRECT pass, 4 reads of 16 MiB in flight */
/* Reads up to max_bytes (0 = whole file) of path, measuring what `what` asks for. O_DIRECT
 * refused by the file system is not an error (direct_bytes_per_s stays 0). Errors:
 * DDO_E_INVALID_ARGUMENT (NULL argument, not a regular file), DDO_E_NOT_FOUND, DDO_E_IO,
 * DDO_E_NO_MEMORY. */
DDO_API int ddo_measure_file_read(const char *path, uint64_t max_bytes, unsigned what,
                                  ddo_file_speed *out);

/* ------------------------------------------------------------------------ */
/* Host machine facts                                                        */
/* ------------------------------------------------------------------------ */

typedef struct ddo_host_info {
    uint64_t ram_total_bytes;
    uint64_t ram_available_bytes; /* MemAvailable */
    uint64_t cgroup_limit_bytes;  /* 0 = no limit */
    bool running_on_wsl;          /* from the kernel release (or /proc/version) */
    char kernel_release[128];
} ddo_host_info;
/* This machine's RAM, cgroup limit, WSL and kernel release. Errors: DDO_E_INVALID_ARGUMENT
 * (out is NULL). */
DDO_API int ddo_host_info_get(ddo_host_info *out);
/* ------------------------------------------------------------------------ */
/* Capacity profiles                                                         */
/* ------------------------------------------------------------------------ */

/*
 * A capacity profile is a JSON file named by the SHA-256 of a workload
 * identity ("context"), holding the last 20 observations, merged capacity
 * limits and the next run's recommendation (docs/profiles.md). Directory:
 * explicit, else DDO_PROFILE_DIR, else ~/.ddo/profiles (ddo_profile_dir
 * encodes that rule; the library never reads the environment itself).
 * A corrupt or foreign file is reported (DDO_E_FORMAT / DDO_E_NOT_FOUND with
 * a detail) and treated as absent: never fatal to a run.
 */
typedef struct ddo_profile ddo_profile;

#define DDO_PROFILE_SCHEMA_VERSION   1
#define DDO_PROFILE_MAX_OBSERVATIONS 20
#define DDO_PROFILE_KEY_BYTES        41 /* "ddo-capacity-v1-" + 24 hex + NUL */
/* A profile file larger than this (or not a regular file) is refused unread, as corrupt. */
#define DDO_PROFILE_MAX_FILE_BYTES (1u << 20)

/* Resolves the profile directory: explicit (non-empty) > env_value (non-empty) >
 * home/.ddo/profiles ("~/" expanded). Free *dir with ddo_free. Errors: DDO_E_INVALID_ARGUMENT
 * (all three empty), DDO_E_NO_MEMORY. */
DDO_API int ddo_profile_dir(const char *explicit_dir, const char *env_value, const char *home,
                            char **dir);
/* The key of a context (a JSON object): "ddo-capacity-v1-" + the first 24 hex digits of the
 * SHA-256 of its canonical JSON (sorted keys, no spaces, ASCII escapes). Errors:
 * DDO_E_INVALID_ARGUMENT (NULL, not JSON, not an object, or empty), DDO_E_NO_MEMORY. */
DDO_API int ddo_profile_key(const char *context_json, char key[DDO_PROFILE_KEY_BYTES]);
/* <dir>/<key>.json. Free with ddo_free. Errors: those of ddo_profile_key,
 * DDO_E_INVALID_ARGUMENT (dir or path NULL). */
DDO_API int ddo_profile_path(const char *dir, const char *context_json, char **path);
/* Loads the profile of context. Errors: DDO_E_INVALID_ARGUMENT (NULL argument, a bad context),
 * DDO_E_NOT_FOUND (missing), DDO_E_FORMAT (unreadable, not a regular file, too large, not JSON,
 * of another schema_version, another key or another context; the detail says which),
 * DDO_E_NO_MEMORY. */
DDO_API int ddo_profile_load(const char *dir, const char *context_json, ddo_profile **out);
/* Loads any profile file (for listing); the same checks except the context comparison. Errors:
 * as ddo_profile_load. */
DDO_API int ddo_profile_load_file(const char *path, ddo_profile **out);
/*
 * Appends observation (a JSON object) to the profile of context, merging its capacity
 * ({"capacity":{"metric":M,"value":V},"status":"success"|"failure"}) into the limits; keeps
 * the last 20; replaces the recommendation when recommendation_json is non-NULL, else keeps the
 * previous one. Written atomically (temporary file + rename) while holding an flock on
 * "<profile>.json.lock", so concurrent records of one profile (threads or processes) each keep
 * their observation. A missing, corrupt or foreign previous file starts a fresh profile.
 * *path_out may be NULL. Errors: DDO_E_INVALID_ARGUMENT (dir NULL or empty; context or
 * observation NULL, not JSON or not an object; a bad recommendation), DDO_E_IO (the directory,
 * the lock or the write), DDO_E_NO_MEMORY.
 */
DDO_API int ddo_profile_record(const char *dir, const char *context_json,
                               const char *observation_json, const char *recommendation_json,
                               char **path_out);
/* Creates dir (and its parents) when missing and checks that files can be created in it, so a
 * calibration can refuse to start instead of failing to save at its end. Errors:
 * DDO_E_INVALID_ARGUMENT (dir NULL or empty), DDO_E_IO (naming the directory), DDO_E_NO_MEMORY. */
DDO_API int ddo_profile_check_writable(const char *dir);
DDO_API void ddo_profile_destroy(ddo_profile *p);
/* The profile document. Free with ddo_free. Errors: DDO_E_INVALID_ARGUMENT (NULL argument),
 * DDO_E_NO_MEMORY. */
DDO_API int ddo_profile_to_json(const ddo_profile *p, char **json);
/* The stored context (canonical JSON). Free with ddo_free. Errors: DDO_E_INVALID_ARGUMENT (NULL
 * argument), DDO_E_NO_MEMORY. */
DDO_API int ddo_profile_context(const ddo_profile *p, char **context_json);
DDO_API size_t ddo_profile_observation_count(const ddo_profile *p);
/* Capacity limits of metric; has_* tell which are present. Errors: DDO_E_INVALID_ARGUMENT (NULL
 * argument), DDO_E_NOT_FOUND (neither is present). */
DDO_API int ddo_profile_capacity(const ddo_profile *p, const char *metric, double *max_success,
                                 bool *has_max_success, double *min_failure, bool *has_min_failure);
/* A numeric field of the recommendation. Errors: DDO_E_INVALID_ARGUMENT (NULL argument),
 * DDO_E_NOT_FOUND (absent or not a finite number). */
DDO_API int ddo_profile_recommendation(const ddo_profile *p, const char *key, double *value);

/* round(max(0, total - peak - headroom), 4): the next run's resident budget, GiB. */
DDO_API double ddo_profile_recommend_resident_budget(double total_gb, double peak_gb,
                                                     double headroom_gb);
/* Peak device use of a calibration, GiB: max(total - free_start, total - free_end,
 * external + held_peak, sampled_peak) with external = max(0, total - free_start - held_start). */
typedef struct ddo_profile_sample {
    uint64_t total_bytes;
    uint64_t free_start_bytes;
    uint64_t free_end_bytes;
    uint64_t held_start_bytes;        /* bytes ddo (or the host's allocator) held at the start */
    uint64_t held_peak_bytes;         /* its peak during the region */
    uint64_t sampled_used_peak_bytes; /* max(total - free) sampled during the region, 0 if none */
} ddo_profile_sample;
DDO_API double ddo_profile_peak_gb(const ddo_profile_sample *s);

/* The identity of a named workload: {"identity_version":2,"model_class":SIG,"name":NAME}
 * where SIG names the checkpoint's tensor table (names, dtypes, shapes). Free with ddo_free.
 * Errors: DDO_E_INVALID_ARGUMENT (name NULL or empty, context_json NULL), DDO_E_NO_MEMORY. */
DDO_API int ddo_profile_workload_context(const char *name, const ddo_checkpoint *ck,
                                         char **context_json);

/* What ddo_profile_apply did (upstream's prepare()). */
typedef enum ddo_profile_status {
    DDO_PROFILE_DISABLED,    /* no profile_name */
    DDO_PROFILE_CALIBRATING, /* build_profile: resident budget forced to 0 */
    DDO_PROFILE_MANUAL,      /* a positive manual resident_module_budget_gb wins */
    DDO_PROFILE_MISSING,     /* no usable recommendation */
    DDO_PROFILE_APPLIED
} ddo_profile_status;
DDO_API const char *ddo_profile_status_name(ddo_profile_status status);

/*
 * Applies the named workload profile (cfg's profile_name / build_profile) to cfg before
 * planning: calibration forces a zero resident budget (and clears always-resident patterns);
 * a manual positive resident budget wins; otherwise the recommendation
 * profile_resident_module_budget_gb, capped by max_resident_module_budget_gb, becomes
 * resident_module_budget_gb (auto policy off) or profile_resident_module_budget_gb (balanced),
 * with source "profile:NAME". Also copies measured bus_bytes_per_s / flops_per_s / file read
 * speed into *measured when the profile has them (may be NULL), a manual budget or not. A corrupt
 * profile counts as missing (the detail is kept in ddo_last_error()). Errors:
 * DDO_E_INVALID_ARGUMENT (cfg is NULL), DDO_E_CONFIG (build_profile without profile_name, a bad
 * profile_vram_headroom_gb), DDO_E_NO_MEMORY.
 */
typedef struct ddo_profile_measured {
    double bus_bytes_per_s;
    double flops_per_s;
    double file_read_bytes_per_s;
} ddo_profile_measured;
DDO_API int ddo_profile_apply(ddo_config *cfg, const char *dir, const char *context_json,
                              ddo_profile_status *status, double *budget_gb,
                              ddo_profile_measured *measured);

/* ------------------------------------------------------------------------ */
/* Host layer: from a configuration to a running setup (docs/host.md)        */
/* ------------------------------------------------------------------------ */

/*
 * The policy every host would otherwise repeat, in one place: which device the configuration
 * names and what stands in for it, which read backend a checkpoint is opened with, the plan
 * inputs from the device and this machine, and the workload profile applied before planning
 * and recorded after a calibration. A host validates its configuration, opens a ddo_setup,
 * opens checkpoints with ddo_checkpoint_create_from_config, plans with ddo_setup_plan and runs
 * the plan with ddo_session_create on ddo_setup_device. The functions below ddo_setup are
 * usable on their own.
 */

/*
 * Opens path (ddo_checkpoint_create) with the read backend cfg's load_safetensors_backend
 * names: "mmap" DDO_READ_MMAP, "pread" DDO_READ_PREAD, anything else the default.
 * Errors: DDO_E_INVALID_ARGUMENT (cfg is NULL), those of ddo_checkpoint_create.
 */
DDO_API int ddo_checkpoint_create_from_config(const char *path, const ddo_config *cfg,
                                              ddo_checkpoint **out);
/*
 * Plan inputs from a device's capabilities (memory, granularity, VMM, cpu or not, and the bus
 * and compute rates it reports: the cpu device's throttles; on cuda no bus rate and the
 * compute estimate) and from this machine
 * (available RAM); caps NULL: no device known (its fields 0). tokens is left 0. Writes the
 * fields within out->size (the ABI rule). Errors: DDO_E_INVALID_ARGUMENT (out NULL, its size).
 */
DDO_API int ddo_plan_inputs_from_caps(const ddo_device_caps *caps, ddo_plan_inputs *out);

/* A device (or none) with what a host knows about it and this machine: see ddo_setup_create. */
typedef struct ddo_setup ddo_setup;

/* Which device a setup opens. */
typedef enum ddo_device_choice {
    DDO_DEVICE_CHOICE_AUTO,  /* execution_device; when that is the default cuda:0 (source
                               "default") and no CUDA device answers, the cpu device instead,
                               ddo_setup_note saying why. An explicit cuda is never replaced. */
    DDO_DEVICE_CHOICE_EXACT, /* execution_device exactly: when it does not open, neither does
                               the setup */
    DDO_DEVICE_CHOICE_NONE   /* no device: plans for this machine's facts and the figures the
                               caller gives (what-if planning) */
} ddo_device_choice;

typedef struct ddo_setup_options {
    size_t size;                              /* DDO_SETUP_OPTIONS_INIT */
    ddo_device_choice device;                 /* 0 = DDO_DEVICE_CHOICE_AUTO */
    const ddo_device_options *device_options; /* the device's options; NULL = defaults */
    /* The host's environment block ("NAME=VALUE", NULL-terminated; pass environ), of which
     * only DDO_PROFILE_DIR and HOME (else USERPROFILE, Windows' home) are read (and copied)
     * during create, for the profile directory (ddo_profile_dir). NULL = none is set. */
    const char *const *envp;
} ddo_setup_options;
#define DDO_SETUP_OPTIONS_INIT DDO_STRUCT_INIT(ddo_setup_options)

/*
 * Opens a setup for the validated configuration cfg (read during the call only; may be NULL
 * with DDO_DEVICE_CHOICE_NONE): the device that opts->device asks for. opts may be NULL (AUTO,
 * default device options, no environment). On failure *out is NULL and ddo_last_error() holds
 * the device's detail. Errors: DDO_E_INVALID_ARGUMENT (out NULL, cfg NULL with a device, a
 * struct's size, an unknown opts->device), DDO_E_NO_MEMORY, those of ddo_device_create.
 */
DDO_API int ddo_setup_create(const ddo_config *cfg, const ddo_setup_options *opts, ddo_setup **out);
/* Destroys the setup and its device (which every session on it must have left). */
DDO_API void ddo_setup_destroy(ddo_setup *setup);
/* The setup's device (owned by the setup, valid until destroy), or NULL without one. */
DDO_API ddo_device *ddo_setup_device(const ddo_setup *setup);
/* The spec the device was opened with: execution_device as configured, "cpu" after the
 * default was replaced, "" without a device. Never NULL. */
DDO_API const char *ddo_setup_device_spec(const ddo_setup *setup);
/* Why the device is not the one configured (the replacement's one line), else "". */
DDO_API const char *ddo_setup_note(const ddo_setup *setup);
/*
 * What the setup knows for planning, now: ddo_plan_inputs_from_caps of what its device
 * reports (without one: ddo_plan_inputs_from_caps(NULL)), then, for a bus or compute rate the
 * device does not report, the rate measured by the profile last applied (ddo_setup_profile_apply),
 * then what this process measured on the device (docs/host.md): the bus (32 MiB of pinned
 * host->device copies, once per process and device, cached) and, on the cpu device, a compute
 * estimate. Without a device nothing is measured. tokens is left 0. A host that measures a rate
 * itself overrides the field. Writes the fields within out->size. Errors: DDO_E_INVALID_ARGUMENT
 * (setup or out NULL, out's size), those of ddo_device_caps_get.
 */
DDO_API int ddo_setup_plan_inputs(ddo_setup *setup, ddo_plan_inputs *out);
/*
 * Plans ck under cfg for the setup: with inputs NULL, for ddo_setup_plan_inputs; otherwise
 * for exactly *inputs (a host's edited copy of them). See ddo_plan_build, which this calls.
 * Errors: DDO_E_INVALID_ARGUMENT (setup NULL, inputs' size), those of ddo_setup_plan_inputs
 * and ddo_plan_build.
 */
DDO_API int ddo_setup_plan(ddo_setup *setup, const ddo_checkpoint *ck, const ddo_config *cfg,
                           const ddo_plan_inputs *inputs, ddo_plan **out);
/*
 * Applies the workload profile cfg names (profile_name, build_profile) for ck to cfg before
 * planning: ddo_profile_dir (profile_dir, else DDO_PROFILE_DIR, else HOME/.ddo/profiles, with
 * USERPROFILE for HOME where HOME is unset),
 * ddo_profile_workload_context(profile_name, ck), for a calibration ddo_profile_check_writable
 * (so a calibration that could not save is refused before it runs), then ddo_profile_apply.
 * The setup keeps the directory, the context and whether this is a calibration for
 * ddo_setup_profile_record, and the measured rates for ddo_setup_plan_inputs. Without a
 * profile_name: *status DDO_PROFILE_DISABLED, nothing else. status, budget_gb and measured may
 * be NULL. On DDO_PROFILE_MISSING, ddo_last_error() says why. Errors: DDO_E_INVALID_ARGUMENT
 * (setup, cfg or ck NULL; no profile directory), DDO_E_CONFIG (build_profile without
 * profile_name, bad profile options), DDO_E_IO (a calibration's directory not writable),
 * DDO_E_NO_MEMORY.
 */
DDO_API int ddo_setup_profile_apply(ddo_setup *setup, ddo_config *cfg, const ddo_checkpoint *ck,
                                    ddo_profile_status *status, double *budget_gb,
                                    ddo_profile_measured *measured);
/* The profile directory of the last ddo_setup_profile_apply with a profile_name, else "". */
DDO_API const char *ddo_setup_profile_dir(const ddo_setup *setup);

/* What a calibration run measured (filled by the host), and what ddo_setup_profile_record made
 * of it (written by the library). */
typedef struct ddo_profile_calibration {
    size_t size;                  /* DDO_PROFILE_CALIBRATION_INIT */
    uint64_t total_bytes;         /* device memory */
    uint64_t baseline_used_bytes; /* device bytes in use before the session (other users) */
    uint64_t used_peak_bytes;     /* device bytes in use above the baseline, sampled during it */
    uint64_t used_end_bytes;      /* above the baseline at the end of the steps */
    uint64_t weights_peak_bytes;  /* the session's device_weights_peak_bytes */
    double achieved_bytes_per_s;  /* the session's achieved_bytes_per_s; 0 = unknown */
    double file_read_bytes_per_s; /* the setup's file read rate; 0 = unknown */
    double flops_per_s;           /* the host's compute rate; 0 = unknown */
    /* written by ddo_setup_profile_record */
    double peak_gb;     /* ddo_profile_peak_gb of the run (nothing held at its start) */
    double total_gb;    /* total_bytes in GiB */
    double headroom_gb; /* profile_vram_headroom_gb */
    double budget_gb;   /* the next run's resident budget */
    /* filled by the host (fields added after the results, the ABI rule) */
    double decode_bytes_per_s; /* the weight codec decoder's measured throughput; 0 = unknown */
    /* {"UNIT": seconds, ...}: each unit's measured compute (the planner's unit_compute_json);
     * NULL = none. Recorded in the observation and the recommendation. */
    const char *unit_compute_json;
} ddo_profile_calibration;
#define DDO_PROFILE_CALIBRATION_INIT DDO_STRUCT_INIT(ddo_profile_calibration)

/*
 * After a calibration's steps: records the observation (peak, total, headroom, achieved rate)
 * and the next run's recommendation (ddo_profile_recommend_resident_budget, with the measured
 * rates that are known: bus_bytes_per_s, file_read_bytes_per_s, flops_per_s,
 * decode_bytes_per_s, unit_compute_s) in the profile of the last ddo_setup_profile_apply, and
 * writes the results into *cal. *path (may be NULL) receives the profile file (free with
 * ddo_free). Both hosts (the tool, the Python binding) record through this, so their records
 * are alike. Errors: DDO_E_INVALID_ARGUMENT (setup, cfg or cal NULL, cal's size,
 * unit_compute_json not a JSON object), DDO_E_STATE (the last apply was not a calibration),
 * DDO_E_NO_MEMORY, those of ddo_profile_record.
 */
DDO_API int ddo_setup_profile_record(ddo_setup *setup, const ddo_config *cfg,
                                     ddo_profile_calibration *cal, char **path);
/* The detail of the setup's last failure ("" if none). */
DDO_API const char *ddo_setup_error(const ddo_setup *setup);

/* ------------------------------------------------------------------------ */
/* Pipelines: a Diffusers directory described by model_index.json           */
/* ------------------------------------------------------------------------ */

typedef struct ddo_pipeline ddo_pipeline;

/* One component of a pipeline: an entry NAME: [LIBRARY, CLASS] of model_index.json. */
typedef struct ddo_pipeline_component_info {
    const char *name;       /* the entry's key, a plain folder name ("transformer") */
    const char *library;    /* "diffusers", "transformers", ...; NULL when null */
    const char *class_name; /* "FluxTransformer2DModel"; NULL when null */
    const char *path;       /* DIR/NAME */
    bool has_weights;       /* the folder holds a *.safetensors or *.safetensors.index.json entry */
} ddo_pipeline_component_info;

/*
 * Reads DIR/model_index.json. Its components are the entries whose key does not start with
 * '_' and whose value is a two-element array of strings or nulls; they are listed in the
 * file's order. Every component name must be a plain name: not empty, not "." or "..", and
 * without '/', '\\' or NUL (a name is a folder inside DIR, never a path out of it). The file
 * must be a regular file (a FIFO, socket or device is refused without blocking) of at most
 * 1 MiB, nest at most 127 levels and hold at most 256 components. Strings belong to the
 * pipeline. On failure *out is NULL and ddo_last_error() names the file, the component and
 * the rule. Errors: DDO_E_INVALID_ARGUMENT, DDO_E_NOT_FOUND, DDO_E_IO, DDO_E_FORMAT,
 * DDO_E_NO_MEMORY.
 */
DDO_API int ddo_pipeline_create(const char *dir, ddo_pipeline **out);
DDO_API void ddo_pipeline_destroy(ddo_pipeline *p);
/* The pipeline's "_class_name" ("FluxPipeline"), or NULL when it has none. */
DDO_API const char *ddo_pipeline_class_name(const ddo_pipeline *p);
DDO_API size_t ddo_pipeline_component_count(const ddo_pipeline *p);
/* Component i (file order) into *info, valid until the pipeline is destroyed.
 * Errors: DDO_E_INVALID_ARGUMENT (NULL argument, i out of range). */
DDO_API int ddo_pipeline_component(const ddo_pipeline *p, size_t i,
                                   ddo_pipeline_component_info *info);

#ifdef __cplusplus
}
#endif

#endif /* DDO_HOST_H */
