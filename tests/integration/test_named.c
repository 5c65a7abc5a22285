/* Communicators found by name (ccs_comm_init_named, ccs_comm_init_from_env):
 * ranks that meet with no id passed around, on one daemon and across
 * daemons meeting at CCS_ROOT; every launcher's variables as it sets them;
 * a name in use by a running job refused with a text naming it, the job
 * untouched; another user's comm of the same name is another comm; a rank
 * that never comes fails init with the init deadline's text. Each comm
 * checks an all_reduce of fresh random int64s element by element. */
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
#include "raw.h"
#include "wire.h"

#define COUNT 37
#define MAXR 8

struct shared {
  uint64_t seed;
  int code[MAXR];
  char text[MAXR][512];
  int joined; /* ranks of the first job that joined (atomically) */
  int done;   /* the second job has spoken */
  int want;   /* the first job's ranks that join before the second speaks */
  int go;     /* test_newcomer_meets_a_complete_map: daemon 1 is stopped */
  int answered; /* ... and the newcomer's init has returned */
};
static struct shared *sh;
static struct test_daemon dm[2];

/* Two daemons, for two tenants, whose comms wait `init_timeout` seconds
 * for their ranks: long where a job's ranks wait on another job's refusals
 * (slow under a loaded machine), short where a rank never comes. */
static int setup_with(const char *init_timeout) {
  unsetenv("CCS_ROOT"); /* whatever a failed test before left */
  sh = test_shared_new(sizeof(*sh));
  const char *args[] = {"--init-timeout", init_timeout, "--socket-mode", "0666", NULL};
  if (!sh || test_daemons_start(dm, 2, args)) return -1;
  sh->seed = test_seed();
  return 0;
}
static int setup(void **state) {
  (void)state;
  return setup_with("60");
}
static int setup_short(void **state) {
  (void)state;
  return setup_with("8");
}

static int teardown(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++) test_daemon_stop(&dm[i]);
  test_shared_free(sh, sizeof(*sh));
  return 0;
}

static int64_t input(int rank, int i, uint64_t salt) {
  return (int64_t)test_mix(sh->seed ^ salt, (uint64_t)(rank * COUNT + i));
}

/* An all_reduce on comm, checked (integer sums wrap, as guaranteed). */
static int check(ccs_comm_t *comm, uint64_t salt) {
  int rank, n;
  ccs_comm_user_rank(comm, &rank);
  ccs_comm_count(comm, &n);
  int64_t v[COUNT];
  for (int i = 0; i < COUNT; i++) v[i] = input(rank, i, salt);
  ccs_result_t rc = ccs_all_reduce(v, v, COUNT, CCS_INT64, CCS_SUM, comm, NULL);
  if (rc != CCS_OK) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(comm));
    return 1;
  }
  for (int i = 0; i < COUNT; i++) {
    uint64_t want = 0;
    for (int r = 0; r < n; r++) want += (uint64_t)input(r, i, salt);
    if ((uint64_t)v[i] != want) {
      fprintf(stderr, "rank %d: [%d] = %lld, want %lld\n", rank, i, (long long)v[i], (long long)want);
      return 1;
    }
  }
  return 0;
}

static int named_rank(int rank, int n, void *arg) {
  ccs_comm_t *comm;
  ccs_result_t rc = ccs_comm_init_named(&comm, arg, n, rank);
  if (rc != CCS_OK) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(NULL));
    return 2;
  }
  int bad = check(comm, 1) | check(comm, 2);
  return ccs_comm_destroy(comm) != CCS_OK || bad;
}

static void test_one_daemon(void **state) {
  (void)state;
  test_spread_ranks(dm, 1);
  for (int n = 1; n <= 5; n += 2) assert_int_equal(test_run_ranks(n, named_rank, "one daemon", 30, NULL), 0);
  /* the name serves again once its comm is gone */
  assert_int_equal(test_run_ranks(3, named_rank, "one daemon", 30, NULL), 0);
}

/* Daemon 0's port for daemons (what its ids name as their root) as
 * CCS_ROOT: its ranks and daemon 1's meet there. */
static void meet_at_daemon_0(void) {
  ccs_unique_id_t id;
  setenv("CCS_SOCKET", dm[0].socket, 1);
  assert_int_equal(ccs_get_unique_id(&id), CCS_OK);
  const char *root = ((const struct ccs__unique_id *)id.internal)->root;
  assert_true(root[0]);
  setenv("CCS_ROOT", root, 1);
}

