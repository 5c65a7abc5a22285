/* The verbs transport over the emulated NIC (tests/verbs_emu): registered
 * messages of every size both ways, by RDMA when the receive is posted
 * first, eager over TCP when the sender would otherwise wait, by SEND when
 * small; order per tag, whichever way a tag's messages go; a receive too
 * small; messages held for receives posted after the
 * sender closed; a peer that goes away; a port that goes down; and the
 * choice of port and GID, with what the daemon is told when none will do. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "transport.h"
#include "verbs_port.h"

static const struct transport_ops *T = &ccs_transport_ib;

/* tests/rdma/run.sh points CCS_TEST_IB_LIBRARY at a real libibverbs: the
 * tests that drive the emulated NIC itself run on the emulation only. */
static const char *library(void) {
  const char *lib = getenv("CCS_TEST_IB_LIBRARY");
  return lib && *lib ? lib : CCS_VERBS_EMU_PATH;
}
static int emulated(void) { return !strcmp(library(), CCS_VERBS_EMU_PATH); }

static struct transport_params params(void) {
  struct transport_params p = {.max_conns = 64, .unexpected_per_conn = 64 << 20,
                               .unexpected_total = 256 << 20, .greeting_timeout_s = 5,
                               .ib_library = library(), .ib_gid_index = -1};
  memset(p.key, 7, sizeof(p.key));
  return p;
}

static struct transport *open_t(void) {
  char err[256];
  struct transport_params p = params();
  struct transport *t = T->open(&p, err, sizeof(err));
  if (!t) fprintf(stderr, "open: %s\n", err);
  assert_non_null(t);
  return t;
}

static int collect(struct transport *a, struct transport *b, struct tcompletion *out, int want) {
  int got = 0;
  for (double deadline = test_now() + 20; got < want && test_now() < deadline;) {
    got += T->poll(a, 1, out + got, want - got);
    if (got < want) got += T->poll(b, 1, out + got, want - got);
  }
  return got;
}

/* b speaks wire b_wire (2: today's) */
static void connect_pair_wire(struct transport **a, struct transport **b, struct tconn **ca, struct tconn **cb,
                              unsigned b_wire) {
  char err[256], bound[128];
  *a = open_t();
  *b = open_t();
  ccs_ib_test_wire(*b, b_wire);
  assert_int_equal(T->listen(*a, "127.0.0.1:0", bound, sizeof(bound), err, sizeof(err)), 0);
  assert_int_equal(T->connect(*b, bound, cb, err, sizeof(err)), 0);
  int rc = 0;
  struct tcompletion none[1];
  for (double until = test_now() + 5; rc == 0 && test_now() < until;) {
    rc = T->accept(*a, ca, err, sizeof(err));
    if (rc == 0) T->poll(*a, 1, none, 0), T->poll(*b, 1, none, 0);
  }
  assert_int_equal(rc, 1);
}

static void connect_pair(struct transport **a, struct transport **b, struct tconn **ca, struct tconn **cb) {
  connect_pair_wire(a, b, ca, cb, 2);
}

/* Polls both until both queue pairs are up: small messages go by SEND from then on. */
static void queue_pairs_up(struct transport *a, struct transport *b, struct tconn *ca, struct tconn *cb) {
  struct tcompletion none[1];
  for (double until = test_now() + 10; test_now() < until;) {
    if (ccs_ib_test_credits(ca) >= 0 && ccs_ib_test_credits(cb) >= 0) return;
    T->poll(a, 1, none, 0), T->poll(b, 1, none, 0);
  }
  fail_msg("the queue pairs did not come up");
}

/* Polls both until c's peer has given back every credit. */
static void credits_back(struct transport *a, struct transport *b, struct tconn *c) {
  struct tcompletion none[1];
  for (double until = test_now() + 10; ccs_ib_test_credits(c) != 32 && test_now() < until;)
    T->poll(a, 1, none, 0), T->poll(b, 1, none, 0);
  assert_int_equal(ccs_ib_test_credits(c), 32);
}

static void fill(char *p, size_t n, uint64_t seed) {
  for (size_t k = 0; k < n; k++) p[k] = (char)test_mix(seed, k);
}

/* The end of a test with one buffer each way: registrations, then transports. */
static void free_pair(struct transport *a, struct transport *b, struct tmem *mo, struct tmem *mi, void *out,
                      void *in) {
  T->mem_deregister(mo);
  T->mem_deregister(mi);
  T->free(a);
  T->free(b);
  free(out);
  free(in);
}

/* Every size, each twice: once with the receive posted first (answered:
 * RDMA), once with the send first and the receive 50 ms later (the send
 * goes eager, the bytes are held). Both ways at once. */
