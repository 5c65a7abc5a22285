/* Faults across daemons: three daemons (on loopback ports, or each in its
 * own network namespace under tests/support/run_netns.sh), one rank on
 * each, all_reduce in a loop. A daemon killed with SIGKILL or stopped
 * with SIGTERM, and a daemon cut off (its link down in namespaces; stopped with SIGSTOP on loopback,
 * which silences it the same way), must make the other ranks fail with
 * CCS_ERR_PEER_LOST naming the lost daemon by its address, its ranks and
 * the cause, within bounds (a reset at once, silence not before
 * peer_timeout), and the surviving daemons must serve new communicators.
 * Junk on the daemons' port is dropped without disturbing them; ranks of
 * different nodes that call different collectives, counts, types,
 * reductions or roots are told so, every one of them, with both calls
 * named, and get no result; an op waiting for other daemons fails at its
 * deadline. The daemons must stop cleanly after every test. */
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
  int code[MAXR], next_code[MAXR];
  int running;      /* ranks that completed an op of the loop: the fault may come */
  int wrote[MAXR];  /* a rank's receive buffer changed by an op that failed */
  char text[MAXR][512];
};
static struct shared *sh;
static struct test_daemon dm[ND];
#define HEARTBEAT_S 0.2
#define PEER_TIMEOUT_S 1.5
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
  for (int ops = 0; rc == CCS_OK && test_now() < end; ops++) {
    rc = ccs_all_reduce(buf, buf, COUNT, CCS_FLOAT32, CCS_MAX, comm, NULL);
    if (ops == 0 && rc == CCS_OK) __atomic_add_fetch(&sh->running, 1, __ATOMIC_SEQ_CST);
  }
  sh->failed_at[rank] = test_now();
  sh->code[rank] = rc;
  snprintf(sh->text[rank], sizeof(sh->text[rank]), "%s", ccs_comm_last_error(comm));
  ccs_comm_destroy(comm);
  free(buf);
  return 0;
}

/* A fresh comm over daemons 0 and 1: one checked all_reduce of 320 KB
 * (through the executors and the network, not the control loop). */
static void survivors_serve(void) {
  test_spread_ranks(dm, 2);
  test_new_id(&sh->id);
  assert_int_equal(test_run_sum(2, &sh->id, &test_sum_executor, 0, 60), 0);
  test_spread_ranks(dm, ND);
}

/* The address other daemons know daemon i by: the root of an id it issues. */
static void address_of(int i, char *out, size_t len) {
  int fd = raw_connect(dm[i].socket);
  raw_hello(fd);
  raw_send_get_unique_id(fd, 2);
  Ccs__Reply *r = raw_reply(fd);
  close(fd);
  assert_non_null(r);
  assert_int_equal(r->status, CCS_OK);
  struct ccs__unique_id id;
  assert_true(r->unique_id->id.len >= sizeof(id));
  memcpy(&id, r->unique_id->id.data, sizeof(id));
  ccs__reply__free_unpacked(r, NULL);
  snprintf(out, len, "%.*s", (int)sizeof(id.root), id.root);
}

/* The other ranks got PEER_LOST naming daemon 2 by its address, its
 * ranks and the cause (or the other cause, where two may come first),
 * between `early` and `late` seconds after the fault. */
static void expect_lost(const char *how, const char *addr, const char *cause, const char *or_cause,
                        double early, double late) {
  char ranks[64] = "", want[256], or_want[256];
  for (int r = 2; r < NR; r += ND)
    snprintf(ranks + strlen(ranks), sizeof(ranks) - strlen(ranks), "%s%d", r > 2 ? "," : "", r);
  snprintf(want, sizeof(want), "the daemon at %s serving rank(s) %s is %s", addr, ranks, cause);
  snprintf(or_want, sizeof(or_want), "the daemon at %s serving rank(s) %s is %s", addr, ranks,
           or_cause ? or_cause : cause);
  for (int r = 0; r < NR; r++) {
    if (r % ND == 2) continue;
    double after = sh->failed_at[r] - sh->fault_at;
    fprintf(stderr, "# %s: rank %d: %s after %.2f s: %s\n", how, r, ccs_result_name(sh->code[r]), after,
            sh->text[r]);
    assert_int_equal(sh->code[r], CCS_ERR_PEER_LOST);
    if (!strstr(sh->text[r], want) && !strstr(sh->text[r], or_want))
      fail_msg("rank %d: '%s' does not say '%s'", r, sh->text[r], want);
    if (after < early || after > late)
      fail_msg("rank %d heard %.2f s after the fault, not within [%.2f, %.2f]", r, after, early, late);
  }
}

