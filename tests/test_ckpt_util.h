/* test_ckpt_util.h: comparing checkpoints byte for byte (the asynchronous save's tests). */
#ifndef CACCEL_TEST_CKPT_UTIL_H
#define CACCEL_TEST_CKPT_UTIL_H

#include "test_util.h"

#include <dirent.h>
#include <sys/stat.h>

/* dir/name in one of four rotating buffers (a call may hold up to four such paths at once). */
static inline const char *t_path_in(const char *dir, const char *name) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

/* The whole file (malloc'd, *len its size); a file that cannot be opened fails the test. */
static inline unsigned char *t_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("%s: cannot open", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* The two directories hold the same files with the same bytes (complete.json, with every size and
 * CRC-32, included), and b is published (complete.json is there). */
static inline void t_assert_same_checkpoint(const char *a, const char *b) {
    int na = 0, nb = 0;
    char pa[1024], pb[1024];
    for (int pass = 0; pass < 2; pass++) {
        DIR *d = opendir(pass ? b : a);
        if (!d) fail_msg("%s: not there", pass ? b : a);
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            if (pass) {
                nb++;
                continue;
            }
            na++;
            snprintf(pa, sizeof pa, "%s/%s", a, e->d_name);
            snprintf(pb, sizeof pb, "%s/%s", b, e->d_name);
            size_t la, lb;
            unsigned char *x = t_slurp(pa, &la), *y = t_slurp(pb, &lb);
            if (la != lb || memcmp(x, y, la) != 0) fail_msg("%s differs from %s", pb, pa);
            free(x);
            free(y);
        }
        closedir(d);
    }
    assert_int_equal(na, nb);
    snprintf(pa, sizeof pa, "%s/complete.json", b);
    struct stat st;
    assert_int_equal(lstat(pa, &st), 0);
}

#endif
