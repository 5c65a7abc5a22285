/* The fast path, the client's side (proto/ring.h): the rings are made
 * when the connection opens (unless CCS_RING=0), calls on host buffers go
 * through them, and a caller waits for its answer spinning for
 * CCS_SPIN_US (yielding the CPU to whoever else wants it), then asleep on
 * the futex done_tail, which the daemon wakes. A sleeper looks at the
 * socket every 50 ms: a daemon that died is noticed within that.
 *
 * Threads share the rings under one lock: whoever holds it publishes its
 * batch, or takes every completion that arrived into the table of calls
 * (a call is known by its slot there, which its request id carries), so
 * each waiter finds its own answer whoever took it.
 *
 * A call on device buffers in a CUDA stream's order owns the stream flags
 * of its slot while it is out (proto/ring.h): nobody waits for its answer,
 * which goes to its comm. Every way it can end lets its stream go: the
 * daemon's stream or host writes `done`; a failure answered here, or a
 * call that never went out, is written here; and a guard thread, started
 * with the first such call, writes every one still out when the daemon's
 * end of the socket closes (a job blocked in cudaStreamSynchronize calls
 * nothing of libccs that could notice), or when the daemon's beat in the
 * rings stood still for CCS_STALL_TIMEOUT while they were out (a daemon
 * stopped, or its loop stuck, keeps its socket open). */
#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "journal.h"
#include "ring.h"

#define SLEEP_CHECK_NS 50000000L /* a sleeper looks at the socket this often */

struct call {
  uint64_t gen; /* which use of the slot: the request id is gen * entries + slot */
  int busy, done;
  ccs_result_t status;
  char *text; /* the error text, when not CCS_OK */
  /* a host stream's call: nobody waits; its answer goes to them */
  struct ccs__host_stream *stream;
  ccs_comm_t *comm;
  uint64_t number; /* a host stream's: its ops' numbers among comm's collectives (restart.c) */
  uint32_t nops;
  int device; /* a CUDA stream's call (its flags): nobody waits; its answer goes to comm */
  int draining; /* answered, its stream not yet past it (flags.passed): not free yet */
};

struct ccs__ring {
  struct ccs__ring_shared *sh;
  int bell;
  pthread_mutex_t mu; /* the rest, and publishing */
  uint32_t sub_tail, done_head;
  struct call calls[CCS__RING_ENTRIES];
  uint16_t free_slots[CCS__RING_ENTRIES];
  uint32_t nfree;
  uint64_t spin_ns;
  _Atomic int alone; /* the last yield of a wait came back at once: nobody shares this CPU */
  int flags_state; /* the stream flags: 0 not tried, 1 registered with CUDA, -1 unusable */
  int daemon_flags; /* the daemon took them (RingSetup's reply) */
  uint32_t beat_ms; /* the daemon's beat comes at least this often (0: it has none) */
  int dead;         /* the guard saw the daemon's end close: no call goes out any more */
  uint32_t ndraining;
  int guard_stop;  /* an eventfd that ends the guard thread; -1: none runs */
  pid_t guard_pid; /* the process that started it */
  pthread_t guard;
  struct ccs__journal *journal; /* the connection's (restart.c), or NULL: its op numbers */
};


static void let_all_go(struct ccs__ring *r, const char *why);

