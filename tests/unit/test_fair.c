/* Weighted fair sharing (base/fair.c) with synthetic tenants and random
 * job costs: shares converge to the weights, a newcomer is served at once
 * and then at its weight, a tenant that was idle brings back at most one
 * quantum of credit and a busy one (its jobs waited a moment) a few, a tenant that was served ahead keeps its debt across
 * an idle spell, classes within a tenant keep bulk work going, caps hold
 * when nobody else wants the resource, and flows with nothing to remember
 * are freed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "base/fair.h"

/* The synthetic tenants: which of their classes have work. */
struct world {
  int ready[8][FAIR_CLASSES];
};

static int can(void *ctx, struct fair_flow *fl, int cls) {
  struct world *w = ctx;
  return w->ready[fl->key][cls];
}

static double cost_of(void) { return 1 + rand() % 100; }

static int flows_listed(const struct fair *f) {
  int n = 0;
  for (const struct list *it = f->flows.next; it != &f->flows; it = it->next) n++;
  return n;
}

/* The resource's clock: costs are ns of it. */
static uint64_t clock_ns = 1000000000ull;

/* Picks n jobs; served[k] gets each job's cost. */
static void run(struct fair *f, struct world *w, int n, double *served, double max_cost) {
  for (int i = 0; i < n; i++) {
    int cls;
    uint64_t retry;
    struct fair_flow *fl = fair_pick(f, clock_ns, can, w, &cls, &retry);
    assert_non_null(fl);
    double c = max_cost > 0 ? max_cost : cost_of();
    fair_charge(f, fl, cls, c);
    served[fl->key] += c;
    clock_ns += (uint64_t)c;
  }
}

/* Jobs b runs, job by job, before a goes again. */
static double run_of(struct fair *f, struct world *w, double job) {
  double ahead = 0;
  for (;;) {
    int cls;
    uint64_t retry;
    struct fair_flow *fl = fair_pick(f, clock_ns, can, w, &cls, &retry);
    fair_charge(f, fl, cls, job);
    clock_ns += (uint64_t)job;
    if (fl->key == 0) return ahead;
    ahead += job;
  }
}

static void test_shares_converge_to_weights(void **state) {
  (void)state;
  srand(1);
  struct fair f;
  fair_init(&f, 100, 0);
  struct world w = {0};
  const double weights[3] = {3, 2, 1};
  for (int k = 0; k < 3; k++) {
    struct fair_flow *fl = fair_flow_get(&f, (uint64_t)k);
    fair_flow_set(fl, weights[k], 1);
    fair_ref(fl);
    w.ready[k][FAIR_NORMAL] = 1;
  }
  double served[8] = {0};
  run(&f, &w, 60000, served, 0);
  double total = served[0] + served[1] + served[2];
  for (int k = 0; k < 3; k++) assert_true(fabs(served[k] / total - weights[k] / 6) < 0.005);
  /* a weight changed while they run: the split follows */
  fair_flow_set(fair_flow_get(&f, 2), 5, 1);
  double after[8] = {0};
  run(&f, &w, 60000, after, 0);
  total = after[0] + after[1] + after[2];
  assert_true(fabs(after[2] / total - 0.5) < 0.01);
  for (int k = 0; k < 3; k++) fair_unref(fair_flow_get(&f, (uint64_t)k), clock_ns);
  fair_close(&f);
}

static void test_newcomer_served_at_once_then_at_its_weight(void **state) {
  (void)state;
  srand(2);
  struct fair f;
  fair_init(&f, 100, 0);
  struct world w = {0};
  for (int k = 0; k < 2; k++) {
    fair_ref(fair_flow_get(&f, (uint64_t)k));
    w.ready[k][FAIR_NORMAL] = 1;
  }
  double served[8] = {0};
  run(&f, &w, 100000, served, 0); /* the others ran a long time */
  struct fair_flow *c = fair_flow_get(&f, 2);
  fair_ref(c);
  w.ready[2][FAIR_NORMAL] = 1;
  int cls;
  uint64_t retry;
  assert_ptr_equal(fair_pick(&f, clock_ns, can, &w, &cls, &retry), c); /* goes first */
  fair_charge(&f, c, cls, 50);
  double later[8] = {0};
  run(&f, &w, 30000, later, 0);
  double total = later[0] + later[1] + later[2];
  assert_true(fabs(later[2] / total - 1.0 / 3) < 0.01); /* neither starved nor ahead */
  for (int k = 0; k < 3; k++) fair_unref(fair_flow_get(&f, (uint64_t)k), clock_ns);
  fair_close(&f);
}

/* b sits out (no jobs) while a runs, then both have work: b's run of
 * jobs before a goes again is worth at most one quantum plus one job. */
