/* Counters for the Prometheus exposition: per tenant, collective and
 * outcome, counted per rank's call when it completes; a latency histogram
 * per collective (from the call's arrival to its completion, waiting for
 * the other ranks included: what the caller sees). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

static const double bounds[CCSD_LATENCY_BUCKETS] = {1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1, 10, 100};

/* nccl-tests' bus bandwidth factors (REFERENCE.md): bytes x factor summed
 * is a counter whose rate is the bus bandwidth. */
static double bus_factor(uint32_t kind, int n) {
  switch (kind) {
  case CCS__ALL_REDUCE: return 2.0 * (n - 1) / n;
  case CCS__ALL_GATHER:
  case CCS__REDUCE_SCATTER:
  case CCS__ALL_TO_ALL:
  case CCS__GATHER:
  case CCS__SCATTER: return (double)(n - 1) / n;
  default: return 1.0;
  }
}

void ccsd_metrics_record(struct daemon *d, uid_t uid, uint32_t kind, int nranks,
                         ccs_result_t status, uint64_t bytes, double seconds) {
  struct ccsd_metrics *m = &d->metrics;
  if (kind >= CCS__COLL_KIND_COUNT) return;
  struct op_counter *c = NULL;
  for (size_t i = 0; i < m->ncounters; i++)
    if (m->counters[i].uid == uid && m->counters[i].kind == kind && m->counters[i].status == status)
      c = &m->counters[i];
  if (!c) {
    if (m->ncounters == m->cap) {
      size_t cap = m->cap ? 2 * m->cap : 32;
      struct op_counter *grown = realloc(m->counters, cap * sizeof(*grown));
      if (!grown) return;
      m->counters = grown;
      m->cap = cap;
    }
    c = &m->counters[m->ncounters++];
    memset(c, 0, sizeof(*c));
    c->uid = uid;
    c->kind = kind;
    c->status = status;
  }
  c->ops++;
  c->bytes += bytes;
  if (status == CCS_OK) c->bus_bytes += (double)bytes * bus_factor(kind, nranks);
  struct latency *h = &m->latency[kind];
  for (int b = 0; b < CCSD_LATENCY_BUCKETS; b++)
    if (seconds <= bounds[b]) h->buckets[b]++;
  h->count++;
  h->sum += seconds;
}

void ccsd_metrics_free(struct daemon *d) {
  free(d->metrics.counters);
  memset(&d->metrics, 0, sizeof(d->metrics));
}

