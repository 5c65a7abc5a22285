/* The fast path of a connection (proto/ring.h): its rings, mapped from the
 * client's sealed memfd, and its doorbell. The daemon keeps its own copy
 * of each index it writes; it reads the client's indices only to learn how
 * far the client got, and a client whose indices are impossible, or whose
 * batches do not hang together, is closed like any protocol violation.
 * Each batch is copied out of the shared page before anything in it is
 * checked, then goes through the very checks of a socket Submit
 * (submit.c): what the client rewrites afterwards changes nothing. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/log.h"
#include "front/front.h"
#include "ring.h"

struct ring {
  struct list link;        /* in daemon->rings until its doorbell is closed */
  struct session *session; /* NULL once the connection closed */
  struct ccs__ring_shared *sh;
  struct gpu_flags *flags; /* its stream flags; holds the mapping (gpu.h) */
  uv_poll_t bell;
  int bell_fd;
  uint32_t sub_head;  /* ours: submission entries taken */
  uint32_t done_tail; /* ours: completions published */
  double credit;      /* its part of a batch this round (ccsd_tenant_turns) */
};

/* A round of the rings serves the heaviest tenant this many batches (the
 * others by their weights), and then gives way to the sockets. */
#define BATCHES_PER_ROUND 16


static void on_bell(uv_poll_t *h, int status, int events) {
  (void)events;
  struct ring *r = h->data;
  uint64_t v;
  if (status < 0 || read(r->bell_fd, &v, sizeof(v)) < 0) {
    /* nothing rang, or its bell broke: the rings are polled anyway */
  }
}

static void on_bell_closed(uv_handle_t *h) {
  struct ring *r = h->data;
  list_remove(&r->link);
  ccsd_gpu_flags_unref(r->flags); /* unmapped with the last op it orders */
  close(r->bell_fd);
  free(r);
}

void ccsd_ring_close(struct session *s) {
  struct ring *r = s->ring;
  if (!r) return;
  s->ring = NULL;
  s->d->nrings--;
  r->session = NULL; /* it stays listed until closed: a walk of the rings may be under way */
  uv_close((uv_handle_t *)&r->bell, on_bell_closed);
}

void ccsd_rings_beat(struct daemon *d) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->rings) {
    struct ring *r = LIST_ENTRY(it, struct ring, link);
    if (r->session) atomic_fetch_add_explicit(&r->sh->daemon_beat, 1, memory_order_relaxed);
  }
}

/* Is fd what the client says it is? The kernel names the object. */
static int is_eventfd(int fd) {
  char path[64], target[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, target, sizeof(target) - 1);
  if (n < 0) return 0;
  target[n] = 0;
  return !strcmp(target, "anon_inode:[eventfd]");
}

static ccs_result_t check_fds(int memfd, int bell, char *err, size_t errlen) {
  if (memfd < 0 || bell < 0) {
    snprintf(err, errlen, "a RingSetup takes two file descriptors: the rings' memfd, then the "
             "doorbell's eventfd");
    return CCS_ERR_INVALID_ARGUMENT;
  }
  ccs_result_t rc = ccsd_memfd_check(memfd, CCS__RING_BYTES, "the rings' memfd", err, errlen);
  if (rc != CCS_OK) return rc;
  if (!is_eventfd(bell)) {
    snprintf(err, errlen, "the doorbell must be an eventfd");
    return CCS_ERR_INVALID_ARGUMENT;
  }
  return CCS_OK;
}

