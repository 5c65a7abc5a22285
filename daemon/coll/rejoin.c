/* Comms rejoined after a restart (docs/restart.md). Each rank comes back
 * with where its calls stood, per channel (the comm's collectives, and its
 * sends to and receives from each peer): how many it knows finished, and
 * which of the rest it cannot resubmit. Once every rank is back the
 * channel's verdict is the same for all: a call finished for anyone
 * finished for everyone (a daemon answers a call once the whole op is
 * done), so the channel finished as far as its furthest rank; from the
 * first call any rank must repeat itself, every rank repeats (resubmitting
 * a later one would give it that call's number); the calls between are
 * resubmitted. The collectives' numbering goes on from there. A call
 * can only have finished once every rank of it made it: reports that say
 * otherwise cannot be reconciled, and the comm fails. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "coll/coll.h"

static const struct coll_channel *find(const struct member *m, int peer, int send) {
  if (!m || !m->rejoin) return NULL;
  for (size_t i = 0; i < m->rejoin->n; i++)
    if (m->rejoin->ch[i].peer == peer && (peer < 0 || m->rejoin->ch[i].send == send))
      return &m->rejoin->ch[i];
  return NULL;
}

/* A report of its own (packed and read back): the request it came in goes. */
static Ccs__Rejoin *copy_report(const Ccs__Rejoin *m) {
  size_t len = ccs__rejoin__get_packed_size(m);
  uint8_t *buf = malloc(len ? len : 1);
  Ccs__Rejoin *copy = buf ? ccs__rejoin__unpack(NULL, ccs__rejoin__pack(m, buf), buf) : NULL;
  free(buf);
  return copy;
}

#define REJOIN_RETRIES_MAX 4096u
struct coll_rejoin *ccsd_rejoin_parse(const Ccs__Rejoin *m, int nranks, char *err, size_t errlen) {
  if (m->n_channels > 2 * (size_t)nranks + 1) {
    snprintf(err, errlen, "a rejoin reports %zu channels; a rank of %d has at most %d", m->n_channels,
             nranks, 2 * nranks + 1);
    return NULL;
  }
  struct coll_rejoin *r = calloc(1, sizeof(*r) + m->n_channels * sizeof(r->ch[0]));
  uint8_t *seen = calloc((size_t)nranks + 1, 1); /* bit 0: receives, 1: sends; [nranks]: collectives */
  if (!r || !seen) {
    free(r), free(seen);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  size_t retries = 0;
  r->spans = m->spans;
  for (size_t i = 0; i < m->n_channels; i++) {
    const Ccs__Channel *c = m->channels[i];
    int peer = c->peer < 0 ? -1 : c->peer;
    uint8_t bit = peer < 0 ? 1 : c->send ? 2 : 1;
    int bad_peer = c->peer < -1 || c->peer >= nranks;
    int dup = !bad_peer && (seen[peer < 0 ? nranks : peer] & bit);
    if (!bad_peer) seen[peer < 0 ? nranks : peer] |= bit;
    retries += c->n_must_retry;
    const char *bad = bad_peer ? "a peer out of range" : dup ? "reported twice"
                      : retries > REJOIN_RETRIES_MAX ? "more calls than a journal holds"
                      : c->done > UINT64_MAX - c->n_must_retry ? "calls numbered past 2^64"
                      : NULL;
    if (bad) {
      snprintf(err, errlen, "a rejoin's channel %zu: %s", i, bad);
      free(seen);
      ccsd_rejoin_free(r);
      return NULL;
    }
    struct coll_channel *ch = &r->ch[r->n++];
    *ch = (struct coll_channel){.peer = peer, .send = peer >= 0 && c->send, .done = c->done,
                               .taken = c->done + c->n_must_retry};
    for (size_t k = 0; k < c->n_must_retry; k++) {
      if (!c->must_retry[k]) continue;
      if (!ch->retry && !(ch->retry = malloc(sizeof(*ch->retry) * c->n_must_retry))) {
        snprintf(err, errlen, "out of memory");
        free(seen);
        ccsd_rejoin_free(r);
        return NULL;
      }
      ch->retry[ch->nretry++] = c->done + k;
    }
  }
  free(seen);
  /* (a rank that sent its init again reports no channel: it may join
   * a comm formed anew, or made again at the root, refound.c) */
  if ((r->spans || !r->n) && !(r->wire = copy_report(m))) {
    snprintf(err, errlen, "out of memory");
    ccsd_rejoin_free(r);
    return NULL;
  }
  return r;
}

void ccsd_rejoin_free(struct coll_rejoin *r) {
  for (size_t i = 0; r && i < r->n; i++) free(r->ch[i].retry);
  if (r && r->wire) ccs__rejoin__free_unpacked(r->wire, NULL);
  free(r);
}

static void furthest(const struct coll_channel *ch, uint64_t *finished) {
  if (ch && ch->done > *finished) *finished = ch->done;
}

/* The first call past finished that this party must repeat. */
static void first_retry(const struct coll_channel *ch, uint64_t finished, uint64_t *retry) {
  for (size_t k = 0; ch && k < ch->nretry; k++)
    if (ch->retry[k] >= finished) {
      if (ch->retry[k] < *retry) *retry = ch->retry[k];
      return;
    }
}

/* Calls made on a channel, as reported; a receive's messages that
 * arrived at its daemon count as made: the receives made after take them. */
static uint64_t made(const struct coll_channel *ch) {
  return !ch ? 0 : ch->arrived > ch->taken ? ch->arrived : ch->taken;
}

/* Calls rank r made on a channel (none when it reported no such channel). */
static uint64_t taken(const struct comm *c, int r, int peer, int send) {
  return made(find(c->members[r], peer, send));
}

static ccs_result_t disagree(struct comm *c, int r, uint64_t made, const char *what, uint64_t finished) {
  ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the ranks' reports of their calls disagree after the restart: "
                 "rank %d made %llu %s, but %llu finished: the communicator cannot be rejoined",
                 r, (unsigned long long)made, what, (unsigned long long)finished);
  return c->error;
}

