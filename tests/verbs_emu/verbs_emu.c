/* An emulated libibverbs, for tests only: the entry points the verbs
 * transport loads with dlopen (and the four it reaches through
 * context->ops), behaving as a reliable-connected RoCE NIC in user space so
 * that the transport runs unmodified where no RDMA device exists.
 * Faithfulness to the verbs rules comes before speed: keys are random and
 * distinct (an lkey used as an rkey fails), send-queue slots come back only
 * when a completion covering them is polled, errors complete in order and
 * flush the rest, and only hardware's own checks refuse a call.
 *
 * This file holds the devices, contexts, memory regions, async events and
 * faults; verbs_emu_qp.c the CQs, channels and queue pairs; verbs_emu_wire.c
 * moves the packets between queue pairs; verbs_emu.h says who locks what.
 *
 * Configuration (environment, read by ibv_get_device_list):
 *   CCS_VERBS_EMU_DEVICES  name:ports:state,...   (default emu0:1:active)
 *   CCS_VERBS_EMU_ADDR     the ports' IPv4 address (default 127.0.0.1)
 *   CCS_VERBS_EMU_DIR      where the queue pairs' sockets live (needed for QPs)
 * Faults: ccs_verbs_emu_raise() in process, or from anywhere a file
 * $CCS_VERBS_EMU_DIR/raise-<pid>, read within ~50 ms once its last line
 * ends (best written elsewhere and renamed there), with lines
 * `port_down DEV PORT`, `port_up DEV PORT`, `qp_error QPN|all`,
 * `device_fatal DEV`, `rkeys_revoked` (every region of the process loses
 * its remote rights). A port that is down carries no packets: its QPs'
 * sends time out as on a dead link. */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "verbs_emu.h"

/* verbs.h turns these into inline wrappers; we define the symbols themselves */
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

/* rdma-core's struct ibv_port_attr without port_cap_flags2 (libibverbs/
 * ibverbs.h): what the exported ibv_query_port fills. */
struct _compat_ibv_port_attr {
  enum ibv_port_state state;
  enum ibv_mtu max_mtu, active_mtu;
  int gid_tbl_len;
  uint32_t port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr;
  uint16_t pkey_tbl_len, lid, sm_lid;
  uint8_t lmc, max_vl_num, sm_sl, subnet_timeout, init_type_reply, active_width, active_speed,
      phys_state, link_layer, flags;
};

EMU_API int ccs_verbs_emu_raise(struct ibv_context *ctx, enum ibv_event_type type, int port_or_qpn);

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct emu_dev *g_devs;
static struct emu_ctx *g_ctxs;
static char g_dir[PATH_MAX];

#define MAX_DEVICES 16
#define ACK_WAIT_S 10.0

double emu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint32_t emu_random32(void) {
  uint32_t v;
  if (getrandom(&v, sizeof(v), 0) == (ssize_t)sizeof(v)) return v;
  static _Atomic uint64_t fallback;
  uint64_t x = atomic_fetch_add(&fallback, 0x9e3779b97f4a7c15ull) ^ (uint64_t)(emu_now() * 1e9) ^
               (uint64_t)getpid() << 32;
  x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
  return (uint32_t)(x ^ (x >> 29));
}

/* ---- devices ------------------------------------------------------------------ */

struct dev_spec {
  char name[IBV_SYSFS_NAME_MAX];
  int ports;
  enum ibv_port_state state;
};

static int parse_devices(const char *text, struct dev_spec *out) {
  char buf[1024];
  if (strlen(text) >= sizeof(buf)) return -1;
  strcpy(buf, text);
  int n = 0;
  char *save = NULL;
  for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    char name[IBV_SYSFS_NAME_MAX], state[16], extra;
    int ports;
    if (n == MAX_DEVICES ||
        sscanf(item, " %63[^:]:%d:%15[a-z] %c", name, &ports, state, &extra) != 3 || ports < 1 ||
        ports > EMU_MAX_PORTS)
      return -1;
    if (!strcmp(state, "active"))
      out[n].state = IBV_PORT_ACTIVE;
    else if (!strcmp(state, "down"))
      out[n].state = IBV_PORT_DOWN;
    else
      return -1;
    for (int i = 0; i < n; i++)
      if (!strcmp(out[i].name, name)) return -1;
    strcpy(out[n].name, name);
    out[n].ports = ports;
    n++;
  }
  return n;
}