static void test_sizes_both_ways(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  queue_pairs_up(a, b, ca, cb);
  static const size_t sizes[] = {0, 1, 4097, (16 << 10) - 1, 16 << 10, 1 << 20, (8 << 20) + 3};
  enum { N = sizeof(sizes) / sizeof(sizes[0]) };
  uint64_t seed = test_seed();
  uint64_t rdma_first = 0, eager_first = 0, sent_first = 0;
  for (int recv_first = 1; recv_first >= 0; recv_first--) {
    char *out_a[N], *out_b[N], *in_a[N], *in_b[N];
    struct tmem *m_oa[N], *m_ob[N], *m_ia[N], *m_ib[N];
    char err[256];
    for (int i = 0; i < N; i++) {
      size_t n = sizes[i] + 1;
      out_a[i] = malloc(n), out_b[i] = malloc(n), in_a[i] = calloc(1, n), in_b[i] = calloc(1, n);
      fill(out_a[i], sizes[i], seed + (uint64_t)i);
      fill(out_b[i], sizes[i], ~seed + (uint64_t)i);
      assert_non_null(m_oa[i] = T->mem_register(a, out_a[i], sizes[i], err, sizeof(err)));
      assert_non_null(m_ia[i] = T->mem_register(a, in_a[i], sizes[i], err, sizeof(err)));
      assert_non_null(m_ob[i] = T->mem_register(b, out_b[i], sizes[i], err, sizeof(err)));
      assert_non_null(m_ib[i] = T->mem_register(b, in_b[i], sizes[i], err, sizeof(err)));
    }
    struct tcompletion done[4 * N];
    if (recv_first) {
      for (int i = 0; i < N; i++) {
        assert_int_equal(T->recv(ca, m_ia[i], in_a[i], sizes[i], 100 + (uint64_t)i, in_a[i]), 0);
        assert_int_equal(T->recv(cb, m_ib[i], in_b[i], sizes[i], 200 + (uint64_t)i, in_b[i]), 0);
      }
      for (int spin = 0; spin < 20; spin++) collect(a, b, done, 0), T->poll(a, 1, done, 0), T->poll(b, 1, done, 0);
    }
    for (int i = N - 1; i >= 0; i--) { /* in reverse: tags, not order, match */
      assert_int_equal(T->send(cb, m_ob[i], out_b[i], sizes[i], 100 + (uint64_t)i, out_b[i]), 0);
      assert_int_equal(T->send(ca, m_oa[i], out_a[i], sizes[i], 200 + (uint64_t)i, out_a[i]), 0);
    }
    if (!recv_first) {
      assert_int_equal(collect(a, b, done, 2 * N), 2 * N); /* the sends complete on their own */
      for (int i = 0; i < 2 * N; i++) assert_true(done[i].is_send && done[i].status == 0);
      for (int i = 0; i < N; i++) {
        assert_int_equal(T->recv(ca, m_ia[i], in_a[i], sizes[i], 100 + (uint64_t)i, in_a[i]), 0);
        assert_int_equal(T->recv(cb, m_ib[i], in_b[i], sizes[i], 200 + (uint64_t)i, in_b[i]), 0);
      }
      assert_int_equal(collect(a, b, done, 2 * N), 2 * N);
    } else {
      assert_int_equal(collect(a, b, done, 4 * N), 4 * N);
    }
    for (int i = 0; i < (recv_first ? 4 : 2) * N; i++) {
      assert_int_equal(done[i].status, 0);
      if (!done[i].is_send) {
        char *in = done[i].user;
        int k = 0;
        while (in != in_a[k] && in != in_b[k]) k++;
        assert_int_equal(done[i].bytes, sizes[k]);
        assert_ptr_equal(done[i].conn, in == in_a[k] ? ca : cb);
      }
    }
    /* posted first, a large message is written into its receive; sent
     * first, it waits for an answer that does not come and goes eager */
    struct transport_counters ka, kb;
    T->counters(a, &ka);
    T->counters(b, &kb);
    /* the tuner's rate: the emulated port's 4X EDR less the headers */
    assert_true(T->link_rate(a) == 0.9 * 4 * 25.78125e9 / 8);
    uint64_t large = 0, small = 0, tiny = 0;
    for (int i = 0; i < N; i++) sizes[i] >= (16 << 10) ? (large++) : (small++), tiny += sizes[i] < (16 << 10);
    /* the queue pairs are up: the messages of less than 16 KiB went by SEND */
    uint64_t sent = ka.send_messages + kb.send_messages;
    assert_int_equal(sent - sent_first, 2 * tiny);
    if (recv_first) {
      /* each message went one way; a large one whose answer came later
       * than CTS_WAIT_S (a loaded machine) went eager after all */
      rdma_first = ka.rdma_messages + kb.rdma_messages, eager_first = ka.eager_messages + kb.eager_messages;
      sent_first = sent;
      assert_int_equal(rdma_first + eager_first + sent_first, 2 * N);
      assert_true(rdma_first <= 2 * large && eager_first >= 2 * (small - tiny));
      assert_true(rdma_first > 0 || large == 0);
    } else { /* (the counters go on from the round before) */
      assert_int_equal(ka.rdma_messages + kb.rdma_messages, rdma_first);
      assert_int_equal(ka.eager_messages + kb.eager_messages, eager_first + 2 * (N - tiny));
    }
    for (int i = 0; i < N; i++) {
      assert_memory_equal(in_a[i], out_b[i], sizes[i]);
      assert_memory_equal(in_b[i], out_a[i], sizes[i]);
      T->mem_deregister(m_oa[i]), T->mem_deregister(m_ob[i]), T->mem_deregister(m_ia[i]), T->mem_deregister(m_ib[i]);
      free(out_a[i]), free(out_b[i]), free(in_a[i]), free(in_b[i]);
    }
  }
  T->free(a);
  T->free(b);
}

