/* The daemon's CUDA memory domain (gpu.h), built where the toolkit is.
 *
 * Per GPU a submitter thread takes ops in the order the loop matched them
 * and queues each on its comm's stream (gpu_streams.c): waits for its
 * ranks' stream flags, the graph's kernels, the writes of their `done`
 * flags, and a write of the op's number into the device's page of
 * completions; a finisher thread per GPU watches that page while ops are
 * on the GPU and hands each back to the loop once the GPU is through with
 * it (only then may the buffers go). One watchdog
 * thread for all GPUs looks at the ops queued every WATCH_MS: it lets the
 * streams of cancelled ops go (gpu_watch.c), notices errors on the
 * streams, gives idle streams back, and does what must not block the
 * loop: freeing device scratch, unregistering clients' pages of flags. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "cuda_vmm.h"
#include "kernels_device.h"
#include "plan/pool.h"
#include "run/engine_run.h"
#include "run/gpu.h"
#include "wire.h"

#define WATCH_MS 50
#define STREAM_IDLE_MS 10000 /* a comm's stream idle this long is destroyed */
#define FINISH_SPIN_US 200    /* the finisher yields this long after an op ended, */
#define FINISH_NAP_MAX_US 250 /* then naps, longer each time, up to this */
#define DRAINED_MAX 16        /* ops whose stream must drain, looked at per pass */

struct device {
  struct gpu *g;
  int index;
  struct gpu_streams streams;
  struct list queue;  /* ops to queue on the GPU (link), in arrival order */
  struct fair fair;   /* whose op goes next: tenants by weight, bytes moved */
  struct list queued; /* on the GPU, not yet back (gpu_link) */
  pthread_cond_t cv;
  pthread_t submitter;
  int started;
  struct engine_pool *pool;
  char name[96];
  /* completions: per stream slot, the number of the last op through it,
   * written by the GPU (pinned, mapped); watched by the finisher */
  _Atomic uint32_t *done;
  _Atomic uint32_t numbered; /* ops numbered so far: the finisher looks again */
  _Atomic int finishing;
  pthread_t finisher;
  pthread_cond_t finish_cv;
  int finisher_started;
};

/* Device memory the pool let go, freed on the reaper thread: cudaFree waits for
 * the device, which may be busy with other tenants' work. */
struct dead_mem {
  struct dead_mem *next;
  int device;
  void *mem;
};

