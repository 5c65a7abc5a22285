/* Fuzz target: what other daemons say, after the greeting (a key holder
 * gone wrong): joins, rank maps, words on ops and failures, well formed
 * with fuzzed values, from several addresses, about real communicators
 * of a live daemon (one with its network side running), driven through
 * the same entry the network thread hands them to (ccsd_span_message).
 * Local clients meanwhile join comms rooted here and at other daemons.
 * After each input every comm and client is gone and the daemon holds
 * nothing. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "frames.h"
#include "front/front.h"
#include "fuzz_input.h"
#include "base/log.h"

enum { IDS = 4, CLIENTS = 2 };

static struct daemon d;
static uv_loop_t loop;
static struct ccs__unique_id ids[IDS]; /* 0, 1: rooted here; 2, 3: at another daemon */
static const char *const others[] = {"127.0.0.1:1", "127.0.0.1:2", "[::1]:3"};

static void daemon_once(void) {
  static int ready;
  if (ready) return;
  ready = 1;
  char key[64];
  snprintf(key, sizeof(key), "/tmp/ccs-fuzz-key-%d", (int)getpid());
  unlink(key);
  int fd = open(key, O_WRONLY | O_CREAT | O_EXCL, 0600);
  const char hex[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
  if (fd < 0 || write(fd, hex, sizeof(hex) - 1) != (ssize_t)sizeof(hex) - 1) abort();
  close(fd);
  ccsd_config_defaults(&d.cfg);
  d.cfg.threads = 1;
  d.cfg.init_timeout_s = 3600;
  snprintf(d.cfg.listen, sizeof(d.cfg.listen), "127.0.0.1:0");
  snprintf(d.cfg.cluster_key_file, sizeof(d.cfg.cluster_key_file), "%s", key);
  ccs__log_init(CCS_LOG_ERROR, CCS_LOG_ALL); /* refusals are expected here: not worth a line each */
  uv_loop_init(&loop);
  if (ccsd_daemon_init(&d, &loop)) abort();
  unlink(key);
}

static void spin(void) {
  for (int i = 0; i < 4; i++) uv_run(&loop, UV_RUN_NOWAIT);
}

static void make_ids(struct fuzz_input *in) {
  for (int k = 0; k < IDS; k++) {
    struct ccs__unique_id *id = &ids[k];
    memset(id, 0, sizeof(*id));
    id->magic = CCS__UNIQUE_ID_MAGIC;
    id->protocol = CCS__PROTOCOL_VERSION;
    fuzz_bytes(in, id->secret, 2);
    id->secret[2] = (uint8_t)k;
    id->issued_s = (uint64_t)time(NULL);
    id->owner_uid = (uint32_t)getuid();
    snprintf(id->root, sizeof(id->root), "%s", k < 2 ? d.coll.self : others[k % 3]);
    ccsd_unique_id_sign(&d.coll, id);
  }
}

/* A local client joins rank `rank` of ids[k] (nranks as given). */
static void local_join(int fd, int k, uint32_t nranks, uint32_t rank) {
  uint8_t bytes[CCS_UNIQUE_ID_BYTES] = {0};
  memcpy(bytes, &ids[k], sizeof(ids[k]));
  struct frame f[2] = {frame_hello(1, CCS__PROTOCOL_VERSION),
                       frame_comm_init(2, (ProtobufCBinaryData){sizeof(bytes), bytes}, nranks, rank)};
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

static void one_message(struct fuzz_input *in) {
  Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
  Ccs__PeerJoin j = CCS__PEER_JOIN__INIT;
  Ccs__PeerReady rd = CCS__PEER_READY__INIT;
  Ccs__PeerOp op = CCS__PEER_OP__INIT;
  Ccs__PeerFail f = CCS__PEER_FAIL__INIT;
  Ccs__PeerHeartbeat hb = CCS__PEER_HEARTBEAT__INIT;
  uint8_t idbytes[256] = {0}, name[48] = {0}; /* room for lengths that are wrong */
  char from[48], algo[40], text[64], addrbuf[8][48];
  char *addrs[8];
  const char *addr = sender(in, from, sizeof(from));
  switch (fuzz_u8(in) % 6) {
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
    m.body_case = CCS__PEER_MSG__BODY_JOIN, m.join = &j;
    break;
  }
  case 1: { /* a root placing the ranks */
    name_of(in, name, &rd.name);
    rd.n_addrs = fuzz_count(in, 4);
    if (rd.n_addrs > 8) rd.n_addrs = 8;
    for (size_t r = 0; r < rd.n_addrs; r++) {
      uint8_t b = fuzz_u8(in) % 6;
      addrs[r] = b < 3 ? (char *)others[b] : b == 3 ? d.coll.self : fuzz_string(in, addrbuf[r], sizeof(addrbuf[r]));
    }
    rd.addrs = addrs;
    rd.chunk_bytes = fuzz_u8(in) % 4 ? 1u << (12 + fuzz_u8(in) % 16) : fuzz_u64(in);
    rd.lanes = fuzz_u8(in) % 4 ? 1u + fuzz_u8(in) % 3u : fuzz_u32(in);
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
  default:
    m.body_case = CCS__PEER_MSG__BODY_HEARTBEAT, m.heartbeat = &hb;
    break;
  }
  struct peer_msg pm; /* as the network side hands it up */
  ccsd_peer_msg_view(&m, &pm);
  ccsd_span_message(&d.coll, addr, &pm);
  if (fuzz_u8(in) % 16 == 0) ccsd_span_peer_lost(&d.coll, addr, "fuzz: lost");
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
    local_join(fds[i], i, 2 + fuzz_u8(&in) % 2, 0);
    local_join(fds[i], 2 + i, 2, fuzz_u8(&in) % 2);
  }
  spin();
  char sink[65536];
  for (int steps = 0; steps < 32 && !fuzz_done(&in); steps++) {
    one_message(&in);
    spin();
    for (int i = 0; i < CLIENTS; i++)
      while (read(fds[i], sink, sizeof(sink)) > 0) {
      }
  }
  for (int i = 0; i < CLIENTS; i++) close(fds[i]);
  spin();
  /* comms held for other daemons would wait for their init deadline */
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d.coll.comms) {
    struct comm *c = LIST_ENTRY(it, struct comm, link);
    if (!c->gone) ccsd_comm_fail(c, CCS_ERR_ABORTED, "fuzz input done");
  }
  for (int i = 0; i < 2000 && (!list_empty(&d.coll.comms) || !list_empty(&d.sessions) || !list_empty(&d.tenants)); i++) {
    spin();
    if (i > 100) usleep(100);
  }
  if (!list_empty(&d.coll.comms) || !list_empty(&d.sessions) || !list_empty(&d.tenants)) abort();
  return 0;
}
