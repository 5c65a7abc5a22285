/* One client connection: reads frames (with the file descriptors passed
 * alongside them), queues replies, and on close releases everything the
 * client made. A protocol violation gets one error reply, then the close. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "front/front.h"
#include "base/log.h"

struct outbuf {
  struct list link;
  size_t len, off;
  uint8_t data[];
};

static void update_poll(struct session *s);
static void on_poll(uv_poll_t *h, int status, int events);

static int allowed(const struct daemon *d, const struct ucred *cred) {
  const struct ccsd_config *cfg = &d->cfg;
  if (cfg->nallow_uids == 0 && cfg->nallow_gids == 0) return 1;
  for (int i = 0; i < cfg->nallow_uids; i++)
    if (cfg->allow_uids[i] == cred->uid) return 1;
  for (int i = 0; i < cfg->nallow_gids; i++)
    if (cfg->allow_gids[i] == cred->gid) return 1;
  return 0;
}

void ccsd_session_refuse(int fd, ccs_result_t rc, const char *why) {
  Ccs__Reply r = CCS__REPLY__INIT;
  r.status = rc;
  r.error = (char *)why;
  size_t len;
  uint8_t *frame = ccs__frame_pack(&r.base, &len);
  if (frame && send(fd, frame, len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
    /* the client is gone already: nothing to tell */
  }
  free(frame);
  close(fd);
}

/* Operators: root, and members of an admin_gids group, as the kernel
 * knew the client's groups when it connected (SO_PEERGROUPS: no lookup of
 * group databases on the loop). */
static int is_admin(const struct daemon *d, int fd, const struct ucred *cred) {
  if (cred->uid == 0) return 1;
  const struct ccsd_config *cfg = &d->cfg;
  for (int i = 0; i < cfg->nadmin_gids; i++)
    if (cfg->admin_gids[i] == cred->gid) return 1;
  if (cfg->nadmin_gids == 0) return 0;
  gid_t stack[256], *groups = stack;
  socklen_t len = sizeof(stack);
  int admin = 0;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) && errno == ERANGE &&
      (groups = malloc(len)) != NULL && getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len))
    len = 0;
  for (size_t g = 0; groups && g < len / sizeof(gid_t) && !admin; g++)
    for (int i = 0; i < cfg->nadmin_gids; i++)
      if (cfg->admin_gids[i] == groups[g]) admin = 1;
  if (groups != stack) free(groups);
  return admin;
}

void ccsd_session_new(struct daemon *d, int fd) {
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (d->stopping || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len)) {
    close(fd);
    return;
  }
  char err[256];
  struct tenant *t = NULL;
  ccs_result_t rc = allowed(d, &cred) ? ccsd_tenant_charge(d, cred.uid, TENANT_SESSIONS, 1, &t,
                                                           err, sizeof(err))
                                      : CCS_ERR_PERMISSION;
  if (rc == CCS_ERR_PERMISSION) snprintf(err, sizeof(err), "uid %d gid %d is not allowed to use this daemon", (int)cred.uid, (int)cred.gid);
  struct session *s = rc == CCS_OK ? calloc(1, sizeof(*s)) : NULL;
  if (!s) {
    /* One unsolicited reply saying why, best effort, then the close. */
    if (rc == CCS_OK) ccsd_tenant_release(t, TENANT_SESSIONS, 1), rc = CCS_ERR_NO_MEMORY;
    LOG_WARN("refused client pid %d uid %d: %s", (int)cred.pid, (int)cred.uid, err);
    ccsd_session_refuse(fd, rc, err);
    return;
  }
  s->tenant = t;
  s->connected_ms = s->last_rx_ms = s->last_tx_ms = ccsd_now_ms(d);
  s->d = d;
  s->id = ++d->next_id;
  s->fd = fd;
  s->pid = cred.pid;
  s->uid = cred.uid;
  s->gid = cred.gid;
  s->admin = is_admin(d, fd, &cred);
  ccs__frame_reader_init(&s->rd, CCS__FRAME_MAX);
  list_init(&s->outq);
  list_init(&s->buffers);
  list_init(&s->ipc_blocks);
  list_init(&s->comms);
  list_init(&s->submissions);
  list_insert_tail(&d->sessions, &s->link);
  uv_poll_init(d->loop, &s->poll, fd);
  s->poll.data = s;
  update_poll(s);
  LOG_INFO(CCS_LOG_CLIENT, "client %llu connected: pid %d uid %d gid %d%s", (unsigned long long)s->id,
           (int)s->pid, (int)s->uid, (int)s->gid, s->admin ? " (operator)" : "");
}

/* Past this much unsent reply data a client is not read from until it
 * catches up: a client that never reads cannot make the daemon buffer. */
#define OUTPUT_BACKPRESSURE (1u << 20)

static void update_poll(struct session *s) {
  if (s->closing) return;
  int events = (s->out_bytes < OUTPUT_BACKPRESSURE ? UV_READABLE : 0) |
               (list_empty(&s->outq) ? 0 : UV_WRITABLE);
  if (events != s->poll_events) {
    s->poll_events = events;
    uv_poll_start(&s->poll, events, on_poll);
  }
}

