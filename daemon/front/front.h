/* The front of the daemon: client connections, requests (protobuf stops
 * here), the operator's commands and metrics, configuration, tenants and
 * their quotas, registered memory. Everything here lives on the libuv loop
 * thread; it calls the collectives layer (coll/) below it.
 *
 *   daemon ── sessions (one per client connection)
 *          │     ├─ buffers   registered mappings (refcounted: ops in flight
 *          │     │            keep a buffer mapped after its owner left)
 *          │     ├─ comms     this client's ranks in comms (client_comm)
 *          │     └─ submissions  requests awaiting their reply
 *          ├─ tenants (one per uid with anything charged)
 *          └─ coll: the comms, and below it the executor, GPUs, network
 */
#ifndef CCSD_FRONT_H
#define CCSD_FRONT_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <uthash.h>
#include <uv.h>

#include "accept.h"
#include "base/list.h"
#include "base/textbuf.h"
#include "coll/coll.h"
#include "front/ipc_blocks.h"
#include "wire.h"

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

#define CCSD_MAX_WEIGHTS 256 /* RUN_SHARE_RULES_MAX */
struct ccsd_config {
  char socket_path[108];
  unsigned socket_mode;
  int threads;
  double init_timeout_s;
  double peer_restart_grace_s; /* comms across a daemon that went wait this long for it */
  size_t peer_replay_bytes;     /* a collective across daemons sending at most this keeps a copy */
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
  char id_key_file[120];       /* the unique ids' key, kept across restarts ("": the socket's + .id-key) */
  int peer_encrypt;            /* data between daemons encrypted too */
  char transport[16];          /* how data moves between daemons (transport.h), or "auto" */
  char ib_library[256];        /* verbs: libibverbs to load ("": libibverbs.so.1) */
  char ib_devices[256];        /* verbs: "dev[:port],..." ("": every active port) */
  int ib_gid_index;            /* verbs: GID table entry; -1: chosen by type and address family */
  uint64_t link_capacity;      /* bytes a second to each daemon; 0: measured */
  int executor_priority;       /* enum executor_priority (run/executor.h) */
  int poll_spin_us;            /* the loop spins on the rings this long after their last work */
  int peer_max_connections;
  uint64_t peer_unexpected_bytes, peer_unexpected_total; /* held before their receive */
  char tenant_weights[1024];   /* as written ("alice:3,bob:1,1001:2"), and read: */
  uint32_t weight_uids[CCSD_MAX_WEIGHTS];
  double weights[CCSD_MAX_WEIGHTS];
  int nweights;
  double tenant_max_share;     /* of the executor's and each link's capacity, per tenant */
};

/* One per uid with anything charged to it. */
struct tenant {
  struct list link;  /* in daemon->tenants */
  UT_hash_handle hh; /* in daemon->tenants_by_uid */
  struct daemon *d;
  uid_t uid;
  uint64_t used[TENANT_COUNTERS];
  uint64_t charges; /* outstanding charges; freed at zero */
  struct run_share *share; /* its weight, and what it was given (run/share.h) */
};

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
/* calls of a collective run with an algorithm (its name: sched_algo_name) */
struct algo_counter {
  uint32_t kind;
  const char *algo;
  uint64_t ops;
};
#define CCSD_ALGO_COUNTERS 64
struct ccsd_metrics {
  struct op_counter *counters;
  size_t ncounters, cap;
  struct algo_counter algos[CCSD_ALGO_COUNTERS];
  size_t nalgos;
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
  uv_signal_t sig_term, sig_int, sig_hup;
  uv_timer_t drain; /* a stop waits for the ops under way across daemons (main.c) */
  uint64_t drain_until_ms, drain_quiet_ms; /* its deadline; since when nothing kept it */
  struct list sessions;
  struct list tenants;
  struct tenant *tenants_by_uid; /* the same (uthash): uids come from peers too */
  struct membuf *buffers_by_id; /* every registered buffer (uthash) */
  size_t nbuffers, max_buffers; /* mappings, and half of vm.max_map_count */
  uv_timer_t housekeeping; /* io deadlines of sessions, the rings' beats */
  uint32_t housekeeping_ms;
  uint64_t started_ms;
  int socket_activated; /* the listening socket is systemd's: not ours to unlink */
  uv_timer_t watchdog;
  int watchdog_on;
  uint64_t watchdog_seen;
  struct ccsd_metrics metrics;
  uv_tcp_t metrics_server; /* optional HTTP listener (metrics_listen) */
  int metrics_on;
  struct list http_conns;
  int nhttp_conns;
  struct list rings; /* connections' fast paths (ring.c) */
  uint32_t nrings;   /* of them, those whose connection is open */
  uint64_t ring_calls; /* calls taken from the rings, ever */
  uint32_t ring_calls_open; /* of them, not yet answered: the loop polls for their answers */
  uint64_t next_id; /* sessions, comms: numbers for logs */
  int stopping;
  char gpu_absent[200];      /* why coll.gpu is NULL (host-only) */
  struct coll coll;          /* comms; its executor, GPUs, network side and scratch */
  struct run_shares shares;  /* tenants' weights and accounts (run/share.h; shares.c) */
  uv_timer_t share_timer;    /* samples their current shares */
  struct share_sample *samples;
  int argc;                  /* the command line, read again by a reload (NULL: none) */
  char **argv;
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
  struct ipc_block *ipc; /* opened from a cudaIpcMemHandle: a view into this block */
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
  double credit; /* its part of a read this turn (ccsd_tenant_turns) */
  uint64_t connected_ms, last_rx_ms, last_tx_ms;
  struct ccs__frame_reader rd;
  uint64_t rx_total;      /* bytes received */
  uint64_t rx_frame_end;  /* stream offset past the last frame handled */
  struct pending_fd fds[CCSD_MAX_PENDING_FDS];
  int nfds;
  struct list outq;
  size_t out_bytes;
  struct list buffers;
  struct list ipc_blocks; /* legacy CUDA IPC blocks opened (ipc_blocks.h) */
  struct list comms;                    /* struct client_comm */
  struct client_comm *comms_by_handle;  /* the same (uthash) */
  struct list submissions;
  uint64_t next_comm_handle;
  struct ring *ring; /* the fast path, once set up (ring.c) */
  struct ccs__journal *journal; /* its calls' marks, once set up (journal.c) */
  uint32_t protocol;            /* the one its hello spoke (ccs__protocol_served) */
};

