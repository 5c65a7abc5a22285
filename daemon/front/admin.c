/* ccsctl's commands, rendered here as text or JSON: status, stuck, comms,
 * abort, config (and config reload: reload.c), tenants (shares.c), metrics. A tenant sees and aborts only its own comms (any
 * other is "no comm of yours", whether or not it exists); operators (root,
 * admin_gids) see and abort all. Who is which was settled at connect. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "front/front.h"
#include "base/log.h"

static const char *state_name(const struct comm *c) {
  /* held: a daemon of it went, and it waits for it to come back (hold.c) */
  return c->state == COMM_JOINING ? "joining" : c->state != COMM_READY ? "failed" : c->hold ? "held" : "ready";
}

/* One pending op: which ranks submitted it, which have not (with pids). */
static void render_slot(struct textbuf *t, const struct comm *c, const struct slot *sl,
                        double age, int json, int *first) {
  const struct post *any = sl->posts[0];
  if (json) {
    textbuf_printf(t, "%s{\"comm\": %llu, \"uid\": %u, \"op\": %llu, \"collective\": \"%s\", "
                      "\"age_s\": %.3f, \"submitted\": [", *first ? "" : ", ",
                   (unsigned long long)c->id, (unsigned)c->uid, (unsigned long long)sl->seq,
                   ccs__coll_name(any->kind), age);
    int n = 0;
    for (int r = 0; r < c->nranks; r++)
      if (ccsd_slot_has(sl, r)) textbuf_printf(t, "%s%d", n++ ? ", " : "", r);
    textbuf_printf(t, "], \"missing\": [");
    n = 0;
    for (int r = 0; r < c->nranks; r++)
      if (!ccsd_slot_has(sl, r) && !(c->members[r] && c->members[r]->remote)) /* others': their daemons' */
        textbuf_printf(t, "%s{\"rank\": %d, \"pid\": %d}", n++ ? ", " : "", r,
                       c->members[r] ? (int)c->members[r]->pid : 0);
    textbuf_printf(t, "]}");
  } else {
    textbuf_printf(t, "  comm %llu %s #%llu: %d/%d ranks %sin, waiting %.1f s; not called by",
                   (unsigned long long)c->id, ccs__coll_name(any->kind),
                   (unsigned long long)sl->seq, sl->nposted, c->nlocal, c->spans ? "of this node " : "", age);
    for (int r = 0; r < c->nranks; r++)
      if (!ccsd_slot_has(sl, r) && !(c->members[r] && c->members[r]->remote))
        textbuf_printf(t, " rank %d (pid %d)", r, c->members[r] ? (int)c->members[r]->pid : 0);
    textbuf_printf(t, "\n");
  }
  *first = 0;
}

static void render_p2p(struct textbuf *t, const struct comm *c, const struct post *p, double age,
                       int json, int *first) {
  const struct member *peer = c->members[p->root];
  const char *what = p->kind == CCS__SEND ? "send" : "recv";
  if (json)
    textbuf_printf(t, "%s{\"comm\": %llu, \"uid\": %u, \"collective\": \"%s\", \"rank\": %d, "
                      "\"peer\": %d, \"age_s\": %.3f, \"missing\": [{\"rank\": %d, \"pid\": %d}]}",
                   *first ? "" : ", ", (unsigned long long)c->id, (unsigned)c->uid, what,
                   p->member->rank, p->root, age, p->root, peer ? (int)peer->pid : 0);
  else
    textbuf_printf(t, "  comm %llu %s from rank %d to rank %d: waiting %.1f s for rank %d (pid %d)\n",
                   (unsigned long long)c->id, what, p->member->rank, p->root, age, p->root,
                   peer ? (int)peer->pid : 0);
  *first = 0;
}

/* Pending ops at least min_age old, of the comms this caller may see. */
static void render_pending(struct textbuf *t, struct daemon *d, int all, uid_t uid,
                           double min_age, int json) {
  uint64_t now = ccsd_now_ms(d);
  int first = 1;
  struct list *it, *tmp, *p, *ptmp;
  LIST_FOREACH_SAFE(it, tmp, &d->coll.comms) {
    const struct comm *c = LIST_ENTRY(it, struct comm, link);
    if (c->gone || (!all && c->uid != uid)) continue;
    LIST_FOREACH_SAFE(p, ptmp, (struct list *)&c->slots) {
      const struct slot *sl = LIST_ENTRY(p, struct slot, link);
      double age = (double)(now - sl->opened_ms) / 1000.0;
      if (age >= min_age) render_slot(t, c, sl, age, json, &first);
    }
    LIST_FOREACH_SAFE(p, ptmp, (struct list *)&c->p2p) {
      const struct post *q = LIST_ENTRY(p, struct post, link);
      double age = (double)(now - q->posted_ms) / 1000.0;
      if (age >= min_age) render_p2p(t, c, q, age, json, &first);
    }
  }
  if (!json && first) textbuf_printf(t, "  (none)\n");
}