void ccsd_ring_setup(struct session *s, uint64_t id) {
  int memfd = ccsd_session_take_fd(s), bell = ccsd_session_take_fd(s);
  char err[160];
  ccs_result_t rc = check_fds(memfd, bell, err, sizeof(err));
  if (rc == CCS_OK && s->ring) {
    snprintf(err, sizeof(err), "this connection has its rings already");
    rc = CCS_ERR_INVALID_USAGE;
  }
  struct ring *r = rc == CCS_OK ? calloc(1, sizeof(*r)) : NULL;
  void *map = MAP_FAILED;
  if (r) map = mmap(NULL, CCS__RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (map != MAP_FAILED) {
    struct ccs__ring_shared *shared = map;
    r->flags = ccsd_gpu_flags_new(map, CCS__RING_BYTES, shared->flags.ready, shared->flags.done);
  }
  if (rc == CCS_OK && (!r || map == MAP_FAILED || !r->flags)) {
    snprintf(err, sizeof(err), "cannot map the rings: %s", r ? strerror(errno) : "out of memory");
    rc = CCS_ERR_NO_MEMORY;
  }
  const struct ccs__ring_shared *sh = map;
  if (rc == CCS_OK && (sh->magic != CCS__RING_MAGIC || !ccs__protocol_served(sh->protocol) ||
                       sh->entries != CCS__RING_ENTRIES || sh->batch_max != CCS__RING_BATCH_MAX)) {
    snprintf(err, sizeof(err), "the rings are not laid out as this daemon's (protocol %u, %u "
             "entries, batches of %u)", CCS__PROTOCOL_VERSION, CCS__RING_ENTRIES, CCS__RING_BATCH_MAX);
    rc = CCS_ERR_VERSION;
  }
  if (memfd >= 0) close(memfd); /* the mapping holds the memory */
  if (rc == CCS_OK && fcntl(bell, F_SETFL, O_NONBLOCK)) {
    snprintf(err, sizeof(err), "doorbell: %s", strerror(errno));
    rc = CCS_ERR_SYSTEM;
  }
  if (rc != CCS_OK) {
    if (r && r->flags) ccsd_gpu_flags_unref(r->flags); /* unmaps */
    else if (map != MAP_FAILED) munmap(map, CCS__RING_BYTES);
    if (bell >= 0) close(bell);
    free(r);
    ccsd_session_reply(s, id, rc, err);
    return;
  }
  r->session = s;
  r->sh = map;
  r->bell_fd = bell;
  /* the stream flags' page for the GPUs, once (not again per call) */
  char why[200] = "this daemon has no GPU";
  int flags = s->d->coll.gpu && ccsd_gpu_flags_register(s->d->coll.gpu, r->flags, why, sizeof(why)) == 0;
  if (s->d->coll.gpu && !flags) LOG_WARN("client %llu: its stream flags: %s", (unsigned long long)s->id, why);
  uv_poll_init(s->d->loop, &r->bell, bell);
  r->bell.data = r;
  uv_poll_start(&r->bell, UV_READABLE, on_bell);
  list_insert_tail(&s->d->rings, &r->link);
  s->ring = r;
  s->d->nrings++;
  LOG_INFO(CCS_LOG_CLIENT, "client %llu: fast path set up", (unsigned long long)s->id);
  Ccs__Reply reply = CCS__REPLY__INIT;
  Ccs__RingSetupReply body = CCS__RING_SETUP_REPLY__INIT;
  body.stream_flags = flags;
  body.beat_ms = s->d->housekeeping_ms;
  reply.id = id;
  reply.body_case = CCS__REPLY__BODY_RING_SETUP;
  reply.ring_setup = &body;
  ccsd_session_send(s, &reply);
}

static void violation(struct ring *r, const char *what) {
  char why[160];
  snprintf(why, sizeof(why), "fast path: %s", what);
  ccsd_session_protocol_error(r->session, why);
}

static void to_args(const struct ccs__ring_op *e, struct op_args *a) {
  *a = (struct op_args){.comm = e->comm, .kind = e->kind, .count = e->count, .dtype = e->dtype,
                        .redop = e->redop, .root = e->root,
                        .ordered = (e->flags & CCS__RING_OP_ORDERED) != 0, .number = e->number};
  if (e->flags & CCS__RING_OP_PART) a->whole_count = (uint64_t)e->order_gen << 32 | e->order_slot;
  const struct ccs__ring_buf *bufs[2] = {&e->send, &e->recv};
  struct op_buf *args[2] = {&a->send, &a->recv};
  for (int k = 0; k < 2; k++)
    if (bufs[k]->length) *args[k] = (struct op_buf){bufs[k]->buffer, bufs[k]->offset, bufs[k]->length, 1};
}

/* 1 when a batch was taken, 0 when none is whole yet, -1 when the
 * connection was closed. */
static int take_batch(struct ring *r) {
  struct ccs__ring_shared *sh = r->sh;
  uint32_t avail = atomic_load_explicit(&sh->sub_tail, memory_order_acquire) - r->sub_head;
  if (avail == 0) return 0;
  if (avail > CCS__RING_ENTRIES) {
    violation(r, "its submission tail is past what the ring holds");
    return -1;
  }
  struct ccs__ring_op e[CCS__RING_BATCH_MAX];
  memcpy(&e[0], &sh->sub[r->sub_head % CCS__RING_ENTRIES], sizeof(e[0]));
  uint32_t n = e[0].nops;
  if (e[0].index != 0 || n == 0 || n > CCS__RING_BATCH_MAX) {
    violation(r, "a batch that does not start with its first op, or of no or too many ops");
    return -1;
  }
  if (avail < n) return 0; /* the rest of it is not published yet */
  for (uint32_t i = 1; i < n; i++) {
    memcpy(&e[i], &sh->sub[(r->sub_head + i) % CCS__RING_ENTRIES], sizeof(e[i]));
    if (e[i].index != i || e[i].nops != n || e[i].req_id != e[0].req_id) {
      violation(r, "the entries of a batch do not hang together");
      return -1;
    }
  }
  r->sub_head += n;
  atomic_store_explicit(&sh->sub_head, r->sub_head, memory_order_release);
  char err[128] = "";
  for (uint32_t i = 0; i < n && !err[0]; i++)
    if (e[i].flags & ~(CCS__RING_OP_ORDERED | CCS__RING_OP_STREAM | CCS__RING_OP_PART))
      snprintf(err, sizeof(err), "op %u of the call has unknown flags 0x%x", i, e[i].flags);
    else if ((e[i].flags & CCS__RING_OP_STREAM) && (e[i].flags & CCS__RING_OP_PART))
      snprintf(err, sizeof(err), "op %u of the call is a part in a CUDA stream's order", i);
    else if ((e[i].flags ^ e[0].flags) & CCS__RING_OP_STREAM || e[i].order_slot != e[0].order_slot ||
             e[i].order_gen != e[0].order_gen)
      snprintf(err, sizeof(err), "op %u of the call is not in its stream order as op 0 is", i);
  if (!err[0] && (e[0].flags & CCS__RING_OP_STREAM) && e[0].order_slot >= CCS__RING_ENTRIES)
    snprintf(err, sizeof(err), "stream flags %u of a ring of %u", e[0].order_slot, CCS__RING_ENTRIES);
  if (err[0]) {
    ccsd_ring_complete(r->session, e[0].req_id, CCS_ERR_INVALID_ARGUMENT, err);
    return r->session && !r->session->closing ? 1 : -1;
  }
  struct op_args args[CCS__RING_BATCH_MAX];
  for (uint32_t i = 0; i < n; i++) to_args(&e[i], &args[i]);
  r->session->d->ring_calls++;
  struct gpu_order order = {r->flags, e[0].order_slot, e[0].order_gen};
  ccsd_submit(r->session, e[0].req_id, args, n, e[0].flags & CCS__RING_OP_STREAM ? &order : NULL, 1);
  return r->session && !r->session->closing ? 1 : -1;
}

static int has_work(const struct ring *r) {
  return r->session && atomic_load_explicit(&r->sh->sub_tail, memory_order_acquire) != r->sub_head;
}

int ccsd_rings_watch(struct daemon *d, uint64_t until_ns) {
  for (unsigned k = 1;; k++) {
    struct list *it, *tmp;
    LIST_FOREACH_SAFE(it, tmp, &d->rings) {
      if (has_work(LIST_ENTRY(it, struct ring, link))) return 1;
    }
    ccs__cpu_relax();
    if (k % 16 == 0 && uv_hrtime() >= until_ns) return 0;
  }
}

/* Tenants take turns by weight (ccsd_tenant_turns): a round passes over
 * the rings again while some have work and none got a whole turn yet, so
 * that light tenants are not kept waiting when nobody else wants the loop. */
int ccsd_rings_poll(struct daemon *d) {
  int taken = 0, pending = 1;
  double heaviest = 0.01; /* the lightest weight there is */
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->rings) {
    struct ring *r = LIST_ENTRY(it, struct ring, link);
    if (has_work(r) && ccsd_tenant_weight(r->session->tenant) > heaviest)
      heaviest = ccsd_tenant_weight(r->session->tenant);
  }
  for (int pass = 0; pass < 64 && !taken && pending; pass++) {
    pending = 0;
    LIST_FOREACH_SAFE(it, tmp, &d->rings) {
      struct ring *r = LIST_ENTRY(it, struct ring, link);
      if (!has_work(r)) {
        ccsd_tenant_idle(&r->credit);
        continue;
      }
      pending = 1;
      struct tenant *t = r->session->tenant;
      for (int k = ccsd_tenant_turns(t, &r->credit, BATCHES_PER_ROUND / heaviest); k > 0; k--) {
        if (take_batch(r) <= 0) break;
        atomic_fetch_add_explicit(&t->share->requests, 1, memory_order_relaxed);
        taken++;
      }
    }
  }
  return taken;
}

