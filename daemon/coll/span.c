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

#include "addr.h"
#include "coll/coll.h"
#include "base/log.h"

static void send_fail(struct coll *co, const char *addr, const uint8_t *name, ccs_result_t status,
                      const char *error, uint32_t refused_rank) {
  struct peer_msg m = {.kind = PEER_FAIL,
                       .fail = {.name = name, .name_len = CCS__NAME_BYTES, .status = status, .error = error,
                                .refused_rank = refused_rank}};
  ccsd_peers_send(co->peers, addr, &m);
}

void ccsd_span_tell_failed(struct coll *co, const char *addr, const uint8_t *name, ccs_result_t status,
                           const char *error) {
  send_fail(co, addr, name, status, error, 0);
}

void ccsd_span_joined(struct comm *c, struct member *mb) {
  struct peer_msg m = {.kind = PEER_JOIN,
                       .join = {.id = c->id_bytes, .id_len = sizeof(c->id_bytes),
                                .nranks = (uint32_t)c->nranks, .rank = (uint32_t)mb->rank,
                                .uid = (uint32_t)c->uid, .pid = mb->pid, .algo = c->algo_text,
                                .label = c->label, .report = mb->rejoin ? mb->rejoin->wire : NULL}};
  ccsd_peers_send(c->co->peers, c->root, &m);
}

struct member *ccsd_span_remote_member(struct comm *c, int rank, pid_t pid, const char *addr) {
  struct member *mb = calloc(1, sizeof(*mb));
  if (!mb) {
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory");
    return NULL;
  }
  mb->comm = c;
  mb->rank = rank;
  mb->pid = pid;
  mb->remote = 1;
  snprintf(mb->addr, sizeof(mb->addr), "%s", addr);
  c->members[rank] = mb;
  return mb;
}

/* Daemons numbered by their first rank, participants ordered by daemon. */
int ccsd_span_map(struct comm *c, char (*rank_addr)[CCSD_ADDR_MAX]) {
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
    if (!strcmp(rank_addr[r], c->co->self)) c->mynode = node;
  }
  int p = 0;
  for (int k = 0; k < c->nnodes; k++) {
    c->node_first[k] = p;
    for (int r = 0; r < n; r++)
      if (c->node_of_rank[r] == k) c->rank_of[p++] = r;
  }
  c->node_first[c->nnodes] = p;
  c->spans = c->nnodes > 1;
  c->map = (struct net_map){c->nnodes, c->nranks, (const char(*)[CCSD_ADDR_MAX])c->node_addr,
                            c->node_of_rank};
  if (c->spans && c->mynode >= 0)
    c->net = ccsd_peers_comm_open(c->co->peers, c->name, c->nnodes, c->mynode,
                                  (const char(*)[CCSD_ADDR_MAX])c->node_addr, c->lanes, NULL);
  return c->spans && c->mynode >= 0 && !c->net ? -1 : 0;
}