static void test_idle_tenant_banks_one_quantum_at_most(void **state) {
  (void)state;
  struct fair f;
  const double quantum = 1000, job = 10;
  fair_init(&f, quantum, 0);
  struct world w = {0};
  fair_ref(fair_flow_get(&f, 0));
  w.ready[0][FAIR_NORMAL] = 1;
  double served[8] = {0};
  run(&f, &w, 10000, served, job); /* a alone: 100000 units b did not want */
  clock_ns += 2 * FAIR_IDLE_GRACE_NS;
  fair_ref(fair_flow_get(&f, 1));
  w.ready[1][FAIR_NORMAL] = 1;
  double ahead = run_of(&f, &w, job);
  assert_true(ahead >= quantum - job); /* it does get its quantum */
  assert_true(ahead <= quantum + job);
  /* from then on they alternate */
  double later[8] = {0};
  run(&f, &w, 1000, later, job);
  assert_true(fabs(later[0] - later[1]) <= 2 * job);
  fair_unref(fair_flow_get(&f, 0), clock_ns);
  fair_unref(fair_flow_get(&f, 1), clock_ns);
  fair_close(&f);
}

/* b is busy but cannot go for a while (its job waits for inputs, or its
 * next job comes a moment after the last ended): when it can, it
 * catches up FAIR_BUSY_QUANTA quanta, no more. */
static void test_busy_tenant_catches_up_a_few_quanta(void **state) {
  (void)state;
  const double quantum = 1000, job = 10;
  for (int gap = 0; gap < 2; gap++) {
    struct fair f;
    fair_init(&f, quantum, 0);
    struct world w = {0};
    struct fair_flow *a = fair_flow_get(&f, 0), *b = fair_flow_get(&f, 1);
    fair_ref(a);
    fair_ref(b);
    w.ready[0][FAIR_NORMAL] = w.ready[1][FAIR_NORMAL] = 1;
    double served[8] = {0};
    run(&f, &w, 1000, served, job);
    w.ready[1][FAIR_NORMAL] = 0;
    if (gap) fair_unref(b, clock_ns); /* its last job ended */
    run(&f, &w, 10000, served, job);  /* 100000 units: less than the grace */
    if (gap) fair_ref(b);             /* and its next came */
    w.ready[1][FAIR_NORMAL] = 1;
    double ahead = run_of(&f, &w, job);
    assert_true(ahead >= FAIR_BUSY_QUANTA * quantum - job);
    assert_true(ahead <= FAIR_BUSY_QUANTA * quantum + job);
    fair_unref(a, clock_ns);
    fair_unref(b, clock_ns);
    fair_close(&f);
  }
}

/* a took more than its share while b could not go; a leaves (no jobs)
 * and comes back: the debt is still there, a is not a fresh flow. */
static void test_debt_survives_an_idle_spell(void **state) {
  (void)state;
  struct fair f;
  fair_init(&f, 10, 0);
  struct world w = {0};
  struct fair_flow *a = fair_flow_get(&f, 0), *b = fair_flow_get(&f, 1);
  fair_ref(a);
  fair_ref(b);
  w.ready[0][FAIR_NORMAL] = 1;
  int cls;
  uint64_t retry;
  assert_ptr_equal(fair_pick(&f, clock_ns, can, &w, &cls, &retry), a);
  fair_charge(&f, a, cls, 5000); /* one huge job */
  fair_unref(a, clock_ns);        /* nothing queued: but a owes */
  clock_ns += 2 * FAIR_IDLE_GRACE_NS;
  assert_int_equal(flows_listed(&f), 2);
  w.ready[1][FAIR_NORMAL] = 1;
  a = fair_flow_get(&f, 0);
  fair_ref(a);
  double served[8] = {0};
  run(&f, &w, 400, served, 10); /* b catches up first */
  assert_true(served[0] == 0);
  assert_true(served[1] == 4000);
  fair_unref(a, clock_ns);
  fair_unref(b, clock_ns);
  fair_close(&f);
}

static void test_classes_keep_bulk_going(void **state) {
  (void)state;
  srand(3);
  struct fair f;
  fair_init(&f, 100, 0);
  struct world w = {0};
  struct fair_flow *fl = fair_flow_get(&f, 0);
  fair_ref(fl);
  for (int c = 0; c < FAIR_CLASSES; c++) w.ready[0][c] = 1;
  double by_class[FAIR_CLASSES] = {0}, total = 0;
  for (int i = 0; i < 70000; i++) {
    int cls;
    uint64_t retry;
    assert_ptr_equal(fair_pick(&f, clock_ns, can, &w, &cls, &retry), fl);
    double c = cost_of();
    fair_charge(&f, fl, cls, c);
    by_class[cls] += c;
    total += c;
  }
  assert_true(fabs(by_class[FAIR_LATENCY] / total - 4.0 / 7) < 0.01);
  assert_true(fabs(by_class[FAIR_BULK] / total - 1.0 / 7) < 0.01);
  /* bulk alone for a while, then one latency job: it goes next */
  w.ready[0][FAIR_LATENCY] = w.ready[0][FAIR_NORMAL] = 0;
  double ignored[8] = {0};
  run(&f, &w, 5000, ignored, 0);
  w.ready[0][FAIR_LATENCY] = 1;
  int cls;
  uint64_t retry;
  fair_pick(&f, clock_ns, can, &w, &cls, &retry);
  assert_int_equal(cls, FAIR_LATENCY);
  /* and other tenants' flows are untouched by a tenant's classes */
  assert_string_equal(fair_class_name(FAIR_BULK), "bulk");
  fair_unref(fl, clock_ns);
  fair_close(&f);
}

