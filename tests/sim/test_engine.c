/* The engine's proof: every builder x every collective it implements x
 * n = 1..17 compiled by the engine over real buffers (in place and not,
 * chunks of a few elements so nodes pipeline), run with the ready tasks
 * taken in random order, and compared bit for bit, element by element,
 * with the exact reference (integers over their whole range), for every
 * dtype and reduction op. Send buffers
 * must come back untouched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plan/engine.h"
#include "plan/shape.h"
#include "plan/pool.h"
#include "run/engine_run.h"
#include "algo_table.h"
#include "harness.h"
#include "reference.h"

struct bufs {
  char *send[17], *recv[17], *copy[17];
  size_t send_len, recv_len; /* elements */
};

/* Rank r's input element i, as bits: integers over their whole range
 * (sums and products wrap, in any order the same), floats values exact
 * also across daemons, where partial results are rounded at each hop. */
static uint64_t input(ccs_dtype_t t, ccs_redop_t op, uint64_t seed, int r, size_t i) {
  uint64_t h = test_mix(seed, ((uint64_t)r << 40) + i);
  return ref_is_float(t) ? ref_stored_bits(t, ref_hop_exact_value(t, op, h)) : ref_random_bits(t, h);
}

static uint64_t reduced(ccs_dtype_t t, ccs_redop_t op, uint64_t seed, int n, size_t i) {
  uint64_t v[17];
  for (int r = 0; r < n; r++) v[r] = input(t, op, seed, r, i);
  return ref_reduce_bits(t, op, op == CCS_AVG ? (size_t)n : 0, v, n);
}

/* Buffers as a caller lays them out; in place as NCCL defines it. */
static void setup(enum sched_coll c, int n, int root, size_t count, ccs_dtype_t t, ccs_redop_t op,
                  uint64_t seed, int in_place, struct bufs *b, struct engine_part *ranks) {
  size_t sz = ccs_dtype_size(t), all = (size_t)n * count;
  int many_in = c == SCHED_REDUCE_SCATTER || c == SCHED_SCATTER || c == SCHED_ALL_TO_ALL;
  int many_out = c == SCHED_ALL_GATHER || c == SCHED_GATHER || c == SCHED_ALL_TO_ALL;
  b->send_len = many_in ? all : count;
  b->recv_len = many_out ? all : count;
  for (int r = 0; r < n; r++) {
    int has_in = !(c == SCHED_BROADCAST || c == SCHED_SCATTER) || r == root;
    int has_out = !(c == SCHED_REDUCE || c == SCHED_GATHER) || r == root;
    b->send[r] = calloc(b->send_len + 1, sz);
    b->recv[r] = calloc(b->recv_len + 1, sz);
    b->copy[r] = calloc(b->send_len + 1, sz);
    memset(b->recv[r], 0x5a, b->recv_len * sz); /* garbage where nothing is written */
    memset(&ranks[r], 0, sizeof(ranks[r]));
    ranks[r].send = has_in ? b->send[r] : NULL;
    ranks[r].recv = has_out ? b->recv[r] : NULL;
    if (in_place && has_in && has_out) {
      if (c == SCHED_REDUCE_SCATTER || c == SCHED_SCATTER) ranks[r].recv = b->send[r] + (size_t)r * count * sz;
      else if (c == SCHED_ALL_GATHER || c == SCHED_GATHER) ranks[r].send = b->recv[r] + (size_t)r * count * sz;
      else ranks[r].recv = b->send[r];
    }
    if (ranks[r].send)
      for (size_t i = 0; i < b->send_len; i++) ref_set_bits(t, ranks[r].send, i, input(t, op, seed, r, i));
    if (ranks[r].send) memcpy(b->copy[r], ranks[r].send, b->send_len * sz);
  }
}