/* The root: every rank is here or announced; tell every daemon involved. */
void ccsd_span_ready(struct comm *c) {
  int n = c->nranks;
  char(*addrs)[CCSD_ADDR_MAX] = calloc((size_t)n, sizeof(*addrs));
  char **ptrs = calloc((size_t)n, sizeof(char *));
  /* made again from its ranks' reports: every one of them, to each daemon */
  static Ccs__Rejoin no_call = CCS__REJOIN__INIT;
  Ccs__PeerRank *ranks = c->refound ? calloc((size_t)n, sizeof(*ranks)) : NULL;
  Ccs__PeerRank **rank_ptrs = c->refound ? calloc((size_t)n, sizeof(*rank_ptrs)) : NULL;
  if (!addrs || !ptrs || !c->co->peers || (c->refound && (!ranks || !rank_ptrs))) {
    free(addrs), free(ptrs), free(ranks), free(rank_ptrs);
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory making the communicator ready");
    return;
  }
  for (int r = 0; r < n; r++) {
    snprintf(addrs[r], CCSD_ADDR_MAX, "%s", c->members[r]->remote ? c->members[r]->addr : c->co->self);
    ptrs[r] = addrs[r];
    if (!c->refound) continue;
    const struct coll_rejoin *rj = c->members[r]->rejoin;
    if (rj && !rj->wire) {
      free(addrs), free(ptrs), free(ranks), free(rank_ptrs);
      ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "rank %d came back without a report of its calls", r);
      return;
    }
    ccs__peer_rank__init(&ranks[r]);
    ranks[r].rank = (uint32_t)r;
    ranks[r].report = rj ? rj->wire : &no_call; /* a first init: no call made */
    rank_ptrs[r] = &ranks[r];
  }
  c->chunk_bytes = c->co->cfg.chunk_bytes;
  c->lanes = c->co->cfg.peer_connections;
  if (ccsd_span_map(c, addrs)) {
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory making the communicator ready");
  } else {
    struct peer_msg m = {.kind = PEER_READY,
                         .ready = {.name = c->name, .name_len = CCS__NAME_BYTES,
                                   .addrs = (const char *const *)ptrs, .naddrs = (size_t)n,
                                   .chunk_bytes = c->chunk_bytes, .lanes = (uint32_t)c->lanes,
                                   .ranks = (const Ccs__PeerRank *const *)rank_ptrs,
                                   .nranks = c->refound ? (size_t)n : 0}};
    for (int k = 0; k < c->nnodes; k++)
      if (k != c->mynode) ccsd_peers_send(c->co->peers, c->node_addr[k], &m);
    LOG_INFO(CCS_LOG_INIT, "comm %llu spans %d daemons", (unsigned long long)c->id, c->nnodes);
  }
  free(addrs), free(ptrs), free(ranks), free(rank_ptrs);
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
  /* the root before ready: the daemons ranks joined through, once each
   * (a set of their addresses: one pass, however many ranks) */
  struct seen {
    UT_hash_handle hh;
  } *set = NULL, *entries = calloc((size_t)c->nranks, sizeof(*entries)), *e;
  for (int r = 0, n = 0; r < c->nranks; r++) {
    const struct member *m = c->members[r];
    if (!m || !m->remote) continue;
    size_t len = strlen(m->addr);
    HASH_FIND(hh, set, m->addr, len, e);
    if (e) continue;
    if (entries) { /* without the set: a daemon is told twice, which is harmless */
      e = &entries[n++];
      HASH_ADD_KEYPTR(hh, set, m->addr, len, e);
    }
    fn(c, m->addr);
  }
  HASH_CLEAR(hh, set);
  free(entries);
}

int ccsd_span_node_of(const struct comm *c, const char *addr) {
  for (int k = 0; c->node_addr && k < c->nnodes; k++)
    if (!strcmp(c->node_addr[k], addr)) return k;
  return -1;
}

static void tell_failed(struct comm *c, const char *addr) {
  send_fail(c->co, addr, c->name, c->error, c->error_text, 0);
}

void ccsd_span_failed(struct comm *c) {
  if (!c->co->peers) return;
  if (!c->co->silent) for_each_other(c, tell_failed);
  if (c->net) ccsd_peers_comm_close(c->co->peers, c->net);
}

void ccsd_span_free(struct comm *c) {
  ccsd_agree_release(c);
  ccsd_regather_free(c);
  free(c->let_go);
  ccsd_hold_end(c);
  free(c->resumed);
  free(c->node_finished);
  free(c->node_kept);
  ccsd_replay_free(c);
  if (c->net) ccsd_peers_comm_free(c->co->peers, c->net);
  c->net = NULL;
  free(c->node_addr);
  free(c->node_of_rank);
  free(c->rank_of);
  free(c->node_first);
  free(c->p2p_counts);
}

static struct comm *find(struct coll *co, const uint8_t *name, size_t len) {
  return len == CCS__NAME_BYTES ? ccsd_comm_find(co, name) : NULL;
}

/* Whether the daemon at addr takes part in c (so may speak of it): a
 * daemon of its map, its root, or, at the root before it is ready, one
 * its ranks joined through. A daemon that names a comm it has no part in
 * is ignored (and logged): it cannot fail or steer other daemons' comms. */
static int involved(const struct comm *c, const char *addr) {
  if (!c->node_addr && c->regather) return ccsd_regather_involved(c, addr);
  if (!c->node_addr && ccsd_regather_involved(c, addr)) return 1; /* its word let go: it may fail it yet */
  if (c->node_addr) {
    for (int k = 0; k < c->nnodes; k++)
      if (k != c->mynode && !strcmp(c->node_addr[k], addr)) return 1;
    return 0;
  }
  /* (one ready here without a rank elsewhere, made again by inits sent
   * again, never spanned: its root has no part in it) */
  if (c->root[0]) return c->state != COMM_READY && !strcmp(c->root, addr);
  for (int r = 0; r < c->nranks; r++)
    if (c->members[r] && c->members[r]->remote && !strcmp(c->members[r]->addr, addr)) return 1;
  return 0;
}