static void test_across_daemons(void **state) {
  (void)state;
  meet_at_daemon_0();
  test_spread_ranks(dm, 2);
  for (int n = 2; n <= 5; n += 3) assert_int_equal(test_run_ranks(n, named_rank, "two daemons", 30, NULL), 0);
  unsetenv("CCS_ROOT");
  test_spread_ranks(dm, 1);
}

/* The launchers' variables, set per rank as each launcher sets them. */
enum launcher { OMPI, SLURM, TORCHRUN, PMI, NLAUNCHERS };
static int env_rank(int rank, int n, void *arg) {
  char r[16], s[16];
  snprintf(r, sizeof(r), "%d", rank);
  snprintf(s, sizeof(s), "%d", n);
  switch (*(enum launcher *)arg) {
  case OMPI:
    setenv("OMPI_COMM_WORLD_RANK", r, 1), setenv("OMPI_COMM_WORLD_SIZE", s, 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", s, 1), setenv("PMIX_NAMESPACE", "4242", 1);
    break;
  case SLURM:
    setenv("SLURM_PROCID", r, 1), setenv("SLURM_NTASKS", s, 1), setenv("SLURM_JOB_ID", "77", 1);
    setenv("SLURM_STEP_ID", "0", 1), setenv("SLURM_JOB_NUM_NODES", "1", 1);
    break;
  case TORCHRUN:
    setenv("RANK", r, 1), setenv("WORLD_SIZE", s, 1), setenv("LOCAL_WORLD_SIZE", s, 1);
    setenv("TORCHELASTIC_RUN_ID", "run-9", 1);
    break;
  default:
    setenv("PMI_RANK", r, 1), setenv("PMI_SIZE", s, 1), setenv("CCS_JOB", "pmi-job", 1);
    break;
  }
  ccs_comm_t *comm;
  ccs_result_t rc = ccs_comm_init_from_env(&comm);
  if (rc != CCS_OK) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(NULL));
    return 2;
  }
  int got_rank, got_n;
  ccs_comm_user_rank(comm, &got_rank);
  ccs_comm_count(comm, &got_n);
  int bad = got_rank != rank || got_n != n || check(comm, 3);
  return ccs_comm_destroy(comm) != CCS_OK || bad;
}

static void test_launchers(void **state) {
  (void)state;
  test_spread_ranks(dm, 1);
  for (enum launcher l = 0; l < NLAUNCHERS; l++)
    assert_int_equal(test_run_ranks(3, env_rank, &l, 30, NULL), 0);
  /* without a launcher: a usage error saying so */
  ccs_comm_t *comm;
  assert_int_equal(ccs_comm_init_from_env(&comm), CCS_ERR_INVALID_USAGE);
  assert_non_null(strstr(ccs_comm_last_error(NULL), "no launcher's rank"));
}

/* Until d holds a comm (some) or none (!some); 0, or -1 after 60 s. */
static int wait_for_comms(const struct test_daemon *d, int some) { return raw_wait_comms(d->socket, some, 60); }
static void wait_for_a_comm(const struct test_daemon *d) { (void)wait_for_comms(d, 1); }

/* A first job holds the name (3 ranks; `want` of them join before the
 * second speaks); a second job's ranks of the same name are refused, each
 * saying why; the first job's comm is untouched and works. */
static int first_job(int rank, int n, void *arg) {
  if (rank >= sh->want)
    while (!__atomic_load_n(&sh->done, __ATOMIC_SEQ_CST)) usleep(1000);
  /* rank 0 in at the root first: there a comm made for rank 1's join
   * from daemon 1 would let the second job's rank 0 take rank 0's place */
  if (rank == 1 && sh->want == 2) wait_for_a_comm(&dm[0]);
  ccs_comm_t *comm;
  if (ccs_comm_init_named(&comm, arg, n, rank) != CCS_OK) return 2;
  __atomic_add_fetch(&sh->joined, 1, __ATOMIC_SEQ_CST);
  while (!__atomic_load_n(&sh->done, __ATOMIC_SEQ_CST)) usleep(1000); /* it holds the name */
  int bad = check(comm, 4);
  return ccs_comm_destroy(comm) != CCS_OK || bad;
}

