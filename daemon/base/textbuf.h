/* Text that grows: printf into a buffer, remembering a failed allocation
 * instead of reporting each. */
#ifndef CCSD_BASE_TEXTBUF_H
#define CCSD_BASE_TEXTBUF_H

#include <stddef.h>

/* start zeroed; buf is malloc'ed (or NULL) */
struct textbuf {
  char *buf;
  size_t len, cap;
  int failed;
};
void textbuf_printf(struct textbuf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void textbuf_json_string(struct textbuf *t, const char *s);

#endif
