/* The trust boundary between daemons (docs/trust.md), with three daemons
 * on loopback ports or in network namespaces: whoever lacks the cluster
 * key gets no further than the greeting, whatever address it claims; a
 * key holder that floods a daemon with messages nobody asked for is cut
 * off at the cap, the daemon's memory bounded; a daemon's word on a comm
 * it takes no part in changes nothing; a leaked unique id gets another
 * user nowhere, through any daemon, however it is altered. Meanwhile and
 * afterwards the communicators of the daemons' own tenants run with
 * correct results. Runs as root (a client switches to uid 65534). */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "auth.h"
#include "front/front.h"
#include "harness.h"
#include "raw.h"
#include "serving.h"
#include "transport.h"
#include "wire.h"

#define ND 3
#define WRONG_RESULT 99 /* a rank's code when a result was wrong */
/* an attack that could not be carried out: the ranks stop, the test fails */
#define GIVE_UP(code) (sh->stop = 1, _exit(code))

struct shared {
  ccs_unique_id_t id;
  volatile int attacked, stop;
  int running; /* busy ranks that completed an op */
  int code[8];
  char text[8][512];
};
static struct shared *sh;
static struct test_daemon dm[ND];
static struct test_daemon_state clean[ND];
static const char *const daemon_args[] = {"--heartbeat", "0.2", "--peer-timeout", "1.5",
                                          "--io-timeout", "1", "--socket-mode", "0666",
                                          "--peer-unexpected-bytes", "4M", NULL};

static int busy_rank(int rank, int n, void *arg);

static int setup(void **state) {
  sh = test_shared_new(sizeof(*sh));
  if (!sh || test_daemons_start(dm, ND, daemon_args)) return -1;
  test_spread_ranks(dm, ND);
  /* a first comm over every daemon: the daemons' control connections to
   * each other stay, and are part of what each holds */
  if (ccs_get_unique_id(&sh->id) != CCS_OK) return -1;
  sh->stop = 1;
  if (test_run_ranks(ND, busy_rank, (void *)(intptr_t)1, 60, NULL)) return -1;
  for (int i = 0; i < ND; i++) test_daemon_state(&dm[i], &clean[i]);
  return 0;
}

static int teardown(void **state) {
  int rc = 0;
  for (int i = 0; i < ND; i++) rc |= test_daemon_stop(&dm[i]); /* each must stop cleanly */
  test_shared_free(sh, sizeof(*sh));
  return rc;
}

/* The id's root: daemon 0's address for other daemons. */
static void root_of(const ccs_unique_id_t *id, char *out, size_t len) {
  struct ccs__unique_id u;
  memcpy(&u, id->internal, sizeof(u));
  snprintf(out, len, "%s", u.root);
}

/* A comm over all three daemons doing checked all_reduce until told to
 * stop (at least `min` of them); any failure is recorded. */
static int busy_rank(int rank, int n, void *arg) {
  int min = (int)(intptr_t)arg;
  if (min < 0) { /* as the other tenant */
    test_become_other_tenant();
    min = -min;
  }
  ccs_comm_t *comm;
  sh->code[rank] = ccs_comm_init_rank(&comm, n, sh->id, rank);
  if (sh->code[rank] != CCS_OK) {
    snprintf(sh->text[rank], sizeof(sh->text[rank]), "init: %s", ccs_comm_last_error(NULL));
    return 1;
  }
  /* the ranks stop together: whether any saw the flag travels in the op */
  for (int i = 0, stop = 0; !stop && sh->code[rank] == CCS_OK; i++) {
    double v[6] = {rank, i, -rank, 1, 0.5 * rank, i >= min && sh->stop}, out[6];
    sh->code[rank] = ccs_all_reduce(v, out, 6, CCS_FLOAT64, CCS_SUM, comm, NULL);
    if (i == 0) __atomic_add_fetch(&sh->running, 1, __ATOMIC_SEQ_CST);
    double want[5] = {n * (n - 1) / 2.0, (double)n * i, -n * (n - 1) / 2.0, n, n * (n - 1) / 4.0};
    if (sh->code[rank] == CCS_OK && memcmp(out, want, sizeof(want))) sh->code[rank] = WRONG_RESULT;
    stop = out[5] > 0;
  }
  snprintf(sh->text[rank], sizeof(sh->text[rank]), "%s", ccs_comm_last_error(comm));
  ccs_comm_destroy(comm);
  return sh->code[rank] != CCS_OK;
}

