/* Reloading the configuration (SIGHUP, ccsctl config reload). Its sources
 * are read again off the loop (a user name in tenant_weights is a lookup
 * in the user database, which may be remote), then what may change while
 * the daemon runs is applied on the loop: tenants' weights and their cap,
 * quotas, log level and subsystems. Nothing in flight is dropped: a
 * tenant's next op is scheduled by its new weight. Any other key that
 * changed is named as taking effect at the next start. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "front/front.h"

struct reload {
  uv_work_t work;
  struct daemon *d;
  int argc;
  char **argv;
  uint64_t session_id, req_id; /* who asked (0: a signal) */
  struct ccsd_config fresh;
  int failed;
  char err[1024];
};

/* The keys a reload applies. */
static int reloadable(const char *key) {
  static const char *const keys[] = {"tenant_weights", "tenant_max_share", "log_level", "log_subsys"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
    if (!strcmp(key, keys[i])) return 1;
  return !strncmp(key, "quota_", 6);
}

static void read_sources(uv_work_t *w) {
  struct reload *r = w->data;
  r->failed = ccsd_config_load(&r->fresh, r->argc, r->argv, r->err, sizeof(r->err)) != 0;
}

/* Copies the reloadable fields and says, per changed key, what happened. */
static void apply(struct daemon *d, const struct ccsd_config *fresh, struct textbuf *t) {
  static char before[16384], after[16384]; /* loop thread only */
  ccsd_config_format(&d->cfg, before, sizeof(before));
  ccsd_config_format(fresh, after, sizeof(after));
  struct textbuf later = {0};
  int changed = 0;
  char *s1, *s2;
  for (char *a = strtok_r(before, "\n", &s1), *b = strtok_r(after, "\n", &s2); a && b;
       a = strtok_r(NULL, "\n", &s1), b = strtok_r(NULL, "\n", &s2)) {
    if (!strcmp(a, b)) continue;
    char key[64];
    size_t klen = strcspn(b, " ");
    snprintf(key, sizeof(key), "%.*s", (int)(klen < sizeof(key) ? klen : sizeof(key) - 1), b);
    const char *was = strstr(a, " = "), *now = strstr(b, " = ");
    if (reloadable(key)) {
      textbuf_printf(t, "%s: %s -> %s\n", key, was ? was + 3 : "", now ? now + 3 : "");
      changed++;
    } else {
      textbuf_printf(&later, "%s%s", later.len ? ", " : "", key);
    }
  }
  struct ccsd_config *c = &d->cfg;
  memcpy(c->tenant_weights, fresh->tenant_weights, sizeof(c->tenant_weights));
  memcpy(c->weight_uids, fresh->weight_uids, sizeof(c->weight_uids));
  memcpy(c->weights, fresh->weights, sizeof(c->weights));
  c->nweights = fresh->nweights;
  c->tenant_max_share = fresh->tenant_max_share;
  memcpy(c->quota, fresh->quota, sizeof(c->quota));
  c->log_level = fresh->log_level;
  c->log_subsys = fresh->log_subsys;
  ccs__log_init(c->log_level, c->log_subsys);
  ccsd_shares_configure(d);
  if (!changed) textbuf_printf(t, "nothing that a reload applies changed\n");
  if (later.len)
    textbuf_printf(t, "changed, taking effect at the next start: %s\n", later.buf ? later.buf : "");
  free(later.buf);
}

static void reloaded(uv_work_t *w, int status) {
  struct reload *r = w->data;
  struct daemon *d = r->d;
  struct textbuf t = {0};
  ccs_result_t rc = CCS_OK;
  if (status || r->failed) {
    textbuf_printf(&t, "the configuration was not reloaded: %s", status ? uv_strerror(status) : r->err);
    rc = CCS_ERR_INVALID_ARGUMENT;
  } else if (!d->stopping) {
    apply(d, &r->fresh, &t);
  }
  if (rc == CCS_OK) LOG_WARN("configuration reloaded%s: %s", r->session_id ? " (ccsctl)" : " (SIGHUP)",
                             t.buf ? t.buf : "");
  else LOG_WARN("%s", t.buf ? t.buf : "the configuration was not reloaded");
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->sessions) {
    struct session *s = LIST_ENTRY(it, struct session, link);
    if (!r->session_id || s->id != r->session_id || s->closing) continue;
    ccsd_admin_reply(s, r->req_id, t.failed ? CCS_ERR_NO_MEMORY : rc, t.buf ? t.buf : "");
  }
  free(t.buf);
  free(r);
}

void ccsd_reload_start(struct daemon *d, uint64_t session_id, uint64_t req_id) {
  struct reload *r = calloc(1, sizeof(*r));
  int e = r ? 0 : UV_ENOMEM;
  if (r) {
    *r = (struct reload){.d = d, .argc = d->argc, .argv = d->argv, .session_id = session_id,
                         .req_id = req_id};
    r->work.data = r;
    e = uv_queue_work(d->loop, &r->work, read_sources, reloaded);
  }
  if (!e) return;
  free(r);
  LOG_WARN("the configuration was not reloaded: %s", uv_strerror(e));
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->sessions) {
    struct session *s = LIST_ENTRY(it, struct session, link);
    if (session_id && s->id == session_id && !s->closing)
      ccsd_admin_reply(s, req_id, CCS_ERR_NO_MEMORY, uv_strerror(e));
  }
}
