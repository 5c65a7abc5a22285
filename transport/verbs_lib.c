/* The table of libibverbs entry points (verbs_lib.h). */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "verbs_lib.h"

#define ENTRY(field, symbol) {#symbol, offsetof(struct verbs_lib, field)}
static const struct {
  const char *symbol;
  size_t offset;
} entries[] = {
    ENTRY(get_device_list, ibv_get_device_list),
    ENTRY(free_device_list, ibv_free_device_list),
    ENTRY(get_device_name, ibv_get_device_name),
    ENTRY(open_device, ibv_open_device),
    ENTRY(close_device, ibv_close_device),
    ENTRY(query_device, ibv_query_device),
    ENTRY(query_port, ibv_query_port),
    ENTRY(query_gid, ibv_query_gid),
    ENTRY(alloc_pd, ibv_alloc_pd),
    ENTRY(dealloc_pd, ibv_dealloc_pd),
    ENTRY(reg_mr, ibv_reg_mr),
    ENTRY(dereg_mr, ibv_dereg_mr),
    ENTRY(create_comp_channel, ibv_create_comp_channel),
    ENTRY(destroy_comp_channel, ibv_destroy_comp_channel),
    ENTRY(create_cq, ibv_create_cq),
    ENTRY(destroy_cq, ibv_destroy_cq),
    ENTRY(get_cq_event, ibv_get_cq_event),
    ENTRY(ack_cq_events, ibv_ack_cq_events),
    ENTRY(create_qp, ibv_create_qp),
    ENTRY(modify_qp, ibv_modify_qp),
    ENTRY(destroy_qp, ibv_destroy_qp),
    ENTRY(get_async_event, ibv_get_async_event),
    ENTRY(ack_async_event, ibv_ack_async_event),
    ENTRY(wc_status_str, ibv_wc_status_str),
    ENTRY(event_type_str, ibv_event_type_str),
};

int ccs_verbs_lib_open(struct verbs_lib *lib, const char *path, char *err, size_t errlen) {
  memset(lib, 0, sizeof(*lib));
  lib->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib->handle) {
    snprintf(err, errlen, "cannot load %s (rdma-core's libibverbs): %s", path, dlerror());
    return -1;
  }
  for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
    void *fn = dlsym(lib->handle, entries[i].symbol);
    if (!fn) {
      snprintf(err, errlen, "%s has no %s", path, entries[i].symbol);
      ccs_verbs_lib_close(lib);
      return -1;
    }
    memcpy((char *)lib + entries[i].offset, &fn, sizeof(fn));
  }
  return 0;
}

void ccs_verbs_lib_close(struct verbs_lib *lib) {
  if (lib->handle) dlclose(lib->handle);
  memset(lib, 0, sizeof(*lib));
}

int ccs_verbs_query_port(const struct verbs_lib *lib, struct ibv_context *ctx, uint8_t port,
                         struct ibv_port_attr *attr) {
  memset(attr, 0, sizeof(*attr));
  struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx) return vctx->query_port(ctx, port, attr, sizeof(*attr));
  return lib->query_port(ctx, port, (struct _compat_ibv_port_attr *)attr);
}
