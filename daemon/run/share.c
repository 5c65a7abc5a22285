/* Tenants' weights and what they were given (share.h). */
#include <stdlib.h>
#include <string.h>

#include "run/share.h"

const double ccsd_run_wait_bounds[RUN_WAIT_BUCKETS] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1, 10};

static double weight_of(const struct run_share_rules *rules, uid_t uid) {
  for (int i = 0; i < rules->n; i++)
    if (rules->uid[i] == uid) return rules->weight[i];
  return 1;
}

static void apply(const struct run_share_rules *rules, struct run_share *r) {
  atomic_store(&r->weight, weight_of(rules, r->uid));
  atomic_store(&r->cap, rules->max_share > 0 && rules->max_share < 1 ? rules->max_share : 1);
}

void ccsd_run_shares_init(struct run_shares *s) {
  memset(s, 0, sizeof(*s));
  pthread_mutex_init(&s->mu, NULL);
  s->rules.max_share = 1;
  s->fallback.uid = (uid_t)-1;
  apply(&s->rules, &s->fallback);
}

void ccsd_run_shares_close(struct run_shares *s) {
  struct run_share *r, *tmp;
  HASH_ITER(hh, s->by_uid, r, tmp) {
    HASH_DELETE(hh, s->by_uid, r);
    free(r);
  }
  pthread_mutex_destroy(&s->mu);
}

void ccsd_run_shares_configure(struct run_shares *s, const struct run_share_rules *rules) {
  pthread_mutex_lock(&s->mu);
  s->rules = *rules;
  struct run_share *r, *tmp;
  HASH_ITER(hh, s->by_uid, r, tmp) apply(&s->rules, r);
  pthread_mutex_unlock(&s->mu);
}

struct run_share *ccsd_run_share_of(struct run_shares *s, uid_t uid) {
  struct run_share *r;
  pthread_mutex_lock(&s->mu);
  HASH_FIND(hh, s->by_uid, &uid, sizeof(uid), r);
  if (!r && (r = calloc(1, sizeof(*r))) != NULL) {
    r->uid = uid;
    apply(&s->rules, r);
    HASH_ADD(hh, s->by_uid, uid, sizeof(r->uid), r);
  }
  pthread_mutex_unlock(&s->mu);
  return r ? r : &s->fallback;
}

void ccsd_run_shares_each(struct run_shares *s, void (*fn)(void *arg, const struct run_share *r),
                          void *arg) {
  pthread_mutex_lock(&s->mu);
  struct run_share *r, *tmp;
  HASH_ITER(hh, s->by_uid, r, tmp) fn(arg, r);
  pthread_mutex_unlock(&s->mu);
}

void ccsd_run_share_waited(struct run_share *r, uint64_t ns) {
  double s = (double)ns / 1e9;
  for (int b = 0; b < RUN_WAIT_BUCKETS; b++)
    if (s <= ccsd_run_wait_bounds[b]) atomic_fetch_add_explicit(&r->waits[b], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&r->wait_count, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&r->wait_ns, ns, memory_order_relaxed);
}
