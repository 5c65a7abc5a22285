/* Every collective x dtype x op x size, in and out of place, registered and
 * staged buffers, through a real daemon and real rank processes, checked
 * bit for bit, element by element, against values each rank recomputes
 * from the seed and the exact reference (reference.c).
 * Usage: test_collectives NRANKS
 * CCS_TEST_MEMORY=device: the same on GPU 0 (builds with CUDA), buffers
 * from ccs_mem_alloc_device ("registered") and cudaMalloc ("staged"), ops
 * on a stream (every other one on the NULL stream), results copied back to
 * be checked on the host. CCS_TEST_MEMORY=device-legacy: the cudaMalloc
 * buffers are ccs_mem_register'ed (the daemon needs cuda_legacy_ipc).
 * Built as test_collectives_standin (CCS_TEST_STANDIN), the program runs
 * against the CUDA stand-in (tests/cuda_standin) with libccs compiled in:
 * "device" buffers are the stand-in's (host memory that libccs takes for a
 * GPU's), all of them from cudaMalloc (the stand-in has no VMM), on a
 * machine without a GPU; across daemons libccs stages them through host
 * memory, which is what this build checks. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#ifdef CCS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef CCS_TEST_STANDIN
#include <dlfcn.h>

#include "cuda_standin.h"
#endif

#include "algo_table.h"
#include "harness.h"
#include "raw.h"
#include "reference.h"
#include "serving.h"

enum coll { ALL_REDUCE, BROADCAST, REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, GATHER,
            SCATTER, NCOLLS };
static const char *const coll_names[] = {"all_reduce", "broadcast", "reduce", "all_gather",
                                         "reduce_scatter", "all_to_all", "gather", "scatter"};
static int has_redop(enum coll c) { return c == ALL_REDUCE || c == REDUCE || c == REDUCE_SCATTER; }

struct shared {
  ccs_unique_id_t id;
  uint64_t seed;
  int barrier_count; /* atomically incremented by ranks around barriers */
  uint64_t calls[NCOLLS]; /* the daemon ops of rank 0's calls of each collective */
  uint64_t checked[64];   /* each rank's cases checked so far (run_matrix) */
};
static struct shared *sh;
static int nranks_arg, hops_round; /* ranks on several daemons: partial results rounded */

/* What an element is drawn for: an input of this reduction, or data that
 * is only copied (any bits). */
#define COPIED CCS_REDOP_COUNT

/* A value of the type on a grid, as bits: a significand of `bits` bits
 * (the narrow types' own) and an exponent in [q0, q0 + span), random
 * sign. Sums of up to 64 of them are exact in the accumulator (float: 24
 * bits; double: 53), whatever the order, so the only rounding is the one
 * when a narrow result is stored: a type rounded more than once shows.
 * The narrow types' are codes made directly (biased exponent q0..), the
 * others' values. */
static uint64_t grid_value(ccs_dtype_t t, uint64_t h) {
  static const struct {
    int bits, q0, span; /* q0: the biased exponent for the narrow types */
  } grid[CCS_DTYPE_COUNT] = {[CCS_FLOAT16] = {10, 10, 6}, [CCS_BFLOAT16] = {7, 120, 8},
                             [CCS_FLOAT8_E4M3] = {3, 3, 7}, [CCS_FLOAT8_E5M2] = {2, 8, 9},
                             [CCS_FLOAT32] = {16, -8, 2},   [CCS_FLOAT64] = {40, -20, 6}};
  uint64_t m = h % ((uint64_t)1 << grid[t].bits), q = grid[t].q0 + (h >> 48) % (uint64_t)grid[t].span;
  int negative = (int)(h >> 40 & 1);
  if (t == CCS_FLOAT32 || t == CCS_FLOAT64) {
    double v = ldexp(negative ? -(double)m : (double)m, (int)(int64_t)q);
    uint64_t bits = 0;
    if (t == CCS_FLOAT64) memcpy(&bits, &v, 8);
    else {
      float f = (float)v; /* exact: 16 bits */
      memcpy(&bits, &f, 4);
    }
    return bits;
  }
  int nbits = (int)ccs_dtype_size(t) * 8;
  return (uint64_t)negative << (nbits - 1) | q << grid[t].bits | m;
}

