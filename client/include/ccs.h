/* ccs: collectives as a service. The one public header of libccs.
 *
 * A job's ranks call these functions; the node's ccsd daemon performs the
 * collectives. The API mirrors NCCL's: opaque communicators created from a
 * 128-byte unique id, one result enum for every call, a detail text per
 * communicator. With a NULL stream every call returns when the operation is
 * complete; with a CUDA stream (device buffers) it is ordered on the stream.
 */
#ifndef CCS_H
#define CCS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CCS_VERSION_MAJOR 0
#define CCS_VERSION_MINOR 1
#define CCS_VERSION_PATCH 0

/* Results. The numbers travel on the wire: never renumber, only append. */
#define CCS_RESULT_MAP(X)                                                          \
  X(CCS_OK, 0, "success")                                                          \
  X(CCS_IN_PROGRESS, 1, "operation in progress")                                   \
  X(CCS_ERR_INVALID_ARGUMENT, 2, "invalid argument")                               \
  X(CCS_ERR_INVALID_USAGE, 3, "invalid usage")                                     \
  X(CCS_ERR_NO_MEMORY, 4, "out of memory")                                         \
  X(CCS_ERR_SYSTEM, 5, "system error")                                             \
  X(CCS_ERR_CUDA, 6, "CUDA error")                                                 \
  X(CCS_ERR_TRANSPORT, 7, "transport error")                                       \
  X(CCS_ERR_PROTOCOL, 8, "protocol error")                                         \
  X(CCS_ERR_PEER_LOST, 9, "peer lost")                                             \
  X(CCS_ERR_TIMEOUT, 10, "timeout")                                                \
  X(CCS_ERR_VERSION, 11, "version mismatch")                                       \
  X(CCS_ERR_DAEMON_UNAVAILABLE, 12, "daemon unavailable")                          \
  X(CCS_ERR_UNSUPPORTED, 13, "unsupported")                                        \
  X(CCS_ERR_MISMATCH, 14, "arguments differ across ranks")                         \
  X(CCS_ERR_PERMISSION, 15, "permission denied")                                   \
  X(CCS_ERR_QUOTA, 16, "quota exceeded")                                           \
  X(CCS_ERR_ABORTED, 17, "communicator aborted")                                  \
  X(CCS_ERR_REVOKED, 18, "communicator revoked")                                   \
  X(CCS_ERR_RETRY, 19, "daemon restarted mid-call: repeat the call")

typedef enum {
#define CCS__RESULT_ENUM(name, value, text) name = value,
  CCS_RESULT_MAP(CCS__RESULT_ENUM)
#undef CCS__RESULT_ENUM
} ccs_result_t;

typedef enum {
  CCS_INT8 = 0,
  CCS_UINT8 = 1,
  CCS_INT32 = 2,
  CCS_UINT32 = 3,
  CCS_INT64 = 4,
  CCS_UINT64 = 5,
  CCS_FLOAT16 = 6,
  CCS_BFLOAT16 = 7,
  CCS_FLOAT32 = 8,
  CCS_FLOAT64 = 9,
  CCS_FLOAT8_E4M3 = 10,
  CCS_FLOAT8_E5M2 = 11,
  CCS_DTYPE_COUNT
} ccs_dtype_t;

typedef enum { CCS_SUM = 0, CCS_PROD = 1, CCS_MAX = 2, CCS_MIN = 3, CCS_AVG = 4, CCS_REDOP_COUNT } ccs_redop_t;

#define CCS_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[CCS_UNIQUE_ID_BYTES];
} ccs_unique_id_t;

typedef struct ccs_comm ccs_comm_t;
/* A cudaStream_t, for device buffers: the op runs in the stream's order and
 * the call returns without waiting for the GPU (as NCCL). A host stream of
 * ccs_stream_create, for host buffers: likewise, the call returns once the
 * op is submitted. NULL: the call returns when the op is complete (host or
 * device buffers). */
typedef void *ccs_stream_t;

const char *ccs_strerror(ccs_result_t r);
const char *ccs_result_name(ccs_result_t r); /* "CCS_ERR_TIMEOUT" */

ccs_result_t ccs_get_unique_id(ccs_unique_id_t *id);
ccs_result_t ccs_comm_init_rank(ccs_comm_t **comm, int nranks, ccs_unique_id_t id, int rank);
/* The communicator called `name` (of the calling user: another user's of
 * the same name is another comm), found through the daemons: no id to pass
 * around. On one node nothing else is needed; across nodes the ranks'
 * daemons meet at the daemon of CCS_ROOT (HOST:PORT). A name in use by a
 * running comm (another job?) is CCS_ERR_INVALID_ARGUMENT naming it. */
ccs_result_t ccs_comm_init_named(ccs_comm_t **comm, const char *name, int nranks, int rank);
/* Rank, size and a name from the launcher that started the process: the
 * first of CCS_RANK/CCS_NRANKS, Open MPI, PMI, PMIx, Slurm, torchrun; the
 * name from CCS_JOB or the launcher's job id; across nodes the root from
 * CCS_ROOT, Slurm's first node or torchrun's MASTER_ADDR (at CCS_ROOT_PORT,
 * default 7000). CCS_ERR_INVALID_USAGE when no launcher says a rank. */
