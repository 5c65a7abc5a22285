/* A program written against nccl.h, linked to libccs-nccl (libnccl.so.2):
 * every collective, send/recv in groups, ncclCommInitAll with a group in
 * one thread, PreMulSum (float and integer), split, shrink, revoke, abort,
 * finalize, memory and registration, and the errors, on host
 * memory through a real daemon, with 1, 2, 3 and 4 ranks. Every element is
 * checked against a reference computed here from fresh random data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <nccl.h>

#include "harness.h"
#include "nccl_check.h"

#define N 257 /* odd */

struct shared {
  ncclUniqueId id;
  uint64_t seed;
};
static struct shared *sh;
static struct test_daemon dmn;

static int setup(void **state) {
  (void)state;
  sh = test_shared_new(sizeof(*sh));
  if (!sh || test_daemon_start(&dmn, NULL)) return -1;
  sh->seed = test_seed();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  test_daemon_stop(&dmn);
  test_shared_free(sh, sizeof(*sh));
  return 0;
}

static int32_t in32(int rank, size_t i, int salt) {
  return (int32_t)(test_mix(sh->seed + (uint64_t)salt, (uint64_t)rank * 100003 + i) % 2001) - 1000;
}


static int collectives(ncclComm_t comm, int rank, int n) {
  cudaStream_t s = NULL;
  int32_t *a = malloc(sizeof(int32_t) * N * (size_t)n), *b = malloc(sizeof(int32_t) * N * (size_t)n);
  double *d = malloc(sizeof(double) * N), *e = malloc(sizeof(double) * N);
  /* all_reduce: sum, max, avg (truncated on integers), float sum */
  const ncclRedOp_t ops[3] = {ncclSum, ncclMax, ncclAvg};
  for (int k = 0; k < 3; k++) {
    for (size_t i = 0; i < N; i++) a[i] = in32(rank, i, k);
    CHECK(ncclAllReduce(a, b, N, ncclInt32, ops[k], comm, s) == ncclSuccess, "all_reduce op %d", k);
    for (size_t i = 0; i < N; i++) {
      int64_t want = k == 1 ? INT32_MIN : 0;
      for (int r = 0; r < n; r++) want = k == 1 ? (in32(r, i, k) > want ? in32(r, i, k) : want) : want + in32(r, i, k);
      if (k == 2) want /= n;
      CHECK(b[i] == want, "all_reduce op %d [%zu] = %d, want %lld", k, i, b[i], (long long)want);
    }
  }
  for (size_t i = 0; i < N; i++) d[i] = in32(rank, i, 7) / 8.0;
  CHECK(ncclAllReduce(d, d, N, ncclFloat64, ncclSum, comm, s) == ncclSuccess, "in-place all_reduce");
  for (size_t i = 0; i < N; i++) {
    double want = 0;
    for (int r = 0; r < n; r++) want += in32(r, i, 7) / 8.0;
    CHECK(d[i] == want, "in-place all_reduce [%zu]", i);
  }
  /* PreMulSum on host memory: each rank's own scalar */
  double scale = rank + 0.5;
  ncclRedOp_t pre;
  CHECK(ncclRedOpCreatePreMulSum(&pre, &scale, ncclFloat64, ncclScalarHostImmediate, comm) == ncclSuccess, "premulsum");
  for (size_t i = 0; i < N; i++) d[i] = in32(rank, i, 8);
  CHECK(ncclAllReduce(d, e, N, ncclFloat64, pre, comm, s) == ncclSuccess, "premulsum all_reduce");
  for (size_t i = 0; i < N; i++) {
    double want = 0;
    for (int r = 0; r < n; r++) want += in32(r, i, 8) * (r + 0.5);
    CHECK(e[i] == want, "premulsum [%zu] = %g, want %g", i, e[i], want);
  }
  CHECK(ncclAllReduce(d, e, N, ncclFloat32, pre, comm, s) == ncclInvalidArgument, "premulsum of another type");
  CHECK(ncclRedOpDestroy(pre, comm) == ncclSuccess, "destroy premulsum");
  CHECK(ncclRedOpDestroy(pre, comm) == ncclInvalidArgument, "destroy twice");
  /* integer PreMulSum: products and sums wrap */
  int32_t iscale = 1000003 * (rank + 1);
  CHECK(ncclRedOpCreatePreMulSum(&pre, &iscale, ncclInt32, ncclScalarHostImmediate, comm) == ncclSuccess, "int premulsum");
  for (size_t i = 0; i < N; i++) a[i] = in32(rank, i, 14);
  CHECK(ncclReduceScatter(a, b, N / (size_t)n, ncclInt32, pre, comm, s) == ncclSuccess, "int premulsum reduce_scatter");
  for (size_t i = 0; i < N / (size_t)n; i++) {
    uint32_t want = 0;
    for (int r = 0; r < n; r++) want += (uint32_t)in32(r, (size_t)rank * (N / (size_t)n) + i, 14) * (uint32_t)(1000003 * (r + 1));
    CHECK((uint32_t)b[i] == want, "int premulsum [%zu] = %d, want %d", i, b[i], (int32_t)want);
  }
  CHECK(ncclRedOpDestroy(pre, comm) == ncclSuccess, "destroy int premulsum");
  /* what ccs cannot do is a usage error saying so */
  uint16_t half_scale = 0x3c00;
  CHECK(ncclRedOpCreatePreMulSum(&pre, &half_scale, ncclFloat16, ncclScalarHostImmediate, comm) == ncclInvalidUsage, "half premulsum");
  CHECK(strstr(ncclGetLastError(comm), "16- and 8-bit floats: not supported by ccs") != NULL, "its text");
  CHECK(ncclRedOpCreatePreMulSum(&pre, &scale, ncclFloat64, ncclScalarDevice, comm) == ncclInvalidUsage, "device scalar");
  CHECK(strstr(ncclGetLastError(comm), "scalar in device memory") != NULL, "its text");
  /* broadcast (and Bcast in place), reduce, all_gather, reduce_scatter */
  int root = n - 1;
  for (size_t i = 0; i < N; i++) a[i] = in32(rank, i, 9);
  CHECK(ncclBroadcast(a, b, N, ncclInt32, root, comm, s) == ncclSuccess, "broadcast");
  for (size_t i = 0; i < N; i++) CHECK(b[i] == in32(root, i, 9), "broadcast [%zu]", i);
  CHECK(ncclBcast(a, N, ncclInt32, 0, comm, s) == ncclSuccess, "bcast");
  for (size_t i = 0; i < N; i++) CHECK(a[i] == in32(0, i, 9), "bcast [%zu]", i);
  for (size_t i = 0; i < N; i++) a[i] = in32(rank, i, 10);
  memset(b, 0x5a, sizeof(int32_t) * N);
  CHECK(ncclReduce(a, b, N, ncclInt32, ncclMin, 0, comm, s) == ncclSuccess, "reduce");
  for (size_t i = 0; rank == 0 && i < N; i++) {
    int32_t want = INT32_MAX;
    for (int r = 0; r < n; r++) want = in32(r, i, 10) < want ? in32(r, i, 10) : want;
    CHECK(b[i] == want, "reduce [%zu]", i);
  }
  CHECK(ncclAllGather(a, b, N, ncclInt32, comm, s) == ncclSuccess, "all_gather");
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < N; i++) CHECK(b[(size_t)r * N + i] == in32(r, i, 10), "all_gather [%d][%zu]", r, i);
  for (size_t i = 0; i < N * (size_t)n; i++) a[i] = in32(rank, i, 11);
  CHECK(ncclReduceScatter(a, b, N, ncclInt32, ncclSum, comm, s) == ncclSuccess, "reduce_scatter");
  for (size_t i = 0; i < N; i++) {
    int32_t want = 0;
    for (int r = 0; r < n; r++) want += in32(r, (size_t)rank * N + i, 11);
    CHECK(b[i] == want, "reduce_scatter [%zu]", i);
  }
  /* all_to_all, gather, scatter */
  CHECK(ncclAlltoAll(a, b, N, ncclInt32, comm, s) == ncclSuccess, "all_to_all");
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < N; i++) CHECK(b[(size_t)r * N + i] == in32(r, (size_t)rank * N + i, 11), "all_to_all");
  CHECK(ncclGather(a, b, N, ncclInt32, root, comm, s) == ncclSuccess, "gather");
  for (int r = 0; rank == root && r < n; r++)
    for (size_t i = 0; i < N; i++) CHECK(b[(size_t)r * N + i] == in32(r, i, 11), "gather");
  CHECK(ncclScatter(a, b, N, ncclInt32, 0, comm, s) == ncclSuccess, "scatter");
  for (size_t i = 0; i < N; i++) CHECK(b[i] == in32(0, (size_t)rank * N + i, 11), "scatter");
  /* a ring of sends and receives in one group */
  int to = (rank + 1) % n, from = (rank + n - 1) % n;
  for (size_t i = 0; i < N; i++) a[i] = in32(rank, i, 12);
  CHECK(ncclGroupStart() == ncclSuccess, "group start");
  CHECK(ncclSend(a, N, ncclInt32, to, comm, s) == ncclSuccess, "send");
  CHECK(ncclRecv(b, N, ncclInt32, from, comm, s) == ncclSuccess, "recv");
  CHECK(ncclGroupEnd() == ncclSuccess, "group end");
  for (size_t i = 0; i < N; i++) CHECK(b[i] == in32(from, i, 12), "ring [%zu]", i);
  free(a), free(b), free(d), free(e);
  return 0;
}

