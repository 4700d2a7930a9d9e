/* CUDA nn kernels: cross-entropy (+ backward, labels checked on the GPU), layer norm (+ backward), embedding (+ backward: a stable sort of the indices, f32 sums in index order). */
#include "backends/cuda/cuda_common.cuh"

/* without NVTX: CUB's ranges would put NVTX's globals into the plugin (tools/check-symbols.sh) */
#define CCCL_DISABLE_NVTX
#include <cub/device/device_radix_sort.cuh>

/* --------------------------------------------------------- cross-entropy */

/* Per row: lse = max + log(sum exp(x - max)), and the row's loss term
 * (lse - x[label], in f64 as the CPU adds it) with valid = 1, or valid = 0
 * for an ignored row. A label out of range is reported and makes the loss NaN. */
template <typename T>
__global__ void ce_rows_k(int64_t rows, int64_t cols, const typename T::S *x, bool i64, const void *labels,
                          int64_t ignore, float *lse, double *terms, int *valid, cu_err_ref err) {
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const typename T::S *row = x + r * cols;
        float m = -INFINITY;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = CuMax()(m, T::ld(row, c));
        m = cu_block_reduce(m, CuMax(), shf);
        if (m == -INFINITY) m = 0.0f;
        float s = 0.0f;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += expf(T::ld(row, c) - m);
        s = cu_block_reduce(s, CuSum(), shf);
        if (threadIdx.x == 0) {
            float l = m + logf(s);
            lse[r] = l;
            int64_t label = cu_index_at(i64, labels, r);
            if (label == ignore) {
                terms[r] = 0.0;
                valid[r] = 0;
            } else if (label < 0 || label >= cols) {
                cu_report(err, CU_ERR_CE_LABEL, 0, r, label, cols, ignore);
                terms[r] = NAN;
                valid[r] = 1;
            } else {
                terms[r] = (double)l - (double)T::ld(row, label);
                valid[r] = 1;
            }
        }
    }
}

/* One block: loss = mean of the valid terms (NaN when none, as torch), count. */
__global__ void ce_total_k(int64_t rows, const double *terms, const int *valid, float *loss, float *count) {
    __shared__ double shd[32];
    __shared__ long long shl[32];
    double t = 0.0;
    long long n = 0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
        if (valid[r]) {
            t += terms[r];
            n++;
        }
    }
    t = cu_block_reduce(t, CuSum(), shd);
    n = cu_block_reduce(n, CuSum(), shl);
    if (threadIdx.x == 0) {
        *count = (float)n;
        *loss = n ? (float)(t / (double)n) : NAN;
    }
}

static ca_status check_ce(const char *k, ca_dtype dt, int64_t rows, int64_t cols, ca_dtype label_dt) {
    return CA_OK;
}

extern "C" ca_status cu_cross_entropy(void *dev, const ca_cross_entropy_args *args) {
    ca_dtype dt = args->dt;
    int64_t rows = args->rows;
    int64_t cols = args->cols;
    const void *logits = args->logits;
    ca_dtype label_dt = args->label_dt;
    const void *labels = args->labels;
    int64_t ignore_index = args->ignore_index;
    float *loss = args->loss;
    float *lse = args->lse;
    float *count = args->count;
    cuda_device *d = (cuda_device *)dev;
    const char *k = "cross_entropy";
    ca_status st = check_ce(k, dt, rows, cols, label_dt);
    if (st != CA_OK) return st;
    if ((st = cu_enter(d, "kernel cross_entropy")) != CA_OK) return st;
    void *tmp = NULL;
    double *terms = NULL;
    int *valid = NULL;
    if (rows > 0) {
        if ((st = cu_tmp_alloc(d, (size_t)rows * (sizeof(double) + sizeof(int)), &tmp)) != CA_OK)
            return ca_error_context("cuda kernel cross_entropy");
        terms = (double *)tmp;
        valid = (int *)(terms + rows);
        int th = cu_row_threads(cols);
        CU_FLOAT_SWITCH(dt, T, ce_rows_k<T><<<cu_row_grid(rows), th, 0, d->stream>>>(rows, cols,
            (const T::S *)logits, label_dt == CA_I64, labels, ignore_index, lse, terms, valid, cu_err_of(d)));
    }
    ce_total_k<<<1, 1024, 0, d->stream>>>(rows, terms, valid, loss, count);
    st = CU_LAUNCHED(d, k);
    if (tmp) cu_tmp_free(d, tmp);
    return st;
}

