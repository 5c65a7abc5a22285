/* Communicators across daemons, on the loop thread.
 *
 * The unique id names the daemon that issued it (its advertised address).
 * A rank joining through another daemon makes that daemon send the root a
 * PeerJoin; the root checks the id's signature and the joiner's uid as for
 * its own ranks, and when every rank arrived sends each daemon involved a
 * PeerReady with every rank's daemon. Daemons order themselves by their
 * first rank, participants by daemon then rank, and open one data
 * connection per pair. A failure anywhere (a rank lost, a timeout, a lost
 * daemon) is sent to every other daemon of the comm, which fails it too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "log.h"

static void send_fail(struct daemon *d, const char *addr, const uint8_t *secret, ccs_result_t status,
                      const char *error) {
  Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
  Ccs__PeerFail f = CCS__PEER_FAIL__INIT;
  f.secret.data = (uint8_t *)secret;
  f.secret.len = CCS__SECRET_BYTES;
  f.status = status;
  f.error = (char *)error;
  m.body_case = CCS__PEER_MSG__BODY_FAIL;
  m.fail = &f;
  ccsd_peers_send(d->peers, addr, &m);
}

void ccsd_span_joined(struct comm *c, struct member *mb) {
  Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
  Ccs__PeerJoin j = CCS__PEER_JOIN__INIT;
  j.id.data = c->id_bytes;
  j.id.len = sizeof(c->id_bytes);
  j.nranks = (uint32_t)c->nranks;
  j.rank = (uint32_t)mb->rank;
  j.uid = (uint32_t)c->uid;
  j.pid = mb->pid;
  j.algo = c->algo_text;
  m.body_case = CCS__PEER_MSG__BODY_JOIN;
  m.join = &j;
  ccsd_peers_send(c->d->peers, c->root, &m);
}

/* Daemons numbered by their first rank, participants ordered by daemon. */
static int build_map(struct comm *c, char (*rank_addr)[CCSD_ADDR_MAX]) {
  int n = c->nranks;
  c->node_addr = calloc((size_t)n, sizeof(*c->node_addr));
  c->node_of_rank = malloc(sizeof(int) * (size_t)n);
  c->rank_of = malloc(sizeof(int) * (size_t)n);
  c->node_first = malloc(sizeof(int) * (size_t)(n + 1));
  if (!c->node_addr || !c->node_of_rank || !c->rank_of || !c->node_first) return -1;
  c->nnodes = 0;
  c->mynode = -1;
  for (int r = 0; r < n; r++) {
    int node = -1;
    for (int k = 0; k < c->nnodes && node < 0; k++)
      if (!strcmp(c->node_addr[k], rank_addr[r])) node = k;
    if (node < 0) {
      node = c->nnodes++;
      memcpy(c->node_addr[node], rank_addr[r], CCSD_ADDR_MAX);
    }
    c->node_of_rank[r] = node;
    if (!strcmp(rank_addr[r], c->d->self)) c->mynode = node;
  }
  int p = 0;
  for (int k = 0; k < c->nnodes; k++) {
    c->node_first[k] = p;
    for (int r = 0; r < n; r++)
      if (c->node_of_rank[r] == k) c->rank_of[p++] = r;
  }
  c->node_first[c->nnodes] = p;
  c->spans = c->nnodes > 1;
  if (c->spans && c->mynode >= 0)
    c->net = ccsd_peers_comm_open(c->d->peers, c->secret, c->nnodes, c->mynode,
                                  (const char(*)[CCSD_ADDR_MAX])c->node_addr, c->lanes);
  return c->spans && c->mynode >= 0 && !c->net ? -1 : 0;
}

/* The root: every rank is here or announced; tell every daemon involved. */
void ccsd_span_ready(struct comm *c) {
  int n = c->nranks;
  char(*addrs)[CCSD_ADDR_MAX] = calloc((size_t)n, sizeof(*addrs));
  char **ptrs = calloc((size_t)n, sizeof(char *));
  if (!addrs || !ptrs || !c->d->peers) {
    free(addrs);
    free(ptrs);
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory making the communicator ready");
    return;
  }
  for (int r = 0; r < n; r++) {
    snprintf(addrs[r], CCSD_ADDR_MAX, "%s", c->members[r]->remote ? c->members[r]->addr : c->d->self);
    ptrs[r] = addrs[r];
  }
  c->chunk_bytes = c->d->cfg.chunk_bytes;
  c->lanes = c->d->cfg.peer_connections;
  if (build_map(c, addrs)) {
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory making the communicator ready");
  } else {
    Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
    Ccs__PeerReady rd = CCS__PEER_READY__INIT;
    rd.secret.data = c->secret;
    rd.secret.len = CCS__SECRET_BYTES;
    rd.n_addrs = (size_t)n;
    rd.addrs = ptrs;
    rd.chunk_bytes = c->chunk_bytes;
    rd.lanes = (uint32_t)c->lanes;
    m.body_case = CCS__PEER_MSG__BODY_READY;
    m.ready = &rd;
    for (int k = 0; k < c->nnodes; k++)
      if (k != c->mynode) ccsd_peers_send(c->d->peers, c->node_addr[k], &m);
    LOG_INFO(CCS_LOG_INIT, "comm %llu spans %d daemons", (unsigned long long)c->id, c->nnodes);
  }
  free(addrs);
  free(ptrs);
}

