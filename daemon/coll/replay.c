/* The last collective across daemons, sent again (docs/restart.md). A
 * daemon answers its ranks once an op is done on its own node; when
 * another daemon of the comm crashes (kill -9), the op may have finished
 * here and not there, and what this daemon sent it is gone with it. So a
 * collective that sends at most peer_replay_bytes keeps a copy of its
 * messages as they go (the network thread copies each chunk as it posts
 * it: an in-place op overwrites its inputs after), and the comm keeps the
 * last finished one's. When the restarted daemon's ranks come back one
 * collective behind, the daemons that finished it send its messages again
 * under the same tags, on the new connections, and take (and drop) the
 * messages the daemons that run it again send them: the collective
 * finishes there with the same bits. On the loop thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "coll/coll.h"
#include "run/executor.h"
#include "run/net.h"

struct replay {
  uint64_t seq, sig_key;
  int p2p;      /* a send to a rank of another daemon: one message, from and to ranks */
  uint64_t age; /* sends: the comm's count of sends kept when this one was */
  ccs_dtype_t dtype;
  size_t chunk_elems;
  struct replay_msg {
    struct engine_message m; /* buf: an offset into sent (a send) or into the sink (a receive) */
    int node;                /* the daemon at the other end */
  } *msgs;
  size_t nmsgs;
  char *sent;
  size_t sent_cap, sent_bytes, sink_bytes;
  int *part_node; /* the op's participants' nodes */
  int nparts;
};

/* The messages going again, as an op of their own. */
struct replay_run {
  struct run_op run;
  struct comm *comm;
  int *part_node;
  char *sent, *sink;
};

void ccsd_replay_prepare(struct xop *x) {
  struct comm *c = x->comm;
  const struct engine_plan *pl = &x->run.plan;
  if (!c->spans || x->run.device >= 0 || !pl->net_items || c->co->cfg.peer_restart_grace_s <= 0 ||
      (x->run.p2p && pl->items[0].kind != ENGINE_SEND))
    return;
  size_t bytes = 0;
  for (size_t i = 0; i < pl->nitems; i++)
    if (pl->items[i].kind == ENGINE_SEND) bytes += pl->items[i].count * pl->elem_size;
  if (bytes > c->co->cfg.peer_replay_bytes) return;
  /* the buffer of a copy let go (not malloc'ed afresh each op: its pages
   * stay in place) */
  if (c->replay_spare && c->replay_spare_cap >= bytes) {
    x->run.sent = c->replay_spare, x->sent_cap = c->replay_spare_cap;
    c->replay_spare = NULL;
  } else {
    x->run.sent = malloc(bytes ? bytes : 1), x->sent_cap = bytes ? bytes : 1;
  }
  x->run.sent_at = malloc(sizeof(*x->run.sent_at) * pl->nitems);
  if (!x->run.sent || !x->run.sent_at) { /* not kept: a crash may cost the comm, as without */
    free(x->run.sent), free(x->run.sent_at);
    x->run.sent = NULL, x->run.sent_at = NULL;
    return;
  }
  bytes = 0;
  for (size_t i = 0; i < pl->nitems; i++) {
    x->run.sent_at[i] = bytes;
    if (pl->items[i].kind == ENGINE_SEND) bytes += pl->items[i].count * pl->elem_size;
  }
}

/* r goes; its buffer is kept for the next copy when it is the largest */
static void replay_free(struct comm *c, struct replay *r) {
  if (!r) return;
  if (r->sent && (!c->replay_spare || r->sent_cap > c->replay_spare_cap)) {
    free(c->replay_spare);
    c->replay_spare = r->sent, c->replay_spare_cap = r->sent_cap;
  } else {
    free(r->sent);
  }
  free(r->msgs);
  free(r->part_node);
  free(r);
}

/* The send from rank `from` to rank `to` kept, or NULL. */
static struct replay **send_of(const struct comm *c, int from, int to) {
  for (size_t i = 0; i < c->nreplay_sends; i++)
    if (c->replay_sends[i]->msgs[0].m.from == from && c->replay_sends[i]->msgs[0].m.to == to)
      return &c->replay_sends[i];
  return NULL;
}

/* Sends kept, the oldest first out, within peer_replay_bytes in all (a
 * comm may have many pairs of ranks); r is the newest. */
