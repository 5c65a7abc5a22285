/* Faults across daemons: three daemons (on loopback ports, or each in its
 * own network namespace under tests/support/run_netns.sh), one rank on
 * each, all_reduce in a loop. A daemon killed with SIGKILL or stopped
 * with SIGTERM, and a daemon cut off (its link down in namespaces; stopped with SIGSTOP on loopback,
 * which silences it the same way), must make the other ranks fail with
 * CCS_ERR_PEER_LOST naming the lost daemon and its rank within a bound, and
 * the surviving daemons must serve new communicators. Junk on the daemons'
 * port is dropped without disturbing them; ranks of different nodes that
 * pass different counts, types or reductions are told so (never a result). */
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "raw.h"
#include "serving.h"

#define ND 3
#define MAXR 12
#define BOUND_S 10.0 /* PEER_LOST within this of the fault */

/* Ranks per daemon (CCS_TEST_RANKS_PER_DAEMON, default 1): every fault is
 * also run with several ranks on each daemon, rank r on daemon r % ND. */
static int per = 1;
#define NR (ND * per)

struct shared {
  ccs_unique_id_t id;
  double fault_at;
  double failed_at[MAXR];
  int code[MAXR];
  char text[MAXR][512];
};
static struct shared *sh;
static struct test_daemon dm[ND];
static const char *const daemon_args[] = {"--heartbeat", "0.2", "--peer_timeout", "1.5",
                                          "--init-timeout", "10", "--io-timeout", "1", NULL};

static int setup(void **state) {
  (void)state;
  const char *p = getenv("CCS_TEST_RANKS_PER_DAEMON");
  per = p && atoi(p) > 0 && atoi(p) <= MAXR / ND ? atoi(p) : 1;
  sh = test_shared_new(sizeof(*sh));
  if (!sh || test_daemons_start(dm, ND, daemon_args)) return -1;
  test_spread_ranks(dm, ND);
  return ccs_get_unique_id(&sh->id) == CCS_OK ? 0 : -1; /* from daemon 0 */
}

/* Every daemon still running must stop cleanly: a daemon that crashes or
 * reports a race (ThreadSanitizer exits 66) as it stops fails the test. */
static int teardown(void **state) {
  (void)state;
  int failed = 0;
  for (int i = 0; i < ND; i++) {
    if (dm[i].pid <= 0) continue; /* killed by the test */
    kill(dm[i].pid, SIGCONT);
    int rc = test_daemon_stop(&dm[i]);
    if (rc != 0) fprintf(stderr, "daemon %d exited with status %d\n", i, rc);
    failed |= rc != 0;
  }
  test_shared_free(sh, sizeof(*sh));
  return failed ? -1 : 0;
}

/* all_reduce of 1 MiB until something fails; what failed is recorded */
static int looping_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 2;
  enum { COUNT = 1 << 18 };
  float *buf = malloc(COUNT * sizeof(float));
  ccs_result_t rc = CCS_OK;
  for (int i = 0; i < COUNT; i++) buf[i] = 1;
  double end = test_now() + 60;
  while (rc == CCS_OK && test_now() < end) rc = ccs_all_reduce(buf, buf, COUNT, CCS_FLOAT32, CCS_MAX, comm, NULL);
  sh->failed_at[rank] = test_now();
  sh->code[rank] = rc;
  snprintf(sh->text[rank], sizeof(sh->text[rank]), "%s", ccs_comm_last_error(comm));
  ccs_comm_destroy(comm);
  free(buf);
  return 0;
}

/* A fresh comm over daemons 0 and 1: one checked all_reduce. */
static void survivors_serve(void) {
  test_spread_ranks(dm, 2);
  test_new_id(&sh->id);
  assert_int_equal(test_run_sum(2, &sh->id, &test_sum_one_int, 0, 60), 0);
  test_spread_ranks(dm, ND);
}

/* The other ranks got PEER_LOST, in time, naming daemon 2's rank(s). */
static void expect_lost(const char *how) {
  for (int r = 0; r < NR; r++) {
    if (r % ND == 2) continue;
    fprintf(stderr, "# %s: rank %d: %s after %.2f s: %s\n", how, r, ccs_result_name(sh->code[r]),
            sh->failed_at[r] - sh->fault_at, sh->text[r]);
    assert_int_equal(sh->code[r], CCS_ERR_PEER_LOST);
    assert_true(sh->failed_at[r] - sh->fault_at < BOUND_S);
    assert_non_null(strstr(sh->text[r], "rank(s) 2"));
  }
}

