/* Tenants' shares as the operator sees and sets them: the weights from
 * the configuration handed to the run layer (run/share.h), each tenant's
 * current share of the executor's time and of the bytes sent to other
 * daemons (sampled every second), and the `ccsctl tenants` table that
 * `ccsctl top` refreshes. A tenant sees its own row; operators see all. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "front/front.h"

#define SAMPLE_MS 1000

struct share_sample {
  UT_hash_handle hh;
  uid_t uid;
  uint64_t exec_ns, net_bytes; /* at the last sample */
  double exec_share, net_share; /* of everyone's, over the last interval */
};

void ccsd_shares_configure(struct daemon *d) {
  struct run_share_rules rules = {.n = d->cfg.nweights, .max_share = d->cfg.tenant_max_share};
  for (int i = 0; i < d->cfg.nweights; i++) {
    rules.uid[i] = (uid_t)d->cfg.weight_uids[i];
    rules.weight[i] = d->cfg.weights[i];
  }
  ccsd_run_shares_configure(&d->shares, &rules);
}

/* A copy of every record, taken under the registry's lock. */
struct rows {
  struct run_share *r;
  size_t n, cap;
  int failed;
};

static void copy_row(void *arg, const struct run_share *r) {
  struct rows *rows = arg;
  if (rows->n == rows->cap) {
    size_t cap = rows->cap ? 2 * rows->cap : 16;
    struct run_share *grown = realloc(rows->r, cap * sizeof(*grown));
    if (!grown) {
      rows->failed = 1;
      return;
    }
    rows->r = grown;
    rows->cap = cap;
  }
  struct run_share *to = &rows->r[rows->n++];
  memset(to, 0, sizeof(*to));
  to->uid = r->uid;
  to->weight = atomic_load(&r->weight);
  to->cap = atomic_load(&r->cap);
  to->exec_ns = atomic_load(&r->exec_ns);
  to->net_bytes = atomic_load(&r->net_bytes);
  to->gpu_ops = atomic_load(&r->gpu_ops);
  to->gpu_bytes = atomic_load(&r->gpu_bytes);
  to->requests = atomic_load(&r->requests);
  for (int b = 0; b < RUN_WAIT_BUCKETS; b++) to->waits[b] = atomic_load(&r->waits[b]);
  to->wait_count = atomic_load(&r->wait_count);
  to->wait_ns = atomic_load(&r->wait_ns);
}

static struct rows take_rows(struct daemon *d) {
  struct rows rows = {0};
  ccsd_run_shares_each(&d->shares, copy_row, &rows);
  return rows;
}

static struct share_sample *sample_of(struct daemon *d, uid_t uid) {
  struct share_sample *s;
  HASH_FIND(hh, d->samples, &uid, sizeof(uid), s);
  return s;
}

static void on_sample(uv_timer_t *t) {
  struct daemon *d = t->data;
  struct rows rows = take_rows(d);
  uint64_t exec_total = 0, net_total = 0;
  for (size_t i = 0; i < rows.n; i++) {
    struct share_sample *s = sample_of(d, rows.r[i].uid);
    if (!s && (s = calloc(1, sizeof(*s))) != NULL) {
      s->uid = rows.r[i].uid;
      HASH_ADD(hh, d->samples, uid, sizeof(s->uid), s);
    }
    if (!s) continue;
    /* this interval's, kept in the copy until the totals are known */
    uint64_t exec = rows.r[i].exec_ns - s->exec_ns, net = rows.r[i].net_bytes - s->net_bytes;
    s->exec_ns = rows.r[i].exec_ns;
    s->net_bytes = rows.r[i].net_bytes;
    rows.r[i].exec_ns = exec;
    rows.r[i].net_bytes = net;
    exec_total += exec;
    net_total += net;
  }
  for (size_t i = 0; i < rows.n; i++) {
    struct share_sample *s = sample_of(d, rows.r[i].uid);
    if (!s) continue;
    s->exec_share = exec_total ? (double)rows.r[i].exec_ns / (double)exec_total : 0;
    s->net_share = net_total ? (double)rows.r[i].net_bytes / (double)net_total : 0;
  }
  free(rows.r);
}

void ccsd_shares_start(struct daemon *d) {
  ccsd_shares_configure(d);
  uv_timer_init(d->loop, &d->share_timer);
  d->share_timer.data = d;
  uv_timer_start(&d->share_timer, on_sample, SAMPLE_MS, SAMPLE_MS);
  uv_unref((uv_handle_t *)&d->share_timer); /* never what keeps the loop alive */
}

