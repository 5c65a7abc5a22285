/* The fast path (proto/ring.h) under clients that do what libccs never
 * would: setups the daemon must refuse, ops that go through the rings
 * with the checks of the socket, rings whose indices or batches are
 * impossible (only that connection is closed), entries rewritten while
 * the daemon takes them (it never acts on what it did not check), a
 * client killed between publishing an op and ringing the doorbell, and a
 * daemon that dies under a client asleep on its completion. Every row
 * ends with the daemon serving a fresh comm and holding nothing more. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "frames.h"
#include "harness.h"
#include "raw.h"
#include "ring.h"
#include "serving.h"

#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW)

struct shared {
  ccs_unique_id_t id;
  char socket[128];
  double killed_at;
};
static struct shared *sh;
static struct test_daemon daemon_, second; /* static: the harness's cleanup may look at them */
static struct test_daemon_state clean;

static int setup(void **state) {
  sh = test_shared_new(sizeof(*sh));
  return sh ? test_daemon_start_clean(&daemon_, NULL, &sh->id, &clean) : -1;
}

static int teardown(void **state) {
  int rc = test_daemon_stop(&daemon_);
  test_shared_free(sh, sizeof(*sh));
  return rc;
}

static void assert_daemon_serves(int n) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_sum(n, &sh->id, &test_sum_executor, 0, 60), 0);
  test_daemon_assert_clean(&daemon_, &clean);
}

/* A unique id of the daemon at socket (the process's libccs connection
 * stays with the first daemon). */
static void id_from(const char *socket, ccs_unique_id_t *ret) {
  int fd = raw_connect(socket);
  raw_hello(fd);
  raw_send_get_unique_id(fd, 2);
  Ccs__Reply *r = raw_reply(fd);
  assert_int_equal(r->status, CCS_OK);
  assert_int_equal(r->unique_id->id.len, sizeof(*ret));
  memcpy(ret, r->unique_id->id.data, sizeof(*ret));
  ccs__reply__free_unpacked(r, NULL);
  close(fd);
}

/* A connection that said hello. */
static int connected(void) {
  int fd = raw_connect(daemon_.socket);
  raw_hello(fd);
  return fd;
}

/* A registered buffer of `bytes` on connection fd, mapped here too. */
static uint64_t buffer_of(int fd, size_t bytes, void **ret_map) {
  int mfd = raw_memfd(bytes, SEALS);
  uint64_t id;
  assert_int_equal(raw_register(fd, mfd, &id), CCS_OK);
  *ret_map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  assert_true(*ret_map != MAP_FAILED);
  close(mfd);
  return id;
}

static void expect_setup_refused(int memfd, int bell, ccs_result_t want, const char *text) {
  int fd = connected();
  int fds[2] = {memfd, bell}, nfds = (memfd >= 0) + (bell >= 0);
  raw_send_frame_fds(fd, frame_ring_setup(5), memfd >= 0 ? fds : fds + 1, nfds);
  Ccs__Reply *r = raw_reply(fd);
  assert_non_null(r);
  if (r->status != (int)want || !strstr(r->error, text))
    fail_msg("RingSetup: got %s (%s), want %s (%s)", ccs_result_name((ccs_result_t)r->status),
             r->error, ccs_result_name(want), text);
  ccs__reply__free_unpacked(r, NULL);
  /* refused, not closed: the socket serves on */
  raw_send_get_unique_id(fd, 6);
  raw_expect(fd, CCS_OK);
  close(fd);
}

