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

#include "daemon.h"

struct agreement {
  struct list link; /* in comm->agreements */
  uint64_t seq;
  struct op_sig first; /* what the first word said */
  int first_rank;
  char first_at[CCSD_ADDR_MAX]; /* the daemon it came from */
  int heard;                    /* daemons that said it, this one included */
};

static struct agreement *find(struct comm *c, uint64_t seq) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &c->agreements) {
    struct agreement *a = LIST_ENTRY(it, struct agreement, link);
    if (a->seq == seq) return a;
  }
  struct agreement *a = calloc(1, sizeof(*a));
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

/* One daemon's word on op #seq, compared with the first; forgotten once
 * every daemon spoke. */
static void heard(struct comm *c, uint64_t seq, const struct op_sig *sig, int rank,
                  const char *at) {
  struct agreement *a = find(c, seq);
  if (!a) return;
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
  Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
  Ccs__PeerOp op = CCS__PEER_OP__INIT;
  op.secret = (ProtobufCBinaryData){CCS__SECRET_BYTES, c->secret};
  op.seq = seq;
  op.kind = sig.kind;
  op.count = sig.count;
  op.dtype = sig.dtype;
  op.redop = sig.redop;
  op.root = sig.root;
  op.rank = p->member->rank;
  m.body_case = CCS__PEER_MSG__BODY_OP;
  m.op = &op;
  for (int k = 0; k < c->nnodes; k++)
    if (k != c->mynode) ccsd_peers_send(c->d->peers, c->node_addr[k], &m);
  heard(c, seq, &sig, p->member->rank, c->d->self);
}

void ccsd_agree_message(struct comm *c, const char *addr, const Ccs__PeerOp *m) {
  if (c->state != COMM_READY || !spans_daemons(c, m->kind) || m->kind >= CCS__COLL_KIND_COUNT)
    return;
  struct op_sig sig = {m->kind, m->dtype, m->redop, m->count, m->root};
  heard(c, m->seq, &sig, m->rank, addr);
}

void ccsd_agree_release(struct comm *c) {
  while (!list_empty(&c->agreements)) {
    struct agreement *a = LIST_ENTRY(c->agreements.next, struct agreement, link);
    list_remove(&a->link);
    free(a);
  }
}
