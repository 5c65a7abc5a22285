/* Frame -> request -> action -> reply. Protobuf types stop here: requests
 * are validated field by field and copied into our own structs. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <sodium.h>
#include <time.h>

#include "front/front.h"
#include "base/log.h"

static void on_hello(struct session *s, uint64_t id, const Ccs__Hello *m) {
  if (!ccs__protocol_served(m->protocol)) {
    char err[160];
    snprintf(err, sizeof(err), "client speaks protocol %u, daemon speaks %u (and serves clients "
             "of %u)", m->protocol, CCS__PROTOCOL_VERSION, CCS__PROTOCOL_OLDEST);
    LOG_WARN("client %llu (pid %d): %s", (unsigned long long)s->id, (int)s->pid, err);
    ccsd_session_reply(s, id, CCS_ERR_VERSION, err);
    ccsd_session_close(s, "protocol version mismatch");
    return;
  }
  s->said_hello = 1;
  s->protocol = m->protocol;
  if (m->resume)
    LOG_INFO(CCS_LOG_CLIENT, "client %llu (pid %d): back after its daemon went", (unsigned long long)s->id,
             (int)s->pid);
  Ccs__Reply r = CCS__REPLY__INIT;
  Ccs__HelloReply h = CCS__HELLO_REPLY__INIT;
  char version[32];
  snprintf(version, sizeof(version), "%d.%d.%d", CCS_VERSION_MAJOR, CCS_VERSION_MINOR,
           CCS_VERSION_PATCH);
  h.protocol = CCS__PROTOCOL_VERSION;
  h.daemon_version = version;
  h.parts = 1;
  r.id = id;
  r.body_case = CCS__REPLY__BODY_HELLO;
  r.hello = &h;
  ccsd_session_send(s, &r);
}

/* The id names the requesting uid, signed: the comm made from it belongs
 * to that tenant whichever rank joins first. */
static void on_get_unique_id(struct session *s, uint64_t id) {
  struct ccs__unique_id uid;
  uint8_t bytes[CCS_UNIQUE_ID_BYTES] = {0};
  ccsd_unique_id_issue(&s->d->coll, s->uid, &uid);
  memcpy(bytes, &uid, sizeof(uid));
  Ccs__Reply r = CCS__REPLY__INIT;
  Ccs__UniqueIdReply u = CCS__UNIQUE_ID_REPLY__INIT;
  u.id.data = bytes;
  u.id.len = sizeof(bytes);
  r.id = id;
  r.body_case = CCS__REPLY__BODY_UNIQUE_ID;
  r.unique_id = &u;
  ccsd_session_send(s, &r);
}

/* A registration of host or VMM memory takes one fd, the next one this
 * connection received (session.c); a legacy IPC handle takes none. */
static void on_mem_register(struct session *s, uint64_t id, const Ccs__MemRegister *m) {
  int fd = m->domain == CCS__MEM_CUDA_IPC ? -1 : ccsd_session_take_fd(s);
  char err[512];
  struct membuf *b;
  ccs_result_t rc;
  if (m->domain != CCS__MEM_HOST &&
      (rc = ccsd_gpu_check_register(m->domain, m->size, m->device.len, m->ipc_handle.len, err,
                                    sizeof(err))) != CCS_OK) {
    if (fd >= 0) close(fd);
  } else if (m->domain == CCS__MEM_CUDA_IPC) { /* the handle is in the message */
    if (fd >= 0) close(fd);
    rc = ccsd_membuf_register_ipc(s, m->ipc_handle.data, m->device.data, m->address, m->size, &b,
                                  err, sizeof(err));
  } else if (fd < 0) {
    ccsd_session_reply(s, id, CCS_ERR_INVALID_ARGUMENT,
                       "memory registration without a file descriptor");
    return;
  } else if (m->domain == CCS__MEM_HOST) {
    rc = ccsd_membuf_register(s, fd, &b, err, sizeof(err));
  } else {
    rc = ccsd_membuf_register_device(s, fd, m->size, m->device.data, &b, err, sizeof(err));
  }
  if (rc != CCS_OK) {
    ccsd_session_reply(s, id, rc, err);
    return;
  }
  Ccs__Reply r = CCS__REPLY__INIT;
  Ccs__MemRegisterReply reg = CCS__MEM_REGISTER_REPLY__INIT;
  reg.buffer = b->id;
  reg.size = b->size;
  r.id = id;
  r.body_case = CCS__REPLY__BODY_MEM_REGISTER;
  r.mem_register = &reg;
  ccsd_session_send(s, &r);
}

