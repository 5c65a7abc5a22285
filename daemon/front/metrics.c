/* Counters for the Prometheus exposition: per tenant, collective and
 * outcome, counted per rank's call when it completes; a latency histogram
 * per collective (from the call's arrival to its completion, waiting for
 * the other ranks included: what the caller sees). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "front/front.h"
#include "regcache.h"
#include "transport.h"
#include "run/executor.h"

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

void ccsd_metrics_tenant_totals(const struct daemon *d, uid_t uid, uint64_t *ops, double *bus_bytes) {
  *ops = 0;
  *bus_bytes = 0;
  for (size_t i = 0; i < d->metrics.ncounters; i++) {
    const struct op_counter *c = &d->metrics.counters[i];
    if (c->uid != uid || c->status != CCS_OK) continue;
    *ops += c->ops;
    *bus_bytes += c->bus_bytes;
  }
}

void ccsd_metrics_record_algo(struct daemon *d, uint32_t kind, const char *algo) {
  struct ccsd_metrics *m = &d->metrics;
  if (!algo || kind >= CCS__COLL_KIND_COUNT) return;
  for (size_t i = 0; i < m->nalgos; i++)
    if (m->algos[i].kind == kind && !strcmp(m->algos[i].algo, algo)) {
      m->algos[i].ops++;
      return;
    }
  if (m->nalgos < CCSD_ALGO_COUNTERS) /* kinds x algorithms: it never fills */
    m->algos[m->nalgos++] = (struct algo_counter){kind, algo, 1};
}

void ccsd_metrics_free(struct daemon *d) {
  free(d->metrics.counters);
  memset(&d->metrics, 0, sizeof(d->metrics));
}

/* The counters to show: one tenant's, every tenant's, or every tenant's
 * summed into one series per collective and outcome (no uid label). */
static size_t view_counters(const struct ccsd_metrics *m, enum metrics_view view, uid_t uid,
                            struct op_counter **ret) {
  struct op_counter *out = calloc(m->ncounters ? m->ncounters : 1, sizeof(*out));
  size_t n = 0;
  if (!out) return 0;
  for (size_t i = 0; i < m->ncounters; i++) {
    const struct op_counter *c = &m->counters[i];
    if (view == METRICS_TENANT && c->uid != uid) continue;
    struct op_counter *into = NULL;
    for (size_t k = 0; k < n && view == METRICS_SUMMED && !into; k++)
      if (out[k].kind == c->kind && out[k].status == c->status) into = &out[k];
    if (!into) {
      into = &out[n++];
      *into = *c;
      continue;
    }
    into->ops += c->ops;
    into->bytes += c->bytes;
    into->bus_bytes += c->bus_bytes;
  }
  *ret = out;
  return n;
}

/* {tenant="1000",collective="all_reduce"...}: the tenant label only where
 * series are per tenant. */
static void labels(struct textbuf *o, enum metrics_view view, uid_t uid, const char *rest) {
  if (view == METRICS_SUMMED) textbuf_printf(o, "{%s}", rest);
  else textbuf_printf(o, "{tenant=\"%u\"%s%s}", (unsigned)uid, rest[0] ? "," : "", rest);
}

