/* The RDMA verbs transport ("ib"): bulk data by RDMA WRITE with immediate
 * straight into the receiver's registered buffer; everything else over
 * the TCP transport it wraps, whose authenticated connection also carries
 * the queue pairs' setup and is the connection's liveness (transport.h's
 * semantics are TCP's: a message whose receive is not posted yet is held,
 * a send completes without waiting for the receiver's post).
 *
 * Per connection: one reliable-connected queue pair with its own
 * completion queue and channel (a closed connection's queue goes with it,
 * so no completion can name a freed request). Messages that name a
 * registration (data; transport.h: a tag's messages all do or none do):
 *  - the sender says what it has: a header {sid, tag, len} on the
 *    connection, in order;
 *  - the receiver matches headers to its receives by tag, first come
 *    first matched (the one place where matching happens), and for a
 *    match answers "clear to send" {sid, rid, addr, rkey};
 *  - the sender writes its bytes there with immediate rid; the receive
 *    completes on the immediate, the send on the write's completion.
 * A sender that hears no answer within CTS_WAIT_S (the receiver has not
 * posted, and may be waiting for this very send to finish first) sends
 * the bytes over TCP after all (eager): the receiver holds them until the
 * receive comes, within the held-bytes cap, as TCP does. Each message goes
 * one way only: the sender decides, and an answer that comes after it
 * chose TCP is ignored.
 * Small messages go eager at once: by SEND, header and bytes together,
 * into a buffer the receiver posted (a bounce buffer), for which the
 * sender needs a credit: one without waits for one, in turn (over TCP only
 * before the queue pair is up, or to a peer that takes no SENDs). The
 * receiver posts each buffer again once it took what came (into its
 * receive or held, never waiting for a receive), and gives the credits
 * back over TCP.
 * Headers thus come two ways; the receiver matches messages in the
 * sender's order (sid) all the same, so a tag's messages keep theirs.
 * Every posted receive is a bounce buffer, as a write's immediate takes
 * the next one too: answers out are bounded by RQ_DEPTH, SENDs by
 * CREDITS, and RQ_DEPTH + CREDITS are posted, so none finds none. */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <uthash.h>
#include <utlist.h>

#include "auth.h"
#include "transport.h"
#include "verbs_lib.h"
#include "verbs_port.h"

/* Tags of the transport's own messages: five values in 2^64, which the
 * daemon's data tags (hashes) are not expected to meet. */
#define TAG_QP 0x1bcc5b1b00000001ull /* queue pair details, once each way */
#define TAG_HEADER (TAG_QP + 1)      /* sender: a message, or that its bytes come eager after all */
#define TAG_EAGER (TAG_QP + 2)       /* sender: an eager message's bytes, in header order */
#define TAG_CTS (TAG_QP + 3)         /* receiver: clear to send */
#define TAG_CREDIT (TAG_QP + 4)      /* receiver: bounce buffers posted again */
#define TAG_LAST TAG_CREDIT

#define RQ_DEPTH 64                /* immediates a connection can take at once */
#define SQ_DEPTH 128               /* writes outstanding per connection */
#define WRITE_MAX (1u << 30)       /* one write's bytes at most */
#define RENDEZVOUS_MIN (16u << 10) /* smaller messages go eager: a round trip costs more than the copy */
#define BOUNCE_BYTES RENDEZVOUS_MIN /* every smaller message goes by SEND */
#define BOUNCE_BYTES_V1 (8u << 10)  /* what a peer before WIRE_SENDS_16K takes */
#define CREDITS 32                 /* SENDs a receiver takes before it gives credits back */
#define CTS_WAIT_S 0.02 /* from when the queue pair is up */
#define QUIESCE_S 0.5   /* writes either way still completing after the peer closed */

/* lid: the port's LID in the low 16 bits, the wire's version above
 * (daemons from before SENDs say 0; they take none and send none) */
struct wire_qp {
  uint32_t qpn, psn, mtu, lid;
  uint8_t gid[16];
};
#define WIRE_SENDS 1     /* small messages by SEND, credits */
#define WIRE_SENDS_16K 2 /* ... of up to BOUNCE_BYTES (BOUNCE_BYTES_V1 before) */

enum {
  H_MESSAGE = 1, /* its bytes wait for an answer */
  H_EAGER_NOW,   /* a small message: its bytes follow */
  H_EAGER,       /* the bytes of an earlier H_MESSAGE follow after all */
  H_SEND,        /* by SEND: its bytes follow in the same buffer */
};
struct wire_header {
  uint32_t kind, sid;
  uint64_t tag, len;
};

#define SLOT_BYTES (sizeof(struct wire_header) + BOUNCE_BYTES)
#define RECV_SLOTS (RQ_DEPTH + CREDITS)

struct wire_credit {
  uint32_t count, pad;
};

struct wire_cts {
  uint32_t sid, rid, rkey, pad;
  uint64_t addr;
};

struct tmem {
  struct tmem *tcp; /* the same range in the wrapped transport (eager messages) */
  struct ibv_mr *mr[CCS_IB_RAILS_MAX]; /* per rail: each has its protection domain */
  struct transport *t;
  char *base;
  size_t len;
};

/* A send or receive of the caller's with a registration. */
struct uop {
  struct uop *prev, *next; /* in its connection's sends or receives */
  struct tconn *c;
  int is_send;
  struct tmem *m;
  char *buf;
  size_t len;
  uint64_t tag;
  void *user;
  uint32_t id; /* send: sid; receive: rid */
  /* send */
  enum { S_WAIT_CTS, S_WRITING, S_SENT, S_EAGER, S_WAIT_CREDIT } state;
  double cts_by;
  int writes_left;
  int slot; /* S_SENT: its send buffer */
  /* receive */
  struct msg *matched;
  UT_hash_handle hh; /* receive: by rid, while a write may come */
};

/* A message the receiver heard of: a header, its bytes (when eager). */
struct msg {
  struct msg *prev, *next; /* in its connection's pending or unmatched messages */
  uint32_t sid;
  uint64_t tag, len;
  struct uop *r;       /* the receive it matched */
  int eager;           /* its bytes come (came) over TCP */
  int receiving;       /* they are on their way: a note waits for them */
  int into_r;          /* ... straight into r's buffer */
  int doomed;          /* its receive was too small: its bytes are dropped */
  char *held;          /* eager bytes that came before their receive */
  int arrived;         /* held: all of them are here */
  int cts_out;         /* an answer went: an immediate may come */
  int pending;         /* not matched before: an earlier sid has not come */
  int want_cts;        /* listed in its connection's want_cts */
  UT_hash_handle hh;   /* by sid */
};

/* The transport's own message on the wrapped connection. */
struct note {
  struct note *prev, *next; /* in its connection's notes */
  struct tconn *c;
  uint64_t tag;
  int is_send;
  struct msg *msg; /* TAG_EAGER receive: the message whose bytes these are */
  size_t len;
  union {
    struct wire_qp qp;
    struct wire_header header;
    struct wire_cts cts;
    struct wire_credit credit;
  } u;
};

struct done {
  struct done *next;
  struct tcompletion tc;
};