/* In a child: once every rank completed an op of its loop, the fault;
 * the parent runs the ranks. */
static pid_t fault_later(void (*fault)(void)) {
  sh->running = 0;
  memset(sh->failed_at, 0, sizeof(sh->failed_at));
  pid_t pid = fork();
  if (pid == 0) {
    for (double end = test_now() + 60; __atomic_load_n(&sh->running, __ATOMIC_SEQ_CST) < NR;)
      if (test_now() > end) _exit(1);
      else usleep(1000);
    sh->fault_at = test_now();
    fault();
    _exit(0);
  }
  return pid;
}

static void kill_daemon_2(void) { kill(dm[2].pid, SIGKILL); }

/* at once: the reset, well before any heartbeat would be missed */
static void test_daemon_killed(void **state) {
  (void)state;
  char addr[64];
  address_of(2, addr, sizeof(addr));
  pid_t helper = fault_later(kill_daemon_2);
  test_run_ranks(NR, looping_rank, NULL, 120, NULL);
  waitpid(helper, NULL, 0);
  /* its kernel resets the connections: a receive hears the reset, a send
   * that comes first the broken pipe */
  expect_lost("daemon killed", addr, "unreachable: connection lost: Connection reset by peer",
              "unreachable: connection lost: Broken pipe", 0, PEER_TIMEOUT_S - HEARTBEAT_S);
  test_daemon_kill(&dm[2]);
  survivors_serve();
}

static void stop_daemon_2(void) { kill(dm[2].pid, SIGTERM); }

/* A daemon stopped (systemctl stop) mid-collective: the same for the
 * others, and it exits cleanly with its ops' network tasks unsent. */
static void test_daemon_stopped(void **state) {
  (void)state;
  char addr[64];
  address_of(2, addr, sizeof(addr));
  pid_t helper = fault_later(stop_daemon_2);
  test_run_ranks(NR, looping_rank, NULL, 120, NULL);
  waitpid(helper, NULL, 0);
  /* its word that it stops, or its connections closing (a receive or a
   * send failing), whichever a daemon hears first */
  expect_lost("daemon stopped", addr, "stopping", "unreachable: ", 0,
              PEER_TIMEOUT_S - HEARTBEAT_S);
  assert_int_equal(test_daemon_stop(&dm[2]), 0);
  survivors_serve();
}

/* With transport=ib over the emulated NIC: daemon 2's RDMA port goes down,
 * its queue pairs go into error, or its device fails, mid-collective.
 * Every connection of its is a queue pair beside the TCP connection it
 * runs with: each fails, the TCP ones close, and the other daemons hear it
 * at once. Ranks elsewhere fail naming daemon 2, which still stops
 * cleanly; daemons 0 and 1 serve on. */
static const char *emu_fault; /* what the emulated NIC of daemon 2 is told */

static void nic_fault_2(void) {
  char path[256];
  snprintf(path, sizeof(path), "%s/raise-%d", getenv("CCS_VERBS_EMU_DIR"), (int)dm[2].pid);
  FILE *f = fopen(path, "w");
  if (!f || fprintf(f, "%s\n", emu_fault) < 0 || fclose(f)) fprintf(stderr, "# cannot write %s\n", path);
}

/* each_link: the fault fails a link of daemon 2 at both ends, and which
 * end speaks first differs: a rank's text names a daemon whose data
 * connection was lost, not necessarily daemon 2. */