static int check(enum sched_coll c, int n, int root, size_t count, ccs_dtype_t t, ccs_redop_t op,
                 uint64_t seed, int in_place, const struct bufs *b, const struct engine_part *ranks,
                 const char *what) {
  size_t sz = ccs_dtype_size(t);
  int wrong = 0;
  for (int r = 0; r < n; r++) {
    if (!ranks[r].recv) continue;
    size_t len = b->recv_len;
    if (c == SCHED_REDUCE_SCATTER || c == SCHED_SCATTER) len = count;
    for (size_t i = 0; i < len; i++) {
      /* which block of the op element i of rank r's output is (shape.h):
       * one buffer cut anyhow, one block per rank, or the rank's own */
      int splits = sched_coll_splits(c);
      uint32_t blk = splits ? 0 : sched_shape_output_whole(c) ? (uint32_t)(i / count) : (uint32_t)r;
      size_t off = splits || !sched_shape_output_whole(c) ? i : i % count;
      struct sched_want w = sched_shape_want(c, root, r, blk);
      /* element off of block k in an input */
#define IN_AT(k) (splits || !sched_shape_input_whole(c) ? off : (size_t)(k) * count + off)
      uint64_t want = 0;
      if (w.kind == SCHED_WANT_REDUCED) want = reduced(t, op, seed, n, IN_AT(blk));
      else if (w.kind == SCHED_WANT_COPY) want = input(t, op, seed, w.from, IN_AT(w.block));
      else continue;
#undef IN_AT
      if (!ref_same_bits(t, ref_get_bits(t, ranks[r].recv, i), want) && wrong++ < 3)
        fprintf(stderr, "%s: rank %d element %zu: got 0x%llx want 0x%llx\n", what, r, i,
                (unsigned long long)ref_get_bits(t, ranks[r].recv, i), (unsigned long long)want);
    }
    if (!in_place && ranks[r].send && memcmp(ranks[r].send, b->copy[r], b->send_len * sz) && wrong++ < 3)
      fprintf(stderr, "%s: rank %d's send buffer changed\n", what, r);
  }
  return wrong;
}

/* Takes the ready tasks in a random order: any order the graph allows
 * must give the same result. */
static void run_shuffled(struct engine_plan *pl, uint64_t seed) {
  engine_start(pl);
  for (uint64_t k = 0; engine_has_ready(pl); k++) {
    size_t span = pl->ready_tail - pl->ready_head;
    size_t pick = pl->ready_head + (size_t)(test_mix(seed, k) % span);
    uint32_t tmp = pl->ready[pl->ready_head];
    pl->ready[pl->ready_head] = pl->ready[pick];
    pl->ready[pick] = tmp;
    size_t t = engine_claim(pl);
    engine_run_task(pl, t, (int)(k & 1));
    engine_finish(pl, t);
  }
  assert_true(engine_done(pl));
}

static void free_bufs(struct bufs *b, int n) {
  for (int r = 0; r < n; r++) {
    free(b->send[r]);
    free(b->recv[r]);
    free(b->copy[r]);
  }
}

static void run_daemons(struct engine_plan *pl, int D, uint64_t seed, const char *what);

/* Compiles each daemon's op (one: all participants here), runs the plans
 * together in random order and checks every rank's output against the
 * reference; frees the buffers. 1 when it ran, 0 when the algorithm does
 * not build this collective. */
static int compile_run_check(const struct engine_op *ops, int D, int nranks, int root_rank,
                             uint64_t seed, int in_place, struct bufs *b,
                             const struct engine_part *ranks, const char *what) {
  struct engine_plan pl[3];
  char err[256];
  ccs_result_t rc = CCS_OK;
  int built = 0;
  for (int d = 0; d < D && rc == CCS_OK; d++) {
    rc = engine_compile(&ops[d], &pl[d], err, sizeof(err));
    built += rc == CCS_OK;
  }
  int wrong = 0;
  if (rc == CCS_OK) {
    if (D == 1) run_shuffled(&pl[0], seed ^ 0x5eed);
    else run_daemons(pl, D, seed ^ 0x5eed, what);
    wrong = check(ops[0].coll, nranks, root_rank, ops[0].count, ops[0].dtype, ops[0].redop, seed,
                  in_place, b, ranks, what);
  }
  for (int d = 0; d < built; d++) engine_plan_free(&pl[d]);
  free_bufs(b, nranks);
  if (rc == CCS_ERR_UNSUPPORTED) return 0;
  if (rc != CCS_OK) fail_msg("%s: %s", what, err);
  if (wrong) fail_msg("%s: %d wrong", what, wrong);
  return 1;
}

