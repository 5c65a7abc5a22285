/* Recursive halving-doubling: for all_reduce, halving exchanges (each step
 * swaps half of what is left with a partner at distance d and reduces the
 * other half) then doubling exchanges back: log2(n) steps each way. With n
 * not a power of two, the first 2r participants (r = n - P, P the largest
 * power of two below n) fold in pairs first: even ones hand their data to
 * the odd ones, sit out, and get the result at the end. reduce_scatter and
 * all_gather are built for powers of two only. */
#include "algo.h"

static int floor_pow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

/* The core among P virtual participants; vme owns block vme at the middle. */
static void halving(struct schedule *s, int P, int vme, int (*real)(int, int), int r) {
  uint32_t lo = 0, hi = (uint32_t)P;
  for (int d = P / 2; d >= 1; d /= 2) {
    int partner = real(vme ^ d, r);
    uint32_t mid = (lo + hi) / 2;
    uint32_t keep_lo = (vme & d) ? mid : lo, keep_hi = (vme & d) ? hi : mid;
    uint32_t give_lo = (vme & d) ? lo : mid, give_hi = (vme & d) ? mid : hi;
    for (uint32_t b = give_lo; b < give_hi; b++) sched_add(s, SCHED_SEND, partner, b);
    for (uint32_t b = keep_lo; b < keep_hi; b++) sched_add(s, SCHED_RECV_REDUCE, partner, b);
    lo = keep_lo, hi = keep_hi;
  }
}

static void doubling(struct schedule *s, int P, int vme, int (*real)(int, int), int r) {
  uint32_t lo = (uint32_t)vme, hi = (uint32_t)vme + 1; /* what vme holds complete */
  for (int d = 1; d < P; d *= 2) {
    int partner = real(vme ^ d, r);
    uint32_t size = hi - lo;
    uint32_t plo = (vme & d) ? lo - size : hi, phi = (vme & d) ? lo : hi + size;
    for (uint32_t b = lo; b < hi; b++) sched_add(s, SCHED_SEND, partner, b);
    for (uint32_t b = plo; b < phi; b++) sched_add(s, SCHED_RECV, partner, b);
    lo = lo < plo ? lo : plo;
    hi = hi > phi ? hi : phi;
  }
}

static int real_of(int v, int r) { return v < r ? 2 * v + 1 : v + r; }
static int identity(int v, int r) { return v; }

int algo_rhd(enum sched_coll c, int n, int me, struct schedule *s) {
  int P = floor_pow2(n), r = n - P;
  switch (c) {
  case SCHED_ALL_REDUCE: {
    sched_init(s, (uint32_t)P);
    if (me < 2 * r && me % 2 == 0) { /* folds into me + 1, gets the result back */
      for (uint32_t b = 0; b < (uint32_t)P; b++) sched_add(s, SCHED_SEND, me + 1, b);
      for (uint32_t b = 0; b < (uint32_t)P; b++) sched_add(s, SCHED_RECV, me + 1, b);
      return 0;
    }
    int vme = me < 2 * r ? me / 2 : me - r;
    if (me < 2 * r)
      for (uint32_t b = 0; b < (uint32_t)P; b++) sched_add(s, SCHED_RECV_REDUCE, me - 1, b);
    halving(s, P, vme, real_of, r);
    sched_add(s, SCHED_FINALIZE, -1, (uint32_t)vme);
    doubling(s, P, vme, real_of, r);
    if (me < 2 * r)
      for (uint32_t b = 0; b < (uint32_t)P; b++) sched_add(s, SCHED_SEND, me - 1, b);
    return 0;
  }
  case SCHED_REDUCE_SCATTER:
    if (P != n) return -1;
    sched_init(s, (uint32_t)n);
    halving(s, n, me, identity, 0);
    sched_add(s, SCHED_FINALIZE, -1, (uint32_t)me);
    return 0;
  case SCHED_ALL_GATHER:
    if (P != n) return -1;
    sched_init(s, (uint32_t)n);
    doubling(s, n, me, identity, 0);
    return 0;
  default: return -1;
  }
}
