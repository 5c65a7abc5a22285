/* Registrations kept between ops: a buffer's memory is registered with the
 * transport (pinned and keyed, with verbs) on its first op across daemons
 * and found again by its later ops, until its owner says the mapping went
 * (reg_cache_forget): only then may the same addresses be registered anew.
 * A registration kept past its mapping would let the network write pages
 * that are no longer the buffer's, so only ranges whose owner promises to
 * say so are kept (keep = 1); the others are registered per op. Either
 * thread may call in (one lock). */
#ifndef CCS_REGCACHE_H
#define CCS_REGCACHE_H
#include <stddef.h>
#include <stdint.h>

#include "transport.h"

struct reg_cache;
struct reg_entry;

struct reg_cache_counts {
  uint64_t made, reused; /* registrations made with the transport; gets served by a kept one */
  uint64_t held;         /* registrations alive now (in use, or kept) */
};

struct reg_cache *reg_cache_new(const struct transport_ops *ops, struct transport *t);
/* Kept registrations go; those in use go at their last put. */
void reg_cache_free(struct reg_cache *c);
/* The registration of exactly [base, base + len): a kept one, or made now
 * (kept after its last put when keep). NULL with err when the transport
 * refused. */
struct reg_entry *reg_cache_get(struct reg_cache *c, void *base, size_t len, int keep, char *err,
                                size_t errlen);
struct tmem *reg_entry_mem(const struct reg_entry *e);
/* An op is through with e. */
void reg_cache_put(struct reg_cache *c, struct reg_entry *e);
/* The mapping of [base, base + len) goes: registrations that overlap it
 * are not served again, and are deregistered (now, or at their last put). */
void reg_cache_forget(struct reg_cache *c, const void *base, size_t len);
void reg_cache_counts(struct reg_cache *c, struct reg_cache_counts *out);

#endif
