/* Test harness: a real ccsd in a private directory, and real client
 * processes forked per rank, each bounded by a deadline. Everything is
 * cleaned up at exit, also when a test fails. */
#ifndef CCS_TEST_HARNESS_H
#define CCS_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ccs.h"

struct test_daemon {
  pid_t pid;
  char dir[64];
  char socket[128];
  int slot; /* its entry in the harness's own list (harness.c) */
};

/* Starts ccsd with the extra arguments (NULL-terminated list, may be NULL)
 * and points CCS_SOCKET at it. Returns 0 when it accepts connections. */
int test_daemon_start(struct test_daemon *d, const char *const *extra_args);
/* A new daemon in a stopped or killed one's place: its directory, its
 * socket (the unique ids' key it kept there). 0 when it accepts. */
int test_daemon_restart(struct test_daemon *d, const char *const *extra_args);
/* SIGTERM, wait (then SIGKILL); returns the exit status (0 = clean). */
int test_daemon_stop(struct test_daemon *d);
/* The same, leaving its directory for a restart. */
int test_daemon_term(struct test_daemon *d);
/* Kills the daemon hard (SIGKILL) without cleanup of the socket. */
void test_daemon_kill(struct test_daemon *d);
/* The daemon's connection for reading its counters (raw.c), made on first
 * use and kept, so that readings open and close nothing; -1 when none is
 * open yet. A forked process gets none of its parent's. */
int test_daemon_stats_fd(const struct test_daemon *d);
void test_daemon_set_stats_fd(const struct test_daemon *d, int fd);
int test_daemon_alive(const struct test_daemon *d);
/* Open file descriptors of the daemon (from /proc). */
int test_daemon_fds(const struct test_daemon *d);

/* n daemons that talk to each other (listen on loopback ports, or with
 * CCS_TEST_NETNS=PREFIX each in network namespace PREFIX<i> at 10.231.0.<i+1>,
 * namespaces that tests/support/run_netns.sh makes); CCS_SOCKET points at
 * the first. Returns 0 when all accept connections. */
int test_daemons_start(struct test_daemon *d, int n, const char *const *extra_args);
/* The cluster key file of this test's daemons (made on first use, removed
 * at exit); test_daemons_start passes it to every daemon. */
const char *test_cluster_key(void);
/* CCS_TEST_IB_LIBRARY: the daemon arguments (4 at most) that move data by
 * transport ib over the libibverbs it names; returns how many. */
int test_ib_args(const char **args);
/* What a transport's take_held hands over (transport tests): up to 8 kept,
 * n counts them all. */
struct test_held {
  int n;
  uint64_t tags[8];
  size_t lens[8];
  char *data[8];
};
void test_keep_held(void *arg, uint64_t tag, void *data, size_t len);
/* A directory for the emulated NIC's sockets (tests/verbs_emu), made once,
 * named in CCS_VERBS_EMU_DIR, removed at exit. */
const char *test_verbs_emu_dir(void);
/* A loopback port no one listens on now (for a daemon that must come
 * back on the same one); -1 when none could be had. */
int test_free_port(void);
/* Ranks forked from now on connect to daemon r % n of these. */
void test_spread_ranks(const struct test_daemon *d, int n);

/* Zeroed memory that the parent and the ranks it forks share (MAP_SHARED):
 * a test's `struct shared`. NULL when there is none. */
void *test_shared_new(size_t bytes);
void test_shared_free(void *shared, size_t bytes);

/* The other tenant some clients run as (nobody); switching needs root. */
#define TEST_OTHER_UID 65534
/* Makes this process TEST_OTHER_UID, or exits 99 saying why it cannot. */
void test_become_other_tenant(void);

typedef int (*rank_fn)(int rank, int nranks, void *arg);
/* Forks nranks processes running fn; each exits with fn's result. Waits
 * up to timeout_s; stragglers are killed. Fills statuses (exit codes, or
 * 128+signal, or -1 for killed at the deadline) if given; returns the
 * number of ranks that did not return 0. */
int test_run_ranks(int nranks, rank_fn fn, void *arg, double timeout_s, int *statuses);

/* Fresh per run (time and pid), printed so a failure can be replayed with
 * CCS_TEST_SEED. */
uint64_t test_seed(void);

/* splitmix64 of a combined with b: cheap, well mixed */
static inline uint64_t test_mix(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double test_now(void);

/* In a cmocka test's main, before running: CCS_TEST_ONLY=NAME (a glob)
 * runs only the tests of that name. */
#define TEST_ONLY_FROM_ENV()                                                   \
  do {                                                                         \
    if (getenv("CCS_TEST_ONLY")) cmocka_set_test_filter(getenv("CCS_TEST_ONLY")); \
  } while (0)

#endif
