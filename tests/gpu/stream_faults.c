/* Faults while a call in a CUDA stream's order is out, on a GPU: the call
 * returned at once, its stream waits for the daemon's `done` flag, and
 * every way the call can end must let that stream go, or a job blocked in
 * cudaStreamSynchronize would wait forever (docs/gpus.md). Each case
 * posts an all_reduce on a stream that the other rank never matches, then:
 *
 *   peer_killed     the other rank dies (SIGKILL)
 *   daemon_killed   the daemon dies (SIGKILL)
 *   daemon_stopped  the daemon stops (SIGSTOP) and its beat stands still
 *   aborted         the caller aborts its comm
 *
 * and checks that the stream goes on within a bound, that the comm
 * carries the error and refuses the next call, and that the stream serves
 * other work afterwards; where the daemon lives on, a fresh comm's
 * all_reduce on device buffers is right element by element after it.
 * Needs a GPU (tests/gpu/run.sh faults); without one it says so and
 * exits 77. */
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
#include "serving.h"

#define COUNT 4096
#define RELEASE_S 10.0 /* a stream let go within this: no hang (not a timing test) */
#define STALL_S 3      /* CCS_STALL_TIMEOUT for the stopped daemon */

enum fault { PEER_KILLED, DAEMON_KILLED, DAEMON_STOPPED, ABORTED };
static const char *const fault_names[] = {"peer killed", "daemon killed", "daemon stopped",
                                          "aborted"};

struct shared {
  ccs_unique_id_t id;
  pid_t daemon;
  enum fault fault;
  int posted; /* rank 0's call is out */
  int done;   /* rank 0 is through */
};
static struct shared *sh;
static struct test_daemon dmn;

static int wait_for(int *flag) {
  double until = test_now() + 45;
  while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE))
    if (test_now() > until) return -1;
    else usleep(1000);
  return 0;
}

static int rank0_through(int rc) {
  __atomic_store_n(&sh->done, 1, __ATOMIC_RELEASE);
  return rc;
}

/* rank 0: the call out, then the stream let go (rank 1 makes the fault) */
static int call_and_fault(ccs_comm_t *comm, float *buf, cudaStream_t s) {
  if (cudaMemsetAsync(buf, 0, COUNT * sizeof(float), s) != cudaSuccess) return 14;
  ccs_result_t rc = ccs_all_reduce(buf, buf, COUNT, CCS_FLOAT32, CCS_SUM, comm, s);
  if (rc != CCS_OK) {
    fprintf(stderr, "rank 0: the call on a stream: %s: %s\n", ccs_result_name(rc),
            ccs_comm_last_error(comm));
    return 15;
  }
  double t0 = test_now();
  __atomic_store_n(&sh->posted, 1, __ATOMIC_RELEASE);
  if (cudaStreamQuery(s) != cudaErrorNotReady) {
    fprintf(stderr, "rank 0: the stream did not wait for the call\n");
    return 16;
  }
  if (sh->fault == ABORTED) {
    usleep(200 * 1000);
    if (ccs_comm_abort(comm) != CCS_OK) return 17;
  }
  cudaError_t e = cudaStreamSynchronize(s); /* the case's point: this returns */
  double waited = test_now() - t0;
  fprintf(stderr, "# %s: the stream went on after %.2f s (%s)\n", fault_names[sh->fault], waited,
          cudaGetErrorString(e));
  if (e != cudaSuccess || waited > RELEASE_S + (sh->fault == DAEMON_STOPPED ? 3 * STALL_S : 0))
    return 18;
  if (sh->fault == ABORTED) return 0; /* the comm is gone */
  ccs_result_t async = CCS_OK;
  ccs_comm_get_async_error(comm, &async);
  fprintf(stderr, "# %s: async error %s: %s\n", fault_names[sh->fault], ccs_result_name(async),
          ccs_comm_last_error(comm));
  if (async == CCS_OK) return 19;
  if (ccs_all_reduce(buf, buf, COUNT, CCS_FLOAT32, CCS_SUM, comm, s) == CCS_OK) return 20;
  /* the stream serves other work */
  if (cudaMemsetAsync(buf, 0, COUNT * sizeof(float), s) != cudaSuccess ||
      cudaStreamSynchronize(s) != cudaSuccess)
    return 21;
  return 0;
}

/* A rank's stream on GPU 0, its comm, and a device buffer of COUNT
 * floats; 0, or the rank's exit code. */
