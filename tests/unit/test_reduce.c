/* Host reduction kernels against the reference, for every dtype, op,
 * input count and awkward count, with fresh random data; in place too.
 * float16, which has a path of its own where the CPU converts (F16C), is
 * held to the portable conversions bit for bit (ctest runs this file also
 * with CCS_NO_F16C=1, which keeps the portable path). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtype.h"
#include "harness.h"
#include "kernels.h"
#include "reference.h"

/* Random element: integer-valued (exact in every type) or, for floats,
 * real-valued with tolerance. */
static double gen(ccs_dtype_t t, ccs_redop_t op, uint64_t h, int real) {
  if (real && ref_is_float(t)) return ((double)(h % 2000001) - 1000000) / 250000.0; /* +-4 */
  return ref_exact_value(t, op, h);
}

static void check(ccs_dtype_t t, ccs_redop_t op, int nin, int nout, size_t count, int real,
                  int in_place, int streaming, uint64_t seed) {
  size_t sz = ccs_dtype_size(t);
  void *in[8], *out[2];
  double *want = calloc(count + 1, sizeof(double));
  double *sum_abs = calloc(count + 1, sizeof(double));
  for (int k = 0; k < nin; k++) in[k] = malloc(count * sz + 1);
  out[0] = in_place ? in[0] : malloc(count * sz + 1);
  out[1] = malloc(count * sz + 1);
  for (size_t i = 0; i < count; i++) {
    double v[8];
    for (int k = 0; k < nin; k++) {
      ref_set(t, in[k], i, gen(t, op, test_mix(seed, i * 8 + (size_t)k), real));
      v[k] = ref_get(t, in[k], i); /* what the type holds */
      sum_abs[i] += fabs(v[k]);
    }
    want[i] = ref_reduce(t, op, v, nin);
  }
  /* in two ranges, as the engine runs chunks: elements [0, split), then the rest */
  size_t split = count / 3;
  ccs__reduce_host(t, op, (size_t)nin, (const void *const *)in, nin, out, nout, 0, split, streaming);
  ccs__reduce_host(t, op, (size_t)nin, (const void *const *)in, nin, out, nout, split, count - split,
                   streaming);
  ccs__stream_fence();
  for (int o = 0; o < nout; o++)
    for (size_t i = 0; i < count; i++) {
      double got = ref_get(t, out[o], i);
      double w = want[i];
      int ok;
      if (ref_is_float(t)) { /* what the type can hold: rounded, saturated */
        uint64_t cell = 0;
        ref_set(t, &cell, 0, w);
        w = ref_get(t, &cell, 0);
      }
      if (ref_is_float(t)) {
        /* the rounding of the result, plus float accumulation (2^-24 per step) */
        double eps = t == CCS_FLOAT64 ? 0x1p-52 : 0x1p-24;
        double scale = op == CCS_PROD ? fabs(w) : sum_abs[i];
        double tol = ldexp(fabs(w), -ref_mantissa_bits(t)) + nin * eps * scale;
        ok = ref_close(t, got, w) || fabs(got - w) <= tol;
      } else {
        ok = got == w;
      }
      if (!ok)
        fail_msg("%s %s nin=%d count=%zu real=%d in_place=%d out %d [%zu]: got %.9g want %.9g",
                 ccs_dtype_name(t), ccs_redop_name(op), nin, count, real, in_place, o, i, got, w);
    }
  for (int k = 0; k < nin; k++) free(in[k]);
  if (!in_place) free(out[0]);
  free(out[1]);
  free(want);
  free(sum_abs);
}

