/* cuda_common.cuh: device helpers of the kernel files: the CPU backend's half-precision conversions (bit for bit), dtype dispatch, Philox4x32-10, block reductions, launch sizes, kernel error reports. */
#ifndef CACCEL_CUDA_COMMON_CUH
#define CACCEL_CUDA_COMMON_CUH

#include "backends/cuda/cuda_impl.h"
#include "base/half_impl.h"

#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Every file is compiled with --fmad=false: a * b + c is two rounded
 * operations, as in the CPU backend (C11, no contraction), so elementwise
 * results, casts, dropout and the optimizers match it bit for bit. */

#define CU_HD static __host__ __device__ __forceinline__
#define CU_D static __device__ __forceinline__

/* Threads per block of the elementwise kernels. */
#define CU_THREADS 256

/* --------------------------------------------------------- float dtypes */

/* Storage types: S is what memory holds; ld/st convert through f32. */
struct T_f32 {
    typedef float S;
    static __device__ __forceinline__ float ld(const S *p, int64_t i) { return p[i]; }
    static __device__ __forceinline__ void st(S *p, int64_t i, float v) { p[i] = v; }
};
struct T_f16 {
    typedef uint16_t S;
    static __device__ __forceinline__ float ld(const S *p, int64_t i) { return ca_f16_to_f32(p[i]); }
    static __device__ __forceinline__ void st(S *p, int64_t i, float v) { p[i] = ca_f32_to_f16(v); }
};
struct T_bf16 {
    typedef uint16_t S;
    static __device__ __forceinline__ float ld(const S *p, int64_t i) { return ca_bf16_to_f32(p[i]); }
    static __device__ __forceinline__ void st(S *p, int64_t i, float v) { p[i] = ca_f32_to_bf16(v); }
};

/* Runs the statements with T bound to the storage type of float dtype dt. */
#define CU_FLOAT_SWITCH(dt, T, ...)                                  \
    switch (dt) {                                                    \
    case CA_F32: { typedef T_f32 T; __VA_ARGS__; } break;            \
    case CA_F16: { typedef T_f16 T; __VA_ARGS__; } break;            \
    case CA_BF16: { typedef T_bf16 T; __VA_ARGS__; } break;          \
    default: break;                                                  \
    }

/* Reads an integer label/index (i32 or i64). */
CU_D int64_t cu_index_at(bool i64, const void *idx, int64_t i) {
    return i64 ? ((const int64_t *)idx)[i] : (int64_t)((const int32_t *)idx)[i];
}

/* ---------------------------------------------------------------- launch */

/* Blocks for n elements, capped: the kernels loop (grid-stride). */
static inline unsigned cu_grid(const cuda_device *d, int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    int64_t cap = (int64_t)d->sm_count * 32;
    if (b > cap) b = cap;
    if (b < 1) b = 1;
    return (unsigned)b;
}

/* Threads for a block that works on one row of `cols` elements. */
static inline int cu_row_threads(int64_t cols) {
    if (cols <= 32) return 32;
    if (cols <= 64) return 64;
    if (cols <= 128) return 128;
    if (cols <= 256) return 256;
    return 512;
}

/* Rows per launch dimension: blockIdx.x loops over rows beyond the grid. */
static inline unsigned cu_row_grid(int64_t rows) {
    return (unsigned)(rows < 65535 * 8 ? (rows < 1 ? 1 : rows) : 65535 * 8);
}

#define CU_GRID_LOOP(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* --------------------------------------------------------- reductions */

struct CuSum {
    template <typename V> __device__ __forceinline__ V operator()(V a, V b) const { return a + b; }
};
/* NaN wins, as the CPU's max_nan/min_nan. */
struct CuMax {
    __device__ __forceinline__ float operator()(float m, float v) const { return (v > m || v != v) ? v : m; }
};
struct CuMin {
    __device__ __forceinline__ float operator()(float m, float v) const { return (v < m || v != v) ? v : m; }
};

/* Reduces v over the block (blockDim.x a multiple of 32, at most 1024);
 * every thread gets the result. `shm` holds 32 values of V. Deterministic. */
template <typename V, typename Op>
__device__ __forceinline__ V cu_block_reduce(V v, Op op, V *shm) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();            /* shm may still be read from a previous reduction */
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    V r = shm[0];
    for (int w = 1; w < nw; w++) r = op(r, shm[w]);
    return r;
}

/* ------------------------------------------------------------- Philox */

#define CU_PHILOX_M0 0xD2511F53u
#define CU_PHILOX_M1 0xCD9E8D57u
#define CU_PHILOX_W0 0x9E3779B9u
#define CU_PHILOX_W1 0xBB67AE85u
#define CU_TWO_M24 5.9604644775390625e-08f /* 2^-24 */

/* The four Philox4x32-10 words of counter c (backend.h's contract). */
CU_D void cu_philox(uint64_t seed, uint64_t c, uint32_t w[4]) {
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    uint32_t c0 = (uint32_t)c, c1 = (uint32_t)(c >> 32), c2 = 0, c3 = 0;
#pragma unroll
    for (int r = 0; r < 10; r++) {
        uint32_t hi0 = __umulhi(CU_PHILOX_M0, c0), lo0 = CU_PHILOX_M0 * c0;
        uint32_t hi1 = __umulhi(CU_PHILOX_M1, c2), lo1 = CU_PHILOX_M1 * c2;
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        c1 = lo1;
        c3 = lo0;
        c0 = n0;
        c2 = n2;
        k0 += CU_PHILOX_W0;
        k1 += CU_PHILOX_W1;
    }
    w[0] = c0;
    w[1] = c1;
    w[2] = c2;
    w[3] = c3;
}

/* ------------------------------------------------------ error reports */

struct cu_err_ref {
    int *claim;
    cu_dev_error *rec;
};

static inline cu_err_ref cu_err_of(const cuda_device *d) {
    cu_err_ref r = {d->err_claim, d->err_dev};
    return r;
}

/* Records the first data problem a kernel finds (see cu_dev_error). */
CU_D void cu_report(cu_err_ref e, int code, int backward, long long index, long long value, long long bound,
                    long long extra) {
    if (!e.claim || atomicCAS(e.claim, 0, 1) != 0) return;
    volatile cu_dev_error *r = e.rec;
    r->backward = backward;
    r->index = index;
    r->value = value;
    r->bound = bound;
    r->extra = extra;
    __threadfence_system();
    r->code = code;
    __threadfence_system();
}

/* Launches and checks: `return CU_LAUNCHED(d, "name");` after a <<<>>>. */
#define CU_LAUNCHED(d, name) cu_after_launch((d), (name))

#endif
