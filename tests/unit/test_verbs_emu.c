/* The emulated libibverbs (tests/verbs_emu), loaded the way the verbs
 * transport loads rdma-core's: dlopen, a table of entry points, and
 * verbs.h's inline post and poll through context->ops (nothing here links
 * libibverbs). The far side of the data checks is a forked process, as the
 * other daemon would be; the error checks pair two contexts in this one.
 *
 * Covered: devices, ports and GIDs as configured; the QP state machine and
 * its attribute masks; RDMA writes with immediate of every size arriving
 * byte-exact; sends into posted receives and sends waiting out RNR; wrong
 * keys, ranges and receives too small failing both sides and flushing the
 * rest; the completion channel; async events raised in process and by
 * file; a CQ overrun; a wrong GID and a dead peer timing sends out. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <setjmp.h>

#include <cmocka.h>

#include "harness.h"
#include "verbs_lib.h"

/* libibverbs' entry points as the transport loads them (verbs_lib.h),
 * and three only this test calls */
static struct verbs_lib V;
static struct {
  __be64 (*get_device_guid)(struct ibv_device *);
  int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
  int (*raise)(struct ibv_context *, enum ibv_event_type, int);
} X;

static char emu_dir[64]; /* the test's directory; the sockets live in emu_dir/wire */

/* Checks that work in the forked peer too: there a failure exits (cmocka
 * must not unwind into the parent's copy of the test runner). */
static int in_peer;
#define CHECK(cond) \
  do { \
    if (!(cond)) check_failed(__FILE__, __LINE__, #cond); \
  } while (0)
static void check_failed(const char *file, int line, const char *what) {
  fprintf(stderr, "%s:%d: %s failed%s (errno %d)\n", file, line, what, in_peer ? " in the peer" : "",
          errno);
  if (in_peer) _exit(2);
  _fail(file, line);
}

/* ---- one end of a connection ------------------------------------------------- */

struct side {
  struct ibv_device **list;
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_comp_channel *ch;
  struct ibv_cq *cq;
  struct ibv_qp *qp;
  struct ibv_mr *mr;
  uint8_t *buf;
  size_t len;
  uint32_t psn;
};

/* What the two ends tell each other before RTR. */
struct info {
  uint32_t qpn, psn, rkey;
  uint64_t addr;
  union ibv_gid gid;
  uint64_t seed;
};

#define ALL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static void side_open(struct side *s, size_t len, int cqe) {
  memset(s, 0, sizeof(*s));
  int n = 0;
  CHECK((s->list = V.get_device_list(&n)) && n >= 1);
  CHECK((s->ctx = V.open_device(s->list[0])));
  CHECK((s->pd = V.alloc_pd(s->ctx)));
  CHECK((s->ch = V.create_comp_channel(s->ctx)));
  CHECK((s->cq = V.create_cq(s->ctx, cqe, s, s->ch, 0)));
  s->len = len;
  CHECK((s->buf = calloc(1, len)));
  CHECK((s->mr = V.reg_mr(s->pd, s->buf, len, ALL_ACCESS)));
  struct ibv_qp_init_attr ia = {.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
                                .cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 4,
                                        .max_recv_sge = 4, .max_inline_data = 64}};
  CHECK((s->qp = V.create_qp(s->pd, &ia)));
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ALL_ACCESS};
  CHECK(V.modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
  s->psn = (uint32_t)test_mix(test_seed(), s->qp->qp_num) & 0xffffff;
}

static struct info side_info(const struct side *s) {
  struct info i = {.qpn = s->qp->qp_num, .psn = s->psn, .rkey = s->mr->rkey,
                   .addr = (uintptr_t)s->buf};
  CHECK(V.query_gid(s->ctx, 1, 1, &i.gid) == 0);
  return i;
}

static void side_rtr(struct side *s, const struct info *peer, const union ibv_gid *dgid) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
                          .dest_qp_num = peer->qpn, .rq_psn = peer->psn,
                          .max_dest_rd_atomic = 1, .min_rnr_timer = 18 /* 5 ms */};
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = dgid ? *dgid : peer->gid;
  a.ah_attr.grh.sgid_index = 1;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  CHECK(V.modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                   IBV_QP_MIN_RNR_TIMER) == 0);
}

