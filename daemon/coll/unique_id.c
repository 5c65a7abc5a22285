/* Unique ids (wire.h): issued by this daemon for the uid that asked,
 * signed with a key of this run (keyed BLAKE2b), checked by this daemon
 * for its own ranks and for the joins other daemons forward; they expire
 * after id_ttl. A comm is named by the id's whole identity. */
#include <sodium.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "coll/coll.h"

static void mac_of(const struct coll *co, const struct ccs__unique_id *id, uint8_t mac[16]) {
  crypto_generichash(mac, 16, (const uint8_t *)id, offsetof(struct ccs__unique_id, mac), co->id_key,
                     sizeof(co->id_key));
}

void ccsd_unique_id_sign(const struct coll *co, struct ccs__unique_id *id) { mac_of(co, id, id->mac); }

void ccsd_unique_id_issue(const struct coll *co, uid_t owner, struct ccs__unique_id *ret) {
  memset(ret, 0, sizeof(*ret)); /* padding is signed too */
  ret->magic = CCS__UNIQUE_ID_MAGIC;
  ret->protocol = CCS__PROTOCOL_VERSION;
  ret->owner_uid = (uint32_t)owner;
  ret->issued_s = (uint64_t)time(NULL);
  snprintf(ret->root, sizeof(ret->root), "%s", co->self); /* other daemons join through it */
  randombytes_buf(ret->secret, sizeof(ret->secret));
  ccsd_unique_id_sign(co, ret);
}

int ccsd_unique_id_valid(const struct coll *co, const struct ccs__unique_id *id) {
  uint8_t mac[16];
  mac_of(co, id, mac);
  return sodium_memcmp(mac, id->mac, sizeof(mac)) == 0;
}

/* Seconds since the id was issued, or -1 when it is past id_ttl (or from
 * the future: a clock far off, or a forgery). */
double ccsd_unique_id_age(const struct coll *co, const struct ccs__unique_id *id) {
  double age = difftime(time(NULL), (time_t)id->issued_s);
  return age > co->cfg.id_ttl_s || age < -300 ? -1 : age;
}

void ccsd_comm_name(const struct ccs__unique_id *id, uint8_t name[CCS__NAME_BYTES]) {
  crypto_generichash_state st;
  uint32_t owner = id->owner_uid;
  crypto_generichash_init(&st, NULL, 0, CCS__NAME_BYTES);
  crypto_generichash_update(&st, (const uint8_t *)"ccs comm name", 13);
  crypto_generichash_update(&st, (const uint8_t *)id->root, strnlen(id->root, sizeof(id->root)));
  crypto_generichash_update(&st, (const uint8_t *)"", 1); /* the root ends here */
  crypto_generichash_update(&st, id->secret, sizeof(id->secret));
  crypto_generichash_update(&st, (const uint8_t *)&owner, sizeof(owner));
  crypto_generichash_final(&st, name, CCS__NAME_BYTES);
}

void ccsd_named_id(uid_t owner, const char *name, const char *root, struct ccs__unique_id *ret) {
  memset(ret, 0, sizeof(*ret));
  ret->magic = CCS__NAMED_ID_MAGIC;
  ret->protocol = CCS__PROTOCOL_VERSION;
  ret->owner_uid = (uint32_t)owner;
  snprintf(ret->root, sizeof(ret->root), "%s", root);
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, sizeof(ret->secret));
  crypto_generichash_update(&st, (const uint8_t *)"ccs named comm", 14);
  crypto_generichash_update(&st, (const uint8_t *)name, strlen(name));
  crypto_generichash_final(&st, ret->secret, sizeof(ret->secret));
}
