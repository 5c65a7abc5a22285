/* Fuzz target: requests of every kind, well formed, with fuzzed values,
 * from several clients at once, over the socket and over the fast path's
 * rings (setups, entries, indices), through the real dispatch of a live
 * daemon state. The input is not the wire bytes (fuzz_session does that)
 * but the choices: which client does what, with which fields.
 *
 * Each input starts from a daemon that serves: three clients said hello,
 * registered two sealed memfds each (fds passed), joined comms of 1, 2 and
 * 3 ranks on ids signed with the daemon's key (fuzz_daemon.h), one with
 * algorithm rules, and one client set up rings. From there a step is a
 * collective every rank of a comm calls (kind, type, reduction, root,
 * count, in place or not, socket or rings, now and then one rank's call
 * made wrong), or any request with values that range over the valid, the
 * edges and the hostile. After each input every client is gone and the
 * daemon must hold nothing.
 *
 * What the committed corpus reaches is checked when it is replayed
 * (fuzz_replay_done): every collective, type and reduction completed, on
 * comms of several ranks, with rules, in place and not, by both paths;
 * a corpus that stops reaching one fails the fuzz_requests test. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "frames.h"
#include "fuzz_daemon.h"
#include "fuzz_input.h"
#include "journal.h"
#include "ring.h"

enum { CLIENTS = 3, IDS = 4, KNOWN = 8, GROUPS = 5, PENDING = 64, BUF_BYTES = 64 << 10 };

static struct daemon d;
static uv_loop_t loop;

/* What one op of a call was, for the reach table when it succeeds. */
struct op_note {
  uint32_t kind, dtype, redop, count;
  int root, nranks, in_place, ring, algo;
};

/* A request this harness waits for the answer of. */
enum { P_INIT = 1, P_REG, P_OPS, P_RING, P_JOURNAL };
struct pending {
  uint64_t req;
  int what, group, rank;
  int rejoin; /* a P_INIT that brought a rejoin's report */
  uint64_t epoch; /* the step that waits for it; 0: none does */
  struct op_note op;
};
static uint64_t epoch; /* of the step under way */

struct client {
  int fd; /* our end of the socketpair; -1: none */
  uint64_t next_req;
  uint64_t comms[KNOWN], buffers[KNOWN]; /* handles the daemon gave */
  int ncomms, nbuffers;
  struct ccs__ring_shared *ring; /* the last rings it set up, mapped here */
  uint32_t sub_tail;
  struct pending pend[PENDING];
  int npend;
  int hold_done; /* its ring's completions are left where they are, for now */
};
static struct client clients[CLIENTS];

/* The comms every input starts with: who is which rank, the handle each
 * member got. */
struct group {
  int nranks, member[3], algo;
  uint64_t handle[3];
  int joined;
};
static struct group groups[GROUPS];

/* --- what the corpus reaches ------------------------------------------- */

static struct {
  uint64_t kind[CCS__COLL_KIND_COUNT], dtype[CCS_DTYPE_COUNT], redop[CCS_REDOP_COUNT];
  uint64_t root_not_0, count_0, count_large, in_place, out_of_place, ring, socket, algo, ranks_3,
      mismatch, registered, fuzzed_init, rejoined, journal;
} reach;

static void note_done(const struct op_note *o, ccs_result_t status) {
  if (status == CCS_ERR_MISMATCH) reach.mismatch++;
  if (status != CCS_OK || o->kind >= CCS__COLL_KIND_COUNT) return;
  reach.kind[o->kind]++;
  int moves = o->count > 0 && o->kind != CCS__BARRIER;
  if (moves && o->dtype < CCS_DTYPE_COUNT) reach.dtype[o->dtype]++;
  if (moves && ccs__coll_has_redop(o->kind) && o->redop < CCS_REDOP_COUNT) reach.redop[o->redop]++;
  if (ccs__coll_has_root(o->kind) && o->root > 0) reach.root_not_0++;
  if (o->count == 0) reach.count_0++;
  if (o->count > 1000) reach.count_large++;
  if (moves) *(o->in_place ? &reach.in_place : &reach.out_of_place) += 1;
  *(o->ring ? &reach.ring : &reach.socket) += 1;
  if (o->algo) reach.algo++;
  if (o->nranks == 3) reach.ranks_3++;
}

/* The replayer calls it after the corpus (replay.c): 1 when a part of
 * the daemon was never reached. */
