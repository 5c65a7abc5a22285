/* Tenants and faults (docs/guarantees.md): each test is one row of the
 * table. Every row checks that the right clients get the right error within
 * its bound, that the daemon then serves everyone else with correct results,
 * and that it holds no more file descriptors, sessions, comms, buffers,
 * registered bytes or ops than before the row. Runs as root: some clients
 * switch to uid 65534 (nobody) to be another tenant. */
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "raw.h"
#include "serving.h"

#define OP_TIMEOUT_S 2.0
#define IO_TIMEOUT_S 1.0

enum { MAX_WINDOWS = 1024, MAX_MEASURED = 4096 };
struct shared {
  ccs_unique_id_t id;
  double t_event; /* when a rank did the thing the others react to */
  pid_t culprit;  /* the rank the others' errors must name */
  int left;       /* ranks still waiting for their error */
  /* the tenant flood: each flooding rank's rounds (a group of large ops:
   * submitted, answered), and the measuring tenant's ops (called,
   * answered) */
  double flood_sent[MAX_WINDOWS][2], flood_done[MAX_WINDOWS][2];
  int flood_rounds, measuring_done;
  double op_called[MAX_MEASURED], op_done[MAX_MEASURED];
  int nmeasured;
};
static struct shared *sh;
static struct test_daemon dmn;
static struct test_daemon_state clean;

static void assert_clean(void) { test_daemon_assert_clean(&dmn, &clean); }

static double rank_plus_i_mod_5(int rank, size_t i) { return rank + (int)(i % 5); }

/* Still serving: a fresh comm of 2 ranks, of each tenant, gets a correct sum. */
static void assert_serving(void) {
  static const struct test_sum sum = {CCS_FLOAT32, 100000, rank_plus_i_mod_5};
  for (int other = 0; other < 2; other++) {
    if (other) test_other_tenant_id(&sh->id);
    else test_new_id(&sh->id);
    assert_int_equal(test_run_sum(2, &sh->id, &sum, other, 60), 0);
  }
}

static int setup(void **state) {
  const char *args[] = {"--socket-mode", "0666", "--op-timeout", "2", "--io-timeout", "1",
                        "--init-timeout", "3", NULL};
  sh = test_shared_new(sizeof(*sh));
  return sh ? test_daemon_start_clean(&dmn, args, &sh->id, &clean) : -1;
}

static int teardown(void **state) { return test_daemon_stop(&dmn); }

/* --- row: a rank stopped (SIGSTOP) in the middle: the others time out --- */
#define RANK_TIMEOUT_S 1.5
/* The deadline runs from the daemon's arrival of the first call (after
 * t0 here) and is read from the same monotonic clock, in whole
 * milliseconds, possibly its coarse variant: never more than a few ms
 * early. */
#define EARLY_MARGIN_S 0.025

static int stopped_rank(int rank, int n, void *arg) {
  ccs_comm_t *comm;
  setenv("CCS_TIMEOUT", "1.5", 1); /* the comm's own deadline, under the daemon's 2 s */
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 10;
  if (rank == n - 1) {
    sh->culprit = getpid();
    raise(SIGSTOP); /* killed when the others have their answer */
    return 0;
  }
  int v = 1, out;
  double t0 = test_now();
  ccs_result_t rc = ccs_all_reduce(&v, &out, 1, CCS_INT32, CCS_SUM, comm, NULL);
  double waited = test_now() - t0;
  const char *err = ccs_comm_last_error(comm);
  char want[96];
  snprintf(want, sizeof(want), "rank %d (pid %d) has not called all_reduce #1; rank(s) 0,1 waited 1.5 s",
           n - 1, (int)sh->culprit);
  int ok = rc == CCS_ERR_TIMEOUT && strstr(err, want) && waited >= RANK_TIMEOUT_S - EARLY_MARGIN_S &&
           waited < RANK_TIMEOUT_S + 3;
  if (!ok) fprintf(stderr, "rank %d after %.3f s: %s: %s\n", rank, waited, ccs_result_name(rc), err);
  ccs_comm_destroy(comm);
  /* the last to finish ends the stopped rank: a sibling not yet reaped
   * (test_run_ranks waits for it), so its pid is still its own */
  if (__atomic_sub_fetch(&sh->left, 1, __ATOMIC_SEQ_CST) == 0) kill(sh->culprit, SIGKILL);
  return !ok;
}

