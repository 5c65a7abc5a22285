/* ccsd's objects and who owns what.
 *
 * Everything below lives on the libuv loop thread except the executor's
 * queue; payload bytes are only touched by executor threads.
 *
 *   daemon ── sessions (one per client connection)
 *          │     ├─ buffers   registered memfd mappings (refcounted: ops in
 *          │     │            flight keep a buffer mapped after its owner left)
 *          │     ├─ members   this client's ranks in comms
 *          │     └─ submissions  requests awaiting their reply
 *          └─ comms ── members[nranks], pending collectives (slots by op
 *                      number) and unmatched sends/receives
 * A matched op becomes an xop: the posts of every rank plus the graph the
 * engine compiled from the chosen algorithm's schedules; the executor runs
 * it and hands it back.
 */
#ifndef CCSD_DAEMON_H
#define CCSD_DAEMON_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <uthash.h>
#include <uv.h>

#include "accept.h"
#include "plan/engine.h"
#include "plan/pool.h"
#include "run/engine_run.h"
#include "run/executor.h"
#include "run/gpu.h"
#include "run/net.h"
#include "base/list.h"
#include "plan/tuner.h"
#include "wire.h"

#define CCSD_MAX_RANKS 4096
#define CCSD_MAX_PENDING_FDS 4
#define CCSD_MAX_OUTPUT_BYTES (16u << 20)

enum tenant_counter {
  TENANT_SESSIONS,
  TENANT_COMMS,
  TENANT_REGISTERED_BYTES,
  TENANT_OPS,
  TENANT_RANKS,   /* members of comms joined here */
  TENANT_BUFFERS, /* registered buffers (mappings) */
  TENANT_COUNTERS
};

#define CCSD_MAX_ALLOW 64

#define CCSD_DEFAULT_SOCKET "/run/ccs/ccsd.sock"
#define CCSD_DEFAULT_CONFIG "/etc/ccs/ccsd.conf"
#define CCSD_DEFAULT_CLUSTER_KEY "/etc/ccs/cluster.key"

struct ccsd_config {
  char socket_path[108];
  unsigned socket_mode;
  int threads;
  double init_timeout_s;
  double op_timeout_s;  /* default deadline of one op; per comm overridable */
  double io_timeout_s;  /* a client stalled mid-frame or not reading replies */
  size_t chunk_bytes;
  size_t stream_bytes; /* ops writing at least this much stream their stores */
  size_t scratch_keep; /* scratch kept between ops */
  size_t inline_bytes; /* ops moving at most this much run on the loop thread */
  uint64_t quota[TENANT_COUNTERS]; /* per uid */
  /* optional allow-lists on top of the socket's permissions (empty: all) */
  uint32_t allow_uids[CCSD_MAX_ALLOW]; /* uid_t and gid_t */
  uint32_t allow_gids[CCSD_MAX_ALLOW];
  uint32_t admin_gids[CCSD_MAX_ALLOW]; /* operators besides root */
  int nallow_uids, nallow_gids, nadmin_gids;
  double id_ttl_s;
  int log_level;
  int log_subsys;          /* mask of enum ccs__log_subsys */
  char metrics_listen[64]; /* HOST:PORT, or empty */
  char algo[512];          /* algorithm rules (tuner.h), or empty */
  char listen[64];         /* HOST:PORT for other daemons, or empty */
  char advertise[64];      /* HOST:PORT they reach this one at */
  double heartbeat_s, peer_timeout_s;
  int peer_connections; /* data connections per pair of daemons and comm */
  int cuda_legacy_ipc;  /* accept cudaIpcMemHandle buffers (bearer tokens) */
  int metrics_tenant_labels;   /* HTTP metrics per tenant, or summed */
  int metrics_max_connections;
  char cluster_key_file[108];  /* daemons prove they hold this key to each other */
  int peer_encrypt;            /* data between daemons encrypted too */
  int peer_max_connections;
  uint64_t peer_unexpected_bytes, peer_unexpected_total; /* held before their receive */
};

/* One per uid with anything charged to it. */
struct tenant {
  struct list link;  /* in daemon->tenants */
  UT_hash_handle hh; /* in daemon->tenants_by_uid */
  struct daemon *d;
  uid_t uid;
  uint64_t used[TENANT_COUNTERS];
  uint64_t charges; /* outstanding charges; freed at zero */
};

struct executor;

#include "base/textbuf.h"

