/* The workload of scripts/chaos.sh: NRANKS forked ranks on the daemons at
 * CCS_CHAOS_SOCKETS (colon-separated: rank r on the (r % n)th) call every collective in turn (all_reduce in place on
 * registered memory and out of place on malloc'ed memory, broadcast,
 * reduce, all_gather, reduce_scatter, all_to_all, gather, scatter, a ring
 * of sends and receives, barrier, two calls on a host stream: after
 * CCS_ERR_RETRY at synchronize, the last ccs_stream_repeat_count of them
 * repeated; a call on each of two host streams, the calls to repeat of
 * each repeated in their order), sizes
 * drawn per round, every element
 * checked against values recomputed here, until the file STOP exists
 * (every rank stops at the same round: they agree on it). A call that
 * returns CCS_ERR_RETRY is repeated with its inputs restored; one that
 * fails its comm makes every rank start a new one (by name) and go on
 * from the furthest round any rank reached. Prints
 *   calls C ok K retried R failed F wrong W comms E
 * and exits 0 when no element was wrong and every rank finished.
 *   chaos_ranks NRANKS STOP */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ccs.h"

#define MAXR 16
#define MAXC 20000 /* elements per rank and call */

struct tally {
  uint64_t calls, ok, retried, failed, wrong, comms;
};
static struct tally *tallies; /* one per rank, shared with the parent */
static uint64_t seed;

static uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull);
  x ^= x >> 31, x *= 0xd6e8feb86659fd93ull, x ^= x >> 32;
  return x;
}
static int64_t value(int rank, uint64_t round, size_t i) {
  return (int64_t)(mix(seed ^ round, (uint64_t)rank << 32 | i) % 1000003) - 500000;
}

struct bufs {
  int64_t *reg, *reg2, *in, *out;
};

/* The second stream's call of kind 12: its own inputs. */
static uint64_t second(uint64_t round) { return round | 1ull << 40; }

/* Round `round`'s call of kind k on comm; inputs filled afresh. */
static ccs_result_t call(int k, ccs_comm_t *comm, int rank, int n, uint64_t round, size_t c,
                         struct bufs *b, ccs_stream_t *stream, uint64_t *retried) {
  int root = (int)(round % (uint64_t)n);
  size_t all = (size_t)n * c;
  for (size_t i = 0; i < all; i++) b->in[i] = value(rank, round, i);
  switch (k) {
  case 0:
    for (size_t i = 0; i < c; i++) b->reg[i] = value(rank, round, i);
    return ccs_all_reduce(b->reg, b->reg, c, CCS_INT64, CCS_SUM, comm, NULL);
  case 1: return ccs_all_reduce(b->in, b->out, c, CCS_INT64, CCS_SUM, comm, NULL);
  case 2: return ccs_broadcast(b->in, b->out, c, CCS_INT64, root, comm, NULL);
  case 3: return ccs_reduce(b->in, b->out, c, CCS_INT64, CCS_MAX, root, comm, NULL);
  case 4: return ccs_all_gather(b->in, b->out, c, CCS_INT64, comm, NULL);
  case 5: return ccs_reduce_scatter(b->in, b->out, c, CCS_INT64, CCS_SUM, comm, NULL);
  case 6: return ccs_all_to_all(b->in, b->out, c, CCS_INT64, comm, NULL);
  case 7: return ccs_gather(b->in, b->out, c, CCS_INT64, root, comm, NULL);
  case 8: return ccs_scatter(b->in, b->out, c, CCS_INT64, root, comm, NULL);
  case 9:
    ccs_group_start();
    ccs_send(b->in, c, CCS_INT64, (rank + 1) % n, comm, NULL);
    ccs_recv(b->out, c, CCS_INT64, (rank + n - 1) % n, comm, NULL);
    return ccs_group_end();
  case 10: return ccs_barrier(comm);
  case 12: /* one call on each of two streams; after CCS_ERR_RETRY, each one's to repeat */
    for (int again[2] = {1, 1};;) {
      int64_t *buf[2] = {b->reg, b->reg2};
      uint64_t of[2] = {round, second(round)};
      ccs_result_t rc = CCS_OK, s[2];
      for (int j = 0; j < 2; j++) {
        if (!again[j]) continue;
        for (size_t i = 0; i < c; i++) buf[j][i] = value(rank, of[j], i);
        ccs_result_t made = ccs_all_reduce(buf[j], buf[j], c, CCS_INT64, CCS_SUM, comm, stream[j]);
        if (made != CCS_OK && made != CCS_ERR_RETRY && rc == CCS_OK) rc = made;
      }
      for (int j = 0; j < 2; j++) {
        s[j] = ccs_stream_synchronize(stream[j]);
        again[j] = 0;
        if (s[j] == CCS_ERR_RETRY && ccs_stream_repeat_count(stream[j], &again[j]) != CCS_OK) again[j] = -1;
      }
      if (rc != CCS_OK) return rc;
      if (s[0] != CCS_ERR_RETRY && s[1] != CCS_ERR_RETRY) return s[0] != CCS_OK ? s[0] : s[1];
      for (int j = 0; j < 2; j++)
        if ((s[j] != CCS_OK && s[j] != CCS_ERR_RETRY) || again[j] < 0 || again[j] > 1) return s[j] != CCS_ERR_RETRY ? s[j] : CCS_ERR_PROTOCOL;
      if (again[0] > again[1]) { /* the first to repeat and not the second, after it: out of order */
        fprintf(stderr, "rank %d round %llu: the first stream's call to repeat, not the second's\n", rank,
                (unsigned long long)round);
        return CCS_ERR_PROTOCOL;
      }
      (*retried)++;
    }
  default: /* both out at once; the second's max over ranks leaves the sum */
    for (int from = 0;;) { /* after CCS_ERR_RETRY, the calls to repeat: the last of them */
      if (from == 0)
        for (size_t i = 0; i < c; i++) b->reg[i] = value(rank, round, i);
      ccs_result_t rc = from == 0 ? ccs_all_reduce(b->reg, b->reg, c, CCS_INT64, CCS_SUM, comm, stream[0]) : CCS_OK;
      if (rc == CCS_OK) rc = ccs_all_reduce(b->reg, b->reg, 1, CCS_INT64, CCS_MAX, comm, stream[0]);
      ccs_result_t s = ccs_stream_synchronize(stream[0]);
      int repeat = 0;
      if (s != CCS_ERR_RETRY || (rc != CCS_OK && rc != CCS_ERR_RETRY) ||
          ccs_stream_repeat_count(stream[0], &repeat) != CCS_OK || repeat < 1)
        return rc != CCS_OK ? rc : s;
      from = repeat >= 2 ? 0 : 1;
      (*retried)++;
    }
  }
}
#define KINDS 13