static void test_every_dtype_and_op(void **state) {
  static const int nins[] = {1, 2, 3, 5, 8};
  static const size_t counts[] = {0, 1, 7, 2047, 2048, 2049, 5003};
  uint64_t seed = test_seed();
  for (int t = 0; t < CCS_DTYPE_COUNT; t++)
    for (int op = 0; op < CCS_REDOP_COUNT; op++)
      for (size_t a = 0; a < sizeof(nins) / sizeof(nins[0]); a++)
        for (size_t b = 0; b < sizeof(counts) / sizeof(counts[0]); b++)
          for (int real = 0; real < 2; real++)
            check((ccs_dtype_t)t, (ccs_redop_t)op, nins[a], 1 + (int)((a + b + (size_t)real) % 2), counts[b],
                  real, (int)(b & 1), (int)(a & 1), test_mix(seed, (uint64_t)(t * 1000 + op * 100 + (int)a * 10 + (int)b)));
}

/* Random bit patterns (NaN, inf, subnormals included): every result bit
 * as the element-by-element conversions and float arithmetic give it (NaNs
 * stored as 0x7e00 with a sign). */
static void test_half_bits(void **state) {
  (void)state;
  enum { COUNT = 2 * 2048 + 13 };
  static uint16_t in[5][COUNT], out[2][COUNT];
  uint64_t seed = test_seed();
  for (int op = 0; op < CCS_REDOP_COUNT; op++)
    for (int nin = 1; nin <= 5; nin++)
      for (int streaming = 0; streaming < 2; streaming++) {
        for (int k = 0; k < nin; k++)
          for (size_t i = 0; i < COUNT; i++)
            in[k][i] = (uint16_t)test_mix(seed, ((uint64_t)op << 40) ^ ((uint64_t)nin << 32) ^ ((uint64_t)k << 24) ^ i);
        const void *ins[5] = {in[0], in[1], in[2], in[3], in[4]};
        void *outs[2] = {out[0], out[1]};
        size_t d = op == CCS_AVG ? (size_t)nin : 0;
        ccs__reduce_host(CCS_FLOAT16, (ccs_redop_t)op, d, ins, nin, outs, 2, 0, COUNT, streaming);
        ccs__stream_fence();
        for (size_t i = 0; i < COUNT; i++) {
          float acc = ccs__half_to_float(in[0][i]);
          for (int k = 1; k < nin; k++) {
            float v = ccs__half_to_float(in[k][i]);
            if (op == CCS_SUM || op == CCS_AVG) acc = acc + v;
            else if (op == CCS_PROD) acc = acc * v;
            else if (op == CCS_MAX) acc = acc < v ? v : acc;
            else acc = v < acc ? v : acc;
          }
          if (d) acc = acc / (float)d;
          uint16_t want = ccs__float_to_half(acc);
          /* a NaN's sign is whichever NaN operand the compiled code kept */
          uint16_t mask = (want & 0x7fff) == 0x7e00 ? 0x7fff : 0xffff;
          for (int o = 0; o < 2; o++)
            if ((out[o][i] & mask) != (want & mask))
              fail_msg("half %s, %d inputs, element %zu: 0x%04x, want 0x%04x", ccs_redop_name((ccs_redop_t)op),
                       nin, i, out[o][i], want);
        }
      }
}

static void test_copy(void **state) {
  char src[1000], d1[1003], d2[1000];
  for (int i = 0; i < 1000; i++) src[i] = (char)i;
  for (int streaming = 0; streaming < 2; streaming++)
    for (size_t len = 0; len < 1000; len += 37) {
      memset(d1, 0, sizeof(d1));
      memset(d2, 0, sizeof(d2));
      void *outs[3] = {d1 + 3, src, d2}; /* one misaligned, one the source itself */
      ccs__copy_host(src, outs, 3, 0, len / 2, streaming); /* in two ranges, as the engine's chunks */
      ccs__copy_host(src, outs, 3, len / 2, len - len / 2, streaming);
      ccs__stream_fence();
      assert_memory_equal(d1 + 3, src, len);
      assert_memory_equal(d2, src, len);
      assert_int_equal(d1[3 + len], 0);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_dtype_and_op),
      cmocka_unit_test(test_half_bits),
      cmocka_unit_test(test_copy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