/* The process's device of that name (g_lock held): one object per name, so
 * a port taken down stays down for every list and context that has it. */
static struct emu_dev *dev_get(const struct dev_spec *sp, struct in_addr addr, int index) {
  for (struct emu_dev *d = g_devs; d; d = d->next)
    if (!strcmp(d->ibdev.name, sp->name)) {
      d->refs++;
      return d;
    }
  struct emu_dev *d = calloc(1, sizeof(*d));
  if (!d) return NULL;
  d->ibdev.node_type = IBV_NODE_CA;
  d->ibdev.transport_type = IBV_TRANSPORT_IB;
  snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", sp->name);
  snprintf(d->ibdev.dev_name, sizeof(d->ibdev.dev_name), "uverbs%d", index);
  snprintf(d->ibdev.dev_path, sizeof(d->ibdev.dev_path), "/sys/class/infiniband_verbs/uverbs%d", index);
  snprintf(d->ibdev.ibdev_path, sizeof(d->ibdev.ibdev_path), "/sys/class/infiniband/%s", sp->name);
  /* the same name and address give the same GUID: one emulated host's NIC */
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *c = sp->name; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
  h = (h ^ addr.s_addr) * 0x100000001b3ull;
  d->guid = h;
  d->nports = sp->ports;
  for (int p = 0; p < sp->ports; p++) {
    struct emu_port *port = &d->port[p];
    atomic_init(&port->state, (int)sp->state);
    port->gid[0].raw[0] = 0xfe;
    port->gid[0].raw[1] = 0x80;
    for (int i = 0; i < 8; i++) port->gid[0].raw[8 + i] = (uint8_t)(h >> (56 - 8 * i));
    port->gid[0].raw[15] ^= (uint8_t)(p + 1);
    port->gid[1].raw[10] = 0xff;
    port->gid[1].raw[11] = 0xff;
    memcpy(&port->gid[1].raw[12], &addr.s_addr, 4);
  }
  d->refs = 1;
  d->next = g_devs;
  g_devs = d;
  return d;
}

static void dev_put(struct emu_dev *d) {
  if (--d->refs > 0) return;
  for (struct emu_dev **pp = &g_devs; *pp; pp = &(*pp)->next)
    if (*pp == d) {
      *pp = d->next;
      break;
    }
  free(d);
}

/* A fork while a progress thread holds g_lock would leave the child's copy locked. */
static void atfork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void atfork_release(void) { pthread_mutex_unlock(&g_lock); }
static void register_atfork(void) { pthread_atfork(atfork_prepare, atfork_release, atfork_release); }

EMU_API struct ibv_device **ibv_get_device_list(int *num_devices) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, register_atfork);
  const char *spec = getenv("CCS_VERBS_EMU_DEVICES");
  const char *addr_text = getenv("CCS_VERBS_EMU_ADDR");
  const char *dir = getenv("CCS_VERBS_EMU_DIR");
  struct dev_spec specs[MAX_DEVICES];
  struct in_addr addr;
  int n = parse_devices(spec ? spec : "emu0:1:active", specs);
  if (n < 0 || inet_pton(AF_INET, addr_text ? addr_text : "127.0.0.1", &addr) != 1 ||
      (dir && strlen(dir) >= sizeof(g_dir))) {
    errno = EINVAL;
    return NULL;
  }
  struct ibv_device **list = calloc((size_t)n + 1, sizeof(*list));
  if (!list) return NULL;
  pthread_mutex_lock(&g_lock);
  snprintf(g_dir, sizeof(g_dir), "%s", dir ? dir : "");
  for (int i = 0; i < n; i++) {
    struct emu_dev *d = dev_get(&specs[i], addr, i);
    if (!d) {
      while (i-- > 0) dev_put((struct emu_dev *)list[i]);
      pthread_mutex_unlock(&g_lock);
      free(list);
      errno = ENOMEM;
      return NULL;
    }
    list[i] = &d->ibdev;
  }
  pthread_mutex_unlock(&g_lock);
  if (num_devices) *num_devices = n;
  return list;
}

