/* ccsd: the per-node collectives daemon. Runs in the foreground, logs to
 * stderr, stops cleanly on SIGTERM/SIGINT, reloads its configuration on
 * SIGHUP (reload.c). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"
#include "base/failpoint.h"
#include "front/front.h"
#include "base/log.h"
#include "plan/tuner.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ccsd [--config FILE] [--check-config] [--KEY=VALUE ...] [--version]\n"
          "       ccsd --generate-key FILE     (the cluster key daemons prove to each other)\n"
          "Reads " CCSD_DEFAULT_CONFIG " (or --config FILE), then CCS_<KEY> variables,\n"
          "then --KEY=VALUE (or --KEY VALUE; '-' or '_' in KEY). Keys, with defaults:\n\n");
  ccsd_config_example(f);
}

static void stop_now(struct daemon *d) {
  uv_timer_stop(&d->drain);
  d->stopping = 1;
  ccsd_server_stop(d);
  uv_stop(d->loop);
}

/* Where other daemons would hold this one's comms for its restart, it
 * stops between ops: those under way across daemons finish first, and
 * what other daemons already sent is taken (their ops launch here too);
 * no other collective launches (sends and receives across daemons do: a
 * receive takes what was sent, a send lets its receiver finish). Stopped
 * in the middle of one, an op might have finished at another daemon and
 * not here, which no restart makes whole (docs/restart.md). It stops once
 * that was so for DRAIN_QUIET_MS (a message on its way shows up), or
 * after DRAIN_MS. */
#define DRAIN_MS 2000
#define DRAIN_QUIET_MS 50
static void on_drain(uv_timer_t *t) {
  struct daemon *d = t->data;
  uint64_t now = uv_now(d->loop);
  if (ccsd_span_drain_step(&d->coll)) d->drain_quiet_ms = now;
  if (now - d->drain_quiet_ms >= DRAIN_QUIET_MS || now >= d->drain_until_ms) stop_now(d);
}

static void on_signal(uv_signal_t *h, int signum) {
  struct daemon *d = h->data;
  if (d->coll.draining) return; /* stopping already */
  LOG_INFO(CCS_LOG_INIT, "signal %d: stopping", signum);
  if (d->coll.peers && d->cfg.peer_restart_grace_s > 0) {
    d->coll.draining = 1;
    d->drain_until_ms = d->drain_quiet_ms = uv_now(d->loop);
    d->drain_until_ms += DRAIN_MS;
    uv_timer_start(&d->drain, on_drain, 1, 1);
    return;
  }
  stop_now(d);
}

static void on_hangup(uv_signal_t *h, int signum) {
  (void)signum;
  ccsd_reload_start(h->data, 0, 0);
}

/* ccsd --dump-schedule ring all_reduce 5: every participant's steps, and
 * the checker's verdict. */
static int dump_schedule(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: ccsd --dump-schedule ALGO COLLECTIVE N [ROOT]\n");
    return 2;
  }
  int algo = -1, coll = -1, n = atoi(argv[2]), root = argc > 3 ? atoi(argv[3]) : 0;
  for (int a = 0; a < SCHED_ALGO_COUNT; a++)
    if (!strcmp(argv[0], sched_algo_name((enum sched_algo)a))) algo = a;
  for (int c = 0; c < SCHED_COLL_COUNT; c++)
    if (!strcmp(argv[1], sched_coll_name((enum sched_coll)c))) coll = c;
  if (algo < 0 || coll < 0 || n < 1 || n > 64 || root < 0 || root >= n) {
    fprintf(stderr, "ccsd: unknown algorithm or collective, or bad N/ROOT\n");
    return 2;
  }
  struct schedule *s = calloc((size_t)n, sizeof(*s));
  char *text = malloc(1 << 16), err[256];
  int rc = 0;
  for (int p = 0; p < n && rc == 0; p++) {
    rc = sched_build((enum sched_algo)algo, (enum sched_coll)coll, n, p, root, 1, &s[p]);
    if (rc == 0) {
      sched_dump(&s[p], p, text, 1 << 16);
      fputs(text, stdout);
    }
  }
  if (rc) fprintf(stderr, "ccsd: %s does not build %s for %d participants\n", argv[0], argv[1], n);
  else if (sched_check((enum sched_coll)coll, n, root, s, err, sizeof(err))) {
    printf("checker: WRONG: %s\n", err);
    rc = 1;
  } else {
    printf("checker: proven (every send received, no deadlock, every block as %s requires)\n", argv[1]);
  }
  for (int p = 0; p < n; p++) sched_free(&s[p]);
  free(s);
  free(text);
  return rc ? 1 : 0;
}

/* ccsd --tune-table N: what the tuner picks between N daemons over TCP. */
static int tune_table(int n, const struct ccsd_config *cfg) {
  struct algo_rules rules = {.n = 0};
  char err[256], why[256];
  if (cfg->algo[0] && ccsd_algo_rules_parse(cfg->algo, &rules, err, sizeof(err))) {
    fprintf(stderr, "ccsd: %s\n", err);
    return 2;
  }
  printf("| collective | %d participants: 8 B | 64 KiB | 1 MiB | 16 MiB | 256 MiB |\n|---|---|---|---|---|---|\n", n);
  static const uint64_t sizes[] = {8, 64 << 10, 1 << 20, 16 << 20, 256u << 20};
  for (int c = 0; c < SCHED_COLL_COUNT; c++) {
    printf("| %s |", sched_coll_name((enum sched_coll)c));
    for (int i = 0; i < 5; i++)
      printf(" %s |", sched_algo_name(ccsd_tune((enum sched_coll)c, n, sizes[i], &ccsd_link_tcp,
                                                &rules, why, sizeof(why))));
    printf("\n");
  }
  return 0;
}

