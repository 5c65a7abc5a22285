/* Collective calls and groups: each call becomes one op; outside a group
 * it is submitted alone, inside one it waits for ccs_group_end, which
 * submits all of the thread's ops in one request and returns when all are
 * done (on a host stream, once submitted: stream.c; on a CUDA stream, once
 * queued on it, ordered by the stream flags: ring.c). Unregistered buffers
 * are copied through a staging area; so are device buffers of a comm whose
 * ranks span daemons, through host memory (the daemons move host memory
 * between them). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"

static __thread struct {
  int depth;
  struct op *ops;
  size_t n, cap;
} group;

/* Kept inputs (track): a buffer per thread, lent to its next call (a
 * fresh malloc of tens of KiB a call faults its pages in every time); a
 * group's further ops get their own. Freed with the thread; without a key
 * to free it by, every input gets its own. */
static __thread struct {
  char *buf;
  size_t cap;
  int lent;
} keep;
static pthread_key_t keep_key;
static int keep_keyed;
static pthread_once_t keep_once = PTHREAD_ONCE_INIT;
static void keep_free(void *p) {
  free(p);
  keep.buf = NULL, keep.cap = 0, keep.lent = 0; /* (a call from a later destructor starts afresh) */
}
static void keep_key_make(void) { keep_keyed = pthread_key_create(&keep_key, keep_free) == 0; }

static void *keep_take(size_t len) {
  pthread_once(&keep_once, keep_key_make);
  if (keep.lent || !keep_keyed) return malloc(len);
  if (len > keep.cap) {
    char *grown = malloc(len);
    if (!grown || pthread_setspecific(keep_key, grown)) {
      free(grown);
      return NULL;
    }
    free(keep.buf);
    keep.buf = grown, keep.cap = len;
  }
  keep.lent = 1;
  return keep.buf;
}

static void keep_give(void *p) {
  if (p && p == keep.buf) keep.lent = 0;
  else free(p);
}

/* A listed call done with: its kept inputs given back, then freed. */
static void call_free(struct ccs__call *call) {
  for (size_t i = 0; call && i < call->n; i++) keep_give(call->op[i].kept);
  ccs__call_free(call);
}

static ccs_result_t fail(ccs_comm_t *comm, ccs_result_t rc, const char *fmt, const char *what) {
  ccs__set_error(fmt, what);
  if (comm) snprintf(comm->last_error, sizeof(comm->last_error), "%s", ccs__error());
  return rc;
}

void ccs__comm_failed(ccs_comm_t *comm, ccs_result_t rc, const char *text) {
  snprintf(comm->last_error, sizeof(comm->last_error), "%s", text);
  /* A call refused as a whole (bad arguments, a quota, a mismatch the
   * ranks all saw) leaves the comm usable; a lost rank, a timeout, an
   * abort or a lost daemon is fatal to it, as in NCCL. */
  int fatal = rc == CCS_ERR_PEER_LOST || rc == CCS_ERR_TIMEOUT || rc == CCS_ERR_ABORTED ||
              rc == CCS_ERR_DAEMON_UNAVAILABLE || rc == CCS_ERR_PROTOCOL ||
              rc == CCS_ERR_TRANSPORT || rc == CCS_ERR_SYSTEM || rc == CCS_ERR_CUDA ||
              rc == CCS_ERR_REVOKED;
  if (fatal && comm->async_error == CCS_OK) comm->async_error = rc;
}

/* Device buffers: both on one GPU; a CUDA stream only with them, a host
 * stream only without. */