EMU_API void ibv_free_device_list(struct ibv_device **list) {
  if (!list) return;
  pthread_mutex_lock(&g_lock);
  for (struct ibv_device **d = list; *d; d++) dev_put((struct emu_dev *)*d);
  pthread_mutex_unlock(&g_lock);
  free(list);
}

EMU_API const char *ibv_get_device_name(struct ibv_device *device) { return device->name; }

EMU_API __be64 ibv_get_device_guid(struct ibv_device *device) {
  return htobe64(((struct emu_dev *)device)->guid);
}

/* ---- contexts ------------------------------------------------------------------ */

EMU_API struct ibv_context *ibv_open_device(struct ibv_device *device) {
  struct emu_dev *d = (struct emu_dev *)device;
  struct emu_ctx *ctx = calloc(1, sizeof(*ctx));
  int p[2];
  if (!ctx || pipe2(p, O_CLOEXEC)) {
    free(ctx);
    return NULL;
  }
  fcntl(p[1], F_SETFL, O_NONBLOCK);
  ctx->ibctx.device = device;
  ctx->ibctx.ops.post_send = emu_post_send;
  ctx->ibctx.ops.post_recv = emu_post_recv;
  ctx->ibctx.ops.poll_cq = emu_poll_cq;
  ctx->ibctx.ops.req_notify_cq = emu_req_notify_cq;
  ctx->ibctx.cmd_fd = -1;
  ctx->ibctx.async_fd = p[0];
  ctx->ibctx.num_comp_vectors = 4;
  pthread_mutex_init(&ctx->ibctx.mutex, NULL);
  ctx->async_wr = p[1];
  ctx->wake[0] = ctx->wake[1] = -1;
  pthread_mutex_init(&ctx->lock, NULL);
  pthread_cond_init(&ctx->acked, NULL);
  pthread_mutex_lock(&g_lock);
  d->refs++;
  memcpy(ctx->dir, g_dir, sizeof(ctx->dir));
  ctx->dev = d;
  ctx->next = g_ctxs;
  g_ctxs = ctx;
  pthread_mutex_unlock(&g_lock);
  return &ctx->ibctx;
}

/* Frees everything still open on it: the caller may leave objects behind
 * (the kernel would clean up after it). */
EMU_API int ibv_close_device(struct ibv_context *ibctx) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibctx;
  pthread_mutex_lock(&g_lock); /* no fault reaches it from now on */
  for (struct emu_ctx **pp = &g_ctxs; *pp; pp = &(*pp)->next)
    if (*pp == ctx) {
      *pp = ctx->next;
      break;
    }
  pthread_mutex_unlock(&g_lock);
  emu_progress_stop(ctx);
  while (ctx->qps) {
    struct emu_qp *qp = ctx->qps;
    ctx->qps = qp->next;
    emu_qp_release(qp);
  }
  while (ctx->cqs) {
    struct emu_cq *cq = ctx->cqs;
    ctx->cqs = cq->next;
    emu_cq_free(cq);
  }
  while (ctx->chans) {
    struct emu_chan *ch = ctx->chans;
    ctx->chans = ch->next;
    while (ch->head) {
      struct emu_chan_event *e = ch->head;
      ch->head = e->next;
      free(e);
    }
    close(ch->ibch.fd);
    close(ch->wr_fd);
    free(ch);
  }
  while (ctx->mrs) {
    struct emu_mr *mr = ctx->mrs;
    ctx->mrs = mr->next;
    free(mr);
  }
  while (ctx->pds) {
    struct emu_pd *pd = ctx->pds;
    ctx->pds = pd->next;
    free(pd);
  }
  while (ctx->ev_head) {
    struct emu_event *e = ctx->ev_head;
    ctx->ev_head = e->next;
    free(e);
  }
  close(ctx->ibctx.async_fd);
  close(ctx->async_wr);
  pthread_mutex_lock(&g_lock);
  dev_put(ctx->dev);
  pthread_mutex_unlock(&g_lock);
  pthread_mutex_destroy(&ctx->ibctx.mutex);
  pthread_mutex_destroy(&ctx->lock);
  pthread_cond_destroy(&ctx->acked);
  free(ctx);
  return 0;
}

