/* Executor threads: run the tasks of ops' graphs (plan/engine.h) as they
 * become ready, tenants taking turns, and hand finished ops back to the
 * loop thread (run_op.on_done). */
#ifndef CCSD_RUN_EXECUTOR_H
#define CCSD_RUN_EXECUTOR_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "run/op.h"

struct executor;

/* How the kernel schedules the executor's threads against every other
 * thread of the machine (the loop's, the ranks'): as they are, below them
 * (nice 10), or only when a CPU has nothing else to run (SCHED_IDLE). */
enum executor_priority { EXECUTOR_NORMAL, EXECUTOR_LOW, EXECUTOR_IDLE };

struct executor *ccsd_executor_new(uv_loop_t *loop, int threads, enum executor_priority prio);
/* Joins the threads, completes every op still held (cancelled), and frees
 * the executor once the loop has closed its handle. */
void ccsd_executor_stop(struct executor *e);
/* From the loop thread: x is compiled and filled (run/op.h). */
void ccsd_executor_submit(struct executor *e, struct run_op *x);

/* The loop thread, with nothing else to do: runs one ready task as a
 * thread of the executor would, so that an op's work begins while the
 * threads wake (each wake-up is tens of microseconds where CPUs are
 * shared), and hands back at once an op that task finished (as
 * ccsd_executor_reap does). 1 when it ran one. Never when the threads run
 * below the loop's priority (bulk work is not to run at the loop's), nor
 * when the executor's lock is taken (the loop never waits for it). */
int ccsd_executor_help(struct executor *e);

/* The loop thread around work it does itself (driving the transport):
 * the ops that finish meanwhile are handed back by the reap that ends it,
 * rather than through libuv's wake-up (an eventfd written and read, and a
 * turn of libuv's loop, on every small op across daemons). */
void ccsd_executor_reap_begin(void);
void ccsd_executor_reap(struct executor *e);

/* The network side. fn is told (from any thread, outside the executor's
 * lock) that x has ready network tasks for it to take with net_step. */
void ccsd_executor_set_handover(struct executor *e, void (*fn)(void *arg, struct run_op *x),
                                void *arg);
/* The network thread: finishes x's task (CCSD_NO_TASK: none), and takes
 * up to max of x's ready network tasks (and compute tasks, x->on_net) into
 * tasks, unless a hand-over of x is on its way: that one takes them
 * (handover: this call is it). x may be gone after a call that took none. */
#define CCSD_NO_TASK ((size_t)-1)
size_t ccsd_executor_net_step(struct executor *e, struct run_op *x, size_t task, int handover,
                              size_t *tasks, size_t max);

/* 1 when tasks finished since *seen (updated) or nothing is waiting */
int ccsd_executor_healthy(struct executor *e, uint64_t *seen);
double ccsd_executor_busy_seconds(struct executor *e);

#endif
