/* An op every rank agreed on: the tuner picks its algorithm, the engine
 * compiles that algorithm's schedules over the ranks' mapped buffers, and
 * the graph runs on the loop (small ops) or on the executor's threads. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/failpoint.h"
#include "coll/coll.h"
#include "plan/pool.h"
#include "run/engine_run.h"
#include "run/executor.h"
#include "base/log.h"

static const enum sched_coll coll_of[CCS__COLL_KIND_COUNT] = {
    [CCS__ALL_REDUCE] = SCHED_ALL_REDUCE, [CCS__BROADCAST] = SCHED_BROADCAST,
    [CCS__REDUCE] = SCHED_REDUCE,         [CCS__ALL_GATHER] = SCHED_ALL_GATHER,
    [CCS__REDUCE_SCATTER] = SCHED_REDUCE_SCATTER, [CCS__ALL_TO_ALL] = SCHED_ALL_TO_ALL,
    [CCS__GATHER] = SCHED_GATHER,         [CCS__SCATTER] = SCHED_SCATTER,
};

static char *send_ptr(const struct post *p) {
  return p->send.base ? (char *)p->send.base + p->send_off : NULL;
}
static char *recv_ptr(const struct post *p) {
  return p->recv.base ? (char *)p->recv.base + p->recv_off : NULL;
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
  if (x->plan_kept) plan_cache_give_back(&x->comm->plans, &x->run.plan, x->plan_gen);
  ccsd_run_op_free(&x->run);
  free(x->posts);
  free(x->part_node);
  free(x->why);
  free(x);
}

/* The next message number between two ranks of c (send/recv across daemons:
 * both daemons count the same pair the same way). */
static uint32_t p2p_number(struct comm *c, int from, int to) {
  for (size_t i = 0; i < c->np2p; i++)
    if (c->p2p_counts[i].from == from && c->p2p_counts[i].to == to) return c->p2p_counts[i].n++;
  struct p2p_count *grown = realloc(c->p2p_counts, (c->np2p + 1) * sizeof(*grown));
  if (!grown) return UINT32_MAX;
  c->p2p_counts = grown;
  c->p2p_counts[c->np2p++] = (struct p2p_count){from, to, 1};
  return 0;
}

static const struct post *first_post(const struct xop *x) {
  for (int i = 0; i < x->nposts; i++)
    if (x->posts[i]) return x->posts[i];
  return NULL;
}

/* Whether anyone will read how x runs (describe): a debug rank, or the log. */
static int explained(const struct xop *x) {
  if (ccs__log_level >= CCS_LOG_TRACE) return 1;
  for (int i = 0; i < x->nposts; i++)
    if (x->posts[i] && x->posts[i]->member->debug) return 1;
  return 0;
}

