/* What the executor asks of kernels/: reduce several inputs into several
 * outputs, and copy. The host versions live in reduce_host.c; device
 * versions (the .cu files here) share these shapes. */
#ifndef CCS_KERNELS_H
#define CCS_KERNELS_H

#include <stddef.h>

#include "ccs.h"

/* outputs[o][i] = inputs[0][i] op inputs[1][i] op ... for first <= i <
 * first + count, for every o (the buffers' bases, so that a chunk of a
 * graph of any width needs no array of its own). Inputs are fully read block by block before the block's outputs
 * are written, so an output may alias an input (in-place collectives).
 * For CCS_AVG the result is divided by `avg_divisor` (integer types
 * truncate, as NCCL); 0 leaves a partial sum. Narrow float types reduce in
 * float and round once on store. */
void ccs__reduce_host(ccs_dtype_t dtype, ccs_redop_t op, size_t avg_divisor,
                      const void *const *inputs, int ninputs, void *const *outputs, int noutputs,
                      size_t first, size_t count, int streaming);

/* Bytes [offset, offset + bytes) of src to the same bytes of each output;
 * an output equal to the source is skipped. */
void ccs__copy_host(const void *src, void *const *outputs, int noutputs, size_t offset,
                    size_t bytes, int streaming);

/* streaming: the outputs are larger than the caches and not read again
 * soon, so they are written with non-temporal stores (no read for
 * ownership: a third less memory traffic). Call ccs__stream_fence before
 * another thread may read what was written. */
void ccs__stream_fence(void);

#endif