static void on_mem_deregister(struct session *s, uint64_t id, const Ccs__MemDeregister *m) {
  ccs_result_t rc;
  struct membuf *b = ccsd_membuf_find(s, m->buffer, &rc);
  if (!b) {
    ccsd_session_reply(s, id, rc, rc == CCS_ERR_PERMISSION ? "buffer of another client"
                                                           : "no such buffer");
    return;
  }
  ccsd_membuf_deregister(b);
  ccsd_session_reply(s, id, CCS_OK, NULL);
}

static struct client_comm *find_comm(struct session *s, uint64_t id, uint64_t handle) {
  struct client_comm *cc = ccsd_client_comm_find(s, handle);
  if (!cc) ccsd_session_reply(s, id, CCS_ERR_INVALID_ARGUMENT, "no such communicator");
  return cc;
}

static void on_comm_destroy(struct session *s, uint64_t id, uint64_t handle, int abort) {
  struct client_comm *cc = find_comm(s, id, handle);
  if (!cc) return;
  struct member *m = cc->member;
  if (abort)
    ccsd_comm_fail(m->comm, CCS_ERR_ABORTED, "rank %d (pid %d) aborted the communicator",
                   m->rank, (int)m->pid);
  ccsd_client_comm_drop(s, cc, "destroyed the communicator", 1);
  ccsd_session_reply(s, id, CCS_OK, NULL);
}

/* Every rank's pending and later ops of the comm fail, on every daemon;
 * the handles stay (to shrink the comm, or destroy it). */
static void on_comm_revoke(struct session *s, uint64_t id, uint64_t handle) {
  struct client_comm *cc = find_comm(s, id, handle);
  if (!cc) return;
  struct member *m = cc->member;
  if (m->comm->state != COMM_FAILED)
    ccsd_comm_fail(m->comm, CCS_ERR_REVOKED, "rank %d (pid %d) revoked the communicator", m->rank,
                   (int)m->pid);
  ccsd_session_reply(s, id, CCS_OK, NULL);
}

static void on_comm_query(struct session *s, uint64_t id, uint64_t handle) {
  struct client_comm *cc = find_comm(s, id, handle);
  if (!cc) return;
  struct comm *c = cc->member->comm;
  ccsd_session_reply(s, id, c->state == COMM_FAILED ? c->error : CCS_OK,
                     c->state == COMM_FAILED ? c->error_text : NULL);
}

static void on_stats(struct session *s, uint64_t id) {
  struct daemon *d = s->d;
  Ccs__StatsReply st = CCS__STATS_REPLY__INIT;
  int all = s->admin;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->tenants) {
    struct tenant *t = LIST_ENTRY(it, struct tenant, link);
    if (!all && t->uid != s->uid) continue;
    st.tenants++;
    st.sessions += t->used[TENANT_SESSIONS];
    st.comms += t->used[TENANT_COMMS];
    st.registered_bytes += t->used[TENANT_REGISTERED_BYTES];
    st.ops_in_flight += t->used[TENANT_OPS];
  }
  LIST_FOREACH_SAFE(it, tmp, &d->sessions) {
    struct session *each = LIST_ENTRY(it, struct session, link);
    if (each->closing || (!all && each->uid != s->uid)) continue;
    st.fast_path_sessions += each->ring != NULL;
    struct list *b, *btmp;
    LIST_FOREACH_SAFE(b, btmp, &each->buffers) st.buffers++;
  }
  char version[32];
  snprintf(version, sizeof(version), "%d.%d.%d", CCS_VERSION_MAJOR, CCS_VERSION_MINOR,
           CCS_VERSION_PATCH);
  st.daemon_version = version;
  st.uptime_s = (double)(ccsd_now_ms(d) - d->started_ms) / 1000.0;
  if (all) st.fast_path_calls = d->ring_calls;
  Ccs__Reply r = CCS__REPLY__INIT;
  r.id = id;
  r.body_case = CCS__REPLY__BODY_STATS;
  r.stats = &st;
  ccsd_session_send(s, &r);
}

