/* A comm across daemons made again when every daemon of it restarted
 * (docs/restart.md): a cluster's daemons restarted together, say, so that
 * none holds it (hold.c) to tell the others who is where. Its ranks rejoin
 * their daemons as after any restart, each with its report. A daemon that
 * is not the comm's root and hears from no daemon holding it within
 * REFOUND_AFTER_MS sends its ranks' reports to the root (the unique id
 * names it) in PeerJoins, again every REFOUND_EVERY_MS until the root
 * answers. The root gathers them as it gathers a first init's joins
 * (span.c), its own ranks' beside them, and once every rank is back sends
 * each daemon the map with every rank's report, so that each settles the
 * same verdicts from the same reports (rejoin.c). Nothing was kept
 * anywhere: a collective or a message finished at one daemon and not at
 * another fails the comm. A stop (SIGTERM) finishes its ops first, so the
 * reports agree after every daemon stopped together. A root that holds the
 * comm (its peer restarted, not itself) takes no such join: its own word
 * reaches the restarted daemon first. On the loop thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "coll/coll.h"

/* a daemon that holds the comm speaks within about 1.5 s of the restart
 * (hold.c: its ops run on for up to 1 s, then it asks every 50-500 ms) */
#define REFOUND_AFTER_MS 2500
#define REFOUND_EVERY_MS 250

static void on_tick(uv_timer_t *t) {
  struct comm *c = t->data;
  if (c->state != COMM_JOINING) return;
  uint64_t now = ccsd_now_ms_of(c->co);
  if (now >= c->rejoin_until_ms) {
    ccsd_comm_init_timed_out(c);
    return;
  }
  /* (the root gathers; a daemon that holds the comm spoke: it settles);
   * a rank here by its first init joins there as first inits do */
  if (c->root[0] && !c->regather && c->co->peers && c->co->cfg.peer_restart_grace_s > 0)
    for (int r = 0; r < c->nranks; r++)
      if (c->members[r] && !c->members[r]->remote) ccsd_span_joined(c, c->members[r]);
  uint64_t left = c->rejoin_until_ms - now;
  uv_timer_start(&c->timer, on_tick, c->root[0] && left > REFOUND_EVERY_MS ? REFOUND_EVERY_MS : left, 0);
}

/* How long ranks that made calls wait for the rest to rejoin, at most: a
 * comm that may be forming anew (its ranks sent their inits again) waits
 * for its ranks as a first init does. */
#define REJOIN_WAIT_S 10.0
void ccsd_refound_wait(struct comm *c, int made_calls) {
  double init_s = c->co->cfg.init_timeout_s;
  uint64_t wait_ms = (uint64_t)((made_calls && init_s > REJOIN_WAIT_S ? REJOIN_WAIT_S : init_s) * 1000);
  c->rejoin_until_ms = ccsd_fresh_ms_of(c->co) + wait_ms;
  uv_timer_start(&c->timer, on_tick, c->root[0] && wait_ms > REFOUND_AFTER_MS ? REFOUND_AFTER_MS : wait_ms, 0);
}

/* The root: a new comm of that id, made again by its ranks. */
static struct comm *make_again(struct coll *co, const struct peer_join *j, const struct ccs__unique_id *id) {
  ccs_result_t rc;
  char err[CCS__ERROR_TEXT_MAX];
  struct comm *c = ccsd_comm_create(co, id, (int)j->nranks, j->algo ? j->algo : "", (int)j->rank, &rc, err,
                                    sizeof(err));
  if (!c) {
    LOG_WARN("comm of %u ranks not made again: %s", j->nranks, err);
    return NULL;
  }
  c->coordinator = 1; /* held for the other daemons until it is ready or failed */
  ccsd_comm_ref(c);
  if (c->named) ccsd_comm_set_label(c, j->label);
  c->rejoining = 1;
  ccsd_refound_wait(c, j->report->n_channels > 0);
  return c;
}

