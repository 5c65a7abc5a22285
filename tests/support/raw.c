#include "raw.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "ring.h"

int raw_connect(const char *socket_path) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof(a.sun_path), "%s", socket_path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  return fd;
}

void raw_send(int fd, const void *buf, size_t len, const int *fds, int nfds) {
  assert_int_equal(frame_send(fd, buf, len, fds, nfds, 0), (ssize_t)len);
}

void raw_send_frame_fds(int fd, struct frame f, const int *fds, int nfds) {
  assert_non_null(f.data);
  raw_send(fd, f.data, f.len, fds, nfds);
  free(f.data);
}

void raw_send_frame(int fd, struct frame f, int pass_fd) {
  raw_send_frame_fds(fd, f, &pass_fd, pass_fd >= 0 ? 1 : 0);
}

void raw_request(int fd, Ccs__Request *req, int pass_fd) { raw_send_frame(fd, frame_of(req), pass_fd); }

static int read_full(int fd, uint8_t *buf, size_t len) {
  for (size_t got = 0; got < len;) {
    struct pollfd p = {fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 10000), 1);
    ssize_t n = read(fd, buf + got, len - got);
    if (n <= 0) return -1;
    got += (size_t)n;
  }
  return 0;
}

Ccs__Reply *raw_reply(int fd) {
  uint8_t hdr[4];
  if (read_full(fd, hdr, 4)) return NULL;
  uint32_t len = hdr[0] | hdr[1] << 8 | hdr[2] << 16 | (uint32_t)hdr[3] << 24;
  assert_true(len <= CCS__REPLY_MAX);
  uint8_t *body = malloc(len + 1);
  assert_int_equal(read_full(fd, body, len), 0);
  Ccs__Reply *r = ccs__reply_unpack(body, len);
  free(body);
  assert_non_null(r);
  return r;
}

void raw_expect(int fd, ccs_result_t status) {
  Ccs__Reply *r = raw_reply(fd);
  assert_non_null(r);
  if (r->status != (int)status)
    fail_msg("got %s (%s), want %s", ccs_result_name((ccs_result_t)r->status), r->error,
             ccs_result_name(status));
  ccs__reply__free_unpacked(r, NULL);
}

void raw_expect_closed(int fd) {
  assert_null(raw_reply(fd));
  close(fd);
}

int raw_closed_by_daemon(int fd) {
  char buf[4096];
  for (double end = test_now() + 5; test_now() < end;) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return 1;
  }
  return 0;
}

void raw_send_hello(int fd, uint32_t protocol) { raw_send_frame(fd, frame_hello(1, protocol), -1); }

void raw_hello(int fd) {
  raw_send_hello(fd, CCS__PROTOCOL_VERSION);
  raw_expect(fd, CCS_OK);
}

void raw_send_get_unique_id(int fd, uint64_t req_id) {
  raw_send_frame(fd, frame_get_unique_id(req_id), -1);
}

