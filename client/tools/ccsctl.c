/* ccsctl: the operator's view of a running ccsd, over its socket.
 *
 *   ccsctl [--socket PATH] [--json] status | stuck [SECONDS] | comms | abort COMM
 *                                   | config | metrics
 *
 * A tenant sees and aborts its own communicators; root and members of the
 * ccs group see and abort all. Exit status: 0, 1 on an error from the
 * daemon, 2 on a bad command line, 3 when the daemon cannot be reached. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "wire.h"

static void usage(FILE *f) {
  fprintf(f, "usage: ccsctl [--socket PATH] [--json] COMMAND [ARG]\n"
             "  status          version, uptime, clients, comms, ops in flight\n"
             "  stuck [SECONDS] ops waiting longer than SECONDS (default 0) and who has not called them\n"
             "  comms           communicators, their ranks and state\n"
             "  abort COMM      fail a communicator for all its ranks (owner, root or group ccs)\n"
             "  config          the daemon's effective configuration\n"
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
  static const char *const commands[] = {"status", "stuck", "comms", "abort", "config", "metrics"};
  int known = 0;
  for (size_t c = 0; i < argc && c < sizeof(commands) / sizeof(commands[0]); c++)
    known |= !strcmp(argv[i], commands[c]);
  if (!known || argc - i > 2 || (!strcmp(argv[i], "abort") && argc - i != 2)) {
    usage(stderr);
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

  Ccs__Admin admin = CCS__ADMIN__INIT;
  admin.command = argv[i];
  admin.json = json;
  admin.n_args = (size_t)(argc - i - 1);
  admin.args = argv + i + 1;
  req.id = 2;
  req.body_case = CCS__REQUEST__BODY_ADMIN;
  req.admin = &admin;
  reply = call(fd, &req);
  close(fd);
  if (!reply) return 1;
  if (reply->body_case == CCS__REPLY__BODY_ADMIN) fputs(reply->admin->text, stdout);
  ccs__reply__free_unpacked(reply, NULL);
  return 0;
}