/* A refusal of a peer's message, logged once where it is decided. */
static void refuse(const char *addr, const char *what, const char *why) {
  LOG_WARN("daemon at %s: %s refused: %s", addr, what, why);
}

/* The root: a rank joined through the daemon at addr. Every field is
 * checked before anything is made of it. */
static void on_join(struct coll *co, const char *addr, const struct peer_join *j) {
  struct ccs__unique_id id;
  char err[CCS__ERROR_TEXT_MAX];
  struct algo_rules rules;
  if (j->id_len != CCS_UNIQUE_ID_BYTES) { /* no name to answer to */
    refuse(addr, "a join", "its unique id is not 128 bytes");
    return;
  }
  memcpy(&id, j->id, sizeof(id));
  id.root[sizeof(id.root) - 1] = 0;
  uint8_t name[CCS__NAME_BYTES];
  ccsd_comm_name(&id, name);
  const char *algo = j->algo ? j->algo : "";
  ccs_result_t rc = CCS_OK;
  int named = id.magic == CCS__NAMED_ID_MAGIC; /* unsigned: its owner's ranks alone name it */
  if (named && (!ccs__protocol_served(id.protocol) || strcmp(id.root, co->self)))
    rc = CCS_ERR_INVALID_ARGUMENT, snprintf(err, sizeof(err), "a communicator by name meeting at %.60s, not at this daemon (%s)", id.root, co->self);
  else if (!named && (id.magic != CCS__UNIQUE_ID_MAGIC || !ccs__protocol_served(id.protocol) ||
                      strcmp(id.root, co->self) || !ccsd_unique_id_valid(co, &id)))
    rc = CCS_ERR_INVALID_ARGUMENT, snprintf(err, sizeof(err), "unique id not issued by the daemon at %s (or from before it restarted)", co->self);
  else if (!named && ccsd_unique_id_age(co, &id) < 0 && !(j->report && ccsd_rejoin_window_open(co)))
    rc = CCS_ERR_INVALID_ARGUMENT, snprintf(err, sizeof(err), "unique id expired (id_ttl %.0f s at the root daemon %s)", co->cfg.id_ttl_s, co->self);
  else if (j->uid != id.owner_uid) /* the joining daemon vouches for its client's uid */
    rc = CCS_ERR_PERMISSION, snprintf(err, sizeof(err), "this unique id belongs to another user's communicator");
  else if (j->nranks < 1 || j->nranks > CCSD_MAX_RANKS || j->rank >= j->nranks)
    rc = CCS_ERR_INVALID_ARGUMENT, snprintf(err, sizeof(err), "rank %u of %u ranks is out of range (1..%d ranks)", j->rank, j->nranks, CCSD_MAX_RANKS);
  else if (strlen(algo) >= sizeof(((struct comm *)0)->algo_text))
    rc = CCS_ERR_INVALID_ARGUMENT, snprintf(err, sizeof(err), "CCS_ALGO: longer than 511 characters");
  else if (ccsd_algo_rules_parse(algo, &rules, err + 10, sizeof(err) - 10))
    rc = CCS_ERR_INVALID_ARGUMENT, memcpy(err, "CCS_ALGO: ", 10);
  struct comm *c = rc == CCS_OK ? ccsd_comm_find(co, name) : NULL;
  /* a rank back after every daemon of its comm restarted; or one that
   * sent its init again (no channel), which joins a comm formed anew as a
   * first init does */
  if (rc == CCS_OK && j->report &&
      (j->report->n_channels || !c || c->state != COMM_JOINING || c->rejoining)) {
    ccsd_refound_join(co, addr, j, &id);
    return;
  }
  if (rc == CCS_OK && !c) {
    c = ccsd_comm_create(co, &id, (int)j->nranks, algo, (int)j->rank, &rc, err, sizeof(err));
    if (c) { /* held for the other daemons until it is ready or failed */
      c->coordinator = 1;
      ccsd_comm_ref(c);
    }
  }
  /* the same rank through the same daemon again: a made-again comm's
   * joins repeat (the last may cross the ready), and an init sent again
   * after its daemon restarted may find the first one here (the daemon's
   * loss not seen yet) */
  const struct member *before =
      rc == CCS_OK && (c->state == COMM_JOINING || (c->state == COMM_READY && c->rejoining)) &&
              j->rank < (uint32_t)c->nranks ? c->members[j->rank] : NULL;
  if (before && before->remote && !strcmp(before->addr, addr)) return;
  if (rc == CCS_OK && c->named && !c->label[0]) ccsd_comm_set_label(c, j->label);
  /* a name can be taken by another job by mistake: only the newcomer fails */
  int newcomer = rc == CCS_OK && c->named &&
                 (c->state != COMM_JOINING || ccsd_comm_check_join(c, (int)j->rank, (int)j->nranks, algo, j->pid));
  if (newcomer)
    rc = CCS_ERR_INVALID_ARGUMENT,
    ccsd_comm_named_conflict(c, j->label, (int)j->nranks, (int)j->rank, algo, err, sizeof(err));
  if (rc == CCS_OK && c->state != COMM_JOINING)
    rc = CCS_ERR_INVALID_USAGE, snprintf(err, sizeof(err), "communicator is %s", c->state == COMM_READY ? "complete" : c->error_text);
  if (rc != CCS_OK) {
    refuse(addr, "a join", err);
    send_fail(co, addr, name, rc, err, newcomer ? j->rank + 1 : 0);
    return;
  }
  if (ccsd_comm_check_join(c, (int)j->rank, (int)j->nranks, algo, j->pid) != CCS_OK) return;
  if (!ccsd_span_remote_member(c, (int)j->rank, j->pid, addr)) return;
  c->spans = 1;
  /* made again here, its own ranks back, and the others' inits sent again
   * (theirs failed as it formed): every daemon hears every rank's report */
  if (c->rejoining) c->refound = 1;
  if (++c->joined == c->nranks) ccsd_comm_ready(c);
}

