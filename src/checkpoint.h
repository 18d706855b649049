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

#include "common.h"

#include <stddef.h>
#include <stdint.h>

/* Largest accepted JSON header (the 8-byte length prefix's limit): 100 MiB. */
#define DDO__CHECKPOINT_MAX_HEADER_BYTES (100 * DDO_MIB)

/*
 * Re-checks the identity (device, inode, size, mtime ns) of file `file`,
 * both of the open descriptor and of the file its path names now.
 * DDO_E_FILE_CHANGED naming the file; DDO_E_INVALID_ARGUMENT for a bad index.
 */
int ddo__checkpoint_check_file(const ddo_checkpoint *ck, uint32_t file);

/*
 * Reads len bytes at absolute offset `offset` of file `file` into dst after
 * the identity check (nothing is read from a changed file). Large reads are
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