static uint64_t done_of(const struct comm *c, int r, int peer, int send) {
  const struct coll_channel *ch = find(c->members[r], peer, send);
  return ch ? ch->done : 0;
}

/* Whether the last send from rank `from` to rank `to` finished at the
 * sender's daemon and not at the receiver's, and the sender's daemon keeps
 * it to send again (replay.c): the receive is made again. */
static int resent(const struct comm *c, int from, int to) {
  const struct coll_channel *s = find(c->members[from], to, 1), *r = find(c->members[to], from, 0);
  uint64_t received = r ? r->done : 0;
  return c->node_of_rank && s && s->kept && s->kept == s->done && s->done == received + 1 &&
         c->node_of_rank[from] != c->node_of_rank[to];
}

/* Whether every send from rank `from` to rank `to` that finished at the
 * sender's daemon arrived whole at the receiver's, where no receive has
 * taken it yet (hold.c): the receives made after take it. */
static int arrived(const struct comm *c, int from, int to) {
  const struct coll_channel *s = find(c->members[from], to, 1), *r = find(c->members[to], from, 0);
  return c->node_of_rank && s && r && r->arrived >= s->done && c->node_of_rank[from] != c->node_of_rank[to];
}

/* Whether the daemons behind can run collective #last again: each of
 * those that finished it keeps the messages it sent (replay.c) and none of
 * the ranks behind wrote over its inputs in it. */
static int rerunnable(const struct comm *c, const uint64_t *fin, uint64_t last) {
  for (int k = 0; k < c->nnodes; k++)
    if (fin[k] == last ? !c->node_kept || c->node_kept[k] != last : fin[k] + 1 != last) return 0;
  for (int r = 0; r < c->nranks; r++) {
    const struct coll_channel *ch = find(c->members[r], -1, 0);
    uint64_t retry = UINT64_MAX;
    first_retry(ch, last - 1, &retry);
    if (fin[c->node_of_rank[r]] < last && retry == last - 1) return 0;
  }
  return 1;
}

/* Across daemons: a daemon answers its ranks once an op is done on its own
 * node, not on every node; a collective finished at one daemon and not at
 * another (the one that went, say) is whole only where the daemons that
 * finished it send their messages again (node_finished then says who runs
 * it again). A message whose send finished and whose receive did not was
 * lost with the daemon, unless the sender's daemon sends it again or it
 * arrived whole at the receiver's. (A receive finished while its send was
 * still under way is whole: the send finished.) */
static ccs_result_t across_daemons(struct comm *c) {
  uint64_t *fin = calloc((size_t)c->nnodes, sizeof(*fin)), last = 0;
  if (!fin) {
    ccsd_comm_fail(c, CCS_ERR_NO_MEMORY, "out of memory rejoining the communicator");
    return c->error;
  }
  for (int r = 0; r < c->nranks; r++) furthest(find(c->members[r], -1, 0), &fin[c->node_of_rank[r]]);
  for (int k = 0; k < c->nnodes; k++)
    if (fin[k] > last) last = fin[k];
  for (int k = 0; k < c->nnodes; k++) {
    if (fin[k] == last) continue;
    if (rerunnable(c, fin, last)) {
      free(c->node_finished);
      c->node_finished = fin;
      return CCS_OK;
    }
    int ahead = 0;
    while (fin[ahead] != last) ahead++;
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "collective #%llu finished at the daemon at %s but not at "
                   "the daemon at %s when a daemon went: the communicator cannot be rejoined",
                   (unsigned long long)fin[k] + 1, c->node_addr[ahead], c->node_addr[k]);
    free(fin);
    return c->error;
  }
  free(fin);
  for (int r = 0; r < c->nranks; r++)
    for (size_t i = 0; c->members[r]->rejoin && i < c->members[r]->rejoin->n; i++) {
      const struct coll_channel *ch = &c->members[r]->rejoin->ch[i];
      if (ch->peer < 0 || c->node_of_rank[ch->peer] == c->node_of_rank[r]) continue;
      uint64_t other = done_of(c, ch->peer, r, !ch->send);
      if (ch->send ? ch->done <= other : other <= ch->done) continue;
      int from = ch->send ? r : ch->peer, to = ch->send ? ch->peer : r;
      if (resent(c, from, to) || arrived(c, from, to)) continue;
      ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "rank %d's sends to rank %d: %llu finished at the daemon at "
                     "%s, %llu received at the daemon at %s when a daemon went: the communicator "
                     "cannot be rejoined", from, to, (unsigned long long)(ch->send ? ch->done : other),
                     c->node_addr[c->node_of_rank[from]], (unsigned long long)(ch->send ? other : ch->done),
                     c->node_addr[c->node_of_rank[to]]);
      return c->error;
    }
  return CCS_OK;
}

