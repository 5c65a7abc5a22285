/* Where the time of a small collective goes: medians of many round trips.
 *   latency [ITERS]                       (CCS_SOCKET names the daemon)
 *   latency ITERS all_reduce|barrier NP   one row: its median alone
 *   latency ITERS stream NP               8 B all_reduce back to back on a
 *                                         host stream: rank 0's calls per second
 *   latency ITERS idle NP                 the ranks' CPU time (% of a CPU, all
 *                                         ranks together) over the 2 s from 1 s
 *                                         after their last 8 B all_reduce
 * With CCS_SOCKETS=A:B:... rank r talks to daemon r % (their number)
 * (ranks across daemons); the unique id comes from CCS_SOCKET's. With
 * LATENCY_CPUS=C0:C1:... rank r runs on CPU C[r % (their number)] only
 * (nodes emulated on one machine: each daemon and its ranks on CPUs of
 * their own).
 * Rows: a bare Unix-socket round trip between two processes; a 1-rank
 * barrier (client -> daemon loop -> client); a 1-rank 8 B all_reduce (adds
 * the executor hand-off and back); 2- and 4-rank 8 B all_reduce (adds
 * waiting for the other ranks' requests to arrive and be matched). */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ccs.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp);
  return v[n / 2];
}

static double socket_rtt(int iters) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return -1;
  pid_t pid = fork();
  char b = 0;
  if (pid == 0) {
    close(sv[0]);
    while (read(sv[1], &b, 1) == 1)
      if (write(sv[1], &b, 1) != 1) break;
    _exit(0);
  }
  close(sv[1]);
  double *t = malloc(sizeof(double) * (size_t)iters);
  for (int i = 0; i < iters; i++) {
    double t0 = now_us();
    if (write(sv[0], &b, 1) != 1 || read(sv[0], &b, 1) != 1) break;
    t[i] = now_us() - t0;
  }
  close(sv[0]);
  waitpid(pid, NULL, 0);
  double m = median(t, iters);
  free(t);
  return m;
}

/* The r-th (modulo their number) of the colon-separated list in the
 * environment variable var, into buf; NULL where var is unset or empty. */
static const char *listed(const char *var, int r, char *buf, size_t size) {
  const char *list = getenv(var);
  if (!list || !*list) return NULL;
  char copy[4096], *save, *item[16];
  snprintf(copy, sizeof(copy), "%s", list);
  int n = 0;
  for (char *p = strtok_r(copy, ":", &save); p && n < 16; p = strtok_r(NULL, ":", &save)) item[n++] = p;
  if (!n) return NULL;
  snprintf(buf, size, "%s", item[r % n]);
  return buf;
}

/* In a forked rank: its daemon, when CCS_SOCKETS lists several, and its
 * CPU, when LATENCY_CPUS lists them. */
static void place_rank(int rank) {
  char buf[4096];
  if (listed("CCS_SOCKETS", rank, buf, sizeof(buf))) setenv("CCS_SOCKET", buf, 1);
  if (listed("LATENCY_CPUS", rank, buf, sizeof(buf))) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(atoi(buf), &set);
    if (sched_setaffinity(0, sizeof(set), &set)) perror("latency: LATENCY_CPUS");
  }
}

/* A rank's measurement: on comm, iters times; rank 0's result is kept. */
typedef double (*rank_fn)(ccs_comm_t *comm, int rank, int iters, int arg);

/* Forks n ranks (each on its daemon, place_rank) that join one comm
 * and run fn; rank 0's result (the sum of all ranks' when `sum`), or -1. */
static double run_ranks_of(int n, rank_fn fn, int iters, int arg, int sum) {
  ccs_unique_id_t id;
  if (ccs_get_unique_id(&id) != CCS_OK) return -1;
  size_t size = 16 * sizeof(double);
  double *shared = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return -1;
  for (int r = 0; r < 16; r++) shared[r] = -1;
  pid_t pids[16];
  for (int r = 0; r < n; r++) {
    if ((pids[r] = fork()) != 0) continue;
    place_rank(r);
    ccs_comm_t *comm;
    if (ccs_comm_init_rank(&comm, n, id, r) != CCS_OK) _exit(1);
    double v = fn(comm, r, iters, arg);
    shared[r] = v;
    ccs_comm_destroy(comm);
    _exit(v < 0);
  }
  for (int r = 0; r < n; r++) waitpid(pids[r], NULL, 0);
  double m = shared[0];
  for (int r = 1; sum && r < n && m >= 0; r++) m = shared[r] < 0 ? -1 : m + shared[r];
  munmap(shared, size);
  return m;
}

