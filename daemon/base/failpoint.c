#include "base/failpoint.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"

const char *ccsd_failpoint_name;
static char name[32];
static long at;
static _Atomic long passed;

void ccsd_failpoint_init(void) {
  const char *v = getenv("CCSD_FAILPOINT");
  const char *colon = v ? strchr(v, ':') : NULL;
  if (!colon || colon == v || (size_t)(colon - v) >= sizeof(name) || (at = atol(colon + 1)) < 1) return;
  memcpy(name, v, (size_t)(colon - v));
  name[colon - v] = 0;
  ccsd_failpoint_name = name;
  LOG_WARN("CCSD_FAILPOINT: this daemon kills itself at the %ld%s pass of '%s'", at,
           at == 1 ? "st" : at == 2 ? "nd" : at == 3 ? "rd" : "th", name);
}

void ccsd_failpoint_hit(const char *point) {
  if (strcmp(point, name) || atomic_fetch_add(&passed, 1) + 1 != at) return;
  static const char msg[] = "ccsd: CCSD_FAILPOINT reached: killed\n";
  ssize_t w = write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)w;
  kill(getpid(), SIGKILL);
}