static void test_setup_refused(void **state) {
  int bell = eventfd(0, EFD_CLOEXEC), pipe_fds[2];
  assert_int_equal(pipe(pipe_fds), 0);
  int unsealed = raw_memfd(CCS__RING_BYTES, 0);
  int small = raw_memfd(4096, SEALS);
  int good = raw_memfd(CCS__RING_BYTES, SEALS);
  expect_setup_refused(-1, -1, CCS_ERR_INVALID_ARGUMENT, "two file descriptors");
  expect_setup_refused(-1, bell, CCS_ERR_INVALID_ARGUMENT, "two file descriptors");
  expect_setup_refused(unsealed, bell, CCS_ERR_INVALID_ARGUMENT, "sealed against shrinking");
  expect_setup_refused(small, bell, CCS_ERR_INVALID_ARGUMENT, "must hold exactly");
  expect_setup_refused(good, pipe_fds[0], CCS_ERR_INVALID_ARGUMENT, "must be an eventfd");
  /* laid out for another protocol (the client writes nothing: magic 0) */
  expect_setup_refused(good, bell, CCS_ERR_VERSION, "not laid out as this daemon's");
  /* a second setup on one connection */
  int fd = connected();
  struct raw_ring r;
  assert_int_equal(raw_ring_setup(fd, &r), CCS_OK);
  struct raw_ring again;
  assert_int_equal(raw_ring_setup(fd, &again), CCS_ERR_INVALID_USAGE);
  raw_ring_close(&again);
  raw_ring_close(&r);
  close(fd);
  close(bell), close(pipe_fds[0]), close(pipe_fds[1]), close(unsealed), close(small), close(good);
  assert_daemon_serves(2);
}

/* A connection with rings, a one-rank comm and a buffer of `bytes`
 * (mapped here at p), beside another client's buffer of 4096 bytes. */
struct ringed {
  int fd, other;
  struct raw_ring r;
  uint64_t comm, buf, theirs;
  float *p;
  void *theirs_map;
  size_t bytes;
};

static void ringed_open(struct ringed *t, size_t bytes) {
  t->fd = connected();
  t->other = connected();
  assert_int_equal(raw_ring_setup(t->fd, &t->r), CCS_OK);
  t->comm = raw_comm_of_one(t->fd);
  t->bytes = bytes;
  t->buf = buffer_of(t->fd, bytes, (void **)&t->p);
  t->theirs = buffer_of(t->other, 4096, &t->theirs_map);
  memset(t->theirs_map, 0xcd, 4096);
}

static void ringed_close(struct ringed *t) {
  munmap(t->p, t->bytes);
  munmap(t->theirs_map, 4096);
  raw_ring_close(&t->r);
  close(t->fd);
  close(t->other);
}

/* libccs submits through the rings unless CCS_RING=0 says not to. */
static uint64_t fast_path_calls(void) {
  Ccs__StatsReply *st = raw_stats(daemon_.socket);
  uint64_t calls = st->fast_path_calls;
  ccs__stats_reply__free_unpacked(st, NULL);
  return calls;
}

static void test_libccs_takes_the_fast_path(void **state) {
  uint64_t before = fast_path_calls();
  assert_daemon_serves(3);
  uint64_t on = fast_path_calls();
  assert_true(on >= before + 3); /* every rank's all_reduce, at least */
  setenv("CCS_RING", "0", 1);
  assert_daemon_serves(3);
  unsetenv("CCS_RING");
  assert_int_equal(fast_path_calls(), on);
}

/* --- ops through the rings: results, and the socket's checks --- */
static struct ccs__ring_op all_reduce(uint64_t comm, uint64_t send_buf, uint64_t send_off,
                                      uint64_t recv_buf, uint64_t recv_off, uint64_t count) {
  return (struct ccs__ring_op){.comm = comm, .kind = CCS__ALL_REDUCE, .count = count,
                               .dtype = CCS_FLOAT32, .redop = CCS_SUM,
                               .send = {send_buf, send_off, count * 4},
                               .recv = {recv_buf, recv_off, count * 4}};
}

static void expect_done(struct raw_ring *r, uint64_t req_id, ccs_result_t want, const char *text) {
  struct ccs__ring_done d;
  char got[CCS__ERROR_TEXT_MAX];
  raw_ring_wait(r, &d, got, sizeof(got));
  assert_int_equal(d.req_id, req_id);
  if (d.status != (int)want || (text && !strstr(got, text)))
    fail_msg("request %llu: got %s (%s), want %s (%s)", (unsigned long long)req_id,
             ccs_result_name((ccs_result_t)d.status), got, ccs_result_name(want), text ? text : "");
  assert_int_equal(d.text_len, strlen(got));
}

