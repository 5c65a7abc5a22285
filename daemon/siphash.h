#ifndef CCSD_SIPHASH_H
#define CCSD_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t ccsd_siphash24(const uint8_t key[16], const void *data, size_t len);

#endif
