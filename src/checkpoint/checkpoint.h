/*
 * checkpoint.h - internal entry points of the checkpoint module for the
 * source/session modules and the fuzz target: identity checks, absolute file
 * ranges, direct opens and parsing a file image from memory.
 *
 * Errors of these functions are recorded in the calling thread's last-error
 * detail only (never on the handle, which several threads may share); callers
 * copy it with ddo__fail_from_last().
 */
#ifndef DDO_CHECKPOINT_H
#define DDO_CHECKPOINT_H

#include "base/common.h"
#include "base/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The reader's limits (docs/inspect.md, "Limits"). Each error names its limit. The header
 * length and the nesting depth are the official reader's; the others are ddo's own, so that
 * any input is accepted or refused in bounded memory (well under 1 GiB) and time.
 */
/* Largest accepted JSON header (the 8-byte length prefix's limit), as the official reader. */
#define DDO__CHECKPOINT_MAX_HEADER_BYTES ((uint64_t)100000000)
/* Arrays and objects nested deeper than this are refused, as the official reader does (its
 * JSON parser's recursion limit of 128 refuses the 128th level). */
#define DDO__CHECKPOINT_MAX_DEPTH 127
/* JSON keys and values (tokens) in one header or index, and arrays and objects among them. */
#define DDO__CHECKPOINT_MAX_JSON_TOKENS     4194304
#define DDO__CHECKPOINT_MAX_JSON_CONTAINERS 1048576
/* Arrays and objects in an index or a model_index.json (real ones hold a handful). */
#define DDO__CHECKPOINT_MAX_INDEX_CONTAINERS 65536
/* Tensors in one checkpoint (all shards together). */
#define DDO__CHECKPOINT_MAX_TENSORS 1048576
/* Bytes of one tensor name. */
#define DDO__CHECKPOINT_MAX_NAME_BYTES 4096
/* Largest *.safetensors.index.json. */
#define DDO__CHECKPOINT_MAX_INDEX_BYTES ((uint64_t)64 << 20)
/* Distinct numbered prefixes (blocks and their groups) that block discovery may track. */
#define DDO__CHECKPOINT_MAX_BLOCK_PREFIXES 4194304
/* GGUF (docs/formats.md): the metadata and tensor infos together are bounded by
 * DDO__CHECKPOINT_MAX_HEADER_BYTES, keys and tensor names by DDO__CHECKPOINT_MAX_NAME_BYTES;
 * arrays of arrays nest at most this deep; a tensor has at most GGML's 4 dimensions. */
#define DDO__GGUF_MAX_ARRAY_DEPTH 8
#define DDO__GGUF_MAX_DIMS        4

/*
 * Reads a small JSON file through the reader's guards: a regular file only (FIFOs, sockets
 * and devices refused without blocking), at most limit bytes, the nesting and token limits
 * above, duplicate keys refused, `-0` read as a real. label names the file in messages and
 * what the document ("index", "model_index.json"). *root is a new reference on success.
 */
struct json_t;
int ddo__checkpoint_read_json_file(const char *path, const char *label, const char *what,
                                   uint64_t limit, struct json_t **root);

/* ddo__dtype_bits, ddo__dtype_nbytes: base/dtype.h */

/*
 * A string as it may appear in a one-line message: newline, tab, quote, backslash as \n, \t,
 * \", \\; other control characters (C0, DEL, C1) as \xNN / \u00NN; cut with "..." past about
 * 300 bytes. Returns one of a few thread-local buffers (valid for the next few calls).
 */
const char *ddo__checkpoint_quote(const char *s);
/* The same for text that is not itself quoted (a parser's message): quotes and backslashes
 * are kept as they are. */
const char *ddo__checkpoint_quote_text(const char *s);
/* A real number as the shortest text that reads back as it, with ".0" when it would look like
 * an integer. */
void ddo__checkpoint_format_real(char *buf, size_t len, double v);

/*
 * Re-checks the identity (device, inode, size, mtime and ctime ns) of file `file`,
 * both of the open descriptor and of the file its path names now.
 * DDO_E_FILE_CHANGED naming the file; DDO_E_INVALID_ARGUMENT for a bad index.
 */
int ddo__checkpoint_check_file(const ddo_checkpoint *ck, uint32_t file);

/*
 * Reads len bytes at absolute offset `offset` of file `file` into dst between
 * two identity checks (nothing is read from a file changed before the read, and
 * a change during it fails the call too). Large reads are
 * split; short reads and EINTR are retried. Thread-safe. The range must lie
 * inside the file. Errors: DDO_E_INVALID_ARGUMENT, DDO_E_FILE_CHANGED, DDO_E_IO.
 * (Host-memory tensors have no file: read them with ddo_checkpoint_read.)
 */
int ddo__checkpoint_read_range(const ddo_checkpoint *ck, uint32_t file, uint64_t offset, void *dst,
                               size_t len);

/*
 * Opens a new O_DIRECT descriptor on file `file` (for io_uring readers),
 * after the identity check; the new descriptor is checked to be the same
 * file. The caller closes it. DDO_E_UNSUPPORTED (and *fd = -1) when the file
 * system or platform refuses direct I/O.
 */
int ddo__checkpoint_open_direct(const ddo_checkpoint *ck, uint32_t file, int *fd);

/* The file's name as used in messages (its basename). NULL for a bad index. */
const char *ddo__checkpoint_file_name(const ddo_checkpoint *ck, uint32_t file);

struct ddo__file_id;
/* The identity file `file` had at open (os/file.h); false for a bad index or a memory image
 * (no file). */
bool ddo__checkpoint_file_identity(const ddo_checkpoint *ck, uint32_t file,
                                   struct ddo__file_id *id);

/*
 * Parses and validates a whole safetensors file image held in memory
 * (8-byte length, header, data) exactly as ddo_checkpoint_create does a file;
 * `name` is used in messages. The result is a checkpoint of one file whose
 * reads copy from data, which must stay alive and unchanged until the
 * checkpoint is destroyed. Used by the fuzz target and by tests.
 */
int ddo__checkpoint_parse_buffer(const uint8_t *data, size_t size, const char *name,
                                 ddo_checkpoint **out);

#endif /* DDO_CHECKPOINT_H */
