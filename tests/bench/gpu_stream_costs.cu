/* What the daemon's GPU submitter spends per op, op after op on one
 * stream (daemon/run/gpu_cuda.c, queue_op): a wait for a flag in host
 * memory, a small kernel, a flag write, and the host function that hands
 * the op back; then the same without the host function, with it on a
 * second stream behind an event, with an event alone, and kernels alone.
 * Prints, per variant, the host's time to queue an op and the time per op
 * until the stream is through (so the stream's own pace shows).
 *
 *   gpu_stream_costs [OPS]     (default 2000; needs a GPU)
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

__global__ void add_one(float *x) { x[threadIdx.x] += 1.0f; }

static volatile long handed_back;
static void CUDART_CB hand_back(void *arg) {
  (void)arg;
  handed_back++;
}

enum variant { FULL, NO_HOST_FN, HOST_FN_BESIDE, EVENT_ONLY, KERNEL_ONLY, NVARIANTS };
static const char *const names[] = {
    "wait + kernel + write + host function (today)",
    "wait + kernel + write",
    "wait + kernel + write + event; host function on a second stream",
    "wait + kernel + write + event",
    "kernel alone",
};

#define CHECK(x)                                                              \
  do {                                                                        \
    if ((x) != 0) {                                                           \
      fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #x);          \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

int main(int argc, char **argv) {
  int ops = argc > 1 ? atoi(argv[1]) : 2000;
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(0));
  uint32_t *flags;
  CHECK(cudaHostAlloc((void **)&flags, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
  flags[0] = 1; /* ready: already there, as for a rank that called first */
  CUdeviceptr ready, done;
  CHECK(cuMemHostGetDevicePointer(&ready, flags, 0));
  done = ready + 64;
  float *x;
  CHECK(cudaMalloc((void **)&x, 32 * sizeof(float)));
  cudaStream_t st, beside;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&beside, cudaStreamNonBlocking));
  cudaEvent_t *ev = (cudaEvent_t *)calloc(ops, sizeof(*ev));
  for (int i = 0; i < ops; i++) CHECK(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
  printf("# %d ops on one stream per variant; us per op\n", ops);
  printf("# %-66s %10s %10s\n", "variant", "queue", "through");
  for (int round = 0; round < 2; round++) /* the first round warms up */
    for (int v = 0; v < NVARIANTS; v++) {
      CHECK(cudaStreamSynchronize(st));
      CHECK(cudaStreamSynchronize(beside));
      double t0 = now();
      for (int i = 0; i < ops; i++) {
        if (v != KERNEL_ONLY) CHECK(cuStreamWaitValue32(st, ready, 1, CU_STREAM_WAIT_VALUE_GEQ));
        add_one<<<1, 32, 0, st>>>(x);
        if (v == KERNEL_ONLY) continue;
        CHECK(cuStreamWriteValue32(st, done, (uint32_t)i, CU_STREAM_WRITE_VALUE_DEFAULT));
        if (v == FULL) CHECK(cudaLaunchHostFunc(st, hand_back, NULL));
        if (v == HOST_FN_BESIDE || v == EVENT_ONLY) CHECK(cudaEventRecord(ev[i], st));
        if (v == HOST_FN_BESIDE) {
          CHECK(cudaStreamWaitEvent(beside, ev[i], 0));
          CHECK(cudaLaunchHostFunc(beside, hand_back, NULL));
        }
      }
      double t1 = now();
      CHECK(cudaStreamSynchronize(st));
      double t2 = now();
      CHECK(cudaStreamSynchronize(beside));
      double t3 = now();
      if (round == 1)
        printf("  %-66s %10.2f %10.2f%s\n", names[v], (t1 - t0) / ops * 1e6,
               ((v == HOST_FN_BESIDE ? t3 : t2) - t0) / ops * 1e6,
               v == HOST_FN_BESIDE ? " (host functions done)" : "");
    }
  printf("# host functions run: %ld\n", handed_back);
  return 0;
}
