/* Ranks on different daemons agree on each op, as ranks on one daemon do
 * (match.c). The data of an op is tagged with its arguments (sig_key in
 * the tags), so daemons whose ranks called it differently never exchange
 * a byte of it: no rank gets a result, and the op cannot finish. To say
 * why, the daemons of a comm tell each other what their ranks called
 * (PeerOp), and a disagreement (kind, type, op, count, root) fails the
 * comm with CCS_ERR_MISMATCH naming a rank of each side, on every daemon.
 *
 * In a collective without a root every daemon receives what every other
 * sent (directly or through others), so ranks that disagree always leave
 * one daemon waiting: there a daemon speaks of op #seq only when it
 * matters: when the op has waited CCSD_AGREE_AFTER_MS for the other
 * daemons (ccsd_agree_slow, from the comm's deadline timer), when another
 * daemon spoke of it, or at launch if one already had. Such ops that
 * finish say nothing: a small all_reduce across daemons is its data
 * messages alone, with no control message per op to send, receive and hand
 * to this thread. A rooted one (broadcast, reduce, gather, scatter) may
 * finish everywhere while its ranks disagree (the root's sends complete
 * whoever takes them): its word goes at launch.
 *
 * What this daemon's ranks called is kept for the last RECENT ops (to
 * answer a daemon that speaks of an op finished here: a root whose
 * broadcast left, say); words heard are kept, per op spoken of, until
 * every daemon spoke or the op is RECENT ops behind the newest launched
 * here. On the loop thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "base/log.h"

#define RECENT 64

/* Words on ops a comm may hold unsettled: as many ops as one submission may
 * carry, twice, and some. A daemon that speaks of more is out of line. */
#define MAX_PENDING (2 * CCS__SUBMIT_MAX_OPS + 64)

struct agreement {
  struct list link; /* in comm->agreements */
  uint64_t seq;
  struct op_sig first; /* what the first word said */
  int first_rank, first_node;
  int heard;         /* daemons that said it, this one included */
  uint8_t said[];    /* per node: it spoke (a daemon counts once) */
};

/* What this daemon's ranks called, for the last RECENT ops. */
struct agree_recent {
  struct own {
    uint64_t seq; /* 0: none */
    struct op_sig sig;
    int rank, spoken; /* spoken: told the other daemons */
  } own[RECENT];
  uint64_t newest;
};

static int spans_daemons(const struct comm *c, uint32_t kind) {
  return c->spans && c->nnodes > 1 && !ccsd_p2p_kind(kind);
}

static struct own *own_word(const struct comm *c, uint64_t seq) {
  if (seq == 0) return NULL; /* a send or receive (no word on it); an empty record says 0 too */
  struct own *o = c->agree_recent ? &c->agree_recent->own[seq % RECENT] : NULL;
  return o && o->seq == seq ? o : NULL;
}

static struct agreement *find(struct comm *c, uint64_t seq, int make) {
  struct list *it, *tmp;
  size_t n = 0;
  LIST_FOREACH_SAFE(it, tmp, &c->agreements) {
    struct agreement *a = LIST_ENTRY(it, struct agreement, link);
    if (a->seq == seq) return a;
    n++;
  }
  if (!make) return NULL;
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

/* One daemon's (node's) word on op a->seq, compared with the first; the
 * record goes once every daemon spoke. 0 while the comm stands. */
static int heard(struct comm *c, struct agreement *a, const struct op_sig *sig, int rank, int node) {
  const char *at = c->node_addr[node];
  if (a->said[node]) {
    ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s spoke twice of op #%llu", at,
                   (unsigned long long)a->seq);
    return -1; /* the failure forgot every word */
  }
  a->said[node] = 1;
  if (a->heard++ == 0) {
    a->first = *sig;
    a->first_rank = rank;
    a->first_node = node;
  } else if (!ccsd_op_sig_same(&a->first, sig)) {
    char one[200], other[200];
    ccsd_op_sig_describe(one, sizeof(one), &a->first);
    ccsd_op_sig_describe(other, sizeof(other), sig);
    ccsd_comm_fail(c, CCS_ERR_MISMATCH,
                   "op #%llu differs across daemons: rank %d (daemon %s) called %s; rank %d "
                   "(daemon %s) called %s", (unsigned long long)a->seq, a->first_rank,
                   c->node_addr[a->first_node], one, rank, at, other);
    return -1;
  }
  return 0;
}