struct tconn {
  struct tconn *prev, *next;
  struct transport *t;
  struct tconn *tcp;
  struct ibv_comp_channel *ch;
  int rail; /* the port its queue pair is on */
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  uint32_t psn;
  int ready;  /* RTS: the peer's details came */
  int failed; /* its status; 0 while it works */
  char why[160]; /* the device's word on it, when it failed for the device */
  int why_local; /* an event of this device (port, device, queue pair), not a completion */
  /* the wrapped connection is down: what it holds (headers, eager bytes)
   * is still taken; the connection fails when the headers run out */
  int tcp_down;
  int quiescing; /* failed, its queue pair runs on for writes either way (conn_fail) */
  double quiesce_by;
  int closed; /* the caller closed it: what the wrapped one still owes is awaited */
  uint32_t next_sid, next_rid;
  uint32_t next_in; /* the sid matched next */
  int cts_out; /* answers whose immediates may come */
  /* bounce buffers, registered on its rail: CREDITS to send from, then
   * RECV_SLOTS posted to receive into */
  char *bounce;
  struct ibv_mr *bounce_mr;
  uint64_t send_free; /* send buffers free, a bit each */
  int credits;        /* SENDs the peer takes */
  uint64_t bounce_max; /* the longest message its bounce buffers take (0: none, it takes no SENDs) */
  int credit_waits;    /* sends waiting for a credit or a send buffer (S_WAIT_CREDIT) */
  int credits_owed;   /* buffers posted again, not yet said */
  struct uop *sends, *recvs; /* posted, not complete */
  struct uop *by_rid;
  struct msg *pending, *unmatched, *by_sid;
  struct msg *want_cts; /* matched, answered once an immediate slot is free */
  struct note *notes;
  size_t held;
};

struct transport {
  struct transport_params params;
  struct transport *tcp;
  struct verbs_lib lib;
  /* the active ports (rails), each with its protection domain; connections
   * take them in turn, so a daemon's lanes to its peers spread over them */
  struct rail {
    struct ib_port port;
    struct ibv_pd *pd;
  } rails[CCS_IB_RAILS_MAX];
  int nrails;
  unsigned next_rail;
  unsigned wire; /* the version it speaks (WIRE_SENDS; tests say less) */
  struct tconn *conns;
  struct done *done, *done_tail;
  struct pollfd *fds;
  int nfds_cap;
  struct transport_counters counters;
  /* references on the device: the transport's own and one per
   * registration (any thread), so that it stays open for the last */
  _Atomic size_t refs;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void complete(struct transport *t, struct tconn *c, uint64_t tag, void *user, int is_send,
                     int status, size_t bytes) {
  struct done *d = calloc(1, sizeof(*d));
  if (!d) return; /* out of memory: the completion is lost, as a crashed NIC's would be */
  d->tc = (struct tcompletion){c, tag, user, is_send, status, bytes};
  if (t->done_tail) t->done_tail->next = d;
  else t->done = d;
  t->done_tail = d;
}

static void uop_finish(struct uop *op, int status, size_t bytes) {
  struct tconn *c = op->c;
  if (op->is_send) {
    DL_DELETE(c->sends, op);
    if (op->state == S_SENT) c->send_free |= 1ull << op->slot;
    if (op->state == S_WAIT_CREDIT) c->credit_waits--;
  } else {
    DL_DELETE(c->recvs, op);
    if (op->matched) op->matched->r = NULL;
  }
  complete(c->t, c->closed ? NULL : c, op->tag, op->user, op->is_send, status, bytes);
  free(op);
}

static void msg_free(struct tconn *c, struct msg *m) {
  HASH_DEL(c->by_sid, m);
  if (m->held) c->held -= m->len;
  free(m->held);
  free(m);
}

/* --- the wrapped connection's notes -------------------------------------- */

static void conn_fail(struct tconn *c, int status, int from_tcp);
static void pending_flush(struct tconn *c);

static struct note *note_new(struct tconn *c, uint64_t tag, int is_send) {
  struct note *n = calloc(1, sizeof(*n));
  if (!n) return NULL;
  n->c = c;
  n->tag = tag;
  n->is_send = is_send;
  DL_APPEND(c->notes, n);
  return n;
}

static void note_free(struct note *n) {
  DL_DELETE(n->c->notes, n);
  free(n);
}

static void note_send(struct tconn *c, uint64_t tag, const void *body, size_t len) {
  if (c->failed) return;
  struct note *n = note_new(c, tag, 1);
  if (!n) {
    conn_fail(c, -ENOMEM, 0);
    return;
  }
  memcpy(&n->u, body, len);
  n->len = len;
  int rc = ccs_transport_tcp.send(c->tcp, NULL, &n->u, len, tag, n);
  if (rc) {
    note_free(n);
    if (rc == -ECONNRESET) c->tcp_down = rc;
    else conn_fail(c, rc, 0);
  }
}

static void note_recv(struct tconn *c, uint64_t tag, size_t len) {
  if (c->failed) return;
  struct note *n = note_new(c, tag, 0);
  if (!n) {
    conn_fail(c, -ENOMEM, 0);
    return;
  }
  n->len = len;
  int rc = ccs_transport_tcp.recv(c->tcp, NULL, &n->u, len, tag, n);
  if (rc) {
    note_free(n);
    if (rc != -ECONNRESET) conn_fail(c, rc, 0);
    else if (tag == TAG_HEADER) conn_fail(c, rc, 1); /* none held: the last was taken */
    else c->tcp_down = rc;
  }
}

/* --- failure --------------------------------------------------------------- */

static int writing(const struct tconn *c) {
  const struct uop *op;
  DL_FOREACH(c->sends, op)
    if (op->state == S_WRITING || op->state == S_SENT) return 1;
  return 0;
}

/* The queue pair stops: nothing more is written into this side's memory or
 * read from it; what waited on it fails with status. */
static void qp_stop(struct tconn *c, int status) {
  c->quiescing = 0;
  if (c->qp) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    c->t->lib.modify_qp(c->qp, &a, IBV_QP_STATE);
  }
  HASH_CLEAR(hh, c->by_rid);
  struct uop *op, *tmp;
  DL_FOREACH_SAFE(c->sends, op, tmp)
    if (op->state != S_EAGER) uop_finish(op, status, 0);
  DL_FOREACH_SAFE(c->recvs, op, tmp) /* (bytes on their way over TCP finish theirs) */
    if (!op->matched || !op->matched->receiving) uop_finish(op, status, 0);
}

static void poll_cq(struct tconn *c);

/* The connection fails: every send and receive fails with status, but for
 * those whose bytes the wrapped connection moves (their completions
 * finish them); messages held whole stay for receives to come, as TCP's
 * do. A failure of its own (not the wrapped connection's) closes the
 * wrapped one too: the peer hears of it, and no eager bytes land after.
 * When the peer closed (the wrapped connection's failure), what it wrote
 * before counts, and so do this side's writes it acknowledged: the queue
 * pair runs on until they completed, for QUIESCE_S at most. */
static void conn_fail(struct tconn *c, int status, int from_tcp) {
  if (c->failed) return;
  if (from_tcp && c->ready) {
    poll_cq(c);
    if (c->failed) return;
  }
  c->failed = status;
  for (struct msg *m = c->want_cts; m; m = m->next) m->want_cts = 0;
  c->want_cts = NULL;
  pending_flush(c);
  if (!from_tcp && c->tcp) {
    ccs_transport_tcp.close(c->tcp);
    c->tcp = NULL;
  }
  struct uop *op, *otmp;
  DL_FOREACH_SAFE(c->sends, op, otmp) /* (none of their bytes went) */
    if (op->state == S_WAIT_CTS || op->state == S_WAIT_CREDIT) uop_finish(op, status, 0);
  DL_FOREACH_SAFE(c->recvs, op, otmp)
    if (!op->matched || (!op->matched->receiving && !op->matched->cts_out)) uop_finish(op, status, 0);
  struct msg *m, *mtmp;
  DL_FOREACH_SAFE(c->unmatched, m, mtmp)
    if (!m->arrived && !m->receiving) {
      DL_DELETE(c->unmatched, m);
      msg_free(c, m);
    }
  c->quiescing = 1;
  c->quiesce_by = now_s() + QUIESCE_S;
  if (!from_tcp) qp_stop(c, status);
  else poll_cq(c); /* stops it when nothing is awaited */
}

/* --- queue pairs ------------------------------------------------------------- */

static char *send_slot(const struct tconn *c, int slot) { return c->bounce + (size_t)slot * SLOT_BYTES; }
static char *recv_slot(const struct tconn *c, uint64_t slot) {
  return c->bounce + (CREDITS + (size_t)slot) * SLOT_BYTES;
}