void ccsd_shares_stop(struct daemon *d) {
  uv_close((uv_handle_t *)&d->share_timer, NULL);
  struct share_sample *s, *tmp;
  HASH_ITER(hh, d->samples, s, tmp) {
    HASH_DELETE(hh, d->samples, s);
    free(s);
  }
}

void ccsd_shares_current(struct daemon *d, uid_t uid, double *exec_share, double *net_share) {
  struct share_sample *s = sample_of(d, uid);
  *exec_share = s ? s->exec_share : 0;
  *net_share = s ? s->net_share : 0;
}

/* One row: as text, JSON, or raw (ccsctl top: uid then the counters,
 * space-separated, in the order of the header). */
static void render_row(struct textbuf *t, struct daemon *d, const struct run_share *r, int json,
                       int raw, int *first) {
  double exec_share, net_share;
  ccsd_shares_current(d, r->uid, &exec_share, &net_share);
  uint64_t ops = 0;
  double bus_bytes = 0;
  ccsd_metrics_tenant_totals(d, r->uid, &ops, &bus_bytes);
  double wait_s = (double)r->wait_ns / 1e9, exec_s = (double)r->exec_ns / 1e9;
  if (raw) {
    textbuf_printf(t, "%u %g %g %.9f %llu %llu %llu %llu %llu %.0f %llu %.9f %.4f %.4f",
                   (unsigned)r->uid, r->weight, r->cap, exec_s, (unsigned long long)r->net_bytes,
                   (unsigned long long)r->gpu_ops, (unsigned long long)r->gpu_bytes,
                   (unsigned long long)r->requests, (unsigned long long)ops, bus_bytes,
                   (unsigned long long)r->wait_count, wait_s, exec_share, net_share);
    for (int b = 0; b < RUN_WAIT_BUCKETS; b++) textbuf_printf(t, " %llu", (unsigned long long)r->waits[b]);
    textbuf_printf(t, "\n");
  } else if (json) {
    textbuf_printf(t, "%s{\"uid\": %u, \"weight\": %g, \"max_share\": %g, \"executor_seconds\": %.6f, "
                      "\"sent_bytes\": %llu, \"gpu_ops\": %llu, \"gpu_bytes\": %llu, \"requests\": %llu, "
                      "\"ops\": %llu, \"bus_bytes\": %.0f, \"queue_waits\": %llu, "
                      "\"queue_wait_seconds\": %.6f, \"executor_share\": %.4f, \"sent_share\": %.4f}",
                   *first ? "" : ", ", (unsigned)r->uid, r->weight, r->cap, exec_s,
                   (unsigned long long)r->net_bytes, (unsigned long long)r->gpu_ops,
                   (unsigned long long)r->gpu_bytes, (unsigned long long)r->requests,
                   (unsigned long long)ops, bus_bytes, (unsigned long long)r->wait_count, wait_s,
                   exec_share, net_share);
  } else {
    textbuf_printf(t, "  %-8u %6g %6g %6.1f%% %6.1f%% %12.3f %14llu %10llu %10.3f\n", (unsigned)r->uid,
                   r->weight, r->cap, 100 * exec_share, 100 * net_share, exec_s,
                   (unsigned long long)r->net_bytes, (unsigned long long)ops,
                   r->wait_count ? wait_s / (double)r->wait_count * 1e3 : 0.0);
  }
  *first = 0;
}

void ccsd_shares_render(struct textbuf *t, struct daemon *d, int all, uid_t uid, int json, int raw) {
  struct rows rows = take_rows(d);
  if (rows.failed) t->failed = 1;
  int first = 1;
  if (json) textbuf_printf(t, "[");
  else if (!raw)
    textbuf_printf(t, "  %-8s %6s %6s %7s %7s %12s %14s %10s %10s\n", "uid", "weight", "cap",
                   "share", "sent", "executor_s", "sent_bytes", "calls", "wait_ms");
  for (size_t i = 0; i < rows.n; i++)
    if (all || rows.r[i].uid == uid) render_row(t, d, &rows.r[i], json, raw, &first);
  if (json) textbuf_printf(t, "]\n");
  else if (!raw && first) textbuf_printf(t, "  (none)\n");
  free(rows.r);
}

