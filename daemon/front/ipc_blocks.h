/* Legacy CUDA IPC opens driver blocks, not buffers: small cudaMalloc
 * allocations share one block (2 MiB), a second open of a block this
 * process holds fails ("already mapped"), and the range the driver gives
 * for an opened pointer is its block's, from the block's start. So each
 * session keeps the blocks it opened, with where each lies in the client's
 * addresses: a buffer inside one already open is a view into it (the
 * client's own memory either way), and a block is closed with its last
 * buffer. A buffer's bounds run from its own start, never past its block.
 *
 * Once the client deregistered a block's last buffer, the block is found
 * no more, though ops in flight may hold it open a while: the client may
 * have freed the allocation, and the driver may give its addresses to a
 * new block (another handle, other memory). A registration there opens
 * the new handle; only where the driver says this process holds that
 * handle's block open already is the retired block there the same one,
 * and taken up again. */
#ifndef CCSD_FRONT_IPC_BLOCKS_H
#define CCSD_FRONT_IPC_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "base/list.h"

struct ipc_block {
  struct list link;     /* in its session's list while the session lives */
  uint64_t client_base; /* the block's start in the client's addresses */
  char *base;           /* and here */
  size_t size;
  int device;   /* the GPU it lives on */
  void *opened; /* what the open gave: closed with the last buffer */
  int refs;     /* buffers: registered, or deregistered but held by ops */
  int regs;     /* buffers registered: found while there are any */
};

/* The block of `blocks` with buffers registered holding the client's
 * range [addr, addr + len), with that range's start here in *ret_ptr and
 * a registered buffer counted; NULL when none holds it whole. retired:
 * the block opened last of those at addr instead, and only where it is
 * retired and holds the range whole. */
struct ipc_block *ccsd_ipc_block_find(struct list *blocks, uint64_t addr, uint64_t len,
                                      int retired, char **ret_ptr);

/* A block just opened for the client's address addr: the open gave
 * `opened`, which lies in the block [base, base + size). NULL when it does
 * not (the driver's range cannot be right) or out of memory; else the
 * block, in `blocks`, with one registered buffer. */
struct ipc_block *ccsd_ipc_block_add(struct list *blocks, uint64_t addr, void *opened,
                                     void *base, size_t size, int device);

/* Bytes of the client's len from ptr that lie in b. */
size_t ccsd_ipc_block_fit(const struct ipc_block *b, const char *ptr, uint64_t len);

/* A buffer deregistered (or never made): the block's last one retires it. */
void ccsd_ipc_block_deregistered(struct ipc_block *b);

/* A buffer let go: the last one closes the block (close(opened)). */
void ccsd_ipc_block_unref(struct ipc_block *b, void (*close)(void *opened));

/* The session goes: its blocks live on while buffers of ops in flight
 * hold them, found by no one. */
void ccsd_ipc_blocks_detach(struct list *blocks);

#endif
