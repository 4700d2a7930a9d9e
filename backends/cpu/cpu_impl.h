/* cpu_impl.h: private definitions of the CPU backend: device context, half-precision conversions, kernel entry points. */
#ifndef CACCEL_CPU_IMPL_H
#define CACCEL_CPU_IMPL_H

#include <caccel/backend.h>
#include "base/half_impl.h"
#include "base/kernel_check_impl.h"
#include "base/unary_math_impl.h"

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

/* oneDNN's GEMMs when it is present and chosen (cpu_onednn.c); row-major, C f32. The paths are
 * fixed at first use (environment, CPU, OpenBLAS's core); the *_path strings say which and why. */
bool cpu_bf16_gemm_available(void);
const char *cpu_bf16_gemm_path(void);
/* Whether an f32 GEMM of this size goes to oneDNN now (auto: from CPU_ONEDNN_MIN_MNK multiply-adds,
 * with one BLAS thread). */
#define CPU_ONEDNN_MIN_MNK (1 << 19)
bool cpu_f32_gemm_onednn(int64_t m, int64_t n, int64_t k);
const char *cpu_f32_gemm_path(void);
ca_status cpu_bf16_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                        int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc);
ca_status cpu_onednn_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                           int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* ---------------------------------------------------------------- bits */

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
