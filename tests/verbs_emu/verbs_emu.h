/* The verbs emulation's insides, shared by its three files: verbs_emu.c
 * (devices, contexts, memory, async events, faults), verbs_emu_qp.c (CQs,
 * completion channels, queue pairs, posting, completions) and
 * verbs_emu_wire.c (the progress thread and the emulated wire).
 *
 * Locking: one mutex per context (emu_ctx.lock) guards every object of that
 * context and everything the progress thread does with them; the progress
 * thread drops it only inside poll(). The process-wide g_lock (devices,
 * open contexts) is taken before a context's lock, never after. */
#ifndef CCS_VERBS_EMU_H
#define CCS_VERBS_EMU_H

#include <infiniband/verbs.h>
#include <limits.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define EMU_API __attribute__((visibility("default")))

#define EMU_MAX_PORTS 8
#define EMU_MAX_WR 4096
#define EMU_MAX_SGE 16
#define EMU_MAX_INLINE 512
#define EMU_MAX_CQE 65536
#define EMU_MAX_RD_ATOMIC 16
#define EMU_MAX_MSG (1u << 30)
#define EMU_PAYLOAD (64 * 1024) /* data bytes in one packet on the emulated wire */

struct emu_port {
  _Atomic int state;   /* enum ibv_port_state; read by progress threads without g_lock */
  union ibv_gid gid[2]; /* fixed at creation: link-local, then the IPv4-mapped address */
};

struct emu_dev {
  struct ibv_device ibdev; /* first: the caller's ibv_device * points here */
  struct emu_dev *next;    /* in the process's devices (g_lock) */
  int refs;                /* device lists and open contexts holding it (g_lock) */
  uint64_t guid;
  int nports;
  struct emu_port port[EMU_MAX_PORTS]; /* port n is port[n - 1] */
};

struct emu_event { /* an async event not yet got */
  struct emu_event *next;
  struct ibv_async_event ev;
};

struct emu_pd {
  struct ibv_pd ibpd;
  struct emu_pd *next;
  int refs; /* MRs and QPs on it */
};

struct emu_mr {
  struct ibv_mr ibmr;
  struct emu_mr *next;
  struct emu_pd *pd;
  int access;
  uintptr_t start, end; /* [start, end) */
};

struct emu_chan_event {
  struct emu_chan_event *next;
  struct emu_cq *cq;
};

struct emu_chan {
  struct ibv_comp_channel ibch; /* its fd: a pipe's read end, readable while events wait */
  struct emu_chan *next;
  int wr_fd;
  int cqs; /* CQs using it */
  struct emu_chan_event *head, *tail;
};

struct emu_qp;
struct emu_cqe {
  struct ibv_wc wc;
  struct emu_qp *qp; /* NULL once the QP is reset or destroyed */
  uint64_t sq_seq;   /* a send's place in its QP's send queue */
  bool is_send;
};

struct emu_cq {
  struct ibv_cq ibcq;
  struct emu_cq *next;
  struct emu_chan *chan;
  struct emu_cqe *ring;
  int cap, head, count;
  bool armed, solicited_only;
  bool overrun; /* one CQE too many: CQ_ERR raised, later CQEs dropped */
  bool destroying;
  int qps;      /* send and receive queues completing here */
  uint32_t comp_delivered, comp_acked, async_delivered, async_acked;
};

struct emu_swr { /* a posted send */
  struct emu_swr *next;
  uint64_t wr_id, seq;
  enum ibv_wr_opcode opcode;
  unsigned flags; /* IBV_SEND_* */
  uint32_t imm, rkey;
  uint64_t raddr, len;
  bool sent;                   /* every packet of it is on the wire */
  int rnr_tries;
  enum ibv_wc_status local_err; /* found while sending: reported when it is the oldest */
  uint8_t *inline_data;         /* IBV_SEND_INLINE: copied at post, after sge[] */
  int nsge;
  struct ibv_sge sge[];
};

struct emu_rwr { /* a posted receive */
  struct emu_rwr *next;
  uint64_t wr_id;
  int nsge;
  struct ibv_sge sge[];
};

struct emu_answer { /* what a responder owes its requester, in order */
  struct emu_answer *next;
  int type; /* enum emu_pkt_type */
  int status;
  uint8_t rnr_timer;
  uint64_t seq;
  uint64_t raddr, len, off; /* PKT_READ_RESP: the data, sent as it goes */
  uint32_t rkey;
};

/* A QP's socket. Only the progress thread opens connections; any thread
 * may close one (RESET, ERR, destroy) while that thread sits in poll(), so
 * a poll result counts only if the socket still has the generation it had
 * when the pollfds were built. */
struct emu_sock {
  int fd;
  unsigned gen;
  int pi; /* its index in this round's pollfds, or -1 */
};

enum emu_req_state {
  REQ_NONE,       /* not connected; at RTR and after, connecting again at connect_at */
  REQ_WAIT_HELLO, /* connected, the responder has not answered yet */
  REQ_READY,      /* requests flow */
  REQ_GONE,       /* the peer went away or is not who the address says: sends time out */
};