/* One tag, three messages: first sent, first received, whichever way each
 * goes; a receive too small fails (-EMSGSIZE) and the next one still gets
 * the next message; outside its registration a post is refused. */
static void test_order_and_sizes_that_differ(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  enum { BIG = 1 << 20 };
  char *out = malloc(3 * BIG), *in = calloc(1, 3 * BIG), err[256];
  fill(out, 3 * BIG, test_seed());
  struct tmem *mo = T->mem_register(b, out, 3 * BIG, err, sizeof(err));
  struct tmem *mi = T->mem_register(a, in, 3 * BIG, err, sizeof(err));
  assert_int_equal(T->send(cb, mo, out + 3 * BIG - 10, 11, 5, NULL), -EFAULT);
  assert_int_equal(T->recv(ca, mi, in - 1, 10, 5, NULL), -EFAULT);
  struct tcompletion done[8];
  /* the first receive waits for its message; the other two come after the sends */
  assert_int_equal(T->recv(ca, mi, in, BIG, 9, in), 0);
  for (int i = 0; i < 3; i++) assert_int_equal(T->send(cb, mo, out + (size_t)i * BIG, BIG, 9, NULL), 0);
  assert_int_equal(collect(a, b, done, 4), 4);
  assert_int_equal(T->recv(ca, mi, in + BIG, BIG - 1, 9, in + BIG), 0); /* too small */
  assert_int_equal(T->recv(ca, mi, in + 2 * BIG, BIG, 9, in + 2 * BIG), 0);
  assert_int_equal(collect(a, b, done, 2), 2);
  for (int i = 0; i < 2; i++) {
    if (done[i].user == in + BIG) assert_int_equal(done[i].status, -EMSGSIZE);
    else assert_int_equal(done[i].status, 0);
  }
  assert_memory_equal(in, out, BIG);
  assert_memory_equal(in + 2 * BIG, out + 2 * BIG, BIG);
  /* a receive too small for a message that waits for its answer */
  assert_int_equal(T->recv(ca, mi, in, BIG / 2, 11, in), 0);
  assert_int_equal(T->send(cb, mo, out, BIG, 11, NULL), 0);
  assert_int_equal(T->send(cb, mo, out + BIG, BIG, 12, NULL), 0);
  assert_int_equal(T->recv(ca, mi, in + BIG, BIG, 12, in + BIG), 0);
  assert_int_equal(collect(a, b, done, 4), 4);
  for (int i = 0; i < 4; i++)
    assert_int_equal(done[i].status, done[i].user == in ? -EMSGSIZE : 0);
  assert_memory_equal(in + BIG, out + BIG, BIG);
  free_pair(a, b, mo, mi, out, in);
}

/* One tag, messages going every way at once: by SEND (less than 16 KiB,
 * more than the credits: the later ones wait for credits), and by RDMA or
 * eager over TCP (70000 bytes: RDMA when the receive was posted in time),
 * in batches so that the receiver gives its credits back; a receive posted
 * first for a third of them, one of them too small. Each receive gets the
 * message sent in its turn, whichever way the messages went. */
static void test_one_tag_every_way(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  static const size_t kinds[] = {1, 0, 5000, 8192, 12000, 70000};
  enum { N = 240, K = sizeof(kinds) / sizeof(kinds[0]), SMALL_ONE = 3 };
  size_t off[N + 1] = {0};
  for (int i = 0; i < N; i++) off[i + 1] = off[i] + kinds[i % K];
  char *out = malloc(off[N]), *in = calloc(1, off[N]), err[256];
  fill(out, off[N], test_seed());
  struct tmem *mo = T->mem_register(b, out, off[N], err, sizeof(err));
  struct tmem *mi = T->mem_register(a, in, off[N], err, sizeof(err));
  assert_non_null(mo);
  assert_non_null(mi);
  static struct tcompletion done[2 * N];
  int got = 0;
  queue_pairs_up(a, b, ca, cb);
  for (int i = 0; i < N / 3; i++) {
    size_t len = kinds[i % K] - (i == SMALL_ONE);
    assert_int_equal(T->recv(ca, mi, in + off[i], len, 7, (void *)(uintptr_t)(i + 1)), 0);
  }
  for (int i = 0; i < N; i++) {
    assert_int_equal(T->send(cb, mo, out + off[i], kinds[i % K], 7, NULL), 0);
    if (i % 12 == 11)
      for (int spin = 0; spin < 4; spin++) {
        got += T->poll(a, 1, done + got, 2 * N - got);
        got += T->poll(b, 1, done + got, 2 * N - got);
      }
  }
  for (int i = N / 3; i < N; i++)
    assert_int_equal(T->recv(ca, mi, in + off[i], kinds[i % K], 7, (void *)(uintptr_t)(i + 1)), 0);
  got += collect(a, b, done + got, 2 * N - got);
  assert_int_equal(got, 2 * N);
  for (int i = 0; i < got; i++) {
    if (done[i].is_send) {
      assert_int_equal(done[i].status, 0);
      continue;
    }
    int k = (int)(uintptr_t)done[i].user - 1;
    assert_int_equal(done[i].status, k == SMALL_ONE ? -EMSGSIZE : 0);
    if (k != SMALL_ONE) {
      assert_int_equal(done[i].bytes, kinds[k % K]);
      assert_memory_equal(in + off[k], out + off[k], kinds[k % K]);
    }
  }
  struct transport_counters kb;
  T->counters(b, &kb);
  assert_int_equal(kb.send_messages, N - N / K); /* all but the 70000-byte ones */
  assert_int_equal(kb.rdma_messages + kb.eager_messages, N / K);
  free_pair(a, b, mo, mi, out, in);
}