/* Afterwards: both tenants' comms over every daemon give correct results,
 * and each daemon holds what it held before (fds, clients, comms,
 * buffers, bytes, ops). */
static void both_tenants_served(void) {
  sh->stop = 1;
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(ND, busy_rank, (void *)(intptr_t)3, 60, NULL), 0);
  test_other_tenant_id(&sh->id); /* the other tenant's comm across every daemon */
  assert_int_equal(test_run_ranks(ND, busy_rank, (void *)(intptr_t)-3, 60, NULL), 0);
  for (int i = 0; i < ND; i++) test_daemon_assert_clean(&dm[i], &clean[i]);
}

/* Runs busy ranks (one per daemon) while `attack` runs in a child; every
 * rank must succeed throughout. */
static void while_tenants_run(void (*attack)(void)) {
  test_new_id(&sh->id);
  sh->stop = 0;
  sh->running = 0;
  pid_t pid = fork();
  if (pid == 0) {
    /* the comm is up: every rank completed an op */
    for (double end = test_now() + 60; __atomic_load_n(&sh->running, __ATOMIC_SEQ_CST) < ND;)
      if (test_now() > end) GIVE_UP(2);
      else usleep(1000);
    attack();
    sh->stop = 1;
    _exit(0);
  }
  int failed = test_run_ranks(ND, busy_rank, (void *)(intptr_t)20, 120, NULL);
  int st;
  waitpid(pid, &st, 0);
  for (int r = 0; r < ND; r++)
    if (sh->code[r]) fprintf(stderr, "# rank %d: %s: %s\n", r, ccs_result_name(sh->code[r]), sh->text[r]);
  assert_int_equal(failed, 0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  both_tenants_served();
}

static int tcp_to(const char *addr) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  char host[64];
  snprintf(host, sizeof(host), "%s", addr);
  char *colon = strrchr(host, ':');
  *colon = 0;
  sa.sin_port = htons((uint16_t)atoi(colon + 1));
  inet_pton(AF_INET, host, &sa.sin_addr);
  const char *netns = getenv("CCS_TEST_NETNS");
  if (netns && *netns) { /* from another "host" */
    char path[128];
    snprintf(path, sizeof(path), "/run/netns/%s1", netns);
    int ns = open(path, O_RDONLY);
    if (ns >= 0 && setns(ns, CLONE_NEWNET) == 0) close(ns);
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) GIVE_UP(3);
  return fd;
}

/* --- strangers: no key, no entry ------------------------------------------------ */

static void strangers(void) {
  char root[64];
  root_of(&sh->id, root, sizeof(root));
  uint8_t greeting[41];
  /* answers the greeting with a made-up proof, claiming daemon 1's address */
  int fd = tcp_to(root);
  ssize_t got = 0;
  while (got < 41) {
    ssize_t n = read(fd, greeting + got, (size_t)(41 - got));
    if (n <= 0) GIVE_UP(4);
    got += n;
  }
  if (memcmp(greeting, "CCS-KEY", 7)) GIVE_UP(5);
  uint8_t answer[73];
  memcpy(answer, greeting, 9);
  for (int i = 9; i < 73; i++) answer[i] = (uint8_t)(i * 37);
  if (write(fd, answer, sizeof(answer)) != (ssize_t)sizeof(answer) || !raw_closed_by_daemon(fd)) GIVE_UP(6);
  close(fd);
  /* the old greeting: a PeerHello in clear, with another daemon's address */
  fd = tcp_to(root);
  Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
  Ccs__PeerHello h = CCS__PEER_HELLO__INIT;
  h.protocol = CCS__PROTOCOL_VERSION;
  char other[64];
  snprintf(other, sizeof(other), "%s", root); /* any daemon's: it proves nothing */
  h.addr = other;
  m.body_case = CCS__PEER_MSG__BODY_HELLO;
  m.hello = &h;
  uint8_t frame[256] = {0};
  size_t len = protobuf_c_message_pack(&m.base, frame + 16);
  frame[8] = (uint8_t)len;
  if (write(fd, frame, 16 + len) != (ssize_t)(16 + len) || !raw_closed_by_daemon(fd)) GIVE_UP(7);
  close(fd);
  /* and silence, and a flood of junk: closed, never read beyond the greeting */
  fd = tcp_to(root);
  if (!raw_closed_by_daemon(fd)) GIVE_UP(8);
  close(fd);
  fd = tcp_to(root);
  static char junk[1 << 20];
  memset(junk, 0x5a, sizeof(junk));
  ssize_t w = write(fd, junk, sizeof(junk)); /* the daemon reads 73 bytes of it at most */
  (void)w;
  if (!raw_closed_by_daemon(fd)) GIVE_UP(9);
  close(fd);
}

