/* Communicators: created by the first rank that presents a unique id,
 * ready when all ranks joined, failed for everyone when one rank dies,
 * aborts, or the init deadline passes. A comm belongs to the uid that
 * created it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include <time.h>

#include "addr.h"
#include "daemon.h"
#include "base/log.h"

void ccsd_comm_ref(struct comm *c) { c->refs++; }

static void on_timer_closed(uv_handle_t *h) {
  struct comm *c = h->data;
  list_remove(&c->link);
  ccsd_span_free(c);
  ccsd_tenant_release(c->tenant, TENANT_COMMS, 1);
  for (int r = 0; r < c->nranks; r++) {
    if (c->members[r]) ccsd_tenant_release(c->members[r]->tenant, TENANT_RANKS, 1);
    free(c->members[r]);
  }
  free(c->members);
  free(c);
}

void ccsd_comm_unref(struct comm *c) {
  if (--c->refs > 0) return;
  if (!list_empty(&c->slots) || !list_empty(&c->p2p))
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "every rank left with ops still pending");
  LOG_INFO(CCS_LOG_INIT, "comm %llu freed", (unsigned long long)c->id);
  /* found no more, but in d->comms until on_timer_closed: a walk of them
   * may be under way (failing one comm can free others) */
  c->gone = 1;
  HASH_DELETE(hh, c->d->comms_by_name, c);
  uv_close((uv_handle_t *)&c->timer, on_timer_closed);
}

/* "0-2,5" for the ranks where missing[r] is set. */
static void format_ranks(char *buf, size_t len, const struct comm *c, int want_missing) {
  size_t n = 0;
  buf[0] = 0;
  for (int r = 0; r < c->nranks && n + 16 < len; r++) {
    int missing = c->members[r] == NULL;
    if (missing != want_missing) continue;
    int end = r;
    while (end + 1 < c->nranks && (c->members[end + 1] == NULL) == want_missing) end++;
    n += (size_t)snprintf(buf + n, len - n, n ? ",%d" : "%d", r);
    if (end > r) n += (size_t)snprintf(buf + n, len - n, "-%d", end);
    r = end;
  }
}

static void on_release(uv_timer_t *t) { ccsd_comm_unref(t->data); }

void ccsd_comm_fail(struct comm *c, ccs_result_t error, const char *fmt, ...) {
  if (c->state == COMM_FAILED) return;
  enum comm_state was = c->state;
  c->state = COMM_FAILED;
  c->error = error;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->error_text, sizeof(c->error_text), fmt, ap);
  va_end(ap);
  LOG_WARN("comm %llu failed: %s: %s", (unsigned long long)c->id, ccs_result_name(error),
           c->error_text);
  uv_timer_stop(&c->timer);
  ccsd_span_failed(c);
  if (c->coordinator) { /* the root's hold for other daemons ends, once this call is over */
    c->coordinator = 0;
    uv_timer_start(&c->timer, on_release, 0, 0);
  }
  if (was == COMM_JOINING) {
    for (int r = 0; r < c->nranks; r++) {
      struct member *m = c->members[r];
      if (!m || !m->init) continue;
      struct submission *sub = m->init;
      m->init = NULL;
      ccsd_submission_post_done(sub, error, c->error_text);
    }
  }
  ccsd_comm_fail_pending(c);
}

static void on_init_timeout(uv_timer_t *t) {
  struct comm *c = t->data;
  char missing[256], present[256];
  if (c->root[0]) {
    format_ranks(present, sizeof(present), c, 0);
    ccsd_comm_fail(c, CCS_ERR_TIMEOUT,
                   "comm init timed out after %.1f s: the root daemon at %s did not report every "
                   "rank (rank(s) %s joined here)",
                   c->d->cfg.init_timeout_s, c->root, present);
    return;
  }
  format_ranks(missing, sizeof(missing), c, 1);
  format_ranks(present, sizeof(present), c, 0);
  ccsd_comm_fail(c, CCS_ERR_TIMEOUT,
                 "comm init timed out after %.1f s: %d of %d ranks joined; rank(s) %s never "
                 "called ccs_comm_init_rank (ranks %s waited)",
                 c->d->cfg.init_timeout_s, c->joined, c->nranks, missing, present);
}