static void keep_send(struct comm *c, struct replay *r) {
  const struct engine_message *m = &r->msgs[0].m;
  struct replay **same = send_of(c, m->from, m->to);
  if (same) {
    replay_free(c, *same);
    *same = c->replay_sends[--c->nreplay_sends];
  }
  size_t bytes = r->sent_bytes;
  for (size_t i = 0; i < c->nreplay_sends; i++) bytes += c->replay_sends[i]->sent_bytes;
  while (bytes > c->co->cfg.peer_replay_bytes && c->nreplay_sends) {
    size_t oldest = 0;
    for (size_t i = 1; i < c->nreplay_sends; i++)
      if (c->replay_sends[i]->age < c->replay_sends[oldest]->age) oldest = i;
    bytes -= c->replay_sends[oldest]->sent_bytes;
    replay_free(c, c->replay_sends[oldest]);
    c->replay_sends[oldest] = c->replay_sends[--c->nreplay_sends];
  }
  struct replay **grown = realloc(c->replay_sends, sizeof(*grown) * (c->nreplay_sends + 1));
  if (!grown) {
    replay_free(c, r);
    return;
  }
  c->replay_sends = grown;
  r->age = ++c->replay_sends_made;
  c->replay_sends[c->nreplay_sends++] = r;
}

void ccsd_replay_keep(struct xop *x) {
  struct comm *c = x->comm;
  const struct engine_plan *pl = &x->run.plan;
  if (!x->run.sent || (!x->run.p2p && c->replay && c->replay->seq > x->seq)) return;
  struct replay *r = calloc(1, sizeof(*r));
  int nparts = x->run.p2p ? 2 : 0; /* a send's participants: its two ranks */
  for (size_t i = 0; !x->run.p2p && i < pl->nitems; i++) {
    const struct engine_item *nd = &pl->items[i];
    if (nd->kind != ENGINE_COMPUTE && nd->from >= nparts) nparts = nd->from + 1;
    if (nd->kind != ENGINE_COMPUTE && nd->to >= nparts) nparts = nd->to + 1;
  }
  if (r) {
    r->msgs = calloc(pl->net_items, sizeof(*r->msgs));
    r->part_node = malloc(sizeof(int) * (size_t)(nparts ? nparts : 1));
  }
  if (!r || !r->msgs || !r->part_node) {
    replay_free(c, r);
    return; /* (the one before is of no use any more either) */
  }
  memcpy(r->part_node, x->part_node, sizeof(int) * (size_t)nparts);
  r->nparts = nparts;
  for (size_t i = 0; i < pl->nitems; i++) {
    const struct engine_item *nd = &pl->items[i];
    if (nd->kind == ENGINE_COMPUTE || !nd->ntasks) continue;
    int send = nd->kind == ENGINE_SEND;
    size_t at = send ? x->run.sent_at[i] : r->sink_bytes;
    *(send ? &r->sent_bytes : &r->sink_bytes) += nd->count * pl->elem_size;
    r->msgs[r->nmsgs++] = (struct replay_msg){
        .m = {.send = send, .from = nd->from, .to = nd->to, .msg = nd->msg, .count = nd->count,
              .buf = (void *)(uintptr_t)at},
        .node = ccsd_run_op_peer_node(&x->run, nd->first_task)};
  }
  r->seq = x->seq;
  r->p2p = x->run.p2p;
  r->sig_key = x->run.sig_key;
  r->dtype = pl->dtype;
  r->chunk_elems = pl->chunk_elems;
  r->sent = x->run.sent;
  r->sent_cap = x->sent_cap;
  x->run.sent = NULL;
  if (r->p2p) {
    if (r->nmsgs) keep_send(c, r);
    else replay_free(c, r); /* nothing went */
    return;
  }
  replay_free(c, c->replay);
  c->replay = r;
}

uint64_t ccsd_replay_kept(const struct comm *c) { return c->replay ? c->replay->seq : 0; }

static void replay_done(struct run_op *x) {
  struct replay_run *rr = (struct replay_run *)x;
  struct comm *c = rr->comm;
  if (x->net_error[0]) /* (a daemon that goes again is held for again, or fails the comm) */
    LOG_WARN("comm %llu: sending %s again failed: %s", (unsigned long long)c->id,
             x->p2p ? "a message" : "a collective's messages", x->net_error);
  c->replaying--;
  ccsd_peers_release(c->co->peers, x->net_mem);
  ccsd_run_op_free(x);
  free(rr->part_node);
  free(rr->sent);
  free(rr->sink);
  free(rr);
  ccsd_comm_unref(c);
}