/* Compiled (1) or declined (0) as the table of builders says; fails the
 * test otherwise. */
static int as_the_table_says(int ran, int a, int c, const char *what) {
  int builds = algo_table_builds(sched_algo_name(a), sched_coll_name(c));
  if (ran != builds)
    fail_msg("%s: %s, but the table says %s %s %s", what, ran ? "compiled" : "declined",
             sched_algo_name(a), builds ? "builds" : "does not build", sched_coll_name(c));
  return ran;
}

static void test_every_algorithm_on_buffers(void **state) {
  (void)state;
  uint64_t seed = test_seed();
  int ran = 0, want = 0, k = 0;
  for (int a = 0; a < SCHED_ALGO_COUNT; a++)
    for (int c = 0; c < SCHED_COLL_COUNT; c++)
      for (int n = 1; n <= 17; n++)
        for (int in_place = 0; in_place < 2; in_place++) {
          want += 4 * algo_table_builds(sched_algo_name(a), sched_coll_name(c));
          size_t sizes[4] = {0, 1, (size_t)n + 3, 1001};
          for (int si = 0; si < 4; si++, k++) {
            ccs_dtype_t t = (ccs_dtype_t)(k % CCS_DTYPE_COUNT);
            ccs_redop_t op = (ccs_redop_t)((k / CCS_DTYPE_COUNT) % CCS_REDOP_COUNT);
            int root = (a + c + n + si) % n;
            struct bufs b;
            struct engine_part ranks[17];
            setup((enum sched_coll)c, n, root, sizes[si], t, op, seed + (uint64_t)k, in_place, &b, ranks);
            struct engine_op eo = {(enum sched_coll)c, (enum sched_algo)a, n, root, 1 + k % 3,
                                   sizes[si], t, op, ranks, NULL, (size_t)8 << (k % 8)};
            char what[160];
            snprintf(what, sizeof(what), "%s %s n=%d root=%d count=%zu %s %s %s",
                     sched_algo_name(a), sched_coll_name(c), n, root, sizes[si],
                     ccs_dtype_name(t), ccs_redop_name(op), in_place ? "in place" : "out of place");
            if (!as_the_table_says(compile_run_check(&eo, 1, n, root, seed + (uint64_t)k, in_place, &b,
                                                     ranks, what), a, c, what))
              break;
            ran++;
          }
        }
  fprintf(stderr, "# %d compiled ops run and checked\n", ran);
  assert_int_equal(ran, want);
}

/* What a plan's tasks read and write, element by element, counted as they
 * run from the ranges their kernels are given (engine_run_task): for each
 * rank, how often each element of its send buffer was read and each of
 * its recv buffer written, and the elements touched anywhere else. */
struct traffic {
  unsigned *reads[17], *writes[17];
  size_t elsewhere;
};

static void count_range(const struct bufs *b, int n, size_t sz, const void *at, size_t len,
                        int write, struct traffic *tr) {
  const char *p = at;
  for (int r = 0; r < n; r++) {
    const char *base = write ? b->recv[r] : b->send[r];
    size_t elems = write ? b->recv_len : b->send_len;
    if (p < base || p >= base + elems * sz) continue;
    size_t first = (size_t)(p - base) / sz;
    if (first + len > elems) fail_msg("a task runs past rank %d's buffer", r);
    for (size_t i = 0; i < len; i++) (write ? tr->writes : tr->reads)[r][first + i]++;
    return;
  }
  tr->elsewhere += len;
}

static void run_counting(struct engine_plan *pl, const struct bufs *b, int n, struct traffic *tr) {
  engine_start(pl);
  while (engine_has_ready(pl)) {
    size_t t = engine_claim(pl), begin;
    const struct engine_item *nd = engine_task_item(pl, t);
    size_t len = engine_task_span(pl, t, &begin), sz = pl->elem_size;
    for (int k = 0; k < (nd->reduce ? nd->nin : 1); k++)
      count_range(b, n, sz, (const char *)nd->in[k] + begin * sz, len, 0, tr);
    for (int k = 0; k < nd->nout; k++) count_range(b, n, sz, (char *)nd->out[k] + begin * sz, len, 1, tr);
    engine_run_task(pl, t, 0);
    engine_finish(pl, t);
  }
  assert_true(engine_done(pl));
}