/* More large messages than answers a connection has out (64): the last
 * ones wait for answers while the first are written (1 MiB each), and the
 * sender, away for longer than it waits for an answer, sends the bytes of
 * those still unanswered over TCP after all. Every message lands in its
 * receive, whichever way it went. */
static void test_answers_run_out(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  enum { N = 72, FIRST = 64, BIG = 1 << 20, LEN = 20000 };
  size_t total = (size_t)FIRST * BIG + (size_t)(N - FIRST) * LEN, off[N + 1] = {0};
  for (int i = 0; i < N; i++) off[i + 1] = off[i] + (i < FIRST ? BIG : LEN);
  char *out = malloc(total), *in = calloc(1, total), err[256];
  fill(out, total, test_seed());
  struct tmem *mo = T->mem_register(b, out, total, err, sizeof(err));
  struct tmem *mi = T->mem_register(a, in, total, err, sizeof(err));
  static struct tcompletion done[2 * N];
  queue_pairs_up(a, b, ca, cb);
  for (int i = 0; i < N; i++)
    assert_int_equal(T->recv(ca, mi, in + off[i], off[i + 1] - off[i], 100 + (uint64_t)i, NULL), 0);
  for (int i = 0; i < N; i++)
    assert_int_equal(T->send(cb, mo, out + off[i], off[i + 1] - off[i], 100 + (uint64_t)i, NULL), 0);
  int got = 0; /* a answers 64, b writes what was answered in time */
  for (int spin = 0; spin < 10; spin++) {
    got += T->poll(a, 1, done + got, 2 * N - got);
    got += T->poll(b, 0, done + got, 2 * N - got);
  }
  usleep(30000);
  got += collect(a, b, done + got, 2 * N - got);
  assert_int_equal(got, 2 * N);
  for (int i = 0; i < got; i++) assert_int_equal(done[i].status, 0);
  assert_memory_equal(in, out, total);
  struct transport_counters kb;
  T->counters(b, &kb);
  assert_int_equal(kb.rdma_messages + kb.eager_messages, N);
  free_pair(a, b, mo, mi, out, in);
}

/* Daemons from before (a rolling upgrade): wire 0 takes no SENDs, so
 * small messages go over TCP both ways; wire 1 takes SENDs of 8 KiB at
 * most, so both ends send those by SEND and the larger ones (12000
 * bytes) over TCP. */
static void test_older_peer(void **state) {
  for (unsigned wire = 0; wire <= 1; wire++) {
    struct transport *a, *b;
    struct tconn *ca, *cb;
    connect_pair_wire(&a, &b, &ca, &cb, wire);
    enum { N = 40, SMALL = 8192, LARGER = 12000, BYTES = N / 2 * (SMALL + LARGER) };
    char *out = malloc(2 * BYTES), *in = calloc(1, 2 * BYTES), err[256];
    fill(out, 2 * BYTES, test_seed());
    struct tmem *mo_a = T->mem_register(a, out, BYTES, err, sizeof(err));
    struct tmem *mo_b = T->mem_register(b, out + BYTES, BYTES, err, sizeof(err));
    struct tmem *mi_a = T->mem_register(a, in + BYTES, BYTES, err, sizeof(err));
    struct tmem *mi_b = T->mem_register(b, in, BYTES, err, sizeof(err));
    static struct tcompletion done[4 * N];
    queue_pairs_up(a, b, ca, cb);
    for (size_t i = 0, at = 0; i < N; i++) {
      size_t len = i % 2 ? LARGER : SMALL;
      assert_int_equal(T->recv(cb, mi_b, in + at, len, 9, NULL), 0);
      assert_int_equal(T->recv(ca, mi_a, in + BYTES + at, len, 9, NULL), 0);
      assert_int_equal(T->send(ca, mo_a, out + at, len, 9, NULL), 0);
      assert_int_equal(T->send(cb, mo_b, out + BYTES + at, len, 9, NULL), 0);
      at += len;
    }
    int got = collect(a, b, done, 4 * N);
    assert_int_equal(got, 4 * N);
    for (int i = 0; i < got; i++) assert_int_equal(done[i].status, 0);
    assert_memory_equal(in, out, 2 * BYTES);
    struct transport_counters ka, kb;
    T->counters(a, &ka);
    T->counters(b, &kb);
    assert_int_equal(ka.send_messages + kb.send_messages, wire ? N : 0);
    assert_int_equal(ka.eager_messages + kb.eager_messages, wire ? N : 2 * N);
    T->mem_deregister(mo_a);
    T->mem_deregister(mo_b);
    free_pair(a, b, mi_a, mi_b, out, in);
  }
}