void ccsd_comm_name(const struct ccs__unique_id *id, uint8_t name[CCS__NAME_BYTES]) {
  crypto_generichash_state st;
  uint32_t owner = id->owner_uid;
  crypto_generichash_init(&st, NULL, 0, CCS__NAME_BYTES);
  crypto_generichash_update(&st, (const uint8_t *)"ccs comm name", 13);
  crypto_generichash_update(&st, (const uint8_t *)id->root, strnlen(id->root, sizeof(id->root)));
  crypto_generichash_update(&st, (const uint8_t *)"", 1); /* the root ends here */
  crypto_generichash_update(&st, id->secret, sizeof(id->secret));
  crypto_generichash_update(&st, (const uint8_t *)&owner, sizeof(owner));
  crypto_generichash_final(&st, name, CCS__NAME_BYTES);
}

/* The table's key: the name hashed with this daemon's own random key, so
 * that names made from chosen secrets cannot be aimed at one bucket. */
static uint64_t table_key(const struct daemon *d, const uint8_t *name) {
  uint64_t key;
  crypto_shorthash((uint8_t *)&key, name, CCS__NAME_BYTES, d->table_key);
  return key;
}

struct comm *ccsd_comm_find(struct daemon *d, const uint8_t *name) {
  uint64_t key = table_key(d, name);
  struct comm *c;
  HASH_FIND(hh, d->comms_by_name, &key, sizeof(key), c);
  return c && !memcmp(c->name, name, CCS__NAME_BYTES) ? c : NULL;
}

