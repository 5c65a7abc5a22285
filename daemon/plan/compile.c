/* Compiling an op's schedules into the engine's graph (engine.h).
 *
 * Three passes: run the schedules over symbolic values (what each block
 * holds), turn the values the outputs need into items over real pointers,
 * then order the items that overwrite memory another item still reads. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/engine.h"
#include "plan/shape.h"
#include "plan/pool.h"

enum { V_INPUT, V_REMOTE, V_REDUCE };

struct value {
  uint8_t kind, live;
  int owner;      /* V_INPUT: the participant whose input it is; V_REMOTE: the sender */
  int to;         /* V_REMOTE: the local participant it came to, as its msg-th */
  uint32_t msg;
  char *ptr;      /* V_INPUT: where it lives */
  size_t count;   /* elements */
  int *leaves;    /* V_REDUCE: the values it combines, sorted */
  int nleaves;
  size_t divisor; /* V_REDUCE: CCS_AVG's, once finalized */
  int hash_next;
  void **land; /* outputs that must end holding it */
  int nland, capland;
  int item; /* the graph item that makes it, or -1 */
};

struct msg {
  int from, value;
  struct msg *next;
};

struct access {
  uint32_t item, index; /* a read: input index of item */
  int producer;         /* a read: the item whose result it is, or -1 */
  int snap;             /* a read: the snapshot item it now reads, or -1 */
  char *ptr;
  size_t bytes;
};

struct edge {
  uint32_t from, to;
  uint8_t chunkwise;
};

/* A local participant's message to one on another daemon. */
struct net_send {
  int value, from, to;
  uint32_t msg;
  int after; /* values made before it: where it goes in the item order */
};

struct compiler {
  const struct engine_op *op;
  struct engine_plan *plan;
  size_t sz;
  uint32_t nblocks;
  struct value *vals;
  int nvals, capvals;
  int *buckets;
  size_t nbuckets;
  int **cur, **input; /* per participant, per block: a value, or -1 */
  uint32_t **sent, **got; /* local participant: messages to/from each peer so far */
  struct net_send *net;
  size_t nnet, capnet;
  int *scratch_leaves;
  int max_leaves; /* contributions to one result: participants, or ranks in groups */
  int *producer; /* per slot of plan->ptrs: the item whose result it is, or -1 */
  struct edge *edges;
  size_t nedges, capedges;
  size_t cap_items;
  ccs_result_t rc;
  char *err;
  size_t errlen;
};

static int fail(struct compiler *k, ccs_result_t rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct compiler *k, ccs_result_t rc, const char *fmt, ...) {
  if (k->rc == CCS_OK) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->err, k->errlen, fmt, ap);
    va_end(ap);
    k->rc = rc;
  }
  return -1;
}

static int oom(struct compiler *k) {
  return fail(k, CCS_ERR_NO_MEMORY, "out of memory compiling %s", sched_coll_name(k->op->coll));
}

static int grow(struct compiler *k, void **arr, size_t elem, size_t need, size_t *cap) {
  if (need <= *cap) return 0;
  size_t cap2 = *cap ? *cap * 2 : 16;
  while (cap2 < need) cap2 *= 2;
  void *p = realloc(*arr, cap2 * elem);
  if (!p) return oom(k);
  *arr = p;
  *cap = cap2;
  return 0;
}

/* --- pass 1: values ----------------------------------------------------- */

/* Block b's elements; a participant's block sits at its rank's place. */
static void block_range(const struct compiler *k, uint32_t b, size_t *begin, size_t *len) {
  sched_block_elems(k->op->coll, k->op->count, k->nblocks, b, begin, len);
  if (!sched_coll_splits(k->op->coll) && k->op->rank_of) *begin = k->op->count * (size_t)k->op->rank_of[b];
}

static int new_value(struct compiler *k, uint8_t kind, size_t count) {
  size_t cap = (size_t)k->capvals;
  if (grow(k, (void **)&k->vals, sizeof(*k->vals), (size_t)k->nvals + 1, &cap)) return -1;
  k->capvals = (int)cap;
  struct value *v = &k->vals[k->nvals];
  memset(v, 0, sizeof(*v));
  v->kind = kind;
  v->count = count;
  v->owner = -1;
  v->hash_next = -1;
  v->item = -1;
  return k->nvals++;
}

static int leaf_order(const void *a, const void *b, void *ctx) {
  int x = *(const int *)a, y = *(const int *)b;
  const struct compiler *k = ctx;
  const struct value *vx = &k->vals[x], *vy = &k->vals[y];
  if (vx->kind != vy->kind) return vx->kind < vy->kind ? -1 : 1;
  if (vx->owner != vy->owner) return vx->owner < vy->owner ? -1 : 1;
  return x < y ? -1 : x > y;
}

