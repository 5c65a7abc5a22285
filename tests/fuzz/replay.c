/* Runs a fuzz target over files and directories of inputs (the committed
 * corpus), for compilers without libFuzzer: every input must pass cleanly
 * (under the sanitizers in that build), and the corpus must reach what the
 * target says it must (fuzz_replay_done). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* A target may check, once every input ran, what the corpus reached: not
 * 0 fails the replay. */
__attribute__((weak)) int fuzz_replay_done(void);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  size_t got = fread(buf, 1, (size_t)n, f);
  fclose(f);
  LLVMFuzzerTestOneInput(buf, got);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int inputs = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st)) {
      fprintf(stderr, "replay: %s: no such input\n", argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      inputs += run_file(argv[i]) == 0;
      continue;
    }
    DIR *dir = opendir(argv[i]);
    for (struct dirent *e; dir && (e = readdir(dir));) {
      if (e->d_name[0] == '.') continue;
      char path[4096];
      snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
      inputs += run_file(path) == 0;
    }
    if (dir) closedir(dir);
  }
  printf("replayed %d inputs\n", inputs);
  if (inputs == 0) return 1;
  return fuzz_replay_done && fuzz_replay_done() ? 1 : 0;
}
