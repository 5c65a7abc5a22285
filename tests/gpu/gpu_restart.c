/* A job on a GPU rides through a restart of its daemon (docs/restart.md):
 * ranks on GPU 0 run rounds of calls on device buffers, on the NULL
 * stream, taking turns:
 *
 *   0  all_reduce in place on ccs_mem_alloc_device memory (mapped by the
 *      daemon: after a restart the new daemon maps it again)
 *   1  all_reduce out of place between cudaMalloc buffers (staged by libccs)
 *   2  all_gather from one registered device buffer into another
 *
 * while the daemon is killed (SIGKILL) or stopped (SIGTERM) with rank 0
 * alone in a call, or dies as an op starts (CCSD_FAILPOINT=started), and
 * is started again on the same socket; and with the ranks on two daemons
 * (libccs stages device buffers through host memory there), the second
 * killed or stopped while rank 0 waits at the first, which holds the comm
 * for it. Every call ends right, its result
 * copied back and checked element by element against values computed on
 * the host, or, where it ran in place, with CCS_ERR_RETRY on every rank,
 * which then fills its inputs again and repeats it. Needs a GPU (tests/gpu/run.sh restart);
 * without one it says so and exits 77. */
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
#include <cuda_runtime_api.h>

#include "have_gpu.h"
#include "harness.h"
#include "raw.h"
#include "serving.h"

#define COUNT 100003 /* int64s: 800 KB */
#define GATHER 1000  /* int64s each rank gives an all_gather */
#define KINDS 3
#define ROUNDS 12
#define HOLD_ROUND 5 /* the round rank 0 calls alone when the daemon goes */
#define MAXR 4

struct shared {
  ccs_unique_id_t id;
  uint64_t seed;
  int hold, hold_round, at_hold;
  int retried[MAXR], ok[MAXR];
};
static struct shared *sh;

static int64_t value(int rank, int round, size_t i) {
  return (int64_t)(test_mix(sh->seed + (uint64_t)round, (uint64_t)rank * COUNT + i) % 100000);
}

struct bufs {
  int64_t *reg, *gathered; /* ccs_mem_alloc_device */
  int64_t *plain, *out;    /* cudaMalloc */
  int64_t *host;           /* n * COUNT: inputs written and results read here */
};

/* Writes the call's inputs (a repeated in-place call overwrote them) and
 * waits for them to land: the call reads them from another process. */
static int fill(int kind, int rank, int round, const struct bufs *b) {
  size_t count = kind == 2 ? GATHER : COUNT;
  for (size_t i = 0; i < count; i++) b->host[i] = value(rank, round, i);
  int64_t *to = kind == 1 ? b->plain : b->reg;
  return cudaMemcpy(to, b->host, count * sizeof(int64_t), cudaMemcpyHostToDevice) != cudaSuccess ||
         cudaDeviceSynchronize() != cudaSuccess;
}

static ccs_result_t call(int kind, int n, ccs_comm_t *comm, const struct bufs *b) {
  (void)n;
  switch (kind) {
  case 0: return ccs_all_reduce(b->reg, b->reg, COUNT, CCS_INT64, CCS_SUM, comm, NULL);
  case 1: return ccs_all_reduce(b->plain, b->out, COUNT, CCS_INT64, CCS_SUM, comm, NULL);
  default: return ccs_all_gather(b->reg, b->gathered, GATHER, CCS_INT64, comm, NULL);
  }
}

