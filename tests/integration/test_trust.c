/* The trust boundary on one node (docs/trust.md): what a tenant sends
 * or does can refuse its own calls, never crash, stall or spy on the
 * daemon. Each test is one way in, and afterwards the daemon serves both
 * tenants (root and uid 65534) with correct results and holds nothing
 * more than before. Runs as root: some clients switch to uid 65534. */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "raw.h"
#include "serving.h"

struct shared {
  ccs_unique_id_t id;
  int failures;
  char text[512];
};
static struct shared *sh;
static struct test_daemon dmn;
static struct test_daemon_state clean;

static int start(const char *const *args) {
  sh = test_shared_new(sizeof(*sh));
  return sh ? test_daemon_start_clean(&dmn, args, &sh->id, &clean) : -1;
}

static int setup(void **state) {
  static const char *const args[] = {"--socket-mode", "0666", "--io-timeout", "2", NULL};
  return start(args);
}

static int teardown(void **state) {
  int rc = test_daemon_stop(&dmn); /* not 0: it crashed or reported a race as it stopped */
  test_shared_free(sh, sizeof(*sh));
  return rc;
}

/* rank + 1, 10 * rank, -rank: one checked all_reduce of 3 int64 */
static double three_int64(int rank, size_t i) { return i == 0 ? rank + 1 : i == 1 ? 10 * rank : -rank; }
static const struct test_sum three = {CCS_INT64, 3, three_int64};

/* Both tenants are served (3 ranks each), and the daemon holds what it held before. */
static void both_tenants_served(void) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_sum(3, &sh->id, &three, 0, 60), 0);
  test_other_tenant_id(&sh->id);
  assert_int_equal(test_run_sum(3, &sh->id, &three, 1, 60), 0);
  test_daemon_assert_clean(&dmn, &clean);
}

/* --- CCS_ALGO: malformed rules refuse the init, with the rule's problem --- */

static const struct {
  const char *rules, *says;
} bad_rules[] = {
    {":", "an empty field"},
    {"::", "an empty field"},
    {";:;", "an empty field"},
    {" : ", "an empty field"},
    {"ring::", "an empty field"},
    {"all_reduce:ring:nan-1K", "bad size range"},
    {"all_reduce:ring:0-inf", "bad size range"},
    {"all_reduce:spiral", "not an algorithm"},
    {"a:b:c:d:e", "more than 4 fields"},
};

static int init_with_rules(int rank, int n, void *arg) {
  size_t i = (size_t)(uintptr_t)arg;
  setenv("CCS_ALGO", bad_rules[i].rules, 1);
  ccs_comm_t *comm = NULL;
  ccs_result_t rc = ccs_comm_init_rank(&comm, 1, sh->id, 0);
  snprintf(sh->text, sizeof(sh->text), "%s", ccs_comm_last_error(comm));
  if (rc == CCS_OK) ccs_comm_destroy(comm);
  return rc == CCS_ERR_INVALID_ARGUMENT ? 0 : 1;
}

static void test_malformed_algo_rules(void **state) {
  for (size_t i = 0; i < sizeof(bad_rules) / sizeof(bad_rules[0]); i++) {
    test_new_id(&sh->id);
    assert_int_equal(test_run_ranks(1, init_with_rules, (void *)(uintptr_t)i, 30, NULL), 0);
    fprintf(stderr, "# CCS_ALGO='%s': %s\n", bad_rules[i].rules, sh->text);
    assert_non_null(strstr(sh->text, "CCS_ALGO"));
    assert_non_null(strstr(sh->text, bad_rules[i].says));
    assert_true(test_daemon_alive(&dmn));
  }
  both_tenants_served();
}

/* --- file descriptors travel with their frame, whatever the threads do --- */

struct thread_arg {
  ccs_comm_t *comm;
  int registerer;
  double until;
  int failed;
};

static void *hammer(void *p) {
  struct thread_arg *a = p;
  for (int i = 0; test_now() < a->until && !a->failed; i++) {
    if (a->registerer) { /* a memfd with each registration */
      void *buf;
      if (ccs_mem_alloc(&buf, 4096 * (size_t)(1 + i % 4)) != CCS_OK) a->failed = 1;
      else if (ccs_mem_free(buf) != CCS_OK) a->failed = 2;
    } else { /* frames without descriptors */
      int v[7], out[7];
      for (int k = 0; k < 7; k++) v[k] = i + k;
      if (ccs_all_reduce(v, out, 7, CCS_INT32, CCS_MAX, a->comm, NULL) != CCS_OK) a->failed = 3;
      for (int k = 0; k < 7 && !a->failed; k++)
        if (out[k] != i + k) a->failed = 4;
    }
  }
  return NULL;
}