static ccs_result_t plan(struct xop *x, char *err, size_t errlen) {
  struct comm *c = x->comm;
  if (explained(x)) x->why = calloc(1, CCSD_WHY_MAX); /* none: no explanation */
  size_t whylen = x->why ? CCSD_WHY_MAX : 0;
  const struct coll_config *cfg = &c->co->cfg;
  const struct post *p0 = first_post(x);
  int p2p = ccsd_p2p_kind(x->kind);
  int n = p2p ? 2 : c->nranks;
  uint64_t bytes = op_bytes(p0, n);
  if (x->kind == CCS__BARRIER && !c->spans) { /* nothing to move: matching was the barrier */
    x->algo = SCHED_DIRECT;
    if (x->why) snprintf(x->why, whylen, "a barrier moves no data");
    return CCS_OK;
  }
  struct engine_part *ranks = calloc((size_t)n, sizeof(*ranks));
  x->part_node = calloc((size_t)n, sizeof(int));
  if (!ranks || !x->part_node) {
    free(ranks);
    snprintf(err, errlen, "out of memory planning %s", ccs__coll_name(x->kind));
    return CCS_ERR_NO_MEMORY;
  }
  struct engine_op op = {.n = n, .count = p0->count, .dtype = (ccs_dtype_t)p0->dtype,
                         .redop = (ccs_redop_t)p0->redop, .ranks = ranks, .pool = c->co->pool,
                         .chunk_bytes = c->spans ? c->chunk_bytes : cfg->chunk_bytes};
  if (x->run.device >= 0) { /* one stream runs it in order: one launch per node, no chunks */
    op.pool = ccsd_gpu_pool(c->co->gpu, x->run.device);
    op.chunk_bytes = (size_t)1 << 60;
  }
  int from = -1, to = -1;
  struct engine_part *members = NULL;
  if (p2p) { /* a broadcast from the sender to the receiver */
    const struct post *send = x->kind == CCS__SEND ? p0 : x->nposts > 1 ? x->posts[1] : NULL;
    const struct post *recv = x->kind == CCS__RECV ? p0 : x->nposts > 1 ? x->posts[1] : NULL;
    from = send ? send->member->rank : recv->root;
    to = recv ? recv->member->rank : send->root;
    op.coll = SCHED_BROADCAST;
    op.algo = SCHED_DIRECT;
    ranks[0].send = send ? send_ptr(send) : NULL;
    ranks[1].recv = recv ? recv_ptr(recv) : NULL;
    ranks[0].remote = !send;
    ranks[1].remote = !recv;
    x->part_node[0] = c->spans ? c->node_of_rank[from] : 0;
    x->part_node[1] = c->spans ? c->node_of_rank[to] : 0;
    if (x->why) snprintf(x->why, whylen, "a send and its receive: %s",
                      send && recv ? "one copy" : "one message between daemons");
  } else if (c->spans && x->kind != CCS__ALL_TO_ALL && x->kind != CCS__BARRIER) {
    /* Among daemons: one participant per node, standing for its ranks; this
     * node's are reduced in one pass before the network and get the result
     * in one pass after it. Where a collective's blocks are ranks', a
     * node's block is its ranks' blocks, so no rank's block crosses a link
     * twice. (all_to_all stays rank by rank: its pieces go straight to
     * their node either way.) */
    members = calloc((size_t)c->nlocal + 1, sizeof(*members));
    if (!members) {
      free(ranks);
      snprintf(err, errlen, "out of memory planning %s", ccs__coll_name(x->kind));
      return CCS_ERR_NO_MEMORY;
    }
    struct engine_part *mine = &ranks[c->mynode];
    mine->root_member = -1;
    for (int i = c->node_first[c->mynode]; i < c->node_first[c->mynode + 1]; i++) {
      int r = c->rank_of[i];
      const struct post *each = x->posts[r];
      if (r == p0->root) mine->root_member = mine->nmembers;
      members[mine->nmembers].send = each ? send_ptr(each) : NULL;
      members[mine->nmembers++].recv = each ? recv_ptr(each) : NULL;
    }
    mine->members = members;
    if (!sched_coll_splits(coll_of[x->kind])) {
      op.rank_of = c->rank_of;
      op.group_first = c->node_first;
    }
    for (int k = 0; k < c->nnodes; k++) {
      ranks[k].remote = k != c->mynode;
      x->part_node[k] = k;
    }
    op.n = n = c->nnodes;
    op.coll = coll_of[x->kind];
    op.root = c->node_of_rank[p0->root];
    op.avg_divisor = (size_t)c->nranks;
    op.algo = ccsd_tune(op.coll, n, bytes, &c->co->link, &c->rules, x->why, whylen);
  } else {
    op.coll = x->kind == CCS__BARRIER ? SCHED_ALL_REDUCE : coll_of[x->kind];
    if (x->kind == CCS__BARRIER) op.count = 1; /* one byte each way: the barrier is its arrival */
    for (int p = 0; p < n; p++) {
      int r = c->spans ? c->rank_of[p] : p;
      const struct post *each = x->posts[r];
      if (each) {
        ranks[p].send = send_ptr(each);
        ranks[p].recv = recv_ptr(each);
      }
      ranks[p].remote = !each;
      x->part_node[p] = c->spans ? c->node_of_rank[r] : 0;
      if (r == p0->root) op.root = p;
    }
    if (c->spans) op.rank_of = c->rank_of;
    op.algo = ccsd_tune(op.coll, n, bytes, c->spans ? &c->co->link : &ccsd_link_mapped, &c->rules,
                        x->why, whylen);
  }
  uint64_t pieces = bytes / op.chunk_bytes; /* blocks of a pipelined chain or tree */
  op.pipeline = pieces < 1 ? 1 : pieces > 8 ? 8 : (int)pieces;
  x->algo = op.algo;
  char *barrier = NULL;
  if (x->kind == CCS__BARRIER) { /* two bytes a local rank, the comm's: the same op every time */
    if (!c->barrier_bytes) c->barrier_bytes = calloc((size_t)n, 2);
    barrier = c->barrier_bytes;
    for (int p = 0; barrier && p < n; p++)
      if (!ranks[p].remote) ranks[p].send = barrier + 2 * p, ranks[p].recv = barrier + 2 * p + 1;
    op.dtype = CCS_UINT8;
    op.redop = CCS_MAX;
  }
  ccs_result_t rc = CCS_ERR_NO_MEMORY;
  int keepable = x->run.device < 0 && !p2p;
  if (keepable && plan_cache_take(&c->plans, &op, &x->run.plan, &x->plan_gen)) {
    rc = CCS_OK;
    x->plan_kept = 1;
  } else if (barrier || x->kind != CCS__BARRIER) {
    rc = engine_compile(&op, &x->run.plan, err, errlen);
    const struct engine_plan *pl = &x->run.plan;
    /* across daemons the remote contributions land in scratch, kept with
     * the plan (registered once: the pool's memory, run/op.h) */
    if (rc == CCS_OK && keepable && (c->spans || (!pl->net_items && !pl->nscratch)) &&
        pl->bytes_moved <= cfg->inline_bytes)
      x->plan_kept = plan_cache_note(&c->plans, &op, &x->plan_gen);
  }
  free(ranks);
  free(members);
  if (rc == CCS_OK && p2p && x->run.plan.net_items) { /* name the message by its ranks */
    struct engine_item *nd = &x->run.plan.items[0];
    uint32_t number = p2p_number(c, from, to);
    nd->from = from;
    nd->to = to;
    nd->msg = number;
    if (number == UINT32_MAX) rc = CCS_ERR_NO_MEMORY, snprintf(err, errlen, "out of memory");
  }
  x->run.streaming = x->run.plan.bytes_written >= cfg->stream_bytes;
  return rc;
}