static size_t leaves_hash(const int *leaves, int n, size_t divisor) {
  uint64_t h = 1469598103934665603ull ^ divisor;
  for (int i = 0; i < n; i++) h = (h ^ (uint64_t)leaves[i]) * 1099511628211ull;
  return (size_t)(h ^ (h >> 29));
}

/* The reduce value over leaves (sorted here); an identical one is reused. */
static int reduce_value(struct compiler *k, int *leaves, int n, size_t divisor, size_t count) {
  qsort_r(leaves, (size_t)n, sizeof(int), leaf_order, k);
  size_t b = leaves_hash(leaves, n, divisor) & (k->nbuckets - 1);
  for (int v = k->buckets[b]; v >= 0; v = k->vals[v].hash_next) {
    const struct value *e = &k->vals[v];
    if (e->nleaves == n && e->divisor == divisor && !memcmp(e->leaves, leaves, sizeof(int) * (size_t)n))
      return v;
  }
  int *copy = malloc(sizeof(int) * (size_t)n);
  int v = copy ? new_value(k, V_REDUCE, count) : oom(k);
  if (v < 0) {
    free(copy);
    return -1;
  }
  memcpy(copy, leaves, sizeof(int) * (size_t)n);
  k->vals[v].leaves = copy;
  k->vals[v].nleaves = n;
  k->vals[v].divisor = divisor;
  k->vals[v].hash_next = k->buckets[b];
  k->buckets[b] = v;
  return v;
}

/* A partial sum's contributions join the new sum directly. */
static int expand(const struct compiler *k, int v, int *out) {
  const struct value *e = &k->vals[v];
  if (e->kind != V_REDUCE || e->divisor) {
    out[0] = v;
    return 1;
  }
  memcpy(out, e->leaves, sizeof(int) * (size_t)e->nleaves);
  return e->nleaves;
}

static int combine(struct compiler *k, int a, int b) {
  int n = expand(k, a, k->scratch_leaves);
  n += expand(k, b, k->scratch_leaves + n);
  if (n > k->max_leaves) /* a contribution twice: the checker rules this out */
    return fail(k, CCS_ERR_INVALID_ARGUMENT, "%s %s: a block combines %d contributions of %d participants",
                sched_algo_name(k->op->algo), sched_coll_name(k->op->coll), n, k->op->n);
  return reduce_value(k, k->scratch_leaves, n, 0, k->vals[a].count);
}

static size_t avg_divisor(const struct compiler *k) {
  return k->op->avg_divisor ? k->op->avg_divisor : (size_t)k->op->n;
}

static int finalize(struct compiler *k, int v) {
  if (k->op->redop != CCS_AVG) return v;
  const struct value *e = &k->vals[v];
  if (e->kind == V_REDUCE && !e->divisor) {
    memcpy(k->scratch_leaves, e->leaves, sizeof(int) * (size_t)e->nleaves);
    return reduce_value(k, k->scratch_leaves, e->nleaves, avg_divisor(k), e->count);
  }
  k->scratch_leaves[0] = v;
  return reduce_value(k, k->scratch_leaves, 1, avg_divisor(k), e->count);
}

/* Where participant p's input holds block b (NULL: it does not). */
static char *input_ptr(const struct compiler *k, int p, uint32_t b, int input_buf) {
  const struct engine_op *op = k->op;
  char *send = op->ranks[p].send;
  size_t begin, len;
  block_range(k, b, &begin, &len);
  if (!send || !sched_shape_has(op->coll, op->root, p, b) || input_buf != (op->coll == SCHED_ALL_TO_ALL))
    return NULL;
  return sched_shape_input_whole(op->coll) ? send + begin * k->sz : send;
}

/* Where participant p's output must hold block b at the end (NULL: nowhere). */
static char *home_ptr(const struct compiler *k, int p, uint32_t b) {
  const struct engine_op *op = k->op;
  char *recv = op->ranks[p].recv;
  size_t begin, len;
  block_range(k, b, &begin, &len);
  if (!recv || sched_shape_want(op->coll, op->root, p, b).kind == SCHED_WANT_NOTHING) return NULL;
  return sched_shape_output_whole(op->coll) ? recv + begin * k->sz : recv;
}

static int net_send(struct compiler *k, int v, int from, int to) {
  if (grow(k, (void **)&k->net, sizeof(*k->net), k->nnet + 1, &k->capnet)) return -1;
  k->net[k->nnet++] = (struct net_send){v, from, to, k->sent[from][to]++, k->nvals};
  return 0;
}

static int land(struct compiler *k, int v, char *home);

/* The member of group participant p whose own block b is, or -1. */
static int own_member(const struct compiler *k, int p, uint32_t b) {
  const int *first = k->op->group_first;
  if (!first || (int)b < first[p] || (int)b >= first[p + 1]) return -1;
  return (int)b - first[p];
}

