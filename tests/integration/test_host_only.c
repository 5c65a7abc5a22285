/* A machine without a GPU or CUDA driver (these machines, CI): the daemon
 * runs host-only and every device request gets a clear error, from the
 * library and from the daemon, while host collectives go on working. A
 * client that speaks the protocol by hand asks for what libccs would on a
 * GPU machine (device registration) and for what it never would (unknown
 * domains). */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "raw.h"

static struct test_daemon dmn;
static struct test_daemon_state clean;

static int setup(void **state) {
  if (test_daemon_start(&dmn, NULL)) return -1;
  /* the baseline: only the connection asking (the start's probe may linger) */
  for (int i = 0; i < 100; i++) {
    test_daemon_state(&dmn, &clean);
    if (clean.sessions <= 1) break;
    usleep(20000);
  }
  return 0;
}

static int teardown(void **state) { return test_daemon_stop(&dmn); }

/* The reply's status, with its text checked to contain `says`. */
static ccs_result_t call(int fd, struct frame request, int pass_fd, const char *says) {
  raw_send_frame(fd, request, pass_fd);
  Ccs__Reply *r = raw_reply(fd);
  assert_non_null(r);
  ccs_result_t rc = (ccs_result_t)r->status;
  if (says && !strstr(r->error, says)) fail_msg("error \"%s\" does not say \"%s\"", r->error, says);
  ccs__reply__free_unpacked(r, NULL);
  return rc;
}

static ccs_result_t register_as(int fd, uint32_t domain, const char *says) {
  uint8_t uuid[CCS__UUID_BYTES] = {1, 2, 3}, handle[CCS__IPC_MEM_BYTES] = {4, 5, 6};
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__MemRegister m = CCS__MEM_REGISTER__INIT;
  m.domain = domain;
  m.size = 1 << 21;
  m.device = (ProtobufCBinaryData){sizeof(uuid), uuid};
  if (domain == CCS__MEM_CUDA_IPC) m.ipc_handle = (ProtobufCBinaryData){sizeof(handle), handle};
  req.id = 11;
  req.body_case = CCS__REQUEST__BODY_MEM_REGISTER;
  req.mem_register = &m;
  /* a legacy handle travels alone; anything else with an fd */
  int mfd = domain == CCS__MEM_CUDA_IPC ? -1 : raw_memfd(1 << 21, F_SEAL_SHRINK | F_SEAL_GROW);
  ccs_result_t rc = call(fd, frame_of(&req), mfd, says);
  if (mfd >= 0) close(mfd);
  return rc;
}

static void test_daemon_refuses_device_requests(void **state) {
  int fd = raw_connect(dmn.socket);
  raw_hello(fd);
  assert_int_equal(register_as(fd, CCS__MEM_CUDA, "host-only"), CCS_ERR_UNSUPPORTED);
  assert_int_equal(register_as(fd, 9, "unknown memory domain"), CCS_ERR_INVALID_ARGUMENT);
  /* legacy CUDA IPC handles are bearer tokens: off unless the operator says */
  assert_int_equal(register_as(fd, CCS__MEM_CUDA_IPC, "cuda_legacy_ipc = true"), CCS_ERR_PERMISSION);

  /* host collectives go on over the same connection */
  uint64_t comm = raw_comm_of_one(fd);
  Ccs__Op op = CCS__OP__INIT;
  Ccs__Op *ops[1] = {&op};
  op.comm = comm;
  op.kind = CCS__BARRIER;
  assert_int_equal(call(fd, frame_submit(14, ops, 1), -1, NULL), CCS_OK);
  close(fd);
  test_daemon_assert_clean(&dmn, &clean);
}

/* With the switch on, a host-only daemon still has no GPU to open them on. */
static void test_legacy_ipc_switch(void **state) {
  struct test_daemon trusting;
  const char *args[] = {"--cuda-legacy-ipc", "true", NULL};
  assert_int_equal(test_daemon_start(&trusting, args), 0);
  int fd = raw_connect(trusting.socket);
  raw_hello(fd);
  assert_int_equal(register_as(fd, CCS__MEM_CUDA_IPC, "host-only"), CCS_ERR_UNSUPPORTED);
  close(fd);
  assert_int_equal(test_daemon_stop(&trusting), 0);
  setenv("CCS_SOCKET", dmn.socket, 1); /* test_daemon_start pointed it at the other one */
}

static int one_rank(int rank, int nranks, void *arg) {
  ccs_unique_id_t id;
  ccs_comm_t *comm;
  void *dev = NULL;
  int32_t x[4] = {1, 2, 3, 4}, y[4];
  if (ccs_mem_alloc_device(&dev, 4096, 0) != CCS_ERR_UNSUPPORTED || dev) return 1;
  if (ccs_mem_alloc_device(&dev, 4096, -1) != CCS_ERR_INVALID_ARGUMENT) return 2;
  if (ccs_mem_register(x, sizeof(x)) != CCS_ERR_UNSUPPORTED) return 7; /* host memory, no CUDA */
  if (ccs_mem_deregister(x) != CCS_ERR_INVALID_ARGUMENT) return 8;
  if (ccs_get_unique_id(&id) || ccs_comm_init_rank(&comm, 1, id, 0)) return 3;
  /* a stream promises device buffers: no CUDA here, and the text says so */
  if (ccs_all_reduce(x, y, 4, CCS_INT32, CCS_SUM, comm, (ccs_stream_t)0x1) != CCS_ERR_UNSUPPORTED)
    return 4;
  if (!strstr(ccs_comm_last_error(comm), "CUDA")) {
    fprintf(stderr, "error text: %s\n", ccs_comm_last_error(comm));
    return 5;
  }
  /* the comm is not hurt: host collectives still run */
  if (ccs_all_reduce(x, y, 4, CCS_INT32, CCS_SUM, comm, NULL) || memcmp(x, y, sizeof(x))) return 6;
  return ccs_comm_destroy(comm) != CCS_OK;
}

static void test_library_refuses_device_requests(void **state) {
  assert_int_equal(test_run_ranks(1, one_rank, NULL, 30, NULL), 0);
  test_daemon_assert_clean(&dmn, &clean);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_daemon_refuses_device_requests),
      cmocka_unit_test(test_legacy_ipc_switch),
      cmocka_unit_test(test_library_refuses_device_requests),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
