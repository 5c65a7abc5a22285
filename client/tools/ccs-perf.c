/* ccs-perf: the nccl-tests-compatible benchmark for ccs.
 *
 *   ccs-perf COLLECTIVE [-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP]
 *            [-m AGG] [-c CHECK] [-o OP] [-d TYPE] [-r ROOT] [-a AVG] [-z 0|1] [-J FILE]
 *            [--np N] [--registered 0|1] [--device GPU] [--duration S] [--trace FILE]
 *            [--priority latency|normal|bulk]
 *
 * Ranks: --np N forks N local ranks; otherwise the launcher that started
 * the process says who it is (mpirun, srun, torchrun, or CCS_RANK and
 * CCS_NRANKS: ccs_comm_init_from_env), or, with CCS_UNIQUE_ID_FILE, rank 0
 * writes a unique id to that file for the others; with none of them, one
 * rank. Rank 0 prints the table in nccl-tests' layout, with the same size,
 * algbw and busbw rules. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ccs.h"
#include "dtype.h"
#include "perf_args.h"
#include "perf_device.h"
#include "perf_math.h"


/* --- element access through the kernels' conversions --- */
static double get_elem(ccs_dtype_t t, const void *b, size_t i) {
  switch (t) {
  case CCS_INT8: return ((const int8_t *)b)[i];
  case CCS_UINT8: return ((const uint8_t *)b)[i];
  case CCS_INT32: return ((const int32_t *)b)[i];
  case CCS_UINT32: return ((const uint32_t *)b)[i];
  case CCS_INT64: return (double)((const int64_t *)b)[i];
  case CCS_UINT64: return (double)((const uint64_t *)b)[i];
  case CCS_FLOAT16: return ccs__half_to_float(((const uint16_t *)b)[i]);
  case CCS_BFLOAT16: return ccs__bf16_to_float(((const uint16_t *)b)[i]);
  case CCS_FLOAT32: return ((const float *)b)[i];
  case CCS_FLOAT64: return ((const double *)b)[i];
  case CCS_FLOAT8_E4M3: return ccs__e4m3_to_float(((const uint8_t *)b)[i]);
  default: return ccs__e5m2_to_float(((const uint8_t *)b)[i]);
  }
}

static void set_elem(ccs_dtype_t t, void *b, size_t i, double v) {
  switch (t) {
  case CCS_INT8: ((int8_t *)b)[i] = (int8_t)v; break;
  case CCS_UINT8: ((uint8_t *)b)[i] = (uint8_t)v; break;
  case CCS_INT32: ((int32_t *)b)[i] = (int32_t)v; break;
  case CCS_UINT32: ((uint32_t *)b)[i] = (uint32_t)v; break;
  case CCS_INT64: ((int64_t *)b)[i] = (int64_t)v; break;
  case CCS_UINT64: ((uint64_t *)b)[i] = (uint64_t)v; break;
  case CCS_FLOAT16: ((uint16_t *)b)[i] = ccs__float_to_half((float)v); break;
  case CCS_BFLOAT16: ((uint16_t *)b)[i] = ccs__float_to_bf16((float)v); break;
  case CCS_FLOAT32: ((float *)b)[i] = (float)v; break;
  case CCS_FLOAT64: ((double *)b)[i] = v; break;
  case CCS_FLOAT8_E4M3: ((uint8_t *)b)[i] = ccs__float_to_e4m3((float)v); break;
  default: ((uint8_t *)b)[i] = ccs__float_to_e5m2((float)v); break;
  }
}

static int is_unsigned(ccs_dtype_t t) { return t == CCS_UINT8 || t == CCS_UINT32 || t == CCS_UINT64; }

