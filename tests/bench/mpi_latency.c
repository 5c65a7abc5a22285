/* Open MPI's side of scripts/compare_small.sh: rank 0's median time of an
 * 8 B float64 sum all_reduce, or of a barrier, as tests/bench/latency.c
 * measures ccs's; or rank 0's calls per second of ITERS MPI_Iallreduce
 * posted back to back, then MPI_Waitall (as ccs's host-stream row).
 *   mpi-latency all_reduce|barrier|stream ITERS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int iters = argc == 3 ? atoi(argv[2]) : 0;
  if (iters < 1) {
    if (rank == 0) fprintf(stderr, "usage: mpi-latency all_reduce|barrier ITERS\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (!strcmp(argv[1], "stream")) {
    MPI_Request *req = malloc(sizeof(*req) * (size_t)iters);
    double x = 1, *y = malloc(sizeof(double) * (size_t)iters), rate = 0;
    for (int round = 0; round < 2; round++) { /* the first warms up */
      double t0 = MPI_Wtime();
      for (int i = 0; i < iters; i++) MPI_Iallreduce(&x, &y[i], 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &req[i]);
      MPI_Waitall(iters, req, MPI_STATUSES_IGNORE);
      rate = iters / (MPI_Wtime() - t0);
    }
    if (rank == 0) printf("%.0f\n", rate);
    MPI_Finalize();
    return 0;
  }
  int barrier = !strcmp(argv[1], "barrier");
  double *t = malloc(sizeof(double) * (size_t)iters), x = 1, y;
  for (int i = 0; i < iters + 20; i++) {
    double t0 = MPI_Wtime();
    if (barrier) MPI_Barrier(MPI_COMM_WORLD);
    else MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (i >= 20) t[i - 20] = (MPI_Wtime() - t0) * 1e6;
  }
  qsort(t, (size_t)iters, sizeof(double), cmp);
  if (rank == 0) printf("%.2f\n", t[iters / 2]);
  free(t);
  MPI_Finalize();
  return 0;
}