/* The result back on the host, element by element against the reference. */
static int checked(int kind, int rank, int n, int round, const struct bufs *b) {
  size_t count = kind == 2 ? GATHER * (size_t)n : COUNT;
  const int64_t *from = kind == 0 ? b->reg : kind == 1 ? b->out : b->gathered;
  if (cudaMemcpy(b->host, from, count * sizeof(int64_t), cudaMemcpyDeviceToHost) != cudaSuccess) {
    fprintf(stderr, "rank %d round %d: copying the result back failed\n", rank, round);
    return 1;
  }
  for (size_t i = 0; i < count; i++) {
    int64_t want = 0;
    if (kind == 2) want = value((int)(i / GATHER), round, i % GATHER);
    else
      for (int r = 0; r < n; r++) want += value(r, round, i);
    if (b->host[i] != want) {
      fprintf(stderr, "rank %d round %d kind %d [%zu] = %lld, want %lld\n", rank, round, kind, i,
              (long long)b->host[i], (long long)want);
      return 1;
    }
  }
  return 0;
}

static int rank_main(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  struct bufs b = {0};
  b.host = malloc(sizeof(int64_t) * COUNT * MAXR);
  if (!b.host || cudaSetDevice(0) != cudaSuccess) return 10;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) {
    fprintf(stderr, "rank %d: init: %s\n", rank, ccs_comm_last_error(NULL));
    return 11;
  }
  if (ccs_mem_alloc_device((void **)&b.reg, sizeof(int64_t) * COUNT, 0) != CCS_OK ||
      ccs_mem_alloc_device((void **)&b.gathered, sizeof(int64_t) * GATHER * MAXR, 0) != CCS_OK ||
      cudaMalloc((void **)&b.plain, sizeof(int64_t) * COUNT) != cudaSuccess ||
      cudaMalloc((void **)&b.out, sizeof(int64_t) * COUNT) != cudaSuccess)
    return 12;
  int bad = 0;
  for (int round = 0; round < ROUNDS && !bad; round++) {
    if (round == sh->hold_round) {
      if (rank > 0)
        while (__atomic_load_n(&sh->hold, __ATOMIC_SEQ_CST)) usleep(1000);
      else
        __atomic_add_fetch(&sh->at_hold, 1, __ATOMIC_SEQ_CST);
    }
    int kind = round % KINDS, tries = 0;
    ccs_result_t rc;
    do {
      if (fill(kind, rank, round, &b)) return 13;
      rc = call(kind, n, comm, &b);
    } while (rc == CCS_ERR_RETRY && tries++ < 3 && ++sh->retried[rank]);
    if (rc != CCS_OK) {
      fprintf(stderr, "rank %d round %d kind %d: %s: %s\n", rank, round, kind, ccs_result_name(rc),
              ccs_comm_last_error(comm));
      bad = 1;
      break;
    }
    sh->ok[rank]++;
    bad |= checked(kind, rank, n, round, &b);
  }
  ccs_mem_free(b.reg), ccs_mem_free(b.gathered);
  cudaFree(b.plain), cudaFree(b.out), free(b.host);
  bad |= ccs_comm_destroy(comm) != CCS_OK;
  return bad;
}

/* One daemon, or two (rank r on daemon r % 2, device buffers through
 * host memory) of which the second goes and the first holds the comm for
 * it (peer_restart_grace). */
static struct test_daemon dmn[2];
static int ndaemons;
static char listen_at[2][32];

static int start(int k, int again) {
  const char *args[] = {"--listen", listen_at[k], "--cluster-key-file", test_cluster_key(),
                        "--peer-restart-grace", "30", NULL};
  const char *const *extra = ndaemons > 1 ? args : NULL;
  return again ? test_daemon_restart(&dmn[k], extra) : test_daemon_start(&dmn[k], extra);
}

static void stop(void) {
  test_spread_ranks(NULL, 0);
  for (int k = 0; k < ndaemons; k++) test_daemon_stop(&dmn[k]);
}

/* The ranks' rounds while the last daemon goes: where `failpoint` says,
 * else with rank 0 alone in HOLD_ROUND's call at the first (killed, or
 * stopped when `term`); started again each time. retry: every rank
 * repeated one call (1), none did (0). */
