/* libccs internals: the connection to the daemon, registered memory and
 * staging, and the per-call error text. */
#ifndef CCS_CLIENT_INTERNAL_H
#define CCS_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "ccs.h"
#include "wire.h"

#define CCS__API __attribute__((visibility("default")))
#define CCS__DEFAULT_SOCKET "/run/ccs/ccsd.sock"

/* One connection per process, shared by its threads. Each call sends its
 * request and waits for the reply with its id; whichever waiting thread
 * finds no reader becomes the reader and hands other threads' replies over
 * (leader/follower), so threads never block each other's replies. */
struct ccs__reply_slot;
struct ccs__conn {
  int fd;
  pid_t pid; /* a forked child must not share its parent's connection */
  int refs;  /* the process's current-connection pointer, comms, calls */
  int broken;            /* a ccs_result_t once the connection is unusable */
  char broken_text[256]; /* the daemon's last word, if it said one */
  uint64_t next_id;
  pthread_mutex_t send_mu;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int reading;
  struct ccs__reply_slot *replies;
  struct ccs__frame_reader rd;
  struct ccs__ring *ring; /* the fast path (ring.c), or NULL */
};

/* The current connection, connecting (and saying hello) if there is none,
 * the last one broke, or the process forked. Takes a reference. */
ccs_result_t ccs__conn_get(struct ccs__conn **ret);
void ccs__conn_ref(struct ccs__conn *c);
void ccs__conn_put(struct ccs__conn *c);
/* Sends req (its id is assigned here) with an optional fd, waits for the
 * reply. On any result other than CCS_OK the reply is NULL and the text is
 * in ccs__error(). A reply with an error status is returned as that status
 * with its text, and freed. */
ccs_result_t ccs__conn_call(struct ccs__conn *c, Ccs__Request *req, int pass_fd,
                            Ccs__Reply **ret);
/* The same, passing nfds descriptors with the request. */
ccs_result_t ccs__conn_call_fds(struct ccs__conn *c, Ccs__Request *req, const int *fds, int nfds,
                                Ccs__Reply **ret);
/* Without blocking: has the daemon hung up? (Then what it said last is
 * read, when no other thread reads.) The connection's failure, or CCS_OK. */
ccs_result_t ccs__conn_check(struct ccs__conn *c);
/* The connection's failure, with its text in ccs__error(). */
ccs_result_t ccs__conn_broken_error(struct ccs__conn *c);

/* ring.c: the fast path (proto/ring.h). ccs__ring_open sets c->ring when
 * the daemon takes the rings (quietly not, else). */
struct ccs__ring;
void ccs__ring_open(struct ccs__conn *c);
void ccs__ring_free(struct ccs__ring *r);
/* Can a call of nops host ops go through the rings? */
int ccs__ring_takes(const struct ccs__conn *c, size_t nops);
/* Submits the ops as one call and waits for its answer: as ccs__conn_call
 * would answer a Submit without info. */
ccs_result_t ccs__ring_call(struct ccs__conn *c, Ccs__Op *const *ops, size_t n);
/* Submits the ops of comm as one call of host stream s and returns: the
 * daemon runs them after the comm's earlier ops; their answer goes to s
 * (and to comm when it failed). */
struct ccs__host_stream;
ccs_result_t ccs__ring_post(struct ccs__conn *c, Ccs__Op *const *ops, size_t n,
                            struct ccs__host_stream *s, ccs_comm_t *comm);
/* Until *count (a stream's or a comm's calls in flight, changed under the
 * ring's lock) is 0: CCS_OK, or the connection's failure. */
ccs_result_t ccs__ring_wait_idle(struct ccs__conn *c, const uint32_t *count);
/* Answers still to come for comm's calls go to no comm (it is freed). */
void ccs__ring_forget_comm(struct ccs__conn *c, const ccs_comm_t *comm);
/* A call on device buffers in a CUDA stream's order, through the stream
 * flags of its call slot (proto/ring.h). stream_flags: 0 when this
 * connection can (the flags registered with CUDA, a guard thread watching
 * the socket; tried once), -1 when not (the call then waits: the stream
 * synchronised before, the answer after); flags_off: not any more (the
 * device would not write or wait for a flag). claim takes a slot for a call
 * of comm and names its flags: the caller queues on its stream the write
 * of ready = gen, the wait for done to reach it and the write of
 * passed = gen, then posts (or unclaims: the call does not go out, its
 * stream goes on). Nobody waits for the answer; a failure goes to comm (and
 * lets the stream go); the slot serves again once the stream passed it. */
struct ccs__ring_claim {
  uint32_t slot, gen;
  _Atomic uint32_t *ready, *done, *passed;
};
int ccs__ring_stream_flags(struct ccs__conn *c, int device);
int ccs__ring_guard_start(struct ccs__conn *c); /* (stream_flags starts it; tests alone) */
void ccs__ring_stream_flags_off(struct ccs__conn *c);
ccs_result_t ccs__ring_claim(struct ccs__conn *c, ccs_comm_t *comm, struct ccs__ring_claim *ret);
ccs_result_t ccs__ring_post_claimed(struct ccs__conn *c, const struct ccs__ring_claim *k,
                                    Ccs__Op *const *ops, size_t n);
/* queued: the caller's stream may still write the call's flags (the slot
 * serves again once it wrote passed) */
void ccs__ring_unclaim(struct ccs__conn *c, const struct ccs__ring_claim *k, int queued);

