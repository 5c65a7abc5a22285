/* Which memory domain an op runs in: host memory, or one GPU reaching
 * every device buffer of the op (coll.h). */
#include <stdint.h>
#include <stdio.h>

#include "coll/coll.h"
#include "kernels_device.h"

int ccsd_gpu_op_device(struct post *const *posts, int n, int spans, const uint64_t *reach,
                       ccs_result_t *rc, char *err, size_t errlen) {
  int device = -1, host_rank = -1, device_rank = -1, local = 0;
  for (int i = 0; i < n; i++) {
    const struct post *p = posts[i];
    if (!p) continue;
    local++;
    const struct coll_buf *bufs[2] = {&p->send, &p->recv};
    for (int k = 0; k < 2; k++) {
      const struct coll_buf *b = bufs[k];
      if (!b->base) continue;
      if (b->device < 0) {
        if (host_rank < 0) host_rank = p->member->rank;
        continue;
      }
      if (device_rank < 0) device_rank = p->member->rank;
      if (device < 0) {
        device = b->device;
      } else if (b->device != device &&
                 (b->device >= CCSD_GPU_MAX_DEVICES || !(reach[device] >> b->device & 1))) {
        *rc = CCS_ERR_UNSUPPORTED;
        snprintf(err, errlen, "GPU %d cannot reach the memory of GPU %d (rank %d): no peer access "
                 "between them", device, b->device, p->member->rank);
        return -2;
      }
    }
  }
  if (device < 0) return -1;
  *rc = CCS_ERR_INVALID_USAGE;
  if (host_rank >= 0) {
    snprintf(err, errlen, "the op mixes host memory (rank %d) and device memory (rank %d): all "
             "ranks on one daemon pass buffers of one kind", host_rank, device_rank);
    return -2;
  }
  *rc = CCS_ERR_UNSUPPORTED;
  if (spans) {
    snprintf(err, errlen, "device buffers across daemons go through host memory: the client "
             "stages them (libccs does), the daemons take host buffers");
    return -2;
  }
  if (local > CCS_DEVICE_MAX_PTRS) {
    snprintf(err, errlen, "%d ranks with device buffers on one daemon; a launch takes at most %d",
             local, CCS_DEVICE_MAX_PTRS);
    return -2;
  }
  return device;
}
