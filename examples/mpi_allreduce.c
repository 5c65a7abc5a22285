/* An MPI program that leaves its collectives to ccs: MPI starts the ranks
 * and says who is who, ccs (through the node's daemon) reduces. Each rank
 * checks the result against MPI_Allreduce's.
 *   mpicc mpi_allreduce.c $(pkg-config --cflags --libs ccs) -o mpi_allreduce
 *   mpirun -np 4 ./mpi_allreduce */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include <ccs.h>

#define COUNT 100000

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  ccs_comm_t *comm;
  ccs_result_t rc = ccs_comm_init_from_env(&comm); /* mpirun's variables: no id to pass */
  if (rc != CCS_OK) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(NULL));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  double *x = malloc(sizeof(double) * COUNT), *ccs = malloc(sizeof(double) * COUNT),
         *mpi = malloc(sizeof(double) * COUNT);
  srand((unsigned)rank + 1);
  for (int i = 0; i < COUNT; i++) x[i] = rand() % 1000;
  rc = ccs_all_reduce(x, ccs, COUNT, CCS_FLOAT64, CCS_SUM, comm, NULL);
  MPI_Allreduce(x, mpi, COUNT, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  int wrong = rc != CCS_OK;
  for (int i = 0; i < COUNT; i++) wrong += ccs[i] != mpi[i];
  int all;
  MPI_Allreduce(&wrong, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("%d ranks: %d elements differ from MPI_Allreduce's\n", n, all);
  ccs_comm_destroy(comm);
  free(x), free(ccs), free(mpi);
  MPI_Finalize();
  return all != 0;
}
