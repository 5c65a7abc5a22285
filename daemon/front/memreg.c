/* Registered buffers: a client's sealed memfd, or its GPU allocation
 * (gpu.h), mapped once here.
 *
 * The size comes from fstat, never from the message, and the memfd must be
 * sealed against shrinking and growing: otherwise the client could truncate
 * it under a running op and the daemon would fault on the mapping. A buffer
 * stays mapped while an op in flight holds a reference, even after its
 * client deregistered it or died. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "front/front.h"
#include "base/log.h"

#define REQUIRED_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)

/* What a buffer costs its tenant: one of its quota_buffers (each is a
 * mapping, and vm.max_map_count is shared by every tenant: the daemon as a
 * whole maps at most half of it) and its bytes. */
static ccs_result_t charge(struct session *s, size_t size, struct tenant **ret, char *err,
                           size_t errlen) {
  struct daemon *d = s->d;
  if (d->nbuffers >= d->max_buffers) {
    snprintf(err, errlen, "this daemon holds %zu buffers, as many as it may map (half of "
             "vm.max_map_count): try again when others are deregistered", d->nbuffers);
    return CCS_ERR_QUOTA;
  }
  struct tenant *t;
  ccs_result_t rc = ccsd_tenant_charge(d, s->uid, TENANT_BUFFERS, 1, &t, err, errlen);
  if (rc != CCS_OK) return rc;
  if ((rc = ccsd_tenant_charge(d, s->uid, TENANT_REGISTERED_BYTES, size, &t, err, errlen)) != CCS_OK) {
    ccsd_tenant_release(t, TENANT_BUFFERS, 1);
    return rc;
  }
  d->nbuffers++;
  *ret = t;
  return CCS_OK;
}

static void uncharge(struct daemon *d, struct tenant *t, size_t size) {
  d->nbuffers--;
  ccsd_tenant_release(t, TENANT_REGISTERED_BYTES, size);
  ccsd_tenant_release(t, TENANT_BUFFERS, 1);
}

static void unmap(struct membuf *b) {
  if (b->ipc) ccsd_ipc_block_unref(b->ipc, ccsd_gpu_close_ipc);
  else if (b->device >= 0) ccsd_gpu_unmap(b->base, b->size);
  else munmap(b->base, b->size);
}

/* The mapping at base becomes buffer b of session s (or is undone). */
static ccs_result_t add(struct session *s, struct tenant *t, void *base, size_t size, int device,
                        struct ipc_block *ipc, struct membuf **ret, char *err, size_t errlen) {
  struct membuf *b = calloc(1, sizeof(*b));
  if (!b) {
    struct membuf undo = {.base = base, .size = size, .device = device, .ipc = ipc};
    ccsd_ipc_block_deregistered(ipc);
    unmap(&undo);
    uncharge(s->d, t, size);
    snprintf(err, errlen, "out of memory");
    return CCS_ERR_NO_MEMORY;
  }
  b->id = ++s->d->next_id;
  b->d = s->d;
  b->session = s;
  b->tenant = t;
  b->base = base;
  b->size = size;
  b->device = device;
  b->ipc = ipc;
  b->refs = 1;
  list_insert_tail(&s->buffers, &b->link);
  HASH_ADD(hh, s->d->buffers_by_id, id, sizeof(b->id), b);
  LOG_TRACE(CCS_LOG_MEM, "client %llu registered %s buffer %llu of %zu bytes",
            (unsigned long long)s->id, device < 0 ? "host" : "device", (unsigned long long)b->id,
            size);
  *ret = b;
  return CCS_OK;
}

ccs_result_t ccsd_memfd_check(int fd, size_t bytes, const char *what, char *err, size_t errlen) {
  struct stat st;
  int seals = fcntl(fd, F_GET_SEALS);
  if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != bytes) {
    snprintf(err, errlen, "%s must hold exactly %zu bytes", what, bytes);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  if (seals < 0 || (seals & REQUIRED_SEALS) != REQUIRED_SEALS) {
    snprintf(err, errlen, "%s must be sealed against shrinking and growing", what);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  return CCS_OK;
}

ccs_result_t ccsd_membuf_register(struct session *s, int fd, struct membuf **ret, char *err,
                                  size_t errlen) {
  struct stat st;
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & REQUIRED_SEALS) != REQUIRED_SEALS) {
    snprintf(err, errlen, "buffer must be a memfd sealed with F_SEAL_SHRINK|F_SEAL_GROW");
    close(fd);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size <= 0) {
    snprintf(err, errlen, "buffer memfd is empty or not a regular file");
    close(fd);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  size_t size = (size_t)st.st_size;
  struct tenant *t;
  ccs_result_t rc = charge(s, size, &t, err, errlen);
  if (rc != CCS_OK) {
    close(fd);
    return rc;
  }
  void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int saved = errno;
  close(fd); /* the mapping keeps the memory */
  if (base == MAP_FAILED) {
    uncharge(s->d, t, size);
    snprintf(err, errlen, "cannot map %zu bytes: %s", size, strerror(saved));
    return saved == ENOMEM ? CCS_ERR_NO_MEMORY : CCS_ERR_SYSTEM;
  }
  return add(s, t, base, size, -1, NULL, ret, err, errlen);
}

