/* A comm across daemons held while one of its daemons restarts
 * (docs/restart.md), on the daemons that stayed. When the daemon at node
 * k goes (its connections close), the comm is not failed at once: it
 * waits peer_restart_grace for it. Its ops under way run on a moment (what
 * the daemon sent before it went still arrives), then are stopped and
 * kept unanswered; new ones wait. Once nothing runs here, this daemon tells
 * the one that went, again until it answers, who is where and where its
 * ranks' calls stood, as a client reports after a restart: collectives
 * finished here, whether the op stopped here had written over its inputs
 * (in place: it cannot run again), and its sends to and receives from
 * the ranks there (finished, kept, made meanwhile). The restarted daemon
 * settles every channel once its own ranks are back too (regather.c) and
 * answers with the verdict: the collective kept here runs again, or
 * returns CCS_ERR_RETRY to every rank; kept sends and receives are made
 * again under their numbers; the comm goes on over new data connections.
 * Messages the ranks there sent to ranks here before it went, which no
 * receive here had taken, are carried over to the new connections (the
 * old ones closed cleanly after them: every one whose send finished there
 * arrived whole) and the receives made after take them.
 * No answer within the grace, the comm fails naming the daemon. On the
 * loop thread. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "coll/coll.h"

#define HOLD_ASK_MS 50      /* the first word to the daemon that went, then twice as long */
#define HOLD_ASK_MAX_MS 500
/* Its ops under way run on this long: what the daemon that went sent before
 * it closed its connections still arrives (a stop finishes its ops first,
 * main.c), and an op it finished finishes here too. */
#define HOLD_RUN_ON_MS 1000
/* Another daemon of the comm gone while it is held: no one is left to
 * settle with, unless this one goes too (every daemon of a comm stopped
 * together, their signals a moment apart: made again through its root,
 * refound.c). It fails once this long passed without this daemon's stop. */
#define HOLD_ALSO_GONE_MS 2000

struct comm_hold {
  char addr[CCSD_ADDR_MAX];
  int node;
  uint64_t number; /* the answer names it: one to an earlier hold is not this one's */
  uint64_t until_ms, ask_ms, stop_ms; /* stop_ms: when the ops still under way are stopped */
  int stopped;
  uint64_t finished;  /* collectives finished here: final once nothing runs */
  uint64_t retry_seq; /* the op stopped here after writing over its inputs; 0: none */
  struct list p2p;    /* sends and receives across daemons posted meanwhile */
  int took;           /* arrived is final (its connections were looked at) */
  struct held_msg *arrived; /* from the ranks there, no receive here took them yet */
  char why[160];
  uint64_t also_ms;            /* another daemon gone too: when the comm fails (0: none) */
  char also[CCSD_ADDR_MAX];    /* that daemon */
};

/* A post whose op reads what it writes: it cannot run again once begun. */
static int in_place(const struct post *p) {
  return p->send.base && p->send.base == p->recv.base && p->send_off < p->recv_off + p->recv_len &&
         p->recv_off < p->send_off + p->send_len;
}

/* An op in a client's CUDA stream: the stream went on once the daemon
 * that went was gone (libccs's guard), so the op cannot be kept. A host
 * stream's ops are kept as others are; their callers, back from the call,
 * get CCS_ERR_RETRY at synchronize if any rank must repeat them. */
static int cuda_streamed(const struct post *p) { return p->order.flags != NULL; }

/* The daemon at the other end of a send or receive across daemons. */
static int p2p_node(const struct comm *c, const struct xop *x) {
  return x->part_node[0] == c->mynode ? x->part_node[1] : x->part_node[0];
}

/* Why c cannot wait for a daemon: an op it cannot stop and run again. */
static const char *unholdable(const struct comm *c) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &c->running) {
    const struct xop *x = LIST_ENTRY(it, struct xop, comm_link);
    /* (a send or receive with a daemon that stays is looked at once the
     * ops under way had their moment: on_ask) */
    for (int i = 0; i < x->nposts; i++)
      if (x->posts[i] && cuda_streamed(x->posts[i])) return "a CUDA stream's op was under way";
  }
  const struct list *pending[2] = {&c->slots, &c->queued};
  for (int k = 0; k < 2; k++)
    LIST_FOREACH_SAFE(it, tmp, (struct list *)pending[k]) {
      const struct slot *sl = LIST_ENTRY(it, struct slot, link);
      for (int i = 0; i < sl->nposted; i++)
        if (cuda_streamed(sl->posts[i])) return "a CUDA stream's op was pending";
    }
  return NULL;
}

