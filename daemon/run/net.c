/* The network side (net.h): every transport call happens under p->drive,
 * on the network thread, or on the loop thread while it spins with calls
 * in flight (ccsd_peers_drive). Other threads hand it commands through a
 * queue and wake it; it hands the loop thread events through another queue
 * and a uv_async. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "addr.h"
#include "auth.h"
#include "base/log.h"
#include "plan/tuner.h"
#include "run/engine_run.h"
#include "run/executor.h"
#include "run/link.h"
#include "run/net.h"
#include "regcache.h"
#include "transport.h"
#include "wire.h"

#define CONTROL_MAX (1u << 20) /* a control connection's largest message (a rank map) */
#define DATA_CONTROL_MAX 4096  /* a data connection's: its greeting */
#define LINK_WINDOW (8u << 20) /* bytes of sends posted at once to one daemon (run/link.h) */

enum cmd_kind { CMD_CONTROL, CMD_COMM_OPEN, CMD_COMM_CLOSE, CMD_COMM_FREE };

/* What another thread asks of the network thread. A comm's commands are
 * part of it, made when it is (each is sent at most once), so closing and
 * freeing a comm never wants memory; a hand-over is the op's own link
 * (p->handovers); only a control message is allocated, with its frame. */
struct cmd {
  struct list link;
  enum cmd_kind kind;
  struct net_comm *nc; /* COMM_* */
};

struct control_cmd {
  struct cmd cmd;
  char addr[CCSD_ADDR_MAX];
  uint8_t *frame; /* a packed PeerMsg */
  size_t len;
};

struct event {
  struct list link;
  char addr[CCSD_ADDR_MAX];
  Ccs__PeerMsg *msg; /* a control message from addr, or NULL: */
  char why[256];     /* addr is lost, for this reason */
};

/* One transport connection to another daemon. */
struct pconn {
  struct list link;
  struct tconn *tc;
  char addr[CCSD_ADDR_MAX]; /* the peer's, once known */
  int got_hello, is_data, outbound;
  /* control: dialled as one, or the peer's first word after its greeting
   * was not a data header. An inbound connection between the two may
   * still be the peer's data connection: no control message goes on it. */
  int is_control;
  uint8_t want[CCS__NAME_BYTES]; /* data, before its comm is known here */
  int waiting_comm, want_lane;
  struct net_comm *nc; /* data: the comm, node and lane it serves */
  int node, lane;
  int failure_logged;
  uint8_t *rx;          /* the posted control receive */
  size_t rx_cap;
  double opened, last_rx;
};

struct net_comm {
  struct list link;
  uint8_t name[CCS__NAME_BYTES];
  int nnodes, mynode, closed, lanes;
  char (*addrs)[CCSD_ADDR_MAX];
  struct pconn **data; /* per node and lane: [node * lanes + lane] */
  uint8_t *gone;       /* per node: its data connection closed (it left the comm) */
  struct list waiting; /* transfers for nodes not connected yet */
  struct held_msg *carried; /* from its earlier connections: receives take them first */
  struct cmd open, close, free; /* its commands */
};

/* A task of an op that the network thread took: a transfer (a SEND or
 * RECV task), or a small op's COMPUTE task. One per task of the op, made
 * with it (ccsd_peers_op_prepare): taking, posting and failing a task
 * never wants memory, so no completion is ever lost for want of it. */
struct net_task {
  struct list link; /* taken, waiting for its connection, or deferred */
  struct run_op *x;
  struct link_send send; /* a SEND task's place in its link's shares */
  double fail_at;   /* waiting: when it gives up on its connection; deferred: when it fails, */
  const char *why;
  int status;       /* the transport's error (negative errno), or 0, */
  char *detail;     /* and its account of it (verbs: the work completion's status), or NULL */
};

/* A data connection that fails is often the other daemon closing it because
 * the comm failed there, or dying; its control message or our heartbeat
 * tells why a moment later. Its transfers wait that long before failing with
 * the connection's own reason. */
#define FAIL_GRACE_S 0.3

struct peers {
  struct peers_options opt;
  struct peers_hooks hooks;
  struct executor *exec;
  const struct transport_ops *ops;
  struct transport *t;
  char self[CCSD_ADDR_MAX];
  pthread_t thread, loop_thread;
  /* Held by whoever drives the transport and owns what follows "the
   * driver's own": the network thread, or the loop thread while it spins
   * (ccsd_peers_drive). */
  pthread_mutex_t drive;
  atomic_int loop_drives; /* the loop drives: the network thread sleeps on its wake-up alone */
  pthread_mutex_t mu;
  struct list cmds, events; /* under mu */
  struct list handovers;    /* under mu: ops with network tasks ready (run_op.net_link) */
  int stop;                 /* under mu */
  int stopped;              /* under mu: the thread is gone; hand-overs finish unsent */
  uv_async_t async;
  /* the driver's own */
  struct pollfd *fds; /* what the network thread sleeps on */
  int nfds_cap;
  struct list conns, comms;
  struct list deferred; /* transfers of failed data connections */
  struct list taken;    /* tasks this thread took, not yet run (posted, or computed) */
  struct net_links links; /* sends by link and tenant */
  struct reg_cache *regs; /* buffers and scratch registered once (NULL once stopped) */
  int draining;           /* drain() is running: a send that fails inside does not recurse */
  double last_beat;
  double last_refusal_log;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

uint64_t ccsd_peer_tag(uint64_t seq, uint64_t sig_key, int from, int to, uint32_t msg,
                       size_t chunk) {
  uint64_t h = 0x243f6a8885a308d3ull;
  uint64_t parts[6] = {seq, sig_key, (uint64_t)(uint32_t)from, (uint64_t)(uint32_t)to, msg, chunk};
  for (int i = 0; i < 6; i++) {
    h ^= parts[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 31)) * 0xbf58476d1ce4e5b9ull;
  }
  return h | 1; /* tag 0 is the control channel */
}

/* --- to the loop thread ---------------------------------------------------- */

static void emit(struct peers *p, const char *addr, Ccs__PeerMsg *msg, const char *why) {
  struct event *ev = calloc(1, sizeof(*ev));
  if (!ev) {
    if (msg) ccs__peer_msg__free_unpacked(msg, NULL);
    return;
  }
  snprintf(ev->addr, sizeof(ev->addr), "%s", addr);
  ev->msg = msg;
  snprintf(ev->why, sizeof(ev->why), "%s", why ? why : "");
  pthread_mutex_lock(&p->mu);
  list_insert_tail(&p->events, &ev->link);
  pthread_mutex_unlock(&p->mu);
  uv_async_send(&p->async);
}

static void on_events(uv_async_t *h) {
  struct peers *p = h->data;
  struct list got;
  list_init(&got);
  pthread_mutex_lock(&p->mu);
  list_take_all(&got, &p->events);
  pthread_mutex_unlock(&p->mu);
  while (!list_empty(&got)) {
    struct event *ev = LIST_ENTRY(got.next, struct event, link);
    list_remove(&ev->link);
    struct peer_msg pm;
    if (ev->msg) ccsd_peer_msg_view(ev->msg, &pm);
    if (ev->msg) p->hooks.message(p->hooks.arg, ev->addr, &pm);
    else p->hooks.lost(p->hooks.arg, ev->addr, ev->why);
    if (ev->msg) ccs__peer_msg__free_unpacked(ev->msg, NULL);
    free(ev);
  }
}

/* --- connections ----------------------------------------------------------- */

/* A packed control message, which the connection owns from here (freed
 * when its send completes). */
static int send_frame(struct peers *p, struct pconn *c, uint8_t *buf, size_t len) {
  int rc = p->ops->send(c->tc, NULL, buf, len, 0, buf);
  if (rc) free(buf);
  return rc;
}

