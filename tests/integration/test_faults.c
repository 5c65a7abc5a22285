/* Faults on one node: a rank killed while others wait, mismatched
 * arguments, bad arguments, garbage on the socket, the init deadline, no
 * daemon, a daemon that dies under blocked clients. Each case checks that
 * the right ranks get the right error and that the daemon keeps serving. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "raw.h"
#include "serving.h"

struct shared {
  ccs_unique_id_t id;
  int mode;
  pid_t culprit; /* the rank the others' errors must name */
};
static struct shared *sh;
static struct test_daemon daemon_;
static struct test_daemon_state clean;

static int setup(void **state) {
  const char *args[] = {"--init-timeout", "2", NULL};
  sh = test_shared_new(sizeof(*sh));
  return sh ? test_daemon_start_clean(&daemon_, args, &sh->id, &clean) : -1;
}

static int teardown(void **state) {
  int rc = test_daemon_stop(&daemon_);
  test_shared_free(sh, sizeof(*sh));
  return rc;
}

/* Every row ends here: a fresh comm of n ranks gets a correct sum from the
 * executor, and the daemon holds nothing more than before. */
static void assert_daemon_serves(int n) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_sum(n, &sh->id, &test_sum_executor, 0, 60), 0);
  test_daemon_assert_clean(&daemon_, &clean);
}

/* --- a rank dies while the others wait in a collective --- */
static int dying_rank(int rank, int n, void *arg) {
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 10;
  if (rank == n - 1) {
    sh->culprit = getpid();
    if (raw_wait_ops_in_flight(daemon_.socket, (uint64_t)n - 1, 20)) return 11; /* the others are blocked */
    raise(SIGKILL);
  }
  float x[1000] = {0}, y[1000];
  ccs_result_t rc = ccs_all_reduce(x, y, 1000, CCS_FLOAT32, CCS_SUM, comm, NULL);
  const char *err = ccs_comm_last_error(comm);
  char want[64];
  snprintf(want, sizeof(want), "rank %d (pid %d) disconnected", n - 1, (int)sh->culprit);
  int ok = rc == CCS_ERR_PEER_LOST && strstr(err, want) != NULL;
  if (!ok) fprintf(stderr, "rank %d: got %s: %s\n", rank, ccs_result_name(rc), err);
  /* the comm stays failed: the next call says so at once */
  rc = ccs_all_reduce(x, y, 1000, CCS_FLOAT32, CCS_SUM, comm, NULL);
  ok = ok && rc == CCS_ERR_PEER_LOST;
  ccs_result_t async;
  ok = ok && ccs_comm_get_async_error(comm, &async) == CCS_OK && async == CCS_ERR_PEER_LOST;
  ccs_comm_destroy(comm);
  return ok ? 0 : 1;
}

static void test_rank_killed(void **state) {
  test_new_id(&sh->id);
  int st[3];
  test_run_ranks(3, dying_rank, NULL, 60, st);
  assert_int_equal(st[0], 0);
  assert_int_equal(st[1], 0);
  assert_int_equal(st[2], 128 + SIGKILL);
  assert_daemon_serves(3);
}