int fuzz_replay_done(void) {
  int missing = 0;
#define NEED(what, n)                                                                    \
  do {                                                                                   \
    if (!(n)) {                                                                          \
      fprintf(stderr, "fuzz_requests: the corpus never reached %s\n", what);             \
      missing = 1;                                                                       \
    }                                                                                    \
  } while (0)
  char what[64];
  for (uint32_t k = 0; k < CCS__COLL_KIND_COUNT; k++) {
    snprintf(what, sizeof(what), "a completed %s", ccs__coll_name(k));
    NEED(what, reach.kind[k]);
  }
  for (int t = 0; t < CCS_DTYPE_COUNT; t++) {
    snprintf(what, sizeof(what), "a completed op on %s", ccs_dtype_name((ccs_dtype_t)t));
    NEED(what, reach.dtype[t]);
  }
  for (int o = 0; o < CCS_REDOP_COUNT; o++) {
    snprintf(what, sizeof(what), "a completed reduction by %s", ccs_redop_name((ccs_redop_t)o));
    NEED(what, reach.redop[o]);
  }
  NEED("a rooted op with a root other than 0", reach.root_not_0);
  NEED("an op of count 0", reach.count_0);
  NEED("an op of more than 1000 elements", reach.count_large);
  NEED("an op in place", reach.in_place);
  NEED("an op out of place", reach.out_of_place);
  NEED("an op through the rings", reach.ring);
  NEED("an op over the socket", reach.socket);
  NEED("an op on a comm with algorithm rules", reach.algo);
  NEED("an op of 3 ranks", reach.ranks_3);
  NEED("a mismatch", reach.mismatch);
  NEED("a buffer registered (an fd passed)", reach.registered);
  NEED("a comm joined with fuzzed fields", reach.fuzzed_init);
  NEED("a comm rejoined with a fuzzed report (and its verdicts)", reach.rejoined);
  NEED("a journal set up", reach.journal);
#undef NEED
  fprintf(stderr, "fuzz_requests: %llu ops completed; %s\n",
          (unsigned long long)(reach.socket + reach.ring), missing ? "parts never reached" : "every part reached");
  return missing;
}

/* --- clients ------------------------------------------------------------ */

static struct pending *pending_add(struct client *c, uint64_t req, int what) {
  if (c->npend == PENDING) return NULL;
  struct pending *p = &c->pend[c->npend++];
  memset(p, 0, sizeof(*p));
  p->req = req;
  p->what = what;
  p->epoch = epoch;
  return p;
}

static struct pending *pending_take(struct client *c, uint64_t req, int what, struct pending *out) {
  for (int i = 0; i < c->npend; i++)
    if (c->pend[i].req == req && (c->pend[i].what == P_RING) == (what == P_RING)) {
      *out = c->pend[i];
      c->pend[i] = c->pend[--c->npend];
      return out;
    }
  return NULL;
}

static void answered(struct client *c, struct pending *p, ccs_result_t status, uint64_t handle) {
  if (p->what == P_INIT && status == CCS_OK && p->group >= 0) {
    groups[p->group].handle[p->rank] = handle;
    groups[p->group].joined++;
  }
  if (p->what == P_INIT && status == CCS_OK && p->group < 0) reach.fuzzed_init++;
  if (p->what == P_INIT && status == CCS_OK && p->rejoin) reach.rejoined++;
  if (p->what == P_JOURNAL && status == CCS_OK) reach.journal++;
  if (p->what == P_REG && status == CCS_OK) reach.registered++;
  if (p->what == P_OPS || p->what == P_RING) note_done(&p->op, status);
}

/* Reads every reply waiting for c, remembering the handles they carry. */
static void drain(struct client *c) {
  static uint8_t buf[CCS__REPLY_MAX + 64];
  if (c->fd < 0) return;
  size_t have = 0;
  for (;;) {
    ssize_t n = recv(c->fd, buf + have, sizeof(buf) - have, MSG_DONTWAIT);
    if (n <= 0) break;
    have += (size_t)n;
  }
  size_t at = 0;
  while (have - at >= 4) {
    uint32_t len = (uint32_t)buf[at] | (uint32_t)buf[at + 1] << 8 | (uint32_t)buf[at + 2] << 16 |
                   (uint32_t)buf[at + 3] << 24;
    if (have - at - 4 < len) break;
    Ccs__Reply *r = ccs__reply_unpack(buf + at + 4, len);
    at += 4 + len;
    if (!r) continue;
    uint64_t handle = 0;
    if (r->body_case == CCS__REPLY__BODY_COMM_INIT) {
      handle = r->comm_init->comm;
      if (c->ncomms < KNOWN) c->comms[c->ncomms++] = handle;
    }
    if (r->body_case == CCS__REPLY__BODY_MEM_REGISTER && c->nbuffers < KNOWN)
      c->buffers[c->nbuffers++] = r->mem_register->buffer;
    struct pending p;
    if (pending_take(c, r->id, P_OPS, &p)) answered(c, &p, (ccs_result_t)r->status, handle);
    ccs__reply__free_unpacked(r, NULL);
  }
  /* the rings' completions, when the client takes them */
  struct ccs__ring_shared *sh = c->ring;
  if (!sh || c->hold_done) return;
  uint32_t head = atomic_load(&sh->done_head), tail = atomic_load(&sh->done_tail);
  if (tail - head > CCS__RING_ENTRIES) head = tail; /* indices this harness scrambled: nothing to read */
  for (; head != tail; head++) {
    const struct ccs__ring_done *e = &sh->done[head % CCS__RING_ENTRIES];
    struct pending p;
    if (pending_take(c, e->req_id, P_RING, &p)) answered(c, &p, (ccs_result_t)e->status, 0);
  }
  atomic_store(&sh->done_head, head);
}

