/* Host streams (ccs_stream_create): calls that return once submitted.
 * Long chains of in-place all_reduce on one buffer, small and large ops
 * (the loop's and the executor's), where each op reads what the one before
 * wrote: the results hold only if the daemon keeps the stream's order.
 * Calls that cannot go asynchronously mixed in (a NULL stream, staged
 * buffers) see everything before them done. Ranks on one daemon and
 * spread over two. Failures (a mismatch, a lost rank) reach
 * ccs_stream_synchronize and ccs_comm_get_async_error; ccs_comm_destroy
 * waits for its calls. With CCS_RING=0 (test_streams_socket) every call
 * completes before returning, with the same results. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "raw.h"
#include "serving.h"

enum { COUNT = 1 << 18, CHAIN = 300, ND = 2 };

struct shared {
  ccs_unique_id_t id;
  uint64_t seed;
};
static struct shared *sh;
static struct test_daemon dm[ND];

static int setup(void **state) {
  sh = test_shared_new(sizeof(*sh));
  return sh && !test_daemons_start(dm, ND, NULL) ? 0 : -1;
}

static int teardown(void **state) {
  int rc = 0;
  for (int i = 0; i < ND; i++) rc |= test_daemon_stop(&dm[i]);
  test_shared_free(sh, sizeof(*sh));
  return rc;
}

static uint32_t input(int rank, size_t j) { return (uint32_t)test_mix(sh->seed, (uint64_t)rank * COUNT + j); }

/* Op k of the chain: how many elements it sums in place. Mostly a few
 * (odd counts, on the daemon's loop), every 25th all of them (1 MiB, on
 * its executor threads). */
static size_t chain_count(int k) { return k % 25 == 0 ? COUNT : (size_t)(1 + 2 * (k % 7)) + (k % 3 == 0) * 1000; }

/* Element j of rank r after ops [0, k) of the chain, from the inputs: the
 * first op covering j makes it the sum over ranks, each later one
 * multiplies it by n (mod 2^32, as uint32 sums wrap). */
static uint32_t expected(int n, int r, size_t j, int k) {
  int covered = 0;
  for (int i = 0; i < k; i++) covered += j < chain_count(i);
  if (!covered) return input(r, j);
  uint32_t v = 0;
  for (int q = 0; q < n; q++) v += input(q, j);
  for (int i = 1; i < covered; i++) v *= (uint32_t)n;
  return v;
}

static int chain_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  ccs_stream_t s;
  uint32_t *buf;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK || ccs_stream_create(&s) != CCS_OK ||
      ccs_mem_alloc((void **)&buf, COUNT * sizeof(uint32_t)) != CCS_OK)
    return 10;
  for (size_t j = 0; j < COUNT; j++) buf[j] = input(rank, j);
  uint32_t staged_in[3] = {1, 2, 3}, staged_out[3];
  for (int k = 0; k < CHAIN; k++) {
    ccs_result_t rc;
    if (k % 100 == 50) { /* no stream: it waits for the stream's calls, and sees them done */
      if (chain_count(k) != COUNT) return 11;
      rc = ccs_all_reduce(buf, buf, COUNT, CCS_UINT32, CCS_SUM, comm, NULL);
      if (rc != CCS_OK || buf[0] != expected(n, rank, 0, k + 1) ||
          buf[COUNT - 1] != expected(n, rank, COUNT - 1, k + 1)) {
        fprintf(stderr, "rank %d: the call without a stream, op %d: %s\n", rank, k, ccs_result_name(rc));
        return 12;
      }
      continue;
    }
    if (k % 100 == 70) { /* staged buffers on the stream: done when it returns */
      rc = ccs_all_reduce(staged_in, staged_out, 3, CCS_UINT32, CCS_SUM, comm, s);
      for (int j = 0; j < 3 && rc == CCS_OK; j++)
        if (staged_out[j] != (uint32_t)(n * (j + 1))) rc = CCS_ERR_MISMATCH;
      if (rc != CCS_OK) {
        fprintf(stderr, "rank %d: the staged call on the stream: %s\n", rank, ccs_result_name(rc));
        return 13;
      }
    }
    rc = ccs_all_reduce(buf, buf, chain_count(k), CCS_UINT32, CCS_SUM, comm, s);
    if (rc != CCS_OK) {
      fprintf(stderr, "rank %d: op %d: %s: %s\n", rank, k, ccs_result_name(rc), ccs_comm_last_error(comm));
      return 14;
    }
  }
  ccs_result_t rc = ccs_stream_synchronize(s);
  if (rc != CCS_OK) {
    fprintf(stderr, "rank %d: synchronize: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(NULL));
    return 15;
  }
  if (ccs_stream_query(s) != CCS_OK) return 16;
  /* every element, against the inputs: elements past every op's count kept theirs */
  size_t bad = 0;
  for (size_t j = 0; j < COUNT; j++) {
    uint32_t want = expected(n, rank, j, CHAIN);
    if (buf[j] != want && bad++ < 4)
      fprintf(stderr, "rank %d: element %zu is %u, want %u\n", rank, j, buf[j], want);
    if (j == 2100) j = COUNT - 2100; /* the middle is as its neighbours: the large ops only */
  }
  ccs_stream_destroy(s);
  ccs_mem_free(buf);
  ccs_comm_destroy(comm);
  return bad ? 17 : 0;
}

