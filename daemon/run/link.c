/* Links to other daemons shared by tenant weight (link.h). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "run/link.h"

#define LINK_QUANTUM 1048576.0    /* bytes a tenant that comes back may get ahead */
#define MEASURE_NS 100000000ull   /* the capacity: bytes drained over >= 100 ms of backlog */
#define ADDR_MAX 64

struct net_link {
  UT_hash_handle hh;
  char addr[ADDR_MAX];
  struct net_links *all;
  struct fair fair;
  size_t posted;   /* bytes of sends posted and not done */
  size_t queued;   /* sends waiting */
  double measured; /* the fastest drain seen, bytes a second */
  uint64_t measure_from, measure_bytes; /* the backlog now being measured */
};

void ccsd_links_init(struct net_links *ls, size_t window, double capacity) {
  memset(ls, 0, sizeof(*ls));
  ls->window = window;
  ls->capacity = capacity;
}

void ccsd_links_close(struct net_links *ls) {
  struct net_link *l, *tmp;
  HASH_ITER(hh, ls->by_addr, l, tmp) {
    HASH_DELETE(hh, ls->by_addr, l);
    fair_close(&l->fair);
    free(l);
  }
}

static struct net_link *link_of(struct net_links *ls, const char *addr) {
  struct net_link *l;
  HASH_FIND_STR(ls->by_addr, addr, l);
  if (l || strlen(addr) >= ADDR_MAX) return l;
  if (!(l = calloc(1, sizeof(*l)))) return NULL;
  strcpy(l->addr, addr);
  l->all = ls;
  fair_init(&l->fair, LINK_QUANTUM, ls->capacity);
  HASH_ADD_STR(ls->by_addr, addr, l);
  return l;
}

struct net_link *ccsd_links_queue(struct net_links *ls, const char *addr, struct link_send *s) {
  struct net_link *l = link_of(ls, addr);
  struct fair_flow *fl = l ? fair_flow_get(&l->fair, s->share->uid) : NULL;
  if (!fl) return NULL;
  fair_flow_set(fl, atomic_load_explicit(&s->share->weight, memory_order_relaxed),
                atomic_load_explicit(&s->share->cap, memory_order_relaxed));
  fair_ref(fl);
  s->on = NULL;
  list_insert_tail(&fl->items[s->prio], &s->link);
  l->queued++;
  return l;
}

static int has_sends(void *ctx, struct fair_flow *fl, int cls) {
  (void)ctx;
  return !list_empty(&fl->items[cls]);
}

struct link_send *ccsd_link_next(struct net_link *l, uint64_t now_ns) {
  if (!l->queued || l->posted >= l->all->window) return NULL;
  int cls;
  uint64_t retry;
  struct fair_flow *fl = fair_pick(&l->fair, now_ns, has_sends, NULL, &cls, &retry);
  if (!fl) return NULL; /* capped: housekeeping comes back */
  struct link_send *s = LIST_ENTRY(fl->items[cls].next, struct link_send, link);
  list_remove(&s->link);
  l->queued--;
  fair_charge(&l->fair, fl, cls, (double)s->bytes);
  fair_unref(fl, now_ns);
  s->on = l;
  l->posted += s->bytes;
  atomic_fetch_add_explicit(&s->share->net_bytes, s->bytes, memory_order_relaxed);
  return s;
}

/* While sends wait, the link drains as fast as it can: that rate is its
 * capacity, unless the configuration says. */
static void measure(struct net_link *l, size_t bytes, uint64_t now_ns) {
  if (!l->queued) { /* no backlog: what drains is what came */
    l->measure_from = 0;
    return;
  }
  if (!l->measure_from) {
    l->measure_from = now_ns;
    l->measure_bytes = 0;
    return;
  }
  l->measure_bytes += bytes;
  uint64_t span = now_ns - l->measure_from;
  if (span < MEASURE_NS) return;
  double rate = (double)l->measure_bytes / ((double)span / 1e9);
  if (rate > l->measured) l->measured = rate;
  if (l->all->capacity <= 0) l->fair.capacity = l->measured;
  l->measure_from = now_ns;
  l->measure_bytes = 0;
}

void ccsd_link_done(struct link_send *s, uint64_t now_ns) {
  struct net_link *l = s->on;
  if (!l) return;
  s->on = NULL;
  l->posted -= s->bytes;
  measure(l, s->bytes, now_ns);
}

void ccsd_links_take(struct net_links *ls, int (*match)(void *arg, struct link_send *s),
                     void *arg, struct list *into) {
  struct net_link *l, *tmp;
  HASH_ITER(hh, ls->by_addr, l, tmp) {
    struct list *fit, *fnext;
    if (!l->queued) continue;
    LIST_FOREACH_SAFE(fit, fnext, &l->fair.flows) {
      struct fair_flow *fl = LIST_ENTRY(fit, struct fair_flow, link);
      for (int c = 0; c < FAIR_CLASSES; c++) {
        struct list *it, *next;
        LIST_FOREACH_SAFE(it, next, &fl->items[c]) {
          struct link_send *s = LIST_ENTRY(it, struct link_send, link);
          if (!match(arg, s)) continue;
          list_remove(&s->link);
          l->queued--;
          fair_unref(fl, 0); /* idle at once: it went nowhere */
          list_insert_tail(into, &s->link);
        }
      }
    }
  }
}

void ccsd_links_each(struct net_links *ls, void (*fn)(void *arg, struct net_link *l), void *arg) {
  struct net_link *l, *tmp;
  HASH_ITER(hh, ls->by_addr, l, tmp) fn(arg, l);
}

double ccsd_link_capacity(const struct net_link *l) { return l->fair.capacity; }