/* Packs a control message: malloc'ed, NULL when out of memory or too large. */
static uint8_t *pack(const Ccs__PeerMsg *m, size_t *len) {
  *len = protobuf_c_message_get_packed_size(&m->base);
  uint8_t *buf = *len <= CONTROL_MAX ? malloc(*len ? *len : 1) : NULL;
  if (buf) protobuf_c_message_pack(&m->base, buf);
  return buf;
}

static int send_msg(struct peers *p, struct pconn *c, const Ccs__PeerMsg *m) {
  size_t len;
  uint8_t *buf = pack(m, &len);
  return buf ? send_frame(p, c, buf, len) : -ENOMEM;
}

static int post_control_recv(struct peers *p, struct pconn *c) {
  if (!c->rx && !(c->rx = malloc(c->rx_cap))) return -ENOMEM;
  return p->ops->recv(c->tc, NULL, c->rx, c->rx_cap, 0, NULL);
}

static int hello(struct peers *p, struct pconn *c) {
  Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
  Ccs__PeerHello h = CCS__PEER_HELLO__INIT;
  h.protocol = CCS__PROTOCOL_VERSION;
  h.addr = p->self;
  h.transport = (char *)p->ops->name;
  m.body_case = CCS__PEER_MSG__BODY_HELLO;
  m.hello = &h;
  return send_msg(p, c, &m);
}

static struct pconn *adopt(struct peers *p, struct tconn *tc, const char *addr, int data) {
  struct pconn *c = calloc(1, sizeof(*c));
  if (!c) {
    p->ops->close(tc);
    return NULL;
  }
  c->tc = tc;
  c->node = -1;
  snprintf(c->addr, sizeof(c->addr), "%s", addr ? addr : "");
  c->outbound = addr != NULL; /* we dialled it */
  c->is_control = c->outbound && !data;
  c->opened = c->last_rx = now_s();
  c->rx_cap = data ? DATA_CONTROL_MAX : CONTROL_MAX;
  list_insert_tail(&p->conns, &c->link);
  /* a connection that fails at once never greets: housekeeping drops it */
  if (hello(p, c) || post_control_recv(p, c)) c->addr[0] = 0;
  return c;
}

static size_t task_of(const struct net_task *rec) { return (size_t)(rec - rec->x->net_tasks); }

static void transfer_fail(struct peers *p, struct net_task *rec, ccs_result_t status, const char *why);
static void transfer_fail_later(struct peers *p, struct net_task *rec, const char *why, int status,
                                const char *detail);

static void drop_conn(struct peers *p, struct pconn *c, const char *why) {
  if (c->is_data && c->nc && c->node >= 0 && c->nc->data[c->node * c->nc->lanes + c->lane] == c) {
    struct net_comm *nc = c->nc;
    nc->data[c->node * nc->lanes + c->lane] = NULL;
    nc->gone[c->node] = 1;
    struct list *it, *tmp;
    LIST_FOREACH_SAFE(it, tmp, &nc->waiting) {
      struct net_task *rec = LIST_ENTRY(it, struct net_task, link);
      if (ccsd_run_op_peer_node(rec->x, task_of(rec)) != c->node) continue;
      list_remove(&rec->link);
      transfer_fail_later(p, rec, "it closed the communicator's connection", 0, NULL);
    }
  }
  if (!c->is_data && (c->got_hello || c->outbound) && why) emit(p, c->addr, NULL, why);
  list_remove(&c->link);
  p->ops->close(c->tc); /* its transfers complete with -ECANCELED: forgotten with it */
  free(c->rx);
  free(c);
}

/* The control connection to addr, connecting if there is none. */
static struct pconn *control_to(struct peers *p, const char *addr) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &p->conns) {
    struct pconn *c = LIST_ENTRY(it, struct pconn, link);
    if (c->is_control && !strcmp(c->addr, addr)) return c;
  }
  char err[256];
  struct tconn *tc;
  if (p->ops->connect(p->t, addr, &tc, err, sizeof(err))) {
    emit(p, addr, NULL, err);
    return NULL;
  }
  return adopt(p, tc, addr, 0);
}

/* --- data connections and transfers ---------------------------------------------- */

static void transfer_start(struct peers *p, struct pconn *c, struct net_task *rec);

static int lane_of(const struct net_comm *nc, const struct net_task *rec) {
  return (int)((task_of(rec) - engine_task_item(&rec->x->plan, task_of(rec))->first_task) % (size_t)nc->lanes);
}

/* Finishes x's task (CCSD_NO_TASK: none) and queues on `into` the
 * network tasks that made ready, or that a hand-over brings. */
static void take(struct executor *e, struct run_op *x, size_t task, int handover, struct list *into) {
  enum { BATCH = 64 };
  size_t got[BATCH], n;
  do {
    n = ccsd_executor_net_step(e, x, task, handover, got, BATCH);
    task = CCSD_NO_TASK;
    handover = 0;
    for (size_t i = 0; i < n; i++) list_insert_tail(into, &x->net_tasks[got[i]].link);
  } while (n == BATCH); /* more may wait: x lives while any does */
}

static void drain(struct peers *p, struct net_link *l);

/* run_taken runs what this takes, so a chain of completions never
 * recurses. A send that is over gives its link's room to the next. */
static void take_tasks(struct peers *p, struct run_op *x, size_t task, int handover) {
  if (task != CCSD_NO_TASK) {
    struct link_send *s = &x->net_tasks[task].send;
    struct net_link *l = s->on;
    ccsd_link_done(s, ccsd_now_ns());
    if (l) drain(p, l);
  }
  take(p->exec, x, task, handover, &p->taken);
}

static void run_task(struct peers *p, struct net_task *rec);
static void post(struct peers *p, struct net_task *rec);
static int queue_send(struct peers *p, struct net_task *rec);

static void run_taken(struct peers *p) {
  while (!list_empty(&p->taken)) {
    struct net_task *rec = LIST_ENTRY(p->taken.next, struct net_task, link);
    list_remove(&rec->link);
    run_task(p, rec);
  }
}

/* The op fails, naming the daemon at the other end and its ranks. */
static void transfer_fail(struct peers *p, struct net_task *rec, ccs_result_t status, const char *why) {
  const struct net_map *map = rec->x->map; /* fixed once the comm is ready */
  int node = ccsd_run_op_peer_node(rec->x, task_of(rec));
  char text[512];
  size_t n = 0;
  if (map && node >= 0 && node < map->nnodes) {
    n = (size_t)snprintf(text, sizeof(text), "the daemon at %s serving rank(s) ", map->node_addr[node]);
    int listed = 0;
    for (int r = 0; r < map->nranks && n + 16 < sizeof(text); r++)
      if (map->node_of_rank[r] == node) n += (size_t)snprintf(text + n, sizeof(text) - n, listed++ ? ",%d" : "%d", r);
    n += (size_t)snprintf(text + n, sizeof(text) - n, ": ");
  }
  snprintf(text + n, sizeof(text) - n, "%s", why);
  ccsd_run_op_net_error(rec->x, status, node, text);
  take_tasks(p, rec->x, task_of(rec), 0); /* rec may be gone with its op */
}

static void attach(struct peers *p, struct net_comm *nc, int node, int lane, struct pconn *c) {
  c->is_data = 1;
  c->nc = nc;
  c->node = node;
  c->lane = lane;
  nc->data[node * nc->lanes + lane] = c;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &nc->waiting) {
    struct net_task *rec = LIST_ENTRY(it, struct net_task, link);
    if (ccsd_run_op_peer_node(rec->x, task_of(rec)) != node || lane_of(nc, rec) != lane) continue;
    list_remove(&rec->link);
    transfer_start(p, c, rec);
  }
}

/* What a connection's failure means, in words. */
static const char *failure_text(int status) {
  switch (-status) {
  case EACCES: return "it did not prove the cluster key (cluster_key_file differs, or not a daemon)";
  case EPROTO: return "it does not speak the ccs daemons' protocol";
  case EBADMSG: return "a message failed authentication";
  case ENOBUFS: return "it sent more than peer_unexpected_bytes no receive was posted for";
  case ETIMEDOUT: return "no greeting in time";
  default: return strerror(-status);
  }
}