int raw_memfd(size_t bytes, int seals) {
  int mfd = memfd_create("raw", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  assert_true(mfd >= 0);
  assert_int_equal(ftruncate(mfd, (off_t)bytes), 0);
  if (seals) assert_int_equal(fcntl(mfd, F_ADD_SEALS, seals), 0);
  return mfd;
}

ccs_result_t raw_register(int fd, int memfd, uint64_t *ret_id) {
  raw_send_frame(fd, frame_mem_register(7), memfd);
  Ccs__Reply *r = raw_reply(fd);
  assert_non_null(r);
  ccs_result_t rc = (ccs_result_t)r->status;
  if (rc == CCS_OK && ret_id) *ret_id = r->mem_register->buffer;
  ccs__reply__free_unpacked(r, NULL);
  return rc;
}

void raw_send_join(int fd, uint64_t id_req, uint64_t init_req, uint32_t nranks) {
  raw_send_get_unique_id(fd, id_req);
  Ccs__Reply *r = raw_reply(fd);
  assert_int_equal(r->status, CCS_OK);
  raw_send_frame(fd, frame_comm_init(init_req, r->unique_id->id, nranks, 0), -1);
  ccs__reply__free_unpacked(r, NULL);
}

uint64_t raw_comm_of_one(int fd) {
  raw_send_join(fd, 3, 4, 1);
  Ccs__Reply *r = raw_reply(fd);
  assert_int_equal(r->status, CCS_OK);
  uint64_t comm = r->comm_init->comm;
  ccs__reply__free_unpacked(r, NULL);
  return comm;
}

void raw_send_all_reduce_into(int fd, uint64_t req_id, uint64_t comm, Ccs__BufRef *send, Ccs__BufRef *recv,
                              uint64_t count) {
  Ccs__Op op = CCS__OP__INIT, *ops[1] = {&op};
  op.comm = comm;
  op.kind = CCS__ALL_REDUCE;
  op.count = count;
  op.dtype = CCS_FLOAT32;
  op.send = send;
  op.recv = recv;
  raw_send_frame(fd, frame_submit(req_id, ops, 1), -1);
}

void raw_send_all_reduce(int fd, uint64_t req_id, uint64_t comm, Ccs__BufRef *ref, uint64_t count) {
  raw_send_all_reduce_into(fd, req_id, comm, ref, ref, count);
}

void *raw_map(int memfd, size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  assert_true(p != MAP_FAILED);
  return p;
}

ccs_result_t raw_ring_setup(int fd, struct raw_ring *ret) {
  memset(ret, 0, sizeof(*ret));
  int memfd = raw_memfd(CCS__RING_BYTES, F_SEAL_SHRINK | F_SEAL_GROW);
  ret->sh = mmap(NULL, CCS__RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  assert_true(ret->sh != MAP_FAILED);
  ret->sh->magic = CCS__RING_MAGIC;
  ret->sh->protocol = CCS__PROTOCOL_VERSION;
  ret->sh->entries = CCS__RING_ENTRIES;
  ret->sh->batch_max = CCS__RING_BATCH_MAX;
  ret->bell = eventfd(0, EFD_CLOEXEC);
  assert_true(ret->bell >= 0);
  int fds[2] = {memfd, ret->bell};
  raw_send_frame_fds(fd, frame_ring_setup(9), fds, 2);
  close(memfd);
  Ccs__Reply *r = raw_reply(fd);
  assert_non_null(r);
  ccs_result_t rc = (ccs_result_t)r->status;
  ccs__reply__free_unpacked(r, NULL);
  return rc;
}

void raw_ring_submit(struct raw_ring *r, uint64_t req_id, const struct ccs__ring_op *ops, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    struct ccs__ring_op *e = &r->sh->sub[(r->sub_tail + i) % CCS__RING_ENTRIES];
    *e = ops[i];
    e->req_id = req_id;
    e->index = i;
    e->nops = n;
  }
  r->sub_tail += n;
  atomic_store(&r->sh->sub_tail, r->sub_tail);
  if (atomic_load(&r->sh->daemon_sleeping)) {
    uint64_t one = 1;
    assert_int_equal(write(r->bell, &one, sizeof(one)), sizeof(one));
  }
}

void raw_ring_wait(struct raw_ring *r, struct ccs__ring_done *ret, char *text, size_t len) {
  for (double end = test_now() + 10; atomic_load(&r->sh->done_tail) == r->done_head;) {
    if (test_now() > end) fail_msg("no completion in 10 s");
    usleep(200);
  }
  uint32_t slot = r->done_head % CCS__RING_ENTRIES;
  *ret = r->sh->done[slot];
  if (text) snprintf(text, len, "%s", r->sh->text[slot]);
  atomic_store(&r->sh->done_head, ++r->done_head);
}

void raw_ring_close(struct raw_ring *r) {
  munmap(r->sh, CCS__RING_BYTES);
  close(r->bell);
}

char *raw_admin(const char *socket_path, const char *command) {
  int fd = raw_connect(socket_path);
  raw_hello(fd);
  raw_send_frame(fd, frame_admin(2, command, NULL, 0, 0), -1);
  Ccs__Reply *r = raw_reply(fd);
  close(fd);
  assert_non_null(r);
  if (r->status != CCS_OK) fail_msg("%s: %s", command, r->error);
  assert_int_equal(r->body_case, CCS__REPLY__BODY_ADMIN);
  char *text = strdup(r->admin->text);
  ccs__reply__free_unpacked(r, NULL);
  return text;
}

double raw_metric(const char *text, const char *series) {
  size_t len = strlen(series);
  for (const char *at = text; (at = strstr(at, series)); at += len)
    if ((at == text || at[-1] == '\n') && at[len] == ' ') return strtod(at + len + 1, NULL);
  return 0;
}

Ccs__StatsReply *raw_stats(const char *socket_path) {
  int fd = raw_connect(socket_path);
  raw_hello(fd);
  raw_send_frame(fd, frame_stats(2), -1);
  Ccs__Reply *r = raw_reply(fd);
  close(fd);
  assert_non_null(r);
  assert_int_equal(r->body_case, CCS__REPLY__BODY_STATS);
  Ccs__StatsReply *copy = malloc(sizeof(*copy));
  *copy = *r->stats;
  copy->daemon_version = NULL;
  ccs__reply__free_unpacked(r, NULL);
  return copy;
}

int raw_wait_ops_in_flight(const char *socket_path, uint64_t ops, double timeout_s) {
  for (double end = test_now() + timeout_s; test_now() < end; usleep(2000)) {
    Ccs__StatsReply *st = raw_stats(socket_path);
    int there = st->ops_in_flight >= ops;
    free(st);
    if (there) return 0;
  }
  return -1;
}

int raw_wait_comms(const char *socket_path, int some, double timeout_s) {
  for (double end = test_now() + timeout_s; test_now() < end; usleep(1000)) {
    Ccs__StatsReply *st = raw_stats(socket_path);
    int there = st->comms >= 1;
    free(st);
    if (there == some) return 0;
  }
  return -1;
}

/* The counters over the daemon's kept stats connection (harness.h), made
 * again once if the daemon dropped it. */
static Ccs__StatsReply *stats_of(const struct test_daemon *d) {
  for (int attempt = 0; attempt < 2; attempt++) {
    int fd = test_daemon_stats_fd(d);
    if (fd < 0) {
      fd = raw_connect(d->socket);
      raw_hello(fd);
      test_daemon_set_stats_fd(d, fd);
    }
    raw_send_frame(fd, frame_stats(2), -1);
    Ccs__Reply *r = raw_reply(fd);
    if (!r) { /* closed: another connection */
      test_daemon_set_stats_fd(d, -1);
      continue;
    }
    assert_int_equal(r->body_case, CCS__REPLY__BODY_STATS);
    Ccs__StatsReply *copy = malloc(sizeof(*copy));
    *copy = *r->stats;
    copy->daemon_version = NULL;
    ccs__reply__free_unpacked(r, NULL);
    return copy;
  }
  fail_msg("the daemon closed its stats connection twice");
  return NULL;
}

/* The connection asked on stays open: the reading is of a daemon whose
 * descriptors this reading neither opened nor closed. */
static void read_state(const struct test_daemon *d, struct test_daemon_state *ret) {
  Ccs__StatsReply *st = stats_of(d);
  memset(ret, 0, sizeof(*ret)); /* compared with memcmp: padding too */
  ret->fds = test_daemon_fds(d);
  ret->sessions = st->sessions;
  ret->comms = st->comms;
  ret->buffers = st->buffers;
  ret->registered_bytes = st->registered_bytes;
  ret->ops_in_flight = st->ops_in_flight;
  free(st);
}

/* A baseline is what the daemon holds once it stopped changing: what was
 * closed just before (the harness's probes, a finished comm's connections
 * between daemons, which their network thread closes on its own time) is
 * gone from it. Readings 10 ms apart until 100 ms of them agree, for 10 s
 * at most. */
void test_daemon_state(const struct test_daemon *d, struct test_daemon_state *ret) {
  struct test_daemon_state prev;
  read_state(d, ret);
  for (int same = 0, i = 0; same < 10 && i < 1000; i++) {
    usleep(10000);
    prev = *ret;
    read_state(d, ret);
    same = memcmp(&prev, ret, sizeof(prev)) ? 0 : same + 1;
  }
}

void test_daemon_assert_clean(const struct test_daemon *d, const struct test_daemon_state *before) {
  double deadline = test_now() + 10;
  struct test_daemon_state now;
  for (;;) {
    read_state(d, &now);
    if (!memcmp(&now, before, sizeof(now))) break;
    if (test_now() > deadline)
      fail_msg("daemon grew: fds %d -> %d, sessions %llu -> %llu, comms %llu -> %llu, "
               "buffers %llu -> %llu, registered %llu -> %llu, ops %llu -> %llu",
               before->fds, now.fds, (unsigned long long)before->sessions,
               (unsigned long long)now.sessions, (unsigned long long)before->comms,
               (unsigned long long)now.comms, (unsigned long long)before->buffers,
               (unsigned long long)now.buffers, (unsigned long long)before->registered_bytes,
               (unsigned long long)now.registered_bytes,
               (unsigned long long)before->ops_in_flight, (unsigned long long)now.ops_in_flight);
    usleep(50000);
  }
  assert_true(test_daemon_alive(d));
}