static void on_ask(uv_timer_t *t);

int ccsd_hold_start(struct comm *c, int node, const char *why) {
  if (c->hold && c->hold->node != node && node >= 0 && node < c->nnodes && !c->hold->also_ms) {
    c->hold->also_ms = ccsd_fresh_ms_of(c->co) + HOLD_ALSO_GONE_MS;
    snprintf(c->hold->also, sizeof(c->hold->also), "%s", c->node_addr[node]);
  }
  if (c->hold) return 0;
  if (c->co->cfg.peer_restart_grace_s <= 0 || c->state != COMM_READY || !c->node_of_rank || node < 0 ||
      node >= c->nnodes || node == c->mynode)
    return -1;
  const char *cannot = unholdable(c);
  if (cannot) {
    LOG_WARN("comm %llu cannot wait for the daemon at %s to come back: %s", (unsigned long long)c->id,
             c->node_addr[node], cannot);
    c->unholdable = 1; /* (its failure is then one a restart caused: counted) */
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
    if (!x->run.plan.net_items || ccsd_p2p_kind(x->kind)) continue; /* (this daemon's ranks alone: it finishes) */
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
  h->stop_ms = now + HOLD_RUN_ON_MS;
  c->hold = h;
  c->co->restarts[RESTART_HELD]++;
  uv_timer_stop(&c->timer);
  ccsd_agree_release(c);
  char ranks[256];
  ccsd_comm_ranks_at(c, node, ranks, sizeof(ranks));
  LOG_WARN("comm %llu held: the daemon at %s serving rank(s) %s went (%s); waiting up to %g s "
           "for it to come back (peer_restart_grace)", (unsigned long long)c->id, h->addr, ranks, why,
           c->co->cfg.peer_restart_grace_s);
  uv_timer_start(&c->timer, on_ask, 0, 0);
  return 0;
}

int ccsd_hold_keep(struct xop *x) {
  struct comm *c = x->comm;
  if (c->state != COMM_READY || !x->run.plan.net_items) return 0;
  if (!c->hold && (x->run.net_status != CCS_ERR_PEER_LOST ||
                   ccsd_hold_start(c, x->run.net_node, x->run.net_error)))
    return 0;
  if (ccsd_p2p_kind(x->kind)) { /* its half of a message, numbered: again under the number due then */
    if (p2p_node(c, x) != c->hold->node) return 0; /* with a daemon that stays: no one settles it */
    struct post *p = x->posts[0]; /* (across daemons a send or a receive is an op alone) */
    p->seq = (uint64_t)x->run.plan.items[0].msg + 1;
    list_insert_tail(&c->hold->p2p, &p->link);
    return 1;
  }
  struct slot *sl = ccsd_slot_of(c, x->posts, x->nposts, x->seq);
  if (!sl) return 0;
  list_insert_tail(c->queued.next, &sl->link); /* the oldest: nothing after it launched */
  return 1;
}

void ccsd_hold_op_done(struct xop *x) {
  struct comm_hold *h = x->comm->hold;
  if (!h || ccsd_p2p_kind(x->kind) || x->seq <= h->finished) return;
  h->finished = x->seq; /* its data had all moved before the daemon went */
  if (h->retry_seq == x->seq) h->retry_seq = 0;
}

void ccsd_hold_defer(struct comm *c, struct post *p) {
  p->seq = 0; /* not numbered yet */
  list_insert_tail(&c->hold->p2p, &p->link);
}

/* The messages between a rank here and one of the daemon that went: how
 * many were numbered, and of those how many are kept here unfinished;
 * and the calls made meanwhile, not numbered yet. */
struct pair {
  int from, to;
  uint32_t count, kept, deferred;
  uint32_t arrived; /* messages from there held here, numbered count on */
};

/* The messages from rank `from` there to rank `to` here that arrived
 * whole, numbered n on, in order (a message's first chunk tells: the rest
 * came before the connections closed). A send or receive's data tag: no
 * op number, no arguments (net.h). */
static uint32_t arrived_from(const struct comm_hold *h, int from, int to, uint32_t n) {
  uint32_t k = 0;
  while (ccsd_held_find(h->arrived, ccsd_peer_tag(0, 0, from, to, n + k, 0))) k++;
  return k;
}

static void post_pair(const struct post *p, int *from, int *to) {
  *from = p->kind == CCS__SEND ? p->member->rank : p->root;
  *to = p->kind == CCS__SEND ? p->root : p->member->rank;
}

static struct pair *find_pair(struct pair *pairs, size_t n, int from, int to) {
  for (size_t i = 0; i < n; i++)
    if (pairs[i].from == from && pairs[i].to == to) return &pairs[i];
  return NULL;
}

static struct pair *pairs_of(const struct comm *c, size_t *ret_n) {
  const struct comm_hold *h = c->hold;
  size_t cap = c->np2p + 1, n = 0, there = 0;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, (struct list *)&h->p2p) cap++;
  for (int r = 0; h->arrived && r < c->nranks; r++) there += c->node_of_rank[r] == h->node;
  if (there) cap += there * (size_t)c->nranks;
  struct pair *pairs = calloc(cap, sizeof(*pairs));
  if (!pairs) return NULL;
  for (size_t i = 0; i < c->np2p; i++) {
    const struct p2p_count *pc = &c->p2p_counts[i];
    if (c->node_of_rank[pc->from] == h->node || c->node_of_rank[pc->to] == h->node)
      pairs[n++] = (struct pair){pc->from, pc->to, pc->n, 0, 0, 0};
  }
  LIST_FOREACH_SAFE(it, tmp, (struct list *)&h->p2p) {
    const struct post *p = LIST_ENTRY(it, struct post, link);
    int from, to;
    post_pair(p, &from, &to);
    if (c->node_of_rank[from] != h->node && c->node_of_rank[to] != h->node) continue; /* between daemons that stay */
    struct pair *pr = find_pair(pairs, n, from, to);
    if (!pr) pr = &pairs[n++], *pr = (struct pair){from, to, 0, 0, 0, 0};
    if (p->seq) pr->kept++;
    else pr->deferred++;
  }
  for (int from = 0; there && from < c->nranks; from++)
    for (int to = 0; c->node_of_rank[from] == h->node && to < c->nranks; to++) {
      if (c->members[to]->remote) continue;
      struct pair *pr = find_pair(pairs, n, from, to);
      uint32_t k = pr && pr->kept ? 0 : arrived_from(h, from, to, pr ? pr->count : 0);
      if (k && !pr) pr = &pairs[n++], *pr = (struct pair){from, to, 0, 0, 0, 0};
      if (k) pr->arrived = k;
    }
  *ret_n = n;
  return pairs;
}

