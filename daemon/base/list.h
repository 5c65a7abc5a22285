/* Intrusive circular doubly-linked list (the shape of libuv's QUEUE). */
#ifndef CCSD_LIST_H
#define CCSD_LIST_H

#include <stddef.h>

struct list {
  struct list *next, *prev;
};

#define LIST_ENTRY(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#define LIST_FOREACH_SAFE(it, tmp, head) \
  for ((it) = (head)->next, (tmp) = (it)->next; (it) != (head); (it) = (tmp), (tmp) = (it)->next)

static inline void list_init(struct list *l) { l->next = l->prev = l; }
static inline int list_empty(const struct list *l) { return l->next == l; }
static inline void list_insert_tail(struct list *head, struct list *n) {
  n->prev = head->prev;
  n->next = head;
  head->prev->next = n;
  head->prev = n;
}
static inline void list_remove(struct list *n) {
  n->prev->next = n->next;
  n->next->prev = n->prev;
  list_init(n);
}
/* Every entry of from moves to the (empty, initialised) list to; from is
 * left empty: a queue taken whole under a lock, worked on outside it. */
static inline void list_take_all(struct list *to, struct list *from) {
  if (list_empty(from)) return;
  *to = *from;
  to->next->prev = to;
  to->prev->next = to;
  list_init(from);
}

#endif