/* Every other daemon this comm involves (known so far). */
static void for_each_other(struct comm *c, void (*fn)(struct comm *, const char *)) {
  if (c->node_addr) {
    for (int k = 0; k < c->nnodes; k++)
      if (k != c->mynode) fn(c, c->node_addr[k]);
    return;
  }
  if (c->root[0]) {
    fn(c, c->root);
    return;
  }
  for (int r = 0; r < c->nranks; r++) { /* the root before ready: joined daemons, once each */
    const struct member *m = c->members[r];
    if (!m || !m->remote) continue;
    int first = 1;
    for (int q = 0; q < r && first; q++)
      first = !(c->members[q] && c->members[q]->remote && !strcmp(c->members[q]->addr, m->addr));
    if (first) fn(c, m->addr);
  }
}

static void tell_failed(struct comm *c, const char *addr) {
  send_fail(c->d, addr, c->secret, c->error, c->error_text);
}

void ccsd_span_failed(struct comm *c) {
  if (!c->d->peers) return;
  for_each_other(c, tell_failed);
  if (c->net) ccsd_peers_comm_close(c->d->peers, c->net);
}

void ccsd_span_free(struct comm *c) {
  ccsd_agree_release(c);
  if (c->net) ccsd_peers_comm_free(c->d->peers, c->net);
  c->net = NULL;
  free(c->node_addr);
  free(c->node_of_rank);
  free(c->rank_of);
  free(c->node_first);
  free(c->p2p_counts);
}

static struct comm *find(struct daemon *d, const ProtobufCBinaryData *secret) {
  return secret->len == CCS__SECRET_BYTES ? ccsd_comm_find(d, secret->data) : NULL;
}

/* The root: a rank joined through the daemon at addr. */
static void on_join(struct daemon *d, const char *addr, const Ccs__PeerJoin *j) {
  struct ccs__unique_id id;
  char err[CCS__ERROR_TEXT_MAX];
  if (j->id.len != CCS_UNIQUE_ID_BYTES) return; /* no secret to answer to */
  memcpy(&id, j->id.data, sizeof(id));
  ccs_result_t rc = CCS_OK;
  if (id.magic != CCS__UNIQUE_ID_MAGIC || id.protocol != CCS__PROTOCOL_VERSION ||
      !ccsd_unique_id_valid(d, &id) || strcmp(id.root, d->self))
    rc = CCS_ERR_INVALID_ARGUMENT, snprintf(err, sizeof(err), "unique id not issued by the daemon at %s (or from before it restarted)", d->self);
  else if (j->uid != id.owner_uid)
    rc = CCS_ERR_PERMISSION, snprintf(err, sizeof(err), "this unique id belongs to another user's communicator");
  else if (j->nranks < 1 || j->nranks > CCSD_MAX_RANKS || j->rank >= j->nranks)
    rc = CCS_ERR_INVALID_ARGUMENT, snprintf(err, sizeof(err), "rank %u of %u ranks is out of range", j->rank, j->nranks);
  struct comm *c = rc == CCS_OK ? ccsd_comm_find(d, id.secret) : NULL;
  if (rc == CCS_OK && !c) {
    c = ccsd_comm_create(d, &id, (int)j->nranks, j->algo, (int)j->rank, &rc, err, sizeof(err));
    if (c) { /* held for the other daemons until it is ready or failed */
      c->coordinator = 1;
      ccsd_comm_ref(c);
    }
  }
  if (rc == CCS_OK && c->state != COMM_JOINING)
    rc = CCS_ERR_INVALID_USAGE, snprintf(err, sizeof(err), "communicator is %s", c->state == COMM_READY ? "complete" : c->error_text);
  if (rc != CCS_OK) {
    LOG_WARN("join from the daemon at %s refused: %s", addr, err);
    send_fail(d, addr, id.secret, rc, err);
    return;
  }
  if (ccsd_comm_check_join(c, (int)j->rank, (int)j->nranks, j->algo, j->pid) != CCS_OK) return;
  struct member *mb = calloc(1, sizeof(*mb));
  if (!mb) {
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory");
    return;
  }
  mb->comm = c;
  mb->rank = (int)j->rank;
  mb->pid = j->pid;
  mb->remote = 1;
  snprintf(mb->addr, sizeof(mb->addr), "%s", addr);
  c->members[mb->rank] = mb;
  c->spans = 1;
  if (++c->joined == c->nranks) ccsd_comm_ready(c);
}