/* In a child: wait, then do the fault; the parent runs the ranks. */
static pid_t fault_later(void (*fault)(void)) {
  pid_t pid = fork();
  if (pid == 0) {
    usleep(1500 * 1000);
    sh->fault_at = test_now();
    fault();
    _exit(0);
  }
  return pid;
}

static void kill_daemon_2(void) { kill(dm[2].pid, SIGKILL); }

static void test_daemon_killed(void **state) {
  (void)state;
  pid_t helper = fault_later(kill_daemon_2);
  test_run_ranks(NR, looping_rank, NULL, 120, NULL);
  waitpid(helper, NULL, 0);
  expect_lost("daemon killed");
  test_daemon_kill(&dm[2]);
  survivors_serve();
}

static void stop_daemon_2(void) { kill(dm[2].pid, SIGTERM); }

/* A daemon stopped (systemctl stop) mid-collective: the same for the
 * others, and it exits cleanly with its ops' network tasks unsent. */
static void test_daemon_stopped(void **state) {
  (void)state;
  pid_t helper = fault_later(stop_daemon_2);
  test_run_ranks(NR, looping_rank, NULL, 120, NULL);
  waitpid(helper, NULL, 0);
  expect_lost("daemon stopped");
  assert_int_equal(test_daemon_stop(&dm[2]), 0);
  survivors_serve();
}

static void cut_daemon_2(void) {
  const char *link = getenv("CCS_TEST_NETNS_LINK");
  char cmd[128];
  if (link && *link) {
    snprintf(cmd, sizeof(cmd), "/usr/sbin/ip link set %s2 down", link);
    if (system(cmd) != 0) fprintf(stderr, "# '%s' failed\n", cmd);
  } else {
    kill(dm[2].pid, SIGSTOP); /* silent, its sockets open: what a dead link looks like */
  }
}

static void test_daemon_cut_off(void **state) {
  (void)state;
  pid_t helper = fault_later(cut_daemon_2);
  /* rank 2 waits on its silenced daemon: it is let go below */
  pid_t ranks = fork();
  if (ranks == 0) _exit(test_run_ranks(NR, looping_rank, NULL, 120, NULL) > 1);
  waitpid(helper, NULL, 0);
  double deadline = test_now() + BOUND_S + 5;
  for (int r = 0; r < NR; r++)
    while (r % ND != 2 && test_now() < deadline && !sh->failed_at[r]) usleep(50 * 1000);
  const char *link = getenv("CCS_TEST_NETNS_LINK");
  char cmd[128];
  if (link && *link) {
    snprintf(cmd, sizeof(cmd), "/usr/sbin/ip link set %s2 up", link);
    assert_int_equal(system(cmd), 0);
  } else {
    kill(dm[2].pid, SIGCONT);
  }
  int status;
  waitpid(ranks, &status, 0);
  expect_lost("daemon cut off");
  survivors_serve();
}

/* Where daemon 0 takes daemons: the address in the unique id. */
static void port_of_daemon_0(struct sockaddr_in *sa) {
  struct ccs__unique_id id;
  memcpy(&id, sh->id.internal, sizeof(id));
  char host[64];
  snprintf(host, sizeof(host), "%s", id.root);
  char *colon = strrchr(host, ':');
  assert_non_null(colon);
  *colon = 0;
  memset(sa, 0, sizeof(*sa));
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)atoi(colon + 1));
  assert_int_equal(inet_pton(AF_INET, host, &sa->sin_addr), 1);
}

/* Connects as a stranger would (from namespace 1 when there are some). */
static int stranger(const struct sockaddr_in *sa) {
  const char *netns = getenv("CCS_TEST_NETNS");
  if (netns && *netns) {
    char path[128];
    snprintf(path, sizeof(path), "/run/netns/%s1", netns);
    int ns = open(path, O_RDONLY);
    if (ns < 0 || setns(ns, CLONE_NEWNET)) return -1;
    close(ns);
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (const struct sockaddr *)sa, sizeof(*sa))) return -1;
  return fd;
}