/* Over mapped memory every algorithm's all_reduce reads each contribution
 * once and writes each rank's copy once, touching nothing else (no
 * scratch): the same traffic as direct, counted from the tasks as they
 * run, and the results are right. */
static void test_all_reduce_moves_each_byte_once(void **state) {
  (void)state;
  enum { N = 6, COUNT = 4096 };
  for (int a = 0; a < SCHED_ALGO_COUNT; a++) {
    struct bufs b;
    struct engine_part ranks[N];
    setup(SCHED_ALL_REDUCE, N, 0, COUNT, CCS_FLOAT32, CCS_SUM, 1, 0, &b, ranks);
    struct engine_op eo = {SCHED_ALL_REDUCE, (enum sched_algo)a, N, 0, 1, COUNT, CCS_FLOAT32,
                           CCS_SUM, ranks, NULL, 1 << 12};
    struct engine_plan pl;
    char err[256];
    assert_int_equal(engine_compile(&eo, &pl, err, sizeof(err)), CCS_OK);
    struct traffic tr = {.elsewhere = 0};
    for (int r = 0; r < N; r++) {
      tr.reads[r] = calloc(COUNT, sizeof(unsigned));
      tr.writes[r] = calloc(COUNT, sizeof(unsigned));
    }
    run_counting(&pl, &b, N, &tr);
    for (int r = 0; r < N; r++)
      for (size_t i = 0; i < COUNT; i++)
        if (tr.reads[r][i] != 1 || tr.writes[r][i] != 1)
          fail_msg("%s all_reduce: rank %d element %zu read %u times, written %u times",
                   sched_algo_name(a), r, i, tr.reads[r][i], tr.writes[r][i]);
    if (tr.elsewhere) fail_msg("%s all_reduce: %zu elements touched outside the ranks' buffers",
                               sched_algo_name(a), tr.elsewhere);
    assert_int_equal(check(SCHED_ALL_REDUCE, N, 0, COUNT, CCS_FLOAT32, CCS_SUM, 1, 0, &b, ranks,
                           sched_algo_name(a)), 0);
    for (int r = 0; r < N; r++) {
      free(tr.reads[r]);
      free(tr.writes[r]);
    }
    engine_plan_free(&pl);
    free_bufs(&b, N);
  }
}

/* Messages between the daemons of the test below, by identity. */
struct mail {
  int from, to;
  uint32_t msg;
  size_t chunk, bytes;
  char *data;
};

static struct mail *find_mail(struct mail *box, size_t n, const struct engine_item *nd, size_t chunk) {
  for (size_t i = 0; i < n; i++)
    if (box[i].data && box[i].from == nd->from && box[i].to == nd->to && box[i].msg == nd->msg &&
        box[i].chunk == chunk)
      return &box[i];
  return NULL;
}

/* Runs D daemons' plans in one process: a SEND task posts its chunk, a
 * RECV task completes once its chunk arrived; tasks in random order. */
