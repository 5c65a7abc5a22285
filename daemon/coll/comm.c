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

#include "base/failpoint.h"
#include "base/log.h"
#include "coll/coll.h"

void ccsd_comm_ref(struct comm *c) { c->refs++; }

static void on_timer_closed(uv_handle_t *handle) {
  struct comm *c = handle->data;
  list_remove(&c->link);
  ccsd_span_free(c);
  const struct coll_hooks *h = &c->co->hooks;
  h->release(h->arg, c->quota, COLL_CHARGE_COMM);
  for (int r = 0; r < c->nranks; r++) {
    if (c->members[r] && c->members[r]->quota) h->release(h->arg, c->members[r]->quota, COLL_CHARGE_RANK);
    if (c->members[r]) ccsd_rejoin_free(c->members[r]->rejoin);
    free(c->members[r]);
  }
  free(c->members);
  plan_cache_free(&c->plans);
  if (c->barrier_bytes) { /* registered until now */
    ccsd_peers_forget(c->co->peers, c->barrier_bytes, 2 * (size_t)c->nranks);
    free(c->barrier_bytes);
  }
  free(c);
}

/* Comms let go here, kept by name for the daemons and ranks that ask after
 * them later. A comm made again after this daemon restarted that failed:
 * a rank that rejoins it later (held back, slow) is told why at once
 * rather than make it anew and wait out the rejoin (within the rejoin
 * window). A comm across daemons destroyed by its ranks here: another
 * daemon holding it, which took the closed connections for a restart of
 * this one, is told at once rather than wait out peer_restart_grace
 * (regather.c). The last FAILURES_KEPT. */
#define FAILURES_KEPT 64
struct comm_failure {
  uint8_t name[CCS__NAME_BYTES];
  int for_rejoin; /* a failure of a comm made again: for the ranks that rejoin it */
  ccs_result_t error;
  char text[CCS__ERROR_TEXT_MAX];
};

static struct comm_failure *kept_new(struct comm *c) {
  struct coll *co = c->co;
  if (!co->failures && !(co->failures = calloc(FAILURES_KEPT, sizeof(*co->failures)))) return NULL;
  struct comm_failure *f = &co->failures[co->nfailures++ % FAILURES_KEPT];
  memcpy(f->name, c->name, sizeof(f->name));
  return f;
}

static void keep_failure(struct comm *c) {
  struct comm_failure *f = kept_new(c);
  if (!f) return;
  f->for_rejoin = 1;
  f->error = c->error;
  snprintf(f->text, sizeof(f->text), "%s", c->error_text);
}

/* (A failed one is not: its ranks may make it again under its name, and
 * the daemons were told, or hear, of the failure themselves.) */
static void keep_destroyed(struct comm *c) {
  struct comm_failure *f = kept_new(c);
  if (!f) return;
  char ranks[128];
  ccsd_comm_ranks_at(c, c->mynode, ranks, sizeof(ranks));
  f->for_rejoin = 0;
  f->error = CCS_ERR_PEER_LOST;
  snprintf(f->text, sizeof(f->text), "rank(s) %s, at the daemon at %s, destroyed the communicator", ranks,
           c->co->self);
}

static const struct comm_failure *failure_of(const struct coll *co, const uint8_t *name) {
  size_t n = co->nfailures < FAILURES_KEPT ? co->nfailures : FAILURES_KEPT;
  for (size_t i = 1; co->failures && i <= n; i++) { /* the latest first */
    const struct comm_failure *f = &co->failures[(co->nfailures - i) % FAILURES_KEPT];
    if (!memcmp(f->name, name, sizeof(f->name))) return f;
  }
  return NULL;
}

const char *ccsd_comm_closed_here(const struct coll *co, const uint8_t *name, ccs_result_t *error) {
  const struct comm_failure *f = failure_of(co, name);
  if (!f) return NULL;
  *error = f->error;
  return f->text;
}

void ccsd_comm_failures_free(struct coll *co) {
  free(co->failures);
  co->failures = NULL;
  co->nfailures = 0;
}

