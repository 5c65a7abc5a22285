/* The collectives layer: communicators, matching the ranks' ops, agreeing
 * on them across daemons, and launching them (plan/ compiles, run/ runs).
 * It knows nothing of client connections: the layer above gives it joins
 * and posts with the callbacks that answer them (coll_waiter, post_ops),
 * and the quota hooks a comm or a rank is charged through.
 *
 *   coll ── comms ── members[nranks]: ranks joined here, or served by
 *          │                        other daemons (remote)
 *          │      ├─ slots: op #k while its local ranks' posts arrive
 *          │      ├─ p2p: unmatched sends and receives
 *          │      └─ running: launched ops (xop), each a run_op below
 *          └─ agreements (agree.c), unique ids (unique_id.c)
 * Everything here lives on the loop thread. */
#ifndef CCSD_COLL_H
#define CCSD_COLL_H

#include <stdint.h>
#include <sys/types.h>
#include <uthash.h>
#include <uv.h>

#include "base/fair.h"
#include "base/list.h"
#include "plan/plan_cache.h"
#include "plan/tuner.h"
#include "run/gpu.h"
#include "run/net.h"
#include "run/op.h"
#include "run/share.h"
#include "wire.h"

#define CCSD_MAX_RANKS 4096

/* A send or a receive; every other kind is a collective. */
static inline int ccsd_p2p_kind(uint32_t kind) { return kind == CCS__SEND || kind == CCS__RECV; }

/* What the layer above charges a comm or a rank joined here to (its
 * tenants' quotas): a token released later, or NULL with rc and err. */
enum coll_charge { COLL_CHARGE_COMM, COLL_CHARGE_RANK };
struct coll_hooks {
  void *(*charge)(void *arg, uid_t uid, enum coll_charge what, ccs_result_t *rc, char *err,
                  size_t errlen);
  void (*release)(void *arg, void *token, enum coll_charge what);
  void *arg;
};

struct coll_config {
  double init_timeout_s, op_timeout_s, id_ttl_s;
  double peer_restart_grace_s; /* comms across a daemon that went are held this long */
  size_t peer_replay_bytes;    /* replay.c: a collective sending at most this keeps a copy */
  size_t chunk_bytes, stream_bytes, inline_bytes;
  int peer_connections;
  char algo[512]; /* the daemon's algorithm rules */
};

/* What restarts did to the comms here, counted for operators
 * (ccs_comm_restarts_total, docs/restart.md). */
enum coll_restart_event {
  RESTART_REJOINED_HERE,         /* made whole again after this daemon restarted, every rank here */
  RESTART_REJOINED_FROM_HOLDERS, /* the same, from the word of the daemons that held it (regather.c) */
  RESTART_REJOINED_THROUGH_ROOT, /* the same, through its root: none held it (refound.c) */
  RESTART_HOLDER_HEARD,          /* a daemon that held it gave its word, first time per rejoin */
  RESTART_HOLDER_LOST,           /* a daemon whose word it rejoined from went before it settled (once each) */
  RESTART_HELD,                  /* held here while another daemon of it was away (hold.c) */
  RESTART_RESUMED,               /* held, and went on once that daemon was back */
  RESTART_FAILED,                /* failed while rejoining or held, or could not be held */
  RESTART_EVENTS
};

struct coll {
  uv_loop_t *loop;
  struct coll_config cfg;
  char self[CCSD_ADDR_MAX];   /* where other daemons reach this one ("": alone) */
  struct executor *exec;
  struct gpu *gpu;            /* NULL: host-only */
  struct peers *peers;        /* NULL: this node only */
  struct link_model link;     /* a link to another daemon, as the tuner sees it */
  struct engine_pool *pool;   /* ops' scratch, kept between ops */
  struct run_shares *shares;  /* tenants' weights and accounts (run/share.h) */
  struct list comms;
  struct comm *comms_by_name; /* the same (uthash, keyed by table_key) */
  uint8_t id_key[32];         /* signs the unique ids this daemon issues */
  uint8_t table_key[16];      /* keys tables of names that come from outside */
  int silent;                 /* stopping for a restart: other daemons hold its comms, told nothing */
  int draining;               /* stopping once its ops across daemons finish (span.c) */
  uint64_t *next_id;          /* numbers for logs, shared with the layer above */
  uint64_t started_ms;        /* when this daemon started (the loop's time) */
  struct comm_failure *failures; /* comm.c: the last comms made again here that failed, let go */
  size_t nfailures;
  struct coll_hooks hooks;
  uint64_t restarts[RESTART_EVENTS];
};

