/* CUDA GEMM: cuBLAS strided-batched GEMM for row-major operands (f32, TF32, f16 and bf16 on tensor cores, f32 accumulation). */
#include "backends/cuda/cuda_impl.h"

#include <limits.h>

/* cuBLAS is column-major: a row-major C[m,n] = op(A) op(B) is, read in
 * column-major, C^T[n,m] = op(B)^T op(A)^T, so B goes first, the sizes are
 * swapped, and the transpose flags and leading dimensions stay as given. */

static cudaDataType_t cu_type(ca_dtype dt) {
    switch (dt) {
    case CA_F16: return CUDA_R_16F;
    case CA_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
    }
}

ca_status cu_gemm(void *dev, const ca_gemm_args *args) {
    const ca_gemm_args *g = args;
    cuda_device *d = dev;
    int64_t m = g->m, n = g->n, k = g->k, batch = g->batch < 1 ? 1 : g->batch;
    if (m == 0 || n == 0) return CA_OK;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || g->lda > INT_MAX || g->ldb > INT_MAX ||
        g->ldc > INT_MAX || batch > INT_MAX)
        return ca_error(CA_ERR_UNSUPPORTED, "cuda kernel gemm: a size, leading dimension or batch exceeds "
                                            "cuBLAS's 32-bit integers (m %lld, n %lld, k %lld, batch %lld)",
                        (long long)m, (long long)n, (long long)k, (long long)batch);
    ca_status st = cu_enter(d, "kernel gemm");
    if (st != CA_OK) return st;
    /* nothing to multiply: C = beta C, and beta == 0 must not read C */
    if (k == 0 || g->alpha == 0.0f)
        return cu_gemm_scale_c(d, g->c_dtype, m, n, g->ldc, g->stride_c, batch, g->beta, g->c);

    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    if (g->a_dtype == CA_F32 && (g->allow_tf32 || d->allow_tf32)) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    cublasOperation_t opa = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    float alpha = g->alpha, beta = g->beta;
    cublasStatus_t bs = cu_blas.gemm_strided_batched_ex(
        (cublasHandle_t)d->cublas, opb, opa, (int)n, (int)m, (int)k, &alpha, g->b, cu_type(g->b_dtype),
        (int)g->ldb, (long long)g->stride_b, g->a, cu_type(g->a_dtype), (int)g->lda, (long long)g->stride_a,
        &beta, g->c, cu_type(g->c_dtype), (int)g->ldc, (long long)g->stride_c, (int)batch, compute,
        CUBLAS_GEMM_DEFAULT);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        ca_error(bs == CUBLAS_STATUS_ALLOC_FAILED ? CA_ERR_NOMEM : CA_ERR_BACKEND,
                 "cuda kernel gemm: cublasGemmStridedBatchedEx (%s x %s -> %s, m %lld, n %lld, k %lld, batch "
                 "%lld, trans_a %d, trans_b %d): %s (%s)",
                 ca_dtype_name(g->a_dtype), ca_dtype_name(g->b_dtype), ca_dtype_name(g->c_dtype), (long long)m,
                 (long long)n, (long long)k, (long long)batch, g->trans_a, g->trans_b, cu_blas.status_name(bs),
                 cu_blas.status_string(bs));
        if (bs == CUBLAS_STATUS_NOT_SUPPORTED || bs == CUBLAS_STATUS_ARCH_MISMATCH)
            ca_error_hint("f16/bf16 GEMM needs a GPU with tensor cores for that type (bf16: sm_80 or newer)");
        return ca_last_status();
    }
    return cu_after_launch(d, "gemm");
}
