/* ccs-perf's command line: nccl-tests' flags and their defaults. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_args.h"

const char *const perf_coll_names[PERF_COLL_COUNT] = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
    "all_to_all", "gather",     "scatter",        "sendrecv"};



void perf_usage(FILE *f) {
  fprintf(f,
          "usage: ccs-perf COLLECTIVE [options]\n"
          "collectives: all_reduce all_gather reduce_scatter broadcast reduce all_to_all\n"
          "             gather scatter sendrecv\n"
          "  -b MIN    minimum size in bytes (K, M, G suffixes; default 32M)\n"
          "  -e MAX    maximum size in bytes (default 32M)\n"
          "  -f F      multiply the size by F each step (default 2)\n"
          "  -i STEP   add STEP bytes each step instead\n"
          "  -n N      timed iterations (default 20)\n"
          "  -w N      warm-up iterations (default 1)\n"
          "  -m N      ops per group in each iteration (default 1)\n"
          "  -c N      checked iterations; 0 disables the check (default 1)\n"
          "  -o OP     sum prod max min avg all (default sum)\n"
          "  -d TYPE   int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double\n"
          "            f8e4m3 f8e5m2 all (default float)\n"
          "  -r ROOT   root rank (default 0)\n"
          "  -a MODE   time across ranks: 0 rank 0, 1 average, 2 min, 3 max (default 1)\n"
          "  -z 0|1    blocking collectives (every call here is; accepted for compatibility)\n"
          "  -J FILE   also write the rows as JSON\n"
          "  --np N    fork N local ranks\n"
          "  --registered 0|1  ccs_mem_alloc buffers (1, default) or malloc (0)\n"
          "  --device GPU      buffers on that GPU (ccs_mem_alloc_device, or cudaMalloc\n"
          "                    with --registered 0), ops on a stream\n"
          "  --duration S      one size (-b), out of place, calls back to back for S seconds\n"
          "  --trace FILE      rank 0 writes a line per timed call: its end (CLOCK_MONOTONIC\n"
          "                    seconds, comparable between processes) and its latency\n"
          "  --priority P      the comm's priority beside the user's others: latency, normal, bulk\n"
          "  --stream          with --duration on host buffers: calls go on a host stream and\n"
          "                    return once submitted (as a framework's asynchronous calls); the\n"
          "                    trace then has a line per synchronised batch\n"
          "environment without --np: CCS_RANK, CCS_NRANKS, CCS_UNIQUE_ID_FILE\n");
}

static int parse_size(const char *s, size_t *ret) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || v < 0) return -1;
  switch (*end) {
  case 'K': case 'k': v *= 1024, end++; break;
  case 'M': case 'm': v *= 1024 * 1024, end++; break;
  case 'G': case 'g': v *= 1024.0 * 1024 * 1024, end++; break;
  default: break;
  }
  if (*end || v > 1e15) return -1;
  *ret = (size_t)v;
  return 0;
}

int perf_parse_int(const char *s, int min, int max, int *ret) {
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v < min || v > max) return -1;
  *ret = (int)v;
  return 0;
}

static int parse_dtype(const char *s, struct perf_opts *o) {
  if (!strcmp(s, "all")) {
    for (int t = 0; t < CCS_DTYPE_COUNT; t++) o->dtypes[t] = t;
    o->ndtypes = CCS_DTYPE_COUNT;
    return 0;
  }
  static const struct { const char *name; ccs_dtype_t t; } aliases[] = {
      {"char", CCS_INT8}, {"int", CCS_INT32}, {"float16", CCS_FLOAT16}, {"float32", CCS_FLOAT32},
      {"float64", CCS_FLOAT64}, {"bf16", CCS_BFLOAT16}};
  for (int t = 0; t < CCS_DTYPE_COUNT; t++)
    if (!strcmp(s, ccs_dtype_name((ccs_dtype_t)t))) return o->dtypes[0] = t, o->ndtypes = 1, 0;
  for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
    if (!strcmp(s, aliases[i].name)) return o->dtypes[0] = aliases[i].t, o->ndtypes = 1, 0;
  return -1;
}

static int parse_op(const char *s, struct perf_opts *o) {
  if (!strcmp(s, "all")) {
    for (int op = 0; op < CCS_REDOP_COUNT; op++) o->ops[op] = op;
    o->nops = CCS_REDOP_COUNT;
    return 0;
  }
  for (int op = 0; op < CCS_REDOP_COUNT; op++)
    if (!strcmp(s, ccs_redop_name((ccs_redop_t)op))) return o->ops[0] = op, o->nops = 1, 0;
  return -1;
}

int perf_parse_args(int argc, char **argv, struct perf_opts *o) {
  memset(o, 0, sizeof(*o));
  o->min_bytes = o->max_bytes = 32 << 20;
  o->factor = 2;
  o->iters = 20, o->warmup = 1, o->agg = 1, o->check = 1, o->average = 1, o->registered = 1;
  o->device = -1;
  o->priority = CCS_PRIORITY_DEFAULT;
  o->dtypes[0] = CCS_FLOAT32, o->ndtypes = 1;
  o->ops[0] = CCS_SUM, o->nops = 1;
  if (argc < 2 || argv[1][0] == '-') {
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) return 1;
    fprintf(stderr, "ccs-perf: name a collective first\n");
    return -1;
  }
  int found = 0;
  for (int c = 0; c < PERF_COLL_COUNT; c++)
    if (!strcmp(argv[1], perf_coll_names[c])) o->coll = (enum perf_coll)c, found = 1;
  if (!found) {
    fprintf(stderr, "ccs-perf: unknown collective '%s'\n", argv[1]);
    return -1;
  }
  enum { O_NP = 256, O_REGISTERED, O_DEVICE, O_DURATION, O_TRACE, O_PRIORITY, O_STREAM };
  static const struct option longs[] = {{"np", required_argument, 0, O_NP},
                                        {"registered", required_argument, 0, O_REGISTERED},
                                        {"device", required_argument, 0, O_DEVICE},
                                        {"duration", required_argument, 0, O_DURATION},
                                        {"trace", required_argument, 0, O_TRACE},
                                        {"priority", required_argument, 0, O_PRIORITY},
                                        {"stream", no_argument, 0, O_STREAM},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  optind = 2;
  int c;
  while ((c = getopt_long(argc, argv, "b:e:i:f:n:w:m:c:o:d:r:a:z:J:h", longs, NULL)) != -1) {
    int bad = 0;
    switch (c) {
    case 'b': bad = parse_size(optarg, &o->min_bytes); break;
    case 'e': bad = parse_size(optarg, &o->max_bytes); break;
    case 'i': bad = parse_size(optarg, &o->step_bytes) || o->step_bytes == 0; break;
    case 'f': o->factor = strtod(optarg, NULL), bad = !(o->factor > 1); break;
    case 'n': bad = perf_parse_int(optarg, 1, 1 << 24, &o->iters); break;
    case 'w': bad = perf_parse_int(optarg, 0, 1 << 24, &o->warmup); break;
    case 'm': bad = perf_parse_int(optarg, 1, 1024, &o->agg); break;
    case 'c': bad = perf_parse_int(optarg, 0, 1 << 20, &o->check); break;
    case 'o': bad = parse_op(optarg, o); break;
    case 'd': bad = parse_dtype(optarg, o); break;
    case 'r': bad = perf_parse_int(optarg, 0, 1 << 20, &o->root); break;
    case 'a': bad = perf_parse_int(optarg, 0, 3, &o->average); break;
    case 'z': bad = perf_parse_int(optarg, 0, 1, &o->blocking); break;
    case 'J': o->json = optarg; break;
    case O_NP: bad = perf_parse_int(optarg, 1, 256, &o->nprocs); break;
    case O_REGISTERED: bad = perf_parse_int(optarg, 0, 1, &o->registered); break;
    case O_DEVICE: bad = perf_parse_int(optarg, 0, 1023, &o->device); break;
    case O_DURATION: {
      char *end;
      o->duration = strtod(optarg, &end);
      bad = *end || !(o->duration > 0 && o->duration <= 86400);
      break;
    }
    case O_TRACE: o->trace = optarg; break;
    case O_STREAM: o->host_stream = 1; break;
    case O_PRIORITY:
      bad = 1;
      for (int p = 0; p < 3; p++)
        if (!strcmp(optarg, (const char *[]){"normal", "latency", "bulk"}[p])) o->priority = p, bad = 0;
      break;
    case 'h': return 1;
    default: return -1;
    }
    if (bad) {
      fprintf(stderr, "ccs-perf: bad value '%s' for -%c\n", optarg, c < 256 ? c : '-');
      return -1;
    }
  }
  if (optind != argc) {
    fprintf(stderr, "ccs-perf: unexpected argument '%s'\n", argv[optind]);
    return -1;
  }
  if (o->duration > 0) o->max_bytes = o->min_bytes;
  if (o->min_bytes > o->max_bytes) {
    fprintf(stderr, "ccs-perf: -b must not exceed -e\n");
    return -1;
  }
  return 0;
}
