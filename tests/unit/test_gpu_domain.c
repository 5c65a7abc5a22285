/* Which memory domain an op runs in (daemon/coll/device.c) and the fields
 * of device registrations (run/gpu_check.c), a GPU's streams per comm
 * (gpu_streams.c), the watchdog's steps (gpu_watch.c), the host's writes
 * of stream flags (gpu_flags.c), and which CUDA errors end the daemon
 * (sticky ones poison every tenant's context). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "coll/coll.h"
#include "ring.h"

enum { MAX = 70 };
static struct member members[MAX];
static struct post posts[MAX];
static struct post *list[MAX];
static uint64_t reach[CCSD_GPU_MAX_DEVICES];

/* n ranks, rank r's send and receive buffers on device dev[r] (-1: host;
 * -2: no buffers, as a barrier). */
static void build(int n, const int *dev) {
  memset(posts, 0, sizeof(posts));
  for (int r = 0; r < n; r++) {
    members[r].rank = r;
    posts[r].member = &members[r];
    if (dev[r] > -2) { /* any address: only where the memory lives counts */
      posts[r].send = (struct coll_buf){&posts[r], 64, dev[r]};
      posts[r].recv = (struct coll_buf){&posts[r], 64, dev[r]};
    }
    list[r] = &posts[r];
  }
}

static int domain(int n, int spans, ccs_result_t *rc, char *err) {
  return ccsd_gpu_op_device(list, n, spans, reach, rc, err, 256);
}

static void test_host_and_device(void **state) {
  char err[256] = "";
  ccs_result_t rc = CCS_OK;
  int host[3] = {-1, -1, -1}, none[2] = {-2, -2}, gpu1[3] = {1, 1, 1};
  build(3, host);
  assert_int_equal(domain(3, 0, &rc, err), -1);
  assert_int_equal(domain(3, 1, &rc, err), -1); /* host memory spans daemons */
  build(2, none);
  assert_int_equal(domain(2, 0, &rc, err), -1);
  build(3, gpu1);
  assert_int_equal(domain(3, 0, &rc, err), 1);
  list[0] = NULL; /* a rank of another daemon has no post here */
  assert_int_equal(domain(3, 0, &rc, err), 1);
}

static void test_refusals(void **state) {
  char err[256] = "";
  ccs_result_t rc = CCS_OK;
  int mixed[3] = {0, -1, 0};
  build(3, mixed);
  assert_int_equal(domain(3, 0, &rc, err), -2);
  assert_int_equal(rc, CCS_ERR_INVALID_USAGE);
  assert_non_null(strstr(err, "host memory (rank 1)"));
  assert_non_null(strstr(err, "device memory (rank 0)"));

  int gpu0[2] = {0, 0};
  build(2, gpu0);
  assert_int_equal(domain(2, 1, &rc, err), -2);
  assert_int_equal(rc, CCS_ERR_UNSUPPORTED);
  assert_non_null(strstr(err, "across daemons"));

  int many[MAX];
  for (int r = 0; r < MAX; r++) many[r] = 0;
  build(MAX, many);
  assert_int_equal(domain(MAX, 0, &rc, err), -2);
  assert_int_equal(rc, CCS_ERR_UNSUPPORTED);
  assert_non_null(strstr(err, "at most 64"));
  assert_int_equal(domain(64, 0, &rc, err), 0);
}

static void test_peer_access(void **state) {
  char err[256] = "";
  ccs_result_t rc = CCS_OK;
  int two[2] = {0, 1};
  build(2, two);
  memset(reach, 0, sizeof(reach));
  assert_int_equal(domain(2, 0, &rc, err), -2);
  assert_int_equal(rc, CCS_ERR_UNSUPPORTED);
  assert_non_null(strstr(err, "GPU 0 cannot reach the memory of GPU 1 (rank 1)"));
  reach[0] = 1u << 1; /* GPU 0 reaches GPU 1: it runs the op */
  assert_int_equal(domain(2, 0, &rc, err), 0);
  int back[2] = {1, 0};
  build(2, back); /* GPU 1 would run it, and does not reach GPU 0 */
  assert_int_equal(domain(2, 0, &rc, err), -2);
}

