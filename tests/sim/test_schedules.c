/* The algorithms' proof: every builder x every collective it implements x
 * n = 1..17 participants (roots and pipeline depths varied) is checked
 * symbolically (sched_check), then run on real data in one process over a
 * loopback of message queues, with the real reduction kernels, and
 * compared element by element with values computed independently. Sizes:
 * 0, 1, odd, not divisible by n, and large. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "algo_table.h"
#include "harness.h"
#include "kernels.h"
#include "reference.h"
#include "plan/schedule.h"
#include "plan/shape.h"

struct msg {
  void *data;
  size_t bytes;
  struct msg *next;
};

struct party {
  char *work, *input;
  size_t pc;
};

/* dtype x op pairs whose results are exact whatever the order of the
 * reduction and the rounding after each hop (integers wrap, over their
 * whole range; small integers in floats), so any schedule must match the
 * reference exactly. */
static const struct {
  ccs_dtype_t t;
  ccs_redop_t op;
} combos[] = {
    {CCS_INT32, CCS_SUM},   {CCS_UINT8, CCS_SUM},    {CCS_INT8, CCS_PROD},
    {CCS_FLOAT32, CCS_PROD}, {CCS_FLOAT32, CCS_AVG}, {CCS_INT32, CCS_AVG},
    {CCS_FLOAT64, CCS_SUM}, {CCS_BFLOAT16, CCS_SUM}, {CCS_FLOAT16, CCS_SUM},
    {CCS_FLOAT8_E4M3, CCS_MAX}, {CCS_FLOAT8_E5M2, CCS_MIN}, {CCS_INT64, CCS_MIN},
    {CCS_UINT64, CCS_MAX},
};
#define NCOMBOS (sizeof(combos) / sizeof(combos[0]))

/* As bits: integers over their whole range, floats small integers. */
static uint64_t input_value(ccs_dtype_t t, ccs_redop_t op, uint64_t seed, int p, size_t i) {
  uint64_t h = test_mix(seed, ((uint64_t)p << 40) + i);
  if (!ref_is_float(t)) return ref_random_bits(t, h);
  if (op == CCS_PROD) {
    int v = (int)(h % 4);
    return ref_stored_bits(t, v == 0 ? 2 : v == 1 ? -1 : 1);
  }
  return ref_stored_bits(t, (double)(int)(h % 9) - 4);
}

static uint64_t reduced(ccs_dtype_t t, ccs_redop_t op, uint64_t seed, int n, size_t i) {
  uint64_t v[17];
  for (int p = 0; p < n; p++) v[p] = input_value(t, op, seed, p, i);
  return ref_reduce_bits(t, op, op == CCS_AVG ? (size_t)n : 0, v, n);
}

