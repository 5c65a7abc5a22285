/* Which memory domain an op runs in (daemon/coll/device.c) and the fields
 * of device registrations (run/gpu_check.c), what the GPU
 * threads owe the loop about an op in every order of events
 * (gpu_progress.c), and which CUDA errors end the daemon (sticky ones
 * poison every tenant's context). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "coll/coll.h"

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

/* The loop's view: each report listed once until taken; announce exactly
 * once and before finishing; an op that failed to queue is never announced. */
static void test_progress(void **state) {
  int st = 0;
  /* queued, then done, before the loop looks: one listing, both acts */
  assert_int_equal(ccsd_gpu_progress_mark(&st, CCSD_GPU_ANNOUNCED), 1);
  assert_int_equal(ccsd_gpu_progress_mark(&st, CCSD_GPU_COMPLETED), 0);
  assert_int_equal(ccsd_gpu_progress_take(&st), CCSD_GPU_DO_ANNOUNCE | CCSD_GPU_DO_FINISH);

  /* queued; the loop announces; done later: listed again, finish only */
  st = 0;
  assert_int_equal(ccsd_gpu_progress_mark(&st, CCSD_GPU_ANNOUNCED), 1);
  assert_int_equal(ccsd_gpu_progress_take(&st), CCSD_GPU_DO_ANNOUNCE);
  assert_int_equal(ccsd_gpu_progress_mark(&st, CCSD_GPU_COMPLETED), 1);
  assert_int_equal(ccsd_gpu_progress_take(&st), CCSD_GPU_DO_FINISH);

  /* could not be queued (error, cancelled): finish only */
  st = 0;
  assert_int_equal(ccsd_gpu_progress_mark(&st, CCSD_GPU_COMPLETED), 1);
  assert_int_equal(ccsd_gpu_progress_take(&st), CCSD_GPU_DO_FINISH);

  /* taken before anything new: nothing to do twice */
  st = 0;
  ccsd_gpu_progress_mark(&st, CCSD_GPU_ANNOUNCED);
  assert_int_equal(ccsd_gpu_progress_take(&st), CCSD_GPU_DO_ANNOUNCE);
  assert_int_equal(ccsd_gpu_progress_take(&st), 0);
}

/* Device registrations and events are checked before any driver call. */
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
  assert_int_equal(ccsd_gpu_check_events(16, 64, 64, err, sizeof(err)), CCS_OK);
  assert_int_equal(ccsd_gpu_check_events(0, 64, 64, err, sizeof(err)), CCS_ERR_INVALID_ARGUMENT);
  assert_int_equal(ccsd_gpu_check_events(16, 64, 65, err, sizeof(err)), CCS_ERR_INVALID_ARGUMENT);
  assert_int_equal(ccsd_gpu_check_events(16, 0, 64, err, sizeof(err)), CCS_ERR_INVALID_ARGUMENT);
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
      cmocka_unit_test(test_progress),
      cmocka_unit_test(test_registration_fields),
      cmocka_unit_test(test_sticky_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