/* The messages between ranks of different daemons so far, as numbered in
 * their tags (op.c), from the channels' verdicts. */
static ccs_result_t count_messages(struct comm *c) {
  for (int r = 0; r < c->nranks; r++)
    for (size_t i = 0; c->members[r]->rejoin && i < c->members[r]->rejoin->n; i++) {
      const struct coll_channel *ch = &c->members[r]->rejoin->ch[i];
      if (ch->peer < 0 || !ch->send || c->node_of_rank[ch->peer] == c->node_of_rank[r] || !ch->finished) continue;
      struct p2p_count *grown = realloc(c->p2p_counts, (c->np2p + 1) * sizeof(*grown));
      if (grown) c->p2p_counts = grown;
      if (!grown || ch->finished > UINT32_MAX) {
        ccsd_comm_fail(c, grown ? CCS_ERR_PROTOCOL : CCS_ERR_NO_MEMORY, "%s rejoining the communicator",
                       grown ? "more than 2^32 messages between two ranks" : "out of memory");
        return c->error;
      }
      c->p2p_counts[c->np2p++] = (struct p2p_count){r, ch->peer, (uint32_t)ch->finished};
    }
  return CCS_OK;
}

/* The collectives finished for rank r: as far as the furthest rank, or
 * one less at a daemon that runs the last one again. */
static uint64_t finished_at(const struct comm *c, int r, uint64_t furthest) {
  return c->node_finished ? c->node_finished[c->node_of_rank[r]] : furthest;
}

ccs_result_t ccsd_rejoin_settle(struct comm *c) {
  int any = 0;
  for (int r = 0; r < c->nranks; r++) any |= c->members[r] && c->members[r]->rejoin;
  if (!any) return CCS_OK;
  if (c->node_of_rank && c->nnodes > 1 && across_daemons(c) != CCS_OK) return c->error;
  uint64_t coll_finished = 0, coll_retry = UINT64_MAX;
  for (int r = 0; r < c->nranks; r++) furthest(find(c->members[r], -1, 0), &coll_finished);
  for (int r = 0; r < c->nranks; r++) first_retry(find(c->members[r], -1, 0), coll_finished, &coll_retry);
  for (int r = 0; r < c->nranks; r++)
    if (c->members[r] && c->members[r]->rejoin && taken(c, r, -1, 0) < finished_at(c, r, coll_finished))
      return disagree(c, r, taken(c, r, -1, 0), "collectives", finished_at(c, r, coll_finished));
  for (int r = 0; r < c->nranks; r++) {
    struct member *m = c->members[r];
    if (!m) continue;
    m->coll_seq = finished_at(c, r, coll_finished); /* the next collective is number finished + 1 */
    for (size_t i = 0; m->rejoin && i < m->rejoin->n; i++) {
      struct coll_channel *ch = &m->rejoin->ch[i];
      if (ch->peer < 0) {
        ch->finished = m->coll_seq, ch->retry_from = coll_retry;
        continue;
      }
      /* rank r's sends to peer are the peer's receives from r */
      const struct coll_channel *other = find(c->members[ch->peer], r, !ch->send);
      uint64_t finished = 0, retry = UINT64_MAX;
      furthest(ch, &finished);
      furthest(other, &finished);
      int from = ch->send ? r : ch->peer, to = ch->send ? ch->peer : r;
      if (resent(c, from, to)) finished--; /* the receive is made again, the message sent again */
      first_retry(ch, finished, &retry);
      first_retry(other, finished, &retry);
      if (made(ch) < finished)
        return disagree(c, r, made(ch), ch->send ? "sends to a peer" : "receives from a peer", finished);
      if (c->members[ch->peer] && c->members[ch->peer]->rejoin && taken(c, ch->peer, r, !ch->send) < finished)
        return disagree(c, ch->peer, taken(c, ch->peer, r, !ch->send),
                        ch->send ? "receives from a peer" : "sends to a peer", finished);
      ch->finished = finished;
      ch->retry_from = retry;
    }
  }
  c->coll_finished = coll_finished;
  c->coll_retry = coll_retry;
  return c->node_of_rank && c->nnodes > 1 ? count_messages(c) : CCS_OK;
}
