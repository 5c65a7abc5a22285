/* The process's connection to ccsd: connect, hello, and calls that wait for
 * their reply by id. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "journal.h"

struct ccs__reply_slot {
  uint64_t id;
  Ccs__Reply *reply;
  struct ccs__reply_slot *next;
};

static pthread_mutex_t current_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ccs__conn *current;
/* The parent's connection after a fork: kept (volatile: the store must
 * happen) so it stays reachable, never used. */
static struct ccs__conn *volatile inherited;

static __thread char error_text[CCS__ERROR_TEXT_MAX];

/* Formatted aside first: callers pass an error on (fmt "%s" with
 * ccs__error() itself), and formatting a buffer into itself leaves it
 * empty. */
void ccs__set_error(const char *fmt, ...) {
  char text[sizeof(error_text)];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  memcpy(error_text, text, sizeof(text));
}

const char *ccs__error(void) { return error_text; }

static const char *socket_path(void) {
  const char *p = getenv("CCS_SOCKET");
  return p && *p ? p : CCS__DEFAULT_SOCKET;
}

void ccs__conn_ref(struct ccs__conn *c) {
  pthread_mutex_lock(&c->mu);
  c->refs++;
  pthread_mutex_unlock(&c->mu);
}

int ccs__conn_ref_live(struct ccs__conn *c) {
  pthread_mutex_lock(&c->mu);
  int live = c->refs > 0;
  c->refs += live;
  pthread_mutex_unlock(&c->mu);
  return live;
}