static void render_comms(struct textbuf *t, struct daemon *d, int all, uid_t uid, int json) {
  int first = 1;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->coll.comms) {
    const struct comm *c = LIST_ENTRY(it, struct comm, link);
    if (c->gone || (!all && c->uid != uid)) continue;
    int pending = 0;
    struct list *p, *ptmp;
    LIST_FOREACH_SAFE(p, ptmp, (struct list *)&c->slots) pending++;
    if (json) {
      textbuf_printf(t, "%s{\"comm\": %llu, \"uid\": %u, \"nranks\": %d, \"joined\": %d, "
                        "\"left\": %d, \"state\": \"%s\", \"pending_ops\": %d, \"error\": ",
                     first ? "" : ", ", (unsigned long long)c->id, (unsigned)c->uid, c->nranks,
                     c->joined, c->departed, state_name(c), pending);
      textbuf_json_string(t, c->state == COMM_FAILED ? c->error_text : "");
      textbuf_printf(t, ", \"ranks\": [");
      for (int r = 0; r < c->nranks; r++) {
        const struct member *m = c->members[r];
        textbuf_printf(t, "%s{\"rank\": %d, \"pid\": %d, \"connected\": %s, \"daemon\": ", r ? ", " : "",
                       r, m ? (int)m->pid : 0, m && (!m->left || m->remote) ? "true" : "false");
        textbuf_json_string(t, m && m->remote ? m->addr : "");
        textbuf_printf(t, "}");
      }
      textbuf_printf(t, "]}");
    } else {
      textbuf_printf(t, "  comm %llu  uid %u  %d ranks (%d joined, %d left)  %s", (unsigned long long)c->id,
                     (unsigned)c->uid, c->nranks, c->joined, c->departed, state_name(c));
      if (pending) textbuf_printf(t, "  %d ops pending", pending);
      if (c->state == COMM_FAILED) textbuf_printf(t, "  (%s: %s)", ccs_result_name(c->error), c->error_text);
      textbuf_printf(t, "\n");
    }
    first = 0;
  }
  if (!json && first) textbuf_printf(t, "  (none)\n");
}

static void render_status(struct textbuf *t, struct daemon *d, int all, uid_t uid, int json) {
  uint64_t clients = 0, comms = 0, ops = 0;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->tenants) {
    const struct tenant *tn = LIST_ENTRY(it, struct tenant, link);
    if (!all && tn->uid != uid) continue;
    clients += tn->used[TENANT_SESSIONS];
    comms += tn->used[TENANT_COMMS];
    ops += tn->used[TENANT_OPS];
  }
  double up = (double)(ccsd_now_ms(d) - d->started_ms) / 1000.0;
  if (json) {
    textbuf_printf(t, "{\"version\": \"%d.%d.%d\", \"uptime_s\": %.3f, \"clients\": %llu, "
                      "\"comms\": %llu, \"ops_in_flight\": %llu, \"executor_threads\": %d, "
                      "\"client_list\": [", CCS_VERSION_MAJOR, CCS_VERSION_MINOR, CCS_VERSION_PATCH,
                   up, (unsigned long long)clients, (unsigned long long)comms,
                   (unsigned long long)ops, d->cfg.threads);
  } else {
    textbuf_printf(t, "ccsd %d.%d.%d, up %.1f s, %d executor threads\n%llu clients, %llu comms, "
                      "%llu ops in flight%s\nclients:\n", CCS_VERSION_MAJOR, CCS_VERSION_MINOR,
                   CCS_VERSION_PATCH, up, d->cfg.threads, (unsigned long long)clients,
                   (unsigned long long)comms, (unsigned long long)ops,
                   all ? "" : " (yours; operators see all)");
  }
  int first = 1;
  LIST_FOREACH_SAFE(it, tmp, &d->sessions) {
    const struct session *s = LIST_ENTRY(it, struct session, link);
    if (s->closing || (!all && s->uid != uid)) continue;
    if (json)
      textbuf_printf(t, "%s{\"client\": %llu, \"pid\": %d, \"uid\": %u}", first ? "" : ", ",
                     (unsigned long long)s->id, (int)s->pid, (unsigned)s->uid);
    else
      textbuf_printf(t, "  client %llu  pid %d  uid %u\n", (unsigned long long)s->id, (int)s->pid,
                     (unsigned)s->uid);
    first = 0;
  }
  if (json) textbuf_printf(t, "], \"comm_list\": [");
  else textbuf_printf(t, "comms:\n");
  render_comms(t, d, all, uid, json);
  if (json) textbuf_printf(t, "], \"pending\": [");
  else textbuf_printf(t, "ops in flight:\n");
  render_pending(t, d, all, uid, 0, json);
  if (json) textbuf_printf(t, "]}\n");
}

