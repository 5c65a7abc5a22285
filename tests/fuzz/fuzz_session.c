/* Fuzz target: a whole daemon session driven through a socketpair, as
 * systemd's fuzz-varlink drives its server. The bytes are what a client
 * sends, written in small pieces (the first byte chooses their size) so
 * the session sees partial frames; after each input the session is closed
 * and the daemon must be back to holding nothing. The daemon signs ids
 * with the targets' fixed key (fuzz_daemon.h), so the seeds' ids
 * (make_seeds.c) join comms and their ops run. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_daemon.h"

static struct daemon d;
static uv_loop_t loop;

static void daemon_once(void) {
  static int ready;
  if (ready) return;
  ready = 1;
  fuzz_daemon_start(&d, &loop, 0); /* never listened on: sessions come from socketpairs */
}

static void spin(void) {
  for (int i = 0; i < 2; i++) fuzz_daemon_spin(&d, &loop);
}

/* After the corpus (replay.c): every kind of op completed on a comm
 * joined with a seed's id, as the daemon counted them; 1 when one never
 * did. The seeds' ids are root's: replayed as another user they are
 * refused, and this says so. */
int fuzz_replay_done(void) {
  int missing = 0;
  if (getuid() != 0) {
    fprintf(stderr, "fuzz_session: the seeds' ids are root's (uid 0): replay as root\n");
    return 1;
  }
  for (uint32_t k = 0; k < CCS__COLL_KIND_COUNT; k++) {
    uint64_t ok = 0;
    for (size_t i = 0; i < d.metrics.ncounters; i++)
      if (d.metrics.counters[i].kind == k && d.metrics.counters[i].status == CCS_OK) ok += d.metrics.counters[i].ops;
    if (!ok) fprintf(stderr, "fuzz_session: the corpus never completed a %s\n", ccs__coll_name(k));
    missing |= !ok;
  }
  return missing;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  daemon_once();
  if (size == 0) return 0;
  size_t step = (size_t)data[0] % 256 + 1;
  data++, size--;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv)) abort();
  ccsd_session_new(&d, sv[0]);
  char sink[65536];
  for (size_t off = 0; off < size && !list_empty(&d.sessions); off += step) {
    size_t n = size - off < step ? size - off : step;
    if (send(sv[1], data + off, n, MSG_NOSIGNAL) < 0) break;
    spin();
    while (read(sv[1], sink, sizeof(sink)) > 0) {
    }
  }
  close(sv[1]);
  fuzz_daemon_settle(&d, &loop); /* everything the client made is gone with it */
  return 0;
}