static void spin(void) { fuzz_daemon_spin(&d, &loop); }

static void drain_all(void) {
  for (int i = 0; i < CLIENTS; i++) drain(&clients[i]);
}

/* Answers the step under way waits for. */
static int waiting(void) {
  int n = 0;
  for (int i = 0; i < CLIENTS; i++)
    for (int k = 0; clients[i].fd >= 0 && k < clients[i].npend; k++) n += clients[i].pend[k].epoch == epoch;
  return n;
}

/* Does the daemon run an op (on the executor's thread, or its answer on
 * the way)? */
static int running(void) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d.coll.comms) {
    if (!list_empty(&LIST_ENTRY(it, struct comm, link)->running)) return 1;
  }
  return 0;
}

/* Until the answers this step waits for came, or nothing runs any more (a
 * call whose other ranks never come stays unanswered), or a bound. */
static void settle(int patience) {
  for (int i = 0, idle = 0; i < patience && waiting() && idle < 8; i++) {
    spin();
    drain_all();
    idle = running() ? 0 : idle + 1;
    if (i > 50) usleep(100);
  }
}

static uint64_t send_request(struct client *c, Ccs__Request *req, const int *fds, int nfds) {
  req->id = ++c->next_req;
  struct frame f = frame_of(req);
  if (!f.data) return req->id;
  if (frame_send(c->fd, f.data, f.len, fds, nfds, MSG_DONTWAIT) < 0) { /* the daemon closed it */ }
  free(f.data);
  return req->id;
}

static void disconnect_client(struct client *c) {
  close(c->fd);
  c->fd = -1;
  if (c->ring) munmap(c->ring, CCS__RING_BYTES);
  c->ring = NULL;
  c->npend = 0;
}

static void connect_client(struct client *c) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv)) abort();
  memset(c, 0, sizeof(*c));
  c->fd = sv[1];
  ccsd_session_new(&d, sv[0]);
}

/* --- requests ------------------------------------------------------------ */

/* Unique ids: fresh ones signed by the daemon, sometimes altered after. */
static struct ccs__unique_id ids[IDS];
static void new_id(struct fuzz_input *in, int k) {
  struct ccs__unique_id *id = &ids[k];
  uint8_t tag[4];
  fuzz_bytes(in, tag, 4); /* ids collide often, as the fuzzer likes */
  fuzz_unique_id((uint32_t)tag[0] | (uint32_t)tag[1] << 8 | (uint32_t)tag[2] << 16 | (uint32_t)tag[3] << 24,
                 (uint32_t)getuid(), d.coll.self, id);
  switch (fuzz_u8(in) % 8) { /* mostly intact */
  case 0: id->owner_uid = fuzz_u32(in); break;
  case 1: id->issued_s = fuzz_u64(in); break;
  case 2: fuzz_bytes(in, (uint8_t *)id->root, sizeof(id->root)); break;
  case 3: id->mac[fuzz_u8(in) % 16] ^= 1; break;
  default: break;
  }
}

static const char *const algos[] = {"", "ring", "all_reduce:tree:0-64K;ring", ":", "::", "rhd:1K-max",
                                    "direct;ring;tree", "all_gather:tree", "broadcast:ring:0-nan"};

static uint64_t send_comm_init(struct client *c, const struct ccs__unique_id *id, size_t id_len,
                               uint32_t nranks, uint32_t rank, uint32_t timeout_ms, const char *algo,
                               int debug, Ccs__Rejoin *rejoin) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__CommInit ci = CCS__COMM_INIT__INIT;
  ci.rejoin = rejoin;
  uint8_t bytes[256] = {0}; /* an id, and room for a length that is not one */
  memcpy(bytes, id, sizeof(*id));
  ci.id.data = bytes;
  ci.id.len = id_len;
  ci.nranks = nranks;
  ci.rank = rank;
  ci.op_timeout_ms = timeout_ms;
  ci.algo = (char *)algo;
  ci.debug = debug;
  req.body_case = CCS__REQUEST__BODY_COMM_INIT;
  req.comm_init = &ci;
  return send_request(c, &req, NULL, 0);
}