static void on_closed(uv_handle_t *h) {
  struct session *s = h->data;
  list_remove(&s->link);
  close(s->fd);
  ccsd_tenant_release(s->tenant, TENANT_SESSIONS, 1);
  free(s);
}

void ccsd_session_close(struct session *s, const char *why) {
  if (s->closing) return;
  s->closing = 1; /* it stays in d->sessions until on_closed: a walk of them may be under way */
  LOG_INFO(CCS_LOG_CLIENT, "client %llu (pid %d) closed: %s", (unsigned long long)s->id, (int)s->pid, why);
  struct list *it, *tmp;
  /* Leaving fails the client's comms for the other ranks (peer lost). */
  LIST_FOREACH_SAFE(it, tmp, &s->comms) {
    ccsd_client_comm_drop(s, LIST_ENTRY(it, struct client_comm, link), why, 0);
  }
  ccsd_submission_orphan_all(s);
  ccsd_ring_close(s);
  ccsd_journal_close(s);
  LIST_FOREACH_SAFE(it, tmp, &s->buffers) {
    ccsd_membuf_deregister(LIST_ENTRY(it, struct membuf, link));
  }
  ccsd_ipc_blocks_detach(&s->ipc_blocks); /* what ops in flight hold lives on */
  LIST_FOREACH_SAFE(it, tmp, &s->outq) {
    list_remove(it);
    free(LIST_ENTRY(it, struct outbuf, link));
  }
  for (int i = 0; i < s->nfds; i++) close(s->fds[i].fd);
  s->nfds = 0;
  ccs__frame_reader_close(&s->rd);
  uv_close((uv_handle_t *)&s->poll, on_closed);
}

static int flush(struct session *s) {
  while (!list_empty(&s->outq)) {
    struct outbuf *o = LIST_ENTRY(s->outq.next, struct outbuf, link);
    ssize_t n = send(s->fd, o->data + o->off, o->len - o->off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) break;
      return -1;
    }
    o->off += (size_t)n;
    s->out_bytes -= (size_t)n;
    s->last_tx_ms = ccsd_now_ms(s->d);
    if (o->off < o->len) break;
    list_remove(&o->link);
    free(o);
  }
  update_poll(s);
  return 0;
}

int ccsd_session_send(struct session *s, const Ccs__Reply *reply) {
  /* A stopping daemon says nothing more: what it would say now (calls
   * failed by its own stopping) is no answer; its clients rejoin. */
  if (s->closing || s->d->stopping) return -1;
  size_t len;
  uint8_t *frame = ccs__frame_pack_max(&reply->base, CCS__REPLY_MAX, &len);
  if (!frame) { /* the call fails with why, never waits for a reply that never comes */
    size_t want = protobuf_c_message_get_packed_size(&reply->base);
    char why[160];
    Ccs__Reply r = CCS__REPLY__INIT;
    r.id = reply->id;
    r.status = want > CCS__REPLY_MAX ? CCS_ERR_INVALID_USAGE : CCS_ERR_NO_MEMORY;
    snprintf(why, sizeof(why), want > CCS__REPLY_MAX
             ? "the reply (%zu bytes) is larger than a reply may be (%u bytes)"
             : "out of memory packing a reply of %zu bytes (limit %u)", want, CCS__REPLY_MAX);
    r.error = why;
    LOG_WARN("client %llu (pid %d): %s", (unsigned long long)s->id, (int)s->pid, why);
    if (!(frame = ccs__frame_pack_max(&r.base, CCS__REPLY_MAX, &len))) return -1;
  }
  /* A client that never reads its replies is cut off, not buffered for. */
  if (s->out_bytes + len > CCSD_MAX_OUTPUT_BYTES) {
    free(frame);
    ccsd_session_close(s, "not reading its replies");
    return -1;
  }
  struct outbuf *o = malloc(sizeof(*o) + len);
  if (!o) {
    free(frame);
    return -1;
  }
  memcpy(o->data, frame, len);
  free(frame);
  o->len = len;
  o->off = 0;
  if (list_empty(&s->outq)) s->last_tx_ms = ccsd_now_ms(s->d); /* the wait starts now */
  list_insert_tail(&s->outq, &o->link);
  s->out_bytes += len;
  if (flush(s)) {
    ccsd_session_close(s, "write failed");
    return -1;
  }
  return 0;
}

int ccsd_session_reply(struct session *s, uint64_t req_id, ccs_result_t status, const char *error) {
  Ccs__Reply r = CCS__REPLY__INIT;
  r.id = req_id;
  r.status = status;
  r.error = (char *)(error ? error : "");
  return ccsd_session_send(s, &r);
}

int ccsd_session_take_fd(struct session *s) {
  if (s->nfds == 0) return -1;
  int fd = s->fds[0].fd;
  memmove(&s->fds[0], &s->fds[1], sizeof(s->fds[0]) * (size_t)(s->nfds - 1));
  s->nfds--;
  return fd;
}