EMU_API int ibv_query_device(struct ibv_context *ibctx, struct ibv_device_attr *a) {
  struct emu_dev *d = ((struct emu_ctx *)ibctx)->dev;
  memset(a, 0, sizeof(*a));
  snprintf(a->fw_ver, sizeof(a->fw_ver), "emu");
  a->node_guid = a->sys_image_guid = htobe64(d->guid);
  a->max_mr_size = 1ull << 40;
  a->page_size_cap = 4096;
  a->vendor_id = 0x02c9;
  a->vendor_part_id = 4119;
  a->max_qp = 16384;
  a->max_qp_wr = EMU_MAX_WR;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT |
                        IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_CHANGE_PHY_PORT;
  a->max_sge = a->max_sge_rd = EMU_MAX_SGE;
  a->max_cq = 16384;
  a->max_cqe = EMU_MAX_CQE;
  a->max_mr = 65536;
  a->max_pd = 16384;
  a->max_qp_rd_atom = a->max_qp_init_rd_atom = EMU_MAX_RD_ATOMIC;
  a->max_res_rd_atom = EMU_MAX_RD_ATOMIC * 16384;
  a->atomic_cap = IBV_ATOMIC_NONE;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = 16;
  a->phys_port_cnt = (uint8_t)d->nports;
  return 0;
}

EMU_API int ibv_query_port(struct ibv_context *ibctx, uint8_t port_num, struct _compat_ibv_port_attr *a) {
  struct emu_dev *d = ((struct emu_ctx *)ibctx)->dev;
  if (port_num < 1 || port_num > d->nports) return EINVAL;
  int state = atomic_load(&d->port[port_num - 1].state);
  memset(a, 0, sizeof(*a));
  a->state = (enum ibv_port_state)state;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = IBV_MTU_1024; /* RoCE over 1500-byte Ethernet */
  a->gid_tbl_len = 2;
  a->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
  a->max_msg_sz = EMU_MAX_MSG;
  a->pkey_tbl_len = 1;
  a->max_vl_num = 4;
  a->active_width = 2;  /* 4X */
  a->active_speed = 32; /* EDR, 25 Gb/s a lane */
  a->phys_state = state == IBV_PORT_ACTIVE ? 5 /* LinkUp */ : 3 /* Disabled */;
  a->link_layer = IBV_LINK_LAYER_ETHERNET;
  return 0;
}

EMU_API int ibv_query_gid(struct ibv_context *ibctx, uint8_t port_num, int index, union ibv_gid *gid) {
  struct emu_dev *d = ((struct emu_ctx *)ibctx)->dev;
  if (port_num < 1 || port_num > d->nports || index < 0 || index > 1) {
    errno = EINVAL;
    return -1;
  }
  *gid = d->port[port_num - 1].gid[index];
  return 0;
}

/* ---- protection domains and memory regions ------------------------------------ */

EMU_API struct ibv_pd *ibv_alloc_pd(struct ibv_context *ibctx) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibctx;
  struct emu_pd *pd = calloc(1, sizeof(*pd));
  if (!pd) return NULL;
  pd->ibpd.context = ibctx;
  pthread_mutex_lock(&ctx->lock);
  pd->ibpd.handle = ++ctx->handles;
  pd->next = ctx->pds;
  ctx->pds = pd;
  pthread_mutex_unlock(&ctx->lock);
  return &pd->ibpd;
}

EMU_API int ibv_dealloc_pd(struct ibv_pd *ibpd) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibpd->context;
  struct emu_pd *pd = (struct emu_pd *)ibpd;
  pthread_mutex_lock(&ctx->lock);
  if (pd->refs) {
    pthread_mutex_unlock(&ctx->lock);
    return EBUSY;
  }
  for (struct emu_pd **pp = &ctx->pds; *pp; pp = &(*pp)->next)
    if (*pp == pd) {
      *pp = pd->next;
      break;
    }
  pthread_mutex_unlock(&ctx->lock);
  free(pd);
  return 0;
}

static bool key_taken(const struct emu_ctx *ctx, uint32_t key) {
  if (key == 0) return true;
  for (const struct emu_mr *m = ctx->mrs; m; m = m->next)
    if (m->ibmr.lkey == key || m->ibmr.rkey == key) return true;
  return false;
}

