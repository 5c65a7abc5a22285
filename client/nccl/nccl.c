/* libccs-nccl: NCCL's host API (nccl.h, 2.28) on ccs, so that programs
 * written for NCCL run on the service unchanged (SONAME libnccl.so.2; put
 * its directory first on LD_LIBRARY_PATH). Every call maps onto libccs's;
 * what ccs cannot do returns ncclInvalidUsage with a last error saying so.
 * Host buffers work as well as device buffers: a call on host memory runs
 * as a call without a stream (it returns when done, which keeps any
 * stream's order), so NCCL programs run on machines without a GPU too. */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ccs.h"
#include "nccl.h"

#define API __attribute__((visibility("default")))

struct ncclComm {
  ccs_comm_t *c;
  int device;
};

static __thread char last_error[1024];

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof(last_error), fmt, ap);
  va_end(ap);
}

static ncclResult_t result_of(ccs_result_t rc) {
  switch (rc) {
  case CCS_OK: return ncclSuccess;
  case CCS_IN_PROGRESS: return ncclInProgress;
  case CCS_ERR_INVALID_ARGUMENT: case CCS_ERR_MISMATCH: return ncclInvalidArgument;
  case CCS_ERR_INVALID_USAGE: case CCS_ERR_UNSUPPORTED: case CCS_ERR_PERMISSION:
  case CCS_ERR_QUOTA: return ncclInvalidUsage;
  case CCS_ERR_CUDA: return ncclUnhandledCudaError;
  case CCS_ERR_NO_MEMORY: case CCS_ERR_SYSTEM: return ncclSystemError;
  case CCS_ERR_PEER_LOST: case CCS_ERR_TIMEOUT: case CCS_ERR_TRANSPORT: case CCS_ERR_ABORTED:
  case CCS_ERR_DAEMON_UNAVAILABLE: case CCS_ERR_REVOKED: case CCS_ERR_RETRY: return ncclRemoteError;
  default: return ncclInternalError;
  }
}

/* A ccs call's result, its text kept for ncclGetLastError. */
static ncclResult_t done(ccs_result_t rc, const ccs_comm_t *c) {
  if (rc != CCS_OK) say("%s: %s", ccs_result_name(rc), ccs_comm_last_error(c));
  return result_of(rc);
}

static ncclResult_t unsupported(const char *what) {
  say("%s: not supported by ccs", what);
  return ncclInvalidUsage;
}

static int dtype_of(ncclDataType_t t, ccs_dtype_t *ret) {
  static const ccs_dtype_t map[ncclNumTypes] = {
      CCS_INT8,    CCS_UINT8,   CCS_INT32,    CCS_UINT32,     CCS_INT64,      CCS_UINT64,
      CCS_FLOAT16, CCS_FLOAT32, CCS_FLOAT64, CCS_BFLOAT16, CCS_FLOAT8_E4M3, CCS_FLOAT8_E5M2};
  if ((int)t < 0 || t >= ncclNumTypes) {
    say("unknown data type %d", (int)t);
    return -1;
  }
  *ret = map[t];
  return 0;
}

/* --- communicators --- */

API ncclResult_t ncclGetVersion(int *version) {
  if (!version) return unsupported("ncclGetVersion with no version");
  *version = NCCL_VERSION(2, 28, 0); /* the API implemented */
  return ncclSuccess;
}

API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  _Static_assert(sizeof(ncclUniqueId) == sizeof(ccs_unique_id_t), "unique ids of one size");
  if (!id) return ncclInvalidArgument;
  return done(ccs_get_unique_id((ccs_unique_id_t *)id), NULL);
}

static ncclResult_t init(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  if (!comm) {
    say("ncclCommInitRank: comm is NULL");
    return ncclInvalidArgument;
  }
  struct ncclComm *nc = calloc(1, sizeof(*nc));
  if (!nc) return ncclSystemError;
  ccs_unique_id_t cid;
  memcpy(&cid, &id, sizeof(cid));
  ccs_result_t rc = ccs_comm_init_rank(&nc->c, nranks, cid, rank);
  if (rc != CCS_OK) {
    free(nc);
    return done(rc, NULL);
  }
  nc->device = ccs_current_device();
  *comm = nc;
  return ncclSuccess;
}

API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return init(comm, nranks, id, rank);
}

/* The configuration's hints change nothing ccs does; a non-blocking init
 * completes before it returns (which NCCL allows: ncclSuccess at once). */
API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                        ncclConfig_t *config) {
  (void)config;
  return init(comm, nranks, id, rank);
}

API ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank, int nid,
                                          ncclUniqueId *ids, ncclConfig_t *config) {
  (void)config;
  if (nid < 1 || !ids) {
    say("ncclCommInitRankScalable: no unique ids");
    return ncclInvalidArgument;
  }
  return init(comm, nranks, ids[0], rank); /* one id serves every rank */
}

struct init_all {
  ncclComm_t *comms;
  ncclUniqueId id;
  int n, rank;
  ncclResult_t rc;
};

static void *init_one(void *arg) {
  struct init_all *a = arg;
  a->rc = init(&a->comms[a->rank], a->n, a->id, a->rank);
  return NULL;
}

/* ndev ranks in this process, each joining on a thread of its own (a
 * join waits for the others). */
API ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  (void)devlist;
  if (!comms || ndev < 1 || ndev > 4096) {
    say("ncclCommInitAll: %d ranks", ndev);
    return ncclInvalidArgument;
  }
  ncclUniqueId id;
  ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc != ncclSuccess) return rc;
  struct init_all *a = calloc((size_t)ndev, sizeof(*a));
  pthread_t *t = calloc((size_t)ndev, sizeof(*t));
  if (!a || !t) {
    free(a);
    free(t);
    return ncclSystemError;
  }
  int started = 0;
  for (int r = 0; r < ndev; r++) {
    a[r] = (struct init_all){comms, id, ndev, r, ncclSuccess};
    comms[r] = NULL;
    if (pthread_create(&t[r], NULL, init_one, &a[r])) break;
    started++;
  }
  rc = started == ndev ? ncclSuccess : ncclSystemError;
  for (int r = 0; r < started; r++) {
    pthread_join(t[r], NULL);
    if (a[r].rc != ncclSuccess) rc = a[r].rc;
  }
  if (rc != ncclSuccess)
    for (int r = 0; r < ndev; r++)
      if (comms[r]) ccs_comm_abort(comms[r]->c), free(comms[r]), comms[r] = NULL;
  free(a);
  free(t);
  return rc;
}

API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  return done(ccs_comm_finalize(comm->c), comm->c); /* host calls complete, errors said */
}

API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  ccs_result_t rc = ccs_comm_destroy(comm->c);
  free(comm);
  return done(rc, NULL);
}

API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  ccs_result_t rc = ccs_comm_abort(comm->c);
  free(comm);
  return done(rc, NULL);
}

API ncclResult_t ncclCommRevoke(ncclComm_t comm, int flags) {
  if (!comm || flags != NCCL_REVOKE_DEFAULT) return ncclInvalidArgument;
  return done(ccs_comm_revoke(comm->c), comm->c);
}

/* The new comm of a split or shrink, wrapped (NULL: none for this rank). */
static ncclResult_t wrapped(ccs_result_t rc, ccs_comm_t *c, ncclComm_t *newcomm) {
  if (rc != CCS_OK) return done(rc, NULL);
  if (!c) {
    *newcomm = NCCL_COMM_NULL;
    return ncclSuccess;
  }
  struct ncclComm *nc = calloc(1, sizeof(*nc));
  if (!nc) {
    ccs_comm_destroy(c);
    return ncclSystemError;
  }
  nc->c = c;
  nc->device = ccs_current_device();
  *newcomm = nc;
  return ncclSuccess;
}

API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                               ncclConfig_t *config) {
  (void)config;
  if (!comm || !newcomm) return ncclInvalidArgument;
  ccs_comm_t *c = NULL;
  ccs_result_t rc = ccs_comm_split(comm->c, color == NCCL_SPLIT_NOCOLOR ? CCS_SPLIT_NOCOLOR : color,
                                   key, &c, NULL);
  return wrapped(rc, c, newcomm);
}

API ncclResult_t ncclCommShrink(ncclComm_t comm, int *exclude, int n, ncclComm_t *newcomm,
                                ncclConfig_t *config, int flags) {
  (void)config;
  if (!comm || !newcomm) return ncclInvalidArgument;
  ccs_comm_t *c = NULL;
  ccs_result_t rc = ccs_comm_shrink(comm->c, exclude, n, &c,
                                    flags & NCCL_SHRINK_ABORT ? CCS_SHRINK_ABORT : 0);
  return wrapped(rc, c, newcomm);
}

API const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error (run with CCS_DEBUG=INFO for details)";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

API const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return last_error;
}

API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error) {
  if (!comm || !error) return ncclInvalidArgument;
  ccs_result_t async;
  ccs_result_t rc = ccs_comm_get_async_error(comm->c, &async);
  if (rc != CCS_OK) return done(rc, comm->c);
  if (async != CCS_OK) say("%s: %s", ccs_result_name(async), ccs_comm_last_error(comm->c));
  *error = result_of(async);
  return ncclSuccess;
}