/* The text exposition format, version 0.0.4 (OpenMetrics parsers take it). */
char *ccsd_metrics_render(struct daemon *d, int all, uid_t uid, size_t *ret_len) {
  struct textbuf o = {0};
  const struct ccsd_metrics *m = &d->metrics;
  textbuf_printf(&o, "# HELP ccs_ops_total Collective calls completed, per rank, by outcome.\n"
          "# TYPE ccs_ops_total counter\n");
  for (size_t i = 0; i < m->ncounters; i++) {
    const struct op_counter *c = &m->counters[i];
    if (!all && c->uid != uid) continue;
    textbuf_printf(&o, "ccs_ops_total{tenant=\"%u\",collective=\"%s\",status=\"%s\"} %llu\n",
        (unsigned)c->uid, ccs__coll_name(c->kind), ccs_result_name(c->status),
        (unsigned long long)c->ops);
  }
  textbuf_printf(&o, "# HELP ccs_op_bytes_total Bytes of the calls' buffers (the larger of send and receive).\n"
          "# TYPE ccs_op_bytes_total counter\n");
  for (size_t i = 0; i < m->ncounters; i++) {
    const struct op_counter *c = &m->counters[i];
    if (!all && c->uid != uid) continue;
    textbuf_printf(&o, "ccs_op_bytes_total{tenant=\"%u\",collective=\"%s\",status=\"%s\"} %llu\n",
        (unsigned)c->uid, ccs__coll_name(c->kind), ccs_result_name(c->status),
        (unsigned long long)c->bytes);
  }
  textbuf_printf(&o, "# HELP ccs_op_bus_bytes_total Bytes times the collective's bus factor "
                     "(as nccl-tests): its rate is the bus bandwidth.\n"
                     "# TYPE ccs_op_bus_bytes_total counter\n");
  for (size_t i = 0; i < m->ncounters; i++) {
    const struct op_counter *c = &m->counters[i];
    if ((!all && c->uid != uid) || c->status != CCS_OK) continue;
    textbuf_printf(&o, "ccs_op_bus_bytes_total{tenant=\"%u\",collective=\"%s\"} %.0f\n",
                   (unsigned)c->uid, ccs__coll_name(c->kind), c->bus_bytes);
  }
  if (all) {
    textbuf_printf(&o, "# HELP ccs_op_seconds Time from a call's arrival to its completion.\n"
            "# TYPE ccs_op_seconds histogram\n");
    for (uint32_t k = 0; k < CCS__COLL_KIND_COUNT; k++) {
      const struct latency *h = &m->latency[k];
      if (!h->count) continue;
      for (int b = 0; b < CCSD_LATENCY_BUCKETS; b++)
        textbuf_printf(&o, "ccs_op_seconds_bucket{collective=\"%s\",le=\"%g\"} %llu\n", ccs__coll_name(k),
            bounds[b], (unsigned long long)h->buckets[b]);
      textbuf_printf(&o, "ccs_op_seconds_bucket{collective=\"%s\",le=\"+Inf\"} %llu\n", ccs__coll_name(k),
          (unsigned long long)h->count);
      textbuf_printf(&o, "ccs_op_seconds_sum{collective=\"%s\"} %.9f\n", ccs__coll_name(k), h->sum);
      textbuf_printf(&o, "ccs_op_seconds_count{collective=\"%s\"} %llu\n", ccs__coll_name(k),
          (unsigned long long)h->count);
    }
  }
  static const struct {
    const char *name, *help;
    enum tenant_counter k;
  } gauges[] = {
      {"ccs_clients", "Connected clients.", TENANT_SESSIONS},
      {"ccs_comms", "Communicators.", TENANT_COMMS},
      {"ccs_registered_bytes", "Bytes of registered buffers.", TENANT_REGISTERED_BYTES},
      {"ccs_ops_in_flight", "Calls submitted and not yet completed.", TENANT_OPS},
  };
  for (size_t g = 0; g < sizeof(gauges) / sizeof(gauges[0]); g++) {
    textbuf_printf(&o, "# HELP %s %s\n# TYPE %s gauge\n", gauges[g].name, gauges[g].help, gauges[g].name);
    struct list *it, *tmp;
    LIST_FOREACH_SAFE(it, tmp, &d->tenants) {
      struct tenant *t = LIST_ENTRY(it, struct tenant, link);
      if (!all && t->uid != uid) continue;
      textbuf_printf(&o, "%s{tenant=\"%u\"} %llu\n", gauges[g].name, (unsigned)t->uid,
          (unsigned long long)t->used[gauges[g].k]);
    }
  }
  if (all) {
    textbuf_printf(&o, "# HELP ccs_executor_busy_seconds_total Time executor threads spent on tasks.\n"
            "# TYPE ccs_executor_busy_seconds_total counter\n"
            "ccs_executor_busy_seconds_total %.6f\n"
            "# HELP ccs_executor_threads Executor threads.\n# TYPE ccs_executor_threads gauge\n"
            "ccs_executor_threads %d\n"
            "# HELP ccs_uptime_seconds Seconds since the daemon started.\n"
            "# TYPE ccs_uptime_seconds gauge\nccs_uptime_seconds %.3f\n",
        ccsd_executor_busy_seconds(d->exec), d->cfg.threads,
        (double)(ccsd_now_ms(d) - d->started_ms) / 1000.0);
  }
  if (o.failed) {
    free(o.buf);
    return NULL;
  }
  *ret_len = o.len;
  return o.buf;
}
