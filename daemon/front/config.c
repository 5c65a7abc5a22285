/* Configuration: one table of keys, four sources, later ones winning:
 * built-in defaults < the file (/etc/ccs/ccsd.conf or --config) < CCS_*
 * environment variables < --key=value on the command line. Unknown keys
 * and bad values are errors naming where they came from. */
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <ini.h>
#include <pwd.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "front/front.h"
#include "base/log.h"
#include "plan/tuner.h"
#include "transport.h"

enum key_type { K_PATH, K_MODE, K_COUNT, K_BYTES, K_SECONDS, K_IDS, K_LEVEL, K_SUBSYS, K_ADDRESS,
                K_RULES, K_BOOL, K_TRANSPORT, K_WEIGHTS, K_FRACTION, K_PRIORITY };

struct key {
  const char *name;
  enum key_type type;
  size_t offset, size; /* the field; size tells its C type (int, size_t, uint64_t, char[]) */
  double min, max; /* K_PATH: min 1 lets it be empty */
  const char *help;
};

#define AT(field) offsetof(struct ccsd_config, field), sizeof(((struct ccsd_config *)0)->field)
static const struct key keys[] = {
    {"socket", K_PATH, AT(socket_path), 0, 0, "Unix socket the clients connect to"},
    {"socket_mode", K_MODE, AT(socket_mode), 0, 0777, "its permissions (with its group: who may connect)"},
    {"threads", K_COUNT, AT(threads), 0, 256, "executor threads; 0: one per CPU"},
    {"chunk_bytes", K_BYTES, AT(chunk_bytes), 4096, 64 << 20, "bytes per executor task (and per message between daemons)"},
    {"stream_bytes", K_BYTES, AT(stream_bytes), 0, 1e18, "ops writing this much use non-temporal stores"},
    {"scratch_keep", K_BYTES, AT(scratch_keep), 0, 1e18, "bytes of ops' scratch memory kept for the next ops (fresh memory costs a page fault per page)"},
    {"inline_bytes", K_BYTES, AT(inline_bytes), 0, 1 << 24, "ops moving at most this much run on the control loop, not the executor threads"},
    {"init_timeout", K_SECONDS, AT(init_timeout_s), 0.001, 1e7, "seconds ccs_comm_init_rank waits for all ranks"},
    {"op_timeout", K_SECONDS, AT(op_timeout_s), 0.001, 1e7, "seconds an op waits for its ranks (CCS_TIMEOUT of a job overrides)"},
    {"io_timeout", K_SECONDS, AT(io_timeout_s), 0.01, 1e7, "seconds before a client stalled mid-frame or not reading is closed"},
    {"quota_connections", K_COUNT, AT(quota[TENANT_SESSIONS]), 0, 1.8e19, "connections per uid"},
    {"quota_comms", K_COUNT, AT(quota[TENANT_COMMS]), 0, 1.8e19, "communicators per uid"},
    {"quota_registered_bytes", K_BYTES, AT(quota[TENANT_REGISTERED_BYTES]), 0, 1.8e19, "registered bytes per uid; 0: physical memory"},
    {"quota_ops", K_COUNT, AT(quota[TENANT_OPS]), 0, 1.8e19, "ops in flight per uid"},
    {"allow_uids", K_IDS, AT(allow_uids), 0, 4294967294.0, "comma-separated uids allowed to connect; empty: any the socket lets in"},
    {"allow_gids", K_IDS, AT(allow_gids), 0, 4294967294.0, "comma-separated gids allowed to connect"},
    {"log_level", K_LEVEL, AT(log_level), 0, 3, "ERROR, WARN, INFO or TRACE (CCS_DEBUG too)"},
    {"log_subsys", K_SUBSYS, AT(log_subsys), 0, 0, "subsystems logged at INFO/TRACE: INIT,CLIENT,COLL,MEM,OPS or ALL (CCS_DEBUG_SUBSYS too)"},
    {"algo", K_RULES, AT(algo), 0, 0, "algorithm rules, e.g. all_reduce:ring;all_reduce:tree:0-64K (CCS_ALGO); empty: the cost model decides"},
    {"metrics_listen", K_ADDRESS, AT(metrics_listen), 0, 0, "HOST:PORT serving Prometheus metrics over HTTP; empty: off"},
    {"listen", K_ADDRESS, AT(listen), 0, 0, "HOST:PORT where other nodes' daemons connect (port 0: any); empty: this node only"},
    {"advertise", K_ADDRESS, AT(advertise), 0, 0, "HOST:PORT other daemons reach this one at; empty: the listen address (which then must name a host)"},
    {"peer_connections", K_COUNT, AT(peer_connections), 1, 64, "TCP connections per pair of daemons for one communicator's data (chunks take turns)"},
    {"heartbeat", K_SECONDS, AT(heartbeat_s), 0.01, 3600, "seconds between heartbeats to other daemons"},
    {"peer_timeout", K_SECONDS, AT(peer_timeout_s), 0.05, 1e6, "seconds without a word from another daemon before its comms fail"},
    {"peer_restart_grace", K_SECONDS, AT(peer_restart_grace_s), 0, 1e6, "seconds the comms of a daemon that went are held for it to come back (a restart), then fail; 0: they fail at once"},
    {"peer_replay_bytes", K_BYTES, AT(peer_replay_bytes), 0, 1 << 30, "bytes of a comm's last collective and last sends across daemons kept, to send again to a daemon that crashed (kill -9) before it took them; larger ones are not kept; 0: none"},
    {"cuda_legacy_ipc", K_BOOL, AT(cuda_legacy_ipc), 0, 1, "accept cudaMalloc'ed buffers by legacy cudaIpcMemHandle (ccs_mem_register): a bearer token, for trusted single-tenant nodes only"},
    {"admin_gids", K_IDS, AT(admin_gids), 0, 4294967294.0, "groups (names or gids) whose members are operators: see and abort every tenant's comms; root always is"},
    {"quota_ranks", K_COUNT, AT(quota[TENANT_RANKS]), 1, 1.8e19, "ranks per uid joined through this daemon (each costs per-op state)"},
    {"quota_buffers", K_COUNT, AT(quota[TENANT_BUFFERS]), 1, 1.8e19, "registered buffers per uid (each is a mapping: vm.max_map_count is shared by all)"},
    {"id_ttl", K_SECONDS, AT(id_ttl_s), 1, 1e9, "seconds a unique id is valid after it was issued"},
    {"metrics_tenant_labels", K_BOOL, AT(metrics_tenant_labels), 0, 1, "label the HTTP metrics per tenant (uid); off: summed over tenants (ccsctl metrics shows an operator every tenant)"},
    {"metrics_max_connections", K_COUNT, AT(metrics_max_connections), 1, 65536, "HTTP metrics connections at once; more are closed at once"},
    {"cluster_key_file", K_PATH, AT(cluster_key_file), 0, 0, "the key every daemon of the cluster holds (ccsd --generate-key FILE); listen refuses to start without it"},
    {"id_key_file", K_PATH, AT(id_key_file), 1, 0, "the key signing unique ids, made at first start and kept (the daemon's alone): ids stay valid across restarts; empty: the socket's path + .id-key"},
    {"peer_encrypt", K_BOOL, AT(peer_encrypt), 0, 1, "encrypt the data between daemons too (control messages always are); either side asking is enough"},
    {"peer_max_connections", K_COUNT, AT(peer_max_connections), 4, 1e6, "connections with other daemons at once (control and data); more are refused"},
    {"peer_unexpected_bytes", K_BYTES, AT(peer_unexpected_bytes), 1 << 20, 1.8e19, "bytes a connection from another daemon may hold before their receive is posted; beyond, it is closed"},
    {"peer_unexpected_total", K_BYTES, AT(peer_unexpected_total), 1 << 20, 1.8e19, "the same, over all connections"},
    {"transport", K_TRANSPORT, AT(transport), 0, 0, "how data moves between daemons: tcp, ib (RDMA verbs) or auto (ib where a port is active, else tcp); the same on every daemon"},
    {"ib_library", K_PATH, AT(ib_library), 1, 0, "the libibverbs transport=ib loads; empty: libibverbs.so.1"},
    {"ib_devices", K_PATH, AT(ib_devices), 1, 0, "RDMA devices and ports to use, e.g. mlx5_0:1,mlx5_1 (the active ones, up to 8; connections take them in turn); empty: every active port"},
    {"ib_gid_index", K_COUNT, AT(ib_gid_index), -1, 255, "the GID table entry RDMA traffic uses; -1: RoCE v2 with an IPv4 address where there is one"},
    {"link_capacity", K_BYTES, AT(link_capacity), 0, 1.8e19, "bytes a second this daemon can send to each other daemon, for tenant_max_share on links; 0: the fastest rate measured"},
    {"tenant_weights", K_WEIGHTS, AT(tenant_weights), 0.01, 1000, "each user's weight in the shares of executor time, links and GPUs: USER:WEIGHT,... (names or uids; everyone else 1); reloadable"},
    {"tenant_max_share", K_FRACTION, AT(tenant_max_share), 0.01, 1, "the most of the executor's and each link's capacity one tenant may take, even when the others are idle; reloadable"},
    {"poll_spin_us", K_COUNT, AT(poll_spin_us), 0, 1e6, "microseconds the loop keeps polling the clients' rings after their last op, before it sleeps (0: never spins)"},
    {"executor_priority", K_PRIORITY, AT(executor_priority), 0, 2, "executor threads against the node's others: normal, low (nice 10) or idle (SCHED_IDLE: on CPUs nothing else wants; wake-ups never wait behind bulk work)"},
};
#define NKEYS (sizeof(keys) / sizeof(keys[0]))

