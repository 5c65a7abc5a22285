/* The daemon's loop: libuv's, and the clients' rings (ring.c). While a
 * ring had work within the last poll_spin_us the loop never sleeps: it
 * takes batches from the rings as they come, and gives libuv's events
 * (sockets, timers, finished ops) a turn without blocking, yielding the
 * CPU to whoever else wants it (ranks spinning on their answers share
 * it). Idle that long, it arms the doorbells and sleeps in libuv until
 * something happens: an idle daemon uses no CPU. */
#include <sched.h>

#include "front/front.h"

void ccsd_loop_run(struct daemon *d) {
  uint64_t last_work = 0;
  int busy_rounds = 0;
  while (!d->stopping) {
    if (list_empty(&d->rings)) { /* no fast path: libuv's loop as it is */
      if (!uv_run(d->loop, UV_RUN_ONCE)) break;
      continue;
    }
    int got = ccsd_rings_poll(d);
    uint64_t now = uv_hrtime();
    if (got) last_work = now;
    if (now - last_work < (uint64_t)d->cfg.poll_spin_us * 1000) {
      /* libuv's turn costs a system call: while batches keep coming it
       * waits a few rounds */
      if (!got || ++busy_rounds >= 8) uv_run(d->loop, UV_RUN_NOWAIT), busy_rounds = 0;
      if (!got) sched_yield();
      continue;
    }
    if (ccsd_rings_arm(d)) { /* an entry came while arming */
      ccsd_rings_disarm(d);
      last_work = now;
      continue;
    }
    int alive = uv_run(d->loop, UV_RUN_ONCE);
    ccsd_rings_disarm(d);
    if (!alive) break;
  }
}
