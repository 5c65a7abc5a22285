/* Clients' stream flags (gpu.h): the page they live in, shared by a
 * session's rings and its posts, and the host's writes to them. The host
 * never lowers a flag: a write comes after the GPU's own, or instead of
 * it, with the same value; values wrap. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "run/gpu.h"

struct gpu_flags *ccsd_gpu_flags_new(void *map, size_t len, _Atomic uint32_t *ready,
                                     _Atomic uint32_t *done) {
  struct gpu_flags *f = calloc(1, sizeof(*f));
  if (!f) return NULL;
  f->map = map;
  f->len = len;
  f->ready = ready;
  f->done = done;
  f->page = (void *)((uintptr_t)ready & ~(uintptr_t)4095);
  f->refs = 1;
  list_init(&f->link);
  return f;
}

void ccsd_gpu_flags_ref(struct gpu_flags *f) { f->refs++; }

void ccsd_gpu_flags_unref(struct gpu_flags *f) {
  if (!f || --f->refs > 0) return;
  if (f->retire) { /* unregistering may wait for the device: not here */
    f->retire(f);
    return;
  }
  munmap(f->map, f->len);
  free(f);
}

int ccsd_gpu_flag_reached(uint32_t value, uint32_t gen) { return (int32_t)(value - gen) >= 0; }

static void raise_to(_Atomic uint32_t *flag, uint32_t gen) {
  uint32_t cur = atomic_load(flag);
  while (!ccsd_gpu_flag_reached(cur, gen) && !atomic_compare_exchange_weak(flag, &cur, gen)) {
  }
}

void ccsd_gpu_order_done(const struct gpu_order *o) {
  if (o->flags) raise_to(&o->flags->done[o->slot], o->gen);
}

void ccsd_gpu_order_unblock(const struct gpu_order *o) {
  if (o->flags) raise_to(&o->flags->ready[o->slot], o->gen);
}
