/* Ranks on different daemons agree on each op, as ranks on one daemon do
 * (match.c). The data of an op is tagged with its arguments (sig_key in
 * the tags), so daemons whose ranks called it differently never exchange
 * a byte of it: no rank gets a result. To say why, a daemon that starts
 * op #seq of a comm spanning daemons sends the others what its ranks
 * called (PeerOp); a disagreement (type, op, count, root) fails the comm
 * with CCS_ERR_MISMATCH naming a rank of each side, on every daemon. On
 * the loop thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "base/log.h"

struct agreement {
  struct list link; /* in comm->agreements */
  uint64_t seq;
  struct op_sig first; /* what the first word said */
  int first_rank;
  char first_at[CCSD_ADDR_MAX]; /* the daemon it came from */
  int heard;                    /* daemons that said it, this one included */
  uint8_t said[];               /* per node: it spoke (a daemon counts once) */
};

/* Words on ops a comm may hold unsettled: as many ops as one submission may
 * carry, twice, and some. A daemon that speaks of more is out of line. */
#define MAX_PENDING (2 * CCS__SUBMIT_MAX_OPS + 64)

static struct agreement *find(struct comm *c, uint64_t seq) {
  struct list *it, *tmp;
  size_t n = 0;
  LIST_FOREACH_SAFE(it, tmp, &c->agreements) {
    struct agreement *a = LIST_ENTRY(it, struct agreement, link);
    if (a->seq == seq) return a;
    n++;
  }
  if (n >= MAX_PENDING) {
    ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "daemons spoke of more than %d ops not yet agreed on",
                   MAX_PENDING);
    return NULL;
  }
  struct agreement *a = calloc(1, sizeof(*a) + (size_t)c->nnodes);
  if (!a) {
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory agreeing on op #%llu",
                   (unsigned long long)seq);
    return NULL;
  }
  a->seq = seq;
  list_insert_tail(&c->agreements, &a->link);
  return a;
}

static int spans_daemons(const struct comm *c, uint32_t kind) {
  return c->spans && c->nnodes > 1 && kind != CCS__SEND && kind != CCS__RECV;
}

/* One daemon's (node's) word on op #seq, compared with the first;
 * forgotten once every daemon spoke. */
static void heard(struct comm *c, uint64_t seq, const struct op_sig *sig, int rank, int node) {
  struct agreement *a = find(c, seq);
  if (!a) return;
  const char *at = c->node_addr[node];
  if (a->said[node]) {
    ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s spoke twice of op #%llu", at,
                   (unsigned long long)seq);
    return;
  }
  a->said[node] = 1;
  if (a->heard++ == 0) {
    a->first = *sig;
    a->first_rank = rank;
    snprintf(a->first_at, sizeof(a->first_at), "%s", at);
  } else if (!ccsd_op_sig_same(&a->first, sig) && c->state != COMM_FAILED) {
    char one[200], other[200];
    ccsd_op_sig_describe(one, sizeof(one), &a->first);
    ccsd_op_sig_describe(other, sizeof(other), sig);
    ccsd_comm_fail(c, CCS_ERR_MISMATCH,
                   "op #%llu differs across daemons: rank %d (daemon %s) called %s; rank %d "
                   "(daemon %s) called %s", (unsigned long long)seq, a->first_rank, a->first_at,
                   one, rank, at, other);
    return; /* the failure forgot every word */
  }
  if (a->heard < c->nnodes) return;
  list_remove(&a->link);
  free(a);
}

void ccsd_agree_launched(struct comm *c, const struct post *p, uint64_t seq) {
  if (!p || !spans_daemons(c, p->kind) || c->state == COMM_FAILED) return;
  struct op_sig sig = ccsd_op_sig_of(p);
  struct peer_msg m = {.kind = PEER_OP,
                       .op = {.name = c->name, .name_len = CCS__NAME_BYTES, .seq = seq,
                              .kind = sig.kind, .dtype = sig.dtype, .redop = sig.redop,
                              .count = sig.count, .root = sig.root, .rank = p->member->rank}};
  for (int k = 0; k < c->nnodes; k++)
    if (k != c->mynode) ccsd_peers_send(c->co->peers, c->node_addr[k], &m);
  heard(c, seq, &sig, p->member->rank, c->mynode);
}

/* The comm's map is set (it is ready) and addr takes part (span.c); every
 * field is checked before it counts. */
void ccsd_agree_message(struct comm *c, const char *addr, const struct peer_op *m) {
  if (c->state != COMM_READY || c->nnodes < 2) return;
  int node = -1;
  for (int k = 0; k < c->nnodes && node < 0; k++)
    if (k != c->mynode && !strcmp(c->node_addr[k], addr)) node = k;
  const char *bad = NULL;
  if (node < 0) bad = "it is not a daemon of the communicator";
  else if (m->kind >= CCS__COLL_KIND_COUNT || !spans_daemons(c, m->kind)) bad = "no such collective across daemons";
  else if (m->dtype >= CCS_DTYPE_COUNT) bad = "no such data type";
  else if (ccs__coll_has_redop(m->kind) && m->redop >= CCS_REDOP_COUNT) bad = "no such reduction";
  else if (ccs__coll_has_root(m->kind) && (m->root < 0 || m->root >= c->nranks)) bad = "a root out of range";
  else if (m->rank < 0 || m->rank >= c->nranks || c->node_of_rank[m->rank] != node) bad = "a rank it does not serve";
  else if (m->seq == 0) bad = "op #0";
  if (bad) {
    LOG_WARN("daemon at %s: a word on op #%llu refused: %s", addr, (unsigned long long)m->seq, bad);
    ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s spoke of op #%llu with %s", addr,
                   (unsigned long long)m->seq, bad);
    return;
  }
  struct op_sig sig = {m->kind, m->dtype, ccs__coll_has_redop(m->kind) ? m->redop : 0, m->count,
                       ccs__coll_has_root(m->kind) ? m->root : 0};
  heard(c, m->seq, &sig, m->rank, node);
}

void ccsd_agree_release(struct comm *c) {
  while (!list_empty(&c->agreements)) {
    struct agreement *a = LIST_ENTRY(c->agreements.next, struct agreement, link);
    list_remove(&a->link);
    free(a);
  }
}