void ccs__ring_free(struct ccs__ring *r) {
  if (!r) return;
  if (r->guard_stop >= 0 && r->guard_pid == getpid()) {
    uint64_t one = 1;
    if (write(r->guard_stop, &one, sizeof(one)) == sizeof(one)) pthread_join(r->guard, NULL);
  }
  if (r->guard_stop >= 0) close(r->guard_stop);
  if (r->flags_state == 1) {
    /* streams may still wait for (or write) these flags: they go on, and
     * the flags' page stays mapped and registered for the process's life */
    let_all_go(r, "the connection to ccsd closed with calls of a CUDA stream out");
    char *page = (char *)&r->sh->flags, *end = (char *)r->sh + CCS__RING_BYTES;
    munmap(r->sh, (size_t)(page - (char *)r->sh));
    if (end > page + 4096) munmap(page + 4096, (size_t)(end - page - 4096));
  } else {
    munmap(r->sh, CCS__RING_BYTES);
  }
  close(r->bell);
  for (uint32_t i = 0; i < CCS__RING_ENTRIES; i++) free(r->calls[i].text);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

void ccs__ring_open(struct ccs__conn *c) {
  const char *want = getenv("CCS_RING");
  if (want && !strcmp(want, "0")) return;
  struct ccs__ring *r = calloc(1, sizeof(*r));
  int memfd = -1;
  void *map = NULL;
  if (!r || ccs__memfd_map(CCS__RING_BYTES, &memfd, &map) != CCS_OK) {
    free(r);
    return; /* the socket serves every call */
  }
  r->sh = map;
  r->guard_stop = -1;
  r->bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  pthread_mutex_init(&r->mu, NULL);
  for (uint32_t i = 0; i < CCS__RING_ENTRIES; i++) r->free_slots[i] = (uint16_t)(CCS__RING_ENTRIES - 1 - i);
  r->nfree = CCS__RING_ENTRIES;
  const char *spin = getenv("CCS_SPIN_US");
  r->spin_ns = (spin && *spin ? strtoull(spin, NULL, 10) : 100) * 1000;
  r->sh->magic = CCS__RING_MAGIC;
  r->sh->protocol = CCS__PROTOCOL_VERSION;
  r->sh->entries = CCS__RING_ENTRIES;
  r->sh->batch_max = CCS__RING_BATCH_MAX;
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__RingSetup setup = CCS__RING_SETUP__INIT;
  req.body_case = CCS__REQUEST__BODY_RING_SETUP;
  req.ring_setup = &setup;
  Ccs__Reply *reply;
  int fds[2] = {memfd, r->bell};
  ccs_result_t rc = r->bell >= 0 ? ccs__conn_call_fds(c, &req, fds, 2, &reply) : CCS_ERR_SYSTEM;
  close(memfd);
  if (rc != CCS_OK) { /* an older daemon, or none: the socket serves every call */
    ccs__ring_free(r);
    return;
  }
  if (reply->body_case == CCS__REPLY__BODY_RING_SETUP) {
    r->daemon_flags = reply->ring_setup->stream_flags;
    r->beat_ms = reply->ring_setup->beat_ms;
  }
  ccs__reply__free_unpacked(reply, NULL);
  c->ring = r;
}

void ccs__ring_journal(struct ccs__conn *c) {
  if (c->ring) c->ring->journal = c->journal;
}

/* Under r->mu: the daemon's number for slot's finished call of one
 * collective (the journal's), 0: none. */
static uint32_t seq_of(const struct ccs__ring *r, uint32_t slot) {
  const struct call *call = &r->calls[slot];
  if (!r->journal || call->status != CCS_OK || call->nops != 1) return 0;
  return ccs__journal_seq(r->journal, ccs__journal_key(call->gen * CCS__RING_ENTRIES + slot, 1));
}

int ccs__ring_takes(const struct ccs__conn *c, size_t nops) {
  return c->ring && nops <= CCS__RING_BATCH_MAX;
}

static void slot_free(struct ccs__ring *r, uint32_t slot) {
  struct call *call = &r->calls[slot];
  free(call->text);
  call->text = NULL;
  call->busy = 0;
  call->stream = NULL;
  call->comm = NULL;
  call->device = 0;
  r->free_slots[r->nfree++] = (uint16_t)slot;
}

/* Under r->mu: a host stream's call answered. */
static void stream_call_done(struct ccs__ring *r, uint32_t slot) {
  struct call *call = &r->calls[slot];
  struct ccs__host_stream *s = call->stream;
  const char *text = call->text ? call->text : ccs_strerror(call->status);
  /* (refused for a quota: as one to repeat, the calls after it too) */
  if (call->status == CCS_ERR_RETRY || call->status == CCS_ERR_QUOTA) {
    s->to_repeat++;
    if (call->comm) ccs__host_stream_owes(s, call->comm);
  }
  if (call->status != CCS_OK && s->error == CCS_OK) {
    s->error = call->status;
    snprintf(s->error_text, sizeof(s->error_text), "%s", text);
  }
  if (--s->inflight == 0) {
    s->conn = NULL;
    s->comm = NULL;
  }
  if (call->comm) {
    call->comm->inflight--;
    if (ccs__chan_settled(call->comm, 0, call->number, call->nops, call->status, seq_of(r, slot))) {
      char why[CCS__ERROR_TEXT_MAX];
      snprintf(why, sizeof(why), "a host stream's call was refused while later calls were out, which "
               "the other ranks' calls no longer line up with: the communicator cannot go on (%.300s)", text);
      ccs__comm_failed(call->comm, CCS_ERR_INVALID_USAGE, why);
      if (call->comm->async_error == CCS_OK) call->comm->async_error = CCS_ERR_INVALID_USAGE;
    } else if (call->status != CCS_OK) {
      ccs__comm_failed(call->comm, call->status, text);
    }
  }
  slot_free(r, slot);
}

/* The CUDA stream of a device call in slot may go on: from the host,
 * never lowering what the daemon wrote. */
static void let_go(struct ccs__ring *r, uint32_t slot) {
  _Atomic uint32_t *done = &r->sh->flags.done[slot];
  uint32_t gen = (uint32_t)r->calls[slot].gen, cur = atomic_load(done);
  while ((int32_t)(cur - gen) < 0 && !atomic_compare_exchange_weak(done, &cur, gen)) {
  }
}

/* Under r->mu: a device call's slot serves again once its stream wrote
 * passed (until then it drains); reclaim frees those that got there. */
static int passed(const struct ccs__ring *r, uint32_t slot) {
  return (int32_t)(atomic_load(&r->sh->flags.passed[slot]) - (uint32_t)r->calls[slot].gen) >= 0;
}

static void device_slot_free(struct ccs__ring *r, uint32_t slot) {
  if (passed(r, slot)) {
    slot_free(r, slot);
    return;
  }
  struct call *call = &r->calls[slot];
  call->draining = 1;
  call->comm = NULL;
  r->ndraining++;
}

static void reclaim(struct ccs__ring *r) {
  for (uint32_t i = 0; r->ndraining && i < CCS__RING_ENTRIES; i++)
    if (r->calls[i].draining && passed(r, i)) {
      r->calls[i].draining = 0;
      r->ndraining--;
      slot_free(r, i);
    }
}

/* Under r->mu: a CUDA stream's call answered. */
static void device_call_done(struct ccs__ring *r, uint32_t slot) {
  struct call *call = &r->calls[slot];
  if (call->comm) {
    call->comm->inflight--;
    ccs__chan_settled(call->comm, 0, call->number, call->nops, call->status, seq_of(r, slot));
    if (call->status != CCS_OK) { /* nobody saw the call fail: every failure is the comm's */
      ccs__comm_failed(call->comm, call->status, call->text ? call->text : ccs_strerror(call->status));
      if (call->comm->async_error == CCS_OK) call->comm->async_error = call->status;
    }
  }
  if (call->status != CCS_OK) let_go(r, slot); /* it may never have reached a GPU */
  device_slot_free(r, slot);
}

/* Under r->mu: every completion that arrived, into its call. */
static void take_completions(struct ccs__ring *r) {
  reclaim(r);
  uint32_t tail = atomic_load_explicit(&r->sh->done_tail, memory_order_acquire);
  for (; r->done_head != tail; r->done_head++) {
    uint32_t slot = r->done_head % CCS__RING_ENTRIES;
    struct ccs__ring_done d = r->sh->done[slot];
    struct call *call = &r->calls[d.req_id % CCS__RING_ENTRIES];
    if (!call->busy || call->done || d.req_id / CCS__RING_ENTRIES != call->gen) continue;
    call->status = (ccs_result_t)d.status;
    if (d.status != CCS_OK) {
      uint32_t len = d.text_len < CCS__ERROR_TEXT_MAX ? d.text_len : CCS__ERROR_TEXT_MAX - 1;
      if ((call->text = malloc(len + 1)) != NULL) {
        memcpy(call->text, r->sh->text[slot], len);
        call->text[len] = 0;
      }
    }
    call->done = 1;
    if (call->stream) stream_call_done(r, d.req_id % CCS__RING_ENTRIES);
    else if (call->device) device_call_done(r, d.req_id % CCS__RING_ENTRIES);
  }
  atomic_store_explicit(&r->sh->done_head, r->done_head, memory_order_release);
}

/* Until done_tail moves past seen: spinning (then yielding) for the spin
 * budget, then asleep on it. CCS_OK, or the connection's failure. Only a
 * few pauses before yielding: where ranks and the daemon share CPUs the
 * daemon must run for the answer to come (8 B all_reduce, 4 ranks on 2
 * CPUs: 8.6 us after 64 pauses, 7.3 us after 8). A yield that comes
 * straight back means nobody shares this CPU: then pauses alone for a
 * while (proto/ring.h), and the next wait starts so, since an answer
 * that comes during a yield waits for its system call. */
static ccs_result_t wait_done(struct ccs__conn *c, uint32_t seen) {
  struct ccs__ring_shared *sh = c->ring->sh;
  uint64_t start = ccs__now_ns();
  uint64_t watch_until = atomic_load_explicit(&c->ring->alone, memory_order_relaxed)
                             ? start + CCS__WATCH_ALONE_NS : 0;
  for (unsigned k = 0;; k++) { /* (pauses count too: unsigned, it wraps harmlessly) */
    if (atomic_load_explicit(&sh->done_tail, memory_order_acquire) != seen) return CCS_OK;
    if (k < 8 || (watch_until && ((k & 15) || ccs__now_ns() < watch_until))) {
      ccs__cpu_relax();
      continue;
    }
    uint64_t yielded = ccs__now_ns();
    if (yielded - start >= c->ring->spin_ns) break;
    sched_yield();
    uint64_t back = ccs__now_ns(); /* alone on this CPU: watch a while without system calls */
    int alone = back - yielded < CCS__YIELD_ALONE_NS;
    atomic_store_explicit(&c->ring->alone, alone, memory_order_relaxed);
    watch_until = alone ? back + CCS__WATCH_ALONE_NS : 0;
  }
  for (;;) {
    atomic_fetch_add_explicit(&sh->client_waiting, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&sh->done_tail, memory_order_seq_cst) == seen) {
      struct timespec t = {0, SLEEP_CHECK_NS};
      syscall(SYS_futex, (uint32_t *)&sh->done_tail, FUTEX_WAIT, seen, &t, NULL, 0);
    }
    atomic_fetch_sub_explicit(&sh->client_waiting, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&sh->done_tail, memory_order_acquire) != seen) return CCS_OK;
    ccs_result_t broken = ccs__conn_check(c);
    if (broken != CCS_OK) return broken;
  }
}