static void rdma_fault(const char *fault, int each_link) {
  char addr[64], want[128];
  emu_fault = fault;
  address_of(2, addr, sizeof(addr));
  pid_t helper = fault_later(nic_fault_2);
  test_run_ranks(NR, looping_rank, NULL, 120, NULL);
  waitpid(helper, NULL, 0);
  if (each_link) snprintf(want, sizeof(want), "data connection lost");
  else snprintf(want, sizeof(want), "the daemon at %s serving rank(s) 2", addr);
  for (int r = 0; r < NR; r++)
    fprintf(stderr, "# %s: rank %d (daemon %d): %s after %.2f s: %s\n", fault, r, r % ND,
            ccs_result_name(sh->code[r]), sh->failed_at[r] - sh->fault_at, sh->text[r]);
  for (int r = 0; r < NR; r++) {
    if (r % ND == 2) continue;
    double after = sh->failed_at[r] - sh->fault_at;
    assert_int_equal(sh->code[r], CCS_ERR_PEER_LOST);
    assert_non_null(strstr(sh->text[r], want));
    assert_true(after < PEER_TIMEOUT_S - HEARTBEAT_S); /* not by the heartbeat */
  }
  for (int r = 2; r < NR; r += ND) /* (mostly "this daemon's emu0 port 1: ...") */
    assert_int_equal(sh->code[r], CCS_ERR_PEER_LOST);
  assert_int_equal(test_daemon_stop(&dm[2]), 0);
  survivors_serve();
}

static void test_rdma_port_down(void **state) { (void)state; rdma_fault("port_down emu0 1", 0); }
static void test_rdma_qp_error(void **state) { (void)state; rdma_fault("qp_error all", 0); }
static void test_rdma_device_fatal(void **state) { (void)state; rdma_fault("device_fatal emu0", 0); }
/* Daemon 2's regions refuse the peers' RDMA writes (a remote access
 * error, as for a buffer deregistered under a write): the writer's queue
 * pair fails with it and daemon 2's end of it goes into error too; the
 * comm fails everywhere, promptly, as above. */
static void test_rdma_remote_access_error(void **state) { (void)state; rdma_fault("rkeys_revoked", 1); }

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

/* by the heartbeat: not before peer_timeout since the last word (a
 * heartbeat period before the fault at most), nor long after */
static void test_daemon_cut_off(void **state) {
  (void)state;
  char addr[64];
  address_of(2, addr, sizeof(addr));
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
  /* (the silence it measured: the bounds below check when it was heard) */
  expect_lost("daemon cut off", addr, "unreachable: no heartbeat for ", NULL,
              PEER_TIMEOUT_S - HEARTBEAT_S - 0.05, BOUND_S);
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

/* Ranks of two daemons that call differently: what the ranks of daemon 1
 * change (the collective, count, type or reduction) is arg. Out of place,
 * from inputs of rank + 1 into buffers of 0x5a: a rank that got a result
 * would see its buffer change. */
enum differ { KINDS, COUNTS, TYPES, REDUCTIONS };
static int mismatched_rank(int rank, int n, void *arg) {
  enum differ what = *(const enum differ *)arg;
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 2;
  int odd = rank % 2 == 1; /* daemon 1's ranks */
  size_t count = what == COUNTS && odd ? 500 : 1000;
  ccs_dtype_t t = what == TYPES && odd ? CCS_INT32 : CCS_FLOAT32;
  ccs_redop_t op = what == REDUCTIONS && odd ? CCS_MAX : CCS_SUM;
  size_t recv_bytes = (size_t)n * 1000 * sizeof(float); /* room for an all_gather */
  float *send = malloc(1000 * sizeof(float));
  unsigned char *recv = malloc(recv_bytes);
  for (int i = 0; i < 1000; i++) send[i] = (float)(rank + 1);
  memset(recv, 0x5a, recv_bytes);
  if (what == KINDS && odd) sh->code[rank] = ccs_all_gather(send, recv, count, t, comm, NULL);
  else sh->code[rank] = ccs_all_reduce(send, recv, count, t, op, comm, NULL);
  snprintf(sh->text[rank], sizeof(sh->text[rank]), "%s", ccs_comm_last_error(comm));
  sh->wrote[rank] = 0;
  for (size_t i = 0; i < recv_bytes; i++) sh->wrote[rank] |= recv[i] != 0x5a;
  /* the comm failed: the next call, the same on every rank, fails too */
  int v = 1, sum;
  sh->next_code[rank] = ccs_all_reduce(&v, &sum, 1, CCS_INT32, CCS_SUM, comm, NULL);
  ccs_comm_destroy(comm);
  free(send);
  free(recv);
  return 0;
}

/* Every rank gets CCS_ERR_MISMATCH naming a rank of each daemon and what
 * each called (mine and theirs), no rank's buffer is written, and the
 * comm is failed for every rank. */
static void expect_mismatch(enum differ what, const char *mine, const char *theirs) {
  test_spread_ranks(dm, 2);
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(2 * per, mismatched_rank, &what, 60, NULL), 0);
  for (int r = 0; r < 2 * per; r++) {
    fprintf(stderr, "# differ: rank %d: %s: %s; then %s\n", r, ccs_result_name(sh->code[r]), sh->text[r],
            ccs_result_name(sh->next_code[r]));
    assert_int_equal(sh->code[r], CCS_ERR_MISMATCH);
    if (!strstr(sh->text[r], "differs across daemons") || !strstr(sh->text[r], mine) ||
        !strstr(sh->text[r], theirs))
      fail_msg("rank %d: '%s' does not name both calls ('%s', '%s')", r, sh->text[r], mine, theirs);
    if (sh->wrote[r]) fail_msg("rank %d got a result: its receive buffer was written", r);
    assert_int_not_equal(sh->next_code[r], CCS_OK);
  }
  survivors_serve();
}

