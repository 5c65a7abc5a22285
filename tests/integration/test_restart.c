/* Jobs ride through a daemon restart (docs/restart.md): ranks run a loop
 * of checked calls (in-place all_reduce on registered memory, out of place
 * on malloc'ed memory, all_gather on a second comm, a ring of sends and
 * receives in a group, calls on a host stream) while the daemon dies at a
 * chosen moment of an op (CCSD_FAILPOINT: matched, started, partly
 * written, answered to some ranks), is killed while ranks wait, or is
 * stopped with SIGTERM, and is started again on the same socket. Every
 * call must end right (its elements checked against a reference) or with
 * CCS_ERR_RETRY, after which the rank restores its inputs and repeats it:
 * never a wrong element, never a hang. A daemon that does not come back
 * fails the calls with CCS_ERR_DAEMON_UNAVAILABLE after
 * CCS_RECONNECT_TIMEOUT. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "raw.h"
#include "serving.h"

#define COUNT 100003 /* int64s: 800 KB, several executor tasks an op */
#define ROUNDS 24
#define MAXR 8

struct shared {
  ccs_unique_id_t id[2];
  uint64_t seed;
  int hold;             /* ranks > 0 wait at round `hold_round` until it is 0 */
  int hold_round;
  int at_hold;          /* ranks at the held round (rank 0 about to call it, the others waiting) */
  int hold2, hold2_round, at_hold2; /* a second such hold (test_killed_before_resubmit) */
  int retried[MAXR], ok[MAXR];
  int may_fail;         /* the comm may fail as one that cannot be rejoined, saying so */
  int hold_first;       /* test_nodes_stop_owed: rank 0 waits until it is 0 */
  int failed[MAXR];
  pid_t pid[MAXR];
};
static struct shared *sh;
static struct test_daemon dmn;
static struct test_daemon node[3]; /* across daemons (below) */
static char node_listen[3][32];
static int nnodes = 2; /* (3: test_nodes_all_restart_cut_short) */

static int64_t value(int rank, int round, size_t i) {
  return (int64_t)(test_mix(sh->seed + (uint64_t)round, (uint64_t)rank * COUNT + i) % 100000);
}

static int check(const char *what, int rank, int round, const int64_t *got, size_t count,
                 int64_t (*want)(int n, int round, size_t i), int n) {
  for (size_t i = 0; i < count; i++)
    if (got[i] != want(n, round, i)) {
      fprintf(stderr, "rank %d round %d %s [%zu] = %lld, want %lld\n", rank, round, what, i,
              (long long)got[i], (long long)want(n, round, i));
      return 1;
    }
  return 0;
}

static int64_t sum_of(int n, int round, size_t i) {
  int64_t s = 0;
  for (int r = 0; r < n; r++) s += value(r, round, i);
  return s;
}
static int64_t gathered(int n, int round, size_t i) {
  (void)n;
  return value((int)(i / 1000), round, i % 1000);
}
static int ring_from;
static int64_t from_prev(int n, int round, size_t i) {
  (void)n;
  return value(ring_from, round, i);
}

/* One round's call, by its kind; its inputs filled afresh (a retried
 * in-place call has overwritten them). */
static ccs_result_t call(int kind, int rank, int n, int round, ccs_comm_t *a, ccs_comm_t *b,
                         int64_t *reg, int64_t *plain, int64_t *out, ccs_stream_t stream) {
  switch (kind) {
  case 0: /* in place, registered memory */
    for (size_t i = 0; i < COUNT; i++) reg[i] = value(rank, round, i);
    return ccs_all_reduce(reg, reg, COUNT, CCS_INT64, CCS_SUM, a, NULL);
  case 1: /* out of place, staged */
    for (size_t i = 0; i < COUNT; i++) plain[i] = value(rank, round, i);
    return ccs_all_reduce(plain, out, COUNT, CCS_INT64, CCS_SUM, a, NULL);
  case 2: /* the second comm */
    for (size_t i = 0; i < 1000; i++) plain[i] = value(rank, round, i);
    return ccs_all_gather(plain, out, 1000, CCS_INT64, b, NULL);
  case 3: { /* a ring of sends and receives */
    for (size_t i = 0; i < COUNT; i++) plain[i] = value(rank, round, i);
    ccs_group_start();
    ccs_send(plain, COUNT, CCS_INT64, (rank + 1) % n, a, NULL);
    ccs_recv(out, COUNT, CCS_INT64, (rank + n - 1) % n, a, NULL);
    return ccs_group_end();
  }
  case 5: { /* in place on malloc'ed memory, in 13 parts (client/parts.c) */
    for (size_t i = 0; i < COUNT; i++) plain[i] = value(rank, round, i);
    setenv("CCS_STAGED_PART_BYTES", "65536", 1);
    ccs_result_t rc = ccs_all_reduce(plain, plain, COUNT, CCS_INT64, CCS_SUM, a, NULL);
    unsetenv("CCS_STAGED_PART_BYTES");
    return rc;
  }
  default: { /* a host stream: two calls, then synchronize; after
              * CCS_ERR_RETRY the last ccs_stream_repeat_count of them
              * again (the second's max over ranks leaves the sum) */
    int repeat = 2;
    ccs_result_t s = CCS_OK;
    do {
      ccs_result_t rc = CCS_OK;
      if (repeat >= 2) {
        for (size_t i = 0; i < COUNT; i++) reg[i] = value(rank, round, i);
        rc = ccs_all_reduce(reg, reg, COUNT, CCS_INT64, CCS_SUM, a, stream);
      }
      if (rc == CCS_OK) rc = ccs_all_reduce(reg, reg, 1, CCS_INT64, CCS_MAX, a, stream);
      s = ccs_stream_synchronize(stream);
      if (s != CCS_ERR_RETRY) return rc != CCS_OK ? rc : s;
      if (rc != CCS_OK && rc != CCS_ERR_RETRY) return rc;
      if (ccs_stream_repeat_count(stream, &repeat) != CCS_OK || repeat < 1 || repeat > 2) return CCS_ERR_PROTOCOL;
      sh->retried[rank]++;
    } while (sh->retried[rank] <= 3);
    return s;
  }
  }
}

static int checked(int kind, int rank, int n, int round, const int64_t *reg, const int64_t *plain,
                   const int64_t *out) {
  switch (kind) {
  case 0: return check("in-place all_reduce", rank, round, reg, COUNT, sum_of, n);
  case 1: return check("all_reduce", rank, round, out, COUNT, sum_of, n);
  case 2: return check("all_gather", rank, round, out, 1000 * (size_t)n, gathered, n);
  case 3: ring_from = (rank + n - 1) % n; return check("ring", rank, round, out, COUNT, from_prev, n);
  case 5: return check("all_reduce in parts", rank, round, plain, COUNT, sum_of, n);
  default: /* the sum, then element 0's max over ranks: the same sum */
    return check("host stream all_reduce", rank, round, reg, COUNT, sum_of, n);
  }
}

static int rank_main(int rank, int n, void *arg) {
  int kinds = *(int *)arg; /* how many kinds of call the loop takes turns with */
  ccs_comm_t *a, *b;
  ccs_stream_t stream;
  sh->pid[rank] = getpid();
  if (ccs_comm_init_rank(&a, n, sh->id[0], rank) != CCS_OK ||
      ccs_comm_init_rank(&b, n, sh->id[1], rank) != CCS_OK || ccs_stream_create(&stream) != CCS_OK) {
    fprintf(stderr, "rank %d: init: %s\n", rank, ccs_comm_last_error(NULL));
    return 10;
  }
  int64_t *reg, *plain = malloc(sizeof(int64_t) * COUNT * MAXR), *out = malloc(sizeof(int64_t) * COUNT * MAXR);
  if (ccs_mem_alloc((void **)&reg, sizeof(int64_t) * COUNT) != CCS_OK || !plain || !out) return 11;
  int bad = 0;
  for (int round = 0; round < ROUNDS && !bad; round++) {
    if (round == sh->hold_round) __atomic_add_fetch(&sh->at_hold, 1, __ATOMIC_SEQ_CST);
    if (round == sh->hold_round && rank > 0)
      while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
    if (round == sh->hold2_round) __atomic_add_fetch(&sh->at_hold2, 1, __ATOMIC_SEQ_CST);
    if (round == sh->hold2_round && rank > 0)
      while (__atomic_load_n(&sh->hold2, __ATOMIC_SEQ_CST)) usleep(1000);
    int kind = round % kinds;
    ccs_result_t rc;
    int tries = 0;
    while ((rc = call(kind, rank, n, round, a, b, reg, plain, out, stream)) == CCS_ERR_RETRY && tries++ < 3)
      sh->retried[rank]++;
    if (rc != CCS_OK) {
      const char *why = ccs_comm_last_error(kind == 2 ? b : a);
      fprintf(stderr, "rank %d round %d kind %d: %s: %s\n", rank, round, kind, ccs_result_name(rc), why);
      if (sh->may_fail && rc == CCS_ERR_PEER_LOST && strstr(why, "cannot be rejoined")) sh->failed[rank] = 1;
      else bad = 1;
      break;
    }
    sh->ok[rank]++;
    bad |= checked(kind, rank, n, round, reg, plain, out);
  }
  ccs_stream_destroy(stream);
  ccs_mem_free(reg);
  free(plain), free(out);
  bad |= ccs_comm_destroy(a) != CCS_OK;
  bad |= ccs_comm_destroy(b) != CCS_OK;
  return bad;
}

/* Until a call is under way at d (30 s at most). */
static void wait_for_call(const struct test_daemon *d) { raw_wait_ops_in_flight(d->socket, 1, 30); }

/* Until n ranks counted themselves in *at (sh->at_hold; 30 s at most). */
static void wait_at(const int *at, int n) {
  double until = test_now() + 30;
  while (__atomic_load_n(at, __ATOMIC_SEQ_CST) < n && test_now() < until) usleep(1000);
}
static void wait_at_hold(int n) { wait_at(&sh->at_hold, n); }

/* Where the ranks run and which daemon dies: one daemon, or two (rank r
 * on daemon r % 2) of which the second dies and the first holds the
 * ranks' comms for it (below). */
struct where {
  struct test_daemon *victim, *waiting; /* waiting: where rank 0 waits in the held round */
  int (*again)(void);                   /* the victim started again */
  const char *what;                     /* for the report */
  struct test_daemon *also;             /* dies with the victim (again() starts both); NULL: none */
  void (*check)(void);                  /* the daemons' counts of what the restart did; NULL: none */
};

/* d's count of a restart event (ccs_comm_restarts_total, docs/restart.md). */
static double restart_events(const struct test_daemon *d, const char *event) {
  char series[96];
  snprintf(series, sizeof(series), "ccs_comm_restarts_total{event=\"%s\"}", event);
  char *text = raw_admin(d->socket, "metrics");
  double n = raw_metric(text, series);
  free(text);
  return n;
}