/* Runs the n schedules on real buffers; fills the parties' work buffers. */
static void run(enum sched_coll c, int n, int root, const struct schedule *s, size_t count,
                ccs_dtype_t t, ccs_redop_t op, uint64_t seed, struct party *pt, const char *what) {
  size_t sz = ccs_dtype_size(t);
  uint32_t nb = s[0].nblocks;
  size_t elems = sched_coll_splits(c) ? count : count * nb;
  struct msg **qh = calloc((size_t)n * n, sizeof(*qh)), **qt = calloc((size_t)n * n, sizeof(*qt));
  for (int p = 0; p < n; p++) {
    pt[p].work = calloc(elems + 1, sz);
    pt[p].input = calloc(elems + 1, sz);
    pt[p].pc = 0;
    /* the starting state the schedule layer defines (schedule.h) */
    for (uint32_t b = 0; b < nb; b++) {
      size_t begin, len;
      sched_block_elems(c, count, nb, b, &begin, &len);
      int owns = sched_shape_has(c, root, p, b);
      for (size_t i = begin; i < begin + len; i++) {
        /* element i of the whole op; all_gather-like: participant p's own */
        uint64_t v = input_value(t, op, seed, c == SCHED_ALL_TO_ALL ? p * 1000 + (int)b : p, i);
        if (c == SCHED_ALL_TO_ALL) ref_set_bits(t, pt[p].input, i, v);
        else if (owns) ref_set_bits(t, pt[p].work, i, v);
      }
    }
  }
  for (int progress = 1; progress;) {
    progress = 0;
    for (int p = 0; p < n; p++) {
      while (pt[p].pc < s[p].nsteps) {
        const struct sched_step *st = &s[p].steps[pt[p].pc];
        size_t begin, len;
        sched_block_elems(c, count, nb, st->block, &begin, &len);
        char *w = pt[p].work + begin * sz;
        if (st->op == SCHED_SEND) {
          struct msg *m = malloc(sizeof(*m));
          m->bytes = len * sz;
          m->data = malloc(m->bytes + 1);
          memcpy(m->data, (st->buf == SCHED_INPUT ? pt[p].input : pt[p].work) + begin * sz, m->bytes);
          m->next = NULL;
          int k = p * n + st->peer;
          if (qt[k]) qt[k]->next = m;
          else qh[k] = m;
          qt[k] = m;
        } else if (st->op == SCHED_RECV || st->op == SCHED_RECV_REDUCE) {
          int k = st->peer * n + p;
          if (!qh[k]) break;
          struct msg *m = qh[k];
          qh[k] = m->next;
          if (!qh[k]) qt[k] = NULL;
          if (m->bytes != len * sz) fail_msg("%s: message of %zu bytes into a block of %zu", what, m->bytes, len * sz);
          if (st->op == SCHED_RECV) {
            memcpy(w, m->data, m->bytes);
          } else {
            const void *in[2] = {w, m->data};
            void *out[1] = {w};
            ccs__reduce_host(t, op, 0, in, 2, out, 1, 0, len, 0);
          }
          free(m->data);
          free(m);
        } else if (st->op == SCHED_COPY) {
          size_t sb, sl;
          sched_block_elems(c, count, nb, st->src_block, &sb, &sl);
          memcpy(w, (st->src_buf == SCHED_INPUT ? pt[p].input : pt[p].work) + sb * sz, sl * sz);
        } else if (st->op == SCHED_FINALIZE && op == CCS_AVG) {
          const void *in[1] = {w};
          void *out[1] = {w};
          ccs__reduce_host(t, op, (size_t)n, in, 1, out, 1, 0, len, 0);
        }
        pt[p].pc++;
        progress = 1;
      }
    }
  }
  for (int p = 0; p < n; p++)
    if (pt[p].pc != s[p].nsteps) fail_msg("%s: participant %d stuck at step %zu", what, p, pt[p].pc);
  free(qh);
  free(qt);
}

static int check_results(enum sched_coll c, int n, int root, uint32_t nb, size_t count,
                         ccs_dtype_t t, ccs_redop_t op, uint64_t seed, struct party *pt,
                         const char *what) {
  int wrong = 0;
  for (int p = 0; p < n; p++)
    for (uint32_t b = 0; b < nb; b++) {
      size_t begin, len;
      sched_block_elems(c, count, nb, b, &begin, &len);
      struct sched_want w = sched_shape_want(c, root, p, b); /* shape.h */
      if (w.kind == SCHED_WANT_NOTHING) continue;
      for (size_t i = begin; i < begin + len; i++) {
        uint64_t want;
        if (w.kind == SCHED_WANT_REDUCED) want = reduced(t, op, seed, n, i);
        else if (c == SCHED_ALL_TO_ALL) /* participant from's input block `block` */
          want = input_value(t, op, seed, w.from * 1000 + (int)w.block, (size_t)w.block * count + (i - begin));
        else want = input_value(t, op, seed, w.from, i);
        uint64_t got = ref_get_bits(t, pt[p].work, i);
        if (!ref_same_bits(t, got, want) && wrong++ < 3)
          fprintf(stderr, "%s: participant %d element %zu: got 0x%llx want 0x%llx\n", what, p, i,
                  (unsigned long long)got, (unsigned long long)want);
      }
    }
  return wrong;
}

