/* CommInit: the client's request checked field by field, then the join
 * handed to coll; and the client's comms by the handles its connection
 * knows them by. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "addr.h"
#include "front/front.h"

struct client_comm *ccsd_client_comm_find(struct session *s, uint64_t handle) {
  struct client_comm *cc;
  HASH_FIND(hh, s->comms_by_handle, &handle, sizeof(handle), cc);
  return cc;
}

void ccsd_client_comm_drop(struct session *s, struct client_comm *cc, const char *why, int graceful) {
  list_remove(&cc->link);
  HASH_DELETE(hh, s->comms_by_handle, cc);
  struct member *m = cc->member;
  free(cc);
  /* refused while the comm forms (its init answered, another job's rank
   * by name): as if it never came; else it leaves */
  if (m->comm->state == COMM_JOINING && !m->init) ccsd_member_withdraw(m);
  else ccsd_member_leave(m, why, graceful);
}

static void on_joined(struct coll_waiter *w, ccs_result_t status, const char *error) {
  struct submission *sub = LIST_ENTRY(w, struct submission, waiter);
  struct session *s = sub->session;
  uint64_t handle = sub->comm_handle;
  ccsd_submission_post_done(sub, status, error);
  /* a rank refused while its comm forms on (another job's, by name) gave
   * out no handle: it goes with the answer (where the comm failed, the
   * rank leaves with its client: this may run inside a walk of them) */
  struct client_comm *cc = status != CCS_OK && s ? ccsd_client_comm_find(s, handle) : NULL;
  if (cc && cc->member->comm->state == COMM_JOINING) ccsd_client_comm_drop(s, cc, "its init failed", 1);
  else if (cc) cc->refused = 1;
}

void ccsd_client_comms_sweep(struct session *s) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &s->comms) {
    struct client_comm *cc = LIST_ENTRY(it, struct client_comm, link);
    if (cc->refused) ccsd_client_comm_drop(s, cc, "its init failed", 1);
  }
}

