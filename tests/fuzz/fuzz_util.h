/* fuzz_util.h: what the fuzz targets share. The readers take paths, so each input is written to a
 * file in one private directory per process, removed at exit. */
#ifndef CACCEL_FUZZ_UTIL_H
#define CACCEL_FUZZ_UTIL_H

#include <caccel/log.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fz_dir[64];

static inline void fz_cleanup(void) {
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fz_dir);
    if (fz_dir[0] && system(cmd) != 0) fprintf(stderr, "fuzz: cannot remove %s\n", fz_dir);
}

/* The private directory, made on first use; rejected inputs log errors, which would flood the run. */
static inline const char *fz_tmpdir(void) {
    if (fz_dir[0]) return fz_dir;
    const char *t = getenv("TMPDIR");
    snprintf(fz_dir, sizeof fz_dir, "%.40s/caccel-fuzz-XXXXXX", t && t[0] ? t : "/tmp");
    if (!mkdtemp(fz_dir)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(fz_cleanup);
    ca_log_set_level(CA_LOG_OFF);
    return fz_dir;
}

/* Writes the bytes to <dir>/<name>; path receives the file's path. */
static inline void fz_write(const char *name, const void *data, size_t size, char *path, size_t len) {
    snprintf(path, len, "%s/%s", fz_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

#endif
