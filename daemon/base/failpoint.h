/* Faults on purpose, for the tests of what survives a daemon that dies at
 * a chosen moment (tests/integration/test_restart.c, scripts/chaos.sh):
 * CCSD_FAILPOINT=NAME:N in the daemon's environment kills it with SIGKILL,
 * as a crash would, the Nth time it passes the point NAME:
 *
 *   launch    an op matched, about to start (nothing of it written)
 *   started   an op's ranks told it started, before it runs
 *   task      an executor task done (an op partly written)
 *   answer    a call's answer about to go out (its op finished)
 *   rejoined  a comm's ranks rejoined after a restart, their verdicts sent
 *
 * Unset (always, outside tests), a point costs a load and a branch. */
#ifndef CCSD_BASE_FAILPOINT_H
#define CCSD_BASE_FAILPOINT_H

void ccsd_failpoint_init(void); /* reads CCSD_FAILPOINT, once, at start */
void ccsd_failpoint_hit(const char *name);
extern const char *ccsd_failpoint_name; /* NULL: none armed */

static inline void ccsd_failpoint(const char *name) {
  if (__builtin_expect(ccsd_failpoint_name != 0, 0)) ccsd_failpoint_hit(name);
}

#endif
