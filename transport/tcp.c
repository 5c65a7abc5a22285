/* The TCP transport: non-blocking sockets, TCP_NODELAY, each message a
 * 16-byte header (tag, length), its payload and a 16-byte authentication
 * tag, written with writev straight from the caller's buffer and read
 * straight into the posted one (only a message that arrives before its
 * receive is posted is held in a buffer of its own, within the caps on
 * held bytes). A connection that errors, closes or fails authentication
 * fails its pending posts with a negative errno.
 *
 * Every connection first proves, both ways, that its ends hold the
 * cluster key (auth.h); a connection is only used once that is done, so
 * nothing of a stranger's is ever read beyond a fixed-size greeting, and
 * nothing is sent to whatever answers a connect until it greeted as a
 * daemon of this cluster. Then every message is authenticated under the
 * connection's keys; control messages (tag 0) are encrypted, data
 * messages too where either end asked (peer_encrypt). */
#include <errno.h>
#include <fcntl.h>
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

#include "accept.h"
#include "addr.h"
#include "auth.h"
#include "transport.h"

#define HEADER 16
#define RX_AHEAD 4096 /* what is read ahead of the message being read; larger parts go straight */

struct op {
  struct op *next; /* in its connection's sends or recvs, then in the completions */
  const char *sbuf;
  char *rbuf;
  size_t len, off;
  uint64_t tag;
  void *user;
  struct tcompletion done; /* once complete */
};

struct umsg { /* arrived before its receive: verified (and decrypted) */
  struct umsg *next;
  uint64_t tag;
  size_t len;
  char *data;
};

enum state {
  CONNECTING,    /* outbound: the connect is under way */
  GREETING,      /* the greeting exchange (auth.h) */
  OPEN,          /* authenticated: messages flow */
};

struct tconn {
  struct tconn *next;
  struct transport *t;
  int fd, dead;
  enum state state;
  int outbound;
  char peer[64]; /* the other end's address, for logs */
  double opened; /* CLOCK_MONOTONIC: the greeting has a deadline */
  struct ccs_auth auth;
  uint8_t hs_in[CCS_AUTH_MSG_MAX], hs_out[CCS_AUTH_MSG_MAX];
  size_t hs_in_got, hs_in_want, hs_out_len, hs_out_sent;
  struct op *sends, *sends_tail, *recvs, *recvs_tail;
  struct umsg *unexp, *unexp_tail;
  size_t held; /* bytes of unexp and the message being held */
  /* the message being sent: header, payload (or its ciphertext), tag */
  uint8_t shdr[HEADER], smac[CCS_AUTH_TAG];
  char *sct;           /* its ciphertext, when encrypted */
  size_t sent;         /* of HEADER + len + CCS_AUTH_TAG */
  int sending;         /* the head of sends is sealed and under way */
  /* the message being read */
  uint8_t rhdr[HEADER], rmac[CCS_AUTH_TAG];
  size_t rhdr_got, body_len, body_got, rmac_got;
  int in_body;
  /* read ahead: a small message's header, payload and tag, and those
   * after it, come in one read rather than three */
  char rx[RX_AHEAD];
  size_t rx_at, rx_len;
  int rx_dry; /* a read ahead came short in this round: the socket had no more */
  int eof; /* the other end closed it between two messages: read returned 0 */
  uint64_t body_tag;
  struct op *body_op;     /* its posted receive, or */
  struct umsg *body_umsg; /* where it is held */
};

struct transport {
  struct transport_params params;
  int listen_fd;
  /* poll saw it readable (or accept has not said "none" since): accept
   * asks the kernel only then, since a Linux accept on an empty queue still
   * makes and frees a socket */
  int listen_readable;
  struct accept_reserve reserve;
  int wake_fd; /* an eventfd: wake() from other threads */
  struct tconn *conns;
  size_t nconns;
  uint64_t held_total; /* held bytes over every connection */
  struct op *done, *done_tail; /* completed, not yet polled: nothing to allocate */
  struct lingering *lingering;
};

/* A socket closed by this side: its FIN is sent, what still arrives is
 * read and dropped until the peer's FIN or LINGER_S, so that the close
 * never resets the connection (a reset loses what this side had sent and
 * the peer not yet received: the last message of an op). */
