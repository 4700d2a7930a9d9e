/* config_test_util.h: helpers for the configuration tests: temp files, isolated environment, captured stderr. */
#ifndef CACCEL_CONFIG_TEST_UTIL_H
#define CACCEL_CONFIG_TEST_UTIL_H

#include <caccel/caccel.h>

#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

/* Fails with both strings shown when `hay` does not contain `needle`. */
#define assert_contains(hay, needle)                                                         \
    do {                                                                                     \
        const char *h_ = (hay);                                                              \
        const char *n_ = (needle);                                                           \
        if (!h_ || !strstr(h_, n_)) fail_msg("'%s'\n  does not contain '%s'", h_ ? h_ : "(null)", n_); \
    } while (0)
#define assert_not_contains(hay, needle)                                                     \
    do {                                                                                     \
        const char *h_ = (hay);                                                              \
        const char *n_ = (needle);                                                           \
        if (h_ && strstr(h_, n_)) fail_msg("'%s'\n  contains '%s'", h_, n_);                 \
    } while (0)
/* Checks a status and shows the library's message when it is not the one expected. */
#define assert_status(expr, want)                                                            \
    do {                                                                                     \
        ca_status s_ = (expr);                                                               \
        if (s_ != (want))                                                                    \
            fail_msg("%s returned %s, expected %s: %s", #expr, ca_status_name(s_),           \
                     ca_status_name(want), ca_last_error());                                 \
    } while (0)
#define assert_ok(expr) assert_status((expr), CA_OK)

/* A private directory for one test program; removed by ct_cleanup(). */
static char ct_dir[256];

static inline const char *ct_tmpdir(void) {
    if (!ct_dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(ct_dir, sizeof ct_dir, "%s/caccel-cfgtest-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(ct_dir)) {
            perror("mkdtemp");
            exit(1);
        }
    }
    return ct_dir;
}

/* Writes `text` to <tmpdir>/<name> and returns the path (static buffer per call site is not needed:
 * the caller copies it or uses it before the next call). */
static inline const char *ct_write(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", ct_tmpdir(), name);
    char *slash = strrchr(path, '/');
    for (char *p = path + strlen(ct_tmpdir()) + 1; p <= slash; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0700);
            *p = '/';
        }
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
    return path;
}

static inline void ct_rm_rf(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static inline void ct_cleanup(void) {
    if (ct_dir[0]) ct_rm_rf(ct_dir);
    ct_dir[0] = '\0';
}

/* Removes every variable caccel's configuration reads, and points HOME and
 * the XDG/HF directories into the test's directory, so no file or variable
 * of the machine running the tests leaks in. */
static inline void ct_clean_env(void) {
    static const char *const prefixes[] = {"ACCELERATE_", "FSDP_", "MEGATRON_LM_", "PARALLELISM_CONFIG_",
                                           "CACCEL_BACKEND", "CACCEL_TIMEOUT", "CACCEL_BUCKET_CAP_MB",
                                           "CACCEL_ALLOW_UNKNOWN_KEYS", "CACCEL_EVEN_BATCHES", "MASTER_ADDR",
                                           "MASTER_PORT", "PET_"};
    extern char **environ;
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; e && *e; e++) {
            for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
                if (strncmp(*e, prefixes[i], strlen(prefixes[i])) == 0) {
                    char name[256];
                    size_t n = strcspn(*e, "=");
                    if (n >= sizeof name) n = sizeof name - 1;
                    memcpy(name, *e, n);
                    name[n] = '\0';
                    unsetenv(name);
                    again = 1;
                    break;
                }
            }
            if (again) break;
        }
    }
    char p[400];
    snprintf(p, sizeof p, "%s/home", ct_tmpdir());
    mkdir(p, 0700);
    setenv("HOME", p, 1);
    unsetenv("XDG_CONFIG_HOME");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HF_HOME");
}

/* Captures what the library writes to stderr (its log) between begin and end. */
static int ct_saved_fd = -1;
static char ct_cap_path[300];

static inline void ct_capture_begin(void) {
    snprintf(ct_cap_path, sizeof ct_cap_path, "%s/stderr.txt", ct_tmpdir());
    fflush(stderr);
    ct_saved_fd = dup(2);
    int fd = open(ct_cap_path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    if (fd < 0 || ct_saved_fd < 0) {
        perror("capture");
        exit(1);
    }
    dup2(fd, 2);
    close(fd);
}

/* Returns the captured text (malloc'd). */
static inline char *ct_capture_end(void) {
    fflush(stderr);
    dup2(ct_saved_fd, 2);
    close(ct_saved_fd);
    ct_saved_fd = -1;
    FILE *f = fopen(ct_cap_path, "r");
    if (!f) return strdup("");
    char *buf = calloc(1, 65536);
    size_t n = buf ? fread(buf, 1, 65535, f) : 0;
    (void)n;
    fclose(f);
    return buf;
}

/* Path of tests/data/accelerate-configs/<name> in the source tree. */
static inline const char *ct_data(const char *name) {
    static char path[1024];
    const char *src = getenv("CACCEL_TEST_SRCDIR");
    snprintf(path, sizeof path, "%s/tests/data/accelerate-configs/%s", src && *src ? src : ".", name);
    return path;
}

#endif