/* Far more small messages at once than the sender has credits (32), none
 * of them awaited yet: the rest wait for credits, which come back as the
 * receiver takes what came (held: it waits for no receive), and every
 * one goes by SEND. A large one sent after them, its receive posted, is
 * answered once they went, however long that takes: it goes by RDMA, not
 * over TCP after its wait for an answer. Then, every credit back, the receiver goes away while
 * sends wait for credits: each send completes, those beyond the credits
 * with an error. */
static void test_credits_run_out(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  enum { N = 296, LEN = 3001, BIG = 70000 }; /* (credits come back 8 at a time) */
  size_t bytes = (size_t)N * LEN + BIG;
  char *out = malloc(bytes), *in = calloc(1, bytes), err[256];
  fill(out, bytes, test_seed());
  struct tmem *mo = T->mem_register(b, out, bytes, err, sizeof(err));
  struct tmem *mi = T->mem_register(a, in, bytes, err, sizeof(err));
  static struct tcompletion done[2 * N];
  queue_pairs_up(a, b, ca, cb);
  char *big_out = out + (size_t)N * LEN, *big_in = in + (size_t)N * LEN;
  assert_int_equal(T->recv(ca, mi, big_in, BIG, 900, NULL), 0);
  for (int i = 0; i < N; i++)
    assert_int_equal(T->send(cb, mo, out + (size_t)i * LEN, LEN, 500 + (uint64_t)(i % 7), NULL), 0);
  assert_int_equal(T->send(cb, mo, big_out, BIG, 900, NULL), 0);
  usleep(40000); /* longer than a send waits for its answer */
  /* the sends, as credits come back; the large one's receive */
  assert_int_equal(collect(a, b, done, N + 2), N + 2);
  for (int i = 0; i < N + 2; i++) assert_int_equal(done[i].status, 0);
  assert_memory_equal(big_in, big_out, BIG);
  for (int i = 0; i < N; i++) /* per tag, in order */
    assert_int_equal(T->recv(ca, mi, in + (size_t)i * LEN, LEN, 500 + (uint64_t)(i % 7), NULL), 0);
  assert_int_equal(collect(a, b, done, N), N);
  for (int i = 0; i < N; i++) assert_int_equal(done[i].status, 0);
  assert_memory_equal(in, out, (size_t)N * LEN);
  struct transport_counters kb;
  T->counters(b, &kb);
  assert_int_equal(kb.send_messages, N);
  assert_int_equal(kb.rdma_messages, 1);
  assert_int_equal(kb.eager_messages, 0);

  credits_back(a, b, cb);
  for (int i = 0; i < N; i++) /* a takes none of them: no credit comes back */
    assert_int_equal(T->send(cb, mo, out + (size_t)i * LEN, LEN, 600, (void *)(uintptr_t)(i + 1)), 0);
  T->close(ca);
  int got = 0, failed = 0;
  for (double end = test_now() + 20; got < N && test_now() < end;) {
    int n = T->poll(b, 1, done, N);
    for (int i = 0; i < n; i++) {
      int k = (int)(uintptr_t)done[i].user - 1;
      failed += done[i].status != 0;
      if (k >= 32) assert_true(done[i].status < 0); /* waited for a credit */
    }
    got += n;
  }
  assert_int_equal(got, N);
  assert_true(failed >= N - 32);
  T->counters(b, &kb);
  assert_true(kb.send_messages <= N + 32);
  assert_int_equal(kb.eager_messages, 0);
  free_pair(a, b, mo, mi, out, in);
}

/* The sender closes at once: what it sent eager is still received after
 * (held meanwhile: holds says so);
 * a receive nothing will match fails; messages without a registration pass
 * through as over TCP. */
static void test_held_after_close(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  char out[5000], in[5000], ctl[8] = "control", ctl_in[8] = {0}, err[256];
  fill(out, sizeof(out), 3);
  struct tmem *mo = T->mem_register(b, out, sizeof(out), err, sizeof(err));
  struct tmem *mi = T->mem_register(a, in, sizeof(in), err, sizeof(err));
  struct tcompletion done[4];
  assert_int_equal(T->send(cb, mo, out, sizeof(out), 42, NULL), 0);
  assert_int_equal(T->send(cb, NULL, ctl, sizeof(ctl), 0, NULL), 0);
  assert_int_equal(collect(a, b, done, 2), 2);
  for (int spin = 0; spin < 20; spin++) T->poll(a, 1, done, 0); /* a reads them, completes nothing */
  T->close(cb);
  T->mem_deregister(mo);
  T->free(b);
  int seen_failure = 0;
  for (double end = test_now() + 5; !seen_failure && test_now() < end;) {
    char spare[4];
    seen_failure = T->recv(ca, NULL, spare, 4, 77, NULL) < 0;
    if (!seen_failure) assert_int_equal(collect(a, a, done, 1), 1), seen_failure = done[0].status < 0;
  }
  assert_true(seen_failure);
  assert_true(T->holds(ca)); /* both wait for their receives */
  assert_int_equal(T->recv(ca, NULL, ctl_in, sizeof(ctl_in), 0, ctl_in), 0);
  assert_true(T->holds(ca));
  assert_int_equal(T->recv(ca, mi, in, sizeof(in), 42, in), 0);
  assert_int_equal(collect(a, a, done, 2), 2);
  assert_false(T->holds(ca));
  for (int i = 0; i < 2; i++) assert_int_equal(done[i].status, 0);
  assert_memory_equal(in, out, sizeof(out));
  assert_string_equal(ctl_in, "control");
  assert_true(T->recv(ca, mi, in, sizeof(in), 43, in) < 0);
  T->mem_deregister(mi);
  T->free(a);
}

