/* The links to other daemons, shared by tenant weight. A link is one
 * peer address: every comm's data connections to that daemon. A send
 * waits on its link in its tenant's queue (one per class, as on the
 * executor) and goes when base/fair.c's start-time fair queueing by bytes
 * says; at most the window's bytes are posted to the transport at once,
 * so the order is decided here and not by whoever filled the socket's
 * buffer first. A tenant's cap (tenant_max_share) is a fraction of the
 * link's capacity: link_capacity from the configuration, or else the
 * fastest the link was measured to drain while it had a backlog.
 *
 * Used by the network thread alone (run/net.c): no locking. */
#ifndef CCSD_RUN_LINK_H
#define CCSD_RUN_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "base/fair.h"
#include "base/list.h"
#include "run/share.h"

struct net_link;

/* One send, embedded in the caller's record of it. */
struct link_send {
  struct list link;        /* queued: in its flow's class queue */
  struct run_share *share; /* whose */
  int prio;                /* its class (enum fair_class) */
  size_t bytes;
  struct net_link *on;     /* posted on it: its bytes hold the window */
};

struct net_links {
  struct net_link *by_addr;
  size_t window;   /* bytes posted at once, per link */
  double capacity; /* bytes a second per link; 0: measured */
};

void ccsd_links_init(struct net_links *ls, size_t window, double capacity);
/* Frees every link (their queues must be empty: ccsd_links_take). */
void ccsd_links_close(struct net_links *ls);

/* s, to the daemon at addr, waits on its link; the link, or NULL: no
 * memory (post s at once, outside the shares). */
struct net_link *ccsd_links_queue(struct net_links *ls, const char *addr, struct link_send *s);
/* The next send l lets go at now_ns, taken off its queue and holding the
 * window until ccsd_link_done; NULL: none may now. */
struct link_send *ccsd_link_next(struct net_link *l, uint64_t now_ns);
/* s, posted, is over (sent, failed, skipped): its room back. Nothing if
 * it never held any. */
void ccsd_link_done(struct link_send *s, uint64_t now_ns);

/* Every queued send for which match(arg, s) says 1 moves to `into`
 * (list of link_send.link), off the shares. */
void ccsd_links_take(struct net_links *ls, int (*match)(void *arg, struct link_send *s),
                     void *arg, struct list *into);
/* fn(arg, l) for every link. */
void ccsd_links_each(struct net_links *ls, void (*fn)(void *arg, struct net_link *l), void *arg);
/* What the shares use as l's capacity now (bytes a second; 0: not yet known). */
double ccsd_link_capacity(const struct net_link *l);

#endif
