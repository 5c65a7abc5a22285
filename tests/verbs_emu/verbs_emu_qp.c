/* The queues of the verbs emulation (verbs_emu.c says what it emulates):
 * completion channels and CQs, queue pairs and their state machine, posting,
 * and the completions and errors the wire (verbs_emu_wire.c) produces. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "verbs_emu.h"

/* ---- completion channels and CQs --------------------------------------------- */

EMU_API struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ibctx) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibctx;
  struct emu_chan *ch = calloc(1, sizeof(*ch));
  int p[2];
  if (!ch || pipe2(p, O_CLOEXEC)) {
    free(ch);
    return NULL;
  }
  fcntl(p[1], F_SETFL, O_NONBLOCK);
  ch->ibch.context = ibctx;
  ch->ibch.fd = p[0];
  ch->wr_fd = p[1];
  pthread_mutex_lock(&ctx->lock);
  ch->next = ctx->chans;
  ctx->chans = ch;
  pthread_mutex_unlock(&ctx->lock);
  return &ch->ibch;
}

EMU_API int ibv_destroy_comp_channel(struct ibv_comp_channel *ibch) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibch->context;
  struct emu_chan *ch = (struct emu_chan *)ibch;
  pthread_mutex_lock(&ctx->lock);
  if (ch->cqs) {
    pthread_mutex_unlock(&ctx->lock);
    return EBUSY;
  }
  for (struct emu_chan **pp = &ctx->chans; *pp; pp = &(*pp)->next)
    if (*pp == ch) {
      *pp = ch->next;
      break;
    }
  pthread_mutex_unlock(&ctx->lock);
  close(ch->ibch.fd);
  close(ch->wr_fd);
  free(ch);
  return 0;
}

EMU_API struct ibv_cq *ibv_create_cq(struct ibv_context *ibctx, int cqe, void *cq_context,
                                     struct ibv_comp_channel *channel, int comp_vector) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibctx;
  if (cqe < 1 || cqe > EMU_MAX_CQE || comp_vector < 0 || comp_vector >= ibctx->num_comp_vectors ||
      (channel && channel->context != ibctx)) {
    errno = EINVAL;
    return NULL;
  }
  struct emu_cq *cq = calloc(1, sizeof(*cq));
  if (!cq || !(cq->ring = calloc((size_t)cqe, sizeof(*cq->ring)))) {
    free(cq);
    errno = ENOMEM;
    return NULL;
  }
  cq->ibcq.context = ibctx;
  cq->ibcq.channel = channel;
  cq->ibcq.cq_context = cq_context;
  cq->ibcq.cqe = cqe;
  pthread_mutex_init(&cq->ibcq.mutex, NULL);
  pthread_cond_init(&cq->ibcq.cond, NULL);
  cq->cap = cqe;
  cq->chan = (struct emu_chan *)channel;
  pthread_mutex_lock(&ctx->lock);
  cq->ibcq.handle = ++ctx->handles;
  cq->next = ctx->cqs;
  ctx->cqs = cq;
  if (cq->chan) cq->chan->ibch.refcnt = ++cq->chan->cqs;
  pthread_mutex_unlock(&ctx->lock);
  return &cq->ibcq;
}

void emu_cq_free(struct emu_cq *cq) {
  pthread_mutex_destroy(&cq->ibcq.mutex);
  pthread_cond_destroy(&cq->ibcq.cond);
  free(cq->ring);
  free(cq);
}

/* Drops the channel's unread events for cq (ctx->lock held). */
static void chan_forget(struct emu_chan *ch, struct emu_cq *cq) {
  bool had = ch->head != NULL;
  struct emu_chan_event **pp = &ch->head;
  ch->tail = NULL;
  while (*pp) {
    struct emu_chan_event *e = *pp;
    if (e->cq == cq) {
      *pp = e->next;
      free(e);
    } else {
      ch->tail = e;
      pp = &e->next;
    }
  }
  if (had && !ch->head) emu_level_clear(ch->ibch.fd);
}

