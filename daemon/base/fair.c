/* Weighted fair sharing (fair.h). Flows are kept in order of virtual
 * time, so a pick walks them from the front and a charge moves one flow a
 * few places: tenants are few, jobs many. */
#include <stdlib.h>

#include "base/fair.h"

static const double class_weight[FAIR_CLASSES] = {4, 2, 1};
static const char *const class_names[FAIR_CLASSES] = {"latency", "normal", "bulk"};

/* A capped flow's bucket holds this long at its rate (and one quantum at
 * least): caps hold over any tenth of a second. */
#define BURST_S 0.1

const char *fair_class_name(int cls) {
  return cls >= 0 && cls < FAIR_CLASSES ? class_names[cls] : "?";
}

void fair_init(struct fair *f, double quantum, double capacity) {
  list_init(&f->flows);
  f->by_key = NULL;
  f->vnow = 0;
  f->quantum = quantum;
  f->capacity = capacity;
}

/* Where a flow that comes back (or a new one) starts: one quantum behind. */
static double floor_of(const struct fair *f, double weight) { return f->vnow - f->quantum / weight; }

static void flow_free(struct fair *f, struct fair_flow *fl) {
  list_remove(&fl->link);
  HASH_DELETE(hh, f->by_key, fl);
  free(fl);
}

void fair_close(struct fair *f) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &f->flows) flow_free(f, LIST_ENTRY(it, struct fair_flow, link));
}

/* fl's place after its virtual time changed: flows stay sorted. */
static void resort(struct fair *f, struct fair_flow *fl) {
  struct list *at = fl->link.next;
  list_remove(&fl->link);
  while (at != &f->flows && LIST_ENTRY(at, struct fair_flow, link)->vtime <= fl->vtime) at = at->next;
  while (at->prev != &f->flows && LIST_ENTRY(at->prev, struct fair_flow, link)->vtime > fl->vtime)
    at = at->prev;
  list_insert_tail(at, &fl->link); /* before at */
}

struct fair_flow *fair_flow_get(struct fair *f, uint64_t key) {
  struct fair_flow *fl;
  HASH_FIND(hh, f->by_key, &key, sizeof(key), fl);
  if (fl) return fl;
  if (!(fl = calloc(1, sizeof(*fl)))) return NULL;
  fl->key = key;
  fl->weight = 1;
  fl->cap = 1;
  fl->vtime = floor_of(f, fl->weight);
  for (int c = 0; c < FAIR_CLASSES; c++) list_init(&fl->items[c]);
  HASH_ADD(hh, f->by_key, key, sizeof(fl->key), fl);
  list_insert_tail(&f->flows, &fl->link);
  resort(f, fl);
  return fl;
}

void fair_flow_set(struct fair_flow *fl, double weight, double cap) {
  fl->weight = weight > 0 ? weight : 1;
  double was = fl->cap;
  fl->cap = cap > 0 && cap < 1 ? cap : 1;
  if (fl->cap < 1 && was >= 1) fl->tokens_ns = 0; /* a new cap starts with a full bucket */
}

void fair_ref(struct fair_flow *fl) { fl->refs++; }

void fair_unref(struct fair_flow *fl, uint64_t now_ns) {
  if (--fl->refs == 0) fl->idle_ns = now_ns;
}

static int idle(const struct fair_flow *fl, uint64_t now_ns) {
  return fl->refs == 0 && now_ns - fl->idle_ns >= FAIR_IDLE_GRACE_NS;
}

/* How far behind the others fl may be: one quantum idle, more busy. */
static double lowest(const struct fair *f, const struct fair_flow *fl, uint64_t now_ns) {
  double quanta = idle(fl, now_ns) ? 1 : FAIR_BUSY_QUANTA;
  return f->vnow - quanta * f->quantum / fl->weight;
}

/* Nothing to remember: idle, no service owed, no more credit than a new
 * flow of its weight starts with. */
static int forgettable(const struct fair *f, const struct fair_flow *fl, uint64_t now_ns) {
  return idle(fl, now_ns) && fl->vtime <= floor_of(f, fl->weight) && fl->tokens >= 0;
}

static double burst(const struct fair *f, const struct fair_flow *fl) {
  double b = fl->cap * f->capacity * BURST_S;
  return b > f->quantum ? b : f->quantum;
}

/* 1 when fl's cap lets it go now; else *retry_ns is lowered to when it may. */
static int within_cap(const struct fair *f, struct fair_flow *fl, uint64_t now_ns, uint64_t *retry_ns) {
  if (fl->cap >= 1 || f->capacity <= 0) return 1;
  double rate = fl->cap * f->capacity, full = burst(f, fl);
  if (fl->tokens_ns == 0) fl->tokens = full;
  else if (now_ns > fl->tokens_ns) fl->tokens += rate * (double)(now_ns - fl->tokens_ns) / 1e9;
  if (fl->tokens > full) fl->tokens = full;
  fl->tokens_ns = now_ns;
  if (fl->tokens > 0) return 1;
  uint64_t when = now_ns + (uint64_t)(-fl->tokens / rate * 1e9) + 1;
  if (*retry_ns == 0 || when < *retry_ns) *retry_ns = when;
  return 0;
}

struct fair_flow *fair_pick(struct fair *f, uint64_t now_ns,
                            int (*can)(void *ctx, struct fair_flow *fl, int cls), void *ctx,
                            int *ret_cls, uint64_t *retry_ns) {
  *retry_ns = 0;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &f->flows) {
    struct fair_flow *fl = LIST_ENTRY(it, struct fair_flow, link);
    if (forgettable(f, fl, now_ns)) {
      flow_free(f, fl);
      continue;
    }
    if (!within_cap(f, fl, now_ns, retry_ns)) continue;
    /* its classes by their virtual times, as each would stand if it went */
    int order[FAIR_CLASSES] = {FAIR_LATENCY, FAIR_NORMAL, FAIR_BULK};
    double at[FAIR_CLASSES];
    for (int c = 0; c < FAIR_CLASSES; c++) { /* a class that comes back: one quantum behind */
      double low = fl->class_vnow - f->quantum / class_weight[c];
      at[c] = fl->class_vtime[c] < low ? low : fl->class_vtime[c];
    }
    for (int i = 1; i < FAIR_CLASSES; i++)
      for (int j = i; j > 0 && at[order[j]] < at[order[j - 1]]; j--) {
        int t = order[j];
        order[j] = order[j - 1];
        order[j - 1] = t;
      }
    for (int i = 0; i < FAIR_CLASSES; i++) {
      int c = order[i];
      if (!can(ctx, fl, c)) continue;
      fl->class_vtime[c] = at[c];
      if (at[c] > fl->class_vnow) fl->class_vnow = at[c];
      double low = lowest(f, fl, now_ns);
      if (fl->vtime < low) fl->vtime = low;
      if (fl->vtime > f->vnow) f->vnow = fl->vtime;
      resort(f, fl);
      *ret_cls = c;
      return fl;
    }
  }
  return NULL;
}

void fair_charge(struct fair *f, struct fair_flow *fl, int cls, double cost) {
  fl->vtime += cost / fl->weight;
  fl->class_vtime[cls] += cost / class_weight[cls];
  if (fl->cap < 1 && f->capacity > 0) fl->tokens -= cost;
  resort(f, fl);
}