static void fill(struct ccs__ring_op *e, const Ccs__Op *op, uint64_t req_id, uint32_t index,
                 uint32_t nops, uint32_t flags, uint32_t slot, uint32_t gen) {
  *e = (struct ccs__ring_op){.req_id = req_id, .index = index, .nops = nops, .comm = op->comm,
                             .kind = op->kind, .dtype = op->dtype, .redop = op->redop,
                             .root = op->root, .count = op->count, .flags = flags,
                             .order_slot = slot, .order_gen = gen, .number = op->number};
  if (op->whole_count) { /* (a part: never in a CUDA stream's order) */
    e->flags |= CCS__RING_OP_PART;
    e->order_slot = (uint32_t)op->whole_count;
    e->order_gen = (uint32_t)(op->whole_count >> 32);
  }
  if (op->send) e->send = (struct ccs__ring_buf){op->send->buffer, op->send->offset, op->send->length};
  if (op->recv) e->recv = (struct ccs__ring_buf){op->recv->buffer, op->recv->offset, op->recv->length};
}

/* Takes r->mu and returns holding it once there is a free call slot (when
 * `slot`) and room for n entries: both free up as the daemon goes on (it
 * takes entries without being asked). -1, unlocked, when the connection
 * broke meanwhile. */
static int wait_for(struct ccs__conn *c, int slot, size_t n) {
  struct ccs__ring *r = c->ring;
  struct ccs__ring_shared *sh = r->sh;
  pthread_mutex_lock(&r->mu);
  uint64_t since = ccs__now_ns();
  while ((slot && r->nfree == 0) ||
         CCS__RING_ENTRIES - (r->sub_tail - atomic_load_explicit(&sh->sub_head, memory_order_acquire)) < n) {
    take_completions(r);
    int no_slot = slot && r->nfree == 0 && r->ndraining == 0;
    uint32_t seen = r->done_head;
    pthread_mutex_unlock(&r->mu);
    ccs_result_t rc = CCS_OK;
    if (no_slot) rc = wait_done(c, seen); /* (slots draining come free without an answer) */
    else if (ccs__now_ns() - since < SLEEP_CHECK_NS) sched_yield();
    else rc = ccs__conn_check(c), since = ccs__now_ns();
    if (rc != CCS_OK) return -1;
    pthread_mutex_lock(&r->mu);
  }
  return 0;
}

