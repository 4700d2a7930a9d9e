/* Leveled logging to stderr, one locked write per line, with the rank prefix. */
#include "base/base_impl.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static pthread_once_t level_once = PTHREAD_ONCE_INIT;
static _Atomic int log_level = CA_LOG_WARNING;
static _Atomic int log_rank = -1;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

#define LEVEL_NAMES "DEBUG, INFO, WARNING, ERROR, CRITICAL, plus Python's WARN, FATAL, NOTSET, and OFF"

/* Python's level names (logging accepts them for ACCELERATE_LOG_LEVEL) and
 * caccel's OFF. Pure: it runs inside the pthread_once below, where reporting
 * an error would log and so re-enter the once (a deadlock). */
static bool level_lookup(const char *name, ca_log_level *out) {
    static const struct { const char *n; ca_log_level l; } names[] = {
        {"debug", CA_LOG_DEBUG}, {"info", CA_LOG_INFO}, {"warning", CA_LOG_WARNING},
        {"warn", CA_LOG_WARNING}, {"error", CA_LOG_ERROR}, {"critical", CA_LOG_ERROR},
        {"fatal", CA_LOG_ERROR}, {"notset", CA_LOG_DEBUG}, {"off", CA_LOG_OFF}, {"none", CA_LOG_OFF},
    };
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++) {
        if (strcasecmp(name, names[i].n) == 0) {
            *out = names[i].l;
            return true;
        }
    }
    return false;
}

ca_status ca_log_parse_level(const char *name, ca_log_level *out) {
    if (out && level_lookup(name, out)) return CA_OK;
    return ca_error(CA_ERR_CONFIG, "unknown log level '%s' (allowed: %s)", name ? name : "(null)", LEVEL_NAMES);
}

static void level_from_env(void) {
    const char *vars[] = {"CACCEL_LOG_LEVEL", "ACCELERATE_LOG_LEVEL"};
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(vars[i]);
        ca_log_level l;
        if (v && *v) {
            if (level_lookup(v, &l))
                log_level = l;
            else   /* written directly: the level is not known yet */
                fprintf(stderr, "caccel: warning: %s=%s is not a log level (allowed: %s); using WARNING\n",
                        vars[i], v, LEVEL_NAMES);
            return;
        }
    }
}

ca_log_level ca_log_get_level(void) {
    pthread_once(&level_once, level_from_env);
    return (ca_log_level)log_level;
}

void ca_log_set_level(ca_log_level level) {
    pthread_once(&level_once, level_from_env);
    log_level = level;
}

void ca_log_set_rank(int rank) { log_rank = rank; }
int ca_log_get_rank(void) { return log_rank; }

static const char *level_word(ca_log_level l) {
    if (l >= CA_LOG_ERROR) return "error";
    if (l >= CA_LOG_WARNING) return "warning";
    if (l >= CA_LOG_INFO) return "info";
    return "debug";
}

void ca_log_vprintf(ca_log_level level, const char *fmt, va_list ap) {
    if (level < ca_log_get_level()) return;
    char line[4096];
    int n;
    int rank = log_rank;
    if (rank >= 0)
        n = snprintf(line, sizeof line, "[caccel rank %d] %s: ", rank, level_word(level));
    else
        n = snprintf(line, sizeof line, "caccel: %s: ", level_word(level));
    if (n < 0) return;
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    size_t len = strlen(line);
    if (len == 0 || line[len - 1] != '\n') {
        if (len + 1 < sizeof line) { line[len++] = '\n'; line[len] = '\0'; }
        else line[len - 1] = '\n';
    }
    pthread_mutex_lock(&log_mu);
    fputs(line, stderr);
    fflush(stderr);
    pthread_mutex_unlock(&log_mu);
}

void ca_log_printf(ca_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ca_log_vprintf(level, fmt, ap);
    va_end(ap);
}
