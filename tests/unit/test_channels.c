/* A comm's channel numbers as its calls are answered (client/restart.c):
 * what ran keeps its number, a call refused as a whole gives its number
 * back, and calls to repeat after a restart (CCS_ERR_RETRY: the daemon
 * dropped them and every later one) give theirs back from the first,
 * whatever order their answers come in. A host stream's calls are
 * answered in the order the daemon drops them, which is not their
 * order: a staying daemon then numbered one rank's repeated calls one off
 * the others' (CCS_ERR_MISMATCH after a restart). A call resubmitted after
 * a restart keeps its number, and the channel goes on past it, even where
 * the daemon went again before the call went out (a wrong result once: the
 * next restart found that rank's calls numbered one short, and its call
 * "finished" without running). Each answered call of one collective is
 * checked against the daemon's number for it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>

#include "internal.h"
#include "journal.h"

static struct ccs__chan chan;
static ccs_comm_t comm = {.chans = &chan, .nchans = 1, .has_id = 1};

static void numbered(uint64_t next, uint64_t done) {
  chan = (struct ccs__chan){.peer = -1, .next = next, .done = done};
}

static void test_ran(void **state) {
  (void)state;
  numbered(5, 5);
  assert_int_equal(ccs__chan_take(&comm, 0, 2), 5);
  ccs__chan_settled(&comm, 0, 5, 2, CCS_OK, 0);
  assert_int_equal(chan.next, 7);
  assert_int_equal(chan.done, 7);
  ccs__chan_settled(&comm, 0, 7, 1, CCS_ERR_MISMATCH, 0); /* a mismatch took its number */
  assert_int_equal(chan.done, 8);
  assert_int_equal(comm.has_id, 0);
  comm.has_id = 1;
}

static void test_refused(void **state) {
  (void)state;
  numbered(5, 5);
  ccs__chan_take(&comm, 0, 1);
  assert_int_equal(ccs__chan_settled(&comm, 0, 5, 1, CCS_ERR_INVALID_ARGUMENT, 0), 0); /* the last: given back */
  assert_int_equal(chan.next, 5);
  assert_int_equal(comm.has_id, 1);
  ccs__chan_take(&comm, 0, 1);
  ccs__chan_take(&comm, 0, 1);
  /* not the last: the call after it was out under the next number, which
   * the daemon gave it: the rank's calls no longer line up */
  assert_int_equal(ccs__chan_settled(&comm, 0, 5, 1, CCS_ERR_INVALID_USAGE, 0), 1);
  assert_int_equal(chan.next, 7);
  assert_int_equal(comm.has_id, 0);
  comm.has_id = 1;
  /* a failure of a call that ran (its comm ends) is none of that */
  assert_int_equal(ccs__chan_settled(&comm, 0, 5, 1, CCS_ERR_TIMEOUT, 0), 0);
  assert_int_equal(comm.has_id, 1);
  assert_int_equal(chan.done, 5);
}

/* Refused for a quota (ops in flight) with later calls out: to be
 * repeated with them (the daemon refuses those until it comes again), its
 * number and theirs given back from it, whatever the order. */
static void test_quota_repeated(void **state) {
  (void)state;
  const ccs_result_t later[2] = {CCS_ERR_RETRY, CCS_ERR_QUOTA};
  for (int k = 0; k < 2; k++) {
    numbered(5, 5);
    ccs__chan_take(&comm, 0, 3);
    assert_int_equal(ccs__chan_settled(&comm, 0, 5, 1, CCS_ERR_QUOTA, 0), 0);
    assert_int_equal(chan.next, 5);
    assert_int_equal(ccs__chan_settled(&comm, 0, 6, 2, later[k], 0), 0);
    assert_int_equal(chan.next, 5);
    assert_int_equal(comm.has_id, 1);
  }
}

/* Calls 5, 6 and 7 (two ops) dropped for a repeat, answered in each order. */
static void test_retry_any_order(void **state) {
  (void)state;
  const uint64_t first[3] = {5, 6, 7}, count[3] = {1, 1, 2};
  const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  for (int o = 0; o < 6; o++) {
    numbered(5, 5);
    for (int i = 0; i < 3; i++) ccs__chan_take(&comm, 0, count[i]);
    for (int i = 0; i < 3; i++) {
      int k = orders[o][i];
      ccs__chan_settled(&comm, 0, first[k], count[k], CCS_ERR_RETRY, 0);
    }
    assert_int_equal(chan.next, 5);
    assert_int_equal(chan.done, 5);
    assert_int_equal(ccs__chan_take(&comm, 0, 1), 5); /* the repeat takes 5 again */
  }
}

