/* Links shared by tenant weight (run/link.c): backlogged tenants split a
 * link's bytes by weight, links are shared independently, the window
 * holds, a latency-class send overtakes bulk ones of its tenant, queued
 * sends are taken back whole, the capacity is measured only under a
 * backlog, and a capped tenant alone gets its cap of it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "run/link.h"

#define WINDOW (1u << 20)
#define CHUNK 65536
#define PER_TENANT 64

static struct run_share shares[2];
static struct link_send sends[2][PER_TENANT];

static void tenants(double w0, double w1, double cap0) {
  memset(shares, 0, sizeof(shares));
  memset(sends, 0, sizeof(sends));
  for (int i = 0; i < 2; i++) {
    shares[i].uid = 1000 + (uid_t)i;
    shares[i].cap = 1;
    for (int k = 0; k < PER_TENANT; k++) {
      sends[i][k].share = &shares[i];
      sends[i][k].bytes = CHUNK / 2 + (size_t)(rand() % CHUNK); /* random sizes */
      sends[i][k].prio = FAIR_BULK;
    }
  }
  shares[0].weight = w0;
  shares[1].weight = w1;
  shares[0].cap = cap0;
}

static int every(void *arg, struct link_send *s) {
  (void)arg, (void)s;
  return 1;
}

static int of_tenant(void *arg, struct link_send *s) { return s->share == arg; }

static void grab(void *arg, struct net_link *l) { *(struct net_link **)arg = l; }

/* Tenants in `who` keep all their sends queued (each sends again once
 * one is done); the transport drains `rate` bytes a second in posting
 * order. Runs for `seconds` of the clock; sent[i]: tenant i's bytes. */
static void drive(struct net_links *ls, const char *addr, const int *who, int nwho, uint64_t *now,
                  double rate, double seconds, double *sent) {
  struct net_link *l = NULL;
  for (int w = 0; w < nwho; w++)
    for (int k = 0; k < PER_TENANT; k++) l = ccsd_links_queue(ls, addr, &sends[who[w]][k]);
  assert_non_null(l);
  struct link_send *posted[2 * PER_TENANT];
  int n = 0;
  size_t in_window = 0;
  const uint64_t end = *now + (uint64_t)(seconds * 1e9);
  while (*now < end) {
    for (struct link_send *s; (s = ccsd_link_next(l, *now));) {
      assert_true(in_window < WINDOW); /* the window was not full when it went */
      in_window += s->bytes;
      posted[n++] = s;
    }
    if (n == 0) { /* capped: time passes */
      *now += 1000000;
      continue;
    }
    struct link_send *done = posted[0];
    memmove(posted, posted + 1, sizeof(posted[0]) * (size_t)--n);
    *now += (uint64_t)((double)done->bytes / rate * 1e9);
    sent[done->share - shares] += (double)done->bytes;
    in_window -= done->bytes;
    ccsd_link_done(done, *now);
    assert_ptr_equal(ccsd_links_queue(ls, addr, done), l);
  }
  /* what is still queued or posted goes back */
  for (int i = 0; i < n; i++) ccsd_link_done(posted[i], *now);
  struct list back;
  list_init(&back);
  ccsd_links_take(ls, every, NULL, &back);
}

static void test_weights_split_a_link(void **state) {
  (void)state;
  srand(1);
  struct net_links ls;
  ccsd_links_init(&ls, WINDOW, 0);
  uint64_t now = 1000000000ull;
  const int both[2] = {0, 1};
  for (int round = 0; round < 2; round++) { /* 3:1, then 1:2 (a reload) */
    tenants(round ? 1 : 3, round ? 2 : 1, 1);
    double sent[2] = {0};
    drive(&ls, "10.0.0.2:7100", both, 2, &now, 1e9, 2, sent);
    double want = round ? 1.0 / 3 : 0.75;
    assert_true(fabs(sent[0] / (sent[0] + sent[1]) - want) < 0.01);
  }
  ccsd_links_close(&ls);
}

