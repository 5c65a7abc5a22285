/* The TCP transport over loopback: messages of every size both ways (data
 * in clear with tags, and encrypted), bursts of sizes about its read-ahead,
 * receives posted before and after
 * their message arrives, order per tag, a peer that goes away (what it
 * sent first still arrives), posts checked against their registered
 * memory, addresses nobody listens on or that are names. And the trust
 * boundary: the greeting between two keys, a stranger on either end, a
 * peer that says nothing, messages tampered with or replayed (auth.h
 * directly, both ciphers), the caps on held bytes and on connections. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "auth.h"
#include "harness.h"
#include "transport.h"

static const struct transport_ops *T = &ccs_transport_tcp;

/* The parameters every test opens with: one key, encryption as asked. */
static int encrypt_data;
static struct transport_params params(uint8_t key_byte) {
  struct transport_params p = {.encrypt_data = encrypt_data, .max_conns = 64,
                               .unexpected_per_conn = 64 << 20, .unexpected_total = 256 << 20,
                               .greeting_timeout_s = 2};
  memset(p.key, key_byte, sizeof(p.key));
  return p;
}

static struct transport *open_t(uint8_t key_byte) {
  char err[256];
  struct transport_params p = params(key_byte);
  struct transport *t = T->open(&p, err, sizeof(err));
  assert_non_null(t);
  return t;
}

/* Polls both until `want` completions came; returns them in order. */
static int collect(struct transport *a, struct transport *b, struct tcompletion *out, int want) {
  int got = 0;
  double deadline = test_now() + 20;
  while (got < want && test_now() < deadline) {
    got += T->poll(a, 1, out + got, want - got);
    if (got < want) got += T->poll(b, 1, out + got, want - got);
  }
  return got;
}

/* Polls t until a connection is accepted (1), refused (-1), or 5 s pass. */
static int accept_one(struct transport *t, struct tconn **c, char *err, size_t errlen) {
  struct tcompletion none[1];
  int rc = 0;
  for (double until = test_now() + 5; rc == 0 && test_now() < until;) {
    rc = T->accept(t, c, err, errlen);
    if (rc == 0) T->poll(t, 1, none, 0);
  }
  return rc;
}

static void connect_pair(struct transport **a, struct transport **b, struct tconn **ca,
                         struct tconn **cb) {
  char err[256], bound[128];
  *a = open_t(7);
  *b = open_t(7);
  assert_int_equal(T->listen(*a, "127.0.0.1:0", bound, sizeof(bound), err, sizeof(err)), 0);
  assert_int_equal(T->connect(*b, bound, cb, err, sizeof(err)), 0);
  assert_int_equal(accept_one(*a, ca, err, sizeof(err)), 1);
}