static int threads_rank(int rank, int n, void *arg) {
  ccs_comm_t *comms[4];
  for (int t = 0; t < 4; t++) { /* a one-rank comm per submitting thread */
    ccs_unique_id_t id;
    if (ccs_get_unique_id(&id) != CCS_OK || ccs_comm_init_rank(&comms[t], 1, id, 0) != CCS_OK) return 1;
  }
  pthread_t th[8];
  struct thread_arg args[8];
  double until = test_now() + 3;
  for (int t = 0; t < 8; t++) {
    args[t] = (struct thread_arg){comms[t % 4], t >= 4, until, 0};
    pthread_create(&th[t], NULL, hammer, &args[t]);
  }
  int failed = 0;
  for (int t = 0; t < 8; t++) {
    pthread_join(th[t], NULL);
    if (args[t].failed) {
      fprintf(stderr, "thread %d failed (%d): %s\n", t, args[t].failed, ccs_comm_last_error(comms[t % 4]));
      failed = 1;
    }
  }
  for (int t = 0; t < 4; t++) ccs_comm_destroy(comms[t]);
  return failed;
}

static void test_fds_under_concurrent_threads(void **state) {
  assert_int_equal(test_run_ranks(1, threads_rank, NULL, 60, NULL), 0);
  both_tenants_served();
}

/* --- replies of any size arrive, or fail the call visibly ---------------- */

/* k comms of 4096 ranks, one rank joined each (raw: the init waits), on fd */
static void joining_comms(int fd, int k) {
  for (int i = 0; i < k; i++) raw_send_join(fd, 100 + (uint64_t)i, 1000 + (uint64_t)i, 4096);
}

static void test_large_replies(void **state) {
  /* ~250 KB of JSON per comm of 4096 ranks: 13 make a 3 MiB reply */
  int fd = raw_connect(dmn.socket);
  raw_hello(fd);
  joining_comms(fd, 13);
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "%s --socket %s --json comms | wc -c", CCSCTL_PATH, dmn.socket);
  FILE *p = popen(cmd, "r");
  long bytes = 0;
  assert_int_equal(fscanf(p, "%ld", &bytes), 1);
  pclose(p);
  fprintf(stderr, "# a reply of %ld bytes\n", bytes);
  assert_true(bytes > 3 << 20);
  /* 40 of them (10 MiB): more than a reply may hold; the call fails saying so */
  joining_comms(fd, 27);
  snprintf(cmd, sizeof(cmd), "%s --socket %s --json comms 2>&1 >/dev/null", CCSCTL_PATH, dmn.socket);
  p = popen(cmd, "r");
  char text[512] = "";
  size_t n = fread(text, 1, sizeof(text) - 1, p);
  text[n] = 0;
  int st = pclose(p);
  fprintf(stderr, "# %s", text);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
  assert_non_null(strstr(text, "larger than a reply may be"));
  close(fd);
  both_tenants_served();
}

/* --- operators and tenants -------------------------------------------- */

