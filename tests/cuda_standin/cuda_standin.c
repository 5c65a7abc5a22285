/* A stand-in for the CUDA runtime and driver, on host memory, for tests of
 * the GPU code's own logic on machines without a GPU (cuda_standin.h).
 *
 * It defines the runtime's functions (and the driver's, handed out by
 * cudaGetDriverEntryPointByVersion as the real runtime does) that the
 * daemon's GPU domain, the client's and the kernels' launchers call, so a
 * test that links this file ahead of the static runtime gets these, never
 * NVIDIA's. What it models: devices and their UUIDs, each thread's current
 * context (a device's primary one after cudaSetDevice), the thread's last
 * error as cudaGetLastError reads and clears it, launches that succeed or
 * fail as the test asks, memory from malloc (device memory to
 * cudaPointerGetAttributes), peer access, and which thread
 * called what. Streams run what they are given at once on the caller's
 * thread (host functions on a thread of their own, as a GPU would call
 * them); no kernel computes anything: the tests check the control, the
 * arithmetic is checked on host and on a real GPU (tests/gpu/run.sh). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_standin.h"

struct standin standin;

static __thread cudaError_t last_error;
static __thread CUcontext current; /* NULL: none */
static __thread int current_device;
static char primary[STANDIN_MAX_DEVICES]; /* a device's primary context: &primary[d] */
static _Atomic int primary_active[STANDIN_MAX_DEVICES];
static _Atomic int initialised;

void standin_reset(int ndevices) {
  memset(&standin, 0, sizeof(standin));
  standin.ndevices = ndevices;
  standin.loop = pthread_self();
  last_error = cudaSuccess;
  current = NULL;
  atomic_store(&initialised, 0);
  for (int d = 0; d < STANDIN_MAX_DEVICES; d++) atomic_store(&primary_active[d], 0);
}

void standin_set_last_error(cudaError_t e) { last_error = e; }
void *standin_context_of(int device) { return &primary[device]; }
void *standin_current_context(void) { return current; }
void standin_set_current_context(void *ctx) { current = ctx; }

/* The runtime starts with its first call: it reads CUDA_MODULE_LOADING then. */
static void init(void) {
  if (atomic_exchange(&initialised, 1)) return;
  const char *v = getenv("CUDA_MODULE_LOADING");
  snprintf(standin.module_loading, sizeof(standin.module_loading), "%s", v ? v : "");
}

static cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

/* --- runtime: devices and errors ------------------------------------------ */

cudaError_t cudaGetDeviceCount(int *count) {
  init();
  *count = standin.ndevices;
  return standin.ndevices ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
  init();
  atomic_fetch_add(&standin.set_device_calls, 1);
  if (device < 0 || device >= standin.ndevices) return fail(cudaErrorInvalidDevice);
  current_device = device;
  current = (CUcontext)(void *)&primary[device];
  atomic_store(&primary_active[device], 1);
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  init();
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  init();
  if (device < 0 || device >= standin.ndevices) return fail(cudaErrorInvalidDevice);
  memset(prop, 0, sizeof(*prop));
  snprintf(prop->name, sizeof(prop->name), "stand-in GPU %d", device);
  prop->multiProcessorCount = 4;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  (void)attr;
  if (device < 0 || device >= standin.ndevices) return fail(cudaErrorInvalidDevice);
  *value = 4;
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer) {
  *can = device != peer && device < standin.ndevices && peer < standin.ndevices;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  (void)flags;
  if (peer < 0 || peer >= standin.ndevices || peer == current_device) return fail(cudaErrorInvalidDevice);
  if (standin.peer[current_device][peer]) return fail(cudaErrorPeerAccessAlreadyEnabled);
  standin.peer[current_device][peer] = 1;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "stand-in error"; }

/* --- runtime: memory -------------------------------------------------------- */

/* The allocations cudaMalloc made, so a pointer into one is device memory
 * of its GPU to cudaPointerGetAttributes, as libccs asks. */
struct allocation {
  struct allocation *next;
  char *base;
  size_t size;
  int device;
};
static struct allocation *allocations;
static pthread_mutex_t allocations_mu = PTHREAD_MUTEX_INITIALIZER;

