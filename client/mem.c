/* Memory the daemon can map: sealed memfds, or GPU allocations exported
 * as fds (gpu.c), passed over the socket.
 *
 * ccs_mem_alloc'ed buffers are registered once per connection (again,
 * lazily, after a fork or a daemon restart: the fd is kept for that).
 * Unregistered user buffers are staged through a pool of registered areas,
 * bounded in total by CCS_STAGING_MAX_BYTES (default 1 GiB). Under
 * libccs-alloc (alloc/ccs_alloc.c) large mallocs are memfds of this table
 * too, registered on first use. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

struct allocation {
  char *ptr;
  size_t size;
  int fd;
  int device; /* -1: host memory */
  int borrowed; /* the job's own device memory (ccs_mem_register): fd -1, handle in ipc */
  uint8_t ipc[CCS__IPC_MEM_BYTES];
  struct ccs__conn *conn; /* where id is valid; NULL: not registered */
  uint64_t id;
  /* a large malloc under libccs-alloc (alloc/ccs_alloc.c): registered on
   * first use; `refused` where the daemon would not take it (then staged);
   * `copied` in a forked child, which got a private copy (staged too) */
  int interposed, copied;
  struct ccs__conn *refused;
};

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static struct allocation *allocs;
static size_t nallocs, cap_allocs;

ccs_result_t ccs__memfd_map(size_t bytes, int *ret_fd, void **ret_ptr) {
  int fd = memfd_create("ccs", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    ccs__set_error("memfd_create: %s", strerror(errno));
    return CCS_ERR_SYSTEM;
  }
  if (ftruncate(fd, (off_t)bytes) ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
    ccs__set_error("cannot size and seal a %zu-byte memfd: %s", bytes, strerror(errno));
    close(fd);
    return CCS_ERR_SYSTEM;
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ccs__set_error("cannot map %zu bytes: %s", bytes, strerror(errno));
    close(fd);
    return errno == ENOMEM ? CCS_ERR_NO_MEMORY : CCS_ERR_SYSTEM;
  }
  *ret_fd = fd;
  *ret_ptr = p;
  return CCS_OK;
}

static void unmap(void *ptr, size_t size, int device) {
  if (device >= 0) ccs__gpu_unmap(ptr, size);
  else munmap(ptr, size);
}

/* Registers a memfd (device -1), a GPU allocation's fd, or (fd -1) the
 * legacy IPC handle `ipc` of the GPU allocation at addr. */
static ccs_result_t register_on(struct ccs__conn *c, int fd, int device, const void *addr,
                                size_t size, const uint8_t *ipc, uint64_t *ret_id) {
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__MemRegister m = CCS__MEM_REGISTER__INIT;
  uint8_t uuid[CCS__UUID_BYTES];
  if (device >= 0) {
    ccs_result_t rc = ccs__gpu_uuid(device, uuid);
    if (rc != CCS_OK) return rc;
    m.domain = ipc ? CCS__MEM_CUDA_IPC : CCS__MEM_CUDA;
    m.size = size;
    m.device.data = uuid;
    m.device.len = sizeof(uuid);
    if (ipc) m.ipc_handle = (ProtobufCBinaryData){CCS__IPC_MEM_BYTES, (uint8_t *)ipc};
    if (ipc) m.address = (uint64_t)(uintptr_t)addr; /* the daemon finds blocks it opened by it */
  }
  req.body_case = CCS__REQUEST__BODY_MEM_REGISTER;
  req.mem_register = &m;
  Ccs__Reply *reply;
  ccs_result_t rc = ccs__conn_call(c, &req, fd, &reply);
  if (rc != CCS_OK) return rc;
  if (reply->body_case != CCS__REPLY__BODY_MEM_REGISTER) {
    ccs__reply__free_unpacked(reply, NULL);
    ccs__set_error("daemon sent no buffer id");
    return CCS_ERR_PROTOCOL;
  }
  *ret_id = reply->mem_register->buffer;
  ccs__reply__free_unpacked(reply, NULL);
  return CCS_OK;
}

