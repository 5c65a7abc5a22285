/* libccs-alloc: large mallocs on memory the daemon can map, so collectives
 * on a program's own buffers (malloc, calloc, NumPy arrays, C++ vectors)
 * run zero copy, as on ccs_mem_alloc's, instead of being staged:
 *
 *   LD_PRELOAD=libccs-alloc.so ./program
 *
 * Blocks of CCS_ALLOC_MIN_BYTES (default 1 MiB) and more come from sealed
 * memfds (libccs registers each with the daemon on its first collective);
 * smaller ones, and every allocation libccs makes itself, from the C
 * library. A forked child gets a private copy of every block, as fork
 * gives of any memory. Freeing, growing, aligning and asking the size of
 * either kind work as the C library's calls do. */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ccs.h"

/* libccs's side (mem.c), for this library only */
void *ccs_interpose_alloc(size_t bytes);
size_t ccs_interpose_size(const void *ptr);
int ccs_interpose_free(void *ptr);
void ccs_interpose_fork(int phase);

/* the C library's allocator, reached without dlsym (which allocates) */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

#define PAGE 4096u

static size_t min_bytes = (size_t)1 << 20;
static __thread int inside; /* libccs allocating for a block: the C library serves it */

static void fork_prepare(void) { ccs_interpose_fork(0); }
static void fork_parent(void) { ccs_interpose_fork(1); }
static void fork_child(void) { ccs_interpose_fork(2); }

__attribute__((constructor)) static void start(void) {
  const char *v = getenv("CCS_ALLOC_MIN_BYTES");
  char *end;
  unsigned long long n = v && *v ? strtoull(v, &end, 10) : 0;
  if (v && *v && !*end && n >= PAGE) min_bytes = (size_t)n;
  pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* Only page-aligned pointers can be blocks: the rest go straight to the C
 * library without a look at the table. */
static size_t block_size(const void *p) {
  return p && ((uintptr_t)p & (PAGE - 1)) == 0 ? ccs_interpose_size(p) : 0;
}

static void *block(size_t n) {
  if (n < min_bytes || inside) return NULL;
  inside = 1;
  void *p = ccs_interpose_alloc(n);
  inside = 0;
  return p;
}

void *malloc(size_t n) {
  void *p = block(n);
  return p ? p : __libc_malloc(n);
}

void *calloc(size_t count, size_t size) {
  size_t n;
  if (__builtin_mul_overflow(count, size, &n)) {
    errno = ENOMEM;
    return NULL;
  }
  void *p = block(n); /* a fresh memfd reads as zeros */
  return p ? p : __libc_calloc(count, size);
}

void free(void *p) {
  if (!inside && block_size(p) && ccs_interpose_free(p) == 0) return;
  __libc_free(p);
}

void *realloc(void *p, size_t n) {
  if (inside) return __libc_realloc(p, n); /* libc's own (libccs's table, under its lock) */
  if (!p) return malloc(n);
  size_t old = block_size(p);
  if (!old) {
    if (n < min_bytes) return __libc_realloc(p, n);
    void *q = block(n); /* grown into a block: the old contents move over */
    if (!q) return __libc_realloc(p, n);
    size_t had = malloc_usable_size(p);
    memcpy(q, p, had < n ? had : n);
    __libc_free(p);
    return q;
  }
  if (n == 0) {
    free(p);
    return NULL;
  }
  if (n <= old && n >= old / 2) return p; /* fits, and not mostly wasted */
  void *q = malloc(n);
  if (!q) return NULL;
  memcpy(q, p, old < n ? old : n);
  free(p);
  return q;
}

void *reallocarray(void *p, size_t count, size_t size) {
  size_t n;
  if (__builtin_mul_overflow(count, size, &n)) {
    errno = ENOMEM;
    return NULL;
  }
  return realloc(p, n);
}

/* Blocks are page-aligned: any alignment up to a page is one. */
void *memalign(size_t align, size_t n) {
  void *p = align <= PAGE ? block(n) : NULL;
  return p ? p : __libc_memalign(align, n);
}

int posix_memalign(void **ret, size_t align, size_t n) {
  if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
  void *p = memalign(align, n);
  if (!p) return ENOMEM;
  *ret = p;
  return 0;
}

void *aligned_alloc(size_t align, size_t n) { return memalign(align, n); }
void *valloc(size_t n) { return memalign(PAGE, n); }
void *pvalloc(size_t n) { return memalign(PAGE, (n + PAGE - 1) & ~(size_t)(PAGE - 1)); }

size_t malloc_usable_size(void *p) {
  static size_t (*libc_usable)(void *); /* the C library's own, which this one hides */
  size_t size = block_size(p);
  if (size || !p) return size;
  if (!libc_usable) libc_usable = (size_t(*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
  return libc_usable ? libc_usable(p) : 0;
}