/* Under r->mu: a free slot becomes the call's (a host stream's when s, a
 * CUDA stream's when device; nops: its ops, a host stream's numbered). */
static uint32_t take_slot(struct ccs__conn *c, struct ccs__host_stream *s, ccs_comm_t *comm,
                          int device, size_t nops) {
  struct ccs__ring *r = c->ring;
  uint32_t slot = r->free_slots[--r->nfree];
  struct call *call = &r->calls[slot];
  call->gen++;
  call->busy = 1;
  call->done = 0;
  call->stream = s;
  call->comm = comm;
  call->device = device;
  if (s) {
    s->inflight++;
    s->conn = c;
    s->comm = comm;
  }
  if (s || device) { /* numbered: its ops are collectives of comm (restart.c) */
    call->nops = (uint32_t)nops;
    call->number = ccs__chan_take(comm, 0, nops);
  }
  if (s || device) comm->inflight++;
  return slot;
}

/* Under r->mu, which it lets go: the ops as call `slot`'s entries, and the
 * doorbell if the daemon sleeps. */
static void put(struct ccs__conn *c, uint32_t slot, Ccs__Op *const *ops, size_t n, uint32_t flags) {
  struct ccs__ring *r = c->ring;
  struct ccs__ring_shared *sh = r->sh;
  struct call *call = &r->calls[slot];
  uint64_t req_id = call->gen * CCS__RING_ENTRIES + slot;
  for (size_t i = 0; i < n; i++) {
    struct ccs__ring_op *e = &sh->sub[(r->sub_tail + i) % CCS__RING_ENTRIES];
    fill(e, ops[i], req_id, (uint32_t)i, (uint32_t)n, flags, slot, (uint32_t)call->gen);
    if ((call->stream || call->device) && call->comm && ccs__numbers_sent(c, call->comm))
      e->number = (uint32_t)(call->number + i + 1); /* (take_slot) */
  }
  r->sub_tail += (uint32_t)n;
  atomic_store_explicit(&sh->sub_tail, r->sub_tail, memory_order_seq_cst);
  pthread_mutex_unlock(&r->mu);
  if (atomic_load_explicit(&sh->daemon_sleeping, memory_order_seq_cst)) {
    uint64_t one = 1;
    if (write(r->bell, &one, sizeof(one)) < 0) { /* a full counter: the bell rings already */ }
  }
}

