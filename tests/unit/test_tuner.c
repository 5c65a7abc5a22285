/* The tuner: the cost model's choices at a few sizes, and the override
 * rules (parsing, precedence, ranges, algorithm-only rules). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "plan/tuner.h"

static enum sched_algo pick(enum sched_coll c, int n, uint64_t bytes, const char *rules_text) {
  struct algo_rules rules = {.n = 0};
  char err[256], why[256];
  if (rules_text) assert_int_equal(ccsd_algo_rules_parse(rules_text, &rules, err, sizeof(err)), 0);
  return ccsd_tune(c, n, bytes, &ccsd_link_tcp, &rules, why, sizeof(why));
}

static void test_model_choices(void **state) {
  /* latency-bound: few steps; bandwidth-bound: bandwidth-optimal */
  assert_int_equal(pick(SCHED_ALL_REDUCE, 16, 8, NULL), SCHED_RHD);    /* log steps */
  assert_int_equal(pick(SCHED_ALL_REDUCE, 4, 8, NULL), SCHED_DIRECT);  /* one shot */
  assert_int_equal(pick(SCHED_ALL_REDUCE, 6, 256u << 20, NULL), SCHED_RING); /* n not 2^k */
  assert_int_equal(pick(SCHED_BROADCAST, 8, 8, NULL), SCHED_TREE);
  assert_int_equal(pick(SCHED_BROADCAST, 8, 256u << 20, NULL), SCHED_RING); /* pipelined chain */
  assert_int_equal(pick(SCHED_ALL_GATHER, 5, 1 << 20, NULL), SCHED_RING);
  assert_int_equal(pick(SCHED_ALL_TO_ALL, 8, 1 << 20, NULL), SCHED_DIRECT);
  /* the model orders costs as the formulas say */
  assert_true(ccsd_algo_cost(SCHED_RING, SCHED_ALL_REDUCE, 8, 1 << 30, &ccsd_link_tcp) <
              ccsd_algo_cost(SCHED_TREE, SCHED_ALL_REDUCE, 8, 1 << 30, &ccsd_link_tcp));
  assert_true(ccsd_algo_cost(SCHED_RHD, SCHED_ALL_REDUCE, 64, 8, &ccsd_link_tcp) <
              ccsd_algo_cost(SCHED_RING, SCHED_ALL_REDUCE, 64, 8, &ccsd_link_tcp));
  /* one participant: nothing to move */
  assert_true(ccsd_algo_cost(SCHED_RING, SCHED_ALL_REDUCE, 1, 1 << 20, &ccsd_link_tcp) == 0);
}

/* The smallest power-of-two size from which an all_reduce of 6 takes the
 * ring (the fewest bytes, the most steps), over a link of that rate. */
static uint64_t switch_size(double beta_Bps) {
  struct link_model link = ccsd_link_tcp;
  struct algo_rules rules = {.n = 0};
  link.beta_Bps = beta_Bps;
  for (uint64_t bytes = 8; bytes <= (1ull << 34); bytes *= 2)
    if (ccsd_tune(SCHED_ALL_REDUCE, 6, bytes, &link, &rules, NULL, 0) == SCHED_RING) return bytes;
  return 0;
}

/* A faster link (verbs: the port's rate) keeps the fewer-steps algorithms
 * for larger ops: bandwidth matters later. */
static void test_link_rate(void **state) {
  (void)state;
  uint64_t tcp = switch_size(ccsd_link_tcp.beta_Bps), edr = switch_size(0.9 * 100e9 / 8);
  assert_true(tcp > 0 && edr > 0);
  assert_true(edr > tcp);
}

