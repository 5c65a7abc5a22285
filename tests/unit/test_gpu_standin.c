/* The GPU code's own logic, run against the CUDA stand-in (tests/cuda_standin)
 * on a machine without a GPU: the daemon's GPU domain (run/gpu_cuda.c)
 * starts and stops, enables peer access for every pair, and frees device
 * scratch on its reaper thread, never on the loop; the runtime starts with
 * eager module loading unless the operator set otherwise; a launch reports
 * its own result, not an error an earlier call left on the thread; the
 * client's CUDA calls leave the caller's thread in the context it had (its
 * own, or none) and queue stream work in the caller's own context where it
 * has one; device UUIDs are read from the driver once, not per lookup; a
 * sticky error ends the daemon (its reason logged first), any other fails
 * its op alone; ops come back to the loop, once each and in their stream's
 * order, through the page of completions the streams write, and not
 * before their streams wrote it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cuda_standin.h"
#include "cuda_vmm.h"
#include "internal.h"
#include "kernels_device.h"
#include "plan/engine.h"
#include "plan/pool.h"
#include "run/op.h"
#include "run/share.h"
#include "run/gpu.h"

enum { NDEVICES = 3 };

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void test_eager_loading(void **state) {
  (void)state;
  char why[256];
  int n = 0;
  assert_int_equal(ccs__cuda_usable(why, sizeof(why)), 0); /* the runtime starts */
  assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
  assert_int_equal(n, NDEVICES);
  assert_string_equal(standin.module_loading, "EAGER"); /* main set it before */
  setenv("CUDA_MODULE_LOADING", "LAZY", 1);
  ccsd_gpu_environment();
  assert_string_equal(getenv("CUDA_MODULE_LOADING"), "LAZY"); /* the operator's stands */
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
}

/* A GPU domain on a fresh loop. */
static struct gpu *domain_on(uv_loop_t *loop) {
  char why[256] = "";
  uv_loop_init(loop);
  struct gpu *g = ccsd_gpu_start(loop, why, sizeof(why));
  assert_non_null(g);
  return g;
}

/* Stopped, the loop's close callbacks run, freed, the loop closed. */
static void domain_end(struct gpu *g, uv_loop_t *loop) {
  ccsd_gpu_stop(g);
  uv_run(loop, UV_RUN_DEFAULT);
  ccsd_gpu_free(g);
  assert_int_equal(uv_loop_close(loop), 0);
}

static void test_start_stop_peer_access(void **state) {
  (void)state;
  uv_loop_t loop;
  struct gpu *g = domain_on(&loop);
  char text[512];
  ccsd_gpu_describe(g, text, sizeof(text));
  assert_non_null(strstr(text, "stand-in GPU 2"));
  const uint64_t *reach = ccsd_gpu_reach(g);
  for (int i = 0; i < NDEVICES; i++) {
    assert_int_equal(reach[i], (1u << NDEVICES) - 1);
    for (int j = 0; j < NDEVICES; j++) assert_int_equal(standin.peer[i][j], i != j);
  }
  domain_end(g, &loop);
  assert_int_equal(atomic_load(&standin.streams), 0);
}

/* Scratch the pool lets go waits for the device when freed: never on the
 * loop (the test's thread here). */
static void test_scratch_freed_off_the_loop(void **state) {
  (void)state;
  uv_loop_t loop;
  int mallocs = atomic_load(&standin.mallocs), frees = atomic_load(&standin.frees);
  struct gpu *g = domain_on(&loop);
  struct engine_pool *pool = ccsd_gpu_pool(g, 1);
  size_t got = 0, kept = 0;
  void *big = engine_pool_get(pool, (size_t)300 << 20, &got); /* beyond what a pool keeps */
  void *small = engine_pool_get(pool, 4096, &kept);
  assert_non_null(big);
  assert_non_null(small);
  assert_int_equal(atomic_load(&standin.mallocs) - mallocs, 2);
  engine_pool_put(pool, big, got); /* let go */
  double until = seconds() + 5;
  while (atomic_load(&standin.frees) == frees && seconds() < until) usleep(1000);
  assert_int_equal(atomic_load(&standin.frees) - frees, 1);
  engine_pool_put(pool, small, kept); /* kept for the next op: freed at stop */
  domain_end(g, &loop);
  assert_int_equal(atomic_load(&standin.frees) - frees, 2);
  assert_int_equal(atomic_load(&standin.frees_on_loop), 0);
}

