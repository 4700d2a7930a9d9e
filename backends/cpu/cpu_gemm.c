/* CPU GEMM: OpenBLAS or oneDNN sgemm (row-major), strided batches, f16/bf16 operands through f32 scratch
 * or oneDNN's bf16 GEMM. */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"

#include <cblas.h>
#include <limits.h>
#include <stdlib.h>

/* C[m,n] (ldc) = beta * C without a GEMM: alpha == 0 or k == 0. beta == 0
 * writes zeros and reads nothing. */
static void scale_c_f32(float *c, int64_t m, int64_t n, int64_t ldc, float beta) {
    for (int64_t i = 0; i < m; i++) {
        float *row = c + i * ldc;
        if (beta == 0.0f)
            memset(row, 0, (size_t)n * sizeof(float));
        else if (beta != 1.0f)
            for (int64_t j = 0; j < n; j++) row[j] *= beta;
    }
}

static ca_status sgemm_one(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                           const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                           float *c, int64_t ldc) {
    if (k == 0 || alpha == 0.0f) {
        scale_c_f32(c, m, n, ldc, beta);
        return CA_OK;
    }
    ca_status st = CA_OK;
    if (cpu_gemm_split(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, &st)) return st;
    /* a GEMM the split left whole gets the threads its size pays for (cpu_gemm_threads), not all of them,
     * and the library rule of that count (the one-thread rule where it is one) */
    bool nested = cpu_in_parallel();
    int threads = nested ? 1 : cpu_gemm_threads(m, n, k, cpu_blas_threads());
    if (!nested) {
        cpu_team_note(CPU_TEAM_GEMM, threads);
        cpu_blas_threads_begin(threads);
    }
    bool timed = threads > 1 && cpu_team_log_on();
    double t0 = timed ? cpu_team_clock() : 0.0;
    if (cpu_f32_gemm_onednn_at(m, n, k, threads))
        st = cpu_onednn_sgemm_threads(threads, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta,
                    c, (blasint)ldc);
    if (timed) cpu_team_log('G', t0, cpu_team_clock(), threads, NULL, NULL);
    if (!nested) cpu_blas_threads_end();
    return st;
}

/* Converts a rows x cols matrix with row stride ld to contiguous f32. */
static void matrix_to_f32(ca_dtype dt, const void *x, int64_t rows, int64_t cols, int64_t ld,
                          float *out) {
    for (int64_t r = 0; r < rows; r++) cpu_to_f32(dt, x, r * ld, cols, out + r * cols);
}

static ca_status scratch_get(cpu_device *d, size_t bytes, float **out, bool *owned) {
    *owned = false;
    if (d && d->scratch_bytes >= bytes) {
        *out = d->scratch;
        return CA_OK;
    }
    void *p = NULL;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded) p = aligned_alloc(64, rounded);
    if (!p)
        return ca_error(CA_ERR_NOMEM, "cpu kernel gemm: out of host memory for a %zu-byte f32 "
                                      "conversion buffer", bytes);
    if (d) {
        free(d->scratch);
        d->scratch = p;
        d->scratch_bytes = rounded;
    } else {
        *owned = true;
    }
    *out = p;
    return CA_OK;
}

/* bf16 operands straight into oneDNN; a bf16 C goes through an f32 block. */
static ca_status bf16_native(cpu_device *d, const ca_gemm_args *g) {
    int64_t m = g->m, n = g->n, k = g->k, batch = g->batch < 1 ? 1 : g->batch;
    float *fc = NULL;
    bool owned = false;
    if (g->c_dtype != CA_F32) {
        ca_status st = scratch_get(d, (size_t)(m * n) * sizeof(float), &fc, &owned);
        if (st != CA_OK) return st;
    }
    ca_status st = CA_OK;
    /* oneDNN takes the BLAS count of the moment: the threads this size pays for (cpu_gemm_threads) */
    bool nested = cpu_in_parallel();
    int threads = nested ? 1 : cpu_gemm_threads(m, n, k, cpu_blas_threads());
    if (!nested) cpu_blas_threads_begin(threads);
    bool timed = threads > 1 && cpu_team_log_on();
    double t0 = timed ? cpu_team_clock() : 0.0;
    for (int64_t i = 0; st == CA_OK && i < batch; i++) {
        const uint16_t *a = (const uint16_t *)g->a + i * g->stride_a, *b = (const uint16_t *)g->b + i * g->stride_b;
        if (g->c_dtype == CA_F32) {
            st = cpu_bf16_gemm(g->trans_a, g->trans_b, m, n, k, g->alpha, a, g->lda, b, g->ldb, g->beta,
                               (float *)g->c + i * g->stride_c, g->ldc);
            continue;
        }
        char *c = (char *)g->c + i * g->stride_c * 2;
        if (g->beta != 0.0f) matrix_to_f32(CA_BF16, c, m, n, g->ldc, fc);
        st = cpu_bf16_gemm(g->trans_a, g->trans_b, m, n, k, g->alpha, a, g->lda, b, g->ldb, g->beta, fc, n);
        if (st == CA_OK)
            for (int64_t r = 0; r < m; r++) cpu_from_f32(CA_BF16, fc + r * n, n, c, r * g->ldc);
    }
    if (timed) cpu_team_log('G', t0, cpu_team_clock(), threads, NULL, NULL);
    if (!nested) cpu_blas_threads_end();
    if (owned) free(fc);
    return st;
}