/* Rank r's element e of op op_id, as bits. Integers range over all their
 * bits (sums and products wrap; the high bit of unsigned max and min;
 * 64-bit values past 2^53), and so does data that is only copied (NaNs
 * included: copies are exact). Float max and min take any value but NaN
 * and -0 (whose order against +0 and NaN depends on the order of
 * reduction), sums and averages values on a grid (grid_value), products
 * small integers; across daemons, where partial results are stored in the
 * type at every hop, the narrow types sum -1, 0 and 1. */
static uint64_t input(ccs_dtype_t t, int op, uint64_t op_id, int rank, size_t e) {
  static uint64_t key_of = UINT64_MAX, key;
  if (op_id != key_of) key = test_mix(sh->seed, op_id), key_of = op_id;
  uint64_t h = test_mix(key, ((uint64_t)rank << 32) + e);
  if (op == COPIED || !ref_is_float(t)) return ref_random_bits(t, h);
  if (op == CCS_MAX || op == CCS_MIN) {
    uint64_t b = ref_random_bits(t, h);
    for (uint64_t k = 1; ref_bits_nan(t, b); k++) b = ref_random_bits(t, test_mix(h, k));
    return ref_get(t, &b, 0) == 0 ? 0 : b;
  }
  if (op == CCS_PROD || (hops_round && ccs_dtype_size(t) < 4))
    return ref_stored_bits(t, hops_round ? ref_hop_exact_value(t, op, h) : ref_exact_value(t, op, h));
  return grid_value(t, h);
}

/* Every rank's inputs of the op in flight, as it drew them (the type's
 * bits), in memory the ranks share: each rank draws only its own, and
 * reads the others' here, so the reference costs each rank its share
 * rather than every rank's. Two tables, by op parity: a rank writes op
 * k's row once every rank checked op k-2 (sh->checked; across daemons a
 * root can finish calls before the others made them). A call's completion
 * orders the others' writes before its reads: each rank wrote before it
 * called. */
#define ROW_BYTES (((size_t)2 << 20) + 4096) /* the largest send buffer (large_count) */
static char *inputs_table;
static char *row(uint64_t op_id, int rank) {
  return inputs_table + ((size_t)(op_id & 1) * (size_t)nranks_arg + (size_t)rank) * ROW_BYTES;
}
/* Rank r's element e of op op_id, as that rank drew it. */
static uint64_t drawn(ccs_dtype_t t, uint64_t op_id, int r, size_t e) {
  return ref_get_bits(t, row(op_id, r), e);
}

/* Element e of the reduction over every rank: what it must be, bit for
 * bit (reference.c: reduced exactly, stored once). One rank's op copies
 * its input as it is (an e5m2 infinity stays one: no conversion runs). */
static uint64_t reduced(ccs_dtype_t t, ccs_redop_t op, uint64_t op_id, int n, size_t e) {
  if (n == 1) return drawn(t, op_id, 0, e);
  uint64_t v[REF_MAX_RANKS];
  for (int r = 0; r < n; r++) v[r] = drawn(t, op_id, r, e);
  return ref_reduce_bits(t, op, op == CCS_AVG ? (size_t)n : 0, v, n);
}

static int check_elem(ccs_dtype_t t, const void *buf, size_t k, uint64_t want, const char *what,
                      int *reported) {
  uint64_t got = ref_get_bits(t, buf, k);
  if (ref_same_bits(t, got, want)) return 0;
  if ((*reported)++ < 5)
    fprintf(stderr, "  %s[%zu]: got 0x%llx (%.9g) want 0x%llx (%.9g)\n", what, k, (unsigned long long)got,
            ref_get(t, &got, 0), (unsigned long long)want, ref_get(t, &want, 0));
  return 1;
}