/* dlogits = beta dlogits + dloss / count * (softmax - onehot), zero on ignored rows. */
template <typename T>
__global__ void ce_bwd_k(int64_t rows, int64_t cols, const typename T::S *x, const float *lse, bool i64,
                         const void *labels, int64_t ignore, const float *dloss, const float *count,
                         typename T::S *dx, float beta, cu_err_ref err) {
    float cnt = *count;
    float scale = cnt > 0.0f ? *dloss / cnt : 0.0f;
    CU_GRID_LOOP(i, rows * cols) {
        int64_t r = i / cols, c = i % cols;
        int64_t label = cu_index_at(i64, labels, r);
        float e = 0.0f;
        if (label != ignore) {
            e = expf(T::ld(x, i) - lse[r]);
            if (c == label) e -= 1.0f;
            if (c == 0 && (label < 0 || label >= cols)) cu_report(err, CU_ERR_CE_LABEL, 1, r, label, cols, ignore);
        }
        T::st(dx, i, beta == 0.0f ? scale * e : beta * T::ld(dx, i) + scale * e);
    }
}

extern "C" ca_status cu_cross_entropy_backward(void *dev, const ca_cross_entropy_backward_args *args) {
    ca_dtype dt = args->dt;
    int64_t rows = args->rows;
    int64_t cols = args->cols;
    const void *logits = args->logits;
    const float *lse = args->lse;
    ca_dtype label_dt = args->label_dt;
    const void *labels = args->labels;
    int64_t ignore_index = args->ignore_index;
    const float *dloss = args->dloss;
    const float *count = args->count;
    void *dlogits = args->dlogits;
    float beta = args->beta;
    cuda_device *d = (cuda_device *)dev;
    const char *k = "cross_entropy_backward";
    ca_status st = check_ce(k, dt, rows, cols, label_dt);
    if (st != CA_OK) return st;
    if (rows == 0) return CA_OK;
    if ((st = cu_enter(d, "kernel cross_entropy_backward")) != CA_OK) return st;
    unsigned g = cu_grid(d, rows * cols, CU_THREADS);
    CU_FLOAT_SWITCH(dt, T, ce_bwd_k<T><<<g, CU_THREADS, 0, d->stream>>>(rows, cols, (const T::S *)logits, lse,
        label_dt == CA_I64, labels, ignore_index, dloss, count, (T::S *)dlogits, beta, cu_err_of(d)));
    return CU_LAUNCHED(d, k);
}

/* ------------------------------------------------------- layer and rms norm */

/* Layer norm; with center false, RMSNorm (the mean taken as 0, no bias). */
template <typename T>
__global__ void ln_k(int64_t rows, int64_t cols, const typename T::S *x, const typename T::S *gamma,
                     const typename T::S *beta_, float eps, typename T::S *y, float *mean, float *rstd, bool center) {
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t off = r * cols;
        float s = 0.0f;
        if (center)
            for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += T::ld(x, off + c);
        float mu = center ? cu_block_reduce(s, CuSum(), shf) / (float)cols : 0.0f;
        float q = 0.0f;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            float dv = T::ld(x, off + c) - mu;
            q += dv * dv;
        }
        float var = cu_block_reduce(q, CuSum(), shf) / (float)cols;
        float rs = 1.0f / sqrtf(var + eps);
        if (threadIdx.x == 0) {
            if (mean) mean[r] = mu;
            if (rstd) rstd[r] = rs;
        }
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            float v = (T::ld(x, off + c) - mu) * rs;
            if (gamma) v = v * T::ld(gamma, c);
            if (beta_) v = v + T::ld(beta_, c);
            T::st(y, off + c, v);
        }
    }
}

