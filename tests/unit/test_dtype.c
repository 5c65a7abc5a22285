/* Narrow float conversions (kernels/dtype.h) against the table-search
 * reference: every code decoded, every value, tie and near-tie encoded,
 * random floats, and known bit patterns. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "dtype.h"
#include "harness.h"
#include "reference.h"

static float kernel_decode(ccs_dtype_t t, uint32_t c) {
  switch (t) {
  case CCS_FLOAT16: return ccs__half_to_float((uint16_t)c);
  case CCS_BFLOAT16: return ccs__bf16_to_float((uint16_t)c);
  case CCS_FLOAT8_E4M3: return ccs__e4m3_to_float((uint8_t)c);
  default: return ccs__e5m2_to_float((uint8_t)c);
  }
}

static uint32_t kernel_encode(ccs_dtype_t t, float f) {
  switch (t) {
  case CCS_FLOAT16: return ccs__float_to_half(f);
  case CCS_BFLOAT16: return ccs__float_to_bf16(f);
  case CCS_FLOAT8_E4M3: return ccs__float_to_e4m3(f);
  default: return ccs__float_to_e5m2(f);
  }
}

static const ccs_dtype_t narrow[] = {CCS_FLOAT16, CCS_BFLOAT16, CCS_FLOAT8_E4M3,
                                     CCS_FLOAT8_E5M2};

static void check_encode(ccs_dtype_t t, float f) {
  uint32_t want = ref_narrow_encode(t, (double)f), got = kernel_encode(t, f);
  if (isnan(f)) {
    if (!isnan(ref_narrow_decode(t, got)))
      fail_msg("%s: NaN encoded as 0x%x, not a NaN", ccs_dtype_name(t), got);
    return;
  }
  if (got != want)
    fail_msg("%s: encode(%a = %.9g) = 0x%x, want 0x%x", ccs_dtype_name(t), (double)f, (double)f,
             got, want);
}

static void test_decode_every_code(void **state) {
  for (size_t k = 0; k < 4; k++) {
    ccs_dtype_t t = narrow[k];
    uint32_t ncodes = ccs_dtype_size(t) == 2 ? 65536 : 256;
    for (uint32_t c = 0; c < ncodes; c++) {
      double want = ref_narrow_decode(t, c), got = kernel_decode(t, c);
      if (isnan(want) ? !isnan(got) : got != want || signbit(got) != signbit(want))
        fail_msg("%s: decode(0x%x) = %a, want %a", ccs_dtype_name(t), c, got, want);
    }
  }
}

static void test_encode_values_and_ties(void **state) {
  for (size_t k = 0; k < 4; k++) {
    ccs_dtype_t t = narrow[k];
    uint32_t ncodes = ccs_dtype_size(t) == 2 ? 65536 : 256;
    for (uint32_t c = 0; c < ncodes; c++) {
      double v = ref_narrow_decode(t, c);
      if (!isfinite(v)) continue;
      check_encode(t, (float)v); /* every value round-trips */
      double next = ref_narrow_decode(t, c + 1);
      if (!isfinite(next) || ((c + 1) & (ncodes / 2 - 1)) == 0) continue;
      float mid = (float)((v + next) / 2); /* exact in float for these formats */
      check_encode(t, mid);                /* a tie: to the even code */
      check_encode(t, nextafterf(mid, (float)-INFINITY));
      check_encode(t, nextafterf(mid, (float)INFINITY));
    }
  }
}

static void test_encode_random_floats(void **state) {
  uint64_t seed = test_seed();
  for (size_t k = 0; k < 4; k++)
    for (uint64_t i = 0; i < 300000; i++) {
      uint32_t bits = (uint32_t)test_mix(seed, i * 4 + k);
      /* half of them in the narrow formats' own exponent range */
      if (i & 1) bits = (bits & 0x80ffffffu) | ((100u + (bits >> 24) % 60u) << 23);
      float f;
      memcpy(&f, &bits, 4);
      check_encode(narrow[k], f);
    }
}

static void test_known_patterns(void **state) {
  assert_int_equal(ccs__float_to_half(1.0f), 0x3c00);
  assert_int_equal(ccs__float_to_half(-2.0f), 0xc000);
  assert_int_equal(ccs__float_to_half(65504.0f), 0x7bff);
  assert_int_equal(ccs__float_to_half(65519.0f), 0x7bff);
  assert_int_equal(ccs__float_to_half(65520.0f), 0x7c00); /* tie rounds to even: inf */
  assert_int_equal(ccs__float_to_half(1.0f / 3), 0x3555);
  assert_int_equal(ccs__float_to_half(0x1p-24f), 0x0001); /* smallest subnormal */
  assert_int_equal(ccs__float_to_half(0x1p-25f), 0x0000); /* tie to even: zero */
  assert_int_equal(ccs__float_to_half(INFINITY), 0x7c00);
  assert_int_equal(ccs__float_to_bf16(1.0f), 0x3f80);
  assert_int_equal(ccs__float_to_bf16(3.140625f), 0x4049);
  assert_int_equal(ccs__float_to_bf16(1.00390625f), 0x3f80); /* 1 + 2^-8: tie, even */
  assert_int_equal(ccs__float_to_bf16(1.01171875f), 0x3f82); /* 1 + 3*2^-8: tie, even */
  assert_int_equal(ccs__float_to_e4m3(448.0f), 0x7e);
  assert_int_equal(ccs__float_to_e4m3(1000.0f), 0x7e);  /* saturates */
  assert_int_equal(ccs__float_to_e4m3(-INFINITY), 0xfe);
  assert_int_equal(ccs__float_to_e4m3(NAN), 0x7f);
  assert_int_equal(ccs__float_to_e4m3(1.0f), 0x38);
  assert_int_equal(ccs__float_to_e4m3(0x1p-9f), 0x01);
  assert_int_equal(ccs__float_to_e5m2(57344.0f), 0x7b);
  assert_int_equal(ccs__float_to_e5m2(INFINITY), 0x7b);
  assert_int_equal(ccs__float_to_e5m2(1.0f), 0x3c);
  assert_true(ccs__e4m3_to_float(0x7e) == 448.0f);
  assert_true(isnan(ccs__e4m3_to_float(0xff)));
  assert_true(isinf(ccs__e5m2_to_float(0x7c)));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_every_code),
      cmocka_unit_test(test_encode_values_and_ties),
      cmocka_unit_test(test_encode_random_floats),
      cmocka_unit_test(test_known_patterns),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
