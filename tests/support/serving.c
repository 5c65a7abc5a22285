#include "serving.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "raw.h"
#include "reference.h"

void test_new_id(ccs_unique_id_t *ret) { assert_int_equal(ccs_get_unique_id(ret), CCS_OK); }

static int other_tenant_id(int rank, int n, void *ret) {
  test_become_other_tenant();
  return ccs_get_unique_id(ret) != CCS_OK;
}

void test_other_tenant_id(ccs_unique_id_t *ret) {
  assert_int_equal(test_run_ranks(1, other_tenant_id, ret, 30, NULL), 0);
}

int test_daemon_start_clean(struct test_daemon *d, const char *const *args, ccs_unique_id_t *ret_id,
                            struct test_daemon_state *ret_clean) {
  if (test_daemon_start(d, args) || ccs_get_unique_id(ret_id) != CCS_OK) return -1;
  test_daemon_state(d, ret_clean);
  return 0;
}

static double rank_plus_one(int rank, size_t i) { return rank + 1; }
const struct test_sum test_sum_one_int = {CCS_INT32, 1, rank_plus_one};

static double rank_and_index(int rank, size_t i) { return (double)(rank + 1) * 1000003.0 + (double)(i % 977); }
const struct test_sum test_sum_executor = {CCS_INT64, 40000, rank_and_index};

struct sum_run {
  const ccs_unique_id_t *id;
  const struct test_sum *sum;
  int other_tenant;
};

/* 1: no comm; 2: the all_reduce failed or an element is wrong */
static int sum_rank(int rank, int n, void *arg) {
  const struct sum_run *run = arg;
  const struct test_sum *s = run->sum;
  if (run->other_tenant) test_become_other_tenant();
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, *run->id, rank) != CCS_OK) return 1;
  size_t bytes = s->count * ccs_dtype_size(s->dtype);
  void *x = malloc(bytes), *y = malloc(bytes);
  for (size_t i = 0; i < s->count; i++) ref_set(s->dtype, x, i, s->input(rank, i));
  int bad = ccs_all_reduce(x, y, s->count, s->dtype, CCS_SUM, comm, NULL) != CCS_OK;
  for (size_t i = 0; i < s->count && !bad; i++) {
    double want = 0;
    for (int r = 0; r < n; r++) want += s->input(r, i);
    bad = ref_get(s->dtype, y, i) != want;
  }
  free(x);
  free(y);
  ccs_comm_destroy(comm);
  return bad ? 2 : 0;
}

int test_run_sum(int n, const ccs_unique_id_t *id, const struct test_sum *sum, int other_tenant,
                 double timeout_s) {
  struct sum_run run = {id, sum, other_tenant};
  return test_run_ranks(n, sum_rank, &run, timeout_s, NULL);
}