/* Why c failed: the transport's own word where it has one (verbs: the
 * device, port and event), else what its status means. */
static const char *conn_failure(struct peers *p, struct pconn *c, int status, char *buf, size_t len) {
  if (c && p->ops->failure && p->ops->failure(c->tc, buf, len)) return buf;
  return failure_text(status);
}

/* Fails rec at once where c failed for this daemon's own device (verbs:
 * a port down, the device lost, a queue pair in error): no word from the
 * peer can say more. 1 when it did. */
static int failed_here(struct peers *p, struct pconn *c, struct net_task *rec) {
  char detail[160], why[200];
  if (!c || !p->ops->failure || p->ops->failure(c->tc, detail, sizeof(detail)) != 2) return 0;
  snprintf(why, sizeof(why), "data connection lost: this daemon's %s", detail);
  transfer_fail(p, rec, CCS_ERR_PEER_LOST, why);
  return 1;
}

/* Fails rec after the grace (see FAIL_GRACE_S): the reason may come. why
 * is a constant text; status, when not 0, the transport's error. */
static void transfer_fail_later(struct peers *p, struct net_task *rec, const char *why, int status,
                                const char *detail) {
  rec->why = why;
  rec->status = status;
  rec->detail = detail ? strdup(detail) : NULL;
  rec->fail_at = now_s() + FAIL_GRACE_S;
  list_insert_tail(&p->deferred, &rec->link);
}

/* The grace is over (or the comm or the daemon closes). */
static void transfer_fail_deferred(struct peers *p, struct net_task *rec) {
  char why[256];
  snprintf(why, sizeof(why), "%s%s%s", rec->why, rec->status ? ": " : "",
           rec->status ? rec->detail ? rec->detail : failure_text(rec->status) : "");
  free(rec->detail);
  rec->detail = NULL;
  transfer_fail(p, rec, CCS_ERR_PEER_LOST, why);
}

/* The memory an op's messages may use, registered with the transport at
 * its first message: its ranks' buffers and its scratch. */
struct net_mem {
  struct reg_cache *regs;
  int n;
  struct {
    char *base;
    size_t len;
    struct reg_entry *e;
  } r[];
};

static int add_region(struct net_mem *nm, void *base, size_t len, int keep) {
  char err[128];
  for (int i = 0; i < nm->n; i++)
    if (nm->r[i].base == base && nm->r[i].len == len) return 0; /* a buffer two ranks share */
  struct reg_entry *e = reg_cache_get(nm->regs, base, len, keep, err, sizeof(err));
  if (!e) {
    LOG_WARN("registering %zu bytes with the transport: %s", len, err);
    return -1;
  }
  nm->r[nm->n].base = base;
  nm->r[nm->n].len = len;
  nm->r[nm->n++].e = e;
  return 0;
}

static struct net_mem *register_op(struct peers *p, struct run_op *x) {
  const struct engine_plan *pl = &x->plan;
  if (!p->regs) return NULL; /* stopped: nothing goes out any more */
  struct net_mem *nm = malloc(sizeof(*nm) + sizeof(nm->r[0]) * ((size_t)x->nregions + pl->nscratch));
  if (!nm) return NULL;
  nm->regs = p->regs;
  nm->n = 0;
  int bad = 0;
  for (int i = 0; i < x->nregions; i++)
    bad |= add_region(nm, x->regions[i].base, x->regions[i].len, x->regions[i].cacheable);
  for (size_t i = 0; i < pl->nscratch; i++)
    bad |= add_region(nm, pl->scratch[i], pl->scratch_bytes[i], x->scratch_cacheable);
  if (bad) {
    ccsd_peers_release(p, nm);
    return NULL;
  }
  return nm;
}

void ccsd_peers_release(struct peers *p, struct net_mem *nm) {
  (void)p; /* (it may be gone: an op finishing after the network side stopped) */
  if (!nm) return;
  for (int i = 0; i < nm->n; i++) reg_cache_put(nm->regs, nm->r[i].e);
  free(nm);
}

/* A step's fixed cost stays TCP's on every transport: verbs waits for a
 * clear-to-send over the TCP connection it wraps before each registered
 * message. Its bytes go at the transport's rate where it knows one. */
struct link_model ccsd_peers_link_model(struct peers *p) {
  struct link_model m = ccsd_link_tcp;
  double rate = p && p->ops->link_rate ? p->ops->link_rate(p->t) : 0;
  if (rate > 0) m.beta_Bps = rate;
  return m;
}

void ccsd_peers_forget(struct peers *p, const void *base, size_t len) {
  if (p) reg_cache_forget(p->regs, base, len);
}

void ccsd_peers_registrations(struct peers *p, struct reg_cache_counts *out) {
  *out = (struct reg_cache_counts){0};
  if (p && p->regs) reg_cache_counts(p->regs, out);
}

int ccsd_peers_transport_counters(struct peers *p, struct transport_counters *out) {
  *out = (struct transport_counters){0};
  if (!p || !p->t || !p->ops->counters) return -1;
  pthread_mutex_lock(&p->drive); /* (the driver counts as it sends) */
  p->ops->counters(p->t, out);
  pthread_mutex_unlock(&p->drive);
  return 0;
}

/* The registration holding [buf, buf+len), or NULL (the transfer is refused). */
static struct tmem *region_of(const struct net_mem *nm, const void *buf, size_t len) {
  uintptr_t b = (uintptr_t)buf;
  for (int i = 0; i < nm->n; i++) {
    uintptr_t lo = (uintptr_t)nm->r[i].base;
    if (b >= lo && b - lo <= nm->r[i].len && len <= nm->r[i].len - (b - lo)) return reg_entry_mem(nm->r[i].e);
  }
  return NULL;
}

/* A transfer task's chunk of its item: where it starts, and its bytes. */
static size_t transfer_bytes(const struct net_task *rec, size_t *chunk, size_t *off) {
  const struct engine_plan *pl = &rec->x->plan;
  const struct engine_item *nd = engine_task_item(pl, task_of(rec));
  *chunk = task_of(rec) - nd->first_task;
  size_t begin = *chunk * pl->chunk_elems;
  *off = begin * pl->elem_size;
  return (nd->count - begin < pl->chunk_elems ? nd->count - begin : pl->chunk_elems) * pl->elem_size;
}

/* A transfer task's data tag, with its chunk's offset and bytes. */
static uint64_t transfer_tag(const struct net_task *rec, size_t *off, size_t *len) {
  const struct run_op *x = rec->x;
  const struct engine_item *nd = engine_task_item(&x->plan, task_of(rec));
  size_t chunk;
  *len = transfer_bytes(rec, &chunk, off);
  return ccsd_peer_tag(x->seq, x->sig_key, nd->from, nd->to, nd->msg, chunk);
}

static void transfer_start(struct peers *p, struct pconn *c, struct net_task *rec) {
  struct run_op *x = rec->x;
  const struct engine_item *nd = engine_task_item(&x->plan, task_of(rec));
  size_t off, len;
  uint64_t tag = transfer_tag(rec, &off, &len);
  if (!x->net_mem && !(x->net_mem = register_op(p, x))) {
    transfer_fail(p, rec, CCS_ERR_NO_MEMORY, "its buffers cannot be registered with the transport");
    return;
  }
  const char *sbuf = (const char *)nd->in[0] + off;
  char *rbuf = (char *)nd->out[0] + off;
  int send = nd->kind == ENGINE_SEND;
  struct tmem *m = region_of(x->net_mem, send ? (const void *)sbuf : rbuf, len);
  if (!m) { /* never: every message lies in the op's memory */
    transfer_fail(p, rec, CCS_ERR_SYSTEM, "a message outside the op's memory");
    return;
  }
  if (send && x->sent) memcpy(x->sent + x->sent_at[x->plan.task_item[task_of(rec)]] + off, sbuf, len);
  int rc = send ? p->ops->send(c->tc, m, sbuf, len, tag, rec)
                : p->ops->recv(c->tc, m, rbuf, len, tag, rec);
  if (rc && !failed_here(p, c, rec)) { /* (a post refused as the connection fails: as its completion says) */
    char detail[160];
    transfer_fail_later(p, rec, "data connection lost", rc, conn_failure(p, c, rc, detail, sizeof(detail)));
  }
}

