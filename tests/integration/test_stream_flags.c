/* The client's side of calls in a CUDA stream's order (client/ring.c),
 * against a real daemon, on a machine without a GPU: what the GPU would
 * write and wait for is the pair of stream flags in the rings' page, and
 * every way a call can end must let the caller's stream go (its `done`
 * flag reaches the call's value), or a job blocked in cudaStreamSynchronize
 * would wait forever. Checked here: a call the daemon refuses (its answer
 * comes back, the flag is written, the comm carries the error, the slot
 * serves again once the stream wrote passed), a call that never goes out
 * (unclaimed), slots reused across more calls than the ring holds, and a
 * daemon killed with calls out (the guard thread writes every flag, fails
 * their comm, and no call goes out after), and a daemon stopped with calls
 * out (its socket stays open: the guard ends them once the daemon's beat
 * stood still for CCS_STALL_TIMEOUT, never while it beats). The test links the library's
 * sources to reach these internals. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "internal.h"
#include "ring.h"

static struct test_daemon dmn;

static int setup(void **state) {
  (void)state;
  return test_daemon_start(&dmn, NULL);
}

static int teardown(void **state) {
  (void)state;
  test_daemon_stop(&dmn);
  return 0;
}

/* A connection with rings, and a comm of one rank on it. */
static struct ccs__conn *connected(ccs_comm_t **ret_comm) {
  ccs_unique_id_t id;
  assert_int_equal(ccs_get_unique_id(&id), CCS_OK);
  assert_int_equal(ccs_comm_init_rank(ret_comm, 1, id, 0), CCS_OK);
  struct ccs__conn *c = (*ret_comm)->conn;
  assert_non_null(c->ring);
  return c;
}

static uint32_t done_of(const struct ccs__ring_claim *k) { return atomic_load(k->done); }

/* An all_reduce of 4 floats of buf, in place, as the library builds it. */
static void op_on(ccs_comm_t *comm, float *buf, Ccs__Op *op, Ccs__BufRef *ref) {
  uint64_t id, off;
  assert_int_equal(ccs__mem_lookup(comm->conn, buf, 16, &id, &off), 0);
  ccs__op__init(op);
  ccs__buf_ref__init(ref);
  *ref = (Ccs__BufRef){.base = ref->base, .buffer = id, .offset = off, .length = 16};
  op->comm = comm->handle;
  op->kind = CCS__ALL_REDUCE;
  op->count = 4;
  op->dtype = CCS_FLOAT32;
  op->redop = CCS_SUM;
  op->send = op->recv = ref;
}

static void test_refused_and_unclaimed(void **state) {
  (void)state;
  ccs_comm_t *comm;
  struct ccs__conn *c = connected(&comm);
  float *buf;
  assert_int_equal(ccs_mem_alloc((void **)&buf, 4096), CCS_OK);
  for (int i = 0; i < 4; i++) buf[i] = (float)i;
  Ccs__Op op;
  Ccs__BufRef ref;
  op_on(comm, buf, &op, &ref);
  Ccs__Op *ops[1] = {&op};

  /* host buffers in a stream's order: the daemon refuses the call */
  struct ccs__ring_claim k;
  assert_int_equal(ccs__ring_claim(c, comm, &k), CCS_OK);
  assert_int_not_equal(done_of(&k), k.gen);
  assert_int_equal(comm->inflight, 1);
  assert_int_equal(ccs__ring_post_claimed(c, &k, ops, 1), CCS_OK);
  assert_int_equal(ccs__ring_wait_idle(c, &comm->inflight), CCS_OK);
  assert_int_equal(done_of(&k), k.gen); /* the stream goes on */
  assert_int_equal(comm->async_error, CCS_ERR_INVALID_ARGUMENT); /* nobody else would know */
  assert_non_null(strstr(comm->last_error, "orders device buffers"));
  for (int i = 0; i < 4; i++) assert_true(buf[i] == (float)i); /* no effect */
  comm->async_error = CCS_OK;

  /* its slot serves again only once its stream got past the call (wrote
   * passed): a late write of ready must not land on the next call's */
  struct ccs__ring_claim next[CCS__RING_ENTRIES];
  for (unsigned i = 0; i < CCS__RING_ENTRIES - 1; i++) {
    assert_int_equal(ccs__ring_claim(c, comm, &next[i]), CCS_OK);
    assert_int_not_equal(next[i].slot, k.slot);
  }
  atomic_store(k.passed, k.gen); /* as the stream would */
  assert_int_equal(ccs__ring_claim(c, comm, &next[CCS__RING_ENTRIES - 1]), CCS_OK);
  assert_int_equal(next[CCS__RING_ENTRIES - 1].slot, k.slot);
  assert_true((int32_t)(next[CCS__RING_ENTRIES - 1].gen - k.gen) > 0);
  /* unclaimed with stream writes queued: out until passed; without: at once */
  for (unsigned i = 0; i < CCS__RING_ENTRIES; i++) ccs__ring_unclaim(c, &next[i], i != 0);
  assert_int_equal(done_of(&next[0]), next[0].gen);
  assert_int_equal(ccs__ring_claim(c, comm, &k), CCS_OK);
  assert_int_equal(k.slot, next[0].slot);
  ccs__ring_unclaim(c, &k, 0);
  for (unsigned i = 1; i < CCS__RING_ENTRIES; i++) atomic_store(next[i].passed, next[i].gen);

  /* a call that never goes out lets its stream go too, and frees its slot;
   * more calls than the ring has slots: each slot's value grows */
  uint32_t first_gen[CCS__RING_ENTRIES] = {0};
  for (unsigned i = 0; i < 3 * CCS__RING_ENTRIES; i++) {
    assert_int_equal(ccs__ring_claim(c, comm, &k), CCS_OK);
    assert_true(k.slot < CCS__RING_ENTRIES);
    assert_ptr_equal(k.done - k.slot, k.ready - k.slot + CCS__RING_ENTRIES); /* its pair's */
    if (!first_gen[k.slot]) first_gen[k.slot] = k.gen;
    else assert_true((int32_t)(k.gen - first_gen[k.slot]) > 0);
    assert_int_not_equal(done_of(&k), k.gen);
    ccs__ring_unclaim(c, &k, 0);
    assert_int_equal(done_of(&k), k.gen);
    assert_int_equal(comm->inflight, 0);
  }
  /* the comm serves on */
  assert_int_equal(ccs_all_reduce(buf, buf, 4, CCS_FLOAT32, CCS_SUM, comm, NULL), CCS_OK);
  for (int i = 0; i < 4; i++) assert_true(buf[i] == (float)i);
  assert_int_equal(ccs_comm_destroy(comm), CCS_OK);
  ccs_mem_free(buf);
}

