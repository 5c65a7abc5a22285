#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <unistd.h>

_Atomic int ccs__log_level = CCS_LOG_WARN;
_Atomic int ccs__log_subsys = CCS_LOG_ALL;
static int under_journald;

void ccs__log_init(int level, int subsys) {
  under_journald = getenv("JOURNAL_STREAM") != NULL;
  ccs__log_level = level;
  ccs__log_subsys = subsys;
}

int ccs__log_parse_subsys(const char *names) {
  static const struct {
    const char *name;
    int bit;
  } table[] = {{"INIT", CCS_LOG_INIT}, {"CLIENT", CCS_LOG_CLIENT}, {"COLL", CCS_LOG_COLL},
               {"MEM", CCS_LOG_MEM},   {"OPS", CCS_LOG_OPS},       {"ALL", CCS_LOG_ALL}};
  char copy[256];
  snprintf(copy, sizeof(copy), "%s", names);
  int mask = 0;
  for (char *save, *tok = strtok_r(copy, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
    int bit = 0;
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
      if (!strcasecmp(tok, table[i].name)) bit = table[i].bit;
    if (!bit) return -1;
    mask |= bit;
  }
  return mask ? mask : -1;
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
