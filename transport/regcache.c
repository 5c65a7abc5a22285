/* Registrations kept between ops (regcache.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <uthash.h>

#include "regcache.h"

struct reg_entry {
  uintptr_t base; /* the key */
  size_t len;
  struct tmem *m;
  int uses;
  int kept;      /* in the table: served again until forgotten */
  UT_hash_handle hh;
};

struct reg_cache {
  const struct transport_ops *ops;
  struct transport *t;
  pthread_mutex_t mu;
  struct reg_entry *table; /* kept ones, by base */
  struct reg_cache_counts counts;
  int closed; /* freed: entries in use go at their last put, and so does c */
};

struct reg_cache *reg_cache_new(const struct transport_ops *ops, struct transport *t) {
  struct reg_cache *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->ops = ops;
  c->t = t;
  pthread_mutex_init(&c->mu, NULL);
  return c;
}

/* Under c->mu: e is in no table and nobody uses it. */
static void drop(struct reg_cache *c, struct reg_entry *e) {
  c->ops->mem_deregister(e->m);
  c->counts.held--;
  free(e);
}

static void destroy_if_done(struct reg_cache *c) {
  if (!c->closed || c->counts.held) {
    pthread_mutex_unlock(&c->mu);
    return;
  }
  pthread_mutex_unlock(&c->mu);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

void reg_cache_free(struct reg_cache *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  struct reg_entry *e, *tmp;
  HASH_ITER(hh, c->table, e, tmp) {
    HASH_DEL(c->table, e);
    e->kept = 0;
    if (!e->uses) drop(c, e);
  }
  c->closed = 1;
  destroy_if_done(c);
}

struct reg_entry *reg_cache_get(struct reg_cache *c, void *base, size_t len, int keep, char *err,
                                size_t errlen) {
  uintptr_t key = (uintptr_t)base;
  struct reg_entry *e = NULL;
  pthread_mutex_lock(&c->mu);
  HASH_FIND(hh, c->table, &key, sizeof(key), e);
  if (e && e->len == len) {
    e->uses++;
    c->counts.reused++;
    pthread_mutex_unlock(&c->mu);
    return e;
  }
  /* a kept one of another length starts here: this one is the op's alone */
  if (e) keep = 0;
  pthread_mutex_unlock(&c->mu);
  /* made outside the lock: pinning a large buffer takes a while */
  struct tmem *m = c->ops->mem_register(c->t, base, len, err, errlen);
  if (!m) return NULL;
  if (!(e = calloc(1, sizeof(*e)))) {
    c->ops->mem_deregister(m);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  *e = (struct reg_entry){.base = key, .len = len, .m = m, .uses = 1};
  pthread_mutex_lock(&c->mu);
  struct reg_entry *raced = NULL;
  if (keep) HASH_FIND(hh, c->table, &key, sizeof(key), raced);
  if (keep && !raced && !c->closed) {
    e->kept = 1;
    HASH_ADD(hh, c->table, base, sizeof(e->base), e);
  }
  c->counts.made++;
  c->counts.held++;
  pthread_mutex_unlock(&c->mu);
  return e;
}

struct tmem *reg_entry_mem(const struct reg_entry *e) { return e->m; }

void reg_cache_put(struct reg_cache *c, struct reg_entry *e) {
  if (!e) return;
  pthread_mutex_lock(&c->mu);
  if (--e->uses == 0 && !e->kept) drop(c, e);
  destroy_if_done(c);
}

void reg_cache_forget(struct reg_cache *c, const void *base, size_t len) {
  if (!c) return;
  uintptr_t lo = (uintptr_t)base, hi = lo + len;
  pthread_mutex_lock(&c->mu);
  struct reg_entry *e, *tmp;
  HASH_ITER(hh, c->table, e, tmp) {
    if (e->base >= hi || e->base + (e->len ? e->len : 1) <= lo) continue;
    HASH_DEL(c->table, e);
    e->kept = 0;
    if (!e->uses) drop(c, e);
  }
  pthread_mutex_unlock(&c->mu);
}

void reg_cache_counts(struct reg_cache *c, struct reg_cache_counts *out) {
  pthread_mutex_lock(&c->mu);
  *out = c->counts;
  pthread_mutex_unlock(&c->mu);
}
