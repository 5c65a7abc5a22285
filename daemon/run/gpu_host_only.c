/* The CUDA memory domain of a daemon built without the CUDA toolkit: it
 * runs host-only and says so; device requests never get this far (the
 * registrations are refused with the reason). */
#include <stdio.h>

#include "run/gpu.h"

void ccsd_gpu_environment(void) {}

struct gpu *ccsd_gpu_start(uv_loop_t *loop, char *why, size_t len) {
  snprintf(why, len, "built without the CUDA toolkit");
  return NULL;
}

void ccsd_gpu_stop(struct gpu *g) {}
void ccsd_gpu_free(struct gpu *g) {}
void ccsd_gpu_describe(const struct gpu *g, char *buf, size_t len) { snprintf(buf, len, "none"); }

ccs_result_t ccsd_gpu_map(struct gpu *g, int fd, uint64_t size, const uint8_t *uuid,
                          void **ret_base, int *ret_device, char *err, size_t errlen) {
  snprintf(err, errlen, "this daemon was built without the CUDA toolkit");
  return CCS_ERR_UNSUPPORTED;
}

void ccsd_gpu_unmap(void *base, size_t size) {}
ccs_result_t ccsd_gpu_open_ipc(struct gpu *g, const uint8_t *handle, const uint8_t *uuid,
                               void **ret_ptr, void **ret_block, size_t *ret_block_size,
                               int *ret_device, int *ret_held, char *err, size_t errlen) {
  *ret_held = 0;
  snprintf(err, errlen, "this daemon was built without the CUDA toolkit");
  return CCS_ERR_UNSUPPORTED;
}
void ccsd_gpu_close_ipc(void *base) {}

struct engine_pool *ccsd_gpu_pool(struct gpu *g, int device) { return NULL; }
const uint64_t *ccsd_gpu_reach(const struct gpu *g) { return NULL; }
void ccsd_gpu_submit(struct gpu *g, struct run_op *x) {}
int ccsd_gpu_error_is_sticky(int cuda_error) { return 0; }
int ccsd_gpu_flags_register(struct gpu *g, struct gpu_flags *f, char *why, size_t len) {
  snprintf(why, len, "built without the CUDA toolkit");
  return -1;
}
