/* A growing text buffer for what the daemon renders (metrics, ccsctl). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/textbuf.h"

void textbuf_printf(struct textbuf *t, const char *fmt, ...) {
  va_list ap;
  if (t->failed) return;
  for (;;) {
    va_start(ap, fmt);
    /* no arithmetic on a NULL buffer: the first call only measures */
    int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->failed = 1;
      return;
    }
    if ((size_t)n < t->cap - t->len) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = t->cap * 2 + (size_t)n + 256;
    char *grown = realloc(t->buf, cap);
    if (!grown) {
      t->failed = 1;
      return;
    }
    t->buf = grown;
    t->cap = cap;
  }
}

void textbuf_json_string(struct textbuf *t, const char *s) {
  textbuf_printf(t, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') textbuf_printf(t, "\\%c", c);
    else if (c < 0x20) textbuf_printf(t, "\\u%04x", c);
    else textbuf_printf(t, "%c", c);
  }
  textbuf_printf(t, "\"");
}
