/* ccsctl: the operator's view of a running ccsd, over its socket.
 *
 *   ccsctl [--socket PATH] [--json] status | stuck [SECONDS] | comms | abort COMM
 *                                   | config [reload] | tenants | top [SECONDS [COUNT]]
 *                                   | metrics
 *
 * A tenant sees and aborts its own communicators; root and members of the
 * ccs group see and abort all. Exit status: 0, 1 on an error from the
 * daemon, 2 on a bad command line, 3 when the daemon cannot be reached. */
#include <errno.h>
#include <math.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "wire.h"

static void usage(FILE *f) {
  fprintf(f, "usage: ccsctl [--socket PATH] [--json] COMMAND [ARG]\n"
             "  status          version, uptime, clients, comms, ops in flight\n"
             "  stuck [SECONDS] ops waiting longer than SECONDS (default 0) and who has not called them\n"
             "  comms           communicators, their ranks and state\n"
             "  abort COMM      fail a communicator for all its ranks (owner, root or group ccs)\n"
             "  config          the daemon's effective configuration\n"
             "  config reload   read the configuration again (operators): weights, caps,\n"
             "                  quotas, logging apply at once; it says what needs a restart\n"
             "  tenants         each tenant's weight, current share, executor time, bytes sent\n"
             "  top [S [N]]     tenants live: shares, bandwidth, calls/s, queue waits, every S\n"
             "                  seconds (default 1), N times (default: until interrupted)\n"
             "  metrics         Prometheus text exposition\n"
             "The socket: --socket, else $CCS_SOCKET, else /run/ccs/ccsd.sock\n");
}

static int send_frame(int fd, Ccs__Request *req) {
  size_t len;
  uint8_t *f = ccs__frame_pack(&req->base, &len);
  if (!f) return -1;
  ssize_t n = send(fd, f, len, MSG_NOSIGNAL);
  free(f);
  return n == (ssize_t)len ? 0 : -1;
}

static Ccs__Reply *read_frame(int fd) {
  struct ccs__frame_reader r;
  ccs__frame_reader_init(&r, CCS__REPLY_MAX);
  Ccs__Reply *reply = NULL;
  for (;;) {
    const uint8_t *payload;
    size_t len;
    int got = ccs__frame_reader_next(&r, &payload, &len);
    if (got == 1) {
      reply = ccs__reply_unpack(payload, len);
      break;
    }
    uint8_t *space;
    size_t room;
    if (got < 0 || ccs__frame_reader_space(&r, &space, &room)) break;
    ssize_t n = recv(fd, space, room, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    ccs__frame_reader_commit(&r, (size_t)n);
  }
  ccs__frame_reader_close(&r);
  return reply;
}

/* The reply to req, or NULL with a message printed. */
static Ccs__Reply *call(int fd, Ccs__Request *req) {
  Ccs__Reply *reply = send_frame(fd, req) ? NULL : read_frame(fd);
  if (!reply) {
    fprintf(stderr, "ccsctl: the daemon closed the connection\n");
    return NULL;
  }
  if (reply->status != CCS_OK) {
    fprintf(stderr, "ccsctl: %s: %s\n", ccs_result_name((ccs_result_t)reply->status), reply->error);
    ccs__reply__free_unpacked(reply, NULL);
    return NULL;
  }
  return reply;
}

static uint64_t next_req = 2;

/* One operator's command: its text (the caller frees it), or NULL with a
 * message printed. */
static char *admin(int fd, const char *command, char **args, size_t nargs, int json) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__Admin a = CCS__ADMIN__INIT;
  a.command = (char *)command;
  a.json = json;
  a.n_args = nargs;
  a.args = args;
  req.id = next_req++;
  req.body_case = CCS__REQUEST__BODY_ADMIN;
  req.admin = &a;
  Ccs__Reply *reply = call(fd, &req);
  if (!reply) return NULL;
  char *text = strdup(reply->body_case == CCS__REPLY__BODY_ADMIN ? reply->admin->text : "");
  ccs__reply__free_unpacked(reply, NULL);
  return text;
}