EMU_API struct ibv_mr *ibv_reg_mr(struct ibv_pd *ibpd, void *addr, size_t length, int access) {
  const int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_RELAXED_ORDERING;
  struct emu_ctx *ctx = (struct emu_ctx *)ibpd->context;
  /* remote write or atomic access needs local write: hardware refuses it */
  if ((access & ~known) ||
      ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
       !(access & IBV_ACCESS_LOCAL_WRITE)) ||
      length == 0 || length > (1ull << 40) || (uintptr_t)addr + length < (uintptr_t)addr) {
    errno = EINVAL;
    return NULL;
  }
  struct emu_mr *mr = calloc(1, sizeof(*mr));
  if (!mr) return NULL;
  mr->ibmr.context = ibpd->context;
  mr->ibmr.pd = ibpd;
  mr->ibmr.addr = addr;
  mr->ibmr.length = length;
  mr->pd = (struct emu_pd *)ibpd;
  mr->access = access;
  mr->start = (uintptr_t)addr;
  mr->end = (uintptr_t)addr + length;
  pthread_mutex_lock(&ctx->lock);
  mr->ibmr.handle = ++ctx->handles;
  /* random and distinct: a stale key or an lkey passed as an rkey fails */
  do mr->ibmr.lkey = emu_random32();
  while (key_taken(ctx, mr->ibmr.lkey));
  do mr->ibmr.rkey = emu_random32();
  while (key_taken(ctx, mr->ibmr.rkey) || mr->ibmr.rkey == mr->ibmr.lkey);
  mr->next = ctx->mrs;
  ctx->mrs = mr;
  mr->pd->refs++;
  pthread_mutex_unlock(&ctx->lock);
  return &mr->ibmr;
}

/* Allowed while posted work still names it, as on hardware: that work
 * fails when it gets there. */
EMU_API int ibv_dereg_mr(struct ibv_mr *ibmr) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibmr->context;
  struct emu_mr *mr = (struct emu_mr *)ibmr;
  pthread_mutex_lock(&ctx->lock);
  for (struct emu_mr **pp = &ctx->mrs; *pp; pp = &(*pp)->next)
    if (*pp == mr) {
      *pp = mr->next;
      break;
    }
  mr->pd->refs--;
  pthread_mutex_unlock(&ctx->lock);
  free(mr);
  return 0;
}

struct emu_mr *emu_mr_find(struct emu_qp *qp, uint32_t key, bool remote, uintptr_t addr,
                           uint64_t len, int access) {
  for (struct emu_mr *m = qp->ctx->mrs; m; m = m->next)
    if ((remote ? m->ibmr.rkey : m->ibmr.lkey) == key) {
      bool inside = addr >= m->start && addr <= m->end && len <= m->end - addr;
      return m->pd == qp->pd && inside && (m->access & access) == access ? m : NULL;
    }
  return NULL;
}

int emu_sge_copy(struct emu_qp *qp, const struct ibv_sge *sge, int nsge, uint64_t off, void *buf,
                 uint64_t len, int access, bool into_sge) {
  uint8_t *b = buf;
  for (int i = 0; i < nsge && len > 0; i++) {
    if (off >= sge[i].length) {
      off -= sge[i].length;
      continue;
    }
    uint64_t n = sge[i].length - off < len ? sge[i].length - off : len;
    uintptr_t at = (uintptr_t)sge[i].addr + off;
    if (!emu_mr_find(qp, sge[i].lkey, false, at, n, access)) return -1;
    if (into_sge)
      memcpy((void *)at, b, n);
    else
      memcpy(b, (const void *)at, n);
    b += n;
    len -= n;
    off = 0;
  }
  return len ? -1 : 0;
}

/* ---- async events ------------------------------------------------------------- */

/* The async fd (a pipe) holds one byte while events wait: level-triggered
 * like the kernel's, whatever number of events there are. */
void emu_level_set(int wr_fd) { (void)!write(wr_fd, "e", 1); }
void emu_level_clear(int rd_fd) {
  char c;
  (void)!read(rd_fd, &c, 1);
}

bool emu_event_is_qp(enum ibv_event_type t) {
  return t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_QP_REQ_ERR || t == IBV_EVENT_QP_ACCESS_ERR ||
         t == IBV_EVENT_COMM_EST || t == IBV_EVENT_SQ_DRAINED || t == IBV_EVENT_PATH_MIG ||
         t == IBV_EVENT_PATH_MIG_ERR || t == IBV_EVENT_QP_LAST_WQE_REACHED;
}

