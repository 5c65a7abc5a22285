/* Riding through a daemon restart (docs/restart.md), the client's side.
 *
 * Every call goes out numbered in its channels (a comm's collectives, its
 * sends to and receives from each peer), as the daemon numbers them, and
 * is listed until its answer comes; the daemon marks in the connection's
 * journal (proto/journal.h) when a call starts and when it finished. A
 * keeper thread per connection sleeps until the daemon's end of the socket
 * closes. Then it connects again (the socket unit holds the listening
 * socket while the daemon restarts; it retries until
 * CCS_RECONNECT_TIMEOUT), and rejoins every comm of the connection by the
 * identity its daemon gave it, all at once (a rank rejoins each comm only
 * once every rank does: one at a time they would wait on each other),
 * reporting per channel how many calls it knows finished and which of
 * the rest it cannot resubmit: an in-place op on registered memory that
 * had started (its inputs may be overwritten), and a host stream's calls
 * (their callers returned). Once every rank is back the daemon answers
 * each the same verdict per channel: what finished, from where every rank
 * repeats its calls itself (CCS_ERR_RETRY), and that the calls between
 * are resubmitted. The callers blocked in their calls then finish them on
 * the new connection: nothing, resubmit, or CCS_ERR_RETRY. */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "journal.h"

/* Channels, calls and the registry of comms. Never taken before a ring's
 * lock is let go (ring.c takes this one under its own). */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t settled_cv = PTHREAD_COND_INITIALIZER;

double ccs__reconnect_timeout(void) {
  const char *v = getenv("CCS_RECONNECT_TIMEOUT");
  if (!v || !*v) return 30;
  char *end;
  double s = strtod(v, &end);
  return *end || !(s >= 0 && s <= 1e6) ? 30 : s;
}

int ccs__ride_again(struct ccs__conn **c, struct ccs__ride *r) {
  uint64_t timeout_ns = (uint64_t)(ccs__reconnect_timeout() * 1e9);
  if (!r->limit_ns) r->deadline_ns = ccs__now_ns() + timeout_ns, r->limit_ns = r->deadline_ns + 3 * timeout_ns;
  if (ccs__now_ns() >= r->deadline_ns) return 0;
  usleep(r->tries++ < 10 ? 50000 : 200000); /* the daemon back, the others' inits failed too */
  struct ccs__conn *next;
  if (ccs__conn_get(&next) != CCS_OK) return 1; /* still down: the next try says so again */
  if (next != *c) {
    uint64_t again = ccs__now_ns() + timeout_ns;
    r->deadline_ns = again < r->limit_ns ? again : r->limit_ns;
  }
  ccs__conn_put(*c);
  *c = next;
  return 1;
}

/* --- the journal --- */

void ccs__journal_open(struct ccs__conn *c) {
  if (c->protocol < 5 || ccs__reconnect_timeout() <= 0) return;
  int fd;
  void *map;
  if (ccs__memfd_map(CCS__JOURNAL_BYTES, &fd, &map) != CCS_OK) return;
  struct ccs__journal *j = map;
  j->magic = CCS__JOURNAL_MAGIC;
  j->protocol = CCS__PROTOCOL_VERSION;
  j->entries = CCS__JOURNAL_ENTRIES;
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__JournalSetup setup = CCS__JOURNAL_SETUP__INIT;
  req.body_case = CCS__REQUEST__BODY_JOURNAL_SETUP;
  req.journal_setup = &setup;
  Ccs__Reply *reply;
  ccs_result_t rc = ccs__conn_call(c, &req, fd, &reply);
  close(fd);
  if (rc != CCS_OK) {
    munmap(map, CCS__JOURNAL_BYTES);
    return;
  }
  ccs__reply__free_unpacked(reply, NULL);
  c->journal = j;
  ccs__ring_journal(c);
}

void ccs__journal_free(struct ccs__conn *c) {
  if (c->journal) munmap(c->journal, CCS__JOURNAL_BYTES);
  c->journal = NULL;
}

/* --- channels and calls --- */