static int on_device; /* CCS_TEST_MEMORY=device */
static int legacy_ipc; /* CCS_TEST_MEMORY=device-legacy */
static void *stream;   /* this rank's cudaStream_t */

/* A test buffer: `host` is where values are written and checked; `ptr` is
 * what the ccs calls get (the same, or its device copy). */
struct mem {
  char *host, *ptr;
  size_t bytes;
  int registered;
};

static int mem_alloc(struct mem *m, size_t bytes, int registered) {
  m->bytes = bytes ? bytes : 64;
  m->registered = registered;
  m->host = m->ptr = NULL;
  if (!on_device) {
    if (registered) ccs_mem_alloc((void **)&m->host, m->bytes);
    else m->host = malloc(m->bytes);
    m->ptr = m->host;
    return m->host ? 0 : -1;
  }
#ifdef CCS_HAVE_CUDA
  m->host = malloc(m->bytes);
#ifdef CCS_TEST_STANDIN
  m->registered = registered = 0;
#endif
  if (registered) ccs_mem_alloc_device((void **)&m->ptr, m->bytes, 0);
  else if (cudaMalloc((void **)&m->ptr, m->bytes) != cudaSuccess) m->ptr = NULL;
  if (!registered && legacy_ipc && m->ptr && ccs_mem_register(m->ptr, m->bytes) != CCS_OK) {
    fprintf(stderr, "ccs_mem_register of a cudaMalloc buffer failed\n");
    return -1;
  }
#endif
  return m->host && m->ptr ? 0 : -1;
}

static void mem_free(struct mem *m) {
  if (on_device) {
#ifdef CCS_HAVE_CUDA
    if (m->registered) ccs_mem_free(m->ptr);
    else if (legacy_ipc && ccs_mem_deregister(m->ptr) != CCS_OK) abort();
    if (!m->registered) cudaFree(m->ptr);
#endif
    free(m->host);
  } else if (m->registered) {
    ccs_mem_free(m->host);
  } else {
    free(m->host);
  }
}

/* host -> what ccs sees, and back (device memory only). A cudaMemcpy from
 * pageable memory returns before its DMA lands, and the calls run on a
 * non-blocking stream (or in the daemon), which does not wait for the
 * legacy stream: the copy is waited for, as a job must. */
static void mem_push(struct mem *m) {
#ifdef CCS_HAVE_CUDA
  if (on_device) {
    cudaMemcpy(m->ptr, m->host, m->bytes, cudaMemcpyHostToDevice);
    cudaStreamSynchronize(0);
  }
#endif
}
static void mem_pull(struct mem *m) {
#ifdef CCS_HAVE_CUDA
  if (on_device) cudaMemcpy(m->host, m->ptr, m->bytes, cudaMemcpyDeviceToHost);
#endif
}

/* The stream an op goes on: every other device op uses the NULL stream,
 * which makes the call wait for the result. */
static ccs_stream_t stream_for(uint64_t op_id) { return on_device && op_id % 2 ? stream : NULL; }

/* After the call: the stream's work is done before the host looks. */
static void settle(ccs_stream_t s) {
#ifdef CCS_HAVE_CUDA
  if (s) cudaStreamSynchronize((cudaStream_t)s);
#endif
}

/* The ops the daemons run for one call: libccs cuts a large call on
 * unregistered host memory of a comm on one daemon into parts of
 * CCS_STAGED_PART_BYTES (default 1 MiB; per rank's block where the call
 * has one per rank), from two parts on, when the rings are there
 * (parts.c). */
