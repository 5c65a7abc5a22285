/* The configuration: every key from a file, bad values and unknown keys
 * named with file and line, and the precedence of the environment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "front/front.h"
#include "base/log.h"

static char path[64];

static void write_file(const char *text) {
  snprintf(path, sizeof(path), "/tmp/ccs-config-test-%d.conf", (int)getpid());
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
}

/* The file below names every key the daemon has (checked against what it
 * prints: a new key without a value here fails this test), each with a
 * value other than its default. */
static const char every_key[] =
    "# comment\n[ccsd]\nsocket = /tmp/x.sock\nsocket_mode = 0666\nthreads = 3\n"
             "chunk_bytes = 1M\nstream_bytes = 0\ninline_bytes = 4096\ninit_timeout = 1.5\n"
             "op_timeout = 30\nio_timeout = 2\nquota_connections = 7\nquota_comms = 8\n"
             "quota_registered_bytes = 2G\nquota_ops = 9\nallow_uids = 0, 1000,1001\n"
             "allow_gids = 5\nlog_level = info\nlog_subsys = INIT,coll\nmetrics_listen = 127.0.0.1:9464\n"
             "admin_gids = root, 4242\nquota_ranks = 64\nquota_buffers = 99\nid_ttl = 3600\n"
             "metrics_tenant_labels = true\nmetrics_max_connections = 3\n"
             "cluster_key_file = /tmp/k\nid_key_file = /tmp/ik\npeer_encrypt = 1\npeer_max_connections = 17\n"
             "peer_unexpected_bytes = 8M\npeer_unexpected_total = 1G\ntransport = auto\nlink_capacity = 10G\n"
             "ib_library = /opt/lib/libibverbs.so.1\nib_devices = mlx5_0:1,mlx5_1\nib_gid_index = 3\n"
             "scratch_keep = 3M\nalgo = all_reduce:ring;broadcast:tree:0-64K\nlisten = 127.0.0.1:7100\n"
             "advertise = 10.0.0.5:7100\npeer_connections = 3\nheartbeat = 0.25\npeer_timeout = 2.5\npeer_restart_grace = 12\npeer_replay_bytes = 64K\n"
             "cuda_legacy_ipc = true\npoll_spin_us = 77\ntenant_weights = root:2.5,4242:3\n"
             "tenant_max_share = 0.5\nexecutor_priority = IDLE\n";