static int post_slot(struct tconn *c, uint64_t slot) {
  struct ibv_sge sge = {.addr = (uintptr_t)recv_slot(c, slot), .length = SLOT_BYTES, .lkey = c->bounce_mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *bad;
  return ibv_post_recv(c->qp, &wr, &bad);
}

/* The bounce buffers, on the connection's rail. */
static int bounce_create(struct transport *t, struct tconn *c) {
  size_t len = (CREDITS + RECV_SLOTS) * SLOT_BYTES;
  int rc = posix_memalign((void **)&c->bounce, 4096, len);
  if (rc) {
    c->bounce = NULL;
    errno = rc;
    return -1;
  }
  memset(c->bounce, 0, len);
  if (!(c->bounce_mr = t->lib.reg_mr(t->rails[c->rail].pd, c->bounce, len, IBV_ACCESS_LOCAL_WRITE))) return -1;
  c->send_free = CREDITS == 64 ? ~0ull : (1ull << CREDITS) - 1;
  return 0; /* (credits come with the peer's details, if it takes SENDs) */
}

static int qp_create(struct transport *t, struct tconn *c, char *err, size_t errlen) {
  const struct verbs_lib *lib = &t->lib;
  const struct rail *rl = &t->rails[c->rail];
  if (!(c->ch = lib->create_comp_channel(rl->port.ctx)) ||
      !(c->cq = lib->create_cq(rl->port.ctx, SQ_DEPTH + CREDITS + RECV_SLOTS + 16, c, c->ch, 0))) {
    snprintf(err, errlen, "%s: cannot create a completion queue: %s", rl->port.dev, strerror(errno));
    return -1;
  }
  if (bounce_create(t, c)) {
    snprintf(err, errlen, "%s: cannot register bounce buffers: %s", rl->port.dev, strerror(errno));
    return -1;
  }
  fcntl(c->ch->fd, F_SETFL, fcntl(c->ch->fd, F_GETFL) | O_NONBLOCK);
  struct ibv_qp_init_attr ia = {
      .send_cq = c->cq,
      .recv_cq = c->cq,
      .cap = {.max_send_wr = SQ_DEPTH + CREDITS, .max_recv_wr = RECV_SLOTS, .max_send_sge = 1, .max_recv_sge = 1},
      .qp_type = IBV_QPT_RC,
  };
  if (!(c->qp = lib->create_qp(rl->pd, &ia))) {
    snprintf(err, errlen, "%s: cannot create a queue pair: %s", rl->port.dev, strerror(errno));
    return -1;
  }
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                          .pkey_index = 0,
                          .port_num = (uint8_t)rl->port.port,
                          .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE};
  int rc = lib->modify_qp(c->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  for (uint64_t i = 0; !rc && i < RECV_SLOTS; i++) rc = post_slot(c, i);
  if (!rc) rc = ibv_req_notify_cq(c->cq, 0);
  if (rc) {
    snprintf(err, errlen, "%s: cannot ready a queue pair: %s", rl->port.dev, strerror(rc));
    return -1;
  }
  if (getrandom(&c->psn, sizeof(c->psn), 0) != sizeof(c->psn)) c->psn = (uint32_t)now_s();
  c->psn &= 0xffffff;
  struct wire_qp mine = {.qpn = htole32(c->qp->qp_num), .psn = htole32(c->psn),
                         .mtu = htole32(rl->port.attr.active_mtu),
                         .lid = htole32(rl->port.attr.lid | (uint32_t)t->wire << 16)};
  memcpy(mine.gid, rl->port.gid.raw, 16);
  note_recv(c, TAG_QP, sizeof(struct wire_qp));
  note_recv(c, TAG_HEADER, sizeof(struct wire_header));
  note_recv(c, TAG_CTS, sizeof(struct wire_cts));
  note_recv(c, TAG_CREDIT, sizeof(struct wire_credit));
  note_send(c, TAG_QP, &mine, sizeof(mine));
  return c->failed ? -1 : 0;
}

static void send_answers(struct tconn *c);

/* The peer's details: RTR, then RTS. */
static void qp_connect(struct tconn *c, const struct wire_qp *peer) {
  struct transport *t = c->t;
  const struct ib_port *port = &t->rails[c->rail].port;
  enum ibv_mtu mtu = (enum ibv_mtu)le32toh(peer->mtu);
  if (mtu > port->attr.active_mtu) mtu = port->attr.active_mtu;
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
                          .path_mtu = mtu,
                          .dest_qp_num = le32toh(peer->qpn) & 0xffffff,
                          .rq_psn = le32toh(peer->psn) & 0xffffff,
                          .max_dest_rd_atomic = 1,
                          .min_rnr_timer = 12};
  a.ah_attr.port_num = (uint8_t)port->port;
  if (port->ethernet || port->attr.lid == 0) { /* RoCE: routed by GID */
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)port->gid_index;
    a.ah_attr.grh.hop_limit = 64;
  } else {
    a.ah_attr.dlid = (uint16_t)(le32toh(peer->lid) & 0xffff);
  }
  int rc = t->lib.modify_qp(c->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                          IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (!rc) {
    struct ibv_qp_attr s = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
                            .sq_psn = c->psn, .max_rd_atomic = 1};
    rc = t->lib.modify_qp(c->qp, &s, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                         IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  }
  if (rc) {
    conn_fail(c, -EPROTO, 0);
    return;
  }
  c->ready = 1;
  unsigned wire = le32toh(peer->lid) >> 16 < t->wire ? le32toh(peer->lid) >> 16 : t->wire;
  if (wire >= WIRE_SENDS) {
    c->credits = CREDITS;
    c->bounce_max = wire >= WIRE_SENDS_16K ? BOUNCE_BYTES : BOUNCE_BYTES_V1;
  }
  struct uop *op;
  DL_FOREACH(c->sends, op) op->cts_by = now_s() + CTS_WAIT_S;
  send_answers(c);
}

/* --- sending ----------------------------------------------------------------- */

static void send_header(struct tconn *c, int kind, const struct uop *op) {
  struct wire_header h = {.kind = htole32((uint32_t)kind), .sid = htole32(op->id), .tag = htole64(op->tag),
                          .len = htole64(op->len)};
  note_send(c, TAG_HEADER, &h, sizeof(h));
}

/* op's bytes over the wrapped connection; its completion finishes op. */
static void send_eager(struct tconn *c, struct uop *op, int kind) {
  send_header(c, kind, op);
  int rc = c->failed ? c->failed : c->tcp_down ? c->tcp_down
                                   : ccs_transport_tcp.send(c->tcp, op->m->tcp, op->buf, op->len, TAG_EAGER, op);
  if (rc) {
    if (rc == -ECONNRESET) c->tcp_down = rc;
    else if (!c->failed) conn_fail(c, rc, 0);
    if (op->state == S_WAIT_CTS && !c->failed) uop_finish(op, rc, 0); /* (conn_fail finished it) */
    return;
  }
  op->state = S_EAGER;
  c->t->counters.eager_messages++;
  c->t->counters.eager_bytes += op->len;
}

/* A small message by SEND, header and bytes copied into a send buffer:
 * 0 when there is no credit, no buffer or no room in the send queue (or
 * the connection failed on the way). */