static void test_messages_both_ways(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  static const size_t sizes[] = {0, 1, 4095, 65536, 1 << 20, (8 << 20) + 3};
  enum { N = sizeof(sizes) / sizeof(sizes[0]) };
  uint64_t seed = test_seed();
  char *out_a[N], *out_b[N], *in_a[N], *in_b[N];
  for (int i = 0; i < N; i++) {
    out_a[i] = malloc(sizes[i] + 1), out_b[i] = malloc(sizes[i] + 1);
    in_a[i] = malloc(sizes[i] + 1), in_b[i] = malloc(sizes[i] + 1);
    for (size_t k = 0; k < sizes[i]; k++) {
      out_a[i][k] = (char)test_mix(seed, (uint64_t)i * 1000003 + k);
      out_b[i][k] = (char)test_mix(seed ^ 7, (uint64_t)i * 1000003 + k);
    }
  }
  /* a's receives posted first, b's only after its messages have arrived */
  for (int i = 0; i < N; i++) assert_int_equal(T->recv(ca, NULL, in_a[i], sizes[i], 100 + (uint64_t)i, in_a[i]), 0);
  for (int i = 0; i < N; i++) assert_int_equal(T->send(ca, NULL, out_a[i], sizes[i], 200 + (uint64_t)i, out_a[i]), 0);
  for (int i = N - 1; i >= 0; i--) /* in reverse: tags, not order, match */
    assert_int_equal(T->send(cb, NULL, out_b[i], sizes[i], 100 + (uint64_t)i, out_b[i]), 0);
  struct tcompletion done[4 * N];
  int got = collect(a, b, done, 2 * N + N); /* a's sends, b's sends, a's receives */
  assert_int_equal(got, 3 * N);
  for (int i = 0; i < N; i++) assert_int_equal(T->recv(cb, NULL, in_b[i], sizes[i], 200 + (uint64_t)i, in_b[i]), 0);
  got = collect(a, b, done, N);
  assert_int_equal(got, N);
  for (int i = 0; i < N; i++) {
    assert_memory_equal(in_a[i], out_b[i], sizes[i]);
    assert_memory_equal(in_b[i], out_a[i], sizes[i]);
  }
  for (int k = 0; k < N; k++) assert_int_equal(done[k].status, 0);
  /* same tag twice: first in, first matched */
  int x1 = 1, x2 = 2, r1 = 0, r2 = 0;
  T->send(cb, NULL, &x1, sizeof(x1), 9, NULL);
  T->send(cb, NULL, &x2, sizeof(x2), 9, NULL);
  struct tcompletion two[4];
  assert_int_equal(collect(a, b, two, 2), 2); /* the sends; the messages wait at a */
  for (int spin = 0; spin < 50; spin++) T->poll(a, 2, two, 0); /* read, complete nothing */
  T->recv(ca, NULL, &r1, sizeof(r1), 9, NULL);
  T->recv(ca, NULL, &r2, sizeof(r2), 9, NULL);
  assert_int_equal(collect(a, b, two, 2), 2);
  assert_int_equal(r1, 1);
  assert_int_equal(r2, 2);
  /* the peer goes away: a pending receive fails, it does not hang */
  char spare[16];
  T->recv(ca, NULL, spare, sizeof(spare), 77, spare);
  T->close(cb);
  struct tcompletion one;
  assert_int_equal(collect(a, b, &one, 1), 1);
  assert_true(one.status < 0);
  assert_ptr_equal(one.user, spare);
  T->free(a);
  T->free(b);
  for (int i = 0; i < N; i++) free(out_a[i]), free(out_b[i]), free(in_a[i]), free(in_b[i]);
}

/* Many messages in one burst, of sizes about the transport's read-ahead
 * (4 KiB: a small message and those after it come in one read, larger
 * parts straight into the receive) and random ones: every header, payload
 * and tag is found wherever the reads cut the stream. Half the receives
 * are posted before, half after their messages arrived (held). */
static void test_a_burst_of_sizes(void **state) {
  (void)state;
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  static const size_t edges[] = {0, 1, 15, 16, 17, 4063, 4064, 4079, 4080, 4095, 4096, 4097,
                                 4111, 4112, 4113, 8191, 8192, 8193, 12289};
  enum { N = 400, E = sizeof(edges) / sizeof(edges[0]) };
  uint64_t seed = test_seed();
  size_t *len = calloc(N, sizeof(*len));
  char **out = calloc(N, sizeof(*out)), **in = calloc(N, sizeof(*in));
  for (int i = 0; i < N; i++) {
    len[i] = i < 2 * (int)E ? edges[i % E] : (size_t)(test_mix(seed, (uint64_t)i) % 10000);
    out[i] = malloc(len[i] + 1);
    in[i] = malloc(len[i] + 1);
    for (size_t k = 0; k < len[i]; k++) out[i][k] = (char)test_mix(seed ^ 3, (uint64_t)i << 20 | k);
  }
  for (int i = 0; i < N; i += 2) assert_int_equal(T->recv(ca, NULL, in[i], len[i], 500 + (uint64_t)i, in[i]), 0);
  for (int i = 0; i < N; i++) assert_int_equal(T->send(cb, NULL, out[i], len[i], 500 + (uint64_t)i, out[i]), 0);
  struct tcompletion *done = calloc(2 * N, sizeof(*done));
  assert_int_equal(collect(a, b, done, N + N / 2), N + N / 2); /* every send, the receives posted */
  for (int i = 1; i < N; i += 2) assert_int_equal(T->recv(ca, NULL, in[i], len[i], 500 + (uint64_t)i, in[i]), 0);
  assert_int_equal(collect(a, b, done + N + N / 2, N / 2), N / 2);
  for (int k = 0; k < N + N / 2 + N / 2; k++) {
    assert_int_equal(done[k].status, 0);
    if (done[k].is_send) continue;
    int i = (int)(done[k].tag - 500);
    assert_int_equal(done[k].bytes, len[i]);
    assert_memory_equal(in[i], out[i], len[i]);
  }
  T->free(a);
  T->free(b);
  for (int i = 0; i < N; i++) free(out[i]), free(in[i]);
  free(out), free(in), free(len), free(done);
}