static void side_rts(struct side *s, int timeout, int rnr_retry) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS, .timeout = (uint8_t)timeout, .retry_cnt = 7,
                          .rnr_retry = (uint8_t)rnr_retry, .sq_psn = s->psn, .max_rd_atomic = 1};
  CHECK(V.modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static void side_connect(struct side *s, const struct info *peer) {
  side_rtr(s, peer, NULL);
  side_rts(s, 14, 7);
}

static void side_close(struct side *s) {
  if (s->qp) CHECK(V.destroy_qp(s->qp) == 0);
  if (s->mr) CHECK(V.dereg_mr(s->mr) == 0);
  if (s->cq) CHECK(V.destroy_cq(s->cq) == 0);
  if (s->ch) CHECK(V.destroy_comp_channel(s->ch) == 0);
  if (s->pd) CHECK(V.dealloc_pd(s->pd) == 0);
  if (s->ctx) CHECK(V.close_device(s->ctx) == 0);
  if (s->list) V.free_device_list(s->list);
  free(s->buf);
  memset(s, 0, sizeof(*s));
}

/* The next completion, or 0 when none came within timeout_s. */
static int next_wc(struct side *s, struct ibv_wc *wc, double timeout_s) {
  for (double until = test_now() + timeout_s; test_now() < until;) {
    int n = ibv_poll_cq(s->cq, 1, wc);
    CHECK(n >= 0);
    if (n == 1) return 1;
    usleep(200);
  }
  return 0;
}

static void expect_wc(struct side *s, uint64_t wr_id, enum ibv_wc_status status) {
  struct ibv_wc wc;
  CHECK(next_wc(s, &wc, 5) == 1);
  if (wc.wr_id != wr_id || wc.status != status)
    fprintf(stderr, "completion %lu %s, wanted %lu %s\n", (unsigned long)wc.wr_id,
            V.wc_status_str(wc.status), (unsigned long)wr_id, V.wc_status_str(status));
  CHECK(wc.wr_id == wr_id && wc.status == status);
  CHECK(wc.qp_num == s->qp->qp_num && wc.vendor_err == 0);
}

static enum ibv_qp_state qp_state(struct side *s) {
  struct ibv_qp_attr a;
  struct ibv_qp_init_attr ia;
  CHECK(X.query_qp(s->qp, &a, IBV_QP_STATE, &ia) == 0);
  return a.qp_state;
}

static int post_recv(struct side *s, uint64_t wr_id, size_t off, uint32_t len) {
  struct ibv_sge sge = {.addr = (uintptr_t)s->buf + off, .length = len, .lkey = s->mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = len ? 1 : 0}, *bad;
  return ibv_post_recv(s->qp, &wr, &bad);
}

static int post_send(struct side *s, uint64_t wr_id, enum ibv_wr_opcode op, size_t off, uint32_t len,
                     uint64_t raddr, uint32_t rkey, uint32_t imm, unsigned flags) {
  struct ibv_sge sge = {.addr = (uintptr_t)s->buf + off, .length = len, .lkey = s->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = len ? 1 : 0, .opcode = op,
                           .send_flags = flags, .imm_data = imm},
                     *bad = NULL;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  int rc = ibv_post_send(s->qp, &wr, &bad);
  if (rc) CHECK(bad == &wr);
  return rc;
}

static void fill(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t x = test_mix(seed, 1) | 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[i] = (uint8_t)x;
  }
}

/* Two ends in this process, on two contexts, connected. */
static void pair_open(struct side *a, struct side *b, size_t len) {
  side_open(a, len, 64);
  side_open(b, len, 64);
  struct info ia = side_info(a), ib = side_info(b);
  side_connect(a, &ib);
  side_connect(b, &ia);
}

/* Both QPs back to RESET and connected again, with new PSNs. */
static void pair_reconnect(struct side *a, struct side *b) {
  struct ibv_qp_attr r = {.qp_state = IBV_QPS_RESET};
  struct ibv_qp_attr i = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ALL_ACCESS};
  struct ibv_wc wc;
  for (struct side *s = a; s; s = s == a ? b : NULL) {
    while (ibv_poll_cq(s->cq, 1, &wc) > 0) {
    }
    CHECK(V.modify_qp(s->qp, &r, IBV_QP_STATE) == 0);
    CHECK(V.modify_qp(s->qp, &i, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
    s->psn = (s->psn + 1000) & 0xffffff;
  }
  struct info ia = side_info(a), ib = side_info(b);
  side_connect(a, &ib);
  side_connect(b, &ia);
}

/* ---- the forked peer --------------------------------------------------------- */

static void msg_send(int sock, const void *m, size_t len) { CHECK(send(sock, m, len, 0) == (ssize_t)len); }

static void msg_recv(int sock, void *m, size_t len) {
  struct pollfd p = {.fd = sock, .events = POLLIN};
  CHECK(poll(&p, 1, 20000) == 1);
  CHECK(recv(sock, m, len, 0) == (ssize_t)len);
}

/* This side's details to the other process and its to this one, then
 * connected: the forked peer speaks first, the test answers; seed is what
 * this side's data is made from (0: none). The peer's details. */
static struct info side_meet(struct side *s, int sock, int speak_first, uint64_t seed) {
  struct info mine = side_info(s), peer;
  mine.seed = seed;
  if (speak_first) {
    msg_send(sock, &mine, sizeof(mine));
    msg_recv(sock, &peer, sizeof(peer));
  } else {
    msg_recv(sock, &peer, sizeof(peer));
    msg_send(sock, &mine, sizeof(mine));
  }
  side_connect(s, &peer);
  return peer;
}

/* Forks the peer running fn on its end of a socket pair. */
static pid_t peer_start(void (*fn)(int sock), int *sock) {
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    in_peer = 1;
    alarm(30); /* a peer that hangs dies */
    close(sv[0]);
    fn(sv[1]);
    _exit(0);
  }
  close(sv[1]);
  *sock = sv[0];
  return pid;
}

