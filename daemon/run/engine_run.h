/* Running the engine's graph (plan/engine.h): which tasks may run, and
 * running one. */
#ifndef CCSD_RUN_ENGINE_RUN_H
#define CCSD_RUN_ENGINE_RUN_H

#include "plan/engine.h"

/* Running: start once; then, under one lock, claim a ready task, run it
 * (without the lock), and finish it, which may make others ready. Compute
 * tasks and network tasks queue apart: whoever drives the network claims
 * its own without passing through the threads that compute. */
void engine_start(struct engine_plan *plan);
static inline int engine_has_ready(const struct engine_plan *plan) {
  return plan->ready_head < plan->ready_tail;
}
static inline int engine_has_net_ready(const struct engine_plan *plan) {
  return plan->net_head < plan->net_tail;
}
static inline size_t engine_claim_net(struct engine_plan *plan) { /* engine_has_net_ready first */
  return plan->net_ready[plan->net_head++];
}
static inline int engine_done(const struct engine_plan *plan) {
  return plan->finished == plan->ntasks;
}
size_t engine_claim(struct engine_plan *plan); /* engine_has_ready first */
/* Task `task` covers elements [*ret_first, *ret_first + return) of its item. */
size_t engine_task_span(const struct engine_plan *plan, size_t task, size_t *ret_first);
void engine_run_task(const struct engine_plan *plan, size_t task, int streaming);
/* How many tasks it made ready. */
size_t engine_finish(struct engine_plan *plan, size_t task);
/* Everything, in order, on the calling thread (no SEND or RECV nodes). */
void engine_run_all(struct engine_plan *plan, int streaming);

#endif