/* A Submit over the socket: its ops as either path brings them. */
static void on_submit(struct session *s, uint64_t id, const Ccs__Submit *m) {
  if (m->n_ops == 0 || m->n_ops > CCS__SUBMIT_MAX_OPS) {
    char err[96];
    snprintf(err, sizeof(err), "a submission holds 1..%u ops, not %zu", CCS__SUBMIT_MAX_OPS,
             m->n_ops);
    ccsd_session_reply(s, id, CCS_ERR_INVALID_ARGUMENT, err);
    return;
  }
  struct op_args *ops = calloc(m->n_ops, sizeof(*ops));
  if (!ops) {
    ccsd_session_reply(s, id, CCS_ERR_NO_MEMORY, "out of memory");
    return;
  }
  for (size_t i = 0; i < m->n_ops; i++) {
    const Ccs__Op *op = m->ops[i];
    const Ccs__BufRef *refs[2] = {op->send, op->recv};
    struct op_buf *bufs[2] = {&ops[i].send, &ops[i].recv};
    ops[i] = (struct op_args){.comm = op->comm, .kind = op->kind, .count = op->count,
                              .dtype = op->dtype, .redop = op->redop, .root = op->root,
                              .whole_count = op->whole_count, .number = op->number};
    for (int k = 0; k < 2; k++)
      if (refs[k]) *bufs[k] = (struct op_buf){refs[k]->buffer, refs[k]->offset, refs[k]->length, 1};
  }
  ccsd_submit(s, id, ops, m->n_ops, NULL, 0);
  free(ops);
}

void ccsd_dispatch(struct session *s, const uint8_t *payload, size_t len) {
  Ccs__Request *req = ccs__request_unpack(payload, len);
  if (!req) {
    ccsd_session_reply(s, 0, CCS_ERR_PROTOCOL, "malformed request");
    ccsd_session_close(s, "malformed request");
    return;
  }
  uint64_t id = req->id;
  if (!s->said_hello && req->body_case != CCS__REQUEST__BODY_HELLO) {
    ccsd_session_reply(s, id, CCS_ERR_PROTOCOL, "the first request must be a hello");
    ccsd_session_close(s, "no hello");
    ccs__request__free_unpacked(req, NULL);
    return;
  }
  switch (req->body_case) {
  case CCS__REQUEST__BODY_HELLO: on_hello(s, id, req->hello); break;
  case CCS__REQUEST__BODY_GET_UNIQUE_ID: on_get_unique_id(s, id); break;
  case CCS__REQUEST__BODY_COMM_INIT: ccsd_comm_init(s, id, req->comm_init); break;
  case CCS__REQUEST__BODY_COMM_DESTROY: on_comm_destroy(s, id, req->comm_destroy->comm, 0); break;
  case CCS__REQUEST__BODY_COMM_ABORT: on_comm_destroy(s, id, req->comm_abort->comm, 1); break;
  case CCS__REQUEST__BODY_COMM_QUERY: on_comm_query(s, id, req->comm_query->comm); break;
  case CCS__REQUEST__BODY_COMM_REVOKE: on_comm_revoke(s, id, req->comm_revoke->comm); break;
  case CCS__REQUEST__BODY_MEM_REGISTER: on_mem_register(s, id, req->mem_register); break;
  case CCS__REQUEST__BODY_MEM_DEREGISTER: on_mem_deregister(s, id, req->mem_deregister); break;
  case CCS__REQUEST__BODY_SUBMIT: on_submit(s, id, req->submit); break;
  case CCS__REQUEST__BODY_STATS: on_stats(s, id); break;
  case CCS__REQUEST__BODY_ADMIN: ccsd_admin(s, id, req->admin); break;
  case CCS__REQUEST__BODY_RING_SETUP: ccsd_ring_setup(s, id); break;
  case CCS__REQUEST__BODY_JOURNAL_SETUP: ccsd_journal_setup(s, id); break;
  default:
    ccsd_session_reply(s, id, CCS_ERR_PROTOCOL, "unknown request");
    ccsd_session_close(s, "unknown request");
    break;
  }
  ccs__request__free_unpacked(req, NULL);
}