static void test_stopped_rank_times_out(void **state) {
  test_new_id(&sh->id);
  sh->culprit = 0;
  sh->left = 2;
  int st[3];
  test_run_ranks(3, stopped_rank, NULL, 30, st);
  assert_int_equal(st[0], 0);
  assert_int_equal(st[1], 0);
  assert_int_equal(st[2], 128 + SIGKILL);
  assert_serving();
  assert_clean();
}

/* --- row: ccs_comm_abort while the other ranks are blocked --- */
static int aborting_rank(int rank, int n, void *arg) {
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 10;
  if (rank == n - 1) {
    sh->culprit = getpid();
    if (raw_wait_ops_in_flight(dmn.socket, (uint64_t)n - 1, 20)) return 11;
    sh->t_event = test_now();
    return ccs_comm_abort(comm) != CCS_OK;
  }
  float x[64] = {0}, y[64];
  memset(y, 0x5a, sizeof(y));
  ccs_result_t rc = ccs_all_reduce(x, y, 64, CCS_FLOAT32, CCS_SUM, comm, NULL);
  double late = test_now() - sh->t_event;
  const char *err = ccs_comm_last_error(comm);
  char want[64];
  snprintf(want, sizeof(want), "rank %d (pid %d) aborted the communicator", n - 1, (int)sh->culprit);
  int untouched = 1; /* an aborted op delivers nothing */
  for (size_t i = 0; i < sizeof(y); i++) untouched &= ((unsigned char *)y)[i] == 0x5a;
  int ok = rc == CCS_ERR_ABORTED && strstr(err, want) && late < 2.0 && untouched;
  if (!ok) fprintf(stderr, "rank %d %.2f s after the abort: %s: %s\n", rank, late, ccs_result_name(rc), err);
  ccs_result_t async;
  ok = ok && ccs_comm_get_async_error(comm, &async) == CCS_OK && async == CCS_ERR_ABORTED;
  ccs_comm_destroy(comm);
  return !ok;
}

static void test_abort_while_blocked(void **state) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(3, aborting_rank, NULL, 30, NULL), 0);
  assert_serving();
  assert_clean();
}

/* --- row: another uid presents the unique id, or names a buffer --- */
static int mixed_uid_rank(int rank, int n, void *arg) {
  ccs_comm_t *comm;
  if (rank == 1) test_become_other_tenant();
  ccs_result_t rc = ccs_comm_init_rank(&comm, n, sh->id, rank);
  const char *err = ccs_comm_last_error(NULL);
  if (rank == 1) return !(rc == CCS_ERR_PERMISSION && strstr(err, "another user"));
  return rc != CCS_ERR_TIMEOUT; /* the rank that never joined is named at the deadline */
}

/* An all_reduce of 1024 float32 from this connection's own buffer (when
 * own is not 0) or from buffer itself, into buffer; the daemon's answer. */
static ccs_result_t raw_all_reduce_on(int fd, uint64_t comm, uint64_t own, uint64_t buffer) {
  Ccs__BufRef from = CCS__BUF_REF__INIT, into = CCS__BUF_REF__INIT;
  from.buffer = own ? own : buffer;
  into.buffer = buffer;
  from.length = into.length = 4096;
  raw_send_all_reduce_into(fd, 6, comm, &from, &into, 1024);
  Ccs__Reply *r = raw_reply(fd);
  ccs_result_t rc = (ccs_result_t)r->status;
  ccs__reply__free_unpacked(r, NULL);
  return rc;
}

/* Another connection registers its own buffer of 0x11 bytes and names the
 * victim's as its op's output: refused. */
static int steals_into(uint64_t victim) {
  int fd = raw_connect(dmn.socket);
  raw_hello(fd);
  int mfd = raw_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW);
  memset(raw_map(mfd, 4096), 0x11, 4096);
  uint64_t own = 0;
  ccs_result_t reg = raw_register(fd, mfd, &own);
  close(mfd);
  uint64_t comm = raw_comm_of_one(fd);
  int refused = reg == CCS_OK && raw_all_reduce_on(fd, comm, own, victim) == CCS_ERR_PERMISSION &&
                raw_all_reduce_on(fd, comm, victim, own) == CCS_ERR_PERMISSION; /* nor read from it */
  close(fd);
  return refused;
}

