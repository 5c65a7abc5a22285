/* Binomial trees rooted at root: broadcast (pipelined in blocks), reduce,
 * gather, scatter. all_reduce on a double binary tree, as NCCL does: half
 * of the blocks go up and down one binary tree, half the other, whose
 * leaves are the first one's inner nodes (mirrored numbering for even n,
 * shifted for odd), so every participant sends and receives about as much
 * and both directions of the links carry data. */
#include "plan/algo/algo.h"

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

/* An in-order binary tree over 0..n-1 (0 is the root with one child):
 * participant r's parent and up to two children, -1 where none. */
static void btree(int n, int r, int *up, int kids[2]) {
  int bit = 1;
  while (bit < n && !(bit & r)) bit <<= 1;
  kids[0] = kids[1] = -1;
  if (r == 0) {
    *up = -1;
    if (n > 1) {
      int top = 1;
      while (top * 2 < n) top *= 2;
      kids[0] = top;
    }
    return;
  }
  *up = (r ^ bit) | (bit << 1);
  if (*up >= n) *up = r ^ bit;
  int low = bit >> 1;
  if (low) kids[0] = r - low;
  for (; low; low >>= 1)
    if (r + low < n) {
      kids[1] = r + low;
      break;
    }
}

/* Tree t (0 or 1) of the double tree, in real participant numbers. */
static void dtree(int n, int me, int t, int *up, int kids[2]) {
  if (t == 0) {
    btree(n, me, up, kids);
    return;
  }
  int odd = n % 2, v = odd ? (me - 1 + n) % n : n - 1 - me;
  btree(n, v, up, kids);
  int *all[3] = {up, &kids[0], &kids[1]};
  for (int i = 0; i < 3; i++)
    if (*all[i] >= 0) *all[i] = odd ? (*all[i] + 1) % n : n - 1 - *all[i];
}

static void double_tree_all_reduce(struct schedule *s, int n, int me, int pipeline) {
  uint32_t per = (uint32_t)pipeline; /* blocks per tree */
  sched_init(s, 2 * per);
  int up[2], kids[2][2];
  for (int t = 0; t < 2; t++) dtree(n, me, t, &up[t], kids[t]);
  for (uint32_t b = 0; b < per; b++)
    for (int t = 0; t < 2; t++) {
      uint32_t blk = (uint32_t)t * per + b;
      for (int k = 0; k < 2; k++)
        if (kids[t][k] >= 0) sched_add(s, SCHED_RECV_REDUCE, kids[t][k], blk);
      if (up[t] >= 0) sched_add(s, SCHED_SEND, up[t], blk);
      else sched_add(s, SCHED_FINALIZE, -1, blk);
    }
  for (uint32_t b = 0; b < per; b++)
    for (int t = 0; t < 2; t++) {
      uint32_t blk = (uint32_t)t * per + b;
      if (up[t] >= 0) sched_add(s, SCHED_RECV, up[t], blk);
      for (int k = 0; k < 2; k++)
        if (kids[t][k] >= 0) sched_add(s, SCHED_SEND, kids[t][k], blk);
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
    double_tree_all_reduce(s, n, me, pipeline);
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
