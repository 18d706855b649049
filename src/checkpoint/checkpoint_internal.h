/*
 * checkpoint_internal.h - what the files of the checkpoint module share: the
 * handle's layout (its name indexes are strmap.h tables) and the helpers used across
 * checkpoint.c (the handle, its tables, opening), checkpoint_header.c (header validation,
 * opening one file), checkpoint_index.c (sharded sets),
 * checkpoint_blocks.c (block groups), checkpoint_io.c (identity, reads) and
 * checkpoint_query.c (queries, JSON). Private to those files.
 */
#ifndef DDO_CHECKPOINT_INTERNAL_H
#define DDO_CHECKPOINT_INTERNAL_H

#include "base/strmap.h"
#include "checkpoint/checkpoint.h"
#include "os/file.h"

#include "os/thread.h"
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ddo__checkpoint_file {
    ddo_file_info info;  /* info.path is owned */
    const char *name;    /* basename, inside info.path */
    char *label;         /* name as messages quote it (ddo__checkpoint_quote), owned */
    char *real_path;     /* resolved path for the path identity check; NULL for images */
    int fd;              /* -1 for images */
    ddo__file_id id;     /* identity at open */
    const uint8_t *data; /* mapping (mmap backend) or memory image; NULL otherwise */
    bool mapped;         /* data came from mmap */
    bool in_set;         /* a shard of an index (GGUF files are refused there) */
    bool gguf;           /* a GGUF file (no ComfyUI layout is looked for) */
} ddo__checkpoint_file;

struct ddo_checkpoint {
    ddo__errbuf err;
    ddo__mutex err_lock;
    ddo_read_backend backend;

    ddo__checkpoint_file *files;
    size_t file_count;

    ddo_tensor_info *tensors; /* names owned */
    size_t tensor_count;
    size_t tensor_cap;
    ddo__strmap by_name;
    uint64_t total_bytes;

    char **meta_keys;
    char **meta_values;
    size_t meta_count;
    size_t meta_cap;
    ddo__strmap meta_by_key;

    ddo_block_group *groups; /* prefixes owned */
    size_t group_count;

    ddo_quant_layer *quant; /* layer and format owned */
    size_t quant_count;
};

/* Copies the thread's last detail onto the handle (under its lock: reads may
 * fail on several threads at once). Returns code. */
int ddo__checkpoint_record(const ddo_checkpoint *ck, int code);
/* A new empty checkpoint reading with backend (checkpoint.c); NULL when out of memory. */
ddo_checkpoint *ddo__checkpoint_new(ddo_read_backend backend);
/* Formats a detail for the thread and the handle. Returns code. */
int ddo__checkpoint_fail(const ddo_checkpoint *ck, int code, const char *fmt, ...) DDO_PRINTF(3, 4);
/* "PATH: WHAT: strerror" (DDO_E_NOT_FOUND for ENOENT, else DDO_E_IO). */
int ddo__checkpoint_os_failure(const char *path, const char *what, int e);
/* The part of path after its last '/'. */
const char *ddo__checkpoint_base_name(const char *path);

/* Adds a file slot for path (copied); *index is its number. */
int ddo__checkpoint_add_file(ddo_checkpoint *ck, const char *path, uint32_t *index);
/* Adds a metadata entry unless its key is present (the first value wins). */
int ddo__checkpoint_add_metadata(ddo_checkpoint *ck, const char *key, const char *value);
/* Appends a tensor (name copied); the caller fills the rest. NULL when out of memory. */
ddo_tensor_info *ddo__checkpoint_add_tensor(ddo_checkpoint *ck, const char *name);
/* Opens, identifies and validates file fi, appending its tensors and metadata
 * (checkpoint_header.c). */
int ddo__checkpoint_open_file(ddo_checkpoint *ck, uint32_t fi);
/* Validates an image already in memory (data, size bytes) as file fi of ck, appending its
 * tensors and metadata (checkpoint_header.c). */
int ddo__checkpoint_parse_image(ddo_checkpoint *ck, uint32_t fi, const uint8_t *data,
                                uint64_t size);
