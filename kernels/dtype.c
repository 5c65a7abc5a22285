#include "ccs.h"

#define CCS__API __attribute__((visibility("default")))

static const struct {
  const char *name;
  size_t size;
} dtypes[CCS_DTYPE_COUNT] = {
    [CCS_INT8] = {"int8", 1},       [CCS_UINT8] = {"uint8", 1},
    [CCS_INT32] = {"int32", 4},     [CCS_UINT32] = {"uint32", 4},
    [CCS_INT64] = {"int64", 8},     [CCS_UINT64] = {"uint64", 8},
    [CCS_FLOAT16] = {"half", 2},    [CCS_BFLOAT16] = {"bfloat16", 2},
    [CCS_FLOAT32] = {"float", 4},   [CCS_FLOAT64] = {"double", 8},
    [CCS_FLOAT8_E4M3] = {"f8e4m3", 1}, [CCS_FLOAT8_E5M2] = {"f8e5m2", 1},
};

static const char *const redops[CCS_REDOP_COUNT] = {"sum", "prod", "max", "min", "avg"};

CCS__API size_t ccs_dtype_size(ccs_dtype_t dtype) {
  return (unsigned)dtype < CCS_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

CCS__API const char *ccs_dtype_name(ccs_dtype_t dtype) {
  return (unsigned)dtype < CCS_DTYPE_COUNT ? dtypes[dtype].name : "unknown";
}

CCS__API const char *ccs_redop_name(ccs_redop_t op) {
  return (unsigned)op < CCS_REDOP_COUNT ? redops[op] : "unknown";
}