API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  return comm && count ? done(ccs_comm_count(comm->c, count), comm->c) : ncclInvalidArgument;
}

API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  return comm && rank ? done(ccs_comm_user_rank(comm->c, rank), comm->c) : ncclInvalidArgument;
}

API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  if (!comm || !device) return ncclInvalidArgument;
  *device = comm->device >= 0 ? comm->device : 0; /* host-only: device 0, as there is none */
  return ncclSuccess;
}

/* --- memory --- */

API ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
  int device = ccs_current_device();
  return done(device >= 0 ? ccs_mem_alloc_device(ptr, size, device) : ccs_mem_alloc(ptr, size), NULL);
}

API ncclResult_t ncclMemFree(void *ptr) { return done(ccs_mem_free(ptr), NULL); }

/* A registration the daemon cannot take (host memory it did not allocate,
 * legacy IPC switched off) is no error: the buffer is staged as before. */
API ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
  if (!comm || !handle) return ncclInvalidArgument;
  ccs_result_t rc = ccs_mem_device_of(buff) >= 0 ? ccs_mem_register(buff, size) : CCS_ERR_UNSUPPORTED;
  *handle = rc == CCS_OK ? buff : NULL;
  return ncclSuccess;
}

API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
  if (!comm) return ncclInvalidArgument;
  return handle ? done(ccs_mem_deregister(handle), comm->c) : ncclSuccess;
}

API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                        int flags) {
  (void)comm, (void)buff, (void)size, (void)win, (void)flags;
  return unsupported("ncclCommWindowRegister (symmetric memory)");
}

API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  (void)comm, (void)win;
  return unsupported("ncclCommWindowDeregister");
}

/* --- reductions: the built-in ones, and PreMulSum on host memory --- */

#define MAX_PREMUL 64
static struct premul {
  int used;
  ncclComm_t comm;
  ncclDataType_t dtype;
  double f;    /* floats */
  int64_t i;   /* integers */
} premuls[MAX_PREMUL];
static pthread_mutex_t premul_mu = PTHREAD_MUTEX_INITIALIZER;

static int integer(ncclDataType_t t) { return t <= ncclUint64; }

API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                          ncclScalarResidence_t residence, ncclComm_t comm) {
  if (!op || !scalar || !comm) return ncclInvalidArgument;
  if (residence != ncclScalarHostImmediate || ccs_mem_device_of(scalar) >= 0)
    return unsupported("ncclRedOpCreatePreMulSum with the scalar in device memory");
  if (datatype != ncclFloat32 && datatype != ncclFloat64 && !integer(datatype))
    return unsupported("ncclRedOpCreatePreMulSum of 16- and 8-bit floats");
  struct premul p = {1, comm, datatype, 0, 0};
  switch (datatype) {
  case ncclInt8: p.i = *(int8_t *)scalar; break;
  case ncclUint8: p.i = *(uint8_t *)scalar; break;
  case ncclInt32: p.i = *(int32_t *)scalar; break;
  case ncclUint32: p.i = *(uint32_t *)scalar; break;
  case ncclInt64: case ncclUint64: p.i = *(int64_t *)scalar; break;
  case ncclFloat32: p.f = *(float *)scalar; break;
  default: p.f = *(double *)scalar; break;
  }
  pthread_mutex_lock(&premul_mu);
  int k = 0;
  while (k < MAX_PREMUL && premuls[k].used) k++;
  if (k < MAX_PREMUL) premuls[k] = p;
  pthread_mutex_unlock(&premul_mu);
  if (k == MAX_PREMUL) {
    say("ncclRedOpCreatePreMulSum: %d operators exist already", MAX_PREMUL);
    return ncclInvalidUsage;
  }
  *op = (ncclRedOp_t)(ncclNumOps + k);
  return ncclSuccess;
}

API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  int k = (int)op - ncclNumOps;
  pthread_mutex_lock(&premul_mu);
  int ok = k >= 0 && k < MAX_PREMUL && premuls[k].used && premuls[k].comm == comm;
  if (ok) premuls[k].used = 0;
  pthread_mutex_unlock(&premul_mu);
  if (!ok) say("ncclRedOpDestroy: operator %d is not one of this communicator's", (int)op);
  return ok ? ncclSuccess : ncclInvalidArgument;
}

