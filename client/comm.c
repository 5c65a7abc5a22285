/* Communicators on the client side: a handle on the daemon's comm. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "call.h"
#include "launcher.h"

CCS__API ccs_result_t ccs_get_unique_id(ccs_unique_id_t *id) {
  if (!id) {
    ccs__set_error("ccs_get_unique_id: id is NULL");
    return CCS_ERR_INVALID_ARGUMENT;
  }
  struct ccs__conn *c;
  ccs_result_t rc = ccs__conn_get(&c);
  if (rc != CCS_OK) return rc;
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__GetUniqueId m = CCS__GET_UNIQUE_ID__INIT;
  req.body_case = CCS__REQUEST__BODY_GET_UNIQUE_ID;
  req.get_unique_id = &m;
  Ccs__Reply *reply;
  rc = ccs__conn_call(c, &req, -1, &reply);
  ccs__conn_put(c);
  if (rc != CCS_OK) return rc;
  if (reply->body_case != CCS__REPLY__BODY_UNIQUE_ID ||
      reply->unique_id->id.len != CCS_UNIQUE_ID_BYTES) {
    ccs__reply__free_unpacked(reply, NULL);
    ccs__set_error("daemon sent a malformed unique id");
    return CCS_ERR_PROTOCOL;
  }
  memcpy(id->internal, reply->unique_id->id.data, CCS_UNIQUE_ID_BYTES);
  ccs__reply__free_unpacked(reply, NULL);
  return CCS_OK;
}

/* How a comm is found: by id, by name (the daemons meeting at root), or
 * derived from a parent this connection holds. */
struct join {
  const ccs_unique_id_t *id;
  const char *name, *root;
  const ccs_comm_t *parent;
  const char *derive;
  int root_rank;
  const ccs_comm_config_t *config; /* NULL: the parent's options, else the defaults */
};

/* The priority a comm asks for: the config's, else the parent's, else
 * CCS_PRIORITY's, else normal; -1 (the error set) when none of them is one. */
static int priority_of(const char *what, const struct join *j) {
  const ccs_comm_config_t *cfg = j->config;
  int p = CCS_PRIORITY_DEFAULT;
  if (cfg && cfg->size >= offsetof(ccs_comm_config_t, priority) + sizeof(cfg->priority))
    p = cfg->priority;
  if (p == CCS_PRIORITY_DEFAULT && j->parent) return j->parent->priority;
  if (p != CCS_PRIORITY_DEFAULT) {
    if (p >= CCS_PRIORITY_NORMAL && p <= CCS_PRIORITY_BULK) return p;
    ccs__set_error("%s: priority %d is none of CCS_PRIORITY_NORMAL, _LATENCY, _BULK", what, p);
    return -1;
  }
  static const char *const names[] = {"normal", "latency", "bulk"};
  const char *env = getenv("CCS_PRIORITY");
  if (!env || !*env) return CCS_PRIORITY_NORMAL;
  for (int i = 0; i < 3; i++)
    if (!strcasecmp(env, names[i])) return i;
  ccs__set_error("CCS_PRIORITY=%s: latency, normal or bulk expected", env);
  return -1;
}

/* Tests only: CCS_TEST_INIT_PAUSE_MS (up to 10 s) widens the moment
 * between an init's answer and its comm being tracked, which a daemon
 * dying in it must not escape (test_restart). Unset, it costs a getenv
 * per init. */
static void answered_pause(void) {
  const char *v = getenv("CCS_TEST_INIT_PAUSE_MS");
  long ms = v ? strtol(v, NULL, 10) : 0;
  if (ms <= 0 || ms > 10000) return;
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) && errno == EINTR) {}
}

/* The init request, sent again while the comm it would make is cut short
 * by a daemon's restart, for up to CCS_RECONNECT_TIMEOUT: this rank's own
 * (its connection lost), or another of the comm's (CCS_ERR_RETRY: every
 * daemon of the comm failed it as it formed, and every rank sends its
 * init again, to meet once that daemon is back). Not for a comm derived
 * from a parent, which its daemon makes from the parent's handle.
 *
 * Where its own daemon went, the comm may have been complete, this rank's
 * answer lost with the daemon: it goes again as a rejoin reporting no
 * channel (it made no call), which joins the comm made again by the other
 * ranks' rejoins, or, where it formed nowhere, makes it as a first init
 * (docs/restart.md).
 *
 * An init answered counts as joining on cm->conn until its comm is
 * tracked: a daemon that goes just after the answer has it rejoined. */
