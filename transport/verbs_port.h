/* Which RDMA ports a daemon uses: the devices and ports ib_devices names
 * (all when empty), those of them that are active (its rails), and on
 * each the GID other daemons address it by. */
#ifndef CCS_VERBS_PORT_H
#define CCS_VERBS_PORT_H

#include <stddef.h>
#include <stdint.h>

#include "verbs_lib.h"

#define CCS_IB_WANT_MAX 16

struct ib_want { /* one entry of ib_devices: "mlx5_0:1", or "mlx5_0" for its every port */
  char dev[64];
  int port; /* 0: any */
};

/* "dev[:port],..." into want; returns how many (0 for an empty spec), or -1
 * with err. */
int ccs_ib_parse_devices(const char *spec, struct ib_want *want, int max, char *err, size_t errlen);

/* A GID table entry as the port reports it. type: from sysfs
 * (gid_attrs/types), NULL where the system does not say. */
struct ib_gid_entry {
  uint8_t raw[16];
  const char *type;
};

/* The GID to use: on InfiniBand index 0; on Ethernet (RoCE) a RoCE v2
 * entry with an IPv4-mapped address, else a RoCE v2 IPv6 one, else (types
 * unknown) the first IPv4-mapped entry; never an all-zero one. forced >= 0
 * (ib_gid_index) wins where that entry exists. Returns the index or -1. */
int ccs_ib_pick_gid(const struct ib_gid_entry *gids, int n, int ethernet, int forced);

struct ib_port {
  struct ibv_context *ctx;
  char dev[64];
  int port, gid_index, ethernet;
  union ibv_gid gid;
  struct ibv_port_attr attr;
};

#define CCS_IB_RAILS_MAX 8 /* ports a daemon drives at once */

/* Opens every active port that want allows (want NULL or nwant 0: every
 * port), up to max, each on a device context of its own, and picks its
 * GID. Returns how many (out[0..n-1]), or -1 with err saying what was
 * found instead (no devices, which ports are down, no usable GID). */
int ccs_ib_open_ports(const struct verbs_lib *lib, const struct ib_want *want, int nwant,
                      int gid_index, struct ib_port *out, int max, char *err, size_t errlen);

/* A link's speed in Gbit/s from the port's width and speed codes (0:
 * unknown): for the tuner's model and the log. */
double ccs_ib_port_gbps(const struct ibv_port_attr *attr);

struct transport;
/* Tests (verbs.c): the transport's connections from now on speak an older
 * wire (0: as a daemon from before small messages went by SEND; 1: as one
 * whose bounce buffers took 8 KiB). */
void ccs_ib_test_wire(struct transport *t, unsigned wire);
struct tconn;
/* ... the SENDs the connection's peer takes now (-1: its queue pair is not up). */
int ccs_ib_test_credits(const struct tconn *c);

#endif
