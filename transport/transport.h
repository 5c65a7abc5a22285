/* Bytes between daemons: one small interface, one implementation per
 * fabric (TCP everywhere; RDMA verbs where rdma-core and a device exist).
 * Whoever drives it posts sends and receives, each matched by a tag in
 * order per connection, and polls for completions; nothing blocks but
 * poll's own timeout. Every connection is authenticated (auth.h) before
 * anything posted on it moves. A message that arrives before its receive
 * is posted is held until it is, also after the connection closed. */
#ifndef CCS_TRANSPORT_H
#define CCS_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <poll.h>

struct transport;
struct tconn;
struct tmem; /* a registered range of memory */

struct tcompletion {
  struct tconn *conn;
  uint64_t tag;
  void *user;    /* what the send or receive was given */
  int is_send;
  int status;    /* 0, or a negative errno: the connection failed */
  size_t bytes;
};

/* What a transport is opened with. */
struct transport_params {
  uint8_t key[32];            /* the cluster key: every connection proves both ends hold it */
  int encrypt_data;           /* ask that data messages be encrypted (control ones always are) */
  size_t max_conns;           /* connections at once; more are refused */
  uint64_t unexpected_per_conn, unexpected_total; /* bytes held before their receive */
  double greeting_timeout_s;  /* a connection not authenticated by then fails */
  /* verbs ("ib") only */
  const char *ib_library;     /* libibverbs to load (NULL: libibverbs.so.1) */
  const char *ib_devices;     /* "dev[:port],..." to choose from (NULL or "": every active port) */
  int ib_gid_index;           /* the GID table entry to use; -1: chosen by type and address family */
};

/* Registered messages sent, by the way they went (verbs: written into the
 * receiver's buffer; eager over TCP, being small or because no answer came
 * in time; or small, by SEND into a buffer the receiver posted). */
struct transport_counters {
  uint64_t rdma_messages, rdma_bytes, eager_messages, eager_bytes, send_messages, send_bytes;
};

struct transport_ops {
  const char *name;
  struct transport *(*open)(const struct transport_params *params, char *err, size_t errlen);
  /* "HOST:PORT" (port 0: any); the bound address comes back in bound */
  int (*listen)(struct transport *t, const char *addr, char *bound, size_t boundlen, char *err,
                size_t errlen);
  /* Numeric addresses only. Returns at once: sends and receives queue until the
   * connection is open; a connect or greeting that fails fails them. */
  int (*connect)(struct transport *t, const char *addr, struct tconn **ret, char *err,
                 size_t errlen);
  /* 1: one, 0: none yet, -1: one refused or none could be taken (err says
   * why; call again) */
  int (*accept)(struct transport *t, struct tconn **ret, char *err, size_t errlen);
  /* Memory that sends and receives may read or write. A fabric that must pin memory and
   * key it (verbs) does so here; TCP only records the range. Either thread
   * may register and deregister; a range is deregistered after its last
   * send or receive completed. */
  struct tmem *(*mem_register)(struct transport *t, void *base, size_t len, char *err,
                               size_t errlen);
  void (*mem_deregister)(struct tmem *m);
  /* A send or receive names the registration its buffer lies in, one outside it
   * is refused with -EFAULT: a miscomputed offset can never make the
   * network read or write other memory. m NULL: a small message of the
   * caller's own (control). A tag's sends and receives all name a
   * registration or none does (verbs moves the former by RDMA). Tags
   * 0x1bcc5b1b00000001-4 are the verbs transport's own. */
  int (*send)(struct tconn *c, struct tmem *m, const void *buf, size_t len, uint64_t tag,
              void *user);
  int (*recv)(struct tconn *c, struct tmem *m, void *buf, size_t len, uint64_t tag, void *user);
  /* up to max completions, waiting at most timeout_ms for the first */
  int (*poll)(struct transport *t, int timeout_ms, struct tcompletion *out, int max);
  /* What a poll would wait for, for a caller that waits without holding
   * the transport (another thread may drive it meanwhile): up to max
   * descriptors, the wake-up's first; returns how many there are. A poll
   * then takes what they announced. */
  int (*wait_fds)(struct transport *t, struct pollfd *fds, int max);
  /* Its pending sends and receives complete with -ECANCELED (and conn NULL: it is gone). */
  void (*close)(struct tconn *c);
  /* From any thread: a poll in progress (or the next one) returns at once.
   * poll also returns when a connection waits to be accepted. */
  void (*wake)(struct transport *t);
  void (*free)(struct transport *t);
  void (*peer_name)(struct tconn *c, char *buf, size_t len); /* "ADDR:PORT" of the other end */
  /* 1 while a message that no receive has taken yet is held or arriving
   * on c: its sender may count it sent. */
  int (*holds)(struct tconn *c);
  /* A connection whose other end went: hands each message it holds that
   * no receive took to each(arg, tag, data, len), data then the caller's
   * to free, and forgets them. 1 when the other end closed it cleanly
   * after its last message (every whole message it sent is among them or
   * was taken), 0 while it is still open, -1 when it failed otherwise;
   * nothing is handed unless 1. each NULL: only says which. NULL: never. */
  int (*take_held)(struct tconn *c, void (*each)(void *arg, uint64_t tag, void *data, size_t len),
                   void *arg);
  /* Why a failed connection failed, where the transport knows more than
   * its status says (verbs: the device, port and event): 2 when this
   * end's device failed (nothing the peer did), 1 for other failures, 0
   * when it has nothing to add. NULL: never. */
  int (*failure)(struct tconn *c, char *buf, size_t len);
  void (*describe)(struct transport *t, char *buf, size_t len); /* for the log: what it runs on */
  void (*counters)(struct transport *t, struct transport_counters *out); /* NULL: none kept */
  /* Bytes per second a link to another daemon carries, for the tuner;
   * NULL, or 0: as TCP does on these machines (plan/tuner.c). */
  double (*link_rate)(struct transport *t);
};

extern const struct transport_ops ccs_transport_tcp;
extern const struct transport_ops ccs_transport_ib; /* where built with rdma-core's headers */

/* The transport called name (registry.c), or NULL. */
const struct transport_ops *ccs_transport_find(const char *name);
/* Every transport's name, comma-separated: for errors. */
void ccs_transport_names(char *buf, size_t len);

#endif
