/* libibverbs, reached at run time: dlopen of ib_library and one table of
 * its exported functions, so that ccsd runs where rdma-core is absent and
 * a test can point it at an emulated NIC. The data-path calls of verbs.h
 * (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) are
 * inline and go through the context's ops: they need nothing from here. */
#ifndef CCS_VERBS_LIB_H
#define CCS_VERBS_LIB_H

#include <stddef.h>

#include <infiniband/verbs.h>

struct verbs_lib {
  void *handle;
  struct ibv_device **(*get_device_list)(int *num);
  void (*free_device_list)(struct ibv_device **list);
  const char *(*get_device_name)(struct ibv_device *dev);
  struct ibv_context *(*open_device)(struct ibv_device *dev);
  int (*close_device)(struct ibv_context *ctx);
  int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
  /* the exported one: fills the prefix of ibv_port_attr older libraries knew */
  int (*query_port)(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *attr);
  int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
  struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
  int (*dealloc_pd)(struct ibv_pd *pd);
  struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
  int (*dereg_mr)(struct ibv_mr *mr);
  struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
  int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
  struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
                              struct ibv_comp_channel *ch, int comp_vector);
  int (*destroy_cq)(struct ibv_cq *cq);
  int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context);
  void (*ack_cq_events)(struct ibv_cq *cq, unsigned int n);
  struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
  int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
  int (*destroy_qp)(struct ibv_qp *qp);
  int (*get_async_event)(struct ibv_context *ctx, struct ibv_async_event *event);
  void (*ack_async_event)(struct ibv_async_event *event);
  const char *(*wc_status_str)(enum ibv_wc_status status);
  const char *(*event_type_str)(enum ibv_event_type type);
};

/* 0, or -1 with err saying what is missing (the library, or which entry
 * point). */
int ccs_verbs_lib_open(struct verbs_lib *lib, const char *path, char *err, size_t errlen);
void ccs_verbs_lib_close(struct verbs_lib *lib);

/* Port attributes whatever the library's age: the extended query where the
 * provider has one, else the exported call (as verbs.h's inline does). */
int ccs_verbs_query_port(const struct verbs_lib *lib, struct ibv_context *ctx, uint8_t port,
                         struct ibv_port_attr *attr);

#endif
