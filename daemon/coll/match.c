/* Matching: op #k of a comm runs when every rank submitted its k-th
 * collective and all agree on what it is; a send runs when the matching
 * receive arrives (first-in first-out per ordered pair of ranks, as NCCL
 * and MPI match them). Disagreement is an error for every rank involved,
 * with a text that names who differs in what, never a hang. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "base/log.h"

void ccsd_post_finish(struct post *p, ccs_result_t status, const char *error) {
  if (!p->replied) {
    p->replied = 1;
    p->ops->reply(p, status, error);
  }
  p->ops->release(p);
}

int ccsd_slot_has(const struct slot *sl, int rank) {
  return (sl->posted[rank / 64] >> (rank % 64)) & 1;
}

static void slot_free(struct slot *sl) {
  free(sl->posts);
  free(sl);
}

static struct slot *slot_new(struct comm *c, uint64_t seq) {
  struct slot *sl = calloc(1, sizeof(*sl) + sizeof(uint64_t) * ((size_t)c->nranks + 63) / 64);
  if (sl) sl->seq = seq, sl->opened_ms = ccsd_fresh_ms_of(c->co);
  return sl;
}

struct slot *ccsd_slot_of(struct comm *c, struct post *const *posts, int n, uint64_t seq) {
  struct slot *sl = slot_new(c, seq);
  if (sl && !(sl->posts = malloc(sizeof(*sl->posts) * (size_t)(n ? n : 1)))) {
    free(sl);
    return NULL;
  }
  for (int i = 0; sl && i < n; i++) {
    if (!posts[i]) continue;
    int r = posts[i]->member->rank;
    sl->posted[r / 64] |= (uint64_t)1 << (r % 64);
    sl->posts[sl->nposted++] = posts[i];
  }
  if (sl) sl->cap = n;
  return sl;
}

void ccsd_slot_drop(struct slot *sl, ccs_result_t status, const char *error) {
  list_remove(&sl->link);
  for (int i = 0; i < sl->nposted; i++) ccsd_post_finish(sl->posts[i], status, error);
  slot_free(sl);
}

void ccsd_comm_fail_pending(struct comm *c) {
  struct list *it, *tmp;
  struct list *pending[2] = {&c->slots, &c->queued};
  for (int k = 0; k < 2; k++)
    LIST_FOREACH_SAFE(it, tmp, pending[k]) {
      ccsd_slot_drop(LIST_ENTRY(it, struct slot, link), c->error, c->error_text);
    }
  LIST_FOREACH_SAFE(it, tmp, &c->p2p) {
    struct post *p = LIST_ENTRY(it, struct post, link);
    list_remove(&p->link);
    ccsd_post_finish(p, c->error, c->error_text);
  }
  LIST_FOREACH_SAFE(it, tmp, &c->running) {
    atomic_store(&LIST_ENTRY(it, struct xop, comm_link)->run.cancelled, 1);
  }
  ccsd_agree_release(c);
  ccsd_hold_end(c);
}

int ccsd_op_sig_describe(char *buf, size_t len, const struct op_sig *s) {
  int n = snprintf(buf, len, "%s(count=%llu, dtype=%s", ccs__coll_name(s->kind),
                   (unsigned long long)s->count, ccs_dtype_name((ccs_dtype_t)s->dtype));
  if (ccs__coll_has_redop(s->kind))
    n += snprintf(buf + n, len - (size_t)n, ", op=%s", ccs_redop_name((ccs_redop_t)s->redop));
  if (ccs__coll_has_root(s->kind)) n += snprintf(buf + n, len - (size_t)n, ", root=%d", s->root);
  if (s->whole_count)
    n += snprintf(buf + n, len - (size_t)n, ", a part of a call of count=%llu",
                  (unsigned long long)s->whole_count);
  n += snprintf(buf + n, len - (size_t)n, ")");
  return n;
}

int ccsd_op_sig_same(const struct op_sig *a, const struct op_sig *b) {
  if (a->kind != b->kind || a->count != b->count || a->dtype != b->dtype ||
      a->whole_count != b->whole_count)
    return 0;
  if (ccs__coll_has_redop(a->kind) && a->redop != b->redop) return 0;
  if (ccs__coll_has_root(a->kind) && a->root != b->root) return 0;
  return 1;
}

uint64_t ccsd_op_sig_key(const struct op_sig *s) {
  uint64_t parts[5] = {s->kind, s->count, s->dtype, ccs__coll_has_redop(s->kind) ? s->redop : 0,
                       ccs__coll_has_root(s->kind) ? (uint64_t)(uint32_t)s->root : 0};
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 5; i++) h = (h ^ parts[i]) * 0x100000001b3ull + (h >> 29);
  return h;
}

struct op_sig ccsd_op_sig_of(const struct post *p) {
  return (struct op_sig){p->kind, p->dtype, p->redop, p->count, p->root, p->whole_count};
}

/* "all_reduce(count=8, dtype=float, op=sum)" */
static int describe(char *buf, size_t len, const struct post *p) {
  struct op_sig s = ccsd_op_sig_of(p);
  return ccsd_op_sig_describe(buf, len, &s);
}

