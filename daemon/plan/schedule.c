/* Schedules as data: the step list, its names, and widening a schedule of
 * groups into its members' blocks (builders and the checker use these;
 * build.c says which builder makes what). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/schedule.h"

static const char *const coll_names[SCHED_COLL_COUNT] = {
    "all_reduce", "reduce_scatter", "reduce", "all_gather",
    "gather",     "broadcast",      "scatter", "all_to_all"};
static const char *const algo_names[SCHED_ALGO_COUNT] = {"direct", "ring", "tree", "rhd"};

const char *sched_coll_name(enum sched_coll c) {
  return (unsigned)c < SCHED_COLL_COUNT ? coll_names[c] : "unknown";
}
const char *sched_algo_name(enum sched_algo a) {
  return (unsigned)a < SCHED_ALGO_COUNT ? algo_names[a] : "unknown";
}

void sched_init(struct schedule *s, uint32_t nblocks) {
  memset(s, 0, sizeof(*s));
  s->nblocks = nblocks;
}

void sched_free(struct schedule *s) {
  if (!s) return;
  free(s->steps);
  memset(s, 0, sizeof(*s));
}

static struct sched_step *append(struct schedule *s) {
  if (s->failed) return NULL;
  if (s->nsteps == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 16;
    struct sched_step *grown = realloc(s->steps, cap * sizeof(*grown));
    if (!grown) {
      s->failed = 1;
      return NULL;
    }
    s->steps = grown;
    s->cap = cap;
  }
  return &s->steps[s->nsteps++];
}

static void add(struct schedule *s, struct sched_step step) {
  struct sched_step *st = append(s);
  if (st) *st = step;
}

void sched_add(struct schedule *s, uint8_t op, int32_t peer, uint32_t block) {
  add(s, (struct sched_step){.op = op, .peer = peer, .block = block});
}

void sched_add_send_input(struct schedule *s, int32_t peer, uint32_t block) {
  add(s, (struct sched_step){.op = SCHED_SEND, .buf = SCHED_INPUT, .peer = peer, .block = block});
}

void sched_add_copy(struct schedule *s, uint8_t src_buf, uint32_t src_block, uint32_t block) {
  add(s, (struct sched_step){.op = SCHED_COPY, .src_buf = src_buf, .src_block = src_block,
                             .block = block});
}

int sched_expand(struct schedule *s, const int *first) {
  struct schedule out;
  sched_init(&out, (uint32_t)first[s->nblocks]);
  for (size_t i = 0; i < s->nsteps; i++) {
    const struct sched_step *st = &s->steps[i];
    uint32_t width = (uint32_t)(first[st->block + 1] - first[st->block]);
    if (st->op == SCHED_COPY &&
        (uint32_t)(first[st->src_block + 1] - first[st->src_block]) != width) {
      sched_free(&out);
      return -1;
    }
    for (uint32_t j = 0; j < width; j++) {
      struct sched_step sub = *st;
      sub.block = (uint32_t)first[st->block] + j;
      if (st->op == SCHED_COPY) sub.src_block = (uint32_t)first[st->src_block] + j;
      add(&out, sub);
    }
  }
  int rc = out.failed ? -2 : 0;
  sched_free(s);
  *s = out;
  if (rc) sched_free(s);
  return rc;
}

void sched_dump(const struct schedule *s, int me, char *buf, size_t len) {
  static const char *const ops[] = {"?", "send", "recv", "recv+reduce", "copy", "finalize"};
  size_t n = (size_t)snprintf(buf, len, "participant %d: %u blocks, %zu steps\n", me, s->nblocks,
                              s->nsteps);
  for (size_t i = 0; i < s->nsteps && n < len; i++) {
    const struct sched_step *st = &s->steps[i];
    const char *op = st->op <= SCHED_FINALIZE ? ops[st->op] : "?";
    if (st->op == SCHED_COPY)
      n += (size_t)snprintf(buf + n, len - n, "  %3zu %-12s %s[%u] -> work[%u]\n", i, op,
                            st->src_buf ? "input" : "work", st->src_block, st->block);
    else if (st->op == SCHED_FINALIZE)
      n += (size_t)snprintf(buf + n, len - n, "  %3zu %-12s work[%u]\n", i, op, st->block);
    else
      n += (size_t)snprintf(buf + n, len - n, "  %3zu %-12s %s[%u] %s %d\n", i, op,
                            st->buf ? "input" : "work", st->block,
                            st->op == SCHED_SEND ? "to" : "from", st->peer);
  }
}
