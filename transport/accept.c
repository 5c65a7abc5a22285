#include "accept.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define REST_S 0.1 /* how long a listener rests when no descriptor can be freed */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void take_spare(struct accept_reserve *r) {
  if (r->spare < 0) r->spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void ccs_accept_reserve_init(struct accept_reserve *r) {
  r->spare = -1;
  r->paused_until = 0;
  take_spare(r);
}

void ccs_accept_reserve_close(struct accept_reserve *r) {
  if (r->spare >= 0) close(r->spare);
  r->spare = -1;
}

int ccs_accept_ready(const struct accept_reserve *r) {
  return r->paused_until == 0 || now_s() >= r->paused_until;
}

int ccs_accept(struct accept_reserve *r, int listen_fd, int *ret_shed) {
  *ret_shed = 0;
  r->paused_until = 0;
  take_spare(r);
  int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0 || (errno != EMFILE && errno != ENFILE)) return fd;
  int saved = errno;
  if (r->spare >= 0) {
    close(r->spare);
    r->spare = -1;
    fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      *ret_shed = 1;
      return fd;
    }
    saved = errno == EAGAIN ? EAGAIN : saved;
    take_spare(r);
  }
  if (saved != EAGAIN) r->paused_until = now_s() + REST_S;
  errno = saved;
  return -1;
}