void ccsd_comm_init(struct session *s, uint64_t req_id, const Ccs__CommInit *m) {
  struct daemon *d = s->d;
  struct ccs__unique_id uid;
  char err[CCS__ERROR_TEXT_MAX];
  int named = m->name && m->name[0];
  char derived[400];
  if (m->parent) { /* derived from a comm of this connection: named after it */
    struct client_comm *pc = ccsd_client_comm_find(s, m->parent);
    const struct comm *p = pc ? pc->member->comm : NULL;
    const char *bad = !p ? "no such parent communicator on this connection"
                      : !m->derive || !m->derive[0] || strlen(m->derive) > 200 ? "a derived communicator needs a tag of 1 to 200 bytes"
                      : (int)m->root_rank >= p->nranks ? "the root rank is not one of the parent's"
                      : p->spans && !p->node_of_rank ? "the parent never became ready across its daemons"
                      : NULL;
    if (bad) {
      ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT, bad);
      return;
    }
    int at = snprintf(derived, sizeof(derived), "derived:");
    for (unsigned i = 0; i < CCS__NAME_BYTES; i++) at += snprintf(derived + at, sizeof(derived) - (size_t)at, "%02x", p->name[i]);
    snprintf(derived + at, sizeof(derived) - (size_t)at, "/%s", m->derive);
    const char *root = p->spans ? p->node_addr[p->node_of_rank[m->root_rank]] : d->coll.self;
    ccsd_named_id(s->uid, derived, root, &uid);
    named = 1;
  } else if (named) { /* found by name: its id made here, as every rank's daemon makes it */
    const char *root = m->root && m->root[0] ? m->root : d->coll.self;
    if (strlen(m->name) > 200 || strlen(root) >= sizeof(uid.root)) {
      ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT,
                         "a communicator's name is 1 to 200 bytes, its root a numeric ADDRESS:PORT");
      return;
    }
    ccsd_named_id(s->uid, m->name, root, &uid);
  } else if (m->id.len != CCS_UNIQUE_ID_BYTES) {
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT, "unique id must be 128 bytes");
    return;
  }
  if (!named) memcpy(&uid, m->id.data, sizeof(uid));
  /* a rejoin brings back the id its comm had, one found by name too: as
   * unsigned as the name (its owner alone makes it), checked as such */
  if (!named && m->rejoin && uid.magic == CCS__NAMED_ID_MAGIC) named = 1;
  if (!named && uid.magic != CCS__UNIQUE_ID_MAGIC) {
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT,
                       "not a ccs unique id (get one with ccs_get_unique_id)");
    return;
  }
  if (!ccs__protocol_served(uid.protocol)) {
    snprintf(err, sizeof(err), "unique id of protocol %u; this daemon serves %u to %u", uid.protocol,
             CCS__PROTOCOL_OLDEST, CCS__PROTOCOL_VERSION);
    ccsd_session_reply(s, req_id, CCS_ERR_VERSION, err);
    return;
  }
  if (m->nranks < 1 || m->nranks > CCSD_MAX_RANKS || m->rank >= m->nranks) {
    snprintf(err, sizeof(err), "rank %u of %u ranks is out of range (1..%d ranks)", m->rank,
             m->nranks, CCSD_MAX_RANKS);
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT, err);
    return;
  }
  uid.root[sizeof(uid.root) - 1] = 0;
  /* An id of another daemon is checked by that daemon when this one joins. */
  int ours = !strcmp(uid.root, d->coll.self);
  if (!ours && !uid.root[0] && !named) {
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT,
                       "unique id not issued by this daemon (or from before it restarted)");
    return;
  }
  if (!ours && !d->coll.peers) {
    snprintf(err, sizeof(err), "%s the daemon at %.60s, and this daemon talks to no other (set listen)",
             named ? "the communicator's ranks meet at (CCS_ROOT)" : "unique id from",
             uid.root[0] ? uid.root : "(no address)");
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT, err);
    return;
  }
  /* Ids carry numeric addresses (resolved when issued): nothing a client
   * writes makes this daemon resolve a name. */
  if (!ours && !ccs_addr_is_numeric(uid.root)) {
    snprintf(err, sizeof(err), "unique id names its root daemon '%.60s', not a numeric ADDRESS:PORT",
             uid.root);
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT, err);
    return;
  }
  if (ours && !named && !ccsd_unique_id_valid(&d->coll, &uid)) {
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT,
                       "unique id not issued by this daemon (or from before it restarted)");
    return;
  }
  int rejoin_ttl_free = m->rejoin && ccsd_rejoin_window_open(&d->coll); /* (coll.h) */
  if (ours && !named && !rejoin_ttl_free && ccsd_unique_id_age(&d->coll, &uid) < 0) {
    snprintf(err, sizeof(err), "unique id expired: issued %.0f s ago, valid for %.0f s (id_ttl)",
             difftime(time(NULL), (time_t)uid.issued_s), d->cfg.id_ttl_s);
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT, err);
    return;
  }
  if ((uid_t)uid.owner_uid != s->uid) {
    /* Same answer whether or not the comm exists yet: no existence leak. */
    ccsd_session_reply(s, req_id, CCS_ERR_PERMISSION,
                       "this unique id belongs to another user's communicator");
    return;
  }
  if (m->priority > CCS_PRIORITY_BULK) {
    snprintf(err, sizeof(err), "priority %u is none of normal (0), latency (1), bulk (2)", m->priority);
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT, err);
    return;
  }
  static const int class_of[] = {[CCS_PRIORITY_NORMAL] = FAIR_NORMAL,
                                 [CCS_PRIORITY_LATENCY] = FAIR_LATENCY,
                                 [CCS_PRIORITY_BULK] = FAIR_BULK};
  const char *algo = m->algo ? m->algo : "";
  struct algo_rules rules;
  if (strlen(algo) >= sizeof(((struct comm *)0)->algo_text) ||
      ccsd_algo_rules_parse(algo, &rules, err, sizeof(err))) {
    char msg[CCS__ERROR_TEXT_MAX];
    snprintf(msg, sizeof(msg), "CCS_ALGO: %.900s", strlen(algo) >= 512 ? "longer than 511 characters" : err);
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT, msg);
    return;
  }
  struct coll_rejoin *rejoin = NULL;
  if (m->rejoin && !(rejoin = ccsd_rejoin_parse(m->rejoin, (int)m->nranks, err, sizeof(err)))) {
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT, err);
    return;
  }
  struct client_comm *cc = calloc(1, sizeof(*cc));
  struct submission *sub = cc ? ccsd_submission_new(s, req_id, 1, 0) : NULL;
  if (!sub) {
    free(cc);
    ccsd_rejoin_free(rejoin);
    ccsd_session_reply(s, req_id, CCS_ERR_NO_MEMORY, "out of memory");
    return;
  }
  sub->waiter.done = on_joined;
  cc->handle = ++s->next_comm_handle;
  sub->comm_handle = cc->handle;
  list_insert_tail(&s->comms, &cc->link);
  HASH_ADD(hh, s->comms_by_handle, handle, sizeof(cc->handle), cc);
  double op_timeout_s = m->op_timeout_ms ? m->op_timeout_ms / 1000.0 : 0;
  ccs_result_t rc = ccsd_comm_join(&d->coll, &uid, m->parent ? m->derive : named ? m->name : NULL, (int)m->nranks, (int)m->rank, algo, op_timeout_s,
                                   m->debug, class_of[m->priority], s->pid, rejoin, &sub->waiter, &cc->member, err, sizeof(err));
  if (rc != CCS_OK) { /* the waiter is never called: the answer is given here */
    ccsd_rejoin_free(rejoin);
    list_remove(&cc->link);
    HASH_DELETE(hh, s->comms_by_handle, cc);
    free(cc);
    sub->comm_handle = 0;
    ccsd_submission_post_done(sub, rc, err);
  }
}
