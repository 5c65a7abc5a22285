/* The fields of device registrations, checked before anything is asked
 * of the driver (gpu.h). */
#include <stdint.h>
#include <stdio.h>

#include "run/gpu.h"
#include "wire.h"

ccs_result_t ccsd_gpu_check_register(uint32_t domain, uint64_t size, size_t uuid_len,
                                     size_t handle_len, char *err, size_t errlen) {
  if (domain != CCS__MEM_CUDA && domain != CCS__MEM_CUDA_IPC) {
    snprintf(err, errlen, "unknown memory domain %u", domain);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  if (uuid_len != CCS__UUID_BYTES) {
    snprintf(err, errlen, "a GPU is named by its %u-byte UUID, not %zu bytes", CCS__UUID_BYTES,
             uuid_len);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  if (size == 0 || size > SIZE_MAX / 2) { /* the allocation's size (an IPC one's: in the client) */
    snprintf(err, errlen, "a device buffer of %llu bytes", (unsigned long long)size);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  if (domain == CCS__MEM_CUDA_IPC && handle_len != CCS__IPC_MEM_BYTES) {
    snprintf(err, errlen, "a cudaIpcMemHandle_t is %u bytes, not %zu", CCS__IPC_MEM_BYTES,
             handle_len);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  return CCS_OK;
}
