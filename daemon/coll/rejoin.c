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

void ccsd_rejoin_free(struct coll_rejoin *r) {
  for (size_t i = 0; r && i < r->n; i++) free(r->ch[i].retry);
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

/* Calls rank r made on a channel, as it reported them (none when it
 * reported no such channel). */
static uint64_t taken(const struct comm *c, int r, int peer, int send) {
  const struct coll_channel *ch = find(c->members[r], peer, send);
  return ch ? ch->taken : 0;
}

static ccs_result_t disagree(struct comm *c, int r, uint64_t made, const char *what, uint64_t finished) {
  ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the ranks' reports of their calls disagree after the restart: "
                 "rank %d made %llu %s, but %llu finished: the communicator cannot be rejoined",
                 r, (unsigned long long)made, what, (unsigned long long)finished);
  return c->error;
}

ccs_result_t ccsd_rejoin_settle(struct comm *c) {
  int any = 0;
  for (int r = 0; r < c->nranks; r++) any |= c->members[r] && c->members[r]->rejoin;
  if (!any) return CCS_OK;
  uint64_t coll_finished = 0, coll_retry = UINT64_MAX;
  for (int r = 0; r < c->nranks; r++) furthest(find(c->members[r], -1, 0), &coll_finished);
  for (int r = 0; r < c->nranks; r++) first_retry(find(c->members[r], -1, 0), coll_finished, &coll_retry);
  for (int r = 0; r < c->nranks; r++)
    if (c->members[r] && c->members[r]->rejoin && taken(c, r, -1, 0) < coll_finished)
      return disagree(c, r, taken(c, r, -1, 0), "collectives", coll_finished);
  for (int r = 0; r < c->nranks; r++) {
    struct member *m = c->members[r];
    if (!m) continue;
    m->coll_seq = coll_finished; /* the next collective is number finished + 1 */
    for (size_t i = 0; m->rejoin && i < m->rejoin->n; i++) {
      struct coll_channel *ch = &m->rejoin->ch[i];
      if (ch->peer < 0) {
        ch->finished = coll_finished, ch->retry_from = coll_retry;
        continue;
      }
      /* rank r's sends to peer are the peer's receives from r */
      const struct coll_channel *other = find(c->members[ch->peer], r, !ch->send);
      uint64_t finished = 0, retry = UINT64_MAX;
      furthest(ch, &finished);
      furthest(other, &finished);
      first_retry(ch, finished, &retry);
      first_retry(other, finished, &retry);
      if (ch->taken < finished)
        return disagree(c, r, ch->taken, ch->send ? "sends to a peer" : "receives from a peer", finished);
      if (c->members[ch->peer] && c->members[ch->peer]->rejoin && taken(c, ch->peer, r, !ch->send) < finished)
        return disagree(c, ch->peer, taken(c, ch->peer, r, !ch->send),
                        ch->send ? "receives from a peer" : "sends to a peer", finished);
      ch->finished = finished;
      ch->retry_from = retry;
    }
  }
  return CCS_OK;
}
