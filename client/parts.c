/* Large calls on unregistered host buffers, cut in parts. A staged call
 * copies its input into registered memory, runs, and copies the result
 * out: on a machine bound by memory bandwidth that triples its time
 * (docs/performance.md, "Staged buffers"). In parts, the daemon runs one
 * part on the comm's registered slots while the caller's thread copies the
 * next part in and a finished one out, so the copies overlap the op.
 *
 * Part k of a call is the same collective on slice k of each of its
 * buffers' blocks (a block: count elements, one per rank where the call
 * has one per rank, as all_gather's output): the call on the slices
 * gives the slices of the call's result. Each part goes on a host stream
 * of its slot (stream.c), in the comm's order. The first part is waited
 * for before the second goes: every part carries the whole call's count,
 * so ranks that disagree are refused there, before any part writes, and
 * the ranks that pass it make the same parts. Whether a rank cuts a call
 * depends on its buffers: where other ranks made the call whole, the
 * daemon answers the first part so, and the call goes whole. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"

#define SLOTS 3 /* one part copied in, one run, one copied out */
#define PART_BYTES_DEFAULT ((size_t)1 << 20)
#define PART_BYTES_MIN ((size_t)4 << 10) /* smaller parts cost more per op than they overlap */
#define PART_BYTES_MAX ((size_t)256 << 20)
#define REPEATS_MAX 8 /* daemon restarts under one call before it is the caller's to repeat */

struct ccs__parts {
  size_t part_bytes; /* a slot holds a part's input and output: twice that */
  void *slot[SLOTS];
  ccs_stream_t stream[SLOTS];
};

/* CCS_STAGED_PART_BYTES: a part's bytes (0: no call is cut; 4 KiB to
 * 256 MiB); every rank of a comm must use the same, or their calls are
 * refused as mismatched */
static size_t part_bytes(void) {
  unsigned long long b;
  if (!ccs__env_bytes("CCS_STAGED_PART_BYTES", &b)) return PART_BYTES_DEFAULT;
  return b == 0 ? 0 : b < PART_BYTES_MIN ? PART_BYTES_MIN : b > PART_BYTES_MAX ? PART_BYTES_MAX : (size_t)b;
}

static int staged(struct ccs__conn *c, const void *ptr, uint64_t len) {
  uint64_t id, off;
  return len == 0 || ccs__mem_lookup(c, ptr, len, &id, &off) == 1;
}

/* Blocks of count elements in a buffer of the kind's that has most: one
 * per rank, or one; the same at every rank (so are the parts) */
static uint64_t blocks_of(uint32_t kind, int nranks) {
  switch (kind) {
  case CCS__ALL_REDUCE: case CCS__BROADCAST: case CCS__REDUCE: return 1;
  case CCS__ALL_GATHER: case CCS__REDUCE_SCATTER: case CCS__ALL_TO_ALL: case CCS__GATHER:
  case CCS__SCATTER: return (uint64_t)nranks;
  default: return 0; /* sends, receives, barriers: never cut */
  }
}

/* Elements of a block in one part; 0: the call is not cut. */
static uint64_t part_count(const struct op *o) {
  uint64_t blocks = blocks_of(o->kind, o->comm->nranks);
  return blocks ? part_bytes() / ccs_dtype_size(o->dtype) / blocks : 0;
}

/* The buffers apart, or in place as the public calls define it: then the
 * slices a part writes are the ones it read (or hold what it read) */
static int apart_or_in_place(const struct op *o) {
  if (!o->send_len || !o->recv_len) return 1;
  if (o->send >= o->recv + o->recv_len || o->recv >= o->send + o->send_len) return 1;
  ptrdiff_t at = (ptrdiff_t)((size_t)o->comm->rank * o->count * ccs_dtype_size(o->dtype));
  switch (o->kind) {
  case CCS__ALL_GATHER: case CCS__GATHER: return o->send == o->recv + at;
  case CCS__REDUCE_SCATTER: case CCS__SCATTER: return o->recv == o->send + at;
  default: return o->send == o->recv;
  }
}

