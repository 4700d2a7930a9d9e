/* CUDA scaled dot-product attention (one block per query row, the row's scores in shared memory; backward recomputes them, dK/dV by atomics), where and gather. */
#include "backends/cuda/cuda_common.cuh"

/* Threads per query row. */
#define ATT_THREADS 128

/* The kernels' arguments, passed by value (mask is a device pointer). */
struct att_k {
    int64_t heads, tq, tk, d, dv;
    float scale, p;
    bool causal;
    uint64_t seed, offset;
    const void *mask;
    bool mask_f32;
    int64_t ms0, ms1, ms2, ms3;
};

static att_k att_pack(const ca_attention_params *a) {
    att_k k;
    k.heads = a->heads; k.tq = a->tq; k.tk = a->tk; k.d = a->d; k.dv = a->dv;
    k.scale = a->scale; k.p = a->dropout_p; k.causal = a->causal;
    k.seed = a->seed; k.offset = a->offset;
    k.mask = a->mask; k.mask_f32 = a->mask_dtype == CA_F32;
    k.ms0 = a->mask_stride[0]; k.ms1 = a->mask_stride[1]; k.ms2 = a->mask_stride[2]; k.ms3 = a->mask_stride[3];
    return k;
}

/* The masked score of key j for row (b, h, i), -inf when excluded (the CPU's mask_row). */
CU_D float att_score(const att_k &a, int64_t b, int64_t h, int64_t i, int64_t j, const float *q, const float *k) {
    if (a.causal && j > i) return -INFINITY;
    float s = 0.0f;
    for (int64_t e = 0; e < a.d; e++) s += q[e] * k[j * a.d + e];
    s *= a.scale;
    if (a.mask) {
        int64_t o = b * a.ms0 + h * a.ms1 + i * a.ms2 + j * a.ms3;
        if (a.mask_f32) s += ((const float *)a.mask)[o];
        else if (!((const uint8_t *)a.mask)[o]) s = -INFINITY;
    }
    return s;
}

/* keep/(1-p) for dropout element idx (backend.h's contract). */
CU_D float att_drop(const att_k &a, uint64_t idx) {
    if (a.p <= 0.0f) return 1.0f;
    uint32_t w[4];
    cu_philox(a.seed, a.offset + idx / 4, w);
    float u = (float)(w[idx % 4] >> 8) * CU_TWO_M24;
    return u >= a.p ? 1.0f / (1.0f - a.p) : 0.0f;
}

/* One block per row r = (b H + h) Tq + i; s (dynamic shared) holds the row's Tk scores. */
__global__ void att_fwd_k(att_k a, int64_t rows, const float *q, const float *k, const float *v, float *out,
                          float *lse) {
    extern __shared__ float s[];
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t bh = r / a.tq, i = r % a.tq, b = bh / a.heads, h = bh % a.heads;
        const float *qi = q + r * a.d, *kb = k + bh * a.tk * a.d, *vb = v + bh * a.tk * a.dv;
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) {
            s[j] = att_score(a, b, h, i, j, qi, kb);
            m = CuMax()(m, s[j]);
        }
        m = cu_block_reduce(m, CuMax(), red);
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) {
            s[j] = m == -INFINITY ? 0.0f : expf(s[j] - m);
            sum += s[j];
        }
        sum = cu_block_reduce(sum, CuSum(), red);
        float l = m == -INFINITY ? -INFINITY : m + logf(sum), inv = m == -INFINITY ? 0.0f : 1.0f / sum;
        for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) s[j] *= inv * att_drop(a, (uint64_t)(r * a.tk + j));
        __syncthreads();
        for (int64_t e = threadIdx.x; e < a.dv; e += blockDim.x) {
            float acc = 0.0f;
            for (int64_t j = 0; j < a.tk; j++) acc += s[j] * vb[j * a.dv + e];
            out[r * a.dv + e] = acc;
        }
        if (threadIdx.x == 0) lse[r] = l;
        __syncthreads();
    }
}

/* dS_j = P_j (D_j dO.v_j - dO.O), dQ = scale dS K; dK += scale dS q, dV += P_j D_j dO (atomics). */
__global__ void att_bwd_k(att_k a, int64_t rows, const float *q, const float *k, const float *v, const float *out,
                          const float *dout, const float *lse, float *dq, float *dk, float *dv) {
    extern __shared__ float s[];
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t bh = r / a.tq, i = r % a.tq, b = bh / a.heads, h = bh % a.heads;
        const float *qi = q + r * a.d, *kb = k + bh * a.tk * a.d, *vb = v + bh * a.tk * a.dv;
        const float *gi = dout + r * a.dv, *oi = out + r * a.dv;
        float *dkb = dk + bh * a.tk * a.d, *dvb = dv + bh * a.tk * a.dv;
        float delta = 0.0f;
        for (int64_t e = threadIdx.x; e < a.dv; e += blockDim.x) delta += gi[e] * oi[e];
        delta = cu_block_reduce(delta, CuSum(), red);
        float l = lse[r];
        for (int64_t j = threadIdx.x; j < a.tk; j += blockDim.x) {
            float sc = att_score(a, b, h, i, j, qi, kb);
            float p = l == -INFINITY ? 0.0f : expf(sc - l), dr = att_drop(a, (uint64_t)(r * a.tk + j));
            float dp = 0.0f;
            for (int64_t e = 0; e < a.dv; e++) dp += gi[e] * vb[j * a.dv + e];
            s[j] = p * (dp * dr - delta);
            if (p * dr != 0.0f)
                for (int64_t e = 0; e < a.dv; e++) atomicAdd(&dvb[j * a.dv + e], p * dr * gi[e]);
            if (s[j] != 0.0f)
                for (int64_t e = 0; e < a.d; e++) atomicAdd(&dkb[j * a.d + e], a.scale * s[j] * qi[e]);
        }
        __syncthreads();
        for (int64_t e = threadIdx.x; e < a.d; e += blockDim.x) {
            float acc = 0.0f;
            for (int64_t j = 0; j < a.tk; j++) acc += s[j] * kb[j * a.d + e];
            dq[r * a.d + e] = a.scale * acc;
        }
        __syncthreads();
    }
}

