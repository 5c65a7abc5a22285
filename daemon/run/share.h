/* What the run layer knows of each tenant (uid): its weight and cap, set
 * from the configuration by the layer above (and again on a reload), and
 * what it was given: executor time, bytes sent to other daemons, work
 * queued on GPUs, and how long its ops waited before they started. One
 * record per uid for the daemon's life (as the metrics' op counters): an
 * op holds a pointer to its tenant's (run_op.share) without a reference,
 * and anyone may read a record at any time. */
#ifndef CCSD_RUN_SHARE_H
#define CCSD_RUN_SHARE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <uthash.h>

/* Queue waits, seconds: 1 us .. 10 s, then +Inf. */
#define RUN_WAIT_BUCKETS 8
extern const double ccsd_run_wait_bounds[RUN_WAIT_BUCKETS];

struct run_share {
  UT_hash_handle hh;
  uid_t uid;
  _Atomic double weight, cap; /* cap: (0, 1]; 1 uncapped */
  _Atomic uint64_t exec_ns;   /* executor threads' time on its tasks */
  _Atomic uint64_t net_bytes; /* sent to other daemons */
  _Atomic uint64_t gpu_ops, gpu_bytes; /* queued on GPUs */
  _Atomic uint64_t requests;  /* requests and ring calls taken (the control path) */
  _Atomic uint64_t waits[RUN_WAIT_BUCKETS], wait_count, wait_ns; /* ops' waits to start */
};

/* The weights from the configuration: uid -> weight, everyone else 1. */
#define RUN_SHARE_RULES_MAX 256
struct run_share_rules {
  int n;
  uid_t uid[RUN_SHARE_RULES_MAX];
  double weight[RUN_SHARE_RULES_MAX];
  double max_share; /* every tenant's cap */
};

struct run_shares {
  pthread_mutex_t mu;
  struct run_share *by_uid;
  struct run_share_rules rules;
  struct run_share fallback; /* for tenants whose record found no memory */
};

void ccsd_run_shares_init(struct run_shares *s);
void ccsd_run_shares_close(struct run_shares *s);
/* New rules: every record takes its weight and cap from them now. */
void ccsd_run_shares_configure(struct run_shares *s, const struct run_share_rules *rules);
/* uid's record (made under the current rules): never NULL. */
struct run_share *ccsd_run_share_of(struct run_shares *s, uid_t uid);
/* fn(arg, record) for every record, under the registry's lock. */
void ccsd_run_shares_each(struct run_shares *s, void (*fn)(void *arg, const struct run_share *r),
                          void *arg);
/* An op of r's waited this long before it started. */
void ccsd_run_share_waited(struct run_share *r, uint64_t ns);

#endif