static int released_by(const struct ccs__ring_claim *k, int n, double until) {
  int released = 0;
  do {
    released = 0;
    for (int i = 0; i < n; i++) released += done_of(&k[i]) == k[i].gen;
    if (released < n) usleep(1000);
  } while (released < n && test_now() < until);
  return released;
}

/* The daemon dies with calls out: the guard writes their flags within a
 * moment, and their comm has the daemon's loss as its error. */
static void test_daemon_killed_with_calls_out(void **state) {
  (void)state;
  ccs_comm_t *comm;
  struct ccs__conn *c = connected(&comm);
  assert_int_equal(ccs__ring_guard_start(c), 0);
  struct ccs__ring_claim k[3];
  for (int i = 0; i < 3; i++) assert_int_equal(ccs__ring_claim(c, comm, &k[i]), CCS_OK);
  test_daemon_kill(&dmn);
  int released = released_by(k, 3, test_now() + 5);
  assert_int_equal(released, 3);
  assert_int_equal(comm->async_error, CCS_ERR_DAEMON_UNAVAILABLE);
  /* and no call goes out after: nobody would let its stream go */
  struct ccs__ring_claim late;
  assert_int_equal(ccs__ring_claim(c, comm, &late), CCS_ERR_DAEMON_UNAVAILABLE);
  ccs_comm_destroy(comm);
  assert_int_equal(test_daemon_start(&dmn, NULL), 0); /* for the teardown */
}

/* A daemon that lives but does not go on (SIGSTOP: its socket stays open):
 * calls held out longer than the stall limit while it beats stay out;
 * once it stops, the guard ends them, failed, with their comm; once it
 * goes on, calls go out again. */
static void test_daemon_stalled_with_calls_out(void **state) {
  (void)state;
  ccs_comm_t *comm;
  struct ccs__conn *c = connected(&comm);
  setenv("CCS_STALL_TIMEOUT", "2", 1); /* 3 s: three of the daemon's 1 s beats */
  assert_int_equal(ccs__ring_guard_start(c), 0);
  unsetenv("CCS_STALL_TIMEOUT");
  struct ccs__ring_claim k[2];
  for (int i = 0; i < 2; i++) assert_int_equal(ccs__ring_claim(c, comm, &k[i]), CCS_OK);
  assert_int_equal(released_by(k, 2, test_now() + 4.5), 0); /* a live daemon: kept */
  assert_int_equal(comm->async_error, CCS_OK);

  assert_int_equal(kill(dmn.pid, SIGSTOP), 0);
  int released = released_by(k, 2, test_now() + 15);
  kill(dmn.pid, SIGCONT);
  assert_int_equal(released, 2);
  assert_int_equal(comm->async_error, CCS_ERR_DAEMON_UNAVAILABLE);
  assert_non_null(strstr(comm->last_error, "no sign of life"));
  assert_int_equal(comm->inflight, 0); /* done: the comm can go */
  ccs_comm_t *next;
  assert_ptr_equal(connected(&next), c);
  assert_int_equal(ccs_comm_destroy(comm), CCS_OK);
  struct ccs__ring_claim late;
  assert_int_equal(ccs__ring_claim(c, next, &late), CCS_OK);
  ccs__ring_unclaim(c, &late, 0);
  assert_int_equal(ccs_comm_destroy(next), CCS_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_refused_and_unclaimed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_killed_with_calls_out, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_stalled_with_calls_out, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
