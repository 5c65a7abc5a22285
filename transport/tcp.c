/* The TCP transport: non-blocking sockets, TCP_NODELAY, each message a
 * 16-byte header (tag, length) and its payload, written with writev
 * straight from the caller's buffer and read straight into the posted one
 * (only a message that arrives before its receive is posted is held in a
 * buffer of its own, up to 1 GiB). A connection that errors or closes
 * fails its pending posts with a negative errno. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "transport.h"

#define HEADER 16
#define MAX_UNEXPECTED (1ull << 30)

struct op {
  struct op *next;
  const char *sbuf;
  char *rbuf;
  size_t len, off;
  uint64_t tag;
  void *user;
};

struct umsg { /* arrived before its receive */
  struct umsg *next;
  uint64_t tag;
  size_t len;
  char *data;
};

struct tconn {
  struct tconn *next;
  struct transport *t;
  int fd, dead;
  struct op *sends, *sends_tail, *recvs, *recvs_tail;
  struct umsg *unexp, *unexp_tail;
  uint8_t shdr[HEADER];
  size_t shdr_sent;
  /* the message being read */
  uint8_t rhdr[HEADER];
  size_t rhdr_got, body_len, body_got;
  int in_body;
  uint64_t body_tag;
  struct op *body_op;     /* its posted receive, or */
  struct umsg *body_umsg; /* where it is held */
};

struct transport {
  int listen_fd;
  int wake_fd; /* an eventfd: wake() from other threads */
  struct tconn *conns;
  struct tcompletion *done;
  size_t ndone, cap;
};

static void complete(struct tconn *c, struct op *op, int is_send, int status, size_t bytes) {
  struct transport *t = c->t;
  if (t->ndone == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 64;
    struct tcompletion *grown = realloc(t->done, cap * sizeof(*grown));
    if (!grown) abort(); /* a completion lost would hang its owner: nothing sane left */
    t->done = grown;
    t->cap = cap;
  }
  t->done[t->ndone++] = (struct tcompletion){c, op->tag, op->user, is_send, status, bytes};
  free(op);
}

static void fail(struct tconn *c, int status) {
  if (c->dead) return;
  c->dead = 1;
  for (struct op *op = c->sends, *next; op; op = next) next = op->next, complete(c, op, 1, status, 0);
  for (struct op *op = c->recvs, *next; op; op = next) next = op->next, complete(c, op, 0, status, 0);
  if (c->body_op) complete(c, c->body_op, 0, status, 0);
  c->sends = c->sends_tail = c->recvs = c->recvs_tail = c->body_op = NULL;
  /* whole messages that arrived stay for the receives still to come: a
   * peer that sent everything and closed lost nothing */
  if (c->body_umsg) free(c->body_umsg->data), free(c->body_umsg);
  c->body_umsg = NULL;
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
}

static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static void flush_sends(struct tconn *c) {
  while (c->sends && !c->dead) {
    struct op *op = c->sends;
    if (op->off == 0 && c->shdr_sent == 0) {
      put64(c->shdr, op->tag);
      put64(c->shdr + 8, op->len);
    }
    struct iovec iov[2] = {{c->shdr + c->shdr_sent, HEADER - c->shdr_sent},
                           {(void *)(op->sbuf + op->off), op->len - op->off}};
    int first = c->shdr_sent == HEADER;
    ssize_t n = writev(c->fd, iov + first, 2 - first);
    if (n < 0) {
      if (errno != EAGAIN && errno != EINTR) fail(c, -errno);
      return;
    }
    size_t left = (size_t)n;
    size_t h = HEADER - c->shdr_sent < left ? HEADER - c->shdr_sent : left;
    c->shdr_sent += h;
    op->off += left - h;
    if (c->shdr_sent < HEADER || op->off < op->len) return; /* the socket is full */
    c->sends = op->next;
    if (!c->sends) c->sends_tail = NULL;
    c->shdr_sent = 0;
    complete(c, op, 1, 0, op->len);
  }
}