/* Until d counted at least n of event (30 s at most): 0, or -1. (No
 * assert: callers let stopped processes go on first.) */
static int wait_restart_events(const struct test_daemon *d, const char *event, double n) {
  double until = test_now() + 30;
  while (restart_events(d, event) < n && test_now() < until) usleep(10000);
  return restart_events(d, event) >= n ? 0 : -1;
}

static void assert_events(const struct test_daemon *d, const char *event, double n) {
  double got = restart_events(d, event);
  if (got != n) fprintf(stderr, "%s: %s counted %g times, not %g\n", d->socket, event, got, n);
  assert_true(got == n);
}

/* The ranks' loop while the victim dies where `failpoint` says (NULL:
 * killed while rank 0 waits alone in round hold_round, or stopped with
 * SIGTERM when `term`), and is started again each time it died. The calls
 * the daemon went under are resubmitted or found finished, or (retry) each
 * rank repeats one after CCS_ERR_RETRY; with sh->may_fail the comm may
 * fail instead, every rank told it cannot be rejoined. The daemons are
 * stopped with stop() before the verdict.
 *
 * Where the points fall: each round's call is one op, but a ring of sends
 * (kind 3: one op per pair of ranks), a host stream's (kind 4: two) and
 * a call in parts (kind 5: 13);
 * the answers count 2 comm inits per rank first, then a call per rank. */
static void run_at(const struct where *w, void (*stop)(void), int n, int kinds, const char *failpoint,
                   int term, int retry) {
  pid_t ranks = fork();
  if (ranks == 0) {
    int st[MAXR], bad = 0;
    test_run_ranks(n, rank_main, &kinds, 120, st);
    for (int r = 0; r < n; r++) bad |= st[r] != 0;
    _exit(bad);
  }
  int restarts = 0, status = -1;
  if (!failpoint) { /* rank 0 blocked in the held round: the daemon goes under it */
    /* every rank there: no call but rank 0's is under way when the daemon goes */
    wait_at_hold(n);
    wait_for_call(w->waiting);
    if (w->also && term) kill(w->also->pid, SIGTERM); /* both stop together */
    if (term) assert_int_equal(test_daemon_term(w->victim), 0);
    else test_daemon_kill(w->victim);
    if (w->also && term) assert_int_equal(test_daemon_term(w->also), 0);
    else if (w->also) test_daemon_kill(w->also);
    usleep(100000); /* the keepers try, and wait for the daemon */
    assert_int_equal(w->again(), 0);
    restarts++;
    __atomic_store_n(&sh->hold, 0, __ATOMIC_SEQ_CST);
  }
  for (;;) {
    pid_t done = waitpid(ranks, &status, WNOHANG);
    if (done == ranks) break;
    if (w->victim->pid > 0 && !test_daemon_alive(w->victim)) { /* the failpoint: as systemd, start it again */
      test_daemon_kill(w->victim);
      if (w->also) test_daemon_kill(w->also); /* (crashed together) */
      assert_int_equal(w->again(), 0);
      restarts++;
    }
    usleep(2000);
  }
  int retried = 0, ok = 0, failed = 0;
  for (int r = 0; r < n; r++) retried += sh->retried[r], ok += sh->ok[r], failed += sh->failed[r];
  fprintf(stderr, "# %s%s, %d ranks: %d restart(s); %d calls right, %d repeated after CCS_ERR_RETRY%s\n",
          w->what, failpoint ? failpoint : term ? "SIGTERM" : "SIGKILL while waiting", n, restarts, ok,
          retried, failed ? "; the comm failed as one that cannot be rejoined" : "");
  if (w->check && !failed) w->check();
  stop();
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(restarts, 1); /* the daemon did die where it was told */
  if (failed) { /* every rank was told, and none got a wrong element first */
    assert_int_equal(failed, n);
    return;
  }
  assert_int_equal(ok, n * ROUNDS);
  if (retry > 0) assert_int_equal(retried, n); /* every rank repeated the call */
  else if (retry == 0) assert_int_equal(retried, 0);
}

static void fresh_round(int failpoint) {
  sh->seed = test_seed();
  sh->hold_round = failpoint ? -1 : 5;
  sh->hold = !failpoint;
  sh->at_hold = 0;
  sh->hold2_round = -1;
  memset(sh->retried, 0, sizeof(sh->retried));
  memset(sh->ok, 0, sizeof(sh->ok));
  memset(sh->failed, 0, sizeof(sh->failed));
  memset(sh->pid, 0, sizeof(sh->pid));
}

/* Until d killed itself at its failpoint (30 s at most), reaped. */
static void failpoint_reached(struct test_daemon *d) {
  double until = test_now() + 30;
  while (test_daemon_alive(d) && test_now() < until) usleep(2000);
  assert_false(test_daemon_alive(d));
  test_daemon_kill(d);
}

static int dmn_again(void) { return test_daemon_restart(&dmn, NULL); }
static void dmn_stop(void) { assert_int_equal(test_daemon_stop(&dmn), 0); }

/* Both comms made whole again with every rank here, none failed. */
static void rejoined_here(void) {
  assert_events(&dmn, "rejoined_here", 2);
  assert_events(&dmn, "failed", 0);
}

static void run(int n, int kinds, const char *failpoint, int term, int retry) {
  fresh_round(failpoint != NULL);
  if (failpoint) setenv("CCSD_FAILPOINT", failpoint, 1);
  assert_int_equal(test_daemon_start(&dmn, NULL), 0);
  unsetenv("CCSD_FAILPOINT");
  test_new_id(&sh->id[0]);
  test_new_id(&sh->id[1]);
  const struct where one = {&dmn, &dmn, dmn_again, "", NULL, failpoint ? NULL : rejoined_here};
  run_at(&one, dmn_stop, n, kinds, failpoint, term, retry);
}

static int setup(void **state) {
  (void)state;
  sh = test_shared_new(sizeof(*sh));
  return sh ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  unsetenv("CCS_KEEP_INPUT_BYTES");
  test_daemon_stop(&dmn);
  for (int k = 0; k < 3; k++) test_daemon_stop(&node[k]);
  nnodes = 2;
  test_shared_free(sh, sizeof(*sh));
  return 0;
}

/* Each moment of an op, with 2 and 3 ranks: the calls of the round it
 * hits resubmitted, found finished, or repeated after CCS_ERR_RETRY. */
static void test_waiting(void **state) {
  (void)state;
  run(3, 4, NULL, 0, 0); /* rank 0's call waits for the others when the daemon dies */
  run(2, 4, NULL, 1, 0); /* the same, stopped with SIGTERM */
}

static void test_matched(void **state) {
  (void)state;
  run(3, 4, "launch:6", 0, 0); /* round 3: the ring's last pair */
  run(2, 4, "launch:6", 0, 0); /* round 4: in place on registered memory, not begun */
}

static void test_started(void **state) {
  (void)state;
  run(2, 4, "started:6", 0, 1); /* round 4: in place on registered memory: repeated */
  run(3, 4, "started:8", 0, 0); /* round 5: staged: resubmitted */
  run(1, 4, "started:5", 0, 1); /* one rank, round 4 */
  /* an in-place call partly written, its 800,024 bytes within
   * CCS_KEEP_INPUT_BYTES: each rank's libccs kept a copy of its input,
   * puts it back and resubmits it (none repeats it) */
  setenv("CCS_KEEP_INPUT_BYTES", "1048576", 1);
  run(2, 4, "task:2", 0, 0); /* round 0, in place, partly written */
  run(3, 4, "task:3", 0, 0);
  unsetenv("CCS_KEEP_INPUT_BYTES");
}

static void test_partly_written(void **state) {
  (void)state;
  run(3, 4, "task:30", 0, -1);
}

static void test_answered_to_some(void **state) {
  (void)state;
  run(3, 4, "answer:20", 0, 0); /* round 4 (in place): one rank has its answer */
  run(2, 4, "answer:13", 0, 0); /* round 4: finished, no answer out (the journal says so) */
  run(3, 4, "answer:17", 0, 0); /* round 3: the ring's */
}

/* The daemon goes as it answers a comm's inits, some of its ranks
 * answered: those not send their init again, as a rejoin that made no
 * call, and join the comm the others rejoin; the rank that got its init
 * answer then calls ccs_mem_alloc, which goes to the daemon back too. */
static void test_init_answered_to_some(void **state) {
  (void)state;
  run(3, 4, "answer:2", 0, 0); /* the first comm: rank 0 answered */
  run(2, 4, "answer:4", 0, 0); /* the second: rank 0 answered, then its ccs_mem_alloc */
  /* the same, the daemon gone while rank 0's answered comm is not tracked
   * yet (its connection's keeper, started by the first comm, rejoins it
   * too: without waiting for it, rank 0's calls on it failed) */
  setenv("CCS_TEST_INIT_PAUSE_MS", "300", 1);
  run(2, 4, "answer:4", 0, 0);
  unsetenv("CCS_TEST_INIT_PAUSE_MS");
}

static void test_host_stream(void **state) {
  (void)state;
  run(3, 5, "started:15", 0, 1); /* round 9: a host stream's calls: repeated */
}

/* A staged call in parts, in place: the parts from the one the daemon
 * went under go again from the caller's buffer (only finished parts were
 * copied out), the caller sees nothing */
static void test_parts(void **state) {
  (void)state;
  run(3, 6, "started:12", 0, 0); /* round 5: its 4th part */
  run(2, 6, "answer:30", 0, 0);  /* round 5: one of its parts answered to one rank */
  run(3, 6, NULL, 0, 0);         /* round 5: killed as rank 0 waits for its first part */
  run(2, 6, NULL, 1, 0);         /* the same, stopped with SIGTERM */
}

/* The daemon killed while rank 0 waits alone in round 5 (staged: its call
 * to resubmit), then dying again as soon as its ranks rejoined, before that
 * call went out again (its staging area is asked of the dead daemon): the
 * second restart's reports leave the call out, being in none, and its
 * verdict numbers the channel as if it were not made. The call goes out
 * under its number after the third start; a third death, while rank 0
 * waits alone in round 9, finds every rank's calls numbered as the daemon
 * counts them. (A rank one short there had its call "finished" without
 * running: every element wrong.) */
