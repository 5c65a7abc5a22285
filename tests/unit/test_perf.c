/* ccs-perf's arithmetic and command line against hand-computed values. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "perf_args.h"
#include "perf_math.h"

static void test_counts(void **state) {
  /* all_reduce: the whole buffer, no rounding */
  struct perf_counts k = perf_counts(PERF_ALL_REDUCE, 1000, 4, 3);
  assert_int_equal(k.param, 250);
  assert_int_equal(k.bytes, 1000);
  /* all_gather on 3 ranks, 1 MiB of float: 87381 per rank -> 87380 (16 B multiple) */
  k = perf_counts(PERF_ALL_GATHER, 1 << 20, 4, 3);
  assert_int_equal(k.param, 87380);
  assert_int_equal(k.send, 87380);
  assert_int_equal(k.recv, 262140);
  assert_int_equal(k.bytes, 1048560);
  /* reduce_scatter: the send side is the big one */
  k = perf_counts(PERF_REDUCE_SCATTER, 1 << 20, 8, 3);
  assert_int_equal(k.param, 43690);
  assert_int_equal(k.send, 131070);
  assert_int_equal(k.bytes, 1048560);
  /* all_to_all of int8 on 7 ranks: 100 bytes -> 14 per peer -> 0 (16 B multiple) */
  k = perf_counts(PERF_ALL_TO_ALL, 100, 1, 7);
  assert_int_equal(k.param, 0);
  k = perf_counts(PERF_ALL_TO_ALL, 1000, 1, 7);
  assert_int_equal(k.param, 128);
  assert_int_equal(k.bytes, 896);
  /* gather/scatter */
  k = perf_counts(PERF_GATHER, 4096, 8, 4);
  assert_int_equal(k.param, 128);
  assert_int_equal(k.recv, 512);
  k = perf_counts(PERF_SCATTER, 4096, 2, 4);
  assert_int_equal(k.param, 512);
  assert_int_equal(k.send, 2048);
}

static void test_bandwidth(void **state) {
  /* 1 MB all_reduce in 1 ms: 1 GB/s algbw, x 2(n-1)/n busbw */
  struct perf_counts k = perf_counts(PERF_ALL_REDUCE, 1000000, 4, 4);
  assert_true(fabs(perf_algbw(PERF_ALL_REDUCE, k, 4, 1e-3) - 1.0) < 1e-12);
  assert_true(fabs(perf_bus_factor(PERF_ALL_REDUCE, 4) - 1.5) < 1e-12);
  assert_true(fabs(perf_bus_factor(PERF_ALL_REDUCE, 1) - 0.0) < 1e-12);
  /* all_gather counts the whole receive buffer */
  k = perf_counts(PERF_ALL_GATHER, 1 << 20, 4, 4);
  assert_true(fabs(perf_algbw(PERF_ALL_GATHER, k, 4, 1.0) - 1048576e-9) < 1e-15);
  assert_true(fabs(perf_bus_factor(PERF_ALL_GATHER, 4) - 0.75) < 1e-12);
  assert_true(fabs(perf_bus_factor(PERF_ALL_TO_ALL, 8) - 0.875) < 1e-12);
  assert_true(fabs(perf_bus_factor(PERF_BROADCAST, 8) - 1.0) < 1e-12);
  assert_true(fabs(perf_bus_factor(PERF_SENDRECV, 8) - 1.0) < 1e-12);
  assert_true(fabs(perf_bus_factor(PERF_REDUCE_SCATTER, 2) - 0.5) < 1e-12);
  /* broadcast moves count x size once */
  k = perf_counts(PERF_BROADCAST, 2000000, 8, 3);
  assert_true(fabs(perf_algbw(PERF_BROADCAST, k, 8, 2e-3) - 1.0) < 1e-12);
}

static int parse(struct perf_opts *o, const char *a0, ...) {
  char *argv[32] = {"ccs-perf"};
  int argc = 1;
  va_list ap;
  va_start(ap, a0);
  for (const char *a = a0; a && argc < 31; a = va_arg(ap, const char *)) argv[argc++] = (char *)a;
  va_end(ap);
  return perf_parse_args(argc, argv, o);
}

static void test_flags(void **state) {
  struct perf_opts o;
  assert_int_equal(parse(&o, "all_reduce", NULL), 0);
  assert_int_equal(o.min_bytes, 32 << 20);
  assert_int_equal(o.iters, 20);
  assert_int_equal(o.dtypes[0], CCS_FLOAT32);
  assert_int_equal(parse(&o, "all_gather", "-b", "8", "-e", "128M", "-f", "4", "-n", "5", "-w",
                         "2", "-m", "3", "-c", "0", "-d", "bfloat16", "-r", "1", "-a", "3",
                         "-z", "1", "--np", "7", "--registered", "0", "-J", "/tmp/x.json", NULL), 0);
  assert_int_equal(o.coll, PERF_ALL_GATHER);
  assert_int_equal(o.min_bytes, 8);
  assert_int_equal(o.max_bytes, 128 << 20);
  assert_true(o.factor == 4);
  assert_int_equal(o.iters, 5);
  assert_int_equal(o.warmup, 2);
  assert_int_equal(o.agg, 3);
  assert_int_equal(o.check, 0);
  assert_int_equal(o.dtypes[0], CCS_BFLOAT16);
  assert_int_equal(o.root, 1);
  assert_int_equal(o.average, 3);
  assert_int_equal(o.nprocs, 7);
  assert_int_equal(o.registered, 0);
  assert_string_equal(o.json, "/tmp/x.json");
  assert_int_equal(parse(&o, "reduce", "-d", "all", "-o", "all", "-i", "1K", NULL), 0);
  assert_int_equal(o.ndtypes, CCS_DTYPE_COUNT);
  assert_int_equal(o.nops, CCS_REDOP_COUNT);
  assert_int_equal(o.step_bytes, 1024);
  assert_int_equal(parse(&o, "-h", NULL), 1);
  /* bad command lines: usage, non-zero */
  assert_int_equal(parse(&o, NULL), -1);
  assert_int_equal(parse(&o, "all_reduse", NULL), -1);
  assert_int_equal(parse(&o, "all_reduce", "-d", "float128", NULL), -1);
  assert_int_equal(parse(&o, "all_reduce", "-o", "xor", NULL), -1);
  assert_int_equal(parse(&o, "all_reduce", "-b", "1Q", NULL), -1);
  assert_int_equal(parse(&o, "all_reduce", "-b", "64M", "-e", "1M", NULL), -1);
  assert_int_equal(parse(&o, "all_reduce", "-f", "1", NULL), -1);
  assert_int_equal(parse(&o, "all_reduce", "-n", "0", NULL), -1);
  assert_int_equal(parse(&o, "all_reduce", "-a", "4", NULL), -1);
  assert_int_equal(parse(&o, "all_reduce", "--np", "0", NULL), -1);
  assert_int_equal(parse(&o, "all_reduce", "--bogus", NULL), -1);
  assert_int_equal(parse(&o, "all_reduce", "extra", NULL), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_counts),
      cmocka_unit_test(test_bandwidth),
      cmocka_unit_test(test_flags),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
