/* A comm's last small plan (plan/plan_cache.c): kept for the next op of
 * the same shape on the same buffers and run again with right results;
 * never handed out for an op that differs in any field or buffer, nor
 * kept when another key took its place while it was out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plan/plan_cache.h"
#include "run/engine_run.h"

enum { N = 3, COUNT = 37 };

static float send[N][COUNT], recv[N][COUNT], other[N][COUNT];

static struct engine_op op_on(struct engine_part *ranks, float (*out)[COUNT]) {
  for (int p = 0; p < N; p++) ranks[p] = (struct engine_part){(char *)send[p], (char *)out[p], 0};
  return (struct engine_op){SCHED_ALL_REDUCE, SCHED_RING, N, 0, 1, COUNT, CCS_FLOAT32, CCS_SUM,
                            ranks, NULL, 1 << 12};
}

/* Fresh inputs, the plan run, every output checked against sums made here. */
static void run_and_check(struct engine_plan *pl, float (*out)[COUNT]) {
  for (int p = 0; p < N; p++)
    for (int i = 0; i < COUNT; i++) send[p][i] = (float)(rand() % 1000) - 500;
  memset(out, 0, sizeof(float) * N * COUNT);
  engine_run_all(pl, 0);
  for (int i = 0; i < COUNT; i++) {
    float want = 0;
    for (int p = 0; p < N; p++) want += send[p][i];
    for (int p = 0; p < N; p++) assert_true(out[p][i] == want);
  }
}

static void compile(const struct engine_op *op, struct engine_plan *pl) {
  char err[256];
  assert_int_equal(engine_compile(op, pl, err, sizeof(err)), CCS_OK);
}

static void test_kept_and_run_again(void **state) {
  (void)state;
  srand(11);
  struct plan_cache pc = {0};
  struct engine_part ranks[N];
  struct engine_op op = op_on(ranks, recv);
  assert_true(plan_cache_fits(&op));
  struct engine_plan pl;
  uint64_t gen;
  assert_int_equal(plan_cache_take(&pc, &op, &pl, &gen), 0); /* nothing kept yet */
  compile(&op, &pl);
  assert_int_equal(plan_cache_note(&pc, &op, &gen), 1);
  run_and_check(&pl, recv);
  struct engine_item *items = pl.items;
  plan_cache_give_back(&pc, &pl, gen);
  for (int k = 0; k < 5; k++) { /* the same op again: the same plan, right every time */
    struct engine_part again[N];
    struct engine_op same = op_on(again, recv);
    assert_int_equal(plan_cache_take(&pc, &same, &pl, &gen), 1);
    assert_ptr_equal(pl.items, items);
    run_and_check(&pl, recv);
    plan_cache_give_back(&pc, &pl, gen);
  }
  plan_cache_free(&pc);
}

static void test_never_for_another_op(void **state) {
  (void)state;
  struct plan_cache pc = {0};
  struct engine_part ranks[N];
  struct engine_op op = op_on(ranks, recv);
  struct engine_plan pl;
  uint64_t gen;
  compile(&op, &pl);
  assert_int_equal(plan_cache_note(&pc, &op, &gen), 1);
  plan_cache_give_back(&pc, &pl, gen);
  /* each field, and each buffer, changed alone */
  for (int f = 0; f < 10; f++) {
    struct engine_part changed[N];
    struct engine_op o = op_on(changed, recv);
    switch (f) {
    case 0: o.coll = SCHED_REDUCE; break;
    case 1: o.algo = SCHED_DIRECT; break;
    case 2: o.root = 1; break;
    case 3: o.count = COUNT - 1; break;
    case 4: o.dtype = CCS_INT32; break;
    case 5: o.redop = CCS_MAX; break;
    case 6: o.chunk_bytes = 1 << 13; break;
    case 7: o.avg_divisor = 2; break;
    case 8: changed[2].recv = (char *)other[2]; break;
    case 9: changed[1].send = (char *)other[1]; break;
    }
    assert_int_equal(plan_cache_take(&pc, &o, &pl, &gen), 0);
  }
  /* another op's plan replaces it: results on the other buffers right */
  struct engine_part moved[N];
  struct engine_op o = op_on(moved, other);
  compile(&o, &pl);
  assert_int_equal(plan_cache_note(&pc, &o, &gen), 1);
  run_and_check(&pl, other);
  plan_cache_give_back(&pc, &pl, gen);
  assert_int_equal(plan_cache_take(&pc, &op, &pl, &gen), 0);
  assert_int_equal(plan_cache_take(&pc, &o, &pl, &gen), 1);
  run_and_check(&pl, other);
  plan_cache_give_back(&pc, &pl, gen);
  plan_cache_free(&pc);
}

/* Two ops of one key in flight: the first back is kept, the second freed;
 * a plan out while the key changed is freed, not kept under the new one. */
static void test_out_while_the_key_moves(void **state) {
  (void)state;
  struct plan_cache pc = {0};
  struct engine_part r1[N], r2[N], r3[N];
  struct engine_op a = op_on(r1, recv), b = op_on(r2, recv), c = op_on(r3, other);
  struct engine_plan pa, pb, pc3;
  uint64_t ga, gb, gc;
  compile(&a, &pa);
  assert_int_equal(plan_cache_note(&pc, &a, &ga), 1);
  compile(&b, &pb); /* same key, its plan out: no new key */
  assert_int_equal(plan_cache_note(&pc, &b, &gb), 1);
  assert_true(ga == gb);
  plan_cache_give_back(&pc, &pa, ga);
  plan_cache_give_back(&pc, &pb, gb); /* one kept already: freed */
  assert_int_equal(plan_cache_take(&pc, &a, &pa, &ga), 1);
  compile(&c, &pc3); /* a new key while a's plan is out */
  assert_int_equal(plan_cache_note(&pc, &c, &gc), 1);
  assert_true(gc != ga);
  plan_cache_give_back(&pc, &pa, ga); /* made for the old key: freed */
  assert_int_equal(plan_cache_take(&pc, &a, &pa, &ga), 0);
  plan_cache_give_back(&pc, &pc3, gc);
  assert_int_equal(plan_cache_take(&pc, &c, &pc3, &gc), 1);
  run_and_check(&pc3, other);
  plan_cache_give_back(&pc, &pc3, gc);
  plan_cache_free(&pc);
}

/* Participants elsewhere or standing for several ranks: never kept. */
static void test_fits(void **state) {
  (void)state;
  struct engine_part ranks[N];
  struct engine_op op = op_on(ranks, recv);
  ranks[1].remote = 1;
  assert_false(plan_cache_fits(&op));
  ranks[1].remote = 0;
  ranks[0].members = &ranks[2];
  assert_false(plan_cache_fits(&op));
  ranks[0].members = NULL;
  static const int order[N] = {0, 1, 2};
  op.rank_of = order;
  assert_false(plan_cache_fits(&op));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kept_and_run_again),
      cmocka_unit_test(test_never_for_another_op),
      cmocka_unit_test(test_out_while_the_key_moves),
      cmocka_unit_test(test_fits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