static void run_daemons(struct engine_plan *pl, int D, uint64_t seed, const char *what) {
  struct mail *box = NULL;
  size_t nbox = 0, cap = 0;
  for (int d = 0; d < D; d++) engine_start(&pl[d]);
  size_t *waiting[3] = {0}, nwait[3] = {0};
  for (int d = 0; d < D; d++) waiting[d] = malloc((pl[d].ntasks + 1) * sizeof(size_t));
  for (uint64_t k = 0, progress = 1; progress; k++) {
    progress = 0;
    for (int d = 0; d < D; d++) {
      /* receives whose chunk is here */
      for (size_t w = 0; w < nwait[d]; w++) {
        size_t t = waiting[d][w];
        const struct engine_item *nd = engine_task_item(&pl[d], t);
        size_t chunk = t - nd->first_task;
        struct mail *m = find_mail(box, nbox, nd, chunk);
        if (!m) continue;
        memcpy((char *)nd->out[0] + chunk * pl[d].chunk_elems * pl[d].elem_size, m->data, m->bytes);
        free(m->data);
        *m = box[--nbox];
        waiting[d][w--] = waiting[d][--nwait[d]];
        engine_finish(&pl[d], t);
        progress = 1;
      }
      int compute = engine_has_ready(&pl[d]), net = engine_has_net_ready(&pl[d]);
      if (!compute && !net) continue;
      uint64_t r = test_mix(seed, k * 7 + (uint64_t)d);
      int take_net = net && (!compute || (r & 1));
      uint32_t *q = take_net ? pl[d].net_ready : pl[d].ready;
      size_t head = take_net ? pl[d].net_head : pl[d].ready_head;
      size_t pick = head + (size_t)((r >> 1) % ((take_net ? pl[d].net_tail : pl[d].ready_tail) - head));
      uint32_t tmp = q[head];
      q[head] = q[pick];
      q[pick] = tmp;
      size_t t = take_net ? engine_claim_net(&pl[d]) : engine_claim(&pl[d]);
      const struct engine_item *nd = engine_task_item(&pl[d], t);
      size_t chunk = t - nd->first_task, begin = chunk * pl[d].chunk_elems;
      size_t bytes = (nd->count - begin < pl[d].chunk_elems ? nd->count - begin : pl[d].chunk_elems) *
                     pl[d].elem_size;
      progress = 1;
      if (nd->kind == ENGINE_RECV) {
        waiting[d][nwait[d]++] = t;
        continue;
      }
      if (nd->kind == ENGINE_SEND) {
        if (nbox == cap) box = realloc(box, (cap = cap ? 2 * cap : 64) * sizeof(*box));
        box[nbox] = (struct mail){nd->from, nd->to, nd->msg, chunk, bytes, malloc(bytes + 1)};
        memcpy(box[nbox++].data, (const char *)nd->in[0] + begin * pl[d].elem_size, bytes);
      } else {
        engine_run_task(&pl[d], t, 0);
      }
      engine_finish(&pl[d], t);
    }
  }
  for (int d = 0; d < D; d++) {
    if (!engine_done(&pl[d])) fail_msg("%s: daemon %d stuck with %zu of %zu tasks done", what, d, pl[d].finished, pl[d].ntasks);
    free(waiting[d]);
  }
  if (nbox) fail_msg("%s: a message from %d to %d never received", what, box[0].from, box[0].to);
  free(box);
}

/* Ranks on several daemons (rank r on daemon r % D, participants ordered
 * by daemon): every algorithm x collective, each daemon compiling only
 * its own ranks, messages between daemons by identity and chunk. */
static void test_every_algorithm_across_daemons(void **state) {
  (void)state;
  uint64_t seed = test_seed();
  int ran = 0, want = 0, k = 0;
  static const int counts[] = {2, 3, 4, 5, 7, 8};
  for (int a = 0; a < SCHED_ALGO_COUNT; a++)
    for (int c = 0; c < SCHED_COLL_COUNT; c++)
      for (size_t ni = 0; ni < sizeof(counts) / sizeof(counts[0]); ni++)
        for (int D = 2; D <= 3; D++) {
          int n = counts[ni];
          if (D > n) continue;
          want += 3 * algo_table_builds(sched_algo_name(a), sched_coll_name(c));
          size_t sizes[3] = {1, (size_t)n + 3, 1001};
          for (int si = 0; si < 3; si++, k++) {
            ccs_dtype_t t = (ccs_dtype_t)(k % CCS_DTYPE_COUNT);
            ccs_redop_t op = (ccs_redop_t)((k / CCS_DTYPE_COUNT) % CCS_REDOP_COUNT);
            int in_place = k % 2, root_rank = (a + c + n + si) % n, rank_of[17], root = 0, np = 0;
            for (int d = 0; d < D; d++)
              for (int r = d; r < n; r += D) rank_of[np++] = r;
            for (int p = 0; p < n; p++)
              if (rank_of[p] == root_rank) root = p;
            struct bufs b;
            struct engine_part ranks[17], pr[3][17];
            setup((enum sched_coll)c, n, root_rank, sizes[si], t, op, seed + (uint64_t)k, in_place, &b, ranks);
            struct engine_op eo[3];
            char what[200];
            snprintf(what, sizeof(what), "%s %s n=%d on %d daemons root=%d count=%zu %s %s %s",
                     sched_algo_name(a), sched_coll_name(c), n, D, root_rank, sizes[si],
                     ccs_dtype_name(t), ccs_redop_name(op), in_place ? "in place" : "out of place");
            for (int d = 0; d < D; d++) {
              for (int p = 0; p < n; p++) {
                pr[d][p] = ranks[rank_of[p]];
                pr[d][p].remote = rank_of[p] % D != d;
                if (pr[d][p].remote) pr[d][p].send = pr[d][p].recv = NULL;
              }
              eo[d] = (struct engine_op){(enum sched_coll)c, (enum sched_algo)a, n, root, 1 + k % 3,
                                         sizes[si], t, op, pr[d], rank_of, (size_t)256 << (k % 5)};
            }
            if (!as_the_table_says(compile_run_check(eo, D, n, root_rank, seed + (uint64_t)k, in_place, &b,
                                                     ranks, what), a, c, what))
              break;
            ran++;
          }
        }
  fprintf(stderr, "# %d ops across daemons run and checked\n", ran);
  assert_int_equal(ran, want);
}