/* The next message number between from and to is n. -1: out of memory. */
static int set_count(struct comm *c, int from, int to, uint32_t n) {
  for (size_t i = 0; i < c->np2p; i++)
    if (c->p2p_counts[i].from == from && c->p2p_counts[i].to == to) {
      c->p2p_counts[i].n = n;
      return 0;
    }
  struct p2p_count *grown = realloc(c->p2p_counts, (c->np2p + 1) * sizeof(*grown));
  if (!grown) return -1;
  c->p2p_counts = grown;
  c->p2p_counts[c->np2p++] = (struct p2p_count){from, to, n};
  return 0;
}

/* What this daemon tells the one that went: the map, and per rank here
 * its report as a client's rejoin would be. */
static void ask(struct comm *c) {
  struct comm_hold *h = c->hold;
  size_t nlocal = 0, nchan = 0, npairs = 0, most = 1;
  for (int r = 0; r < c->nranks; r++) nlocal += !c->members[r]->remote;
  struct pair *pairs = pairs_of(c, &npairs);
  for (size_t i = 0; pairs && i < npairs; i++)
    if (pairs[i].kept + pairs[i].deferred > most) most = pairs[i].kept + pairs[i].deferred;
  nchan = nlocal + npairs;
  protobuf_c_boolean *none = calloc(most, sizeof(*none)); /* a message can always be sent again */
  const char **addrs = calloc((size_t)c->nranks, sizeof(*addrs));
  Ccs__PeerRank *ranks = calloc(nlocal, sizeof(*ranks));
  Ccs__PeerRank **rank_ptrs = calloc(nlocal, sizeof(*rank_ptrs));
  Ccs__Rejoin *reports = calloc(nlocal, sizeof(*reports));
  Ccs__Channel *chans = calloc(nchan, sizeof(*chans));
  Ccs__Channel **chan_ptrs = calloc(nchan, sizeof(*chan_ptrs));
  protobuf_c_boolean *flags = calloc(nlocal, sizeof(*flags));
  Ccs__PeerCount *kept = calloc(npairs + 1, sizeof(*kept)); /* the last sends finished, kept (replay.c) */
  Ccs__PeerCount **kept_ptrs = calloc(npairs + 1, sizeof(*kept_ptrs));
  Ccs__PeerCount *arrived = calloc(npairs + 1, sizeof(*arrived)); /* messages from there held here */
  Ccs__PeerCount **arrived_ptrs = calloc(npairs + 1, sizeof(*arrived_ptrs));
  size_t nkept = 0, narrived = 0;
  for (size_t i = 0; pairs && arrived && arrived_ptrs && i < npairs; i++) {
    if (!pairs[i].arrived) continue;
    ccs__peer_count__init(&arrived[narrived]);
    arrived[narrived].from = pairs[i].from;
    arrived[narrived].to = pairs[i].to;
    arrived[narrived].finished = (uint64_t)pairs[i].count + pairs[i].arrived;
    arrived_ptrs[narrived] = &arrived[narrived];
    narrived++;
  }
  for (size_t i = 0; pairs && kept && kept_ptrs && i < npairs; i++) {
    uint32_t sent = c->node_of_rank[pairs[i].from] == c->mynode ? ccsd_replay_sent(c, pairs[i].from, pairs[i].to) : 0;
    if (!sent) continue;
    ccs__peer_count__init(&kept[nkept]);
    kept[nkept].from = pairs[i].from;
    kept[nkept].to = pairs[i].to;
    kept[nkept].finished = sent;
    kept_ptrs[nkept] = &kept[nkept];
    nkept++;
  }
  if (pairs && none && addrs && ranks && rank_ptrs && reports && chans && chan_ptrs && flags && kept && kept_ptrs &&
      arrived && arrived_ptrs) {
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
      /* its sends to and receives from the ranks there: finished, kept
       * here, made meanwhile */
      for (size_t i = 0; i < npairs; i++) {
        const struct pair *pr = &pairs[i];
        int send = pr->from == r, other = send ? pr->to : pr->from;
        if (pr->from != r && pr->to != r) continue;
        Ccs__Channel *ch = &chans[at];
        ccs__channel__init(ch);
        ch->peer = other;
        ch->send = send;
        ch->done = pr->count - pr->kept;
        ch->must_retry = none;
        ch->n_must_retry = pr->kept + pr->deferred;
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
                                      .hold = h->number,
                                      .kept = h->finished && ccsd_replay_kept(c) == h->finished ? h->finished : 0,
                                      .kept_sends = (const Ccs__PeerCount *const *)kept_ptrs,
                                      .nkept_sends = nkept,
                                      .arrived = (const Ccs__PeerCount *const *)arrived_ptrs,
                                      .narrived = narrived}};
    ccsd_peers_send(c->co->peers, h->addr, &msg);
  }
  free(addrs), free(ranks), free(rank_ptrs), free(reports), free(chans), free(chan_ptrs), free(flags);
  free(pairs), free(none), free(kept), free(kept_ptrs), free(arrived), free(arrived_ptrs);
}

