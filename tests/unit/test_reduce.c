/* Host reduction kernels against the exact reference (reference.c), bit
 * for bit, for every dtype, op, input count and awkward count, in place
 * and out, streamed and not, in the engine's two ranges: integers over
 * their whole range (wraparound, the high bit of unsigned max/min, 64-bit
 * values past 2^53), floats as random bit patterns (NaN, infinities and
 * subnormals included) and as values whose narrow sums need rounding, so
 * that a narrow result rounded more than once shows. float16, which has a
 * path of its own where the CPU converts (F16C), is held to the same
 * reference (ctest runs this file also with CCS_NO_F16C=1, which keeps the
 * portable path). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "kernels.h"
#include "reference.h"

/* Random element of hash h: whole-range bits (kind 0), or for floats a
 * value of a few bits near 1 (kind 1), whose sums of a few land between
 * the narrow types' codes. */
static uint64_t gen(ccs_dtype_t t, uint64_t h, int kind) {
  if (kind == 0 || !ref_is_float(t)) return ref_random_bits(t, h);
  double v = ldexp((double)(h % 4096), -(int)(8 + (h >> 12) % 6)) * (h >> 20 & 1 ? -1 : 1);
  uint64_t cell = 0;
  ref_set(t, &cell, 0, v);
  return cell;
}

static void check(ccs_dtype_t t, ccs_redop_t op, int nin, int nout, size_t count, int kind,
                  int in_place, int streaming, uint64_t seed) {
  size_t sz = ccs_dtype_size(t);
  void *in[8], *out[2];
  uint64_t *want = calloc(count + 1, sizeof(uint64_t));
  for (int k = 0; k < nin; k++) in[k] = malloc(count * sz + 1);
  out[0] = in_place ? in[0] : malloc(count * sz + 1);
  out[1] = malloc(count * sz + 1);
  size_t divisor = op == CCS_AVG ? (size_t)nin + (seed % 3) : 0; /* the engine's rank count */
  for (size_t i = 0; i < count; i++) {
    uint64_t v[8];
    for (int k = 0; k < nin; k++) {
      v[k] = gen(t, test_mix(seed, i * 8 + (size_t)k), kind);
      ref_set_bits(t, in[k], i, v[k]);
    }
    want[i] = ref_reduce_bits(t, op, divisor, v, nin);
  }
  /* in two ranges, as the engine runs chunks: elements [0, split), then the rest */
  size_t split = count / 3;
  ccs__reduce_host(t, op, divisor, (const void *const *)in, nin, out, nout, 0, split, streaming);
  ccs__reduce_host(t, op, divisor, (const void *const *)in, nin, out, nout, split, count - split,
                   streaming);
  ccs__stream_fence();
  for (int o = 0; o < nout; o++)
    for (size_t i = 0; i < count; i++) {
      uint64_t got = ref_get_bits(t, out[o], i);
      if (!ref_same_bits(t, got, want[i]))
        fail_msg("%s %s nin=%d count=%zu kind=%d in_place=%d streaming=%d out %d [%zu]: got 0x%llx "
                 "want 0x%llx (seed %llu)", ccs_dtype_name(t), ccs_redop_name(op), nin, count, kind,
                 in_place, streaming, o, i, (unsigned long long)got, (unsigned long long)want[i],
                 (unsigned long long)seed);
    }
  for (int k = 0; k < nin; k++) free(in[k]);
  if (!in_place) free(out[0]);
  free(out[1]);
  free(want);
}

static void test_every_dtype_and_op(void **state) {
  static const int nins[] = {1, 2, 3, 5, 8};
  static const size_t counts[] = {0, 1, 7, 2047, 2048, 2049, 5003};
  uint64_t seed = test_seed();
  for (int t = 0; t < CCS_DTYPE_COUNT; t++)
    for (int op = 0; op < CCS_REDOP_COUNT; op++)
      for (size_t a = 0; a < sizeof(nins) / sizeof(nins[0]); a++)
        for (size_t b = 0; b < sizeof(counts) / sizeof(counts[0]); b++)
          for (int kind = 0; kind < 2; kind++)
            check((ccs_dtype_t)t, (ccs_redop_t)op, nins[a], 1 + (int)((a + b + (size_t)kind) % 2), counts[b],
                  kind, (int)(b & 1), (int)(a & 1), test_mix(seed, (uint64_t)(t * 1000 + op * 100 + (int)a * 10 + (int)b + kind * 7)));
}

/* Cases whose answers are known by heart, so the reference itself is
 * checked: wraparound, the high bit of unsigned max and min, 64-bit values
 * that double cannot hold, and a narrow sum rounded once (rounding after
 * each input gives another answer). */