struct comm *ccsd_comm_create(struct daemon *d, const struct ccs__unique_id *id, int nranks,
                              const char *algo, int first_rank, ccs_result_t *rc, char *err,
                              size_t errlen) {
  struct tenant *t;
  struct algo_rules rules;
  if (ccsd_algo_rules_parse(algo[0] ? algo : d->cfg.algo, &rules, err, errlen)) rules.n = 0;
  if ((*rc = ccsd_tenant_charge(d, id->owner_uid, TENANT_COMMS, 1, &t, err, errlen)) != CCS_OK)
    return NULL;
  struct comm *c = calloc(1, sizeof(*c));
  if (c) c->members = calloc((size_t)nranks, sizeof(*c->members));
  if (!c || !c->members) {
    free(c);
    ccsd_tenant_release(t, TENANT_COMMS, 1);
    *rc = CCS_ERR_NO_MEMORY;
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  c->tenant = t;
  c->d = d;
  c->id = ++d->next_id;
  ccsd_comm_name(id, c->name);
  c->table_key = table_key(d, c->name);
  memcpy(c->id_bytes, id, sizeof(*id));
  c->uid = id->owner_uid;
  c->nranks = nranks;
  c->op_timeout_s = d->cfg.op_timeout_s;
  c->rules = rules;
  c->first_rank = first_rank;
  snprintf(c->algo_text, sizeof(c->algo_text), "%s", algo);
  if (strcmp(id->root, d->self)) snprintf(c->root, sizeof(c->root), "%s", id->root);
  c->state = COMM_JOINING;
  list_init(&c->slots);
  list_init(&c->p2p);
  list_init(&c->running);
  list_init(&c->agreements);
  uv_timer_init(d->loop, &c->timer);
  c->timer.data = c;
  /* a daemon waiting for another root answers after it would have */
  double wait = d->cfg.init_timeout_s + (c->root[0] ? 2 : 0);
  uv_timer_start(&c->timer, on_init_timeout, (uint64_t)(wait * 1000), 0);
  list_insert_tail(&d->comms, &c->link);
  HASH_ADD(hh, d->comms_by_name, table_key, sizeof(c->table_key), c);
  return c;
}

/* Checks that rank (of nranks, with CCS_ALGO algo, process pid) may join c;
 * fails c, for every rank, when it may not. */
ccs_result_t ccsd_comm_check_join(struct comm *c, int rank, int nranks, const char *algo, int pid) {
  if (c->nranks != nranks)
    ccsd_comm_fail(c, CCS_ERR_MISMATCH,
                   "rank %d (pid %d) called ccs_comm_init_rank with nranks=%d, but the "
                   "communicator was created with nranks=%d",
                   rank, pid, nranks, c->nranks);
  else if (strcmp(c->algo_text, algo))
    ccsd_comm_fail(c, CCS_ERR_MISMATCH, "rank %d (pid %d) has CCS_ALGO='%.200s' but rank %d has '%.200s'",
                   rank, pid, algo, c->first_rank, c->algo_text);
  else if (c->members[rank])
    ccsd_comm_fail(c, CCS_ERR_INVALID_USAGE, "rank %d joined twice (pid %d, then pid %d)", rank,
                   (int)c->members[rank]->pid, pid);
  else
    return CCS_OK;
  return c->error;
}

/* Every rank arrived (the root), or the root said so (another daemon). */
void ccsd_comm_ready(struct comm *c) {
  if (c->spans && !c->root[0]) ccsd_span_ready(c);
  if (c->state != COMM_JOINING) return;
  c->state = COMM_READY;
  uv_timer_stop(&c->timer);
  LOG_INFO(CCS_LOG_INIT, "comm %llu ready: %d ranks, %d here", (unsigned long long)c->id, c->nranks,
           c->nlocal);
  for (int r = 0; r < c->nranks; r++) {
    struct member *each = c->members[r];
    struct submission *pending = each->init;
    each->init = NULL;
    if (pending) ccsd_submission_post_done(pending, CCS_OK, NULL);
  }
  if (c->coordinator) { /* the other daemons have it now */
    c->coordinator = 0;
    ccsd_comm_unref(c);
  }
}

void ccsd_comm_init(struct session *s, uint64_t req_id, const Ccs__CommInit *m) {
  struct daemon *d = s->d;
  struct ccs__unique_id uid;
  char err[CCS__ERROR_TEXT_MAX];
  if (m->id.len != CCS_UNIQUE_ID_BYTES) {
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT, "unique id must be 128 bytes");
    return;
  }
  memcpy(&uid, m->id.data, sizeof(uid));
  if (uid.magic != CCS__UNIQUE_ID_MAGIC) {
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT,
                       "not a ccs unique id (get one with ccs_get_unique_id)");
    return;
  }
  if (uid.protocol != CCS__PROTOCOL_VERSION) {
    ccsd_session_reply(s, req_id, CCS_ERR_VERSION, "unique id from another protocol version");
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
  int ours = !strcmp(uid.root, d->self);
  if (!ours && !uid.root[0]) {
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT,
                       "unique id not issued by this daemon (or from before it restarted)");
    return;
  }
  if (!ours && !d->peers) {
    snprintf(err, sizeof(err), "unique id from the daemon at %.60s, and this daemon talks to no other (set listen)",
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
  if (ours && !ccsd_unique_id_valid(d, &uid)) {
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT,
                       "unique id not issued by this daemon (or from before it restarted)");
    return;
  }
  if (ours && ccsd_unique_id_age(d, &uid) < 0) {
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
  const char *algo = m->algo ? m->algo : "";
  struct algo_rules rules;
  if (strlen(algo) >= sizeof(((struct comm *)0)->algo_text) ||
      ccsd_algo_rules_parse(algo, &rules, err, sizeof(err))) {
    char msg[CCS__ERROR_TEXT_MAX];
    snprintf(msg, sizeof(msg), "CCS_ALGO: %.900s", strlen(algo) >= 512 ? "longer than 511 characters" : err);
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT, msg);
    return;
  }
  int nranks = (int)m->nranks, rank = (int)m->rank;
  struct tenant *t;
  ccs_result_t rc = ccsd_tenant_charge(d, s->uid, TENANT_RANKS, 1, &t, err, sizeof(err));
  if (rc != CCS_OK) {
    ccsd_session_reply(s, req_id, rc, err);
    return;
  }
  uint8_t name[CCS__NAME_BYTES];
  ccsd_comm_name(&uid, name);
  struct comm *c = ccsd_comm_find(d, name);
  if (c && c->state != COMM_JOINING) {
    ccsd_tenant_release(t, TENANT_RANKS, 1);
    snprintf(err, sizeof(err), "communicator is %s: %s",
             c->state == COMM_READY ? "complete (every rank already joined)" : "failed",
             c->state == COMM_READY ? "a unique id makes one communicator" : c->error_text);
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_USAGE, err);
    return;
  }
  if (!c) {
    c = ccsd_comm_create(d, &uid, nranks, algo, rank, &rc, err, sizeof(err));
    if (!c) {
      ccsd_tenant_release(t, TENANT_RANKS, 1);
      ccsd_session_reply(s, req_id, rc, err);
      return;
    }
    if (m->op_timeout_ms) c->op_timeout_s = m->op_timeout_ms / 1000.0;
    LOG_INFO(CCS_LOG_INIT, "comm %llu created by pid %d: %d ranks%s%s", (unsigned long long)c->id,
             (int)s->pid, nranks, c->root[0] ? ", root daemon " : "", c->root);
  }
  rc = ccsd_comm_check_join(c, rank, nranks, algo, (int)s->pid);
  if (rc != CCS_OK) {
    ccsd_tenant_release(t, TENANT_RANKS, 1);
    ccsd_session_reply(s, req_id, rc, c->error_text);
    return;
  }
  struct member *mb = calloc(1, sizeof(*mb));
  struct submission *sub = ccsd_submission_new(s, req_id, 1);
  if (!mb || !sub) {
    ccsd_tenant_release(t, TENANT_RANKS, 1);
    free(mb);
    if (sub) ccsd_submission_post_done(sub, CCS_ERR_NO_MEMORY, "out of memory");
    else ccsd_session_reply(s, req_id, CCS_ERR_NO_MEMORY, "out of memory");
    return;
  }
  mb->comm = c;
  mb->session = s;
  mb->tenant = t;
  mb->handle = ++s->next_comm_handle;
  mb->rank = rank;
  mb->pid = s->pid;
  mb->init = sub;
  mb->debug = m->debug;
  sub->comm_handle = mb->handle;
  list_insert_tail(&s->members, &mb->session_link);
  HASH_ADD(hh, s->members_by_handle, handle, sizeof(mb->handle), mb);
  c->members[rank] = mb;
  c->joined++;
  c->nlocal++;
  ccsd_comm_ref(c);
  LOG_TRACE(CCS_LOG_INIT, "comm %llu: rank %d joined (pid %d), %d/%d", (unsigned long long)c->id, rank,
            (int)s->pid, c->joined, c->nranks);
  if (c->root[0]) ccsd_span_joined(c, mb); /* the root says when all are there */
  else if (c->joined == c->nranks) ccsd_comm_ready(c);
}

