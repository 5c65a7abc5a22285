/* What each collective means, block by block: the one description the
 * checker (check.c, symbolically), the engine's compiler (compile.c, over
 * the buffers) and the tests' oracles (tests/sim) all use.
 *
 * Participant p's block b holds before the op either its own value (of its
 * work buffer; for all_to_all, of its input buffer) or nothing; after it,
 * the reduction over every participant's block b, or a copy of block
 * `block` of participant `from`'s input, or nothing that matters. And a
 * caller's buffer holds every block of the op, or one (its own). */
#ifndef CCSD_PLAN_SHAPE_H
#define CCSD_PLAN_SHAPE_H

#include <stdint.h>

#include "plan/schedule.h"

/* Does p start with its own value of block b? */
static inline int sched_shape_has(enum sched_coll c, int root, int p, uint32_t b) {
  switch (c) {
  case SCHED_ALL_REDUCE: case SCHED_REDUCE_SCATTER: case SCHED_REDUCE: case SCHED_ALL_TO_ALL:
    return 1;
  case SCHED_ALL_GATHER: case SCHED_GATHER: return b == (uint32_t)p;
  case SCHED_BROADCAST: case SCHED_SCATTER: return p == root;
  default: return 0;
  }
}

enum sched_want_kind { SCHED_WANT_NOTHING, SCHED_WANT_REDUCED, SCHED_WANT_COPY };
struct sched_want {
  enum sched_want_kind kind;
  int from;       /* COPY: whose input */
  uint32_t block; /* COPY: which of its blocks */
};

/* What p's block b must hold when the op is over. */
static inline struct sched_want sched_shape_want(enum sched_coll c, int root, int p, uint32_t b) {
  struct sched_want none = {SCHED_WANT_NOTHING, 0, 0}, reduced = {SCHED_WANT_REDUCED, 0, 0};
  switch (c) {
  case SCHED_ALL_REDUCE: return reduced;
  case SCHED_REDUCE_SCATTER: return b == (uint32_t)p ? reduced : none;
  case SCHED_REDUCE: return p == root ? reduced : none;
  case SCHED_ALL_GATHER: return (struct sched_want){SCHED_WANT_COPY, (int)b, b};
  case SCHED_GATHER: return p == root ? (struct sched_want){SCHED_WANT_COPY, (int)b, b} : none;
  case SCHED_BROADCAST: return (struct sched_want){SCHED_WANT_COPY, root, b};
  case SCHED_SCATTER: return b == (uint32_t)p ? (struct sched_want){SCHED_WANT_COPY, root, b} : none;
  case SCHED_ALL_TO_ALL: return (struct sched_want){SCHED_WANT_COPY, (int)b, (uint32_t)p};
  default: return none;
  }
}

/* Does a caller's input (send) buffer hold every block of the op, or only
 * its own one? And its output (recv) buffer? */
static inline int sched_shape_input_whole(enum sched_coll c) {
  return c != SCHED_ALL_GATHER && c != SCHED_GATHER;
}
static inline int sched_shape_output_whole(enum sched_coll c) {
  return c != SCHED_REDUCE_SCATTER && c != SCHED_SCATTER;
}

#endif