static void test_strangers_get_nowhere(void **state) { while_tenants_run(strangers); }

/* --- a key holder that floods a daemon -------------------------------------------- */

static long rss_kib(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kib = -1;
  while (f && fgets(line, sizeof(line), f))
    if (!strncmp(line, "VmRSS:", 6)) kib = atol(line + 6);
  if (f) fclose(f);
  return kib;
}

/* A transport of our own with the cluster key: we are "a daemon". */
static struct transport *keyholder(void) {
  struct transport_params p = {.max_conns = 16, .unexpected_per_conn = 1 << 20,
                               .unexpected_total = 1 << 20, .greeting_timeout_s = 5};
  char err[256];
  if (ccs_auth_read_key(test_cluster_key(), p.key, err, sizeof(err))) GIVE_UP(10);
  struct transport *t = ccs_transport_tcp.open(&p, err, sizeof(err));
  if (!t) GIVE_UP(11);
  return t;
}

/* What was sent lives until the process exits (the transport may still
 * hold it): few, and kept where the leak checker sees them. */
static uint8_t *sent[256];
static int nsent;

static void send_msg(struct tconn *c, const Ccs__PeerMsg *m) {
  size_t len = protobuf_c_message_get_packed_size(&m->base);
  uint8_t *buf = malloc(len + 1);
  if (!buf || nsent == (int)(sizeof(sent) / sizeof(sent[0]))) GIVE_UP(13);
  sent[nsent++] = buf;
  protobuf_c_message_pack(&m->base, buf);
  if (ccs_transport_tcp.send(c, NULL, buf, len, 0, NULL)) GIVE_UP(12);
}

static void say_hello(struct tconn *c, const char *addr) {
  Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
  Ccs__PeerHello h = CCS__PEER_HELLO__INIT;
  h.protocol = CCS__PROTOCOL_VERSION;
  h.addr = (char *)addr;
  m.body_case = CCS__PEER_MSG__BODY_HELLO;
  m.hello = &h;
  send_msg(c, &m);
}

/* 1 when c failed (the daemon closed it) within 10 s */
static int cut_off(struct transport *t) {
  struct tcompletion done[64];
  for (double end = test_now() + 10; test_now() < end;) {
    int n = ccs_transport_tcp.poll(t, 20, done, 64);
    for (int i = 0; i < n; i++)
      if (done[i].status < 0) return 1;
  }
  return 0;
}

static long rss_before, rss_after;

static void flood(void) {
  char root[64];
  root_of(&sh->id, root, sizeof(root));
  struct transport *t = keyholder();
  struct tconn *c;
  char err[256];
  if (ccs_transport_tcp.connect(t, root, &c, err, sizeof(err))) GIVE_UP(13);
  say_hello(c, "127.0.0.1:1");
  static char chunk[1 << 20];
  memset(chunk, 1, sizeof(chunk));
  rss_before = rss_kib(dm[0].pid);
  for (int i = 0; i < 64; i++) /* 64 MiB that no receive will ever take */
    if (ccs_transport_tcp.send(c, NULL, chunk, sizeof(chunk), 0x7700 + (uint64_t)i, NULL)) break;
  if (!cut_off(t)) GIVE_UP(14);
  rss_after = rss_kib(dm[0].pid);
  fprintf(stderr, "# flooding key holder cut off; daemon RSS %ld -> %ld KiB\n", rss_before, rss_after);
  if (rss_after - rss_before > 32 << 10) GIVE_UP(15); /* the cap is 4 MiB */
  ccs_transport_tcp.free(t);
}

static void test_flood_is_cut_off(void **state) { while_tenants_run(flood); }

/* --- a daemon's word on comms it takes no part in ---------------------------------------- */

