/* Weighted fair sharing of one resource between tenants: executor
 * threads' time, a link's bytes, a GPU's submissions. Start-time fair
 * queueing over virtual time: each tenant (a flow) has a virtual time,
 * the service it was given divided by its weight, and whoever may go
 * next with the least virtual time goes. Over any interval in which two
 * flows always had work, their services differ from their weights' ratio
 * by at most one largest job each (plus, for a flow that came back, the
 * one quantum below).
 *
 * Within a flow three classes share its service the same way, with fixed
 * weights (latency 4, normal 2, bulk 1): a latency job that arrives goes
 * ahead of its tenant's bulk work, and backlogged bulk work still gets at
 * least a seventh of its tenant's share.
 *
 * A flow that had nothing to do does not bank the service it missed:
 * when it goes again its virtual time is raised to within one quantum of
 * the others'. A flow whose work could not go for a moment (its jobs
 * waited for inputs, or its next job came a moment after the last one
 * ended: within FAIR_IDLE_GRACE_NS) is still busy: it keeps up to
 * FAIR_BUSY_QUANTA quanta of what it missed and catches up. A flow may be
 * capped to a fraction of the resource's capacity (a token bucket), which
 * holds even when nobody else wants the resource.
 *
 * The caller keeps its own queues and locking; this keeps the accounts
 * and says who goes. Costs are in the resource's own units (ns, bytes). */
#ifndef CCSD_BASE_FAIR_H
#define CCSD_BASE_FAIR_H

#include <stddef.h>
#include <stdint.h>
#include <uthash.h>

#include "base/list.h"

enum fair_class { FAIR_LATENCY, FAIR_NORMAL, FAIR_BULK };
#define FAIR_CLASSES 3
#define FAIR_IDLE_GRACE_NS 2000000ull
#define FAIR_BUSY_QUANTA 4

struct fair_flow {
  struct list link;   /* in fair.flows, by virtual time */
  UT_hash_handle hh;  /* in fair.by_key */
  uint64_t key;       /* the tenant's uid */
  double weight;      /* > 0 */
  double cap;         /* (0, 1]: the most of the capacity it may take; 1: uncapped */
  double vtime;       /* service / weight */
  double class_vtime[FAIR_CLASSES], class_vnow;
  double tokens;      /* capped: the bucket, in cost units */
  uint64_t tokens_ns; /* when it was last filled */
  int refs;           /* the caller's: jobs queued or in service */
  uint64_t idle_ns;   /* when refs last fell to 0 */
  struct list items[FAIR_CLASSES]; /* the caller's queues, if it wants them here */
  void *user;
};

struct fair {
  struct list flows;
  struct fair_flow *by_key;
  double vnow;     /* the virtual time of the last flow that went */
  double quantum;  /* the most service a flow that comes back gets ahead */
  double capacity; /* cost units per second (caps); 0: unknown, caps not applied */
};

void fair_init(struct fair *f, double quantum, double capacity);
/* Frees every flow (the caller's queues must be empty). */
void fair_close(struct fair *f);

/* The flow of key, made one quantum behind the others (weight 1,
 * uncapped) if there is none; NULL: no memory. A flow lives while it
 * holds references, and after as long as it has something to remember:
 * it owes service (it is ahead, or its bucket is empty) or was busy a
 * moment ago. Picks free the others. */
struct fair_flow *fair_flow_get(struct fair *f, uint64_t key);
void fair_flow_set(struct fair_flow *fl, double weight, double cap);
void fair_ref(struct fair_flow *fl);
void fair_unref(struct fair_flow *fl, uint64_t now_ns);

/* Who goes next: of the flows whose cap lets them go at now_ns, by least
 * virtual time, and within a flow its classes by theirs, the first for
 * which can(ctx, flow, class) says 1. NULL: nobody; *retry_ns then says
 * when a capped flow may go again (0: no capped flow waits). */
struct fair_flow *fair_pick(struct fair *f, uint64_t now_ns,
                            int (*can)(void *ctx, struct fair_flow *fl, int cls), void *ctx,
                            int *ret_cls, uint64_t *retry_ns);
/* fl's class cls was given cost units of service (negative: an estimate
 * charged before was too high). */
void fair_charge(struct fair *f, struct fair_flow *fl, int cls, double cost);

/* "latency", "normal", "bulk" */
const char *fair_class_name(int cls);

#endif