/* id_ttl bounds how long an id may start a comm, not how long a comm
 * lives: a rejoin comes back to one that existed, in the first minutes
 * after the daemon started; later, ids expire as ever. */
#define CCSD_REJOIN_WINDOW_MS (10 * 60 * 1000)
static inline int ccsd_rejoin_window_open(const struct coll *co) {
  return uv_now(co->loop) - co->started_ms < CCSD_REJOIN_WINDOW_MS;
}

static inline uint64_t ccsd_now_ms_of(const struct coll *co) { return uv_now(co->loop); }
/* The same, read afresh: where a deadline starts. The loop's cached time
 * is from the start of its iteration, which may be before the call that
 * starts the deadline arrived (the loop spinning on rings, or preempted):
 * counted from it, the deadline would expire early. */
static inline uint64_t ccsd_fresh_ms_of(const struct coll *co) {
  uv_update_time(co->loop);
  return uv_now(co->loop);
}

/* Answers a join once: the comm is ready, or failed, or the join refused. */
struct coll_waiter {
  void (*done)(struct coll_waiter *w, ccs_result_t status, const char *error);
};

/* A rank back after its daemon restarted: where its calls of one channel
 * stood, and once every rank is back the channel's verdict (rejoin.c). */
struct coll_channel {
  int peer;        /* -1: the comm's collectives; else its sends to or receives from peer */
  int send;
  uint64_t done;   /* calls it knows finished */
  uint64_t taken;  /* calls it made (done, and those it had out) */
  uint64_t *retry; /* the numbers of those after them it must repeat itself, ascending */
  size_t nretry;
  uint64_t finished, retry_from; /* the verdict */
  uint64_t kept; /* sends across daemons: the last finished that its daemon keeps, to send again (0: none) */
  /* receives across daemons: the messages whose bytes reached the
   * receiver's daemon, taken or held there (0: none said) */
  uint64_t arrived;
};
struct coll_rejoin {
  int spans; /* the comm spans daemons: the others hold it for this one */
  Ccs__Rejoin *wire; /* with spans, or none made (n 0): the report as sent, for other daemons (refound.c) */
  size_t n;
  struct coll_channel ch[];
};
void ccsd_rejoin_free(struct coll_rejoin *r);
/* A rank's report, checked field by field (a channel per peer and
 * direction, a retry per call a journal holds); NULL with err. */
struct coll_rejoin *ccsd_rejoin_parse(const Ccs__Rejoin *m, int nranks, char *err, size_t errlen);

struct member {
  struct comm *comm;
  int rank;
  pid_t pid;
  int left;                  /* a local rank whose client destroyed it or went */
  void *quota;               /* a local rank: its charge (COLL_CHARGE_RANK) */
  struct coll_waiter *init;  /* until the comm is ready */
  int debug;                 /* CCS_DEBUG=INFO: replies say how each op ran */
  int remote;                /* served by the daemon at addr */
  char addr[CCSD_ADDR_MAX];
  uint64_t coll_seq;         /* collectives submitted so far */
  /* after this daemon dropped its collectives for their callers to repeat
   * (hold.c), or refused them (front/submit.c): the client's number of the
   * first, which its next one must carry again (one made before the client
   * saw that carries a later one); 0: none */
  uint32_t repeat_number;
  struct coll_rejoin *rejoin; /* back after a restart: its report, then its verdicts */
};

enum comm_state { COMM_JOINING, COMM_READY, COMM_FAILED };

