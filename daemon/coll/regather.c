/* This daemon restarted: a comm whose ranks span daemons is made again
 * (docs/restart.md). Its ranks here rejoin as after any restart, each with
 * its report; the daemons that stayed hold the comm (hold.c) and send,
 * until answered, who is where and their own ranks' reports. Once every
 * daemon that holds it spoke and every rank placed here is back, the
 * channels are settled as on one node, with one rule more: a daemon
 * answers its ranks once an op is done on its own node, so an op finished
 * at one daemon and not at another cannot be made whole, and the comm
 * fails (rejoin.c). Otherwise each daemon that held it hears the verdict
 * on the collectives and goes on. On the loop thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "base/log.h"
#include "coll/coll.h"

struct regather {
  char (*addrs)[CCSD_ADDR_MAX]; /* rank r's daemon, as the first daemon that held it said */
  uint64_t chunk_bytes;
  int lanes;
  int nnodes;
  char (*nodes)[CCSD_ADDR_MAX]; /* the daemons, this one among them */
  uint8_t *heard;               /* per node: it sent its ranks' reports */
  uint64_t *hold;               /* per node: the number of its hold, for the answer */
  uint64_t *kept;               /* per node: the collective whose messages it keeps (replay.c) */
};

void ccsd_regather_free(struct comm *c) {
  struct regather *g = c->regather;
  if (!g) return;
  free(g->addrs);
  free(g->nodes);
  free(g->heard);
  free(g->hold);
  free(g->kept);
  free(g);
  c->regather = NULL;
}

static int node_of(const struct regather *g, const char *addr) {
  for (int k = 0; k < g->nnodes; k++)
    if (!strcmp(g->nodes[k], addr)) return k;
  return -1;
}

int ccsd_regather_was_let_go(const struct comm *c, const char *addr) {
  for (int k = 0; k < c->nlet_go; k++)
    if (!strcmp(c->let_go[k], addr)) return 1;
  return 0;
}

int ccsd_regather_involved(const struct comm *c, const char *addr) {
  if (c->regather) return node_of(c->regather, addr) >= 0 && strcmp(addr, c->co->self);
  return ccsd_regather_was_let_go(c, addr);
}

/* Its word let go, the daemons that held it are remembered: one that still
 * holds it fails it when its own hold ends, and that failure must count
 * here rather than be refused as from a stranger (the comm would wait out
 * its rejoin instead). */
void ccsd_regather_let_go(struct comm *c) {
  struct regather *g = c->regather;
  if (!g) return;
  char(*held)[CCSD_ADDR_MAX] = realloc(c->let_go, (size_t)(c->nlet_go + g->nnodes) * sizeof(*held));
  if (held) {
    c->let_go = held;
    for (int k = 0; k < g->nnodes; k++)
      if (strcmp(g->nodes[k], c->co->self) && !ccsd_regather_was_let_go(c, g->nodes[k]))
        memcpy(c->let_go[c->nlet_go++], g->nodes[k], CCSD_ADDR_MAX);
  }
  ccsd_regather_free(c);
}

/* The verdict to the daemon at addr: on the collectives, and on the
 * messages between its ranks and this daemon's. */