static ccs_result_t check_domain(struct op *o, ccs_stream_t stream) {
  char why[512];
  const char *name = ccs__coll_name(o->kind);
  if ((o->host_stream = ccs__host_stream_of(stream)) != NULL) stream = NULL;
  if (stream && ccs__gpu_usable() != CCS_OK) {
    snprintf(why, sizeof(why), "%s: a stream was given; %s", name, ccs__error());
    return fail(o->comm, CCS_ERR_UNSUPPORTED, "%s", why);
  }
  if (stream && ccs__gpu_capturing(stream))
    return fail(o->comm, CCS_ERR_INVALID_USAGE,
                "%s: the stream is being captured into a CUDA graph: ccs calls cannot be (each "
                "is matched with the other ranks' as it is made)", name);
  int sd = o->send_len ? ccs__gpu_device_of(o->send) : -1;
  int rd = o->recv_len ? ccs__gpu_device_of(o->recv) : -1;
  o->device = sd >= 0 ? sd : rd;
  o->stream = stream;
  if (o->device >= 0 && o->send_len && o->recv_len && sd != rd) {
    if (sd < 0 || rd < 0)
      snprintf(why, sizeof(why), "%s: the %s buffer is host memory, the other is on GPU %d", name,
               sd < 0 ? "send" : "receive", o->device);
    else snprintf(why, sizeof(why), "%s: the buffers are on two GPUs (%d and %d)", name, sd, rd);
    return fail(o->comm, CCS_ERR_INVALID_USAGE, "%s", why);
  }
  if (stream && o->device < 0 && (o->send_len || o->recv_len))
    return fail(o->comm, CCS_ERR_INVALID_USAGE,
                "%s: with a CUDA stream the buffers are device memory; host buffers take a "
                "host stream (ccs_stream_create) or NULL", name);
  if (o->host_stream && o->device >= 0)
    return fail(o->comm, CCS_ERR_INVALID_USAGE,
                "%s: a host stream (ccs_stream_create) takes host buffers; device buffers take "
                "a CUDA stream", name);
  return CCS_OK;
}

static ccs_result_t check_op(struct op *o, ccs_stream_t stream) {
  const char *name = ccs__coll_name(o->kind);
  if (!o->comm) return fail(NULL, CCS_ERR_INVALID_ARGUMENT, "%s: communicator is NULL", name);
  if ((unsigned)o->dtype >= CCS_DTYPE_COUNT)
    return fail(o->comm, CCS_ERR_INVALID_ARGUMENT, "%s: unknown data type", name);
  if (ccs__coll_has_redop(o->kind) && (unsigned)o->redop >= CCS_REDOP_COUNT)
    return fail(o->comm, CCS_ERR_INVALID_ARGUMENT, "%s: unknown reduction", name);
  int p2p = o->kind == CCS__SEND || o->kind == CCS__RECV;
  if ((ccs__coll_has_root(o->kind) || p2p) && (o->root < 0 || o->root >= o->comm->nranks))
    return fail(o->comm, CCS_ERR_INVALID_ARGUMENT,
                p2p ? "%s: peer out of range" : "%s: root out of range", name);
  if (ccs__op_lengths(o->kind, o->count, ccs_dtype_size(o->dtype), o->comm->nranks,
                      o->comm->rank, o->root, &o->send_len, &o->recv_len))
    return fail(o->comm, CCS_ERR_INVALID_ARGUMENT, "%s: count overflows", name);
  if ((o->send_len && !o->send) || (o->recv_len && !o->recv))
    return fail(o->comm, CCS_ERR_INVALID_ARGUMENT, "%s: buffer is NULL", name);
  return check_domain(o, stream);
}

/* Staging copies: host memcpy, or queued on the stream for device memory. */
static ccs_result_t stage_copy(const struct op *o, void *dst, const void *src, size_t len) {
  if (o->device >= 0) return ccs__gpu_copy(dst, src, len, o->stream);
  memcpy(dst, src, len);
  return CCS_OK;
}

static size_t align_up(size_t v) { return (v + 63) & ~(size_t)63; }

/* Chooses registered ids or staging for each op's buffers; returns the
 * staging bytes needed. Where the send and receive ranges of a staged op
 * overlap (in-place calls), their union is staged once with its contents,
 * so the daemon sees the same aliasing the caller made. */