ccs_result_t ccs_comm_init_from_env(ccs_comm_t **comm);
/* How the daemon schedules a comm's work beside its user's other comms
 * (the daemon shares its threads, links and GPUs between users by the
 * weights its operator set; within a user by these): a latency comm's
 * ops go ahead of the user's bulk work, which still keeps a share. */
typedef enum {
  CCS_PRIORITY_DEFAULT = -1, /* CCS_PRIORITY (latency, normal, bulk), else normal */
  CCS_PRIORITY_NORMAL = 0,
  CCS_PRIORITY_LATENCY = 1,
  CCS_PRIORITY_BULK = 2,
} ccs_priority_t;
/* A comm's options (NCCL's ncclConfig_t): start from CCS_COMM_CONFIG_INIT. */
typedef struct {
  size_t size;
  int priority; /* ccs_priority_t */
} ccs_comm_config_t;
#define CCS_COMM_CONFIG_INIT {sizeof(ccs_comm_config_t), CCS_PRIORITY_DEFAULT}
/* ccs_comm_init_rank with options (config NULL: the defaults). */
ccs_result_t ccs_comm_init_rank_config(ccs_comm_t **comm, int nranks, ccs_unique_id_t id, int rank,
                                       const ccs_comm_config_t *config);
#define CCS_SPLIT_NOCOLOR (-1)
#define CCS_SHRINK_ABORT 1
/* Collective over comm: the ranks of each color make a new comm, ranked by
 * key, then by their rank in comm; CCS_SPLIT_NOCOLOR gives NULL. Within a
 * node and across daemons. config may be NULL. */
ccs_result_t ccs_comm_split(ccs_comm_t *comm, int color, int key, ccs_comm_t **newcomm,
                            const ccs_comm_config_t *config);
/* The ranks not in exclude[0..n) make a new comm, in their order; works
 * on a failed comm (its survivors go on without the lost ranks). Every
 * survivor gives the same ranks. CCS_SHRINK_ABORT revokes comm first. */
ccs_result_t ccs_comm_shrink(ccs_comm_t *comm, const int *exclude, int n, ccs_comm_t **newcomm,
                             int flags);
/* Not collective: every rank's pending and later ops of comm return
 * CCS_ERR_REVOKED, promptly, on every daemon; the comm can still shrink. */
ccs_result_t ccs_comm_revoke(ccs_comm_t *comm);
/* A comm of nranks from comm's ranks (who keep their ranks; comm NULL and
 * `rank`: a newcomer) under a new unique id that every rank, old and new,
 * passes (one of them gets it: ccs_get_unique_id). comm is unaffected. */
ccs_result_t ccs_comm_grow(ccs_comm_t *comm, int nranks, ccs_unique_id_t id, int rank,
                           ccs_comm_t **newcomm);
/* Waits for comm's calls still in flight (host and CUDA streams'): their
 * first failure, or CCS_OK. */
ccs_result_t ccs_comm_finalize(ccs_comm_t *comm);
ccs_result_t ccs_comm_destroy(ccs_comm_t *comm);
ccs_result_t ccs_comm_abort(ccs_comm_t *comm);
ccs_result_t ccs_comm_count(const ccs_comm_t *comm, int *count);
ccs_result_t ccs_comm_user_rank(const ccs_comm_t *comm, int *rank);
ccs_result_t ccs_comm_get_async_error(ccs_comm_t *comm, ccs_result_t *async_error);
const char *ccs_comm_last_error(const ccs_comm_t *comm);

/* Host memory the daemon maps directly (zero copy). Any other pointer works
 * too, staged through a bounded per-connection area. */
ccs_result_t ccs_mem_alloc(void **ptr, size_t bytes);
/* Memory on GPU `device` (an ordinal of this process) that the daemon maps
 * directly (CUDA virtual memory exported as a file descriptor: no
 * copies, and not a bearer token). Other device pointers (cudaMalloc,
 * framework allocators) work too, staged through daemon-mapped device
 * memory on the caller's stream. CCS_ERR_UNSUPPORTED without a CUDA driver
 * or GPU here, or with a host-only daemon. */
ccs_result_t ccs_mem_alloc_device(void **ptr, size_t bytes, int device);
/* The GPU (an ordinal of this process) whose memory ptr points into, or
 * -1 for host memory (always without CUDA); and the calling thread's
 * current GPU, or -1 where there is none. Neither makes a CUDA context in
 * a process that has none. */
int ccs_mem_device_of(const void *ptr);
int ccs_current_device(void);
/* Frees what ccs_mem_alloc or ccs_mem_alloc_device returned. */
ccs_result_t ccs_mem_free(void *ptr);
/* Zero copy for device memory the job already has (cudaMalloc): the whole
 * allocation holding [ptr, ptr+bytes) is shared by a legacy CUDA IPC handle,
 * a bearer token, which a daemon accepts only where its cuda_legacy_ipc
 * switch is on (CCS_ERR_PERMISSION otherwise: the buffer is then staged
 * as before). Deregister before freeing the memory. */
