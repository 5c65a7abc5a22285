/* The client's CUDA domain in a build without the CUDA toolkit: no
 * pointer is device memory, and asking for one says why not. */
#include "internal.h"

static ccs_result_t absent(void) {
  ccs__set_error("device buffers need CUDA; this libccs was built without the CUDA toolkit");
  return CCS_ERR_UNSUPPORTED;
}

ccs_result_t ccs__gpu_usable(void) { return absent(); }
int ccs__gpu_device_of(const void *ptr) { return -1; }
int ccs__gpu_current_device(void) { return -1; }
ccs_result_t ccs__gpu_uuid(int device, uint8_t *uuid) { return absent(); }
ccs_result_t ccs__gpu_ipc_handle(const void *ptr, void **ret_base, size_t *ret_size,
                                 uint8_t *handle, int *ret_device) {
  return absent();
}
ccs_result_t ccs__gpu_alloc(int device, size_t bytes, void **ret_ptr, size_t *ret_size,
                            int *ret_fd) {
  return absent();
}
void ccs__gpu_unmap(void *ptr, size_t size) {}
ccs_result_t ccs__gpu_copy(void *dst, const void *src, size_t bytes, void *stream) {
  return absent();
}
int ccs__gpu_event_done(void *event) { return 1; }
void ccs__gpu_event_free(void *event) {}
ccs_result_t ccs__gpu_record(void **event, int device, void *stream) { return absent(); }
ccs_result_t ccs__gpu_flags_register(void *page, int device) { return absent(); }
void ccs__gpu_flags_unregister(void *page) {}
ccs_result_t ccs__gpu_flag_write(void *stream, int device, _Atomic uint32_t *flag, uint32_t value) {
  return absent();
}
ccs_result_t ccs__gpu_flag_wait(void *stream, int device, _Atomic uint32_t *flag, uint32_t value) {
  return absent();
}
int ccs__gpu_capturing(void *stream) { return 0; }
ccs_result_t ccs__gpu_sync(void *stream) { return absent(); }
