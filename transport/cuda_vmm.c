/* CUDA virtual memory shared between processes (cuda_vmm.h). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_vmm.h"

static struct {
  CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                     unsigned long long);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*address_free)(CUdeviceptr, size_t);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*export_fd)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                        unsigned long long);
  CUresult (*import_fd)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
  CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
  CUresult (*props)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
  CUresult (*error_string)(CUresult, const char **);
  CUresult (*address_range)(CUdeviceptr *, size_t *, CUdeviceptr);
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*primary_state)(CUdevice, unsigned int *, int *);
  CUresult (*current)(CUcontext *);
  CUresult (*set_current)(CUcontext);
  CUresult (*uuid)(CUuuid *, CUdevice);
  CUresult (*host_register)(void *, size_t, unsigned int);
  CUresult (*host_unregister)(void *);
  CUresult (*host_device_ptr)(CUdeviceptr *, void *, unsigned int);
  CUresult (*write32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  CUresult (*wait32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
} cu;

/* Every device's UUID, read once: registrations and events name GPUs by
 * UUID, and asking the runtime for a device's properties costs ~1 ms. */
static int nuuids;
static uint8_t uuids[64][16];

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char unusable[256]; /* empty: usable */

static int entry(const char *symbol, void **fn) {
  enum cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion(symbol, fn, 12000, cudaEnableDefault, &status) !=
          cudaSuccess ||
      status != cudaDriverEntryPointSuccess || !*fn) {
    snprintf(unusable, sizeof(unusable), "the CUDA driver has no %s", symbol);
    return -1;
  }
  return 0;
}

static void load(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(unusable, sizeof(unusable), "%s (%s)",
             e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice ? "no CUDA driver or GPU"
                                                                        : "CUDA unusable",
             cudaGetErrorString(e));
    return;
  }
  if (n == 0) {
    snprintf(unusable, sizeof(unusable), "no GPU visible");
    return;
  }
  (void)(entry("cuMemCreate", (void **)&cu.create) || entry("cuMemRelease", (void **)&cu.release) ||
         entry("cuMemAddressReserve", (void **)&cu.reserve) ||
         entry("cuMemAddressFree", (void **)&cu.address_free) ||
         entry("cuMemMap", (void **)&cu.map) || entry("cuMemUnmap", (void **)&cu.unmap) ||
         entry("cuMemSetAccess", (void **)&cu.set_access) ||
         entry("cuMemExportToShareableHandle", (void **)&cu.export_fd) ||
         entry("cuMemImportFromShareableHandle", (void **)&cu.import_fd) ||
         entry("cuMemGetAllocationGranularity", (void **)&cu.granularity) ||
         entry("cuMemGetAllocationPropertiesFromHandle", (void **)&cu.props) ||
         entry("cuGetErrorString", (void **)&cu.error_string) ||
         entry("cuMemGetAddressRange", (void **)&cu.address_range) ||
         entry("cuDeviceGet", (void **)&cu.device_get) ||
         entry("cuDevicePrimaryCtxGetState", (void **)&cu.primary_state) ||
         entry("cuCtxGetCurrent", (void **)&cu.current) ||
         entry("cuCtxSetCurrent", (void **)&cu.set_current) ||
         entry("cuDeviceGetUuid", (void **)&cu.uuid) ||
         entry("cuMemHostRegister", (void **)&cu.host_register) ||
         entry("cuMemHostUnregister", (void **)&cu.host_unregister) ||
         entry("cuMemHostGetDevicePointer", (void **)&cu.host_device_ptr) ||
         entry("cuStreamWriteValue32", (void **)&cu.write32) ||
         entry("cuStreamWaitValue32", (void **)&cu.wait32));
  if (unusable[0]) return;
  for (int d = 0; d < n && d < 64; d++) {
    CUdevice dev;
    CUuuid u;
    if (cu.device_get(&dev, d) != CUDA_SUCCESS || cu.uuid(&u, dev) != CUDA_SUCCESS) break;
    memcpy(uuids[d], u.bytes, 16);
    nuuids = d + 1;
  }
}

int ccs__cuda_usable(char *why, size_t len) {
  pthread_once(&once, load);
  if (why && len) snprintf(why, len, "%s", unusable);
  return unusable[0] ? -1 : 0;
}

static int failed(CUresult r, const char *what, char *err, size_t errlen) {
  const char *text = NULL;
  if (cu.error_string) cu.error_string(r, &text);
  snprintf(err, errlen, "%s: %s (CUDA driver error %d)", what, text ? text : "unknown", (int)r);
  return -1;
}

/* Reserves an address range for size bytes of h and maps it, read-write
 * for the devices given. */