/* A comm by name that the root completed with ranks of other daemons where
 * ranks of this one joined too: another job's, whose joins reached the
 * root after it was complete (its refusal is on its way). They are
 * refused here, as if they never came; 1 when no rank of the comm is left
 * here (the comm may be gone). */
static int refuse_newcomers(struct comm *c, char (*addrs)[CCSD_ADDR_MAX]) {
  ccsd_comm_ref(c);
  for (int r = 0; r < c->nranks; r++) {
    struct member *m = c->members[r];
    if (!m || m->remote || !m->init || !strcmp(addrs[r], c->co->self)) continue;
    char err[CCS__ERROR_TEXT_MAX];
    snprintf(err, sizeof(err), "rank %d of the communicator named '%s' of this user joined already "
             "at another daemon: another job with that name? (CCS_JOB names the job)", r,
             c->label[0] ? c->label : "(unnamed)");
    ccsd_member_answer_init(m, CCS_ERR_INVALID_ARGUMENT, err); /* its client's comm goes with it */
  }
  int none = c->nlocal == 0;
  ccsd_comm_unref(c);
  return none;
}

/* Another daemon's rank joined through us; the root says who is where.
 * The map is checked whole before any of it is used. */
static void on_ready(struct coll *co, const char *addr, const struct peer_ready *rd) {
  struct comm *c = find(co, rd->name, rd->name_len);
  if (!c || c->state != COMM_JOINING || strcmp(addr, c->root)) {
    if (c && strcmp(addr, c->root)) refuse(addr, "a rank map", "it is not the comm's root");
    return;
  }
  const char *bad = NULL;
  if (rd->naddrs != (size_t)c->nranks) bad = "it does not place every rank";
  else if (rd->chunk_bytes < CCSD_PEER_CHUNK_MIN || rd->chunk_bytes > CCSD_PEER_CHUNK_MAX)
    bad = "its chunk size is outside 4 KiB..64 MiB";
  else if (rd->lanes < 1 || rd->lanes > 64) bad = "its connections per pair are outside 1..64";
  for (int r = 0; r < c->nranks && !bad; r++)
    if (!rd->addrs[r] || strlen(rd->addrs[r]) >= CCSD_ADDR_MAX || !ccs_addr_is_numeric(rd->addrs[r]))
      bad = "it names a daemon by no numeric address";
  if (bad) {
    refuse(addr, "a rank map", bad);
    ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the root daemon at %s sent a bad rank map: %s", addr, bad);
    return;
  }
  char(*addrs)[CCSD_ADDR_MAX] = calloc((size_t)c->nranks, sizeof(*addrs));
  if (!addrs) {
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory");
    return;
  }
  for (int r = 0; r < c->nranks; r++) snprintf(addrs[r], CCSD_ADDR_MAX, "%s", rd->addrs[r]);
  if (c->named && refuse_newcomers(c, addrs)) { /* none of its ranks is here */
    free(addrs);
    return;
  }
  for (int r = 0; r < c->nranks && c->state == COMM_JOINING; r++) {
    int here = !strcmp(addrs[r], co->self);
    if (here != (c->members[r] != NULL)) {
      ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the root daemon at %s places rank %d %s", addr, r,
                     here ? "here, where it never joined" : "elsewhere, but it joined here");
    } else if (!here && !ccsd_span_remote_member(c, r, 0, addrs[r])) {
      break;
    }
  }
  if (c->state == COMM_JOINING && c->rejoining && ccsd_refound_reports(c, addr, rd)) {
    free(addrs);
    return;
  }
  c->chunk_bytes = rd->chunk_bytes;
  c->lanes = (int)rd->lanes;
  if (c->state == COMM_JOINING && ccsd_span_map(c, addrs))
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory");
  free(addrs);
  if (c->state == COMM_JOINING) ccsd_comm_ready(c);
}

