/* ccsd: the per-node collectives daemon. Runs in the foreground, logs to
 * stderr, stops cleanly on SIGTERM/SIGINT. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "log.h"

#define DEFAULT_SOCKET "/run/ccs/ccsd.sock"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ccsd [options]\n"
          "  --socket PATH        Unix socket to listen on (default $CCS_SOCKET or " DEFAULT_SOCKET ")\n"
          "  --socket-mode OCTAL  permissions of the socket (default 0660)\n"
          "  --threads N          executor threads (default: online CPUs)\n"
          "  --init-timeout SEC   how long ccs_comm_init_rank waits for all ranks (default 60)\n"
          "  --chunk BYTES        bytes per executor task (default 262144)\n"
          "  --stream-bytes BYTES ops writing this much or more use non-temporal stores\n"
          "                       (default 67108864; 0 always, a huge value never)\n"
          "  --op-timeout SEC     deadline of one op; CCS_TIMEOUT of a job overrides (default 600)\n"
          "  --io-timeout SEC     close clients stalled mid-frame or not reading (default 10)\n"
          "  --quota-connections N, --quota-comms N, --quota-registered-bytes N,\n"
          "  --quota-ops N        per-uid limits (defaults 1024, 1024, physical memory, 65536)\n"
          "  --allow-uid UID, --allow-gid GID  only these may connect (repeatable; default:\n"
          "                       whoever the socket's mode and group let in)\n"
          "  --version            print the version and exit\n"
          "environment: CCS_DEBUG=WARN|INFO|TRACE\n");
}

static int parse_number(const char *s, double min, double max, double *ret) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || v < min || v > max) return -1;
  *ret = v;
  return 0;
}

static void on_signal(uv_signal_t *h, int signum) {
  struct daemon *d = h->data;
  LOG_INFO("signal %d: stopping", signum);
  d->stopping = 1;
  ccsd_server_stop(d);
  uv_stop(d->loop);
}

static int parse_args(int argc, char **argv, struct ccsd_config *cfg) {
  enum { O_SOCKET = 256, O_MODE, O_THREADS, O_INIT_TIMEOUT, O_CHUNK, O_STREAM, O_OP_TIMEOUT,
         O_IO_TIMEOUT, O_Q_CONN, O_Q_COMMS, O_Q_BYTES, O_Q_OPS, O_ALLOW_UID, O_ALLOW_GID,
         O_VERSION, O_HELP };
  static const struct option opts[] = {
      {"socket", required_argument, 0, O_SOCKET},
      {"socket-mode", required_argument, 0, O_MODE},
      {"threads", required_argument, 0, O_THREADS},
      {"init-timeout", required_argument, 0, O_INIT_TIMEOUT},
      {"chunk", required_argument, 0, O_CHUNK},
      {"stream-bytes", required_argument, 0, O_STREAM},
      {"op-timeout", required_argument, 0, O_OP_TIMEOUT},
      {"io-timeout", required_argument, 0, O_IO_TIMEOUT},
      {"quota-connections", required_argument, 0, O_Q_CONN},
      {"quota-comms", required_argument, 0, O_Q_COMMS},
      {"quota-registered-bytes", required_argument, 0, O_Q_BYTES},
      {"quota-ops", required_argument, 0, O_Q_OPS},
      {"allow-uid", required_argument, 0, O_ALLOW_UID},
      {"allow-gid", required_argument, 0, O_ALLOW_GID},
      {"version", no_argument, 0, O_VERSION},
      {"help", no_argument, 0, O_HELP},
      {0, 0, 0, 0}};
  int c;
  double v;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (c) {
    case O_SOCKET: cfg->socket_path = optarg; break;
    case O_MODE: {
      char *end;
      unsigned long m = strtoul(optarg, &end, 8);
      if (*end || m > 0777) goto bad;
      cfg->socket_mode = (unsigned)m;
      break;
    }
    case O_THREADS:
      if (parse_number(optarg, 1, 256, &v)) goto bad;
      cfg->threads = (int)v;
      break;
    case O_INIT_TIMEOUT:
      if (parse_number(optarg, 0.001, 86400, &v)) goto bad;
      cfg->init_timeout_s = v;
      break;
    case O_CHUNK:
      if (parse_number(optarg, 4096, 1 << 30, &v)) goto bad;
      cfg->chunk_bytes = (size_t)v;
      break;
    case O_STREAM:
      if (parse_number(optarg, 0, 1e18, &v)) goto bad;
      cfg->stream_bytes = (size_t)v;
      break;
    case O_OP_TIMEOUT:
      if (parse_number(optarg, 0.001, 1e7, &v)) goto bad;
      cfg->op_timeout_s = v;
      break;
    case O_IO_TIMEOUT:
      if (parse_number(optarg, 0.01, 1e7, &v)) goto bad;
      cfg->io_timeout_s = v;
      break;
    case O_Q_CONN:
    case O_Q_COMMS:
    case O_Q_BYTES:
    case O_Q_OPS:
      if (parse_number(optarg, 0, 1.8e19, &v)) goto bad;
      cfg->quota[c - O_Q_CONN] = (uint64_t)v;
      break;
    case O_ALLOW_UID:
      if (parse_number(optarg, 0, 4294967294.0, &v) || cfg->nallow_uids == CCSD_MAX_ALLOW) goto bad;
      cfg->allow_uids[cfg->nallow_uids++] = (uid_t)v;
      break;
    case O_ALLOW_GID:
      if (parse_number(optarg, 0, 4294967294.0, &v) || cfg->nallow_gids == CCSD_MAX_ALLOW) goto bad;
      cfg->allow_gids[cfg->nallow_gids++] = (gid_t)v;
      break;
    case O_VERSION:
      printf("ccsd %d.%d.%d (protocol %u)\n", CCS_VERSION_MAJOR, CCS_VERSION_MINOR,
             CCS_VERSION_PATCH, CCS__PROTOCOL_VERSION);
      exit(0);
    case O_HELP: usage(stdout); exit(0);
    default: usage(stderr); return -1;
    }
  }
  if (optind != argc) {
    fprintf(stderr, "ccsd: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return -1;
  }
  return 0;
bad:
  fprintf(stderr, "ccsd: bad value '%s' for --%s\n", optarg, opts[c - O_SOCKET].name);
  return -1;
}

int main(int argc, char **argv) {
  struct daemon d;
  const char *env_socket = getenv("CCS_SOCKET");
  ccsd_config_defaults(&d.cfg);
  d.cfg.socket_path = env_socket && *env_socket ? env_socket : DEFAULT_SOCKET;
  ccs__log_init(getenv("CCS_DEBUG"));
  if (parse_args(argc, argv, &d.cfg)) return 2;

  signal(SIGPIPE, SIG_IGN);
  if (ccsd_daemon_init(&d, uv_default_loop())) return 1;
  if (ccsd_server_start(&d)) {
    ccsd_daemon_close(&d);
    return 1;
  }
  uv_signal_init(d.loop, &d.sig_term);
  uv_signal_init(d.loop, &d.sig_int);
  d.sig_term.data = d.sig_int.data = &d;
  uv_signal_start(&d.sig_term, on_signal, SIGTERM);
  uv_signal_start(&d.sig_int, on_signal, SIGINT);
  LOG_INFO("listening on %s with %d executor threads (host memory only)", d.cfg.socket_path,
           d.cfg.threads);

  uv_run(d.loop, UV_RUN_DEFAULT);

  uv_close((uv_handle_t *)&d.sig_term, NULL);
  uv_close((uv_handle_t *)&d.sig_int, NULL);
  ccsd_daemon_close(&d);
  LOG_INFO("stopped");
  return 0;
}