static void test_killed_before_resubmit(void **state) {
  (void)state;
  fresh_round(0);
  sh->hold2_round = 9;
  sh->hold2 = 1;
  sh->at_hold2 = 0;
  const int n = 3, kinds = 4;
  assert_int_equal(test_daemon_start(&dmn, NULL), 0);
  test_new_id(&sh->id[0]);
  test_new_id(&sh->id[1]);
  pid_t ranks = fork();
  if (ranks == 0) {
    int st[MAXR], bad = 0;
    test_run_ranks(n, rank_main, (void *)&kinds, 120, st);
    for (int r = 0; r < n; r++) bad |= st[r] != 0;
    _exit(bad);
  }
  wait_at_hold(n);
  wait_for_call(&dmn);
  test_daemon_kill(&dmn);
  usleep(100000);
  setenv("CCSD_FAILPOINT", "rejoined:2", 1); /* both comms rejoined: killed */
  assert_int_equal(test_daemon_restart(&dmn, NULL), 0);
  unsetenv("CCSD_FAILPOINT");
  __atomic_store_n(&sh->hold, 0, __ATOMIC_SEQ_CST);
  failpoint_reached(&dmn);
  assert_int_equal(test_daemon_restart(&dmn, NULL), 0);
  wait_at(&sh->at_hold2, n);
  wait_for_call(&dmn);
  test_daemon_kill(&dmn);
  usleep(100000);
  assert_int_equal(test_daemon_restart(&dmn, NULL), 0);
  __atomic_store_n(&sh->hold2, 0, __ATOMIC_SEQ_CST);
  int status;
  assert_int_equal(waitpid(ranks, &status, 0), ranks);
  int ok = 0, retried = 0;
  for (int r = 0; r < n; r++) ok += sh->ok[r], retried += sh->retried[r];
  fprintf(stderr, "# killed waiting, again once rejoined, and waiting again, %d ranks: %d calls right, "
          "%d repeated after CCS_ERR_RETRY\n", n, ok, retried);
  dmn_stop();
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(ok, n * ROUNDS);
  assert_int_equal(retried, 0);
}

/* Two calls of one shape on a host stream (in place on registered memory,
 * x then y), the last rank making the second only once the daemon is
 * back: before, the others' first (to repeat) could be matched with its
 * second, every element wrong and nothing said. With `first_done` the
 * daemon goes after x finished and while the others' y waits for that
 * rank: they repeat y alone (ccs_stream_repeat_count 1), the last rank
 * makes its y as any call. Else it goes as x starts: every rank repeats
 * both, the last rank's y not made (CCS_ERR_RETRY, counted) since its x
 * must be repeated first. With y staged (malloc'ed, in 13 parts: it waits
 * for the stream and goes in parts of its own) likewise, but in the first
 * case it rides the restart inside like any staged call: nobody repeats. */
struct late_second {
  int first_done, staged_y;
};
static int late_second_rank(int rank, int n, void *arg) {
  const struct late_second *how = arg;
  int first_done = how->first_done, late = rank == n - 1, bad = 0;
  ccs_comm_t *comm;
  ccs_stream_t s;
  int64_t *x, *y = how->staged_y ? malloc(sizeof(int64_t) * COUNT) : NULL;
  if (ccs_comm_init_rank(&comm, n, sh->id[0], rank) != CCS_OK || ccs_stream_create(&s) != CCS_OK ||
      ccs_mem_alloc((void **)&x, sizeof(int64_t) * COUNT) != CCS_OK ||
      (!y && ccs_mem_alloc((void **)&y, sizeof(int64_t) * COUNT) != CCS_OK))
    return 10;
  if (how->staged_y) setenv("CCS_STAGED_PART_BYTES", "65536", 1);
  int repeat = 2;
  for (int tries = 0; tries < 4; tries++) {
    if (repeat >= 2) {
      for (size_t i = 0; i < COUNT; i++) x[i] = value(rank, 0, i);
      bad |= ccs_all_reduce(x, x, COUNT, CCS_INT64, CCS_SUM, comm, s) != CCS_OK;
    }
    if (late && tries == 0) {
      while (first_done && ccs_stream_query(s) == CCS_IN_PROGRESS) usleep(1000);
      __atomic_add_fetch(&sh->at_hold, 1, __ATOMIC_SEQ_CST);
      while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
    }
    for (size_t i = 0; i < COUNT; i++) y[i] = value(rank, 1, i);
    ccs_result_t rc = ccs_all_reduce(y, y, COUNT, CCS_INT64, CCS_SUM, comm, s);
    ccs_result_t synced = ccs_stream_synchronize(s);
    if (synced == CCS_OK) {
      bad |= rc != CCS_OK;
      break;
    }
    if (synced != CCS_ERR_RETRY || ccs_stream_repeat_count(s, &repeat) != CCS_OK) {
      fprintf(stderr, "rank %d: %s: %s\n", rank, ccs_result_name(synced), ccs_comm_last_error(comm));
      bad = 1;
      break;
    }
    fprintf(stderr, "# rank %d repeats the last %d call(s)%s\n", rank, repeat,
            rc == CCS_ERR_RETRY ? " (its second not made)" : "");
    sh->retried[rank] = repeat;
  }
  bad |= check("host stream x", rank, 0, x, COUNT, sum_of, n);
  bad |= check("host stream y", rank, 1, y, COUNT, sum_of, n);
  ccs_stream_destroy(s);
  ccs_mem_free(x);
  if (how->staged_y) free(y);
  else ccs_mem_free(y);
  bad |= ccs_comm_destroy(comm) != CCS_OK;
  return bad;
}

static void late_second(int first_done, int staged_y) {
  const int n = 3;
  struct late_second how = {first_done, staged_y};
  fresh_round(1);
  sh->hold = 1;
  if (!first_done) setenv("CCSD_FAILPOINT", "started:1", 1); /* as x starts */
  assert_int_equal(test_daemon_start(&dmn, NULL), 0);
  unsetenv("CCSD_FAILPOINT");
  test_new_id(&sh->id[0]);
  pid_t ranks = fork();
  if (ranks == 0) _exit(test_run_ranks(n, late_second_rank, &how, 120, NULL));
  wait_at_hold(1);
  if (first_done) {
    wait_for_call(&dmn); /* the others' y */
    test_daemon_kill(&dmn);
  } else {
    failpoint_reached(&dmn);
  }
  usleep(100000);
  assert_int_equal(test_daemon_restart(&dmn, NULL), 0);
  __atomic_store_n(&sh->hold, 0, __ATOMIC_SEQ_CST);
  int status;
  assert_int_equal(waitpid(ranks, &status, 0), ranks);
  dmn_stop();
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  for (int r = 0; r < n; r++) /* who repeated what */
    assert_int_equal(sh->retried[r], !first_done ? 2 : staged_y || r == n - 1 ? 0 : 1);
}

static void test_host_stream_late_second(void **state) {
  (void)state;
  late_second(0, 0);
  late_second(1, 0);
  late_second(0, 1);
  late_second(1, 1);
}

/* No daemon comes back: the calls fail once CCS_RECONNECT_TIMEOUT passed. */
/* A rank's comm made, its init answered: counted in sh->at_hold (a daemon
 * killed before a rank read its init's answer fails the init instead of
 * the call the test means). NULL when the init failed, saying so. */
static ccs_comm_t *init_counted(int rank, int n) {
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id[0], rank) != CCS_OK) {
    fprintf(stderr, "rank %d: init: %s\n", rank, ccs_comm_last_error(NULL));
    return NULL;
  }
  __atomic_add_fetch(&sh->at_hold, 1, __ATOMIC_SEQ_CST);
  return comm;
}

static int abandoned_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm = init_counted(rank, n);
  if (!comm) return 10;
  int64_t v = rank, out;
  if (rank == n - 1) {
    while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
  }
  double t0 = test_now();
  ccs_result_t rc = ccs_all_reduce(&v, &out, 1, CCS_INT64, CCS_SUM, comm, NULL);
  double took = test_now() - t0;
  int ok = rc == CCS_ERR_DAEMON_UNAVAILABLE && strstr(ccs_comm_last_error(comm), "did not come back");
  if (!ok) fprintf(stderr, "rank %d: %s (%s) after %.2f s\n", rank, ccs_result_name(rc), ccs_comm_last_error(comm), took);
  ccs_comm_destroy(comm);
  return !ok;
}

static void test_daemon_not_back(void **state) {
  (void)state;
  assert_int_equal(test_daemon_start(&dmn, NULL), 0);
  test_new_id(&sh->id[0]);
  sh->hold = 1;
  sh->at_hold = 0;
  setenv("CCS_RECONNECT_TIMEOUT", "1", 1);
  pid_t ranks = fork();
  if (ranks == 0) _exit(test_run_ranks(2, abandoned_rank, NULL, 60, NULL));
  unsetenv("CCS_RECONNECT_TIMEOUT");
  wait_at_hold(2);
  wait_for_call(&dmn);
  test_daemon_kill(&dmn);
  __atomic_store_n(&sh->hold, 0, __ATOMIC_SEQ_CST);
  int status;
  assert_int_equal(waitpid(ranks, &status, 0), ranks);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* Ids issued before a restart join after it: the key stays beside the
 * socket (the daemon's file alone); a key file that is not the daemon's
 * own is not used, and then they do not. */
static void test_ids_after_restart(void **state) {
  (void)state;
  assert_int_equal(test_daemon_start(&dmn, NULL), 0);
  ccs_unique_id_t id;
  assert_int_equal(ccs_get_unique_id(&id), CCS_OK);
  test_daemon_kill(&dmn);
  assert_int_equal(test_daemon_restart(&dmn, NULL), 0);
  ccs_comm_t *comm;
  assert_int_equal(ccs_comm_init_rank(&comm, 1, id, 0), CCS_OK);
  int64_t v = 7;
  assert_int_equal(ccs_all_reduce(&v, &v, 1, CCS_INT64, CCS_SUM, comm, NULL), CCS_OK);
  assert_int_equal(v, 7);
  assert_int_equal(ccs_comm_destroy(comm), CCS_OK);
  /* a key file others may read: refused, a key of one run instead */
  char key[160];
  snprintf(key, sizeof(key), "%s.id-key", dmn.socket);
  assert_int_equal(test_daemon_term(&dmn), 0);
  assert_int_equal(chmod(key, 0644), 0);
  assert_int_equal(test_daemon_restart(&dmn, NULL), 0);
  assert_int_equal(ccs_comm_init_rank(&comm, 1, id, 0), CCS_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ccs_comm_last_error(NULL), "before it restarted"));
  assert_int_equal(test_daemon_stop(&dmn), 0);
}

/* A host stream's calls out when their comm cannot be rejoined (the
 * daemon comes back with a key of its own run: the comm's id is not its
 * own any more): synchronize fails, and the stream then serves a new comm,
 * its count of calls in flight right again. */
static int stream_lost_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  ccs_stream_t stream;
  int64_t *buf;
  if (ccs_comm_init_rank(&comm, n, sh->id[0], rank) != CCS_OK || ccs_stream_create(&stream) != CCS_OK ||
      ccs_mem_alloc((void **)&buf, 2 * sizeof(int64_t)) != CCS_OK)
    return 10;
  int bad = 0;
  if (rank == 0) { /* two calls out, waiting for rank 1 when the daemon goes */
    buf[0] = 1, buf[1] = 2;
    bad |= ccs_all_reduce(&buf[0], &buf[0], 1, CCS_INT64, CCS_SUM, comm, stream) != CCS_OK;
    bad |= ccs_all_reduce(&buf[1], &buf[1], 1, CCS_INT64, CCS_SUM, comm, stream) != CCS_OK;
    __atomic_store_n(&sh->at_hold, 1, __ATOMIC_SEQ_CST);
    ccs_result_t rc = ccs_stream_synchronize(stream);
    if (rc == CCS_OK) fprintf(stderr, "rank 0: synchronize after its comm was lost: CCS_OK\n"), bad = 1;
    ccs_comm_destroy(comm);
    ccs_unique_id_t id;
    ccs_comm_t *alone;
    if (ccs_get_unique_id(&id) != CCS_OK || ccs_comm_init_rank(&alone, 1, id, 0) != CCS_OK) return 11;
    buf[0] = 5;
    bad |= ccs_all_reduce(&buf[0], &buf[0], 1, CCS_INT64, CCS_SUM, alone, stream) != CCS_OK;
    rc = ccs_stream_synchronize(stream);
    if (rc != CCS_OK || buf[0] != 5)
      fprintf(stderr, "rank 0: the stream on a new comm: %s, %lld\n", ccs_result_name(rc), (long long)buf[0]), bad = 1;
    ccs_comm_destroy(alone);
  } else {
    while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
    ccs_comm_destroy(comm);
  }
  ccs_stream_destroy(stream);
  ccs_mem_free(buf);
  return bad;
}