static void comm_init(struct fuzz_input *in, struct client *c) {
  int k = fuzz_u8(in) % IDS;
  if (fuzz_u8(in) % 4 == 0) new_id(in, k);
  size_t len = fuzz_u8(in) % 16 ? CCS_UNIQUE_ID_BYTES : fuzz_u8(in);
  uint32_t nranks = fuzz_count(in, 4), rank = fuzz_count(in, 3);
  uint32_t timeout_ms = fuzz_u8(in) % 4 ? 0 : fuzz_u32(in);
  char text[64];
  const char *algo = algos[fuzz_u8(in) % (sizeof(algos) / sizeof(algos[0]))];
  if (fuzz_u8(in) % 8 == 0) algo = fuzz_string(in, text, sizeof(text));
  /* a rank back after a restart: what it says of its channels, fuzzed
   * (peers out of range, twice the same, more calls than a journal holds) */
  enum { CHANNELS = 6, FLAGS = 24 };
  Ccs__Rejoin rejoin = CCS__REJOIN__INIT;
  Ccs__Channel chans[CHANNELS], *chan_ptrs[CHANNELS];
  protobuf_c_boolean flags[CHANNELS][FLAGS];
  int rejoining = fuzz_u8(in) % 3 == 0;
  if (rejoining) {
    rejoin.n_channels = fuzz_u8(in) % (CHANNELS + 1);
    rejoin.channels = chan_ptrs;
    for (size_t i = 0; i < rejoin.n_channels; i++) {
      ccs__channel__init(&chans[i]);
      chan_ptrs[i] = &chans[i];
      chans[i].peer = fuzz_u8(in) % 4 ? (int32_t)(fuzz_u8(in) % 5) - 1 : (int32_t)fuzz_u32(in);
      chans[i].send = fuzz_u8(in) & 1;
      chans[i].done = fuzz_u8(in) % 4 ? fuzz_u8(in) : fuzz_u64(in);
      chans[i].n_must_retry = fuzz_u8(in) % (FLAGS + 1);
      chans[i].must_retry = flags[i];
      for (size_t f = 0; f < chans[i].n_must_retry; f++) flags[i][f] = fuzz_u8(in) & 1;
    }
  }
  uint64_t req = send_comm_init(c, &ids[k], len, nranks, rank, timeout_ms, algo, fuzz_u8(in) & 1,
                                rejoining ? &rejoin : NULL);
  struct pending *p = pending_add(c, req, P_INIT);
  if (p) p->group = -1, p->epoch = 0, p->rejoin = rejoining; /* answered when its comm is complete, if ever */
}

/* The journal (proto/journal.h): laid out right, or a memfd of another
 * size, unsealed, with another layout, no fd, or a second one. */
static void journal_setup(struct fuzz_input *in, struct client *c) {
  uint8_t how = fuzz_u8(in);
  size_t bytes = how % 8 == 1 ? 4096 : CCS__JOURNAL_BYTES;
  int memfd = memfd_create("fuzz-journal", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd < 0 || ftruncate(memfd, (off_t)bytes)) abort();
  if (how % 8 != 2) fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  struct ccs__journal *j = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (j == MAP_FAILED) abort();
  j->magic = how % 8 == 3 ? fuzz_u32(in) : CCS__JOURNAL_MAGIC;
  j->protocol = CCS__PROTOCOL_VERSION;
  j->entries = CCS__JOURNAL_ENTRIES;
  munmap(j, bytes);
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__JournalSetup js = CCS__JOURNAL_SETUP__INIT;
  req.body_case = CCS__REQUEST__BODY_JOURNAL_SETUP;
  req.journal_setup = &js;
  uint64_t id = send_request(c, &req, &memfd, how % 8 == 4 ? 0 : 1);
  close(memfd);
  struct pending *p = pending_add(c, id, P_JOURNAL);
  if (p) p->epoch = 0;
}

/* A sealed memfd of bytes (or not sealed, or several, or none) beside a
 * MemRegister; the request id. */
static uint64_t register_memfds(struct client *c, size_t bytes, int nfds, int sealed, uint64_t size,
                                uint32_t domain, const ProtobufCBinaryData *device,
                                const ProtobufCBinaryData *handle) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__MemRegister m = CCS__MEM_REGISTER__INIT;
  m.domain = domain;
  m.size = size;
  if (device) m.device = *device;
  if (handle) m.ipc_handle = *handle;
  req.body_case = CCS__REQUEST__BODY_MEM_REGISTER;
  req.mem_register = &m;
  int fds[3];
  for (int i = 0; i < nfds; i++) {
    fds[i] = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fds[i] < 0 || ftruncate(fds[i], (off_t)bytes)) abort();
    if (sealed) fcntl(fds[i], F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  }
  uint64_t id = send_request(c, &req, fds, nfds);
  for (int i = 0; i < nfds; i++) close(fds[i]);
  return id;
}

static void mem_register(struct fuzz_input *in, struct client *c) {
  uint8_t dev[20] = {0}, handle[70] = {0};
  uint32_t domain = fuzz_u8(in) % 8 ? CCS__MEM_HOST : fuzz_u8(in) % 4;
  uint64_t size = fuzz_u64(in);
  ProtobufCBinaryData device = {fuzz_u8(in) % 20, dev}, ipc = {fuzz_u8(in) % 70, handle};
  fuzz_bytes(in, dev, sizeof(dev));
  int nfds = fuzz_u8(in) % 8 ? 1 : fuzz_u8(in) % 4;
  size_t bytes = 1 + fuzz_count(in, 65536);
  int sealed = fuzz_u8(in) % 8 != 0;
  register_memfds(c, bytes, nfds, sealed, size, domain, &device, &ipc);
}