EMU_API int ibv_destroy_cq(struct ibv_cq *ibcq) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibcq->context;
  struct emu_cq *cq = (struct emu_cq *)ibcq;
  pthread_mutex_lock(&ctx->lock);
  if (cq->qps) {
    pthread_mutex_unlock(&ctx->lock);
    return EBUSY;
  }
  cq->destroying = true;
  if (cq->chan) chan_forget(cq->chan, cq);
  emu_events_forget(ctx, NULL, ibcq);
  emu_wait_acked(ctx, &cq->comp_delivered, &cq->comp_acked, "CQ");
  emu_wait_acked(ctx, &cq->async_delivered, &cq->async_acked, "CQ");
  for (struct emu_cq **pp = &ctx->cqs; *pp; pp = &(*pp)->next)
    if (*pp == cq) {
      *pp = cq->next;
      break;
    }
  if (cq->chan) cq->chan->ibch.refcnt = --cq->chan->cqs;
  pthread_mutex_unlock(&ctx->lock);
  emu_cq_free(cq);
  return 0;
}

EMU_API int ibv_get_cq_event(struct ibv_comp_channel *ibch, struct ibv_cq **cq, void **cq_context) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibch->context;
  struct emu_chan *ch = (struct emu_chan *)ibch;
  for (;;) {
    pthread_mutex_lock(&ctx->lock);
    struct emu_chan_event *e = ch->head;
    if (e) {
      ch->head = e->next;
      if (!ch->head) {
        ch->tail = NULL;
        emu_level_clear(ibch->fd);
      }
      e->cq->comp_delivered++;
      *cq = &e->cq->ibcq;
      *cq_context = e->cq->ibcq.cq_context;
      pthread_mutex_unlock(&ctx->lock);
      free(e);
      return 0;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (emu_level_wait(ibch->fd)) return -1;
  }
}

EMU_API void ibv_ack_cq_events(struct ibv_cq *ibcq, unsigned int nevents) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibcq->context;
  pthread_mutex_lock(&ctx->lock);
  ((struct emu_cq *)ibcq)->comp_acked += nevents;
  pthread_cond_broadcast(&ctx->acked);
  pthread_mutex_unlock(&ctx->lock);
}

int emu_req_notify_cq(struct ibv_cq *ibcq, int solicited_only) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibcq->context;
  struct emu_cq *cq = (struct emu_cq *)ibcq;
  pthread_mutex_lock(&ctx->lock);
  cq->armed = true; /* only a CQE added from now on fires it, as on hardware */
  cq->solicited_only = solicited_only != 0;
  pthread_mutex_unlock(&ctx->lock);
  return 0;
}

int emu_poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibcq->context;
  struct emu_cq *cq = (struct emu_cq *)ibcq;
  int n = 0;
  pthread_mutex_lock(&ctx->lock);
  for (; n < num_entries && cq->count > 0; n++) {
    struct emu_cqe *e = &cq->ring[cq->head];
    wc[n] = e->wc;
    /* polling a CQE frees its queue slot, and a send's frees the slots of
     * the unsignaled sends before it */
    if (e->qp && e->is_send && e->sq_seq + 1 > e->qp->sq_retired) e->qp->sq_retired = e->sq_seq + 1;
    if (e->qp && !e->is_send) e->qp->rq_retired++;
    cq->head = (cq->head + 1) % cq->cap;
    cq->count--;
  }
  pthread_mutex_unlock(&ctx->lock);
  return n;
}

static void cq_overrun(struct emu_cq *cq) {
  struct emu_ctx *ctx = (struct emu_ctx *)cq->ibcq.context;
  cq->overrun = true;
  emu_event_push(ctx, IBV_EVENT_CQ_ERR, NULL, cq, 0);
  for (struct emu_qp *qp = ctx->qps; qp; qp = qp->next)
    if ((qp->scq == cq || qp->rcq == cq) && qp->state != IBV_QPS_RESET) emu_qp_error(qp);
}

static void cq_push(struct emu_cq *cq, const struct emu_cqe *e, bool solicited) {
  if (cq->overrun) return;
  if (cq->count == cq->cap) {
    cq_overrun(cq);
    return;
  }
  cq->ring[(cq->head + cq->count) % cq->cap] = *e;
  cq->count++;
  bool fires = !cq->solicited_only || solicited || e->wc.status != IBV_WC_SUCCESS;
  if (cq->armed && cq->chan && fires && !cq->destroying) {
    struct emu_chan_event *ev = calloc(1, sizeof(*ev));
    if (!ev) return;
    cq->armed = false;
    ev->cq = cq;
    struct emu_chan *ch = cq->chan;
    if (ch->tail)
      ch->tail->next = ev;
    else {
      ch->head = ev;
      emu_level_set(ch->wr_fd);
    }
    ch->tail = ev;
  }
}