static void test_ops_through_the_ring(void **state) {
  struct ringed t;
  ringed_open(&t, 8192);
  struct raw_ring *r = &t.r;
  uint64_t comm = t.comm, buf = t.buf, theirs = t.theirs;
  float *p = t.p;
  uint64_t seed = test_seed();
  for (int i = 0; i < 512; i++) p[i] = (float)(test_mix(seed, (uint64_t)i) % 1000) - 500;
  float *out = p + 1024; /* the results land at byte 4096 */
  memset(out, 0xab, 4096);
  /* out of place, one rank: the sum is the input */
  struct ccs__ring_op op = all_reduce(comm, buf, 0, buf, 4096, 512);
  raw_ring_submit(r, 77, &op, 1);
  expect_done(r, 77, CCS_OK, NULL);
  assert_memory_equal(out, p, 2048);
  /* every check of a socket Submit, answered through the ring */
  memset(out, 0xab, 4096);
  struct {
    struct ccs__ring_op op;
    ccs_result_t want;
    const char *text;
  } bad[] = {
      {all_reduce(comm + 99, buf, 0, buf, 4096, 4), CCS_ERR_INVALID_ARGUMENT, "no such communicator"},
      {all_reduce(comm, buf, 0, buf, 8000, 512), CCS_ERR_INVALID_ARGUMENT, "outside its"},
      {all_reduce(comm, buf, 2, buf, 4096, 4), CCS_ERR_INVALID_ARGUMENT, "not aligned"},
      {all_reduce(comm, buf, 0, theirs, 0, 4), CCS_ERR_PERMISSION, "belongs to another client"},
      {all_reduce(comm, buf, 0, buf + 1000, 0, 4), CCS_ERR_INVALID_ARGUMENT, "not registered"},
      {all_reduce(comm, buf, 0, buf, 4096, 4), CCS_ERR_INVALID_ARGUMENT, "unknown data type"},
      {all_reduce(comm, buf, 0, buf, 4096, 4), CCS_ERR_INVALID_ARGUMENT, "unknown collective"},
      {all_reduce(comm, buf, 0, buf, 4096, 4), CCS_ERR_INVALID_ARGUMENT, "spans"},
  };
  bad[5].op.dtype = 99;
  bad[6].op.kind = 200;
  bad[7].op.recv.length = 12;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    raw_ring_submit(r, 100 + i, &bad[i].op, 1);
    expect_done(r, 100 + i, bad[i].want, bad[i].text);
  }
  /* a batch with one bad op has no effect at all */
  struct ccs__ring_op batch[3] = {all_reduce(comm, buf, 0, buf, 4096, 8),
                                  all_reduce(comm, buf, 0, theirs, 0, 8),
                                  all_reduce(comm, buf, 0, buf, 6144, 8)};
  raw_ring_submit(r, 200, batch, 3);
  expect_done(r, 200, CCS_ERR_PERMISSION, "op 1 of the group");
  for (int i = 0; i < 1024; i++) assert_int_equal(((uint32_t *)out)[i], 0xabababab);
  for (int i = 0; i < 1024; i++) assert_int_equal(((uint32_t *)t.theirs_map)[i], 0xcdcdcdcd);
  /* calls in a CUDA stream's order: on host buffers, with flags the ring
   * has not, or with ops of one batch that disagree on them, refused with
   * no effect; where the flags exist the client's stream is let go */
  struct ccs__ring_op flagged[2] = {all_reduce(comm, buf, 0, buf, 4096, 8),
                                    all_reduce(comm, buf, 32, buf, 4128, 8)};
  for (int k = 0; k < 2; k++)
    flagged[k].flags = CCS__RING_OP_STREAM, flagged[k].order_slot = 5, flagged[k].order_gen = 9;
  atomic_store(&r->sh->flags.done[5], 3);
  raw_ring_submit(r, 210, flagged, 2);
  expect_done(r, 210, CCS_ERR_INVALID_ARGUMENT, "orders device buffers");
  assert_int_equal(atomic_load(&r->sh->flags.done[5]), 9);
  flagged[1].order_gen = 10;
  raw_ring_submit(r, 211, flagged, 2);
  expect_done(r, 211, CCS_ERR_INVALID_ARGUMENT, "op 1 of the call is not in its stream order");
  flagged[1].order_gen = 9;
  flagged[0].order_slot = flagged[1].order_slot = CCS__RING_ENTRIES;
  raw_ring_submit(r, 212, flagged, 2);
  expect_done(r, 212, CCS_ERR_INVALID_ARGUMENT, "stream flags 256 of a ring of 256");
  flagged[0].flags = 8;
  raw_ring_submit(r, 213, flagged, 1);
  expect_done(r, 213, CCS_ERR_INVALID_ARGUMENT, "unknown flags 0x8");
  flagged[0].flags = CCS__RING_OP_STREAM | CCS__RING_OP_PART; /* whole_count in the order's words */
  raw_ring_submit(r, 214, flagged, 1);
  expect_done(r, 214, CCS_ERR_INVALID_ARGUMENT, "op 0 of the call is a part in a CUDA stream's order");
  for (int i = 0; i < 1024; i++) assert_int_equal(((uint32_t *)out)[i], 0xabababab);
  /* a full batch, every op applied */
  struct ccs__ring_op many[CCS__RING_BATCH_MAX];
  for (uint32_t i = 0; i < CCS__RING_BATCH_MAX; i++) many[i] = all_reduce(comm, buf, 4 * i, buf, 4096 + 4 * i, 1);
  raw_ring_submit(r, 300, many, CCS__RING_BATCH_MAX);
  expect_done(r, 300, CCS_OK, NULL);
  assert_memory_equal(out, p, 4 * CCS__RING_BATCH_MAX);
  /* the socket serves on */
  raw_send_get_unique_id(t.fd, 8);
  raw_expect(t.fd, CCS_OK);
  ringed_close(&t);
  assert_daemon_serves(2);
}