static void resume(struct comm *c, const char *addr, uint64_t hold) {
  int node = ccsd_span_node_of(c, addr);
  size_t n = 0, cap = 0;
  for (int r = 0; r < c->nranks; r++)
    if (!c->members[r]->remote && c->members[r]->rejoin) cap += c->members[r]->rejoin->n;
  Ccs__PeerCount *counts = calloc(cap ? cap : 1, sizeof(*counts));
  Ccs__PeerCount **ptrs = calloc(cap ? cap : 1, sizeof(*ptrs));
  for (int r = 0; counts && ptrs && r < c->nranks; r++) {
    const struct member *m = c->members[r];
    for (size_t i = 0; !m->remote && m->rejoin && i < m->rejoin->n; i++) {
      const struct coll_channel *ch = &m->rejoin->ch[i];
      if (ch->peer < 0 || c->node_of_rank[ch->peer] != node) continue;
      ccs__peer_count__init(&counts[n]);
      counts[n].from = ch->send ? r : ch->peer;
      counts[n].to = ch->send ? ch->peer : r;
      counts[n].finished = ch->finished;
      ptrs[n] = &counts[n];
      n++;
    }
  }
  /* a daemon that finished the last collective where others did not
   * sends them its messages again (replay.c) */
  const char **rerun = calloc((size_t)c->nnodes, sizeof(*rerun));
  size_t nrerun = 0;
  uint64_t finished = c->node_finished ? c->node_finished[node] : c->coll_finished;
  for (int k = 0; rerun && c->node_finished && k < c->nnodes; k++)
    if (c->node_finished[k] < finished) rerun[nrerun++] = c->node_addr[k];
  struct peer_msg m = {.kind = PEER_RESUME,
                       .resume = {.name = c->name, .name_len = CCS__NAME_BYTES,
                                  .finished = finished, .retry_from = c->coll_retry, .hold = hold,
                                  .counts = (const Ccs__PeerCount *const *)ptrs, .ncounts = n,
                                  .rerun = rerun, .nrerun = nrerun}};
  if (counts && ptrs && rerun) ccsd_peers_send(c->co->peers, addr, &m);
  else ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory answering the daemon at %s", addr);
  free(counts);
  free(ptrs);
  free(rerun);
}

/* Why the map m cannot be this comm's; NULL when it can. */
static const char *bad_map(const struct comm *c, const char *addr, const struct peer_rejoin *m) {
  int self = 0, sender = 0;
  if (m->naddrs != (size_t)c->nranks) return "it does not place every rank";
  if (m->chunk_bytes < CCSD_PEER_CHUNK_MIN || m->chunk_bytes > CCSD_PEER_CHUNK_MAX)
    return "its chunk size is outside 4 KiB..64 MiB";
  if (m->lanes < 1 || m->lanes > 64) return "its connections per pair are outside 1..64";
  for (int r = 0; r < c->nranks; r++) {
    const char *a = m->addrs[r];
    if (!a || strlen(a) >= CCSD_ADDR_MAX || !ccs_addr_is_numeric(a)) return "it names a daemon by no numeric address";
    self |= !strcmp(a, c->co->self);
    sender |= !strcmp(a, addr);
  }
  if (!self) return "it places no rank here";
  if (!sender) return "it places no rank at its sender";
  const struct regather *g = c->regather;
  if (!g) return NULL;
  if (g->chunk_bytes != m->chunk_bytes || g->lanes != (int)m->lanes) return "another daemon said other chunks";
  for (int r = 0; r < c->nranks; r++)
    if (strcmp(g->addrs[r], m->addrs[r])) return "another daemon placed the ranks otherwise";
  return NULL;
}

/* The first word of a daemon that held c: the map, and a member for each
 * rank of another daemon. -1 when c failed. */
static int take_map(struct comm *c, const char *addr, const struct peer_rejoin *m) {
  struct regather *g = calloc(1, sizeof(*g));
  if (g) {
    g->addrs = calloc((size_t)c->nranks, sizeof(*g->addrs));
    g->nodes = calloc((size_t)c->nranks, sizeof(*g->nodes));
    g->heard = calloc((size_t)c->nranks, 1);
    g->hold = calloc((size_t)c->nranks, sizeof(*g->hold));
    g->kept = calloc((size_t)c->nranks, sizeof(*g->kept));
  }
  if (!g || !g->addrs || !g->nodes || !g->heard || !g->hold || !g->kept) {
    if (g) free(g->addrs), free(g->nodes), free(g->heard), free(g->hold), free(g->kept);
    free(g);
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory rejoining the communicator");
    return -1;
  }
  c->regather = g;
  g->chunk_bytes = m->chunk_bytes;
  g->lanes = (int)m->lanes;
  for (int r = 0; r < c->nranks; r++) {
    snprintf(g->addrs[r], CCSD_ADDR_MAX, "%s", m->addrs[r]);
    if (node_of(g, g->addrs[r]) < 0) memcpy(g->nodes[g->nnodes++], g->addrs[r], CCSD_ADDR_MAX);
  }
  for (int r = 0; r < c->nranks; r++) {
    if (!strcmp(g->addrs[r], c->co->self)) continue;
    if (c->members[r]) {
      ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s places rank %d at %s, but it rejoined here",
                     addr, r, g->addrs[r]);
      return -1;
    }
    if (!ccsd_span_remote_member(c, r, 0, g->addrs[r])) return -1;
    c->joined++;
  }
  return 0;
}

