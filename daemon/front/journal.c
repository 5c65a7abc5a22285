/* A connection's journal (proto/journal.h): the client's sealed memfd,
 * mapped here for writing; the daemon marks each call's start and finish
 * there and never reads what the client may have written (docs/restart.md). */
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "front/front.h"
#include "journal.h"

void ccsd_journal_setup(struct session *s, uint64_t id) {
  int fd = ccsd_session_take_fd(s);
  char err[160];
  ccs_result_t rc = CCS_OK;
  void *map = MAP_FAILED;
  if (fd < 0) {
    snprintf(err, sizeof(err), "a JournalSetup takes the journal's memfd");
    rc = CCS_ERR_INVALID_ARGUMENT;
  } else if (s->journal) {
    snprintf(err, sizeof(err), "this connection has its journal already");
    rc = CCS_ERR_INVALID_USAGE;
  } else if ((rc = ccsd_memfd_check(fd, CCS__JOURNAL_BYTES, "the journal's memfd", err, sizeof(err))) == CCS_OK &&
             (map = mmap(NULL, CCS__JOURNAL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
    snprintf(err, sizeof(err), "cannot map the journal");
    rc = CCS_ERR_NO_MEMORY;
  }
  if (fd >= 0) close(fd); /* the mapping holds the memory */
  const struct ccs__journal *j = map;
  if (rc == CCS_OK && (j->magic != CCS__JOURNAL_MAGIC || j->entries != CCS__JOURNAL_ENTRIES)) {
    snprintf(err, sizeof(err), "the journal is not laid out as this daemon's (%u entries)",
             CCS__JOURNAL_ENTRIES);
    rc = CCS_ERR_VERSION;
  }
  if (rc != CCS_OK) {
    if (map != MAP_FAILED) munmap(map, CCS__JOURNAL_BYTES);
    ccsd_session_reply(s, id, rc, err);
    return;
  }
  s->journal = map;
  ccsd_session_reply(s, id, CCS_OK, NULL);
}

void ccsd_journal_close(struct session *s) {
  if (s->journal) munmap(s->journal, CCS__JOURNAL_BYTES);
  s->journal = NULL;
}

void ccsd_journal_mark(struct session *s, uint64_t req_id, int via_ring, uint32_t state, uint64_t seq) {
  if (s && s->journal && !s->closing)
    ccs__journal_mark(s->journal, ccs__journal_key(req_id, via_ring), state, (uint32_t)seq);
}