/* metrics.c */
#define CCSD_LATENCY_BUCKETS 8
struct op_counter {
  uid_t uid;
  uint32_t kind;
  ccs_result_t status;
  uint64_t ops, bytes;
  double bus_bytes;
};
struct latency {
  uint64_t buckets[CCSD_LATENCY_BUCKETS], count;
  double sum;
};
struct ccsd_metrics {
  struct op_counter *counters;
  size_t ncounters, cap;
  struct latency latency[CCS__COLL_KIND_COUNT];
};

struct daemon {
  uv_loop_t *loop;
  struct ccsd_config cfg;
  int listen_fd;
  uv_poll_t listen_poll;
  struct accept_reserve accept_reserve; /* a spare descriptor for EMFILE */
  uv_timer_t listen_rest;               /* the listener rests when none can be freed */
  uint64_t fd_exhausted_logged_ms;
  uv_signal_t sig_term, sig_int;
  struct list sessions;
  struct list comms;
  struct list tenants;
  struct tenant *tenants_by_uid; /* the same (uthash): uids come from peers too */
  struct membuf *buffers_by_id; /* every registered buffer (uthash) */
  size_t nbuffers, max_buffers; /* mappings, and half of vm.max_map_count */
  uv_timer_t housekeeping; /* io deadlines of sessions */
  uint64_t started_ms;
  uint8_t id_key[32];    /* signs the unique ids this daemon issues */
  uint8_t table_key[16]; /* keys the hash tables of names that come from outside */
  struct comm *comms_by_name;
  int socket_activated; /* the listening socket is systemd's: not ours to unlink */
  uv_timer_t watchdog;
  int watchdog_on;
  uint64_t watchdog_seen;
  struct executor *exec;
  struct ccsd_metrics metrics;
  uv_tcp_t metrics_server; /* optional HTTP listener (metrics_listen) */
  int metrics_on;
  struct list http_conns;
  int nhttp_conns;
  uint64_t next_id; /* sessions, comms: numbers for logs */
  int stopping;
  struct peers *peers;       /* other nodes' daemons, when cfg.listen is set */
  struct gpu *gpu;           /* NULL: host-only, for the reason in gpu_absent */
  char gpu_absent[200];
  struct engine_pool *pool;  /* ops' scratch, kept between ops */
  char self[CCSD_ADDR_MAX];  /* the address they reach this one at */
};

struct membuf {
  struct list link; /* in session->buffers while registered */
  UT_hash_handle hh; /* in daemon->buffers_by_id while registered */
  struct daemon *d;
  struct session *session; /* its owner, while registered */
  uint64_t id;      /* unique in the daemon */
  void *base;       /* a device address for device memory */
  size_t size;
  int device;       /* the GPU it lives on; -1: host memory */
  int legacy_ipc;   /* opened from a cudaIpcMemHandle */
  int refs;
  struct tenant *tenant;
};

struct pending_fd {
  int fd;
  uint64_t read_end; /* stream offset where the read that brought it ended */
};

struct session {
  struct list link;
  struct daemon *d;
  uint64_t id;
  int fd;
  uv_poll_t poll;
  int poll_events;
  pid_t pid;
  uid_t uid;
  gid_t gid;
  int admin; /* root or an admin_gids member: sees and aborts every tenant's comms */
  int said_hello;
  int closing;
  struct tenant *tenant;
  uint64_t connected_ms, last_rx_ms, last_tx_ms;
  struct ccs__frame_reader rd;
  uint64_t rx_total;      /* bytes received */
  uint64_t rx_frame_end;  /* stream offset past the last frame handled */
  struct pending_fd fds[CCSD_MAX_PENDING_FDS];
  int nfds;
  struct list outq;
  size_t out_bytes;
  struct list buffers;
  struct list events; /* struct gpu_events */
  struct list members;
  struct member *members_by_handle; /* the same (uthash) */
  struct list submissions;
  uint64_t next_comm_handle;
};

/* A request waiting for its reply: a Submit (one post per op) or a CommInit. */
struct submission {
  struct list link;         /* in session->submissions */
  struct session *session;  /* NULL once the client is gone */
  uint64_t req_id;
  int nposts, ndone;
  ccs_result_t status;
  char *error;
  uint64_t comm_handle; /* a CommInit's reply carries it */
  char *info;           /* how its ops ran, for CCS_DEBUG=INFO */
};