/* "all_reduce #3, 1048576 bytes, 4 ranks: ring (rule 1 (all_reduce:ring)); 4 items, 16 tasks" */
static void describe(const struct xop *x, char *buf, size_t len) {
  int n = ccsd_p2p_kind(x->kind) ? 2 : x->comm->nranks;
  char where[32] = "";
  if (x->run.device >= 0) snprintf(where, sizeof(where), " on GPU %d", x->run.device);
  snprintf(buf, len, "comm %llu: %s #%llu, %llu bytes, %d ranks%s%s: %s (%s); %zu items, %zu tasks",
           (unsigned long long)x->comm->id, ccs__coll_name(x->kind), (unsigned long long)x->seq,
           (unsigned long long)op_bytes(first_post(x), n), n,
           x->comm->spans ? " across daemons" : "", where, sched_algo_name(x->algo), x->why ? x->why : "",
           x->run.plan.nitems, x->run.plan.ntasks);
}

static void ccsd_xop_done(struct xop *x);
static void on_run_done(struct run_op *r) { ccsd_xop_done(LIST_ENTRY(r, struct xop, run)); }

/* What the run layer needs of x besides its plan: where it runs, whose
 * stream order it keeps, the memory its messages may touch, who is where,
 * and how it comes back. -1 when out of memory. */