static ca_status att_check(const char *k, ca_dtype dt, const ca_attention_params *a, const void *q,
                           const void *kk, const void *v) {
    if (dt != CA_F32) return cu_bad_dtype(k, "tensor", dt);
    if (a->mask && a->mask_dtype != CA_F32 && a->mask_dtype != CA_U8) return cu_bad_dtype(k, "mask", a->mask_dtype);
    if ((size_t)a->tk * sizeof(float) > 48 * 1024)
        return ca_error(CA_ERR_UNSUPPORTED, "cuda kernel %s: %lld keys; this kernel keeps a row of scores in "
                        "shared memory and takes at most %d", k, (long long)a->tk, 48 * 1024 / 4);
    return CA_OK;
}

extern "C" ca_status cu_attention(void *dev, const ca_attention_args *args) {
    ca_dtype dt = args->dt;
    const ca_attention_params *a = &args->p;
    const void *q = args->q;
    const void *k = args->k;
    const void *v = args->v;
    void *out = args->out;
    float *lse = args->lse;
    cuda_device *d = (cuda_device *)dev;
    ca_status st = att_check("attention", dt, a, q, k, v);
    if (st == CA_OK) st = cu_enter(d, "kernel attention");
    if (st != CA_OK) return st;
    int64_t rows = a->batch * a->heads * a->tq;
    if (rows == 0) return CA_OK;
    size_t shm = (size_t)(a->tk ? a->tk : 1) * sizeof(float);
    att_fwd_k<<<cu_row_grid(rows), ATT_THREADS, shm, d->stream>>>(att_pack(a), rows, (const float *)q,
                                                                  (const float *)k, (const float *)v, (float *)out, lse);
    return CU_LAUNCHED(d, "attention");
}

extern "C" ca_status cu_attention_backward(void *dev, const ca_attention_backward_args *args) {
    ca_dtype dt = args->dt;
    const ca_attention_params *a = &args->p;
    const void *q = args->q;
    const void *k = args->k;
    const void *v = args->v;
    const void *out = args->out;
    const void *dout = args->dout;
    const float *lse = args->lse;
    void *dq = args->dq;
    void *dk = args->dk;
    void *dv = args->dv;
    cuda_device *d = (cuda_device *)dev;
    ca_status st = att_check("attention_backward", dt, a, q, k, v);
    if (st == CA_OK) st = cu_enter(d, "kernel attention_backward");
    if (st != CA_OK) return st;
    int64_t nbh = a->batch * a->heads, rows = nbh * a->tq;
    if (nbh == 0) return CA_OK;
    CA_CUDA_TRY(cudaMemsetAsync(dq, 0, (size_t)(rows * a->d) * sizeof(float), d->stream),
                "cuda kernel attention_backward (zeroing dq)");
    CA_CUDA_TRY(cudaMemsetAsync(dk, 0, (size_t)(nbh * a->tk * a->d) * sizeof(float), d->stream),
                "cuda kernel attention_backward (zeroing dk)");
    CA_CUDA_TRY(cudaMemsetAsync(dv, 0, (size_t)(nbh * a->tk * a->dv) * sizeof(float), d->stream),
                "cuda kernel attention_backward (zeroing dv)");
    if (rows == 0 || a->tk == 0) return CA_OK;
    size_t shm = (size_t)a->tk * sizeof(float);
    att_bwd_k<<<cu_row_grid(rows), ATT_THREADS, shm, d->stream>>>(att_pack(a), rows, (const float *)q,
        (const float *)k, (const float *)v, (const float *)out, (const float *)dout, lse, (float *)dq, (float *)dk,
        (float *)dv);
    return CU_LAUNCHED(d, "attention_backward");
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
    gather_bwd_k<<<cu_grid(d, total, CU_THREADS), CU_THREADS, 0, d->stream>>>(outer, len, inner, n,
        idx_dt == CA_I64, idx, (const float *)dy, (float *)dx, cu_err_of(d));
    return CU_LAUNCHED(d, "gather_backward");
}