extern "C" ca_status cu_layer_norm(void *dev, const ca_layer_norm_args *args) {
    ca_dtype dt = args->dt;
    int64_t rows = args->rows;
    int64_t cols = args->cols;
    const void *x = args->x;
    const void *gamma = args->gamma;
    const void *beta_ = args->beta_;
    float eps = args->eps;
    void *y = args->y;
    float *mean = args->mean;
    float *rstd = args->rstd;
    cuda_device *d = (cuda_device *)dev;
    const char *k = "layer_norm";
    if (rows == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel layer_norm");
    if (st != CA_OK) return st;
    int th = cu_row_threads(cols);
    CU_FLOAT_SWITCH(dt, T, ln_k<T><<<cu_row_grid(rows), th, 0, d->stream>>>(rows, cols, (const T::S *)x,
        (const T::S *)gamma, (const T::S *)beta_, eps, (T::S *)y, mean, rstd, true));
    return CU_LAUNCHED(d, k);
}

extern "C" ca_status cu_rms_norm(void *dev, const ca_rms_norm_args *a) {
    cuda_device *d = (cuda_device *)dev;
    if (a->rows == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel rms_norm");
    if (st != CA_OK) return st;
    int th = cu_row_threads(a->cols);
    CU_FLOAT_SWITCH(a->dt, T, ln_k<T><<<cu_row_grid(a->rows), th, 0, d->stream>>>(a->rows, a->cols,
        (const T::S *)a->x, (const T::S *)a->gamma, (const T::S *)NULL, a->eps, (T::S *)a->y, (float *)NULL, a->rstd,
        false));
    return CU_LAUNCHED(d, "rms_norm");
}

/* Partial parameter gradients over a chunk of rows: pg[chunk, c] = sum dy xhat, pb[chunk, c] = sum dy. */
template <typename T>
__global__ void ln_params_k(int64_t rows, int64_t cols, int64_t chunk, const typename T::S *x, const float *mean,
                            const float *rstd, const typename T::S *dy, float *pg, float *pb) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
    float sg = 0.0f, sb = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        float dv = T::ld(dy, r * cols + c);
        float xhat = (T::ld(x, r * cols + c) - (mean ? mean[r] : 0.0f)) * rstd[r];
        sg += dv * xhat;
        sb += dv;
    }
    if (pg) pg[blockIdx.y * cols + c] = sg;
    if (pb) pb[blockIdx.y * cols + c] = sb;
}

/* Sums the chunks; overwrites the parameter gradient or adds to it. */
template <typename T>
__global__ void ln_params_final_k(int64_t cols, int64_t nchunks, const float *p, typename T::S *out, bool acc) {
    CU_GRID_LOOP(c, cols) {
        float s = 0.0f;
        for (int64_t k = 0; k < nchunks; k++) s += p[k * cols + c];
        if (acc) s += T::ld(out, c);
        T::st(out, c, s);
    }
}

/* dx = beta dx + rstd (g dy - mean(g dy) - xhat mean(g dy xhat)); dx may be dy. Without mean
 * (RMSNorm) the mean is 0 and the mean(g dy) term is dropped. */
template <typename T>
__global__ void ln_dx_k(int64_t rows, int64_t cols, const typename T::S *x, const typename T::S *gamma,
                        const float *mean, const float *rstd, const typename T::S *dy, typename T::S *dx, float beta) {
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t off = r * cols;
        float mu = mean ? mean[r] : 0.0f, rs = rstd[r];
        float a1 = 0.0f, a2 = 0.0f;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            float xhat = (T::ld(x, off + c) - mu) * rs;
            float gdy = gamma ? T::ld(gamma, c) * T::ld(dy, off + c) : T::ld(dy, off + c);
            a1 += gdy;
            a2 += gdy * xhat;
        }
        float c1 = mean ? cu_block_reduce(a1, CuSum(), shf) / (float)cols : 0.0f;
        float c2 = cu_block_reduce(a2, CuSum(), shf) / (float)cols;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            float xhat = (T::ld(x, off + c) - mu) * rs;
            float gdy = gamma ? T::ld(gamma, c) * T::ld(dy, off + c) : T::ld(dy, off + c);
            float g = rs * (gdy - c1 - xhat * c2);
            T::st(dx, off + c, beta == 0.0f ? g : beta * T::ld(dx, off + c) + g);
        }
    }
}