void ccs__conn_put(struct ccs__conn *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  int last = --c->refs == 0;
  /* the keeper's own reference is the last: it is told to go, and goes
   * with the connection */
  if (c->refs == 1 && c->keeper_started && c->keeper_stop >= 0 && c->pid == getpid()) {
    uint64_t one = 1;
    if (write(c->keeper_stop, &one, sizeof(one)) < 0) { /* it stops anyway at the hang-up */ }
  }
  pthread_mutex_unlock(&c->mu);
  if (!last) return;
  ccs__ring_free(c->ring); /* its guard thread watches c->fd: gone first */
  c->ring = NULL;
  ccs__journal_free(c);
  if (c->keeper_stop >= 0) close(c->keeper_stop);
  if (c->successor) ccs__conn_put(c->successor);
  if (c->fd >= 0) close(c->fd);
  while (c->replies) {
    struct ccs__reply_slot *s = c->replies;
    c->replies = s->next;
    ccs__reply__free_unpacked(s->reply, NULL);
    free(s);
  }
  ccs__frame_reader_close(&c->rd);
  ccs__host_streams_conn_gone(c);
  pthread_mutex_destroy(&c->send_mu);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

static ccs_result_t conn_open(struct ccs__conn **ret, int resume) {
  const char *path = socket_path();
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof(addr.sun_path)) {
    ccs__set_error("CCS_SOCKET path too long: %s", path);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  strcpy(addr.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ccs__set_error("socket: %s", strerror(errno));
    return CCS_ERR_SYSTEM;
  }
  if (connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
    ccs__set_error("cannot connect to ccsd at %s: %s (is the daemon running? CCS_SOCKET "
                   "chooses the socket)", path, strerror(errno));
    close(fd);
    return CCS_ERR_DAEMON_UNAVAILABLE;
  }
  struct ccs__conn *c = calloc(1, sizeof(*c));
  if (!c) {
    close(fd);
    ccs__set_error("out of memory");
    return CCS_ERR_NO_MEMORY;
  }
  c->fd = fd;
  c->pid = getpid();
  c->refs = 1;
  c->keeper_stop = -1;
  pthread_mutex_init(&c->send_mu, NULL);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  ccs__frame_reader_init(&c->rd, CCS__REPLY_MAX);

  /* back after the daemon went, the socket unit may hold the listening
   * socket of a daemon that never comes: the hello is not waited for
   * forever (its keeper tries again until its deadline) */
  struct timeval patience = {resume ? 5 : 0, 0};
  if (resume) setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__Hello hello = CCS__HELLO__INIT;
  hello.protocol = CCS__PROTOCOL_VERSION;
  hello.resume = resume;
  req.body_case = CCS__REQUEST__BODY_HELLO;
  req.hello = &hello;
  Ccs__Reply *reply;
  ccs_result_t rc = ccs__conn_call(c, &req, -1, &reply);
  if (rc != CCS_OK) {
    ccs__conn_put(c);
    return rc;
  }
  patience.tv_sec = 0;
  if (resume) setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
  /* an older daemon (protocol 4) says so: it keeps no journal */
  c->protocol = reply->body_case == CCS__REPLY__BODY_HELLO && reply->hello->protocol
                    ? reply->hello->protocol : CCS__PROTOCOL_OLDEST;
  c->parts = reply->body_case == CCS__REPLY__BODY_HELLO && reply->hello->parts;
  ccs__reply__free_unpacked(reply, NULL);
  ccs__ring_open(c);
  ccs__journal_open(c);
  *ret = c;
  return CCS_OK;
}

ccs_result_t ccs__conn_open(struct ccs__conn **ret, int resume) { return conn_open(ret, resume); }

/* A daemon that died or restarted has hung up: seen without a round trip,
 * so calls that need no existing comm go straight to the new daemon. */
static int peer_hung_up(struct ccs__conn *c) {
  pthread_mutex_lock(&c->mu);
  int idle = !c->reading;
  pthread_mutex_unlock(&c->mu);
  struct pollfd p = {c->fd, POLLRDHUP, 0};
  return idle && poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

ccs_result_t ccs__conn_get(struct ccs__conn **ret) {
  pthread_mutex_lock(&current_mu);
  if (current && current->pid != getpid()) {
    /* Forked: the parent keeps talking on this socket; the child's copy of
     * the connection (and its comms) is dead. */
    close(current->fd);
    current->fd = -1;
    current->broken = CCS_ERR_DAEMON_UNAVAILABLE;
    inherited = current; /* the parent's references live in the parent */
    current = NULL;
  }
  if (current && !current->broken && peer_hung_up(current)) {
    pthread_mutex_lock(&current->mu);
    if (!current->broken) current->broken = CCS_ERR_DAEMON_UNAVAILABLE;
    pthread_mutex_unlock(&current->mu);
  }
  if (current && current->broken && current->keeper_started) {
    /* its keeper makes the next one: the comms' and ours alike */
    struct ccs__conn *old = current, *next = ccs__conn_successor(old);
    if (current == old) {
      current = next;
      ccs__conn_put(old);
    } else if (next) {
      ccs__conn_put(next);
    }
  }
  if (current && current->broken) {
    ccs__conn_put(current);
    current = NULL;
  }
  ccs_result_t rc = CCS_OK;
  if (!current) rc = conn_open(&current, 0);
  if (rc == CCS_OK) {
    ccs__conn_ref(current);
    *ret = current;
  }
  pthread_mutex_unlock(&current_mu);
  return rc;
}

#define MAX_FDS 2

static int send_all(struct ccs__conn *c, const uint8_t *buf, size_t len, const int *fds, int nfds) {
  size_t off = 0;
  while (off < len) {
    struct iovec iov = {(void *)(buf + off), len - off};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    union {
      char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
      struct cmsghdr align;
    } ctl;
    if (off == 0 && nfds > 0) {
      /* The fds ride with the frame's first byte; the daemon pairs them. */
      memset(&ctl, 0, sizeof(ctl));
      msg.msg_control = ctl.buf;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
      struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
      memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    off += (size_t)n;
  }
  return 0;
}

/* Blocks for one whole frame; NULL when the connection is gone or broken. */
static Ccs__Reply *read_reply(struct ccs__conn *c) {
  for (;;) {
    const uint8_t *payload;
    size_t len;
    int r = ccs__frame_reader_next(&c->rd, &payload, &len);
    if (r == 1) return ccs__reply_unpack(payload, len);
    if (r < 0) return NULL;
    uint8_t *space;
    size_t room;
    if (ccs__frame_reader_space(&c->rd, &space, &room)) return NULL;
    ssize_t n = recv(c->fd, space, room, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return NULL;
    ccs__frame_reader_commit(&c->rd, (size_t)n);
  }
}

static Ccs__Reply *take_reply(struct ccs__conn *c, uint64_t id) {
  for (struct ccs__reply_slot **p = &c->replies; *p; p = &(*p)->next) {
    if ((*p)->id != id) continue;
    struct ccs__reply_slot *s = *p;
    Ccs__Reply *r = s->reply;
    *p = s->next;
    free(s);
    return r;
  }
  return NULL;
}

/* Under c->mu: a reply read by whichever thread reads, for its caller.
 * A connection it breaks is shut down too: whatever broke it (the daemon's
 * end closed, its last word, a reply that does not parse, no memory), its
 * keeper then sees it end. */
static void file_reply(struct ccs__conn *c, Ccs__Reply *r) {
  struct ccs__reply_slot *slot = r ? malloc(sizeof(*slot)) : NULL;
  if (r && r->id == 0) {
    /* Unsolicited: the daemon's last word before it closes on us. */
    snprintf(c->broken_text, sizeof(c->broken_text), "%s", r->error);
    c->broken = r->status ? r->status : CCS_ERR_PROTOCOL;
    ccs__reply__free_unpacked(r, NULL);
    free(slot);
  } else if (!slot) {
    if (r) ccs__reply__free_unpacked(r, NULL);
    if (!c->broken) c->broken = CCS_ERR_DAEMON_UNAVAILABLE;
  } else {
    slot->id = r->id;
    slot->reply = r;
    slot->next = c->replies;
    c->replies = slot;
  }
  if (c->broken) shutdown(c->fd, SHUT_RDWR);
}

ccs_result_t ccs__conn_check(struct ccs__conn *c) {
  pthread_mutex_lock(&c->mu);
  if (!c->broken && !c->reading) {
    struct pollfd p = {c->fd, POLLRDHUP, 0};
    if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
      c->reading = 1; /* it hung up: reading what is left cannot block */
      pthread_mutex_unlock(&c->mu);
      Ccs__Reply *r;
      while (!c->broken && (r = read_reply(c)) != NULL) {
        pthread_mutex_lock(&c->mu);
        file_reply(c, r);
        pthread_mutex_unlock(&c->mu);
      }
      pthread_mutex_lock(&c->mu);
      if (!c->broken) c->broken = CCS_ERR_DAEMON_UNAVAILABLE;
      c->reading = 0;
      pthread_cond_broadcast(&c->cv);
    }
  }
  ccs_result_t broken = c->broken;
  pthread_mutex_unlock(&c->mu);
  return broken;
}

/* Under c->mu. */
static ccs_result_t broken_error(struct ccs__conn *c) {
  if (c->broken == CCS_ERR_DAEMON_UNAVAILABLE || !c->broken_text[0])
    ccs__set_error("connection to ccsd lost (daemon stopped or restarted); create new "
                   "communicators once it is back");
  else
    ccs__set_error("ccsd closed the connection: %s", c->broken_text);
  return c->broken;
}

ccs_result_t ccs__conn_broken_error(struct ccs__conn *c) {
  pthread_mutex_lock(&c->mu);
  ccs_result_t rc = broken_error(c);
  pthread_mutex_unlock(&c->mu);
  return rc;
}

ccs_result_t ccs__conn_call(struct ccs__conn *c, Ccs__Request *req, int pass_fd,
                            Ccs__Reply **ret) {
  return ccs__conn_call_fds(c, req, &pass_fd, pass_fd >= 0, ret);
}

static ccs_result_t call_fds(struct ccs__conn *c, Ccs__Request *req, const int *fds, int nfds,
                             struct ccs__call *call, Ccs__Reply **ret);

ccs_result_t ccs__conn_call_fds(struct ccs__conn *c, Ccs__Request *req, const int *fds, int nfds,
                                Ccs__Reply **ret) {
  return call_fds(c, req, fds, nfds, NULL, ret);
}

ccs_result_t ccs__conn_call_tracked(struct ccs__conn *c, Ccs__Request *req, struct ccs__call *call,
                                    Ccs__Reply **ret) {
  return call_fds(c, req, NULL, 0, call, ret);
}

/* Under c->mu: one reply read (or the end of the stream) by this thread,
 * for whoever waits for it. */
static void read_one(struct ccs__conn *c) {
  c->reading = 1;
  pthread_mutex_unlock(&c->mu);
  Ccs__Reply *r = read_reply(c);
  pthread_mutex_lock(&c->mu);
  c->reading = 0;
  file_reply(c, r);
  pthread_cond_broadcast(&c->cv);
}

void ccs__conn_call_all(struct ccs__conn *c, Ccs__Request *const *reqs, size_t n,
                        uint64_t deadline_ns, Ccs__Reply **replies, ccs_result_t *status,
                        char (*text)[CCS__ERROR_TEXT_MAX]) {
  pthread_mutex_lock(&c->send_mu);
  for (size_t i = 0; i < n; i++) {
    reqs[i]->id = ++c->next_id;
    size_t len;
    uint8_t *frame = ccs__frame_pack(&reqs[i]->base, &len);
    if (frame && !c->broken) (void)send_all(c, frame, len, NULL, 0);
    free(frame);
    replies[i] = NULL;
    status[i] = frame ? CCS_OK : CCS_ERR_INVALID_ARGUMENT;
    if (!frame) snprintf(text[i], CCS__ERROR_TEXT_MAX, "request too large for one frame");
  }
  pthread_mutex_unlock(&c->send_mu);
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < n; i++) {
    while (status[i] == CCS_OK && !(replies[i] = take_reply(c, reqs[i]->id)) && !c->broken) {
      struct timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      uint64_t t = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
      if (t >= deadline_ns) break;
      if (c->reading) { /* another thread reads: wake at the deadline at the latest */
        struct timespec until = {(time_t)(deadline_ns / 1000000000u), (long)(deadline_ns % 1000000000u)};
        pthread_cond_timedwait(&c->cv, &c->mu, &until);
        continue;
      }
      if (ccs__frame_reader_pending(&c->rd)) { /* a reply came with the last one read */
        read_one(c);
        continue;
      }
      struct pollfd p = {c->fd, POLLIN, 0};
      pthread_mutex_unlock(&c->mu);
      int ready = poll(&p, 1, (int)((deadline_ns - t) / 1000000u) + 1);
      pthread_mutex_lock(&c->mu);
      if (ready > 0 && !c->reading) read_one(c);
    }
    if (status[i] != CCS_OK) continue;
    if (!replies[i]) {
      status[i] = c->broken ? c->broken : CCS_ERR_TIMEOUT;
      snprintf(text[i], CCS__ERROR_TEXT_MAX, "%s", c->broken ? "the connection to ccsd closed again"
                                                            : "ccsd did not answer in time");
    } else if (replies[i]->status != CCS_OK) {
      status[i] = (ccs_result_t)replies[i]->status;
      snprintf(text[i], CCS__ERROR_TEXT_MAX, "%s", replies[i]->error && *replies[i]->error
                                                       ? replies[i]->error : ccs_strerror(status[i]));
      ccs__reply__free_unpacked(replies[i], NULL);
      replies[i] = NULL;
    }
  }
  pthread_mutex_unlock(&c->mu);
}

static ccs_result_t call_fds(struct ccs__conn *c, Ccs__Request *req, const int *fds, int nfds,
                             struct ccs__call *call, Ccs__Reply **ret) {
  pthread_mutex_lock(&c->send_mu);
  uint64_t id = req->id = ++c->next_id;
  if (call) ccs__call_keyed(call, ccs__journal_key(id, 0));
  size_t len;
  uint8_t *frame = ccs__frame_pack(&req->base, &len);
  /* A failed send is not the end yet: a daemon that refused us (quota,
   * allow-list) wrote why before closing, and the read below finds it, or
   * the end of the stream. */
  if (frame && !c->broken) (void)send_all(c, frame, len, fds, nfds);
  pthread_mutex_unlock(&c->send_mu);
  free(frame);
  if (!frame) {
    ccs__set_error("request too large for one frame (over %u bytes)", CCS__FRAME_MAX);
    return CCS_ERR_INVALID_ARGUMENT;
  }

  Ccs__Reply *reply = NULL;
  pthread_mutex_lock(&c->mu);
  while (!(reply = take_reply(c, id)) && !c->broken) {
    if (c->reading) {
      pthread_cond_wait(&c->cv, &c->mu);
      continue;
    }
    read_one(c);
  }
  ccs_result_t broken = reply ? CCS_OK : broken_error(c);
  pthread_mutex_unlock(&c->mu);
  if (!reply) return broken;
  ccs_result_t rc = (ccs_result_t)reply->status;
  if (rc != CCS_OK) {
    ccs__set_error("%s", reply->error && *reply->error ? reply->error : ccs_strerror(rc));
    ccs__reply__free_unpacked(reply, NULL);
    return rc;
  }
  *ret = reply;
  return CCS_OK;
}

int ccs__env_bytes(const char *name, unsigned long long *out) {
  const char *v = getenv(name);
  while (v && (*v == ' ' || *v == '\t')) v++;
  if (!v || *v < '0' || *v > '9') return 0;
  char *end;
  *out = strtoull(v, &end, 10);
  return !*end;
}