/* Which members of a group hold a block: every one (at its place in the
 * buffer), the root member, or the member whose own block it is (its
 * whole buffer). */
enum member_role { EVERY_MEMBER, ROOT_MEMBER, OWN_MEMBER };

static char *member_ptr(const struct compiler *k, int p, int m, uint32_t b, size_t begin,
                        char *buf, enum member_role role) {
  const struct engine_op *op = k->op;
  if (!buf) return NULL;
  switch (role) {
  case ROOT_MEMBER: return p == op->root && m == op->ranks[p].root_member ? buf + begin * k->sz : NULL;
  case OWN_MEMBER: return m == own_member(k, p, b) ? buf : NULL;
  default: return buf + begin * k->sz;
  }
}

/* Where member m of group participant p holds block b at the start (NULL:
 * it does not): every member's input reduced (the local phase), or the
 * root member's, or each member's own block. */
static char *member_input(const struct compiler *k, int p, int m, uint32_t b, size_t begin) {
  enum sched_coll c = k->op->coll;
  enum member_role role = c == SCHED_BROADCAST || c == SCHED_SCATTER   ? ROOT_MEMBER
                          : c == SCHED_ALL_GATHER || c == SCHED_GATHER ? OWN_MEMBER
                                                                       : EVERY_MEMBER;
  return member_ptr(k, p, m, b, begin, k->op->ranks[p].members[m].send, role);
}

/* ... and where it must hold block b at the end. */
static char *member_home(const struct compiler *k, int p, int m, uint32_t b, size_t begin) {
  enum sched_coll c = k->op->coll;
  enum member_role role = c == SCHED_REDUCE || c == SCHED_GATHER            ? ROOT_MEMBER
                          : c == SCHED_REDUCE_SCATTER || c == SCHED_SCATTER ? OWN_MEMBER
                                                                            : EVERY_MEMBER;
  return member_ptr(k, p, m, b, begin, k->op->ranks[p].members[m].recv, role);
}

/* A group participant's block b at the start; -1 if none. */
static int group_input(struct compiler *k, int p, uint32_t b) {
  const struct engine_part *g = &k->op->ranks[p];
  size_t begin, len;
  block_range(k, b, &begin, &len);
  int nleaves = 0;
  for (int m = 0; m < g->nmembers; m++) {
    char *ptr = member_input(k, p, m, b, begin);
    if (!ptr) continue;
    int v = new_value(k, V_INPUT, len);
    if (v < 0) return -1;
    k->vals[v].owner = p;
    k->vals[v].ptr = ptr;
    k->scratch_leaves[nleaves++] = v;
  }
  if (nleaves <= 1) return nleaves ? k->scratch_leaves[0] : -1;
  return reduce_value(k, k->scratch_leaves, nleaves, 0, len);
}

/* ... and at the end, in every member's output that must hold it. */
static void group_land(struct compiler *k, int p, uint32_t b) {
  const struct engine_part *g = &k->op->ranks[p];
  size_t begin, len;
  block_range(k, b, &begin, &len);
  for (int m = 0; m < g->nmembers && k->rc == CCS_OK; m++) {
    char *home = member_home(k, p, m, b, begin);
    if (!home) continue;
    if (k->cur[p][b] < 0)
      fail(k, CCS_ERR_INVALID_ARGUMENT, "%s %s: participant %d ends without block %u",
           sched_algo_name(k->op->algo), sched_coll_name(k->op->coll), p, b);
    else
      land(k, k->cur[p][b], home);
  }
}

