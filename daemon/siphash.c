/* SipHash-2-4 (Aumasson and Bernstein): a keyed 64-bit PRF, used to sign
 * the unique ids this daemon issues so that they cannot be forged or
 * re-bound to another uid. */
#include "siphash.h"

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                               \
  do {                                                                                         \
    v0 += v1, v1 = ROTL(v1, 13), v1 ^= v0, v0 = ROTL(v0, 32);                                   \
    v2 += v3, v3 = ROTL(v3, 16), v3 ^= v2;                                                     \
    v0 += v3, v3 = ROTL(v3, 21), v3 ^= v0;                                                     \
    v2 += v1, v1 = ROTL(v1, 17), v1 ^= v2, v2 = ROTL(v2, 32);                                   \
  } while (0)

uint64_t ccsd_siphash24(const uint8_t key[16], const void *data, size_t len) {
  const uint8_t *in = data;
  uint64_t k0 = le64(key), k1 = le64(key + 8);
  uint64_t v0 = 0x736f6d6570736575ull ^ k0, v1 = 0x646f72616e646f6dull ^ k1;
  uint64_t v2 = 0x6c7967656e657261ull ^ k0, v3 = 0x7465646279746573ull ^ k1;
  uint64_t last = (uint64_t)len << 56;
  const uint8_t *end = in + len - len % 8;
  for (; in != end; in += 8) {
    uint64_t m = le64(in);
    v3 ^= m;
    SIPROUND;
    SIPROUND;
    v0 ^= m;
  }
  for (size_t i = 0; i < len % 8; i++) last |= (uint64_t)in[i] << (8 * i);
  v3 ^= last;
  SIPROUND;
  SIPROUND;
  v0 ^= last;
  v2 ^= 0xff;
  SIPROUND;
  SIPROUND;
  SIPROUND;
  SIPROUND;
  return v0 ^ v1 ^ v2 ^ v3;
}
