/* CUDA scaled dot-product attention as strided-batched cuBLAS GEMMs over chunks of heads, with row kernels for the masked softmax and the score gradient (no atomics: run-to-run reproducible), where and gather. */
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_att_plan.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>

/* Threads per score row of the row kernels. */
#define ATT_THREADS 256

/* The row kernels' arguments, passed by value (mask is a device pointer). */
struct att_k {
    int64_t heads, tq, tk, dv;
    float p, keep_scale;
    bool causal;
    uint64_t seed, offset;
    int64_t sheads, shead0;   /* the args' stream_heads and stream_head0 (ca_attention_stream_bh) */
    const void *mask;
    bool mask_f32;
    int64_t ms0, ms1, ms2, ms3;
};

static att_k att_pack(const ca_attention_params *a, int64_t stream_heads, int64_t stream_head0) {
    att_k k;
    k.sheads = stream_heads; k.shead0 = stream_head0;
    k.heads = a->heads; k.tq = a->tq; k.tk = a->tk; k.dv = a->dv;
    k.p = a->dropout_p; k.keep_scale = 1.0f / (1.0f - a->dropout_p);   /* as the CPU's keep_scale */
    k.causal = a->causal;
    k.seed = a->seed; k.offset = a->offset;
    k.mask = a->mask; k.mask_f32 = a->mask_dtype == CA_F32;
    k.ms0 = a->mask_stride[0]; k.ms1 = a->mask_stride[1]; k.ms2 = a->mask_stride[2]; k.ms3 = a->mask_stride[3];
    return k;
}

/* Score s (= scale q_i.k_j) of key j for row (b, h, i) after the causal cut and the mask; -inf when
 * excluded (the CPU's mask_row). */
CU_D float att_mask(const att_k &a, int64_t b, int64_t h, int64_t i, int64_t j, float s) {
    if (a.causal && j > i) return -INFINITY;
    if (a.mask) {
        int64_t o = b * a.ms0 + h * a.ms1 + i * a.ms2 + j * a.ms3;
        if (a.mask_f32) s += ((const float *)a.mask)[o];
        else if (!((const uint8_t *)a.mask)[o]) s = -INFINITY;
    }
    return s;
}

/* keep/(1-p) for element idx of the dropout stream (backend.h's contract; the CPU's drop_factor). */
CU_D float att_drop(const att_k &a, uint64_t idx) {
    uint32_t w[4];
    cu_philox(a.seed, a.offset + idx / 4, w);
    return (float)(w[idx % 4] >> 8) * CU_TWO_M24 >= a.p ? a.keep_scale : 0.0f;
}

/* Row r of a chunk that starts at head bh0: its head, batch, query and dropout-stream element of key 0. */
struct att_row {
    int64_t bh, b, h, i, q;   /* q: the row's index over every head, (bh Tq + i) */
    uint64_t e0;
};
CU_D att_row att_row_of(const att_k &a, int64_t bh0, int64_t r) {
    att_row w;
    w.bh = bh0 + r / a.tq;
    w.i = r % a.tq;
    w.b = w.bh / a.heads;
    w.h = w.bh % a.heads;
    w.q = w.bh * a.tq + w.i;
    int64_t sbh = a.sheads > 0 ? w.b * a.sheads + a.shead0 + w.h : w.bh;   /* ca_attention_stream_bh */
    w.e0 = ((uint64_t)sbh * (uint64_t)a.tq + (uint64_t)w.i) * (uint64_t)a.tk;
    return w;
}

/* Forward: one block per row of s [rows, Tk] (the scores): the masked softmax in place, times the
 * dropout factors (P D, what O = P D V needs), and the row's log-sum-exp. The row stays in global
 * memory (three passes over it), so any Tk runs. A row with every key excluded: zeros, lse -inf. */