/* What a connection holds is handed over (hold.c carries it to the next
 * connections) once its peer closed it cleanly and every header was
 * taken: nothing while it is open; then the eager messages (small, by
 * SEND, and a large one whose send got no answer, over TCP) and one
 * without a registration. */
static void test_held_taken_after_close(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  static char small[5000], large[100000], plain[300];
  char err[256];
  fill(small, sizeof(small), 5), fill(large, sizeof(large), 6), fill(plain, sizeof(plain), 7);
  struct tmem *ms = T->mem_register(b, small, sizeof(small), err, sizeof(err));
  struct tmem *ml = T->mem_register(b, large, sizeof(large), err, sizeof(err));
  struct tcompletion done[4];
  queue_pairs_up(a, b, ca, cb);
  assert_int_equal(T->send(cb, ms, small, sizeof(small), 42, NULL), 0);
  assert_int_equal(T->send(cb, ml, large, sizeof(large), 43, NULL), 0);
  assert_int_equal(T->send(cb, NULL, plain, sizeof(plain), 44, NULL), 0);
  assert_int_equal(collect(a, b, done, 3), 3); /* the large one eager after its wait for an answer */
  for (int i = 0; i < 3; i++) assert_int_equal(done[i].status, 0);
  struct transport_counters kb;
  T->counters(b, &kb);
  assert_int_equal(kb.send_messages, 1); /* the small one by SEND */
  for (int spin = 0; spin < 20; spin++) T->poll(a, 1, done, 0);
  struct test_held got = {0};
  assert_int_equal(T->take_held(ca, test_keep_held, &got), 0); /* open: nothing */
  assert_int_equal(got.n, 0);
  T->close(cb);
  T->mem_deregister(ms);
  T->mem_deregister(ml);
  T->free(b);
  int rc = 0;
  for (double end = test_now() + 5; rc == 0 && test_now() < end;) {
    T->poll(a, 1, done, 0);
    rc = T->take_held(ca, NULL, NULL);
  }
  assert_int_equal(rc, 1);
  assert_int_equal(T->take_held(ca, test_keep_held, &got), 1);
  assert_int_equal(got.n, 3);
  const char *want[3] = {small, large, plain};
  size_t lens[3] = {sizeof(small), sizeof(large), sizeof(plain)};
  for (int i = 0; i < 3; i++) {
    int k = 0;
    while (k < 3 && got.tags[k] != 42 + (uint64_t)i) k++;
    assert_true(k < 3);
    assert_int_equal(got.lens[k], lens[i]);
    assert_memory_equal(got.data[k], want[i], lens[i]);
    free(got.data[k]);
  }
  assert_false(T->holds(ca));
  T->free(a);
}

/* Many small messages, some received as they come and the rest only
 * after the sender closed: every one arrives, in its receive. */
static void test_many_then_close(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  enum { N = 3000 };
  static char out[N], in[N];
  char err[256];
  fill(out, N, test_seed());
  memset(in, 0, N);
  struct tmem *mo = T->mem_register(b, out, N, err, sizeof(err));
  struct tmem *mi = T->mem_register(a, in, N, err, sizeof(err));
  static struct tcompletion done[N];
  for (int i = 0; i < N / 2; i++) assert_int_equal(T->recv(ca, mi, in + i, 1, 1000 + (uint64_t)i, NULL), 0);
  for (int i = 0; i < N; i++) assert_int_equal(T->send(cb, mo, out + i, 1, 1000 + (uint64_t)i, NULL), 0);
  int got = 0, sent = 0; /* a takes what comes meanwhile: the first half into receives */
  for (double end = test_now() + 20; sent < N && test_now() < end;) {
    int n = T->poll(b, 1, done, N);
    for (int i = 0; i < n; i++) assert_int_equal(done[i].status, 0);
    sent += n;
    got += T->poll(a, 0, done, N);
  }
  assert_int_equal(sent, N);
  T->close(cb); /* (b stays: a daemon's transport outlives its connections) */
  for (int i = N / 2; i < N; i++) assert_int_equal(T->recv(ca, mi, in + i, 1, 1000 + (uint64_t)i, NULL), 0);
  int bad = 0;
  for (double end = test_now() + 20; got < N && test_now() < end;) {
    int n = T->poll(a, 1, done, N);
    for (int i = 0; i < n; i++) bad += done[i].status != 0;
    got += n;
    T->poll(b, 0, done + got, 0);
  }
  assert_int_equal(got, N);
  assert_int_equal(bad, 0);
  assert_memory_equal(in, out, N);
  T->mem_deregister(mo);
  T->mem_deregister(mi);
  T->free(b);
  T->free(a);
}

/* The emulated NIC raises an event in this process (within ~50 ms). */
static void raise_event(const char *line) {
  char path[128];
  snprintf(path, sizeof(path), "%s/raise-%d", test_verbs_emu_dir(), (int)getpid());
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "%s\n", line);
  fclose(f);
}

/* The port goes down mid-transfer: what is posted fails (-ENETDOWN), on
 * both sides (the peer hears the connection close). */