/* Schedules among daemons: participant d stands for daemon d's ranks
 * (r % D == d), reduced locally before the network and landing in every
 * member after it; for the collectives in blocks of ranks, its block is
 * its members' blocks. */
static void test_groups_across_daemons(void **state) {
  (void)state;
  uint64_t seed = test_seed();
  static const enum sched_coll colls[] = {SCHED_ALL_REDUCE,     SCHED_REDUCE, SCHED_BROADCAST,
                                          SCHED_ALL_GATHER,     SCHED_GATHER, SCHED_SCATTER,
                                          SCHED_REDUCE_SCATTER};
  int ran = 0, want = 0, k = 0;
  for (int a = 0; a < SCHED_ALGO_COUNT; a++)
    for (int ci = 0; ci < (int)(sizeof(colls) / sizeof(colls[0])); ci++)
      for (int n = 2; n <= 8; n++)
        for (int D = 2; D <= 3 && D <= n; D++) {
          enum sched_coll c = colls[ci];
          want += 3 * algo_table_builds(sched_algo_name(a), sched_coll_name(c));
          size_t sizes[3] = {1, (size_t)n + 3, 1001};
          for (int si = 0; si < 3; si++, k++) {
            ccs_dtype_t t = (ccs_dtype_t)(k % CCS_DTYPE_COUNT);
            ccs_redop_t op = (ccs_redop_t)((k / CCS_DTYPE_COUNT) % CCS_REDOP_COUNT);
            int in_place = k % 2, root_rank = (a + ci + n + si) % n;
            struct bufs b;
            struct engine_part ranks[17], members[3][17], parts[3][3];
            setup(c, n, root_rank, sizes[si], t, op, seed + (uint64_t)k, in_place, &b, ranks);
            int nm[3] = {0}, rank_of[17], first[4] = {0}, np = 0;
            int root_member = 0;
            for (int d = 0; d < D; d++) {
              for (int r = d; r < n; r += D) rank_of[np++] = r;
              first[d + 1] = np;
            }
            for (int r = 0; r < n; r++) {
              if (r == root_rank) root_member = nm[r % D];
              members[r % D][nm[r % D]++] = ranks[r];
            }
            struct engine_op eo[3];
            char what[200];
            snprintf(what, sizeof(what), "%s %s of %d ranks on %d daemons as groups, root=%d count=%zu %s %s %s",
                     sched_algo_name(a), sched_coll_name(c), n, D, root_rank, sizes[si],
                     ccs_dtype_name(t), ccs_redop_name(op), in_place ? "in place" : "out of place");
            for (int d = 0; d < D; d++) {
              for (int q = 0; q < D; q++) {
                memset(&parts[d][q], 0, sizeof(parts[d][q]));
                parts[d][q].remote = q != d;
                if (q != d) continue;
                parts[d][q].members = members[q];
                parts[d][q].nmembers = nm[q];
                parts[d][q].root_member = q == root_rank % D ? root_member : -1;
              }
              int blocks = !sched_coll_splits(c);
              eo[d] = (struct engine_op){c, (enum sched_algo)a, D, root_rank % D, 1 + k % 3, sizes[si], t, op,
                                         parts[d], blocks ? rank_of : NULL, (size_t)256 << (k % 5), (size_t)n,
                                         NULL, blocks ? first : NULL};
            }
            if (!as_the_table_says(compile_run_check(eo, D, n, root_rank, seed + (uint64_t)k, in_place, &b,
                                                     ranks, what), a, (int)c, what))
              break;
            ran++;
          }
        }
  fprintf(stderr, "# %d ops of grouped ranks across daemons run and checked\n", ran);
  assert_int_equal(ran, want);
}