static void test_rules(void **state) {
  const char *r = "all_reduce:ring;all_reduce:tree:0-64K;broadcast:tree";
  assert_int_equal(pick(SCHED_ALL_REDUCE, 16, 8, r), SCHED_TREE);       /* the later, narrower */
  assert_int_equal(pick(SCHED_ALL_REDUCE, 16, 65536, r), SCHED_TREE);   /* inclusive */
  assert_int_equal(pick(SCHED_ALL_REDUCE, 16, 65537, r), SCHED_RING);
  assert_int_equal(pick(SCHED_BROADCAST, 8, 256u << 20, r), SCHED_TREE);
  assert_int_equal(pick(SCHED_ALL_TO_ALL, 8, 1 << 20, r), SCHED_DIRECT); /* untouched */
  /* an algorithm alone: where it builds; the others keep the model's */
  assert_int_equal(pick(SCHED_ALL_GATHER, 16, 1 << 20, "ring"), SCHED_RING);
  assert_int_equal(pick(SCHED_GATHER, 16, 1 << 20, "ring"), SCHED_TREE);
  assert_int_equal(pick(SCHED_ALL_TO_ALL, 16, 1 << 20, "rhd"), SCHED_DIRECT);
  assert_int_equal(pick(SCHED_REDUCE_SCATTER, 6, 1 << 20, "rhd"), SCHED_RHD); /* folded */
  assert_int_equal(pick(SCHED_REDUCE_SCATTER, 6, 1 << 20, NULL), SCHED_RING); /* cheaper */
  assert_int_equal(pick(SCHED_ALL_REDUCE, 8, 100 << 20, "ring;all_reduce:rhd:1M-max"), SCHED_RHD);
  assert_int_equal(pick(SCHED_ALL_REDUCE, 8, 1000, "ring;all_reduce:rhd:1M-max"), SCHED_RING);
}

static void test_bad_rules(void **state) {
  static const struct {
    const char *text, *says;
  } bad[] = {
      {"all_reduce:spiral", "'spiral' is not an algorithm"},
      {"spiral", "nor a collective"},
      {"all_gather:tree", "tree does not implement all_gather"},
      {"all_reduce:ring:64K", "is not LO-HI"},
      {"all_reduce:ring:64K-1K", "bad size range"},
      {"all_reduce:ring:0-1Q", "bad size range"},
      {"all_reduce:ring:0-1K:extra", "unexpected 'extra'"},
      {"all_reduce", "is not an algorithm"},
      /* separators alone, empty fields, and what strtod takes but is no size */
      {":", "an empty field"},
      {"::", "an empty field"},
      {" : ", "an empty field"},
      {";:;", "an empty field"},
      {"ring::0-1K", "an empty field"},
      {"all_reduce:ring:", "an empty field"},
      {":ring", "an empty field"},
      {"all_reduce:ring:0-1K:x:y", "more than 4 fields"},
      {"all_reduce:ring:nan-1K", "bad size range"},
      {"all_reduce:ring:0-inf", "bad size range"},
      {"all_reduce:ring:0-infinity", "bad size range"},
      {"all_reduce:ring:0x10-1K", "bad size range"},
      {"all_reduce:ring:1e3-2K", "bad size range"},
      {"all_reduce:ring:-1-2K", "bad size range"},
      {"all_reduce:ring:-", "bad size range"},
      {"all_reduce:ring:1K-", "bad size range"},
      {"all_reduce:ring:99999999999999999999G-max", "bad size range"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    struct algo_rules rules;
    char err[256] = "";
    assert_int_equal(ccsd_algo_rules_parse(bad[i].text, &rules, err, sizeof(err)), -1);
    if (!strstr(err, bad[i].says)) fail_msg("'%s': '%s' does not say '%s'", bad[i].text, err, bad[i].says);
  }
  struct algo_rules rules;
  char err[256];
  assert_int_equal(ccsd_algo_rules_parse("", &rules, err, sizeof(err)), 0);
  assert_int_equal(rules.n, 0);
  assert_int_equal(ccsd_algo_rules_parse(" ring ; broadcast:tree ;", &rules, err, sizeof(err)), 0);
  assert_int_equal(rules.n, 2);
  assert_int_equal(ccsd_algo_rules_parse("all_reduce:ring:1.5K-2M", &rules, err, sizeof(err)), 0);
  assert_true(rules.r[0].lo == 1536 && rules.r[0].hi == 2u << 20);
  /* random junk: refused or accepted, never a crash (ASan/UBSan builds) */
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 20000; i++) {
    char text[24];
    static const char alphabet[] = "ring:;-0K1Mmaxtedrhall_uc . ";
    for (int k = 0; k < (int)sizeof(text) - 1; k++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      text[k] = alphabet[x % (sizeof(alphabet) - 1)];
    }
    text[x % sizeof(text)] = 0;
    text[sizeof(text) - 1] = 0;
    (void)ccsd_algo_rules_parse(text, &rules, err, sizeof(err));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_model_choices),
      cmocka_unit_test(test_link_rate),
      cmocka_unit_test(test_rules),
      cmocka_unit_test(test_bad_rules),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