static void test_every_key(void **state) {
  write_file(every_key);
  struct ccsd_config c;
  char err[512];
  ccsd_config_defaults(&c);
  assert_int_equal(ccsd_config_load_file(&c, path, 1, err, sizeof(err)), 0);
  assert_string_equal(c.socket_path, "/tmp/x.sock");
  assert_int_equal(c.socket_mode, 0666);
  assert_int_equal(c.threads, 3);
  assert_int_equal(c.chunk_bytes, 1 << 20);
  assert_int_equal(c.stream_bytes, 0);
  assert_int_equal(c.inline_bytes, 4096);
  assert_true(c.init_timeout_s == 1.5 && c.op_timeout_s == 30 && c.io_timeout_s == 2);
  assert_int_equal(c.quota[TENANT_SESSIONS], 7);
  assert_int_equal(c.quota[TENANT_COMMS], 8);
  assert_true(c.quota[TENANT_REGISTERED_BYTES] == 2ull << 30);
  assert_int_equal(c.quota[TENANT_OPS], 9);
  assert_int_equal(c.nallow_uids, 3);
  assert_int_equal(c.allow_uids[2], 1001);
  assert_int_equal(c.nallow_gids, 1);
  assert_int_equal(c.log_level, 2);
  assert_int_equal(c.log_subsys, CCS_LOG_INIT | CCS_LOG_COLL);
  assert_string_equal(c.metrics_listen, "127.0.0.1:9464");
  assert_int_equal(c.nadmin_gids, 2);
  assert_int_equal(c.admin_gids[0], 0); /* the group named root */
  assert_int_equal(c.admin_gids[1], 4242);
  assert_int_equal(c.quota[TENANT_RANKS], 64);
  assert_int_equal(c.quota[TENANT_BUFFERS], 99);
  assert_true(c.id_ttl_s == 3600);
  assert_true(c.metrics_tenant_labels && c.metrics_max_connections == 3);
  assert_string_equal(c.cluster_key_file, "/tmp/k");
  assert_string_equal(c.id_key_file, "/tmp/ik");
  assert_true(c.peer_encrypt && c.peer_max_connections == 17);
  assert_true(c.peer_unexpected_bytes == 8u << 20 && c.peer_unexpected_total == 1u << 30);
  assert_string_equal(c.transport, "auto");
  assert_string_equal(c.ib_library, "/opt/lib/libibverbs.so.1");
  assert_string_equal(c.ib_devices, "mlx5_0:1,mlx5_1");
  assert_int_equal(c.ib_gid_index, 3);
  assert_true(c.link_capacity == 10ull << 30);
  assert_true(c.scratch_keep == 3u << 20);
  assert_string_equal(c.algo, "all_reduce:ring;broadcast:tree:0-64K");
  assert_string_equal(c.listen, "127.0.0.1:7100");
  assert_string_equal(c.advertise, "10.0.0.5:7100");
  assert_int_equal(c.peer_connections, 3);
  assert_true(c.heartbeat_s == 0.25 && c.peer_timeout_s == 2.5 && c.peer_restart_grace_s == 12 && c.peer_replay_bytes == 65536);
  assert_int_equal(c.cuda_legacy_ipc, 1);
  assert_int_equal(c.poll_spin_us, 77);
  assert_int_equal(c.nweights, 2);
  assert_true(c.weight_uids[0] == 0 && c.weights[0] == 2.5);
  assert_true(c.weight_uids[1] == 4242 && c.weights[1] == 3);
  assert_true(c.tenant_max_share == 0.5);
  assert_int_equal(c.executor_priority, 2);
  /* what it prints reads back the same, and names no key the file above
   * does not */
  char text[16384];
  ccsd_config_format(&c, text, sizeof(text));
  int keys = 0;
  for (char *line = text, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    char key[64];
    if (line[0] == '#' || line[0] == '[' || sscanf(line, "%63[a-z_] =", key) != 1) {
      if (next) next[-1] = '\n';
      continue;
    }
    char want[80];
    snprintf(want, sizeof(want), "\n%s = ", key);
    if (!strstr(every_key, want)) fail_msg("the daemon has a key '%s' this test gives no value", key);
    keys++;
    if (next) next[-1] = '\n';
  }
  assert_int_equal(keys, 49);
  write_file(text);
  struct ccsd_config back;
  ccsd_config_defaults(&back);
  assert_int_equal(ccsd_config_load_file(&back, path, 1, err, sizeof(err)), 0);
  assert_memory_equal(&c, &back, sizeof(c));
  unlink(path);
}

static void expect_error(const char *text, const char *want) {
  struct ccsd_config c;
  char err[512] = "";
  write_file(text);
  ccsd_config_defaults(&c);
  assert_int_equal(ccsd_config_load_file(&c, path, 1, err, sizeof(err)), -1);
  if (!strstr(err, want)) fail_msg("error '%s' does not say '%s'", err, want);
  unlink(path);
}

