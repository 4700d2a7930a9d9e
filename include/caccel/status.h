/* caccel/status.h: status codes, the per-thread error message, and CA_CHECK. */
#ifndef CACCEL_STATUS_H
#define CACCEL_STATUS_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(CA_BUILDING_LIBRARY) || defined(CA_BUILDING_PLUGIN)
#define CA_API __attribute__((visibility("default")))
#else
#define CA_API
#endif

#if defined(__GNUC__)
#define CA_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define CA_NODISCARD __attribute__((warn_unused_result))
#else
#define CA_PRINTF(f, a)
#define CA_NODISCARD
#endif

/* Every public call returns one of these. 0 is success, errors are negative
 * (UCC's sign convention; positive values are reserved for "in progress"). */
typedef enum ca_status {
    CA_OK = 0,
    CA_IN_PROGRESS = 1,       /* asynchronous work not finished yet (ca_work_test) */
    CA_ERR_INVALID = -1,      /* bad argument, shape or dtype */
    CA_ERR_NOMEM = -2,        /* host or device allocation failed */
    CA_ERR_IO = -3,           /* file missing, truncated or unreadable */
    CA_ERR_CONFIG = -4,       /* configuration key or value rejected */
    CA_ERR_UNSUPPORTED = -5,  /* valid request this build or device cannot do */
    CA_ERR_BACKEND = -6,      /* a device, BLAS or plugin call failed */
    CA_ERR_TIMEOUT = -7,      /* a deadline passed (collective, rendezvous, peer) */
    CA_ERR_ABI = -8,          /* plugin built for another ABI */
    CA_ERR_NOT_FOUND = -9,    /* no such key, plugin, device or file */
    CA_ERR_PEER = -10,        /* another rank failed, left, or disagreed */
    CA_ERR_STATE = -11,       /* call not allowed in the current state */
    CA_ERR_INTERNAL = -12     /* a bug in caccel: please report it */
} ca_status;

/* Constructors. A call that hands back a new object through its last argument (`T **out`:
 * ca_module_create, ca_linear_create, ca_bert_model_create, ca_adamw_create,
 * ca_accelerator_create, ca_dataloader_create, ca_tokenizer_load, ca_device_open, ...) sets
 * *out to NULL before anything else, so after a failure *out is NULL, never a stale or
 * uninitialised pointer: a caller may pass it to the object's destroy, which accepts NULL. */

/* Short name of a status ("CA_ERR_CONFIG"). Static string; thread-safe. */
CA_API const char *ca_status_name(ca_status s);

/* The detailed message of the last error on the calling thread, e.g.
 * "config.yaml:4: unknown key 'mixed_precison' (did you mean 'mixed_precision'?)".
 * Owned by the library; valid until the next failing call on this thread.
 * Never NULL ("" when no error was recorded). Thread-safe (thread-local). */
CA_API const char *ca_last_error(void);

/* The status of the last error on the calling thread (CA_OK if none). */
CA_API ca_status ca_last_status(void);

/* Optional hint for the last error ("install the Debian package libopenblas-dev"),
 * "" when there is none. Same lifetime rules as ca_last_error(). */
CA_API const char *ca_last_hint(void);

/* Clears the calling thread's error. */
CA_API void ca_clear_error(void);

/* Records an error on the calling thread and returns `s`, so a failing path can
 * `return ca_error(...)`. The message gets the rank prefix when ranks exist.
 * Used by the library and by plugins; user code may use it too. */
CA_API ca_status ca_error_at(ca_status s, const char *file, int line,
                             const char *fmt, ...) CA_PRINTF(4, 5);
#define ca_error(s, ...) ca_error_at((s), __FILE__, __LINE__, __VA_ARGS__)

/* Attaches a hint to the calling thread's current error. */
CA_API void ca_error_hint(const char *fmt, ...) CA_PRINTF(1, 2);

/* Prefixes the current error message with more context ("loading model: ...").
 * Returns the current status so callers can `return ca_error_context(...)`. */
CA_API ca_status ca_error_context(const char *fmt, ...) CA_PRINTF(1, 2);

/* Prints "caccel: error: <message>" and "  hint: <hint>" to stderr. */
CA_API void ca_error_print(void);

/* For programs: on failure, print the message with the caller's file:line and
 * exit(1). The library itself never exits. */
#define CA_CHECK(expr)                                                          \
    do {                                                                        \
        ca_status ca_check_s_ = (expr);                                         \
        if (ca_check_s_ != CA_OK) {                                             \
            ca_check_failed(ca_check_s_, #expr, __FILE__, __LINE__);            \
        }                                                                       \
    } while (0)

/* Prints the error of a failed CA_CHECK and exits the process with status 1. */
CA_API void ca_check_failed(ca_status s, const char *expr, const char *file, int line)
    __attribute__((noreturn));

#ifdef __cplusplus
}
#endif
#endif