struct comm {
  struct list link;
  struct coll *co;
  uint64_t id;
  UT_hash_handle hh;                /* in coll->comms_by_name */
  uint8_t name[CCS__NAME_BYTES];    /* from (root, secret, owner): how daemons name it */
  uint64_t table_key;
  uint8_t id_bytes[CCS_UNIQUE_ID_BYTES]; /* the unique id, for the root daemon */
  uid_t uid;
  struct run_share *share;          /* its tenant's weight and accounts (run/share.h) */
  int prio, prio_set;               /* its class here (base/fair.h), as its first local rank asked */
  void *quota;                      /* its charge (COLL_CHARGE_COMM) */
  double op_timeout_s;
  int nranks, joined, departed;
  struct member **members;
  enum comm_state state;
  ccs_result_t error;
  char error_text[CCS__ERROR_TEXT_MAX];
  uv_timer_t timer;  /* the init deadline, then the deadline of the oldest op */
  uint64_t created_ms;
  struct list slots; /* pending collectives, by op number */
  struct list p2p;   /* unmatched sends and receives */
  struct list running; /* launched ops */
  struct list queued;  /* matched ordered ops (slots) waiting for the running ones */
  int launching;       /* ccsd_comm_launch_queued is under way */
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
  int named;                /* found by name (CCS__NAMED_ID_MAGIC): newcomers never fail it */
  char label[64];           /* that name, for texts (where this daemon was told it) */
  struct list agreements;   /* agree.c: words heard on ops, not yet from every daemon */
  struct agree_recent *agree_recent; /* agree.c: what this daemon's ranks called lately */
  size_t np2p;
  struct plan_cache plans; /* its last small op's plan, for the next like it */
  struct comm_hold *hold;  /* hold.c: a daemon of it went; held until it is back */
  int unholdable;          /* hold.c: a daemon of it went, and it could not be held */
  int rejoining;           /* made again by its ranks after this daemon restarted */
  uint64_t rejoin_until_ms; /* rejoining across daemons: when it fails, not made yet */
  int refound;             /* made again through its root: every daemon of it restarted (refound.c) */
  int via_holders;         /* regather.c: made whole again from the word of the daemons that held it */
  struct regather *regather; /* span.c: the daemons that held it, heard so far */
  char (*let_go)[CCSD_ADDR_MAX]; /* regather.c: the daemons whose word a rejoin let go (one went):
                                  * those still up may fail it yet */
  int nlet_go;
  uint64_t coll_finished, coll_retry; /* the rejoin's verdict on its collectives (rejoin.c) */
  uint64_t *resumed;       /* regather.c: per node, the hold this daemon answered */
  uint64_t *node_finished; /* rejoin.c: per node, its collectives finished, where one node is one
                              behind (it runs the last again); NULL: all alike (coll_finished) */
  uint64_t *node_kept;     /* regather.c: per node, the collective whose messages it keeps (0: none) */
  struct replay *replay;   /* replay.c: the last collective across daemons finished here, what it sent */
  struct replay **replay_sends; /* replay.c: per pair of ranks, the last send across daemons finished */
  size_t nreplay_sends;
  uint64_t replay_sends_made;
  char *replay_spare;      /* replay.c: a copy's buffer let go, for the next */
  size_t replay_spare_cap;
  int replaying;           /* replay.c: its messages being sent again (the comm's connections stay) */
  int owed;                /* draining: another daemon sent it what no op here took yet */
  char *barrier_bytes;     /* op.c: 2 a rank, what a barrier across daemons moves */
  int refs;          /* members, xops, the timer handle */
  int gone;          /* unreferenced: leaves the list once its timer closed; walks skip it */
  int unnamed;       /* found no more by its name (failed as it formed, a daemon gone: ccsd_comm_fail) */
};

struct p2p_count {
  int from, to;
  uint32_t n;
};

/* A registered buffer as an op sees it. */
struct coll_buf {
  void *base; /* NULL: none */
  size_t size;
  int device; /* -1: host memory */
};

struct post;
/* How a post is answered and let go; the layer above made the post. */
struct post_ops {
  /* Its op is about to write its outputs (launched); NULL: not told. */
  void (*started)(struct post *p);
  /* The rank's answer, once, when the op is over. */
  void (*reply)(struct post *p, ccs_result_t status, const char *error);
  void (*note)(struct post *p, const char *info); /* how it ran (CCS_DEBUG=INFO), before reply */
  void (*release)(struct post *p); /* its buffers are no longer touched: frees p */
};

/* One rank's part of one op. */
struct post {
  struct list link;
  const struct post_ops *ops;
  struct member *member;
  uint32_t kind, dtype, redop;
  uint64_t count;
  uint64_t whole_count; /* a part of a call cut in parts: the call's count; 0: a call */
  int root; /* or the peer of a send/recv */
  struct coll_buf send, recv;
  uint64_t send_off, send_len, recv_off, recv_len;
  uint64_t seq;
  uint64_t posted_ms;
  uint64_t posted_ns; /* uv_hrtime, for the latency histogram */
  struct gpu_order order; /* its place in the client's CUDA stream (flags NULL: none) */
  int ordered; /* runs after the comm's earlier ops finish (a host stream's op) */
  uint32_t number; /* a collective: its client's number for it plus one (low 32 bits); 0: none */
  int replied;
  const char *algo; /* the algorithm its op runs with, once launched (sched_algo_name); else NULL */
};