static int64_t sum(int n, uint64_t round, size_t i) {
  int64_t s = 0;
  for (int r = 0; r < n; r++) s += value(r, round, i);
  return s;
}

/* Wrong elements of the call's result. */
static uint64_t wrong_in(int k, int rank, int n, uint64_t round, size_t c, const struct bufs *b) {
  int root = (int)(round % (uint64_t)n);
  uint64_t bad = 0;
  for (size_t j = 0; j < (size_t)n; j++)
    for (size_t i = 0; i < c; i++) {
      int64_t got = 0, want = 0;
      switch (k) {
      case 0: case 11: if (j) continue; got = b->reg[i], want = sum(n, round, i); break;
      case 12:
        if (j > 1) continue;
        got = j ? b->reg2[i] : b->reg[i], want = sum(n, j ? second(round) : round, i);
        break;
      case 1: if (j) continue; got = b->out[i], want = sum(n, round, i); break;
      case 2: if (j) continue; got = b->out[i], want = value(root, round, i); break;
      case 3:
        if (j || rank != root) continue;
        got = b->out[i], want = value(0, round, i);
        for (int r = 1; r < n; r++) want = value(r, round, i) > want ? value(r, round, i) : want;
        break;
      case 4: got = b->out[j * c + i], want = value((int)j, round, i); break;
      case 5: if (j) continue; got = b->out[i], want = sum(n, round, (size_t)rank * c + i); break;
      case 6: got = b->out[j * c + i], want = value((int)j, round, (size_t)rank * c + i); break;
      case 7: if (rank != root) continue; got = b->out[j * c + i], want = value((int)j, round, i); break;
      case 8: if (j) continue; got = b->out[i], want = value(root, round, (size_t)rank * c + i); break;
      case 9: if (j) continue; got = b->out[i], want = value((rank + n - 1) % n, round, i); break;
      default: continue;
      }
      if (got != want && bad++ < 3)
        fprintf(stderr, "rank %d round %llu kind %d [%zu][%zu]: %lld, want %lld\n", rank,
                (unsigned long long)round, k, j, i, (long long)got, (long long)want);
    }
  return bad;
}

/* The comm of the next epoch. libccs sends an init that a daemon's death
 * cut short again (docs/restart.md); where it fails all the same (the comm
 * failed as a further restart cut it short), this rank goes on to the
 * epoch after, and so do the others, when their init fails too or their
 * comm, short of this rank, fails its first call. */
static int join(ccs_comm_t **comm, int rank, int n, uint64_t *epoch) {
  for (int tries = 0; tries < 8; tries++, ++*epoch) {
    char name[64];
    snprintf(name, sizeof(name), "chaos.%llu.%llu", (unsigned long long)seed, (unsigned long long)*epoch);
    if (ccs_comm_init_named(comm, name, n, rank) == CCS_OK) return 0;
    fprintf(stderr, "rank %d: init %s: %s\n", rank, name, ccs_comm_last_error(NULL));
    usleep(200000);
  }
  return -1;
}