static void test_port_down(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  char *buf = malloc(1 << 20), err[256];
  struct tmem *m = T->mem_register(a, buf, 1 << 20, err, sizeof(err));
  assert_int_equal(T->recv(ca, m, buf, 1 << 20, 1, buf), 0);
  raise_event("port_down emu0 1");
  struct tcompletion done[2];
  assert_int_equal(collect(a, b, done, 1), 1);
  /* both transports run on emu0 here: whichever hears the port's event
   * fails with -ENETDOWN, its peer then hears the connection close */
  assert_true(done[0].status == -ENETDOWN || done[0].status == -ECONNRESET);
  assert_ptr_equal(done[0].user, buf);
  char spare[4];
  int peer_failed = T->recv(cb, NULL, spare, 4, 99, NULL) < 0;
  if (!peer_failed) assert_int_equal(collect(b, b, done, 1), 1), peer_failed = done[0].status < 0;
  assert_true(peer_failed);
  T->mem_deregister(m);
  T->free(a);
  T->free(b);
  free(buf);
}

/* A daemon whose NIC has two active ports drives both (rails): its
 * connections take them in turn, a registration serves on either (the
 * emulation refuses a key of another port's protection domain), and a
 * port going down fails the connections on it alone. */
static void rails_transfer(struct transport *a, struct transport *b, struct tconn *ca, struct tconn *cb,
                           int expect_ok) {
  enum { BIG = 1 << 20 };
  char *out = malloc(BIG), *in = calloc(1, BIG), err[256];
  fill(out, BIG, test_seed());
  struct tmem *mo = T->mem_register(b, out, BIG, err, sizeof(err));
  struct tmem *mi = T->mem_register(a, in, BIG, err, sizeof(err));
  assert_non_null(mo);
  assert_non_null(mi);
  struct transport_counters before, after;
  T->counters(b, &before);
  struct tcompletion done[2];
  int posted = T->recv(ca, mi, in, BIG, 77, in) == 0;
  if (posted) /* its answer out before the send: the bytes go by RDMA */
    for (int spin = 0; spin < 20; spin++) T->poll(a, 1, done, 0), T->poll(b, 1, done, 0);
  posted += T->send(cb, mo, out, BIG, 77, out) == 0;
  int got = collect(a, b, done, posted), ok = got == 2;
  for (int i = 0; i < got; i++) ok &= done[i].status == 0;
  T->counters(b, &after);
  if (expect_ok) {
    assert_true(ok);
    assert_memory_equal(in, out, BIG);
    assert_int_equal(after.rdma_messages + after.eager_messages + after.send_messages,
                     before.rdma_messages + before.eager_messages + before.send_messages + 1);
  } else {
    assert_false(ok);
  }
  T->mem_deregister(mo);
  T->mem_deregister(mi);
  free(out);
  free(in);
}

/* devices: the NIC's ports (CCS_VERBS_EMU_DEVICES), the rails first and
 * second; down: the event that takes the second one down */
static void rails(const char *devices, const char *first, const char *second, const char *down) {
  setenv("CCS_VERBS_EMU_DEVICES", devices, 1);
  struct transport *a = open_t(), *b = open_t();
  unsetenv("CCS_VERBS_EMU_DEVICES");
  char what[512], err[256], bound[128];
  T->describe(a, what, sizeof(what));
  assert_non_null(strstr(what, first));
  assert_non_null(strstr(what, second));
  assert_non_null(strstr(what, "taking the ports in turn"));
  assert_int_equal(T->listen(a, "127.0.0.1:0", bound, sizeof(bound), err, sizeof(err)), 0);
  enum { N = 4 };
  struct tconn *ca[N], *cb[N];
  for (int i = 0; i < N; i++) { /* one at a time: the i-th on both sides takes port i % 2 */
    assert_int_equal(T->connect(b, bound, &cb[i], err, sizeof(err)), 0);
    int rc = 0;
    struct tcompletion none[1];
    for (double until = test_now() + 5; rc == 0 && test_now() < until;) {
      rc = T->accept(a, &ca[i], err, sizeof(err));
      if (rc == 0) T->poll(a, 1, none, 0), T->poll(b, 1, none, 0);
    }
    assert_int_equal(rc, 1);
  }
  for (int i = 0; i < N; i++) rails_transfer(a, b, ca[i], cb[i], 1);
  struct transport_counters k;
  T->counters(b, &k);
  assert_true(k.rdma_messages > 0);
  raise_event(down);
  usleep(200000); /* the event read and taken */
  for (int i = 1; i < N; i += 2) rails_transfer(a, b, ca[i], cb[i], 0); /* on the second: failed */
  for (int i = 0; i < N; i += 2) rails_transfer(a, b, ca[i], cb[i], 1); /* on the first: carry on */
  T->free(a);
  T->free(b);
}

static void test_rails(void **state) {
  rails("emu8:1:active,emu9:1:active", "emu8 port 1", "emu9 port 1", "port_down emu9 1");
  /* two ports of one device: each rail's context hears of both ports'
   * events, and takes its own port's alone */
  rails("emu10:2:active", "emu10 port 1", "emu10 port 2", "port_down emu10 2");
}