/* --- mismatched arguments: every rank gets the error, the comm survives --- */
static int mismatch_rank(int rank, int n, void *arg) {
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 10;
  int fails = 0;
  int32_t x[16] = {0}, y[16 * 8];
  for (int c = 0; c < 5; c++) {
    int odd = rank == 1; /* rank 1 differs */
    ccs_result_t rc;
    const char *field;
    switch (c) {
    case 0: field = "count=15"; rc = ccs_all_reduce(x, y, odd ? 15 : 16, CCS_INT32, CCS_SUM, comm, NULL); break;
    case 1: field = "dtype=uint32"; rc = ccs_all_reduce(x, y, 16, odd ? CCS_UINT32 : CCS_INT32, CCS_SUM, comm, NULL); break;
    case 2: field = "op=max"; rc = ccs_all_reduce(x, y, 16, CCS_INT32, odd ? CCS_MAX : CCS_SUM, comm, NULL); break;
    case 3: field = "root=1"; rc = ccs_broadcast(x, y, 16, CCS_INT32, odd ? 1 : 0, comm, NULL); break;
    default: field = "all_gather"; rc = odd ? ccs_all_gather(x, y, 16, CCS_INT32, comm, NULL)
                                          : ccs_all_reduce(x, y, 16, CCS_INT32, CCS_SUM, comm, NULL); break;
    }
    const char *err = ccs_comm_last_error(comm);
    if (rc != CCS_ERR_MISMATCH || !strstr(err, "rank 1") || !strstr(err, field)) {
      fprintf(stderr, "rank %d case %d: %s: %s\n", rank, c, ccs_result_name(rc), err);
      fails++;
    }
  }
  /* still usable, and op numbers still agree */
  int v = rank, sum = -1;
  if (ccs_all_reduce(&v, &sum, 1, CCS_INT32, CCS_SUM, comm, NULL) != CCS_OK || sum != n * (n - 1) / 2)
    fails++;
  /* a send and a receive that disagree */
  if (n >= 2 && rank < 2) {
    int32_t buf[4] = {0};
    ccs_result_t rc = rank == 0 ? ccs_send(buf, 4, CCS_INT32, 1, comm, NULL)
                                : ccs_recv(buf, 3, CCS_INT32, 0, comm, NULL);
    if (rc != CCS_ERR_MISMATCH) fails++;
  }
  ccs_comm_destroy(comm);
  return fails;
}

static void test_mismatch(void **state) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(3, mismatch_rank, NULL, 60, NULL), 0);
  assert_daemon_serves(2);
}

/* Large calls on unregistered memory go in parts (client/parts.c). Ranks
 * whose calls disagree are refused at the first part, before anything is
 * written: counts that differ only in the last part, parts of another
 * size; in place and out of place. Ranks that make the same call, some in
 * parts and some whole (a rank's buffers registered, or its parts turned
 * off), all get it right: the call goes whole. */
#define PARTS_COUNT (((size_t)3 << 20) / 4 + 1) /* int32: 4 parts of 1 MiB */
static int parts_mismatch_rank(int rank, int n, void *arg) {
  unsetenv("CCS_RING"); /* parts go through the rings (in the socket run too) */
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 10;
  int fails = 0;
  size_t cnt = PARTS_COUNT + 1;
  int32_t *orig = malloc(cnt * 4), *plain_in = malloc(cnt * 4), *plain_out = malloc(cnt * 4);
  int32_t *reg_in, *reg_out;
  if (ccs_mem_alloc((void **)&reg_in, cnt * 4) != CCS_OK || ccs_mem_alloc((void **)&reg_out, cnt * 4) != CCS_OK)
    return 11;
  for (size_t i = 0; i < cnt; i++) orig[i] = (int32_t)(i * 7 + (size_t)rank);
  for (int c = 0; c < 8; c++) {
    int odd = rank == 1, in_place = c & 1, variant = c / 2, refused = variant == 0 || variant == 2;
    size_t count = PARTS_COUNT;
    int32_t *in = odd && variant == 3 ? reg_in : plain_in, *out = in_place ? in : odd && variant == 3 ? reg_out : plain_out;
    if (variant == 0 && odd) count++;                                         /* the last part differs */
    if (variant == 1 && odd) setenv("CCS_STAGED_PART_BYTES", "0", 1);       /* whole */
    if (variant == 2 && odd) setenv("CCS_STAGED_PART_BYTES", "524288", 1);  /* other parts */
    memcpy(in, orig, cnt * 4);
    if (!in_place) memset(out, 0x5a, cnt * 4);
    ccs_result_t rc = ccs_all_reduce(in, out, count, CCS_INT32, CCS_SUM, comm, NULL);
    unsetenv("CCS_STAGED_PART_BYTES");
    const char *err = ccs_comm_last_error(comm);
    if (refused ? rc != CCS_ERR_MISMATCH || !strstr(err, "rank 1") ||
                      (variant == 0 && !strstr(err, "a part of a call of count=786434"))
                : rc != CCS_OK) {
      fprintf(stderr, "rank %d parts case %d: %s: %s\n", rank, c, ccs_result_name(rc), err);
      fails++;
    }
    size_t wrong = 0;
    for (size_t i = 0; i < cnt; i++)
      if (refused) /* not an element written */
        wrong += in[i] != orig[i] || (!in_place && out[i] != 0x5a5a5a5a);
      else /* every element right, nothing past the call's */
        wrong += out[i] != (i < PARTS_COUNT ? (int32_t)(i * 7 * (size_t)n + (size_t)(n * (n - 1) / 2))
                                            : in_place ? orig[i] : 0x5a5a5a5a);
    if (wrong) {
      fprintf(stderr, "rank %d parts case %d: %zu elements wrong\n", rank, c, wrong);
      fails++;
    }
  }
  free(orig);
  free(plain_in);
  free(plain_out);
  ccs_mem_free(reg_in);
  ccs_mem_free(reg_out);
  ccs_comm_destroy(comm);
  return fails;
}

