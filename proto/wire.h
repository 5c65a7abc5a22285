/* The wire contract shared by libccs and ccsd: protocol version, limits,
 * collective kinds, the layout of a unique id, and the frame codec. */
#ifndef CCS_WIRE_H
#define CCS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "ccs.h"
#include "ccs.pb-c.h"

#define CCS__PROTOCOL_VERSION 5u /* 3: RingSetup; 4: stream flags instead of interprocess events;
                                    5: the journal, rejoining comms after a restart */
/* The oldest protocol still served: its clients, the ids and rings they
 * bring, and daemons that speak it (a rolling upgrade: docs/restart.md).
 * 5 only adds to 4: a client of 4 never asks for what it lacks. */
#define CCS__PROTOCOL_OLDEST 4u
static inline int ccs__protocol_served(uint32_t p) {
  return p >= CCS__PROTOCOL_OLDEST && p <= CCS__PROTOCOL_VERSION;
}

/* A frame is a 4-byte little-endian length and that many bytes of protobuf.
 * The cap is checked before anything is allocated for the payload: a
 * request holds at most 1 MiB (what the daemon reads from any client), a
 * reply at most 8 MiB (operator texts of a busy daemon; a reply over it
 * becomes an error reply saying so). */
#define CCS__FRAME_HEADER 4u
#define CCS__FRAME_MAX (1u << 20)
#define CCS__REPLY_MAX (8u << 20)
/* Unpacking may allocate more than the frame holds (an empty Op is 2 bytes
 * on the wire and ~100 in memory); this bounds it per frame. */
#define CCS__UNPACK_BUDGET (16u << 20)
#define CCS__SUBMIT_MAX_OPS 4096u
#define CCS__ERROR_TEXT_MAX 1024u
/* The answer to the first part of a call cut in parts (Op.whole_count)
 * when other ranks made the same call whole: make it whole too. Only
 * libccs's parts see it. */
#define CCS__RESULT_WHOLE ((ccs_result_t)64)

enum ccs__coll_kind {
  CCS__ALL_REDUCE = 0,
  CCS__BROADCAST,
  CCS__REDUCE,
  CCS__ALL_GATHER,
  CCS__REDUCE_SCATTER,
  CCS__ALL_TO_ALL,
  CCS__GATHER,
  CCS__SCATTER,
  CCS__SEND,
  CCS__RECV,
  CCS__BARRIER,
  CCS__COLL_KIND_COUNT
};
/* Where a registered buffer lives (MemRegister.domain). */
enum ccs__mem_domain { CCS__MEM_HOST = 0, CCS__MEM_CUDA = 1, CCS__MEM_CUDA_IPC = 2 };
#define CCS__UUID_BYTES 16u          /* a GPU's UUID */
#define CCS__IPC_MEM_BYTES 64u       /* a cudaIpcMemHandle_t */

const char *ccs__coll_name(uint32_t kind);
int ccs__coll_has_redop(uint32_t kind);
int ccs__coll_has_root(uint32_t kind);

/* Unique id: what the bytes of ccs_unique_id_t hold. */
#define CCS__UNIQUE_ID_MAGIC 0x31534343u /* "CCS1" */
/* The id of a comm found by name (CommInit.name): made by the ranks'
 * daemons alike from the name and the uid, never handed to a client; it is
 * not signed (only ranks of its owner's uid can name it) and does not
 * expire. */
#define CCS__NAMED_ID_MAGIC 0x4e534343u /* "CCSN" */
#define CCS__SECRET_BYTES 32u
struct ccs__unique_id {
  uint32_t magic;
  uint32_t protocol;
  uint8_t secret[CCS__SECRET_BYTES];
  uint64_t issued_s;  /* when it was issued (Unix time): ids expire (id_ttl) */
  uint32_t owner_uid; /* the uid it was issued to: its comm's tenant */
  char root[56];      /* numeric "ADDR:PORT" of the issuing daemon for other daemons; "" alone */
  uint8_t mac[16];    /* the issuing daemon's MAC over the fields above (keyed BLAKE2b) */
};
/* A comm is named by its whole identity (root, secret, owner): ids that
 * differ in any of them, forged or not, never meet in one comm. Daemons
 * name comms to each other by this hash, never by the secret. */
#define CCS__NAME_BYTES 32u
_Static_assert(sizeof(struct ccs__unique_id) <= CCS_UNIQUE_ID_BYTES, "unique id too large");

/* --- frame codec --- */

/* Packs a Request or Reply behind its length prefix into a new malloc'ed
 * buffer. Returns NULL when out of memory or over the frame cap. */
uint8_t *ccs__frame_pack(const ProtobufCMessage *msg, size_t *ret_len);
/* The same with another cap (replies: CCS__REPLY_MAX). */
uint8_t *ccs__frame_pack_max(const ProtobufCMessage *msg, size_t max, size_t *ret_len);

/* Unpack with a bounded allocator; NULL when malformed or over budget. */
Ccs__Request *ccs__request_unpack(const uint8_t *data, size_t len);
Ccs__Reply *ccs__reply_unpack(const uint8_t *data, size_t len);
Ccs__PeerMsg *ccs__peer_unpack(const uint8_t *data, size_t len);

/* Incremental reader: bytes arrive in any split; whole frames come out. */
struct ccs__frame_reader {
  uint8_t *buf;
  size_t start; /* first byte not yet consumed */
  size_t end;   /* one past the last byte received */
  size_t cap;
  size_t max_payload;
};
void ccs__frame_reader_init(struct ccs__frame_reader *r, size_t max_payload);
void ccs__frame_reader_close(struct ccs__frame_reader *r);
/* Space to receive into (at least 1 byte); -1 when out of memory. */
int ccs__frame_reader_space(struct ccs__frame_reader *r, uint8_t **ret_ptr, size_t *ret_len);
void ccs__frame_reader_commit(struct ccs__frame_reader *r, size_t n);
/* 1 and the payload of the next whole frame (valid until the next call),
 * 0 when more bytes are needed, -1 when the announced length is over the
 * cap (the stream cannot be resynchronised: close it). */
int ccs__frame_reader_next(struct ccs__frame_reader *r, const uint8_t **ret_payload,
                           size_t *ret_len);
/* Bytes received but not yet returned as a frame (a partial frame). */
size_t ccs__frame_reader_pending(const struct ccs__frame_reader *r);

#endif

/* Bytes each rank's send and receive buffers must span for an op; 0 where
 * the rank's buffer is not used (a non-root's receive buffer of a reduce).
 * -1 on overflow. Both sides use it: the client to say what it passes, the
 * daemon to check what it was given. */
int ccs__op_lengths(uint32_t kind, uint64_t count, size_t elem_size, int nranks, int rank,
                    int root, uint64_t *ret_send, uint64_t *ret_recv);