#define LINGER_S 2.0
struct lingering {
  struct lingering *next;
  int fd;
  double until;
};
static void linger_step(struct transport *t);

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void complete(struct tconn *c, struct op *op, int is_send, int status, size_t bytes) {
  struct transport *t = c->t;
  op->done = (struct tcompletion){c, op->tag, op->user, is_send, status, bytes};
  op->next = NULL;
  if (t->done_tail) t->done_tail->next = op;
  else t->done = op;
  t->done_tail = op;
}

/* A held message costs its header too: empty ones are not free. */
static uint64_t held_cost(uint64_t len) { return len > UINT64_MAX - HEADER ? UINT64_MAX : len + HEADER; }

static void unhold(struct tconn *c, size_t len) {
  c->held -= held_cost(len);
  c->t->held_total -= held_cost(len);
}

static void free_umsg(struct tconn *c, struct umsg *u) {
  unhold(c, u->len);
  free(u->data);
  free(u);
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
  if (c->body_umsg) free_umsg(c, c->body_umsg);
  c->body_umsg = NULL;
  free(c->sct);
  c->sct = NULL;
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

/* Control messages always; data where the greeting said so. */
static int encrypted(const struct tconn *c, uint64_t tag) {
  return tag == 0 || c->auth.encrypt_data;
}

/* --- the greeting ------------------------------------------------------------ */

/* Writes what is left of the greeting's output; -1 when the connection failed. */
static int hs_flush(struct tconn *c) {
  while (c->hs_out_sent < c->hs_out_len) {
    ssize_t n = send(c->fd, c->hs_out + c->hs_out_sent, c->hs_out_len - c->hs_out_sent,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return 0;
      fail(c, -errno);
      return -1;
    }
    c->hs_out_sent += (size_t)n;
  }
  return 0;
}

static void flush_sends(struct tconn *c);
static void read_messages(struct tconn *c);

/* Feeds what arrived of the greeting to auth.h; opens the connection when
 * both ends proved the key. */
static void hs_read(struct tconn *c) {
  while (!c->dead && c->state == GREETING) {
    if (hs_flush(c)) return;
    if (c->hs_in_want == 0) break; /* everything said and heard */
    ssize_t n = read(c->fd, c->hs_in + c->hs_in_got, c->hs_in_want - c->hs_in_got);
    if (n == 0) { fail(c, -ECONNRESET); return; }
    if (n < 0) {
      if (errno != EAGAIN && errno != EINTR) fail(c, -errno);
      return;
    }
    c->hs_in_got += (size_t)n;
    if (c->hs_in_got < c->hs_in_want) continue;
    size_t out_len = 0, want = 0;
    int rc = ccs_auth_step(&c->auth, c->hs_in, c->hs_in_got, c->hs_out, &out_len, &want);
    if (rc < 0) {
      fail(c, rc);
      return;
    }
    c->hs_in_got = 0;
    c->hs_in_want = want;
    c->hs_out_len = out_len;
    c->hs_out_sent = 0;
    if (hs_flush(c)) return;
    if (rc == 1) { /* proven both ways */
      c->state = OPEN;
      flush_sends(c); /* what was posted meanwhile */
    }
  }
}

/* The acceptor speaks first (its nonce); the connector answers only a
 * greeting of this protocol. */
static void hs_start(struct tconn *c) {
  c->state = GREETING;
  size_t want = 0;
  c->hs_out_len = 0;
  ccs_auth_start(&c->auth, &c->t->params, c->outbound, c->hs_out, &c->hs_out_len, &want);
  c->hs_out_sent = 0;
  c->hs_in_got = 0;
  c->hs_in_want = want;
  hs_flush(c);
}

/* --- messages ------------------------------------------------------------------ */

/* Seals the head of sends: its header, and its tag over header and
 * payload (encrypting the payload into sct where it must be). */
static int seal_head(struct tconn *c) {
  struct op *op = c->sends;
  put64(c->shdr, op->tag);
  put64(c->shdr + 8, op->len);
  if (encrypted(c, op->tag)) {
    c->sct = malloc(op->len ? op->len : 1);
    if (!c->sct) return -ENOMEM;
    ccs_auth_seal(&c->auth, c->shdr, (const uint8_t *)op->sbuf, op->len, (uint8_t *)c->sct, c->smac);
  } else {
    ccs_auth_seal(&c->auth, c->shdr, (const uint8_t *)op->sbuf, op->len, NULL, c->smac);
  }
  c->sending = 1;
  c->sent = 0;
  return 0;
}

static void flush_sends(struct tconn *c) {
  /* the acceptor's last proof goes before any message */
  if (c->hs_out_sent < c->hs_out_len && (hs_flush(c) || c->hs_out_sent < c->hs_out_len)) return;
  while (c->sends && !c->dead && c->state == OPEN) {
    struct op *op = c->sends;
    if (!c->sending) {
      int rc = seal_head(c);
      if (rc) { fail(c, rc); return; }
    }
    const char *body = c->sct ? c->sct : op->sbuf;
    size_t total = HEADER + op->len + CCS_AUTH_TAG, at = c->sent;
    struct iovec iov[3];
    int n = 0;
    if (at < HEADER) iov[n++] = (struct iovec){c->shdr + at, HEADER - at};
    if (at < HEADER + op->len) {
      size_t from = at > HEADER ? at - HEADER : 0;
      iov[n++] = (struct iovec){(void *)(body + from), op->len - from};
    }
    size_t mfrom = at > HEADER + op->len ? at - HEADER - op->len : 0;
    iov[n++] = (struct iovec){c->smac + mfrom, CCS_AUTH_TAG - mfrom};
    ssize_t w = writev(c->fd, iov, n);
    if (w < 0) {
      if (errno != EAGAIN && errno != EINTR) {
        int status = -errno;
        read_messages(c); /* what the peer sent before it closed still arrives */
        fail(c, status);
      }
      return;
    }
    c->sent += (size_t)w;
    if (c->sent < total) return; /* the socket is full */
    c->sends = op->next;
    if (!c->sends) c->sends_tail = NULL;
    c->sending = 0;
    free(c->sct);
    c->sct = NULL;
    complete(c, op, 1, 0, op->len);
  }
}

/* A held message meets the first receive posted for its tag. */
static int deliver(struct tconn *c, struct umsg *u, struct op *op) {
  if (u->len > op->len) return -EMSGSIZE;
  memcpy(op->rbuf, u->data, u->len);
  complete(c, op, 0, 0, u->len);
  free_umsg(c, u);
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

static int held_for(const struct tconn *c, uint64_t tag) {
  for (struct umsg *u = c->unexp; u; u = u->next)
    if (u->tag == tag) return 1;
  return 0;
}

/* Reads into dst until want bytes are there; 1 when they are, 0 when the
 * socket is dry, -1 when the connection failed. What was read ahead is
 * taken first; a part of RX_AHEAD or more is read straight into dst, a
 * smaller one through the read-ahead. */
static int read_some(struct tconn *c, void *dst, size_t *got, size_t want) {
  while (*got < want) {
    size_t need = want - *got;
    if (c->rx_at < c->rx_len) {
      size_t take = need < c->rx_len - c->rx_at ? need : c->rx_len - c->rx_at;
      memcpy((char *)dst + *got, c->rx + c->rx_at, take);
      c->rx_at += take;
      *got += take;
      continue;
    }
    int ahead = need < RX_AHEAD;
    if (ahead && c->rx_dry) return 0; /* poll says when more came */
    ssize_t n = ahead ? read(c->fd, c->rx, RX_AHEAD) : read(c->fd, (char *)dst + *got, need);
    if (n == 0) { /* nothing is left read ahead: the counts say where the stream stopped */
      c->eof = !c->dead && !c->in_body && !c->rhdr_got; /* between messages */
      fail(c, -ECONNRESET);
      return -1;
    }
    if (n < 0) {
      if (errno != EAGAIN && errno != EINTR) { fail(c, -errno); return -1; }
      return 0;
    }
    if (ahead) c->rx_at = 0, c->rx_len = (size_t)n, c->rx_dry = n < RX_AHEAD;
    else *got += (size_t)n;
  }
  return 1;
}

/* A header arrived: where its payload goes, within the caps on held bytes. */
static int begin_body(struct tconn *c) {
  const struct transport_params *pr = &c->t->params;
  c->body_tag = get64(c->rhdr);
  c->body_len = get64(c->rhdr + 8);
  c->body_got = c->rmac_got = 0;
  c->in_body = 1;
  /* an earlier held message of this tag keeps its place in the order */
  c->body_op = held_for(c, c->body_tag) ? NULL : take_recv(c, c->body_tag);
  if (c->body_op) return c->body_len > c->body_op->len ? -EMSGSIZE : 0;
  uint64_t cost = held_cost(c->body_len);
  if (cost > pr->unexpected_per_conn - c->held || c->held > pr->unexpected_per_conn ||
      cost > pr->unexpected_total - c->t->held_total || c->t->held_total > pr->unexpected_total)
    return -ENOBUFS; /* its receive is not posted, and it would not fit: closed */
  c->body_umsg = calloc(1, sizeof(*c->body_umsg));
  if (c->body_umsg) c->body_umsg->data = malloc(c->body_len ? c->body_len : 1);
  if (!c->body_umsg || !c->body_umsg->data) {
    if (c->body_umsg) free(c->body_umsg);
    c->body_umsg = NULL;
    return -ENOMEM;
  }
  c->body_umsg->tag = c->body_tag;
  c->body_umsg->len = c->body_len;
  c->held += cost;
  c->t->held_total += cost;
  return 0;
}

/* The whole message is in: its tag is checked (and the payload decrypted
 * in place) before anyone sees it. */
static void end_body(struct tconn *c) {
  char *dst = c->body_op ? c->body_op->rbuf : c->body_umsg->data;
  int rc = ccs_auth_open(&c->auth, c->rhdr, (uint8_t *)dst, c->body_len,
                         encrypted(c, c->body_tag), c->rmac);
  c->in_body = 0;
  if (rc) {
    fail(c, -EBADMSG);
    return;
  }
  if (c->body_op) {
    struct op *op = c->body_op;
    c->body_op = NULL;
    complete(c, op, 0, 0, c->body_len);
    return;
  }
  struct umsg *u = c->body_umsg;
  c->body_umsg = NULL;
  struct op *op = held_for(c, u->tag) ? NULL : take_recv(c, u->tag); /* posted while it arrived */
  if (op) {
    if ((rc = deliver(c, u, op))) {
      free_umsg(c, u);
      fail(c, rc);
    }
    return;
  }
  if (c->unexp_tail) c->unexp_tail->next = u;
  else c->unexp = u;
  c->unexp_tail = u;
}

static void read_messages(struct tconn *c) {
  c->rx_dry = 0;
  while (!c->dead && c->state == OPEN) {
    if (!c->in_body) {
      int r = read_some(c, c->rhdr, &c->rhdr_got, HEADER);
      if (r <= 0) return;
      c->rhdr_got = 0;
      int rc = begin_body(c);
      if (rc) { fail(c, rc); return; }
    }
    char *dst = c->body_op ? c->body_op->rbuf : c->body_umsg->data;
    if (read_some(c, dst, &c->body_got, c->body_len) <= 0) return;
    if (read_some(c, c->rmac, &c->rmac_got, CCS_AUTH_TAG) <= 0) return;
    end_body(c);
  }
}

/* --- the transport ------------------------------------------------------------------ */

static struct transport *tcp_open(const struct transport_params *params, char *err, size_t errlen) {
  if (ccs_auth_init(err, errlen)) return NULL;
  struct transport *t = calloc(1, sizeof(*t));
  if (!t) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  t->params = *params;
  t->listen_fd = -1;
  t->reserve.spare = -1;
  t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (t->wake_fd < 0) {
    snprintf(err, errlen, "eventfd: %s", strerror(errno));
    free(t);
    return NULL;
  }
  return t;
}

static struct tconn *adopt(struct transport *t, int fd, int outbound) {
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
  c->outbound = outbound;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  if (!outbound && !getpeername(fd, (struct sockaddr *)&ss, &sl))
    ccs_addr_format((struct sockaddr *)&ss, sl, c->peer, sizeof(c->peer));
  c->opened = now_s();
  c->next = t->conns;
  t->conns = c;
  t->nconns++;
  return c;
}

static int tcp_listen(struct transport *t, const char *addr, char *bound, size_t boundlen, char *err,
                      size_t errlen) {
  struct sockaddr_storage ss;
  socklen_t sslen;
  char numeric[128];
  /* the operator's own setting: a name is resolved here, once, at start */
  if (ccs_addr_parse(addr, &ss, &sslen)) {
    if (ccs_addr_resolve(addr, numeric, sizeof(numeric), err, errlen) ||
        ccs_addr_parse(numeric, &ss, &sslen)) {
      if (!err[0]) snprintf(err, errlen, "'%s' is not HOST:PORT", addr);
      return -1;
    }
  }
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || bind(fd, (struct sockaddr *)&ss, sslen) || listen(fd, 128)) {
    snprintf(err, errlen, "cannot listen on %s: %s", addr, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  sslen = sizeof(ss);
  getsockname(fd, (struct sockaddr *)&ss, &sslen);
  ccs_addr_format((struct sockaddr *)&ss, sslen, bound, boundlen);
  t->listen_fd = fd;
  t->listen_readable = 1;
  ccs_accept_reserve_init(&t->reserve);
  return 0;
}

/* Starts a connect and returns at once: the connection is usable (posts
 * queue) and opens once the greeting is done. Only numeric addresses are
 * dialled: nothing here ever waits on a resolver. */
static int tcp_connect(struct transport *t, const char *addr, struct tconn **ret, char *err,
                       size_t errlen) {
  struct sockaddr_storage ss;
  socklen_t len;
  if (ccs_addr_parse(addr, &ss, &len)) {
    snprintf(err, errlen, "'%s' is not a numeric ADDRESS:PORT", addr);
    return -1;
  }
  if (t->nconns >= t->params.max_conns) {
    snprintf(err, errlen, "cannot connect to %s: %zu connections with other daemons already "
             "(peer_max_connections)", addr, t->nconns);
    return -1;
  }
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "cannot connect to %s: %s", addr, strerror(errno));
    return -1;
  }
  int rc = connect(fd, (struct sockaddr *)&ss, len);
  if (rc && errno != EINPROGRESS) {
    snprintf(err, errlen, "cannot connect to %s: %s", addr, strerror(errno));
    close(fd);
    return -1;
  }
  struct tconn *c = adopt(t, fd, 1);
  if (!c) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  snprintf(c->peer, sizeof(c->peer), "%s", addr);
  if (rc == 0) hs_start(c);
  else c->state = CONNECTING;
  *ret = c;
  return 0;
}

static int tcp_accept(struct transport *t, struct tconn **ret, char *err, size_t errlen) {
  int shed;
  if (t->listen_fd < 0 || !t->listen_readable) return 0;
  int fd = ccs_accept(&t->reserve, t->listen_fd, &shed);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) t->listen_readable = 0;
    if (errno == EMFILE || errno == ENFILE) {
      snprintf(err, errlen, "out of file descriptors: connections wait in the listen queue");
      return -1;
    }
    return 0;
  }
  if (shed || t->nconns >= t->params.max_conns) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    char who[96] = "?";
    if (!getpeername(fd, (struct sockaddr *)&ss, &len)) ccs_addr_format((struct sockaddr *)&ss, len, who, sizeof(who));
    snprintf(err, errlen, "connection from %s refused: %s", who,
             shed ? "out of file descriptors" : "peer_max_connections reached");
    close(fd);
    return -1;
  }
  struct tconn *c = adopt(t, fd, 0);
  if (!c) return 0;
  hs_start(c);
  *ret = c;
  return 1;
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