/* A repeat dropped after the calls before it ran: only its numbers on. */
static void test_retry_after_ran(void **state) {
  (void)state;
  numbered(5, 5);
  for (int i = 0; i < 4; i++) ccs__chan_take(&comm, 0, 1);
  ccs__chan_settled(&comm, 0, 8, 1, CCS_ERR_RETRY, 0);
  ccs__chan_settled(&comm, 0, 5, 1, CCS_OK, 0);
  ccs__chan_settled(&comm, 0, 7, 1, CCS_ERR_RETRY, 0);
  ccs__chan_settled(&comm, 0, 6, 1, CCS_OK, 0);
  assert_int_equal(chan.next, 7);
  assert_int_equal(chan.done, 7);
}

static struct ccs__journal journal;

/* A connection whose calls are listed (a journal, a keeper): only what
 * ccs__call_new looks at. */
static struct ccs__conn *listing_conn(void) {
  static struct ccs__conn c;
  pthread_mutex_init(&c.mu, NULL);
  c.journal = &journal;
  c.keeper_started = 1;
  c.pid = getpid();
  return &c;
}

/* The first restart left call 5 to resubmit (the channel at 6); the daemon
 * went again before it went out, so the second restart's report left it
 * out and its verdict set the channel back to 5. Resubmitted under 5, the
 * call must take the channel on to 6, or the rank's next call would be
 * numbered 5 too: one short of what its daemon counts. */
static void test_resubmitted_after_second_restart(void **state) {
  (void)state;
  struct ccs__conn *c = listing_conn();
  const struct ccs__call_desc op = {&comm, CCS__ALL_REDUCE, 0, 0};
  const uint64_t given = 5;
  int moving;
  numbered(5, 5);
  struct ccs__call *again = ccs__call_new(c, &op, 1, &given, &moving);
  assert_non_null(again);
  assert_int_equal(again->op[0].number, 5);
  assert_int_equal(chan.next, 6);
  struct ccs__call *after = ccs__call_new(c, &op, 1, NULL, &moving);
  assert_int_equal(after->op[0].number, 6);
  assert_int_equal(chan.next, 7);
  /* resubmitted within what the channel counts: nothing moves */
  numbered(9, 5);
  struct ccs__call *within = ccs__call_new(c, &op, 1, &given, &moving);
  assert_int_equal(within->op[0].number, 5);
  assert_int_equal(chan.next, 9);
  ccs__call_free(within);
  ccs__call_free(after);
  ccs__call_free(again);
  assert_null(c->calls);
}

/* A finished call of one collective carries the daemon's number for it
 * (the journal): the same as the rank's own, nothing happens; another,
 * the comm is not rejoined after a restart (its verdicts would give this
 * rank's calls the wrong ones). */
static void test_numbers_checked(void **state) {
  (void)state;
  struct ccs__conn *c = listing_conn();
  const struct ccs__call_desc op = {&comm, CCS__ALL_REDUCE, 0, 0};
  int moving;
  for (int off = 0; off < 2; off++) {
    numbered(41, 41);
    comm.has_id = 1;
    struct ccs__call *call = ccs__call_new(c, &op, 1, NULL, &moving);
    ccs__call_keyed(call, ccs__journal_key(7, 1));
    ccs__journal_mark(&journal, ccs__journal_key(7, 1), CCS__JOURNAL_FINISHED, 42 + (uint32_t)off);
    ccs__call_answered(call, CCS_OK);
    ccs__call_free(call);
    assert_int_equal(chan.done, 42);
    assert_int_equal(comm.has_id, !off);
  }
  comm.has_id = 1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ran),
      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_quota_repeated),
      cmocka_unit_test(test_retry_any_order),
      cmocka_unit_test(test_retry_after_ran),
      cmocka_unit_test(test_resubmitted_after_second_restart),
      cmocka_unit_test(test_numbers_checked),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