/* A peer that sends and closes at once: what it sent is still received by
 * receives posted afterwards (held meanwhile: holds says so); a receive
 * nothing will match fails. */
static void test_messages_outlive_the_close(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  char msg[1000], in[1000];
  for (size_t i = 0; i < sizeof(msg); i++) msg[i] = (char)(i * 13 + 1);
  struct tcompletion done[4];
  assert_int_equal(T->send(cb, NULL, msg, sizeof(msg), 42, NULL), 0);
  assert_int_equal(collect(a, b, done, 1), 1); /* written (both greet first) */
  assert_int_equal(done[0].status, 0);
  T->free(b); /* and gone */
  int sentinel = 0;
  assert_int_equal(T->recv(ca, NULL, &sentinel, 0, 7, NULL), 0); /* fails once a sees the close */
  assert_int_equal(collect(a, a, done, 1), 1);
  assert_true(done[0].status < 0);
  assert_true(T->holds(ca));
  assert_int_equal(T->recv(ca, NULL, in, sizeof(in), 42, in), 0);
  assert_int_equal(collect(a, a, done, 1), 1);
  assert_false(T->holds(ca));
  assert_int_equal(done[0].status, 0);
  assert_int_equal(done[0].bytes, sizeof(msg));
  assert_memory_equal(in, msg, sizeof(msg));
  assert_true(T->recv(ca, NULL, in, sizeof(in), 43, in) < 0);
  T->free(a);
}

/* Polls a until its connection ca failed (a receive nothing matches). */
static void until_closed(struct transport *a, struct tconn *ca) {
  int sentinel = 0;
  struct tcompletion done[1];
  assert_int_equal(T->recv(ca, NULL, &sentinel, 0, 7, NULL), 0);
  assert_int_equal(collect(a, a, done, 1), 1);
  assert_true(done[0].status < 0);
}

/* What a connection holds is taken over (hold.c carries it to the next
 * connections) only once its peer closed it cleanly after its last
 * message: nothing while it is open; everything, in order, after a clean
 * close; nothing after a reset, where a message may have lost its end. */
static void test_held_taken_after_a_clean_close(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  static const size_t sizes[3] = {0, 1000, 300000};
  char *msg[3];
  struct tcompletion done[4];
  for (int i = 0; i < 3; i++) {
    msg[i] = malloc(sizes[i] + 1);
    for (size_t k = 0; k < sizes[i]; k++) msg[i][k] = (char)(k * 7 + (size_t)i);
    assert_int_equal(T->send(cb, NULL, msg[i], sizes[i], 50 + (uint64_t)i, NULL), 0);
  }
  assert_int_equal(collect(a, b, done, 3), 3); /* written */
  for (int spin = 0; spin < 50; spin++) T->poll(a, 2, done, 0); /* and read: held at a */
  struct test_held got = {0};
  assert_int_equal(T->take_held(ca, test_keep_held, &got), 0); /* open: nothing */
  assert_int_equal(got.n, 0);
  T->close(cb); /* a clean close: its FIN after the messages */
  until_closed(a, ca);
  assert_int_equal(T->take_held(ca, NULL, NULL), 1);
  assert_int_equal(T->take_held(ca, test_keep_held, &got), 1);
  assert_int_equal(got.n, 3);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(got.tags[i], 50 + (uint64_t)i);
    assert_int_equal(got.lens[i], sizes[i]);
    assert_memory_equal(got.data[i], msg[i], sizes[i]);
    free(got.data[i]);
    free(msg[i]);
  }
  assert_false(T->holds(ca));
  T->free(a);
  T->free(b);

  /* killed with bytes it never read: the kernel resets the connection */
  char err[256], bound[128];
  a = open_t(7);
  assert_int_equal(T->listen(a, "127.0.0.1:0", bound, sizeof(bound), err, sizeof(err)), 0);
  int ready[2];
  assert_int_equal(pipe2(ready, O_NONBLOCK), 0);
  pid_t pid = fork();
  if (pid == 0) {
    struct transport *child = open_t(7);
    struct tconn *cc;
    char one[100] = {1};
    struct tcompletion sent;
    if (T->connect(child, bound, &cc, err, sizeof(err)) || T->send(cc, NULL, one, sizeof(one), 60, NULL)) _exit(1);
    while (T->poll(child, 10, &sent, 1) == 0) {}
    if (write(ready[1], "x", 1) != 1) _exit(1);
    pause(); /* reads nothing more */
    _exit(0);
  }
  assert_int_equal(accept_one(a, &ca, err, sizeof(err)), 1);
  char x;
  while (read(ready[0], &x, 1) != 1) T->poll(a, 10, done, 0);
  for (int spin = 0; spin < 20; spin++) T->poll(a, 2, done, 0);
  char unread[4096] = {0};
  assert_int_equal(T->send(ca, NULL, unread, sizeof(unread), 61, NULL), 0);
  assert_int_equal(collect(a, a, done, 1), 1); /* in the child's socket, never read */
  usleep(50000);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  until_closed(a, ca);
  assert_true(T->holds(ca)); /* the message did arrive, */
  got.n = 0;
  assert_int_equal(T->take_held(ca, test_keep_held, &got), -1); /* but a reset says nothing of what did not */
  assert_int_equal(got.n, 0);
  close(ready[0]), close(ready[1]);
  T->free(a);
}