static void test_parts_mismatch(void **state) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(3, parts_mismatch_rank, NULL, 120, NULL), 0);
  assert_daemon_serves(2);
}

/* --- bad arguments: local, non-fatal, no effect --- */
static int bad_args_rank(int rank, int n, void *arg) {
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 10;
  int fails = 0;
  int32_t x[4] = {1, 2, 3, 4}, y[4];
  fails += ccs_all_reduce(x, y, 4, (ccs_dtype_t)99, CCS_SUM, comm, NULL) != CCS_ERR_INVALID_ARGUMENT;
  fails += ccs_all_reduce(x, y, 4, CCS_INT32, (ccs_redop_t)42, comm, NULL) != CCS_ERR_INVALID_ARGUMENT;
  fails += ccs_broadcast(x, y, 4, CCS_INT32, n, comm, NULL) != CCS_ERR_INVALID_ARGUMENT;
  fails += ccs_send(x, 4, CCS_INT32, -1, comm, NULL) != CCS_ERR_INVALID_ARGUMENT;
  fails += ccs_all_reduce(NULL, y, 4, CCS_INT32, CCS_SUM, comm, NULL) != CCS_ERR_INVALID_ARGUMENT;
  fails += ccs_all_reduce(x, y, 4, CCS_INT32, CCS_SUM, NULL, NULL) != CCS_ERR_INVALID_ARGUMENT;
  fails += ccs_all_reduce(x, y, 4, CCS_INT32, CCS_SUM, comm, (ccs_stream_t)0x1) != CCS_ERR_UNSUPPORTED;
  fails += ccs_all_reduce(x, y, SIZE_MAX / 2, CCS_INT32, CCS_SUM, comm, NULL) != CCS_ERR_INVALID_ARGUMENT;
  fails += ccs_group_end() != CCS_ERR_INVALID_USAGE;
  fails += ccs_mem_free(x) != CCS_ERR_INVALID_ARGUMENT;
  void *p;
  fails += ccs_mem_alloc(&p, 0) != CCS_ERR_INVALID_ARGUMENT;
  if (fails) fprintf(stderr, "rank %d: %d bad-argument checks failed\n", rank, fails);
  /* none of it counted as an op */
  if (ccs_all_reduce(x, y, 4, CCS_INT32, CCS_SUM, comm, NULL) != CCS_OK || y[3] != 4 * n) fails++;
  ccs_comm_destroy(comm);
  return fails;
}

static void test_bad_arguments(void **state) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(2, bad_args_rank, NULL, 60, NULL), 0);
  ccs_comm_t *comm;
  ccs_unique_id_t junk;
  memset(&junk, 0x42, sizeof(junk));
  assert_int_equal(ccs_comm_init_rank(&comm, 2, junk, 0), CCS_ERR_INVALID_ARGUMENT);
  assert_int_equal(ccs_comm_init_rank(&comm, 2, sh->id, 2), CCS_ERR_INVALID_ARGUMENT);
  assert_int_equal(ccs_comm_init_rank(NULL, 2, sh->id, 0), CCS_ERR_INVALID_ARGUMENT);
  assert_daemon_serves(2);
}