/* Grouped all_gather: a daemon receives each other daemon's ranks' blocks
 * once, whatever the algorithm (ranks one by one in a ring would bring
 * its own ranks' blocks back round to it). */
static void test_grouped_all_gather_receives_each_block_once(void **state) {
  (void)state;
  enum { N = 7, D = 3, COUNT = 300 };
  struct bufs b;
  struct engine_part ranks[N], members[D][N], parts[D];
  setup(SCHED_ALL_GATHER, N, 0, COUNT, CCS_INT32, CCS_SUM, 5, 0, &b, ranks);
  int rank_of[N], first[D + 1] = {0}, np = 0;
  for (int d = 0; d < D; d++) {
    for (int r = d; r < N; r += D) {
      members[d][np - first[d]] = ranks[r];
      rank_of[np++] = r;
    }
    first[d + 1] = np;
  }
  for (int a = 0; a < SCHED_ALGO_COUNT; a++)
    for (int d = 0; d < D; d++) {
      for (int q = 0; q < D; q++) parts[q] = (struct engine_part){.remote = q != d};
      parts[d].members = members[d];
      parts[d].nmembers = first[d + 1] - first[d];
      struct engine_op eo = {SCHED_ALL_GATHER, (enum sched_algo)a, D, 0, 1, COUNT, CCS_INT32,
                             CCS_SUM, parts, rank_of, 4096, N, NULL, first};
      struct engine_plan pl;
      char err[256];
      if (engine_compile(&eo, &pl, err, sizeof(err)) != CCS_OK) break;
      size_t got = 0;
      for (size_t i = 0; i < pl.nitems; i++)
        if (pl.items[i].kind == ENGINE_RECV) got += pl.items[i].count;
      if (got != (size_t)(N - parts[d].nmembers) * COUNT)
        fail_msg("%s all_gather: daemon %d receives %zu elements, not %d", sched_algo_name(a), d, got,
                 (N - parts[d].nmembers) * COUNT);
      engine_plan_free(&pl);
    }
  free_bufs(&b, N);
}

/* Scratch comes back from the pool for the next op (in-place all_to_all
 * copies inputs aside), and results stay right. */
static void test_pool_reuses_scratch(void **state) {
  (void)state;
  enum { N = 3, COUNT = 5000 };
  struct engine_pool *pool = engine_pool_new(1 << 20);
  void *first[16];
  size_t nfirst = 0;
  for (int round = 0; round < 3; round++) {
    struct bufs b;
    struct engine_part ranks[N];
    setup(SCHED_ALL_TO_ALL, N, 0, COUNT, CCS_INT32, CCS_SUM, 9 + (uint64_t)round, 1, &b, ranks);
    struct engine_op eo = {SCHED_ALL_TO_ALL, SCHED_DIRECT, N, 0, 1, COUNT, CCS_INT32, CCS_SUM,
                           ranks, NULL, 4096, 0, pool};
    struct engine_plan pl;
    char err[256];
    assert_int_equal(engine_compile(&eo, &pl, err, sizeof(err)), CCS_OK);
    assert_true(pl.nscratch > 0 && pl.nscratch <= 16);
    for (size_t i = 0; i < pl.nscratch; i++) {
      if (round == 0) {
        first[nfirst++] = pl.scratch[i];
        continue;
      }
      int reused = 0;
      for (size_t j = 0; j < nfirst; j++) reused |= pl.scratch[i] == first[j];
      assert_true(reused);
    }
    run_shuffled(&pl, 11);
    assert_int_equal(check(SCHED_ALL_TO_ALL, N, 0, COUNT, CCS_INT32, CCS_SUM, 9 + (uint64_t)round, 1, &b,
                           ranks, "pooled in-place all_to_all"), 0);
    engine_plan_free(&pl);
    free_bufs(&b, N);
  }
  engine_pool_free(pool);
}

