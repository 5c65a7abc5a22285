/* nccl-tests arithmetic, shared by ccs-perf and its unit test: how a
 * requested size becomes counts, and how time becomes algbw and busbw. */
#ifndef CCS_PERF_MATH_H
#define CCS_PERF_MATH_H

#include <stddef.h>

enum perf_coll {
  PERF_ALL_REDUCE, PERF_ALL_GATHER, PERF_REDUCE_SCATTER, PERF_BROADCAST, PERF_REDUCE,
  PERF_ALL_TO_ALL, PERF_GATHER, PERF_SCATTER, PERF_SENDRECV, PERF_COLL_COUNT
};

struct perf_counts {
  size_t param;      /* the count passed to the call */
  size_t send, recv; /* elements in each rank's buffers */
  size_t bytes;      /* the printed size: max(send, recv) bytes */
};

/* The counts for `bytes` of `elem`-byte elements on n ranks. Collectives
 * that split a buffer by rank give each rank a multiple of 16 bytes. */
static inline struct perf_counts perf_counts(enum perf_coll c, size_t bytes, size_t elem, int n) {
  size_t count = bytes / elem, base = (count / (size_t)n) & ~(16 / elem - 1);
  struct perf_counts r = {count, count, count, 0};
  switch (c) {
  case PERF_ALL_GATHER: case PERF_GATHER: r.param = base, r.send = base, r.recv = base * (size_t)n; break;
  case PERF_REDUCE_SCATTER: case PERF_SCATTER: r.param = base, r.send = base * (size_t)n, r.recv = base; break;
  case PERF_ALL_TO_ALL: r.param = base, r.send = r.recv = base * (size_t)n; break;
  default: break;
  }
  r.bytes = (r.send > r.recv ? r.send : r.recv) * elem;
  return r;
}

/* algbw (GB/s) of one op of `seconds`, and the busbw factor. */
static inline double perf_algbw(enum perf_coll c, struct perf_counts k, size_t elem, double seconds) {
  size_t moved = k.param * elem;
  if (c == PERF_ALL_GATHER || c == PERF_REDUCE_SCATTER || c == PERF_ALL_TO_ALL ||
      c == PERF_GATHER || c == PERF_SCATTER)
    moved = k.bytes;
  return seconds > 0 ? (double)moved / 1e9 / seconds : 0;
}

static inline double perf_bus_factor(enum perf_coll c, int n) {
  switch (c) {
  case PERF_ALL_REDUCE: return 2.0 * (n - 1) / n;
  case PERF_BROADCAST: case PERF_REDUCE: case PERF_SENDRECV: return 1.0;
  default: return (double)(n - 1) / n;
  }
}

#endif
