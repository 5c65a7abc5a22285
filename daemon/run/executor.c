/* Executor threads (executor.h): run the tasks of ops' graphs as they
 * become ready, and hand finished ops back to the loop thread.
 *
 * Each tenant (uid) has a queue of ops in arrival order, and the tenants
 * take turns task by task: a tenant flooding the daemon with large ops
 * gets its share of the threads, not all of them, and another tenant's
 * small op starts after at most one task per busy tenant. Within a
 * tenant, every thread takes the next ready task of the first op that has
 * one, so a large op is spread over all threads, and a task whose inputs
 * are not ready yet lets the next op of the comm go ahead.
 *
 * SEND and RECV tasks never pass through these threads: the network thread
 * takes them itself, at once when its own completion made them ready, or
 * after one hand-over per batch when a computation or the op's start did. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "base/log.h"
#include "run/engine_run.h"
#include "run/executor.h"

struct tenant_queue {
  struct list link; /* in executor->turns */
  uid_t uid;
  struct list ops;
};

struct executor {
  void (*handover)(void *arg, struct run_op *x); /* the network side's */
  void *handover_arg;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct list turns; /* tenant queues with work, the next turn first */
  struct tenant_queue fallback; /* for ops whose tenant's queue found no memory */
  struct list done;
  uv_async_t async;
  pthread_t *threads;
  int nthreads;
  int stop;
  int running;                  /* tasks claimed, not finished (under mu) */
  _Atomic uint64_t tasks_done;  /* ever: what the watchdog watches */
  _Atomic uint64_t busy_ns;     /* time spent in tasks, for utilisation */
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double ccsd_executor_busy_seconds(struct executor *e) { return (double)atomic_load(&e->busy_ns) / 1e9; }

/* The next task under e->mu: the first claimable op of the first tenant
 * that has one; that tenant's turn then passes to the back. */
static struct run_op *claim(struct executor *e, size_t *ret_task) {
  struct list *q, *qtmp;
  LIST_FOREACH_SAFE(q, qtmp, &e->turns) {
    struct tenant_queue *tq = LIST_ENTRY(q, struct tenant_queue, link);
    struct list *it, *tmp;
    LIST_FOREACH_SAFE(it, tmp, &tq->ops) {
      struct run_op *x = LIST_ENTRY(it, struct run_op, link);
      if (!engine_has_ready(&x->plan)) continue;
      *ret_task = engine_claim(&x->plan);
      e->running++;
      if (x->plan.ready_head == x->plan.compute_tasks) list_remove(&x->link); /* all claimed */
      list_remove(&tq->link);
      if (!list_empty(&tq->ops)) list_insert_tail(&e->turns, &tq->link);
      else if (tq != &e->fallback) free(tq);
      return x;
    }
  }
  return NULL;
}

/* Under e->mu: tasks for the network thread became ready while it is not
 * the one finishing; 1 when it must be told (once until it takes them). */
static int net_handover(struct run_op *x) {
  int ready = engine_has_net_ready(&x->plan) || (x->on_net && engine_has_ready(&x->plan));
  if (x->net_handover || !ready) return 0;
  x->net_handover = 1;
  return 1;
}

/* Under e->mu: once the last task is counted the loop thread may free x.
 * 1 when the network thread must be handed x's network tasks. */
static int finish_locked(struct executor *e, struct run_op *x, size_t task, int on_net_thread) {
  atomic_fetch_add(&e->tasks_done, 1);
  size_t compute_before = x->plan.ready_tail;
  engine_finish(&x->plan, task);
  if (x->plan.ready_tail != compute_before && !x->on_net) pthread_cond_broadcast(&e->cv);
  if (engine_done(&x->plan)) {
    list_insert_tail(&e->done, &x->done_link);
    uv_async_send(&e->async);
    return 0;
  }
  return !on_net_thread && net_handover(x);
}

size_t ccsd_executor_net_step(struct executor *e, struct run_op *x, size_t task, int handover,
                              size_t *tasks, size_t max) {
  size_t n = 0;
  pthread_mutex_lock(&e->mu);
  if (task != CCSD_NO_TASK) finish_locked(e, x, task, 1);
  if (handover) x->net_handover = 0;
  while (!x->net_handover && n < max && engine_has_net_ready(&x->plan))
    tasks[n++] = engine_claim_net(&x->plan);
  while (!x->net_handover && x->on_net && n < max && engine_has_ready(&x->plan))
    tasks[n++] = engine_claim(&x->plan);
  pthread_mutex_unlock(&e->mu);
  return n;
}

static void *worker(void *arg) {
  struct executor *e = arg;
  pthread_mutex_lock(&e->mu);
  for (;;) {
    size_t task;
    struct run_op *x = claim(e, &task);
    if (!x) {
      if (e->stop) break;
      pthread_cond_wait(&e->cv, &e->mu);
      continue;
    }
    pthread_mutex_unlock(&e->mu);

    uint64_t t0 = now_ns();
    if (!atomic_load_explicit(&x->cancelled, memory_order_relaxed))
      engine_run_task(&x->plan, task, x->streaming);
    atomic_fetch_add(&e->busy_ns, now_ns() - t0);
    pthread_mutex_lock(&e->mu);
    e->running--;
    if (finish_locked(e, x, task, 0)) { /* x lives on: its network tasks wait */
      pthread_mutex_unlock(&e->mu);
      e->handover(e->handover_arg, x);
      pthread_mutex_lock(&e->mu);
    }
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

int ccsd_executor_healthy(struct executor *e, uint64_t *seen) {
  uint64_t done = atomic_load(&e->tasks_done);
  if (done != *seen) {
    *seen = done;
    return 1;
  }
  pthread_mutex_lock(&e->mu);
  int idle = list_empty(&e->turns) && e->running == 0;
  pthread_mutex_unlock(&e->mu);
  return idle;
}

static void drain_done(struct executor *e) {
  struct list done;
  list_init(&done);
  pthread_mutex_lock(&e->mu);
  list_take_all(&done, &e->done);
  pthread_mutex_unlock(&e->mu);
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &done) {
    struct run_op *x = LIST_ENTRY(it, struct run_op, done_link);
    list_remove(it);
    x->on_done(x);
  }
}

static void on_async(uv_async_t *h) { drain_done(h->data); }

void ccsd_executor_set_handover(struct executor *e, void (*fn)(void *arg, struct run_op *x),
                                void *arg) {
  e->handover = fn;
  e->handover_arg = arg;
}

struct executor *ccsd_executor_new(uv_loop_t *loop, int threads) {
  struct executor *e = calloc(1, sizeof(*e));
  if (!e) return NULL;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  list_init(&e->turns);
  list_init(&e->fallback.ops);
  list_init(&e->done);
  uv_async_init(loop, &e->async, on_async);
  e->async.data = e;
  e->threads = calloc((size_t)threads, sizeof(pthread_t));
  for (int i = 0; e->threads && i < threads; i++) {
    if (pthread_create(&e->threads[i], NULL, worker, e)) break;
    e->nthreads++;
  }
  if (e->nthreads == 0) {
    LOG_ERROR("no executor thread could be started");
    ccsd_executor_stop(e);
    return NULL;
  }
  return e;
}

void ccsd_executor_submit(struct executor *e, struct run_op *x) {
  engine_start(&x->plan);
  pthread_mutex_lock(&e->mu);
  int handover = net_handover(x);
  if (x->plan.compute_tasks == 0 || x->on_net) { /* the network thread runs all of it */
    pthread_mutex_unlock(&e->mu);
    if (handover) e->handover(e->handover_arg, x);
    return;
  }
  struct tenant_queue *tq = NULL;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &e->turns) {
    struct tenant_queue *each = LIST_ENTRY(it, struct tenant_queue, link);
    if (each->uid == x->uid) tq = each;
  }
  if (!tq && (tq = calloc(1, sizeof(*tq))) != NULL) {
    tq->uid = x->uid;
    list_init(&tq->ops);
    list_insert_tail(&e->turns, &tq->link);
  }
  if (!tq) { /* no memory for a queue: its tasks run as cancelled */
    atomic_store(&x->cancelled, 1);
    tq = &e->fallback;
    if (list_empty(&tq->ops)) list_insert_tail(&e->turns, &tq->link);
  }
  list_insert_tail(&tq->ops, &x->link);
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  if (handover) e->handover(e->handover_arg, x); /* x waits for these: alive */
}

static void on_async_closed(uv_handle_t *h) {
  struct executor *e = h->data;
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  free(e->threads);
  free(e);
}

void ccsd_executor_stop(struct executor *e) {
  pthread_mutex_lock(&e->mu);
  e->stop = 1;
  /* Ops not started are finished as cancelled: their ranks are gone. */
  struct list *q, *qtmp, *it, *tmp;
  LIST_FOREACH_SAFE(q, qtmp, &e->turns) {
    LIST_FOREACH_SAFE(it, tmp, &LIST_ENTRY(q, struct tenant_queue, link)->ops) {
      atomic_store(&LIST_ENTRY(it, struct run_op, link)->cancelled, 1);
    }
  }
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  for (int i = 0; i < e->nthreads; i++) pthread_join(e->threads[i], NULL);
  drain_done(e);
  uv_close((uv_handle_t *)&e->async, on_async_closed);
}