static int same_op(const struct post *a, const struct post *b) {
  struct op_sig sa = ccsd_op_sig_of(a), sb = ccsd_op_sig_of(b);
  return ccsd_op_sig_same(&sa, &sb);
}

/* Fills err and returns 1 when the n posts of op #seq disagree. */
static int check_mismatch(struct post **posts, int n, uint64_t seq, char *err, size_t len) {
  size_t used = 0;
  int bad = 0;
  struct post *first = posts[0];
  for (int r = 0; r < n; r++) {
    if (same_op(first, posts[r])) continue;
    if (bad == 0) {
      used = (size_t)snprintf(err, len, "op #%llu differs across ranks: rank %d called ",
                              (unsigned long long)seq, first->member->rank);
      used += (size_t)describe(err + used, len - used, first);
    }
    if (++bad <= 8 && used + 200 < len) {
      used += (size_t)snprintf(err + used, len - used, "; rank %d called ", posts[r]->member->rank);
      used += (size_t)describe(err + used, len - used, posts[r]);
    }
  }
  if (bad > 8 && used + 40 < len) snprintf(err + used, len - used, "; and %d more", bad - 8);
  return bad > 0;
}

/* Some ranks cut a large staged call in parts (client/parts.c: whether
 * they do depends on their buffers) and the others made it whole: the
 * first parts are answered CCS__RESULT_WHOLE and leave sl, whose whole
 * posts wait for their ranks to make the call whole. 1 when sl was such a
 * mix (on one daemon: across daemons libccs makes no parts). */
static int parts_made_whole(struct comm *c, struct slot *sl) {
  struct post *whole = NULL;
  int parts = 0;
  for (int i = 0; i < sl->nposted; i++) {
    struct post *p = sl->posts[i];
    if (p->whole_count) parts++;
    else if (!whole) whole = p;
  }
  if (c->spans || !whole || !parts) return 0;
  struct op_sig want = ccsd_op_sig_of(whole);
  for (int i = 0; i < sl->nposted; i++) {
    struct op_sig s = ccsd_op_sig_of(sl->posts[i]);
    if (s.whole_count) s.count = s.whole_count, s.whole_count = 0; /* the call it is a part of */
    if (!ccsd_op_sig_same(&want, &s)) return 0;
  }
  int kept = 0;
  sl->ordered = 0;
  for (int i = 0; i < sl->nposted; i++) {
    struct post *p = sl->posts[i];
    if (!p->whole_count) {
      sl->posts[kept++] = p;
      sl->ordered |= p->ordered;
      continue;
    }
    int r = p->member->rank;
    sl->posted[r / 64] &= ~((uint64_t)1 << (r % 64));
    p->member->coll_seq--; /* its whole call takes this op's number */
    ccsd_post_finish(p, CCS__RESULT_WHOLE, "other ranks make this call whole: so does this one");
  }
  sl->nposted = kept;
  return 1;
}

