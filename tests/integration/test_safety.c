/* Tenants and faults (docs/guarantees.md): each test is one row of the
 * table. Every row checks that the right clients get the right error within
 * its bound, that the daemon then serves everyone else with correct results,
 * and that it holds no more file descriptors, sessions, comms, buffers,
 * registered bytes or ops than before the row. Runs as root: some clients
 * switch to uid 65534 (nobody) to be another tenant. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

struct shared {
  ccs_unique_id_t id;
  double t_event; /* when a rank did the thing the others react to */
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
static int stopped_rank(int rank, int n, void *arg) {
  ccs_comm_t *comm;
  setenv("CCS_TIMEOUT", "1.5", 1); /* the comm's own deadline, under the daemon's 2 s */
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 10;
  if (rank == n - 1) {
    if (fork() == 0) { /* the stopped rank's reaper */
      sleep(6);
      kill(getppid(), SIGKILL);
      _exit(0);
    }
    raise(SIGSTOP);
    return 0;
  }
  int v = 1, out;
  double t0 = test_now();
  ccs_result_t rc = ccs_all_reduce(&v, &out, 1, CCS_INT32, CCS_SUM, comm, NULL);
  double waited = test_now() - t0;
  const char *err = ccs_comm_last_error(comm);
  char want[64];
  snprintf(want, sizeof(want), "rank %d (pid", n - 1);
  int ok = rc == CCS_ERR_TIMEOUT && strstr(err, want) && strstr(err, "has not called all_reduce #1") &&
           waited >= 1.4 && waited < 1.5 + 3;
  if (!ok) fprintf(stderr, "rank %d after %.1f s: %s: %s\n", rank, waited, ccs_result_name(rc), err);
  ccs_comm_destroy(comm);
  return !ok;
}

static void test_stopped_rank_times_out(void **state) {
  test_new_id(&sh->id);
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
    usleep(300000);
    sh->t_event = test_now();
    return ccs_comm_abort(comm) != CCS_OK;
  }
  float x[64] = {0}, y[64];
  ccs_result_t rc = ccs_all_reduce(x, y, 64, CCS_FLOAT32, CCS_SUM, comm, NULL);
  double late = test_now() - sh->t_event;
  const char *err = ccs_comm_last_error(comm);
  int ok = rc == CCS_ERR_ABORTED && strstr(err, "aborted") && late < 2.0;
  if (!ok) fprintf(stderr, "rank %d %.2f s after the abort: %s: %s\n", rank, late, ccs_result_name(rc), err);
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

static ccs_result_t raw_all_reduce_on(int fd, uint64_t comm, uint64_t buffer) {
  Ccs__BufRef ref = CCS__BUF_REF__INIT;
  ref.buffer = buffer;
  ref.length = 4096;
  raw_send_all_reduce(fd, 6, comm, &ref, 1024);
  Ccs__Reply *r = raw_reply(fd);
  ccs_result_t rc = (ccs_result_t)r->status;
  ccs__reply__free_unpacked(r, NULL);
  return rc;
}

static void test_other_uid_isolated(void **state) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(2, mixed_uid_rank, NULL, 30, NULL), 0);
  /* a buffer is private to the connection that registered it */
  int owner = raw_connect(dmn.socket);
  raw_hello(owner);
  uint64_t buf = 0;
  int mfd = raw_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW);
  assert_int_equal(raw_register(owner, mfd, &buf), CCS_OK);
  close(mfd);
  assert_int_equal(raw_all_reduce_on(owner, raw_comm_of_one(owner), buf), CCS_OK);
  int same_uid = raw_connect(dmn.socket);
  raw_hello(same_uid);
  assert_int_equal(raw_all_reduce_on(same_uid, raw_comm_of_one(same_uid), buf), CCS_ERR_PERMISSION);
  close(same_uid);
  pid_t p = fork();
  if (p == 0) {
    test_become_other_tenant();
    int fd = raw_connect(dmn.socket);
    raw_hello(fd);
    _exit(raw_all_reduce_on(fd, raw_comm_of_one(fd), buf) != CCS_ERR_PERMISSION);
  }
  int st;
  waitpid(p, &st, 0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
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

/* --- row: one tenant floods, another's all_reduce still completes --- */
static int flooding_rank(int rank, int n, const ccs_unique_id_t *id) {
  test_become_other_tenant();
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, *id, rank) != CCS_OK) return 1;
  size_t count = 4 << 20;
  float *x;
  if (ccs_mem_alloc((void **)&x, count * sizeof(float)) != CCS_OK) return 1;
  memset(x, 0, count * sizeof(float));
  double until = test_now() + 4;
  int rounds = 0, go = 1;
  while (go) { /* ranks agree on when to stop: rank 0 decides */
    ccs_group_start();
    for (int i = 0; i < 8; i++) ccs_all_reduce(x, x, count, CCS_FLOAT32, CCS_SUM, comm, NULL);
    if (ccs_group_end() != CCS_OK) return 1;
    int more = rank == 0 ? test_now() < until : 0, agreed;
    if (ccs_all_reduce(&more, &agreed, 1, CCS_INT32, CCS_MAX, comm, NULL) != CCS_OK) return 1;
    go = agreed;
    rounds++;
  }
  ccs_mem_free(x);
  ccs_comm_destroy(comm);
  return 0;
}

