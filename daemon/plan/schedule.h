/* Schedules: what one participant of an op does, as data.
 *
 * Each participant holds a work buffer cut into nblocks blocks (and, for
 * all_to_all, an input buffer of as many blocks). Steps run in order; a
 * receive waits for the matching send of its peer, matched first-in
 * first-out per ordered pair of participants. Builders are pure functions of
 * (collective, participants, my index, root, blocks wanted): they allocate
 * only the schedule they return, log nothing and touch no socket. The
 * checker (check.c) runs all participants' schedules symbolically and
 * proves the result; the simulator (tests/sim) runs them on real data.
 *
 * What the work buffer holds when the op starts, and must hold at the end:
 *   all_reduce      all blocks: own input   -> every block reduced over all
 *   reduce_scatter  all blocks: own input   -> block p reduced over all (at p)
 *   reduce          all blocks: own input   -> every block reduced (at root)
 *   all_gather      block p: own input      -> block b = participant b's
 *   gather          block p: own input      -> block b = participant b's (at root)
 *   broadcast       all blocks at root      -> every block = root's
 *   scatter         all blocks at root      -> block p = root's block p (at p)
 *   all_to_all      input block q: for q    -> block q = q's input block p
 */
#ifndef CCSD_SCHEDULE_H
#define CCSD_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

enum sched_op {
  SCHED_SEND = 1,        /* block (of buf) to peer */
  SCHED_RECV,            /* from peer into block */
  SCHED_RECV_REDUCE,     /* from peer, reduced into block */
  SCHED_COPY,            /* local: src_block of src_buf into block */
  SCHED_FINALIZE,        /* block holds the complete reduction: finish it (avg divides) */
};

enum { SCHED_WORK = 0, SCHED_INPUT = 1 }; /* which buffer a step names */

struct sched_step {
  uint8_t op;
  uint8_t buf, src_buf;
  int32_t peer;
  uint32_t block, src_block;
};

struct schedule {
  uint32_t nblocks;
  struct sched_step *steps;
  size_t nsteps, cap;
  int failed; /* out of memory while building */
};

enum sched_coll {
  SCHED_ALL_REDUCE,
  SCHED_REDUCE_SCATTER,
  SCHED_REDUCE,
  SCHED_ALL_GATHER,
  SCHED_GATHER,
  SCHED_BROADCAST,
  SCHED_SCATTER,
  SCHED_ALL_TO_ALL,
  SCHED_COLL_COUNT
};

enum sched_algo { SCHED_DIRECT, SCHED_RING, SCHED_TREE, SCHED_RHD, SCHED_ALGO_COUNT };

const char *sched_coll_name(enum sched_coll c);
const char *sched_algo_name(enum sched_algo a);

/* Builds participant me's schedule of n. pipeline: blocks to cut a
 * broadcast or reduce into (>= 1); other collectives choose their own.
 * 0 on success; -1 when this algorithm does not implement the collective
 * (for this n), -2 when out of memory. */
int sched_build(enum sched_algo a, enum sched_coll c, int n, int me, int root, int pipeline,
                struct schedule *ret);
void sched_free(struct schedule *s);

/* A schedule among groups of participants, in their members' blocks: a
 * step on block b becomes one step per block first[b] .. first[b+1]-1 (for
 * the collectives whose block b is participant b's). 0; -1 when a copy
 * would join groups of unequal size; -2 when out of memory. */
int sched_expand(struct schedule *s, const int *first);

/* builders' tools */
void sched_init(struct schedule *s, uint32_t nblocks);
void sched_add(struct schedule *s, uint8_t op, int32_t peer, uint32_t block);
void sched_add_send_input(struct schedule *s, int32_t peer, uint32_t block);
void sched_add_copy(struct schedule *s, uint8_t src_buf, uint32_t src_block, uint32_t block);

/* The elements of block b when count elements are cut into nblocks. */
static inline void sched_block_range(size_t count, uint32_t nblocks, uint32_t b, size_t *begin,
                                     size_t *len) {
  size_t lo = count * b / nblocks, hi = count * (b + 1) / nblocks;
  *begin = lo;
  *len = hi - lo;
}

/* Runs all n schedules symbolically: every send is received, nothing is
 * read before it is written or reduced twice, no deadlock, and every block
 * ends as the collective requires. 0 when proven; else -1 and a reason. */
int sched_check(enum sched_coll c, int n, int root, const struct schedule *scheds, char *err,
                size_t errlen);

/* Text of a schedule for a reader ("ccs-perf --dump-schedule"). */
void sched_dump(const struct schedule *s, int me, char *buf, size_t len);



/* Collectives whose blocks cut one buffer of count elements (all_reduce,
 * reduce, broadcast), and those whose blocks are one participant's count
 * elements each (the others). */
static inline int sched_coll_splits(enum sched_coll c) {
  return c == SCHED_ALL_REDUCE || c == SCHED_REDUCE || c == SCHED_BROADCAST;
}

static inline void sched_block_elems(enum sched_coll c, size_t count, uint32_t nblocks, uint32_t b,
                                     size_t *begin, size_t *len) {
  if (sched_coll_splits(c)) {
    sched_block_range(count, nblocks, b, begin, len);
  } else {
    *begin = count * b;
    *len = count;
  }
}
#endif