static int run_schedules(struct compiler *k, const struct schedule *s) {
  const struct engine_op *op = k->op;
  int n = op->n;
  size_t *pc = calloc((size_t)n, sizeof(*pc));
  struct msg **head = calloc((size_t)n, sizeof(*head)), **tail = calloc((size_t)n, sizeof(*tail));
  int rc = pc && head && tail ? 0 : oom(k);
  for (int progress = 1; progress && rc == 0;) {
    progress = 0;
    for (int p = 0; p < n && rc == 0; p++) {
      while (rc == 0 && !op->ranks[p].remote && pc[p] < s[p].nsteps) {
        const struct sched_step *st = &s[p].steps[pc[p]];
        int *blk = &k->cur[p][st->block], v = -1, remote = op->ranks[st->peer < 0 ? p : st->peer].remote;
        if (st->op == SCHED_SEND) {
          v = st->buf == SCHED_INPUT ? k->input[p][st->block] : *blk;
          struct msg *m = v >= 0 && !remote ? malloc(sizeof(*m)) : NULL;
          if (v < 0) rc = fail(k, CCS_ERR_INVALID_ARGUMENT, "participant %d sends block %u it does not hold", p, st->block);
          else if (remote) rc = net_send(k, v, p, st->peer);
          else if (!m) rc = oom(k);
          if (rc || remote) {
            pc[p]++;
            progress = 1;
            continue;
          }
          *m = (struct msg){p, v, NULL};
          if (tail[st->peer]) tail[st->peer]->next = m;
          else head[st->peer] = m;
          tail[st->peer] = m;
        } else if (st->op == SCHED_RECV || st->op == SCHED_RECV_REDUCE) {
          if (remote) {
            size_t begin, len;
            block_range(k, st->block, &begin, &len);
            if ((v = new_value(k, V_REMOTE, len)) < 0) {
              rc = -1;
              break;
            }
            k->vals[v].owner = st->peer;
            k->vals[v].to = p;
            k->vals[v].msg = k->got[p][st->peer]++;
          } else {
            struct msg **link = &head[p], *prev = NULL;
            while (*link && (*link)->from != st->peer) prev = *link, link = &(*link)->next;
            struct msg *m = *link;
            if (!m) break; /* not sent yet: the others go first */
            *link = m->next;
            if (tail[p] == m) tail[p] = prev;
            v = m->value;
            free(m);
          }
          if (st->op == SCHED_RECV_REDUCE) {
            if (*blk < 0) rc = fail(k, CCS_ERR_INVALID_ARGUMENT, "participant %d reduces into block %u it does not hold", p, st->block);
            else v = combine(k, *blk, v);
          }
          if (v < 0) rc = -1;
          *blk = v;
        } else if (st->op == SCHED_COPY) {
          *blk = st->src_buf == SCHED_INPUT ? k->input[p][st->src_block] : k->cur[p][st->src_block];
        } else if (st->op == SCHED_FINALIZE && *blk >= 0) {
          if ((*blk = finalize(k, *blk)) < 0) rc = -1;
        }
        pc[p]++;
        progress = 1;
      }
    }
  }
  for (int p = 0; p < n && rc == 0; p++)
    if ((!op->ranks[p].remote && pc[p] < s[p].nsteps) || head[p])
      rc = fail(k, CCS_ERR_INVALID_ARGUMENT, "%s %s for %d participants does not complete at participant %d",
                sched_algo_name(op->algo), sched_coll_name(op->coll), n, p);
  for (int p = 0; head && p < n; p++)
    while (head[p]) {
      struct msg *m = head[p];
      head[p] = m->next;
      free(m);
    }
  free(pc);
  free(head);
  free(tail);
  return rc;
}

/* --- pass 2: items ------------------------------------------------------ */

static int land(struct compiler *k, int v, char *home) {
  struct value *e = &k->vals[v];
  if (e->kind == V_INPUT && e->ptr == home) return 0; /* in place already */
  for (int i = 0; i < e->nland; i++)
    if (e->land[i] == home) return 0;
  size_t cap = (size_t)e->capland;
  if (grow(k, (void **)&e->land, sizeof(void *), (size_t)e->nland + 1, &cap)) return -1;
  e->capland = (int)cap;
  e->land[e->nland++] = home;
  return 0;
}

static int add_edge(struct compiler *k, uint32_t from, uint32_t to, int chunkwise) {
  if (grow(k, (void **)&k->edges, sizeof(*k->edges), k->nedges + 1, &k->capedges)) return -1;
  const struct engine_item *items = k->plan->items;
  k->edges[k->nedges++] = (struct edge){from, to, chunkwise && items[from].count == items[to].count};
  return 0;
}

static void *scratch(struct compiler *k, size_t bytes) {
  struct engine_plan *pl = k->plan;
  void **grown = realloc(pl->scratch, sizeof(void *) * (pl->nscratch + 1));
  size_t *sizes = grown ? realloc(pl->scratch_bytes, sizeof(size_t) * (pl->nscratch + 1)) : NULL;
  if (grown) pl->scratch = grown;
  if (!sizes) return oom(k), NULL;
  pl->scratch_bytes = sizes;
  size_t got;
  void *p = engine_pool_get(k->op->pool, bytes, &got);
  if (!p) return oom(k), NULL;
  pl->scratch_bytes[pl->nscratch] = got;
  return pl->scratch[pl->nscratch++] = p;
}

/* A item with room for its pointers, taken from plan->ptrs (sized ahead). */
static struct engine_item *new_item(struct compiler *k, int nin, int nout, size_t count,
                                    size_t *used_ptrs) {
  struct engine_plan *pl = k->plan;
  struct engine_item *nd = &pl->items[pl->nitems++];
  memset(nd, 0, sizeof(*nd));
  nd->in = (const void **)pl->ptrs + *used_ptrs;
  nd->out = pl->ptrs + *used_ptrs + nin;
  *used_ptrs += (size_t)(nin + nout);
  nd->nin = nin;
  nd->nout = nout;
  nd->count = count;
  return nd;
}

