#include "fuzz_daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"

const uint8_t fuzz_id_key[32] = {'c', 'c', 's', ' ', 'f', 'u', 'z', 'z', ' ', 't', 'a',
                                 'r', 'g', 'e', 't', 's', ':', ' ', 'i', 'd', ' ', 's',
                                 'i', 'g', 'n', 'i', 'n', 'g', ' ', 'k', 'e', 'y'};
const char fuzz_cluster_key_hex[65] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

void fuzz_daemon_start(struct daemon *d, uv_loop_t *loop, int listen) {
  char key[64];
  signal(SIGPIPE, SIG_IGN); /* as ccsd's main does */
  ccsd_config_defaults(&d->cfg);
  d->cfg.threads = 1;
  d->cfg.init_timeout_s = 3600;            /* deadlines would only fire between inputs */
  d->cfg.id_ttl_s = 100.0 * 365 * 86400;   /* the seeds' ids stay valid */
  ccs__log_init(CCS_LOG_ERROR, CCS_LOG_ALL); /* refusals are expected here: not worth a line each */
  if (listen) {
    snprintf(key, sizeof(key), "/tmp/ccs-fuzz-key-%d", (int)getpid());
    unlink(key);
    int fd = open(key, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || write(fd, fuzz_cluster_key_hex, 64) != 64 || write(fd, "\n", 1) != 1) abort();
    close(fd);
    snprintf(d->cfg.listen, sizeof(d->cfg.listen), "127.0.0.1:0");
    snprintf(d->cfg.cluster_key_file, sizeof(d->cfg.cluster_key_file), "%s", key);
  }
  uv_loop_init(loop);
  if (ccsd_daemon_init(d, loop)) abort();
  if (listen) unlink(key);
  memcpy(d->coll.id_key, fuzz_id_key, sizeof(fuzz_id_key));
}

void fuzz_daemon_spin(struct daemon *d, uv_loop_t *loop) {
  for (int i = 0; i < 4; i++) {
    ccsd_rings_poll(d);
    uv_run(loop, UV_RUN_NOWAIT);
  }
}

static int holds_something(const struct daemon *d) {
  return !list_empty(&d->sessions) || !list_empty(&d->coll.comms) || !list_empty(&d->tenants) ||
         d->nbuffers;
}

void fuzz_daemon_settle(struct daemon *d, uv_loop_t *loop) {
  struct list *it, *tmp;
  for (int i = 0; i < 200 && !list_empty(&d->sessions); i++) fuzz_daemon_spin(d, loop);
  LIST_FOREACH_SAFE(it, tmp, &d->sessions) {
    ccsd_session_close(LIST_ENTRY(it, struct session, link), "fuzz input done");
  }
  /* comms held for other daemons would wait for their init deadline */
  LIST_FOREACH_SAFE(it, tmp, &d->coll.comms) {
    struct comm *c = LIST_ENTRY(it, struct comm, link);
    if (!c->gone) ccsd_comm_fail(c, CCS_ERR_ABORTED, "fuzz input done");
  }
  for (int i = 0; i < 4000 && holds_something(d); i++) {
    fuzz_daemon_spin(d, loop);
    if (i > 100) usleep(100);
  }
  if (holds_something(d)) abort();
}

void fuzz_unique_id(uint32_t tag, uint32_t owner, const char *root, struct ccs__unique_id *ret) {
  struct coll signer; /* only its key is read */
  memset(&signer, 0, sizeof(signer));
  memcpy(signer.id_key, fuzz_id_key, sizeof(fuzz_id_key));
  memset(ret, 0, sizeof(*ret)); /* padding is signed too */
  ret->magic = CCS__UNIQUE_ID_MAGIC;
  ret->protocol = CCS__PROTOCOL_VERSION;
  for (int i = 0; i < 4; i++) ret->secret[i] = (uint8_t)(tag >> (8 * i));
  ret->issued_s = FUZZ_ID_ISSUED_S;
  ret->owner_uid = owner;
  snprintf(ret->root, sizeof(ret->root), "%s", root);
  ccsd_unique_id_sign(&signer, ret);
}
