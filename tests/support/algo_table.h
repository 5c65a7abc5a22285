/* Which algorithm builds which collective (docs/algorithms.md, "Schedules
 * and builders"), written down here apart from the builders so that the
 * tests hold them to it exactly: a builder that stops building one of
 * these, or starts building another, fails test_schedules and
 * test_engine, and a forced algorithm that did not run where it builds
 * fails test_collectives. The same for every participant count. Indexed
 * by enum sched_coll, in the order of ccs__coll_kind for the eight
 * collectives (all_reduce, reduce_scatter, reduce, all_gather, gather,
 * broadcast, scatter, all_to_all). */
#ifndef CCS_TEST_ALGO_TABLE_H
#define CCS_TEST_ALGO_TABLE_H

#include <string.h>

enum { ALGO_TABLE_COLLS = 8, ALGO_TABLE_ALGOS = 4 };

/* by algorithm name (direct, ring, tree, rhd), then collective name */
static const struct {
  const char *algo;
  const char *builds[ALGO_TABLE_COLLS + 1];
} algo_table[ALGO_TABLE_ALGOS] = {
    {"direct", {"all_reduce", "reduce_scatter", "reduce", "all_gather", "gather", "broadcast",
                "scatter", "all_to_all", NULL}},
    {"ring", {"all_reduce", "reduce_scatter", "reduce", "all_gather", "broadcast", NULL}},
    {"tree", {"all_reduce", "reduce", "gather", "broadcast", "scatter", NULL}},
    {"rhd", {"all_reduce", "reduce_scatter", "all_gather", NULL}},
};

/* Does the algorithm of this name build the collective of this name? -1:
 * no such algorithm. */
static inline int algo_table_builds(const char *algo, const char *coll) {
  for (int a = 0; a < ALGO_TABLE_ALGOS; a++) {
    if (strcmp(algo_table[a].algo, algo)) continue;
    for (int c = 0; algo_table[a].builds[c]; c++)
      if (!strcmp(algo_table[a].builds[c], coll)) return 1;
    return 0;
  }
  return -1;
}

/* How many (algorithm, collective) pairs build: the table's size. */
static inline int algo_table_pairs(void) {
  int n = 0;
  for (int a = 0; a < ALGO_TABLE_ALGOS; a++)
    for (int c = 0; algo_table[a].builds[c]; c++) n++;
  return n;
}

#endif
