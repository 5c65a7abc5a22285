/* Ring: reduce-scatter then all-gather around the ring for all_reduce (each
 * block crosses each link twice: the bandwidth-optimal 2(n-1)/n), the
 * halves alone for reduce_scatter and all_gather, and a pipelined chain
 * for broadcast and reduce. */
#include "plan/algo/algo.h"

static int mod(int a, int n) { return ((a % n) + n) % n; }

int algo_ring(enum sched_coll c, int n, int me, int root, int pipeline, struct schedule *s) {
  int next = mod(me + 1, n), prev = mod(me - 1, n);
  switch (c) {
  case SCHED_ALL_REDUCE:
    sched_init(s, (uint32_t)n);
    for (int k = 0; k < n - 1; k++) {
      sched_add(s, SCHED_SEND, next, (uint32_t)mod(me - k, n));
      sched_add(s, SCHED_RECV_REDUCE, prev, (uint32_t)mod(me - k - 1, n));
    }
    sched_add(s, SCHED_FINALIZE, -1, (uint32_t)mod(me + 1, n)); /* complete here */
    for (int k = 0; k < n - 1; k++) {
      sched_add(s, SCHED_SEND, next, (uint32_t)mod(me + 1 - k, n));
      sched_add(s, SCHED_RECV, prev, (uint32_t)mod(me - k, n));
    }
    return 0;
  case SCHED_REDUCE_SCATTER: /* shifted by one so that block me ends here */
    sched_init(s, (uint32_t)n);
    for (int k = 0; k < n - 1; k++) {
      sched_add(s, SCHED_SEND, next, (uint32_t)mod(me - k - 1, n));
      sched_add(s, SCHED_RECV_REDUCE, prev, (uint32_t)mod(me - k - 2, n));
    }
    sched_add(s, SCHED_FINALIZE, -1, (uint32_t)me);
    return 0;
  case SCHED_ALL_GATHER:
    sched_init(s, (uint32_t)n);
    for (int k = 0; k < n - 1; k++) {
      sched_add(s, SCHED_SEND, next, (uint32_t)mod(me - k, n));
      sched_add(s, SCHED_RECV, prev, (uint32_t)mod(me - k - 1, n));
    }
    return 0;
  case SCHED_BROADCAST: { /* root -> root+1 -> ... ; blocks follow each other */
    int pos = mod(me - root, n);
    sched_init(s, (uint32_t)pipeline);
    for (int b = 0; b < pipeline; b++) {
      if (pos > 0) sched_add(s, SCHED_RECV, prev, (uint32_t)b);
      if (pos < n - 1) sched_add(s, SCHED_SEND, next, (uint32_t)b);
    }
    return 0;
  }
  case SCHED_REDUCE: { /* root+1 -> root+2 -> ... -> root */
    int pos = mod(me - root - 1, n);
    sched_init(s, (uint32_t)pipeline);
    for (int b = 0; b < pipeline; b++) {
      if (pos > 0) sched_add(s, SCHED_RECV_REDUCE, prev, (uint32_t)b);
      if (pos < n - 1) sched_add(s, SCHED_SEND, next, (uint32_t)b);
      else sched_add(s, SCHED_FINALIZE, -1, (uint32_t)b);
    }
    return 0;
  }
  default: return -1;
  }
}
