#ifndef CCSD_PLAN_POOL_H
#define CCSD_PLAN_POOL_H

#include <stddef.h>

/* Scratch memory kept between ops: fresh large allocations cost a page
 * fault per page on first touch, which dominates an op that receives tens
 * of MiB from other daemons. One thread at a time (the loop's). */
struct engine_pool;
struct engine_pool *engine_pool_new(size_t keep_bytes);
/* The same over another kind of memory (a GPU's). */
struct engine_pool *engine_pool_new_with(size_t keep_bytes, void *(*alloc)(size_t bytes, void *ctx),
                                         void (*release)(void *mem, void *ctx), void *ctx);
void engine_pool_free(struct engine_pool *pool);
/* engine_pool_new's kind of memory (malloc), for pools that wrap it. */
void *engine_pool_host_alloc(size_t bytes, void *ctx);
void engine_pool_host_release(void *mem, void *ctx);
/* Memory of at least bytes (*got: how much), from the kept blocks or new;
 * pool NULL: malloc. */
void *engine_pool_get(struct engine_pool *pool, size_t bytes, size_t *got);
/* Kept for the next op, or given back. */
void engine_pool_put(struct engine_pool *pool, void *mem, size_t bytes);

#endif
