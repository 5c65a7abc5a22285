/* Executor threads (executor.h): run the tasks of ops' graphs as they
 * become ready, and hand finished ops back to the loop thread.
 *
 * Tenants share the threads by weighted fair queueing of task time
 * (base/fair.h): each tenant's ops wait in its flow, by the class of their
 * comm, and a free thread takes the next ready task of the tenant (and
 * class) that is furthest behind its share. A task's time is charged to
 * its tenant when the task is claimed (the op's own estimate, from its
 * earlier tasks) and corrected when it ends, so threads that claim at
 * once spread over tenants. A tenant capped below the whole
 * (tenant_max_share) waits once it had its fraction of the threads' time,
 * even when they would idle. Within a tenant's class, a thread takes the
 * next ready task of the first op that has one, so a large op is spread
 * over all threads, and a task whose inputs are not ready yet lets the
 * next op go ahead.
 *
 * SEND and RECV tasks never pass through these threads: the network thread
 * takes them itself, at once when its own completion made them ready, or
 * after one hand-over per batch when a computation or the op's start did. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/failpoint.h"
#include "base/fair.h"
#include "base/log.h"
#include "run/engine_run.h"
#include "run/executor.h"
#include "run/share.h"

/* Task time a tenant that comes back may be ahead of the others, and the
 * estimate of an op's first task. */
#define QUANTUM_NS 1000000.0
#define FIRST_ESTIMATE_NS 50000.0
/* ops whose tenant's flow found no memory: run as cancelled */
#define FALLBACK_KEY UINT64_MAX

struct executor {
  void (*handover)(void *arg, struct run_op *x); /* the network side's */
  void *handover_arg;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct fair fair;          /* tenants' flows; their items: ops with tasks to claim */
  struct fair_flow *fallback;
  size_t queued;             /* ops in the flows */
  struct list done;
  uv_async_t async;
  pthread_t *threads;
  int nthreads;
  enum executor_priority priority;
  int stop;
  int running;                  /* tasks claimed, not finished (under mu) */
  _Atomic uint64_t tasks_done;  /* ever: what the watchdog watches */
  _Atomic uint64_t busy_ns;     /* time spent in tasks, for utilisation */
};

double ccsd_executor_busy_seconds(struct executor *e) { return (double)atomic_load(&e->busy_ns) / 1e9; }

struct claim {
  struct run_op *x;
};

/* The loop thread while it runs work itself (ccsd_executor_help, or
 * between ccsd_executor_reap_begin and _reap): the ops it finishes are
 * handed back when that work returns, not through e->async. */
enum { REAP_NONE, REAP_WATCH, REAP_DUE };
static _Thread_local int reaps;

/* fair_pick's question: has this tenant's class an op with a ready task? */
static int claimable(void *ctx, struct fair_flow *fl, int cls) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &fl->items[cls]) {
    struct run_op *x = LIST_ENTRY(it, struct run_op, link);
    if (!engine_has_ready(&x->plan)) continue;
    ((struct claim *)ctx)->x = x;
    return 1;
  }
  return 0;
}

/* The next task under e->mu, charged to its tenant at its op's estimate
 * (*charged); NULL: none may go now (*retry_ns: when a capped tenant may
 * again). */
static struct run_op *claim(struct executor *e, size_t *ret_task, double *charged,
                            uint64_t *retry_ns) {
  struct claim c = {NULL};
  int cls;
  uint64_t now = ccsd_now_ns();
  struct fair_flow *fl = fair_pick(&e->fair, now, claimable, &c, &cls, retry_ns);
  if (!fl) return NULL;
  struct run_op *x = c.x;
  *ret_task = engine_claim(&x->plan);
  e->running++;
  if (x->plan.ready_head == x->plan.compute_tasks) { /* all claimed */
    list_remove(&x->link);
    e->queued--;
  }
  *charged = x->exec_estimate_ns;
  fair_charge(&e->fair, fl, cls, *charged);
  if (!x->exec_started) {
    x->exec_started = 1;
    ccsd_run_share_waited(x->share, now - x->submitted_ns);
  }
  return x;
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
    if (x->exec_flow) fair_unref(x->exec_flow, ccsd_now_ns());
    x->exec_flow = NULL;
    list_insert_tail(&e->done, &x->done_link);
    if (reaps) reaps = REAP_DUE;
    else uv_async_send(&e->async);
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

/* Under e->mu: x's task took ns; what was charged at its claim is
 * corrected, and the op's next estimate follows its tasks. */
static void account(struct executor *e, struct run_op *x, uint64_t ns, double charged) {
  atomic_fetch_add_explicit(&x->share->exec_ns, ns, memory_order_relaxed);
  if (!x->exec_flow) return;
  fair_charge(&e->fair, x->exec_flow, x->prio, (double)ns - charged);
  x->exec_estimate_ns = (3 * x->exec_estimate_ns + (double)ns) / 4;
}

static void wait_until(struct executor *e, uint64_t when_ns) {
  if (!when_ns) {
    pthread_cond_wait(&e->cv, &e->mu);
    return;
  }
  struct timespec ts = {(time_t)(when_ns / 1000000000u), (long)(when_ns % 1000000000u)};
  pthread_cond_timedwait(&e->cv, &e->mu, &ts);
}

/* The calling thread's place in the kernel's scheduling (executor.h). */
static void set_priority(enum executor_priority prio) {
  if (prio == EXECUTOR_LOW && setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10))
    LOG_WARN("executor thread: nice 10: %s", strerror(errno));
  struct sched_param none = {0};
  if (prio == EXECUTOR_IDLE && pthread_setschedparam(pthread_self(), SCHED_IDLE, &none))
    LOG_WARN("executor thread: SCHED_IDLE refused");
}