/* A failure told by another daemon: its text is shown to this daemon's
 * ranks and logs, so it is cut to size and stripped of control bytes. */
static void on_fail(struct coll *co, const char *addr, const struct peer_fail *f) {
  struct comm *c = find(co, f->name, f->name_len);
  if (!c) return;
  if (!involved(c, addr)) {
    refuse(addr, "a failure", "it takes no part in that communicator");
    return;
  }
  char text[CCS__ERROR_TEXT_MAX];
  snprintf(text, sizeof(text), "%s", f->error ? f->error : "");
  for (char *p = text; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
  ccs_result_t status = f->status > 0 && f->status < 64 ? f->status : CCS_ERR_PEER_LOST;
  if (f->refused_rank) { /* the root refused one rank's join of a comm by name: it alone fails */
    if (status == CCS_ERR_RETRY) status = CCS_ERR_PEER_LOST; /* (a refusal: the same again) */
    struct member *m = c->named && c->state == COMM_JOINING && c->root[0] && !strcmp(addr, c->root) &&
                               f->refused_rank <= (uint32_t)c->nranks
                           ? c->members[f->refused_rank - 1] : NULL;
    if (m && !m->remote) ccsd_member_answer_init(m, status, text); /* its client's comm goes with it */
    return;
  }
  ccsd_comm_fail(c, status, "%s", text[0] ? text : "another daemon failed the communicator");
}

void ccsd_span_message(struct coll *co, const char *addr, const struct peer_msg *m) {
  switch (m->kind) {
  case PEER_JOIN: on_join(co, addr, &m->join); break;
  case PEER_READY: on_ready(co, addr, &m->ready); break;
  case PEER_OP: {
    struct comm *c = find(co, m->op.name, m->op.name_len);
    if (!c || c->state != COMM_READY || c->hold) break; /* words only settle ops of a ready comm */
    if (!involved(c, addr)) refuse(addr, "a word on an op", "it takes no part in that communicator");
    else ccsd_agree_message(c, addr, &m->op);
    break;
  }
  case PEER_FAIL: on_fail(co, addr, &m->fail); break;
  case PEER_REJOIN: ccsd_regather_message(co, addr, &m->rejoin); break;
  case PEER_RESUME: {
    struct comm *c = find(co, m->resume.name, m->resume.name_len);
    if (c && c->state == COMM_READY) ccsd_hold_resume(c, addr, &m->resume);
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

/* The comm's ranks at the daemon at addr (NULL: at every other daemon)
 * let go: they come back with their reports. */
static void forget_ranks_at(struct comm *c, const char *addr) {
  for (int r = 0; r < c->nranks; r++) {
    struct member *m = c->members[r];
    if (!m || !m->remote || (addr && strcmp(m->addr, addr))) continue;
    ccsd_rejoin_free(m->rejoin);
    free(m);
    c->members[r] = NULL;
    c->joined--;
  }
}

/* How a comm fails for a daemon lost or stopping: one forming (its
 * first time, or again from inits sent again) has each rank send its init
 * again (libccs) to meet that daemon once it is back; any other fails
 * (ccsd_comm_fail keeps to that). */
static ccs_result_t daemon_gone_status(const struct comm *c) {
  return ccsd_comm_forming(c) ? CCS_ERR_RETRY : CCS_ERR_PEER_LOST;
}

/* This daemon stops: its comms with ranks elsewhere fail for every daemon,
 * saying so (not as the first of its ranks that happens to be closed);
 * where the others wait for a daemon to come back, it says nothing: a
 * stop is a restart to them until peer_restart_grace says otherwise. */
void ccsd_span_stopping(struct coll *co) {
  co->silent = co->cfg.peer_restart_grace_s > 0;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &co->comms) {
    struct comm *c = LIST_ENTRY(it, struct comm, link);
    if (c->gone || c->state == COMM_FAILED || (!c->spans && !c->root[0])) continue;
    char ranks[256];
    size_t n = 0;
    ranks[0] = 0;
    for (int r = 0; r < c->nranks && n + 16 < sizeof(ranks); r++)
      if (c->members[r] && !c->members[r]->remote)
        n += (size_t)snprintf(ranks + n, sizeof(ranks) - n, n ? ",%d" : "%d", r);
    ccsd_comm_fail(c, daemon_gone_status(c), "the daemon at %s serving rank(s) %s is stopping", co->self,
                   ranks);
  }
}

int ccsd_span_drain_step(struct coll *co) {
  int busy = 0;
  struct list *it, *tmp, *x, *xtmp;
  LIST_FOREACH_SAFE(it, tmp, &co->comms) {
    struct comm *c = LIST_ENTRY(it, struct comm, link);
    if (c->gone || c->state != COMM_READY || !c->spans || !c->net) continue;
    LIST_FOREACH_SAFE(x, xtmp, &c->running)
      if (LIST_ENTRY(x, struct xop, comm_link)->run.plan.net_items) busy = 1;
    /* stopped now, the other daemon would count it sent and this one
     * not taken: a comm no restart makes whole */
    int holds = ccsd_peers_comm_holds(co->peers, c->net);
    if (holds) busy = 1;
    if (holds >= 0) c->owed = holds;
    if (c->owed) ccsd_comm_launch_queued(c);
  }
  return busy;
}

void ccsd_span_peer_lost(struct coll *co, const char *addr, const char *why) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &co->comms) {
    struct comm *c = LIST_ENTRY(it, struct comm, link);
    if (c->gone || c->state == COMM_FAILED) continue;
    char ranks[256];
    ranks_at(c, addr, ranks, sizeof(ranks));
    int involved = ranks[0] || !strcmp(c->root, addr);
    if (!involved) continue;
    /* rejoining, the root not back yet: its ranks' reports go again (refound.c) */
    if (c->rejoining && c->state == COMM_JOINING && !ranks[0] && !c->regather) continue;
    /* made again here, the root, and that daemon went again: its ranks
     * come back through it once more, their reports with them */
    if (c->rejoining && c->state == COMM_JOINING && !c->root[0] && !c->regather) {
      forget_ranks_at(c, addr);
      continue;
    }
    /* rejoining from the word of the daemons that held it, and one of them
     * went before it settled (stopped a moment after this one): none may
     * hold it now, so it is made again through its root as when every
     * daemon restarted; one that still holds it says so again */
    if (c->rejoining && c->state == COMM_JOINING && c->regather && ranks[0]) {
      LOG_WARN("comm %llu: the daemon at %s went as it rejoined from its word (%s); made again through "
               "the root if no daemon holds it", (unsigned long long)c->id, addr, why);
      /* (a holder's word repeated after its let-go takes the map again:
       * the daemon already lost is not lost twice) */
      if (!ccsd_regather_was_let_go(c, addr)) co->restarts[RESTART_HOLDER_LOST]++;
      forget_ranks_at(c, NULL);
      ccsd_regather_let_go(c);
      ccsd_refound_wait(c, !ccsd_comm_forming(c));
      continue;
    }
    if (ranks[0] && ccsd_hold_start(c, ccsd_span_node_of(c, addr), why) == 0) continue; /* it may come back */
    ccs_result_t status = daemon_gone_status(c);
    if (ranks[0])
      ccsd_comm_fail(c, status, "the daemon at %s serving rank(s) %s is unreachable: %s", addr, ranks, why);
    else
      ccsd_comm_fail(c, status, "the root daemon at %s is unreachable: %s", addr, why);
  }
}