static void render_config(struct textbuf *t, struct daemon *d, int json) {
  char text[16384];
  ccsd_config_format(&d->cfg, text, sizeof(text));
  if (!json) {
    textbuf_printf(t, "%s", text);
    return;
  }
  textbuf_printf(t, "{");
  int first = 1;
  char *save;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *eq = strstr(line, " = ");
    if (!eq) continue;
    *eq = 0;
    textbuf_printf(t, "%s", first ? "" : ", ");
    textbuf_json_string(t, line);
    textbuf_printf(t, ": ");
    textbuf_json_string(t, eq + 3);
    first = 0;
  }
  textbuf_printf(t, "}\n");
}

static ccs_result_t abort_comm(struct session *s, const char *arg, int all, struct textbuf *t) {
  char *end;
  unsigned long long id = strtoull(arg ? arg : "", &end, 10);
  if (!arg || !*arg || *end) {
    textbuf_printf(t, "abort needs a comm number (see ccsctl comms)");
    return CCS_ERR_INVALID_ARGUMENT;
  }
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &s->d->coll.comms) {
    struct comm *c = LIST_ENTRY(it, struct comm, link);
    if (c->gone || c->id != id) continue;
    if (!all && c->uid != s->uid) break; /* as if it did not exist */
    LOG_WARN("comm %llu aborted by ccsctl (pid %d uid %d)", id, (int)s->pid, (int)s->uid);
    ccsd_comm_fail(c, CCS_ERR_ABORTED, "aborted by an operator (ccsctl, uid %d)", (int)s->uid);
    textbuf_printf(t, "comm %llu aborted\n", id);
    return CCS_OK;
  }
  textbuf_printf(t, "no comm %llu of yours", id);
  return all ? CCS_ERR_INVALID_ARGUMENT : CCS_ERR_PERMISSION;
}

void ccsd_admin(struct session *s, uint64_t req_id, const Ccs__Admin *m) {
  struct daemon *d = s->d;
  struct textbuf t = {0};
  int all = s->admin, json = m->json;
  const char *cmd = m->command ? m->command : "";
  const char *arg = m->n_args > 0 ? m->args[0] : NULL;
  ccs_result_t rc = CCS_OK;
  if (!strcmp(cmd, "status")) {
    render_status(&t, d, all, s->uid, json);
  } else if (!strcmp(cmd, "stuck")) {
    char *end;
    double min_age = arg ? strtod(arg, &end) : 0;
    if (arg && (*end || min_age < 0)) {
      textbuf_printf(&t, "stuck takes an age in seconds");
      rc = CCS_ERR_INVALID_ARGUMENT;
    } else {
      if (json) textbuf_printf(&t, "[");
      render_pending(&t, d, all, s->uid, min_age, json);
      if (json) textbuf_printf(&t, "]\n");
    }
  } else if (!strcmp(cmd, "comms")) {
    if (json) textbuf_printf(&t, "[");
    render_comms(&t, d, all, s->uid, json);
    if (json) textbuf_printf(&t, "]\n");
  } else if (!strcmp(cmd, "abort")) {
    rc = abort_comm(s, arg, all, &t);
  } else if (!strcmp(cmd, "config") && arg && !strcmp(arg, "reload")) {
    if (!all) {
      textbuf_printf(&t, "config reload is for operators (root, admin_gids)");
      rc = CCS_ERR_PERMISSION;
    } else {
      ccsd_reload_start(d, s->id, req_id); /* answered once the sources are read */
      free(t.buf);
      return;
    }
  } else if (!strcmp(cmd, "config")) {
    render_config(&t, d, json);
  } else if (!strcmp(cmd, "tenants")) {
    ccsd_shares_render(&t, d, all, s->uid, json, arg && !strcmp(arg, "raw"));
  } else if (!strcmp(cmd, "metrics")) {
    size_t len;
    char *text = ccsd_metrics_render(d, all ? METRICS_PER_TENANT : METRICS_TENANT, s->uid, &len);
    if (text) textbuf_printf(&t, "%s", text);
    else rc = CCS_ERR_NO_MEMORY;
    free(text);
  } else {
    textbuf_printf(&t, "unknown command '%s' (status, stuck, comms, abort, config, config reload, "
                       "tenants, metrics)", cmd);
    rc = CCS_ERR_INVALID_ARGUMENT;
  }
  ccsd_admin_reply(s, req_id, t.failed ? CCS_ERR_NO_MEMORY : rc, t.buf ? t.buf : "");
  free(t.buf);
}

void ccsd_admin_reply(struct session *s, uint64_t req_id, ccs_result_t rc, const char *text) {
  Ccs__Reply r = CCS__REPLY__INIT;
  Ccs__AdminReply a = CCS__ADMIN_REPLY__INIT;
  r.id = req_id;
  r.status = rc;
  if (rc == CCS_OK) {
    a.text = (char *)text;
    r.body_case = CCS__REPLY__BODY_ADMIN;
    r.admin = &a;
  } else {
    r.error = (char *)(*text ? text : ccs_strerror(rc));
  }
  ccsd_session_send(s, &r);
}
