/* One thread's memcpy bandwidth at the sizes the comparison uses: the
 * ceiling a one-pass collective is measured against. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(void) {
  static const size_t sizes[] = {1 << 20, 16 << 20, 64 << 20};
  for (size_t i = 0; i < 3; i++) {
    size_t n = sizes[i];
    char *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    int reps = (int)((256u << 20) / n) + 2;
    memcpy(b, a, n);
    double t0 = now();
    for (int r = 0; r < reps; r++) {
      memcpy(b, a, n);
      __asm__ volatile("" : : "r"(a), "r"(b) : "memory"); /* the copy must happen */
    }
    double t = (now() - t0) / reps;
    printf("%10zu B  %6.2f GB/s (%zu read + %zu written per copy)\n", n, (double)n / t / 1e9, n, n);
    free(a);
    free(b);
  }
  return 0;
}
