/* A call's ops, from either path (a Submit over the socket, a batch from
 * the rings), checked field by field and posted: all or none. A call with
 * a bad argument has no effect (NCCL's InvalidArgument is local,
 * non-fatal); its answer goes back the way the call came. */
#include <stdio.h>
#include <stdlib.h>

#include "front/front.h"

/* Resolves and checks one buffer reference. `need` is the byte length the
 * op requires; 0 means the buffer is not used and must be absent. */
static ccs_result_t resolve_buf(struct session *s, const struct op_buf *ref, uint64_t need,
                                size_t align, const char *which, struct membuf **ret_buf,
                                uint64_t *ret_off, char *err, size_t errlen) {
  *ret_buf = NULL;
  *ret_off = 0;
  if (need == 0) return CCS_OK; /* unused: ignore whatever came */
  if (!ref->present) {
    snprintf(err, errlen, "%s buffer missing", which);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  ccs_result_t rc;
  struct membuf *b = ccsd_membuf_find(s, ref->buffer, &rc);
  uint64_t end;
  if (!b) {
    snprintf(err, errlen, "%s buffer %llu %s", which, (unsigned long long)ref->buffer,
             rc == CCS_ERR_PERMISSION ? "belongs to another client"
                                      : "is not registered on this connection");
    return rc;
  }
  if (ref->length != need) {
    snprintf(err, errlen, "%s buffer spans %llu bytes, the op needs %llu", which,
             (unsigned long long)ref->length, (unsigned long long)need);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  if (__builtin_add_overflow(ref->offset, ref->length, &end) || end > b->size) {
    snprintf(err, errlen, "%s range [%llu, +%llu) is outside its %zu-byte buffer", which,
             (unsigned long long)ref->offset, (unsigned long long)ref->length, b->size);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  if (ref->offset % align) {
    snprintf(err, errlen, "%s buffer is not aligned to its %zu-byte elements", which, align);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  *ret_buf = b;
  *ret_off = ref->offset;
  return CCS_OK;
}

/* Builds the post of one op; on failure fills err and returns NULL. */
static struct client_post *make_post(struct session *s, const struct op_args *op, ccs_result_t *rc,
                                     char *err, size_t errlen) {
  *rc = CCS_ERR_INVALID_ARGUMENT;
  struct client_comm *cc = ccsd_client_comm_find(s, op->comm);
  if (!cc) {
    snprintf(err, errlen, "no such communicator");
    return NULL;
  }
  struct member *m = cc->member;
  int n = m->comm->nranks;
  if (op->kind >= CCS__COLL_KIND_COUNT) {
    snprintf(err, errlen, "unknown collective %u", op->kind);
    return NULL;
  }
  if (op->dtype >= CCS_DTYPE_COUNT) {
    snprintf(err, errlen, "unknown data type %u", op->dtype);
    return NULL;
  }
  if (ccs__coll_has_redop(op->kind) && op->redop >= CCS_REDOP_COUNT) {
    snprintf(err, errlen, "unknown reduction %u", op->redop);
    return NULL;
  }
  int p2p = ccsd_p2p_kind(op->kind);
  if ((ccs__coll_has_root(op->kind) || p2p) && (op->root < 0 || op->root >= n)) {
    snprintf(err, errlen, "%s %d is out of range for %d ranks", p2p ? "peer" : "root", op->root,
             n);
    return NULL;
  }
  size_t sz = ccs_dtype_size(op->dtype);
  uint64_t send_len, recv_len;
  if (ccs__op_lengths(op->kind, op->count, sz, n, m->rank, op->root, &send_len, &recv_len)) {
    snprintf(err, errlen, "count %llu overflows", (unsigned long long)op->count);
    return NULL;
  }
  struct client_post *cp = calloc(1, sizeof(*cp));
  if (!cp) {
    *rc = CCS_ERR_NO_MEMORY;
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  struct post *p = &cp->post;
  if ((*rc = resolve_buf(s, &op->send, send_len, sz, "send", &cp->sendbuf, &p->send_off, err,
                         errlen)) != CCS_OK ||
      (*rc = resolve_buf(s, &op->recv, recv_len, sz, "receive", &cp->recvbuf, &p->recv_off, err,
                         errlen)) != CCS_OK ||
      (*rc = ccsd_tenant_charge(s->d, s->uid, TENANT_OPS, 1, &cp->tenant, err, errlen)) != CCS_OK) {
    free(cp);
    return NULL;
  }
  cp->d = s->d;
  p->ops = &ccsd_client_post_ops;
  p->posted_ms = ccsd_fresh_ms_of(&s->d->coll); /* a deadline starts (coll.h) */
  p->posted_ns = uv_hrtime();
  p->member = m;
  p->kind = op->kind;
  p->dtype = op->dtype;
  p->redop = ccs__coll_has_redop(op->kind) ? op->redop : 0;
  p->count = op->count;
  p->whole_count = op->whole_count;
  p->root = ccs__coll_has_root(op->kind) || p2p ? op->root : 0;
  p->send_len = send_len;
  p->recv_len = recv_len;
  p->ordered = op->ordered;
  p->number = p2p ? 0 : op->number; /* (collectives are numbered) */
  struct membuf *bufs[2] = {cp->sendbuf, cp->recvbuf};
  struct coll_buf *views[2] = {&p->send, &p->recv};
  for (int k = 0; k < 2; k++) {
    if (!bufs[k]) continue;
    ccsd_membuf_ref(bufs[k]);
    *views[k] = (struct coll_buf){bufs[k]->base, bufs[k]->size, bufs[k]->device};
  }
  *rc = CCS_OK;
  return cp;
}

static void answer(struct session *s, uint64_t id, int via_ring, ccs_result_t rc, const char *err) {
  if (via_ring) ccsd_ring_complete(s, id, rc, err);
  else ccsd_session_reply(s, id, rc, err);
}

/* A CUDA stream's order holds for device buffers only: a host buffer in a
 * stream-ordered call is refused (its stream would order nothing). */
static int stream_order_fits(const struct client_post *cp) {
  return (!cp->sendbuf || cp->sendbuf->device >= 0) && (!cp->recvbuf || cp->recvbuf->device >= 0);
}

/* After this daemon dropped a rank's collectives for their callers to
 * repeat (hold.c), or refused them (below), the rank's next one must carry
 * the first's number again: one its client made before it saw that
 * carries a later number, and taking it would match it with the other
 * ranks' repeat of the dropped one. Such a call is refused
 * (CCS_ERR_RETRY: its caller repeats it too); 1 with err. The first
 * collective posted ends the wait, also one with no number (its client
 * numbers nothing). Only a rank's first collective in the call is looked
 * at (a group's next ones follow it). */
static int made_before_the_drop(struct client_post *const *posts, size_t n, char *err, size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    const struct post *p = &posts[i]->post; /* (a number: a collective's, make_post) */
    uint32_t want = p->member->repeat_number;
    if (!want || !p->number || p->number == want) continue;
    int first = 1;
    for (size_t j = 0; j < i && first; j++)
      first = posts[j]->post.member != p->member || ccsd_p2p_kind(posts[j]->post.kind);
    if (!first) continue;
    snprintf(err, errlen, "this rank's collective #%u of the communicator was dropped for a repeat "
             "(a daemon of it restarted) or refused, and this call (#%u) came before it came again: "
             "repeat this one after it", want, p->number);
    return 1;
  }
  return 0;
}

/* A call refused as a whole took no numbers here: a rank's later calls
 * already out (a host stream's) would take them, and be matched with the
 * other ranks' earlier calls. Its ranks wait, as after a drop, for their
 * first refused collective to come again (libccs repeats one refused for
 * a quota, with the later ones; other refusals end the comm there). */
static void refused(struct session *s, const struct op_args *ops, size_t n) {
  for (size_t i = 0; i < n; i++) {
    struct client_comm *cc = ops[i].number && !ccsd_p2p_kind(ops[i].kind)
                                 ? ccsd_client_comm_find(s, ops[i].comm) : NULL;
    if (cc) ccsd_member_repeat_from(cc->member, ops[i].number);
  }
}

void ccsd_submit(struct session *s, uint64_t id, const struct op_args *ops, size_t n,
                 const struct gpu_order *order, int via_ring) {
  char err[CCS__ERROR_TEXT_MAX];
  ccs_result_t rc = CCS_OK;
  struct client_post *stack[8], **posts = n <= 8 ? stack : calloc(n, sizeof(*posts));
  if (!posts) {
    answer(s, id, via_ring, CCS_ERR_NO_MEMORY, "out of memory");
    return;
  }
  size_t i;
  for (i = 0; i < n; i++) {
    posts[i] = make_post(s, &ops[i], &rc, err, sizeof(err));
    if (!posts[i]) break;
    const char *unordered = !order ? NULL
                            : !stream_order_fits(posts[i])
                                ? "a CUDA stream orders device buffers, and this op has host buffers"
                            : order->flags->registered != 1
                                ? "this daemon did not take the stream flags of this connection"
                                : NULL;
    if (unordered) {
      ccsd_client_post_free(posts[i]);
      posts[i] = NULL;
      rc = CCS_ERR_INVALID_ARGUMENT;
      snprintf(err, sizeof(err), "%s", unordered);
      break;
    }
    if (order) {
      posts[i]->post.order = *order;
      ccsd_gpu_flags_ref(order->flags);
    }
  }
  int early = i == n && made_before_the_drop(posts, n, err, sizeof(err));
  struct submission *sub = i == n && !early ? ccsd_submission_new(s, id, (int)n, via_ring) : NULL;
  if (!sub) { /* op i was refused, the call came early, or no memory for the submission */
    char full[CCS__ERROR_TEXT_MAX + 32];
    if (i < n && n > 1) snprintf(full, sizeof(full), "op %zu of the group: %s", i, err);
    else snprintf(full, sizeof(full), "%s", i < n || early ? err : "out of memory");
    if (i == n) rc = early ? CCS_ERR_RETRY : CCS_ERR_NO_MEMORY;
    while (i-- > 0) ccsd_client_post_free(posts[i]);
    if (posts != stack) free(posts);
    if (order) ccsd_gpu_order_done(order); /* the client's stream goes on: the call had no effect */
    refused(s, ops, n);
    answer(s, id, via_ring, rc, full);
    return;
  }
  for (i = 0; i < n; i++) {
    posts[i]->sub = sub;
    if (!ccsd_p2p_kind(posts[i]->post.kind)) posts[i]->post.member->repeat_number = 0; /* (made_before_the_drop) */
    ccsd_post_submit(&posts[i]->post);
  }
  if (posts != stack) free(posts);
}