/* ccsd --generate-key FILE: a new cluster key, readable by its owner only.
 * Never overwrites: replacing a key is a decision, not an accident. */
static int generate_key(const char *path) {
  char err[160];
  if (!path) {
    fprintf(stderr, "usage: ccsd --generate-key FILE\n");
    return 2;
  }
  if (ccs_auth_init(err, sizeof(err))) {
    fprintf(stderr, "ccsd: %s\n", err);
    return 1;
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    fprintf(stderr, "ccsd: %s: %s%s\n", path, strerror(errno),
            errno == EEXIST ? " (remove it first to replace the key)" : "");
    return 1;
  }
  char text[66];
  ccs_auth_new_key_text(text);
  int ok = write(fd, text, 65) == 65 && fsync(fd) == 0;
  sodium_memzero(text, sizeof(text));
  if (close(fd) || !ok) {
    fprintf(stderr, "ccsd: cannot write %s: %s\n", path, strerror(errno));
    unlink(path);
    return 1;
  }
  printf("wrote a new cluster key to %s: every daemon of the cluster needs the same file "
         "(cluster_key_file), owned by the daemon's user, mode 0600\n", path);
  return 0;
}

/* The commands that do one thing and exit, then the configuration's
 * sources (config.c: ccsd_config_load, which a reload runs again). */
static int configure(int argc, char **argv, struct ccsd_config *cfg, int *check_only) {
  int tune = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--config")) {
      i++;
    } else if (!strcmp(a, "--check-config")) {
      *check_only = 1;
    } else if (!strcmp(a, "--version")) {
      printf("ccsd %d.%d.%d (protocol %u)\n", CCS_VERSION_MAJOR, CCS_VERSION_MINOR,
             CCS_VERSION_PATCH, CCS__PROTOCOL_VERSION);
      exit(0);
    } else if (!strcmp(a, "--dump-schedule")) { /* ALGO COLLECTIVE N [ROOT] */
      exit(dump_schedule(argc - i - 1, argv + i + 1));
    } else if (!strcmp(a, "--tune-table")) { /* N: the model's choices over sizes */
      tune = i + 1 < argc ? atoi(argv[i + 1]) : 4;
      break; /* the keys before it count */
    } else if (!strcmp(a, "--generate-key")) {
      exit(generate_key(i + 1 < argc ? argv[i + 1] : NULL));
    } else if (!strcmp(a, "--print-config-table")) { /* docs/operations.md */
      ccsd_config_table(stdout);
      exit(0);
    } else if (!strcmp(a, "--print-example-config")) {
      ccsd_config_example(stdout);
      exit(0);
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      exit(0);
    }
  }
  char err[1024];
  if (ccsd_config_load(cfg, argc, argv, err, sizeof(err))) {
    fprintf(stderr, "ccsd: %s\n", err);
    return -1;
  }
  if (tune) exit(tune_table(tune, cfg));
  return 0;
}

int main(int argc, char **argv) {
  struct daemon d;
  int check_only = 0;
  ccsd_gpu_environment(); /* before any thread runs */
  if (configure(argc, argv, &d.cfg, &check_only)) return 2;
  ccs__log_init(d.cfg.log_level, d.cfg.log_subsys);
  if (check_only) {
    char text[16384];
    ccsd_config_format(&d.cfg, text, sizeof(text));
    fputs(text, stdout);
    return 0;
  }

  signal(SIGPIPE, SIG_IGN);
  ccsd_failpoint_init();
  if (ccsd_daemon_init(&d, uv_default_loop())) return 1;
  d.argc = argc; /* what a reload reads again */
  d.argv = argv;
  /* before the socket exists: whoever sees it may stop the daemon at once */
  uv_signal_init(d.loop, &d.sig_term);
  uv_signal_init(d.loop, &d.sig_int);
  uv_timer_init(d.loop, &d.drain);
  d.drain.data = &d;
  d.sig_term.data = d.sig_int.data = &d;
  uv_signal_start(&d.sig_term, on_signal, SIGTERM);
  uv_signal_start(&d.sig_int, on_signal, SIGINT);
  uv_signal_init(d.loop, &d.sig_hup);
  d.sig_hup.data = &d;
  uv_signal_start(&d.sig_hup, on_hangup, SIGHUP);
  if (ccsd_server_start(&d)) {
    uv_close((uv_handle_t *)&d.sig_term, NULL);
    uv_close((uv_handle_t *)&d.sig_int, NULL);
    uv_close((uv_handle_t *)&d.sig_hup, NULL);
    uv_close((uv_handle_t *)&d.drain, NULL);
    ccsd_daemon_close(&d);
    return 1;
  }
  LOG_INFO(CCS_LOG_INIT, "listening on %s%s with %d executor threads", d.cfg.socket_path,
           d.socket_activated ? " (socket from systemd)" : "", d.cfg.threads);
  ccsd_systemd_ready(&d);

  ccsd_loop_run(&d);

  ccsd_systemd_stopping(&d);
  uv_close((uv_handle_t *)&d.drain, NULL);
  uv_close((uv_handle_t *)&d.sig_term, NULL);
  uv_close((uv_handle_t *)&d.sig_int, NULL);
  uv_close((uv_handle_t *)&d.sig_hup, NULL);
  signal(SIGTERM, SIG_IGN); /* stopping already: a second one must not cut it short */
  signal(SIGINT, SIG_IGN);
  ccsd_daemon_close(&d);
  LOG_INFO(CCS_LOG_INIT, "stopped");
  return 0;
}