/* The item that makes value v (and lands it), or -1 when out of memory. */
static int value_node(struct compiler *k, int v, size_t *used) {
  struct engine_plan *pl = k->plan;
  struct value *e = &k->vals[v];
  int nin = e->kind == V_REDUCE ? e->nleaves : e->kind == V_INPUT;
  int nout = e->kind == V_REMOTE ? 1 : e->nland ? e->nland : 1;
  struct engine_item *nd = new_item(k, nin, nout, e->count, used);
  e->item = (int)(nd - pl->items);
  nd->reduce = e->kind == V_REDUCE;
  nd->divisor = e->divisor;
  if (e->kind == V_REMOTE) {
    nd->kind = ENGINE_RECV;
    nd->from = e->owner;
    nd->to = e->to;
    nd->msg = e->msg;
  }
  for (int o = 0; o < e->nland && o < nout; o++) nd->out[o] = e->land[o];
  if (!e->nland && !(nd->out[0] = scratch(k, e->count * k->sz))) return -1;
  if (e->kind == V_INPUT) nd->in[0] = e->ptr;
  for (int i = 0; e->kind == V_REDUCE && i < nin; i++) {
    const struct value *leaf = &k->vals[e->leaves[i]];
    if (leaf->kind == V_INPUT) {
      nd->in[i] = leaf->ptr;
      continue;
    }
    nd->in[i] = pl->items[leaf->item].out[0];
    k->producer[nd->in + i - (const void **)pl->ptrs] = leaf->item;
    if (add_edge(k, (uint32_t)leaf->item, (uint32_t)e->item, 1)) return -1;
  }
  if (e->kind == V_REMOTE && e->nland > 1) { /* a received result, to the other outputs */
    struct engine_item *cp = new_item(k, 1, e->nland - 1, e->count, used);
    cp->in[0] = nd->out[0];
    k->producer[cp->in - (const void **)pl->ptrs] = e->item;
    for (int o = 1; o < e->nland; o++) cp->out[o - 1] = e->land[o];
    if (add_edge(k, (uint32_t)e->item, (uint32_t)(cp - pl->items), 1)) return -1;
  }
  return 0;
}

static int send_node(struct compiler *k, const struct net_send *ns, size_t *used) {
  struct engine_plan *pl = k->plan;
  const struct value *e = &k->vals[ns->value];
  struct engine_item *nd = new_item(k, 1, 0, e->count, used);
  nd->kind = ENGINE_SEND;
  nd->from = ns->from;
  nd->to = ns->to;
  nd->msg = ns->msg;
  if (e->kind == V_INPUT) {
    nd->in[0] = e->ptr;
    return 0;
  }
  nd->in[0] = pl->items[e->item].out[0];
  k->producer[nd->in - (const void **)pl->ptrs] = e->item;
  return add_edge(k, (uint32_t)e->item, (uint32_t)(nd - pl->items), 1);
}

static int make_items(struct compiler *k) {
  struct engine_plan *pl = k->plan;
  /* live: what an output keeps or a message carries, and what that is made of */
  for (size_t i = 0; i < k->nnet; i++) k->vals[k->net[i].value].live = 1;
  size_t items = 0, ptrs = 0, reads = 0;
  for (int v = k->nvals - 1; v >= 0; v--) {
    struct value *e = &k->vals[v];
    if (e->nland) e->live = 1;
    if (!e->live || e->count == 0) continue;
    if (e->kind == V_REDUCE)
      for (int i = 0; i < e->nleaves; i++) k->vals[e->leaves[i]].live = 1;
    if (e->kind == V_INPUT && !e->nland) continue; /* read where it is */
    size_t nin = e->kind == V_REDUCE ? (size_t)e->nleaves : 1;
    items += 1 + (e->kind == V_REMOTE && e->nland > 1);
    ptrs += nin + (e->nland ? (size_t)e->nland : 1) + (e->kind == V_REMOTE ? 1 : 0);
    reads += nin + (e->kind == V_REMOTE ? 1 : 0);
  }
  for (size_t i = 0; i < k->nnet; i++)
    if (k->vals[k->net[i].value].count) items++, ptrs++, reads++;
  /* room for a snapshot (1 in, 1 out) of every read */
  k->cap_items = items + reads;
  pl->items = calloc(k->cap_items + 1, sizeof(*pl->items));
  pl->ptrs = calloc(ptrs + 2 * reads + 1, sizeof(void *));
  k->producer = malloc((ptrs + 2 * reads + 1) * sizeof(int));
  if (!pl->items || !pl->ptrs || !k->producer) return oom(k);
  memset(k->producer, 0xff, (ptrs + 2 * reads + 1) * sizeof(int));
  size_t used = 0, next_send = 0;
  /* in the order the values and messages were made: every item comes after
   * those whose results it reads, a send before what overwrites its data */
  for (int v = 0; v <= k->nvals; v++) {
    for (; next_send < k->nnet && k->net[next_send].after <= v; next_send++)
      if (k->vals[k->net[next_send].value].count && send_node(k, &k->net[next_send], &used)) return -1;
    if (v == k->nvals) break;
    struct value *e = &k->vals[v];
    if (!e->live || e->count == 0 || (e->kind == V_INPUT && !e->nland)) continue;
    if (value_node(k, v, &used)) return -1;
  }
  return (int)used; /* ptrs handed out so far */
}