/* --- the init deadline names the missing rank --- */
static int late_rank(int rank, int n, void *arg) {
  if (rank == n - 1) return 0; /* never joins */
  ccs_comm_t *comm;
  ccs_result_t rc = ccs_comm_init_rank(&comm, n, sh->id, rank);
  const char *err = ccs_comm_last_error(NULL);
  if (rc != CCS_ERR_TIMEOUT || !strstr(err, "rank(s) 2 never")) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, ccs_result_name(rc), err);
    return 1;
  }
  return 0;
}

static void test_init_timeout(void **state) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(3, late_rank, NULL, 30, NULL), 0);
  assert_daemon_serves(2);
}

/* --- raw protocol abuse --- */
static int raw(void) { return raw_connect(daemon_.socket); }

static void test_garbage_and_oversized_frames(void **state) {
  /* garbage bytes */
  int fd = raw();
  uint8_t junk[64];
  for (size_t i = 0; i < sizeof(junk); i++) junk[i] = (uint8_t)(i * 37 + 11);
  junk[0] = 60, junk[1] = junk[2] = junk[3] = 0; /* a plausible length, junk inside */
  raw_send(fd, junk, sizeof(junk), NULL, 0);
  raw_expect(fd, CCS_ERR_PROTOCOL);
  raw_expect_closed(fd);
  /* a length over the cap, nothing allocated for it */
  fd = raw();
  uint8_t huge[4] = {0xff, 0xff, 0xff, 0x7f};
  raw_send(fd, huge, 4, NULL, 0);
  raw_expect(fd, CCS_ERR_PROTOCOL);
  raw_expect_closed(fd);
  /* a request before the hello */
  fd = raw();
  raw_send_get_unique_id(fd, 5);
  raw_expect(fd, CCS_ERR_PROTOCOL);
  raw_expect_closed(fd);
  /* another protocol version, one it no longer serves: both named */
  fd = raw();
  raw_send_hello(fd, 999);
  raw_expect(fd, CCS_ERR_VERSION);
  raw_expect_closed(fd);
  fd = raw();
  raw_send_hello(fd, CCS__PROTOCOL_OLDEST - 1);
  Ccs__Reply *old = raw_reply(fd);
  assert_non_null(old);
  assert_int_equal(old->status, CCS_ERR_VERSION);
  char both[96];
  snprintf(both, sizeof(both), "client speaks protocol %u, daemon speaks %u", CCS__PROTOCOL_OLDEST - 1,
           CCS__PROTOCOL_VERSION);
  assert_non_null(strstr(old->error, both));
  ccs__reply__free_unpacked(old, NULL);
  raw_expect_closed(fd);
  /* the protocol before (a client of a daemon before an upgrade): served */
  fd = raw();
  raw_send_hello(fd, CCS__PROTOCOL_OLDEST);
  raw_expect(fd, CCS_OK);
  raw_send_get_unique_id(fd, 2);
  raw_expect(fd, CCS_OK);
  close(fd);
  /* a half frame, then the client vanishes */
  fd = raw();
  raw_send(fd, huge, 2, NULL, 0);
  close(fd);
  /* a file descriptor riding on a frame that takes none */
  fd = raw();
  raw_hello(fd);
  raw_send_frame(fd, frame_get_unique_id(6), STDIN_FILENO);
  raw_expect(fd, CCS_OK); /* the request itself is answered... */
  raw_expect(fd, CCS_ERR_PROTOCOL); /* ...then the stray fd ends the session */
  raw_expect_closed(fd);
  assert_daemon_serves(2);
}

