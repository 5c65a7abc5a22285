#include "wire.h"

static const char *const coll_names[CCS__COLL_KIND_COUNT] = {
    [CCS__ALL_REDUCE] = "all_reduce", [CCS__BROADCAST] = "broadcast",
    [CCS__REDUCE] = "reduce",         [CCS__ALL_GATHER] = "all_gather",
    [CCS__REDUCE_SCATTER] = "reduce_scatter", [CCS__ALL_TO_ALL] = "all_to_all",
    [CCS__GATHER] = "gather",         [CCS__SCATTER] = "scatter",
    [CCS__SEND] = "send",             [CCS__RECV] = "recv",
    [CCS__BARRIER] = "barrier",
};

const char *ccs__coll_name(uint32_t kind) {
  return kind < CCS__COLL_KIND_COUNT ? coll_names[kind] : "unknown";
}

int ccs__coll_has_redop(uint32_t kind) {
  return kind == CCS__ALL_REDUCE || kind == CCS__REDUCE || kind == CCS__REDUCE_SCATTER;
}

int ccs__coll_has_root(uint32_t kind) {
  return kind == CCS__BROADCAST || kind == CCS__REDUCE || kind == CCS__GATHER ||
         kind == CCS__SCATTER;
}

int ccs__op_lengths(uint32_t kind, uint64_t count, size_t elem_size, int nranks, int rank,
                    int root, uint64_t *ret_send, uint64_t *ret_recv) {
  uint64_t one, all;
  if (__builtin_mul_overflow(count, (uint64_t)elem_size, &one) ||
      __builtin_mul_overflow(one, (uint64_t)nranks, &all))
    return -1;
  uint64_t send = 0, recv = 0;
  int is_root = rank == root;
  switch (kind) {
  case CCS__ALL_REDUCE: send = recv = one; break;
  case CCS__BROADCAST: send = is_root ? one : 0; recv = one; break;
  case CCS__REDUCE: send = one; recv = is_root ? one : 0; break;
  case CCS__ALL_GATHER: send = one; recv = all; break;
  case CCS__REDUCE_SCATTER: send = all; recv = one; break;
  case CCS__ALL_TO_ALL: send = recv = all; break;
  case CCS__GATHER: send = one; recv = is_root ? all : 0; break;
  case CCS__SCATTER: send = is_root ? all : 0; recv = one; break;
  case CCS__SEND: send = one; break;
  case CCS__RECV: recv = one; break;
  default: break;
  }
  *ret_send = send;
  *ret_recv = recv;
  return 0;
}

/* Public names of results: exported by libccs, used by the daemon's logs. */
#define API __attribute__((visibility("default")))

API const char *ccs_strerror(ccs_result_t r) {
  switch (r) {
#define CCS__RESULT_TEXT(name, value, text) \
  case name: return text;
    CCS_RESULT_MAP(CCS__RESULT_TEXT)
#undef CCS__RESULT_TEXT
  }
  return "unknown result";
}

API const char *ccs_result_name(ccs_result_t r) {
  switch (r) {
#define CCS__RESULT_NAME(name, value, text) \
  case name: return #name;
    CCS_RESULT_MAP(CCS__RESULT_NAME)
#undef CCS__RESULT_NAME
  }
  return "CCS_ERR_UNKNOWN";
}
