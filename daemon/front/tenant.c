/* Tenants (one per uid) and their quotas. Every object a client can grow —
 * connections, communicators, registered bytes, ops in flight — is charged
 * to its tenant when made and released when freed; past the quota the
 * request fails with CCS_ERR_QUOTA and nothing else changes. A tenant
 * lives while anything is charged to it. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "front/front.h"

static const char *const counter_names[TENANT_COUNTERS] = {
    [TENANT_SESSIONS] = "connections",
    [TENANT_COMMS] = "communicators",
    [TENANT_REGISTERED_BYTES] = "registered bytes",
    [TENANT_OPS] = "ops in flight",
    [TENANT_RANKS] = "ranks",
    [TENANT_BUFFERS] = "registered buffers",
};

const char *ccsd_tenant_counter_name(enum tenant_counter k) { return counter_names[k]; }

static struct tenant *tenant_find(struct daemon *d, uid_t uid) {
  struct tenant *t;
  HASH_FIND(hh, d->tenants_by_uid, &uid, sizeof(uid), t);
  return t;
}

ccs_result_t ccsd_tenant_charge(struct daemon *d, uid_t uid, enum tenant_counter k,
                                uint64_t amount, struct tenant **ret, char *err, size_t errlen) {
  struct tenant *t = tenant_find(d, uid);
  uint64_t used = t ? t->used[k] : 0, quota = d->cfg.quota[k];
  if (amount > quota || used > quota - amount) {
    snprintf(err, errlen, "uid %d is over its quota of %llu %s (%llu in use, %llu more asked)",
             (int)uid, (unsigned long long)quota, counter_names[k], (unsigned long long)used,
             (unsigned long long)amount);
    return CCS_ERR_QUOTA;
  }
  if (!t) {
    t = calloc(1, sizeof(*t));
    if (!t) {
      snprintf(err, errlen, "out of memory");
      return CCS_ERR_NO_MEMORY;
    }
    t->uid = uid;
    t->d = d;
    t->share = ccsd_run_share_of(d->coll.shares, uid);
    list_insert_tail(&d->tenants, &t->link);
    HASH_ADD(hh, d->tenants_by_uid, uid, sizeof(t->uid), t);
  }
  t->used[k] += amount;
  t->charges++;
  *ret = t;
  return CCS_OK;
}

void ccsd_tenant_release(struct tenant *t, enum tenant_counter k, uint64_t amount) {
  if (!t) return;
  t->used[k] -= amount;
  if (--t->charges > 0) return;
  list_remove(&t->link);
  HASH_DELETE(hh, t->d->tenants_by_uid, t);
  free(t);
}

/* coll's quota hooks: a comm, or a rank joined here, charged to its uid. */
static enum tenant_counter counter_of(enum coll_charge what) {
  return what == COLL_CHARGE_COMM ? TENANT_COMMS : TENANT_RANKS;
}

void *ccsd_tenant_coll_charge(void *arg, uid_t uid, enum coll_charge what, ccs_result_t *rc,
                              char *err, size_t errlen) {
  struct tenant *t = NULL;
  *rc = ccsd_tenant_charge(arg, uid, counter_of(what), 1, &t, err, errlen);
  return *rc == CCS_OK ? t : NULL;
}

void ccsd_tenant_coll_release(void *arg, void *token, enum coll_charge what) {
  ccsd_tenant_release(token, counter_of(what), 1);
}

double ccsd_tenant_weight(const struct tenant *t) {
  return atomic_load_explicit(&t->share->weight, memory_order_relaxed);
}

int ccsd_tenant_turns(struct tenant *t, double *credit, double per) {
  double weight = ccsd_tenant_weight(t);
  uint64_t conns = t->used[TENANT_SESSIONS] ? t->used[TENANT_SESSIONS] : 1;
  double grant = per * weight / (double)conns;
  *credit += grant;
  if (*credit > 2 * grant + 1) *credit = 2 * grant + 1; /* nothing banked beyond a round's worth */
  int turns = (int)*credit;
  *credit -= turns;
  return turns;
}