static void test_other_uid_isolated(void **state) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(2, mixed_uid_rank, NULL, 30, NULL), 0);
  /* a buffer is private to the connection that registered it */
  int owner = raw_connect(dmn.socket);
  raw_hello(owner);
  uint64_t buf = 0;
  int mfd = raw_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW);
  unsigned char *bytes = raw_map(mfd, 4096);
  memset(bytes, 0x5a, 4096);
  assert_int_equal(raw_register(owner, mfd, &buf), CCS_OK);
  close(mfd);
  assert_int_equal(raw_all_reduce_on(owner, raw_comm_of_one(owner), 0, buf), CCS_OK);
  assert_true(steals_into(buf)); /* the same uid, another connection */
  pid_t p = fork();
  if (p == 0) {
    test_become_other_tenant();
    _exit(!steals_into(buf));
  }
  int st;
  waitpid(p, &st, 0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  /* no effect: the owner's bytes are as it left them */
  for (size_t i = 0; i < 4096; i++)
    if (bytes[i] != 0x5a) fail_msg("the victim's buffer was written at byte %zu: 0x%02x", i, bytes[i]);
  munmap(bytes, 4096);
  close(owner);
  assert_serving();
  assert_clean();
}

/* --- row: memfds the client could still shrink --- */
static void test_unsealed_memfds(void **state) {
  int fd = raw_connect(dmn.socket);
  raw_hello(fd);
  static const int seals[] = {0, F_SEAL_GROW, F_SEAL_SHRINK};
  for (int i = 0; i < 3; i++) {
    int mfd = raw_memfd(8192, seals[i]);
    assert_int_equal(raw_register(fd, mfd, NULL), CCS_ERR_INVALID_ARGUMENT);
    close(mfd);
  }
  close(fd);
  assert_serving();
  assert_clean();
}

/* --- row: 250 file descriptors in one message --- */
static void test_fd_flood(void **state) {
  int fd = raw_connect(dmn.socket);
  raw_hello(fd);
  int fds[250];
  for (int i = 0; i < 250; i++) fds[i] = STDERR_FILENO;
  struct frame f = frame_mem_register(8);
  raw_send(fd, f.data, f.len, fds, 250);
  free(f.data);
  raw_expect(fd, CCS_ERR_PROTOCOL);
  raw_expect_closed(fd);
  assert_serving();
  assert_clean();
}

/* --- row: slow clients: half a frame, no hello, never reading --- */
static void expect_closed_within(int fd, double seconds) {
  double t0 = test_now();
  char buf[65536];
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    assert_true(poll(&p, 1, (int)(seconds * 1000)) == 1);
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    assert_true(test_now() - t0 < seconds);
  }
  assert_true(test_now() - t0 < seconds);
  close(fd);
}