/* Back among the slots, in order. */
static void slot_reinsert(struct comm *c, struct slot *sl) {
  struct list *it;
  for (it = c->slots.next; it != &c->slots; it = it->next)
    if (LIST_ENTRY(it, struct slot, link)->seq > sl->seq) break;
  list_insert_tail(it, &sl->link); /* (before it) */
}

/* "0-2,5 (pids 11, 12, 13, 16)" of the ranks whose post in sl is (not) there */
static void rank_list(char *buf, size_t len, const struct comm *c, const struct slot *sl,
                      int posted, int with_pids) {
  size_t n = 0;
  int listed = 0;
  buf[0] = 0;
  for (int r = 0; r < c->nranks && n + 40 < len; r++) {
    if (ccsd_slot_has(sl, r) != posted || c->members[r]->remote) continue;
    if (listed++ == 8) {
      n += (size_t)snprintf(buf + n, len - n, ", ...");
      break;
    }
    const struct member *m = c->members[r];
    if (with_pids)
      n += (size_t)snprintf(buf + n, len - n, "%srank %d (pid %d)", n ? ", " : "", r, (int)m->pid);
    else
      n += (size_t)snprintf(buf + n, len - n, "%s%d", n ? "," : "", r);
  }
}

static void on_op_timer(uv_timer_t *t) { ccsd_comm_check_deadlines(t->data); }

/* Fails the comm when its oldest pending op is past the deadline, naming
 * who has not called it; otherwise arms the timer for the next deadline. */
void ccsd_comm_check_deadlines(struct comm *c) {
  if (c->state != COMM_READY || c->hold) return; /* held: the hold's own deadline */
  uint64_t now = ccsd_now_ms_of(c->co), limit = (uint64_t)(c->op_timeout_s * 1000);
  const struct slot *sl = list_empty(&c->slots) ? NULL : LIST_ENTRY(c->slots.next, struct slot, link);
  const struct post *p = list_empty(&c->p2p) ? NULL : LIST_ENTRY(c->p2p.next, struct post, link);
  if (sl && now - sl->opened_ms >= limit) {
    const struct post *any = sl->posts[0];
    char missing[512], waiting[256];
    rank_list(missing, sizeof(missing), c, sl, 0, 1);
    rank_list(waiting, sizeof(waiting), c, sl, 1, 0);
    ccsd_comm_fail(c, CCS_ERR_TIMEOUT, "%s %s not called %s #%llu; rank(s) %s waited %.1f s",
                   missing, c->nlocal - sl->nposted > 1 ? "have" : "has",
                   ccs__coll_name(any->kind), (unsigned long long)sl->seq, waiting,
                   (double)(now - sl->opened_ms) / 1000.0);
    return;
  }
  if (p && now - p->posted_ms >= limit) {
    const struct member *peer = c->members[p->root];
    int send = p->kind == CCS__SEND;
    ccsd_comm_fail(c, CCS_ERR_TIMEOUT,
                   "rank %d (pid %d) has not posted the %s matching rank %d's %s; rank %d "
                   "waited %.1f s",
                   p->root, (int)peer->pid, send ? "recv" : "send", p->member->rank,
                   send ? "send" : "recv", p->member->rank, (double)(now - p->posted_ms) / 1000.0);
    return;
  }
  /* an op this daemon launched, waiting for other daemons' data */
  const struct xop *net = NULL;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &c->running) {
    const struct xop *x = LIST_ENTRY(it, struct xop, comm_link);
    if (x->run.plan.net_items && (!net || x->launched_ms < net->launched_ms)) net = x;
  }
  if (net && now - net->launched_ms >= CCSD_AGREE_AFTER_MS) ccsd_agree_slow(c, net->seq); /* (none on a send or receive) */
  if (c->state != COMM_READY) return; /* the words disagreed */
  if (net && now - net->launched_ms >= limit) {
    ccsd_comm_fail(c, CCS_ERR_TIMEOUT,
                   "%s #%llu waited %.1f s for the ranks on other daemons (they have not called "
                   "it, or a daemon between is stuck)",
                   ccs__coll_name(net->kind), (unsigned long long)net->seq,
                   (double)(now - net->launched_ms) / 1000.0);
    return;
  }
  uint64_t next = UINT64_MAX;
  if (sl) next = sl->opened_ms + limit;
  if (p && p->posted_ms + limit < next) next = p->posted_ms + limit;
  if (net) { /* the word on it when it is slow, then its deadline */
    uint64_t speak = net->launched_ms + CCSD_AGREE_AFTER_MS;
    uint64_t at = speak > now ? speak : net->launched_ms + limit;
    if (at < next) next = at;
  }
  if (next != UINT64_MAX) uv_timer_start(&c->timer, on_op_timer, next - now, 0);
}

