/* ccs-perf --device, over the CUDA runtime (perf_device.h). */
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "ccs.h"
#include "perf_device.h"

int perf_device_open(int device, void **ret_stream, char *err, size_t len) {
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags((cudaStream_t *)ret_stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) snprintf(err, len, "GPU %d: %s", device, cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : -1;
}

void *perf_device_alloc(size_t bytes, int registered, int device) {
  void *p = NULL;
  if (registered) return ccs_mem_alloc_device(&p, bytes, device) == CCS_OK ? p : NULL;
  return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

void perf_device_free(void *p, int registered) {
  if (registered) ccs_mem_free(p);
  else cudaFree(p);
}

/* A cudaMemcpy from pageable memory returns before its DMA lands, and the
 * calls run on a non-blocking stream (or in the daemon), which does not
 * wait for the legacy stream: the upload is waited for. */
int perf_device_upload(void *dst, const void *src, size_t bytes) {
  return cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
                 cudaStreamSynchronize(0) == cudaSuccess
             ? 0
             : -1;
}

int perf_device_download(void *dst, const void *src, size_t bytes) {
  return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

int perf_device_sync(void *stream) {
  return cudaStreamSynchronize((cudaStream_t)stream) == cudaSuccess ? 0 : -1;
}

double perf_device_copy_gbps(size_t bytes) {
  void *a = NULL, *b = NULL;
  cudaEvent_t t0, t1;
  float ms = 0;
  double gbps = 0;
  if (cudaMalloc(&a, bytes) || cudaMalloc(&b, bytes) || cudaEventCreate(&t0) || cudaEventCreate(&t1))
    return 0;
  enum { REPS = 20 };
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice); /* warm up */
  cudaEventRecord(t0, 0);
  for (int i = 0; i < REPS; i++) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
  cudaEventRecord(t1, 0);
  if (cudaEventSynchronize(t1) == cudaSuccess && cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess && ms > 0)
    gbps = (double)bytes * REPS / (ms * 1e6);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaFree(a);
  cudaFree(b);
  return gbps;
}