/* The messages of the pair numbered first on whose sends finished there
 * and which arrived here: those carried over to the new connections. */
static void carry(struct comm_hold *h, struct held_msg **carried, const struct pair *pr, uint32_t first,
                  uint64_t end) {
  for (uint64_t msg = first; msg < end; msg++)
    for (size_t chunk = 0;; chunk++) {
      struct held_msg *m = ccsd_held_find(h->arrived, ccsd_peer_tag(0, 0, pr->from, pr->to, (uint32_t)msg, chunk));
      if (!m) break;
      ccsd_held_move(&h->arrived, carried, m);
    }
}

/* The messages held from the daemon at node (only_fresh: those just taken
 * from its connections): dropped. */
static void drop_arrived(struct comm_hold *h, int node, int only_fresh) {
  struct held_msg *m, *tmp;
  HASH_ITER(hh, h->arrived, m, tmp)
    if (m->node == node && (!only_fresh || m->fresh)) ccsd_held_drop(&h->arrived, m);
}

/* The restarted daemon's count of the messages between its ranks and
 * these; NULL, or why it cannot be. The messages from there that arrived
 * here and whose sends finished there go to *carried. */
static const char *take_counts(struct comm *c, const struct peer_resume *m, struct pair **resend,
                               size_t *nresend, struct held_msg **carried) {
  struct comm_hold *h = c->hold;
  size_t npairs = 0;
  struct pair *pairs = pairs_of(c, &npairs);
  *resend = calloc(m->ncounts + 1, sizeof(**resend));
  *nresend = 0;
  if (!pairs || !*resend) {
    free(pairs);
    return "out of memory";
  }
  const char *bad = NULL;
  for (size_t i = 0; i < npairs && !bad; i++) /* as far as finished here; the word below says further */
    if (set_count(c, pairs[i].from, pairs[i].to, pairs[i].count - pairs[i].kept)) bad = "out of memory";
  for (size_t i = 0; i < m->ncounts && !bad; i++) {
    const Ccs__PeerCount *pc = m->counts[i];
    int from = pc->from, to = pc->to;
    if (from < 0 || to < 0 || from >= c->nranks || to >= c->nranks ||
        !((c->node_of_rank[from] == c->mynode && c->node_of_rank[to] == h->node) ||
          (c->node_of_rank[to] == c->mynode && c->node_of_rank[from] == h->node))) {
      bad = "a count of messages between ranks not of both daemons";
      break;
    }
    const struct pair *pr = find_pair(pairs, npairs, from, to);
    uint32_t done = pr ? pr->count - pr->kept : 0, numbered = pr ? pr->count : 0;
    /* the last send finished here and lost there: sent again (replay.c) */
    int again = pc->finished + 1 == done && c->node_of_rank[from] == c->mynode &&
                ccsd_replay_sent(c, from, to) == done;
    /* sends finished there whose messages arrived here whole: the
     * receives here are numbered on from done and take them */
    int ahead = pr && pc->finished > done && pc->finished <= (uint64_t)done + pr->arrived;
    if (again) (*resend)[(*nresend)++] = (struct pair){.from = from, .to = to};
    if (ahead) carry(h, carried, pr, done, pc->finished);
    if ((pc->finished < done && !again) || (pc->finished > numbered && !ahead))
      bad = "a count of messages this daemon cannot have";
    else if (set_count(c, from, to, again || ahead ? done : (uint32_t)pc->finished)) bad = "out of memory";
  }
  free(pairs);
  return bad;
}

