/* Choosing an algorithm per op: an alpha-beta cost model (latency per step
 * plus bytes over bandwidth, per link kind) and rules that override it, per
 * collective and size range, in the style of NCCL_ALGO and oneCCL:
 *   "all_reduce:ring;all_reduce:tree:0-64K;broadcast:tree"
 * A rule without a collective ("ring") applies to every collective that
 * algorithm builds; the others keep the model's choice. Later rules win. */
#ifndef CCSD_TUNER_H
#define CCSD_TUNER_H

#include <stddef.h>
#include <stdint.h>

#include "plan/schedule.h"

#define CCSD_MAX_RULES 64

struct algo_rule {
  int coll; /* enum sched_coll, or -1 for every collective */
  enum sched_algo algo;
  uint64_t lo, hi; /* bytes, inclusive */
};

struct algo_rules {
  struct algo_rule r[CCSD_MAX_RULES];
  int n;
};

struct link_model {
  double alpha_s;   /* per step */
  double beta_Bps;  /* bytes per second */
  int mapped;       /* every participant's memory is mapped here (one node) */
};

/* Between daemons over TCP on these machines (REFERENCE.md: loopback TCP
 * 1.6-2.7 GB/s; a blocking wake-up 15 us). */
extern const struct link_model ccsd_link_tcp;
/* Ranks of one daemon: the engine compiles every algorithm to the same
 * one pass over the mapped buffers (engine.h), so the model picks direct,
 * the fewest steps; rules still force others. */
extern const struct link_model ccsd_link_mapped;

int ccsd_algo_rules_parse(const char *text, struct algo_rules *ret, char *err, size_t errlen);

/* Does algorithm a build collective c for n participants? */
int ccsd_algo_builds(enum sched_algo a, enum sched_coll c, int n);

/* Model time of one op of `bytes` (nccl-tests' size) with algorithm a. */
double ccsd_algo_cost(enum sched_algo a, enum sched_coll c, int n, uint64_t bytes,
                      const struct link_model *link);

/* The algorithm for this op, and in why a sentence saying why (none when
 * whylen is 0: formatting it costs more than choosing). */
enum sched_algo ccsd_tune(enum sched_coll c, int n, uint64_t bytes, const struct link_model *link,
                          const struct algo_rules *rules, char *why, size_t whylen);

#endif