/* Validates a GGUF file as file fi of ck (checkpoint_gguf.c): read through its descriptor, or
 * from image (size bytes) when that is not NULL; appends its tensors (offsets relative to its
 * data section, sorted) and metadata and fills its file info. */
int ddo__checkpoint_parse_gguf(ddo_checkpoint *ck, uint32_t fi, const uint8_t *image,
                               uint64_t size);
/* "[4, 3, 3, 3]" from dims, cut to fit len (checkpoint_header.c). */
void ddo__checkpoint_format_dims(char *buf, size_t len, const uint64_t *dims, size_t n);
/* qsort comparator for ddo_tensor_info: by offset, then size, then name
 * (checkpoint_header.c). */
int ddo__checkpoint_cmp_offset(const void *a, const void *b);
/* Absolute offsets, the name index, the total and the block groups. */
int ddo__checkpoint_finish(ddo_checkpoint *ck, const char *what);

/*
 * Integers the official reader reads as u64 but jansson cannot hold (2^63 .. 2^64 - 1): the
 * loader writes each as a sentinel integer base + k (a range of very negative values that no
 * literal of the text uses) and keeps its value here.
 */
typedef struct ddo__json_bigs {
    uint64_t *values;
    size_t count;
    json_int_t base;
} ddo__json_bigs;
void ddo__json_bigs_free(ddo__json_bigs *b);
/* Whether v is a sentinel of b; *out its value. */
bool ddo__json_bigs_get(const ddo__json_bigs *b, const json_t *v, uint64_t *out);

/*
 * Pre-scans a JSON text in one pass without allocating: refuses nesting deeper than
 * DDO__CHECKPOINT_MAX_DEPTH and more than DDO__CHECKPOINT_MAX_JSON_TOKENS keys and values or
 * DDO__CHECKPOINT_MAX_JSON_CONTAINERS arrays and objects (`what` is "header" or "index"), and
 * counts the number tokens to rewrite: *reals (`-0`, integers beyond 64 bits: floats to the
 * official reader) and *bigs (integers of 2^63 .. 2^64 - 1). The text need not be valid JSON.
 */
int ddo__checkpoint_json_scan(const char *fname, const char *what, const char *text, size_t len,
                              size_t *reals, size_t *bigs);
/* A copy of text with the reals written as reals (`-0` as `-0.0`) and the bigs as sentinels
 * recorded in *table. NULL when out of memory. */
char *ddo__checkpoint_json_fix_numbers(const char *text, size_t len, size_t reals, size_t bigs,
                                       ddo__json_bigs *table, size_t *out_len);
/* Scans (as above), rewrites numbers, and decodes a JSON text with duplicate keys refused;
 * *bigs (may be NULL) gets the big integers, to be freed with ddo__json_bigs_free. */
int ddo__checkpoint_json_load(const char *fname, const char *what, const char *text, size_t len,
                              json_t **out, ddo__json_bigs *bigs);

/* JSON helpers shared with the index parser. */
int ddo__checkpoint_json_failure(const char *fname, const char *what, const json_error_t *jerr);
/* A non-negative JSON integer (or a big one of bigs, which may be NULL), or false. */
bool ddo__checkpoint_json_u64(const json_t *v, const ddo__json_bigs *bigs, uint64_t *out);
const char *ddo__checkpoint_json_type(const json_t *v);

/* Finds and validates the ComfyUI quantization layout of a checkpoint of files (its name index
 * built): ck->quant (checkpoint_quant.c). */
int ddo__checkpoint_quant(ddo_checkpoint *ck, const char *what);
/* Frees ck->quant. */
void ddo__checkpoint_quant_free(ddo_checkpoint *ck);

/* Opens a sharded set through its *.safetensors.index.json (checkpoint_index.c). */
int ddo__checkpoint_open_index(ddo_checkpoint *ck, const char *path);
/* Computes ck->groups from the tensor names (checkpoint_blocks.c); what names the checkpoint
 * in messages. */
int ddo__checkpoint_block_groups(ddo_checkpoint *ck, const char *what);

#endif /* DDO_CHECKPOINT_INTERNAL_H */