/* A handle this client was given, or any number. */
static uint64_t pick(struct fuzz_input *in, const uint64_t *known, int n) {
  uint8_t b = fuzz_u8(in);
  if (n && b % 8) return known[b % n];
  return b % 2 ? fuzz_u64(in) : b;
}

static void buf_ref(struct fuzz_input *in, struct client *c, Ccs__BufRef *r) {
  r->buffer = pick(in, c->buffers, c->nbuffers);
  r->offset = fuzz_u8(in) % 4 ? 8 * fuzz_count(in, 1024) : fuzz_u64(in);
  r->length = fuzz_u8(in) % 4 ? fuzz_count(in, 65536) : fuzz_u64(in);
}

/* One op's fields: valid, at the edges, or hostile. */
static void draw_op(struct fuzz_input *in, struct client *c, Ccs__Op *op, Ccs__BufRef refs[2]) {
  ccs__op__init(op);
  ccs__buf_ref__init(&refs[0]);
  ccs__buf_ref__init(&refs[1]);
  op->comm = pick(in, c->comms, c->ncomms);
  op->kind = fuzz_u8(in) % (CCS__COLL_KIND_COUNT + 1);
  op->count = fuzz_u8(in) % 8 ? fuzz_count(in, 512) : fuzz_u64(in);
  op->dtype = fuzz_u8(in) % (CCS_DTYPE_COUNT + 1);
  op->redop = fuzz_u8(in) % (CCS_REDOP_COUNT + 1);
  op->root = fuzz_u8(in) % 8 ? (int32_t)(fuzz_u8(in) % 4) : (int32_t)fuzz_u32(in);
  if (fuzz_u8(in) % 4) buf_ref(in, c, op->send = &refs[0]);
  if (fuzz_u8(in) % 4) buf_ref(in, c, op->recv = &refs[1]);
  op->number = fuzz_u8(in) % 4 ? 0 : fuzz_u32(in);
}

static void submit(struct fuzz_input *in, struct client *c) {
  enum { MAXOPS = 3 };
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__Submit s = CCS__SUBMIT__INIT;
  Ccs__Op ops[MAXOPS], *opp[MAXOPS];
  Ccs__BufRef refs[MAXOPS][2];
  s.n_ops = fuzz_u8(in) % 16 ? 1 + fuzz_u8(in) % MAXOPS : 0;
  for (size_t i = 0; i < s.n_ops; i++) {
    draw_op(in, c, &ops[i], refs[i]);
    opp[i] = &ops[i];
  }
  s.ops = opp;
  req.body_case = CCS__REQUEST__BODY_SUBMIT;
  req.submit = &s;
  send_request(c, &req, NULL, 0);
}

/* Rings for c: mostly as libccs makes them, sometimes not (size, seals,
 * layout, a pipe for a doorbell, fds missing). how 0: as libccs does. */