void emu_event_push(struct emu_ctx *ctx, enum ibv_event_type type, struct emu_qp *qp,
                    struct emu_cq *cq, int port) {
  if ((qp && qp->destroying) || (cq && cq->destroying)) return;
  struct emu_event *e = calloc(1, sizeof(*e));
  if (!e) return;
  e->ev.event_type = type;
  if (qp)
    e->ev.element.qp = &qp->ibqp;
  else if (cq)
    e->ev.element.cq = &cq->ibcq;
  else
    e->ev.element.port_num = port;
  if (ctx->ev_tail)
    ctx->ev_tail->next = e;
  else {
    ctx->ev_head = e;
    emu_level_set(ctx->async_wr);
  }
  ctx->ev_tail = e;
}

/* Drops the events about an object being destroyed that nobody got yet
 * (the kernel does the same). */
void emu_events_forget(struct emu_ctx *ctx, struct ibv_qp *qp, struct ibv_cq *cq) {
  bool had = ctx->ev_head != NULL;
  struct emu_event **pp = &ctx->ev_head;
  ctx->ev_tail = NULL;
  while (*pp) {
    struct emu_event *e = *pp;
    bool about = emu_event_is_qp(e->ev.event_type) ? e->ev.element.qp == qp
                 : e->ev.event_type == IBV_EVENT_CQ_ERR ? e->ev.element.cq == cq
                                                        : false;
    if (about) {
      *pp = e->next;
      free(e);
    } else {
      ctx->ev_tail = e;
      pp = &e->next;
    }
  }
  if (had && !ctx->ev_head) emu_level_clear(ctx->ibctx.async_fd);
}

/* rdma-core's destroy waits until every event it handed out about the
 * object was acknowledged, forever; we give up loudly after a while. */
void emu_wait_acked(struct emu_ctx *ctx, const uint32_t *delivered, const uint32_t *acked,
                       const char *what) {
  double until = emu_now() + ACK_WAIT_S;
  while (*acked != *delivered) {
    if (emu_now() > until) {
      fprintf(stderr, "verbs_emu: destroying a %s with %u events not acknowledged: libibverbs would "
                      "wait forever\n", what, *delivered - *acked);
      abort();
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&ctx->acked, &ctx->lock, &ts);
  }
}

/* Waits for the level fd to be readable; -1 (EAGAIN) where it is non-blocking. */
int emu_level_wait(int fd) {
  if (fcntl(fd, F_GETFL) & O_NONBLOCK) {
    errno = EAGAIN;
    return -1;
  }
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, -1) < 0 ? -1 : 0;
}

EMU_API int ibv_get_async_event(struct ibv_context *ibctx, struct ibv_async_event *event) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibctx;
  for (;;) {
    pthread_mutex_lock(&ctx->lock);
    struct emu_event *e = ctx->ev_head;
    if (e) {
      ctx->ev_head = e->next;
      if (!ctx->ev_head) {
        ctx->ev_tail = NULL;
        emu_level_clear(ibctx->async_fd);
      }
      *event = e->ev;
      if (emu_event_is_qp(e->ev.event_type))
        ((struct emu_qp *)e->ev.element.qp)->ev_delivered++;
      else if (e->ev.event_type == IBV_EVENT_CQ_ERR)
        ((struct emu_cq *)e->ev.element.cq)->async_delivered++;
      pthread_mutex_unlock(&ctx->lock);
      free(e);
      return 0;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (emu_level_wait(ibctx->async_fd)) return -1;
  }
}

EMU_API void ibv_ack_async_event(struct ibv_async_event *event) {
  struct emu_ctx *ctx;
  if (emu_event_is_qp(event->event_type)) {
    ctx = (struct emu_ctx *)event->element.qp->context;
    pthread_mutex_lock(&ctx->lock);
    ((struct emu_qp *)event->element.qp)->ev_acked++;
  } else if (event->event_type == IBV_EVENT_CQ_ERR) {
    ctx = (struct emu_ctx *)event->element.cq->context;
    pthread_mutex_lock(&ctx->lock);
    ((struct emu_cq *)event->element.cq)->async_acked++;
  } else {
    return;
  }
  pthread_cond_broadcast(&ctx->acked);
  pthread_mutex_unlock(&ctx->lock);
}