struct emu_qp {
  struct ibv_qp ibqp; /* first */
  struct emu_qp *next;
  struct emu_ctx *ctx;
  struct emu_pd *pd;
  struct emu_cq *scq, *rcq;
  struct ibv_qp_cap cap;
  int sq_sig_all;
  enum ibv_qp_state state;
  struct ibv_qp_attr attr; /* as modified: what query_qp answers */
  char path[108];
  struct emu_sock lsn, req, resp; /* listening; ours to the peer; the peer's to us */
  uint32_t ev_delivered, ev_acked;
  bool destroying;

  /* Requester. sq_head is the oldest unfinished send, tx the next to go
   * on the wire (tx_off bytes of it gone), sq_tail the newest. */
  struct emu_swr *sq_head, *sq_tail, *tx;
  uint64_t tx_off;
  uint64_t sq_posted, sq_retired; /* slots: retired when a CQE covering them is polled */
  int reads_out;                  /* RDMA reads on the wire, for max_rd_atomic */
  double tx_resume_at;            /* after an RNR NAK */
  double stall_since;             /* last progress on the send queue (the retry budget) */
  enum emu_req_state req_state;
  double connect_at, connect_gap;

  /* Responder. */
  struct emu_rwr *rq_head, *rq_tail;
  uint64_t rq_posted, rq_retired;
  bool hello_pending, resp_ready, resp_draining;
  uint32_t peer_qpn;
  uint64_t expect_seq;
  bool in_msg; /* a message of seq expect_seq is arriving */
  int in_opcode;
  unsigned in_flags;
  uint64_t in_len, in_off, in_raddr;
  uint32_t in_rkey, in_imm;
  struct emu_rwr *in_recv; /* the receive it consumes */
  struct emu_answer *ans_head, *ans_tail;
  int ans_count, ans_reads; /* reads among them: nothing later executes before their data left */
};

struct emu_ctx {
  struct ibv_context ibctx; /* first */
  struct emu_ctx *next;     /* in the process's open contexts (g_lock) */
  struct emu_dev *dev;
  char dir[PATH_MAX]; /* CCS_VERBS_EMU_DIR as the device list read it */
  pthread_mutex_t lock;
  pthread_cond_t acked; /* an event was acknowledged: destroy may be waiting */
  int async_wr;
  struct emu_event *ev_head, *ev_tail;
  struct emu_pd *pds;
  struct emu_mr *mrs;
  struct emu_cq *cqs;
  struct emu_chan *chans;
  struct emu_qp *qps;
  uint32_t handles;

  /* The progress thread (verbs_emu_wire.c), from the first QP on. */
  pthread_t thread;
  bool thread_started, stopping, dir_made;
  int wake[2];
  unsigned sock_gen;
  uint8_t *rx_buf, *tx_buf;
  struct pollfd *pfd;
  unsigned *pgen;
  int pcap;
};

double emu_now(void);
uint32_t emu_random32(void);

/* verbs_emu.c: memory, async events (ctx->lock held unless said) */
struct emu_mr *emu_mr_find(struct emu_qp *qp, uint32_t key, bool remote, uintptr_t addr,
                           uint64_t len, int access);
int emu_sge_copy(struct emu_qp *qp, const struct ibv_sge *sge, int nsge, uint64_t off, void *buf,
                 uint64_t len, int access, bool into_sge);
void emu_event_push(struct emu_ctx *ctx, enum ibv_event_type type, struct emu_qp *qp,
                    struct emu_cq *cq, int port);
bool emu_event_is_qp(enum ibv_event_type type);
void emu_events_forget(struct emu_ctx *ctx, struct ibv_qp *qp, struct ibv_cq *cq);
void emu_wait_acked(struct emu_ctx *ctx, const uint32_t *delivered, const uint32_t *acked,
                    const char *what);
/* An event fd is a pipe holding one byte while events wait. */
void emu_level_set(int wr_fd);
void emu_level_clear(int rd_fd);
int emu_level_wait(int rd_fd); /* no lock held */
void emu_raise_file(const char *dir); /* no lock held */

/* verbs_emu_qp.c: the context->ops, completions, errors */
int emu_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int emu_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int emu_poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc);
int emu_req_notify_cq(struct ibv_cq *ibcq, int solicited_only);
void emu_sq_complete(struct emu_qp *qp, enum ibv_wc_status status);
void emu_rq_complete(struct emu_qp *qp, struct emu_rwr *w, enum ibv_wc_status status,
                     enum ibv_wc_opcode opcode, uint32_t byte_len, unsigned wc_flags, uint32_t imm,
                     bool solicited);
void emu_qp_error(struct emu_qp *qp);
void emu_qp_release(struct emu_qp *qp);
void emu_cq_free(struct emu_cq *cq);

/* verbs_emu_wire.c: sockets and the progress thread */
int emu_wire_bind(struct emu_qp *qp);
void emu_wire_connect(struct emu_qp *qp);
void emu_wire_reset(struct emu_qp *qp);
void emu_wire_error(struct emu_qp *qp);
void emu_wire_destroy(struct emu_qp *qp);
int emu_progress_start(struct emu_ctx *ctx);
void emu_progress_stop(struct emu_ctx *ctx);
void emu_wake(struct emu_ctx *ctx);
double emu_retry_budget(const struct emu_qp *qp);

#endif
