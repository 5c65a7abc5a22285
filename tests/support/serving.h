/* Does the daemon still serve? What the tests of faults and tenants start
 * from and end with: a daemon and the baseline of what it holds, fresh
 * unique ids of either tenant, and forked ranks that each check one
 * all_reduce element by element. Calls libccs: link ccs_test_client. */
#ifndef CCS_TEST_SERVING_H
#define CCS_TEST_SERVING_H

#include <stddef.h>

#include "ccs.h"
#include "harness.h"

struct test_daemon_state;

/* A fresh unique id into *ret (shared memory, for the ranks forked next),
 * asked for as this process, or as the other tenant; fails the test when
 * refused. */
void test_new_id(ccs_unique_id_t *ret);
void test_other_tenant_id(ccs_unique_id_t *ret);

/* Starts d with args and asks it for a unique id (*ret_id): that
 * connection stays, so it is part of what the daemon then holds, the
 * baseline (*ret_clean) tests compare with. 0 on success. */
int test_daemon_start_clean(struct test_daemon *d, const char *const *args, ccs_unique_id_t *ret_id,
                            struct test_daemon_state *ret_clean);

/* One all_reduce (sum): rank r's element i is an integer the type holds
 * exactly, so the sums are exact too. */
struct test_sum {
  ccs_dtype_t dtype;
  size_t count;
  double (*input)(int rank, size_t i);
};
extern const struct test_sum test_sum_one_int; /* one int32: rank + 1 */
/* 40000 int64 (320 KB): past inline_bytes (256 KiB by default), so the op
 * runs on the executor's threads and, across daemons, over the network,
 * not on the control loop: what "still serving" means. */
extern const struct test_sum test_sum_executor;

/* n forked ranks join a comm on *id, as the other tenant when asked, and
 * check sum's result element by element. Returns how many failed (could
 * not join, got an error or a wrong element). */
int test_run_sum(int n, const ccs_unique_id_t *id, const struct test_sum *sum, int other_tenant,
                 double timeout_s);

#endif
