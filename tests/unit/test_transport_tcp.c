/* The TCP transport over loopback: messages of every size both ways,
 * receives posted before and after their message arrives, order per tag,
 * a peer that goes away (what it sent first still arrives), posts checked
 * against their registered memory, and an address nobody listens on. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "transport.h"

static const struct transport_ops *T = &ccs_transport_tcp;

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

static void connect_pair(struct transport **a, struct transport **b, struct tconn **ca,
                         struct tconn **cb) {
  char err[256], bound[128];
  *a = T->open(err, sizeof(err));
  *b = T->open(err, sizeof(err));
  assert_int_equal(T->listen(*a, "127.0.0.1:0", bound, sizeof(bound), err, sizeof(err)), 0);
  assert_int_equal(T->connect(*b, bound, 5, cb, err, sizeof(err)), 0);
  int rc = 0;
  for (double until = test_now() + 5; rc == 0 && test_now() < until;) rc = T->accept(*a, ca);
  assert_int_equal(rc, 1);
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
  for (int i = 0; i < N; i++) assert_int_equal(T->post_recv(ca, NULL, in_a[i], sizes[i], 100 + (uint64_t)i, in_a[i]), 0);
  for (int i = 0; i < N; i++) assert_int_equal(T->post_send(ca, NULL, out_a[i], sizes[i], 200 + (uint64_t)i, out_a[i]), 0);
  for (int i = N - 1; i >= 0; i--) /* in reverse: tags, not order, match */
    assert_int_equal(T->post_send(cb, NULL, out_b[i], sizes[i], 100 + (uint64_t)i, out_b[i]), 0);
  struct tcompletion done[4 * N];
  int got = collect(a, b, done, 2 * N + N); /* a's sends, b's sends, a's receives */
  assert_int_equal(got, 3 * N);
  for (int i = 0; i < N; i++) assert_int_equal(T->post_recv(cb, NULL, in_b[i], sizes[i], 200 + (uint64_t)i, in_b[i]), 0);
  got = collect(a, b, done, N);
  assert_int_equal(got, N);
  for (int i = 0; i < N; i++) {
    assert_memory_equal(in_a[i], out_b[i], sizes[i]);
    assert_memory_equal(in_b[i], out_a[i], sizes[i]);
  }
  for (int k = 0; k < N; k++) assert_int_equal(done[k].status, 0);
  /* same tag twice: first in, first matched */
  int x1 = 1, x2 = 2, r1 = 0, r2 = 0;
  T->post_send(cb, NULL, &x1, sizeof(x1), 9, NULL);
  T->post_send(cb, NULL, &x2, sizeof(x2), 9, NULL);
  struct tcompletion two[4];
  assert_int_equal(collect(a, b, two, 2), 2); /* the sends; the messages wait at a */
  for (int spin = 0; spin < 50; spin++) T->poll(a, 2, two, 0); /* read, complete nothing */
  T->post_recv(ca, NULL, &r1, sizeof(r1), 9, NULL);
  T->post_recv(ca, NULL, &r2, sizeof(r2), 9, NULL);
  assert_int_equal(collect(a, b, two, 2), 2);
  assert_int_equal(r1, 1);
  assert_int_equal(r2, 2);
  /* the peer goes away: a pending receive fails, it does not hang */
  char spare[16];
  T->post_recv(ca, NULL, spare, sizeof(spare), 77, spare);
  T->close(cb);
  struct tcompletion one;
  assert_int_equal(collect(a, b, &one, 1), 1);
  assert_true(one.status < 0);
  assert_ptr_equal(one.user, spare);
  T->free(a);
  T->free(b);
  for (int i = 0; i < N; i++) free(out_a[i]), free(out_b[i]), free(in_a[i]), free(in_b[i]);
}

/* A peer that sends and closes at once: what it sent is still received by
 * receives posted afterwards; a receive nothing will match fails. */
static void test_messages_outlive_the_close(void **state) {
  struct transport *a, *b;
  struct tconn *ca, *cb;
  connect_pair(&a, &b, &ca, &cb);
  char msg[1000], in[1000];
  for (size_t i = 0; i < sizeof(msg); i++) msg[i] = (char)(i * 13 + 1);
  struct tcompletion done[4];
  assert_int_equal(T->post_send(cb, NULL, msg, sizeof(msg), 42, NULL), 0);
  assert_int_equal(collect(b, b, done, 1), 1); /* written */
  T->free(b);                                  /* and gone */
  int sentinel = 0;
  assert_int_equal(T->post_recv(ca, NULL, &sentinel, 0, 7, NULL), 0); /* fails once a sees the close */
  assert_int_equal(collect(a, a, done, 1), 1);
  assert_true(done[0].status < 0);
  assert_int_equal(T->post_recv(ca, NULL, in, sizeof(in), 42, in), 0);
  assert_int_equal(collect(a, a, done, 1), 1);
  assert_int_equal(done[0].status, 0);
  assert_int_equal(done[0].bytes, sizeof(msg));
  assert_memory_equal(in, msg, sizeof(msg));
  assert_true(T->post_recv(ca, NULL, in, sizeof(in), 43, in) < 0);
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
  assert_int_equal(T->post_send(cb, m, buf + 1023, 16, 5, NULL), -EFAULT); /* before it */
  assert_int_equal(T->post_send(cb, m, buf + 3072 - 15, 16, 5, NULL), -EFAULT); /* past its end */
  assert_int_equal(T->post_send(cb, m, buf + 3072, 0, 5, NULL), 0); /* empty, at its end */
  assert_int_equal(T->post_send(cb, m, buf + 1024, 2048, 6, NULL), 0); /* all of it */
  assert_int_equal(T->post_recv(ca, mi, in + 4090, 16, 6, NULL), -EFAULT);
  assert_int_equal(T->post_recv(ca, mi, in, 0, 5, NULL), 0);
  assert_int_equal(T->post_recv(ca, mi, in, 2048, 6, in), 0);
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
  struct transport *t = T->open(err, sizeof(err));
  struct tconn *c;
  /* a port nobody listens on: our own listener, closed again */
  struct transport *l = T->open(err, sizeof(err));
  assert_int_equal(T->listen(l, "127.0.0.1:0", bound, sizeof(bound), err, sizeof(err)), 0);
  T->free(l);
  assert_int_equal(T->connect(t, bound, 2, &c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "cannot connect"));
  assert_int_equal(T->connect(t, "no-port-here", 2, &c, err, sizeof(err)), -1);
  assert_int_equal(T->listen(t, "127.0.0.1:notaport", bound, sizeof(bound), err, sizeof(err)), -1);
  T->free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_messages_both_ways),
      cmocka_unit_test(test_messages_outlive_the_close),
      cmocka_unit_test(test_registered_memory),
      cmocka_unit_test(test_bad_addresses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
