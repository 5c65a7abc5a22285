/* Fuzz target: requests of every kind, well formed, with fuzzed values,
 * from several clients at once, over the socket and over the fast path's
 * rings (setups, entries, indices), through the real dispatch of a live
 * daemon state. The input is not the wire bytes (fuzz_session does that)
 * but the choices: which client does what, with which fields. Unique ids
 * are real ones, signed with the daemon's key (this harness holds the
 * daemon), so comm_init, ops, groups, buffers and matching across ranks
 * are all reached; values range over the valid, the edges and the
 * hostile. After each input every client is gone and the daemon must hold
 * nothing. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "frames.h"
#include "front/front.h"
#include "fuzz_input.h"
#include "base/log.h"
#include "ring.h"

enum { CLIENTS = 3, IDS = 4, KNOWN = 8 };

static struct daemon d;
static uv_loop_t loop;

struct client {
  int fd; /* our end of the socketpair; -1: none */
  uint64_t next_req;
  uint64_t comms[KNOWN], buffers[KNOWN]; /* handles the daemon gave */
  int ncomms, nbuffers;
  struct ccs__ring_shared *ring; /* the last rings it set up, mapped here */
  uint32_t sub_tail;
};

static void daemon_once(void) {
  static int ready;
  if (ready) return;
  ready = 1;
  ccsd_config_defaults(&d.cfg);
  d.cfg.threads = 1;
  d.cfg.init_timeout_s = 3600; /* deadlines would only fire between inputs */
  ccs__log_init(CCS_LOG_ERROR, CCS_LOG_ALL); /* refusals are expected here: not worth a line each */
  uv_loop_init(&loop);
  if (ccsd_daemon_init(&d, &loop)) abort();
}

static void spin(void) { /* as ccsd_loop_run does while it spins */
  for (int i = 0; i < 4; i++) {
    ccsd_rings_poll(&d);
    uv_run(&loop, UV_RUN_NOWAIT);
  }
}

/* Reads every reply waiting for c, remembering the handles they carry. */
static void drain(struct client *c) {
  static uint8_t buf[CCS__REPLY_MAX + 64];
  static size_t have;
  if (c->fd < 0) return;
  have = 0;
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
    if (r->body_case == CCS__REPLY__BODY_COMM_INIT && c->ncomms < KNOWN)
      c->comms[c->ncomms++] = r->comm_init->comm;
    if (r->body_case == CCS__REPLY__BODY_MEM_REGISTER && c->nbuffers < KNOWN)
      c->buffers[c->nbuffers++] = r->mem_register->buffer;
    ccs__reply__free_unpacked(r, NULL);
  }
}

static void send_request(struct client *c, Ccs__Request *req, const int *fds, int nfds) {
  req->id = ++c->next_req;
  struct frame f = frame_of(req);
  if (!f.data) return;
  if (frame_send(c->fd, f.data, f.len, fds, nfds, MSG_DONTWAIT) < 0) { /* the daemon closed it */ }
  free(f.data);
}

static void disconnect_client(struct client *c) {
  close(c->fd);
  c->fd = -1;
  if (c->ring) munmap(c->ring, CCS__RING_BYTES);
  c->ring = NULL;
}

static void connect_client(struct client *c) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv)) abort();
  memset(c, 0, sizeof(*c));
  c->fd = sv[1];
  ccsd_session_new(&d, sv[0]);
}