static int tcp_send(struct tconn *c, struct tmem *m, const void *buf, size_t len,
                    uint64_t tag, void *user) {
  if (m && outside(m, buf, len)) return -EFAULT;
  if (c->dead) return -ECONNRESET;
  struct op *op = new_op(buf, NULL, len, tag, user);
  if (!op) return -ENOMEM;
  if (c->sends_tail) c->sends_tail->next = op;
  else c->sends = op;
  c->sends_tail = op;
  flush_sends(c); /* small messages leave at once (once the connection is open) */
  return 0;
}

static int tcp_recv(struct tconn *c, struct tmem *m, void *buf, size_t len, uint64_t tag,
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
      free_umsg(c, u);
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

/* A connect that finished, or failed. */
static void connected(struct tconn *c) {
  int soerr = 0;
  socklen_t len = sizeof(soerr);
  getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
  if (soerr) fail(c, -soerr);
  else hs_start(c);
}

/* Connections that did not open in time fail. */
static void check_deadlines(struct transport *t) {
  double now = now_s();
  for (struct tconn *c = t->conns; c; c = c->next)
    if (!c->dead && c->state != OPEN && now - c->opened > t->params.greeting_timeout_s)
      fail(c, -ETIMEDOUT);
}

/* What connection c waits for. */
static short events_of(const struct tconn *c) {
  if (c->state == CONNECTING) return POLLOUT;
  short ev = POLLIN;
  if (c->hs_out_sent < c->hs_out_len || (c->state == OPEN && c->sends)) ev |= POLLOUT;
  return ev;
}

static int listener_ready(const struct transport *t) {
  return t->listen_fd >= 0 && ccs_accept_ready(&t->reserve);
}

static int tcp_wait_fds(struct transport *t, struct pollfd *fds, int max) {
  int n = 0;
  if (n++ < max) fds[0] = (struct pollfd){t->wake_fd, POLLIN, 0};
  for (struct tconn *c = t->conns; c; c = c->next)
    if (!c->dead && n++ < max) fds[n - 1] = (struct pollfd){c->fd, events_of(c), 0};
  if (listener_ready(t) && n++ < max) fds[n - 1] = (struct pollfd){t->listen_fd, POLLIN, 0};
  for (struct lingering *l = t->lingering; l; l = l->next)
    if (n++ < max) fds[n - 1] = (struct pollfd){l->fd, POLLIN, 0};
  return n;
}

static int tcp_poll(struct transport *t, int timeout_ms, struct tcompletion *out, int max) {
  check_deadlines(t);
  if (t->lingering) linger_step(t);
  if (!t->done) {
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
      fds[i] = (struct pollfd){c->fd, events_of(c), 0};
      who[i++] = c;
    }
    size_t nconn = i, listener = 0;
    fds[i++] = (struct pollfd){t->wake_fd, POLLIN, 0};
    if (listener_ready(t)) listener = i, fds[i++] = (struct pollfd){t->listen_fd, POLLIN, 0};
    /* a listener resting after descriptor exhaustion: wake for it soon */
    int wait_ms = t->listen_fd >= 0 && !ccs_accept_ready(&t->reserve) && timeout_ms > 100 ? 100 : timeout_ms;
    if (poll(fds, i, wait_ms) > 0) {
      if (fds[nconn].revents & POLLIN) {
        uint64_t v;
        if (read(t->wake_fd, &v, sizeof(v)) < 0) { /* nothing to do: it was a wake-up */ }
      }
      if (listener && fds[listener].revents) t->listen_readable = 1;
      for (size_t k = 0; k < nconn; k++) {
        struct tconn *c = who[k];
        short re = fds[k].revents;
        if (!re) continue;
        if (c->state == CONNECTING) {
          connected(c);
          continue;
        }
        if (c->state == GREETING) {
          if (re & (POLLIN | POLLHUP | POLLERR | POLLOUT)) hs_read(c);
          if (c->state != OPEN) continue;
        }
        if (re & (POLLIN | POLLHUP | POLLERR)) read_messages(c);
        if (!c->dead && (re & (POLLOUT | POLLERR))) flush_sends(c);
      }
    }
    free(fds);
    free(who);
  }
  int n = 0;
  while (n < max && t->done) {
    struct op *op = t->done;
    if (!(t->done = op->next)) t->done_tail = NULL;
    out[n++] = op->done;
    free(op);
  }
  return n;
}