static int send_bounce(struct tconn *c, struct uop *op) {
  if (!c->ready || c->failed || c->tcp_down || !c->credits || !c->send_free || op->len > c->bounce_max)
    return 0;
  int slot = __builtin_ctzll(c->send_free);
  char *p = send_slot(c, slot);
  struct wire_header h = {.kind = htole32(H_SEND), .sid = htole32(op->id), .tag = htole64(op->tag),
                          .len = htole64(op->len)};
  memcpy(p, &h, sizeof(h));
  memcpy(p + sizeof(h), op->buf, op->len);
  struct ibv_sge sge = {.addr = (uintptr_t)p, .length = (uint32_t)(sizeof(h) + op->len), .lkey = c->bounce_mr->lkey};
  struct ibv_send_wr wr = {.wr_id = (uintptr_t)op, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                           .send_flags = IBV_SEND_SIGNALED},
                     *bad;
  int rc = ibv_post_send(c->qp, &wr, &bad);
  if (rc) { /* its queue full waits for a completion: one must come */
    if (rc != ENOMEM || !writing(c)) conn_fail(c, -(rc > 0 ? rc : EIO), 0);
    return 0;
  }
  c->send_free &= ~(1ull << slot);
  c->credits--;
  op->state = S_SENT;
  op->slot = slot;
  op->writes_left = 1;
  c->t->counters.send_messages++;
  c->t->counters.send_bytes += op->len;
  return 1;
}

/* Sends that wait for a credit or a send buffer take them, in turn: when
 * credits come back and when a send completes. A large message after one
 * of them could not be answered meanwhile (the receiver matches in the
 * sender's order): its wait for an answer starts again. */
static void send_waiting(struct tconn *c) {
  if (!c->credit_waits) return;
  double now = now_s();
  int behind = 0;
  for (struct uop *op = c->sends; op; op = op->next) {
    if (op->state == S_WAIT_CREDIT) {
      if (!send_bounce(c, op)) return; /* (a failure on the way finished the others) */
      c->credit_waits--;
      behind = 1;
    } else if (op->state == S_WAIT_CTS && behind) {
      op->cts_by = now + CTS_WAIT_S;
    }
  }
}

/* Writes op's bytes where the receiver said, the last write with its
 * immediate. */
