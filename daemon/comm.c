/* Communicators: created by the first rank that presents a unique id,
 * ready when all ranks joined, failed for everyone when one rank dies,
 * aborts, or the init deadline passes. A comm belongs to the uid that
 * created it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "log.h"

void ccsd_comm_ref(struct comm *c) { c->refs++; }

static void on_timer_closed(uv_handle_t *h) {
  struct comm *c = h->data;
  ccsd_tenant_release(c->tenant, TENANT_COMMS, 1);
  for (int r = 0; r < c->nranks; r++) free(c->members[r]);
  free(c->members);
  free(c);
}

void ccsd_comm_unref(struct comm *c) {
  if (--c->refs > 0) return;
  if (!list_empty(&c->slots) || !list_empty(&c->p2p))
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "every rank left with ops still pending");
  LOG_INFO(CCS_LOG_INIT, "comm %llu freed", (unsigned long long)c->id);
  list_remove(&c->link);
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
  format_ranks(missing, sizeof(missing), c, 1);
  format_ranks(present, sizeof(present), c, 0);
  ccsd_comm_fail(c, CCS_ERR_TIMEOUT,
                 "comm init timed out after %.1f s: %d of %d ranks joined; rank(s) %s never "
                 "called ccs_comm_init_rank (ranks %s waited)",
                 c->d->cfg.init_timeout_s, c->joined, c->nranks, missing, present);
}

static struct comm *comm_find(struct daemon *d, const uint8_t *secret) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->comms) {
    struct comm *c = LIST_ENTRY(it, struct comm, link);
    if (!memcmp(c->secret, secret, CCS__SECRET_BYTES)) return c;
  }
  return NULL;
}

static struct comm *comm_new(struct session *s, const uint8_t *secret, int nranks,
                             ccs_result_t *rc, char *err, size_t errlen) {
  struct daemon *d = s->d;
  struct tenant *t;
  if ((*rc = ccsd_tenant_charge(d, s->uid, TENANT_COMMS, 1, &t, err, errlen)) != CCS_OK)
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
  memcpy(c->secret, secret, CCS__SECRET_BYTES);
  c->uid = s->uid;
  c->nranks = nranks;
  c->state = COMM_JOINING;
  list_init(&c->slots);
  list_init(&c->p2p);
  list_init(&c->running);
  uv_timer_init(d->loop, &c->timer);
  c->timer.data = c;
  uv_timer_start(&c->timer, on_init_timeout, (uint64_t)(d->cfg.init_timeout_s * 1000), 0);
  list_insert_tail(&d->comms, &c->link);
  return c;
}

void ccsd_comm_init(struct session *s, uint64_t req_id, const Ccs__CommInit *m) {
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
  if (!ccsd_unique_id_valid(s->d, &uid)) {
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_ARGUMENT,
                       "unique id not issued by this daemon (or from before it restarted)");
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
  struct comm *c = comm_find(s->d, uid.secret);
  if (c && c->state != COMM_JOINING) {
    snprintf(err, sizeof(err), "communicator is %s: %s",
             c->state == COMM_READY ? "complete (every rank already joined)" : "failed",
             c->state == COMM_READY ? "a unique id makes one communicator" : c->error_text);
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_USAGE, err);
    return;
  }
  if (!c) {
    ccs_result_t rc;
    c = comm_new(s, uid.secret, nranks, &rc, err, sizeof(err));
    if (!c) {
      ccsd_session_reply(s, req_id, rc, err);
      return;
    }
    c->op_timeout_s = m->op_timeout_ms ? m->op_timeout_ms / 1000.0 : s->d->cfg.op_timeout_s;
    snprintf(c->algo_text, sizeof(c->algo_text), "%s", algo);
    c->first_rank = rank;
    /* the ranks' CCS_ALGO, else the daemon's rules (checked when loaded) */
    if (!algo[0] && ccsd_algo_rules_parse(s->d->cfg.algo, &rules, err, sizeof(err))) rules.n = 0;
    c->rules = rules;
    LOG_INFO(CCS_LOG_INIT, "comm %llu created by pid %d: %d ranks", (unsigned long long)c->id, (int)s->pid,
             nranks);
  }
  if (c->nranks != nranks) {
    ccsd_comm_fail(c, CCS_ERR_MISMATCH,
                   "rank %d (pid %d) called ccs_comm_init_rank with nranks=%d, but the "
                   "communicator was created with nranks=%d",
                   rank, (int)s->pid, nranks, c->nranks);
    ccsd_session_reply(s, req_id, CCS_ERR_MISMATCH, c->error_text);
    return;
  }
  if (strcmp(c->algo_text, algo)) {
    ccsd_comm_fail(c, CCS_ERR_MISMATCH, "rank %d (pid %d) has CCS_ALGO='%.200s' but rank %d has '%.200s'",
                   rank, (int)s->pid, algo, c->first_rank, c->algo_text);
    ccsd_session_reply(s, req_id, CCS_ERR_MISMATCH, c->error_text);
    return;
  }
  if (c->members[rank]) {
    ccsd_comm_fail(c, CCS_ERR_INVALID_USAGE,
                   "rank %d joined twice (pid %d, then pid %d)", rank,
                   (int)c->members[rank]->pid, (int)s->pid);
    ccsd_session_reply(s, req_id, CCS_ERR_INVALID_USAGE, c->error_text);
    return;
  }
  struct member *mb = calloc(1, sizeof(*mb));
  struct submission *sub = ccsd_submission_new(s, req_id, 1);
  if (!mb || !sub) {
    free(mb);
    if (sub) ccsd_submission_post_done(sub, CCS_ERR_NO_MEMORY, "out of memory");
    else ccsd_session_reply(s, req_id, CCS_ERR_NO_MEMORY, "out of memory");
    return;
  }
  mb->comm = c;
  mb->session = s;
  mb->handle = ++s->next_comm_handle;
  mb->rank = rank;
  mb->pid = s->pid;
  mb->init = sub;
  mb->debug = m->debug;
  sub->comm_handle = mb->handle;
  list_insert_tail(&s->members, &mb->session_link);
  c->members[rank] = mb;
  c->joined++;
  ccsd_comm_ref(c);
  LOG_TRACE(CCS_LOG_INIT, "comm %llu: rank %d joined (pid %d), %d/%d", (unsigned long long)c->id, rank,
            (int)s->pid, c->joined, c->nranks);
  if (c->joined < c->nranks) return;

  c->state = COMM_READY;
  uv_timer_stop(&c->timer);
  LOG_INFO(CCS_LOG_INIT, "comm %llu ready: %d ranks", (unsigned long long)c->id, c->nranks);
  for (int r = 0; r < c->nranks; r++) {
    struct member *each = c->members[r];
    struct submission *pending = each->init;
    each->init = NULL;
    if (pending) ccsd_submission_post_done(pending, CCS_OK, NULL);
  }
}

struct member *ccsd_member_find(struct session *s, uint64_t handle) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &s->members) {
    struct member *m = LIST_ENTRY(it, struct member, session_link);
    if (m->handle == handle) return m;
  }
  return NULL;
}

/* The member stays in comm->members (its rank and pid name it in errors)
 * until the comm is freed; only its link to the session goes. A rank that
 * destroys its handle fails the comm only if another rank still waits on
 * it now, or submits later (ccsd_post_submit): destroying in turn is the
 * normal end of a comm, not an error to log. */
void ccsd_member_leave(struct member *m, const char *why, int graceful) {
  struct comm *c = m->comm;
  list_remove(&m->session_link);
  m->session = NULL;
  c->departed++;
  /* collectives need every rank; a send or receive only its two */
  int waited_on = c->state == COMM_JOINING || !list_empty(&c->slots);
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &c->p2p) {
    const struct post *p = LIST_ENTRY(it, struct post, link);
    waited_on |= p->member == m || p->root == m->rank;
  }
  if (c->state != COMM_FAILED && c->departed < c->nranks && (!graceful || waited_on))
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
    if (c->members[r] && !c->members[r]->session) return c->members[r];
  return NULL;
}
