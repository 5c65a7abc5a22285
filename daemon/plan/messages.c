/* A plan of messages alone (engine.h: engine_plan_messages): an op's
 * messages to other daemons sent again, and theirs taken, after a daemon
 * restarted (coll/replay.c). Each message is cut into chunks as the op's
 * plan cut it, so that every chunk carries the same tag and goes on the
 * same connection as the first time. */
#include <stdlib.h>
#include <string.h>

#include "plan/engine.h"

ccs_result_t engine_plan_messages(const struct engine_message *msgs, size_t n, ccs_dtype_t dtype,
                                  size_t chunk_elems, struct engine_plan *plan) {
  memset(plan, 0, sizeof(*plan));
  plan->dtype = dtype;
  plan->redop = CCS_SUM;
  plan->elem_size = ccs_dtype_size(dtype);
  plan->chunk_elems = chunk_elems ? chunk_elems : 1;
  plan->items = calloc(n + 1, sizeof(*plan->items));
  plan->ptrs = calloc(n + 1, sizeof(*plan->ptrs));
  size_t tasks = 0;
  for (size_t i = 0; plan->items && plan->ptrs && i < n; i++) {
    struct engine_item *nd = &plan->items[i];
    const struct engine_message *m = &msgs[i];
    *nd = (struct engine_item){.kind = m->send ? ENGINE_SEND : ENGINE_RECV, .from = m->from, .to = m->to,
                               .msg = m->msg, .count = m->count, .first_task = tasks,
                               .ntasks = (m->count + plan->chunk_elems - 1) / plan->chunk_elems};
    plan->ptrs[i] = m->buf;
    nd->in = (const void **)&plan->ptrs[i]; /* (both named, as engine_compile names them) */
    nd->out = &plan->ptrs[i];
    nd->nin = m->send;
    nd->nout = !m->send;
    tasks += nd->ntasks;
    plan->bytes_moved += m->count * plan->elem_size;
  }
  plan->nitems = n;
  plan->net_items = n;
  plan->ntasks = tasks;
  if (tasks <= UINT32_MAX) {
    plan->task_item = malloc((tasks + 1) * sizeof(uint32_t));
    plan->pending = malloc((tasks + 1) * sizeof(uint32_t));
    plan->ready = malloc(sizeof(uint32_t));
    plan->net_ready = malloc((tasks + 1) * sizeof(uint32_t));
    plan->succ = malloc(sizeof(*plan->succ));
  }
  if (!plan->items || !plan->ptrs || !plan->task_item || !plan->pending || !plan->ready || !plan->net_ready ||
      !plan->succ) {
    engine_plan_free(plan);
    return CCS_ERR_NO_MEMORY;
  }
  for (size_t i = 0; i < n; i++)
    for (size_t t = 0; t < plan->items[i].ntasks; t++)
      plan->task_item[plan->items[i].first_task + t] = (uint32_t)i;
  return CCS_OK;
}
