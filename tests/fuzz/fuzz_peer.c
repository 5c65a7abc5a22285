/* Fuzz target: what other daemons say, after the greeting (a key holder
 * gone wrong): joins, rank maps, words on ops, failures, and the words of
 * a restart (a held comm's rejoin, the verdict back), well formed
 * with fuzzed values, from several addresses, about real communicators
 * of a live daemon (one with its network side running). Each message goes
 * one of two ways: straight to the entry the network thread hands them to
 * (ccsd_span_message, as from any address), or over the wire, through the
 * daemon's real listener: a connection of this harness's own transport
 * that proves the cluster key (the daemon holds the fuzz targets' key,
 * fuzz_daemon.h), greets, and sends the message authenticated and
 * encrypted, so that the daemon's receiving, authenticating, unpacking
 * and checking of it run too; now and then it sends bytes that are no
 * message, a data connection's greeting, or a greeting that is wrong.
 * Local clients meanwhile join comms rooted here and at other daemons,
 * some as back after a restart (their comm then waits for the daemons
 * that hold it).
 * After each input every comm and client is gone and the daemon holds
 * nothing.
 *
 * A join sent last, seen on its way up, tells the harness that the daemon
 * has taken everything before it off the connection (messages on a
 * connection are taken in order). What the committed corpus got through
 * that way is checked when it is replayed (fuzz_replay_done). */
#include <fcntl.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "frames.h"
#include "fuzz_daemon.h"
#include "fuzz_input.h"
#include "transport.h"

enum { IDS = 4, CLIENTS = 2, OUTBOX = 64 };

static struct daemon d;
static uv_loop_t loop;
static struct ccs__unique_id ids[IDS]; /* 0, 1: rooted here; 2, 3: at another daemon */
static const char *const others[] = {"127.0.0.1:1", "127.0.0.1:2", "[::1]:3"};

/* This harness as another daemon: a transport holding the cluster key,
 * listening where the daemon answers it (self), and its connection to the
 * daemon for the input under way. */
static const struct transport_ops *wire = &ccs_transport_tcp;
static struct transport *keyholder;
static char self[64];
static struct tconn *conn;
static int conn_failed, greeted, sent_junk, sent_data;
static struct tconn *back[8]; /* the daemon's connections to us */
static int nback;
static uint8_t inbox[8][1 << 16], conn_inbox[1 << 16];

static struct {
  uint64_t confirmed, by_kind[8], junk_closed, data_greeting, hello_refused;
} reach;

static void daemon_once(void) {
  static int ready;
  if (ready) return;
  ready = 1;
  fuzz_daemon_start(&d, &loop, 1);
  struct transport_params p = {.max_conns = 64, .unexpected_per_conn = 1 << 20,
                               .unexpected_total = 1 << 22, .greeting_timeout_s = 10};
  size_t bin = 0;
  char err[256];
  if (sodium_hex2bin(p.key, sizeof(p.key), fuzz_cluster_key_hex, 64, NULL, &bin, NULL) || bin != 32) abort();
  if (!(keyholder = wire->open(&p, err, sizeof(err)))) abort();
  if (wire->listen(keyholder, "127.0.0.1:0", self, sizeof(self), err, sizeof(err))) abort();
}

static void spin(void) { fuzz_daemon_spin(&d, &loop); }

/* Our side of the wire: completions taken (sends' buffers freed, the
 * daemon's messages read and dropped), its connections to us accepted. */
static void pump(void) {
  struct tcompletion done[32];
  int n = wire->poll(keyholder, 0, done, 32);
  for (int i = 0; i < n; i++) {
    if (done[i].is_send) free(done[i].user);
    if (done[i].status && done[i].conn == conn && conn) conn_failed = 1;
    if (done[i].is_send || done[i].status) continue;
    if (done[i].conn == conn && conn && wire->recv(conn, NULL, conn_inbox, sizeof(conn_inbox), 0, NULL))
      conn_failed = 1;
    for (int k = 0; k < nback; k++)
      if (done[i].conn == back[k]) wire->recv(back[k], NULL, inbox[k], sizeof(inbox[k]), 0, NULL);
  }
  struct tconn *c;
  char err[128];
  while (nback < 8 && wire->accept(keyholder, &c, err, sizeof(err)) == 1) {
    back[nback] = c;
    wire->recv(c, NULL, inbox[nback], sizeof(inbox[nback]), 0, NULL);
    nback++;
  }
}