static void setup_rings(struct fuzz_input *in, struct client *c, uint8_t how) {
  size_t bytes = how % 16 == 1 ? 4096 : CCS__RING_BYTES;
  int memfd = memfd_create("fuzz-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING), pipe_fds[2] = {-1, -1};
  if (memfd < 0 || ftruncate(memfd, (off_t)bytes)) abort();
  if (how % 16 != 2) fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  struct ccs__ring_shared *sh = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (sh == MAP_FAILED) abort();
  sh->magic = CCS__RING_MAGIC; /* a fresh memfd holds zeros: the layout's header only */
  sh->protocol = CCS__PROTOCOL_VERSION;
  sh->entries = CCS__RING_ENTRIES;
  sh->batch_max = CCS__RING_BATCH_MAX;
  if (how % 16 == 3) sh->protocol = fuzz_u32(in);
  int bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (how % 16 == 4 && !pipe(pipe_fds)) {
    close(bell);
    bell = pipe_fds[0];
  }
  int fds[2] = {memfd, bell}, nfds = how % 16 == 5 ? fuzz_u8(in) % 2 : 2;
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__RingSetup rs = CCS__RING_SETUP__INIT;
  req.body_case = CCS__REQUEST__BODY_RING_SETUP;
  req.ring_setup = &rs;
  send_request(c, &req, fds, nfds);
  close(memfd), close(bell);
  if (pipe_fds[1] >= 0) close(pipe_fds[1]);
  if (bytes != CCS__RING_BYTES) {
    munmap(sh, bytes);
    return;
  }
  if (c->ring) munmap(c->ring, CCS__RING_BYTES); /* a second setup is refused: those stay */
  c->ring = sh;
  c->sub_tail = 0;
}

static void ring_setup(struct fuzz_input *in, struct client *c) { setup_rings(in, c, fuzz_u8(in)); }

/* Publishes n entries as one batch of c's rings, ringing the bell when
 * the daemon sleeps. */
static void ring_publish(struct client *c, uint32_t n) {
  c->sub_tail += n;
  atomic_store(&c->ring->sub_tail, c->sub_tail);
  if (atomic_load(&c->ring->daemon_sleeping)) { /* the loop polls the rings in spin() anyway */ }
}

static void ring_entry_of(const Ccs__Op *op, uint64_t req_id, uint32_t index, uint32_t n,
                          struct ccs__ring_op *e) {
  *e = (struct ccs__ring_op){.req_id = req_id, .index = index, .nops = n, .comm = op->comm,
                             .kind = op->kind, .dtype = op->dtype, .redop = op->redop,
                             .root = op->root, .count = op->count, .number = op->number};
  if (op->send) e->send = (struct ccs__ring_buf){op->send->buffer, op->send->offset, op->send->length};
  if (op->recv) e->recv = (struct ccs__ring_buf){op->recv->buffer, op->recv->offset, op->recv->length};
}

/* A batch through c's rings: entries drawn as a Submit's ops, indices and
 * counts now and then impossible; completions taken, or not. */
static void ring_submit(struct fuzz_input *in, struct client *c) {
  if (!c->ring) return;
  struct ccs__ring_shared *sh = c->ring;
  uint8_t how = fuzz_u8(in);
  uint32_t n = how % 16 ? 1u + fuzz_u8(in) % 3u : fuzz_u8(in) % (CCS__RING_BATCH_MAX + 2u);
  uint64_t req_id = ++c->next_req;
  for (uint32_t i = 0; i < n && i < CCS__RING_ENTRIES; i++) {
    Ccs__Op op;
    Ccs__BufRef refs[2];
    draw_op(in, c, &op, refs);
    struct ccs__ring_op *e = &sh->sub[(c->sub_tail + i) % CCS__RING_ENTRIES];
    ring_entry_of(&op, req_id, i, n, e);
    if (how % 32 == 1) e->index = fuzz_u8(in);
    if (how % 32 == 2) e->nops = fuzz_u32(in);
    if (how % 32 == 3) e->req_id = fuzz_u64(in);
    e->flags = how % 32 == 6 ? fuzz_u32(in) : fuzz_u8(in) & (CCS__RING_OP_ORDERED | CCS__RING_OP_STREAM);
    e->order_slot = how % 32 == 7 ? fuzz_u32(in) : fuzz_u8(in);
    e->order_gen = fuzz_u32(in);
  }
  ring_publish(c, how % 32 == 4 ? fuzz_u32(in) : n);
  c->hold_done = how % 4 == 0; /* the completions stay untaken until the next batch */
  if (how % 64 == 5) atomic_store(&sh->done_head, fuzz_u32(in));
}

/* --- a collective every rank of a comm calls ---------------------------- */

/* Op args of rank r of group g for this step; 0 when the rank takes no
 * part (send and receive: rank 0 sends to the last rank). */
static int op_of_rank(const struct group *g, int r, uint32_t kind, uint32_t dtype, uint32_t redop,
                      int root, uint64_t count, int in_place, Ccs__Op *op, Ccs__BufRef refs[2]) {
  int n = g->nranks, last = n - 1;
  ccs__op__init(op);
  ccs__buf_ref__init(&refs[0]);
  ccs__buf_ref__init(&refs[1]);
  if ((kind == CCS__SEND || kind == CCS__RECV) && r != 0 && r != last) return 0;
  if (kind == CCS__SEND || kind == CCS__RECV) { /* the pair: a send on rank 0, its receive on the last */
    kind = r == 0 ? CCS__SEND : CCS__RECV;
    root = r == 0 ? last : 0;
  }
  const struct client *c = &clients[g->member[r]];
  op->comm = g->handle[r];
  op->kind = kind;
  op->dtype = dtype;
  op->redop = redop;
  op->root = root;
  op->count = count;
  uint64_t send_len = 0, recv_len = 0;
  size_t sz = dtype < CCS_DTYPE_COUNT ? ccs_dtype_size((ccs_dtype_t)dtype) : 4;
  if (kind < CCS__COLL_KIND_COUNT && ccs__op_lengths(kind, count, sz, n, r, root < 0 || root >= n ? 0 : root,
                                                     &send_len, &recv_len))
    send_len = recv_len = 0;
  op->send = &refs[0];
  op->recv = &refs[1];
  refs[0].buffer = c->buffers[0];
  refs[1].buffer = in_place ? c->buffers[0] : c->buffers[1];
  refs[0].length = send_len;
  refs[1].length = recv_len;
  return 1;
}

static void collective(struct fuzz_input *in) {
  struct group *g = &groups[fuzz_u8(in) % GROUPS];
  uint32_t kind = fuzz_u8(in) % (CCS__COLL_KIND_COUNT + 1);
  uint32_t dtype = fuzz_u8(in) % (CCS_DTYPE_COUNT + 1);
  uint32_t redop = fuzz_u8(in) % (CCS_REDOP_COUNT + 1);
  uint8_t rb = fuzz_u8(in);
  int root = rb < 250 ? rb % g->nranks : rb; /* now and then out of range */
  uint64_t count = fuzz_count(in, 2048);
  uint8_t how = fuzz_u8(in);
  int in_place = how & 1, via_ring = (how >> 1) & 1, wrong = (how >> 2) % 8; /* 5..7: rank 0 errs */
  if ((kind == CCS__SEND || kind == CCS__RECV) && g->nranks == 1)
    kind = CCS__BARRIER; /* a send to itself needs its receive in the same call */
  for (int r = 0; r < g->nranks; r++) {
    struct client *c = &clients[g->member[r]];
    if (c->fd < 0 || c->nbuffers < 2 || g->joined < g->nranks) return; /* gone: nothing to call on */
  }
  epoch++;
  for (int r = 0; r < g->nranks; r++) {
    struct client *c = &clients[g->member[r]];
    Ccs__Op op;
    Ccs__BufRef refs[2];
    if (!op_of_rank(g, r, kind, dtype, redop, root, count, in_place, &op, refs)) continue;
    if (r == 0 && wrong == 5) op.count++;
    if (r == 0 && wrong == 6) refs[0].length += 8;
    if (r == 0 && wrong == 7) refs[1].offset = BUF_BYTES;
    int ring = via_ring && c->ring;
    struct op_note note = {op.kind, op.dtype, op.redop, (uint32_t)op.count, op.root, g->nranks, in_place, ring, g->algo};
    struct pending *p;
    if (ring) {
      uint64_t req_id = ++c->next_req;
      ring_entry_of(&op, req_id, 0, 1, &c->ring->sub[c->sub_tail % CCS__RING_ENTRIES]);
      ring_publish(c, 1);
      p = pending_add(c, req_id, P_RING);
    } else {
      Ccs__Op *opp[1] = {&op};
      Ccs__Request req = CCS__REQUEST__INIT;
      Ccs__Submit s = CCS__SUBMIT__INIT;
      s.n_ops = 1;
      s.ops = opp;
      req.body_case = CCS__REQUEST__BODY_SUBMIT;
      req.submit = &s;
      p = pending_add(c, send_request(c, &req, NULL, 0), P_OPS);
    }
    if (p) p->op = note;
  }
  settle(2000);
}

/* --- the rest ------------------------------------------------------------- */

static const char *const commands[] = {"status", "stuck", "comms", "abort", "config", "metrics", "x"};

static void admin(struct fuzz_input *in, struct client *c) {
  char arg[32], num[24];
  char *args[2] = {arg, num};
  const char *command = commands[fuzz_u8(in) % 7];
  int json = fuzz_u8(in) & 1;
  fuzz_string(in, arg, sizeof(arg));
  snprintf(num, sizeof(num), "%u", fuzz_u8(in) % 64);
  size_t nargs = fuzz_u8(in) % 3;
  if (nargs == 1 && fuzz_u8(in) % 2) args[0] = num;
  struct frame f = frame_admin(++c->next_req, command, args, nargs, json);
  if (f.data && frame_send(c->fd, f.data, f.len, NULL, 0, MSG_DONTWAIT) < 0) { /* closed */ }
  free(f.data);
}

static void simple(struct fuzz_input *in, struct client *c, int what) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__Hello h = CCS__HELLO__INIT;
  Ccs__GetUniqueId gid = CCS__GET_UNIQUE_ID__INIT;
  Ccs__CommDestroy cd = CCS__COMM_DESTROY__INIT;
  Ccs__CommAbort ca = CCS__COMM_ABORT__INIT;
  Ccs__CommQuery cq = CCS__COMM_QUERY__INIT;
  Ccs__MemDeregister md = CCS__MEM_DEREGISTER__INIT;
  Ccs__Stats st = CCS__STATS__INIT;
  Ccs__MemRegister mr = CCS__MEM_REGISTER__INIT;
  uint8_t raw[2][80];
  switch (what) {
  case 0:
    h.protocol = fuzz_u8(in) % 16 ? CCS__PROTOCOL_VERSION : fuzz_u32(in);
    h.resume = fuzz_u8(in) & 1;
    req.body_case = CCS__REQUEST__BODY_HELLO, req.hello = &h;
    break;
  case 1: req.body_case = CCS__REQUEST__BODY_GET_UNIQUE_ID, req.get_unique_id = &gid; break;
  case 2:
    cd.comm = pick(in, c->comms, c->ncomms);
    req.body_case = CCS__REQUEST__BODY_COMM_DESTROY, req.comm_destroy = &cd;
    break;
  case 3:
    ca.comm = pick(in, c->comms, c->ncomms);
    req.body_case = CCS__REQUEST__BODY_COMM_ABORT, req.comm_abort = &ca;
    break;
  case 4:
    cq.comm = pick(in, c->comms, c->ncomms);
    req.body_case = CCS__REQUEST__BODY_COMM_QUERY, req.comm_query = &cq;
    break;
  case 5:
    md.buffer = pick(in, c->buffers, c->nbuffers);
    req.body_case = CCS__REQUEST__BODY_MEM_DEREGISTER, req.mem_deregister = &md;
    break;
  case 6: req.body_case = CCS__REQUEST__BODY_STATS, req.stats = &st; break;
  default: /* device memory, by legacy handle: no fd travels */
    for (int i = 0; i < 2; i++) fuzz_bytes(in, raw[i], sizeof(raw[i]));
    mr.domain = fuzz_u8(in) % 8 ? CCS__MEM_CUDA_IPC : fuzz_u32(in);
    mr.size = fuzz_u64(in);
    mr.address = fuzz_u64(in);
    mr.device = (ProtobufCBinaryData){fuzz_u8(in) % 20, raw[0]};
    mr.ipc_handle = (ProtobufCBinaryData){fuzz_u8(in) % 80, raw[1]};
    req.body_case = CCS__REQUEST__BODY_MEM_REGISTER, req.mem_register = &mr;
    break;
  }
  send_request(c, &req, NULL, 0);
}

