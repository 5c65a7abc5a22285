/* A comm's last small plan (plan_cache.h). */
#include <stdlib.h>
#include <string.h>

#include "plan/plan_cache.h"

static int same_part(const struct engine_part *a, const struct engine_part *b) {
  if (a->send != b->send || a->recv != b->recv || a->remote != b->remote || a->nmembers != b->nmembers ||
      a->root_member != b->root_member || !a->members != !b->members)
    return 0;
  for (int m = 0; m < a->nmembers; m++)
    if (a->members[m].send != b->members[m].send || a->members[m].recv != b->members[m].recv) return 0;
  return 1;
}

static int same_op(const struct engine_op *a, const struct engine_op *b) {
  if (a->coll != b->coll || a->algo != b->algo || a->n != b->n || a->root != b->root ||
      a->pipeline != b->pipeline || a->count != b->count || a->dtype != b->dtype ||
      a->redop != b->redop || a->chunk_bytes != b->chunk_bytes ||
      a->avg_divisor != b->avg_divisor || a->pool != b->pool || a->rank_of != b->rank_of ||
      a->group_first != b->group_first)
    return 0;
  for (int p = 0; p < a->n; p++)
    if (!same_part(&a->ranks[p], &b->ranks[p])) return 0;
  return 1;
}

int plan_cache_take(struct plan_cache *pc, const struct engine_op *op, struct engine_plan *ret,
                    uint64_t *gen) {
  *gen = pc->gen;
  if (!pc->have_plan || !same_op(&pc->key, op)) return 0;
  *ret = pc->plan;
  pc->have_plan = 0;
  return 1;
}

int plan_cache_note(struct plan_cache *pc, const struct engine_op *op, uint64_t *gen) {
  if (pc->have_key && same_op(&pc->key, op)) { /* its plan is out with an op in flight */
    *gen = pc->gen;
    return 1;
  }
  int nmembers = 0;
  for (int p = 0; p < op->n; p++) nmembers += op->ranks[p].members ? op->ranks[p].nmembers : 0;
  if (op->n > pc->nranks_cap) {
    struct engine_part *grown = realloc(pc->ranks, sizeof(*grown) * (size_t)op->n);
    if (!grown) return 0;
    pc->ranks = grown;
    pc->nranks_cap = op->n;
    pc->key.ranks = grown; /* the old key whole, should the next fail */
  }
  if (nmembers > pc->nmembers_cap) { /* (nothing fails after it: the key is replaced) */
    struct engine_part *grown = realloc(pc->members, sizeof(*grown) * (size_t)nmembers);
    if (!grown) return 0;
    pc->members = grown;
    pc->nmembers_cap = nmembers;
  }
  if (pc->have_plan) engine_plan_free(&pc->plan);
  pc->have_plan = 0;
  memcpy(pc->ranks, op->ranks, sizeof(*pc->ranks) * (size_t)op->n);
  for (int p = 0, at = 0; p < op->n; p++) { /* the op's members go with it */
    if (!op->ranks[p].members) continue;
    memcpy(pc->members + at, op->ranks[p].members, sizeof(*pc->members) * (size_t)op->ranks[p].nmembers);
    pc->ranks[p].members = pc->members + at;
    at += op->ranks[p].nmembers;
  }
  pc->key = *op;
  pc->key.ranks = pc->ranks;
  pc->have_key = 1;
  *gen = ++pc->gen;
  return 1;
}

void plan_cache_give_back(struct plan_cache *pc, struct engine_plan *pl, uint64_t gen) {
  if (pc->have_key && !pc->have_plan && gen == pc->gen) {
    pc->plan = *pl;
    pc->have_plan = 1;
  } else {
    engine_plan_free(pl);
  }
  memset(pl, 0, sizeof(*pl));
}

void plan_cache_free(struct plan_cache *pc) {
  if (pc->have_plan) engine_plan_free(&pc->plan);
  free(pc->ranks);
  free(pc->members);
  memset(pc, 0, sizeof(*pc));
}
