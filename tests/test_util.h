/* test_util.h: helpers shared by the unit tests (host tensors, random fills, cmocka glue). */
#ifndef CACCEL_TEST_UTIL_H
#define CACCEL_TEST_UTIL_H

#include <caccel/caccel.h>

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

/* Fails the test with caccel's last error when a call does not return CA_OK. */
#define T_OK(expr)                                                                          \
    do {                                                                                    \
        ca_status t_s_ = (expr);                                                            \
        if (t_s_ != CA_OK) fail_msg("%s -> %s: %s", #expr, ca_status_name(t_s_), ca_last_error()); \
    } while (0)

/* Fails the test with caccel's last error when a pointer is NULL. */
#define T_NN(expr)                                                                          \
    ({ __typeof__(expr) t_v_ = (expr);                                                      \
       if (!t_v_) fail_msg("%s -> NULL: %s", #expr, ca_last_error());                       \
       t_v_; })

/* Removes path and everything below it; a link is removed as a link, never followed (a test that
 * plants a link to a victim must not empty the victim when it cleans up). */
static inline void t_rm_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    DIR *d = S_ISDIR(st.st_mode) ? opendir(path) : NULL;
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *e;
    char p[PATH_MAX];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            snprintf(p, sizeof p, "%s/%s", path, e->d_name) < (int)sizeof p)
            t_rm_tree(p);
    closedir(d);
    rmdir(path);
}

/* The text of the file at path (caller frees), or fails. */
static inline char *t_read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

/* Occurrences of needle in s. Not a strstr loop: under ASan each strstr call measures the whole
 * rest of the string, which makes counting in a trace of 100,000 events quadratic (minutes). */
static inline int t_count(const char *s, const char *needle) {
    size_t m = strlen(needle), len = strlen(s);
    int n = 0;
    for (size_t i = 0; i + m <= len; i++)
        if (s[i] == needle[0] && memcmp(s + i, needle, m) == 0) {
            n++;
            i += m - 1;
        }
    return n;
}

/* How often needle occurs in the file at path (a profiler's trace: the kernel calls of one name, as
 * "\"name\":\"copy_strided\""). */
static inline int t_trace_count(const char *path, const char *needle) {
    char *s = t_read_text(path);
    int n = t_count(s, needle);
    free(s);
    return n;
}

/* Deterministic test data (xorshift), independent of caccel's generator. */
static inline uint64_t t_rand_u64(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}
static inline float t_randf(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)((t_rand_u64(s) >> 40) * (1.0 / 16777216.0));
}

/* A CPU f32 tensor in the current scope filled with uniform values in [lo, hi),
 * optionally kept away from 0 by `gap` (for functions with a kink there). */
static inline ca_tensor *t_randn(uint64_t *seed, int ndim, const int64_t *shape, float lo, float hi, float gap) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    for (int64_t i = 0; i < n; i++) {
        float v;
        do v = t_randf(seed, lo, hi); while (fabsf(v) < gap);
        h[i] = v;
    }
    ca_tensor *t = ca_from_host(ca_cpu_device(), CA_F32, ndim, shape, h);
    free(h);
    return t;
}

/* Host copy of a float tensor (caller frees). */
static inline float *t_host(const ca_tensor *t) {
    size_t n = ca_tensor_nbytes(t);
    float *h = malloc(n ? n : 4);
    if (ca_tensor_to_host(t, h, n) != CA_OK) fail_msg("to_host: %s", ca_last_error());
    return h;
}

#endif
