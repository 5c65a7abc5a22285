/* libccs-alloc (client/alloc/ccs_alloc.c), linked into this program ahead
 * of the C library as LD_PRELOAD would put it: blocks of 1 MiB and more
 * come from ccs's memfds, smaller ones from the C library, and every entry
 * point (malloc, calloc, realloc, reallocarray, free, memalign,
 * posix_memalign, aligned_alloc, valloc, pvalloc, malloc_usable_size)
 * keeps its contract for both, from several threads at once; a forked
 * child gets a private copy; and collectives on malloc'd, calloc'd and
 * realloc'd buffers run zero copy (the staging area is kept too small to
 * stage them) with every element checked, on 1-3 ranks; a block the
 * daemon refuses (a quota) is staged instead. */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ccs.h"
#include "harness.h"

#define MIB ((size_t)1 << 20)

/* Whether the mapping holding p is one of ccs's memfds (/proc/self/maps). */
static int on_memfd(const void *p) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  int found = -1;
  while (f && found < 0 && fgets(line, sizeof(line), f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)p >= lo && (uintptr_t)p < hi)
      found = strstr(line, "memfd:ccs") != NULL;
  }
  if (f) fclose(f);
  return found;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31 + seed);
}

static int filled(const unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)(i * 31 + seed)) return 0;
  return 1;
}

static void test_entry_points(void **state) {
  (void)state;
  unsigned char *big = malloc(2 * MIB + 5), *small = malloc(100);
  assert_non_null(big);
  assert_non_null(small);
  assert_int_equal((uintptr_t)big & 4095, 0);
  assert_int_equal(on_memfd(big), 1);
  assert_int_equal(on_memfd(small), 0);
  assert_int_equal(malloc_usable_size(big), 2 * MIB + 4096);
  assert_true(malloc_usable_size(small) >= 100);
  fill(big, 2 * MIB + 5, 1);
  fill(small, 100, 2);

  /* realloc: small grown into a block, a block grown, shrunk a little (in
   * place), shrunk a lot (into the C library), and to nothing */
  small = realloc(small, 3 * MIB);
  assert_int_equal(on_memfd(small), 1);
  assert_true(filled(small, 100, 2));
  big = realloc(big, 5 * MIB);
  assert_int_equal(on_memfd(big), 1);
  assert_true(filled(big, 2 * MIB + 5, 1));
  uintptr_t was = (uintptr_t)big;
  big = realloc(big, 4 * MIB);
  assert_int_equal((uintptr_t)big, was); /* in place */
  big = realloc(big, 1000);
  assert_int_equal(on_memfd(big), 0);
  assert_true(filled(big, 1000, 1));
  assert_null(realloc(small, 0));
  free(big);

  /* calloc: zeros either way, an overflow refused */
  unsigned char *z = calloc(MIB, 3);
  assert_int_equal(on_memfd(z), 1);
  for (size_t i = 0; i < 3 * MIB; i++) assert_int_equal(z[i], 0);
  free(z);
  z = calloc(10, 10);
  for (int i = 0; i < 100; i++) assert_int_equal(z[i], 0);
  free(z);
  volatile size_t huge = SIZE_MAX / 2; /* (the compiler would see through a constant) */
  errno = 0;
  assert_null(calloc(huge, 4));
  assert_int_equal(errno, ENOMEM);
  errno = 0;
  assert_null(reallocarray(NULL, huge, 4));
  assert_int_equal(errno, ENOMEM);
  void *arr = reallocarray(NULL, MIB, 2);
  assert_int_equal(on_memfd(arr), 1);
  free(arr);

  /* alignments: a page or less from a block, more from the C library */
  void *a = NULL;
  assert_int_equal(posix_memalign(&a, 64, 2 * MIB), 0);
  assert_int_equal(on_memfd(a), 1);
  free(a);
  assert_int_equal(posix_memalign(&a, 1 << 16, 2 * MIB), 0);
  assert_int_equal((uintptr_t)a & 0xffff, 0);
  assert_int_equal(on_memfd(a), 0);
  free(a);
  assert_int_equal(posix_memalign(&a, 3, 2 * MIB), EINVAL);
  void *b[4] = {aligned_alloc(4096, 2 * MIB), memalign(256, MIB), valloc(MIB), pvalloc(MIB + 1)};
  for (int i = 0; i < 4; i++) {
    assert_non_null(b[i]);
    assert_int_equal((uintptr_t)b[i] & 4095, 0);
    assert_int_equal(on_memfd(b[i]), 1);
    free(b[i]);
  }
  free(NULL);
}

