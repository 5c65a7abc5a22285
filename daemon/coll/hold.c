/* A comm across daemons held while one of its daemons restarts
 * (docs/restart.md), on the daemons that stayed. When the daemon at node
 * k goes (its connections close), the comm is not failed at once: it
 * waits peer_restart_grace for it. Its ops under way are stopped and kept
 * unanswered; new ones wait. Once nothing runs here, this daemon tells
 * the one that went, again until it answers, who is where and where its
 * ranks' calls stood, as a client reports after a restart: collectives
 * finished here, whether the op stopped here had written over its inputs
 * (in place: it cannot run again), and the sends and receives finished
 * with ranks there. The restarted daemon settles every channel once its
 * own ranks are back too (span.c) and answers with the verdict: the ops
 * kept here run again, or return CCS_ERR_RETRY to every rank, and the comm
 * goes on over new data connections. No answer within the grace, the
 * comm fails naming the daemon. On the loop thread. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "coll/coll.h"

#define HOLD_ASK_MS 50      /* the first word to the daemon that went, then twice as long */
#define HOLD_ASK_MAX_MS 500

struct comm_hold {
  char addr[CCSD_ADDR_MAX];
  int node;
  uint64_t number; /* the answer names it: one to an earlier hold is not this one's */
  uint64_t until_ms, ask_ms;
  uint64_t finished;  /* collectives finished here: final once nothing runs */
  uint64_t retry_seq; /* the op stopped here after writing over its inputs; 0: none */
  struct list p2p;    /* sends and receives across daemons posted meanwhile */
  char why[160];
};

static int p2p_kind(uint32_t kind) { return kind == CCS__SEND || kind == CCS__RECV; }

/* A post whose op reads what it writes: it cannot run again once begun. */
static int in_place(const struct post *p) {
  return p->send.base && p->send.base == p->recv.base && p->send_off < p->recv_off + p->recv_len &&
         p->recv_off < p->send_off + p->send_len;
}

static int streamed(const struct post *p) { return p->ordered || p->order.flags; }

/* Why c cannot wait for a daemon: an op it cannot stop and run again. */
static const char *unholdable(const struct comm *c) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &c->running) {
    const struct xop *x = LIST_ENTRY(it, struct xop, comm_link);
    if (p2p_kind(x->kind) && x->run.plan.net_items) return "a send or receive across daemons was under way";
    for (int i = 0; i < x->nposts; i++)
      if (x->posts[i] && streamed(x->posts[i])) return "a stream's op was under way";
  }
  const struct list *pending[2] = {&c->slots, &c->queued};
  for (int k = 0; k < 2; k++)
    LIST_FOREACH_SAFE(it, tmp, (struct list *)pending[k]) {
      const struct slot *sl = LIST_ENTRY(it, struct slot, link);
      if (sl->ordered) return "a stream's op was pending";
    }
  return NULL;
}

/* "1,3-4"-like list of the ranks at node */
static void ranks_of(const struct comm *c, int node, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
  for (int r = 0; r < c->nranks && n + 16 < len; r++)
    if (c->node_of_rank[r] == node) n += (size_t)snprintf(buf + n, len - n, n ? ",%d" : "%d", r);
}

static void on_ask(uv_timer_t *t);

int ccsd_hold_start(struct comm *c, int node, const char *why) {
  if (c->hold) return c->hold->node == node ? 0 : -1; /* a second daemon gone: no one to settle with */
  if (c->co->cfg.peer_restart_grace_s <= 0 || c->state != COMM_READY || !c->node_of_rank || node < 0 ||
      node >= c->nnodes || node == c->mynode)
    return -1;
  const char *cannot = unholdable(c);
  if (cannot) {
    LOG_WARN("comm %llu cannot wait for the daemon at %s to come back: %s", (unsigned long long)c->id,
             c->node_addr[node], cannot);
    return -1;
  }
  struct comm_hold *h = calloc(1, sizeof(*h));
  if (!h) return -1;
  snprintf(h->addr, sizeof(h->addr), "%s", c->node_addr[node]);
  snprintf(h->why, sizeof(h->why), "%s", why);
  h->node = node;
  h->number = ++*c->co->next_id;
  list_init(&h->p2p);
  uint64_t now = ccsd_fresh_ms_of(c->co);
  h->until_ms = now + (uint64_t)(c->co->cfg.peer_restart_grace_s * 1000);
  h->ask_ms = HOLD_ASK_MS;
  /* the ops not finished here: the running one (a rank answered waits for
   * nothing), or a pending one; ranks call one collective at a time */
  uint64_t first = UINT64_MAX, last_called = 0;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &c->running) {
    struct xop *x = LIST_ENTRY(it, struct xop, comm_link);
    if (!x->run.plan.net_items) continue; /* among this daemon's ranks alone: it finishes */
    atomic_store(&x->run.cancelled, 1);
    if (p2p_kind(x->kind)) continue;
    if (x->seq < first) first = x->seq;
    for (int i = 0; i < x->nposts; i++)
      if (x->posts[i] && in_place(x->posts[i])) h->retry_seq = x->seq;
  }
  const struct list *pending[2] = {&c->slots, &c->queued};
  for (int k = 0; k < 2; k++)
    LIST_FOREACH_SAFE(it, tmp, (struct list *)pending[k]) {
      const struct slot *sl = LIST_ENTRY(it, struct slot, link);
      if (sl->seq < first) first = sl->seq;
    }
  for (int r = 0; r < c->nranks; r++)
    if (!c->members[r]->remote && c->members[r]->coll_seq > last_called) last_called = c->members[r]->coll_seq;
  h->finished = first != UINT64_MAX ? first - 1 : last_called;
  c->hold = h;
  uv_timer_stop(&c->timer);
  ccsd_agree_release(c);
  if (c->net) ccsd_peers_comm_close(c->co->peers, c->net); /* what is posted on it fails now */
  char ranks[256];
  ranks_of(c, node, ranks, sizeof(ranks));
  LOG_WARN("comm %llu held: the daemon at %s serving rank(s) %s went (%s); waiting up to %g s "
           "for it to come back (peer_restart_grace)", (unsigned long long)c->id, h->addr, ranks, why,
           c->co->cfg.peer_restart_grace_s);
  uv_timer_start(&c->timer, on_ask, 0, 0);
  return 0;
}