/* Small integers: exact in every type and in every sum of a few ranks. */
static double input(ccs_dtype_t t, ccs_redop_t op, int rank, size_t i, int iter) {
  uint64_t h = (uint64_t)rank * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + (uint64_t)iter;
  h ^= h >> 29;
  if (op == CCS_PROD) return h % 4 == 0 ? 2 : 1;
  return is_unsigned(t) ? (double)(h % 9) : (double)(h % 9) - 4;
}

static double expected_reduce(ccs_dtype_t t, ccs_redop_t op, int n, size_t i, int iter) {
  double acc = input(t, op, 0, i, iter);
  for (int r = 1; r < n; r++) {
    double v = input(t, op, r, i, iter);
    switch (op) {
    case CCS_SUM: case CCS_AVG: acc += v; break;
    case CCS_PROD: acc *= v; break;
    case CCS_MAX: acc = v > acc ? v : acc; break;
    default: acc = v < acc ? v : acc; break;
    }
  }
  if (op == CCS_AVG) acc = t >= CCS_FLOAT16 ? acc / n : trunc(acc / n);
  /* what the type holds: wrap integers, round floats */
  uint64_t cell = 0;
  set_elem(t, &cell, 0, acc);
  return get_elem(t, &cell, 0);
}

struct bench {
  const struct perf_opts *o;
  ccs_comm_t *comm;
  int rank, n;
  char *sendbuf, *recvbuf;
  /* --device: the buffers above are on the GPU, these are their host
   * copies for checking; ops go on `stream` */
  char *host_send, *host_recv;
  size_t bytes;
  void *stream;
  ccs_stream_t host_stream; /* --stream */
};

/* Where the host copy of a buffer address lies (itself for host memory). */
static char *host_view(const struct bench *b, char *p) {
  if (b->o->device < 0) return p;
  if (p >= b->sendbuf && p < b->sendbuf + b->bytes) return b->host_send + (p - b->sendbuf);
  return b->host_recv + (p - b->recvbuf);
}

/* The buffers of one call: out of place, or in place as NCCL lays it out. */
static void layout(const struct bench *b, struct perf_counts k, size_t sz, int in_place,
                   char **send, char **recv) {
  *send = b->sendbuf, *recv = b->recvbuf;
  if (!in_place) return;
  *send = b->recvbuf;
  switch (b->o->coll) {
  case PERF_ALL_GATHER: *send = b->recvbuf + (size_t)b->rank * k.param * sz; break;
  case PERF_GATHER: if (b->rank == b->o->root) *send = b->recvbuf + (size_t)b->rank * k.param * sz; break;
  case PERF_REDUCE_SCATTER: *send = b->recvbuf, *recv = b->recvbuf + (size_t)b->rank * k.param * sz; break;
  case PERF_SCATTER: if (b->rank == b->o->root) *recv = b->recvbuf + (size_t)b->rank * k.param * sz; break;
  default: break;
  }
}

static ccs_result_t call(const struct bench *b, struct perf_counts k, ccs_dtype_t t,
                         ccs_redop_t op, char *send, char *recv) {
  int root = b->o->root, n = b->n, r = b->rank;
  ccs_stream_t s = b->stream ? b->stream : b->host_stream;
  switch (b->o->coll) {
  case PERF_ALL_REDUCE: return ccs_all_reduce(send, recv, k.param, t, op, b->comm, s);
  case PERF_ALL_GATHER: return ccs_all_gather(send, recv, k.param, t, b->comm, s);
  case PERF_REDUCE_SCATTER: return ccs_reduce_scatter(send, recv, k.param, t, op, b->comm, s);
  case PERF_BROADCAST: return ccs_broadcast(send, recv, k.param, t, root, b->comm, s);
  case PERF_REDUCE: return ccs_reduce(send, recv, k.param, t, op, root, b->comm, s);
  case PERF_ALL_TO_ALL: return ccs_all_to_all(send, recv, k.param, t, b->comm, s);
  case PERF_GATHER: return ccs_gather(send, recv, k.param, t, root, b->comm, s);
  case PERF_SCATTER: return ccs_scatter(send, recv, k.param, t, root, b->comm, s);
  default:
    ccs_group_start();
    ccs_send(send, k.param, t, (r + 1) % n, b->comm, s);
    ccs_recv(recv, k.param, t, (r + n - 1) % n, b->comm, s);
    return ccs_group_end();
  }
}