int ccs__parts_fit(const struct op *o) {
  if (o->device >= 0 || o->stream || o->comm->spans || o->comm->debug) return 0;
  /* a call under two of the smallest parts never goes in parts: small
   * calls, the ones whose cost counts, ask nothing more */
  uint64_t blocks = blocks_of(o->kind, o->comm->nranks), es = ccs_dtype_size(o->dtype);
  if (!blocks || o->count < 2 * (PART_BYTES_MIN / es / blocks)) return 0;
  uint64_t pn = part_count(o);
  if (!pn || o->count < 2 * pn || !apart_or_in_place(o)) return 0;
  struct ccs__conn *c = ccs__comm_conn(o->comm);
  int fit = c->parts && ccs__ring_takes(c, 1) && staged(c, o->send, o->send_len) &&
            staged(c, o->recv, o->recv_len);
  ccs__conn_put(c);
  return fit;
}

void ccs__parts_free(ccs_comm_t *comm) {
  struct ccs__parts *p = comm->parts;
  if (!p) return;
  for (int s = 0; s < SLOTS; s++) {
    if (p->stream[s]) ccs_stream_destroy(p->stream[s]);
    if (p->slot[s]) ccs_mem_free(p->slot[s]);
  }
  free(p);
  comm->parts = NULL;
}

static ccs_result_t parts_of(ccs_comm_t *comm, size_t bytes, struct ccs__parts **ret) {
  struct ccs__parts *p = comm->parts;
  if (p && p->part_bytes == bytes) {
    *ret = p;
    return CCS_OK;
  }
  ccs__parts_free(comm);
  if (!(p = calloc(1, sizeof(*p)))) {
    ccs__set_error("out of memory");
    return CCS_ERR_NO_MEMORY;
  }
  comm->parts = p;
  p->part_bytes = bytes;
  ccs_result_t rc = CCS_OK;
  for (int s = 0; s < SLOTS && rc == CCS_OK; s++)
    if ((rc = ccs_mem_alloc(&p->slot[s], 2 * bytes)) == CCS_OK && (rc = ccs_stream_create(&p->stream[s])) == CCS_OK)
      ((struct ccs__host_stream *)p->stream[s])->parts = 1;
  if (rc != CCS_OK) ccs__parts_free(comm);
  *ret = comm->parts;
  return rc;
}

/* One call in parts of pn elements a block; a slot holds a part's send
 * blocks, then its receive blocks. */
struct cut {
  const struct op *o;
  struct ccs__parts *p;
  uint64_t pn, nparts;
  size_t es;
  uint64_t send_blocks, recv_blocks; /* this rank's: 0, 1 or nranks */
  /* where the parts go: once the daemon restarted (the comm moved), no
   * more, since the parts out are settled (finished, or to repeat) and
   * the ranks go again from the first to repeat, all numbered alike */
  struct ccs__conn *conn;
};

static uint64_t count_of(const struct cut *k, uint64_t part) {
  uint64_t first = part * k->pn;
  return k->o->count - first < k->pn ? k->o->count - first : k->pn;
}

static char *slot_recv(const struct cut *k, uint64_t part) {
  return (char *)k->p->slot[part % SLOTS] + k->send_blocks * k->pn * k->es;
}

static void copy_in(const struct cut *k, uint64_t part) {
  size_t cnt = count_of(k, part) * k->es, block = k->o->count * k->es, at = part * k->pn * k->es;
  for (uint64_t b = 0; b < k->send_blocks; b++)
    memcpy((char *)k->p->slot[part % SLOTS] + b * cnt, k->o->send + b * block + at, cnt);
}

static ccs_result_t submit_part(const struct cut *k, uint64_t part) {
  const struct op *o = k->o;
  struct op q = {.comm = o->comm, .kind = o->kind, .count = count_of(k, part), .dtype = o->dtype,
                 .redop = o->redop, .root = o->root, .device = -1, .whole_count = o->count,
                 .host_stream = ccs__host_stream_of(k->p->stream[part % SLOTS])};
  ccs__op_lengths(q.kind, q.count, k->es, o->comm->nranks, o->comm->rank, q.root, &q.send_len,
                  &q.recv_len);
  if (q.send_len) q.send = k->p->slot[part % SLOTS];
  if (q.recv_len) q.recv = slot_recv(k, part);
  return ccs__submit(&q, 1, k->conn);
}

