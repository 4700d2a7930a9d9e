/* Status codes and the per-thread error record (message, hint, status). */
#include "base/base_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CA_MSG_MAX 2048
#define CA_HINT_MAX 512

static _Thread_local ca_status tl_status;
static _Thread_local char tl_msg[CA_MSG_MAX];
static _Thread_local char tl_hint[CA_HINT_MAX];

const char *ca_status_name(ca_status s) {
    switch (s) {
    case CA_OK: return "CA_OK";
    case CA_IN_PROGRESS: return "CA_IN_PROGRESS";
    case CA_ERR_INVALID: return "CA_ERR_INVALID";
    case CA_ERR_NOMEM: return "CA_ERR_NOMEM";
    case CA_ERR_IO: return "CA_ERR_IO";
    case CA_ERR_CONFIG: return "CA_ERR_CONFIG";
    case CA_ERR_UNSUPPORTED: return "CA_ERR_UNSUPPORTED";
    case CA_ERR_BACKEND: return "CA_ERR_BACKEND";
    case CA_ERR_TIMEOUT: return "CA_ERR_TIMEOUT";
    case CA_ERR_ABI: return "CA_ERR_ABI";
    case CA_ERR_NOT_FOUND: return "CA_ERR_NOT_FOUND";
    case CA_ERR_PEER: return "CA_ERR_PEER";
    case CA_ERR_STATE: return "CA_ERR_STATE";
    case CA_ERR_INTERNAL: return "CA_ERR_INTERNAL";
    }
    return "CA_ERR_UNKNOWN";
}

const char *ca_last_error(void) { return tl_msg; }
ca_status ca_last_status(void) { return tl_status; }
const char *ca_last_hint(void) { return tl_hint; }

void ca_clear_error(void) {
    tl_status = CA_OK;
    tl_msg[0] = '\0';
    tl_hint[0] = '\0';
}

/* The source location is kept only in debug logs: users want the message to
 * name *their* file, key and rank, not ours. */
ca_status ca_error_at(ca_status s, const char *file, int line, const char *fmt, ...) {
    char buf[CA_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    int rank = ca_log_get_rank();
    /* a message that wraps an earlier one already carries the suffix: once is enough */
    char suffix[32];
    snprintf(suffix, sizeof suffix, " (rank %d)", rank);
    size_t bl = strlen(buf), sl = strlen(suffix);
    bool has = bl >= sl && strcmp(buf + bl - sl, suffix) == 0;
    if (rank >= 0 && !has)
        snprintf(tl_msg, sizeof tl_msg, "%s%s", buf, suffix);
    else
        snprintf(tl_msg, sizeof tl_msg, "%s", buf);
    tl_status = s;
    tl_hint[0] = '\0';
    ca_log_printf(CA_LOG_DEBUG, "error %s at %s:%d: %s", ca_status_name(s), file, line, tl_msg);
    return s;
}

void ca_error_hint(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_hint, sizeof tl_hint, fmt, ap);
    va_end(ap);
}

ca_status ca_error_context(const char *fmt, ...) {
    char ctx[512], old[CA_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    snprintf(old, sizeof old, "%s", tl_msg);
    snprintf(tl_msg, sizeof tl_msg, "%s: %s", ctx, old);
    return tl_status;
}

void ca_error_print(void) {
    fprintf(stderr, "caccel: error: %s\n", tl_msg[0] ? tl_msg : ca_status_name(tl_status));
    if (tl_hint[0]) fprintf(stderr, "  hint: %s\n", tl_hint);
    fflush(stderr);
}

void ca_check_failed(ca_status s, const char *expr, const char *file, int line) {
    if (tl_status == CA_OK) tl_status = s;
    if (!tl_msg[0]) snprintf(tl_msg, sizeof tl_msg, "%s", ca_status_name(s));
    fprintf(stderr, "caccel: error: %s\n", tl_msg);
    if (tl_hint[0]) fprintf(stderr, "  hint: %s\n", tl_hint);
    fprintf(stderr, "  in: %s (%s:%d)\n", expr, file, line);
    fflush(stderr);
    exit(1);
}