static void send_write(struct tconn *c, struct uop *op, const struct wire_cts *cts) {
  op->state = S_WRITING;
  size_t writes = op->len ? (op->len + WRITE_MAX - 1) / WRITE_MAX : 1;
  for (size_t i = 0; i < writes; i++) {
    size_t off = i * WRITE_MAX, len = op->len - off < WRITE_MAX ? op->len - off : WRITE_MAX;
    struct ibv_sge sge = {.addr = (uintptr_t)op->buf + off, .length = (uint32_t)len, .lkey = op->m->mr[c->rail]->lkey};
    struct ibv_send_wr wr = {.wr_id = (uintptr_t)op,
                             .sg_list = &sge,
                             .num_sge = len ? 1 : 0,
                             .opcode = i + 1 == writes ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    wr.wr.rdma.remote_addr = le64toh(cts->addr) + off;
    wr.wr.rdma.rkey = le32toh(cts->rkey);
    if (i + 1 == writes) wr.imm_data = htobe32(le32toh(cts->rid));
    int rc = ibv_post_send(c->qp, &wr, &bad);
    if (rc) {
      conn_fail(c, -rc, 0);
      return;
    }
    op->writes_left++;
  }
  c->t->counters.rdma_messages++;
  c->t->counters.rdma_bytes += op->len;
}

static void on_cts(struct tconn *c, const struct wire_cts *cts) {
  uint32_t sid = le32toh(cts->sid);
  struct uop *op;
  DL_FOREACH(c->sends, op)
    if (op->id == sid) break;
  if (!op || op->state != S_WAIT_CTS || !c->ready) return; /* it went eager meanwhile */
  send_write(c, op, cts);
}

/* Sends whose answer is overdue go eager; none after one that waits for
 * a credit, which no answer can pass. */
static void overdue_sends(struct tconn *c, double now) {
  for (struct uop *op = c->sends, *next; op && !c->failed && op->state != S_WAIT_CREDIT; op = next) {
    next = op->next; /* (a failure on the way finishes the others: then no next) */
    if (op->state == S_WAIT_CTS && now >= op->cts_by) send_eager(c, op, H_EAGER);
  }
}

/* --- receiving ----------------------------------------------------------------- */

/* Answers matched messages while immediates can be taken. */
static void send_answers(struct tconn *c) {
  while (c->ready && !c->failed && c->want_cts && c->cts_out < RQ_DEPTH) {
    struct msg *m = c->want_cts;
    DL_DELETE(c->want_cts, m);
    m->want_cts = 0;
    struct uop *r = m->r;
    if (!r || m->eager) continue; /* its bytes come eager after all */
    struct wire_cts cts = {.sid = htole32(m->sid), .rid = htole32(r->id), .rkey = htole32(r->m->mr[c->rail]->rkey),
                           .addr = htole64((uintptr_t)r->buf)};
    m->cts_out = 1;
    c->cts_out++;
    HASH_ADD(hh, c->by_rid, id, sizeof(r->id), r);
    note_send(c, TAG_CTS, &cts, sizeof(cts));
  }
}

static void recv_done(struct tconn *c, struct msg *m) {
  struct uop *r = m->r;
  if (m->cts_out) {
    c->cts_out--;
    if (r && (!c->failed || c->quiescing)) HASH_DEL(c->by_rid, r); /* qp_stop emptied it */
  }
  size_t bytes = m->len;
  msg_free(c, m);
  if (r) {
    r->matched = NULL;
    uop_finish(r, 0, bytes);
  }
  send_answers(c);
}

/* Message m meets receive r (m no longer listed as unmatched). */
static void match(struct tconn *c, struct msg *m, struct uop *r) {
  if (m->len > r->len) { /* as over TCP: the receive fails, the sender does not hear of it */
    uop_finish(r, -EMSGSIZE, 0);
    if (m->arrived) msg_free(c, m);
    else m->doomed = 1; /* its bytes still come (eager, perhaps after a wait): dropped then */
    return;
  }
  m->r = r;
  r->matched = m;
  if (m->arrived) { /* held whole */
    memcpy(r->buf, m->held, m->len);
    recv_done(c, m);
  } else if (!m->eager) {
    DL_APPEND(c->want_cts, m);
    m->want_cts = 1;
    send_answers(c);
  }
}

/* Takes an eager message's bytes off the line: into its receive's buffer,
 * or held. */
static void take_bytes(struct tconn *c, struct msg *m) {
  if (m->want_cts) DL_DELETE(c->want_cts, m); /* no answer now: its bytes come */
  m->want_cts = 0;
  m->eager = 1;
  struct note *n = note_new(c, TAG_EAGER, 0);
  if (!n) {
    conn_fail(c, -ENOMEM, 0);
    return;
  }
  n->msg = m;
  int rc;
  if (m->r) {
    m->into_r = 1;
    rc = ccs_transport_tcp.recv(c->tcp, m->r->m->tcp, m->r->buf, m->len, TAG_EAGER, n);
  } else if (c->held + m->len > c->t->params.unexpected_per_conn ||
             !(m->held = malloc(m->len ? m->len : 1))) {
    rc = -ENOBUFS;
  } else {
    c->held += m->len;
    rc = ccs_transport_tcp.recv(c->tcp, NULL, m->held, m->len, TAG_EAGER, n);
  }
  if (rc) {
    m->into_r = 0;
    note_free(n);
    conn_fail(c, rc, rc == -ECONNRESET); /* reset: the wrapped one is down already */
    return;
  }
  m->receiving = 1;
}

/* The first receive of tag that no message matched yet. */
static struct uop *waiting_recv(struct tconn *c, uint64_t tag) {
  struct uop *r;
  DL_FOREACH(c->recvs, r)
    if (!r->matched && r->tag == tag) return r;
  return NULL;
}

/* Message m meets the first receive of its tag, or waits for one. */
static void admit(struct tconn *c, struct msg *m) {
  if (m->pending) DL_DELETE(c->pending, m);
  m->pending = 0;
  struct uop *r = waiting_recv(c, m->tag);
  if (r) match(c, m, r);
  else DL_APPEND(c->unmatched, m);
}

/* Messages are matched in the order they were sent (sid), whether their
 * header came over TCP or by SEND. */
static void admit_in_order(struct tconn *c) {
  for (struct msg *m;;) {
    HASH_FIND(hh, c->by_sid, &c->next_in, sizeof(c->next_in), m);
    if (!m || !m->pending) return;
    c->next_in++;
    admit(c, m);
  }
}

/* sid a comes before sid b (sids wrap) */
static int sid_before(uint32_t a, uint32_t b) { return b - a - 1 < 0x7fffffffu; }

static int sid_order(const struct msg *a, const struct msg *b) {
  return a->sid == b->sid ? 0 : sid_before(a->sid, b->sid) ? -1 : 1;
}

/* The connection failed: no gap in the sids fills now. What came is
 * matched, or held, in order; a header without its bytes goes. */
static void pending_flush(struct tconn *c) {
  DL_SORT(c->pending, sid_order);
  while (c->pending) {
    struct msg *m = c->pending;
    c->next_in = m->sid + 1;
    if (m->arrived || m->receiving) {
      admit(c, m);
    } else {
      DL_DELETE(c->pending, m);
      msg_free(c, m);
    }
  }
}

/* A new message's header: listed by sid, matched in order. */
static struct msg *msg_arrive(struct tconn *c, uint32_t sid, uint64_t tag, uint64_t len, int eager) {
  struct msg *m;
  HASH_FIND(hh, c->by_sid, &sid, sizeof(sid), m);
  if (m || (!c->failed && sid_before(sid, c->next_in))) { /* again */
    conn_fail(c, -EPROTO, 0);
    return NULL;
  }
  if (!(m = calloc(1, sizeof(*m)))) {
    conn_fail(c, -ENOMEM, 0);
    return NULL;
  }
  *m = (struct msg){.sid = sid, .tag = tag, .len = len, .eager = eager, .pending = 1};
  HASH_ADD(hh, c->by_sid, sid, sizeof(sid), m);
  DL_APPEND(c->pending, m);
  return m;
}

static void on_header(struct tconn *c, const struct wire_header *h) {
  uint32_t sid = le32toh(h->sid), kind = le32toh(h->kind);
  if (kind == H_EAGER) {
    struct msg *m;
    HASH_FIND(hh, c->by_sid, &sid, sizeof(sid), m);
    if (!m || m->eager) conn_fail(c, -EPROTO, 0);
    else take_bytes(c, m);
    return;
  }
  if (kind != H_MESSAGE && kind != H_EAGER_NOW) {
    conn_fail(c, -EPROTO, 0);
    return;
  }
  struct msg *m = msg_arrive(c, sid, le64toh(h->tag), le64toh(h->len), kind == H_EAGER_NOW);
  if (!m) return;
  admit_in_order(c);
  if (kind == H_EAGER_NOW && !c->failed) take_bytes(c, m); /* into its receive, or held */
}

/* The peer may send this many more by SEND. */
static void give_credit(struct tconn *c) {
  if (++c->credits_owed < CREDITS / 4) return;
  struct wire_credit k = {.count = htole32((uint32_t)c->credits_owed)};
  c->credits_owed = 0;
  note_send(c, TAG_CREDIT, &k, sizeof(k));
}

/* A SEND's message that is not taken straight into its receive: held
 * (and copied into its receive when matched), within the hold's cap. */
static void hold_sent(struct tconn *c, uint32_t sid, uint64_t tag, const char *bytes, uint64_t len) {
  struct msg *m = msg_arrive(c, sid, tag, len, 1);
  if (!m) return;
  if (!(m->held = malloc(len ? len : 1))) {
    conn_fail(c, -ENOMEM, 0);
    return;
  }
  memcpy(m->held, bytes, len);
  c->held += len;
  m->arrived = 1;
  if (!c->failed) {
    admit_in_order(c);
  } else if (sid_before(sid, c->next_in)) { /* later ones were matched when it failed */
    DL_DELETE(c->pending, m);
    msg_free(c, m);
  } else {
    pending_flush(c); /* landed while quiescing: no gap fills now */
  }
  HASH_FIND(hh, c->by_sid, &sid, sizeof(sid), m);
  if (m && c->held > c->t->params.unexpected_per_conn) conn_fail(c, -ENOBUFS, 0); /* (held, not matched) */
}

/* A SEND came into bounce buffer slot: its message goes straight into its
 * receive when it is its turn and the receive waits, else it is held; the
 * buffer is posted again. */
static void on_bounce(struct tconn *c, uint64_t slot, uint32_t bytes) {
  struct wire_header h;
  if (slot >= RECV_SLOTS || bytes < sizeof(h) || bytes > SLOT_BYTES) {
    conn_fail(c, -EPROTO, 0);
    return;
  }
  const char *p = recv_slot(c, slot);
  memcpy(&h, p, sizeof(h));
  uint32_t sid = le32toh(h.sid);
  uint64_t tag = le64toh(h.tag), len = le64toh(h.len);
  if (le32toh(h.kind) != H_SEND || len != bytes - sizeof(h)) {
    conn_fail(c, -EPROTO, 0);
    return;
  }
  struct uop *r = !c->failed && sid == c->next_in ? waiting_recv(c, tag) : NULL;
  if (r && len <= r->len) {
    memcpy(r->buf, p + sizeof(h), len);
    c->next_in++;
    uop_finish(r, 0, len);
    admit_in_order(c); /* those that came early, after it */
  } else {
    hold_sent(c, sid, tag, p + sizeof(h), len);
    if (c->failed && !c->quiescing) return;
  }
  if (post_slot(c, slot)) conn_fail(c, -EIO, 0);
  else give_credit(c);
}

/* An eager message's bytes are in. */
static void on_eager_bytes(struct tconn *c, struct msg *m) {
  m->receiving = 0;
  if (m->doomed) {
    msg_free(c, m);
  } else if (m->into_r) {
    recv_done(c, m);
  } else if (m->r) { /* matched while its bytes were on their way to the hold */
    memcpy(m->r->buf, m->held, m->len);
    recv_done(c, m);
  } else {
    m->arrived = 1; /* listed as unmatched: a receive takes it */
  }
}

static void on_immediate(struct tconn *c, uint32_t rid, uint64_t slot) {
  struct uop *r;
  HASH_FIND(hh, c->by_rid, &rid, sizeof(rid), r);
  if (!r || !r->matched || slot >= RECV_SLOTS || post_slot(c, slot)) {
    conn_fail(c, -EPROTO, 0);
    return;
  }
  recv_done(c, r->matched);
}

/* --- completions ---------------------------------------------------------------- */

static void on_wc(struct tconn *c, const struct ibv_wc *wc) {
  if (wc->status != IBV_WC_SUCCESS) {
    if (!c->failed && !c->why[0])
      snprintf(c->why, sizeof(c->why), "%s port %d: a work request of queue pair %u: %s (vendor error %#x)",
               c->t->rails[c->rail].port.dev, c->t->rails[c->rail].port.port,
               c->qp ? c->qp->qp_num : 0, c->t->lib.wc_status_str(wc->status), wc->vendor_err);
    conn_fail(c, wc->status == IBV_WC_RETRY_EXC_ERR ? -ECONNRESET : -EIO, 0);
    if (c->quiescing) qp_stop(c, c->failed); /* a write of its own failed: the rest will too */
    return;
  }
  if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    on_immediate(c, be32toh(wc->imm_data), wc->wr_id);
    return;
  }
  if (wc->opcode == IBV_WC_RECV) {
    on_bounce(c, wc->wr_id, wc->byte_len);
    return;
  }
  struct uop *op = (struct uop *)(uintptr_t)wc->wr_id;
  if (op && --op->writes_left == 0) uop_finish(op, 0, op->len);
  if (c->credit_waits) send_waiting(c); /* a send buffer, a place in the send queue */
}