static void test_host_stream_lost(void **state) {
  (void)state;
  assert_int_equal(test_daemon_start(&dmn, NULL), 0);
  test_new_id(&sh->id[0]);
  sh->hold = 1;
  sh->at_hold = 0;
  pid_t ranks = fork();
  if (ranks == 0) _exit(test_run_ranks(2, stream_lost_rank, NULL, 60, NULL));
  wait_at_hold(1);
  wait_for_call(&dmn);
  char key[160];
  snprintf(key, sizeof(key), "%s.id-key", dmn.socket);
  test_daemon_kill(&dmn);
  assert_int_equal(chmod(key, 0644), 0); /* (the next daemon uses a key of its own) */
  assert_int_equal(test_daemon_restart(&dmn, NULL), 0);
  __atomic_store_n(&sh->hold, 0, __ATOMIC_SEQ_CST);
  int status;
  assert_int_equal(waitpid(ranks, &status, 0), ranks);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(test_daemon_stop(&dmn), 0);
}

/* A comm still forming when a daemon of it goes: the ranks waiting in
 * their init (all but the last, held back) send it again once the daemon
 * is back, whether theirs went (the connection lost) or another one of
 * the comm (its init failed everywhere); the last joins after the restart,
 * and the comm's all_reduce is checked. */