/* --- pass 3: memory that is read and overwritten ------------------------- */

static int by_ptr(const void *a, const void *b) {
  const struct access *x = a, *y = b;
  return x->ptr < y->ptr ? -1 : x->ptr > y->ptr;
}

static int order_overwrites(struct compiler *k, size_t used_ptrs) {
  struct engine_plan *pl = k->plan;
  size_t nreads = 0, nwrites = 0, nmain = pl->nitems;
  for (size_t i = 0; i < nmain; i++) {
    nreads += (size_t)pl->items[i].nin;
    nwrites += (size_t)pl->items[i].nout;
  }
  struct access *reads = malloc((nreads + 1) * sizeof(*reads));
  struct access *writes = malloc((nwrites + 1) * sizeof(*writes));
  if (!reads || !writes) {
    free(reads);
    free(writes);
    return oom(k);
  }
  nreads = nwrites = 0;
  size_t max_read = 0;
  for (size_t i = 0; i < nmain; i++) {
    const struct engine_item *nd = &pl->items[i];
    size_t bytes = nd->count * k->sz;
    for (int o = 0; o < nd->nout; o++)
      writes[nwrites++] = (struct access){(uint32_t)i, (uint32_t)o, -1, -1, nd->out[o], bytes};
    for (int j = 0; j < nd->nin; j++)
      reads[nreads++] = (struct access){(uint32_t)i, (uint32_t)j,
                                        k->producer[nd->in + j - (const void **)pl->ptrs], -1,
                                        (char *)nd->in[j], bytes};
    if (bytes > max_read) max_read = bytes;
  }
  qsort(reads, nreads, sizeof(*reads), by_ptr);

  int rc = 0;
  for (int sweep = 0; sweep < 2 && rc == 0; sweep++)
    for (size_t w = 0; w < nwrites && rc == 0; w++) {
      const struct access *wr = &writes[w];
      size_t lo = 0, hi = nreads; /* the first read that could reach wr */
      uintptr_t from = (uintptr_t)wr->ptr > max_read ? (uintptr_t)wr->ptr - max_read : 0;
      while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((uintptr_t)reads[mid].ptr < from) lo = mid + 1;
        else hi = mid;
      }
      for (size_t r = lo; r < nreads && reads[r].ptr < wr->ptr + wr->bytes && rc == 0; r++) {
        struct access *rd = &reads[r];
        if (rd->ptr + rd->bytes <= wr->ptr || rd->producer == (int)wr->item) continue;
        int same = rd->ptr == wr->ptr && rd->bytes == wr->bytes;
        if (sweep == 0) {
          /* A item may overwrite what it reads at the same place (kernels
           * read a block before writing it); an input overwritten by an
           * earlier item, or by the reader elsewhere, is copied aside. */
          if (rd->producer < 0 && rd->snap < 0 &&
              (rd->item > wr->item || (rd->item == wr->item && !same))) {
            if (pl->nitems == k->cap_items) {
              rc = oom(k);
              break;
            }
            struct engine_item *reader = &pl->items[rd->item];
            struct engine_item *sn = new_item(k, 1, 1, reader->count, &used_ptrs);
            sn->in[0] = rd->ptr;
            if (!(sn->out[0] = scratch(k, rd->bytes))) rc = -1;
            else reader->in[rd->index] = sn->out[0];
            rd->snap = (int)(sn - pl->items);
            if (rc == 0) rc = add_edge(k, (uint32_t)rd->snap, rd->item, 1);
          }
          continue;
        }
        if (rd->snap >= 0) rc = add_edge(k, (uint32_t)rd->snap, wr->item, same);
        else if (rd->item < wr->item) rc = add_edge(k, rd->item, wr->item, same);
        else if (rd->item > wr->item) /* overlapping outputs: an order, not a meaning */
          rc = add_edge(k, wr->item, rd->item, 0);
      }
    }
  free(reads);
  free(writes);
  return rc;
}

/* --- the plan ------------------------------------------------------------ */

