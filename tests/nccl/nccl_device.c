/* An NCCL program as GPU jobs write it, on libccs-nccl: buffers from
 * cudaMalloc and from ncclMemAlloc (+ ncclCommRegister), every collective
 * and a ring of sends in a group on a CUDA stream, results copied back and
 * checked element by element against values recomputed here.
 *   nccl_device NRANKS            on GPU 0 (tests/gpu/run.sh, stage nccl)
 *   CCS_TEST_MEMORY=host ...      the same on host memory (its dry run)
 * CCS_SOCKET names the daemon. Exit status 0 when every element is right. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <nccl.h>
#ifdef CCS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "harness.h"
#include "nccl_check.h"

#define N 4099 /* odd, past a page */

struct shared {
  ncclUniqueId id;
  uint64_t seed;
};
static struct shared *sh;
static int on_host; /* CCS_TEST_MEMORY=host */

static int32_t value(int rank, size_t i, int salt) {
  return (int32_t)(test_mix(sh->seed + (uint64_t)salt, (uint64_t)rank * 1000003 + i) % 20001) - 10000;
}

/* Memory as the job has it: device memory (cudaMalloc or ncclMemAlloc),
 * or host memory in the dry run; moved to and from host arrays. */
static void *dev_alloc(size_t bytes, int nccl_alloc) {
  void *p = NULL;
  if (nccl_alloc) return ncclMemAlloc(&p, bytes) == ncclSuccess ? p : NULL;
#ifdef CCS_HAVE_CUDA
  if (!on_host) return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
#endif
  return malloc(bytes);
}
static void dev_free(void *p, int nccl_alloc) {
  if (nccl_alloc) ncclMemFree(p);
#ifdef CCS_HAVE_CUDA
  else if (!on_host) cudaFree(p);
#endif
  else free(p);
}
static void put(void *dev, const void *host, size_t bytes) {
#ifdef CCS_HAVE_CUDA
  if (!on_host) {
    cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
    return;
  }
#endif
  memcpy(dev, host, bytes);
}
static void get(void *host, const void *dev, size_t bytes, cudaStream_t s) {
#ifdef CCS_HAVE_CUDA
  if (!on_host) {
    cudaStreamSynchronize(s);
    cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
    return;
  }
#endif
  (void)s;
  memcpy(host, dev, bytes);
}


/* Every collective once on buffers a (input) and b (output) of n * N
 * int32s; ha and hb their host copies. */
static int collectives(ncclComm_t comm, int rank, int n, int32_t *a, int32_t *b, cudaStream_t s,
                       int salt) {
  size_t all = (size_t)n * N, bytes = all * sizeof(int32_t);
  int32_t *ha = malloc(bytes), *hb = malloc(bytes);
  int root = n - 1, bad = 0;
  for (size_t i = 0; i < all; i++) ha[i] = value(rank, i, salt);
  put(a, ha, bytes);
#define EXPECT(cond, ...) \
  if (!bad && !(cond)) bad = 1, fprintf(stderr, "rank %d: ", rank), fprintf(stderr, __VA_ARGS__), fprintf(stderr, "\n")
  CHECK(ncclAllReduce(a, b, N, ncclInt32, ncclSum, comm, s) == ncclSuccess, "all_reduce");
  get(hb, b, N * sizeof(int32_t), s);
  for (size_t i = 0; i < N; i++) {
    int32_t want = 0;
    for (int r = 0; r < n; r++) want += value(r, i, salt);
    EXPECT(hb[i] == want, "all_reduce [%zu] = %d, want %d", i, hb[i], want);
  }
  CHECK(ncclBroadcast(a, b, N, ncclInt32, root, comm, s) == ncclSuccess, "broadcast");
  get(hb, b, N * sizeof(int32_t), s);
  for (size_t i = 0; i < N; i++) EXPECT(hb[i] == value(root, i, salt), "broadcast [%zu]", i);
  CHECK(ncclReduce(a, b, N, ncclInt32, ncclMax, 0, comm, s) == ncclSuccess, "reduce");
  get(hb, b, N * sizeof(int32_t), s);
  for (size_t i = 0; rank == 0 && i < N; i++) {
    int32_t want = INT32_MIN;
    for (int r = 0; r < n; r++) want = value(r, i, salt) > want ? value(r, i, salt) : want;
    EXPECT(hb[i] == want, "reduce [%zu]", i);
  }
  CHECK(ncclAllGather(a, b, N, ncclInt32, comm, s) == ncclSuccess, "all_gather");
  get(hb, b, bytes, s);
  for (size_t i = 0; i < all; i++) EXPECT(hb[i] == value((int)(i / N), i % N, salt), "all_gather [%zu]", i);
  CHECK(ncclReduceScatter(a, b, N, ncclInt32, ncclSum, comm, s) == ncclSuccess, "reduce_scatter");
  get(hb, b, N * sizeof(int32_t), s);
  for (size_t i = 0; i < N; i++) {
    int32_t want = 0;
    for (int r = 0; r < n; r++) want += value(r, (size_t)rank * N + i, salt);
    EXPECT(hb[i] == want, "reduce_scatter [%zu]", i);
  }
  CHECK(ncclAlltoAll(a, b, N, ncclInt32, comm, s) == ncclSuccess, "all_to_all");
  get(hb, b, bytes, s);
  for (size_t i = 0; i < all; i++)
    EXPECT(hb[i] == value((int)(i / N), (size_t)rank * N + i % N, salt), "all_to_all [%zu]", i);
  CHECK(ncclGather(a, b, N, ncclInt32, root, comm, s) == ncclSuccess, "gather");
  get(hb, b, bytes, s);
  for (size_t i = 0; rank == root && i < all; i++) EXPECT(hb[i] == value((int)(i / N), i % N, salt), "gather [%zu]", i);
  CHECK(ncclScatter(a, b, N, ncclInt32, 0, comm, s) == ncclSuccess, "scatter");
  get(hb, b, N * sizeof(int32_t), s);
  for (size_t i = 0; i < N; i++) EXPECT(hb[i] == value(0, (size_t)rank * N + i, salt), "scatter [%zu]", i);
  int to = (rank + 1) % n, from = (rank + n - 1) % n;
  CHECK(ncclGroupStart() == ncclSuccess, "group start");
  CHECK(ncclSend(a, N, ncclInt32, to, comm, s) == ncclSuccess, "send");
  CHECK(ncclRecv(b, N, ncclInt32, from, comm, s) == ncclSuccess, "recv");
  CHECK(ncclGroupEnd() == ncclSuccess, "group end");
  get(hb, b, N * sizeof(int32_t), s);
  for (size_t i = 0; i < N; i++) EXPECT(hb[i] == value(from, i, salt), "ring [%zu]", i);
#undef EXPECT
  free(ha), free(hb);
  return bad;
}