void ccsd_regather_message(struct coll *co, const char *addr, const struct peer_rejoin *m) {
  if (m->name_len != CCS__NAME_BYTES || co->silent || !strcmp(addr, co->self)) return;
  struct comm *c = ccsd_comm_find(co, m->name);
  if (!c) {
    ccs_result_t error;
    const char *closed = ccsd_comm_closed_here(co, m->name, &error);
    if (closed) /* it took this daemon's closed connections for a restart */
      ccsd_span_tell_failed(co, addr, m->name, error, closed);
    return; /* (or its ranks are not back here yet: the daemon asks again) */
  }
  if (c->state == COMM_FAILED) {
    ccsd_span_tell_failed(co, addr, c->name, c->error, c->error_text);
    return;
  }
  if (c->state == COMM_READY) {
    int node = ccsd_span_node_of(c, addr);
    if (node < 0 || node == c->mynode) return;
    if (c->resumed && c->resumed[node] == m->hold && !c->hold) resume(c, addr, m->hold); /* asked again before the answer arrived */
    else ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "the daemon at %s lost its connections to this one, which "
                        "did not restart (a network fault between them)", addr);
    return;
  }
  if (!c->rejoining) return;
  if (c->refound) { /* made again through the root, as if every daemon of it restarted */
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "the daemon at %s held the communicator while others of its "
                   "daemons restarted: only one of them at a time, or all of them, can", addr);
    ccsd_span_tell_failed(co, addr, c->name, c->error, c->error_text);
    return;
  }
  const char *bad = bad_map(c, addr, m);
  if (bad) {
    LOG_WARN("daemon at %s: a rejoin refused: %s", addr, bad);
    ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s sent a bad rejoin: %s", addr, bad);
    return;
  }
  if (!c->regather && take_map(c, addr, m)) return;
  struct regather *g = c->regather;
  for (size_t i = 0; i < m->nranks; i++) {
    const Ccs__PeerRank *pr = m->ranks[i];
    char err[CCS__ERROR_TEXT_MAX] = "";
    struct coll_rejoin *report = NULL;
    if (pr->rank >= (uint32_t)c->nranks || strcmp(g->addrs[pr->rank], addr))
      snprintf(err, sizeof(err), "a report of rank %u, which it does not serve", pr->rank);
    else if (!pr->report)
      snprintf(err, sizeof(err), "rank %u without a report", pr->rank);
    else
      report = ccsd_rejoin_parse(pr->report, c->nranks, err, sizeof(err));
    if (!report) {
      ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s sent a bad rejoin: %s", addr, err);
      return;
    }
    struct member *mb = c->members[pr->rank]; /* (placed at the sender: one of its, made by take_map) */
    ccsd_rejoin_free(mb->rejoin); /* (a repeat: the latest) */
    mb->rejoin = report;
  }
  for (size_t i = 0; i < m->nkept_sends; i++) { /* the last sends it finished and keeps (replay.c) */
    const Ccs__PeerCount *k = m->kept_sends[i];
    struct coll_channel *ch = NULL;
    if (k->from >= 0 && k->from < c->nranks && k->to >= 0 && k->to < c->nranks &&
        !strcmp(g->addrs[k->from], addr) && !strcmp(g->addrs[k->to], c->co->self) && c->members[k->from]->rejoin)
      for (size_t j = 0; j < c->members[k->from]->rejoin->n; j++)
        if (c->members[k->from]->rejoin->ch[j].peer == k->to && c->members[k->from]->rejoin->ch[j].send)
          ch = &c->members[k->from]->rejoin->ch[j];
    if (!ch) {
      ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s sent a bad rejoin: a kept send of ranks %d to %d, "
                     "which it does not report", addr, k->from, k->to);
      return;
    }
    ch->kept = k->finished;
  }
  for (size_t i = 0; i < m->narrived; i++) { /* messages from ranks here that arrived there whole */
    const Ccs__PeerCount *k = m->arrived[i];
    struct coll_channel *ch = NULL;
    if (k->from >= 0 && k->from < c->nranks && k->to >= 0 && k->to < c->nranks &&
        !strcmp(g->addrs[k->to], addr) && !strcmp(g->addrs[k->from], c->co->self) && c->members[k->to]->rejoin)
      for (size_t j = 0; j < c->members[k->to]->rejoin->n; j++)
        if (c->members[k->to]->rejoin->ch[j].peer == k->from && !c->members[k->to]->rejoin->ch[j].send)
          ch = &c->members[k->to]->rejoin->ch[j];
    if (!ch || k->finished <= ch->done || k->finished - ch->done > UINT32_MAX) {
      ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s sent a bad rejoin: messages of ranks %d to %d "
                     "that arrived there, %s", addr, k->from, k->to,
                     ch ? "no more than it received" : "which it does not report");
      return;
    }
    ch->arrived = k->finished;
  }
  int k = node_of(g, addr);
  if (!g->heard[k]) co->restarts[RESTART_HOLDER_HEARD]++;
  g->heard[k] = 1;
  g->hold[k] = m->hold;
  g->kept[k] = m->kept;
  ccsd_regather_check(c);
}