static void meddler(void) {
  char root[64];
  root_of(&sh->id, root, sizeof(root));
  struct transport *t = keyholder();
  struct tconn *c;
  char err[256];
  if (ccs_transport_tcp.connect(t, root, &c, err, sizeof(err))) GIVE_UP(16);
  say_hello(c, "127.0.0.1:2");
  struct ccs__unique_id id;
  memcpy(&id, sh->id.internal, sizeof(id));
  uint8_t name[CCS__NAME_BYTES];
  ccsd_comm_name(&id, name);
  Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
  Ccs__PeerFail f = CCS__PEER_FAIL__INIT;
  f.name = (ProtobufCBinaryData){sizeof(name), name};
  f.status = CCS_ERR_ABORTED;
  f.error = "meddling";
  m.body_case = CCS__PEER_MSG__BODY_FAIL;
  m.fail = &f;
  send_msg(c, &m);
  Ccs__PeerMsg o = CCS__PEER_MSG__INIT;
  Ccs__PeerOp op = CCS__PEER_OP__INIT;
  op.name = f.name;
  op.seq = 3;
  op.kind = CCS__ALL_REDUCE;
  op.count = 1;
  o.body_case = CCS__PEER_MSG__BODY_OP;
  o.op = &op;
  send_msg(c, &o);
  /* a rank map from a daemon that is not the root */
  Ccs__PeerMsg r = CCS__PEER_MSG__INIT;
  Ccs__PeerReady rd = CCS__PEER_READY__INIT;
  rd.name = f.name;
  r.body_case = CCS__PEER_MSG__BODY_READY;
  r.ready = &rd;
  send_msg(c, &r);
  struct tcompletion done[8];
  for (double end = test_now() + 1; test_now() < end;) ccs_transport_tcp.poll(t, 20, done, 8);
  ccs_transport_tcp.free(t);
}

static void test_words_of_outsiders_change_nothing(void **state) { while_tenants_run(meddler); }

/* --- rules a daemon forwards with a join ------------------------------------------------------ */

static void send_join(struct tconn *c, const ccs_unique_id_t *id, const char *algo) {
  Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
  Ccs__PeerJoin j = CCS__PEER_JOIN__INIT;
  j.id = (ProtobufCBinaryData){CCS_UNIQUE_ID_BYTES, (uint8_t *)id->internal};
  j.nranks = 2;
  j.rank = 1;
  j.uid = 0;
  j.pid = 4242;
  j.algo = (char *)algo;
  m.body_case = CCS__PEER_MSG__BODY_JOIN;
  m.join = &j;
  send_msg(c, &m);
}

static uint64_t comms_at(int i) {
  Ccs__StatsReply *st = raw_stats(dm[i].socket);
  uint64_t n = st->comms;
  free(st);
  return n;
}

/* A key holder that greets as moving data by another transport (ib, where
 * these daemons use TCP) is closed at its greeting: mixed transports
 * would misread each other's messages. */
static void test_other_transport_refused(void **state) {
  (void)state;
  char root[64], err[256];
  test_new_id(&sh->id);
  root_of(&sh->id, root, sizeof(root));
  struct transport *t = keyholder();
  struct tconn *c;
  assert_int_equal(ccs_transport_tcp.connect(t, root, &c, err, sizeof(err)), 0);
  Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
  Ccs__PeerHello h = CCS__PEER_HELLO__INIT;
  h.protocol = CCS__PROTOCOL_VERSION;
  h.addr = "127.0.0.1:9";
  h.transport = "ib";
  m.body_case = CCS__PEER_MSG__BODY_HELLO;
  m.hello = &h;
  send_msg(c, &m);
  static char inbox[65536];
  ccs_transport_tcp.recv(c, NULL, inbox, sizeof(inbox), 0, NULL); /* its greeting, then the close */
  ccs_transport_tcp.recv(c, NULL, inbox, sizeof(inbox), 0, NULL);
  assert_true(cut_off(t));
  ccs_transport_tcp.free(t);
  both_tenants_served();
}

/* A key holder joins comms rooted at daemon 0 for a rank of its own, with
 * algorithm rules that do not parse (or are too long): each is refused
 * and makes no comm; the same join without rules, sent after them on the
 * same connection (so answered after them), makes one. */
