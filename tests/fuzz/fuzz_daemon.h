/* The daemon state the fuzz targets drive, in their own process: a real
 * daemon (config defaults, one executor thread, the network side when
 * asked) whose unique ids are signed with a fixed key, so that the ids in
 * committed seeds are valid ones whenever they are replayed, and the
 * harness can make more. The key is set here, in the targets, after the
 * daemon made its own random one: nothing in the daemon can be told to
 * use a fixed key. */
#ifndef CCS_FUZZ_DAEMON_H
#define CCS_FUZZ_DAEMON_H

#include <stdint.h>
#include <sys/types.h>

#include "front/front.h"

/* When the seeds' ids say they were issued; the daemon's id_ttl is set to
 * cover it for a century. */
#define FUZZ_ID_ISSUED_S 1764547200u /* 2025-12-01 */

extern const uint8_t fuzz_id_key[32];
extern const char fuzz_cluster_key_hex[65];

/* Starts d on loop (aborts on failure); listen: with the network side on a
 * loopback port, holding fuzz_cluster_key_hex. */
void fuzz_daemon_start(struct daemon *d, uv_loop_t *loop, int listen);
/* Runs what is ready, as the daemon's loop does while it spins. */
void fuzz_daemon_spin(struct daemon *d, uv_loop_t *loop);
/* Closes every session, fails every comm left, waits until the daemon
 * holds nothing (what the executor and the network side still run
 * finishes first); aborts if it still holds something. */
void fuzz_daemon_settle(struct daemon *d, uv_loop_t *loop);

/* An id as the daemon at root ("" : one not listening) issues to owner,
 * secret from `tag`, signed with fuzz_id_key. */
void fuzz_unique_id(uint32_t tag, uint32_t owner, const char *root, struct ccs__unique_id *ret);

#endif