static void test_slow_clients(void **state) {
  int half = raw_connect(dmn.socket);
  raw_hello(half);
  uint8_t partial[2] = {40, 0};
  raw_send(half, partial, 2, NULL, 0);
  int silent = raw_connect(dmn.socket);
  int deaf = raw_connect(dmn.socket);
  raw_hello(deaf);
  assert_serving(); /* everyone else is served meanwhile */
  double bound = IO_TIMEOUT_S * 1.25 + 3; /* the deadline plus the housekeeping period */
  expect_closed_within(half, bound);
  expect_closed_within(silent, bound);
  /* requests whose replies it never reads: the daemon stops reading it,
   * then closes it, so the sends end in a broken pipe, not a hang */
  struct frame f = frame_get_unique_id(0);
  struct timeval tv = {(time_t)bound + 5, 0};
  setsockopt(deaf, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  double t0 = test_now();
  ssize_t n = 0;
  for (int i = 0; i < 1000000 && n >= 0; i++) n = send(deaf, f.data, f.len, MSG_NOSIGNAL);
  free(f.data);
  assert_true(n < 0 && (errno == EPIPE || errno == ECONNRESET));
  assert_true(test_now() - t0 < bound + 2);
  close(deaf);
  assert_clean();
}

/* --- row: one tenant floods the executor, another's ops take turns with it ---
 * The flooding tenant submits rounds of 8 large all_reduce at once (a
 * group); while a round is in the executor (both of its ranks submitted,
 * neither answered yet) the other tenant's ops, each submitted after the
 * round and small (one task), must complete: tenants take turns task by
 * task. Run first-come first-served, none of them could complete inside a
 * round (each would wait for the round's 8 ops); here they must complete
 * several times as many as there were rounds. Counted, not timed. */
#define MEASURED_OPS 120
#define TURNS_PER_ROUND 2 /* at least this many of the other's ops complete inside each round, on average */

static int flooding_rank(int rank, int n, const ccs_unique_id_t *id) {
  test_become_other_tenant();
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, *id, rank) != CCS_OK) return 1;
  size_t count = 16 << 20; /* 64 MiB: 256 tasks an op */
  float *x;
  if (ccs_mem_alloc((void **)&x, count * sizeof(float)) != CCS_OK) return 1;
  memset(x, 0, count * sizeof(float));
  for (int round = 0, go = 1; go && round < MAX_WINDOWS; round++) {
    ccs_group_start();
    for (int i = 0; i < 8; i++) ccs_all_reduce(x, x, count, CCS_FLOAT32, CCS_SUM, comm, NULL);
    sh->flood_sent[round][rank] = test_now();
    if (ccs_group_end() != CCS_OK) return 1;
    sh->flood_done[round][rank] = test_now();
    if (rank == 0) __atomic_store_n(&sh->flood_rounds, round + 1, __ATOMIC_SEQ_CST);
    /* the ranks agree on when to stop: rank 0 decides */
    int more = rank == 0 ? !__atomic_load_n(&sh->measuring_done, __ATOMIC_SEQ_CST) : 0, agreed;
    if (ccs_all_reduce(&more, &agreed, 1, CCS_INT32, CCS_MAX, comm, NULL) != CCS_OK) return 1;
    go = agreed;
  }
  ccs_mem_free(x);
  ccs_comm_destroy(comm);
  return 0;
}

static int measuring_rank(int rank, int n, const ccs_unique_id_t *id) {
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, *id, rank) != CCS_OK) return 1;
  /* the flood is under way: a round of it has been answered */
  for (double end = test_now() + 60; !__atomic_load_n(&sh->flood_rounds, __ATOMIC_SEQ_CST);) {
    if (test_now() > end) return 3; /* the flood never got going */
    usleep(1000);
  }
  size_t count = 65536; /* 256 KiB: one task, on the executor (past inline_bytes) */
  /* one element more: rank 0's word on whether to go on (the ranks must
   * agree on how many ops): until MEASURED_OPS ops and 3 whole rounds of
   * the flood, however fast turns make its ops */
  float *x = malloc((count + 1) * sizeof(float)), *y = malloc((count + 1) * sizeof(float));
  int bad = 0, start = __atomic_load_n(&sh->flood_rounds, __ATOMIC_SEQ_CST);
  for (int k = 0, more = 1; more && k < MAX_MEASURED && !bad; k++) {
    for (size_t i = 0; i < count; i++) x[i] = (float)(rank * 3 + k + (int)(i % 7));
    x[count] = rank == 0 && (k + 1 < MEASURED_OPS ||
                             __atomic_load_n(&sh->flood_rounds, __ATOMIC_SEQ_CST) < start + 4);
    double called = test_now();
    if (ccs_all_reduce(x, y, count + 1, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK) bad = 1;
    double done = test_now();
    for (size_t i = 0; i < count && !bad; i++)
      if (y[i] != (float)(3 + 2 * k + 2 * (int)(i % 7))) bad = 2;
    more = y[count] != 0;
    if (rank == 0) {
      sh->op_called[k] = called, sh->op_done[k] = done;
      sh->nmeasured = k + 1;
    }
  }
  if (rank == 0) __atomic_store_n(&sh->measuring_done, 1, __ATOMIC_SEQ_CST);
  free(x);
  free(y);
  ccs_comm_destroy(comm);
  return bad;
}

struct two_jobs {
  ccs_unique_id_t flood_id, measure_id;
};

static int both_jobs(int rank, int n, void *arg) {
  struct two_jobs *j = arg;
  if (rank < 2) return flooding_rank(rank, 2, &j->flood_id);
  return measuring_rank(rank - 2, 2, &j->measure_id);
}