/* A QP reset or destroyed: its CQEs still in the CQs no longer free slots. */
static void cq_forget_qp(struct emu_cq *cq, struct emu_qp *qp) {
  for (int i = 0; i < cq->count; i++) {
    struct emu_cqe *e = &cq->ring[(cq->head + i) % cq->cap];
    if (e->qp == qp) e->qp = NULL;
  }
}

/* ---- completions and errors (also from the wire) ------------------------------ */

void emu_sq_complete(struct emu_qp *qp, enum ibv_wc_status status) {
  struct emu_swr *w = qp->sq_head;
  qp->sq_head = w->next;
  if (!qp->sq_head) qp->sq_tail = NULL;
  if (qp->tx == w) {
    qp->tx = w->next;
    qp->tx_off = 0;
  }
  if (w->sent && w->opcode == IBV_WR_RDMA_READ) qp->reads_out--;
  qp->stall_since = emu_now();
  /* a failed send completes even unsignaled */
  if (status != IBV_WC_SUCCESS || (w->flags & IBV_SEND_SIGNALED) || qp->sq_sig_all) {
    struct emu_cqe e = {.qp = qp, .sq_seq = w->seq, .is_send = true};
    e.wc.wr_id = w->wr_id;
    e.wc.status = status;
    e.wc.opcode = w->opcode == IBV_WR_RDMA_READ                                            ? IBV_WC_RDMA_READ
                  : w->opcode == IBV_WR_RDMA_WRITE || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RDMA_WRITE
                                                                                             : IBV_WC_SEND;
    e.wc.byte_len = (uint32_t)w->len;
    e.wc.qp_num = qp->ibqp.qp_num;
    cq_push(qp->scq, &e, false);
  }
  free(w);
  if (status != IBV_WC_SUCCESS && status != IBV_WC_WR_FLUSH_ERR) emu_qp_error(qp);
}

void emu_rq_complete(struct emu_qp *qp, struct emu_rwr *w, enum ibv_wc_status status,
                     enum ibv_wc_opcode opcode, uint32_t byte_len, unsigned wc_flags, uint32_t imm,
                     bool solicited) {
  struct emu_cqe e = {.qp = qp};
  e.wc.wr_id = w->wr_id;
  e.wc.status = status;
  e.wc.opcode = opcode;
  e.wc.byte_len = byte_len;
  e.wc.qp_num = qp->ibqp.qp_num;
  e.wc.src_qp = qp->peer_qpn;
  e.wc.wc_flags = wc_flags;
  e.wc.imm_data = imm;
  free(w);
  cq_push(qp->rcq, &e, solicited);
}

/* To ERR: the wire stops (verbs_emu_wire.c), every outstanding work
 * request completes flushed. Safe to re-enter (a flush that overruns the
 * CQ errs the QPs on it). */
void emu_qp_error(struct emu_qp *qp) {
  if (qp->state != IBV_QPS_ERR) {
    qp->state = IBV_QPS_ERR;
    emu_wire_error(qp);
  }
  if (qp->in_recv) {
    struct emu_rwr *w = qp->in_recv;
    qp->in_recv = NULL;
    qp->in_msg = false;
    emu_rq_complete(qp, w, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0, false);
  }
  while (qp->sq_head) emu_sq_complete(qp, IBV_WC_WR_FLUSH_ERR);
  while (qp->rq_head) {
    struct emu_rwr *w = qp->rq_head;
    qp->rq_head = w->next;
    if (!qp->rq_head) qp->rq_tail = NULL;
    emu_rq_complete(qp, w, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0, false);
  }
}

/* ---- queue pairs ------------------------------------------------------------- */

