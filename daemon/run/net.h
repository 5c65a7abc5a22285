/* Other nodes' daemons. One thread owns the transport: it accepts and
 * opens connections, greets (protocol version), sends heartbeats, takes
 * the ops' SEND and RECV tasks as they become ready and posts them (and
 * runs small ops' computations itself, sparing a wake-up per step), and
 * hands what arrives to the loop thread (control messages, lost peers) or
 * to the executor's bookkeeping (finished tasks).
 *
 * Each pair of daemons keeps a control connection (joins, readiness,
 * failures, heartbeats); each communicator spanning daemons has its own
 * data connections per pair (peer_connections of them), so that failing a
 * communicator is closing its connections, which completes everything
 * posted on them. */
#ifndef CCSD_RUN_NET_H
#define CCSD_RUN_NET_H

#include <stddef.h>
#include <stdint.h>
#include <uthash.h>
#include <uv.h>

#include "plan/tuner.h"
#include "run/op.h"
#include "run/peer_msg.h"

struct executor;
struct peers;
struct net_comm;

#define CCSD_ADDR_MAX 64
/* Chunks are messages between daemons: a root's chunk size outside these
 * bounds is refused (1 B would make a task per byte, a huge one wraps the
 * task count). */
#define CCSD_PEER_CHUNK_MIN 4096u
#define CCSD_PEER_CHUNK_MAX (64u << 20)

/* What the network side is started with (the daemon's settings). */
struct peers_options {
  char transport[16];            /* by name (transport.h: ccs_transport_find), or "auto" */
  const char *ib_library, *ib_devices; /* transport_params' */
  int ib_gid_index;
  char listen[CCSD_ADDR_MAX];    /* HOST:PORT */
  char advertise[CCSD_ADDR_MAX]; /* or empty */
  const char *cluster_key_file;
  int encrypt;
  size_t max_connections;
  uint64_t unexpected_bytes, unexpected_total;
  double heartbeat_s, peer_timeout_s, io_timeout_s;
  /* after a hand-over or a completion the thread polls its connections
   * without sleeping this long (0: it always sleeps in poll) */
  uint64_t spin_ns;
  double link_capacity; /* bytes a second to each daemon, for caps; 0: measured */
};

/* News for the layer above, on the loop thread: a control message from
 * the daemon at addr (after the greeting: it holds the cluster key), or
 * that daemon lost, with why. */
struct peers_hooks {
  void (*message)(void *arg, const char *addr, const struct peer_msg *m);
  void (*lost)(void *arg, const char *addr, const char *why);
  void *arg;
};

/* Who is where, as failures name the daemon at the other end and its
 * ranks; the layer above keeps it for as long as its ops may fail. */
struct net_map {
  int nnodes, nranks;
  const char (*node_addr)[CCSD_ADDR_MAX];
  const int *node_of_rank;
};

/* Listens on opt->listen; bound gets the address other daemons use (the
 * advertise key, or the bound address). Takes the ops' network tasks from
 * exec. NULL (and a log line) on failure. */
struct peers *ccsd_peers_start(uv_loop_t *loop, const struct peers_options *opt,
                               const struct peers_hooks *hooks, struct executor *exec,
                               char *bound, size_t boundlen);
void ccsd_peers_stop(struct peers *p);
/* Once the loop ran the close callbacks after stop: the comms freed in
 * them (and late hand-overs, until the executor stopped) still call it,
 * to no effect. */
void ccsd_peers_free(struct peers *p);

/* Loop thread, while it spins on its clients' rings with calls in flight:
 * it drives the transport itself (what was handed over, the connections
 * polled without waiting, their completions, a small op's computing), so
 * that a small op across daemons crosses no thread on its way; the network
 * thread meanwhile sleeps on its wake-up. Returns how much it found to do
 * (0 also when the network thread was at it). drive_end, before the loop
 * sleeps, gives the transport back to the network thread. */
int ccsd_peers_drive(struct peers *p);
void ccsd_peers_drive_end(struct peers *p);

/* A message that arrived before its receive was made, kept past its
 * connection (coll/hold.c), in a table by tag: data is malloc'ed, freed
 * with it. */