static void submit_p2p(struct comm *c, struct post *p) {
  uint32_t want = p->kind == CCS__SEND ? CCS__RECV : CCS__SEND;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &c->p2p) {
    struct post *q = LIST_ENTRY(it, struct post, link);
    if (q->kind != want || q->member->rank != p->root || q->root != p->member->rank) continue;
    list_remove(&q->link);
    struct post *pair[2] = {p->kind == CCS__SEND ? p : q, p->kind == CCS__SEND ? q : p};
    if (pair[0]->count != pair[1]->count || pair[0]->dtype != pair[1]->dtype) {
      char err[CCS__ERROR_TEXT_MAX];
      snprintf(err, sizeof(err),
               "rank %d sends %llu x %s to rank %d, which receives %llu x %s from it",
               pair[0]->member->rank, (unsigned long long)pair[0]->count,
               ccs_dtype_name(pair[0]->dtype), pair[1]->member->rank,
               (unsigned long long)pair[1]->count, ccs_dtype_name(pair[1]->dtype));
      ccsd_post_finish(pair[0], CCS_ERR_MISMATCH, err);
      ccsd_post_finish(pair[1], CCS_ERR_MISMATCH, err);
      return;
    }
    ccsd_op_launch(c, pair, 2, 0);
    return;
  }
  list_insert_tail(&c->p2p, &p->link);
  if (!uv_is_active((uv_handle_t *)&c->timer)) ccsd_comm_check_deadlines(c);
}

/* Op #seq's slot, if a rank posted it. Pending ops are consecutive: a
 * rank behind finds its op near the oldest, a rank ahead makes the newest,
 * so neither walks far. */
static struct slot *find_slot(struct comm *c, uint64_t seq) {
  if (list_empty(&c->slots) || LIST_ENTRY(c->slots.prev, struct slot, link)->seq < seq) return NULL;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &c->slots) {
    struct slot *each = LIST_ENTRY(it, struct slot, link);
    if (each->seq == seq) return each;
  }
  return NULL;
}

/* Op #sl->seq, matched and agreed: launched, and its slot gone. */
static void launch_slot(struct comm *c, struct slot *sl) {
  struct post **by_rank = calloc((size_t)c->nranks, sizeof(*by_rank));
  if (!by_rank) {
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory launching op #%llu", (unsigned long long)sl->seq);
    for (int i = 0; i < sl->nposted; i++) ccsd_post_finish(sl->posts[i], c->error, c->error_text);
  } else { /* ranks of other daemons have no post here */
    for (int i = 0; i < sl->nposted; i++) by_rank[sl->posts[i]->member->rank] = sl->posts[i];
    ccsd_op_launch(c, by_rank, c->nranks, sl->seq);
  }
  free(by_rank);
  slot_free(sl);
}

/* A launch inside (an op that finishes at once) finds this under way and
 * leaves the next to the loop here: no recursion however many wait. */
