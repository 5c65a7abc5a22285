#ifndef CCSD_PLAN_PLAN_CACHE_H
#define CCSD_PLAN_PLAN_CACHE_H

#include <stdint.h>

#include "plan/engine.h"

/* A comm's last small plan, kept for its next op of the same shape on the
 * same buffers: compiling one costs more than running it (an 8 B
 * all_reduce on one daemon: most of the daemon's time per op, in its
 * allocations), and a job calls the same op on the same buffers again
 * and again. A plan is the same whenever its op is: compiling is a
 * function of the op alone, and every run starts the plan afresh
 * (engine_start). The key is the op whole: its participants' buffers,
 * which of them other daemons run, the ranks a participant stands for
 * and their buffers, and the comm's maps (by address: they live as long
 * as the comm). One thread (the loop's). */
struct plan_cache {
  struct engine_op key; /* of the plan kept or out; key.ranks: copies, n of them */
  struct engine_part *ranks;
  int nranks_cap;
  struct engine_part *members; /* copies of the participants' members */
  int nmembers_cap;
  int have_key, have_plan;
  uint64_t gen; /* the key's: a plan handed out under an older key is not kept */
  struct engine_plan plan;
};

/* op's plan when one is kept: moved to *ret, 1; else 0. *gen says which
 * key a plan compiled now, or taken, was made for. */
int plan_cache_take(struct plan_cache *pc, const struct engine_op *op, struct engine_plan *ret,
                    uint64_t *gen);
/* op's plan was compiled: the next take compares against op (0 when out of
 * memory to note it: the plan then is not kept). */
int plan_cache_note(struct plan_cache *pc, const struct engine_op *op, uint64_t *gen);
/* A plan taken or noted under gen, whose op is over: kept if no other
 * is and the key is still gen's, else freed. */
void plan_cache_give_back(struct plan_cache *pc, struct engine_plan *pl, uint64_t gen);
void plan_cache_free(struct plan_cache *pc);

#endif
