/* The daemon's CUDA memory domain (gpu.h), built where the toolkit is.
 *
 * Per GPU: one stream and two threads. The submitter takes ops in the
 * order the loop matched them (one launch order per GPU, whatever the
 * tenant), makes the stream wait on the ranks' `ready` events, queues the
 * graph's kernels, records each rank's `done` event and a completion event
 * of its own, and tells the loop the op is queued. The completer waits for
 * completion events in order and tells the loop the op is over, which only
 * then lets go of the buffers. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "cuda_vmm.h"
#include "kernels_device.h"
#include "plan/pool.h"
#include "run/engine_run.h"
#include "run/gpu.h"
#include "wire.h"

struct device {
  struct gpu *g;
  int index;
  cudaStream_t stream;
  struct list queue;    /* xops to queue on the GPU (link) */
  struct list inflight; /* queued, their completion awaited (link) */
  pthread_cond_t cv;
  pthread_t submitter, completer;
  int threads;
  int busy; /* the submitter holds an op off both lists */
  struct engine_pool *pool;
  char name[96];
};

struct gpu {
  int ndevices;
  struct device dev[CCSD_GPU_MAX_DEVICES];
  uint64_t reach[CCSD_GPU_MAX_DEVICES];
  pthread_mutex_t mu;
  struct list to_loop; /* xops with news for the loop (done_link) */
  uv_async_t async;
  int stop;
};

int ccsd_gpu_error_is_sticky(int e) {
  switch ((cudaError_t)e) {
  case cudaErrorIllegalAddress: case cudaErrorLaunchFailure: case cudaErrorHardwareStackError:
  case cudaErrorIllegalInstruction: case cudaErrorMisalignedAddress:
  case cudaErrorInvalidAddressSpace: case cudaErrorInvalidPc: case cudaErrorLaunchTimeout:
  case cudaErrorECCUncorrectable: case cudaErrorAssert: case cudaErrorContextIsDestroyed:
  case cudaErrorNvlinkUncorrectable: case cudaErrorContained: case cudaErrorExternalDevice:
  case cudaErrorUnknown:
    return 1;
  default:
    return 0;
  }
}

/* A sticky error poisons the context of every tenant of this GPU: no op
 * can run any more; systemd restarts the daemon with a fresh one. _exit,
 * not exit: exit's handlers would tear the CUDA runtime down under the
 * other threads still inside it (and hang there); the log line is written
 * unbuffered before. */
static void check_sticky(const struct device *dv, cudaError_t e, const char *what) {
  if (!ccsd_gpu_error_is_sticky(e)) return;
  LOG_ERROR("GPU %d (%s): %s: %s (CUDA error %d) leaves the context unusable; exiting so the "
            "service manager restarts the daemon", dv->index, dv->name, what,
            cudaGetErrorString(e), (int)e);
  _exit(EXIT_FAILURE);
}

static void to_loop_locked(struct gpu *g, struct run_op *x, int flag) {
  if (!ccsd_gpu_progress_mark(&x->gpu_state, flag)) return; /* listed already */
  list_insert_tail(&g->to_loop, &x->done_link);
  uv_async_send(&g->async);
}

static cudaError_t run_task(const struct engine_plan *pl, size_t task, cudaStream_t stream) {
  const struct engine_item *nd = engine_task_item(pl, task);
  size_t first, n = engine_task_span(pl, task, &first);
  size_t off = first * pl->elem_size;
  const void *in[CCS_DEVICE_MAX_PTRS];
  void *out[CCS_DEVICE_MAX_PTRS];
  if (nd->kind != ENGINE_COMPUTE || nd->nin > CCS_DEVICE_MAX_PTRS ||
      nd->nout > CCS_DEVICE_MAX_PTRS)
    return cudaErrorInvalidValue; /* ruled out before: no network, few ranks */
  for (int i = 0; i < nd->nin; i++) in[i] = (const char *)nd->in[i] + off;
  for (int o = 0; o < nd->nout; o++) out[o] = (char *)nd->out[o] + off;
  if (nd->reduce)
    return (cudaError_t)ccs__reduce_device(pl->dtype, pl->redop, nd->divisor, in, nd->nin, out,
                                           nd->nout, n, stream);
  return (cudaError_t)ccs__copy_device(in[0], out, nd->nout, n * pl->elem_size, stream);
}