/* The daemons the restarted one says run collective #finished again,
 * which finished here: per node, marked in *ret; NULL, or why not. */
static const char *rerun_nodes(const struct comm *c, const struct peer_resume *m, uint8_t **ret) {
  if (ccsd_replay_kept(c) != c->hold->finished || !c->hold->finished)
    return "a collective to send again that this daemon did not keep";
  uint8_t *rerun = calloc((size_t)c->nnodes, 1);
  if (!rerun) return "out of memory";
  for (size_t i = 0; i < m->nrerun; i++) {
    int node = ccsd_span_node_of(c, m->rerun[i]);
    if (node < 0 || node == c->mynode) {
      free(rerun);
      return "a daemon to send a collective again to that is not another of the communicator";
    }
    rerun[node] = 1;
  }
  *ret = rerun;
  return NULL;
}

/* The sends and receives kept here, by their numbers (those the other end
 * finished are), then those made meanwhile, in order. */
static void relaunch_p2p(struct comm *c, struct list *p2p) {
  for (;;) {
    struct post *first = NULL;
    struct list *it, *tmp;
    LIST_FOREACH_SAFE(it, tmp, p2p) {
      struct post *p = LIST_ENTRY(it, struct post, link);
      if (p->seq && (!first || p->seq < first->seq)) first = p;
    }
    if (!first) break;
    list_remove(&first->link);
    uint64_t number = first->seq - 1;
    first->seq = 0;
    int from, to;
    post_pair(first, &from, &to);
    uint32_t next = 0;
    for (size_t i = 0; i < c->np2p; i++)
      if (c->p2p_counts[i].from == from && c->p2p_counts[i].to == to) next = c->p2p_counts[i].n;
    if (number < next) ccsd_post_finish(first, CCS_OK, NULL); /* its receiver has it */
    else if (c->state == COMM_READY) ccsd_op_launch(c, &first, 1, 0);
    else ccsd_post_finish(first, c->error, c->error_text);
  }
  while (!list_empty(p2p)) {
    struct post *p = LIST_ENTRY(p2p->next, struct post, link);
    list_remove(&p->link);
    if (c->state == COMM_READY) ccsd_op_launch(c, &p, 1, 0);
    else ccsd_post_finish(p, c->error, c->error_text);
  }
}