static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void test_junk_on_the_port(void **state) {
  (void)state;
  struct sockaddr_in sa;
  port_of_daemon_0(&sa);
  pid_t pid = fork();
  if (pid == 0) {
    int ok = 1;
    /* garbage */
    int fd = stranger(&sa);
    char junk[300];
    for (size_t i = 0; i < sizeof(junk); i++) junk[i] = (char)(i * 7 + 3);
    ok &= fd >= 0 && write(fd, junk, sizeof(junk)) == (ssize_t)sizeof(junk) && raw_closed_by_daemon(fd);
    close(fd);
    /* a greeting of another protocol version */
    fd = stranger(&sa);
    Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
    Ccs__PeerHello h = CCS__PEER_HELLO__INIT;
    h.protocol = 999;
    h.addr = "10.9.9.9:1";
    m.body_case = CCS__PEER_MSG__BODY_HELLO;
    m.hello = &h;
    uint8_t frame[256];
    size_t len = protobuf_c_message_pack(&m.base, frame + 16);
    put64(frame, 0);
    put64(frame + 8, len);
    ok &= fd >= 0 && write(fd, frame, 16 + len) == (ssize_t)(16 + len) && raw_closed_by_daemon(fd);
    close(fd);
    /* a length no daemon takes */
    fd = stranger(&sa);
    put64(frame, 0);
    put64(frame + 8, UINT64_MAX / 2);
    ok &= fd >= 0 && write(fd, frame, 16) == 16 && raw_closed_by_daemon(fd);
    close(fd);
    /* nothing at all: dropped after the io timeout */
    fd = stranger(&sa);
    ok &= fd >= 0 && raw_closed_by_daemon(fd);
    close(fd);
    _exit(ok ? 0 : 1);
  }
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (int i = 0; i < ND; i++) assert_true(test_daemon_alive(&dm[i]));
  survivors_serve();
}

/* Ranks of two daemons that call all_reduce differently: what rank 1
 * changes (count, type or reduction) is arg. */
enum differ { COUNTS, TYPES, REDUCTIONS };
static int mismatched_rank(int rank, int n, void *arg) {
  enum differ what = *(const enum differ *)arg;
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 2;
  size_t count = what == COUNTS && rank == 1 ? 500 : 1000;
  ccs_dtype_t t = what == TYPES && rank == 1 ? CCS_INT32 : CCS_FLOAT32;
  ccs_redop_t op = what == REDUCTIONS && rank == 1 ? CCS_MAX : CCS_SUM;
  float *buf = calloc(count, sizeof(float));
  sh->code[rank] = ccs_all_reduce(buf, buf, count, t, op, comm, NULL);
  snprintf(sh->text[rank], sizeof(sh->text[rank]), "%s", ccs_comm_last_error(comm));
  ccs_comm_destroy(comm);
  free(buf);
  return 0;
}

/* Every rank gets CCS_ERR_MISMATCH (none a result), and one at least the
 * text that names the difference. */
static void expect_mismatch(enum differ what, const char *named_by, const char *also) {
  test_spread_ranks(dm, 2);
  assert_int_equal(test_run_ranks(2 * per, mismatched_rank, &what, 60, NULL), 0);
  int named = 0;
  for (int r = 0; r < 2 * per; r++) {
    fprintf(stderr, "# differ: rank %d: %s: %s\n", r, ccs_result_name(sh->code[r]), sh->text[r]);
    assert_int_equal(sh->code[r], CCS_ERR_MISMATCH);
    named += strstr(sh->text[r], named_by) && (!also || strstr(sh->text[r], also));
  }
  assert_true(named >= 1);
  survivors_serve();
}

static void test_counts_differ_across_nodes(void **state) {
  (void)state;
  /* the daemons' words or the data, whichever tells first */
  test_spread_ranks(dm, 2);
  enum differ what = COUNTS;
  assert_int_equal(test_run_ranks(2 * per, mismatched_rank, &what, 60, NULL), 0);
  for (int r = 0; r < 2 * per; r++) {
    fprintf(stderr, "# counts differ: rank %d: %s: %s\n", r, ccs_result_name(sh->code[r]), sh->text[r]);
    assert_int_equal(sh->code[r], CCS_ERR_MISMATCH);
    assert_true(strstr(sh->text[r], "different counts") || strstr(sh->text[r], "count=500"));
  }
  survivors_serve();
}

/* Two ranks of the same daemon disagree in a comm over three daemons (2
 * and 3 ranks per daemon): the daemon that sees it fails the comm for
 * every daemon; nobody gets a result, every daemon lives on. */
static int same_daemon_differs(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 2;
  size_t count = rank == ND ? 7 : 8; /* rank ND is daemon 0's second rank */
  float buf[8] = {0};
  sh->code[rank] = ccs_all_reduce(buf, buf, count, CCS_FLOAT32, CCS_SUM, comm, NULL);
  snprintf(sh->text[rank], sizeof(sh->text[rank]), "%s", ccs_comm_last_error(comm));
  ccs_comm_destroy(comm);
  return 0;
}