static int rank_main(int rank, int n, const char *stop_file) {
  struct tally *t = &tallies[rank];
  struct bufs b;
  b.in = malloc(sizeof(int64_t) * MAXC * MAXR);
  b.out = malloc(sizeof(int64_t) * MAXC * MAXR);
  ccs_stream_t stream[2];
  if (!b.in || !b.out || ccs_mem_alloc((void **)&b.reg, sizeof(int64_t) * MAXC) != CCS_OK ||
      ccs_mem_alloc((void **)&b.reg2, sizeof(int64_t) * MAXC) != CCS_OK ||
      ccs_stream_create(&stream[0]) != CCS_OK || ccs_stream_create(&stream[1]) != CCS_OK)
    return 2;
  ccs_comm_t *comm = NULL;
  uint64_t epoch = 0;
  if (join(&comm, rank, n, &epoch)) return 3;
  t->comms++;
  for (uint64_t round = 0;; round++) {
    /* stop where every rank stops */
    int32_t stop = access(stop_file, F_OK) == 0;
    ccs_result_t rc = ccs_all_reduce(&stop, &stop, 1, CCS_INT32, CCS_MAX, comm, NULL);
    if (rc == CCS_ERR_RETRY) { /* nothing to restore: ask again */
      round--;
      continue;
    }
    if (rc == CCS_OK && stop) break;
    int k = (int)(mix(seed, round) % KINDS);
    size_t c = 1 + (size_t)(mix(seed + 1, round) % MAXC);
    if (rc == CCS_OK) {
      t->calls++;
      while ((rc = call(k, comm, rank, n, round, c, &b, stream, &t->retried)) == CCS_ERR_RETRY) t->retried++;
    }
    if (rc == CCS_OK) {
      t->ok++;
      t->wrong += wrong_in(k, rank, n, round, c, &b);
      continue;
    }
    /* the comm is done for: every rank makes the next one */
    fprintf(stderr, "rank %d round %llu: %s: %s\n", rank, (unsigned long long)round,
            ccs_result_name(rc), ccs_comm_last_error(comm));
    t->failed++;
    ccs_comm_destroy(comm);
    ++epoch;
    if (join(&comm, rank, n, &epoch)) return 4;
    t->comms++;
    /* ranks may have failed in different rounds: go on from the furthest */
    uint64_t at = round;
    while ((rc = ccs_all_reduce(&at, &at, 1, CCS_UINT64, CCS_MAX, comm, NULL)) == CCS_ERR_RETRY) at = round;
    if (rc != CCS_OK) return 5;
    round = at;
  }
  ccs_comm_destroy(comm);
  ccs_stream_destroy(stream[0]);
  ccs_stream_destroy(stream[1]);
  ccs_mem_free(b.reg);
  ccs_mem_free(b.reg2);
  free(b.in), free(b.out);
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 2 ? atoi(argv[1]) : 0;
  if (n < 1 || n > MAXR) {
    fprintf(stderr, "usage: chaos_ranks NRANKS STOP_FILE\n");
    return 2;
  }
  seed = (uint64_t)getpid() * 2654435761u ^ (uint64_t)time(NULL);
  tallies = mmap(NULL, sizeof(*tallies) * MAXR, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (tallies == MAP_FAILED) return 2;
  memset(tallies, 0, sizeof(*tallies) * MAXR);
  pid_t pids[MAXR];
  char *sockets[MAXR];
  int nsockets = 0;
  for (char *s = getenv("CCS_CHAOS_SOCKETS"), *save = NULL; nsockets < MAXR && (s = strtok_r(s, ":", &save)); s = NULL)
    sockets[nsockets++] = s;
  for (int r = 0; r < n; r++)
    if ((pids[r] = fork()) == 0) {
      if (nsockets) setenv("CCS_SOCKET", sockets[r % nsockets], 1);
      _exit(rank_main(r, n, argv[2]));
    }
  int bad = 0;
  for (int r = 0; r < n; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
      fprintf(stderr, "rank %d exited with %d\n", r, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
      bad = 1;
    }
  }
  struct tally all = {0};
  for (int r = 0; r < n; r++) {
    all.calls += tallies[r].calls, all.ok += tallies[r].ok, all.retried += tallies[r].retried;
    all.failed += tallies[r].failed, all.wrong += tallies[r].wrong, all.comms += tallies[r].comms;
  }
  printf("calls %llu ok %llu retried %llu failed %llu wrong %llu comms %llu\n",
         (unsigned long long)all.calls, (unsigned long long)all.ok, (unsigned long long)all.retried,
         (unsigned long long)all.failed, (unsigned long long)all.wrong, (unsigned long long)all.comms);
  return bad || all.wrong ? 1 : 0;
}