struct member {
  struct list session_link;
  UT_hash_handle hh;       /* in session->members_by_handle while it has one */
  struct comm *comm;
  struct session *session; /* NULL once the client is gone */
  struct tenant *tenant;   /* a local rank: charged one of quota_ranks */
  uint64_t handle;
  int rank;
  pid_t pid;
  struct submission *init; /* until the comm is ready */
  int debug;               /* CCS_DEBUG=INFO: replies say how each op ran */
  int remote;              /* served by the daemon at addr (no session here) */
  char addr[CCSD_ADDR_MAX];
  uint64_t coll_seq;       /* collectives submitted so far */
};

enum comm_state { COMM_JOINING, COMM_READY, COMM_FAILED };

struct comm {
  struct list link;
  struct daemon *d;
  uint64_t id;
  UT_hash_handle hh;                /* in daemon->comms_by_name */
  uint8_t name[CCS__NAME_BYTES];    /* from (root, secret, owner): how daemons name it */
  uint64_t table_key;
  uint8_t id_bytes[CCS_UNIQUE_ID_BYTES]; /* the unique id, for the root daemon */
  uid_t uid;
  struct tenant *tenant;
  double op_timeout_s;
  int nranks, joined, departed;
  struct member **members;
  enum comm_state state;
  ccs_result_t error;
  char error_text[CCS__ERROR_TEXT_MAX];
  uv_timer_t timer;  /* the init deadline, then the deadline of the oldest op */
  struct list slots; /* pending collectives, by op number */
  struct list p2p;   /* unmatched sends and receives */
  struct list running; /* xops in the executor */
  struct algo_rules rules; /* the daemon's, or the ranks' CCS_ALGO */
  char algo_text[512];     /* CCS_ALGO as the first rank gave it */
  int first_rank;
  /* across daemons (span.c) */
  char root[CCSD_ADDR_MAX]; /* the daemon that issued the id, when another */
  int spans;                /* has ranks on other daemons */
  int nlocal;               /* ranks that joined here */
  int coordinator;          /* the root keeps it for other daemons' ranks */
  int nnodes, mynode;       /* once ready: daemons in address order of first rank */
  char (*node_addr)[CCSD_ADDR_MAX];
  int *node_of_rank, *rank_of; /* rank_of: participants ordered by node */
  int *node_first;             /* node k's ranks: rank_of[node_first[k] ..] */
  struct net_comm *net;
  struct net_map map;       /* who is where, for the network side's texts */
  size_t chunk_bytes;       /* the root's: chunks are messages */
  int lanes;                /* the root's: data connections per pair of daemons */
  struct p2p_count *p2p_counts; /* messages so far per (from, to) rank pair */
  struct list agreements;   /* op_agree.c: ops not yet agreed by every daemon */
  size_t np2p;
  int refs;          /* members, xops, the timer handle */
  int gone;          /* unreferenced: leaves d->comms once its timer closed; walks skip it */
};

struct p2p_count {
  int from, to;
  uint32_t n;
};

/* One rank's part of one op. */
struct post {
  struct list link;
  struct submission *sub;
  struct member *member;
  uint32_t kind, dtype, redop;
  uint64_t count;
  int root; /* or the peer of a send/recv */
  struct membuf *sendbuf, *recvbuf;
  uint64_t send_off, send_len, recv_off, recv_len;
  uint64_t seq;
  uint64_t posted_ms;
  uint64_t posted_ns; /* uv_hrtime, for the latency histogram */
  struct tenant *tenant; /* charged one op in flight */
  struct gpu_events *events; /* the client's stream order (device buffers) */
};

/* What a rank called: the arguments every rank of an op must agree on. */
struct op_sig {
  uint32_t kind, dtype, redop;
  uint64_t count;
  int root;
};
struct op_sig ccsd_op_sig_of(const struct post *p);
int ccsd_op_sig_same(const struct op_sig *a, const struct op_sig *b); /* redop, root where used */
int ccsd_op_sig_describe(char *buf, size_t len, const struct op_sig *s); /* "all_reduce(count=8, ...)" */
uint64_t ccsd_op_sig_key(const struct op_sig *s); /* equal for ops ccsd_op_sig_same calls the same */

/* op_agree.c: ranks on different daemons agree on each op */
void ccsd_agree_launched(struct comm *c, const struct post *p, uint64_t seq);
void ccsd_agree_message(struct comm *c, const char *addr, const Ccs__PeerOp *m);
void ccsd_agree_release(struct comm *c); /* the comm failed or goes */

/* Op #seq while its local ranks arrive. It costs what its posts cost (each
 * charged one of quota_ops) and a bit per rank, whatever the comm's size:
 * the array by rank is made only when the op launches. */