static void test_buffer_checks(void **state) {
  int fd = raw();
  raw_hello(fd);
  /* an unsealed memfd could shrink under the daemon: refused */
  int unsealed = raw_memfd(4096, 0);
  assert_int_equal(raw_register(fd, unsealed, NULL), CCS_ERR_INVALID_ARGUMENT);
  /* sealed ones are fine: the target, and a source of other bytes */
  int sealed = raw_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW), other = raw_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW);
  unsigned char *target = raw_map(sealed, 4096), *source = raw_map(other, 4096);
  uint64_t buf = 0, src = 0;
  assert_int_equal(raw_register(fd, sealed, &buf), CCS_OK);
  assert_int_equal(raw_register(fd, other, &src), CCS_OK);
  close(unsealed);
  close(sealed);
  close(other);
  uint64_t comm = raw_comm_of_one(fd); /* to submit ops on */

  /* each op: from the source (a valid range of the op's length, where it
   * has one) into the range named here; a refused one writes nothing */
  struct {
    uint64_t buffer, offset, length, count;
    ccs_result_t want;
  } cases[] = {
      {buf, 4096, 4, 1, CCS_ERR_INVALID_ARGUMENT},          /* past the end */
      {buf, 4092, 8, 2, CCS_ERR_INVALID_ARGUMENT},          /* across the end */
      {buf, 2, 4, 1, CCS_ERR_INVALID_ARGUMENT},             /* misaligned */
      {buf, UINT64_MAX - 3, 4, 1, CCS_ERR_INVALID_ARGUMENT}, /* offset + length wraps */
      {buf, 0, 8, 1, CCS_ERR_INVALID_ARGUMENT},             /* length disagrees with count */
      {buf + 100, 0, 4, 1, CCS_ERR_INVALID_ARGUMENT},       /* not registered */
      {buf, 0, 0, UINT64_MAX / 2, CCS_ERR_INVALID_ARGUMENT}, /* count * size overflows */
      {buf, 4, 4092, 1023, CCS_OK},
      {buf, 0, 4096, 1024, CCS_OK},
  };
  memset(source, 0x11, 4096);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    memset(target, 0x5a, 4096);
    Ccs__BufRef from = CCS__BUF_REF__INIT, into = CCS__BUF_REF__INIT;
    from.buffer = src;
    from.length = cases[i].count <= 1024 ? cases[i].count * 4 : 0;
    into.buffer = cases[i].buffer;
    into.offset = cases[i].offset;
    into.length = cases[i].length;
    raw_send_all_reduce_into(fd, 100 + i, comm, &from, &into, cases[i].count);
    raw_expect(fd, cases[i].want);
    /* refused: no byte written; done: exactly its range, from the source */
    size_t lo = cases[i].want == CCS_OK ? cases[i].offset : 0;
    size_t hi = cases[i].want == CCS_OK ? cases[i].offset + cases[i].length : 0;
    for (size_t b = 0; b < 4096; b++)
      if (target[b] != (b >= lo && b < hi ? 0x11 : 0x5a))
        fail_msg("case %zu: byte %zu of the target is 0x%02x", i, b, target[b]);
    for (size_t b = 0; b < 4096; b++) /* the source is only read */
      if (source[b] != 0x11) fail_msg("case %zu: the source changed at byte %zu", i, b);
  }
  munmap(target, 4096);
  munmap(source, 4096);
  close(fd);
  assert_daemon_serves(2);
}

/* --- a send whose receive never comes: the p2p deadline --- */
static int lonely_sender(int rank, int n, void *arg) {
  ccs_comm_t *comm;
  setenv("CCS_TIMEOUT", "1", 1);
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 10;
  if (rank == 1) { /* never receives; waits for the comm to fail */
    sh->culprit = getpid();
    ccs_result_t async = CCS_OK;
    for (double end = test_now() + 20; async == CCS_OK && test_now() < end;) {
      ccs_comm_get_async_error(comm, &async);
      usleep(10000);
    }
    ccs_comm_destroy(comm);
    return async != CCS_ERR_TIMEOUT;
  }
  int32_t buf[4] = {1, 2, 3, 4};
  double t0 = test_now();
  ccs_result_t rc = ccs_send(buf, 4, CCS_INT32, 1, comm, NULL);
  double waited = test_now() - t0;
  const char *err = ccs_comm_last_error(comm);
  char want[128];
  snprintf(want, sizeof(want), "rank 1 (pid %d) has not posted the recv matching rank 0's send", (int)sh->culprit);
  int ok = rc == CCS_ERR_TIMEOUT && strstr(err, want) && waited >= 1 - 0.025 && waited < 1 + 3;
  if (!ok) fprintf(stderr, "rank 0 after %.3f s: %s: %s\n", waited, ccs_result_name(rc), err);
  ccs_comm_destroy(comm);
  return !ok;
}