static void test_peer_rules_refused(void **state) {
  static const char *const bad[] = {":", "all_reduce:ring:nan-1K", "spiral", "ring::0-1K", NULL};
  static char too_long[700];
  memset(too_long, 'r', sizeof(too_long) - 1);
  uint64_t before = comms_at(0);
  char root[64];
  test_new_id(&sh->id);
  root_of(&sh->id, root, sizeof(root));
  struct transport *t = keyholder();
  struct tconn *c, *back;
  char err[256], self[64];
  /* where the daemon answers (its refusals): here, so that it keeps the
   * connection and the comm it makes for our rank */
  assert_int_equal(ccs_transport_tcp.listen(t, "127.0.0.1:0", self, sizeof(self), err, sizeof(err)), 0);
  assert_int_equal(ccs_transport_tcp.connect(t, root, &c, err, sizeof(err)), 0);
  say_hello(c, self);
  for (int i = 0; bad[i]; i++) {
    test_new_id(&sh->id);
    send_join(c, &sh->id, bad[i]);
  }
  test_new_id(&sh->id);
  send_join(c, &sh->id, too_long);
  test_new_id(&sh->id);
  send_join(c, &sh->id, ""); /* the one that may join */
  struct tcompletion done[8];
  static char inbox[4][65536];
  int accepted = 0;
  double end = test_now() + 20;
  while (comms_at(0) < before + 1 && test_now() < end) {
    ccs_transport_tcp.poll(t, 5, done, 8);
    while (accepted < 4 && ccs_transport_tcp.accept(t, &back, err, sizeof(err)) == 1) {
      say_hello(back, self);
      ccs_transport_tcp.recv(back, NULL, inbox[accepted++], sizeof(inbox[0]), 0, NULL);
    }
  }
  assert_int_equal(comms_at(0), before + 1);
  ccs_transport_tcp.free(t); /* its comm goes with its connection */
  for (end = test_now() + 20; comms_at(0) != before && test_now() < end;) usleep(10000);
  assert_int_equal(comms_at(0), before);
  both_tenants_served();
}

/* A key holder's first connection greets and says nothing more, as a
 * daemon's data connection does until its header comes; its second joins
 * a comm with rules that do not parse. The refusal comes on a connection
 * the key holder can take as a control one (the second, or one the daemon
 * dials), never on the first: a daemon that answered there would be read
 * as speaking out of turn on a data connection, and cut off. */
static void test_answer_not_on_a_silent_connection(void **state) {
  (void)state;
  char root[64], err[256], self[64];
  test_new_id(&sh->id);
  root_of(&sh->id, root, sizeof(root));
  struct transport *t = keyholder();
  assert_int_equal(ccs_transport_tcp.listen(t, "127.0.0.1:0", self, sizeof(self), err, sizeof(err)), 0);
  struct tconn *silent, *joiner, *back;
  assert_int_equal(ccs_transport_tcp.connect(t, root, &silent, err, sizeof(err)), 0);
  say_hello(silent, self);
  static char inbox[3][65536];
  ccs_transport_tcp.recv(silent, NULL, inbox[0], sizeof(inbox[0]), 0, NULL);
  struct tcompletion done[8];
  int greeted = 0; /* the daemon's greeting on the silent connection: it has ours */
  for (double end = test_now() + 10; !greeted && test_now() < end;) {
    int n = ccs_transport_tcp.poll(t, 5, done, 8);
    for (int i = 0; i < n; i++) greeted |= done[i].conn == silent && !done[i].is_send;
  }
  assert_true(greeted);
  usleep(100 * 1000); /* ... and has read ours */
  ccs_transport_tcp.recv(silent, NULL, inbox[0], sizeof(inbox[0]), 0, NULL);
  assert_int_equal(ccs_transport_tcp.connect(t, root, &joiner, err, sizeof(err)), 0);
  say_hello(joiner, self);
  ccs_transport_tcp.recv(joiner, NULL, inbox[1], sizeof(inbox[1]), 0, NULL);
  send_join(joiner, &sh->id, "spiral");
  int on_silent = 0, refusals = 0, accepted = 0;
  for (double end = test_now() + 5; !refusals && test_now() < end;) {
    int n = ccs_transport_tcp.poll(t, 5, done, 8);
    while (!accepted && ccs_transport_tcp.accept(t, &back, err, sizeof(err)) == 1) {
      accepted = 1;
      say_hello(back, self);
      ccs_transport_tcp.recv(back, NULL, inbox[2], sizeof(inbox[2]), 0, NULL);
    }
    for (int i = 0; i < n; i++) {
      if (done[i].is_send || done[i].status) continue;
      char *box = done[i].conn == silent ? inbox[0] : done[i].conn == joiner ? inbox[1] : inbox[2];
      Ccs__PeerMsg *m = ccs__peer_unpack((uint8_t *)box, done[i].bytes);
      int refusal = m && m->body_case == CCS__PEER_MSG__BODY_FAIL;
      int heartbeat = m && m->body_case == CCS__PEER_MSG__BODY_HEARTBEAT; /* said on any */
      if (m) ccs__peer_msg__free_unpacked(m, NULL);
      on_silent += done[i].conn == silent && !heartbeat;
      refusals += refusal;
      ccs_transport_tcp.recv(done[i].conn, NULL, box, sizeof(inbox[0]), 0, NULL);
    }
  }
  fprintf(stderr, "# refusals %d; messages on the silent connection %d\n", refusals, on_silent);
  assert_int_equal(refusals, 1);
  assert_int_equal(on_silent, 0);
  ccs_transport_tcp.free(t);
  both_tenants_served();
}