static ccs_result_t init_call(struct ccs_comm *cm, Ccs__Request *req, const struct join *j,
                              Ccs__Reply **reply) {
  struct ccs__ride ride = {0};
  Ccs__Rejoin no_call = CCS__REJOIN__INIT;
  for (;;) {
    ccs__conn_joining(cm->conn, 1);
    ccs_result_t rc = ccs__conn_call(cm->conn, req, -1, reply);
    if (rc == CCS_OK) return rc;
    ccs__conn_joining(cm->conn, 0);
    if (rc != CCS_ERR_DAEMON_UNAVAILABLE && rc != CCS_ERR_RETRY) return rc;
    if (rc == CCS_ERR_DAEMON_UNAVAILABLE) req->comm_init->rejoin = &no_call;
    if (j->parent || !ccs__ride_again(&cm->conn, &ride))
      return rc == CCS_ERR_RETRY ? CCS_ERR_PEER_LOST : rc; /* that daemon is not back: as it said */
  }
}

static ccs_result_t init(const char *what, ccs_comm_t **comm, int nranks, const struct join *j,
                         int rank) {
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks) {
    ccs__set_error("%s: need a comm pointer and 0 <= rank (%d) < nranks (%d)", what, rank,
                   nranks);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  /* CCS_TIMEOUT: seconds an op of this comm may wait for its ranks */
  const char *timeout = getenv("CCS_TIMEOUT");
  double timeout_s = 0;
  if (timeout && *timeout) {
    char *end;
    timeout_s = strtod(timeout, &end);
    if (*end || !(timeout_s >= 0.001 && timeout_s <= 4e6)) {
      ccs__set_error("CCS_TIMEOUT=%s: seconds between 0.001 and 4e6 expected", timeout);
      return CCS_ERR_INVALID_ARGUMENT;
    }
  }
  int priority = priority_of(what, j);
  if (priority < 0) return CCS_ERR_INVALID_ARGUMENT;
  struct ccs_comm *cm = calloc(1, sizeof(*cm));
  if (!cm) {
    ccs__set_error("out of memory");
    return CCS_ERR_NO_MEMORY;
  }
  cm->priority = priority;
  ccs_result_t rc = CCS_OK;
  if (j->parent) cm->conn = ccs__comm_conn((ccs_comm_t *)j->parent); /* it knows the parent */
  else rc = ccs__conn_get(&cm->conn);
  if (rc == CCS_OK && ccs__chan_of(cm, -1, 0) != 0) { /* [0]: its collectives */
    ccs__conn_put(cm->conn);
    ccs__set_error("out of memory");
    rc = CCS_ERR_NO_MEMORY;
  }
  if (rc != CCS_OK) {
    free(cm->chans);
    free(cm);
    return rc;
  }
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__CommInit m = CCS__COMM_INIT__INIT;
  if (j->id) {
    m.id.data = (uint8_t *)j->id->internal;
    m.id.len = CCS_UNIQUE_ID_BYTES;
  } else if (j->parent) {
    m.parent = j->parent->handle;
    m.derive = (char *)j->derive;
    m.root_rank = (uint32_t)j->root_rank;
  } else {
    m.name = (char *)j->name;
    m.root = (char *)j->root;
  }
  m.nranks = (uint32_t)nranks;
  m.rank = (uint32_t)rank;
  m.op_timeout_ms = (uint32_t)(timeout_s * 1000);
  m.priority = (uint32_t)priority;
  /* CCS_ALGO: algorithm rules for this comm's ops (the daemon checks them);
   * CCS_DEBUG=INFO: say on stderr which algorithm each op used and why */
  const char *algo = getenv("CCS_ALGO"), *debug = getenv("CCS_DEBUG");
  m.algo = (char *)(algo ? algo : "");
  cm->debug = debug && (!strcasecmp(debug, "INFO") || !strcasecmp(debug, "TRACE"));
  m.debug = cm->debug;
  req.body_case = CCS__REQUEST__BODY_COMM_INIT;
  req.comm_init = &m;
  Ccs__Reply *reply;
  rc = init_call(cm, &req, j, &reply);
  if (rc == CCS_OK) answered_pause();
  if (rc == CCS_OK && reply->body_case != CCS__REPLY__BODY_COMM_INIT) {
    ccs__reply__free_unpacked(reply, NULL);
    ccs__conn_joining(cm->conn, 0);
    ccs__set_error("daemon sent no communicator handle");
    rc = CCS_ERR_PROTOCOL;
  }
  if (rc != CCS_OK) {
    ccs__conn_put(cm->conn);
    free(cm->chans);
    free(cm);
    return rc;
  }
  cm->handle = reply->comm_init->comm;
  cm->nranks = nranks;
  cm->rank = rank;
  /* what rejoins it after a restart (restart.c) */
  if (reply->comm_init->id.len == sizeof(cm->id)) {
    memcpy(cm->id, reply->comm_init->id.data, sizeof(cm->id));
    cm->has_id = 1;
  }
  cm->spans = reply->comm_init->spans;
  cm->op_timeout_ms = m.op_timeout_ms;
  cm->algo = strdup(m.algo);
  ccs__reply__free_unpacked(reply, NULL);
  ccs__comm_track(cm);
  ccs__conn_joining(cm->conn, 0);
  ccs__keeper_start(cm->conn);
  *comm = cm;
  return CCS_OK;
}

