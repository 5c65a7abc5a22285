/* Logging to stderr, with journald priorities under systemd. The level
 * comes from the configuration (log_level, or CCS_DEBUG as NCCL_DEBUG). */
#ifndef CCSD_LOG_H
#define CCSD_LOG_H

enum ccs__log_level { CCS_LOG_ERROR = 0, CCS_LOG_WARN, CCS_LOG_INFO, CCS_LOG_TRACE };

/* Subsystems, as NCCL_DEBUG_SUBSYS: INFO and TRACE lines of a subsystem
 * are written only when it is selected (log_subsys; default all). Errors
 * and warnings always are. */
enum ccs__log_subsys {
  CCS_LOG_INIT = 1 << 0,   /* startup, comm creation and teardown */
  CCS_LOG_CLIENT = 1 << 1, /* connections */
  CCS_LOG_COLL = 1 << 2,   /* ops: matching, plans */
  CCS_LOG_MEM = 1 << 3,    /* registered buffers */
  CCS_LOG_OPS = 1 << 4,    /* metrics endpoint, operator commands */
  CCS_LOG_ALL = (1 << 5) - 1
};

extern _Atomic int ccs__log_level; /* a reload sets them while threads log */
extern _Atomic int ccs__log_subsys;
void ccs__log_init(int level, int subsys);
/* "INIT,COLL" or "ALL" -> a mask; -1 when a name is unknown */
int ccs__log_parse_subsys(const char *names);
void ccs__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_ERROR(...) ccs__log(CCS_LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(...) ccs__log(CCS_LOG_WARN, __VA_ARGS__)
#define LOG_INFO(SUBSYS, ...) \
  do { if (ccs__log_level >= CCS_LOG_INFO && (ccs__log_subsys & (SUBSYS))) ccs__log(CCS_LOG_INFO, __VA_ARGS__); } while (0)
#define LOG_TRACE(SUBSYS, ...) \
  do { if (ccs__log_level >= CCS_LOG_TRACE && (ccs__log_subsys & (SUBSYS))) ccs__log(CCS_LOG_TRACE, __VA_ARGS__); } while (0)

#endif
