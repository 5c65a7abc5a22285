/* The client's CUDA domain: device allocations the daemon maps (VMM fds),
 * asynchronous copies for staging, and the stream flags that keep a CUDA
 * stream's order around a call without waiting for the daemon (a flag
 * written and a flag waited for on the caller's stream; proto/ring.h).
 * Whatever context the caller's thread had, it has again afterwards. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_vmm.h"
#include "internal.h"

static ccs_result_t cuda_failed(cudaError_t e, const char *what) {
  ccs__set_error("%s: %s (CUDA error %d)", what, cudaGetErrorString(e), (int)e);
  return CCS_ERR_CUDA;
}

ccs_result_t ccs__gpu_usable(void) {
  char why[256];
  if (ccs__cuda_usable(why, sizeof(why)) == 0) return CCS_OK;
  ccs__set_error("device buffers need CUDA, unusable here: %s", why);
  return CCS_ERR_UNSUPPORTED;
}

static int count_loads(struct dl_phdr_info *info, size_t size, void *loads) {
  *(unsigned long long *)loads = info->dlpi_adds;
  return 1; /* the first object says it */
}

/* Whether the process uses CUDA at all (the driver library is loaded),
 * asked without loading it: a host-only job, which may fork CUDA processes
 * later, must not find the driver initialised by libccs. Every collective
 * asks, and dlopen costs ~16 us: the answer is asked of the loader again
 * only when it loaded something since (dlpi_adds, ~20 ns to read). */
static int process_uses_cuda(void) {
  static _Atomic int found;
  static _Atomic unsigned long long absent_at = ~0ull; /* loads counted when last absent */
  if (atomic_load_explicit(&found, memory_order_relaxed)) return 1;
  unsigned long long loads = 0;
  dl_iterate_phdr(count_loads, &loads);
  if (loads == atomic_load_explicit(&absent_at, memory_order_relaxed)) return 0;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h) {
    dlclose(h);
    atomic_store(&found, 1); /* a library once loaded stays */
    return 1;
  }
  atomic_store(&absent_at, loads);
  return 0;
}

int ccs__gpu_device_of(const void *ptr) {
  struct cudaPointerAttributes a;
  if (!ptr) return -1;
  int known = ccs__mem_device_of(ptr);
  if (known != -2) return known;
  /* a host-only job stays without a driver and a context from libccs */
  if (!process_uses_cuda() || ccs__cuda_usable(NULL, 0) || !ccs__cuda_has_context()) return -1;
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    cudaGetLastError(); /* not sticky: forget it */
    return -1;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

int ccs__gpu_current_device(void) {
  int device = -1;
  if (!process_uses_cuda() || ccs__cuda_usable(NULL, 0) || !ccs__cuda_has_context()) return -1;
  return cudaGetDevice(&device) == cudaSuccess ? device : -1;
}

ccs_result_t ccs__gpu_uuid(int device, uint8_t *uuid) {
  ccs_result_t rc = ccs__gpu_usable();
  if (rc != CCS_OK) return rc;
  if (ccs__cuda_uuid_of_device(device, uuid)) {
    ccs__set_error("no GPU %d here", device);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  return CCS_OK;
}

ccs_result_t ccs__gpu_ipc_handle(const void *ptr, void **ret_base, size_t *ret_size,
                                 uint8_t *handle, int *ret_device) {
  char err[256];
  ccs_result_t rc = ccs__gpu_usable();
  if (rc != CCS_OK) return rc;
  if ((*ret_device = ccs__gpu_device_of(ptr)) < 0) {
    ccs__set_error("%p is not device memory: host memory is shared with the daemon only when "
                   "ccs_mem_alloc made it (other host buffers are staged)", ptr);
    return CCS_ERR_UNSUPPORTED;
  }
  if (ccs__cuda_ipc_handle(ptr, ret_base, ret_size, handle, err, sizeof(err))) {
    ccs__set_error("%s", err);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  return CCS_OK;
}

ccs_result_t ccs__gpu_alloc(int device, size_t bytes, void **ret_ptr, size_t *ret_size,
                            int *ret_fd) {
  char err[256];
  if (ccs__vmm_alloc(device, bytes, ret_ptr, ret_size, ret_fd, err, sizeof(err)) == 0)
    return CCS_OK;
  ccs__set_error("GPU %d: %s", device, err);
  return CCS_ERR_CUDA;
}

void ccs__gpu_unmap(void *ptr, size_t size) { ccs__vmm_unmap(ptr, size); }

ccs_result_t ccs__gpu_copy(void *dst, const void *src, size_t bytes, void *stream) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
  return e == cudaSuccess ? CCS_OK : cuda_failed(e, "staging copy");
}

int ccs__gpu_event_done(void *event) { return cudaEventQuery((cudaEvent_t)event) != cudaErrorNotReady; }

void ccs__gpu_event_free(void *event) { cudaEventDestroy((cudaEvent_t)event); }

ccs_result_t ccs__gpu_record(void **event, int device, void *stream) {
  cudaError_t e = cudaSuccess;
  if (!*event) {
    void *was = ccs__cuda_context_save();
    e = cudaSetDevice(device);
    if (e == cudaSuccess)
      e = cudaEventCreateWithFlags((cudaEvent_t *)event, cudaEventDisableTiming);
    ccs__cuda_context_restore(was);
  }
  if (e == cudaSuccess) e = cudaEventRecord((cudaEvent_t)*event, (cudaStream_t)stream);
  return e == cudaSuccess ? CCS_OK : cuda_failed(e, "recording an event");
}

ccs_result_t ccs__gpu_sync(void *stream) {
  cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
  return e == cudaSuccess ? CCS_OK : cuda_failed(e, "waiting for the stream");
}

/* A context for the thread: its own where it has one (the caller's
 * stream is of it), else the device's primary one; and back. */
static void *enter(int device) {
  void *was = ccs__cuda_context_save();
  if (!was) cudaSetDevice(device);
  return was;
}

static void leave(void *was) {
  if (!was) ccs__cuda_context_restore(NULL);
}

/* The flags are one page: registered whole, for every device (portable). */
ccs_result_t ccs__gpu_flags_register(void *page, int device) {
  char err[256];
  ccs_result_t rc = ccs__gpu_usable();
  if (rc != CCS_OK) return rc;
  void *was = enter(device);
  int failed = ccs__cuda_host_register(page, 4096, err, sizeof(err));
  leave(was);
  if (failed) {
    ccs__set_error("%s", err);
    return CCS_ERR_CUDA;
  }
  return CCS_OK;
}

void ccs__gpu_flags_unregister(void *page) { ccs__cuda_host_unregister(page); }

ccs_result_t ccs__gpu_flag_write(void *stream, int device, _Atomic uint32_t *flag, uint32_t value) {
  char err[256];
  void *was = enter(device);
  int failed = ccs__cuda_stream_write32(stream, flag, value, err, sizeof(err));
  leave(was);
  if (!failed) return CCS_OK;
  ccs__set_error("%s", err);
  return CCS_ERR_CUDA;
}

ccs_result_t ccs__gpu_flag_wait(void *stream, int device, _Atomic uint32_t *flag, uint32_t value) {
  char err[256];
  void *was = enter(device);
  int failed = ccs__cuda_stream_wait32(stream, flag, value, err, sizeof(err));
  leave(was);
  if (!failed) return CCS_OK;
  ccs__set_error("%s", err);
  return CCS_ERR_CUDA;
}

int ccs__gpu_capturing(void *stream) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing((cudaStream_t)stream, &st) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return st != cudaStreamCaptureStatusNone;
}