/* A held message meets the first receive posted for its tag. */
static int deliver(struct tconn *c, struct umsg *u, struct op *op) {
  if (u->len > op->len) return -EMSGSIZE;
  memcpy(op->rbuf, u->data, u->len);
  complete(c, op, 0, 0, u->len);
  free(u->data);
  free(u);
  return 0;
}

static struct op *take_recv(struct tconn *c, uint64_t tag) {
  for (struct op **p = &c->recvs, *prev = NULL; *p; prev = *p, p = &(*p)->next) {
    if ((*p)->tag != tag) continue;
    struct op *op = *p;
    *p = op->next;
    if (c->recvs_tail == op) c->recvs_tail = prev;
    return op;
  }
  return NULL;
}

static void read_messages(struct tconn *c) {
  while (!c->dead) {
    if (!c->in_body) {
      ssize_t n = read(c->fd, c->rhdr + c->rhdr_got, HEADER - c->rhdr_got);
      if (n == 0) { fail(c, -ECONNRESET); return; }
      if (n < 0) {
        if (errno != EAGAIN && errno != EINTR) fail(c, -errno);
        return;
      }
      c->rhdr_got += (size_t)n;
      if (c->rhdr_got < HEADER) continue;
      c->rhdr_got = 0;
      c->body_tag = get64(c->rhdr);
      c->body_len = get64(c->rhdr + 8);
      c->body_got = 0;
      c->in_body = 1;
      /* an earlier held message of this tag keeps its place in the order */
      int held = 0;
      for (struct umsg *u = c->unexp; u; u = u->next) held |= u->tag == c->body_tag;
      c->body_op = held ? NULL : take_recv(c, c->body_tag);
      if (c->body_op && c->body_len > c->body_op->len) { fail(c, -EMSGSIZE); return; }
      if (!c->body_op) {
        if (c->body_len > MAX_UNEXPECTED) { fail(c, -EMSGSIZE); return; }
        c->body_umsg = calloc(1, sizeof(*c->body_umsg));
        if (c->body_umsg) c->body_umsg->data = malloc(c->body_len ? c->body_len : 1);
        if (!c->body_umsg || !c->body_umsg->data) { fail(c, -ENOMEM); return; }
        c->body_umsg->tag = c->body_tag;
        c->body_umsg->len = c->body_len;
      }
    }
    char *dst = c->body_op ? c->body_op->rbuf : c->body_umsg->data;
    if (c->body_got < c->body_len) {
      ssize_t n = read(c->fd, dst + c->body_got, c->body_len - c->body_got);
      if (n == 0) { fail(c, -ECONNRESET); return; }
      if (n < 0) {
        if (errno != EAGAIN && errno != EINTR) fail(c, -errno);
        return;
      }
      c->body_got += (size_t)n;
      if (c->body_got < c->body_len) continue;
    }
    c->in_body = 0;
    if (c->body_op) {
      struct op *op = c->body_op;
      c->body_op = NULL;
      complete(c, op, 0, 0, c->body_len);
      continue;
    }
    struct umsg *u = c->body_umsg;
    c->body_umsg = NULL;
    struct op *op = NULL;
    int held = 0;
    for (struct umsg *e = c->unexp; e; e = e->next) held |= e->tag == u->tag;
    if (!held) op = take_recv(c, u->tag); /* posted while it was arriving */
    if (op) {
      int rc = deliver(c, u, op);
      if (rc) { fail(c, rc); return; }
      continue;
    }
    if (c->unexp_tail) c->unexp_tail->next = u;
    else c->unexp = u;
    c->unexp_tail = u;
  }
}

static struct transport *tcp_open(char *err, size_t errlen) {
  struct transport *t = calloc(1, sizeof(*t));
  if (!t) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  t->listen_fd = -1;
  t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (t->wake_fd < 0) {
    snprintf(err, errlen, "eventfd: %s", strerror(errno));
    free(t);
    return NULL;
  }
  return t;
}

static int resolve(const char *addr, struct addrinfo **ret, char *err, size_t errlen) {
  char host[256];
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof(host)) {
    snprintf(err, errlen, "'%s' is not HOST:PORT", addr);
    return -1;
  }
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = 0;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
  int rc = getaddrinfo(host, colon + 1, &hints, ret);
  if (rc) snprintf(err, errlen, "%s: %s", addr, gai_strerror(rc));
  return rc ? -1 : 0;
}