/* A post must lie inside the registration it names: the edges are in,
 * one byte past either is not; the registered message arrives whole. */
static void test_registered_memory(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  char err[128];
  connect_pair(&a, &b, &ca, &cb);
  char *buf = malloc(4096), *in = malloc(4096);
  for (int i = 0; i < 4096; i++) buf[i] = (char)(i * 7 + 3);
  struct tmem *m = T->mem_register(b, buf + 1024, 2048, err, sizeof(err));
  struct tmem *mi = T->mem_register(a, in, 4096, err, sizeof(err));
  assert_non_null(m);
  assert_non_null(mi);
  assert_int_equal(T->send(cb, m, buf + 1023, 16, 5, NULL), -EFAULT); /* before it */
  assert_int_equal(T->send(cb, m, buf + 3072 - 15, 16, 5, NULL), -EFAULT); /* past its end */
  assert_int_equal(T->send(cb, m, buf + 3072, 0, 5, NULL), 0); /* empty, at its end */
  assert_int_equal(T->send(cb, m, buf + 1024, 2048, 6, NULL), 0); /* all of it */
  assert_int_equal(T->recv(ca, mi, in + 4090, 16, 6, NULL), -EFAULT);
  assert_int_equal(T->recv(ca, mi, in, 0, 5, NULL), 0);
  assert_int_equal(T->recv(ca, mi, in, 2048, 6, in), 0);
  struct tcompletion done[8];
  int got = collect(a, b, done, 4), ok = 0;
  assert_int_equal(got, 4);
  for (int i = 0; i < got; i++) ok += done[i].status == 0;
  assert_int_equal(ok, 4);
  assert_memory_equal(in, buf + 1024, 2048);
  T->mem_deregister(m);
  T->mem_deregister(mi);
  T->free(a);
  T->free(b);
  free(buf);
  free(in);
}

static void test_bad_addresses(void **state) {
  char err[256], bound[128];
  struct transport *t = open_t(7);
  struct tconn *c;
  /* a port nobody listens on: our own listener, closed again; the connect
   * returns at once and its posts fail */
  struct transport *l = open_t(7);
  assert_int_equal(T->listen(l, "127.0.0.1:0", bound, sizeof(bound), err, sizeof(err)), 0);
  T->free(l);
  assert_int_equal(T->connect(t, bound, &c, err, sizeof(err)), 0);
  int x = 0;
  assert_int_equal(T->send(c, NULL, &x, sizeof(x), 1, NULL), 0);
  struct tcompletion done[2];
  assert_int_equal(collect(t, t, done, 1), 1);
  assert_int_equal(done[0].status, -ECONNREFUSED);
  /* names are never resolved here: only numeric addresses are dialled */
  assert_int_equal(T->connect(t, "localhost:7000", &c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "not a numeric"));
  assert_int_equal(T->connect(t, "no-port-here", &c, err, sizeof(err)), -1);
  assert_int_equal(T->connect(t, "127.0.0.1:99999", &c, err, sizeof(err)), -1);
  assert_int_equal(T->listen(t, "127.0.0.1:notaport", bound, sizeof(bound), err, sizeof(err)), -1);
  T->free(t);
}

