/* Host streams: a call on host buffers given one returns once it is
 * submitted, as a CUDA-stream call returns once it is enqueued. Its ops
 * go through the rings marked ordered, so the daemon runs them after the
 * comm's earlier ops (the next may read what the last wrote); its answer
 * is taken by whichever thread next looks at the rings, and lands here:
 * the count in flight, and the first failure, which synchronize (or
 * query) reports. What cannot go asynchronously (no rings, staged
 * buffers, sends and receives, a debug comm, another comm's ops) first
 * waits for what the stream has in flight, then runs as a call with no
 * stream: the order holds either way. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ccs__host_stream *registry;

struct ccs__host_stream *ccs__host_stream_of(const void *s) {
  if (!s) return NULL;
  pthread_mutex_lock(&registry_mu);
  struct ccs__host_stream *it = registry;
  while (it && (const void *)it != s) it = it->next;
  pthread_mutex_unlock(&registry_mu);
  return it;
}

ccs_result_t ccs__host_stream_drain(struct ccs__host_stream *s) {
  /* a reference for the wait: a restart's keeper may free the connection
   * meanwhile (the registry's lock keeps it until it is taken or seen
   * going) */
  if (!s->conn) return CCS_OK; /* nothing in flight: no lock taken */
  pthread_mutex_lock(&registry_mu);
  struct ccs__conn *c = s->conn;
  if (c && !ccs__conn_ref_live(c)) c = NULL;
  pthread_mutex_unlock(&registry_mu);
  if (!c) return CCS_OK;
  ccs_result_t rc = c->ring ? ccs__ring_wait_idle(c, &s->inflight) : CCS_OK;
  if (rc != CCS_OK && ccs__conn_moving(c)) {
    /* the daemon went, and c's keeper settles the stream's calls (each
     * finished, or to repeat) */
    struct ccs__conn *next = ccs__conn_successor(c);
    if (next) ccs__conn_put(next);
  }
  /* settled (also by a keeper through before the wait saw c break): its
   * verdicts are the answers */
  if (rc != CCS_OK && (s->conn != c || !s->inflight)) rc = s->error;
  if (rc != CCS_OK && s->error == CCS_OK) {
    s->error = rc;
    snprintf(s->error_text, sizeof(s->error_text), "%s", ccs__error());
  }
  ccs__conn_put(c);
  return rc;
}

/* A call of comm on another stream after one to repeat would take the
 * number the repeat takes at the ranks that did not make it yet, and be
 * matched with it there: every stream holds back until each stream that
 * owes comm a repeat is synchronized (and a daemon that dropped the call
 * refuses one made before its client saw that: front/submit.c). */
ccs_result_t ccs__host_stream_refuse(struct ccs__host_stream *s, ccs_comm_t *comm) {
  int mine = atomic_load(&s->to_repeat) != 0;
  if (!mine && (s->parts || !atomic_load(&comm->owed))) return CCS_OK;
  atomic_fetch_add(&s->to_repeat, 1);
  ccs__host_stream_owes(s, comm);
  if (mine)
    ccs__set_error("not made: an earlier call of this host stream must be repeated (ccsd restarted "
                   "under it); ccs_stream_synchronize, then repeat the stream's last "
                   "ccs_stream_repeat_count calls");
  else
    ccs__set_error("not made: an earlier call of this communicator on another host stream must be "
                   "repeated (ccsd restarted under it); synchronize the streams, then repeat each "
                   "one's last ccs_stream_repeat_count calls, in their order");
  snprintf(comm->last_error, sizeof(comm->last_error), "%s", ccs__error());
  return CCS_ERR_RETRY;
}

void ccs__host_stream_owes(struct ccs__host_stream *s, ccs_comm_t *comm) {
  if (s->parts) return;
  pthread_mutex_lock(&registry_mu);
  size_t k = 0;
  while (k < s->nowes && s->owes[k] != comm) k++;
  if (k == s->nowes && s->nowes == s->owes_cap) {
    size_t cap = s->owes_cap ? 2 * s->owes_cap : 2;
    ccs_comm_t **grown = realloc(s->owes, cap * sizeof(*grown));
    if (grown) s->owes = grown, s->owes_cap = cap;
  }
  int added = k == s->nowes && s->nowes < s->owes_cap;
  if (added) {
    s->owes[s->nowes++] = comm;
    atomic_fetch_add(&comm->owed, 1);
  }
  pthread_mutex_unlock(&registry_mu);
  if (k == s->nowes && !added) { /* its calls could be misnumbered: it ends here */
    ccs__comm_failed(comm, CCS_ERR_NO_MEMORY, "out of memory noting a host stream's call to repeat");
    if (comm->async_error == CCS_OK) comm->async_error = CCS_ERR_NO_MEMORY;
  }
}

/* Under registry_mu: s owes nothing (synchronized, or destroyed). */
static void owes_nothing(struct ccs__host_stream *s) {
  for (size_t k = 0; k < s->nowes; k++) atomic_fetch_sub(&s->owes[k]->owed, 1);
  s->nowes = 0;
}