/* Records ev once everything queued so far on dv's stream is done, on the
 * stream of ev's own GPU (an event is recorded on its device). */
static cudaError_t record_done(struct device *dv, cudaEvent_t fin, struct gpu_events *ev) {
  if (ev->device == dv->index) return cudaEventRecord(ev->done, dv->stream);
  struct device *other = &dv->g->dev[ev->device];
  cudaError_t e = cudaSetDevice(other->index);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(other->stream, fin, 0);
  if (e == cudaSuccess) e = cudaEventRecord(ev->done, other->stream);
  cudaSetDevice(dv->index);
  return e;
}

/* Queues x on dv's stream; x->gpu_done is its completion event (NULL when
 * none could be made: nothing of x is queued then). */
static void queue_op(struct device *dv, struct run_op *x) {
  cudaError_t e = cudaSetDevice(dv->index);
  const char *what = "selecting the device";
  for (int i = 0; e == cudaSuccess && i < x->nevents; i++)
    if (x->events[i]) {
      what = "waiting for a rank's stream";
      e = cudaStreamWaitEvent(dv->stream, x->events[i]->ready, 0);
    }
  engine_start(&x->plan);
  while (e == cudaSuccess && engine_has_ready(&x->plan)) {
    size_t t = engine_claim(&x->plan);
    what = "launching a kernel";
    e = run_task(&x->plan, t, dv->stream);
    engine_finish(&x->plan, t);
  }
  cudaEvent_t fin = NULL;
  cudaError_t ef = cudaEventCreateWithFlags(&fin, cudaEventDisableTiming | cudaEventBlockingSync);
  if (ef == cudaSuccess) ef = cudaEventRecord(fin, dv->stream);
  for (int i = 0; e == cudaSuccess && ef == cudaSuccess && i < x->nevents; i++)
    if (x->events[i]) {
      what = "recording a rank's event";
      e = record_done(dv, fin, x->events[i]);
    }
  if (ef != cudaSuccess && e == cudaSuccess) e = ef, what = "recording the op's completion";
  check_sticky(dv, e, what);
  if (e != cudaSuccess)
    snprintf(x->gpu_error, sizeof(x->gpu_error), "GPU %d: %s: %s (CUDA error %d)", dv->index,
             what, cudaGetErrorString(e), (int)e);
  if (ef != cudaSuccess && fin) {
    cudaEventDestroy(fin);
    fin = NULL;
  }
  x->gpu_done = fin;
}

