#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CCSD_PATH
#error "CCSD_PATH must name the ccsd binary"
#endif

/* The daemons this process started, by value: a test's struct test_daemon
 * may live in a stack frame that a failed assertion (cmocka's longjmp)
 * abandons, so what the exit cleanup kills and removes must not be read
 * through it. A pid stays here until it is reaped, so it can never name
 * another process. */
#define MAX_DAEMONS 64
static struct {
  int used;
  pid_t pid;
  char dir[64], socket[128];
  int stats_fd;   /* raw.c's connection for counters, or -1 */
  pid_t stats_of; /* the process that opened it (forked ones open their own) */
} live[MAX_DAEMONS];
static pid_t owner;
static char key_path[64]; /* the cluster key of this test's daemons */

/* The socket, and the unique ids' key the daemon keeps beside it. */
static void unlink_socket(const char *socket) {
  char key[160];
  snprintf(key, sizeof(key), "%s.id-key", socket);
  unlink(socket);
  unlink(key);
}

static char emu_dir[64]; /* CCS_TEST_IB_LIBRARY's (test_ib_args) */

static void cleanup_at_exit(void) {
  if (getpid() != owner) return; /* forked ranks leave it to the parent */
  for (int i = 0; i < MAX_DAEMONS; i++) {
    if (!live[i].used) continue;
    if (live[i].pid > 0) {
      kill(live[i].pid, SIGKILL);
      waitpid(live[i].pid, NULL, 0);
    }
    unlink_socket(live[i].socket);
    rmdir(live[i].dir);
  }
  if (key_path[0]) unlink(key_path);
  if (emu_dir[0]) { /* the emulated NIC's sockets, which killed daemons leave */
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", emu_dir);
    if (system(cmd) != 0) fprintf(stderr, "# could not remove %s\n", emu_dir);
  }
}

static int entry_of(const struct test_daemon *d) {
  return d->slot >= 0 && d->slot < MAX_DAEMONS && live[d->slot].used && live[d->slot].pid == d->pid
             ? d->slot
             : -1;
}

int test_daemon_stats_fd(const struct test_daemon *d) {
  int i = entry_of(d);
  return i >= 0 && live[i].stats_of == getpid() ? live[i].stats_fd : -1;
}

void test_daemon_set_stats_fd(const struct test_daemon *d, int fd) {
  int i = entry_of(d);
  if (i < 0) {
    if (fd >= 0) close(fd);
    return;
  }
  if (live[i].stats_fd >= 0 && live[i].stats_of == getpid() && live[i].stats_fd != fd)
    close(live[i].stats_fd);
  live[i].stats_fd = fd;
  live[i].stats_of = getpid();
}

/* The daemon's pid is gone (reaped): nothing of it is signalled again. */
static void reaped(struct test_daemon *d) {
  int i = entry_of(d);
  if (i >= 0) {
    test_daemon_set_stats_fd(d, -1);
    live[i].pid = 0;
  }
  d->pid = 0;
}

double test_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t test_seed(void) {
  static uint64_t seed;
  if (!seed) {
    const char *s = getenv("CCS_TEST_SEED");
    seed = s ? strtoull(s, NULL, 0) : test_mix((uint64_t)time(NULL), (uint64_t)getpid());
    if (!seed) seed = 1;
    fprintf(stderr, "# CCS_TEST_SEED=%llu\n", (unsigned long long)seed);
  }
  return seed;
}

static int can_connect(const char *path) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

/* again: in d's directory, on d's socket (a restart), else a new one */
static int daemon_start(struct test_daemon *d, const char *const *wrap, const char *const *extra_args,
                        int again) {
  if (!owner) {
    owner = getpid();
    atexit(cleanup_at_exit);
  }
  if (!again) {
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/ccs-test-XXXXXX");
    if (!mkdtemp(d->dir)) return -1;
    chmod(d->dir, 0755); /* tests run clients as other uids too */
    snprintf(d->socket, sizeof(d->socket), "%s/ccsd.sock", d->dir);
  } else {
    if (d->pid > 0 || !d->dir[0]) return -1; /* still running, or never started */
    unlink(d->socket); /* what the killed daemon left */
    if (d->slot >= 0 && d->slot < MAX_DAEMONS && live[d->slot].used && live[d->slot].pid == 0)
      live[d->slot].used = 0; /* the new one takes the directory over */
  }
  /* CCSD_PATH in the environment runs another build of the daemon (the
   * ThreadSanitizer one) under the same tests */
  const char *ccsd = getenv("CCSD_PATH") && *getenv("CCSD_PATH") ? getenv("CCSD_PATH") : CCSD_PATH;
  const char *argv[48];
  int argc = 0;
  for (int i = 0; wrap && wrap[i]; i++) argv[argc++] = wrap[i];
  argv[argc++] = ccsd;
  argv[argc++] = "--socket";
  argv[argc++] = d->socket;
  for (int i = 0; extra_args && extra_args[i] && argc < 46; i++) argv[argc++] = extra_args[i];
  argv[argc] = NULL;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  d->pid = pid;
  d->slot = -1;
  for (int i = 0; i < MAX_DAEMONS && d->slot < 0; i++)
    if (!live[i].used) {
      live[i].used = 1;
      live[i].pid = pid;
      live[i].stats_fd = -1;
      snprintf(live[i].dir, sizeof(live[i].dir), "%s", d->dir);
      snprintf(live[i].socket, sizeof(live[i].socket), "%s", d->socket);
      d->slot = i;
    }
  if (d->slot < 0) { /* more daemons than the harness can clean up after */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    d->pid = 0;
    return -1;
  }
  setenv("CCS_SOCKET", d->socket, 1);
  double deadline = test_now() + 20;
  while (test_now() < deadline) {
    if (can_connect(d->socket)) return 0;
    if (waitpid(pid, NULL, WNOHANG) == pid) {
      live[d->slot].pid = 0;
      d->pid = 0;
      return -1;
    }
    usleep(5000);
  }
  return -1;
}

