/* Comms from comms: split (random colors and keys, CCS_SPLIT_NOCOLOR),
 * shrink (after a rank was killed, on a failed parent), revoke (ranks
 * waiting in an op get CCS_ERR_REVOKED at once, and every later op; the
 * comm still shrinks) and grow (a newcomer joins the old ranks; the old
 * comm works on), and finalize (it waits for a host stream's calls and
 * reports their first failure), with 1 to 7 ranks on one daemon and
 * across 2 and 3 daemons. Every new comm's rank and size are checked against a reference
 * computed here, and an all_reduce on it element by element. */
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

#define MAXR 8
#define COUNT 19

struct shared {
  ccs_unique_id_t id, grown;
  uint64_t seed;
  int color[MAXR], key[MAXR];
  int ndaemons;
  int code[MAXR];
  char text[MAXR][512];
  double at[MAXR];
  volatile int go;
};
static struct shared *sh;
static struct test_daemon dm[3];

static int setup(void **state) {
  (void)state;
  sh = test_shared_new(sizeof(*sh));
  const char *args[] = {"--heartbeat", "0.2", "--peer_timeout", "2", NULL};
  if (!sh || test_daemons_start(dm, 3, args)) return -1;
  sh->seed = test_seed();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  for (int i = 0; i < 3; i++) test_daemon_stop(&dm[i]);
  test_shared_free(sh, sizeof(*sh));
  return 0;
}

/* An all_reduce on comm of values of (salt, parent rank), checked against
 * the members' values: members[k] is the parent rank of new rank k. */