void ccsd_comm_unref(struct comm *c) {
  if (--c->refs > 0) return;
  if (!list_empty(&c->slots) || !list_empty(&c->p2p) || !list_empty(&c->queued) || ccsd_hold_waiting(c))
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "every rank left with ops still pending");
  LOG_INFO(CCS_LOG_INIT, "comm %llu freed", (unsigned long long)c->id);
  if (c->state == COMM_FAILED && c->rejoining && !c->unnamed && ccsd_rejoin_window_open(c->co)) keep_failure(c);
  else if (!c->unnamed && c->state == COMM_READY && c->nnodes > 1 && c->node_of_rank) keep_destroyed(c);
  /* found no more, but in coll->comms until on_timer_closed: a walk of them
   * may be under way (failing one comm can free others) */
  c->gone = 1;
  if (!c->unnamed) HASH_DELETE(hh, c->co->comms_by_name, c);
  uv_close((uv_handle_t *)&c->timer, on_timer_closed);
}

void ccsd_comm_ranks_at(const struct comm *c, int node, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
  for (int r = 0; r < c->nranks && n + 16 < len; r++)
    if (c->node_of_rank[r] == node) n += (size_t)snprintf(buf + n, len - n, n ? ",%d" : "%d", r);
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

int ccsd_comm_forming(const struct comm *c) {
  if (c->state != COMM_JOINING) return 0;
  for (int r = 0; c->rejoining && r < c->nranks; r++)
    if (c->members[r] && c->members[r]->rejoin && c->members[r]->rejoin->n) return 0;
  return 1;
}

void ccsd_comm_fail(struct comm *c, ccs_result_t error, const char *fmt, ...) {
  if (c->state == COMM_FAILED) return;
  enum comm_state was = c->state;
  /* only a first init is sent again on it (span.c): a ready or rejoined
   * comm's calls would repeat forever (another daemon's word may say it
   * of any comm) */
  if (error == CCS_ERR_RETRY && !ccsd_comm_forming(c)) error = CCS_ERR_PEER_LOST;
  /* (one forming again is not lost: its ranks send their inits again) */
  if (error != CCS_ERR_RETRY && ((was == COMM_JOINING && c->rejoining) || c->hold || c->unholdable))
    c->co->restarts[RESTART_FAILED]++;
  c->state = COMM_FAILED;
  c->error = error;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->error_text, sizeof(c->error_text), fmt, ap);
  va_end(ap);
  LOG_WARN("comm %llu failed: %s: %s", (unsigned long long)c->id, ccs_result_name(error),
           c->error_text);
  /* cut short as it formed by a daemon that went (span.c): its ranks send
   * their inits again (libccs), which make a new comm of that name */
  if (was == COMM_JOINING && error == CCS_ERR_RETRY) {
    HASH_DELETE(hh, c->co->comms_by_name, c);
    c->unnamed = 1;
  }
  uv_timer_stop(&c->timer);
  ccsd_span_failed(c);
  if (c->coordinator) { /* the root's hold for other daemons ends, once this call is over */
    c->coordinator = 0;
    uv_timer_start(&c->timer, on_release, 0, 0);
  }
  for (int r = 0; was == COMM_JOINING && r < c->nranks; r++)
    if (c->members[r]) ccsd_member_answer_init(c->members[r], error, c->error_text);
  ccsd_comm_fail_pending(c);
}

void ccsd_comm_init_timed_out(struct comm *c) {
  char missing[256], present[256];
  if (c->rejoining) {
    format_ranks(present, sizeof(present), c, 0);
    format_ranks(missing, sizeof(missing), c, 1);
    ccsd_comm_fail(c, CCS_ERR_TIMEOUT,
                   "rejoining after the restart timed out after %.1f s: rank(s) %s are back, rank(s) %s "
                   "did not rejoin%s", (double)(ccsd_now_ms_of(c->co) - c->created_ms) / 1000.0,
                   present, missing[0] ? missing : "(none)",
                   c->regather || c->refound ? ""
                   : c->nlet_go ? "; the daemons that held the communicator for them lost another of its "
                                  "daemons meanwhile, and no daemon made it again with them"
                   : " and no other daemon held the communicator for them nor came back with its ranks "
                     "(its ranks there had left it, or it failed there: another of its daemons went too, "
                     "a CUDA stream's call was under way, or their peer_restart_grace is 0)");
    return;
  }
  if (c->root[0]) {
    format_ranks(present, sizeof(present), c, 0);
    ccsd_comm_fail(c, CCS_ERR_TIMEOUT,
                   "comm init timed out after %.1f s: the root daemon at %s did not report every "
                   "rank (rank(s) %s joined here)",
                   c->co->cfg.init_timeout_s, c->root, present);
    return;
  }
  format_ranks(missing, sizeof(missing), c, 1);
  format_ranks(present, sizeof(present), c, 0);
  ccsd_comm_fail(c, CCS_ERR_TIMEOUT,
                 "comm init timed out after %.1f s: %d of %d ranks joined; rank(s) %s never "
                 "called ccs_comm_init_rank (ranks %s waited)",
                 c->co->cfg.init_timeout_s, c->joined, c->nranks, missing, present);
}