/* r's messages with the nodes marked in rerun go again, as an op of
 * their own; r stays (the daemon may go again before they are taken). */
static int launch(struct comm *c, const struct replay *r, const uint8_t *rerun) {
  struct engine_message *msgs = calloc(r->nmsgs + 1, sizeof(*msgs));
  size_t n = 0;
  for (size_t i = 0; msgs && i < r->nmsgs; i++) /* to and from the daemons that run it again */
    if (rerun[r->msgs[i].node]) msgs[n++] = r->msgs[i].m;
  struct replay_run *rr = msgs && n ? calloc(1, sizeof(*rr)) : NULL;
  if (rr) {
    rr->sent = malloc(r->sent_bytes ? r->sent_bytes : 1);
    rr->sink = malloc(r->sink_bytes ? r->sink_bytes : 1);
    rr->part_node = malloc(sizeof(int) * (size_t)(r->nparts ? r->nparts : 1));
    rr->run.regions = calloc(2, sizeof(*rr->run.regions));
  }
  int ok = msgs && (!n || (rr && rr->sent && rr->sink && rr->part_node && rr->run.regions));
  if (!n || !ok) {
    if (rr) free(rr->sent), free(rr->sink), free(rr->part_node), free(rr->run.regions);
    free(rr);
    free(msgs);
    return ok ? 0 : -1;
  }
  memcpy(rr->sent, r->sent, r->sent_bytes);
  for (size_t i = 0; i < n; i++) /* (an offset until now) */
    msgs[i].buf = (msgs[i].send ? rr->sent : rr->sink) + (uintptr_t)msgs[i].buf;
  struct run_op *x = &rr->run;
  ccs_result_t rc = engine_plan_messages(msgs, n, r->dtype, r->chunk_elems, &x->plan);
  free(msgs);
  memcpy(rr->part_node, r->part_node, sizeof(int) * (size_t)r->nparts);
  rr->comm = c;
  x->share = c->share;
  x->prio = c->prio;
  x->device = -1;
  x->stream_key = c->id;
  x->net = c->net;
  x->map = &c->map;
  x->part_node = rr->part_node;
  x->p2p = r->p2p;
  x->seq = r->seq;
  x->sig_key = r->sig_key;
  if (r->sent_bytes) x->regions[x->nregions++] = (struct run_region){rr->sent, r->sent_bytes, 0};
  if (r->sink_bytes) x->regions[x->nregions++] = (struct run_region){rr->sink, r->sink_bytes, 0};
  x->on_done = replay_done;
  c->replaying++;
  ccsd_comm_ref(c);
  if (rc != CCS_OK || ccsd_peers_op_prepare(x)) {
    replay_done(x);
    return -1;
  }
  ccsd_executor_submit(c->co->exec, x);
  return 0;
}

int ccsd_replay_start(struct comm *c, const uint8_t *rerun) {
  LOG_WARN("comm %llu: collective #%llu finished here, not at a daemon that went: its messages with the "
           "daemons that run it again go again", (unsigned long long)c->id, (unsigned long long)c->replay->seq);
  return launch(c, c->replay, rerun);
}

uint32_t ccsd_replay_sent(const struct comm *c, int from, int to) {
  struct replay **r = send_of(c, from, to);
  return r ? (*r)->msgs[0].m.msg + 1 : 0;
}

int ccsd_replay_send_again(struct comm *c, int from, int to) {
  struct replay **r = send_of(c, from, to);
  uint8_t *rerun = calloc((size_t)c->nnodes, 1);
  if (!r || !rerun) {
    free(rerun);
    return -1;
  }
  LOG_WARN("comm %llu: rank %d's send #%u to rank %d finished here, not at the daemon that went: it goes "
           "again", (unsigned long long)c->id, from, (*r)->msgs[0].m.msg + 1, to);
  rerun[(*r)->msgs[0].node] = 1;
  int rc = launch(c, *r, rerun);
  free(rerun);
  return rc;
}

void ccsd_replay_free(struct comm *c) {
  replay_free(c, c->replay);
  c->replay = NULL;
  for (size_t i = 0; i < c->nreplay_sends; i++) replay_free(c, c->replay_sends[i]);
  free(c->replay_sends);
  c->replay_sends = NULL;
  c->nreplay_sends = 0;
  free(c->replay_spare);
  c->replay_spare = NULL;
}
