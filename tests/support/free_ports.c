/* test-free-ports N: N distinct free loopback ports below the kernel's
 * ephemeral range, one a line (test_free_port's rule), for the scripts
 * that start daemons on ports they start them on again (scripts/chaos.sh). */
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

int main(int argc, char **argv) {
  int n = argc == 2 ? atoi(argv[1]) : 0;
  if (n < 1 || n > 64) {
    fprintf(stderr, "usage: test-free-ports N (1..64)\n");
    return 2;
  }
  int got[64], have = 0;
  for (int tries = 0; have < n && tries < 1000; tries++) {
    int port = test_free_port(), seen = 0;
    for (int k = 0; k < have; k++) seen |= got[k] == port;
    if (port > 0 && !seen) got[have++] = port;
  }
  if (have < n) {
    fprintf(stderr, "test-free-ports: found %d free port(s) of %d\n", have, n);
    return 1;
  }
  for (int k = 0; k < n; k++) printf("%d\n", got[k]);
  return 0;
}
