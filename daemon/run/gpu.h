/* The daemon's CUDA memory domain (docs/gpus.md).
 *
 * Clients' device buffers are VMM allocations whose fds the daemon maps
 * once, readable and writable by every GPU with peer access to them. Ops
 * whose buffers are on GPUs run as the engine's graph of device kernels on
 * one stream per GPU, queued by one worker thread per GPU: one launch
 * order per GPU across all tenants. A client's stream order is kept with a
 * pair of interprocess events (wait on `ready`, record `done`), so no host
 * thread waits for a GPU on the client's behalf.
 *
 * Without the toolkit at build time, a driver or a GPU at run time, the
 * daemon runs host-only: ccsd_gpu_start says why and every device request
 * gets CCS_ERR_UNSUPPORTED with that reason. */
#ifndef CCSD_RUN_GPU_H
#define CCSD_RUN_GPU_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "base/list.h"
#include "ccs.h"
#include "run/op.h"

struct engine_pool;

#define CCSD_GPU_MAX_DEVICES 64

struct gpu;

/* The GPUs of this daemon, or NULL with the reason it runs host-only. */
struct gpu *ccsd_gpu_start(uv_loop_t *loop, char *why, size_t len);
void ccsd_gpu_stop(struct gpu *g);
/* "2 GPUs: NVIDIA H200 (0), NVIDIA H200 (1)" */
void ccsd_gpu_describe(const struct gpu *g, char *buf, size_t len);

/* Maps a client's exported allocation (fd, always closed here) of `size`
 * bytes on the GPU with that UUID. The fields were checked
 * (ccsd_gpu_check_register, ccsd_gpu_check_events) before these calls. */
ccs_result_t ccsd_gpu_map(struct gpu *g, int fd, uint64_t size, const uint8_t *uuid,
                          void **ret_base, int *ret_device, char *err, size_t errlen);
void ccsd_gpu_unmap(void *base, size_t size);
/* A legacy cudaIpcMemHandle (only where cuda_legacy_ipc is on): the
 * opened pointer and the driver block it lies in (ccs__cuda_ipc_open). */
ccs_result_t ccsd_gpu_open_ipc(struct gpu *g, const uint8_t *handle, const uint8_t *uuid,
                               void **ret_ptr, void **ret_block, size_t *ret_block_size,
                               int *ret_device, char *err, size_t errlen);
void ccsd_gpu_close_ipc(void *base);

/* A client's pair of interprocess events (EventRegister). */
struct gpu_events {
  struct list link; /* in session->events while registered */
  uint64_t id;
  int device;
  int refs; /* the registration, posts */
  void *ready, *done;
};
ccs_result_t ccsd_gpu_events_open(struct gpu *g, const uint8_t *uuid, const uint8_t *ready,
                                  const uint8_t *done, struct gpu_events **ret, char *err,
                                  size_t errlen);
void ccsd_gpu_events_unref(struct gpu_events *ev);

/* reach[a] bit b: GPU a can access GPU b's memory. */
const uint64_t *ccsd_gpu_reach(const struct gpu *g);

/* Scratch of device `device`, kept between ops. */
struct engine_pool *ccsd_gpu_pool(struct gpu *g, int device);

/* Queues x, compiled over device buffers, on GPU x->device. From the loop
 * thread; the loop later gets x->on_enqueued (the ranks that gave events
 * may go on) and x->on_done (the GPU finished). */
void ccsd_gpu_submit(struct gpu *g, struct run_op *x);

/* The fields of a device registration (MemRegister of domain
 * CCS__MEM_CUDA or _CUDA_IPC) and of EventRegister, before anything is
 * asked of the driver. */
ccs_result_t ccsd_gpu_check_register(uint32_t domain, uint64_t size, size_t uuid_len,
                                     size_t handle_len, char *err, size_t errlen);
ccs_result_t ccsd_gpu_check_events(size_t uuid_len, size_t ready_len, size_t done_len, char *err,
                                   size_t errlen);

/* gpu_progress.c: what the GPU threads owe the loop about an op (its
 * gpu_state, under their lock). mark: the op is queued (ANNOUNCED) or done
 * (COMPLETED); 1 when it must be put on the loop's list now. take: the loop
 * took it off the list; what to do now (DO_ANNOUNCE before DO_FINISH). */
enum {
  CCSD_GPU_LISTED = 1,
  CCSD_GPU_ANNOUNCED = 2,
  CCSD_GPU_COMPLETED = 4,
  CCSD_GPU_ANNOUNCE_DONE = 8,
};
enum { CCSD_GPU_DO_ANNOUNCE = 1, CCSD_GPU_DO_FINISH = 2 };
int ccsd_gpu_progress_mark(int *state, int flag);
int ccsd_gpu_progress_take(int *state);

/* Whether a CUDA error leaves the context unusable for every tenant: the
 * daemon logs it and exits for systemd to restart it. */
int ccsd_gpu_error_is_sticky(int cuda_error);

#endif