EMU_API struct ibv_qp *ibv_create_qp(struct ibv_pd *ibpd, struct ibv_qp_init_attr *ia) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibpd->context;
  if (ia->qp_type != IBV_QPT_RC) {
    errno = EOPNOTSUPP;
    return NULL;
  }
  const struct ibv_qp_cap *c = &ia->cap;
  if (!ia->send_cq || !ia->recv_cq || ia->srq || ia->send_cq->context != ibpd->context ||
      ia->recv_cq->context != ibpd->context || c->max_send_wr > EMU_MAX_WR ||
      c->max_recv_wr > EMU_MAX_WR || c->max_send_sge > EMU_MAX_SGE ||
      c->max_recv_sge > EMU_MAX_SGE || c->max_inline_data > EMU_MAX_INLINE) {
    errno = EINVAL;
    return NULL;
  }
  struct emu_qp *qp = calloc(1, sizeof(*qp));
  if (!qp) return NULL;
  qp->ibqp.context = ibpd->context;
  qp->ibqp.qp_context = ia->qp_context;
  qp->ibqp.pd = ibpd;
  qp->ibqp.send_cq = ia->send_cq;
  qp->ibqp.recv_cq = ia->recv_cq;
  qp->ibqp.state = IBV_QPS_RESET;
  qp->ibqp.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&qp->ibqp.mutex, NULL);
  pthread_cond_init(&qp->ibqp.cond, NULL);
  qp->ctx = ctx;
  qp->pd = (struct emu_pd *)ibpd;
  qp->scq = (struct emu_cq *)ia->send_cq;
  qp->rcq = (struct emu_cq *)ia->recv_cq;
  qp->cap = *c;
  qp->sq_sig_all = ia->sq_sig_all;
  qp->state = IBV_QPS_RESET;
  qp->lsn.fd = qp->req.fd = qp->resp.fd = -1;
  qp->lsn.pi = qp->req.pi = qp->resp.pi = -1;
  pthread_mutex_lock(&ctx->lock);
  qp->ibqp.handle = ++ctx->handles;
  if (emu_wire_bind(qp) || (!ctx->thread_started && emu_progress_start(ctx))) {
    int err = errno;
    emu_wire_destroy(qp);
    pthread_mutex_unlock(&ctx->lock);
    pthread_mutex_destroy(&qp->ibqp.mutex);
    pthread_cond_destroy(&qp->ibqp.cond);
    free(qp);
    errno = err;
    return NULL;
  }
  qp->next = ctx->qps;
  ctx->qps = qp;
  qp->scq->qps++;
  qp->rcq->qps++;
  qp->pd->refs++;
  emu_wake(ctx);
  pthread_mutex_unlock(&ctx->lock);
  return &qp->ibqp;
}

/* The kernel's rule for RC (ib_modify_qp_is_ok): which transitions exist,
 * which attributes each needs and which it may take. SQD/SQE are not
 * emulated. */
static bool transition_ok(enum ibv_qp_state cur, enum ibv_qp_state next, int mask) {
  int req = 0, opt = 0;
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
    /* from any state, nothing more */
  } else if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
    req = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  } else if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) {
    opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  } else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
    req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
          IBV_QP_MIN_RNR_TIMER;
    opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
  } else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
    req = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
    opt = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
          IBV_QP_PATH_MIG_STATE;
  } else if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS) {
    opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
          IBV_QP_MIN_RNR_TIMER;
  } else {
    return false;
  }
  mask &= ~IBV_QP_STATE;
  return (mask & req) == req && !(mask & ~(req | opt));
}

static bool values_ok(const struct emu_qp *qp, const struct ibv_qp_attr *a, int mask) {
  int nports = qp->ctx->dev->nports;
  const int qp_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC;
  if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0) return false;
  if ((mask & IBV_QP_PORT) && (a->port_num < 1 || a->port_num > nports)) return false;
  if ((mask & IBV_QP_ACCESS_FLAGS) && (a->qp_access_flags & ~qp_access)) return false;
  /* Ethernet link layer: the address needs its GRH */
  if ((mask & IBV_QP_AV) && (!a->ah_attr.is_global || a->ah_attr.grh.sgid_index > 1 ||
                             a->ah_attr.port_num < 1 || a->ah_attr.port_num > nports))
    return false;
  if ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096))
    return false;
  if ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num > 0xffffff) return false;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > EMU_MAX_RD_ATOMIC) return false;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > EMU_MAX_RD_ATOMIC) return false;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31) return false;
  if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31) return false;
  if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7) return false;
  if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7) return false;
  return true;
}

/* Drops all work without completions, as a move to RESET does. */
static void qp_discard(struct emu_qp *qp) {
  while (qp->sq_head) {
    struct emu_swr *w = qp->sq_head;
    qp->sq_head = w->next;
    free(w);
  }
  while (qp->rq_head) {
    struct emu_rwr *w = qp->rq_head;
    qp->rq_head = w->next;
    free(w);
  }
  while (qp->ans_head) {
    struct emu_answer *a = qp->ans_head;
    qp->ans_head = a->next;
    free(a);
  }
  free(qp->in_recv);
  qp->in_recv = NULL;
  qp->sq_tail = qp->tx = NULL;
  qp->rq_tail = NULL;
  qp->ans_tail = NULL;
  qp->ans_count = 0;
  cq_forget_qp(qp->scq, qp);
  cq_forget_qp(qp->rcq, qp);
  qp->sq_posted = qp->sq_retired = qp->rq_posted = qp->rq_retired = 0;
  qp->tx_off = 0;
  qp->reads_out = 0;
  qp->in_msg = false;
  qp->expect_seq = 0;
}

