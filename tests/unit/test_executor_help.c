/* The loop's help (run/executor.h: ccsd_executor_help): a thread outside
 * the executor runs ready tasks of a submitted op beside the executor's
 * own thread, and the op's results are right; with the executor below
 * the loop's priority it never runs one, and the op still completes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/fair.h"
#include "run/engine_run.h"
#include "run/executor.h"
#include "run/share.h"

enum { N = 3, COUNT = 1 << 16 };

static float ins[N][COUNT], outs[N][COUNT];
static int done;

static void on_done(struct run_op *x) {
  (void)x;
  done = 1;
}

/* One all_reduce of N ranks in 4 KiB tasks through e, this thread helping
 * while it waits: how many tasks it ran. Every output is checked against
 * sums made here. */
static int all_reduce_helped(uv_loop_t *loop, struct executor *e) {
  struct run_share share = {0};
  atomic_store(&share.weight, 1.0);
  atomic_store(&share.cap, 1.0);
  struct engine_part ranks[N];
  for (int p = 0; p < N; p++) {
    ranks[p] = (struct engine_part){(char *)ins[p], (char *)outs[p], 0};
    for (int i = 0; i < COUNT; i++) ins[p][i] = (float)(rand() % 1000) - 500;
  }
  memset(outs, 0, sizeof(outs));
  struct engine_op op = {SCHED_ALL_REDUCE, SCHED_RING, N, 0, 1, COUNT, CCS_FLOAT32, CCS_SUM,
                         ranks, NULL, 1 << 12};
  struct run_op *x = calloc(1, sizeof(*x));
  assert_non_null(x);
  x->share = &share;
  x->prio = FAIR_NORMAL;
  x->device = -1;
  x->on_done = on_done;
  char err[256];
  assert_int_equal(engine_compile(&op, &x->plan, err, sizeof(err)), CCS_OK);
  done = 0;
  int helped = 0;
  ccsd_executor_submit(e, x);
  while (!done) {
    helped += ccsd_executor_help(e);
    uv_run(loop, UV_RUN_NOWAIT); /* the finished op comes back here */
  }
  for (int i = 0; i < COUNT; i++) {
    float want = 0;
    for (int p = 0; p < N; p++) want += ins[p][i];
    for (int p = 0; p < N; p++) assert_true(outs[p][i] == want);
  }
  engine_plan_free(&x->plan);
  free(x);
  return helped;
}

/* ops all_reduces through an executor of prio, or fewer once this thread
 * helped with one (until_helped): the most tasks it ran of one. */
static void with_priority(enum executor_priority prio, int ops, int until_helped, int *most) {
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  struct executor *e = ccsd_executor_new(&loop, 1, prio);
  assert_non_null(e);
  *most = 0;
  for (int k = 0; k < ops && !(until_helped && *most); k++) {
    int helped = all_reduce_helped(&loop, e);
    if (helped > *most) *most = helped;
  }
  ccsd_executor_stop(e);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_helps_at_normal_priority(void **state) {
  (void)state;
  srand(5);
  int most;
  /* this thread takes some of an op's many tasks (the executor's thread
   * wakes tens of microseconds after each submit); on a loaded machine it
   * may lose the race for a few ops, not for hundreds */
  with_priority(EXECUTOR_NORMAL, 500, 1, &most);
  assert_true(most > 0);
}

static void test_never_below_the_loop(void **state) {
  (void)state;
  srand(6);
  int most;
  with_priority(EXECUTOR_LOW, 10, 0, &most);
  assert_int_equal(most, 0);
  with_priority(EXECUTOR_IDLE, 10, 0, &most);
  assert_int_equal(most, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_helps_at_normal_priority),
      cmocka_unit_test(test_never_below_the_loop),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