/* A request waiting for its reply: a Submit (one post per op) or a CommInit. */
struct submission {
  struct coll_waiter waiter; /* a CommInit's: the comm is ready (or not) */
  struct list link;         /* in session->submissions */
  struct session *session;  /* NULL once the client is gone */
  struct daemon *d;
  uint64_t req_id;
  int via_ring; /* answered through the completion ring, not the socket */
  int nposts, ndone;
  ccs_result_t status;
  char *error;
  uint64_t comm_handle; /* a CommInit's reply carries it (and the comm's identity, a rejoin's verdicts) */
  uint64_t seq;         /* a call of one collective op: the op's number, for the journal */
  char *info;           /* how its ops ran, for CCS_DEBUG=INFO */
};

/* A client's rank in a comm, by the handle its connection knows it by. */
struct client_comm {
  struct list link;  /* in session->comms */
  UT_hash_handle hh; /* in session->comms_by_handle */
  uint64_t handle;
  struct member *member;
  int refused; /* its init failed with its comm: no handle went out, it goes at the next sweep */
};
struct client_comm *ccsd_client_comm_find(struct session *s, uint64_t handle);
/* The comms whose init failed with them, let go (a name they hold is
 * free again): outside any walk of comms or sessions. */
void ccsd_client_comms_sweep(struct session *s);
/* The client is done with it (destroyed, or gone): coll hears it left. */
void ccsd_client_comm_drop(struct session *s, struct client_comm *cc, const char *why, int graceful);

/* A post as the front made it: whose request, which buffers, what charge. */
struct client_post {
  struct post post;
  struct daemon *d;
  struct submission *sub;
  struct membuf *sendbuf, *recvbuf;
  struct tenant *tenant; /* charged one of quota_ops */
};
extern const struct post_ops ccsd_client_post_ops; /* post.c */
void ccsd_client_post_free(struct client_post *p); /* never submitted */

/* id_key.c: the key of len bytes that signs unique ids, from path, made
 * there (*ret_made) when there is none. -1 (why says it) when the file is
 * not the daemon's own or cannot be made. */
int ccsd_id_key_load(const char *path, uint8_t *key, size_t len, int *ret_made, char *why,
                     size_t whylen);

/* tenant.c */
ccs_result_t ccsd_tenant_charge(struct daemon *d, uid_t uid, enum tenant_counter k,
                                uint64_t amount, struct tenant **ret, char *err, size_t errlen);
void ccsd_tenant_release(struct tenant *t, enum tenant_counter k, uint64_t amount);
/* The control path's turns: how many times (reads of a socket, batches
 * of a ring) one of t's connections may be served this round of the
 * loop: `per` times t's weight, shared among t's connections, so that
 * tenants, not connections, share the loop by weight. What is not a whole
 * turn waits in *credit while the connection stays busy; one with
 * nothing left to take loses it (ccsd_tenant_idle). */