static int hand_down(struct xop *x) {
  struct comm *c = x->comm;
  struct run_op *r = &x->run;
  r->orders = calloc((size_t)x->nposts, sizeof(*r->orders));
  r->regions = calloc(2 * (size_t)x->nposts + 1, sizeof(*r->regions));
  if (!r->orders || !r->regions) return -1;
  r->norders = x->nposts;
  r->stream_key = c->id;
  for (int i = 0; i < x->nposts; i++) {
    const struct post *p = x->posts[i];
    if (!p) continue;
    r->orders[i] = p->order;
    const struct coll_buf *bufs[2] = {&p->send, &p->recv};
    for (int k = 0; k < 2; k++)
      if (bufs[k]->base) /* a client's mapping: the layer above forgets it when it goes */
        r->regions[r->nregions++] = (struct run_region){bufs[k]->base, bufs[k]->size, 1};
  }
  if (x->kind == CCS__BARRIER && c->barrier_bytes) /* forgotten with the comm */
    r->regions[r->nregions++] = (struct run_region){c->barrier_bytes, 2 * (size_t)c->nranks, 1};
  r->scratch_cacheable = r->plan.pool && r->plan.pool == c->co->pool;
  r->net = c->net;
  r->map = &c->map;
  r->part_node = x->part_node;
  r->p2p = ccsd_p2p_kind(x->kind);
  r->seq = x->seq;
  r->on_done = on_run_done;
  ccsd_replay_prepare(x);
  return r->plan.net_items ? ccsd_peers_op_prepare(r) : 0;
}

void ccsd_op_launch(struct comm *c, struct post **posts, int nposts, uint64_t seq) {
  char err[CCS__ERROR_TEXT_MAX] = "out of memory";
  ccsd_failpoint("launch");
  for (int i = 0; i < nposts; i++)
    if (posts[i]) { /* the other daemons hear what this one's ranks called */
      ccsd_agree_launched(c, posts[i], seq);
      break;
    }
  ccs_result_t rc = CCS_ERR_NO_MEMORY;
  struct xop *x = calloc(1, sizeof(*x));
  if (x) x->posts = malloc(sizeof(*x->posts) * (size_t)nposts);
  if (x && x->posts) {
    memcpy(x->posts, posts, sizeof(*x->posts) * (size_t)nposts);
    x->comm = c;
    x->run.share = c->share;
    x->run.prio = c->prio;
    x->nposts = nposts;
    x->kind = first_post(x) ? first_post(x)->kind : CCS__BARRIER;
    x->seq = seq;
    if (c->spans && !ccsd_p2p_kind(x->kind) && first_post(x)) {
      struct op_sig sig = ccsd_op_sig_of(first_post(x));
      x->run.sig_key = ccsd_op_sig_key(&sig);
    }
    static const uint64_t no_gpus[CCSD_GPU_MAX_DEVICES];
    x->run.device = ccsd_gpu_op_device(x->posts, nposts, c->spans,
                                   c->co->gpu ? ccsd_gpu_reach(c->co->gpu) : no_gpus, &rc, err,
                                   sizeof(err));
    if (x->run.device >= -1) rc = plan(x, err, sizeof(err));
  }
  if (rc != CCS_OK) {
    for (int i = 0; i < nposts; i++)
      if (posts[i]) ccsd_post_finish(posts[i], rc, err);
    ccsd_xop_free(x);
    return;
  }
  for (int i = 0; i < nposts; i++) /* for the metrics: which algorithm ran it */
    if (posts[i]) posts[i]->algo = sched_algo_name(x->algo);
  if (ccs__log_level >= CCS_LOG_TRACE) {
    char what[512];
    describe(x, what, sizeof(what));
    LOG_TRACE(CCS_LOG_COLL, "%s", what);
  }
  if (hand_down(x)) {
    for (int i = 0; i < nposts; i++)
      if (posts[i]) ccsd_post_finish(posts[i], CCS_ERR_NO_MEMORY, "out of memory launching the op");
    ccsd_xop_free(x);
    return;
  }
  ccsd_comm_ref(c);
  list_insert_tail(&c->running, &x->comm_link);
  x->launched_ms = ccsd_fresh_ms_of(c->co);
  for (int i = 0; i < nposts; i++)
    if (posts[i] && posts[i]->ops->started) posts[i]->ops->started(posts[i]);
  ccsd_failpoint("started");
  /* the timer may be set for a later deadline: this op's word is due sooner */
  if (x->run.plan.net_items) ccsd_comm_check_deadlines(c);
  if (x->run.device >= 0) {
    ccsd_gpu_submit(c->co->gpu, &x->run);
    return;
  }
  /* Small ops run right here: on these machines a blocking wake-up costs
   * 15-40 us and the executor path takes two, while moving 256 KiB (a 64
   * KiB all_reduce of 2 ranks) takes a few; the loop stays responsive.
   * Everything else goes to the threads. */
  int small = x->run.plan.bytes_moved <= c->co->cfg.inline_bytes;
  if (x->run.plan.ntasks == 0 || (!x->run.plan.net_items && small)) {
    engine_run_all(&x->run.plan, x->run.streaming);
    ccsd_xop_done(x);
  } else {
    x->run.on_net = x->run.plan.net_items && small; /* the network thread computes too: no wake-up */
    ccsd_executor_submit(c->co->exec, &x->run);
  }
}