/* Queues the fds that came with a read, in arrival order, each with the
 * stream offset where that read ended. The kernel delivers SCM_RIGHTS with
 * the first byte of the sendmsg that carried them, but one read may also
 * hold earlier frames of other threads (an fd-less send merged before it),
 * so an fd belongs to some frame that ends no earlier than the first byte
 * of its read, and no frame before its own takes fds: each frame that
 * takes k fds takes the next k. An fd whose read lies wholly within
 * frames already handled came with none that took it: a violation. */
static int stash_fds(struct session *s, struct msghdr *msg, uint64_t read_end) {
  int ok = !(msg->msg_flags & MSG_CTRUNC);
  for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    int *fds = (int *)CMSG_DATA(c);
    for (size_t i = 0; i < n; i++) {
      int fd;
      memcpy(&fd, &fds[i], sizeof(fd));
      if (ok && s->nfds < CCSD_MAX_PENDING_FDS) {
        s->fds[s->nfds].fd = fd;
        s->fds[s->nfds].read_end = read_end;
        s->nfds++;
      } else {
        close(fd);
        ok = 0;
      }
    }
  }
  return ok ? 0 : -1;
}

void ccsd_session_protocol_error(struct session *s, const char *what) {
  LOG_WARN("client %llu (pid %d uid %d): protocol error: %s", (unsigned long long)s->id,
           (int)s->pid, (int)s->uid, what);
  ccsd_session_reply(s, 0, CCS_ERR_PROTOCOL, what);
  flush(s);
  ccsd_session_close(s, what);
}

/* Reads per wake-up of a connection of a tenant of weight 1, shared
 * among the tenant's connections (ccsd_tenant_turns; one at least). */
#define READS_PER_TURN 16

static void on_readable(struct session *s) {
  /* Bound the work per wake-up so one busy client cannot starve others. */
  int turns = ccsd_tenant_turns(s->tenant, &s->credit, READS_PER_TURN);
  for (int rounds = 0; rounds < (turns > 0 ? turns : 1) && !s->closing; rounds++) {
    uint8_t *space;
    size_t room;
    if (ccs__frame_reader_space(&s->rd, &space, &room)) {
      ccsd_session_protocol_error(s, "out of memory reading frame");
      return;
    }
    union {
      char buf[CMSG_SPACE(sizeof(int) * CCSD_MAX_PENDING_FDS)];
      struct cmsghdr align;
    } ctl;
    struct iovec iov = {space, room};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    ssize_t n = recvmsg(s->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EAGAIN) ccsd_tenant_idle(&s->credit); /* read it all */
      if (errno == EAGAIN || errno == EINTR) return;
      ccsd_session_close(s, strerror(errno));
      return;
    }
    if (n == 0) {
      ccsd_session_close(s, ccs__frame_reader_pending(&s->rd) ? "disconnected mid-frame"
                                                              : "disconnected");
      return;
    }
    s->rx_total += (uint64_t)n;
    if (stash_fds(s, &msg, s->rx_total)) {
      ccsd_session_protocol_error(s, "too many or truncated file descriptors");
      return;
    }
    s->last_rx_ms = ccsd_now_ms(s->d);
    ccs__frame_reader_commit(&s->rd, (size_t)n);
    const uint8_t *payload;
    size_t len;
    int r = 0;
    while (!s->closing && (r = ccs__frame_reader_next(&s->rd, &payload, &len)) == 1) {
      s->rx_frame_end += CCS__FRAME_HEADER + len;
      atomic_fetch_add_explicit(&s->tenant->share->requests, 1, memory_order_relaxed);
      ccsd_dispatch(s, payload, len);
      /* An fd not claimed by its frame is a protocol violation. */
      if (!s->closing && s->nfds && s->fds[0].read_end <= s->rx_frame_end) {
        ccsd_session_protocol_error(s, "file descriptor sent with a frame that takes none");
        return;
      }
    }
    if (r < 0 && !s->closing) {
      char what[96];
      snprintf(what, sizeof(what), "frame larger than %u bytes", CCS__FRAME_MAX);
      ccsd_session_protocol_error(s, what);
      return;
    }
  }
}

/* Slow clients: stalled mid-frame, silent before their hello, or not
 * reading replies, for longer than the io timeout, are closed. Called
 * from the daemon's housekeeping timer. */
void ccsd_session_check_io(struct session *s) {
  uint64_t now = ccsd_now_ms(s->d), limit = (uint64_t)(s->d->cfg.io_timeout_s * 1000);
  if (ccs__frame_reader_pending(&s->rd) && now - s->last_rx_ms >= limit)
    ccsd_session_close(s, "stalled in the middle of a frame");
  else if (!s->said_hello && now - s->connected_ms >= limit)
    ccsd_session_close(s, "sent no hello");
  else if (!list_empty(&s->outq) && now - s->last_tx_ms >= limit)
    ccsd_session_close(s, "not reading its replies");
}

static void on_poll(uv_poll_t *h, int status, int events) {
  struct session *s = h->data;
  if (status < 0) {
    ccsd_session_close(s, uv_strerror(status));
    return;
  }
  if ((events & UV_WRITABLE) && flush(s)) {
    ccsd_session_close(s, "write failed");
    return;
  }
  if (events & UV_READABLE) on_readable(s);
}