int ccsd_tenant_turns(struct tenant *t, double *credit, double per);
double ccsd_tenant_weight(const struct tenant *t);
static inline void ccsd_tenant_idle(double *credit) { *credit = 0; }
const char *ccsd_tenant_counter_name(enum tenant_counter k);
/* coll's quota hooks (arg: the daemon) */
void *ccsd_tenant_coll_charge(void *arg, uid_t uid, enum coll_charge what, ccs_result_t *rc,
                              char *err, size_t errlen);
void ccsd_tenant_coll_release(void *arg, void *token, enum coll_charge what);

static inline uint64_t ccsd_now_ms(const struct daemon *d) { return uv_now(d->loop); }

/* config.c */
void ccsd_config_defaults(struct ccsd_config *cfg);
void ccsd_config_resolve(struct ccsd_config *cfg); /* 0 = as the machine has */
int ccsd_config_set(struct ccsd_config *cfg, const char *key, const char *value, char *err,
                    size_t errlen);
int ccsd_config_load_file(struct ccsd_config *cfg, const char *path, int must_exist, char *err,
                          size_t errlen);
int ccsd_config_load_env(struct ccsd_config *cfg, char *err, size_t errlen);
/* Every source in order: defaults, the file (--config), CCS_* variables,
 * the command line's --KEY=VALUE; resolved. */
int ccsd_config_load(struct ccsd_config *cfg, int argc, char **argv, char *err, size_t errlen);

/* reload.c: the sources read again off the loop, what may change applied;
 * the answer to the admin request req_id of session session_id (0: none). */
void ccsd_reload_start(struct daemon *d, uint64_t session_id, uint64_t req_id);

/* shares.c */
void ccsd_shares_configure(struct daemon *d); /* the config's weights to the run layer */
void ccsd_shares_start(struct daemon *d);
void ccsd_shares_stop(struct daemon *d);
void ccsd_shares_current(struct daemon *d, uid_t uid, double *exec_share, double *net_share);
void ccsd_shares_render(struct textbuf *t, struct daemon *d, int all, uid_t uid, int json, int raw);
void ccsd_config_format(const struct ccsd_config *cfg, char *buf, size_t len);
void ccsd_config_example(FILE *out);
void ccsd_config_table(FILE *out); /* Markdown, for the documentation */
int ccsd_config_is_key(const char *name);

/* lifecycle.c */
int ccsd_daemon_init(struct daemon *d, uv_loop_t *loop); /* d->cfg is set */
void ccsd_daemon_close(struct daemon *d);

void ccsd_metrics_record(struct daemon *d, uid_t uid, uint32_t kind, int nranks,
                         ccs_result_t status, uint64_t bytes, double seconds);
/* One call of collective kind that ran with algorithm algo (NULL: none ran). */
void ccsd_metrics_record_algo(struct daemon *d, uint32_t kind, const char *algo);
/* whose series: the caller's tenant, every tenant's apart, or all summed */
enum metrics_view { METRICS_TENANT, METRICS_PER_TENANT, METRICS_SUMMED };
char *ccsd_metrics_render(struct daemon *d, enum metrics_view view, uid_t uid, size_t *ret_len);
void ccsd_metrics_free(struct daemon *d);
/* uid's calls completed well, and their bytes times the bus factor */
void ccsd_metrics_tenant_totals(const struct daemon *d, uid_t uid, uint64_t *ops, double *bus_bytes);
void ccsd_shares_metrics(struct textbuf *o, struct daemon *d, enum metrics_view view, uid_t uid);
int ccsd_metrics_http_start(struct daemon *d);
void ccsd_metrics_http_stop(struct daemon *d);

/* admin.c: ccsctl's commands */
void ccsd_admin(struct session *s, uint64_t req_id, const Ccs__Admin *m);
void ccsd_admin_reply(struct session *s, uint64_t req_id, ccs_result_t rc, const char *text);

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
/* One error reply saying what the client did wrong, then the close. */
void ccsd_session_protocol_error(struct session *s, const char *what);
int ccsd_session_send(struct session *s, const Ccs__Reply *reply);
int ccsd_session_reply(struct session *s, uint64_t req_id, ccs_result_t status, const char *error);
int ccsd_session_take_fd(struct session *s); /* the next fd in arrival order, or -1 */
void ccsd_session_check_io(struct session *s);