int ccs__chan_of(ccs_comm_t *comm, int peer, int send) {
  for (size_t i = 0; i < comm->nchans; i++)
    if (comm->chans[i].peer == peer && (peer < 0 || comm->chans[i].send == send)) return (int)i;
  struct ccs__chan *grown = realloc(comm->chans, (comm->nchans + 1) * sizeof(*grown));
  if (!grown) return -1;
  comm->chans = grown;
  comm->chans[comm->nchans] = (struct ccs__chan){peer, peer >= 0 && send, 0, 0};
  return (int)comm->nchans++;
}

uint64_t ccs__chan_take(ccs_comm_t *comm, int chan, uint64_t count) {
  pthread_mutex_lock(&mu);
  uint64_t first = comm->chans[chan].next;
  comm->chans[chan].next += count;
  pthread_mutex_unlock(&mu);
  return first;
}

/* Under mu. */
static void answered(ccs_comm_t *comm, int chan, uint64_t number) {
  if (comm->chans[chan].done < number + 1) comm->chans[chan].done = number + 1;
}

/* Under mu: a collective numbered `number` here that the daemon numbered
 * seq (its journal's; from 1, low 32 bits). Where they differ, a
 * restart's verdicts would give this rank's calls the wrong ones: the
 * comm is not rejoined. */
static void check_number(ccs_comm_t *comm, uint64_t number, uint32_t seq) {
  if (!seq || seq == (uint32_t)(number + 1) || !comm->has_id) return;
  comm->has_id = 0;
  fprintf(stderr, "ccs WARN rank %d: libccs numbered a collective #%llu, ccsd #%u (low 32 bits): this "
          "communicator will not be rejoined after a daemon restart\n", comm->rank,
          (unsigned long long)number + 1, seq);
}

int ccs__chan_settled(ccs_comm_t *comm, int chan, uint64_t first, uint64_t count,
                      ccs_result_t status, uint32_t seq) {
  pthread_mutex_lock(&mu);
  struct ccs__chan *ch = &comm->chans[chan];
  int astray = 0;
  if (status == CCS_OK && count == 1 && ch->peer < 0) check_number(comm, first, seq);
  if (status == CCS_OK || status == CCS_ERR_MISMATCH) answered(comm, chan, first + count - 1);
  /* to repeat: the daemon dropped it and every later call of the channel,
   * which take their numbers again from it, whatever order their answers
   * come in; refused for a quota (ops in flight), the daemon refuses the
   * later ones until it comes again (front/submit.c) */
  else if (status == CCS_ERR_RETRY || status == CCS_ERR_QUOTA) {
    if (ch->next > first) ch->next = first;
  } else if (ch->next == first + count) ch->next = first; /* refused as a whole */
  else astray = status == CCS_ERR_INVALID_ARGUMENT || status == CCS_ERR_PERMISSION ||
                status == CCS_ERR_NO_MEMORY || status == CCS_ERR_INVALID_USAGE; /* (refusals only) */
  if (status == CCS_ERR_MISMATCH || astray) comm->has_id = 0;
  pthread_mutex_unlock(&mu);
  return astray;
}

/* Under mu: a keeper of this process will still move c's comms (a
 * forked child's copy of a connection has none). */
static int keeper_pending(const struct ccs__conn *c) {
  return c->keeper_started && !c->moved && c->pid == getpid();
}

static void unlist(struct ccs__call *call) {
  if (!call->conn) return;
  if (call->prev) call->prev->next = call->next;
  else call->conn->calls = call->next;
  if (call->next) call->next->prev = call->prev;
  call->next = call->prev = NULL;
  call->conn = NULL;
}

size_t ccs__keep_input_bytes(void) {
  static _Atomic long bytes = -1; /* read once */
  long b = atomic_load_explicit(&bytes, memory_order_relaxed);
  if (b >= 0) return (size_t)b;
  unsigned long long want;
  b = ccs__env_bytes("CCS_KEEP_INPUT_BYTES", &want) ? (want > (1ull << 30) ? 1l << 30 : (long)want) : 64l << 10;
  atomic_store_explicit(&bytes, b, memory_order_relaxed);
  return (size_t)b;
}

