/* The verdicts of a rejoin after a daemon restart (coll/rejoin.c), from
 * random histories: every rank made each call the daemon finished, some
 * of them had the answer (or saw the journal say finished) before the
 * daemon went, each had later calls out, some of those unsafe to rerun.
 * Every channel's verdict must be: finished as far as the furthest rank
 * knew, repeated from the first unsafe call past that, the same for the
 * two ends of a send; and reports that cannot be true (a rank made fewer
 * calls than finished) fail the comm with a text naming the rank. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "base/log.h"
#include "coll/coll.h"

#define RANKS_MAX 6

/* One rank's side of a channel: what it knew finished, what it made, which
 * of the calls it had out it cannot resubmit. */
struct side {
  uint64_t done, taken;
  int unsafe[8];
};

struct world {
  struct coll co;
  struct comm c;
  struct member m[RANKS_MAX];
  struct member *members[RANKS_MAX];
};

static void world_init(struct world *w, int nranks) {
  memset(w, 0, sizeof(*w));
  w->c.co = &w->co;
  w->c.nranks = nranks;
  w->c.members = w->members;
  w->c.state = COMM_JOINING;
  list_init(&w->c.slots), list_init(&w->c.p2p), list_init(&w->c.running), list_init(&w->c.queued);
  list_init(&w->c.agreements);
  for (int r = 0; r < nranks; r++) {
    w->m[r].comm = &w->c, w->m[r].rank = r;
    w->members[r] = &w->m[r];
  }
}

static void world_free(struct world *w) {
  for (int r = 0; r < w->c.nranks; r++) ccsd_rejoin_free(w->m[r].rejoin);
}

/* Rank r's report: its collectives, then its sends to and receives from
 * each peer with a channel. */
static void report(struct world *w, int r, const struct side *coll, const struct side *send,
                   const struct side *recv) {
  int n = w->c.nranks;
  struct coll_rejoin *rj = calloc(1, sizeof(*rj) + (size_t)(1 + 2 * n) * sizeof(rj->ch[0]));
  assert_non_null(rj);
  const struct side *sides[3] = {coll, send, recv};
  for (int k = 0; k < 3; k++)
    for (int p = 0; p < (k ? n : 1); p++) {
      const struct side *s = k ? &sides[k][p] : sides[0];
      if (k && (p == r || !s->taken)) continue;
      struct coll_channel *ch = &rj->ch[rj->n++];
      *ch = (struct coll_channel){.peer = k ? p : -1, .send = k == 1, .done = s->done, .taken = s->taken};
      ch->retry = calloc(8, sizeof(*ch->retry));
      assert_non_null(ch->retry);
      for (uint64_t i = s->done; i < s->taken; i++)
        if (s->unsafe[i - s->done]) ch->retry[ch->nretry++] = i;
    }
  w->m[r].rejoin = rj;
}

static const struct coll_channel *verdict(const struct world *w, int r, int peer, int send) {
  const struct coll_rejoin *rj = w->m[r].rejoin;
  for (size_t i = 0; i < rj->n; i++)
    if (rj->ch[i].peer == peer && (peer < 0 || rj->ch[i].send == send)) return &rj->ch[i];
  return NULL;
}

/* A channel's history as its ranks saw it: `finished` calls ran; each
 * rank made them and up to 3 more (calls out), and knew of up to 2 fewer
 * finished than ran (their answers lost with the daemon). */
static void history(struct side *s, uint64_t finished, int know_all) {
  uint64_t lost = know_all ? 0 : (uint64_t)(rand() % 3);
  s->done = finished > lost ? finished - lost : 0;
  s->taken = finished + (uint64_t)(rand() % 4);
  for (uint64_t i = 0; i < s->taken - s->done; i++) s->unsafe[i] = rand() % 5 == 0;
}