/* A receive whose message was carried over from the comm's earlier
 * connections takes it there: 1 when it did (the task is over). */
static int take_carried(struct peers *p, struct net_comm *nc, struct net_task *rec) {
  struct run_op *x = rec->x;
  const struct engine_item *nd = engine_task_item(&x->plan, task_of(rec));
  if (nd->kind == ENGINE_SEND) return 0;
  size_t off, want;
  struct held_msg *h = ccsd_held_find(nc->carried, transfer_tag(rec, &off, &want));
  if (!h) return 0;
  int whole = h->len == want;
  if (whole) memcpy((char *)nd->out[0] + off, h->data, want);
  ccsd_held_drop(&nc->carried, h);
  if (whole) take_tasks(p, x, task_of(rec), 0);
  else transfer_fail(p, rec, CCS_ERR_MISMATCH, "a message of another size than the receive's arrived "
                     "before the restart: the ranks called this op with different counts");
  return 1;
}

/* rec goes on its data connection, or waits for it to come. */
static void post(struct peers *p, struct net_task *rec) {
  struct run_op *x = rec->x;
  struct net_comm *nc = x->net;
  int node = ccsd_run_op_peer_node(x, task_of(rec));
  if (!nc || nc->closed || node < 0 || node >= nc->nnodes) {
    transfer_fail(p, rec, CCS_ERR_PEER_LOST, "the communicator's connections are closed");
    return;
  }
  if (nc->carried && take_carried(p, nc, rec)) return;
  struct pconn *c = nc->data[node * nc->lanes + lane_of(nc, rec)];
  if (c) transfer_start(p, c, rec);
  else if (nc->gone[node]) transfer_fail_later(p, rec, "it closed the communicator's connection", 0, NULL);
  else {
    rec->fail_at = now_s() + p->opt.peer_timeout_s + p->opt.io_timeout_s; /* (housekeeping) */
    list_insert_tail(&nc->waiting, &rec->link);
  }
}

/* A send waits its tenant's turn on the link to its daemon (run/link.h)
 * and goes when it comes; 0: post it now (its comm is closed, post fails
 * it; or the link found no memory). */
static int queue_send(struct peers *p, struct net_task *rec) {
  struct net_comm *nc = rec->x->net;
  int node = ccsd_run_op_peer_node(rec->x, task_of(rec));
  if (!nc || nc->closed || node < 0 || node >= nc->nnodes) return 0;
  size_t chunk, off;
  rec->send.share = rec->x->share;
  rec->send.prio = rec->x->prio;
  rec->send.bytes = transfer_bytes(rec, &chunk, &off);
  struct net_link *l = ccsd_links_queue(&p->links, nc->addrs[node], &rec->send);
  if (!l) return 0;
  drain(p, l);
  return 1;
}

/* A task this thread took: skipped once the comm failed or the daemon
 * stops, computed here (a small op's, x->on_net), or posted. */
static void run_task(struct peers *p, struct net_task *rec) {
  struct run_op *x = rec->x;
  size_t task = task_of(rec);
  if (p->stopped) ccsd_run_op_net_error(x, CCS_ERR_PEER_LOST, -1, "this daemon is stopping");
  if (p->stopped || atomic_load_explicit(&x->cancelled, memory_order_relaxed)) { /* skip it */
    take_tasks(p, x, task, 0);
    return;
  }
  if (engine_task_item(&x->plan, task)->kind == ENGINE_COMPUTE) { /* a small op's (x->on_net) */
    engine_run_task(&x->plan, task, x->streaming);
    take_tasks(p, x, task, 0);
    return;
  }
  if (engine_task_item(&x->plan, task)->kind == ENGINE_SEND && queue_send(p, rec)) return;
  post(p, rec);
}

/* Sends that may go on l now, posted (or skipped: their comm failed, or
 * the daemon stops). */
static void drain(struct peers *p, struct net_link *l) {
  if (p->draining) return; /* the outer drain goes on */
  p->draining = 1;
  uint64_t now = ccsd_now_ns();
  for (struct link_send *s; (s = ccsd_link_next(l, now));) {
    struct net_task *rec = LIST_ENTRY(s, struct net_task, send);
    if (p->stopped || atomic_load_explicit(&rec->x->cancelled, memory_order_relaxed))
      take_tasks(p, rec->x, task_of(rec), 0);
    else
      post(p, rec);
  }
  p->draining = 0;
}

static void drain_each(void *arg, struct net_link *l) { drain(arg, l); }

static int queued_of_comm(void *arg, struct link_send *s) {
  return LIST_ENTRY(s, struct net_task, send)->x->net == arg;
}

static void comm_open(struct peers *p, struct net_comm *nc) {
  list_insert_tail(&p->comms, &nc->link);
  for (int j = 0; j < nc->nnodes; j++) /* heartbeats with every node of the comm */
    if (j != nc->mynode) control_to(p, nc->addrs[j]);
  for (int j = nc->mynode + 1; j < nc->nnodes; j++) /* the lower node connects */
    for (int lane = 0; lane < nc->lanes; lane++) {
      char err[256];
      struct tconn *tc;
      if (p->ops->connect(p->t, nc->addrs[j], &tc, err, sizeof(err))) {
        emit(p, nc->addrs[j], NULL, err);
        break;
      }
      struct pconn *c = adopt(p, tc, nc->addrs[j], 1);
      if (!c) break;
      Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
      Ccs__PeerData dm = CCS__PEER_DATA__INIT;
      dm.name.data = nc->name;
      dm.name.len = sizeof(nc->name);
      dm.lane = (uint32_t)lane;
      m.body_case = CCS__PEER_MSG__BODY_DATA;
      m.data = &dm;
      send_msg(p, c, &m);
      attach(p, nc, j, lane, c);
    }
  /* connections that arrived before this daemon knew the comm */
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &p->conns) {
    struct pconn *c = LIST_ENTRY(it, struct pconn, link);
    if (!c->waiting_comm || memcmp(c->want, nc->name, CCS__NAME_BYTES)) continue;
    c->waiting_comm = 0;
    for (int j = 0; j < nc->mynode && c->want_lane < nc->lanes; j++)
      if (!strcmp(nc->addrs[j], c->addr) && !nc->data[j * nc->lanes + c->want_lane])
        attach(p, nc, j, c->want_lane, c);
    if (!c->nc) drop_conn(p, c, NULL);
  }
}

static void comm_close(struct peers *p, struct net_comm *nc) {
  nc->closed = 1;
  struct list queued;
  list_init(&queued);
  ccsd_links_take(&p->links, queued_of_comm, nc, &queued);
  while (!list_empty(&queued)) {
    struct net_task *rec = LIST_ENTRY(queued.next, struct net_task, send.link);
    list_remove(&rec->send.link);
    transfer_fail(p, rec, CCS_ERR_PEER_LOST, "the communicator failed");
  }
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &p->deferred) {
    struct net_task *rec = LIST_ENTRY(it, struct net_task, link);
    if (rec->x->net != nc) continue;
    list_remove(&rec->link);
    transfer_fail_deferred(p, rec);
  }
  for (int k = 0; k < nc->nnodes * nc->lanes; k++)
    if (nc->data[k]) drop_conn(p, nc->data[k], NULL);
  while (!list_empty(&nc->waiting)) {
    struct net_task *rec = LIST_ENTRY(nc->waiting.next, struct net_task, link);
    list_remove(&rec->link);
    transfer_fail(p, rec, CCS_ERR_PEER_LOST, "the communicator failed");
  }
}