static void test_flood_takes_turns(void **state) {
  struct two_jobs j;
  test_other_tenant_id(&sh->id);
  j.flood_id = sh->id;
  test_new_id(&sh->id);
  j.measure_id = sh->id;
  sh->flood_rounds = sh->measuring_done = sh->nmeasured = 0;
  assert_int_equal(test_run_ranks(4, both_jobs, &j, 120, NULL), 0);
  /* rounds while the other tenant measured: both flooding ranks had
   * submitted (the round's ops were in the executor) and neither had its
   * answer yet */
  int rounds = 0, inside = 0;
  double first = sh->op_called[0], last = sh->op_done[sh->nmeasured - 1];
  for (int r = 0; r < sh->flood_rounds; r++) {
    double from = fmax(sh->flood_sent[r][0], sh->flood_sent[r][1]);
    double to = fmin(sh->flood_done[r][0], sh->flood_done[r][1]);
    if (from < first || to > last) continue;
    rounds++;
    for (int k = 0; k < sh->nmeasured; k++) inside += sh->op_called[k] >= from && sh->op_done[k] <= to;
  }
  fprintf(stderr, "# %d of the other tenant's ops completed inside %d rounds of the flood (%d measured)\n",
          inside, rounds, sh->nmeasured);
  assert_true(rounds >= 2);
  assert_true(inside >= TURNS_PER_ROUND * rounds);
  assert_serving();
  assert_clean();
}

/* --- row: quota exhaustion, and allow-lists (daemons of their own) --- */

/* A client of this uid and gid (no other groups) asks the daemon at
 * CCS_SOCKET for an id: 0 when served, 1 when refused as not allowed, 2
 * otherwise. */