/* in * scalar into a new buffer of count elements */
static void *premultiplied(const struct premul *p, const void *in, size_t count) {
  ccs_dtype_t t = CCS_INT8;
  dtype_of(p->dtype, &t);
  size_t sz = ccs_dtype_size(t);
  char *out = malloc(count * sz + 1);
  if (!out) return NULL;
  for (size_t i = 0; i < count; i++) {
    const char *a = (const char *)in + i * sz;
    char *b = out + i * sz;
    switch (p->dtype) {
    case ncclInt8: *(int8_t *)b = (int8_t)(*(const int8_t *)a * p->i); break;
    case ncclUint8: *(uint8_t *)b = (uint8_t)(*(const uint8_t *)a * (uint64_t)p->i); break;
    case ncclInt32: *(int32_t *)b = (int32_t)((uint32_t)*(const int32_t *)a * (uint32_t)p->i); break;
    case ncclUint32: *(uint32_t *)b = *(const uint32_t *)a * (uint32_t)p->i; break;
    case ncclInt64: case ncclUint64: *(uint64_t *)b = *(const uint64_t *)a * (uint64_t)p->i; break;
    case ncclFloat32: *(float *)b = (float)(*(const float *)a * p->f); break;
    default: *(double *)b = *(const double *)a * p->f; break;
    }
  }
  return out;
}

/* The type and reduction for ccs; a PreMulSum's multiplied input in
 * *scaled (to free) when op is one. */
static ncclResult_t args_of(ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm, const void *send,
                            size_t count, ccs_dtype_t *dt, ccs_redop_t *ret, void **scaled) {
  *scaled = NULL;
  if (dtype_of(t, dt)) return ncclInvalidArgument;
  if ((int)op >= 0 && op < ncclNumOps) {
    *ret = (ccs_redop_t)op; /* the same numbers */
    return ncclSuccess;
  }
  int k = (int)op - ncclNumOps;
  pthread_mutex_lock(&premul_mu);
  struct premul p = k >= 0 && k < MAX_PREMUL ? premuls[k] : (struct premul){0};
  pthread_mutex_unlock(&premul_mu);
  if (!p.used || p.comm != comm || p.dtype != t) {
    say("reduction %d is not an operator of this communicator and type", (int)op);
    return ncclInvalidArgument;
  }
  if (ccs_mem_device_of(send) >= 0) return unsupported("a PreMulSum reduction on device memory");
  if (!(*scaled = premultiplied(&p, send, count))) {
    say("out of memory");
    return ncclSystemError;
  }
  *ret = CCS_SUM;
  return ncclSuccess;
}

/* --- collectives --- */

/* On host memory a call takes no CUDA stream: it returns when done. */
static ccs_stream_t stream_for(const void *a, const void *b, cudaStream_t s) {
  return (a && ccs_mem_device_of(a) >= 0) || (b && ccs_mem_device_of(b) >= 0) ? (ccs_stream_t)s : NULL;
}

#define NEED_COMM(comm) \
  if (!(comm)) {        \
    say("the communicator is NULL"); \
    return ncclInvalidArgument; \
  }

API ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
  NEED_COMM(comm);
  ccs_dtype_t dt;
  ccs_redop_t ro;
  void *scaled;
  ncclResult_t bad = args_of(t, op, comm, send, count, &dt, &ro, &scaled);
  if (bad != ncclSuccess) return bad;
  ccs_result_t rc = ccs_all_reduce(scaled ? scaled : send, recv, count, dt, ro, comm->c,
                                   stream_for(send, recv, s));
  free(scaled);
  return done(rc, comm->c);
}

API ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                            ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t s) {
  NEED_COMM(comm);
  ccs_dtype_t dt;
  ccs_redop_t ro;
  void *scaled;
  ncclResult_t bad = args_of(t, op, comm, send, count, &dt, &ro, &scaled);
  if (bad != ncclSuccess) return bad;
  ccs_result_t rc = ccs_reduce(scaled ? scaled : send, recv, count, dt, ro, root, comm->c,
                               stream_for(send, recv, s));
  free(scaled);
  return done(rc, comm->c);
}

API ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t,
                                   ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
  NEED_COMM(comm);
  ccs_dtype_t dt;
  ccs_redop_t ro;
  void *scaled;
  int n;
  ccs_comm_count(comm->c, &n);
  ncclResult_t bad = args_of(t, op, comm, send, recvcount * (size_t)n, &dt, &ro, &scaled);
  if (bad != ncclSuccess) return bad;
  ccs_result_t rc = ccs_reduce_scatter(scaled ? scaled : send, recv, recvcount, dt, ro, comm->c,
                                       stream_for(send, recv, s));
  free(scaled);
  return done(rc, comm->c);
}

API ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                               ncclComm_t comm, cudaStream_t s) {
  NEED_COMM(comm);
  ccs_dtype_t dt;
  if (dtype_of(t, &dt)) return ncclInvalidArgument;
  return done(ccs_broadcast(send, recv, count, dt, root, comm->c, stream_for(send, recv, s)), comm->c);
}

API ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t s) {
  return ncclBroadcast(buff, buff, count, t, root, comm, s);
}

API ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t,
                               ncclComm_t comm, cudaStream_t s) {
  NEED_COMM(comm);
  ccs_dtype_t dt;
  if (dtype_of(t, &dt)) return ncclInvalidArgument;
  return done(ccs_all_gather(send, recv, sendcount, dt, comm->c, stream_for(send, recv, s)), comm->c);
}

API ncclResult_t ncclAlltoAll(const void *send, void *recv, size_t count, ncclDataType_t t,
                              ncclComm_t comm, cudaStream_t s) {
  NEED_COMM(comm);
  ccs_dtype_t dt;
  if (dtype_of(t, &dt)) return ncclInvalidArgument;
  return done(ccs_all_to_all(send, recv, count, dt, comm->c, stream_for(send, recv, s)), comm->c);
}

API ncclResult_t ncclGather(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                            ncclComm_t comm, cudaStream_t s) {
  NEED_COMM(comm);
  ccs_dtype_t dt;
  if (dtype_of(t, &dt)) return ncclInvalidArgument;
  return done(ccs_gather(send, recv, count, dt, root, comm->c, stream_for(send, recv, s)), comm->c);
}

API ncclResult_t ncclScatter(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                             ncclComm_t comm, cudaStream_t s) {
  NEED_COMM(comm);
  ccs_dtype_t dt;
  if (dtype_of(t, &dt)) return ncclInvalidArgument;
  return done(ccs_scatter(send, recv, count, dt, root, comm->c, stream_for(send, recv, s)), comm->c);
}

API ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                          cudaStream_t s) {
  NEED_COMM(comm);
  ccs_dtype_t dt;
  if (dtype_of(t, &dt)) return ncclInvalidArgument;
  return done(ccs_send(send, count, dt, peer, comm->c, stream_for(send, NULL, s)), comm->c);
}

API ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                          cudaStream_t s) {
  NEED_COMM(comm);
  ccs_dtype_t dt;
  if (dtype_of(t, &dt)) return ncclInvalidArgument;
  return done(ccs_recv(recv, count, dt, peer, comm->c, stream_for(NULL, recv, s)), comm->c);
}

API ncclResult_t ncclGroupStart(void) { return done(ccs_group_start(), NULL); }
API ncclResult_t ncclGroupEnd(void) { return done(ccs_group_end(), NULL); }

API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *info) {
  (void)info;
  return unsupported("ncclGroupSimulateEnd");
}

/* NCCL exports every call a second time as pnccl*, for profilers that
 * wrap the first: the same functions. */
#define PNAME(name) __typeof__(name) p##name __attribute__((alias(#name), visibility("default")));
PNAME(ncclGetVersion)
PNAME(ncclGetUniqueId)
PNAME(ncclCommInitRank)
PNAME(ncclCommInitRankConfig)
PNAME(ncclCommInitRankScalable)
PNAME(ncclCommInitAll)
PNAME(ncclCommFinalize)
PNAME(ncclCommDestroy)
PNAME(ncclCommAbort)
PNAME(ncclCommRevoke)
PNAME(ncclCommSplit)
PNAME(ncclCommShrink)
PNAME(ncclGetErrorString)
PNAME(ncclGetLastError)
PNAME(ncclCommGetAsyncError)
PNAME(ncclCommCount)
PNAME(ncclCommUserRank)
PNAME(ncclCommCuDevice)
PNAME(ncclMemAlloc)
PNAME(ncclMemFree)
PNAME(ncclCommRegister)
PNAME(ncclCommDeregister)
PNAME(ncclCommWindowRegister)
PNAME(ncclCommWindowDeregister)
PNAME(ncclRedOpCreatePreMulSum)
PNAME(ncclRedOpDestroy)
PNAME(ncclAllReduce)
PNAME(ncclReduce)
PNAME(ncclReduceScatter)
PNAME(ncclBroadcast)
PNAME(ncclBcast)
PNAME(ncclAllGather)
PNAME(ncclAlltoAll)
PNAME(ncclGather)
PNAME(ncclScatter)
PNAME(ncclSend)
PNAME(ncclRecv)
PNAME(ncclGroupStart)
PNAME(ncclGroupEnd)
PNAME(ncclGroupSimulateEnd)
