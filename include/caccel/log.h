/* caccel/log.h: leveled logging with a rank prefix. */
#ifndef CACCEL_LOG_H
#define CACCEL_LOG_H

#include <caccel/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ca_log_level {
    CA_LOG_DEBUG = 10,
    CA_LOG_INFO = 20,
    CA_LOG_WARNING = 30,
    CA_LOG_ERROR = 40,
    CA_LOG_OFF = 100
} ca_log_level;

/* Current level. First use reads CACCEL_LOG_LEVEL, else ACCELERATE_LOG_LEVEL
 * (Python's DEBUG, INFO, WARNING/WARN, ERROR, CRITICAL/FATAL, NOTSET = DEBUG, or
 * OFF, any case); default WARNING. Another value warns once on stderr and
 * keeps WARNING. Thread-safe. */
CA_API ca_log_level ca_log_get_level(void);
CA_API void ca_log_set_level(ca_log_level level);

/* Parses a level name; returns CA_ERR_CONFIG for an unknown name. */
CA_API ca_status ca_log_parse_level(const char *name, ca_log_level *out);

/* Sets the rank shown in every line ("[caccel rank 3] ..."); -1 = no rank
 * (single process). Called by the accelerator once ranks are known. */
CA_API void ca_log_set_rank(int rank);
CA_API int ca_log_get_rank(void);

/* Writes one line to stderr if `level` is enabled. A newline is added when
 * missing. Lines from different threads do not interleave. */
CA_API void ca_log_printf(ca_log_level level, const char *fmt, ...) CA_PRINTF(2, 3);
CA_API void ca_log_vprintf(ca_log_level level, const char *fmt, va_list ap);

#define CA_LOG_D(...) ca_log_printf(CA_LOG_DEBUG, __VA_ARGS__)
#define CA_LOG_I(...) ca_log_printf(CA_LOG_INFO, __VA_ARGS__)
#define CA_LOG_W(...) ca_log_printf(CA_LOG_WARNING, __VA_ARGS__)
#define CA_LOG_E(...) ca_log_printf(CA_LOG_ERROR, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
