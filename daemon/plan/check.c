/* The schedule checker: runs every participant's schedule symbolically.
 * A block's content is where it came from (the logical block index, and
 * the set of participants whose contribution it holds) — enough to catch a
 * send of a block never written, a contribution counted twice, a reduction
 * across different blocks, a receive with no send (deadlock), a send never
 * received, and a final state other than the collective's. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/schedule.h"
#include "plan/shape.h"

struct content {
  uint8_t valid, finalized, from_input;
  uint32_t block;
  uint64_t mask;
};

struct msg {
  struct content c;
  struct msg *next;
};

struct queue {
  struct msg *head, *tail;
};

struct party {
  struct content *work, *input;
  size_t pc;
};

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

/* The starting state (shape.h): all_to_all's values are in the input
 * buffer, every other collective's in the work buffer. */
static void init_party(enum sched_coll c, int n, int root, int p, uint32_t nb, struct party *pt) {
  int input = c == SCHED_ALL_TO_ALL;
  for (uint32_t b = 0; b < nb; b++)
    if (sched_shape_has(c, root, p, b))
      (input ? pt->input : pt->work)[b] = (struct content){1, 0, input, b, 1ull << p};
  (void)n;
}

/* Does participant p's block b hold what the collective leaves there? */
static int final_ok(enum sched_coll c, int n, int root, int p, uint32_t b, const struct content *w) {
  uint64_t all = n == 64 ? ~0ull : (1ull << n) - 1;
  struct sched_want want = sched_shape_want(c, root, p, b);
  switch (want.kind) {
  case SCHED_WANT_REDUCED: return w->valid && w->finalized && w->block == b && w->mask == all;
  case SCHED_WANT_COPY:
    return w->valid && w->block == want.block && w->mask == 1ull << want.from &&
           w->from_input == (c == SCHED_ALL_TO_ALL);
  default: return 1;
  }
}

int sched_check(enum sched_coll c, int n, int root, const struct schedule *scheds, char *err,
                size_t errlen) {
  if (n < 1 || n > 64) return fail(err, errlen, "the checker handles 1..64 participants");
  uint32_t nb = scheds[0].nblocks;
  for (int p = 0; p < n; p++)
    if (scheds[p].nblocks != nb)
      return fail(err, errlen, "participants disagree on the number of blocks");
  struct party *pt = calloc((size_t)n, sizeof(*pt));
  struct queue *q = calloc((size_t)n * n, sizeof(*q)); /* q[src * n + dst] */
  int rc = 0;
  if (!pt || !q) rc = fail(err, errlen, "out of memory");
  for (int p = 0; p < n && !rc; p++) {
    pt[p].work = calloc(nb ? nb : 1, sizeof(struct content));
    pt[p].input = calloc(nb ? nb : 1, sizeof(struct content));
    if (!pt[p].work || !pt[p].input) rc = fail(err, errlen, "out of memory");
    else init_party(c, n, root, p, nb, &pt[p]);
  }
  for (int progress = 1; progress && !rc;) {
    progress = 0;
    for (int p = 0; p < n && !rc; p++) {
      while (pt[p].pc < scheds[p].nsteps && !rc) {
        const struct sched_step *st = &scheds[p].steps[pt[p].pc];
        if (st->block >= nb || (st->op == SCHED_COPY && st->src_block >= nb)) {
          rc = fail(err, errlen, "participant %d step %zu: block out of range", p, pt[p].pc);
          break;
        }
        if ((st->op == SCHED_SEND || st->op == SCHED_RECV || st->op == SCHED_RECV_REDUCE) &&
            (st->peer < 0 || st->peer >= n || st->peer == p)) {
          rc = fail(err, errlen, "participant %d step %zu: bad peer %d", p, pt[p].pc, st->peer);
          break;
        }
        struct content *w = &pt[p].work[st->block];
        if (st->op == SCHED_SEND) {
          const struct content *src = st->buf == SCHED_INPUT ? &pt[p].input[st->block] : w;
          if (!src->valid) {
            rc = fail(err, errlen, "participant %d step %zu sends block %u before it is written", p, pt[p].pc, st->block);
            break;
          }
          struct msg *m = malloc(sizeof(*m));
          if (!m) {
            rc = fail(err, errlen, "out of memory");
            break;
          }
          m->c = *src;
          m->next = NULL;
          struct queue *qq = &q[p * n + st->peer];
          if (qq->tail) qq->tail->next = m;
          else qq->head = m;
          qq->tail = m;
        } else if (st->op == SCHED_RECV || st->op == SCHED_RECV_REDUCE) {
          struct queue *qq = &q[st->peer * n + p];
          if (!qq->head) break; /* blocked: try the others */
          struct msg *m = qq->head;
          qq->head = m->next;
          if (!qq->head) qq->tail = NULL;
          struct content in = m->c;
          free(m);
          if (st->op == SCHED_RECV) {
            *w = in;
          } else if (!w->valid || w->finalized || in.finalized || w->block != in.block ||
                     (w->mask & in.mask)) {
            rc = fail(err, errlen,
                      "participant %d step %zu reduces block %u wrongly (%s)", p, pt[p].pc,
                      st->block, !w->valid ? "into nothing" : w->block != in.block ? "across blocks"
                                 : (w->mask & in.mask) ? "a contribution twice" : "after finalize");
            break;
          } else {
            w->mask |= in.mask;
          }
        } else if (st->op == SCHED_COPY) {
          const struct content *src = st->src_buf == SCHED_INPUT ? &pt[p].input[st->src_block]
                                                                  : &pt[p].work[st->src_block];
          if (!src->valid) {
            rc = fail(err, errlen, "participant %d step %zu copies an unwritten block", p, pt[p].pc);
            break;
          }
          *w = *src;
        } else if (st->op == SCHED_FINALIZE) {
          uint64_t all = n == 64 ? ~0ull : (1ull << n) - 1;
          if (!w->valid || w->finalized || w->mask != all) {
            rc = fail(err, errlen, "participant %d step %zu finalizes block %u %s", p, pt[p].pc,
                      st->block, w->finalized ? "twice" : "before every contribution is in");
            break;
          }
          w->finalized = 1;
        } else {
          rc = fail(err, errlen, "participant %d step %zu: unknown op %u", p, pt[p].pc, st->op);
          break;
        }
        pt[p].pc++;
        progress = 1;
      }
    }
  }
  for (int p = 0; p < n && !rc; p++)
    if (pt[p].pc < scheds[p].nsteps)
      rc = fail(err, errlen, "deadlock: participant %d waits at step %zu for participant %d", p,
                pt[p].pc, scheds[p].steps[pt[p].pc].peer);
  for (int i = 0; i < n * n && !rc; i++)
    if (q[i].head) rc = fail(err, errlen, "participant %d sent to %d what was never received", i / n, i % n);
  for (int p = 0; p < n && !rc; p++)
    for (uint32_t b = 0; b < nb && !rc; b++)
      if (!final_ok(c, n, root, p, b, &pt[p].work[b]))
        rc = fail(err, errlen, "participant %d ends with block %u wrong for %s", p, b, sched_coll_name(c));
  for (int i = 0; q && i < n * n; i++)
    while (q[i].head) {
      struct msg *m = q[i].head;
      q[i].head = m->next;
      free(m);
    }
  for (int p = 0; pt && p < n; p++) {
    free(pt[p].work);
    free(pt[p].input);
  }
  free(pt);
  free(q);
  return rc;
}
