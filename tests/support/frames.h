/* The requests a client sends, as wire frames (length, then Request),
 * built in one place: the hand-speaking client (raw.c), the fuzz targets
 * and the seed writer all say hello, ask for ids, join comms, register
 * memory and submit ops through these. Nothing of a test framework here,
 * so the libFuzzer builds link it too. */
#ifndef CCS_TEST_FRAMES_H
#define CCS_TEST_FRAMES_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "wire.h"

/* malloc'ed: the caller frees data; NULL when the request does not fit a
 * frame. */
struct frame {
  uint8_t *data;
  size_t len;
};

struct frame frame_of(const Ccs__Request *req);
struct frame frame_hello(uint64_t req_id, uint32_t protocol);
struct frame frame_get_unique_id(uint64_t req_id);
struct frame frame_stats(uint64_t req_id);
/* An operator command (ccsctl's): command and its nargs args. */
struct frame frame_admin(uint64_t req_id, const char *command, char **args, size_t nargs, int json);
/* Joins `rank` of a comm of nranks on the unique id's bytes. */
struct frame frame_comm_init(uint64_t req_id, ProtobufCBinaryData id, uint32_t nranks, uint32_t rank);
/* The rings' memfd and the doorbell's eventfd travel beside it (ring.h). */
struct frame frame_ring_setup(uint64_t req_id);
/* The memory travels beside the frame, as its descriptor (frame_send). */
struct frame frame_mem_register(uint64_t req_id);
/* n_ops ops. */
struct frame frame_submit(uint64_t req_id, Ccs__Op **ops, size_t n_ops);

/* len bytes (a frame, or anything) and nfds descriptors with them
 * (SCM_RIGHTS) in one sendmsg, never raising SIGPIPE; sendmsg's result. */
ssize_t frame_send(int sock, const void *buf, size_t len, const int *fds, int nfds, int flags);

#endif
