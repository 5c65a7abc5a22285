/* The emulated wire between queue pairs, and the progress thread of each
 * context that drives it.
 *
 * Each QP listens on a Unix SOCK_SEQPACKET socket $CCS_VERBS_EMU_DIR/qp-<qpn>
 * (binding it is how a QP number is claimed across processes). From RTR on
 * a QP connects to its peer's socket: that connection ("req") carries its
 * requests out and the peer's acknowledgements, NAKs and read data back;
 * the connection the peer makes to it ("resp") does the same the other way.
 * A packet is a struct emu_pkt followed by up to EMU_PAYLOAD bytes.
 *
 * Handshake: the requester sends HELLO with its QP number; the responder
 * answers HELLO_ACK, with the GID its port has at its sgid_index, once it
 * is at RTR itself and only if HELLO came from its dest_qp_num. The
 * requester compares that GID with its address vector's dgid. A peer not
 * there yet is retried quietly; a refused or misaddressed connection leaves
 * the sends to time out with RETRY_EXC_ERR, as packets sent to nobody do.
 *
 * Requests carry their place in the send queue since RESET (seq) and a PSN
 * (sq_psn + seq) the responder checks against its rq_psn, dropping what it
 * does not expect. The responder executes requests strictly in order and
 * answers each, in order: ACK, read data, or NAK. After an RNR NAK it drops
 * everything until the requester sends the refused message again from its
 * start (IB's go-back-N). A send completes only when its answer came. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "verbs_emu.h"

enum emu_pkt_type {
  PKT_HELLO = 1,
  PKT_HELLO_ACK,
  PKT_REQ,
  PKT_ACK,
  PKT_RNR_NAK,
  PKT_NAK,
  PKT_READ_RESP,
};

#define PKT_MAGIC 0x554d4556u /* "VEMU" */
#define PKT_SOLICITED 1u
#define PKT_LAST 2u         /* the last packet of read data */
#define READS_PER_ROUND 64  /* packets read from one socket before the others get a turn */
#define MAX_ANSWERS 64      /* a responder this far behind stops reading requests */
#define RAISE_PERIOD_S 0.05 /* how often the raise file is looked for */
#define MIN_BUDGET_S 0.1

struct emu_pkt {
  uint32_t magic;
  uint8_t type, opcode, flags, rnr_timer;
  uint32_t qpn; /* the sender's */
  uint32_t psn, rkey, imm;
  int32_t status; /* PKT_NAK: the requester's completion status */
  uint64_t seq, msg_len, offset, raddr;
  union ibv_gid gid; /* PKT_HELLO_ACK */
};

static void sock_set(struct emu_ctx *ctx, struct emu_sock *s, int fd) {
  s->fd = fd;
  s->gen = ++ctx->sock_gen;
  s->pi = -1;
}

static void sock_close(struct emu_sock *s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
  s->pi = -1;
}

static bool port_up(const struct emu_qp *qp) {
  return qp->attr.port_num == 0 ||
         atomic_load(&qp->ctx->dev->port[qp->attr.port_num - 1].state) == IBV_PORT_ACTIVE;
}

/* timeout and retry_cnt as hardware spends them (4.096 us * 2^timeout per
 * try), with a floor so that a loaded test machine does not fail early. */
double emu_retry_budget(const struct emu_qp *qp) {
  if (qp->attr.timeout == 0) return INFINITY;
  double t = 4.096e-6 * (double)(1ull << qp->attr.timeout) * (qp->attr.retry_cnt + 1);
  return t < MIN_BUDGET_S ? MIN_BUDGET_S : t;
}

/* The IB encoding of min_rnr_timer, in seconds (at least 1 ms: poll()'s grain). */
static double rnr_delay(unsigned timer) {
  static const double ms[32] = {655.36, 0.01,  0.02,  0.03,  0.04,  0.06,   0.08,   0.12,
                                0.16,   0.24,  0.32,  0.48,  0.64,  0.96,   1.28,   1.92,
                                2.56,   3.84,  5.12,  7.68,  10.24, 15.36,  20.48,  30.72,
                                40.96,  61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52};
  double d = ms[timer & 31] / 1000;
  return d < 0.001 ? 0.001 : d;
}

/* One packet: 1 sent, 0 the socket is full, -1 the connection is gone. */
static int pkt_send(int fd, const struct emu_pkt *h, const void *data, size_t len) {
  struct iovec iov[2] = {{(void *)h, sizeof(*h)}, {(void *)data, len}};
  struct msghdr m = {.msg_iov = iov, .msg_iovlen = len ? 2 : 1};
  if (sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0) return 1;
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ENOBUFS ? 0 : -1;
}

