/* Which builder makes which schedule: the one entry to the builders
 * (algo/), which use only the step list (schedule.c). */
#include "plan/algo/algo.h"
#include "plan/schedule.h"

int sched_build(enum sched_algo a, enum sched_coll c, int n, int me, int root, int pipeline,
                struct schedule *ret) {
  sched_init(ret, 0); /* a builder that declines leaves nothing to free */
  if (n < 1 || me < 0 || me >= n || root < 0 || root >= n || pipeline < 1) return -1;
  int rc;
  switch (a) {
  case SCHED_DIRECT: rc = algo_direct(c, n, me, root, ret); break;
  case SCHED_RING: rc = algo_ring(c, n, me, root, pipeline, ret); break;
  case SCHED_TREE: rc = algo_tree(c, n, me, root, pipeline, ret); break;
  case SCHED_RHD: rc = algo_rhd(c, n, me, ret); break;
  default: rc = -1; break;
  }
  if (rc == 0 && ret->failed) rc = -2;
  if (rc != 0) sched_free(ret);
  return rc;
}
