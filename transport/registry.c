/* The transports a daemon can move data between nodes with, by name: the
 * daemon's `transport` key picks one, and a new fabric is one more row. */
#include <stdio.h>
#include <string.h>

#include "transport.h"

static const struct transport_ops *const transports[] = {
    &ccs_transport_tcp,
#ifdef CCS_HAVE_VERBS
    &ccs_transport_ib,
#endif
};
#define NTRANSPORTS (sizeof(transports) / sizeof(transports[0]))

const struct transport_ops *ccs_transport_find(const char *name) {
  for (size_t i = 0; i < NTRANSPORTS; i++)
    if (!strcmp(transports[i]->name, name)) return transports[i];
  return NULL;
}

void ccs_transport_names(char *buf, size_t len) {
  size_t n = 0;
  if (len) buf[0] = 0;
  for (size_t i = 0; i < NTRANSPORTS && n < len; i++)
    n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "", transports[i]->name);
}