static void futex_wake_all(_Atomic uint32_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void ccsd_ring_complete(struct session *s, uint64_t req_id, ccs_result_t status, const char *error) {
  struct ring *r = s->ring;
  if (!r || s->d->stopping) return; /* as ccsd_session_send */
  struct ccs__ring_shared *sh = r->sh;
  /* the client takes completions before it submits more than the ring holds */
  if (r->done_tail - atomic_load_explicit(&sh->done_head, memory_order_acquire) >= CCS__RING_ENTRIES) {
    violation(r, "its completion ring is full (more calls outstanding than it holds)");
    return;
  }
  uint32_t slot = r->done_tail % CCS__RING_ENTRIES;
  size_t len = status != CCS_OK && error ? strnlen(error, CCS__ERROR_TEXT_MAX - 1) : 0;
  memcpy(sh->text[slot], error ? error : "", len);
  sh->text[slot][len] = 0;
  sh->done[slot] = (struct ccs__ring_done){req_id, status, (uint32_t)len};
  atomic_store_explicit(&sh->done_tail, ++r->done_tail, memory_order_seq_cst);
  if (atomic_load_explicit(&sh->client_waiting, memory_order_seq_cst)) futex_wake_all(&sh->done_tail);
}

int ccsd_rings_arm(struct daemon *d) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->rings) {
    struct ring *r = LIST_ENTRY(it, struct ring, link);
    if (r->session) atomic_store_explicit(&r->sh->daemon_sleeping, 1, memory_order_seq_cst);
  }
  /* an entry published before a client could see the flag is seen here */
  int work = 0;
  LIST_FOREACH_SAFE(it, tmp, &d->rings) {
    struct ring *r = LIST_ENTRY(it, struct ring, link);
    if (r->session && atomic_load_explicit(&r->sh->sub_tail, memory_order_seq_cst) != r->sub_head)
      work = 1;
  }
  return work;
}

void ccsd_rings_disarm(struct daemon *d) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->rings) {
    struct ring *r = LIST_ENTRY(it, struct ring, link);
    if (r->session) atomic_store_explicit(&r->sh->daemon_sleeping, 0, memory_order_relaxed);
  }
}