#define FORMING_COUNT 1001
static int forming_rank(int rank, int n, void *arg) {
  (void)arg;
  if (rank == n - 1)
    while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
  ccs_comm_t *comm;
  ccs_result_t rc = ccs_comm_init_rank(&comm, n, sh->id[0], rank);
  if (rc != CCS_OK) {
    fprintf(stderr, "rank %d: init: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(NULL));
    return 10;
  }
  int64_t v[FORMING_COUNT];
  for (size_t i = 0; i < FORMING_COUNT; i++) v[i] = value(rank, 0, i);
  rc = ccs_all_reduce(v, v, FORMING_COUNT, CCS_INT64, CCS_SUM, comm, NULL);
  int bad = rc != CCS_OK || check("all_reduce", rank, 0, v, FORMING_COUNT, sum_of, n);
  if (rc != CCS_OK) fprintf(stderr, "rank %d: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(comm));
  ccs_comm_destroy(comm);
  return bad;
}

/* The ranks but the last in their init at every daemon of `at`, then
 * `victim` killed (or stopped) and started again by `again`. */
static void forming(int n, struct test_daemon *at, int nat, struct test_daemon *victim, int term,
                    int (*again)(void)) {
  sh->hold = 1;
  pid_t ranks = fork();
  if (ranks == 0) _exit(test_run_ranks(n, forming_rank, NULL, 60, NULL));
  for (int k = 0; k < nat; k++) raw_wait_comms(at[k].socket, 1, 30);
  usleep(200000); /* every rank's join there */
  if (term) assert_int_equal(test_daemon_term(victim), 0);
  else test_daemon_kill(victim);
  assert_int_equal(again(), 0);
  __atomic_store_n(&sh->hold, 0, __ATOMIC_SEQ_CST);
  int status;
  assert_int_equal(waitpid(ranks, &status, 0), ranks);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_init_cut_short(void **state) {
  (void)state;
  for (int term = 0; term < 2; term++) {
    sh->seed = test_seed();
    assert_int_equal(test_daemon_start(&dmn, NULL), 0);
    test_new_id(&sh->id[0]);
    forming(3, &dmn, 1, &dmn, term, dmn_again);
    assert_int_equal(test_daemon_stop(&dmn), 0);
  }
}

/* --- across daemons: ranks on two daemons (rank r on daemon r % 2), and
 * the second one restarts while the first holds their comms for it
 * (peer_restart_grace). Only the second daemon's ranks rejoin; the first
 * one's calls wait, run again, or return CCS_ERR_RETRY with the others. */

static const char *node0_quota_ops; /* the first daemon's --quota-ops, or NULL */

static int start_node(int k, int again, const char *grace) {
  const char *args[14] = {"--listen", node_listen[k], "--cluster-key-file", test_cluster_key(),
                          "--peer-restart-grace", grace};
  int at = 6;
  if (k == 0 && node0_quota_ops) args[at++] = "--quota-ops", args[at++] = node0_quota_ops;
  test_ib_args(args + at); /* (over the emulated NIC: test_restart_ib) */
  return again ? test_daemon_restart(&node[k], args) : test_daemon_start(&node[k], args);
}

/* ids: from the daemon that stays (root 0) or the one that restarts (1) */
static void start_nodes(const char *failpoint, int root, const char *grace) {
  for (int k = 0; k < nnodes; k++) { /* each port found free once the ones before are taken */
    snprintf(node_listen[k], sizeof(node_listen[k]), "127.0.0.1:%d", test_free_port());
    if (failpoint && k == 1) setenv("CCSD_FAILPOINT", failpoint, 1);
    assert_int_equal(start_node(k, 0, grace), 0);
    unsetenv("CCSD_FAILPOINT");
  }
  setenv("CCS_SOCKET", node[root].socket, 1);
  test_new_id(&sh->id[0]);
  test_new_id(&sh->id[1]);
  test_spread_ranks(node, nnodes);
}


/* The held ranks go on; every rank must end well. */
static void stop_nodes(void);
static void release_and_wait(pid_t ranks) {
  __atomic_store_n(&sh->hold, 0, __ATOMIC_SEQ_CST);
  int status;
  assert_int_equal(waitpid(ranks, &status, 0), ranks);
  stop_nodes();
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

static void stop_nodes(void) {
  test_spread_ranks(NULL, 0);
  for (int k = 0; k < nnodes; k++) test_daemon_stop(&node[k]);
}

static const char *grace_again = "30"; /* peer_restart_grace of the daemons started again */
static int second_again(void) { return start_node(1, 1, grace_again); }

/* The first daemon held both comms and went on with them; the second made
 * them whole again from its word. */
static void held_by_first(void) {
  assert_events(&node[0], "held", 2);
  assert_events(&node[0], "resumed", 2);
  assert_events(&node[1], "holder_heard", 2);
  assert_events(&node[1], "rejoined_from_holders", 2);
  for (int k = 0; k < 2; k++) assert_events(&node[k], "failed", 0);
}

static void run_nodes(int n, int kinds, const char *failpoint, int term, int retry, int root) {
  fresh_round(failpoint != NULL);
  start_nodes(failpoint, root, "30");
  const struct where two = {&node[1], &node[0], second_again,
                            root ? "across 2 daemons, ids from the restarting one: "
                                 : "across 2 daemons, ids from the staying one: ",
                            NULL, failpoint ? NULL : held_by_first};
  run_at(&two, stop_nodes, n, kinds, failpoint, term, retry);
}

/* Every kind of call, sends and receives across the daemons among them
 * (their counts carry over the restart): the second daemon goes while
 * the first one's rank waits, killed or stopped, with the comms' root on
 * either daemon. */
static void test_nodes_waiting(void **state) {
  (void)state;
  run_nodes(3, 4, NULL, 0, 0, 0);
  run_nodes(2, 4, NULL, 1, 0, 1);
  run_nodes(4, 4, NULL, 0, 0, 1);
}

/* A host stream's calls (round 4) pending at the first daemon, rank 0
 * waiting in synchronize, when the second one goes, killed or stopped:
 * held as other calls are, they run once the ranks of the second are
 * back. Killed as the first of them starts there (in place): every rank
 * gets CCS_ERR_RETRY at synchronize and repeats them. */
static void test_nodes_host_stream(void **state) {
  (void)state;
  for (int term = 0; term < 2; term++) {
    fresh_round(0);
    sh->hold_round = 4;
    start_nodes(NULL, term, "30");
    const struct where two = {&node[1], &node[0], second_again, "across 2 daemons, a host stream: "};
    run_at(&two, stop_nodes, 3, 5, NULL, term, 0);
  }
  run_nodes(3, 5, "started:6", 0, 1, 0);
}

/* Two host streams of one comm: x on the first, then, once the second
 * daemon was killed as x started there, came back, and the first let the
 * comm go on (dropping x for every rank to repeat), y on the second. y
 * must not take x's number: at the first daemon, made before its rank read
 * that x was dropped (the second stream had nothing in flight to look
 * at), ccsd refuses it; at the second, libccs does (x to repeat). Every
 * rank then repeats both, in their order. */
static int two_streams_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  ccs_stream_t s[2];
  int64_t *xy, one = rank;
  if (ccs_comm_init_rank(&comm, n, sh->id[0], rank) != CCS_OK || ccs_stream_create(&s[0]) != CCS_OK ||
      ccs_stream_create(&s[1]) != CCS_OK || ccs_mem_alloc((void **)&xy, 2 * COUNT * sizeof(int64_t)) != CCS_OK ||
      ccs_all_reduce(&one, &one, 1, CCS_INT64, CCS_SUM, comm, NULL) != CCS_OK)
    return 10;
  int bad = one != (int64_t)n * (n - 1) / 2;
  int repeat[2] = {1, 1};
  ccs_result_t rc[2];
  for (int tries = 0; tries < 3 && (repeat[0] || repeat[1]); tries++) {
    for (int k = 0; k < 2; k++) {
      if (!repeat[k]) continue;
      for (size_t i = 0; i < COUNT; i++) xy[k * COUNT + i] = value(rank, k, i);
      if (k == 1 && tries == 0) { /* y: once the first daemon let the comm go on */
        __atomic_add_fetch(&sh->at_hold, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
      }
      ccs_result_t made = ccs_all_reduce(&xy[k * COUNT], &xy[k * COUNT], COUNT, CCS_INT64, CCS_SUM, comm, s[k]);
      if (made != CCS_OK && made != CCS_ERR_RETRY) bad = 1;
    }
    for (int k = 0; k < 2; k++) {
      rc[k] = ccs_stream_synchronize(s[k]);
      repeat[k] = 0;
      if (rc[k] == CCS_ERR_RETRY && ccs_stream_repeat_count(s[k], &repeat[k]) != CCS_OK) bad = 1;
      else if (rc[k] != CCS_OK && rc[k] != CCS_ERR_RETRY) bad = 1;
      if (rc[k] != CCS_OK) fprintf(stderr, "rank %d stream %d: %s: %s\n", rank, k, ccs_result_name(rc[k]), ccs_comm_last_error(comm));
    }
    if (bad || repeat[0] != repeat[1] || repeat[0] > 1) {
      fprintf(stderr, "rank %d: repeat %d and %d\n", rank, repeat[0], repeat[1]);
      bad = 1;
      break;
    }
    sh->retried[rank] += repeat[0];
  }
  bad = bad || check("x", rank, 0, xy, COUNT, sum_of, n) || check("y", rank, 1, xy + COUNT, COUNT, sum_of, n);
  one = rank;
  bad |= ccs_all_reduce(&one, &one, 1, CCS_INT64, CCS_SUM, comm, NULL) != CCS_OK || one != (int64_t)n * (n - 1) / 2;
  ccs_stream_destroy(s[0]);
  ccs_stream_destroy(s[1]);
  ccs_mem_free(xy);
  bad |= ccs_comm_destroy(comm) != CCS_OK;
  return bad;
}

/* Until d's comms are (held) or are not (!held) held for a daemon that
 * went: 30 s at most. */
static void wait_held(const struct test_daemon *d, int held) {
  double until = test_now() + 30;
  for (;;) {
    char *text = raw_admin(d->socket, "comms");
    int is = strstr(text, " held") != NULL;
    free(text);
    if (is == held) return;
    assert_true(test_now() < until);
    usleep(5000);
  }
}

static void test_nodes_two_streams(void **state) {
  (void)state;
  for (int root = 0; root < 2; root++) {
    fresh_round(1);
    sh->hold = 1;
    start_nodes("started:2", root, "30"); /* the second daemon: the all_reduce before, then x */
    pid_t ranks = fork();
    if (ranks == 0) _exit(test_run_ranks(3, two_streams_rank, NULL, 120, NULL));
    failpoint_reached(&node[1]);
    wait_held(&node[0], 1);
    assert_int_equal(second_again(), 0);
    wait_held(&node[0], 0);
    wait_at_hold(3);
    release_and_wait(ranks);
    for (int r = 0; r < 3; r++) assert_int_equal(sh->retried[r], 1);
  }
}

/* Not a restart, the same numbers: a host stream's call (x3) refused for
 * a quota (2 ops in flight) at the first daemon while x1 and x2 wait there
 * for the second daemon's rank, and x4, made on a second stream once x1
 * finished and left room. x4 must not take x3's number (the other rank's
 * x3 would be matched with it: every element wrong): the daemon refuses
 * it until x3 comes again, libccs counts both among the calls to repeat,
 * and repeated they get every element. */
#define QCOUNT 1000
static int quota_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  ccs_stream_t s[2];
  int64_t *x, one = 1;
  if (ccs_comm_init_rank(&comm, n, sh->id[0], rank) != CCS_OK || ccs_stream_create(&s[0]) != CCS_OK ||
      ccs_stream_create(&s[1]) != CCS_OK || ccs_mem_alloc((void **)&x, 4 * QCOUNT * sizeof(int64_t)) != CCS_OK ||
      ccs_all_reduce(&one, &one, 1, CCS_INT64, CCS_SUM, comm, NULL) != CCS_OK || one != n)
    return 10;
  for (int j = 0; j < 4; j++)
    for (size_t i = 0; i < QCOUNT; i++) x[j * QCOUNT + i] = value(rank, j, i);
  int bad = 0;
  if (rank == 1) {
    while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
    for (int j = 0; j < 4 && !bad; j++)
      bad = ccs_all_reduce(&x[j * QCOUNT], &x[j * QCOUNT], QCOUNT, CCS_INT64, CCS_SUM, comm, NULL) != CCS_OK;
  } else {
    ccs_result_t rc[4];
    for (int j = 0; j < 3; j++)
      rc[j] = ccs_all_reduce(&x[j * QCOUNT], &x[j * QCOUNT], QCOUNT, CCS_INT64, CCS_SUM, comm, s[0]);
    __atomic_store_n(&sh->hold, 0, __ATOMIC_SEQ_CST);
    for (double until = test_now() + 30;; usleep(2000)) { /* x1 finished here: room for one */
      Ccs__StatsReply *st = raw_stats(node[0].socket);
      int room = st->ops_in_flight <= 1;
      free(st);
      if (room) break;
      if (test_now() > until) return 11;
    }
    rc[3] = ccs_all_reduce(&x[3 * QCOUNT], &x[3 * QCOUNT], QCOUNT, CCS_INT64, CCS_SUM, comm, s[1]);
    for (int j = 0; j < 4; j++) bad |= rc[j] != CCS_OK;
    ccs_result_t got[2] = {ccs_stream_synchronize(s[0]), ccs_stream_synchronize(s[1])};
    int repeat[2] = {-1, -1};
    for (int k = 0; k < 2; k++) {
      if (got[k] != CCS_ERR_RETRY || ccs_stream_repeat_count(s[k], &repeat[k]) != CCS_OK || repeat[k] != 1) bad = 1;
      if (bad) fprintf(stderr, "rank 0 stream %d: %s, repeat %d\n", k, ccs_result_name(got[k]), repeat[k]);
    }
    for (int j = 2; j < 4 && !bad; j++) { /* x3, then x4: their inputs as they were (refused: untouched) */
      for (size_t i = 0; i < QCOUNT; i++) x[j * QCOUNT + i] = value(rank, j, i);
      bad = ccs_all_reduce(&x[j * QCOUNT], &x[j * QCOUNT], QCOUNT, CCS_INT64, CCS_SUM, comm, s[j - 2]) != CCS_OK;
    }
    bad = bad || ccs_stream_synchronize(s[0]) != CCS_OK || ccs_stream_synchronize(s[1]) != CCS_OK;
    sh->retried[rank] = 2;
  }
  if (bad) fprintf(stderr, "rank %d: %s\n", rank, ccs_comm_last_error(comm));
  for (int j = 0; j < 4 && !bad; j++) bad = check("x", rank, j, &x[j * QCOUNT], QCOUNT, sum_of, n);
  ccs_stream_destroy(s[0]);
  ccs_stream_destroy(s[1]);
  ccs_mem_free(x);
  bad |= ccs_comm_destroy(comm) != CCS_OK;
  return bad;
}

static void test_nodes_quota_refused(void **state) {
  (void)state;
  fresh_round(1);
  sh->hold = 1;
  node0_quota_ops = "2";
  start_nodes(NULL, 0, "30");
  node0_quota_ops = NULL;
  pid_t ranks = fork();
  if (ranks == 0) _exit(test_run_ranks(2, quota_rank, NULL, 60, NULL));
  int status; /* (rank 0 lets rank 1 go) */
  assert_int_equal(waitpid(ranks, &status, 0), ranks);
  stop_nodes();
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(sh->retried[0], 2);
}

/* The second daemon dies as an op starts there (the first one's part under
 * way): in place on registered memory every rank repeats it; staged, it
 * runs again; a send or a receive across the daemons is made again under
 * its number. */
static void test_nodes_started(void **state) {
  (void)state;
  run_nodes(3, 4, "started:6", 0, 1, 0); /* round 4: in place */
  run_nodes(2, 4, "started:7", 0, 0, 1); /* round 5: staged */
  /* round 3, a ring of sends across the daemons: its receive starts, or
   * its send while its receive is under way. A message whose send finished
   * at the first daemon but which the second had not taken was lost with
   * it: the comm fails, saying so; a send or receive still under way at
   * the first daemon is made again */
  sh->may_fail = 1;
  run_nodes(3, 4, "started:4", 0, 0, 0);
  run_nodes(2, 4, "started:5", 0, 0, 1);
  sh->may_fail = 0;
}

/* A receive kept at the first daemon: rank 0 waits for rank 1's message
 * (rank 1, on the second daemon, has not sent it) when the second daemon
 * is killed; once it is back rank 1 sends, and the receive, made again
 * under its number, gets it; messages both ways and a collective after. */
/* 2 ranks: comm id[0] joined, a buffer of COUNT, and a collective first,
 * checked (a send or receive across daemons that then waits is no
 * collective gone slow: its daemon says nothing of it to the others).
 * NULL when any of it failed. */
static int64_t *joined_two(ccs_comm_t **comm, int rank) {
  if (ccs_comm_init_rank(comm, 2, sh->id[0], rank) != CCS_OK) return NULL;
  int64_t *buf = malloc(sizeof(int64_t) * COUNT), one = rank;
  if (buf && ccs_all_reduce(&one, &one, 1, CCS_INT64, CCS_SUM, *comm, NULL) == CCS_OK && one == 1) return buf;
  free(buf);
  ccs_comm_destroy(*comm);
  return NULL;
}

static int receiving_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  int64_t *buf = joined_two(&comm, rank);
  if (!buf) return 10;
  __atomic_add_fetch(&sh->at_hold, 1, __ATOMIC_SEQ_CST); /* joined: no collective under way */
  int bad = 0;
  for (int round = 0; round < 4 && !bad; round++) {
    int from = round % 2 ? 0 : 1, to = 1 - from;
    if (round == 0 && rank == 1)
      while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
    ccs_result_t rc = CCS_OK;
    if (rank == from) {
      for (size_t i = 0; i < COUNT; i++) buf[i] = value(from, round, i);
      rc = ccs_send(buf, COUNT, CCS_INT64, to, comm, NULL);
    } else {
      rc = ccs_recv(buf, COUNT, CCS_INT64, from, comm, NULL);
      ring_from = from;
      bad |= rc == CCS_OK && check("receive", rank, round, buf, COUNT, from_prev, n);
    }
    if (rc != CCS_OK) fprintf(stderr, "rank %d round %d: %s: %s\n", rank, round, ccs_result_name(rc), ccs_comm_last_error(comm));
    bad |= rc != CCS_OK;
  }
  for (size_t i = 0; i < COUNT && !bad; i++) buf[i] = value(rank, 9, i);
  if (!bad && ccs_all_reduce(buf, buf, COUNT, CCS_INT64, CCS_SUM, comm, NULL) != CCS_OK) bad = 1;
  bad = bad || check("all_reduce", rank, 9, buf, COUNT, sum_of, n);
  free(buf);
  ccs_comm_destroy(comm);
  return bad;
}

static void test_nodes_receive_kept(void **state) {
  (void)state;
  sh->seed = test_seed();
  start_nodes(NULL, 0, "30");
  sh->hold = 1;
  sh->at_hold = 0;
  pid_t ranks = fork();
  if (ranks == 0) _exit(test_run_ranks(2, receiving_rank, NULL, 60, NULL));
  wait_at_hold(2); /* the first all_reduce done at both: the call under way is rank 0's receive */
  wait_for_call(&node[0]);
  usleep(20000); /* its receive launched */
  test_daemon_kill(&node[1]);
  usleep(100000);
  assert_int_equal(start_node(1, 1, "30"), 0);
  release_and_wait(ranks);
}

/* A rank that destroys the comm while a rank at another daemon calls a
 * collective with it: the daemon there takes the closed connections for a
 * restart and holds the comm, but the first daemon, asked, says its ranks
 * destroyed it: the call fails at once saying so, not after
 * peer_restart_grace (30 s here; the ranks have 25). *arg: the rank
 * leaves while the second daemon is down (sh->hold 1; the other rank
 * calls once it is back, at 0): the call fails naming the rank that did
 * not rejoin, at the end of the rejoin window (the first daemon no longer
 * holds the comm), rather than wait for it. */
static int leaving_rank(int rank, int n, void *arg) {
  (void)n;
  int meanwhile = *(const int *)arg;
  ccs_comm_t *comm;
  int64_t *buf = joined_two(&comm, rank);
  if (!buf) return 10;
  __atomic_add_fetch(&sh->at_hold, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST) > 1 - rank) usleep(1000);
  int bad = 0;
  if (rank == 0) {
    bad = ccs_comm_destroy(comm) != CCS_OK;
    __atomic_add_fetch(&sh->at_hold2, 1, __ATOMIC_SEQ_CST);
  } else {
    wait_at(&sh->at_hold2, 1);
    for (size_t i = 0; i < COUNT; i++) buf[i] = value(rank, 0, i);
    ccs_result_t rc = ccs_all_reduce(buf, buf, COUNT, CCS_INT64, CCS_SUM, comm, NULL);
    const char *why = ccs_comm_last_error(comm);
    if (meanwhile ? rc == CCS_OK || !strstr(why, "rank(s) 0 did not rejoin")
                  : rc != CCS_ERR_PEER_LOST || !strstr(why, "rank(s) 0, at the daemon at ") ||
                        !strstr(why, "destroyed the communicator")) {
      fprintf(stderr, "rank 1: %s: %s\n", ccs_result_name(rc), why);
      bad = 1;
    }
    ccs_comm_destroy(comm);
  }
  free(buf);
  return bad;
}

static void test_nodes_peer_destroyed(void **state) {
  (void)state;
  for (int meanwhile = 0; meanwhile < 2; meanwhile++) {
    sh->at_hold = sh->at_hold2 = 0;
    sh->hold = meanwhile ? 2 : 0;
    start_nodes(NULL, 0, "30");
    pid_t ranks = fork();
    if (ranks == 0) _exit(test_run_ranks(2, leaving_rank, &meanwhile, 25, NULL));
    if (meanwhile) {
      wait_at_hold(2);
      test_daemon_kill(&node[1]);
      usleep(100000); /* the first daemon holds the comm */
      __atomic_store_n(&sh->hold, 1, __ATOMIC_SEQ_CST);
      wait_at(&sh->at_hold2, 1);
      assert_int_equal(start_node(1, 1, "30"), 0);
    }
    release_and_wait(ranks);
  }
}

/* Stopped (SIGTERM) after the first daemon finished ops that the second had
 * not run: rank 0's broadcast and its send to rank 1 need nothing back, so
 * they finished at the first daemon while rank 1 had not called yet. The
 * second daemon takes what was sent before it goes (rank 1 calls while it
 * drains); stopped at once, it would lose them and the comm with them.
 * Rank 1's all_reduce, which rank 0 has not called, waits for the
 * restarted daemon; a send the other way after it. */
static int owed_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  int64_t *buf = joined_two(&comm, rank);
  if (!buf) return 10;
  if (rank == 1)
    while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
  const char *what = "broadcast";
  for (size_t i = 0; i < COUNT; i++) buf[i] = rank == 0 ? value(0, 0, i) : -1;
  ccs_result_t rc = ccs_broadcast(buf, buf, COUNT, CCS_INT64, 0, comm, NULL);
  ring_from = 0;
  int bad = rc != CCS_OK || check(what, rank, 0, buf, COUNT, from_prev, n);
  for (size_t i = 0; i < COUNT && !bad; i++) buf[i] = rank == 0 ? value(0, 1, i) : -1;
  if (!bad) {
    what = rank == 0 ? "send" : "receive";
    rc = rank == 0 ? ccs_send(buf, COUNT, CCS_INT64, 1, comm, NULL) : ccs_recv(buf, COUNT, CCS_INT64, 0, comm, NULL);
    bad = rc != CCS_OK || (rank == 1 && check(what, rank, 1, buf, COUNT, from_prev, n));
  }
  if (rank == 0) { /* its next call waits for the restarted daemon */
    __atomic_store_n(&sh->at_hold, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&sh->hold_first, __ATOMIC_SEQ_CST)) usleep(1000);
  }
  for (size_t i = 0; i < COUNT && !bad; i++) buf[i] = value(rank, 2, i);
  if (!bad) {
    what = "all_reduce";
    rc = ccs_all_reduce(buf, buf, COUNT, CCS_INT64, CCS_SUM, comm, NULL);
    bad = rc != CCS_OK || check(what, rank, 2, buf, COUNT, sum_of, n);
  }
  if (!bad) { /* the other way, after the restart */
    what = "send back";
    for (size_t i = 0; i < COUNT; i++) buf[i] = rank == 1 ? value(1, 3, i) : -1;
    rc = rank == 1 ? ccs_send(buf, COUNT, CCS_INT64, 0, comm, NULL) : ccs_recv(buf, COUNT, CCS_INT64, 1, comm, NULL);
    ring_from = 1;
    bad = rc != CCS_OK || (rank == 0 && check(what, rank, 3, buf, COUNT, from_prev, n));
  }
  if (bad) fprintf(stderr, "rank %d %s: %s: %s\n", rank, what, ccs_result_name(rc), ccs_comm_last_error(comm));
  free(buf);
  ccs_comm_destroy(comm);
  return bad;
}