void ccsd_refound_join(struct coll *co, const char *addr, const struct peer_join *j,
                       const struct ccs__unique_id *id) {
  uint8_t name[CCS__NAME_BYTES];
  ccsd_comm_name(id, name);
  struct comm *c = ccsd_comm_find(co, name);
  char err[CCS__ERROR_TEXT_MAX];
  const char *algo = j->algo ? j->algo : "";
  /* ready here: held for that daemon (its word settles), or made again already */
  if (c && c->state == COMM_READY) return;
  if (c && c->state == COMM_FAILED) {
    ccsd_span_tell_failed(co, addr, name, c->error, c->error_text);
    return;
  }
  if (co->cfg.peer_restart_grace_s <= 0) {
    ccsd_span_tell_failed(co, addr, name, CCS_ERR_PEER_LOST, "the communicator's root daemon restarted "
                          "and waits for none of its daemons (peer_restart_grace is 0)");
    return;
  }
  if (c && !c->rejoining) {
    snprintf(err, sizeof(err), "the communicator's root daemon at %s has it forming anew (first inits), "
             "not being rejoined", co->self);
    ccsd_span_tell_failed(co, addr, name, CCS_ERR_PEER_LOST, err);
    return;
  }
  if (c && c->regather) { /* a daemon of it held it, and another restarted too */
    ccsd_span_tell_failed(co, addr, name, CCS_ERR_PEER_LOST, "two of the communicator's daemons restarted "
                          "while another held it: only one at a time, or all of them, can");
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "the daemon at %s restarted too, while another daemon held the "
                   "communicator: only one of its daemons at a time, or all of them, can", addr);
    return;
  }
  if (!c && !(c = make_again(co, j, id))) {
    ccsd_span_tell_failed(co, addr, name, CCS_ERR_NO_MEMORY, "the root daemon could not make the "
                          "communicator again");
    return;
  }
  if (c->nranks != (int)j->nranks || strcmp(c->algo_text, algo)) {
    ccsd_comm_fail(c, CCS_ERR_MISMATCH, "rank %u came back at the daemon at %s with %u ranks and "
                   "CCS_ALGO='%.200s', the communicator has %d and '%.200s'", j->rank, addr, j->nranks,
                   algo, c->nranks, c->algo_text);
    ccsd_span_tell_failed(co, addr, name, c->error, c->error_text); /* (not a member: not told) */
    return;
  }
  struct coll_rejoin *report = ccsd_rejoin_parse(j->report, c->nranks, err, sizeof(err));
  /* (a report of no call: an init sent again, which knows not whether it spans) */
  int spans = report && (report->spans || !report->n);
  if (report && !spans) snprintf(err, sizeof(err), "its report says it spans no daemons");
  struct member *mb = c->members[j->rank];
  if (spans && mb && (!mb->remote || strcmp(mb->addr, addr)))
    snprintf(err, sizeof(err), "rank %u came back here and at %s", j->rank, mb->remote ? mb->addr : co->self);
  else if (spans)
    err[0] = 0;
  if (err[0]) {
    ccsd_rejoin_free(report);
    ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the daemon at %s sent a bad rejoin: %s", addr, err);
    ccsd_span_tell_failed(co, addr, name, c->error, c->error_text);
    return;
  }
  if (mb) { /* sent again: the latest */
    ccsd_rejoin_free(mb->rejoin);
    mb->rejoin = report;
    return;
  }
  if (!(mb = ccsd_span_remote_member(c, (int)j->rank, j->pid, addr))) {
    ccsd_rejoin_free(report);
    return;
  }
  mb->rejoin = report;
  c->spans = 1;
  c->refound = 1;
  if (++c->joined < c->nranks) return;
  LOG_WARN("comm %llu made again here, its root: every daemon of it restarted", (unsigned long long)c->id);
  ccsd_comm_ready(c);
}

int ccsd_refound_reports(struct comm *c, const char *addr, const struct peer_ready *rd) {
  if (c->regather) {
    ccsd_comm_fail(c, CCS_ERR_PEER_LOST, "the root daemon at %s made the communicator again while another "
                   "daemon held it: only one of its daemons at a time, or all of them, can restart", addr);
    return -1;
  }
  if (!rd->nranks) { /* formed anew: fine where every rank here sent its init again, none made a call */
    if (ccsd_comm_forming(c)) return 0;
    ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the root daemon at %s formed the communicator anew, but ranks "
                   "rejoined here with their calls", addr);
    return -1;
  }
  for (size_t i = 0; i < rd->nranks; i++) {
    const Ccs__PeerRank *pr = rd->ranks[i];
    char err[CCS__ERROR_TEXT_MAX] = "";
    struct coll_rejoin *report = NULL;
    if (pr->rank >= (uint32_t)c->nranks || !c->members[pr->rank])
      snprintf(err, sizeof(err), "a report of rank %u, which it does not place", pr->rank);
    else if (!c->members[pr->rank]->remote)
      continue; /* this daemon's own rank: its own report stands */
    else if (!pr->report)
      snprintf(err, sizeof(err), "rank %u without a report", pr->rank);
    else
      report = ccsd_rejoin_parse(pr->report, c->nranks, err, sizeof(err));
    if (!report) {
      ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the root daemon at %s sent a bad rank map: %s", addr, err);
      return -1;
    }
    ccsd_rejoin_free(c->members[pr->rank]->rejoin); /* (a repeat: the latest) */
    c->members[pr->rank]->rejoin = report;
  }
  for (int r = 0; r < c->nranks; r++) /* (one here without: its first init, no call made) */
    if (c->members[r]->remote && !c->members[r]->rejoin) {
      ccsd_comm_fail(c, CCS_ERR_PROTOCOL, "the root daemon at %s made the communicator again without "
                     "rank %d's report", addr, r);
      return -1;
    }
  c->refound = 1;
  LOG_WARN("comm %llu made again through its root daemon at %s: every daemon of it restarted",
           (unsigned long long)c->id, addr);
  return 0;
}