/* A GPU's streams: a comm keeps its stream while it has ops on it (its ops
 * run in order), others never share it then; idle streams are taken over,
 * the one idle longest first, and given back after a while; with every
 * stream busy with other comms an op waits (NULL). */
static void test_streams(void **state) {
  static struct gpu_streams t;
  memset(&t, 0, sizeof(t));
  struct gpu_stream *a = ccsd_gpu_stream_for(&t, 11);
  assert_non_null(a);
  a->handle = (void *)0x1000;
  a->inflight = 2;
  assert_ptr_equal(ccsd_gpu_stream_for(&t, 11), a); /* the same comm: its own */
  struct gpu_stream *b = ccsd_gpu_stream_for(&t, 12);
  assert_true(b && b != a);
  b->inflight = 1;
  /* fill every place with busy comms: the next comm waits */
  for (uint64_t k = 13; k < 11 + CCSD_GPU_STREAMS; k++) {
    struct gpu_stream *s = ccsd_gpu_stream_for(&t, k);
    assert_non_null(s);
    assert_ptr_not_equal(s, a);
    s->inflight = 1;
    s->idle_since_ms = 0;
  }
  assert_null(ccsd_gpu_stream_for(&t, 9999));
  assert_ptr_equal(ccsd_gpu_stream_for(&t, 11), a); /* still its own */
  /* two go idle: the one idle longest is taken over, with its stream */
  a->inflight = 0, a->idle_since_ms = 500;
  b->inflight = 0, b->idle_since_ms = 100;
  struct gpu_stream *c = ccsd_gpu_stream_for(&t, 9999);
  assert_ptr_equal(c, b);
  assert_int_equal(c->key, 9999);
  c->inflight = 1;
  /* retiring: only idle ones, only after idle_ms; their handles come back */
  void *handles[4];
  assert_int_equal(ccsd_gpu_streams_retire(&t, 600, 1000, handles, 4), 0);
  assert_int_equal(ccsd_gpu_streams_retire(&t, 1500, 1000, handles, 4), 1);
  assert_ptr_equal(handles[0], (void *)0x1000);
  assert_int_equal(a->used, 0);
  assert_null(a->handle);
  struct gpu_stream *d = ccsd_gpu_stream_for(&t, 11); /* free again: a fresh one */
  assert_ptr_equal(d, a);
  assert_null(d->handle);
}

/* The watchdog lets a cancelled op's stream go on every tick (a client may
 * write its flags back), and says once that it is stuck. */
static void test_watch(void **state) {
  struct gpu_watch w = {0};
  assert_int_equal(ccsd_gpu_watch_step(&w, 0, 100), CCSD_GPU_WATCH_NOTHING);
  assert_int_equal(ccsd_gpu_watch_step(&w, 1, 200), CCSD_GPU_WATCH_RELEASE);
  assert_int_equal(ccsd_gpu_watch_step(&w, 1, 250), CCSD_GPU_WATCH_RELEASE);
  assert_int_equal(ccsd_gpu_watch_step(&w, 1, 200 + CCSD_GPU_STUCK_MS), CCSD_GPU_WATCH_STUCK);
  assert_int_equal(ccsd_gpu_watch_step(&w, 1, 300 + CCSD_GPU_STUCK_MS), CCSD_GPU_WATCH_RELEASE);
  struct gpu_watch zero = {0}; /* a clock at 0 still counts as released */
  assert_int_equal(ccsd_gpu_watch_step(&zero, 1, 0), CCSD_GPU_WATCH_RELEASE);
  assert_int_equal(ccsd_gpu_watch_step(&zero, 1, CCSD_GPU_STUCK_MS + 1), CCSD_GPU_WATCH_STUCK);
}

/* Host writes of stream flags never lower one (the GPU may have written a
 * later use's value); comparisons wrap. */