/* --- impossible rings close that connection only --- */
static void publish(struct raw_ring *r, uint32_t n) {
  r->sub_tail += n;
  atomic_store(&r->sh->sub_tail, r->sub_tail);
  uint64_t one = 1;
  assert_int_equal(write(r->bell, &one, sizeof(one)), sizeof(one));
}

static void spoil_tail(struct raw_ring *r, uint64_t comm, uint64_t buf) {
  (void)comm, (void)buf;
  publish(r, CCS__RING_ENTRIES + 1);
}

static void spoil_first(struct raw_ring *r, uint64_t comm, uint64_t buf) {
  struct ccs__ring_op *e = &r->sh->sub[r->sub_tail % CCS__RING_ENTRIES];
  *e = all_reduce(comm, buf, 0, buf, 0, 1);
  e->index = 1;
  e->nops = 2;
  publish(r, 2);
}

static void spoil_size(struct raw_ring *r, uint64_t comm, uint64_t buf) {
  struct ccs__ring_op *e = &r->sh->sub[r->sub_tail % CCS__RING_ENTRIES];
  *e = all_reduce(comm, buf, 0, buf, 0, 1);
  e->nops = CCS__RING_BATCH_MAX + 1;
  publish(r, CCS__RING_BATCH_MAX + 1);
}

static void spoil_batch(struct raw_ring *r, uint64_t comm, uint64_t buf) {
  for (uint32_t i = 0; i < 3; i++) {
    struct ccs__ring_op *e = &r->sh->sub[(r->sub_tail + i) % CCS__RING_ENTRIES];
    *e = all_reduce(comm, buf, 0, buf, 0, 1);
    e->req_id = i == 2 ? 8 : 7; /* its last entry belongs to another call */
    e->index = i;
    e->nops = 3;
  }
  publish(r, 3);
}

