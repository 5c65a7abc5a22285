/* Matching: op #k of a comm runs when every rank submitted its k-th
 * collective and all agree on what it is; a send runs when the matching
 * receive arrives (first-in first-out per ordered pair of ranks, as NCCL
 * and MPI match them). Disagreement is an error for every rank involved,
 * with a text that names who differs in what, never a hang. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "log.h"

void ccsd_post_free(struct post *p) {
  ccsd_membuf_unref(p->sendbuf);
  ccsd_membuf_unref(p->recvbuf);
  free(p);
}

static void post_finish(struct post *p, ccs_result_t status, const char *error) {
  ccsd_submission_post_done(p->sub, status, error);
  ccsd_post_free(p);
}

void ccsd_comm_fail_pending(struct comm *c) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &c->slots) {
    struct slot *sl = LIST_ENTRY(it, struct slot, link);
    list_remove(&sl->link);
    for (int r = 0; r < c->nranks; r++)
      if (sl->posts[r]) post_finish(sl->posts[r], c->error, c->error_text);
    free(sl->posts);
    free(sl);
  }
  LIST_FOREACH_SAFE(it, tmp, &c->p2p) {
    struct post *p = LIST_ENTRY(it, struct post, link);
    list_remove(&p->link);
    post_finish(p, c->error, c->error_text);
  }
  LIST_FOREACH_SAFE(it, tmp, &c->running) {
    atomic_store(&LIST_ENTRY(it, struct xop, comm_link)->cancelled, 1);
  }
}

/* "all_reduce(count=8, dtype=float, op=sum)" */
static int describe(char *buf, size_t len, const struct post *p) {
  int n = snprintf(buf, len, "%s(count=%llu, dtype=%s", ccs__coll_name(p->kind),
                   (unsigned long long)p->count, ccs_dtype_name(p->dtype));
  if (ccs__coll_has_redop(p->kind))
    n += snprintf(buf + n, len - (size_t)n, ", op=%s", ccs_redop_name(p->redop));
  if (ccs__coll_has_root(p->kind)) n += snprintf(buf + n, len - (size_t)n, ", root=%d", p->root);
  n += snprintf(buf + n, len - (size_t)n, ")");
  return n;
}

static int same_op(const struct post *a, const struct post *b) {
  if (a->kind != b->kind || a->count != b->count || a->dtype != b->dtype) return 0;
  if (ccs__coll_has_redop(a->kind) && a->redop != b->redop) return 0;
  if (ccs__coll_has_root(a->kind) && a->root != b->root) return 0;
  return 1;
}

/* Fills err and returns 1 when the posts of op #seq disagree. */
static int check_mismatch(struct comm *c, struct post **posts, int n, uint64_t seq, char *err,
                          size_t len) {
  size_t used = 0;
  int bad = 0;
  for (int r = 1; r < n; r++) {
    if (same_op(posts[0], posts[r])) continue;
    if (bad == 0) {
      used = (size_t)snprintf(err, len, "op #%llu differs across ranks: rank %d called ",
                              (unsigned long long)seq, posts[0]->member->rank);
      used += (size_t)describe(err + used, len - used, posts[0]);
    }
    if (++bad <= 8 && used + 200 < len) {
      used += (size_t)snprintf(err + used, len - used, "; rank %d called ", posts[r]->member->rank);
      used += (size_t)describe(err + used, len - used, posts[r]);
    }
  }
  if (bad > 8 && used + 40 < len) snprintf(err + used, len - used, "; and %d more", bad - 8);
  return bad > 0;
}

