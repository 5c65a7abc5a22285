/* The optional HTTP endpoint for Prometheus (metrics_listen = HOST:PORT, a
 * port alone meaning localhost): every GET gets the whole exposition, then
 * the connection closes. It is an operator interface: whoever reaches it
 * reads it, so per-tenant series (uids) only where metrics_tenant_labels
 * is on; at most metrics_max_connections at once, each closed after
 * io_timeout whatever it is doing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "front/front.h"
#include "base/log.h"

struct http_conn {
  struct list link; /* in d->http_conns until closed */
  uv_tcp_t tcp;
  uv_timer_t idle; /* io_timeout from the connect */
  int handles;     /* open uv handles: freed at 0 */
  struct daemon *d;
  char req[4096];
  size_t len;
  uv_write_t write;
  char *response;
  int responded;
};

static void on_conn_closed(uv_handle_t *h) {
  struct http_conn *c = h->data;
  if (--c->handles > 0) return;
  list_remove(&c->link);
  c->d->nhttp_conns--;
  free(c->response);
  free(c);
}

static void conn_close(struct http_conn *c) {
  if (uv_is_closing((uv_handle_t *)&c->tcp)) return;
  uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
  uv_close((uv_handle_t *)&c->idle, on_conn_closed);
}

static void on_written(uv_write_t *w, int status) { conn_close(w->data); }

static void on_idle(uv_timer_t *t) { conn_close(t->data); }

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  struct http_conn *c = h->data;
  *buf = uv_buf_init(c->req + c->len, (unsigned)(sizeof(c->req) - 1 - c->len));
}

static void respond(struct http_conn *c) {
  c->responded = 1;
  uv_read_stop((uv_stream_t *)&c->tcp);
  int found = !strncmp(c->req, "GET /metrics ", 13) || !strncmp(c->req, "GET / ", 6);
  size_t blen = 0;
  char *body = found ? ccsd_metrics_render(c->d, c->d->cfg.metrics_tenant_labels ? METRICS_PER_TENANT
                                                                             : METRICS_SUMMED,
                                            0, &blen)
                     : NULL;
  const char *status = body ? "200 OK" : found ? "500 Internal Server Error" : "404 Not Found";
  size_t cap = blen + 256;
  c->response = malloc(cap);
  if (!c->response) {
    free(body);
    conn_close(c);
    return;
  }
  int n = snprintf(c->response, cap,
                   "HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   status, blen);
  if (body) memcpy(c->response + n, body, blen);
  free(body);
  uv_buf_t buf = uv_buf_init(c->response, (unsigned)((size_t)n + blen));
  c->write.data = c;
  if (uv_write(&c->write, (uv_stream_t *)&c->tcp, &buf, 1, on_written)) conn_close(c);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  struct http_conn *c = s->data;
  if (c->responded) return;
  if (n < 0) {
    conn_close(c);
    return;
  }
  c->len += (size_t)n;
  c->req[c->len] = 0;
  if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n") || c->len >= sizeof(c->req) - 1)
    respond(c);
}

static void on_connection(uv_stream_t *server, int status) {
  struct daemon *d = server->data;
  if (status < 0) return;
  struct http_conn *c = calloc(1, sizeof(*c));
  if (!c) return;
  c->d = d;
  list_insert_tail(&d->http_conns, &c->link);
  d->nhttp_conns++;
  uv_tcp_init(d->loop, &c->tcp);
  uv_timer_init(d->loop, &c->idle);
  c->tcp.data = c->idle.data = c;
  c->handles = 2;
  /* accepted either way: one over the cap is closed at once, not left queued */
  if (uv_accept(server, (uv_stream_t *)&c->tcp) || d->nhttp_conns > d->cfg.metrics_max_connections ||
      uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read)) {
    conn_close(c);
    return;
  }
  uv_timer_start(&c->idle, on_idle, (uint64_t)(d->cfg.io_timeout_s * 1000), 0);
}

int ccsd_metrics_http_start(struct daemon *d) {
  char host[64];
  snprintf(host, sizeof(host), "%s", d->cfg.metrics_listen);
  char *colon = strrchr(host, ':');
  if (!colon) return -1;
  *colon = 0;
  int port = atoi(colon + 1);
  if (host[0] == '[') { /* [::1]:9464 */
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = 0;
  }
  struct sockaddr_storage addr;
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)&addr) &&
      uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr)) {
    LOG_ERROR("metrics_listen: '%s' is not an IP address and port", d->cfg.metrics_listen);
    return -1;
  }
  uv_tcp_init(d->loop, &d->metrics_server);
  d->metrics_server.data = d;
  int rc = uv_tcp_bind(&d->metrics_server, (struct sockaddr *)&addr, 0);
  if (!rc) rc = uv_listen((uv_stream_t *)&d->metrics_server, 64, on_connection);
  if (rc) {
    LOG_ERROR("metrics_listen %s: %s", d->cfg.metrics_listen, uv_strerror(rc));
    uv_close((uv_handle_t *)&d->metrics_server, NULL);
    return -1;
  }
  d->metrics_on = 1;
  LOG_INFO(CCS_LOG_OPS, "metrics on http://%s/metrics", d->cfg.metrics_listen);
  return 0;
}

void ccsd_metrics_http_stop(struct daemon *d) {
  if (!d->metrics_on) return;
  d->metrics_on = 0;
  uv_close((uv_handle_t *)&d->metrics_server, NULL);
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &d->http_conns) {
    conn_close(LIST_ENTRY(it, struct http_conn, link));
  }
}
