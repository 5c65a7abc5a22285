/* Reference arithmetic for the tests, written apart from kernels/: element
 * access through doubles and 64-bit integers, and narrow float rounding by
 * searching a table of every representable value (round to nearest, ties
 * to the even code), so the kernels' bit tricks are checked against
 * something that shares none of them. */
#ifndef CCS_TEST_REFERENCE_H
#define CCS_TEST_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "ccs.h"

static inline int ref_is_float(ccs_dtype_t t) { return t >= CCS_FLOAT16; }
static inline int ref_is_signed(ccs_dtype_t t) {
  return t == CCS_INT8 || t == CCS_INT32 || t == CCS_INT64 || t >= CCS_FLOAT16;
}
int ref_mantissa_bits(ccs_dtype_t t); /* explicit bits; 0 for integers */

/* Narrow float codes <-> double. */
double ref_narrow_decode(ccs_dtype_t t, uint32_t code);
uint32_t ref_narrow_encode(ccs_dtype_t t, double x);

/* Every code's value for the narrow types, built before main. */
extern const double *ref_narrow_values[CCS_DTYPE_COUNT];

/* Element i of a buffer of type t. */
static inline double ref_get(ccs_dtype_t t, const void *buf, size_t i) {
  switch (t) {
  case CCS_INT8: return ((const int8_t *)buf)[i];
  case CCS_UINT8: return ((const uint8_t *)buf)[i];
  case CCS_INT32: return ((const int32_t *)buf)[i];
  case CCS_UINT32: return ((const uint32_t *)buf)[i];
  case CCS_INT64: return (double)((const int64_t *)buf)[i];
  case CCS_UINT64: return (double)((const uint64_t *)buf)[i];
  case CCS_FLOAT32: return ((const float *)buf)[i];
  case CCS_FLOAT64: return ((const double *)buf)[i];
  case CCS_FLOAT16:
  case CCS_BFLOAT16: return ref_narrow_values[t][((const uint16_t *)buf)[i]];
  default: return ref_narrow_values[t][((const uint8_t *)buf)[i]];
  }
}
void ref_set(ccs_dtype_t t, void *buf, size_t i, double v); /* floats: rounded; ints: wrapped */
uint64_t ref_get_bits(ccs_dtype_t t, const void *buf, size_t i); /* raw, zero-extended */
void ref_set_int(ccs_dtype_t t, void *buf, size_t i, int64_t v); /* wrapped to the width */

/* A random small integer for hash h, exact in every type: for prod from
 * {1, 2, -1, -2, 1, 3}, else from -8..8 (0..16 for unsigned types). */
double ref_exact_value(ccs_dtype_t t, ccs_redop_t op, uint64_t h);
/* The same, but exact also where partial results are rounded to the type
 * at every hop (between daemons): fp8, fp16 and bf16 get -1, 0, 1 (and
 * +-1 for prod), whose partial sums of up to 8 ranks every one holds. */
double ref_hop_exact_value(ccs_dtype_t t, ccs_redop_t op, uint64_t h);

/* Integers wrapped to the type's width (sums and products wrap). */
int64_t ref_wrap(ccs_dtype_t t, int64_t v);

/* values[0..n) reduced with op as the collective defines it, in exact
 * arithmetic: integers wrap and average by truncating division, floats are
 * exact (ref_set rounds them to the type). */
double ref_reduce(ccs_dtype_t t, ccs_redop_t op, const double *values, int n);

/* Rank r's element i of an op's input; key tells ops apart (a seed, an
 * op's number). */
typedef double (*ref_input_fn)(ccs_dtype_t t, ccs_redop_t op, uint64_t key, int rank, size_t i);
#define REF_MAX_RANKS 64
/* Element i of the reduction over ranks 0..n-1 (n <= REF_MAX_RANKS) of
 * input: what a reducing collective delivers there, in exact arithmetic. */
double ref_reduced(ref_input_fn input, ccs_dtype_t t, ccs_redop_t op, uint64_t key, int n, size_t i);

/* v as a buffer of type t holds it (rounded, saturated or wrapped): its
 * bits (zero-extended), and its value. */
uint64_t ref_stored_bits(ccs_dtype_t t, double v);
double ref_stored(ccs_dtype_t t, double v);

/* Does got match want within one rounding step of the type? (exact for
 * integers, NaN matches NaN) */
int ref_close(ccs_dtype_t t, double got, double want);

#endif
