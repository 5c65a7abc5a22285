/* Event pairs kept for reuse, per connection and GPU (gpu.c): a pair is
 * free again once its submission's reply came and the stream's wait on
 * `done` was issued; one whose connection broke is not (its registration
 * died with the connection): the caller frees it. */
#include <pthread.h>

#include "internal.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ccs__gpu_pair *free_pairs;

struct ccs__gpu_pair *ccs__pairs_take(struct ccs__conn *c, int device) {
  struct ccs__gpu_pair *got = NULL;
  pthread_mutex_lock(&mu);
  for (struct ccs__gpu_pair **p = &free_pairs; *p; p = &(*p)->next)
    if ((*p)->conn == c && (*p)->device == device) {
      got = *p;
      *p = got->next;
      break;
    }
  pthread_mutex_unlock(&mu);
  return got;
}

int ccs__pairs_give(struct ccs__gpu_pair *pair) {
  pthread_mutex_lock(&mu);
  int kept = !pair->conn->broken;
  if (kept) {
    pair->next = free_pairs;
    free_pairs = pair;
  }
  pthread_mutex_unlock(&mu);
  return kept;
}