static void poll_cq(struct tconn *c) {
  struct ibv_cq *cq;
  void *ctx;
  while (c->t->lib.get_cq_event(c->ch, &cq, &ctx) == 0) {
    c->t->lib.ack_cq_events(cq, 1);
    ibv_req_notify_cq(c->cq, 0);
  }
  struct ibv_wc wc[16];
  for (int n; (!c->failed || c->quiescing) && (n = ibv_poll_cq(c->cq, 16, wc)) > 0;)
    for (int i = 0; i < n && (!c->failed || c->quiescing); i++) on_wc(c, &wc[i]);
  if (c->quiescing && ((!writing(c) && !c->cts_out) || now_s() >= c->quiesce_by)) qp_stop(c, c->failed);
}

static void conn_free(struct tconn *c);

/* A closed connection goes once the wrapped one owes it nothing. */
static void release_if_done(struct tconn *c) {
  if (c->closed && !c->notes && !c->sends && !c->recvs) conn_free(c);
}

static void on_note(const struct tcompletion *tc) {
  struct note *n = tc->user;
  struct tconn *c = n->c;
  struct msg *m = n->msg;
  /* eager bytes that came count even on a failed connection: they came
   * before its end (a receive of them is not failed by conn_fail) */
  int ok = !tc->status && !c->closed && (!c->failed || (m && !n->is_send));
  if (ok && !n->is_send && tc->bytes != (m ? m->len : n->len)) {
    ok = 0;
    conn_fail(c, -EPROTO, 0);
  }
  if (tc->status && !c->closed) {
    if (!n->is_send && (n->tag == TAG_HEADER || n->tag == TAG_EAGER)) conn_fail(c, tc->status, 1);
    else c->tcp_down = tc->status; /* what is held is still taken (headers) */
  }
  if (ok && !n->is_send) {
    switch (n->tag) {
    case TAG_QP: qp_connect(c, &n->u.qp); break;
    case TAG_HEADER:
      on_header(c, &n->u.header);
      note_recv(c, TAG_HEADER, sizeof(n->u.header));
      break;
    case TAG_CTS:
      on_cts(c, &n->u.cts);
      note_recv(c, TAG_CTS, sizeof(n->u.cts));
      break;
    case TAG_CREDIT:
      c->credits += (int)le32toh(n->u.credit.count);
      if (c->credits > CREDITS) {
        conn_fail(c, -EPROTO, 0);
        break;
      }
      note_recv(c, TAG_CREDIT, sizeof(n->u.credit));
      send_waiting(c);
      break;
    case TAG_EAGER: on_eager_bytes(c, m); break;
    }
  } else if (m) { /* its bytes will not come: their receive fails, the message goes */
    m->receiving = 0;
    if (m->r) uop_finish(m->r, c->failed ? c->failed : -ECANCELED, 0);
    struct msg *x;
    DL_FOREACH(c->unmatched, x)
      if (x == m) break;
    if (x) DL_DELETE(c->unmatched, m);
    msg_free(c, m);
  }
  note_free(n);
  release_if_done(c);
}

/* A completion of the wrapped transport: the transport's own, an eager
 * send's, or one of a message without registration, passed through. */
static void on_tcp(struct transport *t, const struct tcompletion *tc) {
  if (tc->tag == TAG_EAGER && tc->is_send) {
    struct uop *op = tc->user;
    struct tconn *c = op->c;
    if (tc->status && !c->closed) conn_fail(c, tc->status, 1);
    uop_finish(op, tc->status, tc->status ? 0 : op->len);
    release_if_done(c);
  } else if (tc->tag >= TAG_QP && tc->tag <= TAG_LAST) {
    on_note(tc);
  } else {
    struct tconn *c = NULL;
    if (tc->conn)
      for (c = t->conns; c && c->tcp != tc->conn; c = c->next) {}
    complete(t, c, tc->tag, tc->user, tc->is_send, tc->status, tc->bytes);
  }
}

/* --- the table ------------------------------------------------------------------ */

/* A rail's news: its port down or its device lost fails every connection
 * on it, a queue pair in error its own; the other rails carry on. (Each
 * rail's context hears of every port of its device: a port's event is
 * taken by the rail on that port.) */
static void rail_events(struct transport *t, int rail) {
  const struct ib_port *port = &t->rails[rail].port;
  struct ibv_async_event ev;
  while (t->lib.get_async_event(port->ctx, &ev) == 0) {
    int status = 0;
    struct ibv_qp *qp = NULL;
    switch (ev.event_type) {
    case IBV_EVENT_PORT_ERR: status = ev.element.port_num == port->port ? -ENETDOWN : 0; break;
    case IBV_EVENT_DEVICE_FATAL: status = -ENETDOWN; break;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR: status = -EIO, qp = ev.element.qp; break;
    case IBV_EVENT_CQ_ERR: status = -EIO; break;
    default: break;
    }
    char why[160];
    if (qp)
      snprintf(why, sizeof(why), "%s port %d: queue pair %u: %s", port->dev, port->port,
               qp->qp_num, t->lib.event_type_str(ev.event_type));
    else
      snprintf(why, sizeof(why), "%s port %d: %s", port->dev, port->port,
               t->lib.event_type_str(ev.event_type));
    t->lib.ack_async_event(&ev);
    if (!status) continue;
    for (struct tconn *c = t->conns; c; c = c->next)
      if (!c->closed && c->rail == rail && (!qp || c->qp == qp)) {
        if (!c->failed) {
          snprintf(c->why, sizeof(c->why), "%s", why);
          c->why_local = 1;
        }
        conn_fail(c, status, 0);
      }
  }
}

static void async_events(struct transport *t) {
  for (int r = 0; r < t->nrails; r++) rail_events(t, r);
}

/* The rails' devices and the library, once nothing holds them. */
static void rails_close(struct transport *t) {
  for (int r = 0; r < t->nrails; r++) {
    if (t->rails[r].pd) t->lib.dealloc_pd(t->rails[r].pd);
    t->lib.close_device(t->rails[r].port.ctx);
  }
  ccs_verbs_lib_close(&t->lib);
}

static struct transport *ib_open(const struct transport_params *params, char *err, size_t errlen) {
  if (params->encrypt_data) {
    snprintf(err, errlen, "peer_encrypt needs transport tcp: RDMA writes go around the cipher");
    return NULL;
  }
  struct transport *t = calloc(1, sizeof(*t));
  if (!t) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  t->params = *params;
  t->wire = WIRE_SENDS_16K;
  ccs_auth_wipe_key(&t->params); /* the wrapped transport keeps its own copy */
  atomic_init(&t->refs, 1);
  struct ib_want want[CCS_IB_WANT_MAX];
  int nwant = ccs_ib_parse_devices(params->ib_devices, want, CCS_IB_WANT_MAX, err, errlen);
  const char *path = params->ib_library && *params->ib_library ? params->ib_library : "libibverbs.so.1";
  if (nwant < 0 || ccs_verbs_lib_open(&t->lib, path, err, errlen)) {
    free(t);
    return NULL;
  }
  struct ib_port ports[CCS_IB_RAILS_MAX];
  int n = ccs_ib_open_ports(&t->lib, want, nwant, params->ib_gid_index, ports, CCS_IB_RAILS_MAX, err, errlen);
  if (n < 0) {
    ccs_verbs_lib_close(&t->lib);
    free(t);
    return NULL;
  }
  int ok = 1;
  for (t->nrails = 0; t->nrails < n; t->nrails++) t->rails[t->nrails].port = ports[t->nrails];
  for (int r = 0; r < n && ok; r++) {
    struct rail *rl = &t->rails[r];
    fcntl(rl->port.ctx->async_fd, F_SETFL, fcntl(rl->port.ctx->async_fd, F_GETFL) | O_NONBLOCK);
    if (!(rl->pd = t->lib.alloc_pd(rl->port.ctx)))
      ok = 0, snprintf(err, errlen, "%s: cannot allocate a protection domain", rl->port.dev);
  }
  if (ok && (t->tcp = ccs_transport_tcp.open(params, err, errlen))) return t;
  rails_close(t);
  free(t);
  return NULL;
}