static void wire_send(const uint8_t *bytes, size_t len) {
  if (!conn || conn_failed) return;
  uint8_t *copy = malloc(len ? len : 1);
  memcpy(copy, bytes, len);
  if (wire->send(conn, NULL, copy, len, 0, copy)) { /* the connection is gone */
    free(copy);
    conn_failed = 1;
  }
}

static void wire_send_msg(const Ccs__PeerMsg *m) {
  size_t len = protobuf_c_message_get_packed_size(&m->base);
  uint8_t *buf = malloc(len + 1);
  protobuf_c_message_pack(&m->base, buf);
  wire_send(buf, len);
  free(buf);
}

static void wire_hello(const char *addr, uint32_t protocol) {
  Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
  Ccs__PeerHello h = CCS__PEER_HELLO__INIT;
  h.protocol = protocol;
  h.addr = (char *)addr;
  m.body_case = CCS__PEER_MSG__BODY_HELLO;
  m.hello = &h;
  wire_send_msg(&m);
}

static void make_ids(struct fuzz_input *in) {
  for (int k = 0; k < IDS; k++) {
    uint8_t tag[2];
    fuzz_bytes(in, tag, 2);
    fuzz_unique_id((uint32_t)k << 16 | (uint32_t)tag[0] << 8 | tag[1], (uint32_t)getuid(),
                   k < 2 ? d.coll.self : others[k % 3], &ids[k]);
  }
}

/* A local client joins rank `rank` of ids[k] (nranks as given), or
 * rejoins it after a restart (rejoin 2: its comm spanning daemons),
 * reporting 3 collectives finished. */
static struct frame rejoin_frame(uint64_t req_id, ProtobufCBinaryData id, uint32_t nranks, uint32_t rank,
                                 int spans) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__CommInit ci = CCS__COMM_INIT__INIT;
  Ccs__Rejoin rj = CCS__REJOIN__INIT;
  Ccs__Channel ch = CCS__CHANNEL__INIT, *chs[1] = {&ch};
  ch.peer = -1;
  ch.done = 3;
  rj.channels = chs;
  rj.n_channels = 1;
  rj.spans = spans;
  ci.id = id;
  ci.nranks = nranks;
  ci.rank = rank;
  ci.rejoin = &rj;
  req.id = req_id;
  req.body_case = CCS__REQUEST__BODY_COMM_INIT, req.comm_init = &ci;
  return frame_of(&req);
}

