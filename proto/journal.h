/* The journal: a page set a client makes (a sealed memfd) and passes with
 * JournalSetup, where the daemon marks each call of that connection as it
 * starts (an op of it begins to write its outputs) and as it finishes (all
 * its outputs written, before the answer goes out). Only the daemon
 * writes; it never reads. When the daemon goes, the client reads which of
 * its unanswered calls were touched (docs/restart.md): one finished is
 * done; one started that wrote over its own inputs cannot be resubmitted;
 * any other is. A call's key is its request id, with the top bit set for
 * a call through the rings (they number their calls apart from the
 * socket's): the rings' calls take the first half of the entries by
 * their id, the socket's the second; a client keeps fewer calls than a
 * half in flight each way. A finished call of one collective op also
 * carries the op's number as the daemon counts the comm's collectives
 * (from 1; its low 32 bits): the client checks it against its own count,
 * which a restart's verdicts go by. */
#ifndef CCS_JOURNAL_H
#define CCS_JOURNAL_H

#include <stdatomic.h>
#include <stdint.h>

#define CCS__JOURNAL_MAGIC 0x4a534343u /* "CCSJ" */
#define CCS__JOURNAL_ENTRIES 4096u     /* a power of two */

#define CCS__JOURNAL_STARTED 1u
#define CCS__JOURNAL_FINISHED 2u

struct ccs__journal_entry {
  _Atomic uint64_t req_id; /* the call marked (written before state) */
  _Atomic uint32_t state;  /* CCS__JOURNAL_STARTED | CCS__JOURNAL_FINISHED */
  _Atomic uint32_t seq;    /* written before FINISHED: the op's number; 0: none said */
};

struct ccs__journal {
  uint32_t magic, protocol, entries, reserved; /* written by the client, checked by the daemon */
  struct ccs__journal_entry entry[CCS__JOURNAL_ENTRIES];
};

#define CCS__JOURNAL_BYTES ((sizeof(struct ccs__journal) + 4095u) & ~(size_t)4095u)

_Static_assert((CCS__JOURNAL_ENTRIES & (CCS__JOURNAL_ENTRIES - 1)) == 0, "journal entries: a power of two");

#define CCS__JOURNAL_RING (1ull << 63)
static inline uint64_t ccs__journal_key(uint64_t req_id, int via_ring) {
  return req_id | (via_ring ? CCS__JOURNAL_RING : 0);
}

static inline struct ccs__journal_entry *ccs__journal_entry_of(struct ccs__journal *j, uint64_t key) {
  uint64_t half = CCS__JOURNAL_ENTRIES / 2;
  return &j->entry[(key & CCS__JOURNAL_RING ? 0 : half) + (key & (half - 1))];
}

/* The daemon's mark of call `key`: its entry now says `state` for it
 * (and seq, where not 0). */
static inline void ccs__journal_mark(struct ccs__journal *j, uint64_t key, uint32_t state, uint32_t seq) {
  struct ccs__journal_entry *e = ccs__journal_entry_of(j, key);
  if (atomic_load_explicit(&e->req_id, memory_order_relaxed) != key) {
    atomic_store_explicit(&e->state, 0, memory_order_relaxed);
    atomic_store_explicit(&e->seq, 0, memory_order_relaxed);
    atomic_store_explicit(&e->req_id, key, memory_order_release);
  }
  if (seq) atomic_store_explicit(&e->seq, seq, memory_order_relaxed);
  atomic_fetch_or_explicit(&e->state, state, memory_order_release);
}

/* The op number the daemon gave finished call `key` (0: none said). */
static inline uint32_t ccs__journal_seq(struct ccs__journal *j, uint64_t key) {
  struct ccs__journal_entry *e = ccs__journal_entry_of(j, key);
  uint32_t state = atomic_load_explicit(&e->state, memory_order_acquire);
  uint32_t seq = atomic_load_explicit(&e->seq, memory_order_relaxed);
  return atomic_load_explicit(&e->req_id, memory_order_acquire) == key && (state & CCS__JOURNAL_FINISHED) ? seq : 0;
}

/* What the journal says of call `key` (0: nothing). */
static inline uint32_t ccs__journal_state(struct ccs__journal *j, uint64_t key) {
  struct ccs__journal_entry *e = ccs__journal_entry_of(j, key);
  uint32_t state = atomic_load_explicit(&e->state, memory_order_acquire);
  return atomic_load_explicit(&e->req_id, memory_order_acquire) == key ? state : 0;
}

#endif
