#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const uint8_t MAGIC[8] = {'C', 'C', 'S', '-', 'K', 'E', 'Y', 2};
enum { FLAG_AES = 1, FLAG_ENCRYPT = 2 };
enum { NONCE = 32, PROOF = 32 };
enum { GREET_A = 8 + 1 + NONCE, GREET_C = 8 + 1 + NONCE + PROOF };

int ccs_auth_init(char *err, size_t errlen) {
  if (sodium_init() < 0) {
    snprintf(err, errlen, "libsodium cannot start");
    return -1;
  }
  return 0;
}

static uint8_t my_flags(const struct transport_params *p) {
  return (uint8_t)((crypto_aead_aes256gcm_is_available() ? FLAG_AES : 0) |
                   (p->encrypt_data ? FLAG_ENCRYPT : 0));
}

/* BLAKE2b-256 keyed with the cluster key over label | transcript. */
static void derive(const struct ccs_auth *a, const char *label, uint8_t out[32]) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, a->params->key, 32, 32);
  crypto_generichash_update(&st, (const uint8_t *)label, strlen(label) + 1);
  crypto_generichash_update(&st, a->transcript, sizeof(a->transcript));
  crypto_generichash_final(&st, out, 32);
}

void ccs_auth_start(struct ccs_auth *a, const struct transport_params *params, int outbound,
                    uint8_t *out, size_t *out_len, size_t *want) {
  memset(a, 0, sizeof(*a));
  a->params = params;
  a->outbound = outbound;
  if (outbound) { /* wait for the acceptor's greeting */
    *out_len = 0;
    *want = GREET_A;
    return;
  }
  memcpy(a->transcript, MAGIC, 8);
  a->transcript[8] = my_flags(params);
  randombytes_buf(a->transcript + 9, NONCE);
  memcpy(out, a->transcript, GREET_A);
  *out_len = GREET_A;
  *want = GREET_C;
}

/* Both proven: the keys of each direction, the cipher, the counters. */
static void finish(struct ccs_auth *a) {
  uint8_t c2a[32], a2c[32];
  derive(a, "ccs key: connector to acceptor", c2a);
  derive(a, "ccs key: acceptor to connector", a2c);
  memcpy(a->key_send, a->outbound ? c2a : a2c, 32);
  memcpy(a->key_recv, a->outbound ? a2c : c2a, 32);
  sodium_memzero(c2a, sizeof(c2a));
  sodium_memzero(a2c, sizeof(a2c));
  uint8_t fa = a->transcript[8], fc = a->transcript[9 + NONCE];
  a->aes = (fa & fc & FLAG_AES) != 0;
  a->encrypt_data = ((fa | fc) & FLAG_ENCRYPT) != 0;
  if (a->aes) {
    crypto_aead_aes256gcm_beforenm(&a->aes_send, a->key_send);
    crypto_aead_aes256gcm_beforenm(&a->aes_recv, a->key_recv);
  }
}

int ccs_auth_step(struct ccs_auth *a, const uint8_t *in, size_t len, uint8_t *out,
                  size_t *out_len, size_t *want) {
  uint8_t proof[PROOF];
  *out_len = 0;
  *want = 0;
  switch (a->step++) {
  case 0:
    if (a->outbound) { /* the acceptor's greeting: answer with ours and our proof */
      if (len != GREET_A || memcmp(in, MAGIC, 8)) return -EPROTO;
      memcpy(a->transcript, in, GREET_A);
      a->transcript[GREET_A] = my_flags(a->params);
      randombytes_buf(a->transcript + GREET_A + 1, NONCE);
      memcpy(out, MAGIC, 8);
      memcpy(out + 8, a->transcript + GREET_A, 1 + NONCE);
      derive(a, "ccs proof: connector", out + GREET_A);
      *out_len = GREET_C;
      *want = PROOF;
      return 0;
    }
    /* the connector's greeting and proof: check it, then prove in turn */
    if (len != GREET_C || memcmp(in, MAGIC, 8)) return -EPROTO;
    memcpy(a->transcript + GREET_A, in + 8, 1 + NONCE);
    derive(a, "ccs proof: connector", proof);
    if (sodium_memcmp(proof, in + GREET_A, PROOF)) return -EACCES;
    derive(a, "ccs proof: acceptor", out);
    *out_len = PROOF;
    finish(a);
    return 1;
  case 1:
    if (!a->outbound || len != PROOF) return -EPROTO;
    derive(a, "ccs proof: acceptor", proof);
    if (sodium_memcmp(proof, in, PROOF)) return -EACCES;
    finish(a);
    return 1;
  default: return -EPROTO;
  }
}