struct ccs__call *ccs__call_new(struct ccs__conn *c, const struct ccs__call_desc *ops, size_t n,
                                const uint64_t *numbers, int *moving) {
  *moving = 0;
  if (!c->journal || !c->keeper_started) return NULL; /* no restart to prepare for */
  struct ccs__call *call = calloc(1, sizeof(*call) + n * sizeof(call->op[0]));
  if (!call) { /* its numbers unknown: its comms cannot be rejoined */
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n; i++) ops[i].comm->has_id = 0;
    pthread_mutex_unlock(&mu);
    return NULL;
  }
  pthread_mutex_lock(&mu);
  /* once the keeper is at work, calls go to the connection it makes: one
   * listed now would miss its report (once it is done, the call fails) */
  pthread_mutex_lock(&c->mu);
  int broken = c->broken != CCS_OK;
  pthread_mutex_unlock(&c->mu);
  *moving = broken && keeper_pending(c);
  if (broken) {
    pthread_mutex_unlock(&mu);
    free(call);
    return NULL;
  }
  for (size_t i = 0; i < n; i++) {
    int p2p = ops[i].kind == CCS__SEND || ops[i].kind == CCS__RECV;
    int chan = ccs__chan_of(ops[i].comm, p2p ? ops[i].peer : -1, ops[i].kind == CCS__SEND);
    if (chan < 0) {
      for (size_t k = 0; k < n; k++) ops[k].comm->has_id = 0;
      pthread_mutex_unlock(&mu);
      free(call);
      return NULL;
    }
    call->op[i] = (struct ccs__call_op){ops[i].comm, chan, 0, ops[i].unsafe_to_rerun, CCS__OUT, ops[i].kept};
    struct ccs__chan *ch = &ops[i].comm->chans[chan];
    call->op[i].number = numbers ? numbers[i] : ch->next++;
    /* a resubmitted op keeps the number it took before a restart; where the
     * daemon went again before it went out, it was in no report, and that
     * verdict left the channel short of it: the daemon counts it now */
    if (ch->next <= call->op[i].number) ch->next = call->op[i].number + 1;
  }
  call->n = n;
  call->conn = c;
  struct ccs__call **end = &c->calls, *prev = NULL;
  while (*end) prev = *end, end = &(*end)->next;
  call->prev = prev;
  *end = call;
  pthread_mutex_unlock(&mu);
  return call;
}

void ccs__call_keyed(struct ccs__call *call, uint64_t key) {
  pthread_mutex_lock(&mu);
  call->key = key;
  call->keyed = 1;
  pthread_mutex_unlock(&mu);
}

/* Under mu: a finished call listed on c, if one collective (the daemon
 * numbered it too), checked against the journal's number. */
static void check_call_number(const struct ccs__call *call, const struct ccs__conn *c) {
  const struct ccs__call_op *op = &call->op[0];
  if (call->n == 1 && call->keyed && c && c->journal && op->comm->chans[op->chan].peer < 0)
    check_number(op->comm, op->number, ccs__journal_seq(c->journal, call->key));
}

void ccs__call_answered(struct ccs__call *call, ccs_result_t status) {
  pthread_mutex_lock(&mu);
  if (status == CCS_OK) check_call_number(call, call->conn);
  int ran = status == CCS_OK || status == CCS_ERR_MISMATCH; /* a mismatch took its number too */
  for (size_t i = call->n; i-- > 0;) { /* (backwards: numbers given back last first) */
    ccs_comm_t *comm = call->op[i].comm;
    struct ccs__chan *ch = &comm->chans[call->op[i].chan];
    if (ran) answered(comm, call->op[i].chan, call->op[i].number);
    else if (ch->next == call->op[i].number + 1) ch->next--; /* refused as a whole: no number taken */
    /* which ranks took a mismatch's number is not known for sure when the
     * daemon goes before every rank read it: such a comm is not rejoined */
    if (status == CCS_ERR_MISMATCH) comm->has_id = 0;
  }
  unlist(call);
  pthread_mutex_unlock(&mu);
}