static void run(int daemons, int n, const char *failpoint, int term, int retry) {
  memset(sh, 0, sizeof(*sh));
  sh->seed = test_seed();
  sh->hold_round = failpoint ? -1 : HOLD_ROUND;
  sh->hold = !failpoint;
  ndaemons = daemons;
  for (int k = 0; k < daemons; k++) {
    snprintf(listen_at[k], sizeof(listen_at[k]), "127.0.0.1:%d", test_free_port());
    if (failpoint && k == daemons - 1) setenv("CCSD_FAILPOINT", failpoint, 1);
    assert_int_equal(start(k, 0), 0);
    unsetenv("CCSD_FAILPOINT");
  }
  setenv("CCS_SOCKET", dmn[0].socket, 1);
  test_new_id(&sh->id);
  if (daemons > 1) test_spread_ranks(dmn, daemons);
  struct test_daemon *victim = &dmn[daemons - 1];
  pid_t ranks = fork();
  if (ranks == 0) {
    int st[MAXR], bad = 0;
    test_run_ranks(n, rank_main, NULL, 120, st);
    for (int r = 0; r < n; r++) bad |= st[r] != 0;
    _exit(bad);
  }
  int restarts = 0, status = -1;
  if (!failpoint) {
    for (double until = test_now() + 60; !__atomic_load_n(&sh->at_hold, __ATOMIC_SEQ_CST) && test_now() < until;)
      usleep(1000);
    raw_wait_ops_in_flight(dmn[0].socket, 1, 60);
    if (term) assert_int_equal(test_daemon_term(victim), 0);
    else test_daemon_kill(victim);
    assert_int_equal(start(daemons - 1, 1), 0);
    restarts++;
    __atomic_store_n(&sh->hold, 0, __ATOMIC_SEQ_CST);
  }
  while (waitpid(ranks, &status, WNOHANG) != ranks) {
    if (victim->pid > 0 && !test_daemon_alive(victim)) { /* the failpoint: as systemd, start it again */
      test_daemon_kill(victim);
      assert_int_equal(start(daemons - 1, 1), 0);
      restarts++;
    }
    usleep(2000);
  }
  int retried = 0, ok = 0;
  for (int r = 0; r < n; r++) retried += sh->retried[r], ok += sh->ok[r];
  fprintf(stderr, "# %s, %d ranks on %d daemon(s): %d restart(s); %d calls right, %d repeated after "
          "CCS_ERR_RETRY\n", failpoint ? failpoint : term ? "SIGTERM" : "SIGKILL while rank 0 waits",
          n, daemons, restarts, ok, retried);
  stop();
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(restarts, 1);
  assert_int_equal(ok, n * ROUNDS);
  assert_int_equal(retried, retry ? n : 0);
}

static void test_killed_while_waiting(void **state) {
  (void)state;
  run(1, 3, NULL, 0, 0);
}
static void test_stopped_while_waiting(void **state) {
  (void)state;
  run(1, 2, NULL, 1, 0);
}
/* op 4 (round 3) in place on registered memory: repeated; op 5 (round 4)
 * staged and op 3 (round 2) out of place on registered memory: resubmitted */
static void test_died_as_it_started(void **state) {
  (void)state;
  run(1, 2, "started:4", 0, 1);
  run(1, 3, "started:5", 0, 0);
  run(1, 2, "started:3", 0, 0);
}
/* the second of two daemons killed or stopped while rank 0 waits at the
 * first, which holds the comm: the calls there wait and go on */
static void test_across_daemons(void **state) {
  (void)state;
  run(2, 3, NULL, 0, 0);
  run(2, 2, NULL, 1, 0);
}

static int teardown(void **state) {
  (void)state;
  stop();
  return 0;
}

int main(void) {
  if (!test_have_gpu("gpu_restart")) return 77;
  sh = test_shared_new(sizeof(*sh));
  if (!sh) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_killed_while_waiting, teardown),
      cmocka_unit_test_teardown(test_stopped_while_waiting, teardown),
      cmocka_unit_test_teardown(test_died_as_it_started, teardown),
      cmocka_unit_test_teardown(test_across_daemons, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
