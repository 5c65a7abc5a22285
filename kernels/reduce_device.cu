/* Device reduction and copy kernels.
 *
 * Every thread reduces 16 bytes of elements per step (one vector load from
 * each input, one vector store to each output) when every pointer is
 * 16-byte aligned, one element otherwise; a grid-stride loop over a grid
 * sized to the device's multiprocessors. Pointers travel in the launch
 * parameters, so no table has to be copied to the device first. */
#include <cuda_runtime.h>

#include "kernels_device.h"
#include "reduce_elem.cuh"

namespace {

enum { THREADS = 512, BLOCKS_PER_SM = 4 };

struct ReduceArgs {
  const void *in[CCS_DEVICE_MAX_PTRS];
  void *out[CCS_DEVICE_MAX_PTRS];
  int nin, nout;
  size_t count, divisor;
};

template <typename T, int VEC> union Pack {
  uint4 raw[VEC * sizeof(T) / 16 > 0 ? VEC * sizeof(T) / 16 : 1];
  T e[VEC];
};

template <typename T, int VEC> __device__ __forceinline__ void load(Pack<T, VEC> &p, const T *src) {
  if (VEC * sizeof(T) == 16) p.raw[0] = *(const uint4 *)src;
  else
    for (int j = 0; j < VEC; j++) p.e[j] = src[j];
}

template <typename T, int VEC> __device__ __forceinline__ void store(T *dst, const Pack<T, VEC> &p) {
  if (VEC * sizeof(T) == 16) *(uint4 *)dst = p.raw[0];
  else
    for (int j = 0; j < VEC; j++) dst[j] = p.e[j];
}

/* Elements [first, first + VEC) of every input into every output. All
 * inputs are read before any output is written: outputs may alias. */
template <typename R, int OP, int VEC>
__device__ __forceinline__ void reduce_at(const ReduceArgs &a, size_t first) {
  typedef typename R::Stored T;
  typename R::Acc acc[VEC];
  Pack<T, VEC> p;
  load<T, VEC>(p, (const T *)a.in[0] + first);
  for (int j = 0; j < VEC; j++) acc[j] = R::load(p.e[j]);
  for (int k = 1; k < a.nin; k++) {
    load<T, VEC>(p, (const T *)a.in[k] + first);
    for (int j = 0; j < VEC; j++) acc[j] = ccs_elem::combine<R, OP>(acc[j], R::load(p.e[j]));
  }
  for (int j = 0; j < VEC; j++) p.e[j] = ccs_elem::finish<R, OP>(acc[j], a.divisor);
  for (int o = 0; o < a.nout; o++) store<T, VEC>((T *)a.out[o] + first, p);
}

template <typename R, int OP, int VEC> __global__ void __launch_bounds__(THREADS) reduce_kernel(ReduceArgs a) {
  size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x, nvec = a.count / VEC;
  for (size_t v = tid; v < nvec; v += stride) reduce_at<R, OP, VEC>(a, v * VEC);
  for (size_t i = nvec * VEC + tid; i < a.count; i += stride) reduce_at<R, OP, 1>(a, i);
}

struct CopyArgs {
  const uint4 *src;
  uint4 *out[CCS_DEVICE_MAX_PTRS];
  int nout;
  size_t n16;
};

__global__ void __launch_bounds__(THREADS) copy_kernel(CopyArgs a) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n16; i += stride) {
    uint4 v = a.src[i];
    for (int o = 0; o < a.nout; o++) a.out[o][i] = v;
  }
}

unsigned grid_for(size_t items) {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1)
    sms = 1;
  size_t blocks = (items + THREADS - 1) / THREADS, most = (size_t)sms * BLOCKS_PER_SM;
  return (unsigned)(blocks < 1 ? 1 : blocks > most ? most : blocks);
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

struct Launch {
  const ReduceArgs *args;
  bool vector;
  cudaStream_t stream;
  template <typename R, int OP> void run() {
    enum { VEC = 16 / sizeof(typename R::Stored) };
    size_t items = vector ? args->count / VEC + args->count % VEC : args->count;
    unsigned grid = grid_for(items);
    (void)cudaGetLastError(); /* this launch's result, not an earlier call's on this thread */
    if (vector) reduce_kernel<R, OP, VEC><<<grid, THREADS, 0, stream>>>(*args);
    else reduce_kernel<R, OP, 1><<<grid, THREADS, 0, stream>>>(*args);
  }
};

struct ByDtype {
  Launch launch;
  ccs_redop_t op;
  bool known_op;
  template <typename R> void run() { known_op = ccs_elem::with_op<R>(op, launch); }
};

} // namespace

extern "C" int ccs__reduce_device(ccs_dtype_t dtype, ccs_redop_t op, size_t avg_divisor,
                                  const void *const *inputs, int ninputs, void *const *outputs,
                                  int noutputs, size_t count, void *stream) {
  if (ninputs < 1 || ninputs > CCS_DEVICE_MAX_PTRS || noutputs < 0 ||
      noutputs > CCS_DEVICE_MAX_PTRS)
    return cudaErrorInvalidValue;
  if (count == 0 || noutputs == 0) return cudaSuccess;
  ReduceArgs a;
  a.nin = ninputs;
  a.nout = noutputs;
  a.count = count;
  a.divisor = avg_divisor;
  bool vector = true;
  for (int k = 0; k < ninputs; k++) vector &= aligned16(a.in[k] = inputs[k]);
  for (int o = 0; o < noutputs; o++) vector &= aligned16(a.out[o] = outputs[o]);
  ByDtype f = {{&a, vector, (cudaStream_t)stream}, op, false};
  if (!ccs_elem::with_dtype(dtype, f) || !f.known_op) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

extern "C" int ccs__copy_device(const void *src, void *const *outputs, int noutputs, size_t bytes,
                                void *stream) {
  if (noutputs < 0 || noutputs > CCS_DEVICE_MAX_PTRS) return cudaErrorInvalidValue;
  CopyArgs a;
  a.src = (const uint4 *)src;
  a.nout = 0;
  a.n16 = bytes / 16;
  bool vector = aligned16(src);
  for (int o = 0; o < noutputs; o++) {
    if (outputs[o] == src) continue;
    vector &= aligned16(outputs[o]);
    a.out[a.nout++] = (uint4 *)outputs[o];
  }
  if (bytes == 0 || a.nout == 0) return cudaSuccess;
  /* Unaligned or ragged: the copy engines handle any alignment. */
  if (!vector || bytes % 16) {
    for (int o = 0; o < a.nout; o++) {
      cudaError_t e = cudaMemcpyAsync(a.out[o], src, bytes, cudaMemcpyDeviceToDevice,
                                      (cudaStream_t)stream);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  unsigned grid = grid_for(a.n16);
  (void)cudaGetLastError(); /* as in ccs__reduce_device */
  copy_kernel<<<grid, THREADS, 0, (cudaStream_t)stream>>>(a);
  return cudaGetLastError();
}