/* Why call failed, kept out of the call itself: most calls never fail,
 * and a call small enough for the allocator's per-thread cache costs less
 * to make. */
static void fail_text(struct ccs__call *call, const char *text) {
  free(call->text);
  call->text = strdup(text);
}

ccs_result_t ccs__call_await(struct ccs__call *call) {
  pthread_mutex_lock(&mu);
  while (!call->settled) pthread_cond_wait(&settled_cv, &mu);
  ccs_result_t rc = call->failed;
  if (rc != CCS_OK) ccs__set_error("%s", call->text ? call->text : ccs_strerror(rc));
  pthread_mutex_unlock(&mu);
  return rc;
}

void ccs__call_free(struct ccs__call *call) {
  if (!call) return;
  pthread_mutex_lock(&mu);
  unlist(call);
  pthread_mutex_unlock(&mu);
  free(call->text);
  free(call);
}

/* --- the registry of comms --- */

static ccs_comm_t **comms;
static size_t ncomms;

void ccs__comm_track(ccs_comm_t *comm) {
  pthread_mutex_lock(&mu);
  ccs_comm_t **grown = realloc(comms, (ncomms + 1) * sizeof(*grown));
  if (grown) comms = grown, comms[ncomms++] = comm;
  pthread_mutex_unlock(&mu);
}

void ccs__conn_joining(struct ccs__conn *c, int more) {
  pthread_mutex_lock(&mu);
  c->joining += more ? 1 : -1;
  if (!c->joining) pthread_cond_broadcast(&settled_cv);
  pthread_mutex_unlock(&mu);
}

void ccs__comm_untrack(ccs_comm_t *comm) {
  pthread_mutex_lock(&mu);
  for (size_t i = 0; i < ncomms; i++)
    if (comms[i] == comm) comms[i] = comms[--ncomms];
  pthread_mutex_unlock(&mu);
}

/* --- the keeper --- */

int ccs__conn_moving(struct ccs__conn *c) {
  if (ccs__conn_check(c) == CCS_OK) return 0;
  pthread_mutex_lock(&mu);
  int pending = keeper_pending(c);
  pthread_mutex_unlock(&mu);
  return pending;
}

struct ccs__conn *ccs__conn_successor(struct ccs__conn *c) {
  pthread_mutex_lock(&mu);
  while (keeper_pending(c)) pthread_cond_wait(&settled_cv, &mu);
  struct ccs__conn *next = c->moved > 0 ? c->successor : NULL;
  if (next) ccs__conn_ref(next);
  pthread_mutex_unlock(&mu);
  return next;
}

struct ccs__conn *ccs__comm_conn(ccs_comm_t *comm) {
  pthread_mutex_lock(&mu);
  struct ccs__conn *c = comm->conn;
  /* (a break not seen yet: the call finds it, and comes back here) */
  while (comm->conn == c && c->broken && keeper_pending(c)) pthread_cond_wait(&settled_cv, &mu);
  c = comm->conn; /* moved by the keeper, or the old one when it failed */
  ccs__conn_ref(c);
  pthread_mutex_unlock(&mu);
  return c;
}

/* What one comm reports when it rejoins: per channel, how far it knows
 * its calls finished and which of those after it must repeat itself. */
struct report {
  ccs_comm_t *comm;
  Ccs__Request req;
  Ccs__CommInit init;
  Ccs__Rejoin rejoin;
  Ccs__Channel *chans, **chan_ptrs;
  protobuf_c_boolean *flags; /* every channel's must_retry, one array */
};

static void report_free(struct report *r) {
  free(r->chans);
  free(r->chan_ptrs);
  free(r->flags);
}

/* Under mu: the journal's word on c's listed calls, into the channels'
 * counts (a finished call ran) and each op's must-retry. */