/* What a rank called: the arguments every rank of an op must agree on. */
struct op_sig {
  uint32_t kind, dtype, redop;
  uint64_t count;
  int root;
  uint64_t whole_count; /* compared among a daemon's ranks only (agree.c speaks of the rest) */
};
struct op_sig ccsd_op_sig_of(const struct post *p);
int ccsd_op_sig_same(const struct op_sig *a, const struct op_sig *b); /* redop, root where used */
int ccsd_op_sig_describe(char *buf, size_t len, const struct op_sig *s); /* "all_reduce(count=8, ...)" */
uint64_t ccsd_op_sig_key(const struct op_sig *s); /* equal for ops ccsd_op_sig_same calls the same (whole_count aside) */

/* Op #seq while its local ranks arrive. It costs what its posts cost (each
 * charged one of quota_ops) and a bit per rank, whatever the comm's size:
 * the array by rank is made only when the op launches. */
struct slot {
  struct list link;
  uint64_t seq;
  uint64_t opened_ms; /* when its first rank posted */
  int nposted;
  int ordered; /* a post of it is */
  struct post **posts; /* nposted of them, in arrival order */
  int cap;
  uint64_t posted[];   /* a bit per rank */
};
int ccsd_slot_has(const struct slot *sl, int rank);

/* A matched op: the posts of every local rank, and its run state (the
 * run layer's part, run/op.h) which comes back through run.on_done. */
#define CCSD_WHY_MAX 160
struct xop {
  struct run_op run;
  struct list comm_link; /* in comm->running */
  struct comm *comm;
  struct post **posts;
  int nposts;
  uint32_t kind;
  uint64_t seq;
  enum sched_algo algo;
  char *why;               /* why this algorithm, when explained (CCS_DEBUG=INFO, traces): out of
                              the op itself, which then fits the allocator's per-thread cache */
  int *part_node;          /* across daemons: each participant's node */
  uint64_t launched_ms;    /* for the deadline of ops waiting on other daemons */
  int plan_kept;           /* its plan goes back to comm->plans, made for key plan_gen */
  size_t sent_cap;         /* replay.c: the size of run.sent */
  uint64_t plan_gen;
};

/* unique_id.c: issued signed for a uid, checked on join */
void ccsd_unique_id_issue(const struct coll *co, uid_t owner, struct ccs__unique_id *ret);
void ccsd_unique_id_sign(const struct coll *co, struct ccs__unique_id *id); /* tests: ids of chosen secrets */
int ccsd_unique_id_valid(const struct coll *co, const struct ccs__unique_id *id);
double ccsd_unique_id_age(const struct coll *co, const struct ccs__unique_id *id); /* -1: expired */
void ccsd_comm_name(const struct ccs__unique_id *id, uint8_t name[CCS__NAME_BYTES]);
/* The id of the comm of this name for owner, meeting at root (numeric
 * ADDR:PORT, or this daemon's own address): the same on every daemon. */
void ccsd_named_id(uid_t owner, const char *name, const char *root, struct ccs__unique_id *ret);

/* comm.c */
/* Rank `rank` of nranks joins the comm of id (checked by the caller: its
 * owner is the caller's uid, its root numeric) for a client of process
 * pid; its init is answered through w. CCS_OK and the member, which
 * owns rejoin (a report, after a restart); otherwise an error and err, w
 * is never called, and rejoin stays the caller's. */
ccs_result_t ccsd_comm_join(struct coll *co, const struct ccs__unique_id *id, const char *label,
                            int nranks, int rank, const char *algo, double op_timeout_s, int debug,
                            int prio, pid_t pid, struct coll_rejoin *rejoin, struct coll_waiter *w,
                            struct member **ret, char *err, size_t errlen);
struct comm *ccsd_comm_find(struct coll *co, const uint8_t *name);
void ccsd_comm_failures_free(struct coll *co);
/* "1,3,4"-like list of the ranks at node (a comm across daemons). */
void ccsd_comm_ranks_at(const struct comm *c, int node, char *buf, size_t len);
/* Why the comm named so, across daemons, was let go here (its ranks here
 * destroyed it; or it failed after this daemon restarted), with its error
 * in *error; NULL when it was not (or no longer is) known. */
const char *ccsd_comm_closed_here(const struct coll *co, const uint8_t *name, ccs_result_t *error);
struct comm *ccsd_comm_create(struct coll *co, const struct ccs__unique_id *id, int nranks,
                              const char *algo, int first_rank, ccs_result_t *rc, char *err,
                              size_t errlen);
