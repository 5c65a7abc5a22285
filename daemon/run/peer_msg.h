/* What daemons say to each other about communicators, as plain data: the
 * network side turns it into the wire's protobuf and back (peer_msg.c), so
 * the layers above never see protobuf. Pointers point into the message
 * they came in, valid during the call that hands them over. */
#ifndef CCSD_RUN_PEER_MSG_H
#define CCSD_RUN_PEER_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "ccs.pb-c.h"

/* a rank joined a comm whose unique id names the receiver as its root */
struct peer_join {
  const uint8_t *id; /* the unique id: the root checks its signature */
  size_t id_len;
  uint32_t nranks, rank;
  uint32_t uid; /* the joining process's uid, vouched for by its daemon */
  int32_t pid;
  const char *algo;
  const char *label; /* a comm by name: that name, for texts only */
  const Ccs__Rejoin *report; /* a rank back after every daemon of it restarted (coll/refound.c); NULL: a first join */
};

/* every rank arrived: rank r is served by the daemon at addrs[r] */
struct peer_ready {
  const uint8_t *name; /* the comm's name (wire.h) */
  size_t name_len;
  const char *const *addrs;
  size_t naddrs;
  uint64_t chunk_bytes; /* the same on every daemon: chunks are messages */
  uint32_t lanes;       /* data connections per pair of daemons */
  const Ccs__PeerRank *const *ranks; /* a comm made again: every rank's report (coll/refound.c) */
  size_t nranks;
};

struct peer_fail {
  const uint8_t *name;
  size_t name_len;
  int32_t status;
  const char *error;
  uint32_t refused_rank; /* rank + 1: that rank's join alone refused; 0: the comm failed */
};

/* what this daemon's ranks called as op #seq */
struct peer_op {
  const uint8_t *name;
  size_t name_len;
  uint64_t seq;
  uint32_t kind, dtype, redop;
  uint64_t count;
  int32_t root, rank; /* rank: one of the sender's ranks that called it */
};

/* the daemons that stayed, to one that restarted: who is where, and where
 * their ranks' calls stood (a client's rejoin report per rank) */
struct peer_rejoin {
  const uint8_t *name;
  size_t name_len;
  const char *const *addrs;
  size_t naddrs;
  uint64_t chunk_bytes;
  uint32_t lanes;
  const Ccs__PeerRank *const *ranks;
  size_t nranks;
  uint64_t hold; /* the hold's number, echoed in the answer */
  uint64_t kept; /* the collective whose messages it sent it keeps (coll/replay.c); 0: none */
  const Ccs__PeerCount *const *kept_sends; /* per pair, the last send finished it keeps (number + 1) */
  size_t nkept_sends;
  const Ccs__PeerCount *const *arrived; /* per pair, the messages from there held here (number + 1) */
  size_t narrived;
};

/* the restarted daemon's verdict on the collectives: the others go on */
struct peer_resume {
  const uint8_t *name;
  size_t name_len;
  uint64_t finished, retry_from; /* retry_from UINT64_MAX: none repeated */
  uint64_t hold;
  const Ccs__PeerCount *const *counts; /* the messages between their ranks and the receiver's */
  size_t ncounts;
  const char *const *rerun; /* the daemons that run collective #finished again: sent its messages again */
  size_t nrerun;
};

enum peer_kind { PEER_JOIN, PEER_READY, PEER_FAIL, PEER_OP, PEER_REJOIN, PEER_RESUME, PEER_OTHER };
struct peer_msg {
  enum peer_kind kind;
  union {
    struct peer_join join;
    struct peer_ready ready;
    struct peer_fail fail;
    struct peer_op op;
    struct peer_rejoin rejoin;
    struct peer_resume resume;
  };
};

/* Packs m as a PeerMsg: malloc'ed, NULL when out of memory or over max. */
uint8_t *ccsd_peer_msg_pack(const struct peer_msg *m, size_t max, size_t *ret_len);
/* The plain view of an unpacked PeerMsg (PEER_OTHER: greetings, heartbeats). */
void ccsd_peer_msg_view(const Ccs__PeerMsg *w, struct peer_msg *ret);

#endif