int test_daemon_start(struct test_daemon *d, const char *const *extra_args) {
  return daemon_start(d, NULL, extra_args, 0);
}

int test_daemon_restart(struct test_daemon *d, const char *const *extra_args) {
  return daemon_start(d, NULL, extra_args, 1);
}

const char *test_cluster_key(void) {
  if (key_path[0]) return key_path;
  if (!owner) {
    owner = getpid();
    atexit(cleanup_at_exit);
  }
  snprintf(key_path, sizeof(key_path), "/tmp/ccs-test-key-%d", (int)getpid());
  unlink(key_path);
  uint8_t key[32];
  char text[66];
  if (getrandom(key, sizeof(key), 0) != (ssize_t)sizeof(key)) abort();
  for (int i = 0; i < 32; i++) snprintf(text + 2 * i, 3, "%02x", key[i]);
  text[64] = '\n';
  int fd = open(key_path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || write(fd, text, 65) != 65) abort();
  close(fd);
  return key_path;
}

const char *test_verbs_emu_dir(void) {
  if (emu_dir[0]) return emu_dir;
  if (!owner) {
    owner = getpid();
    atexit(cleanup_at_exit);
  }
  snprintf(emu_dir, sizeof(emu_dir), "/tmp/ccs-verbs-emu-XXXXXX");
  if (!mkdtemp(emu_dir)) abort();
  setenv("CCS_VERBS_EMU_DIR", emu_dir, 1);
  return emu_dir;
}

/* CCS_TEST_IB_LIBRARY: the daemons move data by transport ib over the
 * libibverbs it names (the emulated NIC, tests/verbs_emu). */
void test_keep_held(void *arg, uint64_t tag, void *data, size_t len) {
  struct test_held *t = arg;
  if (t->n < 8) t->tags[t->n] = tag, t->lens[t->n] = len, t->data[t->n] = data;
  else free(data);
  t->n++;
}

int test_ib_args(const char **args) {
  const char *lib = getenv("CCS_TEST_IB_LIBRARY");
  if (!lib || !*lib) return 0;
  test_verbs_emu_dir();
  args[0] = "--transport";
  args[1] = "ib";
  args[2] = "--ib-library";
  args[3] = lib;
  return 4;
}

int test_daemons_start(struct test_daemon *d, int n, const char *const *extra_args) {
  const char *netns = getenv("CCS_TEST_NETNS");
  const char *key = test_cluster_key();
  for (int i = n - 1; i >= 0; i--) { /* the first last: CCS_SOCKET names it */
    char ns[64], listen[64];
    const char *wrap[] = {"/usr/sbin/ip", "netns", "exec", ns, NULL};
    /* a daemon that goes fails the comms it shared at once, as the tests
     * of faults expect (test_restart holds them for a restart) */
    const char *args[40] = {"--listen", listen, "--cluster-key-file", key, "--peer-restart-grace", "0"};
    int k = 6;
    k += test_ib_args(args + k);
    for (int j = 0; extra_args && extra_args[j] && k < 38; j++) args[k++] = extra_args[j];
    args[k] = NULL;
    snprintf(ns, sizeof(ns), "%s%d", netns ? netns : "", i);
    if (netns && *netns) snprintf(listen, sizeof(listen), "10.231.0.%d:7000", i + 1);
    else snprintf(listen, sizeof(listen), "127.0.0.1:0");
    if (daemon_start(&d[i], netns && *netns ? wrap : NULL, args, 0)) return -1;
  }
  return 0;
}