ccs_result_t ccsd_comm_check_join(struct comm *c, int rank, int nranks, const char *algo, int pid);
/* A comm by name's name, for texts: printable, cut to fit. */
void ccsd_comm_set_label(struct comm *c, const char *label);
/* A newcomer to a comm found by name: why it cannot join, in err. */
void ccsd_comm_named_conflict(const struct comm *c, const char *label, int nranks, int rank,
                              const char *algo, char *err, size_t errlen);
void ccsd_comm_ready(struct comm *c);
void ccsd_comm_init_timed_out(struct comm *c); /* its init (or rejoin) waited too long */
/* Joining, and no rank known here made a call: its first inits, or inits
 * sent again after a restart (a rejoin that made no call). */
int ccsd_comm_forming(const struct comm *c);
void ccsd_comm_fail(struct comm *c, ccs_result_t error, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A local rank's client destroyed it (graceful) or went away. */
void ccsd_member_leave(struct member *m, const char *why, int graceful);
/* m's init, if still unanswered, answered now (once). */
void ccsd_member_answer_init(struct member *m, ccs_result_t status, const char *text);
/* A local rank whose join was refused while the comm still forms (its
 * client got the error, no handle): gone as if it never came. */
void ccsd_member_withdraw(struct member *m);
const struct member *ccsd_comm_departed(const struct comm *c);
void ccsd_comm_ref(struct comm *c);
void ccsd_comm_unref(struct comm *c);

/* rejoin.c: every rank is back; the verdicts of those that rejoined are
 * in their reports, and the collectives' numbering goes on from them */
ccs_result_t ccsd_rejoin_settle(struct comm *c);

/* hold.c: a comm across daemons whose daemon at node went (its
 * connections closed) waits peer_restart_grace for it to come back. 0:
 * held (or held already for that daemon); -1: it cannot be (the caller
 * fails it). */
int ccsd_hold_start(struct comm *c, int node, const char *why);
/* x failed while its comm is (now) held: its posts wait with the comm,
 * unanswered (1); 0: x is answered as ever. */
int ccsd_hold_keep(struct xop *x);
void ccsd_hold_op_done(struct xop *x); /* x finished while its comm is held */
void ccsd_hold_defer(struct comm *c, struct post *p); /* a send/recv across daemons, for after */
void ccsd_hold_resume(struct comm *c, const char *addr, const struct peer_resume *m);
void ccsd_hold_end(struct comm *c); /* the comm failed or goes: what waited is answered with its error */
int ccsd_hold_waiting(const struct comm *c); /* sends and receives wait for the hold to end */
/* m's collective numbered `number` (its client's, ccs.proto's Op.number)
 * was dropped or refused: its next must carry the lowest such again
 * (member.repeat_number). */
void ccsd_member_repeat_from(struct member *m, uint32_t number);

/* replay.c: a collective across daemons that sends at most
 * peer_replay_bytes keeps a copy of what it sent (prepare, at launch); the
 * comm keeps the last finished one's (keep); after a daemon of the comm
 * restarted one collective behind, its messages go again to the daemons
 * marked in rerun (per node), and theirs are taken (start: 0, or -1 when
 * out of memory; once at most). */
void ccsd_replay_prepare(struct xop *x);
void ccsd_replay_keep(struct xop *x);
uint64_t ccsd_replay_kept(const struct comm *c); /* the collective kept; 0: none */
int ccsd_replay_start(struct comm *c, const uint8_t *rerun);
/* Sends across daemons too (at most peer_replay_bytes kept in all, the
 * oldest out first): the number + 1 of the last send finished from rank
 * from to rank to that is kept (0: none), and that message sent again. */
uint32_t ccsd_replay_sent(const struct comm *c, int from, int to);
int ccsd_replay_send_again(struct comm *c, int from, int to);
void ccsd_replay_free(struct comm *c);

/* match.c */
void ccsd_post_submit(struct post *p);
/* The slot of op #seq made of posts (NULLs skipped); NULL when out of memory. */
struct slot *ccsd_slot_of(struct comm *c, struct post *const *posts, int n, uint64_t seq);
void ccsd_slot_drop(struct slot *sl, ccs_result_t status, const char *error); /* its posts answered */
void ccsd_comm_check_deadlines(struct comm *c);
/* Answers p (unless it was) and lets it go. */
void ccsd_post_finish(struct post *p, ccs_result_t status, const char *error);
void ccsd_comm_fail_pending(struct comm *c);
/* The queued ops, in order, while none runs: after an op of c finished. */
void ccsd_comm_launch_queued(struct comm *c);

/* op.c: a matched op: its algorithm, its graph, where it runs */
void ccsd_op_launch(struct comm *c, struct post **posts, int nposts, uint64_t seq);

/* device.c: which GPU runs an op whose local posts are posts[0..n) (NULLs
 * skipped): -1 when every buffer is host memory; else the device of the
 * first device buffer, which must reach every other (reach[a] has bit b
 * when GPU a can access GPU b's memory). -2 with rc and err when the
 * buffers cannot be used together: host and device mixed, device buffers
 * across daemons, GPUs without peer access, more ranks than a launch takes. */
int ccsd_gpu_op_device(struct post *const *posts, int n, int spans, const uint64_t *reach,
                       ccs_result_t *rc, char *err, size_t errlen);

/* agree.c: ranks on different daemons agree on each op; a daemon speaks
 * of an op that has waited CCSD_AGREE_AFTER_MS for the others (slow) */
#define CCSD_AGREE_AFTER_MS 10
void ccsd_agree_launched(struct comm *c, const struct post *p, uint64_t seq);
void ccsd_agree_slow(struct comm *c, uint64_t seq);
void ccsd_agree_message(struct comm *c, const char *addr, const struct peer_op *m);
void ccsd_agree_release(struct comm *c); /* the comm failed or goes */

/* span.c: communicators across daemons */
void ccsd_span_message(struct coll *co, const char *addr, const struct peer_msg *m);
void ccsd_span_peer_lost(struct coll *co, const char *addr, const char *why);
void ccsd_span_joined(struct comm *c, struct member *m);  /* a local rank, root elsewhere */
/* Rank `rank`, served by the daemon at addr, as a member of c; NULL (c
 * failed) when out of memory. */
struct member *ccsd_span_remote_member(struct comm *c, int rank, pid_t pid, const char *addr);
void ccsd_span_ready(struct comm *c);                     /* the root: every rank arrived */
void ccsd_span_failed(struct comm *c);                    /* tell the others, close data */
void ccsd_span_free(struct comm *c);
void ccsd_span_stopping(struct coll *co);                 /* fails comms with ranks elsewhere */
/* Stopping (SIGTERM) while other daemons would hold this one's comms for
 * its restart: 1 while it must not stop yet (an op across daemons runs
 * here, or another daemon sent a comm what nothing here took yet: that
 * comm launches again), 0 once quiet. Called every millisecond. */
int ccsd_span_drain_step(struct coll *co);
/* No collective launches: the daemon is stopping, and nothing another
 * daemon sent this comm waits here. */
static inline int ccsd_comm_drained(const struct comm *c) { return c->co->draining && !c->owed; }
int ccsd_span_node_of(const struct comm *c, const char *addr); /* -1: none of its daemons */
/* The map (rank r at the daemon at rank_addr[r]) and the data connections. -1: out of memory */
int ccsd_span_map(struct comm *c, char (*rank_addr)[CCSD_ADDR_MAX]);
void ccsd_span_tell_failed(struct coll *co, const char *addr, const uint8_t *name, ccs_result_t status,
                           const char *error);

/* regather.c: this daemon restarted; a comm of its ranks that spans
 * daemons is made again from what the daemons that held it say (hold.c)
 * and what its ranks report when they rejoin. */
void ccsd_regather_message(struct coll *co, const char *addr, const struct peer_rejoin *m);
void ccsd_regather_check(struct comm *c); /* a local rank rejoined: maybe every rank is back */
int ccsd_regather_involved(const struct comm *c, const char *addr);
void ccsd_regather_let_go(struct comm *c); /* one of them went before it settled */
int ccsd_regather_was_let_go(const struct comm *c, const char *addr);
void ccsd_regather_free(struct comm *c);

/* refound.c: every daemon of a comm restarted, none holds it; its root
 * makes it again from every rank's report */
/* a rejoining comm that spans daemons: its first rank here (or, at the
 * root, through another daemon) made calls, or sent its init again */
void ccsd_refound_wait(struct comm *c, int made_calls);
void ccsd_refound_join(struct coll *co, const char *addr, const struct peer_join *j,
                       const struct ccs__unique_id *id); /* the root: a PeerJoin with a report */
int ccsd_refound_reports(struct comm *c, const char *addr, const struct peer_ready *rd); /* -1: failed */

#endif