static uint64_t r_req_id(const struct ccs__ring *r, uint32_t slot) {
  return r->calls[slot].gen * CCS__RING_ENTRIES + slot;
}

/* Publishes the ops as one call (a host stream's when s): its slot, or -1
 * when the connection broke meanwhile. call (or NULL) gets its key. */
static int publish(struct ccs__conn *c, Ccs__Op *const *ops, size_t n, struct ccs__host_stream *s,
                   ccs_comm_t *comm, struct ccs__call *call) {
  if (wait_for(c, 1, n)) return -1;
  if (c->broken) { /* its keeper reports what is out: nothing more goes */
    pthread_mutex_unlock(&c->ring->mu);
    return -1;
  }
  uint32_t slot = take_slot(c, s, comm, 0, n);
  if (call) ccs__call_keyed(call, ccs__journal_key(r_req_id(c->ring, slot), 1));
  put(c, slot, ops, n, s ? CCS__RING_OP_ORDERED : 0);
  return (int)slot;
}

ccs_result_t ccs__ring_post(struct ccs__conn *c, Ccs__Op *const *ops, size_t n,
                            struct ccs__host_stream *s, ccs_comm_t *comm) {
  return publish(c, ops, n, s, comm, NULL) < 0 ? ccs__conn_broken_error(c) : CCS_OK;
}

ccs_result_t ccs__ring_wait_idle(struct ccs__conn *c, const uint32_t *count) {
  struct ccs__ring *r = c->ring;
  if (!r) return CCS_OK; /* no rings: nothing is ever in flight */
  ccs_result_t rc = CCS_OK;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    take_completions(r);
    if (*count == 0) break;
    uint32_t seen = r->done_head;
    pthread_mutex_unlock(&r->mu);
    rc = wait_done(c, seen);
    pthread_mutex_lock(&r->mu);
    if (rc != CCS_OK) break;
  }
  pthread_mutex_unlock(&r->mu);
  return rc == CCS_OK ? CCS_OK : ccs__conn_broken_error(c);
}