/* Answers posts[i], with how the op ran if asked. */
static void reply_post(struct xop *x, int i, ccs_result_t status, const char *error, char *info,
                       size_t infolen) {
  struct post *p = x->posts[i];
  if (p->replied) return;
  if (p->member->debug) {
    if (!info[0]) describe(x, info, infolen);
    p->ops->note(p, info);
  }
  p->replied = 1;
  p->ops->reply(p, status, error);
}

static void ccsd_xop_done(struct xop *x) {
  struct comm *c = x->comm;
  /* its memory leaves the transport before the buffers may go */
  ccsd_peers_release(c->co->peers, x->run.net_mem);
  x->run.net_mem = NULL;
  char info[512] = "";
  int failed = atomic_load(&x->run.cancelled) || x->run.gpu_error[0];
  /* a daemon of the comm went: the op waits with the comm for it (hold.c;
   * a hold that starts here counts x among the ops under way) */
  int kept = failed && !x->run.gpu_error[0] && ccsd_hold_keep(x);
  list_remove(&x->comm_link);
  if (kept) {
    ccsd_xop_free(x);
    ccsd_comm_unref(c);
    return;
  }
  if (failed && c->hold && c->state == COMM_READY && !x->run.net_error[0] && !x->run.gpu_error[0])
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory keeping op #%llu while a daemon restarts",
                   (unsigned long long)x->seq);
  if (!failed) ccsd_hold_op_done(x), ccsd_replay_keep(x);
  if (x->run.net_error[0] && c->state != COMM_FAILED) /* the network thread said why */
    ccsd_comm_fail(c, x->run.net_status, "%s", x->run.net_error);
  if (x->run.gpu_error[0] && c->state != COMM_FAILED) /* as NCCL: a CUDA error ends the comm */
    ccsd_comm_fail(c, CCS_ERR_CUDA, "%s", x->run.gpu_error);
  for (int i = 0; i < x->nposts; i++) {
    if (!x->posts[i]) continue; /* a rank of another daemon */
    reply_post(x, i, failed ? c->error : CCS_OK, failed ? c->error_text : NULL, info, sizeof(info));
    x->posts[i]->ops->release(x->posts[i]);
  }
  ccsd_xop_free(x);
  ccsd_comm_launch_queued(c);
  ccsd_comm_unref(c);
}
