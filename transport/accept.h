/* accept4 that survives running out of file descriptors, as libuv and
 * nginx do it: a spare descriptor is kept open; when accept fails with
 * EMFILE or ENFILE the spare is given up, the waiting connection accepted
 * and handed back marked `shed` (the caller says why, if it can, and
 * closes it), and the spare taken again at the next call. Without this a
 * listening socket stays readable while every accept fails, and the
 * thread polling it spins. */
#ifndef CCS_ACCEPT_H
#define CCS_ACCEPT_H

struct accept_reserve {
  int spare; /* -1 while given up */
  double paused_until; /* monotonic seconds: the listener rests until then */
};

void ccs_accept_reserve_init(struct accept_reserve *r);
void ccs_accept_reserve_close(struct accept_reserve *r);

/* A connection (non-blocking, close-on-exec), or -1 with errno: EAGAIN
 * when none waits. *ret_shed is 1 when the connection was taken only to be
 * refused. When even the spare cannot make room, -1 with EMFILE and
 * paused_until set a moment ahead: stop polling the listener until then. */
int ccs_accept(struct accept_reserve *r, int listen_fd, int *ret_shed);

/* Whether the listener should be polled now (not resting). */
int ccs_accept_ready(const struct accept_reserve *r);

#endif
