/* An op every rank agreed on: the tuner picks its algorithm, the engine
 * compiles that algorithm's schedules over the ranks' mapped buffers, and
 * the graph runs on the loop (small ops) or on the executor's threads. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "log.h"

static const enum sched_coll coll_of[CCS__COLL_KIND_COUNT] = {
    [CCS__ALL_REDUCE] = SCHED_ALL_REDUCE, [CCS__BROADCAST] = SCHED_BROADCAST,
    [CCS__REDUCE] = SCHED_REDUCE,         [CCS__ALL_GATHER] = SCHED_ALL_GATHER,
    [CCS__REDUCE_SCATTER] = SCHED_REDUCE_SCATTER, [CCS__ALL_TO_ALL] = SCHED_ALL_TO_ALL,
    [CCS__GATHER] = SCHED_GATHER,         [CCS__SCATTER] = SCHED_SCATTER,
};

static char *send_ptr(const struct post *p) {
  return p->sendbuf ? (char *)p->sendbuf->base + p->send_off : NULL;
}
static char *recv_ptr(const struct post *p) {
  return p->recvbuf ? (char *)p->recvbuf->base + p->recv_off : NULL;
}

/* The op's size as nccl-tests counts it: what rules and the model measure. */
static uint64_t op_bytes(const struct post *p, int n) {
  uint64_t b = p->count * ccs_dtype_size(p->dtype);
  switch (p->kind) {
  case CCS__ALL_GATHER: case CCS__REDUCE_SCATTER: case CCS__ALL_TO_ALL: case CCS__GATHER:
  case CCS__SCATTER: return b * (uint64_t)n;
  default: return b;
  }
}

void ccsd_xop_free(struct xop *x) {
  if (!x) return;
  engine_plan_free(&x->plan);
  free(x->posts);
  free(x);
}

static ccs_result_t plan(struct xop *x, char *err, size_t errlen) {
  const struct ccsd_config *cfg = &x->comm->d->cfg;
  const struct post *p0 = x->posts[0];
  int n = x->kind == CCS__SEND ? 2 : x->comm->nranks;
  uint64_t bytes = op_bytes(p0, n);
  if (x->kind == CCS__BARRIER) { /* nothing to move: matching was the barrier */
    x->algo = SCHED_DIRECT;
    snprintf(x->why, sizeof(x->why), "a barrier moves no data");
    return CCS_OK;
  }
  struct engine_rank *ranks = calloc((size_t)n, sizeof(*ranks));
  if (!ranks) {
    snprintf(err, errlen, "out of memory planning %s", ccs__coll_name(x->kind));
    return CCS_ERR_NO_MEMORY;
  }
  struct engine_op op = {.n = n, .count = p0->count, .dtype = (ccs_dtype_t)p0->dtype,
                         .redop = (ccs_redop_t)p0->redop, .ranks = ranks,
                         .chunk_bytes = cfg->chunk_bytes};
  if (x->kind == CCS__SEND) { /* a broadcast from the sender to the receiver */
    op.coll = SCHED_BROADCAST;
    op.algo = SCHED_DIRECT;
    ranks[0].send = send_ptr(x->posts[0]);
    ranks[1].recv = recv_ptr(x->posts[1]);
    snprintf(x->why, sizeof(x->why), "a send and its receive: one copy");
  } else {
    op.coll = coll_of[x->kind];
    op.root = p0->root;
    for (int r = 0; r < n; r++) {
      ranks[r].send = send_ptr(x->posts[r]);
      ranks[r].recv = recv_ptr(x->posts[r]);
    }
    op.algo = ccsd_tune(op.coll, n, bytes, &ccsd_link_mapped, &x->comm->rules, x->why,
                        sizeof(x->why));
  }
  uint64_t pieces = bytes / cfg->chunk_bytes; /* blocks of a pipelined chain or tree */
  op.pipeline = pieces < 1 ? 1 : pieces > 8 ? 8 : (int)pieces;
  x->algo = op.algo;
  ccs_result_t rc = engine_compile(&op, &x->plan, err, errlen);
  free(ranks);
  x->streaming = x->plan.bytes_written >= cfg->stream_bytes;
  return rc;
}

/* "all_reduce #3, 1048576 bytes, 4 ranks: ring (rule 1 (all_reduce:ring)); 4 nodes, 16 tasks" */
static void describe(const struct xop *x, char *buf, size_t len) {
  int n = x->kind == CCS__SEND ? 2 : x->comm->nranks;
  snprintf(buf, len, "comm %llu: %s #%llu, %llu bytes, %d ranks: %s (%s); %zu nodes, %zu tasks",
           (unsigned long long)x->comm->id, ccs__coll_name(x->kind), (unsigned long long)x->seq,
           (unsigned long long)op_bytes(x->posts[0], n), n, sched_algo_name(x->algo), x->why,
           x->plan.nnodes, x->plan.ntasks);
}

void ccsd_op_launch(struct comm *c, struct post **posts, int nposts, uint64_t seq) {
  char err[CCS__ERROR_TEXT_MAX] = "out of memory";
  ccs_result_t rc = CCS_ERR_NO_MEMORY;
  struct xop *x = calloc(1, sizeof(*x));
  if (x) x->posts = malloc(sizeof(*x->posts) * (size_t)nposts);
  if (x && x->posts) {
    memcpy(x->posts, posts, sizeof(*x->posts) * (size_t)nposts);
    x->comm = c;
    x->uid = c->uid;
    x->nposts = nposts;
    x->kind = posts[0]->kind;
    x->seq = seq;
    rc = plan(x, err, sizeof(err));
  }
  if (rc != CCS_OK) {
    for (int i = 0; i < nposts; i++) ccsd_post_finish(posts[i], rc, err);
    ccsd_xop_free(x);
    return;
  }
  if (ccs__log_level >= CCS_LOG_TRACE) {
    char what[512];
    describe(x, what, sizeof(what));
    LOG_TRACE(CCS_LOG_COLL, "%s", what);
  }
  ccsd_comm_ref(c);
  list_insert_tail(&c->running, &x->comm_link);
  /* Small ops run right here: on these machines a blocking wake-up costs
   * 15-40 us and the executor path takes two, while reducing 64 KiB takes
   * a few; the loop stays responsive. Everything else goes to the threads. */
  if (x->plan.ntasks == 0 || x->plan.bytes_moved <= c->d->cfg.inline_bytes) {
    engine_run_all(&x->plan, x->streaming);
    ccsd_xop_done(x);
  } else {
    ccsd_executor_submit(c->d->exec, x);
  }
}

void ccsd_xop_done(struct xop *x) {
  struct comm *c = x->comm;
  list_remove(&x->comm_link);
  int cancelled = atomic_load(&x->cancelled);
  char info[512] = "";
  for (int i = 0; i < x->nposts; i++) {
    struct post *p = x->posts[i];
    if (p->member->debug && p->sub) {
      if (!info[0]) describe(x, info, sizeof(info));
      ccsd_submission_note(p->sub, info);
    }
    ccsd_post_finish(p, cancelled ? c->error : CCS_OK, cancelled ? c->error_text : NULL);
  }
  ccsd_xop_free(x);
  ccsd_comm_unref(c);
}
