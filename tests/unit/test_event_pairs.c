/* The client's event pairs (client/event_pairs.c): reused per connection
 * and GPU, never across them, and never once their connection broke (the
 * daemon's registration of them died with it). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "internal.h"

static void test_reuse_by_connection_and_gpu(void **state) {
  struct ccs__conn a = {0}, b = {0};
  struct ccs__gpu_pair p0 = {.conn = &a, .device = 0, .events = 1};
  struct ccs__gpu_pair p1 = {.conn = &a, .device = 1, .events = 2};
  struct ccs__gpu_pair q0 = {.conn = &b, .device = 0, .events = 3};
  assert_null(ccs__pairs_take(&a, 0)); /* none yet: the caller registers one */
  assert_true(ccs__pairs_give(&p0));
  assert_true(ccs__pairs_give(&p1));
  assert_true(ccs__pairs_give(&q0));
  assert_null(ccs__pairs_take(&b, 1));
  assert_ptr_equal(ccs__pairs_take(&a, 1), &p1);
  assert_ptr_equal(ccs__pairs_take(&b, 0), &q0);
  assert_ptr_equal(ccs__pairs_take(&a, 0), &p0);
  assert_null(ccs__pairs_take(&a, 0)); /* each taken once */
}

static void test_broken_connection(void **state) {
  struct ccs__conn a = {0};
  struct ccs__gpu_pair p = {.conn = &a, .device = 0};
  a.broken = CCS_ERR_DAEMON_UNAVAILABLE;
  assert_false(ccs__pairs_give(&p)); /* the caller frees it */
  assert_null(ccs__pairs_take(&a, 0));
}

/* Threads taking and giving back concurrently never share a pair. */
enum { THREADS = 4, ROUNDS = 20000, PAIRS = 3 };
static struct ccs__conn shared_conn;
static struct ccs__gpu_pair pairs[PAIRS];
static int holders[PAIRS];

static void *churn(void *arg) {
  long bad = 0;
  for (int i = 0; i < ROUNDS; i++) {
    struct ccs__gpu_pair *p = ccs__pairs_take(&shared_conn, 0);
    if (!p) continue;
    int k = (int)(p - pairs);
    if (__atomic_add_fetch(&holders[k], 1, __ATOMIC_SEQ_CST) != 1) bad++;
    __atomic_sub_fetch(&holders[k], 1, __ATOMIC_SEQ_CST);
    ccs__pairs_give(p);
  }
  return (void *)bad;
}

static void test_concurrent(void **state) {
  for (int k = 0; k < PAIRS; k++) {
    pairs[k] = (struct ccs__gpu_pair){.conn = &shared_conn, .device = 0};
    assert_true(ccs__pairs_give(&pairs[k]));
  }
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, churn, NULL), 0);
  long bad = 0;
  for (int i = 0; i < THREADS; i++) {
    void *r;
    pthread_join(t[i], &r);
    bad += (long)r;
  }
  assert_int_equal(bad, 0);
  for (int k = 0; k < PAIRS; k++) assert_non_null(ccs__pairs_take(&shared_conn, 0));
  assert_null(ccs__pairs_take(&shared_conn, 0));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reuse_by_connection_and_gpu),
      cmocka_unit_test(test_broken_connection),
      cmocka_unit_test(test_concurrent),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
