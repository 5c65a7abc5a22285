/* The monotonic clock in ns: what every thread's deadlines and shares
 * are timed by. */
#ifndef CCSD_BASE_CLOCK_H
#define CCSD_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t ccsd_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