ccs_result_t ccs_mem_register(void *ptr, size_t bytes);
ccs_result_t ccs_mem_deregister(void *ptr);

ccs_result_t ccs_all_reduce(const void *sendbuf, void *recvbuf, size_t count, ccs_dtype_t dtype,
                            ccs_redop_t op, ccs_comm_t *comm, ccs_stream_t stream);
ccs_result_t ccs_broadcast(const void *sendbuf, void *recvbuf, size_t count, ccs_dtype_t dtype,
                           int root, ccs_comm_t *comm, ccs_stream_t stream);
ccs_result_t ccs_reduce(const void *sendbuf, void *recvbuf, size_t count, ccs_dtype_t dtype,
                        ccs_redop_t op, int root, ccs_comm_t *comm, ccs_stream_t stream);
ccs_result_t ccs_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount,
                            ccs_dtype_t dtype, ccs_comm_t *comm, ccs_stream_t stream);
ccs_result_t ccs_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                ccs_dtype_t dtype, ccs_redop_t op, ccs_comm_t *comm,
                                ccs_stream_t stream);
/* count elements to and from each peer */
ccs_result_t ccs_all_to_all(const void *sendbuf, void *recvbuf, size_t count, ccs_dtype_t dtype,
                            ccs_comm_t *comm, ccs_stream_t stream);
ccs_result_t ccs_gather(const void *sendbuf, void *recvbuf, size_t sendcount, ccs_dtype_t dtype,
                        int root, ccs_comm_t *comm, ccs_stream_t stream);
ccs_result_t ccs_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, ccs_dtype_t dtype,
                         int root, ccs_comm_t *comm, ccs_stream_t stream);
ccs_result_t ccs_send(const void *sendbuf, size_t count, ccs_dtype_t dtype, int peer,
                      ccs_comm_t *comm, ccs_stream_t stream);
ccs_result_t ccs_recv(void *recvbuf, size_t count, ccs_dtype_t dtype, int peer, ccs_comm_t *comm,
                      ccs_stream_t stream);
ccs_result_t ccs_barrier(ccs_comm_t *comm);

/* Host streams. The calls given one run in the order given (each after the
 * one before has finished) while the caller goes on; their buffers must
 * stay as they are until then. ccs_stream_synchronize waits for them all
 * and returns the first failure among them since the last synchronize
 * (its text: ccs_comm_last_error(NULL), and the failed call's comm's);
 * ccs_stream_query returns CCS_IN_PROGRESS while any runs. A failure that
 * ends a comm (a lost rank, a timeout, an abort) also shows in
 * ccs_comm_get_async_error. Calls that cannot be submitted asynchronously
 * (staged buffers: see ccs_mem_alloc; sends and receives; CCS_RING=0)
 * wait for the stream and complete before returning. ccs_comm_destroy
 * waits for its comm's calls; ccs_stream_destroy for the stream's.
 * CCS_ERR_RETRY from synchronize: a daemon of the comm restarted before
 * some of the calls finished (every rank that made them gets it). The
 * calls made since the previous synchronize that must be repeated are the
 * last ccs_stream_repeat_count of them, in their order (their outputs are
 * undefined: restore the inputs of in-place ones); those before them
 * finished, or failed otherwise (the text says how). Once libccs has the
 * word that a call must be repeated, the stream's later calls, and its
 * comm's calls on any other stream, are not made (they return
 * CCS_ERR_RETRY, and are counted in their stream) until this stream is
 * synchronized: synchronize every stream of the comm, then repeat each
 * one's calls in the order they were first made. A call the daemon
 * refused for a quota (ops in flight) counts among those to repeat, as do
 * the stream's calls after it. */
ccs_result_t ccs_stream_create(ccs_stream_t *stream);
ccs_result_t ccs_stream_synchronize(ccs_stream_t stream);
/* After synchronize returned CCS_ERR_RETRY: how many of the stream's last
 * calls to repeat (0 after any other result). */
ccs_result_t ccs_stream_repeat_count(ccs_stream_t stream, int *count);
ccs_result_t ccs_stream_query(ccs_stream_t stream);
ccs_result_t ccs_stream_destroy(ccs_stream_t stream);

/* Ops issued between start and end are submitted together; they complete
 * (host) by the time ccs_group_end returns. Groups nest, like NCCL's. */
ccs_result_t ccs_group_start(void);
ccs_result_t ccs_group_end(void);

/* Helpers */
size_t ccs_dtype_size(ccs_dtype_t dtype); /* 0 for an unknown type */
const char *ccs_dtype_name(ccs_dtype_t dtype);
const char *ccs_redop_name(ccs_redop_t op);

#ifdef __cplusplus
}
#endif
#endif /* CCS_H */
