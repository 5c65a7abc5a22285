/* Fuzz target: a whole daemon session driven through a socketpair, as
 * systemd's fuzz-varlink drives its server. The bytes are what a client
 * sends, written in small pieces (the first byte chooses their size) so
 * the session sees partial frames; after each input the session is closed
 * and the daemon must be back to holding nothing. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "front/front.h"

static struct daemon d;
static uv_loop_t loop;

static void daemon_once(void) {
  static int ready;
  if (ready) return;
  ready = 1;
  ccsd_config_defaults(&d.cfg);
  d.cfg.threads = 1;
  /* never listened on: sessions come from socketpairs */
  uv_loop_init(&loop);
  if (ccsd_daemon_init(&d, &loop)) abort();
}

static void spin(void) {
  for (int i = 0; i < 8; i++) uv_run(&loop, UV_RUN_NOWAIT);
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
  spin();
  /* everything the client made is gone with it */
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d.sessions) {
    ccsd_session_close(LIST_ENTRY(it, struct session, link), "fuzz input done");
  }
  spin();
  if (!list_empty(&d.coll.comms) || !list_empty(&d.tenants)) abort();
  return 0;
}
