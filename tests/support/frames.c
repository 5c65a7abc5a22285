#include "frames.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct frame frame_of(const Ccs__Request *req) {
  struct frame f = {NULL, 0};
  f.data = ccs__frame_pack(&req->base, &f.len);
  return f;
}

struct frame frame_hello(uint64_t req_id, uint32_t protocol) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__Hello h = CCS__HELLO__INIT;
  h.protocol = protocol;
  req.id = req_id;
  req.body_case = CCS__REQUEST__BODY_HELLO, req.hello = &h;
  return frame_of(&req);
}

struct frame frame_get_unique_id(uint64_t req_id) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__GetUniqueId g = CCS__GET_UNIQUE_ID__INIT;
  req.id = req_id;
  req.body_case = CCS__REQUEST__BODY_GET_UNIQUE_ID, req.get_unique_id = &g;
  return frame_of(&req);
}

struct frame frame_stats(uint64_t req_id) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__Stats st = CCS__STATS__INIT;
  req.id = req_id;
  req.body_case = CCS__REQUEST__BODY_STATS, req.stats = &st;
  return frame_of(&req);
}

struct frame frame_admin(uint64_t req_id, const char *command, char **args, size_t nargs, int json) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__Admin a = CCS__ADMIN__INIT;
  a.command = (char *)command;
  a.args = args;
  a.n_args = nargs;
  a.json = json;
  req.id = req_id;
  req.body_case = CCS__REQUEST__BODY_ADMIN, req.admin = &a;
  return frame_of(&req);
}

struct frame frame_comm_init(uint64_t req_id, ProtobufCBinaryData id, uint32_t nranks, uint32_t rank) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__CommInit ci = CCS__COMM_INIT__INIT;
  ci.id = id;
  ci.nranks = nranks;
  ci.rank = rank;
  req.id = req_id;
  req.body_case = CCS__REQUEST__BODY_COMM_INIT, req.comm_init = &ci;
  return frame_of(&req);
}

struct frame frame_ring_setup(uint64_t req_id) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__RingSetup r = CCS__RING_SETUP__INIT;
  req.id = req_id;
  req.body_case = CCS__REQUEST__BODY_RING_SETUP, req.ring_setup = &r;
  return frame_of(&req);
}

struct frame frame_mem_register(uint64_t req_id) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__MemRegister m = CCS__MEM_REGISTER__INIT;
  req.id = req_id;
  req.body_case = CCS__REQUEST__BODY_MEM_REGISTER, req.mem_register = &m;
  return frame_of(&req);
}

struct frame frame_submit(uint64_t req_id, Ccs__Op **ops, size_t n_ops) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__Submit sub = CCS__SUBMIT__INIT;
  sub.n_ops = n_ops;
  sub.ops = ops;
  req.id = req_id;
  req.body_case = CCS__REQUEST__BODY_SUBMIT, req.submit = &sub;
  return frame_of(&req);
}

ssize_t frame_send(int sock, const void *buf, size_t len, const int *fds, int nfds, int flags) {
  struct iovec iov = {(void *)buf, len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  char *ctl = NULL;
  if (nfds > 0) {
    size_t space = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    ctl = calloc(1, space);
    if (!ctl) return -1;
    msg.msg_control = ctl;
    msg.msg_controllen = space;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
  }
  ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
  free(ctl);
  return n;
}
