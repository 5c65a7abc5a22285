/* A request waiting for its reply. A Submit completes when each of its ops
 * did; the reply carries the first error, over the socket or through the
 * completion ring, the way the call came. If the client left meanwhile the
 * submission is orphaned and freed silently when its last op completes. */
#include <stdlib.h>
#include <string.h>

#include "front/front.h"
#include "base/failpoint.h"
#include "journal.h"

struct submission *ccsd_submission_new(struct session *s, uint64_t req_id, int nposts, int via_ring) {
  struct submission *sub = calloc(1, sizeof(*sub));
  if (!sub) return NULL;
  sub->session = s;
  sub->d = s->d;
  sub->req_id = req_id;
  sub->via_ring = via_ring;
  s->d->ring_calls_open += via_ring != 0;
  sub->nposts = nposts;
  list_insert_tail(&s->submissions, &sub->link);
  return sub;
}

void ccsd_submission_post_done(struct submission *sub, ccs_result_t status, const char *error) {
  sub->ndone++;
  if (status != CCS_OK && sub->status == CCS_OK) {
    sub->status = status;
    sub->error = strdup(error ? error : "");
  }
  if (sub->ndone < sub->nposts) return;
  sub->d->ring_calls_open -= sub->via_ring != 0;
  /* done, whether or not the answer gets there (docs/restart.md) */
  if (sub->status == CCS_OK)
    ccsd_journal_mark(sub->session, sub->req_id, sub->via_ring, CCS__JOURNAL_FINISHED, sub->seq);
  if (sub->session) ccsd_failpoint("answer");
  if (sub->session && sub->via_ring) {
    list_remove(&sub->link);
    ccsd_ring_complete(sub->session, sub->req_id, sub->status, sub->error);
  } else if (sub->session) {
    Ccs__Reply r = CCS__REPLY__INIT;
    Ccs__CommInitReply init = CCS__COMM_INIT_REPLY__INIT;
    r.id = sub->req_id;
    r.status = sub->status;
    r.error = sub->error ? sub->error : "";
    r.info = sub->info ? sub->info : "";
    const struct client_comm *cc = sub->comm_handle ? ccsd_client_comm_find(sub->session, sub->comm_handle) : NULL;
    const struct member *member = cc ? cc->member : NULL;
    const struct coll_rejoin *rj = member ? member->rejoin : NULL;
    Ccs__Verdict *verdicts = rj ? calloc(rj->n ? rj->n : 1, sizeof(*verdicts)) : NULL; /* (n 0: an init sent again) */
    Ccs__Verdict **vs = rj ? calloc(rj->n ? rj->n : 1, sizeof(*vs)) : NULL;
    if (rj && (!verdicts || !vs)) { /* no verdicts, no rejoin */
      r.status = CCS_ERR_NO_MEMORY;
      r.error = "out of memory";
    }
    if (sub->comm_handle && r.status == CCS_OK) {
      init.comm = sub->comm_handle;
      if (member) {
        init.id.data = member->comm->id_bytes;
        init.id.len = sizeof(member->comm->id_bytes);
        init.spans = member->comm->spans != 0;
      }
      for (size_t i = 0; rj && i < rj->n; i++) {
        ccs__verdict__init(&verdicts[i]);
        verdicts[i].finished = rj->ch[i].finished;
        verdicts[i].retry_from = rj->ch[i].retry_from;
        vs[init.n_verdicts++] = &verdicts[i];
      }
      init.verdicts = vs;
      r.body_case = CCS__REPLY__BODY_COMM_INIT;
      r.comm_init = &init;
    }
    list_remove(&sub->link);
    ccsd_session_send(sub->session, &r);
    free(verdicts);
    free(vs);
  }
  free(sub->error);
  free(sub->info);
  free(sub);
}

/* CCS_DEBUG=INFO texts of one reply: a group of thousands of ops says how
 * the first ones ran, then that there were more. */
#define INFO_MAX (64u << 10)

void ccsd_submission_note(struct submission *sub, const char *info) {
  size_t had = sub->info ? strlen(sub->info) : 0, add = strlen(info);
  static const char more[] = "(and more ops: CCS_DEBUG=INFO texts are cut at 64 KiB per call)";
  if (had + add + 1 > INFO_MAX) {
    if (had && strstr(sub->info, more)) return;
    info = more;
    add = strlen(more);
  }
  char *grown = realloc(sub->info, had + add + 2);
  if (!grown) return; /* a debugging aid, not worth failing the op */
  if (had) grown[had++] = '\n';
  memcpy(grown + had, info, add + 1);
  sub->info = grown;
}

void ccsd_submission_orphan_all(struct session *s) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &s->submissions) {
    struct submission *sub = LIST_ENTRY(it, struct submission, link);
    sub->session = NULL;
    list_remove(&sub->link);
  }
}