static ccs_result_t resolve(struct ccs__conn *c, struct op *ops, size_t n, size_t *ret_bytes) {
  size_t bytes = 0;
  for (size_t i = 0; i < n; i++) {
    struct op *o = &ops[i];
    int send_staged = o->via_host && o->send_len, recv_staged = o->via_host && o->recv_len, r;
    if (o->send_len && !o->via_host) {
      r = ccs__mem_lookup(c, o->send, o->send_len, &o->send_id, &o->send_off);
      if (r < 0) return fail(o->comm, CCS_ERR_SYSTEM, "%s", ccs__error());
      send_staged = r;
    }
    if (o->recv_len && !o->via_host) {
      r = ccs__mem_lookup(c, o->recv, o->recv_len, &o->recv_id, &o->recv_off);
      if (r < 0) return fail(o->comm, CCS_ERR_SYSTEM, "%s", ccs__error());
      recv_staged = r;
    }
    const char *s0 = o->send, *s1 = o->send + o->send_len;
    const char *r0 = o->recv, *r1 = o->recv + o->recv_len;
    if (send_staged && recv_staged && s0 < r1 && r0 < s1) {
      o->stage_lo = s0 < r0 ? s0 : r0;
      o->stage_len = (size_t)((s1 > r1 ? s1 : r1) - o->stage_lo);
      o->stage_in = 1;
    } else {
      if (recv_staged) o->stage_lo = r0, o->stage_len = o->recv_len;
      if (send_staged) o->stage2_lo = s0, o->stage2_len = o->send_len;
    }
    if (o->stage_lo) o->stage_off = bytes, bytes += align_up(o->stage_len);
    if (o->stage2_lo) o->stage2_off = bytes, bytes += align_up(o->stage2_len);
  }
  *ret_bytes = bytes;
  return CCS_OK;
}

static void fill_ref(Ccs__BufRef *ref, const struct op *o, const char *ptr, uint64_t len,
                     uint64_t id, uint64_t off, const struct ccs__staging *st) {
  ref->length = len;
  if (o->stage2_lo && ptr == o->stage2_lo) {
    ref->buffer = st->id;
    ref->offset = o->stage2_off;
  } else if (o->stage_lo && ptr >= o->stage_lo && ptr < o->stage_lo + o->stage_len) {
    ref->buffer = st->id;
    ref->offset = o->stage_off + (uint64_t)(ptr - o->stage_lo);
  } else {
    ref->buffer = id;
    ref->offset = off;
  }
}

/* The staged results back into the caller's buffers (only the receive
 * ranges), on the op's stream for device memory. */
static ccs_result_t copy_out(struct op *ops, size_t n, const struct ccs__staging *st) {
  ccs_result_t rc = CCS_OK;
  for (size_t i = 0; i < n && rc == CCS_OK; i++) {
    struct op *o = &ops[i];
    if (o->stage_lo && o->recv_len)
      rc = stage_copy(o, o->recv, (char *)st->base + o->stage_off + (size_t)(o->recv - o->stage_lo),
                      o->recv_len);
  }
  return rc;
}

/* The call listed while it is out (restart.c): its ops numbered (given,
 * or new). NULL when nothing is listed (no journal), and CCS_OK; with
 * CCS_ERR_DAEMON_UNAVAILABLE when c broke and its keeper moves the comms. */
static struct ccs__call *track(struct ccs__conn *c, const struct op *ops, size_t n,
                               const uint64_t *numbers, ccs_result_t *rc) {
  *rc = CCS_OK;
  struct ccs__call_desc few[8], *d = n <= 8 ? few : malloc(n * sizeof(*d));
  struct ccs__call *call = NULL;
  int moving = 0;
  for (size_t i = 0; d && i < n; i++) {
    const struct op *o = &ops[i];
    /* run again, an in-place op on registered memory would read what it
     * wrote. On a GPU as on the host: a dead daemon's context is torn down,
     * its work stopped, before its process is gone. A small one on the
     * host keeps a copy of its input, put back before it goes again */
    int in_place = o->send_len && o->recv_len && !o->stage_lo && o->send < o->recv + o->recv_len &&
                   o->recv < o->send + o->send_len;
    void *kept = in_place && o->device < 0 && ccs__numbers_sent(c, o->comm) &&
                         o->send_len <= ccs__keep_input_bytes() ? keep_take(o->send_len) : NULL;
    if (kept) memcpy(kept, o->send, o->send_len);
    d[i] = (struct ccs__call_desc){o->comm, o->kind, o->root, in_place && !kept, kept};
  }
  if (d) call = ccs__call_new(c, d, n, numbers, &moving);
  for (size_t i = 0; d && !call && i < n; i++) keep_give(d[i].kept);
  if (d != few) free(d);
  if (moving) {
    *rc = CCS_ERR_DAEMON_UNAVAILABLE;
    ccs__set_error("the connection to ccsd closed");
  }
  return call;
}