/* stream.c: host streams (ccs_stream_create). Their fields, but for the
 * registry's link, change under their connection's ring lock. */
struct ccs__host_stream {
  struct ccs__host_stream *next; /* the registry */
  struct ccs__conn *conn;        /* of the calls in flight, while there are some */
  ccs_comm_t *comm;              /* of the calls in flight */
  uint32_t inflight;
  ccs_result_t error; /* the first since the last synchronize */
  char error_text[CCS__ERROR_TEXT_MAX];
};
/* The host stream s is, or NULL (a CUDA stream, or nothing). */
struct ccs__host_stream *ccs__host_stream_of(const void *s);
/* Until s has no call in flight; CCS_OK, or the connection's failure. */
ccs_result_t ccs__host_stream_drain(struct ccs__host_stream *s);
/* The connection c is freed: its streams' calls will never be answered. */
void ccs__host_streams_conn_gone(struct ccs__conn *c);
/* A call failed: its comm learns why, and whether it is done for. */
void ccs__comm_failed(ccs_comm_t *comm, ccs_result_t rc, const char *text);

/* Thread-local detail of the last failure (also copied into the comm). */
void ccs__set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *ccs__error(void);

/* Registered memory: (buffer id, offset) for [ptr, ptr+len) on connection
 * c, registering again there if the buffer was made on an older
 * connection. 0 when found, 1 when not ccs memory, <0 on failure. */
int ccs__mem_lookup(struct ccs__conn *c, const void *ptr, size_t len, uint64_t *ret_id,
                    uint64_t *ret_off);
/* The GPU of the ccs memory holding ptr, -1 for host memory, -2 when ccs
 * did not allocate or register it. */
int ccs__mem_device_of(const void *ptr);

/* Staging for unregistered buffers: a registered area of at least `bytes`
 * in host memory (device -1) or on a GPU, taken from a per-connection
 * pool (exclusive until released; a device area until the GPU work queued
 * on `stream` at release is done). */
struct ccs__staging {
  void *base;
  size_t size;
  uint64_t id;
  int device;
  void *free_after; /* device: an event recorded at release */
  struct ccs__conn *conn;
  struct ccs__staging *next;
};
ccs_result_t ccs__staging_take(struct ccs__conn *c, size_t bytes, int device,
                               struct ccs__staging **ret);
void ccs__staging_release(struct ccs__staging *s, void *stream);

/* memfd-backed shared memory, sealed against shrinking and growing. */
ccs_result_t ccs__memfd_map(size_t bytes, int *ret_fd, void **ret_ptr);
/* Registers fd: a memfd (device -1) or a GPU allocation of `size` bytes. */
ccs_result_t ccs__mem_register_fd(struct ccs__conn *c, int fd, int device, size_t size,
                                  uint64_t *ret_id);

/* The CUDA domain (gpu.c; gpu_host_only.c without the toolkit). Functions
 * returning ccs_result_t leave a text in ccs__error() on failure. */
ccs_result_t ccs__gpu_usable(void); /* CCS_ERR_UNSUPPORTED: no driver, no GPU */
int ccs__gpu_device_of(const void *ptr); /* -1: not device memory (or no CUDA) */
int ccs__gpu_current_device(void);       /* -1: none, or a process without a context */
ccs_result_t ccs__gpu_uuid(int device, uint8_t *uuid);
/* The legacy IPC handle of the device allocation holding ptr. */
ccs_result_t ccs__gpu_ipc_handle(const void *ptr, void **ret_base, size_t *ret_size,
                                 uint8_t *handle, int *ret_device);
ccs_result_t ccs__gpu_alloc(int device, size_t bytes, void **ret_ptr, size_t *ret_size,
                            int *ret_fd);
void ccs__gpu_unmap(void *ptr, size_t size);
ccs_result_t ccs__gpu_copy(void *dst, const void *src, size_t bytes, void *stream);
int ccs__gpu_event_done(void *event);
void ccs__gpu_event_free(void *event);
ccs_result_t ccs__gpu_record(void **event, int device, void *stream);

/* The stream flags' page, registered with CUDA for every device, and back. */
ccs_result_t ccs__gpu_flags_register(void *page, int device);
void ccs__gpu_flags_unregister(void *page);
/* Queued on stream: write value to a flag, or wait until it has reached value. */
/* (device: the GPU whose context is made current where the thread has none) */
ccs_result_t ccs__gpu_flag_write(void *stream, int device, _Atomic uint32_t *flag, uint32_t value);
ccs_result_t ccs__gpu_flag_wait(void *stream, int device, _Atomic uint32_t *flag, uint32_t value);
/* Whether stream is being captured into a CUDA graph (calls cannot be). */
int ccs__gpu_capturing(void *stream);
ccs_result_t ccs__gpu_sync(void *stream);
void ccs__mem_deregister(struct ccs__conn *c, uint64_t id);

struct ccs_comm {
  struct ccs__conn *conn;
  uint64_t handle;
  int nranks, rank;
  int debug; /* CCS_DEBUG=INFO */
  int priority; /* ccs_priority_t, resolved: comms made from it keep it */
  ccs_result_t async_error;
  char last_error[CCS__ERROR_TEXT_MAX];
  uint32_t inflight; /* host streams' calls not yet answered (under the ring's lock) */
  uint32_t derived;  /* comms split or shrunk from it so far (their names count them) */
};

#endif