/* Two daemons with different keys: the acceptor refuses the connector's
 * proof (-EACCES); neither side's posts ever move. */
static void test_wrong_key(void **state) {
  char err[256], bound[128];
  struct transport *a = open_t(7), *b = open_t(8);
  struct tconn *ca, *cb;
  assert_int_equal(T->listen(a, "127.0.0.1:0", bound, sizeof(bound), err, sizeof(err)), 0);
  assert_int_equal(T->connect(b, bound, &cb, err, sizeof(err)), 0);
  assert_int_equal(accept_one(a, &ca, err, sizeof(err)), 1);
  char in[8], out[8] = "secret!";
  assert_int_equal(T->recv(ca, NULL, in, sizeof(in), 0, NULL), 0);
  assert_int_equal(T->send(cb, NULL, out, sizeof(out), 0, NULL), 0);
  struct tcompletion done[4];
  assert_int_equal(collect(a, b, done, 2), 2);
  for (int i = 0; i < 2; i++) {
    assert_true(done[i].status < 0);
    if (done[i].conn == ca) assert_int_equal(done[i].status, -EACCES);
  }
  T->free(a);
  T->free(b);
}

static int raw_listener(struct sockaddr_in *sa) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  socklen_t len = sizeof(*sa);
  memset(sa, 0, sizeof(*sa));
  sa->sin_family = AF_INET;
  sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr *)sa, sizeof(*sa)), 0);
  assert_int_equal(listen(fd, 4), 0);
  getsockname(fd, (struct sockaddr *)sa, &len);
  return fd;
}

/* Connecting to something that is not a daemon: a server that says
 * something else gets -EPROTO; one that says nothing gets nothing from us
 * (not a byte) and the connect fails after the greeting's deadline. */
static void test_strangers_on_the_line(void **state) {
  char err[256], addr[64];
  struct sockaddr_in sa;
  int lfd = raw_listener(&sa);
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", ntohs(sa.sin_port));
  struct transport *t = open_t(7);
  struct tconn *c;
  int x = 42;
  struct tcompletion done[2];
  /* a server that greets with something else */
  assert_int_equal(T->connect(t, addr, &c, err, sizeof(err)), 0);
  assert_int_equal(T->send(c, NULL, &x, sizeof(x), 0, NULL), 0);
  int s1 = accept(lfd, NULL, NULL);
  char junk[64];
  memset(junk, 'J', sizeof(junk));
  assert_int_equal(write(s1, junk, sizeof(junk)), (ssize_t)sizeof(junk));
  assert_int_equal(collect(t, t, done, 1), 1);
  assert_int_equal(done[0].status, -EPROTO);
  close(s1);
  /* a server that says nothing: after 2 s, -ETIMEDOUT, and it heard nothing */
  assert_int_equal(T->connect(t, addr, &c, err, sizeof(err)), 0);
  assert_int_equal(T->send(c, NULL, &x, sizeof(x), 0, NULL), 0);
  int s2 = accept(lfd, NULL, NULL);
  assert_int_equal(collect(t, t, done, 1), 1);
  assert_int_equal(done[0].status, -ETIMEDOUT);
  struct pollfd p = {s2, POLLIN, 0};
  char b;
  assert_int_equal(poll(&p, 1, 100), 1);
  assert_int_equal(read(s2, &b, 1), 0); /* closed, and not one byte sent */
  close(s2);
  close(lfd);
  /* a client that is not a daemon: the acceptor reads its fixed-size
   * greeting at most, and refuses it */
  struct transport *a = open_t(7);
  char bound[128];
  assert_int_equal(T->listen(a, "127.0.0.1:0", bound, sizeof(bound), err, sizeof(err)), 0);
  struct sockaddr_in la;
  memset(&la, 0, sizeof(la));
  la.sin_family = AF_INET;
  la.sin_port = htons((uint16_t)atoi(strrchr(bound, ':') + 1));
  la.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int s3 = socket(AF_INET, SOCK_STREAM, 0);
  assert_int_equal(connect(s3, (struct sockaddr *)&la, sizeof(la)), 0);
  char flood[4096];
  memset(flood, 0xff, sizeof(flood));
  assert_int_equal(write(s3, flood, sizeof(flood)), (ssize_t)sizeof(flood));
  struct tconn *ca;
  assert_int_equal(accept_one(a, &ca, err, sizeof(err)), 1);
  assert_int_equal(T->recv(ca, NULL, junk, sizeof(junk), 0, NULL), 0);
  assert_int_equal(collect(a, a, done, 1), 1);
  assert_int_equal(done[0].status, -EPROTO);
  close(s3);
  T->free(a);
  T->free(t);
}