static int map_handle(CUmemGenericAllocationHandle h, size_t size, size_t align,
                      const CUmemAccessDesc *access, size_t naccess, void **ret_ptr, char *err,
                      size_t errlen) {
  CUdeviceptr va = 0;
  CUresult r = cu.reserve(&va, size, align, 0, 0);
  if (r != CUDA_SUCCESS) return failed(r, "cannot reserve device addresses", err, errlen);
  if ((r = cu.map(va, size, 0, h, 0)) != CUDA_SUCCESS) {
    cu.address_free(va, size);
    return failed(r, "cannot map the allocation (is it smaller than claimed?)", err, errlen);
  }
  if ((r = cu.set_access(va, size, access, naccess)) != CUDA_SUCCESS) {
    cu.unmap(va, size);
    cu.address_free(va, size);
    return failed(r, "cannot grant access to the allocation", err, errlen);
  }
  *ret_ptr = (void *)(uintptr_t)va;
  return 0;
}

static CUmemAccessDesc rw_for(int device) {
  CUmemAccessDesc a;
  memset(&a, 0, sizeof(a));
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = device;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

int ccs__vmm_alloc(int device, size_t bytes, void **ret_ptr, size_t *ret_size, int *ret_fd,
                   char *err, size_t errlen) {
  if (ccs__cuda_usable(err, errlen)) return -1;
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  CUresult r = cu.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS || gran == 0) return failed(r, "no allocation granularity", err, errlen);
  if (bytes > SIZE_MAX - gran) {
    snprintf(err, errlen, "%zu bytes is more than a device can hold", bytes);
    return -1;
  }
  size_t size = (bytes + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle h;
  if ((r = cu.create(&h, size, &prop, 0)) != CUDA_SUCCESS)
    return failed(r, "cannot allocate device memory", err, errlen);
  CUmemAccessDesc access = rw_for(device);
  int fd = -1;
  if (map_handle(h, size, gran, &access, 1, ret_ptr, err, errlen)) {
    cu.release(h);
    return -1;
  }
  if ((r = cu.export_fd(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) != CUDA_SUCCESS) {
    ccs__vmm_unmap(*ret_ptr, size);
    cu.release(h);
    return failed(r, "cannot export the allocation as a file descriptor", err, errlen);
  }
  cu.release(h); /* the mapping keeps the memory */
  *ret_size = size;
  *ret_fd = fd;
  return 0;
}

int ccs__vmm_import(int fd, size_t size, const int *devices, int ndevices, void **ret_ptr,
                    int *ret_device, char *err, size_t errlen) {
  if (ccs__cuda_usable(err, errlen)) return -1;
  CUmemGenericAllocationHandle h;
  CUresult r = cu.import_fd(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS)
    return failed(r, "not a CUDA allocation exported as a file descriptor", err, errlen);
  CUmemAllocationProp prop;
  size_t gran = 0;
  if ((r = cu.props(&prop, h)) != CUDA_SUCCESS ||
      (r = cu.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) != CUDA_SUCCESS ||
      prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    cu.release(h);
    return failed(r, "cannot read the allocation's properties", err, errlen);
  }
  if (size == 0 || !gran || size % gran) {
    cu.release(h);
    snprintf(err, errlen, "a device allocation's size is a multiple of %zu bytes, not %zu", gran,
             size);
    return -1;
  }
  enum { MOST = 64 };
  CUmemAccessDesc access[MOST];
  size_t n = 0;
  access[n++] = rw_for(prop.location.id);
  for (int i = 0; i < ndevices && n < MOST; i++) {
    int can = 0;
    if (devices[i] != prop.location.id &&
        cudaDeviceCanAccessPeer(&can, devices[i], prop.location.id) == cudaSuccess && can)
      access[n++] = rw_for(devices[i]);
  }
  int rc = map_handle(h, size, gran, access, n, ret_ptr, err, errlen);
  cu.release(h);
  *ret_device = prop.location.id;
  return rc;
}

void ccs__vmm_unmap(void *ptr, size_t size) {
  if (!ptr || ccs__cuda_usable(NULL, 0)) return;
  cu.unmap((CUdeviceptr)(uintptr_t)ptr, size);
  cu.address_free((CUdeviceptr)(uintptr_t)ptr, size);
}

int ccs__cuda_ipc_handle(const void *ptr, void **ret_base, size_t *ret_size, uint8_t *handle,
                         char *err, size_t errlen) {
  if (ccs__cuda_usable(err, errlen)) return -1;
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = cu.address_range(&base, &size, (CUdeviceptr)(uintptr_t)ptr);
  if (r != CUDA_SUCCESS) return failed(r, "not device memory", err, errlen);
  cudaIpcMemHandle_t h;
  cudaError_t e = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "no IPC handle for it: %s", cudaGetErrorString(e));
    return -1;
  }
  memcpy(handle, &h, sizeof(h));
  *ret_base = (void *)(uintptr_t)base;
  *ret_size = size;
  return 0;
}