void ccsd_regather_check(struct comm *c) {
  struct regather *g = c->regather;
  if (!g || c->state != COMM_JOINING) return;
  for (int k = 0; k < g->nnodes; k++)
    if (!g->heard[k] && strcmp(g->nodes[k], c->co->self)) return;
  for (int r = 0; r < c->nranks; r++) {
    if (!c->members[r]) return; /* a rank of this daemon not back yet */
    if (c->members[r]->remote && !c->members[r]->rejoin) {
      ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s did not report rank %d", c->members[r]->addr, r);
      return;
    }
  }
  c->chunk_bytes = g->chunk_bytes;
  c->lanes = g->lanes;
  char(*addrs)[CCSD_ADDR_MAX] = g->addrs;
  uint64_t *holds = g->hold;
  char(*nodes)[CCSD_ADDR_MAX] = g->nodes;
  uint64_t *g_kept = g->kept;
  int nnodes = g->nnodes;
  g->addrs = NULL, g->hold = NULL, g->nodes = NULL, g->kept = NULL;
  ccsd_regather_free(c);
  int made = ccsd_span_map(c, addrs);
  free(addrs);
  free(c->node_kept);
  if (!made && (c->node_kept = calloc((size_t)c->nnodes, sizeof(*c->node_kept))))
    for (int k = 0; k < nnodes; k++)
      if (ccsd_span_node_of(c, nodes[k]) >= 0) c->node_kept[ccsd_span_node_of(c, nodes[k])] = g_kept[k];
  free(g_kept);
  c->via_holders = 1;
  if (made || !c->node_kept) ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory rejoining the communicator");
  else ccsd_comm_ready(c); /* the verdicts: every rank's, the other daemons' included */
  if (c->state == COMM_READY && (c->resumed = calloc((size_t)c->nnodes, sizeof(*c->resumed)))) {
    LOG_WARN("comm %llu rejoined across %d daemons after this one restarted (%llu collectives finished)",
             (unsigned long long)c->id, c->nnodes, (unsigned long long)c->coll_finished);
    for (int k = 0; k < nnodes; k++) {
      int node = ccsd_span_node_of(c, nodes[k]);
      if (node < 0 || node == c->mynode) continue;
      c->resumed[node] = holds[k]; /* a repeat of that hold's word is answered again */
      resume(c, nodes[k], holds[k]);
    }
  } else if (c->state == COMM_READY) {
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory rejoining the communicator");
  }
  free(holds);
  free(nodes);
}