static void test_links_are_shared_apart(void **state) {
  (void)state;
  srand(2);
  struct net_links ls;
  ccsd_links_init(&ls, WINDOW, 0);
  tenants(3, 1, 1);
  uint64_t now = 1000000000ull;
  const int both[2] = {0, 1}, second[1] = {1};
  double a[2] = {0}, b[2] = {0};
  drive(&ls, "10.0.0.2:7100", both, 2, &now, 1e9, 1, a);
  drive(&ls, "10.0.0.3:7100", second, 1, &now, 1e9, 1, b); /* alone there: all of it */
  assert_true(a[1] > 0 && b[0] == 0 && b[1] > 0.99e9);
  ccsd_links_close(&ls);
}

static void test_latency_send_overtakes_bulk(void **state) {
  (void)state;
  struct net_links ls;
  ccsd_links_init(&ls, WINDOW, 0);
  tenants(1, 1, 1);
  struct net_link *l = NULL;
  for (int k = 0; k < PER_TENANT; k++) l = ccsd_links_queue(&ls, "x:1", &sends[0][k]);
  struct link_send *posted[PER_TENANT], *s;
  int n = 0;
  while ((s = ccsd_link_next(l, 2))) posted[n++] = s; /* the window fills */
  assert_true(n < PER_TENANT);
  struct link_send urgent = {.share = &shares[0], .bytes = 8, .prio = FAIR_LATENCY};
  ccsd_links_queue(&ls, "x:1", &urgent);
  assert_null(ccsd_link_next(l, 3)); /* the window holds it too */
  for (int i = 0; !(s = ccsd_link_next(l, 4)); i++) ccsd_link_done(posted[i], 4);
  assert_ptr_equal(s, &urgent);
  struct list back;
  list_init(&back);
  ccsd_links_take(&ls, every, NULL, &back);
  ccsd_links_close(&ls);
}

static void test_queued_sends_taken_back(void **state) {
  (void)state;
  struct net_links ls;
  ccsd_links_init(&ls, 1ull << 40, 0);
  tenants(1, 1, 1);
  struct net_link *l = NULL;
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < PER_TENANT; k++) l = ccsd_links_queue(&ls, "x:1", &sends[i][k]);
  struct list back;
  list_init(&back);
  ccsd_links_take(&ls, of_tenant, &shares[0], &back);
  int n = 0;
  for (struct list *it = back.next; it != &back; it = it->next, n++)
    assert_ptr_equal(LIST_ENTRY(it, struct link_send, link)->share, &shares[0]);
  assert_int_equal(n, PER_TENANT);
  int left = 0;
  for (struct link_send *s; (s = ccsd_link_next(l, 2)); left++) assert_ptr_equal(s->share, &shares[1]);
  assert_int_equal(left, PER_TENANT);
  ccsd_links_close(&ls);
}

static void test_capacity_measured_and_cap_held(void **state) {
  (void)state;
  srand(3);
  const double rate = 1e9;
  for (int configured = 0; configured < 2; configured++) {
    struct net_links ls;
    ccsd_links_init(&ls, WINDOW, configured ? 2 * rate : 0);
    tenants(1, 1, 0.25);
    uint64_t now = 1000000000ull;
    const int first[1] = {0};
    double warm[2] = {0}, capped[2] = {0};
    /* unknown capacity: the cap cannot apply until the link was measured */
    drive(&ls, "x:1", first, 1, &now, rate, 0.5, warm);
    struct net_link *l;
    ccsd_links_each(&ls, grab, &l);
    double cap = ccsd_link_capacity(l);
    if (configured) assert_true(cap == 2 * rate);
    else assert_true(fabs(cap / rate - 1) < 0.05);
    drive(&ls, "x:1", first, 1, &now, rate, 4, capped);
    double got = capped[0] / 4 / cap;
    assert_true(got > 0.24 && got < 0.27);
    ccsd_links_close(&ls);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_weights_split_a_link),
      cmocka_unit_test(test_links_are_shared_apart),
      cmocka_unit_test(test_latency_send_overtakes_bulk),
      cmocka_unit_test(test_queued_sends_taken_back),
      cmocka_unit_test(test_capacity_measured_and_cap_held),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