__global__ void att_softmax_k(att_k a, int64_t bh0, int64_t rows, float *s, float *lse) {
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        att_row w = att_row_of(a, bh0, r);
        float *row = s + r * a.tk;
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) {
            float x = att_mask(a, w.b, w.h, w.i, j, row[j]);
            row[j] = x;
            m = CuMax()(m, x);
        }
        m = cu_block_reduce(m, CuMax(), red);
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) {   /* the same thread's j: no barrier */
            float e = m == -INFINITY ? 0.0f : expf(row[j] - m);
            row[j] = e;
            sum += e;
        }
        sum = cu_block_reduce(sum, CuSum(), red);
        float inv = m == -INFINITY ? 0.0f : 1.0f / sum;
        for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) {
            float pr = row[j] * inv;
            row[j] = a.p > 0.0f ? pr * att_drop(a, w.e0 + (uint64_t)j) : pr;
        }
        if (threadIdx.x == 0) lse[w.q] = m == -INFINITY ? -INFINITY : m + logf(sum);
    }
}

/* Backward: the probabilities again from the saved lse, in place of the scores in s (excluded keys
 * and rows with lse -inf: 0), and P D in pd when there is dropout (pd NULL otherwise). */
__global__ void att_probs_k(att_k a, int64_t bh0, int64_t rows, const float *lse, float *s, float *pd) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        att_row w = att_row_of(a, bh0, r);
        float *row = s + r * a.tk, l = lse[w.q];
        for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) {
            float pr = l == -INFINITY ? 0.0f : expf(att_mask(a, w.b, w.h, w.i, j, row[j]) - l);
            row[j] = pr;
            if (pd) pd[r * a.tk + j] = pr * att_drop(a, w.e0 + (uint64_t)j);
        }
    }
}

/* Backward: the score gradient dS = P (dPd D - delta) in place of P in s, with dPd = dO V^T in dp and
 * delta = dO_i . O_i (softmax's correction, computed as the CPU does). */
__global__ void att_dscore_k(att_k a, int64_t bh0, int64_t rows, const float *out, const float *dout,
                             const float *dp, float *s) {
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        att_row w = att_row_of(a, bh0, r);
        const float *oi = out + w.q * a.dv, *gi = dout + w.q * a.dv;
        float delta = 0.0f;
        for (int64_t e = threadIdx.x; e < a.dv; e += blockDim.x) delta += gi[e] * oi[e];
        delta = cu_block_reduce(delta, CuSum(), red);
        float *row = s + r * a.tk;
        const float *g = dp + r * a.tk;
        for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) {
            float gj = a.p > 0.0f ? g[j] * att_drop(a, w.e0 + (uint64_t)j) : g[j];
            row[j] = row[j] * (gj - delta);
        }
    }
}

__global__ void att_fill_k(float *x, int64_t n, float v) {
    CU_GRID_LOOP(i, n) x[i] = v;
}

/* C[c] = alpha op(A[c]) op(B[c]) for c < batch, row-major f32 with f32 accumulation (no TF32: the
 * CPU's precision); op(A) is [m, k] (A stored [k, m] when ta), op(B) [k, n] (B stored [n, k] when tb),
 * C [m, n] contiguous, heads sa, sb and m n floats apart. cuBLAS is column-major: it computes
 * C^T = op(B)^T op(A)^T, so B goes first (as cu_gemm). k == 0 gives zeros. */