/* A page of flags let go after the domain stopped (a comm across daemons
 * freed in a close callback of a stopping daemon drops its last op's
 * reference then) is reaped when the domain is freed, after the loop ran
 * its close callbacks, not handed to a freed domain. */
static void test_flags_let_go_after_stop(void **state) {
  (void)state;
  uv_loop_t loop;
  char why[256] = "";
  struct gpu *g = domain_on(&loop);
  void *map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(map != MAP_FAILED);
  struct gpu_flags *f = ccsd_gpu_flags_new(map, 4096, map, (_Atomic uint32_t *)map + 64);
  assert_non_null(f);
  assert_int_equal(ccsd_gpu_flags_register(g, f, why, sizeof(why)), 0);
  ccsd_gpu_stop(g);
  uv_run(&loop, UV_RUN_DEFAULT); /* the close callbacks, the domain's among them */
  int unregisters = atomic_load(&standin.host_unregisters);
  ccsd_gpu_flags_unref(f); /* as a later one frees a ring's last op */
  assert_int_equal(atomic_load(&standin.host_unregisters), unregisters);
  ccsd_gpu_free(g); /* reaps it: unregistered and unmapped */
  assert_int_equal(atomic_load(&standin.host_unregisters) - unregisters, 1);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_launch_reports_its_own_error(void **state) {
  (void)state;
  float in[2][64] __attribute__((aligned(16))), out[64] __attribute__((aligned(16)));
  const void *inputs[2] = {in[0], in[1]};
  void *outputs[1] = {out};
  int launches = atomic_load(&standin.launches);
  /* an earlier call left an error on this thread: not this launch's */
  standin_set_last_error(cudaErrorInvalidValue);
  assert_int_equal(ccs__reduce_device(CCS_FLOAT32, CCS_SUM, 0, inputs, 2, outputs, 1, 64, NULL),
                   cudaSuccess);
  standin_set_last_error(cudaErrorInvalidValue);
  assert_int_equal(ccs__copy_device(in[0], outputs, 1, sizeof(out), NULL), cudaSuccess);
  assert_int_equal(atomic_load(&standin.launches) - launches, 2);
  /* a launch that fails says so, once */
  standin.fail_next_launch = cudaErrorLaunchOutOfResources;
  assert_int_equal(ccs__reduce_device(CCS_FLOAT32, CCS_MAX, 0, inputs, 2, outputs, 1, 64, NULL),
                   cudaErrorLaunchOutOfResources);
  standin.fail_next_launch = cudaErrorLaunchOutOfResources;
  assert_int_equal(ccs__copy_device(in[0], outputs, 1, sizeof(out), NULL),
                   cudaErrorLaunchOutOfResources);
  assert_int_equal(ccs__copy_device(in[0], outputs, 1, sizeof(out), NULL), cudaSuccess);
  assert_int_equal(cudaGetLastError(), cudaSuccess);
}

/* A framework's own context (not a primary one) on the caller's thread:
 * libccs queues its stream work there and leaves it current; a thread
 * with no context gets the device's primary one for the call and none
 * after. */
static void test_client_keeps_the_callers_context(void **state) {
  (void)state;
  static char own_context;
  _Atomic uint32_t flag = 0;
  void *event = NULL;
  int set_device = atomic_load(&standin.set_device_calls);
  standin_set_current_context(&own_context);
  assert_int_equal(ccs__gpu_flag_write(NULL, 1, &flag, 7), CCS_OK);
  assert_int_equal(atomic_load(&flag), 7);
  assert_ptr_equal(standin.last_stream_context, &own_context);
  assert_int_equal(ccs__gpu_flag_wait(NULL, 1, &flag, 7), CCS_OK);
  assert_ptr_equal(standin.last_stream_context, &own_context);
  assert_ptr_equal(standin_current_context(), &own_context);
  assert_int_equal(atomic_load(&standin.set_device_calls), set_device);
  assert_int_equal(ccs__gpu_record(&event, 2, NULL), CCS_OK); /* an event made on GPU 2 */
  assert_ptr_equal(standin_current_context(), &own_context);
  ccs__gpu_event_free(event);

  standin_set_current_context(NULL);
  assert_int_equal(ccs__gpu_flag_write(NULL, 2, &flag, 8), CCS_OK);
  assert_ptr_equal(standin.last_stream_context, standin_context_of(2));
  assert_null(standin_current_context());
  assert_int_equal(atomic_load(&flag), 8);
}

static void test_uuids_read_once(void **state) {
  (void)state;
  uint8_t uuid[16];
  for (int i = 0; i < 1000; i++) {
    assert_int_equal(ccs__cuda_uuid_of_device(i % NDEVICES, uuid), 0);
    assert_int_equal(ccs__cuda_device_of_uuid(uuid), i % NDEVICES);
  }
  assert_int_not_equal(ccs__cuda_uuid_of_device(NDEVICES, uuid), 0);
  assert_int_equal(atomic_load(&standin.uuid_reads), NDEVICES); /* when the runtime started */
}

static uv_loop_t *failing_loop;
static void stop_loop(struct run_op *x) {
  (void)x;
  uv_stop(failing_loop);
}

/* x: a 2-rank all_reduce of 256 floats on GPU `device`, on the comm's
 * stream `key`; 0, or -1 where it does not compile. */
static int make_op(struct run_op *x, int device, uint64_t key) {
  enum { COUNT = 256 };
  static float send[2][COUNT], recv[2][COUNT];
  struct engine_part ranks[2] = {{(char *)send[0], (char *)recv[0], 0},
                                 {(char *)send[1], (char *)recv[1], 0}};
  struct engine_op eo = {SCHED_ALL_REDUCE, SCHED_DIRECT, 2, 0, 1, COUNT, CCS_FLOAT32,
                         CCS_SUM, ranks, NULL, 1 << 12};
  static struct run_share share = {.uid = 1000, .weight = 1, .cap = 1};
  char why[256];
  if (engine_compile(&eo, &x->plan, why, sizeof(why)) != CCS_OK) return -1;
  x->share = &share;
  x->device = device;
  x->stream_key = key;
  return 0;
}

/* In a child, as a daemon would: one all_reduce through the domain's
 * submitter, its first launch failing with e. Exits 0 once the op is back
 * with its error (2: back without it, 3: could not set up); a sticky e
 * must end it before. Returns the wait status; the child's stderr (the
 * log) in log. */
static int run_failing_op(cudaError_t e, char *log, size_t len) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(30); /* a hang fails the test, never holds it */
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    static struct run_op x;
    uv_loop_t loop;
    char why[256];
    uv_loop_init(&loop);
    struct gpu *g = ccsd_gpu_start(&loop, why, sizeof(why));
    if (!g || make_op(&x, 0, 1)) _exit(3);
    failing_loop = &loop;
    x.on_done = stop_loop;
    standin.fail_next_launch = e;
    ccsd_gpu_submit(g, &x);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (!strstr(x.gpu_error, "launching a kernel")) _exit(2);
    engine_plan_free(&x.plan);
    ccsd_gpu_stop(g);
    uv_run(&loop, UV_RUN_DEFAULT);
    ccsd_gpu_free(g);
    _exit(0);
  }
  close(fds[1]);
  size_t got = 0;
  ssize_t n;
  while (got + 1 < len && (n = read(fds[0], log + got, len - 1 - got)) > 0) got += (size_t)n;
  log[got] = '\0';
  close(fds[0]);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  return status;
}

