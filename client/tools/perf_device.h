/* ccs-perf --device: buffers on a GPU, ops on a stream (perf_device.c
 * where the CUDA toolkit is; otherwise every call says it is missing). */
#ifndef CCS_PERF_DEVICE_H
#define CCS_PERF_DEVICE_H

#include <stddef.h>

/* Selects `device` and makes a stream on it; -1 with a message in err. */
int perf_device_open(int device, void **ret_stream, char *err, size_t len);
/* ccs_mem_alloc_device (registered) or cudaMalloc; NULL on failure. */
void *perf_device_alloc(size_t bytes, int registered, int device);
void perf_device_free(void *p, int registered);
int perf_device_upload(void *dst, const void *src, size_t bytes);
int perf_device_download(void *dst, const void *src, size_t bytes);
int perf_device_sync(void *stream);
/* The device's own copy bandwidth (read + write of `bytes`, GB/s of bytes
 * copied), to put the collectives' numbers next to. */
double perf_device_copy_gbps(size_t bytes);

#endif