/* Unique ids: fresh ones signed by the daemon, sometimes altered after. */
static struct ccs__unique_id ids[IDS];
static void new_id(struct fuzz_input *in, int k) {
  struct ccs__unique_id *id = &ids[k];
  memset(id, 0, sizeof(*id));
  id->magic = CCS__UNIQUE_ID_MAGIC;
  id->protocol = CCS__PROTOCOL_VERSION;
  fuzz_bytes(in, id->secret, 4); /* the rest zero: ids collide often, as the fuzzer likes */
  id->issued_s = (uint64_t)time(NULL);
  id->owner_uid = (uint32_t)getuid();
  snprintf(id->root, sizeof(id->root), "%s", d.coll.self);
  ccsd_unique_id_sign(&d.coll, id);
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

static void comm_init(struct fuzz_input *in, struct client *c) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__CommInit ci = CCS__COMM_INIT__INIT;
  int k = fuzz_u8(in) % IDS;
  if (fuzz_u8(in) % 4 == 0) new_id(in, k);
  uint8_t bytes[256] = {0}; /* an id, and room for a length that is not one */
  memcpy(bytes, &ids[k], sizeof(ids[k]));
  ci.id.data = bytes;
  ci.id.len = fuzz_u8(in) % 16 ? CCS_UNIQUE_ID_BYTES : fuzz_u8(in);
  ci.nranks = fuzz_count(in, 4);
  ci.rank = fuzz_count(in, 3);
  ci.op_timeout_ms = fuzz_u8(in) % 4 ? 0 : fuzz_u32(in);
  char text[64];
  ci.algo = (char *)algos[fuzz_u8(in) % (sizeof(algos) / sizeof(algos[0]))];
  if (fuzz_u8(in) % 8 == 0) ci.algo = fuzz_string(in, text, sizeof(text));
  ci.debug = fuzz_u8(in) & 1;
  req.body_case = CCS__REQUEST__BODY_COMM_INIT;
  req.comm_init = &ci;
  send_request(c, &req, NULL, 0);
}

static void mem_register(struct fuzz_input *in, struct client *c) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__MemRegister m = CCS__MEM_REGISTER__INIT;
  uint8_t dev[20] = {0}, handle[70] = {0};
  m.domain = fuzz_u8(in) % 8 ? CCS__MEM_HOST : fuzz_u8(in) % 4;
  m.size = fuzz_u64(in);
  m.device = (ProtobufCBinaryData){fuzz_u8(in) % 20, dev};
  m.ipc_handle = (ProtobufCBinaryData){fuzz_u8(in) % 70, handle};
  fuzz_bytes(in, dev, sizeof(dev));
  req.body_case = CCS__REQUEST__BODY_MEM_REGISTER;
  req.mem_register = &m;
  int fds[3], nfds = fuzz_u8(in) % 8 ? 1 : fuzz_u8(in) % 4;
  size_t bytes = 1 + fuzz_count(in, 65536);
  for (int i = 0; i < nfds; i++) {
    fds[i] = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fds[i] < 0 || ftruncate(fds[i], (off_t)bytes)) abort();
    if (fuzz_u8(in) % 8) fcntl(fds[i], F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  }
  send_request(c, &req, fds, nfds);
  for (int i = 0; i < nfds; i++) close(fds[i]);
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
 * layout, a pipe for a doorbell, fds missing). */
static void ring_setup(struct fuzz_input *in, struct client *c) {
  uint8_t how = fuzz_u8(in);
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
    *e = (struct ccs__ring_op){.req_id = req_id, .index = i, .nops = n, .comm = op.comm,
                               .kind = op.kind, .dtype = op.dtype, .redop = op.redop,
                               .root = op.root, .count = op.count};
    if (op.send) e->send = (struct ccs__ring_buf){op.send->buffer, op.send->offset, op.send->length};
    if (op.recv) e->recv = (struct ccs__ring_buf){op.recv->buffer, op.recv->offset, op.recv->length};
    if (how % 32 == 1) e->index = fuzz_u8(in);
    if (how % 32 == 2) e->nops = fuzz_u32(in);
    if (how % 32 == 3) e->req_id = fuzz_u64(in);
    e->flags = how % 32 == 6 ? fuzz_u32(in) : fuzz_u8(in) & (CCS__RING_OP_ORDERED | CCS__RING_OP_STREAM);
    e->order_slot = how % 32 == 7 ? fuzz_u32(in) : fuzz_u8(in);
    e->order_gen = fuzz_u32(in);
  }
  c->sub_tail += how % 32 == 4 ? fuzz_u32(in) : n;
  atomic_store(&sh->sub_tail, c->sub_tail);
  if (how % 4) atomic_store(&sh->done_head, atomic_load(&sh->done_tail)); /* taken */
  if (how % 64 == 5) atomic_store(&sh->done_head, fuzz_u32(in));
}