static uint64_t daemon_ops(enum coll c, ccs_dtype_t t, size_t count, int registered, int n) {
  const char *ring = getenv("CCS_RING");
  if (registered || on_device || hops_round || (ring && !strcmp(ring, "0"))) return 1;
  const char *v = getenv("CCS_STAGED_PART_BYTES");
  size_t blocks = c == ALL_REDUCE || c == BROADCAST || c == REDUCE ? 1 : (size_t)n;
  size_t pn = (v && *v ? (size_t)strtoull(v, NULL, 10) : (size_t)1 << 20) / ccs_dtype_size(t) / blocks;
  return pn && count >= 2 * pn ? (count + pn - 1) / pn : 1;
}

/* One call of collective c; returns the number of wrong elements. */
static int run_case(ccs_comm_t *comm, int rank, int n, enum coll c, ccs_dtype_t t,
                    ccs_redop_t op, size_t count, int in_place, int registered, uint64_t op_id) {
  size_t sz = ccs_dtype_size(t), nc = (size_t)n * count;
  int root = (int)(op_id % (uint64_t)n), is_root = rank == root;
  size_t send_elems = 0, recv_elems = 0;
  switch (c) {
  case ALL_REDUCE: case BROADCAST: case REDUCE: send_elems = recv_elems = count; break;
  case ALL_GATHER: case GATHER: send_elems = count, recv_elems = nc; break;
  case REDUCE_SCATTER: case SCATTER: send_elems = nc, recv_elems = count; break;
  case ALL_TO_ALL: send_elems = recv_elems = nc; break;
  default: break;
  }
  size_t buf_elems = in_place ? (send_elems > recv_elems ? send_elems : recv_elems) : recv_elems;
  struct mem bm, sm = {0};
  if (mem_alloc(&bm, buf_elems * sz, registered) ||
      (!in_place && mem_alloc(&sm, send_elems * sz, registered))) {
    fprintf(stderr, "rank %d: allocation failed\n", rank);
    return 1;
  }
  size_t send_at = 0, recv_at = 0; /* where send and recv lie in their buffers */
  if (in_place) {
    if (c == ALL_GATHER) send_at = (size_t)rank * count * sz;
    if (c == REDUCE_SCATTER) recv_at = (size_t)rank * count * sz;
    if (c == GATHER && is_root) send_at = (size_t)root * count * sz;
    if (c == SCATTER && is_root) recv_at = (size_t)root * count * sz;
  }
  struct mem *sbuf = in_place ? &bm : &sm;
  memset(bm.host, 0x5a, bm.bytes); /* sentinel where nothing may be written */
  int vop = has_redop(c) ? (int)op : COPIED;
  if (send_elems * sz > ROW_BYTES) {
    fprintf(stderr, "rank %d: %zu input bytes: past the table's row\n", rank, send_elems * sz);
    return 1;
  }
  for (size_t e = 0; e < send_elems; e++)
    ref_set_bits(t, sbuf->host + send_at, e, input(t, vop, op_id, rank, e));
  for (int r = 0; r < n && op_id >= 2; r++)
    while (__atomic_load_n(&sh->checked[r], __ATOMIC_ACQUIRE) < op_id - 1) usleep(100);
  memcpy(row(op_id, rank), sbuf->host + send_at, send_elems * sz);
  mem_push(&bm);
  if (!in_place) mem_push(&sm);
  char *send = sbuf->ptr + send_at, *recv = bm.ptr + recv_at;
  ccs_stream_t st = stream_for(op_id);

  ccs_result_t rc;
  if (rank == 0) sh->calls[c] += daemon_ops(c, t, count, registered, n);
  switch (c) {
  case ALL_REDUCE: rc = ccs_all_reduce(send, recv, count, t, op, comm, st); break;
  case BROADCAST: rc = ccs_broadcast(send, recv, count, t, root, comm, st); break;
  case REDUCE: rc = ccs_reduce(send, recv, count, t, op, root, comm, st); break;
  case ALL_GATHER: rc = ccs_all_gather(send, recv, count, t, comm, st); break;
  case REDUCE_SCATTER: rc = ccs_reduce_scatter(send, recv, count, t, op, comm, st); break;
  case ALL_TO_ALL: rc = ccs_all_to_all(send, recv, count, t, comm, st); break;
  case GATHER: rc = ccs_gather(send, recv, count, t, root, comm, st); break;
  case SCATTER: rc = ccs_scatter(send, recv, count, t, root, comm, st); break;
  default: rc = CCS_ERR_INVALID_ARGUMENT; break;
  }
  settle(st);
  mem_pull(&bm);
  if (!in_place) mem_pull(&sm);
  send = sbuf->host + send_at; /* checked on the host from here on */
  recv = bm.host + recv_at;
  int wrong = 0, reported = 0;
  char what[160];
  snprintf(what, sizeof(what), "rank %d/%d %s %s %s count=%zu %s %s root=%d", rank, n,
           coll_names[c], ccs_dtype_name(t), has_redop(c) ? ccs_redop_name(op) : "-", count,
           in_place ? "in-place" : "out-of-place", registered ? "registered" : "staged", root);
  if (on_device) strncat(what, st ? " device stream" : " device NULL-stream", sizeof(what) - strlen(what) - 1);
  if (rc != CCS_OK) {
    fprintf(stderr, "%s: %s: %s\n", what, ccs_result_name(rc), ccs_comm_last_error(comm));
    wrong = 1;
    goto out;
  }
  int recv_used = !((c == REDUCE || c == GATHER) && !is_root);
  if (recv_used) {
    for (size_t k = 0; k < recv_elems; k++) {
      size_t j = k / (count ? count : 1), e = k % (count ? count : 1);
      uint64_t want;
      switch (c) {
      case ALL_REDUCE: case REDUCE: want = reduced(t, op, op_id, n, k); break;
      case BROADCAST: want = drawn(t, op_id, root, k); break;
      case ALL_GATHER: case GATHER: want = drawn(t, op_id, (int)j, e); break;
      case REDUCE_SCATTER: want = reduced(t, op, op_id, n, (size_t)rank * count + k); break;
      case ALL_TO_ALL: want = drawn(t, op_id, (int)j, (size_t)rank * count + e); break;
      case SCATTER: want = drawn(t, op_id, root, (size_t)rank * count + k); break;
      default: want = 0; break;
      }
      wrong += check_elem(t, recv, k, want, what, &reported);
    }
  } else if (!in_place) {
    for (size_t k = 0; k < recv_elems * sz; k++)
      if ((unsigned char)recv[k] != 0x5a) {
        if (reported++ < 5) fprintf(stderr, "  %s: unused receive buffer written at byte %zu\n", what, k);
        wrong++;
        break;
      }
  }
  if (!in_place) /* the send buffer is read, never written */
    for (size_t e = 0; e < send_elems; e++)
      wrong += check_elem(t, send, e, drawn(t, op_id, rank, e), "send buffer", &reported);
  if (wrong) fprintf(stderr, "%s: %d wrong\n", what, wrong);
out:
  mem_free(&bm);
  if (!in_place) mem_free(&sm);
  return wrong;
}