EMU_API int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask) {
  struct emu_qp *qp = (struct emu_qp *)ibqp;
  struct emu_ctx *ctx = qp->ctx;
  pthread_mutex_lock(&ctx->lock);
  enum ibv_qp_state cur = qp->state;
  enum ibv_qp_state next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
  if (((mask & IBV_QP_CUR_STATE) && a->cur_qp_state != cur) || !transition_ok(cur, next, mask) ||
      !values_ok(qp, a, mask)) {
    pthread_mutex_unlock(&ctx->lock);
    return EINVAL;
  }
  struct ibv_qp_attr *s = &qp->attr;
  if (next == IBV_QPS_RESET) memset(s, 0, sizeof(*s));
  if (mask & IBV_QP_PKEY_INDEX) s->pkey_index = a->pkey_index;
  if (mask & IBV_QP_PORT) s->port_num = a->port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) s->qp_access_flags = a->qp_access_flags;
  if (mask & IBV_QP_AV) s->ah_attr = a->ah_attr;
  if (mask & IBV_QP_PATH_MTU) s->path_mtu = a->path_mtu;
  if (mask & IBV_QP_DEST_QPN) s->dest_qp_num = a->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) s->rq_psn = a->rq_psn & 0xffffff;
  if (mask & IBV_QP_SQ_PSN) s->sq_psn = a->sq_psn & 0xffffff;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) s->max_dest_rd_atomic = a->max_dest_rd_atomic;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) s->max_rd_atomic = a->max_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) s->min_rnr_timer = a->min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) s->timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) s->retry_cnt = a->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) s->rnr_retry = a->rnr_retry;
  if (next == IBV_QPS_RESET) {
    qp->state = IBV_QPS_RESET;
    emu_wire_reset(qp);
    qp_discard(qp);
  } else if (next == IBV_QPS_ERR) {
    emu_qp_error(qp);
  } else {
    qp->state = next;
    if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) emu_wire_connect(qp);
    if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) qp->stall_since = emu_now();
  }
  ibqp->state = next;
  emu_wake(ctx);
  pthread_mutex_unlock(&ctx->lock);
  return 0;
}

EMU_API int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask,
                         struct ibv_qp_init_attr *ia) {
  struct emu_qp *qp = (struct emu_qp *)ibqp;
  pthread_mutex_lock(&qp->ctx->lock);
  *a = qp->attr;
  a->qp_state = a->cur_qp_state = qp->state;
  a->cap = qp->cap;
  memset(ia, 0, sizeof(*ia));
  ia->qp_context = ibqp->qp_context;
  ia->send_cq = ibqp->send_cq;
  ia->recv_cq = ibqp->recv_cq;
  ia->cap = qp->cap;
  ia->qp_type = IBV_QPT_RC;
  ia->sq_sig_all = qp->sq_sig_all;
  ibqp->state = qp->state;
  pthread_mutex_unlock(&qp->ctx->lock);
  return 0;
}

/* Frees a QP unlinked from its context (ctx->lock held, or the context closing). */
void emu_qp_release(struct emu_qp *qp) {
  emu_wire_destroy(qp);
  qp_discard(qp);
  qp->scq->qps--;
  qp->rcq->qps--;
  qp->pd->refs--;
  pthread_mutex_destroy(&qp->ibqp.mutex);
  pthread_cond_destroy(&qp->ibqp.cond);
  free(qp);
}

EMU_API int ibv_destroy_qp(struct ibv_qp *ibqp) {
  struct emu_qp *qp = (struct emu_qp *)ibqp;
  struct emu_ctx *ctx = qp->ctx;
  pthread_mutex_lock(&ctx->lock);
  qp->destroying = true;
  emu_events_forget(ctx, ibqp, NULL);
  emu_wait_acked(ctx, &qp->ev_delivered, &qp->ev_acked, "QP");
  for (struct emu_qp **pp = &ctx->qps; *pp; pp = &(*pp)->next)
    if (*pp == qp) {
      *pp = qp->next;
      break;
    }
  emu_qp_release(qp);
  emu_wake(ctx); /* it may be polling the sockets just closed */
  pthread_mutex_unlock(&ctx->lock);
  return 0;
}

/* ---- posting ------------------------------------------------------------------ */

