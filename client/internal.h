/* libccs internals: the connection to the daemon, registered memory and
 * staging, and the per-call error text. */
#ifndef CCS_CLIENT_INTERNAL_H
#define CCS_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "ccs.h"
#include "wire.h"

#define CCS__API __attribute__((visibility("default")))
#define CCS__DEFAULT_SOCKET "/run/ccs/ccsd.sock"

/* One connection per process, shared by its threads. Each call sends its
 * request and waits for the reply with its id; whichever waiting thread
 * finds no reader becomes the reader and hands other threads' replies over
 * (leader/follower), so threads never block each other's replies. */
struct ccs__reply_slot;
struct ccs__call;
struct ccs__conn {
  int fd;
  pid_t pid; /* a forked child must not share its parent's connection */
  int refs;  /* the process's current-connection pointer, comms, calls */
  _Atomic int broken;    /* a ccs_result_t once the connection is unusable (read anywhere) */
  char broken_text[256]; /* the daemon's last word, if it said one */
  uint64_t next_id;
  pthread_mutex_t send_mu;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int reading;
  struct ccs__reply_slot *replies;
  struct ccs__frame_reader rd;
  struct ccs__ring *ring; /* the fast path (ring.c), or NULL */
  uint32_t protocol;      /* the daemon's (its hello's reply) */
  int parts;              /* it takes calls in parts (parts.c; an older one does not) */
  struct ccs__journal *journal; /* where the daemon marks our calls (restart.c), or NULL */
  /* restart.c: calls not yet answered, oldest first (under mu); the
   * keeper thread that rejoins the comms when the daemon goes; the
   * connection it made then (NULL while it works, or when it failed:
   * `moved` says which); arriving: a keeper still moves comms here;
   * joining: comm inits answered here whose comms are not tracked yet
   * (the keeper waits for them, so that they rejoin too) */
  struct ccs__call *calls;
  int keeper_started, moved, arriving, joining;
  int keeper_stop; /* an eventfd that ends the keeper; -1: none */
  pthread_t keeper;
  struct ccs__conn *successor;
};

/* The current connection, connecting (and saying hello) if there is none,
 * the last one broke, or the process forked. Takes a reference. */
ccs_result_t ccs__conn_get(struct ccs__conn **ret);
/* A new connection (resume: after the daemon went, to rejoin comms). */
ccs_result_t ccs__conn_open(struct ccs__conn **ret, int resume);
/* c broke and its keeper works: waits for it, and returns the connection
 * it made (a reference), or NULL when there is none (it failed, or no
 * keeper runs). */
struct ccs__conn *ccs__conn_successor(struct ccs__conn *c);
/* The connection comm uses now (a reference: put it): its own, or the one
 * its keeper moved it to after the daemon went (waiting for that). */
struct ccs__conn *ccs__comm_conn(ccs_comm_t *comm);
/* c broke, and its keeper moves its comms to a new connection: a call
 * that did not go out goes there (ccs__comm_conn). */
int ccs__conn_moving(struct ccs__conn *c);
/* Sends every request (ids assigned here) before waiting for any reply:
 * replies[i] is request i's (NULL, with status[i] and text[i], where it
 * failed). Waits at most until deadline_ns (CLOCK_MONOTONIC); past it the
 * rest fail with CCS_ERR_TIMEOUT. */
void ccs__conn_call_all(struct ccs__conn *c, Ccs__Request *const *reqs, size_t n,
                        uint64_t deadline_ns, Ccs__Reply **replies, ccs_result_t *status,
                        char (*text)[CCS__ERROR_TEXT_MAX]);
/* As ccs__conn_call, the call's journal key set before it is sent. */
ccs_result_t ccs__conn_call_tracked(struct ccs__conn *c, Ccs__Request *req, struct ccs__call *call,
                                    Ccs__Reply **ret);
void ccs__conn_ref(struct ccs__conn *c);
void ccs__conn_put(struct ccs__conn *c);
/* A reference on c unless its last one went (it is being freed): 0 then. */
int ccs__conn_ref_live(struct ccs__conn *c);
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
 * would answer a Submit without info. call (or NULL) gets its journal key. */
ccs_result_t ccs__ring_call(struct ccs__conn *c, Ccs__Op *const *ops, size_t n, struct ccs__call *call);
/* After a restart: each host stream's call of comm still out on c (each
 * numbered, collectives) is settled: finished where number < finished,
 * else failed with CCS_ERR_RETRY. Their streams leave c. comm NULL: every
 * call no verdict settled (its comm was not rejoined) fails, so that its
 * stream's count in flight comes back down. */
void ccs__ring_settle_streams(struct ccs__conn *c, ccs_comm_t *comm, uint64_t finished);
/* The numbers of comm's host stream calls still out on c, once the
 * answers that came are taken: [first, end);
 * returns how many of its CUDA stream calls are out. */
