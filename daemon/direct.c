/* The direct intra-node plan: the daemon maps every rank's buffers, so each
 * collective is one pass that reads every input once and writes every
 * output once, cut into pieces the executor spreads over its threads.
 *
 *   all_reduce      1 piece: reduce all sends -> every recv
 *   reduce          1 piece: reduce all sends -> root's recv
 *   broadcast       1 piece: root's send -> every recv
 *   all_gather      n pieces: send j -> block j of every recv
 *   reduce_scatter  n pieces: block r of all sends -> recv r
 *   all_to_all      n*n pieces: block r of send j -> block j of recv r
 *   gather/scatter  n pieces; send/recv 1 piece
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

void ccsd_xop_free(struct xop *x) {
  if (!x) return;
  free(x->posts);
  free(x->pieces);
  free(x->ptrs);
  free(x->piece_first_task);
  free(x->scratch);
  free(x);
}

static char *send_ptr(const struct post *p) {
  return p->sendbuf ? (char *)p->sendbuf->base + p->send_off : NULL;
}
static char *recv_ptr(const struct post *p) {
  return p->recvbuf ? (char *)p->recvbuf->base + p->recv_off : NULL;
}

static int overlaps(const struct membuf *a, uint64_t aoff, uint64_t alen, const struct membuf *b,
                    uint64_t boff, uint64_t blen) {
  return a && a == b && alen && blen && aoff < boff + blen && boff < aoff + alen;
}

struct builder {
  struct xop *x;
  void **next_ptr;
  size_t next_piece;
};

static struct xpiece *piece(struct builder *b, int nin, int nout, int reduce, size_t count) {
  struct xpiece *pc = &b->x->pieces[b->next_piece++];
  pc->in = (const void **)b->next_ptr;
  b->next_ptr += nin;
  pc->out = b->next_ptr;
  b->next_ptr += nout;
  pc->nin = nin;
  pc->nout = nout;
  pc->reduce = reduce && nin > 1;
  pc->count = count;
  return pc;
}

ccs_result_t ccsd_plan_direct(struct xop *x, char *err, size_t errlen) {
  const struct post *p0 = x->posts[0];
  int n = x->comm->nranks, root = p0->root;
  size_t cnt = p0->count, sz = ccs_dtype_size(p0->dtype), blk = cnt * sz;
  x->dtype = p0->dtype;
  x->redop = p0->redop;
  x->avg_divisor = (size_t)n;
  x->elem_size = sz;
  x->chunk_elems = x->comm->d->cfg.chunk_bytes / sz;
  if (x->chunk_elems == 0) x->chunk_elems = 1;

  size_t npieces, nptrs;
  int snapshot = 0; /* in-place all_to_all: copy the sends aside first */
  switch (x->kind) {
  case CCS__ALL_REDUCE: npieces = 1, nptrs = 2 * (size_t)n; break;
  case CCS__REDUCE: npieces = 1, nptrs = (size_t)n + 1; break;
  case CCS__BROADCAST: npieces = 1, nptrs = (size_t)n + 1; break;
  case CCS__ALL_GATHER: npieces = (size_t)n, nptrs = (size_t)n * (n + 1); break;
  case CCS__REDUCE_SCATTER: npieces = (size_t)n, nptrs = (size_t)n * (n + 1); break;
  case CCS__ALL_TO_ALL:
    for (int r = 0; r < n; r++)
      for (int j = 0; j < n; j++)
        snapshot |= overlaps(x->posts[r]->recvbuf, x->posts[r]->recv_off, x->posts[r]->recv_len,
                             x->posts[j]->sendbuf, x->posts[j]->send_off, x->posts[j]->send_len);
    npieces = (size_t)n * n + (snapshot ? (size_t)n : 0), nptrs = 2 * npieces;
    break;
  case CCS__GATHER:
  case CCS__SCATTER: npieces = (size_t)n, nptrs = 2 * (size_t)n; break;
  case CCS__SEND: npieces = 1, nptrs = 2; break;
  case CCS__BARRIER: npieces = 0, nptrs = 0; break;
  default: snprintf(err, errlen, "unknown collective %u", x->kind); return CCS_ERR_INVALID_ARGUMENT;
  }
  if (cnt == 0) npieces = 0;

  x->pieces = calloc(npieces + 1, sizeof(*x->pieces));
  x->ptrs = calloc(nptrs + 1, sizeof(void *));
  x->piece_first_task = calloc(npieces + 1, sizeof(size_t));
  if (snapshot) x->scratch = malloc((size_t)n * n * blk);
  if (!x->pieces || !x->ptrs || !x->piece_first_task || (snapshot && !x->scratch)) {
    snprintf(err, errlen, "out of memory planning %s", ccs__coll_name(x->kind));
    return CCS_ERR_NO_MEMORY;
  }
  x->npieces = npieces;
  struct builder b = {x, x->ptrs, 0};
  struct xpiece *pc;
  size_t split = 0;
  if (npieces) switch (x->kind) {
    case CCS__ALL_REDUCE:
      pc = piece(&b, n, n, 1, cnt);
      for (int r = 0; r < n; r++) pc->in[r] = send_ptr(x->posts[r]), pc->out[r] = recv_ptr(x->posts[r]);
      break;
    case CCS__REDUCE:
      pc = piece(&b, n, 1, 1, cnt);
      for (int r = 0; r < n; r++) pc->in[r] = send_ptr(x->posts[r]);
      pc->out[0] = recv_ptr(x->posts[root]);
      break;
    case CCS__BROADCAST:
      pc = piece(&b, 1, n, 0, cnt);
      pc->in[0] = send_ptr(x->posts[root]);
      for (int r = 0; r < n; r++) pc->out[r] = recv_ptr(x->posts[r]);
      break;
    case CCS__ALL_GATHER:
      for (int j = 0; j < n; j++) {
        pc = piece(&b, 1, n, 0, cnt);
        pc->in[0] = send_ptr(x->posts[j]);
        for (int r = 0; r < n; r++) pc->out[r] = recv_ptr(x->posts[r]) + (size_t)j * blk;
      }
      break;
    case CCS__REDUCE_SCATTER:
      for (int r = 0; r < n; r++) {
        pc = piece(&b, n, 1, 1, cnt);
        for (int j = 0; j < n; j++) pc->in[j] = send_ptr(x->posts[j]) + (size_t)r * blk;
        pc->out[0] = recv_ptr(x->posts[r]);
      }
      break;
    case CCS__ALL_TO_ALL: {
      char *src[CCSD_MAX_RANKS];
      for (int j = 0; j < n; j++) {
        src[j] = send_ptr(x->posts[j]);
        if (!snapshot) continue;
        pc = piece(&b, 1, 1, 0, (size_t)n * cnt);
        pc->in[0] = src[j];
        pc->out[0] = src[j] = (char *)x->scratch + (size_t)j * n * blk;
      }
      split = snapshot ? (size_t)n : 0;
      for (int r = 0; r < n; r++)
        for (int j = 0; j < n; j++) {
          pc = piece(&b, 1, 1, 0, cnt);
          pc->in[0] = src[j] + (size_t)r * blk;
          pc->out[0] = recv_ptr(x->posts[r]) + (size_t)j * blk;
        }
      break;
    }
    case CCS__GATHER:
      for (int j = 0; j < n; j++) {
        pc = piece(&b, 1, 1, 0, cnt);
        pc->in[0] = send_ptr(x->posts[j]);
        pc->out[0] = recv_ptr(x->posts[root]) + (size_t)j * blk;
      }
      break;
    case CCS__SCATTER:
      for (int r = 0; r < n; r++) {
        pc = piece(&b, 1, 1, 0, cnt);
        pc->in[0] = send_ptr(x->posts[root]) + (size_t)r * blk;
        pc->out[0] = recv_ptr(x->posts[r]);
      }
      break;
    case CCS__SEND: /* posts[0] sends, posts[1] receives */
      pc = piece(&b, 1, 1, 0, cnt);
      pc->in[0] = send_ptr(x->posts[0]);
      pc->out[0] = recv_ptr(x->posts[1]);
      break;
    }

  size_t tasks = 0, written = 0;
  for (size_t i = 0; i < npieces; i++) {
    written += x->pieces[i].count * sz * (size_t)x->pieces[i].nout;
    x->work_bytes += x->pieces[i].count * sz * (size_t)(x->pieces[i].nin + x->pieces[i].nout);
  }
  x->streaming = written >= x->comm->d->cfg.stream_bytes;
  for (size_t i = 0; i < npieces; i++) {
    if (i == split && split) x->phase_split = tasks;
    x->piece_first_task[i] = tasks;
    tasks += (x->pieces[i].count + x->chunk_elems - 1) / x->chunk_elems;
  }
  x->piece_first_task[npieces] = tasks;
  x->ntasks = tasks;
  if (!split) x->phase_split = tasks;
  return CCS_OK;
}