/* Fills the inputs of a checked iteration, runs it, counts wrong elements. */
static long check_once(const struct bench *b, struct perf_counts k, ccs_dtype_t t, ccs_redop_t op,
                       int in_place, int iter, ccs_result_t *rc) {
  size_t sz = ccs_dtype_size(t);
  char *send, *recv;
  int n = b->n, r = b->rank, root = b->o->root;
  layout(b, k, sz, in_place, &send, &recv);
  enum perf_coll c = b->o->coll;
  /* element i of send belongs to rank r's input stream at index i */
  char *hsend = host_view(b, send), *hrecv = host_view(b, recv);
  for (size_t i = 0; i < k.send; i++) set_elem(t, hsend, i, input(t, op, r, i, iter));
  if (b->stream && perf_device_upload(send, hsend, k.send * sz)) {
    *rc = CCS_ERR_CUDA;
    return 0;
  }
  *rc = call(b, k, t, op, send, recv);
  if (*rc != CCS_OK) return 0;
  if (b->stream && (perf_device_sync(b->stream) || perf_device_download(hrecv, recv, k.recv * sz))) {
    *rc = CCS_ERR_CUDA;
    return 0;
  }
  recv = hrecv;
  if ((c == PERF_REDUCE || c == PERF_GATHER) && r != root) return 0;
  long wrong = 0;
  size_t p = k.param;
  for (size_t i = 0; i < k.recv; i++) {
    size_t j = p ? i / p : 0, e = p ? i % p : 0;
    double want;
    switch (c) {
    case PERF_ALL_REDUCE: case PERF_REDUCE: want = expected_reduce(t, op, n, i, iter); break;
    case PERF_REDUCE_SCATTER: want = expected_reduce(t, op, n, (size_t)r * p + i, iter); break;
    case PERF_BROADCAST: want = input(t, op, root, i, iter); break;
    case PERF_ALL_GATHER: case PERF_GATHER: want = input(t, op, (int)j, e, iter); break;
    case PERF_ALL_TO_ALL: want = input(t, op, (int)j, (size_t)r * p + e, iter); break;
    case PERF_SCATTER: want = input(t, op, root, (size_t)r * p + i, iter); break;
    default: want = input(t, op, (r + n - 1) % n, i, iter); break;
    }
    double got = get_elem(t, recv, i);
    double tol = op == CCS_AVG && t >= CCS_FLOAT16 ? fabs(want) * 0.13 : 0; /* one fp8 step */
    if (!(fabs(got - want) <= tol)) wrong++;
  }
  return wrong;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct result {
  double us, algbw, busbw;
  long wrong; /* -1: not checked */
  int skipped;
};

static int combine(const struct bench *b, double *t, long *wrong) {
  double in[2] = {*t, 0}, out[2];
  ccs_redop_t op = b->o->average == 2 ? CCS_MIN : b->o->average == 3 ? CCS_MAX : CCS_SUM;
  int64_t w = *wrong, wsum;
  if (b->o->average == 0) {
    if (ccs_broadcast(in, out, 1, CCS_FLOAT64, 0, b->comm, NULL) != CCS_OK) return -1;
  } else if (ccs_all_reduce(in, out, 1, CCS_FLOAT64, op, b->comm, NULL) != CCS_OK) {
    return -1;
  }
  *t = b->o->average == 1 ? out[0] / b->n : out[0];
  if (ccs_all_reduce(&w, &wsum, 1, CCS_INT64, CCS_SUM, b->comm, NULL) != CCS_OK) return -1;
  *wrong = (long)wsum;
  return 0;
}

static int measure(const struct bench *b, struct perf_counts k, ccs_dtype_t t, ccs_redop_t op,
                   int in_place, struct result *res) {
  const struct perf_opts *o = b->o;
  size_t sz = ccs_dtype_size(t);
  char *send, *recv;
  memset(res, 0, sizeof(*res));
  if (in_place && o->coll == PERF_SENDRECV) { /* the same buffer both ways races: N/A */
    res->skipped = 1;
    return 0;
  }
  layout(b, k, sz, in_place, &send, &recv);
  ccs_result_t rc = CCS_OK;
  for (int i = 0; i < o->warmup && rc == CCS_OK; i++) rc = call(b, k, t, op, send, recv);
  if (rc == CCS_OK && b->stream && perf_device_sync(b->stream)) rc = CCS_ERR_CUDA;
  if (rc == CCS_OK) rc = ccs_barrier(b->comm);
  double t0 = now();
  for (int i = 0; i < o->iters && rc == CCS_OK; i++) {
    if (o->agg > 1) ccs_group_start();
    for (int m = 0; m < o->agg && rc == CCS_OK; m++) rc = call(b, k, t, op, send, recv);
    if (o->agg > 1 && rc == CCS_OK) rc = ccs_group_end();
    else if (o->agg > 1) ccs_group_end();
  }
  if (rc == CCS_OK && b->stream && perf_device_sync(b->stream)) rc = CCS_ERR_CUDA;
  double secs = (now() - t0) / ((double)o->iters * o->agg);
  long wrong = 0;
  for (int i = 0; i < o->check && rc == CCS_OK; i++) wrong += check_once(b, k, t, op, in_place, i, &rc);
  if (rc != CCS_OK) {
    fprintf(stderr, "ccs-perf: rank %d: %s %s: %s: %s\n", b->rank, perf_coll_names[o->coll],
            ccs_dtype_name(t), ccs_result_name(rc), ccs_comm_last_error(b->comm));
    return -1;
  }
  if (combine(b, &secs, &wrong)) return -1;
  res->us = secs * 1e6;
  res->algbw = perf_algbw(o->coll, k, sz, secs);
  res->busbw = res->algbw * perf_bus_factor(o->coll, b->n);
  res->wrong = o->check ? wrong : -1;
  return 0;
}

/* --duration: calls back to back until rank 0's clock says the time is
 * up; it says so after every `every` calls (a broadcast), so all ranks
 * make the same calls. --trace: rank 0 keeps each call's end, latency and
 * how many calls the line stands for (a synchronised batch with --stream),
 * written out once the run is over. */
/* One line of the trace (rank 0, --trace): a call's or a batch's end. */
static void keep(const struct bench *b, double **trace, size_t *n, size_t *cap, double end,
                 double latency, int64_t calls) {
  if (b->rank != 0 || !b->o->trace) return;
  if (*n == *cap) {
    size_t grown_cap = *cap ? 2 * *cap : 4096;
    double *grown = realloc(*trace, sizeof(**trace) * 3 * grown_cap);
    if (!grown) return;
    *trace = grown;
    *cap = grown_cap;
  }
  (*trace)[3 * *n] = end;
  (*trace)[3 * *n + 1] = latency;
  (*trace)[3 * (*n)++ + 2] = (double)calls;
}

static int run_for(struct bench *b, struct perf_counts k, ccs_dtype_t t, ccs_redop_t op,
                   struct result *res) {
  const struct perf_opts *o = b->o;
  char *send, *recv;
  memset(res, 0, sizeof(*res));
  layout(b, k, ccs_dtype_size(t), 0, &send, &recv);
  ccs_result_t rc = CCS_OK;
  for (int i = 0; i < o->warmup && rc == CCS_OK; i++) rc = call(b, k, t, op, send, recv);
  double c0 = now();
  for (int i = 0; i < 3 && rc == CCS_OK; i++) rc = call(b, k, t, op, send, recv);
  int64_t every = (int64_t)(0.02 / ((now() - c0) / 3 + 1e-9)), agreed = 1; /* a check per 20 ms */
  every = every < 1 ? 1 : every > 4096 ? 4096 : every;
  if (rc == CCS_OK) rc = ccs_broadcast(&every, &agreed, 1, CCS_INT64, 0, b->comm, NULL);
  double *trace = NULL;
  size_t ntrace = 0, cap = 0;
  long calls = 0;
  if (o->host_stream && o->device < 0 && (rc = ccs_stream_create(&b->host_stream)) != CCS_OK)
    fprintf(stderr, "ccs-perf: a host stream: %s\n", ccs_comm_last_error(NULL));
  double t0 = now(), end = t0 + o->duration;
  for (int64_t stop = 0; !stop && rc == CCS_OK;) {
    double batch = now();
    for (int64_t i = 0; i < agreed && rc == CCS_OK; i++) {
      double s = now();
      rc = call(b, k, t, op, send, recv);
      double e = now();
      calls++;
      if (!b->host_stream) keep(b, &trace, &ntrace, &cap, e, e - s, 1);
    }
    if (b->host_stream && rc == CCS_OK) {
      rc = ccs_stream_synchronize(b->host_stream);
      double e = now();
      keep(b, &trace, &ntrace, &cap, e, e - batch, agreed);
    }
    int64_t mine = now() >= end;
    if (rc == CCS_OK) rc = ccs_broadcast(&mine, &stop, 1, CCS_INT64, 0, b->comm, NULL);
  }
  double secs = (now() - t0) / (double)(calls ? calls : 1);
  if (b->host_stream) {
    ccs_stream_destroy(b->host_stream);
    b->host_stream = NULL;
  }
  if (rc != CCS_OK) {
    fprintf(stderr, "ccs-perf: rank %d: %s: %s: %s\n", b->rank, perf_coll_names[o->coll],
            ccs_result_name(rc), ccs_comm_last_error(b->comm));
    free(trace);
    return -1;
  }
  if (trace) {
    FILE *f = fopen(o->trace, "w");
    for (size_t i = 0; f && i < ntrace; i++)
      fprintf(f, "%.6f %.9f %.0f\n", trace[3 * i], trace[3 * i + 1], trace[3 * i + 2]);
    if (!f || fclose(f)) fprintf(stderr, "ccs-perf: cannot write %s: %s\n", o->trace, strerror(errno));
    free(trace);
  }
  long wrong = 0;
  if (combine(b, &secs, &wrong)) return -1;
  res->us = secs * 1e6;
  res->algbw = perf_algbw(o->coll, k, ccs_dtype_size(t), secs);
  res->busbw = res->algbw * perf_bus_factor(o->coll, b->n);
  res->wrong = -1;
  return 0;
}

static void format_time(char *buf, size_t len, double us) {
  snprintf(buf, len, us >= 10000 ? "%7.0f" : us >= 100 ? "%7.1f" : "%7.2f", us);
}

static void print_result(const struct result *r) {
  char ts[32], ws[32];
  if (r->skipped) {
    printf("  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
    return;
  }
  format_time(ts, sizeof(ts), r->us);
  if (r->wrong < 0) snprintf(ws, sizeof(ws), "N/A");
  else snprintf(ws, sizeof(ws), "%ld", r->wrong);
  printf("  %7s  %6.2f  %6.2f  %6s", ts, r->algbw, r->busbw, ws);
}

static void json_result(FILE *j, const char *name, const struct result *r) {
  if (r->skipped) fprintf(j, "\"%s\": null", name);
  else
    fprintf(j, "\"%s\": {\"time_us\": %.3f, \"algbw\": %.6f, \"busbw\": %.6f, \"wrong\": %ld}",
            name, r->us, r->algbw, r->busbw, r->wrong);
}

static int has_op(enum perf_coll c) {
  return c == PERF_ALL_REDUCE || c == PERF_REDUCE_SCATTER || c == PERF_REDUCE;
}
static int has_root(enum perf_coll c) {
  return c == PERF_BROADCAST || c == PERF_REDUCE || c == PERF_GATHER || c == PERF_SCATTER;
}

/* One rank: of the comm of id, or (id NULL, comm given) of that comm. */
static int run_rank(const struct perf_opts *o, const ccs_unique_id_t *id, ccs_comm_t *comm,
                    int rank, int n) {
  struct bench b = {o, comm, rank, n, NULL, NULL, NULL, NULL, 0, NULL, NULL};
  char err[256];
  if (o->device >= 0 && perf_device_open(o->device, &b.stream, err, sizeof(err))) {
    fprintf(stderr, "ccs-perf: rank %d: %s\n", rank, err);
    return 1;
  }
  ccs_result_t rc = id ? ccs_comm_init_rank(&b.comm, n, *id, rank) : CCS_OK;
  if (rc != CCS_OK) {
    fprintf(stderr, "ccs-perf: rank %d: init: %s: %s\n", rank, ccs_result_name(rc),
            ccs_comm_last_error(NULL));
    return 1;
  }
  if (o->root >= n) {
    if (rank == 0) fprintf(stderr, "ccs-perf: root %d out of range for %d ranks\n", o->root, n);
    ccs_comm_destroy(b.comm);
    return 2;
  }
  /* buffers for the largest size of the widest type */
  struct perf_counts big = perf_counts(o->coll, o->max_bytes, 1, n);
  size_t bytes = big.send > big.recv ? big.send : big.recv;
  bytes = bytes + 64;
  b.bytes = bytes;
  if (o->device >= 0) {
    b.sendbuf = perf_device_alloc(bytes, o->registered, o->device);
    b.recvbuf = perf_device_alloc(bytes, o->registered, o->device);
    b.host_send = calloc(1, bytes);
    b.host_recv = calloc(1, bytes);
    if (!b.sendbuf || !b.recvbuf || !b.host_send || !b.host_recv ||
        perf_device_upload(b.sendbuf, b.host_send, bytes) ||
        perf_device_upload(b.recvbuf, b.host_recv, bytes)) {
      fprintf(stderr, "ccs-perf: rank %d: %zu bytes on GPU %d: %s\n", rank, bytes, o->device,
              ccs_comm_last_error(NULL));
      return 1;
    }
  } else if (o->registered) {
    if (ccs_mem_alloc((void **)&b.sendbuf, bytes) || ccs_mem_alloc((void **)&b.recvbuf, bytes)) {
      fprintf(stderr, "ccs-perf: ccs_mem_alloc(%zu): %s\n", bytes, ccs_comm_last_error(NULL));
      return 1;
    }
  } else {
    b.sendbuf = malloc(bytes);
    b.recvbuf = malloc(bytes);
    if (!b.sendbuf || !b.recvbuf) return 1;
  }
  if (o->device < 0) {
    memset(b.sendbuf, 0, bytes);
    memset(b.recvbuf, 0, bytes);
  }
  FILE *json = NULL;
  if (rank == 0) {
    if (o->device >= 0)
      printf("# ccs-perf %s: %d ranks, buffers on GPU %d, %s; its copy bandwidth: %.1f GB/s\n",
             perf_coll_names[o->coll], n, o->device,
             o->registered ? "registered (ccs_mem_alloc_device)" : "cudaMalloc (staged)",
             perf_device_copy_gbps(bytes));
    else
      printf("# ccs-perf %s: %d ranks, %s buffers\n", perf_coll_names[o->coll], n,
             o->registered ? "registered (ccs_mem_alloc)" : "unregistered (staged)");
    printf("# nThread 1 nGpus 0 minBytes %zu maxBytes %zu step: %g(%s) warmup iters: %d iters: %d "
           "agg iters: %d validation: %d graph: 0\n#\n", o->min_bytes, o->max_bytes,
           o->step_bytes ? (double)o->step_bytes : o->factor, o->step_bytes ? "bytes" : "factor",
           o->warmup, o->iters, o->agg, o->check ? 1 : 0);
    printf("# %64s out-of-place %24s in-place\n", "", "");
    printf("#  %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size",
           "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
           "busbw", "#wrong");
    printf("#  %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    if (o->json && !(json = fopen(o->json, "w")))
      fprintf(stderr, "ccs-perf: cannot write %s: %s\n", o->json, strerror(errno));
    if (json) fprintf(json, "[\n");
  }
  long total_wrong = 0;
  double bw_sum = 0;
  int bw_count = 0, failed = 0, first_row = 1;
  for (int d = 0; d < o->ndtypes && !failed; d++)
    for (int p = 0; p < (has_op(o->coll) ? o->nops : 1) && !failed; p++) {
      ccs_dtype_t t = (ccs_dtype_t)o->dtypes[d];
      ccs_redop_t op = has_op(o->coll) ? (ccs_redop_t)o->ops[p] : CCS_SUM;
      size_t sz = ccs_dtype_size(t);
      for (size_t size = o->min_bytes; size <= o->max_bytes && !failed;) {
        struct perf_counts k = perf_counts(o->coll, size, sz, n);
        struct result res[2] = {{0}, {.skipped = 1}};
        if (o->duration > 0 ? run_for(&b, k, t, op, &res[0])
                            : measure(&b, k, t, op, 0, &res[0]) || measure(&b, k, t, op, 1, &res[1])) {
          failed = 1;
          break;
        }
        if (rank == 0) {
          printf("%12zu  %12zu  %8s  %6s  %6d", k.bytes, k.bytes / sz, ccs_dtype_name(t),
                 has_op(o->coll) ? ccs_redop_name(op) : "none", has_root(o->coll) ? o->root : -1);
          print_result(&res[0]);
          print_result(&res[1]);
          printf("\n");
          fflush(stdout);
          if (json) {
            fprintf(json, "%s  {\"collective\": \"%s\", \"ranks\": %d, \"size\": %zu, \"count\": %zu, "
                    "\"type\": \"%s\", \"redop\": \"%s\", \"root\": %d, ", first_row ? "" : ",\n",
                    perf_coll_names[o->coll], n, k.bytes, k.bytes / sz, ccs_dtype_name(t),
                    has_op(o->coll) ? ccs_redop_name(op) : "none", has_root(o->coll) ? o->root : -1);
            json_result(json, "out_of_place", &res[0]);
            fprintf(json, ", ");
            json_result(json, "in_place", &res[1]);
            fprintf(json, "}");
          }
          first_row = 0;
        }
        for (int i = 0; i < 2; i++) {
          if (res[i].skipped) continue;
          if (res[i].wrong > 0) total_wrong += res[i].wrong;
          bw_sum += res[i].busbw;
          bw_count++;
        }
        if (o->duration > 0) break; /* one size */
        size_t next = o->step_bytes ? size + o->step_bytes : (size_t)((double)size * o->factor);
        if (next <= size) next = size + 1;
        size = next;
      }
    }
  if (rank == 0) {
    printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n#\n", bw_count ? bw_sum / bw_count : 0.0);
    fflush(stdout);
    if (json) {
      fprintf(json, "\n]\n");
      fclose(json);
    }
  }
  if (o->device >= 0) {
    perf_device_free(b.sendbuf, o->registered);
    perf_device_free(b.recvbuf, o->registered);
    free(b.host_send);
    free(b.host_recv);
  } else if (o->registered) {
    ccs_mem_free(b.sendbuf);
    ccs_mem_free(b.recvbuf);
  } else {
    free(b.sendbuf);
    free(b.recvbuf);
  }
  ccs_comm_destroy(b.comm);
  return failed ? 1 : total_wrong ? 3 : 0;
}

static int id_from_file(const char *path, int rank, ccs_unique_id_t *id) {
  if (rank == 0) {
    ccs_result_t rc = ccs_get_unique_id(id);
    if (rc != CCS_OK) {
      fprintf(stderr, "ccs-perf: %s: %s\n", ccs_result_name(rc), ccs_comm_last_error(NULL));
      return -1;
    }
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof(*id), 1, f) != 1 || fclose(f) || rename(tmp, path)) {
      fprintf(stderr, "ccs-perf: cannot write the unique id to %s: %s\n", path, strerror(errno));
      return -1;
    }
    return 0;
  }
  for (int tries = 0; tries < 6000; tries++) { /* 60 s */
    FILE *f = fopen(path, "rb");
    if (f) {
      size_t got = fread(id, sizeof(*id), 1, f);
      fclose(f);
      if (got == 1) return 0;
    }
    usleep(10000);
  }
  fprintf(stderr, "ccs-perf: rank %d: no unique id appeared in %s\n", rank, path);
  return -1;
}

int main(int argc, char **argv) {
  struct perf_opts o;
  int rc = perf_parse_args(argc, argv, &o);
  if (rc) {
    perf_usage(rc > 0 ? stdout : stderr);
    return rc > 0 ? 0 : 2;
  }
  static const char *const priorities[] = {"normal", "latency", "bulk"};
  if (o.priority != CCS_PRIORITY_DEFAULT) setenv("CCS_PRIORITY", priorities[o.priority], 1);
  ccs_unique_id_t id;
  if (o.nprocs == 0) {
    const char *r = getenv("CCS_RANK"), *n = getenv("CCS_NRANKS"), *f = getenv("CCS_UNIQUE_ID_FILE");
    int rank = 0, nranks = 1;
    if (r && n && f) {
      if (perf_parse_int(r, 0, 1 << 20, &rank) || perf_parse_int(n, 1, 1 << 20, &nranks) || rank >= nranks) {
        fprintf(stderr, "ccs-perf: bad CCS_RANK/CCS_NRANKS\n");
        return 2;
      }
      if (id_from_file(f, rank, &id)) return 1;
      return run_rank(&o, &id, NULL, rank, nranks);
    }
    /* started by a launcher (mpirun, srun, torchrun): the comm by the job's name */
    ccs_comm_t *comm;
    ccs_result_t got = ccs_comm_init_from_env(&comm);
    if (got == CCS_OK) {
      ccs_comm_user_rank(comm, &rank);
      ccs_comm_count(comm, &nranks);
      return run_rank(&o, NULL, comm, rank, nranks);
    }
    if (got != CCS_ERR_INVALID_USAGE) {
      fprintf(stderr, "ccs-perf: %s: %s\n", ccs_result_name(got), ccs_comm_last_error(NULL));
      return 1;
    }
    o.nprocs = 1; /* no launcher: one rank */
  }
  ccs_result_t got = ccs_get_unique_id(&id);
  if (got != CCS_OK) {
    fprintf(stderr, "ccs-perf: %s: %s\n", ccs_result_name(got), ccs_comm_last_error(NULL));
    return 1;
  }
  fflush(stdout);
  pid_t pids[256];
  for (int r = 0; r < o.nprocs; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(run_rank(&o, &id, NULL, r, o.nprocs));
  }
  int worst = 0;
  for (int r = 0; r < o.nprocs; r++) {
    int status;
    if (pids[r] < 0 || waitpid(pids[r], &status, 0) != pids[r]) worst = worst ? worst : 1;
    else if (!WIFEXITED(status)) worst = 1;
    else if (WEXITSTATUS(status) > worst) worst = WEXITSTATUS(status);
  }
  return worst;
}
