/* Running the engine's graph: which tasks may run, and running one. The
 * bookkeeping is not thread-safe by itself: the executor calls it under
 * its lock and runs the tasks themselves outside it. */
#include <stdlib.h>

#include "kernels.h"
#include "run/engine_run.h"

static void make_ready(struct engine_plan *pl, size_t task, size_t *made) {
  if (--pl->pending[task] == 0) {
    if (pl->items[pl->task_item[task]].kind == ENGINE_COMPUTE) pl->ready[pl->ready_tail++] = (uint32_t)task;
    else pl->net_ready[pl->net_tail++] = (uint32_t)task;
    (*made)++;
  }
}

void engine_start(struct engine_plan *pl) {
  pl->ready_head = pl->ready_tail = pl->finished = 0;
  pl->net_head = pl->net_tail = 0;
  for (size_t t = 0; t < pl->ntasks; t++) pl->pending[t] = 1; /* released below */
  for (size_t i = 0; i < pl->nitems; i++) {
    const struct engine_item *nd = &pl->items[i];
    pl->items[i].chunks_left = nd->ntasks;
    for (size_t e = nd->succ_begin; e < nd->succ_end; e++) {
      const struct engine_item *to = &pl->items[pl->succ[e].to];
      for (size_t t = 0; t < to->ntasks; t++) pl->pending[to->first_task + t]++;
    }
  }
  size_t made = 0;
  for (size_t t = 0; t < pl->ntasks; t++) make_ready(pl, t, &made);
}

size_t engine_claim(struct engine_plan *pl) { return pl->ready[pl->ready_head++]; }

size_t engine_finish(struct engine_plan *pl, size_t task) {
  struct engine_item *nd = &pl->items[pl->task_item[task]];
  size_t chunk = task - nd->first_task, made = 0;
  int last = --nd->chunks_left == 0;
  for (size_t e = nd->succ_begin; e < nd->succ_end; e++) {
    const struct engine_item *to = &pl->items[pl->succ[e].to];
    if (pl->succ[e].chunkwise) make_ready(pl, to->first_task + chunk, &made);
    else if (last)
      for (size_t t = 0; t < to->ntasks; t++) make_ready(pl, to->first_task + t, &made);
  }
  pl->finished++;
  return made;
}

size_t engine_task_span(const struct engine_plan *pl, size_t task, size_t *ret_first) {
  const struct engine_item *nd = &pl->items[pl->task_item[task]];
  size_t begin = (task - nd->first_task) * pl->chunk_elems;
  *ret_first = begin;
  return nd->count - begin < pl->chunk_elems ? nd->count - begin : pl->chunk_elems;
}

void engine_run_task(const struct engine_plan *pl, size_t task, int streaming) {
  const struct engine_item *nd = &pl->items[pl->task_item[task]];
  size_t begin, n = engine_task_span(pl, task, &begin);
  if (nd->reduce)
    ccs__reduce_host(pl->dtype, pl->redop, nd->divisor, (const void *const *)nd->in, nd->nin,
                     nd->out, nd->nout, begin, n, streaming);
  else
    ccs__copy_host(nd->in[0], nd->out, nd->nout, begin * pl->elem_size, n * pl->elem_size, streaming);
  if (streaming) ccs__stream_fence();
}

void engine_run_all(struct engine_plan *pl, int streaming) {
  engine_start(pl);
  while (engine_has_ready(pl)) {
    size_t t = engine_claim(pl);
    engine_run_task(pl, t, streaming);
    engine_finish(pl, t);
  }
}