/* The text exposition format, version 0.0.4 (OpenMetrics parsers take it). */
char *ccsd_metrics_render(struct daemon *d, enum metrics_view view, uid_t uid, size_t *ret_len) {
  struct textbuf o = {0};
  const struct ccsd_metrics *m = &d->metrics;
  int all = view != METRICS_TENANT;
  struct op_counter *shown = NULL;
  size_t nshown = view_counters(m, view, uid, &shown);
  static const struct {
    const char *name, *help;
  } families[] = {
      {"ccs_ops_total", "Collective calls completed, per rank, by outcome."},
      {"ccs_op_bytes_total", "Bytes of the calls' buffers (the larger of send and receive)."},
      {"ccs_op_bus_bytes_total", "Bytes times the collective's bus factor (as nccl-tests): its rate is the bus bandwidth."},
  };
  for (int f = 0; f < 3; f++) {
    textbuf_printf(&o, "# HELP %s %s\n# TYPE %s counter\n", families[f].name, families[f].help,
                   families[f].name);
    for (size_t i = 0; i < nshown; i++) {
      const struct op_counter *c = &shown[i];
      if (f == 2 && c->status != CCS_OK) continue;
      char rest[160];
      if (f == 2) snprintf(rest, sizeof(rest), "collective=\"%s\"", ccs__coll_name(c->kind));
      else snprintf(rest, sizeof(rest), "collective=\"%s\",status=\"%s\"", ccs__coll_name(c->kind),
                    ccs_result_name(c->status));
      textbuf_printf(&o, "%s", families[f].name);
      labels(&o, view, c->uid, rest);
      if (f == 0) textbuf_printf(&o, " %llu\n", (unsigned long long)c->ops);
      else if (f == 1) textbuf_printf(&o, " %llu\n", (unsigned long long)c->bytes);
      else textbuf_printf(&o, " %.0f\n", c->bus_bytes);
    }
  }
  free(shown);
  if (all) {
    textbuf_printf(&o, "# HELP ccs_op_algorithm_total Collective calls by the algorithm their op ran with.\n"
                       "# TYPE ccs_op_algorithm_total counter\n");
    for (size_t i = 0; i < m->nalgos; i++)
      textbuf_printf(&o, "ccs_op_algorithm_total{collective=\"%s\",algorithm=\"%s\"} %llu\n",
                     ccs__coll_name(m->algos[i].kind), m->algos[i].algo,
                     (unsigned long long)m->algos[i].ops);
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
    uint64_t sum = 0;
    struct list *it, *tmp;
    LIST_FOREACH_SAFE(it, tmp, &d->tenants) {
      struct tenant *t = LIST_ENTRY(it, struct tenant, link);
      if (view == METRICS_TENANT && t->uid != uid) continue;
      sum += t->used[gauges[g].k];
      if (view == METRICS_SUMMED) continue;
      textbuf_printf(&o, "%s{tenant=\"%u\"} %llu\n", gauges[g].name, (unsigned)t->uid,
                     (unsigned long long)t->used[gauges[g].k]);
    }
    if (view == METRICS_SUMMED) textbuf_printf(&o, "%s %llu\n", gauges[g].name, (unsigned long long)sum);
  }
  if (all) {
    textbuf_printf(&o, "# HELP ccs_executor_busy_seconds_total Time executor threads spent on tasks.\n"
            "# TYPE ccs_executor_busy_seconds_total counter\n"
            "ccs_executor_busy_seconds_total %.6f\n"
            "# HELP ccs_executor_threads Executor threads.\n# TYPE ccs_executor_threads gauge\n"
            "ccs_executor_threads %d\n"
            "# HELP ccs_fast_path_clients Connections submitting through shared-memory rings.\n"
            "# TYPE ccs_fast_path_clients gauge\nccs_fast_path_clients %u\n"
            "# HELP ccs_fast_path_calls_total Calls taken from the connections' rings.\n"
            "# TYPE ccs_fast_path_calls_total counter\nccs_fast_path_calls_total %llu\n"
            "# HELP ccs_uptime_seconds Seconds since the daemon started.\n"
            "# TYPE ccs_uptime_seconds gauge\nccs_uptime_seconds %.3f\n",
        ccsd_executor_busy_seconds(d->coll.exec), d->cfg.threads, d->nrings,
        (unsigned long long)d->ring_calls,
        (double)(ccsd_now_ms(d) - d->started_ms) / 1000.0);
  }
  if (all) {
    static const char *const events[RESTART_EVENTS] = {
        [RESTART_REJOINED_HERE] = "rejoined_here",
        [RESTART_REJOINED_FROM_HOLDERS] = "rejoined_from_holders",
        [RESTART_REJOINED_THROUGH_ROOT] = "rejoined_through_root",
        [RESTART_HOLDER_HEARD] = "holder_heard",
        [RESTART_HOLDER_LOST] = "holder_lost",
        [RESTART_HELD] = "held",
        [RESTART_RESUMED] = "resumed",
        [RESTART_FAILED] = "failed",
    };
    textbuf_printf(&o, "# HELP ccs_comm_restarts_total What daemon restarts did to the communicators here "
                       "(docs/restart.md).\n# TYPE ccs_comm_restarts_total counter\n");
    for (int e = 0; e < RESTART_EVENTS; e++)
      textbuf_printf(&o, "ccs_comm_restarts_total{event=\"%s\"} %llu\n", events[e],
                     (unsigned long long)d->coll.restarts[e]);
  }
  if (all && d->coll.peers) {
    struct reg_cache_counts k;
    ccsd_peers_registrations(d->coll.peers, &k);
    textbuf_printf(&o, "# HELP ccs_transport_registrations_total Buffers and scratch registered with "
                       "the transport for a call: made then, or kept from an earlier call.\n"
                       "# TYPE ccs_transport_registrations_total counter\n"
                       "ccs_transport_registrations_total{how=\"made\"} %llu\n"
                       "ccs_transport_registrations_total{how=\"kept\"} %llu\n"
                       "# HELP ccs_transport_registrations Registrations held now.\n"
                       "# TYPE ccs_transport_registrations gauge\nccs_transport_registrations %llu\n",
                   (unsigned long long)k.made, (unsigned long long)k.reused, (unsigned long long)k.held);
    struct transport_counters w;
    if (!ccsd_peers_transport_counters(d->coll.peers, &w))
      textbuf_printf(&o, "# HELP ccs_transport_messages_total Messages sent to other daemons, by the way they "
                         "went: rdma (written into the receiver's buffer), send (small, into a buffer it "
                         "posted), eager (over TCP: small, or no answer in time).\n"
                         "# TYPE ccs_transport_messages_total counter\n"
                         "ccs_transport_messages_total{way=\"rdma\"} %llu\n"
                         "ccs_transport_messages_total{way=\"send\"} %llu\n"
                         "ccs_transport_messages_total{way=\"eager\"} %llu\n"
                         "# HELP ccs_transport_message_bytes_total Bytes of those messages, by the way they went.\n"
                         "# TYPE ccs_transport_message_bytes_total counter\n"
                         "ccs_transport_message_bytes_total{way=\"rdma\"} %llu\n"
                         "ccs_transport_message_bytes_total{way=\"send\"} %llu\n"
                         "ccs_transport_message_bytes_total{way=\"eager\"} %llu\n",
                     (unsigned long long)w.rdma_messages, (unsigned long long)w.send_messages,
                     (unsigned long long)w.eager_messages, (unsigned long long)w.rdma_bytes,
                     (unsigned long long)w.send_bytes, (unsigned long long)w.eager_bytes);
  }
  ccsd_shares_metrics(&o, d, view, uid);
  if (o.failed) {
    free(o.buf);
    return NULL;
  }
  *ret_len = o.len;
  return o.buf;
}
