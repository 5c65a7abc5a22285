/* A GPU's streams, one per comm with ops on it (gpu.h). Ops of one comm
 * must run in the order they were matched, so a comm keeps its place
 * while it has ops in flight; places of comms gone idle are taken over,
 * and after a while given back. Under the GPU threads' lock. */
#include <stddef.h>

#include "run/gpu.h"

struct gpu_stream *ccsd_gpu_stream_for(struct gpu_streams *t, uint64_t key) {
  struct gpu_stream *free_place = NULL, *idlest = NULL;
  for (int i = 0; i < CCSD_GPU_STREAMS; i++) {
    struct gpu_stream *s = &t->s[i];
    if (!s->used) {
      if (!free_place) free_place = s;
      continue;
    }
    if (s->key == key) return s;
    if (s->inflight == 0 && (!idlest || s->idle_since_ms < idlest->idle_since_ms)) idlest = s;
  }
  struct gpu_stream *s = free_place ? free_place : idlest;
  if (!s) return NULL;
  s->used = 1;
  s->key = key; /* an idle stream has nothing queued: another comm may use it */
  return s;
}

int ccsd_gpu_streams_retire(struct gpu_streams *t, uint64_t now_ms, uint64_t idle_ms,
                            void **handles, int max) {
  int n = 0;
  for (int i = 0; i < CCSD_GPU_STREAMS && n < max; i++) {
    struct gpu_stream *s = &t->s[i];
    if (!s->used || s->inflight || now_ms - s->idle_since_ms < idle_ms) continue;
    if (s->handle) handles[n++] = s->handle;
    *s = (struct gpu_stream){.owner = s->owner};
  }
  return n;
}