void ccsd_comm_launch_queued(struct comm *c) {
  if (c->launching) return;
  c->launching = 1;
  while (c->state == COMM_READY && !c->hold && !ccsd_comm_drained(c) && list_empty(&c->running) &&
         !list_empty(&c->queued)) {
    struct slot *sl = LIST_ENTRY(c->queued.next, struct slot, link);
    list_remove(&sl->link);
    launch_slot(c, sl);
  }
  c->launching = 0;
}

void ccsd_post_submit(struct post *p) {
  struct comm *c = p->member->comm;
  int p2p = ccsd_p2p_kind(p->kind);
  /* An op that needs a rank which destroyed its handle can never run. */
  const struct member *peer = p2p ? c->members[p->root] : NULL;
  const struct member *gone = c->state != COMM_READY ? NULL
                              : p2p ? (!peer->left || peer->remote ? NULL : peer)
                                    : ccsd_comm_departed(c);
  if (gone)
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "rank %d (pid %d) destroyed the communicator",
                   gone->rank, (int)gone->pid);
  if (c->state != COMM_READY) {
    ccsd_post_finish(p, c->error, c->error_text);
    return;
  }
  if (p2p && peer->remote) { /* its half runs alone; the other daemon runs the other */
    /* (launched while the daemon drains: a message already sent to it is
     * taken, and a send of it lets its receiver finish) */
    if (c->hold) ccsd_hold_defer(c, p);
    else ccsd_op_launch(c, &p, 1, 0);
    return;
  }
  if (p2p) {
    submit_p2p(c, p);
    return;
  }
  uint64_t seq = ++p->member->coll_seq;
  struct slot *sl = find_slot(c, seq);
  struct post **grown = NULL;
  if (!sl && (sl = slot_new(c, seq))) {
    /* ranks submit in order: a new op is the newest (find_slot) */
    list_insert_tail(&c->slots, &sl->link);
    if (!uv_is_active((uv_handle_t *)&c->timer)) ccsd_comm_check_deadlines(c);
  }
  if (sl && sl->nposted == sl->cap) {
    int cap = sl->cap ? 2 * sl->cap : 4;
    if ((grown = realloc(sl->posts, sizeof(*grown) * (size_t)cap))) sl->posts = grown, sl->cap = cap;
  }
  if (!sl || sl->nposted == sl->cap) {
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory matching op #%llu", (unsigned long long)seq);
    ccsd_post_finish(p, c->error, c->error_text);
    return;
  }
  p->seq = seq;
  sl->ordered |= p->ordered;
  int r = p->member->rank;
  sl->posted[r / 64] |= (uint64_t)1 << (r % 64);
  sl->posts[sl->nposted++] = p;
  if (sl->nposted < c->nlocal) return; /* other daemons' ranks: their daemons */

  list_remove(&sl->link);
  char err[CCS__ERROR_TEXT_MAX];
  if (parts_made_whole(c, sl)) {
    slot_reinsert(c, sl);
  } else if (check_mismatch(sl->posts, sl->nposted, seq, err, sizeof(err))) {
    LOG_WARN("comm %llu: %s", (unsigned long long)c->id, err);
    /* Across daemons the others run op #seq without this one's data and
     * would wait for it: the comm fails everywhere, with this text. */
    if (c->spans) ccsd_comm_fail(c, CCS_ERR_MISMATCH, "%s", err);
    for (int i = 0; i < sl->nposted; i++) ccsd_post_finish(sl->posts[i], CCS_ERR_MISMATCH, err);
    slot_free(sl);
  } else if (c->hold || ccsd_comm_drained(c) || (sl->ordered && (!list_empty(&c->running) || !list_empty(&c->queued)))) {
    /* a host stream's op may read what the one before writes; a held
     * comm's wait for the daemon that went, a stopping daemon's for its
     * restart */
    list_insert_tail(&c->queued, &sl->link);
  } else {
    launch_slot(c, sl);
  }
}
