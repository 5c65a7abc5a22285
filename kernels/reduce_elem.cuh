/* One element of a device reduction: load into the accumulator type,
 * combine, divide for avg, store. Host-and-device code, so the arithmetic
 * the kernels run is unit-tested on a machine without a GPU against the
 * host kernels (tests/unit/test_reduce_elem.cu): both must give the same
 * bits. Narrow floats reduce in float and round once on store, integers
 * wrap, max/min use the host's comparisons (same NaN handling). */
#ifndef CCS_KERNELS_REDUCE_ELEM_CUH
#define CCS_KERNELS_REDUCE_ELEM_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "ccs.h"

#define CCS_HD __host__ __device__ __forceinline__

namespace ccs_elem {

/* Stored: the element type; Acc: what inputs are combined in. Integers:
 * U is the type sums and products are computed in (unsigned: defined
 * overflow), Wide what avg divides in. */
template <typename T, typename U, typename Wide> struct Int {
  typedef T Stored;
  typedef T Acc;
  static CCS_HD T load(T v) { return v; }
  static CCS_HD T store(T a) { return a; }
  static CCS_HD T add(T a, T b) { return (T)((U)a + (U)b); }
  static CCS_HD T mul(T a, T b) { return (T)((U)a * (U)b); }
  static CCS_HD T div(T a, size_t d) { return (T)((Wide)a / (Wide)d); }
};

template <typename T> struct Float {
  typedef T Stored;
  typedef T Acc;
  static CCS_HD Acc load(T v) { return v; }
  static CCS_HD T store(Acc a) { return a; }
  static CCS_HD T add(T a, T b) { return a + b; }
  static CCS_HD T mul(T a, T b) { return a * b; }
  static CCS_HD T div(T a, size_t d) { return a / (T)d; }
};

/* Narrow floats: stored as raw bits, combined in float. */
struct NarrowBase {
  typedef float Acc;
  static CCS_HD float add(float a, float b) { return a + b; }
  static CCS_HD float mul(float a, float b) { return a * b; }
  static CCS_HD float div(float a, size_t d) { return a / (float)d; }
};

struct Half : NarrowBase {
  typedef uint16_t Stored;
  static CCS_HD float load(uint16_t v) {
    __half_raw r;
    r.x = v;
    return __half2float(__half(r));
  }
  static CCS_HD uint16_t store(float a) { return __half_raw(__float2half_rn(a)).x; }
};

struct Bf16 : NarrowBase {
  typedef uint16_t Stored;
  static CCS_HD float load(uint16_t v) {
    __nv_bfloat16_raw r;
    r.x = v;
    return __bfloat162float(__nv_bfloat16(r));
  }
  static CCS_HD uint16_t store(float a) { return __nv_bfloat16_raw(__float2bfloat16_rn(a)).x; }
};

template <__nv_fp8_interpretation_t KIND> struct Fp8 : NarrowBase {
  typedef uint8_t Stored;
  static CCS_HD float load(uint8_t v) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, KIND)));
  }
  static CCS_HD uint8_t store(float a) {
    return (uint8_t)__nv_cvt_float_to_fp8(a, __NV_SATFINITE, KIND);
  }
};

/* Combine a value into the accumulator under `op` (never CCS_AVG's
 * divide: that is finish()). */
template <typename R, int OP>
CCS_HD typename R::Acc combine(typename R::Acc acc, typename R::Acc v) {
  if (OP == CCS_SUM || OP == CCS_AVG) return R::add(acc, v);
  if (OP == CCS_PROD) return R::mul(acc, v);
  if (OP == CCS_MAX) return acc < v ? v : acc;
  return v < acc ? v : acc; /* CCS_MIN */
}

template <typename R, int OP>
CCS_HD typename R::Stored finish(typename R::Acc acc, size_t divisor) {
  if (OP == CCS_AVG && divisor > 0) acc = R::div(acc, divisor);
  return R::store(acc);
}

typedef Int<int8_t, uint8_t, int64_t> I8;
typedef Int<uint8_t, uint8_t, uint64_t> U8;
typedef Int<int32_t, uint32_t, int64_t> I32;
typedef Int<uint32_t, uint32_t, uint64_t> U32;
typedef Int<int64_t, uint64_t, int64_t> I64;
typedef Int<uint64_t, uint64_t, uint64_t> U64;
typedef Float<float> F32;
typedef Float<double> F64;
typedef Fp8<__NV_E4M3> E4M3;
typedef Fp8<__NV_E5M2> E5M2;

/* Calls f.template run<R>() with the element kind of `dtype`;
 * false for an unknown type. */
template <typename F> bool with_dtype(ccs_dtype_t dtype, F &f) {
  switch (dtype) {
  case CCS_INT8: f.template run<I8>(); return true;
  case CCS_UINT8: f.template run<U8>(); return true;
  case CCS_INT32: f.template run<I32>(); return true;
  case CCS_UINT32: f.template run<U32>(); return true;
  case CCS_INT64: f.template run<I64>(); return true;
  case CCS_UINT64: f.template run<U64>(); return true;
  case CCS_FLOAT16: f.template run<Half>(); return true;
  case CCS_BFLOAT16: f.template run<Bf16>(); return true;
  case CCS_FLOAT32: f.template run<F32>(); return true;
  case CCS_FLOAT64: f.template run<F64>(); return true;
  case CCS_FLOAT8_E4M3: f.template run<E4M3>(); return true;
  case CCS_FLOAT8_E5M2: f.template run<E5M2>(); return true;
  default: return false;
  }
}

/* The same for the reduction op. */
template <typename R, typename F> bool with_op(ccs_redop_t op, F &f) {
  switch (op) {
  case CCS_SUM: f.template run<R, CCS_SUM>(); return true;
  case CCS_PROD: f.template run<R, CCS_PROD>(); return true;
  case CCS_MAX: f.template run<R, CCS_MAX>(); return true;
  case CCS_MIN: f.template run<R, CCS_MIN>(); return true;
  case CCS_AVG: f.template run<R, CCS_AVG>(); return true;
  default: return false;
  }
}

} // namespace ccs_elem

#endif