/* The state every input starts from (see the top): no input consumed. */
static void serving_state(void) {
  static const char *const rules = "all_reduce:ring;broadcast:tree;rhd";
  static const struct group start[GROUPS] = {
      {1, {0}, 0, {0}, 0}, {1, {1}, 0, {0}, 0}, {1, {2}, 1, {0}, 0},
      {3, {0, 1, 2}, 0, {0}, 0}, {2, {2, 0}, 1, {0}, 0},
  };
  memcpy(groups, start, sizeof(groups));
  epoch = 1;
  for (int i = 0; i < CLIENTS; i++) {
    struct client *c = &clients[i];
    connect_client(c);
    struct frame f = frame_hello(++c->next_req, CCS__PROTOCOL_VERSION);
    if (frame_send(c->fd, f.data, f.len, NULL, 0, 0) < 0) abort();
    free(f.data);
    for (int b = 0; b < 2; b++) pending_add(c, register_memfds(c, BUF_BYTES, 1, 1, 0, CCS__MEM_HOST, NULL, NULL), P_REG);
  }
  for (int gi = 0; gi < GROUPS; gi++) {
    struct ccs__unique_id id;
    fuzz_unique_id(0xc0de0000u + (uint32_t)gi, (uint32_t)getuid(), d.coll.self, &id);
    for (int r = 0; r < groups[gi].nranks; r++) {
      struct client *c = &clients[groups[gi].member[r]];
      struct pending *p = pending_add(c, send_comm_init(c, &id, CCS_UNIQUE_ID_BYTES, (uint32_t)groups[gi].nranks,
                                                        (uint32_t)r, 0, groups[gi].algo ? rules : "", 0, NULL),
                                      P_INIT);
      p->group = gi;
      p->rank = r;
    }
  }
  setup_rings(NULL, &clients[2], 0);
  settle(4000);
  if (waiting()) abort(); /* the daemon did not serve */
  epoch = 2;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) {
    fuzz_daemon_start(&d, &loop, 0);
    ready = 1;
  }
  struct fuzz_input in = {data, size, 0};
  serving_state();
  for (int k = 0; k < IDS; k++) new_id(&in, k);
  for (int steps = 0; steps < 128 && !fuzz_done(&in); steps++) {
    struct client *c = &clients[fuzz_u8(&in) % CLIENTS];
    if (c->fd < 0) connect_client(c);
    uint8_t what = fuzz_u8(&in) % 24;
    switch (what) {
    case 0: comm_init(&in, c); comm_init(&in, c); break;
    case 1: case 2: comm_init(&in, c); break;
    case 3: mem_register(&in, c); break;
    case 4: case 5: case 6: submit(&in, c); break;
    case 7: admin(&in, c); break;
    case 8: disconnect_client(c); break; /* everything of it goes with it */
    case 9: journal_setup(&in, c); break;
    case 16: ring_setup(&in, c); break;
    case 17: case 18: ring_submit(&in, c); break;
    case 19: case 20: case 21: case 22: case 23: collective(&in); break;
    default: simple(&in, c, fuzz_u8(&in) % 10); break;
    }
    spin();
    drain_all();
  }
  for (int i = 0; i < CLIENTS; i++)
    if (clients[i].fd >= 0) disconnect_client(&clients[i]);
  fuzz_daemon_settle(&d, &loop);
  return 0;
}