struct member *ccsd_member_find(struct session *s, uint64_t handle) {
  struct member *m;
  HASH_FIND(hh, s->members_by_handle, &handle, sizeof(handle), m);
  return m;
}

/* The member stays in comm->members (its rank and pid name it in errors)
 * until the comm is freed; only its link to the session goes. A rank that
 * destroys its handle fails the comm only if another rank still waits on
 * it now, or submits later (ccsd_post_submit): destroying in turn is the
 * normal end of a comm, not an error to log. */
void ccsd_member_leave(struct member *m, const char *why, int graceful) {
  struct comm *c = m->comm;
  list_remove(&m->session_link);
  HASH_DELETE(hh, m->session->members_by_handle, m);
  m->session = NULL;
  c->departed++;
  /* collectives need every rank; a send or receive only its two */
  int waited_on = c->state == COMM_JOINING || !list_empty(&c->slots);
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &c->p2p) {
    const struct post *p = LIST_ENTRY(it, struct post, link);
    waited_on |= p->member == m || p->root == m->rank;
  }
  /* ranks that could still need it: all while joining, then this daemon's */
  int others = c->state == COMM_JOINING || !c->spans ? c->nranks : c->nlocal;
  if (c->state != COMM_FAILED && c->departed < others && (!graceful || waited_on))
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "rank %d (pid %d) %s", m->rank, (int)m->pid, why);
  if (m->init) { /* its own init reply cannot be delivered any more */
    struct submission *sub = m->init;
    m->init = NULL;
    ccsd_submission_post_done(sub, c->error, c->error_text);
  }
  ccsd_comm_unref(c);
}

/* The first rank that left, for errors of ops submitted after it did. */
const struct member *ccsd_comm_departed(const struct comm *c) {
  for (int r = 0; r < c->nranks; r++)
    if (c->members[r] && !c->members[r]->remote && !c->members[r]->session) return c->members[r];
  return NULL;
}
