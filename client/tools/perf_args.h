#ifndef CCS_PERF_ARGS_H
#define CCS_PERF_ARGS_H

#include <stddef.h>
#include <stdio.h>

#include "ccs.h"
#include "perf_math.h"

struct perf_opts {
  enum perf_coll coll;
  size_t min_bytes, max_bytes, step_bytes;
  double factor;
  int iters, warmup, agg, check, root, average, blocking, registered, nprocs;
  int device; /* buffers on this GPU; -1: host memory */
  int dtypes[CCS_DTYPE_COUNT], ndtypes;
  int ops[CCS_REDOP_COUNT], nops;
  const char *json;
  double duration;    /* > 0: one size, calls back to back this long (seconds) */
  const char *trace;  /* rank 0 writes each timed call's end and latency here */
  int priority;       /* ccs_priority_t of the comm */
  int host_stream;    /* --duration on host buffers: calls on a host stream, synchronised per check */
};

extern const char *const perf_coll_names[PERF_COLL_COUNT];
void perf_usage(FILE *f);
int perf_parse_int(const char *s, int min, int max, int *ret);
/* 0: parsed; 1: help asked; -1: bad command line (a message was printed) */
int perf_parse_args(int argc, char **argv, struct perf_opts *o);

#endif