static void on_init_timeout(uv_timer_t *t) { ccsd_comm_init_timed_out(t->data); }

/* The table's key: the name hashed with this daemon's own random key, so
 * that names made from chosen secrets cannot be aimed at one bucket. */
static uint64_t table_key(const struct coll *co, const uint8_t *name) {
  uint64_t key;
  crypto_shorthash((uint8_t *)&key, name, CCS__NAME_BYTES, co->table_key);
  return key;
}

struct comm *ccsd_comm_find(struct coll *co, const uint8_t *name) {
  uint64_t key = table_key(co, name);
  struct comm *c;
  HASH_FIND(hh, co->comms_by_name, &key, sizeof(key), c);
  return c && !memcmp(c->name, name, CCS__NAME_BYTES) ? c : NULL;
}

struct comm *ccsd_comm_create(struct coll *co, const struct ccs__unique_id *id, int nranks,
                              const char *algo, int first_rank, ccs_result_t *rc, char *err,
                              size_t errlen) {
  struct algo_rules rules;
  if (ccsd_algo_rules_parse(algo[0] ? algo : co->cfg.algo, &rules, err, errlen)) rules.n = 0;
  void *t = co->hooks.charge(co->hooks.arg, id->owner_uid, COLL_CHARGE_COMM, rc, err, errlen);
  if (!t) return NULL;
  struct comm *c = calloc(1, sizeof(*c));
  if (c) c->members = calloc((size_t)nranks, sizeof(*c->members));
  if (!c || !c->members) {
    free(c);
    co->hooks.release(co->hooks.arg, t, COLL_CHARGE_COMM);
    *rc = CCS_ERR_NO_MEMORY;
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  c->quota = t;
  c->co = co;
  c->id = ++*co->next_id;
  ccsd_comm_name(id, c->name);
  c->table_key = table_key(co, c->name);
  memcpy(c->id_bytes, id, sizeof(*id));
  c->uid = id->owner_uid;
  c->share = ccsd_run_share_of(co->shares, c->uid);
  c->prio = FAIR_NORMAL;
  c->named = id->magic == CCS__NAMED_ID_MAGIC;
  c->nranks = nranks;
  c->op_timeout_s = co->cfg.op_timeout_s;
  c->rules = rules;
  c->first_rank = first_rank;
  snprintf(c->algo_text, sizeof(c->algo_text), "%s", algo);
  if (strcmp(id->root, co->self)) snprintf(c->root, sizeof(c->root), "%s", id->root);
  c->state = COMM_JOINING;
  c->created_ms = ccsd_fresh_ms_of(co);
  list_init(&c->slots);
  list_init(&c->p2p);
  list_init(&c->running);
  list_init(&c->queued);
  list_init(&c->agreements);
  uv_timer_init(co->loop, &c->timer);
  c->timer.data = c;
  /* a daemon waiting for another root answers after it would have */
  double wait = co->cfg.init_timeout_s + (c->root[0] ? 2 : 0);
  uv_timer_start(&c->timer, on_init_timeout, (uint64_t)(wait * 1000), 0);
  list_insert_tail(&co->comms, &c->link);
  HASH_ADD(hh, co->comms_by_name, table_key, sizeof(c->table_key), c);
  return c;
}

/* Checks that rank (of nranks, with CCS_ALGO algo, process pid) may join c;
 * fails c, for every rank, when it may not. */
ccs_result_t ccsd_comm_check_join(struct comm *c, int rank, int nranks, const char *algo, int pid) {
  if (c->named) { /* a name can be taken by another job by mistake: only the newcomer fails */
    if (c->nranks != nranks || c->members[rank] || strcmp(c->algo_text, algo)) return CCS_ERR_INVALID_ARGUMENT;
    return CCS_OK;
  }
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
  if (c->spans && !c->root[0] && (!c->rejoining || c->refound)) ccsd_span_ready(c);
  if (c->state != COMM_JOINING) return;
  if (ccsd_rejoin_settle(c) != CCS_OK) return;
  c->state = COMM_READY;
  uv_timer_stop(&c->timer);
  LOG_INFO(CCS_LOG_INIT, "comm %llu ready: %d ranks, %d here", (unsigned long long)c->id, c->nranks,
           c->nlocal);
  for (int r = 0; r < c->nranks; r++) ccsd_member_answer_init(c->members[r], CCS_OK, NULL);
  if (c->rejoining) {
    c->co->restarts[c->via_holders                ? RESTART_REJOINED_FROM_HOLDERS
                    : c->refound || c->nnodes > 1 ? RESTART_REJOINED_THROUGH_ROOT /* (or formed anew there) */
                                                  : RESTART_REJOINED_HERE]++;
    ccsd_failpoint("rejoined");
  }
  if (c->coordinator) { /* the other daemons have it now */
    c->coordinator = 0;
    ccsd_comm_unref(c);
  }
}

void ccsd_comm_set_label(struct comm *c, const char *label) {
  /* a name for texts and logs: printable characters only, whoever sent it */
  size_t n = 0;
  for (; label && label[n] && n + 1 < sizeof(c->label); n++)
    c->label[n] = label[n] >= 0x20 && label[n] < 0x7f ? label[n] : '?';
  c->label[n] = 0;
}

void ccsd_comm_named_conflict(const struct comm *c, const char *label, int nranks, int rank,
                              const char *algo, char *err, size_t errlen) {
  const char *name = c->label[0] ? c->label : label && *label ? label : "(unnamed)";
  if (c->state != COMM_JOINING)
    snprintf(err, errlen, "the communicator named '%s' of this user is in use (%s): another job "
             "with that name? (CCS_JOB names the job)", name,
             c->state == COMM_READY ? "all of its ranks joined" : "failed, its ranks not all gone");
  else if (c->nranks != nranks)
    snprintf(err, errlen, "the communicator named '%s' of this user has %d ranks, this rank asks "
             "for %d: another job with that name? (CCS_JOB names the job)", name, c->nranks, nranks);
  else if (c->members[rank])
    snprintf(err, errlen, "rank %d of the communicator named '%s' of this user joined already "
             "(pid %d): another job with that name? (CCS_JOB names the job)", rank, name,
             (int)c->members[rank]->pid);
  else
    snprintf(err, errlen, "the communicator named '%s' has CCS_ALGO='%.200s', this rank '%.200s'",
             name, c->algo_text, algo);
}

ccs_result_t ccsd_comm_join(struct coll *co, const struct ccs__unique_id *id, const char *label,
                            int nranks, int rank, const char *algo, double op_timeout_s, int debug,
                            int prio, pid_t pid, struct coll_rejoin *rejoin, struct coll_waiter *w,
                            struct member **ret, char *err, size_t errlen) {
  ccs_result_t rc;
  void *t = co->hooks.charge(co->hooks.arg, id->owner_uid, COLL_CHARGE_RANK, &rc, err, errlen);
  if (!t) return rc;
  uint8_t name[CCS__NAME_BYTES];
  ccsd_comm_name(id, name);
  struct comm *c = ccsd_comm_find(co, name);
  const struct comm_failure *f = !c && rejoin && rejoin->n ? failure_of(co, name) : NULL;
  if (f && f->for_rejoin) { /* back with its calls, after the comm failed here and was let go */
    co->hooks.release(co->hooks.arg, t, COLL_CHARGE_RANK);
    snprintf(err, errlen, "the communicator failed here as its ranks rejoined it: %s", f->text);
    return f->error;
  }
  if (c && c->named && (c->state != COMM_JOINING || ccsd_comm_check_join(c, rank, nranks, algo, (int)pid))) {
    co->hooks.release(co->hooks.arg, t, COLL_CHARGE_RANK);
    ccsd_comm_named_conflict(c, label, nranks, rank, algo, err, errlen);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  if (c && c->state != COMM_JOINING) {
    co->hooks.release(co->hooks.arg, t, COLL_CHARGE_RANK);
    snprintf(err, errlen, "communicator is %s: %s",
             c->state == COMM_READY ? "complete (every rank already joined)" : "failed",
             c->state == COMM_READY ? "a unique id makes one communicator" : c->error_text);
    return CCS_ERR_INVALID_USAGE;
  }
  if (!c) {
    c = ccsd_comm_create(co, id, nranks, algo, rank, &rc, err, errlen);
    if (!c) {
      co->hooks.release(co->hooks.arg, t, COLL_CHARGE_RANK);
      return rc;
    }
    ccsd_comm_set_label(c, label);
    LOG_INFO(CCS_LOG_INIT, "comm %llu created by pid %d: %d ranks%s%s", (unsigned long long)c->id,
             (int)pid, nranks, c->root[0] ? ", root daemon " : "", c->root);
  }
  rc = ccsd_comm_check_join(c, rank, nranks, algo, (int)pid);
  if (rc != CCS_OK) {
    co->hooks.release(co->hooks.arg, t, COLL_CHARGE_RANK);
    snprintf(err, errlen, "%s", c->error_text);
    return rc;
  }
  struct member *mb = calloc(1, sizeof(*mb));
  if (!mb) {
    co->hooks.release(co->hooks.arg, t, COLL_CHARGE_RANK);
    snprintf(err, errlen, "out of memory");
    return CCS_ERR_NO_MEMORY;
  }
  if (!c->prio_set) c->prio = prio, c->prio_set = 1;
  /* its first rank here says (a comm another daemon's rank made here first too) */
  if (!c->nlocal && op_timeout_s > 0) c->op_timeout_s = op_timeout_s;
  mb->comm = c;
  mb->quota = t;
  mb->rank = rank;
  mb->pid = pid;
  mb->init = w;
  mb->debug = debug;
  /* an init sent again (no call made) where no daemon holds a comm for
   * another nor makes it again (peer_restart_grace 0): a first init */
  if (rejoin && !rejoin->n && strcmp(id->root, co->self) && co->cfg.peer_restart_grace_s <= 0) {
    ccsd_rejoin_free(rejoin);
    rejoin = NULL;
  }
  mb->rejoin = rejoin;
  c->members[rank] = mb;
  c->joined++;
  c->nlocal++;
  ccsd_comm_ref(c);
  LOG_TRACE(CCS_LOG_INIT, "comm %llu: rank %d joined (pid %d), %d/%d", (unsigned long long)c->id, rank,
            (int)pid, c->joined, c->nranks);
  *ret = mb;
  if (rejoin && c->joined == 1 && !c->rejoining) { /* made again after this daemon restarted */
    c->rejoining = 1;
    /* across daemons, the others that hold it speak within a second or so,
     * or, restarted too, come back with their ranks (refound.c); a rank
     * that sent its init again (no channel) spans them where its id's
     * root is another daemon */
    if (rejoin->spans || (!rejoin->n && c->root[0])) ccsd_refound_wait(c, rejoin->n > 0);
  }
  if (c->regather) ccsd_regather_check(c); /* the daemons that held it spoke */
  else if (c->root[0] && !c->rejoining) ccsd_span_joined(c, mb); /* the root says when all are there */
  else if (c->joined == c->nranks) ccsd_comm_ready(c);
  return CCS_OK;
}

/* The member stays in comm->members (its rank and pid name it in errors)
 * until the comm is freed, marked as left; the front forgets its handle. A rank that
 * destroys its handle fails the comm only if another rank still waits on
 * it now, or submits later (ccsd_post_submit): destroying in turn is the
 * normal end of a comm, not an error to log. */
void ccsd_member_leave(struct member *m, const char *why, int graceful) {
  struct comm *c = m->comm;
  m->left = 1;
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
  /* its ops still running wait for nothing of it any more (a GPU stream
   * waiting for its flags is let go), also where no other rank is left to
   * fail */
  LIST_FOREACH_SAFE(it, tmp, &c->running) {
    struct xop *x = LIST_ENTRY(it, struct xop, comm_link);
    for (int i = 0; i < x->nposts; i++)
      if (x->posts[i] && x->posts[i]->member == m) atomic_store(&x->run.cancelled, 1);
  }
  ccsd_member_answer_init(m, c->error, c->error_text); /* its own reply cannot be delivered any more */
  ccsd_comm_unref(c);
}

void ccsd_member_answer_init(struct member *m, ccs_result_t status, const char *text) {
  struct coll_waiter *w = m->init;
  m->init = NULL; /* answered once: the answer may free what waits */
  if (w) w->done(w, status, text);
}

void ccsd_member_withdraw(struct member *m) {
  struct comm *c = m->comm;
  const struct coll_hooks *h = &c->co->hooks;
  c->members[m->rank] = NULL;
  c->joined--;
  c->nlocal--;
  if (m->quota) h->release(h->arg, m->quota, COLL_CHARGE_RANK);
  ccsd_rejoin_free(m->rejoin);
  free(m);
  ccsd_comm_unref(c);
}

/* The first rank that left, for errors of ops submitted after it did. */
const struct member *ccsd_comm_departed(const struct comm *c) {
  for (int r = 0; r < c->nranks; r++)
    if (c->members[r] && !c->members[r]->remote && c->members[r]->left) return c->members[r];
  return NULL;
}
