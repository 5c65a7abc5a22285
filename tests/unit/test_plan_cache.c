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

/* Among daemons: a participant another daemon runs, and one standing for
 * this daemon's ranks. Their members are copied with the key (the op's
 * own array goes once compiled); an op that differs in any of them, or in
 * the comm's maps, does not get the plan; the same op does. */
static struct engine_op among_daemons(struct engine_part *ranks, struct engine_part *members) {
  for (int m = 0; m < 2; m++) members[m] = (struct engine_part){(char *)send[m], (char *)recv[m], 0};
  ranks[0] = (struct engine_part){.members = members, .nmembers = 2, .root_member = -1};
  ranks[1] = (struct engine_part){.remote = 1};
  return (struct engine_op){SCHED_ALL_REDUCE, SCHED_RING, 2, 0, 1, COUNT, CCS_FLOAT32, CCS_SUM,
                            ranks, NULL, 1 << 12};
}

static void test_participants_in_the_key(void **state) {
  (void)state;
  struct plan_cache pc = {0};
  struct engine_part ranks[2], *members = malloc(2 * sizeof(*members));
  assert_non_null(members);
  struct engine_op op = among_daemons(ranks, members);
  struct engine_plan pl;
  uint64_t gen;
  compile(&op, &pl);
  assert_true(pl.net_items > 0);
  struct engine_item *items = pl.items;
  assert_int_equal(plan_cache_note(&pc, &op, &gen), 1);
  plan_cache_give_back(&pc, &pl, gen);
  memset(members, 0xa5, 2 * sizeof(*members)); /* the op's array reused for something else */
  free(members);
  static const int order[2] = {0, 1}, first[3] = {0, 2, 3};
  for (int f = 0; f < 9; f++) {
    struct engine_part r[2], m[2];
    struct engine_op o = among_daemons(r, m);
    switch (f) {
    case 0: m[1].recv = (char *)other[1]; break;
    case 1: m[0].send = (char *)other[0]; break;
    case 2: r[0].nmembers = 1; break;
    case 3: r[0].root_member = 0; break;
    case 4: r[1].remote = 0; break;
    case 5: r[1].members = m, r[1].nmembers = 2; break;
    case 6: r[0].members = NULL, r[0].nmembers = 0; break;
    case 7: o.rank_of = order; break;
    case 8: o.group_first = first; break;
    }
    assert_int_equal(plan_cache_take(&pc, &o, &pl, &gen), 0);
  }
  struct engine_part r[2], m[2];
  struct engine_op same = among_daemons(r, m);
  assert_int_equal(plan_cache_take(&pc, &same, &pl, &gen), 1);
  assert_ptr_equal(pl.items, items);
  plan_cache_give_back(&pc, &pl, gen);
  plan_cache_free(&pc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kept_and_run_again),
      cmocka_unit_test(test_never_for_another_op),
      cmocka_unit_test(test_out_while_the_key_moves),
      cmocka_unit_test(test_participants_in_the_key),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