/* Large: several chunks per block; across daemons (where TCP sets the
 * pace) a quarter MiB per rank, which still cuts every message in two. */
static size_t large_count(enum coll c, ccs_dtype_t t, int n) {
  size_t per_rank = (hops_round ? (size_t)256 << 10 : (size_t)2 << 20) / ccs_dtype_size(t);
  if (c == ALL_REDUCE || c == BROADCAST || c == REDUCE) return per_rank + 3;
  return per_rank / (size_t)n + 1;
}

static int run_matrix(ccs_comm_t *comm, int rank, int n) {
  int wrong = 0;
  uint64_t op_id = 0;
  for (int c = 0; c < NCOLLS; c++)
    for (int t = 0; t < CCS_DTYPE_COUNT; t++)
      for (int op = 0; op < (has_redop(c) ? CCS_REDOP_COUNT : 1); op++) {
        size_t counts[4] = {0, 1, 1001, large_count(c, t, n)};
        for (int s = 0; s < 4; s++)
          for (int v = 0; v < 4; v++) {
            /* the large size runs one variant per combination, rotating */
            if (s == 3 && v != (int)((t + op + c) % 4)) continue;
            wrong += run_case(comm, rank, n, c, t, op, counts[s], v & 1, v >> 1, op_id);
            __atomic_store_n(&sh->checked[rank], ++op_id, __ATOMIC_RELEASE);
          }
      }
  return wrong;
}