ca_status cpu_gemm(void *dev, const ca_gemm_args *args) {
    const ca_gemm_args *g = args;
    int64_t m = g->m, n = g->n, k = g->k, batch = g->batch < 1 ? 1 : g->batch;
    if (m == 0 || n == 0) return CA_OK;
    /* A is stored [m,k] or [k,m], B [k,n] or [n,k] */
    int64_t a_rows = g->trans_a ? k : m, a_cols = g->trans_a ? m : k;
    int64_t b_rows = g->trans_b ? n : k, b_cols = g->trans_b ? k : n;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || g->lda > INT_MAX || g->ldb > INT_MAX ||
        g->ldc > INT_MAX)
        return ca_error(CA_ERR_UNSUPPORTED, "cpu kernel gemm: a size or leading dimension exceeds "
                                            "OpenBLAS's 32-bit integers (m %lld, n %lld, k %lld)",
                        (long long)m, (long long)n, (long long)k);

    if (g->a_dtype == CA_F32) {
        ca_status st = CA_OK;
        for (int64_t i = 0; st == CA_OK && i < batch; i++)
            st = sgemm_one(g->trans_a, g->trans_b, m, n, k, g->alpha,
                           (const float *)g->a + i * g->stride_a, g->lda,
                           (const float *)g->b + i * g->stride_b, g->ldb, g->beta,
                           (float *)g->c + i * g->stride_c, g->ldc);
        return st;
    }

    if (g->a_dtype == CA_BF16 && k > 0 && g->alpha != 0.0f && cpu_bf16_gemm_available()) return bf16_native(dev, g);

    /* f16/bf16: convert the operands to contiguous f32 and run sgemm; a
     * half-precision C goes through f32 too (read only when beta != 0). */
    size_t na = (size_t)(a_rows * a_cols), nb = (size_t)(b_rows * b_cols);
    size_t nc = g->c_dtype == CA_F32 ? 0 : (size_t)(m * n);
    float *s = NULL;
    bool owned = false;
    ca_status st = scratch_get(dev, (na + nb + nc) * sizeof(float), &s, &owned);
    if (st != CA_OK) return st;
    float *fa = s, *fb = s + na, *fc = s + na + nb;
    ca_dtype dt = g->a_dtype;
    for (int64_t i = 0; st == CA_OK && i < batch; i++) {
        if (k > 0) {
            if (i == 0 || g->stride_a != 0)
                matrix_to_f32(dt, (const char *)g->a + i * g->stride_a * 2, a_rows, a_cols, g->lda, fa);
            if (i == 0 || g->stride_b != 0)
                matrix_to_f32(dt, (const char *)g->b + i * g->stride_b * 2, b_rows, b_cols, g->ldb, fb);
        }
        if (g->c_dtype == CA_F32) {
            st = sgemm_one(g->trans_a, g->trans_b, m, n, k, g->alpha, fa, a_cols, fb, b_cols, g->beta,
                           (float *)g->c + i * g->stride_c, g->ldc);
            continue;
        }
        char *c = (char *)g->c + i * g->stride_c * 2;
        if (g->beta != 0.0f) matrix_to_f32(dt, c, m, n, g->ldc, fc);
        st = sgemm_one(g->trans_a, g->trans_b, m, n, k, g->alpha, fa, a_cols, fb, b_cols, g->beta, fc, n);
        if (st == CA_OK)
            for (int64_t r = 0; r < m; r++) cpu_from_f32(dt, fc + r * n, n, c, r * g->ldc);
    }
    if (owned) free(s);
    return st;
}
