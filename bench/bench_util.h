/* bench_util.h: what the MLP benchmarks share: the clock, the 784-256-128-10 MLP, the data in
 * the PyTorch peers' order, and test accuracy. */
#ifndef CACCEL_BENCH_UTIL_H
#define CACCEL_BENCH_UTIL_H

#include <caccel/caccel.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The target_clones variant the CPU backend's loops run here (the ifunc resolver's order). */
static inline const char *bench_kernel_set(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return "avx512f";
    if (__builtin_cpu_supports("avx2")) return "avx2";
#endif
    return "default";
}

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* With BENCH_WINDOWS set, the CLOCK_MONOTONIC window [t0, t1] of a timed loop on stderr: bench/run_threads.sh
 * keeps only a profile's samples inside it (perf record -k CLOCK_MONOTONIC stamps samples on the same
 * clock), so that setup, data loading and the GEMM-bound measurements stay out of a step's profile. */
static inline void bench_window(const char *what, int batch, double t0, double t1) {
    if (getenv("BENCH_WINDOWS")) fprintf(stderr, "# window %s batch=%d from=%.6f to=%.6f\n", what, batch, t0, t1);
}

/* CPU seconds of the whole process (all threads): on a loaded machine a 1-thread run's CPU
 * time is its own work, where the wall clock also counts the time it waited for a CPU. */
static inline double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline ca_module *mlp(void) {
    ca_module *seq, *l;
    CA_CHECK(ca_sequential_create(&seq));
    CA_CHECK(ca_linear_create(784, 256, true, &l)); CA_CHECK(ca_module_add(seq, "fc1", l));
    CA_CHECK(ca_relu_create(&l));                   CA_CHECK(ca_module_add(seq, "relu1", l));
    CA_CHECK(ca_linear_create(256, 128, true, &l)); CA_CHECK(ca_module_add(seq, "fc2", l));
    CA_CHECK(ca_relu_create(&l));                   CA_CHECK(ca_module_add(seq, "relu2", l));
    CA_CHECK(ca_linear_create(128, 10, true, &l));  CA_CHECK(ca_module_add(seq, "fc3", l));
    return seq;
}

/* A whole split as persistent device tensors: x f32 [n, 784] (pixels / 255), y i64 [n],
 * rows in a fixed shuffled order (the same permutation as the PyTorch peer's), decompressed and
 * converted straight into the tensors a chunk at a time (no host copy of the split). */
static inline int64_t bench_order(int64_t i, int64_t n, void *ctx) {
    (void)ctx;
    return (i * 7919) % n;                             /* 7919 is prime and coprime with 60000 */
}

static inline void load(ca_device *dev, bool train, ca_tensor **x, ca_tensor **y) {
    ca_idx_load_opts o = {.x_scale = 1.0f / 255.0f, .order = train ? bench_order : NULL};
    CA_CHECK(ca_fashion_mnist_load_tensors(NULL, train, dev, &o, x, y));
}

static inline double accuracy(ca_module *m, ca_tensor *x, ca_tensor *y) {
    int64_t n = ca_tensor_dim(x, 0), correct = 0;
    int64_t *p = malloc(sizeof(int64_t) * (size_t)n), *t = malloc(sizeof(int64_t) * (size_t)n);
    CA_SCOPE {
        CA_NO_GRAD { CA_CHECK(ca_tensor_to_host(ca_argmax(ca_module_forward(m, x)), p, sizeof(int64_t) * (size_t)n)); }
    }
    CA_CHECK(ca_tensor_to_host(y, t, sizeof(int64_t) * (size_t)n));
    for (int64_t i = 0; i < n; i++) correct += p[i] == t[i];
    free(p);
    free(t);
    return 100.0 * (double)correct / (double)n;
}

#endif
