/* Daemons prove to each other that they hold the cluster key, then every
 * message between them is authenticated, with libsodium throughout (no
 * cryptography of our own).
 *
 * The greeting, on every connection before anything else:
 *   acceptor  -> connector  MAGIC | flags | nonce_a                 (41 bytes)
 *   connector -> acceptor   MAGIC | flags | nonce_c | proof_c       (73 bytes)
 *   acceptor  -> connector  proof_a                                 (32 bytes)
 * with T = MAGIC | flags_a | nonce_a | flags_c | nonce_c the transcript,
 * proof_x = BLAKE2b-256 keyed with the cluster key over a label naming the
 * prover's role and T, and one key per direction derived the same way.
 * Fresh nonces on both sides defeat replay; role labels defeat reflection;
 * the flags (cipher, encryption asked) are in T, so a man in the middle
 * cannot downgrade them. The connector sends nothing until the acceptor's
 * greeting shows it speaks this protocol.
 *
 * Messages: each direction counts its messages; message i is authenticated
 * with an AEAD (AES-256-GCM where both ends' CPUs have it, else
 * ChaCha20-Poly1305-IETF) under nonce i: encrypted ones as plaintext =
 * payload, additional data = header; the others as plaintext = header,
 * additional data = payload, keeping only the tag (the header's
 * ciphertext is not sent; the receiver recomputes the tag). A message
 * replayed, reordered, cut or altered fails its tag, and the connection
 * with it. */
#ifndef CCS_AUTH_H
#define CCS_AUTH_H

#include <sodium.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define CCS_AUTH_TAG 16      /* bytes after every message */
#define CCS_AUTH_MSG_MAX 73  /* the longest greeting message */

struct ccs_auth {
  const struct transport_params *params;
  int outbound, step;
  uint8_t transcript[8 + 1 + 32 + 1 + 32];
  int aes;          /* AES-256-GCM, else ChaCha20-Poly1305 */
  int encrypt_data; /* either end asked */
  uint8_t key_send[32], key_recv[32];
  crypto_aead_aes256gcm_state aes_send, aes_recv;
  uint64_t n_send, n_recv; /* messages so far: the nonces */
};

int ccs_auth_init(char *err, size_t errlen); /* libsodium, once */
/* The first step: what to send (may be nothing) and how many bytes to
 * await. */
void ccs_auth_start(struct ccs_auth *a, const struct transport_params *params, int outbound,
                    uint8_t *out, size_t *out_len, size_t *want);
/* A greeting message of the awaited length arrived: 0 and what to send
 * next and await; 1 when done (out may hold a last message); -EPROTO when
 * the other end does not speak this protocol, -EACCES when it does not
 * hold the key. */
int ccs_auth_step(struct ccs_auth *a, const uint8_t *in, size_t len, uint8_t *out,
                  size_t *out_len, size_t *want);
/* Tags the next message out (header: 16 bytes). ct non-NULL: the payload
 * is encrypted into it; NULL: it travels as it is. */
void ccs_auth_seal(struct ccs_auth *a, const uint8_t *hdr, const uint8_t *payload, size_t len,
                   uint8_t *ct, uint8_t tag[CCS_AUTH_TAG]);
/* Checks the next message in (decrypting buf in place when encrypted):
 * 0, or -1 when it is not what the other end sent. */
int ccs_auth_open(struct ccs_auth *a, const uint8_t *hdr, uint8_t *buf, size_t len, int encrypted,
                  const uint8_t tag[CCS_AUTH_TAG]);
void ccs_auth_wipe(struct ccs_auth *a);
void ccs_auth_wipe_key(struct transport_params *params);

/* A new random cluster key as text (64 hex digits and a newline). */
void ccs_auth_new_key_text(char out[66]);
/* Reads a key file: 64 hex digits (surrounding white space allowed). The
 * file must belong to this user and be readable by no one else. */
int ccs_auth_read_key(const char *path, uint8_t key[32], char *err, size_t errlen);

#endif
