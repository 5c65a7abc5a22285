/* Host reduction and copy kernels.
 *
 * One pass per block: the block of every input is read once into an
 * accumulator that stays in L1, then written once to every output; the last
 * input is combined straight into the first output (unless several outputs
 * are streamed past the caches: there non-temporal stores save more). The inner loops are plain C over fixed-size
 * blocks so the compiler vectorises them.
 */
#include <stdint.h>
#include <stdlib.h>
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

/* A block's result, bytes at offset of every output. */
static void store_outputs(const void *result, size_t offset, size_t bytes, const void *const *in,
                          int nin, void *const *out, int nout, int streaming) {
  for (int o = 0; o < nout; o++) {
    char *dst = (char *)out[o] + offset;
    /* an output that is also an input (in place) is in cache: store normally */
    int alias = 0;
    for (int k = 0; k < nin; k++) alias |= out[o] == in[k];
    if (streaming && !alias) copy_streaming(dst, result, bytes);
    else memcpy(dst, result, bytes);
  }
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
  /* acc[i] = acc[i] op s[i] */                                                               \
  static inline void combine_##NAME(ccs_redop_t op, A *acc, const T *s, size_t n) {           \
    switch (op) {                                                                             \
    case CCS_SUM:                                                                             \
    case CCS_AVG:                                                                             \
      for (size_t i = 0; i < n; i++) acc[i] = add_##NAME(acc[i], LOAD(s[i]));                 \
      break;                                                                                  \
    case CCS_PROD:                                                                            \
      for (size_t i = 0; i < n; i++) acc[i] = mul_##NAME(acc[i], LOAD(s[i]));                 \
      break;                                                                                  \
    case CCS_MAX:                                                                             \
      for (size_t i = 0; i < n; i++) {                                                        \
        A v = LOAD(s[i]);                                                                     \
        acc[i] = acc[i] < v ? v : acc[i];                                                     \
      }                                                                                       \
      break;                                                                                  \
    case CCS_MIN:                                                                             \
      for (size_t i = 0; i < n; i++) {                                                        \
        A v = LOAD(s[i]);                                                                     \
        acc[i] = v < acc[i] ? v : acc[i];                                                     \
      }                                                                                       \
      break;                                                                                  \
    default:                                                                                  \
      break;                                                                                  \
    }                                                                                         \
  }                                                                                           \
  static void reduce_##NAME(ccs_redop_t op, size_t d, const void *const *in, int nin,         \
                            void *const *out, int nout, size_t first, size_t count,           \
                            int streaming) {                                                  \
    A acc[BLOCK];                                                                             \
    T narrow[sizeof(T) != sizeof(A) ? BLOCK : 1];                                             \
    int avg = op == CCS_AVG && d > 0;                                                         \
    /* the last input straight to the first output, unless several are streamed */          \
    int fuse = nin >= 2 && (nout == 1 || (nout > 1 && !streaming));                           \
    for (size_t base = first, end = first + count; base < end; base += BLOCK) {               \
      size_t n = end - base < BLOCK ? end - base : BLOCK;                                     \
      const T *s0 = (const T *)in[0] + base;                                                  \
      if (!(fuse && nin == 2))                                                                \
        for (size_t i = 0; i < n; i++) acc[i] = LOAD(s0[i]);                                  \
      for (int k = 1; k < nin - fuse; k++) combine_##NAME(op, acc, (const T *)in[k] + base, n); \
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
      store_outputs(result, base * sizeof(T), n * sizeof(T), in, nin, out, nout, streaming);  \
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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* float16 through F16C (every x86-64 CPU since 2012) where the CPU has it:
 * the portable conversions cost ~15 ns per element, these convert 8 at a
 * time. The same bits as reduce_f16: every result passes the store, which
 * stores a NaN as ccs__float_to_half does (its sign and 0x7e00). */
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_F16C 1

__attribute__((target("avx,f16c"))) static void halves_to_floats(const uint16_t *s, float *d,
                                                                   size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
  for (; i < n; i++) d[i] = ccs__half_to_float(s[i]);
}

__attribute__((target("avx,f16c"))) static void floats_to_halves(const float *s, uint16_t *d,
                                                                   size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(s + i);
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extractf128_si256(nan, 1));
    __m128i canonical = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16((short)0x8000)),
                                     _mm_set1_epi16(0x7e00));
    _mm_storeu_si128((__m128i *)(d + i), _mm_blendv_epi8(h, canonical, nan16));
  }
  for (; i < n; i++) d[i] = ccs__float_to_half(s[i]);
}