/* One packet into ctx->rx_buf: 1 (its header copied to h, its payload
 * length in len), 0 none yet, -1 the connection closed or spoke nonsense. */
static int pkt_recv(struct emu_ctx *ctx, int fd, struct emu_pkt *h, size_t *len) {
  ssize_t n = recv(fd, ctx->rx_buf, sizeof(*h) + EMU_PAYLOAD, MSG_DONTWAIT);
  /* A peer that closed with our packets unread makes Linux report
   * ECONNRESET once, ahead of the packets it sent before: read those
   * still (the NAK that explains the close among them), then the end. */
  if (n < 0 && errno == ECONNRESET) n = recv(fd, ctx->rx_buf, sizeof(*h) + EMU_PAYLOAD, MSG_DONTWAIT);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
  if ((size_t)n < sizeof(*h)) return -1; /* 0: closed */
  memcpy(h, ctx->rx_buf, sizeof(*h));
  if (h->magic != PKT_MAGIC) return -1;
  *len = (size_t)n - sizeof(*h);
  return 1;
}

static int mkdir_p(const char *dir) {
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s", dir);
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p) continue;
    char c = *p;
    *p = 0;
    if (mkdir(path, 0700) && errno != EEXIST) return -1;
    if (!c) return 0;
    *p = c;
  }
}

/* Claims a random QP number by binding its socket name (ctx->lock held). */
int emu_wire_bind(struct emu_qp *qp) {
  struct emu_ctx *ctx = qp->ctx;
  if (!ctx->dir[0]) {
    fprintf(stderr, "verbs_emu: CCS_VERBS_EMU_DIR is not set: no queue pairs\n");
    errno = ENOENT;
    return -1;
  }
  if (!ctx->dir_made && mkdir_p(ctx->dir)) return -1;
  ctx->dir_made = true;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  for (int tries = 0; tries < 100; tries++) {
    uint32_t qpn = emu_random32() & 0xffffff;
    if (qpn < 2) continue; /* QP0 and QP1 are the management QPs */
    if (snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/qp-%u", ctx->dir, qpn) >=
        (int)sizeof(sa.sun_path)) {
      close(fd);
      errno = ENAMETOOLONG;
      return -1;
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
      if (listen(fd, 16)) {
        int err = errno;
        unlink(sa.sun_path);
        close(fd);
        errno = err;
        return -1;
      }
      qp->ibqp.qp_num = qpn;
      memcpy(qp->path, sa.sun_path, sizeof(qp->path));
      sock_set(ctx, &qp->lsn, fd);
      return 0;
    }
    if (errno != EADDRINUSE) break;
  }
  int err = errno;
  close(fd);
  errno = err;
  return -1;
}

/* ---- responder -------------------------------------------------------------- */

static struct emu_answer *answer(struct emu_qp *qp, int type, uint64_t seq, int status) {
  struct emu_answer *a = calloc(1, sizeof(*a));
  if (!a) return NULL; /* never sent: the requester times out */
  a->type = type;
  a->seq = seq;
  a->status = status;
  a->rnr_timer = (uint8_t)qp->attr.min_rnr_timer;
  if (qp->ans_tail)
    qp->ans_tail->next = a;
  else
    qp->ans_head = a;
  qp->ans_tail = a;
  qp->ans_count++;
  return a;
}

static void answers_free(struct emu_qp *qp) {
  while (qp->ans_head) {
    struct emu_answer *a = qp->ans_head;
    qp->ans_head = a->next;
    free(a);
  }
  qp->ans_tail = NULL;
  qp->ans_count = qp->ans_reads = 0;
}

/* The requester's connection is gone (or refused): what it half sent is
 * forgotten and its receive goes back to the front, unused. */
static void resp_lost(struct emu_qp *qp) {
  sock_close(&qp->resp);
  answers_free(qp);
  if (qp->in_recv) {
    qp->in_recv->next = qp->rq_head;
    qp->rq_head = qp->in_recv;
    if (!qp->rq_tail) qp->rq_tail = qp->in_recv;
    qp->in_recv = NULL;
  }
  qp->in_msg = qp->hello_pending = qp->resp_ready = qp->resp_draining = false;
}

/* A fatal error of an incoming request: NAK it, then ERR (which drains the
 * answers, the NAK last, before closing). */
static void resp_fail(struct emu_qp *qp, uint64_t seq, enum ibv_wc_status requester_status) {
  answer(qp, PKT_NAK, seq, requester_status);
  emu_qp_error(qp);
}

