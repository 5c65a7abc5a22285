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
 * each waiter finds its own answer whoever took it. */
#include <errno.h>
#include <linux/futex.h>
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
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

void ccs__ring_free(struct ccs__ring *r) {
  if (!r) return;
  munmap(r->sh, CCS__RING_BYTES);
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
  ccs__reply__free_unpacked(reply, NULL);
  c->ring = r;
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
  r->free_slots[r->nfree++] = (uint16_t)slot;
}

/* Under r->mu: a host stream's call answered. */
static void stream_call_done(struct ccs__ring *r, uint32_t slot) {
  struct call *call = &r->calls[slot];
  struct ccs__host_stream *s = call->stream;
  const char *text = call->text ? call->text : ccs_strerror(call->status);
  if (call->status != CCS_OK && s->error == CCS_OK) {
    s->error = call->status;
    snprintf(s->error_text, sizeof(s->error_text), "%s", text);
  }
  if (--s->inflight == 0) s->conn = NULL, s->comm = NULL;
  if (call->comm) {
    call->comm->inflight--;
    if (call->status != CCS_OK) ccs__comm_failed(call->comm, call->status, text);
  }
  slot_free(r, slot);
}

/* Under r->mu: every completion that arrived, into its call. */
static void take_completions(struct ccs__ring *r) {
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
  }
  atomic_store_explicit(&r->sh->done_head, r->done_head, memory_order_release);
}

/* Until done_tail moves past seen: spinning (then yielding) for the spin
 * budget, then asleep on it. CCS_OK, or the connection's failure. Only a
 * few pauses before yielding: where ranks and the daemon share CPUs the
 * daemon must run for the answer to come (8 B all_reduce, 4 ranks on 2
 * CPUs: 8.6 us after 64 pauses, 7.3 us after 8). */
static ccs_result_t wait_done(struct ccs__conn *c, uint32_t seen) {
  struct ccs__ring_shared *sh = c->ring->sh;
  uint64_t start = now_ns();
  for (int k = 0;; k++) {
    if (atomic_load_explicit(&sh->done_tail, memory_order_acquire) != seen) return CCS_OK;
    if (k < 8) cpu_relax();
    else if (now_ns() - start < c->ring->spin_ns) sched_yield();
    else break;
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
                 uint32_t nops, uint32_t flags) {
  *e = (struct ccs__ring_op){.req_id = req_id, .index = index, .nops = nops, .comm = op->comm,
                             .kind = op->kind, .dtype = op->dtype, .redop = op->redop,
                             .root = op->root, .count = op->count, .flags = flags};
  if (op->send) e->send = (struct ccs__ring_buf){op->send->buffer, op->send->offset, op->send->length};
  if (op->recv) e->recv = (struct ccs__ring_buf){op->recv->buffer, op->recv->offset, op->recv->length};
}

/* Publishes the ops as one call (a host stream's when s): its slot, or -1
 * when the connection broke meanwhile. */
static int publish(struct ccs__conn *c, Ccs__Op *const *ops, size_t n, struct ccs__host_stream *s,
                   ccs_comm_t *comm) {
  struct ccs__ring *r = c->ring;
  struct ccs__ring_shared *sh = r->sh;
  pthread_mutex_lock(&r->mu);
  /* a slot for the answer, and room for the ops: both free up as the
   * daemon goes on (it takes entries without being asked) */
  uint64_t since = now_ns();
  while (r->nfree == 0 ||
         CCS__RING_ENTRIES - (r->sub_tail - atomic_load_explicit(&sh->sub_head, memory_order_acquire)) < n) {
    take_completions(r);
    int no_slot = r->nfree == 0;
    uint32_t seen = r->done_head;
    pthread_mutex_unlock(&r->mu);
    ccs_result_t rc = CCS_OK;
    if (no_slot) rc = wait_done(c, seen);
    else if (now_ns() - since < SLEEP_CHECK_NS) sched_yield();
    else rc = ccs__conn_check(c), since = now_ns();
    if (rc != CCS_OK) return -1;
    pthread_mutex_lock(&r->mu);
  }
  uint32_t slot = r->free_slots[--r->nfree];
  struct call *call = &r->calls[slot];
  call->gen++;
  call->busy = 1;
  call->done = 0;
  call->stream = s;
  call->comm = comm;
  if (s) {
    s->inflight++;
    s->conn = c;
    s->comm = comm;
    comm->inflight++;
  }
  uint64_t req_id = call->gen * CCS__RING_ENTRIES + slot;
  for (size_t i = 0; i < n; i++)
    fill(&sh->sub[(r->sub_tail + i) % CCS__RING_ENTRIES], ops[i], req_id, (uint32_t)i,
         (uint32_t)n, s ? CCS__RING_OP_ORDERED : 0);
  r->sub_tail += (uint32_t)n;
  atomic_store_explicit(&sh->sub_tail, r->sub_tail, memory_order_seq_cst);
  pthread_mutex_unlock(&r->mu);
  if (atomic_load_explicit(&sh->daemon_sleeping, memory_order_seq_cst)) {
    uint64_t one = 1;
    if (write(r->bell, &one, sizeof(one)) < 0) { /* a full counter: the bell rings already */ }
  }
  return (int)slot;
}

ccs_result_t ccs__ring_post(struct ccs__conn *c, Ccs__Op *const *ops, size_t n,
                            struct ccs__host_stream *s, ccs_comm_t *comm) {
  return publish(c, ops, n, s, comm) < 0 ? ccs__conn_broken_error(c) : CCS_OK;
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

void ccs__ring_forget_comm(struct ccs__conn *c, const ccs_comm_t *comm) {
  struct ccs__ring *r = c->ring;
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  for (uint32_t i = 0; i < CCS__RING_ENTRIES; i++)
    if (r->calls[i].comm == comm) r->calls[i].comm = NULL;
  pthread_mutex_unlock(&r->mu);
}

ccs_result_t ccs__ring_call(struct ccs__conn *c, Ccs__Op *const *ops, size_t n) {
  struct ccs__ring *r = c->ring;
  int slot = publish(c, ops, n, NULL, NULL);
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