static void comm_free(struct peers *p, struct net_comm *nc) {
  if (!nc->closed) comm_close(p, nc);
  /* data connections of the comm that hold no lane (a second one for a
   * lane, one still greeting) go with it: none may point at it after */
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &p->conns) {
    struct pconn *c = LIST_ENTRY(it, struct pconn, link);
    if (c->nc == nc) drop_conn(p, c, NULL);
  }
  list_remove(&nc->link);
  ccsd_held_free(&nc->carried);
  free(nc->addrs);
  free(nc->data);
  free(nc->gone);
  free(nc);
}

void ccsd_held_drop(struct held_msg **table, struct held_msg *m) {
  HASH_DEL(*table, m);
  free(m->data);
  free(m);
}

void ccsd_held_free(struct held_msg **table) {
  struct held_msg *h, *tmp;
  HASH_ITER(hh, *table, h, tmp) ccsd_held_drop(table, h);
}

struct held_msg *ccsd_held_find(struct held_msg *table, uint64_t tag) {
  struct held_msg *h = NULL;
  HASH_FIND(hh, table, &tag, sizeof(tag), h);
  return h;
}

void ccsd_held_move(struct held_msg **from, struct held_msg **to, struct held_msg *m) {
  if (ccsd_held_find(*to, m->tag)) { /* (a tag twice: only a peer gone wrong sends that) */
    ccsd_held_drop(from, m);
    return;
  }
  HASH_DEL(*from, m);
  HASH_ADD(hh, *to, tag, sizeof(m->tag), m);
}

/* --- what arrives ------------------------------------------------------------ */

static struct net_comm *comm_by_name(struct peers *p, const ProtobufCBinaryData *name) {
  if (name->len != CCS__NAME_BYTES) return NULL;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &p->comms) {
    struct net_comm *nc = LIST_ENTRY(it, struct net_comm, link);
    if (!memcmp(nc->name, name->data, CCS__NAME_BYTES)) return nc;
  }
  return NULL;
}

/* A data connection from node addr for the comm of this name; one for
 * a comm this daemon has not heard is ready about yet waits for it. */
static int accept_data(struct peers *p, struct pconn *c, const Ccs__PeerData *dm) {
  if (dm->name.len != CCS__NAME_BYTES || dm->lane >= 64) return -1;
  struct net_comm *nc = comm_by_name(p, &dm->name);
  if (!nc) {
    c->is_data = c->waiting_comm = 1;
    c->want_lane = (int)dm->lane;
    c->opened = now_s();
    memcpy(c->want, dm->name.data, CCS__NAME_BYTES);
    return 0;
  }
  int lane = (int)dm->lane;
  for (int j = 0; j < nc->mynode && lane < nc->lanes; j++)
    if (!strcmp(nc->addrs[j], c->addr) && !nc->data[j * nc->lanes + lane]) {
      attach(p, nc, j, lane, c);
      return 0;
    }
  return -1;
}

static void on_control(struct peers *p, struct pconn *c, size_t len) {
  Ccs__PeerMsg *m = ccs__peer_unpack(c->rx, len);
  const char *bad = NULL;
  char text[300];
  if (!m) {
    bad = "a message that does not parse";
  } else if (!c->got_hello) {
    if (m->body_case != CCS__PEER_MSG__BODY_HELLO) {
      bad = "no greeting first";
    } else if (!ccs__protocol_served(m->hello->protocol)) {
      snprintf(text, sizeof(text), "protocol %u, this daemon speaks %u: refused", m->hello->protocol,
               CCS__PROTOCOL_VERSION);
      bad = text;
    } else if (strlen(m->hello->addr) >= CCSD_ADDR_MAX || !ccs_addr_is_numeric(m->hello->addr)) {
      bad = "a greeting without a numeric address";
    } else if (strcmp(*m->hello->transport ? m->hello->transport : "tcp", p->ops->name)) {
      snprintf(text, sizeof(text), "it moves data by transport %.16s, this daemon by %s: set the same "
               "transport on every daemon", *m->hello->transport ? m->hello->transport : "tcp", p->ops->name);
      bad = text;
    } else {
      c->got_hello = 1;
      if (!c->addr[0]) snprintf(c->addr, sizeof(c->addr), "%s", m->hello->addr);
    }
  } else if (m->body_case == CCS__PEER_MSG__BODY_DATA) {
    if (c->is_data || c->is_control || accept_data(p, c, m->data))
      bad = "a data connection for no communicator here";
  } else if (m->body_case == CCS__PEER_MSG__BODY_HEARTBEAT) {
    c->is_control |= !c->is_data; /* last_rx is all it is for */
  } else if (c->is_data) {
    bad = "a control message on a data connection";
  } else if (m->body_case == CCS__PEER_MSG__BODY_JOIN || m->body_case == CCS__PEER_MSG__BODY_READY ||
             m->body_case == CCS__PEER_MSG__BODY_FAIL || m->body_case == CCS__PEER_MSG__BODY_OP ||
             m->body_case == CCS__PEER_MSG__BODY_REJOIN || m->body_case == CCS__PEER_MSG__BODY_RESUME) {
    c->is_control = 1;
    emit(p, c->addr, m, NULL);
    m = NULL;
  } else {
    bad = "an unknown message";
  }
  if (m) ccs__peer_msg__free_unpacked(m, NULL);
  if (bad) {
    char who[96];
    p->ops->peer_name(c->tc, who, sizeof(who));
    LOG_WARN("daemon connection from %s: %s: closed", c->addr[0] ? c->addr : who, bad);
    drop_conn(p, c, NULL);
    return;
  }
  if (c->is_data && c->rx_cap > DATA_CONTROL_MAX) { /* no receive is posted into it now */
    free(c->rx);
    c->rx = NULL;
    c->rx_cap = DATA_CONTROL_MAX;
  }
  int rc = post_control_recv(p, c);
  if (rc) { /* the transport's word: a dead connection refuses the next receive */
    char why[200], detail[160];
    snprintf(why, sizeof(why), "connection lost: %s", conn_failure(p, c, rc, detail, sizeof(detail)));
    drop_conn(p, c, why);
  }
}

/* Failures that say something about the other end, once per connection. */
static void log_failure(struct peers *p, struct pconn *c, int status) {
  if (c->failure_logged || status == -ECONNRESET || status == -EPIPE) return;
  c->failure_logged = 1;
  char who[96], detail[160];
  const char *why = conn_failure(p, c, status, detail, sizeof(detail));
  p->ops->peer_name(c->tc, who, sizeof(who));
  if (c->addr[0] && strcmp(c->addr, who))
    LOG_WARN("daemon connection with %s (from %s): %s: closed", c->addr, who, why);
  else
    LOG_WARN("daemon connection %s %s: %s: closed", c->outbound ? "to" : "from", who, why);
}

static struct pconn *conn_of(struct peers *p, struct tconn *tc) {
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &p->conns) {
    struct pconn *c = LIST_ENTRY(it, struct pconn, link);
    if (c->tc == tc) return c;
  }
  return NULL;
}

