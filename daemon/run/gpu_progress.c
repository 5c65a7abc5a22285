/* What a GPU's threads owe the loop about one op (gpu.h): that it is
 * queued (the ranks whose streams wait on events get their reply) and that
 * it is complete (the buffers may go). Either thread may report first or
 * both before the loop looks; the loop must act on each exactly once, and
 * announce before completing. Under the GPU threads' lock. */
#include "run/gpu.h"

int ccsd_gpu_progress_mark(int *state, int flag) {
  *state |= flag;
  if (*state & CCSD_GPU_LISTED) return 0;
  *state |= CCSD_GPU_LISTED;
  return 1;
}

int ccsd_gpu_progress_take(int *state) {
  *state &= ~CCSD_GPU_LISTED;
  int act = 0;
  if ((*state & CCSD_GPU_ANNOUNCED) && !(*state & CCSD_GPU_ANNOUNCE_DONE)) {
    *state |= CCSD_GPU_ANNOUNCE_DONE;
    act |= CCSD_GPU_DO_ANNOUNCE;
  }
  if (*state & CCSD_GPU_COMPLETED) act |= CCSD_GPU_DO_FINISH;
  return act;
}