static void spoil_done_head(struct raw_ring *r, uint64_t comm, uint64_t buf) {
  atomic_store(&r->sh->done_head, 12345); /* taken completions never published */
  struct ccs__ring_op op = all_reduce(comm, buf, 0, buf, 0, 1);
  raw_ring_submit(r, 1, &op, 1);
}

static void expect_closed_for(void (*spoil)(struct raw_ring *, uint64_t, uint64_t), const char *text) {
  int fd = connected();
  struct raw_ring r;
  assert_int_equal(raw_ring_setup(fd, &r), CCS_OK);
  uint64_t comm = raw_comm_of_one(fd);
  void *map;
  uint64_t buf = buffer_of(fd, 4096, &map);
  spoil(&r, comm, buf);
  Ccs__Reply *last = raw_reply(fd);
  assert_non_null(last);
  assert_int_equal(last->id, 0);
  assert_int_equal(last->status, CCS_ERR_PROTOCOL);
  if (!strstr(last->error, "fast path") || !strstr(last->error, text))
    fail_msg("closed saying '%s', want '%s'", last->error, text);
  ccs__reply__free_unpacked(last, NULL);
  raw_expect_closed(fd);
  munmap(map, 4096);
  raw_ring_close(&r);
}

static void test_impossible_rings_close_their_connection(void **state) {
  expect_closed_for(spoil_tail, "past what the ring holds");
  expect_closed_for(spoil_first, "does not start with its first op");
  expect_closed_for(spoil_size, "too many ops");
  expect_closed_for(spoil_batch, "do not hang together");
  expect_closed_for(spoil_done_head, "completion ring is full");
  assert_daemon_serves(2);
}

/* --- entries rewritten while the daemon takes them --- */
struct rewriter {
  struct raw_ring *r;
  uint64_t own, theirs;
  atomic_int stop;
};

static void *rewrite(void *arg) {
  struct rewriter *w = arg;
  for (uint64_t k = 0; !atomic_load(&w->stop); k++)
    for (uint32_t i = 0; i < CCS__RING_ENTRIES; i++)
      ((volatile struct ccs__ring_op *)&w->r->sh->sub[i])->recv.buffer = (k + i) & 1 ? w->theirs : w->own;
  return NULL;
}

static void test_entries_rewritten_after_publishing(void **state) {
  struct ringed t;
  ringed_open(&t, 4096);
  struct raw_ring *r = &t.r;
  uint64_t comm = t.comm, buf = t.buf;
  for (int i = 0; i < 16; i++) t.p[i] = (float)i;
  struct rewriter w = {r, buf, t.theirs, 0};
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, rewrite, &w), 0);
  int ok = 0, refused = 0;
  for (int k = 0; k < 2000; k++) {
    struct ccs__ring_op op = all_reduce(comm, buf, 0, buf, 1024, 16);
    raw_ring_submit(r, (uint64_t)k, &op, 1);
    struct ccs__ring_done d;
    char text[CCS__ERROR_TEXT_MAX];
    raw_ring_wait(r, &d, text, sizeof(text));
    assert_int_equal(d.req_id, (uint64_t)k);
    if (d.status == CCS_OK) ok++;
    else if (d.status == CCS_ERR_PERMISSION && strstr(text, "another client")) refused++;
    else fail_msg("op %d: %s (%s)", k, ccs_result_name((ccs_result_t)d.status), text);
  }
  atomic_store(&w.stop, 1);
  pthread_join(thread, NULL);
  /* whatever the daemon read, it acted on what it checked: never on theirs */
  for (int i = 0; i < 1024; i++) assert_int_equal(((uint32_t *)t.theirs_map)[i], 0xcdcdcdcd);
  print_message("rewritten entries: %d ops ran, %d refused\n", ok, refused);
  assert_int_equal(ok + refused, 2000);
  ringed_close(&t);
  assert_daemon_serves(2);
}