static void on_completion(struct peers *p, const struct tcompletion *tc) {
  struct pconn *c = conn_of(p, tc->conn);
  if (c && !tc->is_send && tc->status == 0) c->last_rx = now_s(); /* a word from the peer */
  if (tc->tag == 0) {
    if (tc->is_send) { /* a control message left (or not) */
      free(tc->user);
    } else if (c && tc->status == 0) {
      on_control(p, c, tc->bytes);
      return;
    }
    if (c && tc->status && tc->status != -ECANCELED) log_failure(p, c, tc->status);
    if (c && tc->status && !c->is_data) {
      char why[200], detail[160];
      snprintf(why, sizeof(why), "connection lost: %s", conn_failure(p, c, tc->status, detail, sizeof(detail)));
      drop_conn(p, c, why);
    }
    /* a data connection the other daemon closed stays until its comm goes:
     * what it sent before is still there for the receives to come */
    return;
  }
  struct net_task *rec = tc->user;
  if (tc->status) {
    char detail[160];
    if (!failed_here(p, c, rec))
      transfer_fail_later(p, rec, "data connection lost", tc->status,
                          conn_failure(p, c, tc->status, detail, sizeof(detail)));
    return;
  }
  if (!tc->is_send) { /* whole chunks only: a short one means the ranks disagree */
    size_t chunk, off, want = transfer_bytes(rec, &chunk, &off);
    if (tc->bytes != want) {
      char why[160];
      snprintf(why, sizeof(why), "a message of %zu bytes where %zu were expected: the ranks called "
               "this op with different counts", tc->bytes, want);
      transfer_fail(p, rec, CCS_ERR_MISMATCH, why);
      return;
    }
  }
  take_tasks(p, rec->x, task_of(rec), 0);
}

/* Heartbeats out; peers silent too long, and strangers that never greeted,
 * dropped. */
static void housekeeping(struct peers *p) {
  const struct peers_options *cfg = &p->opt;
  double now = now_s();
  int beat = now - p->last_beat >= cfg->heartbeat_s;
  if (beat) p->last_beat = now;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, &p->deferred) {
    struct net_task *rec = LIST_ENTRY(it, struct net_task, link);
    if (rec->fail_at > now) continue;
    list_remove(&rec->link);
    transfer_fail_deferred(p, rec);
  }
  /* a data connection the lower daemon never dialled: it let the comm go
   * (its ranks destroyed it) or cannot reach this one; the comm holds and
   * asks it which */
  LIST_FOREACH_SAFE(it, tmp, &p->comms) {
    struct net_comm *nc = LIST_ENTRY(it, struct net_comm, link);
    struct list *w, *wtmp;
    LIST_FOREACH_SAFE(w, wtmp, &nc->waiting) {
      struct net_task *rec = LIST_ENTRY(w, struct net_task, link);
      if (rec->fail_at > now) continue;
      list_remove(&rec->link);
      transfer_fail_later(p, rec, "it opened no data connection for the communicator", 0, NULL);
    }
  }
  LIST_FOREACH_SAFE(it, tmp, &p->conns) {
    struct pconn *c = LIST_ENTRY(it, struct pconn, link);
    /* a connection we dialled has the transport's greeting deadline
     * (peer_timeout: the connect may take its time); one from a stranger
     * is dropped sooner */
    if (c->outbound && !c->got_hello && now - c->opened > cfg->peer_timeout_s + cfg->io_timeout_s) {
      char why[96];
      snprintf(why, sizeof(why), "no greeting in %.1f s", now - c->opened);
      drop_conn(p, c, why);
      continue;
    }
    if (!c->outbound && (!c->got_hello || c->waiting_comm) && now - c->opened > cfg->io_timeout_s) {
      char who[96];
      p->ops->peer_name(c->tc, who, sizeof(who));
      LOG_WARN("daemon connection from %s: %s in %.1f s: closed", c->addr[0] ? c->addr : who,
               c->got_hello ? "no communicator to serve" : "no greeting", cfg->io_timeout_s);
      drop_conn(p, c, NULL);
      continue;
    }
    if (c->is_data || !c->got_hello) continue;
    if (now - c->last_rx > cfg->peer_timeout_s) {
      char why[128];
      snprintf(why, sizeof(why), "no heartbeat for %.1f s", now - c->last_rx);
      drop_conn(p, c, why);
      continue;
    }
    if (beat) {
      Ccs__PeerMsg m = CCS__PEER_MSG__INIT;
      Ccs__PeerHeartbeat hb = CCS__PEER_HEARTBEAT__INIT;
      m.body_case = CCS__PEER_MSG__BODY_HEARTBEAT;
      m.heartbeat = &hb;
      if (send_msg(p, c, &m)) drop_conn(p, c, "cannot send a heartbeat");
    }
  }
}

static void run_cmd(struct peers *p, struct cmd *cmd) {
  switch (cmd->kind) {
  case CMD_CONTROL: {
    struct control_cmd *cc = LIST_ENTRY(cmd, struct control_cmd, cmd);
    struct pconn *c = control_to(p, cc->addr);
    if (!c) free(cc->frame);
    else if (send_frame(p, c, cc->frame, cc->len)) drop_conn(p, c, "cannot send");
    free(cc);
    break;
  }
  case CMD_COMM_OPEN: comm_open(p, cmd->nc); break;
  case CMD_COMM_CLOSE: comm_close(p, cmd->nc); break;
  case CMD_COMM_FREE: comm_free(p, cmd->nc); break; /* cmd went with it */
  }
}

/* What other threads queued: commands first (a comm opens before its ops'
 * tasks look for it), then the ops handed over. */
static void run_queued(struct peers *p, struct list *cmds, struct list *handovers) {
  while (!list_empty(cmds)) {
    struct cmd *cmd = LIST_ENTRY(cmds->next, struct cmd, link);
    list_remove(&cmd->link);
    run_cmd(p, cmd);
  }
  while (!list_empty(handovers)) {
    struct run_op *x = LIST_ENTRY(handovers->next, struct run_op, net_link);
    list_remove(&x->net_link);
    take_tasks(p, x, CCSD_NO_TASK, 1);
  }
  run_taken(p);
}

/* A connection refused at the door (descriptors, peer_max_connections):
 * said once a second at most. */
static void refused(struct peers *p, const char *why) {
  double now = now_s();
  if (now - p->last_refusal_log < 1) return;
  p->last_refusal_log = now;
  LOG_WARN("daemons' port: %s", why);
}

/* One round of the network side, under p->drive: what other threads
 * queued, the transport polled without waiting, the connections it says
 * wait to be accepted, what its completions made ready, heartbeats.
 * Returns -1 once the daemon stops (nothing done), else how much it found
 * to do. */
static int step(struct peers *p) {
  struct list cmds, handovers;
  list_init(&cmds);
  list_init(&handovers);
  pthread_mutex_lock(&p->mu);
  int stop = p->stop;
  list_take_all(&cmds, &p->cmds);
  list_take_all(&handovers, &p->handovers);
  pthread_mutex_unlock(&p->mu);
  int work = !list_empty(&handovers);
  run_queued(p, &cmds, &handovers);
  if (stop) return -1;
  struct tcompletion done[64];
  int n = p->ops->poll(p->t, 0, done, 64);
  struct tconn *tc;
  char why[200];
  for (int r; (r = p->ops->accept(p->t, &tc, why, sizeof(why))) != 0;) {
    if (r == 1) adopt(p, tc, NULL, 0);
    else refused(p, why);
    if (r < 0 && strstr(why, "listen queue")) break;
  }
  for (int i = 0; i < n; i++) on_completion(p, &done[i]);
  run_taken(p);
  housekeeping(p);
  ccsd_links_each(&p->links, drain_each, p); /* capped tenants' turns come with time */
  run_taken(p);
  return work + (n > 0 ? n : 0);
}

/* The descriptors to sleep on, with their room grown as needed (under
 * p->drive): while the loop drives the transport, only the wake-up. */
static int wait_fds(struct peers *p) {
  int n = p->ops->wait_fds(p->t, p->fds, p->nfds_cap);
  if (n > p->nfds_cap) {
    struct pollfd *more = realloc(p->fds, sizeof(*more) * (size_t)n * 2);
    if (!more) return p->nfds_cap; /* some wait unwatched: the 50 ms timeout reaches them */
    p->fds = more;
    p->nfds_cap = n * 2;
    n = p->ops->wait_fds(p->t, p->fds, p->nfds_cap);
  }
  return atomic_load_explicit(&p->loop_drives, memory_order_relaxed) && n > 1 ? 1 : n;
}

