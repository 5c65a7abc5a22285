/* What the watchdog does about one op on a GPU (gpu.h), tick by tick. The
 * release is repeated every tick: the flags lie in memory the client
 * shares, and a client that writes them back must not keep the stream. */
#include "run/gpu.h"

int ccsd_gpu_watch_step(struct gpu_watch *w, int cancelled, uint64_t now_ms) {
  if (!cancelled) return CCSD_GPU_WATCH_NOTHING;
  if (!w->released_ms) w->released_ms = now_ms ? now_ms : 1;
  else if (!w->warned && now_ms - w->released_ms >= CCSD_GPU_STUCK_MS) {
    w->warned = 1;
    return CCSD_GPU_WATCH_STUCK;
  }
  return CCSD_GPU_WATCH_RELEASE;
}