int ccs__cuda_ipc_open(const uint8_t *handle, int device, void **ret_ptr, void **ret_block,
                       size_t *ret_block_size, char *err, size_t errlen) {
  if (ccs__cuda_usable(err, errlen)) return -1;
  cudaIpcMemHandle_t h;
  memcpy(&h, handle, sizeof(h));
  void *ptr = NULL;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cannot open the IPC handle: %s", cudaGetErrorString(e));
    return e == cudaErrorAlreadyMapped ? 1 : -1;
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = cu.address_range(&base, &size, (CUdeviceptr)(uintptr_t)ptr);
  if (r != CUDA_SUCCESS) {
    cudaIpcCloseMemHandle(ptr);
    return failed(r, "no size for the opened handle", err, errlen);
  }
  *ret_ptr = ptr;
  *ret_block = (void *)(uintptr_t)base;
  *ret_block_size = size;
  return 0;
}

void ccs__cuda_ipc_close(void *ptr) {
  if (ptr && !ccs__cuda_usable(NULL, 0)) cudaIpcCloseMemHandle(ptr);
}

int ccs__cuda_has_context(void) {
  if (ccs__cuda_usable(NULL, 0)) return 0;
  CUcontext cur = NULL;
  if (cu.current(&cur) == CUDA_SUCCESS && cur) return 1;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  for (int d = 0; d < n; d++) {
    CUdevice dev;
    unsigned flags = 0;
    int active = 0;
    if (cu.device_get(&dev, d) == CUDA_SUCCESS &&
        cu.primary_state(dev, &flags, &active) == CUDA_SUCCESS && active)
      return 1;
  }
  return 0;
}

int ccs__cuda_uuid_of_device(int device, uint8_t *uuid) {
  if (ccs__cuda_usable(NULL, 0) || device < 0 || device >= nuuids) return -1;
  memcpy(uuid, uuids[device], 16);
  return 0;
}

int ccs__cuda_device_of_uuid(const uint8_t *uuid) {
  if (ccs__cuda_usable(NULL, 0)) return -1;
  for (int d = 0; d < nuuids; d++)
    if (memcmp(uuids[d], uuid, 16) == 0) return d;
  return -1;
}

void *ccs__cuda_context_save(void) {
  CUcontext cur = NULL;
  if (!ccs__cuda_usable(NULL, 0)) cu.current(&cur);
  return cur;
}

void ccs__cuda_context_restore(void *saved) {
  if (!ccs__cuda_usable(NULL, 0)) cu.set_current((CUcontext)saved);
}

int ccs__cuda_host_register(void *ptr, size_t len, char *err, size_t errlen) {
  if (ccs__cuda_usable(err, errlen)) return -1;
  CUresult r = cu.host_register(ptr, len, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  return r == CUDA_SUCCESS
             ? 0
             : failed(r, "cannot register a page of host memory (stream flags, completions) with CUDA",
                      err, errlen);
}

void ccs__cuda_host_unregister(void *ptr) {
  if (ptr && !ccs__cuda_usable(NULL, 0)) cu.host_unregister(ptr);
}

/* The device address of a registered host word, in the current context. */
static int device_word(_Atomic uint32_t *word, CUdeviceptr *ret, char *err, size_t errlen) {
  if (ccs__cuda_usable(err, errlen)) return -1;
  CUresult r = cu.host_device_ptr(ret, (void *)word, 0);
  return r == CUDA_SUCCESS ? 0 : failed(r, "the stream flags are not registered", err, errlen);
}

int ccs__cuda_stream_write32(void *stream, _Atomic uint32_t *word, uint32_t value, char *err,
                             size_t errlen) {
  CUdeviceptr at;
  if (device_word(word, &at, err, errlen)) return -1;
  CUresult r = cu.write32((CUstream)stream, at, value, CU_STREAM_WRITE_VALUE_DEFAULT);
  return r == CUDA_SUCCESS ? 0 : failed(r, "cannot write a stream flag", err, errlen);
}

int ccs__cuda_stream_wait32(void *stream, _Atomic uint32_t *word, uint32_t value, char *err,
                            size_t errlen) {
  CUdeviceptr at;
  if (device_word(word, &at, err, errlen)) return -1;
  CUresult r = cu.wait32((CUstream)stream, at, value, CU_STREAM_WAIT_VALUE_GEQ);
  return r == CUDA_SUCCESS ? 0 : failed(r, "cannot wait for a stream flag", err, errlen);
}