static void test_bad_values_and_unknown_keys(void **state) {
  char where[96];
  snprintf(where, sizeof(where), "-%d.conf:3: unknown key 'threadz'", (int)getpid());
  expect_error("socket = /tmp/a\n\nthreadz = 2\n", where);
  expect_error("threads = many\n", ":1: bad value 'many' for threads");
  expect_error("threads = 300\n", "bad value '300' for threads");
  expect_error("executor_priority = high\n", "bad value 'high' for executor_priority");
  expect_error("socket_mode = 0999\n", "for socket_mode");
  expect_error("op_timeout = -1\n", "for op_timeout");
  expect_error("op_timeout = nan\n", "for op_timeout");
  expect_error("chunk_bytes = 12Q\n", "for chunk_bytes");
  expect_error("chunk_bytes = nan\n", "for chunk_bytes"); /* what strtod takes but is no size */
  expect_error("quota_ops = inf\n", "for quota_ops");
  expect_error("peer_timeout = nan\n", "for peer_timeout");
  expect_error("log_level = LOUD\n", "for log_level");
  expect_error("log_subsys = INIT,NOISE\n", "for log_subsys");
  expect_error("allow_uids = 1,x\n", "for allow_uids");
  expect_error("metrics_listen = host:\n", "for metrics_listen");
  expect_error("admin_gids = no-such-group-here\n", "for admin_gids");
  expect_error("chunk_bytes = 128M\n", "for chunk_bytes"); /* messages between daemons: at most 64 MiB */
  expect_error("peer_unexpected_bytes = 1K\n", "for peer_unexpected_bytes");
  expect_error("transport = verbs\n", "bad value 'verbs' for transport: the transports are tcp, ib, or auto");
  expect_error("transport = tcptcptcptcptcptcp\n", "for transport");
  /* a port alone is on localhost */
  struct ccsd_config local;
  char why[256];
  ccsd_config_defaults(&local);
  assert_int_equal(ccsd_config_set(&local, "metrics_listen", "9464", why, sizeof(why)), 0);
  assert_string_equal(local.metrics_listen, "127.0.0.1:9464");
  assert_int_equal(ccsd_config_set(&local, "metrics_listen", ":9465", why, sizeof(why)), 0);
  assert_string_equal(local.metrics_listen, "127.0.0.1:9465");
  expect_error("[other]\nthreads = 1\n", "unknown section [other]");
  expect_error("threads\n", ":1:");
  struct ccsd_config c;
  char err[256];
  ccsd_config_defaults(&c);
  assert_int_equal(ccsd_config_load_file(&c, "/nonexistent/ccsd.conf", 1, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "/nonexistent/ccsd.conf"));
  assert_int_equal(ccsd_config_load_file(&c, "/nonexistent/ccsd.conf", 0, err, sizeof(err)), 0);
}

static void test_environment_over_file(void **state) {
  write_file("op_timeout = 30\nthreads = 2\n");
  struct ccsd_config c;
  char err[256];
  ccsd_config_defaults(&c);
  setenv("CCS_OP_TIMEOUT", "45", 1);
  setenv("CCS_DEBUG", "TRACE", 1);
  assert_int_equal(ccsd_config_load_file(&c, path, 1, err, sizeof(err)), 0);
  assert_int_equal(ccsd_config_load_env(&c, err, sizeof(err)), 0);
  assert_true(c.op_timeout_s == 45);
  assert_int_equal(c.threads, 2);
  assert_int_equal(c.log_level, 3);
  setenv("CCS_THREADS", "zero", 1);
  assert_int_equal(ccsd_config_load_env(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "CCS_THREADS"));
  unsetenv("CCS_THREADS");
  unsetenv("CCS_OP_TIMEOUT");
  unsetenv("CCS_DEBUG");
  unlink(path);
}

static void test_example_file_is_valid(void **state) {
  snprintf(path, sizeof(path), "/tmp/ccs-config-example-%d.conf", (int)getpid());
  FILE *f = fopen(path, "w");
  ccsd_config_example(f);
  fclose(f);
  struct ccsd_config c, def;
  char err[256];
  ccsd_config_defaults(&c);
  ccsd_config_defaults(&def);
  if (ccsd_config_load_file(&c, path, 1, err, sizeof(err))) fail_msg("%s", err);
  assert_memory_equal(&c, &def, sizeof(c)); /* it documents the defaults */
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_key),
      cmocka_unit_test(test_bad_values_and_unknown_keys),
      cmocka_unit_test(test_environment_over_file),
      cmocka_unit_test(test_example_file_is_valid),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