int ccs__ring_stream_numbers(struct ccs__conn *c, const ccs_comm_t *comm, uint64_t *first, uint64_t *end) {
  struct ccs__ring *r = c->ring;
  int device = 0;
  *first = UINT64_MAX, *end = 0;
  if (!r) return 0;
  pthread_mutex_lock(&r->mu);
  /* the answers the daemon wrote before it went count first: a call one
   * rank saw finish finished for all (its report says so) */
  take_completions(r);
  for (uint32_t i = 0; i < CCS__RING_ENTRIES; i++) {
    const struct call *call = &r->calls[i];
    if (!call->busy || call->done || call->comm != comm) continue;
    device += call->device != 0;
    if (!call->stream) continue;
    if (call->number < *first) *first = call->number;
    if (call->number + call->nops > *end) *end = call->number + call->nops;
  }
  pthread_mutex_unlock(&r->mu);
  return device;
}

void ccs__ring_settle_streams(struct ccs__conn *c, ccs_comm_t *comm, uint64_t finished) {
  struct ccs__ring *r = c->ring;
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  for (uint32_t i = 0; i < CCS__RING_ENTRIES; i++) {
    struct call *call = &r->calls[i];
    if (!call->busy || call->done || !call->stream || (comm && call->comm != comm)) continue;
    call->done = 1;
    if (!comm) {
      call->status = CCS_ERR_DAEMON_UNAVAILABLE;
      call->text = strdup("the connection to ccsd closed under this host stream's call, and its "
                          "communicator could not be rejoined");
    } else if (call->number + call->nops <= finished) {
      call->status = CCS_OK; /* its answer was lost with the daemon */
    } else if (call->number < finished) { /* repeating it would run its first ops twice */
      call->status = CCS_ERR_DAEMON_UNAVAILABLE;
      call->text = strdup("ccsd restarted in the middle of a host stream's call: part of it "
                          "finished, part must be repeated; the communicator cannot go on");
      if (comm->async_error == CCS_OK) comm->async_error = CCS_ERR_DAEMON_UNAVAILABLE;
    } else {
      call->status = CCS_ERR_RETRY;
      call->text = strdup("ccsd restarted before this call of the host stream finished: repeat "
                          "it (its outputs, and the inputs of an in-place call, are undefined)");
    }
    stream_call_done(r, i);
  }
  pthread_mutex_unlock(&r->mu);
}

void ccs__ring_forget_comm(struct ccs__conn *c, const ccs_comm_t *comm) {
  struct ccs__ring *r = c->ring;
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  for (uint32_t i = 0; i < CCS__RING_ENTRIES; i++)
    if (r->calls[i].comm == comm) r->calls[i].comm = NULL;
  pthread_mutex_unlock(&r->mu);
}

ccs_result_t ccs__ring_call(struct ccs__conn *c, Ccs__Op *const *ops, size_t n, struct ccs__call *rec) {
  struct ccs__ring *r = c->ring;
  int slot = publish(c, ops, n, NULL, NULL, rec);
  if (slot < 0) return ccs__conn_broken_error(c);
  struct call *call = &r->calls[slot];
  ccs_result_t rc = CCS_OK;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    take_completions(r);
    if (call->done) break;
    uint32_t seen = r->done_head;
    pthread_mutex_unlock(&r->mu);
    rc = wait_done(c, seen);
    pthread_mutex_lock(&r->mu);
    if (rc != CCS_OK) break;
  }
  int answered = call->done;
  if (answered) { /* else the connection broke: the slot stays taken, never reused */
    if ((rc = call->status) != CCS_OK)
      ccs__set_error("%s", call->text && *call->text ? call->text : ccs_strerror(rc));
    slot_free(r, (uint32_t)slot);
  }
  pthread_mutex_unlock(&r->mu);
  return answered ? rc : ccs__conn_broken_error(c);
}

/* --- calls in a CUDA stream's order ----------------------------------------- */

