/* The harness cleans up after a failed test without touching anything it
 * did not start: a daemon started from a stack frame that a failed
 * assertion abandoned is killed and its directory removed at exit, and
 * no other process is signalled, even when the abandoned frame has since
 * been overwritten with another process's pid (the decoy here).
 *
 * The failing test runs in a child (this program again, with "abandon"),
 * so that its cmocka failure and its exit cleanup can be watched. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

/* What the child reports to the parent on fd 3: the daemon's pid and
 * directory. */
struct started {
  pid_t pid;
  char dir[64];
};

static void starts_a_daemon_and_fails(void **state) {
  (void)state;
  struct test_daemon d; /* in this frame, which the failure abandons */
  assert_int_equal(test_daemon_start(&d, NULL), 0);
  struct started s = {d.pid, ""};
  snprintf(s.dir, sizeof(s.dir), "%s", d.dir);
  assert_int_equal(write(3, &s, sizeof(s)), (ssize_t)sizeof(s));
  fail_msg("failing on purpose, with a daemon started from this frame");
}

/* Fills the stack where the abandoned frame was with the decoy's pid, as
 * any later test's locals would fill it with something. */
static void overwrites_the_stack(void **state) {
  (void)state;
  pid_t decoy = (pid_t)atoi(getenv("CCS_TEST_DECOY"));
  pid_t fill[4096];
  for (size_t i = 0; i < sizeof(fill) / sizeof(fill[0]); i++) fill[i] = decoy;
  FILE *sink = fopen("/dev/null", "w");
  assert_non_null(sink);
  fwrite(fill, sizeof(fill), 1, sink); /* the array is used: it is really written */
  fclose(sink);
}

static int abandon(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(starts_a_daemon_and_fails),
      cmocka_unit_test(overwrites_the_stack),
  };
  cmocka_run_group_tests(tests, NULL, NULL);
  return 0; /* the exit cleanup runs now */
}

static void test_cleanup_after_a_failed_test(void **state) {
  (void)state;
  pid_t decoy = fork();
  if (decoy == 0) {
    for (;;) pause();
  }
  assert_true(decoy > 0);
  int report[2];
  assert_int_equal(pipe(report), 0);
  pid_t child = fork();
  if (child == 0) {
    char pid_text[16];
    snprintf(pid_text, sizeof(pid_text), "%d", (int)decoy);
    setenv("CCS_TEST_DECOY", pid_text, 1);
    dup2(report[1], 3);
    execl("/proc/self/exe", "test_harness", "abandon", (char *)NULL);
    _exit(127);
  }
  close(report[1]);
  struct started s;
  assert_int_equal(read(report[0], &s, sizeof(s)), (ssize_t)sizeof(s));
  close(report[0]);
  int status;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status));
  /* the decoy lives: nothing signalled it */
  siginfo_t si;
  memset(&si, 0, sizeof(si));
  int decoy_alive = waitid(P_PID, (id_t)decoy, &si, WEXITED | WNOHANG) == 0 && si.si_pid == 0;
  kill(decoy, SIGKILL);
  waitpid(decoy, NULL, 0);
  assert_true(decoy_alive);
  /* the abandoned daemon is gone (reaped by whoever inherited it), and so
   * is its directory */
  for (double end = test_now() + 10; kill(s.pid, 0) == 0 && test_now() < end;) usleep(10000);
  assert_true(kill(s.pid, 0) == -1 && errno == ESRCH);
  struct stat st;
  assert_true(stat(s.dir, &st) == -1 && errno == ENOENT);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "abandon")) return abandon();
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_cleanup_after_a_failed_test)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
