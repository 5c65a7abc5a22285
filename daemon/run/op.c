#include "run/op.h"

#include <stdio.h>
#include <stdlib.h>

void ccsd_run_op_free(struct run_op *x) {
  engine_plan_free(&x->plan);
  free(x->regions);
  free(x->orders);
  free(x->net_tasks);
  free(x->sent);
  free(x->sent_at);
}

int ccsd_run_op_peer_node(const struct run_op *x, size_t task) {
  const struct engine_item *nd = engine_task_item(&x->plan, task);
  if (x->p2p) /* participants 0 and 1 */
    return x->part_node[nd->kind == ENGINE_SEND ? 1 : 0];
  return x->part_node[nd->kind == ENGINE_SEND ? nd->to : nd->from];
}

void ccsd_run_op_net_error(struct run_op *x, ccs_result_t status, int node, const char *why) {
  int unset = 0;
  if (atomic_compare_exchange_strong(&x->net_error_taken, &unset, 1)) {
    snprintf(x->net_error, sizeof(x->net_error), "%s", why);
    x->net_status = status;
    x->net_node = node;
  }
  atomic_store(&x->cancelled, 1);
}