static void resp_hello(struct emu_qp *qp) {
  if (!qp->hello_pending || (qp->state != IBV_QPS_RTR && qp->state != IBV_QPS_RTS)) return;
  qp->hello_pending = false;
  if (qp->peer_qpn != qp->attr.dest_qp_num) { /* not the QP we were told */
    resp_lost(qp);
    return;
  }
  struct emu_pkt h = {.magic = PKT_MAGIC, .type = PKT_HELLO_ACK, .qpn = qp->ibqp.qp_num};
  h.gid = qp->ctx->dev->port[qp->attr.port_num - 1].gid[qp->attr.ah_attr.grh.sgid_index];
  if (pkt_send(qp->resp.fd, &h, NULL, 0) != 1) {
    resp_lost(qp);
    return;
  }
  qp->resp_ready = true;
  qp->expect_seq = 0;
  qp->in_msg = false;
}

static bool resp_may_read(const struct emu_qp *qp) {
  return !qp->resp_draining && !qp->hello_pending && qp->ans_count < MAX_ANSWERS && !qp->ans_reads;
}

/* The first packet of a request: the checks hardware makes before it
 * executes anything. True when its data is to be taken in. */
static bool resp_start(struct emu_qp *qp, const struct emu_pkt *h) {
  int op = h->opcode;
  bool send = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM;
  bool write = op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
  bool read = op == IBV_WR_RDMA_READ;
  if (!send && !write && !read) {
    resp_fail(qp, h->seq, IBV_WC_REM_INV_REQ_ERR);
    return false;
  }
  if (write || read) {
    /* the QP must allow the operation at all (NAK: invalid request), the
     * key's region this range (NAK: remote access); zero bytes need no key */
    int need = write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
    if (!(qp->attr.qp_access_flags & need)) {
      resp_fail(qp, h->seq, IBV_WC_REM_INV_REQ_ERR);
      return false;
    }
    if (h->msg_len && !emu_mr_find(qp, h->rkey, true, h->raddr, h->msg_len, need)) {
      resp_fail(qp, h->seq, IBV_WC_REM_ACCESS_ERR);
      return false;
    }
  }
  if (read) { /* answered with data as the socket takes it */
    struct emu_answer *a = answer(qp, PKT_READ_RESP, h->seq, 0);
    if (a) {
      a->raddr = h->raddr;
      a->len = h->msg_len;
      a->rkey = h->rkey;
      qp->ans_reads++;
    }
    qp->expect_seq++;
    return false;
  }
  if (send || op == IBV_WR_RDMA_WRITE_WITH_IMM) {
    struct emu_rwr *r = qp->rq_head;
    if (!r) { /* receiver not ready: the requester backs off and sends it again */
      answer(qp, PKT_RNR_NAK, h->seq, 0);
      return false;
    }
    qp->rq_head = r->next;
    if (!qp->rq_head) qp->rq_tail = NULL;
    uint64_t room = 0;
    for (int i = 0; i < r->nsge; i++) room += r->sge[i].length;
    if (send && room < h->msg_len) {
      emu_rq_complete(qp, r, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0, 0, 0, false);
      resp_fail(qp, h->seq, IBV_WC_REM_INV_REQ_ERR);
      return false;
    }
    qp->in_recv = r;
  }
  qp->in_msg = true;
  qp->in_opcode = op;
  qp->in_flags = h->flags;
  qp->in_len = h->msg_len;
  qp->in_off = 0;
  qp->in_raddr = h->raddr;
  qp->in_rkey = h->rkey;
  qp->in_imm = h->imm;
  return true;
}

