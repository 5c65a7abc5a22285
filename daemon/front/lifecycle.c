/* The daemon's state without its front door: defaults, start (executor,
 * housekeeping) and an orderly close. main.c adds the listening socket
 * and signals; the session fuzzer drives the same state through a
 * socketpair. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "front/front.h"
#include "plan/pool.h"
#include "run/executor.h"
#include "base/log.h"

static void on_housekeeping(uv_timer_t *t) {
  struct daemon *d = t->data;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->sessions) ccsd_client_comms_sweep(LIST_ENTRY(it, struct session, link));
  LIST_FOREACH_SAFE(it, tmp, &d->sessions) {
    ccsd_session_check_io(LIST_ENTRY(it, struct session, link));
  }
  ccsd_rings_beat(d);
}

/* vm.max_map_count: mappings one process may hold (the kernel's default
 * 65530 where it cannot be read) */
static size_t max_mappings(void) {
  FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
  unsigned long n = 0;
  if (f) {
    if (fscanf(f, "%lu", &n) != 1) n = 0;
    fclose(f);
  }
  return n > 1024 ? (size_t)n : 65530;
}

/* Scratch freed: the transport forgets what it kept registered of it. */
static void scratch_release(void *mem, void *ctx) {
  ccsd_peers_forget(((struct daemon *)ctx)->coll.peers, mem, 1);
  engine_pool_host_release(mem, NULL);
}

static void on_peer_message(void *arg, const char *addr, const struct peer_msg *m) {
  ccsd_span_message(&((struct daemon *)arg)->coll, addr, m);
}
static void on_peer_lost(void *arg, const char *addr, const char *why) {
  ccsd_span_peer_lost(&((struct daemon *)arg)->coll, addr, why);
}