/* The backward of layer norm, or of RMSNorm when mean is NULL (then dbeta_ is NULL too). */
static ca_status norm_backward(cuda_device *d, const char *k, ca_dtype dt, int64_t rows, int64_t cols, const void *x,
                               const void *gamma, const float *mean, const float *rstd, const void *dy, void *dx,
                               float beta, void *dgamma, void *dbeta_, bool accumulate_params) {
    if (cols == 0) return CA_OK;
    ca_status st = cu_enter(d, mean ? "kernel layer_norm_backward" : "kernel rms_norm_backward");
    if (st != CA_OK) return st;
    /* parameters first: dx may be dy itself */
    if (dgamma || dbeta_) {
        int64_t chunk = 256;
        if ((rows + chunk - 1) / chunk > 65535) chunk = (rows + 65534) / 65535;
        int64_t nchunks = rows > 0 ? (rows + chunk - 1) / chunk : 0;
        int nparts = (dgamma ? 1 : 0) + (dbeta_ ? 1 : 0);
        void *tmp = NULL;
        size_t bytes = (size_t)(nchunks > 0 ? nchunks : 1) * (size_t)cols * sizeof(float) * (size_t)nparts;
        if ((st = cu_tmp_alloc(d, bytes, &tmp)) != CA_OK) return ca_error_context("cuda kernel %s", k);
        float *pg = dgamma ? (float *)tmp : NULL;
        float *pb = dbeta_ ? (float *)tmp + (dgamma ? nchunks * cols : 0) : NULL;
        if (nchunks > 0) {
            dim3 grid((unsigned)((cols + 255) / 256), (unsigned)nchunks);
            CU_FLOAT_SWITCH(dt, T, ln_params_k<T><<<grid, 256, 0, d->stream>>>(rows, cols, chunk, (const T::S *)x,
                mean, rstd, (const T::S *)dy, pg, pb));
        }
        unsigned g = cu_grid(d, cols, CU_THREADS);
        if (dgamma)
            CU_FLOAT_SWITCH(dt, T, ln_params_final_k<T><<<g, CU_THREADS, 0, d->stream>>>(cols, nchunks, pg,
                (T::S *)dgamma, accumulate_params));
        if (dbeta_)
            CU_FLOAT_SWITCH(dt, T, ln_params_final_k<T><<<g, CU_THREADS, 0, d->stream>>>(cols, nchunks, pb,
                (T::S *)dbeta_, accumulate_params));
        cudaError_t e = cudaGetLastError();
        st = e == cudaSuccess ? CA_OK
                              : cu_error_at(e, __FILE__, __LINE__, "cuda kernel %s: parameter gradients: launch", k);
        cu_tmp_free(d, tmp);
        if (st != CA_OK) return st;
    }
    if (dx && rows > 0) {
        int th = cu_row_threads(cols);
        CU_FLOAT_SWITCH(dt, T, ln_dx_k<T><<<cu_row_grid(rows), th, 0, d->stream>>>(rows, cols, (const T::S *)x,
            (const T::S *)gamma, mean, rstd, (const T::S *)dy, (T::S *)dx, beta));
    }
    return CU_LAUNCHED(d, k);
}

extern "C" ca_status cu_layer_norm_backward(void *dev, const ca_layer_norm_backward_args *a) {
    return norm_backward((cuda_device *)dev, "layer_norm_backward", a->dt, a->rows, a->cols, a->x, a->gamma, a->mean,
                         a->rstd, a->dy, a->dx, a->beta, a->dgamma, a->dbeta_, a->accumulate_params);
}

extern "C" ca_status cu_rms_norm_backward(void *dev, const ca_rms_norm_backward_args *a) {
    return norm_backward((cuda_device *)dev, "rms_norm_backward", a->dt, a->rows, a->cols, a->x, a->gamma, NULL,
                         a->rstd, a->dy, a->dx, a->beta, a->dgamma, NULL, a->accumulate_params);
}

/* ------------------------------------------------------------- embedding */

template <typename U>
__global__ void embedding_k(int64_t n, int64_t rows, int64_t dim, const U *table, bool i64, const void *idx, U *y,
                            cu_err_ref err) {
    CU_GRID_LOOP(t, n * dim) {
        int64_t i = t / dim, c = t % dim;
        int64_t v = cu_index_at(i64, idx, i);
        if (v < 0 || v >= rows) {   /* reported, and never read outside the table */
            if (c == 0) cu_report(err, CU_ERR_EMB_INDEX, 0, i, v, rows, 0);
            y[t] = U();
        } else {
            y[t] = table[v * dim + c];
        }
    }
}