static const char *const levels[] = {"ERROR", "WARN", "INFO", "TRACE"};
static const char *const priorities[] = {"normal", "low", "idle"}; /* enum executor_priority */

void ccsd_config_defaults(struct ccsd_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  snprintf(cfg->socket_path, sizeof(cfg->socket_path), "%s", CCSD_DEFAULT_SOCKET);
  cfg->socket_mode = 0660;
  cfg->threads = 0;
  cfg->init_timeout_s = 60;
  cfg->op_timeout_s = 600; /* PyTorch's default for NCCL */
  cfg->io_timeout_s = 10;
  cfg->chunk_bytes = 256 << 10;
  cfg->stream_bytes = 64 << 20;
  cfg->scratch_keep = (size_t)256 << 20;
  cfg->inline_bytes = 256 << 10; /* docs/performance.md, "Medium messages" */
  /* per uid; connections as systemd's varlink allows per uid */
  cfg->quota[TENANT_SESSIONS] = 1024;
  cfg->quota[TENANT_COMMS] = 1024;
  cfg->quota[TENANT_REGISTERED_BYTES] = 0;
  cfg->quota[TENANT_OPS] = 65536;
  cfg->quota[TENANT_RANKS] = 4096;
  cfg->quota[TENANT_BUFFERS] = 4096;
  cfg->id_ttl_s = 24 * 3600;
  cfg->metrics_max_connections = 16;
  snprintf(cfg->cluster_key_file, sizeof(cfg->cluster_key_file), "%s", CCSD_DEFAULT_CLUSTER_KEY);
  snprintf(cfg->transport, sizeof(cfg->transport), "tcp");
  cfg->ib_gid_index = -1;
  cfg->peer_max_connections = 1024;
  cfg->peer_unexpected_bytes = 1ull << 30;
  cfg->peer_unexpected_total = 4ull << 30;
  cfg->log_level = CCS_LOG_WARN;
  cfg->log_subsys = CCS_LOG_ALL;
  cfg->heartbeat_s = 1;
  cfg->peer_connections = 2;
  cfg->peer_timeout_s = 5;
  cfg->peer_restart_grace_s = 30;
  cfg->peer_replay_bytes = 64 << 10;
  cfg->poll_spin_us = 50;
  cfg->tenant_max_share = 1;
}