int ccs__ring_stream_numbers(struct ccs__conn *c, const ccs_comm_t *comm, uint64_t *first, uint64_t *end);
/* c's journal opened: the rings' answers check their op numbers by it. */
void ccs__ring_journal(struct ccs__conn *c);
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
  struct ccs__conn *_Atomic conn; /* of the calls in flight, while there are some */
  ccs_comm_t *comm;              /* of the calls in flight */
  uint32_t inflight;
  ccs_result_t error; /* the first since the last synchronize */
  char error_text[CCS__ERROR_TEXT_MAX];
  /* calls since the last synchronize the caller must repeat (a restart:
   * CCS_ERR_RETRY), the last ones it made; as of that synchronize */
  _Atomic uint32_t to_repeat;
  uint32_t repeat_count;
  /* the comms of those calls (under the registry's lock): none of their
   * calls go, on any stream, until this one is synchronized */
  ccs_comm_t **owes;
  size_t nowes, owes_cap;
  int parts; /* a blocking call's parts' own (parts.c, which repeats them itself): owes nothing */
};
/* The host stream s is, or NULL (a CUDA stream, or nothing). */
struct ccs__host_stream *ccs__host_stream_of(const void *s);
/* After a call of s the caller must repeat, or one of comm on another
 * stream, none goes out of its order: CCS_ERR_RETRY (the call counted
 * among those to repeat, its text in comm's last error), else CCS_OK. */
ccs_result_t ccs__host_stream_refuse(struct ccs__host_stream *s, ccs_comm_t *comm);
/* s's call of comm must be repeated (counted in s->to_repeat by the
 * caller): comm's host-stream calls are refused until s is synchronized. */
void ccs__host_stream_owes(struct ccs__host_stream *s, ccs_comm_t *comm);
/* comm is destroyed: no stream owes it any more. */
void ccs__host_streams_forget_comm(const ccs_comm_t *comm);
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

/* A comm's calls of one channel (restart.c): its collectives (peer -1),
 * or its sends to or receives from one peer. Calls are numbered from 0 as
 * they go out; they are answered in order. */
struct ccs__chan {
  int peer, send;
  uint64_t next; /* the number of the next call */
  uint64_t done; /* calls answered with a result (they ran) */
};

struct ccs_comm {
  struct ccs__conn *conn;
  uint64_t handle;
  int nranks, rank;
  int debug; /* CCS_DEBUG=INFO */
  int priority; /* ccs_priority_t, resolved: comms made from it keep it */
  ccs_result_t async_error;
  char last_error[CCS__ERROR_TEXT_MAX];
  uint32_t inflight; /* host streams' calls not yet answered (under the ring's lock) */
  _Atomic uint32_t owed; /* host streams owing repeats of its calls (stream.c) */
  uint32_t derived;  /* comms split or shrunk from it so far (their names count them) */
  /* what rejoins it after a restart (restart.c): its identity as the
   * daemon gave it, what it was made with, and its channels (under the
   * connection's mu) */
  uint8_t id[CCS_UNIQUE_ID_BYTES];
  _Atomic int has_id; /* (read without the lock as calls go out: ccs__numbers_sent) */
  int spans; /* ranks on other daemons: not rejoined (they failed it when the daemon went) */
  uint32_t op_timeout_ms;
  char *algo;
  struct ccs__chan *chans; /* [0]: its collectives */
  size_t nchans;
  struct ccs__parts *parts; /* its calls cut in parts: slots and streams (parts.c), or NULL */
};

/* --- restart.c: riding through a daemon restart (docs/restart.md) --- */

/* Whether this process rejoins its comms when its daemon goes
 * (CCS_RECONNECT_TIMEOUT, seconds, default 30; 0: no). */
double ccs__reconnect_timeout(void);
/* A call that needs no comm (an init, a registration) and found the
 * daemon gone, or (init) another daemon of the comm not back: whether to
 * send it again, after a pause, on *c, moved to the next connection. Each
 * connection gets CCS_RECONNECT_TIMEOUT from when the call found it gone:
 * neither the time the call waited (an init for its ranks) nor that spent
 * waiting for a keeper's rejoins counts; a daemon that keeps going under
 * it ends it after 4 timeouts in all. Zeroed before the first. */
struct ccs__ride {
  uint64_t deadline_ns, limit_ns;
  int tries;
};
int ccs__ride_again(struct ccs__conn **c, struct ccs__ride *r);
/* The journal for a new connection (protocol 5 daemons): made, mapped,
 * passed. Quietly none when that fails (calls then resubmit less). */
void ccs__journal_open(struct ccs__conn *c);
void ccs__journal_free(struct ccs__conn *c);
/* The keeper of c: started with its first comm, rejoins c's comms on a
 * new connection when the daemon's end closes. */
