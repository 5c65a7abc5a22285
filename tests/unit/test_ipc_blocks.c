/* A session's legacy CUDA IPC blocks (front/ipc_blocks.c), with made-up
 * addresses: a second buffer of an open block is a view into it (never a
 * second open), bounds run from a buffer's own start to its block's end,
 * a block is closed with its last buffer (also after its session went),
 * ranges that do not fit are never served from a block, and a block whose
 * buffers were all deregistered is found no more while ops hold it, but
 * taken up again where the driver says it is still the one there. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "front/ipc_blocks.h"

static int closes;
static void *closed;
static void fake_close(void *opened) {
  closes++;
  closed = opened;
}

#define MIB (1u << 20)

static void test_second_buffer_of_a_block(void **state) {
  (void)state;
  struct list blocks;
  list_init(&blocks);
  static char here[2 * MIB]; /* the block as mapped in the daemon */
  char *ptr;
  closes = 0;
  /* client allocation A at 0x7000100000 lies 1 MiB + 4 KiB into its block */
  uint64_t a = 0x7000100000ull + 4096;
  assert_null(ccsd_ipc_block_find(&blocks, a, 4096, 0, &ptr)); /* nothing open yet */
  struct ipc_block *b = ccsd_ipc_block_add(&blocks, a, here + MIB + 4096, here, 2 * MIB, 3);
  assert_non_null(b);
  assert_int_equal(b->device, 3);
  assert_int_equal(ccsd_ipc_block_fit(b, here + MIB + 4096, 4096), 4096);
  /* more than the block holds from there: cut at its end */
  assert_int_equal(ccsd_ipc_block_fit(b, here + MIB + 4096, 4 * MIB), MIB - 4096);
  /* allocation B at the block's start: found, a view at the block's start */
  struct ipc_block *same = ccsd_ipc_block_find(&blocks, a - MIB - 4096, 8192, 0, &ptr);
  assert_ptr_equal(same, b);
  assert_ptr_equal(ptr, here);
  assert_int_equal(b->refs, 2);
  /* C ends exactly at the block's end: found; D runs past it, E starts before it: not */
  assert_ptr_equal(ccsd_ipc_block_find(&blocks, a - MIB - 4096 + 2 * MIB - 512, 512, 0, &ptr), b);
  assert_ptr_equal(ptr, here + 2 * MIB - 512);
  assert_null(ccsd_ipc_block_find(&blocks, a - MIB - 4096 + 2 * MIB - 512, 513, 0, &ptr));
  assert_null(ccsd_ipc_block_find(&blocks, a - MIB - 4096 - 1, 16, 0, &ptr));
  assert_null(ccsd_ipc_block_find(&blocks, UINT64_MAX - 8, 16, 0, &ptr));
  /* three buffers: closed with the last */
  for (int i = 0; i < 3; i++) ccsd_ipc_block_deregistered(b);
  ccsd_ipc_block_unref(b, fake_close);
  ccsd_ipc_block_unref(b, fake_close);
  assert_int_equal(closes, 0);
  ccsd_ipc_block_unref(b, fake_close);
  assert_int_equal(closes, 1);
  assert_ptr_equal(closed, here + MIB + 4096); /* what the open gave */
  assert_true(list_empty(&blocks));
}

static void test_open_outside_its_range(void **state) {
  (void)state;
  struct list blocks;
  list_init(&blocks);
  static char here[2 * MIB];
  /* the driver's range does not hold what the open gave: refused */
  assert_null(ccsd_ipc_block_add(&blocks, 0x10000, here + MIB, here, MIB, 0));
  assert_null(ccsd_ipc_block_add(&blocks, 0x10000, here, here + 1, MIB, 0));
  /* a client address below its own offset into the block: refused */
  assert_null(ccsd_ipc_block_add(&blocks, 16, here + 4096, here, MIB, 0));
  assert_true(list_empty(&blocks));
}

static void test_session_gone(void **state) {
  (void)state;
  struct list blocks;
  list_init(&blocks);
  static char here[MIB];
  char *ptr;
  closes = 0;
  struct ipc_block *b = ccsd_ipc_block_add(&blocks, 0x20000, here, here, MIB, 0);
  assert_non_null(ccsd_ipc_block_find(&blocks, 0x20000, 64, 0, &ptr));
  ccsd_ipc_block_deregistered(b); /* the session's buffers deregistered */
  ccsd_ipc_block_deregistered(b);
  ccsd_ipc_blocks_detach(&blocks); /* its buffers live on in ops in flight */
  assert_true(list_empty(&blocks));
  assert_null(ccsd_ipc_block_find(&blocks, 0x20000, 64, 0, &ptr));
  ccsd_ipc_block_unref(b, fake_close);
  assert_int_equal(closes, 0);
  ccsd_ipc_block_unref(b, fake_close);
  assert_int_equal(closes, 1);
}

