/* The engine: one op's schedules compiled into a graph of tasks over the
 * buffers this daemon maps, and the bookkeeping that runs the graph.
 *
 * Compiling runs every participant's schedule symbolically. A receive
 * moves no data: the block now names the value that was sent. A receive
 * with reduction makes a reduce item over the values it combines, flattened
 * into one item per result (its inputs in participant order, so every
 * algorithm reduces in the same order and every rank gets the same bits),
 * and identical items are made once. What each rank must end with lands in
 * its output buffer: one item reads each contribution once and writes every
 * rank's copy. Only values no output keeps get scratch memory.
 *
 * Items are cut into tasks of chunk_bytes. A task waits for the same chunk
 * of the items whose result it reads (pipelining), and for every reader of
 * memory it overwrites (in-place ops); an input that a later-ordered item
 * overwrites is first copied aside, so the graph never has a cycle.
 *
 * Participants another daemon runs are not simulated: what they send is an
 * opaque value that a RECV item brings in, and what a local participant
 * sends them a SEND item takes out, each message cut into the same chunks
 * on both sides (the chunk is part of the message's identity).
 *
 * The graph is plain data: tests run it on one thread in any order the
 * dependencies allow; the executor runs it on its threads. */
#ifndef CCSD_PLAN_ENGINE_H
#define CCSD_PLAN_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "ccs.h"
#include "plan/schedule.h"

/* One participant's mapped buffers; NULL where its call has none (a
 * non-root of reduce or gather has no output, a non-root of broadcast or
 * scatter no input). */
struct engine_part {
  char *send, *recv;
  int remote; /* run by another daemon: its messages cross the network */
  /* A participant that stands for several ranks of this daemon (schedules
   * among daemons): its input is the reduction of its members' sends (for
   * broadcast and scatter, the root member's; for all_gather and gather,
   * each member's own block), its outputs are their recvs (for reduce and
   * gather, the root member's; for reduce_scatter and scatter, each
   * member's own block). */
  const struct engine_part *members;
  int nmembers, root_member;
};

struct engine_pool;

struct engine_op {
  enum sched_coll coll;
  enum sched_algo algo;
  int n, root, pipeline;
  size_t count; /* elements, as the public call counts them */
  ccs_dtype_t dtype;
  ccs_redop_t redop;
  const struct engine_part *ranks; /* n of them */
  /* The rank whose place in the buffers participant p's blocks take
   * (participants ordered by daemon put neighbours on one daemon); NULL: p. */
  const int *rank_of;
  size_t chunk_bytes; /* every daemon of a comm must use the same */
  size_t avg_divisor; /* ranks that contribute (CCS_AVG); 0: n */
  struct engine_pool *pool; /* where scratch comes from (pool.h); NULL: malloc */
  /* Groups of all_gather, reduce_scatter, gather and scatter: participant
   * p stands for the ranks rank_of[group_first[p] .. group_first[p+1]-1],
   * its members in that order, and its block for their blocks. */
  const int *group_first;
};

enum engine_kind {
  ENGINE_COMPUTE, /* reduce or copy, on the executor's threads */
  ENGINE_SEND,    /* in[0] to another daemon's participant `to` */
  ENGINE_RECV,    /* from another daemon's participant `from` into out[0] */
};

struct engine_item {
  uint8_t kind;
  int from, to;  /* SEND, RECV: the participants, and which message of */
  uint32_t msg;  /* theirs this is (0, 1, ... per ordered pair) */
  const void **in;
  void **out;
  int nin, nout;
  int reduce;     /* else copy in[0] */
  size_t divisor; /* CCS_AVG divides by it when > 0 */
  size_t count;   /* elements */
  size_t first_task, ntasks;
  size_t succ_begin, succ_end; /* in plan->succ */
  size_t chunks_left;          /* at run time */
};

struct engine_edge {
  uint32_t to;
  uint8_t chunkwise; /* chunk c waits for chunk c; else for every chunk */
};

struct engine_plan {
  ccs_dtype_t dtype;
  ccs_redop_t redop;
  size_t elem_size, chunk_elems;
  struct engine_item *items;
  size_t nitems;
  struct engine_edge *succ;
  size_t nsucc;
  size_t ntasks;
  uint32_t *task_item;
  uint32_t *pending; /* per task: unfinished tasks it waits for */
  uint32_t *ready;   /* queue of runnable COMPUTE tasks: each enters once */
  size_t ready_head, ready_tail, finished;
  uint32_t *net_ready; /* ... and of SEND and RECV tasks (the network's) */
  size_t net_head, net_tail;
  size_t compute_tasks; /* tasks of COMPUTE items */
  size_t bytes_written, bytes_moved; /* outputs; inputs + outputs */
  size_t net_items;                  /* SEND and RECV */
  void **ptrs;                       /* storage behind items' in/out */
  void **scratch;                    /* allocations the plan owns */
  size_t *scratch_bytes;
  size_t nscratch;
  struct engine_pool *pool;          /* they go back to */
};

/* Compiles op into plan. CCS_OK; or an error with a text in err: the
 * algorithm does not build this collective, out of memory, or buffers
 * that overlap in a way no order of the work can honour. */
ccs_result_t engine_compile(const struct engine_op *op, struct engine_plan *plan, char *err,
                            size_t errlen);
void engine_plan_free(struct engine_plan *plan);

/* One message of a plan of messages alone: a SEND from buf (send) or a
 * RECV into it, between participants from and to, the msg-th of theirs,
 * count elements. */
struct engine_message {
  int send, from, to;
  uint32_t msg;
  size_t count;
  void *buf;
};
/* A plan of n independent messages, each cut into chunks of chunk_elems
 * as engine_compile cuts them (plan/messages.c). CCS_OK, or
 * CCS_ERR_NO_MEMORY. */
ccs_result_t engine_plan_messages(const struct engine_message *msgs, size_t n, ccs_dtype_t dtype,
                                  size_t chunk_elems, struct engine_plan *plan);

static inline const struct engine_item *engine_task_item(const struct engine_plan *plan,
                                                         size_t task) {
  return &plan->items[plan->task_item[task]];
}

#endif
