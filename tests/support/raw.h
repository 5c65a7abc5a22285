/* A client that speaks the wire protocol by hand, for tests that send what
 * libccs never would. Every call fails the running cmocka test on error. */
#ifndef CCS_TEST_RAW_H
#define CCS_TEST_RAW_H

#include <stddef.h>
#include <stdint.h>

#include "frames.h"

int raw_connect(const char *socket_path);
void raw_send(int fd, const void *buf, size_t len, const int *fds, int nfds);
/* Sends f (with pass_fd when not -1) and frees it. */
void raw_send_frame(int fd, struct frame f, int pass_fd);
void raw_send_frame_fds(int fd, struct frame f, const int *fds, int nfds);
void raw_request(int fd, Ccs__Request *req, int pass_fd);
/* The next reply, or NULL at end of stream; fails after 10 s. */
Ccs__Reply *raw_reply(int fd);
void raw_expect(int fd, ccs_result_t status);
void raw_expect_closed(int fd);
/* 1 when the daemon closed fd within 5 s (whatever it said before), else
 * 0: fails no test, for the forked clients that report by exit status. */
int raw_closed_by_daemon(int fd);
void raw_send_hello(int fd, uint32_t protocol); /* no wait for the reply */
void raw_hello(int fd);                          /* and expects CCS_OK */
void raw_send_get_unique_id(int fd, uint64_t req_id); /* no wait for the reply */
/* A memfd of bytes with these seals (0: none). */
int raw_memfd(size_t bytes, int seals);
/* Registers memfd on fd; the daemon's status, and the buffer id on success. */
ccs_result_t raw_register(int fd, int memfd, uint64_t *ret_id);
/* Asks for a unique id (request id_req) and joins rank 0 of a comm of
 * nranks on it (request init_req); no wait for the join's reply. */
void raw_send_join(int fd, uint64_t id_req, uint64_t init_req, uint32_t nranks);
/* A one-rank communicator of this connection (after its hello). */
uint64_t raw_comm_of_one(int fd);
/* An in-place all_reduce of count float32 on ref; no wait for the reply. */
void raw_send_all_reduce(int fd, uint64_t req_id, uint64_t comm, Ccs__BufRef *ref, uint64_t count);
/* The same out of place: from send into recv. */
void raw_send_all_reduce_into(int fd, uint64_t req_id, uint64_t comm, Ccs__BufRef *send, Ccs__BufRef *recv,
                              uint64_t count);
/* A memfd's bytes, mapped shared: what the daemon sees of a registered one. */
void *raw_map(int memfd, size_t bytes);

/* The fast path by hand (proto/ring.h): the rings of a connection, as
 * the client's side sees them. */
struct ccs__ring_shared;
struct raw_ring {
  struct ccs__ring_shared *sh;
  int bell; /* the doorbell's eventfd */
  uint32_t sub_tail, done_head;
};
/* Sets up rings on connection fd (after its hello): a fresh sealed memfd
 * and eventfd, laid out as libccs does. The daemon's status. */
ccs_result_t raw_ring_setup(int fd, struct raw_ring *ret);
/* Publishes ops[0..n) as one batch with this request id, and rings the
 * bell when the daemon sleeps. */
struct ccs__ring_op;
void raw_ring_submit(struct raw_ring *r, uint64_t req_id, const struct ccs__ring_op *ops, uint32_t n);
/* The next completion (its text into text); fails the test after 10 s. */
struct ccs__ring_done;
void raw_ring_wait(struct raw_ring *r, struct ccs__ring_done *ret, char *text, size_t len);
void raw_ring_close(struct raw_ring *r);

/* An operator command's answer (as ccsctl prints it), malloc'ed; fails
 * the test unless the daemon answers CCS_OK. */
char *raw_admin(const char *socket_path, const char *command);
/* The value of the Prometheus sample `series` (name and labels exactly as
 * the daemon writes them, e.g. ccs_ops_total{collective="all_reduce"}) in
 * metrics text; 0 when absent. */
double raw_metric(const char *text, const char *series);

/* Counters of the daemon (whole daemon when run as root). */
Ccs__StatsReply *raw_stats(const char *socket_path);
/* Until the daemon holds at least `ops` calls (their ranks blocked in
 * them), for timeout_s at most: 0 when it does, -1 when it never did. */
int raw_wait_ops_in_flight(const char *socket_path, uint64_t ops, double timeout_s);
/* Until the daemon holds a comm (some) or none (!some), for timeout_s at
 * most: 0 when it does, -1 when it never did. */
int raw_wait_comms(const char *socket_path, int some, double timeout_s);

/* What a daemon holds: its fds and its counters. */
struct test_daemon_state {
  int fds;
  uint64_t sessions, comms, buffers, registered_bytes, ops_in_flight;
};
struct test_daemon;
/* A settled reading: what the daemon holds once recent closes are done. */
void test_daemon_state(const struct test_daemon *d, struct test_daemon_state *ret);
/* Waits up to 10 s (closes are asynchronous) for the daemon to hold what
 * `before` says, and to be alive; fails the test naming what grew. */
void test_daemon_assert_clean(const struct test_daemon *d, const struct test_daemon_state *before);

#endif
