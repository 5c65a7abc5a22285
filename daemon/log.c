#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

int ccs__log_level = CCS_LOG_WARN;
static int under_journald;

void ccs__log_init(int level) {
  under_journald = getenv("JOURNAL_STREAM") != NULL;
  ccs__log_level = level;
}

void ccs__log(int level, const char *fmt, ...) {
  /* "<N>" prefixes are journald priorities: err, warning, info, debug. */
  static const char *const prefix[] = {"<3>", "<4>", "<6>", "<7>"};
  static const char *const names[] = {"ERROR", "WARN", "INFO", "TRACE"};
  if (level > ccs__log_level) return;
  char line[2048];
  int n = snprintf(line, sizeof(line), "%sccsd[%d] %s: ", under_journald ? prefix[level] : "",
                   (int)getpid(), names[level]);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = strlen(line);
  line[len++] = '\n';
  /* One write per line keeps lines whole when threads log at once. */
  if (write(STDERR_FILENO, line, len) < 0) return;
}