struct held_msg {
  uint64_t tag;
  int node;  /* the daemon it came from, by its index in the comm */
  int fresh; /* from a connection just closed, not yet carried over once */
  size_t len;
  void *data;
  UT_hash_handle hh;
};
void ccsd_held_free(struct held_msg **table);
void ccsd_held_drop(struct held_msg **table, struct held_msg *m); /* out of it, and freed */
struct held_msg *ccsd_held_find(struct held_msg *table, uint64_t tag);
/* Moved from *from into *to (one of its tag there already: dropped). */
void ccsd_held_move(struct held_msg **from, struct held_msg **to, struct held_msg *m);

/* Loop thread. A control message to the daemon at addr (connected on
 * first use; a failure comes back as that peer lost). */
void ccsd_peers_send(struct peers *p, const char *addr, const struct peer_msg *m);
/* A communicator's data connections to the other nodes (addrs[mynode] is
 * this daemon): `lanes` per pair, chunk c on lane c % lanes, so that large
 * messages use several TCP streams; the lower node of each pair connects.
 * carried (taken over, freed also on failure; NULL: none): messages that
 * arrived on the comm's earlier connections, which its receives take
 * before any connection. */
struct net_comm *ccsd_peers_comm_open(struct peers *p, const uint8_t *name, int nnodes,
                                      int mynode, const char (*addrs)[CCSD_ADDR_MAX], int lanes,
                                      struct held_msg *carried);
void ccsd_peers_comm_close(struct peers *p, struct net_comm *nc); /* pending posts fail */
void ccsd_peers_comm_free(struct peers *p, struct net_comm *nc);  /* after its last op */
/* Loop thread: 1 when a data connection of nc holds a message that no
 * receive has taken yet (another daemon ran an op this one has not, or
 * sent to a rank here that has not asked for it), 0 when none does, -1
 * when the network thread was at the transport (ask again). */
int ccsd_peers_comm_holds(struct peers *p, struct net_comm *nc);
/* Loop thread, once the daemon at node went: the messages nc carried
 * over from earlier connections, and those its data connections with that
 * daemon hold that no receive took, added to *out (see transport.h
 * take_held). 1: the latter taken, every connection closed cleanly by
 * that daemon after its last message; 0: one is still open (ask again);
 * -1: one failed otherwise or never opened, or the transport cannot say
 * (the latter not taken). */
int ccsd_peers_comm_take_held(struct peers *p, struct net_comm *nc, int node, struct held_msg **out);

/* Loop thread, when an op across daemons is launched: the records of
 * the tasks the network thread may take, made with the op so that taking,
 * posting and failing them never wants memory (freed with the op,
 * ccsd_run_op_free). -1 when out of memory. */
int ccsd_peers_op_prepare(struct run_op *x);

/* An op's memory registered with the transport (at its first message, on
 * the network thread); released with the op, after its last message. */
struct net_mem;
void ccsd_peers_release(struct peers *p, struct net_mem *nm);
/* The mapping of [base, base + len) goes: what was registered of it is not
 * served again (regions marked cacheable are kept registered between ops
 * until their owner says so here). p NULL: nothing. */
void ccsd_peers_forget(struct peers *p, const void *base, size_t len);
struct reg_cache_counts;
void ccsd_peers_registrations(struct peers *p, struct reg_cache_counts *out);
/* The messages sent to other daemons by the way they went: 0, or -1 where
 * the transport counts none (TCP: every message goes one way). */
struct transport_counters;
int ccsd_peers_transport_counters(struct peers *p, struct transport_counters *out);
/* How the tuner should see a link to another daemon over p's transport. */
struct link_model ccsd_peers_link_model(struct peers *p);

/* The data tag of one chunk: ops by number (0: send/recv, from and to are
 * ranks and msg counts that pair's messages), the arguments the op was
 * called with (sig_key: ops whose ranks disagree never exchange data),
 * participants, the message between them and the chunk, mixed into 64
 * bits; never 0 (control). */
uint64_t ccsd_peer_tag(uint64_t seq, uint64_t sig_key, int from, int to, uint32_t msg,
                       size_t chunk);

#endif
