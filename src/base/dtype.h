/*
 * dtype.h - the element types' sizes (base/dtype.c), below the checkpoint that reads them from
 * headers, the codec that codes them and the session that hands out views of them.
 */
#ifndef DDO_DTYPE_H
#define DDO_DTYPE_H

#include "ddo.h"

#include <stddef.h>
#include <stdint.h>

/* Bits per element of a dtype (4 for F4, 6 for F6_*); 0 when out of range. */
unsigned ddo__dtype_bits(ddo_dtype dtype);
/*
 * The byte size of a tensor as the official reader computes it: the element count (checked for
 * overflow dimension by dimension, so a zero after an overflow does not hide it), times the
 * bits, which must be a whole number of bytes; for a GGML block type, whole blocks along the
 * last dimension. 0; DDO_E_OVERFLOW; DDO_E_FORMAT when the bits do not fill whole bytes or the
 * last dimension is not a whole number of blocks (no dimension at all for a block type).
 */
int ddo__dtype_nbytes(ddo_dtype dtype, const uint64_t *dims, size_t ndim, uint64_t *nbytes);

#endif /* DDO_DTYPE_H */