/* A call the daemon went under, settled by the keeper (each op finished,
 * to resubmit, or to be repeated by the caller): the finished ops'
 * staged results copied out; ops[0..*n) left with those to resubmit,
 * numbers with their numbers; CCS_ERR_RETRY when the caller must repeat
 * the call. The call is freed. */
static ccs_result_t after_restart(struct ccs__call *call, struct op *ops, size_t *n,
                                  uint64_t *numbers, const struct ccs__staging *st) {
  int finished = 0, repeat = 0;
  for (size_t i = 0; i < *n; i++) {
    finished += call->op[i].verdict == CCS__FINISHED;
    repeat += call->op[i].verdict == CCS__REPEAT;
  }
  for (size_t i = 0; i < *n; i++) /* (in place: the dead daemon may have written over them) */
    if (call->op[i].kept && call->op[i].verdict != CCS__FINISHED)
      memcpy((char *)ops[i].send, call->op[i].kept, ops[i].send_len);
  ccs_result_t rc = CCS_OK;
  if (repeat && finished) { /* repeating it would run the finished ops twice */
    for (size_t i = 0; i < *n; i++)
      ccs__comm_failed(ops[i].comm, CCS_ERR_DAEMON_UNAVAILABLE,
                       "ccsd restarted in the middle of a group: part of it finished, part must be "
                       "repeated; its communicators cannot go on");
    for (size_t i = 0; i < *n; i++)
      if (ops[i].comm->async_error == CCS_OK) ops[i].comm->async_error = CCS_ERR_DAEMON_UNAVAILABLE;
    ccs__set_error("%s", ops[0].comm->last_error);
    rc = CCS_ERR_DAEMON_UNAVAILABLE;
  } else if (repeat) {
    rc = fail(ops[0].comm, CCS_ERR_RETRY, "%s",
              "ccsd restarted while this call ran: repeat it (its outputs are undefined, and an "
              "in-place call's inputs may be overwritten: restore them first)");
    for (size_t i = 1; i < *n; i++)
      snprintf(ops[i].comm->last_error, sizeof(ops[i].comm->last_error), "%s", ccs__error());
  } else {
    size_t kept = 0;
    for (size_t i = 0; i < *n && rc == CCS_OK; i++) {
      if (call->op[i].verdict == CCS__FINISHED) { /* its answer was lost with the daemon */
        rc = copy_out(&ops[i], 1, st);
        continue;
      }
      numbers[kept] = call->op[i].number;
      ops[kept++] = ops[i];
    }
    if (rc == CCS_OK) *n = kept;
  }
  if (rc != CCS_OK) *n = 0;
  call_free(call);
  return rc;
}

/* A call on connection c; numbers: its ops' numbers when resubmitted
 * (given), else filled. *again: MOVED, the call did not go out and goes
 * on the connection the keeper makes; RESUBMITTED, the daemon went under
 * it and its ops left in ops[0..*n) go again under their numbers. */
enum again { DONE, MOVED, RESUBMITTED };
static ccs_result_t submit_on(struct ccs__conn *c, struct op *ops, size_t *n_ops, uint64_t *numbers,
                              int given, enum again *again);

ccs_result_t ccs__submit(struct op *ops, size_t n, const struct ccs__conn *only_on) {
  uint64_t few[8], *numbers = n <= 8 ? few : malloc(sizeof(*numbers) * n);
  if (!numbers) return fail(ops[0].comm, CCS_ERR_NO_MEMORY, "%s", "out of memory");
  int given = 0;
  ccs_result_t rc;
  for (;;) {
    struct ccs__conn *c = ccs__comm_conn(ops[0].comm);
    enum again again = MOVED;
    if (!only_on || c == only_on) rc = submit_on(c, ops, &n, numbers, given, &again);
    if (again == MOVED && only_on) { /* not made: once the keeper is through, the caller's to repeat */
      struct ccs__conn *next = c == only_on ? ccs__conn_successor(c) : NULL;
      if (next) ccs__conn_put(next);
      rc = fail(ops[0].comm, CCS_ERR_RETRY, "%s", "ccsd restarted before this call went out: repeat it");
      again = DONE;
    }
    ccs__conn_put(c);
    if (again == DONE) break;
    given |= again == RESUBMITTED; /* the resubmitted ops keep theirs */
  }
  if (numbers != few) free(numbers);
  return rc;
}