static void nonce_of(uint64_t n, uint8_t nonce[12]) {
  memset(nonce, 0, 12);
  for (int i = 0; i < 8; i++) nonce[i] = (uint8_t)(n >> (8 * i));
}

static int aead_encrypt(struct ccs_auth *a, int send, uint8_t *c, uint8_t *mac, const uint8_t *m,
                        size_t mlen, const uint8_t *ad, size_t adlen, const uint8_t *nonce) {
  unsigned long long maclen;
  if (a->aes)
    return crypto_aead_aes256gcm_encrypt_detached_afternm(c, mac, &maclen, m, mlen, ad, adlen, NULL,
                                                          nonce, send ? &a->aes_send : &a->aes_recv);
  return crypto_aead_chacha20poly1305_ietf_encrypt_detached(c, mac, &maclen, m, mlen, ad, adlen, NULL,
                                                            nonce, send ? a->key_send : a->key_recv);
}

void ccs_auth_seal(struct ccs_auth *a, const uint8_t *hdr, const uint8_t *payload, size_t len,
                   uint8_t *ct, uint8_t tag[CCS_AUTH_TAG]) {
  uint8_t nonce[12], hdr_ct[16];
  nonce_of(a->n_send++, nonce);
  if (ct) aead_encrypt(a, 1, ct, tag, payload, len, hdr, 16, nonce);
  else aead_encrypt(a, 1, hdr_ct, tag, hdr, 16, payload, len, nonce);
}

int ccs_auth_open(struct ccs_auth *a, const uint8_t *hdr, uint8_t *buf, size_t len, int encrypted,
                  const uint8_t tag[CCS_AUTH_TAG]) {
  uint8_t nonce[12];
  nonce_of(a->n_recv++, nonce);
  if (encrypted) { /* in place: the tag is checked over the ciphertext first */
    if (a->aes)
      return crypto_aead_aes256gcm_decrypt_detached_afternm(buf, NULL, buf, len, tag, hdr, 16, nonce,
                                                            &a->aes_recv) ? -1 : 0;
    return crypto_aead_chacha20poly1305_ietf_decrypt_detached(buf, NULL, buf, len, tag, hdr, 16, nonce,
                                                              a->key_recv) ? -1 : 0;
  }
  uint8_t hdr_ct[16], want[CCS_AUTH_TAG];
  aead_encrypt(a, 0, hdr_ct, want, hdr, 16, buf, len, nonce);
  return sodium_memcmp(want, tag, CCS_AUTH_TAG) ? -1 : 0;
}

void ccs_auth_wipe(struct ccs_auth *a) { sodium_memzero(a, sizeof(*a)); }

void ccs_auth_wipe_key(struct transport_params *params) {
  sodium_memzero(params->key, sizeof(params->key));
}

void ccs_auth_new_key_text(char out[66]) {
  uint8_t key[32];
  randombytes_buf(key, sizeof(key));
  sodium_bin2hex(out, 65, key, sizeof(key));
  out[64] = '\n';
  out[65] = 0;
  sodium_memzero(key, sizeof(key));
}

int ccs_auth_read_key(const char *path, uint8_t key[32], char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    snprintf(err, errlen, "cluster key %s: %s (make one with ccsd --generate-key %s)", path,
             strerror(errno), path);
    if (fd >= 0) close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
    snprintf(err, errlen, "cluster key %s must be a file of this daemon's user (uid %d) that no one "
             "else may read (mode 0600); it is uid %d, mode %04o", path, (int)geteuid(),
             (int)st.st_uid, (unsigned)(st.st_mode & 07777));
    close(fd);
    return -1;
  }
  char text[160];
  ssize_t n = read(fd, text, sizeof(text) - 1);
  close(fd);
  size_t bin = 0;
  const char *end;
  if (n > 0) {
    text[n] = 0;
    if (sodium_hex2bin(key, 32, text, (size_t)n, " \t\r\n", &bin, &end)) bin = 0;
    else if (strspn(end, " \t\r\n") != strlen(end)) bin = 0;
  }
  sodium_memzero(text, sizeof(text));
  if (bin != 32) {
    snprintf(err, errlen, "cluster key %s: not 64 hex digits (make one with ccsd --generate-key)", path);
    sodium_memzero(key, 32);
    return -1;
  }
  return 0;
}
