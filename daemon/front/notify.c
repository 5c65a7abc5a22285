/* systemd integration: socket activation, readiness, and a watchdog that is
 * pinged only while the executor makes progress (or has nothing to do), so
 * a wedged daemon is restarted. Without systemd these do nothing. */
#include <fcntl.h>

#include "front/front.h"
#include "run/executor.h"
#include "base/log.h"

#ifdef CCS_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

int ccsd_systemd_listen_fd(void) {
  int n = sd_listen_fds(1);
  if (n <= 0) return -1;
  if (n > 1) LOG_WARN("systemd passed %d sockets; using the first", n);
  int fd = SD_LISTEN_FDS_START;
  if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
    LOG_ERROR("the socket systemd passed is not a listening Unix stream socket");
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

static void on_watchdog(uv_timer_t *t) {
  struct daemon *d = t->data;
  if (ccsd_executor_healthy(d->coll.exec, &d->watchdog_seen)) sd_notify(0, "WATCHDOG=1");
  else LOG_WARN("executor made no progress since the last watchdog period: not pinging");
}

void ccsd_systemd_ready(struct daemon *d) {
  uint64_t usec;
  sd_notifyf(0, "READY=1\nSTATUS=serving on %s", d->cfg.socket_path);
  if (sd_watchdog_enabled(0, &usec) > 0) {
    uv_timer_init(d->loop, &d->watchdog);
    d->watchdog.data = d;
    d->watchdog_on = 1;
    uv_timer_start(&d->watchdog, on_watchdog, usec / 2000, usec / 2000);
  }
}

void ccsd_systemd_stopping(struct daemon *d) {
  sd_notify(0, "STOPPING=1");
  if (d->watchdog_on) {
    d->watchdog_on = 0;
    uv_close((uv_handle_t *)&d->watchdog, NULL);
  }
}
#else
int ccsd_systemd_listen_fd(void) { return -1; }
void ccsd_systemd_ready(struct daemon *d) {}
void ccsd_systemd_stopping(struct daemon *d) {}
#endif