int ccsd_hold_keep(struct xop *x) {
  struct comm *c = x->comm;
  if (c->state != COMM_READY || p2p_kind(x->kind) || !x->run.plan.net_items) return 0;
  if (!c->hold && (x->run.net_status != CCS_ERR_PEER_LOST ||
                   ccsd_hold_start(c, x->run.net_node, x->run.net_error)))
    return 0;
  struct slot *sl = ccsd_slot_of(c, x->posts, x->nposts, x->seq);
  if (!sl) return 0;
  list_insert_tail(c->queued.next, &sl->link); /* the oldest: nothing after it launched */
  return 1;
}

void ccsd_hold_op_done(struct xop *x) {
  struct comm_hold *h = x->comm->hold;
  if (!h || p2p_kind(x->kind) || x->seq <= h->finished) return;
  h->finished = x->seq; /* its data had all moved before the daemon went */
  if (h->retry_seq == x->seq) h->retry_seq = 0;
}

void ccsd_hold_defer(struct comm *c, struct post *p) { list_insert_tail(&c->hold->p2p, &p->link); }

/* What this daemon tells the one that went: the map, and per rank here
 * its report as a client's rejoin would be. */
static void ask(struct comm *c) {
  struct comm_hold *h = c->hold;
  size_t nlocal = 0, nchan = 0;
  for (int r = 0; r < c->nranks; r++) nlocal += !c->members[r]->remote;
  nchan = nlocal + 2 * c->np2p;
  const char **addrs = calloc((size_t)c->nranks, sizeof(*addrs));
  Ccs__PeerRank *ranks = calloc(nlocal, sizeof(*ranks));
  Ccs__PeerRank **rank_ptrs = calloc(nlocal, sizeof(*rank_ptrs));
  Ccs__Rejoin *reports = calloc(nlocal, sizeof(*reports));
  Ccs__Channel *chans = calloc(nchan, sizeof(*chans));
  Ccs__Channel **chan_ptrs = calloc(nchan, sizeof(*chan_ptrs));
  protobuf_c_boolean *flags = calloc(nlocal, sizeof(*flags));
  if (addrs && ranks && rank_ptrs && reports && chans && chan_ptrs && flags) {
    size_t k = 0, at = 0;
    for (int r = 0; r < c->nranks; r++) {
      addrs[r] = c->node_addr[c->node_of_rank[r]];
      const struct member *m = c->members[r];
      if (m->remote) continue;
      ccs__peer_rank__init(&ranks[k]);
      ccs__rejoin__init(&reports[k]);
      ranks[k].rank = (uint32_t)r;
      ranks[k].report = &reports[k];
      rank_ptrs[k] = &ranks[k];
      reports[k].channels = &chan_ptrs[at];
      Ccs__Channel *coll = &chans[at];
      ccs__channel__init(coll);
      coll->peer = -1;
      coll->done = h->finished;
      if (m->coll_seq > h->finished) { /* its call out: the op kept here */
        flags[k] = h->retry_seq == h->finished + 1;
        coll->must_retry = &flags[k];
        coll->n_must_retry = 1;
      }
      chan_ptrs[at++] = coll;
      /* its sends to and receives from the ranks there, all finished (none
       * was under way, or the comm could not wait) */
      for (size_t i = 0; i < c->np2p; i++) {
        const struct p2p_count *pc = &c->p2p_counts[i];
        int send = pc->from == r, other = send ? pc->to : pc->from;
        if ((pc->from != r && pc->to != r) || c->node_of_rank[other] != h->node) continue;
        Ccs__Channel *ch = &chans[at];
        ccs__channel__init(ch);
        ch->peer = other;
        ch->send = send;
        ch->done = pc->n;
        chan_ptrs[at++] = ch;
      }
      reports[k].n_channels = (size_t)(&chan_ptrs[at] - reports[k].channels);
      k++;
    }
    struct peer_msg msg = {.kind = PEER_REJOIN,
                           .rejoin = {.name = c->name, .name_len = CCS__NAME_BYTES,
                                      .addrs = addrs, .naddrs = (size_t)c->nranks,
                                      .chunk_bytes = c->chunk_bytes, .lanes = (uint32_t)c->lanes,
                                      .ranks = (const Ccs__PeerRank *const *)rank_ptrs, .nranks = nlocal,
                                      .hold = h->number}};
    ccsd_peers_send(c->co->peers, h->addr, &msg);
  }
  free(addrs), free(ranks), free(rank_ptrs), free(reports), free(chans), free(chan_ptrs), free(flags);
}