void ccs__host_streams_forget_comm(const ccs_comm_t *comm) {
  pthread_mutex_lock(&registry_mu);
  for (struct ccs__host_stream *s = registry; s; s = s->next)
    for (size_t k = 0; k < s->nowes; k++)
      if (s->owes[k] == comm) s->owes[k--] = s->owes[--s->nowes];
  pthread_mutex_unlock(&registry_mu);
}

void ccs__host_streams_conn_gone(struct ccs__conn *c) {
  pthread_mutex_lock(&registry_mu);
  for (struct ccs__host_stream *s = registry; s; s = s->next) {
    if (s->conn != c) continue;
    if (s->inflight && s->error == CCS_OK) { /* answers that can never come */
      s->error = CCS_ERR_DAEMON_UNAVAILABLE;
      snprintf(s->error_text, sizeof(s->error_text), "the connection to ccsd closed with %u "
               "call(s) of this stream unanswered", s->inflight);
    }
    s->inflight = 0;
    s->conn = NULL;
    s->comm = NULL;
  }
  pthread_mutex_unlock(&registry_mu);
}

CCS__API ccs_result_t ccs_stream_create(ccs_stream_t *stream) {
  if (!stream) {
    ccs__set_error("ccs_stream_create: stream is NULL");
    return CCS_ERR_INVALID_ARGUMENT;
  }
  struct ccs__host_stream *s = calloc(1, sizeof(*s));
  if (!s) {
    ccs__set_error("out of memory");
    return CCS_ERR_NO_MEMORY;
  }
  pthread_mutex_lock(&registry_mu);
  s->next = registry;
  registry = s;
  pthread_mutex_unlock(&registry_mu);
  *stream = s;
  return CCS_OK;
}

static struct ccs__host_stream *known(ccs_stream_t stream, const char *what) {
  struct ccs__host_stream *s = ccs__host_stream_of(stream);
  if (!s) ccs__set_error("%s: not a stream of ccs_stream_create (a CUDA stream orders itself)", what);
  return s;
}

CCS__API ccs_result_t ccs_stream_synchronize(ccs_stream_t stream) {
  struct ccs__host_stream *s = known(stream, "ccs_stream_synchronize");
  if (!s) return CCS_ERR_INVALID_ARGUMENT;
  ccs__host_stream_drain(s);
  ccs_result_t rc = s->error;
  if (rc != CCS_OK) ccs__set_error("%s", s->error_text);
  s->error = CCS_OK; /* reported once */
  pthread_mutex_lock(&registry_mu);
  s->repeat_count = atomic_exchange(&s->to_repeat, 0);
  owes_nothing(s);
  pthread_mutex_unlock(&registry_mu);
  if (s->repeat_count && rc != CCS_ERR_RETRY) { /* an earlier call failed otherwise: the repeat said too */
    char first[CCS__ERROR_TEXT_MAX];
    snprintf(first, sizeof(first), "%s", ccs__error());
    ccs__set_error("ccsd restarted under this stream's calls: repeat its last %u (an earlier call "
                   "failed too: %s: %.300s)", s->repeat_count, ccs_result_name(rc), first);
    rc = CCS_ERR_RETRY;
  }
  return rc;
}

CCS__API ccs_result_t ccs_stream_repeat_count(ccs_stream_t stream, int *count) {
  struct ccs__host_stream *s = known(stream, "ccs_stream_repeat_count");
  if (!s) return CCS_ERR_INVALID_ARGUMENT;
  if (!count) {
    ccs__set_error("ccs_stream_repeat_count: count is NULL");
    return CCS_ERR_INVALID_ARGUMENT;
  }
  *count = (int)s->repeat_count;
  return CCS_OK;
}

CCS__API ccs_result_t ccs_stream_query(ccs_stream_t stream) {
  struct ccs__host_stream *s = known(stream, "ccs_stream_query");
  if (!s) return CCS_ERR_INVALID_ARGUMENT;
  struct ccs__conn *c = s->conn;
  if (c && c->ring) {
    uint32_t none = 0; /* looks at the answers that came, waits for nothing */
    ccs__ring_wait_idle(c, &none);
  }
  if (s->inflight) return CCS_IN_PROGRESS;
  if (s->error != CCS_OK) ccs__set_error("%s", s->error_text);
  return s->error;
}

CCS__API ccs_result_t ccs_stream_destroy(ccs_stream_t stream) {
  struct ccs__host_stream *s = known(stream, "ccs_stream_destroy");
  if (!s) return CCS_ERR_INVALID_ARGUMENT;
  ccs__host_stream_drain(s); /* its calls' answers must not land in freed memory */
  pthread_mutex_lock(&registry_mu);
  struct ccs__host_stream **at = &registry;
  while (*at != s) at = &(*at)->next;
  *at = s->next;
  owes_nothing(s);
  pthread_mutex_unlock(&registry_mu);
  free(s->owes);
  free(s);
  return CCS_OK;
}