static void test_nodes_stop_owed(void **state) {
  (void)state;
  fresh_round(0);
  sh->hold_first = 1;
  start_nodes(NULL, 0, "30");
  pid_t ranks = fork();
  if (ranks == 0) _exit(test_run_ranks(2, owed_rank, NULL, 60, NULL));
  double until = test_now() + 30;
  while (!__atomic_load_n(&sh->at_hold, __ATOMIC_SEQ_CST) && test_now() < until) usleep(2000);
  usleep(20000); /* what rank 0 sent is at the second daemon */
  kill(node[1].pid, SIGTERM);
  usleep(5000);
  __atomic_store_n(&sh->hold, 0, __ATOMIC_SEQ_CST); /* rank 1 calls while its daemon drains */
  assert_int_equal(test_daemon_term(&node[1]), 0);
  assert_int_equal(start_node(1, 1, "30"), 0);
  __atomic_store_n(&sh->hold_first, 0, __ATOMIC_SEQ_CST);
  release_and_wait(ranks);
}

/* Messages that ranks of the second daemon sent before it went, whose
 * receivers at the first had not asked for them: the first daemon holds
 * them (they arrived whole, the connections closed after them) and hands
 * them to the receives made after the restart. Each rank of the second
 * daemon (odd) sends two to the rank before it, one small and one of
 * several chunks, then the daemon is stopped (SIGTERM) or killed; the
 * receivers ask once it is back, then every rank all_reduces and the
 * messages go the other way. */
#define AHEAD_BIG (3 * COUNT) /* int64s: 2.4 MB, chunks on every connection of the pair */
static int sent_ahead_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  int64_t *buf = malloc(sizeof(int64_t) * AHEAD_BIG), one = 1;
  if (!buf || ccs_comm_init_rank(&comm, n, sh->id[0], rank) != CCS_OK) return 10;
  ccs_result_t rc = ccs_all_reduce(&one, &one, 1, CCS_INT64, CCS_SUM, comm, NULL);
  int bad = rc != CCS_OK || one != n, peer = rank % 2 ? rank - 1 : rank + 1;
  const char *what = "all_reduce";
  static const size_t sizes[2] = {7, AHEAD_BIG};
  if (rank % 2) {
    for (int m = 0; m < 2 && !bad; m++) {
      what = "send";
      for (size_t i = 0; i < sizes[m]; i++) buf[i] = value(rank, m, i);
      bad = (rc = ccs_send(buf, sizes[m], CCS_INT64, peer, comm, NULL)) != CCS_OK;
    }
    __atomic_add_fetch(&sh->at_hold, 1, __ATOMIC_SEQ_CST);
  }
  while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
  if (rank % 2 == 0 && peer < n)
    for (int m = 0; m < 2 && !bad; m++) {
      what = "receive";
      for (size_t i = 0; i < sizes[m]; i++) buf[i] = -1;
      rc = ccs_recv(buf, sizes[m], CCS_INT64, peer, comm, NULL);
      ring_from = peer;
      bad = rc != CCS_OK || check(what, rank, m, buf, sizes[m], from_prev, n);
    }
  for (size_t i = 0; i < COUNT && !bad; i++) buf[i] = value(rank, 2, i);
  if (!bad) {
    what = "all_reduce after";
    rc = ccs_all_reduce(buf, buf, COUNT, CCS_INT64, CCS_SUM, comm, NULL);
    bad = rc != CCS_OK || check(what, rank, 2, buf, COUNT, sum_of, n);
  }
  if (!bad && peer < n) { /* the other way */
    what = rank % 2 ? "receive back" : "send back";
    for (size_t i = 0; i < COUNT; i++) buf[i] = rank % 2 ? -1 : value(rank, 3, i);
    rc = rank % 2 ? ccs_recv(buf, COUNT, CCS_INT64, peer, comm, NULL) : ccs_send(buf, COUNT, CCS_INT64, peer, comm, NULL);
    ring_from = peer;
    bad = rc != CCS_OK || (rank % 2 && check(what, rank, 3, buf, COUNT, from_prev, n));
  }
  if (bad) fprintf(stderr, "rank %d %s: %s: %s\n", rank, what, ccs_result_name(rc), ccs_comm_last_error(comm));
  free(buf);
  ccs_comm_destroy(comm);
  return bad;
}