static int ccsctl_as(int other, const char *args, char *out, size_t len) {
  int pipefd[2];
  assert_int_equal(pipe(pipefd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    if (other) test_become_other_tenant();
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s --socket %s %s", CCSCTL_PATH, dmn.socket, args);
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  close(pipefd[1]);
  size_t got = 0;
  ssize_t n;
  while (got + 1 < len && (n = read(pipefd[0], out + got, len - 1 - got)) > 0) got += (size_t)n;
  out[got] = 0;
  close(pipefd[0]);
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* rank 0 of a 2-rank comm whose rank 1 never comes: its comm stays listed */
static int lonely_rank(int rank, int n, void *arg) {
  ccs_comm_t *comm;
  ccs_result_t rc = ccs_comm_init_rank(&comm, 2, sh->id, 0);
  return rc == CCS_ERR_TIMEOUT || rc == CCS_ERR_ABORTED ? 0 : 1;
}

static unsigned long long first_comm(const char *json) {
  const char *at = strstr(json, "\"comm\": ");
  return at ? strtoull(at + 8, NULL, 10) : 0;
}

/* root's lonely rank in a child (*ret_ranks), and its comm as `as_other`
 * lists it */
static unsigned long long lonely_comm(int as_other, pid_t *ret_ranks, char *out, size_t len) {
  test_new_id(&sh->id);
  pid_t ranks = fork();
  if (ranks == 0) _exit(test_run_ranks(1, lonely_rank, NULL, 60, NULL));
  unsigned long long comm = 0;
  for (double until = test_now() + 10; !comm && test_now() < until; usleep(50000)) {
    assert_int_equal(ccsctl_as(as_other, "--json comms", out, len), 0);
    comm = first_comm(out);
  }
  assert_true(comm > 0);
  *ret_ranks = ranks;
  return comm;
}

static void test_tenant_cannot_abort_others(void **state) {
  static char out[1 << 16];
  pid_t ranks;
  unsigned long long comm = lonely_comm(0, &ranks, out, sizeof(out));
  /* the tenant neither sees it nor aborts it; the answer is the same as
   * for a comm that does not exist */
  assert_int_equal(ccsctl_as(1, "--json comms", out, sizeof(out)), 0);
  assert_null(strstr(out, "\"comm\": "));
  char cmd[64];
  snprintf(cmd, sizeof(cmd), "abort %llu", comm);
  assert_int_not_equal(ccsctl_as(1, cmd, out, sizeof(out)), 0);
  fprintf(stderr, "# tenant: %s", out);
  assert_non_null(strstr(out, "no comm"));
  assert_int_not_equal(ccsctl_as(1, "abort 987654", out, sizeof(out)), 0);
  assert_non_null(strstr(out, "no comm"));
  assert_int_equal(ccsctl_as(0, "--json comms", out, sizeof(out)), 0);
  assert_non_null(strstr(out, "\"state\": \"joining\""));
  /* the operator can */
  assert_int_equal(ccsctl_as(0, cmd, out, sizeof(out)), 0);
  int st;
  waitpid(ranks, &st, 0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  both_tenants_served();
}

/* admin_gids: a member of the group (here: the other tenant's own group)
 * is an operator, and sees root's comms. */
static int setup_admin_group(void **state) {
  static const char *const args[] = {"--socket-mode", "0666", "--admin-gids", "65534", NULL};
  return start(args);
}

static void test_admin_group(void **state) {
  static char out[1 << 16];
  pid_t ranks;
  unsigned long long comm = lonely_comm(1, &ranks, out, sizeof(out));
  assert_non_null(strstr(out, "\"uid\": 0"));
  char cmd[64];
  snprintf(cmd, sizeof(cmd), "abort %llu", comm);
  assert_int_equal(ccsctl_as(1, cmd, out, sizeof(out)), 0);
  int st;
  waitpid(ranks, &st, 0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  both_tenants_served();
}

/* --- quotas on what things cost ------------------------------------------- */

static int setup_quotas(void **state) {
  static const char *const args[] = {"--socket-mode", "0666", "--quota-buffers", "3",
                                     "--quota-ranks", "4", NULL};
  return start(args);
}

static void test_quota_buffers_and_ranks(void **state) {
  int fd = raw_connect(dmn.socket);
  raw_hello(fd);
  int mfd[4];
  uint64_t id;
  for (int i = 0; i < 4; i++) {
    mfd[i] = raw_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW);
    ccs_result_t rc = raw_register(fd, mfd[i], &id);
    assert_int_equal(rc, i < 3 ? CCS_OK : CCS_ERR_QUOTA);
    close(mfd[i]);
  }
  close(fd);
  /* ranks: a fifth rank joined through this daemon by the same uid is refused */
  fd = raw_connect(dmn.socket);
  raw_hello(fd);
  joining_comms(fd, 4);
  raw_send_join(fd, 99, 5000, 2);
  Ccs__Reply *r = raw_reply(fd);
  assert_int_equal(r->status, CCS_ERR_QUOTA);
  assert_non_null(strstr(r->error, "ranks"));
  ccs__reply__free_unpacked(r, NULL);
  close(fd);
  test_daemon_assert_clean(&dmn, &clean); /* what the closed client held is gone */
  both_tenants_served();
}

/* --- unique ids expire ------------------------------------------------------ */

static int setup_short_ids(void **state) {
  static const char *const args[] = {"--socket-mode", "0666", "--id-ttl", "1", NULL};
  return start(args);
}

static int late_rank(int rank, int n, void *arg) {
  ccs_comm_t *comm = NULL;
  ccs_result_t rc = ccs_comm_init_rank(&comm, 1, sh->id, 0);
  snprintf(sh->text, sizeof(sh->text), "%s", ccs_comm_last_error(comm));
  return rc == CCS_ERR_INVALID_ARGUMENT ? 0 : 1;
}

static void test_ids_expire(void **state) {
  test_new_id(&sh->id);
  sleep(2);
  assert_int_equal(test_run_ranks(1, late_rank, NULL, 30, NULL), 0);
  fprintf(stderr, "# %s\n", sh->text);
  assert_non_null(strstr(sh->text, "expired"));
  /* fresh ids work (used at once) */
  test_new_id(&sh->id);
  assert_int_equal(test_run_sum(3, &sh->id, &three, 0, 60), 0);
  test_daemon_assert_clean(&dmn, &clean);
}

/* --- descriptor exhaustion -------------------------------------------------- */

static double cpu_seconds(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  unsigned long utime = 0, stime = 0;
  /* fields after the command: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2) return -1;
  return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static int setup_few_fds(void **state) {
  struct rlimit saved;
  getrlimit(RLIMIT_NOFILE, &saved);
  struct rlimit low = {64, saved.rlim_max}; /* the soft limit: raised again below */
  setrlimit(RLIMIT_NOFILE, &low);          /* the daemon inherits it */
  static const char *const args[] = {"--socket-mode", "0666", "--threads", "1", NULL};
  int rc = start(args);
  setrlimit(RLIMIT_NOFILE, &saved);
  return rc;
}

static void test_descriptor_exhaustion(void **state) {
  enum { N = 120 };
  int fds[N];
  for (int i = 0; i < N; i++) fds[i] = raw_connect(dmn.socket);
  /* every connection is answered: a hello for those it could take, a
   * refusal saying why for the others; nothing spins */
  double cpu0 = cpu_seconds(dmn.pid), t0 = test_now();
  sleep(2);
  double cpu = cpu_seconds(dmn.pid) - cpu0, wall = test_now() - t0;
  fprintf(stderr, "# %d connections at a limit of 64 descriptors: daemon CPU %.2f s in %.2f s\n", N, cpu, wall);
  assert_true(cpu < 0.5 * wall);
  int refused = 0, served = 0;
  for (int i = 0; i < N; i++) {
    struct pollfd p = {fds[i], POLLIN, 0};
    if (poll(&p, 1, 0) == 0) raw_send_hello(fds[i], CCS__PROTOCOL_VERSION); /* not refused */
    Ccs__Reply *r = raw_reply(fds[i]);
    if (r && r->status == CCS_OK) served++;
    if (r && r->status == CCS_ERR_SYSTEM && strstr(r->error, "no file descriptor left")) refused++;
    if (r) ccs__reply__free_unpacked(r, NULL);
  }
  fprintf(stderr, "# served %d, refused %d\n", served, refused);
  assert_true(served > 0 && refused > 0 && served + refused == N);
  for (int i = 0; i < N; i++) close(fds[i]);
  both_tenants_served();
}

int main(void) {
  if (geteuid() != 0) {
    fprintf(stderr, "test_trust needs root (it switches clients to uid %d)\n", TEST_OTHER_UID);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_malformed_algo_rules, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fds_under_concurrent_threads, setup, teardown),
      cmocka_unit_test_setup_teardown(test_large_replies, setup, teardown),
      cmocka_unit_test_setup_teardown(test_tenant_cannot_abort_others, setup, teardown),
      cmocka_unit_test_setup_teardown(test_admin_group, setup_admin_group, teardown),
      cmocka_unit_test_setup_teardown(test_quota_buffers_and_ranks, setup_quotas, teardown),
      cmocka_unit_test_setup_teardown(test_ids_expire, setup_short_ids, teardown),
      cmocka_unit_test_setup_teardown(test_descriptor_exhaustion, setup_few_fds, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