/* A port below the kernel's ephemeral range, free now: a daemon started
 * again on it after it died finds it still free, where a port from that
 * range may meanwhile be the source port of any connection on the
 * machine (the tests run side by side). */
int test_free_port(void) {
  int low = 32768, high = 60999;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    fclose(f);
  }
  int first = low > 12000 + 1024 ? low - 12000 : 1024, span = low - first;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t r = test_mix((uint64_t)getpid(), (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
  for (int tries = 0; tries < 200; tries++) {
    int port = span > 0 ? first + (int)((r = test_mix(r, (uint64_t)tries)) % (uint64_t)span) : 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
             getsockname(fd, (struct sockaddr *)&a, &len) == 0;
    if (fd >= 0) close(fd);
    if (ok) return ntohs(a.sin_port);
  }
  return -1;
}

static const struct test_daemon *spread;
static int nspread;
void test_spread_ranks(const struct test_daemon *d, int n) {
  spread = d;
  nspread = n;
}

static void forget(struct test_daemon *d) {
  if (d->slot >= 0 && d->slot < MAX_DAEMONS && live[d->slot].used && live[d->slot].pid == 0 &&
      !strcmp(live[d->slot].dir, d->dir))
    live[d->slot].used = 0;
  unlink_socket(d->socket);
  rmdir(d->dir);
}

static int wait_deadline(pid_t pid, double timeout_s, int *status) {
  double deadline = test_now() + timeout_s;
  for (;;) {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) return 0;
    if (r < 0 && errno != EINTR) return -1;
    if (test_now() > deadline) return -1;
    usleep(2000);
  }
}

int test_daemon_stop(struct test_daemon *d) {
  int status = test_daemon_term(d);
  forget(d);
  return status;
}

int test_daemon_term(struct test_daemon *d) {
  int status = -1;
  if (d->pid > 0) {
    kill(d->pid, SIGTERM);
    if (wait_deadline(d->pid, 20, &status)) {
      kill(d->pid, SIGKILL);
      waitpid(d->pid, &status, 0);
      status = -1;
    } else {
      status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    reaped(d);
  }
  return status;
}

void test_daemon_kill(struct test_daemon *d) {
  if (d->pid > 0) {
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    reaped(d);
  }
}

/* Asked without reaping it (WNOWAIT): a dead daemon's pid stays ours
 * until stop or kill reaps it. */
int test_daemon_alive(const struct test_daemon *d) {
  if (d->pid <= 0) return 0;
  siginfo_t si;
  memset(&si, 0, sizeof(si));
  return waitid(P_PID, (id_t)d->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == 0;
}

void *test_shared_new(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

void test_shared_free(void *shared, size_t bytes) {
  if (shared) munmap(shared, bytes);
}

void test_become_other_tenant(void) {
  if (setgroups(0, NULL) || setgid(TEST_OTHER_UID) || setuid(TEST_OTHER_UID)) {
    fprintf(stderr, "cannot switch to uid %d: %s\n", TEST_OTHER_UID, strerror(errno));
    exit(99);
  }
}

/* Where a hung process waits, each thread, where gdb is there to say. */
static void print_stacks(pid_t pid) {
  char cmd[200];
  snprintf(cmd, sizeof(cmd), "command -v gdb >/dev/null && timeout 30 gdb -p %d -batch -ex "
           "'thread apply all bt 20' 2>/dev/null | grep -E '^(Thread|#)' >&2", (int)pid);
  fflush(NULL);
  if (system(cmd) < 0) fprintf(stderr, "(no stacks: %s)\n", strerror(errno));
}

int test_run_ranks(int nranks, rank_fn fn, void *arg, double timeout_s, int *statuses) {
  pid_t pids[256];
  int failed = 0;
  if (nranks > 256) return nranks;
  fflush(NULL);
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (nspread) setenv("CCS_SOCKET", spread[r % nspread].socket, 1);
      int rc = fn(r, nranks, arg);
      fflush(NULL);
      exit(rc < 0 ? 1 : rc > 125 ? 125 : rc);
    }
  }
  double deadline = test_now() + timeout_s;
  for (int r = 0; r < nranks; r++) {
    int status = 0, code;
    double left = deadline - test_now();
    if (pids[r] < 0) code = -1;
    else if (wait_deadline(pids[r], left > 0 ? left : 0, &status)) {
      fprintf(stderr, "rank %d did not finish within %.0f s: killed\n", r, timeout_s);
      print_stacks(pids[r]);
      kill(pids[r], SIGKILL);
      waitpid(pids[r], NULL, 0);
      code = -1;
    } else {
      code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (statuses) statuses[r] = code;
    if (code != 0) failed++;
  }
  return failed;
}

int test_daemon_fds(const struct test_daemon *d) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd", (int)d->pid);
  DIR *dir = opendir(path);
  if (!dir) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(dir));) n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}
