/* The Open MPI side of the comparison: the same sizes, timing method and
 * busbw factors as ccs-perf (client/tools/perf_math.h), float sum,
 * out of place.
 *   mpirun -np N mpi-perf COLLECTIVE MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP
 * prints "size busbw_GBs time_us" per size (rank 0). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_math.h"

static const char *const names[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                    "reduce", "all_to_all"};

static void call(enum perf_coll c, struct perf_counts k, float *s, float *r) {
  switch (c) {
  case PERF_ALL_REDUCE: MPI_Allreduce(s, r, (int)k.param, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
  case PERF_ALL_GATHER: MPI_Allgather(s, (int)k.param, MPI_FLOAT, r, (int)k.param, MPI_FLOAT, MPI_COMM_WORLD); break;
  case PERF_REDUCE_SCATTER: MPI_Reduce_scatter_block(s, r, (int)k.param, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
  case PERF_BROADCAST: MPI_Bcast(r, (int)k.param, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
  case PERF_REDUCE: MPI_Reduce(s, r, (int)k.param, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD); break;
  default: MPI_Alltoall(s, (int)k.param, MPI_FLOAT, r, (int)k.param, MPI_FLOAT, MPI_COMM_WORLD); break;
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc != 7) {
    if (rank == 0) fprintf(stderr, "usage: mpi-perf COLLECTIVE MIN MAX FACTOR ITERS WARMUP\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int c = -1;
  for (int i = 0; i < 6; i++)
    if (!strcmp(argv[1], names[i])) c = i;
  size_t min = strtoull(argv[2], NULL, 10), max = strtoull(argv[3], NULL, 10);
  double factor = atof(argv[4]);
  int iters = atoi(argv[5]), warmup = atoi(argv[6]);
  if (c < 0 || factor <= 1 || iters < 1) MPI_Abort(MPI_COMM_WORLD, 2);
  struct perf_counts big = perf_counts((enum perf_coll)c, max, 4, n);
  size_t elems = (big.send > big.recv ? big.send : big.recv) + 16;
  float *s = malloc(elems * 4), *r = malloc(elems * 4);
  for (size_t i = 0; i < elems; i++) s[i] = (float)(i % 7), r[i] = 0;
  for (size_t size = min; size <= max; size = (size_t)((double)size * factor)) {
    struct perf_counts k = perf_counts((enum perf_coll)c, size, 4, n);
    for (int i = 0; i < warmup; i++) call((enum perf_coll)c, k, s, r);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) call((enum perf_coll)c, k, s, r);
    double t = (MPI_Wtime() - t0) / iters, sum;
    MPI_Allreduce(&t, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    t = sum / n; /* -a 1: the average over ranks, as ccs-perf */
    double busbw = perf_algbw((enum perf_coll)c, k, 4, t) * perf_bus_factor((enum perf_coll)c, n);
    if (rank == 0) printf("%zu %.4f %.2f\n", k.bytes, busbw, t * 1e6);
    if (size * factor <= size) break;
  }
  free(s);
  free(r);
  MPI_Finalize();
  return 0;
}
