/* A session's legacy CUDA IPC blocks (ipc_blocks.h). */
#include <stdlib.h>

#include "front/ipc_blocks.h"

struct ipc_block *ccsd_ipc_block_find(struct list *blocks, uint64_t addr, uint64_t len,
                                      int retired, char **ret_ptr) {
  struct ipc_block *found = NULL;
  struct list *it, *tmp;
  LIST_FOREACH_SAFE(it, tmp, blocks) {
    struct ipc_block *b = LIST_ENTRY(it, struct ipc_block, link);
    if (addr < b->client_base || addr - b->client_base >= b->size) continue;
    if (retired) { /* the driver's latest block there, whatever its state */
      found = b;
      continue;
    }
    if (b->regs > 0 && len <= b->size - (addr - b->client_base)) {
      found = b;
      break;
    }
  }
  if (!found || (retired && (found->regs > 0 || len > found->size - (addr - found->client_base))))
    return NULL;
  *ret_ptr = found->base + (addr - found->client_base);
  found->refs++;
  found->regs++;
  return found;
}

struct ipc_block *ccsd_ipc_block_add(struct list *blocks, uint64_t addr, void *opened,
                                     void *base, size_t size, int device) {
  uintptr_t at = (uintptr_t)opened, lo = (uintptr_t)base;
  if (at < lo || at - lo >= size || addr < at - lo) return NULL;
  struct ipc_block *b = calloc(1, sizeof(*b));
  if (!b) return NULL;
  b->client_base = addr - (at - lo);
  b->base = base;
  b->size = size;
  b->device = device;
  b->opened = opened;
  b->refs = b->regs = 1;
  list_insert_tail(blocks, &b->link);
  return b;
}

void ccsd_ipc_block_deregistered(struct ipc_block *b) {
  if (b && b->regs > 0) b->regs--;
}

size_t ccsd_ipc_block_fit(const struct ipc_block *b, const char *ptr, uint64_t len) {
  size_t room = (size_t)(b->base + b->size - ptr);
  return len < room ? (size_t)len : room;
}

void ccsd_ipc_block_unref(struct ipc_block *b, void (*close)(void *opened)) {
  if (!b || --b->refs > 0) return;
  list_remove(&b->link); /* a detached block's link points at itself */
  close(b->opened);
  free(b);
}

void ccsd_ipc_blocks_detach(struct list *blocks) {
  while (!list_empty(blocks)) list_remove(blocks->next);
}