/* The peer's exit status (128 + signal if killed), after at most 20 s. */
static int peer_wait(pid_t pid, int sock) {
  int status = 0;
  for (double until = test_now() + 20; waitpid(pid, &status, WNOHANG) == 0;) {
    if (test_now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    usleep(1000);
  }
  close(sock);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* ---- devices, objects, states -------------------------------------------------- */

static void test_devices(void **state) {
  setenv("CCS_VERBS_EMU_DEVICES", "emu0:1:active,emu1:2:down", 1);
  setenv("CCS_VERBS_EMU_ADDR", "10.1.2.3", 1);
  int n = 0;
  struct ibv_device **list = V.get_device_list(&n);
  unsetenv("CCS_VERBS_EMU_DEVICES");
  unsetenv("CCS_VERBS_EMU_ADDR");
  assert_non_null(list);
  assert_int_equal(n, 2);
  assert_null(list[2]);
  assert_string_equal(V.get_device_name(list[0]), "emu0");
  assert_string_equal(V.get_device_name(list[1]), "emu1");
  assert_true(X.get_device_guid(list[0]) != X.get_device_guid(list[1]));

  struct ibv_context *c0 = V.open_device(list[0]), *c1 = V.open_device(list[1]);
  V.free_device_list(list); /* opened devices outlive the list */
  assert_non_null(c0);
  assert_non_null(c1);
  assert_null(verbs_get_ctx(c0)); /* not extended: callers use the exported calls */
  struct ibv_device_attr da;
  assert_int_equal(V.query_device(c1, &da), 0);
  assert_int_equal(da.phys_port_cnt, 2);
  assert_int_equal(da.max_qp_wr, 4096);
  assert_int_equal(da.max_sge, 16);
  assert_int_equal(da.max_cqe, 65536);
  assert_int_equal(da.vendor_id, 0x02c9);
  assert_string_equal(da.fw_ver, "emu");
  assert_true(da.max_mr_size == 1ull << 40);

  struct ibv_port_attr pa; /* as the transport asks: the whole struct, zeroed */
  memset(&pa, 0, sizeof(pa));
  assert_int_equal(V.query_port(c1, 2, (struct _compat_ibv_port_attr *)&pa), 0);
  assert_int_equal(pa.state, IBV_PORT_DOWN);
  assert_int_equal(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
  assert_int_equal(pa.max_mtu, IBV_MTU_4096);
  assert_int_equal(pa.active_mtu, IBV_MTU_1024);
  assert_int_equal(pa.gid_tbl_len, 2);
  assert_int_equal(pa.active_width, 2);
  assert_int_equal(pa.active_speed, 32);
  assert_int_equal(pa.max_msg_sz, 1u << 30);
  assert_int_equal(pa.lid, 0);
  assert_int_equal(pa.port_cap_flags2, 0);
  assert_int_not_equal(V.query_port(c1, 3, (struct _compat_ibv_port_attr *)&pa), 0);
  assert_int_equal(V.query_port(c0, 1, (struct _compat_ibv_port_attr *)&pa), 0);
  assert_int_equal(pa.state, IBV_PORT_ACTIVE);
  assert_int_equal(pa.phys_state, 5);

  union ibv_gid gid, v4 = {.raw = {[10] = 0xff, [11] = 0xff, [12] = 10, [13] = 1, [14] = 2, [15] = 3}};
  assert_int_equal(V.query_gid(c0, 1, 1, &gid), 0);
  assert_memory_equal(gid.raw, v4.raw, 16);
  assert_int_equal(V.query_gid(c1, 2, 1, &gid), 0);
  assert_memory_equal(gid.raw, v4.raw, 16);
  assert_int_equal(V.query_gid(c0, 1, 0, &gid), 0);
  assert_true(gid.raw[0] == 0xfe && gid.raw[1] == 0x80);
  assert_int_equal(V.query_gid(c0, 1, 2, &gid), -1);
  assert_int_equal(V.close_device(c1), 0);
  assert_int_equal(V.close_device(c0), 0);

  assert_string_equal(V.wc_status_str(IBV_WC_REM_ACCESS_ERR), "remote access error");
  assert_string_equal(V.wc_status_str(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error");
  assert_string_equal(V.event_type_str(IBV_EVENT_PORT_ERR), "port error");
}

/* Hardware's refusals, and the order verbs objects may go away in. */
static void test_objects(void **state) {
  struct side s;
  side_open(&s, 4096, 16);
  errno = 0;
  assert_null(V.reg_mr(s.pd, s.buf, 4096, IBV_ACCESS_REMOTE_WRITE));
  assert_int_equal(errno, EINVAL);
  struct ibv_mr *ro = V.reg_mr(s.pd, s.buf, 4096, IBV_ACCESS_REMOTE_READ);
  assert_non_null(ro);
  assert_int_not_equal(ro->lkey, ro->rkey);
  assert_int_not_equal(ro->lkey, s.mr->lkey);
  assert_int_not_equal(ro->rkey, s.mr->rkey);
  struct ibv_qp_init_attr ud = {.send_cq = s.cq, .recv_cq = s.cq, .qp_type = IBV_QPT_UD,
                                .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
  errno = 0;
  assert_null(V.create_qp(s.pd, &ud));
  assert_int_equal(errno, EOPNOTSUPP);
  assert_int_equal(V.dealloc_pd(s.pd), EBUSY);       /* MRs and a QP on it */
  assert_int_equal(V.destroy_cq(s.cq), EBUSY);       /* a QP on it */
  assert_int_equal(V.destroy_comp_channel(s.ch), EBUSY); /* a CQ on it */
  assert_int_equal(V.dereg_mr(ro), 0);
  assert_int_equal(V.destroy_qp(s.qp), 0);
  s.qp = NULL;
  assert_int_equal(V.dealloc_pd(s.pd), EBUSY); /* still the MR */
  side_close(&s);
}

/* The kernel's transitions and attribute masks; posting by state. */
static void test_transitions(void **state) {
  struct side s;
  side_open(&s, 4096, 16); /* side_open went to INIT the right way */
  struct ibv_qp_attr reset = {.qp_state = IBV_QPS_RESET};
  assert_int_equal(V.modify_qp(s.qp, &reset, IBV_QP_STATE), 0);
  struct ibv_qp_attr init = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ALL_ACCESS};
  assert_int_equal(V.modify_qp(s.qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS), EINVAL);
  assert_int_equal(qp_state(&s), IBV_QPS_RESET);
  assert_int_not_equal(post_recv(&s, 1, 0, 64), 0); /* not in RESET */
  assert_int_equal(V.modify_qp(s.qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  assert_int_equal(post_recv(&s, 1, 0, 64), 0); /* from INIT on */

  struct ibv_qp_attr rts = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7};
  const int rts_mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  assert_int_equal(V.modify_qp(s.qp, &rts, rts_mask), EINVAL); /* INIT -> RTS skips RTR */

  struct ibv_qp_attr rtr = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = s.qp->qp_num,
                            .rq_psn = s.psn, .max_dest_rd_atomic = 1, .min_rnr_timer = 12};
  rtr.ah_attr.grh.sgid_index = 1;
  rtr.ah_attr.port_num = 1;
  assert_int_equal(V.query_gid(s.ctx, 1, 1, &rtr.ah_attr.grh.dgid), 0);
  const int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  assert_int_equal(V.modify_qp(s.qp, &rtr, rtr_mask), EINVAL); /* RoCE: no GRH */
  rtr.ah_attr.is_global = 1;
  assert_int_equal(V.modify_qp(s.qp, &rtr, rtr_mask & ~IBV_QP_MIN_RNR_TIMER), EINVAL);
  assert_int_equal(V.modify_qp(s.qp, &rtr, rtr_mask | IBV_QP_SQ_PSN), EINVAL); /* not RTR's */
  assert_int_equal(qp_state(&s), IBV_QPS_INIT);
  assert_int_equal(V.modify_qp(s.qp, &rtr, rtr_mask), 0);
  assert_int_equal(post_send(&s, 2, IBV_WR_SEND, 0, 8, 0, 0, 0, IBV_SEND_SIGNALED), EINVAL);
  rts.sq_psn = s.psn;
  assert_int_equal(V.modify_qp(s.qp, &rts, rts_mask & ~IBV_QP_SQ_PSN), EINVAL);
  assert_int_equal(V.modify_qp(s.qp, &rts, rts_mask), 0);
  struct ibv_qp_attr got;
  struct ibv_qp_init_attr gi;
  assert_int_equal(X.query_qp(s.qp, &got, IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_SQ_PSN, &gi), 0);
  assert_int_equal(got.qp_state, IBV_QPS_RTS);
  assert_int_equal(got.dest_qp_num, s.qp->qp_num);
  assert_int_equal(got.sq_psn, s.psn);
  assert_int_equal(gi.cap.max_send_wr, 64);

  /* connected to itself: a send lands in its own receive */
  memcpy(s.buf + 1024, "loopback", 8);
  assert_int_equal(post_send(&s, 2, IBV_WR_SEND, 1024, 8, 0, 0, 0, IBV_SEND_SIGNALED), 0);
  expect_wc(&s, 1, IBV_WC_SUCCESS); /* the receive executes before the send is acknowledged */
  expect_wc(&s, 2, IBV_WC_SUCCESS);
  assert_memory_equal(s.buf, "loopback", 8);

  /* ERR: what is posted, before and after, completes flushed */
  assert_int_equal(post_recv(&s, 3, 0, 64), 0);
  struct ibv_qp_attr err = {.qp_state = IBV_QPS_ERR};
  assert_int_equal(V.modify_qp(s.qp, &err, IBV_QP_STATE), 0);
  expect_wc(&s, 3, IBV_WC_WR_FLUSH_ERR);
  assert_int_equal(post_send(&s, 4, IBV_WR_SEND, 0, 8, 0, 0, 0, 0), 0); /* unsignaled, still flushed */
  expect_wc(&s, 4, IBV_WC_WR_FLUSH_ERR);
  assert_int_equal(V.modify_qp(s.qp, &rts, rts_mask), EINVAL);
  assert_int_equal(V.modify_qp(s.qp, &reset, IBV_QP_STATE), 0);
  assert_int_equal(V.modify_qp(s.qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  side_close(&s);
}

/* ---- data across processes ------------------------------------------------------ */

/* WRITE_WITH_IMM of these sizes, each to its own place in the peer's region. */
static const uint32_t write_sizes[] = {0, 1, 4097, (8u << 20) + 3};
static const size_t write_places[] = {0, 64, 8192, 16384};
#define WRITE_REGION (16384 + (8u << 20) + 3)

static void peer_writes(int sock) {
  struct side s;
  side_open(&s, WRITE_REGION, 64);
  for (int i = 0; i < 4; i++) CHECK(post_recv(&s, 100 + (uint64_t)i, 0, 0) == 0); /* no SGE: imm only */
  struct info peer = side_meet(&s, sock, 1, 0);
  uint8_t *want = malloc(WRITE_REGION);
  CHECK(want);
  for (int i = 0; i < 4; i++) {
    struct ibv_wc wc;
    CHECK(next_wc(&s, &wc, 10) == 1);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
    CHECK(wc.wr_id == 100 + (uint64_t)i && wc.byte_len == write_sizes[i]);
    CHECK((wc.wc_flags & IBV_WC_WITH_IMM) && wc.imm_data == htonl(0xc0de0000u + (uint32_t)i));
    CHECK(wc.qp_num == s.qp->qp_num && wc.src_qp == peer.qpn);
    fill(want, write_sizes[i], peer.seed + (uint64_t)i);
    CHECK(memcmp(s.buf + write_places[i], want, write_sizes[i]) == 0);
  }
  free(want);
  char ok = 'k';
  msg_send(sock, &ok, 1);
  msg_recv(sock, &ok, 1); /* the peer is done with us */
  side_close(&s);
}

static void test_write_imm_sizes(void **state) {
  int sock;
  pid_t pid = peer_start(peer_writes, &sock);
  struct side s;
  side_open(&s, (8u << 20) + 3, 64);
  uint64_t seed = test_seed();
  struct info peer = side_meet(&s, sock, 0, seed);
  for (int i = 0; i < 4; i++) {
    fill(s.buf, write_sizes[i], seed + (uint64_t)i);
    assert_int_equal(post_send(&s, (uint64_t)i, IBV_WR_RDMA_WRITE_WITH_IMM, 0, write_sizes[i],
                               peer.addr + write_places[i], peer.rkey, htonl(0xc0de0000u + (uint32_t)i),
                               IBV_SEND_SIGNALED), 0);
    struct ibv_wc wc; /* one at a time: the buffer is reused */
    assert_int_equal(next_wc(&s, &wc, 10), 1);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    assert_int_equal(wc.opcode, IBV_WC_RDMA_WRITE);
    assert_int_equal(wc.wr_id, i);
  }
  char ok = 0;
  msg_recv(sock, &ok, 1);
  assert_int_equal(ok, 'k');
  msg_send(sock, &ok, 1);
  side_close(&s);
  assert_int_equal(peer_wait(pid, sock), 0);
}

/* A send into a posted receive; then one sent before its receive is
 * posted, which waits out RNR; then an inline one, its buffer reused at once. */
static void peer_sends(int sock) {
  struct side s;
  side_open(&s, 1 << 16, 64);
  CHECK(post_recv(&s, 11, 0, 4096) == 0);
  struct info peer = side_meet(&s, sock, 1, 0);
  uint8_t want[3000];
  struct ibv_wc wc;
  CHECK(next_wc(&s, &wc, 10) == 1);
  CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 11);
  CHECK(wc.byte_len == 3000 && (wc.wc_flags & IBV_WC_WITH_IMM) && wc.imm_data == htonl(0xabcd));
  fill(want, 3000, peer.seed);
  CHECK(memcmp(s.buf, want, 3000) == 0);
  usleep(300 * 1000); /* the second send is refused (RNR) meanwhile */
  CHECK(ibv_poll_cq(s.cq, 1, &wc) == 0);
  CHECK(post_recv(&s, 12, 8192, 4096) == 0);
  CHECK(post_recv(&s, 13, 16384, 4096) == 0);
  CHECK(next_wc(&s, &wc, 10) == 1);
  CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 12 && wc.byte_len == 200 && !(wc.wc_flags & IBV_WC_WITH_IMM));
  fill(want, 200, peer.seed + 1);
  CHECK(memcmp(s.buf + 8192, want, 200) == 0);
  CHECK(next_wc(&s, &wc, 10) == 1);
  CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 13 && wc.byte_len == 48);
  fill(want, 48, peer.seed + 2);
  CHECK(memcmp(s.buf + 16384, want, 48) == 0);
  char ok = 'k';
  msg_send(sock, &ok, 1);
  msg_recv(sock, &ok, 1);
  side_close(&s);
}

static void test_send_and_rnr(void **state) {
  int sock;
  pid_t pid = peer_start(peer_sends, &sock);
  struct side s;
  side_open(&s, 1 << 16, 64);
  uint64_t seed = test_seed();
  side_meet(&s, sock, 0, seed); /* rnr_retry 7: for ever */
  fill(s.buf, 3000, seed);
  assert_int_equal(post_send(&s, 1, IBV_WR_SEND_WITH_IMM, 0, 3000, 0, 0, htonl(0xabcd), IBV_SEND_SIGNALED), 0);
  struct ibv_wc wc;
  assert_int_equal(next_wc(&s, &wc, 10), 1);
  assert_int_equal(wc.status, IBV_WC_SUCCESS);
  assert_int_equal(wc.opcode, IBV_WC_SEND);

  fill(s.buf + 4096, 200, seed + 1);
  double posted = test_now();
  assert_int_equal(post_send(&s, 2, IBV_WR_SEND, 4096, 200, 0, 0, 0, IBV_SEND_SIGNALED), 0);
  fill(s.buf + 8192, 48, seed + 2);
  assert_int_equal(post_send(&s, 3, IBV_WR_SEND, 8192, 48, 0, 0, 0, IBV_SEND_SIGNALED | IBV_SEND_INLINE), 0);
  memset(s.buf + 8192, 0, 48); /* inline: copied when posted */
  assert_int_equal(next_wc(&s, &wc, 10), 1);
  assert_int_equal(wc.wr_id, 2);
  assert_int_equal(wc.status, IBV_WC_SUCCESS);
  assert_true(test_now() - posted > 0.25); /* completed only once received */
  assert_int_equal(next_wc(&s, &wc, 10), 1);
  assert_int_equal(wc.wr_id, 3);
  assert_int_equal(wc.status, IBV_WC_SUCCESS);
  char ok = 0;
  msg_recv(sock, &ok, 1);
  assert_int_equal(ok, 'k');
  msg_send(sock, &ok, 1);
  side_close(&s);
  assert_int_equal(peer_wait(pid, sock), 0);
}

/* The peer dies (no cleanup at all) under a send waiting on RNR. */
static void peer_dies(int sock) {
  struct side s;
  side_open(&s, 4096, 16);
  side_meet(&s, sock, 1, 0);
  char go;
  msg_recv(sock, &go, 1);
  usleep(50 * 1000);
  _exit(0);
}

static void test_peer_exit(void **state) {
  int sock;
  pid_t pid = peer_start(peer_dies, &sock);
  struct side s;
  side_open(&s, 4096, 16);
  side_meet(&s, sock, 0, 0);
  assert_int_equal(post_send(&s, 1, IBV_WR_SEND, 0, 100, 0, 0, 0, IBV_SEND_SIGNALED), 0);
  assert_int_equal(post_send(&s, 2, IBV_WR_SEND, 0, 100, 0, 0, 0, 0), 0);
  char go = 'g';
  msg_send(sock, &go, 1);
  assert_int_equal(peer_wait(pid, sock), 0);
  expect_wc(&s, 1, IBV_WC_RETRY_EXC_ERR);
  expect_wc(&s, 2, IBV_WC_WR_FLUSH_ERR);
  assert_int_equal(qp_state(&s), IBV_QPS_ERR);
  side_close(&s);
}

/* ---- errors between two contexts of this process ------------------------------- */

static void test_remote_access_errors(void **state) {
  struct side a, b;
  pair_open(&a, &b, 4096);
  assert_int_equal(post_recv(&b, 21, 0, 64), 0);
  assert_int_equal(post_recv(&b, 22, 64, 64), 0);
  /* the peer's lkey where its rkey belongs */
  assert_int_equal(post_send(&a, 1, IBV_WR_RDMA_WRITE, 0, 16, (uintptr_t)b.buf, b.mr->lkey, 0, IBV_SEND_SIGNALED), 0);
  assert_int_equal(post_send(&a, 2, IBV_WR_SEND, 0, 16, 0, 0, 0, IBV_SEND_SIGNALED), 0);
  expect_wc(&a, 1, IBV_WC_REM_ACCESS_ERR);
  expect_wc(&a, 2, IBV_WC_WR_FLUSH_ERR);
  expect_wc(&b, 21, IBV_WC_WR_FLUSH_ERR);
  expect_wc(&b, 22, IBV_WC_WR_FLUSH_ERR);
  assert_int_equal(qp_state(&a), IBV_QPS_ERR);
  assert_int_equal(qp_state(&b), IBV_QPS_ERR);

  /* one byte past the end of the region; unsignaled work after it still
   * completes, flushed */
  pair_reconnect(&a, &b);
  assert_int_equal(post_send(&a, 3, IBV_WR_RDMA_WRITE, 0, 16, (uintptr_t)b.buf + 4081, b.mr->rkey, 0, IBV_SEND_SIGNALED), 0);
  assert_int_equal(post_send(&a, 4, IBV_WR_RDMA_WRITE, 0, 16, (uintptr_t)b.buf, b.mr->rkey, 0, 0), 0);
  expect_wc(&a, 3, IBV_WC_REM_ACCESS_ERR);
  expect_wc(&a, 4, IBV_WC_WR_FLUSH_ERR);
  assert_int_equal(qp_state(&b), IBV_QPS_ERR);

  /* in bounds works on the same QPs after RESET, and an RDMA read too */
  pair_reconnect(&a, &b);
  memcpy(a.buf, "0123456789abcdef", 16);
  assert_int_equal(post_send(&a, 5, IBV_WR_RDMA_WRITE, 0, 16, (uintptr_t)b.buf + 4080, b.mr->rkey, 0, IBV_SEND_SIGNALED), 0);
  expect_wc(&a, 5, IBV_WC_SUCCESS);
  assert_memory_equal(b.buf + 4080, "0123456789abcdef", 16);
  assert_int_equal(post_send(&a, 6, IBV_WR_RDMA_READ, 100, 16, (uintptr_t)b.buf + 4080, b.mr->rkey, 0, IBV_SEND_SIGNALED), 0);
  expect_wc(&a, 6, IBV_WC_SUCCESS);
  assert_memory_equal(a.buf + 100, "0123456789abcdef", 16);
  side_close(&a);
  side_close(&b);
}

static void test_receive_too_small(void **state) {
  struct side a, b;
  pair_open(&a, &b, 4096);
  assert_int_equal(post_recv(&b, 31, 0, 16), 0);
  assert_int_equal(post_recv(&b, 32, 64, 256), 0);
  assert_int_equal(post_send(&a, 1, IBV_WR_SEND, 0, 100, 0, 0, 0, IBV_SEND_SIGNALED), 0);
  expect_wc(&b, 31, IBV_WC_LOC_LEN_ERR);
  expect_wc(&b, 32, IBV_WC_WR_FLUSH_ERR);
  expect_wc(&a, 1, IBV_WC_REM_INV_REQ_ERR);
  assert_int_equal(qp_state(&a), IBV_QPS_ERR);
  assert_int_equal(qp_state(&b), IBV_QPS_ERR);
  side_close(&a);
  side_close(&b);
}

/* The address vector names a GID the peer's port does not have: sends
 * time out once the retry budget is spent. */
static void test_wrong_gid(void **state) {
  struct side a, b;
  side_open(&a, 4096, 16);
  side_open(&b, 4096, 16);
  struct info ia = side_info(&a), ib = side_info(&b);
  union ibv_gid link_local;
  assert_int_equal(V.query_gid(b.ctx, 1, 0, &link_local), 0); /* b answers with its index 1 */
  side_rtr(&a, &ib, &link_local);
  side_rts(&a, 12, 7); /* 4.096 us * 2^12 * 8: about 0.13 s */
  side_connect(&b, &ia);
  assert_int_equal(post_recv(&b, 41, 0, 64), 0);
  double t0 = test_now();
  assert_int_equal(post_send(&a, 1, IBV_WR_SEND, 0, 8, 0, 0, 0, IBV_SEND_SIGNALED), 0);
  expect_wc(&a, 1, IBV_WC_RETRY_EXC_ERR);
  assert_true(test_now() - t0 > 0.1);
  struct ibv_wc wc;
  assert_int_equal(next_wc(&b, &wc, 0.05), 0); /* nothing arrived */
  side_close(&a);
  side_close(&b);
}

/* Local protection: a region deregistered while a send that names it
 * waits (allowed, as on hardware: the send fails when it gets there), and
 * an RDMA read into a region without local write access. */
static void test_local_protection(void **state) {
  struct side a, b;
  side_open(&a, 4096, 16);
  side_open(&b, 4096, 16);
  struct info ia = side_info(&a), ib = side_info(&b);
  side_connect(&a, &ib); /* b stays in INIT for now: nothing can leave a */
  struct ibv_mr *gone = V.reg_mr(a.pd, a.buf, 4096, IBV_ACCESS_LOCAL_WRITE);
  assert_non_null(gone);
  struct ibv_sge sge = {.addr = (uintptr_t)a.buf, .length = 16, .lkey = gone->lkey};
  struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
                           .send_flags = IBV_SEND_SIGNALED},
                     *bad;
  wr.wr.rdma.remote_addr = ib.addr;
  wr.wr.rdma.rkey = ib.rkey;
  assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
  assert_int_equal(V.dereg_mr(gone), 0);
  side_connect(&b, &ia);
  expect_wc(&a, 1, IBV_WC_LOC_PROT_ERR);
  assert_int_equal(qp_state(&a), IBV_QPS_ERR);

  pair_reconnect(&a, &b);
  struct ibv_mr *ro = V.reg_mr(a.pd, a.buf, 4096, IBV_ACCESS_REMOTE_READ);
  assert_non_null(ro);
  sge.lkey = ro->lkey;
  wr.wr_id = 2;
  wr.opcode = IBV_WR_RDMA_READ;
  assert_int_equal(ibv_post_send(a.qp, &wr, &bad), 0);
  expect_wc(&a, 2, IBV_WC_LOC_PROT_ERR);
  assert_int_equal(V.dereg_mr(ro), 0);
  side_close(&a);
  side_close(&b);
}

/* A port that goes down carries nothing: sends time out (the retry
 * budget: 4.096 us * 2^14 * 8, about 0.54 s) and the async event says why. */
static void test_port_down_traffic(void **state) {
  struct side a, b;
  pair_open(&a, &b, 4096);
  assert_int_equal(post_recv(&b, 71, 0, 64), 0);
  assert_int_equal(post_send(&a, 1, IBV_WR_SEND, 0, 8, 0, 0, 0, IBV_SEND_SIGNALED), 0);
  expect_wc(&a, 1, IBV_WC_SUCCESS); /* up: it goes */
  assert_int_equal(X.raise(a.ctx, IBV_EVENT_PORT_ERR, 1), 0); /* emu0 port 1: both ends here */
  assert_int_equal(post_recv(&b, 72, 0, 64), 0);
  double t0 = test_now();
  assert_int_equal(post_send(&a, 2, IBV_WR_SEND, 0, 8, 0, 0, 0, IBV_SEND_SIGNALED), 0);
  expect_wc(&a, 2, IBV_WC_RETRY_EXC_ERR);
  assert_true(test_now() - t0 > 0.5);
  expect_wc(&b, 71, IBV_WC_SUCCESS);
  struct ibv_wc wc;
  assert_int_equal(ibv_poll_cq(b.cq, 1, &wc), 0); /* 72 never filled */
  struct ibv_async_event ev;
  for (struct side *s = &a; s; s = s == &a ? &b : NULL) { /* every context on the device hears it */
    assert_int_equal(V.get_async_event(s->ctx, &ev), 0);
    assert_int_equal(ev.event_type, IBV_EVENT_PORT_ERR);
    V.ack_async_event(&ev);
  }
  assert_int_equal(X.raise(a.ctx, IBV_EVENT_PORT_ACTIVE, 1), 0);
  side_close(&a);
  side_close(&b);
}

/* ---- notification and events -------------------------------------------------- */

static bool readable(int fd, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, ms) == 1;
}

static void test_comp_channel(void **state) {
  struct side a, b;
  pair_open(&a, &b, 4096);
  fcntl(a.ch->fd, F_SETFL, fcntl(a.ch->fd, F_GETFL) | O_NONBLOCK);
  struct ibv_cq *cq;
  void *cq_context;
  assert_int_equal(ibv_req_notify_cq(a.cq, 0), 0);
  assert_false(readable(a.ch->fd, 0));
  assert_int_equal(V.get_cq_event(a.ch, &cq, &cq_context), -1);
  assert_int_equal(errno, EAGAIN);
  assert_int_equal(post_recv(&b, 51, 0, 64), 0);
  assert_int_equal(post_recv(&b, 52, 0, 64), 0);
  assert_int_equal(post_send(&a, 1, IBV_WR_SEND, 0, 8, 0, 0, 0, IBV_SEND_SIGNALED), 0);
  assert_true(readable(a.ch->fd, 5000));
  assert_int_equal(V.get_cq_event(a.ch, &cq, &cq_context), 0);
  assert_ptr_equal(cq, a.cq);
  assert_ptr_equal(cq_context, &a);
  V.ack_cq_events(cq, 1);
  assert_false(readable(a.ch->fd, 0));
  expect_wc(&a, 1, IBV_WC_SUCCESS);
  /* not armed again: the next completion says nothing */
  assert_int_equal(post_send(&a, 2, IBV_WR_SEND, 0, 8, 0, 0, 0, IBV_SEND_SIGNALED), 0);
  expect_wc(&a, 2, IBV_WC_SUCCESS);
  assert_false(readable(a.ch->fd, 50));
  side_close(&a);
  side_close(&b);
}

static void expect_event(struct ibv_context *ctx, enum ibv_event_type type, struct ibv_async_event *ev) {
  assert_true(readable(ctx->async_fd, 3000));
  assert_int_equal(V.get_async_event(ctx, ev), 0);
  if (ev->event_type != type)
    fprintf(stderr, "event %s, wanted %s\n", V.event_type_str(ev->event_type), V.event_type_str(type));
  assert_int_equal(ev->event_type, type);
}

static void test_async_events(void **state) {
  struct side s;
  side_open(&s, 4096, 16);
  struct ibv_async_event ev;
  struct ibv_port_attr pa;
  assert_false(readable(s.ctx->async_fd, 0));
  assert_int_equal(X.raise(s.ctx, IBV_EVENT_PORT_ERR, 1), 0);
  expect_event(s.ctx, IBV_EVENT_PORT_ERR, &ev);
  assert_int_equal(ev.element.port_num, 1);
  V.ack_async_event(&ev);
  memset(&pa, 0, sizeof(pa));
  assert_int_equal(V.query_port(s.ctx, 1, (struct _compat_ibv_port_attr *)&pa), 0);
  assert_int_equal(pa.state, IBV_PORT_DOWN);
  assert_int_equal(X.raise(s.ctx, IBV_EVENT_PORT_ACTIVE, 1), 0);
  expect_event(s.ctx, IBV_EVENT_PORT_ACTIVE, &ev);
  V.ack_async_event(&ev);
  assert_false(readable(s.ctx->async_fd, 0));

  /* the same from another process's point of view: a file the progress
   * thread reads (written aside, then renamed into place) */
  char path[128], tmp[140];
  snprintf(path, sizeof(path), "%s/wire/raise-%d", emu_dir, (int)getpid());
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  assert_non_null(f);
  fprintf(f, "qp_error %u\nport_down emu0 1\n", s.qp->qp_num);
  fclose(f);
  assert_int_equal(rename(tmp, path), 0);
  expect_event(s.ctx, IBV_EVENT_QP_FATAL, &ev);
  assert_ptr_equal(ev.element.qp, s.qp);
  V.ack_async_event(&ev);
  expect_event(s.ctx, IBV_EVENT_PORT_ERR, &ev);
  V.ack_async_event(&ev);
  assert_int_equal(access(path, F_OK), -1);
  assert_int_equal(qp_state(&s), IBV_QPS_ERR);
  assert_int_equal(X.raise(s.ctx, IBV_EVENT_PORT_ACTIVE, 1), 0);
  expect_event(s.ctx, IBV_EVENT_PORT_ACTIVE, &ev);
  V.ack_async_event(&ev);

  /* the device dies: the event, and every QP on it to ERR */
  struct ibv_qp_attr reset = {.qp_state = IBV_QPS_RESET};
  assert_int_equal(V.modify_qp(s.qp, &reset, IBV_QP_STATE), 0);
  assert_int_equal(X.raise(s.ctx, IBV_EVENT_DEVICE_FATAL, 0), 0);
  expect_event(s.ctx, IBV_EVENT_DEVICE_FATAL, &ev);
  V.ack_async_event(&ev);
  assert_int_equal(qp_state(&s), IBV_QPS_ERR);
  side_close(&s);
}

/* One completion more than the CQ holds: CQ_ERR, and its QP to ERR. */
static void test_cq_overrun(void **state) {
  struct side a, b;
  side_open(&a, 4096, 2);
  side_open(&b, 4096, 16);
  struct info ia = side_info(&a), ib = side_info(&b);
  side_connect(&a, &ib);
  side_connect(&b, &ia);
  for (int i = 0; i < 3; i++) assert_int_equal(post_recv(&b, 60 + (uint64_t)i, 0, 64), 0);
  for (int i = 0; i < 3; i++) assert_int_equal(post_send(&a, (uint64_t)i, IBV_WR_SEND, 0, 8, 0, 0, 0, IBV_SEND_SIGNALED), 0);
  struct ibv_async_event ev;
  expect_event(a.ctx, IBV_EVENT_CQ_ERR, &ev);
  assert_ptr_equal(ev.element.cq, a.cq);
  V.ack_async_event(&ev);
  assert_int_equal(qp_state(&a), IBV_QPS_ERR);
  side_close(&a);
  side_close(&b);
}

/* ---- setup ------------------------------------------------------------------ */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  return remove(path);
}

static void remove_dir(void) {
  if (emu_dir[0] && !in_peer) nftw(emu_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

static int setup(void **state) {
  snprintf(emu_dir, sizeof(emu_dir), "/tmp/ccs-verbs-emu-XXXXXX");
  if (!mkdtemp(emu_dir)) return -1;
  atexit(remove_dir); /* also when a test failed */
  char wire[96];
  snprintf(wire, sizeof(wire), "%s/wire", emu_dir); /* made by the first QP */
  setenv("CCS_VERBS_EMU_DIR", wire, 1);
  char err[256];
  if (ccs_verbs_lib_open(&V, CCS_VERBS_EMU_PATH, err, sizeof(err))) {
    fprintf(stderr, "%s\n", err);
    return -1;
  }
  *(void **)&X.get_device_guid = dlsym(V.handle, "ibv_get_device_guid");
  *(void **)&X.query_qp = dlsym(V.handle, "ibv_query_qp");
  *(void **)&X.raise = dlsym(V.handle, "ccs_verbs_emu_raise");
  return X.get_device_guid && X.query_qp && X.raise ? 0 : -1;
}

static int teardown(void **state) {
  ccs_verbs_lib_close(&V);
  remove_dir();
  emu_dir[0] = 0;
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_devices),
      cmocka_unit_test(test_objects),
      cmocka_unit_test(test_transitions),
      cmocka_unit_test(test_write_imm_sizes),
      cmocka_unit_test(test_send_and_rnr),
      cmocka_unit_test(test_peer_exit),
      cmocka_unit_test(test_remote_access_errors),
      cmocka_unit_test(test_receive_too_small),
      cmocka_unit_test(test_wrong_gid),
      cmocka_unit_test(test_local_protection),
      cmocka_unit_test(test_port_down_traffic),
      cmocka_unit_test(test_comp_channel),
      cmocka_unit_test(test_async_events),
      cmocka_unit_test(test_cq_overrun),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