static int must_retry(struct ccs__conn *c, const ccs_comm_t *comm, int chan, uint64_t number) {
  for (struct ccs__call *call = c->calls; call; call = call->next)
    for (size_t i = 0; i < call->n; i++) {
      const struct ccs__call_op *op = &call->op[i];
      if (op->comm != comm || op->chan != chan || op->number != number) continue;
      uint32_t state = call->keyed && c->journal ? ccs__journal_state(c->journal, call->key) : 0;
      return op->unsafe_to_rerun && (state & CCS__JOURNAL_STARTED);
    }
  return 0; /* a call that never went out */
}

static int build_report(struct ccs__conn *c, ccs_comm_t *comm, struct report *r) {
  memset(r, 0, sizeof(*r));
  r->comm = comm;
  uint64_t stream_first = 0, stream_end = 0;
  /* (takes the ring's lock) a CUDA stream's call out: its stream went on
   * when the daemon did (ring.c's guard), its comm failed there */
  if (ccs__ring_stream_numbers(c, comm, &stream_first, &stream_end) || comm->async_error != CCS_OK) return -2;
  pthread_mutex_lock(&mu);
  /* finished calls count as done: their answers were lost with the daemon */
  for (struct ccs__call *call = c->calls; call; call = call->next) {
    uint32_t state = call->keyed && c->journal ? ccs__journal_state(c->journal, call->key) : 0;
    if (!(state & CCS__JOURNAL_FINISHED)) continue;
    for (size_t i = 0; i < call->n; i++)
      if (call->op[i].comm == comm) answered(comm, call->op[i].chan, call->op[i].number);
    if (call->op[0].comm == comm) check_call_number(call, c);
  }
  if (!comm->has_id) { /* (the answers read last may have said so) */
    pthread_mutex_unlock(&mu);
    return -3;
  }
  size_t nflags = 0;
  for (size_t k = 0; k < comm->nchans; k++) nflags += comm->chans[k].next - comm->chans[k].done;
  r->chans = calloc(comm->nchans ? comm->nchans : 1, sizeof(*r->chans));
  r->chan_ptrs = calloc(comm->nchans ? comm->nchans : 1, sizeof(*r->chan_ptrs));
  r->flags = calloc(nflags ? nflags : 1, sizeof(*r->flags));
  if (!r->chans || !r->chan_ptrs || !r->flags || nflags > CCS__JOURNAL_ENTRIES) {
    pthread_mutex_unlock(&mu);
    report_free(r);
    return -1;
  }
  size_t at = 0;
  for (size_t k = 0; k < comm->nchans; k++) {
    const struct ccs__chan *ch = &comm->chans[k];
    Ccs__Channel *m = &r->chans[k];
    ccs__channel__init(m);
    m->peer = ch->peer;
    m->send = ch->send;
    m->done = ch->done;
    m->must_retry = &r->flags[at];
    for (uint64_t num = ch->done; num < ch->next; num++)
      r->flags[at++] = (k == 0 && num >= stream_first && num < stream_end) /* a host stream's */
                       || must_retry(c, comm, (int)k, num);
    m->n_must_retry = (size_t)(ch->next - ch->done);
    r->chan_ptrs[k] = m;
  }
  pthread_mutex_unlock(&mu);
  ccs__rejoin__init(&r->rejoin);
  r->rejoin.channels = r->chan_ptrs;
  r->rejoin.n_channels = comm->nchans;
  r->rejoin.spans = comm->spans;
  ccs__comm_init__init(&r->init);
  r->init.id.data = comm->id;
  r->init.id.len = sizeof(comm->id);
  r->init.nranks = (uint32_t)comm->nranks;
  r->init.rank = (uint32_t)comm->rank;
  r->init.op_timeout_ms = comm->op_timeout_ms;
  r->init.algo = comm->algo ? comm->algo : "";
  r->init.debug = comm->debug;
  r->init.priority = (uint32_t)comm->priority;
  r->init.rejoin = &r->rejoin;
  ccs__request__init(&r->req);
  r->req.body_case = CCS__REQUEST__BODY_COMM_INIT;
  r->req.comm_init = &r->init;
  return 0;
}

/* Whether a call will be repeated by its caller: an op of it must be. */
static int repeated(const struct ccs__call *call) {
  for (size_t i = 0; i < call->n; i++)
    if (call->op[i].verdict == CCS__REPEAT) return 1;
  return 0;
}