/* What "0" means for the keys where it means "as the machine has". */
void ccsd_config_resolve(struct ccsd_config *cfg) {
  if (cfg->threads == 0) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    cfg->threads = cpus > 0 ? (int)cpus : 1;
  }
  if (cfg->quota[TENANT_REGISTERED_BYTES] == 0)
    cfg->quota[TENANT_REGISTERED_BYTES] =
        (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
}

static int parse_double(const char *v, double min, double max, double *ret) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || !isfinite(x)) return -1;
  double scale = 1;
  if (*end && !end[1]) switch (*end) {
    case 'K': case 'k': scale = 1024.0, end++; break;
    case 'M': case 'm': scale = 1048576.0, end++; break;
    case 'G': case 'g': scale = 1073741824.0, end++; break;
    default: break;
    }
  x *= scale;
  if (*end || x < min || x > max) return -1;
  *ret = x;
  return 0;
}

static int *ids_count(struct ccsd_config *cfg, const struct key *k) {
  return k->offset == offsetof(struct ccsd_config, allow_uids) ? &cfg->nallow_uids
         : k->offset == offsetof(struct ccsd_config, allow_gids) ? &cfg->nallow_gids
                                                                 : &cfg->nadmin_gids;
}

/* Numbers, or names looked up once here (never on the loop): user names
 * for the uid list, group names for the gid lists. */