/* The client frees its allocation once its last buffer there is
 * deregistered, while an op still holds the block here; the driver may
 * then give the same addresses to a new block. */
static void test_block_retired(void **state) {
  (void)state;
  struct list blocks;
  list_init(&blocks);
  static char old[MIB], fresh[MIB];
  char *ptr;
  closes = 0;
  struct ipc_block *b = ccsd_ipc_block_add(&blocks, 0x30000, old, old, MIB, 0);
  ccsd_ipc_block_find(&blocks, 0x30000, 64, 0, &ptr)->refs++; /* an op holds the buffer */
  ccsd_ipc_block_deregistered(b);
  ccsd_ipc_block_deregistered(b);
  ccsd_ipc_block_unref(b, fake_close); /* the first buffer goes */
  ccsd_ipc_block_unref(b, fake_close); /* the second's registration goes; the op holds it */
  assert_int_equal(closes, 0);
  /* not found for a new registration there: the new handle is opened */
  assert_null(ccsd_ipc_block_find(&blocks, 0x30000, 64, 0, &ptr));
  struct ipc_block *n = ccsd_ipc_block_add(&blocks, 0x30000, fresh, fresh, MIB, 0);
  assert_ptr_equal(ccsd_ipc_block_find(&blocks, 0x30000 + 64, 64, 0, &ptr), n);
  assert_ptr_equal(ptr, fresh + 64);
  /* the new block's buffers go too: where the driver says a handle's
   * block is open here already, the latest retired block there is it */
  for (int i = 0; i < 2; i++) ccsd_ipc_block_deregistered(n);
  ccsd_ipc_block_unref(n, fake_close);
  n->refs++; /* an op holds it */
  ccsd_ipc_block_unref(n, fake_close);
  assert_ptr_equal(ccsd_ipc_block_find(&blocks, 0x30000, 64, 1, &ptr), n);
  assert_ptr_equal(ptr, fresh);
  assert_int_equal(n->regs, 1);
  assert_null(ccsd_ipc_block_find(&blocks, 0x30000 + MIB, 64, 1, &ptr)); /* past its end */
  /* the op ends: the old block closes; the taken-up one lives on */
  ccsd_ipc_block_unref(b, fake_close);
  assert_int_equal(closes, 1);
  assert_ptr_equal(closed, old);
  assert_ptr_equal(ccsd_ipc_block_find(&blocks, 0x30000, 64, 0, &ptr), n);
  for (int i = 0; i < 2; i++) ccsd_ipc_block_deregistered(n);
  for (int i = 0; i < 3; i++) ccsd_ipc_block_unref(n, fake_close);
  assert_int_equal(closes, 2);
  assert_true(list_empty(&blocks));
}

/* "Already mapped" says the block is open here, not which: only the
 * block opened last at those addresses can be it, and only a retired one
 * that holds the whole range is taken up. */
static void test_revive_only_the_latest(void **state) {
  (void)state;
  struct list blocks;
  list_init(&blocks);
  static char old[2 * MIB], live[MIB];
  char *ptr;
  closes = 0;
  struct ipc_block *b = ccsd_ipc_block_add(&blocks, 0x40000, old, old, 2 * MIB, 0);
  b->refs++; /* an op holds it */
  ccsd_ipc_block_deregistered(b);
  ccsd_ipc_block_unref(b, fake_close);
  struct ipc_block *n = ccsd_ipc_block_add(&blocks, 0x40000, live, live, MIB, 0);
  /* 1.5 MiB there: the live block is too small, the old one is not it */
  assert_null(ccsd_ipc_block_find(&blocks, 0x40000, MIB + MIB / 2, 0, &ptr));
  assert_null(ccsd_ipc_block_find(&blocks, 0x40000, MIB + MIB / 2, 1, &ptr));
  ccsd_ipc_block_deregistered(n);
  ccsd_ipc_block_deregistered(n); /* (once too often: no harm) */
  assert_int_equal(n->regs, 0);
  /* retired both: the latest there, and only for what it holds */
  assert_null(ccsd_ipc_block_find(&blocks, 0x40000, MIB + 1, 1, &ptr));
  assert_ptr_equal(ccsd_ipc_block_find(&blocks, 0x40000, MIB, 1, &ptr), n);
  assert_ptr_equal(ptr, live);
  ccsd_ipc_block_deregistered(n);
  ccsd_ipc_block_unref(n, fake_close);
  ccsd_ipc_block_unref(n, fake_close);
  ccsd_ipc_block_unref(b, fake_close);
  assert_int_equal(closes, 2);
  assert_true(list_empty(&blocks));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_second_buffer_of_a_block),
      cmocka_unit_test(test_open_outside_its_range),
      cmocka_unit_test(test_session_gone),
      cmocka_unit_test(test_block_retired),
      cmocka_unit_test(test_revive_only_the_latest),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
