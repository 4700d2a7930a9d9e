/* CUDA counter-based random numbers: Philox4x32-10 uniform and normal draws and dropout (+ backward), the same numbers as the CPU backend. */
#include "backends/cuda/cuda_common.cuh"

/* One thread per counter j = offset + k: uniform elements 4k..4k+3 (word i % 4),
 * normal elements 2k, 2k+1 (words 0,1 and 2,3). */
template <typename T>
__global__ void uniform_k(int64_t n, uint64_t seed, uint64_t offset, float lo, float span, typename T::S *y) {
    int64_t counters = (n + 3) / 4;
    CU_GRID_LOOP(k, counters) {
        uint32_t w[4];
        cu_philox(seed, offset + (uint64_t)k, w);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int64_t i = 4 * k + j;
            if (i < n) T::st(y, i, lo + span * ((float)(w[j] >> 8) * CU_TWO_M24));
        }
    }
}

/* Box-Muller as the CPU computes it: each of log, cos and sqrt rounded once
 * to f32. log and cos are evaluated in f64 and rounded, which is the
 * correctly rounded f32 result (glibc's logf/cosf give it too, except in
 * rare cases where they are off by one unit in the last place). */
template <typename T>
__global__ void normal_k(int64_t n, uint64_t seed, uint64_t offset, float mean, float sd, typename T::S *y) {
    const float two_pi = 6.28318530717958648f;
    int64_t counters = (n + 1) / 2;
    CU_GRID_LOOP(k, counters) {
        uint32_t w[4];
        cu_philox(seed, offset + (uint64_t)k, w);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int64_t i = 2 * k + j;
            if (i >= n) break;
            float u1 = (float)((w[2 * j] >> 8) + 1u) * CU_TWO_M24;
            float u2 = (float)(w[2 * j + 1] >> 8) * CU_TWO_M24;
            float l = (float)log((double)u1);
            float c = (float)cos((double)(two_pi * u2));
            float r = sqrtf(-2.0f * l);
            T::st(y, i, mean + sd * (r * c));
        }
    }
}

extern "C" ca_status cu_rng(void *dev, const ca_rng_args *args) {
    ca_rng_kind kind = args->kind;
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    uint64_t seed = args->seed;
    uint64_t offset = args->offset;
    float a = args->a;
    float b = args->b;
    void *y = args->y;
    cuda_device *d = (cuda_device *)dev;
    if (n == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel rng");
    if (st != CA_OK) return st;
    int64_t counters = (int64_t)ca_rng_counters(kind, n);
    unsigned g = cu_grid(d, counters, CU_THREADS);
    if (kind == CA_RNG_UNIFORM) {
        float span = b - a;
        CU_FLOAT_SWITCH(dt, T, uniform_k<T><<<g, CU_THREADS, 0, d->stream>>>(n, seed, offset, a, span, (T::S *)y));
    } else {
        CU_FLOAT_SWITCH(dt, T, normal_k<T><<<g, CU_THREADS, 0, d->stream>>>(n, seed, offset, a, b, (T::S *)y));
    }
    return CU_LAUNCHED(d, "rng");
}

/* y = x * (u >= p ? 1 / (1 - p) : 0), mask = (u >= p); y may be x. */
template <typename T>
__global__ void dropout_k(int64_t n, float p, float scale, uint64_t seed, uint64_t offset, const typename T::S *x,
                          typename T::S *y, uint8_t *mask) {
    int64_t counters = (n + 3) / 4;
    CU_GRID_LOOP(k, counters) {
        uint32_t w[4];
        cu_philox(seed, offset + (uint64_t)k, w);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int64_t i = 4 * k + j;
            if (i >= n) break;
            float u = (float)(w[j] >> 8) * CU_TWO_M24;
            bool keep = u >= p;
            T::st(y, i, T::ld(x, i) * (keep ? scale : 0.0f));
            if (mask) mask[i] = (uint8_t)keep;
        }
    }
}

extern "C" ca_status cu_dropout(void *dev, const ca_dropout_args *args) {
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    float p = args->p;
    uint64_t seed = args->seed;
    uint64_t offset = args->offset;
    const void *x = args->x;
    void *y = args->y;
    uint8_t *mask = args->mask;
    cuda_device *d = (cuda_device *)dev;
    if (n == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel dropout");
    if (st != CA_OK) return st;
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    unsigned g = cu_grid(d, (n + 3) / 4, CU_THREADS);
    CU_FLOAT_SWITCH(dt, T, dropout_k<T><<<g, CU_THREADS, 0, d->stream>>>(n, p, scale, seed, offset,
        (const T::S *)x, (T::S *)y, mask));
    return CU_LAUNCHED(d, "dropout");
}

template <typename T>
__global__ void dropout_bwd_k(int64_t n, float scale, const uint8_t *mask, const typename T::S *dy,
                              typename T::S *dx, float beta) {
    CU_GRID_LOOP(i, n) {
        float g = T::ld(dy, i) * ((float)mask[i] * scale);
        T::st(dx, i, beta == 0.0f ? g : beta * T::ld(dx, i) + g);
    }
}

extern "C" ca_status cu_dropout_backward(void *dev, const ca_dropout_backward_args *args) {
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    float p = args->p;
    const uint8_t *mask = args->mask;
    const void *dy = args->dy;
    void *dx = args->dx;
    float beta = args->beta;
    cuda_device *d = (cuda_device *)dev;
    if (n == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel dropout_backward");
    if (st != CA_OK) return st;
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    unsigned g = cu_grid(d, n, CU_THREADS);
    CU_FLOAT_SWITCH(dt, T, dropout_bwd_k<T><<<g, CU_THREADS, 0, d->stream>>>(n, scale, mask, (const T::S *)dy,
        (T::S *)dx, beta));
    return CU_LAUNCHED(d, "dropout_backward");
}