/* The greeting and message tags, in memory: both ciphers, both modes; a
 * bit flipped anywhere, a message replayed or skipped, fails. */
static void greet(struct ccs_auth *c, struct ccs_auth *a, const struct transport_params *pc,
                  const struct transport_params *pa) {
  uint8_t out_c[CCS_AUTH_MSG_MAX], out_a[CCS_AUTH_MSG_MAX];
  size_t lc, la, wc, wa;
  ccs_auth_start(c, pc, 1, out_c, &lc, &wc);
  ccs_auth_start(a, pa, 0, out_a, &la, &wa);
  assert_int_equal(lc, 0);
  assert_int_equal(ccs_auth_step(c, out_a, la, out_c, &lc, &wc), 0);
  assert_int_equal(ccs_auth_step(a, out_c, lc, out_a, &la, &wa), 1);
  assert_int_equal(ccs_auth_step(c, out_a, la, out_c, &lc, &wc), 1);
}

static void test_message_tags(void **state) {
  struct transport_params p = params(7);
  for (int aes = 0; aes < 2; aes++)
    for (int enc = 0; enc < 2; enc++) {
      struct ccs_auth c, a;
      greet(&c, &a, &p, &p);
      c.aes = a.aes = aes && crypto_aead_aes256gcm_is_available();
      static const size_t sizes[] = {0, 1, 15, 16, 17, 4096, 1 << 20};
      for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t n = sizes[i];
        uint8_t hdr[16] = {1, 2, 3}, tag[CCS_AUTH_TAG];
        uint8_t *msg = malloc(n + 1), *wire = malloc(n + 1), *ct = enc ? malloc(n + 1) : NULL;
        for (size_t k = 0; k < n; k++) msg[k] = (uint8_t)test_mix(i, k);
        ccs_auth_seal(&c, hdr, msg, n, ct, tag);
        memcpy(wire, enc ? ct : msg, n);
        if (enc && n >= 16) assert_true(memcmp(wire, msg, n) != 0); /* not in clear */
        /* altered: one payload bit, a header bit, a tag bit (a failed
         * open may scribble on the buffer: the wire copy is restored) */
        struct ccs_auth a2 = a;
        if (n) {
          wire[n / 2] ^= 4;
          assert_int_equal(ccs_auth_open(&a2, hdr, wire, n, enc, tag), -1);
          memcpy(wire, enc ? ct : msg, n);
        }
        a2 = a;
        hdr[9] ^= 1;
        assert_int_equal(ccs_auth_open(&a2, hdr, wire, n, enc, tag), -1);
        hdr[9] ^= 1;
        memcpy(wire, enc ? ct : msg, n);
        a2 = a;
        tag[0] ^= 1;
        assert_int_equal(ccs_auth_open(&a2, hdr, wire, n, enc, tag), -1);
        tag[0] ^= 1;
        memcpy(wire, enc ? ct : msg, n);
        /* the real one opens, in place */
        assert_int_equal(ccs_auth_open(&a, hdr, wire, n, enc, tag), 0);
        assert_memory_equal(wire, msg, n);
        /* replayed: the counter moved on */
        memcpy(wire, enc ? ct : msg, n);
        a2 = a;
        assert_int_equal(ccs_auth_open(&a2, hdr, wire, n, enc, tag), -1);
        free(msg), free(wire), free(ct);
      }
      /* skipped: message 2 opened where message 1 is due */
      uint8_t hdr[16] = {0}, t1[CCS_AUTH_TAG], t2[CCS_AUTH_TAG], m = 5;
      ccs_auth_seal(&c, hdr, &m, 1, NULL, t1);
      ccs_auth_seal(&c, hdr, &m, 1, NULL, t2);
      assert_int_equal(ccs_auth_open(&a, hdr, &m, 1, 0, t2), -1);
      ccs_auth_wipe(&c);
      ccs_auth_wipe(&a);
    }
  /* a connector with another key: its proof is refused */
  struct transport_params other = params(9);
  struct ccs_auth c, a;
  uint8_t out_c[CCS_AUTH_MSG_MAX], out_a[CCS_AUTH_MSG_MAX];
  size_t lc, la, wc, wa;
  ccs_auth_start(&c, &other, 1, out_c, &lc, &wc);
  ccs_auth_start(&a, &p, 0, out_a, &la, &wa);
  assert_int_equal(ccs_auth_step(&c, out_a, la, out_c, &lc, &wc), 0);
  assert_int_equal(ccs_auth_step(&a, out_c, lc, out_a, &la, &wa), -EACCES);
  /* a reflected greeting (the acceptor's own words back) is no proof */
  ccs_auth_start(&a, &p, 0, out_a, &la, &wa);
  uint8_t refl[CCS_AUTH_MSG_MAX] = {0};
  memcpy(refl, out_a, la);
  assert_int_equal(ccs_auth_step(&a, refl, wa, out_a, &la, &wa), -EACCES);
}

