#include "run/peer_msg.h"

#include <stdlib.h>

static ProtobufCBinaryData bytes(const uint8_t *p, size_t n) {
  return (ProtobufCBinaryData){n, (uint8_t *)p};
}

uint8_t *ccsd_peer_msg_pack(const struct peer_msg *m, size_t max, size_t *ret_len) {
  Ccs__PeerMsg w = CCS__PEER_MSG__INIT;
  Ccs__PeerJoin j = CCS__PEER_JOIN__INIT;
  Ccs__PeerReady rd = CCS__PEER_READY__INIT;
  Ccs__PeerFail f = CCS__PEER_FAIL__INIT;
  Ccs__PeerOp op = CCS__PEER_OP__INIT;
  Ccs__PeerRejoin rj = CCS__PEER_REJOIN__INIT;
  Ccs__PeerResume rs = CCS__PEER_RESUME__INIT;
  switch (m->kind) {
  case PEER_JOIN:
    j.id = bytes(m->join.id, m->join.id_len);
    j.nranks = m->join.nranks;
    j.rank = m->join.rank;
    j.uid = m->join.uid;
    j.pid = m->join.pid;
    j.algo = (char *)m->join.algo;
    j.label = (char *)(m->join.label ? m->join.label : "");
    j.report = (Ccs__Rejoin *)m->join.report;
    w.body_case = CCS__PEER_MSG__BODY_JOIN, w.join = &j;
    break;
  case PEER_READY:
    rd.name = bytes(m->ready.name, m->ready.name_len);
    rd.addrs = (char **)m->ready.addrs;
    rd.n_addrs = m->ready.naddrs;
    rd.chunk_bytes = m->ready.chunk_bytes;
    rd.lanes = m->ready.lanes;
    rd.ranks = (Ccs__PeerRank **)m->ready.ranks;
    rd.n_ranks = m->ready.nranks;
    w.body_case = CCS__PEER_MSG__BODY_READY, w.ready = &rd;
    break;
  case PEER_FAIL:
    f.name = bytes(m->fail.name, m->fail.name_len);
    f.status = m->fail.status;
    f.error = (char *)m->fail.error;
    f.refused_rank = m->fail.refused_rank;
    w.body_case = CCS__PEER_MSG__BODY_FAIL, w.fail = &f;
    break;
  case PEER_OP:
    op.name = bytes(m->op.name, m->op.name_len);
    op.seq = m->op.seq;
    op.kind = m->op.kind;
    op.count = m->op.count;
    op.dtype = m->op.dtype;
    op.redop = m->op.redop;
    op.root = m->op.root;
    op.rank = m->op.rank;
    w.body_case = CCS__PEER_MSG__BODY_OP, w.op = &op;
    break;
  case PEER_REJOIN:
    rj.name = bytes(m->rejoin.name, m->rejoin.name_len);
    rj.addrs = (char **)m->rejoin.addrs;
    rj.n_addrs = m->rejoin.naddrs;
    rj.chunk_bytes = m->rejoin.chunk_bytes;
    rj.lanes = m->rejoin.lanes;
    rj.ranks = (Ccs__PeerRank **)m->rejoin.ranks;
    rj.n_ranks = m->rejoin.nranks;
    rj.hold = m->rejoin.hold;
    rj.kept = m->rejoin.kept;
    rj.kept_sends = (Ccs__PeerCount **)m->rejoin.kept_sends;
    rj.n_kept_sends = m->rejoin.nkept_sends;
    rj.arrived = (Ccs__PeerCount **)m->rejoin.arrived;
    rj.n_arrived = m->rejoin.narrived;
    w.body_case = CCS__PEER_MSG__BODY_REJOIN, w.rejoin = &rj;
    break;
  case PEER_RESUME:
    rs.name = bytes(m->resume.name, m->resume.name_len);
    rs.finished = m->resume.finished;
    rs.retry_from = m->resume.retry_from;
    rs.hold = m->resume.hold;
    rs.counts = (Ccs__PeerCount **)m->resume.counts;
    rs.n_counts = m->resume.ncounts;
    rs.rerun = (char **)m->resume.rerun;
    rs.n_rerun = m->resume.nrerun;
    w.body_case = CCS__PEER_MSG__BODY_RESUME, w.resume = &rs;
    break;
  default: return NULL;
  }
  *ret_len = protobuf_c_message_get_packed_size(&w.base);
  uint8_t *buf = *ret_len <= max ? malloc(*ret_len ? *ret_len : 1) : NULL;
  if (buf) protobuf_c_message_pack(&w.base, buf);
  return buf;
}

void ccsd_peer_msg_view(const Ccs__PeerMsg *w, struct peer_msg *ret) {
  switch (w->body_case) {
  case CCS__PEER_MSG__BODY_JOIN:
    ret->kind = PEER_JOIN;
    ret->join = (struct peer_join){w->join->id.data, w->join->id.len, w->join->nranks, w->join->rank,
                                   w->join->uid,     w->join->pid,    w->join->algo,
                                   w->join->label,   w->join->report};
    break;
  case CCS__PEER_MSG__BODY_READY:
    ret->kind = PEER_READY;
    ret->ready = (struct peer_ready){w->ready->name.data,          w->ready->name.len,
                                     (const char *const *)w->ready->addrs, w->ready->n_addrs,
                                     w->ready->chunk_bytes,        w->ready->lanes,
                                     (const Ccs__PeerRank *const *)w->ready->ranks, w->ready->n_ranks};
    break;
  case CCS__PEER_MSG__BODY_FAIL:
    ret->kind = PEER_FAIL;
    ret->fail = (struct peer_fail){w->fail->name.data, w->fail->name.len, w->fail->status,
                                   w->fail->error, w->fail->refused_rank};
    break;
  case CCS__PEER_MSG__BODY_OP:
    ret->kind = PEER_OP;
    ret->op = (struct peer_op){w->op->name.data, w->op->name.len, w->op->seq,   w->op->kind,
                               w->op->dtype,     w->op->redop,    w->op->count, w->op->root,
                               w->op->rank};
    break;
  case CCS__PEER_MSG__BODY_REJOIN:
    ret->kind = PEER_REJOIN;
    ret->rejoin = (struct peer_rejoin){w->rejoin->name.data, w->rejoin->name.len,
                                       (const char *const *)w->rejoin->addrs, w->rejoin->n_addrs,
                                       w->rejoin->chunk_bytes, w->rejoin->lanes,
                                       (const Ccs__PeerRank *const *)w->rejoin->ranks, w->rejoin->n_ranks,
                                       w->rejoin->hold, w->rejoin->kept,
                                       (const Ccs__PeerCount *const *)w->rejoin->kept_sends,
                                       w->rejoin->n_kept_sends,
                                       (const Ccs__PeerCount *const *)w->rejoin->arrived,
                                       w->rejoin->n_arrived};
    break;
  case CCS__PEER_MSG__BODY_RESUME:
    ret->kind = PEER_RESUME;
    ret->resume = (struct peer_resume){w->resume->name.data, w->resume->name.len, w->resume->finished,
                                       w->resume->retry_from, w->resume->hold,
                                       (const Ccs__PeerCount *const *)w->resume->counts, w->resume->n_counts,
                                       (const char *const *)w->resume->rerun, w->resume->n_rerun};
    break;
  default: ret->kind = PEER_OTHER; break;
  }
}