static int connects_as(uid_t uid, gid_t gid) {
  pid_t p = fork();
  if (p == 0) {
    if (setgroups(0, NULL) || setgid(gid) || setuid(uid)) _exit(3);
    ccs_unique_id_t id;
    ccs_result_t rc = ccs_get_unique_id(&id);
    _exit(rc == CCS_OK ? 0 : rc == CCS_ERR_PERMISSION && strstr(ccs_comm_last_error(NULL), "not allowed") ? 1 : 2);
  }
  int st;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
static int quota_client(void *socket_path) {
  ccs_unique_id_t id;
  ccs_comm_t *c[3];
  int fails = 0;
#define CHECK(cond) do { if (!(cond)) { fails++; fprintf(stderr, "quota client: %s: %s\n", #cond, ccs_comm_last_error(NULL)); } } while (0)
  for (int i = 0; i < 2; i++) {
    if (ccs_get_unique_id(&id) || ccs_comm_init_rank(&c[i], 1, id, 0)) return 50;
  }
  if (ccs_get_unique_id(&id)) return 51;
  ccs_result_t rc = ccs_comm_init_rank(&c[2], 1, id, 0);
  CHECK(rc == CCS_ERR_QUOTA && strstr(ccs_comm_last_error(NULL), "communicators"));
  ccs_comm_destroy(c[1]); /* a freed comm makes room again, once the daemon let it go */
  for (double end = test_now() + 10; test_now() < end; usleep(1000)) {
    Ccs__StatsReply *st = raw_stats((const char *)socket_path);
    int freed = st->comms == 1;
    free(st);
    if (freed) break;
  }
  CHECK(ccs_get_unique_id(&id) == CCS_OK && ccs_comm_init_rank(&c[1], 1, id, 0) == CCS_OK);
  /* registered bytes: 4 MiB fit, 8 more do not, and are not counted */
  void *a, *b = NULL;
  CHECK(ccs_mem_alloc(&a, 4 << 20) == CCS_OK);
  CHECK(ccs_mem_alloc(&b, 8 << 20) == CCS_ERR_QUOTA);
  CHECK(strstr(ccs_comm_last_error(NULL), "registered") != NULL);
  Ccs__StatsReply *held = raw_stats((const char *)socket_path);
  CHECK(held->registered_bytes == 4 << 20 && held->buffers == 1);
  free(held);
  ccs_mem_free(a);
  /* ops in flight: a group of 4 is fine, 5 is not, and has no effect:
   * nothing written, nothing left in flight, the next op runs */
  int v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, w[8];
  ccs_group_start();
  for (int i = 0; i < 4; i++) ccs_all_reduce(&v[i], &w[i], 1, CCS_INT32, CCS_SUM, c[0], NULL);
  CHECK(ccs_group_end() == CCS_OK);
  CHECK(w[0] == 1 && w[3] == 4);
  for (int i = 0; i < 8; i++) w[i] = -7;
  ccs_group_start();
  for (int i = 0; i < 5; i++) ccs_all_reduce(&v[i], &w[i], 1, CCS_INT32, CCS_SUM, c[0], NULL);
  CHECK(ccs_group_end() == CCS_ERR_QUOTA);
  CHECK(strstr(ccs_comm_last_error(c[0]), "ops") != NULL);
  for (int i = 0; i < 8; i++) CHECK(w[i] == -7);
  Ccs__StatsReply *st = raw_stats((const char *)socket_path);
  CHECK(st->ops_in_flight == 0);
  free(st);
  rc = ccs_all_reduce(&v[7], w, 1, CCS_INT32, CCS_SUM, c[0], NULL);
  CHECK(rc == CCS_OK && w[0] == 8);
  if (rc) fprintf(stderr, "quota client: %s: %s\n", ccs_result_name(rc), ccs_comm_last_error(c[0]));
  ccs_comm_destroy(c[0]);
  ccs_comm_destroy(c[1]);
  if (fails) fprintf(stderr, "quota client: %d checks failed\n", fails);
  return fails;
}

static void test_quotas(void **state) {
  struct test_daemon q;
  const char *args[] = {"--socket-mode", "0666", "--quota-comms", "2", "--quota-registered-bytes",
                        "8388608", "--quota-connections", "3", "--quota-ops", "4", NULL};
  assert_int_equal(test_daemon_start(&q, args), 0);
  pid_t p = fork();
  if (p == 0) _exit(quota_client(q.socket));
  int st;
  waitpid(p, &st, 0);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  /* connections: three are fine, the fourth is told why and closed */
  int fds[3];
  for (int i = 0; i < 3; i++) {
    fds[i] = raw_connect(q.socket);
    raw_hello(fds[i]);
  }
  int over = raw_connect(q.socket);
  raw_expect(over, CCS_ERR_QUOTA);
  raw_expect_closed(over);
  /* the other tenant is not affected by this one's use */
  p = fork();
  if (p == 0) {
    test_become_other_tenant();
    ccs_unique_id_t id;
    ccs_comm_t *c;
    _exit(ccs_get_unique_id(&id) || ccs_comm_init_rank(&c, 1, id, 0) || ccs_comm_destroy(c));
  }
  waitpid(p, &st, 0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  for (int i = 0; i < 3; i++) close(fds[i]);
  assert_int_equal(test_daemon_stop(&q), 0);
  /* an allow-list on top of the socket's mode: only root may connect */
  const char *allow[] = {"--socket-mode", "0666", "--allow-uids", "0", NULL};
  assert_int_equal(test_daemon_start(&q, allow), 0);
  assert_int_equal(connects_as(TEST_OTHER_UID, TEST_OTHER_UID), 1);
  assert_int_equal(connects_as(0, TEST_OTHER_UID), 0); /* the uid decides */
  assert_int_equal(test_daemon_stop(&q), 0);
  /* by group: its gid is let in, whatever its uid; root's is not */
  char gid[16];
  snprintf(gid, sizeof(gid), "%d", TEST_OTHER_UID);
  const char *allow_gid[] = {"--socket-mode", "0666", "--allow-gids", gid, NULL};
  assert_int_equal(test_daemon_start(&q, allow_gid), 0);
  assert_int_equal(connects_as(TEST_OTHER_UID, TEST_OTHER_UID), 0);
  assert_int_equal(connects_as(0, TEST_OTHER_UID), 0);
  assert_int_equal(connects_as(TEST_OTHER_UID, 0), 1); /* the gid decides, not the uid */
  assert_int_equal(connects_as(0, 0), 1);
  assert_int_equal(test_daemon_stop(&q), 0);
  setenv("CCS_SOCKET", dmn.socket, 1);
  assert_serving();
  assert_clean();
}

int main(void) {
  if (geteuid() != 0) {
    fprintf(stderr, "test_safety needs root (it switches clients to uid %d)\n", TEST_OTHER_UID);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stopped_rank_times_out),
      cmocka_unit_test(test_abort_while_blocked),
      cmocka_unit_test(test_other_uid_isolated),
      cmocka_unit_test(test_unsealed_memfds),
      cmocka_unit_test(test_fd_flood),
      cmocka_unit_test(test_slow_clients),
      cmocka_unit_test(test_flood_takes_turns),
      cmocka_unit_test(test_quotas),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