/* The verdict a channel must get from its ranks' sides. */
static void expect(const struct side *const *sides, int n, uint64_t *finished, uint64_t *retry) {
  *finished = 0, *retry = UINT64_MAX;
  for (int i = 0; i < n; i++)
    if (sides[i]->done > *finished) *finished = sides[i]->done;
  for (int i = 0; i < n; i++)
    for (uint64_t k = sides[i]->done; k < sides[i]->taken; k++)
      if (sides[i]->unsafe[k - sides[i]->done] && k >= *finished) {
        if (k < *retry) *retry = k;
        break;
      }
}

static void test_verdicts(void **state) {
  (void)state;
  for (int trial = 0; trial < 2000; trial++) {
    int n = 1 + rand() % RANKS_MAX;
    struct world w;
    world_init(&w, n);
    uint64_t ran = (uint64_t)(rand() % 50);
    int knower = rand() % n; /* (sometimes nobody knew all of it) */
    struct side coll[RANKS_MAX], send[RANKS_MAX][RANKS_MAX], recv[RANKS_MAX][RANKS_MAX];
    memset(send, 0, sizeof(send)), memset(recv, 0, sizeof(recv));
    uint64_t p2p_ran[RANKS_MAX][RANKS_MAX] = {{0}};
    for (int r = 0; r < n; r++) history(&coll[r], ran, r == knower && rand() % 2);
    for (int a = 0; a < n; a++)
      for (int b = 0; b < n; b++)
        if (a != b && rand() % 2) { /* a's sends to b are b's receives from a */
          p2p_ran[a][b] = (uint64_t)(1 + rand() % 20);
          history(&send[a][b], p2p_ran[a][b], rand() % 2);
          history(&recv[b][a], p2p_ran[a][b], 0);
        }
    for (int r = 0; r < n; r++) report(&w, r, &coll[r], send[r], recv[r]);
    assert_int_equal(ccsd_rejoin_settle(&w.c), CCS_OK);
    assert_int_equal(w.c.state, COMM_JOINING);
    const struct side *cs[RANKS_MAX];
    for (int r = 0; r < n; r++) cs[r] = &coll[r];
    uint64_t finished, retry;
    expect(cs, n, &finished, &retry);
    for (int r = 0; r < n; r++) {
      const struct coll_channel *v = verdict(&w, r, -1, 0);
      assert_int_equal(v->finished, finished);
      assert_int_equal(v->retry_from, retry);
      assert_int_equal(w.m[r].coll_seq, finished); /* the next collective is finished + 1 */
    }
    for (int a = 0; a < n; a++)
      for (int b = 0; b < n; b++) {
        if (!p2p_ran[a][b]) continue;
        const struct side *ends[2] = {&send[a][b], &recv[b][a]};
        expect(ends, 2, &finished, &retry);
        const struct coll_channel *sv = verdict(&w, a, b, 1), *rv = verdict(&w, b, a, 0);
        assert_non_null(sv), assert_non_null(rv);
        assert_int_equal(sv->finished, finished), assert_int_equal(rv->finished, finished);
        assert_int_equal(sv->retry_from, retry), assert_int_equal(rv->retry_from, retry);
      }
    world_free(&w);
  }
}

/* A rank that made fewer calls than one finished (its count went wrong):
 * no verdict can be right for it, and the comm fails saying whose. */
static void test_disagreeing_reports_fail(void **state) {
  (void)state;
  for (int trial = 0; trial < 500; trial++) {
    int n = 2 + rand() % (RANKS_MAX - 1), liar = rand() % n, p2p = rand() % 2;
    int peer = (liar + 1 + rand() % (n - 1)) % n;
    struct world w;
    world_init(&w, n);
    struct side coll[RANKS_MAX], none[RANKS_MAX], send[RANKS_MAX], recv[RANKS_MAX];
    memset(none, 0, sizeof(none)), memset(send, 0, sizeof(send)), memset(recv, 0, sizeof(recv));
    uint64_t ran = (uint64_t)(1 + rand() % 50);
    for (int r = 0; r < n; r++) history(&coll[r], ran, 1);
    if (p2p) { /* the liar's receives from peer fall short of peer's sends */
      history(&send[liar], ran, 1);
      recv[peer] = (struct side){.done = ran - 1, .taken = ran - 1};
      report(&w, liar, &coll[liar], none, recv);
      report(&w, peer, &coll[peer], send, none);
    } else {
      coll[liar] = (struct side){.done = ran - 1, .taken = ran - 1};
    }
    for (int r = 0; r < n; r++)
      if (!w.m[r].rejoin) report(&w, r, &coll[r], none, none);
    assert_int_equal(ccsd_rejoin_settle(&w.c), CCS_ERR_PROTOCOL);
    assert_int_equal(w.c.state, COMM_FAILED);
    char want[64];
    snprintf(want, sizeof(want), "rank %d made %llu %s", liar, (unsigned long long)(ran - 1),
             p2p ? "receives" : "collectives");
    assert_non_null(strstr(w.c.error_text, want));
    world_free(&w);
  }
}