static void test_kinds_differ_across_nodes(void **state) {
  (void)state;
  expect_mismatch(KINDS, "called all_reduce(count=1000, dtype=float, op=sum)",
                  "called all_gather(count=1000, dtype=float)");
}

static void test_counts_differ_across_nodes(void **state) {
  (void)state;
  expect_mismatch(COUNTS, "called all_reduce(count=1000, dtype=float, op=sum)",
                  "called all_reduce(count=500, dtype=float, op=sum)");
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
  expect_mismatch(TYPES, "called all_reduce(count=1000, dtype=float, op=sum)",
                  "called all_reduce(count=1000, dtype=int32, op=sum)");
}

static void test_reductions_differ_across_nodes(void **state) {
  (void)state;
  expect_mismatch(REDUCTIONS, "called all_reduce(count=1000, dtype=float, op=sum)",
                  "called all_reduce(count=1000, dtype=float, op=max)");
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
    assert_non_null(strstr(sh->text[r], "called broadcast(count=16, dtype=int32, root=0)"));
    assert_non_null(strstr(sh->text[r], "called broadcast(count=16, dtype=int32, root=2)"));
  }
  survivors_serve();
}

/* An op launched on daemon 0 whose ranks on daemon 1 never call it: it
 * fails at the comm's deadline (not before), saying it waited for the
 * other daemons, and the failure reaches daemon 1's ranks too. Daemon 0's
 * ranks join last: the comm is there already, made by daemon 1's ranks'
 * joins, and takes its deadline from the first rank of its own. */
#define SPAN_TIMEOUT_S 1.0
static int waits_for_other_daemons(int rank, int n, void *arg) {
  (void)arg;
  setenv("CCS_TIMEOUT", "1", 1);
  if (rank % 2 == 0) usleep(300 * 1000);
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 2;
  int v = 1, sum;
  if (ccs_all_reduce(&v, &sum, 1, CCS_INT32, CCS_SUM, comm, NULL) != CCS_OK) return 3;
  if (rank % 2 == 1) { /* daemon 1's: op #2 never called; the failure comes to it */
    ccs_result_t async = CCS_OK;
    for (double end = test_now() + 20; async == CCS_OK && test_now() < end; usleep(10000))
      ccs_comm_get_async_error(comm, &async);
    sh->code[rank] = async;
    snprintf(sh->text[rank], sizeof(sh->text[rank]), "%s", ccs_comm_last_error(comm));
    ccs_comm_destroy(comm);
    return 0;
  }
  double t0 = test_now();
  sh->code[rank] = ccs_all_reduce(&v, &sum, 1, CCS_INT32, CCS_SUM, comm, NULL);
  sh->failed_at[rank] = test_now() - t0;
  snprintf(sh->text[rank], sizeof(sh->text[rank]), "%s", ccs_comm_last_error(comm));
  ccs_comm_destroy(comm);
  return 0;
}