void ccs__keeper_start(struct ccs__conn *c);
/* A comm's channel (peer -1: the collectives), made on first use; -1
 * when out of memory. Under the connection's mu. */
int ccs__chan_of(ccs_comm_t *comm, int peer, int send);

/* A blocking call's record while it is out: its ops' channels and
 * numbers, which ops could not run again once started (in place on
 * registered memory: their inputs overwritten), the journal key its
 * request went under, and, after a restart, what became of each op. */
enum ccs__verdict { CCS__OUT, CCS__FINISHED, CCS__RESUBMIT, CCS__REPEAT };
struct ccs__call_op {
  ccs_comm_t *comm;
  int chan;
  uint64_t number;
  int unsafe_to_rerun;
  int verdict; /* enum ccs__verdict */
  void *kept;  /* an in-place op's input as it was, put back before it goes again (NULL: none) */
};
struct ccs__call {
  struct ccs__call *next, *prev; /* in conn->calls */
  struct ccs__conn *conn;
  uint64_t key; /* ccs__journal_key */
  int keyed;
  int settled;             /* the keeper decided every op's verdict (or the comms failed) */
  ccs_result_t failed;     /* not CCS_OK: the comms could not rejoin */
  char *text;              /* with failed (NULL when out of memory: the code's own text) */
  size_t n;
  struct ccs__call_op op[];
};
/* Numbers the ops (numbers: the ones they had, when resubmitted) and
 * lists the call as out on c. NULL when c keeps no journal or memory runs
 * out (the call then goes out untracked; the ops' kept copies stay the
 * caller's), or, with *moving set, when c broke and its keeper is at work
 * (call again on the comm's connection). */
struct ccs__call_desc {
  ccs_comm_t *comm;
  uint32_t kind;
  int peer;            /* a send's or receive's */
  int unsafe_to_rerun; /* run again, it could read what it wrote */
  void *kept;          /* its input as it was (the caller's to free): it can run again */
};
struct ccs__call *ccs__call_new(struct ccs__conn *c, const struct ccs__call_desc *ops, size_t n,
                                const uint64_t *numbers, int *moving);
/* The bytes of an in-place op's input on registered host memory that
 * libccs keeps a copy of while the call is out, so that a restart under
 * it resubmits it rather than have every rank repeat it
 * (CCS_KEEP_INPUT_BYTES, default 64 KiB; 0: none). */
size_t ccs__keep_input_bytes(void);
/* A byte count from the environment: 1 and *out when `name` holds a
 * decimal number and nothing else (leading blanks allowed), else 0. */
int ccs__env_bytes(const char *name, unsigned long long *out);
/* The registry of comms the keeper rejoins (comm.c keeps it current). */
void ccs__comm_track(ccs_comm_t *comm);
void ccs__comm_untrack(ccs_comm_t *comm);
/* A comm init goes out on c (more = 1), or its comm is tracked or it
 * failed (0): c's keeper collects the comms to rejoin between them. */
void ccs__conn_joining(struct ccs__conn *c, int more);
/* The request key it goes out under: set before it is sent. */
void ccs__call_keyed(struct ccs__call *call, uint64_t key);
/* Its answer came: its ops ran (status CCS_OK or CCS_ERR_MISMATCH) or not. */
void ccs__call_answered(struct ccs__call *call, ccs_result_t status);
/* The connection went under it: waits until the keeper settled it.
 * CCS_OK with each op's verdict, or the failure (its text set). */
ccs_result_t ccs__call_await(struct ccs__call *call);
void ccs__call_free(struct ccs__call *call);
/* A host stream's ops numbered (under the connection's mu). */
uint64_t ccs__chan_take(ccs_comm_t *comm, int chan, uint64_t count);
/* Calls [first, first+count) of a channel answered with status: they ran
 * (CCS_OK, CCS_ERR_MISMATCH) or not (their numbers given back: from them
 * on when they are to be repeated, CCS_ERR_RETRY or CCS_ERR_QUOTA). seq:
 * the daemon's number for a finished call of one collective (the
 * journal's), checked against first; 0: none. 1 when they were refused
 * otherwise (bad arguments, memory) while later calls were out: the rank's
 * calls no longer line up with the other ranks' (the comm cannot go on),
 * else 0. */
int ccs__chan_settled(ccs_comm_t *comm, int chan, uint64_t first, uint64_t count,
                      ccs_result_t status, uint32_t seq);
/* Whether comm's collectives on c go out with their numbers (ccs.proto's
 * Op.number): only while c counts every call (its journal) and comm's
 * numbers are exact (has_id); the daemon checks what it is told. */
/* The monotonic clock, in ns. */
static inline uint64_t ccs__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline int ccs__numbers_sent(const struct ccs__conn *c, const ccs_comm_t *comm) {
  return c->journal && c->keeper_started && comm->has_id;
}

#endif