static struct tconn *adopt(struct transport *t, int fd) {
  struct tconn *c = calloc(1, sizeof(*c));
  if (!c) {
    close(fd);
    return NULL;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  c->fd = fd;
  c->t = t;
  c->next = t->conns;
  t->conns = c;
  return c;
}

static int tcp_listen(struct transport *t, const char *addr, char *bound, size_t boundlen, char *err,
                      size_t errlen) {
  struct addrinfo *ai;
  if (resolve(addr, &ai, err, errlen)) return -1;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 128)) {
    snprintf(err, errlen, "cannot listen on %s: %s", addr, strerror(errno));
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    return -1;
  }
  freeaddrinfo(ai);
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  char host[128], port[16];
  getsockname(fd, (struct sockaddr *)&ss, &len);
  getnameinfo((struct sockaddr *)&ss, len, host, sizeof(host), port, sizeof(port),
              NI_NUMERICHOST | NI_NUMERICSERV);
  snprintf(bound, boundlen, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
  t->listen_fd = fd;
  return 0;
}

static int tcp_connect(struct transport *t, const char *addr, double timeout_s, struct tconn **ret,
                       char *err, size_t errlen) {
  char plain[300];
  snprintf(plain, sizeof(plain), "%s", addr);
  if (plain[0] == '[') { /* [v6]:port */
    char *close_b = strchr(plain, ']');
    if (close_b) memmove(close_b, close_b + 1, strlen(close_b)), memmove(plain, plain + 1, strlen(plain));
  }
  struct addrinfo *ai;
  if (resolve(plain, &ai, err, errlen)) return -1;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int rc = fd < 0 ? -1 : connect(fd, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  if (rc && errno == EINPROGRESS) {
    struct pollfd p = {fd, POLLOUT, 0};
    int soerr = ETIMEDOUT;
    socklen_t len = sizeof(soerr);
    if (poll(&p, 1, (int)(timeout_s * 1000)) == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
    errno = soerr;
    rc = soerr ? -1 : 0;
  }
  if (rc) {
    snprintf(err, errlen, "cannot connect to %s: %s", addr, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  *ret = adopt(t, fd);
  if (!*ret) snprintf(err, errlen, "out of memory");
  return *ret ? 0 : -1;
}

static int tcp_accept(struct transport *t, struct tconn **ret) {
  int fd = accept4(t->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
  *ret = adopt(t, fd);
  return *ret ? 1 : -1;
}

static struct op *new_op(const void *sbuf, void *rbuf, size_t len, uint64_t tag, void *user) {
  struct op *op = calloc(1, sizeof(*op));
  if (op) *op = (struct op){NULL, sbuf, rbuf, len, 0, tag, user};
  return op;
}

struct tmem {
  const char *base;
  size_t len;
};

static struct tmem *tcp_mem_register(struct transport *t, void *base, size_t len, char *err,
                                     size_t errlen) {
  struct tmem *m = malloc(sizeof(*m));
  if (!m) snprintf(err, errlen, "out of memory");
  else *m = (struct tmem){base, len};
  return m;
}

static void tcp_mem_deregister(struct tmem *m) { free(m); }

static int outside(const struct tmem *m, const void *buf, size_t len) {
  uintptr_t b = (uintptr_t)buf, lo = (uintptr_t)m->base;
  return b < lo || b - lo > m->len || len > m->len - (b - lo);
}

static int tcp_post_send(struct tconn *c, struct tmem *m, const void *buf, size_t len,
                         uint64_t tag, void *user) {
  if (m && outside(m, buf, len)) return -EFAULT;
  if (c->dead) return -ECONNRESET;
  struct op *op = new_op(buf, NULL, len, tag, user);
  if (!op) return -ENOMEM;
  if (c->sends_tail) c->sends_tail->next = op;
  else c->sends = op;
  c->sends_tail = op;
  flush_sends(c); /* small messages leave at once */
  return 0;
}

static int tcp_post_recv(struct tconn *c, struct tmem *m, void *buf, size_t len, uint64_t tag,
                         void *user) {
  if (m && outside(m, buf, len)) return -EFAULT;
  struct op *op = new_op(NULL, buf, len, tag, user);
  if (!op) return -ENOMEM;
  for (struct umsg **p = &c->unexp, *prev = NULL; *p; prev = *p, p = &(*p)->next) {
    if ((*p)->tag != tag) continue;
    struct umsg *u = *p;
    *p = u->next;
    if (c->unexp_tail == u) c->unexp_tail = prev;
    int rc = deliver(c, u, op);
    if (rc) {
      free(op);
      free(u->data);
      free(u);
      return rc;
    }
    return 0;
  }
  if (c->dead) {
    free(op);
    return -ECONNRESET;
  }
  if (c->recvs_tail) c->recvs_tail->next = op;
  else c->recvs = op;
  c->recvs_tail = op;
  return 0;
}

static int tcp_poll(struct transport *t, int timeout_ms, struct tcompletion *out, int max) {
  if (t->ndone == 0) {
    size_t n = 0;
    for (struct tconn *c = t->conns; c; c = c->next) n += !c->dead;
    struct pollfd *fds = calloc(n + 3, sizeof(*fds));
    struct tconn **who = calloc(n + 1, sizeof(*who));
    if (!fds || !who) {
      free(fds);
      free(who);
      return -ENOMEM;
    }
    size_t i = 0;
    for (struct tconn *c = t->conns; c; c = c->next) {
      if (c->dead) continue;
      fds[i] = (struct pollfd){c->fd, (short)(POLLIN | (c->sends ? POLLOUT : 0)), 0};
      who[i++] = c;
    }
    size_t nconn = i;
    fds[i++] = (struct pollfd){t->wake_fd, POLLIN, 0};
    if (t->listen_fd >= 0) fds[i++] = (struct pollfd){t->listen_fd, POLLIN, 0};
    if (poll(fds, i, timeout_ms) > 0) {
      if (fds[nconn].revents & POLLIN) {
        uint64_t v;
        if (read(t->wake_fd, &v, sizeof(v)) < 0) { /* nothing to do: it was a wake-up */ }
      }
      for (size_t k = 0; k < nconn; k++) {
        if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) read_messages(who[k]);
        if (!who[k]->dead && (fds[k].revents & (POLLOUT | POLLERR))) flush_sends(who[k]);
      }
    }
    free(fds);
    free(who);
  }
  int n = (int)(t->ndone < (size_t)max ? t->ndone : (size_t)max);
  if (n > 0) {
    memcpy(out, t->done, sizeof(*out) * (size_t)n);
    memmove(t->done, t->done + n, sizeof(*out) * (t->ndone - (size_t)n));
    t->ndone -= (size_t)n;
  }
  return n;
}

static void tcp_close(struct tconn *c) {
  fail(c, -ECANCELED);
  for (struct umsg *u = c->unexp, *next; u; u = next) next = u->next, free(u->data), free(u);
  for (struct tconn **p = &c->t->conns; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  /* completions still to be polled for c no longer name it: c is gone */
  struct transport *t = c->t;
  for (size_t i = 0; i < t->ndone; i++)
    if (t->done[i].conn == c) t->done[i].conn = NULL;
  free(c);
}

static void tcp_free(struct transport *t) {
  if (!t) return;
  while (t->conns) tcp_close(t->conns);
  if (t->listen_fd >= 0) close(t->listen_fd);
  close(t->wake_fd);
  free(t->done);
  free(t);
}

static void tcp_wake(struct transport *t) {
  uint64_t one = 1;
  if (write(t->wake_fd, &one, sizeof(one)) < 0) { /* the counter is full: a wake-up is pending */ }
}

const struct transport_ops ccs_transport_tcp = {
    .name = "tcp",
    .open = tcp_open,
    .listen = tcp_listen,
    .connect = tcp_connect,
    .accept = tcp_accept,
    .mem_register = tcp_mem_register,
    .mem_deregister = tcp_mem_deregister,
    .post_send = tcp_post_send,
    .post_recv = tcp_post_recv,
    .poll = tcp_poll,
    .close = tcp_close,
    .free = tcp_free,
    .wake = tcp_wake,
};
