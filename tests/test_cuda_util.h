/* test_cuda_util.h: helpers of the CUDA tests: loading the built plugin, skipping (exit 77) with the driver's reason when there is no GPU, device buffers. */
#ifndef CACCEL_TEST_CUDA_UTIL_H
#define CACCEL_TEST_CUDA_UTIL_H

#include "test_util.h"

#include <caccel/backend.h>

/* The plugin of this build tree (make check runs from the build directory). */
static inline void tc_plugin_path(char *buf, size_t len) {
    const char *b = getenv("CACCEL_TEST_BUILDDIR");
    snprintf(buf, len, "%s/backends/cuda/.libs/caccel_cuda.so", b && *b ? b : ".");
}

/* Loads the plugin: failing to is a failure (the build made it). */
static inline void tc_load_plugin(void) {
    char path[4096];
    tc_plugin_path(path, sizeof path);
    if (ca_registry_load_plugin_file(path) != CA_OK) {
        fprintf(stderr, "FAIL: cannot load the CUDA plugin %s: %s\n", path, ca_last_error());
        exit(1);
    }
}

/* Number of GPUs the plugin sees, and why there are none. */
static inline int tc_gpu_count(char *reason, size_t len) {
    const ca_device_ops *ops = ca_registry_device("cuda");
    int n = 0;
    reason[0] = '\0';
    if (!ops) {
        /* the registry refuses an unusable backend: its reason is in the listing */
        ca_clear_error();
        for (int i = 0; i < ca_registry_count(); i++) {
            ca_backend_info bi;
            if (ca_registry_get(i, &bi) == CA_OK && bi.kind == CA_BACKEND_DEVICE && strcmp(bi.name, "cuda") == 0)
                snprintf(reason, len, "%s", bi.reason);
        }
        return 0;
    }
    if (ops->device_count(&n, reason, len) != CA_OK) return 0;
    return n;
}

/* Opens GPU 0, or exits 77 (automake's SKIP) saying why there is none. */
static inline ca_device *tc_open_or_skip(const char *test) {
    tc_load_plugin();
    char reason[512];
    if (tc_gpu_count(reason, sizeof reason) == 0) {
        printf("SKIP: %s needs a GPU: %s\n", test, reason[0] ? reason : "no CUDA device");
        exit(77);
    }
    ca_device *g = NULL;
    ca_device_open_args args = {.struct_size = sizeof args, .local_rank = -1};
    if (ca_device_open("cuda", 0, &args, &g) != CA_OK) {
        fprintf(stderr, "FAIL: a GPU is visible but cannot be opened: %s\n", ca_last_error());
        exit(1);
    }
    printf("%s: on %s\n", test, ca_device_description(g));
    return g;
}

/* Device buffers freed together by tc_free_all. */
#define TC_MAX_BUFS 4096
static void *tc_bufs[TC_MAX_BUFS];
static int tc_nbufs;
static ca_device *tc_dev;

static inline void *tc_alloc(size_t bytes) {
    void *p = NULL;
    T_OK(ca_device_alloc(tc_dev, bytes ? bytes : 1, &p));
    if (tc_nbufs < TC_MAX_BUFS) tc_bufs[tc_nbufs++] = p;
    return p;
}

/* A device copy of host memory. */
static inline void *tc_put(const void *h, size_t bytes) {
    void *p = tc_alloc(bytes);
    if (bytes) T_OK(ca_device_copy_from_host(tc_dev, p, h, bytes));
    return p;
}

static inline void tc_get(void *h, const void *d, size_t bytes) {
    if (bytes) T_OK(ca_device_copy_to_host(tc_dev, h, d, bytes));
}

static inline void tc_free_all(void) {
    for (int i = 0; i < tc_nbufs; i++) ca_device_free(tc_dev, tc_bufs[i]);
    tc_nbufs = 0;
}

#endif