/* An in-place all_to_all of count elements over pool; its scratch bytes. */
static size_t pooled_all_to_all(struct engine_pool *pool, size_t count) {
  enum { N = 3 };
  struct bufs b;
  struct engine_part ranks[N];
  setup(SCHED_ALL_TO_ALL, N, 0, count, CCS_INT32, CCS_SUM, count, 1, &b, ranks);
  struct engine_op eo = {SCHED_ALL_TO_ALL, SCHED_DIRECT, N, 0, 1, count, CCS_INT32, CCS_SUM,
                         ranks, NULL, 4096, 0, pool};
  struct engine_plan pl;
  char err[256];
  assert_int_equal(engine_compile(&eo, &pl, err, sizeof(err)), CCS_OK);
  assert_true(pl.nscratch > 0);
  size_t total = 0;
  for (size_t i = 0; i < pl.nscratch; i++) total += pl.scratch_bytes[i];
  run_shuffled(&pl, count);
  assert_int_equal(check(SCHED_ALL_TO_ALL, N, 0, count, CCS_INT32, CCS_SUM, count, 1, &b, ranks,
                         "pooled in-place all_to_all"), 0);
  engine_plan_free(&pl);
  free_bufs(&b, N);
  return total;
}

static void *counted_alloc(size_t bytes, void *ctx) {
  ++*(int *)ctx;
  return malloc(bytes);
}
static void counted_release(void *mem, void *ctx) {
  (void)ctx;
  free(mem);
}

/* A larger op after a smaller one: the smaller one's scratch makes room,
 * and the next op of the larger size allocates nothing new. */
static void test_pool_keeps_the_larger_op(void **state) {
  (void)state;
  int allocs = 0;
  size_t large = pooled_all_to_all(NULL, 20000); /* its scratch, unpooled */
  struct engine_pool *pool = engine_pool_new_with(large, counted_alloc, counted_release, &allocs);
  pooled_all_to_all(pool, 300);
  pooled_all_to_all(pool, 20000);
  int before = allocs;
  pooled_all_to_all(pool, 20000);
  assert_int_equal(allocs, before);
  engine_pool_free(pool);
}

/* Ranks that pass the same output buffer get some answer, never a hang. */
static void test_overlapping_outputs_terminate(void **state) {
  (void)state;
  enum { N = 4, COUNT = 100 };
  struct bufs b;
  struct engine_part ranks[N];
  setup(SCHED_ALL_TO_ALL, N, 0, COUNT, CCS_INT32, CCS_SUM, 2, 0, &b, ranks);
  for (int r = 1; r < N; r++) ranks[r].recv = ranks[0].recv;
  ranks[2].send = ranks[0].recv + 4; /* and an input straddling outputs */
  for (int a = 0; a < SCHED_ALGO_COUNT; a++) {
    struct engine_op eo = {SCHED_ALL_TO_ALL, (enum sched_algo)a, N, 0, 1, COUNT, CCS_INT32,
                           CCS_SUM, ranks, NULL, 64};
    struct engine_plan pl;
    char err[256];
    if (engine_compile(&eo, &pl, err, sizeof(err)) != CCS_OK) continue;
    run_shuffled(&pl, 3);
    engine_plan_free(&pl);
  }
  free_bufs(&b, N);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_algorithm_on_buffers),
      cmocka_unit_test(test_all_reduce_moves_each_byte_once),
      cmocka_unit_test(test_every_algorithm_across_daemons),
      cmocka_unit_test(test_groups_across_daemons),
      cmocka_unit_test(test_grouped_all_gather_receives_each_block_once),
      cmocka_unit_test(test_pool_reuses_scratch),
      cmocka_unit_test(test_pool_keeps_the_larger_op),
      cmocka_unit_test(test_overlapping_outputs_terminate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