/* A sticky error leaves the context unusable for every tenant: the
 * daemon logs why and exits at once (for systemd to start a fresh one),
 * without running exit's handlers under the threads still in CUDA. Any
 * other launch failure fails its op and the daemon goes on. */
static void test_sticky_error_ends_the_daemon(void **state) {
  (void)state;
  char log[4096];
  int status = run_failing_op(cudaErrorIllegalAddress, log, sizeof(log));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), EXIT_FAILURE);
  assert_non_null(strstr(log, "launching a kernel"));
  assert_non_null(strstr(log, "(CUDA error 700) leaves the context unusable"));
  assert_non_null(strstr(log, "the service manager restarts the daemon"));

  status = run_failing_op(cudaErrorLaunchOutOfResources, log, sizeof(log));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_null(strstr(log, "leaves the context unusable"));
}

enum { NOPS = 64 };
static struct run_op back_ops[NOPS];
static int back_order[NOPS], nback;
static uv_loop_t *back_loop;

static void count_back(struct run_op *x) {
  back_order[nback++] = (int)(x - back_ops);
  if (nback == NOPS) uv_stop(back_loop);
}

/* A GPU domain on loop, and back_ops made: op i on GPU i % ngpus, on
 * comm (stream) 1 + i % ncomms, counted back by count_back. */