static void resp_request(struct emu_qp *qp, const struct emu_pkt *h, const uint8_t *data, size_t len) {
  if (qp->state != IBV_QPS_RTR && qp->state != IBV_QPS_RTS) return;
  /* after an RNR NAK: everything until the refused message comes again */
  if (h->seq != qp->expect_seq || (h->offset != 0 && !qp->in_msg)) return;
  if (h->psn != ((qp->attr.rq_psn + h->seq) & 0xffffff)) return; /* not the PSN expected: dropped */
  if (h->offset == 0 && !qp->in_msg && !resp_start(qp, h)) return;
  if (h->offset != qp->in_off || len > qp->in_len - qp->in_off) {
    fprintf(stderr, "verbs_emu: qp %u: request out of order (seq %lu offset %lu)\n", qp->ibqp.qp_num,
            (unsigned long)h->seq, (unsigned long)h->offset);
    resp_lost(qp);
    return;
  }
  int op = qp->in_opcode;
  bool send = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM;
  if (len && send) {
    if (emu_sge_copy(qp, qp->in_recv->sge, qp->in_recv->nsge, h->offset, (void *)data, len,
                     IBV_ACCESS_LOCAL_WRITE, true)) {
      struct emu_rwr *r = qp->in_recv;
      qp->in_recv = NULL;
      qp->in_msg = false;
      emu_rq_complete(qp, r, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0, 0, 0, false);
      resp_fail(qp, h->seq, IBV_WC_REM_OP_ERR);
      return;
    }
  } else if (len) { /* the key again: the region may have been deregistered meanwhile */
    uintptr_t at = (uintptr_t)(qp->in_raddr + h->offset);
    if (!emu_mr_find(qp, qp->in_rkey, true, at, len, IBV_ACCESS_REMOTE_WRITE)) {
      resp_fail(qp, h->seq, IBV_WC_REM_ACCESS_ERR);
      return;
    }
    memcpy((void *)at, data, len);
  }
  qp->in_off += len;
  if (qp->in_off < qp->in_len) return;
  /* executed: acknowledge it and complete the receive it consumed */
  struct emu_rwr *r = qp->in_recv;
  qp->in_recv = NULL;
  qp->in_msg = false;
  qp->expect_seq++;
  answer(qp, PKT_ACK, h->seq, 0);
  if (r) {
    bool imm = op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
    emu_rq_complete(qp, r, IBV_WC_SUCCESS, send ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM,
                    (uint32_t)qp->in_len, imm ? IBV_WC_WITH_IMM : 0, imm ? qp->in_imm : 0,
                    qp->in_flags & PKT_SOLICITED);
  }
}

static void resp_input(struct emu_qp *qp, short revents) {
  struct emu_ctx *ctx = qp->ctx;
  if (!(revents & POLLIN)) { /* hung up while we were not reading */
    if (revents & (POLLHUP | POLLERR)) resp_lost(qp);
    return;
  }
  for (int i = 0; i < READS_PER_ROUND && qp->resp.fd >= 0 && resp_may_read(qp); i++) {
    struct emu_pkt h;
    size_t len;
    int rc = pkt_recv(ctx, qp->resp.fd, &h, &len);
    if (rc == 0) return;
    if (rc < 0) {
      resp_lost(qp);
      return;
    }
    if (h.type == PKT_HELLO && !qp->resp_ready) {
      qp->hello_pending = true;
      qp->peer_qpn = h.qpn;
      resp_hello(qp);
    } else if (h.type == PKT_REQ && qp->resp_ready) {
      resp_request(qp, &h, ctx->rx_buf + sizeof(h), len);
    } else {
      fprintf(stderr, "verbs_emu: qp %u: unexpected packet %d from qp %u\n", qp->ibqp.qp_num, h.type,
              h.qpn);
      resp_lost(qp);
      return;
    }
  }
}

/* Sends the answers owed, in order; read data straight from the region,
 * checked again for every packet. */
static void resp_flush(struct emu_qp *qp) {
  while (qp->ans_head && qp->resp.fd >= 0) {
    struct emu_answer *a = qp->ans_head;
    struct emu_pkt h = {.magic = PKT_MAGIC, .type = (uint8_t)a->type, .rnr_timer = a->rnr_timer,
                        .qpn = qp->ibqp.qp_num, .status = a->status, .seq = a->seq};
    const void *data = NULL;
    uint64_t n = 0;
    if (a->type == PKT_READ_RESP) {
      n = a->len - a->off < EMU_PAYLOAD ? a->len - a->off : EMU_PAYLOAD;
      uintptr_t at = (uintptr_t)(a->raddr + a->off);
      if (n && !emu_mr_find(qp, a->rkey, true, at, n, IBV_ACCESS_REMOTE_READ)) {
        a->type = PKT_NAK; /* deregistered under the read */
        a->status = IBV_WC_REM_ACCESS_ERR;
        qp->ans_reads--;
        emu_qp_error(qp);
        continue;
      }
      data = (const void *)at;
      h.offset = a->off;
      h.msg_len = a->len;
      if (a->off + n == a->len) h.flags = PKT_LAST;
    }
    int rc = pkt_send(qp->resp.fd, &h, data, n);
    if (rc == 0) return;
    if (rc < 0) {
      resp_lost(qp);
      return;
    }
    if (a->type == PKT_READ_RESP && (a->off += n) < a->len) continue;
    if (a->type == PKT_READ_RESP) qp->ans_reads--;
    qp->ans_head = a->next;
    if (!qp->ans_head) qp->ans_tail = NULL;
    qp->ans_count--;
    free(a);
  }
  if (!qp->ans_head && qp->resp_draining) {
    sock_close(&qp->resp);
    qp->resp_draining = false;
  }
}

