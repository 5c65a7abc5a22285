/* Scratch memory kept between ops (pool.h). */
#include "plan/pool.h"

#include <stdlib.h>

struct pool_block {
  struct pool_block *next;
  size_t bytes;
  void *mem;
};

struct engine_pool {
  struct pool_block *blocks;
  size_t kept, keep;
  void *(*alloc)(size_t bytes, void *ctx);
  void (*release)(void *mem, void *ctx);
  void *ctx;
};

void *engine_pool_host_alloc(size_t bytes, void *ctx) { return malloc(bytes ? bytes : 1); }
void engine_pool_host_release(void *mem, void *ctx) { free(mem); }

struct engine_pool *engine_pool_new_with(size_t keep_bytes, void *(*alloc)(size_t, void *),
                                         void (*release)(void *, void *), void *ctx) {
  struct engine_pool *pool = calloc(1, sizeof(*pool));
  if (pool) *pool = (struct engine_pool){NULL, 0, keep_bytes, alloc, release, ctx};
  return pool;
}

struct engine_pool *engine_pool_new(size_t keep_bytes) {
  return engine_pool_new_with(keep_bytes, engine_pool_host_alloc, engine_pool_host_release, NULL);
}

void engine_pool_free(struct engine_pool *pool) {
  if (!pool) return;
  for (struct pool_block *b = pool->blocks, *next; b; b = next) {
    next = b->next;
    pool->release(b->mem, pool->ctx);
    free(b);
  }
  free(pool);
}

/* The smallest kept block that fits without wasting half of it. */
void *engine_pool_get(struct engine_pool *pool, size_t bytes, size_t *got) {
  struct pool_block **best = NULL;
  for (struct pool_block **b = pool ? &pool->blocks : NULL; b && *b; b = &(*b)->next)
    if ((*b)->bytes >= bytes && (*b)->bytes / 2 <= bytes && (!best || (*b)->bytes < (*best)->bytes))
      best = b;
  if (!best) {
    *got = bytes;
    return pool ? pool->alloc(bytes, pool->ctx) : engine_pool_host_alloc(bytes, NULL);
  }
  struct pool_block *blk = *best;
  void *mem = blk->mem;
  *best = blk->next;
  *got = blk->bytes;
  pool->kept -= blk->bytes;
  free(blk);
  return mem;
}

/* Kept for the next op; the smallest kept blocks make room for it (ops of
 * one size in a row then fault in no fresh page after the first). */
void engine_pool_put(struct engine_pool *pool, void *mem, size_t bytes) {
  while (pool && bytes <= pool->keep && pool->kept + bytes > pool->keep) {
    struct pool_block **smallest = &pool->blocks;
    for (struct pool_block **b = &pool->blocks; *b; b = &(*b)->next)
      if ((*b)->bytes < (*smallest)->bytes) smallest = b;
    struct pool_block *gone = *smallest;
    *smallest = gone->next;
    pool->kept -= gone->bytes;
    pool->release(gone->mem, pool->ctx);
    free(gone);
  }
  struct pool_block *blk = pool && pool->kept + bytes <= pool->keep ? malloc(sizeof(*blk)) : NULL;
  if (!blk) {
    if (pool) pool->release(mem, pool->ctx);
    else engine_pool_host_release(mem, NULL);
    return;
  }
  *blk = (struct pool_block){pool->blocks, bytes, mem};
  pool->blocks = blk;
  pool->kept += bytes;
}
