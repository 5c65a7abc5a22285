/* The Unix-socket listener: who may connect is decided by the socket file's
 * mode and group; each accepted client becomes a session. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "accept.h"
#include "front/front.h"
#include "base/log.h"

static void on_listen_readable(uv_poll_t *h, int status, int events);

static void on_rested(uv_timer_t *t) {
  struct daemon *d = t->data;
  if (d->listen_fd >= 0 && !uv_is_closing((uv_handle_t *)&d->listen_poll))
    uv_poll_start(&d->listen_poll, UV_READABLE, on_listen_readable);
}

/* Out of descriptors: said once a second at most, whatever the rate. */
static void log_exhausted(struct daemon *d, const char *what) {
  uint64_t now = ccsd_now_ms(d);
  if (d->fd_exhausted_logged_ms && now - d->fd_exhausted_logged_ms < 1000) return;
  d->fd_exhausted_logged_ms = now;
  LOG_WARN("out of file descriptors: %s (raise LimitNOFILE / ulimit -n)", what);
}

static void on_listen_readable(uv_poll_t *h, int status, int events) {
  struct daemon *d = h->data;
  for (int i = 0; i < 64; i++) {
    int shed;
    int fd = ccs_accept(&d->accept_reserve, d->listen_fd, &shed);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) { /* nothing to free: rest, then try again */
        log_exhausted(d, "clients wait in the listen queue");
        uv_poll_stop(&d->listen_poll);
        uv_timer_start(&d->listen_rest, on_rested, 100, 0);
      } else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        LOG_WARN("accept: %s", strerror(errno));
      }
      return;
    }
    if (shed) {
      log_exhausted(d, "a client was refused");
      ccsd_session_refuse(fd, CCS_ERR_SYSTEM,
                          "ccsd has no file descriptor left for another connection: try again later");
      continue;
    }
    ccsd_session_new(d, fd);
  }
}

/* A stale socket file from a crashed daemon is removed; a live one means
 * another daemon serves this path, and we refuse to steal it. */
static int claim_path(const struct sockaddr_un *addr) {
  int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return -1;
  int live = connect(probe, (const struct sockaddr *)addr, sizeof(*addr)) == 0;
  close(probe);
  if (live) {
    LOG_ERROR("another daemon is listening on %s", addr->sun_path);
    return -1;
  }
  if (unlink(addr->sun_path) && errno != ENOENT) {
    LOG_ERROR("cannot remove stale socket %s: %s", addr->sun_path, strerror(errno));
    return -1;
  }
  return 0;
}

static void make_parent_dir(const char *path) {
  char copy[sizeof(((struct sockaddr_un *)0)->sun_path)];
  snprintf(copy, sizeof(copy), "%s", path);
  char *dir = dirname(copy);
  if (mkdir(dir, 0755) && errno != EEXIST) LOG_WARN("mkdir %s: %s", dir, strerror(errno));
}

static void start_polling(struct daemon *d, int fd) {
  d->listen_fd = fd;
  ccs_accept_reserve_init(&d->accept_reserve);
  uv_timer_init(d->loop, &d->listen_rest);
  d->listen_rest.data = d;
  uv_poll_init(d->loop, &d->listen_poll, fd);
  d->listen_poll.data = d;
  uv_poll_start(&d->listen_poll, UV_READABLE, on_listen_readable);
}

int ccsd_server_start(struct daemon *d) {
  int activated = ccsd_systemd_listen_fd();
  if (activated >= 0) { /* socket activation: systemd made it, with its mode and group */
    d->socket_activated = 1;
    start_polling(d, activated);
    return 0;
  }
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(d->cfg.socket_path) >= sizeof(addr.sun_path)) {
    LOG_ERROR("socket path too long: %s", d->cfg.socket_path);
    return -1;
  }
  strcpy(addr.sun_path, d->cfg.socket_path);
  make_parent_dir(addr.sun_path);
  if (claim_path(&addr)) return -1;

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    LOG_ERROR("socket: %s", strerror(errno));
    return -1;
  }
  if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) || listen(fd, 512)) {
    LOG_ERROR("cannot listen on %s: %s", addr.sun_path, strerror(errno));
    close(fd);
    return -1;
  }
  if (chmod(addr.sun_path, d->cfg.socket_mode))
    LOG_WARN("chmod %s: %s", addr.sun_path, strerror(errno));
  start_polling(d, fd);
  return 0;
}

static void on_listen_closed(uv_handle_t *h) {
  struct daemon *d = h->data;
  close(d->listen_fd);
  d->listen_fd = -1;
  ccs_accept_reserve_close(&d->accept_reserve);
}

void ccsd_server_stop(struct daemon *d) {
  if (d->listen_fd >= 0 && !uv_is_closing((uv_handle_t *)&d->listen_poll)) {
    if (!d->socket_activated) unlink(d->cfg.socket_path);
    uv_close((uv_handle_t *)&d->listen_rest, NULL);
    uv_close((uv_handle_t *)&d->listen_poll, on_listen_closed);
  }
  if (d->coll.peers) ccsd_span_stopping(&d->coll);
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->sessions) {
    ccsd_session_close(LIST_ENTRY(it, struct session, link), "daemon stopping");
  }
}