cudaError_t cudaMalloc(void **ptr, size_t size) {
  init();
  struct allocation *a = malloc(sizeof(*a));
  if (!a || !(*ptr = malloc(size ? size : 1))) {
    free(a);
    return fail(cudaErrorMemoryAllocation);
  }
  *a = (struct allocation){NULL, *ptr, size ? size : 1, current_device};
  pthread_mutex_lock(&allocations_mu);
  a->next = allocations;
  allocations = a;
  pthread_mutex_unlock(&allocations_mu);
  atomic_fetch_add(&standin.mallocs, 1);
  return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
  if (!ptr) return cudaSuccess;
  pthread_mutex_lock(&allocations_mu);
  for (struct allocation **p = &allocations; *p; p = &(*p)->next)
    if ((*p)->base == ptr) {
      struct allocation *a = *p;
      *p = a->next;
      free(a);
      break;
    }
  pthread_mutex_unlock(&allocations_mu);
  free(ptr);
  atomic_fetch_add(&standin.frees, 1);
  if (pthread_equal(pthread_self(), standin.loop)) atomic_fetch_add(&standin.frees_on_loop, 1);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  (void)kind, (void)stream;
  memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, count, kind, NULL);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *ptr) {
  memset(a, 0, sizeof(*a));
  a->type = cudaMemoryTypeUnregistered;
  pthread_mutex_lock(&allocations_mu);
  for (const struct allocation *m = allocations; m; m = m->next)
    if ((const char *)ptr >= m->base && (const char *)ptr < m->base + m->size) {
      a->type = cudaMemoryTypeDevice;
      a->device = m->device;
      a->devicePointer = (void *)(uintptr_t)ptr;
      break;
    }
  pthread_mutex_unlock(&allocations_mu);
  return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *ptr) {
  (void)handle, (void)ptr;
  return fail(cudaErrorNotSupported);
}

cudaError_t cudaIpcOpenMemHandle(void **ptr, cudaIpcMemHandle_t handle, unsigned int flags) {
  (void)ptr, (void)handle, (void)flags;
  return fail(cudaErrorNotSupported);
}

cudaError_t cudaIpcCloseMemHandle(void *ptr) {
  (void)ptr;
  return cudaSuccess;
}

/* --- runtime: streams, events, host functions -------------------------------- */

struct host_call {
  cudaHostFn_t fn;
  void *arg;
};

static void *host_call(void *arg) {
  struct host_call c = *(struct host_call *)arg;
  free(arg);
  c.fn(c.arg);
  return NULL;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *arg) {
  (void)stream;
  struct host_call *c = malloc(sizeof(*c));
  pthread_t t;
  pthread_attr_t attr;
  if (!c) return fail(cudaErrorMemoryAllocation);
  *c = (struct host_call){fn, arg};
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int failed = pthread_create(&t, &attr, host_call, c);
  pthread_attr_destroy(&attr);
  if (failed) {
    free(c);
    return fail(cudaErrorMemoryAllocation);
  }
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  (void)flags;
  *stream = malloc(1);
  atomic_fetch_add(&standin.streams, 1);
  return *stream ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  free(stream);
  atomic_fetch_sub(&standin.streams, 1);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  (void)stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  (void)stream;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
  (void)stream;
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  (void)flags;
  *event = malloc(1);
  return *event ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  (void)event, (void)stream;
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  (void)stream, (void)event, (void)flags;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  (void)event;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  free(event);
  return cudaSuccess;
}

/* --- what nvcc's host code calls: registration and launches ------------------- */

static char fatbin_handle;

void **__cudaRegisterFatBinary(void *fatbin) {
  (void)fatbin;
  return (void **)&fatbin_handle;
}
void __cudaRegisterFatBinaryEnd(void **handle) { (void)handle; }
void __cudaUnregisterFatBinary(void **handle) { (void)handle; }
void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun,
                            const char *device_name, int thread_limit, uint3 *tid, uint3 *bid,
                            dim3 *block, dim3 *grid, int *size) {
  (void)handle, (void)host_fun, (void)device_fun, (void)device_name, (void)thread_limit;
  (void)tid, (void)bid, (void)block, (void)grid, (void)size;
}

static __thread struct {
  dim3 grid, block;
  size_t shared;
  void *stream;
} pushed;

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, struct CUstream_st *stream) {
  pushed.grid = grid, pushed.block = block, pushed.shared = shared, pushed.stream = stream;
  return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared, void *stream) {
  *grid = pushed.grid, *block = pushed.block, *shared = pushed.shared;
  *(void **)stream = pushed.stream;
  return cudaSuccess;
}

cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *fun) {
  *kernel = (cudaKernel_t)(void *)fun;
  return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args,
                               size_t shared, cudaStream_t stream) {
  (void)kernel, (void)grid, (void)block, (void)args, (void)shared, (void)stream;
  atomic_fetch_add(&standin.launches, 1);
  return fail((cudaError_t)atomic_exchange(&standin.fail_next_launch, cudaSuccess));
}

/* --- the driver, as cudaGetDriverEntryPointByVersion hands it out ------------- */