static void test_known_answers(void **state) {
  (void)state;
  static const struct {
    ccs_dtype_t t;
    ccs_redop_t op;
    uint64_t a, b, c, want;
  } cases[] = {
      {CCS_INT8, CCS_SUM, 0x7f, 0x01, 0x00, 0x80},               /* 127 + 1 wraps to -128 */
      {CCS_UINT8, CCS_SUM, 0xff, 0x02, 0x00, 0x01},              /* 255 + 2 wraps to 1 */
      {CCS_INT32, CCS_PROD, 0x10000, 0x10000, 0x1, 0x0},         /* 2^32 wraps to 0 */
      {CCS_UINT32, CCS_MAX, 0x80000000, 0x7fffffff, 0x1, 0x80000000}, /* the high bit is the largest */
      {CCS_UINT32, CCS_MIN, 0x80000000, 0xffffffff, 0x90000000, 0x80000000},
      {CCS_INT32, CCS_MIN, 0x80000000, 0x7fffffff, 0x0, 0x80000000}, /* signed: the smallest */
      {CCS_UINT64, CCS_MAX, 0x8000000000000001, 0x8000000000000000, 0x7fffffffffffffff, 0x8000000000000001},
      {CCS_INT64, CCS_SUM, 0x20000000000001, 0x20000000000001, 0x0, 0x40000000000002}, /* past 2^53 */
      {CCS_INT64, CCS_SUM, 0x7fffffffffffffff, 0x1, 0x0, 0x8000000000000000},
      {CCS_UINT64, CCS_PROD, 0xffffffffffffffff, 0xffffffffffffffff, 0x1, 0x1},
      {CCS_INT8, CCS_AVG, 0x7f, 0x7f, 0x7f, 0x29},               /* (381 wrapped: 125) / 3 = 41 */
      {CCS_INT32, CCS_AVG, 0xfffffffb, 0x0, 0x0, 0xffffffff},    /* -5 / 3 truncates to -1 */
      {CCS_UINT8, CCS_AVG, 0xff, 0xff, 0x03, 0x00},              /* (513 wrapped: 1) / 3 = 0 */
      /* float16: 2048 + 1 + 1: rounded once 2050, after each input 2048 */
      {CCS_FLOAT16, CCS_SUM, 0x6800, 0x3c00, 0x3c00, 0x6801},
      /* bfloat16: 256 + 1 + 1 the same */
      {CCS_BFLOAT16, CCS_SUM, 0x4380, 0x3f80, 0x3f80, 0x4381},
      /* e4m3: 16 + 1 + 1 = 18 (after each input 16) */
      {CCS_FLOAT8_E4M3, CCS_SUM, 0x58, 0x38, 0x38, 0x59},
      {CCS_FLOAT8_E4M3, CCS_SUM, 0x7e, 0x7e, 0x00, 0x7e},        /* 448 + 448 saturates */
      {CCS_FLOAT16, CCS_SUM, 0x7bff, 0x7bff, 0x0, 0x7c00},       /* 65504 + 65504: infinity */
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    uint64_t v[3] = {cases[i].a, cases[i].b, cases[i].c};
    size_t d = cases[i].op == CCS_AVG ? 3 : 0;
    uint64_t ref = ref_reduce_bits(cases[i].t, cases[i].op, d, v, 3);
    if (ref != cases[i].want)
      fail_msg("case %zu: the reference says 0x%llx, want 0x%llx", i, (unsigned long long)ref,
               (unsigned long long)cases[i].want);
    char in[3][8], out[8];
    for (int k = 0; k < 3; k++) ref_set_bits(cases[i].t, in[k], 0, v[k]);
    const void *ins[3] = {in[0], in[1], in[2]};
    void *outs[1] = {out};
    ccs__reduce_host(cases[i].t, cases[i].op, d, ins, 3, outs, 1, 0, 1, 0);
    if (ref_get_bits(cases[i].t, out, 0) != cases[i].want)
      fail_msg("case %zu (%s %s): the kernel says 0x%llx, want 0x%llx", i, ccs_dtype_name(cases[i].t),
               ccs_redop_name(cases[i].op), (unsigned long long)ref_get_bits(cases[i].t, out, 0),
               (unsigned long long)cases[i].want);
  }
}

/* Random bit patterns over several blocks (the F16C path converts 8 at a
 * time), 1..6 inputs, two outputs, streamed and not. */
static void test_random_bits_over_blocks(void **state) {
  (void)state;
  uint64_t seed = test_seed();
  for (int t = 0; t < CCS_DTYPE_COUNT; t++)
    for (int op = 0; op < CCS_REDOP_COUNT; op++)
      for (int nin = 1; nin <= 6; nin++)
        check((ccs_dtype_t)t, (ccs_redop_t)op, nin, 2, 2 * 2048 + 13, 0, 0, nin & 1,
              test_mix(seed, (uint64_t)(t << 16 | op << 8 | nin)));
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
      cmocka_unit_test(test_known_answers),
      cmocka_unit_test(test_every_dtype_and_op),
      cmocka_unit_test(test_random_bits_over_blocks),
      cmocka_unit_test(test_copy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