/* What the daemon is told when verbs will not do. */
static void test_no_port(void **state) {
  char err[256];
  struct transport_params p = params();
  /* (devices of names no other test used: the emulation keeps a device
   * while anything holds it) */
  setenv("CCS_VERBS_EMU_DEVICES", "emu5:2:down", 1);
  assert_null(T->open(&p, err, sizeof(err)));
  assert_string_equal(err, "no active port among emu5:1 (down) emu5:2 (down)");
  setenv("CCS_VERBS_EMU_DEVICES", "emu6:1:down,emu7:1:active", 1);
  p.ib_devices = "emu6";
  assert_null(T->open(&p, err, sizeof(err)));
  assert_string_equal(err, "no active port among emu6:1 (down) of ib_devices");
  p.ib_devices = "emu7:1";
  struct transport *t = T->open(&p, err, sizeof(err));
  assert_non_null(t);
  char what[256];
  T->describe(t, what, sizeof(what));
  assert_non_null(strstr(what, "emu7 port 1 (RoCE, GID index 1"));
  T->free(t);
  unsetenv("CCS_VERBS_EMU_DEVICES");
  p.ib_devices = "emu0:0";
  assert_null(T->open(&p, err, sizeof(err)));
  assert_non_null(strstr(err, "bad port in ib_devices"));
  p.ib_devices = NULL;
  p.ib_library = "/nonexistent/libibverbs.so.1";
  assert_null(T->open(&p, err, sizeof(err)));
  assert_non_null(strstr(err, "cannot load /nonexistent/libibverbs.so.1"));
  p.ib_library = CCS_VERBS_EMU_PATH;
  p.encrypt_data = 1;
  assert_null(T->open(&p, err, sizeof(err)));
  assert_non_null(strstr(err, "peer_encrypt needs transport tcp"));
}

static void test_gid_choice(void **state) {
  struct ib_gid_entry g[4] = {0};
  g[0].raw[0] = 0xfe, g[0].raw[1] = 0x80, g[0].raw[15] = 1, g[0].type = "IB/RoCE v1\n";
  g[1].raw[10] = g[1].raw[11] = 0xff, g[1].raw[12] = 10, g[1].type = "IB/RoCE v1\n";
  g[2] = g[0], g[2].type = "RoCE v2\n";
  g[3] = g[1], g[3].type = "RoCE v2\n";
  assert_int_equal(ccs_ib_pick_gid(g, 4, 1, -1), 3); /* RoCE v2, IPv4 */
  assert_int_equal(ccs_ib_pick_gid(g, 3, 1, -1), 2); /* RoCE v2, IPv6 */
  assert_int_equal(ccs_ib_pick_gid(g, 2, 1, -1), -1); /* v1 only */
  assert_int_equal(ccs_ib_pick_gid(g, 4, 0, -1), 0);  /* InfiniBand */
  assert_int_equal(ccs_ib_pick_gid(g, 4, 1, 1), 1);   /* as forced */
  assert_int_equal(ccs_ib_pick_gid(g, 4, 1, 4), -1);  /* forced past the table */
  g[0].type = g[1].type = NULL; /* no sysfs: the IPv4-mapped one */
  assert_int_equal(ccs_ib_pick_gid(g, 2, 1, -1), 1);
  memset(g[1].raw, 0, 16);
  assert_int_equal(ccs_ib_pick_gid(g, 2, 1, 1), -1); /* an empty entry */
  struct ib_want w[4];
  char err[128];
  assert_int_equal(ccs_ib_parse_devices("mlx5_0:1,mlx5_1", w, 4, err, sizeof(err)), 2);
  assert_string_equal(w[0].dev, "mlx5_0");
  assert_int_equal(w[0].port, 1);
  assert_string_equal(w[1].dev, "mlx5_1");
  assert_int_equal(w[1].port, 0);
  assert_int_equal(ccs_ib_parse_devices("", w, 4, err, sizeof(err)), 0);
  assert_int_equal(ccs_ib_parse_devices("a,b,c,d,e", w, 4, err, sizeof(err)), -1);
  assert_int_equal(ccs_ib_parse_devices("mlx5_0:x", w, 4, err, sizeof(err)), -1);
  assert_int_equal(ccs_ib_parse_devices(",", w, 4, err, sizeof(err)), -1);
  assert_int_equal(ccs_ib_parse_devices("mlx5_0:256", w, 4, err, sizeof(err)), -1);
}

int main(void) {
  test_verbs_emu_dir();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes_both_ways),
      cmocka_unit_test(test_order_and_sizes_that_differ),
      cmocka_unit_test(test_one_tag_every_way),
      cmocka_unit_test(test_older_peer),
      cmocka_unit_test(test_credits_run_out),
      cmocka_unit_test(test_answers_run_out),
      cmocka_unit_test(test_held_after_close),
      cmocka_unit_test(test_held_taken_after_close),
      cmocka_unit_test(test_many_then_close),
      cmocka_unit_test(test_gid_choice),
      /* last: they drive the emulated NIC itself (its devices, its events) */
      cmocka_unit_test(test_port_down),
      cmocka_unit_test(test_rails),
      cmocka_unit_test(test_no_port),
  };
  size_t n = sizeof(tests) / sizeof(tests[0]) - (emulated() ? 0 : 3);
  return _cmocka_run_group_tests("test_transport_ib", tests, n, NULL, NULL);
}