static int errors(ncclComm_t comm, int rank) {
  int32_t x = 1;
  ncclComm_t none;
  CHECK(ncclAllReduce(&x, &x, 1, (ncclDataType_t)99, ncclSum, comm, NULL) == ncclInvalidArgument, "bad type");
  CHECK(strstr(ncclGetLastError(comm), "data type 99") != NULL, "its text");
  CHECK(ncclAllReduce(&x, &x, 1, ncclInt32, (ncclRedOp_t)40, comm, NULL) == ncclInvalidArgument, "bad op");
  CHECK(ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, NULL, NULL) == ncclInvalidArgument, "no comm");
  CHECK(ncclCommWindowRegister(comm, &x, 4, NULL, 0) == ncclInvalidUsage, "windows");
  CHECK(strstr(ncclGetLastError(comm), "not supported by ccs") != NULL, "its text");
  (void)none;
  CHECK(ncclBroadcast(&x, &x, 1, ncclInt32, 99, comm, NULL) == ncclInvalidArgument, "bad root");
  CHECK(strstr(ncclGetLastError(comm), "out of range") != NULL, "bad root's text: %s", ncclGetLastError(comm));
  ncclResult_t async;
  CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclSuccess, "no async error");
  CHECK(!strcmp(ncclGetErrorString(ncclInvalidUsage), "invalid usage"), "error strings");
  return 0;
}