static int ib_listen(struct transport *t, const char *addr, char *bound, size_t boundlen, char *err,
                     size_t errlen) {
  return ccs_transport_tcp.listen(t->tcp, addr, bound, boundlen, err, errlen);
}

static struct tconn *wrap(struct transport *t, struct tconn *tcp, char *err, size_t errlen) {
  struct tconn *c = calloc(1, sizeof(*c));
  if (!c) {
    ccs_transport_tcp.close(tcp);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  c->t = t;
  c->tcp = tcp;
  c->rail = (int)(t->next_rail++ % (unsigned)t->nrails);
  DL_APPEND(t->conns, c);
  if (qp_create(t, c, err, errlen)) {
    c->closed = 1;
    conn_fail(c, -ECANCELED, 0); /* the wrapped connection goes, its notes with it */
    release_if_done(c);
    return NULL;
  }
  return c;
}

static int ib_connect(struct transport *t, const char *addr, struct tconn **ret, char *err, size_t errlen) {
  struct tconn *tcp;
  if (ccs_transport_tcp.connect(t->tcp, addr, &tcp, err, errlen)) return -1;
  return (*ret = wrap(t, tcp, err, errlen)) ? 0 : -1;
}

static int ib_accept(struct transport *t, struct tconn **ret, char *err, size_t errlen) {
  struct tconn *tcp;
  int rc = ccs_transport_tcp.accept(t->tcp, &tcp, err, errlen);
  if (rc != 1) return rc;
  return (*ret = wrap(t, tcp, err, errlen)) ? 1 : -1;
}

static struct tmem *ib_mem_register(struct transport *t, void *base, size_t len, char *err, size_t errlen) {
  struct tmem *m = calloc(1, sizeof(*m));
  if (!m) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  m->t = t;
  m->base = base;
  m->len = len;
  if (!(m->tcp = ccs_transport_tcp.mem_register(t->tcp, base, len, err, errlen))) {
    free(m);
    return NULL;
  }
  /* on every rail, as a connection on any may carry its messages; a
   * zero-length range is registered as one byte: verbs knows no empty one */
  for (int r = 0; r < t->nrails; r++)
    if (!(m->mr[r] = t->lib.reg_mr(t->rails[r].pd, base, len ? len : 1,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE))) {
      snprintf(err, errlen, "%s: cannot register %zu bytes: %s", t->rails[r].port.dev, len, strerror(errno));
      while (r-- > 0) t->lib.dereg_mr(m->mr[r]);
      ccs_transport_tcp.mem_deregister(m->tcp);
      free(m);
      return NULL;
    }
  atomic_fetch_add(&t->refs, 1);
  return m;
}

static void device_unref(struct transport *t) {
  if (atomic_fetch_sub(&t->refs, 1) != 1) return;
  rails_close(t);
  free(t);
}

/* A registration may outlive the transport (an op finishing after the
 * network side stopped): the last one closes the devices. */
static void ib_mem_deregister(struct tmem *m) {
  if (!m) return;
  struct transport *t = m->t;
  for (int r = 0; r < t->nrails; r++) t->lib.dereg_mr(m->mr[r]);
  ccs_transport_tcp.mem_deregister(m->tcp);
  free(m);
  device_unref(t);
}

static int outside(const struct tmem *m, const void *buf, size_t len) {
  uintptr_t b = (uintptr_t)buf, lo = (uintptr_t)m->base;
  return b < lo || b - lo > m->len || len > m->len - (b - lo);
}

static struct uop *uop_new(struct tconn *c, int is_send, struct tmem *m, const void *buf, size_t len,
                           uint64_t tag, void *user) {
  struct uop *op = calloc(1, sizeof(*op));
  if (op)
    *op = (struct uop){.c = c, .is_send = is_send, .m = m, .buf = (char *)buf, .len = len, .tag = tag,
                       .user = user, .slot = -1};
  return op;
}

static int ib_send(struct tconn *c, struct tmem *m, const void *buf, size_t len, uint64_t tag, void *user) {
  if (!m) return c->tcp ? ccs_transport_tcp.send(c->tcp, NULL, buf, len, tag, user) : -ECONNRESET;
  if (outside(m, buf, len)) return -EFAULT;
  if (c->failed || c->tcp_down) return -ECONNRESET;
  struct uop *op = uop_new(c, 1, m, buf, len, tag, user);
  if (!op) return -ENOMEM;
  op->id = c->next_sid++;
  op->cts_by = now_s() + CTS_WAIT_S;
  DL_APPEND(c->sends, op);
  if (len >= RENDEZVOUS_MIN) {
    send_header(c, H_MESSAGE, op);
  } else if (c->credit_waits || !send_bounce(c, op)) {
    if (c->failed) return 0; /* on the way: it finished op */
    if (c->bounce_max && len <= c->bounce_max) op->state = S_WAIT_CREDIT, c->credit_waits++; /* in turn */
    else send_eager(c, op, H_EAGER_NOW); /* (queue pair not up, or the peer takes no SENDs this long) */
  }
  return 0; /* a failure on the way completes it */
}

static int ib_recv(struct tconn *c, struct tmem *m, void *buf, size_t len, uint64_t tag, void *user) {
  if (!m) return c->tcp ? ccs_transport_tcp.recv(c->tcp, NULL, buf, len, tag, user) : -ECONNRESET;
  if (outside(m, buf, len)) return -EFAULT;
  struct msg *x;
  DL_FOREACH(c->unmatched, x)
    if (x->tag == tag) break;
  if (c->failed && !(x && x->arrived)) return -ECONNRESET;
  struct uop *op = uop_new(c, 0, m, buf, len, tag, user);
  if (!op) return -ENOMEM;
  op->id = c->next_rid++;
  DL_APPEND(c->recvs, op);
  if (x) {
    DL_DELETE(c->unmatched, x);
    match(c, x, op);
  }
  return 0;
}

static void conn_free(struct tconn *c) {
  struct transport *t = c->t;
  if (c->qp) t->lib.destroy_qp(c->qp);
  if (c->cq) t->lib.destroy_cq(c->cq);
  if (c->ch) t->lib.destroy_comp_channel(c->ch);
  if (c->bounce_mr) t->lib.dereg_mr(c->bounce_mr);
  free(c->bounce);
  struct msg *m, *tmp;
  HASH_ITER(hh, c->by_sid, m, tmp) msg_free(c, m);
  DL_DELETE(t->conns, c);
  free(c);
}

static void ib_close(struct tconn *c) {
  c->closed = 1;
  for (struct done *d = c->t->done; d; d = d->next)
    if (d->tc.conn == c) d->tc.conn = NULL;
  if (!c->failed) conn_fail(c, -ECANCELED, 0); /* the rest completes (canceled) at the next poll */
  else if (c->quiescing) qp_stop(c, -ECANCELED);
  if (c->tcp) ccs_transport_tcp.close(c->tcp);
  c->tcp = NULL;
  release_if_done(c);
}

static int ib_wait_fds(struct transport *t, struct pollfd *fds, int max) {
  int n = ccs_transport_tcp.wait_fds(t->tcp, fds, max);
  for (int r = 0; r < t->nrails; r++)
    if (n++ < max) fds[n - 1] = (struct pollfd){t->rails[r].port.ctx->async_fd, POLLIN, 0};
  for (struct tconn *c = t->conns; c; c = c->next)
    if (!c->closed && (!c->failed || c->quiescing) && c->ch && n++ < max)
      fds[n - 1] = (struct pollfd){c->ch->fd, POLLIN, 0};
  return n;
}

/* How long until the first send waiting for its answer goes eager, in
 * ms (-1: none waits). */
static int next_deadline_ms(struct transport *t, double now) {
  double first = 0;
  for (struct tconn *c = t->conns; c; c = c->next) {
    for (struct uop *op = c->sends; op && op->state != S_WAIT_CREDIT; op = op->next) /* (overdue_sends) */
      if (op->state == S_WAIT_CTS && (!first || op->cts_by < first)) first = op->cts_by;
    if (c->quiescing && (!first || c->quiesce_by < first)) first = c->quiesce_by;
  }
  if (!first) return -1;
  return first <= now ? 0 : (int)((first - now) * 1000) + 1;
}

static int ib_poll(struct transport *t, int timeout_ms, struct tcompletion *out, int max) {
  int wait = t->done ? 0 : timeout_ms, deadline = next_deadline_ms(t, now_s());
  if (deadline >= 0 && (wait < 0 || deadline < wait)) wait = deadline;
  if (wait) { /* asleep on everything at once: the polls below take what came */
    int n = ib_wait_fds(t, t->fds, t->nfds_cap);
    if (n > t->nfds_cap) {
      struct pollfd *more = realloc(t->fds, sizeof(*more) * (size_t)n * 2);
      if (more) t->fds = more, t->nfds_cap = n * 2;
      n = ib_wait_fds(t, t->fds, t->nfds_cap);
      if (n > t->nfds_cap) n = t->nfds_cap;
    }
    poll(t->fds, (nfds_t)n, wait);
  }
  async_events(t);
  /* the queue pairs first: what they finished happened before a close the
   * wrapped connections may report */
  for (struct tconn *c = t->conns; c; c = c->next)
    if (!c->closed && (!c->failed || c->quiescing)) poll_cq(c);
  struct tcompletion tc[64];
  int n = ccs_transport_tcp.poll(t->tcp, 0, tc, 64);
  for (int i = 0; i < n; i++) on_tcp(t, &tc[i]);
  double now = now_s();
  for (struct tconn *c = t->conns; c; c = c->next)
    if (!c->closed && !c->failed) overdue_sends(c, now);
  int got = 0;
  while (got < max && t->done) {
    struct done *d = t->done;
    if (!(t->done = d->next)) t->done_tail = NULL;
    out[got++] = d->tc;
    free(d);
  }
  return got;
}

static void ib_wake(struct transport *t) { ccs_transport_tcp.wake(t->tcp); }

static void ib_free(struct transport *t) {
  if (!t) return;
  for (struct tconn *c = t->conns, *next; c; c = next) {
    next = c->next;
    if (!c->closed) ib_close(c);
  }
  /* what the closed connections still owe completes (canceled) now */
  struct tcompletion tc[64];
  for (int n; t->conns && (n = ccs_transport_tcp.poll(t->tcp, 0, tc, 64)) > 0;)
    for (int i = 0; i < n; i++) on_tcp(t, &tc[i]);
  while (t->conns) {
    struct note *n, *tmp;
    DL_FOREACH_SAFE(t->conns->notes, n, tmp) note_free(n);
    conn_free(t->conns);
  }
  ccs_transport_tcp.free(t->tcp);
  for (struct done *d = t->done, *next; d; d = next) next = d->next, free(d);
  free(t->fds);
  t->fds = NULL;
  device_unref(t);
}

static void ib_counters(struct transport *t, struct transport_counters *out) { *out = t->counters; }

void ccs_ib_test_wire(struct transport *t, unsigned wire) { t->wire = wire; }
int ccs_ib_test_credits(const struct tconn *c) { return c->ready ? c->credits : -1; }

static int ib_failure(struct tconn *c, char *buf, size_t len) {
  if (!c->failed || !c->why[0]) return 0;
  snprintf(buf, len, "%s", c->why);
  return c->why_local ? 2 : 1;
}

static void ib_peer_name(struct tconn *c, char *buf, size_t len) {
  if (c->tcp) ccs_transport_tcp.peer_name(c->tcp, buf, len);
  else snprintf(buf, len, "?");
}

static void ib_describe(struct transport *t, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "RDMA verbs on");
  for (int r = 0; r < t->nrails && at < len; r++) {
    const struct ib_port *p = &t->rails[r].port;
    at += (size_t)snprintf(buf + at, len - at, "%s %s port %d (%s, GID index %d, MTU %d, %.0f Gb/s)",
                           r ? "," : "", p->dev, p->port, p->ethernet ? "RoCE" : "InfiniBand",
                           p->gid_index, 128 << p->attr.active_mtu, ccs_ib_port_gbps(&p->attr));
  }
  if (at < len) snprintf(buf + at, len - at, "%s; control over TCP",
                         t->nrails > 1 ? ", connections taking the ports in turn" : "");
}