static int set_ids(void *field, int *count, const char *v, const struct key *k) {
  uint32_t ids[CCSD_MAX_ALLOW];
  int n = 0;
  char copy[1024];
  snprintf(copy, sizeof(copy), "%s", v);
  int users = k->offset == offsetof(struct ccsd_config, allow_uids);
  for (char *save, *tok = strtok_r(copy, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
    double x;
    if (n == CCSD_MAX_ALLOW) return -1;
    if (!isdigit((unsigned char)tok[0])) {
      struct passwd *pw = users ? getpwnam(tok) : NULL;
      struct group *gr = users ? NULL : getgrnam(tok);
      if (!pw && !gr) return -1;
      ids[n++] = users ? (uint32_t)pw->pw_uid : (uint32_t)gr->gr_gid;
      continue;
    }
    if (parse_double(tok, k->min, k->max, &x) || x != floor(x)) return -1;
    ids[n++] = (uint32_t)x;
  }
  memcpy(field, ids, sizeof(uint32_t) * (size_t)n);
  *count = n;
  return 0;
}

/* USER:WEIGHT,... : names looked up once here, never on the loop. */
static int set_weights(struct ccsd_config *cfg, const char *v, const struct key *k, char *err,
                       size_t errlen) {
  uint32_t uids[CCSD_MAX_WEIGHTS];
  double weights[CCSD_MAX_WEIGHTS];
  int n = 0;
  char copy[sizeof(cfg->tenant_weights)];
  if (strlen(v) >= sizeof(copy)) {
    snprintf(err, errlen, "tenant_weights is longer than %zu characters", sizeof(copy) - 1);
    return -1;
  }
  snprintf(copy, sizeof(copy), "%s", v);
  for (char *save, *tok = strtok_r(copy, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
    char *colon = strrchr(tok, ':');
    double w, id;
    if (!colon || colon == tok || parse_double(colon + 1, k->min, k->max, &w)) {
      snprintf(err, errlen, "bad entry '%s' in tenant_weights: USER:WEIGHT with a weight from %g "
                            "to %g expected", tok, k->min, k->max);
      return -1;
    }
    *colon = 0;
    if (isdigit((unsigned char)tok[0])) {
      if (parse_double(tok, 0, 4294967294.0, &id) || id != floor(id)) {
        snprintf(err, errlen, "bad uid '%s' in tenant_weights", tok);
        return -1;
      }
    } else {
      struct passwd pwd, *pw = NULL;
      char buf[4096]; /* a reload reads this on a worker thread: the reentrant lookup */
      if (getpwnam_r(tok, &pwd, buf, sizeof(buf), &pw) || !pw) {
        snprintf(err, errlen, "no user '%s' (tenant_weights)", tok);
        return -1;
      }
      id = pw->pw_uid;
    }
    for (int i = 0; i < n; i++)
      if (uids[i] == (uint32_t)id) {
        snprintf(err, errlen, "user '%s' (uid %u) is given twice in tenant_weights", tok, uids[i]);
        return -1;
      }
    if (n == CCSD_MAX_WEIGHTS) {
      snprintf(err, errlen, "more than %d users in tenant_weights", CCSD_MAX_WEIGHTS);
      return -1;
    }
    uids[n] = (uint32_t)id;
    weights[n++] = w;
  }
  memcpy(cfg->weight_uids, uids, sizeof(uids[0]) * (size_t)n);
  memcpy(cfg->weights, weights, sizeof(weights[0]) * (size_t)n);
  cfg->nweights = n;
  snprintf(cfg->tenant_weights, sizeof(cfg->tenant_weights), "%s", v);
  return 0;
}

int ccsd_config_set(struct ccsd_config *cfg, const char *name, const char *value, char *err,
                    size_t errlen) {
  const struct key *k = NULL;
  for (size_t i = 0; i < NKEYS; i++)
    if (!strcmp(keys[i].name, name)) k = &keys[i];
  if (!k) {
    snprintf(err, errlen, "unknown key '%s'", name);
    return -1;
  }
  void *field = (char *)cfg + k->offset;
  double x;
  int bad = 0;
  switch (k->type) {
  case K_PATH: /* (min 1: may be empty, which means what its help says) */
    bad = (!*value && !k->min) || strlen(value) >= k->size - 1;
    if (!bad) snprintf(field, k->size, "%s", value);
    break;
  case K_MODE: {
    char *end;
    unsigned long m = strtoul(value, &end, 8);
    bad = !*value || *end || m > 0777;
    if (!bad) *(unsigned *)field = (unsigned)m;
    break;
  }
  case K_COUNT:
  case K_BYTES:
    bad = parse_double(value, k->min, k->max, &x) || x != floor(x);
    if (!bad) {
      if (k->size == sizeof(int)) *(int *)field = (int)x;
      else *(uint64_t *)field = (uint64_t)x; /* size_t and uint64_t alike here */
    }
    break;
  case K_SECONDS:
  case K_FRACTION:
    bad = parse_double(value, k->min, k->max, &x);
    if (!bad) *(double *)field = x;
    break;
  case K_WEIGHTS:
    return set_weights(cfg, value, k, err, errlen);
  case K_IDS:
    bad = set_ids(field, ids_count(cfg, k), value, k);
    break;
  case K_LEVEL:
  case K_PRIORITY: {
    const char *const *names = k->type == K_LEVEL ? levels : priorities;
    bad = 1;
    for (int i = 0; i <= (int)k->max; i++)
      if (!strcasecmp(value, names[i])) *(int *)field = i, bad = 0;
    break;
  }
  case K_SUBSYS: {
    int mask = ccs__log_parse_subsys(value);
    bad = mask < 0;
    if (!bad) *(int *)field = mask;
    break;
  }
  case K_RULES: {
    struct algo_rules rules;
    char why[256];
    bad = strlen(value) >= sizeof(cfg->algo) || ccsd_algo_rules_parse(value, &rules, why, sizeof(why));
    if (bad) {
      snprintf(err, errlen, "bad value for %s: %s", name, why);
      return -1;
    }
    snprintf(field, sizeof(cfg->algo), "%s", value);
    break;
  }
  case K_TRANSPORT:
    if (strlen(value) >= k->size || (strcmp(value, "auto") && !ccs_transport_find(value))) {
      char names[128];
      ccs_transport_names(names, sizeof(names));
      snprintf(err, errlen, "bad value '%s' for %s: the transports are %s, or auto", value, name, names);
      return -1;
    }
    snprintf(field, k->size, "%s", value);
    break;
  case K_BOOL:
    bad = 1;
    for (int i = 0; i < 2; i++)
      if (!strcasecmp(value, i ? "true" : "false") || !strcmp(value, i ? "1" : "0"))
        *(int *)field = i, bad = 0;
    break;
  case K_ADDRESS: {
    /* a port alone is on localhost (the metrics endpoint's default) */
    char local[32];
    if (*value && (strspn(value, "0123456789") == strlen(value) ||
                   (value[0] == ':' && strspn(value + 1, "0123456789") == strlen(value + 1)))) {
      snprintf(local, sizeof(local), "127.0.0.1:%.8s", value + (value[0] == ':'));
      value = local;
    }
    const char *colon = strrchr(value, ':');
    bad = *value && (!colon || colon == value || parse_double(colon + 1, 0, 65535, &x) ||
                     strlen(value) >= k->size);
    if (!bad) snprintf(field, k->size, "%s", value);
    break;
  }
  }
  if (bad) {
    snprintf(err, errlen, "bad value '%s' for %s (%s)", value, name, k->help);
    return -1;
  }
  return 0;
}

struct file_state {
  struct ccsd_config *cfg;
  char err[512];
};

static int on_ini_pair(void *user, const char *section, const char *name, const char *value) {
  struct file_state *st = user;
  if (section && *section && strcmp(section, "ccsd")) {
    snprintf(st->err, sizeof(st->err), "unknown section [%s]", section);
    return 0;
  }
  return ccsd_config_set(st->cfg, name, value, st->err, sizeof(st->err)) == 0;
}

int ccsd_config_load_file(struct ccsd_config *cfg, const char *path, int must_exist, char *err,
                          size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    if (!must_exist && errno == ENOENT) return 0;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
  }
  struct file_state st = {cfg, ""};
  int line = ini_parse_file(f, on_ini_pair, &st);
  fclose(f);
  if (line == 0) return 0;
  if (line < 0) snprintf(err, errlen, "%s: cannot read", path);
  else snprintf(err, errlen, "%s:%d: %s", path, line, st.err[0] ? st.err : "syntax error");
  return -1;
}

int ccsd_config_load_env(struct ccsd_config *cfg, char *err, size_t errlen) {
  for (size_t i = 0; i < NKEYS; i++) {
    char var[64] = "CCS_";
    for (size_t j = 0; keys[i].name[j] && j + 5 < sizeof(var); j++)
      var[4 + j] = (char)toupper((unsigned char)keys[i].name[j]);
    const char *v = getenv(var);
    if (keys[i].type == K_LEVEL && !v) v = getenv("CCS_DEBUG"); /* as NCCL_DEBUG */
    if (keys[i].type == K_SUBSYS && !v) v = getenv("CCS_DEBUG_SUBSYS");
    if (!v) continue;
    char why[480];
    if (ccsd_config_set(cfg, keys[i].name, v, why, sizeof(why))) {
      snprintf(err, errlen, "environment %s: %s", var, why);
      return -1;
    }
  }
  return 0;
}

/* --KEY=VALUE or --KEY VALUE ('-' or '_' in KEY), up to --tune-table;
 * --config and --check-config are main's. */
static int load_args(struct ccsd_config *cfg, int argc, char **argv, char *err, size_t errlen) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--config")) {
      i++;
      continue;
    }
    if (!strncmp(a, "--config=", 9) || !strcmp(a, "--check-config")) continue;
    if (!strcmp(a, "--tune-table")) break;
    char key[64];
    const char *value = NULL, *eq = strchr(a, '=');
    size_t klen = eq ? (size_t)(eq - a) : strlen(a);
    if (strncmp(a, "--", 2) || klen - 2 >= sizeof(key)) {
      snprintf(err, errlen, "unexpected argument '%s' (see --help)", a);
      return -1;
    }
    memcpy(key, a + 2, klen - 2);
    key[klen - 2] = 0;
    for (char *c = key; *c; c++) *c = *c == '-' ? '_' : *c;
    /* the old spellings of two keys */
    if (!strcmp(key, "chunk")) snprintf(key, sizeof(key), "chunk_bytes");
    if (!strcmp(key, "allow_uid") || !strcmp(key, "allow_gid")) strcat(key, "s");
    if (eq) value = eq + 1;
    else if (i + 1 < argc) value = argv[++i];
    if (!value) {
      snprintf(err, errlen, "--%s needs a value", key);
      return -1;
    }
    char why[900];
    if (ccsd_config_set(cfg, key, value, why, sizeof(why))) {
      snprintf(err, errlen, "command line: %s", why);
      return -1;
    }
  }
  return 0;
}

