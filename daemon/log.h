/* Logging to stderr, with journald priorities under systemd. The level
 * comes from the configuration (log_level, or CCS_DEBUG as NCCL_DEBUG). */
#ifndef CCSD_LOG_H
#define CCSD_LOG_H

enum ccs__log_level { CCS_LOG_ERROR = 0, CCS_LOG_WARN, CCS_LOG_INFO, CCS_LOG_TRACE };

extern int ccs__log_level;
void ccs__log_init(int level);
void ccs__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_ERROR(...) ccs__log(CCS_LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(...) ccs__log(CCS_LOG_WARN, __VA_ARGS__)
#define LOG_INFO(...) \
  do { if (ccs__log_level >= CCS_LOG_INFO) ccs__log(CCS_LOG_INFO, __VA_ARGS__); } while (0)
#define LOG_TRACE(...) \
  do { if (ccs__log_level >= CCS_LOG_TRACE) ccs__log(CCS_LOG_TRACE, __VA_ARGS__); } while (0)

#endif