static const char *const commands[] = {"status", "stuck", "comms", "abort", "config", "metrics", "x"};

static void admin(struct fuzz_input *in, struct client *c) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__Admin a = CCS__ADMIN__INIT;
  char arg[32], num[24];
  char *args[2] = {arg, num};
  a.command = (char *)commands[fuzz_u8(in) % 7];
  a.json = fuzz_u8(in) & 1;
  fuzz_string(in, arg, sizeof(arg));
  snprintf(num, sizeof(num), "%u", fuzz_u8(in) % 64);
  a.n_args = fuzz_u8(in) % 3;
  if (a.n_args == 1 && fuzz_u8(in) % 2) args[0] = num;
  a.args = args;
  req.body_case = CCS__REQUEST__BODY_ADMIN;
  req.admin = &a;
  send_request(c, &req, NULL, 0);
}

static void simple(struct fuzz_input *in, struct client *c, int what) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__Hello h = CCS__HELLO__INIT;
  Ccs__GetUniqueId g = CCS__GET_UNIQUE_ID__INIT;
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
    req.body_case = CCS__REQUEST__BODY_HELLO, req.hello = &h;
    break;
  case 1: req.body_case = CCS__REQUEST__BODY_GET_UNIQUE_ID, req.get_unique_id = &g; break;
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  daemon_once();
  struct fuzz_input in = {data, size, 0};
  struct client clients[CLIENTS];
  for (int i = 0; i < CLIENTS; i++) {
    connect_client(&clients[i]);
    simple(&in, &clients[i], 0); /* most conversations start well */
  }
  for (int k = 0; k < IDS; k++) new_id(&in, k);
  for (int steps = 0; steps < 64 && !fuzz_done(&in); steps++) {
    struct client *c = &clients[fuzz_u8(&in) % CLIENTS];
    if (c->fd < 0) connect_client(c);
    uint8_t what = fuzz_u8(&in) % 20;
    switch (what) {
    case 0: comm_init(&in, c); comm_init(&in, c); break;
    case 1: case 2: comm_init(&in, c); break;
    case 3: mem_register(&in, c); break;
    case 4: case 5: case 6: submit(&in, c); break;
    case 7: admin(&in, c); break;
    case 8: disconnect_client(c); break; /* everything of it goes with it */
    case 16: ring_setup(&in, c); break;
    case 17: case 18: ring_submit(&in, c); break;
    default: simple(&in, c, fuzz_u8(&in) % 10); break;
    }
    spin();
    for (int i = 0; i < CLIENTS; i++) drain(&clients[i]);
  }
  for (int i = 0; i < CLIENTS; i++)
    if (clients[i].fd >= 0) disconnect_client(&clients[i]);
  /* everything the clients made is gone with them (ops on the executor
   * finish first) */
  for (int i = 0; i < 2000 && (!list_empty(&d.sessions) || !list_empty(&d.coll.comms)); i++) {
    spin();
    if (i > 100) usleep(100);
  }
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d.sessions) {
    ccsd_session_close(LIST_ENTRY(it, struct session, link), "fuzz input done");
  }
  for (int i = 0; i < 2000 && (!list_empty(&d.coll.comms) || !list_empty(&d.tenants)); i++) {
    spin();
    if (i > 100) usleep(100);
  }
  if (!list_empty(&d.coll.comms) || !list_empty(&d.tenants) || d.nbuffers) abort();
  return 0;
}