/* Each block holds a file descriptor: a quarter of the process's limit
 * at most are blocks, the rest come from the C library. */
static void test_blocks_bounded(void **state) {
  (void)state;
  struct rlimit r;
  assert_int_equal(getrlimit(RLIMIT_NOFILE, &r), 0);
  size_t cap = r.rlim_cur == RLIM_INFINITY ? SIZE_MAX : r.rlim_cur / 4 < 16 ? 16 : r.rlim_cur / 4;
  enum { N = 300 };
  void *p[N];
  size_t blocks = 0;
  for (int i = 0; i < N; i++) {
    assert_non_null(p[i] = malloc(MIB));
    memset(p[i], i, MIB);
    blocks += on_memfd(p[i]) == 1;
  }
  assert_int_equal(blocks, N < cap ? N : cap);
  for (int i = 0; i < N; i++) free(p[i]);
  void *again = malloc(MIB); /* and freed blocks count no more */
  assert_int_equal(on_memfd(again), 1);
  free(again);
}

static void *churn(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void *kept[8] = {0};
  for (int i = 0; i < 400; i++) {
    int k = (int)((seed = seed * 1103515245u + 12345u) >> 16) % 8;
    size_t n = (seed >> 8) % 3 == 0 ? MIB + (seed % 4096) : 64 + seed % 4000;
    if (kept[k] && !filled(kept[k], 64, (unsigned)k)) return (void *)1;
    free(kept[k]);
    kept[k] = malloc(n);
    if (!kept[k]) return (void *)1;
    fill(kept[k], 64, (unsigned)k);
  }
  for (int k = 0; k < 8; k++) free(kept[k]);
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  pthread_t t[4];
  for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(i + 1)), 0);
  for (int i = 0; i < 4; i++) {
    void *failed = NULL;
    pthread_join(t[i], &failed);
    assert_null(failed);
  }
}

/* fork gives the child a copy: neither sees the other's writes */
static void test_fork_copies(void **state) {
  (void)state;
  unsigned char *p = malloc(4 * MIB);
  fill(p, 4 * MIB, 7);
  pid_t pid = fork();
  if (pid == 0) {
    int ok = filled(p, 4 * MIB, 7) && on_memfd(p) == 0;
    memset(p, 0xee, 4 * MIB);
    free(p); /* the copy goes as any memory does */
    unsigned char *q = malloc(2 * MIB); /* and the child has blocks of its own */
    ok = ok && on_memfd(q) == 1;
    free(q);
    _exit(ok ? 0 : 1);
  }
  int status = -1;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_true(filled(p, 4 * MIB, 7));
  assert_int_equal(on_memfd(p), 1);
  free(p);
}

static ccs_unique_id_t id;

/* all_reduce on malloc'd floats, all_gather into calloc'd ones, broadcast
 * of a realloc'd block: exact small integers, every element checked */
