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
  enum { O_SOCKET = 256, O_MODE, O_THREADS, O_INIT_TIMEOUT, O_CHUNK, O_STREAM, O_VERSION, O_HELP };
  static const struct option opts[] = {
      {"socket", required_argument, 0, O_SOCKET},
      {"socket-mode", required_argument, 0, O_MODE},
      {"threads", required_argument, 0, O_THREADS},
      {"init-timeout", required_argument, 0, O_INIT_TIMEOUT},
      {"chunk", required_argument, 0, O_CHUNK},
      {"stream-bytes", required_argument, 0, O_STREAM},
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
  memset(&d, 0, sizeof(d));
  const char *env_socket = getenv("CCS_SOCKET");
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  d.cfg.socket_path = env_socket && *env_socket ? env_socket : DEFAULT_SOCKET;
  d.cfg.socket_mode = 0660;
  d.cfg.threads = cpus > 0 ? (int)cpus : 1;
  d.cfg.init_timeout_s = 60;
  d.cfg.chunk_bytes = 256 << 10;
  d.cfg.stream_bytes = 64 << 20;
  ccs__log_init(getenv("CCS_DEBUG"));
  if (parse_args(argc, argv, &d.cfg)) return 2;

  signal(SIGPIPE, SIG_IGN);
  d.loop = uv_default_loop();
  d.listen_fd = -1;
  list_init(&d.sessions);
  list_init(&d.comms);
  d.exec = ccsd_executor_new(&d, d.cfg.threads);
  if (!d.exec) {
    LOG_ERROR("cannot start %d executor threads", d.cfg.threads);
    return 1;
  }
  if (ccsd_server_start(&d)) {
    ccsd_executor_stop(d.exec);
    uv_run(d.loop, UV_RUN_DEFAULT);
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

  /* Close what the loop still holds, then let the close callbacks run. */
  uv_close((uv_handle_t *)&d.sig_term, NULL);
  uv_close((uv_handle_t *)&d.sig_int, NULL);
  ccsd_server_stop(&d);
  ccsd_executor_stop(d.exec);
  uv_run(d.loop, UV_RUN_DEFAULT);
  uv_loop_close(d.loop);
  LOG_INFO("stopped");
  return 0;
}