/* rank 0 asks for the first job's size, rank 1 for another */
static int second_job(int rank, void *arg) {
  if (sh->want == 3) {
    while (__atomic_load_n(&sh->joined, __ATOMIC_SEQ_CST) < 3) usleep(1000);
  } else { /* the first job's comm is there, forming: the daemons say so */
    wait_for_a_comm(&dm[0]);
    if (sh->want == 2) wait_for_a_comm(&dm[1]);
  }
  ccs_comm_t *comm;
  ccs_result_t rc = ccs_comm_init_named(&comm, arg, rank == 0 ? 3 : 2, 0);
  sh->code[rank] = rc;
  snprintf(sh->text[rank], sizeof(sh->text[rank]), "%s", ccs_comm_last_error(NULL));
  if (rc == CCS_OK) ccs_comm_destroy(comm);
  return 0;
}

static int both_jobs(int rank, int n, void *arg) {
  (void)n;
  if (rank < 3) return first_job(rank, 3, arg);
  int rc = second_job(rank - 3, arg);
  if (__atomic_add_fetch(&sh->code[7], 1, __ATOMIC_SEQ_CST) == 2) __atomic_store_n(&sh->done, 1, __ATOMIC_SEQ_CST);
  return rc;
}

static void run_both(int want, const char *name) {
  /* the comms of a run before are gone (their ranks' hang-ups seen): the
   * second job waits on the daemons' comms, which must be the first job's */
  for (int i = 0; i < 2; i++) assert_int_equal(wait_for_comms(&dm[i], 0), 0);
  sh->joined = sh->done = sh->code[7] = 0;
  sh->want = want;
  assert_int_equal(test_run_ranks(5, both_jobs, (void *)name, 90, NULL), 0);
  for (int r = 0; r < 2; r++) {
    fprintf(stderr, "# second job, rank %d: %s: %s\n", r, ccs_result_name(sh->code[r]), sh->text[r]);
    assert_int_equal(sh->code[r], CCS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(sh->text[r], name));
    assert_non_null(strstr(sh->text[r], "another job"));
  }
}

static void test_name_in_use(void **state) {
  (void)state;
  test_spread_ranks(dm, 1);
  run_both(3, "busy"); /* every rank of the first job is in */
  assert_non_null(strstr(sh->text[0], "in use"));
  assert_non_null(strstr(sh->text[1], "in use"));
  run_both(1, "forming"); /* only its rank 0: the second job's rank 0 is taken, its size differs */
  assert_non_null(strstr(sh->text[0], "rank 0 of the communicator named 'forming'"));
  assert_non_null(strstr(sh->text[1], "has 3 ranks, this rank asks for 2"));
}

/* The same across daemons: the first job's rank 0 forms the comm at the
 * root (daemon 0); the second job's rank 0 asks through daemon 1, where
 * nothing of that name is, so the root refuses it, naming the name; its
 * rank 1 is refused by daemon 0 itself. Then with the first job's rank 1
 * already in at daemon 1: the root refuses the newcomer there, and the
 * first job's comm on daemon 1 goes on (its all_reduce checked). */
static void test_name_in_use_across_daemons(void **state) {
  (void)state;
  meet_at_daemon_0();
  test_spread_ranks(dm, 2); /* ranks 0, 2, 4 on daemon 0; 1, 3 on daemon 1 */
  run_both(1, "forming far");
  assert_non_null(strstr(sh->text[0], "rank 0 of the communicator named 'forming far'"));
  assert_non_null(strstr(sh->text[1], "has 3 ranks, this rank asks for 2"));
  run_both(2, "forming farther");
  assert_non_null(strstr(sh->text[0], "rank 0 of the communicator named 'forming farther'"));
  assert_non_null(strstr(sh->text[1], "has 3 ranks, this rank asks for 2"));
  unsetenv("CCS_ROOT");
  test_spread_ranks(dm, 1);
}

/* The newcomer's join reaches the root after the running job's last one,
 * which completes the comm: the root refuses it, but its daemon gets the
 * rank map first, placing that rank at the root. Daemon 1 is stopped
 * while the first job's rank 1 and the newcomer (rank 0 again) connect to
 * it, so that both come in together when it goes on; in whichever order
 * the daemons then hear of them, the newcomer alone is refused (by the
 * root, by its own daemon from the map, or there once the comm is
 * complete) and the first job's all_reduce is right. The first job keeps
 * its comm until the newcomer is answered: its join may reach the root
 * after the job's all_reduce (its connection's first calls go before it),
 * and a name no comm holds any more is free. Process 3 stops and resumes
 * daemon 1. */
