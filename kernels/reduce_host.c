/* Host reduction and copy kernels.
 *
 * One pass per block: the block of every input is read once into an
 * accumulator that stays in L1, then written once to every output; the last
 * input is combined straight into the first output (unless several outputs
 * are streamed past the caches: there non-temporal stores save more). The inner loops are plain C over fixed-size
 * blocks so the compiler vectorises them.
 */
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "dtype.h"
#include "kernels.h"

enum { BLOCK = 2048 };

/* float8 to float through tables: 256 entries each, and a load is then one
 * indexed read instead of a dozen branches. */
static float e4m3_lut[256], e5m2_lut[256];

__attribute__((constructor)) static void fill_luts(void) {
  for (int i = 0; i < 256; i++) {
    e4m3_lut[i] = ccs__e4m3_to_float((uint8_t)i);
    e5m2_lut[i] = ccs__e5m2_to_float((uint8_t)i);
  }
}

#define E4M3_LOAD(x) e4m3_lut[x]
#define E5M2_LOAD(x) e5m2_lut[x]

/* memcpy with non-temporal stores where the target allows. */
static void copy_streaming(void *dst, const void *src, size_t bytes) {
#ifdef __SSE2__
  char *d = dst;
  const char *s = src;
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > bytes) head = bytes;
  memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
    _mm_stream_si128((__m128i *)d, a);
    _mm_stream_si128((__m128i *)(d + 16), b);
    _mm_stream_si128((__m128i *)(d + 32), c);
    _mm_stream_si128((__m128i *)(d + 48), e);
  }
  memcpy(d, s, bytes);
#else
  memcpy(dst, src, bytes);
#endif
}

void ccs__stream_fence(void) {
#ifdef __SSE2__
  _mm_sfence();
#endif
}

/* Integer sums and products wrap (computed unsigned: no signed overflow). */
#define WRAP_ADD(T, U) (T)((U)(a) + (U)(b))
#define WRAP_MUL(T, U) (T)((U)(a) * (U)(b))

/* The first n elements of dst: the last input s combined with what came
 * before (s0 when it is the only one, else acc), finished (AVG divides)
 * and stored: a block's inputs are still read before its output is
 * written at the same index, so an output may be one of the inputs. */
