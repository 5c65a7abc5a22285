/* Fuzz target: bytes in any split -> frame reader -> bounded unpack.
 * The first byte chooses the read size, so partial reads are explored. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  size_t step = (size_t)data[0] % 64 + 1;
  data++, size--;
  struct ccs__frame_reader r;
  ccs__frame_reader_init(&r, CCS__FRAME_MAX);
  for (size_t off = 0; off < size;) {
    uint8_t *space;
    size_t room;
    if (ccs__frame_reader_space(&r, &space, &room)) break;
    size_t n = size - off < step ? size - off : step;
    if (n > room) n = room;
    memcpy(space, data + off, n);
    ccs__frame_reader_commit(&r, n);
    off += n;
    const uint8_t *payload;
    size_t len;
    int rc;
    while ((rc = ccs__frame_reader_next(&r, &payload, &len)) == 1) {
      Ccs__Request *req = ccs__request_unpack(payload, len);
      if (req) ccs__request__free_unpacked(req, NULL);
      Ccs__Reply *rep = ccs__reply_unpack(payload, len);
      if (rep) ccs__reply__free_unpacked(rep, NULL);
    }
    if (rc < 0) break;
  }
  ccs__frame_reader_close(&r);
  return 0;
}