static void on_ask(uv_timer_t *t) {
  struct comm *c = t->data;
  struct comm_hold *h = c->hold;
  if (!h || c->state != COMM_READY) return;
  uint64_t now = ccsd_fresh_ms_of(c->co);
  if (now >= h->until_ms) {
    char ranks[256];
    ranks_of(c, h->node, ranks, sizeof(ranks));
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "the daemon at %s serving rank(s) %s went (%s) and did not "
                   "come back within %g s (peer_restart_grace)", h->addr, ranks, h->why,
                   c->co->cfg.peer_restart_grace_s);
    return;
  }
  if (list_empty(&c->running)) { /* what this daemon says is final now */
    if (c->net) ccsd_peers_comm_free(c->co->peers, c->net); /* before the new one opens */
    c->net = NULL;
    ask(c);
  }
  uint64_t wait = h->ask_ms < h->until_ms - now ? h->ask_ms : h->until_ms - now;
  if (h->ask_ms < HOLD_ASK_MAX_MS) h->ask_ms *= 2;
  uv_timer_start(&c->timer, on_ask, wait, 0);
}

void ccsd_hold_resume(struct comm *c, const char *addr, const struct peer_resume *m) {
  struct comm_hold *h = c->hold;
  if (!h || strcmp(addr, h->addr) || m->hold != h->number || c->net || !list_empty(&c->running))
    return; /* late, or a repeat */
  if (m->finished != h->finished) {
    ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s came back with %llu collectives finished; "
                   "this daemon said %llu", addr, (unsigned long long)m->finished,
                   (unsigned long long)h->finished);
    return;
  }
  c->net = ccsd_peers_comm_open(c->co->peers, c->name, c->nnodes, c->mynode,
                                (const char(*)[CCSD_ADDR_MAX])c->node_addr, c->lanes);
  if (!c->net) {
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory reconnecting to the daemon at %s", addr);
    return;
  }
  /* from the first op some rank cannot run again on, every rank repeats
   * its calls itself (the ops take the same numbers again) */
  char text[CCS__ERROR_TEXT_MAX];
  snprintf(text, sizeof(text), "the daemon at %s restarted during this call, which a rank cannot "
           "run again (its inputs were written over in place): call it again", addr);
  uint64_t now = ccsd_fresh_ms_of(c->co), repeat = m->retry_from == UINT64_MAX ? UINT64_MAX : m->retry_from + 1;
  struct list *lists[2] = {&c->queued, &c->slots}, *it, *tmp;
  for (int k = 0; k < 2; k++)
    LIST_FOREACH_SAFE(it, tmp, lists[k]) {
      struct slot *sl = LIST_ENTRY(it, struct slot, link);
      sl->opened_ms = now; /* its deadline from here */
      if (sl->seq < repeat) continue;
      for (int i = 0; i < sl->nposted; i++)
        if (sl->posts[i]->member->coll_seq >= sl->seq) sl->posts[i]->member->coll_seq = sl->seq - 1;
      ccsd_slot_drop(sl, CCS_ERR_RETRY, text);
    }
  struct list p2p;
  list_init(&p2p);
  list_take_all(&p2p, &h->p2p);
  c->hold = NULL;
  LOG_WARN("comm %llu goes on: the daemon at %s is back (%llu collectives finished%s)",
           (unsigned long long)c->id, addr, (unsigned long long)h->finished,
           repeat != UINT64_MAX ? ", the next repeated by its callers" : "");
  free(h);
  while (!list_empty(&p2p) && c->state == COMM_READY) {
    struct post *p = LIST_ENTRY(p2p.next, struct post, link);
    list_remove(&p->link);
    ccsd_op_launch(c, &p, 1, 0);
  }
  while (!list_empty(&p2p)) { /* the comm failed launching one */
    struct post *p = LIST_ENTRY(p2p.next, struct post, link);
    list_remove(&p->link);
    ccsd_post_finish(p, c->error, c->error_text);
  }
  ccsd_comm_launch_queued(c);
  ccsd_comm_check_deadlines(c);
}

void ccsd_hold_end(struct comm *c) {
  struct comm_hold *h = c->hold;
  if (!h) return;
  c->hold = NULL;
  while (!list_empty(&h->p2p)) {
    struct post *p = LIST_ENTRY(h->p2p.next, struct post, link);
    list_remove(&p->link);
    ccsd_post_finish(p, c->error, c->error_text);
  }
  free(h);
}