/* The network thread drives the transport unless the loop does: then it
 * sleeps on its wake-up alone (hand-overs from executor threads, commands,
 * the loop giving the transport back), so that a small op's messages never
 * wait for this thread to be scheduled. While it drives, it busy-polls for
 * spin_ns after its last work: a sleeping thread's wake-up (15-70 us on
 * shared machines) would cost more than the messages. */
static void *net_thread(void *arg) {
  struct peers *p = arg;
  double active = 0; /* the last hand-over or completion */
  for (;;) {
    pthread_mutex_lock(&p->drive);
    int work = step(p);
    int n = work < 0 ? 0 : wait_fds(p);
    pthread_mutex_unlock(&p->drive);
    if (work < 0) break;
    double now = now_s();
    if (work > 0) active = now;
    int spinning = !atomic_load_explicit(&p->loop_drives, memory_order_relaxed) &&
                   now - active < (double)p->opt.spin_ns / 1e9;
    if (spinning) sched_yield();
    else if (poll(p->fds, (nfds_t)n, 50) < 0 && errno != EINTR) usleep(1000);
  }
  return NULL;
}

int ccsd_peers_drive(struct peers *p) {
  if (!atomic_load_explicit(&p->loop_drives, memory_order_relaxed)) {
    atomic_store(&p->loop_drives, 1);
    p->ops->wake(p->t); /* it stops watching the connections */
  }
  if (pthread_mutex_trylock(&p->drive)) return 0; /* the network thread is at it */
  int work = step(p);
  pthread_mutex_unlock(&p->drive);
  return work > 0 ? work : 0;
}

void ccsd_peers_drive_end(struct peers *p) {
  if (p && atomic_exchange(&p->loop_drives, 0)) p->ops->wake(p->t);
}

/* Work queued by the loop while it drives is taken on its next round:
 * the network thread need not wake. */
static void wake(struct peers *p) {
  if (!atomic_load_explicit(&p->loop_drives, memory_order_relaxed) ||
      !pthread_equal(pthread_self(), p->loop_thread))
    p->ops->wake(p->t);
}

/* 0 when queued; -1 once the thread is gone (cmd is the caller's again):
 * what the loop does while the daemon closes may still send. */
static int enqueue(struct peers *p, struct cmd *cmd) {
  pthread_mutex_lock(&p->mu);
  int stopped = p->stopped;
  if (!stopped) list_insert_tail(&p->cmds, &cmd->link);
  pthread_mutex_unlock(&p->mu);
  if (stopped) return -1;
  wake(p);
  return 0;
}

/* --- the other threads' side --------------------------------------------------- */

void ccsd_peers_send(struct peers *p, const char *addr, const struct peer_msg *m) {
  struct control_cmd *cc = calloc(1, sizeof(*cc));
  if (cc) cc->frame = ccsd_peer_msg_pack(m, CONTROL_MAX, &cc->len);
  if (!cc || !cc->frame) { /* as a lost message: the op deadlines and heartbeats cover it */
    free(cc);
    LOG_ERROR("out of memory sending to the daemon at %s", addr);
    return;
  }
  cc->cmd.kind = CMD_CONTROL;
  snprintf(cc->addr, sizeof(cc->addr), "%s", addr);
  if (enqueue(p, &cc->cmd)) { /* stopping: the others see the connections close */
    free(cc->frame);
    free(cc);
  }
}

struct net_comm *ccsd_peers_comm_open(struct peers *p, const uint8_t *name, int nnodes,
                                      int mynode, const char (*addrs)[CCSD_ADDR_MAX], int lanes,
                                      struct held_msg *carried) {
  struct net_comm *nc = calloc(1, sizeof(*nc));
  if (nc) {
    nc->addrs = malloc(sizeof(*nc->addrs) * (size_t)nnodes);
    nc->data = calloc((size_t)nnodes * (size_t)lanes, sizeof(*nc->data));
    nc->gone = calloc((size_t)nnodes, 1);
  }
  if (!nc || !nc->addrs || !nc->data || !nc->gone) {
    if (nc) free(nc->addrs), free(nc->data), free(nc->gone);
    free(nc);
    ccsd_held_free(&carried);
    return NULL;
  }
  memcpy(nc->name, name, CCS__NAME_BYTES);
  memcpy(nc->addrs, addrs, sizeof(*nc->addrs) * (size_t)nnodes);
  nc->nnodes = nnodes;
  nc->mynode = mynode;
  nc->lanes = lanes;
  nc->carried = carried;
  list_init(&nc->waiting);
  nc->open = (struct cmd){.kind = CMD_COMM_OPEN, .nc = nc};
  nc->close = (struct cmd){.kind = CMD_COMM_CLOSE, .nc = nc};
  nc->free = (struct cmd){.kind = CMD_COMM_FREE, .nc = nc};
  if (enqueue(p, &nc->open)) {
    free(nc->addrs), free(nc->data), free(nc->gone);
    free(nc);
    ccsd_held_free(&carried);
    return NULL;
  }
  return nc;
}

struct held_take {
  struct held_msg **table;
  int node, failed;
};

static void keep_held(void *arg, uint64_t tag, void *data, size_t len) {
  struct held_take *out = arg;
  struct held_msg *h = ccsd_held_find(*out->table, tag) ? NULL : malloc(sizeof(*h)); /* (a tag twice: wrong) */
  if (!h) {
    free(data);
    out->failed = 1;
    return;
  }
  *h = (struct held_msg){.tag = tag, .node = out->node, .fresh = 1, .len = len, .data = data};
  HASH_ADD(hh, *out->table, tag, sizeof(h->tag), h);
}

int ccsd_peers_comm_take_held(struct peers *p, struct net_comm *nc, int node, struct held_msg **out) {
  pthread_mutex_lock(&p->mu);
  int stopping = p->stop;
  pthread_mutex_unlock(&p->mu);
  if (stopping) return -1; /* (its comms are freed) */
  pthread_mutex_lock(&p->drive); /* (short: the network thread holds it for a round) */
  struct held_msg *h, *tmp;
  HASH_ITER(hh, nc->carried, h, tmp) {
    h->fresh = 0; /* (whole: carried over once already) */
    ccsd_held_move(&nc->carried, out, h);
  }
  /* every lane closed cleanly; one closed here, or never opened, may have
   * dropped or missed a message's chunk */
  int rc = !p->ops->take_held || node < 0 || node >= nc->nnodes || nc->closed || nc->gone[node] ? -1 : 1;
  for (int lane = 0; lane < nc->lanes && rc == 1; lane++) {
    struct pconn *c = nc->data[node * nc->lanes + lane];
    rc = c && c->tc ? p->ops->take_held(c->tc, NULL, NULL) : -1;
  }
  struct held_take got = {out, node, 0};
  for (int lane = 0; lane < nc->lanes && rc == 1; lane++)
    p->ops->take_held(nc->data[node * nc->lanes + lane]->tc, keep_held, &got);
  pthread_mutex_unlock(&p->drive);
  return got.failed ? -1 : rc;
}

/* Each at most once per comm. Once stopping they do nothing: every comm's
 * connections were closed and the comm freed. */
void ccsd_peers_comm_close(struct peers *p, struct net_comm *nc) {
  enqueue(p, &nc->close);
}
void ccsd_peers_comm_free(struct peers *p, struct net_comm *nc) {
  enqueue(p, &nc->free);
}

int ccsd_peers_comm_holds(struct peers *p, struct net_comm *nc) {
  if (pthread_mutex_trylock(&p->drive)) return -1; /* the network thread is at it */
  int holds = 0;
  if (!nc->closed && p->ops->holds)
    for (int i = 0; i < nc->nnodes * nc->lanes && !holds; i++)
      holds = nc->data[i] && nc->data[i]->tc && p->ops->holds(nc->data[i]->tc);
  pthread_mutex_unlock(&p->drive);
  return holds;
}