int ccsd_config_load(struct ccsd_config *cfg, int argc, char **argv, char *err, size_t errlen) {
  const char *path = CCSD_DEFAULT_CONFIG;
  int explicit_path = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--config") && i + 1 < argc) path = argv[++i], explicit_path = 1;
    else if (!strncmp(argv[i], "--config=", 9)) path = argv[i] + 9, explicit_path = 1;
  }
  ccsd_config_defaults(cfg);
  if (ccsd_config_load_file(cfg, path, explicit_path, err, errlen) ||
      ccsd_config_load_env(cfg, err, errlen) || load_args(cfg, argc, argv, err, errlen))
    return -1;
  ccsd_config_resolve(cfg);
  return 0;
}

/* "key = value" lines, as the file takes them back. */
void ccsd_config_format(const struct ccsd_config *cfg, char *buf, size_t len) {
  size_t n = 0;
  for (size_t i = 0; i < NKEYS && n < len; i++) {
    const struct key *k = &keys[i];
    const void *f = (const char *)cfg + k->offset;
    char v[1100] = "";
    switch (k->type) {
    case K_PATH: case K_ADDRESS: case K_RULES: case K_TRANSPORT: case K_WEIGHTS:
      snprintf(v, sizeof(v), "%s", (const char *)f);
      break;
    case K_MODE: snprintf(v, sizeof(v), "%04o", *(const unsigned *)f); break;
    case K_COUNT: case K_BYTES:
      if (k->size == sizeof(int)) snprintf(v, sizeof(v), "%d", *(const int *)f);
      else snprintf(v, sizeof(v), "%llu", (unsigned long long)*(const uint64_t *)f);
      break;
    case K_SECONDS: case K_FRACTION: snprintf(v, sizeof(v), "%g", *(const double *)f); break;
    case K_IDS: {
      int count = *ids_count((struct ccsd_config *)cfg, k);
      size_t m = 0;
      for (int j = 0; j < count && m + 12 < sizeof(v); j++)
        m += (size_t)snprintf(v + m, sizeof(v) - m, "%s%u", j ? "," : "", ((const uint32_t *)f)[j]);
      break;
    }
    case K_LEVEL: snprintf(v, sizeof(v), "%s", levels[*(const int *)f]); break;
    case K_PRIORITY: snprintf(v, sizeof(v), "%s", priorities[*(const int *)f]); break;
    case K_BOOL: snprintf(v, sizeof(v), "%s", *(const int *)f ? "true" : "false"); break;
    case K_SUBSYS: {
      static const char *const names[] = {"INIT", "CLIENT", "COLL", "MEM", "OPS"};
      int mask = *(const int *)f;
      size_t m = 0;
      if (mask == CCS_LOG_ALL) snprintf(v, sizeof(v), "ALL");
      else
        for (int b = 0; b < 5; b++)
          if (mask & (1 << b)) m += (size_t)snprintf(v + m, sizeof(v) - m, "%s%s", m ? "," : "", names[b]);
      break;
    }
    }
    n += (size_t)snprintf(buf + n, len - n, "%s = %s\n", k->name, v);
  }
}

