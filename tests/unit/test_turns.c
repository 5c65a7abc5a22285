/* The control path's turns (front/tenant.c: ccsd_tenant_turns): a
 * connection's turns follow its tenant's weight, are split among the
 * tenant's connections, carry fractions while it stays busy and lose
 * them when it has nothing left. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "front/front.h"

static long turns_over(struct tenant *t, double *credit, int rounds, double per) {
  long n = 0;
  for (int i = 0; i < rounds; i++) n += ccsd_tenant_turns(t, credit, per);
  return n;
}

static void test_turns_follow_weights_and_connections(void **state) {
  (void)state;
  struct run_share heavy = {.weight = 3, .cap = 1}, light = {.weight = 1, .cap = 1},
                   tiny = {.weight = 0.01, .cap = 1};
  struct tenant a = {.share = &heavy}, b = {.share = &light}, c = {.share = &tiny};
  a.used[TENANT_SESSIONS] = 1;
  b.used[TENANT_SESSIONS] = 4; /* four connections share its turns */
  c.used[TENANT_SESSIONS] = 1;
  double ca = 0, cb = 0, cc = 0;
  assert_int_equal(turns_over(&a, &ca, 1000, 16), 48000);
  assert_int_equal(turns_over(&b, &cb, 1000, 16), 4000); /* per connection: 16 a tenant */
  long tiny_turns = turns_over(&c, &cc, 1000, 16); /* 0.16 a round, carried */
  assert_true(tiny_turns >= 159 && tiny_turns <= 160);
  /* a connection with nothing left loses what it carried */
  cc = 0.9;
  ccsd_tenant_idle(&cc);
  assert_int_equal(ccsd_tenant_turns(&c, &cc, 16), 0);
  /* and banks no more than a round's worth beyond its grant */
  double big = 1e9;
  assert_true(ccsd_tenant_turns(&a, &big, 16) <= 2 * 48 + 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_turns_follow_weights_and_connections)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