static ccs_result_t submit_on(struct ccs__conn *c, struct op *ops, size_t *n_ops, uint64_t *numbers,
                              int given, enum again *again) {
  size_t n = *n_ops;
  int device = ops[0].device;
  *again = DONE;
  for (size_t i = 0; i < n; i++) {
    struct ccs__conn *ci = ccs__comm_conn(ops[i].comm);
    ccs__conn_put(ci);
    if (ci != c) { /* moved by a keeper since c was looked up, or a mixed group */
      struct ccs__conn *now = ccs__comm_conn(ops[0].comm);
      ccs__conn_put(now);
      if (now != c) *again = MOVED;
      return now != c ? fail(ops[i].comm, CCS_ERR_DAEMON_UNAVAILABLE, "%s", "the connection to ccsd closed")
                      : fail(ops[i].comm, CCS_ERR_INVALID_USAGE, "%s",
                             "a group mixes communicators of different daemon connections");
    }
    if (ops[i].device != device || ops[i].stream != ops[0].stream ||
        ops[i].host_stream != ops[0].host_stream)
      return fail(ops[i].comm, CCS_ERR_INVALID_USAGE, "%s",
                  "the ops of a group use one stream and buffers of one GPU (or host memory)");
    if (ops[i].comm->async_error != CCS_OK)
      return fail(ops[i].comm, ops[i].comm->async_error, "%s", ops[i].comm->last_error);
  }
  /* device buffers of a comm across daemons go through host memory (the
   * daemons move host memory); one staging area per call, so all its
   * device ops do */
  int via_host = 0;
  for (size_t i = 0; i < n; i++) via_host |= ops[i].device >= 0 && ops[i].comm->spans;
  for (size_t i = 0; i < n; i++) ops[i].via_host = via_host && ops[i].device >= 0;
  size_t staged_bytes;
  ccs_result_t rc = resolve(c, ops, n, &staged_bytes);
  if (rc != CCS_OK && ccs__conn_moving(c)) *again = MOVED;
  if (rc != CCS_OK) return rc;
  struct ccs__host_stream *hs = ops[0].host_stream;
  int debug = 0, one_comm = 1, p2p = 0; /* how ops ran comes back only over the socket */
  for (size_t i = 0; i < n; i++) {
    debug |= ops[i].comm->debug;
    one_comm &= ops[i].comm == ops[0].comm;
    p2p |= ops[i].kind == CCS__SEND || ops[i].kind == CCS__RECV;
  }
  int async = hs && device < 0 && !debug && one_comm && !p2p && !staged_bytes && ccs__ring_takes(c, n);
  /* a CUDA stream's call returns once queued, through the stream flags */
  /* (one op alone, no send or receive: a group's ops and a send's pairing
   * run as several ops, each of which would let the stream go) */
  int flagged = device >= 0 && !via_host && ops[0].stream && !debug && n == 1 && !p2p &&
                ccs__ring_takes(c, n) && ccs__ring_stream_flags(c, device) == 0;
  /* the order of a stream, and of a comm whose streams' calls run: what
   * does not follow them through the rings waits for them */
  if (hs && (!async || (hs->inflight && hs->comm != ops[0].comm))) ccs__host_stream_drain(hs);
  if (hs && async && hs->inflight && c->ring) { /* the answers there first: one may be a repeat */
    uint32_t none = 0;
    ccs__ring_wait_idle(c, &none);
  }
  if (hs && (rc = ccs__host_stream_refuse(hs, ops[0].comm)) != CCS_OK) return rc;
  for (size_t i = 0; i < n && !async && !flagged; i++)
    if (ops[i].comm->inflight && (rc = ccs__ring_wait_idle(c, &ops[i].comm->inflight)) != CCS_OK) {
      if (ccs__conn_moving(c)) *again = MOVED;
      return fail(ops[i].comm, rc, "%s", ccs__error());
    }
  struct ccs__staging *st = NULL;
  if (staged_bytes && (rc = ccs__staging_take(c, staged_bytes, via_host ? -1 : device, &st)) != CCS_OK) {
    if (ccs__conn_moving(c)) *again = MOVED;
    return fail(ops[0].comm, rc, "%s", ccs__error());
  }
  /* a blocking call on host buffers is listed while it is out: a daemon
   * restart resubmits it, or finds it finished (restart.c) */
  struct ccs__call *call = NULL;
  if (!async && !flagged) {
    call = track(c, ops, n, given ? numbers : NULL, &rc);
    if (rc != CCS_OK) { /* the daemon went: on the next connection */
      ccs__staging_release(st, NULL);
      *again = MOVED;
      return rc;
    }
    for (size_t i = 0; call && i < n; i++) numbers[i] = call->op[i].number;
  }

  Ccs__Op *msgs = calloc(n, sizeof(*msgs));
  Ccs__Op **ptrs = calloc(n, sizeof(*ptrs));
  Ccs__BufRef *refs = calloc(2 * n, sizeof(*refs));
  if (!msgs || !ptrs || !refs) {
    rc = fail(ops[0].comm, CCS_ERR_NO_MEMORY, "%s", "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    struct op *o = &ops[i];
    Ccs__Op *m = &msgs[i];
    ccs__op__init(m);
    m->comm = o->comm->handle;
    m->kind = o->kind;
    m->count = o->count;
    m->dtype = (uint32_t)o->dtype;
    m->redop = (uint32_t)o->redop;
    m->root = o->root;
    m->whole_count = o->whole_count;
    if (call && ccs__numbers_sent(c, o->comm) && o->kind != CCS__SEND && o->kind != CCS__RECV)
      m->number = (uint32_t)(numbers[i] + 1);
    if (o->send_len) {
      ccs__buf_ref__init(&refs[2 * i]);
      fill_ref(&refs[2 * i], o, o->send, o->send_len, o->send_id, o->send_off, st);
      m->send = &refs[2 * i];
    }
    if (o->recv_len) {
      ccs__buf_ref__init(&refs[2 * i + 1]);
      fill_ref(&refs[2 * i + 1], o, o->recv, o->recv_len, o->recv_id, o->recv_off, st);
      m->recv = &refs[2 * i + 1];
    }
    if (o->stage_lo && o->stage_in &&
        (rc = stage_copy(o, (char *)st->base + o->stage_off, o->stage_lo, o->stage_len)) != CCS_OK)
      goto copy_failed;
    if (o->stage2_lo &&
        (rc = stage_copy(o, (char *)st->base + o->stage2_off, o->stage2_lo, o->stage2_len)) != CCS_OK)
      goto copy_failed;
    ptrs[i] = m;
  }
  if (flagged) {
    struct ccs__ring_claim k;
    if ((rc = ccs__ring_claim(c, ops[0].comm, &k)) != CCS_OK) {
      ccs__comm_failed(ops[0].comm, rc, ccs__error());
      goto out;
    }
    /* the daemon begins once the stream is here; the stream goes on once
     * the daemon is through: both queued before the call goes out */
    int wrote = ccs__gpu_flag_write(ops[0].stream, device, k.ready, k.gen) == CCS_OK;
    if (!wrote || ccs__gpu_flag_wait(ops[0].stream, device, k.done, k.gen) != CCS_OK ||
        ccs__gpu_flag_write(ops[0].stream, device, k.passed, k.gen) != CCS_OK) {
      /* this device queues no flag: the calls of this connection wait instead
       * (a slot whose ready is queued but no passed stays out: one lost) */
      ccs__ring_unclaim(c, &k, wrote);
      ccs__ring_stream_flags_off(c);
      flagged = 0;
      if (ops[0].comm->inflight && (rc = ccs__ring_wait_idle(c, &ops[0].comm->inflight)) != CCS_OK)
        goto copy_failed;
    } else {
      if ((rc = ccs__ring_post_claimed(c, &k, ptrs, n)) != CCS_OK)
        ccs__comm_failed(ops[0].comm, rc, ccs__error());
      else
        rc = copy_out(ops, n, st);
      goto out;
    }
  }
  /* the data is there before the daemon reads it: the stream's work done */
  if (device >= 0 && (rc = ccs__gpu_sync(ops[0].stream)) != CCS_OK) goto copy_failed;
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__Submit sub = CCS__SUBMIT__INIT;
  sub.n_ops = n;
  sub.ops = ptrs;
  req.body_case = CCS__REQUEST__BODY_SUBMIT;
  req.submit = &sub;
  Ccs__Reply *reply = NULL;
  if (async) { /* its answer goes to the stream */
    if ((rc = ccs__ring_post(c, ptrs, n, hs, ops[0].comm)) != CCS_OK && ccs__conn_moving(c)) *again = MOVED;
    else if (rc != CCS_OK) ccs__comm_failed(ops[0].comm, rc, ccs__error());
    goto out;
  }
  if (!debug && ccs__ring_takes(c, n)) rc = ccs__ring_call(c, ptrs, n, call);
  else rc = call ? ccs__conn_call_tracked(c, &req, call, &reply) : ccs__conn_call(c, &req, -1, &reply);
  if (call && rc == CCS_ERR_DAEMON_UNAVAILABLE && (rc = ccs__call_await(call)) == CCS_OK) {
    rc = after_restart(call, ops, n_ops, numbers, st);
    call = NULL;
    if (rc == CCS_OK && *n_ops) *again = RESUBMITTED;
    goto out;
  }
  if (call) {
    ccs__call_answered(call, rc);
    call_free(call);
    call = NULL;
  }
  if (rc == CCS_OK) {
    if (reply && ops[0].comm->debug && reply->info && reply->info[0])
      fprintf(stderr, "ccs INFO rank %d: %s\n", ops[0].comm->rank, reply->info);
    if (reply) ccs__reply__free_unpacked(reply, NULL);
    rc = copy_out(ops, n, st);
    /* (through the host: the results are on the GPU when the call returns) */
    if (rc == CCS_OK && device >= 0 && (!ops[0].stream || via_host)) rc = ccs__gpu_sync(ops[0].stream);
    if (rc != CCS_OK) goto copy_failed;
  } else {
    for (size_t i = 0; i < n; i++) ccs__comm_failed(ops[i].comm, rc, ccs__error());
  }
  goto out;
copy_failed:
  for (size_t i = 0; i < n; i++)
    snprintf(ops[i].comm->last_error, sizeof(ops[i].comm->last_error), "%s", ccs__error());
out:
  call_free(call);
  free(msgs);
  free(ptrs);
  free(refs);
  ccs__staging_release(st, ops[0].stream);
  return rc;
}

static ccs_result_t enqueue(struct op *o, ccs_stream_t stream) {
  ccs_result_t rc = check_op(o, stream);
  if (rc != CCS_OK) return rc;
  if (group.depth == 0) return ccs__parts_fit(o) ? ccs__submit_in_parts(o) : ccs__submit(o, 1, NULL);
  if (group.n == CCS__SUBMIT_MAX_OPS)
    return fail(o->comm, CCS_ERR_INVALID_USAGE, "%s",
                "too many ops in one group (4096 at most)");
  if (group.n == group.cap) {
    size_t cap = group.cap ? 2 * group.cap : 16;
    struct op *grown = realloc(group.ops, cap * sizeof(*grown));
    if (!grown) return fail(o->comm, CCS_ERR_NO_MEMORY, "%s", "out of memory");
    group.ops = grown;
    group.cap = cap;
  }
  group.ops[group.n++] = *o;
  return CCS_OK;
}

CCS__API ccs_result_t ccs_group_start(void) {
  group.depth++;
  return CCS_OK;
}

CCS__API ccs_result_t ccs_group_end(void) {
  if (group.depth == 0) {
    ccs__set_error("ccs_group_end without ccs_group_start");
    return CCS_ERR_INVALID_USAGE;
  }
  if (--group.depth > 0) return CCS_OK;
  ccs_result_t rc = group.n ? ccs__submit(group.ops, group.n, NULL) : CCS_OK;
  free(group.ops);
  group.ops = NULL;
  group.n = group.cap = 0;
  return rc;
}

#define OP(...) (struct op){__VA_ARGS__}

CCS__API ccs_result_t ccs_all_reduce(const void *sendbuf, void *recvbuf, size_t count,
                                     ccs_dtype_t dtype, ccs_redop_t op, ccs_comm_t *comm,
                                     ccs_stream_t stream) {
  struct op o = OP(.comm = comm, .kind = CCS__ALL_REDUCE, .count = count, .dtype = dtype,
                   .redop = op, .send = sendbuf, .recv = recvbuf);
  return enqueue(&o, stream);
}

CCS__API ccs_result_t ccs_broadcast(const void *sendbuf, void *recvbuf, size_t count,
                                    ccs_dtype_t dtype, int root, ccs_comm_t *comm,
                                    ccs_stream_t stream) {
  struct op o = OP(.comm = comm, .kind = CCS__BROADCAST, .count = count, .dtype = dtype,
                   .root = root, .send = sendbuf, .recv = recvbuf);
  return enqueue(&o, stream);
}

CCS__API ccs_result_t ccs_reduce(const void *sendbuf, void *recvbuf, size_t count,
                                 ccs_dtype_t dtype, ccs_redop_t op, int root, ccs_comm_t *comm,
                                 ccs_stream_t stream) {
  struct op o = OP(.comm = comm, .kind = CCS__REDUCE, .count = count, .dtype = dtype,
                   .redop = op, .root = root, .send = sendbuf, .recv = recvbuf);
  return enqueue(&o, stream);
}

CCS__API ccs_result_t ccs_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                     ccs_dtype_t dtype, ccs_comm_t *comm, ccs_stream_t stream) {
  struct op o = OP(.comm = comm, .kind = CCS__ALL_GATHER, .count = sendcount, .dtype = dtype,
                   .send = sendbuf, .recv = recvbuf);
  return enqueue(&o, stream);
}