/* The documented example file: every key, its default, what it does. */
void ccsd_config_example(FILE *out) {
  struct ccsd_config def;
  ccsd_config_defaults(&def);
  char values[16384];
  ccsd_config_format(&def, values, sizeof(values));
  fprintf(out, "# ccsd configuration (%s). Every key with its default.\n"
               "# CCS_<KEY> in the environment and --key=value on the command line override it.\n"
               "[ccsd]\n", CCSD_DEFAULT_CONFIG);
  char *save, *line = strtok_r(values, "\n", &save);
  for (size_t i = 0; i < NKEYS && line; i++, line = strtok_r(NULL, "\n", &save))
    fprintf(out, "\n# %s\n%s\n", keys[i].help, line);
}

int ccsd_config_is_key(const char *name) {
  for (size_t i = 0; i < NKEYS; i++)
    if (!strcmp(keys[i].name, name)) return 1;
  return 0;
}

/* The same as a Markdown table, for the documentation (docs/operations.md
 * is made from it: scripts/gen_docs.sh). */
void ccsd_config_table(FILE *out) {
  struct ccsd_config def;
  ccsd_config_defaults(&def);
  char values[16384];
  ccsd_config_format(&def, values, sizeof(values));
  fprintf(out, "| key | default | meaning |\n|---|---|---|\n");
  char *save, *line = strtok_r(values, "\n", &save);
  for (size_t i = 0; i < NKEYS && line; i++, line = strtok_r(NULL, "\n", &save)) {
    const char *v = strstr(line, " = ");
    v = v ? v + 3 : "";
    fprintf(out, "| %s | %s | %s |\n", keys[i].name, *v ? v : "(empty)", keys[i].help);
  }
}