extern "C" ca_status cu_embedding(void *dev, const ca_embedding_args *args) {
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    int64_t rows = args->rows;
    int64_t dim = args->dim;
    const void *table = args->table;
    ca_dtype idx_dt = args->idx_dt;
    const void *idx = args->idx;
    void *y = args->y;
    cuda_device *d = (cuda_device *)dev;
    const char *k = "embedding";
    size_t es = ca_dtype_size(dt);
    if (n == 0) return CA_OK;
    if (dim == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel embedding");
    if (st != CA_OK) return st;
    unsigned g = cu_grid(d, n * dim, CU_THREADS);
    bool i64 = idx_dt == CA_I64;
    cu_err_ref e = cu_err_of(d);
    switch (es) {
    case 1: embedding_k<uint8_t><<<g, CU_THREADS, 0, d->stream>>>(n, rows, dim, (const uint8_t *)table, i64, idx, (uint8_t *)y, e); break;
    case 2: embedding_k<uint16_t><<<g, CU_THREADS, 0, d->stream>>>(n, rows, dim, (const uint16_t *)table, i64, idx, (uint16_t *)y, e); break;
    case 4: embedding_k<uint32_t><<<g, CU_THREADS, 0, d->stream>>>(n, rows, dim, (const uint32_t *)table, i64, idx, (uint32_t *)y, e); break;
    default: embedding_k<uint64_t><<<g, CU_THREADS, 0, d->stream>>>(n, rows, dim, (const uint64_t *)table, i64, idx, (uint64_t *)y, e); break;
    }
    return CU_LAUNCHED(d, k);
}

/* The backward sorts the positions by index (a stable radix sort: equal indices keep their order),
 * then one block per run of equal indices adds that row's gradients in f32 in index order and
 * rounds once: the CPU's sum, bit for bit, and the same on every run. Atomics added in arbitrary
 * order, and the f16/bf16 ones rounded at every add (several half ulps off after a few repeats). */

/* keys[i] = idx[i], or rows (past every row) for an index outside the table, reported; pos[i] = i. */
__global__ void emb_keys_k(int64_t n, int64_t rows, bool i64, const void *idx, uint64_t *keys, int64_t *pos,
                           cu_err_ref err) {
    CU_GRID_LOOP(i, n) {
        int64_t v = cu_index_at(i64, idx, i);
        if (v < 0 || v >= rows) {   /* reported, and its row skipped */
            cu_report(err, CU_ERR_EMB_INDEX, 1, i, v, rows, 0);
            v = rows;
        }
        keys[i] = (uint64_t)v;
        pos[i] = i;
    }
}

/* A block per sorted position that starts a run of one index v (the others return):
 * dtable[v, c] = round(f32(dtable[v, c]) + dy[p0, c] + dy[p1, c] + ...), p0 < p1 < ... */
template <typename T>
__global__ void emb_bwd_runs_k(int64_t n, int64_t rows, int64_t dim, const uint64_t *keys, const int64_t *pos,
                               const typename T::S *dy, typename T::S *dtable) {
    for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
        uint64_t v = keys[s];
        if (v >= (uint64_t)rows || (s > 0 && keys[s - 1] == v)) continue;
        int64_t e = s + 1;
        while (e < n && keys[e] == v) e++;
        typename T::S *out = dtable + (int64_t)v * dim;
        for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
            float acc = T::ld(out, c);
            for (int64_t j = s; j < e; j++) acc += T::ld(dy, pos[j] * dim + c);
            T::st(out, c, acc);
        }
    }
}

/* Bits of the keys 0..rows: the radix sort looks at no more. */
static int key_bits(int64_t rows) {
    int b = 1;
    while (b < 63 && ((uint64_t)1 << b) <= (uint64_t)rows) b++;
    return b;
}

/* Sorts (keys, pos) by key into the second halves of the buffers; tmp holds keys and pos twice,
 * then CUB's scratch. */
static ca_status emb_sort(cuda_device *d, int64_t n, int64_t rows, uint64_t *keys, int64_t *pos, void *scratch,
                          size_t scratch_bytes) {
    size_t need = scratch_bytes;
    CA_CUDA_TRY(cub::DeviceRadixSort::SortPairs(scratch, need, keys, keys + n, pos, pos + n, n, 0, key_bits(rows),
                                                d->stream),
                "cuda kernel embedding_backward: sorting %lld indices", (long long)n);
    return CA_OK;
}

