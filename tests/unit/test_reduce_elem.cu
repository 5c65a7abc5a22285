/* The device kernels' arithmetic (kernels/reduce_elem.cuh), run on the
 * host, against the host kernels: every dtype and op, random bit patterns
 * (NaN, infinities, subnormals included), 1..6 inputs, avg divisors. Both
 * must give the same bits (any NaN matches any NaN). Also every 8- and
 * 16-bit pattern through the narrow types' load, and random floats
 * through their store. Built by nvcc where the toolkit is found; needs no
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

#include "dtype.h"
#include "harness.h"
#include "kernels.h"
}
#include "reduce_elem.cuh"

using namespace ccs_elem;

enum { COUNT = 4099, MAX_IN = 6 };

/* NaN of the stored type, by its bits. */
static bool is_nan(ccs_dtype_t t, const unsigned char *p) {
  uint64_t u = 0;
  switch (t) {
  case CCS_FLOAT16: memcpy(&u, p, 2); return (u & 0x7c00) == 0x7c00 && (u & 0x3ff);
  case CCS_BFLOAT16: memcpy(&u, p, 2); return (u & 0x7f80) == 0x7f80 && (u & 0x7f);
  case CCS_FLOAT8_E4M3: return (*p & 0x7f) == 0x7f;
  case CCS_FLOAT8_E5M2: return (*p & 0x7c) == 0x7c && (*p & 3);
  case CCS_FLOAT32: { float f; memcpy(&f, p, 4); return f != f; }
  case CCS_FLOAT64: { double d; memcpy(&d, p, 8); return d != d; }
  default: return false;
  }
}

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

static void test_reduce_matches_host(void **state) {
  (void)state;
  static unsigned char in[MAX_IN][COUNT * 8], want[COUNT * 8], got[COUNT * 8];
  const unsigned char *inputs[MAX_IN];
  uint64_t seed = test_seed();
  for (int t = 0; t < CCS_DTYPE_COUNT; t++)
    for (int op = 0; op < CCS_REDOP_COUNT; op++)
      for (int nin = 1; nin <= MAX_IN; nin++) {
        ccs_dtype_t dt = (ccs_dtype_t)t;
        size_t sz = ccs_dtype_size(dt), bytes = COUNT * sz;
        for (int k = 0; k < nin; k++) {
          for (size_t b = 0; b < bytes; b += 8) {
            uint64_t h = test_mix(seed, ((uint64_t)t << 40) ^ ((uint64_t)op << 32) ^ ((uint64_t)k << 24) ^ b);
            memcpy(in[k] + b, &h, bytes - b < 8 ? bytes - b : 8);
          }
          inputs[k] = in[k];
        }
        size_t divisor = op == CCS_AVG ? (size_t)nin : 0;
        void *outs[1] = {want};
        ccs__reduce_host(dt, (ccs_redop_t)op, divisor, (const void *const *)inputs, nin, outs, 1, 0,
                         COUNT, 0);
        ElemByDtype f = {{inputs, nin, divisor, COUNT, got}, (ccs_redop_t)op};
        assert_true(with_dtype(dt, f));
        for (size_t i = 0; i < COUNT; i++) {
          const unsigned char *w = want + i * sz, *g = got + i * sz;
          if (memcmp(w, g, sz) == 0 || (is_nan(dt, w) && is_nan(dt, g))) continue;
          fail_msg("%s %s, %d inputs, element %zu: device arithmetic differs from the host's "
                   "(seed %llu)", ccs_dtype_name(dt), ccs_redop_name((ccs_redop_t)op), nin, i,
                   (unsigned long long)seed);
        }
      }
}

static void test_narrow_loads(void **state) {
  (void)state;
  for (uint32_t v = 0; v < 65536; v++) {
    float h = Half::load((uint16_t)v), b = Bf16::load((uint16_t)v);
    float wh = ccs__half_to_float((uint16_t)v), wb = ccs__bf16_to_float((uint16_t)v);
    assert_true(memcmp(&h, &wh, 4) == 0 || (h != h && wh != wh));
    assert_true(memcmp(&b, &wb, 4) == 0 || (b != b && wb != wb));
    if (v > 255) continue;
    float e4 = E4M3::load((uint8_t)v), e5 = E5M2::load((uint8_t)v);
    float we4 = ccs__e4m3_to_float((uint8_t)v), we5 = ccs__e5m2_to_float((uint8_t)v);
    assert_true(memcmp(&e4, &we4, 4) == 0 || (e4 != e4 && we4 != we4));
    assert_true(memcmp(&e5, &we5, 4) == 0 || (e5 != e5 && we5 != we5));
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
    uint16_t h = Half::store(f), wh = ccs__float_to_half(f);
    uint16_t b = Bf16::store(f), wb = ccs__float_to_bf16(f);
    uint8_t e4 = E4M3::store(f), we4 = ccs__float_to_e4m3(f);
    uint8_t e5 = E5M2::store(f), we5 = ccs__float_to_e5m2(f);
    if (f != f) continue; /* NaN payloads may differ; NaN-ness is checked above */
    if (h != wh || b != wb || e4 != we4 || e5 != we5)
      fail_msg("float bits %08x: device stores half %04x bf16 %04x e4m3 %02x e5m2 %02x, host "
               "%04x %04x %02x %02x", bits, h, b, e4, e5, wh, wb, we4, we5);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_narrow_loads),
      cmocka_unit_test(test_narrow_stores),
      cmocka_unit_test(test_reduce_matches_host),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