/* --- a client killed between publishing an op and ringing the bell --- */
/* Plain calls (no cmocka: this runs in a forked rank): the reply's status. */
static int call(int fd, struct frame f, const int *fds, int nfds, uint64_t *ret_value) {
  if (!f.data || frame_send(fd, f.data, f.len, fds, nfds, 0) != (ssize_t)f.len) return -1;
  free(f.data);
  uint8_t hdr[4], body[4096];
  if (read(fd, hdr, 4) != 4) return -1;
  uint32_t len = hdr[0] | hdr[1] << 8 | hdr[2] << 16 | (uint32_t)hdr[3] << 24;
  if (len > sizeof(body)) return -1;
  for (uint32_t got = 0; got < len;) {
    ssize_t n = read(fd, body + got, len - got);
    if (n <= 0) return -1;
    got += (uint32_t)n;
  }
  Ccs__Reply *r = ccs__reply_unpack(body, len);
  if (!r) return -1;
  int status = r->status;
  if (ret_value && r->body_case == CCS__REPLY__BODY_COMM_INIT) *ret_value = r->comm_init->comm;
  if (ret_value && r->body_case == CCS__REPLY__BODY_MEM_REGISTER) *ret_value = r->mem_register->buffer;
  ccs__reply__free_unpacked(r, NULL);
  return status;
}

static int unrung_rank(int rank, int n, void *arg) {
  (void)arg;
  if (rank == 0) { /* a well-behaved rank: its call ends, with the op or the other's loss */
    ccs_comm_t *comm;
    if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 10;
    int v = 1, out = 0;
    ccs_result_t rc = ccs_all_reduce(&v, &out, 1, CCS_INT32, CCS_SUM, comm, NULL);
    int ok = (rc == CCS_OK && out == 3) ||
             (rc == CCS_ERR_PEER_LOST && strstr(ccs_comm_last_error(comm), "rank 1"));
    if (!ok) fprintf(stderr, "rank 0: %s: %s\n", ccs_result_name(rc), ccs_comm_last_error(comm));
    ccs_comm_destroy(comm);
    return !ok;
  }
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof(a.sun_path), "%s", sh->socket);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a))) return 20;
  if (call(fd, frame_hello(1, CCS__PROTOCOL_VERSION), NULL, 0, NULL) != CCS_OK) return 21;
  int memfd = memfd_create("ring", MFD_CLOEXEC | MFD_ALLOW_SEALING), bell = eventfd(0, EFD_CLOEXEC);
  if (ftruncate(memfd, CCS__RING_BYTES) || fcntl(memfd, F_ADD_SEALS, SEALS)) return 22;
  struct ccs__ring_shared *rs = mmap(NULL, CCS__RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  *rs = (struct ccs__ring_shared){.magic = CCS__RING_MAGIC, .protocol = CCS__PROTOCOL_VERSION,
                                  .entries = CCS__RING_ENTRIES, .batch_max = CCS__RING_BATCH_MAX};
  int fds[2] = {memfd, bell};
  if (call(fd, frame_ring_setup(2), fds, 2, NULL) != CCS_OK) return 23;
  uint64_t comm = 0, buf = 0;
  ProtobufCBinaryData id = {sizeof(sh->id), (uint8_t *)&sh->id};
  if (call(fd, frame_comm_init(3, id, (uint32_t)n, 1), NULL, 0, &comm) != CCS_OK) return 24;
  int data = memfd_create("data", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (ftruncate(data, 4096) || fcntl(data, F_ADD_SEALS, SEALS)) return 25;
  int *v = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, data, 0);
  *v = 2;
  if (call(fd, frame_mem_register(4), &data, 1, &buf) != CCS_OK) return 26;
  rs->sub[0] = (struct ccs__ring_op){.req_id = 5, .nops = 1, .comm = comm, .kind = CCS__ALL_REDUCE,
                                     .count = 1, .dtype = CCS_INT32, .redop = CCS_SUM,
                                     .send = {buf, 0, 4}, .recv = {buf, 0, 4}};
  atomic_store(&rs->sub_tail, 1);
  raise(SIGKILL); /* before the doorbell */
  return 27;
}