static void test_nodes_sent_ahead(void **state) {
  (void)state;
  static const int ranks_of_run[] = {2, 5, 3};
  for (int run = 0; run < 5; run++) {
    /* the last run: killed again once back, the messages still carried */
    int n = ranks_of_run[run / 2], term = run % 2, deaths = run == 4 ? 2 : 1;
    fresh_round(0);
    start_nodes(NULL, run % 2, "30");
    pid_t ranks = fork();
    if (ranks == 0) _exit(test_run_ranks(n, sent_ahead_rank, NULL, 60, NULL));
    double until = test_now() + 30;
    while (__atomic_load_n(&sh->at_hold, __ATOMIC_SEQ_CST) < n / 2 && test_now() < until) usleep(1000);
    usleep(50000); /* what they sent is at the first daemon */
    for (int death = 0; death < deaths; death++) {
      if (death) usleep(1500000); /* its ranks back, the comm going on */
      if (term) assert_int_equal(test_daemon_term(&node[1]), 0);
      else test_daemon_kill(&node[1]);
      assert_int_equal(start_node(1, 1, "30"), 0);
    }
    fprintf(stderr, "# %d ranks, messages sent ahead, the second daemon %s %s\n", n, term ? "stopped" : "killed",
            deaths > 1 ? "twice" : "once");
    release_and_wait(ranks);
  }
}

/* Killed (kill -9) as it matched a call that the first daemon had
 * finished: rank 0's broadcast, the reduce to rank 1 of the first
 * daemon's ranks, or rank 0's send to rank 1, needs nothing back from the
 * second daemon, so it finished at the first while rank 1 had not called
 * yet, and what was sent was lost with the second. The first daemon kept
 * it (within peer_replay_bytes, at its default) and sends it again to the restarted one; rank 1's
 * call, made again there, gets every element. Then an all_reduce of every
 * rank. */
enum { REPLAYED_BROADCAST, REPLAYED_REDUCE, REPLAYED_SEND, REPLAYED_IN_PLACE };
#define REPLAYED_COUNT 8000 /* int64s: within the default peer_replay_bytes */
static int replayed_rank(int rank, int n, void *arg) {
  int kind = *(const int *)arg;
  ccs_comm_t *comm;
  int64_t *buf = malloc(sizeof(int64_t) * REPLAYED_COUNT), *out = malloc(sizeof(int64_t) * REPLAYED_COUNT), one = 1;
  if (!buf || !out || ccs_comm_init_rank(&comm, n, sh->id[0], rank) != CCS_OK) return 10;
  ccs_result_t rc = ccs_all_reduce(&one, &one, 1, CCS_INT64, CCS_SUM, comm, NULL); /* launch 1 */
  int bad = rc != CCS_OK || one != n;
  if (rank == 1)
    while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
  const char *what = kind == REPLAYED_REDUCE ? "reduce" : kind == REPLAYED_SEND ? "send" : "broadcast";
  for (size_t i = 0; i < REPLAYED_COUNT; i++) buf[i] = value(rank, 0, i), out[i] = -1;
  ring_from = 0;
  if (!bad && kind == REPLAYED_IN_PLACE) { /* in place on registered memory */
    int64_t *reg;
    if (ccs_mem_alloc((void **)&reg, sizeof(int64_t) * REPLAYED_COUNT) != CCS_OK) return 11;
    for (size_t i = 0; i < REPLAYED_COUNT; i++) reg[i] = value(rank, 0, i);
    what = "reduce in place";
    rc = ccs_reduce(reg, reg, REPLAYED_COUNT, CCS_INT64, CCS_SUM, 1, comm, NULL);
    bad = rc != CCS_OK || (rank == 1 && check(what, rank, 0, reg, REPLAYED_COUNT, sum_of, n));
    ccs_mem_free(reg);
  } else if (!bad && kind == REPLAYED_REDUCE) {
    rc = ccs_reduce(buf, out, REPLAYED_COUNT, CCS_INT64, CCS_SUM, 1, comm, NULL);
    bad = rc != CCS_OK || (rank == 1 && check(what, rank, 0, out, REPLAYED_COUNT, sum_of, n));
  } else if (!bad && kind == REPLAYED_SEND && rank < 2) {
    rc = rank == 0 ? ccs_send(buf, REPLAYED_COUNT, CCS_INT64, 1, comm, NULL) : ccs_recv(out, REPLAYED_COUNT, CCS_INT64, 0, comm, NULL);
    bad = rc != CCS_OK || (rank == 1 && check(what, rank, 0, out, REPLAYED_COUNT, from_prev, n));
  } else if (!bad && kind == REPLAYED_BROADCAST) {
    rc = ccs_broadcast(buf, out, REPLAYED_COUNT, CCS_INT64, 0, comm, NULL);
    bad = rc != CCS_OK || check(what, rank, 0, out, REPLAYED_COUNT, from_prev, n);
  }
  if (rank == 0) __atomic_store_n(&sh->hold, 0, __ATOMIC_SEQ_CST); /* done here: rank 1 calls */
  for (size_t i = 0; i < REPLAYED_COUNT && !bad; i++) buf[i] = value(rank, 1, i);
  if (!bad) {
    what = "all_reduce";
    rc = ccs_all_reduce(buf, out, REPLAYED_COUNT, CCS_INT64, CCS_SUM, comm, NULL);
    bad = rc != CCS_OK || check(what, rank, 1, out, REPLAYED_COUNT, sum_of, n);
  }
  /* (sh->may_fail: the comm may fail instead, at every rank, saying why) */
  if (rc != CCS_OK && sh->may_fail && strstr(ccs_comm_last_error(comm), "cannot be rejoined"))
    sh->failed[rank] = 1, bad = 0;
  if (bad) fprintf(stderr, "rank %d %s: %s: %s\n", rank, what, ccs_result_name(rc), ccs_comm_last_error(comm));
  free(buf), free(out);
  ccs_comm_destroy(comm);
  return bad;
}

/* replayed_rank's ranks (3 for a reduce, 2 else) while the second daemon
 * dies at `failpoint` and is started again, dying at `again` too (NULL:
 * not) and started once more; then the ranks go on. */
static void replayed_run(int kind, const char *failpoint, const char *again) {
  fresh_round(1);
  sh->hold = 1;
  start_nodes(failpoint, 0, "30");
  pid_t ranks = fork();
  if (ranks == 0)
    _exit(test_run_ranks(kind == REPLAYED_REDUCE || kind == REPLAYED_IN_PLACE ? 3 : 2, replayed_rank, &kind, 60, NULL));
  failpoint_reached(&node[1]);
  if (again) setenv("CCSD_FAILPOINT", again, 1);
  assert_int_equal(start_node(1, 1, "30"), 0);
  unsetenv("CCSD_FAILPOINT");
  if (again) {
    failpoint_reached(&node[1]);
    assert_int_equal(start_node(1, 1, "30"), 0);
  }
  release_and_wait(ranks);
}

static void test_nodes_replayed(void **state) {
  (void)state;
  for (int kind = REPLAYED_BROADCAST; kind <= REPLAYED_SEND; kind++)
    replayed_run(kind, "launch:2", NULL); /* the second daemon dies as it matches rank 1's call */
}

/* The same, the second daemon killed again as its comm rejoined (its
 * ranks told their verdicts, the first daemon not yet): the first still
 * holds the comm, which rejoins once more, and the messages go again. */
static void test_nodes_replayed_twice(void **state) {
  (void)state;
  for (int kind = REPLAYED_BROADCAST; kind <= REPLAYED_SEND; kind++) replayed_run(kind, "launch:2", "rejoined:1");
}

/* The same for the reduce in place on registered memory, the second
 * daemon killed once rank 1's call started there (its buffer, input and
 * output, may be written from then on; test_started has it written):
 * rank 1's libccs kept a copy of its input (64,000 bytes, within
 * CCS_KEEP_INPUT_BYTES), so the call can run again there while the first
 * daemon's ranks finished it, and every element is right. Without the
 * copy (CCS_KEEP_INPUT_BYTES=0) it cannot: the comm fails at every rank,
 * saying so. */
static void test_nodes_replayed_in_place(void **state) {
  (void)state;
  for (int keep = 0; keep < 2; keep++) {
    sh->may_fail = !keep;
    if (!keep) setenv("CCS_KEEP_INPUT_BYTES", "0", 1);
    replayed_run(REPLAYED_IN_PLACE, "started:2", NULL);
    unsetenv("CCS_KEEP_INPUT_BYTES");
    fprintf(stderr, "# in place, CCS_KEEP_INPUT_BYTES %s: %s\n", keep ? "default" : "0",
            sh->failed[0] ? "the comm failed" : "every element right");
    assert_int_equal(sh->failed[0] + sh->failed[1] + sh->failed[2], keep ? 0 : 3);
  }
  sh->may_fail = 0;
}

/* The same across daemons (3 ranks: 0 and 2 on the first, 1 on the
 * second): the root's daemon goes, its rank's init cut short and the
 * other's failing (the root lost, then refusing connections until it is
 * back); or the other daemon goes, the root failing the comm. */
static int first_again(void) { return start_node(0, 1, grace_again); }

static void test_nodes_init_cut_short(void **state) {
  (void)state;
  for (int victim = 0; victim < 2; victim++)
    for (int term = 0; term < 2; term++) {
      fresh_round(0);
      start_nodes(NULL, 0, "30");
      forming(3, node, 2, &node[victim], term, victim ? second_again : first_again);
      stop_nodes();
    }
  /* where no daemon holds a comm for another (an init sent again is a
   * first init there), killed */
  grace_again = "0";
  for (int victim = 0; victim < 2; victim++) {
    fresh_round(0);
    start_nodes(NULL, 0, "0");
    forming(3, node, 2, &node[victim], 0, victim ? second_again : first_again);
    stop_nodes();
  }
  grace_again = "30";
}

/* Both daemons go together (a cluster's daemons restarted at once),
 * killed or stopped while rank 0 waits alone, the ids from either: none
 * holds the comms, so each is made again through its root from every
 * rank's report (refound.c), and every kind of call goes on, sends and
 * receives across the daemons among them, every element right. */
static int both_again(void) { return start_node(0, 1, "30") || start_node(1, 1, "30"); }