/* Every device call still out: its stream goes on, its comm learns why. */
static void let_all_go(struct ccs__ring *r, const char *why) {
  pthread_mutex_lock(&r->mu);
  r->dead = 1;
  for (uint32_t i = 0; i < CCS__RING_ENTRIES; i++) {
    struct call *call = &r->calls[i];
    if (!call->busy || call->done || !call->device) continue;
    let_go(r, i);
    if (call->comm) ccs__comm_failed(call->comm, CCS_ERR_DAEMON_UNAVAILABLE, why);
  }
  pthread_mutex_unlock(&r->mu);
}

struct guard_args {
  struct ccs__ring *r;
  int fd;
  uint64_t stall_ns;
};

/* Every device call out ends here as failed: its stream goes on, its comm
 * fails; what the daemon may still answer for it is ignored (the call is
 * done). Later calls go out as ever: the daemon may come back. */
static void give_up_device_calls(struct ccs__ring *r, const char *why) {
  pthread_mutex_lock(&r->mu);
  for (uint32_t i = 0; i < CCS__RING_ENTRIES; i++) {
    struct call *call = &r->calls[i];
    if (!call->busy || call->done || !call->device) continue;
    call->done = 1;
    call->status = CCS_ERR_DAEMON_UNAVAILABLE;
    free(call->text);
    call->text = strdup(why);
    device_call_done(r, i);
  }
  pthread_mutex_unlock(&r->mu);
}

/* How long calls of a CUDA stream may stay out while the daemon's beat
 * stands still (CCS_STALL_TIMEOUT, seconds, default 30, three beats at
 * least; 0: no limit); 0 too where the daemon has no beat. */
static uint64_t stall_ns(const struct ccs__ring *r) {
  const char *v = getenv("CCS_STALL_TIMEOUT");
  double s = v && *v ? strtod(v, NULL) : 30, least = 3e-3 * r->beat_ms;
  if (!r->beat_ms || !(s > 0)) return 0;
  return (uint64_t)((s < least ? least : s) * 1e9);
}

static int device_calls_out(struct ccs__ring *r) {
  int out = 0;
  pthread_mutex_lock(&r->mu);
  for (uint32_t i = 0; i < CCS__RING_ENTRIES && !out; i++)
    out = r->calls[i].busy && !r->calls[i].done && r->calls[i].device;
  pthread_mutex_unlock(&r->mu);
  return out;
}

/* Sleeps until the daemon's end of the socket closes (or the ring is
 * freed), looking at the daemon's beat meanwhile: asks for no events, so
 * it never takes a reply from the threads that read them; a hang-up is
 * reported anyway. */
static void *guard(void *arg) {
  struct ccs__ring *r = ((struct guard_args *)arg)->r;
  struct pollfd p[2] = {{((struct guard_args *)arg)->fd, 0, 0}, {r->guard_stop, POLLIN, 0}};
  uint64_t stall = ((struct guard_args *)arg)->stall_ns, beat_at = ccs__now_ns();
  free(arg);
  uint32_t beat = atomic_load_explicit(&r->sh->daemon_beat, memory_order_relaxed);
  int every_ms = stall ? (int)(stall / 4000000 < 10 ? 10 : stall / 4000000 > 1000 ? 1000 : stall / 4000000) : -1;
  for (;;) {
    if (poll(p, 2, every_ms) < 0) {
      if (errno == EINTR) continue;
      return NULL;
    }
    if (p[1].revents) return NULL;
    if (p[0].revents & (POLLHUP | POLLERR | POLLNVAL)) {
      let_all_go(r, "the connection to ccsd closed with calls of a CUDA stream out");
      return NULL;
    }
    if (!stall) continue;
    uint32_t now_beat = atomic_load_explicit(&r->sh->daemon_beat, memory_order_relaxed);
    uint64_t now = ccs__now_ns();
    if (now_beat != beat || !device_calls_out(r)) { /* alive, or nothing to lose */
      beat = now_beat;
      beat_at = now;
    } else if (now - beat_at >= stall) {
      char why[200];
      snprintf(why, sizeof(why), "ccsd showed no sign of life for %.1f s with calls of a CUDA "
               "stream out (stopped, or its loop stuck): their streams go on, their outputs are "
               "undefined", (double)(now - beat_at) / 1e9);
      give_up_device_calls(r, why);
      beat_at = now;
    }
  }
}