int ccsd_peers_op_prepare(struct run_op *x) {
  x->net_tasks = calloc(x->plan.ntasks, sizeof(*x->net_tasks));
  if (!x->net_tasks) return -1;
  for (size_t t = 0; t < x->plan.ntasks; t++) {
    x->net_tasks[t].x = x;
    list_init(&x->net_tasks[t].link);
  }
  list_init(&x->net_link);
  return 0;
}

/* After the network thread is gone: x's network tasks finish unsent. */
static void finish_unsent(struct executor *e, struct run_op *x) {
  struct list todo;
  list_init(&todo);
  take(e, x, CCSD_NO_TASK, 1, &todo);
  if (!list_empty(&todo)) ccsd_run_op_net_error(x, CCS_ERR_PEER_LOST, -1, "this daemon is stopping");
  while (!list_empty(&todo)) { /* x lives while a task of it is unfinished */
    struct net_task *rec = LIST_ENTRY(todo.next, struct net_task, link);
    list_remove(&rec->link);
    take(e, x, task_of(rec), 0, &todo);
  }
}

/* Executor threads and the loop: x has ready network tasks for this
 * thread to take (ccsd_executor_net_step); one hand-over at a time. */
static void hand_over(struct peers *p, struct run_op *x) {
  pthread_mutex_lock(&p->mu);
  int stopped = p->stopped;
  if (!stopped) list_insert_tail(&p->handovers, &x->net_link);
  pthread_mutex_unlock(&p->mu);
  if (stopped) finish_unsent(p->exec, x);
  else wake(p);
}

static void hand_over_cb(void *arg, struct run_op *x) { hand_over(arg, x); }

static void peers_free(struct peers *p) {
  reg_cache_free(p->regs); /* (a start that failed) */
  if (p->t) p->ops->free(p->t);
  ccsd_links_close(&p->links);
  pthread_mutex_destroy(&p->mu);
  pthread_mutex_destroy(&p->drive);
  free(p->fds);
  free(p);
}

/* The transport as configured; for auto, verbs where a port is active and
 * TCP where not, the reason said. */
static struct transport *open_transport(struct peers *p, const struct transport_params *params, char *err,
                                        size_t errlen) {
  int automatic = !strcmp(p->opt.transport, "auto");
  p->ops = ccs_transport_find(automatic ? "ib" : p->opt.transport);
  struct transport *t = p->ops ? p->ops->open(params, err, errlen) : NULL;
  if (!t && automatic) {
    LOG_INFO(CCS_LOG_INIT, "transport auto: tcp, as %s", p->ops ? err : "built without rdma-core");
    p->ops = &ccs_transport_tcp;
    t = p->ops->open(params, err, errlen);
  } else if (!p->ops) {
    snprintf(err, errlen, "no transport called '%s'", p->opt.transport);
  }
  if (t) {
    char what[512];
    p->ops->describe(t, what, sizeof(what));
    LOG_INFO(CCS_LOG_INIT, "between daemons: %s", what);
  }
  return t;
}

static struct peers *start_failed(struct peers *p) {
  peers_free(p);
  return NULL;
}

struct peers *ccsd_peers_start(uv_loop_t *loop, const struct peers_options *opt,
                               const struct peers_hooks *hooks, struct executor *exec,
                               char *bound, size_t boundlen) {
  char err[256];
  struct peers *p = calloc(1, sizeof(*p));
  if (!p) return NULL;
  p->opt = *opt;
  p->hooks = *hooks;
  p->exec = exec;
  pthread_mutex_init(&p->mu, NULL);
  pthread_mutex_init(&p->drive, NULL);
  p->loop_thread = pthread_self();
  list_init(&p->cmds);
  list_init(&p->handovers);
  list_init(&p->taken);
  list_init(&p->events);
  list_init(&p->conns);
  list_init(&p->comms);
  list_init(&p->deferred);
  ccsd_links_init(&p->links, LINK_WINDOW, opt->link_capacity);
  struct transport_params params = {
      .encrypt_data = opt->encrypt,
      .max_conns = opt->max_connections,
      .unexpected_per_conn = opt->unexpected_bytes,
      .unexpected_total = opt->unexpected_total,
      .greeting_timeout_s = opt->peer_timeout_s,
      .ib_library = opt->ib_library,
      .ib_devices = opt->ib_devices,
      .ib_gid_index = opt->ib_gid_index,
  };
  if (ccs_auth_read_key(opt->cluster_key_file, params.key, err, sizeof(err))) {
    LOG_ERROR("listen needs the cluster key: %s", err);
    return start_failed(p);
  }
  p->t = open_transport(p, &params, err, sizeof(err));
  ccs_auth_wipe_key(&params);
  if (p->t && !(p->regs = reg_cache_new(p->ops, p->t))) snprintf(err, sizeof(err), "out of memory");
  if (!p->t || !p->regs || p->ops->listen(p->t, opt->listen, bound, boundlen, err, sizeof(err))) {
    LOG_ERROR("daemons' port: %s", err);
    return start_failed(p);
  }
  /* ids and rank maps carry numeric addresses: a name is resolved once, here */
  if (opt->advertise[0] && ccs_addr_resolve(opt->advertise, bound, boundlen, err, sizeof(err))) {
    LOG_ERROR("advertise: %s", err);
    return start_failed(p);
  }
  snprintf(p->self, sizeof(p->self), "%s", bound);
  uv_async_init(loop, &p->async, on_events);
  p->async.data = p;
  p->last_beat = now_s();
  if (pthread_create(&p->thread, NULL, net_thread, p)) {
    LOG_ERROR("cannot start the network thread");
    uv_close((uv_handle_t *)&p->async, NULL);
    return start_failed(p);
  }
  ccsd_executor_set_handover(exec, hand_over_cb, p);
  return p;
}

void ccsd_peers_stop(struct peers *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_mutex_unlock(&p->mu);
  p->ops->wake(p->t);
  pthread_join(p->thread, NULL);
  /* The thread is gone: what it left is done here. Commands first (comms
   * closed at shutdown tell their other daemons), then every connection
   * closed, so that every transfer completes and every op finishes; network
   * tasks from now on finish unsent. */
  pthread_mutex_lock(&p->mu);
  p->stopped = 1;
  pthread_mutex_unlock(&p->mu);
  struct list cmds, handovers;
  list_init(&cmds);
  list_init(&handovers);
  pthread_mutex_lock(&p->mu);
  list_take_all(&cmds, &p->cmds);
  list_take_all(&handovers, &p->handovers);
  pthread_mutex_unlock(&p->mu);
  run_queued(p, &cmds, &handovers);
  while (!list_empty(&p->conns)) drop_conn(p, LIST_ENTRY(p->conns.next, struct pconn, link), NULL);
  struct tcompletion done[64];
  for (int n; (n = p->ops->poll(p->t, 0, done, 64)) > 0;)
    for (int i = 0; i < n; i++) on_completion(p, &done[i]);
  run_taken(p);
  while (!list_empty(&p->deferred)) {
    struct net_task *rec = LIST_ENTRY(p->deferred.next, struct net_task, link);
    list_remove(&rec->link);
    transfer_fail_deferred(p, rec);
  }
  run_taken(p);
  while (!list_empty(&p->comms)) comm_free(p, LIST_ENTRY(p->comms.next, struct net_comm, link));
  run_taken(p);
  on_events(&p->async);
  reg_cache_free(p->regs); /* registrations still in use go with their ops */
  p->regs = NULL;
  p->ops->free(p->t);
  p->t = NULL;
  uv_close((uv_handle_t *)&p->async, NULL);
}

void ccsd_peers_free(struct peers *p) {
  if (p) peers_free(p);
}
