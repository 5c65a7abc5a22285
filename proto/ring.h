/* The fast path between a client connection and the daemon: one page set
 * in shared memory that the client makes (a sealed memfd) and passes with
 * a RingSetup request, holding two single-producer rings:
 *
 *   submissions   client -> daemon: the ops of one call (a batch), as
 *                 fixed-size entries; the daemon copies a batch out before
 *                 it checks it, with the code that checks socket requests
 *   completions   daemon -> client: the request id and status of a batch,
 *                 its error text in a slot of its own
 *
 * Indices run free (uint32, wrapping); each side writes only its own and
 * never trusts the other's: the daemon closes a connection whose indices
 * are impossible, and nothing a client writes here can reach another
 * connection. Neither side sleeps while the other is busy: the daemon
 * spins on its rings while there is work, then sets daemon_sleeping and
 * waits on the connection's doorbell (an eventfd the client passes along),
 * which a client rings only then; a client spins for its completion, then
 * sleeps on the futex done_tail after counting itself in client_waiting,
 * which the daemon wakes only then. The socket stays for setup, fds, large
 * or rare requests, and as the liveness channel.
 *
 * A page of stream flags follows: a call on device buffers in a CUDA
 * stream's order takes the flag pair of its call slot, its stream writes
 * ready[slot] = gen where the op may begin, and waits for done[slot] to
 * reach gen; the daemon's own stream waits for ready and writes done after
 * the op (and the daemon writes done from the host when the op fails), so
 * the call returns at once and neither side's host waits for a GPU
 * (docs/gpus.md). gen counts the slot's uses; comparisons wrap. The
 * client's stream then writes passed[slot] = gen: a slot serves again only
 * once its last call's stream got there (a late write of ready must not
 * land on the next call's). */
#ifndef CCS_RING_H
#define CCS_RING_H

#include <stdatomic.h>
#include <stdint.h>

#include "wire.h"

#define CCS__RING_MAGIC 0x52534343u /* "CCSR" */
#define CCS__RING_ENTRIES 256u     /* per ring; a power of two */
#define CCS__RING_BATCH_MAX 64u    /* ops of one call; a larger group goes by the socket */

/* A buffer reference (BufRef); length 0: none. */
struct ccs__ring_buf {
  uint64_t buffer, offset, length;
};

/* One op (Op), entry `index` of a batch of `nops` with id req_id. */
struct ccs__ring_op {
  uint64_t req_id;
  uint32_t index, nops;
  uint64_t comm;
  uint32_t kind, dtype, redop;
  int32_t root;
  uint64_t count;
  uint32_t flags;
  uint32_t order_slot, order_gen; /* CCS__RING_OP_STREAM: the batch's flag pair and value;
                                     CCS__RING_OP_PART: Op.whole_count, low word and high */
  uint32_t number; /* a collective: ccs.proto's Op.number (0: not given) */
  struct ccs__ring_buf send, recv;
};
/* flags: the op runs only after the comm's earlier ops have finished (a
 * host stream's: its call returned before they were done, and it may read
 * what they write) */
#define CCS__RING_OP_ORDERED 1u
/* device buffers in a CUDA stream's order: the stream flags of order_slot */
#define CCS__RING_OP_STREAM 2u
/* a part of a call (ccs.proto's Op.whole_count; never on a CUDA stream) */
#define CCS__RING_OP_PART 4u

/* A batch is done: its text, when status is not CCS_OK, in text[slot]
 * where slot is the completion's index modulo the ring. */
struct ccs__ring_done {
  uint64_t req_id;
  int32_t status;
  uint32_t text_len;
};

#define CCS__CACHE_LINE 64
struct ccs__ring_shared {
  uint32_t magic, protocol, entries, batch_max; /* written by the client, checked by the daemon */
  _Alignas(CCS__CACHE_LINE) _Atomic uint32_t sub_tail; /* client: entries published */
  _Alignas(CCS__CACHE_LINE) _Atomic uint32_t sub_head; /* daemon: entries taken */
  _Alignas(CCS__CACHE_LINE) _Atomic uint32_t daemon_sleeping; /* daemon: ring the doorbell */
  _Atomic uint32_t daemon_beat; /* daemon: counts up every RingSetupReply.beat_ms while its loop
                                   runs (a client tells a stalled daemon from a busy one by it) */
  _Alignas(CCS__CACHE_LINE) _Atomic uint32_t done_tail; /* daemon: completions published (a futex) */
  _Atomic uint32_t client_waiting;                      /* client: threads asleep on done_tail */
  _Alignas(CCS__CACHE_LINE) _Atomic uint32_t done_head; /* client: completions taken */
  _Alignas(CCS__CACHE_LINE) struct ccs__ring_op sub[CCS__RING_ENTRIES];
  struct ccs__ring_done done[CCS__RING_ENTRIES];
  char text[CCS__RING_ENTRIES][CCS__ERROR_TEXT_MAX];
  /* a page of its own: both sides register it with CUDA for their GPUs */
  _Alignas(4096) struct ccs__ring_flags {
    _Atomic uint32_t ready[CCS__RING_ENTRIES]; /* the client's stream: the op may begin */
    _Atomic uint32_t done[CCS__RING_ENTRIES];  /* the daemon (its stream, or its host): it ended */
    _Atomic uint32_t passed[CCS__RING_ENTRIES]; /* the client's stream: past the call (the daemon
                                                  ignores it; the slot serves again only then) */
  } flags;
};

/* The memfd's size: whole pages. */
#define CCS__RING_BYTES ((sizeof(struct ccs__ring_shared) + 4095u) & ~(size_t)4095u)

/* Either side spinning on the other's index: a pause between looks, and
 * the CPU given way to whoever else wants it. A sched_yield back sooner
 * than CCS__YIELD_ALONE_NS found nobody else wanting the CPU (this VM: 0.3
 * us alone, 2.5 us handing it to another spinning task and back): then
 * the spinner may watch the index for CCS__WATCH_ALONE_NS before it
 * yields again, saving the system calls that a wait alone on its CPU
 * spends between looks. */
#define CCS__YIELD_ALONE_NS 1000u
#define CCS__WATCH_ALONE_NS 5000u

static inline void ccs__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

_Static_assert((CCS__RING_ENTRIES & (CCS__RING_ENTRIES - 1)) == 0, "ring entries: a power of two");
_Static_assert(CCS__RING_BATCH_MAX <= CCS__RING_ENTRIES, "a batch fits the ring");
_Static_assert(sizeof(_Atomic uint32_t) == 4 && ATOMIC_INT_LOCK_FREE == 2,
               "ring indices are lock-free 32-bit atomics (shared between processes)");

#endif