static int finish_plan(struct compiler *k) {
  struct engine_plan *pl = k->plan;
  size_t tasks = 0;
  for (size_t i = 0; i < pl->nitems; i++) {
    struct engine_item *nd = &pl->items[i];
    nd->first_task = tasks;
    nd->ntasks = (nd->count + pl->chunk_elems - 1) / pl->chunk_elems;
    tasks += nd->ntasks;
    if (nd->kind == ENGINE_COMPUTE) pl->compute_tasks += nd->ntasks;
    pl->bytes_written += nd->count * k->sz * (size_t)nd->nout;
    pl->net_items += nd->kind != ENGINE_COMPUTE;
    pl->bytes_moved += nd->count * k->sz * (size_t)(nd->nin + nd->nout);
  }
  if (tasks > UINT32_MAX) return fail(k, CCS_ERR_NO_MEMORY, "op too large: %zu tasks", tasks);
  pl->ntasks = tasks;
  pl->task_item = malloc((tasks + 1) * sizeof(uint32_t));
  pl->pending = malloc((tasks + 1) * sizeof(uint32_t));
  pl->ready = malloc((pl->compute_tasks + 1) * sizeof(uint32_t));
  pl->net_ready = malloc((tasks - pl->compute_tasks + 1) * sizeof(uint32_t));
  pl->succ = malloc((k->nedges + 1) * sizeof(*pl->succ));
  if (!pl->task_item || !pl->pending || !pl->ready || !pl->net_ready || !pl->succ) return oom(k);
  for (size_t i = 0; i < pl->nitems; i++)
    for (size_t t = 0; t < pl->items[i].ntasks; t++) pl->task_item[pl->items[i].first_task + t] = (uint32_t)i;
  /* successors grouped by item (counting sort) */
  for (size_t e = 0; e < k->nedges; e++) pl->items[k->edges[e].from].succ_end++;
  size_t at = 0;
  for (size_t i = 0; i < pl->nitems; i++) {
    size_t n = pl->items[i].succ_end;
    pl->items[i].succ_begin = pl->items[i].succ_end = at;
    at += n;
  }
  for (size_t e = 0; e < k->nedges; e++) {
    struct engine_item *from = &pl->items[k->edges[e].from];
    pl->succ[from->succ_end++] = (struct engine_edge){k->edges[e].to, k->edges[e].chunkwise};
  }
  pl->nsucc = k->nedges;
  return 0;
}