static CUresult cu_not_supported(void) { return CUDA_ERROR_NOT_SUPPORTED; }

static CUresult cu_get_error_string(CUresult r, const char **text) {
  *text = r == CUDA_SUCCESS ? "no error" : "stand-in driver error";
  return CUDA_SUCCESS;
}

static CUresult cu_device_get(CUdevice *dev, int ordinal) {
  if (ordinal < 0 || ordinal >= standin.ndevices) return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}

static CUresult cu_device_get_uuid(CUuuid *uuid, CUdevice dev) {
  atomic_fetch_add(&standin.uuid_reads, 1);
  memset(uuid->bytes, 0, sizeof(uuid->bytes));
  memcpy(uuid->bytes, "standin-gpu", 11);
  uuid->bytes[15] = (char)(0x40 + dev);
  return CUDA_SUCCESS;
}

static CUresult cu_primary_state(CUdevice dev, unsigned int *flags, int *active) {
  *flags = 0;
  *active = atomic_load(&primary_active[dev]);
  return CUDA_SUCCESS;
}

static CUresult cu_ctx_get_current(CUcontext *ctx) {
  *ctx = current;
  return CUDA_SUCCESS;
}

static CUresult cu_ctx_set_current(CUcontext ctx) {
  current = ctx;
  for (int d = 0; d < standin.ndevices; d++)
    if (ctx == (CUcontext)(void *)&primary[d]) current_device = d;
  return CUDA_SUCCESS;
}

static CUresult cu_host_register(void *p, size_t len, unsigned int flags) {
  (void)p, (void)len, (void)flags;
  return CUDA_SUCCESS;
}

static CUresult cu_host_unregister(void *p) {
  (void)p;
  atomic_fetch_add(&standin.host_unregisters, 1);
  return CUDA_SUCCESS;
}

static CUresult cu_host_device_ptr(CUdeviceptr *ret, void *p, unsigned int flags) {
  (void)flags;
  *ret = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

/* Stream writes held back, as a GPU still busy before them would. */
static struct held_write {
  _Atomic uint32_t *at;
  uint32_t value;
} held_writes[4096];
static int nheld;
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;

void standin_release_writes(void) {
  pthread_mutex_lock(&held_mu);
  atomic_store(&standin.hold_writes, 0);
  for (int i = 0; i < nheld; i++) atomic_store(held_writes[i].at, held_writes[i].value);
  nheld = 0;
  pthread_mutex_unlock(&held_mu);
}

/* Which context the stream's work is queued in: the thread's current one. */
static CUresult cu_write32(CUstream stream, CUdeviceptr at, cuuint32_t value, unsigned int flags) {
  (void)stream, (void)flags;
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  standin.last_stream_context = current;
  _Atomic uint32_t *word = (_Atomic uint32_t *)(uintptr_t)at;
  pthread_mutex_lock(&held_mu);
  int hold = atomic_load(&standin.hold_writes) && nheld < 4096;
  if (hold) held_writes[nheld++] = (struct held_write){word, value};
  pthread_mutex_unlock(&held_mu);
  if (!hold) atomic_store(word, value);
  return CUDA_SUCCESS;
}

static CUresult cu_wait32(CUstream stream, CUdeviceptr at, cuuint32_t value, unsigned int flags) {
  (void)stream, (void)at, (void)value, (void)flags;
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  standin.last_stream_context = current;
  return CUDA_SUCCESS;
}

static const struct {
  const char *name;
  void *fn;
} driver[] = {
    {"cuGetErrorString", (void *)cu_get_error_string},
    {"cuDeviceGet", (void *)cu_device_get},
    {"cuDeviceGetUuid", (void *)cu_device_get_uuid},
    {"cuDevicePrimaryCtxGetState", (void *)cu_primary_state},
    {"cuCtxGetCurrent", (void *)cu_ctx_get_current},
    {"cuCtxSetCurrent", (void *)cu_ctx_set_current},
    {"cuMemHostRegister", (void *)cu_host_register},
    {"cuMemHostUnregister", (void *)cu_host_unregister},
    {"cuMemHostGetDevicePointer", (void *)cu_host_device_ptr},
    {"cuStreamWriteValue32", (void *)cu_write32},
    {"cuStreamWaitValue32", (void *)cu_wait32},
};

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status) {
  (void)version, (void)flags;
  init();
  *fn = (void *)cu_not_supported; /* virtual memory and the rest: refused when called */
  for (size_t i = 0; i < sizeof(driver) / sizeof(driver[0]); i++)
    if (!strcmp(driver[i].name, symbol)) *fn = driver[i].fn;
  *status = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}