extern "C" ca_status cu_embedding_backward(void *dev, const ca_embedding_backward_args *args) {
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    int64_t rows = args->rows;
    int64_t dim = args->dim;
    bool i64 = args->idx_dt == CA_I64;
    cuda_device *d = (cuda_device *)dev;
    const char *k = "embedding_backward";
    if (n == 0) return CA_OK;
    if (dim == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel embedding_backward");
    if (st != CA_OK) return st;
    size_t sort_bytes = 0;
    CA_CUDA_TRY(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const uint64_t *)NULL, (uint64_t *)NULL,
                                                (const int64_t *)NULL, (int64_t *)NULL, n, 0, key_bits(rows),
                                                d->stream),
                "cuda kernel embedding_backward: sizing the sort of %lld indices", (long long)n);
    size_t pairs = ((size_t)n * 2 * (sizeof(uint64_t) + sizeof(int64_t)) + 255) & ~(size_t)255;   /* CUB's alignment */
    void *tmp = NULL;
    if ((st = cu_tmp_alloc(d, pairs + sort_bytes, &tmp)) != CA_OK) return ca_error_context("cuda kernel %s", k);
    uint64_t *keys = (uint64_t *)tmp;
    int64_t *pos = (int64_t *)(keys + 2 * n);
    emb_keys_k<<<cu_grid(d, n, CU_THREADS), CU_THREADS, 0, d->stream>>>(n, rows, i64, args->idx, keys, pos,
                                                                       cu_err_of(d));
    st = emb_sort(d, n, rows, keys, pos, (char *)tmp + pairs, sort_bytes);
    if (st == CA_OK) {
        int th = cu_row_threads(dim);
        CU_FLOAT_SWITCH(dt, T, emb_bwd_runs_k<T><<<cu_row_grid(n), th, 0, d->stream>>>(n, rows, dim, keys + n,
            pos + n, (const T::S *)args->dy, (T::S *)args->dtable));
        st = CU_LAUNCHED(d, k);
    }
    cu_tmp_free(d, tmp);
    return st;
}

/* ------------------------------------------------------------------ rope */

/* One thread per pair (i, i + half) of a row, or per element past rot (copied): w = dim - half items
 * a row. Each thread reads its elements before it writes them, and no two threads share one, so y may
 * be x. I: uint32_t where every index stays below 2^31, else int64_t. */
template <typename T, typename I>
__global__ void rope_k(I total, I w, I dim, I half, I seq, I per_batch, bool per_b, const typename T::S *x,
                       const float *cs, const float *sn, float sg, typename T::S *y, float beta) {
    for (I k = (I)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (I)gridDim.x * blockDim.x) {
        I r = k / w, j = k - r * w, off = r * dim;
        if (j < half) {
            I to = ((per_b ? r / per_batch : 0) * seq + r % seq) * half + j;
            float c = cs[to], s = sg * sn[to], a = T::ld(x, off + j), b = T::ld(x, off + j + half);
            float y0 = a * c - b * s, y1 = b * c + a * s;
            if (beta != 0.0f) {
                y0 += beta * T::ld(y, off + j);
                y1 += beta * T::ld(y, off + j + half);
            }
            T::st(y, off + j, y0);
            T::st(y, off + j + half, y1);
        } else {
            I i = j + half;
            float v = T::ld(x, off + i);
            if (beta != 0.0f) v += beta * T::ld(y, off + i);
            T::st(y, off + i, v);
        }
    }
}

extern "C" ca_status cu_rope(void *dev, const ca_rope_args *a) {
    cuda_device *d = (cuda_device *)dev;
    int64_t rows = a->batch * a->heads * a->seq, half = a->rot / 2, w = a->dim - half, total = rows * w;
    if (total == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel rope");
    if (st != CA_OK) return st;
    unsigned g = cu_grid(d, total, CU_THREADS);
    bool per_b = a->table_batch != 1;
    float sg = a->inverse ? -1.0f : 1.0f;
    if (rows * a->dim < ((int64_t)1 << 31)) {
        CU_FLOAT_SWITCH(a->dt, T, rope_k<T, uint32_t><<<g, CU_THREADS, 0, d->stream>>>((uint32_t)total,
            (uint32_t)w, (uint32_t)a->dim, (uint32_t)half, (uint32_t)a->seq, (uint32_t)(a->heads * a->seq), per_b,
            (const T::S *)a->x, a->cos, a->sin, sg, (T::S *)a->y, a->beta));
    } else {
        CU_FLOAT_SWITCH(a->dt, T, rope_k<T, int64_t><<<g, CU_THREADS, 0, d->stream>>>(total, w, a->dim, half,
            a->seq, a->heads * a->seq, per_b, (const T::S *)a->x, a->cos, a->sin, sg, (T::S *)a->y, a->beta));
    }
    return CU_LAUNCHED(d, "rope");
}