static void test_flags(void **state) {
  static _Atomic uint32_t ready[CCS__RING_ENTRIES], done[CCS__RING_ENTRIES];
  struct gpu_flags f = {.ready = ready, .done = done};
  struct gpu_order o = {&f, 7, 5};
  atomic_store(&done[7], 3);
  ccsd_gpu_order_done(&o);
  assert_int_equal(atomic_load(&done[7]), 5);
  atomic_store(&done[7], 6); /* the next use's, already: stays */
  ccsd_gpu_order_done(&o);
  assert_int_equal(atomic_load(&done[7]), 6);
  ccsd_gpu_order_unblock(&o);
  assert_int_equal(atomic_load(&ready[7]), 5);
  for (unsigned i = 0; i < CCS__RING_ENTRIES; i++)
    if (i != 7) assert_int_equal(atomic_load(&ready[i]) | atomic_load(&done[i]), 0);
  /* across the wrap: 0xfffffffe, then 1 */
  struct gpu_order w = {&f, 9, 1};
  atomic_store(&done[9], 0xfffffffeu);
  ccsd_gpu_order_done(&w);
  assert_int_equal(atomic_load(&done[9]), 1);
  assert_true(ccsd_gpu_flag_reached(1, 0xfffffffeu));
  assert_false(ccsd_gpu_flag_reached(0xfffffffeu, 1));
  assert_true(ccsd_gpu_flag_reached(5, 5));
  struct gpu_order none = {NULL, 9, 2}; /* no stream order: nothing written */
  ccsd_gpu_order_done(&none);
  assert_int_equal(atomic_load(&done[9]), 1);
}

/* Device registrations are checked before any driver call. */
static void test_registration_fields(void **state) {
  char err[256];
  assert_int_equal(ccsd_gpu_check_register(CCS__MEM_CUDA, 1 << 21, 16, 0, err, sizeof(err)), CCS_OK);
  assert_int_equal(ccsd_gpu_check_register(CCS__MEM_CUDA_IPC, 4096, 16, 64, err, sizeof(err)), CCS_OK);
  assert_int_equal(ccsd_gpu_check_register(CCS__MEM_CUDA_IPC, 0, 16, 64, err, sizeof(err)),
                   CCS_ERR_INVALID_ARGUMENT); /* the allocation's size, from the client */
  assert_int_equal(ccsd_gpu_check_register(7, 1 << 21, 16, 0, err, sizeof(err)),
                   CCS_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err, "unknown memory domain 7"));
  assert_int_equal(ccsd_gpu_check_register(CCS__MEM_CUDA, 1 << 21, 15, 0, err, sizeof(err)),
                   CCS_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err, "16-byte UUID, not 15 bytes"));
  assert_int_equal(ccsd_gpu_check_register(CCS__MEM_CUDA, 0, 16, 0, err, sizeof(err)),
                   CCS_ERR_INVALID_ARGUMENT);
  assert_int_equal(ccsd_gpu_check_register(CCS__MEM_CUDA, UINT64_MAX, 16, 0, err, sizeof(err)),
                   CCS_ERR_INVALID_ARGUMENT);
  assert_int_equal(ccsd_gpu_check_register(CCS__MEM_CUDA_IPC, 4096, 16, 63, err, sizeof(err)),
                   CCS_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(err, "64 bytes, not 63"));
}

static void test_sticky_errors(void **state) {
#ifdef CCS_HAVE_CUDA
  /* cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorMisalignedAddress */
  assert_true(ccsd_gpu_error_is_sticky(700));
  assert_true(ccsd_gpu_error_is_sticky(719));
  assert_true(ccsd_gpu_error_is_sticky(716));
  /* cudaErrorNvlinkUncorrectable, cudaErrorContained, cudaErrorExternalDevice */
  assert_true(ccsd_gpu_error_is_sticky(220));
  assert_true(ccsd_gpu_error_is_sticky(226));
  assert_true(ccsd_gpu_error_is_sticky(911));
  /* cudaErrorInvalidValue, cudaErrorMemoryAllocation, cudaErrorNotReady: the op fails, not the daemon */
  assert_false(ccsd_gpu_error_is_sticky(1));
  assert_false(ccsd_gpu_error_is_sticky(2));
  assert_false(ccsd_gpu_error_is_sticky(600));
#else
  assert_false(ccsd_gpu_error_is_sticky(700)); /* no CUDA: nothing is */
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_and_device),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_peer_access),
      cmocka_unit_test(test_streams),
      cmocka_unit_test(test_watch),
      cmocka_unit_test(test_flags),
      cmocka_unit_test(test_registration_fields),
      cmocka_unit_test(test_sticky_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
