/* ccsctl against a real daemon with real ranks: a deliberately stuck rank
 * that `stuck` must name, `abort` releasing the blocked ranks, `status`,
 * `comms`, `config`, and `metrics` parsed back (prometheus_client's
 * parser) against the ops actually run; `tenants`, `top` and the
 * per-tenant metrics under load, a SIGHUP reload of the weights, and the
 * executor threads' scheduling policy. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "serving.h"

#define NRANKS 3 /* not 2: the bus factors of 2 ranks are 1 */

struct shared {
  ccs_unique_id_t id;
  int pids[NRANKS];
  ccs_result_t blocked_rc[NRANKS];
};
static struct shared *sh;
static struct test_daemon dmn;

/* ccsctl's stdout into buf; its exit status */
static int ccsctl(char *buf, size_t len, const char *args) {
  char cmd[512];
  snprintf(cmd, sizeof(cmd), "%s --socket %s %s", CCSCTL_PATH, dmn.socket, args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(buf, 1, len - 1, p);
  buf[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int rank_main(int rank, int n, void *arg) {
  ccs_comm_t *comm;
  sh->pids[rank] = getpid();
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 1;
  int v = rank, out, all[NRANKS];
  for (int i = 0; i < 5; i++) /* 5 all_gather for the metrics (ops #1..#5) */
    if (ccs_all_gather(&v, all, 1, CCS_INT32, comm, NULL) != CCS_OK) return 2;
  for (int i = 0; i < 5; i++) /* and 5 all_reduce (#6..#10) */
    if (ccs_all_reduce(&v, &out, 1, CCS_INT32, CCS_SUM, comm, NULL) != CCS_OK) return 2;
  if (rank == 1) { /* stuck: never calls #11, until the operator aborts */
    pause();
    return 0;
  }
  sh->blocked_rc[rank] = ccs_all_reduce(&v, &out, 1, CCS_INT32, CCS_SUM, comm, NULL);
  ccs_comm_destroy(comm);
  return sh->blocked_rc[rank] == CCS_ERR_ABORTED ? 0 : 3;
}

static void test_ccsctl(void **state) {
  sh = test_shared_new(sizeof(*sh));
  assert_non_null(sh);
  const char *args[] = {"--op-timeout", "60", NULL};
  assert_int_equal(test_daemon_start(&dmn, args), 0);
  test_new_id(&sh->id);
  pid_t runner = fork();
  if (runner == 0) { /* every rank but the stuck one (killed below) must succeed */
    int st[NRANKS];
    test_run_ranks(NRANKS, rank_main, NULL, 60, st);
    for (int r = 0; r < NRANKS; r++)
      if (st[r] != (r == 1 ? 128 + SIGTERM : 0)) {
        fprintf(stderr, "rank %d exited with %d\n", r, st[r]);
        _exit(1);
      }
    _exit(0);
  }
  static char out[1 << 16];
  /* wait for rank 0 to be blocked in op #11 */
  double deadline = test_now() + 20;
  do {
    usleep(100000);
    assert_int_equal(ccsctl(out, sizeof(out), "--json stuck 0.3"), 0);
  } while (!strstr(out, "\"op\": 11") && test_now() < deadline);
  char want[64];
  snprintf(want, sizeof(want), "\"missing\": [{\"rank\": 1, \"pid\": %d}]", sh->pids[1]);
  if (!strstr(out, want)) fail_msg("stuck did not name rank 1: %s", out);
  assert_int_equal(ccsctl(out, sizeof(out), "stuck 0.3"), 0);
  snprintf(want, sizeof(want), "not called by rank 1 (pid %d)", sh->pids[1]);
  assert_non_null(strstr(out, want));
  /* a younger threshold than the op's age lists nothing */
  assert_int_equal(ccsctl(out, sizeof(out), "stuck 3600"), 0);
  assert_non_null(strstr(out, "(none)"));
  assert_int_equal(ccsctl(out, sizeof(out), "status"), 0);
  assert_non_null(strstr(out, "ops in flight:"));
  assert_non_null(strstr(out, "all_reduce #11"));
  assert_int_equal(ccsctl(out, sizeof(out), "--json comms"), 0);
  unsigned long long comm = 0;
  const char *at = strstr(out, "\"comm\": ");
  assert_non_null(at);
  comm = strtoull(at + 8, NULL, 10);
  assert_non_null(strstr(out, "\"state\": \"ready\""));
  /* the operator aborts it: the blocked rank returns ABORTED */
  char cmd[64];
  snprintf(cmd, sizeof(cmd), "abort %llu", comm);
  assert_int_equal(ccsctl(out, sizeof(out), cmd), 0);
  kill(sh->pids[1], SIGTERM);
  int st;
  assert_int_equal(waitpid(runner, &st, 0), runner);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  assert_int_equal(sh->blocked_rc[0], CCS_ERR_ABORTED);
  assert_int_equal(sh->blocked_rc[2], CCS_ERR_ABORTED);
  /* no such comm; bad command lines */
  assert_int_equal(ccsctl(out, sizeof(out), "abort 999999 2>/dev/null"), 1);
  assert_int_equal(ccsctl(out, sizeof(out), "frobnicate 2>/dev/null"), 2);
  assert_int_equal(ccsctl(out, sizeof(out), "--json config"), 0);
  assert_non_null(strstr(out, "\"op_timeout\": \"60\""));
  /* metrics: 5 all_gather and 5 all_reduce x 3 ranks; the aborted calls
   * of ranks 0 and 2; bus bytes by the factors of 3 ranks */
  char check[1024];
  snprintf(check, sizeof(check),
           "%s --socket %s metrics | /usr/bin/python3 %s/tests/support/check_metrics.py --ranks %d "
           "all_gather=15 all_reduce=15 all_reduce=2,CCS_ERR_ABORTED",
           CCSCTL_PATH, dmn.socket, SOURCE_DIR, NRANKS);
  assert_int_equal(system(check), 0);
  assert_int_equal(test_daemon_stop(&dmn), 0);
  /* unreachable daemon */
  assert_int_equal(ccsctl(out, sizeof(out), "status 2>/dev/null"), 3);
}

/* Ranks calling checked all_reduce of 1 MiB until told to stop. */
static volatile int *stop_load;
static int load_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 1;
  enum { COUNT = 1 << 18 };
  int32_t *v = malloc(sizeof(int32_t) * COUNT);
  int bad = 0;
  for (int round = 0; !bad; round++) {
    /* whether to stop: the same for every rank (a rank that left early
     * would fail the others' call) */
    int stop = round >= 10 && *stop_load;
    bad = ccs_all_reduce(&stop, &stop, 1, CCS_INT32, CCS_MAX, comm, NULL) != CCS_OK;
    if (bad || stop) break;
    for (int i = 0; i < COUNT; i++) v[i] = rank * round + i;
    bad = ccs_all_reduce(v, v, COUNT, CCS_INT32, CCS_SUM, comm, NULL) != CCS_OK;
    for (int i = 0; !bad && i < COUNT; i++) bad = v[i] != round * n * (n - 1) / 2 + n * i;
  }
  free(v);
  return ccs_comm_destroy(comm) != CCS_OK || bad;
}

/* The executor threads' scheduling policy (stat field 41) that d runs
 * with: how many of its threads have `policy`. */
static int threads_with_policy(const struct test_daemon *d, int policy) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/task", (int)d->pid);
  char cmd[160];
  snprintf(cmd, sizeof(cmd), "awk '{ print $41 }' %s/*/stat | grep -cx %d", path, policy);
  FILE *p = popen(cmd, "r");
  int n = 0;
  if (p && fscanf(p, "%d", &n) != 1) n = 0;
  if (p) pclose(p);
  return n;
}

static void test_tenants(void **state) {
  (void)state;
  sh = test_shared_new(sizeof(*sh) + sizeof(int));
  assert_non_null(sh);
  stop_load = (volatile int *)(sh + 1);
  char conf[96];
  snprintf(conf, sizeof(conf), "/tmp/ccs-test-ops-%d.conf", (int)getpid());
  FILE *f = fopen(conf, "w");
  fprintf(f, "[ccsd]\ntenant_weights = root:2\nexecutor_priority = idle\nthreads = 2\n");
  fclose(f);
  const char *args[] = {"--config", conf, NULL};
  assert_int_equal(test_daemon_start(&dmn, args), 0);
  assert_int_equal(threads_with_policy(&dmn, 5 /* SCHED_IDLE */), 2);
  test_new_id(&sh->id);
  pid_t load = fork();
  if (load == 0) _exit(test_run_ranks(NRANKS, load_rank, NULL, 60, NULL) != 0);
  static char out[1 << 16];
  /* live: a share of the executor and a bus rate for root, weight 2 */
  assert_int_equal(ccsctl(out, sizeof(out), "top 0.5 2"), 0);
  fprintf(stderr, "%s", out);
  assert_non_null(strstr(out, "root(0)"));
  double weight = 0, cap = 0, share = 0, bus = 0;
  const char *row = strstr(out, "root(0)"); /* the last sample's row: the most calls behind it */
  for (const char *next; (next = strstr(row + 1, "root(0)"));) row = next;
  assert_int_equal(sscanf(row, "root(0) %lf %lf %lf%% %lf", &weight, &cap, &share, &bus), 4);
  assert_true(weight == 2 && cap == 1);
  assert_true(share > 99.0 && bus > 0); /* the only tenant */
  assert_int_equal(ccsctl(out, sizeof(out), "tenants"), 0);
  assert_non_null(strstr(out, "uid      weight"));
  unsigned uid;
  double w, calls;
  row = strstr(out, "\n  0 ");
  assert_non_null(row);
  assert_int_equal(sscanf(row, " %u %lf", &uid, &w), 2);
  assert_true(uid == 0 && w == 2);
  assert_int_equal(ccsctl(out, sizeof(out), "metrics"), 0);
  assert_non_null(strstr(out, "ccs_tenant_weight{tenant=\"0\"} 2\n"));
  row = strstr(out, "ccs_tenant_requests_total{tenant=\"0\"} ");
  assert_non_null(row);
  assert_int_equal(sscanf(strchr(row, '}') + 1, "%lf", &calls), 1);
  assert_true(calls >= NRANKS);
  assert_non_null(strstr(out, "ccs_tenant_executor_seconds_total{tenant=\"0\"} "));
  assert_non_null(strstr(out, "ccs_tenant_queue_wait_seconds_bucket{tenant=\"0\""));
  /* SIGHUP: the file's new weight, nothing dropped (the load goes on) */
  f = fopen(conf, "w");
  fprintf(f, "[ccsd]\ntenant_weights = root:5\nexecutor_priority = idle\nthreads = 2\n");
  fclose(f);
  kill(dmn.pid, SIGHUP);
  double deadline = test_now() + 10;
  do {
    usleep(50000);
    assert_int_equal(ccsctl(out, sizeof(out), "tenants"), 0);
    row = strstr(out, "\n  0 ");
  } while (!(row && sscanf(row, " %u %lf", &uid, &w) == 2 && w == 5) && test_now() < deadline);
  assert_true(w == 5);
  *stop_load = 1;
  int st;
  assert_int_equal(waitpid(load, &st, 0), load);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_int_equal(test_daemon_stop(&dmn), 0);
  unlink(conf);
  test_shared_free(sh, sizeof(*sh) + sizeof(int));
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_ccsctl), cmocka_unit_test(test_tenants)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