static void run_chain(int n, int daemons) {
  test_spread_ranks(dm, daemons);
  test_new_id(&sh->id);
  sh->seed = test_seed();
  assert_int_equal(test_run_ranks(n, chain_rank, NULL, 240, NULL), 0);
}

static void test_chains_keep_their_order(void **state) {
  run_chain(1, 1);
  run_chain(2, 1);
  run_chain(3, 1);
  run_chain(3, 2); /* ranks 0 and 2 on the first daemon, 1 on the second */
  test_spread_ranks(dm, 1);
}

/* --- failures land in synchronize --- */
/* A call's outcome: its own result when it failed at once (it ran without
 * the stream: CCS_RING=0), else what synchronize says of it. */
static ccs_result_t outcome(ccs_result_t call, ccs_stream_t s) {
  ccs_result_t rc = ccs_stream_synchronize(s);
  return call != CCS_OK ? call : rc;
}

static int failing_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  ccs_stream_t s;
  int32_t *buf;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK || ccs_stream_create(&s) != CCS_OK ||
      ccs_mem_alloc((void **)&buf, 64) != CCS_OK)
    return 10;
  /* a mismatch: refused for every rank, the comm lives on */
  ccs_result_t rc = outcome(ccs_all_reduce(buf, buf, 4 + (size_t)rank, CCS_INT32, CCS_SUM, comm, s), s);
  if (rc != CCS_ERR_MISMATCH || !strstr(ccs_comm_last_error(comm), "differs across ranks")) {
    fprintf(stderr, "rank %d: mismatch: %s (%s)\n", rank, ccs_result_name(rc), ccs_comm_last_error(comm));
    return 12;
  }
  if (ccs_stream_synchronize(s) != CCS_OK) return 13; /* reported once */
  int repeat = -1; /* a failure other than CCS_ERR_RETRY: nothing to repeat */
  if (ccs_stream_repeat_count(s, &repeat) != CCS_OK || repeat != 0) return 18;
  if (ccs_stream_repeat_count(s, NULL) != CCS_ERR_INVALID_ARGUMENT) return 19;
  /* in progress while the other rank has not called */
  buf[0] = rank + 1;
  if (rank == 1) usleep(300 * 1000);
  if (ccs_all_reduce(buf, buf, 1, CCS_INT32, CCS_SUM, comm, s) != CCS_OK) return 14;
  if (rank == 0 && (rc = ccs_stream_query(s)) != CCS_IN_PROGRESS && rc != CCS_OK) return 15;
  if (ccs_stream_synchronize(s) != CCS_OK || buf[0] != 3) return 16;
  if (ccs_stream_query(s) != CCS_OK) return 17;
  /* rank 1 goes away; rank 0's call on the stream ends with that */
  if (rank == 1) _exit(0);
  rc = outcome(ccs_all_reduce(buf, buf, 1, CCS_INT32, CCS_SUM, comm, s), s);
  ccs_result_t async;
  if (rc != CCS_ERR_PEER_LOST || ccs_comm_get_async_error(comm, &async) != CCS_OK ||
      async != CCS_ERR_PEER_LOST || !strstr(ccs_comm_last_error(comm), "rank 1")) {
    fprintf(stderr, "rank 0: lost rank: %s: %s\n", ccs_result_name(rc), ccs_comm_last_error(comm));
    return 18;
  }
  ccs_stream_destroy(s);
  ccs_comm_destroy(comm);
  return 0;
}

static void test_failures_reach_synchronize(void **state) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(2, failing_rank, NULL, 60, NULL), 0);
  int x;
  assert_int_equal(ccs_stream_synchronize(&x), CCS_ERR_INVALID_ARGUMENT);
  int repeat;
  assert_int_equal(ccs_stream_repeat_count(&x, &repeat), CCS_ERR_INVALID_ARGUMENT);
  assert_int_equal(ccs_stream_destroy(NULL), CCS_ERR_INVALID_ARGUMENT);
}

/* --- destroy waits for the comm's calls --- */
static int leaving_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  ccs_stream_t s;
  double *buf;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK || ccs_stream_create(&s) != CCS_OK ||
      ccs_mem_alloc((void **)&buf, 8 * 100) != CCS_OK)
    return 10;
  for (int k = 0; k < 100; k++) {
    buf[k] = rank + k;
    if (ccs_all_reduce(buf + k, buf + k, 1, CCS_FLOAT64, CCS_MAX, comm, s) != CCS_OK) return 11;
  }
  if (ccs_comm_destroy(comm) != CCS_OK) return 12; /* before synchronize */
  if (ccs_stream_synchronize(s) != CCS_OK) return 13;
  for (int k = 0; k < 100; k++)
    if (buf[k] != n - 1 + k) return 14;
  ccs_stream_destroy(s);
  return 0;
}

static void test_destroy_waits_for_its_calls(void **state) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(3, leaving_rank, NULL, 60, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chains_keep_their_order),
      cmocka_unit_test(test_failures_reach_synchronize),
      cmocka_unit_test(test_destroy_waits_for_its_calls),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