/* Three daemons (rank r on daemon r % 3) crash together while rank 0
 * waits; the first two come back, the second one's rank rejoins and its
 * report reaches the root, and the second crashes again before the third
 * is back: the root lets that rank go and takes it again when it comes
 * back through its daemon once more, and the comms are made again. */
static int cut_short_again(void) {
  test_daemon_kill(&node[2]);
  if (start_node(0, 1, "30") || start_node(1, 1, "30")) return -1;
  usleep(3500000); /* its rank's rejoin, 2.5 s alone, then sent to the root */
  test_daemon_kill(&node[1]);
  usleep(300000);
  return start_node(1, 1, "30") || start_node(2, 1, "30");
}

static void test_nodes_all_restart_cut_short(void **state) {
  (void)state;
  nnodes = 3;
  fresh_round(0);
  start_nodes(NULL, 0, "30");
  const struct where cut = {&node[1], &node[0], cut_short_again,
                            "three daemons together, the second again as its rank came back: ", &node[0]};
  run_at(&cut, stop_nodes, 3, 4, NULL, 0, 0);
  nnodes = 2;
}

/* The same across daemons: the second one (ranks 1 and 3) goes as it
 * answers the first comm's inits, which the first daemon completed (it
 * holds the comm), and the second comm's inits as they form; alone, or
 * with the first daemon crashing at once (the comm made again through
 * its root, refound.c), with the ids from either. */
static void test_nodes_init_answered_to_some(void **state) {
  (void)state;
  for (int root = 0; root < 2; root++) {
    run_nodes(4, 4, "answer:1", 0, 0, root); /* none of its ranks answered */
    run_nodes(4, 4, "answer:2", 0, 0, root); /* rank 1 answered, rank 3 not */
    fresh_round(1);
    start_nodes("answer:2", root, "30");
    const struct where both = {&node[1], &node[0], both_again, root ? "both daemons, ids from the second: "
                                                                    : "both daemons, ids from the first: ",
                               &node[0]};
    run_at(&both, stop_nodes, 4, 4, "answer:2", 0, 0);
  }
}

/* Both comms made again through their root at each daemon, none held. */
static void through_root(void) {
  for (int k = 0; k < 2; k++) {
    assert_events(&node[k], "rejoined_through_root", 2);
    assert_events(&node[k], "held", 0);
    assert_events(&node[k], "failed", 0);
  }
}

static void test_nodes_all_restart(void **state) {
  (void)state;
  for (int term = 0; term < 2; term++)
    for (int root = 0; root < 2; root++) {
      fresh_round(0);
      start_nodes(NULL, root, "30");
      const struct where both = {&node[1], &node[0], both_again,
                                 root ? "both daemons together, ids from the second: "
                                      : "both daemons together, ids from the first: ",
                                 &node[0], through_root};
      run_at(&both, stop_nodes, 3, 4, NULL, term, 0);
    }
}

/* Two daemons stopped a moment apart: the second one's ranks rejoin it
 * from the first one's word (rank 3 held back, so that it cannot settle
 * yet), and the first one goes too before it settles. No daemon holds the
 * comms then: they are made again through their root, as when both go
 * together. */
static int apart_term;
static int apart_again(void) {
  if (sh->pid[3] <= 0) return -1; /* (kill(0) would stop this process group) */
  kill(sh->pid[3], SIGSTOP);
  int rc = start_node(1, 1, "30");
  if (!rc) rc = wait_restart_events(&node[1], "holder_heard", 2); /* rank 1 back there, the first daemon's word taken */
  if (!rc && apart_term) rc = test_daemon_term(&node[0]);
  else if (!rc) test_daemon_kill(&node[0]);
  if (!rc) rc = start_node(0, 1, "30");
  usleep(500000);
  kill(sh->pid[3], SIGCONT); /* (whatever happened: not left stopped) */
  return rc;
}

/* The second daemon lost the first one's word on both comms, not yet
 * settled, and both daemons made them again through their root. */
static void apart_through_root(void) {
  assert_events(&node[1], "holder_lost", 2);
  through_root();
}

static void test_nodes_apart(void **state) {
  (void)state;
  for (int term = 0; term < 2; term++)
    for (int root = 0; root < 2; root++) {
      apart_term = term;
      fresh_round(0);
      start_nodes(NULL, root, "30");
      const struct where apart = {&node[1], &node[0], apart_again,
                                  root ? "a moment apart, ids from the second: "
                                       : "a moment apart, ids from the first: ",
                                  NULL, apart_through_root};
      run_at(&apart, stop_nodes, 4, 4, NULL, term, 0);
    }
}

/* Three daemons (rank r on daemon r % 3): the second one restarts, its
 * rank 4 held back (SIGSTOP) so that it cannot settle, and rank 1 rejoins
 * from the others' word; then the third is stopped (SIGSTOP) and the first
 * (the root) killed for good. The second daemon lets their word go. Once
 * the third one's peer_restart_grace (3 s) has passed it is let go on: its
 * hold ends before it asks again, and it fails the comm. That failure must
 * reach the second daemon's ranks as it is, from a daemon whose word was
 * let go: not be refused there as from one of no part in the comm, leaving
 * them to wait out their rejoin and time out. The root's ranks are told
 * their daemon is gone. */
static int holder_fails_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  int64_t v = rank + 1, out = -1;
  sh->pid[rank] = getpid();
  if (ccs_comm_init_rank(&comm, n, sh->id[0], rank) != CCS_OK) return 10;
  int bad = ccs_all_reduce(&v, &out, 1, CCS_INT64, CCS_SUM, comm, NULL) != CCS_OK || out != n * (n + 1) / 2;
  __atomic_add_fetch(&sh->at_hold, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
  out = -1;
  ccs_result_t rc = ccs_all_reduce(&v, &out, 1, CCS_INT64, CCS_SUM, comm, NULL);
  const char *why = ccs_comm_last_error(comm);
  /* (rank 4 comes back after the comm failed there and was let go: told why) */
  int ok = rank % 3 == 0 ? rc == CCS_ERR_DAEMON_UNAVAILABLE /* its daemon never came back */
                         : rc != CCS_OK && strstr(why, "did not come back within 3 s");
  if (bad || !ok) fprintf(stderr, "rank %d: %s (%s)\n", rank, ccs_result_name(rc), why);
  ccs_comm_destroy(comm);
  return bad || !ok || out != -1;
}

static void test_nodes_holder_fails(void **state) {
  (void)state;
  nnodes = 3;
  fresh_round(0);
  start_nodes(NULL, 0, "30");
  assert_int_equal(test_daemon_term(&node[2]), 0);
  assert_int_equal(start_node(2, 1, "3"), 0); /* the third: a grace of 3 s */
  setenv("CCS_RECONNECT_TIMEOUT", "3", 1);
  pid_t ranks = fork();
  if (ranks == 0) _exit(test_run_ranks(5, holder_fails_rank, NULL, 60, NULL));
  unsetenv("CCS_RECONNECT_TIMEOUT");
  wait_at_hold(5);
  int stopped = sh->pid[4] > 0 && kill(sh->pid[4], SIGSTOP) == 0;
  test_daemon_kill(&node[1]);
  int rc = start_node(1, 1, "30");
  if (!rc) rc = wait_restart_events(&node[1], "holder_heard", 2); /* rank 1 back there, the others' word taken */
  int third = node[2].pid > 0 && kill(node[2].pid, SIGSTOP) == 0;
  test_daemon_kill(&node[0]);
  usleep(2500000); /* the third's grace passes while it is stopped */
  if (third) kill(node[2].pid, SIGCONT);
  usleep(1000000);
  if (stopped) kill(sh->pid[4], SIGCONT);
  usleep(500000);
  __atomic_store_n(&sh->hold, 0, __ATOMIC_SEQ_CST);
  int status;
  assert_int_equal(waitpid(ranks, &status, 0), ranks);
  assert_true(stopped && third);
  assert_int_equal(rc, 0);
  assert_int_equal(wait_restart_events(&node[1], "failed", 1), 0);
  assert_events(&node[1], "failed", 1);
  assert_events(&node[1], "holder_lost", 1);
  stop_nodes();
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* The second daemon does not come back: the first one's ranks get
 * CCS_ERR_PEER_LOST once peer_restart_grace passed, saying so. */
static int deserted_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm = init_counted(rank, n);
  if (!comm) return 10;
  int64_t v = rank, out;
  if (rank == 1)
    while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
  ccs_result_t rc = ccs_all_reduce(&v, &out, 1, CCS_INT64, CCS_SUM, comm, NULL);
  int ok = rank == 1 ? rc != CCS_OK
                     : rc == CCS_ERR_PEER_LOST && strstr(ccs_comm_last_error(comm), "peer_restart_grace");
  if (!ok) fprintf(stderr, "rank %d: %s (%s)\n", rank, ccs_result_name(rc), ccs_comm_last_error(comm));
  ccs_comm_destroy(comm);
  return !ok;
}

static void test_nodes_not_back(void **state) {
  (void)state;
  start_nodes(NULL, 0, "1");
  sh->hold = 1;
  sh->at_hold = 0;
  setenv("CCS_RECONNECT_TIMEOUT", "1", 1);
  pid_t ranks = fork();
  if (ranks == 0) _exit(test_run_ranks(2, deserted_rank, NULL, 60, NULL));
  unsetenv("CCS_RECONNECT_TIMEOUT");
  wait_at_hold(2);
  wait_for_call(&node[0]);
  test_daemon_kill(&node[1]);
  usleep(2500000); /* the grace passes */
  release_and_wait(ranks);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_waiting, setup, teardown),
      cmocka_unit_test_setup_teardown(test_matched, setup, teardown),
      cmocka_unit_test_setup_teardown(test_started, setup, teardown),
      cmocka_unit_test_setup_teardown(test_partly_written, setup, teardown),
      cmocka_unit_test_setup_teardown(test_answered_to_some, setup, teardown),
      cmocka_unit_test_setup_teardown(test_host_stream, setup, teardown),
      cmocka_unit_test_setup_teardown(test_init_answered_to_some, setup, teardown),
      cmocka_unit_test_setup_teardown(test_parts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_killed_before_resubmit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_host_stream_late_second, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_not_back, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ids_after_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_init_cut_short, setup, teardown),
      cmocka_unit_test_setup_teardown(test_host_stream_lost, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_waiting, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_started, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_host_stream, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_two_streams, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_quota_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_receive_kept, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_peer_destroyed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_stop_owed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_replayed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_replayed_in_place, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_replayed_twice, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_sent_ahead, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_not_back, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_init_cut_short, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_all_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_apart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_holder_fails, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_init_answered_to_some, setup, teardown),
      cmocka_unit_test_setup_teardown(test_nodes_all_restart_cut_short, setup, teardown),
  };
  TEST_ONLY_FROM_ENV();
  return cmocka_run_group_tests(tests, NULL, NULL);
}
