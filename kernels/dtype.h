/* Element types: sizes, names, and the conversions of the narrow floating
 * point types to and from float. Narrow types are reduced in float and
 * rounded once, to nearest even, when stored. */
#ifndef CCS_KERNELS_DTYPE_H
#define CCS_KERNELS_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "ccs.h"

static inline uint32_t ccs__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float ccs__f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* IEEE binary16. Overflow becomes infinity, as in IEEE arithmetic. */
static inline float ccs__half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return ccs__f32_from_bits(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
  }
  return ccs__f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint16_t ccs__float_to_half(float f) {
  uint32_t x = ccs__f32_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
  if (ax < 0x38800000u) {
    /* Below the smallest normal (2^-14): adding 0.5 makes the FPU round at
     * the subnormal quantum 2^-24, to nearest even. */
    float v = ccs__f32_from_bits(ax) + 0.5f;
    return (uint16_t)(sign | (ccs__f32_bits(v) - 0x3f000000u));
  }
  ax += 0xc8000fffu + ((ax >> 13) & 1u); /* rebias 127 -> 15, round half to even */
  return (uint16_t)(sign | (ax >> 13));
}

/* bfloat16: the top half of a float, rounded to nearest even. */
static inline float ccs__bf16_to_float(uint16_t h) { return ccs__f32_from_bits((uint32_t)h << 16); }

static inline uint16_t ccs__float_to_bf16(float f) {
  uint32_t x = ccs__f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

/* OCP float8. Conversions follow CUDA's __NV_SATFINITE mode: finite values
 * and infinities beyond the largest finite saturate to it; NaN stays NaN.
 * E4M3 (bias 7, max 448, no infinity, NaN = S.1111.111);
 * E5M2 (bias 15, max 57344, the top byte of a binary16). */
static inline float ccs__e4m3_to_float(uint8_t c) {
  uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = (c >> 3) & 0xfu, m = c & 7u;
  if (e == 15 && m == 7) return ccs__f32_from_bits(sign | 0x7fc00000u);
  if (e == 0) {
    float v = (float)m * 0x1p-9f;
    return sign ? -v : v;
  }
  return ccs__f32_from_bits(sign | ((e + 120u) << 23) | (m << 20));
}

static inline float ccs__e5m2_to_float(uint8_t c) { return ccs__half_to_float((uint16_t)(c << 8)); }

/* Round |x| (float bits, finite, at most the format's max) to a format with
 * `mbits` mantissa bits and exponent bias `bias`, to nearest even. */
static inline uint32_t ccs__narrow_round(uint32_t ax, int mbits, int bias) {
  uint32_t min_normal = (uint32_t)(127 - bias + 1) << 23;
  if (ax < min_normal) {
    /* Adding 2^k whose ulp is the subnormal quantum 2^(1-bias-mbits). */
    uint32_t magic = (uint32_t)(127 + 1 - bias - mbits + 23) << 23;
    float v = ccs__f32_from_bits(ax) + ccs__f32_from_bits(magic);
    return ccs__f32_bits(v) - magic;
  }
  int shift = 23 - mbits;
  ax -= (uint32_t)(127 - bias) << 23;
  ax += (1u << (shift - 1)) - 1u + ((ax >> shift) & 1u);
  return ax >> shift;
}

static inline uint8_t ccs__float_to_e4m3(float f) {
  uint32_t x = ccs__f32_bits(f), sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
  if (ax >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448 */
  return (uint8_t)(sign | ccs__narrow_round(ax, 3, 7));
}

static inline uint8_t ccs__float_to_e5m2(float f) {
  uint32_t x = ccs__f32_bits(f), sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
  if (ax >= 0x47600000u) return (uint8_t)(sign | 0x7bu); /* >= 57344 */
  return (uint8_t)(sign | ccs__narrow_round(ax, 2, 15));
}

#endif