/* Runs x's claimed task; entered and left under e->mu. */
static void run_claimed(struct executor *e, struct run_op *x, size_t task, double charged) {
  pthread_mutex_unlock(&e->mu);
  uint64_t t0 = ccsd_now_ns();
  if (!atomic_load_explicit(&x->cancelled, memory_order_relaxed))
    engine_run_task(&x->plan, task, x->streaming);
  ccsd_failpoint("task");
  uint64_t took = ccsd_now_ns() - t0;
  atomic_fetch_add(&e->busy_ns, took);
  pthread_mutex_lock(&e->mu);
  e->running--;
  account(e, x, took, charged);
  if (finish_locked(e, x, task, 0)) { /* x lives on: its network tasks wait */
    pthread_mutex_unlock(&e->mu);
    e->handover(e->handover_arg, x);
    pthread_mutex_lock(&e->mu);
  }
}

static void *worker(void *arg) {
  struct executor *e = arg;
  set_priority(e->priority);
  pthread_mutex_lock(&e->mu);
  for (;;) {
    size_t task;
    uint64_t retry = 0;
    double charged;
    struct run_op *x = claim(e, &task, &charged, &retry);
    if (!x) {
      if (e->stop) break;
      wait_until(e, retry);
      continue;
    }
    run_claimed(e, x, task, charged);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

int ccsd_executor_help(struct executor *e) {
  if (e->priority != EXECUTOR_NORMAL || pthread_mutex_trylock(&e->mu)) return 0;
  size_t task;
  uint64_t retry = 0;
  double charged;
  struct run_op *x = e->queued && !e->stop ? claim(e, &task, &charged, &retry) : NULL;
  ccsd_executor_reap_begin();
  if (x) run_claimed(e, x, task, charged);
  pthread_mutex_unlock(&e->mu);
  ccsd_executor_reap(e);
  return x != NULL;
}

int ccsd_executor_healthy(struct executor *e, uint64_t *seen) {
  uint64_t done = atomic_load(&e->tasks_done);
  if (done != *seen) {
    *seen = done;
    return 1;
  }
  pthread_mutex_lock(&e->mu);
  int idle = e->queued == 0 && e->running == 0;
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

void ccsd_executor_reap_begin(void) { reaps = REAP_WATCH; }

void ccsd_executor_reap(struct executor *e) {
  int due = reaps == REAP_DUE;
  reaps = REAP_NONE;
  if (due && e) drain_done(e);
}

void ccsd_executor_set_handover(struct executor *e, void (*fn)(void *arg, struct run_op *x),
                                void *arg) {
  e->handover = fn;
  e->handover_arg = arg;
}

struct executor *ccsd_executor_new(uv_loop_t *loop, int threads, enum executor_priority prio) {
  struct executor *e = calloc(1, sizeof(*e));
  if (!e) return NULL;
  e->priority = prio;
  pthread_mutex_init(&e->mu, NULL);
  pthread_condattr_t attr; /* caps wait on the clock tasks are timed by */
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&e->cv, &attr);
  pthread_condattr_destroy(&attr);
  fair_init(&e->fair, QUANTUM_NS, (double)threads * 1e9);
  list_init(&e->done);
  uv_async_init(loop, &e->async, on_async);
  e->async.data = e;
  if ((e->fallback = fair_flow_get(&e->fair, FALLBACK_KEY)) != NULL) fair_ref(e->fallback);
  e->threads = e->fallback ? calloc((size_t)threads, sizeof(pthread_t)) : NULL;
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
  struct fair_flow *fl = fair_flow_get(&e->fair, (uint64_t)x->share->uid);
  if (fl) {
    fair_flow_set(fl, atomic_load(&x->share->weight), atomic_load(&x->share->cap));
  } else { /* no memory for a flow: its tasks run as cancelled */
    atomic_store(&x->cancelled, 1);
    fl = e->fallback;
  }
  fair_ref(fl);
  x->exec_flow = fl;
  x->exec_estimate_ns = FIRST_ESTIMATE_NS;
  x->submitted_ns = ccsd_now_ns();
  list_insert_tail(&fl->items[x->prio], &x->link);
  e->queued++;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  if (handover) e->handover(e->handover_arg, x); /* x waits for these: alive */
}

static void on_async_closed(uv_handle_t *h) {
  struct executor *e = h->data;
  if (e->fallback) fair_unref(e->fallback, 0);
  fair_close(&e->fair);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  free(e->threads);
  free(e);
}

void ccsd_executor_stop(struct executor *e) {
  pthread_mutex_lock(&e->mu);
  e->stop = 1;
  /* Ops not started are finished as cancelled: their ranks are gone. */
  struct list *f, *ftmp, *it, *tmp;
  LIST_FOREACH_SAFE(f, ftmp, &e->fair.flows) {
    struct fair_flow *fl = LIST_ENTRY(f, struct fair_flow, link);
    fair_flow_set(fl, fl->weight, 1); /* no cap holds the last tasks back */
    for (int c = 0; c < FAIR_CLASSES; c++)
      LIST_FOREACH_SAFE(it, tmp, &fl->items[c]) {
        atomic_store(&LIST_ENTRY(it, struct run_op, link)->cancelled, 1);
      }
  }
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  for (int i = 0; i < e->nthreads; i++) pthread_join(e->threads[i], NULL);
  drain_done(e);
  uv_close((uv_handle_t *)&e->async, on_async_closed);
}