static int one_rank(int rank, int n, void *arg) {
  (void)arg;
  ncclComm_t comm;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  CHECK(ncclCommInitRankConfig(&comm, n, sh->id, rank, &config) == ncclSuccess, "init");
  int got, version;
  CHECK(ncclCommCount(comm, &got) == ncclSuccess && got == n, "count");
  CHECK(ncclCommUserRank(comm, &got) == ncclSuccess && got == rank, "rank");
  CHECK(ncclGetVersion(&version) == ncclSuccess && version >= 22800, "version");
  /* memory: host memory here (no GPU), registered or not, the same results */
  int32_t *m;
  void *handle;
  CHECK(ncclMemAlloc((void **)&m, 4096) == ncclSuccess, "mem alloc");
  CHECK(ncclCommRegister(comm, m, 4096, &handle) == ncclSuccess, "register");
  for (int i = 0; i < 64; i++) m[i] = rank * 64 + i;
  CHECK(ncclAllReduce(m, m + 64, 64, ncclInt32, ncclSum, comm, NULL) == ncclSuccess, "on MemAlloc memory");
  for (int i = 0; i < 64; i++) CHECK(m[64 + i] == 64 * n * (n - 1) / 2 + n * i, "on MemAlloc memory [%d]", i);
  CHECK(ncclCommDeregister(comm, handle) == ncclSuccess, "deregister");
  CHECK(ncclMemFree(m) == ncclSuccess, "mem free");
  int bad = collectives(comm, rank, n) || errors(comm, rank);
  /* split: even and odd ranks, in reverse order; the last rank none */
  ncclComm_t half;
  int color = rank == n - 1 && n > 2 ? NCCL_SPLIT_NOCOLOR : rank % 2;
  CHECK(ncclCommSplit(comm, color, n - rank, &half, NULL) == ncclSuccess, "split");
  if (color == NCCL_SPLIT_NOCOLOR) {
    CHECK(half == NCCL_COMM_NULL, "no color: no comm");
  } else {
    int size = 0, mine = 0;
    for (int r = 0; r < n; r++)
      if ((r != n - 1 || n <= 2) && r % 2 == color) size++, mine += r > rank;
    int got_rank, got_size, v = rank, sum = 0;
    CHECK(ncclCommCount(half, &got_size) == ncclSuccess && got_size == size, "split size");
    CHECK(ncclCommUserRank(half, &got_rank) == ncclSuccess && got_rank == mine, "split rank");
    CHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, half, NULL) == ncclSuccess, "on the split comm");
    for (int r = 0; r < n; r++) sum += (r != n - 1 || n <= 2) && r % 2 == color ? r : 0;
    CHECK(v == sum, "split all_reduce: %d, want %d", v, sum);
    CHECK(ncclCommDestroy(half) == ncclSuccess, "destroy the split comm");
  }
  /* shrink without the last rank (which does not call), then revoke the
   * new comm from its rank 0: every rank's calls on it fail, abort frees it */
  int last = n - 1;
  if (n > 1 && rank != last) {
    ncclComm_t small;
    CHECK(ncclCommShrink(comm, &last, 1, &small, NULL, NCCL_SHRINK_DEFAULT) == ncclSuccess, "shrink");
    int got_size, v = rank;
    CHECK(ncclCommCount(small, &got_size) == ncclSuccess && got_size == n - 1, "shrunk size");
    CHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, small, NULL) == ncclSuccess, "on the shrunk comm");
    CHECK(v == (n - 1) * (n - 2) / 2, "shrunk all_reduce: %d", v);
    if (rank == 0) CHECK(ncclCommRevoke(small, NCCL_REVOKE_DEFAULT) == ncclSuccess, "revoke");
    CHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, small, NULL) == ncclRemoteError, "after the revoke");
    CHECK(strstr(ncclGetLastError(small), "CCS_ERR_REVOKED") != NULL, "its text");
    CHECK(ncclCommAbort(small) == ncclSuccess, "abort");
  }
  int device = -1;
  CHECK(ncclCommCuDevice(comm, &device) == ncclSuccess && device >= 0, "device");
  CHECK(ncclCommFinalize(comm) == ncclSuccess, "finalize");
  CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
  return bad;
}