static void test_op_timeout_across_nodes(void **state) {
  (void)state;
  test_spread_ranks(dm, 2);
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(2 * per, waits_for_other_daemons, NULL, 60, NULL), 0);
  for (int r = 0; r < 2 * per; r++)
    fprintf(stderr, "# op timeout: rank %d: %s: %s\n", r, ccs_result_name(sh->code[r]), sh->text[r]);
  for (int r = 0; r < 2 * per; r++) {
    assert_int_equal(sh->code[r], CCS_ERR_TIMEOUT);
    if (r % 2) continue;
    assert_non_null(strstr(sh->text[r], "all_reduce #2 waited 1.0 s for the ranks on other daemons"));
    if (sh->failed_at[r] < SPAN_TIMEOUT_S - 0.025 || sh->failed_at[r] > SPAN_TIMEOUT_S + 5)
      fail_msg("rank %d timed out after %.3f s", r, sh->failed_at[r]);
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

/* 40 all_reduce on the same two buffers, one from ccs_mem_alloc and one of
 * malloc (staged), every element checked. */
static int repeating_rank(int rank, int n, void *arg) {
  (void)arg;
  enum { COUNT = 1 << 16, CALLS = 40 };
  ccs_comm_t *comm;
  float *mapped, *heap = malloc(COUNT * sizeof(float));
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK || !heap ||
      ccs_mem_alloc((void **)&mapped, COUNT * sizeof(float)) != CCS_OK)
    return 2;
  for (int i = 0; i < CALLS; i++) {
    float *buf = i % 2 ? heap : mapped;
    for (int k = 0; k < COUNT; k++) buf[k] = (float)(rank + 1) * (float)(k % 7 + i);
    if (ccs_all_reduce(buf, buf, COUNT, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK) return 3;
    for (int k = 0; k < COUNT; k++)
      if (buf[k] != (float)(n * (n + 1) / 2) * (float)(k % 7 + i)) return 4;
  }
  ccs_comm_destroy(comm);
  ccs_mem_free(mapped);
  free(heap);
  return 0;
}

static void registrations_of(int i, double *made, double *kept, double *held) {
  char *text = raw_admin(dm[i].socket, "metrics");
  assert_non_null(text);
  *made = raw_metric(text, "ccs_transport_registrations_total{how=\"made\"}");
  *kept = raw_metric(text, "ccs_transport_registrations_total{how=\"kept\"}");
  *held = raw_metric(text, "ccs_transport_registrations");
  free(text);
}

/* The ranks' buffers and the daemons' scratch are registered with the
 * transport once, not per call; what a client's buffers held goes when
 * they do (their mappings are gone: pages a registration still pinned
 * would be written by the network in their place). */
static void test_registrations_kept(void **state) {
  (void)state;
  assert_int_equal(test_run_ranks(NR, repeating_rank, NULL, 120, NULL), 0);
  for (int i = 0; i < ND; i++) {
    double made, kept, held;
    registrations_of(i, &made, &kept, &held);
    fprintf(stderr, "# daemon %d: %.0f registrations made, %.0f kept from earlier calls, %.0f held after\n",
            i, made, kept, held);
    assert_true(made + kept >= 40 * per);  /* every call used one at least */
    assert_true(made <= 2 * per + 8);      /* its ranks' two buffers each, and a few scratch blocks */
    assert_true(held <= made - 2 * per);   /* the buffers' went with them; scratch stays */
  }
}

/* Small and large all_reduce across the daemons, every element checked. */
enum { WAYS_BIG = 1 << 16, WAYS_CALLS = 20 };
static int two_sizes_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  float *big;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK ||
      ccs_mem_alloc((void **)&big, WAYS_BIG * sizeof(float)) != CCS_OK)
    return 1;
  int bad = 0;
  for (int i = 0; i < WAYS_CALLS && !bad; i++) {
    float v = (float)(rank + i), sum = -1;
    bad |= ccs_all_reduce(&v, &sum, 1, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK ||
           sum != (float)(n * (n - 1) / 2 + n * i);
    for (int k = 0; k < WAYS_BIG; k++) big[k] = (float)(rank + 1) * (float)(k % 5 + i);
    bad |= ccs_all_reduce(big, big, WAYS_BIG, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK;
    for (int k = 0; k < WAYS_BIG && !bad; k++) bad |= big[k] != (float)(n * (n + 1) / 2) * (float)(k % 5 + i);
  }
  ccs_mem_free(big);
  return bad | (ccs_comm_destroy(comm) != CCS_OK);
}

/* The daemons' count of their messages by the way they went
 * (ccs_transport_messages_total): over verbs the small ones by SEND once
 * the queue pairs were up, the large ones written by RDMA, and at least
 * the bytes an all_reduce must send; over TCP, which has one way, none. */
static void test_transport_ways(void **state) {
  (void)state;
  assert_int_equal(test_run_ranks(NR, two_sizes_rank, NULL, 120, NULL), 0);
  static const char *const ways[] = {"rdma", "send", "eager"};
  for (int i = 0; i < ND; i++) {
    char *text = raw_admin(dm[i].socket, "metrics"), series[96];
    double msgs[3], bytes[3];
    for (int w = 0; w < 3; w++) {
      snprintf(series, sizeof(series), "ccs_transport_messages_total{way=\"%s\"}", ways[w]);
      msgs[w] = raw_metric(text, series);
      snprintf(series, sizeof(series), "ccs_transport_message_bytes_total{way=\"%s\"}", ways[w]);
      bytes[w] = raw_metric(text, series);
    }
    int shown = strstr(text, "ccs_transport_messages_total") != NULL;
    free(text);
    fprintf(stderr, "# daemon %d: %.0f messages by RDMA (%.0f bytes), %.0f by SEND (%.0f), %.0f eager (%.0f)\n",
            i, msgs[0], bytes[0], msgs[1], bytes[1], msgs[2], bytes[2]);
    if (!getenv("CCS_TEST_IB_LIBRARY")) {
      assert_false(shown);
      continue;
    }
    assert_true(msgs[0] >= 1 && msgs[1] >= 1);
    assert_true(bytes[1] <= msgs[1] * 16383); /* a SEND carries less than 16 KiB */
    /* each daemon sends a third of every large call's buffer at least */
    assert_true(bytes[0] + bytes[1] + bytes[2] >= (double)WAYS_CALLS * WAYS_BIG * sizeof(float) / ND);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_junk_on_the_port, setup, teardown),
      cmocka_unit_test_setup_teardown(test_kinds_differ_across_nodes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_counts_differ_across_nodes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_types_differ_across_nodes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reductions_differ_across_nodes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_counts_differ_within_a_daemon, setup, teardown),
      cmocka_unit_test_setup_teardown(test_roots_differ_across_nodes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_op_timeout_across_nodes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_late_ranks_across_nodes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_registrations_kept, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transport_ways, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_cut_off, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_killed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_stopped, setup, teardown),
      /* last: the NIC's faults, where the emulated NIC takes them (test_nodes_*_ib) */
      cmocka_unit_test_setup_teardown(test_rdma_port_down, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rdma_qp_error, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rdma_device_fatal, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rdma_remote_access_error, setup, teardown),
  };
  const char *ib = getenv("CCS_TEST_IB_LIBRARY");
  size_t n = sizeof(tests) / sizeof(tests[0]) - (ib && strstr(ib, "verbs_emu") ? 0 : 4);
  return _cmocka_run_group_tests("test_nodes", tests, n, NULL, NULL);
}