static int one_rank(int rank, int n, void *arg) {
  (void)arg;
#ifdef CCS_HAVE_CUDA
  CHECK(on_host || cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
#endif
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, sh->id, rank) == ncclSuccess, "init");
  cudaStream_t s = NULL;
#ifdef CCS_HAVE_CUDA
  CHECK(on_host || cudaStreamCreate(&s) == cudaSuccess, "stream");
#endif
  size_t bytes = (size_t)n * N * sizeof(int32_t);
  int bad = 0;
  for (int nccl_alloc = 0; nccl_alloc <= 1; nccl_alloc++) {
    int32_t *a = dev_alloc(bytes, nccl_alloc), *b = dev_alloc(bytes, nccl_alloc);
    CHECK(a && b, "%s of %zu bytes", nccl_alloc ? "ncclMemAlloc" : "cudaMalloc", bytes);
    void *ha = NULL, *hb = NULL;
    if (nccl_alloc) {
      CHECK(ncclCommRegister(comm, a, bytes, &ha) == ncclSuccess, "register");
      CHECK(ncclCommRegister(comm, b, bytes, &hb) == ncclSuccess, "register");
    }
    bad |= collectives(comm, rank, n, a, b, s, nccl_alloc) | collectives(comm, rank, n, a, b, NULL, 2 + nccl_alloc);
    if (nccl_alloc) {
      CHECK(ncclCommDeregister(comm, ha) == ncclSuccess, "deregister");
      CHECK(ncclCommDeregister(comm, hb) == ncclSuccess, "deregister");
    }
    dev_free(a, nccl_alloc), dev_free(b, nccl_alloc);
  }
  CHECK(ncclCommFinalize(comm) == ncclSuccess, "finalize");
  CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
#ifdef CCS_HAVE_CUDA
  if (s) cudaStreamDestroy(s);
#endif
  return bad;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  const char *memory = getenv("CCS_TEST_MEMORY");
  on_host = memory && !strcmp(memory, "host");
#ifndef CCS_HAVE_CUDA
  if (!on_host) {
    fprintf(stderr, "nccl_device: this build has no CUDA (CCS_TEST_MEMORY=host runs on host memory)\n");
    return 2;
  }
#endif
  if (n < 1 || n > 8 || !(sh = test_shared_new(sizeof(*sh)))) return 2;
  sh->seed = test_seed();
  if (ncclGetUniqueId(&sh->id) != ncclSuccess) {
    fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  int rc = test_run_ranks(n, one_rank, NULL, 120, NULL);
  printf("nccl_device: %d ranks on %s memory: %s\n", n, on_host ? "host" : "device", rc ? "FAILED" : "every element right");
  test_shared_free(sh, sizeof(*sh));
  return rc != 0;
}
