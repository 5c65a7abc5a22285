/* Direct: every participant talks to every other one. all_to_all as
 * pairwise exchange (step k: send to me+k, receive from me-k, so every
 * step is a permutation and no participant is hit by all at once);
 * all_reduce one-shot (everyone's whole buffer to everyone); gather,
 * scatter, broadcast and reduce straight between root and each peer. */
#include "plan/algo/algo.h"

int algo_direct(enum sched_coll c, int n, int me, int root, struct schedule *s) {
  switch (c) {
  case SCHED_ALL_TO_ALL:
    sched_init(s, (uint32_t)n);
    sched_add_copy(s, SCHED_INPUT, (uint32_t)me, (uint32_t)me);
    for (int k = 1; k < n; k++) {
      sched_add_send_input(s, (me + k) % n, (uint32_t)((me + k) % n));
      sched_add(s, SCHED_RECV, (me - k + n) % n, (uint32_t)((me - k + n) % n));
    }
    return 0;
  case SCHED_ALL_REDUCE:
    sched_init(s, 1);
    for (int k = 1; k < n; k++) sched_add(s, SCHED_SEND, (me + k) % n, 0);
    for (int k = 1; k < n; k++) sched_add(s, SCHED_RECV_REDUCE, (me - k + n) % n, 0);
    sched_add(s, SCHED_FINALIZE, -1, 0);
    return 0;
  case SCHED_ALL_GATHER:
    sched_init(s, (uint32_t)n);
    for (int k = 1; k < n; k++) sched_add(s, SCHED_SEND, (me + k) % n, (uint32_t)me);
    for (int k = 1; k < n; k++) sched_add(s, SCHED_RECV, (me - k + n) % n, (uint32_t)((me - k + n) % n));
    return 0;
  case SCHED_BROADCAST:
    sched_init(s, 1);
    if (me == root)
      for (int k = 1; k < n; k++) sched_add(s, SCHED_SEND, (root + k) % n, 0);
    else sched_add(s, SCHED_RECV, root, 0);
    return 0;
  case SCHED_REDUCE:
    sched_init(s, 1);
    if (me == root) {
      for (int k = 1; k < n; k++) sched_add(s, SCHED_RECV_REDUCE, (root + k) % n, 0);
      sched_add(s, SCHED_FINALIZE, -1, 0);
    } else {
      sched_add(s, SCHED_SEND, root, 0);
    }
    return 0;
  case SCHED_GATHER:
    sched_init(s, (uint32_t)n);
    if (me == root)
      for (int k = 1; k < n; k++) sched_add(s, SCHED_RECV, (root + k) % n, (uint32_t)((root + k) % n));
    else sched_add(s, SCHED_SEND, root, (uint32_t)me);
    return 0;
  case SCHED_SCATTER:
    sched_init(s, (uint32_t)n);
    if (me == root)
      for (int k = 1; k < n; k++) sched_add(s, SCHED_SEND, (root + k) % n, (uint32_t)((root + k) % n));
    else sched_add(s, SCHED_RECV, root, (uint32_t)me);
    return 0;
  case SCHED_REDUCE_SCATTER:
    sched_init(s, (uint32_t)n);
    for (int k = 1; k < n; k++) sched_add(s, SCHED_SEND, (me + k) % n, (uint32_t)((me + k) % n));
    for (int k = 1; k < n; k++) sched_add(s, SCHED_RECV_REDUCE, (me - k + n) % n, (uint32_t)me);
    sched_add(s, SCHED_FINALIZE, -1, (uint32_t)me);
    return 0;
  default: return -1;
  }
}
