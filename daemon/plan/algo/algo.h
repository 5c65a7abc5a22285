/* The schedule builders. They see only the schedule type (schedule.h). */
#ifndef CCSD_ALGO_H
#define CCSD_ALGO_H

#include "plan/schedule.h"

int algo_direct(enum sched_coll c, int n, int me, int root, struct schedule *s);
int algo_ring(enum sched_coll c, int n, int me, int root, int pipeline, struct schedule *s);
int algo_tree(enum sched_coll c, int n, int me, int root, int pipeline, struct schedule *s);
int algo_rhd(enum sched_coll c, int n, int me, struct schedule *s);

#endif