static void launch(struct comm *c, struct post **posts, int nposts, uint64_t seq) {
  char err[CCS__ERROR_TEXT_MAX] = "out of memory";
  ccs_result_t rc = CCS_ERR_NO_MEMORY;
  struct xop *x = calloc(1, sizeof(*x));
  if (x) x->posts = malloc(sizeof(*x->posts) * (size_t)nposts);
  if (x && x->posts) {
    memcpy(x->posts, posts, sizeof(*x->posts) * (size_t)nposts);
    x->comm = c;
    x->nposts = nposts;
    x->kind = posts[0]->kind;
    x->seq = seq;
    rc = ccsd_plan_direct(x, err, sizeof(err));
  }
  if (rc != CCS_OK) {
    for (int i = 0; i < nposts; i++) post_finish(posts[i], rc, err);
    ccsd_xop_free(x);
    return;
  }
  LOG_TRACE("comm %llu: %s #%llu: %zu pieces, %zu tasks", (unsigned long long)c->id,
            ccs__coll_name(x->kind), (unsigned long long)seq, x->npieces, x->ntasks);
  ccsd_comm_ref(c);
  list_insert_tail(&c->running, &x->comm_link);
  if (x->ntasks == 0) /* barrier, count 0: nothing for the executor to do */
    ccsd_xop_done(x);
  else
    ccsd_executor_submit(c->d->exec, x);
}

void ccsd_xop_done(struct xop *x) {
  struct comm *c = x->comm;
  list_remove(&x->comm_link);
  int cancelled = atomic_load(&x->cancelled);
  for (int i = 0; i < x->nposts; i++)
    post_finish(x->posts[i], cancelled ? c->error : CCS_OK, cancelled ? c->error_text : NULL);
  ccsd_xop_free(x);
  ccsd_comm_unref(c);
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
      post_finish(pair[0], CCS_ERR_MISMATCH, err);
      post_finish(pair[1], CCS_ERR_MISMATCH, err);
      return;
    }
    launch(c, pair, 2, 0);
    return;
  }
  list_insert_tail(&c->p2p, &p->link);
}

void ccsd_post_submit(struct post *p) {
  struct comm *c = p->member->comm;
  int p2p = p->kind == CCS__SEND || p->kind == CCS__RECV;
  /* An op that needs a rank which destroyed its handle can never run. */
  const struct member *gone = c->state != COMM_READY ? NULL
                              : p2p ? (c->members[p->root]->session ? NULL : c->members[p->root])
                                    : ccsd_comm_departed(c);
  if (gone)
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "rank %d (pid %d) destroyed the communicator",
                   gone->rank, (int)gone->pid);
  if (c->state != COMM_READY) {
    post_finish(p, c->error, c->error_text);
    return;
  }
  if (p2p) {
    submit_p2p(c, p);
    return;
  }
  uint64_t seq = ++p->member->coll_seq;
  struct slot *sl = NULL;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &c->slots) {
    struct slot *each = LIST_ENTRY(it, struct slot, link);
    if (each->seq == seq) {
      sl = each;
      break;
    }
  }
  if (!sl) {
    sl = calloc(1, sizeof(*sl));
    if (sl) sl->posts = calloc((size_t)c->nranks, sizeof(*sl->posts));
    if (!sl || !sl->posts) {
      free(sl);
      ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory matching op #%llu",
                     (unsigned long long)seq);
      post_finish(p, c->error, c->error_text);
      return;
    }
    sl->seq = seq;
    list_insert_tail(&c->slots, &sl->link); /* ranks submit in order: seq ascends */
  }
  p->seq = seq;
  sl->posts[p->member->rank] = p;
  if (++sl->nposted < c->nranks) return;

  list_remove(&sl->link);
  char err[CCS__ERROR_TEXT_MAX];
  if (check_mismatch(c, sl->posts, c->nranks, seq, err, sizeof(err))) {
    LOG_WARN("comm %llu: %s", (unsigned long long)c->id, err);
    for (int r = 0; r < c->nranks; r++) post_finish(sl->posts[r], CCS_ERR_MISMATCH, err);
  } else {
    launch(c, sl->posts, c->nranks, seq);
  }
  free(sl->posts);
  free(sl);
}