static void test_every_algorithm(void **state) {
  uint64_t seed = test_seed();
  int proven = 0, unsupported = 0;
  for (int a = 0; a < SCHED_ALGO_COUNT; a++)
    for (int c = 0; c < SCHED_COLL_COUNT; c++)
      for (int n = 1; n <= 17; n++) {
        size_t sizes[5] = {0, 1, 7, (size_t)n + 3, 4099};
        int root = (a + c + n) % n, pipeline = 1 + (n + c) % 3;
        struct schedule s[17];
        int rc = 0, builds = algo_table_builds(sched_algo_name(a), sched_coll_name(c));
        for (int p = 0; p < n && rc == 0; p++)
          rc = sched_build((enum sched_algo)a, (enum sched_coll)c, n, p, root, pipeline, &s[p]);
        if (rc == -1) { /* this algorithm does not build this collective */
          if (builds)
            fail_msg("%s does not build %s for n=%d: the table says it does", sched_algo_name(a),
                     sched_coll_name(c), n);
          unsupported++;
          continue;
        }
        assert_int_equal(rc, 0);
        if (!builds)
          fail_msg("%s builds %s for n=%d: the table says it does not", sched_algo_name(a),
                   sched_coll_name(c), n);
        char what[128], err[256];
        snprintf(what, sizeof(what), "%s %s n=%d root=%d pipeline=%d", sched_algo_name(a),
                 sched_coll_name(c), n, root, pipeline);
        if (sched_check((enum sched_coll)c, n, root, s, err, sizeof(err)))
          fail_msg("%s: %s", what, err);
        for (int k = 0; k < 5; k++) {
          size_t combo = (size_t)(a * 7 + c * 5 + n * 3 + k) % NCOMBOS;
          struct party pt[17];
          run(c, n, root, s, sizes[k], combos[combo].t, combos[combo].op, seed + (uint64_t)k, pt, what);
          int wrong = check_results(c, n, root, s[0].nblocks, sizes[k], combos[combo].t,
                                    combos[combo].op, seed + (uint64_t)k, pt, what);
          for (int p = 0; p < n; p++) {
            free(pt[p].work);
            free(pt[p].input);
          }
          if (wrong) fail_msg("%s count=%zu %s %s: %d wrong", what, sizes[k],
                              ccs_dtype_name(combos[combo].t), ccs_redop_name(combos[combo].op), wrong);
        }
        for (int p = 0; p < n; p++) sched_free(&s[p]);
        proven++;
      }
  fprintf(stderr, "# %d (algorithm, collective, n) schedules proven; %d not built\n", proven, unsupported);
  assert_int_equal(SCHED_ALGO_COUNT, ALGO_TABLE_ALGOS);
  assert_int_equal(SCHED_COLL_COUNT, ALGO_TABLE_COLLS);
  assert_int_equal(proven, algo_table_pairs() * 17);
  assert_int_equal(unsupported, (ALGO_TABLE_ALGOS * ALGO_TABLE_COLLS - algo_table_pairs()) * 17);
}

/* The checker itself must catch broken schedules. */
static void test_checker_catches_errors(void **state) {
  char err[256];
  struct schedule s[3];
  for (int p = 0; p < 3; p++) assert_int_equal(sched_build(SCHED_RING, SCHED_ALL_REDUCE, 3, p, 0, 1, &s[p]), 0);
  assert_int_equal(sched_check(SCHED_ALL_REDUCE, 3, 0, s, err, sizeof(err)), 0);
  s[1].steps[1].block = (s[1].steps[1].block + 1) % 3; /* reduce into the wrong block */
  assert_int_equal(sched_check(SCHED_ALL_REDUCE, 3, 0, s, err, sizeof(err)), -1);
  s[1].steps[1].block = (s[1].steps[1].block + 2) % 3;
  s[2].nsteps--; /* a send never received */
  assert_int_equal(sched_check(SCHED_ALL_REDUCE, 3, 0, s, err, sizeof(err)), -1);
  s[2].nsteps++;
  s[0].steps[0].op = SCHED_RECV; /* everyone waits: deadlock */
  s[0].steps[0].peer = 2;
  assert_int_equal(sched_check(SCHED_ALL_REDUCE, 3, 0, s, err, sizeof(err)), -1);
  for (int p = 0; p < 3; p++) sched_free(&s[p]);
  char dump[4096];
  assert_int_equal(sched_build(SCHED_RING, SCHED_ALL_REDUCE, 5, 2, 0, 1, &s[0]), 0);
  sched_dump(&s[0], 2, dump, sizeof(dump));
  assert_non_null(strstr(dump, "recv+reduce"));
  sched_free(&s[0]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_algorithm),
      cmocka_unit_test(test_checker_catches_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