static void test_ranks(void **state) {
  (void)state;
  for (int n = 1; n <= 4; n++) {
    assert_int_equal(ncclGetUniqueId(&sh->id), ncclSuccess);
    assert_int_equal(test_run_ranks(n, one_rank, NULL, 120, NULL), 0);
  }
}

/* One process, several ranks (ncclCommInitAll), driven from one thread in
 * a group: one call per rank, as NCCL programs do. */
static void test_init_all(void **state) {
  (void)state;
  for (int n = 2; n <= 3; n++) {
    ncclComm_t comms[3];
    assert_int_equal(ncclCommInitAll(comms, n, NULL), ncclSuccess);
    int32_t v[3][N];
    for (int r = 0; r < n; r++)
      for (size_t i = 0; i < N; i++) v[r][i] = in32(r, i, 13);
    assert_int_equal(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; r++) assert_int_equal(ncclAllReduce(v[r], v[r], N, ncclInt32, ncclSum, comms[r], NULL), ncclSuccess);
    assert_int_equal(ncclGroupEnd(), ncclSuccess);
    for (int r = 0; r < n; r++)
      for (size_t i = 0; i < N; i++) {
        int32_t want = 0;
        for (int k = 0; k < n; k++) want += in32(k, i, 13);
        assert_int_equal(v[r][i], want);
      }
    for (int r = 0; r < n; r++) assert_int_equal(ncclCommDestroy(comms[r]), ncclSuccess);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_ranks, setup, teardown),
      cmocka_unit_test_setup_teardown(test_init_all, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