/* Under mu: a comm's verdicts (in its channels' order) onto its calls, and
 * its channels going on from them: the numbers of the ops resubmitted are
 * taken, those of calls repeated by their callers are taken again then. */
static void apply(struct ccs__conn *c, ccs_comm_t *comm, const Ccs__CommInitReply *v) {
  for (size_t k = 0; k < comm->nchans && k < v->n_verdicts; k++) {
    uint64_t finished = v->verdicts[k]->finished, retry = v->verdicts[k]->retry_from;
    for (struct ccs__call *call = c->calls; call; call = call->next)
      for (size_t i = 0; i < call->n; i++) {
        struct ccs__call_op *op = &call->op[i];
        if (op->comm != comm || op->chan != (int)k) continue;
        op->verdict = op->number < finished ? CCS__FINISHED : op->number >= retry ? CCS__REPEAT : CCS__RESUBMIT;
      }
  }
  for (size_t k = 0; k < comm->nchans && k < v->n_verdicts; k++) {
    uint64_t finished = v->verdicts[k]->finished, retry = v->verdicts[k]->retry_from, resubmit = 0;
    for (struct ccs__call *call = c->calls; call; call = call->next)
      for (size_t i = 0; i < call->n; i++)
        resubmit += call->op[i].comm == comm && call->op[i].chan == (int)k &&
                    call->op[i].verdict == CCS__RESUBMIT && !repeated(call);
    if (comm->debug && (k == 0 || resubmit || comm->chans[k].next > finished))
      fprintf(stderr, "ccs INFO rank %d: ccsd restarted; rejoined, %s %d: %llu finished, %llu to "
              "resubmit%s\n", comm->rank, comm->chans[k].peer < 0 ? "collectives" : comm->chans[k].send
              ? "sends to" : "receives from", comm->chans[k].peer, (unsigned long long)finished,
              (unsigned long long)resubmit, retry != UINT64_MAX ? ", later ones repeated by the caller" : "");
    comm->chans[k].done = finished;
    comm->chans[k].next = finished + resubmit; /* what is repeated takes new numbers */
  }
}

/* Under mu: every listed call of c whose ops all have their verdict, or
 * whose comm could not rejoin (failed, with the text), is settled. */
static void settle_calls(struct ccs__conn *c, ccs_comm_t *failed_comm, ccs_result_t failed,
                         const char *text) {
  for (struct ccs__call *call = c->calls, *next; call; call = next) {
    next = call->next;
    int ready = 1;
    for (size_t i = 0; i < call->n; i++) {
      if (failed_comm && call->op[i].comm == failed_comm) {
        call->failed = failed;
        fail_text(call, text);
      }
      ready &= call->op[i].verdict != CCS__OUT;
    }
    if (!ready && call->failed == CCS_OK) continue;
    call->settled = 1;
    unlist(call);
  }
}

static void comm_lost(ccs_comm_t *comm, ccs_result_t rc, const char *text) {
  char why[CCS__ERROR_TEXT_MAX];
  snprintf(why, sizeof(why), "%s", text);
  ccs__comm_failed(comm, rc, why);
  if (comm->async_error == CCS_OK) comm->async_error = rc;
}

/* The daemon's end of c closed: a new connection, and c's comms rejoined
 * on it. Runs on c's keeper. */