/* Sends and receives in groups: a ring, then every pair (self included). */
static int run_p2p(ccs_comm_t *comm, int rank, int n) {
  int wrong = 0, reported = 0;
  uint64_t op_id = 1u << 20;
  for (int t = 0; t < CCS_DTYPE_COUNT; t++) {
    size_t counts[4] = {0, 1, 1001, ((hops_round ? (size_t)256 << 10 : (size_t)1 << 20) / ccs_dtype_size(t)) | 1};
    for (int s = 0; s < 4; s++, op_id++) {
      size_t cnt = counts[s], sz = ccs_dtype_size(t);
      int registered = s & 1;
      struct mem smem, rmem;
      if (mem_alloc(&smem, (size_t)n * cnt * sz, registered) ||
          mem_alloc(&rmem, (size_t)n * cnt * sz, registered))
        return 1;
      for (int peer = 0; peer < n; peer++)
        for (size_t e = 0; e < cnt; e++)
          ref_set_bits(t, smem.host + (size_t)peer * cnt * sz, e, input(t, COPIED, op_id, rank * n + peer, e));
      mem_push(&smem);
      char *sb = smem.ptr, *rb = rmem.ptr;
      ccs_stream_t st = stream_for(op_id);
      int next = (rank + 1) % n, prev = (rank + n - 1) % n;
      ccs_group_start();
      ccs_send(sb + (size_t)next * cnt * sz, cnt, t, next, comm, st);
      ccs_recv(rb, cnt, t, prev, comm, st);
      ccs_result_t rc = ccs_group_end();
      settle(st);
      mem_pull(&rmem);
      rb = rmem.host;
      if (rc != CCS_OK) {
        fprintf(stderr, "rank %d ring %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(comm));
        wrong++;
      }
      for (size_t e = 0; e < cnt; e++)
        wrong += check_elem(t, rb, e, input(t, COPIED, op_id, prev * n + rank, e), "ring recv", &reported);
      ccs_group_start();
      for (int peer = 0; peer < n; peer++) {
        ccs_send(sb + (size_t)peer * cnt * sz, cnt, t, peer, comm, st);
        ccs_recv(rmem.ptr + (size_t)peer * cnt * sz, cnt, t, peer, comm, st);
      }
      rc = ccs_group_end();
      settle(st);
      mem_pull(&rmem);
      if (rc != CCS_OK) {
        fprintf(stderr, "rank %d pairs %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(comm));
        wrong++;
      }
      for (int peer = 0; peer < n; peer++)
        for (size_t e = 0; e < cnt; e++)
          wrong += check_elem(t, rb + (size_t)peer * cnt * sz, e,
                              input(t, COPIED, op_id, peer * n + rank, e), "pair recv", &reported);
      mem_free(&smem);
      mem_free(&rmem);
    }
  }
  /* blocking pairs outside groups: even ranks send first, odd receive first */
  if (n >= 2 && rank < 2) {
    int peer = 1 - rank, v = 100 + rank, got = -1;
    ccs_result_t a = rank == 0 ? ccs_send(&v, 1, CCS_INT32, peer, comm, NULL)
                               : ccs_recv(&got, 1, CCS_INT32, peer, comm, NULL);
    ccs_result_t b = rank == 0 ? ccs_recv(&got, 1, CCS_INT32, peer, comm, NULL)
                               : ccs_send(&v, 1, CCS_INT32, peer, comm, NULL);
    if (a != CCS_OK || b != CCS_OK || got != 100 + peer) {
      fprintf(stderr, "rank %d blocking send/recv: %d %d got %d\n", rank, a, b, got);
      wrong++;
    }
  }
  return wrong;
}

static int run_barriers(ccs_comm_t *comm, int rank, int n) {
  for (int round = 1; round <= 20; round++) {
    __atomic_add_fetch(&sh->barrier_count, 1, __ATOMIC_SEQ_CST);
    if (ccs_barrier(comm) != CCS_OK) return 1;
    /* nobody leaves a barrier before everyone entered it */
    if (__atomic_load_n(&sh->barrier_count, __ATOMIC_SEQ_CST) < round * n) {
      fprintf(stderr, "rank %d left barrier %d early\n", rank, round);
      return 1;
    }
    if (ccs_barrier(comm) != CCS_OK) return 1; /* keeps the rounds apart */
  }
  return 0;
}

static int rank_main(int rank, int n, void *arg) {
  ccs_comm_t *comm;
#ifdef CCS_HAVE_CUDA
  if (on_device && (cudaSetDevice(0) != cudaSuccess ||
                    cudaStreamCreateWithFlags((cudaStream_t *)&stream, cudaStreamNonBlocking))) {
    fprintf(stderr, "rank %d: no GPU 0\n", rank);
    return 1;
  }
#endif
  ccs_result_t rc = ccs_comm_init_rank(&comm, n, sh->id, rank);
  if (rc != CCS_OK) {
    fprintf(stderr, "rank %d: init: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(NULL));
    return 1;
  }
  int count, me;
  if (ccs_comm_count(comm, &count) || ccs_comm_user_rank(comm, &me) || count != n || me != rank)
    return 1;
  int wrong = run_matrix(comm, rank, n);
  wrong += run_p2p(comm, rank, n);
  wrong += run_barriers(comm, rank, n);
  ccs_result_t async;
  if (ccs_comm_get_async_error(comm, &async) != CCS_OK || async != CCS_OK) wrong++;
  ccs_comm_destroy(comm);
  return wrong ? 1 : 0;
}

/* Which algorithm ran each call, by the daemons' counters
 * (ccs_op_algorithm_total): every call of every collective, with CCS_ALGO
 * naming one algorithm, by that algorithm wherever it builds the
 * collective (algo_table.h); elsewhere, and without CCS_ALGO, by direct on
 * one daemon (the model's choice over mapped buffers), and by whatever
 * the model chose across daemons. A forced algorithm that was dropped, or
 * a builder that fell back to the tuner, fails here. */
static void check_algorithms(const struct test_daemon *d, int ndaemons) {
  static const char *const algos[] = {"direct", "ring", "tree", "rhd"};
  const char *forced = getenv("CCS_ALGO");
  if (forced && *forced && algo_table_builds(forced, "all_reduce") < 0) {
    fprintf(stderr, "# CCS_ALGO='%s' is no single algorithm: only the totals are checked\n", forced);
    forced = "rules";
  }
  double got[NCOLLS][4] = {{0}};
  for (int i = 0; i < ndaemons; i++) {
    char *text = raw_admin(d[i].socket, "metrics");
    for (int c = 0; c < NCOLLS; c++)
      for (int a = 0; a < 4; a++) {
        char series[160];
        snprintf(series, sizeof(series), "ccs_op_algorithm_total{collective=\"%s\",algorithm=\"%s\"}",
                 coll_names[c], algos[a]);
        got[c][a] += raw_metric(text, series);
      }
    free(text);
  }
  for (int c = 0; c < NCOLLS; c++) {
    double calls = (double)sh->calls[c] * nranks_arg, sum = 0;
    const char *want = NULL; /* the one algorithm every call must have run with */
    if (forced && *forced && strcmp(forced, "rules") && algo_table_builds(forced, coll_names[c]))
      want = forced;
    else if (ndaemons == 1 && (!forced || !*forced || algo_table_builds(forced, coll_names[c]) == 0))
      want = "direct";
    for (int a = 0; a < 4; a++) {
      sum += got[c][a];
      if (got[c][a]) fprintf(stderr, "# %s: %.0f calls by %s\n", coll_names[c], got[c][a], algos[a]);
      if (want && strcmp(want, algos[a]) && got[c][a])
        fail_msg("%s: %.0f calls ran with %s, not %s", coll_names[c], got[c][a], algos[a], want);
      if (want && !strcmp(want, algos[a]) && got[c][a] != calls)
        fail_msg("%s: %.0f of %.0f calls ran with %s", coll_names[c], got[c][a], calls, want);
    }
    if (sum != calls) fail_msg("%s: the daemons counted %.0f calls, the ranks made %.0f", coll_names[c], sum, calls);
  }
}

static void test_all_collectives(void **state) {
  /* CCS_TEST_DAEMONS=D: ranks spread over D daemons (rank r on daemon r % D) */
  int ndaemons = getenv("CCS_TEST_DAEMONS") ? atoi(getenv("CCS_TEST_DAEMONS")) : 1;
  struct test_daemon d[8];
  assert_true(ndaemons >= 1 && ndaemons <= 8);
  hops_round = ndaemons > 1;
  /* CCS_ALGO is the ranks' (the daemons would take it as their algo key) */
  char *algo = getenv("CCS_ALGO") ? strdup(getenv("CCS_ALGO")) : NULL;
  unsetenv("CCS_ALGO");
  if (ndaemons == 1) {
    assert_int_equal(test_daemon_start(&d[0], NULL), 0);
  } else {
    assert_int_equal(test_daemons_start(d, ndaemons, NULL), 0);
    test_spread_ranks(d, ndaemons);
  }
  if (algo) setenv("CCS_ALGO", algo, 1);
  free(algo);
  sh = test_shared_new(sizeof(*sh));
  assert_non_null(sh);
  size_t table_bytes = 2 * (size_t)nranks_arg * ROW_BYTES;
  inputs_table = test_shared_new(table_bytes);
  assert_non_null(inputs_table);
  sh->seed = test_seed();
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(nranks_arg, rank_main, NULL, 900, NULL), 0);
  check_algorithms(d, ndaemons);
  for (int i = 0; i < ndaemons; i++) assert_int_equal(test_daemon_stop(&d[i]), 0);
  test_shared_free(inputs_table, table_bytes);
  test_shared_free(sh, sizeof(*sh));
}

int main(int argc, char **argv) {
  nranks_arg = argc > 1 ? atoi(argv[1]) : 3;
  const char *memory = getenv("CCS_TEST_MEMORY");
  on_device = memory && !strncmp(memory, "device", 6);
  legacy_ipc = memory && !strcmp(memory, "device-legacy");
#ifndef CCS_HAVE_CUDA
  if (on_device) {
    fprintf(stderr, "CCS_TEST_MEMORY=device: this build has no CUDA\n");
    return 2;
  }
#endif
#ifdef CCS_TEST_STANDIN
  /* one stand-in GPU; the driver's library loaded (by its soname), as in
   * a CUDA program, which is when libccs looks at device pointers */
  standin_reset(1);
  if (!dlopen(CCS_CUDA_DRIVER, RTLD_NOW | RTLD_LOCAL)) {
    fprintf(stderr, "%s: %s\n", CCS_CUDA_DRIVER, dlerror());
    return 2;
  }
#endif
  if (nranks_arg < 1 || nranks_arg > 64) {
    fprintf(stderr, "usage: test_collectives NRANKS\n");
    return 2;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_all_collectives)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