static double run_ranks(int n, rank_fn fn, int iters, int arg) { return run_ranks_of(n, fn, iters, arg, 0); }

/* The median time of the op (a barrier when arg, else an 8 B all_reduce). */
static double median_call(ccs_comm_t *comm, int rank, int iters, int barrier) {
  (void)rank;
  double *t = malloc(sizeof(double) * (size_t)iters), x = 1, y;
  for (int i = 0; i < iters + 20; i++) {
    double t0 = now_us();
    ccs_result_t rc = barrier ? ccs_barrier(comm) : ccs_all_reduce(&x, &y, 1, CCS_FLOAT64, CCS_SUM, comm, NULL);
    if (rc != CCS_OK) return -1;
    if (i >= 20) t[i - 20] = now_us() - t0;
  }
  double m = median(t, iters);
  free(t);
  return m;
}

/* Calls per second: iters 8 B all_reduce on a host stream, then one
 * synchronize (the first round warms up). */
static double stream_rate(ccs_comm_t *comm, int rank, int iters, int arg) {
  (void)rank, (void)arg;
  ccs_stream_t s;
  double *buf, rate = -1;
  if (ccs_stream_create(&s) != CCS_OK || ccs_mem_alloc((void **)&buf, 16) != CCS_OK) return -1;
  buf[0] = 1;
  for (int round = 0; round < 2; round++) {
    double t0 = now_us();
    for (int i = 0; i < iters; i++)
      if (ccs_all_reduce(buf, buf + 1, 1, CCS_FLOAT64, CCS_SUM, comm, s) != CCS_OK) return -1;
    if (ccs_stream_synchronize(s) != CCS_OK) return -1;
    rate = iters / ((now_us() - t0) * 1e-6);
  }
  ccs_stream_destroy(s);
  ccs_mem_free(buf);
  return rate;
}

static double cpu_s(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u); /* every thread of the rank: the library's too */
  return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

/* % of a CPU this rank used over the 2 s from 1 s after its last op (the
 * comm still open, as between a job's phases). */
static double idle_cpu(ccs_comm_t *comm, int rank, int iters, int arg) {
  if (median_call(comm, rank, iters, 0) < 0) return -1;
  (void)arg;
  sleep(1);
  double t0 = cpu_s();
  sleep(2);
  double pct = (cpu_s() - t0) / 2 * 100;
  sleep(1); /* the daemon is measured over the same 2 s: nothing ends in them */
  return pct;
}

static double ccs_median(int n, int barrier, int iters) { return run_ranks(n, median_call, iters, barrier); }

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  if (argc == 4) { /* one row, for scripts/compare_small.sh */
    int n = atoi(argv[3]);
    if (iters < 1 || n < 1 || n > 16) return 2;
    if (!strcmp(argv[2], "stream")) {
      printf("%.0f\n", run_ranks(n, stream_rate, iters, 0));
      return 0;
    }
    if (!strcmp(argv[2], "idle")) {
      printf("%.3f\n", run_ranks_of(n, idle_cpu, iters, 0, 1));
      return 0;
    }
    printf("%.2f\n", ccs_median(n, !strcmp(argv[2], "barrier"), iters));
    return 0;
  }
  printf("# median round trip (us), %d iterations each\n", iters);
  printf("%-44s %8.1f\n", "Unix socket ping-pong (2 processes)", socket_rtt(iters));
  printf("%-44s %8.1f\n", "ccs_barrier, 1 rank (loop only)", ccs_median(1, 1, iters));
  printf("%-44s %8.1f\n", "ccs_all_reduce 8 B, 1 rank (+ executor)", ccs_median(1, 0, iters));
  printf("%-44s %8.1f\n", "ccs_barrier, 2 ranks", ccs_median(2, 1, iters));
  printf("%-44s %8.1f\n", "ccs_all_reduce 8 B, 2 ranks", ccs_median(2, 0, iters));
  printf("%-44s %8.1f\n", "ccs_all_reduce 8 B, 4 ranks", ccs_median(4, 0, iters));
  return 0;
}
