/* ccs-perf built without the CUDA toolkit: --device is refused. */
#include <stdio.h>

#include "perf_device.h"

int perf_device_open(int device, void **ret_stream, char *err, size_t len) {
  snprintf(err, len, "--device: this ccs-perf was built without the CUDA toolkit");
  return -1;
}
void *perf_device_alloc(size_t bytes, int registered, int device) { return NULL; }
void perf_device_free(void *p, int registered) {}
int perf_device_upload(void *dst, const void *src, size_t bytes) { return -1; }
int perf_device_download(void *dst, const void *src, size_t bytes) { return -1; }
int perf_device_sync(void *stream) { return -1; }
double perf_device_copy_gbps(size_t bytes) { return 0; }