struct slot {
  struct list link;
  uint64_t seq;
  uint64_t opened_ms; /* when its first rank posted */
  int nposted;
  struct post **posts; /* nposted of them, in arrival order */
  int cap;
  uint64_t posted[];   /* a bit per rank */
};
int ccsd_slot_has(const struct slot *sl, int rank);

/* A matched op: the posts of every local rank, and its run state (the
 * run layer's part, run/op.h) which comes back through run.on_done. */
struct xop {
  struct run_op run;
  struct list comm_link; /* in comm->running */
  struct comm *comm;
  struct post **posts;
  int nposts;
  uint32_t kind;
  uint64_t seq;
  enum sched_algo algo;
  char why[160];           /* why this algorithm (CCS_DEBUG=INFO) */
  int *part_node;          /* across daemons: each participant's node */
  void *scratch;           /* a barrier's bytes */
  size_t scratch_len;
  uint64_t launched_ms;    /* for the deadline of ops waiting on other daemons */
  struct membuf **held;    /* kept for the GPU after early replies (ccsd_xop_enqueued) */
  int nheld;
};

/* gpu_domain.c: which GPU runs an op whose local posts are posts[0..n)
 * (NULLs skipped): -1 when every buffer is host memory; else the device of
 * the first device buffer, which must reach every other (reach[a] has bit
 * b when GPU a can access GPU b's memory). -2 with rc and err when the
 * buffers cannot be used together: host and device mixed, device buffers
 * across daemons, GPUs without peer access, more ranks than a launch takes. */
int ccsd_gpu_op_device(struct post *const *posts, int n, int spans, const uint64_t *reach,
                       ccs_result_t *rc, char *err, size_t errlen);

/* tenant.c */
ccs_result_t ccsd_tenant_charge(struct daemon *d, uid_t uid, enum tenant_counter k,
                                uint64_t amount, struct tenant **ret, char *err, size_t errlen);
void ccsd_tenant_release(struct tenant *t, enum tenant_counter k, uint64_t amount);
const char *ccsd_tenant_counter_name(enum tenant_counter k);

static inline uint64_t ccsd_now_ms(const struct daemon *d) { return uv_now(d->loop); }

/* config.c */
void ccsd_config_defaults(struct ccsd_config *cfg);
void ccsd_config_resolve(struct ccsd_config *cfg); /* 0 = as the machine has */
int ccsd_config_set(struct ccsd_config *cfg, const char *key, const char *value, char *err,
                    size_t errlen);
int ccsd_config_load_file(struct ccsd_config *cfg, const char *path, int must_exist, char *err,
                          size_t errlen);
int ccsd_config_load_env(struct ccsd_config *cfg, char *err, size_t errlen);
void ccsd_config_format(const struct ccsd_config *cfg, char *buf, size_t len);
void ccsd_config_example(FILE *out);
int ccsd_config_is_key(const char *name);

/* lifecycle.c */
int ccsd_daemon_init(struct daemon *d, uv_loop_t *loop); /* d->cfg is set */
void ccsd_daemon_close(struct daemon *d);

void ccsd_metrics_record(struct daemon *d, uid_t uid, uint32_t kind, int nranks,
                         ccs_result_t status, uint64_t bytes, double seconds);
/* whose series: the caller's tenant, every tenant's apart, or all summed */
enum metrics_view { METRICS_TENANT, METRICS_PER_TENANT, METRICS_SUMMED };
char *ccsd_metrics_render(struct daemon *d, enum metrics_view view, uid_t uid, size_t *ret_len);
void ccsd_metrics_free(struct daemon *d);
int ccsd_metrics_http_start(struct daemon *d);
void ccsd_metrics_http_stop(struct daemon *d);

/* admin.c: ccsctl's commands */
void ccsd_admin(struct session *s, uint64_t req_id, const Ccs__Admin *m);

/* notify.c: systemd, when built with it */
int ccsd_systemd_listen_fd(void);
void ccsd_systemd_ready(struct daemon *d);
void ccsd_systemd_stopping(struct daemon *d);

/* server.c */
int ccsd_server_start(struct daemon *d);
void ccsd_server_stop(struct daemon *d);