/* A send hardware would take; its length in *len. */
static int send_wr_check(const struct emu_qp *qp, const struct ibv_send_wr *wr, uint64_t *len) {
  const unsigned flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE | IBV_SEND_FENCE;
  if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) return EINVAL;
  if (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM &&
      wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
      wr->opcode != IBV_WR_RDMA_READ)
    return EINVAL;
  if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge || (wr->send_flags & ~flags))
    return EINVAL;
  *len = 0;
  for (int i = 0; i < wr->num_sge; i++) *len += wr->sg_list[i].length;
  if ((wr->send_flags & IBV_SEND_INLINE) &&
      (wr->opcode == IBV_WR_RDMA_READ || *len > qp->cap.max_inline_data))
    return EINVAL;
  if (qp->sq_posted - qp->sq_retired >= qp->cap.max_send_wr) return ENOMEM;
  return 0;
}

int emu_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr) {
  struct emu_qp *qp = (struct emu_qp *)ibqp;
  struct emu_ctx *ctx = qp->ctx;
  int rc = 0;
  pthread_mutex_lock(&ctx->lock);
  for (; wr; wr = wr->next) {
    uint64_t len;
    if ((rc = send_wr_check(qp, wr, &len))) break;
    bool inl = wr->send_flags & IBV_SEND_INLINE;
    size_t n = (size_t)wr->num_sge;
    struct emu_swr *w = calloc(1, sizeof(*w) + n * sizeof(w->sge[0]) + (inl ? len : 0));
    if (!w) {
      rc = ENOMEM;
      break;
    }
    w->wr_id = wr->wr_id;
    w->seq = qp->sq_posted++;
    w->opcode = wr->opcode;
    w->flags = wr->send_flags;
    w->imm = wr->imm_data;
    w->len = len;
    if (wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
        wr->opcode == IBV_WR_RDMA_READ) {
      w->raddr = wr->wr.rdma.remote_addr;
      w->rkey = wr->wr.rdma.rkey;
    }
    if (inl) { /* the caller may reuse its buffer as soon as this returns */
      w->inline_data = (uint8_t *)&w->sge[n];
      uint64_t off = 0;
      for (size_t i = 0; i < n; i++) {
        memcpy(w->inline_data + off, (const void *)(uintptr_t)wr->sg_list[i].addr,
               wr->sg_list[i].length);
        off += wr->sg_list[i].length;
      }
    } else {
      w->nsge = (int)n;
      if (n) memcpy(w->sge, wr->sg_list, n * sizeof(w->sge[0]));
    }
    if (len > EMU_MAX_MSG) w->local_err = IBV_WC_LOC_LEN_ERR;
    if (qp->sq_tail)
      qp->sq_tail->next = w;
    else {
      qp->sq_head = w;
      qp->stall_since = emu_now();
    }
    qp->sq_tail = w;
    if (!qp->tx) {
      qp->tx = w;
      qp->tx_off = 0;
    }
    if (qp->state == IBV_QPS_ERR) emu_qp_error(qp); /* flushed, as on hardware */
  }
  if (rc) *bad_wr = wr;
  emu_wake(ctx);
  pthread_mutex_unlock(&ctx->lock);
  return rc;
}

int emu_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) {
  struct emu_qp *qp = (struct emu_qp *)ibqp;
  struct emu_ctx *ctx = qp->ctx;
  int rc = 0;
  pthread_mutex_lock(&ctx->lock);
  for (; wr; wr = wr->next) {
    if (qp->state == IBV_QPS_RESET || wr->num_sge < 0 ||
        (uint32_t)wr->num_sge > qp->cap.max_recv_sge) {
      rc = EINVAL;
      break;
    }
    if (qp->rq_posted - qp->rq_retired >= qp->cap.max_recv_wr) {
      rc = ENOMEM;
      break;
    }
    size_t n = (size_t)wr->num_sge;
    struct emu_rwr *w = calloc(1, sizeof(*w) + n * sizeof(w->sge[0]));
    if (!w) {
      rc = ENOMEM;
      break;
    }
    w->wr_id = wr->wr_id;
    w->nsge = (int)n;
    if (n) memcpy(w->sge, wr->sg_list, n * sizeof(w->sge[0]));
    qp->rq_posted++;
    if (qp->rq_tail)
      qp->rq_tail->next = w;
    else
      qp->rq_head = w;
    qp->rq_tail = w;
    if (qp->state == IBV_QPS_ERR) emu_qp_error(qp);
  }
  if (rc) *bad_wr = wr;
  pthread_mutex_unlock(&ctx->lock);
  return rc;
}
