/* Binomial trees rooted at root: broadcast (pipelined in blocks), reduce,
 * gather, scatter; all_reduce as a reduce to participant 0 and a broadcast
 * back, both pipelined (NCCL's double binary tree, which uses both
 * directions of every link, is not built yet). */
#include "algo.h"

/* Relative rank vr (root = 0): its parent, and the size of its subtree;
 * children are vr + m for m = half, half/2, ... 1 with vr + m < n. */
static int lowbit_span(int vr, int n) {
  int m = 1;
  while (m < n && !(vr & m)) m <<= 1;
  return m; /* vr's subtree spans [vr, vr + m) (cut at n); the root's spans all */
}

static int real(int vr, int root, int n) { return (vr + root) % n; }

static void bcast(struct schedule *s, int n, int me, int root, uint32_t nblocks) {
  int vr = (me - root + n) % n, span = lowbit_span(vr, n);
  for (uint32_t b = 0; b < nblocks; b++) {
    if (vr) sched_add(s, SCHED_RECV, real(vr - span, root, n), b);
    for (int m = span >> 1; m >= 1; m >>= 1)
      if (vr + m < n) sched_add(s, SCHED_SEND, real(vr + m, root, n), b);
  }
}

static void reduce(struct schedule *s, int n, int me, int root, uint32_t nblocks) {
  int vr = (me - root + n) % n, span = lowbit_span(vr, n);
  for (uint32_t b = 0; b < nblocks; b++) {
    for (int m = 1; m < span; m <<= 1)
      if (vr + m < n) sched_add(s, SCHED_RECV_REDUCE, real(vr + m, root, n), b);
    if (vr) sched_add(s, SCHED_SEND, real(vr - span, root, n), b);
  }
}

int algo_tree(enum sched_coll c, int n, int me, int root, int pipeline, struct schedule *s) {
  int vr = (me - root + n) % n, span = lowbit_span(vr, n);
  switch (c) {
  case SCHED_BROADCAST:
    sched_init(s, (uint32_t)pipeline);
    bcast(s, n, me, root, (uint32_t)pipeline);
    return 0;
  case SCHED_REDUCE:
    sched_init(s, (uint32_t)pipeline);
    reduce(s, n, me, root, (uint32_t)pipeline);
    if (me == root)
      for (int b = 0; b < pipeline; b++) sched_add(s, SCHED_FINALIZE, -1, (uint32_t)b);
    return 0;
  case SCHED_ALL_REDUCE:
    sched_init(s, (uint32_t)pipeline);
    reduce(s, n, me, 0, (uint32_t)pipeline);
    if (me == 0)
      for (int b = 0; b < pipeline; b++) sched_add(s, SCHED_FINALIZE, -1, (uint32_t)b);
    bcast(s, n, me, 0, (uint32_t)pipeline);
    return 0;
  case SCHED_GATHER: /* a subtree's blocks go up one by one, in relative order */
    sched_init(s, (uint32_t)n);
    for (int m = 1; m < span; m <<= 1)
      for (int v = vr + m; v < vr + 2 * m && v < n; v++)
        if (vr + m < n) sched_add(s, SCHED_RECV, real(vr + m, root, n), (uint32_t)real(v, root, n));
    if (vr)
      for (int v = vr; v < vr + span && v < n; v++)
        sched_add(s, SCHED_SEND, real(vr - span, root, n), (uint32_t)real(v, root, n));
    return 0;
  case SCHED_SCATTER:
    sched_init(s, (uint32_t)n);
    if (vr)
      for (int v = vr; v < vr + span && v < n; v++)
        sched_add(s, SCHED_RECV, real(vr - span, root, n), (uint32_t)real(v, root, n));
    for (int m = span >> 1; m >= 1; m >>= 1)
      for (int v = vr + m; v < vr + 2 * m && v < n; v++)
        sched_add(s, SCHED_SEND, real(vr + m, root, n), (uint32_t)real(v, root, n));
    return 0;
  default: return -1;
  }
}
