/* Device versions of kernels.h, built from the .cu files here where the CUDA
 * toolkit is found. Pointers are device addresses the current device can
 * reach (its own memory, or a peer's mapped with access granted); `stream`
 * is a cudaStream_t. Each returns a cudaError_t, 0 when the work is queued.
 * The kernels check nothing about the addresses: callers check every range
 * first (a faulting kernel poisons the context for every tenant). */
#ifndef CCS_KERNELS_DEVICE_H
#define CCS_KERNELS_DEVICE_H

#include <stddef.h>

#include "ccs.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At most this many inputs and outputs per call (they travel in the
 * launch's parameters). */
#define CCS_DEVICE_MAX_PTRS 64

/* outputs[o][i] = inputs[0][i] op ... op inputs[n-1][i], as
 * ccs__reduce_host (same bits); an output may alias an input. With
 * ninputs == 2 and noutputs == 1 this is the reduce step of ring and tree;
 * with P peer buffers in and out, the one-shot all_reduce. */
int ccs__reduce_device(ccs_dtype_t dtype, ccs_redop_t op, size_t avg_divisor,
                       const void *const *inputs, int ninputs, void *const *outputs, int noutputs,
                       size_t count, void *stream);

/* src to each output (an output equal to src is skipped). */
int ccs__copy_device(const void *src, void *const *outputs, int noutputs, size_t bytes,
                     void *stream);

#ifdef __cplusplus
}
#endif
#endif