/* The tenants' series of the Prometheus exposition (metrics.c). */
void ccsd_shares_metrics(struct textbuf *o, struct daemon *d, enum metrics_view view, uid_t uid) {
  struct rows rows = take_rows(d);
  if (rows.failed) o->failed = 1;
  static const struct {
    const char *name, *type, *help;
  } families[] = {
      {"ccs_tenant_executor_seconds_total", "counter", "Executor threads' time on the tenant's tasks."},
      {"ccs_tenant_sent_bytes_total", "counter", "Bytes of the tenant's ops sent to other daemons."},
      {"ccs_tenant_gpu_ops_total", "counter", "The tenant's ops queued on GPUs."},
      {"ccs_tenant_gpu_bytes_total", "counter", "Bytes of the tenant's ops queued on GPUs."},
      {"ccs_tenant_requests_total", "counter", "Requests and ring calls of the tenant the daemon took."},
      {"ccs_tenant_weight", "gauge", "The tenant's weight (tenant_weights)."},
      {"ccs_tenant_executor_share", "gauge", "The tenant's fraction of the executor time used in the last second."},
      {"ccs_tenant_sent_share", "gauge", "The tenant's fraction of the bytes sent in the last second."},
  };
  int nfamilies = view == METRICS_SUMMED ? 5 : 8; /* weights and shares are per tenant */
  for (int f = 0; f < nfamilies; f++) {
    textbuf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", families[f].name, families[f].help,
                   families[f].name, families[f].type);
    double sum = 0;
    for (size_t i = 0; i < rows.n; i++) {
      const struct run_share *r = &rows.r[i];
      if (view == METRICS_TENANT && r->uid != uid) continue;
      double exec_share, net_share;
      ccsd_shares_current(d, r->uid, &exec_share, &net_share);
      double v[] = {(double)r->exec_ns / 1e9, (double)r->net_bytes, (double)r->gpu_ops,
                    (double)r->gpu_bytes, (double)r->requests, r->weight, exec_share, net_share};
      sum += v[f];
      if (view != METRICS_SUMMED) textbuf_printf(o, "%s{tenant=\"%u\"} %.9g\n", families[f].name, (unsigned)r->uid, v[f]);
    }
    if (view == METRICS_SUMMED) textbuf_printf(o, "%s %.9g\n", families[f].name, sum);
  }
  textbuf_printf(o, "# HELP ccs_tenant_queue_wait_seconds Time from an op's launch to its first "
                    "task on the executor or its queuing on a GPU.\n"
                    "# TYPE ccs_tenant_queue_wait_seconds histogram\n");
  uint64_t summed[RUN_WAIT_BUCKETS] = {0}, count = 0, ns = 0;
  for (size_t i = 0; i < rows.n; i++) {
    const struct run_share *r = &rows.r[i];
    if (view == METRICS_TENANT && r->uid != uid) continue;
    for (int b = 0; b < RUN_WAIT_BUCKETS; b++) summed[b] += r->waits[b];
    count += r->wait_count;
    ns += r->wait_ns;
    if (view == METRICS_SUMMED) continue;
    for (int b = 0; b < RUN_WAIT_BUCKETS; b++)
      textbuf_printf(o, "ccs_tenant_queue_wait_seconds_bucket{tenant=\"%u\",le=\"%g\"} %llu\n",
                     (unsigned)r->uid, ccsd_run_wait_bounds[b], (unsigned long long)r->waits[b]);
    textbuf_printf(o, "ccs_tenant_queue_wait_seconds_bucket{tenant=\"%u\",le=\"+Inf\"} %llu\n"
                      "ccs_tenant_queue_wait_seconds_sum{tenant=\"%u\"} %.9f\n"
                      "ccs_tenant_queue_wait_seconds_count{tenant=\"%u\"} %llu\n",
                   (unsigned)r->uid, (unsigned long long)r->wait_count, (unsigned)r->uid,
                   (double)r->wait_ns / 1e9, (unsigned)r->uid, (unsigned long long)r->wait_count);
  }
  if (view == METRICS_SUMMED) {
    for (int b = 0; b < RUN_WAIT_BUCKETS; b++)
      textbuf_printf(o, "ccs_tenant_queue_wait_seconds_bucket{le=\"%g\"} %llu\n",
                     ccsd_run_wait_bounds[b], (unsigned long long)summed[b]);
    textbuf_printf(o, "ccs_tenant_queue_wait_seconds_bucket{le=\"+Inf\"} %llu\n"
                      "ccs_tenant_queue_wait_seconds_sum %.9f\nccs_tenant_queue_wait_seconds_count %llu\n",
                   (unsigned long long)count, (double)ns / 1e9, (unsigned long long)count);
  }
  free(rows.r);
}