/* Another daemon's rank joined through us; the root says who is where. */
static void on_ready(struct daemon *d, const char *addr, const Ccs__PeerReady *rd) {
  struct comm *c = find(d, &rd->secret);
  if (!c || c->state != COMM_JOINING || strcmp(addr, c->root)) return;
  if (rd->n_addrs != (size_t)c->nranks || rd->chunk_bytes < 1 || rd->lanes < 1 || rd->lanes > 64) {
    ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the root daemon at %s sent a bad rank map", addr);
    return;
  }
  char(*addrs)[CCSD_ADDR_MAX] = calloc((size_t)c->nranks, sizeof(*addrs));
  if (!addrs) {
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory");
    return;
  }
  for (int r = 0; r < c->nranks; r++) snprintf(addrs[r], CCSD_ADDR_MAX, "%s", rd->addrs[r]);
  for (int r = 0; r < c->nranks && c->state == COMM_JOINING; r++) {
    int here = !strcmp(addrs[r], d->self);
    if (here != (c->members[r] != NULL)) {
      ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the root daemon at %s places rank %d %s", addr, r,
                     here ? "here, where it never joined" : "elsewhere, but it joined here");
    } else if (!here) {
      struct member *mb = calloc(1, sizeof(*mb));
      if (!mb) {
        ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory");
        break;
      }
      mb->comm = c;
      mb->rank = r;
      mb->remote = 1;
      snprintf(mb->addr, sizeof(mb->addr), "%s", addrs[r]);
      c->members[r] = mb;
    }
  }
  c->chunk_bytes = rd->chunk_bytes;
  c->lanes = (int)rd->lanes;
  if (c->state == COMM_JOINING && build_map(c, addrs))
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory");
  free(addrs);
  if (c->state == COMM_JOINING) ccsd_comm_ready(c);
}

void ccsd_span_message(struct daemon *d, const char *addr, const Ccs__PeerMsg *m) {
  switch (m->body_case) {
  case CCS__PEER_MSG__BODY_JOIN: on_join(d, addr, m->join); break;
  case CCS__PEER_MSG__BODY_READY: on_ready(d, addr, m->ready); break;
  case CCS__PEER_MSG__BODY_OP: {
    struct comm *c = find(d, &m->op->secret);
    if (c) ccsd_agree_message(c, addr, m->op);
    break;
  }
  case CCS__PEER_MSG__BODY_FAIL: {
    struct comm *c = find(d, &m->fail->secret);
    ccs_result_t status = m->fail->status > 0 && m->fail->status < 64 ? m->fail->status : CCS_ERR_PEER_LOST;
    if (c) ccsd_comm_fail(c, status, "%s", m->fail->error);
    break;
  }
  default: break;
  }
}

/* "1,3-4" of the ranks served by addr */
static void ranks_at(const struct comm *c, const char *addr, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
  for (int r = 0; r < c->nranks && n + 16 < len; r++) {
    const struct member *m = c->members[r];
    if (m && m->remote && !strcmp(m->addr, addr)) n += (size_t)snprintf(buf + n, len - n, n ? ",%d" : "%d", r);
  }
}

/* This daemon stops: its comms with ranks elsewhere fail for every daemon,
 * saying so (not as the first of its ranks that happens to be closed). */
void ccsd_span_stopping(struct daemon *d) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->comms) {
    struct comm *c = LIST_ENTRY(it, struct comm, link);
    if (c->state == COMM_FAILED || (!c->spans && !c->root[0])) continue;
    char ranks[256];
    size_t n = 0;
    ranks[0] = 0;
    for (int r = 0; r < c->nranks && n + 16 < sizeof(ranks); r++)
      if (c->members[r] && !c->members[r]->remote)
        n += (size_t)snprintf(ranks + n, sizeof(ranks) - n, n ? ",%d" : "%d", r);
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "the daemon at %s serving rank(s) %s is stopping",
                   d->self, ranks);
  }
}

void ccsd_span_peer_lost(struct daemon *d, const char *addr, const char *why) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->comms) {
    struct comm *c = LIST_ENTRY(it, struct comm, link);
    if (c->state == COMM_FAILED) continue;
    char ranks[256];
    ranks_at(c, addr, ranks, sizeof(ranks));
    int involved = ranks[0] || !strcmp(c->root, addr);
    if (!involved) continue;
    if (ranks[0])
      ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "the daemon at %s serving rank(s) %s is unreachable: %s",
                     addr, ranks, why);
    else
      ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "the root daemon at %s is unreachable: %s", addr, why);
  }
}