static int rank_setup(int rank, int n, cudaStream_t *s, ccs_comm_t **comm, float **buf) {
  if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreateWithFlags(s, cudaStreamNonBlocking))
    return 10;
  if (ccs_comm_init_rank(comm, n, sh->id, rank) != CCS_OK) return 11;
  return ccs_mem_alloc_device((void **)buf, COUNT * sizeof(float), 0) == CCS_OK ? 0 : 12;
}

static int fault_rank(int rank, int n, void *arg) {
  (void)arg;
  cudaStream_t s;
  ccs_comm_t *comm;
  float *buf;
  int rc = rank_setup(rank, n, &s, &comm, &buf);
  if (rc) return rc;
  if (rank == 1) {
    if (wait_for(&sh->posted)) return 13;
    usleep(200 * 1000); /* rank 0's stream is waiting by now */
    switch (sh->fault) {
    case PEER_KILLED: raise(SIGKILL); break;
    case DAEMON_KILLED: kill(sh->daemon, SIGKILL); break;
    case DAEMON_STOPPED: kill(sh->daemon, SIGSTOP); break;
    case ABORTED: break;
    }
    return wait_for(&sh->done) ? 14 : 0; /* a live rank that never calls */
  }
  return rank0_through(call_and_fault(comm, buf, s));
}

/* A fresh comm's all_reduce of device buffers, on a stream: rank r gives
 * r + 1 everywhere; the sum is n (n + 1) / 2 in every element. */
static int healthy_rank(int rank, int n, void *arg) {
  (void)arg;
  cudaStream_t s;
  ccs_comm_t *comm;
  float *buf, host[COUNT];
  int rc = rank_setup(rank, n, &s, &comm, &buf);
  if (rc) return rc;
  for (int i = 0; i < COUNT; i++) host[i] = (float)(rank + 1);
  if (cudaMemcpyAsync(buf, host, sizeof(host), cudaMemcpyHostToDevice, s) != cudaSuccess ||
      ccs_all_reduce(buf, buf, COUNT, CCS_FLOAT32, CCS_SUM, comm, s) != CCS_OK ||
      cudaMemcpyAsync(host, buf, sizeof(host), cudaMemcpyDeviceToHost, s) != cudaSuccess ||
      cudaStreamSynchronize(s) != cudaSuccess)
    return 13;
  for (int i = 0; i < COUNT; i++)
    if (host[i] != (float)(n * (n + 1) / 2)) {
      fprintf(stderr, "rank %d: [%d] = %g, want %d\n", rank, i, host[i], n * (n + 1) / 2);
      return 14;
    }
  ccs_mem_free(buf);
  return ccs_comm_destroy(comm) == CCS_OK ? 0 : 15;
}

static void run_fault(enum fault f) {
  char stall[16];
  snprintf(stall, sizeof(stall), "%d", STALL_S);
  setenv("CCS_STALL_TIMEOUT", stall, 1);
  assert_int_equal(test_daemon_start(&dmn, NULL), 0);
  memset(sh, 0, sizeof(*sh));
  sh->daemon = dmn.pid;
  sh->fault = f;
  test_new_id(&sh->id);
  int st[2];
  test_run_ranks(2, fault_rank, NULL, 60, st);
  if (f == DAEMON_STOPPED) kill(dmn.pid, SIGCONT);
  assert_int_equal(st[0], 0);
  if (f == PEER_KILLED) assert_int_equal(st[1], 128 + SIGKILL);
  else assert_int_equal(st[1], 0);
  if (f == PEER_KILLED || f == ABORTED) { /* the daemon serves on */
    test_new_id(&sh->id);
    assert_int_equal(test_run_ranks(2, healthy_rank, NULL, 60, NULL), 0);
    assert_int_equal(test_daemon_stop(&dmn), 0);
  } else {
    test_daemon_stop(&dmn);
  }
}

static void test_peer_killed(void **state) {
  (void)state;
  run_fault(PEER_KILLED);
}
static void test_daemon_killed(void **state) {
  (void)state;
  run_fault(DAEMON_KILLED);
}
static void test_daemon_stopped(void **state) {
  (void)state;
  run_fault(DAEMON_STOPPED);
}
static void test_aborted(void **state) {
  (void)state;
  run_fault(ABORTED);
}

int main(void) {
  if (!test_have_gpu("stream_faults")) return 77;
  sh = test_shared_new(sizeof(*sh));
  if (!sh) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_peer_killed),
      cmocka_unit_test(test_daemon_killed),
      cmocka_unit_test(test_daemon_stopped),
      cmocka_unit_test(test_aborted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
