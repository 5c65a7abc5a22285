/* The device kernels' arithmetic (kernels/reduce_elem.cuh), run on the
 * host, against the exact reference of the tests (reference.c), which
 * shares nothing with kernels/ nor with CUDA's conversions: every dtype
 * and op, random bit patterns (NaN, infinities, subnormals included),
 * integers over their whole range, 1..6 inputs, avg divisors; the bits
 * must be the same (any NaN matches any NaN). Also every 8- and 16-bit
 * pattern through the narrow types' load against the reference's table
 * of values, and random floats through their store against its rounding
 * by table search. Built by nvcc where the toolkit is found; needs no
 * GPU. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include <cmocka.h>

#include "harness.h"
#include "reference.h"
}
#include "reduce_elem.cuh"

using namespace ccs_elem;

enum { COUNT = 4099, MAX_IN = 6 };

/* What the kernel does for one element, on the host. */
struct ElemReduce {
  const unsigned char *const *in;
  int nin;
  size_t divisor, count;
  unsigned char *out;
  template <typename R, int OP> void run() {
    typedef typename R::Stored T;
    for (size_t i = 0; i < count; i++) {
      typename R::Acc acc = R::load(((const T *)in[0])[i]);
      for (int k = 1; k < nin; k++) acc = combine<R, OP>(acc, R::load(((const T *)in[k])[i]));
      ((T *)out)[i] = finish<R, OP>(acc, divisor);
    }
  }
};

struct ElemByDtype {
  ElemReduce r;
  ccs_redop_t op;
  template <typename R> void run() { assert_true(with_op<R>(op, r)); }
};

static void test_reduce_matches_reference(void **state) {
  (void)state;
  static unsigned char in[MAX_IN][COUNT * 8], got[COUNT * 8];
  const unsigned char *inputs[MAX_IN];
  uint64_t seed = test_seed();
  for (int t = 0; t < CCS_DTYPE_COUNT; t++)
    for (int op = 0; op < CCS_REDOP_COUNT; op++)
      for (int nin = 1; nin <= MAX_IN; nin++) {
        ccs_dtype_t dt = (ccs_dtype_t)t;
        for (int k = 0; k < nin; k++) {
          for (size_t i = 0; i < COUNT; i++)
            ref_set_bits(dt, in[k], i, ref_random_bits(dt, test_mix(seed, ((uint64_t)t << 40) ^ ((uint64_t)op << 32) ^ ((uint64_t)k << 24) ^ i)));
          inputs[k] = in[k];
        }
        size_t divisor = op == CCS_AVG ? (size_t)nin : 0;
        ElemByDtype f = {{inputs, nin, divisor, COUNT, got}, (ccs_redop_t)op};
        assert_true(with_dtype(dt, f));
        for (size_t i = 0; i < COUNT; i++) {
          uint64_t v[MAX_IN];
          for (int k = 0; k < nin; k++) v[k] = ref_get_bits(dt, inputs[k], i);
          uint64_t want = ref_reduce_bits(dt, (ccs_redop_t)op, divisor, v, nin), g = ref_get_bits(dt, got, i);
          if (ref_same_bits(dt, g, want)) continue;
          fail_msg("%s %s, %d inputs, element %zu: device arithmetic gives 0x%llx, the reference 0x%llx "
                   "(seed %llu)", ccs_dtype_name(dt), ccs_redop_name((ccs_redop_t)op), nin, i,
                   (unsigned long long)g, (unsigned long long)want, (unsigned long long)seed);
        }
      }
}

/* a float and a value of the reference's table: the same number (NaN any NaN) */
static bool same_value(float f, double want) { return want != want ? f != f : (double)f == want && signbit(f) == signbit(want); }

static void test_narrow_loads(void **state) {
  (void)state;
  for (uint32_t v = 0; v < 65536; v++) {
    if (!same_value(Half::load((uint16_t)v), ref_narrow_decode(CCS_FLOAT16, v)))
      fail_msg("half 0x%04x loads as %a", v, (double)Half::load((uint16_t)v));
    if (!same_value(Bf16::load((uint16_t)v), ref_narrow_decode(CCS_BFLOAT16, v)))
      fail_msg("bf16 0x%04x loads as %a", v, (double)Bf16::load((uint16_t)v));
    if (v > 255) continue;
    if (!same_value(E4M3::load((uint8_t)v), ref_narrow_decode(CCS_FLOAT8_E4M3, v)))
      fail_msg("e4m3 0x%02x loads as %a", v, (double)E4M3::load((uint8_t)v));
    if (!same_value(E5M2::load((uint8_t)v), ref_narrow_decode(CCS_FLOAT8_E5M2, v)))
      fail_msg("e5m2 0x%02x loads as %a", v, (double)E5M2::load((uint8_t)v));
  }
}

static void test_narrow_stores(void **state) {
  (void)state;
  uint64_t seed = test_seed();
  for (uint64_t i = 0; i < 2000000; i++) {
    uint32_t bits = (uint32_t)test_mix(seed, i);
    if (i % 4 == 1) bits &= 0x87ffffffu; /* small magnitudes: subnormals of the narrow types */
    if (i % 4 == 2) bits = (bits & 0x80ffffffu) | 0x47000000u; /* near their largest values */
    float f;
    memcpy(&f, &bits, 4);
    if (f != f) continue; /* NaN payloads may differ; NaN-ness is checked through the reductions */
    uint16_t h = Half::store(f), wh = (uint16_t)ref_narrow_encode(CCS_FLOAT16, f);
    uint16_t b = Bf16::store(f), wb = (uint16_t)ref_narrow_encode(CCS_BFLOAT16, f);
    uint8_t e4 = E4M3::store(f), we4 = (uint8_t)ref_narrow_encode(CCS_FLOAT8_E4M3, f);
    uint8_t e5 = E5M2::store(f), we5 = (uint8_t)ref_narrow_encode(CCS_FLOAT8_E5M2, f);
    if (h != wh || b != wb || e4 != we4 || e5 != we5)
      fail_msg("float bits %08x: device stores half %04x bf16 %04x e4m3 %02x e5m2 %02x, the "
               "reference %04x %04x %02x %02x", bits, h, b, e4, e5, wh, wb, we4, we5);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_narrow_loads),
      cmocka_unit_test(test_narrow_stores),
      cmocka_unit_test(test_reduce_matches_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