static void forget(struct agreement *a) {
  list_remove(&a->link);
  free(a);
}

/* Once every daemon spoke, a is forgotten: 1. */
static int settle(struct comm *c, struct agreement *a) {
  if (a->heard < c->nnodes) return 0;
  forget(a);
  return 1;
}

/* This daemon's word on a->seq (its ranks called the op: o), heard here,
 * and told every other daemon of the comm once per op, whatever becomes
 * of the records. 1 when a is gone. */
static int speak(struct comm *c, struct agreement *a, struct own *o) {
  if (!o->spoken) {
    o->spoken = 1;
    struct peer_msg m = {.kind = PEER_OP,
                         .op = {.name = c->name, .name_len = CCS__NAME_BYTES, .seq = o->seq,
                                .kind = o->sig.kind, .dtype = o->sig.dtype, .redop = o->sig.redop,
                                .count = o->sig.count, .root = o->sig.root, .rank = o->rank}};
    for (int k = 0; k < c->nnodes; k++)
      if (k != c->mynode) ccsd_peers_send(c->co->peers, c->node_addr[k], &m);
  }
  if (a->said[c->mynode]) return 0;
  return heard(c, a, &o->sig, o->rank, c->mynode) || settle(c, a);
}

/* Words on ops RECENT behind the newest can no longer be answered here. */
static void forget_old(struct comm *c, uint64_t newest) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &c->agreements) {
    struct agreement *a = LIST_ENTRY(it, struct agreement, link);
    if (a->seq + RECENT <= newest) forget(a);
  }
}

void ccsd_agree_launched(struct comm *c, const struct post *p, uint64_t seq) {
  if (!p || !spans_daemons(c, p->kind) || c->state == COMM_FAILED) return;
  if (!c->agree_recent && !(c->agree_recent = calloc(1, sizeof(*c->agree_recent)))) {
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory agreeing on op #%llu", (unsigned long long)seq);
    return;
  }
  struct own *o = &c->agree_recent->own[seq % RECENT];
  *o = (struct own){seq, ccsd_op_sig_of(p), p->member->rank, 0};
  o->sig.whole_count = 0; /* daemons do not speak of it (coll.h) */
  if (seq > c->agree_recent->newest) c->agree_recent->newest = seq;
  /* a rooted op can finish everywhere with the ranks disagreeing (a root's
   * sends complete, whoever receives them): its word goes at once */
  int rooted = ccs__coll_has_root(p->kind);
  if (list_empty(&c->agreements) && !rooted) return; /* the usual case: nothing to say */
  forget_old(c, c->agree_recent->newest);
  struct agreement *a = find(c, seq, rooted);
  if (a) speak(c, a, o); /* another daemon waits for this one's word, or it is rooted */
}

void ccsd_agree_slow(struct comm *c, uint64_t seq) {
  struct own *o = own_word(c, seq);
  if (!o || o->spoken || c->state == COMM_FAILED) return;
  struct agreement *a = find(c, seq, 1);
  if (a) speak(c, a, o);
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
  uint64_t newest = c->agree_recent ? c->agree_recent->newest : 0;
  if (m->seq + RECENT <= newest) return; /* long finished here: nothing left to say */
  struct op_sig sig = {m->kind, m->dtype, ccs__coll_has_redop(m->kind) ? m->redop : 0, m->count,
                       ccs__coll_has_root(m->kind) ? m->root : 0};
  struct agreement *a = find(c, m->seq, 1);
  if (!a || heard(c, a, &sig, m->rank, node)) return;
  struct own *o = own_word(c, m->seq);
  if (o && speak(c, a, o)) return; /* it waits for this daemon's word */
  settle(c, a);
}

void ccsd_agree_release(struct comm *c) {
  while (!list_empty(&c->agreements)) forget(LIST_ENTRY(c->agreements.next, struct agreement, link));
  free(c->agree_recent);
  c->agree_recent = NULL;
}