static int check(ccs_comm_t *comm, const int *members, int n, uint64_t salt) {
  int rank;
  ccs_comm_user_rank(comm, &rank);
  int64_t v[COUNT];
  for (int i = 0; i < COUNT; i++) v[i] = (int64_t)(test_mix(sh->seed + salt, (uint64_t)members[rank] * 97 + i) % 100000);
  ccs_result_t rc = ccs_all_reduce(v, v, COUNT, CCS_INT64, CCS_SUM, comm, NULL);
  if (rc != CCS_OK) {
    fprintf(stderr, "new rank %d: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(comm));
    return 1;
  }
  for (int i = 0; i < COUNT; i++) {
    int64_t want = 0;
    for (int k = 0; k < n; k++) want += (int64_t)(test_mix(sh->seed + salt, (uint64_t)members[k] * 97 + i) % 100000);
    if (v[i] != want) return fprintf(stderr, "new rank %d: [%d] wrong\n", rank, i), 1;
  }
  return 0;
}

static int join(int rank, int n, ccs_comm_t **comm) {
  ccs_result_t rc = ccs_comm_init_rank(comm, n, sh->id, rank);
  if (rc != CCS_OK) fprintf(stderr, "rank %d: init: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(NULL));
  return rc != CCS_OK;
}

/* --- split --- */
static int split_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm, *sub;
  if (join(rank, n, &comm)) return 2;
  int bad = 0;
  for (int round = 0; round < 2 && !bad; round++) { /* twice: the second names another comm */
    int color = sh->color[rank] + round * 10 * (sh->color[rank] >= 0);
    ccs_result_t rc = ccs_comm_split(comm, color, sh->key[rank], &sub, NULL);
    if (rc != CCS_OK) {
      fprintf(stderr, "rank %d: split: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(NULL));
      return 3;
    }
    if (sh->color[rank] == CCS_SPLIT_NOCOLOR) {
      bad |= sub != NULL;
      continue;
    }
    /* the reference: this color's ranks by key, then rank */
    int members[MAXR], size = 0;
    for (int k = 0; k < MAXR * 2; k++) /* keys are 0..MAXR: enumerate in order */
      for (int r = 0; r < n; r++)
        if (sh->color[r] == sh->color[rank] && sh->key[r] == k) members[size++] = r;
    int got_rank, got_size;
    ccs_comm_user_rank(sub, &got_rank);
    ccs_comm_count(sub, &got_size);
    bad |= got_size != size || members[got_rank] != rank;
    if (bad) fprintf(stderr, "rank %d: new rank %d of %d, want %d ranks\n", rank, got_rank, got_size, size);
    bad |= check(sub, members, size, (uint64_t)(round + 1));
    bad |= ccs_comm_destroy(sub) != CCS_OK;
  }
  bad |= check(comm, (int[MAXR]){0, 1, 2, 3, 4, 5, 6, 7}, n, 9); /* the parent works on */
  return ccs_comm_destroy(comm) != CCS_OK || bad;
}

static void split_on(int ndaemons) {
  for (int n = 1; n <= 7; n += 2) {
    test_spread_ranks(dm, ndaemons);
    setenv("CCS_SOCKET", dm[0].socket, 1);
    ccs_unique_id_t id;
    assert_int_equal(ccs_get_unique_id(&id), CCS_OK);
    sh->id = id;
    for (int r = 0; r < n; r++) {
      uint64_t h = test_mix(sh->seed, (uint64_t)(n * 16 + r));
      sh->color[r] = h % 5 == 4 ? CCS_SPLIT_NOCOLOR : (int)(h % 3);
      sh->key[r] = (int)((h >> 8) % 4); /* ties: broken by rank */
    }
    assert_int_equal(test_run_ranks(n, split_rank, NULL, 60, NULL), 0);
  }
}

static void test_split_one_daemon(void **state) {
  (void)state;
  split_on(1);
}

static void test_split_across_daemons(void **state) {
  (void)state;
  split_on(2);
  split_on(3);
}

/* --- shrink after a rank was killed --- */
static int shrink_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm, *small;
  if (join(rank, n, &comm)) return 2;
  if (rank == n - 1) raise(SIGKILL);
  int64_t x = 1;
  ccs_result_t rc = ccs_all_reduce(&x, &x, 1, CCS_INT64, CCS_SUM, comm, NULL);
  if (rc != CCS_ERR_PEER_LOST) return fprintf(stderr, "rank %d: %s, want PEER_LOST\n", rank, ccs_result_name(rc)), 3;
  int gone = n - 1;
  if ((rc = ccs_comm_shrink(comm, &gone, 1, &small, 0)) != CCS_OK) {
    fprintf(stderr, "rank %d: shrink: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(NULL));
    return 4;
  }
  int got_rank, got_size;
  ccs_comm_user_rank(small, &got_rank);
  ccs_comm_count(small, &got_size);
  int bad = got_rank != rank || got_size != n - 1;
  bad |= check(small, (int[MAXR]){0, 1, 2, 3, 4, 5, 6, 7}, n - 1, 11);
  bad |= ccs_comm_destroy(small) != CCS_OK;
  ccs_comm_destroy(comm);
  return bad;
}

static void test_shrink_after_a_kill(void **state) {
  (void)state;
  for (int d = 1; d <= 3; d += 2)
    for (int n = 3; n <= 6; n += 3) {
      test_spread_ranks(dm, d);
      setenv("CCS_SOCKET", dm[0].socket, 1);
      assert_int_equal(ccs_get_unique_id(&sh->id), CCS_OK);
      int statuses[MAXR];
      test_run_ranks(n, shrink_rank, NULL, 60, statuses);
      for (int r = 0; r < n - 1; r++) assert_int_equal(statuses[r], 0);
      assert_int_equal(statuses[n - 1], 128 + SIGKILL);
    }
}

/* --- revoke --- */
static int revoke_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm, *again;
  if (join(rank, n, &comm)) return 2;
  int64_t x = 1;
  ccs_result_t rc;
  if (rank == 0) { /* never calls the op the others wait in: revokes it */
    usleep(200 * 1000);
    sh->at[0] = test_now();
    if (ccs_comm_revoke(comm) != CCS_OK) return 3;
  } else {
    rc = ccs_all_reduce(&x, &x, 1, CCS_INT64, CCS_SUM, comm, NULL);
    sh->at[rank] = test_now();
    sh->code[rank] = rc;
    snprintf(sh->text[rank], sizeof(sh->text[rank]), "%s", ccs_comm_last_error(comm));
  }
  /* and every later op; the comm still shrinks, nobody left out */
  rc = ccs_all_reduce(&x, &x, 1, CCS_INT64, CCS_SUM, comm, NULL);
  if (rc != CCS_ERR_REVOKED) return fprintf(stderr, "rank %d: later op %s\n", rank, ccs_result_name(rc)), 4;
  if (ccs_comm_shrink(comm, NULL, 0, &again, 0) != CCS_OK) return 5;
  int bad = check(again, (int[MAXR]){0, 1, 2, 3, 4, 5, 6, 7}, n, 12);
  return ccs_comm_destroy(again) != CCS_OK || ccs_comm_destroy(comm) != CCS_OK || bad;
}

static void test_revoke(void **state) {
  (void)state;
  for (int d = 1; d <= 2; d++) {
    test_spread_ranks(dm, d);
    setenv("CCS_SOCKET", dm[0].socket, 1);
    assert_int_equal(ccs_get_unique_id(&sh->id), CCS_OK);
    assert_int_equal(test_run_ranks(4, revoke_rank, NULL, 60, NULL), 0);
    for (int r = 1; r < 4; r++) {
      fprintf(stderr, "# %d daemon(s), rank %d: %s after %.3f s: %s\n", d, r, ccs_result_name(sh->code[r]),
              sh->at[r] - sh->at[0], sh->text[r]);
      assert_int_equal(sh->code[r], CCS_ERR_REVOKED);
      assert_non_null(strstr(sh->text[r], "rank 0"));
      assert_true(sh->at[r] - sh->at[0] < 2.0); /* at once, not at a deadline */
    }
  }
}

/* --- grow --- */
static int grow_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm = NULL, *big;
  int old = n - 1;
  if (rank < old) {
    if (join(rank, old, &comm)) return 2;
    if (rank == 0) {
      if (ccs_get_unique_id(&sh->grown) != CCS_OK) return 3;
      __atomic_store_n(&sh->go, 1, __ATOMIC_SEQ_CST);
    }
  }
  while (!__atomic_load_n(&sh->go, __ATOMIC_SEQ_CST)) usleep(1000);
  ccs_result_t rc = ccs_comm_grow(comm, n, sh->grown, rank, &big);
  if (rc != CCS_OK) return fprintf(stderr, "rank %d: grow: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(NULL)), 4;
  int got_rank;
  ccs_comm_user_rank(big, &got_rank);
  int bad = got_rank != rank || check(big, (int[MAXR]){0, 1, 2, 3, 4, 5, 6, 7}, n, 13);
  if (comm) bad |= check(comm, (int[MAXR]){0, 1, 2, 3, 4, 5, 6, 7}, old, 14) || ccs_comm_destroy(comm) != CCS_OK;
  return ccs_comm_destroy(big) != CCS_OK || bad;
}

static void test_grow(void **state) {
  (void)state;
  for (int d = 1; d <= 2; d++) {
    test_spread_ranks(dm, d);
    setenv("CCS_SOCKET", dm[0].socket, 1);
    assert_int_equal(ccs_get_unique_id(&sh->id), CCS_OK);
    sh->go = 0;
    assert_int_equal(test_run_ranks(3, grow_rank, NULL, 60, NULL), 0);
  }
}

/* Finalize: a host stream's calls in flight are done once it returns (their
 * results checked without synchronizing the stream); a mismatch leaves
 * nothing to report; once rank 0 revoked the comm, a call on the stream
 * fails, and finalize reports it. */
static int finalize_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  ccs_stream_t s;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK || ccs_stream_create(&s) != CCS_OK) return 2;
  enum { CALLS = 16 };
  int64_t *v;
  if (ccs_mem_alloc((void **)&v, sizeof(int64_t) * CALLS * COUNT) != CCS_OK) return 3;
  for (int c = 0; c < CALLS; c++)
    for (int i = 0; i < COUNT; i++) v[c * COUNT + i] = rank + c * i;
  for (int c = 0; c < CALLS; c++)
    if (ccs_all_reduce(v + c * COUNT, v + c * COUNT, COUNT, CCS_INT64, CCS_SUM, comm, s) != CCS_OK) return 4;
  if (ccs_comm_finalize(comm) != CCS_OK) return 5;
  int bad = 0;
  for (int c = 0; c < CALLS; c++)
    for (int i = 0; i < COUNT; i++) bad |= v[c * COUNT + i] != n * (n - 1) / 2 + n * c * i;
  int64_t x = rank;
  if (n > 1 && ccs_broadcast(&x, &x, 1, CCS_INT64, rank, comm, NULL) != CCS_ERR_MISMATCH) bad |= 8;
  bad |= (ccs_comm_finalize(comm) != CCS_OK) << 4; /* a mismatch leaves the comm usable */
  if (rank == 0 && ccs_comm_revoke(comm) != CCS_OK) bad |= 32;
  ccs_result_t rc = ccs_all_reduce(v, v, COUNT, CCS_INT64, CCS_SUM, comm, s);
  ccs_result_t fin = ccs_comm_finalize(comm);
  if (fin != CCS_ERR_REVOKED || (rc != CCS_OK && rc != CCS_ERR_REVOKED)) {
    fprintf(stderr, "rank %d: after the revoke %s, finalize %s\n", rank, ccs_result_name(rc), ccs_result_name(fin));
    bad |= 64;
  }
  ccs_stream_destroy(s);
  ccs_mem_free(v);
  return ccs_comm_destroy(comm) != CCS_OK || bad;
}

static void test_finalize(void **state) {
  (void)state;
  for (int n = 1; n <= 3; n += 2) {
    test_spread_ranks(dm, 1);
    setenv("CCS_SOCKET", dm[0].socket, 1);
    assert_int_equal(ccs_get_unique_id(&sh->id), CCS_OK);
    assert_int_equal(test_run_ranks(n, finalize_rank, NULL, 60, NULL), 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_finalize, setup, teardown),
      cmocka_unit_test_setup_teardown(test_split_one_daemon, setup, teardown),
      cmocka_unit_test_setup_teardown(test_split_across_daemons, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shrink_after_a_kill, setup, teardown),
      cmocka_unit_test_setup_teardown(test_revoke, setup, teardown),
      cmocka_unit_test_setup_teardown(test_grow, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