static void *submitter(void *arg) {
  struct device *dv = arg;
  struct gpu *g = dv->g;
  pthread_mutex_lock(&g->mu);
  for (;;) {
    if (list_empty(&dv->queue)) {
      if (g->stop) break;
      pthread_cond_wait(&dv->cv, &g->mu);
      continue;
    }
    struct run_op *x = LIST_ENTRY(dv->queue.next, struct run_op, link);
    list_remove(&x->link);
    dv->busy = 1;
    pthread_mutex_unlock(&g->mu);
    if (!atomic_load(&x->cancelled)) queue_op(dv, x);
    pthread_mutex_lock(&g->mu);
    dv->busy = 0;
    if (!x->gpu_error[0] && !atomic_load(&x->cancelled)) to_loop_locked(g, x, CCSD_GPU_ANNOUNCED);
    if (x->gpu_done) {
      list_insert_tail(&dv->inflight, &x->link);
      pthread_cond_broadcast(&dv->cv);
    } else {
      to_loop_locked(g, x, CCSD_GPU_COMPLETED);
    }
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

static void *completer(void *arg) {
  struct device *dv = arg;
  struct gpu *g = dv->g;
  cudaSetDevice(dv->index);
  pthread_mutex_lock(&g->mu);
  for (;;) {
    if (list_empty(&dv->inflight)) {
      if (g->stop && list_empty(&dv->queue) && !dv->busy) break;
      pthread_cond_wait(&dv->cv, &g->mu);
      continue;
    }
    struct run_op *x = LIST_ENTRY(dv->inflight.next, struct run_op, link);
    pthread_mutex_unlock(&g->mu);
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)x->gpu_done);
    check_sticky(dv, e, "running an op");
    if (e != cudaSuccess && !x->gpu_error[0])
      snprintf(x->gpu_error, sizeof(x->gpu_error), "GPU %d: running the op: %s (CUDA error %d)",
               dv->index, cudaGetErrorString(e), (int)e);
    cudaEventDestroy((cudaEvent_t)x->gpu_done);
    x->gpu_done = NULL;
    pthread_mutex_lock(&g->mu);
    list_remove(&x->link);
    to_loop_locked(g, x, CCSD_GPU_COMPLETED);
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

static void drain(struct gpu *g) {
  for (;;) {
    pthread_mutex_lock(&g->mu);
    if (list_empty(&g->to_loop)) {
      pthread_mutex_unlock(&g->mu);
      return;
    }
    struct run_op *x = LIST_ENTRY(g->to_loop.next, struct run_op, done_link);
    list_remove(&x->done_link);
    int act = ccsd_gpu_progress_take(&x->gpu_state);
    pthread_mutex_unlock(&g->mu);
    /* the reply to ranks whose streams wait on `done`, then the rest */
    if (act & CCSD_GPU_DO_ANNOUNCE) x->on_enqueued(x);
    if (act & CCSD_GPU_DO_FINISH) x->on_done(x);
  }
}

static void on_async(uv_async_t *h) { drain(h->data); }

static void *device_alloc(size_t bytes, void *ctx) {
  struct device *dv = ctx;
  void *p = NULL;
  if (cudaSetDevice(dv->index) != cudaSuccess || cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess)
    return NULL;
  return p;
}

static void device_release(void *mem, void *ctx) {
  struct device *dv = ctx;
  cudaSetDevice(dv->index);
  cudaFree(mem);
}

struct engine_pool *ccsd_gpu_pool(struct gpu *g, int device) { return g->dev[device].pool; }
const uint64_t *ccsd_gpu_reach(const struct gpu *g) { return g->reach; }

/* Every pair of GPUs that can reach each other may read each other's
 * memory in a kernel: a legacy IPC buffer of GPU j read on GPU i needs it
 * (VMM mappings carry their own access). */
static void enable_peer_access(struct gpu *g) {
  for (int i = 0; i < g->ndevices; i++)
    for (int j = 0; j < g->ndevices; j++) {
      if (i == j || !(g->reach[i] >> j & 1) || cudaSetDevice(i) != cudaSuccess) continue;
      cudaError_t e = cudaDeviceEnablePeerAccess(j, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
      else if (e != cudaSuccess) {
        cudaGetLastError();
        g->reach[i] &= ~((uint64_t)1 << j); /* not reachable after all: ops there are refused */
        LOG_WARN("GPU %d cannot enable access to GPU %d: %s", i, j, cudaGetErrorString(e));
      }
    }
}

struct gpu *ccsd_gpu_start(uv_loop_t *loop, char *why, size_t len) {
  /* every kernel loaded at start (CUDA 13 loads lazily by default: a
   * kernel's first launch would load its module and may synchronise the
   * device behind clients' work); an operator's own setting stands */
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  if (ccs__cuda_usable(why, len)) return NULL;
  int n = 0;
  cudaGetDeviceCount(&n);
  if (n > CCSD_GPU_MAX_DEVICES) n = CCSD_GPU_MAX_DEVICES;
  struct gpu *g = calloc(1, sizeof(*g));
  if (!g) {
    snprintf(why, len, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&g->mu, NULL);
  list_init(&g->to_loop);
  uv_async_init(loop, &g->async, on_async);
  g->async.data = g;
  for (int i = 0; i < n; i++) {
    struct device *dv = &g->dev[i];
    struct cudaDeviceProp p;
    dv->g = g;
    dv->index = i;
    list_init(&dv->queue);
    list_init(&dv->inflight);
    pthread_cond_init(&dv->cv, NULL);
    cudaError_t e = cudaSetDevice(i);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&p, i);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&dv->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      snprintf(why, len, "GPU %d: %s", i, cudaGetErrorString(e));
      g->ndevices = i + 1;
      ccsd_gpu_stop(g);
      return NULL;
    }
    snprintf(dv->name, sizeof(dv->name), "%s", p.name);
    for (int j = 0; j < n; j++) {
      int can = 0;
      if (j == i || (cudaDeviceCanAccessPeer(&can, i, j) == cudaSuccess && can))
        g->reach[i] |= (uint64_t)1 << j;
    }
    dv->pool = engine_pool_new_with((size_t)256 << 20, device_alloc, device_release, dv);
    g->ndevices = i + 1;
    if (!dv->pool || pthread_create(&dv->submitter, NULL, submitter, dv)) break;
    dv->threads = 1;
    if (pthread_create(&dv->completer, NULL, completer, dv)) break;
    dv->threads = 2;
  }
  if (g->ndevices < n || g->dev[n - 1].threads < 2) {
    snprintf(why, len, "cannot start the GPU threads");
    ccsd_gpu_stop(g);
    return NULL;
  }
  enable_peer_access(g);
  return g;
}

static void on_closed(uv_handle_t *h) {
  struct gpu *g = h->data;
  pthread_mutex_destroy(&g->mu);
  free(g);
}

void ccsd_gpu_stop(struct gpu *g) {
  if (!g) return;
  pthread_mutex_lock(&g->mu);
  g->stop = 1;
  for (int i = 0; i < g->ndevices; i++) pthread_cond_broadcast(&g->dev[i].cv);
  pthread_mutex_unlock(&g->mu);
  for (int i = 0; i < g->ndevices; i++) {
    struct device *dv = &g->dev[i];
    if (dv->threads > 0) pthread_join(dv->submitter, NULL);
    if (dv->threads > 1) pthread_join(dv->completer, NULL);
  }
  drain(g); /* every op is over: the loop finishes them */
  for (int i = 0; i < g->ndevices; i++) {
    struct device *dv = &g->dev[i];
    engine_pool_free(dv->pool);
    if (dv->stream) cudaStreamDestroy(dv->stream);
    pthread_cond_destroy(&dv->cv);
  }
  uv_close((uv_handle_t *)&g->async, on_closed);
}

void ccsd_gpu_describe(const struct gpu *g, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "%d GPU%s:", g->ndevices, g->ndevices == 1 ? "" : "s");
  for (int i = 0; i < g->ndevices && at < len; i++)
    at += (size_t)snprintf(buf + at, len - at, "%s %s (%d)", i ? "," : "", g->dev[i].name, i);
}

void ccsd_gpu_submit(struct gpu *g, struct run_op *x) {
  struct device *dv = &g->dev[x->device];
  pthread_mutex_lock(&g->mu);
  list_insert_tail(&dv->queue, &x->link);
  pthread_cond_broadcast(&dv->cv);
  pthread_mutex_unlock(&g->mu);
}

static int device_of(struct gpu *g, const uint8_t *uuid, char *err, size_t errlen) {
  int dev = ccs__cuda_device_of_uuid(uuid);
  if (dev < 0 || dev >= g->ndevices)
    snprintf(err, errlen, "no GPU of this daemon has the UUID the client named");
  return dev < g->ndevices ? dev : -1;
}

ccs_result_t ccsd_gpu_map(struct gpu *g, int fd, uint64_t size, const uint8_t *uuid,
                          void **ret_base, int *ret_device, char *err, size_t errlen) {
  int want = device_of(g, uuid, err, errlen), dev = -1, all[CCSD_GPU_MAX_DEVICES];
  if (want < 0) {
    close(fd);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  for (int i = 0; i < g->ndevices; i++) all[i] = i;
  void *base = NULL;
  int rc = ccs__vmm_import(fd, (size_t)size, all, g->ndevices, &base, &dev, err, errlen);
  close(fd);
  if (rc) return CCS_ERR_INVALID_ARGUMENT;
  if (dev != want) {
    ccs__vmm_unmap(base, (size_t)size);
    snprintf(err, errlen, "the allocation lives on GPU %d, not on the GPU the client named (%d)",
             dev, want);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  *ret_base = base;
  *ret_device = dev;
  return CCS_OK;
}

void ccsd_gpu_unmap(void *base, size_t size) { ccs__vmm_unmap(base, size); }

ccs_result_t ccsd_gpu_open_ipc(struct gpu *g, const uint8_t *handle, const uint8_t *uuid,
                               void **ret_ptr, void **ret_block, size_t *ret_block_size,
                               int *ret_device, char *err, size_t errlen) {
  int dev = device_of(g, uuid, err, errlen);
  if (dev < 0) return CCS_ERR_INVALID_ARGUMENT;
  if (ccs__cuda_ipc_open(handle, dev, ret_ptr, ret_block, ret_block_size, err, errlen))
    return CCS_ERR_INVALID_ARGUMENT;
  *ret_device = dev;
  return CCS_OK;
}

void ccsd_gpu_close_ipc(void *base) { ccs__cuda_ipc_close(base); }

ccs_result_t ccsd_gpu_events_open(struct gpu *g, const uint8_t *uuid, const uint8_t *ready,
                                  const uint8_t *done, struct gpu_events **ret, char *err,
                                  size_t errlen) {
  _Static_assert(sizeof(cudaIpcEventHandle_t) == CCS__IPC_EVENT_BYTES, "event handle size");
  _Static_assert(sizeof(cudaIpcMemHandle_t) == CCS__IPC_MEM_BYTES, "memory handle size");
  int dev = device_of(g, uuid, err, errlen);
  if (dev < 0) return CCS_ERR_INVALID_ARGUMENT;
  struct gpu_events *ev = calloc(1, sizeof(*ev));
  if (!ev) {
    snprintf(err, errlen, "out of memory");
    return CCS_ERR_NO_MEMORY;
  }
  cudaIpcEventHandle_t hr, hd;
  memcpy(&hr, ready, sizeof(hr));
  memcpy(&hd, done, sizeof(hd));
  cudaEvent_t r = NULL, dn = NULL;
  cudaError_t e = cudaSetDevice(dev);
  if (e == cudaSuccess) e = cudaIpcOpenEventHandle(&r, hr);
  if (e == cudaSuccess) e = cudaIpcOpenEventHandle(&dn, hd);
  if (e != cudaSuccess) {
    if (r) cudaEventDestroy(r);
    snprintf(err, errlen, "cannot open the client's events: %s", cudaGetErrorString(e));
    free(ev);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  ev->device = dev;
  ev->refs = 1;
  ev->ready = r;
  ev->done = dn;
  *ret = ev;
  return CCS_OK;
}

void ccsd_gpu_events_unref(struct gpu_events *ev) {
  if (!ev || --ev->refs > 0) return;
  cudaEventDestroy((cudaEvent_t)ev->ready);
  cudaEventDestroy((cudaEvent_t)ev->done);
  free(ev);
}