static int measuring_rank(int rank, int n, const ccs_unique_id_t *id) {
  usleep(500000); /* the flood is under way */
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, *id, rank) != CCS_OK) return 1;
  size_t count = 65536;
  float *x = malloc(count * sizeof(float)), *y = malloc(count * sizeof(float));
  double worst = 0;
  for (int round = 0; round < 20; round++) {
    for (size_t i = 0; i < count; i++) x[i] = (float)(rank * 3 + round + (int)(i % 7));
    double t0 = test_now();
    if (ccs_all_reduce(x, y, count, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK) return 1;
    double t = test_now() - t0;
    worst = t > worst ? t : worst;
    for (size_t i = 0; i < count; i++)
      if (y[i] != (float)(3 + 2 * round + 2 * (int)(i % 7))) return 2;
  }
  if (rank == 0) fprintf(stderr, "# slowest 256 KiB all_reduce during the flood: %.1f ms\n", worst * 1e3);
  free(x);
  free(y);
  ccs_comm_destroy(comm);
  return 0;
}

struct two_jobs {
  ccs_unique_id_t flood_id, measure_id;
};

static int both_jobs(int rank, int n, void *arg) {
  struct two_jobs *j = arg;
  if (rank < 2) return flooding_rank(rank, 2, &j->flood_id);
  return measuring_rank(rank - 2, 2, &j->measure_id);
}

static void test_flood_does_not_starve(void **state) {
  struct two_jobs j;
  test_other_tenant_id(&sh->id);
  j.flood_id = sh->id;
  test_new_id(&sh->id);
  j.measure_id = sh->id;
  assert_int_equal(test_run_ranks(4, both_jobs, &j, 120, NULL), 0);
  assert_clean();
}

/* --- row: quota exhaustion, and an allow-list (daemons of their own) --- */
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
  ccs_comm_destroy(c[1]); /* a freed comm makes room again */
  usleep(100000);
  CHECK(ccs_get_unique_id(&id) == CCS_OK && ccs_comm_init_rank(&c[1], 1, id, 0) == CCS_OK);
  /* registered bytes: 4 MiB fit, 8 more do not */
  void *a, *b;
  CHECK(ccs_mem_alloc(&a, 4 << 20) == CCS_OK);
  CHECK(ccs_mem_alloc(&b, 8 << 20) == CCS_ERR_QUOTA);
  ccs_mem_free(a);
  /* ops in flight: a group of 4 is fine, 5 is not (and has no effect) */
  int v[8] = {0}, w[8];
  ccs_group_start();
  for (int i = 0; i < 4; i++) ccs_all_reduce(&v[i], &w[i], 1, CCS_INT32, CCS_SUM, c[0], NULL);
  CHECK(ccs_group_end() == CCS_OK);
  ccs_group_start();
  for (int i = 0; i < 5; i++) ccs_all_reduce(&v[i], &w[i], 1, CCS_INT32, CCS_SUM, c[0], NULL);
  CHECK(ccs_group_end() == CCS_ERR_QUOTA);
  rc = ccs_all_reduce(v, w, 1, CCS_INT32, CCS_SUM, c[0], NULL);
  CHECK(rc == CCS_OK);
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
  p = fork();
  if (p == 0) {
    test_become_other_tenant();
    ccs_unique_id_t id;
    ccs_result_t rc = ccs_get_unique_id(&id);
    _exit(!(rc == CCS_ERR_PERMISSION && strstr(ccs_comm_last_error(NULL), "not allowed")));
  }
  waitpid(p, &st, 0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  ccs_unique_id_t id;
  assert_int_equal(ccs_get_unique_id(&id), CCS_OK);
  assert_int_equal(test_daemon_stop(&q), 0);
  setenv("CCS_SOCKET", dmn.socket, 1);
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
      cmocka_unit_test(test_flood_does_not_starve),
      cmocka_unit_test(test_quotas),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