/* Reads and drops what came on lingering sockets; closes those done. */
static void linger_step(struct transport *t) {
  double now = now_s();
  for (struct lingering **p = &t->lingering, *l; (l = *p);) {
    char sink[4096];
    ssize_t n;
    while ((n = read(l->fd, sink, sizeof(sink))) > 0) {}
    if ((n < 0 && errno == EAGAIN && now < l->until) || (n < 0 && errno == EINTR)) {
      p = &l->next;
      continue;
    }
    close(l->fd);
    *p = l->next;
    free(l);
  }
}

static void tcp_close(struct tconn *c) {
  struct lingering *l = c->fd >= 0 && !c->dead ? malloc(sizeof(*l)) : NULL;
  if (l) {
    shutdown(c->fd, SHUT_WR);
    *l = (struct lingering){c->t->lingering, c->fd, now_s() + LINGER_S};
    c->t->lingering = l;
    c->fd = -1; /* fail() leaves it */
  }
  fail(c, -ECANCELED);
  for (struct umsg *u = c->unexp, *next; u; u = next) next = u->next, free_umsg(c, u);
  c->unexp = c->unexp_tail = NULL;
  for (struct tconn **p = &c->t->conns; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  /* completions still to be polled for c no longer name it: c is gone */
  struct transport *t = c->t;
  t->nconns--;
  for (struct op *op = t->done; op; op = op->next)
    if (op->done.conn == c) op->done.conn = NULL;
  ccs_auth_wipe(&c->auth);
  free(c);
}

/* Closing with the transport: what this side sent still reaches the peers
 * (closed at once, a socket with something unread resets, and loses it),
 * read until they close too, LINGER_STOP_S at most. */
#define LINGER_STOP_S 0.5
static void tcp_free(struct transport *t) {
  if (!t) return;
  while (t->conns) tcp_close(t->conns);
  for (double until = now_s() + LINGER_STOP_S; t->lingering && now_s() < until;) {
    linger_step(t);
    if (t->lingering) usleep(1000);
  }
  if (t->listen_fd >= 0) close(t->listen_fd);
  for (struct lingering *l = t->lingering, *next; l; l = next) next = l->next, close(l->fd), free(l);
  ccs_accept_reserve_close(&t->reserve);
  close(t->wake_fd);
  for (struct op *op = t->done, *next; op; op = next) next = op->next, free(op);
  ccs_auth_wipe_key(&t->params);
  free(t);
}

static void tcp_wake(struct transport *t) {
  uint64_t one = 1;
  if (write(t->wake_fd, &one, sizeof(one)) < 0) { /* the counter is full: a wake-up is pending */ }
}

static void tcp_peer_name(struct tconn *c, char *buf, size_t len) {
  snprintf(buf, len, "%s", c->peer[0] ? c->peer : "?");
}

static void tcp_describe(struct transport *t, char *buf, size_t len) {
  snprintf(buf, len, "TCP%s", t->params.encrypt_data ? ", data encrypted" : "");
}

static int tcp_holds(struct tconn *c) {
  return c->unexp || c->body_umsg || (c->rhdr_got && !c->in_body);
}

static int tcp_take_held(struct tconn *c, void (*each)(void *arg, uint64_t tag, void *data, size_t len),
                         void *arg) {
  if (!c->dead) return 0;
  if (!c->eof) return -1;
  while (each && c->unexp) {
    struct umsg *u = c->unexp;
    c->unexp = u->next;
    unhold(c, u->len);
    each(arg, u->tag, u->data, u->len);
    free(u);
  }
  if (!c->unexp) c->unexp_tail = NULL;
  return 1;
}

const struct transport_ops ccs_transport_tcp = {
    .name = "tcp",
    .open = tcp_open,
    .listen = tcp_listen,
    .connect = tcp_connect,
    .accept = tcp_accept,
    .mem_register = tcp_mem_register,
    .mem_deregister = tcp_mem_deregister,
    .send = tcp_send,
    .recv = tcp_recv,
    .poll = tcp_poll,
    .wait_fds = tcp_wait_fds,
    .close = tcp_close,
    .free = tcp_free,
    .wake = tcp_wake,
    .peer_name = tcp_peer_name,
    .holds = tcp_holds,
    .take_held = tcp_take_held,
    .describe = tcp_describe,
};
