/* The daemon's CUDA memory domain (docs/gpus.md).
 *
 * Clients' device buffers are VMM allocations whose fds the daemon maps
 * once, readable and writable by every GPU with peer access to them. Ops
 * whose buffers are on GPUs run as the engine's graph of device kernels,
 * queued by one submitter thread per GPU in the order the loop matched
 * them, each comm's ops on a stream of their own (a comm that waits for a
 * rank's stream holds up no other). A client's stream order is kept with
 * stream flags in its rings' page (proto/ring.h): this daemon's stream
 * waits for the client's `ready` and writes its `done`, so no host thread
 * waits for a GPU on anyone's behalf, and a call returns once submitted.
 * A watchdog thread per daemon lets go of the ops of failed comms (it
 * writes the flags their streams wait for), notices errors on the streams,
 * and frees what the loop must not wait for.
 *
 * Without the toolkit at build time, a driver or a GPU at run time, the
 * daemon runs host-only: ccsd_gpu_start says why and every device request
 * gets CCS_ERR_UNSUPPORTED with that reason. */
#ifndef CCSD_RUN_GPU_H
#define CCSD_RUN_GPU_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "base/fair.h"
#include "base/list.h"
#include "ccs.h"
#include "run/op.h"

struct engine_pool;

#define CCSD_GPU_MAX_DEVICES 64

struct gpu;

/* What the CUDA runtime reads from the environment when it starts: set
 * before any thread runs (setenv is not thread-safe), so in main. Every
 * kernel loads when the GPUs start (CUDA 13 loads lazily by default: a
 * kernel's first launch would load its module and may synchronise the
 * device behind clients' work); an operator's own setting stands. */
void ccsd_gpu_environment(void);
/* The GPUs of this daemon, or NULL with the reason it runs host-only. */
struct gpu *ccsd_gpu_start(uv_loop_t *loop, char *why, size_t len);
/* Stops its threads, letting go of what is still on a GPU; closes its
 * handle on the loop. Freed by ccsd_gpu_free, once the loop ran its close
 * callbacks: ops and rings freed there may still let go of pages of flags
 * (a comm across daemons kept until its connections closed). */
void ccsd_gpu_stop(struct gpu *g);
void ccsd_gpu_free(struct gpu *g);
/* "2 GPUs: NVIDIA H200 (0), NVIDIA H200 (1)" */
void ccsd_gpu_describe(const struct gpu *g, char *buf, size_t len);

/* Maps a client's exported allocation (fd, always closed here) of `size`
 * bytes on the GPU with that UUID. The fields were checked
 * (ccsd_gpu_check_register) before these calls. */
ccs_result_t ccsd_gpu_map(struct gpu *g, int fd, uint64_t size, const uint8_t *uuid,
                          void **ret_base, int *ret_device, char *err, size_t errlen);
void ccsd_gpu_unmap(void *base, size_t size);
/* A legacy cudaIpcMemHandle (only where cuda_legacy_ipc is on): the
 * opened pointer and the driver block it lies in (ccs__cuda_ipc_open).
 * *ret_held: it failed because this process holds that block open. */
ccs_result_t ccsd_gpu_open_ipc(struct gpu *g, const uint8_t *handle, const uint8_t *uuid,
                               void **ret_ptr, void **ret_block, size_t *ret_block_size,
                               int *ret_device, int *ret_held, char *err, size_t errlen);
void ccsd_gpu_close_ipc(void *base);

/* A connection's stream flags (proto/ring.h: ccs__ring_flags), in the
 * mapping of its rings, which this holds: the session's rings and every
 * post ordered by them take a reference (loop thread). The page is
 * registered with CUDA when the rings are set up (ccsd_gpu_flags_register,
 * where the daemon has GPUs; the client uses the flags only if it was);
 * the last reference then hands it to the GPU side (retire) to unregister
 * and unmap where nothing waits for the device. */
struct gpu_flags {
  _Atomic uint32_t *ready, *done; /* [CCS__RING_ENTRIES], in one page */
  void *page;                     /* that page: what CUDA registers */
  void *map;                      /* the whole mapping, and its length */
  size_t len;
  int refs;
  struct gpu *g;       /* once registered */
  int registered;      /* 1: with CUDA */
  void (*retire)(struct gpu_flags *f); /* set with registered: takes the last reference's page */
  struct list link;    /* the watchdog's, once let go */
};
struct gpu_flags *ccsd_gpu_flags_new(void *map, size_t len, _Atomic uint32_t *ready,
                                     _Atomic uint32_t *done);
/* Loop thread, at RingSetup: 0 when the page is registered with CUDA for
 * every GPU (else why, and the connection's calls wait instead). */