/* --- top: `tenants raw` every few seconds, shown as rates --- */

#define WAIT_BUCKETS 8
static const double wait_bounds[WAIT_BUCKETS] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1, 10};

struct tenant_row {
  unsigned uid;
  double weight, cap, exec_s, bus_bytes, wait_s, exec_share, sent_share;
  unsigned long long sent, gpu_ops, gpu_bytes, requests, calls, waits, le[WAIT_BUCKETS];
};

static int parse_rows(const char *text, struct tenant_row *rows, int max) {
  int n = 0;
  for (const char *line = text; line && *line && n < max; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
    struct tenant_row *r = &rows[n];
    int got = sscanf(line, "%u %lf %lf %lf %llu %llu %llu %llu %llu %lf %llu %lf %lf %lf "
                           "%llu %llu %llu %llu %llu %llu %llu %llu",
                     &r->uid, &r->weight, &r->cap, &r->exec_s, &r->sent, &r->gpu_ops,
                     &r->gpu_bytes, &r->requests, &r->calls, &r->bus_bytes, &r->waits, &r->wait_s,
                     &r->exec_share, &r->sent_share, &r->le[0], &r->le[1], &r->le[2], &r->le[3],
                     &r->le[4], &r->le[5], &r->le[6], &r->le[7]);
    if (got == 22) n++;
  }
  return n;
}

static const struct tenant_row *row_of(const struct tenant_row *rows, int n, unsigned uid) {
  for (int i = 0; i < n; i++)
    if (rows[i].uid == uid) return &rows[i];
  return NULL;
}

/* The bound under which 99% of the interval's waits fell. */
static double wait_p99(const struct tenant_row *now, const struct tenant_row *then) {
  unsigned long long total = now->waits - (then ? then->waits : 0);
  for (int b = 0; b < WAIT_BUCKETS && total; b++)
    if ((double)(now->le[b] - (then ? then->le[b] : 0)) >= 0.99 * (double)total) return wait_bounds[b];
  return total ? INFINITY : 0;
}

static void show_frame(const char *path, double dt, const struct tenant_row *now, int n,
                       const struct tenant_row *then, int m) {
  double exec_total = 0;
  for (int i = 0; i < n; i++) {
    const struct tenant_row *p = row_of(then, m, now[i].uid);
    exec_total += now[i].exec_s - (p ? p->exec_s : 0);
  }
  char when[32];
  time_t t = time(NULL);
  strftime(when, sizeof(when), "%H:%M:%S", localtime(&t));
  if (isatty(STDOUT_FILENO)) printf("\033[H\033[2J");
  printf("ccsd at %s  %s  every %.2g s\n", path, when, dt);
  printf("%-20s %6s %5s %7s %10s %10s %9s %10s %10s\n", "tenant", "weight", "cap", "share",
         "bus GB/s", "sent MB/s", "calls/s", "wait avg", "wait p99");
  for (int i = 0; i < n; i++) {
    const struct tenant_row *r = &now[i], *p = row_of(then, m, r->uid);
    char name[64];
    struct passwd *pw = getpwuid((uid_t)r->uid);
    if (pw) snprintf(name, sizeof(name), "%.40s(%u)", pw->pw_name, r->uid);
    else snprintf(name, sizeof(name), "%u", r->uid);
    double exec = r->exec_s - (p ? p->exec_s : 0);
    unsigned long long waits = r->waits - (p ? p->waits : 0);
    double wait = r->wait_s - (p ? p->wait_s : 0), p99 = wait_p99(r, p);
    char avg[24], tail[24];
    if (waits) snprintf(avg, sizeof(avg), "%.3g ms", wait / (double)waits * 1e3);
    else snprintf(avg, sizeof(avg), "-");
    if (!waits) snprintf(tail, sizeof(tail), "-");
    else if (isinf(p99)) snprintf(tail, sizeof(tail), "> 10 s");
    else snprintf(tail, sizeof(tail), "<= %g ms", p99 * 1e3);
    printf("%-20s %6g %5g %6.1f%% %10.2f %10.1f %9.1f %10s %10s\n", name, r->weight, r->cap,
           exec_total > 0 ? 100 * exec / exec_total : 0.0,
           (r->bus_bytes - (p ? p->bus_bytes : 0)) / dt / 1e9,
           (double)(r->sent - (p ? p->sent : 0)) / dt / 1e6,
           (double)(r->calls - (p ? p->calls : 0)) / dt, avg, tail);
  }
  if (n == 0) printf("(no tenants yet)\n");
  printf("share: of executor time; bus GB/s: bus bandwidth summed over the tenant's ranks "
         "(per rank, as nccl-tests prints it: divide by its ranks)\n\n");
  fflush(stdout);
}