static void test_send_deadline(void **state) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(2, lonely_sender, NULL, 30, NULL), 0);
  assert_daemon_serves(2);
}

/* --- a rank killed while its large op runs on the executor --- */
static int large_op_rank(int rank, int n, void *arg) {
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 10;
  size_t count = 16 << 20; /* 64 MiB: 256 tasks */
  float *x;
  if (ccs_mem_alloc((void **)&x, count * sizeof(float)) != CCS_OK) return 11;
  memset(x, 0, count * sizeof(float));
  if (rank == n - 1) sh->culprit = getpid(); /* the test kills it mid-op */
  ccs_result_t rc = CCS_OK;
  for (double end = test_now() + 30; rc == CCS_OK && test_now() < end;)
    rc = ccs_all_reduce(x, x, count, CCS_FLOAT32, CCS_SUM, comm, NULL);
  char want[64];
  snprintf(want, sizeof(want), "rank %d (pid %d) disconnected", n - 1, (int)sh->culprit);
  int ok = rc == CCS_ERR_PEER_LOST && strstr(ccs_comm_last_error(comm), want);
  if (!ok) fprintf(stderr, "rank %d: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(comm));
  ccs_mem_free(x);
  ccs_comm_destroy(comm);
  return !ok;
}

static void test_rank_killed_mid_op(void **state) {
  test_new_id(&sh->id);
  sh->culprit = 0;
  pid_t child = fork();
  if (child == 0) {
    int st[3];
    test_run_ranks(3, large_op_rank, NULL, 60, st);
    _exit(st[0] || st[1] || st[2] != 128 + SIGKILL);
  }
  /* all three called: the op is launched, its tasks running */
  assert_int_equal(raw_wait_ops_in_flight(daemon_.socket, 3, 20), 0);
  assert_true(sh->culprit > 0);
  kill(sh->culprit, SIGKILL);
  int status;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_daemon_serves(3);
}

/* --- unregistered buffers beyond CCS_STAGING_MAX_BYTES --- */
static int staging_rank(int rank, int n, void *arg) {
  setenv("CCS_STAGING_MAX_BYTES", "2097152", 1);
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 10;
  int fails = 0;
  size_t small = 256 << 10, large = 1 << 20; /* floats: 1 MiB (fits, both ways), 4 MiB (does not) */
  float *x = malloc(large * sizeof(float)), *y = malloc(large * sizeof(float));
  for (size_t i = 0; i < large; i++) x[i] = (float)(i % 100), y[i] = -1;
  if (ccs_all_reduce(x, y, small, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK || y[99] != 99.0f * n) fails++;
  for (size_t i = 0; i < large; i++) y[i] = -1;
  setenv("CCS_STAGED_PART_BYTES", "0", 1); /* whole, not in parts (parts.c) */
  ccs_result_t rc = ccs_all_reduce(x, y, large, CCS_FLOAT32, CCS_SUM, comm, NULL);
  unsetenv("CCS_STAGED_PART_BYTES");
  if (rc != CCS_ERR_NO_MEMORY || !strstr(ccs_comm_last_error(comm), "over the limit of 2097152 (CCS_STAGING_MAX_BYTES)")) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, ccs_result_name(rc), ccs_comm_last_error(comm));
    fails++;
  }
  for (size_t i = 0; i < large; i++) fails += y[i] != -1; /* nothing written */
  /* in parts (through the rings) the same call needs no staging */
  const char *ring = getenv("CCS_RING");
  if (!ring || strcmp(ring, "0")) {
    if (ccs_all_reduce(x, y, large, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK) fails++;
    for (size_t i = 0; i < large; i++) fails += y[i] != (float)(i % 100) * n;
  }
  /* the comm is fine, and registered buffers are not staged */
  float *r;
  if (ccs_mem_alloc((void **)&r, large * sizeof(float)) != CCS_OK) return 12;
  memcpy(r, x, large * sizeof(float));
  if (ccs_all_reduce(r, r, large, CCS_FLOAT32, CCS_SUM, comm, NULL) != CCS_OK || r[large - 1] != (float)((large - 1) % 100) * n)
    fails++;
  ccs_mem_free(r);
  free(x);
  free(y);
  ccs_comm_destroy(comm);
  return fails;
}

static void test_staging_bound(void **state) {
  test_new_id(&sh->id);
  assert_int_equal(test_run_ranks(2, staging_rank, NULL, 60, NULL), 0);
  assert_daemon_serves(2);
}

/* --- the daemon dies under blocked clients, then comes back (jobs that
 * do not wait for it: CCS_RECONNECT_TIMEOUT=0; test_restart rides it) --- */
static int orphaned_rank(int rank, int n, void *arg) {
  ccs_comm_t *comm;
  if (ccs_comm_init_rank(&comm, n, sh->id, rank) != CCS_OK) return 10;
  int v = 1, out;
  /* rank n-1 never calls: the others block until the daemon dies */
  if (rank == n - 1) {
    ccs_result_t async = CCS_OK;
    while (async == CCS_OK && ccs_comm_get_async_error(comm, &async) == CCS_OK) usleep(50000);
    ccs_comm_destroy(comm);
    return async != CCS_ERR_DAEMON_UNAVAILABLE;
  }
  ccs_result_t rc = ccs_all_reduce(&v, &out, 1, CCS_INT32, CCS_SUM, comm, NULL);
  if (rc != CCS_ERR_DAEMON_UNAVAILABLE) {
    fprintf(stderr, "rank %d: %s\n", rank, ccs_result_name(rc));
    return 1;
  }
  rc = ccs_all_reduce(&v, &out, 1, CCS_INT32, CCS_SUM, comm, NULL);
  ccs_comm_destroy(comm);
  return rc != CCS_ERR_DAEMON_UNAVAILABLE;
}

static void test_daemon_gone_and_back(void **state) {
  test_new_id(&sh->id);
  pid_t child = fork();
  if (child == 0) {
    setenv("CCS_RECONNECT_TIMEOUT", "0", 1);
    _exit(test_run_ranks(3, orphaned_rank, NULL, 30, NULL));
  }
  assert_int_equal(raw_wait_ops_in_flight(daemon_.socket, 2, 20), 0); /* both calling ranks are blocked */
  test_daemon_kill(&daemon_);
  int status;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  /* no daemon: an immediate, clear error */
  ccs_unique_id_t id;
  assert_int_equal(ccs_get_unique_id(&id), CCS_ERR_DAEMON_UNAVAILABLE);
  assert_non_null(strstr(ccs_comm_last_error(NULL), "cannot connect"));
  /* back again: the same process makes new comms */
  const char *args[] = {"--init-timeout", "2", NULL};
  assert_int_equal(test_daemon_restart(&daemon_, args), 0);
  assert_daemon_serves(2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rank_killed),
      cmocka_unit_test(test_mismatch),
      cmocka_unit_test(test_parts_mismatch),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_init_timeout),
      cmocka_unit_test(test_garbage_and_oversized_frames),
      cmocka_unit_test(test_buffer_checks),
      cmocka_unit_test(test_send_deadline),
      cmocka_unit_test(test_rank_killed_mid_op),
      cmocka_unit_test(test_staging_bound),
      cmocka_unit_test(test_daemon_gone_and_back),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