ccs_result_t ccs__mem_register_fd(struct ccs__conn *c, int fd, int device, size_t size,
                                  uint64_t *ret_id) {
  return register_on(c, fd, device, NULL, size, NULL, ret_id);
}

/* register_on for the job's own call, made again on the next connection
 * where the daemon went under it and comes back (*c moves there). */
static ccs_result_t register_riding(struct ccs__conn **c, int fd, int device, const void *addr,
                                    size_t size, const uint8_t *ipc, uint64_t *ret_id) {
  struct ccs__ride ride = {0};
  for (;;) {
    ccs_result_t rc = register_on(*c, fd, device, addr, size, ipc, ret_id);
    if (rc != CCS_ERR_DAEMON_UNAVAILABLE || !ccs__ride_again(c, &ride)) return rc;
  }
}

/* Adds a to the table (a->conn's reference becomes the table's). */
static ccs_result_t remember(const struct allocation *a) {
  pthread_mutex_lock(&mem_mu);
  if (nallocs == cap_allocs) {
    size_t cap = cap_allocs ? 2 * cap_allocs : 16;
    struct allocation *grown = realloc(allocs, cap * sizeof(*grown));
    if (!grown) {
      pthread_mutex_unlock(&mem_mu);
      ccs__set_error("out of memory");
      return CCS_ERR_NO_MEMORY;
    }
    allocs = grown;
    cap_allocs = cap;
  }
  allocs[nallocs++] = *a;
  pthread_mutex_unlock(&mem_mu);
  return CCS_OK;
}

void ccs__mem_deregister(struct ccs__conn *c, uint64_t id) {
  if (c->broken) return;
  Ccs__Request req = CCS__REQUEST__INIT;
  Ccs__MemDeregister m = CCS__MEM_DEREGISTER__INIT;
  m.buffer = id;
  req.body_case = CCS__REQUEST__BODY_MEM_DEREGISTER;
  req.mem_deregister = &m;
  Ccs__Reply *reply;
  if (ccs__conn_call(c, &req, -1, &reply) == CCS_OK) ccs__reply__free_unpacked(reply, NULL);
}

/* Host memory (device -1) or memory on a GPU, registered with the daemon. */
static ccs_result_t alloc(void **ptr, size_t bytes, int device) {
  if (!ptr || bytes == 0) {
    ccs__set_error("ccs_mem_alloc needs a pointer to fill and a non-zero size");
    return CCS_ERR_INVALID_ARGUMENT;
  }
  struct ccs__conn *c;
  ccs_result_t rc = device >= 0 ? ccs__gpu_usable() : CCS_OK;
  if (rc != CCS_OK) return rc;
  if ((rc = ccs__conn_get(&c)) != CCS_OK) return rc;
  int fd;
  void *p;
  uint64_t id;
  rc = device >= 0 ? ccs__gpu_alloc(device, bytes, &p, &bytes, &fd) : ccs__memfd_map(bytes, &fd, &p);
  if (rc != CCS_OK) goto out;
  if ((rc = register_riding(&c, fd, device, NULL, bytes, NULL, &id)) != CCS_OK) {
    unmap(p, bytes, device);
    close(fd);
    goto out;
  }
  struct allocation a = {.ptr = p, .size = bytes, .fd = fd, .device = device, .conn = c, .id = id};
  ccs__conn_ref(c);
  if ((rc = remember(&a)) != CCS_OK) {
    ccs__conn_put(c);
    ccs__mem_deregister(c, id);
    unmap(p, bytes, device);
    close(fd);
    goto out;
  }
  *ptr = p;
out:
  ccs__conn_put(c);
  return rc;
}

CCS__API ccs_result_t ccs_mem_alloc(void **ptr, size_t bytes) { return alloc(ptr, bytes, -1); }