/* The resource serves `capacity` units a second. A tenant capped at a
 * quarter gets a quarter even alone; uncapped it gets all; beside an
 * uncapped tenant the capped one still gets no more than its cap. */
static void test_cap_holds_alone_and_with_others(void **state) {
  (void)state;
  const double capacity = 1e6; /* units per second */
  struct fair f;
  fair_init(&f, 1000, capacity);
  struct world w = {0};
  struct fair_flow *a = fair_flow_get(&f, 0);
  fair_ref(a);
  fair_flow_set(a, 1, 0.25);
  w.ready[0][FAIR_NORMAL] = 1;
  uint64_t now = 1000000000ull;
  double served[8] = {0};
  const uint64_t end = now + 10ull * 1000000000ull;
  while (now < end) {
    int cls;
    uint64_t retry;
    struct fair_flow *fl = fair_pick(&f, now, can, &w, &cls, &retry);
    if (!fl) {
      assert_true(retry > now);
      now = retry;
      continue;
    }
    double c = 500;
    fair_charge(&f, fl, cls, c);
    served[fl->key] += c;
    now += (uint64_t)(c / capacity * 1e9);
  }
  double share = served[0] / (capacity * 10);
  assert_true(share > 0.249 && share < 0.2526); /* a quarter, plus one burst of 0.1 s */
  /* an uncapped tenant beside it takes the rest */
  struct fair_flow *b = fair_flow_get(&f, 1);
  fair_ref(b);
  w.ready[1][FAIR_NORMAL] = 1;
  double both[8] = {0};
  const uint64_t end2 = now + 10ull * 1000000000ull;
  while (now < end2) {
    int cls;
    uint64_t retry;
    struct fair_flow *fl = fair_pick(&f, now, can, &w, &cls, &retry);
    assert_non_null(fl); /* b can always go */
    fair_charge(&f, fl, cls, 500);
    both[fl->key] += 500;
    now += 500000; /* 500 units at 1e6 a second */
  }
  assert_true(both[0] / (both[0] + both[1]) < 0.26);
  assert_true(both[0] / (both[0] + both[1]) > 0.24);
  /* the cap lifted: even shares, after a (busy all along) caught up */
  fair_flow_set(a, 1, 1);
  double even[8] = {0};
  run(&f, &w, 10000, even, 500);
  assert_true(fabs(even[0] - even[1]) <= FAIR_BUSY_QUANTA * 1000 + 1000);
  fair_unref(a, clock_ns);
  fair_unref(b, clock_ns);
  fair_close(&f);
}

static void test_flows_with_nothing_to_remember_go(void **state) {
  (void)state;
  struct fair f;
  fair_init(&f, 100, 0);
  struct world w = {0};
  for (int k = 0; k < 4; k++) {
    fair_ref(fair_flow_get(&f, (uint64_t)k));
    w.ready[k][FAIR_NORMAL] = 1;
  }
  double served[8] = {0};
  run(&f, &w, 1000, served, 10);
  assert_int_equal(flows_listed(&f), 4);
  for (int k = 1; k < 4; k++) {
    w.ready[k][FAIR_NORMAL] = 0;
    fair_unref(fair_flow_get(&f, (uint64_t)k), clock_ns);
  }
  run(&f, &w, 100, served, 10); /* a moment later: they may come back busy */
  assert_int_equal(flows_listed(&f), 4);
  clock_ns += 2 * FAIR_IDLE_GRACE_NS;
  run(&f, &w, 100, served, 10); /* flow 0 runs on: the others fall behind it, then go */
  assert_int_equal(flows_listed(&f), 1);
  /* an estimate corrected downwards */
  struct fair_flow *fl = fair_flow_get(&f, 0);
  double before = fl->vtime;
  fair_charge(&f, fl, FAIR_NORMAL, 100);
  fair_charge(&f, fl, FAIR_NORMAL, -60);
  assert_true(fabs(fl->vtime - before - 40) < 1e-9);
  fair_unref(fl, clock_ns);
  fair_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shares_converge_to_weights),
      cmocka_unit_test(test_newcomer_served_at_once_then_at_its_weight),
      cmocka_unit_test(test_idle_tenant_banks_one_quantum_at_most),
      cmocka_unit_test(test_busy_tenant_catches_up_a_few_quanta),
      cmocka_unit_test(test_debt_survives_an_idle_spell),
      cmocka_unit_test(test_classes_keep_bulk_going),
      cmocka_unit_test(test_cap_holds_alone_and_with_others),
      cmocka_unit_test(test_flows_with_nothing_to_remember_go),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
