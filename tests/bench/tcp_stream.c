/* The loopback stream bound: one TCP connection between two processes on
 * this machine, the sender writing 1 MiB at a time, the receiver reading
 * into one buffer. What one connection between two daemons here can carry
 * at most, printed in GB/s beside the across-daemons comparison. With
 * WAYS 2 both ends send at once (as two daemons do in an all_reduce or
 * all_gather), and the GB/s printed is one direction's.
 *   tcp-stream [MIB [WAYS]]   (default 2048 MiB moved each way, 1 way) */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { CHUNK = 1 << 20 };

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static size_t total;

static void send_all(int s) {
  char *buf = malloc(CHUNK);
  if (!buf) die("malloc");
  memset(buf, 1, CHUNK);
  for (size_t sent = 0; sent < total;) {
    ssize_t n = write(s, buf, total - sent < CHUNK ? total - sent : CHUNK);
    if (n <= 0) die("write");
    sent += (size_t)n;
  }
  shutdown(s, SHUT_WR);
  free(buf);
}

static void *sender(void *s) {
  send_all(*(int *)s);
  return NULL;
}

/* Reads until the other end is through: the GB/s from the first bytes on
 * (not the connection's set-up), or exits when fewer came. */
static double recv_all(int s) {
  char *buf = malloc(CHUNK);
  if (!buf) die("malloc");
  double t0 = 0;
  size_t got = 0;
  for (ssize_t n; (n = read(s, buf, CHUNK)) > 0;) {
    if (!t0) t0 = now();
    got += (size_t)n;
  }
  double t = now() - t0;
  free(buf);
  if (got != total) {
    fprintf(stderr, "tcp-stream: %zu of %zu bytes came\n", got, total);
    exit(1);
  }
  return (double)got / t / 1e9;
}

int main(int argc, char **argv) {
  total = (size_t)(argc > 1 ? atol(argv[1]) : 2048) << 20;
  int both = argc > 2 && atoi(argv[2]) == 2;
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof(a);
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr *)&a, &alen))
    die("listen");
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) { /* the sender (and, both ways, a receiver too) */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a))) die("connect");
    pthread_t t;
    if (both && pthread_create(&t, NULL, sender, &s)) die("pthread_create");
    if (both) recv_all(s), pthread_join(t, NULL);
    else send_all(s);
    close(s);
    _exit(0);
  }
  int s = accept(ls, NULL, NULL);
  if (s < 0) die("accept");
  pthread_t t;
  if (both && pthread_create(&t, NULL, sender, &s)) die("pthread_create");
  double gbs = recv_all(s);
  if (both) pthread_join(t, NULL);
  int status;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status)) return 1;
  printf("%.3f\n", gbs);
  return 0;
}
