#include "have_gpu.h"

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

int test_have_gpu(const char *prog) {
  pid_t pid = fork();
  if (pid == 0) {
    int gpus = 0;
    cudaError_t e = cudaGetDeviceCount(&gpus);
    if (e != cudaSuccess || gpus < 1)
      printf("%s: no GPU here (%s): nothing to check\n", prog, cudaGetErrorString(e));
    fflush(stdout);
    _exit(e == cudaSuccess && gpus > 0 ? 0 : 1);
  }
  int status;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0;
}