ccs_result_t engine_compile(const struct engine_op *op, struct engine_plan *plan, char *err,
                            size_t errlen) {
  memset(plan, 0, sizeof(*plan));
  struct compiler k = {.op = op, .plan = plan, .rc = CCS_OK, .err = err, .errlen = errlen};
  k.sz = ccs_dtype_size(op->dtype);
  plan->dtype = op->dtype;
  plan->redop = op->redop;
  plan->pool = op->pool;
  plan->elem_size = k.sz;
  plan->chunk_elems = op->chunk_bytes / (k.sz ? k.sz : 1);
  if (plan->chunk_elems == 0) plan->chunk_elems = 1;
  int n = op->n;
  if (op->count == 0) { /* nothing to move (and no buffers to name), by an algorithm that builds it */
    struct schedule s0;
    int rc = sched_build(op->algo, op->coll, n, 0, op->root, op->pipeline, &s0);
    if (rc == 0) sched_free(&s0);
    if (rc == -1)
      snprintf(err, errlen, "algorithm %s does not implement %s for %d ranks", sched_algo_name(op->algo),
               sched_coll_name(op->coll), n);
    else if (rc)
      snprintf(err, errlen, "out of memory compiling %s", sched_coll_name(op->coll));
    return rc == -1 ? CCS_ERR_UNSUPPORTED : rc ? CCS_ERR_NO_MEMORY : CCS_OK;
  }
  struct schedule *s = calloc((size_t)n, sizeof(*s));
  k.cur = calloc((size_t)n, sizeof(*k.cur));
  k.sent = calloc((size_t)n, sizeof(*k.sent));
  k.got = calloc((size_t)n, sizeof(*k.got));
  k.input = calloc((size_t)n, sizeof(*k.input));
  size_t most = (size_t)n;
  for (int p = 0; p < n; p++) most += (size_t)op->ranks[p].nmembers;
  k.scratch_leaves = malloc(sizeof(int) * (2 * most + 2));
  k.max_leaves = (int)most;
  if (!s || !k.cur || !k.input || !k.scratch_leaves || !k.sent || !k.got) oom(&k);
  for (int p = 0; p < n && k.rc == CCS_OK; p++) {
    if (op->ranks[p].remote) continue;
    k.sent[p] = calloc((size_t)n, sizeof(uint32_t));
    k.got[p] = calloc((size_t)n, sizeof(uint32_t));
    if (!k.sent[p] || !k.got[p]) oom(&k);
  }
  size_t steps = 0;
  for (int p = 0; p < n && k.rc == CCS_OK; p++) {
    int rc = sched_build(op->algo, op->coll, n, p, op->root, op->pipeline, &s[p]);
    if (rc == -1)
      fail(&k, CCS_ERR_UNSUPPORTED, "algorithm %s does not implement %s for %d ranks",
           sched_algo_name(op->algo), sched_coll_name(op->coll), n);
    else if (rc) oom(&k);
    steps += s[p].nsteps;
  }
  if (op->group_first && k.rc == CCS_OK && (sched_coll_splits(op->coll) || op->coll == SCHED_ALL_TO_ALL))
    fail(&k, CCS_ERR_INVALID_ARGUMENT, "%s: no groups of ranks in blocks", sched_coll_name(op->coll));
  for (int p = 0; p < n && op->group_first && k.rc == CCS_OK; p++) {
    int rc = sched_expand(&s[p], op->group_first);
    if (rc == -1)
      fail(&k, CCS_ERR_UNSUPPORTED, "%s %s: a copy between groups of unequal size",
           sched_algo_name(op->algo), sched_coll_name(op->coll));
    else if (rc) oom(&k);
  }
  if (k.rc == CCS_OK) {
    k.nblocks = s[0].nblocks;
    for (k.nbuckets = 64; k.nbuckets < 2 * steps; k.nbuckets *= 2) {}
    k.buckets = malloc(k.nbuckets * sizeof(int));
    if (!k.buckets) oom(&k);
    else memset(k.buckets, 0xff, k.nbuckets * sizeof(int));
  }
  /* every participant's starting blocks (schedule.h) */
  for (int p = 0; p < n && k.rc == CCS_OK; p++) {
    k.cur[p] = malloc(sizeof(int) * (k.nblocks + 1));
    k.input[p] = malloc(sizeof(int) * (k.nblocks + 1));
    if (!k.cur[p] || !k.input[p]) {
      oom(&k);
      break;
    }
    for (uint32_t b = 0; b < k.nblocks; b++) {
      int *slot = op->coll == SCHED_ALL_TO_ALL ? &k.input[p][b] : &k.cur[p][b];
      k.cur[p][b] = k.input[p][b] = -1;
      if (op->ranks[p].nmembers) {
        *slot = group_input(&k, p, b);
        continue;
      }
      char *ptr = input_ptr(&k, p, b, op->coll == SCHED_ALL_TO_ALL);
      if (!ptr) continue;
      size_t begin, len;
      block_range(&k, b, &begin, &len);
      int v = new_value(&k, V_INPUT, len);
      if (v < 0) break;
      k.vals[v].owner = p;
      k.vals[v].ptr = ptr;
      *slot = v;
    }
  }
  if (k.rc == CCS_OK) run_schedules(&k, s);
  for (int p = 0; p < n && k.rc == CCS_OK; p++)
    for (uint32_t b = 0; b < k.nblocks && k.rc == CCS_OK; b++) {
      if (op->ranks[p].nmembers) {
        group_land(&k, p, b);
        continue;
      }
      char *home = op->ranks[p].remote ? NULL : home_ptr(&k, p, b);
      if (!home) continue;
      if (k.cur[p][b] < 0) {
        fail(&k, CCS_ERR_INVALID_ARGUMENT, "%s %s: participant %d ends without block %u",
             sched_algo_name(op->algo), sched_coll_name(op->coll), p, b);
        break;
      }
      land(&k, k.cur[p][b], home);
    }
  int used = k.rc == CCS_OK ? make_items(&k) : -1;
  if (used >= 0 && k.rc == CCS_OK) order_overwrites(&k, (size_t)used);
  if (k.rc == CCS_OK) finish_plan(&k);

  for (int p = 0; p < n; p++) {
    if (s) sched_free(&s[p]);
    if (k.cur) free(k.cur[p]);
    if (k.input) free(k.input[p]);
    if (k.sent) free(k.sent[p]);
    if (k.got) free(k.got[p]);
  }
  for (int v = 0; v < k.nvals; v++) {
    free(k.vals[v].leaves);
    free(k.vals[v].land);
  }
  free(s);
  free(k.cur);
  free(k.input);
  free(k.sent);
  free(k.got);
  free(k.net);
  free(k.scratch_leaves);
  free(k.vals);
  free(k.buckets);
  free(k.edges);
  free(k.producer);
  if (k.rc != CCS_OK) engine_plan_free(plan);
  return k.rc;
}

void engine_plan_free(struct engine_plan *plan) {
  for (size_t i = 0; i < plan->nscratch; i++) engine_pool_put(plan->pool, plan->scratch[i], plan->scratch_bytes[i]);
  free(plan->scratch);
  free(plan->scratch_bytes);
  free(plan->items);
  free(plan->ptrs);
  free(plan->succ);
  free(plan->task_item);
  free(plan->pending);
  free(plan->ready);
  free(plan->net_ready);
  memset(plan, 0, sizeof(*plan));
}
