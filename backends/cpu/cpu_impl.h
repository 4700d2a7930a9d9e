/* cpu_impl.h: private definitions of the CPU backend: device context, half-precision conversions, kernel entry points. */
#ifndef CACCEL_CPU_IMPL_H
#define CACCEL_CPU_IMPL_H

#include <caccel/backend.h>
#include "base/half_impl.h"
#include "base/kernel_check_impl.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Hot loops are compiled for AVX-512, AVX2 and baseline x86-64 and picked at
 * load time (ifunc), so one binary runs on any x86-64 and uses what it finds.
 * Other targets get the plain build. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(CA_CPU_NO_CLONES)
#define CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CPU_CLONES
#endif

/* For helpers used inside cloned loops: an out-of-line copy would be built
 * for the baseline target only, so they must always be inlined. */
#define CPU_INLINE static inline __attribute__((always_inline))

/* Elements per chunk when f16/bf16 data are converted through an f32 buffer. */
#define CPU_CHUNK 1024

/* The context behind every `dev` pointer of this backend. */
typedef struct cpu_device {
    int index;
    int blas_threads;          /* OpenBLAS threads when the device was opened */
    void *scratch;             /* GEMM conversion buffer (f16/bf16 operands) */
    size_t scratch_bytes;
} cpu_device;

/* oneDNN's bf16 GEMM when it is present and chosen (cpu_bf16.c); row-major, C f32. */
bool cpu_bf16_gemm_available(void);
const char *cpu_bf16_gemm_path(void);
/* Threads of oneDNN's OpenMP pool, when oneDNN is loaded. */
void cpu_bf16_set_threads(int n);
ca_status cpu_bf16_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                        int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* ---------------------------------------------------------------- bits */

/* expf to about 2 ulp, written for the vectoriser (no calls, no branches):
 * e^x = 2^n e^r with |r| <= ln2/2, the 2^n applied in two halves so that
 * subnormal results come out right. */
CPU_INLINE float cpu_expf(float x) {
    const float shifter = 12582912.0f;                  /* 1.5 * 2^23: rounds to an integer */
    float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
    float k = xc * 1.44269504088896341f + shifter;
    float n = k - shifter;
    int32_t ni = (int32_t)(ca_f32_bits(k) - ca_f32_bits(shifter));
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t n1 = ni / 2, n2 = ni - n1;
    float s1 = ca_bits_f32((uint32_t)(n1 + 127) << 23);
    float s2 = ca_bits_f32((uint32_t)(n2 + 127) << 23);
    float y = p * s1 * s2;
    y = x > 88.72283935546875f ? INFINITY : y;
    y = x < -103.972084045410156f ? 0.0f : y;
    return x != x ? x : y;
}

/* The standard normal CDF Phi(x) = (1 + erf(x / sqrt 2)) / 2, for GELU, written for the
 * vectoriser (libm's erff is a scalar call): erfc by Numerical Recipes' Chebyshev fit
 * erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2), relative error below 1.2e-7 in exact
 * arithmetic; in f32 about 2e-7 relative for |x| < 8 (the rounding of z^2 grows it in the far
 * tail, where Phi < 1e-15). Taken from erfc on both sides, so the negative tail keeps its
 * relative accuracy instead of cancelling in 1 + erf. */
CPU_INLINE float cpu_phif(float x) {
    float z = (x < 0.0f ? -x : x) * 0.70710678118654752f;
    float t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    float half_erfc = 0.5f * t * cpu_expf(p - z * z);
    return x < 0.0f ? half_erfc : 1.0f - half_erfc;
}

/* --------------------------------------------------------- shared helpers */

/* Error for a dtype a kernel does not take. */
ca_status cpu_bad_dtype(const char *kernel, const char *what, ca_dtype dt);

/* f16/bf16/f32 <-> f32 conversion of n contiguous elements starting at
 * element `off` (f32 in or out: a copy). */
void cpu_to_f32(ca_dtype dt, const void *x, int64_t off, int64_t n, float *out);
void cpu_from_f32(ca_dtype dt, const float *x, int64_t n, void *y, int64_t off);
/* As cpu_to_f32 with an element stride. */
void cpu_to_f32_strided(ca_dtype dt, const void *x, int64_t off, int64_t stride, int64_t n,
                        float *out);

/* The f32 view of n elements at element `off` of x: x itself when f32, else
 * the elements converted into buf (at least n floats). */
static inline const float *cpu_view_f32(ca_dtype dt, const void *x, int64_t off, int64_t n,
                                        float *buf) {
    if (dt == CA_F32) return (const float *)x + off;
    cpu_to_f32(dt, x, off, n, buf);
    return buf;
}

/* Reads an integer label/index (i32 or i64). */
static inline int64_t cpu_index_at(ca_dtype idx_dt, const void *idx, int64_t i) {
    return idx_dt == CA_I64 ? ((const int64_t *)idx)[i] : (int64_t)((const int32_t *)idx)[i];
}

/* Sum and maximum (NaN wins; m is the starting value) of n contiguous floats,
 * in vector lanes. */
float cpu_run_sum(const float *x, int64_t n);
float cpu_run_max(const float *x, int64_t n, float m);

/* Philox4x32-10 words for `count` consecutive counters starting at
 * `counter`: out[4j + w] is word w of counter + j. */
void cpu_philox_words(uint64_t seed, uint64_t counter, int64_t count, uint32_t *out);

/* The OpenBLAS thread count this process should use by default. */
int cpu_default_blas_threads(void);

/* The device vtable (cpu_device.c), which points at the kernel table. */
extern const ca_device_ops cpu_device_ops;