/* session.c */
void ccsd_session_new(struct daemon *d, int fd);
/* One unsolicited reply saying why, best effort, then the close. */
void ccsd_session_refuse(int fd, ccs_result_t rc, const char *why);
void ccsd_session_close(struct session *s, const char *why);
int ccsd_session_send(struct session *s, const Ccs__Reply *reply);
int ccsd_session_reply(struct session *s, uint64_t req_id, ccs_result_t status, const char *error);
int ccsd_session_take_fd(struct session *s); /* the next fd in arrival order, or -1 */
void ccsd_session_check_io(struct session *s);

/* dispatch.c */
void ccsd_dispatch(struct session *s, const uint8_t *payload, size_t len);

/* memreg.c */
ccs_result_t ccsd_membuf_register(struct session *s, int fd, struct membuf **ret, char *err,
                                  size_t errlen);
/* NULL and CCS_ERR_PERMISSION when another connection registered id */
/* device memory: the fields were checked (ccsd_gpu_check_register) */
ccs_result_t ccsd_membuf_register_device(struct session *s, int fd, uint64_t size,
                                         const uint8_t *uuid, struct membuf **ret, char *err,
                                         size_t errlen);
ccs_result_t ccsd_membuf_register_ipc(struct session *s, const uint8_t *handle,
                                      const uint8_t *uuid, struct membuf **ret, char *err,
                                      size_t errlen);
struct membuf *ccsd_membuf_find(struct session *s, uint64_t id, ccs_result_t *ret_rc);
void ccsd_membuf_deregister(struct membuf *b);
void ccsd_membuf_ref(struct membuf *b);
void ccsd_membuf_unref(struct membuf *b);

/* submission.c */
struct submission *ccsd_submission_new(struct session *s, uint64_t req_id, int nposts);
void ccsd_submission_post_done(struct submission *sub, ccs_result_t status, const char *error);
void ccsd_submission_note(struct submission *sub, const char *info);
void ccsd_submission_orphan_all(struct session *s);

/* unique ids: issued signed, checked on init */
void ccsd_unique_id_sign(const struct daemon *d, struct ccs__unique_id *id);
int ccsd_unique_id_valid(const struct daemon *d, const struct ccs__unique_id *id);
double ccsd_unique_id_age(const struct daemon *d, const struct ccs__unique_id *id); /* -1: expired */

/* comm.c */
void ccsd_comm_init(struct session *s, uint64_t req_id, const Ccs__CommInit *m);
void ccsd_comm_name(const struct ccs__unique_id *id, uint8_t name[CCS__NAME_BYTES]);
struct comm *ccsd_comm_find(struct daemon *d, const uint8_t *name);
struct comm *ccsd_comm_create(struct daemon *d, const struct ccs__unique_id *id, int nranks,
                              const char *algo, int first_rank, ccs_result_t *rc, char *err,
                              size_t errlen);
ccs_result_t ccsd_comm_check_join(struct comm *c, int rank, int nranks, const char *algo, int pid);
void ccsd_comm_ready(struct comm *c);
struct member *ccsd_member_find(struct session *s, uint64_t handle);
void ccsd_comm_fail(struct comm *c, ccs_result_t error, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ccsd_member_leave(struct member *m, const char *why, int graceful);
const struct member *ccsd_comm_departed(const struct comm *c);
void ccsd_comm_ref(struct comm *c);
void ccsd_comm_unref(struct comm *c);

/* match.c */
void ccsd_post_submit(struct post *p);
void ccsd_comm_check_deadlines(struct comm *c);
void ccsd_post_free(struct post *p);
void ccsd_post_finish(struct post *p, ccs_result_t status, const char *error);

/* op.c: a matched op: its algorithm, its graph, where it runs */
void ccsd_op_launch(struct comm *c, struct post **posts, int nposts, uint64_t seq);
void ccsd_xop_done(struct xop *x);
void ccsd_xop_enqueued(struct xop *x); /* on a GPU: ranks with events get their reply */
void ccsd_comm_fail_pending(struct comm *c);

/* span.c: communicators across daemons */
void ccsd_span_message(struct daemon *d, const char *addr, const Ccs__PeerMsg *m);
void ccsd_span_peer_lost(struct daemon *d, const char *addr, const char *why);
void ccsd_span_joined(struct comm *c, struct member *m);  /* a local rank, root elsewhere */
void ccsd_span_ready(struct comm *c);                     /* the root: every rank arrived */
void ccsd_span_failed(struct comm *c);                    /* tell the others, close data */
void ccsd_span_free(struct comm *c);
void ccsd_span_stopping(struct daemon *d);                /* fails comms with ranks elsewhere */

void ccsd_xop_free(struct xop *x);

#endif