CCS__API ccs_result_t ccs_comm_init_rank(ccs_comm_t **comm, int nranks, ccs_unique_id_t id,
                                         int rank) {
  struct join j = {.id = &id};
  return init("ccs_comm_init_rank", comm, nranks, &j, rank);
}

CCS__API ccs_result_t ccs_comm_init_rank_config(ccs_comm_t **comm, int nranks, ccs_unique_id_t id,
                                                int rank, const ccs_comm_config_t *config) {
  struct join j = {.id = &id, .config = config};
  return init("ccs_comm_init_rank_config", comm, nranks, &j, rank);
}

#define NAME_MAX_BYTES 200

static const char *env_of(const char *name, void *arg) {
  (void)arg;
  return getenv(name);
}

static ccs_result_t init_named(const char *what, ccs_comm_t **comm, const char *name, int nranks,
                               int rank, const char *root) {
  if (!name || !*name || strlen(name) > NAME_MAX_BYTES) {
    ccs__set_error("%s: a name of 1 to %d bytes expected", what, NAME_MAX_BYTES);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  struct join j = {.name = name, .root = root};
  return init(what, comm, nranks, &j, rank);
}

CCS__API ccs_result_t ccs_comm_init_named(ccs_comm_t **comm, const char *name, int nranks,
                                          int rank) {
  char err[512], root[64];
  if (ccs__launch_root(env_of, NULL, root, sizeof(root), err, sizeof(err))) {
    ccs__set_error("ccs_comm_init_named: %s", err);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  return init_named("ccs_comm_init_named", comm, name, nranks, rank, root);
}

CCS__API ccs_result_t ccs_comm_init_from_env(ccs_comm_t **comm) {
  struct ccs__launch l;
  char err[512];
  int found = ccs__launch_read(env_of, NULL, &l, err, sizeof(err));
  if (found) { /* none: a usage error (not started by a launcher); else its variables are wrong */
    ccs__set_error("ccs_comm_init_from_env: %s", err);
    return found > 0 ? CCS_ERR_INVALID_USAGE : CCS_ERR_INVALID_ARGUMENT;
  }
  return init_named("ccs_comm_init_from_env", comm, l.job, l.nranks, l.rank, l.root);
}

static ccs_result_t comm_leave(ccs_comm_t *comm, int abort) {
  if (!comm) {
    ccs__set_error("communicator is NULL");
    return CCS_ERR_INVALID_ARGUMENT;
  }
  ccs__comm_untrack(comm);
  ccs__conn_put(ccs__comm_conn(comm)); /* (after a restart: on the connection its keeper made) */
  /* its streams' calls first (an abort lets them end as they will) */
  if (!abort && comm->inflight) ccs__ring_wait_idle(comm->conn, &comm->inflight);
  ccs__ring_forget_comm(comm->conn, comm);
  ccs__host_streams_forget_comm(comm);
  if (!comm->conn->broken) {
    Ccs__Request req = CCS__REQUEST__INIT;
    Ccs__CommDestroy d = CCS__COMM_DESTROY__INIT;
    Ccs__CommAbort a = CCS__COMM_ABORT__INIT;
    d.comm = a.comm = comm->handle;
    if (abort) {
      req.body_case = CCS__REQUEST__BODY_COMM_ABORT;
      req.comm_abort = &a;
    } else {
      req.body_case = CCS__REQUEST__BODY_COMM_DESTROY;
      req.comm_destroy = &d;
    }
    Ccs__Reply *reply;
    /* The local handle goes whatever the daemon says: a daemon that is
     * gone has already forgotten the comm. */
    if (ccs__conn_call(comm->conn, &req, -1, &reply) == CCS_OK)
      ccs__reply__free_unpacked(reply, NULL);
  }
  ccs__conn_put(comm->conn);
  ccs__parts_free(comm);
  free(comm->algo);
  free(comm->chans);
  free(comm);
  return CCS_OK;
}

CCS__API ccs_result_t ccs_comm_destroy(ccs_comm_t *comm) { return comm_leave(comm, 0); }
CCS__API ccs_result_t ccs_comm_abort(ccs_comm_t *comm) { return comm_leave(comm, 1); }

CCS__API ccs_result_t ccs_comm_count(const ccs_comm_t *comm, int *count) {
  if (!comm || !count) return CCS_ERR_INVALID_ARGUMENT;
  *count = comm->nranks;
  return CCS_OK;
}

CCS__API ccs_result_t ccs_comm_user_rank(const ccs_comm_t *comm, int *rank) {
  if (!comm || !rank) return CCS_ERR_INVALID_ARGUMENT;
  *rank = comm->rank;
  return CCS_OK;
}

CCS__API ccs_result_t ccs_comm_get_async_error(ccs_comm_t *comm, ccs_result_t *async_error) {
  if (!comm || !async_error) return CCS_ERR_INVALID_ARGUMENT;
  if (comm->async_error == CCS_OK) {
    Ccs__Request req = CCS__REQUEST__INIT;
    Ccs__CommQuery q = CCS__COMM_QUERY__INIT;
    struct ccs__conn *c = ccs__comm_conn(comm);
    q.comm = comm->handle;
    req.body_case = CCS__REQUEST__BODY_COMM_QUERY;
    req.comm_query = &q;
    Ccs__Reply *reply;
    ccs_result_t rc = ccs__conn_call(c, &req, -1, &reply);
    ccs__conn_put(c);
    if (rc == CCS_OK) ccs__reply__free_unpacked(reply, NULL);
    else {
      comm->async_error = rc;
      snprintf(comm->last_error, sizeof(comm->last_error), "%s", ccs__error());
    }
  }
  *async_error = comm->async_error;
  return CCS_OK;
}

CCS__API const char *ccs_comm_last_error(const ccs_comm_t *comm) {
  return comm ? comm->last_error : ccs__error();
}

/* --- comms from comms --- */

/* The parent's next derived comm: its ranks derive in the same order. */
static uint32_t next_epoch(ccs_comm_t *c) { return ++c->derived; }

struct split_entry {
  int32_t color, key;
};

CCS__API ccs_result_t ccs_comm_split(ccs_comm_t *comm, int color, int key, ccs_comm_t **newcomm,
                                     const ccs_comm_config_t *config) {
  if (!comm || !newcomm || (color < 0 && color != CCS_SPLIT_NOCOLOR)) {
    ccs__set_error("ccs_comm_split: a comm, a place for the new one and a color >= 0 (or "
                   "CCS_SPLIT_NOCOLOR) are needed");
    return CCS_ERR_INVALID_ARGUMENT;
  }
  uint32_t epoch = next_epoch(comm);
  int n = comm->nranks;
  struct split_entry *all = malloc(sizeof(*all) * (size_t)n), mine = {color, key};
  if (!all) {
    ccs__set_error("out of memory");
    return CCS_ERR_NO_MEMORY;
  }
  /* every rank's color and key, everywhere (the parent's collective) */
  ccs_result_t rc = ccs_all_gather(&mine, all, 2, CCS_INT32, comm, NULL);
  if (rc != CCS_OK) {
    free(all);
    return rc;
  }
  *newcomm = NULL;
  if (color == CCS_SPLIT_NOCOLOR) {
    free(all);
    return CCS_OK;
  }
  /* ranks of this color ordered by key, then parent rank; the first's
   * daemon is where the new comm's daemons meet */
  int size = 0, rank = 0, first = -1;
  for (int r = 0; r < n; r++) {
    if (all[r].color != color) continue;
    size++;
    if (first < 0) first = r;
    if (all[r].key < key || (all[r].key == key && r < comm->rank)) rank++;
  }
  free(all);
  char tag[64];
  snprintf(tag, sizeof(tag), "split/%u/%d", epoch, color);
  struct join j = {.parent = comm, .derive = tag, .root_rank = first, .config = config};
  return init("ccs_comm_split", newcomm, size, &j, rank);
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

CCS__API ccs_result_t ccs_comm_shrink(ccs_comm_t *comm, const int *exclude, int nexclude,
                                      ccs_comm_t **newcomm, int flags) {
  if (!comm || !newcomm || nexclude < 0 || (nexclude && !exclude) || (flags & ~CCS_SHRINK_ABORT)) {
    ccs__set_error("ccs_comm_shrink: a comm, a place for the new one, the ranks to leave out and "
                   "flags of CCS_SHRINK_ABORT are needed");
    return CCS_ERR_INVALID_ARGUMENT;
  }
  int n = comm->nranks, *out = malloc(sizeof(int) * (size_t)(nexclude + 1));
  if (!out) {
    ccs__set_error("out of memory");
    return CCS_ERR_NO_MEMORY;
  }
  if (nexclude) memcpy(out, exclude, sizeof(int) * (size_t)nexclude);
  qsort(out, (size_t)nexclude, sizeof(int), cmp_int);
  int kept = 0;
  for (int i = 0; i < nexclude; i++) {
    if (out[i] < 0 || out[i] >= n) {
      ccs__set_error("ccs_comm_shrink: rank %d is not one of the %d ranks", out[i], n);
      free(out);
      return CCS_ERR_INVALID_ARGUMENT;
    }
    if (i == 0 || out[i] != out[i - 1]) out[kept++] = out[i]; /* each once */
  }
  /* the new rank (the survivors in their order), the first survivor, and
   * a tag naming exactly which ranks left: survivors that disagree on it
   * make different comms, and say so at the init deadline */
  int rank = comm->rank, first = -1;
  char tag[220];
  int at = snprintf(tag, sizeof(tag), "shrink/%u", next_epoch(comm));
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < kept; i++) {
    if (out[i] == comm->rank) {
      ccs__set_error("ccs_comm_shrink: this rank (%d) is one of those left out", comm->rank);
      free(out);
      return CCS_ERR_INVALID_ARGUMENT;
    }
    if (out[i] < comm->rank) rank--;
    h = (h ^ (uint64_t)out[i]) * 1099511628211ull;
  }
  for (int r = 0, i = 0; r < n && first < 0; r++) {
    while (i < kept && out[i] < r) i++;
    if (i == kept || out[i] != r) first = r;
  }
  snprintf(tag + at, sizeof(tag) - (size_t)at, "/%d/%016llx", kept, (unsigned long long)h);
  free(out);
  if (flags & CCS_SHRINK_ABORT) ccs_comm_revoke(comm); /* its ops end first */
  struct join j = {.parent = comm, .derive = tag, .root_rank = first};
  return init("ccs_comm_shrink", newcomm, n - kept, &j, rank);
}

CCS__API ccs_result_t ccs_comm_revoke(ccs_comm_t *comm) {
  if (!comm) {
    ccs__set_error("ccs_comm_revoke: comm is NULL");
    return CCS_ERR_INVALID_ARGUMENT;
  }
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__CommRevoke m = CCS__COMM_REVOKE__INIT;
  struct ccs__conn *c = ccs__comm_conn(comm);
  m.comm = comm->handle;
  req.body_case = CCS__REQUEST__BODY_COMM_REVOKE;
  req.comm_revoke = &m;
  Ccs__Reply *reply;
  ccs_result_t rc = ccs__conn_call(c, &req, -1, &reply);
  ccs__conn_put(c);
  if (rc == CCS_OK) ccs__reply__free_unpacked(reply, NULL);
  return rc;
}

CCS__API ccs_result_t ccs_comm_grow(ccs_comm_t *comm, int nranks, ccs_unique_id_t id, int rank,
                                    ccs_comm_t **newcomm) {
  if (comm && nranks < comm->nranks) {
    ccs__set_error("ccs_comm_grow: %d ranks, fewer than the comm's %d", nranks, comm->nranks);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  if (!comm && (rank < 0 || rank >= nranks)) {
    ccs__set_error("ccs_comm_grow: a newcomer's rank (%d) lies in 0 .. %d", rank, nranks - 1);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  ccs_comm_config_t same = CCS_COMM_CONFIG_INIT; /* old ranks keep the comm's options */
  if (comm) same.priority = comm->priority;
  struct join j = {.id = &id, .config = &same};
  return init("ccs_comm_grow", newcomm, nranks, &j, comm ? comm->rank : rank);
}

CCS__API ccs_result_t ccs_comm_finalize(ccs_comm_t *comm) {
  if (!comm) {
    ccs__set_error("ccs_comm_finalize: comm is NULL");
    return CCS_ERR_INVALID_ARGUMENT;
  }
  struct ccs__conn *c = ccs__comm_conn(comm);
  ccs_result_t rc = comm->inflight ? ccs__ring_wait_idle(c, &comm->inflight) : CCS_OK;
  ccs__conn_put(c);
  if (rc == CCS_OK && comm->async_error != CCS_OK) {
    ccs__set_error("%s", comm->last_error);
    rc = comm->async_error;
  }
  return rc;
}
