/* A GPU's queue of ops, served by tenant weight in each comm's order
 * (gpu.h). */
#include <stdatomic.h>
#include <time.h>

#include "base/clock.h"
#include "run/gpu.h"
#include "run/share.h"

void ccsd_gpu_queue_add(struct list *queue, struct fair *f, struct run_op *x) {
  x->submitted_ns = ccsd_now_ns();
  if ((x->gpu_flow = fair_flow_get(f, x->share->uid)) != NULL) {
    fair_flow_set(x->gpu_flow, atomic_load(&x->share->weight), 1);
    fair_ref(x->gpu_flow);
  }
  list_insert_tail(queue, &x->link);
}

/* The ops that could go next: each comm's first in the queue. */
struct candidates {
  struct gpu_streams *streams;
  struct run_op *x[64];
  int n;
  struct run_op *picked;
  struct gpu_stream *stream;
};

/* Of fl's class cls, the first candidate that gets a stream (claiming
 * it: the pick is this one). */
static int startable(void *ctx, struct fair_flow *fl, int cls) {
  struct candidates *c = ctx;
  for (int i = 0; i < c->n; i++) {
    struct run_op *x = c->x[i];
    if (!x || x->gpu_flow != fl || x->prio != cls) continue;
    if ((c->stream = ccsd_gpu_stream_for(c->streams, x->stream_key)) != NULL) {
      c->picked = x;
      return 1;
    }
    c->x[i] = NULL; /* every stream runs other comms' ops */
  }
  return 0;
}

struct run_op *ccsd_gpu_queue_next(struct list *queue, struct fair *f, struct gpu_streams *streams,
                                   struct gpu_stream **ret_stream) {
  struct candidates c = {.streams = streams};
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, queue) {
    struct run_op *x = LIST_ENTRY(it, struct run_op, link);
    int behind = 0;
    for (int i = 0; i < c.n && !behind; i++) behind = c.x[i]->stream_key == x->stream_key;
    if (behind) continue;
    if (atomic_load(&x->cancelled)) { /* its comm failed before it got here */
      *ret_stream = NULL;
      return x;
    }
    if (!x->gpu_flow) { /* its tenant's flow found no memory: it goes as it came */
      if ((*ret_stream = ccsd_gpu_stream_for(streams, x->stream_key)) != NULL) return x;
    }
    if (c.n == (int)(sizeof(c.x) / sizeof(c.x[0]))) break;
    c.x[c.n++] = x;
  }
  int cls;
  uint64_t retry;
  if (!c.n || !fair_pick(f, ccsd_now_ns(), startable, &c, &cls, &retry)) return NULL;
  *ret_stream = c.stream;
  return c.picked;
}

void ccsd_gpu_queue_remove(struct fair *f, struct run_op *x) {
  list_remove(&x->link);
  uint64_t now = ccsd_now_ns();
  if (!atomic_load(&x->cancelled)) {
    atomic_fetch_add_explicit(&x->share->gpu_ops, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&x->share->gpu_bytes, x->plan.bytes_moved, memory_order_relaxed);
    ccsd_run_share_waited(x->share, now - x->submitted_ns);
  }
  if (!x->gpu_flow) return;
  if (!atomic_load(&x->cancelled)) fair_charge(f, x->gpu_flow, x->prio, (double)x->plan.bytes_moved + 1);
  fair_unref(x->gpu_flow, now);
  x->gpu_flow = NULL;
}