/* A connection's rate (it runs on one port: the slowest counts), less
 * what headers take (90%). */
static double ib_link_rate(struct transport *t) {
  double gbps = ccs_ib_port_gbps(&t->rails[0].port.attr);
  for (int r = 1; r < t->nrails; r++) {
    double g = ccs_ib_port_gbps(&t->rails[r].port.attr);
    if (g < gbps) gbps = g;
  }
  return 0.9 * gbps * 1e9 / 8;
}

/* rendezvous headers and eager bytes waiting for their receives, or
 * what the wrapped connection still holds */
static int ib_holds(struct tconn *c) {
  return c->pending || c->unmatched || c->held || (c->tcp && ccs_transport_tcp.holds(c->tcp));
}

struct held_pass {
  void (*each)(void *arg, uint64_t tag, void *data, size_t len);
  void *arg;
};

/* what the wrapped connection holds: the caller's messages, not ours */
static void pass_held(void *arg, uint64_t tag, void *data, size_t len) {
  const struct held_pass *p = arg;
  if (tag >= TAG_QP && tag <= TAG_LAST) free(data);
  else p->each(p->arg, tag, data, len);
}

/* Once the peer closed the wrapped connection cleanly and every header it
 * sent was taken (the connection failed when they ran out), with no eager
 * bytes still on their way: the eager messages no receive matched (a send
 * that finished without an answer went eager), and those without a
 * registration the wrapped connection holds. A failure of this side's
 * own closed the wrapped connection: nothing is said of what came. */
static int ib_take_held(struct tconn *c, void (*each)(void *arg, uint64_t tag, void *data, size_t len),
                        void *arg) {
  if (!c->failed) return 0;
  if (!c->tcp || c->closed) return -1;
  int rc = ccs_transport_tcp.take_held(c->tcp, NULL, NULL);
  struct msg *m, *tmp;
  DL_FOREACH(c->unmatched, m)
    if (m->receiving && rc == 1) rc = 0;
  if (rc != 1 || !each) return rc;
  DL_FOREACH_SAFE(c->unmatched, m, tmp) {
    if (!m->arrived) continue;
    DL_DELETE(c->unmatched, m);
    void *data = m->held;
    c->held -= m->len;
    m->held = NULL;
    uint64_t tag = m->tag;
    size_t len = m->len;
    msg_free(c, m);
    each(arg, tag, data, len);
  }
  struct held_pass pass = {each, arg};
  return ccs_transport_tcp.take_held(c->tcp, pass_held, &pass);
}

const struct transport_ops ccs_transport_ib = {
    .name = "ib",
    .open = ib_open,
    .listen = ib_listen,
    .connect = ib_connect,
    .accept = ib_accept,
    .mem_register = ib_mem_register,
    .mem_deregister = ib_mem_deregister,
    .send = ib_send,
    .recv = ib_recv,
    .poll = ib_poll,
    .wait_fds = ib_wait_fds,
    .close = ib_close,
    .free = ib_free,
    .wake = ib_wake,
    .peer_name = ib_peer_name,
    .holds = ib_holds,
    .take_held = ib_take_held,
    .failure = ib_failure,
    .describe = ib_describe,
    .link_rate = ib_link_rate,
    .counters = ib_counters,
};