/* Device memory on a daemon without GPUs: refused with the reason. */
static ccs_result_t host_only(const struct session *s, char *err, size_t errlen) {
  snprintf(err, errlen, "this daemon runs host-only (%s): device buffers are not supported",
           s->d->gpu_absent);
  return CCS_ERR_UNSUPPORTED;
}

ccs_result_t ccsd_membuf_register_device(struct session *s, int fd, uint64_t size,
                                         const uint8_t *uuid, struct membuf **ret, char *err,
                                         size_t errlen) {
  if (!s->d->coll.gpu) {
    close(fd);
    return host_only(s, err, errlen);
  }
  struct tenant *t;
  ccs_result_t rc = charge(s, size, &t, err, errlen);
  if (rc != CCS_OK) {
    close(fd);
    return rc;
  }
  void *base;
  int device;
  if ((rc = ccsd_gpu_map(s->d->coll.gpu, fd, size, uuid, &base, &device, err, errlen)) != CCS_OK) {
    uncharge(s->d, t, size);
    return rc;
  }
  return add(s, t, base, (size_t)size, device, NULL, ret, err, errlen);
}

ccs_result_t ccsd_membuf_register_ipc(struct session *s, const uint8_t *handle,
                                      const uint8_t *uuid, uint64_t addr, uint64_t len,
                                      struct membuf **ret, char *err, size_t errlen) {
  if (!s->d->cfg.cuda_legacy_ipc) {
    snprintf(err, errlen, "legacy CUDA IPC handles are bearer tokens: this daemon accepts them "
             "only with cuda_legacy_ipc = true (trusted single-tenant nodes); allocate with "
             "ccs_mem_alloc_device, or pass the buffer unregistered (staged)");
    return CCS_ERR_PERMISSION;
  }
  if (!s->d->coll.gpu) return host_only(s, err, errlen);
  char *ptr;
  struct ipc_block *blk = ccsd_ipc_block_find(&s->ipc_blocks, addr, len, 0, &ptr);
  if (!blk) { /* a block not open yet, or retired (ipc_blocks.h) */
    void *opened, *block;
    size_t block_size;
    int device, held;
    ccs_result_t rc = ccsd_gpu_open_ipc(s->d->coll.gpu, handle, uuid, &opened, &block, &block_size,
                                        &device, &held, err, errlen);
    if (rc != CCS_OK) {
      if (!held || !(blk = ccsd_ipc_block_find(&s->ipc_blocks, addr, len, 1, &ptr))) return rc;
    } else if ((blk = ccsd_ipc_block_add(&s->ipc_blocks, addr, opened, block, block_size, device))) {
      ptr = opened;
    } else {
      ccsd_gpu_close_ipc(opened);
      snprintf(err, errlen, "out of memory, or the driver's range does not hold the opened handle");
      return CCS_ERR_NO_MEMORY;
    }
  }
  size_t size = ccsd_ipc_block_fit(blk, ptr, len);
  struct tenant *t;
  ccs_result_t rc = size ? charge(s, size, &t, err, errlen) : CCS_ERR_INVALID_ARGUMENT;
  if (rc != CCS_OK) {
    if (!size) snprintf(err, errlen, "an empty legacy IPC buffer");
    ccsd_ipc_block_deregistered(blk);
    ccsd_ipc_block_unref(blk, ccsd_gpu_close_ipc);
    return rc;
  }
  return add(s, t, ptr, size, blk->device, blk, ret, err, errlen);
}

/* Ids are unique in the daemon: one table for all, and naming another
 * client's buffer is told apart from naming none. */
struct membuf *ccsd_membuf_find(struct session *s, uint64_t id, ccs_result_t *ret_rc) {
  struct membuf *b;
  HASH_FIND(hh, s->d->buffers_by_id, &id, sizeof(id), b);
  if (b && b->session == s) return b;
  *ret_rc = b ? CCS_ERR_PERMISSION : CCS_ERR_INVALID_ARGUMENT;
  return NULL;
}

void ccsd_membuf_ref(struct membuf *b) { b->refs++; }

void ccsd_membuf_unref(struct membuf *b) {
  if (!b || --b->refs > 0) return;
  ccsd_peers_forget(b->d->coll.peers, b->base, b->size); /* registered between ops until now */
  unmap(b);
  uncharge(b->d, b->tenant, b->size);
  free(b);
}

void ccsd_membuf_deregister(struct membuf *b) {
  ccsd_ipc_block_deregistered(b->ipc);
  list_remove(&b->link);
  HASH_DELETE(hh, b->d->buffers_by_id, b);
  b->session = NULL; /* ops in flight may hold it a while longer */
  ccsd_membuf_unref(b);
}