/* More held than peer_unexpected_bytes: the connection is closed
 * (-ENOBUFS) instead of the daemon holding it. */
static void test_held_bytes_capped(void **state) {
  char err[256], bound[128];
  struct transport_params pa = params(7), pb = params(7);
  pa.unexpected_per_conn = 1 << 20;
  struct transport *a = T->open(&pa, err, sizeof(err)), *b = T->open(&pb, err, sizeof(err));
  struct tconn *ca, *cb;
  assert_int_equal(T->listen(a, "127.0.0.1:0", bound, sizeof(bound), err, sizeof(err)), 0);
  assert_int_equal(T->connect(b, bound, &cb, err, sizeof(err)), 0);
  assert_int_equal(accept_one(a, &ca, err, sizeof(err)), 1);
  static char chunk[300 << 10];
  for (int i = 0; i < 8; i++) /* 2.4 MiB nobody posted a receive for */
    assert_int_equal(T->send(cb, NULL, chunk, sizeof(chunk), 1000 + (uint64_t)i, NULL), 0);
  char sink[4];
  assert_int_equal(T->recv(ca, NULL, sink, sizeof(sink), 5, sink), 0);
  struct tcompletion done[16];
  int got = 0, failed = 0;
  for (double until = test_now() + 10; !failed && test_now() < until;) {
    int n = T->poll(a, 1, done, 16);
    for (int i = 0; i < n; i++) failed |= done[i].user == sink && done[i].status == -ENOBUFS;
    got += T->poll(b, 1, done, 16);
  }
  assert_true(failed);
  T->free(a);
  T->free(b);
  /* empty messages count their headers: 64 KiB holds fewer than 5000 */
  pa.unexpected_per_conn = 64 << 10;
  a = T->open(&pa, err, sizeof(err)), b = T->open(&pb, err, sizeof(err));
  assert_int_equal(T->listen(a, "127.0.0.1:0", bound, sizeof(bound), err, sizeof(err)), 0);
  assert_int_equal(T->connect(b, bound, &cb, err, sizeof(err)), 0);
  assert_int_equal(accept_one(a, &ca, err, sizeof(err)), 1);
  for (int i = 0; i < 5000; i++) assert_int_equal(T->send(cb, NULL, chunk, 0, 1000 + (uint64_t)i, NULL), 0);
  assert_int_equal(T->recv(ca, NULL, sink, sizeof(sink), 5, sink), 0);
  failed = 0;
  for (double until = test_now() + 10; !failed && test_now() < until;) {
    int n = T->poll(a, 1, done, 16);
    for (int i = 0; i < n; i++) failed |= done[i].user == sink && done[i].status == -ENOBUFS;
    T->poll(b, 1, done, 16);
  }
  assert_true(failed);
  T->free(a);
  T->free(b);
}