static struct gpu *ops_start(uv_loop_t *loop, int ngpus, int ncomms) {
  back_loop = loop;
  nback = 0;
  struct gpu *g = domain_on(loop);
  for (int i = 0; i < NOPS; i++) {
    struct run_op *x = &back_ops[i];
    memset(x, 0, sizeof(*x));
    assert_int_equal(make_op(x, i % ngpus, 1 + (uint64_t)(i % ncomms)), 0);
    x->on_done = count_back;
  }
  return g;
}

static void ops_stop(struct gpu *g, uv_loop_t *loop) {
  for (int i = 0; i < NOPS; i++) engine_plan_free(&back_ops[i].plan);
  domain_end(g, loop);
}

static void test_ops_come_back(void **state) {
  (void)state;
  uv_loop_t loop;
  struct gpu *g = ops_start(&loop, 2, 2); /* two comms' streams, on two GPUs */
  for (int i = 0; i < NOPS; i++) ccsd_gpu_submit(g, &back_ops[i]);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(nback, NOPS);
  int seen[NOPS] = {0}, last[2] = {-1, -1};
  for (int k = 0; k < NOPS; k++) {
    int i = back_order[k];
    assert_int_equal(seen[i]++, 0);
    assert_true(i > last[i % 2]); /* each stream's ops in the order queued */
    last[i % 2] = i;
    assert_string_equal(back_ops[i].gpu_error, "");
  }
  ops_stop(g, &loop);
}

/* The streams' writes held back (a GPU busy before them): nothing comes
 * back while the finisher spins and then naps; all of it once they land. */
static void test_ops_wait_for_their_stream(void **state) {
  (void)state;
  uv_loop_t loop;
  struct gpu *g = ops_start(&loop, 1, 3);
  atomic_store(&standin.hold_writes, 1);
  int launched = atomic_load(&standin.launches);
  for (int i = 0; i < NOPS; i++) ccsd_gpu_submit(g, &back_ops[i]);
  for (double until = seconds() + 0.05; seconds() < until;) { /* past the spin, into naps */
    uv_run(&loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  assert_int_equal(nback, 0);
  assert_true(atomic_load(&standin.launches) >= launched + NOPS); /* all of them queued */
  standin_release_writes();
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(nback, NOPS);
  ops_stop(g, &loop);
}

int main(void) {
  standin_reset(NDEVICES);
  ccsd_gpu_environment(); /* as ccsd's main does, before the first CUDA call */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_eager_loading),
      cmocka_unit_test(test_start_stop_peer_access),
      cmocka_unit_test(test_scratch_freed_off_the_loop),
      cmocka_unit_test(test_flags_let_go_after_stop),
      cmocka_unit_test(test_launch_reports_its_own_error),
      cmocka_unit_test(test_client_keeps_the_callers_context),
      cmocka_unit_test(test_uuids_read_once),
      cmocka_unit_test(test_sticky_error_ends_the_daemon),
      cmocka_unit_test(test_ops_come_back),
      cmocka_unit_test(test_ops_wait_for_their_stream),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