static void reduce_f16_f16c(ccs_redop_t op, size_t d, const void *const *in, int nin,
                            void *const *out, int nout, size_t first, size_t count,
                            int streaming) {
  float acc[BLOCK], next[BLOCK];
  uint16_t narrow[BLOCK];
  for (size_t base = first, end = first + count; base < end; base += BLOCK) {
    size_t n = end - base < BLOCK ? end - base : BLOCK;
    halves_to_floats((const uint16_t *)in[0] + base, acc, n);
    for (int k = 1; k < nin; k++) {
      halves_to_floats((const uint16_t *)in[k] + base, next, n);
      combine_f32(op, acc, next, n);
    }
    if (op == CCS_AVG && d > 0)
      for (size_t i = 0; i < n; i++) acc[i] = div_f32(acc[i], d);
    floats_to_halves(acc, narrow, n);
    store_outputs(narrow, base * sizeof(uint16_t), n * sizeof(uint16_t), in, nin, out, nout,
                  streaming);
  }
}

/* CPUID leaf 1: AVX, F16C, and the OS saving the YMM registers (XGETBV). */
static int cpu_has_f16c(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  int avx = (c >> 28) & 1, f16c = (c >> 29) & 1, osxsave = (c >> 27) & 1;
  if (!avx || !f16c || !osxsave) return 0;
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 6) == 6;
}
#endif

typedef void (*reduce_fn)(ccs_redop_t, size_t, const void *const *, int, void *const *, int,
                          size_t, size_t, int);
static reduce_fn reducers[CCS_DTYPE_COUNT] = {
    [CCS_INT8] = reduce_i8,          [CCS_UINT8] = reduce_u8,
    [CCS_INT32] = reduce_i32,        [CCS_UINT32] = reduce_u32,
    [CCS_INT64] = reduce_i64,        [CCS_UINT64] = reduce_u64,
    [CCS_FLOAT16] = reduce_f16,      [CCS_BFLOAT16] = reduce_bf16,
    [CCS_FLOAT32] = reduce_f32,      [CCS_FLOAT64] = reduce_f64,
    [CCS_FLOAT8_E4M3] = reduce_e4m3, [CCS_FLOAT8_E5M2] = reduce_e5m2,
};

__attribute__((constructor)) static void init_kernels(void) {
  for (int i = 0; i < 256; i++) {
    e4m3_lut[i] = ccs__e4m3_to_float((uint8_t)i);
    e5m2_lut[i] = ccs__e5m2_to_float((uint8_t)i);
  }
#ifdef HAVE_F16C
  if (cpu_has_f16c() && !getenv("CCS_NO_F16C")) reducers[CCS_FLOAT16] = reduce_f16_f16c;
#endif
}

void ccs__reduce_host(ccs_dtype_t dtype, ccs_redop_t op, size_t avg_divisor,
                      const void *const *inputs, int ninputs, void *const *outputs, int noutputs,
                      size_t first, size_t count, int streaming) {
  if ((unsigned)dtype >= CCS_DTYPE_COUNT || ninputs < 1 || count == 0) return;
  reducers[dtype](op, avg_divisor, inputs, ninputs, outputs, noutputs, first, count, streaming);
}

void ccs__copy_host(const void *src, void *const *outputs, int noutputs, size_t offset,
                    size_t bytes, int streaming) {
  for (int o = 0; o < noutputs; o++) {
    if (outputs[o] == src || !bytes) continue;
    const char *s = (const char *)src + offset;
    char *d = (char *)outputs[o] + offset;
    int overlap = d < s + bytes && s < d + bytes;
    if (streaming && !overlap) copy_streaming(d, s, bytes);
    else memmove(d, s, bytes);
  }
}