/* peer_max_connections: the next connection is refused at the door. */
static void test_connection_cap(void **state) {
  char err[256], bound[128];
  struct transport_params pa = params(7);
  pa.max_conns = 1;
  struct transport *a = T->open(&pa, err, sizeof(err)), *b = open_t(7);
  struct tconn *c1, *c2, *ca;
  assert_int_equal(T->listen(a, "127.0.0.1:0", bound, sizeof(bound), err, sizeof(err)), 0);
  assert_int_equal(T->connect(b, bound, &c1, err, sizeof(err)), 0);
  assert_int_equal(accept_one(a, &ca, err, sizeof(err)), 1);
  assert_int_equal(T->connect(b, bound, &c2, err, sizeof(err)), 0);
  err[0] = 0;
  assert_int_equal(accept_one(a, &ca, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "peer_max_connections"));
  T->free(a);
  T->free(b);
}

/* A listener out of file descriptors (a low RLIMIT_NOFILE, in a child):
 * it refuses what it cannot hold and says why, and does not spin. */
static void test_descriptor_exhaustion(void **state) {
  int port_pipe[2];
  assert_int_equal(pipe(port_pipe), 0);
  pid_t pid = fork();
  if (pid == 0) {
    char err[256], bound[128];
    struct transport *t = open_t(7);
    if (T->listen(t, "127.0.0.1:0", bound, sizeof(bound), err, sizeof(err))) _exit(2);
    int open_fds = 0;
    for (int fd = 0; fd < 1024; fd++) open_fds += fcntl(fd, F_GETFD) >= 0;
    struct rlimit low;
    getrlimit(RLIMIT_NOFILE, &low);
    low.rlim_cur = (rlim_t)open_fds + 6; /* room for a few connections */
    setrlimit(RLIMIT_NOFILE, &low);
    if (write(port_pipe[1], bound, sizeof(bound)) != (ssize_t)sizeof(bound)) _exit(3);
    int accepted = 0, refused = 0;
    struct tcompletion done[16];
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    double t0 = test_now();
    while (test_now() - t0 < 3) {
      struct tconn *c;
      int rc = T->accept(t, &c, err, sizeof(err));
      accepted += rc == 1;
      refused += rc < 0 && strstr(err, "file descriptors") != NULL;
      T->poll(t, 50, done, 16);
    }
    getrusage(RUSAGE_SELF, &r1);
    double cpu = (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) +
                 (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec + r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) / 1e6;
    fprintf(stderr, "# out of descriptors: %d accepted, %d refused, CPU %.2f s in 3 s\n", accepted, refused, cpu);
    _exit(accepted > 0 && refused > 0 && cpu < 1.5 ? 0 : 1);
  }
  char bound[128];
  assert_int_equal(read(port_pipe[0], bound, sizeof(bound)), (ssize_t)sizeof(bound));
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  sa.sin_port = htons((uint16_t)atoi(strrchr(bound, ':') + 1));
  int fds[40];
  for (int i = 0; i < 40; i++) {
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)), 0);
  }
  int st;
  waitpid(pid, &st, 0);
  for (int i = 0; i < 40; i++) close(fds[i]);
  close(port_pipe[0]);
  close(port_pipe[1]);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static int with_encryption(void **state) {
  encrypt_data = 1;
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_messages_both_ways),
      cmocka_unit_test(test_a_burst_of_sizes),
      cmocka_unit_test(test_messages_outlive_the_close),
      cmocka_unit_test(test_held_taken_after_a_clean_close),
      cmocka_unit_test(test_registered_memory),
      cmocka_unit_test(test_bad_addresses),
      cmocka_unit_test(test_wrong_key),
      cmocka_unit_test(test_strangers_on_the_line),
      cmocka_unit_test(test_message_tags),
      cmocka_unit_test(test_held_bytes_capped),
      cmocka_unit_test(test_connection_cap),
      cmocka_unit_test(test_descriptor_exhaustion),
      /* everything again with the data encrypted too */
      cmocka_unit_test_setup(test_messages_both_ways, with_encryption),
      cmocka_unit_test_setup(test_a_burst_of_sizes, with_encryption),
      cmocka_unit_test_setup(test_messages_outlive_the_close, with_encryption),
      cmocka_unit_test_setup(test_held_taken_after_a_clean_close, with_encryption),
      cmocka_unit_test_setup(test_registered_memory, with_encryption),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