/* ---- faults a test raises --------------------------------------------------- */

static bool event_is_port(enum ibv_event_type t) {
  return t == IBV_EVENT_PORT_ERR || t == IBV_EVENT_PORT_ACTIVE || t == IBV_EVENT_LID_CHANGE ||
         t == IBV_EVENT_PKEY_CHANGE || t == IBV_EVENT_GID_CHANGE || t == IBV_EVENT_SM_CHANGE ||
         t == IBV_EVENT_CLIENT_REREGISTER;
}

/* One fault on the process's devices and contexts (g_lock held): a port
 * event reaches every context open on the device; a QP error moves the QP
 * (qpn, or all where qpn < 0; only in `only` where given) to ERR. */
static int raise_locked(struct emu_dev *dev, struct emu_ctx *only, enum ibv_event_type type, long arg) {
  if (event_is_port(type)) {
    if (!dev || arg < 1 || arg > dev->nports) return EINVAL;
    if (type == IBV_EVENT_PORT_ERR) atomic_store(&dev->port[arg - 1].state, IBV_PORT_DOWN);
    if (type == IBV_EVENT_PORT_ACTIVE) atomic_store(&dev->port[arg - 1].state, IBV_PORT_ACTIVE);
  } else if (type == IBV_EVENT_DEVICE_FATAL) {
    if (!dev) return EINVAL;
  } else if (type != IBV_EVENT_QP_FATAL && type != IBV_EVENT_QP_REQ_ERR &&
             type != IBV_EVENT_QP_ACCESS_ERR) {
    return EINVAL;
  }
  int found = 0;
  for (struct emu_ctx *c = g_ctxs; c; c = c->next) {
    bool qp_event = emu_event_is_qp(type);
    if (qp_event ? only && c != only : c->dev != dev) continue;
    pthread_mutex_lock(&c->lock);
    if (!qp_event) emu_event_push(c, type, NULL, NULL, (int)arg);
    for (struct emu_qp *qp = c->qps; qp; qp = qp->next) {
      if (qp->destroying || (qp_event && arg >= 0 && qp->ibqp.qp_num != (uint32_t)arg)) continue;
      if (qp_event || type == IBV_EVENT_DEVICE_FATAL) emu_qp_error(qp);
      if (qp_event) emu_event_push(c, type, qp, NULL, 0);
      found++;
    }
    emu_wake(c);
    pthread_mutex_unlock(&c->lock);
  }
  return emu_event_is_qp(type) && arg >= 0 && !found ? ENOENT : 0;
}

EMU_API int ccs_verbs_emu_raise(struct ibv_context *ibctx, enum ibv_event_type type, int port_or_qpn) {
  struct emu_ctx *ctx = (struct emu_ctx *)ibctx;
  pthread_mutex_lock(&g_lock);
  int rc = raise_locked(ctx->dev, ctx, type, port_or_qpn);
  pthread_mutex_unlock(&g_lock);
  if (rc) errno = rc;
  return rc ? -1 : 0;
}

/* Every region of this process's contexts loses its remote rights, as if
 * deregistered under the peers' feet: their next RDMA write or read here
 * is a remote access error (g_lock held). */
static void revoke_rkeys(void) {
  for (struct emu_ctx *c = g_ctxs; c; c = c->next) {
    pthread_mutex_lock(&c->lock);
    for (struct emu_mr *m = c->mrs; m; m = m->next)
      m->access &= ~(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    pthread_mutex_unlock(&c->lock);
  }
}

static struct emu_dev *dev_named(const char *name) {
  for (struct emu_dev *d = g_devs; d; d = d->next)
    if (!strcmp(d->ibdev.name, name)) return d;
  return NULL;
}

/* Reads a small file whole; its length, or -1. */
static ssize_t read_small(const char *path, char *buf, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n >= 0) buf[n] = 0;
  return n;
}

/* The raise file of this process, if one is there and complete (not
 * empty, its last line ended: a writer may be between its open and its
 * write): claimed by a rename, as every context's progress thread looks,
 * then executed and deleted. Called with no lock held. */