/* --- a leaked id, another user, another daemon ------------------------------------------------- */

/* The attacker (uid 65534, on daemon 1) tries the victim's id as it is,
 * with its own uid written in, and rooted at daemon 1; each is refused. */
static int attacker(int rank, int n, void *arg) {
  setenv("CCS_SOCKET", dm[1].socket, 1);
  test_become_other_tenant();
  struct ccs__unique_id id;
  ccs_unique_id_t forged;
  ccs_comm_t *comm = NULL;
  int bad = 0;
  /* as it is */
  bad |= ccs_comm_init_rank(&comm, 2, sh->id, 1) != CCS_ERR_PERMISSION;
  snprintf(sh->text[4], sizeof(sh->text[4]), "%s", ccs_comm_last_error(NULL));
  /* with its own uid: a comm of its own at daemon 1, which the root refuses */
  memcpy(&id, sh->id.internal, sizeof(id));
  id.owner_uid = TEST_OTHER_UID;
  memcpy(forged.internal, &id, sizeof(id));
  bad |= (sh->code[5] = ccs_comm_init_rank(&comm, 2, forged, 1)) != CCS_ERR_INVALID_ARGUMENT;
  snprintf(sh->text[5], sizeof(sh->text[5]), "%s", ccs_comm_last_error(NULL));
  /* rooted at daemon 1 itself: its signature is not daemon 1's */
  struct ccs__unique_id own;
  ccs_unique_id_t mine;
  if (ccs_get_unique_id(&mine) != CCS_OK) return 1;
  memcpy(&own, mine.internal, sizeof(own));
  memcpy(id.root, own.root, sizeof(id.root));
  memcpy(forged.internal, &id, sizeof(id));
  bad |= (sh->code[6] = ccs_comm_init_rank(&comm, 2, forged, 1)) != CCS_ERR_INVALID_ARGUMENT;
  snprintf(sh->text[6], sizeof(sh->text[6]), "%s", ccs_comm_last_error(NULL));
  sh->attacked = 1;
  return bad;
}

/* The victim: rank 0 on daemon 0, rank 1 on daemon 1 after the attack. */
static int victim(int rank, int n, void *arg) {
  setenv("CCS_SOCKET", dm[rank].socket, 1);
  if (rank == 1)
    for (double end = test_now() + 60; !sh->attacked && test_now() < end;) usleep(10000);
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, 2, sh->id, rank) != CCS_OK) return 1;
  int64_t v = rank + 40, out = 0;
  ccs_result_t rc = ccs_all_reduce(&v, &out, 1, CCS_INT64, CCS_SUM, comm, NULL);
  ccs_comm_destroy(comm);
  return rc == CCS_OK && out == 81 ? 0 : 2;
}

static void test_leaked_id_gets_another_user_nowhere(void **state) {
  test_spread_ranks(NULL, 0); /* each rank chooses its daemon */
  test_new_id(&sh->id); /* from daemon 0, as root */
  sh->attacked = 0;
  pid_t att = fork();
  if (att == 0) _exit(test_run_ranks(1, attacker, NULL, 60, NULL));
  int failed = test_run_ranks(2, victim, NULL, 90, NULL);
  int st;
  waitpid(att, &st, 0);
  for (int i = 4; i < 7; i++) fprintf(stderr, "# attempt %d: %s\n", i - 3, sh->text[i]);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_int_equal(failed, 0);
  assert_non_null(strstr(sh->text[4], "another user"));
  assert_non_null(strstr(sh->text[5], "not issued by the daemon"));
  assert_non_null(strstr(sh->text[6], "not issued by this daemon"));
  test_spread_ranks(dm, ND);
  both_tenants_served();
}

int main(void) {
  if (geteuid() != 0) {
    fprintf(stderr, "test_peer_trust needs root (a client switches to uid %d)\n", TEST_OTHER_UID);
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_strangers_get_nowhere, setup, teardown),
      cmocka_unit_test_setup_teardown(test_flood_is_cut_off, setup, teardown),
      cmocka_unit_test_setup_teardown(test_words_of_outsiders_change_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_peer_rules_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_other_transport_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_answer_not_on_a_silent_connection, setup, teardown),
      cmocka_unit_test_setup_teardown(test_leaked_id_gets_another_user_nowhere, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