/* ---------------------------------------------------------------- kernels */

ca_status cpu_gemm(void *dev, const ca_gemm_args *args);
ca_status cpu_fill(void *dev, ca_dtype dt, int64_t n, double value, void *y);
ca_status cpu_cast(void *dev, ca_dtype src_dt, const void *x, ca_dtype dst_dt, void *y,
                   int64_t n, float alpha);
ca_status cpu_copy_strided(void *dev, ca_dtype dt, int ndim, const int64_t *shape,
                           const void *x, const int64_t *x_stride, void *y,
                           const int64_t *y_stride);
ca_status cpu_unary(void *dev, ca_unary_op op, ca_dtype dt, int64_t n, const void *x, void *y,
                    float alpha);
ca_status cpu_unary_backward(void *dev, ca_unary_op op, ca_dtype dt, int64_t n, const void *x,
                             const void *y, const void *dy, void *dx, float alpha, float beta);
ca_status cpu_binary(void *dev, ca_binary_op op, ca_dtype dt, const ca_bcast_args *shape,
                     const void *a, const void *b, void *y);
ca_status cpu_axpby(void *dev, ca_dtype dt, int64_t n, float alpha, const void *x, float beta,
                    void *y);
ca_status cpu_reduce(void *dev, ca_reduce_op op, ca_dtype dt, int64_t outer, int64_t len,
                     int64_t inner, const void *x, void *y, float beta);
ca_status cpu_argmax(void *dev, ca_dtype dt, int64_t rows, int64_t cols, const void *x,
                     int64_t *idx);
ca_status cpu_softmax(void *dev, bool log, ca_dtype dt, int64_t rows, int64_t cols,
                      const void *x, void *y);
ca_status cpu_softmax_backward(void *dev, bool log, ca_dtype dt, int64_t rows, int64_t cols,
                               const void *y, const void *dy, void *dx, float beta);
ca_status cpu_cross_entropy(void *dev, ca_dtype dt, int64_t rows, int64_t cols,
                            const void *logits, ca_dtype label_dt, const void *labels,
                            int64_t ignore_index, float *loss, float *lse, float *count);
ca_status cpu_cross_entropy_backward(void *dev, ca_dtype dt, int64_t rows, int64_t cols,
                                     const void *logits, const float *lse, ca_dtype label_dt,
                                     const void *labels, int64_t ignore_index,
                                     const float *dloss, const float *count, void *dlogits,
                                     float beta);
ca_status cpu_layer_norm(void *dev, ca_dtype dt, int64_t rows, int64_t cols, const void *x,
                         const void *gamma, const void *beta_, float eps, void *y, float *mean,
                         float *rstd);
ca_status cpu_layer_norm_backward(void *dev, ca_dtype dt, int64_t rows, int64_t cols,
                                  const void *x, const void *gamma, const float *mean,
                                  const float *rstd, const void *dy, void *dx, float beta,
                                  void *dgamma, void *dbeta_, bool accumulate_params);
ca_status cpu_embedding(void *dev, ca_dtype dt, int64_t n, int64_t rows, int64_t dim, const void *table,
                        ca_dtype idx_dt, const void *idx, void *y);
ca_status cpu_embedding_backward(void *dev, ca_dtype dt, int64_t n, int64_t rows, int64_t dim,
                                 ca_dtype idx_dt, const void *idx, const void *dy,
                                 void *dtable);
ca_status cpu_rng(void *dev, ca_rng_kind kind, ca_dtype dt, int64_t n, uint64_t seed,
                  uint64_t offset, float a, float b, void *y);
ca_status cpu_dropout(void *dev, ca_dtype dt, int64_t n, float p, uint64_t seed,
                      uint64_t offset, const void *x, void *y, uint8_t *mask);
ca_status cpu_dropout_backward(void *dev, ca_dtype dt, int64_t n, float p, const uint8_t *mask,
                               const void *dy, void *dx, float beta);
ca_status cpu_adamw(void *dev, const ca_tensor_list *t, const ca_adamw_args *args);
ca_status cpu_sgd(void *dev, const ca_tensor_list *t, const ca_sgd_args *args);
ca_status cpu_sum_squares(void *dev, const ca_tensor_list *t, float *out, float beta);
ca_status cpu_scale_list(void *dev, const ca_tensor_list *t, float alpha);
ca_status cpu_unscale_check(void *dev, const ca_tensor_list *t, float inv_scale,
                            float *found_inf);
ca_status cpu_clamp_list(void *dev, const ca_tensor_list *t, float lo, float hi);
ca_status cpu_attention(void *dev, ca_dtype dt, const ca_attention_args *args, const void *q,
                        const void *k, const void *v, void *out, float *lse);
ca_status cpu_attention_backward(void *dev, ca_dtype dt, const ca_attention_args *args,
                                 const void *q, const void *k, const void *v, const void *out,
                                 const void *dout, const float *lse, void *dq, void *dk, void *dv);
ca_status cpu_where(void *dev, ca_dtype dt, const ca_bcast_args *shape, const int64_t *cond_stride,
                    const uint8_t *cond, const void *a, const void *b, void *y);
ca_status cpu_gather(void *dev, ca_dtype dt, int64_t outer, int64_t len, int64_t inner, int64_t n,
                     const void *x, ca_dtype idx_dt, const void *idx, void *y);
ca_status cpu_gather_backward(void *dev, ca_dtype dt, int64_t outer, int64_t len, int64_t inner,
                              int64_t n, ca_dtype idx_dt, const void *idx, const void *dy, void *dx);

#endif