/* dispatch.c */
void ccsd_dispatch(struct session *s, const uint8_t *payload, size_t len);

/* memreg.c */
/* fd is a memfd of exactly `bytes`, sealed against shrinking and growing
 * (`what` names it in err). */
ccs_result_t ccsd_memfd_check(int fd, size_t bytes, const char *what, char *err, size_t errlen);
ccs_result_t ccsd_membuf_register(struct session *s, int fd, struct membuf **ret, char *err,
                                  size_t errlen);
/* NULL and CCS_ERR_PERMISSION when another connection registered id */
/* device memory: the fields were checked (ccsd_gpu_check_register) */
ccs_result_t ccsd_membuf_register_device(struct session *s, int fd, uint64_t size,
                                         const uint8_t *uuid, struct membuf **ret, char *err,
                                         size_t errlen);
/* addr and len: the allocation in the client's addresses */
ccs_result_t ccsd_membuf_register_ipc(struct session *s, const uint8_t *handle,
                                      const uint8_t *uuid, uint64_t addr, uint64_t len,
                                      struct membuf **ret, char *err, size_t errlen);
struct membuf *ccsd_membuf_find(struct session *s, uint64_t id, ccs_result_t *ret_rc);
void ccsd_membuf_deregister(struct membuf *b);
void ccsd_membuf_ref(struct membuf *b);
void ccsd_membuf_unref(struct membuf *b);

/* submit.c: one op of a call, as either path brings it (a Submit's Op, a
 * ring entry) */
struct op_buf {
  uint64_t buffer, offset, length;
  int present;
};
struct op_args {
  uint64_t comm;
  uint32_t kind, dtype, redop;
  int32_t root;
  uint64_t count;
  uint64_t whole_count; /* a part of a call cut in parts: the call's count (ccs.proto) */
  struct op_buf send, recv;
  int ordered; /* after the comm's earlier ops (the rings' CCS__RING_OP_ORDERED) */
  uint32_t number; /* a collective: the client's number for it (ccs.proto's Op.number) */
};
/* Checks the n ops of call `id` and posts them, all or none; the answer
 * goes back the way the call came (via_ring: the completion ring). */
/* order: the call's place in the client's CUDA stream (ring.c), or NULL */
void ccsd_submit(struct session *s, uint64_t id, const struct op_args *ops, size_t n,
                 const struct gpu_order *order, int via_ring);

/* ring.c: the fast path (proto/ring.h) */
/* The rings and doorbell of a RingSetup (fds taken from the session). */
void ccsd_ring_setup(struct session *s, uint64_t req_id);

/* journal.c: where a connection's calls are marked started and finished
 * (proto/journal.h) */
void ccsd_journal_setup(struct session *s, uint64_t req_id);
void ccsd_journal_close(struct session *s); /* the session closes */
/* marks call req_id of s (no journal, or a client gone: nothing) */
/* seq: a call of one collective op: its number (from 1); 0: none. */
void ccsd_journal_mark(struct session *s, uint64_t req_id, int via_ring, uint32_t state, uint64_t seq);
void ccsd_ring_close(struct session *s); /* the session closes */
/* Every ring's daemon_beat counted up: the loop runs (housekeeping). */
void ccsd_rings_beat(struct daemon *d);
/* Takes what the rings hold, up to a bound per connection: how many
 * batches were taken. */
int ccsd_rings_poll(struct daemon *d);
/* Looks at the rings, pausing between looks, until one has work (1) or
 * uv_hrtime() reaches until_ns (0): no system call. */
int ccsd_rings_watch(struct daemon *d, uint64_t until_ns);
/* A batch's answer through its connection's completion ring. */
void ccsd_ring_complete(struct session *s, uint64_t req_id, ccs_result_t status, const char *error);
/* Before the loop sleeps: clients ring the doorbell from now on. 1 when a
 * ring got work meanwhile (then the loop must not sleep). */
int ccsd_rings_arm(struct daemon *d);
void ccsd_rings_disarm(struct daemon *d);

/* loop.c: libuv's loop, spinning on the rings while they have work */
void ccsd_loop_run(struct daemon *d);

/* submission.c */
struct submission *ccsd_submission_new(struct session *s, uint64_t req_id, int nposts, int via_ring);
void ccsd_submission_post_done(struct submission *sub, ccs_result_t status, const char *error);
void ccsd_submission_note(struct submission *sub, const char *info);
void ccsd_submission_orphan_all(struct session *s);

/* dispatch.c */
void ccsd_comm_init(struct session *s, uint64_t req_id, const Ccs__CommInit *m);

#endif
