/* Reference arithmetic for the tests, written apart from kernels/: element
 * access by value (doubles) and by bits, reductions computed exactly on
 * the bits (integers in 64-bit integer arithmetic, never through double),
 * and narrow float rounding by searching a table of every representable
 * value (round to nearest, ties to the even code), so the kernels' bit
 * tricks are checked against something that shares none of them. */
#ifndef CCS_TEST_REFERENCE_H
#define CCS_TEST_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "ccs.h"

static inline int ref_is_float(ccs_dtype_t t) { return t >= CCS_FLOAT16; }
static inline int ref_is_signed(ccs_dtype_t t) {
  return t == CCS_INT8 || t == CCS_INT32 || t == CCS_INT64 || t >= CCS_FLOAT16;
}

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

/* v as a buffer of type t holds it (rounded, saturated or wrapped): its
 * bits (zero-extended), and its value. */
uint64_t ref_stored_bits(ccs_dtype_t t, double v);
double ref_stored(ccs_dtype_t t, double v);

/* --- exact bits --------------------------------------------------------
 * Elements as the bits a buffer holds (zero-extended), and reductions
 * computed on them exactly, with nothing of kernels/: integers in 64-bit
 * two's complement, cut to the width (sums and products wrap), compared
 * signed or unsigned as the type is, avg the wrapped sum divided by the
 * divisor, truncating; floats decoded exactly (narrow ones by the table),
 * combined from the first input to the last in the accumulator type
 * (float for float32 and the narrow types, double for float64: each step
 * computed in double and rounded to float by the C cast, which for +, *
 * and / is float arithmetic exactly), max and min as `acc < v ? v : acc`
 * and `v < acc ? v : acc`, avg divided once at the end, and a narrow
 * result rounded once, by the table. */
#define REF_MAX_RANKS 64 /* the most inputs of one reduction the tests make */
void ref_set_bits(ccs_dtype_t t, void *buf, size_t i, uint64_t bits);
uint64_t ref_reduce_bits(ccs_dtype_t t, ccs_redop_t op, size_t divisor, const uint64_t *bits, int n);
/* bits as an integer of the type (sign-extended for signed types) */
int64_t ref_int_of(ccs_dtype_t t, uint64_t bits);
/* Is the element with these bits a NaN? */
int ref_bits_nan(ccs_dtype_t t, uint64_t bits);
/* The same element: equal bits, or both NaN (a NaN's sign and payload are
 * whichever operand's the compiled code kept). */
int ref_same_bits(ccs_dtype_t t, uint64_t got, uint64_t want);
/* A random element for hash h, over the type's whole range: for integers
 * any bits, a quarter of them the edges (0, 1, -1 or the maximum, the
 * minimum, the largest and smallest of the other sign); for floats any
 * bits: NaNs, infinities and subnormals included. */
uint64_t ref_random_bits(ccs_dtype_t t, uint64_t h);

#endif
