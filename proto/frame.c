/* Length-prefixed frames and bounded protobuf unpacking. */
#include <stdlib.h>
#include <string.h>

#include "wire.h"

uint8_t *ccs__frame_pack(const ProtobufCMessage *msg, size_t *ret_len) {
  return ccs__frame_pack_max(msg, CCS__FRAME_MAX, ret_len);
}

uint8_t *ccs__frame_pack_max(const ProtobufCMessage *msg, size_t max, size_t *ret_len) {
  size_t payload = protobuf_c_message_get_packed_size(msg);
  if (payload > max) return NULL;
  uint8_t *buf = malloc(CCS__FRAME_HEADER + payload);
  if (!buf) return NULL;
  buf[0] = (uint8_t)payload;
  buf[1] = (uint8_t)(payload >> 8);
  buf[2] = (uint8_t)(payload >> 16);
  buf[3] = (uint8_t)(payload >> 24);
  protobuf_c_message_pack(msg, buf + CCS__FRAME_HEADER);
  *ret_len = CCS__FRAME_HEADER + payload;
  return buf;
}

/* protobuf-c frees with the allocator it allocated with; counting only the
 * allocations is enough to bound one unpack, and free() needs no size. */
struct budget {
  size_t used;
};

static void *budget_alloc(void *data, size_t size) {
  struct budget *b = data;
  if (size > CCS__UNPACK_BUDGET - b->used) return NULL;
  b->used += size;
  return malloc(size);
}

static void budget_free(void *data, void *ptr) { free(ptr); }

static ProtobufCMessage *unpack(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                                size_t len) {
  struct budget b = {0};
  ProtobufCAllocator alloc = {budget_alloc, budget_free, &b};
  if (len > CCS__REPLY_MAX) return NULL;
  return protobuf_c_message_unpack(desc, &alloc, len, data);
}

Ccs__Request *ccs__request_unpack(const uint8_t *data, size_t len) {
  return (Ccs__Request *)unpack(&ccs__request__descriptor, data, len);
}

Ccs__Reply *ccs__reply_unpack(const uint8_t *data, size_t len) {
  return (Ccs__Reply *)unpack(&ccs__reply__descriptor, data, len);
}

Ccs__PeerMsg *ccs__peer_unpack(const uint8_t *data, size_t len) {
  return (Ccs__PeerMsg *)unpack(&ccs__peer_msg__descriptor, data, len);
}

void ccs__frame_reader_init(struct ccs__frame_reader *r, size_t max_payload) {
  memset(r, 0, sizeof(*r));
  r->max_payload = max_payload;
}

void ccs__frame_reader_close(struct ccs__frame_reader *r) {
  if (!r) return;
  free(r->buf);
  memset(r, 0, sizeof(*r));
}

size_t ccs__frame_reader_pending(const struct ccs__frame_reader *r) { return r->end - r->start; }

int ccs__frame_reader_space(struct ccs__frame_reader *r, uint8_t **ret_ptr, size_t *ret_len) {
  enum { MIN_READ = 4096 };
  if (r->start > 0 && (r->start == r->end || r->cap - r->end < MIN_READ)) {
    memmove(r->buf, r->buf + r->start, r->end - r->start);
    r->end -= r->start;
    r->start = 0;
  }
  if (r->cap - r->end < MIN_READ) {
    /* Never grow past one whole frame plus a read's worth: the length cap
     * bounds memory per connection. */
    size_t limit = CCS__FRAME_HEADER + r->max_payload + MIN_READ;
    size_t cap = r->cap ? r->cap * 2 : 2 * MIN_READ;
    if (cap > limit) cap = limit;
    if (cap > r->cap) {
      uint8_t *buf = realloc(r->buf, cap);
      if (!buf) return -1;
      r->buf = buf;
      r->cap = cap;
    }
    if (r->end == r->cap) return -1;
  }
  *ret_ptr = r->buf + r->end;
  *ret_len = r->cap - r->end;
  return 0;
}

void ccs__frame_reader_commit(struct ccs__frame_reader *r, size_t n) { r->end += n; }

int ccs__frame_reader_next(struct ccs__frame_reader *r, const uint8_t **ret_payload,
                           size_t *ret_len) {
  size_t avail = r->end - r->start;
  if (avail < CCS__FRAME_HEADER) return 0;
  const uint8_t *h = r->buf + r->start;
  uint32_t len = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
  if (len > r->max_payload) return -1;
  if (avail < CCS__FRAME_HEADER + (size_t)len) return 0;
  *ret_payload = h + CCS__FRAME_HEADER;
  *ret_len = len;
  r->start += CCS__FRAME_HEADER + len;
  return 1;
}