struct gpu {
  int ndevices;
  struct device dev[CCSD_GPU_MAX_DEVICES];
  uint64_t reach[CCSD_GPU_MAX_DEVICES];
  pthread_mutex_t mu;
  pthread_cond_t watch_cv, reap_cv;
  pthread_t watchdog;
  int watching, reaping;
  pthread_t reaper;
  int closed; /* the loop's handle is closing: nothing more is sent to it */
  int stuck;  /* ops still on a GPU at the end: g and the pools are kept */
  int handle_closed, released; /* both: g is freed (destroy) */
  struct list to_loop;     /* ops back from the GPU (done_link) */
  struct list dead_flags;  /* pages of flags to unregister and unmap (gpu_flags.link) */
  struct dead_mem *dead_mem;
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

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static uint64_t now_ms(void) { return now_us() / 1000; }

/* Under g->mu: x is back from its GPU (or never went): to the loop. */
static void back_to_loop_locked(struct gpu *g, struct run_op *x) {
  if (x->gpu_stream) {
    struct device *dv = x->gpu_stream->owner;
    list_remove(&x->gpu_link);
    if (--x->gpu_stream->inflight == 0) { /* an op waiting for a stream may take it */
      x->gpu_stream->idle_since_ms = now_ms();
      pthread_cond_broadcast(&dv->cv);
    }
    x->gpu_stream = NULL;
  }
  list_insert_tail(&g->to_loop, &x->done_link);
  if (!g->closed) uv_async_send(&g->async);
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

/* A comm's stream on a GPU (gpu_stream.handle), and the number of its
 * last op. The GPU says how far it got in the stream's slot of the
 * device's page of completions (slot_of): an op is numbered as it is
 * queued, and the stream writes the number after it. A
 * host function per op would hand it back as well, but the driver wakes a
 * thread for each (tens of µs in a VM) and holds the stream meanwhile. */
struct lane {
  cudaStream_t work;
  uint32_t queued; /* the number of the last op queued (the submitter's) */
};

static cudaError_t lane_make(struct device *dv, int slot, struct lane **ret) {
  struct lane *l = calloc(1, sizeof(*l));
  if (!l) return cudaErrorMemoryAllocation;
  cudaError_t e = cudaStreamCreateWithFlags(&l->work, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    free(l);
    return e;
  }
  l->queued = atomic_load(&dv->done[slot]); /* an idle slot's last number */
  *ret = l;
  return cudaSuccess;
}

/* (destroying does not wait for the device) */
static void lane_free(struct lane *l) {
  cudaStreamDestroy(l->work);
  free(l);
}

/* The slot of the device's page of completions that stream s writes. */
static int slot_of(const struct device *dv, const struct gpu_stream *s) {
  return (int)(s - dv->streams.s);
}

/* Whether the GPU wrote number `at`, or a later one, into slot. */
static int reached(const struct device *dv, int slot, uint32_t at) {
  return (int32_t)(atomic_load(&dv->done[slot]) - at) >= 0;
}

/* What the finisher waits for, from its last look under the lock: per
 * stream slot with ops on the GPU, the number of its oldest op not
 * through yet. */
struct finish_watch {
  int n, slot[CCSD_GPU_STREAMS];
  uint32_t at[CCSD_GPU_STREAMS];
  uint32_t numbered; /* dv->numbered then */
  uint32_t look, seen[CCSD_GPU_STREAMS]; /* which look noted a slot last */
};

/* Under g->mu: hands back the ops the GPU is through with, and notes in w
 * what the others wait for. Returns how many went back. */
static int finish_look(struct device *dv, struct finish_watch *w) {
  int ended = 0;
  w->look++;
  w->n = 0;
  w->numbered = atomic_load(&dv->numbered);
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &dv->queued) {
    struct run_op *x = LIST_ENTRY(it, struct run_op, gpu_link);
    if (!x->gpu_done_at) continue; /* being queued, or left to the watchdog */
    int slot = slot_of(dv, x->gpu_stream);
    if (reached(dv, slot, x->gpu_done_at)) {
      back_to_loop_locked(dv->g, x);
      ended++;
      continue;
    }
    if (w->seen[slot] == w->look) continue; /* (a stream's ops end in order) */
    w->seen[slot] = w->look;
    w->slot[w->n] = slot;
    w->at[w->n++] = x->gpu_done_at;
  }
  return ended;
}

/* Not under the lock: whether anything moved since w was noted. */
static int finish_moved(struct device *dv, const struct finish_watch *w) {
  if (atomic_load(&dv->numbered) != w->numbered || !atomic_load(&dv->finishing)) return 1;
  for (int i = 0; i < w->n; i++)
    if (reached(dv, w->slot[i], w->at[i])) return 1;
  return 0;
}

/* Per GPU: hands back each op the GPU is through with. It watches the
 * page without the lock and takes it only when something moved: at once
 * (yielding) for FINISH_SPIN_US after an op ended (a stream's small ops
 * follow each other closely), then napping, longer each time; with no op
 * on the GPU it sleeps until one is queued. */
static void *finisher(void *arg) {
  struct device *dv = arg;
  struct gpu *g = dv->g;
  struct finish_watch w = {0}; /* (3 KiB, on this thread's stack) */
  uint64_t last = now_us();
  useconds_t nap = 0;
  pthread_mutex_lock(&g->mu);
  while (atomic_load(&dv->finishing)) {
    if (finish_look(dv, &w)) last = now_us(), nap = 0;
    if (!w.n) {
      pthread_cond_wait(&dv->finish_cv, &g->mu);
      last = now_us();
      nap = 0;
      continue;
    }
    pthread_mutex_unlock(&g->mu);
    while (!finish_moved(dv, &w)) {
      if (now_us() - last < FINISH_SPIN_US) {
        sched_yield();
      } else {
        nap = nap ? (nap * 2 < FINISH_NAP_MAX_US ? nap * 2 : FINISH_NAP_MAX_US) : 20;
        usleep(nap);
      }
    }
    pthread_mutex_lock(&g->mu);
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

/* The last reference to a registered page of flags: to the watchdog. */
static void retire_flags(struct gpu_flags *f) {
  struct gpu *g = f->g;
  pthread_mutex_lock(&g->mu);
  list_insert_tail(&g->dead_flags, &f->link);
  pthread_cond_signal(&g->reap_cv);
  pthread_mutex_unlock(&g->mu);
}

int ccsd_gpu_flags_register(struct gpu *g, struct gpu_flags *f, char *why, size_t len) {
  if (ccs__cuda_host_register(f->page, 4096, why, len)) return -1;
  f->registered = 1;
  f->g = g;
  f->retire = retire_flags;
  return 0;
}

/* Queues x on its comm's stream: its ranks' streams first, its kernels,
 * their flags, and its number into the page of completions. Once anything
 * of x is on the stream, x comes back only when the stream is through
 * with it: a failure part way cancels x (its flags are let go, so what
 * was queued runs on) and still queues the number, or, where even that
 * fails, leaves x to the watchdog, which waits for the stream to drain
 * (x->gpu_drain). Returns 0 when nothing was queued (x goes back now). */
static int queue_op(struct device *dv, struct run_op *x, struct lane *ln) {
  cudaStream_t st = ln->work;
  int slot = slot_of(dv, x->gpu_stream);
  uint32_t number = ln->queued + 1 ? ln->queued + 1 : 1; /* 0: x not numbered yet */
  char err[200] = "";
  const char *what = "selecting the device";
  cudaError_t e = cudaSetDevice(dv->index);
  int ok = e == cudaSuccess, queued = 0;
  for (int i = 0; ok && i < x->norders; i++) {
    const struct gpu_order *o = &x->orders[i];
    if (!o->flags) continue;
    ok = !ccs__cuda_stream_wait32(st, &o->flags->ready[o->slot], o->gen, err, sizeof(err));
    queued |= ok;
  }
  engine_start(&x->plan);
  while (ok && engine_has_ready(&x->plan)) {
    size_t t = engine_claim(&x->plan);
    what = "launching a kernel";
    e = run_task(&x->plan, t, st);
    engine_finish(&x->plan, t);
    ok = e == cudaSuccess;
    queued = 1; /* a failed launch may have queued part of the task */
  }
  for (int i = 0; ok && i < x->norders; i++) {
    const struct gpu_order *o = &x->orders[i];
    if (o->flags) ok = !ccs__cuda_stream_write32(st, &o->flags->done[o->slot], o->gen, err, sizeof(err));
  }
  if (!ok) {
    if (e != cudaSuccess) {
      check_sticky(dv, e, what);
      snprintf(err, sizeof(err), "%s: %s (CUDA error %d)", what, cudaGetErrorString(e), (int)e);
    }
    snprintf(x->gpu_error, sizeof(x->gpu_error), "GPU %d: %s", dv->index, err);
    if (!queued) return 0;
    atomic_store(&x->cancelled, 1); /* its streams let go: what is queued runs on */
    for (int i = 0; i < x->norders; i++) ccsd_gpu_order_unblock(&x->orders[i]);
  }
  if (!ccs__cuda_stream_write32(st, &dv->done[slot], number, err, sizeof(err))) {
    ln->queued = number;
    pthread_mutex_lock(&dv->g->mu);
    x->gpu_done_at = number; /* the finisher may look from now on */
    atomic_fetch_add(&dv->numbered, 1);
    pthread_cond_signal(&dv->finish_cv);
    pthread_mutex_unlock(&dv->g->mu);
  } else {
    if (!x->gpu_error[0])
      snprintf(x->gpu_error, sizeof(x->gpu_error), "GPU %d: queuing the op's end: %s", dv->index,
               err);
    atomic_store(&x->cancelled, 1);
    for (int i = 0; i < x->norders; i++) ccsd_gpu_order_unblock(&x->orders[i]);
    pthread_mutex_lock(&dv->g->mu);
    x->gpu_drain = 1;
    pthread_mutex_unlock(&dv->g->mu);
  }
  return 1;
}

static void *submitter(void *arg) {
  struct device *dv = arg;
  struct gpu *g = dv->g;
  pthread_mutex_lock(&g->mu);
  for (;;) {
    struct gpu_stream *s = NULL;
    struct run_op *x = ccsd_gpu_queue_next(&dv->queue, &dv->fair, &dv->streams, &s);
    if (!x) { /* nothing, or every stream runs other comms' ops: a freed one wakes this */
      if (g->stop && list_empty(&dv->queue)) break;
      pthread_cond_wait(&dv->cv, &g->mu);
      continue;
    }
    ccsd_gpu_queue_remove(&dv->fair, x);
    if (!s) {
      back_to_loop_locked(g, x);
      continue;
    }
    s->inflight++;
    x->gpu_stream = s;
    x->gpu_done_at = 0;
    list_insert_tail(&dv->queued, &x->gpu_link);
    struct lane *ln = s->handle;
    pthread_mutex_unlock(&g->mu);
    cudaError_t e = cudaSuccess;
    if (!ln && (e = cudaSetDevice(dv->index)) == cudaSuccess) e = lane_make(dv, slot_of(dv, s), &ln);
    int queued = 0;
    if (e == cudaSuccess) {
      pthread_mutex_lock(&g->mu);
      s->handle = ln; /* only this thread makes streams of this device */
      pthread_mutex_unlock(&g->mu);
      queued = queue_op(dv, x, ln);
    } else {
      check_sticky(dv, e, "making a stream");
      snprintf(x->gpu_error, sizeof(x->gpu_error), "GPU %d: making a stream: %s", dv->index,
               cudaGetErrorString(e));
    }
    pthread_mutex_lock(&g->mu);
    if (!queued) back_to_loop_locked(g, x);
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

/* Under g->mu: what every GPU's ops on their streams need, once a tick. */
static void watch_queued(struct gpu *g, uint64_t now) {
  for (int d = 0; d < g->ndevices; d++) {
    struct device *dv = &g->dev[d];
    struct list *it, *tmp;
    LIST_FOREACH_SAFE(it, tmp, &dv->queued) {
      struct run_op *x = LIST_ENTRY(it, struct run_op, gpu_link);
      switch (ccsd_gpu_watch_step(&x->gpu_watch, atomic_load(&x->cancelled), now)) {
      case CCSD_GPU_WATCH_RELEASE:
        for (int i = 0; i < x->norders; i++) ccsd_gpu_order_unblock(&x->orders[i]);
        break;
      case CCSD_GPU_WATCH_STUCK:
        LOG_WARN("GPU %d (%s): an op of a failed comm is still on the GPU %d s after its stream "
                 "was let go", dv->index, dv->name, CCSD_GPU_STUCK_MS / 1000);
        break;
      default:
        break;
      }
    }
  }
}

/* Not under g->mu: errors on the streams that have ops (a failed kernel
 * leaves its stream unable to run anything more). */
static void watch_streams(struct gpu *g) {
  for (int d = 0; d < g->ndevices; d++) {
    struct device *dv = &g->dev[d];
    if (cudaSetDevice(dv->index) != cudaSuccess) continue;
    for (int i = 0; i < CCSD_GPU_STREAMS; i++) {
      pthread_mutex_lock(&g->mu);
      struct lane *ln = dv->streams.s[i].inflight ? dv->streams.s[i].handle : NULL;
      pthread_mutex_unlock(&g->mu);
      if (!ln) continue;
      cudaError_t e = cudaStreamQuery(ln->work);
      if (e != cudaSuccess && e != cudaErrorNotReady) check_sticky(dv, e, "running an op");
    }
  }
}

/* Not under g->mu: ops whose number could not be queued (x->gpu_drain) go
 * back once their stream drained. Only this takes them off the list (the
 * finisher looks at numbered ops alone), on the watchdog and, once it is
 * gone, in finish_all: those noted stay while their streams are asked. */
static void hand_back_drained(struct gpu *g) {
  for (int d = 0; d < g->ndevices; d++) {
    struct device *dv = &g->dev[d];
    struct run_op *ops[DRAINED_MAX];
    cudaStream_t streams[DRAINED_MAX];
    int n = 0, drained[DRAINED_MAX];
    pthread_mutex_lock(&g->mu);
    struct list *it, *tmp;
    LIST_FOREACH_SAFE(it, tmp, &dv->queued) {
      struct run_op *x = LIST_ENTRY(it, struct run_op, gpu_link);
      if (!x->gpu_drain || n == DRAINED_MAX) continue;
      ops[n] = x;
      streams[n++] = ((struct lane *)x->gpu_stream->handle)->work;
    }
    pthread_mutex_unlock(&g->mu);
    if (!n || cudaSetDevice(dv->index) != cudaSuccess) continue;
    for (int i = 0; i < n; i++) drained[i] = cudaStreamQuery(streams[i]) != cudaErrorNotReady;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < n; i++)
      if (drained[i]) back_to_loop_locked(g, ops[i]);
    pthread_mutex_unlock(&g->mu);
  }
}

/* Not under g->mu: streams idle long enough go (destroying one does not
 * wait for the device). */
static void retire_streams(struct gpu *g, uint64_t now) {
  void *idle[CCSD_GPU_MAX_DEVICES][16];
  int nidle[CCSD_GPU_MAX_DEVICES];
  pthread_mutex_lock(&g->mu);
  for (int d = 0; d < g->ndevices; d++)
    nidle[d] = ccsd_gpu_streams_retire(&g->dev[d].streams, now, STREAM_IDLE_MS, idle[d], 16);
  pthread_mutex_unlock(&g->mu);
  for (int d = 0; d < g->ndevices; d++)
    for (int i = 0; i < nidle[d]; i++) {
      cudaSetDevice(d);
      lane_free(idle[d][i]);
    }
  pthread_mutex_lock(&g->mu);
  for (int d = 0; d < g->ndevices; d++) /* a freed place: an op waiting for one may go */
    if (nidle[d]) pthread_cond_broadcast(&g->dev[d].cv);
  pthread_mutex_unlock(&g->mu);
}

/* What the loop let go and that may wait for the whole device (cudaFree,
 * unregistering host memory): the device goes idle only once every stream
 * gets past its waits, which the watchdog may have to release, so these
 * never run on the watchdog. Not under g->mu. */
static void reap(struct gpu *g) {
  pthread_mutex_lock(&g->mu);
  struct dead_mem *mem = g->dead_mem;
  g->dead_mem = NULL;
  struct list flags;
  list_init(&flags);
  list_take_all(&flags, &g->dead_flags);
  pthread_mutex_unlock(&g->mu);
  for (struct dead_mem *m = mem, *next; m; m = next) {
    next = m->next;
    cudaSetDevice(m->device);
    cudaFree(m->mem);
    free(m);
  }
  while (!list_empty(&flags)) {
    struct gpu_flags *f = LIST_ENTRY(flags.next, struct gpu_flags, link);
    list_remove(&f->link);
    ccs__cuda_host_unregister(f->page);
    munmap(f->map, f->len);
    free(f);
  }
}

static void *reaper(void *arg) {
  struct gpu *g = arg;
  pthread_mutex_lock(&g->mu);
  for (;;) {
    if (!g->dead_mem && list_empty(&g->dead_flags)) {
      if (g->closed) break;
      pthread_cond_wait(&g->reap_cv, &g->mu);
      continue;
    }
    pthread_mutex_unlock(&g->mu);
    reap(g);
    pthread_mutex_lock(&g->mu);
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

static void *watchdog(void *arg) {
  struct gpu *g = arg;
  pthread_mutex_lock(&g->mu);
  while (!g->stop) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += WATCH_MS * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&g->watch_cv, &g->mu, &until);
    uint64_t now = now_ms();
    watch_queued(g, now);
    pthread_mutex_unlock(&g->mu);
    watch_streams(g);
    hand_back_drained(g);
    retire_streams(g, now);
    pthread_mutex_lock(&g->mu);
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
    pthread_mutex_unlock(&g->mu);
    x->on_done(x);
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
  struct dead_mem *m = malloc(sizeof(*m));
  if (!m) { /* no room to defer it: freed here, waiting for the device */
    cudaSetDevice(dv->index);
    cudaFree(mem);
    return;
  }
  *m = (struct dead_mem){NULL, dv->index, mem};
  pthread_mutex_lock(&dv->g->mu);
  m->next = dv->g->dead_mem;
  dv->g->dead_mem = m;
  pthread_cond_signal(&dv->g->reap_cv);
  pthread_mutex_unlock(&dv->g->mu);
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

void ccsd_gpu_environment(void) { setenv("CUDA_MODULE_LOADING", "EAGER", 0); }

static struct gpu *abandon(struct gpu *g);

struct gpu *ccsd_gpu_start(uv_loop_t *loop, char *why, size_t len) {
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
  pthread_cond_init(&g->watch_cv, NULL);
  pthread_cond_init(&g->reap_cv, NULL);
  list_init(&g->to_loop);
  list_init(&g->dead_flags);
  uv_async_init(loop, &g->async, on_async);
  g->async.data = g;
  for (int i = 0; i < n; i++) {
    struct device *dv = &g->dev[i];
    struct cudaDeviceProp p;
    dv->g = g;
    dv->index = i;
    list_init(&dv->queue);
    fair_init(&dv->fair, CCSD_GPU_QUANTUM, 0);
    list_init(&dv->queued);
    pthread_cond_init(&dv->cv, NULL);
    pthread_cond_init(&dv->finish_cv, NULL);
    for (int k = 0; k < CCSD_GPU_STREAMS; k++) dv->streams.s[k].owner = dv;
    g->ndevices = i + 1;
    cudaError_t e = cudaSetDevice(i);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&p, i);
    if (e != cudaSuccess) {
      snprintf(why, len, "GPU %d: %s", i, cudaGetErrorString(e));
      return abandon(g);
    }
    snprintf(dv->name, sizeof(dv->name), "%s", p.name);
    for (int j = 0; j < n; j++) {
      int can = 0;
      if (j == i || (cudaDeviceCanAccessPeer(&can, i, j) == cudaSuccess && can))
        g->reach[i] |= (uint64_t)1 << j;
    }
    char err[200];
    if (!(dv->done = aligned_alloc(4096, 4096))) break;
    memset(dv->done, 0, 4096);
    if (ccs__cuda_host_register(dv->done, 4096, err, sizeof(err))) {
      snprintf(why, len, "GPU %d: %s", i, err);
      free(dv->done);
      dv->done = NULL;
      return abandon(g);
    }
    dv->finishing = 1;
    if (!(dv->finisher_started = !pthread_create(&dv->finisher, NULL, finisher, dv))) break;
    dv->pool = engine_pool_new_with((size_t)256 << 20, device_alloc, device_release, dv);
    if (!dv->pool || pthread_create(&dv->submitter, NULL, submitter, dv)) break;
    dv->started = 1;
  }
  if (g->ndevices < n || !g->dev[n - 1].started ||
      !(g->watching = !pthread_create(&g->watchdog, NULL, watchdog, g)) ||
      !(g->reaping = !pthread_create(&g->reaper, NULL, reaper, g))) {
    snprintf(why, len, "cannot start the GPU threads");
    return abandon(g);
  }
  enable_peer_access(g);
  return g;
}

/* Once its handle closed and the daemon let it go, whichever is last:
 * what let go of its pages after it stopped (the ops and rings freed in
 * the loop's close callbacks) is reaped, and g freed. */
static void destroy(struct gpu *g) {
  if (!g->handle_closed || !g->released) return;
  if (g->stuck) return; /* a GPU may still write its completions: g stays */
  reap(g);
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->watch_cv);
  pthread_cond_destroy(&g->reap_cv);
  free(g);
}

static void on_closed(uv_handle_t *h) {
  struct gpu *g = h->data;
  g->handle_closed = 1;
  destroy(g);
}

void ccsd_gpu_free(struct gpu *g) {
  if (!g) return;
  g->released = 1;
  destroy(g);
}

/* A start that failed: stopped, freed once its handle closed. */
static struct gpu *abandon(struct gpu *g) {
  ccsd_gpu_stop(g);
  ccsd_gpu_free(g);
  return NULL;
}

/* At the end: every op on a GPU is let go, and waited for; 0 when none is
 * left (10 s at most: a kernel that never ends keeps its op). */
static int finish_all(struct gpu *g) {
  for (int waited_ms = 0; waited_ms < 10000; waited_ms++) {
    pthread_mutex_lock(&g->mu);
    int left = 0;
    for (int d = 0; d < g->ndevices; d++) {
      struct list *it, *tmp;
      LIST_FOREACH_SAFE(it, tmp, &g->dev[d].queued) {
        struct run_op *x = LIST_ENTRY(it, struct run_op, gpu_link);
        for (int i = 0; i < x->norders; i++) ccsd_gpu_order_unblock(&x->orders[i]);
        left++;
      }
    }
    pthread_mutex_unlock(&g->mu);
    if (!left) return 0;
    hand_back_drained(g); /* (the watchdog is gone) */
    usleep(1000);
  }
  LOG_WARN("ops still on a GPU as the daemon stops: their memory is left as it is");
  return -1;
}

void ccsd_gpu_stop(struct gpu *g) {
  if (!g) return;
  pthread_mutex_lock(&g->mu);
  g->stop = 1;
  for (int i = 0; i < g->ndevices; i++) pthread_cond_broadcast(&g->dev[i].cv);
  pthread_cond_broadcast(&g->watch_cv);
  pthread_mutex_unlock(&g->mu);
  for (int i = 0; i < g->ndevices; i++)
    if (g->dev[i].started) pthread_join(g->dev[i].submitter, NULL);
  if (g->watching) pthread_join(g->watchdog, NULL);
  g->stuck = finish_all(g) != 0;
  pthread_mutex_lock(&g->mu);
  for (int i = 0; i < g->ndevices; i++) {
    g->dev[i].finishing = 0;
    pthread_cond_signal(&g->dev[i].finish_cv);
  }
  pthread_mutex_unlock(&g->mu);
  for (int i = 0; i < g->ndevices; i++)
    if (g->dev[i].finisher_started) pthread_join(g->dev[i].finisher, NULL);
  drain(g); /* the ops that are over: the loop finishes them */
  if (!g->stuck) /* what is still on a GPU keeps its scratch */
    for (int i = 0; i < g->ndevices; i++) engine_pool_free(g->dev[i].pool);
  pthread_mutex_lock(&g->mu);
  g->closed = 1;
  pthread_cond_broadcast(&g->reap_cv);
  pthread_mutex_unlock(&g->mu);
  if (g->reaping) pthread_join(g->reaper, NULL); /* after what the pools let go */
  if (!g->stuck) {
    retire_streams(g, UINT64_MAX);
    for (int i = 0; i < g->ndevices; i++) {
      pthread_cond_destroy(&g->dev[i].cv);
      pthread_cond_destroy(&g->dev[i].finish_cv);
      fair_close(&g->dev[i].fair);
      if (g->dev[i].done) { /* (a stuck GPU may still write its page: kept) */
        ccs__cuda_host_unregister(g->dev[i].done);
        free(g->dev[i].done);
      }
    }
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
  ccsd_gpu_queue_add(&dv->queue, &dv->fair, x);
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
                               int *ret_device, int *ret_held, char *err, size_t errlen) {
  *ret_held = 0;
  int dev = device_of(g, uuid, err, errlen);
  if (dev < 0) return CCS_ERR_INVALID_ARGUMENT;
  int failed = ccs__cuda_ipc_open(handle, dev, ret_ptr, ret_block, ret_block_size, err, errlen);
  *ret_held = failed > 0;
  if (failed) return CCS_ERR_INVALID_ARGUMENT;
  *ret_device = dev;
  return CCS_OK;
}

void ccsd_gpu_close_ipc(void *base) { ccs__cuda_ipc_close(base); }