/* Across daemons (rank r on daemon r % 2; daemon 1 restarted): where
 * daemon 0 finished a collective, or a send, that daemon 1 had not, the
 * comm goes on only when daemon 0 keeps what it sent to send it again
 * (replay.c), daemon 1 is exactly one behind, and its ranks can make the
 * call again; then daemon 1's ranks run it again and daemon 0's do not.
 * Sends the other way, finished at daemon 1 and not received at daemon 0,
 * go on when daemon 0 says every one of them arrived there (hold.c).
 * Every other such history fails the comm, saying it cannot be rejoined. */
enum { SAME, REPLAYED, NOT_KEPT, TWO_BEHIND, RESTARTED_AHEAD, UNSAFE_BEHIND, SEND_REPLAYED, SEND_NOT_KEPT,
       SEND_KEPT_EARLIER, SEND_ARRIVED, SEND_ARRIVED_SHORT, CASES };
static void test_across_daemons(void **state) {
  (void)state;
  static const char addrs[2][CCSD_ADDR_MAX] = {"10.0.0.1:7000", "10.0.0.2:7000"};
  for (int trial = 0; trial < 200; trial++) {
    int n = 2 + rand() % (RANKS_MAX - 1), rule = trial % CASES;
    struct world w;
    world_init(&w, n);
    int node_of_rank[RANKS_MAX];
    uint64_t kept[2] = {0, 0};
    for (int r = 0; r < n; r++) node_of_rank[r] = r % 2;
    w.c.nnodes = 2, w.c.mynode = 1;
    w.c.node_of_rank = node_of_rank;
    w.c.node_addr = (char(*)[CCSD_ADDR_MAX])addrs;
    w.c.node_kept = kept;
    uint64_t last = (uint64_t)(2 + rand() % 40), fin[2] = {last, last};
    if (rule == REPLAYED || rule == NOT_KEPT || rule == UNSAFE_BEHIND) fin[1] = last - 1;
    if (rule == TWO_BEHIND) fin[1] = last - 2;
    if (rule == RESTARTED_AHEAD) fin[0] = last - 1;
    if (rule != NOT_KEPT) kept[0] = fin[0];
    struct side coll[RANKS_MAX], none[RANKS_MAX], send[RANKS_MAX], recv[RANKS_MAX];
    memset(none, 0, sizeof(none)), memset(send, 0, sizeof(send)), memset(recv, 0, sizeof(recv));
    for (int r = 0; r < n; r++) /* each made the last call; those behind have it out */
      coll[r] = (struct side){.done = fin[r % 2], .taken = last, .unsafe = {rule == UNSAFE_BEHIND && r == 1}};
    int p2p = rule >= SEND_REPLAYED && rule < SEND_ARRIVED, ahead = rule >= SEND_ARRIVED;
    uint64_t sends = (uint64_t)(3 + rand() % 20), lag = rule == SEND_ARRIVED_SHORT ? 2 : 1 + (uint64_t)rand() % 2;
    struct side ahead_send[RANKS_MAX], ahead_recv[RANKS_MAX];
    memset(ahead_send, 0, sizeof(ahead_send)), memset(ahead_recv, 0, sizeof(ahead_recv));
    if (ahead) { /* rank 1's sends to rank 0: the last `lag` finished at daemon 1, not received at daemon 0 */
      ahead_send[0] = (struct side){.done = sends, .taken = sends};
      ahead_recv[1] = (struct side){.done = sends - lag, .taken = sends - lag};
    }
    if (p2p) { /* rank 0's sends to rank 1: the last finished at daemon 0, not received at daemon 1 */
      send[1] = (struct side){.done = sends, .taken = sends};
      recv[0] = (struct side){.done = sends - 1, .taken = sends};
    }
    report(&w, 0, &coll[0], p2p ? send : none, ahead ? ahead_recv : none);
    report(&w, 1, &coll[1], ahead ? ahead_send : none, p2p ? recv : none);
    if (ahead) /* (what daemon 0's word says arrived there) */
      ((struct coll_channel *)verdict(&w, 0, 1, 0))->arrived = rule == SEND_ARRIVED ? sends : sends - 1;
    for (int r = 2; r < n; r++) report(&w, r, &coll[r], none, none);
    if (p2p && rule != SEND_NOT_KEPT) /* (what daemon 0's word says it keeps) */
      ((struct coll_channel *)verdict(&w, 0, 1, 1))->kept = rule == SEND_KEPT_EARLIER ? sends - 1 : sends;
    ccs_result_t rc = ccsd_rejoin_settle(&w.c);
    if (rule == SAME || rule == REPLAYED || rule == SEND_REPLAYED || rule == SEND_ARRIVED) {
      assert_int_equal(rc, CCS_OK);
      for (int r = 0; r < n; r++) {
        assert_int_equal(verdict(&w, r, -1, 0)->finished, fin[r % 2]);
        assert_int_equal(w.m[r].coll_seq, fin[r % 2]); /* daemon 1's ranks call the last one again */
      }
      if (rule == REPLAYED) assert_int_equal(w.c.node_finished[1], last - 1);
      if (p2p) { /* the receive is made again, and numbered as the message sent again */
        assert_int_equal(verdict(&w, 0, 1, 1)->finished, sends - 1);
        assert_int_equal(verdict(&w, 1, 0, 0)->finished, sends - 1);
        assert_int_equal(w.c.np2p, sends > 1 ? 1 : 0);
        if (sends > 1) assert_int_equal(w.c.p2p_counts[0].n, sends - 1);
      }
      if (ahead) { /* finished for both ends: daemon 0's receives take what arrived */
        assert_int_equal(verdict(&w, 1, 0, 1)->finished, sends);
        assert_int_equal(verdict(&w, 0, 1, 0)->finished, sends);
        assert_int_equal(w.c.np2p, 1);
        assert_int_equal(w.c.p2p_counts[0].from, 1);
        assert_int_equal(w.c.p2p_counts[0].n, sends);
      }
    } else {
      assert_int_equal(rc, CCS_ERR_PEER_LOST);
      assert_int_equal(w.c.state, COMM_FAILED);
      assert_non_null(strstr(w.c.error_text, "cannot be rejoined"));
    }
    if (w.c.node_finished != NULL) free(w.c.node_finished);
    free(w.c.p2p_counts);
    world_free(&w);
  }
}

/* A comm nobody rejoins (made afresh) has nothing to settle. */
static void test_fresh_comm_untouched(void **state) {
  (void)state;
  struct world w;
  world_init(&w, 3);
  assert_int_equal(ccsd_rejoin_settle(&w.c), CCS_OK);
  for (int r = 0; r < 3; r++) assert_int_equal(w.m[r].coll_seq, 0);
  assert_int_equal(w.c.state, COMM_JOINING);
}

int main(void) {
  srand((unsigned)time(NULL));
  ccs__log_init(CCS_LOG_ERROR, 0); /* (each failed comm would say so) */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_verdicts),
      cmocka_unit_test(test_disagreeing_reports_fail),
      cmocka_unit_test(test_fresh_comm_untouched),
      cmocka_unit_test(test_across_daemons),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
