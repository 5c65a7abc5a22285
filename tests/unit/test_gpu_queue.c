/* A GPU's queue (run/gpu_queue.c): each comm's ops go in their order,
 * backlogged tenants split the kernel work by weight however many comms
 * each has, an op whose comm gets no stream waits while other comms'
 * pass it, a cancelled op goes back first, and tenants are counted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "run/gpu.h"
#include "run/share.h"

static struct run_share shares[2];
static struct gpu_streams streams;

static struct run_op *op(int tenant, uint64_t comm, size_t bytes, int prio) {
  struct run_op *x = calloc(1, sizeof(*x));
  x->share = &shares[tenant];
  x->stream_key = comm;
  x->plan.bytes_moved = bytes;
  x->prio = prio;
  return x;
}

static void setup_world(double w0, double w1) {
  memset(shares, 0, sizeof(shares));
  memset(&streams, 0, sizeof(streams));
  for (int i = 0; i < 2; i++) shares[i].uid = 2000 + (uid_t)i, shares[i].cap = 1;
  shares[0].weight = w0;
  shares[1].weight = w1;
}

/* Takes the next op, as the submitter does: it runs and is over at once. */
static struct run_op *take(struct list *q, struct fair *f) {
  struct gpu_stream *s = (struct gpu_stream *)1;
  struct run_op *x = ccsd_gpu_queue_next(q, f, &streams, &s);
  if (!x) return NULL;
  assert_true(s != NULL || atomic_load(&x->cancelled));
  ccsd_gpu_queue_remove(f, x);
  return x;
}

static void test_order_per_comm_and_weights(void **state) {
  (void)state;
  srand(4);
  setup_world(3, 1);
  struct fair f;
  fair_init(&f, CCSD_GPU_QUANTUM, 0);
  struct list q;
  list_init(&q);
  /* tenant 0 on comms 1 and 2, tenant 1 on comm 3; random sizes, always
   * backlogged: each op taken is replaced by its comm's next */
  uint64_t next_seq[4] = {0}, last_seq[4] = {0};
  const int owner[4] = {0, 0, 0, 1};
  for (uint64_t comm = 1; comm <= 3; comm++)
    for (int k = 0; k < 8; k++) {
      struct run_op *x = op(owner[comm], comm, 1 << 20 | (size_t)(rand() % (1 << 20)), FAIR_NORMAL);
      x->seq = ++next_seq[comm];
      ccsd_gpu_queue_add(&q, &f, x);
    }
  double bytes[2] = {0};
  for (int i = 0; i < 20000; i++) {
    struct run_op *x = take(&q, &f);
    assert_non_null(x);
    assert_int_equal(x->seq, last_seq[x->stream_key] + 1); /* its comm's order */
    last_seq[x->stream_key] = x->seq;
    bytes[x->share - shares] += (double)x->plan.bytes_moved;
    uint64_t comm = x->stream_key;
    free(x);
    struct run_op *more = op(owner[comm], comm, 1 << 20 | (size_t)(rand() % (1 << 20)), FAIR_NORMAL);
    more->seq = ++next_seq[comm];
    ccsd_gpu_queue_add(&q, &f, more);
  }
  assert_true(fabs(bytes[0] / (bytes[0] + bytes[1]) - 0.75) < 0.01);
  assert_int_equal(atomic_load(&shares[0].gpu_ops) + atomic_load(&shares[1].gpu_ops), 20000);
  assert_true((double)atomic_load(&shares[1].gpu_bytes) == bytes[1]);
  for (struct run_op *x; (x = take(&q, &f));) free(x);
  assert_true(list_empty(&q));
  fair_close(&f);
}

static void test_comm_without_stream_waits_others_pass(void **state) {
  (void)state;
  setup_world(1, 1);
  struct fair f;
  fair_init(&f, CCSD_GPU_QUANTUM, 0);
  struct list q;
  list_init(&q);
  for (int i = 0; i < CCSD_GPU_STREAMS; i++) /* every place busy with other comms */
    streams.s[i] = (struct gpu_stream){.key = 1000 + (uint64_t)i, .used = 1, .inflight = 1};
  struct run_op *blocked = op(0, 7, 100, FAIR_NORMAL), *placed = op(1, 1000, 100, FAIR_NORMAL);
  struct run_op *after = op(0, 7, 100, FAIR_NORMAL); /* behind it, same comm */
  ccsd_gpu_queue_add(&q, &f, blocked);
  ccsd_gpu_queue_add(&q, &f, after);
  ccsd_gpu_queue_add(&q, &f, placed);
  assert_ptr_equal(take(&q, &f), placed);
  assert_null(take(&q, &f)); /* comm 7 waits for a place */
  streams.s[5].inflight = 0; /* one goes idle: comm 7 takes it over */
  assert_ptr_equal(take(&q, &f), blocked);
  assert_ptr_equal(take(&q, &f), after);
  free(blocked);
  free(after);
  free(placed);
  /* a cancelled op goes back before the others, on no stream */
  struct run_op *gone = op(1, 1001, 100, FAIR_NORMAL), *other = op(0, 1002, 100, FAIR_NORMAL);
  atomic_store(&gone->cancelled, 1);
  ccsd_gpu_queue_add(&q, &f, gone);
  ccsd_gpu_queue_add(&q, &f, other);
  struct gpu_stream *s = (struct gpu_stream *)1;
  assert_ptr_equal(ccsd_gpu_queue_next(&q, &f, &streams, &s), gone);
  assert_null(s);
  ccsd_gpu_queue_remove(&f, gone);
  assert_int_equal(atomic_load(&shares[1].gpu_ops), 1); /* the placed op only */
  free(gone);
  for (struct run_op *y; (y = take(&q, &f));) free(y);
  assert_true(list_empty(&q));
  fair_close(&f);
}

static void test_latency_comm_ahead_of_bulk(void **state) {
  (void)state;
  setup_world(1, 1);
  struct fair f;
  fair_init(&f, CCSD_GPU_QUANTUM, 0);
  struct list q;
  list_init(&q);
  for (int k = 0; k < 32; k++) ccsd_gpu_queue_add(&q, &f, op(0, 1, 64 << 20, FAIR_BULK));
  free(take(&q, &f));
  struct run_op *urgent = op(0, 2, 8, FAIR_LATENCY);
  ccsd_gpu_queue_add(&q, &f, urgent);
  assert_ptr_equal(take(&q, &f), urgent);
  free(urgent);
  for (struct run_op *y; (y = take(&q, &f));) free(y);
  fair_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_order_per_comm_and_weights),
      cmocka_unit_test(test_comm_without_stream_waits_others_pass),
      cmocka_unit_test(test_latency_comm_ahead_of_bulk),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
