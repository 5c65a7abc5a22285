/* What structure-aware fuzz targets draw their choices from: the input
 * read as a stream of decisions, zeros once it runs out. */
#ifndef CCS_FUZZ_INPUT_H
#define CCS_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct fuzz_input {
  const uint8_t *data;
  size_t size, at;
};

static inline int fuzz_done(const struct fuzz_input *in) { return in->at >= in->size; }

static inline uint8_t fuzz_u8(struct fuzz_input *in) {
  return in->at < in->size ? in->data[in->at++] : 0;
}

static inline void fuzz_bytes(struct fuzz_input *in, uint8_t *out, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = fuzz_u8(in);
}

static inline uint32_t fuzz_u32(struct fuzz_input *in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v = v << 8 | fuzz_u8(in);
  return v;
}

static inline uint64_t fuzz_u64(struct fuzz_input *in) {
  return (uint64_t)fuzz_u32(in) << 32 | fuzz_u32(in);
}

/* A count in 0..max, mostly small, often an edge (0, 1, max, max+1). */
static inline uint32_t fuzz_count(struct fuzz_input *in, uint32_t max) {
  switch (fuzz_u8(in) % 8) {
  case 0: return 0;
  case 1: return 1;
  case 2: return max;
  case 3: return max + 1;
  default: return max ? fuzz_u32(in) % (max + 1) : 0;
  }
}

/* A NUL-terminated string of up to len-1 bytes, any bytes but NUL. */
static inline char *fuzz_string(struct fuzz_input *in, char *buf, size_t len) {
  size_t n = fuzz_u8(in) % len;
  for (size_t i = 0; i < n; i++) {
    uint8_t b = fuzz_u8(in);
    buf[i] = (char)(b ? b : ':');
  }
  buf[n] = 0;
  return buf;
}

#endif