static void local_join(int fd, int k, uint32_t nranks, uint32_t rank, int rejoin) {
  uint8_t bytes[CCS_UNIQUE_ID_BYTES] = {0};
  memcpy(bytes, &ids[k], sizeof(ids[k]));
  ProtobufCBinaryData id = {sizeof(bytes), bytes};
  struct frame f[2] = {frame_hello(1, CCS__PROTOCOL_VERSION),
                       rejoin ? rejoin_frame(2, id, nranks, rank, rejoin > 1) : frame_comm_init(2, id, nranks, rank)};
  for (int i = 0; i < 2; i++) {
    if (f[i].data && send(fd, f[i].data, f[i].len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* closed */ }
    free(f[i].data);
  }
}

static const char *sender(struct fuzz_input *in, char *buf, size_t len) {
  uint8_t b = fuzz_u8(in) % 8;
  if (b < 3) return others[b];
  if (b == 3) return d.coll.self;
  if (b == 4) return fuzz_string(in, buf, len);
  return others[0];
}

static void name_of(struct fuzz_input *in, uint8_t name[48], ProtobufCBinaryData *ret) {
  int k = fuzz_u8(in) % IDS;
  ccsd_comm_name(&ids[k], name);
  if (fuzz_u8(in) % 16 == 0) name[fuzz_u8(in) % CCS__NAME_BYTES] ^= 1;
  *ret = (ProtobufCBinaryData){fuzz_u8(in) % 32 ? CCS__NAME_BYTES : fuzz_u8(in) % 40, name};
}

/* A rank map of up to 8 daemons: known ones, this daemon, the harness,
 * or (one choice in `choices` beyond those) fuzzed text. */
static size_t fuzz_addrs(struct fuzz_input *in, int choices, char *addrs[8], char addrbuf[8][48]) {
  size_t n = fuzz_count(in, 4);
  if (n > 8) n = 8;
  for (size_t r = 0; r < n; r++) {
    uint8_t b = fuzz_u8(in) % choices;
    addrs[r] = b < 3 ? (char *)others[b] : b == 3 ? d.coll.self : b == 4 ? self
                                                                : fuzz_string(in, addrbuf[r], 48);
  }
  return n;
}

/* Up to 2 ranks' reports of where their calls stood after a restart, in
 * or out of range (a holder's rejoin, a comm made again: its joins and
 * its rank map). */
struct fuzz_reports {
  Ccs__PeerRank pr[2], *prp[2];
  Ccs__Rejoin rep[2];
  Ccs__Channel chan[4], *chp[4];
  protobuf_c_boolean retry[4][2];
};
static size_t fuzz_reports(struct fuzz_input *in, struct fuzz_reports *f) {
  size_t n = fuzz_u8(in) % 3;
  for (size_t r = 0; r < n; r++) {
    ccs__peer_rank__init(&f->pr[r]);
    ccs__rejoin__init(&f->rep[r]);
    f->pr[r].rank = fuzz_u8(in) % 8 ? fuzz_u8(in) % 4 : fuzz_u32(in);
    f->pr[r].report = fuzz_u8(in) % 8 ? &f->rep[r] : NULL;
    f->rep[r].spans = fuzz_u8(in) % 4 != 0;
    f->rep[r].n_channels = fuzz_u8(in) % 3;
    f->rep[r].channels = &f->chp[2 * r];
    for (size_t k = 0; k < f->rep[r].n_channels; k++) {
      Ccs__Channel *ch = &f->chan[2 * r + k];
      ccs__channel__init(ch);
      ch->peer = fuzz_u8(in) % 4 ? (int32_t)(fuzz_u8(in) % 4) - 1 : (int32_t)fuzz_u32(in);
      ch->send = fuzz_u8(in) % 2;
      ch->done = fuzz_u8(in) % 4 ? fuzz_u8(in) % 8 : fuzz_u64(in);
      ch->n_must_retry = fuzz_u8(in) % 3;
      for (size_t q = 0; q < ch->n_must_retry; q++) f->retry[2 * r + k][q] = fuzz_u8(in) % 2;
      ch->must_retry = f->retry[2 * r + k];
      f->chp[2 * r + k] = ch;
    }
    f->prp[r] = &f->pr[r];
  }
  return n;
}

/* Up to max counts of messages between two ranks, in or out of range. */
static size_t fuzz_counts(struct fuzz_input *in, Ccs__PeerCount *counts, Ccs__PeerCount **ptrs, size_t max) {
  size_t n = fuzz_u8(in) % (max + 1);
  for (size_t i = 0; i < n; i++) {
    ccs__peer_count__init(&counts[i]);
    counts[i].from = fuzz_u8(in) % 4 ? (int32_t)(fuzz_u8(in) % 5) - 1 : (int32_t)fuzz_u32(in);
    counts[i].to = fuzz_u8(in) % 4 ? (int32_t)(fuzz_u8(in) % 5) - 1 : (int32_t)fuzz_u32(in);
    counts[i].finished = fuzz_u8(in) % 4 ? fuzz_u8(in) % 8 : fuzz_u64(in);
    ptrs[i] = &counts[i];
  }
  return n;
}

static void one_message(struct fuzz_input *in) {
  Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
  Ccs__PeerJoin j = CCS__PEER_JOIN__INIT;
  Ccs__PeerReady rd = CCS__PEER_READY__INIT;
  Ccs__PeerOp op = CCS__PEER_OP__INIT;
  Ccs__PeerFail f = CCS__PEER_FAIL__INIT;
  Ccs__PeerHeartbeat hb = CCS__PEER_HEARTBEAT__INIT;
  Ccs__PeerData dm = CCS__PEER_DATA__INIT;
  Ccs__PeerRejoin rj = CCS__PEER_REJOIN__INIT;
  Ccs__PeerResume rs = CCS__PEER_RESUME__INIT;
  struct fuzz_reports reps;
  Ccs__PeerCount counts[6], *countp[6]; /* kept sends, messages arrived, a verdict's counts */
  int sub;
  uint8_t idbytes[256] = {0}, name[48] = {0}; /* room for lengths that are wrong */
  char from[48], algo[40], text[64], addrbuf[8][48];
  char *addrs[8];
  const char *addr = sender(in, from, sizeof(from));
  int kind = fuzz_u8(in) % 7;
  switch (kind) {
  case 0: { /* a rank joining a comm rooted here */
    int k = fuzz_u8(in) % 2;
    memcpy(idbytes, &ids[k], sizeof(ids[k]));
    if (fuzz_u8(in) % 8 == 0) idbytes[fuzz_u8(in) % CCS_UNIQUE_ID_BYTES] ^= (uint8_t)(1 + fuzz_u8(in) % 255);
    j.id = (ProtobufCBinaryData){fuzz_u8(in) % 16 ? CCS_UNIQUE_ID_BYTES : fuzz_u8(in), idbytes};
    j.nranks = fuzz_count(in, 4);
    j.rank = fuzz_count(in, 3);
    j.uid = fuzz_u8(in) % 8 ? ids[k].owner_uid : fuzz_u32(in);
    j.pid = (int32_t)fuzz_u32(in);
    j.algo = fuzz_u8(in) % 4 ? "" : fuzz_string(in, algo, sizeof(algo));
    if (fuzz_u8(in) % 4 == 0 && fuzz_reports(in, &reps)) /* back after every daemon of it restarted */
      j.report = reps.pr[0].report;
    m.body_case = CCS__PEER_MSG__BODY_JOIN, m.join = &j;
    break;
  }
  case 1: { /* a root placing the ranks */
    name_of(in, name, &rd.name);
    rd.n_addrs = fuzz_addrs(in, 7, addrs, addrbuf);
    rd.addrs = addrs;
    rd.chunk_bytes = fuzz_u8(in) % 4 ? 1u << (12 + fuzz_u8(in) % 16) : fuzz_u64(in);
    rd.lanes = fuzz_u8(in) % 4 ? 1u + fuzz_u8(in) % 3u : fuzz_u32(in);
    if (fuzz_u8(in) % 4 == 0) { /* made again: every rank's report */
      rd.n_ranks = fuzz_reports(in, &reps);
      rd.ranks = reps.prp;
    }
    m.body_case = CCS__PEER_MSG__BODY_READY, m.ready = &rd;
    break;
  }
  case 2: /* a word on an op */
    name_of(in, name, &op.name);
    op.seq = fuzz_u8(in) % 4 ? fuzz_u8(in) % 8 : fuzz_u64(in);
    op.kind = fuzz_u8(in) % (CCS__COLL_KIND_COUNT + 2);
    op.count = fuzz_u8(in) % 4 ? fuzz_u8(in) : fuzz_u64(in);
    op.dtype = fuzz_u8(in) % (CCS_DTYPE_COUNT + 1);
    op.redop = fuzz_u8(in) % (CCS_REDOP_COUNT + 1);
    op.root = (int32_t)(fuzz_u8(in) % 4 ? fuzz_u8(in) % 4 : fuzz_u32(in));
    op.rank = (int32_t)(fuzz_u8(in) % 4 ? fuzz_u8(in) % 4 : fuzz_u32(in));
    m.body_case = CCS__PEER_MSG__BODY_OP, m.op = &op;
    break;
  case 3: /* a failure */
    name_of(in, name, &f.name);
    f.status = (int32_t)fuzz_u32(in);
    f.error = fuzz_string(in, text, sizeof(text));
    m.body_case = CCS__PEER_MSG__BODY_FAIL, m.fail = &f;
    break;
  case 4: /* a data connection's greeting: over the wire only */
    name_of(in, name, &dm.name);
    dm.lane = fuzz_u8(in) % 4 ? fuzz_u8(in) % 4 : fuzz_u32(in);
    m.body_case = CCS__PEER_MSG__BODY_DATA, m.data = &dm;
    break;
  case 6: /* a heartbeat, or the words of a restart */
    sub = fuzz_u8(in) % 3;
    if (sub == 1) { /* a daemon holding a comm for this one, saying where its ranks stood */
      name_of(in, name, &rj.name);
      rj.n_addrs = fuzz_addrs(in, 6, addrs, addrbuf);
      rj.addrs = addrs;
      rj.chunk_bytes = fuzz_u8(in) % 4 ? 1u << (12 + fuzz_u8(in) % 16) : fuzz_u64(in);
      rj.lanes = fuzz_u8(in) % 4 ? 1u + fuzz_u8(in) % 3u : fuzz_u32(in);
      rj.hold = fuzz_u64(in);
      rj.kept = fuzz_u8(in) % 4 ? fuzz_u8(in) % 8 : fuzz_u64(in);
      rj.n_ranks = fuzz_reports(in, &reps);
      rj.ranks = reps.prp;
      rj.n_kept_sends = fuzz_counts(in, counts, countp, 3);
      rj.kept_sends = countp;
      rj.n_arrived = fuzz_counts(in, counts + 3, countp + 3, 3);
      rj.arrived = countp + 3;
      m.body_case = CCS__PEER_MSG__BODY_REJOIN, m.rejoin = &rj;
      kind = 6;
      break;
    }
    if (sub == 2) { /* the restarted daemon's verdict */
      name_of(in, name, &rs.name);
      rs.finished = fuzz_u8(in) % 4 ? fuzz_u8(in) % 8 : fuzz_u64(in);
      rs.retry_from = fuzz_u8(in) % 2 ? UINT64_MAX : fuzz_u8(in) % 4 ? fuzz_u8(in) % 8 : fuzz_u64(in);
      rs.hold = fuzz_u8(in) % 2 ? fuzz_u8(in) % 64 : fuzz_u64(in);
      rs.n_rerun = fuzz_u8(in) % 2 ? 0 : fuzz_addrs(in, 6, addrs, addrbuf); /* daemons to send a collective again */
      rs.rerun = addrs;
      rs.n_counts = fuzz_counts(in, counts, countp, 6);
      rs.counts = countp;
      m.body_case = CCS__PEER_MSG__BODY_RESUME, m.resume = &rs;
      kind = 7;
      break;
    }
    kind = 5;
    m.body_case = CCS__PEER_MSG__BODY_HEARTBEAT, m.heartbeat = &hb;
    break;
  default:
    m.body_case = CCS__PEER_MSG__BODY_HEARTBEAT, m.heartbeat = &hb;
    break;
  }
  uint8_t how = fuzz_u8(in);
  if (how % 2 && conn) { /* over the wire, from the address our greeting gave */
    if (how % 32 == 1) { /* bytes that are no message */
      uint8_t junk[64];
      size_t n = fuzz_u8(in) % sizeof(junk);
      fuzz_bytes(in, junk, n);
      wire_send(junk, n);
      sent_junk = 1;
      return;
    }
    wire_send_msg(&m);
    reach.by_kind[kind]++; /* known to have got through once the batch is confirmed, below */
    sent_data |= kind == 4;
    return;
  }
  if (kind == 4) return; /* only a connection greets as data */
  struct peer_msg pm; /* as the network side hands it up */
  ccsd_peer_msg_view(&m, &pm);
  ccsd_span_message(&d.coll, addr, &pm);
  if (fuzz_u8(in) % 16 == 0) ccsd_span_peer_lost(&d.coll, addr, "fuzz: lost");
}

/* Connects to the daemon and greets: mostly as a daemon does, from where
 * it listens; sometimes from another address, or in another protocol. */
static void wire_open(struct fuzz_input *in) {
  char err[256];
  conn_failed = greeted = sent_junk = sent_data = 0;
  if (wire->connect(keyholder, d.coll.self, &conn, err, sizeof(err))) {
    conn = NULL;
    return;
  }
  wire->recv(conn, NULL, conn_inbox, sizeof(conn_inbox), 0, NULL); /* its greeting, and its closing */
  uint8_t how = fuzz_u8(in) % 16;
  char addr[48];
  if (how == 1) wire_hello(fuzz_string(in, addr, sizeof(addr)), CCS__PROTOCOL_VERSION);
  else if (how == 2) wire_hello(self, fuzz_u32(in));
  else if (how == 3) wire_hello(others[0], CCS__PROTOCOL_VERSION);
  else wire_hello(self, CCS__PROTOCOL_VERSION);
  greeted = how != 1 && how != 2;
}

/* Every message the network side hands up passes here on its way to
 * ccsd_span_message (the target is linked with --wrap of it): the join
 * that ends a batch is seen whatever becomes of the comm it makes. */
static struct ccs__unique_id marker;
static int marker_seen;
void __real_ccsd_span_message(struct coll *co, const char *addr, const struct peer_msg *m);
void __wrap_ccsd_span_message(struct coll *co, const char *addr, const struct peer_msg *m) {
  if (m->kind == PEER_JOIN && m->join.id_len == CCS_UNIQUE_ID_BYTES && !memcmp(m->join.id, &marker, sizeof(marker)))
    marker_seen = 1;
  __real_ccsd_span_message(co, addr, m);
}

/* The join sent last has been handed up, so everything before it on the
 * connection was taken off it: confirmed; or the daemon closed it. */
static int wire_confirm(void) {
  if (!conn) return 0;
  fuzz_unique_id(0x3a3a3a3au, (uint32_t)getuid(), d.coll.self, &marker);
  uint8_t bytes[CCS_UNIQUE_ID_BYTES] = {0};
  memcpy(bytes, &marker, sizeof(marker));
  Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
  Ccs__PeerJoin j = CCS__PEER_JOIN__INIT;
  j.id = (ProtobufCBinaryData){sizeof(bytes), bytes};
  j.nranks = 2;
  j.rank = 1;
  j.uid = (uint32_t)getuid();
  j.pid = 1;
  j.algo = "";
  m.body_case = CCS__PEER_MSG__BODY_JOIN, m.join = &j;
  marker_seen = 0;
  wire_send_msg(&m);
  for (int i = 0; i < 4000; i++) {
    pump();
    spin();
    if (marker_seen) return 1;
    if (conn_failed) return 0;
    if (i > 20) usleep(50);
  }
  fprintf(stderr, "fuzz_peer: the daemon neither took the last join nor closed the connection\n");
  abort(); /* a connection it neither serves nor drops */
}

/* After the corpus (replay.c): messages of every kind got through the
 * wire (authenticated, unpacked, handed up: confirmed by the join after
 * them), and so were bytes that are no message, a data connection's
 * greeting and a wrong greeting (the daemon closed the connection). */
int fuzz_replay_done(void) {
  static const char *const kinds[] = {"join", "rank map", "word on an op", "failure", "", "heartbeat",
                                      "rejoin of a held comm", "verdict of a restart"};
  int missing = 0;
  for (int k = 0; k < 8; k++)
    if (k != 4 && !reach.by_kind[k]) {
      fprintf(stderr, "fuzz_peer: no %s ever got through the wire\n", kinds[k]);
      missing = 1;
    }
  if (!reach.junk_closed) fprintf(stderr, "fuzz_peer: bytes that are no message never closed a connection\n");
  if (!reach.data_greeting) fprintf(stderr, "fuzz_peer: a data connection's greeting never reached the daemon\n");
  if (!reach.hello_refused) fprintf(stderr, "fuzz_peer: a wrong greeting never closed a connection\n");
  missing |= !reach.junk_closed || !reach.data_greeting || !reach.hello_refused;
  fprintf(stderr, "fuzz_peer: %llu batches confirmed over the wire\n", (unsigned long long)reach.confirmed);
  return missing;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  daemon_once();
  struct fuzz_input in = {data, size, 0};
  make_ids(&in);
  int fds[CLIENTS];
  for (int i = 0; i < CLIENTS; i++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv)) abort();
    ccsd_session_new(&d, sv[0]);
    fds[i] = sv[1];
    /* rank 0 of a comm rooted here, and a rank of one rooted elsewhere */
    local_join(fds[i], i, 2 + fuzz_u8(&in) % 2, 0, 0);
    uint8_t b = fuzz_u8(&in); /* its rank, and (bit 1) whether it comes back after a restart */
    local_join(fds[i], 2 + i, 2, b % 2, b & 2 ? 1 + (b & 4) / 4 : 0);
  }
  spin();
  wire_open(&in);
  uint64_t counted[8];
  memcpy(counted, reach.by_kind, sizeof(counted));
  char sink[65536];
  for (int steps = 0; steps < 32 && !fuzz_done(&in); steps++) {
    one_message(&in);
    pump();
    spin();
    for (int i = 0; i < CLIENTS; i++)
      while (read(fds[i], sink, sizeof(sink)) > 0) {
      }
  }
  if (wire_confirm()) {
    reach.confirmed++;
  } else {
    memcpy(reach.by_kind, counted, sizeof(counted)); /* not known to have got through */
    if (conn && conn_failed) { /* the daemon closed it: for what we sent */
      reach.hello_refused += !greeted;
      reach.junk_closed += greeted && sent_junk;
      reach.data_greeting += greeted && sent_data;
    }
  }
  for (int i = 0; i < CLIENTS; i++) close(fds[i]);
  if (conn) wire->close(conn);
  conn = NULL;
  for (int k = 0; k < nback; k++) wire->close(back[k]);
  nback = 0;
  for (int i = 0; i < 100; i++) {
    pump();
    spin();
  }
  fuzz_daemon_settle(&d, &loop);
  return 0;
}