static int complete_map_rank(int rank, int n, void *arg) {
  (void)n;
  ccs_comm_t *comm;
  if (rank == 3) {
    wait_for_a_comm(&dm[0]); /* the first job's rank 0 is in */
    if (kill(dm[1].pid, SIGSTOP)) return 3;
    __atomic_store_n(&sh->go, 1, __ATOMIC_SEQ_CST);
    usleep(300000); /* both connect meanwhile */
    return kill(dm[1].pid, SIGCONT) != 0;
  }
  if (rank > 0) {
    while (!__atomic_load_n(&sh->go, __ATOMIC_SEQ_CST)) usleep(1000);
    setenv("CCS_SOCKET", dm[1].socket, 1);
    if (rank == 2) usleep(20000);
  }
  ccs_result_t rc = ccs_comm_init_named(&comm, arg, 2, rank == 2 ? 0 : rank);
  if (rank == 2) { /* the newcomer */
    sh->code[0] = rc;
    snprintf(sh->text[0], sizeof(sh->text[0]), "%s", ccs_comm_last_error(NULL));
    __atomic_store_n(&sh->answered, 1, __ATOMIC_SEQ_CST);
    if (rc == CCS_OK) ccs_comm_destroy(comm);
    return 0;
  }
  if (rc != CCS_OK) {
    fprintf(stderr, "first job, rank %d: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(NULL));
    return 2;
  }
  int bad = check(comm, 6);
  for (double until = test_now() + 25; !__atomic_load_n(&sh->answered, __ATOMIC_SEQ_CST) && test_now() < until;)
    usleep(1000);
  return ccs_comm_destroy(comm) != CCS_OK || bad;
}

static void test_newcomer_meets_a_complete_map(void **state) {
  (void)state;
  meet_at_daemon_0();
  for (int round = 0; round < 3; round++) {
    sh->go = 0;
    sh->answered = 0;
    test_spread_ranks(dm, 1); /* all on daemon 0 but those that move to 1 */
    char name[32];
    snprintf(name, sizeof(name), "complete map %d", round);
    assert_int_equal(test_run_ranks(4, complete_map_rank, name, 30, NULL), 0);
    fprintf(stderr, "# newcomer: %s: %s\n", ccs_result_name(sh->code[0]), sh->text[0]);
    /* refused by the root, from the rank map, or by its daemon once the
     * comm is complete there: each names the comm and the likely cause */
    assert_int_equal(sh->code[0], CCS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(sh->text[0], name));
    assert_non_null(strstr(sh->text[0], "another job"));
  }
  unsetenv("CCS_ROOT");
}

/* Ranks of another user naming the same comm: a comm of their own. */
static int tenant_rank(int rank, int n, void *arg) {
  (void)arg;
  if (rank >= n / 2) test_become_other_tenant();
  ccs_comm_t *comm;
  ccs_result_t rc = ccs_comm_init_named(&comm, "shared name", n / 2, rank % (n / 2));
  if (rc != CCS_OK) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(NULL));
    return 2;
  }
  int bad = check(comm, 5 + (uint64_t)(rank >= n / 2));
  return ccs_comm_destroy(comm) != CCS_OK || bad;
}

static void test_other_user_same_name(void **state) {
  (void)state;
  test_spread_ranks(dm, 1);
  assert_int_equal(test_run_ranks(4, tenant_rank, NULL, 30, NULL), 0);
}

/* A rank that never comes: init fails with the deadline's text. */
static int lonely_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  ccs_result_t rc = ccs_comm_init_named(&comm, "lonely", n + 1, rank);
  sh->code[rank] = rc;
  snprintf(sh->text[rank], sizeof(sh->text[rank]), "%s", ccs_comm_last_error(NULL));
  return 0;
}

static void test_rank_never_comes(void **state) {
  (void)state;
  test_spread_ranks(dm, 1);
  assert_int_equal(test_run_ranks(2, lonely_rank, NULL, 30, NULL), 0);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(sh->code[r], CCS_ERR_TIMEOUT);
    assert_non_null(strstr(sh->text[r], "rank(s) 2 never called"));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_one_daemon, setup, teardown),
      cmocka_unit_test_setup_teardown(test_across_daemons, setup, teardown),
      cmocka_unit_test_setup_teardown(test_launchers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_name_in_use, setup, teardown),
      cmocka_unit_test_setup_teardown(test_name_in_use_across_daemons, setup, teardown),
      cmocka_unit_test_setup_teardown(test_newcomer_meets_a_complete_map, setup, teardown),
      cmocka_unit_test_setup_teardown(test_other_user_same_name, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rank_never_comes, setup_short, teardown),
  };
  TEST_ONLY_FROM_ENV();
  return cmocka_run_group_tests(tests, NULL, NULL);
}