/* Under r->mu: 0 once the guard thread runs. */
static int guard_start(struct ccs__conn *c) {
  struct ccs__ring *r = c->ring;
  if (r->guard_stop >= 0) return 0;
  struct guard_args *g = malloc(sizeof(*g));
  if (!g) return -1;
  *g = (struct guard_args){r, c->fd, stall_ns(r)};
  r->guard_stop = eventfd(0, EFD_CLOEXEC);
  r->guard_pid = getpid();
  if (r->guard_stop >= 0 && pthread_create(&r->guard, NULL, guard, g) == 0) return 0;
  free(g);
  if (r->guard_stop >= 0) close(r->guard_stop);
  r->guard_stop = -1;
  return -1;
}

int ccs__ring_guard_start(struct ccs__conn *c) {
  pthread_mutex_lock(&c->ring->mu);
  int rc = guard_start(c);
  pthread_mutex_unlock(&c->ring->mu);
  return rc;
}

int ccs__ring_stream_flags(struct ccs__conn *c, int device) {
  struct ccs__ring *r = c->ring;
  if (!r) return -1;
  pthread_mutex_lock(&r->mu);
  if (r->flags_state == 0) {
    r->flags_state = r->daemon_flags && ccs__gpu_flags_register(&r->sh->flags, device) == CCS_OK ? 1 : -1;
    if (r->flags_state == 1 && guard_start(c)) { /* no guard: never */
      ccs__gpu_flags_unregister(&r->sh->flags);
      r->flags_state = -1;
    }
  }
  int usable = r->flags_state == 1 ? 0 : -1;
  pthread_mutex_unlock(&r->mu);
  return usable;
}

void ccs__ring_stream_flags_off(struct ccs__conn *c) {
  pthread_mutex_lock(&c->ring->mu);
  c->ring->flags_state = -1;
  pthread_mutex_unlock(&c->ring->mu);
}

ccs_result_t ccs__ring_claim(struct ccs__conn *c, ccs_comm_t *comm, struct ccs__ring_claim *ret) {
  if (wait_for(c, 1, 0)) return ccs__conn_broken_error(c);
  struct ccs__ring *r = c->ring;
  if (r->dead) { /* nobody would ever write its done */
    pthread_mutex_unlock(&r->mu);
    ccs__set_error("the connection to ccsd closed");
    return CCS_ERR_DAEMON_UNAVAILABLE;
  }
  uint32_t slot = take_slot(c, NULL, comm, 1, 1);
  struct ccs__ring_flags *f = &r->sh->flags;
  *ret = (struct ccs__ring_claim){slot, (uint32_t)r->calls[slot].gen, &f->ready[slot], &f->done[slot],
                                  &f->passed[slot]};
  pthread_mutex_unlock(&r->mu);
  return CCS_OK;
}

ccs_result_t ccs__ring_post_claimed(struct ccs__conn *c, const struct ccs__ring_claim *k,
                                    Ccs__Op *const *ops, size_t n) {
  if (wait_for(c, 0, n)) {
    ccs__ring_unclaim(c, k, 1);
    return ccs__conn_broken_error(c);
  }
  if (c->ring->dead) {
    pthread_mutex_unlock(&c->ring->mu);
    ccs__ring_unclaim(c, k, 1);
    ccs__set_error("the connection to ccsd closed");
    return CCS_ERR_DAEMON_UNAVAILABLE;
  }
  put(c, k->slot, ops, n, CCS__RING_OP_STREAM);
  return CCS_OK;
}

void ccs__ring_unclaim(struct ccs__conn *c, const struct ccs__ring_claim *k, int queued) {
  struct ccs__ring *r = c->ring;
  pthread_mutex_lock(&r->mu);
  struct call *call = &r->calls[k->slot];
  if (call->busy && (uint32_t)call->gen == k->gen && !call->done && !call->draining) {
    let_go(r, k->slot);
    if (!queued) atomic_store(&r->sh->flags.passed[k->slot], k->gen); /* no stream write to wait for */
    if (call->comm) call->comm->inflight--;
    if (call->comm) ccs__chan_settled(call->comm, 0, call->number, call->nops, CCS_ERR_INVALID_USAGE, 0); /* never out */
    device_slot_free(r, k->slot);
  }
  pthread_mutex_unlock(&r->mu);
}
