/* A first program: every rank adds its numbers to everyone's. Run it under
 * any launcher (mpirun -np 4 ./first, srun, torchrun) or by hand
 * (CCS_RANK=r CCS_NRANKS=n CCS_JOB=name ./first): the ranks find each other
 * through the node's daemon by the job's name.
 *   cc first.c $(pkg-config --cflags --libs ccs) -o first */
#include <stdio.h>

#include <ccs.h>

int main(void) {
  ccs_comm_t *comm;
  ccs_result_t rc = ccs_comm_init_from_env(&comm);
  if (rc != CCS_OK) {
    fprintf(stderr, "init: %s: %s\n", ccs_result_name(rc), ccs_comm_last_error(NULL));
    return 1;
  }
  int rank, n;
  ccs_comm_user_rank(comm, &rank);
  ccs_comm_count(comm, &n);
  float x[4];
  for (int i = 0; i < 4; i++) x[i] = (float)(rank + i);
  rc = ccs_all_reduce(x, x, 4, CCS_FLOAT32, CCS_SUM, comm, NULL);
  if (rc != CCS_OK) {
    fprintf(stderr, "all_reduce: %s: %s\n", ccs_result_name(rc), ccs_comm_last_error(comm));
    return 1;
  }
  int ok = 1;
  for (int i = 0; i < 4; i++) ok &= x[i] == (float)(n * (n - 1) / 2 + n * i);
  printf("rank %d of %d: %g %g %g %g %s\n", rank, n, x[0], x[1], x[2], x[3], ok ? "(right)" : "(WRONG)");
  ccs_comm_destroy(comm);
  return ok ? 0 : 1;
}
