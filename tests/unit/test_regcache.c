/* Registrations kept between ops (transport/regcache.c), against a
 * transport that counts what it registers: a kept range is registered
 * once for any number of ops, until its mapping is forgotten (at once when
 * idle, at its last op otherwise; a get after the forget registers anew);
 * only overlapping ranges are forgotten; ranges not kept, or of another
 * length at a kept base, are the op's alone; a refusal leaves nothing
 * behind; freeing the cache lets ranges in use go with their ops; threads
 * racing for one range leave one registration. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regcache.h"

static _Atomic int registered, deregistered;

struct tmem {
  void *base;
  size_t len;
};

static struct tmem *fake_register(struct transport *t, void *base, size_t len, char *err, size_t errlen) {
  (void)t;
  if (len == 13) { /* the transport refuses this one */
    snprintf(err, errlen, "cannot pin 13 bytes");
    return NULL;
  }
  struct tmem *m = malloc(sizeof(*m));
  *m = (struct tmem){base, len};
  atomic_fetch_add(&registered, 1);
  return m;
}

static void fake_deregister(struct tmem *m) {
  atomic_fetch_add(&deregistered, 1);
  free(m);
}

static const struct transport_ops fake = {.name = "fake", .mem_register = fake_register,
                                          .mem_deregister = fake_deregister};
static char memory[4096];

static int setup(void **state) {
  atomic_store(&registered, 0);
  atomic_store(&deregistered, 0);
  *state = reg_cache_new(&fake, NULL);
  return *state ? 0 : -1;
}

static int teardown(void **state) {
  reg_cache_free(*state);
  assert_int_equal(atomic_load(&registered), atomic_load(&deregistered)); /* nothing left pinned */
  return 0;
}

static struct reg_entry *get(struct reg_cache *c, size_t off, size_t len, int keep) {
  char err[128] = "";
  struct reg_entry *e = reg_cache_get(c, memory + off, len, keep, err, sizeof(err));
  assert_non_null(e);
  assert_ptr_equal(((struct tmem *)reg_entry_mem(e))->base, memory + off);
  return e;
}

static void held(struct reg_cache *c, uint64_t made, uint64_t reused, uint64_t now) {
  struct reg_cache_counts k;
  reg_cache_counts(c, &k);
  assert_int_equal(k.made, made);
  assert_int_equal(k.reused, reused);
  assert_int_equal(k.held, now);
  assert_int_equal(atomic_load(&registered) - atomic_load(&deregistered), now);
}

static void test_kept_until_forgotten(void **state) {
  struct reg_cache *c = *state;
  for (int op = 0; op < 5; op++) reg_cache_put(c, get(c, 0, 1024, 1));
  held(c, 1, 4, 1); /* one registration for five ops, kept after them */
  reg_cache_forget(c, memory, 1024);
  held(c, 1, 4, 0); /* idle: gone at once */
  reg_cache_put(c, get(c, 0, 1024, 1));
  held(c, 2, 4, 1); /* the same addresses, a new mapping: registered anew */
}

static void test_forgotten_in_use(void **state) {
  struct reg_cache *c = *state;
  struct reg_entry *a = get(c, 0, 512, 1);
  reg_cache_forget(c, memory, 512);
  held(c, 1, 0, 1); /* its op still runs */
  struct reg_entry *b = get(c, 0, 512, 1);
  assert_ptr_not_equal(b, a); /* never served again */
  held(c, 2, 0, 2);
  reg_cache_put(c, a);
  held(c, 2, 0, 1);
  reg_cache_put(c, b);
  held(c, 2, 0, 1); /* b is kept */
}

static void test_only_overlaps_forgotten(void **state) {
  struct reg_cache *c = *state;
  reg_cache_put(c, get(c, 0, 100, 1));
  reg_cache_put(c, get(c, 200, 50, 1));
  reg_cache_put(c, get(c, 300, 0, 1)); /* an empty range is a byte */
  reg_cache_forget(c, memory + 100, 100); /* [100, 200): touches neither */
  held(c, 3, 0, 3);
  reg_cache_forget(c, memory + 50, 1); /* inside the first */
  held(c, 3, 0, 2);
  reg_cache_forget(c, memory + 150, 100); /* over the second's start */
  held(c, 3, 0, 1);
  reg_cache_forget(c, memory + 300, 1);
  held(c, 3, 0, 0);
}

static void test_not_kept(void **state) {
  struct reg_cache *c = *state;
  struct reg_entry *a = get(c, 0, 64, 0), *b = get(c, 0, 64, 0);
  assert_ptr_not_equal(a, b);
  held(c, 2, 0, 2);
  reg_cache_put(c, a);
  reg_cache_put(c, b);
  held(c, 2, 0, 0);
  /* another length at a kept base: the op's alone, the kept one stays */
  reg_cache_put(c, get(c, 0, 128, 1));
  struct reg_entry *other = get(c, 0, 64, 1);
  held(c, 4, 0, 2);
  reg_cache_put(c, other);
  held(c, 4, 0, 1);
  reg_cache_put(c, get(c, 0, 128, 1));
  held(c, 4, 1, 1);
}

static void test_refused(void **state) {
  struct reg_cache *c = *state;
  char err[128] = "";
  assert_null(reg_cache_get(c, memory, 13, 1, err, sizeof(err)));
  assert_string_equal(err, "cannot pin 13 bytes");
  held(c, 0, 0, 0);
  reg_cache_put(c, get(c, 0, 14, 1));
  held(c, 1, 0, 1);
}

/* Freed with a range in use (an op finishing after the network side
 * stopped): the idle one goes now, the other with its op. */
static void test_freed_in_use(void **state) {
  (void)state;
  atomic_store(&registered, 0);
  atomic_store(&deregistered, 0);
  struct reg_cache *c = reg_cache_new(&fake, NULL);
  reg_cache_put(c, get(c, 0, 100, 1));
  struct reg_entry *busy = get(c, 1000, 100, 1);
  reg_cache_free(c);
  assert_int_equal(atomic_load(&deregistered), 1);
  reg_cache_put(c, busy);
  assert_int_equal(atomic_load(&deregistered), 2);
}

static void *race(void *arg) {
  struct reg_cache *c = arg;
  for (int i = 0; i < 20000; i++) reg_cache_put(c, get(c, 2048, 256, 1));
  return NULL;
}

static void test_threads(void **state) {
  struct reg_cache *c = *state;
  pthread_t t[4];
  for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, race, c), 0);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  struct reg_cache_counts k;
  reg_cache_counts(c, &k);
  assert_int_equal(k.made + k.reused, 80000);
  assert_int_equal(k.held, 1); /* those that lost a race went with their op */
  assert_int_equal(atomic_load(&registered) - atomic_load(&deregistered), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_kept_until_forgotten, setup, teardown),
      cmocka_unit_test_setup_teardown(test_forgotten_in_use, setup, teardown),
      cmocka_unit_test_setup_teardown(test_only_overlaps_forgotten, setup, teardown),
      cmocka_unit_test_setup_teardown(test_not_kept, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
      cmocka_unit_test(test_freed_in_use),
      cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
