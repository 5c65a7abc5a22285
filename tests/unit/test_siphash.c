/* SipHash-2-4 against the reference vector of its paper. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "siphash.h"

static void test_reference_vector(void **state) {
  uint8_t key[16], msg[64];
  for (int i = 0; i < 16; i++) key[i] = (uint8_t)i;
  for (int i = 0; i < 64; i++) msg[i] = (uint8_t)i;
  assert_true(ccsd_siphash24(key, msg, 15) == 0xa129ca6149be45e5ull);
  assert_true(ccsd_siphash24(key, msg, 0) == 0x726fdb47dd0e0e31ull);
  /* one bit anywhere changes it */
  uint64_t h = ccsd_siphash24(key, msg, 40);
  msg[17] ^= 4;
  assert_true(ccsd_siphash24(key, msg, 40) != h);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_reference_vector)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