static int rank_main(int rank, int n, void *arg) {
  (void)arg;
  enum { COUNT = 1 << 20 }; /* 4 MiB of floats */
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, id, rank) != CCS_OK) return 2;
  float *in = malloc(COUNT * sizeof(float)), *out = malloc(COUNT * sizeof(float));
  float *all = calloc((size_t)n * (COUNT / 4), sizeof(float));
  if (!in || !out || !all || on_memfd(in) != 1 || on_memfd(all) != 1) return 3;
  for (int i = 0; i < COUNT; i++) in[i] = (float)((i * 7 + rank * 13) % 1000);
  if (ccs_all_reduce(in, out, COUNT, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK) {
    fprintf(stderr, "rank %d: all_reduce: %s\n", rank, ccs_comm_last_error(comm));
    return 4;
  }
  for (int i = 0; i < COUNT; i++) {
    float want = 0;
    for (int r = 0; r < n; r++) want += (float)((i * 7 + r * 13) % 1000);
    if (out[i] != want) return 5;
  }
  if (ccs_all_gather(in, all, COUNT / 4, CCS_FLOAT32, comm, NULL) != CCS_OK) return 6;
  for (int r = 0; r < n; r++)
    for (int i = 0; i < COUNT / 4; i++)
      if (all[(size_t)r * (COUNT / 4) + i] != (float)((i * 7 + r * 13) % 1000)) return 7;
  float *grown = realloc(out, 2 * COUNT * sizeof(float));
  if (!grown || on_memfd(grown) != 1) return 8;
  if (rank == 0)
    for (int i = 0; i < 2 * COUNT; i++) grown[i] = (float)(i % 4099);
  if (ccs_broadcast(grown, grown, 2 * COUNT, CCS_FLOAT32, 0, comm, NULL) != CCS_OK) return 9;
  for (int i = 0; i < 2 * COUNT; i++)
    if (grown[i] != (float)(i % 4099)) return 10;
  ccs_comm_destroy(comm);
  free(in);
  free(grown);
  free(all);
  return 0;
}

static void test_collectives_zero_copy(void **state) {
  (void)state;
  struct test_daemon d;
  assert_int_equal(test_daemon_start(&d, NULL), 0);
  setenv("CCS_STAGING_MAX_BYTES", "65536", 1); /* a staged call of these sizes would fail */
  for (int n = 1; n <= 3; n++) {
    assert_int_equal(ccs_get_unique_id(&id), CCS_OK);
    assert_int_equal(test_run_ranks(n, rank_main, NULL, 120, NULL), 0);
  }
  unsetenv("CCS_STAGING_MAX_BYTES");
  assert_int_equal(test_daemon_stop(&d), 0);
}

/* A block the daemon will not take (its tenant's buffer quota is spent)
 * is staged as any malloc'd buffer: through the staging area a small
 * staged call made first. */
static int quota_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, id, rank) != CCS_OK) return 2;
  float small[1000], *x = malloc(MIB), *y = malloc(MIB);
  size_t count = MIB / sizeof(float);
  for (int i = 0; i < 1000; i++) small[i] = (float)i;
  for (size_t i = 0; i < count; i++) x[i] = y[i] = (float)(i % 100);
  if (ccs_all_reduce(small, small, 1000, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK || /* staged */
      ccs_all_reduce(x, x, count, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK ||         /* registered */
      ccs_all_reduce(y, y, count, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK ||         /* refused: staged */
      ccs_all_reduce(y, y, count, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, ccs_comm_last_error(comm));
    return 3;
  }
  for (int i = 0; i < 1000; i++)
    if (small[i] != (float)i) return 4;
  for (size_t i = 0; i < count; i++)
    if (x[i] != (float)(i % 100) || y[i] != (float)(i % 100)) return 5;
  ccs_comm_destroy(comm);
  free(x);
  free(y);
  return 0;
}

static void test_refused_blocks_staged(void **state) {
  (void)state;
  struct test_daemon d;
  static const char *const args[] = {"--quota_buffers", "2", NULL};
  assert_int_equal(test_daemon_start(&d, args), 0);
  assert_int_equal(ccs_get_unique_id(&id), CCS_OK);
  assert_int_equal(test_run_ranks(1, quota_rank, NULL, 60, NULL), 0);
  assert_int_equal(test_daemon_stop(&d), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_entry_points),
      cmocka_unit_test(test_blocks_bounded),
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_fork_copies),
      cmocka_unit_test(test_collectives_zero_copy),
      cmocka_unit_test(test_refused_blocks_staged),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
