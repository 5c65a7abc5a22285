/* Recursive halving-doubling: for all_reduce, halving exchanges (each step
 * swaps half of what is left with a partner at distance d and reduces the
 * other half) then doubling exchanges back: log2(n) steps each way;
 * reduce_scatter is the halving alone, all_gather the doubling alone.
 * With n not a power of two, the first 2r participants (r = n - P, P the
 * largest power of two below n) fold in pairs: even ones hand their data to
 * the odd ones and sit the exchanges out; the odd one then stands for both
 * (for reduce_scatter and all_gather it owns both their blocks, a "group"),
 * and hands back what the even one must end with. */
#include "plan/algo/algo.h"

static int floor_pow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

/* Virtual block vb of the core stands for real blocks: with one block per
 * participant (reduce_scatter, all_gather) the folded pairs' two, else one. */
struct groups {
  int per_participant, r;
};

static void emit(struct schedule *s, uint8_t op, int peer, uint32_t vb, const struct groups *g) {
  if (!g->per_participant) {
    sched_add(s, op, peer, vb);
  } else if ((int)vb < g->r) {
    sched_add(s, op, peer, 2 * vb);
    sched_add(s, op, peer, 2 * vb + 1);
  } else {
    sched_add(s, op, peer, vb + (uint32_t)g->r);
  }
}

static int real_of(int v, int r) { return v < r ? 2 * v + 1 : v + r; }

/* The core among P virtual participants; vme ends owning virtual block vme. */
static void halving(struct schedule *s, int P, int vme, const struct groups *g) {
  uint32_t lo = 0, hi = (uint32_t)P;
  for (int d = P / 2; d >= 1; d /= 2) {
    int partner = real_of(vme ^ d, g->r);
    uint32_t mid = (lo + hi) / 2;
    uint32_t keep_lo = (vme & d) ? mid : lo, keep_hi = (vme & d) ? hi : mid;
    uint32_t give_lo = (vme & d) ? lo : mid, give_hi = (vme & d) ? mid : hi;
    for (uint32_t b = give_lo; b < give_hi; b++) emit(s, SCHED_SEND, partner, b, g);
    for (uint32_t b = keep_lo; b < keep_hi; b++) emit(s, SCHED_RECV_REDUCE, partner, b, g);
    lo = keep_lo, hi = keep_hi;
  }
}

static void doubling(struct schedule *s, int P, int vme, const struct groups *g) {
  uint32_t lo = (uint32_t)vme, hi = (uint32_t)vme + 1; /* what vme holds complete */
  for (int d = 1; d < P; d *= 2) {
    int partner = real_of(vme ^ d, g->r);
    uint32_t size = hi - lo;
    uint32_t plo = (vme & d) ? lo - size : hi, phi = (vme & d) ? lo : hi + size;
    for (uint32_t b = lo; b < hi; b++) emit(s, SCHED_SEND, partner, b, g);
    for (uint32_t b = plo; b < phi; b++) emit(s, SCHED_RECV, partner, b, g);
    lo = lo < plo ? lo : plo;
    hi = hi > phi ? hi : phi;
  }
}

int algo_rhd(enum sched_coll c, int n, int me, struct schedule *s) {
  int P = floor_pow2(n), r = n - P;
  int folded = me < 2 * r && me % 2 == 0; /* sits the exchanges out */
  int vme = me < 2 * r ? me / 2 : me - r;
  struct groups one = {0, r}, per = {1, r};
  switch (c) {
  case SCHED_ALL_REDUCE: /* P blocks: the core's own */
    sched_init(s, (uint32_t)P);
    if (folded) {
      for (uint32_t b = 0; b < (uint32_t)P; b++) sched_add(s, SCHED_SEND, me + 1, b);
      for (uint32_t b = 0; b < (uint32_t)P; b++) sched_add(s, SCHED_RECV, me + 1, b);
      return 0;
    }
    if (me < 2 * r)
      for (uint32_t b = 0; b < (uint32_t)P; b++) sched_add(s, SCHED_RECV_REDUCE, me - 1, b);
    halving(s, P, vme, &one);
    sched_add(s, SCHED_FINALIZE, -1, (uint32_t)vme);
    doubling(s, P, vme, &one);
    if (me < 2 * r)
      for (uint32_t b = 0; b < (uint32_t)P; b++) sched_add(s, SCHED_SEND, me - 1, b);
    return 0;
  case SCHED_REDUCE_SCATTER: /* n blocks, block p ends reduced at p */
    sched_init(s, (uint32_t)n);
    if (folded) {
      for (uint32_t b = 0; b < (uint32_t)n; b++) sched_add(s, SCHED_SEND, me + 1, b);
      sched_add(s, SCHED_RECV, me + 1, (uint32_t)me);
      return 0;
    }
    if (me < 2 * r)
      for (uint32_t b = 0; b < (uint32_t)n; b++) sched_add(s, SCHED_RECV_REDUCE, me - 1, b);
    halving(s, P, vme, &per);
    if (me < 2 * r) { /* the pair's two blocks are complete here */
      sched_add(s, SCHED_FINALIZE, -1, (uint32_t)me - 1);
      sched_add(s, SCHED_SEND, me - 1, (uint32_t)me - 1);
    }
    sched_add(s, SCHED_FINALIZE, -1, (uint32_t)me);
    return 0;
  case SCHED_ALL_GATHER: /* n blocks, block p from p */
    sched_init(s, (uint32_t)n);
    if (folded) {
      sched_add(s, SCHED_SEND, me + 1, (uint32_t)me);
      for (uint32_t b = 0; b < (uint32_t)n; b++)
        if (b != (uint32_t)me) sched_add(s, SCHED_RECV, me + 1, b);
      return 0;
    }
    if (me < 2 * r) sched_add(s, SCHED_RECV, me - 1, (uint32_t)me - 1);
    doubling(s, P, vme, &per);
    if (me < 2 * r)
      for (uint32_t b = 0; b < (uint32_t)n; b++)
        if (b != (uint32_t)me - 1) sched_add(s, SCHED_SEND, me - 1, b);
    return 0;
  default: return -1;
  }
}