static void test_killed_before_the_doorbell(void **state) {
  /* a daemon that sleeps at once: only the bell (or the socket) wakes it */
  const char *args[] = {"--poll-spin-us", "0", NULL};
  assert_int_equal(test_daemon_start(&second, args), 0);
  snprintf(sh->socket, sizeof(sh->socket), "%s", second.socket);
  struct test_daemon_state before;
  test_daemon_state(&second, &before);
  for (int round = 0; round < 5; round++) {
    id_from(second.socket, &sh->id);
    int statuses[2];
    test_run_ranks(2, unrung_rank, NULL, 30, statuses);
    assert_int_equal(statuses[0], 0);
    assert_int_equal(statuses[1], 128 + SIGKILL);
  }
  test_daemon_assert_clean(&second, &before);
  assert_int_equal(test_daemon_stop(&second), 0);
  setenv("CCS_SOCKET", daemon_.socket, 1);
  assert_daemon_serves(2);
}

/* --- the daemon dies under clients asleep on their completions --- */
#define SLEEPERS 3
static int sleeping_rank(int rank, int n, void *arg) {
  (void)arg;
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 10;
  if (rank == SLEEPERS) { /* never calls: the others wait, asleep after their spin */
    while (sh->killed_at == 0) usleep(1000);
    ccs_comm_destroy(comm); /* the daemon is gone: it frees what it holds */
    return 0;
  }
  int v = 1, out;
  ccs_result_t rc = ccs_all_reduce(&v, &out, 1, CCS_INT32, CCS_SUM, comm, NULL);
  double late = test_now() - sh->killed_at;
  /* woken by the socket's hang-up, checked every 50 ms (ring.c); a second
   * leaves room for a loaded machine */
  int ok = rc == CCS_ERR_DAEMON_UNAVAILABLE && sh->killed_at > 0 && late < 1.0;
  if (!ok) fprintf(stderr, "rank %d: %s %.3f s after the kill\n", rank, ccs_result_name(rc), late);
  else fprintf(stderr, "rank %d: the daemon's death seen after %.0f ms\n", rank, late * 1000);
  ccs_comm_destroy(comm);
  return !ok;
}

static void test_daemon_dies_under_a_sleeper(void **state) {
  assert_int_equal(test_daemon_start(&second, NULL), 0);
  id_from(second.socket, &sh->id);
  sh->killed_at = 0;
  pid_t child = fork();
  if (child == 0) { /* every sleeper woken, each within the bound (a job that
                      * does not wait for the daemon to come back) */
    setenv("CCS_RECONNECT_TIMEOUT", "0", 1);
    int statuses[SLEEPERS + 1], bad = 0;
    test_run_ranks(SLEEPERS + 1, sleeping_rank, NULL, 30, statuses);
    for (int r = 0; r <= SLEEPERS; r++) bad |= statuses[r] != 0;
    _exit(bad);
  }
  usleep(500 * 1000); /* past any spin: asleep on the futex */
  sh->killed_at = test_now();
  test_daemon_kill(&second);
  int status;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  test_daemon_stop(&second);
  setenv("CCS_SOCKET", daemon_.socket, 1);
  assert_daemon_serves(2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_setup_refused),
      cmocka_unit_test(test_libccs_takes_the_fast_path),
      cmocka_unit_test(test_ops_through_the_ring),
      cmocka_unit_test(test_impossible_rings_close_their_connection),
      cmocka_unit_test(test_entries_rewritten_after_publishing),
      cmocka_unit_test(test_killed_before_the_doorbell),
      cmocka_unit_test(test_daemon_dies_under_a_sleeper),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
