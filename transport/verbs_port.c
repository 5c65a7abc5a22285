/* Port and GID selection (verbs_port.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_port.h"

int ccs_ib_parse_devices(const char *spec, struct ib_want *want, int max, char *err, size_t errlen) {
  int n = 0;
  const char *p = spec ? spec : "";
  while (*p) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *colon = memchr(p, ':', len);
    size_t name_len = colon ? (size_t)(colon - p) : len;
    if (n == max) {
      snprintf(err, errlen, "more than %d entries in ib_devices", max);
      return -1;
    }
    if (!name_len || name_len >= sizeof(want[n].dev)) {
      snprintf(err, errlen, "bad device in ib_devices '%s': DEVICE[:PORT],...", spec);
      return -1;
    }
    memcpy(want[n].dev, p, name_len);
    want[n].dev[name_len] = 0;
    want[n].port = 0;
    if (colon) {
      char num[8] = {0};
      size_t digits = len - name_len - 1;
      char *stop;
      if (digits && digits < sizeof(num)) memcpy(num, colon + 1, digits);
      long port = digits && digits < sizeof(num) ? strtol(num, &stop, 10) : 0;
      if (port < 1 || port > 255 || *stop) {
        snprintf(err, errlen, "bad port in ib_devices '%s': ports count from 1", spec);
        return -1;
      }
      want[n].port = (int)port;
    }
    n++;
    if (!end) break;
    p = end + 1;
  }
  return n;
}

static int all_zero(const uint8_t *raw) {
  for (int i = 0; i < 16; i++)
    if (raw[i]) return 0;
  return 1;
}

static int ipv4_mapped(const uint8_t *raw) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return !memcmp(raw, prefix, sizeof(prefix));
}

static int roce_v2(const char *type) { return type && strstr(type, "v2"); }

int ccs_ib_pick_gid(const struct ib_gid_entry *gids, int n, int ethernet, int forced) {
  if (forced >= 0) return forced < n && !all_zero(gids[forced].raw) ? forced : -1;
  if (!ethernet) return n > 0 && !all_zero(gids[0].raw) ? 0 : -1;
  int v2_ipv6 = -1, mapped = -1;
  for (int i = 0; i < n; i++) {
    if (all_zero(gids[i].raw)) continue;
    if (roce_v2(gids[i].type) && ipv4_mapped(gids[i].raw)) return i;
    if (roce_v2(gids[i].type) && v2_ipv6 < 0) v2_ipv6 = i;
    if (!gids[i].type && ipv4_mapped(gids[i].raw) && mapped < 0) mapped = i;
  }
  return v2_ipv6 >= 0 ? v2_ipv6 : mapped;
}

static int wanted(const struct ib_want *want, int nwant, const char *dev, int port) {
  if (!want || !nwant) return 1;
  for (int i = 0; i < nwant; i++)
    if (!strcmp(want[i].dev, dev) && (!want[i].port || want[i].port == port)) return 1;
  return 0;
}

/* The GID types the kernel lists for a RoCE port (sysfs); NULL entries where
 * it does not. */
static void gid_types(const char *dev, int port, int n, char (*types)[32], struct ib_gid_entry *g) {
  for (int i = 0; i < n; i++) {
    char path[256];
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev, port, i);
    FILE *f = fopen(path, "r");
    g[i].type = NULL;
    if (!f) continue;
    if (fgets(types[i], sizeof(types[i]), f)) g[i].type = types[i];
    fclose(f);
  }
}

static int pick_port_gid(const struct verbs_lib *lib, struct ib_port *out, int forced) {
  enum { GIDS_MAX = 128 };
  int n = out->attr.gid_tbl_len < GIDS_MAX ? out->attr.gid_tbl_len : GIDS_MAX;
  struct ib_gid_entry gids[GIDS_MAX];
  static char types[GIDS_MAX][32];
  for (int i = 0; i < n; i++)
    if (lib->query_gid(out->ctx, (uint8_t)out->port, i, (union ibv_gid *)gids[i].raw))
      memset(gids[i].raw, 0, 16);
  gid_types(out->dev, out->port, n, types, gids);
  int index = ccs_ib_pick_gid(gids, n, out->ethernet, forced);
  if (index < 0) return -1;
  out->gid_index = index;
  memcpy(out->gid.raw, gids[index].raw, 16);
  return 0;
}

int ccs_ib_open_ports(const struct verbs_lib *lib, const struct ib_want *want, int nwant,
                      int gid_index, struct ib_port *out, int max, char *err, size_t errlen) {
  int ndev = 0;
  struct ibv_device **list = lib->get_device_list(&ndev);
  if (!list || !ndev) {
    snprintf(err, errlen, "no RDMA devices");
    if (list) lib->free_device_list(list);
    return -1;
  }
  size_t said = (size_t)snprintf(err, errlen, "no active port among");
  int found = 0;
  for (int d = 0; d < ndev && found < max; d++) {
    const char *name = lib->get_device_name(list[d]);
    struct ibv_context *ctx = lib->open_device(list[d]);
    struct ibv_device_attr dattr;
    if (!ctx) continue;
    if (lib->query_device(ctx, &dattr)) dattr.phys_port_cnt = 0;
    int taken = 0; /* ctx serves a port found: a second port of the device opens its own */
    for (int port = 1; port <= dattr.phys_port_cnt && found < max; port++) {
      if (!wanted(want, nwant, name, port)) continue;
      struct ib_port *o = &out[found];
      memset(o, 0, sizeof(*o));
      o->ctx = ctx;
      o->port = port;
      snprintf(o->dev, sizeof(o->dev), "%s", name);
      int up = !ccs_verbs_query_port(lib, ctx, (uint8_t)port, &o->attr) && o->attr.state == IBV_PORT_ACTIVE;
      o->ethernet = o->attr.link_layer == IBV_LINK_LAYER_ETHERNET;
      const char *why = !up ? "down" : pick_port_gid(lib, o, gid_index) ? "no usable GID" : NULL;
      if (!why && taken && !(o->ctx = lib->open_device(list[d]))) why = "cannot open the device again";
      if (!why) {
        found++;
        taken = 1;
      } else if (said < errlen) {
        said += (size_t)snprintf(err + said, errlen - said, " %s:%d (%s)", name, port, why);
      }
    }
    if (!taken) lib->close_device(ctx);
  }
  lib->free_device_list(list);
  if (!found && said < errlen && nwant) snprintf(err + said, errlen - said, " of ib_devices");
  return found ? found : -1;
}

double ccs_ib_port_gbps(const struct ibv_port_attr *attr) {
  double lanes;
  switch (attr->active_width) {
  case 1: lanes = 1; break;
  case 2: lanes = 4; break;
  case 4: lanes = 8; break;
  case 8: lanes = 12; break;
  case 16: lanes = 2; break;
  default: return 0;
  }
  double lane;
  switch (attr->active_speed) {
  case 1: lane = 2.5; break;   /* SDR */
  case 2: lane = 5; break;     /* DDR */
  case 4: case 8: lane = 10; break; /* QDR, FDR10 */
  case 16: lane = 14.0625; break;   /* FDR */
  case 32: lane = 25.78125; break;  /* EDR */
  case 64: lane = 53.125; break;    /* HDR */
  case 128: lane = 106.25; break;   /* NDR */
  default: return 0;
  }
  return lanes * lane;
}