void emu_raise_file(const char *dir) {
  static _Atomic unsigned claims;
  char path[PATH_MAX + 32], mine[PATH_MAX + 64], text[4096];
  snprintf(path, sizeof(path), "%s/raise-%d", dir, (int)getpid());
  ssize_t n = read_small(path, text, sizeof(text));
  if (n <= 0 || text[n - 1] != '\n') return;
  snprintf(mine, sizeof(mine), "%s.taken%u", path, atomic_fetch_add(&claims, 1));
  if (rename(path, mine)) return;
  n = read_small(mine, text, sizeof(text));
  unlink(mine);
  if (n <= 0) return;
  pthread_mutex_lock(&g_lock);
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char verb[32], name[IBV_SYSFS_NAME_MAX];
    long arg;
    if (sscanf(line, "port_down %63s %ld", name, &arg) == 2)
      raise_locked(dev_named(name), NULL, IBV_EVENT_PORT_ERR, arg);
    else if (sscanf(line, "port_up %63s %ld", name, &arg) == 2)
      raise_locked(dev_named(name), NULL, IBV_EVENT_PORT_ACTIVE, arg);
    else if (sscanf(line, "qp_error %ld", &arg) == 1)
      raise_locked(NULL, NULL, IBV_EVENT_QP_FATAL, arg);
    else if (sscanf(line, "qp_error %31s", verb) == 1 && !strcmp(verb, "all"))
      raise_locked(NULL, NULL, IBV_EVENT_QP_FATAL, -1);
    else if (sscanf(line, "device_fatal %63s", name) == 1)
      raise_locked(dev_named(name), NULL, IBV_EVENT_DEVICE_FATAL, 0);
    else if (sscanf(line, "%31s", verb) == 1 && !strcmp(verb, "rkeys_revoked"))
      revoke_rkeys();
    else if (sscanf(line, " %31s", verb) == 1)
      fprintf(stderr, "verbs_emu: %s: line not understood: %s\n", path, line);
  }
  pthread_mutex_unlock(&g_lock);
}

/* ---- names ------------------------------------------------------------------ */

EMU_API const char *ibv_wc_status_str(enum ibv_wc_status status) {
  static const char *const names[] = {
      [IBV_WC_SUCCESS] = "success",
      [IBV_WC_LOC_LEN_ERR] = "local length error",
      [IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
      [IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
      [IBV_WC_LOC_PROT_ERR] = "local protection error",
      [IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
      [IBV_WC_MW_BIND_ERR] = "memory management operation error",
      [IBV_WC_BAD_RESP_ERR] = "bad response error",
      [IBV_WC_LOC_ACCESS_ERR] = "local access error",
      [IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
      [IBV_WC_REM_ACCESS_ERR] = "remote access error",
      [IBV_WC_REM_OP_ERR] = "remote operation error",
      [IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
      [IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
      [IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
      [IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
      [IBV_WC_REM_ABORT_ERR] = "aborted error",
      [IBV_WC_INV_EECN_ERR] = "invalid EE context number",
      [IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
      [IBV_WC_FATAL_ERR] = "fatal error",
      [IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
      [IBV_WC_GENERAL_ERR] = "general error",
      [IBV_WC_TM_ERR] = "TM error",
      [IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
  };
  if ((unsigned)status >= sizeof(names) / sizeof(names[0]) || !names[status]) return "unknown";
  return names[status];
}

EMU_API const char *ibv_event_type_str(enum ibv_event_type event) {
  static const char *const names[] = {
      [IBV_EVENT_CQ_ERR] = "CQ error",
      [IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
      [IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
      [IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
      [IBV_EVENT_COMM_EST] = "communication established",
      [IBV_EVENT_SQ_DRAINED] = "send queue drained",
      [IBV_EVENT_PATH_MIG] = "path migrated",
      [IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
      [IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
      [IBV_EVENT_PORT_ACTIVE] = "port active",
      [IBV_EVENT_PORT_ERR] = "port error",
      [IBV_EVENT_LID_CHANGE] = "LID change",
      [IBV_EVENT_PKEY_CHANGE] = "P_Key change",
      [IBV_EVENT_SM_CHANGE] = "SM change",
      [IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
      [IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
      [IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
      [IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
      [IBV_EVENT_GID_CHANGE] = "GID table change",
      [IBV_EVENT_WQ_FATAL] = "WQ fatal",
  };
  if ((unsigned)event >= sizeof(names) / sizeof(names[0]) || !names[event]) return "unknown";
  return names[event];
}