int ccsd_gpu_flags_register(struct gpu *g, struct gpu_flags *f, char *why, size_t len);
void ccsd_gpu_flags_ref(struct gpu_flags *f);
void ccsd_gpu_flags_unref(struct gpu_flags *f);

/* One op's place in a client's stream: flag pair `slot`, value `gen`. */
struct gpu_order {
  struct gpu_flags *flags; /* NULL: no stream order (the call waits for the op) */
  uint32_t slot, gen;
};
/* From the host, never lowering a flag: the client's stream may go on
 * (done: the op ended, or never will run), or this daemon's stream may
 * (ready: the op's comm failed, what it computes no longer matters). */
void ccsd_gpu_order_done(const struct gpu_order *o);
void ccsd_gpu_order_unblock(const struct gpu_order *o);
/* Whether a flag holding `value` has reached `gen` (uint32 wrapping). */
int ccsd_gpu_flag_reached(uint32_t value, uint32_t gen);

/* reach[a] bit b: GPU a can access GPU b's memory. */
const uint64_t *ccsd_gpu_reach(const struct gpu *g);

/* Scratch of device `device`, kept between ops. */
struct engine_pool *ccsd_gpu_pool(struct gpu *g, int device);

/* Queues x, compiled over device buffers, on GPU x->device, on the stream
 * of x->stream_key, after the streams of x->orders reached their ops. From
 * the loop thread; the loop later gets x->on_done (the GPU finished, or
 * x failed or was cancelled). */
void ccsd_gpu_submit(struct gpu *g, struct run_op *x);

/* The fields of a device registration (MemRegister of domain
 * CCS__MEM_CUDA or _CUDA_IPC), before anything is asked of the driver. */
ccs_result_t ccsd_gpu_check_register(uint32_t domain, uint64_t size, size_t uuid_len,
                                     size_t handle_len, char *err, size_t errlen);

/* gpu_streams.c: a GPU's streams, one per comm with ops on it. The stream
 * of key: its own while it has ops in flight or stays assigned; else a
 * free place, else the one idle longest (taken over). NULL when every
 * place runs ops of another comm: the op waits. (handle NULL: not made
 * yet.) retire: places idle for idle_ms or more give their handles back
 * (to destroy) and come free. Under the GPU threads' lock. */
#define CCSD_GPU_STREAMS 256
struct gpu_stream {
  uint64_t key;
  void *handle; /* cudaStream_t */
  int inflight;
  uint64_t idle_since_ms;
  int used;
  void *owner; /* the GPU it is of (gpu_cuda.c's) */
};
struct gpu_streams {
  struct gpu_stream s[CCSD_GPU_STREAMS];
};
struct gpu_stream *ccsd_gpu_stream_for(struct gpu_streams *t, uint64_t key);
int ccsd_gpu_streams_retire(struct gpu_streams *t, uint64_t now_ms, uint64_t idle_ms,
                            void **handles, int max);

/* gpu_queue.c: a GPU's ops waiting to be queued on it, under the GPU
 * threads' lock. A comm's ops keep their order: only its first in the
 * queue may go, and only when it gets the comm's stream; among the comms'
 * first ops, tenants go by weight (base/fair.c, charged the bytes their
 * kernels move, CCSD_GPU_QUANTUM ahead at most when they come back),
 * classes within a tenant by theirs. next: the op to go now, with its
 * stream claimed (*stream NULL: it was cancelled and goes back); NULL:
 * none may. remove: it leaves the queue, counted to its tenant. */
#define CCSD_GPU_QUANTUM (64.0 * 1048576)
void ccsd_gpu_queue_add(struct list *queue, struct fair *f, struct run_op *x);
struct run_op *ccsd_gpu_queue_next(struct list *queue, struct fair *f, struct gpu_streams *streams,
                                   struct gpu_stream **stream);
void ccsd_gpu_queue_remove(struct fair *f, struct run_op *x);

/* gpu_watch.c: what the watchdog does about an op on a GPU, each tick:
 * while it is cancelled (its comm failed, its client went), let its
 * stream go (RELEASE: its ranks' ready flags are written from the host);
 * still there STUCK_MS after the first release, say so once (STUCK: a
 * kernel that does not end, or a client that keeps rewriting its flags). */
#define CCSD_GPU_STUCK_MS 10000
enum { CCSD_GPU_WATCH_NOTHING, CCSD_GPU_WATCH_RELEASE, CCSD_GPU_WATCH_STUCK };
int ccsd_gpu_watch_step(struct gpu_watch *w, int cancelled, uint64_t now_ms);

/* Whether a CUDA error leaves the context unusable for every tenant: the
 * daemon logs it and exits for systemd to restart it. */
int ccsd_gpu_error_is_sticky(int cuda_error);

#endif
