/* A client's post from its request to its release (coll.h post_ops): the
 * answer goes to the submission it came in (and the metrics); the release
 * lets go of its buffers, its place in the client's stream (whatever
 * became of the op, the client's stream may go on) and its charge. */
#include <stdlib.h>

#include "front/front.h"
#include "journal.h"

void ccsd_client_post_free(struct client_post *cp) {
  ccsd_membuf_unref(cp->sendbuf);
  ccsd_membuf_unref(cp->recvbuf);
  ccsd_tenant_release(cp->tenant, TENANT_OPS, 1);
  if (cp->post.order.flags) {
    ccsd_gpu_order_done(&cp->post.order);
    ccsd_gpu_flags_unref(cp->post.order.flags);
  }
  free(cp);
}

static struct client_post *of(struct post *p) { return LIST_ENTRY(p, struct client_post, post); }

static void reply(struct post *p, ccs_result_t status, const char *error) {
  struct client_post *cp = of(p);
  const struct comm *c = p->member->comm;
  ccsd_metrics_record(cp->d, c->uid, p->kind, c->nranks, status,
                      p->send_len > p->recv_len ? p->send_len : p->recv_len,
                      (double)(uv_hrtime() - p->posted_ns) / 1e9);
  ccsd_metrics_record_algo(cp->d, p->kind, p->algo);
  if (cp->sub->nposts == 1 && !ccsd_p2p_kind(p->kind)) cp->sub->seq = p->seq;
  ccsd_submission_post_done(cp->sub, status, error);
}

static void note(struct post *p, const char *info) { ccsd_submission_note(of(p)->sub, info); }

static void started(struct post *p) {
  struct submission *sub = of(p)->sub;
  ccsd_journal_mark(sub->session, sub->req_id, sub->via_ring, CCS__JOURNAL_STARTED, 0);
}

static void release(struct post *p) { ccsd_client_post_free(of(p)); }

const struct post_ops ccsd_client_post_ops = {started, reply, note, release};