static ca_status att_gemm(cuda_device *d, const char *kname, const char *what, bool ta, bool tb, int64_t m,
                          int64_t n, int64_t k, float alpha, const float *A, int64_t sa, const float *B, int64_t sb,
                          float *C, int64_t batch) {
    if (m == 0 || n == 0 || batch == 0) return CA_OK;
    if (k == 0) {
        CA_CUDA_TRY(cudaMemsetAsync(C, 0, (size_t)(batch * m * n) * sizeof(float), d->stream),
                    "cuda kernel %s (%s, k 0)", kname, what);
        return CA_OK;
    }
    float beta = 0.0f;
    cublasStatus_t bs = cu_blas.gemm_strided_batched_ex(
        (cublasHandle_t)d->cublas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m,
        (int)k, &alpha, B, CUDA_R_32F, (int)(tb ? k : n), (long long)sb, A, CUDA_R_32F, (int)(ta ? m : k),
        (long long)sa, &beta, C, CUDA_R_32F, (int)n, (long long)(m * n), (int)batch, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (bs != CUBLAS_STATUS_SUCCESS)
        return ca_error(bs == CUBLAS_STATUS_ALLOC_FAILED ? CA_ERR_NOMEM : CA_ERR_BACKEND,
                        "cuda kernel %s: cublasGemmStridedBatchedEx for %s (m %lld, n %lld, k %lld, batch %lld): "
                        "%s (%s)", kname, what, (long long)m, (long long)n, (long long)k, (long long)batch,
                        cu_blas.status_name(bs), cu_blas.status_string(bs));
    return cu_after_launch(d, what);
}

/* The scratch budget: CACCEL_CUDA_ATT_SCRATCH (bytes; tests set it small to run several chunks on
 * small shapes) or CU_ATT_SCRATCH_DEFAULT. */
static ca_status att_budget(const char *k, size_t *out) {
    const char *e = getenv("CACCEL_CUDA_ATT_SCRATCH");
    *out = CU_ATT_SCRATCH_DEFAULT;
    if (!e || !*e) return CA_OK;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(e, &end, 10);
    if (errno || *end || v == 0 || e[0] == '-' || v > SIZE_MAX)
        return ca_error(CA_ERR_INVALID, "cuda kernel %s: CACCEL_CUDA_ATT_SCRATCH=%s is not a positive number of "
                        "bytes", k, e);
    *out = (size_t)v;
    return CA_OK;
}

/* The dtype (f32, the CPU's limit too), the mask's dtype, sizes within cuBLAS's 32-bit integers, and
 * the chunk plan of `buffers` [g Tq, Tk] f32 buffers per kv head (cu_att_plan_groups). */
static ca_status att_check(const char *k, ca_dtype dt, const ca_attention_params *a, int64_t kv_heads, int buffers,
                           cu_att_plan *plan) {
    if (dt != CA_F32) return cu_bad_dtype(k, "tensor", dt);
    if (a->mask && a->mask_dtype != CA_F32 && a->mask_dtype != CA_U8) return cu_bad_dtype(k, "mask", a->mask_dtype);
    if (a->tq > INT_MAX || a->tk > INT_MAX || a->d > INT_MAX || a->dv > INT_MAX)
        return ca_error(CA_ERR_UNSUPPORTED, "cuda kernel %s: Tq %lld, Tk %lld, D %lld or Dv %lld exceeds cuBLAS's "
                        "32-bit sizes", k, (long long)a->tq, (long long)a->tk, (long long)a->d, (long long)a->dv);
    if (a->batch * a->heads == 0 || a->tq == 0 || a->tk == 0) {
        plan->heads = plan->chunks = 0;
        plan->bytes = 0;
        return CA_OK;
    }
    size_t budget;
    ca_status st = att_budget(k, &budget);
    if (st != CA_OK) return st;
    int64_t g = ca_attention_group(a->heads, kv_heads);
    if (!cu_att_plan_groups(a->batch, a->heads, kv_heads, a->tq, a->tk, buffers, budget, plan))
        return ca_error(CA_ERR_NOMEM, "cuda kernel %s: %d score buffers of %lld x %lld floats (%lld query heads "
                        "per kv head) exceed the address space or cuBLAS's 32-bit sizes", k, buffers,
                        (long long)(g * a->tq), (long long)a->tk, (long long)g);
    return CA_OK;
}

/* The launch of a row kernel over `rows` rows, checked under its own name. */
#define ATT_ROWS(d, name, kern, rows, ...) \
    (kern<<<cu_row_grid(rows), ATT_THREADS, 0, (d)->stream>>>(__VA_ARGS__), cu_after_launch((d), (name)))

/* Forward of kv heads [kv0, kv0 + hc), each with its g query heads as g Tq rows (mq) of one GEMM:
 * S = scale Q K^T, P D = dropout(softmax(S + mask)), O = P D V. */
static ca_status att_fwd_chunk(cuda_device *d, const ca_attention_params *a, const att_k &ak, int64_t g, int64_t kv0,
                               int64_t hc, const float *q, const float *k, const float *v, float *out, float *lse, float *s) {
    int64_t mq = g * a->tq, tk = a->tk, dd = a->d, dv = a->dv, rows = hc * mq;
    const char *kn = "attention";
    ca_status st = att_gemm(d, kn, "attention (S = scale Q K^T)", false, true, mq, tk, dd, a->scale, q + kv0 * mq * dd,
                            mq * dd, k + kv0 * tk * dd, tk * dd, s, hc);
    if (st == CA_OK)
        st = ATT_ROWS(d, "attention (softmax)", att_softmax_k, rows, ak, kv0 * g, rows, s, lse);
    if (st == CA_OK)
        st = att_gemm(d, kn, "attention (O = P V)", false, false, mq, dv, tk, 1.0f, s, mq * tk, v + kv0 * tk * dv,
                      tk * dv, out + kv0 * mq * dv, hc);
    return st;
}

extern "C" ca_status cu_attention(void *dev, const ca_attention_args *args) {
    const ca_attention_params *a = &args->p;
    cuda_device *d = (cuda_device *)dev;
    cu_att_plan plan;
    ca_status st = att_check("attention", args->dt, a, args->kv_heads, 1, &plan);
    if (st == CA_OK) st = cu_enter(d, "kernel attention");
    if (st != CA_OK) return st;
    int64_t nq = a->batch * a->heads * a->tq;
    if (nq == 0) return CA_OK;
    if (a->tk == 0 || a->dv == 0) {   /* as the CPU: zeros, and lse -inf */
        CA_CUDA_TRY(cudaMemsetAsync(args->out, 0, (size_t)(nq * a->dv) * sizeof(float), d->stream),
                    "cuda kernel attention (zeroing out)");
        att_fill_k<<<cu_grid(d, nq, CU_THREADS), CU_THREADS, 0, d->stream>>>(args->lse, nq, -INFINITY);
        return CU_LAUNCHED(d, "attention (lse -inf)");
    }
    void *tmp = NULL;
    if ((st = cu_tmp_alloc(d, plan.bytes, &tmp)) != CA_OK)
        return ca_error_context("cuda kernel attention: scores of %lld heads x %lld x %lld", (long long)plan.heads,
                                (long long)a->tq, (long long)a->tk);
    int64_t g = ca_attention_group(a->heads, args->kv_heads), nkv = a->batch * a->heads / g;
    att_k ak = att_pack(a, args->stream_heads, args->stream_head0);
    for (int64_t kv0 = 0; kv0 < nkv && st == CA_OK; kv0 += plan.heads)
        st = att_fwd_chunk(d, a, ak, g, kv0, nkv - kv0 < plan.heads ? nkv - kv0 : plan.heads, (const float *)args->q,
                           (const float *)args->k, (const float *)args->v, (float *)args->out, args->lse,
                           (float *)tmp);
    cu_tmp_free(d, tmp);
    return st;
}

/* The backward's tensors (all f32). */
struct att_bwd_io {
    const float *q, *k, *v, *out, *dout, *lse;
    float *dq, *dk, *dv;
};

/* Backward of kv heads [kv0, kv0 + hc) (their g query heads as gq = g Tq rows), with s and w two
 * [hc, g Tq, Tk] buffers (as the CPU's):
 *   S = scale Q K^T; P (in s) from lse, Pd = P D (in w, with dropout); dV = Pd^T dO;
 *   dPd = dO V^T (in w); dS = P (dPd D - rowsum(dO O)) (in s); dQ = scale dS K; dK = scale dS^T Q.
 * dV and dK contract over the g Tq rows, which sums a kv head's query heads inside the GEMM. Every output
 * is written once per head (beta 0): no atomics, no accumulation across chunks. */
static ca_status att_bwd_chunk(cuda_device *d, const ca_attention_params *a, const att_k &ak, int64_t gq, int64_t kv0,
                               int64_t hc, const att_bwd_io *t, float *s, float *w) {
    int64_t tq = gq, tk = a->tk, dd = a->d, dv = a->dv, rows = hc * tq, ss = tq * tk, bh0 = kv0 * (gq / a->tq);
    const float *q = t->q + kv0 * tq * dd, *k = t->k + kv0 * tk * dd, *v = t->v + kv0 * tk * dv;
    const float *g = t->dout + kv0 * tq * dv;
    const char *kn = "attention_backward";
    bool drop = a->dropout_p > 0.0f;
    ca_status st = att_gemm(d, kn, "attention_backward (S = scale Q K^T)", false, true, tq, tk, dd, a->scale, q,
                            tq * dd, k, tk * dd, s, hc);
    if (st == CA_OK)
        st = ATT_ROWS(d, "attention_backward (probabilities)", att_probs_k, rows, ak, bh0, rows, t->lse, s,
                      drop ? w : (float *)NULL);
    if (st == CA_OK)
        st = att_gemm(d, kn, "attention_backward (dV = P^T dO)", true, false, tk, dv, tq, 1.0f, drop ? w : s, ss, g,
                      tq * dv, t->dv + kv0 * tk * dv, hc);
    if (st == CA_OK)
        st = att_gemm(d, kn, "attention_backward (dP = dO V^T)", false, true, tq, tk, dv, 1.0f, g, tq * dv, v,
                      tk * dv, w, hc);
    if (st == CA_OK)
        st = ATT_ROWS(d, "attention_backward (dS)", att_dscore_k, rows, ak, bh0, rows, t->out, t->dout, w, s);
    if (st == CA_OK)
        st = att_gemm(d, kn, "attention_backward (dQ = scale dS K)", false, false, tq, dd, tk, a->scale, s, ss, k,
                      tk * dd, t->dq + kv0 * tq * dd, hc);
    if (st == CA_OK)
        st = att_gemm(d, kn, "attention_backward (dK = scale dS^T Q)", true, false, tk, dd, tq, a->scale, s, ss, q,
                      tq * dd, t->dk + kv0 * tk * dd, hc);
    return st;
}

extern "C" ca_status cu_attention_backward(void *dev, const ca_attention_backward_args *args) {
    const ca_attention_params *a = &args->p;
    cuda_device *d = (cuda_device *)dev;
    cu_att_plan plan;
    ca_status st = att_check("attention_backward", args->dt, a, args->kv_heads, 2, &plan);
    if (st == CA_OK) st = cu_enter(d, "kernel attention_backward");
    if (st != CA_OK) return st;
    int64_t nbh = a->batch * a->heads, g = ca_attention_group(a->heads, args->kv_heads), nkv = nbh / g;
    if (nbh == 0) return CA_OK;
    if (a->tq == 0 || a->tk == 0) {   /* no scores: the gradients are zeros (as the CPU) */
        CA_CUDA_TRY(cudaMemsetAsync(args->dq, 0, (size_t)(nbh * a->tq * a->d) * sizeof(float), d->stream),
                    "cuda kernel attention_backward (zeroing dq)");
        CA_CUDA_TRY(cudaMemsetAsync(args->dk, 0, (size_t)(nkv * a->tk * a->d) * sizeof(float), d->stream),
                    "cuda kernel attention_backward (zeroing dk)");
        CA_CUDA_TRY(cudaMemsetAsync(args->dv, 0, (size_t)(nkv * a->tk * a->dv) * sizeof(float), d->stream),
                    "cuda kernel attention_backward (zeroing dv)");
        return CA_OK;
    }
    att_bwd_io t = {(const float *)args->q, (const float *)args->k, (const float *)args->v,
                    (const float *)args->out, (const float *)args->dout, args->lse, (float *)args->dq,
                    (float *)args->dk, (float *)args->dv};
    void *tmp = NULL;
    if ((st = cu_tmp_alloc(d, plan.bytes, &tmp)) != CA_OK)
        return ca_error_context("cuda kernel attention_backward: 2 score buffers of %lld heads x %lld x %lld",
                                (long long)plan.heads, (long long)a->tq, (long long)a->tk);
    float *s = (float *)tmp, *w = s + plan.heads * g * a->tq * a->tk;
    att_k ak = att_pack(a, args->stream_heads, args->stream_head0);
    for (int64_t kv0 = 0; kv0 < nkv && st == CA_OK; kv0 += plan.heads)
        st = att_bwd_chunk(d, a, ak, g * a->tq, kv0, nkv - kv0 < plan.heads ? nkv - kv0 : plan.heads, &t, s, w);
    cu_tmp_free(d, tmp);
    return st;
}

/* ---------------------------------------------------------------- where */

struct where_k_args {
    int nd;
    int64_t shape[CA_MAX_DIMS], cs[CA_MAX_DIMS], as[CA_MAX_DIMS], bs[CA_MAX_DIMS];
};

/* A selection: elements are copied as words of their size, whatever the dtype. */
template <typename E>
__global__ void where_k(where_k_args w, int64_t n, const uint8_t *cond, const E *a, const E *b, E *y) {
    CU_GRID_LOOP(i, n) {
        int64_t rem = i, oc = 0, oa = 0, ob = 0;
        for (int dd = w.nd - 1; dd >= 0; dd--) {
            int64_t x = rem % w.shape[dd];
            rem /= w.shape[dd];
            oc += x * w.cs[dd]; oa += x * w.as[dd]; ob += x * w.bs[dd];
        }
        y[i] = cond[oc] ? a[oa] : b[ob];
    }
}

extern "C" ca_status cu_where(void *dev, const ca_where_args *args) {
    ca_dtype dt = args->dt;
    const ca_bcast_args *s = &args->shape;
    const int64_t *cs = args->cond_stride;
    const uint8_t *cond = args->cond;
    const void *a = args->a;
    const void *b = args->b;
    void *y = args->y;
    cuda_device *d = (cuda_device *)dev;
    size_t es = ca_dtype_size(dt);
    where_k_args w;
    w.nd = s->ndim;
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) {
        w.shape[i] = s->shape[i]; w.cs[i] = cs[i]; w.as[i] = s->a_stride[i]; w.bs[i] = s->b_stride[i];
        n *= s->shape[i];
    }
    if (n <= 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel where");
    if (st != CA_OK) return st;
    unsigned g = cu_grid(d, n, CU_THREADS);
    switch (es) {
    case 1: where_k<uint8_t><<<g, CU_THREADS, 0, d->stream>>>(w, n, cond, (const uint8_t *)a, (const uint8_t *)b,
                                                              (uint8_t *)y); break;
    case 2: where_k<uint16_t><<<g, CU_THREADS, 0, d->stream>>>(w, n, cond, (const uint16_t *)a, (const uint16_t *)b,
                                                               (uint16_t *)y); break;
    case 4: where_k<uint32_t><<<g, CU_THREADS, 0, d->stream>>>(w, n, cond, (const uint32_t *)a, (const uint32_t *)b,
                                                               (uint32_t *)y); break;
    default: where_k<uint64_t><<<g, CU_THREADS, 0, d->stream>>>(w, n, cond, (const uint64_t *)a, (const uint64_t *)b,
                                                                (uint64_t *)y); break;
    }
    return CU_LAUNCHED(d, "where");
}

/* ---------------------------------------------------------------- gather */

template <typename E>
__global__ void gather_k(int64_t outer, int64_t len, int64_t inner, int64_t n, const E *x, bool i64, const void *idx,
                         E *y, cu_err_ref err) {
    CU_GRID_LOOP(p, outer * n * inner) {
        int64_t i = p % inner, o = p / (n * inner), v = cu_index_at(i64, idx, p);
        if (v < 0 || v >= len) {    /* reported, and never read outside x */
            cu_report(err, CU_ERR_GATHER_INDEX, 0, p, v, len, 0);
            y[p] = E();
        } else {
            y[p] = x[(o * len + v) * inner + i];
        }
    }
}

__global__ void gather_bwd_k(int64_t outer, int64_t len, int64_t inner, int64_t n, bool i64, const void *idx,
                             const float *dy, float *dx, cu_err_ref err) {
    CU_GRID_LOOP(p, outer * n * inner) {
        int64_t i = p % inner, o = p / (n * inner), v = cu_index_at(i64, idx, p);
        if (v < 0 || v >= len) cu_report(err, CU_ERR_GATHER_INDEX, 1, p, v, len, 0);
        else atomicAdd(&dx[(o * len + v) * inner + i], dy[p]);
    }
}

/* Deterministic mode: one thread per element (o, v, i) of dx adds, in position order j, every dy[o, j, i]
 * whose index is v, as the CPU does (so the result is the CPU's, bit for bit). It reads the whole index
 * column for each of the len rows: len x n work per column, against n for the atomics. */
__global__ void gather_bwd_ordered_k(int64_t outer, int64_t len, int64_t inner, int64_t n, bool i64, const void *idx,
                                     const float *dy, float *dx, cu_err_ref err) {
    CU_GRID_LOOP(t, outer * len * inner) {
        int64_t i = t % inner, v = t / inner % len, o = t / (inner * len);
        float acc = dx[t];
        for (int64_t j = 0; j < n; j++) {
            int64_t p = (o * n + j) * inner + i, x = cu_index_at(i64, idx, p);
            if (x == v) acc += dy[p];
            else if (v == 0 && (x < 0 || x >= len)) cu_report(err, CU_ERR_GATHER_INDEX, 1, p, x, len, 0);
        }
        dx[t] = acc;
    }
}

static ca_status gather_check(const char *k, ca_dtype idx_dt, int64_t outer, int64_t len, int64_t inner, int64_t n,
                              const void *idx) {
    return CA_OK;
}

extern "C" ca_status cu_gather(void *dev, const ca_gather_args *args) {
    ca_dtype dt = args->dt;
    int64_t outer = args->outer;
    int64_t len = args->len;
    int64_t inner = args->inner;
    int64_t n = args->n;
    const void *x = args->x;
    ca_dtype idx_dt = args->idx_dt;
    const void *idx = args->idx;
    void *y = args->y;
    cuda_device *d = (cuda_device *)dev;
    size_t es = ca_dtype_size(dt);
    ca_status st = gather_check("gather", idx_dt, outer, len, inner, n, idx);
    int64_t total = outer * n * inner;
    if (st != CA_OK || total == 0) return st;
    if ((st = cu_enter(d, "kernel gather")) != CA_OK) return st;
    unsigned g = cu_grid(d, total, CU_THREADS);
    bool i64 = idx_dt == CA_I64;
    cu_err_ref e = cu_err_of(d);
    switch (es) {
    case 1: gather_k<uint8_t><<<g, CU_THREADS, 0, d->stream>>>(outer, len, inner, n, (const uint8_t *)x, i64, idx,
                                                               (uint8_t *)y, e); break;
    case 2: gather_k<uint16_t><<<g, CU_THREADS, 0, d->stream>>>(outer, len, inner, n, (const uint16_t *)x, i64, idx,
                                                                (uint16_t *)y, e); break;
    case 4: gather_k<uint32_t><<<g, CU_THREADS, 0, d->stream>>>(outer, len, inner, n, (const uint32_t *)x, i64, idx,
                                                                (uint32_t *)y, e); break;
    default: gather_k<uint64_t><<<g, CU_THREADS, 0, d->stream>>>(outer, len, inner, n, (const uint64_t *)x, i64, idx,
                                                                 (uint64_t *)y, e); break;
    }
    return CU_LAUNCHED(d, "gather");
}

extern "C" ca_status cu_gather_backward(void *dev, const ca_gather_backward_args *args) {
    ca_dtype dt = args->dt;
    int64_t outer = args->outer;
    int64_t len = args->len;
    int64_t inner = args->inner;
    int64_t n = args->n;
    ca_dtype idx_dt = args->idx_dt;
    const void *idx = args->idx;
    const void *dy = args->dy;
    void *dx = args->dx;
    cuda_device *d = (cuda_device *)dev;
    if (dt != CA_F32) return cu_bad_dtype("gather_backward", "tensor", dt);
    ca_status st = gather_check("gather_backward", idx_dt, outer, len, inner, n, idx);
    int64_t total = outer * n * inner;
    if (st != CA_OK || total == 0) return st;
    if ((st = cu_enter(d, "kernel gather_backward")) != CA_OK) return st;
    if (d->deterministic && len > 0) {   /* (len 0: every index is reported, nothing is added) */
        gather_bwd_ordered_k<<<cu_grid(d, outer * len * inner, CU_THREADS), CU_THREADS, 0, d->stream>>>(outer, len,
            inner, n, idx_dt == CA_I64, idx, (const float *)dy, (float *)dx, cu_err_of(d));
        return CU_LAUNCHED(d, "gather_backward (ordered)");
    }
    gather_bwd_k<<<cu_grid(d, total, CU_THREADS), CU_THREADS, 0, d->stream>>>(outer, len, inner, n,
        idx_dt == CA_I64, idx, (const float *)dy, (float *)dx, cu_err_of(d));
    return CU_LAUNCHED(d, "gather_backward");
}
