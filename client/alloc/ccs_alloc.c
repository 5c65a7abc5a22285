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
#include <sys/resource.h>

#include "ccs.h"

/* libccs's side (mem.c), for this library only */
void *ccs_interpose_alloc(size_t bytes);
int ccs_interpose_free(void *ptr);
void ccs_interpose_fork(int phase);

/* the C library's allocator, reached without dlsym (which allocates) */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

#define PAGE 4096u
#define TOMB ((uintptr_t)1)

static size_t min_bytes = (size_t)1 << 20;
/* Each block holds a file descriptor (libccs passes it to the daemon on
 * first use): at most a quarter of the process's limit are blocks. */
static size_t max_blocks = 256;
/* libccs allocating for a block: the C library serves it (initial-exec:
 * reading it never allocates) */
static __thread int inside __attribute__((tls_model("initial-exec")));

/* The blocks alive, by address: a table of this library's own, under a
 * lock of its own, so that a free() made while libccs holds its lock
 * never waits for it. Open addressing over the page number. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct slot {
  uintptr_t p; /* 0: empty, TOMB: was one */
  size_t size;
} *tab;
static size_t cap, filled, live; /* slots; used or tombs; blocks */

static size_t home(uintptr_t p, size_t n) { return (size_t)((p / PAGE) * 0x9E3779B97F4A7C15ull) & (n - 1); }

/* Under mu: the slot of p, or the empty one it would take (NULL: none). */
static struct slot *find(uintptr_t p) {
  for (size_t i = home(p, cap), k = 0; tab && k < cap; i = (i + 1) & (cap - 1), k++)
    if (tab[i].p == p || tab[i].p == 0) return &tab[i];
  return NULL;
}

/* Under mu: room for one more (tombs dropped), or -1. */
static int make_room(void) {
  if (tab && 2 * (filled + 1) <= cap) return 0;
  size_t n = cap ? (2 * (live + 1) <= cap / 2 ? cap : 2 * cap) : 64;
  struct slot *old = tab, *grown = __libc_calloc(n, sizeof(*grown));
  size_t was = cap;
  if (!grown) return -1;
  tab = grown, cap = n, filled = 0;
  for (size_t i = 0; i < was; i++)
    if (old[i].p > TOMB) {
      *find(old[i].p) = old[i];
      filled++;
    }
  __libc_free(old);
  return 0;
}

/* The block at p: its size, taken out of the table when take; 0: none. */
static size_t lookup(const void *p, int take) {
  if (!p || ((uintptr_t)p & (PAGE - 1))) return 0; /* blocks are page-aligned: the rest never are */
  pthread_mutex_lock(&mu);
  struct slot *s = find((uintptr_t)p);
  size_t size = s && s->p == (uintptr_t)p ? s->size : 0;
  if (size && take) {
    s->p = TOMB;
    live--;
  }
  pthread_mutex_unlock(&mu);
  return size;
}

static void fork_prepare(void) {
  ccs_interpose_fork(0); /* libccs's lock first: a free() under it takes ours */
  pthread_mutex_lock(&mu);
}
static void fork_parent(void) {
  pthread_mutex_unlock(&mu);
  ccs_interpose_fork(1);
}
static void fork_child(void) {
  pthread_mutex_unlock(&mu);
  ccs_interpose_fork(2);
}

__attribute__((constructor)) static void start(void) {
  const char *v = getenv("CCS_ALLOC_MIN_BYTES");
  char *end;
  unsigned long long n = v && *v ? strtoull(v, &end, 10) : 0;
  if (v && *v && !*end && n >= PAGE) min_bytes = (size_t)n;
  struct rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    max_blocks = r.rlim_cur / 4 < 16 ? 16 : r.rlim_cur / 4;
  pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static void *block(size_t n) {
  if (n < min_bytes || inside) return NULL;
  pthread_mutex_lock(&mu);
  int room = live < max_blocks && make_room() == 0;
  if (room) live++; /* held for it */
  pthread_mutex_unlock(&mu);
  if (!room) return NULL;
  inside = 1;
  void *p = ccs_interpose_alloc(n);
  inside = 0;
  pthread_mutex_lock(&mu);
  if (p && make_room() == 0) { /* (others may have filled what was there) */
    struct slot *s = find((uintptr_t)p);
    if (s->p == 0) filled++;
    *s = (struct slot){(uintptr_t)p, (n + PAGE - 1) & ~(size_t)(PAGE - 1)};
    pthread_mutex_unlock(&mu);
    return p;
  }
  live--;
  pthread_mutex_unlock(&mu);
  if (p) ccs_interpose_free(p); /* no room to keep track of it */
  return NULL;
}

static size_t block_size(const void *p) { return lookup(p, 0); }

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
  if (lookup(p, 1)) ccs_interpose_free(p);
  else __libc_free(p);
}

void *realloc(void *p, size_t n) {
  if (inside) return __libc_realloc(p, n); /* libccs's own, for a block */
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