/* Waits for a part, and copies its result out. */
static ccs_result_t finish(const struct cut *k, uint64_t part) {
  ccs_result_t rc = ccs_stream_synchronize(k->p->stream[part % SLOTS]);
  size_t cnt = count_of(k, part) * k->es, block = k->o->count * k->es, at = part * k->pn * k->es;
  for (uint64_t b = 0; rc == CCS_OK && b < k->recv_blocks; b++)
    memcpy(k->o->recv + b * block + at, slot_recv(k, part) + b * cnt, cnt);
  return rc;
}

/* The parts still out after one failed: waited for, their results and
 * errors dropped (the call's error is the first part's that failed). */
static void drain(const struct cut *k) {
  char keep[CCS__ERROR_TEXT_MAX];
  snprintf(keep, sizeof(keep), "%s", ccs__error());
  for (int s = 0; s < SLOTS; s++) ccs_stream_synchronize(k->p->stream[s]);
  ccs__set_error("%s", keep);
}

/* Parts from..nparts; *failed: the first that failed (its error returned). */
static ccs_result_t run_from(struct cut *k, uint64_t from, uint64_t *failed) {
  uint64_t out = from; /* the next part to finish */
  ccs_result_t rc = CCS_OK;
  k->conn = ccs__comm_conn(k->o->comm); /* (a reference: compared, never reused for another) */
  for (uint64_t part = from; part < k->nparts && rc == CCS_OK; part++) {
    while (part - out >= SLOTS && (rc = finish(k, out)) == CCS_OK) out++;
    if (rc != CCS_OK) break;
    copy_in(k, part);
    /* the first part checks the whole call at every rank before more go */
    if (part == 1 && out == 0) {
      if ((rc = finish(k, 0)) != CCS_OK) break;
      out = 1;
    }
    if ((rc = submit_part(k, part)) != CCS_OK) {
      /* the parts before it still out come first: the first of them that
       * failed is where the call failed */
      ccs_result_t first = CCS_OK;
      while (out < part && (first = finish(k, out)) == CCS_OK) out++;
      if (first != CCS_OK) rc = first;
    }
  }
  while (out < k->nparts && rc == CCS_OK && (rc = finish(k, out)) == CCS_OK) out++;
  if (rc != CCS_OK) {
    *failed = out;
    drain(k);
  }
  ccs__conn_put(k->conn);
  return rc;
}

/* The call made whole, staged as any (a copy: submitting resolves it). */
static ccs_result_t submit_whole(const struct op *o) {
  struct op whole = *o;
  return ccs__submit(&whole, 1, NULL);
}

ccs_result_t ccs__submit_in_parts(const struct op *o) {
  /* what a host stream has in flight goes first, as for any staged call */
  if (o->host_stream) ccs__host_stream_drain(o->host_stream);
  ccs_result_t rc = o->host_stream ? ccs__host_stream_refuse(o->host_stream, o->comm) : CCS_OK;
  if (rc != CCS_OK) return rc;
  struct cut k = {.o = o, .es = ccs_dtype_size(o->dtype), .pn = part_count(o)};
  k.nparts = (o->count + k.pn - 1) / k.pn;
  k.send_blocks = o->send_len / (o->count * k.es);
  k.recv_blocks = o->recv_len / (o->count * k.es);
  rc = parts_of(o->comm, part_bytes(), &k.p);
  if (rc != CCS_OK) return submit_whole(o); /* no slots (a quota, say) */
  uint64_t from = 0, failed = 0;
  for (int repeats = 0;; repeats++) {
    rc = run_from(&k, from, &failed);
    if (rc == CCS__RESULT_WHOLE && failed == 0) return submit_whole(o); /* other ranks did (their buffers) */
    /* the daemon restarted under a part: the parts before it finished at
     * every rank (the same verdicts reach each), it and the later ones go
     * again from the caller's buffers, which only finished parts wrote */
    if (rc != CCS_ERR_RETRY || repeats == REPEATS_MAX) break;
    from = failed;
  }
  if (rc != CCS_OK) snprintf(o->comm->last_error, sizeof(o->comm->last_error), "%s", ccs__error());
  return rc;
}
