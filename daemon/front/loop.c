/* The daemon's loop: libuv's, and the clients' rings (ring.c). While a
 * ring had work within the last poll_spin_us the loop never sleeps: it
 * takes batches from the rings as they come, and gives libuv's events
 * (sockets, timers, finished ops) a turn without blocking, yielding the
 * CPU to whoever else wants it (ranks spinning on their answers share
 * it), or, where nobody does, watching the rings a few microseconds
 * between libuv's turns; a task of an op the executor has ready comes
 * before either (run/executor.h). While calls from the rings are unanswered (an op
 * across daemons takes a network round trip) it polls up to INFLIGHT_SPIN
 * times longer, and drives the transport itself (run/net.h): a small op's
 * messages and its answer then cross no thread. Idle, it gives the
 * transport back, arms the doorbells and sleeps in libuv until something
 * happens: an idle daemon uses no CPU. */
#include <sched.h>

#include "front/front.h"
#include "run/executor.h"
#include "ring.h"

#define INFLIGHT_SPIN 20 /* 1 ms at the default poll_spin_us */

void ccsd_loop_run(struct daemon *d) {
  uint64_t last_work = 0;
  int busy_rounds = 0;
  int driving = 0; /* the transport, while calls are in flight */
  int alone = 0;   /* the last yield came back at once: nobody else wants this CPU */
  uint32_t open_seen = 0; /* ring calls unanswered at the last round */
  while (!d->stopping) {
    if (list_empty(&d->rings)) { /* no fast path: libuv's loop as it is */
      if (!uv_run(d->loop, UV_RUN_ONCE)) break;
      continue;
    }
    int got = ccsd_rings_poll(d);
    uint64_t now = uv_hrtime();
    /* the spin counts from the last call that came or was answered: a job
     * makes its next call after the answer, however long the op took */
    if (got || d->ring_calls_open < open_seen) last_work = now;
    open_seen = d->ring_calls_open;
    uint64_t spin_ns = (uint64_t)d->cfg.poll_spin_us * 1000 * (d->ring_calls_open ? INFLIGHT_SPIN : 1);
    if (now - last_work < spin_ns) {
      if (d->coll.peers && (driving || d->ring_calls_open)) {
        driving = 1;
        ccsd_executor_reap_begin();
        got += ccsd_peers_drive(d->coll.peers);
        ccsd_executor_reap(d->coll.exec);
      }
      /* a job calling back to back sends its next call within
       * microseconds of its answer: where the CPU is this loop's alone,
       * that is watched for before libuv's turn and the yield, whose
       * system calls it would otherwise wait behind */
      if (!got && alone && !driving && now - last_work < CCS__WATCH_ALONE_NS &&
          ccsd_rings_watch(d, last_work + CCS__WATCH_ALONE_NS))
        continue;
      /* libuv's turn costs a system call: while batches keep coming it
       * waits a few rounds */
      if (!got || ++busy_rounds >= 8) uv_run(d->loop, UV_RUN_NOWAIT), busy_rounds = 0;
      /* idle: a task of an op rather than a look at the rings (not while
       * it drives the transport, whose messages would wait behind it) */
      if (!got && !driving && d->coll.exec && ccsd_executor_help(d->coll.exec)) continue;
      if (!got) {
        uint64_t yielded = uv_hrtime();
        sched_yield();
        /* back at once: nobody else wants this CPU, so the rings are
         * watched a while without system calls (proto/ring.h) */
        alone = uv_hrtime() - yielded < CCS__YIELD_ALONE_NS;
        if (!driving && alone) ccsd_rings_watch(d, yielded + CCS__WATCH_ALONE_NS);
      }
      continue;
    }
    if (driving) ccsd_peers_drive_end(d->coll.peers), driving = 0;
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
