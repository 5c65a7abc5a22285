/* Rank, size, job identity and root from each launcher's variables
 * (client/launcher.c), with environments made here: which launcher wins,
 * what is refused and how it is said, Slurm's node lists, and where the
 * ranks' daemons meet when the job spans nodes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "launcher.h"

/* An environment: NULL-terminated NAME=VALUE strings. */
static const char *get(const char *name, void *arg) {
  for (const char *const *e = arg; *e; e++) {
    size_t n = strlen(name);
    if (!strncmp(*e, name, n) && (*e)[n] == '=') return *e + n + 1;
  }
  return NULL;
}

static int read_env(const char *const *env, struct ccs__launch *l, char *err) {
  return ccs__launch_read(get, (void *)env, l, err, 512);
}

static void test_each_launcher(void **state) {
  (void)state;
  struct ccs__launch l;
  char err[512];
  const char *ompi[] = {"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_SIZE=4",
                        "PMIX_RANK=3", "PMIX_NAMESPACE=286785537", "OMPI_MCA_ess_base_jobid=286785537", NULL};
  assert_int_equal(read_env(ompi, &l, err), 0);
  assert_int_equal(l.rank, 3);
  assert_int_equal(l.nranks, 4);
  assert_string_equal(l.launcher, "Open MPI");
  assert_string_equal(l.job, "pmix:286785537");
  assert_string_equal(l.root, ""); /* one node: its own daemon */
  const char *slurm[] = {"SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_JOB_ID=4711", "SLURM_STEP_ID=2",
                         "SLURM_JOB_NUM_NODES=1", NULL};
  assert_int_equal(read_env(slurm, &l, err), 0);
  assert_int_equal(l.rank, 5);
  assert_int_equal(l.nranks, 8);
  assert_string_equal(l.job, "slurm:4711.2");
  const char *torch[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", "TORCHELASTIC_RUN_ID=abc", NULL};
  assert_int_equal(read_env(torch, &l, err), 0);
  assert_string_equal(l.launcher, "torchrun");
  assert_string_equal(l.job, "torchrun:abc");
  const char *pmi[] = {"PMI_RANK=0", "PMI_SIZE=1", "CCS_JOB=mine", NULL};
  assert_int_equal(read_env(pmi, &l, err), 0);
  assert_string_equal(l.launcher, "PMI");
  assert_string_equal(l.job, "mine");
  /* ccs's own come first, and CCS_JOB names the job over any launcher's */
  const char *both[] = {"CCS_RANK=0", "CCS_NRANKS=2", "OMPI_COMM_WORLD_RANK=1",
                        "OMPI_COMM_WORLD_SIZE=2", "PMIX_NAMESPACE=9", "CCS_JOB=override", NULL};
  assert_int_equal(read_env(both, &l, err), 0);
  assert_string_equal(l.launcher, "CCS");
  assert_int_equal(l.rank, 0);
  assert_string_equal(l.job, "override");
}

static void test_refusals(void **state) {
  (void)state;
  struct ccs__launch l;
  char err[512];
  const char *none[] = {"HOME=/root", NULL};
  assert_int_equal(read_env(none, &l, err), 1);
  assert_non_null(strstr(err, "no launcher's rank"));
  const char *no_job[] = {"CCS_RANK=0", "CCS_NRANKS=2", NULL};
  assert_int_equal(read_env(no_job, &l, err), -1);
  assert_non_null(strstr(err, "set CCS_JOB"));
  const char *bad_rank[] = {"SLURM_PROCID=8", "SLURM_NTASKS=8", "SLURM_JOB_ID=1", NULL};
  assert_int_equal(read_env(bad_rank, &l, err), -1);
  assert_non_null(strstr(err, "SLURM_PROCID=8"));
  const char *junk[] = {"RANK=one", "WORLD_SIZE=2", NULL};
  assert_int_equal(read_env(junk, &l, err), -1);
  const char *no_size[] = {"PMIX_RANK=0", "PMIX_NAMESPACE=x", NULL};
  assert_int_equal(read_env(no_size, &l, err), -1);
  assert_non_null(strstr(err, "PMIX_RANK=0 but PMI_SIZE=(unset)"));
  assert_non_null(strstr(err, "set CCS_RANK and CCS_NRANKS"));
  /* ranks on several nodes and nowhere to meet */
  const char *spread[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=8",
                          "OMPI_COMM_WORLD_LOCAL_SIZE=4", "PMIX_NAMESPACE=7", NULL};
  assert_int_equal(read_env(spread, &l, err), -1);
  assert_non_null(strstr(err, "span nodes (4 here): set CCS_ROOT"));
  const char *port[] = {"CCS_RANK=0", "CCS_NRANKS=1", "CCS_JOB=j", "CCS_ROOT_PORT=70000", NULL};
  assert_int_equal(read_env(port, &l, err), -1);
  assert_non_null(strstr(err, "CCS_ROOT_PORT=70000"));
  const char *unknown[] = {"CCS_RANK=0", "CCS_NRANKS=1", "CCS_JOB=j", "CCS_ROOT=no-port-given", NULL};
  assert_int_equal(read_env(unknown, &l, err), -1);
  assert_non_null(strstr(err, "CCS_ROOT"));
}

static void test_roots(void **state) {
  (void)state;
  struct ccs__launch l;
  char err[512];
  const char *given[] = {"CCS_RANK=0", "CCS_NRANKS=2", "CCS_JOB=j", "CCS_ROOT=127.0.0.1:7123", NULL};
  assert_int_equal(read_env(given, &l, err), 0);
  assert_string_equal(l.root, "127.0.0.1:7123");
  const char *slurm[] = {"SLURM_PROCID=0", "SLURM_NTASKS=8", "SLURM_JOB_ID=1", "SLURM_JOB_NUM_NODES=2",
                         "SLURM_JOB_NODELIST=localhost,other", "CCS_ROOT_PORT=7200", NULL};
  assert_int_equal(read_env(slurm, &l, err), 0);
  assert_true(!strcmp(l.root, "127.0.0.1:7200") || !strcmp(l.root, "[::1]:7200"));
  /* srun --mpi=pmix: PMIx gives the rank, Slurm the size and the first node */
  const char *pmix[] = {"PMIX_RANK=5", "PMIX_NAMESPACE=slurm.pmix.77.0", "SLURM_PROCID=5",
                        "SLURM_NTASKS=8", "SLURM_JOB_ID=77", "SLURM_STEP_ID=0",
                        "SLURM_JOB_NUM_NODES=2", "SLURM_JOB_NODELIST=localhost,other", NULL};
  assert_int_equal(read_env(pmix, &l, err), 0);
  assert_int_equal(l.rank, 5);
  assert_int_equal(l.nranks, 8);
  assert_string_equal(l.launcher, "Slurm");
  assert_string_equal(l.job, "slurm:77.0");
  assert_true(!strcmp(l.root, "127.0.0.1:7000") || !strcmp(l.root, "[::1]:7000"));
  /* srun --mpi=pmi2: PMI's rank and size, the root still Slurm's first node */
  const char *pmi2[] = {"PMI_RANK=1", "PMI_SIZE=4", "SLURM_JOB_ID=78", "SLURM_JOB_NUM_NODES=2",
                        "SLURM_JOB_NODELIST=localhost", NULL};
  assert_int_equal(read_env(pmi2, &l, err), 0);
  assert_string_equal(l.launcher, "PMI");
  assert_true(!strcmp(l.root, "127.0.0.1:7000") || !strcmp(l.root, "[::1]:7000"));
  const char *torch[] = {"RANK=3", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=2", "TORCHELASTIC_RUN_ID=r",
                         "MASTER_ADDR=127.0.0.1", NULL};
  assert_int_equal(read_env(torch, &l, err), 0);
  assert_string_equal(l.root, "127.0.0.1:7000"); /* the docs' port, not torchrun's store */
}

static void test_slurm_node_lists(void **state) {
  (void)state;
  char h[64];
  assert_int_equal(ccs__slurm_first_host("gpu[07-09,12],cpu3", h, sizeof(h)), 0);
  assert_string_equal(h, "gpu07");
  assert_int_equal(ccs__slurm_first_host("node1,node2", h, sizeof(h)), 0);
  assert_string_equal(h, "node1");
  assert_int_equal(ccs__slurm_first_host("a[3]", h, sizeof(h)), 0);
  assert_string_equal(h, "a3");
  assert_int_equal(ccs__slurm_first_host("single", h, sizeof(h)), 0);
  assert_string_equal(h, "single");
  assert_int_equal(ccs__slurm_first_host("", h, sizeof(h)), -1);
  assert_int_equal(ccs__slurm_first_host("[1-2]", h, sizeof(h)), -1);
  assert_int_equal(ccs__slurm_first_host("x[a-b]", h, sizeof(h)), -1);
  assert_int_equal(ccs__slurm_first_host("averyveryverylongname", h, 8), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_launcher),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_roots),
      cmocka_unit_test(test_slurm_node_lists),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