int ccsd_daemon_init(struct daemon *d, uv_loop_t *loop) {
  struct ccsd_config cfg = d->cfg;
  ccsd_config_resolve(&cfg);
  memset(d, 0, sizeof(*d));
  d->cfg = cfg;
  d->loop = loop;
  d->listen_fd = -1;
  list_init(&d->sessions);
  list_init(&d->rings);
  list_init(&d->coll.comms);
  list_init(&d->tenants);
  list_init(&d->http_conns);
  d->started_ms = uv_now(loop);
  d->max_buffers = max_mappings() / 2;
  if (sodium_init() < 0) {
    LOG_ERROR("libsodium cannot start");
    return -1;
  }
  struct coll *co = &d->coll;
  co->loop = loop;
  co->next_id = &d->next_id;
  co->started_ms = d->started_ms;
  co->hooks = (struct coll_hooks){ccsd_tenant_coll_charge, ccsd_tenant_coll_release, d};
  co->cfg = (struct coll_config){
      .init_timeout_s = cfg.init_timeout_s, .op_timeout_s = cfg.op_timeout_s, .id_ttl_s = cfg.id_ttl_s,
      .peer_restart_grace_s = cfg.peer_restart_grace_s, .peer_replay_bytes = cfg.peer_replay_bytes,
      .chunk_bytes = cfg.chunk_bytes, .stream_bytes = cfg.stream_bytes,
      .inline_bytes = cfg.inline_bytes, .peer_connections = cfg.peer_connections};
  snprintf(co->cfg.algo, sizeof(co->cfg.algo), "%s", cfg.algo);
  char key_path[sizeof(cfg.socket_path) + 16], why[256];
  if (cfg.id_key_file[0]) snprintf(key_path, sizeof(key_path), "%s", cfg.id_key_file);
  else snprintf(key_path, sizeof(key_path), "%s.id-key", cfg.socket_path);
  int made;
  if (ccsd_id_key_load(key_path, co->id_key, sizeof(co->id_key), &made, why, sizeof(why))) {
    randombytes_buf(co->id_key, sizeof(co->id_key));
    LOG_WARN("unique ids: %s; ids are signed with a key of this run alone, and jobs cannot "
             "rejoin their comms after a restart", why);
  } else {
    LOG_INFO(CCS_LOG_INIT, "unique ids: the key in %s%s", key_path, made ? " (made now)" : "");
  }
  randombytes_buf(co->table_key, sizeof(co->table_key));
  /* scratch kept between ops, and registered with the transport meanwhile */
  d->coll.pool = engine_pool_new_with(d->cfg.scratch_keep, engine_pool_host_alloc, scratch_release, d);
  ccsd_run_shares_init(&d->shares);
  d->coll.shares = &d->shares;
  ccsd_shares_start(d);
  d->coll.exec = ccsd_executor_new(loop, d->cfg.threads, (enum executor_priority)d->cfg.executor_priority);
  if (!d->coll.exec) {
    LOG_ERROR("cannot start %d executor threads", d->cfg.threads);
    return -1;
  }
  d->coll.gpu = ccsd_gpu_start(loop, d->gpu_absent, sizeof(d->gpu_absent));
  if (d->coll.gpu) {
    char gpus[512];
    ccsd_gpu_describe(d->coll.gpu, gpus, sizeof(gpus));
    LOG_INFO(CCS_LOG_INIT, "device memory: %s", gpus);
  } else {
    LOG_INFO(CCS_LOG_INIT, "host-only: %s", d->gpu_absent);
  }
  if (d->cfg.listen[0]) { /* other nodes' daemons */
    const struct ccsd_config *c = &d->cfg;
    struct peers_options opt = {
        .cluster_key_file = c->cluster_key_file, .encrypt = c->peer_encrypt,
        .max_connections = (size_t)c->peer_max_connections,
        .unexpected_bytes = c->peer_unexpected_bytes, .unexpected_total = c->peer_unexpected_total,
        .heartbeat_s = c->heartbeat_s, .peer_timeout_s = c->peer_timeout_s,
        .io_timeout_s = c->io_timeout_s, .link_capacity = (double)c->link_capacity,
        .ib_library = c->ib_library, .ib_devices = c->ib_devices, .ib_gid_index = c->ib_gid_index,
        /* an op across daemons waits a round trip or two for its data */
        .spin_ns = (uint64_t)c->poll_spin_us * 1000 * 10};
    snprintf(opt.transport, sizeof(opt.transport), "%s", c->transport);
    snprintf(opt.listen, sizeof(opt.listen), "%s", c->listen);
    snprintf(opt.advertise, sizeof(opt.advertise), "%s", c->advertise);
    struct peers_hooks hooks = {on_peer_message, on_peer_lost, d};
    d->coll.peers = ccsd_peers_start(loop, &opt, &hooks, d->coll.exec, d->coll.self, sizeof(d->coll.self));
    if (!d->coll.peers) return -1;
    d->coll.link = ccsd_peers_link_model(d->coll.peers);
    LOG_INFO(CCS_LOG_INIT, "the tuner sees a link to another daemon as %.0f us a step and %.1f GB/s",
             d->coll.link.alpha_s * 1e6, d->coll.link.beta_Bps / 1e9);
    if (!strncmp(d->coll.self, "0.0.0.0:", 8) || !strncmp(d->coll.self, "[::]:", 5)) {
      LOG_ERROR("listen=%s accepts on every address: set advertise to the one other daemons use",
                d->cfg.listen);
      return -1;
    }
    LOG_INFO(CCS_LOG_INIT, "other daemons reach this one at %s", d->coll.self);
  }
  uv_timer_init(loop, &d->housekeeping);
  d->housekeeping.data = d;
  /* a quarter of the io timeout, and every second at least: the beat
   * clients with calls of a CUDA stream out watch (proto/ring.h) */
  double every = d->cfg.io_timeout_s * 250;
  d->housekeeping_ms = every < 1 ? 1 : every > 1000 ? 1000 : (uint32_t)every;
  uv_timer_start(&d->housekeeping, on_housekeeping, d->housekeeping_ms, d->housekeeping_ms);
  if (d->cfg.metrics_listen[0] && ccsd_metrics_http_start(d)) return -1;
  return 0;
}

void ccsd_daemon_close(struct daemon *d) {
  d->stopping = 1;
  uv_close((uv_handle_t *)&d->housekeeping, NULL);
  ccsd_shares_stop(d);
  ccsd_metrics_http_stop(d);
  ccsd_server_stop(d);
  ccsd_peers_stop(d->coll.peers);
  ccsd_gpu_stop(d->coll.gpu);
  ccsd_executor_stop(d->coll.exec);
  uv_run(d->loop, UV_RUN_DEFAULT); /* the close callbacks */
  ccsd_peers_free(d->coll.peers);
  d->coll.peers = NULL;
  engine_pool_free(d->coll.pool);
  ccsd_comm_failures_free(&d->coll);
  ccsd_run_shares_close(&d->shares);
  ccsd_gpu_free(d->coll.gpu); /* after all that could still let go of its pages */
  d->coll.gpu = NULL;
  uv_loop_close(d->loop);
  ccsd_metrics_free(d);
}