CCS__API int ccs_mem_device_of(const void *ptr) { return ccs__gpu_device_of(ptr); }

CCS__API int ccs_current_device(void) { return ccs__gpu_current_device(); }

CCS__API ccs_result_t ccs_mem_alloc_device(void **ptr, size_t bytes, int device) {
  if (device < 0) {
    ccs__set_error("ccs_mem_alloc_device: device %d", device);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  return alloc(ptr, bytes, device);
}

/* Takes the table's entry starting at ptr, if its kind is `borrowed`. */
static int take(const void *ptr, int borrowed, struct allocation *ret) {
  int found = -1;
  pthread_mutex_lock(&mem_mu);
  for (size_t i = 0; i < nallocs; i++)
    if (allocs[i].ptr == ptr && allocs[i].borrowed == borrowed && !allocs[i].interposed) {
      *ret = allocs[i];
      allocs[i] = allocs[--nallocs];
      found = 0;
      break;
    }
  pthread_mutex_unlock(&mem_mu);
  return found;
}

static void forget(struct allocation *a) {
  if (!a->conn) return;
  ccs__mem_deregister(a->conn, a->id);
  ccs__conn_put(a->conn);
}

CCS__API ccs_result_t ccs_mem_free(void *ptr) {
  if (!ptr) return CCS_OK;
  struct allocation a = {0};
  if (take(ptr, 0, &a)) {
    ccs__set_error("ccs_mem_free: %p was not returned by ccs_mem_alloc or ccs_mem_alloc_device",
                   ptr);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  forget(&a);
  unmap(a.ptr, a.size, a.device);
  close(a.fd);
  return CCS_OK;
}

CCS__API ccs_result_t ccs_mem_register(void *ptr, size_t bytes) {
  if (!ptr || bytes == 0) {
    ccs__set_error("ccs_mem_register needs a pointer and a non-zero size");
    return CCS_ERR_INVALID_ARGUMENT;
  }
  struct allocation a = {.fd = -1, .borrowed = 1};
  ccs_result_t rc = ccs__gpu_ipc_handle(ptr, (void **)&a.ptr, &a.size, a.ipc, &a.device);
  if (rc != CCS_OK) return rc;
  if ((char *)ptr + bytes > a.ptr + a.size) {
    ccs__set_error("ccs_mem_register: %zu bytes from %p run past their allocation", bytes, ptr);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  struct ccs__conn *c;
  if ((rc = ccs__conn_get(&c)) != CCS_OK) return rc;
  if ((rc = register_riding(&c, -1, a.device, a.ptr, a.size, a.ipc, &a.id)) == CCS_OK) {
    ccs__conn_ref(c);
    a.conn = c;
    if ((rc = remember(&a)) != CCS_OK) forget(&a);
  }
  ccs__conn_put(c);
  return rc;
}

CCS__API ccs_result_t ccs_mem_deregister(void *ptr) {
  struct allocation a = {0};
  void *base = NULL;
  size_t size;
  uint8_t ipc[CCS__IPC_MEM_BYTES];
  int device;
  /* the table holds the allocation's start; ptr may lie inside it */
  if (ptr && ccs__gpu_ipc_handle(ptr, &base, &size, ipc, &device) != CCS_OK) base = ptr;
  if (!ptr || take(base, 1, &a)) {
    ccs__set_error("ccs_mem_deregister: %p was not registered by ccs_mem_register", ptr);
    return CCS_ERR_INVALID_ARGUMENT;
  }
  forget(&a);
  return CCS_OK;
}

int ccs__mem_device_of(const void *ptr) {
  const char *p = ptr;
  int device = -2;
  pthread_mutex_lock(&mem_mu);
  for (size_t i = 0; i < nallocs && device == -2; i++)
    if (p >= allocs[i].ptr && p < allocs[i].ptr + allocs[i].size) device = allocs[i].device;
  pthread_mutex_unlock(&mem_mu);
  return device;
}

int ccs__mem_lookup(struct ccs__conn *c, const void *ptr, size_t len, uint64_t *ret_id,
                    uint64_t *ret_off) {
  const char *p = ptr;
  int found = 1;
  pthread_mutex_lock(&mem_mu);
  for (size_t i = 0; i < nallocs; i++) {
    struct allocation *a = &allocs[i];
    if (p < a->ptr || p >= a->ptr + a->size || len > (size_t)(a->ptr + a->size - p)) continue;
    if (a->copied || (a->interposed && a->refused == c)) break; /* staged */
    if (a->conn != c) {
      /* Made on an older connection (fork, daemon restart), or not yet
       * registered (a large malloc): register here. */
      uint64_t id;
      if (register_on(c, a->fd, a->device, a->ptr, a->size, a->borrowed ? a->ipc : NULL, &id) != CCS_OK) {
        if (a->interposed) a->refused = c; /* a quota, say: it is staged as any malloc'd buffer */
        else found = -1;
        break;
      }
      if (a->conn) ccs__conn_put(a->conn);
      ccs__conn_ref(c);
      a->conn = c;
      a->id = id;
    }
    *ret_id = a->id;
    *ret_off = (uint64_t)(p - a->ptr);
    found = 0;
    break;
  }
  pthread_mutex_unlock(&mem_mu);
  return found;
}

/* --- libccs-alloc: large mallocs the daemon can map ----------------------- */

CCS__API void *ccs_interpose_alloc(size_t bytes) {
  size_t size = (bytes + 4095) & ~(size_t)4095;
  int fd;
  void *p;
  if (size < bytes || ccs__memfd_map(size, &fd, &p) != CCS_OK) return NULL;
  struct allocation a = {.ptr = p, .size = size, .fd = fd, .device = -1, .interposed = 1};
  if (remember(&a) != CCS_OK) {
    munmap(p, size);
    close(fd);
    return NULL;
  }
  return p;
}

/* 0 when ptr was a block (now gone), -1 when it is none. */
CCS__API int ccs_interpose_free(void *ptr) {
  struct allocation a = {0};
  int found = -1;
  pthread_mutex_lock(&mem_mu);
  for (size_t i = 0; i < nallocs; i++)
    if (allocs[i].ptr == ptr && allocs[i].interposed) {
      a = allocs[i];
      allocs[i] = allocs[--nallocs];
      found = 0;
      break;
    }
  pthread_mutex_unlock(&mem_mu);
  if (found) return -1;
  if (!a.copied) forget(&a);
  munmap(a.ptr, a.size);
  if (a.fd >= 0) close(a.fd);
  return 0;
}

/* Around fork (pthread_atfork): 0 before, 1 in the parent after, 2 in the
 * child after. The child gets a private copy of every block, as fork
 * gives of any malloc'd memory: a shared mapping would let parent and
 * child see each other's writes. */
CCS__API void ccs_interpose_fork(int phase) {
  if (phase == 0) {
    pthread_mutex_lock(&mem_mu);
    return;
  }
  if (phase == 2)
    for (size_t i = 0; i < nallocs; i++) {
      struct allocation *a = &allocs[i];
      if (!a->interposed || a->copied) continue;
      void *copy = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (copy == MAP_FAILED) abort(); /* no memory for the child's copy: as a failed fork would */
      memcpy(copy, a->ptr, a->size);
      if (mremap(copy, a->size, a->size, MREMAP_MAYMOVE | MREMAP_FIXED, a->ptr) == MAP_FAILED) abort();
      close(a->fd);
      a->fd = -1;
      a->copied = 1;
    }
  pthread_mutex_unlock(&mem_mu);
}

/* --- staging --- */

static pthread_mutex_t staging_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ccs__staging *free_staging;
static size_t staging_bytes; /* mapped, in use or free */

static size_t staging_limit(void) {
  unsigned long long v;
  return ccs__env_bytes("CCS_STAGING_MAX_BYTES", &v) && v ? (size_t)v : (size_t)1 << 30;
}

static void staging_unmap(struct ccs__staging *s) {
  ccs__mem_deregister(s->conn, s->id);
  ccs__conn_put(s->conn);
  if (s->free_after) ccs__gpu_event_free(s->free_after);
  unmap(s->base, s->size, s->device);
  staging_bytes -= s->size;
  free(s);
}

ccs_result_t ccs__staging_take(struct ccs__conn *c, size_t bytes, int device,
                               struct ccs__staging **ret) {
  pthread_mutex_lock(&staging_mu);
  struct ccs__staging **best = NULL;
  for (struct ccs__staging **p = &free_staging; *p; p = &(*p)->next) {
    if ((*p)->conn != c || (*p)->conn->broken || (*p)->device != device) continue;
    if ((*p)->free_after && !ccs__gpu_event_done((*p)->free_after)) continue;
    if ((*p)->size >= bytes && (!best || (*p)->size < (*best)->size)) best = p;
  }
  if (best) {
    struct ccs__staging *s = *best;
    *best = s->next;
    pthread_mutex_unlock(&staging_mu);
    *ret = s;
    return CCS_OK;
  }
  /* Make room: drop free areas that are too small or on old connections. */
  for (struct ccs__staging **p = &free_staging; *p && staging_bytes + bytes > staging_limit();) {
    struct ccs__staging *s = *p;
    if (s->free_after && !ccs__gpu_event_done(s->free_after)) { /* the GPU still uses it */
      p = &s->next;
      continue;
    }
    *p = s->next;
    staging_unmap(s);
  }
  size_t size = (size_t)1 << 20;
  while (size < bytes) size <<= 1;
  size_t limit = staging_limit();
  if (size > limit && bytes <= limit) size = bytes;
  if (staging_bytes + size > limit) {
    pthread_mutex_unlock(&staging_mu);
    ccs__set_error("unregistered buffers need %zu bytes of staging, over the limit of %zu "
                   "(CCS_STAGING_MAX_BYTES); allocate them with ccs_mem_alloc, or run the program with "
                   "LD_PRELOAD=libccs-alloc.so", bytes, limit);
    return CCS_ERR_NO_MEMORY;
  }
  struct ccs__staging *s = calloc(1, sizeof(*s));
  int fd = -1;
  ccs_result_t rc = !s                ? CCS_ERR_NO_MEMORY
                    : device >= 0     ? ccs__gpu_alloc(device, size, &s->base, &size, &fd)
                                      : ccs__memfd_map(size, &fd, &s->base);
  if (rc == CCS_OK) {
    rc = ccs__mem_register_fd(c, fd, device, size, &s->id);
    close(fd);
    if (rc != CCS_OK) unmap(s->base, size, device);
  }
  if (rc != CCS_OK) {
    free(s);
    pthread_mutex_unlock(&staging_mu);
    return rc;
  }
  s->size = size;
  s->device = device;
  s->conn = c;
  ccs__conn_ref(c);
  staging_bytes += size;
  pthread_mutex_unlock(&staging_mu);
  *ret = s;
  return CCS_OK;
}

void ccs__staging_release(struct ccs__staging *s, void *stream) {
  if (!s) return;
  /* without an event the area waits for the whole stream: never reused early */
  if (s->device >= 0 && ccs__gpu_record(&s->free_after, s->device, stream) != CCS_OK &&
      ccs__gpu_sync(stream) != CCS_OK) {
    ccs__set_error("a device staging area was dropped: its stream cannot be waited for");
    return; /* leaked rather than overwritten under a running copy */
  }
  pthread_mutex_lock(&staging_mu);
  s->next = free_staging;
  free_staging = s;
  pthread_mutex_unlock(&staging_mu);
}
