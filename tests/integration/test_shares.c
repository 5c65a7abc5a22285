/* Two tenants (root and TEST_OTHER_UID) flood one daemon with large
 * all_reduce at once: both progress, the one with the larger weight gets
 * the larger share of executor time, and a reload that swaps the weights
 * (the config file rewritten, ccsctl's `config reload`) swaps the split.
 * Asserted are directions and progress, counted by the daemon (`tenants
 * raw`) over a window in which both flood, not times; one executor thread, so that the split is the
 * scheduler's and not the CPUs'. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "frames.h"
#include "harness.h"
#include "raw.h"
#include "serving.h"

#define FLOOD_S 2.0

struct shared {
  ccs_unique_id_t ids[2];
  int done[2];     /* ops each tenant completed */
  int stop;        /* the window is over: the tenants stop */
  double exec[2];  /* each tenant's executor seconds in the window */
};
static struct shared *sh;
static struct test_daemon dmn;
static char config[128];

static char *admin(const char *command, char *arg) {
  int fd = raw_connect(dmn.socket);
  raw_hello(fd);
  char *args[] = {arg};
  raw_send_frame(fd, frame_admin(2, command, args, 1, 0), -1);
  Ccs__Reply *r = raw_reply(fd);
  close(fd);
  assert_non_null(r);
  if (r->status != CCS_OK) fail_msg("%s %s: %s", command, arg, r->error);
  char *text = strdup(r->admin->text);
  ccs__reply__free_unpacked(r, NULL);
  return text;
}

/* uid's weight and executor seconds, from `tenants raw` (0 if absent). */
static void account(unsigned uid, double *weight, double *exec_s) {
  char *text = admin("tenants", "raw");
  *weight = *exec_s = 0;
  for (char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
    unsigned u;
    double w, cap, e;
    if (sscanf(line, "%u %lf %lf %lf", &u, &w, &cap, &e) == 4 && u == uid) *weight = w, *exec_s = e;
  }
  free(text);
}

static void write_weights(int root_weight, int other_weight) {
  FILE *f = fopen(config, "w");
  assert_non_null(f);
  fprintf(f, "[ccsd]\ntenant_weights = 0:%d,%d:%d\n", root_weight, TEST_OTHER_UID, other_weight);
  fclose(f);
}

/* Ranks 0-1 are root's comm, 2-3 the other tenant's: 64 MiB all_reduce
 * (256 executor tasks each), out of place from inputs written once, so
 * that the ranks come back at once and their tenant keeps work queued,
 * until the window is over (rank 0's word rides in the data: one element
 * more). */
static int flooding_rank(int rank, int n, void *arg) {
  (void)n, (void)arg;
  int tenant = rank / 2, me = rank % 2;
  if (tenant) test_become_other_tenant();
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, 2, sh->ids[tenant], me) != CCS_OK) return 1;
  size_t count = 16 << 20;
  float *x, *y;
  if (ccs_mem_alloc((void **)&x, (count + 1) * sizeof(float)) != CCS_OK ||
      ccs_mem_alloc((void **)&y, (count + 1) * sizeof(float)) != CCS_OK)
    return 2;
  for (size_t i = 0; i < count; i++) x[i] = (float)(me + 1);
  for (int k = 0, more = 1; more; k++) {
    x[count] = me == 0 && !__atomic_load_n(&sh->stop, __ATOMIC_SEQ_CST);
    y[k % count] = 0;
    if (ccs_all_reduce(x, y, count + 1, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK) return 3;
    for (size_t i = (size_t)k % 4099; i < count; i += 4099)
      if (y[i] != 3) return 4;
    if (y[k % count] != 3) return 4;
    more = y[count] != 0;
    if (me == 0) sh->done[tenant] = k + 1;
  }
  ccs_mem_free(x);
  ccs_mem_free(y);
  ccs_comm_destroy(comm);
  return 0;
}

/* In a child: once both tenants completed an op (both flood), their
 * executor time over FLOOD_S seconds; then the tenants stop. */
static pid_t window(void) {
  pid_t p = fork();
  if (p) return p;
  while (!__atomic_load_n(&sh->done[0], __ATOMIC_SEQ_CST) || !__atomic_load_n(&sh->done[1], __ATOMIC_SEQ_CST))
    usleep(1000);
  double w, before[2], after[2];
  account(0, &w, &before[0]);
  account(TEST_OTHER_UID, &w, &before[1]);
  usleep((useconds_t)(FLOOD_S * 1e6));
  account(0, &w, &after[0]);
  account(TEST_OTHER_UID, &w, &after[1]);
  for (int t = 0; t < 2; t++) sh->exec[t] = after[t] - before[t];
  __atomic_store_n(&sh->stop, 1, __ATOMIC_SEQ_CST);
  _exit(0);
}

/* One flood; each tenant's share of the executor time in its window. */
static void flood(double share[2]) {
  double w, wr, seconds;
  test_new_id(&sh->ids[0]);
  test_other_tenant_id(&sh->ids[1]);
  sh->done[0] = sh->done[1] = sh->stop = 0;
  pid_t child = window();
  int rc = test_run_ranks(4, flooding_rank, NULL, 300, NULL), st;
  __atomic_store_n(&sh->stop, 1, __ATOMIC_SEQ_CST);
  waitpid(child, &st, 0);
  assert_int_equal(rc, 0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  account(0, &wr, &seconds);
  account(TEST_OTHER_UID, &w, &seconds);
  double total = sh->exec[0] + sh->exec[1];
  for (int t = 0; t < 2; t++) share[t] = total > 0 ? sh->exec[t] / total : 0;
  fprintf(stderr, "# weights %g:%g: root %.1f%% (%d ops), other %.1f%% (%d ops)\n", wr, w, 100 * share[0], sh->done[0],
          100 * share[1], sh->done[1]);
  assert_true(sh->done[0] >= 1 && sh->done[1] >= 1); /* every op's data checked */
}

static void test_weights_and_reload_move_the_split(void **state) {
  (void)state;
  double share[2], w, seconds;
  flood(share);
  assert_true(share[0] > share[1]); /* 3:1 */
  assert_true(share[1] > 0.05);
  /* swapped by a reload: the file rewritten, nothing restarted */
  write_weights(1, 3);
  free(admin("config", "reload"));
  for (int i = 0; i < 200; i++) { /* applied on the loop, after the file is read */
    account(TEST_OTHER_UID, &w, &seconds);
    if (w == 3) break;
    usleep(10000);
  }
  assert_true(w == 3);
  flood(share);
  assert_true(share[1] > share[0]);
  assert_true(share[0] > 0.05);
}

static int setup(void **state) {
  (void)state;
  sh = test_shared_new(sizeof(*sh));
  snprintf(config, sizeof(config), "/tmp/ccs-shares-test-%d.conf", (int)getpid());
  write_weights(3, 1);
  const char *args[] = {"--config", config, "--socket-mode", "0666", "--threads", "1", NULL};
  return sh ? test_daemon_start(&dmn, args) : -1;
}

static int teardown(void **state) {
  (void)state;
  int rc = test_daemon_stop(&dmn);
  unlink(config);
  test_shared_free(sh, sizeof(*sh));
  return rc;
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_weights_and_reload_move_the_split)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