CCS__API ccs_result_t ccs_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                         ccs_dtype_t dtype, ccs_redop_t op, ccs_comm_t *comm,
                                         ccs_stream_t stream) {
  struct op o = OP(.comm = comm, .kind = CCS__REDUCE_SCATTER, .count = recvcount,
                   .dtype = dtype, .redop = op, .send = sendbuf, .recv = recvbuf);
  return enqueue(&o, stream);
}

CCS__API ccs_result_t ccs_all_to_all(const void *sendbuf, void *recvbuf, size_t count,
                                     ccs_dtype_t dtype, ccs_comm_t *comm, ccs_stream_t stream) {
  struct op o = OP(.comm = comm, .kind = CCS__ALL_TO_ALL, .count = count, .dtype = dtype,
                   .send = sendbuf, .recv = recvbuf);
  return enqueue(&o, stream);
}

CCS__API ccs_result_t ccs_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                                 ccs_dtype_t dtype, int root, ccs_comm_t *comm,
                                 ccs_stream_t stream) {
  struct op o = OP(.comm = comm, .kind = CCS__GATHER, .count = sendcount, .dtype = dtype,
                   .root = root, .send = sendbuf, .recv = recvbuf);
  return enqueue(&o, stream);
}

CCS__API ccs_result_t ccs_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                  ccs_dtype_t dtype, int root, ccs_comm_t *comm,
                                  ccs_stream_t stream) {
  struct op o = OP(.comm = comm, .kind = CCS__SCATTER, .count = recvcount, .dtype = dtype,
                   .root = root, .send = sendbuf, .recv = recvbuf);
  return enqueue(&o, stream);
}

CCS__API ccs_result_t ccs_send(const void *sendbuf, size_t count, ccs_dtype_t dtype, int peer,
                               ccs_comm_t *comm, ccs_stream_t stream) {
  struct op o = OP(.comm = comm, .kind = CCS__SEND, .count = count, .dtype = dtype,
                   .root = peer, .send = sendbuf);
  return enqueue(&o, stream);
}

CCS__API ccs_result_t ccs_recv(void *recvbuf, size_t count, ccs_dtype_t dtype, int peer,
                               ccs_comm_t *comm, ccs_stream_t stream) {
  struct op o = OP(.comm = comm, .kind = CCS__RECV, .count = count, .dtype = dtype,
                   .root = peer, .recv = recvbuf);
  return enqueue(&o, stream);
}

CCS__API ccs_result_t ccs_barrier(ccs_comm_t *comm) {
  struct op o = OP(.comm = comm, .kind = CCS__BARRIER);
  return enqueue(&o, NULL);
}