static void restart(struct ccs__conn *c) {
  pthread_mutex_lock(&mu); /* the comms coming here first */
  while (c->arriving) pthread_cond_wait(&settled_cv, &mu);
  pthread_mutex_unlock(&mu);
  pthread_mutex_lock(&c->mu);
  if (!c->broken) c->broken = CCS_ERR_DAEMON_UNAVAILABLE;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  char text[CCS__ERROR_TEXT_MAX];
  /* the comms of c, each rejoined (a failed one is left as it is); one
   * whose init c answered just before it broke is among them */
  pthread_mutex_lock(&mu);
  while (c->joining) pthread_cond_wait(&settled_cv, &mu);
  size_t n = 0;
  ccs_comm_t **mine = calloc(ncomms ? ncomms : 1, sizeof(*mine));
  for (size_t i = 0; mine && i < ncomms; i++)
    if (comms[i]->conn == c && comms[i]->async_error == CCS_OK) mine[n++] = comms[i];
  pthread_mutex_unlock(&mu);
  struct report *reports = calloc(n ? n : 1, sizeof(*reports));
  Ccs__Request **reqs = calloc(n ? n : 1, sizeof(*reqs));
  Ccs__Reply **replies = calloc(n ? n : 1, sizeof(*replies));
  ccs_result_t *status = calloc(n ? n : 1, sizeof(*status));
  char(*texts)[CCS__ERROR_TEXT_MAX] = calloc(n ? n : 1, sizeof(*texts));
  size_t asked = 0;
  for (size_t i = 0; reports && reqs && replies && status && texts && i < n; i++) {
    int bad = build_report(c, mine[i], &reports[asked]);
    if (bad == -3) { /* its calls' numbers are not known for sure */
      comm_lost(mine[i], CCS_ERR_DAEMON_UNAVAILABLE, "the connection to ccsd closed; the "
                "communicator cannot be rejoined (its calls' numbers are not known for sure: an "
                "answer it missed may have been a mismatch): create it again");
      pthread_mutex_lock(&mu);
      settle_calls(c, mine[i], CCS_ERR_DAEMON_UNAVAILABLE, mine[i]->last_error);
      pthread_mutex_unlock(&mu);
      continue;
    }
    if (bad) {
      if (bad == -1) comm_lost(mine[i], CCS_ERR_NO_MEMORY, "out of memory rejoining the communicator");
      else comm_lost(mine[i], CCS_ERR_DAEMON_UNAVAILABLE, "the connection to ccsd closed with calls "
                     "of a CUDA stream out: the communicator cannot be rejoined");
      continue;
    }
    reqs[asked] = &reports[asked].req;
    asked++;
  }
  /* a daemon that goes again while they rejoin is waited for again */
  double timeout = ccs__reconnect_timeout();
  uint64_t deadline = ccs__now_ns() + (uint64_t)(timeout * 1e9), wait_us = 10000;
  struct ccs__conn *nc = NULL;
  while (asked) {
    while (ccs__conn_open(&nc, 1) != CCS_OK && ccs__now_ns() < deadline) {
      usleep((useconds_t)wait_us);
      if (wait_us < 500000) wait_us *= 2;
    }
    if (!nc) break;
    /* each comm's ranks all come back within the daemon's init deadline */
    ccs__conn_call_all(nc, reqs, asked, ccs__now_ns() + (uint64_t)(timeout + 120) * 1000000000u, replies,
                       status, texts);
    if (ccs__conn_check(nc) == CCS_OK || ccs__now_ns() >= deadline) break;
    for (size_t i = 0; i < asked; i++)
      if (replies[i]) ccs__reply__free_unpacked(replies[i], NULL), replies[i] = NULL;
    ccs__conn_put(nc);
    nc = NULL;
  }
  if (nc) {
    /* its keeper at work before any comm is there: every call on nc is
     * numbered (its restart waits for the comms to arrive) */
    pthread_mutex_lock(&mu);
    nc->arriving = 1;
    pthread_mutex_unlock(&mu);
    ccs__keeper_start(nc);
  }
  if (!nc && asked) { /* (no comm to rejoin: none made; ccs__conn_get makes the next) */
    snprintf(text, sizeof(text), "the connection to ccsd closed, and ccsd did not come back within "
             "%g s (CCS_RECONNECT_TIMEOUT)", timeout);
    for (size_t i = 0; i < asked; i++) status[i] = CCS_ERR_DAEMON_UNAVAILABLE;
  }
  for (size_t i = 0; i < asked; i++) {
    ccs_comm_t *comm = reports[i].comm;
    const Ccs__CommInitReply *v = replies[i] && replies[i]->body_case == CCS__REPLY__BODY_COMM_INIT
                                      ? replies[i]->comm_init : NULL;
    if (v && v->n_verdicts != comm->nchans) {
      status[i] = CCS_ERR_PROTOCOL;
      snprintf(texts[i], sizeof(texts[i]), "ccsd answered a rejoin without a verdict per channel");
      v = NULL;
    }
    if (!v) {
      if (status[i] == CCS_OK) status[i] = CCS_ERR_PROTOCOL;
      /* (a comm's calls do not repeat on a comm that is gone) */
      if (status[i] == CCS_ERR_RETRY) status[i] = CCS_ERR_PEER_LOST;
      if (nc)
        snprintf(text, sizeof(text), "ccsd restarted, and the communicator could not be rejoined: %s",
                 texts[i]);
      comm_lost(comm, status[i], text);
      pthread_mutex_lock(&mu);
      settle_calls(c, comm, status[i], text);
      pthread_mutex_unlock(&mu);
      continue;
    }
    pthread_mutex_lock(&mu);
    apply(c, comm, v);
    pthread_mutex_unlock(&mu);
    /* before the comm is on the new connection: a caller back from
     * synchronize repeats its stream's calls there, numbered from the
     * verdict, and a call made on the stream meanwhile finds what it must
     * repeat first (coll.c) */
    ccs__ring_settle_streams(c, comm, v->n_verdicts ? v->verdicts[0]->finished : 0);
    pthread_mutex_lock(&mu);
    comm->handle = v->comm;
    ccs__conn_ref(nc);
    comm->conn = nc;
    pthread_mutex_unlock(&mu);
    ccs__conn_put(c); /* the comm's reference: the keeper still holds one */
  }
  /* a host stream's calls of a comm that was not rejoined fail (their
   * stream may serve a new comm on the next connection) */
  ccs__ring_settle_streams(c, NULL, 0);
  pthread_mutex_lock(&mu);
  settle_calls(c, NULL, CCS_OK, NULL);
  /* what never got a verdict (a comm that was not rejoined) fails */
  for (struct ccs__call *call = c->calls, *next; call; call = next) {
    next = call->next;
    call->failed = CCS_ERR_DAEMON_UNAVAILABLE;
    fail_text(call, "the connection to ccsd closed under this call");
    call->settled = 1;
    unlist(call);
  }
  c->successor = nc;
  c->moved = 1;
  if (nc) nc->arriving = 0;
  pthread_cond_broadcast(&settled_cv);
  pthread_mutex_unlock(&mu);
  for (size_t i = 0; i < asked; i++) {
    if (replies[i]) ccs__reply__free_unpacked(replies[i], NULL);
    report_free(&reports[i]);
  }
  free(reports), free(reqs), free(replies), free(status), free(texts), free(mine);
}

