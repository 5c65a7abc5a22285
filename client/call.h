/* One call's ops inside libccs, between the public calls (coll.c) and
 * what submits them: whole, or cut in parts (parts.c). */
#ifndef CCS_CLIENT_CALL_H
#define CCS_CLIENT_CALL_H

#include "internal.h"

struct op {
  ccs_comm_t *comm;
  uint32_t kind;
  uint64_t count;
  ccs_dtype_t dtype;
  ccs_redop_t redop;
  int root;
  const char *send;
  char *recv;
  uint64_t send_len, recv_len;
  /* resolved: buffer id and offset; staged ranges copy through staging */
  uint64_t send_id, send_off, recv_id, recv_off;
  const char *stage_lo; /* user range staged at stage_off, or NULL */
  size_t stage_len, stage_off;
  int stage_in;   /* copy user -> staging before (send data lies in range) */
  const char *stage2_lo; /* a second, disjoint staged range (send) */
  size_t stage2_len, stage2_off;
  int device;   /* the GPU holding the buffers; -1: host memory */
  int via_host; /* device buffers staged through host memory (submit_on: a comm spans daemons) */
  uint64_t whole_count; /* a part of a call cut in parts (parts.c): the call's count; else 0 */
  void *stream; /* cudaStream_t (device buffers) */
  struct ccs__host_stream *host_stream; /* or a host stream (host buffers) */
};

/* Submits ops[0..n) and waits for them (on a host stream: until
 * submitted), riding through a daemon restart; with only_on, they go on
 * that connection or not at all: once the comm moved to another (the
 * daemon restarted), CCS_ERR_RETRY when the keeper is through. */
ccs_result_t ccs__submit(struct op *ops, size_t n, const struct ccs__conn *only_on);

/* Whether o, one checked call outside a group, goes in parts: a large
 * collective (not a send, receive or barrier) on unregistered host memory
 * of a comm on one daemon. */
int ccs__parts_fit(const struct op *o);
/* Runs o in parts (ccs__parts_fit) and waits for it. */
ccs_result_t ccs__submit_in_parts(const struct op *o);
/* Lets go of a comm's slots and streams (the comm goes). */
void ccs__parts_free(ccs_comm_t *comm);

#endif