/* What the connections from the daemon that went hold, taken before they
 * close here (closing drops it): 0 while one of them has not seen that
 * daemon close it (until the ops under way are stopped). Unless every one
 * closed cleanly, none is kept: a message may have lost its end. */
static int take_arrived(struct comm *c) {
  struct comm_hold *h = c->hold;
  if (h->took || !c->net) return 1;
  int rc = ccsd_peers_comm_take_held(c->co->peers, c->net, h->node, &h->arrived);
  if (!rc && ccsd_fresh_ms_of(c->co) < h->stop_ms) return 0;
  if (rc != 1) drop_arrived(h, h->node, 1); /* (those carried over before stay: they are whole) */
  h->took = 1;
  return 1;
}

static void on_ask(uv_timer_t *t) {
  struct comm *c = t->data;
  struct comm_hold *h = c->hold;
  if (!h || c->state != COMM_READY) return;
  uint64_t now = ccsd_fresh_ms_of(c->co);
  if (h->also_ms && now >= h->also_ms) {
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "the daemons at %s and at %s both went (%s), and this one "
                   "stayed: one of a communicator's daemons at a time, or all of them, can restart",
                   h->addr, h->also, h->why);
    return;
  }
  if (now >= h->until_ms) {
    char ranks[256];
    ccsd_comm_ranks_at(c, h->node, ranks, sizeof(ranks));
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "the daemon at %s serving rank(s) %s went (%s) and did not "
                   "come back within %g s (peer_restart_grace)", h->addr, ranks, h->why,
                   c->co->cfg.peer_restart_grace_s);
    return;
  }
  if ((!list_empty(&c->running) || c->replaying) && now >= h->stop_ms && !h->stopped) { /* what still waits, waits in vain */
    h->stopped = 1;
    struct list *it, *tmp;
    LIST_FOREACH_SAFE(it, tmp, &c->running) {
      struct xop *x = LIST_ENTRY(it, struct xop, comm_link);
      if (x->run.plan.net_items && ccsd_p2p_kind(x->kind) && p2p_node(c, x) != h->node) {
        /* its other end stays, and may have finished its half: no one
         * settles it with this daemon */
        ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "the daemon at %s went while a %s between rank %d and rank "
                       "%d (daemon %s, which stayed) was under way: the communicator cannot wait for it",
                       h->addr, x->kind == CCS__SEND ? "send" : "receive", x->posts[0]->member->rank,
                       x->posts[0]->root, c->node_addr[p2p_node(c, x)]);
        return;
      }
    }
    LIST_FOREACH_SAFE(it, tmp, &c->running) {
      struct xop *x = LIST_ENTRY(it, struct xop, comm_link);
      if (x->run.plan.net_items) atomic_store(&x->run.cancelled, 1);
    }
    take_arrived(c);
    if (c->net) ccsd_peers_comm_close(c->co->peers, c->net); /* what is posted on it fails now */
  }
  if (list_empty(&c->running) && !c->replaying && take_arrived(c)) { /* what this daemon says is final now */
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
  if (m->retry_from != UINT64_MAX && m->retry_from < m->finished) {
    ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s came back repeating finished collectives", addr);
    return;
  }
  if (m->finished != h->finished) {
    ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s came back with %llu collectives finished; "
                   "this daemon said %llu", addr, (unsigned long long)m->finished,
                   (unsigned long long)h->finished);
    return;
  }
  uint8_t *rerun = NULL;
  struct pair *resend = NULL;
  size_t nresend = 0;
  struct held_msg *carried = NULL;
  const char *bad = take_counts(c, m, &resend, &nresend, &carried);
  if (!bad && m->nrerun) bad = rerun_nodes(c, m, &rerun);
  if (bad) {
    free(resend);
    ccsd_held_free(&carried);
    ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s came back with %s", addr, bad);
    return;
  }
  size_t ncarried = HASH_COUNT(carried);
  drop_arrived(h, h->node, 0); /* of sends that did not finish there: they come again */
  struct held_msg *other, *next;
  HASH_ITER(hh, h->arrived, other, next) ccsd_held_move(&h->arrived, &carried, other); /* from other daemons: on */
  c->net = ccsd_peers_comm_open(c->co->peers, c->name, c->nnodes, c->mynode,
                                (const char(*)[CCSD_ADDR_MAX])c->node_addr, c->lanes, carried);
  int failed = !c->net || (rerun && ccsd_replay_start(c, rerun));
  for (size_t i = 0; i < nresend && !failed; i++) failed = ccsd_replay_send_again(c, resend[i].from, resend[i].to);
  free(rerun);
  free(resend);
  if (failed) {
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
      for (int i = 0; i < sl->nposted; i++) {
        struct post *p = sl->posts[i];
        if (p->member->coll_seq >= sl->seq) p->member->coll_seq = sl->seq - 1;
        ccsd_member_repeat_from(p->member, p->number);
      }
      ccsd_slot_drop(sl, CCS_ERR_RETRY, text);
    }
  LIST_FOREACH_SAFE(it, tmp, &c->p2p) LIST_ENTRY(it, struct post, link)->posted_ms = now;
  struct list p2p;
  list_init(&p2p);
  list_take_all(&p2p, &h->p2p);
  c->hold = NULL;
  char carried_text[96] = "";
  if (ncarried)
    snprintf(carried_text, sizeof(carried_text), "; %zu chunk(s) of messages sent from there before it "
             "went carried over", ncarried);
  c->co->restarts[RESTART_RESUMED]++;
  LOG_WARN("comm %llu goes on: the daemon at %s is back (%llu collectives finished%s%s)",
           (unsigned long long)c->id, addr, (unsigned long long)h->finished,
           repeat != UINT64_MAX ? ", the next repeated by its callers" : "", carried_text);
  free(h);
  relaunch_p2p(c, &p2p);
  ccsd_comm_launch_queued(c);
  ccsd_comm_check_deadlines(c);
}

void ccsd_member_repeat_from(struct member *m, uint32_t number) {
  if (number && (!m->repeat_number || (int32_t)(number - m->repeat_number) < 0)) m->repeat_number = number;
}

int ccsd_hold_waiting(const struct comm *c) { return c->hold && !list_empty(&c->hold->p2p); }

void ccsd_hold_end(struct comm *c) {
  struct comm_hold *h = c->hold;
  if (!h) return;
  c->hold = NULL;
  while (!list_empty(&h->p2p)) {
    struct post *p = LIST_ENTRY(h->p2p.next, struct post, link);
    list_remove(&p->link);
    ccsd_post_finish(p, c->error, c->error_text);
  }
  ccsd_held_free(&h->arrived);
  free(h);
}