static void *keeper(void *arg) {
  struct ccs__conn *c = arg;
  struct pollfd p[2] = {{c->fd, 0, 0}, {c->keeper_stop, POLLIN, 0}};
  for (;;) {
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[1].revents) break; /* nobody else holds the connection */
    if (p[0].revents & (POLLHUP | POLLERR | POLLNVAL)) {
      restart(c);
      break;
    }
  }
  ccs__conn_put(c); /* the keeper's reference: may be the last */
  return NULL;
}

void ccs__keeper_start(struct ccs__conn *c) {
  if (!c->journal || ccs__reconnect_timeout() <= 0) return;
  pthread_mutex_lock(&mu);
  if (c->keeper_started || c->pid != getpid()) {
    pthread_mutex_unlock(&mu);
    return;
  }
  c->keeper_stop = eventfd(0, EFD_CLOEXEC);
  ccs__conn_ref(c);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (c->keeper_stop >= 0 && pthread_create(&c->keeper, &attr, keeper, c) == 0) {
    c->keeper_started = 1;
  } else {
    if (c->keeper_stop >= 0) close(c->keeper_stop);
    c->keeper_stop = -1;
    pthread_mutex_unlock(&mu);
    pthread_attr_destroy(&attr);
    ccs__conn_put(c);
    return;
  }
  pthread_attr_destroy(&attr);
  pthread_mutex_unlock(&mu);
}
