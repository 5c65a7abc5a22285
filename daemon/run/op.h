/* One op as the run layer sees it (executor threads, GPU threads, the
 * network thread): its graph, where it runs, what of it is done, and how
 * the layer that launched it hears back. The layer above embeds it in its
 * own op, fills the first block and hands it down (executor.h, gpu.h);
 * from then on each block below belongs to the party it names, and the
 * launcher hears back only through on_done, on the loop thread. */
#ifndef CCSD_RUN_OP_H
#define CCSD_RUN_OP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/list.h"
#include "ccs.h"
#include "plan/engine.h"

struct net_comm;
struct net_map;
struct net_mem;
struct net_task;
struct gpu_order;
struct gpu_stream;
struct fair_flow;
struct run_share;

/* Memory an op's messages may read or write (registered with the
 * transport at its first message). */
struct run_region {
  void *base;
  size_t len;
  int cacheable; /* its owner calls ccsd_peers_forget when the mapping goes */
};

struct run_op {
  /* the launcher's, read-only once handed down */
  struct run_share *share;    /* its tenant (run/share.h): weights, and what it was given */
  int prio;                   /* its comm's class (base/fair.h: FAIR_LATENCY..FAIR_BULK) */
  int streaming;              /* outputs past the caches: non-temporal stores */
  int device;                 /* the GPU that runs it; -1: host memory */
  uint64_t stream_key;        /* its comm: a GPU runs a comm's ops in order, on one stream */
  struct gpu_order *orders;   /* the local posts' places in their clients' streams (gpu.h) */
  int norders;
  struct net_comm *net;       /* its comm's connections, across daemons */
  const struct net_map *map;  /* who is where, for the texts of failures */
  const int *part_node;       /* each participant's node */
  int p2p;                    /* a send and its receive: participants 0 and 1 */
  uint64_t seq, sig_key;      /* what its data tags carry */
  struct run_region *regions; /* the ranks' buffers and the launcher's scratch */
  int scratch_cacheable;      /* the plan's scratch pool reports its frees (ccsd_peers_forget) */
  int nregions;
  /* where the network thread copies what it sends, to send it again after
   * another daemon restarted (coll/replay.c): per item, where its bytes
   * go in sent; NULL: not kept */
  char *sent;
  size_t *sent_at;
  void (*on_done)(struct run_op *x);     /* every task finished (or skipped) */
  _Atomic int cancelled;      /* anyone: skip the remaining work */

  /* The graph's bookkeeping, under the executor's lock: its threads and
   * the network thread (ccsd_executor_net_step) both step it, and a claim
   * looks across every tenant's ops at once, so one lock serves them all. */
  struct engine_plan plan;
  struct list link, done_link;
  int net_handover;           /* its ready tasks are on their way to the network thread */
  int on_net;                 /* small, across daemons: the network thread computes too */
  struct fair_flow *exec_flow; /* its tenant's, while it is queued or running there */
  double exec_estimate_ns;    /* what its next task is charged when claimed */
  uint64_t submitted_ns;      /* when it reached the executor; */
  int exec_started;           /* and whether a task of it was claimed since */

  /* the network thread's */
  struct net_task *net_tasks; /* per task, made at launch (net.h: ccsd_peers_op_prepare) */
  struct list net_link;       /* handed over, not yet taken (under the network side's lock) */
  struct net_mem *net_mem;    /* its regions, registered with the transport */
  char net_error[160];        /* a network task failed (the first reason; read once the op is done) */
  ccs_result_t net_status;
  int net_node;               /* the node at the other end of the failed task; -1: none */
  _Atomic int net_error_taken; /* whoever sets it writes the reason: the network thread, or
                                  an executor thread finishing hand-overs after the stop */

  /* the GPU threads' (under their lock) */
  char gpu_error[160];
  struct gpu_stream *gpu_stream; /* while queued there */
  int gpu_drain;                 /* its completion not queued: the watchdog waits for the stream */
  uint32_t gpu_done_at;          /* its number in its stream's completions (0: not yet queued) */
  struct gpu_watch {             /* the watchdog's (gpu.h: ccsd_gpu_watch_step) */
    uint64_t released_ms;        /* 0: not yet */
    int warned;
  } gpu_watch;
  struct list gpu_link;          /* on its GPU's list of ops queued there */
  struct fair_flow *gpu_flow;    /* its tenant's in its GPU's shares, while it waits to go */
};

/* Frees what the launcher and the layer gave x (its plan, regions,
 * events, task records); x itself is the launcher's. */
void ccsd_run_op_free(struct run_op *x);

/* The node at the other end of a SEND or RECV task. */
int ccsd_run_op_peer_node(const struct run_op *x, size_t task);
/* A network task failed (with the node at its other end, or -1): the
 * first reason stays, the rest is skipped. */
void ccsd_run_op_net_error(struct run_op *x, ccs_result_t status, int node, const char *why);

#endif