#define FUSED(NAME, T, A, LOAD, STORE, COMBINE)                                               \
  do {                                                                                        \
    if (nin == 2 && avg)                                                                      \
      for (size_t i = 0; i < n; i++) {                                                        \
        A a = LOAD(s0[i]), b = LOAD(s[i]);                                                    \
        dst[i] = STORE(div_##NAME(COMBINE, d));                                               \
      }                                                                                       \
    else if (nin == 2)                                                                        \
      for (size_t i = 0; i < n; i++) {                                                        \
        A a = LOAD(s0[i]), b = LOAD(s[i]);                                                    \
        dst[i] = STORE(COMBINE);                                                              \
      }                                                                                       \
    else if (avg)                                                                             \
      for (size_t i = 0; i < n; i++) {                                                        \
        A a = acc[i], b = LOAD(s[i]);                                                         \
        dst[i] = STORE(div_##NAME(COMBINE, d));                                               \
      }                                                                                       \
    else                                                                                      \
      for (size_t i = 0; i < n; i++) {                                                        \
        A a = acc[i], b = LOAD(s[i]);                                                         \
        dst[i] = STORE(COMBINE);                                                              \
      }                                                                                       \
  } while (0)

/* NAME: suffix; T: element type; A: accumulator type; LOAD/STORE convert
 * between them; ADD/MUL combine a and b in A; DIV divides x by d. */
#define DEFINE_REDUCE(NAME, T, A, LOAD, STORE, ADD, MUL, DIV)                                  \
  static inline A add_##NAME(A a, A b) { return ADD; }                                        \
  static inline A mul_##NAME(A a, A b) { return MUL; }                                        \
  static inline A div_##NAME(A x, size_t d) { return DIV; }                                   \
  static void reduce_##NAME(ccs_redop_t op, size_t d, const void *const *in, int nin,         \
                            void *const *out, int nout, size_t count, int streaming) {        \
    A acc[BLOCK];                                                                             \
    T narrow[sizeof(T) != sizeof(A) ? BLOCK : 1];                                             \
    int avg = op == CCS_AVG && d > 0;                                                         \
    /* the last input straight to the first output, unless several are streamed */          \
    int fuse = nin >= 2 && (nout == 1 || (nout > 1 && !streaming));                           \
    for (size_t base = 0; base < count; base += BLOCK) {                                      \
      size_t n = count - base < BLOCK ? count - base : BLOCK;                                 \
      const T *s0 = (const T *)in[0] + base;                                                  \
      if (!(fuse && nin == 2))                                                                \
        for (size_t i = 0; i < n; i++) acc[i] = LOAD(s0[i]);                                  \
      for (int k = 1; k < nin - fuse; k++) {                                                  \
        const T *s = (const T *)in[k] + base;                                                 \
        switch (op) {                                                                         \
        case CCS_SUM:                                                                         \
        case CCS_AVG:                                                                         \
          for (size_t i = 0; i < n; i++) acc[i] = add_##NAME(acc[i], LOAD(s[i]));             \
          break;                                                                              \
        case CCS_PROD:                                                                        \
          for (size_t i = 0; i < n; i++) acc[i] = mul_##NAME(acc[i], LOAD(s[i]));             \
          break;                                                                              \
        case CCS_MAX:                                                                         \
          for (size_t i = 0; i < n; i++) {                                                    \
            A v = LOAD(s[i]);                                                                 \
            acc[i] = acc[i] < v ? v : acc[i];                                                 \
          }                                                                                   \
          break;                                                                              \
        case CCS_MIN:                                                                         \
          for (size_t i = 0; i < n; i++) {                                                    \
            A v = LOAD(s[i]);                                                                 \
            acc[i] = v < acc[i] ? v : acc[i];                                                 \
          }                                                                                   \
          break;                                                                              \
        default:                                                                              \
          break;                                                                              \
        }                                                                                     \
      }                                                                                       \
      if (fuse) {                                                                             \
        const T *s = (const T *)in[nin - 1] + base;                                           \
        T *dst = (T *)out[0] + base;                                                          \
        switch (op) {                                                                         \
        case CCS_SUM: case CCS_AVG: FUSED(NAME, T, A, LOAD, STORE, add_##NAME(a, b)); break;  \
        case CCS_PROD: FUSED(NAME, T, A, LOAD, STORE, mul_##NAME(a, b)); break;               \
        case CCS_MAX: FUSED(NAME, T, A, LOAD, STORE, a < b ? b : a); break;                   \
        case CCS_MIN: FUSED(NAME, T, A, LOAD, STORE, b < a ? b : a); break;                   \
        default: break;                                                                       \
        }                                                                                     \
        for (int o = 1; o < nout; o++) memcpy((T *)out[o] + base, dst, n * sizeof(T));        \
        continue;                                                                             \
      }                                                                                       \
      if (avg)                                                                                \
        for (size_t i = 0; i < n; i++) acc[i] = div_##NAME(acc[i], d);                        \
      /* narrow types: rounded once, then copied to every output */                          \
      const T *result = (const T *)acc;                                                       \
      if (sizeof(T) != sizeof(A)) {                                                           \
        for (size_t i = 0; i < n; i++) narrow[i] = STORE(acc[i]);                             \
        result = narrow;                                                                      \
      }                                                                                       \
      for (int o = 0; o < nout; o++) {                                                        \
        T *dst = (T *)out[o] + base;                                                          \
        /* an output that is also an input (in place) is in cache: store normally */         \
        int alias = 0;                                                                        \
        for (int k = 0; k < nin; k++) alias |= out[o] == in[k];                               \
        if (streaming && !alias) copy_streaming(dst, result, n * sizeof(T));                  \
        else memcpy(dst, result, n * sizeof(T));                                              \
      }                                                                                       \
    }                                                                                         \
  }

#define SAME(x) (x)
/* W: a type wide enough to divide by any rank count without wrapping. */
#define INT_REDUCE(NAME, T, U, W) \
  DEFINE_REDUCE(NAME, T, T, SAME, SAME, WRAP_ADD(T, U), WRAP_MUL(T, U), (T)((W)x / (W)d))
#define FLOAT_REDUCE(NAME, T, A, LOAD, STORE) \
  DEFINE_REDUCE(NAME, T, A, LOAD, STORE, a + b, a * b, x / (A)d)

INT_REDUCE(i8, int8_t, uint8_t, int64_t)
INT_REDUCE(u8, uint8_t, uint8_t, uint64_t)
INT_REDUCE(i32, int32_t, uint32_t, int64_t)
INT_REDUCE(u32, uint32_t, uint32_t, uint64_t)
INT_REDUCE(i64, int64_t, uint64_t, int64_t)
INT_REDUCE(u64, uint64_t, uint64_t, uint64_t)
FLOAT_REDUCE(f16, uint16_t, float, ccs__half_to_float, ccs__float_to_half)
FLOAT_REDUCE(bf16, uint16_t, float, ccs__bf16_to_float, ccs__float_to_bf16)
FLOAT_REDUCE(f32, float, float, SAME, SAME)
FLOAT_REDUCE(f64, double, double, SAME, SAME)
FLOAT_REDUCE(e4m3, uint8_t, float, E4M3_LOAD, ccs__float_to_e4m3)
FLOAT_REDUCE(e5m2, uint8_t, float, E5M2_LOAD, ccs__float_to_e5m2)

typedef void (*reduce_fn)(ccs_redop_t, size_t, const void *const *, int, void *const *, int,
                          size_t, int);
static const reduce_fn reducers[CCS_DTYPE_COUNT] = {
    [CCS_INT8] = reduce_i8,          [CCS_UINT8] = reduce_u8,
    [CCS_INT32] = reduce_i32,        [CCS_UINT32] = reduce_u32,
    [CCS_INT64] = reduce_i64,        [CCS_UINT64] = reduce_u64,
    [CCS_FLOAT16] = reduce_f16,      [CCS_BFLOAT16] = reduce_bf16,
    [CCS_FLOAT32] = reduce_f32,      [CCS_FLOAT64] = reduce_f64,
    [CCS_FLOAT8_E4M3] = reduce_e4m3, [CCS_FLOAT8_E5M2] = reduce_e5m2,
};

void ccs__reduce_host(ccs_dtype_t dtype, ccs_redop_t op, size_t avg_divisor,
                      const void *const *inputs, int ninputs, void *const *outputs, int noutputs,
                      size_t count, int streaming) {
  if ((unsigned)dtype >= CCS_DTYPE_COUNT || ninputs < 1 || count == 0) return;
  reducers[dtype](op, avg_divisor, inputs, ninputs, outputs, noutputs, count, streaming);
}

void ccs__copy_host(const void *src, void *const *outputs, int noutputs, size_t bytes,
                    int streaming) {
  for (int o = 0; o < noutputs; o++) {
    if (outputs[o] == src || !bytes) continue;
    const char *s = src;
    char *d = outputs[o];
    int overlap = d < s + bytes && s < d + bytes;
    if (streaming && !overlap) copy_streaming(d, s, bytes);
    else memmove(d, s, bytes);
  }
}