static int run_top(int fd, const char *path, double every, long count) {
  enum { MOST = 256 };
  struct tenant_row *rows[2] = {calloc(MOST, sizeof(struct tenant_row)),
                                calloc(MOST, sizeof(struct tenant_row))};
  int n[2] = {0, 0}, cur = 0, rc = 0;
  char *raw[] = {"raw"};
  struct timespec last, at;
  clock_gettime(CLOCK_MONOTONIC, &last);
  for (long frame = 0; rows[0] && rows[1] && (count < 0 || frame <= count); frame++) {
    char *text = admin(fd, "tenants", raw, 1, 0);
    if (!text) {
      rc = 1;
      break;
    }
    n[cur] = parse_rows(text, rows[cur], MOST);
    free(text);
    clock_gettime(CLOCK_MONOTONIC, &at);
    double dt = (double)(at.tv_sec - last.tv_sec) + (double)(at.tv_nsec - last.tv_nsec) / 1e9;
    last = at;
    if (frame > 0) show_frame(path, dt, rows[cur], n[cur], rows[!cur], n[!cur]);
    cur = !cur;
    if (count < 0 || frame < count) usleep((useconds_t)(every * 1e6));
  }
  free(rows[0]);
  free(rows[1]);
  return rc;
}

int main(int argc, char **argv) {
  const char *path = getenv("CCS_SOCKET");
  int json = 0, i = 1;
  for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
    if (!strcmp(argv[i], "--json")) json = 1;
    else if (!strcmp(argv[i], "--socket") && i + 1 < argc) path = argv[++i];
    else if (!strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  static const char *const commands[] = {"status", "stuck", "comms", "abort", "config",
                                         "metrics", "tenants", "top"};
  int known = 0;
  for (size_t c = 0; i < argc && c < sizeof(commands) / sizeof(commands[0]); c++)
    known |= !strcmp(argv[i], commands[c]);
  int top = known && !strcmp(argv[i], "top");
  if (!known || argc - i > (top ? 3 : 2) || (!strcmp(argv[i], "abort") && argc - i != 2)) {
    usage(stderr);
    return 2;
  }
  double every = 1;
  long count = -1;
  if (top && ((argc - i > 1 && !(sscanf(argv[i + 1], "%lf", &every) == 1 && every >= 0.05)) ||
              (argc - i > 2 && !(sscanf(argv[i + 2], "%ld", &count) == 1 && count > 0)))) {
    fprintf(stderr, "ccsctl: top takes seconds between frames (0.05 or more) and a count\n");
    return 2;
  }
  if (!path || !*path) path = "/run/ccs/ccsd.sock";
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
    fprintf(stderr, "ccsctl: cannot connect to ccsd at %s: %s\n", path, strerror(errno));
    return 3;
  }
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__Hello hello = CCS__HELLO__INIT;
  hello.protocol = CCS__PROTOCOL_VERSION;
  req.id = 1;
  req.body_case = CCS__REQUEST__BODY_HELLO;
  req.hello = &hello;
  Ccs__Reply *reply = call(fd, &req);
  if (!reply) return 1;
  ccs__reply__free_unpacked(reply, NULL);
  if (top) {
    int rc = run_top(fd, path, every, count);
    close(fd);
    return rc;
  }
  char *text = admin(fd, argv[i], argv + i + 1, (size_t)(argc - i - 1), json);
  close(fd);
  if (!text) return 1;
  fputs(text, stdout);
  free(text);
  return 0;
}
