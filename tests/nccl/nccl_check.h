/* A rank's check in the NCCL programs: on failure, says which rank, what
 * and NCCL's last error, and the rank function returns 1. */
#ifndef CCS_NCCL_CHECK_H
#define CCS_NCCL_CHECK_H
#include <stdio.h>

#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "rank %d: ", rank);                 \
      fprintf(stderr, __VA_ARGS__);                       \
      fprintf(stderr, " (%s)\n", ncclGetLastError(NULL)); \
      return 1;                                           \
    }                                                     \
  } while (0)

#endif