static void test_counts_differ_within_a_daemon(void **state) {
  (void)state;
  for (int k = 2; k <= 3; k++) {
    test_new_id(&sh->id);
    assert_int_equal(test_run_ranks(ND * k, same_daemon_differs, NULL, 60, NULL), 0);
    for (int r = 0; r < ND * k; r++) {
      fprintf(stderr, "# %d per daemon: rank %d: %s: %s\n", k, r, ccs_result_name(sh->code[r]), sh->text[r]);
      assert_int_equal(sh->code[r], CCS_ERR_MISMATCH);
      assert_non_null(strstr(sh->text[r], "count=7"));
    }
    for (int i = 0; i < ND; i++) assert_true(test_daemon_alive(&dm[i]));
  }
  survivors_serve();
}

static void test_types_differ_across_nodes(void **state) {
  (void)state;
  expect_mismatch(TYPES, "differs across", "dtype=int32");
}

static void test_reductions_differ_across_nodes(void **state) {
  (void)state;
  expect_mismatch(REDUCTIONS, "differs across", "op=max");
}

/* Ranks of daemon 2 broadcast from a root of their own, the others from
 * rank 0: every daemon's op can finish (a root's sends complete whoever
 * takes them), so no daemon waits to tell; the words on a rooted op go at
 * launch, and every rank's next calls fail with the mismatch. */
static int rooted_differs(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 2;
  int root = rank % ND == 2 ? 2 : 0, buf[16] = {rank};
  ccs_result_t rc = ccs_broadcast(buf, buf, 16, CCS_INT32, root, comm, NULL);
  for (double end = test_now() + 20; rc == CCS_OK && test_now() < end;) rc = ccs_barrier(comm);
  sh->code[rank] = rc;
  snprintf(sh->text[rank], sizeof(sh->text[rank]), "%s", ccs_comm_last_error(comm));
  ccs_comm_destroy(comm);
  return 0;
}

static void test_roots_differ_across_nodes(void **state) {
  (void)state;
  assert_int_equal(test_run_ranks(NR, rooted_differs, NULL, 60, NULL), 0);
  for (int r = 0; r < NR; r++) {
    fprintf(stderr, "# roots differ: rank %d: %s: %s\n", r, ccs_result_name(sh->code[r]), sh->text[r]);
    assert_int_equal(sh->code[r], CCS_ERR_MISMATCH);
    assert_non_null(strstr(sh->text[r], "differs across daemons"));
    assert_non_null(strstr(sh->text[r], "root="));
  }
  survivors_serve();
}

/* The ranks of daemon 1 call each op late (past the time after which a
 * waiting daemon speaks of it): the daemons' words agree, every result is
 * right, nothing fails, op after op. */
static int late_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 2;
  int bad = 0;
  for (int i = 0; i < 6 && !bad; i++) {
    if (rank % ND == 1) usleep(40 * 1000);
    int64_t v[3] = {rank + i, -rank, (int64_t)1 << 40}, want[3] = {0, 0, 0};
    for (int r = 0; r < n; r++) want[0] += r + i, want[1] -= r, want[2] += (int64_t)1 << 40;
    ccs_result_t rc = ccs_all_reduce(v, v, 3, CCS_INT64, CCS_SUM, comm, NULL);
    if (rc != CCS_OK || memcmp(v, want, sizeof(v))) {
      fprintf(stderr, "rank %d, op %d: %s: %s\n", rank, i, ccs_result_name(rc), ccs_comm_last_error(comm));
      bad = 1;
    }
  }
  if (ccs_comm_destroy(comm) != CCS_OK) bad = 1;
  return bad;
}

static void test_late_ranks_across_nodes(void **state) {
  (void)state;
  assert_int_equal(test_run_ranks(NR, late_rank, NULL, 60, NULL), 0);
  survivors_serve();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_junk_on_the_port, setup, teardown),
      cmocka_unit_test_setup_teardown(test_counts_differ_across_nodes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_types_differ_across_nodes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reductions_differ_across_nodes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_counts_differ_within_a_daemon, setup, teardown),
      cmocka_unit_test_setup_teardown(test_roots_differ_across_nodes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_late_ranks_across_nodes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_cut_off, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_killed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_stopped, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