static void resp_accept(struct emu_qp *qp) {
  int fd;
  while ((fd = accept4(qp->lsn.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
    /* nobody answers in RESET or ERR; a working connection is not given
     * up for a newcomer (the peer that reconnects retries until the old
     * one's end is seen) */
    if (qp->state == IBV_QPS_RESET || qp->state == IBV_QPS_ERR || qp->resp_ready ||
        qp->resp_draining) {
      close(fd);
      continue;
    }
    if (qp->resp.fd >= 0) resp_lost(qp);
    sock_set(qp->ctx, &qp->resp, fd);
  }
}

/* ---- requester -------------------------------------------------------------- */

/* The connection to the peer is gone. Before the peer answered HELLO it
 * is tried again; after, the peer went away: what is outstanding fails. */
static void req_lost(struct emu_qp *qp) {
  enum emu_req_state was = qp->req_state;
  sock_close(&qp->req);
  if (was != REQ_READY) {
    qp->req_state = REQ_NONE;
    qp->connect_at = emu_now() + qp->connect_gap;
    return;
  }
  qp->req_state = REQ_GONE;
  if (qp->sq_head) emu_sq_complete(qp, IBV_WC_RETRY_EXC_ERR);
}

static void req_connect(struct emu_qp *qp, double now) {
  struct emu_ctx *ctx = qp->ctx;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/qp-%u", ctx->dir, qp->attr.dest_qp_num);
  struct emu_pkt h = {.magic = PKT_MAGIC, .type = PKT_HELLO, .qpn = qp->ibqp.qp_num};
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
      pkt_send(fd, &h, NULL, 0) == 1) {
    sock_set(ctx, &qp->req, fd);
    qp->req_state = REQ_WAIT_HELLO;
    return;
  }
  if (fd >= 0) close(fd); /* not bound yet, or not listening: quietly later */
  qp->connect_at = now + qp->connect_gap;
  qp->connect_gap = qp->connect_gap * 2 > RAISE_PERIOD_S ? RAISE_PERIOD_S : qp->connect_gap * 2;
}

/* Whether the send at tx may go on the wire now. */
static bool tx_ready(const struct emu_qp *qp, double now) {
  const struct emu_swr *w = qp->tx;
  if (qp->state != IBV_QPS_RTS || qp->req_state != REQ_READY || !w || w->local_err ||
      now < qp->tx_resume_at)
    return false;
  if (qp->tx_off > 0) return true;
  bool read = w->opcode == IBV_WR_RDMA_READ;
  if (read && qp->attr.max_rd_atomic && qp->reads_out >= qp->attr.max_rd_atomic) return false;
  return !((w->flags & IBV_SEND_FENCE) && qp->reads_out > 0);
}

/* A send that failed before it left completes once it is the oldest, so
 * that completions stay in order. */
static void sq_local_errors(struct emu_qp *qp) {
  if (qp->state == IBV_QPS_RTS && qp->sq_head && qp->sq_head == qp->tx && qp->sq_head->local_err)
    emu_sq_complete(qp, qp->sq_head->local_err);
}

static bool sges_ok(struct emu_qp *qp, const struct emu_swr *w) {
  int access = w->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_LOCAL_WRITE : 0;
  for (int i = 0; i < w->nsge; i++)
    if (w->sge[i].length &&
        !emu_mr_find(qp, w->sge[i].lkey, false, (uintptr_t)w->sge[i].addr, w->sge[i].length, access))
      return false;
  return true;
}

static void req_input(struct emu_qp *qp, double now);

/* Puts sends on the wire until the socket is full. */
static void req_pump(struct emu_qp *qp, double now) {
  struct emu_ctx *ctx = qp->ctx;
  while (tx_ready(qp, now)) {
    struct emu_swr *w = qp->tx;
    bool read = w->opcode == IBV_WR_RDMA_READ;
    if (qp->tx_off == 0) {
      if (read && !qp->attr.max_rd_atomic) {
        w->local_err = IBV_WC_LOC_QP_OP_ERR;
        break;
      }
      if (!w->inline_data && !sges_ok(qp, w)) {
        w->local_err = IBV_WC_LOC_PROT_ERR;
        break;
      }
    }
    uint64_t n = read ? 0 : w->len - qp->tx_off < EMU_PAYLOAD ? w->len - qp->tx_off : EMU_PAYLOAD;
    if (n && w->inline_data) {
      memcpy(ctx->tx_buf, w->inline_data + qp->tx_off, n);
    } else if (n && emu_sge_copy(qp, w->sge, w->nsge, qp->tx_off, ctx->tx_buf, n, 0, false)) {
      w->local_err = IBV_WC_LOC_PROT_ERR; /* deregistered since it started */
      break;
    }
    struct emu_pkt h = {.magic = PKT_MAGIC,
                        .type = PKT_REQ,
                        .opcode = (uint8_t)w->opcode,
                        .flags = (w->flags & IBV_SEND_SOLICITED) ? PKT_SOLICITED : 0,
                        .qpn = qp->ibqp.qp_num,
                        .psn = (qp->attr.sq_psn + (uint32_t)w->seq) & 0xffffff,
                        .rkey = w->rkey,
                        .imm = w->imm,
                        .seq = w->seq,
                        .msg_len = w->len,
                        .offset = qp->tx_off,
                        .raddr = w->raddr};
    int rc = pkt_send(qp->req.fd, &h, ctx->tx_buf, n);
    if (rc == 0) break;
    if (rc < 0) { /* the peer closed: first what it said before (a NAK?), then the end */
      req_input(qp, now);
      return;
    }
    qp->stall_since = now;
    qp->tx_off += n;
    if (read || qp->tx_off == w->len) {
      w->sent = true;
      if (read) qp->reads_out++;
      qp->tx = w->next;
      qp->tx_off = 0;
    }
  }
  sq_local_errors(qp);
}

static void req_answer(struct emu_qp *qp, const struct emu_pkt *h, const uint8_t *data, size_t len,
                       double now) {
  struct emu_swr *w = qp->sq_head;
  if (h->type == PKT_HELLO_ACK && qp->req_state == REQ_WAIT_HELLO) {
    if (memcmp(h->gid.raw, qp->attr.ah_attr.grh.dgid.raw, sizeof(h->gid.raw))) {
      /* the address vector names another port: nothing would ever answer */
      sock_close(&qp->req);
      qp->req_state = REQ_GONE;
      return;
    }
    qp->req_state = REQ_READY;
    qp->stall_since = now;
    return;
  }
  bool ok = qp->req_state == REQ_READY && w && w->seq == h->seq;
  if (ok && h->type == PKT_ACK && w->sent && w->opcode != IBV_WR_RDMA_READ) {
    emu_sq_complete(qp, IBV_WC_SUCCESS);
  } else if (ok && h->type == PKT_READ_RESP && w->sent && w->opcode == IBV_WR_RDMA_READ &&
             h->offset <= w->len && len <= w->len - h->offset) {
    qp->stall_since = now;
    if (emu_sge_copy(qp, w->sge, w->nsge, h->offset, (void *)data, len, IBV_ACCESS_LOCAL_WRITE, true))
      emu_sq_complete(qp, IBV_WC_LOC_PROT_ERR);
    else if (h->flags & PKT_LAST)
      emu_sq_complete(qp, IBV_WC_SUCCESS);
  } else if (ok && h->type == PKT_RNR_NAK) {
    if (qp->attr.rnr_retry != 7 && ++w->rnr_tries > qp->attr.rnr_retry) { /* 7: for ever */
      emu_sq_complete(qp, IBV_WC_RNR_RETRY_EXC_ERR);
      return;
    }
    /* back to the refused send: the responder drops everything after it */
    for (struct emu_swr *x = w; x && x != qp->tx; x = x->next) {
      if (x->sent && x->opcode == IBV_WR_RDMA_READ) qp->reads_out--;
      x->sent = false;
    }
    qp->tx = w;
    qp->tx_off = 0;
    qp->tx_resume_at = now + rnr_delay(h->rnr_timer);
    qp->stall_since = qp->tx_resume_at; /* waiting out RNR spends no retries */
  } else if (ok && h->type == PKT_NAK &&
             (h->status == IBV_WC_REM_ACCESS_ERR || h->status == IBV_WC_REM_INV_REQ_ERR ||
              h->status == IBV_WC_REM_OP_ERR)) {
    emu_sq_complete(qp, (enum ibv_wc_status)h->status);
  } else {
    fprintf(stderr, "verbs_emu: qp %u: unexpected answer %d seq %lu from qp %u\n", qp->ibqp.qp_num,
            h->type, (unsigned long)h->seq, h->qpn);
    req_lost(qp);
  }
}

static void req_input(struct emu_qp *qp, double now) {
  for (int i = 0; i < READS_PER_ROUND && qp->req.fd >= 0; i++) {
    struct emu_pkt h;
    size_t len;
    int rc = pkt_recv(qp->ctx, qp->req.fd, &h, &len);
    if (rc == 0) break;
    if (rc < 0) {
      req_lost(qp);
      return;
    }
    req_answer(qp, &h, qp->ctx->rx_buf + sizeof(h), len, now);
  }
  sq_local_errors(qp);
}

/* The retry budget: a send that makes no progress for that long fails. */
static void req_timers(struct emu_qp *qp, double now) {
  if (qp->state == IBV_QPS_RTS && qp->sq_head && now >= qp->tx_resume_at &&
      now - qp->stall_since >= emu_retry_budget(qp))
    emu_sq_complete(qp, IBV_WC_RETRY_EXC_ERR);
}

/* ---- state changes (ctx->lock held, any thread) ------------------------------- */

void emu_wire_connect(struct emu_qp *qp) {
  qp->req_state = REQ_NONE;
  qp->connect_at = emu_now();
  qp->connect_gap = 0.001;
}

void emu_wire_reset(struct emu_qp *qp) {
  sock_close(&qp->req);
  sock_close(&qp->resp);
  answers_free(qp);
  qp->req_state = REQ_NONE;
  qp->hello_pending = qp->resp_ready = qp->resp_draining = false;
  qp->peer_qpn = 0;
  qp->tx_resume_at = 0;
}

/* ERR: no more requests go out; the answers owed still do, then the
 * responder's connection closes (and the peer sees us gone). */
void emu_wire_error(struct emu_qp *qp) {
  sock_close(&qp->req);
  qp->req_state = REQ_GONE;
  qp->hello_pending = false;
  if (qp->ans_head && qp->resp.fd >= 0)
    qp->resp_draining = true;
  else
    sock_close(&qp->resp);
}

void emu_wire_destroy(struct emu_qp *qp) {
  sock_close(&qp->req);
  sock_close(&qp->resp);
  sock_close(&qp->lsn);
  if (qp->path[0]) unlink(qp->path);
  answers_free(qp);
}

/* ---- the progress thread ---------------------------------------------------- */

void emu_wake(struct emu_ctx *ctx) {
  if (ctx->wake[1] >= 0) (void)!write(ctx->wake[1], "w", 1);
}

static void poll_add(struct emu_ctx *ctx, int *n, struct emu_sock *s, short events) {
  s->pi = *n;
  ctx->pfd[*n] = (struct pollfd){.fd = s->fd, .events = events};
  ctx->pgen[*n] = s->gen;
  (*n)++;
}

static short revents_of(const struct emu_ctx *ctx, const struct emu_sock *s) {
  if (s->fd < 0 || s->pi < 0 || ctx->pgen[s->pi] != s->gen) return 0;
  return ctx->pfd[s->pi].revents;
}

static void deadline(double *until, double t) {
  if (t < *until) *until = t;
}

/* This round's pollfds (the wake pipe first) and the time to wake up by. */
static int build_pollfds(struct emu_ctx *ctx, double now, double *until) {
  int need = 1;
  for (struct emu_qp *qp = ctx->qps; qp; qp = qp->next) need += 3;
  if (need > ctx->pcap) {
    struct pollfd *pfd = realloc(ctx->pfd, (size_t)need * sizeof(*pfd));
    if (pfd) ctx->pfd = pfd;
    unsigned *pgen = realloc(ctx->pgen, (size_t)need * sizeof(*pgen));
    if (pgen) ctx->pgen = pgen;
    if (pfd && pgen) ctx->pcap = need;
  }
  int n = 0;
  ctx->pfd[n++] = (struct pollfd){.fd = ctx->wake[0], .events = POLLIN};
  for (struct emu_qp *qp = ctx->qps; qp; qp = qp->next) {
    qp->lsn.pi = qp->req.pi = qp->resp.pi = -1;
    if (qp->state == IBV_QPS_RTS && qp->sq_head)
      deadline(until, fmax(qp->stall_since + emu_retry_budget(qp), qp->tx_resume_at));
    /* a port that is down carries nothing: its QPs' sockets wait */
    if (!port_up(qp) || n + 3 > ctx->pcap) continue;
    poll_add(ctx, &n, &qp->lsn, POLLIN);
    if (qp->resp.fd >= 0)
      poll_add(ctx, &n, &qp->resp, (short)((resp_may_read(qp) ? POLLIN : 0) | (qp->ans_head ? POLLOUT : 0)));
    if (qp->req.fd >= 0) poll_add(ctx, &n, &qp->req, (short)(POLLIN | (tx_ready(qp, now) ? POLLOUT : 0)));
    if (qp->req_state == REQ_NONE && (qp->state == IBV_QPS_RTR || qp->state == IBV_QPS_RTS))
      deadline(until, qp->connect_at);
    if (qp->tx && qp->tx_resume_at > now) deadline(until, qp->tx_resume_at);
  }
  return n;
}

static void qp_service(struct emu_qp *qp, double now) {
  struct emu_ctx *ctx = qp->ctx;
  short lsn = revents_of(ctx, &qp->lsn), resp = revents_of(ctx, &qp->resp);
  short req = revents_of(ctx, &qp->req);
  if (lsn & POLLIN) resp_accept(qp);
  if (resp) resp_input(qp, resp);
  if (req) req_input(qp, now);
  if (port_up(qp)) {
    resp_hello(qp);
    if (qp->req_state == REQ_NONE && (qp->state == IBV_QPS_RTR || qp->state == IBV_QPS_RTS) &&
        now >= qp->connect_at)
      req_connect(qp, now);
    req_pump(qp, now);
    resp_flush(qp);
  }
  req_timers(qp, now);
}

static void *progress_main(void *arg) {
  struct emu_ctx *ctx = arg;
  double next_raise = 0;
  pthread_mutex_lock(&ctx->lock);
  while (!ctx->stopping) {
    double now = emu_now(), until = now + RAISE_PERIOD_S;
    int n = build_pollfds(ctx, now, &until);
    pthread_mutex_unlock(&ctx->lock);
    /* no busy waiting: sleep until a socket, the wake pipe or a timer */
    poll(ctx->pfd, (nfds_t)n, until <= now ? 0 : (int)ceil((until - now) * 1000));
    now = emu_now();
    if (now >= next_raise && ctx->dir[0]) {
      emu_raise_file(ctx->dir); /* takes g_lock, then the contexts' locks */
      next_raise = now + RAISE_PERIOD_S;
    }
    pthread_mutex_lock(&ctx->lock);
    if (ctx->pfd[0].revents & POLLIN) {
      char buf[64];
      while (read(ctx->wake[0], buf, sizeof(buf)) > 0) {
      }
    }
    for (struct emu_qp *qp = ctx->qps; qp && !ctx->stopping; qp = qp->next) qp_service(qp, now);
  }
  pthread_mutex_unlock(&ctx->lock);
  return NULL;
}

/* What the progress thread used (none runs): its pipe and buffers. */
static void progress_free(struct emu_ctx *ctx) {
  if (ctx->wake[0] >= 0) close(ctx->wake[0]);
  if (ctx->wake[1] >= 0) close(ctx->wake[1]);
  ctx->wake[0] = ctx->wake[1] = -1;
  free(ctx->rx_buf);
  free(ctx->tx_buf);
  free(ctx->pfd);
  free(ctx->pgen);
  ctx->rx_buf = ctx->tx_buf = NULL;
  ctx->pfd = NULL;
  ctx->pgen = NULL;
  ctx->pcap = 0;
}

/* From the first QP on (ctx->lock held). Signals stay with the caller's threads. */
int emu_progress_start(struct emu_ctx *ctx) {
  ctx->rx_buf = malloc(sizeof(struct emu_pkt) + EMU_PAYLOAD);
  ctx->tx_buf = malloc(EMU_PAYLOAD);
  ctx->pfd = malloc(sizeof(*ctx->pfd));
  ctx->pgen = malloc(sizeof(*ctx->pgen));
  ctx->pcap = 1;
  if (!ctx->rx_buf || !ctx->tx_buf || !ctx->pfd || !ctx->pgen ||
      pipe2(ctx->wake, O_CLOEXEC | O_NONBLOCK)) {
    errno = ENOMEM;
    goto fail;
  }
  sigset_t all, old;
  sigfillset(&all);
  int sync_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT};
  for (size_t i = 0; i < sizeof(sync_signals) / sizeof(sync_signals[0]); i++)
    sigdelset(&all, sync_signals[i]);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&ctx->thread, NULL, progress_main, ctx);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    errno = rc;
    goto fail;
  }
  ctx->thread_started = true;
  return 0;
fail:
  progress_free(ctx);
  return -1;
}

/* Joins the thread (no lock held on entry) and frees what it used. */
void emu_progress_stop(struct emu_ctx *ctx) {
  pthread_mutex_lock(&ctx->lock);
  bool started = ctx->thread_started;
  ctx->stopping = true;
  emu_wake(ctx);
  pthread_mutex_unlock(&ctx->lock);
  if (started) pthread_join(ctx->thread, NULL);
  progress_free(ctx);
}
