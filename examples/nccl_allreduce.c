/* A program written for NCCL, unchanged: run it on ccs by putting
 * libccs-nccl first (LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/ccs-nccl).
 * On a machine without a GPU its buffers are host memory, which the shim
 * takes as well. Ranks come from mpirun (or CCS_RANK/CCS_NRANKS); rank 0
 * writes the unique id to a file the others read.
 *   cc nccl_allreduce.c -I/usr/local/cuda/include -L... -lnccl -o nccl_allreduce */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int env_int(const char *a, const char *b) {
  const char *v = getenv(a) ? getenv(a) : getenv(b);
  return v ? atoi(v) : -1;
}

int main(int argc, char **argv) {
  int rank = env_int("OMPI_COMM_WORLD_RANK", "CCS_RANK"), n = env_int("OMPI_COMM_WORLD_SIZE", "CCS_NRANKS");
  const char *path = argc > 1 ? argv[1] : "nccl.id";
  if (rank < 0 || n < 1) {
    fprintf(stderr, "start under mpirun, or set CCS_RANK and CCS_NRANKS\n");
    return 2;
  }
  ncclUniqueId id;
  if (rank == 0) {
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (ncclGetUniqueId(&id) != ncclSuccess || !f || fwrite(&id, sizeof(id), 1, f) != 1 || fclose(f) ||
        rename(tmp, path))
      return 1;
  } else {
    FILE *f = NULL;
    for (int tries = 0; tries < 3000 && !f; tries++) f = fopen(path, "rb"), f ? (void)0 : (void)usleep(10000);
    if (!f || fread(&id, sizeof(id), 1, f) != 1) return 1;
    fclose(f);
  }
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) {
    fprintf(stderr, "rank %d: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  int x[1000], wrong = 0;
  for (int i = 0; i < 1000; i++) x[i] = rank * i;
  ncclResult_t rc = ncclAllReduce(x, x, 1000, ncclInt32, ncclSum, comm, 0);
  for (int i = 0; i < 1000; i++) wrong += x[i] != i * n * (n - 1) / 2;
  printf("rank %d: %s, %d wrong\n", rank, ncclGetErrorString(rc), wrong);
  ncclCommDestroy(comm);
  if (rank == 0) unlink(path);
  return rc != ncclSuccess || wrong;
}
